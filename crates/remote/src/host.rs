//! The worker's side of the worker protocol (`toolmesh worker`): a process that serves
//! local tools (built-in, HTTP and command tools of its own config file) for routers it
//! connects to. How it reaches a router (TLS, its credential) is the caller's [`Dial`].
//!
//! The worker resolves the router's address and holds one session with every address it
//! resolves to (router replicas behind a Kubernetes headless Service all see it), resolving
//! again periodically; each session announces the worker's tools and capacity, takes
//! calls, and reconnects with backoff when it breaks. Its calls run on the same supervised
//! worker pool as a router's local tools, at most `capacity` at once in the whole process.
//! On SIGTERM it drains: it tells every router, which sends it nothing new, finishes the
//! calls it has within the grace period, then leaves.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use anyhow::Context as _;
use prost::Message as _;
use serde::Deserialize;
use tokio::{
    sync::{Semaphore, mpsc, watch},
    task::JoinSet,
    time::Instant,
};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use toolmesh_config::{Config, ConfigError, Reading, Section, SectionDef};
use toolmesh_core::{BackendError, CallContext, CallEvent, EventSink, Provider as _, SourceKind};
use toolmesh_proto::{
    convert,
    v1::{
        self, WorkerMessage, router_message, worker_call_event, worker_call_result,
        worker_message::Message, worker_service_client::WorkerServiceClient,
    },
};
use toolmesh_registry::RegistryHandle;
use toolmesh_telemetry::names;
use toolmesh_tools::{BUILTIN_SOURCE, BuiltinConfig, LocalProvider, LocalTools, ToolsConfig};
use toolmesh_workers::WorkersConfig;
use tracing::{Instrument, debug, info, info_span, warn};

/// The section of a worker's config file that only workers read.
pub const WORKER_SECTION: &str = "worker";

/// `[worker]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// The pool the worker's tools belong to (`remote:<pool>` in the catalog).
    pub pool: String,
    /// Calls the worker runs at once, in all its sessions; 0: `[workers] size`.
    pub capacity: usize,
    /// Serve the built-in tools too (`[builtin]`); off by default, since every router has
    /// its own.
    pub builtins: bool,
    /// How often the router's name is resolved again, in milliseconds.
    pub resolve_interval_ms: u64,
    /// The id the worker announces; empty: `<hostname>-<pid>`.
    pub id: String,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            pool: crate::DEFAULT_POOL.into(),
            capacity: 0,
            builtins: false,
            resolve_interval_ms: 30_000,
            id: String::new(),
        }
    }
}

impl Section for WorkerConfig {
    const NAME: &'static str = WORKER_SECTION;
    const DEFAULTS: &'static str = include_str!("worker.toml");

    fn read(value: toml::Value, cx: &Reading<'_>) -> Result<Self, ConfigError> {
        cx.deserialize(value)
    }
}

/// The sections of a worker's file beside the core ones: its own and the local tools'.
pub const SECTIONS: [SectionDef; 4] = [
    SectionDef::of::<WorkerConfig>(),
    SectionDef::of::<WorkersConfig>(),
    SectionDef::of::<BuiltinConfig>(),
    SectionDef::of::<ToolsConfig>(),
];

/// Returns whether `config` is a worker's file: it has a `[worker]` section, which a
/// router does not read.
pub fn is_worker_file(config: &Config) -> bool {
    config.has(WORKER_SECTION)
}

/// Checks a worker's file as `toolmesh worker` reads it: its sections, and no section a
/// worker does not read.
pub fn check(config: &Config) -> anyhow::Result<()> {
    config.check_sections(&SECTIONS.map(|section| section.name))?;
    for section in SECTIONS {
        section.check(config)?;
    }
    Ok(())
}

