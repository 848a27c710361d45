//! The real `toolmesh` binary end to end: the CLI, signals, reloads, traces over OTLP,
//! reflection and health through grpcurl, and a Python grpcio client.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::{
    path::Path,
    process::Output,
    sync::{Arc, Mutex},
    time::Duration,
};

use nix::sys::signal::Signal;
use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::any_value,
    trace::v1::Span,
};
use serde_json::json;
use tonic::Code;
use toolmesh_e2e::{
    BinaryServer, PyHttpServer, eventually, py_server, python, serve_http, toolmesh_bench_bin,
    toolmesh_bin, write_script,
};
use toolmesh_proto::v1::{CallToolRequest, ListToolsRequest};

#[path = "auth_binary.rs"]
mod auth_binary;
#[path = "deploy.rs"]
mod deploy;
#[path = "remote.rs"]
mod remote;
#[path = "tls_binary.rs"]
mod tls_binary;

async fn run(args: &[&str]) -> Output {
    run_program(toolmesh_bin(), args).await
}

/// Runs `toolmesh-bench ARGS…`.
async fn bench(args: &[&str]) -> Output {
    run_program(toolmesh_bench_bin(), args).await
}

async fn run_program(program: std::path::PathBuf, args: &[&str]) -> Output {
    tokio::process::Command::new(program)
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .await
        .expect("run toolmesh")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

async fn tool_names(addr: &str) -> Vec<String> {
    let mut client = toolmesh::client::connect(addr, None).await.unwrap();
    let (tools, _) = toolmesh::client::list_all(&mut client).await.unwrap();
    tools.into_iter().map(|t| t.name).collect()
}

#[tokio::test]
async fn cli_lists_and_calls_the_embedded_default() {
    let server = BinaryServer::start(&[], &[]).await.unwrap();
    let addr = server.addr.to_string();

    let list = run(&["tools", "list", "--server", &addr]).await;
    assert!(list.status.success(), "{}", stderr(&list));
    let out = stdout(&list);
    for expected in
        ["think", "analyze", "echo", "reasoning", "searchTools", "callTool", "5 tools, 1 toolkits"]
    {
        assert!(out.contains(expected), "{expected} missing from:\n{out}");
    }

    // Into a pipe whose reader has gone (`toolmesh tools list | head -0`): it ends quietly.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let closed = std::process::Command::new(toolmesh_bin())
        .args(["tools", "list", "--server", &addr])
        .stdout(writer)
        .output()
        .unwrap();
    assert_eq!(closed.status.code(), Some(0), "{}", stderr(&closed));
    assert!(!stderr(&closed).contains("panicked"), "{}", stderr(&closed));

    let echo = run(&["call", "echo", r#"{"x": 1}"#, "--server", &addr]).await;
    assert!(echo.status.success(), "{}", stderr(&echo));
    let value: serde_json::Value = serde_json::from_str(&stdout(&echo)).unwrap();
    assert_eq!(value, json!({"x": 1}));

    let invalid = run(&["call", "think", "{}", "--server", &addr]).await;
    assert_eq!(invalid.status.code(), Some(2));
    assert!(
        stderr(&invalid).contains("InvalidArgument") && stderr(&invalid).contains("thought"),
        "{}",
        stderr(&invalid)
    );

    let missing = run(&["call", "nope", "--server", &addr]).await;
    assert_eq!(missing.status.code(), Some(2));
    assert!(stderr(&missing).contains("NotFound"), "{}", stderr(&missing));

    for args in
        [&["--help"][..], &["serve", "--help"], &["call", "--help"], &["tools", "list", "--help"]]
    {
        let help = run(args).await;
        assert!(help.status.success() && stdout(&help).contains("Usage"), "{args:?}");
    }
    let help = bench(&["--help"]).await;
    assert!(help.status.success() && stdout(&help).contains("--search"), "toolmesh-bench --help");
}

#[tokio::test]
async fn a_bad_config_exits_with_one_line_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[workers]\nsize = 0\n").unwrap();
    let output = run(&["serve", "--config", bad.to_str().unwrap()]).await;
    assert!(!output.status.success());
    let err = stderr(&output);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("bad.toml") && err.contains("workers.size"), "{err}");

    std::fs::write(&bad, "[[tools.command]]\nname = \"x\"\ndescription = \"d\"\ncommand = \"/bin/true\"\ntimeout = 5\n").unwrap();
    let output = run(&["config", "check", bad.to_str().unwrap()]).await;
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("tools.command[0]") && stderr(&output).contains("timeout"),
        "{}",
        stderr(&output)
    );

    let defaults = run(&["config", "defaults"]).await;
    assert!(stdout(&defaults).contains("[server]"));
    // Into a pipe whose reader has gone (`toolmesh config defaults | head -0`): it ends
    // quietly, without a panic.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let closed = std::process::Command::new(toolmesh_bin())
        .args(["config", "defaults"])
        .stdout(writer)
        .output()
        .unwrap();
    assert_eq!(closed.status.code(), Some(0), "{}", stderr(&closed));
    assert!(!stderr(&closed).contains("panicked"), "{}", stderr(&closed));
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/toolmesh.toml");
    let output = tokio::process::Command::new(toolmesh_bin())
        .args(["config", "check", example.to_str().unwrap()])
        .env("WEATHER_API_TOKEN", "token")
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "the example config is valid: {}", stderr(&output));
}

/// Every complete TOML example of the README and `docs/` passes `toolmesh config check`
/// as it is written (a worker's file as a worker reads it); a fragment, one that names
/// files or secrets a reader provides, says so in the paragraph before it.
#[tokio::test]
async fn every_complete_toml_example_in_the_docs_passes_config_check() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("README.md")];
    files.extend(
        std::fs::read_dir(root.join("docs"))
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|e| e == "md")),
    );
    let dir = tempfile::tempdir().unwrap();
    let example = dir.path().join("example.toml");
    let mut checked = 0;
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let mut rest = text.as_str();
        while let Some(start) = rest.find("```toml\n") {
            let paragraph = rest[..start].trim_end().rsplit("\n\n").next().unwrap_or_default();
            let body = &rest[start + "```toml\n".len()..];
            let end = body.find("```").expect("a closed block");
            let block = &body[..end];
            rest = &body[end + 3..];
            if paragraph.contains("(A fragment") {
                continue;
            }
            std::fs::write(&example, block).unwrap();
            let output = run(&["config", "check", example.to_str().unwrap()]).await;
            assert!(
                output.status.success(),
                "an example in {}:\n{block}\n{}",
                file.display(),
                stderr(&output)
            );
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} examples found");
}

/// Three mistakes that used to load and then fail quietly at run time: a condition that
/// reads a field the principal does not have (it hid every tool), a log filter that reads
/// as a target (it silenced every log), and a URL placeholder that names no parameter.
#[tokio::test]
async fn config_check_refuses_what_could_never_work_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("toolmesh.toml");
    let tool = "[[tools.http]]\nname = \"weather\"\ndescription = \"d\"\n\
                url = \"https://weather.invalid/v1?q={{city}}\"\n\
                [tools.http.parameters]\ntype = \"object\"\n\
                properties = { city = { type = \"string\" } }\n";
    let policy = "[policy]\ndefault = \"deny\"\n[[policy.rules]]\nname = \"admins\"\n\
                  effect = \"allow\"\nwhen = '\"admin\" in principal.roles'\n";
    for (config, key, says) in [
        (
            format!("{tool}{}", policy.replace("principal.roles", "principal.role")),
            "policy.rules[0].when",
            "`principal.role` is not a field",
        ),
        (format!("[telemetry]\nlog = \"inof\"\n{tool}"), "telemetry.log", "`inof`"),
        (tool.replace("{{city}}", "{{citty}}"), "tools.http[0].url", "{{citty}}"),
    ] {
        std::fs::write(&file, &config).unwrap();
        let output = run(&["config", "check", file.to_str().unwrap()]).await;
        assert!(!output.status.success(), "refused: {config}");
        let err = stderr(&output);
        assert!(err.contains(key) && err.contains(says), "{key}: {err}");
    }
    std::fs::write(&file, format!("{tool}{policy}")).unwrap();
    let output = run(&["config", "check", file.to_str().unwrap()]).await;
    assert!(output.status.success(), "{}", stderr(&output));
}

#[tokio::test]
async fn sigterm_lets_calls_in_flight_finish() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("started");
    let slow = write_script(
        dir.path(),
        "slow.sh",
        &format!("touch {}\nsleep 1\necho finished", marker.display()),
    );
    let config = dir.path().join("toolmesh.toml");
    std::fs::write(
        &config,
        format!("[[tools.command]]\nname = \"slow\"\ndescription = \"takes a second\"\ncommand = \"{}\"\n", slow.display()),
    )
    .unwrap();
    let mut server =
        BinaryServer::start(&["--config", config.to_str().unwrap()], &[]).await.unwrap();
    let addr = server.addr.to_string();

    let call = tokio::spawn({
        let addr = addr.clone();
        async move {
            let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
            client.call_tool(CallToolRequest { name: "slow".into(), ..Default::default() }).await
        }
    });
    eventually(Duration::from_secs(10), || async { marker.exists().then_some(()) })
        .await
        .expect("the call started");
    server.signal(Signal::SIGTERM);

    let response = call.await.unwrap().expect("the call in flight completes").into_inner();
    assert!(!response.is_error);
    assert_eq!(toolmesh::client::render_part(&response.content[0].part), "finished");
    let status =
        tokio::time::timeout(Duration::from_secs(10), server.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "exit status {status:?}; logs:\n{}", server.logs());
    assert!(server.logs().contains("SIGTERM received"));
    assert!(
        toolmesh::client::connect(&addr, None).await.is_err(),
        "no longer accepting connections"
    );
}

