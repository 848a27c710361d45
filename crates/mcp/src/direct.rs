//! `tools/call` over streamable HTTP, sent by toolmesh itself: one HTTP request per call on
//! the connection's pooled client, and its answer read from the response, without rmcp's
//! service task, transport worker and channels in between, and without trying every result
//! type of the protocol on each answer (a `tools/call` answers with a call result, or on
//! 2026-07-28 with an input round).
//!
//! The rmcp connection stays the owner of the session: it makes it (`initialize` or
//! `server/discover`), lists, probes, listens, and renews a session the server no longer
//! knows. Its HTTP client notes the session it sends in ([`note`]); a call is sent here
//! once one is noted. A call that cannot be sent this way goes through rmcp instead: none
//! noted yet, a connection refused before the request left, a session the server refused
//! (rmcp then renews it), a refused credential, and on 2026-07-28 a tool whose schema names
//! request headers of its own (`x-mcp-header`), which rmcp derives from the arguments.
//!
//! What the server sends on the call's stream goes where rmcp would send it: progress to the
//! call's caller, any other notification and every server request (elicitation, sampling,
//! roots, ping) to the connection's client handler, with the call named as their origin. A
//! server request's answer is posted back in the session. A stream the server closes before
//! the answer is resumed from its last event (`Last-Event-ID`, after the server's `retry`).

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use arc_swap::ArcSwapOption;
use futures::StreamExt as _;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use rmcp::{
    RoleClient, Service as _, ServiceError,
    model::{
        CallToolRequestParams, CallToolResult, ClientJsonRpcMessage, ClientRequest, ErrorData,
        GetMeta as _, InputRequiredResult, ProgressNotificationParam, ProgressToken,
        ProtocolVersion, RequestId, RequestMetaObject, ServerJsonRpcMessage, ServerResult,
    },
    service::{InboundStreamOrigin, Peer, RequestContext},
};
use serde::Deserialize;
use serde_json::Value;
use toolmesh_core::{BackendError, CallContext, ErrorCode};
use tracing::debug;

use crate::{backend::McpBackend, handler::McpClientHandler};

/// Where a streamable-HTTP connection sends its messages: the server's URL, parsed once,
/// and the configured headers.
pub(crate) struct Endpoint {
    pub(crate) url: reqwest::Url,
    pub(crate) headers: HeaderMap,
}

/// The session a streamable-HTTP connection sends its messages in, as its HTTP client last
/// sent one after the handshake, with what every call in it sends.
pub(crate) struct HttpSession {
    /// `Mcp-Session-Id`; none on a sessionless (2026-07-28) connection.
    id: Option<Arc<str>>,
    /// The negotiated protocol revision.
    version: ProtocolVersion,
    endpoint: Arc<Endpoint>,
    /// The headers of every message in the session.
    headers: HeaderMap,
    /// The `_meta` every request starts from: on 2026-07-28 the revision, the client and its
    /// capabilities, as rmcp sends them with each request.
    meta: RequestMetaObject,
}

/// `MCP-Protocol-Version`.
const VERSION_HEADER: HeaderName = HeaderName::from_static("mcp-protocol-version");

/// Where a connection's session is noted.
pub(crate) type SessionSlot = Arc<ArcSwapOption<HttpSession>>;

