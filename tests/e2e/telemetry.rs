//! Traces and metrics: one trace per call across processes and MCP servers, OTLP
//! export, health as metrics.

use opentelemetry_proto::tonic::{common::v1::any_value, trace::v1::Span};
use serde_json::json;
use std::{
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};
use tonic::Code;
use toolmesh_e2e::cli::tool_names;
use toolmesh_e2e::otlp::{Receiver, attr, hex, int_attr, serve_on_loopback};
use toolmesh_e2e::{BinaryServer, PyHttpServer, eventually, py_stdio_config, python};
use toolmesh_proto::v1::{CallToolRequest, ListToolsRequest};

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
    // Every span has a name a reader understands; the actor runtime's own spans (one per
    // actor and message) stay out of the export by default.
    for (_, span) in &spans {
        assert!(!span.name.is_empty(), "an unnamed span: {span:?}");
        assert!(!["Actor", "message_parent"].contains(&span.name.as_str()), "{}", span.name);
    }

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

/// A toolmesh exporting to a fresh OTLP receiver, with `tests/mcp/py_server.py` over stdio
/// and `extra` configuration, once the server's tools are published.
async fn traced_py_server(extra: &str) -> (Receiver, BinaryServer) {
    let (receiver, otlp) = Receiver::start().await;
    let config = format!("{}\n{extra}", py_stdio_config());
    let server =
        BinaryServer::with_config(&config, &[("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str())])
            .await
            .unwrap();
    let addr = server.addr.to_string();
    eventually(Duration::from_secs(30), || async {
        tool_names(&addr).await.contains(&"py_trace".to_owned()).then_some(())
    })
    .await
    .expect("the MCP server's tools are published");
    (receiver, server)
}

#[tokio::test]
async fn mcp_calls_carry_the_trace_into_the_server() {
    let (receiver, mut server) = traced_py_server("").await;
    let addr = server.addr.to_string();

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

/// MCP requests are measured as the OpenTelemetry MCP conventions name them: each
/// `tools/call` the MCP endpoint serves in `mcp.server.operation.duration`, and each one
/// toolmesh sends to an upstream server in `mcp.client.operation.duration`.
#[tokio::test]
async fn mcp_operations_are_measured_on_both_sides() {
    let metrics = MetricsReceiver::default();
    let otlp = serve_on_loopback(
        opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::MetricsServiceServer::new(
            metrics.clone(),
        ),
    )
    .await;
    let upstream = PyHttpServer::start().await;
    let config = format!(
        "[[mcp.servers]]\nname = \"web\"\ntransport = \"streamable-http\"\nurl = \"http://127.0.0.1:{}/mcp\"\n\n[[routing.profiles]]\nname = \"all\"\nexpose = [\"*\"]\n",
        upstream.port
    );
    let server = BinaryServer::with_config(
        &config,
        &[
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", otlp.as_str()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
        ],
    )
    .await
    .unwrap();
    let mut client = toolmesh::client::connect(&server.addr.to_string(), None).await.unwrap();
    let add = CallToolRequest {
        name: "web_add".into(),
        arguments_json: json!({"a": 1, "b": 2}).to_string(),
        ..Default::default()
    };
    eventually(Duration::from_secs(30), || {
        let (mut client, add) = (client.clone(), add.clone());
        async move { client.call_tool(add).await.ok() }
    })
    .await
    .expect("the server's tools are published");
    client.call_tool(add).await.unwrap();

    let url = format!("http://{}/mcp/all", server.addr);
    let plan = json!([{"op": "call", "name": "web_add", "arguments": {"a": 2, "b": 3}}]);
    let got = crate::mcp_endpoint::python_client(&url, "2025-11-25", plan, &[]).await;
    assert_eq!(got[1]["is_error"], false, "{}", got[1]);

    let has = |attributes: &[(String, String)], key: &str, value: &str| {
        attributes.iter().any(|(k, v)| k == key && v == value)
    };
    let served = || {
        metrics.points.lock().unwrap().iter().any(|(name, attributes, count)| {
            name == "mcp.server.operation.duration"
                && has(attributes, "mcp.method.name", "tools/call")
                && has(attributes, "gen_ai.tool.name", "web_add")
                && has(attributes, "mcp.protocol.version", "2025-11-25")
                && !attributes.iter().any(|(k, _)| k == "error.type")
                && *count >= 1.0
        })
    };
    // Both calls went upstream: the one through CallTool and the one through the endpoint.
    let sent = || {
        metrics.points.lock().unwrap().iter().any(|(name, attributes, count)| {
            name == "mcp.client.operation.duration"
                && has(attributes, "mcp.method.name", "tools/call")
                && has(attributes, "gen_ai.tool.name", "add")
                && has(attributes, "mcp.server", "web")
                && has(attributes, "network.transport", "tcp")
                && *count >= 2.0
        })
    };
    let seen = eventually(Duration::from_secs(20), || async { (served() && sent()).then_some(()) });
    assert!(
        seen.await.is_some(),
        "served: {}, sent: {}; points: {:?}",
        served(),
        sent(),
        metrics
            .points
            .lock()
            .unwrap()
            .iter()
            .filter(|(name, _, _)| name.starts_with("mcp."))
            .collect::<Vec<_>>()
    );
}

/// A call through the MCP endpoint is one trace from the MCP client's `traceparent` (in the
/// request's `_meta`, else in its HTTP headers) through the router to the upstream server;
/// the endpoint's server span carries the MCP conventions' attributes.
#[tokio::test]
async fn mcp_endpoint_calls_are_one_trace_from_the_client_to_the_upstream_server() {
    use crate::mcp_endpoint::{initialize, post};

    let all = "[[routing.profiles]]\nname = \"all\"\nexpose = [\"*\"]\n";
    let (receiver, mut server) = traced_py_server(all).await;
    let addr = server.addr.to_string();
    let url = format!("http://{addr}/mcp/all");
    let (status, session, _) = post(&url, initialize(), None, None).await;
    assert_eq!(status, 200);
    let session = session.expect("a session");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    post(&url, initialized, Some(&session), None).await;

    // In `_meta`, as the MCP conventions carry it.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "py_trace", "arguments": {},
        "_meta": {"traceparent": format!("00-{trace_id}-{parent}-01")}}});
    let (status, _, answer) = post(&url, call, Some(&session), None).await;
    assert_eq!(status, 200, "{answer}");
    let received = answer["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned();
    assert_eq!(received.split('-').nth(1), Some(trace_id), "{answer}");

    // In the HTTP headers, where the request's `_meta` has none.
    let header_trace = "6bf92f3577b34da6a3ce929d0e0e4736";
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "py_trace", "arguments": {}}});
    let response = reqwest::Client::new()
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .header("mcp-session-id", &session)
        .header("traceparent", format!("00-{header_trace}-{parent}-01"))
        .body(call.to_string())
        .send()
        .await
        .unwrap();
    let body = response.text().await.unwrap();
    assert!(body.contains(header_trace), "the header's trace reached the server: {body}");

    let spans = receiver.spans_after_stop(&mut server, "tools/call py_trace").await;
    let served = spans
        .iter()
        .map(|(_, s)| s)
        .find(|s| s.name == "tools/call py_trace" && hex(&s.trace_id) == trace_id)
        .expect("the endpoint's server span, in the client's trace");
    assert_eq!(hex(&served.parent_span_id), parent, "a child of the client's span");
    assert_eq!(attr(served, "mcp.method.name").as_deref(), Some("tools/call"));
    assert_eq!(attr(served, "mcp.protocol.version").as_deref(), Some("2025-11-25"));
    assert_eq!(attr(served, "mcp.session.id").as_deref(), Some(session.as_str()));
    assert_eq!(attr(served, "gen_ai.tool.name").as_deref(), Some("py_trace"));
    // Through the router to the upstream server, in the same trace.
    let upstream = spans
        .iter()
        .map(|(_, s)| s)
        .find(|s| s.name == "tools/call trace" && hex(&s.trace_id) == trace_id)
        .expect("toolmesh's MCP client span to the upstream server, in the same trace");
    assert_eq!(attr(upstream, "mcp.server").as_deref(), Some("py"));
    assert!(
        spans
            .iter()
            .any(|(_, s)| s.name == "tools/call py_trace" && hex(&s.trace_id) == header_trace),
        "the header-parented call has its span too"
    );
}

