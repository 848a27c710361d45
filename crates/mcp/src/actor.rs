use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use rayon::prelude::*;
use rmcp::model::Tool;
use tokio_util::sync::CancellationToken;
use toolmesh_core::{SourceKind, ToolSource, Toolkit};
use toolmesh_registry::{RegistryHandle, SourceUpdate};
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::{ServerHealth, schemas::compile_in_background, shared::ServerShared};
use crate::{
    connection::{connect, describe, probe, reconnect_delay, watch_idle},
    group::ProcessGroupGuard,
    listing::{Prepared, follow_lists, list_tools, prepare},
    messages::{Connection, McpMsg},
    state::{Listing, McpClientState, Origin},
};

/// Holds the one connection to one MCP server: connects, initializes, lists the tools
/// (every page) and publishes them; follows `tools/list_changed`; notices a dead connection,
/// marks the server unhealthy (its calls then fail fast with UNAVAILABLE) and reconnects
/// with capped exponential backoff. Stopping the actor closes the connection, which kills
/// a stdio server's process group.
pub struct McpClientActor {
    pub(crate) shared: Arc<ServerShared>,
    pub(crate) registry: RegistryHandle,
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
            let tools = if origin == Origin::Server { shared.check_pins(tools) } else { tools };
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
        let toolkit = self.toolkit();
        if same && state.toolkit.as_ref() == Some(&toolkit) {
            debug!(server, tools = listing.len(), "the tool listing has not changed");
            return;
        }
        let prepared_us = started.elapsed().as_micros() as u64;
        let source = self.source();
        let count = entries.len() + unchanged.len();
        let fresh: Vec<String> = entries.iter().map(|e| e.spec.name.clone()).collect();
        let update = SourceUpdate {
            source,
            tools: entries,
            toolkits: vec![],
            toolkit: Some(toolkit.clone()),
            unchanged,
        };
        match self.registry.replace_source(update).await {
            Ok(()) => {
                state.toolkit = Some(toolkit);
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
                state.toolkit = None;
            }
        }
    }

    /// Subscribes a fresh connection to the resources clients are subscribed to, off the
    /// actor: a server forgets its subscriptions with its session.
    fn resubscribe(&self) {
        let Some(peer) = self.shared.peer.load_full() else { return };
        let uris: Vec<String> = self.shared.subscribed.borrow().keys().cloned().collect();
        // A 2026-07-28 connection listens to them on a stream of its own.
        if uris.is_empty()
            || !crate::offers::subscribable(&peer)
            || crate::offers::per_request(&peer)
        {
            return;
        }
        self.spawn("subscriptions", async move {
            for uri in uris {
                if let Err(error) = crate::offers::subscribe(&peer, &uri).await {
                    warn!(%uri, %error, "subscribing again to a resource failed");
                }
            }
        });
    }

    /// Lists the server's resources, resource templates and prompts again, off the actor.
    fn list_offers(&self) {
        let Some(peer) = self.shared.peer.load_full() else { return };
        let shared = self.shared.clone();
        self.spawn("offers", async move {
            match crate::offers::list(&peer).await {
                Ok(offers) => {
                    debug!(
                        resources = offers.resources.len(),
                        templates = offers.templates.len(),
                        prompts = offers.prompts.len(),
                        "resources and prompts listed"
                    );
                    if **shared.offers.load() != offers {
                        shared.offers.store(Arc::new(offers));
                        shared.offers_changed.changed.send_modify(|version| *version += 1);
                    }
                }
                Err(error) => {
                    warn!(%error, "listing the server's resources and prompts failed; the last listing stays");
                }
            }
        });
    }

    /// The server's own toolkit: named after the server, with the description and the
    /// instructions it gave when it was connected to (none before).
    fn toolkit(&self) -> Toolkit {
        let peer = self.shared.peer.load();
        let info = peer.as_deref().and_then(|peer| peer.peer_info());
        let implementation = info.as_ref().and_then(|info| info.server_info.as_ref());
        let description = implementation
            .and_then(|server| server.description.clone().or_else(|| server.title.clone()));
        Toolkit {
            name: self.shared.name().to_owned(),
            description: description.unwrap_or_default(),
            instructions: info
                .as_ref()
                .and_then(|info| info.instructions.clone())
                .unwrap_or_default(),
            tools: vec![],
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
            toolkit: None,
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
            McpMsg::Connect => self.connect_now(&myself, state),
            McpMsg::Connected { connection, group, tools } => {
                self.connected(&myself, state, connection, group, tools).await;
            }
            McpMsg::ConnectFailed { reason } => self.connect_failed(&myself, state, reason),
            McpMsg::Idle { generation } => {
                if generation == state.generation && self.shared.peer.load().is_some() {
                    self.shared.peer.store(None);
                    self.shared.lost.load().cancel();
                    state.connection = None;
                    info!(server, "closed the unused connection of a lazy server");
                    self.shared.set_health(ServerHealth::Idle);
                }
            }
            McpMsg::Remembered { tools } => self.remembered(&myself, state, tools).await?,
            McpMsg::ToolsChanged => self.relist(&myself, state),
            McpMsg::OffersChanged => self.list_offers(),
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
    /// Connects, unless connected or connecting, in a task bounded by the server's timeout.
    fn connect_now(&self, myself: &ActorRef<McpMsg>, state: &mut McpClientState) {
        if state.connecting || self.shared.peer.load().is_some() {
            return;
        }
        state.connecting = true;
        let (shared, actor) = (self.shared.clone(), myself.clone());
        // Bounded by the server's timeout, so a server that never answers cannot
        // keep the actor waiting.
        let limit = self.shared.config.timeout;
        self.spawn("connect", async move {
            let message = match tokio::time::timeout(limit, connect(shared, actor.clone())).await {
                Ok(Ok((connection, group, tools))) => {
                    McpMsg::Connected { connection: Box::new(connection), group, tools }
                }
                Ok(Err(reason)) => McpMsg::ConnectFailed { reason },
                Err(_) => McpMsg::ConnectFailed { reason: format!("no answer within {limit:?}") },
            };
            let _ = actor.cast(message);
        });
    }

    /// Takes a new connection into use: its peer, what follows it (the tool-list subscription,
    /// liveness, idleness), the server's health and its tools.
    async fn connected(
        &self,
        myself: &ActorRef<McpMsg>,
        state: &mut McpClientState,
        connection: Box<Connection>,
        group: Option<ProcessGroupGuard>,
        tools: Vec<Tool>,
    ) {
        let server = self.shared.name();
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
        let modern = crate::offers::per_request(&peer);
        // The new token before the new peer: a call that sees the peer sees its token.
        self.shared.lost.store(Arc::new(CancellationToken::new()));
        self.shared.peer.store(Some(Arc::new(peer.clone())));
        let close = CancellationToken::new();
        state.connection = Some(close.clone().drop_guard());
        if modern {
            let lost = CancellationToken::clone(&self.shared.lost.load());
            self.spawn("subscription", follow_lists(peer.clone(), myself.clone(), lost));
            let lost = CancellationToken::clone(&self.shared.lost.load());
            let (server, subscribed) =
                (self.shared.name().to_owned(), self.shared.subscribed.subscribe());
            let updated = self.shared.offers_changed.updated.clone();
            let follow =
                crate::offers::follow_resources(peer.clone(), server, subscribed, updated, lost);
            self.spawn("resource subscriptions", follow);
        }
        if let Some(interval) = self.shared.config.ping_interval {
            let lost = CancellationToken::clone(&self.shared.lost.load());
            self.spawn("liveness", probe(peer, modern, interval, lost, myself.clone(), generation));
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
        self.list_offers();
        self.resubscribe();
        self.shared.touch();
        self.shared.attempts.send_modify(|n| *n += 1);
        if self.shared.config.connect == crate::ConnectMode::Lazy {
            let (shared, actor) = (self.shared.clone(), myself.clone());
            let lost = CancellationToken::clone(&self.shared.lost.load());
            self.spawn("idle", watch_idle(shared, actor, lost, generation));
        }
    }

    /// Notes a failed connection attempt (once at warning level) and schedules the next.
    fn connect_failed(
        &self,
        myself: &ActorRef<McpMsg>,
        state: &mut McpClientState,
        reason: String,
    ) {
        let server = self.shared.name();
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
        self.schedule_reconnect(myself, state);
    }

    /// Publishes the listing remembered from the last run unless a newer one came, and
    /// connects unless the server is lazy and its tools are known.
    async fn remembered(
        &self,
        myself: &ActorRef<McpMsg>,
        state: &mut McpClientState,
        tools: Option<Vec<Tool>>,
    ) -> Result<(), ActorProcessingErr> {
        let server = self.shared.name();
        let lazy = self.shared.config.connect == crate::ConnectMode::Lazy;
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
        Ok(())
    }

    /// Lists the tools again, in a task, after the server said they changed.
    fn relist(&self, myself: &ActorRef<McpMsg>, state: &McpClientState) {
        let Some(peer) = self.shared.peer.load_full() else { return };
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
            .get::<crate::McpConfig>()
            .unwrap()
            .servers
            .remove(0);
        let idle = config.idle_timeout;
        let shared =
            ServerShared::new(config, Arc::default(), Arc::default(), None, Arc::new(|_| {}));
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