/// Notes the session `message` is sent in, unless it is a handshake (whose session is not
/// made yet) or names no protocol revision.
pub(crate) fn note(
    slot: &SessionSlot,
    message: &ClientJsonRpcMessage,
    session_id: Option<&Arc<str>>,
    headers: &HashMap<HeaderName, HeaderValue>,
    endpoint: &Arc<Endpoint>,
) {
    if let ClientJsonRpcMessage::Request(request) = message
        && matches!(
            request.request,
            ClientRequest::InitializeRequest(_) | ClientRequest::DiscoverRequest(_)
        )
    {
        return;
    }
    let Some(version_header) = headers.get(&VERSION_HEADER) else { return };
    let current = slot.load();
    if let Some(current) = current.as_deref()
        && current.id.as_deref() == session_id.map(|id| &**id)
        && current.headers.get(&VERSION_HEADER) == Some(version_header)
        && Arc::ptr_eq(&current.endpoint, endpoint)
    {
        return;
    }
    let Ok(version) = version_header.to_str() else { return };
    let Ok(version) = serde_json::from_value::<ProtocolVersion>(version.into()) else { return };
    let mut session_headers = endpoint.headers.clone();
    session_headers.insert(VERSION_HEADER, version_header.clone());
    if let Some(id) = session_id
        && let Ok(id) = HeaderValue::from_str(id)
    {
        session_headers.insert("mcp-session-id", id);
    }
    let mut meta = RequestMetaObject::default();
    if version >= ProtocolVersion::V_2026_07_28 {
        meta.set_protocol_version(version.clone());
        meta.set_client_info(crate::handler::client_info());
        meta.set_client_capabilities(crate::handler::capabilities(true));
    }
    slot.store(Some(Arc::new(HttpSession {
        id: session_id.cloned(),
        version,
        endpoint: endpoint.clone(),
        headers: session_headers,
        meta,
    })));
}

/// What a request accepts in answer.
const ACCEPT_BOTH: &str = "application/json, text/event-stream";

/// The largest answer read: a JSON body, or one event of a stream.
const MAX_ANSWER: usize = 16 * 1024 * 1024;

/// The most of an error body read.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// How often in a row a call's stream is resumed without bringing an event.
const MAX_RESUMPTIONS: u32 = 5;

/// The wait before resuming a closed stream whose server named none.
const DEFAULT_RETRY: Duration = Duration::from_secs(1);

/// The request ids of the calls sent here; apart from rmcp's (numbers) in the same session.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A `tools/call` request as it is written, its parameters borrowed.
#[derive(serde::Serialize)]
struct CallMessage<'a> {
    jsonrpc: &'static str,
    id: &'a RequestId,
    method: &'static str,
    params: &'a CallToolRequestParams,
}

/// The fields of a JSON-RPC message that tell what it is.
#[derive(Deserialize)]
struct Incoming {
    #[serde(default)]
    id: Option<RequestId>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error: Option<ErrorData>,
    #[serde(default)]
    params: Option<Value>,
}

impl McpBackend {
    /// The session a call of this tool can be sent in by toolmesh itself, if any.
    pub(crate) fn direct_session(&self) -> Option<Arc<HttpSession>> {
        let session = self.shared.http_session.load_full()?;
        if session.version >= ProtocolVersion::STANDARD_HEADERS
            && (!plain_header(&self.tool) || self.shared.param_headers.load().contains(&self.tool))
        {
            return None;
        }
        Some(session)
    }

    /// Sends one `tools/call` in `session` and reads its answer; `None` when it did not
    /// reach the server this way, for rmcp to send. Progress goes to the caller; a cancelled
    /// or dropped call tells the server with `notifications/cancelled`; the call ends with
    /// [`BackendError::Lost`] if the connection is declared lost.
    pub(crate) async fn send_direct(
        &self,
        session: &HttpSession,
        peer: &Arc<Peer<RoleClient>>,
        params: &mut CallToolRequestParams,
        meta: &RequestMetaObject,
        ctx: &CallContext,
        lost: &tokio_util::sync::CancellationToken,
    ) -> Option<Result<ServerResult, BackendError>> {
        let number = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let id = RequestId::String(format!("toolmesh-{number}").into());
        let token = ProgressToken(id.clone());
        // The request as rmcp would make it: on 2026-07-28 the revision, the client and its
        // capabilities go with it, then the call's own `_meta` (which may narrow the
        // capabilities), then the progress token.
        let mut full = session.meta.clone();
        full.extend(meta.clone());
        full.set_progress_token(token.clone());
        let mut headers = session.headers.clone();
        let mut own = HashMap::new();
        crate::http_client::prepare_meta(&self.shared.call_headers, &mut full, &mut own);
        headers.extend(own);
        headers.insert(header::ACCEPT, HeaderValue::from_static(ACCEPT_BOTH));
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if session.version >= ProtocolVersion::STANDARD_HEADERS
            && let Ok(name) = HeaderValue::from_str(&self.tool)
        {
            headers.insert("mcp-method", HeaderValue::from_static("tools/call"));
            headers.insert("mcp-name", name);
        }
        // The parameters are lent their `_meta` for the writing, not copied.
        let unsent = params.meta.replace(full);
        let body = serde_json::to_vec(&CallMessage {
            jsonrpc: "2.0",
            id: &id,
            method: "tools/call",
            params,
        });
        params.meta = unsent;
        let body = match body {
            Ok(body) => body,
            Err(error) => return Some(Err(BackendError::Internal(error.to_string()))),
        };

        let exchange = self.exchange(session, peer, &id, headers, body);
        match self.awaiting(peer, id.clone(), token, ctx, lost, exchange).await {
            Ok(answer) => answer,
            Err(error) => Some(Err(error)),
        }
    }

