//! The CallTool load generator, the bare tonic echo baseline, and the MCP and tool-search
//! benchmarks.
//!
//! It drives `CallTool` against a toolmesh server and, with `baseline`, against a bare
//! tonic server that answers `CallTool` by echoing the arguments (no router, no registry,
//! no worker pool): same machine, same client, same concurrency, so the router's cost
//! shows as a ratio. Both servers run as child processes of the bench, like a real
//! deployment, side by side; each phase alternates rounds between them and reports the
//! median round, so that a noisy machine affects both alike. Two phases:
//!
//! 1. closed loop: `concurrency` callers, each calling again as soon as an answer arrives,
//!    for `duration`: the reached maximum throughput and its latencies;
//! 2. open loop at half of toolmesh's reached maximum: calls are started on a fixed
//!    schedule (kept by a thread that wakes every ~50 µs) whatever the latency, so a slow answer never
//!    delays the next call; each call's latency counts from when it was sent. This is
//!    the latency a moderately loaded server gives.

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
use tonic::{Request, Response, Status, Streaming};
use toolmesh_proto::v1::{
    CallToolClientMessage, CallToolRequest, CallToolResponse, CallToolServerMessage, ContentPart,
    ListToolsRequest, ListToolsResponse,
    content_part::Part,
    tool_service_client::ToolServiceClient,
    tool_service_server::{ToolService, ToolServiceServer},
};

/// What to measure.
#[derive(Debug, Clone)]
pub(crate) struct BenchOptions {
    /// A running toolmesh to measure; `None` starts one (`toolmesh serve`, defaults).
    pub(crate) server: Option<String>,
    /// Callers in the closed-loop phase.
    pub(crate) concurrency: usize,
    /// HTTP/2 connections the callers share.
    pub(crate) connections: usize,
    /// Length of each measured phase.
    pub(crate) duration: Duration,
    /// Unmeasured calls before each phase.
    pub(crate) warmup: Duration,
    /// The tool to call.
    pub(crate) tool: String,
    /// Its arguments, as JSON.
    pub(crate) arguments: String,
    /// Also measure the bare tonic echo server.
    pub(crate) baseline: bool,
    /// Also measure latency in an open loop at half of the reached maximum.
    pub(crate) half_load: bool,
    /// Rounds per phase, alternating between the servers; the report gives the median.
    pub(crate) rounds: usize,
}

/// Figures of one phase against one server.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Sample {
    /// Successful calls per second.
    pub(crate) throughput: f64,
    /// Latency percentiles in milliseconds: p50, p90, p99.
    pub(crate) p50_ms: f64,
    /// p90 latency, ms.
    pub(crate) p90_ms: f64,
    /// p99 latency, ms.
    pub(crate) p99_ms: f64,
    /// Calls that failed.
    pub(crate) errors: u64,
    /// The first failure, to say what went wrong.
    pub(crate) first_error: Option<String>,
}

impl Sample {
    /// The figures of an MCP client load.
    fn of_load(load: crate::mcp_echo::DirectLoad) -> Self {
        let mut histogram = new_histogram();
        for nanos in &load.latencies_ns {
            histogram.saturating_record(*nanos);
        }
        Sample::from(&histogram, load.errors, load.first_error, load.elapsed)
    }

    fn from(
        histogram: &Histogram<u64>,
        errors: u64,
        first_error: Option<String>,
        elapsed: Duration,
    ) -> Self {
        let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1e6;
        Sample {
            throughput: histogram.len() as f64 / elapsed.as_secs_f64(),
            p50_ms: ms(0.50),
            p90_ms: ms(0.90),
            p99_ms: ms(0.99),
            errors,
            first_error,
        }
    }
}

/// All figures of one bench run.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct BenchReport {
    /// toolmesh, closed loop.
    pub(crate) toolmesh: Sample,
    /// The bare echo, closed loop.
    pub(crate) echo: Option<Sample>,
    /// The open-loop rate, calls per second.
    pub(crate) half_rate: Option<f64>,
    /// toolmesh at half load.
    pub(crate) toolmesh_half: Option<Sample>,
    /// The bare echo at half load.
    pub(crate) echo_half: Option<Sample>,
}

/// A child server process, killed on drop.
pub(crate) struct ChildServer {
    child: Child,
    pub(crate) addr: SocketAddr,
    /// The data directory made for a toolmesh started without one.
    _data: Option<RemoveOnDrop>,
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

impl ChildServer {
    /// The CPU time the server has used so far, user and system, all its threads; `None`
    /// where the system does not tell (it is read from Linux's `/proc/PID/stat`).
    pub(crate) fn cpu_time(&self) -> Option<Duration> {
        process_cpu_time(self.child.id()?)
    }

    /// Stops the server as an operator does, with SIGTERM, and waits for it to exit.
    pub(crate) async fn terminate(mut self) -> anyhow::Result<()> {
        if let Some(pid) = self.child.id() {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
        }
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .context("the server did not exit within 30 s of SIGTERM")??;
        Ok(())
    }
}

/// The CPU time process `pid` has used so far, user and system, all its threads; `None`
/// where the system does not tell (it is read from Linux's `/proc/PID/stat`).
pub(crate) fn process_cpu_time(pid: u32) -> Option<Duration> {
    /// The unit of `/proc`'s times: `USER_HZ`, 100 on every Linux architecture.
    const TICKS_PER_SECOND: u64 = 100;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(Duration::from_millis(cpu_ticks(&stat)? * 1000 / TICKS_PER_SECOND))
}

/// The user and system time in a `/proc/PID/stat` line, in ticks. The fields after the
/// command name (in parentheses, and it may hold spaces and parentheses) start with the
/// third, `state`; `utime` and `stime` are the 14th and 15th.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |field: usize| fields.get(field - 3)?.parse::<u64>().ok();
    Some(ticks(14)? + ticks(15)?)
}

/// A temporary file, removed on drop (after the child that reads it is gone).
pub(crate) struct RemoveOnDrop(pub(crate) std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = if self.0.is_dir() {
            std::fs::remove_dir_all(&self.0)
        } else {
            std::fs::remove_file(&self.0)
        };
    }
}

/// Starts `exe args…`, which must print `listening on ADDR` as its first stdout line.
pub(crate) async fn start_child(exe: &Path, args: &[&str]) -> anyhow::Result<ChildServer> {
    start_child_on(exe, args, None).await
}

