//! The messages of an [`McpClientActor`](crate::actor::McpClientActor).

use std::sync::Arc;

use rmcp::{
    RoleClient,
    model::Tool,
    service::{Peer, RunningService},
};

use crate::group::ProcessGroupGuard;
use crate::handler::McpClientHandler;

pub(crate) type Connection = RunningService<RoleClient, McpClientHandler>;

/// Messages of an [`McpClientActor`].
pub enum McpMsg {
    /// Connects now, unless connected or connecting.
    Connect,
    /// A connection attempt succeeded.
    Connected {
        /// The running connection.
        connection: Box<Connection>,
        /// A stdio server's process group, killed when the connection ends.
        group: Option<ProcessGroupGuard>,
        /// The server's tools.
        tools: Vec<Tool>,
    },
    /// A connection attempt failed.
    ConnectFailed {
        /// Why.
        reason: String,
    },
    /// The server said its tool list changed.
    ToolsChanged,
    /// The server said its resources, resource templates or prompts changed.
    OffersChanged,
    /// The listing remembered from the last run was read (`None`: there is none).
    Remembered {
        /// Its tools.
        tools: Option<Vec<Tool>>,
    },
    /// A fresh tool list of connection `generation`.
    ToolsListed {
        /// The connection it came from.
        generation: u64,
        /// The tools.
        tools: Vec<Tool>,
    },
    /// Connection `generation` of a lazy server went unused for its idle timeout.
    Idle {
        /// The connection.
        generation: u64,
    },
    /// A call found the connection `peer` broken.
    Broken {
        /// The connection the call used.
        peer: Arc<Peer<RoleClient>>,
        /// What the call saw.
        reason: String,
    },
    /// Connection `generation` ended.
    Disconnected {
        /// The connection that ended.
        generation: u64,
        /// Why.
        reason: String,
    },
}
