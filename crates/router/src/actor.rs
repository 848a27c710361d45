use std::sync::Arc;

use arc_swap::ArcSwap;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use toolmesh_registry::{PublishedCatalog, RegistryActor, RegistryHandle, RegistryMsg};
use tracing::{error, warn};

/// Messages of the [`RouterActor`].
#[derive(Debug)]
pub enum RouterMsg {
    /// Returns the current registry actor (it changes when the registry is restarted).
    Registry {
        /// The registry.
        reply: RpcReplyPort<ActorRef<RegistryMsg>>,
    },
}

/// The root supervisor: owns the [`RegistryActor`] and restarts it if it dies. The
/// restarted registry resumes from the last published catalog, and the handles keep
/// working because they find the registry through the shared cell.
#[derive(Debug, Clone)]
pub struct RouterActor {
    published: Arc<PublishedCatalog>,
    registry_cell: Arc<ArcSwap<ActorRef<RegistryMsg>>>,
}

/// The [`RouterActor`]'s state.
#[derive(Debug)]
pub struct RouterState {
    registry: ActorRef<RegistryMsg>,
}

impl RouterActor {
    /// Starts the router actor and the registry it supervises; returns the router actor and
    /// a handle to the registry.
    pub async fn start() -> Result<(ActorRef<RouterMsg>, RegistryHandle), ActorProcessingErr> {
        let published = Arc::new(PublishedCatalog::default());
        let (registry, _) = Actor::spawn(None, RegistryActor, published.clone()).await?;
        let registry_cell = Arc::new(ArcSwap::from_pointee(registry.clone()));
        let actor =
            RouterActor { published: published.clone(), registry_cell: registry_cell.clone() };
        let (router, _) = Actor::spawn(None, actor, registry).await?;
        Ok((router, RegistryHandle::new(registry_cell, published)))
    }
}

impl Actor for RouterActor {
    type Msg = RouterMsg;
    type State = RouterState;
    type Arguments = ActorRef<RegistryMsg>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        registry: ActorRef<RegistryMsg>,
    ) -> Result<Self::State, ActorProcessingErr> {
        // Adopt the registry started beside us, so that it is running before any handle
        // exists, then supervise it from here on.
        registry.get_cell().link(myself.get_cell());
        Ok(RouterState { registry })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.registry.stop(Some("router stopped".into()));
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            RouterMsg::Registry { reply } => {
                let _ = reply.send(state.registry.clone());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let dead = match &event {
            SupervisionEvent::ActorFailed(cell, reason) => {
                error!(%reason, "registry failed; restarting it from the last published catalog");
                cell.get_id()
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                warn!(?reason, "registry stopped; restarting it from the last published catalog");
                cell.get_id()
            }
            SupervisionEvent::ActorStarted(_) | SupervisionEvent::ProcessGroupChanged(_) => {
                return Ok(());
            }
        };
        if dead != state.registry.get_id() {
            return Ok(());
        }
        let (registry, _) =
            Actor::spawn_linked(None, RegistryActor, self.published.clone(), myself.get_cell())
                .await?;
        self.registry_cell.store(Arc::new(registry.clone()));
        state.registry = registry;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{Value, json};
    use toolmesh_core::{Backend, BackendError, CallContext, ToolOutput, ToolSource, ToolSpec};
    use toolmesh_registry::ToolEntry;

    use super::*;

    struct Nop;

    #[async_trait::async_trait]
    impl Backend for Nop {
        async fn call(&self, _: CallContext, _: Value) -> Result<ToolOutput, BackendError> {
            Ok(ToolOutput::default())
        }
    }

    fn tool(name: &str) -> ToolEntry {
        let spec = ToolSpec::new(name, "d", json!({"type": "object"}), ToolSource::local("t"));
        ToolEntry::new(spec, Arc::new(Nop)).unwrap()
    }

    #[tokio::test]
    async fn a_dead_registry_is_restarted_with_the_published_catalog() {
        let (router, handle) = RouterActor::start().await.unwrap();
        handle.register(tool("kept")).await.unwrap();
        let first = ractor::call!(router, |reply| RouterMsg::Registry { reply }).unwrap();

        first.stop(Some("test kills the registry".into()));
        let mut replaced = None;
        for _ in 0..200 {
            let current = ractor::call!(router, |reply| RouterMsg::Registry { reply }).unwrap();
            if current.get_id() != first.get_id() {
                replaced = Some(current);
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(replaced.is_some(), "the router started a new registry");

        // The same handle reaches the new registry, which kept what was committed.
        handle.register(tool("added")).await.unwrap();
        let names: Vec<_> = handle.snapshot().tools.keys().cloned().collect();
        assert_eq!(names, ["added", "kept"]);
        router.stop(None);
    }
}