    /// Posts the call and reads its answer; `None` when the server did not take it.
    async fn exchange(
        &self,
        session: &HttpSession,
        peer: &Arc<Peer<RoleClient>>,
        id: &RequestId,
        headers: HeaderMap,
        body: Vec<u8>,
    ) -> Option<Result<ServerResult, BackendError>> {
        let client = self.shared.http_client();
        let url = session.endpoint.url.clone();
        let response = match client.post(url).headers(headers).body(body).send().await {
            Ok(response) => response,
            // Nothing left toolmesh: rmcp sends it, and finds out about the connection.
            Err(error) if error.is_connect() => return None,
            Err(error) => return Some(Err(self.broke(peer, &error))),
        };
        let status = response.status();
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
            || (status == StatusCode::NOT_FOUND && session.id.is_some())
        {
            debug!(server = self.shared.name(), %status, "call refused before it ran; sent through rmcp");
            return None;
        }
        if !status.is_success() {
            return self.refused(session, peer, status, response, id).await;
        }
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase();
        let answer = if content_type.starts_with("text/event-stream") {
            self.stream(session, peer, id, response).await
        } else if content_type.starts_with("application/json") {
            match read(response, MAX_ANSWER).await {
                Ok(body) => match self.heard(session, peer, id, &body).await {
                    Some(answer) => answer,
                    None => Err(self.unanswered("its JSON answer is not the call's")),
                },
                Err(error) => Err(self.broke_with(peer, error)),
            }
        } else if status == StatusCode::ACCEPTED {
            Err(self.unanswered("it accepted the call without an answer"))
        } else {
            Err(self.unanswered(&format!("it answered with content type {content_type:?}")))
        };
        Some(answer)
    }

    /// The answer to a call the server refused with `status`; `None` when the refusal is of
    /// the session, which rmcp renews.
    async fn refused(
        &self,
        session: &HttpSession,
        peer: &Arc<Peer<RoleClient>>,
        status: StatusCode,
        response: reqwest::Response,
        id: &RequestId,
    ) -> Option<Result<ServerResult, BackendError>> {
        let body = read(response, MAX_ERROR_BODY).await.unwrap_or_default();
        if let Ok(message) = serde_json::from_slice::<Incoming>(&body)
            && let Some(error) = message.error
        {
            return match message.id {
                Some(answered) if answered == *id => {
                    Some(Err(self.map_error(peer, ServiceError::McpError(error))))
                }
                // An id-less error to a message sent in a session refuses the session (many
                // servers answer so instead of 404).
                None if session.id.is_some() => None,
                _ => Some(Err(self.map_error(peer, ServiceError::McpError(error)))),
            };
        }
        let text = String::from_utf8_lossy(&body);
        Some(Err(BackendError::Remote {
            code: ErrorCode::Internal,
            message: format!(
                "mcp server {} answered HTTP {status}: {}",
                self.shared.name(),
                toolmesh_core::clip(&text, 1024)
            ),
        }))
    }

