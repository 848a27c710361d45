//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, installed by
//! `tests/setup` into `tests/mcp/conformance`).
//!
//! Server scenarios of 2025-11-25: against toolmesh's own upstream fixture server
//! (`tests/mcp/conformance_server.py`) directly, where every scenario passes, and with that
//! server behind toolmesh's MCP endpoint (its names unprefixed), where toolmesh passes every
//! one through as well: a transparent gateway passes what its upstream passes.
//!
//! Client scenarios: every one that needs no OAuth, at each revision it belongs to, played by
//! toolmesh's MCP client (`tests/mcp/conformance_client.py` starts `toolmesh serve` with the
//! scenario's server and calls through toolmesh's MCP endpoint).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use serde_json::Value;
use toolmesh::AppOptions;
use toolmesh_e2e::{TestServer, python};

/// The scenarios toolmesh's MCP endpoint passes with the fixture server behind it.
const THROUGH_TOOLMESH: &[&str] = &[
    "server-initialize",
    "server-session-lifecycle",
    "logging-set-level",
    "ping",
    "completion-complete",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-with-logging",
    "tools-call-error",
    "tools-call-with-progress",
    "tools-call-sampling",
    "tools-call-elicitation",
    "elicitation-sep1034-defaults",
    "elicitation-sep1330-enums",
    "server-sse-multiple-streams",
    "resources-list",
    "resources-read-text",
    "resources-read-binary",
    "resources-templates-read",
    "resources-subscribe",
    "resources-unsubscribe",
    "prompts-list",
    "prompts-get-simple",
    "prompts-get-with-args",
    "prompts-get-embedded-resource",
    "prompts-get-with-image",
    "dns-rebinding-protection",
];

/// The server scenarios of 2026-07-28 (what `--requirements 2026-07-28` scores), which the
/// fixture server passes directly and toolmesh's MCP endpoint passes with it behind.
const REQUIRED_2026: &[&str] = &[
    "server-stateless",
    "completion-complete",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-error",
    "tools-call-with-progress",
    "server-sse-multiple-streams",
    "resources-list",
    "resources-read-text",
    "resources-read-binary",
    "resources-templates-read",
    "sep-2164-resource-not-found",
    "prompts-list",
    "prompts-get-simple",
    "prompts-get-with-args",
    "prompts-get-embedded-resource",
    "prompts-get-with-image",
    "dns-rebinding-protection",
    "caching",
    "input-required-result-basic-elicitation",
    "input-required-result-basic-sampling",
    "input-required-result-basic-list-roots",
    "input-required-result-request-state",
    "input-required-result-multiple-input-requests",
    "input-required-result-multi-round",
    "input-required-result-missing-input-response",
    "input-required-result-non-tool-request",
    "input-required-result-result-type",
    "input-required-result-unsupported-methods",
    "input-required-result-tampered-state",
    "input-required-result-capability-check",
    "input-required-result-ignore-extra-params",
    "input-required-result-validate-input",
];

/// The client scenarios that need no OAuth, with the revision each is run at.
const CLIENT_SCENARIOS: &[(&str, &str)] = &[
    ("initialize", "2025-11-25"),
    ("tools_call", "2025-11-25"),
    ("elicitation-sep1034-client-defaults", "2025-11-25"),
    ("sse-retry", "2025-11-25"),
    ("json-schema-2020-12-preservation", "2025-11-25"),
    ("tools_call", "2026-07-28"),
    ("request-metadata", "2026-07-28"),
    ("sep-2322-client-request-state", "2026-07-28"),
    ("http-standard-headers", "2026-07-28"),
    ("http-custom-headers", "2026-07-28"),
    ("http-invalid-tool-headers", "2026-07-28"),
    ("json-schema-ref-no-deref", "2026-07-28"),
    ("json-schema-2020-12-preservation", "2026-07-28"),
];

/// The suite's Node and its entry point.
fn suite() -> (PathBuf, PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/conformance/node_modules");
    let node = root.join("node/bin/node");
    let script = root.join("@modelcontextprotocol/conformance/dist/index.js");
    assert!(
        node.exists() && script.exists(),
        "the MCP conformance suite is not installed in {}: run tests/setup",
        root.display()
    );
    (node, script)
}

