//! The client packages of `clients/` against a running toolmesh, installed as a user installs
//! them (tests/setup: `pip install ./clients/python`, `npm ci` in clients/typescript): list,
//! call, errors, search, streaming calls with progress, questions and approvals, cancelling,
//! and knowledge ingest.

use std::path::Path;

use toolmesh_e2e::cli::{stderr, stdout};
use toolmesh_e2e::{BinaryServer, py_server, python};

/// The router both clients call: tests/mcp/py_server.py as the MCP server `py`, an approval
/// rule on `py_add`, and a knowledge collection with a filter field.
fn config() -> String {
    format!(
        r#"
[[mcp.servers]]
name = "py"
transport = "stdio"
command = "{}"
args = ["{}"]

[[policy.rules]]
name = "sums-need-approval"
effect = "approve"
tools = ["py_add"]
reason = "sums matter"

[[knowledge.collections]]
name = "handbook"
description = "The product handbook."
filter_fields = ["lang"]
"#,
        python(),
        py_server()
    )
}

/// Runs the test script `path` (of tests/) with `program` against a router of [`config`],
/// and checks that it says it got through; `installed_by` says how the client got there.
async fn run_against_a_router(program: &str, path: &str, installed_by: &str) {
    let server = BinaryServer::with_config(&config(), &[]).await.unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    let output = tokio::process::Command::new(program)
        .arg(script)
        .arg(server.addr.to_string())
        .env_remove("TOOLMESH_TOKEN")
        .output()
        .await
        .unwrap_or_else(|error| panic!("{program} runs: {error}"));
    assert!(
        output.status.success(),
        "{path} failed ({installed_by}):\n{}\n{}\n{}",
        stdout(&output),
        stderr(&output),
        server.logs()
    );
    assert!(stdout(&output).contains("knowledge as expected"), "{}", stdout(&output));
}

#[tokio::test]
async fn the_python_client_streams_asks_approves_and_ingests() {
    let installed_by = "tests/setup installs clients/python";
    run_against_a_router(&python(), "python/stream_test.py", installed_by).await;
}

#[tokio::test]
async fn the_node_client_lists_calls_streams_and_ingests() {
    let installed_by = "tests/setup builds clients/typescript";
    run_against_a_router("node", "typescript/client_test.mjs", installed_by).await;
}
