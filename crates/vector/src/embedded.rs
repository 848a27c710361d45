//! Qdrant's engine in-process: one `qdrant-edge` shard per collection under the data
//! directory.
//!
//! The engine's API is synchronous and does file work, so reads run on blocking threads and
//! writes on each collection's writer thread. A write is acknowledged only once it is in the
//! collection's [journal](journal) on disk: the writer appends every write waiting for it,
//! syncs the file once for all of them (a group commit), applies them to the shard, then
//! answers each. Loading a collection replays its journal, so a crash loses no acknowledged
//! write; a checkpoint (the shard's segments written, the journal emptied) keeps it short.
//!
//! Each collection has a lock that [`VectorStore::replace`] takes for writing and queries
//! take for reading: a query sees a document's old points or its new ones, never a mix. The
//! writer settles the shard's segments (index building, merging) once enough points changed
//! since the last time; a crash in the middle of that is repaired at the next load.

mod journal;

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError, RwLock,
        atomic::{AtomicUsize, Ordering},
        mpsc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use journal::{Journal, Op};
use qdrant_edge::{
    CountRequest, CreateIndex, Distance, EdgeConfigBuilder, EdgeShard,
    EdgeSparseVectorParamsBuilder, EdgeVectorParamsBuilder, FacetRequest, FieldIndexOperations,
    Fusion, JsonPath, Modifier, NamedQuery, PayloadFieldSchema, PayloadSchemaType, PointId,
    PointInsertOperations, PointOperations, Prefetch, QueryEnum, QueryRequest, ScoringQuery,
    ScrollRequest, UpdateOperation, VectorInternal, VectorStorageDatatype, WithPayloadInterface,
    WithVector,
};
use serde_json::{Map, Value};
use tokio::sync::oneshot;
use toolmesh_core::vector::{
    CollectionSpec, DENSE, Filter, Hit, LEXICAL, Point, PointId as Id, Precision, Query, Record,
    SparseVector, StoreError, VectorStore,
};
use tracing::{debug, error, info, warn};

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
/// Points per page when a collection is repaired.
const REPAIR_PAGE: usize = 1_000;
/// Writes one sync of the journal makes durable at the most.
const GROUP: usize = 256;
/// The journal's size at which the writer writes the shard's segments and empties it.
const CHECKPOINT_BYTES: u64 = 64 << 20;
/// The file that says a collection's segments were being merged: a crash left it, so the
/// next load repairs the collection.
const SETTLING: &str = "toolmesh-settling";
/// How long deleting a collection waits for the requests that use it to end.
const DELETE_WAIT: Duration = Duration::from_secs(10);

/// The MiB of its disk a store keeps free unless configured otherwise.
pub(crate) const DEFAULT_MIN_FREE_MB: u64 = 256;

/// Qdrant's engine in-process, persisted under a directory.
#[derive(Debug)]
pub struct EmbeddedStore {
    dir: PathBuf,
    space: Space,
    collections: RwLock<HashMap<String, Arc<Collection>>>,
    /// Collections that need to write before they can be loaded (a journal to replay, a
    /// merge to repair) while the disk is short of space: loaded by [`VectorStore::check`]
    /// once it has room again.
    waiting: Mutex<Vec<(CollectionSpec, PathBuf)>>,
    /// Held locked while the store is open: one process at a time writes the directory;
    /// `None` once closed.
    lock: Mutex<Option<fs::File>>,
}

