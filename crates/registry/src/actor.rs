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
        let before = state.catalog().version;
        match message {
            RegistryMsg::Register { tool, reply } => {
                let _ = reply.send(state.register(tool));
            }
            RegistryMsg::RegisterToolkit { toolkit, tools, reply } => {
                let _ = reply.send(state.register_toolkit(toolkit, tools));
            }
            RegistryMsg::ReplaceSource { update, reply } => {
                let _ = reply.send(state.replace_source(update));
            }
        }
        if state.catalog().version != before {
            let catalog = Arc::clone(state.catalog());
            debug!(version = catalog.version, tools = catalog.tools.len(), "catalog published");
            published.store(catalog);
        }
        Ok(())
    }
}
