//! The gRPC API end to end: a real server on 127.0.0.1:0 with the built-in tools, tools
//! from configuration, and scripted local tools; a real tonic client.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::{
    num::NonZeroUsize,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use prost::Message as _;
use serde_json::{Value, json};
use tonic::Code;
use tonic_types::StatusExt;
use toolmesh::AppOptions;
use toolmesh_e2e::{
    TestServer, eventually, text,
    tools::{BadOutputTool, BlockingProbe, BlockingTool, PanicTool, ProgressTool},
};
use toolmesh_proto::v1::{
    CallToolClientMessage, CallToolRequest, CallToolResponse, CancelCall, ListToolsRequest,
    SourceKind, call_tool_client_message, call_tool_server_message::Message, content_part::Part,
    tool_service_client::ToolServiceClient,
};
use toolmesh_workers::{LocalToolInstall, ToolLimits};

#[path = "auth.rs"]
mod auth;
#[path = "credentials.rs"]
mod credentials;
#[path = "policy.rs"]
mod policy;

fn limits(running: usize, queue: usize) -> ToolLimits {
    ToolLimits { max_concurrency: NonZeroUsize::new(running), max_queue: queue }
}

/// A server with the scripted tools; `block` admits one running and one waiting call.
async fn server(toml: &str, probe: &Arc<BlockingProbe>) -> TestServer {
    let tools: Vec<LocalToolInstall> = vec![
        (Arc::new(PanicTool), ToolLimits::default()),
        (Arc::new(BlockingTool(probe.clone())), limits(1, 1)),
        (Arc::new(ProgressTool), ToolLimits::default()),
        (Arc::new(BadOutputTool), ToolLimits::default()),
    ];
    TestServer::start(toml, AppOptions { tools, ..Default::default() })
        .await
        .expect("server starts")
}

fn request(name: &str, arguments: Value) -> CallToolRequest {
    CallToolRequest {
        name: name.into(),
        arguments_json: arguments.to_string(),
        ..Default::default()
    }
}

async fn call(
    client: &mut ToolServiceClient<toolmesh::client::Connection>,
    name: &str,
    arguments: Value,
) -> Result<CallToolResponse, tonic::Status> {
    client.call_tool(request(name, arguments)).await.map(tonic::Response::into_inner)
}

fn structured(response: &CallToolResponse) -> Value {
    serde_json::from_str(response.structured_json.as_deref().expect("structured result")).unwrap()
}

/// Starts a `StreamCallTool` call whose client side stays open; returns the sender for
/// further client messages and the server's stream.
async fn open_stream(
    client: &mut ToolServiceClient<toolmesh::client::Connection>,
    start: CallToolRequest,
) -> (
    tokio::sync::mpsc::Sender<CallToolClientMessage>,
    tonic::Streaming<toolmesh_proto::v1::CallToolServerMessage>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let start = call_tool_client_message::Message::Start(start);
    tx.send(CallToolClientMessage { message: Some(start) }).await.unwrap();
    let stream = client
        .stream_call_tool(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, stream)
}

