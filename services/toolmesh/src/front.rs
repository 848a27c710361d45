//! The front door's actor: it serves the gRPC API, puts reloaded routing profiles in force,
//! and drains the calls in flight. Calls never pass through its mailbox: each runs in its
//! own task, through the [`Router`] it shares. The root supervisor restarts it: what it
//! serves lives in [`FrontDoor`]'s shared state, so a fresh actor takes over the running
//! server.

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, rpc::CallResult};
use std::sync::Arc;
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use toolmesh_config::ServerConfig;
use toolmesh_policy::Policy;
use toolmesh_router::{Admission, Router, RoutingConfig};
use tracing::{Instrument, info};

use crate::server::{self, Front};

/// Why the front door could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum FrontDoorError {
    /// It serves already.
    #[error("the front door serves already")]
    Serving,
    /// The gRPC server could not be built.
    #[error("cannot start the gRPC server: {0}")]
    Start(#[source] anyhow::Error),
    /// Its actor has stopped, or did not answer in time.
    #[error("the front door did not answer: {0}")]
    Unreachable(&'static str),
}

/// Messages of the [`RouterActor`].
pub enum RouterMsg {
    /// Starts the gRPC server on `listener`; the reply's receiver resolves when it ends.
    Serve {
        /// The bound listener.
        listener: TcpListener,
        /// Limits and timeouts.
        config: Box<ServerConfig>,
        /// Resolves with the server's end.
        reply: RpcReplyPort<Result<oneshot::Receiver<anyhow::Result<()>>, FrontDoorError>>,
    },
    /// Puts `routing`'s profiles and `policy` in force for the calls that start from now on.
    Reload {
        /// The new `[routing]` section.
        routing: RoutingConfig,
        /// The new `[policy]`, compiled.
        policy: Arc<Policy>,
        /// Done.
        reply: RpcReplyPort<()>,
    },
    /// Stops accepting, marks the API NOT_SERVING, and waits up to `grace` for the calls
    /// in flight; replies whether they all finished.
    Drain {
        /// How long calls may take to finish.
        grace: Duration,
        /// Whether every call finished in time.
        reply: RpcReplyPort<bool>,
    },
}

/// Owns the front door.
pub struct RouterActor {
    state: Arc<RouterState>,
}

/// The gRPC server while it runs.
struct Serving {
    stop: oneshot::Sender<()>,
    /// Ends the sessions of remote workers, once no call needs them.
    sessions: CancellationToken,
    server: JoinHandle<()>,
    health: tonic_health::server::HealthReporter,
    health_task: JoinHandle<()>,
    /// The API's services, marked NOT_SERVING on drain.
    services: Vec<&'static str>,
}

/// What the front door serves, kept by its handle so that it outlives a crash of the
/// actor: the router it admits calls through, the routing configuration in force, and the
/// server while it runs. Only the actor writes it, one message at a time.
pub struct RouterState {
    front: Front,
    routing: std::sync::Mutex<RoutingConfig>,
    serving: tokio::sync::Mutex<Option<Serving>>,
}

impl RouterState {
    fn router(&self) -> &Router {
        &self.front.api.router
    }

    fn policy(&self) -> Arc<Policy> {
        self.router().admission().policy().clone()
    }

    fn reload(&self, routing: RoutingConfig, policy: Arc<Policy>) {
        let mut current = self.routing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // An unchanged policy stays in force (with its audit log); a new one is dropped
        // unused.
        let policy_changed = policy.config() != self.policy().config();
        if routing != *current || policy_changed {
            let policy = if policy_changed { policy } else { self.policy() };
            self.router().set_admission(Admission::new(&routing, policy));
            *current = routing;
            info!(policy_changed, "routing profiles and tool policy reloaded");
        }
    }
}

impl Actor for RouterActor {
    type Msg = RouterMsg;
    type State = Arc<RouterState>;
    type Arguments = ();

    async fn pre_start(
        &self,
        _: ActorRef<RouterMsg>,
        (): (),
    ) -> Result<Arc<RouterState>, ActorProcessingErr> {
        Ok(self.state.clone())
    }

    async fn handle(
        &self,
        _: ActorRef<RouterMsg>,
        message: RouterMsg,
        state: &mut Arc<RouterState>,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            RouterMsg::Serve { listener, config, reply } => {
                let mut serving = state.serving.lock().await;
                let _ = reply.send(serve(&mut serving, listener, &state.front, &config).await);
            }
            RouterMsg::Reload { routing, policy, reply } => {
                state.reload(routing, policy);
                let _ = reply.send(());
            }
            RouterMsg::Drain { grace, reply } => {
                let serving = state.serving.lock().await.take();
                let _ = reply.send(drain(state.router(), serving, grace).await);
            }
        }
        Ok(())
    }
}

