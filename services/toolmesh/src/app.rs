use std::{collections::BTreeMap, sync::Arc, time::Duration};

use anyhow::Context as _;
use arc_swap::ArcSwap;
use futures::FutureExt as _;
use ractor::ActorRef;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use toolmesh_config::{Config, SectionDef, ServerConfig};
use toolmesh_core::{Health, HealthBoard, Provider, Supervised, Toolkit};
use toolmesh_identity::Authenticator;
use toolmesh_knowledge::KnowledgeHandle;
use toolmesh_mcp::McpManager;
use toolmesh_meta::MetaTools;
use toolmesh_policy::{Policy, PolicyConfig, PolicyError};
use toolmesh_registry::RegistryHandle;
use toolmesh_remote::RemoteWorkers;
use toolmesh_router::{
    Admission, CatalogConfig, DEFAULT_PROFILE, Router, RouterOptions, RoutingConfig,
};
use toolmesh_search::SearchHandle;
use toolmesh_tools::LocalTools;
use toolmesh_workers::{LocalToolInstall, WorkerPool};
use tracing::{Instrument, info, warn};

use crate::{
    api::Api,
    builtin::built_in,
    front::FrontDoor,
    plugin::{Assembly, Handles, Plugin},
    server::Front,
    supervisor::{ActorsHealth, Children, RootSupervisor},
    tls::ListenerTls,
};

/// What an embedding program (or a test) adds to the configured toolmesh: local tools,
/// standalone or in toolkits, and whole backends.
#[derive(Default)]
pub struct AppOptions {
    /// Standalone local tools.
    pub tools: Vec<LocalToolInstall>,
    /// Toolkits of local tools.
    pub toolkits: Vec<(Toolkit, Vec<LocalToolInstall>)>,
    /// Further backends, assembled after the built-in ones and like them: their sections
    /// checked, their actors supervised, their services served, their providers started,
    /// reloaded, watched and stopped.
    pub plugins: Vec<Box<dyn Plugin>>,
}

/// The built-in backends, once assembled.
struct BuiltIn {
    pool: WorkerPool,
    mcp: McpManager,
    search: SearchHandle,
    knowledge: KnowledgeHandle,
    remote: RemoteWorkers,
}

impl BuiltIn {
    fn from(handles: Handles) -> anyhow::Result<Self> {
        let missing = |name: &str| anyhow::anyhow!("the built-in {name} backend was not built");
        Ok(BuiltIn {
            pool: handles.pool.ok_or_else(|| missing("local"))?,
            mcp: handles.mcp.ok_or_else(|| missing("mcp"))?,
            search: handles.search.ok_or_else(|| missing("search"))?,
            knowledge: handles.knowledge.ok_or_else(|| missing("knowledge"))?,
            remote: handles.remote.ok_or_else(|| missing("remote"))?,
        })
    }
}

/// A running toolmesh: the backends, the router over their catalog, the front door, and
/// the health of every provider.
#[derive(Clone)]
pub struct App {
    /// What the front door serves: the router, the meta-tools, the providers' health, who
    /// may call (`[auth]`, replaced on reload), the requests in flight under a bearer
    /// credential, and the listener's TLS (`[tls]`, replaced on reload).
    served: Front,
    built_in: Arc<BuiltIn>,
    /// Every plug-in, built-in ones first.
    plugins: Arc<Vec<Box<dyn Plugin>>>,
    /// Every provider, in start order; stopped in reverse.
    providers: Arc<Vec<Arc<dyn Provider<Config>>>>,
    /// Ends the health loop.
    stop: CancellationToken,
    front: FrontDoor,
    root: ActorRef<()>,
    children: Arc<Children>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plugins: Vec<&str> = self.plugins.iter().map(|p| p.name()).collect();
        f.debug_struct("App")
            .field("plugins", &plugins)
            .field("health", &self.served.api.health)
            .finish()
    }
}

/// The configuration sections of the front door: what the operator states about tools,
/// the routing profiles, who may call, what they may do, and the listener's TLS.
const FRONT_SECTIONS: [SectionDef; 6] = [
    SectionDef::of::<CatalogConfig>(),
    SectionDef::of::<RoutingConfig>(),
    SectionDef::of::<toolmesh_mcp::McpEndpointConfig>(),
    SectionDef::of::<toolmesh_identity::AuthConfig>(),
    SectionDef::of::<PolicyConfig>(),
    SectionDef::of::<crate::tls::TlsConfig>(),
];

/// Returns every section beside the core ones: the built-in backends' in their order,
/// then the front door's.
pub fn sections() -> Vec<SectionDef> {
    sections_of(&built_in())
}

