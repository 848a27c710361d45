use std::{
    collections::{HashMap, HashSet},
    hash::{BuildHasher, RandomState},
    panic::AssertUnwindSafe,
    sync::{Arc, PoisonError, atomic::Ordering},
    time::{Duration, Instant},
};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde_json::{Map, Value, json};
use toolmesh_core::{
    StoreError, VectorStore,
    vector::{CollectionSpec, Condition, DENSE, Filter, Point, PointId, Precision},
};
use toolmesh_embed::Embedder;
use toolmesh_registry::{Catalog, CatalogChange, RegistryHandle, ToolEntry};
use tracing::{Instrument, debug, error, info, warn};

use crate::{
    Fusion, SearchHandle, TextDigest, digest,
    handle::{DEFAULT_MAX_QUERY_BYTES, EMBEDDED, Live, NAME, SearchShared},
    lexical::{self, AVERAGE_TERMS},
    terms, tool_text,
};

/// Messages of the [`ToolSearchActor`].
#[derive(Debug)]
pub enum SearchMsg {
    /// The registry published a new catalog (or the store failed and the index tries again).
    CatalogChanged,
    /// Embed the next batch of tools waiting for a vector.
    EmbedNext,
    /// Delete the points of older texts of the tools indexed for the first time, once the
    /// catalog has been still for a while.
    Sweep,
}

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

/// Keeps the tool points in the vector store in step with the catalog.
///
/// A tool is one point, its id the digest of its text: the same text has the same point in
/// every process and across restarts, so a restart over an unchanged catalog, or a second
/// router on a shared store, embeds nothing. On each published catalog the actor takes the
/// tools whose entry differs from the catalog it last caught up with (the registry keeps an
/// unchanged tool's entry), hashes the text of those only, asks the store which of their
/// points it has, writes the missing ones at once with their lexical vector, and deletes
/// the points of changed and removed tools (and, once the catalog has been still a while,
/// any point of an older text of a tool it indexed for the first time that an earlier run
/// left behind). Tools whose point has no dense vector yet wait in
/// batches of texts of similar length, embedded one batch per message in random order (so
/// routers sharing a store split a first embedding between them), with catalog changes
/// handled between batches.
#[derive(Debug)]
pub struct ToolSearchActor {
    registry: RegistryHandle,
    shared: Arc<SearchShared>,
}

/// A tool whose text is to be indexed, or is waiting for its dense vector.
#[derive(Debug, Clone)]
struct Pending {
    name: String,
    id: PointId,
    text: String,
}

impl Pending {
    /// The point of the text: its lexical vector, and the dense one when given.
    fn point(&self, dense: Option<Vec<f32>>) -> Point {
        let embedded = dense.is_some();
        Point {
            id: self.id,
            dense,
            lexical: Some(lexical::document(&terms(&self.text), AVERAGE_TERMS)),
            payload: payload(&self.name, embedded),
        }
    }
}

/// Texts embedded per batch. Texts are sorted by length first, so a batch pads little.
const EMBED_BATCH: usize = 16;
/// Points written or read per request to the store.
const STORE_BATCH: usize = 1_000;
/// Points looked up at once above which the store lists every id it holds instead of
/// looking them up by id: a first index of a large catalog.
pub(crate) const LIST_ALL_FROM: usize = 10_000;
/// How long the index waits before trying a failed store again.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How long the catalog must have been still before the points of older texts are swept:
/// at a start, tools arrive source by source, and until the last has, the store holds
/// more points than are indexed without any of them being stale.
const SWEEP_AFTER: Duration = Duration::from_secs(1);
/// How long the catalog must have been still before the listing of the store's ids made for
/// a start's first indexes is dropped: a start's sources arrive within seconds of each
/// other, however loaded the machine.
const LISTING_FOR: Duration = Duration::from_secs(10);

