use serde_json::Value;
use toolmesh_core::{BackendError, CallContext, ToolOutput, ToolSpec};

/// A tool that runs inside toolmesh, on the worker pool.
///
/// `call` receives arguments that already passed the input schema. It reports progress and
/// partial outputs through `ctx.events`; its future is dropped when the call is cancelled or
/// times out, so work it owns (child processes, requests) must stop on drop. A tool's own
/// failure is an `Ok` output with `is_error` set; `Err` is for failures of the machinery.
#[async_trait::async_trait]
pub trait LocalTool: Send + Sync + 'static {
    /// Returns the tool's definition.
    fn spec(&self) -> ToolSpec;

    /// Runs one call.
    async fn call(&self, ctx: &CallContext, arguments: Value) -> Result<ToolOutput, BackendError>;
}
