use serde_json::{Value, json};
use toolmesh_core::{BackendError, CallContext, ToolAnnotations, ToolOutput, ToolSource, ToolSpec};
use toolmesh_workers::LocalTool;

use crate::BUILTIN_SOURCE;

/// `echo`: returns its arguments as its structured result.
#[derive(Debug, Default, Clone, Copy)]
pub struct EchoTool;

#[async_trait::async_trait]
impl LocalTool for EchoTool {
    fn spec(&self) -> ToolSpec {
        let mut spec = ToolSpec::new(
            "echo",
            "Returns its arguments unchanged. Useful to test connectivity and argument passing.",
            json!({"type": "object", "additionalProperties": true}),
            ToolSource::local(BUILTIN_SOURCE),
        );
        spec.annotations = ToolAnnotations {
            read_only: Some(true),
            destructive: Some(false),
            idempotent: Some(true),
            open_world: Some(false),
        };
        spec.tags = vec!["utility".into()];
        spec
    }

    async fn call(&self, _ctx: &CallContext, arguments: Value) -> Result<ToolOutput, BackendError> {
        Ok(ToolOutput::json(arguments))
    }
}
