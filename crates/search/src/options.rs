//! What a tool-search index is made with.

use std::sync::Arc;

use toolmesh_core::VectorStore;
use toolmesh_embed::Embedder;

use crate::{Fusion, handle::DEFAULT_MAX_QUERY_BYTES};

/// How the search index is built.
#[derive(Clone)]
pub struct SearchOptions {
    /// Where the tool points are kept.
    pub store: Arc<dyn VectorStore>,
    /// The sentence-embedding model; without one, search is lexical.
    pub embedder: Option<Arc<dyn Embedder>>,
    /// How the lexical and the embedding ranking are combined.
    pub fusion: Fusion,
    /// Longest query searched, in bytes; longer ones are refused.
    pub max_query_bytes: usize,
}

impl SearchOptions {
    /// Lexical search in `store`, with the default limits.
    pub fn new(store: Arc<dyn VectorStore>) -> Self {
        SearchOptions {
            store,
            embedder: None,
            fusion: Fusion::default(),
            max_query_bytes: DEFAULT_MAX_QUERY_BYTES,
        }
    }
}

impl std::fmt::Debug for SearchOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SearchOptions")
            .field("store", &self.store.describe())
            .field("embedder", &self.embedder.as_ref().map(|e| e.model_id().to_owned()))
            .field("fusion", &self.fusion)
            .field("max_query_bytes", &self.max_query_bytes)
            .finish()
    }
}
