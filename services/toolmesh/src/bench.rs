//! The load generator behind `toolmesh bench`.
//!
//! It drives `CallTool` against a toolmesh server and, with `baseline`, against a bare
//! tonic server that answers `CallTool` by echoing the arguments (no router, no registry,
//! no worker pool): same machine, same client, same concurrency, so the router's cost
//! shows as a ratio. Both servers run as child processes of the bench, like a real
//! deployment. Two phases per server:
//!
//! 1. closed loop: `concurrency` callers, each calling again as soon as an answer arrives,
//!    for `duration`: the reached maximum throughput and its latencies;
//! 2. open loop at half of toolmesh's reached maximum: calls are started on a fixed
//!    schedule whatever the latency, and latency counts from the scheduled start (no
//!    coordinated omission): the latency a moderately loaded server gives.

use std::{
    net::SocketAddr,
    path::Path,
    pin::Pin,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use futures::Stream;
use hdrhistogram::Histogram;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    net::TcpListener,
    process::{Child, Command},
};
use tonic::{Request, Response, Status, Streaming, transport::Channel};
use toolmesh_proto::v1::{
    CallToolClientMessage, CallToolRequest, CallToolResponse, CallToolServerMessage, ContentPart,
    ListToolsRequest, ListToolsResponse,
    content_part::Part,
    tool_service_client::ToolServiceClient,
    tool_service_server::{ToolService, ToolServiceServer},
};

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// A running toolmesh to measure; `None` starts one (`toolmesh serve`, defaults).
    pub server: Option<String>,
    /// Callers in the closed-loop phase.
    pub concurrency: usize,
    /// HTTP/2 connections the callers share.
    pub connections: usize,
    /// Length of each measured phase.
    pub duration: Duration,
    /// Unmeasured calls before each phase.
    pub warmup: Duration,
    /// The tool to call.
    pub tool: String,
    /// Its arguments, as JSON.
    pub arguments: String,
    /// Also measure the bare tonic echo server.
    pub baseline: bool,
    /// Also measure latency in an open loop at half of the reached maximum.
    pub half_load: bool,
}

/// Figures of one phase against one server.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Successful calls per second.
    pub throughput: f64,
    /// Latency percentiles in milliseconds: p50, p90, p99.
    pub p50_ms: f64,
    /// p90 latency, ms.
    pub p90_ms: f64,
    /// p99 latency, ms.
    pub p99_ms: f64,
    /// Calls that failed.
    pub errors: u64,
}

impl Sample {
    fn from(histogram: &Histogram<u64>, errors: u64, elapsed: Duration) -> Self {
        let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1e6;
        Sample {
            throughput: histogram.len() as f64 / elapsed.as_secs_f64(),
            p50_ms: ms(0.50),
            p90_ms: ms(0.90),
            p99_ms: ms(0.99),
            errors,
        }
    }
}

/// All figures of one bench run.
#[derive(Debug, Clone)]
pub struct BenchReport {
    /// toolmesh, closed loop.
    pub toolmesh: Sample,
    /// The bare echo, closed loop.
    pub echo: Option<Sample>,
    /// The open-loop rate, calls per second.
    pub half_rate: Option<f64>,
    /// toolmesh at half load.
    pub toolmesh_half: Option<Sample>,
    /// The bare echo at half load.
    pub echo_half: Option<Sample>,
}

