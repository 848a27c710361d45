use std::sync::{
    Arc, RwLock,
    atomic::{AtomicU64, Ordering},
};

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

/// State the actor writes and searches read.
#[derive(Debug, Default)]
pub(crate) struct SearchShared {
    pub(crate) index: RwLock<Bm25Index>,
    /// The catalog version the index reflects.
    pub(crate) version: AtomicU64,
}

/// How callers search; cheap to clone.
#[derive(Debug, Clone)]
pub struct SearchHandle {
    pub(crate) shared: Arc<SearchShared>,
    pub(crate) registry: RegistryHandle,
}

impl SearchHandle {
    /// Returns the `top_k` tools that best match `query` among those `keep` accepts.
    pub fn search(
        &self,
        query: &str,
        top_k: usize,
        keep: impl Fn(&ToolSpec) -> bool,
    ) -> Vec<SearchHit> {
        let catalog = self.registry.snapshot();
        let index = self.shared.index.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        index
            .search(&terms(query))
            .into_iter()
            .filter_map(|(name, score)| {
                catalog.get(name).map(|tool| SearchHit { tool: tool.clone(), score })
            })
            .filter(|hit| keep(&hit.tool.spec))
            .take(top_k)
            .collect()
    }

    /// Returns how many tools are indexed.
    pub fn indexed(&self) -> usize {
        self.shared.index.read().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// Returns the catalog version the index reflects.
    pub fn version(&self) -> u64 {
        self.shared.version.load(Ordering::Acquire)
    }
}
