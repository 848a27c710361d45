use std::{process::Stdio, sync::Arc, time::Duration};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use rayon::prelude::*;
use rmcp::{
    ClientServiceExt, RoleClient,
    model::{
        ClientRequest, DiscoverRequest, DiscoverRequestParams, ListToolsRequest,
        PaginatedRequestParams, PingRequest, ProtocolVersion, ServerNotification, ServerResult,
        SubscriptionFilter, Tool,
    },
    service::{ClientLifecycleMode, Peer, QuitReason, RunningService, ServiceError},
    transport::{
        StreamableHttpClientTransport, TokioChildProcess,
        streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;
use toolmesh_config::McpTransport;
use toolmesh_core::{SourceKind, ToolSource};
use toolmesh_process::ProcessTag;
use toolmesh_registry::{RegistryHandle, SourceUpdate, ToolEntry};
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::{
    ServerHealth, backend::McpBackend, convert, handler::McpClientHandler,
    http_client::TracingHttpClient, naming::publish_name, schemas::compile_in_background,
    shared::ServerShared, sse::SseClientTransport,
};

/// First reconnect delay; doubled after every failed attempt up to [`BACKOFF_CAP`].
const BACKOFF_BASE: Duration = Duration::from_millis(250);
/// Longest delay between reconnect attempts.
const BACKOFF_CAP: Duration = Duration::from_secs(30);
/// Liveness probes in a row that may fail before the connection is declared lost.
const PROBE_MISSES: u32 = 3;

type Connection = RunningService<RoleClient, McpClientHandler>;

/// Messages of an [`McpClientActor`].
pub enum McpMsg {
    /// Connects now, unless connected or connecting.
    Connect,
    /// A connection attempt succeeded.
    Connected {
        /// The running connection.
        connection: Box<Connection>,
        /// A stdio server's process group, killed when the connection ends.
        group: Option<ProcessGroupGuard>,
        /// The server's tools.
        tools: Vec<Tool>,
    },
    /// A connection attempt failed.
    ConnectFailed {
        /// Why.
        reason: String,
    },
    /// The server said its tool list changed.
    ToolsChanged,
    /// The listing remembered from the last run was read (`None`: there is none).
    Remembered {
        /// Its tools.
        tools: Option<Vec<Tool>>,
    },
    /// A fresh tool list of connection `generation`.
    ToolsListed {
        /// The connection it came from.
        generation: u64,
        /// The tools.
        tools: Vec<Tool>,
    },
    /// Connection `generation` of a lazy server went unused for its idle timeout.
    Idle {
        /// The connection.
        generation: u64,
    },
    /// A call found the connection `peer` broken.
    Broken {
        /// The connection the call used.
        peer: Arc<Peer<RoleClient>>,
        /// What the call saw.
        reason: String,
    },
    /// Connection `generation` ended.
    Disconnected {
        /// The connection that ended.
        generation: u64,
        /// Why.
        reason: String,
    },
}

/// Holds the one connection to one MCP server: connects, initializes, lists the tools
/// (every page) and publishes them; follows `tools/list_changed`; notices a dead connection,
/// marks the server unhealthy (its calls then fail fast with UNAVAILABLE) and reconnects
/// with capped exponential backoff. Stopping the actor closes the connection, which kills
/// a stdio server's process group.
pub struct McpClientActor {
    pub(crate) shared: Arc<ServerShared>,
    pub(crate) registry: RegistryHandle,
}

/// The [`McpClientActor`]'s state.
#[derive(Default)]
pub struct McpClientState {
    generation: u64,
    connecting: bool,
    failures: u32,
    /// Dropping it closes the current connection. It lives in the state so that however
    /// the actor ends (stop, crash, kill), the connection and its child process end too.
    connection: Option<tokio_util::sync::DropGuard>,
    /// The tools of the last listing published, by their name on the server.
    listed: Listing,
}

/// A server's tools by their name on the server.
type Listing = Arc<std::collections::HashMap<String, Tool>>;

/// Where a listing comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// The server listed it.
    Server,
    /// The data directory kept it from the last run.
    Remembered,
}

impl McpClientActor {
    /// Spawns `task` in a span naming this server, so that what it logs says whose it is.
    fn spawn(
        &self,
        task: &'static str,
        future: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        tokio::spawn(future.instrument(info_span!("mcp", server = %self.shared.name(), task)));
    }

    fn source(&self) -> ToolSource {
        ToolSource { kind: SourceKind::Mcp, name: self.shared.name().to_owned() }
    }

    fn schedule_reconnect(&self, myself: &ActorRef<McpMsg>, state: &mut McpClientState) {
        let delay = reconnect_delay(state.failures);
        state.failures += 1;
        debug!(server = self.shared.name(), ?delay, "reconnect scheduled");
        myself.send_after(delay, || McpMsg::Connect);
    }

    /// Publishes `tools` as this server's whole set, in one registry update; a listing
    /// the same as the one published changes nothing. A listing from the server is
    /// remembered for the next run.
    async fn publish(&self, tools: Vec<Tool>, state: &mut McpClientState, origin: Origin) {
        let server = self.shared.name();
        // Naming thousands of tools and comparing them with the last listing touch every
        // byte: on a blocking thread, split across the cores, never on the actor.
        let started = std::time::Instant::now();
        let (shared, source, catalog, previous) =
            (self.shared.clone(), self.source(), self.registry.snapshot(), state.listed.clone());
        let prepared = tokio::task::spawn_blocking(move || {
            prepare(&shared, &source, &catalog, tools, &previous)
        })
        .await;
        let Prepared { listing, entries, unchanged, same } = match prepared {
            Ok(prepared) => prepared,
            Err(error) => {
                error!(server, %error, "preparing the tool listing failed; not published");
                return;
            }
        };
        let previous = std::mem::replace(&mut state.listed, listing.clone());
        // Freeing thousands of schemas takes a while: on a blocking thread, not the actor.
        tokio::task::spawn_blocking(move || drop(previous));
        if same {
            debug!(server, tools = listing.len(), "the tool listing has not changed");
            return;
        }
        let prepared_us = started.elapsed().as_micros() as u64;
        let source = self.source();
        let count = entries.len() + unchanged.len();
        let fresh: Vec<String> = entries.iter().map(|e| e.spec.name.clone()).collect();
        let update = SourceUpdate { source, tools: entries, toolkits: vec![], unchanged };
        match self.registry.replace_source(update).await {
            Ok(()) => {
                info!(server, tools = count, "mcp tools published");
                debug!(
                    server,
                    prepared_us,
                    elapsed_us = started.elapsed().as_micros() as u64,
                    "publish timings"
                );
                let catalog = self.registry.snapshot();
                let fresh = fresh.iter().filter_map(|name| catalog.get(name).cloned()).collect();
                drop(catalog);
                compile_in_background(info_span!("mcp", server, task = "compile schemas"), fresh);
                if origin == Origin::Server {
                    self.remember(listing);
                }
            }
            Err(error) => {
                error!(server, %error, "publishing the mcp tools failed");
                // The next listing is published whole.
                state.listed = Listing::default();
            }
        }
    }

    /// Writes `listing` to the data directory for the next run, on a blocking thread.
    fn remember(&self, listing: Listing) {
        let Some(remembered) = self.shared.remembered.clone() else { return };
        let ticket = remembered.ticket();
        let span = info_span!("mcp", server = %self.shared.name(), task = "remember tools");
        tokio::task::spawn_blocking(move || {
            let _span = span.enter();
            let tools = listing.par_iter().map(|(_, tool)| tool);
            if let Err(error) = remembered.store(ticket, tools) {
                warn!(
                    %error,
                    path = %remembered.path().display(),
                    "cannot keep the tool listing for the next run"
                );
            }
        });
    }
}

/// Listings of fewer tools than this are named, compared, converted and read back on the
/// calling thread, larger ones on every core. At a start a hundred servers prepare their
/// listings at once, which keeps the cores busy already, and rayon's workers, handed a
/// small job each, spin between them for CPU that publishing needs.
const PARALLEL_TOOLS: usize = 4096;

/// Maps every item of a listing with `f`: on the calling thread below [`PARALLEL_TOOLS`]
/// items, on every core from there.
pub(crate) fn map_listing<'a, T, R, C>(items: &'a [T], f: impl Fn(&'a T) -> R + Sync + Send) -> C
where
    T: Sync,
    R: Send,
    C: FromIterator<R> + FromParallelIterator<R>,
{
    if items.len() < PARALLEL_TOOLS {
        items.iter().map(f).collect()
    } else {
        items.par_iter().map(f).collect()
    }
}

/// A listing made ready for the registry.
struct Prepared {
    /// The listing, kept for the next one's comparison.
    listing: Listing,
    /// Entries of the new and changed tools.
    entries: Vec<ToolEntry>,
    /// Names of the tools that did not change.
    unchanged: Vec<String>,
    /// Whether the listing is the one published before, every tool unchanged.
    same: bool,
}

/// Names the tools of a listing, compares them with the `previous` one and builds the
/// entries of those that are new or changed (an unchanged tool keeps its entry: no
/// conversion and no schema compilation when one tool of thousands changes). A name taken
/// by another source, or by two tools of the server, is logged and left out.
fn prepare(
    shared: &Arc<ServerShared>,
    source: &ToolSource,
    catalog: &toolmesh_registry::Catalog,
    tools: Vec<Tool>,
    previous: &Listing,
) -> Prepared {
    let config = &shared.config;
    let server = shared.name();
    let check = |tool: &Tool| {
        let same = previous.get(tool.name.as_ref()) == Some(tool);
        (publish_name(config.prefix, server, &tool.name), same)
    };
    let checked: Vec<(String, bool)> = map_listing(&tools, check);
    let mut changed: Vec<(&Tool, String)> = Vec::new();
    let mut unchanged: Vec<String> = Vec::new();
    let mut published = std::collections::HashSet::new();
    for (tool, (name, same)) in tools.iter().zip(checked) {
        let existing = catalog.get(&name);
        if let Some(existing) = existing.filter(|e| e.spec.source != *source) {
            error!(
                tool = %name, server, other = %existing.spec.source,
                "tool name collides with a tool of another source; not published (set prefix = \"always\")"
            );
            continue;
        }
        if !published.insert(name.clone()) {
            error!(tool = %name, server, "two tools of the server map to one name; the second is not published");
            continue;
        }
        if existing.is_some() && same {
            unchanged.push(name);
        } else {
            changed.push((tool, name));
        }
    }
    let entry = |(tool, name): &(&Tool, String)| {
        let spec = convert::spec(server, name.clone(), tool, config.timeout);
        let backend = Arc::new(McpBackend { shared: shared.clone(), tool: tool.name.to_string() });
        // Schemas compile after publishing (see `compile_in_background`), or at a first call.
        match ToolEntry::deferred(spec, backend) {
            Ok(entry) => Some(entry),
            Err(error) => {
                warn!(tool = %name, server, %error, "tool not published");
                None
            }
        }
    };
    let entries: Vec<Option<ToolEntry>> = map_listing(&changed, entry);
    let entries: Vec<ToolEntry> = entries.into_iter().flatten().collect();
    let same = !previous.is_empty()
        && entries.is_empty()
        && unchanged.len() == tools.len()
        && previous.len() == tools.len();
    let listing = Arc::new(tools.into_iter().map(|t| (t.name.to_string(), t)).collect());
    Prepared { listing, entries, unchanged, same }
}

/// Lists every page of the server's tools. rmcp's `list_all_tools` would also keep a deep
/// copy of each page in its response cache, which toolmesh has no use for (it re-lists on
/// `tools/list_changed`) and which, for a server of thousands of tools, costs as much as
/// publishing the change.
async fn list_tools(peer: &Peer<RoleClient>) -> Result<Vec<Tool>, ServiceError> {
    let mut tools = Vec::new();
    let mut cursor = None;
    loop {
        let request = ListToolsRequest::with_param(
            PaginatedRequestParams::default().with_cursor(cursor.clone()),
        );
        let ServerResult::ListToolsResult(page) =
            peer.send_request(ClientRequest::ListToolsRequest(request)).await?
        else {
            return Err(ServiceError::UnexpectedResponse);
        };
        tools.extend(page.tools);
        // A server that hands back the cursor it was given would be listed forever.
        match page.next_cursor {
            Some(next) if cursor.as_ref() != Some(&next) => cursor = Some(next),
            _ => return Ok(tools),
        }
    }
}

/// Speaks 2026-07-28 (`server/discover`) with servers that offer it and falls back to the
/// `initialize` handshake (2025-11-25, 2025-06-18, ...) with the others.
fn lifecycle() -> ClientLifecycleMode {
    ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        legacy_version: None,
    }
}

/// Follows tool-list changes on a 2026-07-28 session, where they arrive on a
/// `subscriptions/listen` stream instead of as plain notifications.
async fn follow_tool_list(
    peer: rmcp::service::Peer<RoleClient>,
    actor: ActorRef<McpMsg>,
    lost: CancellationToken,
) {
    let filter = SubscriptionFilter::builder().tools_list_changed().build();
    let mut subscription = match peer.listen(filter).await {
        Ok(subscription) => subscription,
        Err(error) => {
            debug!(%error, "subscriptions/listen is not available");
            return;
        }
    };
    loop {
        tokio::select! {
            () = lost.cancelled() => return,
            next = subscription.next() => match next {
                Ok(Some(ServerNotification::ToolListChangedNotification(_))) => {
                    let _ = actor.cast(McpMsg::ToolsChanged);
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            },
        }
    }
}

/// Connects over the legacy HTTP+SSE transport; such servers predate `server/discover`, so
/// the `initialize` handshake is used directly.
async fn connect_sse(
    handler: McpClientHandler,
    url: &str,
    headers: &std::collections::BTreeMap<String, String>,
) -> Result<Connection, String> {
    let client = handler.shared.http_client();
    let transport =
        SseClientTransport::connect(client, url, headers).await.map_err(|e| e.to_string())?;
    handler
        .serve_with_lifecycle(transport, ClientLifecycleMode::Initialize)
        .await
        .map_err(|e| format!("initialize failed: {e}"))
}

/// Kills a stdio server's whole process tree when dropped: its process group and every
/// descendant carrying its tag, also those that left the group. A server that exits by
/// itself (rmcp closes stdio servers gracefully) would otherwise leave its children behind.
pub struct ProcessGroupGuard {
    group: i32,
    tag: ProcessTag,
}

impl Drop for ProcessGroupGuard {
    fn drop(&mut self) {
        toolmesh_process::release(self.group.unsigned_abs());
        // ESRCH (nothing left in the group) is the usual, harmless outcome.
        let group = nix::unistd::Pid::from_raw(self.group);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let (group, tag) = (self.group, self.tag.clone());
        let stragglers = move || toolmesh_process::kill_tree(Some(group), &tag);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(stragglers)),
            Err(_) => drop(std::thread::spawn(stragglers)),
        }
    }
}

