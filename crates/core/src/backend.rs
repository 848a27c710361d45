use serde_json::Value;

use crate::{BackendError, CallContext, ToolOutput};

/// A place where tools run: the local worker pool, remote workers, an MCP server, a
/// knowledge collection. The registry maps each tool to its backend; the router calls it
/// without knowing which kind it is.
///
/// An implementation returns promptly once `ctx.cancel` is cancelled, stopping the work it
/// started (tasks, processes, requests), and reports progress through `ctx.events`.
#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Runs one call of `ctx.tool` with already validated `arguments`.
    async fn call(&self, ctx: CallContext, arguments: Value) -> Result<ToolOutput, BackendError>;
}