#[tokio::test]
async fn sighup_and_file_changes_reload_tool_definitions() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmesh.toml");
    let hello = write_script(dir.path(), "hello.sh", "echo hello");
    let base = "[server]\nreload_poll_ms = 100\n";
    std::fs::write(&config, base).unwrap();
    let server = BinaryServer::start(&["--config", config.to_str().unwrap()], &[]).await.unwrap();
    let addr = server.addr.to_string();
    assert!(!tool_names(&addr).await.contains(&"hello".to_owned()));

    let with_tool = format!(
        "{base}[[tools.command]]\nname = \"hello\"\ndescription = \"greets\"\ncommand = \"{}\"\n",
        hello.display()
    );
    std::fs::write(&config, &with_tool).unwrap();
    server.signal(Signal::SIGHUP);
    eventually(Duration::from_secs(10), || async {
        tool_names(&addr).await.contains(&"hello".to_owned()).then_some(())
    })
    .await
    .expect("the tool appears after the reload");
    let hello = run(&["call", "hello", "--server", &addr]).await;
    assert_eq!(stdout(&hello).trim(), "hello");

    // Without a signal: the file is watched.
    std::fs::write(&config, format!("{base}# the tool is gone\n")).unwrap();
    eventually(Duration::from_secs(10), || async {
        (!tool_names(&addr).await.contains(&"hello".to_owned())).then_some(())
    })
    .await
    .expect("the tool disappears after the file changed");

    // A broken file keeps the previous tools and says why.
    std::fs::write(&config, &with_tool).unwrap();
    eventually(Duration::from_secs(10), || async {
        tool_names(&addr).await.contains(&"hello".to_owned()).then_some(())
    })
    .await
    .expect("reloaded again");
    std::fs::write(&config, "[server\nbroken").unwrap();
    server.signal(Signal::SIGHUP);
    eventually(Duration::from_secs(10), || async {
        server.logs().contains("reload failed").then_some(())
    })
    .await
    .expect("the failed reload is logged");
    assert!(tool_names(&addr).await.contains(&"hello".to_owned()));
    assert!(tool_names(&addr).await.contains(&"echo".to_owned()));

    // Settings other than tool definitions need a restart, and the log says so.
    std::fs::write(&config, format!("{with_tool}[workers]\nsize = 3\n")).unwrap();
    server.signal(Signal::SIGHUP);
    eventually(Duration::from_secs(10), || async {
        server.logs().contains("take effect on restart").then_some(())
    })
    .await
    .expect("the pending restart is logged");
}

/// An OTLP/gRPC trace receiver that keeps every span it is sent.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.as_ref())
                .map(|v| format!("{:?}", v.value))
                .unwrap_or_default();
            for scope in resource.scope_spans {
                spans.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

impl Receiver {
    /// Starts a receiver on 127.0.0.1:0; returns it and its endpoint URL.
    async fn start() -> (Self, String) {
        let receiver = Receiver::default();
        let endpoint = serve_on_loopback(TraceServiceServer::new(receiver.clone())).await;
        (receiver, endpoint)
    }

    /// Stops `server` (shutdown flushes its exporter) and returns the spans received once
    /// one named `name` is among them.
    async fn spans_after_stop(&self, server: &mut BinaryServer, name: &str) -> Vec<(String, Span)> {
        server.signal(Signal::SIGTERM);
        tokio::time::timeout(Duration::from_secs(15), server.child.wait()).await.unwrap().unwrap();
        eventually(Duration::from_secs(10), || async {
            let spans = self.spans.lock().unwrap().clone();
            spans.iter().any(|(_, s)| s.name == name).then_some(spans)
        })
        .await
        .unwrap_or_else(|| panic!("a {name} span arrives at the receiver"))
    }
}

/// Serves one gRPC service on 127.0.0.1:0 for the rest of the test; returns its URL.
async fn serve_on_loopback<S>(service: S) -> String
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    endpoint
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| {
        match a.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.clone()),
            other => Some(format!("{other:?}")),
        }
    })
}

#[tokio::test]
async fn traces_reach_an_otlp_receiver_as_one_tree_under_the_callers_span() {
    let (receiver, otlp) = Receiver::start().await;
    let mut server = BinaryServer::start(
        &[],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()), ("OTEL_SERVICE_NAME", "toolmesh-e2e")],
    )
    .await
    .unwrap();

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_id = "00f067aa0ba902b7";
    let mut client = toolmesh::client::connect(&server.addr.to_string(), None).await.unwrap();
    let mut request = tonic::Request::new(CallToolRequest {
        name: "echo".into(),
        arguments_json: "{}".into(),
        call_id: "traced-1".into(),
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("traceparent", format!("00-{trace_id}-{parent_id}-01").parse().unwrap());
    client.call_tool(request).await.unwrap();
    let mut bad = tonic::Request::new(CallToolRequest {
        name: "think".into(),
        arguments_json: "{}".into(),
        ..Default::default()
    });
    bad.metadata_mut()
        .insert("traceparent", format!("00-{trace_id}-{parent_id}-01").parse().unwrap());
    assert_eq!(client.call_tool(bad).await.unwrap_err().code(), Code::InvalidArgument);
    client.list_tools(ListToolsRequest::default()).await.unwrap();

    let spans = receiver.spans_after_stop(&mut server, "toolmesh.worker.execute").await;

    let find = |name: &str, call_id: Option<&str>| {
        spans
            .iter()
            .map(|(_, s)| s)
            .find(|s| {
                s.name == name
                    && call_id
                        .is_none_or(|id| attr(s, "gen_ai.tool.call.id").as_deref() == Some(id))
            })
            .unwrap_or_else(|| {
                panic!(
                    "no span {name}; got {:?}",
                    spans.iter().map(|(_, s)| &s.name).collect::<Vec<_>>()
                )
            })
    };
    assert!(spans.iter().all(|(service, _)| service.contains("toolmesh-e2e")));

    let rpc = spans
        .iter()
        .map(|(_, s)| s)
        .find(|s| {
            s.name == "toolmesh.v1.ToolService/CallTool" && hex(&s.parent_span_id) == parent_id
        })
        .expect("the gRPC server span is a child of the caller's span");
    assert_eq!(hex(&rpc.trace_id), trace_id, "one trace from the caller into toolmesh");
    assert_eq!(attr(rpc, "rpc.system").as_deref(), Some("grpc"));
    assert_eq!(attr(rpc, "rpc.method").as_deref(), Some("CallTool"));

    let execute = find("execute_tool echo", Some("traced-1"));
    assert_eq!(execute.parent_span_id, rpc.span_id);
    assert_eq!(attr(execute, "gen_ai.operation.name").as_deref(), Some("execute_tool"));
    assert_eq!(attr(execute, "gen_ai.tool.name").as_deref(), Some("echo"));
    assert_eq!(attr(execute, "toolmesh.source.kind").as_deref(), Some("local"));
    assert_eq!(hex(&execute.trace_id), trace_id);

    let children: Vec<&Span> =
        spans.iter().map(|(_, s)| s).filter(|s| s.parent_span_id == execute.span_id).collect();
    let names: Vec<&str> = children.iter().map(|s| s.name.as_str()).collect();
    for expected in ["toolmesh.resolve", "toolmesh.validate", "toolmesh.dispatch"] {
        assert!(names.contains(&expected), "{expected} under execute_tool: {names:?}");
    }
    let dispatch = children.iter().find(|s| s.name == "toolmesh.dispatch").unwrap();
    let worker = find("toolmesh.worker.execute", Some("traced-1"));
    assert_eq!(worker.parent_span_id, dispatch.span_id, "the worker's span is under dispatch");

    let failed = find("execute_tool think", None);
    assert_eq!(attr(failed, "error.type").as_deref(), Some("invalid_arguments"));
    assert_eq!(hex(&failed.trace_id), trace_id);
}

#[tokio::test]
async fn call_tool_spans_link_to_the_search_that_returned_the_tool() {
    let (receiver, otlp) = Receiver::start().await;
    let metrics = MetricsReceiver::default();
    let otlp_metrics = serve_on_loopback(
        opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::MetricsServiceServer::new(
            metrics.clone(),
        ),
    )
    .await;
    let mut server = BinaryServer::start(
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp.as_str()),
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", otlp_metrics.as_str()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
        ],
    )
    .await
    .unwrap();
    let mut client = toolmesh::client::connect(&server.addr.to_string(), None).await.unwrap();
    let request = |name: &str, arguments: serde_json::Value| CallToolRequest {
        name: name.into(),
        arguments_json: arguments.to_string(),
        session_id: "traced-session".into(),
        ..Default::default()
    };
    let found = eventually(Duration::from_secs(10), || {
        let mut client = client.clone();
        let search =
            request("searchTools", serde_json::json!({"query": "return my arguments unchanged"}));
        async move {
            let response = client.call_tool(search).await.unwrap().into_inner();
            let result: serde_json::Value =
                serde_json::from_str(response.structured_json.as_deref()?).unwrap();
            let rank = result["tools"].as_array()?.iter().position(|t| t["name"] == "echo")? + 1;
            Some((rank, result["searchToken"].as_str()?.to_owned()))
        }
    })
    .await;
    let (rank, token) = found.expect("searchTools returns echo");
    let arguments = serde_json::json!({"name": "echo", "arguments": {}, "searchToken": token});
    client.call_tool(request("callTool", arguments)).await.unwrap();
    let unsearched = serde_json::json!({"name": "think", "arguments": {}});
    client.call_tool(request("callTool", unsearched)).await.unwrap_err();
    let think = eventually(Duration::from_secs(10), || {
        let mut client = client.clone();
        let search =
            request("searchTools", serde_json::json!({"query": "record a reasoning step"}));
        async move {
            let response = client.call_tool(search).await.unwrap().into_inner();
            let result: serde_json::Value =
                serde_json::from_str(response.structured_json.as_deref()?).unwrap();
            result["tools"].as_array()?.iter().any(|t| t["name"] == "think").then_some(())?;
            Some(result["searchToken"].as_str()?.to_owned())
        }
    })
    .await
    .expect("searchTools returns think");
    let bad = serde_json::json!({"name": "think", "arguments": {"title": 1}, "searchToken": think});
    client.call_tool(request("callTool", bad)).await.unwrap_err();

    // Calls are counted by whether the tool was in the search result.
    let counted = |in_result: &str| {
        metrics.points.lock().unwrap().iter().rev().find_map(|(name, attributes, value)| {
            let matches = name == "toolmesh.call_tool.calls"
                && attributes
                    .iter()
                    .any(|(k, v)| k == "toolmesh.search.in_result" && v == in_result);
            matches.then_some(*value)
        })
    };
    let (yes, no) = ("Some(BoolValue(true))", "Some(BoolValue(false))");
    let settled = eventually(Duration::from_secs(20), || async {
        (counted(yes) == Some(2.0) && counted(no) == Some(1.0)).then_some(())
    })
    .await;
    assert!(settled.is_some(), "in the result {:?}, not {:?}", counted(yes), counted(no));

    let spans = receiver.spans_after_stop(&mut server, "toolmesh.call_tool").await;
    let spans: Vec<&Span> = spans.iter().map(|(_, s)| s).collect();
    let call = spans.iter().find(|s| s.name == "toolmesh.call_tool").unwrap();
    let link = call.links.first().expect("the callTool span links to a search");
    let search = spans
        .iter()
        .find(|s| s.name == "toolmesh.search_tools" && s.span_id == link.span_id)
        .expect("the linked span is a searchTools span");
    assert_eq!(link.trace_id, search.trace_id);
    assert_eq!(
        attr(search, "toolmesh.search.query").as_deref(),
        Some("return my arguments unchanged")
    );
    assert_eq!(attr(call, "toolmesh.search.in_result").as_deref(), Some("BoolValue(true)"));
    assert_eq!(attr(call, "toolmesh.search.rank"), Some(format!("IntValue({rank})")));
    let link_rank = link.attributes.iter().find(|a| a.key == "toolmesh.search.rank");
    assert_eq!(
        link_rank.and_then(|a| a.value.as_ref()?.value.clone()),
        Some(any_value::Value::IntValue(rank as i64))
    );
    // Each refusal keeps its own error type: the called tool's, or callTool's.
    let mut kinds: Vec<String> = spans
        .iter()
        .filter(|s| s.name == "execute_tool callTool")
        .filter_map(|s| attr(s, "error.type"))
        .collect();
    kinds.sort();
    assert_eq!(kinds, ["invalid_arguments", "search_required"]);
    // The called tool runs under the callTool span.
    let execute = spans.iter().find(|s| s.name == "execute_tool echo").unwrap();
    assert_eq!(execute.parent_span_id, call.span_id);
}