/// A loaded collection: its engine, read by queries, and the thread that writes it.
#[derive(Debug)]
struct Collection {
    engine: Arc<Engine>,
    /// `None` once closing.
    writer: Mutex<Option<mpsc::Sender<Message>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// A collection's shard and what it was made with.
#[derive(Debug)]
struct Engine {
    /// `None` only while being dropped.
    shard: Option<EdgeShard>,
    spec: CollectionSpec,
    /// The collection's directory.
    path: PathBuf,
    /// The free space the store keeps.
    space: Space,
    /// Taken for writing by `replace`, for reading by queries.
    swap: RwLock<()>,
    /// Points written since the last optimisation.
    unsettled: AtomicUsize,
}

/// What a collection's writer is asked.
enum Message {
    /// Make a write durable, apply it, and answer.
    Write(Op, oneshot::Sender<Result<(), StoreError>>),
    /// Write the shard's segments and empty the journal.
    Checkpoint(oneshot::Sender<Result<(), StoreError>>),
}

/// The free space a store keeps on its disk.
#[derive(Debug, Clone)]
struct Space {
    /// The store's directory, on the disk measured.
    dir: PathBuf,
    min_free_mb: u64,
}

impl Space {
    /// Checks that `more` bytes can be written and leave the reserve free.
    fn check(&self, more: u64) -> Result<(), StoreError> {
        // A file system that cannot say is taken to have room: the write then fails or not.
        let Ok(stat) = rustix::fs::statvfs(&self.dir) else { return Ok(()) };
        let free = stat.f_bavail.saturating_mul(stat.f_frsize);
        if free >= (self.min_free_mb << 20).saturating_add(more) {
            return Ok(());
        }
        Err(StoreError::Full {
            store: describe(&self.dir),
            disk: self.dir.display().to_string(),
            free_mb: free >> 20,
            min_free_mb: self.min_free_mb,
        })
    }
}

impl EmbeddedStore {
    /// Opens the store in `dir`, loading every collection it holds, keeping the default
    /// reserve of free space on its disk. The directory is locked while the store is open;
    /// another process's store on it is refused.
    pub async fn open(dir: impl Into<PathBuf>) -> Result<EmbeddedStore, StoreError> {
        EmbeddedStore::open_keeping(dir, DEFAULT_MIN_FREE_MB).await
    }

