//! Who is connected, what each worker serves, and how busy it is.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
};

use tokio::sync::{Notify, mpsc, oneshot};
use tonic::Status;
use toolmesh_core::{BackendError, CallEvent, SourceKind, ToolOutput, ToolSource, ToolSpec};
use toolmesh_proto::v1::{self, RouterMessage, router_message::Message};
use toolmesh_registry::{RegistryHandle, SourceUpdate, ToolEntry};
use tracing::{info, warn};

use crate::{RemoteBackend, RemoteConfig};

/// The pool of a worker that names none.
pub const DEFAULT_POOL: &str = "default";

/// What goes to a worker: messages, or the status that ends its session.
pub(crate) type Outbound = mpsc::UnboundedSender<Result<RouterMessage, Status>>;

/// A connected worker: where its messages go, and the calls it has not answered yet.
#[derive(Debug)]
pub(crate) struct Link {
    /// Unique in this router, for the session's bookkeeping.
    pub(crate) key: u64,
    /// The id the worker announced.
    pub(crate) worker: String,
    /// Its pool.
    pub(crate) pool: String,
    /// Calls it runs at once.
    pub(crate) capacity: usize,
    outbound: Outbound,
    calls: Mutex<Calls>,
    /// Who the worker authenticated as, when the router authenticates: checked again when
    /// the credentials are reloaded.
    pub(crate) principal: Option<Arc<toolmesh_core::Principal>>,
    /// Cancelled when the session is closed by the router.
    pub(crate) ended: tokio_util::sync::CancellationToken,
}

/// The calls of a worker waiting for their answers, and whether it drains.
#[derive(Debug, Default)]
struct Calls {
    waiting: HashMap<String, Waiting>,
    /// The worker was told that no call follows: none is sent from then on.
    draining: bool,
}

/// Partial outputs a worker may send for one call before the router gives credit for more
/// (`WorkerCall.partial_window`): what the router holds of a call whose caller reads
/// slowly.
pub(crate) const PARTIAL_WINDOW: u32 = 16;

/// Room in a call's event queue beyond its window, for progress reports. Progress is
/// coalesced by nature: a report that finds no room is dropped, never a partial output.
const PROGRESS_ROOM: usize = 8;

/// A call sent to a worker, waiting for its answer.
#[derive(Debug)]
struct Waiting {
    events: mpsc::Sender<CallEvent>,
    reply: oneshot::Sender<Result<ToolOutput, BackendError>>,
}

/// What the dispatcher receives of one call on a worker.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) events: mpsc::Receiver<CallEvent>,
    pub(crate) reply: oneshot::Receiver<Result<ToolOutput, BackendError>>,
}

impl Link {
    fn lock(&self) -> MutexGuard<'_, Calls> {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The worker, as errors and logs name it.
    pub(crate) fn describe(&self) -> String {
        format!("remote worker {} (pool {})", self.worker, self.pool)
    }

    /// Sends `message`; false when the session has ended.
    pub(crate) fn send(&self, message: Message) -> bool {
        self.outbound.send(Ok(RouterMessage { message: Some(message) })).is_ok()
    }

    /// Sends call `call` and returns where its events and answer arrive; `None` when the
    /// session has ended or the worker drains (the worker never saw the call).
    pub(crate) fn start(&self, call: v1::WorkerCall) -> Option<Pending> {
        let (events, events_rx) = mpsc::channel(PARTIAL_WINDOW as usize + PROGRESS_ROOM);
        let (reply, reply_rx) = oneshot::channel();
        // Under the lock, so that no call follows the drain's acknowledgement.
        let mut calls = self.lock();
        if calls.draining {
            return None;
        }
        let id = call.call_id.clone();
        if !self.send(Message::Call(call)) {
            return None;
        }
        calls.waiting.insert(id, Waiting { events, reply });
        Some(Pending { events: events_rx, reply: reply_rx })
    }

    /// Marks the worker draining and tells it that no call follows.
    pub(crate) fn drain(&self) {
        let mut calls = self.lock();
        calls.draining = true;
        self.send(Message::DrainAck(v1::DrainAck {}));
    }

