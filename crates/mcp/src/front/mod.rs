//! The MCP endpoint toolmesh serves: streamable HTTP, protocol revisions 2025-06-18,
//! 2025-11-25 and 2026-07-28, for MCP clients that do not speak toolmesh's gRPC API.
//!
//! [`Endpoint`] is an HTTP service the API layer mounts beside its gRPC services, behind
//! the same listener, TLS and authentication; it serves the tools of a [`Mesh`] (the API
//! layer's view of the router) to the principal each request authenticated as.
//!
//! Sessions are signed ([`session`]): any router replica that shares the key accepts any
//! session, so a load balancer needs no affinity. A 2026-07-28 client has no session.

mod config;
mod handler;
mod rounds;
mod sealed;
mod session;

use std::{
    convert::Infallible,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, combinators::BoxBody};
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService,
    session::{SessionId, SessionManager as _, local::LocalSessionManager},
};
use tokio_util::sync::CancellationToken;
use toolmesh_core::Principal;
use tracing::debug;

pub use config::McpEndpointConfig;
pub use handler::{Caller, Mesh, Offered, Page};

use handler::{ClientSession, Front, SESSION_HEADER};
use session::SignedSessions;

/// The body of the endpoint's responses.
pub type EndpointBody = BoxBody<Bytes, Infallible>;

/// The MCP endpoint: an HTTP service for `POST`, `GET` and `DELETE` at its path (and at
/// `<path>/<profile>`). Cheap to clone.
#[derive(Clone)]
pub struct Endpoint {
    inner: StreamableHttpService<Front, LocalSessionManager>,
    manager: Arc<LocalSessionManager>,
    sessions: Arc<SignedSessions>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("sessions", &self.sessions).finish_non_exhaustive()
    }
}

/// Largest request body the endpoint reads.
const MAX_BODY_BYTES: usize = 4 << 20;

impl Endpoint {
    /// Returns the endpoint at `path` over `mesh`, signing sessions with `key`; `stop` ends
    /// every open stream (the front door's drain).
    pub fn new(
        mesh: Arc<dyn Mesh>,
        path: &str,
        config: &McpEndpointConfig,
        key: &[u8],
        max_body_bytes: usize,
        stop: CancellationToken,
    ) -> Self {
        let sessions = Arc::new(SignedSessions::new(key, config.session_ttl));
        let manager = Arc::new(LocalSessionManager::default());
        let mut http = StreamableHttpServerConfig::default()
            .with_allowed_hosts(config.allowed_hosts.iter().cloned());
        if config.allowed_hosts.is_empty() {
            http = http.disable_allowed_hosts();
        }
        http.allowed_origins = config.allowed_origins.clone();
        http.session_store = Some(sessions.clone());
        http.max_request_body_bytes = max_body_bytes.min(MAX_BODY_BYTES);
        http.sse_keep_alive = Some(Duration::from_secs(15));
        // A request answered before anything else is said (a call without progress, a
        // listing) gets a JSON body of known length: cheaper to write and read than a
        // stream, and its connection goes back to the client's pool even when the client
        // stops reading at the answer. Anything said before the answer makes it a stream.
        http.json_response = true;
        http.cancellation_token = stop;
        let front = Front {
            mesh,
            path: Arc::from(path.trim_end_matches('/')),
            log_level: Arc::default(),
            subscriptions: Arc::default(),
            rounds: Arc::new(rounds::SignedRounds::new(key, rounds::ROUND_TTL)),
        };
        let inner =
            StreamableHttpService::new(move || Ok(front.for_session()), manager.clone(), http);
        Endpoint { inner, manager, sessions }
    }

    async fn handle<B>(self, request: Request<B>) -> Response<EndpointBody>
    where
        B: http_body::Body + Send + 'static,
        B::Data: Send + 'static,
        B::Error: std::fmt::Display,
    {
        let principal = request
            .extensions()
            .get::<Arc<Principal>>()
            .cloned()
            .unwrap_or_else(toolmesh_core::open_principal);
        let mut request = request;
        let mut ended = None;
        let presented = request.headers().get(SESSION_HEADER).cloned();
        if let Some(id) = presented.as_ref() {
            let Ok(id) = id.to_str() else {
                return session_not_found(&session::SessionError::Invalid.to_string());
            };
            if let Err(error) = self.sessions.check(id, &principal) {
                debug!(%error, "MCP request with a session this endpoint does not accept");
                return session_not_found(&error.to_string());
            }
            // An ended session is refused from now on, even by a request racing the DELETE.
            if request.method() == http::Method::DELETE {
                self.sessions.end(id);
                ended = Some(id.to_owned());
            }
            // The handlers name the session as the client does, on every replica.
            request.extensions_mut().insert(ClientSession(id.to_owned()));
            // A session opened here runs under rmcp's own id; elsewhere, or once it idled
            // out, rmcp restores it from the signed id.
            if let Some(local) = self.sessions.local_of(id) {
                if self.manager.has_session(&SessionId::from(local.clone())).await.unwrap_or(false)
                    && let Ok(local) = HeaderValue::from_str(&local)
                {
                    request.headers_mut().insert(SESSION_HEADER, local);
                } else {
                    self.sessions.forget(id);
                }
            }
        }
        let mut response = self.inner.handle(request).await;
        if let Some(id) = ended {
            self.sessions.forget(&id);
            // The session is gone, nothing is pending: what SDKs expect of a DELETE.
            if response.status() == StatusCode::ACCEPTED {
                *response.status_mut() = StatusCode::NO_CONTENT;
            }
        }
        // A handshake's response names rmcp's own session: the client gets it signed.
        if presented.is_none()
            && let Some(local) =
                response.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok())
            && let Some(signed) = self.sessions.sign(local, &principal)
            && let Ok(value) = HeaderValue::from_str(&signed)
        {
            self.sessions.alias(&signed, local);
            response.headers_mut().insert(SESSION_HEADER, value);
        }
        response
    }
}

/// `404 Not Found` for a session id the endpoint does not accept: the client starts a new
/// session.
fn session_not_found(reason: &str) -> Response<EndpointBody> {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32001, "message": format!("session not found: {reason}")},
    });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

impl<B> tower::Service<Request<B>> for Endpoint
where
    B: http_body::Body + Send + 'static,
    B::Data: Send + 'static,
    B::Error: std::fmt::Display,
{
    type Response = Response<EndpointBody>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.handle(request).await) })
    }
}