/// With `telemetry.log_format = "json"` every line on stderr is one JSON object, with the
/// event's fields at its top level.
#[tokio::test]
async fn json_logs_are_one_object_per_line() {
    let server =
        BinaryServer::start(&[], &[("TOOLMESH__TELEMETRY__LOG_FORMAT", "json")]).await.unwrap();
    let serving = eventually(Duration::from_secs(10), || async {
        let stderr = server.stderr.lock().unwrap().clone();
        stderr.contains("\"serving\"").then_some(stderr)
    })
    .await
    .expect("the server logged that it serves");
    let lines: Vec<serde_json::Value> = serving
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    let line = lines.iter().find(|line| line["message"] == "serving").unwrap();
    assert_eq!(line["level"], "INFO", "{line}");
    assert_eq!(line["addr"], server.addr.to_string(), "{line}");
    assert!(line["tools"].as_u64().is_some_and(|n| n > 0), "{line}");
    assert!(line["timestamp"].as_str().is_some_and(|t| t.starts_with("20")), "{line}");
}

/// Scrapes `/metrics` of a server whose log names the address it serves them on.
async fn scrape(server: &BinaryServer) -> String {
    let addr = eventually(Duration::from_secs(10), || async {
        let logs = server.logs();
        let line = logs.lines().find(|l| l.contains("serving metrics at /metrics"))?;
        line.split("addr=").nth(1)?.split_whitespace().next().map(str::to_owned)
    })
    .await
    .expect("the server says where its metrics are");
    let response = reqwest::get(format!("http://{addr}/metrics")).await.unwrap();
    assert!(response.status().is_success());
    let content_type = response.headers()[reqwest::header::CONTENT_TYPE].to_str().unwrap();
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    response.text().await.unwrap()
}