/// Starts `exe` with `args` as [`start_child`] does, on `cpus` when given: from its first
/// instruction, so that its runtime sizes its thread pool to them.
pub(crate) async fn start_child_on(
    exe: &Path,
    args: &[&str],
    cpus: Option<&[usize]>,
) -> anyhow::Result<ChildServer> {
    // A toolmesh started without a data directory gets one of its own, removed afterwards:
    // one process at a time uses a data directory.
    static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let data = (args.first() == Some(&"serve") && !args.contains(&"--data-dir")).then(|| {
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::env::temp_dir().join(format!("toolmesh-bench-serve-{}-{n}", std::process::id()))
    });
    let mut command = Command::new(exe);
    command.args(args);
    if let Some(dir) = &data {
        command.arg("--data-dir").arg(dir);
    }
    command
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let spawned = match cpus {
        None => command.spawn(),
        // A process starts with the CPU affinity of the thread that starts it: start it
        // from a thread of its own, pinned to `cpus`.
        Some(cpus) => {
            let runtime = tokio::runtime::Handle::current();
            std::thread::scope(|scope| {
                scope
                    .spawn(|| {
                        pin_thread(cpus).map_err(std::io::Error::other)?;
                        let _runtime = runtime.enter();
                        command.spawn()
                    })
                    .join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("the starting thread panicked")))
            })
        }
    };
    let mut child = spawned.with_context(|| format!("starting {}", exe.display()))?;
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
    Ok(ChildServer { child, addr, _data: data.map(RemoveOnDrop) })
}

/// Keeps the calling thread, and the threads and processes it starts, on `cpus`.
pub(crate) fn pin_thread(cpus: &[usize]) -> nix::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    for &cpu in cpus {
        set.set(cpu)?;
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
}

pub(crate) async fn clients(
    addr: &str,
    connections: usize,
) -> anyhow::Result<Vec<ToolServiceClient<toolmesh::client::Connection>>> {
    let mut clients = Vec::with_capacity(connections);
    for _ in 0..connections.max(1) {
        clients.push(toolmesh::client::connect(addr, None).await?);
    }
    Ok(clients)
}

pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1_000, 120_000_000_000, 3).expect("valid histogram bounds")
}

/// Returns `Ok` for a successful call, else what went wrong.
fn outcome(result: Result<tonic::Response<CallToolResponse>, Status>) -> Result<(), String> {
    match result {
        Ok(response) if !response.get_ref().is_error => Ok(()),
        Ok(response) => Err(format!("error result: {:?}", response.get_ref().content)),
        Err(status) => Err(format!("{:?}: {}", status.code(), status.message())),
    }
}

/// Closed loop: `concurrency` callers for `duration`.
pub(crate) async fn closed_loop(
    clients: &[ToolServiceClient<toolmesh::client::Connection>],
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
            let mut first_error = None;
            while Instant::now() < end {
                let sent = Instant::now();
                match outcome(client.call_tool(request.clone()).await) {
                    Ok(()) => histogram.saturating_record(sent.elapsed().as_nanos() as u64),
                    Err(error) => {
                        errors += 1;
                        first_error.get_or_insert(error);
                    }
                }
            }
            (histogram, errors, first_error)
        }));
    }
    let mut histogram = new_histogram();
    let mut errors = 0;
    let mut first_error = None;
    for task in tasks {
        if let Ok((h, e, first)) = task.await {
            histogram.add(h).expect("same bounds");
            errors += e;
            first_error = first_error.or(first);
        }
    }
    Sample::from(&histogram, errors, first_error, start.elapsed())
}

/// Open loop: calls started on a fixed schedule of `rate` per second for `duration`.
///
/// A dedicated thread keeps the schedule: it wakes every ~50 µs (tokio's timer has 1 ms
/// steps, which would send the calls in bursts) and releases the calls that are due.
pub(crate) async fn open_loop(
    clients: &[ToolServiceClient<toolmesh::client::Connection>],
    rate: f64,
    duration: Duration,
    request: &CallToolRequest,
) -> Sample {
    let total = (rate * duration.as_secs_f64()) as u64;
    let (due_tx, mut due_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let pacer = std::thread::spawn(move || {
        let start = Instant::now();
        let mut released = 0u64;
        while released < total {
            std::thread::sleep(Duration::from_micros(50));
            let due = ((start.elapsed().as_secs_f64() * rate) as u64).min(total);
            if due > released {
                if due_tx.send(due - released).is_err() {
                    return;
                }
                released = due;
            }
        }
    });
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Result<u64, String>>();
    let mut issued = 0usize;
    while let Some(count) = due_rx.recv().await {
        for _ in 0..count {
            let mut client = clients[issued % clients.len()].clone();
            let request = request.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let sent = Instant::now();
                let result = outcome(client.call_tool(request).await);
                let _ = tx.send(result.map(|()| sent.elapsed().as_nanos() as u64));
            });
            issued += 1;
        }
    }
    let _ = pacer.join();
    drop(tx);
    let mut histogram = new_histogram();
    let mut errors = 0;
    let mut first_error = None;
    while let Some(result) = rx.recv().await {
        match result {
            Ok(nanos) => histogram.saturating_record(nanos),
            Err(error) => {
                errors += 1;
                first_error.get_or_insert(error);
            }
        }
    }
    Sample::from(&histogram, errors, first_error, duration)
}

/// Returns the sample whose p99 is the median of `samples` (throughput likewise: the
/// median of the rounds).
pub(crate) fn median(mut samples: Vec<Sample>) -> Sample {
    let mid = samples.len() / 2;
    let mut throughputs: Vec<f64> = samples.iter().map(|s| s.throughput).collect();
    throughputs.sort_by(f64::total_cmp);
    samples.sort_by(|a, b| a.p99_ms.total_cmp(&b.p99_ms));
    let errors = samples.iter().map(|s| s.errors).sum();
    let first_error = samples.iter().find_map(|s| s.first_error.clone());
    Sample { throughput: throughputs[mid], errors, first_error, ..samples[mid].clone() }
}

/// The median of `values` (not empty), and their lowest and highest.
pub(crate) fn median_and_range(mut values: Vec<f64>) -> (f64, [f64; 2]) {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 };
    (median, [values[0], values[n - 1]])
}

/// One server under test, with its clients.
struct Target {
    clients: Vec<ToolServiceClient<toolmesh::client::Connection>>,
}

impl Target {
    async fn connect(
        addr: &str,
        options: &BenchOptions,
        request: &CallToolRequest,
    ) -> anyhow::Result<Self> {
        let clients = clients(addr, options.connections).await?;
        // Fail early, with the server's own words, if the call does not work at all.
        let probe = clients[0].clone().call_tool(request.clone()).await.context("probe call")?;
        anyhow::ensure!(
            !probe.get_ref().is_error,
            "probe call returned an error result: {:?}",
            probe.get_ref()
        );
        closed_loop(&clients, options.concurrency, options.warmup, request).await;
        Ok(Target { clients })
    }
}

