//! Qdrant's engine in-process: one `qdrant-edge` shard per collection under the data
//! directory.
//!
//! The engine's API is synchronous and does file work, so every operation runs on a blocking
//! thread. Each collection has a lock that [`VectorStore::replace`] takes for writing and
//! queries take for reading: a query sees a document's old points or its new ones, never a
//! mix. Writes settle the shard's segments (index building, merging) once enough points
//! changed since the last time, on the same blocking thread.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError, RwLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use async_trait::async_trait;
use qdrant_edge::{
    CountRequest, CreateIndex, Distance, EdgeConfigBuilder, EdgeShard,
    EdgeSparseVectorParamsBuilder, EdgeVectorParamsBuilder, FacetRequest, FieldIndexOperations,
    Fusion, JsonPath, Modifier, NamedQuery, PayloadFieldSchema, PayloadSchemaType, PointId,
    PointInsertOperations, PointOperations, Prefetch, QueryEnum, QueryRequest, ScoringQuery,
    ScrollRequest, UpdateOperation, VectorInternal, VectorStorageDatatype, WithPayloadInterface,
    WithVector,
};
use serde_json::{Map, Value};
use toolmesh_core::vector::{
    CollectionSpec, DENSE, Filter, Hit, LEXICAL, Point, PointId as Id, Precision, Query, Record,
    SparseVector, StoreError, VectorStore,
};
use tracing::{debug, info, warn};

use crate::filter::edge_filter;

/// Points changed since a collection was last optimised before the next write optimises it,
/// at the least; and at least half as many as the collection holds, so that filling a
/// collection optimises it a logarithmic number of times, not once per fixed step, unless
/// their dense vectors are more than a segment searched exactly may hold
/// ([`INDEXING_THRESHOLD_KB`]): those then get their graph.
const SETTLE_EVERY: usize = 2_000;
/// Segments below this size (KB of vectors) are searched exactly, without an HNSW graph:
/// about 13,000 vectors of 384 dimensions at full precision, 26,000 at half. An exact scan
/// of that many takes a millisecond or two, finds the true neighbours, and costs no index
/// build on every change; larger collections get the graph.
const INDEXING_THRESHOLD_KB: usize = 20_000;

/// Points per page when ids are scrolled.
const SCROLL_PAGE: usize = 10_000;
/// How long deleting a collection waits for the requests that use it to end.
const DELETE_WAIT: Duration = Duration::from_secs(10);

/// Qdrant's engine in-process, persisted under a directory.
#[derive(Debug)]
pub struct EmbeddedStore {
    dir: PathBuf,
    collections: RwLock<HashMap<String, Arc<Collection>>>,
    /// Held locked while the store is open: one process at a time writes the directory;
    /// `None` once closed.
    lock: Mutex<Option<fs::File>>,
}

#[derive(Debug)]
struct Collection {
    /// `None` only while being dropped.
    shard: Option<EdgeShard>,
    spec: CollectionSpec,
    /// Taken for writing by `replace`, for reading by queries.
    swap: RwLock<()>,
    /// Points written since the last optimisation.
    unsettled: AtomicUsize,
}

impl EmbeddedStore {
    /// Opens the store in `dir`, loading every collection it holds. The directory is
    /// locked while the store is open; another process's store on it is refused.
    pub async fn open(dir: impl Into<PathBuf>) -> Result<EmbeddedStore, StoreError> {
        let dir = dir.into();
        let store = dir.clone();
        let (lock, collections) = blocking(&describe(&dir), move || {
            let lock = lock(&store)?;
            Ok::<_, StoreError>((lock, load_all(&store)?))
        })
        .await??;
        Ok(EmbeddedStore {
            dir,
            collections: RwLock::new(collections),
            lock: Mutex::new(Some(lock)),
        })
    }

