use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use ractor::{
    Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent, rpc::CallResult,
};
use tokio::sync::Notify;
use toolmesh_config::McpServerConfig;
use toolmesh_registry::RegistryHandle;
use tracing::{error, info, warn};

use crate::{McpClientActor, McpMsg, ServerHealth, shared::ServerShared};

/// Messages of the [`McpSupervisorActor`].
pub enum McpSupervisorMsg {
    /// Makes the set of servers equal to `servers`: starts new ones, stops removed ones,
    /// restarts changed ones, leaves the others connected.
    Reload {
        /// The configured servers.
        servers: Vec<McpServerConfig>,
        /// Done.
        reply: RpcReplyPort<()>,
    },
    /// Ends a server's actor abruptly, as a crash would; the supervisor starts a new one.
    Restart {
        /// The server.
        server: String,
        /// Whether such a server runs.
        reply: RpcReplyPort<bool>,
    },
}

/// Supervises one [`McpClientActor`] per configured server and restarts any that fails.
pub struct McpSupervisorActor {
    registry: RegistryHandle,
    servers: Arc<Mutex<BTreeMap<String, Arc<ServerShared>>>>,
    changed: Arc<Notify>,
}

/// The [`McpSupervisorActor`]'s state: the running server actors by name.
#[derive(Default)]
pub struct McpSupervisorState {
    actors: BTreeMap<String, ActorRef<McpMsg>>,
}

impl McpSupervisorActor {
    fn servers(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<ServerShared>>> {
        self.servers.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn start_server(
        &self,
        myself: &ActorRef<McpSupervisorMsg>,
        state: &mut McpSupervisorState,
        shared: Arc<ServerShared>,
    ) {
        let name = shared.name().to_owned();
        let actor = McpClientActor { shared: shared.clone(), registry: self.registry.clone() };
        match Actor::spawn_linked(None, actor, (), myself.get_cell()).await {
            Ok((actor, _)) => {
                state.actors.insert(name.clone(), actor);
                self.servers().insert(name, shared);
            }
            Err(error) => error!(server = %name, %error, "cannot start the mcp client actor"),
        }
    }

    async fn stop_server(&self, state: &mut McpSupervisorState, name: &str) {
        if let Some(actor) = state.actors.remove(name) {
            // Waiting lets the actor close its connection and withdraw its tools first.
            if let Err(error) = actor
                .stop_and_wait(
                    Some("removed from the configuration".into()),
                    Some(Duration::from_secs(10)),
                )
                .await
            {
                warn!(server = name, %error, "mcp client actor did not stop cleanly");
            }
        }
        self.servers().remove(name);
    }

    fn name_of(&self, state: &McpSupervisorState, cell: &ActorCell) -> Option<String> {
        state.actors.iter().find(|(_, a)| a.get_id() == cell.get_id()).map(|(n, _)| n.clone())
    }
}

impl Actor for McpSupervisorActor {
    type Msg = McpSupervisorMsg;
    type State = McpSupervisorState;
    type Arguments = ();

    async fn pre_start(
        &self,
        _: ActorRef<Self::Msg>,
        _: (),
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(McpSupervisorState::default())
    }

    async fn post_stop(
        &self,
        _: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let names: Vec<String> = state.actors.keys().cloned().collect();
        for name in names {
            self.stop_server(state, &name).await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            McpSupervisorMsg::Reload { servers, reply } => {
                let wanted: BTreeMap<String, McpServerConfig> =
                    servers.into_iter().map(|s| (s.name.clone(), s)).collect();
                let running: Vec<(String, McpServerConfig)> =
                    self.servers().iter().map(|(n, s)| (n.clone(), s.config.clone())).collect();
                for (name, config) in running {
                    if wanted.get(&name) != Some(&config) {
                        info!(server = %name, "stopping mcp server (removed or changed)");
                        self.stop_server(state, &name).await;
                    }
                }
                for (name, config) in wanted {
                    if !state.actors.contains_key(&name) {
                        info!(server = %name, "starting mcp server");
                        self.start_server(
                            &myself,
                            state,
                            ServerShared::new(config, self.changed.clone()),
                        )
                        .await;
                    }
                }
                self.changed.notify_one();
                let _ = reply.send(());
            }
            McpSupervisorMsg::Restart { server, reply } => {
                let actor = state.actors.get(&server);
                if let Some(actor) = actor {
                    actor.kill();
                }
                let _ = reply.send(actor.is_some());
            }
        }
        Ok(())
    }

    // The default stops the supervisor when a child stops: a failed server must not take
    // the others down.
    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // A server actor that ends while still registered did not end on our request
        // (stop_server unregisters first): it crashed or was killed. Start a fresh one.
        let (cell, reason) = match event {
            SupervisionEvent::ActorFailed(cell, reason) => (cell, reason.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell, reason.unwrap_or_default())
            }
            _ => return Ok(()),
        };
        if let Some(name) = self.name_of(state, &cell) {
            error!(server = %name, %reason, "mcp client actor ended unexpectedly; restarting it");
            state.actors.remove(&name);
            let shared = self.servers().remove(&name);
            if let Some(shared) = shared {
                shared.peer.store(None);
                shared.lost.load().cancel();
                let fresh = ServerShared::new(shared.config.clone(), self.changed.clone());
                self.start_server(&myself, state, fresh).await;
            }
        }
        Ok(())
    }
}

