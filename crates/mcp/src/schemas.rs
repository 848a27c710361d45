//! Compiling the argument schemas of published tools in the background.

use std::sync::{
    Arc, OnceLock,
    mpsc::{Sender, channel},
};

use toolmesh_registry::ToolEntry;
use tracing::{Span, debug, warn};

/// The entries of one publish, with the span their problems are logged under.
struct Batch {
    span: Span,
    entries: Vec<Arc<ToolEntry>>,
}

/// Compiles the schemas of `entries`, under `span`, on the process's one background compiler: a thread at
/// the lowest CPU priority that takes batches in order, so that compiling takes only what
/// serving leaves idle, however many servers publish at once (a hundred servers starting
/// together queue a hundred batches, not a hundred threads), and a first call rarely waits
/// for its schema. A schema that does not compile is logged: its tool is called without
/// that check. Should the compiler be unavailable, each schema compiles at its tool's first
/// call, as a compiled schema is shared by every copy of an entry.
pub(crate) fn compile_in_background(span: Span, entries: Vec<Arc<ToolEntry>>) {
    if entries.is_empty() {
        return;
    }
    static COMPILER: OnceLock<Option<Sender<Batch>>> = OnceLock::new();
    let compiler = COMPILER.get_or_init(|| {
        let (batches, queue) = channel::<Batch>();
        let spawned = std::thread::Builder::new().name("mcp-schemas".into()).spawn(move || {
            if let Err(error) =
                rustix::process::setpriority_process(Some(rustix::thread::gettid()), 19)
            {
                debug!(%error, "schemas compile at normal CPU priority");
            }
            for Batch { span, entries } in queue {
                let _span = span.enter();
                for entry in entries {
                    for problem in entry.compile() {
                        warn!(tool = %entry.spec.name, %problem, "published without this schema's check");
                    }
                }
            }
        });
        match spawned {
            Ok(_) => Some(batches),
            Err(error) => {
                warn!(%error, "cannot start the schema compiler; schemas compile at first calls");
                None
            }
        }
    });
    if let Some(compiler) = compiler {
        // The compiler's thread lives as long as the process: a send cannot fail.
        let _ = compiler.send(Batch { span, entries });
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use serde_json::json;
    use toolmesh_core::{ToolSource, ToolSpec};

    use super::*;

    struct Nop;

    #[async_trait::async_trait]
    impl toolmesh_core::Backend for Nop {
        async fn call(
            &self,
            _: toolmesh_core::CallContext,
            _: serde_json::Value,
        ) -> Result<toolmesh_core::ToolOutput, toolmesh_core::BackendError> {
            Ok(toolmesh_core::ToolOutput::default())
        }
    }

    fn entry(name: &str, schema: serde_json::Value) -> Arc<ToolEntry> {
        let spec = ToolSpec::new(
            name,
            "d",
            schema,
            ToolSource { kind: toolmesh_core::SourceKind::Mcp, name: "s".into() },
        );
        Arc::new(ToolEntry::deferred(spec, Arc::new(Nop)).unwrap())
    }

    #[test]
    fn published_schemas_compile_in_the_background_batch_after_batch() {
        let batches: Vec<Vec<Arc<ToolEntry>>> = (0..3)
            .map(|b| {
                (0..50)
                    .map(|i| {
                        let schema = match i {
                            // A schema that does not compile is logged and passed over.
                            7 => json!({"type": "objekt"}),
                            _ => json!({"type": "object", "required": [format!("a{b}{i}")]}),
                        };
                        entry(&format!("t{b}_{i}"), schema)
                    })
                    .collect()
            })
            .collect();
        for batch in &batches {
            assert!(batch.iter().all(|e| !e.is_compiled()));
            compile_in_background(Span::none(), batch.clone());
        }
        let started = Instant::now();
        while !batches.iter().flatten().all(|e| e.is_compiled()) {
            assert!(started.elapsed() < Duration::from_secs(30), "not all compiled");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(batches[2][7].compile().len(), 1, "the broken schema's problem is kept");
        assert!(batches[1][3].compile().is_empty());
        assert_eq!(batches[1][3].check_arguments(&json!({}))[0].rule, "required");
    }
}
