//! MCP servers behind toolmesh, end to end, against real third-party servers:
//! `@modelcontextprotocol/server-everything` (npm) over stdio and streamable HTTP, and a
//! server written with the Python `mcp` SDK (`tests/mcp/py_server.py`) over stdio.

use std::{path::Path, process::Stdio, time::Duration};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tonic::Code;
use toolmesh::AppOptions;
use toolmesh_e2e::{BinaryServer, calls::open_stream, py_stdio_config, toolmesh_bin};
use toolmesh_e2e::{PyHttpServer, TestServer, eventually, process_alive, py_server, python, text};
use toolmesh_proto::v1::{
    CallToolClientMessage, CallToolRequest, CancelCall, ElicitationAction, ElicitationAnswer,
    ListToolsRequest, SamplingAnswer, SourceKind, Tool, call_tool_client_message,
    call_tool_server_message::Message, content_part::Part,
};

const EVERYTHING: &str = "mcp-server-everything";

async fn tools(server: &TestServer) -> Vec<Tool> {
    server.client().await.list_tools(ListToolsRequest::default()).await.unwrap().into_inner().tools
}

/// Waits until the catalog lists `name`.
async fn wait_for_tool(server: &TestServer, name: &str) -> Tool {
    eventually(Duration::from_secs(30), || async {
        tools(server).await.into_iter().find(|t| t.name == name)
    })
    .await
    .unwrap_or_else(|| panic!("{name} was never published"))
}

/// Calls over StreamCallTool and returns every server message.
async fn stream(
    server: &TestServer,
    name: &str,
    arguments: Value,
) -> Result<Vec<Message>, tonic::Status> {
    let start = call_tool_client_message::Message::Start(CallToolRequest {
        name: name.into(),
        arguments_json: arguments.to_string(),
        ..Default::default()
    });
    let outbound = futures::stream::iter([CallToolClientMessage { message: Some(start) }]);
    let mut stream = server.client().await.stream_call_tool(outbound).await?.into_inner();
    let mut messages = Vec::new();
    while let Some(message) = stream.message().await? {
        messages.push(message.message.unwrap());
    }
    Ok(messages)
}

fn progress_of(messages: &[Message]) -> Vec<(f64, Option<f64>)> {
    messages
        .iter()
        .filter_map(|m| match m {
            Message::Progress(p) => Some((p.progress, p.total)),
            _ => None,
        })
        .collect()
}

/// Checks the everything server's tools through `prefix`.
async fn exercise_everything(server: &TestServer, prefix: &str) {
    let echo = wait_for_tool(server, &format!("{prefix}_echo")).await;
    let source = echo.source.unwrap();
    assert_eq!(source.kind(), SourceKind::Mcp);
    assert!(source.available, "{}", source.status);
    let schema: Value = serde_json::from_str(&echo.input_schema_json).unwrap();
    assert_eq!(schema["properties"]["message"]["type"], "string");
    let long = wait_for_tool(server, &format!("{prefix}_trigger-long-running-operation")).await;
    assert_eq!(long.annotations.unwrap().read_only, Some(true));
    assert!(!long.title.is_empty());

    let echoed = server.call(&format!("{prefix}_echo"), json!({"message": "hi"})).await.unwrap();
    assert_eq!(text(&echoed), "Echo: hi");
    let sum = server.call(&format!("{prefix}_get-sum"), json!({"a": 2, "b": 40})).await.unwrap();
    assert!(text(&sum).contains("42"), "{}", text(&sum));

    // Arguments are checked against the server's inputSchema before anything is sent.
    let invalid = server.call(&format!("{prefix}_get-sum"), json!({"a": "two"})).await.unwrap_err();
    assert_eq!(invalid.code(), Code::InvalidArgument);
    assert!(invalid.message().contains("/a"), "{}", invalid.message());

    let structured = server
        .call(&format!("{prefix}_get-structured-content"), json!({"location": "Chicago"}))
        .await
        .unwrap();
    let value: Value =
        serde_json::from_str(structured.structured_json.as_deref().unwrap()).unwrap();
    assert!(value["temperature"].is_number(), "{value}");

    let image = server.call(&format!("{prefix}_get-tiny-image"), json!({})).await.unwrap();
    let media = image
        .content
        .iter()
        .find_map(|p| match &p.part {
            Some(Part::Media(m)) => Some(m.clone()),
            _ => None,
        })
        .expect("an image part");
    assert_eq!(media.mime_type, "image/png");
    assert_eq!(&media.data[1..4], b"PNG", "base64 was decoded to the PNG bytes");

    let messages = stream(
        server,
        &format!("{prefix}_trigger-long-running-operation"),
        json!({"duration": 0.4, "steps": 4}),
    )
    .await
    .unwrap();
    assert_eq!(
        progress_of(&messages),
        [(1.0, Some(4.0)), (2.0, Some(4.0)), (3.0, Some(4.0)), (4.0, Some(4.0))]
    );
    assert!(matches!(messages.last(), Some(Message::Result(r)) if text(r).contains("completed")));

    // Elicitation: the server's question reaches the caller, and the answer gets back.
    let elicit = format!("{prefix}_trigger-elicitation-request");
    wait_for_tool(server, &elicit).await;
    let content = json!({"name": "Ada Lovelace", "check": true});
    let accepted = answer_elicitation(server, &elicit, ElicitationAction::Accept, content).await;
    assert!(
        accepted.contains("Name: Ada Lovelace") && accepted.contains("Agreed to terms: true"),
        "{accepted}"
    );
    let declined = answer_elicitation(server, &elicit, ElicitationAction::Decline, json!({})).await;
    assert!(declined.contains("declined"), "{declined}");
    // A unary call cannot answer: the question is answered `cancel`, nothing blocks.
    let unary = server.call(&elicit, json!({})).await.unwrap();
    assert!(text(&unary).contains("cancelled"), "{}", text(&unary));

    // Sampling: the server's sampling/createMessage reaches a caller that samples, and the
    // completion gets back; a caller that does not sample has the server told so.
    let sample = format!("{prefix}_trigger-sampling-request");
    wait_for_tool(server, &sample).await;
    let arguments = json!({"prompt": "the answer", "maxTokens": 20});
    let (params, sampled) = answer_sampling(server, &sample, arguments.clone()).await;
    assert_eq!(
        params["messages"][0]["content"]["text"],
        format!("Resource trigger-sampling-request context: the answer")
    );
    assert_eq!(params["maxTokens"], 20, "{params}");
    assert!(sampled.contains("forty-two") && sampled.contains("test-model"), "{sampled}");
    let unary = server.call(&sample, arguments).await;
    let refused = match unary {
        Ok(result) => text(&result),
        Err(status) => status.message().to_owned(),
    };
    assert!(refused.contains("does not sample"), "{refused}");
}

/// Calls `tool` over StreamCallTool as a caller that samples, answers its one sampling
/// request with a fixed completion, and returns the request's params and the result's text.
async fn answer_sampling(server: &TestServer, tool: &str, arguments: Value) -> (Value, String) {
    let request = CallToolRequest {
        name: tool.into(),
        arguments_json: arguments.to_string(),
        sampling: true,
        ..Default::default()
    };
    let (tx, mut responses) = open_stream(&mut server.client().await, request).await;
    let mut asked = None;
    while let Some(message) = responses.message().await.unwrap() {
        match message.message.unwrap() {
            Message::Sampling(request) => {
                asked = Some(serde_json::from_str(&request.params_json).unwrap());
                let completion = json!({
                    "role": "assistant",
                    "content": {"type": "text", "text": "forty-two"},
                    "model": "test-model",
                    "stopReason": "endTurn",
                });
                let answer = SamplingAnswer {
                    sampling_id: request.sampling_id,
                    result_json: completion.to_string(),
                    error: String::new(),
                };
                let answer = call_tool_client_message::Message::SamplingAnswer(answer);
                tx.send(CallToolClientMessage { message: Some(answer) }).await.unwrap();
            }
            Message::Result(result) => {
                let asked = asked.expect("the sampling request came before the result");
                return (asked, text(&result));
            }
            _ => {}
        }
    }
    panic!("no result")
}