fn grpcurl() -> String {
    std::env::var("TOOLMESH_TEST_GRPCURL").unwrap_or_else(|_| "grpcurl".into())
}

#[tokio::test]
async fn grpcurl_finds_the_api_by_reflection_and_checks_health() {
    let server = BinaryServer::start(&[], &[]).await.unwrap();
    let addr = server.addr.to_string();
    let grpcurl = |args: Vec<String>| async move {
        tokio::process::Command::new(grpcurl())
            .args(&args)
            .output()
            .await
            .expect("grpcurl is installed (tests/setup installs it from PyPI)")
    };

    let list = grpcurl(vec!["-plaintext".into(), addr.clone(), "list".into()]).await;
    assert!(list.status.success(), "{}", stderr(&list));
    for service in ["toolmesh.v1.ToolService", "grpc.health.v1.Health"] {
        assert!(stdout(&list).contains(service), "{service} in:\n{}", stdout(&list));
    }

    let describe = grpcurl(vec![
        "-plaintext".into(),
        addr.clone(),
        "describe".into(),
        "toolmesh.v1.CallToolRequest".into(),
    ])
    .await;
    assert!(stdout(&describe).contains("arguments_json"), "{}", stdout(&describe));

    let call = grpcurl(vec![
        "-plaintext".into(),
        "-d".into(),
        r#"{"name": "echo", "arguments_json": "{\"via\": \"grpcurl\"}"}"#.into(),
        addr.clone(),
        "toolmesh.v1.ToolService/CallTool".into(),
    ])
    .await;
    assert!(call.status.success(), "{}", stderr(&call));
    assert!(stdout(&call).contains("grpcurl"), "{}", stdout(&call));

    for service in ["", "toolmesh.v1.ToolService"] {
        let health = grpcurl(vec![
            "-plaintext".into(),
            "-d".into(),
            format!(r#"{{"service": "{service}"}}"#),
            addr.clone(),
            "grpc.health.v1.Health/Check".into(),
        ])
        .await;
        assert!(
            stdout(&health).contains("SERVING"),
            "{service:?}: {} {}",
            stdout(&health),
            stderr(&health)
        );
    }
}

#[tokio::test]
async fn a_python_grpcio_client_lists_and_calls_tools() {
    let server = BinaryServer::start(&[], &[]).await.unwrap();
    let output = toolmesh_e2e::python_client(&server.addr.to_string(), &[]).await;
    assert!(
        output.status.success(),
        "the Python client failed (tests/setup installs grpcio and grpcio-tools):\n{}\n{}",
        stdout(&output),
        stderr(&output)
    );
    assert!(stdout(&output).contains("calls and errors as expected"));
}

#[tokio::test]
async fn bench_measures_toolmesh_and_the_bare_echo_baseline() {
    // This checks that the load generator works and reports; it asserts no speed.
    let output = bench(&[
        "--concurrency",
        "4",
        "--connections",
        "2",
        "--duration",
        "0.4",
        "--warmup",
        "0.1",
        "--rounds",
        "3",
    ])
    .await;
    assert!(output.status.success(), "{}", stderr(&output));
    let report = stdout(&output);
    let rows: Vec<&str> = report
        .lines()
        .filter(|l| {
            l.starts_with("bare tonic echo ")
                || (l.starts_with("toolmesh ") && !l.starts_with("toolmesh-bench"))
        })
        .collect();
    assert_eq!(rows.len(), 4, "closed and open loop rows for both servers:\n{report}");
    for row in rows {
        let columns: Vec<&str> = row.split_whitespace().collect();
        let errors: u64 = columns.last().unwrap().parse().unwrap();
        let throughput: f64 = columns[columns.len() - 5].parse().unwrap();
        assert_eq!(errors, 0, "{row}");
        assert!(throughput > 0.0, "{row}");
    }
    assert!(report.contains("throughput ratio") && report.contains("p99 added"), "{report}");
    assert!(report.contains("3 alternating rounds"), "{report}");

    // The same figures as JSON, for scripts.
    let args = ["--concurrency", "2", "--duration", "0.2", "--warmup", "0.1", "--rounds", "1"];
    let output = bench(&[&args[..], &["--no-half-load", "--json"]].concat()).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert!(report["toolmesh"]["throughput"].as_f64().unwrap() > 0.0, "{report}");
    assert_eq!(report["toolmesh"]["errors"], 0, "{report}");
    assert!(report["echo"]["p99_ms"].is_number(), "{report}");
    assert!(report["toolmesh_half"].is_null(), "{report}");
}

/// Credentials never show: not in the debug log, not in the exported spans, not in the
/// audit log, not in ListTools — neither an accepted API key nor a refused one, nor the
/// upstream secret an HTTP tool and an MCP server over streamable HTTP are sent for alice
/// (nor alice's key, which another HTTP tool passes on).
#[tokio::test]
async fn credentials_appear_in_no_log_span_audit_line_or_listing() {
    let (receiver, otlp) = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let key = toolmesh_identity::new_key();
    let unknown = toolmesh_identity::new_key();
    let upstream_secret = "upstream-secret-of-alice-5f1e2d3c4b5a";
    let secret_file = dir.path().join("alice-svc");
    std::fs::write(&secret_file, upstream_secret).unwrap();
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let log = received.clone();
    let upstream = toolmesh_e2e::serve_http(axum::Router::new().route(
        "/svc",
        axum::routing::get(move |headers: axum::http::HeaderMap| {
            let log = log.clone();
            async move {
                for value in headers.get_all("authorization") {
                    log.lock().unwrap().push(value.to_str().unwrap().to_owned());
                }
                "ok"
            }
        }),
    ))
    .await;
    let mcp = PyHttpServer::start().await;
    let toml = format!(
        "[[auth.api_keys]]\nprincipal = \"alice\"\nsha256 = \"{}\"\n\n[policy.audit]\nto = \"{}\"\n\n\
         [[mcp.servers]]\nname = \"py\"\ntransport = \"streamable-http\"\nurl = \"{}\"\n\
         credentials = [\"svc\"]\n\
         [credentials.svc]\nprincipals.alice = {{ file = {:?} }}\n\
         [credentials.caller]\npass_caller_token = true\n\
         [[tools.http]]\nname = \"svc\"\ndescription = \"a service\"\nurl = \"http://{upstream}/svc\"\n\
         allow_private_network = true\ncredentials = [\"svc\"]\n\
         [[tools.http]]\nname = \"svc_as_caller\"\ndescription = \"a service\"\n\
         url = \"http://{upstream}/svc\"\nallow_private_network = true\ncredentials = [\"caller\"]\n",
        toolmesh_identity::key_digest(&key),
        audit.display(),
        mcp.url(),
        secret_file.display().to_string(),
    );
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()), ("RUST_LOG", "debug")];
    let mut server = BinaryServer::with_config(&toml, &env).await.unwrap();
    let addr = server.addr.to_string();
    let mut client = toolmesh::client::connect(&addr, Some(&key)).await.unwrap();
    let listed = client.list_tools(ListToolsRequest::default()).await.unwrap().into_inner();
    let request = CallToolRequest {
        name: "echo".into(),
        arguments_json: r#"{"message":"hi"}"#.into(),
        ..Default::default()
    };
    assert!(!client.call_tool(request.clone()).await.unwrap().into_inner().is_error);
    for tool in ["svc", "svc_as_caller"] {
        let call = CallToolRequest { name: tool.into(), ..request.clone() };
        assert!(!client.call_tool(call).await.unwrap().into_inner().is_error, "{tool}");
    }
    assert_eq!(
        *received.lock().unwrap(),
        [format!("Bearer {upstream_secret}"), format!("Bearer {key}")],
        "the upstream got them"
    );
    let authorization = eventually(Duration::from_secs(30), || {
        let (mut client, request) = (client.clone(), request.clone());
        async move {
            let call = CallToolRequest {
                name: "py_http_authorization".into(),
                arguments_json: "{}".into(),
                ..request
            };
            client.call_tool(call).await.ok().map(|r| toolmesh_e2e::text(&r.into_inner()))
        }
    })
    .await
    .expect("the MCP server answers");
    let expected: String =
        <sha2::Sha256 as sha2::Digest>::digest(format!("Bearer {upstream_secret}"))
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
    assert_eq!(authorization, expected, "the MCP server got alice's secret");
    let mut refused = toolmesh::client::connect(&addr, Some(&unknown)).await.unwrap();
    let status = refused.call_tool(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(!status.message().contains(&unknown), "{}", status.message());

    let spans = receiver.spans_after_stop(&mut server, "execute_tool echo").await;
    let logs = server.logs();
    assert!(logs.contains("DEBUG"), "the log is at debug level: {logs}");
    let audit = std::fs::read_to_string(&audit).unwrap();
    assert!(audit.contains("\"principal\":\"alice\""), "{audit}");
    let spans = format!("{spans:?}");
    assert!(spans.contains("alice"), "the principal is on the spans");
    for secret in [key.as_str(), unknown.as_str(), upstream_secret] {
        // The key, and any long piece of it.
        let piece = &secret[secret.len() - 16..];
        assert!(!logs.contains(piece), "a credential in the log:\n{logs}");
        assert!(!spans.contains(piece), "a credential in a span");
        assert!(!audit.contains(piece), "a credential in the audit log");
        assert!(!format!("{listed:?}").contains(piece), "a credential in ListTools");
    }
}