    /// Tells the worker to stop call `id`, which is answered no more.
    pub(crate) fn cancel(&self, id: &str, reason: &str) {
        if self.lock().waiting.remove(id).is_some() {
            self.send(Message::Cancel(v1::CancelWorkerCall {
                call_id: id.to_owned(),
                reason: reason.to_owned(),
            }));
        }
    }

    /// Hands an event of call `id` to its caller, without waiting: the session's other
    /// calls must not wait for this one's reader. A progress report that finds the queue
    /// nearly full is dropped (a later one says more); a partial output beyond the call's
    /// window fails the call, which is stopped on the worker.
    pub(crate) fn event(&self, id: &str, event: CallEvent) {
        let mut calls = self.lock();
        let Some(waiting) = calls.waiting.get(id) else { return };
        let overflow = match event {
            CallEvent::Progress { .. } if waiting.events.capacity() <= PARTIAL_WINDOW as usize => {
                return;
            }
            event => matches!(
                waiting.events.try_send(event),
                Err(mpsc::error::TrySendError::Full(CallEvent::Partial(_)))
            ),
        };
        if overflow && let Some(waiting) = calls.waiting.remove(id) {
            drop(calls);
            let reason = format!(
                "{} sent more than {PARTIAL_WINDOW} partial outputs ahead of its reader, its \
                 window",
                self.describe()
            );
            warn!(call_id = %id, "{reason}");
            self.send(Message::Cancel(v1::CancelWorkerCall {
                call_id: id.to_owned(),
                reason: reason.clone(),
            }));
            let _ = waiting.reply.send(Err(BackendError::Remote {
                code: toolmesh_core::ErrorCode::Internal,
                message: reason,
            }));
        }
    }

    /// Gives call `id` credit for `partials` more partial outputs: as many were forwarded.
    pub(crate) fn credit(&self, id: &str, partials: u32) {
        if self.lock().waiting.contains_key(id) {
            self.send(Message::Credit(v1::PartialCredit { call_id: id.to_owned(), partials }));
        }
    }

    /// Hands the answer of call `id` to its caller; false for a call it does not have
    /// (answered twice, cancelled, or never sent).
    pub(crate) fn answer(&self, id: &str, outcome: Result<ToolOutput, BackendError>) -> bool {
        match self.lock().waiting.remove(id) {
            Some(waiting) => {
                let _ = waiting.reply.send(outcome);
                true
            }
            None => false,
        }
    }

    /// Ends the session with `status`, and answers every call in flight: the connection is
    /// lost, so whether each ran is unknown.
    pub(crate) fn close(&self, status: Status) {
        let calls: Vec<Waiting> = {
            let mut calls = self.lock();
            calls.draining = true;
            calls.waiting.drain().map(|(_, waiting)| waiting).collect()
        };
        for waiting in calls {
            let _ = waiting.reply.send(Err(BackendError::Lost {
                backend: self.describe(),
                reason: status.message().to_owned(),
            }));
        }
        let _ = self.outbound.send(Err(status));
        self.ended.cancel();
    }
}

/// One worker's standing.
#[derive(Debug)]
struct Member {
    link: Arc<Link>,
    outstanding: usize,
    draining: bool,
    tools: Vec<String>,
}

/// A tool and the workers that serve it.
#[derive(Debug)]
struct Served {
    spec: ToolSpec,
    /// Keys of the workers, in the order they joined.
    workers: Vec<u64>,
    /// Where the next pick starts looking, so that equally loaded workers take turns.
    next: usize,
}

/// The outcome of looking for a worker for a call.
#[derive(Debug)]
pub(crate) enum Pick {
    /// This worker took a slot for the call.
    Got(Arc<Link>),
    /// Workers serve the tool, but none has a free slot (or all are draining).
    Busy {
        /// Workers serving the tool.
        workers: usize,
        /// Their slots in all.
        capacity: usize,
    },
    /// No worker serves the tool.
    Nobody,
}

#[derive(Debug, Default)]
struct State {
    members: HashMap<u64, Member>,
    tools: HashMap<String, Served>,
    /// Every pool seen, with its workers now: one that has none left is down.
    pools: BTreeMap<String, usize>,
}

