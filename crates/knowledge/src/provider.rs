//! The knowledge collections as a provider.

use std::time::Duration;

use toolmesh_config::Config;
use toolmesh_core::{Health, Provider, ProviderError};

use crate::{KnowledgeConfig, KnowledgeHandle};

/// The knowledge collections: `[knowledge]` applied at start and on reload, one search
/// tool per collection, health `toolmesh.knowledge.<collection>`.
#[derive(Debug, Clone)]
pub struct KnowledgeProvider {
    handle: KnowledgeHandle,
}

impl KnowledgeProvider {
    /// The provider over a started retriever.
    pub fn new(handle: KnowledgeHandle) -> Self {
        KnowledgeProvider { handle }
    }

    /// Returns the handle.
    pub fn handle(&self) -> &KnowledgeHandle {
        &self.handle
    }

    async fn apply(&self, config: &Config) -> Result<(), ProviderError> {
        let knowledge: KnowledgeConfig =
            config.get().map_err(|e| ProviderError::new("knowledge", e))?;
        self.handle.apply(knowledge).await.map_err(|e| ProviderError::new("knowledge", e))
    }
}

#[async_trait::async_trait]
impl Provider<Config> for KnowledgeProvider {
    fn kind(&self) -> &'static str {
        "knowledge"
    }

    async fn start(&self, config: &Config) -> Result<(), ProviderError> {
        self.apply(config).await
    }

    /// Collections added, changed or removed in `[knowledge]` take effect: their tools
    /// come, change or go; the documents of a collection stay in the store.
    async fn reload(&self, config: &Config) -> Result<(), ProviderError> {
        self.apply(config).await
    }

    fn health(&self) -> Vec<(String, Health)> {
        self.handle.health()
    }

    async fn health_changed(&self) {
        self.handle.shared.changed.notified().await;
    }

    async fn stop(&self, _grace: Duration) {
        self.handle.stop().await;
    }
}