    /// Reads the call's event stream until its answer, resuming it when the server closes
    /// it first.
    async fn stream(
        &self,
        session: &HttpSession,
        peer: &Arc<Peer<RoleClient>>,
        id: &RequestId,
        response: reqwest::Response,
    ) -> Result<ServerResult, BackendError> {
        let mut events = sse_stream::SseStream::from_bytes_stream(response.bytes_stream());
        let mut last_event: Option<String> = None;
        let mut retry = DEFAULT_RETRY;
        let mut resumptions = 0;
        loop {
            match events.next().await {
                Some(Ok(event)) => {
                    if let Some(event_id) = event.id {
                        last_event = Some(event_id);
                    }
                    if let Some(millis) = event.retry {
                        retry = Duration::from_millis(millis);
                    }
                    let Some(data) = event.data.filter(|data| !data.trim().is_empty()) else {
                        continue;
                    };
                    resumptions = 0;
                    if data.len() > MAX_ANSWER {
                        return Err(self.unanswered("an event of its stream is over 16 MiB"));
                    }
                    if let Some(answer) = self.heard(session, peer, id, data.as_bytes()).await {
                        return answer;
                    }
                }
                Some(Err(error)) if last_event.is_none() => {
                    return Err(self.broke_with(peer, error.to_string()));
                }
                // A stream that broke or closed before the answer is resumed from its last
                // event; one without event ids cannot be.
                ended => {
                    let Some(last) = last_event.as_deref() else {
                        return Err(self.unanswered("it closed the call's stream before answering"));
                    };
                    if resumptions >= MAX_RESUMPTIONS {
                        let why = match ended {
                            Some(Err(error)) => error.to_string(),
                            _ => "closed".into(),
                        };
                        return Err(self.broke_with(
                            peer,
                            format!(
                                "the call's stream was resumed {MAX_RESUMPTIONS} times without an \
                             event ({why})"
                            ),
                        ));
                    }
                    resumptions += 1;
                    tokio::time::sleep(retry).await;
                    let mut headers = session.headers.clone();
                    headers.insert(header::ACCEPT, HeaderValue::from_static("text/event-stream"));
                    if let Ok(last) = HeaderValue::from_str(last) {
                        headers.insert("last-event-id", last);
                    }
                    let url = session.endpoint.url.clone();
                    let resumed = self.shared.http_client().get(url).headers(headers);
                    match resumed.send().await {
                        Ok(response) if response.status().is_success() => {
                            events =
                                sse_stream::SseStream::from_bytes_stream(response.bytes_stream());
                        }
                        Ok(response) => {
                            return Err(self.broke_with(
                                peer,
                                format!(
                                    "resuming the call's stream was answered HTTP {}",
                                    response.status()
                                ),
                            ));
                        }
                        Err(error) => return Err(self.broke(peer, &error)),
                    }
                }
            }
        }
    }

    /// Handles one message from the server during the call; returns the call's answer
    /// when it is that.
    async fn heard(
        &self,
        session: &HttpSession,
        peer: &Arc<Peer<RoleClient>>,
        id: &RequestId,
        text: &[u8],
    ) -> Option<Result<ServerResult, BackendError>> {
        let message: Incoming = match serde_json::from_slice(text) {
            Ok(message) => message,
            Err(error) => {
                return Some(Err(self.unanswered(&format!("it sent no JSON-RPC: {error}"))));
            }
        };
        match message {
            Incoming { result: Some(result), id: Some(answered), .. } if answered == *id => {
                Some(self.call_result(result))
            }
            Incoming { error: Some(error), id: answered, .. }
                if answered.as_ref().is_none_or(|answered| answered == id) =>
            {
                Some(Err(self.map_error(peer, ServiceError::McpError(error))))
            }
            Incoming { method: Some(method), id: None, params, .. }
                if method == "notifications/progress" =>
            {
                if let Some(progress) =
                    params.and_then(|params| ProgressNotificationParam::deserialize(params).ok())
                {
                    self.shared.progress(progress);
                }
                None
            }
            Incoming { method: Some(_), .. } => {
                self.pass_on(session, peer, id, text).await;
                None
            }
            _ => {
                debug!(
                    server = self.shared.name(),
                    "a message on a call's stream that is not the call's"
                );
                None
            }
        }
    }