/// A command tool that calls itself through `toolmesh call`: the depth its caller tells it
/// (TOOLMESH_CALL_DEPTH) travels with each call, until the server refuses the one past
/// `server.max_call_depth` (3 by default); the refusal comes back up the chain.
#[tokio::test]
async fn a_tool_calling_itself_is_stopped_at_the_maximum_depth() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let address = dir.path().join("address");
    let script = format!(
        "echo \"$TOOLMESH_CALL_DEPTH $TOOLMESH_PARENT_CALL_ID\" >> {ledger}; \
         out=$({toolmesh} call recurse --server \"$(cat {address})\" 2>&1) \
         || {{ echo \"$out\" >&2; exit 1; }}; echo \"$out\"",
        ledger = ledger.display(),
        address = address.display(),
        toolmesh = toolmesh_bin().display(),
    );
    let toml = format!(
        "[[tools.command]]\nname = \"recurse\"\ndescription = \"calls itself\"\n\
         command = \"/bin/sh\"\nargs = [\"-c\", {script:?}]\ntimeout_ms = 60000\n"
    );
    let server = BinaryServer::with_config(&toml, &[]).await.unwrap();
    std::fs::write(&address, server.addr.to_string()).unwrap();

    let output = run(&["call", "recurse", "--server", &server.addr.to_string()]).await;
    let out = format!("{}{}", stdout(&output), stderr(&output));
    assert_eq!(output.status.code(), Some(1), "the tool reports the refusal as its error: {out}");
    assert!(out.contains("nested 4 deep"), "{out}");
    assert!(out.contains("server.max_call_depth"), "{out}");
    // The tool ran at depths 0 to 3, each told the depth of the calls it makes and its own
    // call id; the call at depth 4 never ran.
    let runs: Vec<(String, String)> = std::fs::read_to_string(&ledger)
        .unwrap()
        .lines()
        .map(|l| {
            let (depth, parent) = l.split_once(' ').unwrap();
            (depth.to_owned(), parent.to_owned())
        })
        .collect();
    let depths: Vec<&str> = runs.iter().map(|(d, _)| d.as_str()).collect();
    assert_eq!(depths, ["1", "2", "3", "4"]);
    assert!(runs.iter().all(|(_, parent)| parent.len() == 36), "{runs:?}");
    let mut parents: Vec<&str> = runs.iter().map(|(_, p)| p.as_str()).collect();
    parents.dedup();
    assert_eq!(parents.len(), 4, "each run has a call id of its own: {runs:?}");
}

#[tokio::test]
async fn bench_policy_measures_calls_with_and_without_a_policy() {
    // This checks that the policy benchmark runs its fifty rules and reports; no speed.
    let args = ["--policy", "--concurrency", "4", "--duration", "0.4", "--warmup", "0.1"];
    let output = bench(&[&args[..], &["--rounds", "2", "--json"]].concat()).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(report["rules"], 50, "{report}");
    for sample in ["open", "governed", "open_half", "governed_half"] {
        assert_eq!(report[sample]["errors"], 0, "{sample}: {report}");
        assert!(report[sample]["throughput"].as_f64().unwrap() > 0.0, "{sample}: {report}");
    }
    assert!(report["throughput_ratio"].as_f64().unwrap() > 0.0, "{report}");
    assert!(report["p99_added_ms"].is_number(), "{report}");
}

#[tokio::test]
async fn mcp_calls_carry_the_trace_into_the_server() {
    let (receiver, otlp) = Receiver::start().await;
    let mut server = BinaryServer::with_config(
        &format!(
            "[[mcp.servers]]\nname = \"py\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"{}\"]\n",
            python(),
            py_server()
        ),
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str())],
    )
    .await
    .unwrap();
    let addr = server.addr.to_string();
    eventually(Duration::from_secs(30), || async {
        tool_names(&addr).await.contains(&"py_trace".to_owned()).then_some(())
    })
    .await
    .expect("the MCP server's tools are published");

    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
    let mut request =
        tonic::Request::new(CallToolRequest { name: "py_trace".into(), ..Default::default() });
    request
        .metadata_mut()
        .insert("traceparent", format!("00-{trace_id}-b7ad6b7169203331-01").parse().unwrap());
    let response = client.call_tool(request).await.unwrap().into_inner();
    let received = toolmesh::client::render_part(&response.content[0].part);
    let parts: Vec<&str> = received.split('-').collect();
    assert_eq!(parts.len(), 4, "a traceparent reached the server: {received:?}");
    assert_eq!(parts[1], trace_id, "the MCP request belongs to the caller's trace");

    let spans = receiver.spans_after_stop(&mut server, "tools/call trace").await;
    let client_span = spans.iter().map(|(_, s)| s).find(|s| s.name == "tools/call trace").unwrap();
    assert_eq!(
        hex(&client_span.span_id),
        parts[2],
        "the server's parent is toolmesh's MCP client span"
    );
    assert_eq!(attr(client_span, "mcp.method.name").as_deref(), Some("tools/call"));
    assert_eq!(attr(client_span, "network.transport").as_deref(), Some("pipe"));
    assert!(attr(client_span, "jsonrpc.request.id").is_some());
    let execute = spans.iter().map(|(_, s)| s).find(|s| s.name == "execute_tool py_trace").unwrap();
    let dispatch = spans
        .iter()
        .map(|(_, s)| s)
        .find(|s| s.name == "toolmesh.dispatch" && s.parent_span_id == execute.span_id)
        .unwrap();
    assert_eq!(client_span.parent_span_id, dispatch.span_id);
}

#[tokio::test]
async fn bench_mcp_compares_toolmesh_with_a_direct_mcp_client() {
    // This checks that the MCP load generator works and reports; it asserts no speed.
    let output = bench(&[
        "--mcp",
        "--concurrency",
        "2",
        "--duration",
        "0.6",
        "--warmup",
        "0.1",
        "--rounds",
        "2",
    ])
    .await;
    assert!(output.status.success(), "{}", stderr(&output));
    let report = stdout(&output);
    for row in ["direct MCP client", "through toolmesh"] {
        let line = report
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("{row} in:\n{report}"));
        let columns: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(columns.last(), Some(&"0"), "no errors: {line}");
        assert!(columns[columns.len() - 5].parse::<f64>().unwrap() > 0.0, "{line}");
    }
    assert!(report.contains("p50 added") && report.contains("proxied calls/s/core"), "{report}");
}