/// The [`ToolSearchActor`]'s state.
#[derive(Debug)]
pub struct ToolSearchState {
    /// What is indexed, by tool name: the entry and the point (digest) of its text.
    indexed: Indexed,
    /// The catalog the index last caught up with: the next one is compared with it.
    caught_up: Option<Arc<Catalog>>,
    /// Tools indexed for the first time by this process whose older points are still to be
    /// swept, and when the catalog last changed.
    unswept: Vec<String>,
    changed_at: Instant,
    /// Whether a `Sweep` is on its way.
    sweeping: bool,
    /// The store's points, listed for a start's first indexes.
    listing: Listing,
    /// Batches of tools waiting for a dense vector.
    pending: Vec<Vec<Pending>>,
    /// Whether an `EmbedNext` is on its way.
    embedding: bool,
    /// Whether a retry after a store failure is on its way.
    retrying: bool,
    /// Whether the collection is known to exist.
    ensured: bool,
    /// When the current run of embedding started, and how many texts it embedded.
    run: Option<(Instant, usize)>,
    /// Picks the next batch.
    random: RandomState,
    picks: u64,
}

/// The store's points, by id, with whether each has its dense vector: listed once when a
/// first index asks about many tools, kept in step with this index's own writes, and
/// dropped once the catalog has been still for [`LISTING_FOR`]. At a start tools arrive
/// source by source, and every source's first index would otherwise list the whole
/// collection again.
#[derive(Debug, Default)]
struct Listing(Option<HashMap<PointId, bool>>);

impl Listing {
    /// Notes that the store holds the points `ids`, with their dense vector or without.
    fn hold(&mut self, ids: impl IntoIterator<Item = PointId>, dense: bool) {
        if let Some(listing) = &mut self.0 {
            listing.extend(ids.into_iter().map(|id| (id, dense)));
        }
    }

    /// Notes that the store no longer holds the points `ids`.
    fn forget(&mut self, ids: &[PointId]) {
        if let Some(listing) = &mut self.0 {
            for id in ids {
                listing.remove(id);
            }
        }
    }
}

/// What is indexed, by tool name: the entry and the point of its text.
type Indexed = HashMap<String, (Arc<ToolEntry>, PointId)>;

/// The point id of a text digest.
pub(crate) fn point_id(digest: &TextDigest) -> PointId {
    let mut bytes = [0; 8];
    bytes.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(bytes)
}

/// The version of the tool points' format in the name of their collection, so that a
/// change of format starts a new collection. 1: full-precision dense vectors; 2: the same
/// points, their dense vectors at half precision.
const FORMAT: u32 = 2;
/// The earlier formats whose points a new collection copies instead of embedding their
/// texts again: the same digests, lexical vectors and payloads.
const COPIED_FORMATS: [u32; 1] = [1];

/// The collection of the tool points of `model` (or of lexical search alone) in the points'
/// format `version`.
pub(crate) fn collection_name(version: u32, model: Option<&str>) -> String {
    let model: String = model
        .unwrap_or("bm25")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' })
        .collect();
    format!("toolmesh-tools-v{version}-{model}")
}

impl ToolSearchActor {
    /// Starts the actor over `registry`; returns the handle searches use.
    pub async fn start(
        registry: RegistryHandle,
        options: SearchOptions,
    ) -> Result<(ActorRef<SearchMsg>, SearchHandle), ActorProcessingErr> {
        let collection = collection_name(FORMAT, options.embedder.as_ref().map(|e| e.model_id()));
        let shared = Arc::new(SearchShared {
            store: options.store,
            collection,
            live: Default::default(),
            embedded: Default::default(),
            embeddings: Default::default(),
            embedder: options.embedder,
            recent: Default::default(),
            fusion: options.fusion,
            version: Default::default(),
            max_query_bytes: options.max_query_bytes,
            recovering: Default::default(),
            restarts: Default::default(),
            changed: Default::default(),
        });
        let actor = Self::over(registry.clone(), shared.clone());
        let (actor, _) = Actor::spawn(None, actor, ()).await?;
        Ok((actor, SearchHandle { shared, registry }))
    }

    /// An actor over the index `shared`, as a supervisor restarts it.
    pub(crate) fn over(registry: RegistryHandle, shared: Arc<SearchShared>) -> Self {
        ToolSearchActor { registry, shared }
    }

    fn spec(&self) -> CollectionSpec {
        CollectionSpec {
            name: self.shared.collection.clone(),
            dense_size: self.shared.embedder.as_ref().map(|e| e.dimensions()),
            // Half the bytes a search's exact scan reads; on the benchmark's queries the
            // rankings are those of full precision.
            precision: Precision::Half,
            lexical: true,
            keyword_fields: vec![NAME.into()],
        }
    }

