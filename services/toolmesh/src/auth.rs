//! Authentication at the front door: every request but those of the public services (health
//! and reflection by default) carries a credential the [`Authenticator`] accepts, or is
//! answered `UNAUTHENTICATED` before any service sees it. The principal travels in the
//! request's extensions as an `Arc<Principal>`.
//!
//! The MCP endpoint is authenticated the same way, as HTTP: a request without an accepted
//! credential gets `401 Unauthorized` with a `WWW-Authenticate` challenge that names the
//! endpoint's OAuth protected-resource metadata (RFC 9728), which [`resource_metadata`]
//! serves and which names the configured token issuers as authorization servers.
//!
//! A request that authenticated with a bearer credential (an API key or a token) is a
//! [`Session`] while its response streams: a reload that no longer accepts the credential
//! ([`Sessions::revoke`]) ends it, whatever the RPC (a streamed call, a unary call in
//! flight, an ingestion, a worker's session), with `UNAUTHENTICATED`.

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, OnceLock, PoisonError},
    task::{Context, Poll},
};

use arc_swap::ArcSwap;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::body::Body;
use toolmesh_config::Config;
use toolmesh_core::Principal;
use toolmesh_identity::{AuthConfig, AuthError, Authenticator};
use tracing::{debug, info};

/// Returns the authenticator of `config`'s `[auth]`: the open one without the section.
pub async fn authenticator(config: &Config) -> anyhow::Result<Authenticator> {
    let Some(auth) = config.find::<AuthConfig>()? else {
        return Ok(Authenticator::open());
    };
    let env = |name: &str| std::env::var(name).ok();
    Authenticator::new(&auth, &env).await.map_err(|(key, reason)| {
        config.key_error(&format!("{}.{key}", toolmesh_identity::SECTION), reason).into()
    })
}

/// Checks again the bearer credential `principal` authenticated with: the principal it is
/// now, or why `authenticator` refuses it. `None` for a principal without one (a
/// certificate's, the anonymous one), and for a token that merely expired: a session
/// outlives its token's expiry, as it does without a reload.
pub async fn recheck(
    authenticator: &Authenticator,
    principal: &Principal,
) -> Option<Result<Arc<Principal>, AuthError>> {
    let secret = principal.credential.as_ref()?;
    let value = format!("Bearer {}", secret.expose());
    match authenticator.authenticate(Some(&value), None).await {
        Err(AuthError::Expired) => None,
        checked => Some(checked),
    }
}

/// Why `authenticator` no longer accepts the bearer credential `principal` authenticated
/// with (see [`recheck`]).
pub async fn refusal(authenticator: &Authenticator, principal: &Principal) -> Option<AuthError> {
    recheck(authenticator, principal).await?.err()
}

/// The requests in flight that authenticated with a bearer credential.
#[derive(Debug, Clone, Default)]
pub struct Sessions {
    open: Arc<Mutex<OpenSessions>>,
}

#[derive(Debug, Default)]
struct OpenSessions {
    next: u64,
    by_id: HashMap<u64, (Arc<Principal>, Arc<Revocation>)>,
}

/// How a session is ended: the reason, then the token that wakes it.
#[derive(Debug, Default)]
struct Revocation {
    reason: OnceLock<String>,
    token: CancellationToken,
}

impl Revocation {
    fn status(&self) -> tonic::Status {
        let reason = self.reason.get().map_or("revoked", String::as_str);
        tonic::Status::unauthenticated(format!("the credential was revoked: {reason}"))
    }
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, OpenSessions> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn open(&self, principal: Arc<Principal>) -> Session {
        let revocation = Arc::new(Revocation::default());
        let mut open = self.lock();
        let id = open.next;
        open.next += 1;
        open.by_id.insert(id, (principal, revocation.clone()));
        Session { sessions: self.clone(), id, revocation }
    }

    /// Ends every session whose credential `authenticator` refuses (see [`refusal`]);
    /// each distinct credential is checked once. Returns how many ended.
    pub async fn revoke(&self, authenticator: &Authenticator) -> usize {
        let open: Vec<_> = self.lock().by_id.values().cloned().collect();
        let mut verdicts: HashMap<String, Option<String>> = HashMap::new();
        let mut ended = 0;
        for (principal, revocation) in open {
            let Some(secret) = principal.credential.as_ref() else { continue };
            let verdict = match verdicts.get(secret.expose()) {
                Some(verdict) => verdict.clone(),
                None => {
                    let verdict =
                        refusal(authenticator, &principal).await.map(|error| error.to_string());
                    verdicts.insert(secret.expose().to_owned(), verdict.clone());
                    verdict
                }
            };
            if let Some(reason) = verdict {
                let _ = revocation.reason.set(reason);
                revocation.token.cancel();
                ended += 1;
            }
        }
        if ended > 0 {
            info!(ended, "requests in flight ended: their credential is no longer accepted");
        }
        ended
    }
}

