//! toolmesh's shared vocabulary. Every other crate speaks in these types:
//!
//! - [`ToolSpec`], [`Toolkit`], [`ToolSource`], [`ToolAnnotations`]: what the catalog holds.
//! - [`ContentPart`], [`ToolOutput`]: what a tool returns.
//! - [`CallContext`], [`CallEvent`], [`EventSink`]: one running call, its cancellation,
//!   deadline and progress stream.
//! - [`Backend`]: the one trait that local workers, remote workers, MCP servers and
//!   knowledge collections implement; the router dispatches through it and knows no backend
//!   by name.
//! - [`ErrorCode`], [`BackendError`]: failure kinds, mapped to gRPC status codes once, in
//!   the proto crate.

mod backend;
mod call;
mod content;
mod error;
mod tool;

pub use backend::Backend;
pub use call::{
    CallContext, CallEvent, Elicitation, ElicitationAnswer, ElicitationPrompt, EventReceiver,
    EventSink,
};
pub use content::{ContentPart, ToolOutput};
pub use error::{
    BackendError, CallFailure, ECHO_CHARS, ErrorCode, FailureDetail, FieldViolation, clip,
};
pub use tool::{
    InvalidToolName, SourceKind, ToolAnnotations, ToolSource, ToolSpec, Toolkit, validate_tool_name,
};
