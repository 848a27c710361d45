use std::{
    collections::HashMap,
    sync::{
        Arc, RwLock,
        atomic::{AtomicU64, Ordering},
    },
};

use toolmesh_embed::Embedder;

use toolmesh_core::ToolSpec;
use toolmesh_registry::{RegistryHandle, ToolEntry};

use crate::{Bm25Index, terms};

/// One search result.
#[derive(Debug, Clone)]
pub struct SearchHit {
    /// The tool.
    pub tool: Arc<ToolEntry>,
    /// Its relevance score; higher is better.
    pub score: f64,
}

/// Reciprocal-rank-fusion constant (the usual 60).
const RRF_K: f64 = 60.0;
/// Candidates each ranking contributes to the fusion.
const CANDIDATES: usize = 100;

/// State the actor writes and searches read.
#[derive(Default)]
pub(crate) struct SearchShared {
    pub(crate) index: RwLock<Bm25Index>,
    /// Tool vectors by tool name (L2-normalised).
    pub(crate) vectors: RwLock<HashMap<String, Arc<[f32]>>>,
    pub(crate) embedder: Option<Arc<dyn Embedder>>,
    /// The catalog version the index reflects.
    pub(crate) version: AtomicU64,
}

impl std::fmt::Debug for SearchShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SearchShared").field("version", &self.version).finish_non_exhaustive()
    }
}

/// How callers search; cheap to clone.
#[derive(Debug, Clone)]
pub struct SearchHandle {
    pub(crate) shared: Arc<SearchShared>,
    pub(crate) registry: RegistryHandle,
}

impl SearchHandle {
    /// Returns the `top_k` tools that best match `query` among those `keep` accepts: BM25 and,
    /// with an embedding model, cosine similarity of sentence embeddings, fused by reciprocal
    /// rank. The query is embedded on a blocking thread.
    pub async fn search(
        &self,
        query: &str,
        top_k: usize,
        keep: impl Fn(&ToolSpec) -> bool,
    ) -> Result<Vec<SearchHit>, String> {
        let catalog = self.registry.snapshot();
        let lexical: Vec<(String, f64)> = {
            let index = self.shared.index.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            index
                .search(&terms(query))
                .into_iter()
                .filter(|(name, _)| catalog.get(name).is_some_and(|t| keep(&t.spec)))
                .take(CANDIDATES)
                .map(|(name, score)| (name.to_owned(), score))
                .collect()
        };
        let Some(embedder) = self.shared.embedder.clone() else {
            return Ok(lexical
                .into_iter()
                .filter_map(|(name, score)| {
                    catalog.get(&name).map(|tool| SearchHit { tool: tool.clone(), score })
                })
                .take(top_k)
                .collect());
        };
        let text = query.to_owned();
        let query_vector = tokio::task::spawn_blocking(move || embedder.embed(&[text.as_str()]))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?
            .pop()
            .unwrap_or_default();
        let mut dense: Vec<(String, f32)> = {
            let vectors =
                self.shared.vectors.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            vectors
                .iter()
                .filter(|(name, _)| catalog.get(name.as_str()).is_some_and(|t| keep(&t.spec)))
                .map(|(name, v)| {
                    (name.clone(), v.iter().zip(&query_vector).map(|(a, b)| a * b).sum())
                })
                .collect()
        };
        dense.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        dense.truncate(CANDIDATES);
        let mut fused: HashMap<String, f64> = HashMap::new();
        for (rank, (name, _)) in lexical.iter().enumerate() {
            *fused.entry(name.clone()).or_default() += 1.0 / (RRF_K + rank as f64 + 1.0);
        }
        for (rank, (name, _)) in dense.iter().enumerate() {
            *fused.entry(name.clone()).or_default() += 1.0 / (RRF_K + rank as f64 + 1.0);
        }
        let mut ranked: Vec<(String, f64)> = fused.into_iter().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Ok(ranked
            .into_iter()
            .filter_map(|(name, score)| {
                catalog.get(&name).map(|tool| SearchHit { tool: tool.clone(), score })
            })
            .take(top_k)
            .collect())
    }

    /// Names the ranking in use.
    pub fn ranking(&self) -> String {
        match &self.shared.embedder {
            Some(embedder) => format!("rrf(bm25, {})", embedder.model_id()),
            None => "bm25".into(),
        }
    }

    /// Returns how many tools are indexed lexically.
    pub fn indexed(&self) -> usize {
        self.shared.index.read().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// Returns how many tools have an embedding.
    pub fn embedded(&self) -> usize {
        self.shared.vectors.read().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// Returns the catalog version the index reflects.
    pub fn version(&self) -> u64 {
        self.shared.version.load(Ordering::Acquire)
    }
}