/// What `toolmesh worker` was asked.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// The routers: each `host:port` (or `https://host:port`), a DNS name that may
    /// resolve to several routers.
    pub routers: Vec<String>,
    /// Overrides `[worker] pool`.
    pub pool: Option<String>,
    /// Overrides `[worker] capacity`.
    pub capacity: Option<usize>,
    /// Where the worker's own gRPC health service listens, if anywhere: SERVING while it
    /// has a session with at least one router.
    pub health_listen: Option<SocketAddr>,
}

/// How a worker reaches a router: the URL of a router's address (its scheme says whether
/// TLS is spoken), a connection to one address a router's name resolved to, and the
/// worker's credential on every request.
#[async_trait::async_trait]
pub trait Dial: Send + Sync + 'static {
    /// The URL of `router` (`host:port`, or a URL).
    fn url(&self, router: &str) -> String;

    /// A channel to `addr`, which `url` resolved to (TLS verifies the router by the URL's
    /// host name).
    async fn connect(&self, url: &str, addr: SocketAddr) -> anyhow::Result<Channel>;

    /// Adds the worker's credential to a request.
    fn authorize(&self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status>;
}

/// The state of the sessions, by router address, for health and logs.
type Sessions = Arc<Mutex<BTreeMap<SocketAddr, bool>>>;

/// What every session of the worker shares.
struct Host {
    registry: RegistryHandle,
    hello: v1::WorkerHello,
    /// The capacity, across sessions.
    slots: Semaphore,
    /// Cancelled on SIGTERM: drain.
    draining: CancellationToken,
    sessions: Sessions,
    /// Told when the sessions change.
    changed: watch::Sender<()>,
    /// How routers are reached.
    dial: Arc<dyn Dial>,
}

/// Runs a worker until `shutdown` resolves and its calls are finished (or `grace` passed).
/// Returns whether every call finished within the grace period.
pub async fn run(
    mut config: Config,
    options: WorkerOptions,
    dial: Arc<dyn Dial>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<bool> {
    check(&config)?;
    let section: WorkerConfig = config.get()?;
    if !section.builtins {
        config.set("builtin.echo", false);
        config.set("builtin.reasoning", false);
    }
    let workers: WorkersConfig = config.get()?;
    let capacity = options
        .capacity
        .or(Some(section.capacity).filter(|c| *c > 0))
        .unwrap_or(workers.size.get());
    anyhow::ensure!(capacity > 0, "worker capacity must be at least 1");
    let pool = options.pool.clone().unwrap_or(section.pool.clone());

    let registry = RegistryHandle::start().await.context("starting the registry")?;
    let local = LocalProvider::new(&workers, registry.clone(), LocalTools::default())
        .await
        .context("starting the worker pool")?;
    local.start(&config).await?;
    let catalog = registry.snapshot();
    let tools: Vec<v1::Tool> = catalog
        .iter()
        .map(|(_, e)| e)
        .filter(|e| e.spec.source.kind == SourceKind::Local)
        .filter(|e| section.builtins || e.spec.source.name != BUILTIN_SOURCE)
        .map(|e| convert::tool(&e.spec, toolmesh_core::Health::up()))
        .collect();
    anyhow::ensure!(!tools.is_empty(), "the worker has no tools to serve (see [[tools.*]])");
    let id = if section.id.is_empty() { default_id() } else { section.id.clone() };
    info!(worker = %id, pool, capacity, tools = tools.len(), routers = ?options.routers, "worker starting");
    let host = Arc::new(Host {
        registry,
        hello: v1::WorkerHello {
            worker_id: id,
            pool,
            capacity: u32::try_from(capacity).unwrap_or(u32::MAX),
            tools,
        },
        slots: Semaphore::new(capacity),
        draining: CancellationToken::new(),
        sessions: Sessions::default(),
        changed: watch::Sender::new(()),
        dial,
    });
    if let Some(addr) = options.health_listen {
        serve_health(addr, host.clone()).await?;
    }

    let resolve_every = Duration::from_millis(section.resolve_interval_ms.max(1_000));
    anyhow::ensure!(!options.routers.is_empty(), "no router to connect to");
    let follow = tokio::spawn(follow_routers(host.clone(), options.routers.clone(), resolve_every));
    shutdown.await;
    info!("draining: no new calls; finishing the calls in flight");
    host.draining.cancel();
    let grace = config.server.shutdown_grace;
    let finished = tokio::time::timeout(grace, follow).await.is_ok();
    if !finished {
        warn!(grace_ms = grace.as_millis() as u64, "calls still running after the grace period");
    }
    local.stop(Duration::from_millis(100)).await;
    Ok(finished)
}

fn default_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".into());
    format!("{host}-{}", std::process::id())
}

