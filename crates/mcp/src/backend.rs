use std::sync::Arc;

use rmcp::{
    RoleClient, ServiceError,
    model::{
        CallToolRequest, CallToolRequestParams, CancelledNotificationParam, ClientRequest,
        ErrorCode as McpErrorCode, InputRequest, InputResponses, RequestId, RequestMetaObject,
        ServerResult,
    },
    service::{Peer, PeerRequestOptions},
};
use serde_json::Value;
use toolmesh_core::{Backend, BackendError, CallContext, ErrorCode, Nesting, ToolOutput};
use tracing::{Instrument, info_span};

use crate::{convert, shared::ServerShared};

/// The request `_meta` key that asks a 2026-07-28 server for log messages of that level and
/// above.
const LOG_LEVEL_META: &str = "io.modelcontextprotocol/logLevel";

/// The `_meta` key of a 2026-07-28 request's client capabilities.
pub(crate) const CAPABILITIES_META: &str = "io.modelcontextprotocol/clientCapabilities";

/// toolmesh's client capabilities for a call whose caller does not sample, as JSON.
static NOT_SAMPLING: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| {
    serde_json::to_value(crate::handler::capabilities(false)).unwrap_or_default()
});

/// How rmcp fails a request whose streamable-HTTP session was renewed before its answer.
const SESSION_RENEWED: &str = "streamable HTTP session was re-initialized";

/// Runs the calls of one MCP tool over its server's connection.
pub(crate) struct McpBackend {
    pub(crate) shared: Arc<ServerShared>,
    /// The tool's name on the server (the catalog name may carry a prefix).
    pub(crate) tool: String,
}

impl McpBackend {
    fn unavailable(&self, reason: String) -> BackendError {
        BackendError::Unavailable { backend: format!("mcp server {}", self.shared.name()), reason }
    }

    /// Maps a failed request on `peer`; a broken transport also tells the actor, which
    /// marks the connection lost at once instead of at the next liveness probe.
    pub(crate) fn map_error(
        &self,
        peer: &Arc<Peer<RoleClient>>,
        error: ServiceError,
    ) -> BackendError {
        match error {
            // rmcp renewed an expired streamable-HTTP session while the call was out: its
            // answer went with the old session, and whether it ran is unknown.
            ServiceError::McpError(error)
                if error.code == McpErrorCode::INTERNAL_ERROR
                    && error.message.starts_with(SESSION_RENEWED) =>
            {
                BackendError::Lost {
                    backend: format!("mcp server {}", self.shared.name()),
                    reason: "the server's session expired during the call".into(),
                }
            }
            // The server needs a capability the caller did not declare (2026-07-28): said
            // as such, with what it needs, so that the caller's door can say it too.
            ServiceError::McpError(error)
                if error.code == McpErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY =>
            {
                let required = (error.data.as_ref())
                    .and_then(|data| data.get("requiredCapabilities"))
                    .map_or_else(|| "{}".to_owned(), Value::to_string);
                BackendError::Failure(Box::new(toolmesh_core::CallFailure {
                    code: ErrorCode::FailedPrecondition,
                    kind: toolmesh_core::MISSING_CLIENT_CAPABILITY,
                    message: format!(
                        "mcp server {} needs a client capability the caller did not declare: {}",
                        self.shared.name(),
                        toolmesh_core::clip(&error.message, 1024)
                    ),
                    detail: toolmesh_core::FailureDetail::Info {
                        reason: "MISSING_CLIENT_CAPABILITY",
                        metadata: [("requiredCapabilities".to_owned(), required)].into(),
                    },
                }))
            }
            ServiceError::McpError(error) => {
                let code = match error.code {
                    McpErrorCode::INVALID_PARAMS => ErrorCode::InvalidArgument,
                    McpErrorCode::METHOD_NOT_FOUND | McpErrorCode::RESOURCE_NOT_FOUND => {
                        ErrorCode::NotFound
                    }
                    McpErrorCode::INVALID_REQUEST => ErrorCode::FailedPrecondition,
                    _ => ErrorCode::Internal,
                };
                BackendError::Remote {
                    code,
                    message: format!(
                        "mcp server {} answered {}: {}",
                        self.shared.name(),
                        error.code.0,
                        toolmesh_core::clip(&error.message, 1024)
                    ),
                }
            }
            ServiceError::Timeout { timeout } => BackendError::DeadlineExceeded(timeout),
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => {
                let reason = format!("a call found the connection broken: {error}");
                if let Some(actor) = self.shared.actor.load_full() {
                    let _ = actor.cast(crate::McpMsg::Broken { peer: peer.clone(), reason });
                }
                // Whether the server ran the call is unknown: the router repeats it only
                // for a read-only or idempotent tool.
                BackendError::Lost {
                    backend: format!("mcp server {}", self.shared.name()),
                    reason: "the connection closed during the call".into(),
                }
            }
            ServiceError::Cancelled { .. } => BackendError::Cancelled,
            other => BackendError::Internal(format!("mcp server {}: {other}", self.shared.name())),
        }
    }
}

