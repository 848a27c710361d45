//! The call path of toolmesh: every call, whichever front it came through, runs here.
//!
//! - [`Router`] runs the per-call path in the caller's task (never behind a mailbox):
//!   resolve the name in the catalog snapshot, admit it, validate the arguments against the
//!   input schema, compute the deadline (the client's, the tool's timeout, the server's cap:
//!   whichever is sooner), dispatch to the tool's [`Backend`](toolmesh_core::Backend), cancel
//!   the backend when the caller goes away, and check the output schema.
//! - [`Admission`] is the admission step of every call: the routing profiles, the caller's
//!   identity and the tool policy. [`Hidden`] counts and audits what a discovery request
//!   left out.
//!
//! The API layer (the binary's `api` module) serves `toolmesh.v1.ToolService` over this
//! path; its front-door actor puts reloaded routing profiles in force
//! ([`Router::set_admission`]) and drains the calls in flight ([`Router::drained`]).
//!
//! [`RouterError::failure`] is what a caller learns of an error; the proto crate maps it to
//! a gRPC status once.

mod admission;
mod approval;
mod catalog;
mod config;
mod deadline;
mod dispatch;
mod error;
mod hidden;
mod metrics;
mod request;
mod router;
mod steps;
mod trace;

pub use admission::{Admission, CALL_TOOL, Door, META_SOURCE, SEARCH_TOOLS, Searched, is_meta};
pub use catalog::CatalogConfig;
pub use config::{DEFAULT_PROFILE, MAX_TOP_K, ProfileConfig, RoutingConfig};
pub use deadline::parse_grpc_timeout;
pub use error::{RouterError, call_tool_not_found, policy_refusal};
pub use hidden::Hidden;
pub use request::{CallRequest, RouterOptions};
pub use router::Router;
