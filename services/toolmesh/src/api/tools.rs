use std::{collections::HashMap, pin::Pin, sync::Arc};

use futures::{Stream, StreamExt as _};
use prost::Message as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use toolmesh_core::{
    ApprovalAnswer, ElicitationAnswer, ErrorCode, EventSink, HealthBoard, MAX_LISTING_BYTES,
    Nesting, Principal, SamplingAnswer, open_principal,
};
use toolmesh_proto::{
    convert,
    v1::{
        self, CallToolClientMessage, CallToolRequest, CallToolResponse, CallToolServerMessage,
        ListToolsRequest, ListToolsResponse, call_tool_client_message, call_tool_server_message,
        tool_service_server::ToolService,
    },
};
use toolmesh_telemetry::rpc_server_span;
use tracing::{Instrument, Span, debug};

use toolmesh_meta::MetaTools;
use toolmesh_router::{CallRequest, Hidden, Router, RouterError, parse_grpc_timeout};

use super::view::View;

/// Default tools per `ListTools` page.
const DEFAULT_PAGE_SIZE: usize = 100;
/// Largest `ListTools` page.
const MAX_PAGE_SIZE: usize = 1000;
/// Prefix of page tokens: the token names the last tool of the previous page.
const PAGE_TOKEN_PREFIX: &str = "after:";
/// Server messages buffered per stream before the tool's events wait for the client.
const STREAM_BUFFER: usize = 64;
/// Bytes of events buffered per stream before the tool's events wait for the client: 64
/// partial outputs of a megabyte each are not held for a reader that stopped.
const STREAM_BYTES: usize = 4 << 20;

/// A message for the client, with the share of the stream's byte budget it holds until
/// the client's stream takes it.
type Outbound = (Result<CallToolServerMessage, Status>, Option<OwnedSemaphorePermit>);

/// The gRPC `toolmesh.v1.ToolService`.
#[derive(Clone)]
pub struct ToolServiceImpl {
    router: Router,
    meta: MetaTools,
    health: HealthBoard,
    /// The MCP servers whose resources and prompts are served.
    servers: toolmesh_mcp::McpManager,
}

impl std::fmt::Debug for ToolServiceImpl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolServiceImpl").field("router", &self.router).finish_non_exhaustive()
    }
}

impl ToolServiceImpl {
    /// Returns the service over `router`, finding and describing tools with the
    /// meta-tools' search; a tool's source is available as `health` says; the resources
    /// and prompts are those of the MCP servers `servers`.
    pub fn new(
        router: Router,
        meta: MetaTools,
        health: HealthBoard,
        servers: toolmesh_mcp::McpManager,
    ) -> Self {
        ToolServiceImpl { router, meta, health, servers }
    }
}

/// The filters ListTools and SearchTools share.
struct ToolFilter {
    toolkit: String,
    tags: Vec<String>,
    kind: v1::SourceKind,
    source_name: String,
}

impl ToolFilter {
    fn new(toolkit: String, tags: Vec<String>, source_kind: i32, source_name: String) -> Self {
        let kind = v1::SourceKind::try_from(source_kind).unwrap_or(v1::SourceKind::Unspecified);
        ToolFilter { toolkit, tags, kind, source_name }
    }

    fn keeps(&self, spec: &toolmesh_core::ToolSpec) -> bool {
        (self.toolkit.is_empty() || spec.toolkit.as_deref() == Some(self.toolkit.as_str()))
            && self.tags.iter().all(|tag| spec.tags.contains(tag))
            && (self.kind == v1::SourceKind::Unspecified
                || convert::source_kind(spec.source.kind) == self.kind)
            && (self.source_name.is_empty() || spec.source.name == self.source_name)
    }
}

/// The server span of one RPC, child of the caller's `traceparent` when it sent one.
fn rpc_span<T>(method: &'static str, request: &Request<T>) -> Span {
    rpc_server_span(toolmesh_proto::TOOL_SERVICE_NAME, method, request.metadata())
}

fn client_timeout<T>(request: &Request<T>) -> Option<std::time::Duration> {
    request
        .metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
}

