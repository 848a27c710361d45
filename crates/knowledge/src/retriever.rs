//! The [`RetrieverActor`] and the [`KnowledgeHandle`] callers use.
//!
//! The actor owns the collections: it applies `[knowledge]` (creating collections in the
//! store, publishing one search tool per collection) and starts every ingestion and
//! deletion, one at a time per collection, in a task of its own so that its mailbox never
//! waits on a model or a store. Searches do not go through it: the tools query the store
//! straight away.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
};

use arc_swap::ArcSwap;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::{Map, Value, json};
use sha2::{Digest as _, Sha256};
use toolmesh_core::{
    ErrorCode, Health, SourceKind, StoreError, ToolSource, VectorStore, VectorStores,
    vector::{CollectionSpec, Condition, Filter, Point, PointId, Precision, Query, Scalar},
};
use toolmesh_embed::Embedder;
use toolmesh_registry::{RegistryHandle, SourceUpdate, ToolEntry};
use toolmesh_search::{lexical, terms};
use tracing::{Instrument, info, info_span, warn};

use crate::{
    KnowledgeConfig,
    chunk::{Chunk, chunks},
    config::CollectionConfig,
    tool::SearchTool,
};

/// Texts embedded per batch.
const EMBED_BATCH: usize = 16;
/// The length chunk texts are normalised by for BM25, in terms.
const AVERAGE_CHUNK_TERMS: f32 = 60.0;
/// The payload fields of a chunk.
pub(crate) const DOC_ID: &str = "doc_id";
pub(crate) const POSITION: &str = "chunk";
pub(crate) const TEXT: &str = "text";
pub(crate) const METADATA: &str = "metadata";
/// The longest document id, in bytes.
const MAX_ID_BYTES: usize = 512;

/// A document to ingest.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// Its id in the collection; ingesting an id again replaces the document.
    pub id: String,
    /// Its text.
    pub text: String,
    /// Whether the text is Markdown (chunked along its structure).
    pub markdown: bool,
    /// What the caller wants returned with its passages and filters on.
    pub metadata: Map<String, Value>,
}

/// What became of one document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentResult {
    /// The document's id.
    pub id: String,
    /// Its chunks now in the collection; 0 when it failed.
    pub chunks: usize,
    /// Why it failed; `None` when it is in.
    pub error: Option<String>,
}

/// A collection as `ListCollections` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectionInfo {
    /// The collection's name.
    pub name: String,
    /// What it holds.
    pub description: String,
    /// The tool that searches it.
    pub tool: String,
    /// Documents in it.
    pub documents: u64,
    /// Chunks in it.
    pub chunks: u64,
    /// The store it is in.
    pub store: String,
    /// Why the counts could not be read; `None` when they were.
    pub error: Option<String>,
}

/// One passage a search found.
#[derive(Debug, Clone, PartialEq)]
pub struct Passage {
    /// The document it is from.
    pub document_id: String,
    /// Its position among the document's chunks.
    pub chunk: u64,
    /// Its score; higher is better (a fused rank score).
    pub score: f32,
    /// The passage.
    pub text: String,
    /// The document's metadata.
    pub metadata: Map<String, Value>,
}

/// Why a knowledge request failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KnowledgeError {
    /// No such collection.
    #[error("no knowledge collection {name:?} (collections: {known})")]
    NoCollection {
        /// The name asked for.
        name: String,
        /// The collections there are.
        known: String,
    },
    /// The request is wrong.
    #[error("{0}")]
    Invalid(String),
    /// The store failed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The embedding model failed.
    #[error("embedding failed: {0}")]
    Embedding(String),
    /// The retriever is gone (shutting down).
    #[error("the retriever is not running: {0}")]
    Gone(String),
}

impl KnowledgeError {
    /// Returns the failure kind for callers.
    pub fn code(&self) -> ErrorCode {
        match self {
            KnowledgeError::NoCollection { .. } => ErrorCode::NotFound,
            KnowledgeError::Invalid(_) => ErrorCode::InvalidArgument,
            KnowledgeError::Store(error) => error.code(),
            KnowledgeError::Embedding(_) => ErrorCode::Internal,
            KnowledgeError::Gone(_) => ErrorCode::Unavailable,
        }
    }
}

