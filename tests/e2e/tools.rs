//! Tools over the gRPC API: listing, calls, streams of progress and partial outputs,
//! cancellation, deadlines, queues and the nesting depth.

use serde_json::{Value, json};
use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};
use tonic::Code;
use tonic_types::StatusExt;
use toolmesh::AppOptions;
use toolmesh_e2e::calls::{call, open_stream, request, server, structured};
use toolmesh_e2e::cli::{run, stderr, stdout};
use toolmesh_e2e::{BinaryServer, toolmesh_bin};
use toolmesh_e2e::{TestServer, eventually, text, tools::BlockingProbe};
use toolmesh_proto::v1::{
    CallToolClientMessage, CallToolRequest, CancelCall, ListToolsRequest, SourceKind,
    call_tool_client_message, call_tool_server_message::Message, content_part::Part,
};
use toolmesh_workers::{LocalToolInstall, ToolLimits};

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
