use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use arc_swap::ArcSwap;
use ractor::{
    Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent, rpc::CallResult,
};
use tokio::sync::Notify;
use toolmesh_core::ErrorCode;
use toolmesh_registry::RegistryHandle;
use tracing::{Instrument, error, info, warn};

use crate::{
    DefinitionAudit, McpClientActor, McpMsg, McpServerConfig, ServerHealth, shared::ServerShared,
};

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
}

/// Why the MCP supervisor could not be asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    /// It did not answer within the time given.
    #[error("the mcp supervisor did not answer within {0:?}")]
    Timeout(Duration),
    /// It has stopped.
    #[error("the mcp supervisor has stopped")]
    Stopped,
}

impl McpError {
    /// The failure kind a caller sees.
    pub fn code(&self) -> ErrorCode {
        match self {
            McpError::Timeout(_) => ErrorCode::DeadlineExceeded,
            McpError::Stopped => ErrorCode::Unavailable,
        }
    }
}

/// Why a resource could not be read or a prompt got.
#[derive(Debug, thiserror::Error)]
pub enum OfferError {
    /// No server offers it.
    #[error("{0}")]
    NotFound(String),
    /// The server that offers it cannot be reached.
    #[error("mcp server {server}: {reason}")]
    Unavailable {
        /// The server.
        server: String,
        /// Why.
        reason: String,
    },
    /// The server did not answer in time.
    #[error("mcp server {server} did not answer within {timeout:?}")]
    Timeout {
        /// The server.
        server: String,
        /// Its `timeout_ms`.
        timeout: Duration,
    },
    /// The server answered with an error.
    #[error("mcp server {server}: {message}")]
    Failed {
        /// The server.
        server: String,
        /// Its error.
        message: String,
        /// What kind of failure it was.
        code: ErrorCode,
    },
}

impl OfferError {
    /// The failure kind a caller sees.
    pub fn code(&self) -> ErrorCode {
        match self {
            OfferError::NotFound(_) => ErrorCode::NotFound,
            OfferError::Unavailable { .. } => ErrorCode::Unavailable,
            OfferError::Timeout { .. } => ErrorCode::DeadlineExceeded,
            OfferError::Failed { code, .. } => *code,
        }
    }
}

/// What one server offers besides tools, with the names the catalog gives it.
#[derive(Debug, Clone)]
pub struct ServerOffers {
    /// The server.
    pub server: String,
    /// Its resources, templates and prompts, as it lists them.
    pub offers: Arc<crate::Offers>,
    prefix: crate::PrefixMode,
}

impl ServerOffers {
    /// The name the catalog gives a prompt or a resource of the server named `name` there:
    /// prefixed as the server's tools are.
    pub fn published(&self, name: &str) -> String {
        crate::publish_name(self.prefix, &self.server, name)
    }
}

/// Where a resource is read: its server, and what policy sees it as.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceRoute {
    /// The server.
    pub server: String,
    /// The catalog name of the resource or template that lists or matches it (prefixed as
    /// the server's tools are); `None` when neither does.
    pub name: Option<String>,
    /// Its description, if it has one.
    pub description: Option<String>,
}

impl ResourceRoute {
    fn of(server: &str, shared: &ServerShared, uri: &str) -> Self {
        let offers = shared.offers.load();
        let found = offers.listed(uri).or_else(|| offers.template(uri));
        ResourceRoute {
            server: server.to_owned(),
            name: found.map(|(name, _)| crate::publish_name(shared.config.prefix, server, name)),
            description: found.and_then(|(_, description)| description.map(str::to_owned)),
        }
    }
}

fn no_server(server: &str) -> OfferError {
    OfferError::NotFound(format!("no mcp server is named {server:?}"))
}

/// One running server, as the supervisor publishes it.
#[derive(Clone)]
struct Running {
    shared: Arc<ServerShared>,
    actor: ActorRef<McpMsg>,
}

/// What the supervisor publishes after every change, for readers that must not wait on
/// its mailbox (health, the protocol in use): the running servers by name.
type Published = ArcSwap<BTreeMap<String, Running>>;

/// Supervises one [`McpClientActor`] per configured server and restarts any that fails.
pub struct McpSupervisorActor {
    registry: RegistryHandle,
    published: Arc<Published>,
    changed: Arc<Notify>,
    /// Told whenever a server's resources or prompts change, or servers come and go.
    offers_changed: Arc<crate::offers::OfferSignals>,
    /// Where the servers' last listings are kept.
    remember_in: Option<PathBuf>,
    /// Where changed tool definitions are reported.
    audit: DefinitionAudit,
}

