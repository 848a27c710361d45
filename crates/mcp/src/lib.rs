//! The MCP backend: every tool of every configured MCP server becomes a catalog tool.
//!
//! ```text
//! McpSupervisorActor (restarts a failed server actor; reload starts/stops servers)
//!  ├── McpClientActor "everything" ── one connection (stdio child / streamable HTTP)
//!  └── McpClientActor "search"     ── one connection
//! ```
//!
//! Transports: stdio, streamable HTTP, and legacy HTTP+SSE ([`SseClientTransport`]); a
//! server of type `http` is tried with streamable HTTP first, then SSE.
//!
//! Each [`McpClientActor`] owns one rmcp client connection: it initializes, lists every
//! page of tools, publishes them (as `<server>_<tool>` unless `prefix = "none"`), follows
//! `tools/list_changed`, and reconnects with capped exponential backoff when the connection
//! dies. Calls do not pass through the actor: each tool's backend reads the current
//! connection from state shared with the actor, sends `tools/call` with a progress token
//! routed back to the caller's event stream, and sends `notifications/cancelled` when the
//! call is cancelled or dropped. While a server is down its tools stay listed and calls
//! fail at once with UNAVAILABLE naming the server.
//!
//! [`McpManager`] is the handle the binary uses.
//!
//! toolmesh is an MCP server as well: [`Endpoint`] serves the mesh's tools to MCP clients.

mod actor;
mod backend;
mod config;
mod connection;
mod convert;
mod direct;
mod front;
mod group;
mod handler;
mod http_client;
mod listing;
mod manager;
mod messages;
mod metrics;
mod naming;
mod offers;
mod parallel;
mod pins;
mod provider;
mod remembered;
mod schemas;
mod shared;
mod sse;
mod state;

pub use actor::McpClientActor;
pub use config::{ConnectMode, McpConfig, McpServerConfig, McpTransport, PinMode, PrefixMode};
pub use front::{Caller, Endpoint, EndpointBody, McpEndpointConfig, Mesh, Offered, Page};
pub use group::ProcessGroupGuard;
pub use handler::McpClientHandler;
pub use http_client::TracingHttpClient;
pub use manager::{
    McpError, McpManager, McpSupervisorActor, McpSupervisorMsg, McpSupervisorState, OfferError,
    ServerOffers,
};
pub use messages::McpMsg;
pub use naming::publish_name;
pub use offers::{Offers, ResourceUpdate};

/// The toolmesh form of one MCP content block (of a prompt message, say).
pub fn content_part(block: rmcp::model::ContentBlock) -> toolmesh_core::ContentPart {
    convert::content(block)
}
pub use pins::{DefinitionAudit, DefinitionChange, accept as accept_definition};
pub use shared::ServerHealth;
pub use sse::{SseClientTransport, SseError};
pub use state::McpClientState;
