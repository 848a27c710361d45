//! The `toolmesh-bench` benchmarks run end to end on small inputs.

use serde_json::json;
use toolmesh_e2e::cli::{bench, stderr, stdout};

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
    let rows = [
        "direct MCP client",
        "plain HTTP clients",
        "gRPC through toolmesh",
        "MCP through toolmesh",
        "MCP to toolmesh's echo",
    ];
    for row in rows {
        let line = report
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("{row} in:\n{report}"));
        let columns: Vec<&str> = line[row.len()..].split_whitespace().collect();
        assert!(columns[0].parse::<f64>().unwrap() > 0.0, "calls: {line}");
        assert_eq!(columns[4], "0", "no errors: {line}");
        // Each process's CPU per call, read from /proc: toolmesh's where it is on the path,
        // the echo server's where it is.
        let toolmesh_on_path = !row.starts_with("direct") && !row.starts_with("plain");
        let server_on_path = row != "MCP to toolmesh's echo";
        for (column, on_path) in [(5, toolmesh_on_path), (6, server_on_path)] {
            match columns[column].parse::<f64>() {
                Ok(ms) => assert!(on_path && ms > 0.0 && ms < 50.0, "{line}"),
                Err(_) => assert!(!on_path && columns[column] == "-", "{line}"),
            }
        }
    }
    for derived in
        ["p50 added", "proxied calls/s/core", "through / plain HTTP", "endpoint / bare MCP"]
    {
        assert!(report.contains(derived), "{derived} in:\n{report}");
    }
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

/// One request of a plain HTTP/1.1 client on `stream`, written at once; returns the status,
/// the `mcp-session-id` header if any, and the body (chunked or not).
fn post(
    stream: &mut std::net::TcpStream,
    session: Option<&str>,
    body: &serde_json::Value,
) -> (u16, Option<String>, String) {
    use std::io::{BufRead as _, Read as _, Write as _};
    let body = body.to_string();
    let session = session.map(|id| format!("mcp-session-id: {id}\r\n")).unwrap_or_default();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-protocol-version: 2025-06-18\r\n\
         {session}content-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut reader = std::io::BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let status = line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (mut length, mut chunked, mut id) = (0, false, None);
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':').unwrap();
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().unwrap(),
            "transfer-encoding" => chunked = value.contains("chunked"),
            "mcp-session-id" => id = Some(value.trim().to_owned()),
            _ => {}
        }
    }
    let mut out = Vec::new();
    if chunked {
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            let size = usize::from_str_radix(line.trim(), 16).unwrap();
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).unwrap();
            if size == 0 {
                break;
            }
            out.extend_from_slice(&chunk[..size]);
        }
    } else {
        out.resize(length, 0);
        reader.read_exact(&mut out).unwrap();
    }
    (status, id, String::from_utf8(out).unwrap())
}

/// The MCP echo server the benchmarks put behind toolmesh answers a plain HTTP client
/// without Nagle's stall: with it, every answer's last small write waited for the client's
/// delayed ACK, about 40 ms a call.
#[tokio::test]
async fn the_mcp_echo_server_answers_a_plain_http_client_without_delay() {
    let mut child = toolmesh_e2e::spawn(
        tokio::process::Command::new(toolmesh_e2e::toolmesh_bench_bin())
            .arg("--mcp-echo-server")
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true),
    )
    .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(child.stdout.take().unwrap()));
    let line = lines.next_line().await.unwrap().unwrap();
    let addr = line.rsplit(' ').next().unwrap().to_owned();
    let timings = tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "plain", "version": "1"}}});
        let (status, session, body) = post(&mut stream, None, &initialize);
        assert_eq!(status, 200, "{body}");
        let session = session.expect("a session id");
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        assert_eq!(post(&mut stream, Some(&session), &initialized).0, 202);
        (1..=20)
            .map(|id| {
                let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                    "params": {"name": "echo", "arguments": {"message": "hi"}}});
                let started = std::time::Instant::now();
                let (status, _, body) = post(&mut stream, Some(&session), &call);
                assert!(status == 200 && body.contains("hi"), "{status} {body}");
                started.elapsed()
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let mut sorted = timings.clone();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    assert!(median < std::time::Duration::from_millis(20), "calls took {timings:?}");
    child.kill().await.unwrap();
}

#[tokio::test]
async fn bench_drives_any_mcp_endpoint_and_reads_its_cpu() {
    // A running toolmesh's MCP endpoint stands for any MCP server or gateway; no speed.
    let server = toolmesh_e2e::BinaryServer::start(&[], &[]).await.unwrap();
    let url = format!("http://{}/mcp", server.addr);
    let pid = server.pid().to_string();
    let args = ["--mcp-endpoint", &url, "--pid", &pid, "--arguments", r#"{"message":"hi"}"#];
    let timing = ["--concurrency", "2", "--duration", "0.4", "--warmup", "0.1", "--rounds", "2"];
    let output = bench(&[&args[..], &timing[..], &["--json"]].concat()).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(report["tool"], "echo", "{report}");
    assert_eq!(report["sample"]["errors"], 0, "{report}");
    assert!(report["sample"]["throughput"].as_f64().unwrap() > 0.0, "{report}");
    let cpu = report["cpu_ms"].as_f64().expect("the server's CPU per call");
    assert!(cpu > 0.0 && cpu < 50.0, "{report}");

    // A tool the endpoint does not have: every call fails, and the report says why.
    let missing = ["--mcp-endpoint", &url, "--tool", "nope"];
    let output = bench(&[&missing[..], &timing[..]].concat()).await;
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("first error"), "{}", stdout(&output));
}
