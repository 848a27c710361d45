//! toolmesh's own MCP endpoint, end to end, with real MCP clients: the Python `mcp` SDK
//! (`tests/mcp/endpoint_client.py`) on each protocol revision it speaks, the TypeScript SDK
//! (`tests/mcp/ts/endpoint_client.mjs`), and plain HTTP where a test needs to see the wire
//! (challenges, sessions across replicas).

use std::{path::Path, sync::Arc, sync::atomic::Ordering, time::Duration};

use serde_json::{Value, json};
use toolmesh::AppOptions;
use toolmesh_e2e::{
    BinaryServer, TestServer,
    balancer::RoundRobin,
    eventually, py_server, py_stdio_config, python,
    tools::{BlockingProbe, BlockingTool, ProgressTool},
};
use toolmesh_workers::ToolLimits;

/// The revisions the Python SDK client speaks.
const REVISIONS: [&str; 2] = ["2025-11-25", "2026-07-28"];

/// An MCP client the tests drive through a plan of steps (see the scripts).
#[derive(Debug, Clone, Copy)]
enum Client {
    /// The Python SDK on a protocol revision.
    Python(&'static str),
    /// The TypeScript SDK, on the revision it opens sessions with (2025-11-25).
    TypeScript,
}

/// Every client, on every revision it speaks.
const CLIENTS: [Client; 3] =
    [Client::Python(REVISIONS[0]), Client::Python(REVISIONS[1]), Client::TypeScript];

impl Client {
    /// Runs the client against `url` through `plan`; returns each step's result (the first
    /// is the handshake's).
    async fn run(self, url: &str, plan: Value, env: &[(&str, &str)]) -> Vec<Value> {
        parse(self.output(url, plan, env).await, &format!("{self:?}"))
    }