fn sections_of(plugins: &[Box<dyn Plugin>]) -> Vec<SectionDef> {
    plugins.iter().flat_map(|p| p.sections()).chain(&FRONT_SECTIONS).copied().collect()
}

/// The configuration `toolmesh config defaults` prints: every section, with its default
/// and its comments, as the crate that defines it gives them.
pub fn default_config() -> String {
    toolmesh_config::defaults_text(&sections())
}

/// Checks `config` as a start of the built-in backends and the front door does, without
/// starting anything (`toolmesh config check`): an unclaimed section, or a bad key or
/// value, is one line naming it.
pub fn check_sections(config: &Config) -> anyhow::Result<()> {
    check(config, &built_in())
}

/// Checks `config` against the front door's sections and those of `plugins`: each section
/// read as its crate reads it, then what spans sections.
fn check(config: &Config, plugins: &[Box<dyn Plugin>]) -> anyhow::Result<()> {
    let sections = sections_of(plugins);
    config.check_sections(&sections.iter().map(|section| section.name).collect::<Vec<_>>())?;
    for section in &sections {
        section.check(config)?;
    }
    crate::tls::load(config)?;
    policy_config(config)?;
    for plugin in plugins {
        plugin.check(config)?;
    }
    Ok(())
}

/// Parses and checks `[policy]`: its rules compile, and the profiles it binds exist.
fn policy_config(config: &Config) -> anyhow::Result<Option<PolicyConfig>> {
    let Some(policy) = config.find::<PolicyConfig>()? else {
        return Ok(None);
    };
    // Checked without opening the audit log: `toolmesh config check` writes nothing.
    let checked =
        PolicyConfig { audit: toolmesh_policy::AuditConfig { to: "off".into() }, ..policy.clone() };
    if let Err(error) = Policy::new(checked) {
        let (key, reason) = match error {
            PolicyError::Rule { key, reason } => (format!("policy.{key}"), reason),
            other => ("policy".to_owned(), other.to_string()),
        };
        return Err(config.key_error(&key, reason).into());
    }
    let routing: RoutingConfig = config.get()?;
    for (i, binding) in policy.profiles.iter().enumerate() {
        let known =
            binding.profile == DEFAULT_PROFILE || routing.profiles.contains_key(&binding.profile);
        if !known {
            let key = format!("policy.profiles[{i}].profile");
            let reason = format!("no routing profile `{}`", binding.profile);
            return Err(config.key_error(&key, reason).into());
        }
    }
    Ok(Some(policy))
}

/// Compiles `[policy]` (the open policy without one), opening its audit log.
fn policy(config: &Config) -> anyhow::Result<Arc<Policy>> {
    Ok(Arc::new(match policy_config(config)? {
        Some(policy) => Policy::new(policy)?,
        None => Policy::open(),
    }))
}

/// How long a provider may take to stop once the front door has drained.
const PROVIDER_STOP_GRACE: Duration = Duration::from_secs(5);

