use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::debug;

use crate::{PublishedCatalog, RegistryMsg, RegistryState};

/// Owns the catalog: applies writes one at a time and publishes each new snapshot.
///
/// Its argument is the shared snapshot cell. A restarted registry rebuilds its state from
/// the last published snapshot, so a restart loses nothing that was committed.
#[derive(Debug, Default, Clone, Copy)]
pub struct RegistryActor;

impl Actor for RegistryActor {
    type Msg = RegistryMsg;
    type State = (RegistryState, Arc<PublishedCatalog>);
    type Arguments = Arc<PublishedCatalog>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        published: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok((RegistryState::from_catalog(published.load()), published))
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        (state, published): &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // The new snapshot is published before the writer hears back, so that a writer
        // reads its own write (a worker's tools are callable once it is welcomed).
        let before = state.catalog().version;
        let publish = |state: &RegistryState, published: &PublishedCatalog| {
            if state.catalog().version != before {
                let catalog = Arc::clone(state.catalog());
                debug!(version = catalog.version, tools = catalog.len(), "catalog published");
                published.store(catalog);
            }
        };
        match message {
            RegistryMsg::Register { tool, reply } => {
                let outcome = state.register(tool);
                publish(state, published);
                let _ = reply.send(outcome);
            }
            RegistryMsg::RegisterToolkit { toolkit, tools, reply } => {
                let outcome = state.register_toolkit(toolkit, tools);
                publish(state, published);
                let _ = reply.send(outcome);
            }
            RegistryMsg::SetOverrides { overrides, reply } => {
                state.set_overrides(overrides);
                let _ = reply.send(Ok(()));
            }
            RegistryMsg::ReplaceSource { update, reply } => {
                let outcome = state.replace_source(update);
                publish(state, published);
                let _ = reply.send(outcome);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

    use std::sync::Arc;

    use serde_json::{Value, json};
    use toolmesh_core::{Backend, BackendError, CallContext, ToolOutput, ToolSource, ToolSpec};

    use crate::{RegistryHandle, SourceUpdate, ToolEntry};

    struct Nop;

    #[async_trait::async_trait]
    impl Backend for Nop {
        async fn call(&self, _: CallContext, _: Value) -> Result<ToolOutput, BackendError> {
            Ok(ToolOutput::default())
        }
    }

    /// The snapshot is published before the writer hears back: what it wrote, it reads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_writer_reads_its_own_write_at_once() {
        let registry = RegistryHandle::start().await.unwrap();
        for i in 0..2_000 {
            let name = format!("tool_{i}");
            let spec = ToolSpec::new(&name, "d", json!({"type": "object"}), ToolSource::local("x"));
            let update = SourceUpdate {
                source: ToolSource::local("x"),
                tools: vec![ToolEntry::new(spec, Arc::new(Nop)).unwrap()],
                toolkits: vec![],
                toolkit: None,
                unchanged: vec![],
            };
            registry.replace_source(update).await.unwrap();
            assert!(registry.resolve(&name).is_some(), "write {i} not visible to its writer");
        }
    }
}