/// Runs `phase` on every target in turn, `rounds` times, and returns each target's median.
async fn alternate<'a, F, Fut>(targets: &'a [Target], rounds: usize, mut phase: F) -> Vec<Sample>
where
    F: FnMut(&'a Target) -> Fut,
    Fut: std::future::Future<Output = Sample>,
{
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); targets.len()];
    for _ in 0..rounds {
        for (target, samples) in targets.iter().zip(&mut samples) {
            samples.push(phase(target).await);
        }
    }
    samples.into_iter().map(median).collect()
}

/// Where the programs the benchmarks start are: the `toolmesh` binary for the servers
/// under test, and this bench's own binary for the echo servers.
#[derive(Debug, Clone)]
pub(crate) struct Programs {
    /// `toolmesh`.
    pub(crate) toolmesh: std::path::PathBuf,
    /// `toolmesh-bench`.
    pub(crate) bench: std::path::PathBuf,
}

/// Runs the CallTool benchmark.
pub(crate) async fn run(
    options: &BenchOptions,
    programs: &Programs,
) -> anyhow::Result<BenchReport> {
    let request = CallToolRequest {
        name: options.tool.clone(),
        arguments_json: options.arguments.clone(),
        ..Default::default()
    };
    // Both servers run side by side for the whole run, so that alternating rounds see the
    // same machine conditions.
    let own = match &options.server {
        Some(_) => None,
        None => Some(start_child(&programs.toolmesh, &["serve", "--listen", "127.0.0.1:0"]).await?),
    };
    let addr = match (&own, &options.server) {
        (Some(child), _) => child.addr.to_string(),
        (None, server) => server.clone().context("a server to measure")?,
    };
    if own.is_some() {
        until_embedded(&toolmesh::client::connect(&addr, None).await?).await?;
    }
    let echo = match options.baseline {
        true => Some(start_child(&programs.bench, &["--echo-server"]).await?),
        false => None,
    };
    let mut targets = vec![Target::connect(&addr, options, &request).await?];
    if let Some(echo) = &echo {
        targets.push(Target::connect(&echo.addr.to_string(), options, &request).await?);
    }

    let rounds = options.rounds.max(1);
    let slice = options.duration / rounds as u32;
    let max = alternate(&targets, rounds, |t| {
        closed_loop(&t.clients, options.concurrency, slice, &request)
    })
    .await;
    let half_rate = options.half_load.then_some(max[0].throughput / 2.0);
    let half = match half_rate {
        Some(rate) => Some(
            alternate(&targets, rounds, |t| open_loop(&t.clients, rate, slice, &request)).await,
        ),
        None => None,
    };
    Ok(BenchReport {
        toolmesh: max[0].clone(),
        echo: max.get(1).cloned(),
        half_rate,
        toolmesh_half: half.as_ref().map(|h| h[0].clone()),
        echo_half: half.as_ref().and_then(|h| h.get(1).cloned()),
    })
}

/// Figures of `toolmesh-bench --mcp`.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct McpReport {
    /// A plain MCP client calling the echo server directly.
    pub(crate) direct: Sample,
    /// Plain HTTP/1.1 clients (no MCP library) sending the same request to the server, one
    /// connection each: the server's raw capacity.
    pub(crate) raw: Sample,
    /// `CallTool` through toolmesh to the same server.
    pub(crate) toolmesh: Sample,
    /// The same MCP client calling the server's tool through toolmesh's MCP endpoint.
    pub(crate) endpoint_proxy: Sample,
    /// The same MCP client calling toolmesh's own `echo` tool at its MCP endpoint, against
    /// the bare echo server on the same library (`direct`).
    pub(crate) endpoint_local: Sample,
    /// Cores of this machine.
    pub(crate) cores: usize,
    /// CPU time per call, where Linux's `/proc` tells.
    pub(crate) cpu: Option<McpCpu>,
}

/// CPU time per call of `toolmesh-bench --mcp`, user and system, over every round, in ms.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct McpCpu {
    /// toolmesh's own, per call it proxied from `CallTool`: the cost of the hop.
    pub(crate) toolmesh_ms: f64,
    /// toolmesh's own, per call it proxied from its MCP endpoint.
    pub(crate) endpoint_proxy_ms: f64,
    /// toolmesh's own, per call of its local `echo` at its MCP endpoint.
    pub(crate) endpoint_local_ms: f64,
    /// The echo server's, per call from the direct client.
    pub(crate) server_direct_ms: f64,
    /// The echo server's, per call from the plain HTTP clients.
    pub(crate) server_raw_ms: f64,
    /// The echo server's, per call proxied by toolmesh from `CallTool`.
    pub(crate) server_via_ms: f64,
    /// The echo server's, per call proxied by toolmesh from its MCP endpoint.
    pub(crate) server_via_endpoint_ms: f64,
    /// The load generator's own, per call of the direct phase: what the compiled MCP
    /// client (rmcp, the library toolmesh's MCP client is built on) costs by itself.
    pub(crate) client_direct_ms: Option<f64>,
    /// The same in the raw phase: what a plain HTTP/1.1 client (hyper, no MCP library)
    /// costs per call.
    pub(crate) client_raw_ms: Option<f64>,
}

/// The ways `toolmesh-bench --mcp` calls an echo tool, one phase each per round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum McpPhase {
    Direct,
    Raw,
    Grpc,
    EndpointProxy,
    EndpointLocal,
}

const MCP_PHASES: [McpPhase; 5] = [
    McpPhase::Direct,
    McpPhase::Raw,
    McpPhase::Grpc,
    McpPhase::EndpointProxy,
    McpPhase::EndpointLocal,
];

/// What one phase measured over the rounds: its samples, its calls, and the CPU time each
/// process spent on them (`None` once a reading failed).
#[derive(Default)]
struct PhaseCount {
    samples: Vec<Sample>,
    calls: f64,
    cpu: Option<(Duration, Duration)>,
    unreadable: bool,
}

impl PhaseCount {
    fn add(
        &mut self,
        sample: Sample,
        calls: f64,
        toolmesh: Option<Duration>,
        server: Option<Duration>,
    ) {
        self.samples.push(sample);
        self.calls += calls;
        match (toolmesh.zip(server), self.unreadable) {
            (Some((t, s)), false) => {
                let (tt, ss) = self.cpu.unwrap_or_default();
                self.cpu = Some((tt + t, ss + s));
            }
            _ => {
                self.unreadable = true;
                self.cpu = None;
            }
        }
    }

    /// CPU per call, ms: toolmesh's and the server's.
    fn per_call(&self) -> Option<(f64, f64)> {
        let (toolmesh, server) = self.cpu?;
        (self.calls > 0.0).then(|| {
            (toolmesh.as_secs_f64() * 1e3 / self.calls, server.as_secs_f64() * 1e3 / self.calls)
        })
    }
}