/// Keeps one session with every address the `routers` resolve to, resolving them again
/// every `every`; ends once the worker drains and every session has ended.
async fn follow_routers(host: Arc<Host>, routers: Vec<String>, every: Duration) {
    let mut links: HashMap<SocketAddr, CancellationToken> = HashMap::new();
    let mut tasks = JoinSet::new();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = host.draining.cancelled() => break,
        }
        // Each address with the URL it was found by: TLS verifies the router by its name.
        let mut resolved = std::collections::BTreeMap::new();
        let mut failed = false;
        for router in &routers {
            let url = host.dial.url(router);
            let authority = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
            match tokio::net::lookup_host(authority.trim_end_matches('/')).await {
                Ok(addrs) => resolved.extend(addrs.map(|addr| (addr, url.clone()))),
                Err(error) => {
                    warn!(router, %error, "cannot resolve the router");
                    failed = true;
                }
            }
        }
        // A name that does not resolve for now takes none of the sessions away.
        if !failed {
            links.retain(|addr, stop| {
                let keep = resolved.contains_key(addr);
                if !keep {
                    info!(%addr, "no router name resolves to this address any more");
                    stop.cancel();
                }
                keep
            });
        }
        for (addr, router) in resolved {
            links.entry(addr).or_insert_with(|| {
                let stop = CancellationToken::new();
                let span = info_span!("router session", %addr);
                tasks
                    .spawn(keep_session(host.clone(), addr, router, stop.clone()).instrument(span));
                stop
            });
        }
        // Sessions of addresses that went have ended by now or will soon.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// Holds a session with the router at `addr` (found as `router`, a URL)
