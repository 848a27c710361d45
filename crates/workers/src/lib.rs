//! Local tools and the supervised pool that runs them.
//!
//! ```text
//! WorkerPoolActor (supervisor; restarts a worker that dies)
//!  ├── WorkerActor ─┐
//!  ├── WorkerActor  ├─ each runs one call at a time, then puts itself back on the idle queue
//!  └── WorkerActor ─┘
//! ```
//!
//! [`WorkerPool`] is the handle: [`WorkerPool::bind`] turns a [`LocalTool`] into a
//! [`Backend`](toolmesh_core::Backend) for the registry. A call is admitted only while the
//! tool's limit ([`ToolLimits`]) and the pool's queue have room, otherwise it fails at once
//! with `Overloaded` (gRPC `RESOURCE_EXHAUSTED`), so load never turns into unbounded memory.
//! A tool that panics kills only its worker: the caller gets `Crashed` with the call id,
//! the supervisor starts a fresh worker, and later calls are served as before.

mod backend;
mod config;
mod error;
mod pool;
mod tool;
mod worker;

pub use backend::ToolLimits;
pub use config::WorkersConfig;
pub use error::WorkersError;
pub use pool::{PoolStats, WorkerPool, WorkerPoolActor, WorkerPoolMsg};
pub use tool::LocalTool;
pub use worker::{WorkerActor, WorkerMsg};

/// A local tool with its limits, ready to be bound to the pool.
pub type LocalToolInstall = (std::sync::Arc<dyn LocalTool>, ToolLimits);