/// Calls `tool` over StreamCallTool, answers its one elicitation (whose schema asks for a
/// string `name`) with `action` and `content`, and returns the result's text.
async fn answer_elicitation(
    server: &TestServer,
    tool: &str,
    action: ElicitationAction,
    content: Value,
) -> String {
    let request = CallToolRequest { name: tool.into(), ..Default::default() };
    let (tx, mut responses) = open_stream(&mut server.client().await, request).await;
    let mut asked = false;
    while let Some(message) = responses.message().await.unwrap() {
        match message.message.unwrap() {
            Message::Elicitation(question) => {
                assert!(!question.message.is_empty());
                let schema: Value = serde_json::from_str(&question.requested_schema_json).unwrap();
                assert_eq!(schema["properties"]["name"]["type"], "string", "{schema}");
                let answer = ElicitationAnswer {
                    elicitation_id: question.elicitation_id,
                    action: action.into(),
                    content_json: content.to_string(),
                };
                let answer = call_tool_client_message::Message::ElicitationAnswer(answer);
                tx.send(CallToolClientMessage { message: Some(answer) }).await.unwrap();
                asked = true;
            }
            Message::Result(result) => {
                assert!(asked, "the question came before the result");
                return text(&result);
            }
            _ => {}
        }
    }
    panic!("no result")
}