    /// The store failed: health says so, and the index tries again shortly.
    fn store_failed(
        &self,
        myself: &ActorRef<SearchMsg>,
        state: &mut ToolSearchState,
        error: &StoreError,
        retry: SearchMsg,
    ) {
        warn!(%error, "the tool index cannot follow the catalog; trying again");
        let reason = format!("the vector store fails: {error}");
        let mut recovering = self.shared.recovering.lock().unwrap_or_else(PoisonError::into_inner);
        if recovering.as_deref() != Some(reason.as_str()) {
            *recovering = Some(reason);
            self.shared.changed.notify_one();
        }
        if matches!(retry, SearchMsg::CatalogChanged) {
            if state.retrying {
                return;
            }
            state.retrying = true;
        }
        let actor = myself.clone();
        tokio::spawn(async move {
            tokio::time::sleep(RETRY_AFTER).await;
            let _ = actor.cast(retry);
        });
    }

    /// Brings the index up to the current catalog.
    async fn reindex(
        &self,
        myself: &ActorRef<SearchMsg>,
        state: &mut ToolSearchState,
    ) -> Result<(), ActorProcessingErr> {
        let catalog = self.registry.snapshot();
        if catalog.version == self.shared.version.load(Ordering::Acquire) && catalog.version != 0 {
            return Ok(());
        }
        state.retrying = false;
        let started = Instant::now();
        if !state.ensured {
            if let Err(error) = self.shared.store.ensure(&self.spec()).await {
                self.store_failed(myself, state, &error, SearchMsg::CatalogChanged);
                return Ok(());
            }
            state.ensured = true;
            for version in COPIED_FORMATS {
                if let Err(error) = self.copy_earlier(version).await {
                    warn!(%error, version, "copying the tool points of an earlier format failed; \
                                            tools it lacks are embedded again");
                }
            }
        }
        // Texts, digests and lexical vectors of a whole catalog are CPU work: on a blocking
        // thread, with the map of what is indexed lent to it.
        let (indexed, lexical) = (std::mem::take(&mut state.indexed), catalog.clone());
        let since = state.caught_up.clone();
        let (indexed, mut changes) =
            tokio::task::spawn_blocking(move || diff(&lexical, since.as_deref(), indexed)).await?;
        let diffed_us = started.elapsed().as_micros() as u64;
        state.indexed = indexed;
        let first = std::mem::take(&mut changes.first);
        match self.write(&changes, &mut state.listing).await {
            Ok(known) => {
                self.commit(myself, state, changes, &known);
                state.caught_up = Some(catalog.clone());
            }
            Err(error) => {
                self.store_failed(myself, state, &error, SearchMsg::CatalogChanged);
                return Ok(());
            }
        }
        let written_us = started.elapsed().as_micros() as u64;
        state.changed_at = Instant::now();
        state.unswept.extend(first);
        if (!state.unswept.is_empty() || state.listing.0.is_some()) && !state.sweeping {
            myself.send_after(SWEEP_AFTER, || SearchMsg::Sweep);
            state.sweeping = true;
        }
        self.shared.version.store(catalog.version, Ordering::Release);
        let recovered =
            self.shared.recovering.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(reason) = recovered {
            info!(%reason, version = catalog.version, "the search index caught up");
            self.shared.changed.notify_one();
        }
        debug!(
            version = catalog.version,
            waiting_for_vectors = state.pending.iter().map(Vec::len).sum::<usize>(),
            diffed_us,
            written_us,
            elapsed_us = started.elapsed().as_micros() as u64,
            "search index updated"
        );
        Ok(())
    }

