//! The root of the supervision tree: it restarts a child actor that ends unasked, and its
//! health shows the gap.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

use arc_swap::ArcSwap;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::Notify;
use toolmesh_config::Config;
use toolmesh_core::{Health, Provider, ProviderError, Supervised};
use tracing::{error, info};

/// Restarts within [`RESTART_WINDOW`] after which the root gives a child up.
const MAX_RESTARTS: usize = 5;
/// The window of [`MAX_RESTARTS`].
const RESTART_WINDOW: Duration = Duration::from_secs(60);
/// How long the children of a failed child get to stop before it is started again.
const ORPHANS_STOP: Duration = Duration::from_secs(10);

/// One child of the root: its name (in health, `toolmesh.actor.<name>`) and its handle.
pub(crate) type Child = (&'static str, Arc<dyn Supervised>);

/// What the root publishes of its children, their actors and health: a snapshot that
/// only the root writes (its `State` holds the children), and readers never wait for.
#[derive(Default)]
pub struct Children {
    current: ArcSwap<BTreeMap<&'static str, (ActorCell, Health)>>,
    changed: Notify,
}

impl Children {
    fn update(&self, change: impl FnOnce(&mut BTreeMap<&'static str, (ActorCell, Health)>)) {
        let mut next = (**self.current.load()).clone();
        change(&mut next);
        self.current.store(Arc::new(next));
        self.changed.notify_one();
    }

    fn set(&self, name: &'static str, actor: ActorCell, health: Health) {
        self.update(|children| {
            children.insert(name, (actor, health));
        });
    }

    fn set_health(&self, name: &'static str, health: Health) {
        self.update(|children| {
            if let Some(entry) = children.get_mut(name) {
                entry.1 = health;
            }
        });
    }

    /// Returns each child's actor now.
    pub fn actors(&self) -> Vec<(&'static str, ActorCell)> {
        self.current.load().iter().map(|(name, (actor, _))| (*name, actor.clone())).collect()
    }
}

/// The root supervisor.
pub(crate) struct RootSupervisor {
    children: Arc<Children>,
}

struct Running {
    name: &'static str,
    handle: Arc<dyn Supervised>,
    actor: ActorCell,
    restarts: VecDeque<Instant>,
    total: u64,
}

/// The [`RootSupervisor`]'s state: its children, with their recent restarts.
pub(crate) struct RootState {
    children: Vec<Running>,
}

impl RootSupervisor {
    /// Starts the root over `children`, which already run; it links them.
    pub(crate) async fn start(
        children: Vec<Child>,
    ) -> Result<(ActorRef<()>, Arc<Children>), ractor::SpawnErr> {
        let published = Arc::new(Children::default());
        let (root, _) =
            Actor::spawn(None, RootSupervisor { children: published.clone() }, children).await?;
        Ok((root, published))
    }
}

impl Actor for RootSupervisor {
    type Msg = ();
    type State = RootState;
    type Arguments = Vec<Child>;

    async fn pre_start(
        &self,
        myself: ActorRef<()>,
        children: Vec<Child>,
    ) -> Result<RootState, ActorProcessingErr> {
        let children = children
            .into_iter()
            .map(|(name, handle)| {
                let actor = handle.actor();
                actor.link(myself.get_cell());
                self.children.set(name, actor.clone(), Health::up());
                Running { name, handle, actor, restarts: VecDeque::new(), total: 0 }
            })
            .collect();
        Ok(RootState { children })
    }

    async fn post_stop(
        &self,
        myself: ActorRef<()>,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        // Stopped after the providers: what still runs is unlinked, not restarted.
        for child in &state.children {
            child.actor.unlink(myself.get_cell());
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<()>,
        event: SupervisionEvent,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, reason) = match event {
            SupervisionEvent::ActorFailed(cell, reason) => (cell, reason.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell, reason.unwrap_or_else(|| "stopped".into()))
            }
            _ => return Ok(()),
        };
        let Some(child) = state.children.iter_mut().find(|c| c.actor.get_id() == cell.get_id())
        else {
            return Ok(());
        };
        let now = Instant::now();
        child.restarts.retain(|at| now.duration_since(*at) < RESTART_WINDOW);
        if child.restarts.len() >= MAX_RESTARTS {
            error!(
                actor = child.name,
                %reason,
                "the {} actor failed {MAX_RESTARTS} times in {} s; not restarting it again",
                child.name,
                RESTART_WINDOW.as_secs()
            );
            self.children.set_health(
                child.name,
                Health::down(format!("failed {MAX_RESTARTS} times in a minute; last: {reason}")),
            );
            return Ok(());
        }
        error!(actor = child.name, %reason, "the {} actor ended unexpectedly; restarting it", child.name);
        self.children.set_health(child.name, Health::down(format!("restarting after: {reason}")));
        // What it supervised went with it: stop those before a fresh one starts theirs.
        cell.stop_children_and_wait(Some("its supervisor failed".into()), Some(ORPHANS_STOP)).await;
        child.restarts.push_back(now);
        match child.handle.respawn(myself.get_cell(), reason.clone()).await {
            Ok(actor) => {
                child.total += 1;
                child.actor = actor.clone();
                info!(actor = child.name, restarts = child.total, "restarted");
                let status = format!("restarted {} times; last failure: {reason}", child.total);
                self.children.set(child.name, actor, Health { up: true, status });
            }
            Err(error) => {
                error!(actor = child.name, %error, "cannot restart the {} actor", child.name);
                self.children
                    .set_health(child.name, Health::down(format!("cannot restart: {error}")));
            }
        }
        Ok(())
    }
}

/// The root's children as a provider of health only: `toolmesh.actor.<name>`, up while
/// the child runs, down from its failure until it runs again.
pub(crate) struct ActorsHealth(pub(crate) Arc<Children>);

#[async_trait::async_trait]
impl Provider<Config> for ActorsHealth {
    fn kind(&self) -> &'static str {
        "actor"
    }

    async fn start(&self, _: &Config) -> Result<(), ProviderError> {
        Ok(())
    }

    async fn reload(&self, _: &Config) -> Result<(), ProviderError> {
        Ok(())
    }

    fn health(&self) -> Vec<(String, Health)> {
        let current = self.0.current.load();
        current.iter().map(|(name, (_, health))| ((*name).to_owned(), health.clone())).collect()
    }

    async fn health_changed(&self) {
        self.0.changed.notified().await;
    }

    async fn stop(&self, _: Duration) {}
}