/// Measures calls of a streamable-HTTP MCP echo server: by an MCP client directly, by plain
/// HTTP clients, by `CallTool` through toolmesh, and by the same MCP client through
/// toolmesh's MCP endpoint; and toolmesh's own `echo` at its MCP endpoint against the bare
/// echo server. Same machine, same concurrency, alternating rounds, medians. Both servers
/// run as child processes; every client runs here.
pub(crate) async fn run_mcp(
    options: &BenchOptions,
    programs: &Programs,
) -> anyhow::Result<McpReport> {
    let echo = start_child(&programs.bench, &["--mcp-echo-server"]).await?;
    let url = format!("http://{}/mcp", echo.addr);
    let config =
        std::env::temp_dir().join(format!("toolmesh-bench-mcp-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        format!(
            "[[mcp.servers]]\nname = \"bench\"\ntransport = \"streamable-http\"\nurl = \"{url}\"\n\n\
             [[routing.profiles]]\nname = \"all\"\nexpose = [\"*\"]\n"
        ),
    )?;
    let config_arg = config.display().to_string();
    let toolmesh = start_child(
        &programs.toolmesh,
        &["serve", "--listen", "127.0.0.1:0", "--config", &config_arg],
    )
    .await;
    // The server watches its config file: remove it only once the server is gone.
    let _config = RemoveOnDrop(config);
    let toolmesh = toolmesh?;
    let addr = toolmesh.addr.to_string();
    let endpoint = format!("http://{addr}/mcp/all");

    // The MCP server's tools appear once toolmesh has connected to it.
    let mut client = toolmesh::client::connect(&addr, None).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (tools, _) = toolmesh::client::list_all(&mut client).await?;
        if tools.iter().any(|t| t.name == "bench_echo") {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "toolmesh did not publish bench_echo within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    until_embedded(&client).await?;

    let request = CallToolRequest {
        name: "bench_echo".into(),
        arguments_json: r#"{"message":"hello"}"#.into(),
        ..Default::default()
    };
    let target = Target::connect(&addr, options, &request).await?;
    let mcp = |url: &str, tool: &str, duration: Duration| {
        let (url, tool) = (url.to_owned(), tool.to_owned());
        let concurrency = options.concurrency;
        async move {
            let arguments = serde_json::json!({"message": "hello"});
            crate::mcp_echo::direct_load(&url, &tool, &arguments, concurrency, duration)
                .await
                .map_err(anyhow::Error::msg)
        }
    };
    mcp(&url, "echo", options.warmup).await?;
    mcp(&endpoint, "bench_echo", options.warmup).await?;
    mcp(&endpoint, "echo", options.warmup).await?;

    let rounds = options.rounds.max(1);
    let slice = options.duration / rounds as u32;
    let mut counts: Vec<PhaseCount> = MCP_PHASES.iter().map(|_| PhaseCount::default()).collect();
    // The load generator's own CPU time in the direct and raw phases, and their calls.
    let mut client = Some((Duration::ZERO, 0.0));
    let mut raw_client = Some((Duration::ZERO, 0.0));
    for _ in 0..rounds {
        for (phase, count) in MCP_PHASES.iter().zip(counts.iter_mut()) {
            let (toolmesh_before, server_before) = (toolmesh.cpu_time(), echo.cpu_time());
            let client_before = process_cpu_time(std::process::id());
            let sample = match phase {
                McpPhase::Direct => Sample::of_load(mcp(&url, "echo", slice).await?),
                McpPhase::Raw => Sample::of_load(
                    crate::mcp_echo::raw_load(echo.addr, options.concurrency, slice)
                        .await
                        .map_err(anyhow::Error::msg)?,
                ),
                McpPhase::Grpc => {
                    closed_loop(&target.clients, options.concurrency, slice, &request).await
                }
                McpPhase::EndpointProxy => {
                    Sample::of_load(mcp(&endpoint, "bench_echo", slice).await?)
                }
                McpPhase::EndpointLocal => Sample::of_load(mcp(&endpoint, "echo", slice).await?),
            };
            let calls = sample.throughput * slice.as_secs_f64();
            let own = match phase {
                McpPhase::Direct => Some(&mut client),
                McpPhase::Raw => Some(&mut raw_client),
                _ => None,
            };
            if let Some(own) = own {
                let spent = used(client_before, process_cpu_time(std::process::id()));
                *own = own.zip(spent).map(|((time, n), spent)| (time + spent, n + calls));
            }
            let toolmesh_used = used(toolmesh_before, toolmesh.cpu_time());
            let server_used = used(server_before, echo.cpu_time());
            count.add(sample, calls, toolmesh_used, server_used);
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let per_call: Vec<_> = counts.iter().map(PhaseCount::per_call).collect();
    let cpu = match per_call[..] {
        [Some(direct), Some(raw), Some(grpc), Some(proxy), Some(local)] => Some(McpCpu {
            toolmesh_ms: grpc.0,
            endpoint_proxy_ms: proxy.0,
            endpoint_local_ms: local.0,
            server_direct_ms: direct.1,
            server_raw_ms: raw.1,
            server_via_ms: grpc.1,
            server_via_endpoint_ms: proxy.1,
            client_direct_ms: per_own_call(client),
            client_raw_ms: per_own_call(raw_client),
        }),
        _ => None,
    };
    let mut medians = counts.into_iter().map(|count| median(count.samples));
    let mut next = || medians.next().expect("a sample per phase");
    Ok(McpReport {
        direct: next(),
        raw: next(),
        toolmesh: next(),
        endpoint_proxy: next(),
        endpoint_local: next(),
        cores,
        cpu,
    })
}

/// Figures of `toolmesh-bench --mcp-endpoint`.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct EndpointReport {
    /// The endpoint measured.
    pub(crate) url: String,
    /// The tool called.
    pub(crate) tool: String,
    /// The median round.
    pub(crate) sample: Sample,
    /// CPU time of the process `--pid` per call over every round, in ms.
    pub(crate) cpu_ms: Option<f64>,
}

/// Drives the MCP endpoint at `url` (any MCP server or gateway) with the compiled MCP client
/// the `--mcp` phases use, calling `options.tool` with `options.arguments` from
/// `options.concurrency` callers in `options.rounds` rounds; reads the CPU time of `pid`
/// (the process serving it, on this machine) around them.
pub(crate) async fn run_mcp_endpoint(
    options: &BenchOptions,
    url: &str,
    pid: Option<u32>,
) -> anyhow::Result<EndpointReport> {
    let arguments: serde_json::Value =
        serde_json::from_str(&options.arguments).context("--arguments is not JSON")?;
    let load = |duration: Duration| {
        crate::mcp_echo::direct_load(url, &options.tool, &arguments, options.concurrency, duration)
    };
    load(options.warmup).await.map_err(anyhow::Error::msg)?;
    let rounds = options.rounds.max(1);
    let slice = options.duration / rounds as u32;
    let before = pid.and_then(process_cpu_time);
    let mut samples = Vec::with_capacity(rounds);
    let mut calls = 0.0;
    for _ in 0..rounds {
        let sample = Sample::of_load(load(slice).await.map_err(anyhow::Error::msg)?);
        calls += sample.throughput * slice.as_secs_f64();
        samples.push(sample);
    }
    let used = used(before, pid.and_then(process_cpu_time));
    let cpu_ms = used.filter(|_| calls > 0.0).map(|used| used.as_secs_f64() * 1000.0 / calls);
    Ok(EndpointReport {
        url: url.to_owned(),
        tool: options.tool.clone(),
        sample: median(samples),
        cpu_ms,
    })
}

/// The table of `toolmesh-bench --mcp-endpoint`.
pub(crate) fn render_mcp_endpoint(options: &BenchOptions, report: &EndpointReport) -> String {
    let s = &report.sample;
    let cpu = report.cpu_ms.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.3}"));
    format!(
        "toolmesh-bench --mcp-endpoint {} · tool {} · concurrency {} · {:?} in {} rounds \
         (median)\n\n    calls/s    p50 ms   p90 ms   p99 ms   errors   CPU ms per call (--pid)\n\
         {:>11.0}{:>10.3}{:>9.3}{:>9.3}{:>9}{:>26}\n{}",
        report.url,
        report.tool,
        options.concurrency,
        options.duration,
        options.rounds,
        s.throughput,
        s.p50_ms,
        s.p90_ms,
        s.p99_ms,
        s.errors,
        cpu,
        s.first_error.as_deref().map(|e| format!("first error: {e}\n")).unwrap_or_default(),
    )
}

/// The CPU time used between two readings of [`ChildServer::cpu_time`].
/// CPU time per call in milliseconds, from a total and a count of calls.
fn per_own_call(spent: Option<(Duration, f64)>) -> Option<f64> {
    spent.filter(|(_, calls)| *calls > 0.0).map(|(time, calls)| time.as_secs_f64() * 1e3 / calls)
}

fn used(before: Option<Duration>, after: Option<Duration>) -> Option<Duration> {
    before.zip(after).map(|(before, after)| after.saturating_sub(before))
}

/// Figures of `toolmesh-bench --search`.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct SearchReport {
    /// Tools in the pool.
    pub(crate) tools: usize,
    /// MCP servers they came from.
    pub(crate) servers: usize,
    /// Queries run.
    pub(crate) queries: usize,
    /// Mean Recall@1, @5, @10.
    pub(crate) recall: [f64; 3],
    /// Mean NDCG@10 (binary gains).
    pub(crate) ndcg10: f64,
    /// Share of queries with every relevant tool in the top 10.
    pub(crate) complete10: f64,
    /// Search latency (client-side, one query at a time), ms.
    pub(crate) p50_ms: f64,
    /// Search latency p99, ms.
    pub(crate) p99_ms: f64,
    /// From starting toolmesh to every tool indexed, seconds.
    pub(crate) cold_index_s: f64,
    /// From starting toolmesh again on the same data, after a graceful stop, until every
    /// tool is searchable with its vector, seconds.
    pub(crate) restart_s: f64,
    /// Tools that had their vector at the first answer after the restart.
    pub(crate) restart_embedded: u64,
    /// From changing one tool on the MCP server until the index reflects it (searchable
    /// by its words), ms: the median of [`REINDEX_CHANGES`] changes.
    pub(crate) reindex_median_ms: f64,
    /// The slowest of those changes, ms.
    pub(crate) reindex_max_ms: f64,
    /// From the change until the changed tool's new vector is in too, ms: the median.
    pub(crate) vector_median_ms: f64,
    /// The slowest of those, ms.
    pub(crate) vector_max_ms: f64,
    /// The ranking the server reported.
    pub(crate) ranking: String,
}

