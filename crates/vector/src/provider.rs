//! The stores' health as a provider: `toolmesh.vector.<backend>` for the default store,
//! `toolmesh.vector.<name>` for a named one.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use toolmesh_config::Config;
use toolmesh_core::{Health, Provider, ProviderError, VectorStore, VectorStores};
use tracing::{Instrument, info, warn};

/// How often the store is asked whether it answers.
const CHECK_EVERY: Duration = Duration::from_secs(5);

/// The vector stores as a provider of health: no tools of their own, one entry per store,
/// down with the reason while it does not answer. The default store's entry is named by its
/// backend (`embedded` or `qdrant`), a named store's by its name.
pub struct VectorProvider {
    stores: VectorStores,
    /// Each store's health, in the order of `stores.all()`.
    health: Arc<Mutex<Vec<Health>>>,
    changed: Arc<Notify>,
    stop: CancellationToken,
}

impl VectorProvider {
    /// Watches `stores`, asking each every few seconds whether it answers.
    pub fn new(stores: VectorStores) -> VectorProvider {
        let count = stores.all().count();
        let provider = VectorProvider {
            stores,
            health: Arc::new(Mutex::new(vec![Health::up(); count])),
            changed: Arc::new(Notify::new()),
            stop: CancellationToken::new(),
        };
        for (i, (_, store)) in provider.stores.all().enumerate() {
            let (store, health, changed, stop) = (
                store.clone(),
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
                            &mut health.lock().unwrap_or_else(PoisonError::into_inner)[i],
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
        }
        provider
    }

    /// Returns the stores.
    pub fn stores(&self) -> &VectorStores {
        &self.stores
    }

    /// Returns the default store.
    pub fn store(&self) -> &Arc<dyn VectorStore> {
        self.stores.default_store()
    }
}

#[async_trait::async_trait]
impl Provider<Config> for VectorProvider {
    fn kind(&self) -> &'static str {
        "vector"
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
        self.stores
            .all()
            .zip(health)
            .map(|((name, store), health)| (name.unwrap_or(store.backend()).to_owned(), health))
            .collect()
    }

    async fn health_changed(&self) {
        self.changed.notified().await;
    }

    /// Stops watching and writes the store to disk; the providers that use it have
    /// stopped before (they started after it).
    async fn stop(&self, _grace: Duration) {
        self.stop.cancel();
        for (_, store) in self.stores.all() {
            if let Err(error) = store.flush().await {
                warn!(store = %store.describe(), %error, "the vector store could not be written to disk at shutdown");
            }
            store.close().await;
        }
    }
}
