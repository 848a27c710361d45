//! `toolmesh.v1.KnowledgeService`: ingestion, deletion and the list of knowledge
//! collections, over the [`KnowledgeHandle`].

use std::sync::Arc;

use serde_json::Value;
use tonic::{Request, Response, Status, Streaming};
use toolmesh_core::Principal;
use toolmesh_knowledge::{Document, DocumentResult, KnowledgeError, KnowledgeHandle};
use toolmesh_proto::v1::{
    CollectionInfo, DeleteRequest, DeleteResponse, DocumentFormat, IngestRequest, IngestResponse,
    ListCollectionsRequest, ListCollectionsResponse, knowledge_service_server::KnowledgeService,
};
use toolmesh_router::{Hidden, Router};
use tracing::Instrument;

/// The knowledge API.
#[derive(Debug, Clone)]
pub(crate) struct KnowledgeServiceImpl {
    knowledge: KnowledgeHandle,
    /// The catalog and the policy: which collections' tools a principal may see.
    router: Router,
}

impl KnowledgeServiceImpl {
    pub(crate) fn new(knowledge: KnowledgeHandle, router: Router) -> Self {
        KnowledgeServiceImpl { knowledge, router }
    }
}

fn status(error: KnowledgeError) -> Status {
    Status::new(toolmesh_proto::status_code(error.code()), error.to_string())
}

/// The document of a message, or why it cannot be one.
/// Failed documents an ingestion's answer names; `failed` counts them all.
const LISTED_FAILURES: usize = 100;

fn document(message: toolmesh_proto::v1::Document) -> Result<Document, DocumentResult> {
    let failed = |id: &str, reason: String| DocumentResult {
        id: id.to_owned(),
        chunks: 0,
        error: Some(reason),
    };
    let metadata = match message.metadata_json.trim() {
        "" => serde_json::Map::new(),
        json => match serde_json::from_str::<Value>(json) {
            Ok(Value::Object(map)) => map,
            Ok(_) => return Err(failed(&message.id, "metadata_json is not a JSON object".into())),
            Err(error) => return Err(failed(&message.id, format!("metadata_json: {error}"))),
        },
    };
    let markdown = message.format() == DocumentFormat::Markdown;
    Ok(Document { id: message.id, text: message.text, markdown, metadata })
}

#[tonic::async_trait]
impl KnowledgeService for KnowledgeServiceImpl {
    async fn ingest(
        &self,
        request: Request<Streaming<IngestRequest>>,
    ) -> Result<Response<IngestResponse>, Status> {
        let span = rpc_span("Ingest", &request);
        self.serve_ingest(request).instrument(span).await
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let span = rpc_span("Delete", &request);
        self.serve_delete(request).instrument(span).await
    }

    async fn list_collections(
        &self,
        request: Request<ListCollectionsRequest>,
    ) -> Result<Response<ListCollectionsResponse>, Status> {
        let span = rpc_span("ListCollections", &request);
        self.serve_list_collections(request).instrument(span).await
    }
}

/// The server span of one RPC, child of the caller's `traceparent` when it sent one.
fn rpc_span<T>(method: &'static str, request: &Request<T>) -> tracing::Span {
    toolmesh_telemetry::rpc_server_span(SERVICE, method, request.metadata())
}

/// The service's fully qualified name.
const SERVICE: &str = "toolmesh.v1.KnowledgeService";

impl KnowledgeServiceImpl {
    /// Returns whether `principal` may write: with `[auth]`, Ingest and Delete need
    /// `[knowledge] writer_role`; without it, every caller is the open principal.
    fn writes(&self, principal: &Arc<Principal>) -> bool {
        toolmesh_core::is_open(principal) || principal.has_role(&self.knowledge.writer_role())
    }

