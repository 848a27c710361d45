use std::{
    collections::{HashMap, HashSet, VecDeque},
    panic::AssertUnwindSafe,
    path::PathBuf,
    sync::{Arc, PoisonError, atomic::Ordering},
    time::Instant,
};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use toolmesh_embed::Embedder;
use toolmesh_registry::{RegistryHandle, ToolEntry};
use tracing::{Instrument, debug, error, info, warn};

use crate::{
    Fusion, SearchHandle,
    handle::{DEFAULT_MAX_QUERY_BYTES, SearchShared},
    store::{TextDigest, VectorStore, digest},
    terms, tool_text,
};

/// Messages of the [`ToolSearchActor`].
#[derive(Debug)]
pub enum SearchMsg {
    /// The registry published a new catalog.
    CatalogChanged,
    /// Embed the next batch of tools waiting for a vector.
    EmbedNext,
}

/// How the search index is built.
#[derive(Clone)]
pub struct SearchOptions {
    /// The sentence-embedding model; without one, search is lexical.
    pub embedder: Option<Arc<dyn Embedder>>,
    /// Where tool vectors are kept between runs (a file per model); `None`: in memory only.
    pub vector_cache: Option<PathBuf>,
    /// How the lexical and the embedding ranking are combined.
    pub fusion: Fusion,
    /// Longest query searched, in bytes; longer ones are refused.
    pub max_query_bytes: usize,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            embedder: None,
            vector_cache: None,
            fusion: Fusion::default(),
            max_query_bytes: DEFAULT_MAX_QUERY_BYTES,
        }
    }
}

impl std::fmt::Debug for SearchOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SearchOptions")
            .field("embedder", &self.embedder.as_ref().map(|e| e.model_id().to_owned()))
            .field("vector_cache", &self.vector_cache)
            .field("fusion", &self.fusion)
            .field("max_query_bytes", &self.max_query_bytes)
            .finish()
    }
}

/// Keeps the search index in step with the catalog.
///
/// On each published catalog it compares entries by pointer (the registry keeps an
/// unchanged tool's entry), hashes the text of new and changed tools only, and updates the
/// BM25 index at once. Tools whose text has no vector yet wait in a queue that the actor
/// works through one batch per message, shortest texts together, so catalog changes are
/// indexed between batches even during a long first embedding.
#[derive(Debug)]
pub struct ToolSearchActor {
    registry: RegistryHandle,
    shared: Arc<SearchShared>,
    vector_cache: Option<PathBuf>,
}

/// A tool waiting for the vector of its text.
#[derive(Debug)]
struct Pending {
    name: String,
    digest: TextDigest,
    text: String,
}

/// Texts embedded per batch. Texts are sorted by length first, so a batch pads little.
const EMBED_BATCH: usize = 16;

/// The [`ToolSearchActor`]'s state.
#[derive(Debug)]
pub struct ToolSearchState {
    /// What is indexed, by tool name: the entry and the digest of its text.
    indexed: HashMap<String, (Arc<ToolEntry>, TextDigest)>,
    /// Vectors by text digest (and on disk, when a cache directory is set).
    store: VectorStore,
    /// Tools waiting for a vector, shortest text first.
    pending: VecDeque<Pending>,
    /// Whether an `EmbedNext` is on its way.
    embedding: bool,
    /// When the current run of embedding started, and how many texts it embedded.
    run: Option<(Instant, usize)>,
}

impl ToolSearchActor {
    /// Starts the actor over `registry`; returns the handle searches use.
    pub async fn start(
        registry: RegistryHandle,
        options: SearchOptions,
    ) -> Result<(ActorRef<SearchMsg>, SearchHandle), ActorProcessingErr> {
        let shared = Arc::new(SearchShared {
            index: Default::default(),
            vectors: Default::default(),
            embedder: options.embedder,
            recent: Default::default(),
            fusion: options.fusion,
            version: Default::default(),
            max_query_bytes: options.max_query_bytes,
            recovering: Default::default(),
            restarts: Default::default(),
            changed: Default::default(),
        });
        let actor = Self::over(registry.clone(), shared.clone(), options.vector_cache);
        let (actor, _) = Actor::spawn(None, actor, ()).await?;
        Ok((actor, SearchHandle { shared, registry }))
    }

    /// An actor over the index `shared`, as a supervisor restarts it.
    pub(crate) fn over(
        registry: RegistryHandle,
        shared: Arc<SearchShared>,
        vector_cache: Option<PathBuf>,
    ) -> Self {
        ToolSearchActor { registry, shared, vector_cache }
    }

