use std::sync::{
    Arc, Mutex, PoisonError, RwLock,
    atomic::{AtomicU64, Ordering},
};

use toolmesh_embed::Embedder;

use toolmesh_core::ToolSpec;
use toolmesh_registry::{RegistryHandle, ToolEntry};

use crate::{Bm25Index, Fusion, bm25::best, recent::RecentQueries, terms, vectors::VectorTable};

/// One search result.
#[derive(Debug, Clone)]
pub struct SearchHit {
    /// The tool.
    pub tool: Arc<ToolEntry>,
    /// Its relevance score; higher is better.
    pub score: f64,
}

/// Candidates each ranking contributes to the fusion.
const CANDIDATES: usize = 100;

/// State the actor writes and searches read.
#[derive(Default)]
pub(crate) struct SearchShared {
    pub(crate) index: RwLock<Bm25Index>,
    /// Tool vectors by tool name (L2-normalised).
    pub(crate) vectors: RwLock<VectorTable>,
    pub(crate) embedder: Option<Arc<dyn Embedder>>,
    /// Vectors of recent queries.
    pub(crate) recent: Mutex<RecentQueries>,
    pub(crate) fusion: Fusion,
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
    /// with an embedding model, cosine similarity of sentence embeddings, fused as the
    /// [`Fusion`] of the index says. The query is embedded on a blocking thread.
    pub async fn search(
        &self,
        query: &str,
        top_k: usize,
        keep: impl Fn(&ToolSpec) -> bool,
    ) -> Result<Vec<SearchHit>, String> {
        let catalog = self.registry.snapshot();
        let kept = |name: &str| catalog.get(name).is_some_and(|t| keep(&t.spec));
        // The query is embedded on a blocking thread while BM25 runs here.
        let recent = self.shared.recent.lock().unwrap_or_else(PoisonError::into_inner).get(query);
        let embedding = match (&self.shared.embedder, &recent) {
            (Some(embedder), None) => {
                let (embedder, text) = (embedder.clone(), query.to_owned());
                Some(tokio::task::spawn_blocking(move || embedder.embed(&[text.as_str()])))
            }
            _ => None,
        };
        let lexical: Vec<(String, f64)> = {
            let index = self.shared.index.read().unwrap_or_else(PoisonError::into_inner);
            best(index.scores(&terms(query)), CANDIDATES, kept)
                .into_iter()
                .map(|(name, score)| (name.to_owned(), score))
                .collect()
        };
        let hits = |ranked: Vec<(String, f64)>| {
            ranked
                .into_iter()
                .filter_map(|(name, score)| {
                    catalog.get(&name).map(|tool| SearchHit { tool: tool.clone(), score })
                })
                .take(top_k)
                .collect()
        };
        let query_vector: Arc<[f32]> = match (embedding, recent) {
            (_, Some(vector)) => vector,
            (Some(embedding), None) => {
                let vector: Arc<[f32]> = embedding
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?
                    .pop()
                    .unwrap_or_default()
                    .into();
                let mut recent = self.shared.recent.lock().unwrap_or_else(PoisonError::into_inner);
                recent.insert(query, vector.clone());
                vector
            }
            (None, None) => return Ok(hits(lexical)),
        };
        let dense: Vec<(String, f64)> = {
            let vectors = self.shared.vectors.read().unwrap_or_else(PoisonError::into_inner);
            best(vectors.scores(&query_vector), CANDIDATES, kept)
                .into_iter()
                .map(|(name, score)| (name.to_owned(), score))
                .collect()
        };
        Ok(hits(self.shared.fusion.fuse(&lexical, &dense)))
    }

    /// Names the ranking in use.
    pub fn ranking(&self) -> String {
        match &self.shared.embedder {
            Some(embedder) => format!("{}(bm25, {})", self.shared.fusion, embedder.model_id()),
            None => "bm25".into(),
        }
    }

    /// Returns how many tools are indexed lexically.
    pub fn indexed(&self) -> usize {
        self.shared.index.read().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Returns how many tools have an embedding.
    pub fn embedded(&self) -> usize {
        self.shared.vectors.read().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Returns the catalog version the index reflects.
    pub fn version(&self) -> u64 {
        self.shared.version.load(Ordering::Acquire)
    }

    /// Returns whether search ranks with sentence embeddings as well as BM25.
    pub fn has_embeddings(&self) -> bool {
        self.shared.embedder.is_some()
    }
}