#[tokio::test]
async fn streamable_http_mcp_calls_carry_the_trace_in_http_headers_too() {
    let (_receiver, otlp) = Receiver::start().await;
    let mut upstream = PyHttpServer::start().await;
    let port = upstream.port;

    let server = BinaryServer::with_config(
        &format!("[[mcp.servers]]\nname = \"web\"\ntransport = \"streamable-http\"\nurl = \"http://127.0.0.1:{port}/mcp\"\n"),
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str())],
    )
    .await
    .unwrap();
    let addr = server.addr.to_string();
    eventually(Duration::from_secs(30), || async {
        tool_names(&addr).await.contains(&"web_http_trace".to_owned()).then_some(())
    })
    .await
    .expect("the server's tools are published");

    let trace_id = "5bf92f3577b34da6a3ce929d0e0e4736";
    let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
    for tool in ["web_http_trace", "web_trace"] {
        let mut request =
            tonic::Request::new(CallToolRequest { name: tool.into(), ..Default::default() });
        request
            .metadata_mut()
            .insert("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01").parse().unwrap());
        let response = client.call_tool(request).await.unwrap().into_inner();
        let received = toolmesh::client::render_part(&response.content[0].part);
        assert_eq!(received.split('-').nth(1), Some(trace_id), "{tool}: {received:?}");
    }
    upstream.child.kill().await.unwrap();
}

/// One received data point: metric name, attributes, value.
type DataPoint = (String, Vec<(String, String)>, f64);

/// An OTLP/gRPC metrics receiver that keeps every data point.
#[derive(Clone, Default)]
struct MetricsReceiver {
    points: Arc<Mutex<Vec<DataPoint>>>,
}

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::MetricsService
    for MetricsReceiver
{
    async fn export(
        &self,
        request: tonic::Request<
            opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest,
        >,
    ) -> Result<
        tonic::Response<
            opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse,
        >,
        tonic::Status,
    > {
        use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point::Value};
        let mut points = self.points.lock().unwrap();
        for resource in request.into_inner().resource_metrics {
            for scope in resource.scope_metrics {
                for metric in scope.metrics {
                    let attributes_of =
                        |attributes: &[opentelemetry_proto::tonic::common::v1::KeyValue]| {
                            attributes
                                .iter()
                                .map(|a| {
                                    let value =
                                        match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                                            Some(any_value::Value::StringValue(s)) => s.clone(),
                                            other => format!("{other:?}"),
                                        };
                                    (a.key.clone(), value)
                                })
                                .collect::<Vec<_>>()
                        };
                    let data_points = match metric.data {
                        Some(Data::Gauge(g)) => g.data_points,
                        Some(Data::Sum(s)) => s.data_points,
                        // A histogram is recorded by its count.
                        Some(Data::Histogram(h)) => {
                            for point in h.data_points {
                                let attributes = attributes_of(&point.attributes);
                                points.push((metric.name.clone(), attributes, point.count as f64));
                            }
                            continue;
                        }
                        _ => continue,
                    };
                    for point in data_points {
                        let attributes = attributes_of(&point.attributes);
                        let value = match point.value {
                            Some(Value::AsInt(i)) => i as f64,
                            Some(Value::AsDouble(d)) => d,
                            None => continue,
                        };
                        points.push((metric.name.clone(), attributes, value));
                    }
                }
            }
        }
        Ok(tonic::Response::new(Default::default()))
    }
}

#[tokio::test]
async fn mcp_server_health_is_exported_as_metrics() {
    let receiver = MetricsReceiver::default();
    let otlp = serve_on_loopback(
        opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::MetricsServiceServer::new(
            receiver.clone(),
        ),
    )
    .await;
    let python = python();
    let mini = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/mini_server.py");
    let _server = BinaryServer::with_config(
        &format!(
            "[[mcp.servers]]\nname = \"hang\"\ntransport = \"stdio\"\ncommand = \"sleep\"\nargs = [\"600\"]\ntimeout_ms = 300\n\n[[mcp.servers]]\nname = \"mini\"\ntransport = \"stdio\"\ncommand = \"{python}\"\nargs = [\"{}\"]\n",
            mini.display()
        ),
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()), ("OTEL_METRIC_EXPORT_INTERVAL", "200")],
    )
    .await
    .unwrap();

    let value = |metric: &str, server: &str| {
        // The generic gauge names its source by kind and name, the MCP counter by server.
        let names = |attributes: &[(String, String)]| {
            attributes.iter().any(|(k, v)| k == "mcp.server" && v == server)
                || (attributes.iter().any(|(k, v)| k == "toolmesh.source.kind" && v == "mcp")
                    && attributes.iter().any(|(k, v)| k == "toolmesh.source.name" && v == server))
        };
        receiver
            .points
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(name, attributes, _)| name == metric && names(attributes))
            .map(|(_, _, value)| *value)
    };
    let settled = eventually(Duration::from_secs(20), || async {
        let ready = value("toolmesh.source.up", "mini") == Some(1.0)
            && value("toolmesh.source.up", "hang") == Some(0.0)
            && value("toolmesh.mcp.connection.failures", "hang").is_some_and(|n| n >= 1.0);
        ready.then_some(())
    })
    .await;
    assert!(
        settled.is_some(),
        "up: mini {:?}, hang {:?}; failures: hang {:?}",
        value("toolmesh.source.up", "mini"),
        value("toolmesh.source.up", "hang"),
        value("toolmesh.mcp.connection.failures", "hang")
    );
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

/// A small benchmark in the format of shared/bench/toolsearch: four tools, two queries.
fn small_tool_search_benchmark() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let tools = [
        ("weather_current", "Current weather conditions for a city"),
        ("stock_quote", "Latest stock price quote for a ticker symbol"),
        ("translate_text", "Translate text between languages"),
        ("send_email", "Send an email message to a recipient"),
    ];
    let lines: Vec<String> = tools
        .iter()
        .map(|(n, d)| {
            json!({"name": n, "description": d, "input_schema": {"type": "object"}}).to_string()
        })
        .collect();
    std::fs::write(dir.path().join("tools.jsonl"), lines.join("\n")).unwrap();
    let queries = [
        json!({"query": "what is the weather in Paris", "relevant": ["weather_current"]}),
        json!({"query": "translate this text into French", "relevant": ["translate_text"]}),
    ];
    let lines: Vec<String> = queries.iter().map(ToString::to_string).collect();
    std::fs::write(dir.path().join("queries-dev.jsonl"), lines.join("\n")).unwrap();
    dir
}

#[tokio::test]
async fn bench_search_measures_a_tool_search_benchmark() {
    // This checks that the harness loads tools through MCP, scores rankings and
    // re-indexes, not how fast.
    let dir = small_tool_search_benchmark();
    let output = bench(&["--search", dir.path().to_str().unwrap(), "--fresh"]).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let report = stdout(&output);
    assert!(report.contains("2 queries over the whole pool of 4 tools"), "{report}");
    assert!(report.contains("Recall@1   1.000") && report.contains("NDCG@10    1.000"), "{report}");
    assert!(report.contains("re-index after one tool changed"), "{report}");
}

#[tokio::test]
async fn bench_embed_measures_the_model_alone() {
    let dir = small_tool_search_benchmark();
    let output = bench(&["--embed", dir.path().to_str().unwrap(), "--json"]).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert!(report["model"].as_str().unwrap().starts_with("minilm-"), "{report}");
    assert_eq!(report["queries"], 2, "{report}");
    assert_eq!(report["batch_texts"], 4, "{report}");
    // "what is the weather in Paris" is 6 words, 8 tokens with [CLS] and [SEP].
    let tokens = report["query_tokens_mean"].as_f64().unwrap();
    assert!((7.0..=12.0).contains(&tokens), "{report}");
    let (p50, p99) =
        (report["query_p50_ms"].as_f64().unwrap(), report["query_p99_ms"].as_f64().unwrap());
    assert!(p50 > 0.0 && p99 >= p50, "{report}");
    assert!(report["batch_texts_per_s"].as_f64().unwrap() > 0.0, "{report}");

    // Without queries there is nothing to measure, and the bench says so.
    std::fs::write(dir.path().join("queries-dev.jsonl"), "").unwrap();
    let output = bench(&["--embed", dir.path().to_str().unwrap()]).await;
    assert!(!output.status.success());
    assert!(stderr(&output).contains("no queries in"), "{}", stderr(&output));
}

