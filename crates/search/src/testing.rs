//! What the search crate's tests share: a registry actor and tools that do nothing.

use std::sync::Arc;

use serde_json::json;
use toolmesh_core::{Backend, BackendError, CallContext, ToolOutput, ToolSource, ToolSpec};
use toolmesh_registry::{RegistryHandle, ToolEntry};

struct Nop;

#[async_trait::async_trait]
impl Backend for Nop {
    async fn call(&self, _: CallContext, _: serde_json::Value) -> Result<ToolOutput, BackendError> {
        Ok(ToolOutput::default())
    }
}

/// A running registry actor and its handle.
pub(crate) async fn registry() -> RegistryHandle {
    RegistryHandle::start().await.unwrap()
}

/// A local tool that does nothing.
pub(crate) fn tool(name: &str, description: &str) -> ToolEntry {
    let spec = ToolSpec::new(name, description, json!({"type": "object"}), ToolSource::local("t"));
    ToolEntry::new(spec, Arc::new(Nop)).unwrap()
}