/// until the worker drains or `stop`, reconnecting with backoff when it breaks.
async fn keep_session(host: Arc<Host>, addr: SocketAddr, router: String, stop: CancellationToken) {
    const FIRST_BACKOFF: Duration = Duration::from_millis(100);
    const MAX_BACKOFF: Duration = Duration::from_secs(10);
    let mut backoff = FIRST_BACKOFF;
    loop {
        let started = Instant::now();
        let ended = session(&host, addr, &router, &stop).await;
        set_session(&host, addr, None);
        match ended {
            Ok(()) => return,
            Err(error) if host.draining.is_cancelled() || stop.is_cancelled() => {
                debug!(%error, "session ended while draining");
                return;
            }
            Err(error) => {
                warn!(error = %format!("{error:#}"), "router session ended; reconnecting")
            }
        }
        if started.elapsed() > Duration::from_secs(30) {
            backoff = FIRST_BACKOFF;
        }
        let wait = toolmesh_core::RetryPolicy {
            attempts: std::num::NonZeroU32::MIN,
            backoff,
            max_backoff: MAX_BACKOFF,
        }
        .wait(2);
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = host.draining.cancelled() => return,
            () = stop.cancelled() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

fn set_session(host: &Host, addr: SocketAddr, up: Option<bool>) {
    let mut sessions = host.sessions.lock().unwrap_or_else(PoisonError::into_inner);
    match up {
        Some(up) => sessions.insert(addr, up),
        None => sessions.remove(&addr),
    };
    drop(sessions);
    host.changed.send_replace(());
}

/// One session: hello, welcome, then calls until the router ends it, it breaks, or the
/// worker drains (then it ends once its calls are answered: `Ok`).
async fn session(
    host: &Arc<Host>,
    addr: SocketAddr,
    url: &str,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    let channel = host.dial.connect(url, addr).await?;
    let dial = host.dial.clone();
    let channel = InterceptedService::new(channel, move |request| dial.authorize(request));
    let mut client = WorkerServiceClient::new(channel).max_decoding_message_size(64 << 20);
    let (outbound, receiver) = mpsc::unbounded_channel();
    let _ = outbound.send(WorkerMessage { message: Some(Message::Hello(host.hello.clone())) });
    let mut inbound = client
        .connect(UnboundedReceiverStream::new(receiver))
        .await
        .map_err(|s| anyhow::anyhow!("the router refused the worker: {}", s.message()))?
        .into_inner();
    let welcome = match tokio::time::timeout(Duration::from_secs(30), inbound.message()).await {
        Ok(Ok(Some(v1::RouterMessage {
            message: Some(router_message::Message::Welcome(welcome)),
        }))) => welcome,
        Ok(Err(status)) => anyhow::bail!("the router refused the worker: {}", status.message()),
        Ok(Ok(_)) => anyhow::bail!("the router did not welcome the worker"),
        Err(_) => anyhow::bail!("no welcome from the router within 30 s"),
    };
    info!(router = %welcome.router_id, "connected");
    set_session(host, addr, Some(true));
    let interval = Duration::from_millis(u64::from(welcome.heartbeat_interval_ms.max(100)));
    let silence = Duration::from_millis(u64::from(welcome.heartbeat_timeout_ms.max(200)));
    let mut beat = tokio::time::interval_at(Instant::now() + interval, interval);
    let mut heard = Instant::now();
    let max_message = usize::try_from(welcome.max_message_bytes).unwrap_or(usize::MAX);
    let calls: Arc<Mutex<HashMap<String, Running>>> = Arc::default();
    let mut running = JoinSet::new();
    let mut draining = false;
    // The router's word that no call follows the drain.
    let mut acknowledged = false;
    let result = loop {
        if acknowledged && running.is_empty() {
            break Ok(());
        }
        tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(message)) => {
                    heard = Instant::now();
                    match message.message {
                        Some(router_message::Message::Call(call)) => {
                            let call_state = Running {
                                cancel: CancellationToken::new(),
                                window: (call.partial_window > 0)
                                    .then(|| Arc::new(Semaphore::new(call.partial_window as usize))),
                            };
                            let out = Out {
                                messages: outbound.clone(),
                                max_message,
                                window: call_state.window.clone(),
                            };
                            let cancel = call_state.cancel.clone();
                            calls.lock().unwrap_or_else(PoisonError::into_inner)
                                .insert(call.call_id.clone(), call_state);
                            let (host, calls) = (host.clone(), calls.clone());
                            running.spawn(async move {
                                let id = call.call_id.clone();
                                execute(&host, call, &out, cancel).await;
                                calls.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
                            });
                        }
                        Some(router_message::Message::Cancel(cancel)) => {
                            let call = calls.lock().unwrap_or_else(PoisonError::into_inner)
                                .remove(&cancel.call_id);
                            if let Some(call) = call {
                                debug!(call_id = %cancel.call_id, reason = %cancel.reason, "call cancelled");
                                call.cancel.cancel();
                            }
                        }
                        Some(router_message::Message::Credit(credit)) => {
                            let calls = calls.lock().unwrap_or_else(PoisonError::into_inner);
                            if let Some(window) = calls.get(&credit.call_id).and_then(|c| c.window.as_ref()) {
                                let room = Semaphore::MAX_PERMITS - window.available_permits();
                                window.add_permits((credit.partials as usize).min(room));
                            }
                        }
                        Some(router_message::Message::DrainAck(_)) => acknowledged = true,
                        Some(router_message::Message::Heartbeat(_) | router_message::Message::Welcome(_)) | None => {}
                    }
                }
                Ok(None) => break Err(anyhow::anyhow!("the router closed the session")),
                Err(status) => break Err(anyhow::anyhow!("the session broke: {}", status.message())),
            },
            _ = beat.tick() => {
                if heard.elapsed() > silence {
                    break Err(anyhow::anyhow!("no heartbeat from the router for {} ms", heard.elapsed().as_millis()));
                }
                let _ = outbound.send(WorkerMessage { message: Some(Message::Heartbeat(v1::Heartbeat {})) });
            }
            Some(_) = running.join_next(), if !running.is_empty() => {}
            () = host.draining.cancelled(), if !draining => {
                draining = true;
                let reason = "the worker was told to stop".to_owned();
                let _ = outbound.send(WorkerMessage { message: Some(Message::Drain(v1::WorkerDrain { reason })) });
            }
            () = stop.cancelled(), if !draining => {
                draining = true;
                let reason = "the router's name no longer resolves here".to_owned();
                let _ = outbound.send(WorkerMessage { message: Some(Message::Drain(v1::WorkerDrain { reason })) });
            }
        }
    };
    // The router answered the calls of a broken session itself: stop them here.
    for (_, call) in calls.lock().unwrap_or_else(PoisonError::into_inner).drain() {
        call.cancel.cancel();
    }
    running.shutdown().await;
    if result.is_ok() {
        // A drained session ends gracefully: the last answers are sent, then the router
        // ends its side (dropping the stream at once could cut them off).
        drop(outbound);
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while let Ok(Some(_)) = inbound.message().await {}
        })
        .await;
    }
    result
}

