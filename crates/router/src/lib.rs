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
//! - [`Admission`] is the admission step of every call: the routing profiles' rules
//!   today, identity and policy later. [`Discovery`] is how the front door searches and
//!   describes what it does not list; the meta-tools crate (`toolmesh-meta`) provides it.
//!
//! The binary's `RouterActor` owns this front door: it serves [`ToolServiceImpl`], puts
//! reloaded routing profiles in force ([`Router::set_admission`]) and drains the calls in
//! flight ([`Router::drained`]).
//!
//! [`RouterError`] is mapped to a gRPC status once, in [`RouterError::to_status`].

mod admission;
mod deadline;
mod discovery;
mod error;
mod metrics;
mod router;
mod service;

pub use admission::{
    Admission, CALL_TOOL, Door, META_SOURCE, SEARCH_TOOLS, Searched, call_tool_not_found, is_meta,
    policy_refusal,
};
pub use deadline::parse_grpc_timeout;
pub use discovery::{Discovery, Found, Keep};
pub use error::RouterError;
pub use router::{CallRequest, Router, RouterOptions};
pub use service::{Hidden, ToolServiceImpl, principal};