/// The [`McpSupervisorActor`]'s state: the running servers by name. Only the actor
/// changes it; each change is published whole.
#[derive(Default)]
pub struct McpSupervisorState {
    servers: BTreeMap<String, Running>,
}

impl McpSupervisorActor {
    fn publish(&self, state: &McpSupervisorState) {
        self.published.store(Arc::new(state.servers.clone()));
        self.changed.notify_one();
        self.offers_changed.changed.send_modify(|version| *version += 1);
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
                state.servers.insert(name, Running { shared, actor });
            }
            Err(error) => error!(server = %name, %error, "cannot start the mcp client actor"),
        }
    }

    async fn stop_server(&self, state: &mut McpSupervisorState, name: &str) {
        // Removed first: an actor that ends while not in the map ended on our request.
        if let Some(running) = state.servers.remove(name) {
            // Waiting lets the actor close its connection and withdraw its tools first.
            if let Err(error) = running
                .actor
                .stop_and_wait(
                    Some("removed from the configuration".into()),
                    Some(Duration::from_secs(10)),
                )
                .await
            {
                warn!(server = name, %error, "mcp client actor did not stop cleanly");
            }
        }
    }

    fn name_of(&self, state: &McpSupervisorState, cell: &ActorCell) -> Option<String> {
        state
            .servers
            .iter()
            .find(|(_, running)| running.actor.get_id() == cell.get_id())
            .map(|(name, _)| name.clone())
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
        let names: Vec<String> = state.servers.keys().cloned().collect();
        for name in names {
            self.stop_server(state, &name).await;
        }
        self.publish(state);
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
                let running: Vec<(String, McpServerConfig)> = state
                    .servers
                    .iter()
                    .map(|(n, r)| (n.clone(), r.shared.config.clone()))
                    .collect();
                // A definition withheld by an unchanged server may have been accepted since
                // (`toolmesh mcp accept`): its tools are listed again.
                for (name, server) in &state.servers {
                    let withholds = (server.shared.pins.lock())
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .withholds();
                    if withholds && wanted.get(name) == Some(&server.shared.config) {
                        let _ = server.actor.cast(McpMsg::ToolsChanged);
                    }
                }
                for (name, config) in running {
                    if wanted.get(&name) != Some(&config) {
                        info!(server = %name, "stopping mcp server (removed or changed)");
                        let shared = state.servers.get(&name).map(|r| r.shared.clone());
                        self.stop_server(state, &name).await;
                        if !wanted.contains_key(&name)
                            && let Some(shared) = shared
                        {
                            if let Some(remembered) = &shared.remembered {
                                remembered.forget();
                            }
                            shared.pins.lock().unwrap_or_else(|e| e.into_inner()).forget();
                        }
                        self.publish(state);
                    }
                }
                for (name, config) in wanted {
                    if !state.servers.contains_key(&name) {
                        info!(server = %name, "starting mcp server");
                        self.start_server(
                            &myself,
                            state,
                            ServerShared::new(
                                config,
                                self.changed.clone(),
                                self.offers_changed.clone(),
                                self.remember_in.as_deref(),
                                self.audit.clone(),
                            ),
                        )
                        .await;
                        self.publish(state);
                    }
                }
                let _ = reply.send(());
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
        // A server actor that ends while still in the map did not end on our request
        // (stop_server removes it first): it crashed or was killed. Start a fresh one.
        let (cell, reason) = match event {
            SupervisionEvent::ActorFailed(cell, reason) => (cell, reason.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell, reason.unwrap_or_default())
            }
            _ => return Ok(()),
        };
        if let Some(name) = self.name_of(state, &cell)
            && let Some(Running { shared, .. }) = state.servers.remove(&name)
        {
            error!(server = %name, %reason, "mcp client actor ended unexpectedly; restarting it");
            shared.peer.store(None);
            shared.lost.load().cancel();
            let fresh = ServerShared::new(
                shared.config.clone(),
                self.changed.clone(),
                self.offers_changed.clone(),
                self.remember_in.as_deref(),
                self.audit.clone(),
            );
            // The gap shows: the fresh server is Connecting until it has listed its tools.
            self.start_server(&myself, state, fresh).await;
            self.publish(state);
        }
        Ok(())
    }
}

/// Handle to the MCP backend: reload the configured servers, read their health.
#[derive(Clone)]
pub struct McpManager {
    /// Where the servers' last listings are kept.
    remember_in: Option<PathBuf>,
    /// Where changed tool definitions are reported.
    audit: DefinitionAudit,
    /// The supervisor; one that restarts it swaps in the new one.
    actor: Arc<ArcSwap<ActorRef<McpSupervisorMsg>>>,
    /// The servers last configured, which a restarted supervisor starts again.
    configured: Arc<ArcSwap<Vec<McpServerConfig>>>,
    registry: RegistryHandle,
    published: Arc<Published>,
    changed: Arc<Notify>,
    offers_changed: Arc<crate::offers::OfferSignals>,
}

