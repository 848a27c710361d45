use std::{collections::BTreeMap, sync::Arc, time::Duration};

use anyhow::Context as _;
use arc_swap::ArcSwap;
use futures::FutureExt as _;
use ractor::ActorRef;
use tokio_util::sync::CancellationToken;
use toolmesh_config::Config;
use toolmesh_core::{HealthBoard, Provider, Toolkit};
use toolmesh_identity::Authenticator;

use crate::tls::ListenerTls;
use toolmesh_knowledge::{KnowledgeHandle, KnowledgeProvider, unknown_store};
use toolmesh_mcp::McpManager;
use toolmesh_meta::MetaTools;
use toolmesh_policy::{Policy, PolicyConfig, PolicyError};
use toolmesh_registry::RegistryHandle;
use toolmesh_remote::RemoteWorkers;
use toolmesh_router::{Admission, Router, RouterOptions};
use toolmesh_search::{SearchHandle, SearchProvider};
use toolmesh_tools::{LocalProvider, LocalTools};
use toolmesh_vector::{VectorConfig, VectorProvider};
use toolmesh_workers::{LocalToolInstall, WorkerPool};
use tracing::{Instrument, info, warn};

use crate::{
    front::FrontDoor,
    supervisor::{ActorsHealth, Children, RootSupervisor},
};

/// What an embedding program (or a test) adds to the configured toolmesh: local tools,
/// standalone or in toolkits, and whole providers of tools.
#[derive(Default)]
pub struct AppOptions {
    /// Standalone local tools.
    pub tools: Vec<LocalToolInstall>,
    /// Toolkits of local tools.
    pub toolkits: Vec<(Toolkit, Vec<LocalToolInstall>)>,
    /// Further providers, each made over the registry, then started, reloaded, watched
    /// and stopped like the built-in ones.
    pub providers: Vec<ProviderFactory>,
}

/// Makes a provider over the catalog it publishes to.
pub type ProviderFactory = Box<dyn FnOnce(&RegistryHandle) -> Arc<dyn Provider<Config>> + Send>;

/// A running toolmesh: the providers of tools, the router over their catalog, and the
/// health of every provider.
#[derive(Clone)]
pub struct App {
    router: Router,
    meta: MetaTools,
    local: Arc<LocalProvider>,
    mcp: McpManager,
    search: SearchHandle,
    knowledge: KnowledgeHandle,
    remote: RemoteWorkers,
    /// Every provider, in start order; stopped in reverse.
    providers: Arc<Vec<Arc<dyn Provider<Config>>>>,
    health: HealthBoard,
    /// Ends the health loop.
    stop: CancellationToken,
    front: FrontDoor,
    root: ActorRef<()>,
    children: Arc<Children>,
    /// Who requests run as (`[auth]`), replaced on reload.
    identity: Arc<ArcSwap<Authenticator>>,
    /// The requests in flight under a bearer credential, ended when a reload revokes it.
    sessions: crate::auth::Sessions,
    /// The listener's TLS (`[tls]`), replaced on reload.
    tls: ListenerTls,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds: Vec<&str> = self.providers.iter().map(|p| p.kind()).collect();
        f.debug_struct("App").field("providers", &kinds).field("health", &self.health).finish()
    }
}

/// The configuration sections that providers built into toolmesh define themselves.
pub const SECTIONS: &[&str] = &[
    toolmesh_vector::SECTION,
    toolmesh_knowledge::SECTION,
    toolmesh_remote::SECTION,
    toolmesh_identity::SECTION,
    toolmesh_policy::SECTION,
    crate::tls::SECTION,
];

/// Parses and checks the sections of [`SECTIONS`], as `toolmesh config check` and a start
/// do: a bad key or value is one line naming it.
pub fn check_sections(config: &Config) -> anyhow::Result<()> {
    config.check_sections(SECTIONS)?;
    let vector = vector_config(config)?;
    let knowledge = KnowledgeProvider::section(config)?;
    RemoteWorkers::section(config)?;
    config.section::<toolmesh_identity::AuthConfig>(toolmesh_identity::SECTION)?;
    crate::tls::load(config)?;
    policy_config(config)?;
    let stores: Vec<&str> = std::iter::once(toolmesh_core::VectorStores::DEFAULT)
        .chain(vector.stores.keys().map(String::as_str))
        .collect();
    for (i, collection) in knowledge.collections.iter().enumerate() {
        if let Some(name) = collection.store.as_deref().filter(|name| !stores.contains(name)) {
            let key = format!("knowledge.collections[{i}].store");
            return Err(config.key_error(&key, unknown_store(name, &stores)).into());
        }
    }
    Ok(())
}

