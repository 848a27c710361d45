//! toolmesh's shared vocabulary. Every other crate speaks in these types:
//!
//! - [`ToolSpec`], [`Toolkit`], [`ToolSource`], [`ToolAnnotations`]: what the catalog holds.
//! - [`ContentPart`], [`ToolOutput`]: what a tool returns.
//! - [`CallContext`], [`CallEvent`], [`EventSink`]: one running call, its cancellation,
//!   deadline and progress stream.
//! - [`Backend`]: the one trait that local workers, remote workers, MCP servers and
//!   knowledge collections implement; the router dispatches through it and knows no backend
//!   by name.
//! - [`Provider`]: a source of tools with a lifecycle (start, reload, health, stop), the
//!   seam the binary drives every backend through; [`HealthBoard`] holds their health.
//! - [`Supervised`]: an actor the root supervisor links and restarts through its handle.
//! - [`VectorStore`]: collections of dense and lexical vectors, queried with the store's
//!   fusion; the tool index and knowledge collections keep their vectors in one.
//! - [`Principal`]: who a request runs as, for policy and upstream credentials.
//! - [`ErrorCode`], [`BackendError`]: failure kinds, mapped to gRPC status codes once, in
//!   the proto crate.

mod backend;
mod call;
mod content;
mod error;
mod principal;
mod provider;
mod supervised;
mod tool;
pub mod vector;

pub use backend::{Backend, RetryPolicy};
pub use call::{
    Approval, ApprovalAnswer, ApprovalPrompt, CallContext, CallEvent, Elicitation,
    ElicitationAnswer, ElicitationPrompt, EventReceiver, EventSink, INPUT_REQUIRED,
    INVALID_INPUT_RESPONSES, InputAnswers, InputRound, InputRounds, MISSING_CLIENT_CAPABILITY,
    Nesting, Sampling, SamplingAnswer, SamplingPrompt,
};
pub use content::{ContentPart, ResourceBody, ToolOutput};
pub use error::{
    BackendError, CallFailure, ECHO_CHARS, ErrorCode, FailureDetail, FieldViolation, clip,
};
pub use principal::{
    ANONYMOUS, NoPrincipal, Principal, PrincipalKind, Secret, is_open, open_principal,
};
pub use provider::{Health, HealthBoard, Provider, ProviderError};
pub use supervised::Supervised;
pub use tool::{
    InvalidToolName, MAX_LISTING_BYTES, SourceKind, ToolAnnotations, ToolSource, ToolSpec, Toolkit,
    validate_tool_name,
};
pub use vector::{StoreError, VectorStore, VectorStores};