/// The value of the sample whose line starts with `series` (name and labels as written).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn prometheus_scrapes_calls_queues_and_source_health_on_the_metrics_address() {
    let config = format!(
        "[telemetry]\nmetrics_listen = \"127.0.0.1:0\"\n\n[workers]\nsize = 4\n\n{}",
        py_stdio_config()
    );
    let server = BinaryServer::with_config(&config, &[]).await.unwrap();
    let mut client = toolmesh::client::connect(&server.addr.to_string(), None).await.unwrap();
    let call = |name: &str, arguments: serde_json::Value| CallToolRequest {
        name: name.into(),
        arguments_json: arguments.to_string(),
        ..Default::default()
    };
    for _ in 0..3 {
        client.call_tool(call("echo", json!({"n": 1}))).await.unwrap();
    }
    eventually(Duration::from_secs(30), || async {
        tool_names(&server.addr.to_string()).await.iter().any(|n| n == "py_add").then_some(())
    })
    .await
    .expect("the MCP server's tools are listed");
    client.call_tool(call("py_add", json!({"a": 1, "b": 2}))).await.unwrap();
    // A remote pool: the shipped worker's tool.
    let worker_file = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/k8s/base/worker.toml"),
    )
    .unwrap();
    let worker = toolmesh_e2e::BinaryWorker::start_with_env(
        &server.addr.to_string(),
        &worker_file,
        &[],
        &[("TOOLMESH__TELEMETRY__METRICS_LISTEN", "127.0.0.1:0")],
    )
    .unwrap();
    worker.joined(1).await.unwrap();
    eventually(Duration::from_secs(20), || async {
        tool_names(&server.addr.to_string()).await.iter().any(|n| n == "disk_usage").then_some(())
    })
    .await
    .expect("the worker's tool is listed");
    client.call_tool(call("disk_usage", json!({}))).await.unwrap();
    assert_eq!(client.call_tool(call("nope", json!({}))).await.unwrap_err().code(), Code::NotFound);

    let text = scrape(&server).await;
    // Calls: per tool, source and outcome, in buckets from 50 µs on.
    let echo = r#"gen_ai_tool_name="echo",toolmesh_call_outcome="ok",toolmesh_source_kind="local",toolmesh_source_name="builtin""#;
    assert_eq!(
        sample(&text, &format!("toolmesh_call_duration_seconds_count{{{echo}}}")),
        Some(3.0),
        "{text}"
    );
    assert!(
        text.contains(&format!("toolmesh_call_duration_seconds_bucket{{{echo},le=\"0.00005\"}}")),
        "{text}"
    );
    let buckets = text
        .lines()
        .filter(|l| l.starts_with(&format!("toolmesh_call_duration_seconds_bucket{{{echo},")))
        .count();
    assert_eq!(buckets, 23, "22 bounds and +Inf");
    assert!(text.contains(r#"gen_ai_tool_name="py_add",toolmesh_call_outcome="ok",toolmesh_source_kind="mcp",toolmesh_source_name="py""#), "{text}");
    // A name no tool has is counted without being a label.
    assert!(!text.contains(r#"gen_ai_tool_name="nope""#), "{text}");
    assert!(
        text.contains(r#"error_type="tool_not_found",toolmesh_call_outcome="error""#),
        "{text}"
    );
    // Queues and calls in flight, and the health of every source.
    assert_eq!(sample(&text, "toolmesh_pool_workers"), Some(4.0), "{text}");
    assert_eq!(sample(&text, "toolmesh_pool_queued"), Some(0.0), "{text}");
    assert_eq!(sample(&text, "toolmesh_pool_wait_seconds_count"), Some(3.0), "{text}");
    assert_eq!(sample(&text, r#"toolmesh_mcp_in_flight{mcp_server="py"}"#), Some(0.0), "{text}");
    let pool = r#"{toolmesh_source_name="default"}"#;
    assert_eq!(sample(&text, &format!("toolmesh_remote_pending{pool}")), Some(0.0), "{text}");
    assert_eq!(sample(&text, &format!("toolmesh_remote_in_flight{pool}")), Some(0.0), "{text}");
    let waited = format!("toolmesh_remote_schedule_to_start_seconds_count{pool}");
    assert_eq!(sample(&text, &waited), Some(1.0), "{text}");
    assert_eq!(
        sample(
            &text,
            r#"toolmesh_source_up{toolmesh_source_kind="mcp",toolmesh_source_name="py"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert!(text.contains("# TYPE toolmesh_call_duration_seconds histogram"), "{text}");
}

#[tokio::test]
async fn an_unreachable_collector_is_said_once_and_shows_in_health() {
    use tonic_health::pb::health_check_response::ServingStatus;

    // Nothing listens there: every export fails at once.
    let env =
        [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"), ("OTEL_BSP_SCHEDULE_DELAY", "100")];
    let server = BinaryServer::start(&[], &env).await.unwrap();
    let addr = server.addr.to_string();
    let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
    let echo = || CallToolRequest {
        name: "echo".into(),
        arguments_json: "{}".into(),
        ..Default::default()
    };
    let otlp = "toolmesh.telemetry.otlp";
    for _ in 0..5 {
        client.call_tool(echo()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let down = eventually(Duration::from_secs(20), || async {
        let status = toolmesh_e2e::cli::health_of(&addr, otlp).await?;
        (status == ServingStatus::NotServing as i32).then_some(())
    })
    .await;
    assert!(down.is_some(), "the export's health says so:\n{}", server.logs());
    // Said once, with the endpoint, however many exports failed.
    for _ in 0..5 {
        client.call_tool(echo()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let logs = server.logs();
    assert_eq!(logs.matches("spans cannot be exported").count(), 1, "{logs}");
    assert!(logs.contains("127.0.0.1:9"), "{logs}");
    // The API stays ready: traces are not what it serves.
    let overall = toolmesh_e2e::cli::health_of(&addr, "").await;
    assert_eq!(overall, Some(ServingStatus::Serving as i32));
}
