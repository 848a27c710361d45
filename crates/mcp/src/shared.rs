use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock},
};

use arc_swap::{ArcSwap, ArcSwapOption};
use rmcp::{
    RoleClient,
    model::{ProgressToken, RequestId, Tool},
    service::Peer,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::McpServerConfig;
use tokio::{
    sync::{Notify, watch},
    // tokio's clock, so that idle timeouts can be tested on a paused one.
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use toolmesh_core::EventSink;
use tracing::warn;

/// The health of one server's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerHealth {
    /// Connecting for the first time.
    Connecting,
    /// Connected, initialized, tools listed.
    Healthy,
    /// A lazy server whose connection was closed while unused; the next call opens it.
    Idle,
    /// Not connected; calls fail with UNAVAILABLE until a reconnect succeeds.
    Unhealthy {
        /// Why.
        reason: String,
    },
}

/// Returns a new HTTP client for a server's connections.
fn new_http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls_config())
        .build()
        .expect("an HTTP client with built TLS settings builds")
}

/// The TLS settings of the servers' HTTP clients: the platform's verifier over the system's
/// root certificates, HTTP/2 or HTTP/1.1 by ALPN, as reqwest builds them by default, but
/// built once per process: loading and parsing the root certificates takes milliseconds,
/// and a hundred servers would do it a hundred times at every start. Without any root
/// certificate, servers over plain HTTP still work and those over HTTPS fail to connect
/// with an unknown-issuer error.
fn tls_config() -> rustls::ClientConfig {
    static TLS: OnceLock<rustls::ClientConfig> = OnceLock::new();
    TLS.get_or_init(|| {
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("aws-lc supports TLS 1.2 and 1.3");
        let mut config = match rustls_platform_verifier::Verifier::new(provider) {
            Ok(verifier) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
                .with_no_client_auth(),
            Err(error) => {
                warn!(%error, "no trusted root certificates: MCP servers over HTTPS cannot be verified");
                builder.with_root_certificates(rustls::RootCertStore::empty()).with_no_client_auth()
            }
        };
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        config
    })
    .clone()
}