/// Each check of the output directory `out` that failed, by scenario directory name
/// (`<prefix><scenario>-<timestamp>`, the timestamp as `2026-12-07T11-36-22-911Z`).
fn failed_checks(out: &Path, prefix: &str) -> BTreeMap<String, Vec<String>> {
    let mut scenarios = BTreeMap::new();
    for entry in std::fs::read_dir(out).unwrap().flatten() {
        let dir = entry.file_name().to_string_lossy().into_owned();
        let scenario = dir.strip_prefix(prefix).and_then(|d| d.get(..d.len().checked_sub(25)?));
        let Some(scenario) = scenario else { continue };
        let checks: Value =
            serde_json::from_slice(&std::fs::read(entry.path().join("checks.json")).unwrap())
                .unwrap();
        let failed: Vec<String> = checks
            .as_array()
            .into_iter()
            .flatten()
            .filter(|check| check["status"] == "FAILURE")
            .map(|check| format!("{}: {}", check["id"], check["errorMessage"]))
            .collect();
        scenarios.insert(scenario.to_owned(), failed);
    }
    scenarios
}

/// The last 4,000 bytes of `text`, at a character boundary.
fn tail(text: &str) -> &str {
    &text[text.ceil_char_boundary(text.len().saturating_sub(4000))..]
}

/// The client's standard error the suite saved in the one scenario directory under `out`.
fn client_stderr(out: &Path) -> Option<String> {
    let dir = std::fs::read_dir(out).ok()?.flatten().next()?;
    std::fs::read_to_string(dir.path().join("stderr.txt")).ok()
}

