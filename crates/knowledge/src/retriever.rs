//! The [`RetrieverActor`] and the [`KnowledgeHandle`] callers use.
//!
//! The actor owns the collections: it applies `[knowledge]` (creating collections in the
//! store, publishing one search tool per collection) and starts every ingestion and
//! deletion, one at a time per collection, in a task of its own so that its mailbox never
//! waits on a model or a store. Searches do not go through it: the tools query the store
//! straight away.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Arc, PoisonError},
};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::{Map, Value, json};
use sha2::{Digest as _, Sha256};
use toolmesh_core::{
    SourceKind, StoreError, ToolSource,
    vector::{CollectionSpec, Filter, Point, PointId, Precision, Scalar},
};
use toolmesh_embed::{
    Embedder,
    lexical::{self, terms},
};
use toolmesh_registry::{RegistryHandle, SourceUpdate, ToolEntry};
use tracing::{Instrument, info, info_span, warn};

use crate::{
    Document, DocumentResult, KnowledgeConfig, KnowledgeError,
    chunk::{Chunk, chunks},
    document::check,
    shared::{Collection, DOC_ID, METADATA, POSITION, Shared, TEXT},
    tool::SearchTool,
    unknown_store,
};

/// Texts embedded per batch.
const EMBED_BATCH: usize = 16;
/// The length chunk texts are normalised by for BM25, in terms.
const AVERAGE_CHUNK_TERMS: f32 = 60.0;

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
    pub(crate) shared: Arc<Shared>,
    pub(crate) registry: RegistryHandle,
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
                toolkit: None,
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