/// A configured collection.
#[derive(Debug)]
pub(crate) struct Collection {
    pub(crate) config: CollectionConfig,
    /// Its name in the store.
    pub(crate) stored: String,
    /// The store it is in (`store` of its config).
    pub(crate) store: Arc<dyn VectorStore>,
    /// Held while a write to it runs: one ingestion or deletion at a time.
    writing: tokio::sync::Mutex<()>,
}

/// What the actor and the handle share.
pub(crate) struct Shared {
    /// The stores a collection may be in.
    pub(crate) stores: VectorStores,
    pub(crate) embedder: Option<Arc<dyn Embedder>>,
    pub(crate) collections: ArcSwap<BTreeMap<String, Arc<Collection>>>,
    pub(crate) max_document_bytes: std::sync::atomic::AtomicUsize,
    /// The role that ingests and deletes (`writer_role`).
    pub(crate) writer_role: ArcSwap<String>,
    /// Collections the store could not make, with the reason.
    pub(crate) failed: Mutex<BTreeMap<String, String>>,
    pub(crate) changed: tokio::sync::Notify,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("stores", &self.stores.names()).finish_non_exhaustive()
    }
}

/// How callers ingest, delete, list and search; cheap to clone.
#[derive(Debug, Clone)]
pub struct KnowledgeHandle {
    pub(crate) shared: Arc<Shared>,
    /// The retriever now: a supervisor replaces it after a failure.
    actor: Arc<ArcSwap<ActorRef<RetrieverMsg>>>,
    registry: RegistryHandle,
}

/// Messages of the [`RetrieverActor`].
#[derive(Debug)]
pub enum RetrieverMsg {
    /// Apply `[knowledge]`: make the collections, publish their tools.
    Apply(KnowledgeConfig, RpcReplyPort<Result<(), KnowledgeError>>),
    /// Ingest documents into a collection, under the span given (the caller's
    /// `knowledge.ingest`).
    Ingest(
        String,
        Vec<Document>,
        tracing::Span,
        RpcReplyPort<Result<Vec<DocumentResult>, KnowledgeError>>,
    ),
    /// Delete documents of a collection by id; replies how many chunks went and the ids
    /// that were not there.
    Delete(String, Vec<String>, RpcReplyPort<Result<(u64, Vec<String>), KnowledgeError>>),
}

/// Owns the knowledge collections; see the module.
pub struct RetrieverActor {
    shared: Arc<Shared>,
    registry: RegistryHandle,
}

impl KnowledgeHandle {
    /// Returns the role that ingests and deletes documents when callers authenticate.
    pub fn writer_role(&self) -> Arc<String> {
        self.shared.writer_role.load_full()
    }

    /// Starts the retriever over `stores` (each collection in the one its config chooses),
    /// publishing tools into `registry`.
    pub async fn start(
        stores: VectorStores,
        embedder: Option<Arc<dyn Embedder>>,
        registry: RegistryHandle,
    ) -> Result<KnowledgeHandle, ractor::SpawnErr> {
        let shared = Arc::new(Shared {
            stores,
            embedder,
            collections: ArcSwap::default(),
            max_document_bytes: KnowledgeConfig::MAX_DOCUMENT_BYTES.into(),
            writer_role: ArcSwap::from_pointee(KnowledgeConfig::WRITER_ROLE.to_owned()),
            failed: Mutex::default(),
            changed: tokio::sync::Notify::new(),
        });
        let retriever = RetrieverActor { shared: shared.clone(), registry: registry.clone() };
        let (actor, _) = Actor::spawn(None, retriever, ()).await?;
        Ok(KnowledgeHandle { shared, actor: Arc::new(ArcSwap::from_pointee(actor)), registry })
    }

    /// Returns the retriever's actor, for a supervisor to link.
    pub fn actor(&self) -> ractor::ActorCell {
        self.actor.load().get_cell()
    }

    /// Starts a fresh retriever under `supervisor` after the old one failed. The
    /// collections, their tools and the store's data live on in the shared state: the new
    /// actor takes the next ingestion, deletion or reload; a call the old one was answering
    /// got an error naming its end.
    pub async fn respawn(
        &self,
        supervisor: ractor::ActorCell,
    ) -> Result<ractor::ActorCell, ractor::SpawnErr> {
        let retriever =
            RetrieverActor { shared: self.shared.clone(), registry: self.registry.clone() };
        let (actor, _) = Actor::spawn_linked(None, retriever, (), supervisor).await?;
        self.actor.store(Arc::new(actor.clone()));
        Ok(actor.get_cell())
    }