/// The variables of toolmesh's environment a stdio server inherits; the rest of what it
/// gets is `env` of its configuration.
const INHERITED: [&str; 6] = ["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"];

/// Opens the connection: transport, `initialize`, then every page of `tools/list`.
async fn connect(
    shared: Arc<ServerShared>,
    actor: ActorRef<McpMsg>,
) -> Result<(Connection, Option<ProcessGroupGuard>, Vec<Tool>), String> {
    let fallback_actor = actor.clone();
    let handler = McpClientHandler { shared: shared.clone(), actor };
    let config = &shared.config;
    let mut group = None;
    let connection = match &config.transport {
        McpTransport::Stdio { command, args, env, cwd } => {
            let tag = ProcessTag::new();
            let mut cmd = tokio::process::Command::new(command);
            // A server gets the environment the MCP SDKs give theirs, not toolmesh's own
            // (which may hold keys and secrets): these few variables, and what the
            // configuration names.
            cmd.env_clear()
                .envs(INHERITED.iter().filter_map(|name| Some((name, std::env::var_os(name)?))))
                .args(args)
                .envs(env)
                .env(toolmesh_process::TAG_VAR, tag.as_str());
            if let Some(cwd) = cwd {
                cmd.current_dir(cwd);
            }
            let mut wrapped = process_wrap::tokio::CommandWrap::from(cmd);
            wrapped
                .wrap(process_wrap::tokio::ProcessGroup::leader())
                .wrap(process_wrap::tokio::KillOnDrop);
            let (transport, stderr) = toolmesh_process::spawn_managed(
                || TokioChildProcess::builder(wrapped).stderr(Stdio::piped()).spawn(),
                |(transport, _)| transport.id(),
            )
            .map_err(|e| format!("cannot start {}: {e}", command.display()))?;
            // The child leads its own process group (ProcessGroup::leader), so its pid is
            // the group id.
            group = transport
                .id()
                .and_then(|pid| i32::try_from(pid).ok())
                .map(|group| ProcessGroupGuard { group, tag });
            if let Some(stderr) = stderr {
                let server = config.name.clone();
                tokio::spawn(
                    async move {
                        let mut lines = BufReader::new(stderr).lines();
                        while let Ok(Some(line)) = lines.next_line().await {
                            debug!("stderr: {line}");
                        }
                    }
                    .instrument(info_span!("mcp", server = %server, task = "stderr")),
                );
            }
            handler
                .serve_with_lifecycle(transport, lifecycle())
                .await
                .map_err(|e| format!("initialize failed: {e}"))?
        }
        McpTransport::StreamableHttp { url, headers, sse_fallback } => {
            let mut http = StreamableHttpClientTransportConfig::with_uri(url.clone());
            for (name, value) in headers {
                let name = name.parse().map_err(|e| format!("header {name}: {e}"))?;
                let value = value.parse().map_err(|e| format!("header value: {e}"))?;
                http.custom_headers.insert(name, value);
            }
            http.max_concurrent_requests = 256;
            let client = TracingHttpClient::new(shared.http_client(), shared.call_headers.clone());
            let transport = StreamableHttpClientTransport::with_client(client, http);
            match handler.serve_with_lifecycle(transport, lifecycle()).await {
                Ok(connection) => connection,
                Err(error) if *sse_fallback => {
                    debug!(server = %config.name, %error, "streamable HTTP failed; trying legacy SSE");
                    let handler =
                        McpClientHandler { shared: shared.clone(), actor: fallback_actor };
                    connect_sse(handler, url, headers).await.map_err(|sse| {
                        format!("streamable HTTP failed ({error}); legacy SSE failed too ({sse})")
                    })?
                }
                Err(error) => return Err(format!("initialize failed: {error}")),
            }
        }
        McpTransport::Sse { url, headers } => connect_sse(handler, url, headers).await?,
    };
    let listing = std::time::Instant::now();
    let tools = list_tools(&connection).await.map_err(|e| format!("tools/list failed: {e}"))?;
    debug!(
        server = %config.name,
        tools = tools.len(),
        elapsed_us = listing.elapsed().as_micros() as u64,
        "tools listed"
    );
    Ok((connection, group, tools))
}

