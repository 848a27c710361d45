use std::{sync::Arc, time::Duration};

use arc_swap::ArcSwap;
use ractor::{ActorRef, rpc::CallResult};
use toolmesh_core::Toolkit;

use crate::{
    Catalog, PublishedCatalog, Registered, RegistryError, RegistryMsg, SourceUpdate, ToolEntry,
};

/// How callers use the registry: reads go to the published snapshot, writes to the actor.
#[derive(Debug, Clone)]
pub struct RegistryHandle {
    actor: Arc<ArcSwap<ActorRef<RegistryMsg>>>,
    published: Arc<PublishedCatalog>,
    timeout: Duration,
}

impl RegistryHandle {
    /// Returns a handle to the registry actor held in `actor` (a supervisor swaps in a
    /// restarted one), which publishes into `published`.
    pub fn new(
        actor: Arc<ArcSwap<ActorRef<RegistryMsg>>>,
        published: Arc<PublishedCatalog>,
    ) -> Self {
        RegistryHandle { actor, published, timeout: Duration::from_secs(10) }
    }

    /// Starts a registry with an empty catalog; returns its handle.
    pub async fn start() -> Result<Self, ractor::SpawnErr> {
        let published = Arc::new(PublishedCatalog::default());
        let (actor, _) =
            ractor::Actor::spawn(None, crate::RegistryActor, published.clone()).await?;
        Ok(RegistryHandle::new(Arc::new(ArcSwap::from_pointee(actor)), published))
    }

    /// Returns the registry's actor, for a supervisor to link.
    pub fn actor(&self) -> ractor::ActorCell {
        self.actor.load().get_cell()
    }

    /// Starts a fresh registry actor under `supervisor`, resuming from the last published
    /// catalog (a restart loses nothing committed), and points this handle and its clones
    /// at it.
    pub async fn respawn(
        &self,
        supervisor: ractor::ActorCell,
    ) -> Result<ractor::ActorCell, ractor::SpawnErr> {
        let (actor, _) = ractor::Actor::spawn_linked(
            None,
            crate::RegistryActor,
            self.published.clone(),
            supervisor,
        )
        .await?;
        self.actor.store(Arc::new(actor.clone()));
        Ok(actor.get_cell())
    }

    /// Returns the current catalog snapshot; no mailbox round trip.
    pub fn snapshot(&self) -> Arc<Catalog> {
        self.published.load()
    }

    /// Returns a receiver that sees the version of every newly published catalog.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.published.subscribe()
    }

    /// Returns the tool named `name` from the current snapshot.
    pub fn resolve(&self, name: &str) -> Option<Arc<ToolEntry>> {
        self.published.get(name)
    }

    /// Registers a standalone tool.
    pub async fn register(&self, tool: ToolEntry) -> Result<Registered, RegistryError> {
        self.call(|reply| RegistryMsg::Register { tool, reply }).await
    }

    /// Registers a toolkit and its tools, all or nothing.
    pub async fn register_toolkit(
        &self,
        toolkit: Toolkit,
        tools: Vec<ToolEntry>,
    ) -> Result<(), RegistryError> {
        self.call(|reply| RegistryMsg::RegisterToolkit { toolkit, tools, reply }).await
    }

    /// Sets what the operator states about tools ([`Overrides`](crate::Overrides)); it
    /// applies to the tools that join from then on, so it is set before any source
    /// publishes.
    pub async fn set_overrides(&self, overrides: crate::Overrides) -> Result<(), RegistryError> {
        self.call(|reply| RegistryMsg::SetOverrides { overrides, reply }).await
    }

    /// Replaces all tools and toolkits of one source, all or nothing.
    pub async fn replace_source(&self, update: SourceUpdate) -> Result<(), RegistryError> {
        self.call(|reply| RegistryMsg::ReplaceSource { update, reply }).await
    }

    async fn call<T>(
        &self,
        message: impl FnOnce(ractor::RpcReplyPort<Result<T, RegistryError>>) -> RegistryMsg,
    ) -> Result<T, RegistryError>
    where
        T: Send + 'static,
    {
        match self.actor.load().call(message, Some(self.timeout)).await {
            Ok(CallResult::Success(result)) => result,
            Ok(CallResult::Timeout) => Err(RegistryError::Timeout),
            Ok(CallResult::SenderError) | Err(_) => Err(RegistryError::Unavailable),
        }
    }
}

#[async_trait::async_trait]
impl toolmesh_core::Supervised for RegistryHandle {
    fn actor(&self) -> ractor::ActorCell {
        RegistryHandle::actor(self)
    }

    async fn respawn(
        &self,
        root: ractor::ActorCell,
        _: String,
    ) -> Result<ractor::ActorCell, String> {
        RegistryHandle::respawn(self, root).await.map_err(|e| e.to_string())
    }
}
