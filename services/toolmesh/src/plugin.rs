//! The plug-in seam: what a backend brings to the app. The app assembles every plug-in of
//! [`built_in`](crate::built_in) and of [`AppOptions`](crate::AppOptions) the same way: it
//! checks their sections, builds them in order, links their actors under the root
//! supervisor, serves their gRPC services (with a health entry each), starts, reloads and
//! stops their providers, and publishes their health.

use std::sync::Arc;

use futures::FutureExt as _;

use tokio_util::sync::CancellationToken;
use toolmesh_config::{Config, SectionDef};
use toolmesh_core::{Provider, Supervised, VectorStores};
use toolmesh_embed::Embedder;
use toolmesh_knowledge::KnowledgeHandle;
use toolmesh_mcp::McpManager;
use toolmesh_registry::RegistryHandle;
use toolmesh_remote::RemoteWorkers;
use toolmesh_router::Router;
use toolmesh_search::{SearchConfig, SearchHandle};
use toolmesh_tools::LocalTools;
use toolmesh_workers::WorkerPool;

/// One backend, as the app assembles it.
#[async_trait::async_trait]
pub trait Plugin: Send + Sync + 'static {
    /// Its name, as errors and logs give it.
    fn name(&self) -> &'static str;

    /// The sections of the configuration file it defines, each a
    /// [`Section`](toolmesh_config::Section) of its crate: read with `Config::get`, checked
    /// before every start and reload and by `toolmesh config check`, and printed with its
    /// defaults by `toolmesh config defaults`. A section that no plug-in claims is refused
    /// as a misspelt key is.
    fn sections(&self) -> &'static [SectionDef] {
        &[]
    }

    /// Checks what spans sections (its own are read before), so that `toolmesh config
    /// check` and a reload refuse what a start would: a bad key or value is one line naming
    /// it.
    fn check(&self, config: &Config) -> anyhow::Result<()> {
        let _ = config;
        Ok(())
    }

    /// Builds the backend over `assembly`, where the plug-ins before it left what they
    /// share; its provider starts once every plug-in is built.
    async fn build(&self, assembly: &mut Assembly<'_>) -> anyhow::Result<Parts>;
}

/// What a plug-in brings.
pub struct Parts {
    /// Its provider of tools and health.
    pub provider: Arc<dyn Provider<Config>>,
    /// Its actors the root supervisor links and restarts: a name each (health
    /// `toolmesh.actor.<name>`) and the handle that owns the actor.
    pub actors: Vec<(&'static str, Arc<dyn Supervised>)>,
    /// Its gRPC services, served beside the API's own.
    pub services: Vec<GrpcService>,
}

impl Parts {
    /// The parts of a backend that is a provider only.
    pub fn provider(provider: Arc<dyn Provider<Config>>) -> Self {
        Parts { provider, actors: Vec::new(), services: Vec::new() }
    }

    /// Adds an actor for the root to supervise.
    pub fn actor(mut self, name: &'static str, handle: Arc<dyn Supervised>) -> Self {
        self.actors.push((name, handle));
        self
    }

    /// Adds a gRPC service.
    pub fn service(mut self, service: GrpcService) -> Self {
        self.services.push(service);
        self
    }
}

/// What the app hands each plug-in as it is built: the configuration, the catalog, the
/// router, and what earlier plug-ins share.
pub struct Assembly<'a> {
    /// The configuration being started.
    pub config: &'a Config,
    /// The catalog every provider publishes to.
    pub registry: &'a RegistryHandle,
    /// The call path, for services that admit and audit requests as `CallTool` does.
    pub router: &'a Router,
    /// The local tools an embedding program adds, taken by the local plug-in.
    pub local_tools: Option<LocalTools>,
    /// The vector stores, once the vector plug-in opened them.
    pub stores: Option<VectorStores>,
    /// The built-in backends' handles, for [`App`](crate::App)'s accessors.
    pub(crate) handles: Handles,
    model: Model,
}

/// The built-in backends' handles, as their plug-ins leave them.
#[derive(Default)]
pub(crate) struct Handles {
    pub(crate) pool: Option<WorkerPool>,
    pub(crate) mcp: Option<McpManager>,
    pub(crate) search: Option<SearchHandle>,
    pub(crate) knowledge: Option<KnowledgeHandle>,
    pub(crate) remote: Option<RemoteWorkers>,
}

/// The embedding model, loading since the assembly began; every plug-in that embeds awaits
/// the one load.
type Model =
    futures::future::Shared<futures::future::BoxFuture<'static, Result<Arc<dyn Embedder>, String>>>;

impl<'a> Assembly<'a> {
    pub(crate) fn new(
        config: &'a Config,
        registry: &'a RegistryHandle,
        router: &'a Router,
        local_tools: LocalTools,
    ) -> anyhow::Result<Self> {
        let search: SearchConfig = config.get()?;
        let source = toolmesh_embed::ModelSource {
            enabled: search.embeddings,
            model_dir: search.model_dir,
            cache_dir: search.cache_dir,
            model_index: search.model_index,
            threads: search.embed_threads,
        };
        // Spawned, so that it loads while the plug-ins before search are built.
        let load = tokio::spawn(toolmesh_embed::load_model(source))
            .map(|loaded| loaded.unwrap_or_else(|e| Err(format!("loading the model: {e}"))));
        Ok(Assembly {
            config,
            registry,
            router,
            local_tools: Some(local_tools),
            stores: None,
            handles: Handles::default(),
            model: load.boxed().shared(),
        })
    }

    /// Returns the embedding model `[search]` names, loaded once for every plug-in that
    /// embeds, or why there is none (search is lexical then, and says so).
    pub async fn model(&self) -> Result<Arc<dyn Embedder>, String> {
        self.model.clone().await
    }
}

/// What a gRPC service is served with.
#[derive(Debug, Clone)]
pub struct Serving {
    /// The largest message a service reads (`server.max_message_bytes`).
    pub max_message_bytes: usize,
    /// Cancelled when a draining server has answered its calls: long-lived sessions
    /// (remote workers) end then.
    pub sessions: CancellationToken,
}

type AddService = dyn Fn(&mut tonic::service::RoutesBuilder, &Serving) + Send + Sync;

/// A gRPC service a plug-in serves: its name (for gRPC health, SERVING while the server
/// runs and NOT_SERVING once it drains) and how to add it to a server.
#[derive(Clone)]
pub struct GrpcService {
    name: &'static str,
    add: Arc<AddService>,
}

impl GrpcService {
    /// The service `S` that `add` puts on the server's routes.
    pub fn new<S: tonic::server::NamedService>(
        add: impl Fn(&mut tonic::service::RoutesBuilder, &Serving) + Send + Sync + 'static,
    ) -> Self {
        GrpcService { name: S::NAME, add: Arc::new(add) }
    }

    /// Its full name, for example `toolmesh.v1.KnowledgeService`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    pub(crate) fn add_to(&self, routes: &mut tonic::service::RoutesBuilder, serving: &Serving) {
        (self.add)(routes, serving)
    }
}

impl std::fmt::Debug for GrpcService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcService").field("name", &self.name).finish()
    }
}