/// Runs the server scenarios against `url` (the active suite, or what a revision requires
/// with `["--requirements", revision]`); returns each scenario's checks that did not
/// succeed, by scenario.
async fn run_suite(url: &str, args: &[&str], expected: &[&str]) -> BTreeMap<String, Vec<String>> {
    let (node, script) = suite();
    let out = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new(node)
        .arg(script)
        .args(["server", "--url", url])
        .args(args)
        .arg("--output-dir")
        .arg(out.path())
        .stdin(Stdio::null())
        .output();
    let output = tokio::time::timeout(Duration::from_secs(300), output).await.unwrap().unwrap();
    let scenarios = failed_checks(out.path(), "server-");
    assert!(
        expected.iter().all(|scenario| scenarios.contains_key(*scenario)),
        "the suite ran too few scenarios:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    scenarios
}

/// Starts the fixture server on a free port; it ends with the returned child.
async fn fixture() -> (tokio::process::Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/conformance_server.py");
    let child = tokio::process::Command::new(python())
        .arg(script)
        .arg(port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let address = format!("127.0.0.1:{port}");
    let up = toolmesh_e2e::eventually(Duration::from_secs(30), || async {
        tokio::net::TcpStream::connect(&address).await.ok().map(|_| ())
    });
    up.await.expect("the fixture server listens");
    (child, format!("http://{address}/mcp"))
}

/// Starts toolmesh, on its defaults, with the fixture server at `upstream` behind it (its
/// names unprefixed); returns once the fixture's tools are published.
async fn behind_toolmesh(upstream: &str) -> TestServer {
    let config = format!(
        "[[mcp.servers]]\nname = \"conformance\"\ntransport = \"streamable-http\"\nurl = \"{upstream}\"\nprefix = \"none\"\n"
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    let listed = toolmesh_e2e::eventually(Duration::from_secs(30), || async {
        let tools = server.app.registry().snapshot();
        tools.contains("test_input_required_result_elicitation").then_some(())
    });
    listed.await.expect("the fixture server's tools are published");
    server
}

#[tokio::test]
async fn the_fixture_server_passes_every_server_scenario_and_toolmesh_passes_it_through() {
    let (_fixture, upstream) = fixture().await;
    let direct = run_suite(&upstream, &[], THROUGH_TOOLMESH).await;
    let failing: Vec<_> = direct.iter().filter(|(_, failed)| !failed.is_empty()).collect();
    assert!(failing.is_empty(), "the fixture server fails: {failing:#?}");

    let server = behind_toolmesh(&upstream).await;
    let through = run_suite(&format!("http://{}/mcp", server.addr), &[], THROUGH_TOOLMESH).await;
    for scenario in THROUGH_TOOLMESH {
        let failed = through.get(*scenario).unwrap_or_else(|| panic!("{scenario} did not run"));
        assert!(failed.is_empty(), "{scenario} fails through toolmesh: {failed:#?}");
    }
    // The list stays honest: a scenario that starts passing joins it.
    let newly: Vec<&String> = (through.iter())
        .filter(|(scenario, failed)| {
            failed.is_empty() && !THROUGH_TOOLMESH.contains(&scenario.as_str())
        })
        .map(|(scenario, _)| scenario)
        .collect();
    assert!(newly.is_empty(), "these now pass through toolmesh; list them: {newly:?}");
    server.stop().await.unwrap();
}

/// 2026-07-28: stateless requests, caching hints and input rounds, which toolmesh passes on
/// to its client (the server's state wrapped in toolmesh's signed one) and back.
#[tokio::test]
async fn the_fixture_server_passes_the_2026_requirements_and_toolmesh_passes_them_through() {
    let (_fixture, upstream) = fixture().await;
    let args = ["--requirements", "2026-07-28"];
    let direct = run_suite(&upstream, &args, REQUIRED_2026).await;
    let failing: Vec<_> = (direct.iter())
        .filter(|(scenario, failed)| {
            REQUIRED_2026.contains(&scenario.as_str()) && !failed.is_empty()
        })
        .collect();
    assert!(failing.is_empty(), "the fixture server fails: {failing:#?}");

    let server = behind_toolmesh(&upstream).await;
    let through = run_suite(&format!("http://{}/mcp", server.addr), &args, REQUIRED_2026).await;
    let failing: Vec<_> = (through.iter())
        .filter(|(scenario, failed)| {
            REQUIRED_2026.contains(&scenario.as_str()) && !failed.is_empty()
        })
        .collect();
    assert!(failing.is_empty(), "toolmesh fails: {failing:#?}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn toolmesh_s_mcp_client_passes_every_client_scenario_without_oauth() {
    let (node, script) = suite();
    let adapter = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/conformance_client.py");
    let command = format!("{} {}", python(), adapter.display());
    let mut failing = BTreeMap::new();
    for (scenario, revision) in CLIENT_SCENARIOS {
        let out = tempfile::tempdir().unwrap();
        let output = tokio::process::Command::new(&node)
            .arg(&script)
            .args(["client", "--command", &command, "--scenario", scenario])
            .args(["--spec-version", revision, "--output-dir"])
            .arg(out.path())
            // The suite gives a client 30 s by default; a debug toolmesh started beside the
            // rest of the test suite on two cores can take longer to start and connect.
            .args(["--timeout", "150000"])
            .env("TOOLMESH_BIN", toolmesh_e2e::toolmesh_bin())
            .stdin(Stdio::null())
            .output();
        let output = tokio::time::timeout(Duration::from_secs(200), output).await.unwrap().unwrap();
        let checks = failed_checks(out.path(), "");
        let failed = match checks.get(*scenario) {
            Some(failed) => failed.clone(),
            None => vec![format!(
                "did not run:\n{}\n{}",
                tail(&String::from_utf8_lossy(&output.stdout)),
                tail(&String::from_utf8_lossy(&output.stderr))
            )],
        };
        if !failed.is_empty() {
            // What the adapter and toolmesh printed, for the failing scenario only.
            let printed = client_stderr(out.path()).unwrap_or_default();
            eprintln!("{scenario} ({revision}) fails: {failed:#?}\n{}", tail(&printed));
            failing.insert(format!("{scenario} ({revision})"), failed);
        }
    }
    assert!(failing.is_empty(), "toolmesh's MCP client fails: {failing:#?}");
}
