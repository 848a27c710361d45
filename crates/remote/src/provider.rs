//! The remote workers as a provider of tools.

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;
use toolmesh_config::Config;
use toolmesh_core::{Health, Provider, ProviderError};
use toolmesh_registry::RegistryHandle;

use crate::{RemoteConfig, WorkerServiceImpl, members::Members, service::Closing};

/// The remote workers of one router: the provider of their tools, and the maker of the
/// service they connect to. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RemoteWorkers {
    members: Arc<Members>,
    closing: CancellationToken,
}

impl RemoteWorkers {
    /// Remote workers whose tools go into `registry`.
    pub fn new(registry: RegistryHandle) -> Self {
        let members = Arc::new(Members::new(registry));
        members.observe();
        RemoteWorkers { members, closing: CancellationToken::new() }
    }

    /// The gRPC service workers connect to. Its sessions end when `closing` is cancelled
    /// (a draining router, once its calls are answered) or when the provider stops.
    /// The gRPC service workers connect to; `max_message_bytes` is the largest message it
    /// reads, which workers are told.
    pub fn service(
        &self,
        closing: CancellationToken,
        max_message_bytes: usize,
    ) -> WorkerServiceImpl {
        WorkerServiceImpl {
            members: self.members.clone(),
            closing: Closing { router: closing, provider: self.closing.clone() },
            max_message_bytes,
        }
    }

    /// Ends the session of every worker whose credential `check` no longer accepts (a
    /// removed key, an issuer no longer trusted) or whose principal lost the worker role:
    /// a revoked worker serves no further call. `check` returns the principal the
    /// credential is now, or why it is refused.
    pub async fn revoke<F, Fut>(&self, check: F)
    where
        F: Fn(Arc<toolmesh_core::Principal>) -> Fut,
        Fut: std::future::Future<Output = Option<Result<Arc<toolmesh_core::Principal>, String>>>,
    {
        let role = self.members.config().worker_role.clone();
        for link in self.members.links() {
            let Some(principal) = link.principal.clone() else { continue };
            let refused = match check(principal).await {
                None => None,
                Some(Ok(now)) if now.has_role(&role) => None,
                Some(Ok(now)) => {
                    Some(format!("principal {:?} no longer has the role {role:?}", now.name))
                }
                Some(Err(reason)) => Some(reason),
            };
            if let Some(reason) = refused {
                let status = tonic::Status::unauthenticated(format!(
                    "the worker's credential was revoked: {reason}"
                ));
                self.members.leave(&link, status).await;
            }
        }
    }

    fn apply(&self, config: &Config) -> Result<(), ProviderError> {
        let section: RemoteConfig = config.get().map_err(|e| ProviderError::new("remote", e))?;
        *self.members.config.write().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Arc::new(section);
        Ok(())
    }
}

#[async_trait::async_trait]
impl Provider<Config> for RemoteWorkers {
    fn kind(&self) -> &'static str {
        "remote"
    }

    async fn start(&self, config: &Config) -> Result<(), ProviderError> {
        self.apply(config)
    }

    /// New timeouts apply to calls that start from then on, new heartbeat settings to
    /// sessions that start from then on.
    async fn reload(&self, config: &Config) -> Result<(), ProviderError> {
        self.apply(config)
    }

    fn health(&self) -> Vec<(String, Health)> {
        self.members.health()
    }

    async fn health_changed(&self) {
        self.members.changed.notified().await;
    }

    async fn stop(&self, _grace: Duration) {
        self.closing.cancel();
        self.members.close_all(tonic::Status::unavailable("the router is shutting down")).await;
    }
}