    async fn ask<T>(
        &self,
        message: impl FnOnce(RpcReplyPort<Result<T, KnowledgeError>>) -> RetrieverMsg,
    ) -> Result<T, KnowledgeError>
    where
        T: Send + 'static,
    {
        match self.actor.load().call(message, None).await {
            Ok(ractor::rpc::CallResult::Success(result)) => result,
            Ok(ractor::rpc::CallResult::Timeout) => Err(KnowledgeError::Gone("timed out".into())),
            Ok(ractor::rpc::CallResult::SenderError) => {
                Err(KnowledgeError::Gone("the retriever dropped the request".into()))
            }
            Err(error) => Err(KnowledgeError::Gone(error.to_string())),
        }
    }

    /// Applies `[knowledge]`.
    pub async fn apply(&self, config: KnowledgeConfig) -> Result<(), KnowledgeError> {
        self.ask(|reply| RetrieverMsg::Apply(config, reply)).await
    }

    /// Ingests `documents` into `collection`: each is chunked, embedded and stored,
    /// replacing the document of the same id whole. Each gets its result.
    pub async fn ingest(
        &self,
        collection: &str,
        documents: Vec<Document>,
    ) -> Result<Vec<DocumentResult>, KnowledgeError> {
        // Made here, in the caller's trace: the actor runs the ingestion under it.
        let span = info_span!(
            "knowledge.ingest",
            knowledge.collection = %collection,
            knowledge.documents = documents.len() as i64
        );
        let collection = collection.to_owned();
        self.ask(|reply| RetrieverMsg::Ingest(collection, documents, span, reply)).await
    }

    /// Deletes documents by id; returns how many chunks went and the ids not found.
    pub async fn delete(
        &self,
        collection: &str,
        ids: Vec<String>,
    ) -> Result<(u64, Vec<String>), KnowledgeError> {
        let collection = collection.to_owned();
        self.ask(|reply| RetrieverMsg::Delete(collection, ids, reply)).await
    }

    /// Returns the collections with their document and chunk counts; a collection whose
    /// store does not answer is listed with the reason.
    pub async fn collections(&self) -> Vec<CollectionInfo> {
        let collections = self.shared.collections.load_full();
        let mut infos = Vec::with_capacity(collections.len());
        for collection in collections.values() {
            let store = &collection.store;
            // One store that does not answer fails its collections' counts, not the list.
            let counts = match store.count(&collection.stored, None).await {
                Ok(0) | Err(StoreError::NoCollection { .. }) => Ok((0, 0)),
                Ok(chunks) => store
                    .distinct(&collection.stored, DOC_ID, usize::MAX >> 1)
                    .await
                    .map(|documents| (documents, chunks)),
                Err(error) => Err(error),
            };
            let ((documents, chunks), error) = match counts {
                Ok(counts) => (counts, None),
                Err(error) => ((0, 0), Some(error.to_string())),
            };
            infos.push(CollectionInfo {
                name: collection.config.name.clone(),
                description: collection.config.description.clone(),
                tool: collection.config.tool_name(),
                documents,
                chunks,
                store: store.describe(),
                error,
            });
        }
        infos
    }

    /// Returns the best `top_k` passages of `collection` for `query` whose metadata
    /// matches `filter`, as its search tool does.
    pub async fn search(
        &self,
        collection: &str,
        query: &str,
        top_k: usize,
        filter: &Map<String, Value>,
    ) -> Result<Vec<Passage>, KnowledgeError> {
        self.shared.search(collection, query, top_k, filter).await
    }

    /// Returns the health of each collection: down while the store cannot make it.
    pub fn health(&self) -> Vec<(String, Health)> {
        let failed = self.shared.failed.lock().unwrap_or_else(PoisonError::into_inner).clone();
        self.shared
            .collections
            .load()
            .keys()
            .map(|name| match failed.get(name) {
                Some(reason) => (name.clone(), Health::down(reason.clone())),
                None => (name.clone(), Health::up()),
            })
            .collect()
    }

    /// Stops the retriever.
    pub async fn stop(&self) {
        let _ = self
            .actor
            .load()
            .stop_and_wait(Some("shutdown".into()), Some(std::time::Duration::from_secs(5)))
            .await;
    }
}

