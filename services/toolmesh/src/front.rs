//! The front door's actor: it serves the gRPC API, puts reloaded routing profiles in force,
//! and drains the calls in flight. Calls never pass through its mailbox: each runs in its
//! own task, through the [`Router`] it shares.

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, rpc::CallResult};
use std::sync::Arc;
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use toolmesh_config::{RoutingConfig, ServerConfig};
use toolmesh_policy::Policy;
use toolmesh_router::{Admission, Router};
use tracing::{Instrument, info};

use crate::{App, server};

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
        /// What it serves.
        app: Box<App>,
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
pub struct RouterActor;

/// The gRPC server while it runs.
struct Serving {
    stop: oneshot::Sender<()>,
    /// Ends the sessions of remote workers, once no call needs them.
    sessions: CancellationToken,
    server: JoinHandle<()>,
    health: tonic_health::server::HealthReporter,
    health_task: JoinHandle<()>,
}

/// The [`RouterActor`]'s state: the router it admits calls through, the routing
/// configuration in force, and the server.
pub struct RouterState {
    router: Router,
    routing: RoutingConfig,
    serving: Option<Serving>,
}

impl RouterState {
    fn policy(&self) -> Arc<Policy> {
        self.router.admission().policy().clone()
    }
}

impl Actor for RouterActor {
    type Msg = RouterMsg;
    type State = RouterState;
    type Arguments = (Router, RoutingConfig);

    async fn pre_start(
        &self,
        _: ActorRef<RouterMsg>,
        (router, routing): Self::Arguments,
    ) -> Result<RouterState, ActorProcessingErr> {
        // The router admits calls by `routing` already; reloads change both together.
        Ok(RouterState { router, routing, serving: None })
    }

    async fn post_stop(
        &self,
        _: ActorRef<RouterMsg>,
        state: &mut RouterState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(serving) = state.serving.take() {
            serving.server.abort();
            serving.health_task.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<RouterMsg>,
        message: RouterMsg,
        state: &mut RouterState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            RouterMsg::Serve { listener, app, config, reply } => {
                let _ = reply.send(serve(state, listener, &app, &config).await);
            }
            RouterMsg::Reload { routing, policy, reply } => {
                // An unchanged policy stays in force (with its audit log); a new one is
                // dropped unused.
                let policy_changed = policy.config() != state.policy().config();
                if routing != state.routing || policy_changed {
                    let policy = if policy_changed { policy } else { state.policy() };
                    state.router.set_admission(Admission::new(&routing, policy));
                    state.routing = routing;
                    info!(policy_changed, "routing profiles and tool policy reloaded");
                }
                let _ = reply.send(());
            }
            RouterMsg::Drain { grace, reply } => {
                let _ = reply.send(drain(state, grace).await);
            }
        }
        Ok(())
    }
}

async fn serve(
    state: &mut RouterState,
    listener: TcpListener,
    app: &App,
    config: &ServerConfig,
) -> Result<oneshot::Receiver<anyhow::Result<()>>, FrontDoorError> {
    if state.serving.is_some() {
        return Err(FrontDoorError::Serving);
    }
    let (health, health_service, health_task) = server::health_service(app).await;
    let (stop, stopped) = oneshot::channel::<()>();
    let sessions = CancellationToken::new();
    let server =
        server::grpc_server(listener, app, config, health_service, sessions.clone(), async move {
            let _ = stopped.await;
        })
        .map_err(FrontDoorError::Start)?;
    let (ended_tx, ended) = oneshot::channel();
    let server = tokio::spawn(
        async move {
            let _ = ended_tx.send(server.await.map_err(anyhow::Error::from));
        }
        .instrument(tracing::info_span!("front door", task = "grpc server")),
    );
    state.serving = Some(Serving { stop, sessions, server, health, health_task });
    Ok(ended)
}

async fn drain(state: &mut RouterState, grace: Duration) -> bool {
    let Some(mut serving) = state.serving.take() else { return true };
    server::not_serving(&serving.health).await;
    let _ = serving.stop.send(());
    // Every call answered, and the server closed its connections.
    let router = state.router.clone();
    let server = &mut serving.server;
    let sessions = serving.sessions.clone();
    let finished = tokio::time::timeout(grace, async move {
        router.drained().await;
        // Remote workers stay connected while calls run on them; then their sessions end
        // too (they connect to another router), or the server would wait for them.
        sessions.cancel();
        let _ = server.await;
    })
    .await
    .is_ok();
    if !finished {
        server::grace_exceeded(grace, state.router.in_flight());
        serving.server.abort();
    }
    serving.health_task.abort();
    finished
}

/// The handle to the [`RouterActor`].
#[derive(Debug, Clone)]
pub struct FrontDoor {
    actor: ActorRef<RouterMsg>,
}

impl FrontDoor {
    /// Starts the front door over `router`, which admits calls by `routing`'s profiles.
    pub(crate) async fn start(
        router: Router,
        routing: RoutingConfig,
    ) -> Result<Self, ractor::SpawnErr> {
        let (actor, _) = Actor::spawn(None, RouterActor, (router, routing)).await?;
        Ok(FrontDoor { actor })
    }

    async fn ask<T: Send + 'static>(
        &self,
        message: impl FnOnce(RpcReplyPort<T>) -> RouterMsg,
        timeout: Option<Duration>,
    ) -> Result<T, FrontDoorError> {
        match self.actor.call(message, timeout).await {
            Ok(CallResult::Success(value)) => Ok(value),
            Ok(CallResult::Timeout) => Err(FrontDoorError::Unreachable("timed out")),
            Ok(CallResult::SenderError) | Err(_) => Err(FrontDoorError::Unreachable("stopped")),
        }
    }

    /// Starts the gRPC server on `listener`; the receiver resolves when it ends.
    pub(crate) async fn serve(
        &self,
        listener: TcpListener,
        app: App,
        config: ServerConfig,
    ) -> Result<oneshot::Receiver<anyhow::Result<()>>, FrontDoorError> {
        let app = Box::new(app);
        self.ask(|reply| RouterMsg::Serve { listener, app, config: Box::new(config), reply }, None)
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

    /// Stops the actor (and a server still running).
    pub(crate) async fn stop(&self) {
        let _ = self.actor.stop_and_wait(None, Some(Duration::from_secs(5))).await;
    }
}