/// The principal the front door authenticated the request as; the open principal where no
/// authentication runs (a service served without the front door's layers). A request the
/// front door let through to a public service without a principal is refused.
// The refusal is a `Status`, as every error of a service method.
#[allow(clippy::result_large_err)]
pub fn principal<T>(request: &Request<T>) -> Result<Arc<Principal>, Status> {
    if let Some(principal) = request.extensions().get::<Arc<Principal>>() {
        return Ok(principal.clone());
    }
    if request.extensions().get::<toolmesh_core::NoPrincipal>().is_some() {
        return Err(Status::unauthenticated(
            "this service is public, but a request without a credential has no principal: \
             send a credential, or name one in auth.anonymous",
        ));
    }
    Ok(open_principal())
}

fn call_request(
    message: CallToolRequest,
    client_timeout: Option<std::time::Duration>,
    principal: Arc<Principal>,
    nesting: Option<Nesting>,
) -> CallRequest {
    CallRequest {
        name: message.name,
        arguments_json: message.arguments_json,
        call_id: message.call_id,
        session_id: message.session_id,
        profile: message.profile,
        client_timeout,
        principal,
        nesting,
    }
}

/// The nesting a tool that calls back into toolmesh sends: `x-toolmesh-call-depth` and
/// `x-toolmesh-parent-call-id`; `None` for a caller's own call.
fn nesting<T>(request: &Request<T>) -> Result<Option<Nesting>, Status> {
    let metadata = request.metadata();
    let Some(depth) = metadata.get(Nesting::DEPTH_HEADER) else { return Ok(None) };
    let depth =
        depth.to_str().ok().and_then(|d| d.trim().parse::<u32>().ok()).ok_or_else(|| {
            RouterError::InvalidRequest {
                field: "x-toolmesh-call-depth",
                reason: "must be a whole number, the depth of the calling tool's call plus one"
                    .into(),
            }
            .to_status()
        })?;
    let parent_call_id = metadata
        .get(Nesting::PARENT_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|v| toolmesh_core::clip(v, toolmesh_core::ECHO_CHARS).into_owned())
        .unwrap_or_default();
    Ok(Some(Nesting { depth, parent_call_id }))
}

impl ToolServiceImpl {
    async fn search(
        &self,
        request: v1::SearchToolsRequest,
        principal: Arc<Principal>,
    ) -> Result<Response<v1::SearchToolsResponse>, Status> {
        let top_k = Some(request.top_k as usize).filter(|k| *k > 0);
        let filter = ToolFilter::new(
            request.toolkit,
            request.tags,
            request.source_kind,
            request.source_name,
        );
        let admission = self.router.admission();
        let profile = admission.profile_of(&principal, &request.profile).map_err(|e| status(&e))?;
        let started = std::time::Instant::now();
        let hidden = Arc::new(Hidden::new(principal.clone()));
        let scope = admission.scope(principal);
        let counted = hidden.clone();
        // Policy filters before the ranking is cut to top_k.
        let keep = move |spec: &toolmesh_core::ToolSpec| {
            filter.keeps(spec) && counted.note(&spec.name, scope.hidden_by(spec))
        };
        let found = self
            .meta
            .find(&request.query, top_k, &profile, Box::new(keep))
            .await
            .map_err(|error| status(&error))?;
        hidden.audit(&admission, "SearchTools", started);
        // Best first, while the answer holds them.
        let (mut hits, mut bytes, mut hits_cut) = (Vec::new(), 0, 0);
        for (tool, score) in found.hits {
            let hit = v1::SearchHit {
                tool: Some(convert::tool(&tool.spec, self.health.of(&tool.spec.source))),
                score,
            };
            if hits.is_empty() || bytes + hit.encoded_len() <= MAX_LISTING_BYTES {
                bytes += hit.encoded_len();
                hits.push(hit);
            } else {
                hits_cut += 1;
            }
        }
        // Under a policy the counts of the whole index would say how many tools the caller
        // may not see; counting only those it may see would decide the policy for every
        // tool of the index on each search. `index_complete` tells readiness instead.
        let counted = !admission.policy().is_active();
        Ok(Response::new(v1::SearchToolsResponse {
            hits,
            ranking: found.ranking,
            indexed_tools: if counted { found.indexed } else { 0 },
            embedded_tools: if counted { found.embedded } else { 0 },
            index_version: found.index_version,
            index_complete: found.complete,
            query_bytes_cut: found.query_cut as u64,
            hits_cut,
        }))
    }
}