    /// Copies the points of the collection of the earlier format `version` that the current
    /// one lacks (or holds without their dense vector), so that an upgrade embeds nothing
    /// again; then deletes that collection, unless the store is shared, where routers of
    /// the earlier version may still use it.
    async fn copy_earlier(&self, version: u32) -> Result<(), StoreError> {
        let (store, collection) = (&self.shared.store, &self.shared.collection);
        let embedder = self.shared.embedder.as_ref();
        let earlier = collection_name(version, embedder.map(|e| e.model_id()));
        let held = match store.ids(&earlier, None).await {
            Err(StoreError::NoCollection { .. }) => return Ok(()),
            held => held?,
        };
        let complete = embedder
            .map(|_| Filter { must: vec![Condition::HasVector(DENSE.into())], must_not: vec![] });
        let have: HashSet<PointId> = store.ids(collection, complete).await?.into_iter().collect();
        let missing: Vec<PointId> = held.into_iter().filter(|id| !have.contains(id)).collect();
        let started = Instant::now();
        for chunk in missing.chunks(STORE_BATCH) {
            let records = store.retrieve(&earlier, chunk.to_vec(), true).await?;
            store.upsert(collection, records.into_iter().map(Point::from).collect()).await?;
        }
        if !missing.is_empty() {
            info!(
                from = %earlier,
                to = %collection,
                points = missing.len(),
                ms = started.elapsed().as_millis() as u64,
                "copied the tool points of an earlier format"
            );
        }
        if store.shared() {
            info!(
                collection = %earlier,
                "the earlier format's collection is kept for routers of earlier versions \
                 sharing the store; delete it once none is left"
            );
            Ok(())
        } else {
            store.delete_collection(&earlier).await
        }
    }

    /// Writes the changes to the store: the points it does not have (lexical only, for
    /// now; their lexical vectors computed here, across the cores), and deletes those of
    /// changed and removed tools. Returns, by point id, whether each changed tool's point
    /// already had its dense vector.
    async fn write(
        &self,
        changes: &Changes,
        listing: &mut Listing,
    ) -> Result<HashMap<PointId, bool>, StoreError> {
        let store = &self.shared.store;
        let collection = &self.shared.collection;
        let ids: Vec<PointId> = changes.upserts.iter().map(|(_, _, p)| p.id).collect();
        let known = self.known(&ids, listing).await?;
        let fresh: Vec<Pending> = changes
            .upserts
            .iter()
            .map(|(_, _, p)| p)
            .filter(|p| !known.contains_key(&p.id))
            .cloned()
            .collect();
        let points = if fresh.len() > EMBED_BATCH {
            // A first index of thousands of texts: on a blocking thread, across the cores.
            tokio::task::spawn_blocking(move || {
                use rayon::prelude::*;
                fresh.par_iter().map(|p| p.point(None)).collect::<Vec<_>>()
            })
            .await
            .map_err(|e| StoreError::Failed {
                store: store.describe(),
                reason: format!("computing lexical vectors failed: {e}"),
            })?
        } else {
            fresh.iter().map(|p| p.point(None)).collect()
        };
        for chunk in points.chunks(STORE_BATCH) {
            store.upsert(collection, chunk.to_vec()).await?;
            listing.hold(chunk.iter().map(|p| p.id), false);
        }
        if !changes.gone.is_empty() {
            store.delete(collection, changes.gone.clone()).await?;
            listing.forget(&changes.gone);
        }
        Ok(known)
    }

    /// Returns which of the points `ids` the store holds and, for each, whether it has its
    /// dense vector. Ids only are read: a few of them by id; many from the `listing` of
    /// every id the collection holds, made now if there is none (without a model, no
    /// point has a dense vector, and one listing tells all).
    async fn known(
        &self,
        ids: &[PointId],
        listing: &mut Listing,
    ) -> Result<HashMap<PointId, bool>, StoreError> {
        let (store, collection) = (&self.shared.store, &self.shared.collection);
        let lacking = |mut filter: Filter| {
            filter.must_not.push(Condition::HasVector(DENSE.into()));
            Some(filter)
        };
        let mut known = HashMap::with_capacity(ids.len());
        if listing.0.is_none() && ids.len() >= LIST_ALL_FROM {
            let held = store.ids(collection, None).await?;
            let dense = self.shared.embedder.is_some();
            let mut listed: HashMap<PointId, bool> =
                held.into_iter().map(|id| (id, dense)).collect();
            if dense {
                for id in store.ids(collection, lacking(Filter::default())).await? {
                    listed.insert(id, false);
                }
            }
            listing.0 = Some(listed);
        }
        if let Some(listing) = &listing.0 {
            known.extend(ids.iter().filter_map(|id| listing.get(id).map(|dense| (*id, *dense))));
            return Ok(known);
        }
        for chunk in ids.chunks(STORE_BATCH) {
            let these = Filter { must: vec![Condition::HasId(chunk.to_vec())], must_not: vec![] };
            let held = store.ids(collection, Some(these.clone())).await?;
            if held.is_empty() {
                continue;
            }
            known.extend(held.into_iter().map(|id| (id, true)));
            for id in store.ids(collection, lacking(these)).await? {
                known.insert(id, false);
            }
        }
        Ok(known)
    }