    /// Runs the client; returns what it printed and how it exited.
    async fn output(self, url: &str, plan: Value, env: &[(&str, &str)]) -> std::process::Output {
        let command = match self {
            Client::Python(revision) => python_command(url, revision, &plan),
            Client::TypeScript => typescript_command(url, &plan),
        };
        client_output(command, env).await
    }
}

/// Runs the Python SDK client against `url` on `revision` through `plan`; returns each
/// step's result (the first is the handshake's).
pub(crate) async fn python_client(
    url: &str,
    revision: &str,
    plan: Value,
    env: &[(&str, &str)],
) -> Vec<Value> {
    parse(client_output(python_command(url, revision, &plan), env).await, revision)
}

fn python_command(url: &str, revision: &str, plan: &Value) -> tokio::process::Command {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/endpoint_client.py");
    let mut command = tokio::process::Command::new(python());
    command.arg(&script).arg(url).arg(revision).arg(plan.to_string());
    command
}

fn typescript_command(url: &str, plan: &Value) -> tokio::process::Command {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/ts/endpoint_client.mjs");
    let mut command = tokio::process::Command::new("node");
    command.arg(&script).arg(url).arg(plan.to_string());
    command
}

async fn client_output(
    mut command: tokio::process::Command,
    env: &[(&str, &str)],
) -> std::process::Output {
    command.envs(env.iter().copied());
    tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("the client finishes within a minute")
        .expect("the client runs (tests/setup installs the SDKs)")
}

/// The steps' results a client printed, which must have succeeded.
fn parse(output: std::process::Output, client: &str) -> Vec<Value> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the MCP client failed ({client}): {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn endpoint(server: &TestServer, path: &str) -> String {
    format!("http://{}{path}", server.addr)
}

fn text_of(result: &Value) -> String {
    result["content"].as_array().into_iter().flatten().filter_map(|c| c["text"].as_str()).collect()
}

/// A profile that shows the whole catalog, served at `/mcp/all`.
const ALL: &str = r#"
    [[routing.profiles]]
    name = "all"
    expose = ["*"]
"#;

fn mini_server(env: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/mini_server.py");
    format!(
        "[[mcp.servers]]\nname = \"mini\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"{}\"]\nenv = {{ {env} }}\n",
        python(),
        script.display()
    )
}

/// Every client, on each revision it speaks, lists the catalog of the profile its path
/// names, calls a local tool, sees its progress, and calls the tools of upstream MCP servers
/// (server-everything, and a Python SDK server) through toolmesh; on a session that server's
/// question reaches the client, whose answer (completed with the schema's defaults) reaches
/// the server.
#[tokio::test]
async fn mcp_clients_list_and_call_local_and_upstream_tools() {
    let everything = "[[mcp.servers]]\nname = \"everything\"\ntransport = \"stdio\"\ncommand = \"mcp-server-everything\"\nargs = [\"stdio\"]\n";
    let config = format!(
        "{ALL}\n{}\n{everything}\n{}",
        mini_server("MINI_FORM_TOOL = \"1\""),
        py_stdio_config()
    );
    let options = AppOptions {
        tools: vec![(Arc::new(ProgressTool), ToolLimits::default())],
        ..Default::default()
    };
    let server = TestServer::start(&config, options).await.unwrap();
    let url = endpoint(&server, "/mcp/all");
    eventually(Duration::from_secs(30), || async {
        let listed = python_client(&url, "2025-11-25", json!([{"op": "list"}]), &[]).await;
        let names = listed[1]["tools"].as_array()?;
        let published =
            ["mini_form", "everything_echo", "py_ask"].iter().all(|n| names.iter().any(|t| t == n));
        published.then_some(())
    })
    .await
    .expect("the upstream servers' tools are published");
    for client in CLIENTS {
        let plan = json!([
            {"op": "list"},
            {"op": "call", "name": "echo", "arguments": {"message": "hi"}},
            {"op": "call", "name": "progress", "arguments": {"steps": 3}, "progress": true},
            {"op": "call", "name": "progress", "arguments": {"steps": 0}},
            {"op": "call", "name": "everything_echo", "arguments": {"message": "upstream"}},
            {"op": "resources", "uri": "demo://resource/dynamic/text/7"},
            {"op": "prompt", "name": "everything_args-prompt", "arguments": {"city": "Lisbon"}},
        ]);
        let got = client.run(&url, plan, &[]).await;
        let names: Vec<&str> =
            got[1]["tools"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        for expected in ["echo", "progress", "mini_form", "searchTools", "callTool", "think"] {
            assert!(names.contains(&expected), "{client:?}: {expected} not in {names:?}");
        }
        assert_eq!(got[2]["is_error"], false, "{client:?}: {}", got[2]);
        assert_eq!(got[2]["structured"], json!({"message": "hi"}), "{client:?}: {}", got[2]);
        assert_eq!(got[3]["structured"], json!({"steps": 3}), "{client:?}: {}", got[3]);
        let progress: Vec<f64> =
            got[3]["progress"].as_array().unwrap().iter().filter_map(|p| p[0].as_f64()).collect();
        assert!(!progress.is_empty(), "{client:?}: no progress reached the client");
        assert!(progress.windows(2).all(|w| w[0] < w[1]), "{client:?}: {progress:?}");
        assert_eq!(progress.last(), Some(&3.0), "{client:?}: {progress:?}");
        // Arguments the tool's schema refuses: a tool error the model reads, not a protocol one.
        assert_eq!(got[4]["is_error"], true, "{client:?}: {}", got[4]);
        assert!(text_of(&got[4]).contains("steps"), "{client:?}: {}", got[4]);
        assert_eq!(got[5]["is_error"], false, "{client:?}: {}", got[5]);
        assert_eq!(text_of(&got[5]), "Echo: upstream", "{client:?}: {}", got[5]);
        // The upstream server's resources keep their URIs; a template's resource is read.
        let architecture =
            json!(["demo://resource/static/document/architecture.md", "architecture.md"]);
        let resources = got[6]["resources"].as_array().unwrap();
        assert!(resources.contains(&architecture), "{client:?}: {}", got[6]);
        let templates = got[6]["templates"].as_array().unwrap();
        assert!(templates.contains(&json!("demo://resource/dynamic/text/{resourceId}")));
        let read = got[6]["read"][0].as_str().unwrap_or_default();
        assert!(read.contains('7'), "{client:?}: {}", got[6]);
        let prompts = got[7]["prompts"].as_array().unwrap();
        assert!(prompts.contains(&json!("everything_args-prompt")), "{client:?}: {}", got[7]);
        assert_eq!(got[7]["messages"][0][0], "user", "{client:?}: {}", got[7]);
        let said = got[7]["messages"][0][1].as_str().unwrap_or_default();
        assert!(said.contains("Lisbon"), "{client:?}: {}", got[7]);
    }
    for client in [Client::Python("2025-11-25"), Client::TypeScript] {
        let plan = json!([{"op": "call", "name": "mini_form"}]);
        let got = client.run(&url, plan, &[("ELICIT_ACCEPT", r#"{"name": "Ada"}"#)]).await;
        let answered: Value = serde_json::from_str(&text_of(&got[1])).unwrap();
        assert_eq!(answered, json!({"name": "Ada", "greeting": "hello"}), "{client:?}");
    }
    // A 2026-07-28 server's question: asked of a session during the call (toolmesh answers
    // the server's round), and handed to a 2026-07-28 client as an input round of its own,
    // which its SDK answers in its next request (through any replica: nothing is kept).
    for client in CLIENTS {
        let plan = json!([{"op": "call", "name": "py_ask"}]);
        let got = client.run(&url, plan, &[("ELICIT_ACCEPT", r#"{"name": "Ada"}"#)]).await;
        assert_eq!(text_of(&got[1]), "hello Ada", "{client:?}: {}", got[1]);
        let rounds = u64::from(matches!(client, Client::Python("2026-07-28")));
        assert_eq!(got[1]["rounds"].as_u64().unwrap_or_default(), rounds, "{client:?}");
        let got = client.run(&url, json!([{"op": "call", "name": "py_ask"}]), &[]).await;
        assert_eq!(text_of(&got[1]), "no name (decline)", "{client:?}: {}", got[1]);
    }
    // A subscription reaches the upstream server, and its updates reach the session.
    let document = "demo://resource/static/document/architecture.md";
    let plan = json!([
        {"op": "subscribe", "uri": document},
        {"op": "call", "name": "everything_toggle-subscriber-updates"},
        {"op": "await_updated", "timeout_s": 20},
        {"op": "unsubscribe", "uri": document},
    ]);
    let got = python_client(&url, "2025-11-25", plan, &[]).await;
    assert_eq!(got[3]["updated"][0], document, "{got:?}");
    server.stop().await.unwrap();
}

/// A client's session hears `notifications/tools/list_changed` when the catalog changes:
/// here when an upstream server adds a tool, which the client then lists.
#[tokio::test]
async fn a_session_hears_when_the_catalog_changes() {
    let config = format!(
        "{ALL}\n[[mcp.servers]]\nname = \"py\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"{}\"]\n",
        python(),
        py_server()
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    let url = endpoint(&server, "/mcp/all");
    eventually(Duration::from_secs(30), || async {
        let listed = python_client(&url, "2025-11-25", json!([{"op": "list"}]), &[]).await;
        listed[1]["tools"].as_array()?.iter().any(|t| t == "py_grow").then_some(())
    })
    .await
    .expect("the upstream server's tools are published");
    // Each client makes the catalog change once: the server adds a tool, then changes one.
    let changes = [(Client::Python("2025-11-25"), "py_grow"), (Client::TypeScript, "py_mutate")];
    for (client, change) in changes {
        let plan = json!([
            {"op": "sleep", "s": 0.5},
            {"op": "call", "name": change},
            {"op": "await_list_changed", "timeout_s": 20},
            {"op": "list"},
        ]);
        let got = client.run(&url, plan, &[]).await;
        assert_eq!(got[2]["is_error"], false, "{client:?}: {}", got[2]);
        assert_eq!(got[3]["changed"], true, "{client:?}: no list_changed reached the client");
        let names = got[4]["tools"].as_array().unwrap();
        assert!(names.iter().any(|t| t == "py_extra"), "{client:?}: {names:?}");
    }
    server.stop().await.unwrap();
}

/// A client that gives up on a call (the SDK sends `notifications/cancelled`) ends it in
/// toolmesh: the tool's future is dropped.
#[tokio::test]
async fn a_cancelled_mcp_call_ends_the_tool() {
    let probe = Arc::new(BlockingProbe::default());
    let options = AppOptions {
        tools: vec![(Arc::new(BlockingTool(probe.clone())), ToolLimits::default())],
        ..Default::default()
    };
    let server = TestServer::start(ALL, options).await.unwrap();
    let url = endpoint(&server, "/mcp/all");
    for (i, client) in CLIENTS.into_iter().enumerate() {
        let plan = json!([
            {"op": "cancel", "name": "block", "after_s": 1.0},
            {"op": "sleep", "s": 0.5},
        ]);
        client.run(&url, plan, &[]).await;
        assert_eq!(probe.started.load(Ordering::SeqCst), i + 1, "{client:?}");
        eventually(Duration::from_secs(10), || async {
            (probe.dropped.load(Ordering::SeqCst) == i + 1).then_some(())
        })
        .await
        .unwrap_or_else(|| panic!("{client:?}: the cancelled call kept running"));
    }
    assert_eq!(probe.finished.load(Ordering::SeqCst), 0);
    server.stop().await.unwrap();
}

/// An HTTP client of the endpoint.
fn http() -> reqwest::Client {
    reqwest::Client::builder().http1_only().build().unwrap()
}

/// POSTs one JSON-RPC message; returns the status, the session header and the JSON-RPC
/// answer (from a JSON body or the last `data:` line of an event stream).
pub(crate) async fn post(
    url: &str,
    message: Value,
    session: Option<&str>,
    token: Option<&str>,
) -> (u16, Option<String>, Value) {
    let mut request = http()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .body(message.to_string());
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let session =
        response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body = response.text().await.unwrap();
    let answer = body
        .lines()
        .rev()
        .filter_map(|line| line.strip_prefix("data:"))
        .find(|data| !data.trim().is_empty())
        .map_or_else(|| serde_json::from_str(&body), |data| serde_json::from_str(data.trim()))
        .unwrap_or(Value::Null);
    (status, session, answer)
}

pub(crate) fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "e2e", "version": "1"}}})
}

/// Two router replicas that share `routing.token_key` serve one session alternately, as a
/// load balancer without affinity sends it; a replica with another key does not accept it.
#[tokio::test]
async fn two_replicas_serve_one_session_alternately() {
    let shared = format!("{ALL}\n[routing]\ntoken_key = \"replicas share this key\"\n");
    let one = TestServer::start(&shared, AppOptions::default()).await.unwrap();
    let two = TestServer::start(&shared, AppOptions::default()).await.unwrap();
    let stranger = TestServer::start(ALL, AppOptions::default()).await.unwrap();
    let (a, b) = (endpoint(&one, "/mcp/all"), endpoint(&two, "/mcp/all"));

    let (status, session, answer) = post(&a, initialize(), None, None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"]["serverInfo"]["name"], "toolmesh");
    let session = session.expect("a session id");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(post(&b, initialized, Some(&session), None).await.0, 202);
    for (i, url) in [&a, &b, &a, &b].into_iter().enumerate() {
        let call = json!({"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"turn": i}}});
        let (status, _, answer) = post(url, call, Some(&session), None).await;
        assert_eq!(status, 200, "turn {i}: {answer}");
        assert_eq!(answer["result"]["structuredContent"], json!({"turn": i}), "turn {i}");
    }
    let list = json!({"jsonrpc": "2.0", "id": 20, "method": "tools/list"});
    let (status, _, answer) = post(&b, list.clone(), Some(&session), None).await;
    assert_eq!(status, 200);
    assert!(answer["result"]["tools"].as_array().unwrap().iter().any(|t| t["name"] == "echo"));

    let (status, _, answer) =
        post(&endpoint(&stranger, "/mcp/all"), list.clone(), Some(&session), None).await;
    assert_eq!(status, 404, "a replica with another key: {answer}");
    let (status, _, _) = post(&a, list, Some("not-a-session"), None).await;
    assert_eq!(status, 404);
    for server in [one, two, stranger] {
        server.stop().await.unwrap();
    }
}

/// Real clients behind a round-robin balancer over two replicas that share
/// `routing.token_key`: the requests of one session land on either replica in turn, and the
/// session goes on (listing, calls, progress).
#[tokio::test]
async fn clients_keep_their_session_across_replicas_behind_a_balancer() {
    let shared = format!("{ALL}\n[routing]\ntoken_key = \"replicas share this key\"\n");
    let options = || AppOptions {
        tools: vec![(Arc::new(ProgressTool), ToolLimits::default())],
        ..Default::default()
    };
    let one = TestServer::start(&shared, options()).await.unwrap();
    let two = TestServer::start(&shared, options()).await.unwrap();
    let balancer = RoundRobin::start(vec![one.addr, two.addr]).await.unwrap();
    let url = format!("http://{}/mcp/all", balancer.addr);
    for client in CLIENTS {
        let before = balancer.served();
        let plan = json!([
            {"op": "list"},
            {"op": "call", "name": "echo", "arguments": {"turn": 1}},
            {"op": "call", "name": "progress", "arguments": {"steps": 2}, "progress": true},
            {"op": "call", "name": "echo", "arguments": {"turn": 2}},
            {"op": "list"},
        ]);
        let got = client.run(&url, plan, &[]).await;
        assert!(got[1]["tools"].as_array().unwrap().iter().any(|t| t == "progress"), "{client:?}");
        assert_eq!(got[2]["structured"], json!({"turn": 1}), "{client:?}: {}", got[2]);
        assert_eq!(got[3]["structured"], json!({"steps": 2}), "{client:?}: {}", got[3]);
        assert!(!got[3]["progress"].as_array().unwrap().is_empty(), "{client:?}: {}", got[3]);
        assert_eq!(got[4]["structured"], json!({"turn": 2}), "{client:?}: {}", got[4]);
        assert_eq!(got[5]["tools"], got[1]["tools"], "{client:?}");
        let after = balancer.served();
        assert!(
            after[0] >= before[0] + 2 && after[1] >= before[1] + 2,
            "{client:?}: both replicas served the session: {before:?} -> {after:?}"
        );
    }
    drop(balancer);
    for server in [one, two] {
        server.stop().await.unwrap();
    }
}

/// A call a policy rule holds back for approval asks the person behind an MCP session, as a
/// form with one yes/no field; only a yes makes the call, and every answer is audited.
#[tokio::test]
async fn an_approval_is_asked_of_the_mcp_client_as_an_elicitation() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let config = format!(
        r#"
        {ALL}
        [policy]
        [policy.audit]
        to = "{audit}"

        [[policy.rules]]
        name = "echo-needs-approval"
        effect = "approve"
        tools = ["echo"]
        reason = "echo repeats what it is told"
        "#,
        audit = audit.display(),
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    let url = endpoint(&server, "/mcp/all");
    let call = json!([{"op": "call", "name": "echo", "arguments": {"message": "hi"}}]);
    let yes = [("ELICIT_ACCEPT", r#"{"approve": true, "note": "fine"}"#)];
    let got = python_client(&url, "2025-11-25", call.clone(), &yes).await;
    assert_eq!(got[1]["is_error"], false, "{}", got[1]);
    assert_eq!(got[1]["structured"], json!({"message": "hi"}), "{}", got[1]);
    let no = [("ELICIT_ACCEPT", r#"{"approve": false, "note": "not today"}"#)];
    let got = python_client(&url, "2025-11-25", call.clone(), &no).await;
    assert_eq!(got[1]["is_error"], true, "{}", got[1]);
    assert!(text_of(&got[1]).contains("not approved: not today"), "{}", got[1]);
    // Declined (no ELICIT_ACCEPT): no call.
    let got = python_client(&url, "2025-11-25", call, &[]).await;
    assert_eq!(got[1]["is_error"], true, "{}", got[1]);
    assert!(server.app.router().admission().policy().audit().flush(Duration::from_secs(5)));
    let decisions: Vec<(String, String)> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .filter_map(|line| Some(serde_json::from_str::<Value>(line).ok()?["audit"].take()))
        .filter(|line| line["event"] == "approval")
        .map(|line| {
            (line["decision"].as_str().unwrap().into(), line["note"].as_str().unwrap_or("").into())
        })
        .collect();
    let expected = [("approved", "fine"), ("denied", "not today"), ("denied", "declined")];
    let expected: Vec<(String, String)> =
        expected.iter().map(|(d, n)| ((*d).into(), (*n).into())).collect();
    assert_eq!(decisions, expected);
    server.stop().await.unwrap();
}

/// With `[auth]`, a client without a credential gets 401 with a challenge naming the
/// protected-resource metadata (RFC 9728), which names the token issuers; with an API key
/// it sees only what policy lets it see, and a hidden tool cannot be called.
#[tokio::test]
async fn the_endpoint_authenticates_and_shows_only_what_policy_allows() {
    let key = toolmesh_identity::new_key();
    let dir = tempfile::tempdir().unwrap();
    let issuer_key = dir.path().join("issuer.pem");
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    std::fs::write(&issuer_key, pair.public_key_pem()).unwrap();
    let config = format!(
        r#"
        {ALL}
        [[auth.api_keys]]
        principal = "bob"
        sha256 = "{digest}"

        [[auth.jwt]]
        issuer = "https://idp.example/"
        audiences = ["toolmesh"]
        algorithms = ["ES256"]
        public_key_file = "{issuer_key}"

        [policy]
        default = "deny"

        [[policy.rules]]
        name = "reasoning-only"
        effect = "allow"
        tools = ["think", "analyze"]
        "#,
        digest = toolmesh_identity::key_digest(&key),
        issuer_key = issuer_key.display(),
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    let url = endpoint(&server, "/mcp/all");

    let (status, _, _) = post(&url, initialize(), None, None).await;
    assert_eq!(status, 401);
    let response = http().post(&url).body(initialize().to_string()).send().await.unwrap();
    let challenge = response.headers()["www-authenticate"].to_str().unwrap().to_owned();
    let metadata_url = format!("http://{}/.well-known/oauth-protected-resource/mcp", server.addr);
    assert!(challenge.starts_with("Bearer "), "{challenge}");
    assert!(challenge.contains(&format!("resource_metadata=\"{metadata_url}\"")), "{challenge}");
    let metadata: Value = http().get(&metadata_url).send().await.unwrap().json_value().await;
    assert_eq!(metadata["resource"], format!("http://{}/mcp", server.addr));
    assert_eq!(metadata["authorization_servers"], json!(["https://idp.example/"]));
    let (status, _, _) = post(&url, initialize(), None, Some("not a key")).await;
    assert_eq!(status, 401);

    let plan = json!([
        {"op": "list"},
        {"op": "call", "name": "think", "arguments": {"title": "t", "thought": "x"}},
    ]);
    for client in CLIENTS {
        let got = client.run(&url, plan.clone(), &[("TOOLMESH_TOKEN", &key)]).await;
        let names = &got[1]["tools"];
        assert_eq!(names, &json!(["analyze", "callTool", "searchTools", "think"]), "{client:?}");
        assert_eq!(got[2]["is_error"], false, "{client:?}: {}", got[2]);
        let hidden = json!([{"op": "call_error", "name": "echo"}]);
        let got = client.run(&url, hidden, &[("TOOLMESH_TOKEN", &key)]).await;
        assert_eq!(got[1]["code"], -32602, "{client:?}: a hidden tool is not found: {}", got[1]);
        // Without a credential the client cannot connect: the endpoint answers 401.
        let refused = client.output(&url, json!([]), &[]).await;
        assert!(!refused.status.success(), "{client:?} connected without a credential");
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(said.contains("401"), "{client:?}: {said}");
    }
    let (_, session, _) = post(&url, initialize(), None, Some(&key)).await;
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "echo", "arguments": {}}});
    let (status, _, answer) = post(&url, call, session.as_deref(), Some(&key)).await;
    assert_eq!(status, 200);
    assert_eq!(answer["error"]["code"], -32602, "a hidden tool is not found: {answer}");
    server.stop().await.unwrap();
}

/// On the shipped defaults, `toolmesh serve` answers MCP on its gRPC port over HTTP/1.1:
/// `/mcp` shows the catalog as `ListTools` does, `/mcp/default` the default profile
/// (searchTools and callTool), through which a client finds a tool and calls it with the
/// search's token.
#[tokio::test]
async fn the_shipped_defaults_serve_mcp_on_the_grpc_port() {
    let server = BinaryServer::start(&[], &[]).await.unwrap();
    let whole = format!("http://{}/mcp", server.addr);
    let got = python_client(&whole, "2025-11-25", json!([{"op": "list"}]), &[]).await;
    assert_eq!(got[1]["tools"], json!(["analyze", "callTool", "echo", "searchTools", "think"]));
    let url = format!("http://{}/mcp/default", server.addr);
    for client in CLIENTS {
        let plan = json!([
            {"op": "list"},
            {"op": "search_call", "query": "return my arguments", "name": "echo",
             "arguments": {"message": "hi"}},
        ]);
        let got = client.run(&url, plan, &[]).await;
        assert_eq!(got[1]["tools"], json!(["callTool", "searchTools"]), "{client:?}");
        assert!(got[2]["found"].as_array().unwrap().iter().any(|t| t == "echo"), "{}", got[2]);
        let called = &got[2]["called"];
        assert_eq!(called["is_error"], false, "{client:?}: {called}");
        assert!(text_of(called).contains("hi"), "{client:?}: {called}");
    }
}

trait JsonValue {
    async fn json_value(self) -> Value;
}

impl JsonValue for reqwest::Response {
    async fn json_value(self) -> Value {
        serde_json::from_str(&self.text().await.unwrap()).unwrap()
    }
}
