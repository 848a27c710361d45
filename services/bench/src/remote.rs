//! `toolmesh-bench --remote`: remote worker pools. A tool that takes 20 ms (an HTTP GET to
//! an upstream that answers after 20 ms), served by 1, 2 and 4 `toolmesh worker` processes
//! of capacity 4 each: throughput under a closed loop of twice the pool's capacity, and
//! how close it comes to linear. Then the router's added latency per call: the same tool
//! as a local tool of the router and on a remote worker, one caller, alternating rounds.

use std::{process::Stdio, time::Duration};

use anyhow::Context as _;
use tokio::process::{Child, Command};
use toolmesh_proto::v1::{CallToolRequest, ListToolsRequest};

use crate::load::{self, Programs, RemoveOnDrop, Sample};

/// How long the upstream takes per call.
const TOOL_MS: u64 = 20;
/// Calls each worker runs at once.
const CAPACITY: usize = 4;
/// Worker counts measured.
const WORKERS: [usize; 3] = [1, 2, 4];

/// Figures of `toolmesh-bench --remote`.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct RemoteReport {
    /// Per worker count: the closed-loop sample at twice the pool's capacity.
    pub(crate) pools: Vec<(usize, Sample)>,
    /// Throughput with 4 workers over 4 × that with 1.
    pub(crate) scaling_4: f64,
    /// Throughput with 2 workers over 2 × that with 1.
    pub(crate) scaling_2: f64,
    /// One caller, the tool local to the router.
    pub(crate) local: Sample,
    /// One caller, the tool on a remote worker.
    pub(crate) remote: Sample,
}

/// Serves `GET /` after `TOOL_MS` milliseconds; returns its address.
async fn upstream() -> anyhow::Result<std::net::SocketAddr> {
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(|| async {
            tokio::time::sleep(Duration::from_millis(TOOL_MS)).await;
            "done"
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

fn tool(name: &str, url: &str) -> String {
    format!(
        "[[tools.http]]\nname = \"{name}\"\ndescription = \"waits {TOOL_MS} ms upstream\"\n\
         url = \"{url}\"\nallow_private_network = true\nmax_concurrency = 64\n"
    )
}

/// Starts a `toolmesh worker` process, killed when the returned child is dropped.
async fn start_worker(programs: &Programs, router: &str, config: &str) -> anyhow::Result<Child> {
    Command::new(&programs.toolmesh)
        .args(["worker", "--router", router, "--config", config])
        .args(["--capacity", &CAPACITY.to_string()])
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting toolmesh worker")
}

/// Waits until the router lists `tool` with `workers` workers behind it.
async fn until_workers(addr: &str, tool: &str, workers: usize) -> anyhow::Result<()> {
    let mut client = toolmesh::client::connect(addr, None).await?;
    let want = format!("{workers} worker");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let listed = client
            .list_tools(ListToolsRequest { source_name: "default".into(), ..Default::default() })
            .await?
            .into_inner();
        let status = listed
            .tools
            .iter()
            .find(|t| t.name == tool)
            .and_then(|t| t.source.as_ref())
            .map(|s| s.status.clone());
        if status.as_deref().is_some_and(|s| s.starts_with(&want)) {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{workers} workers did not join within 30 s (status {status:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs the benchmark: rounds of `duration / rounds` per phase.
pub(crate) async fn run(
    programs: &Programs,
    duration: Duration,
    warmup: Duration,
    rounds: usize,
) -> anyhow::Result<RemoteReport> {
    let url = format!("http://{}/", upstream().await?);
    let dir = std::env::temp_dir().join(format!("toolmesh-bench-remote-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let _cleanup = RemoveOnDrop(dir.clone());
    let router_config = dir.join("router.toml");
    std::fs::write(&router_config, tool("wait_local", &url))?;
    let worker_config = dir.join("worker.toml");
    std::fs::write(&worker_config, tool("wait_remote", &url))?;
    let router = load::start_child(
        &programs.toolmesh,
        &["serve", "--listen", "127.0.0.1:0", "--config", &router_config.display().to_string()],
    )
    .await?;
    let addr = router.addr.to_string();
    let clients = load::clients(&addr, 4).await?;
    load::until_embedded(&clients[0]).await?;
    let remote = CallToolRequest { name: "wait_remote".into(), ..Default::default() };
    let local = CallToolRequest { name: "wait_local".into(), ..Default::default() };

    let rounds = rounds.max(1);
    let slice = duration / rounds as u32;
    let mut workers = Vec::new();
    let mut pools = Vec::new();
    for count in WORKERS {
        while workers.len() < count {
            workers
                .push(start_worker(programs, &addr, &worker_config.display().to_string()).await?);
        }
        until_workers(&addr, "wait_remote", count).await?;
        let callers = 2 * CAPACITY * count;
        load::closed_loop(&clients, callers, warmup, &remote).await;
        let mut samples = Vec::new();
        for _ in 0..rounds {
            samples.push(load::closed_loop(&clients, callers, slice, &remote).await);
        }
        pools.push((count, load::median(samples)));
    }
    // One caller: what the remote hop adds to a call, local and remote rounds alternating.
    load::closed_loop(&clients, 1, warmup, &local).await;
    let (mut locals, mut remotes) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        locals.push(load::closed_loop(&clients, 1, slice, &local).await);
        remotes.push(load::closed_loop(&clients, 1, slice, &remote).await);
    }
    drop(workers);
    router.terminate().await?;
    let throughput =
        |n: usize| pools.iter().find(|(c, _)| *c == n).map_or(0.0, |(_, s)| s.throughput);
    let one = throughput(1).max(f64::MIN_POSITIVE);
    Ok(RemoteReport {
        scaling_4: throughput(4) / (4.0 * one),
        scaling_2: throughput(2) / (2.0 * one),
        pools,
        local: load::median(locals),
        remote: load::median(remotes),
    })
}

/// The report as a table.
pub(crate) fn render(report: &RemoteReport) -> String {
    let mut out = format!(
        "remote workers: a {TOOL_MS} ms tool, capacity {CAPACITY} per worker, closed loop at \
         twice the pool's capacity\n\
         workers   calls/s   ideal   p50 ms   p99 ms   errors\n"
    );
    for (count, sample) in &report.pools {
        let ideal = (count * CAPACITY) as f64 * 1000.0 / TOOL_MS as f64;
        out.push_str(&format!(
            "{count:>7} {:>9.0} {ideal:>7.0} {:>8.2} {:>8.2} {:>8}\n",
            sample.throughput, sample.p50_ms, sample.p99_ms, sample.errors
        ));
    }
    out.push_str(&format!(
        "scaling: 2 workers {:.2}x linear, 4 workers {:.2}x linear\n\
         one caller: local tool p50 {:.2} ms p99 {:.2} ms; remote worker p50 {:.2} ms p99 {:.2} ms; \
         the remote hop adds {:.2} ms at p50\n",
        report.scaling_2,
        report.scaling_4,
        report.local.p50_ms,
        report.local.p99_ms,
        report.remote.p50_ms,
        report.remote.p99_ms,
        report.remote.p50_ms - report.local.p50_ms,
    ));
    if let Some(error) = report.pools.iter().find_map(|(_, s)| s.first_error.clone()) {
        out.push_str(&format!("first error: {error}\n"));
    }
    out
}