/// The id the caller gave `call`, for spans and nested calls; a router that sends none
/// (an older one) sent it as the dispatch id.
fn caller_call_id(call: &v1::WorkerCall) -> &str {
    if call.caller_call_id.is_empty() { &call.call_id } else { &call.caller_call_id }
}

/// A call the worker runs: how to stop it, and the partial outputs it may still send.
struct Running {
    cancel: CancellationToken,
    /// `None` when the router gives no window.
    window: Option<Arc<Semaphore>>,
}

/// Where a call's messages go to the router.
struct Out {
    messages: mpsc::UnboundedSender<WorkerMessage>,
    /// The largest message the router reads; a larger one would end the session.
    max_message: usize,
    window: Option<Arc<Semaphore>>,
}

impl Out {
    /// The refusal of a message of `len` bytes that the router would not read, if it is one.
    fn too_large(&self, what: &str, len: usize) -> Option<BackendError> {
        // gRPC's framing (5 bytes) and the message's own envelope (a tag and a length
        // prefix, at most 11 bytes) go with each payload.
        (self.max_message > 0 && len.saturating_add(16) > self.max_message).then(|| {
            BackendError::Remote {
                code: toolmesh_core::ErrorCode::ResourceExhausted,
                message: format!(
                    "{what} of {len} bytes is larger than the router accepts ({} bytes, its \
                     server.max_message_bytes)",
                    self.max_message
                ),
            }
        })
    }

    fn send(&self, message: Message) {
        let _ = self.messages.send(WorkerMessage { message: Some(message) });
    }
}

/// Runs one call and sends its events and answer.
async fn execute(host: &Host, call: v1::WorkerCall, out: &Out, cancel: CancellationToken) {
    let span = info_span!(
        names::SPAN_REMOTE_EXECUTE,
        { names::GEN_AI_TOOL_NAME } = %call.tool,
        { names::GEN_AI_TOOL_CALL_ID } = %caller_call_id(&call),
        { names::TOOLMESH_CALL_ATTEMPT } = call.attempt,
    );
    toolmesh_telemetry::set_parent_from_headers(&span, &call.trace_context);
    let id = call.call_id.clone();
    let outcome = run_call(host, call, out, cancel).instrument(span).await;
    let error = |error: BackendError| {
        worker_call_result::Outcome::Error(v1::WorkerCallError {
            code: toolmesh_proto::status_code(error.code()) as u32,
            message: error.to_string(),
        })
    };
    let mut result = v1::WorkerCallResult {
        call_id: id.clone(),
        outcome: Some(match outcome {
            Ok(output) => {
                worker_call_result::Outcome::Response(convert::response(id.clone(), output))
            }
            Err(failure) => error(failure),
        }),
    };
    // Only this call fails: a message the router cannot read would end the session, and
    // every other call on it with the outcome unknown.
    if let Some(refused) = out.too_large("the result", result.encoded_len()) {
        warn!(call_id = %id, "{refused}");
        result.outcome = Some(error(refused));
    }
    out.send(Message::Result(result));
}