/// One request in flight under a bearer credential; forgotten when dropped.
#[derive(Debug)]
struct Session {
    sessions: Sessions,
    id: u64,
    revocation: Arc<Revocation>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.sessions.lock().by_id.remove(&self.id);
    }
}

/// A response body that ends with `UNAUTHENTICATED` trailers once its session is revoked,
/// dropping the service's body (which ends the call behind it).
struct Revocable {
    body: Option<Body>,
    revoked: Pin<Box<WaitForCancellationFutureOwned>>,
    session: Session,
}

impl http_body::Body for Revocable {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let Some(body) = this.body.as_mut() else { return Poll::Ready(None) };
        if this.revoked.as_mut().poll(cx).is_ready() {
            this.body = None;
            let mut trailers = http::HeaderMap::new();
            let _ = this.session.revocation.status().add_header(&mut trailers);
            return Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers))));
        }
        let frame = Pin::new(body).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            this.body = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(http_body::Body::is_end_stream)
    }
}

/// Where the MCP endpoint is served, for its challenges and its resource metadata.
#[derive(Debug, Clone)]
pub struct McpResource {
    /// The endpoint's path, `/mcp`.
    pub path: &'static str,
    /// The endpoint's public base URL (`mcp_endpoint.public_url` without the path); `None`:
    /// the scheme and `Host` of each request.
    pub public_url: Option<String>,
    /// Whether the listener serves TLS (the scheme of a URL made from `Host`).
    pub https: bool,
}

/// The path of the protected-resource metadata (RFC 9728, section 3).
pub(crate) const RESOURCE_METADATA: &str = "/.well-known/oauth-protected-resource";

impl McpResource {
    /// Returns whether `path` is the endpoint's (or one of its profiles').
    fn serves(&self, path: &str) -> bool {
        path.strip_prefix(self.path).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }

    /// The base URL of `request`'s server: the configured one, or the request's own.
    fn base<B>(&self, request: &http::Request<B>) -> String {
        if let Some(url) = &self.public_url {
            return url.clone();
        }
        let host = request
            .headers()
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok())
            .or_else(|| request.uri().authority().map(http::uri::Authority::as_str))
            .unwrap_or("localhost");
        format!("{}://{host}", if self.https { "https" } else { "http" })
    }

    /// The URL of the metadata of the endpoint at `base`.
    fn metadata_url(&self, base: &str) -> String {
        format!("{base}{RESOURCE_METADATA}{}", self.path)
    }
}

/// Answers `GET /.well-known/oauth-protected-resource[/mcp]`: the MCP endpoint as an OAuth
/// protected resource whose tokens the configured JWT issuers grant.
pub(crate) fn resource_metadata<B>(
    request: &http::Request<B>,
    resource: &McpResource,
    authenticator: &Authenticator,
) -> http::Response<Body> {
    let base = resource.base(request);
    let document = serde_json::json!({
        "resource": format!("{base}{}", resource.path),
        "authorization_servers": authenticator.issuers().collect::<Vec<_>>(),
        "bearer_methods_supported": ["header"],
        "resource_name": "toolmesh",
    });
    let mut response = http::Response::new(Body::new(http_body_util::Full::new(
        bytes::Bytes::from(document.to_string()),
    )));
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    response
}

/// Authenticates every request with the authenticator in force (replaced on reload).
#[derive(Debug, Clone)]
pub struct AuthLayer {
    authenticator: Arc<ArcSwap<Authenticator>>,
    sessions: Sessions,
    mcp: Option<Arc<McpResource>>,
}

impl AuthLayer {
    /// Returns the layer over `authenticator`, keeping the requests that authenticate with
    /// a bearer credential in `sessions`; the MCP endpoint at `mcp` is answered as HTTP.
    pub fn new(
        authenticator: Arc<ArcSwap<Authenticator>>,
        sessions: Sessions,
        mcp: Option<McpResource>,
    ) -> Self {
        AuthLayer { authenticator, sessions, mcp: mcp.map(Arc::new) }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Authenticate<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authenticate {
            inner,
            authenticator: self.authenticator.clone(),
            sessions: self.sessions.clone(),
            mcp: self.mcp.clone(),
        }
    }
}

