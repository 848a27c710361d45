//! Load-test pieces for `toolmesh bench --mcp`: an MCP echo server over streamable HTTP,
//! and a plain MCP client driving it directly, so that toolmesh in front of the same server
//! can be compared with a client that talks to it itself.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use rmcp::{
    ErrorData, RoleServer, ServerHandler, ServiceExt,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
        PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    },
    service::RequestContext,
    transport::{
        StreamableHttpClientTransport,
        streamable_http_client::StreamableHttpClientTransportConfig,
        streamable_http_server::{
            StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
        },
    },
};
use serde_json::json;
use tokio::net::TcpListener;

/// An MCP server with one tool, `echo`, that answers with its `message` argument.
#[derive(Debug, Clone, Copy, Default)]
pub struct EchoServer;

impl ServerHandler for EchoServer {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::default();
        let mut capabilities = ServerCapabilities::default();
        capabilities.tools = Some(Default::default());
        info.capabilities = capabilities;
        info
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = json!({"type": "object", "properties": {"message": {"type": "string"}}});
        let serde_json::Value::Object(schema) = schema else { unreachable!("an object literal") };
        let tool = Tool::new("echo", "Echoes its message.", Arc::new(schema));
        Ok(ListToolsResult::with_all_items(vec![tool]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let message = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("message"))
            .and_then(|m| m.as_str())
            .unwrap_or_default()
            .to_owned();
        Ok(CallToolResponse::Complete(CallToolResult::success(vec![ContentBlock::text(message)])))
    }
}

/// Serves [`EchoServer`] over streamable HTTP at `/mcp` on `listener`.
pub async fn serve_echo(listener: TcpListener) -> std::io::Result<()> {
    let service = StreamableHttpService::new(
        || Ok(EchoServer),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    axum::serve(listener, router).await
}

/// What [`direct_load`] measured.
#[derive(Debug, Default)]
pub struct DirectLoad {
    /// Latency of each successful call, in nanoseconds.
    pub latencies_ns: Vec<u64>,
    /// Calls that failed.
    pub errors: u64,
    /// The first failure.
    pub first_error: Option<String>,
    /// Time from the first call to the last answer.
    pub elapsed: Duration,
}

/// Drives `echo` at `url` from one MCP client connection (as toolmesh holds one per server)
/// with `concurrency` callers for `duration`.
pub async fn direct_load(
    url: &str,
    concurrency: usize,
    duration: Duration,
) -> Result<DirectLoad, String> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    config.max_concurrent_requests = 256;
    let client =
        ().serve(StreamableHttpClientTransport::from_config(config))
            .await
            .map_err(|e| format!("connecting to {url}: {e}"))?;
    let peer = client.peer().clone();
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let peer = peer.clone();
        tasks.push(tokio::spawn(async move {
            let mut load = DirectLoad::default();
            while Instant::now() < end {
                let mut params = CallToolRequestParams::new("echo");
                params.arguments = json!({"message": "hello"}).as_object().cloned();
                let sent = Instant::now();
                match peer.call_tool_once(params).await {
                    Ok(_) => load.latencies_ns.push(sent.elapsed().as_nanos() as u64),
                    Err(error) => {
                        load.errors += 1;
                        load.first_error.get_or_insert_with(|| error.to_string());
                    }
                }
            }
            load
        }));
    }
    let mut total = DirectLoad::default();
    for task in tasks {
        let load = task.await.map_err(|e| e.to_string())?;
        total.latencies_ns.extend(load.latencies_ns);
        total.errors += load.errors;
        total.first_error = total.first_error.or(load.first_error);
    }
    total.elapsed = start.elapsed();
    let _ = client.cancel().await;
    Ok(total)
}
