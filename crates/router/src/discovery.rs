//! How the front door finds tools it does not list: the seam the meta-tools crate fills.

use std::sync::Arc;

use toolmesh_core::ToolSpec;
use toolmesh_policy::Scope;
use toolmesh_registry::{Catalog, ToolEntry};

use crate::RouterError;

/// What a search found, and of which index.
#[derive(Debug, Clone, Default)]
pub struct Found {
    /// The tools, best first, with their scores.
    pub hits: Vec<(Arc<ToolEntry>, f64)>,
    /// How the index ranks, for example `bm25+minilm/rrf[k=60]`.
    pub ranking: String,
    /// Tools in the index.
    pub indexed: u64,
    /// Tools with a vector.
    pub embedded: u64,
    /// The catalog version the index reflects.
    pub index_version: u64,
    /// Whether the index had taken in the latest catalog, every tool with its vector.
    pub complete: bool,
    /// Bytes at the end of the query that were not searched (`search.max_query_bytes`).
    pub query_cut: usize,
}

/// A filter a search applies besides the profile's pool.
pub type Keep = Box<dyn Fn(&ToolSpec) -> bool + Send + Sync>;

/// Search over the catalog and the descriptions that depend on it, for `SearchTools` and
/// `ListTools`.
#[async_trait::async_trait]
pub trait Discovery: Send + Sync + 'static {
    /// Returns the tools best matching `query` that `keep` accepts, among the pool of
    /// routing profile `profile` (every tool but the meta-tools when `profile` is empty):
    /// `top_k` of them, or the profile's `top_k` when `None`.
    async fn find(
        &self,
        query: &str,
        top_k: Option<usize>,
        profile: &str,
        keep: Keep,
    ) -> Result<Found, RouterError>;

    /// Returns the description of `spec` as a model of routing profile `profile` reads it,
    /// when it is computed from `catalog` (that of `searchTools`), counting only the tools
    /// `scope`'s principal may see; `None`: its own.
    fn describe(
        &self,
        spec: &ToolSpec,
        profile: &str,
        catalog: &Catalog,
        scope: &Scope,
    ) -> Option<String>;
}