    /// Brings the index up to the current catalog. The texts, digests and BM25 updates of
    /// a whole catalog are CPU work: they run on a blocking thread, with the map of what is
    /// indexed lent to it.
    async fn reindex(
        &self,
        myself: &ActorRef<SearchMsg>,
        state: &mut ToolSearchState,
    ) -> Result<(), ActorProcessingErr> {
        let catalog = self.registry.snapshot();
        if catalog.version == self.shared.version.load(Ordering::Acquire) && catalog.version != 0 {
            return Ok(());
        }
        let started = Instant::now();
        let (shared, indexed, lexical) =
            (self.shared.clone(), std::mem::take(&mut state.indexed), catalog.clone());
        let (indexed, upserts, removed) =
            tokio::task::spawn_blocking(move || index_lexically(&shared, &lexical, indexed))
                .await?;
        state.indexed = indexed;
        let embedding = self.shared.embedder.is_some();
        let updated = upserts.len();
        {
            let mut vectors = self.shared.vectors.write().unwrap_or_else(PoisonError::into_inner);
            for name in &removed {
                vectors.remove(name);
            }
            for (name, entry, text, text_digest) in upserts {
                match state.store.get(&text_digest) {
                    Some(vector) => {
                        vectors.insert(&name, &vector);
                    }
                    None if embedding => {
                        vectors.remove(&name);
                        state.pending.push_back(Pending {
                            name: name.clone(),
                            digest: text_digest,
                            text,
                        });
                    }
                    None => {}
                }
                state.indexed.insert(name, (entry, text_digest));
            }
        }
        self.shared.version.store(catalog.version, Ordering::Release);
        let recovered =
            self.shared.recovering.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(reason) = recovered {
            info!(%reason, version = catalog.version, "the search index caught up after a failure");
            self.shared.changed.notify_one();
        }
        if !removed.is_empty() {
            // Rewriting the vector file is file work: on a blocking thread, the store lent.
            let live: HashSet<TextDigest> = state.indexed.values().map(|(_, d)| *d).collect();
            let mut store = std::mem::replace(&mut state.store, VectorStore::in_memory(0));
            state.store = tokio::task::spawn_blocking(move || {
                store.compact(&live);
                store
            })
            .await?;
        }
        if !state.pending.is_empty() {
            state.pending.make_contiguous().sort_unstable_by_key(|p| p.text.len());
            if !state.embedding {
                state.embedding = myself.cast(SearchMsg::EmbedNext).is_ok();
                state.run.get_or_insert((Instant::now(), 0));
            }
        }
        debug!(
            version = catalog.version,
            updated,
            removed = removed.len(),
            waiting_for_vectors = state.pending.len(),
            elapsed_us = started.elapsed().as_micros() as u64,
            "search index updated"
        );
        Ok(())
    }

    async fn embed_next(
        &self,
        myself: &ActorRef<SearchMsg>,
        state: &mut ToolSearchState,
    ) -> Result<(), ActorProcessingErr> {
        state.embedding = false;
        let Some(embedder) = self.shared.embedder.clone() else { return Ok(()) };
        // The shortest texts first; skip tools that changed or went since they were queued,
        // and texts another tool already brought a vector for.
        let mut batch: Vec<Pending> = Vec::with_capacity(EMBED_BATCH);
        while batch.len() < EMBED_BATCH
            && let Some(pending) = state.pending.pop_front()
        {
            if state.indexed.get(&pending.name).is_none_or(|(_, d)| *d != pending.digest) {
                continue;
            }
            match state.store.get(&pending.digest) {
                Some(vector) => {
                    self.shared
                        .vectors
                        .write()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(&pending.name, &vector);
                }
                None => batch.push(pending),
            }
        }
        if !batch.is_empty() {
            // The texts go to the model; the batch keeps name and digest.
            let texts: Vec<String> =
                batch.iter_mut().map(|p| std::mem::take(&mut p.text)).collect();
            // The model's forward pass and the store's file append run on a blocking
            // thread; the store is lent to it and comes back either way.
            let digests: Vec<TextDigest> = batch.iter().map(|p| p.digest).collect();
            let store = std::mem::replace(&mut state.store, VectorStore::in_memory(0));
            let (store, embedded) = tokio::task::spawn_blocking(move || {
                let mut store = store;
                let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                // A panic in the model costs this batch its vectors, not the index its actor.
                let embedded = std::panic::catch_unwind(AssertUnwindSafe(|| embedder.embed(&refs)))
                    .unwrap_or_else(|panic| {
                        Err(toolmesh_embed::EmbedError::Run(format!(
                            "the model panicked: {}",
                            panic_message(panic.as_ref())
                        )))
                    });
                let stored = embedded
                    .map(|vectors| store.insert(digests.into_iter().zip(vectors).collect()));
                (store, stored)
            })
            .await?;
            state.store = store;
            match embedded {
                Ok(vectors) => {
                    if let Some((_, count)) = &mut state.run {
                        *count += batch.len();
                    }
                    let mut shared =
                        self.shared.vectors.write().unwrap_or_else(PoisonError::into_inner);
                    for (pending, vector) in batch.into_iter().zip(vectors) {
                        // Still the text the tool has now?
                        if state
                            .indexed
                            .get(&pending.name)
                            .is_some_and(|(_, d)| *d == pending.digest)
                        {
                            shared.insert(&pending.name, &vector);
                        }
                    }
                }
                Err(error) => {
                    let tools: Vec<&str> = batch.iter().map(|p| p.name.as_str()).collect();
                    error!(%error, ?tools, "embedding tools failed; they are searchable lexically only");
                }
            }
        }
        if state.pending.is_empty() {
            if let Some((started, count)) = state.run.take()
                && count > 0
            {
                info!(
                    tools = count,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "embedded tool texts"
                );
            }
        } else {
            state.embedding = myself.cast(SearchMsg::EmbedNext).is_ok();
        }
        Ok(())
    }
}