#[tokio::test]
async fn tools_list_shows_the_upstream_name_of_renamed_tools() {
    let server = BinaryServer::with_config(
        &format!(
            "[[mcp.servers]]\nname = \"py\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"{}\"]\n",
            python(),
            py_server()
        ),
        &[],
    )
    .await
    .unwrap();
    let addr = server.addr.to_string();
    eventually(Duration::from_secs(30), || async {
        tool_names(&addr).await.iter().any(|n| n == "py_add").then_some(())
    })
    .await
    .expect("the Python server's tools are published");

    let list = run(&["tools", "list", "--server", &addr]).await;
    assert!(list.status.success(), "{}", stderr(&list));
    let out = stdout(&list);
    assert!(out.lines().next().unwrap().contains("UPSTREAM"), "{out}");
    let add = out.lines().find(|l| l.starts_with("py_add ")).expect("py_add is listed");
    assert!(add.split_whitespace().any(|w| w == "add"), "{add}");
    let long = "summarise_the_quarterly_revenue_report_for_every_region_and_product_line";
    assert!(out.lines().any(|l| l.starts_with("py_summarise") && l.contains(long)), "{out}");

    let json = run(&["tools", "list", "--server", &addr, "--json"]).await;
    let listed: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    let add = listed["tools"].as_array().unwrap().iter().find(|t| t["name"] == "py_add").unwrap();
    assert_eq!(add["upstream_name"], "add");
    let echo = listed["tools"].as_array().unwrap().iter().find(|t| t["name"] == "echo").unwrap();
    assert!(echo["upstream_name"].is_null(), "a local tool is not renamed");
}

/// User plus system CPU time of process `pid` so far.
fn cpu_time(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat; here, after the name, 12 and 13.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// 1,100 connections that never send the HTTP/2 preface, from five addresses, against a
/// toolmesh allowed 1,024 descriptors, on the shipped defaults: callers still get through at once, the accept
/// loop does not spin, the log says so once, and the idle sockets are closed after the
/// handshake timeout.
#[tokio::test]
async fn idle_connections_cannot_lock_out_callers() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    use tokio::io::AsyncReadExt;
    // This test holds 1,100 sockets of its own.
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if soft < 4096 {
        setrlimit(Resource::RLIMIT_NOFILE, hard.min(8192).max(soft), hard).unwrap();
    }
    let server = BinaryServer::start_under(&["prlimit", "--nofile=1024:1024", "--"], &[], &[])
        .await
        .unwrap();
    // From five addresses, each under its quarter of the connections (224 of 896).
    let mut idle = Vec::new();
    for i in 0..1100 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("127.0.0.{}:0", 2 + i % 5).parse().unwrap()).unwrap();
        idle.push(socket.connect(server.addr).await.unwrap());
    }

    let before = cpu_time(server.pid());
    let started = std::time::Instant::now();
    let mut client = toolmesh::client::connect(&server.addr.to_string(), None).await.unwrap();
    let mut request = tonic::Request::new(CallToolRequest {
        name: "echo".into(),
        arguments_json: json!({"through": true}).to_string(),
        ..Default::default()
    });
    request.set_timeout(Duration::from_secs(5));
    let answer = client.call_tool(request).await.expect("a caller gets through");
    assert!(answer.into_inner().structured_json.unwrap().contains("through"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let busy = cpu_time(server.pid()) - before;
    let elapsed = started.elapsed();
    assert!(busy < elapsed / 4, "the server used {busy:?} of CPU in {elapsed:?} while idle");
    let logs = server.logs();
    assert_eq!(logs.matches("connection limit reached").count(), 1, "{logs}");
    assert!(logs.contains("max_connections=896"), "1,024 descriptors less 128: {logs}");

    // Every idle socket is closed by the server, at the latest after the 10 s handshake
    // timeout.
    let closed = idle.iter_mut().map(|socket| async move {
        let mut byte = [0u8; 1];
        matches!(socket.read(&mut byte).await, Ok(0) | Err(_))
    });
    let all = tokio::time::timeout(Duration::from_secs(20), futures::future::join_all(closed))
        .await
        .expect("the server closed the idle sockets");
    assert!(all.into_iter().all(|closed| closed));
    // And it still serves.
    client.call_tool(CallToolRequest { name: "echo".into(), ..Default::default() }).await.unwrap();
}

/// Calls to an MCP server that went down are refused with UNAVAILABLE and counted in the
/// call metric by error type, but not logged as errors: the log says once that the server
/// went down, not once per call.
#[tokio::test]
async fn calls_to_a_down_mcp_server_are_counted_not_logged_as_errors() {
    let metrics = MetricsReceiver::default();
    let otlp = serve_on_loopback(
        opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::MetricsServiceServer::new(
            metrics.clone(),
        ),
    )
    .await;
    let mut upstream = PyHttpServer::start().await;
    let port = upstream.port;
    let server = BinaryServer::with_config(
        &format!("[[mcp.servers]]\nname = \"web\"\ntransport = \"streamable-http\"\nurl = \"http://127.0.0.1:{port}/mcp\"\n"),
        &[
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", otlp.as_str()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
        ],
    )
    .await
    .unwrap();
    let addr = server.addr.to_string();
    let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
    let add = || CallToolRequest {
        name: "web_add".into(),
        arguments_json: json!({"a": 1, "b": 2}).to_string(),
        ..Default::default()
    };
    eventually(Duration::from_secs(30), || {
        let mut client = client.clone();
        async move { client.call_tool(add()).await.ok() }
    })
    .await
    .expect("the server's tools are published");

    upstream.child.kill().await.unwrap();
    eventually(Duration::from_secs(30), || {
        let mut client = client.clone();
        async move {
            let status = client.call_tool(add()).await.err()?;
            (status.code() == Code::Unavailable).then_some(())
        }
    })
    .await
    .expect("calls fail with UNAVAILABLE once the server is down");
    for _ in 0..500 {
        let status = client.call_tool(add()).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    }

    let unavailable = || {
        metrics.points.lock().unwrap().iter().rev().find_map(|(name, attributes, value)| {
            let matches = name == "toolmesh.call.duration"
                && attributes.iter().any(|(k, v)| k == "error.type" && v == "unavailable")
                && attributes.iter().any(|(k, v)| k == "toolmesh.source.name" && v == "web");
            matches.then_some(*value)
        })
    };
    let counted =
        eventually(Duration::from_secs(20), || async { unavailable().filter(|n| *n >= 500.0) })
            .await;
    assert!(counted.is_some(), "the refusals are counted: {:?}", unavailable());
    let logs = server.logs();
    let errors: Vec<&str> = logs.lines().filter(|l| l.contains(" ERROR ")).collect();
    assert!(
        errors.is_empty(),
        "{} ERROR lines: {:?}",
        errors.len(),
        &errors[..errors.len().min(3)]
    );
    assert!(!logs.contains("call failed"), "{logs}");
    let warnings = logs.lines().filter(|l| l.contains(" WARN ")).count();
    assert!(warnings <= 4, "the change of state is logged, not each call:\n{logs}");
    assert!(logs.contains("mcp server disconnected"), "{logs}");
}

/// `proxy.py` on a free port (installed by tests/setup), logging each request it carries.
struct HttpProxy {
    child: tokio::process::Child,
    _dir: tempfile::TempDir,
    url: String,
    log: std::path::PathBuf,
}

impl HttpProxy {
    async fn start() -> Self {
        let python = python();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("access.log");
        let child = tokio::process::Command::new(python)
            .args(["-m", "proxy", "--hostname", "127.0.0.1", "--port", &port.to_string()])
            .args(["--num-workers", "1", "--num-acceptors", "1", "--log-file"])
            .arg(&log)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            // proxy.py forks its workers: the whole group goes on drop.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("proxy.py is installed (tests/setup)");
        eventually(Duration::from_secs(30), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()
        })
        .await
        .expect("the proxy listens");
        HttpProxy { child, _dir: dir, url: format!("http://127.0.0.1:{port}"), log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for HttpProxy {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ =
                nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

/// With `HTTP_PROXY` and friends set, an HTTP tool still goes direct and its guard still
/// refuses loopback; a proxy named in the configuration is used, and the guard checks the
/// destination through it too.
#[tokio::test]
async fn http_tools_ignore_environment_proxies_and_guard_through_a_named_one() {
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let app = axum::Router::new().fallback({
        let seen = seen.clone();
        move |uri: axum::http::Uri| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(uri.path().to_owned());
                "reached"
            }
        }
    });
    let target = serve_http(app).await.port();
    let proxy = HttpProxy::start().await;

    let config = format!(
        r#"
[[tools.http]]
name = "direct"
description = "Loopback by name, no permission"
url = "http://localhost:{target}/direct"

[[tools.http]]
name = "named_guarded"
description = "Loopback through the named proxy, no permission"
url = "http://localhost:{target}/named_guarded"
proxy = "{proxy}"

[[tools.http]]
name = "named"
description = "Loopback through the named proxy, allowed"
url = "http://localhost:{target}/named"
proxy = "{proxy}"
allow_private_network = true
"#,
        proxy = proxy.url
    );
    let env = [
        ("HTTP_PROXY", proxy.url.as_str()),
        ("http_proxy", proxy.url.as_str()),
        ("HTTPS_PROXY", proxy.url.as_str()),
        ("ALL_PROXY", proxy.url.as_str()),
    ];
    let server = BinaryServer::with_config(&config, &env).await.unwrap();
    let client = toolmesh::client::connect(&server.addr.to_string(), None).await.unwrap();
    let call = |name: &str| {
        let request = CallToolRequest { name: name.into(), ..Default::default() };
        let mut client = client.clone();
        async move { client.call_tool(request).await.unwrap().into_inner() }
    };
    let text = |response: &toolmesh_proto::v1::CallToolResponse| format!("{:?}", response.content);

    for tool in ["direct", "named_guarded"] {
        let refused = call(tool).await;
        assert!(refused.is_error, "{tool}: {}", text(&refused));
        assert!(text(&refused).contains("refused"), "{tool}: {}", text(&refused));
    }
    let named = call("named").await;
    assert!(!named.is_error, "{}", text(&named));
    assert!(text(&named).contains("reached"));
    assert_eq!(*seen.lock().unwrap(), ["/named"], "only the allowed call reached the target");
    // proxy.py logs a request when its connection closes.
    drop(client);
    drop(server);
    let logged = eventually(Duration::from_secs(5), || async {
        proxy.log().contains(&format!("localhost:{target}/named")).then_some(())
    })
    .await;
    assert!(logged.is_some(), "the named proxy carried the call:\n{}", proxy.log());
    assert!(!proxy.log().contains("/direct"), "the environment proxy was not used");
}

#[tokio::test]
async fn toolmesh_ingest_loads_a_tree_names_each_bad_file_and_replaces_on_a_second_run() {
    let config = "[[knowledge.collections]]\nname = \"docs\"\ndescription = \"The handbook.\"\n";
    let server = BinaryServer::with_config(config, &[]).await.unwrap();
    let addr = server.addr.to_string();
    let tree = tempfile::tempdir().unwrap();
    let dir = tree.path();
    std::fs::create_dir_all(dir.join("guide")).unwrap();
    let write = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).unwrap();
    write("guide/install.md", b"# Guide\n\n## Installing\n\nRun the installer, then sign in.\n");
    write("faq.txt", b"Passwords are reset from the login page.");
    write("empty.txt", b" \n\n");
    write("blob.txt", b"GIF89a\0\0\x01\x02");
    write("guide/logo.png", b"\x89PNG");
    write("big.txt", "word ".repeat(10 << 20).as_bytes()); // 50 MiB

    let dir_arg = dir.display().to_string();
    let first = run(&["ingest", "--collection", "docs", "--server", &addr, &dir_arg]).await;
    let (out, err) = (stdout(&first), stderr(&first));
    // Some files failed: the exit code says so, each is named with its reason.
    assert_eq!(first.status.code(), Some(1), "{out}\n{err}");
    assert!(out.contains("ingested 2 documents") && out.contains("3 failed, 1 skipped"), "{out}");
    assert!(err.contains("empty.txt: the file is empty"), "{err}");
    assert!(err.contains("blob.txt: not a text file"), "{err}");
    assert!(err.contains("big.txt: the file is 52428800 bytes"), "{err}");
    assert!(err.contains("skipped") && err.contains("logo.png"), "{err}");
    // Not a terminal: progress is plain lines.
    assert!(err.contains("ingested 5/5 documents"), "{err}");

    let search = |query: &'static str| {
        let addr = addr.clone();
        async move {
            let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
            let request = CallToolRequest {
                name: "search_docs".into(),
                arguments_json: json!({ "query": query }).to_string(),
                ..Default::default()
            };
            toolmesh_e2e::passages(&client.call_tool(request).await.unwrap().into_inner())
        }
    };
    // Ids are paths relative to the directory given; Markdown keeps its headings.
    let found = search("how do I install it").await;
    assert_eq!(found[0].0, "guide/install.md", "{found:?}");
    assert!(found[0].1.contains("Installing"), "{found:?}");
    assert_eq!(search("reset my password").await[0].0, "faq.txt");

    // A second run over the changed tree replaces the documents: the old text is gone.
    write("faq.txt", b"Passwords are changed in the account settings.");
    for name in ["empty.txt", "blob.txt", "big.txt"] {
        std::fs::remove_file(dir.join(name)).unwrap();
    }
    let second = run(&["ingest", "--collection", "docs", "--server", &addr, &dir_arg]).await;
    assert!(second.status.success(), "{}\n{}", stdout(&second), stderr(&second));
    let found = search("reset my password").await;
    assert_eq!(found[0].0, "faq.txt", "{found:?}");
    assert!(found.iter().all(|(_, text)| !text.contains("login page")), "{found:?}");
    assert_eq!(found.iter().filter(|(id, _)| id == "faq.txt").count(), 1, "{found:?}");

    // A collection that does not exist: one clear line, nothing sent.
    let missing = run(&["ingest", "--collection", "nope", "--server", &addr, &dir_arg]).await;
    assert!(!missing.status.success());
    assert!(stderr(&missing).contains("no knowledge collection \"nope\""), "{}", stderr(&missing));
}