/// The remote workers of one router, shared by the sessions, the backends and the
/// provider.
#[derive(Debug)]
pub(crate) struct Members {
    pub(crate) registry: RegistryHandle,
    pub(crate) config: std::sync::RwLock<Arc<RemoteConfig>>,
    state: Mutex<State>,
    /// Told when a slot frees or a worker joins.
    pub(crate) freed: Notify,
    /// Told when a pool's health may have changed.
    pub(crate) changed: Notify,
    /// Publishes to the registry one pool change at a time, in order; holds what each
    /// pool published last.
    published: tokio::sync::Mutex<HashMap<String, HashMap<String, ToolSpec>>>,
    next_key: AtomicU64,
    /// The number in the next dispatch id.
    next_dispatch: AtomicU64,
    /// This router, as workers see it.
    pub(crate) router_id: String,
    /// Per pool: calls waiting for a worker's slot, and calls on workers.
    load: Mutex<HashMap<String, Arc<PoolLoad>>>,
}

/// The calls of one pool, for its gauges; its backends count them without a lock.
#[derive(Debug, Default)]
pub(crate) struct PoolLoad {
    /// The pool's name.
    pub(crate) pool: String,
    pending: AtomicUsize,
    running: AtomicUsize,
}

impl PoolLoad {
    /// Counts a call waiting for a slot (`running` false) or on a worker, while it lives.
    pub(crate) fn count(&self, running: bool) -> Counted<'_> {
        let count = if running { &self.running } else { &self.pending };
        count.fetch_add(1, Ordering::Relaxed);
        Counted(count)
    }
}

