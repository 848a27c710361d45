//! Load-test pieces for `toolmesh-bench --mcp`: an MCP echo server over streamable HTTP,
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
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// Name of the tool that changes another tool's description (see [`EchoServer`]).
pub(crate) const TOUCH_TOOL: &str = "bench__touch";

/// Tools per `tools/list` page: the benchmark's 6,944 tools in one, a catalog of 100,000 in
/// pages of a few MB (one page of them all would be over the 16 MiB that an MCP client
/// takes in one event).
const PAGE: usize = 10_000;

/// An MCP server for load tests. It offers `echo` (answers with its `message` argument), or
/// the tools of a file (each answers with its arguments), plus [`TOUCH_TOOL`], which appends
/// `marker` to the description of tool `name` and announces `tools/list_changed`, so that
/// re-indexing after one change can be measured.
#[derive(Debug, Clone)]
pub(crate) struct EchoServer {
    tools: Arc<std::sync::RwLock<Vec<Tool>>>,
}

impl Default for EchoServer {
    fn default() -> Self {
        let schema = json!({"type": "object", "properties": {"message": {"type": "string"}}});
        EchoServer::with_tools(vec![Tool::new(
            "echo",
            "Echoes its message.",
            Arc::new(object(schema)),
        )])
    }
}

fn object(value: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    match value {
        serde_json::Value::Object(map) => map,
        _ => serde_json::Map::new(),
    }
}

impl EchoServer {
    /// Returns a server offering `tools` (and [`TOUCH_TOOL`]).
    pub(crate) fn with_tools(mut tools: Vec<Tool>) -> Self {
        let touch = json!({"type": "object", "required": ["name", "marker"],
                           "properties": {"name": {"type": "string"}, "marker": {"type": "string"}}});
        tools.push(Tool::new(
            TOUCH_TOOL,
            "Changes a tool's description (load tests).",
            Arc::new(object(touch)),
        ));
        EchoServer { tools: Arc::new(std::sync::RwLock::new(tools)) }
    }

    /// Returns `count` servers sharing out the tools of a JSON Lines file of
    /// `{"name", "description", "input_schema"}` objects: tool `i` on server `i % count`,
    /// [`TOUCH_TOOL`] on the first (it changes the first server's tools).
    pub(crate) fn from_file_shared(
        path: &std::path::Path,
        count: usize,
    ) -> std::io::Result<Vec<Self>> {
        let EchoServer { tools } = Self::from_file(path)?;
        let mut tools = std::mem::take(&mut *tools.write().unwrap_or_else(|e| e.into_inner()));
        let touch = tools.pop();
        let mut shares: Vec<Vec<Tool>> = vec![Vec::new(); count.max(1)];
        for (i, tool) in tools.into_iter().enumerate() {
            shares[i % count.max(1)].push(tool);
        }
        shares[0].extend(touch);
        Ok(shares
            .into_iter()
            .map(|tools| EchoServer { tools: Arc::new(std::sync::RwLock::new(tools)) })
            .collect())
    }

    /// Returns a server offering the tools of a JSON Lines file of
    /// `{"name", "description", "input_schema"}` objects.
    pub(crate) fn from_file(path: &std::path::Path) -> std::io::Result<Self> {
        let text = std::fs::read_to_string(path)?;
        let mut tools = Vec::new();
        for (number, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let value: serde_json::Value = serde_json::from_str(line).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}:{}: {e}", path.display(), number + 1),
                )
            })?;
            let name = value["name"].as_str().unwrap_or_default().to_owned();
            let description = value["description"].as_str().unwrap_or_default().to_owned();
            let mut schema = object(value["input_schema"].clone());
            schema.entry("type").or_insert_with(|| json!("object"));
            tools.push(Tool::new(name, description, Arc::new(schema)));
        }
        Ok(EchoServer::with_tools(tools))
    }
}