    /// Opens the store in `dir`, keeping `min_free_mb` MiB of its disk free: below that, it
    /// refuses writes. A collection that would have to write to be loaded (a journal to
    /// replay) waits while the disk is that full, and is loaded once it has room.
    pub async fn open_keeping(
        dir: impl Into<PathBuf>,
        min_free_mb: u64,
    ) -> Result<EmbeddedStore, StoreError> {
        let dir = dir.into();
        let space = Space { dir: dir.clone(), min_free_mb };
        let (store, room) = (dir.clone(), space.clone());
        let (lock, (collections, waiting)) = blocking(&describe(&dir), move || {
            let lock = lock(&store)?;
            Ok::<_, StoreError>((lock, load_all(&store, &room)?))
        })
        .await??;
        Ok(EmbeddedStore {
            dir,
            space,
            collections: RwLock::new(collections),
            waiting: Mutex::new(waiting),
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
        if let Some(found) =
            self.collections.read().unwrap_or_else(PoisonError::into_inner).get(name).cloned()
        {
            return Ok(found);
        }
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting.iter().any(|(spec, _)| spec.name == name) {
            return Err(StoreError::Unavailable {
                store: self.describe(),
                reason: format!(
                    "collection {name:?} waits for free space on its disk to replay its journal"
                ),
            });
        }
        Err(StoreError::NoCollection { store: self.describe(), collection: name.to_owned() })
    }

    /// Hands a write to the collection's writer; answers once it is durable and applied.
    async fn write(&self, name: &str, op: Op) -> Result<(), StoreError> {
        let collection = self.collection(name)?;
        collection.ask(&self.describe(), |answer| Message::Write(op, answer)).await
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

/// Collections loaded, and those waiting for free space.
type Loaded = (HashMap<String, Arc<Collection>>, Vec<(CollectionSpec, PathBuf)>);

fn load_all(dir: &Path, space: &Space) -> Result<Loaded, StoreError> {
    let failed = |reason: String| StoreError::Failed { store: describe(dir), reason };
    let root = collections_dir(dir);
    fs::create_dir_all(&root)
        .map_err(|e| failed(format!("cannot create {}: {e}", root.display())))?;
    let mut collections = HashMap::new();
    let mut waiting = Vec::new();
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
        if let Err(error) = space.check(0)
            && must_write(&path)
        {
            warn!(collection = %spec.name, %error, "the collection waits for free space");
            waiting.push((spec, path));
            continue;
        }
        let collection = load(&spec, path, space).map_err(failed)?;
        collections.insert(spec.name.clone(), Arc::new(collection));
    }
    Ok((collections, waiting))
}

/// Whether loading the collection in `path` writes: a journal to replay or a merge to
/// repair.
fn must_write(path: &Path) -> bool {
    let journal = fs::metadata(path.join(journal::FILE)).map(|m| m.len()).unwrap_or(0);
    journal > 0 || path.join(SETTLING).exists()
}

fn load(spec: &CollectionSpec, path: PathBuf, space: &Space) -> Result<Collection, String> {
    let cannot = |e: String| format!("cannot load collection {:?}: {e}", spec.name);
    let shard = EdgeShard::load(&path, None).map_err(|e| cannot(e.to_string()))?;
    let collection = Collection::start(shard, spec.clone(), path, space.clone()).map_err(cannot)?;
    let points = collection.shard().info().points_count;
    info!(collection = %spec.name, points, "loaded a collection");
    Ok(collection)
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

fn create(dir: &Path, spec: &CollectionSpec, space: Space) -> Result<Collection, String> {
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
    let collection = Collection::start(shard, spec.clone(), path.clone(), space)?;
    write_spec(&path, spec).map_err(|e| format!("cannot write the collection's spec: {e}"))?;
    Ok(collection)
}

impl Drop for Engine {
    /// The engine flushes a shard when it is dropped and panics if that fails (its directory
    /// was removed, the disk is full): the failure is logged, never a crash of the router.
    fn drop(&mut self) {
        let Some(shard) = self.shard.take() else { return };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(shard))).is_err() {
            warn!(collection = %self.spec.name, "flushing a collection on close failed");
        }
    }
}

impl Drop for Collection {
    /// Stops the writer: it answers every write sent before, checkpoints and ends; the
    /// engine closes after it.
    fn drop(&mut self) {
        drop(self.writer.lock().unwrap_or_else(PoisonError::into_inner).take());
        if let Some(thread) = self.thread.lock().unwrap_or_else(PoisonError::into_inner).take()
            && thread.join().is_err()
        {
            error!(collection = %self.engine.spec.name, "the collection's writer panicked");
        }
    }
}

impl Collection {
    /// Opens the journal of a loaded (or new) shard, replays what it holds, repairs a merge
    /// a crash interrupted, and starts the writer.
    fn start(
        shard: EdgeShard,
        spec: CollectionSpec,
        path: PathBuf,
        space: Space,
    ) -> Result<Collection, String> {
        let engine = Arc::new(Engine {
            shard: Some(shard),
            spec,
            path,
            space,
            swap: RwLock::new(()),
            unsettled: AtomicUsize::new(0),
        });
        let (mut journal, ops) = Journal::open(&engine.path)
            .map_err(|e| format!("cannot open its journal in {}: {e}", engine.path.display()))?;
        let replayed = ops.len();
        for op in ops {
            // A write that failed when it was made fails the same way now; it was answered
            // with that error then.
            if let Err(reason) = engine.prepare(op).and_then(|op| engine.apply(op)) {
                warn!(collection = %engine.spec.name, %reason, "a journalled write does not apply");
            }
        }
        let settling = engine.path.join(SETTLING).exists();
        if settling {
            warn!(
                collection = %engine.spec.name,
                "a merge of the collection's segments was interrupted; repairing it"
            );
            engine.repair()?;
        }
        if replayed > 0 || settling {
            info!(collection = %engine.spec.name, writes = replayed, "replayed the journal");
            engine.checkpoint(&mut journal)?;
        }
        engine.unsettled.store(0, Ordering::Relaxed);
        let (sender, receiver) = mpsc::channel();
        let writing = engine.clone();
        let thread = std::thread::Builder::new()
            .name(format!("toolmesh-vector-{}", engine.spec.name))
            .spawn(move || writing.write(journal, receiver))
            .map_err(|e| format!("cannot start its writer: {e}"))?;
        Ok(Collection {
            engine,
            writer: Mutex::new(Some(sender)),
            thread: Mutex::new(Some(thread)),
        })
    }

    fn shard(&self) -> &EdgeShard {
        self.engine.shard()
    }

    fn spec(&self) -> &CollectionSpec {
        &self.engine.spec
    }

    /// Sends the writer a message built around the answer's sender; waits for the answer.
    async fn ask(
        &self,
        store: &str,
        message: impl FnOnce(oneshot::Sender<Result<(), StoreError>>) -> Message,
    ) -> Result<(), StoreError> {
        let (answer, answered) = oneshot::channel();
        let stopped = || StoreError::Unavailable {
            store: store.to_owned(),
            reason: format!("collection {:?} is closing", self.spec().name),
        };
        let sent = match &*self.writer.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(writer) => writer.send(message(answer)).is_ok(),
            None => false,
        };
        if !sent {
            return Err(stopped());
        }
        answered.await.map_err(|_| stopped())?
    }
}

impl Engine {
    fn shard(&self) -> &EdgeShard {
        self.shard.as_ref().expect("a collection's shard is only taken when it is dropped")
    }