/// One labelled query.
struct LabelledQuery {
    query: String,
    relevant: Vec<String>,
}

pub(crate) fn read_jsonl(path: &Path) -> anyhow::Result<Vec<serde_json::Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("a line of {}", path.display())))
        .collect()
}

/// Words that make a variant of a tool: an edition or flavour a large catalog has many of.
const VARIANT_WORDS: &[&str] = &[
    "regional",
    "legacy",
    "batch",
    "sandbox",
    "enterprise",
    "mobile",
    "internal",
    "archived",
    "partner",
    "beta",
    "bulk",
    "cached",
    "audited",
    "scheduled",
    "replicated",
    "federated",
];

/// Returns `total` tools as JSON Lines: the benchmark's tools, then variants of them until
/// `total`. Variant `v` of tool `t` has the name `{t}_{word}{v}` and the description of `t`
/// with its sentences rotated and an edition phrase in front (for example "Partner edition
/// 3 of …"), and the same parameters: a near-duplicate that competes with the original for
/// every query, as the many editions of one API do in a large catalog. The labels keep
/// naming the originals.
fn scale_catalog(base: &[serde_json::Value], total: usize) -> String {
    let mut lines: Vec<String> = base.iter().map(ToString::to_string).collect();
    let mut k = 0usize;
    while lines.len() < total && !base.is_empty() {
        let (tool, v) = (&base[k % base.len()], k / base.len() + 1);
        let word = VARIANT_WORDS[(k / base.len() + k) % VARIANT_WORDS.len()];
        let mut variant = tool.clone();
        let name = tool["name"].as_str().unwrap_or_default();
        variant["name"] = format!("{name}_{word}{v}").into();
        let description = tool["description"].as_str().unwrap_or_default();
        let mut sentences: Vec<&str> =
            description.split_inclusive(". ").filter(|s| !s.trim().is_empty()).collect();
        if !sentences.is_empty() {
            let shift = v % sentences.len();
            sentences.rotate_left(shift);
        }
        let mut word_title = word.to_owned();
        word_title[..1].make_ascii_uppercase();
        variant["description"] =
            format!("{word_title} edition {v} of: {}", sentences.concat().trim()).into();
        lines.push(variant.to_string());
        k += 1;
    }
    lines.join("\n") + "\n"
}

/// Recall@1/5/10, NDCG@10 and completeness of one ranking, as the benchmark's README defines.
pub(crate) fn score_ranking(ranked: &[String], relevant: &[String]) -> ([f64; 3], f64, bool) {
    let hit = |i: usize| relevant.contains(&ranked[i]);
    let recall = |k: usize| {
        (0..k.min(ranked.len())).filter(|i| hit(*i)).count() as f64 / relevant.len() as f64
    };
    let dcg: f64 =
        (0..10.min(ranked.len())).filter(|i| hit(*i)).map(|i| 1.0 / ((i + 2) as f64).log2()).sum();
    let ideal: f64 = (0..relevant.len().min(10)).map(|i| 1.0 / ((i + 2) as f64).log2()).sum();
    let complete = relevant.iter().all(|r| ranked.iter().take(10).any(|n| n == r));
    ([recall(1), recall(5), recall(10)], dcg / ideal, complete)
}