#[tokio::test]
async fn lists_tools_with_toolkits_filters_and_pages() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("", &probe).await;
    let mut client = server.client().await;

    let all = client.list_tools(ListToolsRequest::default()).await.unwrap().into_inner();
    let names: Vec<_> = all.tools.iter().map(|t| t.name.as_str()).collect();
    let expected = [
        "analyze",
        "bad_output",
        "block",
        "callTool",
        "echo",
        "panic",
        "progress",
        "searchTools",
        "think",
    ];
    assert_eq!(names, expected);
    assert!(all.next_page_token.is_empty());
    let think = all.tools.iter().find(|t| t.name == "think").unwrap();
    assert_eq!(think.toolkit, "reasoning");
    let schema: Value = serde_json::from_str(&think.input_schema_json).unwrap();
    assert_eq!(schema["required"], json!(["title", "thought"]));
    let source = think.source.as_ref().unwrap();
    assert_eq!((source.kind(), source.name.as_str()), (SourceKind::Local, "builtin"));
    assert_eq!(think.annotations.unwrap().read_only, Some(true));
    let reasoning = all.toolkits.iter().find(|k| k.name == "reasoning").unwrap();
    assert!(reasoning.instructions.contains("think") && reasoning.instructions.contains("analyze"));
    assert_eq!(reasoning.tools, ["think", "analyze"]);
    let analyze = all.tools.iter().find(|t| t.name == "analyze").unwrap();
    assert!(analyze.output_schema_json.is_some());

    let by_toolkit = client
        .list_tools(ListToolsRequest { toolkit: "reasoning".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let names: Vec<_> = by_toolkit.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["analyze", "think"]);
    assert_eq!(by_toolkit.toolkits.len(), 1);

    let by_source = client
        .list_tools(ListToolsRequest { source_name: "embedded".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_source.tools.len(), 4);
    assert!(by_source.toolkits.is_empty());
    let by_tag = client
        .list_tools(ListToolsRequest { tags: vec!["utility".into()], ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_tag.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["echo"]);
    let mcp = client
        .list_tools(ListToolsRequest { source_kind: SourceKind::Mcp.into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(mcp.tools.is_empty());

    // Paging visits every tool once, in order.
    let mut paged = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_tools(ListToolsRequest { page_size: 3, page_token: token, ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert!(page.tools.len() <= 3);
        paged.extend(page.tools.into_iter().map(|t| t.name));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(paged, expected);

    let bad = client
        .list_tools(ListToolsRequest { page_token: "garbage".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn calls_the_builtin_tools() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("", &probe).await;
    let mut client = server.client().await;

    let echo = call(&mut client, "echo", json!({"message": "hi", "n": [1, 2]})).await.unwrap();
    assert!(!echo.is_error);
    assert_eq!(structured(&echo), json!({"message": "hi", "n": [1, 2]}));
    assert!(!echo.call_id.is_empty(), "a call id is generated");

    let think = call(
        &mut client,
        "think",
        json!({"title": "plan", "thought": "look up the weather first", "confidence": 0.8}),
    )
    .await
    .unwrap();
    assert!(!think.is_error);
    assert!(text(&think).contains("look up the weather first"));

    let analyze = call(
        &mut client,
        "analyze",
        json!({"title": "weather", "result": "22°C", "analysis": "answers the question",
               "next_action": "final_answer", "confidence": 0.9}),
    )
    .await
    .unwrap();
    assert!(!analyze.is_error);
    assert_eq!(structured(&analyze)["next_action"], "final_answer");

    let with_id = client
        .call_tool(CallToolRequest { call_id: "my-call-1".into(), ..request("echo", json!({})) })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(with_id.call_id, "my-call-1");
}

#[tokio::test]
async fn bad_arguments_are_invalid_argument_naming_path_and_rule() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("", &probe).await;
    let mut client = server.client().await;

    let status = call(&mut client, "think", json!({"title": 5})).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("/title"), "{}", status.message());
    assert!(status.message().contains("thought"), "{}", status.message());
    let details = status.get_details_bad_request().expect("BadRequest details");
    let fields: Vec<_> = details
        .field_violations
        .iter()
        .map(|v| (v.field.as_str(), v.description.as_str()))
        .collect();
    assert!(fields.iter().any(|(f, d)| *f == "/title" && d.contains("(type)")), "{fields:?}");
    assert!(fields.iter().any(|(f, d)| *f == "/" && d.contains("(required)")), "{fields:?}");

    let status = call(
        &mut client,
        "analyze",
        json!({"title": "t", "result": "r", "analysis": "a",
                                                     "next_action": "give_up"}),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("/next_action") && status.message().contains("enum"));

    let malformed = client
        .call_tool(CallToolRequest {
            name: "echo".into(),
            arguments_json: "{not json".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument);
    assert!(malformed.message().contains("arguments_json"));
    assert!(probe.started.load(Ordering::SeqCst) == 0);
}

#[tokio::test]
async fn unknown_tool_is_not_found() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("", &probe).await;
    let mut client = server.client().await;
    let status = call(&mut client, "no_such_tool", json!({})).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    assert!(status.message().contains("no_such_tool"));
}

#[tokio::test]
async fn output_schema_violation_is_an_error_result() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("", &probe).await;
    let mut client = server.client().await;
    let response = call(&mut client, "bad_output", json!({})).await.unwrap();
    assert!(response.is_error);
    assert!(
        text(&response).contains("output schema") && text(&response).contains("\"n\""),
        "{}",
        text(&response)
    );
}

#[tokio::test]
async fn a_panicking_tool_kills_only_its_worker() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("[workers]\nsize = 2\nqueue = 4\n", &probe).await;
    let mut client = server.client().await;

    // More panics than workers: every worker dies at least once and is replaced.
    for i in 0..5 {
        let call_id = format!("crash-{i}");
        let status = client
            .call_tool(CallToolRequest {
                call_id: call_id.clone(),
                ..request("panic", json!({"panic": true}))
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Internal);
        assert!(status.message().contains(&call_id), "{}", status.message());
        assert!(status.message().contains("scripted panic"), "{}", status.message());
        let info = status.get_details_error_info().expect("ErrorInfo details");
        assert_eq!(info.reason, "TOOL_CRASHED");
        assert_eq!(info.metadata.get("call_id"), Some(&call_id));

        let ok = call(&mut client, "panic", json!({"panic": false})).await.unwrap();
        assert_eq!(text(&ok), "ok", "the next call is served");
    }
    let pool = server.app.pool();
    assert_eq!(pool.stats().restarts, 5);
    assert_eq!(pool.live_workers().await, Some(2));
    let echo = call(&mut client, "echo", json!({"still": "alive"})).await.unwrap();
    assert_eq!(structured(&echo), json!({"still": "alive"}));
}

#[tokio::test]
async fn client_deadline_is_deadline_exceeded_and_stops_the_tool() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("", &probe).await;
    let mut client = server.client().await;

    // tonic's channel runs a timer of the request's `grpc-timeout` too, which answers
    // CANCELLED when it fires first; the router finishes a share of the deadline early (5%,
    // at most 100 ms) to come first. Two seconds give it 100 ms, enough for a loaded machine
    // (200 ms gave it 10, which a cold CI run overran).
    let mut req = tonic::Request::new(request("block", json!({})));
    req.metadata_mut().insert("grpc-timeout", "2S".parse().unwrap());
    let status = client.call_tool(req).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("block"), "the server answered: {status:?}");
    let dropped = eventually(Duration::from_secs(5), || async {
        (probe.dropped.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    assert!(dropped.is_some(), "the tool's task was stopped");
    assert_eq!(probe.finished.load(Ordering::SeqCst), 0);
    assert_eq!(server.app.pool().stats().admitted, 0, "its slot is free again");
}

#[tokio::test]
async fn cancel_message_and_dropped_stream_stop_the_tool() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("", &probe).await;
    let mut client = server.client().await;

    let (tx, mut stream) = open_stream(&mut client, request("block", json!({}))).await;
    let first = stream.message().await.unwrap().unwrap();
    assert!(matches!(first.message, Some(Message::Started(_))));
    eventually(Duration::from_secs(5), || async {
        (probe.started.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await
    .expect("the tool started");
    let cancel =
        call_tool_client_message::Message::Cancel(CancelCall { reason: "user hit stop".into() });
    tx.send(CallToolClientMessage { message: Some(cancel) }).await.unwrap();
    let status = stream.message().await.unwrap_err();
    assert_eq!(status.code(), Code::Cancelled);
    eventually(Duration::from_secs(5), || async {
        (probe.dropped.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await
    .expect("cancel stopped the tool");

    // A client that drops the whole call cancels it too.
    let (tx, mut stream) = open_stream(&mut client, request("block", json!({}))).await;
    stream.message().await.unwrap().unwrap();
    eventually(Duration::from_secs(5), || async {
        (probe.started.load(Ordering::SeqCst) == 2).then_some(())
    })
    .await
    .expect("the second call started");
    drop(stream);
    drop(tx);
    eventually(Duration::from_secs(5), || async {
        (probe.dropped.load(Ordering::SeqCst) == 2).then_some(())
    })
    .await
    .expect("dropping the stream stopped the tool");
    assert_eq!(probe.finished.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn full_tool_queue_is_resource_exhausted_at_once() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("", &probe).await;
    let client = server.client().await;

    // `block` admits one running call and one waiting call.
    let first = tokio::spawn({
        let mut c = client.clone();
        async move { c.call_tool(request("block", json!({}))).await }
    });
    eventually(Duration::from_secs(5), || async {
        (probe.started.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await
    .expect("first call runs");
    let second = tokio::spawn({
        let mut c = client.clone();
        async move { c.call_tool(request("block", json!({}))).await }
    });
    eventually(Duration::from_secs(5), || async {
        (server.app.pool().stats().admitted == 2).then_some(())
    })
    .await
    .expect("second call waits");

    let started = std::time::Instant::now();
    let status = client.clone().call_tool(request("block", json!({}))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("block"), "{}", status.message());
    assert!(started.elapsed() < Duration::from_secs(2), "refused without waiting");

    probe.gate.add_permits(2);
    assert_eq!(text(&first.await.unwrap().unwrap().into_inner()), "released");
    assert_eq!(text(&second.await.unwrap().unwrap().into_inner()), "released");
}

#[tokio::test]
async fn full_worker_pool_is_resource_exhausted() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("[workers]\nsize = 1\nqueue = 0\n", &probe).await;
    let client = server.client().await;
    let running = tokio::spawn({
        let mut c = client.clone();
        async move { c.call_tool(request("block", json!({}))).await }
    });
    eventually(Duration::from_secs(5), || async {
        (probe.started.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await
    .expect("the only worker is busy");
    let status = client.clone().call_tool(request("echo", json!({}))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("worker pool is full"), "{}", status.message());
    probe.gate.add_permits(1);
    running.await.unwrap().unwrap();
    call(&mut client.clone(), "echo", json!({})).await.expect("served once the worker is free");
}

#[tokio::test]
async fn progress_and_partials_arrive_in_order_before_the_result() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("", &probe).await;
    let mut client = server.client().await;

    let start = call_tool_client_message::Message::Start(request("progress", json!({"steps": 25})));
    let outbound = futures::stream::iter([CallToolClientMessage { message: Some(start) }]);
    let mut stream = client.stream_call_tool(outbound).await.unwrap().into_inner();
    let mut messages = Vec::new();
    while let Some(message) = stream.message().await.unwrap() {
        messages.push(message.message.unwrap());
    }
    assert!(matches!(messages.first(), Some(Message::Started(s)) if !s.call_id.is_empty()));
    let Some(Message::Result(result)) = messages.last() else {
        panic!("last message is the result")
    };
    assert_eq!(structured(result), json!({"steps": 25}));
    let middle = &messages[1..messages.len() - 1];
    assert_eq!(middle.len(), 50);
    for (i, pair) in middle.chunks(2).enumerate() {
        let step = (i + 1) as f64;
        match (&pair[0], &pair[1]) {
            (Message::Progress(p), Message::Partial(part)) => {
                assert_eq!(
                    (p.progress, p.total, p.message.as_str()),
                    (step, Some(25.0), &*format!("step {step}"))
                );
                assert_eq!(part.part, Some(Part::Text(format!("part {step}"))));
            }
            other => panic!("unexpected pair at step {step}: {other:?}"),
        }
    }

    // The same tool over unary CallTool: no events, same result.
    let unary = call(&mut client, "progress", json!({"steps": 3})).await.unwrap();
    assert_eq!(structured(&unary), json!({"steps": 3}));
}

#[tokio::test]
async fn stream_must_start_with_start() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("", &probe).await;
    let mut client = server.client().await;
    let cancel = call_tool_client_message::Message::Cancel(CancelCall::default());
    let outbound = futures::stream::iter([CallToolClientMessage { message: Some(cancel) }]);
    let status = client.stream_call_tool(outbound).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("start"));
}

#[tokio::test]
async fn reflection_v1_lists_the_services_and_serves_their_descriptors() {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let probe = Arc::new(BlockingProbe::default());
    let server = server("", &probe).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ServerReflectionClient::new(channel);
    let requests = [
        MessageRequest::ListServices(String::new()),
        MessageRequest::FileContainingSymbol("toolmesh.v1.ToolService".into()),
    ]
    .map(|m| ServerReflectionRequest { host: String::new(), message_request: Some(m) });
    let mut responses =
        client.server_reflection_info(futures::stream::iter(requests)).await.unwrap().into_inner();

    let Some(MessageResponse::ListServicesResponse(list)) =
        responses.message().await.unwrap().unwrap().message_response
    else {
        panic!("a service list")
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    for expected in
        ["toolmesh.v1.ToolService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"]
    {
        assert!(names.contains(&expected), "{expected} in {names:?}");
    }
    let Some(MessageResponse::FileDescriptorResponse(files)) =
        responses.message().await.unwrap().unwrap().message_response
    else {
        panic!("a file descriptor")
    };
    let file =
        prost_types::FileDescriptorProto::decode(&files.file_descriptor_proto[0][..]).unwrap();
    assert_eq!(file.package(), "toolmesh.v1");
    assert!(file.service.iter().any(|s| s.name() == "ToolService"));
}

#[tokio::test]
async fn search_tools_ranks_the_live_catalog() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("", &probe).await;
    let client = server.client().await;
    let search = |query: &str, source_name: &str| {
        let mut client = client.clone();
        let request = toolmesh_proto::v1::SearchToolsRequest {
            query: query.into(),
            top_k: 3,
            source_name: source_name.into(),
            ..Default::default()
        };
        async move { client.search_tools(request).await.map(|r| r.into_inner()) }
    };
    // The first start embeds the tools in the background at the lowest priority: beside the
    // other tests on a busy machine that can take seconds.
    let found = eventually(Duration::from_secs(60), || async {
        let response = search("record a reasoning step before acting", "").await.unwrap();
        (response.index_complete
            && response.hits.first().map(|h| h.tool.as_ref().unwrap().name.as_str())
                == Some("think"))
        .then_some(response)
    })
    .await
    .expect("think ranks first once the index is complete");
    // Without a policy the index is counted: every tool of the catalog, each with its vector.
    let catalog = server.app.registry().snapshot().len() as u64;
    assert_eq!((found.indexed_tools, found.embedded_tools), (catalog, catalog));
    assert!(
        found.ranking.starts_with("convex[dense=0.5](bm25, minilm"),
        "hybrid ranking with the real model: {}",
        found.ranking
    );
    assert!(found.hits.len() <= 3);
    assert!(found.hits.windows(2).all(|w| w[0].score >= w[1].score), "best first");
    let think = found.hits[0].tool.as_ref().unwrap();
    assert!(think.input_schema_json.contains("thought"), "hits carry the full definition");

    let filtered = search("record a reasoning step", "embedded").await.unwrap();
    assert!(
        filtered
            .hits
            .iter()
            .all(|h| h.tool.as_ref().unwrap().source.as_ref().unwrap().name == "embedded")
    );
    let empty = search("  ", "").await.unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument);

    // The index follows the catalog: a tool added by a reload is found, then forgotten.
    let config = r#"
[[tools.command]]
name = "word_count"
description = "Counts the words of a text document."
command = "/usr/bin/wc"
"#;
    server.app.reload(&TestServer::config(config).unwrap()).await.unwrap();
    let added = eventually(Duration::from_secs(5), || async {
        let response = search("count the words in my document", "").await.unwrap();
        response.hits.iter().any(|h| h.tool.as_ref().unwrap().name == "word_count").then_some(())
    })
    .await;
    assert!(added.is_some(), "a new tool is searchable");
    server.app.reload(&TestServer::config("").unwrap()).await.unwrap();
    let removed = eventually(Duration::from_secs(5), || async {
        let response = search("count the words in my document", "").await.unwrap();
        (!response.hits.iter().any(|h| h.tool.as_ref().unwrap().name == "word_count")).then_some(())
    })
    .await;
    assert!(removed.is_some(), "a removed tool is purged");
}

/// A query beyond `search.max_query_bytes` (4096 by default) — a whole dialogue an agent
/// passed on — is searched by its beginning, and the answer says how much was cut, through
/// SearchTools and searchTools alike.
#[tokio::test]
async fn a_long_query_is_searched_by_its_beginning_and_the_cut_reported() {
    let probe = Arc::new(BlockingProbe::default());
    let config = "[[tools.command]]\nname = \"word_count\"\ndescription = \"Counts the words of a text document.\"\ncommand = \"/usr/bin/wc\"\n";
    let server = server(config, &probe).await;
    let mut client = server.client().await;
    // 18.7 KB, with a multi-byte character across the limit.
    let long = format!("count the words {}xé{}", "a ".repeat(2039), "talk ".repeat(2900));
    assert!(!long.is_char_boundary(4096), "the cut falls inside a character");
    let search = |query: &str| toolmesh_proto::v1::SearchToolsRequest {
        query: query.into(),
        ..Default::default()
    };
    // The index takes the tools in after the start.
    let short = eventually(Duration::from_secs(30), || {
        let mut client = client.clone();
        async move {
            let short = client.search_tools(search("count the words")).await.ok()?.into_inner();
            short.index_complete.then_some(short)
        }
    })
    .await
    .expect("the index takes in the catalog");
    assert_eq!(short.query_bytes_cut, 0);
    let answer = client.search_tools(search(&long)).await.expect("a long query is searched");
    let answer = answer.into_inner();
    assert_eq!(answer.query_bytes_cut as usize, long.len() - 4095);
    assert_eq!(answer.hits[0].tool.as_ref().unwrap().name, "word_count", "{answer:?}");

    let meta = call(&mut client, "searchTools", json!({"query": long})).await.unwrap();
    let structured = structured(&meta);
    let cut = structured["queryCut"].as_str().unwrap();
    assert!(cut.contains("first 4095 bytes"), "{cut}");
    assert_eq!(structured["tools"][0]["name"], "word_count");
}

/// Sends raw bytes as the request message of `method`, for requests no proper client sends.
async fn raw_call(server: &TestServer, method: &'static str, message: Vec<u8>) -> tonic::Status {
    #[derive(Clone, Default)]
    struct RawCodec;
    struct RawEncoder;
    struct RawDecoder;
    impl tonic::codec::Codec for RawCodec {
        type Encode = Vec<u8>;
        type Decode = Vec<u8>;
        type Encoder = RawEncoder;
        type Decoder = RawDecoder;
        fn encoder(&mut self) -> RawEncoder {
            RawEncoder
        }
        fn decoder(&mut self) -> RawDecoder {
            RawDecoder
        }
    }
    impl tonic::codec::Encoder for RawEncoder {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn encode(
            &mut self,
            item: Vec<u8>,
            buf: &mut tonic::codec::EncodeBuf<'_>,
        ) -> Result<(), tonic::Status> {
            bytes::BufMut::put_slice(buf, &item);
            Ok(())
        }
    }
    impl tonic::codec::Decoder for RawDecoder {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn decode(
            &mut self,
            buf: &mut tonic::codec::DecodeBuf<'_>,
        ) -> Result<Option<Vec<u8>>, tonic::Status> {
            Ok(Some(bytes::Buf::copy_to_bytes(buf, bytes::Buf::remaining(buf)).to_vec()))
        }
    }
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel).max_encoding_message_size(usize::MAX);
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static(method);
    grpc.unary(tonic::Request::new(message), path, RawCodec).await.unwrap_err()
}

/// Hostile input gets the right status and is never echoed whole: malformed protobuf is
/// INVALID_ARGUMENT (not INTERNAL), an oversize message RESOURCE_EXHAUSTED (not
/// OUT_OF_RANGE), and huge names and values come back cut.
#[tokio::test]
async fn hostile_requests_get_short_messages_and_the_right_codes() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("", &probe).await;
    let mut client = server.client().await;

    let huge = "n".repeat(3 << 20);
    let unknown = call(&mut client, &huge, json!({})).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    assert!(unknown.message().len() < 300, "{} bytes", unknown.message().len());
    assert!(unknown.message().contains(&format!("{} bytes", huge.len())), "{}", unknown.message());
    let mut in_profile = request("echo", json!({}));
    in_profile.profile = huge.clone();
    let profile = client.call_tool(in_profile).await.unwrap_err();
    assert_eq!(profile.code(), Code::InvalidArgument);
    assert!(profile.message().len() < 400, "{} bytes", profile.message().len());

    // A value that fails the schema is quoted in the violation, but only its start.
    let invalid =
        call(&mut client, "think", json!({"title": [huge], "thought": "x"})).await.unwrap_err();
    assert_eq!(invalid.code(), Code::InvalidArgument);
    assert!(invalid.message().len() < 2000, "{} bytes", invalid.message().len());
    let details = invalid.get_details_bad_request().unwrap();
    assert_eq!(details.field_violations[0].field, "/title");
    assert!(details.field_violations[0].description.len() < 400);

    for method in ["/toolmesh.v1.ToolService/CallTool", "/toolmesh.v1.ToolService/SearchTools"] {
        let malformed = raw_call(&server, method, vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]).await;
        assert_eq!(malformed.code(), Code::InvalidArgument, "{method}: {malformed:?}");
        let oversize = raw_call(&server, method, vec![0; 5 << 20]).await;
        assert_eq!(oversize.code(), Code::ResourceExhausted, "{method}: {oversize:?}");
        assert!(oversize.message().contains("4194304"), "{}", oversize.message());
    }

    // The same limit holds for the messages of a stream.
    let start = request("echo", json!({"blob": "b".repeat(5 << 20)}));
    let outbound = futures::stream::iter([CallToolClientMessage {
        message: Some(call_tool_client_message::Message::Start(start)),
    }]);
    let streamed = async {
        let mut stream = client.stream_call_tool(outbound).await?.into_inner();
        while stream.message().await?.is_some() {}
        Ok::<_, tonic::Status>(())
    };
    let status = streamed.await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");

    // The server is unharmed.
    call(&mut client, "echo", json!({"ok": true})).await.unwrap();
}

/// A client that stops reading its stream costs bounded memory: progress is coalesced to
/// the latest, partial outputs hold the tool back, and a reader that goes cancels the call.
#[tokio::test]
async fn a_stalled_reader_gets_the_latest_progress_and_holds_back_partials() {
    let flood = Arc::new(toolmesh_e2e::tools::FloodProbe::default());
    let tools: Vec<LocalToolInstall> =
        vec![(Arc::new(toolmesh_e2e::tools::FloodTool(flood.clone())), ToolLimits::default())];
    let server = TestServer::start("", AppOptions { tools, ..Default::default() }).await.unwrap();
    let mut client = server.client().await;

    // 20,000 reports of 2 KB while nobody reads: the reader later gets the last of them,
    // not 40 MB of history.
    let start = request("flood", json!({"kind": "progress", "count": 20_000}));
    let (_tx, mut stream) = open_stream(&mut client, start).await;
    eventually(Duration::from_secs(30), || async {
        (flood.finished.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await
    .expect("progress never holds the tool back");
    let mut progress = Vec::new();
    let mut result = None;
    while let Some(message) = stream.message().await.unwrap() {
        match message.message.unwrap() {
            Message::Progress(p) => progress.push(p.progress),
            Message::Result(r) => result = Some(r),
            _ => {}
        }
    }
    assert_eq!(text(&result.expect("a result")), "flooded");
    assert!(progress.len() < 2_000, "{} progress messages reached the reader", progress.len());
    assert_eq!(progress.last(), Some(&20_000.0), "the latest progress wins");
    assert!(progress.windows(2).all(|w| w[0] < w[1]), "in order");

    // Partial outputs: the tool is held to its reader's pace.
    let start = request("flood", json!({"kind": "partial"}));
    let (tx, stream) = open_stream(&mut client, start).await;
    let reported = || flood.reported.load(Ordering::SeqCst);
    let settled = eventually(Duration::from_secs(20), || async {
        let before = reported();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after = reported();
        (after == before && after > 20_000).then_some(after)
    })
    .await
    .expect("the tool stops once the buffers are full");
    // What the stream holds: the tool's queue (16), the outbound buffer (64) and the
    // client's HTTP/2 receive window (about 2 MB with tonic's defaults).
    let held = settled - 20_000;
    assert!(held < 4_000, "{held} partial outputs of 2 KB were accepted for a stalled reader");

    // The reader goes: the call is cancelled.
    drop(stream);
    drop(tx);
    eventually(Duration::from_secs(10), || async {
        (flood.dropped.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await
    .expect("the call of a reader that went is cancelled");
}

/// Opens a raw HTTP/2 connection: the preface and an empty SETTINGS frame.
async fn raw_http2(server: &TestServer) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut socket = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    socket.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    socket.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    socket
}

/// Reads HTTP/2 frames until the server closes the connection; returns them as
/// (type, payload).
async fn frames_until_closed(socket: &mut tokio::net::TcpStream) -> Vec<(u8, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut frames = Vec::new();
    let mut header = [0u8; 9];
    while socket.read_exact(&mut header).await.is_ok() {
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0; len];
        if socket.read_exact(&mut payload).await.is_err() {
            break;
        }
        frames.push((header[3], payload));
    }
    frames
}

/// The server announces the shipped per-connection stream limit, and a connection with no
/// call for `idle_timeout_ms` is closed, while one with a call in flight is not.
#[tokio::test]
async fn connections_announce_a_stream_limit_and_idle_ones_are_closed() {
    let probe = Arc::new(BlockingProbe::default());
    let defaults = server("", &probe).await;
    let mut socket = raw_http2(&defaults).await;
    let mut header = [0u8; 9];
    tokio::io::AsyncReadExt::read_exact(&mut socket, &mut header).await.unwrap();
    assert_eq!(header[3], 4, "the server's first frame is SETTINGS");
    let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    let mut settings = vec![0; len];
    tokio::io::AsyncReadExt::read_exact(&mut socket, &mut settings).await.unwrap();
    let announced: Vec<(u16, u32)> = settings
        .chunks_exact(6)
        .map(|s| (u16::from_be_bytes([s[0], s[1]]), u32::from_be_bytes([s[2], s[3], s[4], s[5]])))
        .collect();
    assert!(announced.contains(&(3, 256)), "SETTINGS_MAX_CONCURRENT_STREAMS: {announced:?}");

    let probe = Arc::new(BlockingProbe::default());
    let short = server("[server]\nidle_timeout_ms = 300\n", &probe).await;
    let mut idle = raw_http2(&short).await;
    tokio::time::timeout(Duration::from_secs(10), frames_until_closed(&mut idle))
        .await
        .expect("an idle connection is closed");

    // A call that outlasts the idle timeout keeps its connection.
    let mut client = short.client().await;
    let call = tokio::spawn(async move { client.call_tool(request("block", json!({}))).await });
    eventually(Duration::from_secs(5), || async {
        (probe.started.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    probe.gate.add_permits(1);
    let response = call.await.unwrap().expect("the call in flight was not cut off");
    assert_eq!(text(&response.into_inner()), "released");
}

/// A plain channel (one HTTP/2 connection) to `server`.
async fn channel(server: &TestServer) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Opens a health watch of the overall entry on `channel`.
async fn watch(
    channel: tonic::transport::Channel,
) -> Result<tonic::Streaming<tonic_health::pb::HealthCheckResponse>, tonic::Status> {
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let request = tonic_health::pb::HealthCheckRequest { service: String::new() };
    health.watch(request).await.map(tonic::Response::into_inner)
}

/// On the shipped defaults: one connection holds at most `max_watches_per_connection`
/// health watches and the server `max_watches`; one more is refused with
/// RESOURCE_EXHAUSTED naming the bound, a watch that ends frees its place, and callers get
/// through while every watch slot is taken.
#[tokio::test]
async fn health_watches_are_bounded_per_connection_and_in_all() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("", &probe).await;
    let shipped = TestServer::config("").unwrap().server;
    let (per_connection, limit) =
        (shipped.max_watches_per_connection.get(), shipped.max_watches.get());
    let mut channels = Vec::new();
    let mut watches = Vec::new();
    for _ in 0..limit / per_connection {
        let channel = channel(&server).await;
        for _ in 0..per_connection {
            let mut stream = watch(channel.clone()).await.expect("a watch within the bounds");
            let first = stream.message().await.unwrap().expect("the current status");
            assert_eq!(first.status(), tonic_health::ServingStatus::Serving.into());
            watches.push(stream);
        }
        channels.push(channel);
    }
    let one_more = watch(channels[0].clone()).await.expect_err("past the connection's bound");
    assert_eq!(one_more.code(), Code::ResourceExhausted, "{one_more:?}");
    assert!(one_more.message().contains("server.max_watches_per_connection"), "{one_more:?}");
    let fresh = channel(&server).await;
    let one_more = watch(fresh.clone()).await.expect_err("past the server's bound");
    assert_eq!(one_more.code(), Code::ResourceExhausted, "{one_more:?}");
    assert!(one_more.message().contains("server.max_watches "), "{one_more:?}");

    let mut client = server.client().await;
    client.list_tools(ListToolsRequest::default()).await.expect("a caller gets through");

    // A watch that ends gives its place back.
    drop(watches.pop());
    let again = eventually(Duration::from_secs(5), || {
        let fresh = fresh.clone();
        async move { watch(fresh).await.ok() }
    })
    .await;
    assert!(again.is_some(), "an ended watch frees its place");
}

/// A connection whose only streams are health watches is idle: it is closed at the idle
/// timeout, its watch with it (the shipped timeout is minutes; here it is 300 ms).
#[tokio::test]
async fn a_connection_with_only_health_watches_is_closed_when_idle() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("[server]\nidle_timeout_ms = 300\n", &probe).await;
    let mut stream = watch(channel(&server).await).await.unwrap();
    stream.message().await.unwrap().expect("the current status");
    let next = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("the watch ends with its connection");
    assert!(matches!(next, Err(_) | Ok(None)), "{next:?}");
}

/// With `max_connections = 64` (a quarter of it per client address, by default), 70
/// connections from one address hold 16 slots; the rest are closed at once, and a client
/// from another address gets through.
#[tokio::test]
async fn one_client_address_cannot_take_every_connection() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let probe = Arc::new(BlockingProbe::default());
    let server = server("[server]\nmax_connections = 64\n", &probe).await;
    let mut sockets = Vec::new();
    for _ in 0..70 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let mut stream = socket.connect(server.addr).await.unwrap();
        // A refused connection may be closed before the preface is written.
        let _ = stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
        sockets.push(stream);
    }
    // A held connection gets the server's SETTINGS and stays open; a refused one is
    // closed without a byte.
    let held = futures::future::join_all(sockets.iter_mut().map(|socket| async move {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(2), socket.read(&mut byte)).await;
        matches!(read, Ok(Ok(1)))
    }))
    .await;
    assert_eq!(held.iter().filter(|held| **held).count(), 16, "{held:?}");

    let mut client = server.client().await;
    client.list_tools(ListToolsRequest::default()).await.expect("another address gets through");
}

/// A provider as the next backends will be: it publishes a tool of its own source, and its
/// health, start, reload and stop are driven by the test.
struct FleetProvider {
    registry: toolmesh_registry::RegistryHandle,
    health: std::sync::Mutex<toolmesh_core::Health>,
    changed: tokio::sync::Notify,
    reloads: std::sync::atomic::AtomicUsize,
    stopped: std::sync::atomic::AtomicBool,
}

struct FleetBackend;

/// The provider's own configuration section, `[fleet]`: defined here, not in the config
/// crate.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FleetSection {
    tool: String,
}

impl FleetProvider {
    fn section(
        config: &toolmesh_config::Config,
    ) -> Result<FleetSection, toolmesh_core::ProviderError> {
        config
            .section::<FleetSection>("fleet")
            .map_err(|e| toolmesh_core::ProviderError::new("remote", e))?
            .ok_or_else(|| toolmesh_core::ProviderError::new("remote", "no [fleet] section"))
    }
}

#[async_trait::async_trait]
impl toolmesh_core::Backend for FleetBackend {
    async fn call(
        &self,
        _: toolmesh_core::CallContext,
        _: Value,
    ) -> Result<toolmesh_core::ToolOutput, toolmesh_core::BackendError> {
        Ok(toolmesh_core::ToolOutput {
            content: vec![toolmesh_core::ContentPart::Text("from the fleet".into())],
            ..Default::default()
        })
    }
}

#[async_trait::async_trait]
impl toolmesh_core::Provider<toolmesh_config::Config> for FleetProvider {
    fn kind(&self) -> &'static str {
        "remote"
    }

    fn section(&self) -> Option<&'static str> {
        Some("fleet")
    }

    async fn start(
        &self,
        config: &toolmesh_config::Config,
    ) -> Result<(), toolmesh_core::ProviderError> {
        let section = Self::section(config)?;
        let source = toolmesh_core::ToolSource {
            kind: toolmesh_core::SourceKind::Remote,
            name: "fleet".into(),
        };
        let spec = toolmesh_core::ToolSpec::new(
            section.tool,
            "Pings the fleet.",
            json!({"type": "object"}),
            source,
        );
        let entry = toolmesh_registry::ToolEntry::new(spec, Arc::new(FleetBackend))
            .map_err(|e| toolmesh_core::ProviderError::new("remote", e))?;
        self.registry
            .register(entry)
            .await
            .map_err(|e| toolmesh_core::ProviderError::new("remote", e))?;
        Ok(())
    }

    async fn reload(
        &self,
        config: &toolmesh_config::Config,
    ) -> Result<(), toolmesh_core::ProviderError> {
        Self::section(config)?;
        self.reloads.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn health(&self) -> Vec<(String, toolmesh_core::Health)> {
        vec![("fleet".into(), self.health.lock().unwrap().clone())]
    }

    async fn health_changed(&self) {
        self.changed.notified().await;
    }

    async fn stop(&self, _: Duration) {
        self.stopped.store(true, Ordering::SeqCst);
    }
}

/// One provider more is one line of wiring: the app starts it with its own configuration
/// section, publishes its health to gRPC health (`toolmesh.<kind>.<name>`) and to
/// ListTools, hands it every reload, and stops it.
#[tokio::test]
async fn a_provider_is_started_watched_listed_reloaded_and_stopped_like_the_built_in_ones() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let (made_tx, made_rx) = std::sync::mpsc::channel::<Arc<FleetProvider>>();
    let factory: toolmesh::ProviderFactory = Box::new(move |registry| {
        let provider = Arc::new(FleetProvider {
            registry: registry.clone(),
            health: std::sync::Mutex::new(toolmesh_core::Health::up()),
            changed: tokio::sync::Notify::new(),
            reloads: Default::default(),
            stopped: Default::default(),
        });
        made_tx.send(provider.clone()).unwrap();
        provider
    });
    let section = "[fleet]\ntool = \"fleet_ping\"\n";
    let server =
        TestServer::start(section, AppOptions { providers: vec![factory], ..Default::default() })
            .await
            .unwrap();
    let fleet = made_rx.recv().unwrap();

    let status = |service: &'static str| server.health(service);
    for service in ["toolmesh.remote.fleet", "toolmesh.local.workers", "toolmesh.search.index"] {
        assert_eq!(status(service).await, Some(ServingStatus::Serving), "{service}");
    }
    let client = server.client().await;
    let listed = || {
        let mut client = client.clone();
        async move {
            let request = ListToolsRequest { source_name: "fleet".into(), ..Default::default() };
            let tools = client.list_tools(request).await.unwrap().into_inner().tools;
            tools.into_iter().next().and_then(|tool| tool.source).unwrap()
        }
    };
    let source = listed().await;
    assert_eq!((source.kind(), source.available), (SourceKind::Remote, true));
    assert_eq!(text(&server.call("fleet_ping", json!({})).await.unwrap()), "from the fleet");

    *fleet.health.lock().unwrap() = toolmesh_core::Health::down("draining");
    fleet.changed.notify_one();
    let down = eventually(Duration::from_secs(5), || async {
        (status("toolmesh.remote.fleet").await == Some(ServingStatus::NotServing)).then_some(())
    })
    .await;
    assert!(down.is_some(), "gRPC health follows the provider");
    let source = listed().await;
    assert_eq!((source.available, source.status.as_str()), (false, "draining"));

    // Its section is its own: parsed into its type, misspelt keys and sections refused.
    server.app.reload(&TestServer::config(section).unwrap()).await.unwrap();
    assert_eq!(fleet.reloads.load(Ordering::SeqCst), 1);
    let typo = TestServer::config("[fleet]\ntol = \"x\"\n").unwrap();
    let error = format!("{:#}", server.app.reload(&typo).await.unwrap_err());
    assert!(error.contains("test.toml") && error.contains("fleet.tol"), "{error}");
    let unknown = TestServer::config(&format!("{section}[flet]\ntool = \"x\"\n")).unwrap();
    let error = format!("{:#}", server.app.reload(&unknown).await.unwrap_err());
    assert!(error.contains("flet") && error.contains("unknown section"), "{error}");
    assert_eq!(fleet.reloads.load(Ordering::SeqCst), 1, "refused before any provider ran");

    server.app.shutdown().await;
    assert!(fleet.stopped.load(Ordering::SeqCst), "stopped with the app");
}

#[tokio::test]
async fn a_restart_on_the_same_data_embeds_no_tool_again_and_ranks_alike() {
    let data = tempfile::tempdir().unwrap();
    let described = |description: &str| {
        format!(
            "[[tools.command]]\nname = \"word_count\"\ndescription = \"{description}\"\ncommand = \"/usr/bin/wc\"\n"
        )
    };
    let config = described("Counts the words of a text document.");
    let settled = |server: &TestServer| {
        let search = server.app.search();
        search.version() > 0 && search.indexed() > 0 && search.embedded() == search.indexed()
    };
    let top = |server: &TestServer| {
        let search = server.app.search().clone();
        async move {
            let hits = search.search("record a reasoning step before acting", 3, |_| true).await;
            hits.unwrap().into_iter().map(|h| h.tool.spec.name.clone()).collect::<Vec<_>>()
        }
    };

    let first = TestServer::start_in(&config, AppOptions::default(), data.path()).await.unwrap();
    eventually(Duration::from_secs(60), || async { settled(&first).then_some(()) })
        .await
        .expect("every tool embedded");
    let tools = first.app.search().indexed();
    // A fresh data directory: every tool text is embedded once.
    assert_eq!(first.app.search().embeddings_made() as usize, tools);
    let ranked = top(&first).await;
    assert_eq!(ranked[0], "think");
    first.stop().await.unwrap();

    let second = TestServer::start_in(&config, AppOptions::default(), data.path()).await.unwrap();
    eventually(Duration::from_secs(10), || async {
        (settled(&second) && second.app.search().indexed() == tools).then_some(())
    })
    .await
    .expect("the index caught up from the store");
    assert_eq!(second.app.search().embeddings_made(), 0, "nothing is embedded again");
    assert_eq!(top(&second).await, ranked);
    second.stop().await.unwrap();

    // A description changed while nothing ran: its new text is embedded, and the point of
    // the old one does not stay behind in the store.
    let changed = described("Tallies lines, words and bytes of a file.");
    let third = TestServer::start_in(&changed, AppOptions::default(), data.path()).await.unwrap();
    eventually(Duration::from_secs(30), || async {
        (settled(&third) && third.app.search().indexed() == tools).then_some(())
    })
    .await
    .expect("the index caught up");
    let search = third.app.search();
    assert_eq!(search.embeddings_made(), 1, "only the changed text is embedded");
    // Swept once the catalog has been still for a second.
    let points = || async { search.store().count(search.collection(), None).await.unwrap() };
    let swept = eventually(Duration::from_secs(10), || async {
        (points().await as usize == tools).then_some(())
    })
    .await;
    assert!(swept.is_some(), "one point per tool, none of an old text: {}", points().await);
}

const KNOWLEDGE: &str = r#"
[[knowledge.collections]]
name = "docs"
description = "The product handbook: installing, billing and support."
filter_fields = ["lang"]
"#;

fn knowledge_document(
    id: &str,
    text: &str,
    markdown: bool,
    lang: &str,
) -> toolmesh_proto::v1::Document {
    toolmesh_proto::v1::Document {
        id: id.into(),
        text: text.into(),
        format: if markdown {
            toolmesh_proto::v1::DocumentFormat::Markdown
        } else {
            toolmesh_proto::v1::DocumentFormat::Text
        } as i32,
        metadata_json: json!({ "lang": lang }).to_string(),
    }
}

async fn knowledge_client(
    server: &TestServer,
) -> toolmesh_proto::v1::knowledge_service_client::KnowledgeServiceClient<
    toolmesh::client::Connection,
> {
    let channel = toolmesh::client::channel(&server.addr.to_string(), None).await.unwrap();
    toolmesh_proto::v1::knowledge_service_client::KnowledgeServiceClient::new(channel)
}

async fn ingest(
    server: &TestServer,
    collection: &str,
    documents: Vec<toolmesh_proto::v1::Document>,
) -> Result<toolmesh_proto::v1::IngestResponse, tonic::Status> {
    let request = toolmesh_proto::v1::IngestRequest { collection: collection.into(), documents };
    let mut client = knowledge_client(server).await;
    client.ingest(futures::stream::iter([request])).await.map(tonic::Response::into_inner)
}

/// 12,000 documents with long ids in one stream: the answer counts them and names the
/// first failures only, so that it stays far below a client's 4 MiB limit.
#[tokio::test]
async fn an_ingestion_answer_counts_documents_and_names_only_the_first_failures() {
    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start_in(KNOWLEDGE, AppOptions::default(), data.path()).await.unwrap();
    let long = "x".repeat(500);
    let mut messages: Vec<_> = (0..4)
        .map(|batch| toolmesh_proto::v1::IngestRequest {
            collection: "docs".into(),
            documents: (0..3_000)
                .map(|i| knowledge_document(&format!("{batch}-{i:04}-{long}"), " ", false, "en"))
                .collect(),
        })
        .collect();
    messages[3].documents.push(knowledge_document(
        "good.txt",
        "Reset it from the login page.",
        false,
        "en",
    ));
    let mut client = knowledge_client(&server).await;
    let answer = client.ingest(futures::stream::iter(messages)).await.unwrap().into_inner();
    assert_eq!((answer.ingested, answer.failed), (1, 12_000), "counted");
    assert_eq!(answer.results.len(), 100, "the first failures are named");
    assert!(answer.results[0].id.starts_with("0-0000-") && !answer.results[0].error.is_empty());
    let bytes = prost::Message::encoded_len(&answer);
    assert!(bytes < 64 << 10, "the answer is {bytes} bytes");
}

/// 120 "words" of 15,000 characters (a data URI, minified code) are a few tokens each to
/// the model: chunks are cut by bytes too, and a search answer stays small.
#[tokio::test]
async fn chunks_and_search_answers_are_bounded_in_bytes() {
    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start_in(KNOWLEDGE, AppOptions::default(), data.path()).await.unwrap();
    let word = "QUJD".repeat(3_750);
    let blob = vec![word.as_str(); 120].join(" ");
    let text = format!("The logo of the release notes, inline: {blob}");
    let ingested = ingest(&server, "docs", vec![knowledge_document("logo.md", &text, false, "en")])
        .await
        .unwrap();
    assert_eq!(ingested.failed, 0, "{ingested:?}");
    assert!(ingested.chunks >= 400, "cut by bytes: {} chunks", ingested.chunks);
    let answer = server
        .call("search_docs", json!({"query": "release notes logo", "top_k": 50}))
        .await
        .unwrap();
    let bytes = prost::Message::encoded_len(&answer);
    assert!(bytes < 600 << 10, "the answer is {bytes} bytes");
    let found = toolmesh_e2e::passages(&answer);
    assert!(
        !found.is_empty() && found.iter().all(|(_, text)| text.len() <= 4096),
        "{}",
        found.len()
    );
}

/// The passages of a knowledge search, as (document id, text).
async fn passages(server: &TestServer, arguments: Value) -> Vec<(String, String)> {
    toolmesh_e2e::passages(&server.call("search_docs", arguments).await.unwrap())
}

#[tokio::test]
async fn knowledge_is_ingested_found_replaced_deleted_and_kept_across_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start_in(KNOWLEDGE, AppOptions::default(), data.path()).await.unwrap();
    let install = "# Installing\n\nDownload the installer and run it; the setup wizard asks for a licence key.\n\n## Upgrades\n\nUpgrades keep your settings.";
    let ingested = ingest(
        &server,
        "docs",
        vec![
            knowledge_document("install.md", install, true, "en"),
            knowledge_document(
                "billing.txt",
                "Invoices are sent monthly by email. Refunds take five days.",
                false,
                "en",
            ),
            knowledge_document(
                "support.md",
                "# Support\n\nOpen a ticket; we answer within a day.",
                true,
                "de",
            ),
        ],
    )
    .await
    .unwrap();
    assert_eq!((ingested.ingested, ingested.failed), (3, 0), "{ingested:?}");
    assert!(ingested.chunks >= 3 && ingested.results.is_empty(), "{ingested:?}");

    // The collection's tool is in the catalog, read-only, searched like any tool.
    let tool = server.app.registry().resolve("search_docs").expect("the collection's tool");
    assert_eq!(tool.spec.annotations.read_only, Some(true));
    let found = passages(&server, json!({"query": "how do I install it with a licence key"})).await;
    assert_eq!(found[0].0, "install.md", "{found:?}");
    let response = server
        .call("search_docs", json!({"query": "refund of an invoice", "top_k": 1}))
        .await
        .unwrap();
    let text = text(&response);
    assert!(text.starts_with("[1] billing.txt (chunk 0, score"), "{text}");
    // A filter on a metadata field.
    let german = passages(&server, json!({"query": "ticket", "filter": {"lang": "de"}})).await;
    assert!(!german.is_empty() && german.iter().all(|(id, _)| id == "support.md"), "{german:?}");

    // Re-ingesting a document replaces it whole: its old text is gone.
    let changed = "# Removing\n\nUninstall from the control panel.";
    ingest(&server, "docs", vec![knowledge_document("install.md", changed, true, "en")])
        .await
        .unwrap();
    let found =
        passages(&server, json!({"query": "setup wizard licence key installer", "top_k": 10}))
            .await;
    assert!(found.iter().all(|(_, text)| !text.contains("wizard")), "{found:?}");
    assert!(found.iter().filter(|(id, _)| id == "install.md").count() <= 1);

    // Deleting a document leaves nothing of it.
    let mut client = knowledge_client(&server).await;
    let deleted = client
        .delete(toolmesh_proto::v1::DeleteRequest {
            collection: "docs".into(),
            document_ids: vec!["billing.txt".into(), "never-there".into()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(deleted.deleted_chunks, 1);
    assert_eq!(deleted.not_found, ["never-there"]);
    let found =
        passages(&server, json!({"query": "invoices refunds monthly email", "top_k": 10})).await;
    assert!(found.iter().all(|(id, _)| id != "billing.txt"), "{found:?}");

    let listed = client
        .list_collections(toolmesh_proto::v1::ListCollectionsRequest {})
        .await
        .unwrap()
        .into_inner();
    let docs = &listed.collections[0];
    assert_eq!(
        (docs.name.as_str(), docs.tool.as_str(), docs.documents),
        ("docs", "search_docs", 2)
    );
    assert!(docs.chunks >= 2 && docs.store.starts_with("embedded at "), "{docs:?}");
    server.stop().await.unwrap();

    // A restart finds the documents where they were.
    let server = TestServer::start_in(KNOWLEDGE, AppOptions::default(), data.path()).await.unwrap();
    let found = passages(&server, json!({"query": "uninstall from the control panel"})).await;
    assert_eq!(found[0].0, "install.md", "{found:?}");
}

#[tokio::test]
async fn knowledge_refuses_bad_input_clearly_and_loses_nothing_else() {
    let server = TestServer::start(KNOWLEDGE, AppOptions::default()).await.unwrap();
    let big = "word ".repeat(3 << 19); // 7.5 MiB is over a message; 2.5 MiB over the document limit
    let results = ingest(
        &server,
        "docs",
        vec![
            knowledge_document("empty.md", " \n ", true, "en"),
            knowledge_document("binary.txt", "abc\0def", false, "en"),
            knowledge_document("big.txt", &big[..(5 << 19)], false, "en"),
            knowledge_document("good.txt", "Passwords are reset from the login page.", false, "en"),
            toolmesh_proto::v1::Document {
                metadata_json: "[1]".into(),
                ..knowledge_document("meta.txt", "x", false, "en")
            },
        ],
    )
    .await
    .unwrap();
    let by_id: std::collections::HashMap<&str, &str> =
        results.results.iter().map(|r| (r.id.as_str(), r.error.as_str())).collect();
    assert_eq!(by_id["empty.md"], "the document is empty");
    assert!(by_id["binary.txt"].contains("not text"), "{results:?}");
    assert!(by_id["big.txt"].contains("knowledge.max_document_bytes"), "{results:?}");
    assert!(by_id["meta.txt"].contains("metadata_json"), "{results:?}");
    assert!(!by_id.contains_key("good.txt"), "only failures are listed: {results:?}");
    assert_eq!((results.ingested, results.failed), (1, 4));
    let found = passages(&server, json!({"query": "reset my password"})).await;
    assert_eq!(found[0].0, "good.txt");

    // A message beyond the server's limit is refused at once.
    let refused = ingest(&server, "docs", vec![knowledge_document("huge.txt", &big, false, "en")])
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");

    let missing = ingest(&server, "nope", vec![knowledge_document("a.txt", "a", false, "en")])
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert!(
        missing.message().contains("no knowledge collection \"nope\" (collections: docs)"),
        "{missing:?}"
    );

    let unknown = server
        .call("search_docs", json!({"query": "password", "filter": {"team": "x"}}))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::InvalidArgument, "{unknown:?}");
    assert!(unknown.message().contains("\"team\""), "{unknown:?}");
    // Nothing else was lost.
    assert_eq!(passages(&server, json!({"query": "reset my password"})).await[0].0, "good.txt");
}

/// Collections in three stores: the default one, a named embedded one, and a named Qdrant
/// server that does not answer (nothing listens on 127.0.0.1:1).
const STORES: &str = r#"
[vector.stores.archive]
backend = "embedded"

[vector.stores.remote]
backend = "qdrant"
url = "http://127.0.0.1:1"

[[knowledge.collections]]
name = "docs"
description = "The product handbook."

[[knowledge.collections]]
name = "archive"
description = "Handbooks of retired products."
store = "archive"

[[knowledge.collections]]
name = "remote"
description = "Documents on a shared server."
store = "remote"
"#;

#[tokio::test]
async fn knowledge_collections_live_in_the_store_they_name_and_a_store_that_is_down_fails_alone() {
    use tonic_health::pb::health_check_response::ServingStatus;

    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start_in(STORES, AppOptions::default(), data.path()).await.unwrap();
    let results = ingest(
        &server,
        "archive",
        vec![knowledge_document("fax.md", "The fax gateway sends invoices by fax.", true, "en")],
    )
    .await
    .unwrap();
    assert_eq!((results.ingested, results.failed), (1, 0), "{results:?}");
    let docs = ingest(
        &server,
        "docs",
        vec![knowledge_document(
            "reset.txt",
            "Passwords are reset from the login page.",
            false,
            "en",
        )],
    )
    .await
    .unwrap();
    assert_eq!(docs.ingested, 1, "{docs:?}");

    // Each collection is in its own store: the archive's passages are not in docs.
    let archived = server.call("search_archive", json!({"query": "send an invoice by fax"})).await;
    let archived = archived.unwrap();
    assert!(text(&archived).contains("fax.md"), "{archived:?}");
    let in_docs = passages(&server, json!({"query": "send an invoice by fax"})).await;
    assert!(in_docs.iter().all(|(id, _)| id != "fax.md"), "{in_docs:?}");
    assert!(data.path().join("vector/stores/archive").is_dir());

    // The server that does not answer fails its collection's calls at once, naming it...
    let started = std::time::Instant::now();
    let down = server.call("search_remote", json!({"query": "anything"})).await.unwrap_err();
    assert_eq!(down.code(), Code::Unavailable, "{down:?}");
    assert!(down.message().contains("127.0.0.1:1"), "{down:?}");
    let refused =
        ingest(&server, "remote", vec![knowledge_document("a.txt", "Some text.", false, "en")])
            .await
            .unwrap();
    assert_eq!(refused.failed, 1, "{refused:?}");
    assert!(refused.results[0].error.contains("127.0.0.1:1"), "{refused:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    // ...and its health says so, while the other stores are up...
    let health = |service: &'static str| {
        let server = &server;
        async move { server.health(service).await }
    };
    let reported = eventually(Duration::from_secs(15), || async {
        (health("toolmesh.vector.remote").await == Some(ServingStatus::NotServing)).then_some(())
    })
    .await;
    assert!(reported.is_some(), "toolmesh.vector.remote is not serving");
    assert_eq!(health("toolmesh.vector.archive").await, Some(ServingStatus::Serving));
    assert_eq!(health("toolmesh.vector.embedded").await, Some(ServingStatus::Serving));

    // ...the listing shows every collection, the one down with the reason...
    let listed = knowledge_client(&server)
        .await
        .list_collections(toolmesh_proto::v1::ListCollectionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .collections;
    let by_name: std::collections::HashMap<&str, &toolmesh_proto::v1::CollectionInfo> =
        listed.iter().map(|c| (c.name.as_str(), c)).collect();
    assert_eq!((by_name["archive"].documents, by_name["archive"].error.as_str()), (1, ""));
    assert!(by_name["archive"].store.contains("stores/archive"), "{listed:?}");
    assert_eq!(by_name["docs"].documents, 1);
    assert!(by_name["remote"].error.contains("127.0.0.1:1"), "{listed:?}");
    assert!(by_name["remote"].store.starts_with("qdrant"), "{listed:?}");

    // ...and everything else keeps working.
    assert_eq!(passages(&server, json!({"query": "reset my password"})).await[0].0, "reset.txt");
    let echoed = server.call("echo", json!({"still": "here"})).await.unwrap();
    assert!(!echoed.is_error, "{echoed:?}");
}

#[tokio::test]
async fn a_collection_naming_a_store_that_is_not_configured_fails_the_start_naming_the_key() {
    let config = r#"
[[knowledge.collections]]
name = "docs"
description = "The handbook."
store = "archive"
"#;
    let Err(error) = TestServer::start(config, AppOptions::default()).await else {
        panic!("the server started with a collection in a store that is not configured");
    };
    let message = format!("{error:#}");
    assert!(message.contains("knowledge.collections[0].store"), "{message}");
    assert!(message.contains("no vector store \"archive\" (stores: default)"), "{message}");
}

/// Two routers on one Qdrant server (`QDRANT_URL`, a gRPC address such as
/// `http://localhost:6334`): the tools are embedded once between them, and what one ingests
/// the other finds, and no longer finds once the other deleted it.
#[tokio::test]
#[cfg_attr(not(qdrant_url), ignore = "QDRANT_URL is not set: no Qdrant server to test against")]
async fn two_routers_on_one_qdrant_server_share_the_tool_index_and_the_documents() {
    let url = std::env::var("QDRANT_URL").unwrap();
    // A collection of this run only: the server outlives it.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let collection = format!("shared_{}_{}", std::process::id(), nanos.as_nanos());
    let config = format!(
        "[vector]\nbackend = \"qdrant\"\nurl = \"{url}\"\n\n[[knowledge.collections]]\n\
         name = \"{collection}\"\ndescription = \"Documents both routers see.\"\n"
    );
    let settled = |server: &TestServer| {
        let search = server.app.search();
        search.version() > 0 && search.indexed() > 0 && search.embedded() == search.indexed()
    };
    let first = TestServer::start(&config, AppOptions::default()).await.unwrap();
    eventually(Duration::from_secs(60), || async { settled(&first).then_some(()) })
        .await
        .expect("the first router has every tool's vector");
    let second = TestServer::start(&config, AppOptions::default()).await.unwrap();
    eventually(Duration::from_secs(30), || async { settled(&second).then_some(()) })
        .await
        .expect("the second router has every tool's vector");
    let tools = first.app.search().indexed() as u64;
    assert_eq!(second.app.search().embeddings_made(), 0, "the second router embedded nothing");
    assert!(first.app.search().embeddings_made() <= tools);

    let document =
        knowledge_document("shared.txt", "The VPN is set up with the office key.", false, "en");
    let ingested = ingest(&first, &collection, vec![document]).await.unwrap();
    assert_eq!(ingested.ingested, 1, "{ingested:?}");
    let tool = format!("search_{collection}");
    let ids = |server| passage_ids(server, &tool, "set up the VPN");
    assert_eq!(ids(&second).await, ["shared.txt"], "the second router finds the first's document");
    let deleted = knowledge_client(&second)
        .await
        .delete(toolmesh_proto::v1::DeleteRequest {
            collection: collection.clone(),
            document_ids: vec!["shared.txt".into()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(deleted.deleted_chunks, 1, "{deleted:?}");
    assert!(ids(&first).await.is_empty(), "the first router no longer finds it");
}

/// The document ids of the passages `tool` finds for `query`, best first.
async fn passage_ids(server: &TestServer, tool: &str, query: &str) -> Vec<String> {
    let response = server.call(tool, json!({ "query": query })).await.unwrap();
    toolmesh_e2e::passages(&response).into_iter().map(|(id, _)| id).collect()
}

/// A call's nesting comes in `x-toolmesh-call-depth` metadata: up to the maximum depth it
/// runs (and an HTTP tool is told the depth of the calls it makes); past it, it is refused
/// with FAILED_PRECONDITION naming the depth, the limit and the parent call.
#[tokio::test]
async fn calls_past_the_maximum_depth_are_refused() {
    type Seen = std::sync::Arc<std::sync::Mutex<Vec<std::collections::HashMap<String, String>>>>;
    let seen = Seen::default();
    let recorded = seen.clone();
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move |headers: axum::http::HeaderMap| {
            let recorded = recorded.clone();
            async move {
                let headers = headers
                    .iter()
                    .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
                    .collect();
                recorded.lock().unwrap().push(headers);
                "ok"
            }
        }),
    );
    let upstream = toolmesh_e2e::serve_http(app).await;
    let config = format!(
        "[[tools.http]]\nname = \"hook\"\ndescription = \"calls a service\"\nurl = \"http://{upstream}/\"\n\
         allow_private_network = true\n"
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    let mut client = server.client().await;
    let call = |depth: &str, name: &str| {
        let mut request = tonic::Request::new(CallToolRequest {
            name: name.into(),
            arguments_json: "{}".into(),
            ..Default::default()
        });
        request.metadata_mut().insert("x-toolmesh-call-depth", depth.parse().unwrap());
        request.metadata_mut().insert("x-toolmesh-parent-call-id", "parent-1".parse().unwrap());
        request
    };
    assert!(!client.call_tool(call("3", "echo")).await.unwrap().into_inner().is_error);
    let status = client.call_tool(call("4", "echo")).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("nested 4 deep"), "{}", status.message());
    assert!(status.message().contains("parent-1"), "{}", status.message());
    let status = client.call_tool(call("deep", "echo")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());

    // The HTTP tool's service is told the depth of the calls it would make.
    let response = client.call_tool(call("2", "hook")).await.unwrap().into_inner();
    assert!(!response.is_error, "{response:?}");
    let headers = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(headers.get("x-toolmesh-call-depth").map(String::as_str), Some("3"));
    assert_eq!(headers.get("x-toolmesh-parent-call-id").map(String::len), Some(36));
}