async fn run_call(
    host: &Host,
    call: v1::WorkerCall,
    out: &Out,
    cancel: CancellationToken,
) -> Result<toolmesh_core::ToolOutput, BackendError> {
    let deadline = Instant::now() + Duration::from_millis(call.timeout_ms.max(1));
    let expired = || BackendError::DeadlineExceeded(Duration::from_millis(call.timeout_ms));
    let _slot = tokio::select! {
        slot = host.slots.acquire() => slot.map_err(|_| BackendError::Internal("the worker is stopping".into()))?,
        () = cancel.cancelled() => return Err(BackendError::Cancelled),
        () = tokio::time::sleep_until(deadline) => return Err(expired()),
    };
    let Some(entry) = host.registry.resolve(&call.tool) else {
        return Err(BackendError::Remote {
            code: toolmesh_core::ErrorCode::NotFound,
            message: format!("the worker does not serve tool {}", call.tool),
        });
    };
    let arguments: serde_json::Value = if call.arguments_json.trim().is_empty() {
        serde_json::json!({})
    } else {
        serde_json::from_str(&call.arguments_json).map_err(|e| {
            BackendError::InvalidArguments(format!("arguments_json is not JSON: {e}"))
        })?
    };
    if let Some(violation) = entry.check_arguments(&arguments).first() {
        return Err(BackendError::InvalidArguments(violation.to_string()));
    }
    let (events, mut receiver) = EventSink::channel();
    let ctx = CallContext {
        call_id: caller_call_id(&call).to_owned(),
        session_id: Some(call.session_id.clone()).filter(|s| !s.is_empty()),
        profile: None,
        tool: call.tool.clone(),
        cancel: cancel.clone(),
        deadline,
        events,
        attempt: call.attempt,
        principal: caller(call.caller.as_ref()),
        depth: call.depth,
    };
    let _cancel_on_drop = cancel.clone().drop_guard();
    let running = tokio::time::timeout_at(deadline, entry.backend.call(ctx, arguments));
    tokio::pin!(running);
    // Sends an event; a partial output waits for the router's credit, which holds the
    // tool back (its sink fills) while the caller reads slowly.
    let send = async |event: CallEvent| -> Result<(), BackendError> {
        let partial = matches!(event, CallEvent::Partial(_));
        let event = match event {
            CallEvent::Progress { progress, total, message } => {
                worker_call_event::Event::Progress(v1::Progress { progress, total, message })
            }
            CallEvent::Partial(part) => {
                worker_call_event::Event::Partial(convert::content_part(part))
            }
            // The worker protocol carries no log lines: a worker's own log has them.
            CallEvent::Log { .. } => return Ok(()),
        };
        let event = v1::WorkerCallEvent { call_id: call.call_id.clone(), event: Some(event) };
        if let Some(refused) = out.too_large("a partial output", event.encoded_len()) {
            return Err(refused);
        }
        if let (true, Some(window)) = (partial, &out.window) {
            tokio::select! {
                permit = window.acquire() => {
                    if let Ok(permit) = permit {
                        permit.forget();
                    }
                }
                () = cancel.cancelled() => return Err(BackendError::Cancelled),
                () = tokio::time::sleep_until(deadline) => return Err(expired()),
            }
        }
        out.send(Message::Event(event));
        Ok(())
    };
    let outcome = loop {
        tokio::select! {
            outcome = &mut running => break outcome,
            event = receiver.recv() => send(event).await?,
        }
    };
    while let Some(event) = receiver.try_recv() {
        send(event).await?;
    }
    match outcome {
        Ok(outcome) => outcome,
        Err(_) => Err(expired()),
    }
}

