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
                    Ok(()) => break,
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