/// Sends `notifications/cancelled` for a request unless disarmed: a call that is dropped
/// (the caller went away, the deadline passed) still tells the server to stop.
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
    reason: &'static str,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let peer = self.peer.clone();
            let reason = self.reason;
            tokio::spawn(
                async move {
                    let params = CancelledNotificationParam::new(Some(id), Some(reason.to_owned()));
                    let _ = peer.notify_cancelled(params).await;
                }
                .instrument(tracing::Span::current()),
            );
        }
    }
}

/// Removes a call's routes (progress, server requests) when the call ends, however it ends.
struct CallRoutes<'a> {
    shared: &'a ServerShared,
    token: rmcp::model::ProgressToken,
    id: RequestId,
}

impl Drop for CallRoutes<'_> {
    fn drop(&mut self) {
        self.shared.progress_sinks().remove(&self.token);
        self.shared.inflight_calls().remove(&self.id);
    }
}

/// Input rounds (2026-07-28 `InputRequiredResult`) one call may take.
const MAX_INPUT_ROUNDS: usize = 8;

impl McpBackend {
    /// Sends one `tools/call` and waits for its answer, with progress routed to the caller,
    /// `notifications/cancelled` on cancellation or drop, and [`BackendError::Lost`] if the
    /// connection is lost meanwhile.
    async fn round(
        &self,
        peer: &Arc<Peer<RoleClient>>,
        params: &mut CallToolRequestParams,
        ctx: &CallContext,
        lost: &tokio_util::sync::CancellationToken,
        headers: Option<u64>,
    ) -> Result<ServerResult, BackendError> {
        // The W3C trace context rides in `params._meta`, so the server's spans join the
        // caller's trace.
        let mut meta = RequestMetaObject::default();
        for (key, value) in toolmesh_telemetry::context_headers(&tracing::Span::current()) {
            meta.0.0.insert(key, Value::String(value));
        }
        // A server that calls back into toolmesh sends these with its calls.
        let nesting = Nesting::of(ctx);
        meta.0.0.insert(Nesting::DEPTH_META.into(), Value::from(nesting.depth));
        meta.0.0.insert(Nesting::PARENT_META.into(), Value::String(nesting.parent_call_id));
        if let Some(ticket) = headers {
            meta.0.0.insert(crate::http_client::HEADERS_META.into(), Value::from(ticket));
        }
        // On 2026-07-28 a server logs to a request only when asked to: a caller that hears
        // the call's events gets every level, and its own door filters them.
        let per_request = crate::offers::per_request(peer);
        let asks_logs = ctx.events.is_enabled() && per_request;
        if asks_logs {
            meta.0.0.insert(LOG_LEVEL_META.into(), Value::String("debug".into()));
        }
        // On 2026-07-28 the capabilities go with each request: a caller that answers input
        // rounds itself states its own, and a call whose caller does not sample says so;
        // the server asks for nothing else.
        if per_request && let Some(rounds) = ctx.events.input_rounds() {
            meta.0.0.insert(CAPABILITIES_META.into(), rounds.capabilities.clone());
        } else if per_request && !ctx.events.can_sample() {
            meta.0.0.insert(CAPABILITIES_META.into(), NOT_SAMPLING.clone());
        }
        // Over streamable HTTP toolmesh sends the call itself once the session is known;
        // rmcp sends what cannot go that way.
        if let Some(session) = self.direct_session()
            && let Some(answer) = self.send_direct(&session, peer, params, &meta, ctx, lost).await
        {
            return answer;
        }
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params.clone()));
        let mut options = PeerRequestOptions::default();
        options.meta = Some(meta);
        let handle = peer
            .send_request_with_option(request, options)
            .await
            .map_err(|e| self.map_error(peer, e))?;
        let (id, token) = (handle.id.clone(), handle.progress_token.clone());
        let response = self.awaiting(peer, id, token, ctx, lost, handle.await_response()).await?;
        response.map_err(|e| self.map_error(peer, e))
    }

    /// Waits for `answer` to call `id` (progress token `token`), with progress and the
    /// server's requests on the call routed to its caller meanwhile; a call that is
    /// cancelled or dropped before the answer tells the server with
    /// `notifications/cancelled`, and one whose connection is declared lost ends with
    /// [`BackendError::Lost`].
    pub(crate) async fn awaiting<T>(
        &self,
        peer: &Arc<Peer<RoleClient>>,
        id: RequestId,
        token: rmcp::model::ProgressToken,
        ctx: &CallContext,
        lost: &tokio_util::sync::CancellationToken,
        answer: impl Future<Output = T>,
    ) -> Result<T, BackendError> {
        tracing::Span::current().record("jsonrpc.request.id", tracing::field::display(&id));
        self.shared.progress_sinks().insert(token.clone(), ctx.events.clone());
        self.shared.inflight_calls().insert(id.clone(), ctx.events.clone());
        self.shared.registered.notify_waiters();
        let _routes = CallRoutes { shared: &self.shared, token, id: id.clone() };
        let mut cancel =
            CancelOnDrop { peer: Peer::clone(peer), id: Some(id), reason: "the caller cancelled" };
        let answer = tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => return Err(BackendError::Cancelled),
            () = lost.cancelled() => {
                cancel.id = None;
                // Whether the server ran the call is unknown, as for a closed transport.
                return Err(BackendError::Lost {
                    backend: format!("mcp server {}", self.shared.name()),
                    reason: "the connection was declared lost during the call".into(),
                });
            }
            answer = answer => answer,
        };
        cancel.id = None;
        Ok(answer)
    }

    /// Returns the connection of a server that has none: an idle lazy server is opened and
    /// the call waits for it, as it waits for a server still connecting (its tools listed as
    /// remembered from the last run), within its deadline. A repeated call (its first
    /// attempt lost the connection) waits, within its deadline, for the server to be
    /// connected again; any other call finds a server without a connection unavailable at
    /// once.
    async fn await_connection(
        &self,
        ctx: &CallContext,
    ) -> Result<Arc<Peer<RoleClient>>, BackendError> {
        let reason = |health: &crate::ServerHealth| match health {
            crate::ServerHealth::Unhealthy { reason } => reason.clone(),
            _ => "not connected yet".to_owned(),
        };
        let repeat = ctx.attempt > 1;
        let opening = matches!(
            **self.shared.health.load(),
            crate::ServerHealth::Idle | crate::ServerHealth::Connecting
        );
        if !repeat && !opening {
            return Err(self.unavailable(reason(&self.shared.health.load())));
        }
        // A repeated call waits for the connection until `reconnect_wait` after it was
        // lost, not until its own deadline: a dead server fails its calls within seconds.
        let until = if repeat {
            let lost =
                *self.shared.lost_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let lost = lost.unwrap_or_else(tokio::time::Instant::now);
            ctx.deadline.min(lost + self.shared.config.reconnect_wait)
        } else {
            ctx.deadline
        };
        // Subscribe before asking or looking, so that no outcome can slip by unseen.
        let mut attempts = self.shared.attempts.subscribe();
        // Connecting a server that is already connecting changes nothing.
        if opening && let Some(actor) = self.shared.actor.load_full() {
            let _ = actor.cast(crate::McpMsg::Connect);
        }
        loop {
            if let Some(peer) = self.connected() {
                return Ok(peer);
            }
            let health = self.shared.health.load();
            if !repeat && matches!(**health, crate::ServerHealth::Unhealthy { .. }) {
                return Err(self.unavailable(reason(&health)));
            }
            tokio::select! {
                biased;
                () = ctx.cancel.cancelled() => return Err(BackendError::Cancelled),
                () = tokio::time::sleep_until(until) => {
                    let why = if repeat {
                        format!(
                            "the connection, lost during an earlier attempt, was not back within \
                             {} ms (reconnect_wait_ms): {}",
                            self.shared.config.reconnect_wait.as_millis(),
                            reason(&self.shared.health.load())
                        )
                    } else {
                        "the server did not start in time".into()
                    };
                    return Err(self.unavailable(why));
                }
                changed = attempts.changed() => {
                    if changed.is_err() {
                        return Err(self.unavailable("the server is stopping".into()));
                    }
                }
            }
        }
    }

    /// Lends the headers of the server's upstream credentials for the caller of `ctx` to
    /// the call's requests; `None` when the server sends none.
    fn call_headers(
        &self,
        ctx: &CallContext,
    ) -> Result<Option<crate::http_client::HeadersTicket>, BackendError> {
        let credentials = &self.shared.config.credentials;
        if credentials.is_empty() {
            return Ok(None);
        }
        let refused = |message: String| BackendError::Remote {
            code: ErrorCode::FailedPrecondition,
            message: format!("mcp server {}: {message}", self.shared.name()),
        };
        let mut headers = Vec::new();
        for (name, secret) in credentials.headers(&ctx.principal).map_err(refused)? {
            let name = http::HeaderName::try_from(name.as_str())
                .map_err(|_| refused(format!("{name} is not a header name")))?;
            let mut value = http::HeaderValue::from_str(secret.expose()).map_err(|_| {
                refused(format!("the credential of header {name} is not a header value"))
            })?;
            value.set_sensitive(true);
            headers.push((name, value));
        }
        Ok(Some(self.shared.call_headers.lend(headers)))
    }

    /// The current connection, unless it has been declared lost.
    fn connected(&self) -> Option<Arc<Peer<RoleClient>>> {
        let peer = self.shared.peer.load_full()?;
        (!self.shared.lost.load().is_cancelled()).then_some(peer)
    }

    /// Ends a call whose caller answers input rounds itself with the round the server asks
    /// for.
    fn ask_caller(
        &self,
        rounds: &toolmesh_core::InputRounds,
        required: rmcp::model::InputRequiredResult,
    ) -> BackendError {
        rounds.ask(convert::input_round(required));
        BackendError::Failure(Box::new(toolmesh_core::CallFailure {
            code: ErrorCode::FailedPrecondition,
            kind: toolmesh_core::INPUT_REQUIRED,
            message: format!("mcp server {} asks the caller for input", self.shared.name()),
            detail: Default::default(),
        }))
    }

    /// Answers one input request of a 2026-07-28 server through the caller.
    async fn answer(
        &self,
        request: InputRequest,
        ctx: &CallContext,
    ) -> Result<Value, BackendError> {
        match request {
            InputRequest::Elicitation(request) => {
                let (answer, schema) = match convert::elicitation(request.params) {
                    Some(question) => {
                        let schema = question.requested_schema.clone();
                        (ctx.events.elicit(question, self.shared.config.timeout).await, schema)
                    }
                    None => (toolmesh_core::ElicitationAnswer::Cancel, Value::Null),
                };
                serde_json::to_value(convert::elicit_result(answer, &schema))
                    .map_err(|e| BackendError::Internal(e.to_string()))
            }
            InputRequest::ListRoots(_) => Ok(serde_json::json!({ "roots": [] })),
            InputRequest::CreateMessage(request) => {
                let params = serde_json::to_value(request.params)
                    .map_err(|e| BackendError::Internal(e.to_string()))?;
                let timeout = self.shared.config.timeout;
                let answer = ctx.events.sample(toolmesh_core::Sampling { params }, timeout).await;
                // Checked as a sampling request's answer is, then passed on as given.
                convert::sampled(answer.clone()).map_err(|error| BackendError::Remote {
                    code: ErrorCode::FailedPrecondition,
                    message: format!(
                        "mcp server {} asked for a sampling: {}",
                        self.shared.name(),
                        error.message
                    ),
                })?;
                answer.map_err(BackendError::Internal)
            }
            other => Err(BackendError::Remote {
                code: ErrorCode::FailedPrecondition,
                message: format!(
                    "mcp server {} asked for input toolmesh does not know: {other:?}",
                    self.shared.name()
                ),
            }),
        }
    }
}