/// What the actor, its client handler and the backend of every tool of one server share.
/// Calls read the connection from here without going through the actor's mailbox.
pub(crate) struct ServerShared {
    pub(crate) config: McpServerConfig,
    pub(crate) peer: ArcSwapOption<Peer<RoleClient>>,
    /// Cancelled when the current connection is declared lost; calls in flight watch it,
    /// since a transport may never answer a request whose server died.
    pub(crate) lost: ArcSwap<CancellationToken>,
    pub(crate) health: ArcSwap<ServerHealth>,
    /// The protocol version negotiated on the current connection.
    pub(crate) protocol: ArcSwapOption<String>,
    pub(crate) since: ArcSwap<Instant>,
    /// When the last connection was lost: repeated calls wait for a new one until
    /// `reconnect_wait` after it.
    pub(crate) lost_at: Mutex<Option<Instant>>,
    /// Where each running call's progress goes, by the progress token of its request.
    pub(crate) progress: Mutex<HashMap<ProgressToken, EventSink>>,
    /// The running calls by JSON-RPC request id, for routing the server's requests
    /// (elicitations) back to the call they belong to.
    pub(crate) inflight: Mutex<HashMap<RequestId, EventSink>>,
    /// Told whenever a call registers in `inflight`: a server request that arrives before
    /// its call is registered waits for this instead of polling.
    pub(crate) registered: Notify,
    /// Told whenever any server's health changes.
    pub(crate) changed: Arc<Notify>,
    /// Counts connection attempts that ended (success or failure); calls waiting for a
    /// lazy server's connection watch it.
    pub(crate) attempts: watch::Sender<u64>,
    /// When a call last used the connection, in milliseconds since `epoch`.
    pub(crate) last_used: AtomicU64,
    pub(crate) epoch: Instant,
    /// The actor, for calls that need a lazy server connected.
    pub(crate) actor: ArcSwapOption<ractor::ActorRef<crate::McpMsg>>,
    /// One permit per call that may run at once (`max_concurrency`).
    pub(crate) slots: Arc<tokio::sync::Semaphore>,
    /// Where the server's last listing is kept, unless it is not (`remember_tools = false`,
    /// or no data directory).
    pub(crate) remembered: Option<Arc<crate::remembered::Remembered>>,
    /// The server's resources, resource templates and prompts, as last listed.
    pub(crate) offers: ArcSwap<crate::Offers>,
    /// Told when they change, and when a subscribed resource changes (shared by every
    /// server).
    pub(crate) offers_changed: Arc<crate::offers::OfferSignals>,
    /// The resources clients subscribed to, with how many subscriptions each has: the
    /// server is subscribed once per resource, and again after a reconnection.
    pub(crate) subscribed: watch::Sender<std::collections::BTreeMap<String, usize>>,
    /// The tools' pinned definitions, kept beside the remembered listing.
    pub(crate) pins: Mutex<crate::pins::Pins>,
    /// Where a changed definition is reported.
    audit: crate::DefinitionAudit,
    /// The headers of each call's own (its caller's upstream credentials), by ticket.
    pub(crate) call_headers: crate::http_client::CallHeaders,
    /// The HTTP client of the server's connections, made at the first and kept across
    /// reconnections.
    http: OnceLock<reqwest::Client>,
    /// The server answered `server/discover` with something that is no discover result:
    /// it is spoken to with `initialize` from then on.
    pub(crate) initialize_only: AtomicBool,
    /// The streamable-HTTP session of the current connection, once its client sent a
    /// message in it: calls are sent in it directly (see [`crate::direct`]).
    pub(crate) http_session: crate::direct::SessionSlot,
    /// The tools whose input schema names request headers of their own (`x-mcp-header`).
    pub(crate) param_headers: ArcSwap<std::collections::HashSet<String>>,
}

impl ServerShared {
    /// Checks a listing from the server against the pinned definitions (see
    /// [`crate::pins`]) and keeps the pins; returns the tools to publish. Blocking: the
    /// pins may be written to disk.
    pub(crate) fn check_pins(&self, tools: Vec<Tool>) -> Vec<Tool> {
        let mut pins = self.pins.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let checked = pins.check(&self.config, tools);
        let param_headers = (checked.tools.iter())
            .filter(|tool| crate::direct::names_headers(&tool.input_schema))
            .map(|tool| tool.name.to_string())
            .collect();
        self.param_headers.store(Arc::new(param_headers));
        if checked.changed
            && let Err(error) = pins.store()
        {
            warn!(server = self.name(), %error, "cannot keep the pinned tool definitions");
        }
        for change in &checked.changes {
            (self.audit)(change);
        }
        checked.tools
    }

    /// Returns the state of `config`'s server; its listing is remembered under
    /// `remember_in` unless the server opts out.
    pub(crate) fn new(
        config: McpServerConfig,
        changed: Arc<Notify>,
        offers_changed: Arc<crate::offers::OfferSignals>,
        remember_in: Option<&std::path::Path>,
        audit: crate::DefinitionAudit,
    ) -> Arc<Self> {
        let remember_in = remember_in.filter(|_| config.remember_tools);
        let remembered =
            remember_in.map(|dir| Arc::new(crate::remembered::Remembered::new(dir, &config)));
        let shared = Arc::new(ServerShared {
            remembered,
            pins: Mutex::new(crate::pins::Pins::load(remember_in, &config)),
            audit,
            offers: ArcSwap::default(),
            offers_changed,
            subscribed: watch::channel(Default::default()).0,
            call_headers: Default::default(),
            http: OnceLock::new(),
            initialize_only: AtomicBool::new(false),
            http_session: Default::default(),
            param_headers: Default::default(),
            peer: ArcSwapOption::empty(),
            lost: ArcSwap::from_pointee(CancellationToken::new()),
            health: ArcSwap::from_pointee(ServerHealth::Connecting),
            protocol: ArcSwapOption::empty(),
            since: ArcSwap::from_pointee(Instant::now()),
            lost_at: Mutex::new(None),
            progress: Mutex::new(HashMap::new()),
            inflight: Mutex::new(HashMap::new()),
            registered: Notify::new(),
            changed,
            attempts: watch::channel(0).0,
            last_used: AtomicU64::new(0),
            epoch: Instant::now(),
            actor: ArcSwapOption::empty(),
            slots: Arc::new(tokio::sync::Semaphore::new(config.max_concurrency.get())),
            config,
        });
        crate::metrics::observe_server(&shared);
        shared
    }