/// How `toolmesh-bench --search` sets up the toolmesh under test.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SearchSetup<'a> {
    /// Start on an empty data directory: every tool embedded, the first start ever.
    pub(crate) fresh: bool,
    /// The data directory to keep the store in between runs.
    pub(crate) data_dir: Option<&'a Path>,
    /// Grow the catalog to this many tools with variants of the benchmark's.
    pub(crate) scale: Option<usize>,
    /// MCP servers the catalog is shared out between.
    pub(crate) servers: usize,
}

/// Loads the benchmark's tools into a toolmesh the way real tools arrive (as the tools of
/// MCP servers), runs every dev query through SearchTools over the whole pool, and
/// measures quality, latency, cold indexing and re-indexing after one change.
pub(crate) async fn run_search(
    dir: &Path,
    programs: &Programs,
    setup: SearchSetup<'_>,
) -> anyhow::Result<SearchReport> {
    let SearchSetup { fresh, data_dir, scale, servers } = setup;
    let servers = servers.max(1);
    let mut tools_file = dir.join("tools.jsonl");
    let scaled =
        std::env::temp_dir().join(format!("toolmesh-bench-tools-{}.jsonl", std::process::id()));
    let _scaled = RemoveOnDrop(scaled.clone());
    if let Some(total) = scale {
        let base = read_jsonl(&tools_file)?;
        std::fs::write(&scaled, scale_catalog(&base, total))?;
        tools_file = scaled.clone();
    }
    let tool_names: Vec<String> = read_jsonl(&tools_file)?
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect();
    let queries: Vec<LabelledQuery> = read_jsonl(&dir.join("queries-dev.jsonl"))?
        .into_iter()
        .map(|q| LabelledQuery {
            query: q["query"].as_str().unwrap_or_default().to_owned(),
            relevant: q["relevant"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r.as_str().map(str::to_owned))
                .collect(),
        })
        .filter(|q| !q.query.is_empty() && !q.relevant.is_empty())
        .collect();
    let (tools_arg, servers_arg) = (tools_file.display().to_string(), servers.to_string());
    let upstream = start_child(
        &programs.bench,
        &["--mcp-echo-server", "--tools", &tools_arg, "--servers", &servers_arg],
    )
    .await?;
    let config =
        std::env::temp_dir().join(format!("toolmesh-bench-search-{}.toml", std::process::id()));
    // The store lives in a data directory: a fresh one for a first-ever start (every tool
    // embedded), removed afterwards; otherwise the one given, or the bench's own, kept
    // between runs so that their vectors are reused.
    let fresh_dir =
        std::env::temp_dir().join(format!("toolmesh-bench-data-{}", std::process::id()));
    let _fresh = RemoveOnDrop(fresh_dir.clone());
    let data = match (fresh, data_dir) {
        (true, _) => fresh_dir,
        (false, Some(dir)) => dir.to_owned(),
        (false, None) => std::env::temp_dir().join("toolmesh-bench-data"),
    };
    let mut toml = String::from("[builtin]\nreasoning = false\necho = false\n");
    for server in 0..servers {
        let (name, path) = match servers {
            1 => ("bench".to_owned(), "/mcp".to_owned()),
            _ => (format!("bench{server}"), format!("/mcp/{server}")),
        };
        toml.push_str(&format!(
            "\n[[mcp.servers]]\nname = \"{name}\"\ntransport = \"streamable-http\"\nurl = \"http://{}{path}\"\nprefix = \"none\"\n",
            upstream.addr
        ));
    }
    std::fs::write(&config, toml)?;
    let _config = RemoveOnDrop(config.clone());
    let config_arg = config.display().to_string();
    let data_arg = data.display().to_string();
    let serve = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--config",
        config_arg.as_str(),
        "--data-dir",
        data_arg.as_str(),
    ];
    let expected = tool_names.len() + 1; // and the touch tool

    // Cold: from starting toolmesh until every tool is searchable.
    let started = Instant::now();
    let toolmesh = start_child(&programs.toolmesh, &serve).await?;
    let client = toolmesh::client::connect(&toolmesh.addr.to_string(), None).await?;
    until_indexed(&client, expected, started).await?;
    let cold_index_s = started.elapsed().as_secs_f64();

    let mut histogram = new_histogram();
    let (mut recall, mut ndcg, mut complete) = ([0.0; 3], 0.0, 0usize);
    let mut ranking = String::new();
    for query in &queries {
        let sent = Instant::now();
        let response = search_tools(&client, &query.query, 10).await?;
        histogram.saturating_record(sent.elapsed().as_nanos() as u64);
        ranking = response.ranking.clone();
        let ranked: Vec<String> =
            response.hits.into_iter().filter_map(|h| h.tool.map(|t| t.name)).collect();
        let (r, n, c) = score_ranking(&ranked, &query.relevant);
        for (total, value) in recall.iter_mut().zip(r) {
            *total += value;
        }
        ndcg += n;
        complete += usize::from(c);
    }
    let count = queries.len().max(1) as f64;

    // Re-index: change one tool's description on the MCP server, wait until search sees it;
    // a few times, each a different tool, for the median and the worst case.
    let (mut index_ms, mut vector_ms) = (Vec::new(), Vec::new());
    // The changed tools are on the first server, which serves tool i for i mod servers = 0;
    // with one server, every 631st tool, as 11 changes spread over the 6,944 of the set.
    let first_server: Vec<&String> = tool_names.iter().step_by(servers).collect();
    let step = (first_server.len() / REINDEX_CHANGES).clamp(1, 631);
    let changes = first_server.into_iter().step_by(step).take(REINDEX_CHANGES);
    for (round, changed) in changes.enumerate() {
        let reindexed = reindex_once(&client, changed, round).await?;
        index_ms.push(reindexed.index_ms);
        vector_ms.push(reindexed.vector_ms);
    }
    let ((reindex_median_ms, [_, reindex_max_ms]), (vector_median_ms, [_, vector_max_ms])) =
        (median_and_range(index_ms), median_and_range(vector_ms));

    // Restart over the same catalog and data: nothing to embed.
    toolmesh.terminate().await?;
    let started = Instant::now();
    let toolmesh = start_child(&programs.toolmesh, &serve).await?;
    let client = toolmesh::client::connect(&toolmesh.addr.to_string(), None).await?;
    let first = until_indexed(&client, expected, started).await?;
    let restart_s = started.elapsed().as_secs_f64();
    toolmesh.terminate().await?;
    drop(upstream);

    Ok(SearchReport {
        tools: tool_names.len(),
        servers,
        queries: queries.len(),
        recall: recall.map(|r| r / count),
        ndcg10: ndcg / count,
        complete10: complete as f64 / count,
        p50_ms: histogram.value_at_quantile(0.5) as f64 / 1e6,
        p99_ms: histogram.value_at_quantile(0.99) as f64 / 1e6,
        cold_index_s,
        restart_s,
        restart_embedded: first,
        reindex_median_ms,
        reindex_max_ms,
        vector_median_ms,
        vector_max_ms,
        ranking,
    })
}

