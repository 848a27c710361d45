//! Times what a governed call spends in the policy: the decision (with one CEL condition
//! over the arguments) and the audit event. `cargo run --release -p toolmesh-policy
//! --example hot_path`.

use std::{collections::BTreeMap, sync::Arc, time::Instant};

use serde_json::json;
use toolmesh_core::{Principal, PrincipalKind, ToolSource, ToolSpec};
use toolmesh_policy::{AuditEvent, Policy, PolicyConfig};

const RULES: &str = r#"
default = "deny"
[[rules]]
name = "team"
effect = "allow"
roles = ["team-0"]
tools = ["echo"]
[[rules]]
name = "short"
effect = "deny"
tools = ["echo"]
when = 'size(args.message) > 4096 || args.message.startsWith("rm -rf")'
"#;

fn main() {
    let audit =
        std::env::temp_dir().join(format!("toolmesh-hot-path-{}.jsonl", std::process::id()));
    let mut config: PolicyConfig = toml::from_str(RULES).expect("the policy parses");
    config.audit.to = audit.display().to_string();
    let policy = Arc::new(Policy::new(config).expect("the policy compiles"));
    let principal = Arc::new(Principal {
        name: "alice".into(),
        kind: PrincipalKind::ApiKey,
        issuer: None,
        roles: vec!["team-0".into()],
        attributes: BTreeMap::new(),
        credential: None,
    });
    let spec = ToolSpec::new("echo", "", json!({"type": "object"}), ToolSource::local("builtin"));
    let arguments = json!({"message": "hello"});
    let n = 500_000u32;

    let scope = policy.scope(principal.clone());
    let visible = scope.visible(&spec).expect("the principal sees the tool");
    let started = Instant::now();
    for _ in 0..n {
        std::hint::black_box(scope.decide_visible(&visible, &spec, &arguments));
    }
    println!("decide_visible: {:?} per call", started.elapsed() / n);

    // What each call does: a scope for its principal, the tool's plan, the decision.
    let started = Instant::now();
    for _ in 0..n {
        let scope = policy.scope(principal.clone());
        std::hint::black_box(scope.decide(&spec, &arguments));
    }
    println!("scope + decide: {:?} per call", started.elapsed() / n);

    // A server records an event per call, and its writer keeps up; a loop that records
    // millions a second would let the queue grow and time its reallocation. So the events go
    // in batches, each written out before the next, and only the recording is timed.
    const BATCH: u32 = 1_000;
    let mut recording = std::time::Duration::ZERO;
    for first in (0..n).step_by(BATCH as usize) {
        let started = Instant::now();
        for i in first..first + BATCH {
            policy.audit().record(&AuditEvent {
                event: "call",
                principal: &principal.name,
                principal_kind: principal.kind.as_str(),
                issuer: principal.issuer.as_deref(),
                agent: None,
                tool: "echo",
                call_id: "0190f3a2-7c1e-7d3a-9b2f-4c5d6e7f8a9b",
                decision: "allow",
                rule: "team",
                hidden: None,
                outcome: "ok",
                duration: std::time::Duration::from_nanos(u64::from(i % 1000) * 13_700),
                at: Instant::now(),
                trace_id: "4bf92f3577b34da6a3ce929d0e0e4736",
                policy: "3f2a9c",
                note: None,
            });
        }
        recording += started.elapsed();
        let written = policy.audit().flush(std::time::Duration::from_secs(30));
        assert!(written, "the audit writer did not write a batch within 30 s");
    }
    println!("audit record:   {:?} per event", recording / n);
    let _ = std::fs::remove_file(audit);
}