    /// The writer's loop: takes every write waiting (up to [`GROUP`]), checks each, makes
    /// the good ones durable with one sync, applies them in order, answers each.
    fn write(&self, mut journal: Journal, messages: mpsc::Receiver<Message>) {
        let store = describe(&self.space.dir);
        let invalid = |reason: String| StoreError::Invalid {
            store: store.clone(),
            collection: self.spec.name.clone(),
            reason,
        };
        let failed = |reason: String| StoreError::Failed { store: store.clone(), reason };
        while let Ok(first) = messages.recv() {
            let mut waiting = vec![first];
            while waiting.len() < GROUP
                && let Ok(next) = messages.try_recv()
            {
                waiting.push(next);
            }
            let mut writes = Vec::new();
            let mut checkpoints = Vec::new();
            for message in waiting {
                match message {
                    Message::Write(op, answer) => {
                        let record = op.record();
                        match self.prepare(op) {
                            Ok(prepared) => writes.push((record, prepared, answer)),
                            Err(reason) => drop(answer.send(Err(invalid(reason)))),
                        }
                    }
                    Message::Checkpoint(answer) => checkpoints.push(answer),
                }
            }
            if !writes.is_empty() {
                // Room for the journal's bytes, and as much again for the segments the
                // writes grow; then one sync for all of them.
                let bytes = writes.iter().map(|(record, ..)| 2 * record.len() as u64).sum();
                let durable = self.space.check(bytes).and_then(|()| {
                    journal.append(writes.iter().map(|(record, ..)| record.as_slice())).map_err(
                        |e| {
                            let reason = format!("cannot write {}: {e}", journal.path().display());
                            error!(collection = %self.spec.name, %reason, "a write was refused");
                            failed(reason)
                        },
                    )
                });
                for (_, prepared, answer) in writes {
                    let done = match &durable {
                        Ok(()) => self.apply(prepared).map_err(&invalid),
                        Err(error) => Err(error.clone()),
                    };
                    let _ = answer.send(done);
                }
            }
            // A merge ends in a checkpoint of its own.
            let settled = self.wants_settling() && self.settle(&mut journal);
            let done = if settled || journal.len() < CHECKPOINT_BYTES && checkpoints.is_empty() {
                Ok(())
            } else {
                self.checkpoint(&mut journal).map_err(&failed).inspect_err(|error| {
                    error!(collection = %self.spec.name, %error, "a checkpoint failed");
                })
            };
            for answer in checkpoints {
                let _ = answer.send(done.clone());
            }
        }
        if journal.len() > 0
            && let Err(reason) = self.checkpoint(&mut journal)
        {
            // The journal stays, and the next load replays it.
            warn!(collection = %self.spec.name, %reason, "the last checkpoint failed");
        }
    }

    /// Writes the shard's segments to disk, then empties the journal.
    fn checkpoint(&self, journal: &mut Journal) -> Result<(), String> {
        let flushed =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.shard().flush()));
        if flushed.is_err() {
            return Err(format!("cannot write collection {:?} to disk", self.spec.name));
        }
        journal.clear().map_err(|e| format!("cannot empty {}: {e}", journal.path().display()))
    }

    /// Checks a write against the collection and turns it into the engine's operations.
    fn prepare(&self, op: Op) -> Result<Vec<PointOperations>, String> {
        let upsert = |points| {
            Ok::<_, String>(PointOperations::UpsertPoints(PointInsertOperations::PointsList(
                self.points(points)?,
            )))
        };
        Ok(match op {
            Op::Upsert(points) if points.is_empty() => Vec::new(),
            Op::Upsert(points) => vec![upsert(points)?],
            Op::Delete(ids) => {
                vec![PointOperations::DeletePoints {
                    ids: ids.into_iter().map(PointId::NumId).collect(),
                }]
            }
            Op::Replace(filter, points) => {
                let delete = PointOperations::DeletePointsByFilter(edge_filter(&filter)?);
                if points.is_empty() { vec![delete] } else { vec![delete, upsert(points)?] }
            }
        })
    }