    /// Hands a server request or notification that arrived on call `id`'s stream to the
    /// client handler; a request's answer is posted back.
    async fn pass_on(
        &self,
        session: &HttpSession,
        peer: &Arc<Peer<RoleClient>>,
        id: &RequestId,
        text: &[u8],
    ) {
        let Some(actor) = self.shared.actor.load_full() else { return };
        let handler = McpClientHandler { shared: self.shared.clone(), actor: (*actor).clone() };
        let origin = InboundStreamOrigin::OutboundRequest(id.clone());
        match serde_json::from_slice::<ServerJsonRpcMessage>(text) {
            Ok(ServerJsonRpcMessage::Notification(notification)) => {
                handler.notified(notification.notification, Some(&origin));
            }
            Ok(ServerJsonRpcMessage::Request(request)) => {
                let asked = request.id.clone();
                let mut context = RequestContext::new(asked.clone(), Peer::clone(peer));
                context.meta = request.request.get_meta().clone();
                context.extensions.insert(origin);
                let answer = match handler.handle_request(request.request, context).await {
                    Ok(result) => ClientJsonRpcMessage::response(result, asked),
                    Err(error) => ClientJsonRpcMessage::error(error, Some(asked)),
                };
                self.post_answer(session, answer).await;
            }
            Ok(_) => {}
            Err(error) => {
                debug!(server = self.shared.name(), %error, "an unreadable message on a call's stream");
            }
        }
    }

    /// Posts the answer to a server request in the session.
    async fn post_answer(&self, session: &HttpSession, answer: ClientJsonRpcMessage) {
        let Ok(body) = serde_json::to_vec(&answer) else { return };
        let mut headers = session.headers.clone();
        headers.insert(header::ACCEPT, HeaderValue::from_static(ACCEPT_BOTH));
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let url = session.endpoint.url.clone();
        let posted = self.shared.http_client().post(url).headers(headers).body(body);
        match posted.send().await {
            Ok(response) if response.status().is_success() => {}
            Ok(response) => {
                debug!(server = self.shared.name(), status = %response.status(), "an answer to a server request was refused");
            }
            Err(error) => {
                debug!(server = self.shared.name(), %error, "an answer to a server request was not delivered");
            }
        }
    }

    /// Reads a `tools/call` result: an input round when it says so, else a call result.
    fn call_result(&self, result: Value) -> Result<ServerResult, BackendError> {
        let input_required =
            result.get("resultType").and_then(Value::as_str) == Some("input_required");
        let read = if input_required {
            InputRequiredResult::deserialize(result).map(ServerResult::InputRequiredResult)
        } else {
            CallToolResult::deserialize(result).map(ServerResult::CallToolResult)
        };
        read.map_err(|error| {
            BackendError::Internal(format!(
                "mcp server {} answered tools/call with a result toolmesh cannot read: {error}",
                self.shared.name()
            ))
        })
    }

    /// A call whose request left and whose exchange broke: whether it ran is unknown, and the
    /// actor is told, which marks the connection lost at once, as a broken rmcp transport
    /// does, instead of at the next liveness probe.
    fn broke(&self, peer: &Arc<Peer<RoleClient>>, error: &reqwest::Error) -> BackendError {
        let mut chain = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            chain.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        self.broke_with(peer, chain)
    }

    fn broke_with(&self, peer: &Arc<Peer<RoleClient>>, reason: String) -> BackendError {
        let reason = format!("the call's HTTP exchange failed: {reason}");
        if let Some(actor) = self.shared.actor.load_full() {
            let broken = crate::McpMsg::Broken { peer: peer.clone(), reason: reason.clone() };
            let _ = actor.cast(broken);
        }
        BackendError::Lost { backend: format!("mcp server {}", self.shared.name()), reason }
    }

    fn unanswered(&self, why: &str) -> BackendError {
        BackendError::Lost {
            backend: format!("mcp server {}", self.shared.name()),
            reason: format!("no answer to the call: {why}"),
        }
    }
}

/// Whether `name` goes into a header as it is (visible ASCII, no space at either end),
/// which on 2026-07-28 `Mcp-Name` needs; rmcp encodes any other.
fn plain_header(name: &str) -> bool {
    let visible = name.bytes().all(|byte| (0x20..=0x7e).contains(&byte));
    let trimmed = name.trim_matches(' ').len() == name.len();
    let sentinel = name.starts_with("=?") && name.ends_with("?=");
    !name.is_empty() && visible && trimmed && !sentinel
}