/// What is indexed, by tool name: the entry and the digest of its text.
type Indexed = HashMap<String, (Arc<ToolEntry>, TextDigest)>;

/// Tools whose text is new or changed: name, entry, text and its digest.
type Upserts = Vec<(String, Arc<ToolEntry>, String, TextDigest)>;

/// Compares `catalog` with what is `indexed` (entries by pointer: the registry keeps an
/// unchanged tool's entry), hashes the text of new and changed tools only, and applies the
/// changes to the BM25 index. Returns the map (updated for tools whose text did not change,
/// and without the removed ones), the upserts, and the removed tool names.
fn index_lexically(
    shared: &SearchShared,
    catalog: &toolmesh_registry::Catalog,
    mut indexed: Indexed,
) -> (Indexed, Upserts, Vec<String>) {
    let mut upserts = Vec::new();
    for (name, entry) in &catalog.tools {
        let previous = indexed.get_mut(name);
        if let Some((known, _)) = &previous
            && Arc::ptr_eq(known, entry)
        {
            continue;
        }
        let text = tool_text(&entry.spec);
        let text_digest = digest(&text);
        match previous {
            Some((known, old)) if *old == text_digest => *known = entry.clone(),
            _ => upserts.push((name.clone(), entry.clone(), text, text_digest)),
        }
    }
    // Every catalog tool is indexed or new: when the counts agree, nothing went.
    let new = upserts.iter().filter(|(name, ..)| !indexed.contains_key(name)).count();
    let removed: Vec<String> = if catalog.tools.len() == indexed.len() + new {
        Vec::new()
    } else {
        indexed.keys().filter(|name| !catalog.tools.contains_key(*name)).cloned().collect()
    };
    {
        // Searches wait only for the updates themselves.
        let mut index = shared.index.write().unwrap_or_else(PoisonError::into_inner);
        for name in &removed {
            index.remove(name);
        }
        for (name, _, text, _) in &upserts {
            index.upsert(name, &terms(text));
        }
    }
    for name in &removed {
        indexed.remove(name);
    }
    (indexed, upserts, removed)
}

/// The message a panic carried.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message")
}

impl Actor for ToolSearchActor {
    type Msg = SearchMsg;
    type State = ToolSearchState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<SearchMsg>,
        _: (),
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut changes = self.registry.subscribe();
        let actor = myself.clone();
        tokio::spawn(
            async move {
                while changes.changed().await.is_ok() {
                    if actor.cast(SearchMsg::CatalogChanged).is_err() {
                        return;
                    }
                }
            }
            .instrument(tracing::info_span!("search", task = "follow catalog")),
        );
        let dimensions = self.shared.embedder.as_ref().map_or(0, |e| e.dimensions());
        let store = match (&self.shared.embedder, &self.vector_cache) {
            (Some(embedder), Some(dir)) => {
                let (dir, model) = (dir.clone(), embedder.model_id().to_owned());
                let opened = tokio::task::spawn_blocking(move || {
                    VectorStore::open(&dir, &model, dimensions).map_err(|e| (dir, e))
                })
                .await?;
                opened.unwrap_or_else(|(dir, error)| {
                    warn!(dir = %dir.display(), %error, "cannot open the vector cache; tool vectors are kept in memory only");
                    VectorStore::in_memory(dimensions)
                })
            }
            _ => VectorStore::in_memory(dimensions),
        };
        myself.cast(SearchMsg::CatalogChanged)?;
        Ok(ToolSearchState {
            indexed: HashMap::new(),
            store,
            pending: VecDeque::new(),
            embedding: false,
            run: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<SearchMsg>,
        message: SearchMsg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SearchMsg::CatalogChanged => self.reindex(&myself, state).await,
            SearchMsg::EmbedNext => self.embed_next(&myself, state).await,
        }
    }
}