/// Waits until `expected` tools are indexed and the index is complete (every tool with its
/// vector); returns how many had their vector at the first answer with all of them indexed.
/// Under a policy the server counts none, and `expected` must be 0.
async fn until_indexed(
    client: &ToolServiceClient<toolmesh::client::Connection>,
    expected: usize,
    started: Instant,
) -> anyhow::Result<u64> {
    // A guard against a hang, not a goal: a first start embeds every tool, at a few dozen a
    // second on two cores, so the limit grows with the catalog.
    let limit = Duration::from_secs(3600).max(Duration::from_millis(100) * expected as u32);
    let mut first = None;
    loop {
        let response = search_tools(client, "tool", 1).await?;
        if response.indexed_tools as usize >= expected {
            first.get_or_insert(response.embedded_tools);
            if response.index_complete {
                return Ok(first.unwrap_or_default());
            }
        }
        anyhow::ensure!(
            started.elapsed() < limit,
            "the index was not complete after {} s: {} tools indexed ({expected} expected), {} \
             of them with their vector (both 0 under a policy)",
            limit.as_secs(),
            response.indexed_tools,
            response.embedded_tools,
        );
        // Every 5 ms while the wait is short (a restart); later, a hundredth of the time
        // waited so far, so that the polls of a first start, which embeds for minutes, take
        // no CPU from it, and the time measured is still within 1%.
        tokio::time::sleep((started.elapsed() / 100).clamp(POLL, Duration::from_secs(1))).await;
    }
}

/// Waits until the toolmesh `client` calls has embedded every tool it indexed. A first start
/// embeds them in the background at low priority: about 0.1 s for a few tools on an idle
/// machine, but seconds under a load that leaves it little CPU, and the first rounds of
/// that load would share the CPU with it.
pub(crate) async fn until_embedded(
    client: &ToolServiceClient<toolmesh::client::Connection>,
) -> anyhow::Result<()> {
    until_indexed(client, 0, Instant::now()).await.map(drop)
}

/// How often [`until_indexed`] asks at first.
const POLL: Duration = Duration::from_millis(5);

/// Runs one SearchTools over the whole pool.
async fn search_tools(
    client: &ToolServiceClient<toolmesh::client::Connection>,
    query: &str,
    top_k: u32,
) -> Result<toolmesh_proto::v1::SearchToolsResponse, tonic::Status> {
    let request =
        toolmesh_proto::v1::SearchToolsRequest { query: query.into(), top_k, ..Default::default() };
    client.clone().search_tools(request).await.map(tonic::Response::into_inner)
}

/// Tools changed one after another to measure re-indexing.
pub(crate) const REINDEX_CHANGES: usize = 11;

/// How long one change took to reach the index, ms.
struct Reindexed {
    /// Until the index reflected the new catalog (searchable by its words).
    index_ms: f64,
    /// Until the changed tool's new vector was in as well.
    vector_ms: f64,
}

/// Appends a marker to the description of `changed` on the bench's MCP server and measures
/// how long the index takes to follow, by the index version that searches report (so the
/// measure does not depend on how the change ranks).
async fn reindex_once(
    client: &ToolServiceClient<toolmesh::client::Connection>,
    changed: &str,
    round: usize,
) -> anyhow::Result<Reindexed> {
    let probe = || async {
        let response = search_tools(client, "tool", 1).await?;
        anyhow::Ok((response.index_version, response.index_complete))
    };
    // The server is settled: the cold start, or the previous change, has every vector in,
    // and nothing else writes to the catalog (one change is one catalog version).
    let (before, settled) = probe().await?;
    anyhow::ensure!(settled, "tools were still waiting for vectors before change {round}");
    let marker = format!("zqxmarker{}x{round}", std::process::id());
    let started = Instant::now();
    let touch = CallToolRequest {
        name: crate::mcp_echo::TOUCH_TOOL.into(),
        arguments_json: serde_json::json!({"name": changed, "marker": marker}).to_string(),
        ..Default::default()
    };
    client.clone().call_tool(touch).await?;
    let mut index_ms = None;
    loop {
        let (version, settled) = probe().await?;
        if version > before {
            anyhow::ensure!(
                version == before + 1,
                "one change of {changed} gave {} catalog versions",
                version - before
            );
            let elapsed = started.elapsed().as_secs_f64() * 1e3;
            let index_ms = *index_ms.get_or_insert(elapsed);
            if settled {
                return Ok(Reindexed { index_ms, vector_ms: elapsed });
            }
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60),
            "the change of {changed} was not indexed after 60 s"
        );
        // Polling without a pause would take a core of the two from the re-index it waits for.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Formats the report of `toolmesh-bench --search`.
pub(crate) fn render_search(report: &SearchReport) -> String {
    format!(
        "toolmesh-bench --search: {} queries over the whole pool of {} tools from {} MCP server(s) (ranking: {})\n\n\
         Recall@1   {:.3}\nRecall@5   {:.3}\nRecall@10  {:.3}\nNDCG@10    {:.3}\nComplete@10 {:.3}\n\n\
         search latency p50 {:.3} ms, p99 {:.3} ms (gRPC round trip, one query at a time)\n\
         cold start to all tools indexed: {:.2} s (toolmesh start, MCP connect, tools/list, publish, index, embed)\n\
         restart with the same catalog to all tools searchable with vectors: {:.2} s ({} of them had their vector at the first answer)\n\
         re-index after one tool changed: median {:.1} ms, max {:.1} ms over {REINDEX_CHANGES} changes (tools/list_changed, re-list, publish, index)\n\
         ... and its new vector in: median {:.1} ms, max {:.1} ms\n",
        report.queries,
        report.tools,
        report.servers,
        report.ranking,
        report.recall[0],
        report.recall[1],
        report.recall[2],
        report.ndcg10,
        report.complete10,
        report.p50_ms,
        report.p99_ms,
        report.cold_index_s,
        report.restart_s,
        report.restart_embedded,
        report.reindex_median_ms,
        report.reindex_max_ms,
        report.vector_median_ms,
        report.vector_max_ms,
    )
}

/// Formats the report of `toolmesh-bench --mcp`.
pub(crate) fn render_mcp(options: &BenchOptions, report: &McpReport) -> String {
    let mut out = format!(
        "toolmesh-bench --mcp: echo over streamable HTTP · concurrency {} · {:?} per client in {} \
         alternating rounds (medians)\n\n",
        options.concurrency, options.duration, options.rounds
    );
    out.push_str(
        "                          calls/s    p50 ms   p90 ms   p99 ms   errors   CPU ms per call: \
         toolmesh   server\n",
    );
    let cpu = report.cpu.as_ref();
    let rows = [
        ("direct MCP client", &report.direct, None, cpu.map(|c| c.server_direct_ms)),
        ("plain HTTP clients", &report.raw, None, cpu.map(|c| c.server_raw_ms)),
        (
            "gRPC through toolmesh",
            &report.toolmesh,
            cpu.map(|c| c.toolmesh_ms),
            cpu.map(|c| c.server_via_ms),
        ),
        (
            "MCP through toolmesh",
            &report.endpoint_proxy,
            cpu.map(|c| c.endpoint_proxy_ms),
            cpu.map(|c| c.server_via_endpoint_ms),
        ),
        ("MCP to toolmesh's echo", &report.endpoint_local, cpu.map(|c| c.endpoint_local_ms), None),
    ];
    let ms = |value: Option<f64>| value.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.3}"));
    for (name, s, toolmesh, server) in rows {
        out.push_str(&format!(
            "{name:<24}{:>9.0}{:>10.3}{:>9.3}{:>9.3}{:>9}{:>28}{:>9}\n",
            s.throughput,
            s.p50_ms,
            s.p90_ms,
            s.p99_ms,
            s.errors,
            ms(toolmesh),
            ms(server)
        ));
    }
    if let Some(client) = cpu.and_then(|c| c.client_direct_ms) {
        out.push_str(&format!(
            "\nthe direct MCP client's own CPU: {client:.3} ms per call (this process, rmcp)\n"
        ));
    }
    if let Some(client) = cpu.and_then(|c| c.client_raw_ms) {
        out.push_str(&format!(
            "the plain HTTP clients' own CPU: {client:.3} ms per call (this process, hyper)\n"
        ));
    }
    out.push_str(&format!(
        "\np50 added             gRPC {:>+.3} ms · MCP {:>+.3} ms\n",
        report.toolmesh.p50_ms - report.direct.p50_ms,
        report.endpoint_proxy.p50_ms - report.direct.p50_ms,
    ));
    out.push_str(&format!(
        "proxied calls/s/core  gRPC {:.0} · MCP {:.0}   ({} cores)\n",
        report.toolmesh.throughput / report.cores as f64,
        report.endpoint_proxy.throughput / report.cores as f64,
        report.cores
    ));
    out.push_str(&format!(
        "through / plain HTTP  gRPC {:.2}× · MCP {:.2}×\n",
        report.toolmesh.throughput / report.raw.throughput,
        report.endpoint_proxy.throughput / report.raw.throughput,
    ));
    out.push_str(&format!(
        "endpoint / bare MCP   {:.2}×   (toolmesh's echo at its MCP endpoint, against the bare \
         echo server)\n",
        report.endpoint_local.throughput / report.direct.throughput
    ));
    let samples = [
        ("direct", &report.direct),
        ("plain HTTP", &report.raw),
        ("gRPC through toolmesh", &report.toolmesh),
        ("MCP through toolmesh", &report.endpoint_proxy),
        ("MCP to toolmesh's echo", &report.endpoint_local),
    ];
    for (name, sample) in samples {
        if let Some(error) = &sample.first_error {
            out.push_str(&format!("first error, {name}: {error}\n"));
        }
    }
    out
}