    fn collection(&self, name: &str) -> Result<Arc<Collection>, StoreError> {
        if self.lock.lock().unwrap_or_else(PoisonError::into_inner).is_none() {
            return Err(StoreError::Unavailable {
                store: self.describe(),
                reason: "the store is closed (toolmesh is shutting down)".into(),
            });
        }
        self.collections
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
            .ok_or_else(|| StoreError::NoCollection {
                store: self.describe(),
                collection: name.to_owned(),
            })
    }

    /// Runs `work` on the collection on a blocking thread.
    async fn with<T, F>(&self, name: &str, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Collection, &dyn Fn(String) -> StoreError) -> Result<T, StoreError>
            + Send
            + 'static,
    {
        let collection = self.collection(name)?;
        let (store, name) = (self.describe(), name.to_owned());
        blocking(&store.clone(), move || {
            let invalid = |reason: String| StoreError::Invalid {
                store: store.clone(),
                collection: name.clone(),
                reason,
            };
            work(&collection, &invalid)
        })
        .await?
    }
}

fn describe(dir: &Path) -> String {
    format!("embedded at {}", dir.display())
}

async fn blocking<T: Send + 'static>(
    store: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(work).await.map_err(|e| StoreError::Failed {
        store: store.to_owned(),
        reason: format!("the store's thread failed: {e}"),
    })
}

fn lock(dir: &Path) -> Result<fs::File, StoreError> {
    let failed = |reason: String| StoreError::Failed { store: describe(dir), reason };
    fs::create_dir_all(dir).map_err(|e| failed(format!("cannot create {}: {e}", dir.display())))?;
    let path = dir.join("LOCK");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| failed(format!("cannot open {}: {e}", path.display())))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(StoreError::Unavailable {
            store: describe(dir),
            reason: "another toolmesh process has it open; give each process its own data \
                     directory (--data-dir), or share a Qdrant server ([vector] backend = \
                     \"qdrant\")"
                .into(),
        }),
        Err(fs::TryLockError::Error(e)) => {
            Err(failed(format!("cannot lock {}: {e}", path.display())))
        }
    }
}

/// Collections live in `dir/collections/<name>`; the spec each was made with beside it.
fn collections_dir(dir: &Path) -> PathBuf {
    dir.join("collections")
}

fn load_all(dir: &Path) -> Result<HashMap<String, Arc<Collection>>, StoreError> {
    let failed = |reason: String| StoreError::Failed { store: describe(dir), reason };
    let root = collections_dir(dir);
    fs::create_dir_all(&root)
        .map_err(|e| failed(format!("cannot create {}: {e}", root.display())))?;
    let mut collections = HashMap::new();
    let entries =
        fs::read_dir(&root).map_err(|e| failed(format!("cannot read {}: {e}", root.display())))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(spec) = read_spec(&path) else {
            // A directory without its spec is a creation that did not finish; it holds
            // nothing anyone stored (the spec is written last).
            if path.is_dir() {
                warn!(path = %path.display(), "removing an unfinished collection");
                let _ = fs::remove_dir_all(&path);
            }
            continue;
        };
        let shard = EdgeShard::load(&path, None)
            .map_err(|e| failed(format!("cannot load collection {:?}: {e}", spec.name)))?;
        info!(collection = %spec.name, points = shard.info().points_count, "loaded a collection");
        collections.insert(spec.name.clone(), Arc::new(Collection::new(shard, spec)));
    }
    Ok(collections)
}

const SPEC_FILE: &str = "toolmesh-collection.json";

fn read_spec(path: &Path) -> Option<CollectionSpec> {
    let text = fs::read_to_string(path.join(SPEC_FILE)).ok()?;
    let value: Value = serde_json::from_str(&text).ok()?;
    Some(CollectionSpec {
        name: value.get("name")?.as_str()?.to_owned(),
        dense_size: match value.get("dense_size")? {
            Value::Null => None,
            size => Some(usize::try_from(size.as_u64()?).ok()?),
        },
        // Collections made before precision was a choice hold full-precision vectors.
        precision: match value.get("precision").and_then(Value::as_str) {
            None => Precision::Full,
            Some(name) => Precision::ALL.into_iter().find(|p| p.as_str() == name)?,
        },
        lexical: value.get("lexical")?.as_bool()?,
        keyword_fields: value
            .get("keyword_fields")?
            .as_array()?
            .iter()
            .filter_map(|f| f.as_str().map(str::to_owned))
            .collect(),
    })
}