impl Shared {
    /// Returns the best `top_k` passages of `collection` for `query` among those whose
    /// metadata matches `filter` (field → value, or → any of several values).
    pub(crate) async fn search(
        &self,
        collection: &str,
        query: &str,
        top_k: usize,
        filter: &Map<String, Value>,
    ) -> Result<Vec<Passage>, KnowledgeError> {
        let collection = self.collection(collection)?;
        let span = info_span!(
            "knowledge.query",
            knowledge.collection = %collection.config.name,
            knowledge.top_k = top_k as i64,
            knowledge.hits = tracing::field::Empty,
        );
        let found = async {
            if query.trim().is_empty() {
                return Err(KnowledgeError::Invalid("the query is empty".into()));
            }
            let filter = metadata_filter(&collection.config, filter)?;
            let dense = match self.embedder.clone() {
                Some(embedder) => {
                    let text = query.to_owned();
                    let vector = tokio::task::spawn_blocking(move || embedder.embed_query(&text))
                        .instrument(info_span!("knowledge.embed", knowledge.texts = 1_i64))
                        .await
                        .map_err(|e| KnowledgeError::Embedding(e.to_string()))?
                        .map_err(|e| KnowledgeError::Embedding(e.to_string()))?;
                    Some(vector)
                }
                None => None,
            };
            let lexical = Some(lexical::query(&terms(query))).filter(|l| !l.is_empty());
            let request = Query {
                dense,
                lexical,
                filter,
                limit: top_k,
                candidates: (4 * top_k).max(50),
                rrf_k: 0,
                payload: true,
            };
            let hits = match collection.store.query(&collection.stored, request).await {
                Ok(hits) => hits,
                Err(StoreError::NoCollection { .. }) => Vec::new(),
                Err(error) => return Err(error.into()),
            };
            Ok(hits
                .into_iter()
                .map(|hit| {
                    let mut payload = hit.payload;
                    let text = |v: Option<Value>| match v {
                        Some(Value::String(s)) => s,
                        _ => String::new(),
                    };
                    Passage {
                        document_id: text(payload.remove(DOC_ID)),
                        chunk: payload.remove(POSITION).and_then(|v| v.as_u64()).unwrap_or(0),
                        score: hit.score,
                        text: text(payload.remove(TEXT)),
                        metadata: match payload.remove(METADATA) {
                            Some(Value::Object(map)) => map,
                            _ => Map::new(),
                        },
                    }
                })
                .collect::<Vec<_>>())
        }
        .instrument(span.clone())
        .await?;
        span.record("knowledge.hits", found.len() as i64);
        Ok(found)
    }

    pub(crate) fn collection(&self, name: &str) -> Result<Arc<Collection>, KnowledgeError> {
        let collections = self.collections.load();
        collections.get(name).cloned().ok_or_else(|| KnowledgeError::NoCollection {
            name: name.to_owned(),
            known: if collections.is_empty() {
                "none configured".into()
            } else {
                collections.keys().cloned().collect::<Vec<_>>().join(", ")
            },
        })
    }
}

/// The store filter of a search's metadata filter; only the collection's `filter_fields`
/// may be named.
fn metadata_filter(
    config: &CollectionConfig,
    filter: &Map<String, Value>,
) -> Result<Option<Filter>, KnowledgeError> {
    let mut must = Vec::new();
    for (field, value) in filter {
        if !config.filter_fields.contains(field) {
            return Err(KnowledgeError::Invalid(format!(
                "collection {:?} cannot be filtered on {field:?} (filterable fields: {})",
                config.name,
                if config.filter_fields.is_empty() {
                    "none; list them in filter_fields".to_owned()
                } else {
                    config.filter_fields.join(", ")
                }
            )));
        }
        let key = format!("{METADATA}.{field}");
        let scalar = |v: &Value| {
            Scalar::from_json(v).ok_or_else(|| {
                KnowledgeError::Invalid(format!(
                    "filter {field:?}: a string, an integer or a boolean, or a list of them"
                ))
            })
        };
        must.push(match value {
            Value::Array(values) => {
                Condition::In(key, values.iter().map(scalar).collect::<Result<_, _>>()?)
            }
            value => Condition::Is(key, scalar(value)?),
        });
    }
    Ok((!must.is_empty()).then_some(Filter { must, must_not: Vec::new() }))
}