type ServerStream = Pin<Box<dyn Stream<Item = Result<CallToolServerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl ToolService for ToolServiceImpl {
    async fn list_tools(
        &self,
        request: Request<ListToolsRequest>,
    ) -> Result<Response<ListToolsResponse>, Status> {
        let span = rpc_span("ListTools", &request);
        let _entered = span.enter();
        let principal = principal(&request)?;
        let request = request.into_inner();
        let page_size = match request.page_size as usize {
            0 => DEFAULT_PAGE_SIZE,
            n => n.min(MAX_PAGE_SIZE),
        };
        let after = match request.page_token.as_str() {
            "" => None,
            token => Some(token.strip_prefix(PAGE_TOKEN_PREFIX).ok_or_else(|| {
                RouterError::InvalidRequest {
                    field: "page_token",
                    reason: "not a token from ListTools".into(),
                }
                .to_status()
            })?),
        };
        let view = View::new(&self.router, principal, &request.profile).map_err(|e| status(&e))?;
        let filter = ToolFilter::new(
            request.toolkit,
            request.tags,
            request.source_kind,
            request.source_name,
        );
        let catalog = view.catalog.clone();
        let mut tools = Vec::with_capacity(page_size.min(catalog.len()));
        let mut next_page_token = String::new();
        let mut bytes = 0;
        for (_, entry) in catalog.after(after) {
            let spec = &entry.spec;
            if !(filter.keeps(spec) && view.shows(spec)) {
                continue;
            }
            let full = tools.len() == page_size;
            let mut tool = None;
            if !full {
                let mut converted = convert::tool(spec, self.health.of(&spec.source));
                if let Some(description) = view.description(&self.meta, spec) {
                    converted.description = description;
                }
                tool = Some(converted);
            }
            match tool {
                // A page is bounded in bytes as well as in tools.
                Some(tool)
                    if tools.is_empty() || bytes + tool.encoded_len() <= MAX_LISTING_BYTES =>
                {
                    bytes += tool.encoded_len();
                    tools.push(tool);
                }
                // Another match exists: the page is full and a next page follows.
                _ => {
                    let last: &v1::Tool = tools.last().expect("a full page holds a tool");
                    next_page_token = format!("{PAGE_TOKEN_PREFIX}{}", last.name);
                    break;
                }
            }
        }
        let mut toolkit_names: Vec<&str> =
            tools.iter().map(|t| t.toolkit.as_str()).filter(|t| !t.is_empty()).collect();
        toolkit_names.sort_unstable();
        toolkit_names.dedup();
        // A toolkit names only the members this caller may see, under this profile.
        let toolkits = toolkit_names
            .into_iter()
            .filter_map(|name| catalog.toolkits.get(name))
            .map(|toolkit| {
                let mut listed = convert::toolkit(toolkit);
                listed.tools = catalog
                    .members(&toolkit.name)
                    .filter(|member| {
                        catalog.get(member).is_some_and(|entry| view.sees(&entry.spec))
                    })
                    .map(str::to_owned)
                    .collect();
                listed
            })
            .collect();
        view.audit("ListTools");
        Ok(Response::new(ListToolsResponse { tools, toolkits, next_page_token }))
    }

    async fn call_tool(
        &self,
        request: Request<CallToolRequest>,
    ) -> Result<Response<CallToolResponse>, Status> {
        let span = rpc_span("CallTool", &request);
        let timeout = client_timeout(&request);
        let principal = principal(&request)?;
        let nesting = nesting(&request)?;
        let call = call_request(request.into_inner(), timeout, principal, nesting);
        let result = self
            .router
            .call(call, EventSink::disabled(), CancellationToken::new())
            .instrument(span)
            .await;
        match result {
            Ok((call_id, output)) => Ok(Response::new(convert::response(call_id, output))),
            Err(error) => Err(status(&error)),
        }
    }

    async fn search_tools(
        &self,
        request: Request<v1::SearchToolsRequest>,
    ) -> Result<Response<v1::SearchToolsResponse>, Status> {
        let span = rpc_span("SearchTools", &request);
        let principal = principal(&request)?;
        self.search(request.into_inner(), principal).instrument(span).await
    }

    async fn list_resources(
        &self,
        request: Request<v1::ListResourcesRequest>,
    ) -> Result<Response<v1::ListResourcesResponse>, Status> {
        let _span = rpc_span("ListResources", &request).entered();
        let principal = principal(&request)?;
        let listed = super::offers::list_resources(
            &self.router,
            &self.servers,
            principal,
            request.into_inner(),
        );
        Ok(Response::new(listed))
    }

    async fn read_resource(
        &self,
        request: Request<v1::ReadResourceRequest>,
    ) -> Result<Response<v1::ReadResourceResponse>, Status> {
        let span = rpc_span("ReadResource", &request);
        let principal = principal(&request)?;
        let read = super::offers::read_resource(
            &self.router,
            &self.servers,
            principal,
            request.into_inner(),
        );
        read.instrument(span).await.map(Response::new)
    }

    async fn list_prompts(
        &self,
        request: Request<v1::ListPromptsRequest>,
    ) -> Result<Response<v1::ListPromptsResponse>, Status> {
        let _span = rpc_span("ListPrompts", &request).entered();
        let principal = principal(&request)?;
        let listed = super::offers::list_prompts(
            &self.router,
            &self.servers,
            principal,
            request.into_inner(),
        );
        Ok(Response::new(listed))
    }

    async fn get_prompt(
        &self,
        request: Request<v1::GetPromptRequest>,
    ) -> Result<Response<v1::GetPromptResponse>, Status> {
        let span = rpc_span("GetPrompt", &request);
        let principal = principal(&request)?;
        let got =
            super::offers::get_prompt(&self.router, &self.servers, principal, request.into_inner());
        got.instrument(span).await.map(Response::new)
    }

    type StreamCallToolStream = ServerStream;

    async fn stream_call_tool(
        &self,
        request: Request<Streaming<CallToolClientMessage>>,
    ) -> Result<Response<Self::StreamCallToolStream>, Status> {
        let span = rpc_span("StreamCallTool", &request);
        let timeout = client_timeout(&request);
        let principal = principal(&request)?;
        let nesting = nesting(&request)?;
        let mut inbound = request.into_inner();
        let start = match inbound.message().await? {
            Some(CallToolClientMessage {
                message: Some(call_tool_client_message::Message::Start(start)),
            }) => start,
            _ => {
                return Err(RouterError::InvalidRequest {
                    field: "message",
                    reason: "the first message of StreamCallTool must be `start`".into(),
                }
                .to_status());
            }
        };
        let samples = start.sampling;
        let mut call = call_request(start, timeout, principal, nesting);
        if call.call_id.is_empty() {
            call.call_id = Router::new_call_id();
        }
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let router = self.router.clone();
        tokio::spawn(run_stream(router, call, samples, inbound, tx).instrument(span));
        let messages = ReceiverStream::new(rx).map(|(message, _budget): Outbound| message);
        Ok(Response::new(Box::pin(messages)))
    }
}

