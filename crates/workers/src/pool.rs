use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use arc_swap::ArcSwap;
use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent,
};
use tokio::sync::Semaphore;
use tracing::{error, info, warn};

use crate::WorkersConfig;

use crate::{WorkerActor, WorkerMsg, WorkersError};

/// Returns the limits of a tool that sets none under `workers`: its share of the workers
/// (at least one) and of the queue (`tool_share`, a bulkhead, so that one saturated tool
/// cannot take the whole pool).
pub(crate) fn share(workers: &WorkersConfig) -> (usize, usize) {
    let share = workers.tool_share.clamp(f64::MIN_POSITIVE, 1.0);
    let running = ((workers.size.get() as f64 * share).floor() as usize).max(1);
    let queued = (workers.queue as f64 * share).floor() as usize;
    (running, queued)
}

/// A point-in-time view of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Configured workers.
    pub size: usize,
    /// Workers waiting for work.
    pub idle: usize,
    /// Calls admitted and not finished (running or waiting).
    pub admitted: usize,
    /// Workers replaced after a crash since the pool started.
    pub restarts: u64,
}

/// Messages of the [`WorkerPoolActor`].
#[derive(Debug)]
pub enum WorkerPoolMsg {
    /// Returns the number of live workers.
    LiveWorkers {
        /// The count.
        reply: RpcReplyPort<usize>,
    },
}

/// Supervises the workers: starts `size` of them and replaces any that dies.
#[derive(Debug, Clone)]
pub struct WorkerPoolActor {
    size: usize,
    idle: async_channel::Sender<ActorRef<WorkerMsg>>,
    restarts: Arc<AtomicU64>,
}

/// The [`WorkerPoolActor`]'s state: the live workers by id.
#[derive(Debug, Default)]
pub struct WorkerPoolState {
    workers: HashMap<ActorId, ActorRef<WorkerMsg>>,
}

impl WorkerPoolActor {
    async fn spawn_worker(
        &self,
        myself: &ActorRef<WorkerPoolMsg>,
        state: &mut WorkerPoolState,
    ) -> Result<(), ActorProcessingErr> {
        // Workers are unnamed: a restarted worker must not race its predecessor's name.
        let (worker, _) = Actor::spawn_linked(
            None,
            WorkerActor { idle: self.idle.clone() },
            (),
            myself.get_cell(),
        )
        .await?;
        state.workers.insert(worker.get_id(), worker);
        Ok(())
    }

    async fn replace(
        &self,
        myself: &ActorRef<WorkerPoolMsg>,
        state: &mut WorkerPoolState,
        cell: &ActorCell,
    ) {
        if state.workers.remove(&cell.get_id()).is_none() {
            return;
        }
        self.restarts.fetch_add(1, Ordering::Relaxed);
        if let Err(error) = self.spawn_worker(myself, state).await {
            error!(%error, live = state.workers.len(), "cannot replace a dead worker; the pool shrinks");
        }
    }
}

impl Actor for WorkerPoolActor {
    type Msg = WorkerPoolMsg;
    type State = WorkerPoolState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        _: (),
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut state = WorkerPoolState::default();
        for _ in 0..self.size {
            self.spawn_worker(&myself, &mut state).await?;
        }
        info!(workers = self.size, "worker pool started");
        Ok(state)
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        for (_, worker) in state.workers.drain() {
            worker.stop(Some("pool stopped".into()));
        }
        self.idle.close();
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            WorkerPoolMsg::LiveWorkers { reply } => {
                let _ = reply.send(state.workers.len());
            }
        }
        Ok(())
    }

    // The default implementation stops the supervisor when a child stops: never wanted here.
    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, reason) => {
                warn!(worker = %cell.get_id(), %reason, "worker failed; starting a replacement");
                self.replace(&myself, state, &cell).await;
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                warn!(worker = %cell.get_id(), ?reason, "worker stopped; starting a replacement");
                self.replace(&myself, state, &cell).await;
            }
            SupervisionEvent::ActorStarted(_) | SupervisionEvent::ProcessGroupChanged(_) => {}
        }
        Ok(())
    }
}

/// Handle to the local worker pool; cheap to clone.
#[derive(Debug, Clone)]
pub struct WorkerPool {
    pub(crate) inner: Arc<PoolInner>,
}

#[derive(Debug)]
pub(crate) struct PoolInner {
    pub(crate) idle: async_channel::Receiver<ActorRef<WorkerMsg>>,
    pub(crate) admission: Arc<Semaphore>,
    pub(crate) options: WorkersConfig,
    /// The pool's actor; a supervisor that restarts it swaps in the new one.
    supervisor: ArcSwap<ActorRef<WorkerPoolMsg>>,
    /// Where workers put themselves when idle; kept for a restarted pool actor.
    idle_tx: async_channel::Sender<ActorRef<WorkerMsg>>,
    restarts: Arc<AtomicU64>,
    /// Set once the pool is stopping: calls are refused.
    pub(crate) stopping: AtomicBool,
}