fn write_spec(path: &Path, spec: &CollectionSpec) -> std::io::Result<()> {
    let value = serde_json::json!({
        "name": spec.name,
        "dense_size": spec.dense_size,
        "precision": spec.precision.as_str(),
        "lexical": spec.lexical,
        "keyword_fields": spec.keyword_fields,
    });
    let temporary = path.join(format!("{SPEC_FILE}.tmp"));
    fs::write(&temporary, value.to_string())?;
    fs::rename(temporary, path.join(SPEC_FILE))
}

/// A directory name for a collection: its name with anything but `[A-Za-z0-9._-]` escaped,
/// so that two names never share a directory.
fn directory_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || "._-".contains(c) && !(out.is_empty() && c == '.') {
            out.push(c);
        } else {
            out.push_str(&format!("%{:x}", c as u32));
        }
    }
    out
}

fn create(dir: &Path, spec: &CollectionSpec) -> Result<EdgeShard, String> {
    let path = collections_dir(dir).join(directory_name(&spec.name));
    if path.exists() {
        fs::remove_dir_all(&path).map_err(|e| format!("cannot clear {}: {e}", path.display()))?;
    }
    fs::create_dir_all(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    let mut config = EdgeConfigBuilder::new().optimizers(qdrant_edge::EdgeOptimizersConfig {
        indexing_threshold: Some(INDEXING_THRESHOLD_KB),
        ..Default::default()
    });
    if let Some(size) = spec.dense_size {
        let datatype = match spec.precision {
            Precision::Full => VectorStorageDatatype::Float32,
            Precision::Half => VectorStorageDatatype::Float16,
        };
        let params = EdgeVectorParamsBuilder::new(size, Distance::Cosine).datatype(datatype);
        config = config.vector(DENSE, params.build());
    }
    if spec.lexical {
        config = config.sparse_vector(
            LEXICAL,
            EdgeSparseVectorParamsBuilder::new().modifier(Modifier::Idf).build(),
        );
    }
    let shard = EdgeShard::new(&path, config.build()).map_err(|e| e.to_string())?;
    for field in &spec.keyword_fields {
        shard
            .update(UpdateOperation::FieldIndexOperation(FieldIndexOperations::CreateIndex(
                CreateIndex {
                    field_name: JsonPath::try_from(field.as_str())
                        .map_err(|()| format!("bad field name {field:?}"))?,
                    field_schema: Some(PayloadFieldSchema::FieldType(PayloadSchemaType::Keyword)),
                },
            )))
            .map_err(|e| format!("cannot index field {field:?}: {e}"))?;
    }
    write_spec(&path, spec).map_err(|e| format!("cannot write the collection's spec: {e}"))?;
    Ok(shard)
}

impl Drop for Collection {
    /// The engine flushes a shard when it is dropped and panics if that fails (its directory
    /// was removed, the disk is full): the failure is logged, never a crash of the router.
    fn drop(&mut self) {
        let Some(shard) = self.shard.take() else { return };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(shard))).is_err() {
            warn!(collection = %self.spec.name, "flushing a collection on close failed");
        }
    }
}

impl Collection {
    fn new(shard: EdgeShard, spec: CollectionSpec) -> Collection {
        Collection {
            shard: Some(shard),
            spec,
            swap: RwLock::new(()),
            unsettled: AtomicUsize::new(0),
        }
    }