impl App {
    /// Checks `config`, starts the registry and the router, assembles every plug-in (the
    /// built-in backends, then those of `options`) and links their actors under the root
    /// supervisor, starts their providers, publishes the meta-tools, and starts the loop
    /// that publishes the providers' health.
    pub async fn start(config: &Config, options: AppOptions) -> anyhow::Result<Self> {
        let plugins: Vec<Box<dyn Plugin>> = built_in().into_iter().chain(options.plugins).collect();
        check(config, &plugins)?;
        let identity = Arc::new(ArcSwap::from_pointee(crate::auth::authenticator(config).await?));
        let tls = ListenerTls::new(crate::tls::load(config)?);
        let registry = RegistryHandle::start().await.context("starting the registry")?;
        let catalog: CatalogConfig = config.get()?;
        registry.set_overrides(catalog.overrides).await.context("starting the registry")?;
        let routing: RoutingConfig = config.get()?;
        let router = Router::new(
            registry.clone(),
            Admission::new(&routing, policy(config)?),
            RouterOptions {
                default_timeout: config.server.default_call_timeout,
                max_timeout: config.server.max_call_timeout,
                retry: config.server.retry,
                max_call_depth: config.server.max_call_depth,
            },
        );
        let local_tools = LocalTools { tools: options.tools, toolkits: options.toolkits };
        let mut assembly = Assembly::new(config, &registry, &router, local_tools)?;
        let mut providers = Vec::with_capacity(plugins.len() + 1);
        let mut actors: Vec<(&'static str, Arc<dyn Supervised>)> =
            vec![("registry", Arc::new(registry.clone()))];
        let mut services = Vec::new();
        for plugin in &plugins {
            let parts = plugin
                .build(&mut assembly)
                .await
                .with_context(|| format!("starting the {} backend", plugin.name()))?;
            providers.push(parts.provider);
            actors.extend(parts.actors);
            services.extend(parts.services);
        }
        let built_in = BuiltIn::from(assembly.handles)?;
        let meta = MetaTools::new(router.clone(), built_in.search.clone(), &routing);
        let mcp = Some(config.get::<toolmesh_mcp::McpEndpointConfig>()?).filter(|c| c.enabled);
        let api = Api {
            router,
            meta,
            health: HealthBoard::default(),
            services: Arc::new(services),
            mcp,
            servers: built_in.mcp.clone(),
        };
        let served = Front { api, identity, sessions: crate::auth::Sessions::default(), tls };
        let front =
            FrontDoor::start(served.clone(), routing).await.context("starting the front door")?;
        actors.push(("front", Arc::new(front.clone())));
        let (root, children) =
            RootSupervisor::start(actors).await.context("starting the root supervisor")?;
        providers.push(Arc::new(ActorsHealth(children.clone())));

        let app = App {
            served,
            built_in: Arc::new(built_in),
            plugins: Arc::new(plugins),
            providers: Arc::new(providers),
            stop: CancellationToken::new(),
            front,
            root,
            children,
        };
        for provider in app.providers.iter() {
            provider.start(config).await?;
        }
        info!(tools = app.registry().snapshot().len(), "tool definitions loaded");
        publish_health(&app.providers, app.health());
        tokio::spawn(
            watch_health(app.providers.clone(), app.health().clone(), app.stop.clone())
                .instrument(tracing::info_span!("health", task = "providers")),
        );
        app.meta().publish(&registry).await.context("publishing the meta-tools")?;
        Ok(app)
    }

    /// Hands `config` to every provider: the configured local tools are replaced
    /// atomically (calls in flight keep the definition they started with), the MCP servers
    /// are made to match `[[mcp.servers]]` (only added, removed or changed servers are
    /// touched), and the routing profiles of `[routing]` apply to calls that start from
    /// then on. A configuration a start would refuse changes nothing. Every provider is
    /// given the configuration even when one fails; the first failure is returned.
    pub async fn reload(&self, config: &Config) -> anyhow::Result<()> {
        check(config, &self.plugins)?;
        // Who may call, and the listener's certificates read again (a rotation): a bad
        // [auth] or [tls] fails the reload before anything changed.
        let authenticator = crate::auth::authenticator(config).await?;
        let tls = crate::tls::load(config)?;
        self.served.identity.store(Arc::new(authenticator));
        self.served.tls.replace(tls);
        // The routing profiles and the tool policy, through the front door.
        self.front.reload(config.get()?, policy(config)?).await?;
        let mut failure = None;
        for provider in self.providers.iter() {
            if let Err(error) = provider.reload(config).await {
                warn!(%error, "reload failed");
                failure.get_or_insert(error);
            }
        }
        // A worker whose credential is no longer accepted serves no further call, and no
        // request in flight under a revoked credential goes on. A certificate's principal
        // is kept: its connection's certificate was checked.
        let identity = self.served.identity.load_full();
        self.remote()
            .revoke(|principal| {
                let identity = identity.clone();
                async move {
                    let checked = crate::auth::recheck(&identity, &principal).await?;
                    Some(checked.map_err(|error| error.to_string()))
                }
            })
            .await;
        self.served.sessions.revoke(&identity).await;
        failure.map_or(Ok(()), |error| Err(error.into()))
    }

    /// Returns the configuration sections the plug-ins and the front door define.
    pub fn sections(&self) -> Vec<SectionDef> {
        sections_of(&self.plugins)
    }

    /// Returns the router.
    pub fn router(&self) -> &Router {
        &self.served.api.router
    }

    /// Returns the registry handle.
    pub fn registry(&self) -> &RegistryHandle {
        self.served.api.router.registry()
    }

    /// Returns the local worker pool.
    pub fn pool(&self) -> &WorkerPool {
        &self.built_in.pool
    }

    /// Returns the tool search.
    pub fn search(&self) -> &SearchHandle {
        &self.built_in.search
    }

    /// Returns the knowledge collections.
    pub fn knowledge(&self) -> &KnowledgeHandle {
        &self.built_in.knowledge
    }

    /// Returns the remote workers.
    pub fn remote(&self) -> &RemoteWorkers {
        &self.built_in.remote
    }

    /// Returns the meta-tools and routing profiles.
    pub fn meta(&self) -> &MetaTools {
        &self.served.api.meta
    }

    /// Returns the MCP backend.
    pub fn mcp(&self) -> &McpManager {
        &self.built_in.mcp
    }

    /// Returns every provider's health, as last published.
    pub fn health(&self) -> &HealthBoard {
        &self.served.api.health
    }

    /// Returns the root supervisor's children (`registry`, the plug-ins' actors: `workers`,
    /// `mcp`, `search`, `knowledge`, …, and the front door, `front`) and their actors now.
    pub fn actors(&self) -> Vec<(&'static str, ractor::ActorCell)> {
        self.children.actors()
    }

    /// Returns the listener's TLS in force, replaced on reload.
    pub fn tls(&self) -> &ListenerTls {
        &self.served.tls
    }

    /// Returns the authenticator in force, replaced on reload.
    pub fn identity(&self) -> &Arc<ArcSwap<Authenticator>> {
        &self.served.identity
    }

    /// Returns the requests in flight under a bearer credential.
    pub fn sessions(&self) -> &crate::auth::Sessions {
        &self.served.sessions
    }

    /// Returns the front door.
    pub(crate) fn front_door(&self) -> &FrontDoor {
        &self.front
    }

    /// Stops, in order: the root supervisor (so that nothing stopping now is restarted),
    /// the front door (a server still running), the providers, last started first (their
    /// processes and connections with them), then the registry. [`crate::serve`] drains
    /// the calls in flight before this.
    pub async fn shutdown(&self) {
        let _ = self.root.stop_and_wait(None, Some(Duration::from_secs(5))).await;
        self.front.stop().await;
        self.stop.cancel();
        for provider in self.providers.iter().rev() {
            provider.stop(PROVIDER_STOP_GRACE).await;
        }
        let registry = self.registry().actor();
        registry.stop(Some("shutdown".into()));
        // Every audit event of the calls that ran is written before the process ends.
        let policy = self.served.api.router.admission().policy().clone();
        let flushed =
            tokio::task::spawn_blocking(move || policy.audit().flush(Duration::from_secs(5))).await;
        if !matches!(flushed, Ok(true)) {
            warn!("the audit log could not be flushed within 5 s");
        }
    }
}

/// Reads every provider's health onto the board; each entry is also the
/// `toolmesh.source.up` gauge, and one that is gone is recorded 0.
fn publish_health(providers: &[Arc<dyn Provider<Config>>], board: &HealthBoard) {
    let mut entries = BTreeMap::new();
    for provider in providers {
        for (name, health) in provider.health() {
            entries.insert((provider.kind().to_owned(), name), health);
        }
    }
    // Whether spans reach the collector: a part of its own, which readiness does not
    // depend on.
    if let Some(export) = toolmesh_telemetry::export_health() {
        let (up, reason) = export.status();
        let health = if up { Health::up() } else { Health::down(reason) };
        entries.insert(("telemetry".to_owned(), "otlp".to_owned()), health);
    }
    for ((kind, name), health) in &entries {
        toolmesh_telemetry::record_source_up(kind, name, health.up);
    }
    for (kind, name) in board.snapshot().keys().filter(|key| !entries.contains_key(*key)) {
        toolmesh_telemetry::record_source_up(kind, name, false);
    }
    board.publish(entries);
}

/// Publishes every provider's health on the board, `(kind, name)` each, whenever one of
/// them says it may have changed.
async fn watch_health(
    providers: Arc<Vec<Arc<dyn Provider<Config>>>>,
    board: HealthBoard,
    stop: CancellationToken,
) {
    // `App::start` published the first board; from here on, each change.
    let export = toolmesh_telemetry::export_health();
    loop {
        let changes = providers.iter().map(|p| p.health_changed().boxed());
        let exported = async {
            match &export {
                Some(export) => export.changed().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = futures::future::select_all(changes) => {}
            () = exported => {}
            _ = stop.cancelled() => return,
        }
        publish_health(&providers, &board);
    }
}

/// Serves the API on `listener` with the limits of `config` until `shutdown` resolves;
/// then shuts down in order: the front door stops accepting and waits up to
/// `config.shutdown_grace` for calls in flight, then the providers stop (their processes
/// and connections with them). Telemetry is flushed by the caller's guard, last. Returns
/// whether every call finished within the grace period.
pub async fn serve(
    listener: TcpListener,
    app: App,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<bool> {
    let grace = config.shutdown_grace;
    let ended = app.front_door().serve(listener, config).await?;
    tokio::select! {
        // The server ended by itself: report why, after stopping what runs.
        result = ended => {
            app.shutdown().await;
            result.unwrap_or_else(|_| Err(anyhow::anyhow!("the front door stopped")))?;
            Ok(true)
        }
        () = shutdown => {
            info!("shutting down: no new calls; waiting for calls in flight");
            let drained = app.front_door().drain(grace).await;
            app.shutdown().await;
            Ok(drained)
        }
    }
}