/// Says that no store is named `name`, naming those there are.
pub fn unknown_store(name: &str, known: &[&str]) -> String {
    format!("no vector store {name:?} (stores: {}); add [vector.stores.{name}]", known.join(", "))
}

/// The name of a collection in the store: per embedding model, so that vectors of two
/// models never mix.
fn stored_name(collection: &str, embedder: Option<&dyn Embedder>) -> String {
    let model: String = embedder
        .map_or("bm25", |e| e.model_id())
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' })
        .collect();
    format!("toolmesh-knowledge-{collection}-{model}")
}

/// The point id of a document's chunk.
fn chunk_id(document: &str, position: usize) -> PointId {
    let digest = Sha256::new()
        .chain_update(document.as_bytes())
        .chain_update([0])
        .chain_update((position as u64).to_le_bytes())
        .finalize();
    let mut bytes = [0; 8];
    bytes.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(bytes)
}

/// Checks a document before any work: an id, text that is text, within the size limit.
fn check(document: &Document, max_bytes: usize) -> Result<(), String> {
    if document.id.is_empty() || document.id.len() > MAX_ID_BYTES {
        return Err(format!("a document id has 1 to {MAX_ID_BYTES} bytes"));
    }
    if document.text.len() > max_bytes {
        return Err(format!(
            "the document is {} bytes; at most {max_bytes} are accepted (knowledge.max_document_bytes)",
            document.text.len()
        ));
    }
    if document.text.contains('\0') {
        return Err("the document is not text (it holds NUL bytes)".into());
    }
    if document.text.trim().is_empty() {
        return Err("the document is empty".into());
    }
    Ok(())
}

impl RetrieverActor {
    async fn apply(&self, config: KnowledgeConfig) -> Result<(), KnowledgeError> {
        config
            .validate()
            .map_err(|(key, reason)| KnowledgeError::Invalid(format!("{key}: {reason}")))?;
        self.shared
            .max_document_bytes
            .store(config.max_document_bytes, std::sync::atomic::Ordering::Release);
        self.shared.writer_role.store(Arc::new(config.writer_role.clone()));
        let embedder = self.shared.embedder.as_deref();
        let old = self.shared.collections.load_full();
        let mut next = BTreeMap::new();
        let mut failed = BTreeMap::new();
        for (i, collection) in config.collections.into_iter().enumerate() {
            let stored = stored_name(&collection.name, embedder);
            let spec = CollectionSpec {
                name: stored.clone(),
                dense_size: embedder.map(|e| e.dimensions()),
                // Full precision: the knowledge benchmark's figures were measured so, with
                // room to spare on latency (a corpus past 20 MB of vectors is searched
                // through its HNSW graph, not scanned).
                precision: Precision::Full,
                lexical: true,
                keyword_fields: std::iter::once(DOC_ID.to_owned())
                    .chain(collection.filter_fields.iter().map(|f| format!("{METADATA}.{f}")))
                    .collect(),
            };
            let store = self.shared.stores.get(collection.store.as_deref()).ok_or_else(|| {
                let name = collection.store.as_deref().unwrap_or_default();
                KnowledgeError::Invalid(format!(
                    "knowledge.collections[{i}].store: {}",
                    unknown_store(name, &self.shared.stores.names())
                ))
            })?;
            if let Err(error) = store.ensure(&spec).await {
                warn!(collection = %collection.name, %error, "cannot make a knowledge collection");
                failed.insert(collection.name.clone(), error.to_string());
            }
            let entry = match old.get(&collection.name) {
                // An unchanged collection keeps its write lock (an ingestion may be running).
                Some(existing) if existing.config == collection => existing.clone(),
                _ => Arc::new(Collection {
                    stored,
                    store: store.clone(),
                    config: collection.clone(),
                    writing: tokio::sync::Mutex::new(()),
                }),
            };
            next.insert(collection.name.clone(), entry);
        }
        // Searches find the collections before their tools are published.
        let next = Arc::new(next);
        self.shared.collections.store(next.clone());
        *self.shared.failed.lock().unwrap_or_else(PoisonError::into_inner) = failed;
        // One tool per collection; collections that went take their tool with them.
        for (name, collection) in next.iter() {
            let spec = SearchTool::spec(&collection.config);
            let backend = Arc::new(SearchTool::new(self.shared.clone(), name.clone()));
            let entry = ToolEntry::new(spec, backend)
                .map_err(|e| KnowledgeError::Invalid(format!("collection {name:?}: {e}")))?;
            self.publish(name, vec![entry]).await?;
        }
        for name in old.keys().filter(|name| !next.contains_key(*name)) {
            self.publish(name, Vec::new()).await?;
        }
        info!(collections = next.len(), "knowledge collections applied");
        self.shared.changed.notify_one();
        Ok(())
    }