    fn shard(&self) -> &EdgeShard {
        self.shard.as_ref().expect("a collection's shard is only taken when it is dropped")
    }

    fn points(
        &self,
        points: Vec<Point>,
        invalid: &dyn Fn(String) -> StoreError,
    ) -> Result<Vec<qdrant_edge::PointStructPersisted>, StoreError> {
        points
            .into_iter()
            .map(|point| {
                let mut vectors = Vec::with_capacity(2);
                if let Some(dense) = point.dense {
                    if Some(dense.len()) != self.spec.dense_size {
                        return Err(invalid(format!(
                            "point {} has a dense vector of {} dimensions, not {}",
                            point.id,
                            dense.len(),
                            sized(self.spec.dense_size)
                        )));
                    }
                    vectors.push((DENSE, qdrant_edge::Vector::new_dense(dense)));
                }
                if let Some(lexical) = point.lexical.filter(|_| self.spec.lexical) {
                    let sparse = qdrant_edge::Vector::new_sparse(lexical.indices, lexical.values)
                        .map_err(|e| invalid(format!("point {}: {e}", point.id)))?;
                    vectors.push((LEXICAL, sparse));
                }
                Ok(qdrant_edge::PointStruct::new(
                    PointId::NumId(point.id),
                    qdrant_edge::Vectors::new_named(vectors),
                    Value::Object(point.payload),
                )
                .into())
            })
            .collect()
    }

    fn apply(
        &self,
        operation: PointOperations,
        changed: usize,
        invalid: &dyn Fn(String) -> StoreError,
    ) -> Result<(), StoreError> {
        self.shard()
            .update(UpdateOperation::PointOperation(operation))
            .map_err(|e| invalid(e.to_string()))?;
        let unsettled = self.unsettled.fetch_add(changed, Ordering::Relaxed) + changed;
        let past_scanning = unsettled * self.dense_bytes() > INDEXING_THRESHOLD_KB * 1024;
        if unsettled >= SETTLE_EVERY
            && (past_scanning || unsettled >= self.shard().info().points_count / 2)
        {
            self.settle();
        }
        Ok(())
    }

    /// The bytes of one point's dense vector.
    fn dense_bytes(&self) -> usize {
        self.spec.dense_size.unwrap_or(0) * self.spec.precision.element_bytes()
    }

    /// Lets the engine build indexes and merge segments after many writes.
    fn settle(&self) {
        self.unsettled.store(0, Ordering::Relaxed);
        let started = std::time::Instant::now();
        match self.shard().optimize() {
            Ok(changed) => debug!(
                collection = %self.spec.name,
                changed,
                ms = started.elapsed().as_millis() as u64,
                "optimised a collection"
            ),
            Err(error) => {
                warn!(collection = %self.spec.name, %error, "optimising a collection failed")
            }
        }
    }
}

/// Describes a dense vector size for messages.
fn sized(size: Option<usize>) -> String {
    match size {
        Some(size) => format!("dense vectors of {size} dimensions"),
        None => "no dense vectors".into(),
    }
}

/// What a collection of `spec` holds, for messages.
fn holds(spec: &CollectionSpec) -> String {
    let precision = match spec.dense_size {
        Some(_) => format!(" at {} precision", spec.precision.as_str()),
        None => String::new(),
    };
    let lexical = if spec.lexical { " with lexical vectors" } else { "" };
    format!("{}{precision}{lexical}", sized(spec.dense_size))
}

fn payload(payload: Option<qdrant_edge::Payload>) -> Map<String, Value> {
    payload.map(|p| p.0).unwrap_or_default()
}

fn numeric(id: PointId) -> Option<Id> {
    match id {
        PointId::NumId(id) => Some(id),
        PointId::Uuid(_) => None,
    }
}

fn nearest(query: VectorInternal, using: &str) -> ScoringQuery {
    ScoringQuery::Vector(QueryEnum::Nearest(NamedQuery { query, using: Some(using.to_owned()) }))
}