    /// Deletes the points of older texts of the tools this process indexed for the first
    /// time (`unswept`), once the catalog has been still for [`SWEEP_AFTER`]: a tool whose
    /// text changed while no router ran left its old point behind, which would take
    /// candidates from every search and weigh in the lexical statistics. Skipped when the
    /// store holds no more points than are indexed, as after a restart over an unchanged
    /// catalog. The listing of the store's ids made for the first indexes is dropped once
    /// the catalog has been still for [`LISTING_FOR`]: from then on the store is asked
    /// again, since other routers may write to it.
    async fn sweep(&self, myself: &ActorRef<SearchMsg>, state: &mut ToolSearchState) {
        let still = state.changed_at.elapsed();
        if still < SWEEP_AFTER {
            myself.send_after(SWEEP_AFTER - still, || SearchMsg::Sweep);
            return;
        }
        state.sweeping = false;
        let names = std::mem::take(&mut state.unswept);
        match self.sweep_names(&names).await {
            Ok(deleted) => state.listing.forget(&deleted),
            // Searchable as it is; the points are swept at the next start.
            Err(error) => warn!(%error, "deleting points of older tool texts failed"),
        }
        if state.listing.0.is_some() {
            if still >= LISTING_FOR {
                state.listing = Listing::default();
            } else {
                myself.send_after(LISTING_FOR - still, || SearchMsg::Sweep);
                state.sweeping = true;
            }
        }
    }

    /// Deletes the points of `names` other than their tools' current ones. The store's
    /// points that no indexed tool has are few (older texts, and tools of sources not
    /// connected yet): those are read, and the ones under these names deleted. Returns the
    /// points deleted.
    async fn sweep_names(&self, names: &[String]) -> Result<Vec<PointId>, StoreError> {
        let (store, collection) = (&self.shared.store, &self.shared.collection);
        let live = self.shared.live.read().unwrap_or_else(PoisonError::into_inner).len();
        if names.is_empty() || store.count(collection, None).await? as usize <= live {
            return Ok(Vec::new());
        }
        let held = store.ids(collection, None).await?;
        let others: Vec<PointId> = {
            let live = self.shared.live.read().unwrap_or_else(PoisonError::into_inner);
            held.into_iter().filter(|id| !live.contains_key(id)).collect()
        };
        let names: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
        let mut stale = Vec::new();
        for chunk in others.chunks(STORE_BATCH) {
            for record in store.retrieve(collection, chunk.to_vec(), false).await? {
                if record
                    .payload
                    .get(NAME)
                    .and_then(Value::as_str)
                    .is_some_and(|n| names.contains(n))
                {
                    stale.push(record.id);
                }
            }
        }
        if !stale.is_empty() {
            debug!(points = stale.len(), "deleting points of older tool texts");
            store.delete(collection, stale.clone()).await?;
        }
        Ok(stale)
    }

    /// Applies written changes to what searches read, and queues the tools that need a
    /// dense vector.
    fn commit(
        &self,
        myself: &ActorRef<SearchMsg>,
        state: &mut ToolSearchState,
        changes: Changes,
        known: &HashMap<PointId, bool>,
    ) {
        let embedding = self.shared.embedder.is_some();
        let mut waiting = Vec::new();
        {
            let mut live = self.shared.live.write().unwrap_or_else(PoisonError::into_inner);
            let mut embedded = 0isize;
            for id in &changes.gone {
                if live.remove(id).is_some_and(|tool| tool.dense) {
                    embedded -= 1;
                }
            }
            for name in &changes.removed {
                state.indexed.remove(name);
            }
            for (name, entry, pending) in changes.upserts {
                let dense = known.get(&pending.id).copied().unwrap_or(false);
                let name: Arc<str> = name.into();
                if let Some(old) = live.insert(pending.id, Live { name: name.clone(), dense }) {
                    embedded -= isize::from(old.dense);
                }
                embedded += isize::from(dense);
                state.indexed.insert(name.to_string(), (entry, pending.id));
                if embedding && !dense {
                    waiting.push(pending);
                }
            }
            if embedded >= 0 {
                self.shared.embedded.fetch_add(embedded as usize, Ordering::AcqRel);
            } else {
                self.shared.embedded.fetch_sub(embedded.unsigned_abs(), Ordering::AcqRel);
            }
        }
        if waiting.is_empty() {
            return;
        }
        waiting.sort_unstable_by_key(|p| p.text.len());
        let mut waiting = waiting.into_iter().peekable();
        while waiting.peek().is_some() {
            state.pending.push(waiting.by_ref().take(EMBED_BATCH).collect());
        }
        if !state.embedding {
            state.embedding = myself.cast(SearchMsg::EmbedNext).is_ok();
            state.run.get_or_insert((Instant::now(), 0));
        }
    }