    fn points(&self, points: Vec<Point>) -> Result<Vec<qdrant_edge::PointStructPersisted>, String> {
        points
            .into_iter()
            .map(|point| {
                let mut vectors = Vec::with_capacity(2);
                if let Some(dense) = point.dense {
                    if Some(dense.len()) != self.spec.dense_size {
                        return Err(format!(
                            "point {} has a dense vector of {} dimensions, not {}",
                            point.id,
                            dense.len(),
                            sized(self.spec.dense_size)
                        ));
                    }
                    vectors.push((DENSE, qdrant_edge::Vector::new_dense(dense)));
                }
                if let Some(lexical) = point.lexical.filter(|_| self.spec.lexical) {
                    let sparse = qdrant_edge::Vector::new_sparse(lexical.indices, lexical.values)
                        .map_err(|e| format!("point {}: {e}", point.id))?;
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

    /// Applies a write's operations, under the lock queries take, so a query sees all of
    /// them or none.
    fn apply(&self, operations: Vec<PointOperations>) -> Result<(), String> {
        let changed: usize = operations
            .iter()
            .map(|operation| match operation {
                PointOperations::UpsertPoints(PointInsertOperations::PointsList(points)) => {
                    points.len()
                }
                PointOperations::DeletePoints { ids } => ids.len(),
                _ => 1,
            })
            .sum();
        let _swap = (operations.len() > 1)
            .then(|| self.swap.write().unwrap_or_else(PoisonError::into_inner));
        for operation in operations {
            self.shard()
                .update(UpdateOperation::PointOperation(operation))
                .map_err(|e| e.to_string())?;
        }
        self.unsettled.fetch_add(changed, Ordering::Relaxed);
        Ok(())
    }

    /// Whether enough points changed since the last optimisation to optimise again.
    fn wants_settling(&self) -> bool {
        let unsettled = self.unsettled.load(Ordering::Relaxed);
        let past_scanning = unsettled * self.dense_bytes() > INDEXING_THRESHOLD_KB * 1024;
        unsettled >= SETTLE_EVERY
            && (past_scanning || unsettled >= self.shard().info().points_count / 2)
    }

    /// The bytes of one point's dense vector.
    fn dense_bytes(&self) -> usize {
        self.spec.dense_size.unwrap_or(0) * self.spec.precision.element_bytes()
    }

    /// Lets the engine build indexes and merge segments after many writes, where the disk
    /// has room for it. A file marks the merge until its result is on disk and the journal
    /// empty: a crash in between is repaired at the next load. Returns whether the merge
    /// ended in a checkpoint.
    fn settle(&self, journal: &mut Journal) -> bool {
        self.unsettled.store(0, Ordering::Relaxed);
        // A merge writes the points it merges once more.
        let points = self.shard().info().points_count as u64;
        if let Err(error) = self.space.check(points * (self.dense_bytes() as u64 + 512)) {
            warn!(collection = %self.spec.name, %error, "not merging");
            return false;
        }
        let marker = self.path.join(SETTLING);
        if let Err(e) = fs::File::create(&marker).and_then(|file| file.sync_all()) {
            warn!(collection = %self.spec.name, error = %e, "cannot mark a merge; not merging");
            return false;
        }
        let started = Instant::now();
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
        match self.checkpoint(journal) {
            Ok(()) => {
                let _ = fs::remove_file(&marker);
                true
            }
            Err(reason) => {
                error!(collection = %self.spec.name, %reason, "a checkpoint failed");
                false
            }
        }
    }

    /// Stores every point again, each once: after a merge a crash interrupted, a point may
    /// be in the old segments and the new.
    fn repair(&self) -> Result<(), String> {
        let mut offset = None;
        loop {
            let request = ScrollRequest {
                offset,
                limit: Some(REPAIR_PAGE),
                filter: None,
                with_payload: Some(WithPayloadInterface::Bool(true)),
                with_vector: WithVector::Bool(true),
                order_by: None,
            };
            let (records, next) = self.shard().scroll(request).map_err(|e| e.to_string())?;
            let points: Vec<Point> =
                records.into_iter().filter_map(stored).map(Point::from).collect();
            if !points.is_empty() {
                self.apply(self.prepare(Op::Upsert(points))?)?;
            }
            match next {
                Some(next) => offset = Some(next),
                None => return Ok(()),
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

/// A point the engine holds, as the store's callers see it; `None` for an id toolmesh does
/// not make.
fn stored(record: qdrant_edge::Record) -> Option<Record> {
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
    Some(Record { id: numeric(record.id)?, payload: payload(record.payload), dense, lexical })
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
            let held = &existing.spec();
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
        self.space.check(0)?;
        let (dir, owned, space) = (self.dir.clone(), spec.clone(), self.space.clone());
        let created = blocking(&self.describe(), move || create(&dir, &owned, space))
            .await?
            .map_err(|reason| StoreError::Failed {
                store: self.describe(),
                reason: format!("cannot create collection {:?}: {reason}", spec.name),
            })?;
        let mut collections = self.collections.write().unwrap_or_else(PoisonError::into_inner);
        // Two first uses at once: the first one created wins, the second shard is dropped
        // before anything was stored in it.
        collections.entry(spec.name.clone()).or_insert_with(|| Arc::new(created));
        info!(collection = %spec.name, store = %self.describe(), "created a collection");
        Ok(())
    }

    async fn upsert(&self, collection: &str, points: Vec<Point>) -> Result<(), StoreError> {
        if points.is_empty() {
            return Ok(());
        }
        self.write(collection, Op::Upsert(points)).await
    }

    async fn delete(&self, collection: &str, ids: Vec<Id>) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.write(collection, Op::Delete(ids)).await
    }

    async fn replace(
        &self,
        collection: &str,
        filter: Filter,
        points: Vec<Point>,
    ) -> Result<(), StoreError> {
        self.write(collection, Op::Replace(filter, points)).await
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
            Ok(records.into_iter().filter_map(stored).collect())
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
                && Some(dense.len()) != c.spec().dense_size
            {
                return Err(invalid(format!(
                    "the query vector has {} dimensions, not {}",
                    dense.len(),
                    sized(c.spec().dense_size)
                )));
            }
            let lexical = match query.lexical.filter(|l| c.spec().lexical && !l.is_empty()) {
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
            let _swap = c.engine.swap.read().unwrap_or_else(PoisonError::into_inner);
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
        for collection in collections {
            collection.ask(&self.describe(), Message::Checkpoint).await?;
        }
        Ok(())
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

    /// The store answers while its directory is there; it is down (reads go on) while its
    /// disk has less free space than it keeps. Collections waiting for space are loaded
    /// here once there is room.
    async fn check(&self) -> Result<(), StoreError> {
        let root = collections_dir(&self.dir);
        let store = self.describe();
        let failed = |reason: String| StoreError::Failed { store: store.clone(), reason };
        let gone = |e: std::io::Error| StoreError::Unavailable {
            store: store.clone(),
            reason: format!("{} is gone: {e}", root.display()),
        };
        let space = self.space.clone();
        let root_checked = root.clone();
        blocking(&store, move || fs::metadata(&root_checked).map(|_| ())).await?.map_err(gone)?;
        blocking(&store, move || space.check(0)).await??;
        let waiting =
            std::mem::take(&mut *self.waiting.lock().unwrap_or_else(PoisonError::into_inner));
        if waiting.is_empty() {
            return Ok(());
        }
        let space = self.space.clone();
        let loaded = blocking(&store, move || {
            waiting
                .into_iter()
                .map(|(spec, path)| {
                    let loaded = load(&spec, path.clone(), &space);
                    (spec, path, loaded)
                })
                .collect::<Vec<_>>()
        })
        .await?;
        let mut result = Ok(());
        for (spec, path, loaded) in loaded {
            match loaded {
                Ok(collection) => {
                    info!(collection = %spec.name, "loaded a collection that waited for space");
                    self.collections
                        .write()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(spec.name.clone(), Arc::new(collection));
                }
                Err(reason) => {
                    self.waiting.lock().unwrap_or_else(PoisonError::into_inner).push((spec, path));
                    result = Err(failed(reason));
                }
            }
        }
        result
    }
}
