use std::{num::NonZeroUsize, sync::Arc};

use serde_json::Value;
use tokio::sync::{Semaphore, oneshot};
use toolmesh_core::{Backend, BackendError, CallContext, ToolOutput};
use toolmesh_telemetry::names;
use tracing::info_span;

use crate::{LocalTool, WorkerMsg, WorkerPool};

/// Per-tool limits on the worker pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToolLimits {
    /// Calls of this tool that may run at once; `None`: the tool's share of the pool
    /// (`workers.tool_share`).
    pub max_concurrency: Option<NonZeroUsize>,
    /// Calls of this tool that may wait beyond `max_concurrency`; the rest are refused.
    /// Without `max_concurrency`, the tool's share of the pool's queue applies instead.
    pub max_queue: usize,
}

/// Records how long an admitted call waited for a worker of the local pool.
fn waited(wait: std::time::Duration) {
    use std::sync::OnceLock;

    use opentelemetry::metrics::Histogram;
    static WAIT: OnceLock<Histogram<f64>> = OnceLock::new();
    WAIT.get_or_init(|| {
        opentelemetry::global::meter("toolmesh")
            .f64_histogram(names::METRIC_POOL_WAIT)
            .with_unit("s")
            .with_description("how long calls admitted to the local pool waited for a worker")
            .with_boundaries(names::DURATION_BUCKETS.to_vec())
            .build()
    })
    .record(wait.as_secs_f64(), &[]);
}

/// The permits of one tool's own limit.
struct ToolSlots {
    /// Running plus waiting calls; taken without waiting, so a full tool refuses at once.
    admission: Arc<Semaphore>,
    /// Running calls.
    running: Arc<Semaphore>,
    max_running: usize,
    max_queued: usize,
    /// Which limit this is, for the refusal.
    origin: &'static str,
}

/// A local tool bound to the pool; what the registry holds as the tool's backend.
pub(crate) struct LocalBackend {
    pool: WorkerPool,
    tool: Arc<dyn LocalTool>,
    slots: ToolSlots,
}

impl LocalBackend {
    pub(crate) fn new(pool: WorkerPool, tool: Arc<dyn LocalTool>, limits: ToolLimits) -> Self {
        let ((running, queued), origin) = match limits.max_concurrency {
            Some(running) => ((running.get(), limits.max_queue), "the tool's limit"),
            None => {
                (crate::pool::share(&pool.inner.options), "the tool's share of the worker pool")
            }
        };
        let slots = ToolSlots {
            admission: Arc::new(Semaphore::new(running + queued)),
            running: Arc::new(Semaphore::new(running)),
            max_running: running,
            max_queued: queued,
            origin,
        };
        LocalBackend { pool, tool, slots }
    }
}