/// Formats the report as the table `toolmesh-bench` prints.
pub(crate) fn render(options: &BenchOptions, report: &BenchReport) -> String {
    let mut out = format!(
        "toolmesh-bench: CallTool {} · concurrency {} · {} connections · {:?} per phase and server \
         in {} alternating rounds (medians)\n\n",
        options.tool, options.concurrency, options.connections, options.duration, options.rounds
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
    let samples = [
        ("toolmesh", Some(&report.toolmesh)),
        ("bare tonic echo", report.echo.as_ref()),
        ("toolmesh (open loop)", report.toolmesh_half.as_ref()),
        ("bare tonic echo (open loop)", report.echo_half.as_ref()),
    ];
    for (name, sample) in samples {
        if let Some(error) = sample.and_then(|s| s.first_error.as_ref()) {
            out.push_str(&format!("first error, {name}: {error}\n"));
        }
    }
    out
}

/// A bare `ToolService`: `CallTool` echoes its arguments the way the `echo` tool does.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct EchoService;

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

    async fn search_tools(
        &self,
        _: Request<toolmesh_proto::v1::SearchToolsRequest>,
    ) -> Result<Response<toolmesh_proto::v1::SearchToolsResponse>, Status> {
        Err(Status::unimplemented("the bench echo server answers CallTool only"))
    }

    async fn list_resources(
        &self,
        _: Request<toolmesh_proto::v1::ListResourcesRequest>,
    ) -> Result<Response<toolmesh_proto::v1::ListResourcesResponse>, Status> {
        Ok(Response::new(Default::default()))
    }

    async fn read_resource(
        &self,
        _: Request<toolmesh_proto::v1::ReadResourceRequest>,
    ) -> Result<Response<toolmesh_proto::v1::ReadResourceResponse>, Status> {
        Err(Status::not_found("the bench echo server has no resources"))
    }

    async fn list_prompts(
        &self,
        _: Request<toolmesh_proto::v1::ListPromptsRequest>,
    ) -> Result<Response<toolmesh_proto::v1::ListPromptsResponse>, Status> {
        Ok(Response::new(Default::default()))
    }

    async fn get_prompt(
        &self,
        _: Request<toolmesh_proto::v1::GetPromptRequest>,
    ) -> Result<Response<toolmesh_proto::v1::GetPromptResponse>, Status> {
        Err(Status::not_found("the bench echo server has no prompts"))
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
pub(crate) async fn serve_echo(listener: TcpListener) -> anyhow::Result<()> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(ToolServiceServer::new(EchoService))
        .serve_with_incoming(incoming)
        .await?;
    Ok(())
}

#[cfg(test)]
mod median_tests {
    #[test]
    fn rounds_are_summarised_by_their_median_and_range() {
        assert_eq!(super::median_and_range(vec![0.9, 1.2, 0.8]), (0.9, [0.8, 1.2]));
        assert_eq!(super::median_and_range(vec![3.0, 1.0, 4.0, 2.0]), (2.5, [1.0, 4.0]));
    }
}

#[cfg(test)]
mod cpu_tests {
    #[test]
    fn user_and_system_ticks_are_read_after_a_command_name_with_spaces() {
        let stat = "4242 (tokio (rt) worker) S 1 4242 4242 0 -1 4194304 1200 0 3 0 \
                    1577 396 0 0 20 0 18 0 91234 1011712000 20480 18446744073709551615";
        assert_eq!(super::cpu_ticks(stat), Some(1577 + 396));
        assert_eq!(super::cpu_ticks("4242 (x) S 1 2"), None);
    }
}