/// A child server process, killed on drop.
struct ChildServer {
    child: Child,
    addr: SocketAddr,
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Starts `exe args…`, which must print `listening on ADDR` as its first stdout line.
async fn start_child(exe: &Path, args: &[&str]) -> anyhow::Result<ChildServer> {
    let mut child = Command::new(exe)
        .args(args)
        .env("TOOLMESH__TELEMETRY__LOG", "warn")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", exe.display()))?;
    let stdout = child.stdout.take().context("child stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .context("the server did not announce its address within 30 s")??
        .context("the server exited before announcing its address")?;
    let addr = line
        .rsplit(' ')
        .next()
        .and_then(|a| a.parse().ok())
        .with_context(|| format!("unexpected first line from the server: {line:?}"))?;
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(ChildServer { child, addr })
}

async fn clients(
    addr: &str,
    connections: usize,
) -> anyhow::Result<Vec<ToolServiceClient<Channel>>> {
    let mut clients = Vec::with_capacity(connections);
    for _ in 0..connections.max(1) {
        clients.push(crate::client::connect(addr).await?);
    }
    Ok(clients)
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1_000, 120_000_000_000, 3).expect("valid histogram bounds")
}

/// Closed loop: `concurrency` callers for `duration`.
async fn closed_loop(
    clients: &[ToolServiceClient<Channel>],
    concurrency: usize,
    duration: Duration,
    request: &CallToolRequest,
) -> Sample {
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = Vec::with_capacity(concurrency);
    for i in 0..concurrency {
        let mut client = clients[i % clients.len()].clone();
        let request = request.clone();
        tasks.push(tokio::spawn(async move {
            let mut histogram = new_histogram();
            let mut errors = 0u64;
            while Instant::now() < end {
                let sent = Instant::now();
                match client.call_tool(request.clone()).await {
                    Ok(response) if !response.get_ref().is_error => {
                        histogram.saturating_record(sent.elapsed().as_nanos() as u64);
                    }
                    _ => errors += 1,
                }
            }
            (histogram, errors)
        }));
    }
    let mut histogram = new_histogram();
    let mut errors = 0;
    for task in tasks {
        if let Ok((h, e)) = task.await {
            histogram.add(h).expect("same bounds");
            errors += e;
        }
    }
    Sample::from(&histogram, errors, start.elapsed())
}

/// Open loop: calls started on a fixed schedule of `rate` per second for `duration`.
async fn open_loop(
    clients: &[ToolServiceClient<Channel>],
    rate: f64,
    duration: Duration,
    request: &CallToolRequest,
) -> Sample {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Option<u64>>();
    let start = Instant::now();
    let total = (rate * duration.as_secs_f64()) as u64;
    let interval = Duration::from_secs_f64(1.0 / rate);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let mut issued = 0u64;
    while issued < total {
        tick.tick().await;
        // Start every call whose scheduled time has come; the timer ticks each millisecond.
        let due = ((start.elapsed().as_secs_f64() * rate) as u64 + 1).min(total);
        while issued < due {
            let scheduled = start + interval * issued as u32;
            let mut client = clients[issued as usize % clients.len()].clone();
            let request = request.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let ok = matches!(client.call_tool(request).await, Ok(r) if !r.get_ref().is_error);
                let _ = tx.send(ok.then(|| scheduled.elapsed().as_nanos() as u64));
            });
            issued += 1;
        }
    }
    drop(tx);
    let mut histogram = new_histogram();
    let mut errors = 0;
    while let Some(outcome) = rx.recv().await {
        match outcome {
            Some(nanos) => histogram.saturating_record(nanos),
            None => errors += 1,
        }
    }
    Sample::from(&histogram, errors, duration)
}

async fn measure(
    addr: &str,
    options: &BenchOptions,
    request: &CallToolRequest,
    rate: Option<f64>,
) -> anyhow::Result<(Sample, Option<Sample>)> {
    let clients = clients(addr, options.connections).await?;
    // Fail early, with the server's own words, if the call does not work at all.
    let probe = clients[0].clone().call_tool(request.clone()).await.context("probe call")?;
    anyhow::ensure!(
        !probe.get_ref().is_error,
        "probe call returned an error result: {:?}",
        probe.get_ref()
    );
    closed_loop(&clients, options.concurrency, options.warmup, request).await;
    let max = closed_loop(&clients, options.concurrency, options.duration, request).await;
    let half = match rate {
        Some(rate) => Some(open_loop(&clients, rate, options.duration, request).await),
        None => None,
    };
    Ok((max, half))
}

