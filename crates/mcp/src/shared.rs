use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Instant,
};

use arc_swap::{ArcSwap, ArcSwapOption};
use rmcp::{
    RoleClient,
    model::{ProgressToken, RequestId},
    service::Peer,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use toolmesh_config::McpServerConfig;
use toolmesh_core::EventSink;

/// The health of one server's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerHealth {
    /// Connecting for the first time.
    Connecting,
    /// Connected, initialized, tools listed.
    Healthy,
    /// Not connected; calls fail with UNAVAILABLE until a reconnect succeeds.
    Unhealthy {
        /// Why.
        reason: String,
    },
}

/// What the actor, its client handler and the backend of every tool of one server share.
/// Calls read the connection from here without going through the actor's mailbox.
pub(crate) struct ServerShared {
    pub(crate) config: McpServerConfig,
    pub(crate) peer: ArcSwapOption<Peer<RoleClient>>,
    /// Cancelled when the current connection is declared lost; calls in flight watch it,
    /// since a transport may never answer a request whose server died.
    pub(crate) lost: ArcSwap<CancellationToken>,
    pub(crate) health: ArcSwap<ServerHealth>,
    /// The protocol version negotiated on the current connection.
    pub(crate) protocol: ArcSwapOption<String>,
    pub(crate) since: ArcSwap<Instant>,
    /// Where each running call's progress goes, by the progress token of its request.
    pub(crate) progress: Mutex<HashMap<ProgressToken, EventSink>>,
    /// The running calls by JSON-RPC request id, for routing the server's requests
    /// (elicitations) back to the call they belong to.
    pub(crate) inflight: Mutex<HashMap<RequestId, EventSink>>,
    /// Told whenever any server's health changes.
    pub(crate) changed: Arc<Notify>,
}

impl ServerShared {
    pub(crate) fn new(config: McpServerConfig, changed: Arc<Notify>) -> Arc<Self> {
        Arc::new(ServerShared {
            config,
            peer: ArcSwapOption::empty(),
            lost: ArcSwap::from_pointee(CancellationToken::new()),
            health: ArcSwap::from_pointee(ServerHealth::Connecting),
            protocol: ArcSwapOption::empty(),
            since: ArcSwap::from_pointee(Instant::now()),
            progress: Mutex::new(HashMap::new()),
            inflight: Mutex::new(HashMap::new()),
            changed,
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.config.name
    }

    pub(crate) fn set_health(&self, health: ServerHealth) {
        let changed = **self.health.load() != health;
        if changed {
            self.since.store(Arc::new(Instant::now()));
        }
        self.health.store(Arc::new(health));
        if changed {
            self.changed.notify_one();
        }
    }

    pub(crate) fn inflight_calls(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<RequestId, EventSink>> {
        self.inflight.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn progress_sinks(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<ProgressToken, EventSink>> {
        // A poisoned map only means a panic elsewhere while holding it; the data is intact.
        self.progress.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