    async fn embed_next(
        &self,
        myself: &ActorRef<SearchMsg>,
        state: &mut ToolSearchState,
    ) -> Result<(), ActorProcessingErr> {
        state.embedding = false;
        let Some(embedder) = self.shared.embedder.clone() else { return Ok(()) };
        if state.pending.is_empty() {
            return Ok(());
        }
        // A batch at random: routers sharing a store, started together, take different ones.
        state.picks += 1;
        let pick = state.random.hash_one(state.picks) as usize % state.pending.len();
        let mut batch = state.pending.swap_remove(pick);
        // Skip tools that changed or went since they were queued.
        batch.retain(|p| state.indexed.get(&p.name).is_some_and(|(_, id)| *id == p.id));
        match self.embed_batch(embedder, &mut batch, &mut state.listing).await {
            Ok(made) => {
                if let Some((_, count)) = &mut state.run {
                    *count += made;
                }
            }
            Err(error) => {
                // The batch waits for the store to come back.
                state.pending.push(batch);
                self.store_failed(myself, state, &error, SearchMsg::EmbedNext);
                return Ok(());
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

    /// Embeds the tools of `batch` whose points still lack a dense vector and stores them.
    /// Returns how many texts were embedded. A model failure costs the batch its vectors
    /// (the tools stay searchable by their words); a store failure is returned.
    async fn embed_batch(
        &self,
        embedder: Arc<dyn Embedder>,
        batch: &mut Vec<Pending>,
        listing: &mut Listing,
    ) -> Result<usize, StoreError> {
        let store = &self.shared.store;
        let collection = &self.shared.collection;
        // Another router on the same store may have embedded some meanwhile.
        let ids: Vec<PointId> = batch.iter().map(|p| p.id).collect();
        let embedded = Filter {
            must: vec![Condition::HasId(ids), Condition::HasVector(DENSE.into())],
            must_not: vec![],
        };
        let done = store.ids(collection, Some(embedded)).await?;
        if !done.is_empty() {
            self.mark_dense(&done, listing);
            batch.retain(|p| !done.contains(&p.id));
        }
        if batch.is_empty() {
            return Ok(0);
        }
        let texts: Vec<String> = batch.iter().map(|p| p.text.clone()).collect();
        // The model's forward pass runs on a blocking thread; a panic in it costs this
        // batch its vectors, not the index its actor.
        let embedded = tokio::task::spawn_blocking(move || {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            std::panic::catch_unwind(AssertUnwindSafe(|| embedder.embed(&refs))).unwrap_or_else(
                |panic| {
                    Err(toolmesh_embed::EmbedError::Run(format!(
                        "the model panicked: {}",
                        panic_message(panic.as_ref())
                    )))
                },
            )
        })
        .await
        .unwrap_or_else(|e| Err(toolmesh_embed::EmbedError::Run(e.to_string())));
        let vectors = match embedded {
            Ok(vectors) => vectors,
            Err(error) => {
                let tools: Vec<&str> = batch.iter().map(|p| p.name.as_str()).collect();
                error!(%error, ?tools, "embedding tools failed; they are searchable lexically only");
                batch.clear();
                return Ok(0);
            }
        };
        let points: Vec<Point> =
            batch.iter().zip(vectors).map(|(p, vector)| p.point(Some(vector))).collect();
        let made = points.len();
        store.upsert(collection, points).await?;
        self.shared.embeddings.fetch_add(made as u64, Ordering::AcqRel);
        let ids: Vec<PointId> = batch.iter().map(|p| p.id).collect();
        self.mark_dense(&ids, listing);
        Ok(made)
    }

    /// Notes that the points `ids` have their dense vector.
    fn mark_dense(&self, ids: &[PointId], listing: &mut Listing) {
        listing.hold(ids.iter().copied(), true);
        let mut live = self.shared.live.write().unwrap_or_else(PoisonError::into_inner);
        for id in ids {
            if let Some(tool) = live.get_mut(id)
                && !tool.dense
            {
                tool.dense = true;
                self.shared.embedded.fetch_add(1, Ordering::AcqRel);
            }
        }
    }
}

/// A point's payload: its tool's name, and whether it has its dense vector.
fn payload(name: &str, embedded: bool) -> Map<String, Value> {
    let Value::Object(map) = json!({ NAME: name, EMBEDDED: embedded }) else {
        unreachable!("a JSON object literal")
    };
    map
}

/// How the catalog differs from what is indexed.
#[derive(Debug, Default)]
struct Changes {
    /// New tools and tools whose text changed: name, entry, and the text to index.
    upserts: Vec<(String, Arc<ToolEntry>, Pending)>,
    /// Tools that went.
    removed: Vec<String>,
    /// Points no tool has any more: of removed tools, and the old texts of changed ones.
    gone: Vec<PointId>,
    /// Tools this process indexes for the first time. Any point under the same name but
    /// the one of the tool's text is of an older text, left by an earlier run.
    first: Vec<String>,
}

/// Compares `catalog` with what is `indexed` (entries by pointer: the registry keeps an
/// unchanged tool's entry), and hashes the text of new and changed tools only. With the
/// catalog the index last caught up with (`since`), only the tools whose entry differs
/// between the two are looked at; without it, every tool. Tools whose entry changed but not
/// their text are updated in the map at once. Lexical vectors are left to
/// [`ToolSearchActor::write`], for the texts the store does not hold.
fn diff(catalog: &Catalog, since: Option<&Catalog>, mut indexed: Indexed) -> (Indexed, Changes) {
    use rayon::prelude::*;
    let mut changes = Changes::default();
    let is_indexed = |indexed: &Indexed, name: &str, entry: &Arc<ToolEntry>| {
        indexed.get(name).is_some_and(|(known, _)| Arc::ptr_eq(known, entry))
    };
    let mut gone = Vec::new();
    let fresh: Vec<(&str, &Arc<ToolEntry>)> = match since {
        Some(since) => {
            let mut fresh = Vec::new();
            for change in catalog.changes_since(since) {
                match change {
                    CatalogChange::Upserted(name, entry) => {
                        if !is_indexed(&indexed, name, entry) {
                            fresh.push((name, entry));
                        }
                    }
                    CatalogChange::Removed(name) => gone.push(name.to_owned()),
                }
            }
            fresh
        }
        None => catalog.iter().filter(|(name, entry)| !is_indexed(&indexed, name, entry)).collect(),
    };
    // Texts, digests and lexical vectors of the tools whose entry is new, split across the
    // cores: every tool at a first start, one or a few after a change.
    let hashed: Vec<_> = fresh
        .into_par_iter()
        .map(|(name, entry)| {
            let text = tool_text(&entry.spec);
            let id = point_id(&digest(&text));
            (name, entry, text, id)
        })
        .collect();
    for (name, entry, text, id) in hashed {
        match indexed.get_mut(name) {
            // The same text under a new entry.
            Some((known, old)) if *old == id => *known = entry.clone(),
            previous => {
                match previous {
                    Some((_, old)) => changes.gone.push(*old),
                    None => changes.first.push(name.to_owned()),
                }
                let pending = Pending { name: name.to_owned(), id, text };
                changes.upserts.push((name.to_owned(), entry.clone(), pending));
            }
        }
    }
    if since.is_none() {
        // Every catalog tool is indexed or new: when the counts agree, nothing went.
        let new = changes.upserts.len() - changes.gone.len();
        if catalog.len() != indexed.len() + new {
            gone.extend(indexed.keys().filter(|name| !catalog.contains(name)).cloned());
        }
    }
    for name in gone {
        if let Some((_, id)) = indexed.get(&name) {
            changes.gone.push(*id);
            changes.removed.push(name);
        }
    }
    (indexed, changes)
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
        // A fresh actor (a restart) indexes the whole catalog again: what searches read
        // starts over with it; the store keeps the points, so nothing is embedded again.
        self.shared.live.write().unwrap_or_else(PoisonError::into_inner).clear();
        self.shared.embedded.store(0, Ordering::Release);
        myself.cast(SearchMsg::CatalogChanged)?;
        Ok(ToolSearchState {
            indexed: HashMap::new(),
            caught_up: None,
            unswept: Vec::new(),
            changed_at: Instant::now(),
            sweeping: false,
            listing: Listing::default(),
            pending: Vec::new(),
            embedding: false,
            retrying: false,
            ensured: false,
            run: None,
            random: RandomState::new(),
            picks: 0,
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
            SearchMsg::Sweep => {
                self.sweep(&myself, state).await;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

    use toolmesh_core::ToolSource;
    use toolmesh_registry::SourceUpdate;

    use super::*;
    use crate::testing::{registry, tool};

    /// What a successful write makes of `indexed`.
    fn apply(mut indexed: Indexed, changes: &Changes) -> Indexed {
        for name in &changes.removed {
            indexed.remove(name);
        }
        for (name, entry, pending) in &changes.upserts {
            indexed.insert(name.clone(), (entry.clone(), pending.id));
        }
        indexed
    }

    /// The changes, each list sorted: upserted names, removed names, gone points, first.
    fn summary(changes: &Changes) -> (Vec<String>, Vec<String>, Vec<PointId>, Vec<String>) {
        let sorted = |mut v: Vec<String>| {
            v.sort();
            v
        };
        let mut gone = changes.gone.clone();
        gone.sort_unstable();
        (
            sorted(changes.upserts.iter().map(|(name, ..)| name.clone()).collect()),
            sorted(changes.removed.clone()),
            gone,
            sorted(changes.first.clone()),
        )
    }

    /// Comparing a catalog with the one the index last caught up with finds what comparing
    /// it with everything indexed finds, looking at the changed tools only.
    #[tokio::test]
    async fn the_changes_since_the_last_catalog_are_those_of_the_whole() {
        let registry = registry().await;
        let update = |tools: Vec<ToolEntry>, unchanged: &[&str]| SourceUpdate {
            source: ToolSource::local("s"),
            tools,
            toolkits: vec![],
            unchanged: unchanged.iter().map(|&n| n.to_owned()).collect(),
        };
        let (a, b, c, d) =
            (tool("a", "alpha"), tool("b", "beta"), tool("c", "gamma"), tool("d", "delta"));
        registry.replace_source(update(vec![a, b, c, d], &[])).await.unwrap();
        let first = registry.snapshot();
        let (indexed, changes) = diff(&first, None, Indexed::new());
        assert_eq!(summary(&changes).0, ["a", "b", "c", "d"]);
        assert_eq!(summary(&changes).3, ["a", "b", "c", "d"], "all indexed for the first time");
        let indexed = apply(indexed, &changes);
        let id = |name: &str| indexed[name].1;

        // b's text changes, c gets a new entry with the same text, d goes, e comes; a stays.
        let next = vec![tool("b", "beta, again"), tool("c", "gamma"), tool("e", "epsilon")];
        registry.replace_source(update(next, &["a"])).await.unwrap();
        let second = registry.snapshot();
        let (from_last, since) = diff(&second, Some(&first), indexed.clone());
        let (from_all, whole) = diff(&second, None, indexed.clone());
        assert_eq!(summary(&since), summary(&whole));
        let (upserted, removed, gone, new) = summary(&since);
        assert_eq!(upserted, ["b", "e"]);
        assert_eq!(removed, ["d"]);
        let mut expected = vec![id("b"), id("d")];
        expected.sort_unstable();
        assert_eq!(gone, expected, "b's old text and d");
        assert_eq!(new, ["e"]);
        // c's text is indexed already: only its entry is swapped, both ways.
        for indexed in [&from_last, &from_all] {
            assert!(Arc::ptr_eq(&indexed["c"].0, second.get("c").unwrap()));
            assert_eq!(indexed["c"].1, id("c"));
        }

        // Nothing changed since: nothing to do.
        let indexed = apply(from_last, &since);
        let (_, none) = diff(&second, Some(&second), indexed.clone());
        assert_eq!(summary(&none), Default::default());
        let (_, none) = diff(&second, None, indexed);
        assert_eq!(summary(&none), Default::default());
    }
}
