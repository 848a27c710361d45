//! Local tools with scripted behaviour, registered by in-process test servers.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use serde_json::{Value, json};
use tokio::sync::Semaphore;
use toolmesh_core::{BackendError, CallContext, ContentPart, ToolOutput, ToolSource, ToolSpec};
use toolmesh_workers::LocalTool;

fn spec(name: &str, schema: Value) -> ToolSpec {
    ToolSpec::new(name, format!("test tool {name}"), schema, ToolSource::local("test"))
}

/// `panic`: panics when `panic` is true, otherwise answers `ok`.
pub struct PanicTool;

#[async_trait::async_trait]
impl LocalTool for PanicTool {
    fn spec(&self) -> ToolSpec {
        spec("panic", json!({"type": "object", "properties": {"panic": {"type": "boolean"}}}))
    }

    async fn call(&self, _: &CallContext, arguments: Value) -> Result<ToolOutput, BackendError> {
        if arguments["panic"] == json!(true) {
            panic!("scripted panic");
        }
        Ok(ToolOutput::text("ok"))
    }
}

/// Counters a [`BlockingTool`] keeps.
pub struct BlockingProbe {
    /// Calls that started running.
    pub started: AtomicUsize,
    /// Calls whose future was dropped before finishing (cancelled or timed out).
    pub dropped: AtomicUsize,
    /// Calls that finished.
    pub finished: AtomicUsize,
    /// Each permit lets one call finish.
    pub gate: Semaphore,
}

impl Default for BlockingProbe {
    fn default() -> Self {
        BlockingProbe {
            started: AtomicUsize::new(0),
            dropped: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            gate: Semaphore::new(0),
        }
    }
}

/// `block`: runs until the probe's gate lets it finish.
pub struct BlockingTool(pub Arc<BlockingProbe>);

/// Counts a call whose future is dropped before it finished, unless it is `finish`ed.
struct Unfinished<'a>(&'a AtomicUsize, bool);

impl Unfinished<'_> {
    fn finish(mut self) {
        self.1 = true;
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[async_trait::async_trait]
impl LocalTool for BlockingTool {
    fn spec(&self) -> ToolSpec {
        spec("block", json!({"type": "object"}))
    }

    async fn call(&self, _: &CallContext, _: Value) -> Result<ToolOutput, BackendError> {
        let probe = &self.0;
        probe.started.fetch_add(1, Ordering::SeqCst);
        let unfinished = Unfinished(&probe.dropped, false);
        probe.gate.acquire().await.expect("gate open").forget();
        unfinished.finish();
        probe.finished.fetch_add(1, Ordering::SeqCst);
        Ok(ToolOutput::text("released"))
    }
}

/// `progress`: reports `steps` progress events, each followed by a partial output, then
/// returns the number of steps.
pub struct ProgressTool;

#[async_trait::async_trait]
impl LocalTool for ProgressTool {
    fn spec(&self) -> ToolSpec {
        spec(
            "progress",
            json!({"type": "object", "required": ["steps"],
                   "properties": {"steps": {"type": "integer", "minimum": 1, "maximum": 100}}}),
        )
    }

    async fn call(&self, ctx: &CallContext, arguments: Value) -> Result<ToolOutput, BackendError> {
        let steps = arguments["steps"].as_u64().unwrap_or(1);
        for step in 1..=steps {
            ctx.events.progress(step as f64, Some(steps as f64), format!("step {step}"));
            ctx.events.partial(ContentPart::Text(format!("part {step}"))).await;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(ToolOutput::json(json!({"steps": steps})))
    }
}

/// `bad_output`: declares an output schema requiring `n`, then returns `{"m": 1}`.
pub struct BadOutputTool;

#[async_trait::async_trait]
impl LocalTool for BadOutputTool {
    fn spec(&self) -> ToolSpec {
        let mut spec = spec("bad_output", json!({"type": "object"}));
        spec.output_schema = Some(Arc::new(
            json!({"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}),
        ));
        spec.validate_output = true;
        spec
    }

    async fn call(&self, _: &CallContext, _: Value) -> Result<ToolOutput, BackendError> {
        Ok(ToolOutput::json(json!({"m": 1})))
    }
}

/// Counters a [`FloodTool`] keeps.
#[derive(Default)]
pub struct FloodProbe {
    /// Reports the tool has made (progress, or partial outputs that were accepted).
    pub reported: AtomicUsize,
    /// Calls that returned.
    pub finished: AtomicUsize,
    /// Calls whose future was dropped before returning (cancelled).
    pub dropped: AtomicUsize,
}

/// `flood`: reports as fast as it can, 2 KB at a time: `progress` reports `count` progress
/// messages, then returns; `partial` sends partial outputs until it is cancelled.
pub struct FloodTool(pub Arc<FloodProbe>);

#[async_trait::async_trait]
impl LocalTool for FloodTool {
    fn spec(&self) -> ToolSpec {
        spec(
            "flood",
            json!({"type": "object", "required": ["kind"], "properties": {
                "kind": {"enum": ["progress", "partial"]}, "count": {"type": "integer"}}}),
        )
    }

    async fn call(&self, ctx: &CallContext, arguments: Value) -> Result<ToolOutput, BackendError> {
        let probe = &self.0;
        let unfinished = Unfinished(&probe.dropped, false);
        let blob = "p".repeat(2048);
        if arguments["kind"] == "progress" {
            let count = arguments["count"].as_u64().unwrap_or(1);
            for step in 1..=count {
                ctx.events.progress(step as f64, Some(count as f64), blob.clone());
                probe.reported.fetch_add(1, Ordering::SeqCst);
                if step % 256 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        } else {
            loop {
                ctx.events.partial(ContentPart::Text(blob.clone())).await;
                probe.reported.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        }
        unfinished.finish();
        probe.finished.fetch_add(1, Ordering::SeqCst);
        Ok(ToolOutput::text("flooded"))
    }
}

/// `whoami`: answers with the principal the call runs as (`name`, `kind`, `roles`).
pub struct WhoAmITool;

#[async_trait::async_trait]
impl LocalTool for WhoAmITool {
    fn spec(&self) -> ToolSpec {
        spec("whoami", json!({"type": "object"}))
    }

    async fn call(&self, ctx: &CallContext, _: Value) -> Result<ToolOutput, BackendError> {
        let principal = &ctx.principal;
        Ok(ToolOutput::json(json!({
            "name": principal.name,
            "kind": principal.kind.as_str(),
            "roles": principal.roles,
        })))
    }
}

/// A tool of any name, schema, tags and annotations that answers with its arguments (as
/// `{"args": …}`), for tests of which tools a caller may see and call.
pub struct ArgsTool(pub ToolSpec);

impl ArgsTool {
    /// Returns the tool `name` with `description` and input `schema`.
    pub fn new(name: &str, description: &str, schema: Value) -> Self {
        ArgsTool(ToolSpec::new(name, description, schema, ToolSource::local("test")))
    }

    /// Adds `tags`.
    pub fn tagged(mut self, tags: &[&str]) -> Self {
        self.0.tags = tags.iter().map(|t| (*t).to_owned()).collect();
        self
    }

    /// Annotates the tool read-only.
    pub fn read_only(mut self) -> Self {
        self.0.annotations.read_only = Some(true);
        self
    }
}

#[async_trait::async_trait]
impl LocalTool for ArgsTool {
    fn spec(&self) -> ToolSpec {
        self.0.clone()
    }

    async fn call(&self, _: &CallContext, arguments: Value) -> Result<ToolOutput, BackendError> {
        Ok(ToolOutput::json(json!({ "args": arguments })))
    }
}
