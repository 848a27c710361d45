//! Authentication at the front door: every request but those of the public services (health
//! and reflection by default) carries a credential the [`Authenticator`] accepts, or is
//! answered `UNAUTHENTICATED` before any service sees it. The principal travels in the
//! request's extensions as an `Arc<Principal>`.
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

/// Authenticates every request with the authenticator in force (replaced on reload).
#[derive(Debug, Clone)]
pub struct AuthLayer {
    authenticator: Arc<ArcSwap<Authenticator>>,
    sessions: Sessions,
}

impl AuthLayer {
    /// Returns the layer over `authenticator`, keeping the requests that authenticate with
    /// a bearer credential in `sessions`.
    pub fn new(authenticator: Arc<ArcSwap<Authenticator>>, sessions: Sessions) -> Self {
        AuthLayer { authenticator, sessions }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Authenticate<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authenticate {
            inner,
            authenticator: self.authenticator.clone(),
            sessions: self.sessions.clone(),
        }
    }
}

/// The service of [`AuthLayer`].
#[derive(Debug, Clone)]
pub struct Authenticate<S> {
    inner: S,
    authenticator: Arc<ArcSwap<Authenticator>>,
    sessions: Sessions,
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
        // `/package.Service/Method`.
        let service = request.uri().path().trim_start_matches('/').split('/').next();
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
                    return Ok(refused(&toolmesh_identity::AuthError::NotBearer));
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
                        return Ok(refused(&error));
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
                Err(error) => Ok(refused(&error)),
            }
        })
    }
}

fn refused(error: &toolmesh_identity::AuthError) -> http::Response<Body> {
    debug!(reason = error.kind(), "request refused: not authenticated");
    toolmesh_telemetry::record_unauthenticated(error.kind());
    tonic::Status::unauthenticated(error.to_string()).into_http()
}