#[async_trait::async_trait]
impl Backend for LocalBackend {
    async fn call(&self, ctx: CallContext, arguments: Value) -> Result<ToolOutput, BackendError> {
        let overloaded =
            |reason: String| BackendError::Overloaded { tool: ctx.tool.clone(), reason };

        // Admission is all-or-nothing and immediate: a full tool or pool refuses the call
        // instead of letting waiters pile up.
        let pool = &self.pool.inner;
        if pool.stopping.load(std::sync::atomic::Ordering::Acquire) {
            return Err(BackendError::Unavailable {
                backend: "local worker pool".into(),
                reason: "toolmesh is shutting down".into(),
            });
        }
        let slots = &self.slots;
        let _tool_slot = slots.admission.clone().try_acquire_owned().map_err(|_| {
            overloaded(format!(
                "{} calls running and {} waiting ({})",
                slots.max_running, slots.max_queued, slots.origin
            ))
        })?;
        let _pool_slot = pool.admission.clone().try_acquire_owned().map_err(|_| {
            overloaded(format!(
                "the local worker pool is full: {} running and {} waiting",
                pool.options.size, pool.options.queue
            ))
        })?;

        let admitted = std::time::Instant::now();
        let wait = async {
            let _running = slots.running.acquire().await;
            let (reply, outcome) = oneshot::channel();
            let span = info_span!(
                names::SPAN_WORKER_EXECUTE,
                { names::GEN_AI_TOOL_NAME } = %ctx.tool,
                { names::GEN_AI_TOOL_CALL_ID } = %ctx.call_id,
            );
            let mut message = WorkerMsg::Execute {
                tool: self.tool.clone(),
                ctx: ctx.clone(),
                arguments,
                span,
                reply,
            };
            // A worker that died while idle (or went with a restarted pool) never took the
            // call: the next idle worker does.
            let mut tries = pool.options.size.get() + 1;
            loop {
                let worker = pool.idle.recv().await.map_err(|_| BackendError::Unavailable {
                    backend: "local worker pool".into(),
                    reason: "the pool is stopped".into(),
                })?;
                match worker.cast(message) {
                    Ok(()) => {
                        waited(admitted.elapsed());
                        break;
                    }
                    Err(ractor::MessagingErr::SendErr(returned)) if tries > 1 => {
                        message = returned;
                        tries -= 1;
                    }
                    Err(_) => {
                        return Err(BackendError::Unavailable {
                            backend: "local worker pool".into(),
                            reason: "no live worker took the call".into(),
                        });
                    }
                }
            }
            // A dropped reply port means the worker died without answering.
            outcome.await.unwrap_or_else(|_| {
                Err(BackendError::Crashed {
                    tool: ctx.tool.clone(),
                    call_id: ctx.call_id.clone(),
                    reason: "its worker stopped during the call".into(),
                })
            })
        };
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => Err(BackendError::Cancelled),
            result = wait => result,
        }
    }
}

impl WorkerPool {
    /// Returns a backend that runs `tool` on this pool within `limits`.
    pub fn bind(
        &self,
        tool: Arc<dyn LocalTool>,
        limits: ToolLimits,
    ) -> Arc<dyn toolmesh_core::Backend> {
        Arc::new(LocalBackend::new(self.clone(), tool, limits))
    }
}

#[cfg(test)]
mod tests {
    use std::{num::NonZeroUsize, sync::Arc, time::Duration};

    use crate::WorkersConfig;
    use serde_json::json;
    use tokio::sync::Semaphore;
    use tokio_util::sync::CancellationToken;
    use toolmesh_core::{BackendError, CallContext, ContentPart, ToolOutput, ToolSource, ToolSpec};

    use super::*;

    /// Waits for a permit of its gate, then answers; panics on `{"panic": true}`.
    struct Gated(Arc<Semaphore>);

    #[async_trait::async_trait]
    impl LocalTool for Gated {
        fn spec(&self) -> ToolSpec {
            ToolSpec::new("gated", "Waits.", json!({"type": "object"}), ToolSource::local("test"))
        }

        async fn call(
            &self,
            _: &CallContext,
            arguments: Value,
        ) -> Result<ToolOutput, BackendError> {
            assert!(arguments.get("panic").is_none(), "the tool panicked on purpose");
            let _permit = self.0.acquire().await;
            Ok(ToolOutput { content: vec![ContentPart::Text("done".into())], ..Default::default() })
        }
    }

    fn workers(size: usize, queue: usize, tool_share: f64) -> WorkersConfig {
        WorkersConfig { size: NonZeroUsize::new(size).unwrap(), queue, tool_share }
    }

    fn context(cancel: CancellationToken) -> CallContext {
        CallContext {
            call_id: "c1".into(),
            session_id: None,
            profile: None,
            tool: "gated".into(),
            cancel,
            deadline: tokio::time::Instant::now() + Duration::from_secs(30),
            events: Default::default(),
            attempt: 1,
            principal: toolmesh_core::open_principal(),
            depth: 0,
        }
    }