#[async_trait]
impl VectorStore for EmbeddedStore {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    fn describe(&self) -> String {
        describe(&self.dir)
    }

    async fn ensure(&self, spec: &CollectionSpec) -> Result<(), StoreError> {
        let found = match self.collection(&spec.name) {
            Err(error @ StoreError::Unavailable { .. }) => return Err(error),
            found => found.ok(),
        };
        if let Some(existing) = found {
            let held = &existing.spec;
            if held.dense_size != spec.dense_size
                || held.lexical != spec.lexical
                || held.dense_size.is_some() && held.precision != spec.precision
            {
                return Err(StoreError::Invalid {
                    store: self.describe(),
                    collection: spec.name.clone(),
                    reason: format!("it holds {}, not {}", holds(held), holds(spec)),
                });
            }
            return Ok(());
        }
        let (dir, owned) = (self.dir.clone(), spec.clone());
        let shard =
            blocking(&self.describe(), move || create(&dir, &owned)).await?.map_err(|reason| {
                StoreError::Failed {
                    store: self.describe(),
                    reason: format!("cannot create collection {:?}: {reason}", spec.name),
                }
            })?;
        let mut collections = self.collections.write().unwrap_or_else(PoisonError::into_inner);
        // Two first uses at once: the first one created wins, the second shard is dropped
        // before anything was stored in it.
        collections
            .entry(spec.name.clone())
            .or_insert_with(|| Arc::new(Collection::new(shard, spec.clone())));
        info!(collection = %spec.name, store = %self.describe(), "created a collection");
        Ok(())
    }

    async fn upsert(&self, collection: &str, points: Vec<Point>) -> Result<(), StoreError> {
        if points.is_empty() {
            return Ok(());
        }
        self.with(collection, move |c, invalid| {
            let changed = points.len();
            let points = c.points(points, invalid)?;
            c.apply(
                PointOperations::UpsertPoints(PointInsertOperations::PointsList(points)),
                changed,
                invalid,
            )
        })
        .await
    }

