//! The HTTP client of streamable-HTTP connections: reqwest's, plus the W3C trace context of
//! each request in the HTTP headers as well as in `params._meta`, so that HTTP middleboxes
//! and servers that read only headers join the same trace.
//!
//! A server that no longer knows a session (it restarted, say) should answer 404, which
//! rmcp takes for an expired session and recovers from: a new session, the refused request
//! sent again, and the calls whose answers went with the old session failed at once. Many
//! servers (those built on the TypeScript SDK's examples, server-everything among them)
//! answer 400 with a JSON-RPC error without an id instead, which rmcp can route to no
//! request: the request would wait for its timeout and the session would never be
//! renewed. Such an answer to a message sent in a session is taken here for the expired
//! session it is.
//!
//! A call may carry headers of its own beyond the connection's: the caller's upstream
//! credentials. The backend lends them to [`CallHeaders`] for the call's lifetime and puts
//! the ticket in `_meta`; the ticket is taken out of the message here and the headers, marked
//! sensitive, go with that request only (and with its repetition after a renewed session).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
};

use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::{
    model::{ClientJsonRpcMessage, GetMeta, JsonRpcError, JsonRpcMessage},
    transport::streamable_http_client::{
        StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
        StreamableHttpResponseLimits,
    },
};
use sse_stream::{Error as SseError, Sse};

/// Trace-context keys copied from `_meta` to HTTP headers.
const TRACE_KEYS: [&str; 2] = ["traceparent", "tracestate"];

/// The `_meta` key of the ticket of a call's own headers.
pub(crate) const HEADERS_META: &str = "io.toolmesh/headers";

/// reqwest's client for streamable HTTP, with trace headers and each call's own headers.
#[derive(Clone)]
pub struct TracingHttpClient {
    client: reqwest::Client,
    call_headers: CallHeaders,
    /// Where the session this client's messages are sent in is noted, for the calls
    /// toolmesh sends itself (see [`crate::direct`]).
    session: crate::direct::SessionSlot,
    /// The server's URL and the connection's configured headers.
    endpoint: Arc<crate::direct::Endpoint>,
}

impl TracingHttpClient {
    /// Returns the client that adds the headers lent to `call_headers` to the requests
    /// whose ticket they carry, and notes in `session` the session its messages are sent
    /// in (at `endpoint`).
    pub(crate) fn new(
        client: reqwest::Client,
        call_headers: CallHeaders,
        session: crate::direct::SessionSlot,
        endpoint: crate::direct::Endpoint,
    ) -> Self {
        TracingHttpClient { client, call_headers, session, endpoint: Arc::new(endpoint) }
    }

    /// Notes the session a message after the handshake is sent in.
    fn note(
        &self,
        message: &ClientJsonRpcMessage,
        session_id: Option<&Arc<str>>,
        headers: &HashMap<HeaderName, HeaderValue>,
    ) {
        crate::direct::note(&self.session, message, session_id, headers, &self.endpoint);
    }
}

/// Headers of one call's requests.
type Headers = Vec<(HeaderName, HeaderValue)>;

/// The headers of the calls in flight, by ticket.
#[derive(Clone, Default)]
pub(crate) struct CallHeaders {
    lent: Arc<Mutex<HashMap<u64, Headers>>>,
    next: Arc<AtomicU64>,
}

impl CallHeaders {
    /// Lends `headers` to the request that carries the returned ticket, until it is dropped.
    pub(crate) fn lend(&self, headers: Headers) -> HeadersTicket {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lent().insert(id, headers);
        HeadersTicket { desk: self.clone(), id }
    }