/// Runs the benchmark. `exe` is the toolmesh binary, used to start the servers.
pub async fn run(options: &BenchOptions, exe: &Path) -> anyhow::Result<BenchReport> {
    let request = CallToolRequest {
        name: options.tool.clone(),
        arguments_json: options.arguments.clone(),
        ..Default::default()
    };
    let own = match &options.server {
        Some(_) => None,
        None => Some(start_child(exe, &["serve", "--listen", "127.0.0.1:0"]).await?),
    };
    let target = match (&options.server, &own) {
        (Some(server), _) => server.clone(),
        (None, Some(child)) => child.addr.to_string(),
        (None, None) => unreachable!("a server is started when none is given"),
    };
    let (toolmesh, _) = measure(&target, options, &request, None).await?;
    let half_rate = options.half_load.then_some(toolmesh.throughput / 2.0);
    let (_, toolmesh_half) = match half_rate {
        Some(rate) => measure(&target, options, &request, Some(rate)).await?,
        None => (toolmesh.clone(), None),
    };
    drop(own);

    let (echo, echo_half) = if options.baseline {
        let echo_server = start_child(exe, &["bench", "--echo-server"]).await?;
        let (max, half) =
            measure(&echo_server.addr.to_string(), options, &request, half_rate).await?;
        (Some(max), half)
    } else {
        (None, None)
    };
    Ok(BenchReport { toolmesh, echo, half_rate, toolmesh_half, echo_half })
}

/// Formats the report as the table `toolmesh bench` prints.
pub fn render(options: &BenchOptions, report: &BenchReport) -> String {
    let mut out = format!(
        "toolmesh bench: CallTool {} · concurrency {} · {} connections · {:?} per phase\n\n",
        options.tool, options.concurrency, options.connections, options.duration
    );
    out.push_str("closed loop (maximum)   calls/s    p50 ms   p90 ms   p99 ms   errors\n");
    let row = |name: &str, s: &Sample| {
        format!(
            "{name:<22}{:>9.0}{:>10.3}{:>9.3}{:>9.3}{:>9}\n",
            s.throughput, s.p50_ms, s.p90_ms, s.p99_ms, s.errors
        )
    };
    if let Some(echo) = &report.echo {
        out.push_str(&row("bare tonic echo", echo));
    }
    out.push_str(&row("toolmesh", &report.toolmesh));
    if let Some(echo) = &report.echo {
        out.push_str(&format!(
            "throughput ratio      {:>9.2}x\n",
            report.toolmesh.throughput / echo.throughput
        ));
    }
    if let (Some(rate), Some(t)) = (report.half_rate, &report.toolmesh_half) {
        out.push_str(&format!("\nopen loop at {rate:.0} calls/s (half of toolmesh's maximum)\n"));
        if let Some(echo) = &report.echo_half {
            out.push_str(&row("bare tonic echo", echo));
        }
        out.push_str(&row("toolmesh", t));
        if let Some(echo) = &report.echo_half {
            out.push_str(&format!("p99 added             {:>+9.3} ms\n", t.p99_ms - echo.p99_ms));
        }
    }
    out
}

/// A bare `ToolService`: `CallTool` echoes its arguments the way the `echo` tool does.
#[derive(Debug, Default, Clone, Copy)]
pub struct EchoService;

type EchoStream = Pin<Box<dyn Stream<Item = Result<CallToolServerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl ToolService for EchoService {
    async fn list_tools(
        &self,
        _: Request<ListToolsRequest>,
    ) -> Result<Response<ListToolsResponse>, Status> {
        Ok(Response::new(ListToolsResponse::default()))
    }

    async fn call_tool(
        &self,
        request: Request<CallToolRequest>,
    ) -> Result<Response<CallToolResponse>, Status> {
        let request = request.into_inner();
        // Parse and re-serialize, as the real path does, so both sides handle real JSON.
        let value: serde_json::Value = serde_json::from_str(&request.arguments_json)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let json = value.to_string();
        Ok(Response::new(CallToolResponse {
            content: vec![ContentPart { part: Some(Part::Json(json.clone())) }],
            structured_json: Some(json),
            is_error: false,
            call_id: request.call_id,
        }))
    }

    type StreamCallToolStream = EchoStream;

    async fn stream_call_tool(
        &self,
        _: Request<Streaming<CallToolClientMessage>>,
    ) -> Result<Response<EchoStream>, Status> {
        Err(Status::unimplemented("the bench echo server answers CallTool only"))
    }
}

/// Serves [`EchoService`] on `listener` until the process is killed.
pub async fn serve_echo(listener: TcpListener) -> anyhow::Result<()> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(ToolServiceServer::new(EchoService))
        .serve_with_incoming(incoming)
        .await?;
    Ok(())
}