/// Closes a lazy server's connection `generation` once it has gone unused for the idle
/// timeout.
/// The delay before the next reconnect after `failures` failed attempts in a row.
fn reconnect_delay(failures: u32) -> Duration {
    BACKOFF_BASE.saturating_mul(1 << failures.min(16)).min(BACKOFF_CAP)
}

async fn watch_idle(
    shared: Arc<ServerShared>,
    actor: ActorRef<McpMsg>,
    lost: CancellationToken,
    generation: u64,
) {
    let idle = shared.config.idle_timeout;
    let step = (idle / 4).max(Duration::from_millis(20));
    loop {
        tokio::select! {
            () = lost.cancelled() => return,
            () = tokio::time::sleep(step) => {}
        }
        if shared.unused_for() >= idle && shared.inflight_calls().is_empty() {
            let _ = actor.cast(McpMsg::Idle { generation });
            return;
        }
    }
}

/// Probes the server every `interval` while connection `generation` lives, with the
/// lightest request its protocol revision defines: `ping` up to 2025-11-25, and
/// `server/discover` on 2026-07-28, which has no `ping`. Any answer, a JSON-RPC error
/// included, proves the peer alive; a closed transport, or [`PROBE_MISSES`] probes in a
/// row that fail or go unanswered within `interval` (after a miss, the next comes at a
/// fifth of the interval), declare the connection lost.
async fn probe(
    peer: rmcp::service::Peer<RoleClient>,
    modern: bool,
    interval: Duration,
    lost: CancellationToken,
    actor: ActorRef<McpMsg>,
    generation: u64,
) {
    let mut missed = 0;
    loop {
        // After a miss the next probe comes sooner: a dead server is found within about an
        // interval, and calls waiting on it (repeated ones too) learn it in seconds.
        let wait =
            if missed == 0 { interval } else { (interval / 5).max(Duration::from_millis(200)) };
        tokio::select! {
            () = lost.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        let request = if modern {
            ClientRequest::DiscoverRequest(DiscoverRequest::new(DiscoverRequestParams {}))
        } else {
            ClientRequest::PingRequest(PingRequest::default())
        };
        let miss = match tokio::time::timeout(interval, peer.send_request(request)).await {
            Ok(Ok(_) | Err(ServiceError::McpError(_) | ServiceError::UnexpectedResponse)) => {
                missed = 0;
                continue;
            }
            // The transport itself is gone: there is nothing to wait for.
            Ok(Err(ServiceError::TransportClosed)) => {
                let reason = "liveness probe failed: the transport is closed".to_owned();
                let _ = actor.cast(McpMsg::Disconnected { generation, reason });
                return;
            }
            Ok(Err(error)) => format!("liveness probe failed: {error}"),
            Err(_) => format!("no answer to the liveness probe within {interval:?}"),
        };
        // A server busy or starved for a moment is not a lost one: only several probes in
        // a row unanswered are.
        missed += 1;
        if missed < PROBE_MISSES {
            debug!(generation, missed, reason = %miss, "liveness probe missed");
            continue;
        }
        let reason = format!("{PROBE_MISSES} liveness probes in a row failed; the last: {miss}");
        let _ = actor.cast(McpMsg::Disconnected { generation, reason });
        return;
    }
}

fn describe(reason: Result<QuitReason, tokio::task::JoinError>) -> String {
    match reason {
        Ok(QuitReason::Cancelled) => "closed by toolmesh".into(),
        Ok(QuitReason::Closed) => "the server closed the connection".into(),
        Ok(other) => format!("{other:?}"),
        Err(error) => format!("connection task failed: {error}"),
    }
}

impl Actor for McpClientActor {
    type Msg = McpMsg;
    type State = McpClientState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<McpMsg>,
        _: (),
    ) -> Result<Self::State, ActorProcessingErr> {
        self.shared.actor.store(Some(Arc::new(myself.clone())));
        if let Some(remembered) = self.shared.remembered.clone() {
            let actor = myself.clone();
            self.spawn("remembered", async move {
                let loaded = tokio::task::spawn_blocking(move || remembered.load()).await;
                let tools = match loaded {
                    Ok(Ok(tools)) => tools,
                    Ok(Err(reason)) => {
                        warn!(%reason, "the tools remembered from the last run cannot be read");
                        None
                    }
                    Err(error) => {
                        warn!(%error, "reading the tools remembered from the last run failed");
                        None
                    }
                };
                let _ = actor.cast(McpMsg::Remembered { tools });
            });
        }
        // Without a remembered listing, connect now: lazy servers too, to learn their tools
        // (they close when idle). With one, once it is published: it is the quicker of the
        // two, and on a busy machine they would compete.
        if self.shared.remembered.is_none() {
            myself.cast(McpMsg::Connect)?;
        }
        Ok(McpClientState::default())
    }

    async fn post_stop(
        &self,
        _: ActorRef<McpMsg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        self.shared.peer.store(None);
        *self.shared.lost_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(tokio::time::Instant::now());
        self.shared.lost.load().cancel();
        state.connection = None;
        let update = SourceUpdate {
            source: self.source(),
            tools: vec![],
            toolkits: vec![],
            unchanged: vec![],
        };
        let _ = self.registry.replace_source(update).await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<McpMsg>,
        message: McpMsg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let server = self.shared.name();
        match message {
            McpMsg::Connect => {
                if state.connecting || self.shared.peer.load().is_some() {
                    return Ok(());
                }
                state.connecting = true;
                let (shared, actor) = (self.shared.clone(), myself.clone());
                // Bounded by the server's timeout, so a server that never answers cannot
                // keep the actor waiting.
                let limit = self.shared.config.timeout;
                self.spawn("connect", async move {
                    let message =
                        match tokio::time::timeout(limit, connect(shared, actor.clone())).await {
                            Ok(Ok((connection, group, tools))) => {
                                McpMsg::Connected { connection: Box::new(connection), group, tools }
                            }
                            Ok(Err(reason)) => McpMsg::ConnectFailed { reason },
                            Err(_) => McpMsg::ConnectFailed {
                                reason: format!("no answer within {limit:?}"),
                            },
                        };
                    let _ = actor.cast(message);
                });
            }
            McpMsg::Connected { connection, group, tools } => {
                state.connecting = false;
                state.failures = 0;
                state.generation += 1;
                let generation = state.generation;
                let protocol = connection.peer_info().map(|i| i.protocol_version.to_string());
                info!(
                    server,
                    tools = tools.len(),
                    protocol = protocol.as_deref().unwrap_or("?"),
                    "mcp server connected"
                );
                self.shared.protocol.store(protocol.map(Arc::new));
                let peer = connection.peer().clone();
                let modern = connection
                    .peer_info()
                    .is_some_and(|info| info.protocol_version >= ProtocolVersion::V_2026_07_28);
                // The new token before the new peer: a call that sees the peer sees its token.
                self.shared.lost.store(Arc::new(CancellationToken::new()));
                self.shared.peer.store(Some(Arc::new(peer.clone())));
                let close = CancellationToken::new();
                state.connection = Some(close.clone().drop_guard());
                if modern {
                    let lost = CancellationToken::clone(&self.shared.lost.load());
                    self.spawn(
                        "subscription",
                        follow_tool_list(peer.clone(), myself.clone(), lost),
                    );
                }
                if let Some(interval) = self.shared.config.ping_interval {
                    let lost = CancellationToken::clone(&self.shared.lost.load());
                    self.spawn(
                        "liveness",
                        probe(peer, modern, interval, lost, myself.clone(), generation),
                    );
                }
                let actor = myself.clone();
                self.spawn("connection", async move {
                    let _group = group;
                    tokio::select! {
                        reason = connection.waiting() => {
                            let reason = describe(reason);
                            let _ = actor.cast(McpMsg::Disconnected { generation, reason });
                        }
                        // Dropping the connection closes its transport and kills a stdio
                        // server's process group.
                        () = close.cancelled() => {}
                    }
                });
                // Healthy first: the health board is current by the time the tools are
                // listed.
                self.shared.set_health(ServerHealth::Healthy);
                self.publish(tools, state, Origin::Server).await;
                self.shared.touch();
                self.shared.attempts.send_modify(|n| *n += 1);
                if self.shared.config.connect == toolmesh_config::ConnectMode::Lazy {
                    let (shared, actor) = (self.shared.clone(), myself.clone());
                    let lost = CancellationToken::clone(&self.shared.lost.load());
                    self.spawn("idle", watch_idle(shared, actor, lost, generation));
                }
            }
            McpMsg::ConnectFailed { reason } => {
                state.connecting = false;
                // The change of state is logged once; retries while down only at debug level.
                let attempt = state.failures + 1;
                if matches!(**self.shared.health.load(), ServerHealth::Unhealthy { .. }) {
                    debug!(server, %reason, attempt, "mcp server still unreachable");
                } else {
                    warn!(server, %reason, attempt, "mcp server connection failed; retrying with backoff");
                }
                crate::metrics::connection_failed(server, "connect");
                self.shared.set_health(ServerHealth::Unhealthy { reason });
                self.shared.attempts.send_modify(|n| *n += 1);
                self.schedule_reconnect(&myself, state);
            }
            McpMsg::Idle { generation } => {
                if generation == state.generation && self.shared.peer.load().is_some() {
                    self.shared.peer.store(None);
                    self.shared.lost.load().cancel();
                    state.connection = None;
                    info!(server, "closed the unused connection of a lazy server");
                    self.shared.set_health(ServerHealth::Idle);
                }
            }
            McpMsg::Remembered { tools } => {
                let lazy = self.shared.config.connect == toolmesh_config::ConnectMode::Lazy;
                // The server's own listing, when it came first, is newer.
                let first = state.generation == 0 && state.listed.is_empty();
                let remembered = match tools {
                    Some(tools) if first => {
                        info!(
                            server,
                            tools = tools.len(),
                            "publishing the tools remembered from the last run"
                        );
                        self.publish(tools, state, Origin::Remembered).await;
                        true
                    }
                    _ => false,
                };
                if remembered && lazy {
                    // Opened by the first call of one of its tools.
                    if !state.connecting && self.shared.peer.load().is_none() {
                        self.shared.set_health(ServerHealth::Idle);
                    }
                } else {
                    // An eager server; or a lazy one, once, to learn its tools.
                    myself.cast(McpMsg::Connect)?;
                }
            }
            McpMsg::ToolsChanged => {
                let Some(peer) = self.shared.peer.load_full() else { return Ok(()) };
                let (actor, generation) = (myself.clone(), state.generation);
                self.spawn("relist", async move {
                    let started = std::time::Instant::now();
                    match list_tools(&peer).await {
                        Ok(tools) => {
                            debug!(
                                tools = tools.len(),
                                elapsed_us = started.elapsed().as_micros() as u64,
                                "tools re-listed"
                            );
                            let _ = actor.cast(McpMsg::ToolsListed { generation, tools });
                        }
                        Err(error) => warn!(%error, "re-listing tools after list_changed failed"),
                    }
                });
            }
            McpMsg::ToolsListed { generation, tools } => {
                if generation == state.generation {
                    let started = std::time::Instant::now();
                    self.publish(tools, state, Origin::Server).await;
                    debug!(
                        server,
                        elapsed_us = started.elapsed().as_micros() as u64,
                        "re-published"
                    );
                }
            }
            McpMsg::Broken { peer, reason } => {
                let current = self.shared.peer.load_full();
                if current.is_some_and(|current| Arc::ptr_eq(&current, &peer)) {
                    self.lose(&myself, state, reason);
                }
            }
            McpMsg::Disconnected { generation, reason } => {
                if generation == state.generation {
                    self.lose(&myself, state, reason);
                }
            }
        }
        Ok(())
    }
}