    /// Returns the HTTP client of the server's connections.
    pub(crate) fn http_client(&self) -> reqwest::Client {
        self.http.get_or_init(new_http_client).clone()
    }

    pub(crate) fn name(&self) -> &str {
        &self.config.name
    }

    /// Notes that a call uses the connection now.
    /// Returns the connection for a request other than a call: an idle lazy server is
    /// opened, and a server still connecting waited for, until `deadline`.
    pub(crate) async fn connection(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<Arc<Peer<RoleClient>>, String> {
        let mut attempts = self.attempts.subscribe();
        let mut asked = false;
        loop {
            if let Some(peer) = self.peer.load_full()
                && !self.lost.load().is_cancelled()
            {
                self.touch();
                return Ok(peer);
            }
            match &**self.health.load() {
                ServerHealth::Unhealthy { reason } => return Err(reason.clone()),
                ServerHealth::Idle | ServerHealth::Connecting if !asked => {
                    if let Some(actor) = self.actor.load_full() {
                        let _ = actor.cast(crate::McpMsg::Connect);
                    }
                    asked = true;
                }
                _ => {}
            }
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {
                    return Err("the server did not connect in time".into());
                }
                changed = attempts.changed() => {
                    if changed.is_err() {
                        return Err("the server is stopping".into());
                    }
                }
            }
        }
    }

    pub(crate) fn touch(&self) {
        self.last_used.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Returns how long the connection has gone without calls.
    pub(crate) fn unused_for(&self) -> std::time::Duration {
        let last = self.last_used.load(Ordering::Relaxed);
        self.epoch.elapsed().saturating_sub(std::time::Duration::from_millis(last))
    }

    pub(crate) fn set_health(&self, health: ServerHealth) {
        let changed = **self.health.load() != health;
        if changed {
            self.since.store(Arc::new(Instant::now()));
        }
        self.health.store(Arc::new(health));
        if changed {
            self.changed.notify_one();
        }
    }

    pub(crate) fn inflight_calls(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<RequestId, EventSink>> {
        self.inflight.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Passes a progress notification on to the call whose progress token it names.
    pub(crate) fn progress(&self, params: rmcp::model::ProgressNotificationParam) {
        if let Some(sink) = self.progress_sinks().get(&params.progress_token) {
            sink.progress(params.progress, params.total, params.message.unwrap_or_default());
        }
    }

    pub(crate) fn progress_sinks(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<ProgressToken, EventSink>> {
        // A poisoned map only means a panic elsewhere while holding it; the data is intact.
        self.progress.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::new_http_client;

    /// The shared TLS settings verify a server's certificate: one that no trusted root
    /// signed is refused before any request is sent.
    #[tokio::test]
    async fn an_https_servers_certificate_is_verified() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls_pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            acceptor.accept(tcp).await.map(drop)
        });
        let error = new_http_client().get(format!("https://{addr}/mcp")).send().await.unwrap_err();
        let mut chain = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            chain.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        assert!(chain.contains("UnknownIssuer"), "{chain}");
        assert!(server.await.unwrap().is_err(), "the handshake did not complete");
    }
}