impl WorkerPool {
    /// Starts the supervisor and its workers.
    pub async fn start(options: WorkersConfig) -> Result<Self, WorkersError> {
        let size = options.size.get();
        let (idle_tx, idle_rx) = async_channel::bounded(size);
        let restarts = Arc::new(AtomicU64::new(0));
        let actor = WorkerPoolActor { size, idle: idle_tx.clone(), restarts: restarts.clone() };
        let (supervisor, _) = Actor::spawn(None, actor, ()).await.map_err(WorkersError::Spawn)?;
        let pool = WorkerPool {
            inner: Arc::new(PoolInner {
                idle: idle_rx,
                admission: Arc::new(Semaphore::new(size + options.queue)),
                options,
                supervisor: ArcSwap::from_pointee(supervisor),
                idle_tx,
                restarts,
                stopping: AtomicBool::new(false),
            }),
        };
        pool.observe();
        Ok(pool)
    }

    /// Reports the pool's workers, those running and the calls queued, at each collection.
    fn observe(&self) {
        use toolmesh_telemetry::{names, observe_gauge};
        /// A gauge's name, description, and its reading of the pool's figures.
        type Reading = (&'static str, &'static str, fn(PoolStats) -> usize);
        let readings: [Reading; 3] = [
            (names::METRIC_POOL_WORKERS, "the local worker pool's workers", |s| s.size),
            (names::METRIC_POOL_RUNNING, "local workers running a call", |s| s.size - s.idle),
            (
                names::METRIC_POOL_QUEUED,
                "calls admitted to the local pool waiting for a worker",
                |s| s.admitted.saturating_sub(s.size - s.idle),
            ),
        ];
        for (name, description, read) in readings {
            let inner = Arc::downgrade(&self.inner);
            observe_gauge(name, description, move |observe| {
                if let Some(inner) = inner.upgrade() {
                    observe(read(WorkerPool { inner }.stats()) as u64, &[]);
                }
            });
        }
    }

    /// Returns the pool's current figures.
    pub fn stats(&self) -> PoolStats {
        let capacity = self.inner.options.size.get() + self.inner.options.queue;
        PoolStats {
            size: self.inner.options.size.get(),
            idle: self.inner.idle.len(),
            admitted: capacity - self.inner.admission.available_permits(),
            restarts: self.inner.restarts.load(Ordering::Relaxed),
        }
    }

    /// Returns the number of live workers, asking the supervisor.
    pub async fn live_workers(&self) -> Option<usize> {
        let supervisor = self.inner.supervisor.load_full();
        ractor::call!(supervisor, |reply| WorkerPoolMsg::LiveWorkers { reply }).ok()
    }

    /// Returns the pool's actor, for a supervisor to link.
    pub fn actor(&self) -> ActorCell {
        self.inner.supervisor.load().get_cell()
    }

    /// Starts a fresh pool actor, with a full set of fresh workers, under `supervisor`,
    /// after the old one failed and its workers were stopped; the handle and the tools
    /// bound to it use the new one.
    pub async fn respawn(&self, supervisor: ActorCell) -> Result<ActorCell, WorkersError> {
        // The old workers are gone; what the idle queue still holds of them is stale.
        while self.inner.idle.try_recv().is_ok() {}
        let actor = WorkerPoolActor {
            size: self.inner.options.size.get(),
            idle: self.inner.idle_tx.clone(),
            restarts: self.inner.restarts.clone(),
        };
        let (actor, _) =
            Actor::spawn_linked(None, actor, (), supervisor).await.map_err(WorkersError::Spawn)?;
        self.inner.supervisor.store(Arc::new(actor.clone()));
        Ok(actor.get_cell())
    }

    /// Returns whether the pool runs (it was not stopped, and its supervisor is alive).
    pub fn is_running(&self) -> bool {
        self.inner.supervisor.load().get_status() == ractor::ActorStatus::Running
    }

    /// Resolves when the pool's supervisor has ended.
    pub async fn stopped(&self) {
        let supervisor = self.inner.supervisor.load_full();
        let _ = supervisor.wait(None).await;
    }

    /// Stops the pool: new calls are refused as unavailable at once, calls admitted before
    /// get up to `grace` to finish, then the supervisor and every worker stop.
    pub async fn stop(&self, grace: std::time::Duration) {
        self.inner.stopping.store(true, Ordering::Release);
        let capacity = self.inner.options.size.get() + self.inner.options.queue;
        let admitted = self.inner.admission.acquire_many(capacity as u32);
        if tokio::time::timeout(grace, admitted).await.is_err() {
            warn!(
                admitted = self.stats().admitted,
                "local calls still running after the grace period; stopping the pool anyway"
            );
        }
        let _ = self
            .inner
            .supervisor
            .load()
            .stop_and_wait(Some("shutdown".into()), Some(std::time::Duration::from_secs(5)))
            .await;
    }
}

#[async_trait::async_trait]
impl toolmesh_core::Supervised for WorkerPool {
    fn actor(&self) -> ractor::ActorCell {
        WorkerPool::actor(self)
    }

    async fn respawn(
        &self,
        root: ractor::ActorCell,
        _: String,
    ) -> Result<ractor::ActorCell, String> {
        WorkerPool::respawn(self, root).await.map_err(|e| e.to_string())
    }
}
