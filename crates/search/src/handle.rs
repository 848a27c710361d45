use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, PoisonError, RwLock,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
};

use toolmesh_core::{
    StoreError, ToolSpec, VectorStore,
    vector::{Condition, Filter, PointId, Query, Scalar, SparseVector},
};
use toolmesh_embed::Embedder;
use toolmesh_registry::{Catalog, RegistryHandle, ToolEntry};

use toolmesh_embed::lexical::{self, terms};

use crate::{Fusion, SearchError, digest, fusion::Fuse, recent::RecentQueries};

/// One search result.
#[derive(Debug, Clone)]
pub struct SearchHit {
    /// The tool.
    pub tool: Arc<ToolEntry>,
    /// Its relevance score; higher is better.
    pub score: f64,
}

/// Points and their scores, best first.
type Ranked = Vec<(PointId, f64)>;

/// Candidates each ranking contributes to the fusion. The convex fusion normalises each
/// ranking's scores over its candidates, so the candidates are the sample of the ranking's
/// score distribution that a score is measured against: too few and the normalisation is
/// noisy; past about 150 the ranking no longer changes (`benchmarks/tool-search.md`), and
/// each further candidate costs a little time per search.
pub(crate) const CANDIDATES: usize = 200;

/// Longest query searched unless configured otherwise, in bytes: far more than a model
/// attends to (MiniLM reads 256 tokens), small enough that tokenising it costs microseconds.
pub const DEFAULT_MAX_QUERY_BYTES: usize = 4096;

/// The payload field that holds a point's tool name.
pub(crate) const NAME: &str = "name";
/// The payload field that says whether a point has its dense vector.
pub(crate) const EMBEDDED: &str = "embedded";

/// A tool in the index.
#[derive(Debug, Clone)]
pub(crate) struct Live {
    pub(crate) name: Arc<str>,
    /// Whether its point has the dense vector.
    pub(crate) dense: bool,
}

/// State the actor writes and searches read.
pub(crate) struct SearchShared {
    /// Where the tool points are: one per tool text, by the text's digest.
    pub(crate) store: Arc<dyn VectorStore>,
    /// The collection of the model in use.
    pub(crate) collection: String,
    /// The indexed tools by point id.
    pub(crate) live: RwLock<HashMap<PointId, Live>>,
    /// How many indexed tools have their dense vector.
    pub(crate) embedded: AtomicUsize,
    /// How many texts this process embedded: a restart over an unchanged catalog embeds none.
    pub(crate) embeddings: AtomicU64,
    pub(crate) embedder: Option<Arc<dyn Embedder>>,
    /// Vectors of recent queries.
    pub(crate) recent: Mutex<RecentQueries>,
    pub(crate) fusion: Fusion,
    /// The catalog version the index reflects.
    pub(crate) version: AtomicU64,
    /// Longest query searched, in bytes.
    pub(crate) max_query_bytes: usize,
    /// Why the index is being rebuilt after its actor failed, or cannot follow the catalog
    /// because the store fails; `None` once it has caught up.
    pub(crate) recovering: Mutex<Option<String>>,
    /// How often the index's actor was restarted, with the last failure.
    pub(crate) restarts: Mutex<(u64, String)>,
    /// Told when the index's health changes.
    pub(crate) changed: tokio::sync::Notify,
}

impl std::fmt::Debug for SearchShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SearchShared")
            .field("collection", &self.collection)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// How callers search; cheap to clone.
#[derive(Debug, Clone)]
pub struct SearchHandle {
    pub(crate) shared: Arc<SearchShared>,
    pub(crate) registry: RegistryHandle,
}