/// Handle to the MCP backend: reload the configured servers, read their health.
#[derive(Clone)]
pub struct McpManager {
    actor: ActorRef<McpSupervisorMsg>,
    servers: Arc<Mutex<BTreeMap<String, Arc<ServerShared>>>>,
    changed: Arc<Notify>,
}

impl std::fmt::Debug for McpManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpManager").field("servers", &self.health()).finish()
    }
}

impl McpManager {
    /// Starts the supervisor; servers start with [`McpManager::reload`].
    pub async fn start(registry: RegistryHandle) -> Result<Self, ActorProcessingErr> {
        let servers = Arc::new(Mutex::new(BTreeMap::new()));
        let changed = Arc::new(Notify::new());
        let supervisor =
            McpSupervisorActor { registry, servers: servers.clone(), changed: changed.clone() };
        let (actor, _) = Actor::spawn(None, supervisor, ()).await?;
        Ok(McpManager { actor, servers, changed })
    }

    /// Makes the running servers match `servers`.
    pub async fn reload(&self, servers: Vec<McpServerConfig>) -> Result<(), String> {
        self.call(|reply| McpSupervisorMsg::Reload { servers, reply }, Duration::from_secs(60))
            .await
    }

    /// Asks the supervisor, turning ractor's call outcomes into one error message.
    async fn call<T: Send + 'static>(
        &self,
        message: impl FnOnce(RpcReplyPort<T>) -> McpSupervisorMsg,
        timeout: Duration,
    ) -> Result<T, String> {
        match self.actor.call(message, Some(timeout)).await {
            Ok(CallResult::Success(value)) => Ok(value),
            Ok(CallResult::Timeout) => Err("the mcp supervisor did not answer in time".into()),
            Ok(CallResult::SenderError) | Err(_) => Err("the mcp supervisor is gone".into()),
        }
    }

    /// Returns each server's health.
    pub fn health(&self) -> Vec<(String, ServerHealth)> {
        let servers = self.servers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        servers
            .iter()
            .map(|(name, shared)| (name.clone(), (**shared.health.load()).clone()))
            .collect()
    }

    /// Returns the protocol version negotiated with `server`, while connected.
    pub fn protocol(&self, server: &str) -> Option<String> {
        let servers = self.servers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        servers.get(server).and_then(|s| s.protocol.load_full()).map(|p| (*p).clone())
    }

    /// Ends a server's actor abruptly, as a crash would: its connection and child process go
    /// with it, and the supervisor starts a fresh actor that reconnects. Returns whether
    /// such a server runs.
    pub async fn restart(&self, server: &str) -> Result<bool, String> {
        let server = server.to_owned();
        self.call(|reply| McpSupervisorMsg::Restart { server, reply }, Duration::from_secs(10))
            .await
    }

    /// Waits until some server's health changes, or servers are added or removed.
    pub async fn health_changed(&self) {
        self.changed.notified().await;
    }

    /// Stops every server and the supervisor.
    pub async fn stop(&self) {
        let _ =
            self.actor.stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(15))).await;
    }
}