/// Reads a response body of at most `limit` bytes.
async fn read(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, String> {
    let mut body =
        Vec::with_capacity(response.content_length().map_or(1024, |n| n as usize).min(limit));
    while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > limit {
            return Err(format!("the answer is over {limit} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Whether a tool's input schema names request headers of its own (SEP-2243).
pub(crate) fn names_headers(schema: &serde_json::Map<String, Value>) -> bool {
    fn any(value: &Value) -> bool {
        match value {
            Value::Object(map) => map.contains_key("x-mcp-header") || map.values().any(any),
            Value::Array(items) => items.iter().any(any),
            _ => false,
        }
    }
    schema.contains_key("x-mcp-header") || schema.values().any(any)
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, sync::Arc};

    use http::{HeaderMap, HeaderValue};
    use rmcp::model::{
        ClientJsonRpcMessage, ClientRequest, DiscoverRequest, DiscoverRequestParams, PingRequest,
        RequestId,
    };
    use serde_json::json;

    use super::{Endpoint, SessionSlot, names_headers, note, plain_header};

    fn headers(version: &'static str) -> HashMap<http::HeaderName, HeaderValue> {
        [(http::HeaderName::from_static("mcp-protocol-version"), HeaderValue::from_static(version))]
            .into()
    }

    /// The session is noted from the first message after the handshake, kept while it
    /// stays the same, and replaced by a new one; a handshake or a message without a
    /// revision changes nothing.
    #[test]
    fn the_session_is_noted_after_the_handshake() {
        let slot = SessionSlot::default();
        let base = Arc::new(Endpoint {
            url: "http://127.0.0.1:1/mcp".parse().unwrap(),
            headers: HeaderMap::new(),
        });
        let ping = |id| {
            ClientJsonRpcMessage::request(
                ClientRequest::PingRequest(PingRequest::default()),
                RequestId::Number(id),
            )
        };
        let discover = ClientJsonRpcMessage::request(
            ClientRequest::DiscoverRequest(DiscoverRequest::new(DiscoverRequestParams::default())),
            RequestId::Number(0),
        );
        note(&slot, &discover, None, &headers("2026-07-28"), &base);
        assert!(slot.load().is_none(), "a handshake names no session yet");
        note(&slot, &ping(1), None, &HashMap::new(), &base);
        assert!(slot.load().is_none(), "a message without a revision names none");

        let first: Arc<str> = "session-1".into();
        note(&slot, &ping(2), Some(&first), &headers("2025-11-25"), &base);
        let noted = slot.load_full().expect("noted");
        assert_eq!(noted.id.as_deref(), Some("session-1"));
        assert_eq!(noted.version.to_string(), "2025-11-25");
        note(&slot, &ping(3), Some(&first), &headers("2025-11-25"), &base);
        assert!(Arc::ptr_eq(&noted, &slot.load_full().unwrap()), "the same session is kept");

        let second: Arc<str> = "session-2".into();
        note(&slot, &ping(4), Some(&second), &headers("2025-11-25"), &base);
        assert_eq!(slot.load().as_ref().unwrap().id.as_deref(), Some("session-2"));
        let headers = &slot.load_full().unwrap().headers;
        assert_eq!(headers["mcp-session-id"], "session-2");
        assert_eq!(headers["mcp-protocol-version"], "2025-11-25");
    }

    #[test]
    fn names_that_go_into_a_header_as_they_are() {
        assert!(plain_header("get_weather"));
        assert!(plain_header("a tool"));
        for name in ["", " lead", "trail ", "caf\u{e9}", "tab\tbed", "=?base64?eA==?="] {
            assert!(!plain_header(name), "{name:?}");
        }
    }

    #[test]
    fn a_schema_that_names_headers_is_found() {
        let object = |value: serde_json::Value| value.as_object().unwrap().clone();
        let plain = object(json!({"type": "object", "properties": {"city": {"type": "string"}}}));
        assert!(!names_headers(&plain));
        let nested = object(json!({"type": "object", "properties": {"region": {
            "type": "object", "properties": {"code": {"type": "string", "x-mcp-header": "Region"}}
        }}}));
        assert!(names_headers(&nested));
    }
}