    async fn publish(&self, collection: &str, tools: Vec<ToolEntry>) -> Result<(), KnowledgeError> {
        let source = ToolSource { kind: SourceKind::Knowledge, name: collection.to_owned() };
        self.registry
            .replace_source(SourceUpdate {
                source,
                tools,
                toolkits: Vec::new(),
                unchanged: Vec::new(),
            })
            .await
            .map_err(|e| KnowledgeError::Invalid(format!("collection {collection:?}: {e}")))
    }
}

/// Ingests `documents` into `collection`; see [`KnowledgeHandle::ingest`].
async fn ingest(
    shared: Arc<Shared>,
    collection: Arc<Collection>,
    documents: Vec<Document>,
) -> Result<Vec<DocumentResult>, KnowledgeError> {
    let _writing = collection.writing.lock().await;
    let max_bytes = shared.max_document_bytes.load(std::sync::atomic::Ordering::Acquire);
    let config = collection.config.clone();
    let mut results: Vec<DocumentResult> = Vec::with_capacity(documents.len());
    // Chunking is CPU work (token counts): on a blocking thread.
    let embedder = shared.embedder.clone();
    let chunked = tokio::task::spawn_blocking(move || {
        let mut seen = HashSet::new();
        documents
            .into_iter()
            .map(|document| {
                if !seen.insert(document.id.clone()) {
                    return (document, Err("the document id is given twice in one batch".into()));
                }
                let chunked = check(&document, max_bytes).and_then(|()| {
                    chunks(
                        &document.text,
                        document.markdown,
                        (config.chunk_tokens, config.chunk_bytes),
                        config.chunk_overlap,
                        embedder.as_deref(),
                    )
                });
                (document, chunked)
            })
            .collect::<Vec<(Document, Result<Vec<Chunk>, String>)>>()
    })
    .instrument(info_span!("knowledge.chunk"))
    .await
    .map_err(|e| KnowledgeError::Embedding(e.to_string()))?;

    // Embed every chunk of the batch, a model batch at a time, off the runtime.
    let texts: Vec<String> = chunked
        .iter()
        .filter_map(|(_, c)| c.as_ref().ok())
        .flatten()
        .map(|c| c.indexed.clone())
        .collect();
    let vectors = match shared.embedder.clone() {
        None => Ok(vec![None; texts.len()]),
        Some(embedder) => {
            let count = texts.len();
            tokio::task::spawn_blocking(move || {
                let mut vectors = Vec::with_capacity(texts.len());
                for batch in texts.chunks(EMBED_BATCH) {
                    let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
                    vectors.extend(
                        embedder.embed(&refs).map_err(|e| e.to_string())?.into_iter().map(Some),
                    );
                }
                Ok::<_, String>(vectors)
            })
            .instrument(info_span!("knowledge.embed", knowledge.texts = count as i64))
            .await
            .map_err(|e| KnowledgeError::Embedding(e.to_string()))?
        }
    };
    let mut vectors = match vectors {
        Ok(vectors) => vectors.into_iter(),
        Err(reason) => {
            // The model failed: no document of the batch is in, each says why.
            return Ok(chunked
                .into_iter()
                .map(|(document, chunked)| DocumentResult {
                    id: document.id,
                    chunks: 0,
                    error: Some(match chunked {
                        Err(reason) => reason,
                        Ok(_) => format!("embedding failed: {reason}"),
                    }),
                })
                .collect());
        }
    };

    let upsert = info_span!("knowledge.upsert", knowledge.collection = %config.name, knowledge.documents = chunked.len() as i64);
    // Every document's replacement is handed to the store at once: the store makes writes
    // waiting together durable with one sync of its journal.
    let (store, stored) = (&collection.store, &collection.stored);
    let writes: Vec<_> = chunked
        .into_iter()
        .map(|(document, chunked)| {
            let points = chunked.map(|chunks| {
                chunks
                    .iter()
                    .map(|chunk| {
                        let mut payload = Map::new();
                        payload.insert(DOC_ID.into(), json!(document.id));
                        payload.insert(POSITION.into(), json!(chunk.position));
                        payload.insert(TEXT.into(), json!(chunk.text));
                        payload.insert(METADATA.into(), Value::Object(document.metadata.clone()));
                        Point {
                            id: chunk_id(&document.id, chunk.position),
                            dense: vectors.next().flatten(),
                            lexical: Some(lexical::document(
                                &terms(&chunk.indexed),
                                AVERAGE_CHUNK_TERMS,
                            )),
                            payload,
                        }
                    })
                    .collect::<Vec<Point>>()
            });
            async move {
                let points = match points {
                    Ok(points) => points,
                    Err(reason) => {
                        return (
                            DocumentResult { id: document.id, chunks: 0, error: Some(reason) },
                            None,
                        );
                    }
                };
                let count = points.len();
                // The document's old chunks go and its new ones come in one step.
                let old = Filter::is(DOC_ID, Scalar::Str(document.id.clone()));
                match store.replace(stored, old, points).await {
                    Ok(()) => {
                        (DocumentResult { id: document.id, chunks: count, error: None }, None)
                    }
                    Err(error) => {
                        // A full disk fails the whole ingestion, not a document.
                        let full = matches!(error, StoreError::Full { .. }).then(|| error.clone());
                        let reason = Some(error.to_string());
                        (DocumentResult { id: document.id, chunks: 0, error: reason }, full)
                    }
                }
            }
        })
        .collect();
    for (result, full) in futures::future::join_all(writes).instrument(upsert).await {
        if let Some(full) = full {
            return Err(KnowledgeError::Store(full));
        }
        results.push(result);
    }
    Ok(results)
}

