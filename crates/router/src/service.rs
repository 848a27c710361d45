use std::{collections::HashMap, pin::Pin};

use futures::Stream;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use toolmesh_config::ProfileConfig;
use toolmesh_core::{CallFailure, ElicitationAnswer, ErrorCode, EventSink};
use toolmesh_proto::v1::{
    self, CallToolClientMessage, CallToolRequest, CallToolResponse, CallToolServerMessage,
    ListToolsRequest, ListToolsResponse, call_tool_client_message, call_tool_server_message,
    tool_service_server::ToolService,
};
use toolmesh_search::SearchHandle;
use toolmesh_telemetry::{names, set_parent_from_metadata};
use tracing::{Instrument, Span, debug, info_span};

use crate::{
    CallRequest, MetaTools, Router, RouterError, SEARCH_TOOLS, convert, is_meta, parse_grpc_timeout,
};

/// Default tools per `ListTools` page.
const DEFAULT_PAGE_SIZE: usize = 100;
/// Largest `ListTools` page.
const MAX_PAGE_SIZE: usize = 1000;
/// Prefix of page tokens: the token names the last tool of the previous page.
const PAGE_TOKEN_PREFIX: &str = "after:";
/// Server messages buffered per stream before the tool's events wait for the client.
const STREAM_BUFFER: usize = 64;

/// Default hits per `SearchTools`.
const DEFAULT_TOP_K: usize = 5;
/// Most hits per `SearchTools`.
const MAX_TOP_K: usize = 50;

/// The gRPC `toolmesh.v1.ToolService`.
#[derive(Debug, Clone)]
pub struct ToolServiceImpl {
    router: Router,
    search: SearchHandle,
    meta: MetaTools,
}

impl ToolServiceImpl {
    /// Returns the service over `router`, searching with `search`, with the routing
    /// profiles of `meta`.
    pub fn new(router: Router, search: SearchHandle, meta: MetaTools) -> Self {
        ToolServiceImpl { router, search, meta }
    }

    /// Returns the routing profile a request names; `None` when it names none.
    fn profile(&self, name: &str) -> Result<Option<&ProfileConfig>, Status> {
        match name {
            "" => Ok(None),
            name => self.meta.profile(name).map(Some).map_err(|e| e.to_status()),
        }
    }

