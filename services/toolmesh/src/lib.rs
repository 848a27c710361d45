//! The `toolmesh` binary's library: it wires the components into one process.
//!
//! - [`App`] starts the actors (router, registry, worker pool), registers the built-in and
//!   configured tools, and reloads the configured ones on demand.
//! - [`serve`] runs the gRPC server (`toolmesh.v1.ToolService`, `grpc.health.v1.Health`,
//!   server reflection v1 and v1alpha) on a bound listener until a shutdown signal, then
//!   lets in-flight calls finish within a grace period. Its front door is bounded:
//!   [`Listener`] caps connections, closes those that never finish their HTTP/2 handshake
//!   and those left idle, and backs off when out of descriptors; [`TrackCallsLayer`]
//!   counts each connection's calls; [`MessageLimitLayer`] refuses oversized messages at
//!   their header.
//! - [`client`] backs the `toolmesh tools list` and `toolmesh call` commands.
//!
//! Reading order for a newcomer: `proto/toolmesh/v1/tools.proto`, then
//! `crates/router` (the call path), then `crates/workers` (one backend).

mod app;
pub mod client;
mod listener;
mod server;
mod transport;

pub use app::{App, AppOptions, ProviderFactory};
pub use listener::{ConnectionInfo, ConnectionLimits, Listener, TrackCallsLayer};
pub use server::{MCP_HEALTH_PREFIX, PROVIDER_HEALTH_PREFIX, SEARCH_EMBEDDINGS_HEALTH, serve};
pub use transport::{LimitedBody, MessageLimit, MessageLimitLayer};