    async fn delete(&self, collection: &str, ids: Vec<Id>) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.with(collection, move |c, invalid| {
            let changed = ids.len();
            let ids = ids.into_iter().map(PointId::NumId).collect();
            c.apply(PointOperations::DeletePoints { ids }, changed, invalid)
        })
        .await
    }

    async fn replace(
        &self,
        collection: &str,
        filter: Filter,
        points: Vec<Point>,
    ) -> Result<(), StoreError> {
        self.with(collection, move |c, invalid| {
            let filter = edge_filter(&filter).map_err(invalid)?;
            let changed = points.len().max(1);
            let points = c.points(points, invalid)?;
            let _swap = c.swap.write().unwrap_or_else(PoisonError::into_inner);
            c.apply(PointOperations::DeletePointsByFilter(filter), 0, invalid)?;
            if !points.is_empty() {
                c.apply(
                    PointOperations::UpsertPoints(PointInsertOperations::PointsList(points)),
                    changed,
                    invalid,
                )?;
            }
            Ok(())
        })
        .await
    }

    async fn retrieve(
        &self,
        collection: &str,
        ids: Vec<Id>,
        with_vectors: bool,
    ) -> Result<Vec<Record>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.with(collection, move |c, invalid| {
            let ids: Vec<PointId> = ids.into_iter().map(PointId::NumId).collect();
            let records = c
                .shard()
                .retrieve(
                    &ids,
                    Some(WithPayloadInterface::Bool(true)),
                    Some(WithVector::Bool(with_vectors)),
                )
                .map_err(|e| invalid(e.to_string()))?;
            Ok(records
                .into_iter()
                .filter_map(|record| {
                    let mut named = match record.vector {
                        Some(qdrant_edge::VectorStructInternal::Named(named)) => named,
                        _ => Default::default(),
                    };
                    let dense = match named.remove(DENSE) {
                        Some(VectorInternal::Dense(dense)) => Some(dense),
                        _ => None,
                    };
                    let lexical = match named.remove(LEXICAL) {
                        Some(VectorInternal::Sparse(sparse)) => {
                            Some(SparseVector { indices: sparse.indices, values: sparse.values })
                        }
                        _ => None,
                    };
                    Some(Record {
                        id: numeric(record.id)?,
                        payload: payload(record.payload),
                        dense,
                        lexical,
                    })
                })
                .collect())
        })
        .await
    }

    async fn ids(&self, collection: &str, filter: Option<Filter>) -> Result<Vec<Id>, StoreError> {
        self.with(collection, move |c, invalid| {
            let filter = filter.as_ref().map(edge_filter).transpose().map_err(invalid)?;
            let mut ids = Vec::new();
            let mut offset = None;
            loop {
                let request = ScrollRequest {
                    offset,
                    limit: Some(SCROLL_PAGE),
                    filter: filter.clone(),
                    with_payload: Some(WithPayloadInterface::Bool(false)),
                    with_vector: WithVector::Bool(false),
                    order_by: None,
                };
                let (records, next) =
                    c.shard().scroll(request).map_err(|e| invalid(e.to_string()))?;
                ids.extend(records.into_iter().filter_map(|record| numeric(record.id)));
                match next {
                    Some(next) => offset = Some(next),
                    None => return Ok(ids),
                }
            }
        })
        .await
    }

    async fn query(&self, collection: &str, query: Query) -> Result<Vec<Hit>, StoreError> {
        self.with(collection, move |c, invalid| {
            let filter = query.filter.as_ref().map(edge_filter).transpose().map_err(invalid)?;
            let k = query.rrf_k();
            if let Some(dense) = &query.dense
                && Some(dense.len()) != c.spec.dense_size
            {
                return Err(invalid(format!(
                    "the query vector has {} dimensions, not {}",
                    dense.len(),
                    sized(c.spec.dense_size)
                )));
            }
            let lexical = match query.lexical.filter(|l| c.spec.lexical && !l.is_empty()) {
                Some(l) => Some(
                    qdrant_edge::SparseVector::new(l.indices, l.values)
                        .map_err(|e| invalid(format!("the lexical query: {e}")))?,
                ),
                None => None,
            };
            let dense = query.dense.map(|d| nearest(VectorInternal::Dense(d), DENSE));
            let lexical = lexical.map(|l| nearest(VectorInternal::Sparse(l), LEXICAL));
            let candidates = query.candidates.max(query.limit);
            let (prefetches, scoring, limit) = match (dense, lexical) {
                (Some(dense), Some(lexical)) => {
                    let prefetch = |scoring| Prefetch {
                        prefetches: Vec::new(),
                        query: Some(scoring),
                        limit: candidates,
                        params: None,
                        filter: None,
                        score_threshold: None,
                    };
                    (
                        vec![prefetch(dense), prefetch(lexical)],
                        ScoringQuery::Fusion(Fusion::Rrf { k, weights: None }),
                        query.limit,
                    )
                }
                (Some(one), None) | (None, Some(one)) => (Vec::new(), one, query.limit),
                (None, None) => return Ok(Vec::new()),
            };
            let request = QueryRequest {
                prefetches,
                query: Some(scoring),
                filter,
                score_threshold: None,
                limit,
                offset: 0,
                params: None,
                with_vector: WithVector::Bool(false),
                with_payload: WithPayloadInterface::Bool(query.payload),
            };
            let _swap = c.swap.read().unwrap_or_else(PoisonError::into_inner);
            let found = c.shard().query(request).map_err(|e| invalid(e.to_string()))?;
            Ok(found
                .into_iter()
                .filter_map(|point| {
                    Some(Hit {
                        id: numeric(point.id)?,
                        score: point.score,
                        payload: payload(point.payload),
                    })
                })
                .collect())
        })
        .await
    }

    async fn count(&self, collection: &str, filter: Option<Filter>) -> Result<u64, StoreError> {
        self.with(collection, move |c, invalid| {
            let filter = filter.as_ref().map(edge_filter).transpose().map_err(invalid)?;
            let count = c
                .shard()
                .count(CountRequest { filter, exact: true })
                .map_err(|e| invalid(e.to_string()))?;
            Ok(count as u64)
        })
        .await
    }

    async fn distinct(
        &self,
        collection: &str,
        field: &str,
        limit: usize,
    ) -> Result<u64, StoreError> {
        let field = field.to_owned();
        self.with(collection, move |c, invalid| {
            let key = JsonPath::try_from(field.as_str())
                .map_err(|()| invalid(format!("bad field name {field:?}")))?;
            let facets = c
                .shard()
                .facet(FacetRequest { key, limit: limit.max(1), filter: None, exact: true })
                .map_err(|e| invalid(e.to_string()))?;
            Ok(facets.hits.len() as u64)
        })
        .await
    }

    async fn delete_collection(&self, collection: &str) -> Result<(), StoreError> {
        let removed =
            self.collections.write().unwrap_or_else(PoisonError::into_inner).remove(collection);
        let Some(mut removed) = removed else { return Ok(()) };
        let path = collections_dir(&self.dir).join(directory_name(collection));
        let store = self.describe();
        let failed = |reason: String| StoreError::Failed { store: store.clone(), reason };
        let deleted = blocking(&store, move || {
            // Requests that took the collection before it left the map end first: its
            // shard writes its files as it closes, so only then are they deleted.
            let since = Instant::now();
            loop {
                match Arc::try_unwrap(removed) {
                    Ok(collection) => break drop(collection),
                    Err(_) if since.elapsed() > DELETE_WAIT => {
                        return Err("requests kept using it".to_owned());
                    }
                    Err(shared) => removed = shared,
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            // Without its spec the directory is an unfinished collection, which the next
            // start removes should this process end before it has.
            fs::remove_file(path.join(SPEC_FILE))
                .and_then(|()| fs::remove_dir_all(&path))
                .map_err(|e| format!("cannot remove {}: {e}", path.display()))
        });
        deleted.await?.map_err(|reason| {
            failed(format!("cannot delete collection {collection:?}: {reason}"))
        })?;
        info!(collection, store = %self.describe(), "deleted a collection");
        Ok(())
    }

    fn shared(&self) -> bool {
        false
    }

    async fn flush(&self) -> Result<(), StoreError> {
        let collections: Vec<Arc<Collection>> = self
            .collections
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        let store = self.describe();
        blocking(&store.clone(), move || {
            for collection in collections {
                let flushed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    collection.shard().flush()
                }));
                if flushed.is_err() {
                    return Err(StoreError::Failed {
                        store,
                        reason: format!(
                            "cannot write collection {:?} to disk",
                            collection.spec.name
                        ),
                    });
                }
            }
            Ok(())
        })
        .await?
    }

    async fn close(&self) {
        let collections =
            std::mem::take(&mut *self.collections.write().unwrap_or_else(PoisonError::into_inner));
        let lock = self.lock.lock().unwrap_or_else(PoisonError::into_inner).take();
        // Dropping the shards writes them; a request still running holds its collection
        // until it ends, then that one is written as it goes.
        let _ = blocking(&self.describe(), move || {
            drop(collections);
            drop(lock);
        })
        .await;
        info!(store = %self.describe(), "closed the vector store");
    }

    async fn check(&self) -> Result<(), StoreError> {
        let root = collections_dir(&self.dir);
        let store = self.describe();
        blocking(&store.clone(), move || {
            fs::metadata(&root).map(|_| ()).map_err(|e| StoreError::Unavailable {
                store,
                reason: format!("{} is gone: {e}", root.display()),
            })
        })
        .await?
    }
}