impl McpClientActor {
    /// Marks the current connection lost: its calls in flight end with
    /// [`BackendError::Lost`](toolmesh_core::BackendError::Lost), new ones fail with
    /// UNAVAILABLE (repeated ones wait for the connection), and a reconnect is scheduled.
    fn lose(&self, myself: &ActorRef<McpMsg>, state: &mut McpClientState, reason: String) {
        let server = self.shared.name();
        self.shared.peer.store(None);
        *self.shared.lost_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(tokio::time::Instant::now());
        self.shared.lost.load().cancel();
        state.connection = None;
        warn!(server, %reason, "mcp server disconnected; its calls fail with UNAVAILABLE until it is back");
        crate::metrics::connection_failed(server, "disconnect");
        self.shared.set_health(ServerHealth::Unhealthy { reason });
        self.schedule_reconnect(myself, state);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

    use tokio::{sync::mpsc, time::Instant};

    use super::*;

    #[test]
    fn reconnects_back_off_exponentially_up_to_the_cap() {
        let delays: Vec<u64> = (0..10).map(|n| reconnect_delay(n).as_millis() as u64).collect();
        assert_eq!(delays, [250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]);
        assert_eq!(reconnect_delay(u32::MAX), BACKOFF_CAP);
    }

    /// Records the generations it is told are idle.
    struct Recorder(mpsc::UnboundedSender<u64>);

    impl Actor for Recorder {
        type Msg = McpMsg;
        type State = ();
        type Arguments = ();

        async fn pre_start(&self, _: ActorRef<McpMsg>, _: ()) -> Result<(), ActorProcessingErr> {
            Ok(())
        }

        async fn handle(
            &self,
            _: ActorRef<McpMsg>,
            message: McpMsg,
            _: &mut (),
        ) -> Result<(), ActorProcessingErr> {
            if let McpMsg::Idle { generation } = message {
                let _ = self.0.send(generation);
            }
            Ok(())
        }
    }

    /// On tokio's paused clock, with the shipped idle timeout of a lazy server: a call
    /// half-way restarts the count, and the connection is given up one timeout after it.
    #[tokio::test(start_paused = true)]
    async fn an_unused_lazy_connection_is_given_up_one_idle_timeout_after_its_last_call() {
        let toml = "[[mcp.servers]]\nname = \"lazy\"\ntransport = \"stdio\"\ncommand = \"true\"\nconnect = \"lazy\"\n";
        let config = toolmesh_config::load_str(Some(("t.toml", toml)), &Default::default())
            .unwrap()
            .mcp
            .servers
            .remove(0);
        let idle = config.idle_timeout;
        let shared = ServerShared::new(config, Arc::default(), None);
        shared.touch();
        let (tx, mut told) = mpsc::unbounded_channel();
        let (recorder, _) = Actor::spawn(None, Recorder(tx), ()).await.unwrap();
        let started = Instant::now();
        tokio::spawn(watch_idle(shared.clone(), recorder.clone(), CancellationToken::new(), 7));

        tokio::time::sleep(idle / 2).await;
        shared.touch();
        let told = tokio::time::timeout(idle * 3, told.recv()).await.expect("told it is idle");
        assert_eq!(told, Some(7));
        let waited = started.elapsed();
        let last_call = idle / 2;
        // Checked every quarter of the timeout.
        assert!(waited >= last_call + idle, "{waited:?}");
        assert!(waited <= last_call + idle + idle / 4, "{waited:?}");
        recorder.stop(None);
    }
}
