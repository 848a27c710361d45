//! `toolmesh-bench`: toolmesh's benchmarks, kept out of the serving binary.
//!
//! - [`load`]: `CallTool` against a toolmesh and against a bare tonic echo server, in
//!   alternating rounds; the MCP proxying benchmark; the tool-search benchmark.
//! - [`embed`]: the embedding model alone, query latency and batch throughput.
//! - [`mcp_echo`]: the MCP echo server those benchmarks put behind toolmesh, and a plain MCP
//!   client driving it directly.
//!
//! The servers under test are child processes: `toolmesh serve` (the binary beside this
//! one, or `--toolmesh`), and this binary itself with a hidden flag for the echo servers.

mod embed;
mod knowledge;
mod load;
mod mcp_echo;
mod policy;
mod remote;

use std::{io::Write as _, path::PathBuf, process::ExitCode, time::Duration};

use clap::Parser;

/// toolmesh's benchmarks. Without a mode flag it measures CallTool throughput and latency
/// against a toolmesh server and against a bare tonic echo server; --mcp measures MCP
/// proxying, --remote remote worker pools, --policy the tool policy's cost, --search a
/// tool-search benchmark, --embed the embedding model alone.
#[derive(Parser)]
#[command(name = "toolmesh-bench", version, about, long_about = None)]
struct Cli {
    /// A running toolmesh to measure; without it the bench starts one with the defaults.
    #[arg(long)]
    server: Option<String>,
    /// Concurrent callers.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// HTTP/2 connections the callers share.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Seconds per measured phase and server, split into the rounds [default: 10; 20 with
    /// --policy].
    #[arg(long)]
    duration: Option<f64>,
    /// Seconds of unmeasured warm-up before each phase.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// The tool to call.
    #[arg(long, default_value = "echo")]
    tool: String,
    /// Its arguments, as JSON.
    #[arg(long, default_value = r#"{"message":"hello"}"#)]
    arguments: String,
    /// Skip the bare tonic echo baseline.
    #[arg(long)]
    no_baseline: bool,
    /// Skip the open-loop phase at half of the maximum.
    #[arg(long)]
    no_half_load: bool,
    /// Rounds per phase, alternating between the servers; medians are reported [default: 5;
    /// 20 with --policy, whose figures are medians of the rounds' ratios].
    #[arg(long)]
    rounds: Option<usize>,
    /// Measure CallTool through toolmesh to a streamable-HTTP MCP echo server against an MCP
    /// client calling that server directly.
    #[arg(long)]
    mcp: bool,
    /// Drive the MCP endpoint at this URL (any MCP server or gateway, a peer's too) with the
    /// compiled MCP client of --mcp, calling --tool with --arguments: throughput, latency
    /// and, with --pid, the CPU time per call of the process serving it.
    #[arg(long, value_name = "URL", conflicts_with_all = ["mcp", "remote", "policy"])]
    mcp_endpoint: Option<String>,
    /// With --mcp-endpoint: the process serving the endpoint on this machine (Linux).
    #[arg(long, requires = "mcp_endpoint")]
    pid: Option<u32>,
    /// Measure remote worker pools: a 20 ms tool on 1, 2 and 4 `toolmesh worker` processes
    /// of capacity 4 (throughput and how linear it scales), and the latency the remote hop
    /// adds to a call against the same tool local to the router.
    #[arg(long, conflicts_with = "mcp")]
    remote: bool,
    /// Measure the tool policy's cost: CallTool from ten principals against a toolmesh with
    /// a policy of fifty rules (globs and one CEL condition, every call audited) and one
    /// without: throughput, and p99 at half load.
    #[arg(long, conflicts_with_all = ["mcp", "remote"])]
    policy: bool,
    /// With --policy: leave the CEL condition out of the fifty rules (49 rules), to see
    /// what the condition's evaluation costs.
    #[arg(long, requires = "policy")]
    policy_without_cel: bool,
    /// With --policy: audit nowhere (`[policy.audit] to = "off"`), to see what writing the
    /// audit log costs.
    #[arg(long, requires = "policy")]
    policy_without_audit: bool,
    /// With --policy: a control run, in which the second server has no policy either, to
    /// see how far the figures stray when the two servers are the same.
    #[arg(long, requires = "policy")]
    policy_control: bool,
    /// With --policy: keep the load generator on the first half of the cores and the
    /// servers on the rest, so that neither takes CPU from the other and half load is half
    /// of what the servers' own cores can take. Each process starts on its cores, so its
    /// runtime runs one worker thread per core it has (Linux only).
    #[arg(long, requires = "policy")]
    pin: bool,
    /// Serve the bare echo baseline instead (used by the bench itself).
    #[arg(long, hide = true)]
    echo_server: bool,
    /// Serve the MCP echo server instead (used by the bench itself).
    #[arg(long, hide = true)]
    mcp_echo_server: bool,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// The toolmesh binary to start the servers under test with; default: `toolmesh` beside
    /// this binary.
    #[arg(long, env = "TOOLMESH_BIN")]
    toolmesh: Option<PathBuf>,
    /// Tools for the MCP echo server, as JSON Lines (used by the bench itself).
    #[arg(long, hide = true)]
    tools: Option<PathBuf>,
    /// Measure SearchTools on the tool-search benchmark in this directory (tools.jsonl,
    /// queries-dev.jsonl): recall, NDCG, latency, indexing time.
    #[arg(long, value_name = "DIR")]
    search: Option<PathBuf>,
    /// With --search: start toolmesh on an empty data directory, so that every tool is
    /// embedded (the first start ever); without it, the vectors of earlier runs are reused.
    #[arg(long, requires = "search")]
    fresh: bool,
    /// With --search: grow the catalog to this many tools with variants of the benchmark's
    /// tools (near-duplicates with an edition word in the name and description); the
    /// labels still name the originals.
    #[arg(long, requires = "search", value_name = "TOOLS")]
    scale: Option<usize>,
    /// With --search: serve the catalog from this many MCP servers instead of one (tool i on
    /// server i mod N), as a large catalog comes from many sources; the changes of the
    /// re-index rounds are on the first server.
    #[arg(long, default_value_t = 1, value_name = "N")]
    servers: usize,
    /// Measure a knowledge collection on the corpus in this directory (corpus.jsonl,
    /// queries-dev.jsonl, as BEIR SciFact in shared/bench/knowledge): ingestion through
    /// KnowledgeService, every query through the collection's tool, document-level
    /// Recall@5/10 and NDCG@10, latency and ingestion throughput.
    #[arg(long, value_name = "DIR", conflicts_with = "search")]
    knowledge: Option<PathBuf>,
    /// With --knowledge: the collection's chunk size, in tokens.
    #[arg(long, default_value_t = 120, requires = "knowledge")]
    chunk_tokens: usize,
    /// With --knowledge: the collection's chunk overlap, in tokens.
    #[arg(long, default_value_t = 24, requires = "knowledge")]
    chunk_overlap: usize,
    /// Measure the embedding model alone on the tool-search benchmark in this directory:
    /// one dev query at a time (p50, p99) and tool texts in batches (texts per second).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["search", "knowledge"])]
    embed: Option<PathBuf>,
    /// With --search: the data directory of the toolmesh under test (default: one under
    /// the system's temporary directory, kept between runs).
    #[arg(long, requires = "search", value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // With --pin the load generator keeps to its cores from its first thread on, so that
    // its runtime sizes itself to them.
    let pinned = match cli.pin.then(pin_load_generator).transpose() {
        Ok(pinned) => pinned,
        Err(error) => {
            eprintln!("toolmesh-bench: {error:#}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("toolmesh-bench: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli, pinned)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("toolmesh-bench: {error:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: Cli, pinned: Option<policy::Cores>) -> anyhow::Result<ExitCode> {
    if args.echo_server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("echo listening on {}", listener.local_addr()?);
        std::io::stdout().flush()?;
        load::serve_echo(listener).await?;
        return Ok(ExitCode::SUCCESS);
    }
    if args.mcp_echo_server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("mcp echo listening on {}", listener.local_addr()?);
        std::io::stdout().flush()?;
        match (&args.tools, args.servers) {
            (Some(path), servers) if servers > 1 => {
                let servers = mcp_echo::EchoServer::from_file_shared(path, servers)?;
                mcp_echo::serve_echoes(listener, servers).await?;
            }
            (Some(path), _) => {
                mcp_echo::serve_echo(listener, mcp_echo::EchoServer::from_file(path)?).await?;
            }
            (None, _) => mcp_echo::serve_echo(listener, mcp_echo::EchoServer::default()).await?,
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(dir) = &args.embed {
        // The model alone: no server, so no toolmesh binary to find.
        let report = embed::run(dir)?;
        print_report(args.json, &embed::render(&report), &serde_json::to_value(&report)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let options = load::BenchOptions {
        server: args.server,
        concurrency: args.concurrency.max(1),
        connections: args.connections.max(1),
        duration: Duration::from_secs_f64(args.duration.unwrap_or(if args.policy {
            20.0
        } else {
            10.0
        })),
        warmup: Duration::from_secs_f64(args.warmup),
        tool: args.tool,
        arguments: args.arguments,
        baseline: !args.no_baseline,
        half_load: !args.no_half_load,
        rounds: args.rounds.unwrap_or(if args.policy { 20 } else { 5 }).max(1),
    };
    let bench = std::env::current_exe()?;
    let toolmesh = match args.toolmesh {
        Some(path) => path,
        None => bench.with_file_name("toolmesh"),
    };
    anyhow::ensure!(
        toolmesh.exists(),
        "{} not found: build it first (cargo build --release --bins) or give --toolmesh",
        toolmesh.display()
    );
    let programs = load::Programs { toolmesh, bench };
    let (table, json) = if let Some(dir) = &args.knowledge {
        let report = knowledge::run(dir, &programs, args.chunk_tokens, args.chunk_overlap).await?;
        (knowledge::render(&report), serde_json::to_value(&report)?)
    } else if let Some(dir) = &args.search {
        let report = load::run_search(
            dir,
            &programs,
            load::SearchSetup {
                fresh: args.fresh,
                data_dir: args.data_dir.as_deref(),
                scale: args.scale,
                servers: args.servers,
            },
        )
        .await?;
        (load::render_search(&report), serde_json::to_value(&report)?)
    } else if args.remote {
        let report =
            remote::run(&programs, options.duration, options.warmup, options.rounds).await?;
        (remote::render(&report), serde_json::to_value(&report)?)
    } else if args.policy {
        let variant = policy::Variant {
            cel: !args.policy_without_cel,
            audit: !args.policy_without_audit,
            control: args.policy_control,
        };
        let report = policy::run(&options, &programs, variant, pinned).await?;
        (policy::render(&report), serde_json::to_value(&report)?)
    } else if let Some(url) = &args.mcp_endpoint {
        let report = load::run_mcp_endpoint(&options, url, args.pid).await?;
        (load::render_mcp_endpoint(&options, &report), serde_json::to_value(&report)?)
    } else if args.mcp {
        let report = load::run_mcp(&options, &programs).await?;
        (load::render_mcp(&options, &report), serde_json::to_value(&report)?)
    } else {
        let report = load::run(&options, &programs).await?;
        (load::render(&options, &report), serde_json::to_value(&report)?)
    };
    print_report(args.json, &table, &json)?;
    Ok(ExitCode::SUCCESS)
}

/// Splits the cores between the load generator and the servers, and keeps this process on
/// the load generator's.
fn pin_load_generator() -> anyhow::Result<policy::Cores> {
    let cores = policy::Cores::split()?;
    load::pin_thread(&cores.load)?;
    Ok(cores)
}

/// Prints a report as its table, or as JSON with `--json`.
fn print_report(json: bool, table: &str, value: &serde_json::Value) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!("{table}");
    }
    Ok(())
}
