//! The [`KnowledgeHandle`] callers ingest, delete, list and search through.

use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use ractor::{Actor, ActorRef, RpcReplyPort};
use serde_json::{Map, Value};
use toolmesh_core::{Health, StoreError, VectorStores};
use toolmesh_embed::Embedder;
use toolmesh_registry::RegistryHandle;
use tracing::info_span;

use crate::{
    CollectionInfo, Document, DocumentResult, KnowledgeConfig, KnowledgeError, Passage,
    retriever::{RetrieverActor, RetrieverMsg},
    shared::{DOC_ID, Shared},
};

/// How callers ingest, delete, list and search; cheap to clone.
#[derive(Debug, Clone)]
pub struct KnowledgeHandle {
    pub(crate) shared: Arc<Shared>,
    /// The retriever now: a supervisor replaces it after a failure.
    actor: Arc<ArcSwap<ActorRef<RetrieverMsg>>>,
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

#[async_trait::async_trait]
impl toolmesh_core::Supervised for KnowledgeHandle {
    fn actor(&self) -> ractor::ActorCell {
        KnowledgeHandle::actor(self)
    }

    async fn respawn(
        &self,
        root: ractor::ActorCell,
        _: String,
    ) -> Result<ractor::ActorCell, String> {
        KnowledgeHandle::respawn(self, root).await.map_err(|e| e.to_string())
    }
}