impl ServerHandler for EchoServer {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::default();
        let mut capabilities = ServerCapabilities::default();
        let mut tools = rmcp::model::ToolsCapability::default();
        tools.list_changed = Some(true);
        capabilities.tools = Some(tools);
        info.capabilities = capabilities;
        info
    }

    /// Lists the tools in pages of [`PAGE`], the cursor being the offset of the next page.
    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let start = match request.and_then(|r| r.cursor) {
            None => 0,
            Some(cursor) => cursor
                .parse::<usize>()
                .map_err(|_| ErrorData::invalid_params(format!("bad cursor {cursor:?}"), None))?,
        };
        let tools = self.tools.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let end = (start + PAGE).min(tools.len());
        let mut page = ListToolsResult::with_all_items(tools[start.min(end)..end].to_vec());
        page.next_cursor = (end < tools.len()).then(|| end.to_string());
        Ok(page)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.unwrap_or_default();
        if request.name == TOUCH_TOOL {
            let name = arguments.get("name").and_then(|v| v.as_str()).unwrap_or_default();
            let marker = arguments.get("marker").and_then(|v| v.as_str()).unwrap_or_default();
            {
                let mut tools =
                    self.tools.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                let Some(tool) = tools.iter_mut().find(|t| t.name == name) else {
                    return Err(ErrorData::invalid_params(format!("no tool {name}"), None));
                };
                let description =
                    format!("{} {marker}", tool.description.as_deref().unwrap_or_default());
                tool.description = Some(description.into());
            }
            let _ = context.peer.notify_tool_list_changed().await;
            return Ok(CallToolResponse::Complete(CallToolResult::success(vec![
                ContentBlock::text("touched"),
            ])));
        }
        let text = match arguments.get("message").and_then(|m| m.as_str()) {
            Some(message) => message.to_owned(),
            None => serde_json::Value::Object(arguments).to_string(),
        };
        Ok(CallToolResponse::Complete(CallToolResult::success(vec![ContentBlock::text(text)])))
    }
}

/// Serves `server` over streamable HTTP at `/mcp` on `listener`.
pub(crate) async fn serve_echo(listener: TcpListener, server: EchoServer) -> std::io::Result<()> {
    let router = axum::Router::new().nest_service("/mcp", service(server));
    axum::serve(no_delay(listener), router).await
}

/// Sends small writes at once: `axum::serve` leaves Nagle's algorithm on, and a client
/// that does not answer with an ACK straight away (one that sent its whole request) then
/// waits up to 40 ms for the last write of an SSE answer.
fn no_delay(listener: TcpListener) -> impl axum::serve::Listener<Addr = std::net::SocketAddr> {
    use axum::serve::ListenerExt as _;
    listener.tap_io(|stream| {
        if let Err(error) = stream.set_nodelay(true) {
            eprintln!("toolmesh-bench: cannot set TCP_NODELAY: {error}");
        }
    })
}

/// Serves each of `servers` over streamable HTTP at `/mcp/<its index>` on `listener`.
pub(crate) async fn serve_echoes(
    listener: TcpListener,
    servers: Vec<EchoServer>,
) -> std::io::Result<()> {
    let router =
        servers.into_iter().enumerate().fold(axum::Router::new(), |router, (i, server)| {
            router.nest_service(&format!("/mcp/{i}"), service(server))
        });
    axum::serve(no_delay(listener), router).await
}

fn service(server: EchoServer) -> StreamableHttpService<EchoServer, LocalSessionManager> {
    StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    )
}

/// What [`direct_load`] measured.
#[derive(Debug, Default)]
pub(crate) struct DirectLoad {
    /// Latency of each successful call, in nanoseconds.
    pub(crate) latencies_ns: Vec<u64>,
    /// Calls that failed.
    pub(crate) errors: u64,
    /// The first failure.
    pub(crate) first_error: Option<String>,
    /// Time from the first call to the last answer.
    pub(crate) elapsed: Duration,
}

impl DirectLoad {
    /// The callers' loads `tasks` as one, timed from `start`.
    async fn join(
        tasks: Vec<tokio::task::JoinHandle<DirectLoad>>,
        start: Instant,
    ) -> Result<DirectLoad, String> {
        let mut total = DirectLoad::default();
        for task in tasks {
            let load = task.await.map_err(|e| e.to_string())?;
            total.latencies_ns.extend(load.latencies_ns);
            total.errors += load.errors;
            total.first_error = total.first_error.or(load.first_error);
        }
        total.elapsed = start.elapsed();
        Ok(total)
    }
}