/// Deletes documents by id; see [`KnowledgeHandle::delete`].
async fn delete(
    collection: Arc<Collection>,
    ids: Vec<String>,
) -> Result<(u64, Vec<String>), KnowledgeError> {
    let _writing = collection.writing.lock().await;
    let store = &collection.store;
    let mut deleted = 0;
    let mut missing = Vec::new();
    for id in ids {
        let filter = Filter::is(DOC_ID, Scalar::Str(id.clone()));
        let chunks = match store.count(&collection.stored, Some(filter.clone())).await {
            Err(StoreError::NoCollection { .. }) => 0,
            other => other?,
        };
        if chunks == 0 {
            missing.push(id);
            continue;
        }
        store.replace(&collection.stored, filter, Vec::new()).await?;
        deleted += chunks;
    }
    Ok((deleted, missing))
}

/// The [`RetrieverActor`]'s state.
#[derive(Debug, Default)]
pub struct RetrieverState;

impl Actor for RetrieverActor {
    type Msg = RetrieverMsg;
    type State = RetrieverState;
    type Arguments = ();

    async fn pre_start(
        &self,
        _: ActorRef<RetrieverMsg>,
        _: (),
    ) -> Result<RetrieverState, ActorProcessingErr> {
        Ok(RetrieverState)
    }

    async fn handle(
        &self,
        _: ActorRef<RetrieverMsg>,
        message: RetrieverMsg,
        _: &mut RetrieverState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            RetrieverMsg::Apply(config, reply) => {
                let _ = reply.send(self.apply(config).await);
            }
            RetrieverMsg::Ingest(name, documents, span, reply) => {
                match self.shared.collection(&name) {
                    Err(error) => {
                        let _ = reply.send(Err(error));
                    }
                    Ok(collection) => {
                        let shared = self.shared.clone();
                        tokio::spawn(
                            async move {
                                let _ = reply.send(ingest(shared, collection, documents).await);
                            }
                            .instrument(span),
                        );
                    }
                }
            }
            RetrieverMsg::Delete(name, ids, reply) => match self.shared.collection(&name) {
                Err(error) => {
                    let _ = reply.send(Err(error));
                }
                Ok(collection) => {
                    tokio::spawn(async move {
                        let _ = reply.send(delete(collection, ids).await);
                    });
                }
            },
        }
        Ok(())
    }
}

impl std::fmt::Debug for RetrieverActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetrieverActor").finish_non_exhaustive()
    }
}