impl SearchHandle {
    /// Returns the `top_k` tools that best match `query` among those `keep` accepts: BM25
    /// and, with an embedding model, the cosine similarity of sentence embeddings, ranked by
    /// the vector store (reciprocal-rank fusion in the store's query, or the convex
    /// combination of the two rankings as [`Fusion`] says).
    ///
    /// Of a query longer than `search.max_query_bytes`, the beginning is searched
    /// ([`Self::cut_query`]): an agent that passes on a whole dialogue still finds tools,
    /// and the cost of a search stays bounded. The model's forward pass is CPU
    /// work on a blocking thread; the store runs on its own. When `keep` turns down too many
    /// of the best tools, the store is asked again for kept tools only, so a narrow profile
    /// still gets `top_k`.
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
        let query = self.cut_query(query);
        let catalog = self.registry.snapshot();
        let lexical = lexical::query(&terms(query));
        let (ranked, dense) = self.rank(self.embed_query(query), &lexical, None).await?;
        let mut hits = self.resolve(&catalog, &ranked, &keep, top_k);
        if hits.len() < top_k && ranked.len() >= CANDIDATES {
            let kept = self.kept_names(&catalog, &keep);
            if !kept.is_empty() {
                let only =
                    Filter { must: vec![Condition::In(NAME.into(), kept)], must_not: vec![] };
                let dense = std::future::ready(Ok(dense));
                let (ranked, _) = self.rank(dense, &lexical, Some(only)).await?;
                hits = self.resolve(&catalog, &ranked, &keep, top_k);
            }
        }
        Ok(hits)
    }

    /// Returns the part of `query` that is searched: its first `search.max_query_bytes`
    /// bytes, cut at a character boundary.
    pub fn cut_query<'a>(&self, query: &'a str) -> &'a str {
        let mut end = self.shared.max_query_bytes.min(query.len());
        while !query.is_char_boundary(end) {
            end -= 1;
        }
        &query[..end]
    }

    /// Returns the query's vector: from the recent queries, or from the model on a
    /// blocking thread. `None` without a model.
    async fn embed_query(&self, query: &str) -> Result<Option<Arc<[f32]>>, SearchError> {
        let Some(embedder) = self.shared.embedder.clone() else { return Ok(None) };
        let key = digest(query);
        let recent = self.shared.recent.lock().unwrap_or_else(PoisonError::into_inner).get(&key);
        if let Some(vector) = recent {
            return Ok(Some(vector));
        }
        let text = query.to_owned();
        let vector: Arc<[f32]> = tokio::task::spawn_blocking(move || embedder.embed_query(&text))
            .await
            .map_err(|e| SearchError::Task(e.to_string()))?
            .map_err(|e| SearchError::Embedding(e.to_string()))?
            .into();
        self.shared
            .recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, vector.clone());
        Ok(Some(vector))
    }

    /// Returns the best points, best first, and the query's vector: one fused query to the
    /// store for reciprocal-rank fusion; for the convex combination, a query per ranking,
    /// fused here. The lexical query waits for the query's vector and then runs beside the
    /// dense one: the embedding splits its products across every core, and a store query
    /// beside it delays the whole embedding, while the dense query runs on one core and is
    /// not measurably slower for waiting.
    async fn rank(
        &self,
        dense: impl Future<Output = Result<Option<Arc<[f32]>>, SearchError>>,
        lexical: &SparseVector,
        filter: Option<Filter>,
    ) -> Result<(Ranked, Option<Arc<[f32]>>), SearchError> {
        let store = &self.shared.store;
        let collection = &self.shared.collection;
        let lexical = (!lexical.is_empty()).then(|| lexical.clone());
        let query = |dense: Option<&[f32]>, lexical: Option<SparseVector>, rrf_k: usize| Query {
            dense: dense.map(<[f32]>::to_vec),
            lexical,
            filter: filter.clone(),
            limit: CANDIDATES,
            candidates: CANDIDATES,
            rrf_k,
            // Points are resolved to tools by id.
            payload: false,
        };
        // Before the index has made its collection, there is nothing to find.
        let scored = |found: Result<Vec<toolmesh_core::vector::Hit>, StoreError>| match found {
            Ok(hits) => Ok(hits.into_iter().map(|h| (h.id, f64::from(h.score))).collect()),
            Err(StoreError::NoCollection { .. }) => Ok(Vec::new()),
            Err(error) => Err(SearchError::Store(error)),
        };
        match self.shared.fusion {
            Fusion::Convex { .. } => {
                let dense = dense.await?;
                let by_words = store.query(collection, query(None, lexical, 0));
                let by_meaning = async {
                    let dense = dense.as_deref()?;
                    Some(store.query(collection, query(Some(dense), None, 0)).await)
                };
                let (by_words, by_meaning) = futures::future::join(by_words, by_meaning).await;
                let by_words = scored(by_words)?;
                let by_meaning = by_meaning.map(scored).transpose()?;
                let ranked = match by_meaning {
                    Some(by_meaning) => self.shared.fusion.fuse(&by_words, &by_meaning),
                    None => by_words,
                };
                Ok((ranked, dense))
            }
            Fusion::Rrf { k } => {
                let k = (k.round() as usize).max(1);
                let dense = dense.await?;
                let found = store.query(collection, query(dense.as_deref(), lexical, k)).await;
                Ok((scored(found)?, dense))
            }
        }
    }

    /// Returns the first `top_k` of `ranked` that are indexed, in the catalog and kept.
    fn resolve<F>(
        &self,
        catalog: &Catalog,
        ranked: &[(PointId, f64)],
        keep: &F,
        top_k: usize,
    ) -> Vec<SearchHit>
    where
        F: Fn(&ToolSpec) -> bool,
    {
        let live = self.shared.live.read().unwrap_or_else(PoisonError::into_inner);
        ranked
            .iter()
            .filter_map(|(id, score)| {
                let tool = catalog.get(&live.get(id)?.name)?;
                keep(&tool.spec).then(|| SearchHit { tool: tool.clone(), score: *score })
            })
            .take(top_k)
            .collect()
    }

    /// Returns the names of the indexed tools that `keep` accepts.
    fn kept_names<F>(&self, catalog: &Catalog, keep: &F) -> Vec<Scalar>
    where
        F: Fn(&ToolSpec) -> bool,
    {
        let live = self.shared.live.read().unwrap_or_else(PoisonError::into_inner);
        live.values()
            .filter(|tool| catalog.get(&tool.name).is_some_and(|t| keep(&t.spec)))
            .map(|tool| Scalar::Str(tool.name.to_string()))
            .collect()
    }

    /// Names the ranking in use.
    pub fn ranking(&self) -> String {
        match &self.shared.embedder {
            Some(embedder) => format!("{}(bm25, {})", self.shared.fusion, embedder.model_id()),
            None => "bm25".into(),
        }
    }

    /// Returns how many tools are indexed.
    pub fn indexed(&self) -> usize {
        self.shared.live.read().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Returns how many tools have an embedding.
    pub fn embedded(&self) -> usize {
        self.shared.embedded.load(Ordering::Acquire)
    }

    /// Returns how many tool texts this process has embedded: those the store did not have.
    pub fn embeddings_made(&self) -> u64 {
        self.shared.embeddings.load(Ordering::Acquire)
    }

    /// Returns the catalog version the index reflects.
    pub fn version(&self) -> u64 {
        self.shared.version.load(Ordering::Acquire)
    }

    /// Returns whether the index has taken in the latest catalog, every tool with its
    /// vector when search has a model: a search now ranks every tool there is.
    pub fn complete(&self) -> bool {
        // The versions before the counts: a change the index takes in between the reads
        // shows in the counts as a tool still without its vector, never as complete.
        let current = self.version() >= self.registry.snapshot().version;
        current && (self.shared.embedder.is_none() || self.embedded() >= self.indexed())
    }

    /// Returns whether search ranks with sentence embeddings as well as BM25.
    pub fn has_embeddings(&self) -> bool {
        self.shared.embedder.is_some()
    }

    /// Returns the embedding model, if search has one.
    pub fn embedder(&self) -> Option<Arc<dyn Embedder>> {
        self.shared.embedder.clone()
    }

    /// Returns the store the index is in.
    pub fn store(&self) -> &Arc<dyn VectorStore> {
        &self.shared.store
    }

    /// Returns the store's collection of tool points.
    pub fn collection(&self) -> &str {
        &self.shared.collection
    }
}
