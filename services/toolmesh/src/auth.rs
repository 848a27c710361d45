//! Authentication at the front door: every request but those of the public services (health
//! and reflection by default) carries a credential the [`Authenticator`] accepts, or is
//! answered `UNAUTHENTICATED` before any service sees it. The principal travels in the
//! request's extensions as an `Arc<Principal>`.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use arc_swap::ArcSwap;
use tonic::body::Body;
use toolmesh_config::Config;
use toolmesh_identity::{AuthConfig, Authenticator};
use tracing::debug;

/// Returns the authenticator of `config`'s `[auth]`: the open one without the section.
pub async fn authenticator(config: &Config) -> anyhow::Result<Authenticator> {
    let Some(auth) = config.section::<AuthConfig>(toolmesh_identity::SECTION)? else {
        return Ok(Authenticator::open());
    };
    let env = |name: &str| std::env::var(name).ok();
    Authenticator::new(&auth, &env).await.map_err(|(key, reason)| {
        config.key_error(&format!("{}.{key}", toolmesh_identity::SECTION), reason).into()
    })
}

/// Authenticates every request with the authenticator in force (replaced on reload).
#[derive(Debug, Clone)]
pub struct AuthLayer {
    authenticator: Arc<ArcSwap<Authenticator>>,
}

impl AuthLayer {
    /// Returns the layer over `authenticator`.
    pub fn new(authenticator: Arc<ArcSwap<Authenticator>>) -> Self {
        AuthLayer { authenticator }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Authenticate<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authenticate { inner, authenticator: self.authenticator.clone() }
    }
}

/// The service of [`AuthLayer`].
#[derive(Debug, Clone)]
pub struct Authenticate<S> {
    inner: S,
    authenticator: Arc<ArcSwap<Authenticator>>,
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
