use std::sync::{
    Arc, Mutex, PoisonError, RwLock,
    atomic::{AtomicU64, Ordering},
};

use toolmesh_embed::Embedder;

use toolmesh_core::ToolSpec;
use toolmesh_registry::{RegistryHandle, ToolEntry};

use crate::{
    Bm25Index, Fusion, SearchError, bm25::best, digest, fusion::Fuse, recent::RecentQueries, terms,
    vectors::VectorTable,
};

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

/// Longest query searched unless configured otherwise, in bytes: far more than a model
/// attends to (MiniLM reads 256 tokens), small enough that tokenising it costs microseconds.
pub const DEFAULT_MAX_QUERY_BYTES: usize = 4096;

fn owned(ranked: Vec<(&str, f64)>) -> Vec<(String, f64)> {
    ranked.into_iter().map(|(name, score)| (name.to_owned(), score)).collect()
}

/// State the actor writes and searches read.
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
    /// Longest query searched, in bytes.
    pub(crate) max_query_bytes: usize,
    /// Why the index is being rebuilt after its actor failed; `None` once it has caught up.
    pub(crate) recovering: Mutex<Option<String>>,
    /// How often the index's actor was restarted, with the last failure.
    pub(crate) restarts: Mutex<(u64, String)>,
    /// Told when the index's health changes.
    pub(crate) changed: tokio::sync::Notify,
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
    /// [`Fusion`] of the index says.
    ///
    /// A query longer than the configured limit is refused. Tokenising, scoring and the
    /// model's forward pass are CPU work: the two rankings run side by side on blocking
    /// threads, never on the runtime's.
    pub async fn search<F>(
        &self,
        query: &str,
        top_k: usize,
        keep: F,
    ) -> Result<Vec<SearchHit>, SearchError>
    where
        F: Fn(&ToolSpec) -> bool + Send + Sync + 'static,
    {
        if query.trim().is_empty() {
            return Err(SearchError::EmptyQuery);
        }
        let limit = self.shared.max_query_bytes;
        if query.len() > limit {
            return Err(SearchError::QueryTooLong { bytes: query.len(), limit });
        }
        let catalog = self.registry.snapshot();
        let keep = Arc::new(keep);
        let kept = {
            let (catalog, keep) = (catalog.clone(), keep.clone());
            move |name: &str| catalog.get(name).is_some_and(|t| keep(&t.spec))
        };
        let key = digest(query);
        let recent = self.shared.recent.lock().unwrap_or_else(PoisonError::into_inner).get(&key);
        let dense = self.shared.embedder.clone().map(|embedder| {
            let (shared, text, kept) = (self.shared.clone(), query.to_owned(), kept.clone());
            tokio::task::spawn_blocking(move || {
                let vector: Arc<[f32]> = match recent {
                    Some(vector) => vector,
                    None => embedder
                        .embed_query(&text)
                        .map_err(|e| SearchError::Embedding(e.to_string()))?
                        .into(),
                };
                let vectors = shared.vectors.read().unwrap_or_else(PoisonError::into_inner);
                let ranked = owned(best(vectors.scores(&vector), CANDIDATES, &kept));
                Ok::<_, SearchError>((vector, ranked))
            })
        });
        let lexical = {
            let (shared, text) = (self.shared.clone(), query.to_owned());
            tokio::task::spawn_blocking(move || {
                let index = shared.index.read().unwrap_or_else(PoisonError::into_inner);
                owned(best(index.scores(&terms(&text)), CANDIDATES, &kept))
            })
        };
        let lexical = lexical.await.map_err(|e| SearchError::Task(e.to_string()))?;
        let ranked = match dense {
            None => lexical,
            Some(dense) => {
                let (vector, dense) =
                    dense.await.map_err(|e| SearchError::Task(e.to_string()))??;
                self.shared
                    .recent
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(key, vector);
                self.shared.fusion.fuse(&lexical, &dense)
            }
        };
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
