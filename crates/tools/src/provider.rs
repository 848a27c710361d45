use std::{sync::Arc, time::Duration};

use toolmesh_config::{Config, ConfigError};
use toolmesh_core::{ErrorCode, Health, Provider, ProviderError, ToolSource, Toolkit};
use toolmesh_registry::{RegistryError, RegistryHandle, SourceUpdate, ToolEntry};
use toolmesh_workers::{LocalToolInstall, ToolLimits, WorkerPool, WorkersConfig, WorkersError};
use tracing::info;

use crate::{
    BUILTIN_SOURCE, BuiltinConfig, CONFIG_SOURCE, EchoTool, HttpToolError, ToolsConfig,
    config_tools, reasoning_toolkit,
};

/// Name of the source of the local tools an embedding program adds.
pub const EMBEDDED_SOURCE: &str = "embedded";

/// Local tools an embedding program (or a test) adds beside the configured ones, each with
/// its limits, standalone or in toolkits.
#[derive(Default)]
pub struct LocalTools {
    /// Standalone local tools.
    pub tools: Vec<LocalToolInstall>,
    /// Toolkits of local tools.
    pub toolkits: Vec<(Toolkit, Vec<LocalToolInstall>)>,
}

/// Why local tools could not be published.
#[derive(Debug, thiserror::Error)]
pub enum LocalToolsError {
    /// The worker pool did not start.
    #[error(transparent)]
    Pool(#[from] WorkersError),
    /// A configured HTTP tool is not valid.
    #[error(transparent)]
    Http(#[from] HttpToolError),
    /// The catalog refused a tool or toolkit.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The section of the tools is not valid.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl LocalToolsError {
    /// The failure kind a caller sees.
    pub fn code(&self) -> ErrorCode {
        match self {
            LocalToolsError::Pool(_) => ErrorCode::Internal,
            LocalToolsError::Http(_)
            | LocalToolsError::Registry(_)
            | LocalToolsError::Config(_) => ErrorCode::InvalidArgument,
        }
    }
}

/// The local tools on the supervised [`WorkerPool`]: the built-in ones of `[builtin]`, the
/// configured ones of `[tools]` (replaced whole on reload), and those an embedding program
/// adds. Its one health entry, `toolmesh.local.workers`, is the pool.
pub struct LocalProvider {
    pool: WorkerPool,
    registry: RegistryHandle,
    embedded: std::sync::Mutex<Option<LocalTools>>,
}

impl LocalProvider {
    /// Starts the worker pool of `workers`; the tools are published by
    /// [`Provider::start`].
    pub async fn new(
        workers: &WorkersConfig,
        registry: RegistryHandle,
        embedded: LocalTools,
    ) -> Result<Self, LocalToolsError> {
        let pool = WorkerPool::start(workers.clone()).await?;
        Ok(LocalProvider { pool, registry, embedded: std::sync::Mutex::new(Some(embedded)) })
    }

    /// Returns the worker pool.
    pub fn pool(&self) -> &WorkerPool {
        &self.pool
    }

    fn entries(&self, tools: Vec<LocalToolInstall>) -> Result<Vec<ToolEntry>, RegistryError> {
        tools
            .into_iter()
            .map(|(tool, limits)| ToolEntry::new(tool.spec(), self.pool.bind(tool, limits)))
            .collect()
    }

    fn update(
        &self,
        source: &str,
        tools: Vec<LocalToolInstall>,
        toolkits: Vec<(Toolkit, Vec<LocalToolInstall>)>,
    ) -> Result<SourceUpdate, RegistryError> {
        Ok(SourceUpdate {
            source: ToolSource::local(source),
            tools: self.entries(tools)?,
            toolkits: toolkits
                .into_iter()
                .map(|(toolkit, tools)| Ok((toolkit, self.entries(tools)?)))
                .collect::<Result<_, RegistryError>>()?,
            toolkit: None,
            unchanged: vec![],
        })
    }

    async fn publish_builtin(&self, config: &Config) -> Result<(), LocalToolsError> {
        let builtin: BuiltinConfig = config.get()?;
        let mut toolkits = vec![];
        if builtin.reasoning {
            let (toolkit, tools) = reasoning_toolkit();
            toolkits
                .push((toolkit, tools.into_iter().map(|t| (t, ToolLimits::default())).collect()));
        }
        let mut tools: Vec<LocalToolInstall> = vec![];
        if builtin.echo {
            tools.push((Arc::new(EchoTool), ToolLimits::default()));
        }
        self.registry.replace_source(self.update(BUILTIN_SOURCE, tools, toolkits)?).await?;
        let embedded =
            self.embedded.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(LocalTools { tools, toolkits }) = embedded
            && (!tools.is_empty() || !toolkits.is_empty())
        {
            self.registry.replace_source(self.update(EMBEDDED_SOURCE, tools, toolkits)?).await?;
        }
        Ok(())
    }

    async fn publish_configured(&self, config: &Config) -> Result<(), LocalToolsError> {
        let tools = config_tools(&config.get::<ToolsConfig>()?)?;
        let count = tools.len();
        self.registry.replace_source(self.update(CONFIG_SOURCE, tools, vec![])?).await?;
        info!(configured = count, "configured local tools loaded");
        Ok(())
    }
}

#[async_trait::async_trait]
impl Provider<Config> for LocalProvider {
    fn kind(&self) -> &'static str {
        "local"
    }

    async fn start(&self, config: &Config) -> Result<(), ProviderError> {
        self.publish_builtin(config).await.map_err(|e| ProviderError::new("local", e))?;
        self.publish_configured(config).await.map_err(|e| ProviderError::new("local", e))
    }

    /// Replaces the configured tools with those of `config`, atomically; calls in flight
    /// keep the definition they started with. The built-in tools and the pool's size are
    /// read at start.
    async fn reload(&self, config: &Config) -> Result<(), ProviderError> {
        self.publish_configured(config).await.map_err(|e| ProviderError::new("local", e))
    }

    fn health(&self) -> Vec<(String, Health)> {
        let health = if self.pool.is_running() {
            Health::up()
        } else {
            Health::down("the worker pool has stopped")
        };
        vec![("workers".to_owned(), health)]
    }

    async fn health_changed(&self) {
        if self.pool.is_running() {
            self.pool.stopped().await;
        } else {
            // Stopped for good: nothing changes after this.
            std::future::pending::<()>().await;
        }
    }

    async fn stop(&self, grace: Duration) {
        self.pool.stop(grace).await;
    }
}
