//! The store's health as a provider: `toolmesh.vector.<backend>`.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use toolmesh_config::Config;
use toolmesh_core::{Health, Provider, ProviderError, VectorStore};
use tracing::{Instrument, info, warn};

use crate::SECTION;

/// How often the store is asked whether it answers.
const CHECK_EVERY: Duration = Duration::from_secs(5);

/// The vector store as a provider of health: no tools of its own, one entry named by the
/// backend (`embedded` or `qdrant`), down with the reason while the store does not answer.
pub struct VectorProvider {
    store: Arc<dyn VectorStore>,
    health: Arc<Mutex<Health>>,
    changed: Arc<Notify>,
    stop: CancellationToken,
}

impl VectorProvider {
    /// Watches `store`, asking it every few seconds whether it answers.
    pub fn new(store: Arc<dyn VectorStore>) -> VectorProvider {
        let provider = VectorProvider {
            store,
            health: Arc::new(Mutex::new(Health::up())),
            changed: Arc::new(Notify::new()),
            stop: CancellationToken::new(),
        };
        let (store, health, changed, stop) = (
            provider.store.clone(),
            provider.health.clone(),
            provider.changed.clone(),
            provider.stop.clone(),
        );
        tokio::spawn(
            async move {
                loop {
                    let now = match store.check().await {
                        Ok(()) => Health::up(),
                        Err(error) => Health::down(error.to_string()),
                    };
                    let before = std::mem::replace(
                        &mut *health.lock().unwrap_or_else(PoisonError::into_inner),
                        now.clone(),
                    );
                    if before != now {
                        if now.up {
                            info!(store = %store.describe(), "the vector store answers again");
                        } else {
                            warn!(store = %store.describe(), reason = %now.status, "the vector store does not answer");
                        }
                        changed.notify_one();
                    }
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(CHECK_EVERY) => {}
                    }
                }
            }
            .instrument(tracing::info_span!("vector", task = "health")),
        );
        provider
    }

    /// Returns the store.
    pub fn store(&self) -> &Arc<dyn VectorStore> {
        &self.store
    }
}

#[async_trait::async_trait]
impl Provider<Config> for VectorProvider {
    fn kind(&self) -> &'static str {
        "vector"
    }

    fn section(&self) -> Option<&'static str> {
        Some(SECTION)
    }

    async fn start(&self, _: &Config) -> Result<(), ProviderError> {
        Ok(())
    }

    /// The store is chosen at start: `[vector]` holds until a restart.
    async fn reload(&self, _: &Config) -> Result<(), ProviderError> {
        Ok(())
    }

    fn health(&self) -> Vec<(String, Health)> {
        let health = self.health.lock().unwrap_or_else(PoisonError::into_inner).clone();
        vec![(self.store.backend().to_owned(), health)]
    }

    async fn health_changed(&self) {
        self.changed.notified().await;
    }

    /// Stops watching and writes the store to disk; the providers that use it have
    /// stopped before (they started after it).
    async fn stop(&self, _grace: Duration) {
        self.stop.cancel();
        if let Err(error) = self.store.flush().await {
            warn!(%error, "the vector store could not be written to disk at shutdown");
        }
        self.store.close().await;
    }
}