#[async_trait::async_trait]
impl Backend for McpBackend {
    async fn call(&self, ctx: CallContext, arguments: Value) -> Result<ToolOutput, BackendError> {
        // The caller's upstream credentials, lent to this call's requests; a caller without
        // one is refused before a lazy server is started for it.
        let headers = self.call_headers(&ctx)?;
        // A full server refuses at once, as a full local tool does: waiting callers would
        // pile up without bound behind a slow server.
        let _slot = self.shared.slots.clone().try_acquire_owned().map_err(|_| {
            BackendError::Overloaded {
                tool: ctx.tool.clone(),
                reason: format!(
                    "mcp server {} has {} calls running (its max_concurrency)",
                    self.shared.name(),
                    self.shared.config.max_concurrency
                ),
            }
        })?;
        self.shared.touch();
        let peer = match self.connected() {
            Some(peer) => peer,
            None => self.await_connection(&ctx).await?,
        };
        let lost = self.shared.lost.load_full();
        let transport = match &self.shared.config.transport {
            crate::McpTransport::Stdio { .. } => "pipe",
            _ => "tcp",
        };
        let span = info_span!(
            "mcp.call",
            otel.name = %format!("tools/call {}", self.tool),
            otel.kind = "client",
            mcp.method.name = "tools/call",
            gen_ai.tool.name = %self.tool,
            gen_ai.operation.name = "execute_tool",
            mcp.server = %self.shared.name(),
            mcp.session.id = tracing::field::Empty,
            network.transport = transport,
            jsonrpc.request.id = tracing::field::Empty,
        );
        let call = async {
            let mut params = CallToolRequestParams::new(self.tool.clone());
            params.arguments = match arguments {
                Value::Object(map) => Some(map),
                Value::Null => None,
                other => {
                    return Err(BackendError::InvalidArguments(format!(
                        "MCP arguments must be an object, got {other}"
                    )));
                }
            };
            // On protocol 2026-07-28 a server asks for input by answering with an
            // InputRequiredResult; the call is then sent again with the answers. A caller
            // that answers rounds itself gets the round, and sends its answers (with the
            // server's state) in a request of its own.
            let rounds = ctx.events.input_rounds();
            if let Some(answers) = rounds.and_then(|rounds| rounds.answers.as_ref()) {
                (params.input_responses, params.request_state) = convert::answered(answers);
            }
            for _ in 0..MAX_INPUT_ROUNDS {
                let ticket = headers.as_ref().map(|ticket| ticket.id());
                let answered = rounds.is_some() && params.input_responses.is_some();
                let round = match self.round(&peer, &mut params, &ctx, &lost, ticket).await {
                    // The server refused the caller's answers: the caller's request was
                    // wrong, as the server says.
                    Err(BackendError::Remote { code: ErrorCode::InvalidArgument, message })
                        if answered =>
                    {
                        return Err(BackendError::Failure(Box::new(
                            toolmesh_core::CallFailure::new(
                                ErrorCode::InvalidArgument,
                                toolmesh_core::INVALID_INPUT_RESPONSES,
                                message,
                            ),
                        )));
                    }
                    round => round?,
                };
                match round {
                    ServerResult::CallToolResult(result) => return Ok(convert::output(result)),
                    ServerResult::InputRequiredResult(required) => {
                        if required.input_requests.as_ref().is_none_or(|r| r.is_empty())
                            && required.request_state.is_none()
                        {
                            return Err(BackendError::Internal(format!(
                                "mcp server {} asked for input without saying what",
                                self.shared.name()
                            )));
                        }
                        if let Some(rounds) = rounds {
                            return Err(self.ask_caller(rounds, required));
                        }
                        let mut responses = InputResponses::new();
                        for (key, request) in required.input_requests.unwrap_or_default() {
                            responses.insert(key, self.answer(request, &ctx).await?);
                        }
                        params.input_responses = (!responses.is_empty()).then_some(responses);
                        params.request_state = required.request_state;
                    }
                    other => {
                        return Err(BackendError::Internal(format!(
                            "mcp server {} answered tools/call with an unexpected result: {other:?}",
                            self.shared.name()
                        )));
                    }
                }
            }
            Err(BackendError::Internal(format!(
                "mcp server {} asked for input more than {MAX_INPUT_ROUNDS} times",
                self.shared.name()
            )))
        };
        let started = std::time::Instant::now();
        let outcome = call.instrument(span).await;
        let version = peer.peer_info().map(|info| info.protocol_version.to_string());
        let error = match &outcome {
            Ok(output) if output.is_error => Some("tool_error"),
            Ok(_) => None,
            Err(error) => Some(error.kind()),
        };
        let operation = crate::metrics::Operation {
            method: "tools/call",
            tool: Some(&self.tool),
            protocol_version: version.as_deref().unwrap_or_default(),
            error,
        };
        operation.sent(self.shared.name(), transport, started.elapsed().as_secs_f64());
        outcome
    }
}