/// Drives one streamed call: forwards the tool's events in order, then the result; turns a
/// `cancel` message, a reset stream or a client that went away into cancellation.
///
/// The call itself is polled throughout, so its deadline holds whatever the reader does.
/// One event at a time is taken from the tool, and sent once the outbound stream has room
/// for it, in messages and in bytes ([`STREAM_BYTES`]): a reader that lags leaves progress
/// coalesced and partial outputs waiting in the tool's bounded queue, never piling up
/// here.
async fn run_stream(
    router: Router,
    call: CallRequest,
    samples: bool,
    mut inbound: Streaming<CallToolClientMessage>,
    tx: mpsc::Sender<Outbound>,
) {
    use call_tool_server_message::Message;
    let call_id = call.call_id.clone();
    let started =
        CallToolServerMessage { message: Some(Message::Started(v1::CallStarted { call_id })) };
    if tx.send((Ok(started), None)).await.is_err() {
        return;
    }
    let cancel = CancellationToken::new();
    let (events, mut event_rx) = EventSink::channel();
    let (events, mut prompts) = events.with_elicitation();
    let (events, mut approvals) = events.with_approvals();
    // A caller that samples hears the samplings servers ask for; for others the channel is
    // closed from the start, and `can_sample` says no.
    let (events, mut samplings) = events.with_sampling();
    if !samples {
        samplings.close();
    }
    let mut sampleable = samples;
    let mut samplings_asked: HashMap<String, oneshot::Sender<SamplingAnswer>> = HashMap::new();
    let mut next_sampling = 0u64;
    let run = router.call(call, events, cancel.clone());
    tokio::pin!(run);
    let mut inbound_open = true;
    let mut reader = true;
    let mut askable = true;
    let mut questions: HashMap<String, oneshot::Sender<ElicitationAnswer>> = HashMap::new();
    let mut approvable = true;
    let mut pending: HashMap<String, oneshot::Sender<ApprovalAnswer>> = HashMap::new();
    let mut next_question = 0u64;
    let budget = Arc::new(Semaphore::new(STREAM_BYTES));
    // The event taken from the tool, waiting for room in the stream: one at most.
    let mut held: Option<CallToolServerMessage> = None;
    let result = loop {
        let cost = held.as_ref().map_or(0, |m| m.encoded_len().min(STREAM_BYTES) as u32);
        tokio::select! {
            biased;
            result = &mut run => break result,
            event = event_rx.recv(), if reader && held.is_none() => {
                held = Some(convert::event(event));
            }
            sent = async {
                let permit = tx.reserve().await?;
                let share = budget.clone().acquire_many_owned(cost).await.ok();
                Ok::<_, mpsc::error::SendError<()>>((permit, share))
            }, if reader && held.is_some() => match (sent, held.take()) {
                (Ok((permit, share)), Some(message)) => permit.send((Ok(message), share)),
                _ => {
                    debug!("the client stopped reading; cancelling the call");
                    reader = false;
                    cancel.cancel();
                }
            },
            () = tx.closed(), if reader => {
                debug!("the client went away; cancelling the call");
                reader = false;
                cancel.cancel();
            }
            asked = async {
                let permit = tx.reserve().await?;
                Ok::<_, mpsc::error::SendError<()>>((permit, prompts.recv().await))
            }, if reader && askable => match asked {
                Ok((permit, Some(prompt))) => {
                    next_question += 1;
                    let id = format!("e{next_question}");
                    permit.send((Ok(convert::elicitation(id.clone(), prompt.elicitation)), None));
                    questions.insert(id, prompt.reply);
                }
                // The sink is gone with the call, whose result comes next.
                Ok((_, None)) => askable = false,
                Err(_) => {
                    reader = false;
                    cancel.cancel();
                }
            },
            asked = async {
                let permit = tx.reserve().await?;
                Ok::<_, mpsc::error::SendError<()>>((permit, approvals.recv().await))
            }, if reader && approvable => match asked {
                Ok((permit, Some(prompt))) => {
                    let id = prompt.approval.id.clone();
                    permit.send((Ok(convert::approval(prompt.approval)), None));
                    pending.insert(id, prompt.reply);
                }
                Ok((_, None)) => approvable = false,
                Err(_) => {
                    reader = false;
                    cancel.cancel();
                }
            },
            asked = async {
                let permit = tx.reserve().await?;
                Ok::<_, mpsc::error::SendError<()>>((permit, samplings.recv().await))
            }, if reader && sampleable => match asked {
                Ok((permit, Some(prompt))) => {
                    next_sampling += 1;
                    let id = format!("s{next_sampling}");
                    permit.send((Ok(convert::sampling(id.clone(), prompt.sampling)), None));
                    samplings_asked.insert(id, prompt.reply);
                }
                Ok((_, None)) => sampleable = false,
                Err(_) => {
                    reader = false;
                    cancel.cancel();
                }
            },
            message = inbound.message(), if inbound_open => match message {
                Ok(Some(CallToolClientMessage { message: Some(call_tool_client_message::Message::Cancel(c)) })) => {
                    debug!(reason = %c.reason, "client cancelled the call");
                    cancel.cancel();
                }
                Ok(Some(CallToolClientMessage { message: Some(call_tool_client_message::Message::ElicitationAnswer(answer)) })) => {
                    match questions.remove(&answer.elicitation_id) {
                        Some(reply) => {
                            let _ = reply.send(convert::elicitation_answer(&answer));
                        }
                        None => debug!(id = %answer.elicitation_id, "answer to an unknown or expired elicitation"),
                    }
                }
                Ok(Some(CallToolClientMessage { message: Some(call_tool_client_message::Message::ApprovalAnswer(answer)) })) => {
                    // An answer goes to the approval it names; one naming another while a
                    // single approval waits goes to that one, which refuses it as given for
                    // another call.
                    let key = if pending.contains_key(&answer.approval_id) {
                        Some(answer.approval_id.clone())
                    } else if pending.len() == 1 {
                        pending.keys().next().cloned()
                    } else {
                        None
                    };
                    match key.and_then(|key| pending.remove(&key)) {
                        Some(reply) => {
                            let _ = reply.send(convert::approval_answer(answer));
                        }
                        None => debug!(id = %answer.approval_id, "answer to no pending approval"),
                    }
                }
                Ok(Some(CallToolClientMessage { message: Some(call_tool_client_message::Message::SamplingAnswer(answer)) })) => {
                    match samplings_asked.remove(&answer.sampling_id) {
                        Some(reply) => {
                            let _ = reply.send(convert::sampling_answer(&answer));
                        }
                        None => debug!(id = %answer.sampling_id, "answer to an unknown or expired sampling"),
                    }
                }
                // A second `start` or an empty message: nothing to do.
                Ok(Some(_)) => {}
                // A half-close only says the client has nothing more to send.
                Ok(None) => inbound_open = false,
                Err(status) => {
                    debug!(%status, "client stream failed; cancelling the call");
                    inbound_open = false;
                    cancel.cancel();
                }
            },
        }
    };
    // Events the tool emitted before returning are queued already; deliver them first.
    let queued =
        held.into_iter().chain(std::iter::from_fn(|| event_rx.try_recv().map(convert::event)));
    for message in queued {
        if tx.send((Ok(message), None)).await.is_err() {
            return;
        }
    }
    let last = match result {
        Ok((call_id, output)) => Ok(CallToolServerMessage {
            message: Some(Message::Result(convert::response(call_id, output))),
        }),
        Err(error) => Err(status(&error)),
    };
    let _ = tx.send((last, None)).await;
}