    async fn started(
        backend: &Arc<dyn Backend>,
        cancel: CancellationToken,
        arguments: Value,
    ) -> tokio::task::JoinHandle<Result<ToolOutput, BackendError>> {
        let backend = backend.clone();
        let handle = tokio::spawn(async move { backend.call(context(cancel), arguments).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        handle
    }

    #[test]
    fn a_tool_without_limits_holds_its_share_of_the_pool_and_at_least_one_worker() {
        assert_eq!(crate::pool::share(&workers(8, 16, 0.5)), (4, 8));
        assert_eq!(crate::pool::share(&workers(4, 10, 0.1)), (1, 1));
        assert_eq!(crate::pool::share(&workers(4, 10, 1.0)), (4, 10));
    }

    #[tokio::test]
    async fn a_full_tool_is_refused_at_once_and_its_waiting_calls_run_in_turn() {
        let pool = WorkerPool::start(workers(4, 8, 1.0)).await.unwrap();
        let gate = Arc::new(Semaphore::new(0));
        let limits = ToolLimits { max_concurrency: NonZeroUsize::new(1), max_queue: 1 };
        let backend = pool.bind(Arc::new(Gated(gate.clone())), limits);
        let running = started(&backend, CancellationToken::new(), json!({})).await;
        let waiting = started(&backend, CancellationToken::new(), json!({})).await;
        let refused = backend.call(context(CancellationToken::new()), json!({})).await;
        let Err(BackendError::Overloaded { reason, .. }) = refused else {
            panic!("a third call is refused at once: {refused:?}");
        };
        assert!(reason.contains("1 calls running and 1 waiting (the tool's limit)"), "{reason}");
        gate.add_permits(2);
        assert!(running.await.unwrap().is_ok());
        assert!(waiting.await.unwrap().is_ok());
        pool.stop(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn a_cancelled_call_stops_waiting_and_frees_its_place() {
        let pool = WorkerPool::start(workers(1, 1, 1.0)).await.unwrap();
        let gate = Arc::new(Semaphore::new(0));
        let backend = pool.bind(Arc::new(Gated(gate.clone())), ToolLimits::default());
        let running = started(&backend, CancellationToken::new(), json!({})).await;
        let cancel = CancellationToken::new();
        let waiting = started(&backend, cancel.clone(), json!({})).await;
        cancel.cancel();
        assert!(matches!(waiting.await.unwrap(), Err(BackendError::Cancelled)));
        // Its place in the queue is free again.
        let queued = started(&backend, CancellationToken::new(), json!({})).await;
        gate.add_permits(2);
        assert!(running.await.unwrap().is_ok());
        assert!(queued.await.unwrap().is_ok());
        pool.stop(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn a_panicking_call_costs_its_worker_which_the_pool_replaces() {
        let pool = WorkerPool::start(workers(2, 4, 1.0)).await.unwrap();
        let gate = Arc::new(Semaphore::new(10));
        let backend = pool.bind(Arc::new(Gated(gate)), ToolLimits::default());
        let crashed = backend.call(context(CancellationToken::new()), json!({"panic": true})).await;
        let Err(BackendError::Crashed { reason, .. }) = crashed else {
            panic!("the panic is the call's error: {crashed:?}");
        };
        assert!(reason.contains("panicked on purpose"), "{reason}");
        let mut live = None;
        for _ in 0..100 {
            live = pool.live_workers().await;
            if live == Some(2) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(live, Some(2), "the pool replaced the worker");
        assert!(backend.call(context(CancellationToken::new()), json!({})).await.is_ok());
        pool.stop(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn a_stopping_pool_refuses_new_calls() {
        let pool = WorkerPool::start(workers(1, 1, 1.0)).await.unwrap();
        let backend =
            pool.bind(Arc::new(Gated(Arc::new(Semaphore::new(1)))), ToolLimits::default());
        pool.stop(Duration::from_secs(1)).await;
        let refused = backend.call(context(CancellationToken::new()), json!({})).await;
        assert!(matches!(refused, Err(BackendError::Unavailable { .. })), "{refused:?}");
    }
}