/// An integer attribute of `span`.
fn int_attr(span: &Span, key: &str) -> Option<i64> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| {
        match a.value.as_ref()?.value.as_ref()? {
            any_value::Value::IntValue(v) => Some(*v),
            _ => None,
        }
    })
}

#[tokio::test]
async fn knowledge_ingest_and_query_are_spans_in_the_callers_trace() {
    let (receiver, otlp) = Receiver::start().await;
    let config = "[[knowledge.collections]]\nname = \"docs\"\ndescription = \"The handbook.\"\n";
    let mut server = BinaryServer::with_config(
        config,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()), ("OTEL_SERVICE_NAME", "toolmesh-e2e")],
    )
    .await
    .unwrap();
    let addr = server.addr.to_string();
    let trace_id = "5bf92f3577b34da6a3ce929d0e0e4737";
    fn traced<T>(message: T, trace_id: &str) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let parent = format!("00-{trace_id}-00f067aa0ba902b8-01");
        request.metadata_mut().insert("traceparent", parent.parse().unwrap());
        request
    }
    let channel = toolmesh::client::channel(&addr, None).await.unwrap();
    let mut knowledge =
        toolmesh_proto::v1::knowledge_service_client::KnowledgeServiceClient::new(channel);
    let documents = ["Passwords are reset from the login page.", "Invoices are sent monthly."]
        .iter()
        .enumerate()
        .map(|(i, text)| toolmesh_proto::v1::Document {
            id: format!("doc-{i}"),
            text: (*text).into(),
            ..Default::default()
        })
        .collect();
    let request = toolmesh_proto::v1::IngestRequest { collection: "docs".into(), documents };
    let ingested =
        knowledge.ingest(traced(futures::stream::iter([request]), trace_id)).await.unwrap();
    assert_eq!(ingested.into_inner().ingested, 2);
    let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
    let query = CallToolRequest {
        name: "search_docs".into(),
        arguments_json: json!({"query": "reset my password", "top_k": 3}).to_string(),
        ..Default::default()
    };
    client.call_tool(traced(query, trace_id)).await.unwrap();

    let spans = receiver.spans_after_stop(&mut server, "knowledge.query").await;
    let spans: Vec<&Span> = spans.iter().map(|(_, s)| s).collect();
    let named = |name: &str| -> Vec<&Span> {
        spans.iter().copied().filter(|s| s.name == name).collect::<Vec<_>>()
    };
    let one = |name: &str| -> &Span {
        let found = named(name);
        assert_eq!(
            found.len(),
            1,
            "one {name} span; got {:?}",
            spans.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
        found[0]
    };
    let parent_of = |span: &Span| spans.iter().copied().find(|s| s.span_id == span.parent_span_id);
    let under = |span: &Span, ancestor: &Span| {
        let mut at = parent_of(span);
        while let Some(s) = at {
            if s.span_id == ancestor.span_id {
                return true;
            }
            at = parent_of(s);
        }
        false
    };

    // Ingestion: in the caller's trace, under the gRPC call, with its parts beneath it.
    let ingest = one("knowledge.ingest");
    assert_eq!(hex(&ingest.trace_id), trace_id, "the ingestion is in the caller's trace");
    let rpc = one("toolmesh.v1.KnowledgeService/Ingest");
    assert!(under(ingest, rpc), "knowledge.ingest is under the Ingest call");
    assert_eq!(attr(ingest, "knowledge.collection").as_deref(), Some("docs"));
    assert_eq!(int_attr(ingest, "knowledge.documents"), Some(2));
    for part in ["knowledge.chunk", "knowledge.upsert"] {
        assert!(under(one(part), ingest), "{part} under knowledge.ingest");
    }
    let embeds = named("knowledge.embed");
    let batch = embeds.iter().find(|s| under(s, ingest)).expect("an embed span under the ingest");
    assert!(int_attr(batch, "knowledge.texts").is_some_and(|n| n >= 2), "{batch:?}");

    // The query: under the tool call, with the collection, top_k, the hits and its embed.
    let query = one("knowledge.query");
    assert_eq!(hex(&query.trace_id), trace_id);
    assert!(under(query, one("execute_tool search_docs")), "knowledge.query under the call");
    assert_eq!(attr(query, "knowledge.collection").as_deref(), Some("docs"));
    assert_eq!(int_attr(query, "knowledge.top_k"), Some(3));
    assert_eq!(int_attr(query, "knowledge.hits"), Some(2));
    assert!(embeds.iter().any(|s| under(s, query)), "an embed span under the query");
}

/// Ingests `documents` (id, text) into `docs` of the server at `addr`; returns how many the
/// answer acknowledged.
async fn ingest_documents(
    addr: &str,
    documents: &[(String, String)],
) -> Result<u64, tonic::Status> {
    let channel = toolmesh::client::channel(addr, None).await.unwrap();
    let mut knowledge =
        toolmesh_proto::v1::knowledge_service_client::KnowledgeServiceClient::new(channel);
    let documents = documents
        .iter()
        .map(|(id, text)| toolmesh_proto::v1::Document {
            id: id.clone(),
            text: text.clone(),
            ..Default::default()
        })
        .collect();
    let request = toolmesh_proto::v1::IngestRequest { collection: "docs".into(), documents };
    Ok(knowledge.ingest(futures::stream::iter([request])).await?.into_inner().ingested)
}

