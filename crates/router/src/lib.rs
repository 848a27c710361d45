//! The front door of toolmesh: every call enters here.
//!
//! - [`Router`] runs the per-call path in the caller's task (never behind a mailbox):
//!   resolve the name in the catalog snapshot, validate the arguments against the input
//!   schema, compute the deadline (the client's, the tool's timeout, the server's cap:
//!   whichever is sooner), dispatch to the tool's [`Backend`](toolmesh_core::Backend), cancel
//!   the backend when the caller goes away, and check the output schema.
//! - [`ToolServiceImpl`] is the gRPC `toolmesh.v1.ToolService` on top of it: paging and
//!   filters for `ListTools`, `CallTool`, and the `StreamCallTool` stream of progress,
//!   partial outputs and the result.
//! - [`MetaTools`] are the catalog tools `searchTools` and `callTool` with the routing
//!   profiles: search within a profile's pool, and calls checked against a signed
//!   `searchToken`, so no session state is kept anywhere.
//! - [`RouterActor`] supervises the [`RegistryActor`](toolmesh_registry::RegistryActor); a
//!   registry that dies is restarted from the last published catalog.
//!
//! ```text
//! RouterActor
//!  └── RegistryActor (publishes Catalog snapshots)
//! ```
//!
//! [`RouterError`] is mapped to a gRPC status once, in [`RouterError::to_status`].

mod actor;
mod convert;
mod deadline;
mod error;
mod meta;
mod metrics;
mod router;
mod service;
mod token;

pub use actor::{RouterActor, RouterMsg};
pub use deadline::parse_grpc_timeout;
pub use error::RouterError;
pub use meta::{CALL_TOOL, DEFAULT_PROFILE, META_SOURCE, MetaTools, SEARCH_TOOLS, is_meta};
pub use router::{CallRequest, Router, RouterOptions};
pub use service::ToolServiceImpl;
