//! What the [`McpClientActor`](crate::actor::McpClientActor) keeps between messages.

use std::sync::Arc;

use rmcp::model::Tool;

/// The [`McpClientActor`]'s state.
#[derive(Default)]
pub struct McpClientState {
    pub(crate) generation: u64,
    pub(crate) connecting: bool,
    pub(crate) failures: u32,
    /// Dropping it closes the current connection. It lives in the state so that however
    /// the actor ends (stop, crash, kill), the connection and its child process end too.
    pub(crate) connection: Option<tokio_util::sync::DropGuard>,
    /// The tools of the last listing published, by their name on the server.
    pub(crate) listed: Listing,
    /// The server's toolkit as last published.
    pub(crate) toolkit: Option<toolmesh_core::Toolkit>,
}

/// A server's tools by their name on the server.
pub(crate) type Listing = Arc<std::collections::HashMap<String, Tool>>;

/// Where a listing comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// The server listed it.
    Server,
    /// The data directory kept it from the last run.
    Remembered,
}