    /// Refuses a request whose principal may not write ([`Self::writes`]).
    fn may_write<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let principal = super::principal(request)?;
        if self.writes(&principal) {
            return Ok(());
        }
        let role = self.knowledge.writer_role();
        Err(Status::permission_denied(format!(
            "principal {:?} may not ingest or delete documents: that needs the role {role:?} \
             ([knowledge] writer_role)",
            principal.name
        )))
    }

    async fn serve_ingest(
        &self,
        request: Request<Streaming<IngestRequest>>,
    ) -> Result<Response<IngestResponse>, Status> {
        self.may_write(&request)?;
        let mut stream = request.into_inner();
        let mut collection: Option<String> = None;
        // Counts, and the first failures: an answer that named every document would grow
        // past what clients read with a long stream.
        let (mut stored, mut chunks, mut failed) = (0u64, 0u64, 0u64);
        let mut failures: Vec<DocumentResult> = Vec::new();
        let mut tally = |result: DocumentResult| match result.error {
            None => {
                stored += 1;
                chunks += result.chunks as u64;
            }
            Some(_) => {
                failed += 1;
                if failures.len() < LISTED_FAILURES {
                    failures.push(result);
                }
            }
        };
        while let Some(message) = stream.message().await? {
            let name = match (&collection, message.collection.as_str()) {
                (None, "") => {
                    return Err(Status::invalid_argument(
                        "the first message of an ingestion names the collection",
                    ));
                }
                (None, name) => collection.insert(name.to_owned()).clone(),
                (Some(first), name) if name.is_empty() || name == first => first.clone(),
                (Some(first), name) => {
                    return Err(Status::invalid_argument(format!(
                        "one ingestion is into one collection: {first:?}, then {name:?}"
                    )));
                }
            };
            // Documents that cannot be read keep their place in the results.
            let mut order: Vec<Result<(), DocumentResult>> = Vec::new();
            let mut documents = Vec::new();
            for message in message.documents {
                match document(message) {
                    Ok(document) => {
                        documents.push(document);
                        order.push(Ok(()));
                    }
                    Err(result) => order.push(Err(result)),
                }
            }
            let mut ingested = if documents.is_empty() {
                Vec::new().into_iter()
            } else {
                match self.knowledge.ingest(&name, documents).await {
                    Ok(ingested) => ingested.into_iter(),
                    Err(error) => {
                        // Say what of this stream is in, so the caller knows where to resume.
                        let refused = status(error);
                        return Err(Status::new(
                            refused.code(),
                            format!(
                                "{}; {stored} documents of this stream were stored before",
                                refused.message()
                            ),
                        ));
                    }
                }
            };
            for slot in order {
                match slot {
                    Ok(()) => ingested.next().into_iter().for_each(&mut tally),
                    Err(result) => tally(result),
                }
            }
        }
        if collection.is_none() {
            return Err(Status::invalid_argument("an ingestion needs at least one message"));
        }
        Ok(Response::new(IngestResponse {
            ingested: stored,
            chunks,
            failed,
            results: failures
                .into_iter()
                .map(|r| toolmesh_proto::v1::DocumentResult {
                    id: r.id,
                    chunks: r.chunks as u32,
                    error: r.error.unwrap_or_default(),
                })
                .collect(),
        }))
    }

    async fn serve_delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        self.may_write(&request)?;
        let request = request.into_inner();
        let (deleted_chunks, not_found) = self
            .knowledge
            .delete(&request.collection, request.document_ids)
            .await
            .map_err(status)?;
        Ok(Response::new(DeleteResponse { deleted_chunks, not_found }))
    }

    async fn serve_list_collections(
        &self,
        request: Request<ListCollectionsRequest>,
    ) -> Result<Response<ListCollectionsResponse>, Status> {
        let started = std::time::Instant::now();
        let principal = super::principal(&request)?;
        let mut collections = self.knowledge.collections().await;
        // Under a policy a collection is listed where its tool would be: to the principals
        // that may see the tool. And to the writers, who ingest into it by name.
        let admission = self.router.admission();
        if admission.policy().is_active() && !self.writes(&principal) {
            let scope = admission.scope(principal.clone());
            let catalog = self.router.registry().snapshot();
            let hidden = Hidden::new(principal);
            collections.retain(|c| match catalog.get(&c.tool) {
                Some(tool) => hidden.note(&c.tool, scope.hidden_by(&tool.spec)),
                // A tool not in the catalog cannot be decided: not listed.
                None => false,
            });
            hidden.audit(&admission, "ListCollections", started);
        }
        Ok(Response::new(ListCollectionsResponse {
            collections: collections
                .into_iter()
                .map(|c| CollectionInfo {
                    name: c.name,
                    description: c.description,
                    tool: c.tool,
                    documents: c.documents,
                    chunks: c.chunks,
                    store: c.store,
                    error: c.error.unwrap_or_default(),
                })
                .collect(),
        }))
    }
}
