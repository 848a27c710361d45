//! Remote workers: processes, in any language and on any host, that serve tools for
//! toolmesh.
//!
//! A worker connects *out* to the router over the bidirectional `WorkerService.Connect`
//! stream ([`WorkerServiceImpl`]), announces the tools it serves and its capacity, and then
//! takes calls; heartbeats go both ways, and a worker that falls silent is gone. The tools
//! of each pool (the workers announcing the same pool name) are one source of the catalog
//! (`remote:<pool>`); a tool served by several workers is one entry, dispatched by
//! [`RemoteBackend`] to the live worker with the fewest calls outstanding, never beyond a
//! worker's capacity, within the schedule-to-start and start-to-close timeouts of
//! `[remote]` ([`RemoteConfig`]). When a worker's session ends, every call in flight on it
//! is answered at once with [`BackendError::Lost`](toolmesh_core::BackendError::Lost),
//! which the router repeats on another worker only for read-only and idempotent tools.
//! [`RemoteWorkers`] is the provider: health per pool (`toolmesh.remote.<pool>`).
//!
//! Both sides of the protocol live here: the router's (`service`, `members`, `backend`)
//! and the worker's ([`host`], which `toolmesh worker` runs).

mod backend;
mod config;
pub mod host;
mod members;
mod provider;
mod service;

pub use backend::RemoteBackend;
pub use config::{RemoteConfig, SECTION, ToolTimeouts};
pub use members::DEFAULT_POOL;
pub use provider::RemoteWorkers;
pub use service::{WORKER_SERVICE_NAME, WorkerServiceImpl};