/// The health service that answers SERVING while the worker process runs: its liveness,
/// which does not depend on reaching a router (a router outage would otherwise restart
/// every worker).
pub const LIVENESS_SERVICE: &str = "liveness";

/// Serves the gRPC health service on `addr`: the overall status ("", the worker's
/// readiness) is SERVING while the worker has a session with a router, NOT_SERVING
/// otherwise and while it drains; [`LIVENESS_SERVICE`] is SERVING while it runs.
async fn serve_health(addr: SocketAddr, host: Arc<Host>) -> anyhow::Result<()> {
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter.set_service_status("", tonic_health::ServingStatus::NotServing).await;
    reporter.set_service_status(LIVENESS_SERVICE, tonic_health::ServingStatus::Serving).await;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for health checks"))?;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await;
        if let Err(error) = served {
            warn!(%error, "the health service stopped");
        }
    });
    let mut changed = host.changed.subscribe();
    tokio::spawn(async move {
        loop {
            let up = !host.draining.is_cancelled()
                && host
                    .sessions
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .values()
                    .any(|up| *up);
            let status = if up {
                tonic_health::ServingStatus::Serving
            } else {
                tonic_health::ServingStatus::NotServing
            };
            reporter.set_service_status("", status).await;
            tokio::select! {
                changed = changed.changed() => if changed.is_err() { return },
                () = host.draining.cancelled(), if !host.draining.is_cancelled() => {}
            }
        }
    });
    Ok(())
}

/// The principal the router says a call is for: the open principal when it says none (a
/// router that does not authenticate callers). It carries no credential: a credential that
/// passes the caller's token on has none to pass from a worker.
fn caller(caller: Option<&v1::Caller>) -> Arc<toolmesh_core::Principal> {
    let Some(caller) = caller.filter(|c| !c.name.is_empty()) else {
        return toolmesh_core::open_principal();
    };
    Arc::new(toolmesh_core::Principal {
        name: caller.name.clone(),
        kind: toolmesh_core::PrincipalKind::from_name(&caller.kind)
            .unwrap_or(toolmesh_core::PrincipalKind::Anonymous),
        issuer: (!caller.issuer.is_empty()).then(|| caller.issuer.clone()),
        roles: caller.roles.clone(),
        attributes: caller.attributes.clone().into_iter().collect(),
        credential: None,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config(text: &str) -> Config {
        toolmesh_config::load_str(Some(("worker.toml", text)), &HashMap::new()).unwrap()
    }

    #[test]
    fn a_workers_file_holds_what_a_worker_reads_and_nothing_else() {
        let file = "[worker]\npool = \"reports\"\n[workers]\nsize = 2\n[builtin]\necho = true\n\
                    [[tools.command]]\nname = \"t\"\ndescription = \"d\"\ncommand = \"/bin/true\"\n";
        let worker = config(file);
        assert!(is_worker_file(&worker));
        check(&worker).unwrap();
        assert_eq!(worker.get::<WorkerConfig>().unwrap().pool, "reports");
        assert!(!is_worker_file(&config("[workers]\nsize = 2\n")));

        let error = |text: &str| format!("{:#}", check(&config(text)).unwrap_err());
        let router_only = error("[worker]\n[search]\nembeddings = false\n");
        assert!(router_only.contains("search") && router_only.contains("unknown section"));
        let typo = error("[worker]\npol = \"x\"\n");
        assert!(typo.contains("worker.toml") && typo.contains("worker.pol"), "{typo}");
        let tool = error("[worker]\n[[tools.command]]\nname = \"t\"\ndescription = \"d\"\n");
        assert!(tool.contains("tools.command[0]"), "{tool}");
    }
}