/// Parses and checks `[policy]`: its rules compile, and the profiles it binds exist.
fn policy_config(config: &Config) -> anyhow::Result<Option<PolicyConfig>> {
    let Some(policy) = config.section::<PolicyConfig>(toolmesh_policy::SECTION)? else {
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
    for (i, binding) in policy.profiles.iter().enumerate() {
        let known = binding.profile == toolmesh_config::DEFAULT_PROFILE
            || config.routing.profiles.contains_key(&binding.profile);
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

fn vector_config(config: &Config) -> anyhow::Result<VectorConfig> {
    let vector: VectorConfig = config.section(toolmesh_vector::SECTION)?.unwrap_or_default();
    vector.validate().map_err(|(key, reason)| config.key_error(&key, reason))?;
    Ok(vector)
}

/// Opens the vector stores `[vector]` names: the embedded engine under the data directory,
/// or a Qdrant server; the default one and each of `[vector.stores.NAME]`.
async fn open_stores(config: &Config) -> anyhow::Result<toolmesh_core::VectorStores> {
    let vector = vector_config(config)?;
    let data_dir = config
        .server
        .data_dir
        .clone()
        .context("no data directory: set --data-dir, server.data_dir, XDG_DATA_HOME or HOME")?;
    let stores = toolmesh_vector::open_all(&vector, &data_dir).await?;
    for (name, store) in stores.all() {
        let name = name.unwrap_or(toolmesh_core::VectorStores::DEFAULT);
        info!(name, store = %store.describe(), "vector store open");
    }
    Ok(stores)
}

/// How long a provider may take to stop once the front door has drained.
const PROVIDER_STOP_GRACE: Duration = Duration::from_secs(5);

impl App {
    /// Starts the registry, every provider (local tools, MCP servers, the search index,
    /// then those of `options`), the meta-tools, and the loop that publishes the providers'
    /// health.
    pub async fn start(config: &Config, options: AppOptions) -> anyhow::Result<Self> {
        let identity = Arc::new(ArcSwap::from_pointee(crate::auth::authenticator(config).await?));
        let tls = ListenerTls::new(crate::tls::load(config)?);
        let registry = RegistryHandle::start().await.context("starting the registry")?;
        let router = Router::new(
            registry.clone(),
            Admission::new(&config.routing, policy(config)?),
            RouterOptions {
                default_timeout: config.server.default_call_timeout,
                max_timeout: config.server.max_call_timeout,
                retry: config.server.retry,
                max_call_depth: config.server.max_call_depth,
            },
        );
        let embedded = LocalTools { tools: options.tools, toolkits: options.toolkits };
        let local =
            Arc::new(LocalProvider::new(&config.workers, registry.clone(), embedded).await?);
        // MCP servers' last listings live beside the vector store, in the data directory.
        let remember_in = config.server.data_dir.as_ref().map(|dir| dir.join("mcp"));
        let mcp = McpManager::start(registry.clone(), remember_in)
            .await
            .map_err(|e| anyhow::anyhow!("cannot start the mcp supervisor: {e}"))?;
        // Both read from disk on blocking threads: opening the stores (every collection's
        // points) and loading the model are a start's two longest steps before the tools
        // are listed, and neither needs the other.
        let (stores, model) = tokio::join!(open_stores(config), SearchProvider::load_model(config));
        let vector = Arc::new(VectorProvider::new(stores?));
        let search = Arc::new(
            SearchProvider::from_config(registry.clone(), config, vector.store().clone(), model)
                .await?,
        );
        let knowledge = KnowledgeHandle::start(
            vector.stores().clone(),
            search.handle().embedder(),
            registry.clone(),
        )
        .await
        .context("starting the retriever")?;
        let remote = RemoteWorkers::new(registry.clone());
        let (root, children) = RootSupervisor::start(vec![
            ("registry", Arc::new(registry.clone())),
            ("workers", Arc::new(local.pool().clone())),
            ("mcp", Arc::new(mcp.clone())),
            ("search", search.clone()),
            ("knowledge", Arc::new(knowledge.clone())),
        ])
        .await
        .context("starting the root supervisor")?;
        let mut providers: Vec<Arc<dyn Provider<Config>>> = vec![
            local.clone(),
            Arc::new(mcp.clone()),
            vector.clone(),
            search.clone(),
            Arc::new(KnowledgeProvider::new(knowledge.clone())),
            Arc::new(remote.clone()),
            Arc::new(ActorsHealth(children.clone())),
        ];
        providers.extend(options.providers.into_iter().map(|make| make(&registry)));
        let front = FrontDoor::start(router.clone(), config.routing.clone())
            .await
            .context("starting the front door")?;

        let meta = MetaTools::new(router.clone(), search.handle().clone(), &config.routing);
        let app = App {
            router,
            meta,
            local,
            mcp,
            search: search.handle().clone(),
            knowledge,
            remote,
            providers: Arc::new(providers),
            health: HealthBoard::default(),
            stop: CancellationToken::new(),
            front,
            root,
            children,
            identity,
            sessions: crate::auth::Sessions::default(),
            tls,
        };
        config.check_sections(&app.sections())?;
        for provider in app.providers.iter() {
            provider.start(config).await?;
        }
        info!(tools = app.registry().snapshot().len(), "tool definitions loaded");
        publish_health(&app.providers, &app.health);
        tokio::spawn(
            watch_health(app.providers.clone(), app.health.clone(), app.stop.clone())
                .instrument(tracing::info_span!("health", task = "providers")),
        );
        app.meta.publish(&registry).await.context("publishing the meta-tools")?;
        Ok(app)
    }

    /// Hands `config` to every provider: the configured local tools are replaced
    /// atomically (calls in flight keep the definition they started with), the MCP servers
    /// are made to match `[[mcp.servers]]` (only added, removed or changed servers are
    /// touched), and the routing profiles of `[routing]` apply to calls that start from
    /// then on. Every provider is given the configuration even when one fails; the first
    /// failure is returned.
    pub async fn reload(&self, config: &Config) -> anyhow::Result<()> {
        config.check_sections(&self.sections())?;
        // Who may call, and the listener's certificates read again (a rotation): a bad
        // [auth] or [tls] fails the reload before anything changed.
        let authenticator = crate::auth::authenticator(config).await?;
        let tls = crate::tls::load(config)?;
        self.identity.store(Arc::new(authenticator));
        self.tls.replace(tls);
        // The routing profiles and the tool policy, through the front door.
        self.front.reload(config.routing.clone(), policy(config)?).await?;
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
        let identity = self.identity.load_full();
        self.remote
            .revoke(|principal| {
                let identity = identity.clone();
                async move {
                    let checked = crate::auth::recheck(&identity, &principal).await?;
                    Some(checked.map_err(|error| error.to_string()))
                }
            })
            .await;
        self.sessions.revoke(&identity).await;
        failure.map_or(Ok(()), |error| Err(error.into()))
    }

    /// Returns the configuration sections the providers and the front door define.
    pub fn sections(&self) -> Vec<&'static str> {
        self.providers
            .iter()
            .filter_map(|p| p.section())
            .chain([toolmesh_identity::SECTION, toolmesh_policy::SECTION, crate::tls::SECTION])
            .collect()
    }

    /// Returns the router.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Returns the registry handle.
    pub fn registry(&self) -> &RegistryHandle {
        self.router.registry()
    }

    /// Returns the local worker pool.
    pub fn pool(&self) -> &WorkerPool {
        self.local.pool()
    }

    /// Returns the tool search.
    pub fn search(&self) -> &SearchHandle {
        &self.search
    }

    /// Returns the knowledge collections.
    pub fn knowledge(&self) -> &KnowledgeHandle {
        &self.knowledge
    }

    /// Returns the remote workers.
    pub fn remote(&self) -> &RemoteWorkers {
        &self.remote
    }

    /// Returns the meta-tools and routing profiles.
    pub fn meta(&self) -> &MetaTools {
        &self.meta
    }

    /// Returns the MCP backend.
    pub fn mcp(&self) -> &McpManager {
        &self.mcp
    }

    /// Returns every provider's health, as last published.
    pub fn health(&self) -> &HealthBoard {
        &self.health
    }

    /// Returns the root supervisor's children (`registry`, `workers`, `mcp`, `search`, `knowledge`)
    /// and their actors now.
    pub fn actors(&self) -> Vec<(&'static str, ractor::ActorCell)> {
        self.children.actors()
    }

    /// Returns the listener's TLS in force, replaced on reload.
    pub fn tls(&self) -> &ListenerTls {
        &self.tls
    }

    /// Returns the authenticator in force, replaced on reload.
    pub fn identity(&self) -> &Arc<ArcSwap<Authenticator>> {
        &self.identity
    }

    /// Returns the requests in flight under a bearer credential.
    pub fn sessions(&self) -> &crate::auth::Sessions {
        &self.sessions
    }

    /// Returns the front door.
    pub(crate) fn front_door(&self) -> &FrontDoor {
        &self.front
    }

    /// Stops, in order: the front door (a server still running), the root supervisor (so
    /// that nothing stopping now is restarted), the providers, last started first (their
    /// processes and connections with them), then the registry. [`crate::serve`] drains
    /// the calls in flight before this.
    pub async fn shutdown(&self) {
        self.front.stop().await;
        let _ = self.root.stop_and_wait(None, Some(Duration::from_secs(5))).await;
        self.stop.cancel();
        for provider in self.providers.iter().rev() {
            provider.stop(PROVIDER_STOP_GRACE).await;
        }
        let registry = self.registry().actor();
        registry.stop(Some("shutdown".into()));
        // Every audit event of the calls that ran is written before the process ends.
        let policy = self.router.admission().policy().clone();
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
    loop {
        let changes = providers.iter().map(|p| p.health_changed().boxed());
        tokio::select! {
            _ = futures::future::select_all(changes) => {}
            _ = stop.cancelled() => return,
        }
        publish_health(&providers, &board);
    }
}
