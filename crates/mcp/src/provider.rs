use std::time::Duration;

use toolmesh_config::Config;
use toolmesh_core::{Health, Provider, ProviderError};

use crate::{McpConfig, McpManager, ServerHealth};

/// The MCP servers of `[[mcp.servers]]`: one health entry per server,
/// `toolmesh.mcp.<server>`.
#[async_trait::async_trait]
impl Provider<Config> for McpManager {
    fn kind(&self) -> &'static str {
        "mcp"
    }

    async fn start(&self, config: &Config) -> Result<(), ProviderError> {
        let mcp: McpConfig = config.get().map_err(|e| ProviderError::new("mcp", e))?;
        self.reload(mcp.servers).await.map_err(|e| ProviderError::new("mcp", e))
    }

    async fn reload(&self, config: &Config) -> Result<(), ProviderError> {
        let mcp: McpConfig = config.get().map_err(|e| ProviderError::new("mcp", e))?;
        McpManager::reload(self, mcp.servers).await.map_err(|e| ProviderError::new("mcp", e))
    }

    fn health(&self) -> Vec<(String, Health)> {
        McpManager::health(self)
            .into_iter()
            .map(|(name, health)| {
                let health = match health {
                    // An idle lazy server is opened by the next call.
                    ServerHealth::Healthy => Health::up(),
                    ServerHealth::Idle => Health { up: true, status: "idle".into() },
                    ServerHealth::Connecting => {
                        Health::down(format!("mcp server {name} is connecting"))
                    }
                    ServerHealth::Unhealthy { reason } => {
                        Health::down(format!("mcp server {name} is unavailable: {reason}"))
                    }
                };
                (name, health)
            })
            .collect()
    }

    async fn health_changed(&self) {
        McpManager::health_changed(self).await;
    }

    async fn stop(&self, _grace: Duration) {
        // Calls in flight were drained by the front door; each server actor closes its
        // connection, withdraws its tools and ends its process group.
        McpManager::stop(self).await;
    }
}
