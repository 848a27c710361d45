//! Calls over the gRPC API against a [`TestServer`](crate::TestServer) with scripted tools.

#![allow(clippy::unwrap_used)] // Test helpers: a failed unwrap is a failed test.

use crate::{
    TestServer,
    tools::{BadOutputTool, BlockingProbe, BlockingTool, PanicTool, ProgressTool},
};
use serde_json::Value;
use std::{num::NonZeroUsize, sync::Arc};
use toolmesh::AppOptions;
use toolmesh_proto::v1::{
    CallToolClientMessage, CallToolRequest, CallToolResponse, call_tool_client_message,
    tool_service_client::ToolServiceClient,
};
use toolmesh_workers::{LocalToolInstall, ToolLimits};

/// Limits of `running` calls at once and `queue` waiting.
pub fn limits(running: usize, queue: usize) -> ToolLimits {
    ToolLimits { max_concurrency: NonZeroUsize::new(running), max_queue: queue }
}

/// A server with the scripted tools; `block` admits one running and one waiting call.
pub async fn server(toml: &str, probe: &Arc<BlockingProbe>) -> TestServer {
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

/// A `CallToolRequest` for `name` with `arguments`.
pub fn request(name: &str, arguments: Value) -> CallToolRequest {
    CallToolRequest {
        name: name.into(),
        arguments_json: arguments.to_string(),
        ..Default::default()
    }
}

/// Calls `name` with `arguments` through `CallTool`.
pub async fn call(
    client: &mut ToolServiceClient<toolmesh::client::Connection>,
    name: &str,
    arguments: Value,
) -> Result<CallToolResponse, tonic::Status> {
    client.call_tool(request(name, arguments)).await.map(tonic::Response::into_inner)
}

/// The structured result of a response, parsed.
pub fn structured(response: &CallToolResponse) -> Value {
    serde_json::from_str(response.structured_json.as_deref().expect("structured result")).unwrap()
}

/// Starts a `StreamCallTool` call whose client side stays open; returns the sender for
/// further client messages and the server's stream.
pub async fn open_stream(
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