/// The service of [`AuthLayer`].
#[derive(Debug, Clone)]
pub struct Authenticate<S> {
    inner: S,
    authenticator: Arc<ArcSwap<Authenticator>>,
    sessions: Sessions,
    mcp: Option<Arc<McpResource>>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> tower::Service<http::Request<Body>> for Authenticate<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        let authenticator = self.authenticator.load_full();
        let path = request.uri().path();
        // The metadata that tells an MCP client where to get a token needs none.
        if let Some(mcp) = &self.mcp
            && path
                .strip_prefix(RESOURCE_METADATA)
                .is_some_and(|rest| rest.is_empty() || rest == mcp.path)
        {
            let response = resource_metadata(&request, mcp, &authenticator);
            return Box::pin(async move { Ok(response) });
        }
        // The MCP endpoint's refusals are HTTP's, with a challenge naming that metadata.
        let challenge = self
            .mcp
            .as_ref()
            .filter(|mcp| mcp.serves(path))
            .map(|mcp| mcp.metadata_url(&mcp.base(&request)));
        // `/package.Service/Method`.
        let service = path.trim_start_matches('/').split('/').next();
        if !authenticator.enforced() {
            request.extensions_mut().insert(toolmesh_core::open_principal());
            return Box::pin(self.inner.call(request));
        }
        let public = authenticator.is_public(service.unwrap_or_default());
        // The service that was made ready answers this request; a clone waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let sessions = self.sessions.clone();
        let in_force = self.authenticator.clone();
        Box::pin(async move {
            let authorization =
                request.headers().get(http::header::AUTHORIZATION).map(|value| value.to_str());
            let authorization = match authorization {
                None => None,
                Some(Ok(value)) => Some(value),
                Some(Err(_)) => {
                    return Ok(refused(&toolmesh_identity::AuthError::NotBearer, challenge));
                }
            };
            // The client certificate the listener's TLS handshake verified.
            let connection = request.extensions().get::<crate::ConnectionInfo>();
            let certificate = connection.and_then(|info| info.certificate.as_ref());
            // A public service takes requests without a credential, as the configured
            // anonymous principal or as nobody; a credential that is sent is checked all
            // the same, and one that fails is refused.
            let credential = authorization.is_some()
                || certificate.is_some() && authenticator.takes_certificates();
            match authenticator.authenticate(authorization, certificate).await {
                Ok(principal) if principal.credential.is_some() => {
                    let session = sessions.open(principal.clone());
                    // A reload between the check and the session's opening: the revocation
                    // may have missed it, so the credential is checked again.
                    let now = in_force.load_full();
                    if !Arc::ptr_eq(&now, &authenticator)
                        && let Some(error) = refusal(&now, &principal).await
                    {
                        return Ok(refused(&error, challenge));
                    }
                    request.extensions_mut().insert(principal);
                    let revoked = session.revocation.token.clone().cancelled_owned();
                    let mut revoked = Box::pin(revoked);
                    tokio::select! {
                        response = inner.call(request) => Ok(response?.map(|body| {
                            Body::new(Revocable { body: Some(body), revoked, session })
                        })),
                        () = revoked.as_mut() => Ok(session.revocation.status().into_http()),
                    }
                }
                Ok(principal) => {
                    request.extensions_mut().insert(principal);
                    inner.call(request).await
                }
                Err(_) if public && !credential => {
                    request.extensions_mut().insert(toolmesh_core::NoPrincipal);
                    inner.call(request).await
                }
                Err(error) => Ok(refused(&error, challenge)),
            }
        })
    }
}

/// The refusal of a request that did not authenticate: gRPC's `UNAUTHENTICATED`, or for
/// the MCP endpoint (`challenge` is its metadata URL) `401` with a bearer challenge.
fn refused(
    error: &toolmesh_identity::AuthError,
    challenge: Option<String>,
) -> http::Response<Body> {
    debug!(reason = error.kind(), "request refused: not authenticated");
    toolmesh_telemetry::record_unauthenticated(error.kind());
    let Some(metadata) = challenge else {
        return tonic::Status::unauthenticated(error.to_string()).into_http();
    };
    unauthorized(error, &metadata)
}

/// `401 Unauthorized` for `error`, with a bearer challenge (RFC 6750) naming the protected
/// resource's `metadata` (RFC 9728, section 5.1); the body says the same as JSON.
fn unauthorized(error: &toolmesh_identity::AuthError, metadata: &str) -> http::Response<Body> {
    let reason = error.to_string().replace('"', "'");
    // No error code for a request that sent no credential (RFC 6750, section 3.1).
    let challenge = match error {
        toolmesh_identity::AuthError::Missing => {
            format!(r#"Bearer realm="toolmesh", resource_metadata="{metadata}""#)
        }
        _ => format!(
            r#"Bearer realm="toolmesh", error="invalid_token", error_description="{reason}", resource_metadata="{metadata}""#
        ),
    };
    let body = serde_json::json!({"error": "unauthorized", "error_description": error.to_string()});
    let mut response = http::Response::new(Body::new(http_body_util::Full::new(
        bytes::Bytes::from(body.to_string()),
    )));
    *response.status_mut() = http::StatusCode::UNAUTHORIZED;
    let headers = response.headers_mut();
    headers.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    if let Ok(value) = http::HeaderValue::from_str(&challenge) {
        headers.insert(http::header::WWW_AUTHENTICATE, value);
    }
    response
}