impl std::fmt::Debug for McpManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpManager").field("servers", &self.health()).finish()
    }
}

impl McpManager {
    /// Starts the supervisor; servers start with [`McpManager::reload`]. Their last
    /// listings are kept in `remember_in` (see `remember_tools`), when given; a tool
    /// definition that changed since it was pinned is reported to `audit`.
    pub async fn start(
        registry: RegistryHandle,
        remember_in: Option<PathBuf>,
        audit: DefinitionAudit,
    ) -> Result<Self, ActorProcessingErr> {
        let published = Arc::new(Published::default());
        let changed = Arc::new(Notify::new());
        let offers_changed = Arc::new(crate::offers::OfferSignals::default());
        let supervisor = McpSupervisorActor {
            registry: registry.clone(),
            published: published.clone(),
            changed: changed.clone(),
            offers_changed: offers_changed.clone(),
            remember_in: remember_in.clone(),
            audit: audit.clone(),
        };
        let (actor, _) = Actor::spawn(None, supervisor, ()).await?;
        Ok(McpManager {
            remember_in,
            audit,
            actor: Arc::new(ArcSwap::from_pointee(actor)),
            configured: Arc::default(),
            registry,
            published,
            changed,
            offers_changed,
        })
    }

    /// A receiver that sees every change of the servers' resources and prompts (servers
    /// started and stopped, listings that changed).
    pub fn offer_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.offers_changed.changed.subscribe()
    }

    /// A receiver of the updates of the resources clients subscribed to, from every server.
    pub fn resource_updates(&self) -> tokio::sync::broadcast::Receiver<crate::ResourceUpdate> {
        self.offers_changed.updated.subscribe()
    }

    /// Subscribes to the resource `uri` of `server` for one more client: the server is
    /// asked (`resources/subscribe`) when this is the resource's first subscription, and
    /// refused when it does not offer subscriptions.
    pub async fn subscribe(&self, server: &str, uri: &str) -> Result<(), OfferError> {
        let shared = self.running(server)?;
        let mut first = false;
        // A new resource changes the set a 2026-07-28 connection listens to.
        shared.subscribed.send_if_modified(|subscribed| {
            let count = subscribed.entry(uri.to_owned()).or_default();
            *count += 1;
            first = *count == 1;
            first
        });
        if !first {
            return Ok(());
        }
        let asked = self
            .ask(server, |peer| async move {
                if !crate::offers::subscribable(&peer) {
                    return Ok(false);
                }
                if crate::offers::per_request(&peer) {
                    return Ok(true);
                }
                crate::offers::subscribe(&peer, uri).await.map(|()| true)
            })
            .await;
        let refusal = match asked {
            Ok(true) => return Ok(()),
            Ok(false) => OfferError::Failed {
                server: server.to_owned(),
                message: format!("mcp server {server} does not offer resource subscriptions"),
                code: ErrorCode::FailedPrecondition,
            },
            Err(error) => error,
        };
        self.forget_subscription(&shared, uri);
        Err(refusal)
    }

    /// Ends one client's subscription to the resource `uri` of `server`; the server is told
    /// (`resources/unsubscribe`) when it was the last.
    pub async fn unsubscribe(&self, server: &str, uri: &str) -> Result<(), OfferError> {
        let shared = self.running(server)?;
        if !self.forget_subscription(&shared, uri) {
            return Ok(());
        }
        self.ask(server, |peer| async move {
            match crate::offers::per_request(&peer) {
                true => Ok(()),
                false => crate::offers::unsubscribe(&peer, uri).await,
            }
        })
        .await
    }

    /// Takes one subscription of `uri` away; returns whether it was the last.
    fn forget_subscription(&self, shared: &ServerShared, uri: &str) -> bool {
        shared.subscribed.send_if_modified(|subscribed| match subscribed.get_mut(uri) {
            Some(count) if *count > 1 => {
                *count -= 1;
                false
            }
            Some(_) => subscribed.remove(uri).is_some(),
            None => false,
        })
    }

    fn running(&self, server: &str) -> Result<Arc<ServerShared>, OfferError> {
        (self.published.load().get(server))
            .map(|running| running.shared.clone())
            .ok_or_else(|| no_server(server))
    }

    /// Returns the supervisor's actor, for a supervisor above it to link.
    pub fn supervisor(&self) -> ActorCell {
        self.actor.load().get_cell()
    }

    /// Starts a fresh supervisor under `above`, after the old one failed and its server
    /// actors were stopped (their tools withdrawn), and starts the configured servers
    /// again; the handle uses the new supervisor.
    pub async fn respawn(&self, above: ActorCell) -> Result<ActorCell, ractor::SpawnErr> {
        let supervisor = McpSupervisorActor {
            registry: self.registry.clone(),
            published: self.published.clone(),
            changed: self.changed.clone(),
            offers_changed: self.offers_changed.clone(),
            remember_in: self.remember_in.clone(),
            audit: self.audit.clone(),
        };
        let (actor, _) = Actor::spawn_linked(None, supervisor, (), above).await?;
        self.actor.store(Arc::new(actor.clone()));
        // What the old supervisor published is gone with its servers.
        self.published.store(Arc::default());
        self.changed.notify_one();
        let servers = (*self.configured.load_full()).clone();
        let (manager, count) = (self.clone(), servers.len());
        // Connecting takes as long as the servers take; the supervisor above does not wait.
        tokio::spawn(
            async move {
                if let Err(error) = manager.reload(servers).await {
                    error!(%error, "the restarted mcp supervisor could not start its servers");
                }
            }
            .instrument(tracing::info_span!(
                "mcp",
                task = "restart servers",
                servers = count
            )),
        );
        Ok(actor.get_cell())
    }

    /// Makes the running servers match `servers`.
    pub async fn reload(&self, servers: Vec<McpServerConfig>) -> Result<(), McpError> {
        self.configured.store(Arc::new(servers.clone()));
        let timeout = Duration::from_secs(60);
        let actor = self.actor.load_full();
        match actor.call(|reply| McpSupervisorMsg::Reload { servers, reply }, Some(timeout)).await {
            Ok(CallResult::Success(())) => Ok(()),
            Ok(CallResult::Timeout) => Err(McpError::Timeout(timeout)),
            Ok(CallResult::SenderError) | Err(_) => Err(McpError::Stopped),
        }
    }

    /// Returns what each running server offers besides tools, in server name order.
    pub fn offers(&self) -> Vec<ServerOffers> {
        (self.published.load().values())
            .map(|running| ServerOffers {
                server: running.shared.name().to_owned(),
                offers: running.shared.offers.load_full(),
                prefix: running.shared.config.prefix,
            })
            .collect()
    }

    /// Routes the resource `uri`: to `server` when given; else to the first server (by
    /// name) that lists it, else to the first with a template that matches it, else to the
    /// only server that offers resources.
    pub fn resource(&self, uri: &str, server: Option<&str>) -> Result<ResourceRoute, OfferError> {
        let published = self.published.load();
        if let Some(server) = server.filter(|s| !s.is_empty()) {
            let running = published.get(server).ok_or_else(|| no_server(server))?;
            return Ok(ResourceRoute::of(server, &running.shared, uri));
        }
        let listed = published.iter().find(|(_, r)| r.shared.offers.load().listed(uri).is_some());
        let matched =
            || published.iter().find(|(_, r)| r.shared.offers.load().template(uri).is_some());
        if let Some((name, running)) = listed.or_else(matched) {
            return Ok(ResourceRoute::of(name, &running.shared, uri));
        }
        let mut with_resources =
            published.iter().filter(|(_, r)| !r.shared.offers.load().resources.is_empty());
        match (with_resources.next(), with_resources.next()) {
            (Some((name, running)), None) => Ok(ResourceRoute::of(name, &running.shared, uri)),
            _ => Err(OfferError::NotFound(format!(
                "no mcp server lists the resource {uri:?} or has a template that matches it; \
                 name the server that returned it"
            ))),
        }
    }

    /// Routes the resource template (or resource) `uri` to the server that offers it.
    pub fn template(&self, uri: &str) -> Result<ResourceRoute, OfferError> {
        let published = self.published.load();
        let (name, running) = (published.iter())
            .find(|(_, running)| {
                let offers = running.shared.offers.load();
                offers.templates.iter().any(|t| t.uri_template == uri)
                    || offers.listed(uri).is_some()
            })
            .ok_or_else(|| {
                OfferError::NotFound(format!("no mcp server offers the resource template {uri:?}"))
            })?;
        Ok(ResourceRoute::of(name, &running.shared, uri))
    }

    /// Reads the resource `uri` from `server`.
    pub async fn read_resource(
        &self,
        server: &str,
        uri: &str,
    ) -> Result<rmcp::model::ReadResourceResult, OfferError> {
        self.ask(server, |peer| async move { crate::offers::read(&peer, uri).await }).await
    }

    /// Returns the server of the prompt the catalog names `name`, and its name there.
    pub fn prompt(&self, name: &str) -> Result<(String, String), OfferError> {
        self.offers()
            .into_iter()
            .find_map(|server| {
                let prompt =
                    server.offers.prompts.iter().find(|p| server.published(&p.name) == name)?;
                Some((server.server.clone(), prompt.name.clone()))
            })
            .ok_or_else(|| {
                OfferError::NotFound(format!("no mcp server offers the prompt {name:?}"))
            })
    }

    /// Gets the prompt `name` (its name on `server`) with `arguments`, for a caller that
    /// answers input rounds itself when `rounds` is given.
    pub async fn get_prompt(
        &self,
        server: &str,
        name: &str,
        arguments: Option<rmcp::model::JsonObject>,
        rounds: Option<&toolmesh_core::InputRounds>,
    ) -> Result<rmcp::model::GetPromptResponse, OfferError> {
        self.ask(server, |peer| async move {
            crate::offers::get_prompt(&peer, name, arguments, rounds).await
        })
        .await
    }

    /// Asks `server` to complete an argument (of a prompt by its name on the server, or of
    /// a resource template).
    pub async fn complete(
        &self,
        server: &str,
        params: rmcp::model::CompleteRequestParams,
    ) -> Result<rmcp::model::CompleteResult, OfferError> {
        self.ask(server, |peer| async move { crate::offers::complete(&peer, params).await }).await
    }

    /// Sends `request` to `server` over its connection (an idle lazy server is opened), and
    /// returns its answer, within the server's `timeout_ms` for each.
    async fn ask<T, F, Fut>(&self, server: &str, request: F) -> Result<T, OfferError>
    where
        F: FnOnce(Arc<rmcp::service::Peer<rmcp::RoleClient>>) -> Fut,
        Fut: std::future::Future<Output = Result<T, rmcp::service::ServiceError>>,
    {
        let shared = (self.published.load().get(server))
            .map(|running| running.shared.clone())
            .ok_or_else(|| no_server(server))?;
        let server = shared.name().to_owned();
        let timeout = shared.config.timeout;
        let peer = match shared.connection(tokio::time::Instant::now() + timeout).await {
            Ok(peer) => peer,
            Err(reason) => return Err(OfferError::Unavailable { server, reason }),
        };
        match tokio::time::timeout(timeout, request(peer)).await {
            Err(_) => Err(OfferError::Timeout { server, timeout }),
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(rmcp::service::ServiceError::McpError(error))) => {
                let code = match error.code {
                    rmcp::model::ErrorCode::RESOURCE_NOT_FOUND => ErrorCode::NotFound,
                    rmcp::model::ErrorCode::INVALID_PARAMS => ErrorCode::InvalidArgument,
                    _ => ErrorCode::Internal,
                };
                Err(OfferError::Failed { server, message: error.message.to_string(), code })
            }
            Ok(Err(error)) => Err(OfferError::Unavailable { server, reason: error.to_string() }),
        }
    }

    /// Returns each server's health.
    pub fn health(&self) -> Vec<(String, ServerHealth)> {
        self.published
            .load()
            .iter()
            .map(|(name, running)| (name.clone(), (**running.shared.health.load()).clone()))
            .collect()
    }

    /// Returns the protocol version negotiated with `server`, while connected.
    pub fn protocol(&self, server: &str) -> Option<String> {
        self.published
            .load()
            .get(server)
            .and_then(|r| r.shared.protocol.load_full())
            .map(|p| (*p).clone())
    }

    /// Returns the actor that serves `server`, to inspect or supervise it: killing it
    /// is what a crash looks like to the supervisor, which starts a fresh one.
    pub fn actor(&self, server: &str) -> Option<ActorCell> {
        self.published.load().get(server).map(|running| running.actor.get_cell())
    }

    /// Waits until some server's health changes, or servers are added or removed.
    pub async fn health_changed(&self) {
        self.changed.notified().await;
    }

    /// Stops every server and the supervisor.
    pub async fn stop(&self) {
        let actor = self.actor.load_full();
        let _ = actor.stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(15))).await;
    }
}

#[async_trait::async_trait]
impl toolmesh_core::Supervised for McpManager {
    fn actor(&self) -> ractor::ActorCell {
        self.supervisor()
    }

    async fn respawn(
        &self,
        root: ractor::ActorCell,
        _: String,
    ) -> Result<ractor::ActorCell, String> {
        McpManager::respawn(self, root).await.map_err(|e| e.to_string())
    }
}
