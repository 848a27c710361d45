//! Running the `toolmesh` and `toolmesh-bench` binaries, and reading what they print and serve.

#![allow(clippy::unwrap_used)] // Test helpers: a failed unwrap is a failed test.

use crate::{toolmesh_bench_bin, toolmesh_bin};
use serde_json::json;
use std::{process::Output, time::Duration};
use toolmesh_proto::v1::CallToolRequest;

/// Runs `toolmesh ARGS…`.
pub async fn run(args: &[&str]) -> Output {
    run_program(toolmesh_bin(), args).await
}

/// Runs `toolmesh-bench ARGS…`.
pub async fn bench(args: &[&str]) -> Output {
    run_program(toolmesh_bench_bin(), args).await
}

/// Runs `program ARGS…` without `RUST_LOG`, and waits for its output.
pub async fn run_program(program: std::path::PathBuf, args: &[&str]) -> Output {
    tokio::process::Command::new(program)
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .await
        .expect("run toolmesh")
}

/// What a process printed on its standard output.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// What a process printed on its standard error.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The names of every tool the server at `addr` lists.
pub async fn tool_names(addr: &str) -> Vec<String> {
    let mut client = toolmesh::client::connect(addr, None).await.unwrap();
    let (tools, _) = toolmesh::client::list_all(&mut client).await.unwrap();
    tools.into_iter().map(|t| t.name).collect()
}

/// The `grpcurl` to run (`TOOLMESH_TEST_GRPCURL`, else the one on the path).
pub fn grpcurl() -> String {
    std::env::var("TOOLMESH_TEST_GRPCURL").unwrap_or_else(|_| "grpcurl".into())
}

/// Ingests `documents` (id, text) into `docs` of the server at `addr`; returns how many the
/// answer acknowledged.
pub async fn ingest_documents(
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
pub async fn passages(addr: &str, query: &str) -> Vec<(String, String)> {
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

/// The tool index's counts at `addr`: (indexed, embedded), from a search's answer.
pub async fn index_counts(addr: &str) -> Option<(u64, u64)> {
    let mut client = toolmesh::client::connect(addr, None).await.ok()?;
    let request = toolmesh_proto::v1::SearchToolsRequest {
        query: "count".into(),
        top_k: 1,
        ..Default::default()
    };
    let answer = client.search_tools(request).await.ok()?.into_inner();
    Some((answer.indexed_tools, answer.embedded_tools))
}

/// The gRPC health of `service` at `addr`.
pub async fn health_of(addr: &str, service: &str) -> Option<i32> {
    let channel = toolmesh::client::channel(addr, None).await.ok()?;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let request = tonic_health::pb::HealthCheckRequest { service: service.into() };
    health.check(request).await.ok().map(|r| r.into_inner().status)
}

/// User plus system CPU time of process `pid` so far.
pub fn cpu_time(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat; here, after the name, 12 and 13.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}