#[tokio::test]
async fn everything_server_over_stdio() {
    let config = format!(
        "[[mcp.servers]]\nname = \"everything\"\ntransport = \"stdio\"\ncommand = \"{EVERYTHING}\"\nargs = [\"stdio\"]\n"
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    exercise_everything(&server, "everything").await;
    assert_eq!(server.app.mcp().protocol("everything").as_deref(), Some("2025-11-25"));
}

/// `mcp-server-everything streamableHttp` on a free port; killed on drop.
struct HttpEverything {
    child: tokio::process::Child,
    port: u16,
}

impl HttpEverything {
    async fn start(port: u16) -> Self {
        Self::start_mode("streamableHttp", "listening on port", port).await
    }

    /// Starts the server in `mode`, waiting for `ready` on its stderr.
    async fn start_mode(mode: &str, ready: &'static str, port: u16) -> Self {
        let mut child = toolmesh_e2e::spawn(
            tokio::process::Command::new(EVERYTHING)
                .arg(mode)
                .env("PORT", port.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .kill_on_drop(true),
        )
        .expect("mcp-server-everything is installed (tests/setup installs it from npm)");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let ready = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains(ready) {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(ready, Ok(true), "the {mode} server started");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        HttpEverything { child, port }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test]
async fn everything_server_over_streamable_http_survives_a_restart() {
    survives_a_restart("ping_interval_ms = 300\n").await;
}

#[tokio::test]
async fn everything_server_over_streamable_http_survives_a_restart_on_the_default_liveness_probe() {
    survives_a_restart("").await;
}

/// Kills the server in the middle of a call of a read-only, idempotent tool and starts it
/// again: the call is repeated once the server is back, within its deadline (the server's
/// annotations are trusted; `an_untrusted_servers_read_only_call_is_not_repeated` is the
/// default).
async fn survives_a_restart(liveness: &str) {
    let port = free_port();
    let mut upstream = HttpEverything::start(port).await;
    let config = format!(
        "[[mcp.servers]]\nname = \"web\"\ntransport = \"streamable-http\"\nurl = \"http://127.0.0.1:{}/mcp\"\ntimeout_ms = 20000\ntrust_annotations = true\n{liveness}",
        upstream.port
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    exercise_everything(&server, "web").await;
    let long = wait_for_tool(&server, "web_trigger-long-running-operation").await;
    let hints = long.annotations.unwrap_or_default();
    assert_eq!((hints.read_only, hints.idempotent), (Some(true), Some(true)), "{hints:?}");

    let pending = tokio::spawn({
        let client = server.client().await;
        async move {
            let mut client = client;
            let request = CallToolRequest {
                name: "web_trigger-long-running-operation".into(),
                arguments_json: json!({"duration": 2, "steps": 2}).to_string(),
                ..Default::default()
            };
            let started = std::time::Instant::now();
            (client.call_tool(request).await, started)
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    upstream.child.kill().await.unwrap();
    let killed = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _upstream = HttpEverything::start(port).await;
    let (result, started) = pending.await.unwrap();
    let output = result.expect("the call was repeated once the server was back").into_inner();
    assert!(!output.is_error, "{output:?}");
    assert!(text(&output).contains("Long running operation completed"), "{output:?}");
    // The whole operation (2 s) ran again after the restart.
    assert!(killed.elapsed() >= Duration::from_secs(3), "{:?}", killed.elapsed());
    assert!(started.elapsed() < Duration::from_secs(20));

    let back = eventually(Duration::from_secs(30), || async {
        server.call("web_echo", json!({"message": "back"})).await.ok()
    })
    .await
    .expect("calls work again after the server restarted");
    assert_eq!(text(&back), "Echo: back");
}

/// A server that forgot its sessions (restarted between two calls, with no call running
/// and before a liveness probe noticed): the next call, sent in the old session, is refused
/// before it runs and goes out again in a new session; the calls after it are sent in the
/// new one. None of them fails, whatever the tool's annotations.
#[tokio::test]
async fn a_call_in_a_forgotten_session_goes_out_in_a_new_one() {
    let port = free_port();
    let mut upstream = HttpEverything::start(port).await;
    // The probe would find the restart and reconnect; this is about a restart it misses.
    let config = format!(
        "[[mcp.servers]]\nname = \"web\"\ntransport = \"streamable-http\"\nurl = \"http://127.0.0.1:{port}/mcp\"\nping_interval_ms = 600000\n"
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    wait_for_tool(&server, "web_echo").await;
    let first = server.call("web_echo", json!({"message": "one"})).await.unwrap();
    assert_eq!(text(&first), "Echo: one");

    upstream.child.kill().await.unwrap();
    let _upstream = HttpEverything::start(port).await;
    for message in ["two", "three", "four"] {
        let output = server
            .call("web_echo", json!({"message": message}))
            .await
            .unwrap_or_else(|e| panic!("the call {message} after the restart failed: {e:?}"));
        assert_eq!(text(&output), format!("Echo: {message}"));
    }
}

/// Kills the server (its annotations trusted) under a read-only call with a 20 s deadline,
/// for good: the repeated
/// call waits for the connection `reconnect_wait_ms` (5 s by default) after it was lost,
/// not for the whole deadline (it failed after 19.9 s).
#[tokio::test]
async fn a_read_only_call_fails_within_seconds_when_its_server_dies_for_good() {
    let port = free_port();
    let mut upstream = HttpEverything::start(port).await;
    let config = format!(
        "[[mcp.servers]]\nname = \"web\"\ntransport = \"streamable-http\"\nurl = \"http://127.0.0.1:{port}/mcp\"\ntimeout_ms = 60000\ntrust_annotations = true\n"
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    wait_for_tool(&server, "web_trigger-long-running-operation").await;
    let pending = tokio::spawn({
        let mut client = server.client().await;
        async move {
            let mut request = tonic::Request::new(CallToolRequest {
                name: "web_trigger-long-running-operation".into(),
                arguments_json: json!({"duration": 10, "steps": 2}).to_string(),
                ..Default::default()
            });
            request.set_timeout(Duration::from_secs(20));
            client.call_tool(request).await
        }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    upstream.child.kill().await.unwrap();
    let killed = std::time::Instant::now();
    let failed = pending.await.unwrap().expect_err("the server is gone");
    assert_eq!(failed.code(), tonic::Code::Unavailable, "{failed:?}");
    assert!(failed.message().contains("reconnect_wait_ms"), "{}", failed.message());
    // Found dead by the liveness probe (5 s, then two quicker ones), then 5 s of waiting
    // for a reconnect: about 12 s at worst, whatever the deadline.
    assert!(killed.elapsed() < Duration::from_secs(13), "failed after {:?}", killed.elapsed());
}

#[tokio::test]
async fn python_sdk_server_results_progress_cancellation_and_list_changed() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("marker");
    let config = format!(
        r#"
[[mcp.servers]]
name = "py"
transport = "stdio"
command = "{}"
args = ["{}"]
env = {{ TOOLMESH_TEST_MARKER = "{}" }}
"#,
        python(),
        py_server(),
        marker.display()
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    wait_for_tool(&server, "py_add").await;
    assert_eq!(server.app.mcp().protocol("py").as_deref(), Some("2026-07-28"), "server/discover");

    // Published names keep the server's own name beside them: after a prefix, and after
    // shortening to the 64 characters model APIs accept.
    let listed = tools(&server).await;
    let upstream = |name: &str| {
        listed.iter().find(|t| t.name == name).map(|t| t.source.clone().unwrap().upstream_name)
    };
    assert_eq!(upstream("py_add").as_deref(), Some("add"));
    let long = "summarise_the_quarterly_revenue_report_for_every_region_and_product_line";
    let shortened = listed
        .iter()
        .find(|t| t.source.as_ref().unwrap().upstream_name == long)
        .expect("the long tool is published");
    assert_eq!(shortened.name.len(), 64);
    assert!(shortened.name.starts_with("py_summarise_the_quarterly"), "{}", shortened.name);
    assert_eq!(text(&server.call(&shortened.name, json!({})).await.unwrap()), "long");

    let sum = server.call("py_add", json!({"a": 20, "b": 22})).await.unwrap();
    assert!(!sum.is_error);
    assert_eq!(text(&sum), "42");

    let failed = server.call("py_fail", json!({})).await.unwrap();
    assert!(failed.is_error, "a tool-level error is an is_error result");
    assert!(text(&failed).contains("fail"), "{}", text(&failed));

    let messages = stream(&server, "py_slow", json!({"steps": 5})).await.unwrap();
    let progress: Vec<f64> = progress_of(&messages).into_iter().map(|(p, _)| p).collect();
    assert_eq!(progress, [1.0, 2.0, 3.0, 4.0, 5.0]);
    assert!(matches!(messages.last(), Some(Message::Result(r)) if text(r) == "done after 5 steps"));

    // Cancelling the gRPC call reaches the server as notifications/cancelled.
    let request = CallToolRequest {
        name: "py_slow".into(),
        arguments_json: json!({"steps": 400}).to_string(),
        ..Default::default()
    };
    let (tx, mut responses) = open_stream(&mut server.client().await, request).await;
    loop {
        if let Some(Message::Progress(_)) = responses.message().await.unwrap().unwrap().message {
            break;
        }
    }
    let cancel = call_tool_client_message::Message::Cancel(CancelCall { reason: "test".into() });
    tx.send(CallToolClientMessage { message: Some(cancel) }).await.unwrap();
    assert_eq!(responses.message().await.unwrap_err().code(), Code::Cancelled);
    eventually(Duration::from_secs(10), || async {
        std::fs::read_to_string(&marker).ok().filter(|m| m.contains("cancelled")).map(|_| ())
    })
    .await
    .expect("the server saw the cancellation");

    // Elicitation on a 2026-07-28 session (an input round of tools/call).
    let hello =
        answer_elicitation(&server, "py_ask", ElicitationAction::Accept, json!({"name": "Grace"}))
            .await;
    assert_eq!(hello, "hello Grace");
    let declined =
        answer_elicitation(&server, "py_ask", ElicitationAction::Decline, json!({})).await;
    assert!(declined.contains("decline"), "{declined}");
    let unary = server.call("py_ask", json!({})).await.unwrap();
    assert!(text(&unary).contains("cancel"), "{}", text(&unary));

    // Sampling on a 2026-07-28 session: an input round the caller answers with its model;
    // a unary call says in its request that it does not sample, and the server refuses.
    let (params, sampled) = answer_sampling(&server, "py_think", json!({"topic": "tea"})).await;
    assert_eq!(params["messages"][0]["content"]["text"], "Say something about tea", "{params}");
    assert_eq!(sampled, "the model says: forty-two");
    let unary = server.call("py_think", json!({"topic": "tea"})).await;
    assert!(unary.as_ref().map_or(true, |r| r.is_error), "{unary:?}");

    // tools/list_changed: the new tool is published without a restart.
    assert!(!tools(&server).await.iter().any(|t| t.name == "py_extra"));
    server.call("py_grow", json!({})).await.unwrap();
    wait_for_tool(&server, "py_extra").await;
    assert_eq!(text(&server.call("py_extra", json!({})).await.unwrap()), "extra");
}

/// On the defaults an MCP server's annotations are listed as it states them but not acted
/// on: a call of a tool the server calls read-only and idempotent, whose server dies under
/// it, is not repeated, and the caller learns that its outcome is unknown.
#[tokio::test]
async fn an_untrusted_servers_read_only_call_is_not_repeated() {
    let tag = format!("TOOLMESH_TEST_TAG=untrusted-{}", std::process::id());
    let (key, value) = tag.split_once('=').unwrap();
    let config = format!(
        "[[mcp.servers]]\nname = \"py\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"{}\"]\nenv = {{ {key} = \"{value}\" }}\n",
        python(),
        py_server()
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    let listed = wait_for_tool(&server, "py_count").await.annotations.unwrap_or_default();
    assert_eq!((listed.read_only, listed.idempotent), (Some(true), Some(true)), "{listed:?}");
    assert!(listed.untrusted, "the listing says toolmesh does not act on them");
    let child = processes_with(&tag);
    assert_eq!(child.len(), 1, "one child per server");
    let pending = tokio::spawn({
        let mut client = server.client().await;
        async move {
            let request = CallToolRequest {
                name: "py_count".into(),
                arguments_json: json!({"steps": 20}).to_string(),
                ..Default::default()
            };
            client.call_tool(request).await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child[0]), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    let status = pending.await.unwrap().expect_err("the call is not repeated");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("outcome"), "{}", status.message());
    assert!(status.message().contains("trusts"), "{}", status.message());
}

/// `[[catalog.tools]]` states what is true of a server's tools over what the server says: a
/// new name and description, hints toolmesh then acts on, and a tool kept out altogether.
#[tokio::test]
async fn the_operator_overrides_what_a_server_says_of_its_tools() {
    let config = format!(
        r#"
[[mcp.servers]]
name = "py"
transport = "stdio"
command = "{}"
args = ["{}"]

[[catalog.tools]]
tool = "py_add"
name = "sum"
description = "Sums two integers."

[[catalog.tools]]
tool = "py_count"
annotations = {{ read_only = true }}

[[catalog.tools]]
tool = "py_slow"
hidden = true

[[catalog.toolkits]]
name = "arithmetic"
instructions = "Add first."
tools = ["py_add"]
"#,
        python(),
        py_server()
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    let sum = wait_for_tool(&server, "sum").await;
    assert_eq!(sum.description, "Sums two integers.");
    assert_eq!(sum.toolkit, "arithmetic", "the operator's toolkit takes the tool");
    // The server's other tools are its own toolkit, with the server's instructions.
    let listed = eventually(Duration::from_secs(30), || async {
        let request = ListToolsRequest { toolkit: "py".into(), ..Default::default() };
        let listed = server.client().await.list_tools(request).await.unwrap().into_inner();
        let toolkit = listed.toolkits.into_iter().find(|k| k.name == "py")?;
        (!toolkit.instructions.is_empty()).then_some((listed.tools, toolkit))
    })
    .await;
    let (members, py) = listed.expect("the server's toolkit, with its instructions");
    assert_eq!(py.instructions, "Count before you wait: call count, then slow.");
    assert_eq!(py.description, "Tools for toolmesh's tests.");
    assert!(py.tools.contains(&"py_count".to_owned()), "{py:?}");
    assert!(!py.tools.iter().any(|t| t == "sum" || t == "py_slow"), "{py:?}");
    assert!(members.iter().all(|t| t.toolkit == "py"), "{members:?}");
    assert_eq!(sum.source.unwrap().upstream_name, "add", "the server is called by its own name");
    assert_eq!(text(&server.call("sum", json!({"a": 1, "b": 2})).await.unwrap()), "3");

    let names: Vec<String> = tools(&server).await.into_iter().map(|t| t.name).collect();
    assert!(!names.iter().any(|n| n == "py_add" || n == "py_slow"), "{names:?}");
    let hidden = server.call("py_slow", json!({"steps": 1})).await.unwrap_err();
    assert_eq!(hidden.code(), Code::NotFound, "{hidden:?}");

    // The operator's hint counts; the server's own claims, untrusted, are dropped.
    let count = wait_for_tool(&server, "py_count").await.annotations.unwrap();
    assert_eq!((count.read_only, count.idempotent, count.untrusted), (Some(true), None, false));
    server.stop().await.unwrap();
}

/// An MCP server's resources, resource templates and prompts, through gRPC: listed with
/// their `_meta` (an MCP App's `ui://` resource too), read by URI (listed or matched by a
/// template), a prompt got with its arguments; a policy rule that selects a template hides
/// it from the list and its resources from reading.
#[tokio::test]
async fn resources_and_prompts_are_listed_read_and_got_under_policy() {
    use toolmesh_proto::v1::{
        GetPromptRequest, ListPromptsRequest, ListResourcesRequest, ReadResourceRequest,
        content_part::Part, resource_contents::Body,
    };
    let config = format!(
        "{}\n[[policy.rules]]\nname = \"no-topics\"\neffect = \"deny\"\ntools = [\"py_notes_on\"]\n",
        py_stdio_config()
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    let mut client = server.client().await;
    let listed = eventually(Duration::from_secs(30), || {
        let mut client = client.clone();
        async move {
            let listed = client.list_resources(ListResourcesRequest::default()).await.ok()?;
            let listed = listed.into_inner();
            (!listed.resources.is_empty()).then_some(listed)
        }
    })
    .await
    .expect("the server's resources are listed");
    let uris: Vec<&str> = listed.resources.iter().map(|r| r.uri.as_str()).collect();
    assert_eq!(uris, ["py://notes", "ui://py/widget"], "{listed:?}");
    let notes = &listed.resources[0];
    assert_eq!((notes.server.as_str(), notes.name.as_str()), ("py", "notes"));
    assert_eq!(notes.mime_type, "text/plain");
    let widget: Value = serde_json::from_str(&listed.resources[1].meta_json).unwrap();
    assert_eq!(widget["ui"]["prefersBorder"], true, "an MCP App's metadata is kept");
    assert!(listed.templates.is_empty(), "the template is hidden by policy: {listed:?}");

    let read = |uri: &str| ReadResourceRequest { uri: uri.into(), ..Default::default() };
    let text = |response: toolmesh_proto::v1::ReadResourceResponse| match &response.contents[0].body
    {
        Some(Body::Text(text)) => text.clone(),
        other => panic!("{other:?}"),
    };
    let notes = client.read_resource(read("py://notes")).await.unwrap().into_inner();
    assert_eq!((text(notes.clone()), notes.server.as_str()), ("Ship on Friday.".into(), "py"));
    let widget = client.read_resource(read("ui://py/widget")).await.unwrap().into_inner();
    assert_eq!(widget.contents[0].mime_type, "text/html;profile=mcp-app");
    assert_eq!(text(widget), "<p>a widget</p>");
    let hidden = client.read_resource(read("py://notes/rust")).await.unwrap_err();
    assert_eq!(hidden.code(), Code::NotFound, "{hidden:?}");
    let missing = client.read_resource(read("py://nowhere")).await.unwrap_err();
    assert!(missing.message().contains("py"), "the server's refusal, named: {missing:?}");
    let unnamed = client
        .read_resource(ReadResourceRequest { uri: "py://notes".into(), server: "nope".into() })
        .await
        .unwrap_err();
    assert_eq!(unnamed.code(), Code::NotFound, "{unnamed:?}");

    let prompts = client.list_prompts(ListPromptsRequest::default()).await.unwrap().into_inner();
    let greet = prompts.prompts.iter().find(|p| p.name == "py_greet").expect("the prompt");
    assert_eq!(greet.description, "Greets someone by name.");
    assert!(greet.arguments.iter().any(|a| a.name == "name" && a.required), "{greet:?}");
    let request = GetPromptRequest {
        name: "py_greet".into(),
        arguments: [("name".to_owned(), "Ada".to_owned())].into(),
    };
    let got = client.get_prompt(request).await.unwrap().into_inner();
    assert_eq!(got.messages[0].role, "user");
    let said = got.messages[0].content.as_ref().and_then(|c| c.part.clone());
    assert_eq!(said, Some(Part::Text("Say hello to Ada.".into())));
    let unknown = GetPromptRequest { name: "py_nope".into(), ..Default::default() };
    assert_eq!(client.get_prompt(unknown).await.unwrap_err().code(), Code::NotFound);
    server.stop().await.unwrap();
}

/// A tool whose definition changes after toolmesh pinned it. On the defaults the change is
/// logged once and the changed tool served. With `pin_definitions = "block"` a changed tool
/// is withheld, also across restarts (the pins are kept in the data directory), until
/// `accept` names its new digest, which the log gives. Each is an audit event.
#[tokio::test]
async fn a_changed_tool_definition_is_warned_about_or_withheld_until_accepted() {
    let data = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let start = |extra: &str| {
        let config = files.path().join("toolmesh.toml");
        std::fs::write(
            &config,
            format!(
                "[[mcp.servers]]\nname = \"py\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"{}\"]\n{extra}\n\n[policy.audit]\nto = \"stderr\"\n",
                python(),
                py_server()
            ),
        )
        .unwrap();
        let args = [
            "--config".to_owned(),
            config.display().to_string(),
            "--data-dir".to_owned(),
            data.path().display().to_string(),
        ];
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            BinaryServer::start(&args, &[]).await.unwrap()
        }
    };
    async fn stopped(mut server: BinaryServer) {
        server.signal(nix::sys::signal::Signal::SIGTERM);
        let exited = tokio::time::timeout(Duration::from_secs(30), server.child.wait()).await;
        assert!(exited.is_ok(), "the server stops");
    }
    let described = |server: &BinaryServer| {
        let addr = server.addr.to_string();
        async move {
            let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
            let tools = client.list_tools(ListToolsRequest::default()).await.ok()?.into_inner();
            tools.tools.into_iter().find(|t| t.name == "py_add").map(|t| t.description)
        }
    };
    const CHANGED: &str = "the tool's definition changed since it was pinned";

    // The defaults: the first listing is pinned; a change is warned about once and served.
    let server = start("").await;
    let first = eventually(Duration::from_secs(30), || described(&server)).await;
    assert_eq!(first.as_deref(), Some("Adds two integers."));
    let mut client = toolmesh::client::connect(&server.addr.to_string(), None).await.unwrap();
    let mutate = CallToolRequest {
        name: "py_mutate".into(),
        arguments_json: "{}".into(),
        ..Default::default()
    };
    client.call_tool(mutate.clone()).await.unwrap();
    eventually(Duration::from_secs(20), || async {
        described(&server).await.filter(|d| d.contains("id_rsa"))
    })
    .await
    .expect("the changed tool is served");
    assert_eq!(server.logs().matches(CHANGED).count(), 1, "{}", server.logs());
    // The audit log is written in batches, off the listing's path.
    async fn audited(server: &BinaryServer, decision: &str) -> bool {
        let seen = || {
            server.logs().lines().any(|line| {
                let Ok(line) = serde_json::from_str::<serde_json::Value>(line) else {
                    return false;
                };
                let event = &line["audit"];
                event["event"] == "definition_change"
                    && event["tool"] == "py_add"
                    && event["decision"] == decision
                    && event["note"].as_str().is_some_and(|n| n.contains("\"add\""))
            })
        };
        eventually(Duration::from_secs(5), || async { seen().then_some(()) }).await.is_some()
    }
    assert!(audited(&server, "warn").await, "audited: {}", server.logs());
    drop(client);
    stopped(server).await;

    // Blocked: the server process starts with the original definition, which differs from
    // the pinned (changed) one: the tool is withheld once the server has listed its tools.
    let server = start("pin_definitions = \"block\"").await;
    eventually(Duration::from_secs(30), || async { server.logs().contains(CHANGED).then_some(()) })
        .await
        .expect("the change is reported");
    eventually(Duration::from_secs(10), || async {
        described(&server).await.is_none().then_some(())
    })
    .await
    .expect("the changed tool is withheld");
    let logs = server.logs();
    let at = logs.find("\"add@").expect("the log says how to accept it") + 1;
    let accept = logs[at..].split('"').next().unwrap().to_owned();
    let mut client = toolmesh::client::connect(&server.addr.to_string(), None).await.unwrap();
    let add = CallToolRequest {
        name: "py_add".into(),
        arguments_json: json!({"a": 1, "b": 2}).to_string(),
        ..Default::default()
    };
    let withheld = client.call_tool(add.clone()).await.unwrap_err();
    assert_eq!(withheld.code(), Code::NotFound, "{withheld:?}");
    assert!(audited(&server, "block").await, "audited: {}", server.logs());
    drop(client);
    stopped(server).await;

    // Accepted: the named definition is served, and pinned.
    let server = start(&format!("pin_definitions = \"block\"\naccept = [\"{accept}\"]")).await;
    let accepted = eventually(Duration::from_secs(30), || async {
        described(&server).await.filter(|d| d == "Adds two integers.")
    })
    .await;
    assert!(accepted.is_some(), "{}", server.logs());
    let mut client = toolmesh::client::connect(&server.addr.to_string(), None).await.unwrap();
    assert_eq!(text(&client.call_tool(add).await.unwrap().into_inner()), "3");
    assert!(audited(&server, "accept").await, "audited: {}", server.logs());

    // Accepted with the CLI: the changed definition, withheld, is served after a reload.
    client.call_tool(mutate).await.unwrap();
    let reported = eventually(Duration::from_secs(30), || async {
        let logs = server.logs();
        let at = logs.rfind("\"add@")? + 1;
        let named = logs[at..].split('"').next()?.to_owned();
        (named != accept).then_some(named)
    })
    .await
    .expect("the second change is withheld and named");
    eventually(Duration::from_secs(10), || async {
        described(&server).await.is_none().then_some(())
    })
    .await
    .expect("the changed tool is withheld");
    let config = files.path().join("toolmesh.toml");
    let output = std::process::Command::new(toolmesh_bin())
        .args(["mcp", "accept", "py", &reported, "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(data.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    server.signal(nix::sys::signal::Signal::SIGHUP);
    eventually(Duration::from_secs(30), || async {
        described(&server).await.filter(|d| d.contains("id_rsa"))
    })
    .await
    .expect("the accepted definition is served after the reload");
    let refused = std::process::Command::new(toolmesh_bin())
        .args(["mcp", "accept", "nope", &reported, "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && message.contains("\"nope\""), "{message}");
}

/// Returns the pids of live processes whose environment holds `marker`.
fn processes_with(marker: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        if environ.split(|b| *b == 0).any(|kv| kv == marker.as_bytes()) && process_alive(pid) {
            pids.push(pid);
        }
    }
    pids
}

#[tokio::test]
async fn a_killed_stdio_server_is_unavailable_then_reconnected() {
    let tag = format!("TOOLMESH_TEST_TAG=kill-{}", std::process::id());
    let (key, value) = tag.split_once('=').unwrap();
    let config = format!(
        "[[mcp.servers]]\nname = \"py\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"{}\"]\nenv = {{ {key} = \"{value}\" }}\ntrust_annotations = true\n",
        python(),
        py_server()
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    wait_for_tool(&server, "py_add").await;
    let first = processes_with(&tag);
    assert_eq!(first.len(), 1, "one child per server");

    let pending = tokio::spawn({
        let mut client = server.client().await;
        async move {
            let request = CallToolRequest {
                name: "py_slow".into(),
                arguments_json: json!({"steps": 400}).to_string(),
                ..Default::default()
            };
            client.call_tool(request).await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(first[0]), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    // The tool has no annotations: it is not repeated, and the caller learns at once that
    // its outcome is unknown.
    let status = pending.await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("py"), "{}", status.message());
    assert!(status.message().contains("outcome"), "{}", status.message());

    let back = eventually(Duration::from_secs(20), || async {
        server.call("py_add", json!({"a": 1, "b": 2})).await.ok()
    })
    .await
    .expect("the server was restarted and calls work again");
    assert_eq!(text(&back), "3");
    let now = processes_with(&tag);
    assert_eq!(now.len(), 1, "exactly one live child: {now:?}");
    assert_ne!(now[0], first[0]);

    // A read-only, idempotent tool killed mid-call is repeated once the server is back.
    let pending = tokio::spawn({
        let mut client = server.client().await;
        async move {
            let request = CallToolRequest {
                name: "py_count".into(),
                arguments_json: json!({"steps": 20}).to_string(),
                ..Default::default()
            };
            client.call_tool(request).await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(now[0]), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    let repeated = pending.await.unwrap().expect("the idempotent call was repeated").into_inner();
    assert_eq!(text(&repeated), "counted to 20");
    let third = processes_with(&tag);
    assert_eq!(third.len(), 1, "exactly one live child: {third:?}");
    assert!(!third.contains(&now[0]), "the call ran again on a new server process");

    server.stop().await.unwrap();
    let gone = eventually(Duration::from_secs(10), || async {
        processes_with(&tag).is_empty().then_some(())
    })
    .await;
    assert!(gone.is_some(), "stopping toolmesh leaves no server process behind");
}

#[tokio::test]
async fn a_hanging_server_never_delays_the_others() {
    let config = format!(
        r#"
[[mcp.servers]]
name = "hang"
transport = "stdio"
command = "sleep"
args = ["600"]
timeout_ms = 1000

[[mcp.servers]]
name = "py"
transport = "stdio"
command = "{}"
args = ["{}"]
"#,
        python(),
        py_server()
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    wait_for_tool(&server, "py_add").await;
    for _ in 0..5 {
        let started = std::time::Instant::now();
        let listed = tools(&server).await;
        assert!(listed.iter().any(|t| t.name == "echo"));
        assert_eq!(text(&server.call("py_add", json!({"a": 2, "b": 2})).await.unwrap()), "4");
        assert!(started.elapsed() < Duration::from_millis(900), "took {:?}", started.elapsed());
    }
    let health = eventually(Duration::from_secs(10), || async {
        server.app.mcp().health().into_iter().find(|(name, h)| {
            name == "hang" && matches!(h, toolmesh_mcp::ServerHealth::Unhealthy { .. })
        })
    })
    .await;
    assert!(health.is_some(), "the hanging server is reported unhealthy");

    // gRPC health: one service per MCP server.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = |name: &str| {
        let mut health = health.clone();
        let service = format!("{}{name}", toolmesh::MCP_HEALTH_PREFIX);
        async move {
            health
                .check(tonic_health::pb::HealthCheckRequest { service })
                .await
                .map(|r| r.into_inner().status())
                .ok()
        }
    };
    use tonic_health::pb::health_check_response::ServingStatus;
    let settled = eventually(Duration::from_secs(10), || async {
        (status("py").await == Some(ServingStatus::Serving)
            && status("hang").await == Some(ServingStatus::NotServing))
        .then_some(())
    })
    .await;
    assert!(settled.is_some(), "py: {:?}, hang: {:?}", status("py").await, status("hang").await);
    let overall = health
        .check(tonic_health::pb::HealthCheckRequest { service: String::new() })
        .await
        .unwrap();
    assert_eq!(
        overall.into_inner().status(),
        ServingStatus::Serving,
        "one bad server does not fail the whole service"
    );
    let hanging_tools = tools(&server)
        .await
        .into_iter()
        .filter(|t| t.source.as_ref().is_some_and(|s| s.name == "hang"))
        .count();
    assert_eq!(hanging_tools, 0);
}

/// Returns the zombie children of this test process.
fn zombie_children() -> Vec<i32> {
    let me = std::process::id().to_string();
    let mut zombies = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let fields: Vec<&str> =
            stat.rsplit(')').next().unwrap_or_default().split_whitespace().collect();
        if fields.first() == Some(&"Z") && fields.get(1) == Some(&me.as_str()) {
            zombies.push(pid);
        }
    }
    zombies
}

#[tokio::test]
async fn a_hundred_actor_crashes_leave_no_zombies_or_orphans() {
    let tag = format!("TOOLMESH_TEST_TAG=cycles-{}", std::process::id());
    let (key, value) = tag.split_once('=').unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/mini_server.py");
    let config = format!(
        "[[mcp.servers]]\nname = \"mini\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"{}\"]\nenv = {{ {key} = \"{value}\" }}\n",
        python(),
        script.display()
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    wait_for_tool(&server, "mini_echo").await;
    assert_eq!(server.app.mcp().protocol("mini").as_deref(), Some("2025-06-18"));

    let mut killed = None;
    for cycle in 0..100 {
        // The server's actor ends abruptly, as in a crash; the supervisor starts another.
        let actor = eventually(Duration::from_secs(10), || async {
            server.app.mcp().actor("mini").filter(|a| Some(a.get_id()) != killed)
        })
        .await
        .unwrap_or_else(|| panic!("cycle {cycle}: no fresh actor serves the server"));
        killed = Some(actor.get_id());
        actor.kill();
        let answer = eventually(Duration::from_secs(10), || async {
            server.call("mini_echo", json!({"text": "ok"})).await.ok()
        })
        .await
        .unwrap_or_else(|| panic!("cycle {cycle}: the restarted server never answered"));
        assert_eq!(text(&answer), "ok");
    }

    // One server and its one child remain; everything else was killed and reaped.
    let settled = eventually(Duration::from_secs(10), || async {
        (processes_with(&tag).len() == 2 && zombie_children().is_empty()).then_some(())
    })
    .await;
    assert!(
        settled.is_some(),
        "live: {:?}, zombies: {:?}",
        processes_with(&tag),
        zombie_children()
    );

    server.stop().await.unwrap();
    let clean = eventually(Duration::from_secs(10), || async {
        (processes_with(&tag).is_empty() && zombie_children().is_empty()).then_some(())
    })
    .await;
    assert!(
        clean.is_some(),
        "after stop, live: {:?}, zombies: {:?}",
        processes_with(&tag),
        zombie_children()
    );
}

/// A server that lists its tools in pages is listed to the end, and one that hands back the
/// cursor it was given is not listed forever.
#[tokio::test]
async fn tools_listed_in_pages_are_all_published() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/mini_server.py");
    let config = format!(
        "[[mcp.servers]]\nname = \"paged\"\ntransport = \"stdio\"\ncommand = \"{python}\"\nargs = [\"{script}\"]\nenv = {{ MINI_EXTRA_TOOLS = \"24\", MINI_PAGE_SIZE = \"10\" }}\n\n\
         [[mcp.servers]]\nname = \"stuck\"\ntransport = \"stdio\"\ncommand = \"{python}\"\nargs = [\"{script}\"]\nenv = {{ MINI_EXTRA_TOOLS = \"4\", MINI_PAGE_SIZE = \"3\", MINI_STUCK_CURSOR = \"1\" }}\n",
        python = python(),
        script = script.display()
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    wait_for_tool(&server, "paged_echo_24").await;
    wait_for_tool(&server, "stuck_echo_4").await;
    let catalog = server.app.registry().snapshot();
    let count = |prefix: &str| catalog.iter().filter(|(n, _)| n.starts_with(prefix)).count();
    assert_eq!(count("paged_echo"), 25, "every page of 10 + 10 + 5 tools");
    assert_eq!(count("stuck_echo"), 5, "both pages, once each");
    let answer = server.call("paged_echo_17", json!({"text": "page two"})).await.unwrap();
    assert_eq!(text(&answer), "page two");
    server.stop().await.unwrap();
}

/// A server that answers `server/discover` with an empty result (it answers every request,
/// known or not) does not speak 2026-07-28: it is spoken to with `initialize` at once,
/// instead of failing its handshake and being retried with the same question forever.
#[tokio::test]
async fn a_server_that_answers_discover_with_an_empty_result_is_spoken_to_with_initialize() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/mini_server.py");
    let config = format!(
        "[[mcp.servers]]\nname = \"mini\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"{}\"]\nenv = {{ MINI_EMPTY_DISCOVER = \"1\" }}\n",
        python(),
        script.display()
    );
    let started = std::time::Instant::now();
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    wait_for_tool(&server, "mini_echo").await;
    let answer = server.call("mini_echo", json!({"text": "old school"})).await.unwrap();
    assert_eq!(text(&answer), "old school");
    assert_eq!(server.app.mcp().protocol("mini").as_deref(), Some("2025-06-18"));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "connected without waiting out reconnect backoff: {:?}",
        started.elapsed()
    );

    // A new connection (the server's actor crashed) speaks the same way.
    let actor = server.app.mcp().actor("mini").unwrap();
    actor.kill();
    let answer = eventually(Duration::from_secs(10), || async {
        server.call("mini_echo", json!({"text": "again"})).await.ok()
    })
    .await
    .expect("the restarted connection answers");
    assert_eq!(text(&answer), "again");
    server.stop().await.unwrap();
}

/// SEP-1034: a caller that accepts a form and leaves out a field with a default (as a gRPC
/// caller may) is completed with the default before the answer reaches the server.
#[tokio::test]
async fn an_accepted_form_reaches_the_server_with_its_defaults() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/mini_server.py");
    let config = format!(
        "[[mcp.servers]]\nname = \"mini\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"{}\"]\nenv = {{ MINI_FORM_TOOL = \"1\" }}\n",
        python(),
        script.display()
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    wait_for_tool(&server, "mini_form").await;
    let got =
        answer_elicitation(&server, "mini_form", ElicitationAction::Accept, json!({"name": "Ada"}))
            .await;
    let got: Value = serde_json::from_str(&got).unwrap();
    assert_eq!(got, json!({"name": "Ada", "greeting": "hello"}));
    let given = json!({"name": "Ada", "greeting": "hi"});
    let got = answer_elicitation(&server, "mini_form", ElicitationAction::Accept, given).await;
    assert_eq!(
        serde_json::from_str::<Value>(&got).unwrap(),
        json!({"name": "Ada", "greeting": "hi"})
    );
    server.stop().await.unwrap();
}

/// A stdio server does not inherit toolmesh's environment (which holds its secrets): it gets
/// the few variables the MCP SDKs pass on, and what its configuration names.
#[tokio::test]
async fn a_stdio_mcp_server_gets_a_minimal_environment() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/mini_server.py");
    let config = format!(
        "[[mcp.servers]]\nname = \"mini\"\ntransport = \"stdio\"\ncommand = \"{python}\"\nargs = [\"{script}\"]\nenv = {{ MINI_ENV_TOOL = \"1\", GIVEN = \"yes\" }}\n",
        python = python(),
        script = script.display()
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    wait_for_tool(&server, "mini_environment").await;
    let answer = server.call("mini_environment", json!({})).await.unwrap();
    let names: Vec<String> = serde_json::from_str(&text(&answer)).unwrap();
    assert!(names.contains(&"GIVEN".to_owned()) && names.contains(&"PATH".to_owned()), "{names:?}");
    let allowed = ["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "MINI_ENV_TOOL", "GIVEN"];
    // This process's variables (cargo's, the CI's, any secret) stay behind; a shell or a
    // pyenv shim between toolmesh and the server sets a few of its own.
    let own =
        |name: &str| ["PWD", "OLDPWD", "SHLVL", "_"].contains(&name) || name.starts_with("PYENV");
    let leaked: Vec<&String> = names
        .iter()
        .filter(|name| !allowed.contains(&name.as_str()) && *name != "TOOLMESH_PROCESS_TAG")
        .filter(|name| !own(name) && std::env::var_os(name.as_str()).is_some())
        .collect();
    assert!(leaked.is_empty(), "the server inherited {leaked:?}");
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some(), "the test has something to leak");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn reload_starts_and_stops_only_the_servers_that_changed() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/mini_server.py");
    let entry = |name: &str| {
        format!(
            "[[mcp.servers]]\nname = \"{name}\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"{}\"]\nenv = {{ TOOLMESH_TEST_TAG = \"reload-{name}-{}\" }}\n",
            python(),
            script.display(),
            std::process::id()
        )
    };
    let tag = |name: &str| format!("TOOLMESH_TEST_TAG=reload-{name}-{}", std::process::id());
    let server = TestServer::start(&entry("a"), AppOptions::default()).await.unwrap();
    wait_for_tool(&server, "a_echo").await;
    let a_before = processes_with(&tag("a"));
    assert_eq!(a_before.len(), 2, "server a and its child");
    // Its listing is kept for the next run, and forgotten when it leaves the configuration.
    let kept = server.data_dir().unwrap().join("mcp").join("a.jsonl");
    let written = eventually(Duration::from_secs(10), || async { kept.exists().then_some(()) });
    assert!(written.await.is_some(), "{} was never written", kept.display());

    server
        .app
        .reload(&TestServer::config(&format!("{}{}", entry("a"), entry("b"))).unwrap())
        .await
        .unwrap();
    wait_for_tool(&server, "b_echo").await;
    assert_eq!(processes_with(&tag("a")), a_before, "server a was left alone");
    let b_before = processes_with(&tag("b"));

    server.app.reload(&TestServer::config(&entry("b")).unwrap()).await.unwrap();
    let names: Vec<String> = tools(&server).await.into_iter().map(|t| t.name).collect();
    assert!(
        !names.contains(&"a_echo".to_owned()) && names.contains(&"b_echo".to_owned()),
        "{names:?}"
    );
    let gone = eventually(Duration::from_secs(10), || async {
        processes_with(&tag("a")).is_empty().then_some(())
    })
    .await;
    assert!(gone.is_some(), "server a's processes are gone");
    assert_eq!(processes_with(&tag("b")), b_before, "server b was left alone");
    assert!(!kept.exists(), "the listing of a server no longer configured is forgotten");
}

#[tokio::test]
async fn everything_server_over_legacy_sse_and_the_http_fallback() {
    let upstream =
        HttpEverything::start_mode("sse", "Server is running on port", free_port()).await;
    let url = format!("http://127.0.0.1:{}/sse", upstream.port);
    let config = format!(
        "[[mcp.servers]]\nname = \"legacy\"\ntransport = \"sse\"\nurl = \"{url}\"\n\n[[mcp.servers]]\nname = \"auto\"\ntransport = \"http\"\nurl = \"{url}\"\n"
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    exercise_everything(&server, "legacy").await;
    // `http` tries streamable HTTP first; this server answers only SSE, so it falls back.
    wait_for_tool(&server, "auto_echo").await;
    assert_eq!(
        text(&server.call("auto_echo", json!({"message": "via fallback"})).await.unwrap()),
        "Echo: via fallback"
    );
}

#[tokio::test]
async fn a_lazy_server_runs_only_while_it_is_used() {
    let tag = format!("TOOLMESH_TEST_TAG=lazy-{}", std::process::id());
    let (key, value) = tag.split_once('=').unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/mini_server.py");
    let config = format!(
        "[[mcp.servers]]\nname = \"lazy\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"{}\"]\nconnect = \"lazy\"\nidle_timeout_ms = 300\nenv = {{ {key} = \"{value}\" }}\n",
        python(),
        script.display()
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    let tool = wait_for_tool(&server, "lazy_echo").await;
    assert!(tool.source.unwrap().available);

    let idle = || async {
        let health = server.app.mcp().health();
        (health == [("lazy".to_owned(), toolmesh_mcp::ServerHealth::Idle)]
            && processes_with(&tag).is_empty())
        .then_some(())
    };
    eventually(Duration::from_secs(10), idle)
        .await
        .expect("closed while unused, its processes gone");
    let listed = wait_for_tool(&server, "lazy_echo").await;
    assert!(listed.source.unwrap().available, "an idle lazy server is still offered");

    let answer = server.call("lazy_echo", json!({"text": "wake up"})).await.unwrap();
    assert_eq!(text(&answer), "wake up", "the call opened the server");
    assert!(!processes_with(&tag).is_empty());
    eventually(Duration::from_secs(10), idle).await.expect("closed again after the idle timeout");
}

/// The Python SDK negotiates 2026-07-28, which has no `ping` (it answers -32601). On the
/// shipped `ping_interval_ms`, a call that outlasts several probe intervals must still
/// finish, over stdio and streamable HTTP alike, and the stdio server is never restarted.
#[tokio::test]
async fn python_sdk_servers_on_2026_07_28_stay_connected_on_the_default_liveness_probe() {
    let tag = format!("TOOLMESH_TEST_TAG=alive-{}", std::process::id());
    let (key, value) = tag.split_once('=').unwrap();
    let http = PyHttpServer::start().await;
    let config = format!(
        "[[mcp.servers]]\nname = \"py\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"{}\"]\nenv = {{ {key} = \"{value}\" }}\n\n\
         [[mcp.servers]]\nname = \"web\"\ntransport = \"streamable-http\"\nurl = \"http://127.0.0.1:{}/mcp\"\n",
        python(),
        py_server(),
        http.port,
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    wait_for_tool(&server, "py_slow").await;
    wait_for_tool(&server, "web_slow").await;
    assert_eq!(server.app.mcp().protocol("py").as_deref(), Some("2026-07-28"));
    assert_eq!(server.app.mcp().protocol("web").as_deref(), Some("2026-07-28"));
    let child = processes_with(&tag);
    assert_eq!(child.len(), 1, "one stdio server process");

    // 260 steps of 50 ms: about 13 s, more than two intervals of the default 5 s probe.
    let long = |name: &'static str| {
        let request = CallToolRequest {
            name: name.into(),
            arguments_json: json!({"steps": 260}).to_string(),
            ..Default::default()
        };
        let client = server.client();
        async move { client.await.call_tool(request).await }
    };
    let (stdio, web) = tokio::join!(long("py_slow"), long("web_slow"));
    assert_eq!(text(&stdio.unwrap().into_inner()), "done after 260 steps");
    assert_eq!(text(&web.unwrap().into_inner()), "done after 260 steps");

    for (name, health) in server.app.mcp().health() {
        assert_eq!(health, toolmesh_mcp::ServerHealth::Healthy, "{name}");
    }
    assert_eq!(processes_with(&tag), child, "the stdio server was never restarted");
}

/// On the shipped `max_concurrency` (64), a 65th concurrent call to one server is refused
/// at once with RESOURCE_EXHAUSTED naming the server, and the 64 others finish.
#[tokio::test]
async fn calls_beyond_a_servers_max_concurrency_are_resource_exhausted() {
    let config = format!(
        "[[mcp.servers]]\nname = \"py\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"{}\"]\n",
        python(),
        py_server()
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    wait_for_tool(&server, "py_slow").await;
    let calls: Vec<_> = (0..65)
        .map(|_| {
            let request = CallToolRequest {
                name: "py_slow".into(),
                arguments_json: json!({"steps": 60}).to_string(),
                ..Default::default()
            };
            let addr = server.addr.to_string();
            tokio::spawn(async move {
                toolmesh::client::connect(&addr, None).await.unwrap().call_tool(request).await
            })
        })
        .collect();
    let mut done = 0;
    let mut refused = Vec::new();
    for call in calls {
        match call.await.unwrap() {
            Ok(response) => {
                assert_eq!(text(&response.into_inner()), "done after 60 steps");
                done += 1;
            }
            Err(status) => refused.push(status),
        }
    }
    assert_eq!(done, 64, "{refused:?}");
    let [status] = &refused[..] else { panic!("one refusal: {refused:?}") };
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("mcp server py has 64 calls running"), "{status:?}");

    // The slots are free again.
    assert_eq!(text(&server.call("py_add", json!({"a": 1, "b": 1})).await.unwrap()), "2");
}

/// Every child of the root supervisor (registry, worker pool, MCP supervisor, search
/// index, retriever, the front door) that ends unasked is started again: its health
/// (`toolmesh.actor.<name>`) shows the restart, and what it did works again: local calls,
/// MCP calls, search, ingestion; the restarted front door goes on serving, reloads and
/// drains.
#[tokio::test]
async fn crashed_children_of_the_root_supervisor_are_restarted_and_their_health_shows_it() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/mini_server.py");
    let config = format!(
        "[[mcp.servers]]\nname = \"mini\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"{}\"]\n",
        python(),
        script.display()
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    wait_for_tool(&server, "mini_echo").await;
    let status = |service: String| {
        let server = &server;
        async move { server.health(&service).await }
    };
    let search = |query: &'static str| {
        let server = &server;
        async move {
            let request = toolmesh_proto::v1::SearchToolsRequest {
                query: query.into(),
                top_k: 3,
                ..Default::default()
            };
            let mut client = server.client().await;
            let hits = client.search_tools(request).await.ok()?.into_inner().hits;
            hits.into_iter().map(|h| h.tool.unwrap().name).find(|n| n == "echo")
        }
    };
    let names: Vec<&str> = server.app.actors().into_iter().map(|(name, _)| name).collect();
    assert_eq!(names, ["front", "knowledge", "mcp", "registry", "search", "workers"]);

    for child in ["registry", "workers", "mcp", "search", "knowledge", "front"] {
        let service = format!("toolmesh.actor.{child}");
        assert_eq!(status(service.clone()).await, Some(ServingStatus::Serving), "{child}");
        let old = server.app.actors().into_iter().find(|(n, _)| *n == child).unwrap().1;
        old.kill();
        let restarted = eventually(Duration::from_secs(20), || async {
            let fresh = server.app.actors().into_iter().find(|(n, _)| *n == child)?.1;
            let serving = status(service.clone()).await == Some(ServingStatus::Serving);
            (fresh.get_id() != old.get_id() && serving).then_some(())
        })
        .await;
        assert!(restarted.is_some(), "{child} was restarted and is serving again");
        let entry = server.app.health().get("actor", child).unwrap();
        assert!(entry.status.starts_with("restarted 1 times"), "{child}: {entry:?}");

        // What the child did works again.
        let local = eventually(Duration::from_secs(20), || async {
            server.call("echo", json!({"after": child})).await.ok()
        })
        .await;
        assert!(local.is_some(), "local calls work after {child} restarted");
        let remote = eventually(Duration::from_secs(30), || async {
            server.call("mini_echo", json!({"text": child})).await.ok()
        })
        .await
        .unwrap_or_else(|| panic!("mcp calls work after {child} restarted"));
        assert_eq!(text(&remote), child);
        let found =
            eventually(Duration::from_secs(20), || search("repeat my arguments back")).await;
        assert!(found.is_some(), "search works after {child} restarted");
        // The retriever answers again (here: that the collection does not exist).
        let answered = server.app.knowledge().ingest("nope", Vec::new()).await.unwrap_err();
        assert!(
            matches!(answered, toolmesh_knowledge::KnowledgeError::NoCollection { .. }),
            "after {child} restarted: {answered:?}"
        );
    }
    // The front door's fresh actor took over the running server.
    server.app.reload(&TestServer::config(&config).unwrap()).await.unwrap();
    assert!(server.stop().await.unwrap(), "the restarted front door drained the server");
}

/// A restart lists each MCP server's tools as the server listed them in the last run,
/// before the server answers: an eager server still starting has them listed, unavailable
/// but searchable, and a call made meanwhile waits for it; the server's own listing then
/// replaces them; a lazy server is not started until a call needs it; a server that cannot
/// start has them listed as unavailable, and calls fail naming it. A server configured with
/// `remember_tools = false` leaves nothing in the data directory.
#[tokio::test]
async fn a_restart_lists_the_remembered_tools_before_the_servers_answer() {
    let data = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/mini_server.py");
    let tag = format!("TOOLMESH_TEST_TAG=remembered-lazy-{}", std::process::id());
    let (key, value) = tag.split_once('=').unwrap();
    let config = |eager_env: &str| {
        let server = |name: &str, extra: &str| {
            format!(
                "[[mcp.servers]]\nname = \"{name}\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"{}\"]\n{extra}\n",
                python(),
                script.display()
            )
        };
        [
            server("eager", &format!("env = {{ {eager_env} }}")),
            server("lazy", &format!("connect = \"lazy\"\nenv = {{ {key} = \"{value}\" }}")),
            server("private", "remember_tools = false"),
        ]
        .concat()
    };
    let names = |tools: &[Tool], prefix: &str| {
        let mut names: Vec<String> =
            tools.iter().filter(|t| t.name.starts_with(prefix)).map(|t| t.name.clone()).collect();
        names.sort();
        names
    };

    // The first run: every server lists its tools, and two of them are kept.
    let first = TestServer::start_in(
        &config("MINI_EXTRA_TOOLS = \"2\""),
        AppOptions::default(),
        data.path(),
    )
    .await
    .unwrap();
    for tool in ["eager_echo_2", "lazy_echo", "private_echo"] {
        wait_for_tool(&first, tool).await;
    }
    first.stop().await.unwrap();
    let kept = data.path().join("mcp");
    let mut files: Vec<String> = std::fs::read_dir(&kept)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["eager.jsonl", "eager.pins.json", "lazy.jsonl", "lazy.pins.json"],
        "remember_tools = false keeps nothing"
    );

    // The second run: the eager server now takes four seconds to start and offers one tool
    // fewer. Its three tools of the last run are listed before it answers.
    let slow = "MINI_EXTRA_TOOLS = \"1\", MINI_START_DELAY = \"4\"";
    let second =
        TestServer::start_in(&config(slow), AppOptions::default(), data.path()).await.unwrap();
    let before = eventually(Duration::from_secs(5), || async {
        let tools = tools(&second).await;
        (names(&tools, "eager_").len() == 3 && names(&tools, "lazy_").len() == 1).then_some(tools)
    })
    .await
    .expect("the remembered tools are listed at once");
    let echo_2 = before.iter().find(|t| t.name == "eager_echo_2").unwrap();
    let source = echo_2.source.clone().unwrap();
    assert!(!source.available, "still connecting: {source:?}");
    assert!(source.status.contains("connecting"), "{source:?}");
    let search = second.app.search().clone();
    let searchable = eventually(Duration::from_secs(2), || async {
        let found = search.search("Echoes its text", 20, |_| true).await.ok()?;
        found.iter().any(|hit| hit.tool.spec.name == "eager_echo_2").then_some(())
    })
    .await;
    assert!(searchable.is_some(), "the remembered tools are searchable");
    assert!(processes_with(&tag).is_empty(), "the lazy server is not started to learn its tools");
    // A call made while the server starts waits for it, within its deadline.
    let answer = second.call("eager_echo", json!({"text": "waited"})).await.unwrap();
    assert_eq!(text(&answer), "waited");
    // The server's own listing replaces the remembered one.
    let after = eventually(Duration::from_secs(10), || async {
        let tools = tools(&second).await;
        (names(&tools, "eager_") == ["eager_echo", "eager_echo_1"]).then_some(tools)
    })
    .await
    .expect("eager_echo_2 is gone with the server's own listing");
    assert!(
        after.iter().filter(|t| t.name.starts_with("eager_")).all(|t| t
            .source
            .clone()
            .unwrap()
            .available)
    );
    // The lazy server starts for its first call.
    let answer = second.call("lazy_echo", json!({"text": "woken"})).await.unwrap();
    assert_eq!(text(&answer), "woken");
    assert!(!processes_with(&tag).is_empty());
    second.stop().await.unwrap();

    // The third run: the eager server cannot start. Its tools of the last run stay listed,
    // unavailable, and a call fails naming the server.
    let third =
        TestServer::start_in(&config("MINI_FAIL = \"1\""), AppOptions::default(), data.path())
            .await
            .unwrap();
    let down = eventually(Duration::from_secs(10), || async {
        let tools = tools(&third).await;
        let echo = tools.iter().find(|t| t.name == "eager_echo")?.source.clone()?;
        echo.status.contains("unavailable").then_some(tools)
    })
    .await
    .expect("the server that cannot start is listed as unavailable");
    assert_eq!(names(&down, "eager_"), ["eager_echo", "eager_echo_1"]);
    let refused = third.call("eager_echo", json!({"text": "x"})).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("eager"), "{refused:?}");
    third.stop().await.unwrap();
}

#[tokio::test]
async fn an_unprefixed_mcp_tool_that_collides_is_an_error_naming_both_sources() {
    let python = python();
    let mini = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/mini_server.py");
    let server = BinaryServer::with_config(
        &format!(
            "[[mcp.servers]]\nname = \"mini\"\ntransport = \"stdio\"\ncommand = \"{python}\"\nargs = [\"{}\"]\nprefix = \"none\"\n",
            mini.display()
        ),
        &[],
    )
    .await
    .unwrap();
    let logged = eventually(Duration::from_secs(20), || async {
        server.logs().lines().find(|l| l.contains("collides")).map(str::to_owned)
    })
    .await
    .expect("the collision is logged");
    assert!(logged.contains("ERROR") && logged.contains("echo"), "{logged}");
    assert!(
        logged.contains("local:builtin") && logged.contains("mini"),
        "names both sources: {logged}"
    );
    // The built-in echo keeps its name; nothing was silently replaced.
    let mut client = toolmesh::client::connect(&server.addr.to_string(), None).await.unwrap();
    let (tools, _) = toolmesh::client::list_all(&mut client).await.unwrap();
    let echo = tools.iter().find(|t| t.name == "echo").unwrap();
    assert_eq!(echo.source.as_ref().unwrap().name, "builtin");
}