/// Drives `tool` with `arguments` at `url` from one MCP client (as toolmesh holds one per
/// server) with `concurrency` callers for `duration`. Its HTTP client keeps connections
/// open between requests, as production clients (and toolmesh's own) do: rmcp's default
/// one opens a connection per request, which would measure TCP set-up on both sides
/// rather than MCP.
pub(crate) async fn direct_load(
    url: &str,
    tool: &str,
    arguments: &Value,
    concurrency: usize,
    duration: Duration,
) -> Result<DirectLoad, String> {
    let arguments = arguments.as_object().cloned();
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    config.max_concurrent_requests = 256;
    let client =
        ().serve(StreamableHttpClientTransport::with_client(reqwest::Client::new(), config))
            .await
            .map_err(|e| format!("connecting to {url}: {e}"))?;
    let peer = client.peer().clone();
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let peer = peer.clone();
        let (tool, arguments) = (tool.to_owned(), arguments.clone());
        tasks.push(tokio::spawn(async move {
            let mut load = DirectLoad::default();
            while Instant::now() < end {
                let mut params = CallToolRequestParams::new(tool.clone());
                params.arguments.clone_from(&arguments);
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
    let total = DirectLoad::join(tasks, start).await?;
    let _ = client.cancel().await;
    Ok(total)
}

/// Drives `echo` on the MCP server at `addr` (path `/mcp`) with `concurrency` plain HTTP/1.1
/// clients for `duration`, each on its own connection, sending the same `tools/call`
/// request (with a request id of its own) over and over in one session: what the server
/// costs without any MCP client library, the baseline a proxy's hop is measured against.
pub(crate) async fn raw_load(
    addr: std::net::SocketAddr,
    concurrency: usize,
    duration: Duration,
) -> Result<DirectLoad, String> {
    let mut setup = RawClient::connect(addr).await?;
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": RAW_PROTOCOL, "capabilities": {},
        "clientInfo": {"name": "toolmesh-bench-raw", "version": "1"}}});
    let (_, session) = setup.post(None, initialize.to_string().into()).await?;
    let session = session.ok_or("the server gave no mcp-session-id")?;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    setup.post(Some(&session), initialized.to_string().into()).await?;
    // Request ids are unique within the session, or the server could not tell the answers
    // apart.
    let ids = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let (ids, session) = (ids.clone(), session.clone());
        tasks.push(tokio::spawn(async move {
            let mut load = DirectLoad::default();
            let mut client = match RawClient::connect(addr).await {
                Ok(client) => client,
                Err(error) => {
                    load.errors += 1;
                    load.first_error = Some(error);
                    return load;
                }
            };
            while Instant::now() < end {
                let id = ids.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let call = format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"message":"hello"}}}}}}"#
                );
                let sent = Instant::now();
                let answer =
                    tokio::time::timeout(RAW_TIMEOUT, client.post(Some(&session), call.into()));
                let answer = answer.await.unwrap_or_else(|_| Err("no answer within 10 s".into()));
                match answer {
                    Ok((body, _)) if body.windows(8).any(|w| w == b"\"result\"") => {
                        load.latencies_ns.push(sent.elapsed().as_nanos() as u64);
                    }
                    Ok((body, _)) => {
                        load.errors += 1;
                        load.first_error.get_or_insert_with(|| {
                            format!("no result: {}", String::from_utf8_lossy(&body))
                        });
                    }
                    Err(error) => {
                        load.errors += 1;
                        load.first_error.get_or_insert(error);
                        break;
                    }
                }
            }
            load
        }));
    }
    DirectLoad::join(tasks, start).await
}

/// How long a plain client waits for one answer.
const RAW_TIMEOUT: Duration = Duration::from_secs(10);

/// The protocol revision the plain client names.
const RAW_PROTOCOL: &str = "2025-06-18";

/// One HTTP/1.1 connection (hyper's client, no MCP library) to an MCP server's `/mcp`.
struct RawClient {
    sender: hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>,
}

impl RawClient {
    async fn connect(addr: std::net::SocketAddr) -> Result<Self, String> {
        let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        Ok(RawClient { sender })
    }

    /// Posts `body` in `session`; returns the whole answer body and the session id the
    /// server gave, if any.
    async fn post(
        &mut self,
        session: Option<&str>,
        body: bytes::Bytes,
    ) -> Result<(bytes::Bytes, Option<String>), String> {
        use http_body_util::BodyExt as _;
        let mut request = hyper::Request::post("/mcp")
            .header("host", "127.0.0.1")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", RAW_PROTOCOL);
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        let request = request.body(http_body_util::Full::new(body)).map_err(|e| e.to_string())?;
        self.sender.ready().await.map_err(|e| e.to_string())?;
        let response = self.sender.send_request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        if !status.is_success() {
            return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
        }
        Ok((body, session))
    }
}