/// One call counted in a [`PoolLoad`] until it is dropped.
pub(crate) struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Members {
    /// The load of `pool`, which its backends count in.
    pub(crate) fn load_of(&self, pool: &str) -> Arc<PoolLoad> {
        let mut load = self.load.lock().unwrap_or_else(PoisonError::into_inner);
        let new = || Arc::new(PoolLoad { pool: pool.to_owned(), ..PoolLoad::default() });
        load.entry(pool.to_owned()).or_insert_with(new).clone()
    }

    /// Reports each pool's pending and running calls at each collection of the metrics.
    pub(crate) fn observe(self: &Arc<Self>) {
        use toolmesh_telemetry::{names, observe_gauge};
        /// A gauge's name, description, and its reading of a pool's calls.
        type Reading = (&'static str, &'static str, fn(&PoolLoad) -> &AtomicUsize);
        let readings: [Reading; 2] = [
            (
                names::METRIC_REMOTE_PENDING,
                "calls of a remote pool waiting for a worker's slot",
                |load| &load.pending,
            ),
            (names::METRIC_REMOTE_IN_FLIGHT, "calls of a remote pool on its workers", |load| {
                &load.running
            }),
        ];
        for (name, description, read) in readings {
            let members = Arc::downgrade(self);
            observe_gauge(name, description, move |observe| {
                let Some(members) = members.upgrade() else { return };
                let load = members.load.lock().unwrap_or_else(PoisonError::into_inner).clone();
                for (pool, counts) in load {
                    let pool = opentelemetry::KeyValue::new(names::TOOLMESH_SOURCE_NAME, pool);
                    observe(read(&counts).load(Ordering::Relaxed) as u64, &[pool]);
                }
            });
        }
    }

    pub(crate) fn new(registry: RegistryHandle) -> Self {
        Members {
            load: Default::default(),
            registry,
            config: Default::default(),
            state: Default::default(),
            freed: Notify::new(),
            changed: Notify::new(),
            published: Default::default(),
            next_key: AtomicU64::new(1),
            next_dispatch: AtomicU64::new(1),
            router_id: format!("router-{}", uuid::Uuid::now_v7()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn config(&self) -> Arc<RemoteConfig> {
        self.config.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// A new dispatch id: what a worker's session knows one attempt of a call by.
    pub(crate) fn dispatch_id(&self) -> String {
        format!("d{}", self.next_dispatch.fetch_add(1, Ordering::Relaxed))
    }

    /// Adds the worker of `hello` whose messages go to `outbound`, and publishes its tools;
    /// refused when a tool is invalid or is served differently by another worker or source.
    /// `welcome` is the worker's first message, sent before any call can be.
    pub(crate) async fn join(
        self: &Arc<Self>,
        hello: v1::WorkerHello,
        outbound: Outbound,
        welcome: v1::WorkerWelcome,
        principal: Option<Arc<toolmesh_core::Principal>>,
    ) -> Result<Arc<Link>, Status> {
        let pool = if hello.pool.is_empty() { DEFAULT_POOL.to_owned() } else { hello.pool };
        let worker =
            if hello.worker_id.is_empty() { "unnamed".to_owned() } else { hello.worker_id };
        if hello.capacity == 0 {
            return Err(Status::invalid_argument(format!(
                "worker {worker}: capacity must be at least 1"
            )));
        }
        let source = ToolSource { kind: SourceKind::Remote, name: pool.clone() };
        let mut specs = Vec::with_capacity(hello.tools.len());
        for tool in &hello.tools {
            let spec = toolmesh_proto::convert::announced_spec(tool, source.clone())
                .map_err(|reason| Status::invalid_argument(format!("worker {worker}: {reason}")))?;
            // The name and the schemas must hold, as for any tool of the catalog.
            ToolEntry::new(spec.clone(), Arc::new(RemoteBackend::nowhere()))
                .map_err(|e| Status::invalid_argument(format!("worker {worker}: {e}")))?;
            specs.push(spec);
        }
        let catalog = self.registry.snapshot();
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        let link = Arc::new(Link {
            key,
            worker: worker.clone(),
            pool: pool.clone(),
            capacity: hello.capacity as usize,
            outbound,
            calls: Default::default(),
            principal,
            ended: Default::default(),
        });
        {
            let mut state = self.lock();
            let mut seen = std::collections::HashSet::new();
            for spec in &specs {
                if !seen.insert(spec.name.as_str()) {
                    return Err(Status::invalid_argument(format!(
                        "worker {worker} announces tool {} twice",
                        spec.name
                    )));
                }
                if let Some(served) = state.tools.get(&spec.name) {
                    if served.spec != *spec {
                        let other = served
                            .workers
                            .first()
                            .and_then(|k| state.members.get(k))
                            .map_or_else(|| "another worker".to_owned(), |m| m.link.describe());
                        return Err(Status::already_exists(format!(
                            "tool {}: worker {worker} (pool {pool}) announces a definition that \
                             differs from the one of {other}",
                            spec.name
                        )));
                    }
                } else if let Some(existing) =
                    catalog.get(&spec.name).filter(|e| e.spec.source != source)
                {
                    return Err(Status::already_exists(format!(
                        "tool {}: worker {worker} (pool {pool}) announces a name already taken \
                         by {}",
                        spec.name, existing.spec.source
                    )));
                }
            }
            // Before the worker can be picked: no call precedes its welcome.
            link.send(Message::Welcome(welcome));
            for spec in specs {
                let served = state.tools.entry(spec.name.clone()).or_insert_with(|| Served {
                    spec,
                    workers: Vec::new(),
                    next: 0,
                });
                served.workers.push(key);
            }
            let tools = hello.tools.iter().map(|t| t.name.clone()).collect();
            state
                .members
                .insert(key, Member { link: link.clone(), outstanding: 0, draining: false, tools });
            *state.pools.entry(pool.clone()).or_default() += 1;
        }
        self.publish(&pool).await;
        info!(worker, pool, capacity = hello.capacity, tools = hello.tools.len(), "worker joined");
        self.changed.notify_one();
        self.freed.notify_waiters();
        Ok(link)
    }

    /// Removes worker `key` (its session ended for `reason`), answers its calls in flight,
    /// and publishes its pool without the tools no other worker serves.
    /// The workers connected now.
    pub(crate) fn links(&self) -> Vec<Arc<Link>> {
        self.lock().members.values().map(|member| member.link.clone()).collect()
    }

    pub(crate) async fn leave(self: &Arc<Self>, link: &Arc<Link>, status: Status) {
        let removed = {
            let mut state = self.lock();
            let removed = state.members.remove(&link.key);
            if let Some(member) = &removed {
                for tool in &member.tools {
                    if let Some(served) = state.tools.get_mut(tool) {
                        served.workers.retain(|k| *k != link.key);
                        if served.workers.is_empty() {
                            state.tools.remove(tool);
                        }
                    }
                }
                if let Some(count) = state.pools.get_mut(&link.pool) {
                    *count = count.saturating_sub(1);
                }
            }
            removed
        };
        let in_flight = link.lock().waiting.len();
        let level_warn = in_flight > 0 || status.code() != tonic::Code::Ok;
        if level_warn {
            warn!(
                worker = %link.worker, pool = %link.pool, in_flight, reason = status.message(),
                "worker left"
            );
        } else {
            info!(worker = %link.worker, pool = %link.pool, "worker left");
        }
        link.close(status);
        if removed.is_some() {
            self.publish(&link.pool).await;
            self.changed.notify_one();
        }
        self.freed.notify_waiters();
    }

    /// Marks worker `link` draining: it is sent no new call, and told so.
    pub(crate) fn drain(&self, link: &Link) {
        if let Some(member) = self.lock().members.get_mut(&link.key) {
            member.draining = true;
        }
        link.drain();
        info!(worker = %link.worker, pool = %link.pool, "worker draining");
        self.changed.notify_one();
    }

    /// Takes a slot of the live worker serving `tool` with the fewest calls outstanding;
    /// among equals, the workers take turns.
    pub(crate) fn pick(&self, tool: &str) -> Pick {
        let mut state = self.lock();
        let State { members, tools, .. } = &mut *state;
        let Some(served) = tools.get_mut(tool) else { return Pick::Nobody };
        let mut best: Option<(u64, usize)> = None;
        let mut capacity = 0;
        let start = served.next % served.workers.len().max(1);
        served.next = served.next.wrapping_add(1);
        let (after, before) = served.workers.split_at(start);
        for key in before.iter().chain(after) {
            let Some(member) = members.get(key) else { continue };
            capacity += member.link.capacity;
            let free = !member.draining && member.outstanding < member.link.capacity;
            if free && best.is_none_or(|(_, outstanding)| member.outstanding < outstanding) {
                best = Some((*key, member.outstanding));
            }
        }
        match best.and_then(|(key, _)| members.get_mut(&key)) {
            Some(member) => {
                member.outstanding += 1;
                Pick::Got(member.link.clone())
            }
            None => Pick::Busy { workers: served.workers.len(), capacity },
        }
    }

    /// Gives back the slot a call held on worker `key`.
    pub(crate) fn release(&self, key: u64) {
        if let Some(member) = self.lock().members.get_mut(&key) {
            member.outstanding = member.outstanding.saturating_sub(1);
        }
        self.freed.notify_waiters();
    }

    /// The health of every pool seen: up while it has a worker.
    pub(crate) fn health(&self) -> Vec<(String, toolmesh_core::Health)> {
        let state = self.lock();
        state
            .pools
            .iter()
            .map(|(pool, &workers)| {
                let health = if workers == 0 {
                    toolmesh_core::Health::down("no worker connected")
                } else {
                    let capacity: usize = state
                        .members
                        .values()
                        .filter(|m| m.link.pool == *pool && !m.draining)
                        .map(|m| m.link.capacity)
                        .sum();
                    let noun = if workers == 1 { "worker" } else { "workers" };
                    toolmesh_core::Health {
                        up: true,
                        status: format!("{workers} {noun}, {capacity} calls at once"),
                    }
                };
                (pool.clone(), health)
            })
            .collect()
    }

    /// Ends every session with `status`.
    pub(crate) async fn close_all(self: &Arc<Self>, status: Status) {
        let links: Vec<Arc<Link>> = self.lock().members.values().map(|m| m.link.clone()).collect();
        for link in links {
            self.leave(&link, status.clone()).await;
        }
    }

    /// Publishes `pool`'s tools as the workers now connected serve them: a tool whose
    /// definition did not change keeps its catalog entry.
    async fn publish(self: &Arc<Self>, pool: &str) {
        let mut published = self.published.lock().await;
        let now: HashMap<String, ToolSpec> = {
            let state = self.lock();
            state
                .tools
                .iter()
                .filter(|(_, served)| served.spec.source.name == pool)
                .map(|(name, served)| (name.clone(), served.spec.clone()))
                .collect()
        };
        let before = published.get(pool);
        let mut unchanged = Vec::new();
        let mut tools = Vec::new();
        for (name, spec) in &now {
            if before.and_then(|b| b.get(name)) == Some(spec) {
                unchanged.push(name.clone());
                continue;
            }
            let backend = Arc::new(RemoteBackend::new(
                Arc::downgrade(self),
                name.clone(),
                self.load_of(pool),
            ));
            match ToolEntry::new(spec.clone(), backend) {
                Ok(entry) => tools.push(entry),
                Err(error) => warn!(tool = %name, pool, %error, "remote tool not published"),
            }
        }
        if before.is_none_or(|b| b.is_empty()) && now.is_empty() {
            return;
        }
        let source = ToolSource { kind: SourceKind::Remote, name: pool.to_owned() };
        let update = SourceUpdate { source, tools, toolkits: Vec::new(), toolkit: None, unchanged };
        match self.registry.replace_source(update).await {
            Ok(()) => {
                published.insert(pool.to_owned(), now);
            }
            Err(error) => {
                // The next change of the pool publishes it whole.
                warn!(pool, %error, "publishing the tools of remote workers failed");
                published.remove(pool);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(worker: &str, capacity: u32, description: &str) -> v1::WorkerHello {
        v1::WorkerHello {
            worker_id: worker.into(),
            pool: String::new(),
            capacity,
            tools: vec![v1::Tool {
                name: "fetch".into(),
                description: description.into(),
                ..Default::default()
            }],
        }
    }

    async fn joined(
        members: &Arc<Members>,
        worker: &str,
        capacity: u32,
    ) -> (Arc<Link>, mpsc::UnboundedReceiver<Result<RouterMessage, Status>>) {
        let (outbound, inbound) = mpsc::unbounded_channel();
        let hello = hello(worker, capacity, "Fetches.");
        let link = members.join(hello, outbound, Default::default(), None).await.unwrap();
        (link, inbound)
    }

    fn picked(members: &Members) -> Option<String> {
        match members.pick("fetch") {
            Pick::Got(link) => Some(link.worker.clone()),
            _ => None,
        }
    }

    async fn members() -> Arc<Members> {
        Arc::new(Members::new(RegistryHandle::start().await.unwrap()))
    }

    #[tokio::test]
    async fn the_least_loaded_worker_takes_the_call_and_equals_take_turns() {
        let members = members().await;
        let (w1, _in1) = joined(&members, "w1", 2).await;
        let (_w2, _in2) = joined(&members, "w2", 2).await;
        // Equals take turns; then the one with fewer calls outstanding goes first.
        let first = [picked(&members).unwrap(), picked(&members).unwrap()];
        assert!(first.contains(&"w1".to_owned()) && first.contains(&"w2".to_owned()), "{first:?}");
        members.release(w1.key);
        assert_eq!(picked(&members).as_deref(), Some("w1"), "w1 has the fewer calls now");
        assert!(picked(&members).is_some() && picked(&members).is_some());
        // Every slot is taken: the call must wait.
        let Pick::Busy { workers, capacity } = members.pick("fetch") else {
            panic!("all four slots are taken");
        };
        assert_eq!((workers, capacity), (2, 4));
        assert!(matches!(members.pick("other"), Pick::Nobody));
    }

    #[tokio::test]
    async fn a_draining_worker_is_given_no_further_call() {
        let members = members().await;
        let (w1, _in1) = joined(&members, "w1", 4).await;
        let (_w2, _in2) = joined(&members, "w2", 4).await;
        members.drain(&w1);
        for _ in 0..4 {
            assert_eq!(picked(&members).as_deref(), Some("w2"));
        }
        assert!(matches!(members.pick("fetch"), Pick::Busy { workers: 2, capacity: 8 }));
    }

    #[tokio::test]
    async fn workers_of_one_tool_must_announce_one_definition_and_at_least_one_slot() {
        let members = members().await;
        let (_w1, _in1) = joined(&members, "w1", 1).await;
        let (outbound, _inbound) = mpsc::unbounded_channel();
        let other =
            members.join(hello("w2", 1, "Fetches otherwise."), outbound, Default::default(), None);
        let refused = other.await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::AlreadyExists);
        assert!(refused.message().contains("differs from the one of"), "{refused:?}");
        let (outbound, _inbound) = mpsc::unbounded_channel();
        let none = members.join(hello("w3", 0, "Fetches."), outbound, Default::default(), None);
        assert_eq!(none.await.unwrap_err().code(), tonic::Code::InvalidArgument);
        // The worker that joined first still serves the tool.
        assert_eq!(picked(&members).as_deref(), Some("w1"));
    }
}