    /// Refuses a call that names a routing profile in which the tool is not visible: such a
    /// tool is reached through `callTool`, after a search.
    fn admit(&self, call: &CallRequest) -> Result<(), Status> {
        let Some(profile) = self.profile(&call.profile)? else { return Ok(()) };
        match self.router.registry().resolve(&call.name) {
            Some(entry) if !MetaTools::visible(profile, &entry.spec) => {
                Err(toolmesh_proto::status(&CallFailure::new(
                    ErrorCode::FailedPrecondition,
                    "not_visible",
                    format!(
                        "tool {} is not visible in routing profile {}: find it with searchTools \
                         and call it with callTool",
                        call.name, call.profile
                    ),
                )))
            }
            _ => Ok(()),
        }
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
    let span = info_span!(
        "rpc",
        otel.name = %format!("{}/{method}", toolmesh_proto::TOOL_SERVICE_NAME),
        otel.kind = "server",
        { names::RPC_SYSTEM } = "grpc",
        { names::RPC_SERVICE } = toolmesh_proto::TOOL_SERVICE_NAME,
        { names::RPC_METHOD } = method,
    );
    set_parent_from_metadata(&span, request.metadata());
    span
}

fn client_timeout<T>(request: &Request<T>) -> Option<std::time::Duration> {
    request
        .metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
}

fn call_request(
    message: CallToolRequest,
    client_timeout: Option<std::time::Duration>,
) -> CallRequest {
    CallRequest {
        name: message.name,
        arguments_json: message.arguments_json,
        call_id: message.call_id,
        session_id: message.session_id,
        profile: message.profile,
        client_timeout,
    }
}

impl ToolServiceImpl {
    async fn search(
        &self,
        request: v1::SearchToolsRequest,
    ) -> Result<Response<v1::SearchToolsResponse>, Status> {
        let top_k = match request.top_k as usize {
            0 => DEFAULT_TOP_K,
            n => n.min(MAX_TOP_K),
        };
        let filter = ToolFilter::new(
            request.toolkit,
            request.tags,
            request.source_kind,
            request.source_name,
        );
        let profile = self.profile(&request.profile)?.cloned();
        let hits = self
            .search
            .search(&request.query, top_k, move |spec| {
                filter.keeps(spec)
                    && profile
                        .as_ref()
                        .map_or(!is_meta(spec), |profile| MetaTools::in_pool(profile, spec))
            })
            .await
            .map_err(|error| status(&RouterError::Search(error)))?
            .into_iter()
            .map(|hit| v1::SearchHit {
                tool: Some(convert::tool(&hit.tool.spec, hit.tool.backend.status())),
                score: hit.score,
            })
            .collect();
        Ok(Response::new(v1::SearchToolsResponse {
            hits,
            ranking: self.search.ranking(),
            indexed_tools: self.search.indexed() as u64,
            embedded_tools: self.search.embedded() as u64,
            index_version: self.search.version(),
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
        let profile = self.profile(&request.profile)?;
        let filter = ToolFilter::new(
            request.toolkit,
            request.tags,
            request.source_kind,
            request.source_name,
        );
        let catalog = self.router.registry().snapshot();
        let range = match after {
            Some(after) => catalog
                .tools
                .range::<str, _>((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded)),
            None => catalog.tools.range::<str, _>(..),
        };
        let mut tools = Vec::with_capacity(page_size.min(catalog.tools.len()));
        let mut next_page_token = String::new();
        for (_, entry) in range {
            let spec = &entry.spec;
            let matches = filter.keeps(spec)
                && profile.is_none_or(|profile| MetaTools::visible(profile, spec));
            if !matches {
                continue;
            }
            if tools.len() == page_size {
                // Another match exists: the page is full and a next page follows.
                let last: &v1::Tool = tools.last().expect("page_size > 0");
                next_page_token = format!("{PAGE_TOKEN_PREFIX}{}", last.name);
                break;
            }
            let mut tool = convert::tool(spec, entry.backend.status());
            if let Some(profile) = profile
                && spec.name == SEARCH_TOOLS
                && is_meta(spec)
            {
                // Described for this profile's pool.
                tool.description = MetaTools::describe(profile, &catalog);
            }
            tools.push(tool);
        }
        let mut toolkit_names: Vec<&str> =
            tools.iter().map(|t| t.toolkit.as_str()).filter(|t| !t.is_empty()).collect();
        toolkit_names.sort_unstable();
        toolkit_names.dedup();
        let toolkits = toolkit_names
            .into_iter()
            .filter_map(|name| catalog.toolkits.get(name))
            .map(|toolkit| convert::toolkit(toolkit))
            .collect();
        Ok(Response::new(ListToolsResponse { tools, toolkits, next_page_token }))
    }

    async fn call_tool(
        &self,
        request: Request<CallToolRequest>,
    ) -> Result<Response<CallToolResponse>, Status> {
        let span = rpc_span("CallTool", &request);
        let timeout = client_timeout(&request);
        let call = call_request(request.into_inner(), timeout);
        self.admit(&call)?;
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
        self.search(request.into_inner()).instrument(span).await
    }

    type StreamCallToolStream = ServerStream;

    async fn stream_call_tool(
        &self,
        request: Request<Streaming<CallToolClientMessage>>,
    ) -> Result<Response<Self::StreamCallToolStream>, Status> {
        let span = rpc_span("StreamCallTool", &request);
        let timeout = client_timeout(&request);
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
        let mut call = call_request(start, timeout);
        self.admit(&call)?;
        if call.call_id.is_empty() {
            call.call_id = Router::new_call_id();
        }
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let router = self.router.clone();
        tokio::spawn(run_stream(router, call, inbound, tx).instrument(span));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Drives one streamed call: forwards the tool's events in order, then the result; turns a
/// `cancel` message, a reset stream or a client that went away into cancellation.
///
/// The call itself is polled throughout, so its deadline holds whatever the reader does.
/// An event is taken from the tool only once the outbound stream has room for it
/// (a reserved permit): a reader that lags leaves progress coalesced and partial outputs
/// waiting in the tool's bounded queue, never piling up here.
async fn run_stream(
    router: Router,
    call: CallRequest,
    mut inbound: Streaming<CallToolClientMessage>,
    tx: mpsc::Sender<Result<CallToolServerMessage, Status>>,
) {
    use call_tool_server_message::Message;
    let call_id = call.call_id.clone();
    let started =
        CallToolServerMessage { message: Some(Message::Started(v1::CallStarted { call_id })) };
    if tx.send(Ok(started)).await.is_err() {
        return;
    }
    let cancel = CancellationToken::new();
    let (events, mut event_rx) = EventSink::channel();
    let (events, mut prompts) = events.with_elicitation();
    let run = router.call(call, events, cancel.clone());
    tokio::pin!(run);
    let mut inbound_open = true;
    let mut reader = true;
    let mut askable = true;
    let mut questions: HashMap<String, oneshot::Sender<ElicitationAnswer>> = HashMap::new();
    let mut next_question = 0u64;
    let result = loop {
        tokio::select! {
            biased;
            result = &mut run => break result,
            sent = async {
                let permit = tx.reserve().await?;
                Ok::<_, mpsc::error::SendError<()>>((permit, event_rx.recv().await))
            }, if reader => match sent {
                Ok((permit, event)) => permit.send(Ok(convert::event(event))),
                Err(_) => {
                    debug!("the client stopped reading; cancelling the call");
                    reader = false;
                    cancel.cancel();
                }
            },
            asked = async {
                let permit = tx.reserve().await?;
                Ok::<_, mpsc::error::SendError<()>>((permit, prompts.recv().await))
            }, if reader && askable => match asked {
                Ok((permit, Some(prompt))) => {
                    next_question += 1;
                    let id = format!("e{next_question}");
                    permit.send(Ok(convert::elicitation(id.clone(), prompt.elicitation)));
                    questions.insert(id, prompt.reply);
                }
                // The sink is gone with the call, whose result comes next.
                Ok((_, None)) => askable = false,
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
    while let Some(event) = event_rx.try_recv() {
        if tx.send(Ok(convert::event(event))).await.is_err() {
            return;
        }
    }
    let last = match result {
        Ok((call_id, output)) => Ok(CallToolServerMessage {
            message: Some(Message::Result(convert::response(call_id, output))),
        }),
        Err(error) => Err(status(&error)),
    };
    let _ = tx.send(last).await;
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