    fn lent(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Headers>> {
        self.lent.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A call's claim on its headers; they are forgotten when it is dropped.
pub(crate) struct HeadersTicket {
    desk: CallHeaders,
    id: u64,
}

impl HeadersTicket {
    /// The ticket's `_meta` value.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for HeadersTicket {
    fn drop(&mut self) {
        self.desk.lent().remove(&self.id);
    }
}

/// Copies the trace context of `message` into `headers`, and the call's own headers whose
/// ticket it carries (taking the ticket out of its `_meta`).
fn prepare(
    call_headers: &CallHeaders,
    mut message: ClientJsonRpcMessage,
    mut headers: HashMap<HeaderName, HeaderValue>,
) -> (ClientJsonRpcMessage, HashMap<HeaderName, HeaderValue>) {
    if let JsonRpcMessage::Request(request) = &mut message {
        prepare_meta(call_headers, request.request.get_meta_mut(), &mut headers);
    }
    (message, headers)
}

/// Copies the trace context of a request's `meta` into `headers`, and the call's own
/// headers whose ticket it carries (taking the ticket out).
pub(crate) fn prepare_meta(
    call_headers: &CallHeaders,
    meta: &mut rmcp::model::RequestMetaObject,
    headers: &mut HashMap<HeaderName, HeaderValue>,
) {
    for key in TRACE_KEYS {
        if let Some(serde_json::Value::String(value)) = meta.0.0.get(key)
            && let Ok(value) = HeaderValue::from_str(value)
        {
            headers.insert(HeaderName::from_static(key), value);
        }
    }
    if let Some(ticket) = meta.0.0.remove(HEADERS_META).and_then(|v| v.as_u64())
        && let Some(lent) = call_headers.lent().get(&ticket)
    {
        for (name, value) in lent {
            headers.insert(name.clone(), value.clone());
        }
    }
}

type PostResult = Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>>;

/// Takes an id-less error answering a message sent in a session for a refused session.
fn session_refused(in_session: bool, result: PostResult) -> PostResult {
    match result {
        Ok(StreamableHttpPostResponse::Json(
            JsonRpcMessage::Error(JsonRpcError { id: None, error, .. }),
            _,
        )) if in_session => {
            tracing::debug!(?error, "the server refused the session; starting a new one");
            Err(StreamableHttpError::SessionExpired)
        }
        other => other,
    }
}
type StreamResult =
    Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<reqwest::Error>>;

impl StreamableHttpClient for TracingHttpClient {
    type Error = reqwest::Error;

    fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = PostResult> + Send + '_ {
        let (message, headers) = prepare(&self.call_headers, message, custom_headers);
        self.note(&message, session_id.as_ref(), &headers);
        let in_session = session_id.is_some();
        async move {
            let result =
                self.client.post_message(uri, message, session_id, auth_header, headers).await;
            session_refused(in_session, result)
        }
    }

    fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> impl Future<Output = PostResult> + Send + '_ {
        let (message, headers) = prepare(&self.call_headers, message, custom_headers);
        self.note(&message, session_id.as_ref(), &headers);
        let in_session = session_id.is_some();
        async move {
            let result = self
                .client
                .post_message_with_max_sse_event_size(
                    uri,
                    message,
                    session_id,
                    auth_header,
                    headers,
                    max_sse_event_size,
                )
                .await;
            session_refused(in_session, result)
        }
    }

    fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> impl Future<Output = PostResult> + Send + '_ {
        let (message, headers) = prepare(&self.call_headers, message, custom_headers);
        self.note(&message, session_id.as_ref(), &headers);
        let in_session = session_id.is_some();
        async move {
            let result = self
                .client
                .post_message_with_response_limits(
                    uri,
                    message,
                    session_id,
                    auth_header,
                    headers,
                    limits,
                )
                .await;
            session_refused(in_session, result)
        }
    }

    fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = Result<(), StreamableHttpError<Self::Error>>> + Send + '_ {
        self.client.delete_session(uri, session_id, auth_header, custom_headers)
    }

    fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = StreamResult> + Send + '_ {
        self.client.get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
    }

    fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> impl Future<Output = StreamResult> + Send + '_ {
        self.client.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            auth_header,
            custom_headers,
            max_sse_event_size,
        )
    }
}