/// Every passage of `docs` a broad query finds: (document id, text).
async fn passages(addr: &str, query: &str) -> Vec<(String, String)> {
    let mut client = toolmesh::client::connect(addr, None).await.unwrap();
    let request = CallToolRequest {
        name: "search_docs".into(),
        arguments_json: json!({"query": query, "top_k": 50}).to_string(),
        ..Default::default()
    };
    let answer = client.call_tool(request).await.unwrap().into_inner();
    let structured: serde_json::Value =
        serde_json::from_str(answer.structured_json.as_deref().unwrap()).unwrap();
    structured["passages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["document_id"].as_str().unwrap().into(), p["text"].as_str().unwrap().into()))
        .collect()
}

/// Documents acknowledged by Ingest, and a re-ingestion of some of them acknowledged just
/// before the router is killed with SIGKILL, are all there after a restart on the same data
/// directory, each once, at the version acknowledged last.
#[tokio::test]
async fn acknowledged_ingests_and_replacements_survive_a_kill() {
    let data = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmesh.toml");
    std::fs::write(
        &config,
        "[[knowledge.collections]]\nname = \"docs\"\ndescription = \"The handbook.\"\n",
    )
    .unwrap();
    let args = ["--config", config.to_str().unwrap(), "--data-dir", data.path().to_str().unwrap()];
    let text = |i: usize, version: &str| format!("Handbook page {i} about lighthouses, {version}.");
    let first: Vec<(String, String)> =
        (0..5).map(|i| (format!("page-{i}"), text(i, "first edition"))).collect();
    let second: Vec<(String, String)> =
        (0..3).map(|i| (format!("page-{i}"), text(i, "second edition"))).collect();

    let mut server = BinaryServer::start(&args, &[]).await.unwrap();
    let addr = server.addr.to_string();
    assert_eq!(ingest_documents(&addr, &first).await.unwrap(), 5);
    assert_eq!(ingest_documents(&addr, &second).await.unwrap(), 3);
    // Killed right after the acknowledgement: no shutdown, no flush.
    server.signal(Signal::SIGKILL);
    server.child.wait().await.unwrap();

    let server = BinaryServer::start(&args, &[]).await.unwrap();
    let addr = server.addr.to_string();
    let mut found = passages(&addr, "handbook page about lighthouses").await;
    found.sort();
    let mut expected: Vec<(String, String)> = second.iter().chain(&first[3..]).cloned().collect();
    expected.sort();
    assert_eq!(found, expected, "every acknowledged document once, at its last version");
}

/// The tool index's counts at `addr`: (indexed, embedded), from a search's answer.
async fn index_counts(addr: &str) -> Option<(u64, u64)> {
    let mut client = toolmesh::client::connect(addr, None).await.ok()?;
    let request = toolmesh_proto::v1::SearchToolsRequest {
        query: "count".into(),
        top_k: 1,
        ..Default::default()
    };
    let answer = client.search_tools(request).await.ok()?.into_inner();
    Some((answer.indexed_tools, answer.embedded_tools))
}

/// The first start's embedding of the tool catalog, killed with SIGKILL half way, goes on
/// from where it was after a restart on the same data directory: the tools embedded before
/// the kill are not embedded again, and every tool is in the index once.
#[tokio::test]
async fn a_first_embedding_killed_half_way_goes_on_from_where_it_was() {
    const TOOLS: usize = 1500;
    let data = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmesh.toml");
    let words = ["invoices", "weather", "tickets", "orders", "calendars", "repositories"];
    let catalog: String = (0..TOOLS)
        .map(|i| {
            format!(
                "[[tools.command]]\nname = \"tool_{i}\"\ndescription = \"Lists the {} of \
                 account {i} and sums them up.\"\ncommand = \"true\"\n",
                words[i % words.len()]
            )
        })
        .collect();
    std::fs::write(&config, catalog).unwrap();
    let args = ["--config", config.to_str().unwrap(), "--data-dir", data.path().to_str().unwrap()];

    let mut server = BinaryServer::start(&args, &[]).await.unwrap();
    let addr = server.addr.to_string();
    let half_way = eventually(Duration::from_secs(120), || async {
        let (indexed, embedded) = index_counts(&addr).await?;
        // A few batches in, and far from done.
        (indexed as usize > TOOLS && embedded >= 200 && embedded + 500 < indexed)
            .then_some(embedded)
    })
    .await
    .expect("the embedding under way");
    server.signal(Signal::SIGKILL);
    server.child.wait().await.unwrap();

    let server = BinaryServer::start(&args, &[]).await.unwrap();
    let addr = server.addr.to_string();
    let indexed = eventually(Duration::from_secs(300), || async {
        let (indexed, embedded) = index_counts(&addr).await?;
        (indexed as usize > TOOLS && embedded == indexed).then_some(indexed)
    })
    .await
    .expect("the embedding completes");
    let logs = eventually(Duration::from_secs(10), || async {
        let logs = server.logs();
        logs.contains("embedded tool texts").then_some(logs)
    })
    .await
    .unwrap_or_else(|| panic!("the run's count is logged: {}", server.logs()));
    let made: u64 = logs
        .lines()
        .find(|line| line.contains("embedded tool texts"))
        .and_then(|line| line.split("tools=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the run's count is logged: {logs}"));
    assert!(
        made <= indexed - half_way,
        "{made} texts embedded again; {half_way} of {indexed} were before the kill: {logs}"
    );
}

/// The gRPC health of `service` at `addr`.
async fn health_of(addr: &str, service: &str) -> Option<i32> {
    let channel = toolmesh::client::channel(addr, None).await.ok()?;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let request = tonic_health::pb::HealthCheckRequest { service: service.into() };
    health.check(request).await.ok().map(|r| r.into_inner().status)
}

/// Bytes free on the file system of `path`.
fn free_bytes(path: &Path) -> u64 {
    let out = std::process::Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).lines().nth(1).unwrap().trim().parse().unwrap()
}

/// With the data directory on a small file system filled past `vector.min_free_mb` (256 MiB
/// by default), ingestion is refused with RESOURCE_EXHAUSTED naming the disk, the store's
/// health goes NOT_SERVING, and searches and other tools go on; freed space lets writes in
/// again. Needs a loop mount (root): skipped, saying so, where it cannot mount.
#[tokio::test]
async fn a_nearly_full_disk_refuses_writes_and_serves_everything_else() {
    let base = tempfile::tempdir().unwrap();
    let (image, mount) = (base.path().join("disk.img"), base.path().join("disk"));
    std::fs::create_dir_all(&mount).unwrap();
    let made = std::process::Command::new("truncate")
        .args(["-s", "400M"])
        .arg(&image)
        .status()
        .unwrap()
        .success()
        && std::process::Command::new("mkfs.ext4")
            .arg("-q")
            .arg(&image)
            .status()
            .is_ok_and(|s| s.success());
    let mounted = made
        && std::process::Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mount)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!(
            "SKIPPED a_nearly_full_disk_refuses_writes_and_serves_everything_else: cannot loop-mount a file system here (needs root and mkfs.ext4)"
        );
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mount.clone());
    let data = mount.join("data");
    let config = base.path().join("toolmesh.toml");
    std::fs::write(
        &config,
        "[[knowledge.collections]]\nname = \"docs\"\ndescription = \"The handbook.\"\n",
    )
    .unwrap();
    let args = ["--config", config.to_str().unwrap(), "--data-dir", data.to_str().unwrap()];
    let server = BinaryServer::start(&args, &[]).await.unwrap();
    let addr = server.addr.to_string();
    let first = [("page-0".to_owned(), "Lighthouses guide ships at night.".to_owned())];
    assert_eq!(ingest_documents(&addr, &first).await.unwrap(), 1);

    // Fill the disk to 200 MiB free, below the 256 MiB the store keeps.
    let filler = mount.join("filler");
    let fill = free_bytes(&mount).saturating_sub(200 << 20);
    assert!(
        std::process::Command::new("fallocate")
            .args(["-l", &fill.to_string()])
            .arg(&filler)
            .status()
            .unwrap()
            .success()
    );
    let second = [("page-1".to_owned(), "Foghorns sound in the mist.".to_owned())];
    let refused = ingest_documents(&addr, &second).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains(data.to_str().unwrap()), "{refused:?}");
    assert!(refused.message().contains("vector.min_free_mb"), "{refused:?}");
    let down = eventually(Duration::from_secs(15), || async {
        (health_of(&addr, "toolmesh.vector.embedded").await == Some(2)).then_some(())
    });
    assert!(down.await.is_some(), "the store's health goes NOT_SERVING");
    // Reads and other tools go on; the process is alive.
    let found = passages(&addr, "lighthouses").await;
    assert_eq!(found, [("page-0".to_owned(), first[0].1.clone())]);
    let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
    let echo = CallToolRequest {
        name: "echo".into(),
        arguments_json: json!({"text": "still here"}).to_string(),
        ..Default::default()
    };
    assert!(!client.call_tool(echo).await.unwrap().into_inner().is_error);

    // Space freed: writes go in again and the health comes back.
    std::fs::remove_file(&filler).unwrap();
    let up = eventually(Duration::from_secs(15), || async {
        (health_of(&addr, "toolmesh.vector.embedded").await == Some(1)).then_some(())
    });
    assert!(up.await.is_some(), "the store's health comes back");
    assert_eq!(ingest_documents(&addr, &second).await.unwrap(), 1);
    drop(server);
    tokio::time::sleep(Duration::from_secs(2)).await;
}