/// A router error as the status its client gets: its failure, mapped once in the proto
/// crate.
trait ToStatus {
    fn to_status(&self) -> Status;
}

impl ToStatus for RouterError {
    fn to_status(&self) -> Status {
        toolmesh_proto::status(&self.failure())
    }
}

/// Maps a router error to its status, logging internal faults once, here at the edge.
/// A call refused by a backend that is known to be down (its change of state is logged
/// where it happens) or because of the caller's input is no error of toolmesh's: it is
/// counted in the `toolmesh.call.duration` metric by `error.type`, and logged at debug level.
fn status(error: &RouterError) -> Status {
    match error.code() {
        ErrorCode::Internal => tracing::error!(error = %error, "call failed"),
        _ => debug!(error = %error, "call refused"),
    }
    error.to_status()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use toolmesh_core::Principal;

    #[test]
    fn a_request_without_a_principal_is_refused_never_taken_for_the_open_one() {
        let mut request = tonic::Request::new(());
        request.extensions_mut().insert(toolmesh_core::NoPrincipal);
        let refused = super::principal(&request).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        assert!(refused.message().contains("auth.anonymous"), "{refused:?}");
        // The configured anonymous principal is taken as it is.
        let alice = Arc::new(Principal::anonymous("guest"));
        request.extensions_mut().insert(alice.clone());
        assert!(Arc::ptr_eq(&super::principal(&request).unwrap(), &alice));
        // Only a service served without the front door's layers sees the open principal.
        let bare = tonic::Request::new(());
        assert!(toolmesh_core::is_open(&super::principal(&bare).unwrap()));
    }
}