async fn serve(
    state: &mut Option<Serving>,
    listener: TcpListener,
    front: &Front,
    config: &ServerConfig,
) -> Result<oneshot::Receiver<anyhow::Result<()>>, FrontDoorError> {
    if state.is_some() {
        return Err(FrontDoorError::Serving);
    }
    let (health, health_service, health_task) =
        crate::api::health::health_service(&front.api).await;
    let (stop, stopped) = oneshot::channel::<()>();
    let sessions = CancellationToken::new();
    let server = server::grpc_server(
        listener,
        front,
        config,
        health_service,
        sessions.clone(),
        async move {
            let _ = stopped.await;
        },
    )
    .map_err(FrontDoorError::Start)?;
    let (ended_tx, ended) = oneshot::channel();
    let server = tokio::spawn(
        async move {
            let _ = ended_tx.send(server.await.map_err(anyhow::Error::from));
        }
        .instrument(tracing::info_span!("front door", task = "grpc server")),
    );
    let services = crate::api::services(&front.api);
    *state = Some(Serving { stop, sessions, server, health, health_task, services });
    Ok(ended)
}

async fn drain(router: &Router, serving: Option<Serving>, grace: Duration) -> bool {
    let Some(mut serving) = serving else { return true };
    crate::api::health::not_serving(&serving.services, &serving.health).await;
    let _ = serving.stop.send(());
    // Every call answered, and the server closed its connections.
    let calls = router.clone();
    let server = &mut serving.server;
    let sessions = serving.sessions.clone();
    let finished = tokio::time::timeout(grace, async move {
        calls.drained().await;
        // Remote workers stay connected while calls run on them; then their sessions end
        // too (they connect to another router), or the server would wait for them.
        sessions.cancel();
        let _ = server.await;
    })
    .await
    .is_ok();
    if !finished {
        server::grace_exceeded(grace, router.in_flight());
        serving.server.abort();
    }
    serving.health_task.abort();
    finished
}

/// The handle to the [`RouterActor`], and what it serves.
#[derive(Clone)]
pub struct FrontDoor {
    actor: Arc<arc_swap::ArcSwap<ActorRef<RouterMsg>>>,
    state: Arc<RouterState>,
}

impl std::fmt::Debug for FrontDoor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontDoor").field("actor", &self.actor.load().get_id()).finish()
    }
}

impl FrontDoor {
    /// Starts the front door over what it serves; its router admits calls by `routing`'s
    /// profiles.
    pub(crate) async fn start(
        front: Front,
        routing: RoutingConfig,
    ) -> Result<Self, ractor::SpawnErr> {
        // The router admits calls by `routing` already; reloads change both together.
        let state = Arc::new(RouterState {
            front,
            routing: std::sync::Mutex::new(routing),
            serving: tokio::sync::Mutex::new(None),
        });
        let (actor, _) = Actor::spawn(None, RouterActor { state: state.clone() }, ()).await?;
        Ok(FrontDoor { actor: Arc::new(arc_swap::ArcSwap::from_pointee(actor)), state })
    }

    async fn ask<T: Send + 'static>(
        &self,
        message: impl FnOnce(RpcReplyPort<T>) -> RouterMsg,
        timeout: Option<Duration>,
    ) -> Result<T, FrontDoorError> {
        match self.actor.load().call(message, timeout).await {
            Ok(CallResult::Success(value)) => Ok(value),
            Ok(CallResult::Timeout) => Err(FrontDoorError::Unreachable("timed out")),
            Ok(CallResult::SenderError) | Err(_) => Err(FrontDoorError::Unreachable("stopped")),
        }
    }

    /// Starts the gRPC server on `listener`; the receiver resolves when it ends.
    pub(crate) async fn serve(
        &self,
        listener: TcpListener,
        config: ServerConfig,
    ) -> Result<oneshot::Receiver<anyhow::Result<()>>, FrontDoorError> {
        self.ask(|reply| RouterMsg::Serve { listener, config: Box::new(config), reply }, None)
            .await?
    }

    /// Puts `routing`'s profiles and `policy` in force.
    pub(crate) async fn reload(
        &self,
        routing: RoutingConfig,
        policy: Arc<Policy>,
    ) -> Result<(), FrontDoorError> {
        self.ask(
            |reply| RouterMsg::Reload { routing, policy, reply },
            Some(Duration::from_secs(10)),
        )
        .await
    }

    /// Stops accepting and waits up to `grace` for the calls in flight; whether they all
    /// finished.
    pub(crate) async fn drain(&self, grace: Duration) -> bool {
        self.ask(|reply| RouterMsg::Drain { grace, reply }, None).await.unwrap_or(true)
    }

    /// Stops the actor, and a server still running.
    pub(crate) async fn stop(&self) {
        let actor = self.actor.load_full();
        let _ = actor.stop_and_wait(None, Some(Duration::from_secs(5))).await;
        if let Some(serving) = self.state.serving.lock().await.take() {
            serving.server.abort();
            serving.health_task.abort();
        }
    }
}

#[async_trait::async_trait]
impl toolmesh_core::Supervised for FrontDoor {
    fn actor(&self) -> ractor::ActorCell {
        self.actor.load().get_cell()
    }

    /// A fresh actor over the same state: the server it started keeps running, and the
    /// next reload or drain goes to the new actor.
    async fn respawn(
        &self,
        root: ractor::ActorCell,
        _: String,
    ) -> Result<ractor::ActorCell, String> {
        let front = RouterActor { state: self.state.clone() };
        let (actor, _) =
            Actor::spawn_linked(None, front, (), root).await.map_err(|e| e.to_string())?;
        self.actor.store(Arc::new(actor.clone()));
        Ok(actor.get_cell())
    }
}
