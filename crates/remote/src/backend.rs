//! One call on a remote worker: wait for a free slot, send, follow, answer.

use std::{
    sync::{Arc, Weak},
    time::Duration,
};

use serde_json::Value;
use tokio::time::Instant;
use toolmesh_core::{Backend, BackendError, CallContext, CallEvent, ToolOutput};
use toolmesh_proto::v1;

use crate::members::{Link, Members, PARTIAL_WINDOW, Pending, Pick, PoolLoad};

/// The backend of a tool that remote workers serve.
#[derive(Debug)]
pub struct RemoteBackend {
    members: Weak<Members>,
    tool: String,
    /// The calls of the pool whose workers serve the tool.
    load: Arc<PoolLoad>,
}

impl RemoteBackend {
    pub(crate) fn new(members: Weak<Members>, tool: String, load: Arc<PoolLoad>) -> Self {
        RemoteBackend { members, tool, load }
    }

    /// A backend that reaches no worker: for checking a definition.
    pub(crate) fn nowhere() -> Self {
        RemoteBackend { members: Weak::new(), tool: String::new(), load: Arc::default() }
    }

    /// Waits for a slot on a worker serving the tool, until `by` (the sooner of the
    /// schedule-to-start timeout and the call's deadline).
    async fn schedule(
        &self,
        members: &Members,
        ctx: &CallContext,
        by: Instant,
        patience: Duration,
    ) -> Result<Arc<Link>, BackendError> {
        loop {
            let freed = members.freed.notified();
            tokio::pin!(freed);
            // Registered before looking, so that a slot freed meanwhile is not missed.
            freed.as_mut().enable();
            let why = match members.pick(&self.tool) {
                Pick::Got(link) => return Ok(link),
                Pick::Busy { workers, capacity } => (workers, capacity),
                Pick::Nobody => (0, 0),
            };
            tokio::select! {
                () = &mut freed => {}
                () = tokio::time::sleep_until(by) => {
                    if by >= ctx.deadline {
                        return Err(BackendError::DeadlineExceeded(patience));
                    }
                    let waited = patience.as_millis();
                    return Err(match why {
                        (0, _) => BackendError::Unavailable {
                            backend: "remote workers".into(),
                            reason: format!(
                                "no worker serving tool {} connected within {waited} ms",
                                self.tool
                            ),
                        },
                        (workers, capacity) => BackendError::Overloaded {
                            tool: self.tool.clone(),
                            reason: format!(
                                "no free slot on its {workers} worker(s) ({capacity} calls at \
                                 once) within {waited} ms (schedule-to-start)"
                            ),
                        },
                    });
                }
                () = ctx.cancel.cancelled() => return Err(BackendError::Cancelled),
            }
        }
    }
}

/// Records how long a call of `pool` waited for a worker's slot.
fn scheduled(pool: &str, waited: Duration) {
    use std::sync::OnceLock;

    use opentelemetry::{KeyValue, metrics::Histogram};
    use toolmesh_telemetry::names;
    static WAITED: OnceLock<Histogram<f64>> = OnceLock::new();
    WAITED
        .get_or_init(|| {
            opentelemetry::global::meter("toolmesh")
                .f64_histogram(names::METRIC_REMOTE_SCHEDULE_TO_START)
                .with_unit("s")
                .with_description("how long remote calls waited for a worker's slot, by pool")
                .with_boundaries(names::DURATION_BUCKETS.to_vec())
                .build()
        })
        .record(
            waited.as_secs_f64(),
            &[KeyValue::new(names::TOOLMESH_SOURCE_NAME, pool.to_owned())],
        );
}

/// Gives the slot back when the call ends, however it ends.
struct Slot<'a> {
    members: &'a Members,
    key: u64,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.members.release(self.key);
    }
}

#[async_trait::async_trait]
impl Backend for RemoteBackend {
    async fn call(&self, ctx: CallContext, arguments: Value) -> Result<ToolOutput, BackendError> {
        let Some(members) = self.members.upgrade() else {
            return Err(BackendError::Unavailable {
                backend: "remote workers".into(),
                reason: "the router is shutting down".into(),
            });
        };
        let (patience, attempt_limit) = members.config().timeouts(&self.tool);
        let by = (Instant::now() + patience).min(ctx.deadline);
        let arguments_json = arguments.to_string();
        let trace_context = toolmesh_telemetry::context_headers(&tracing::Span::current());
        // Who calls, for the worker's tools; the credential stays here.
        let caller = (!toolmesh_core::is_open(&ctx.principal)).then(|| v1::Caller {
            name: ctx.principal.name.clone(),
            kind: ctx.principal.kind.as_str().to_owned(),
            issuer: ctx.principal.issuer.clone().unwrap_or_default(),
            roles: ctx.principal.roles.clone(),
            attributes: ctx.principal.attributes.clone().into_iter().collect(),
        });
        loop {
            let waiting = Instant::now();
            let link = {
                let _pending = self.load.count(false);
                self.schedule(&members, &ctx, by, patience).await?
            };
            scheduled(&self.load.pool, waiting.elapsed());
            let _slot = Slot { members: &members, key: link.key };
            let _running = self.load.count(true);
            let left = ctx.deadline.saturating_duration_since(Instant::now());
            let limit = attempt_limit.map_or(left, |limit| limit.min(left));
            // The worker's session knows the call by an id this router makes: ids that
            // callers choose may be the same for two calls at once.
            let dispatch = members.dispatch_id();
            let call = v1::WorkerCall {
                call_id: dispatch.clone(),
                caller_call_id: ctx.call_id.clone(),
                tool: self.tool.clone(),
                arguments_json: arguments_json.clone(),
                timeout_ms: limit.as_millis() as u64,
                trace_context: trace_context.clone(),
                session_id: ctx.session_id.clone().unwrap_or_default(),
                attempt: ctx.attempt,
                depth: ctx.depth,
                caller: caller.clone(),
                partial_window: PARTIAL_WINDOW,
            };
            // A session that ended before the call was sent never ran it: another worker may.
            let Some(pending) = link.start(call) else { continue };
            return follow(&link, &ctx, &dispatch, pending, limit).await;
        }
    }
}

/// Forwards the events of a call sent to `link` as `dispatch` and returns its answer;
/// cancels it on the worker when the caller cancels or the attempt's time (`limit`) runs out.
async fn follow(
    link: &Link,
    ctx: &CallContext,
    dispatch: &str,
    mut pending: Pending,
    limit: Duration,
) -> Result<ToolOutput, BackendError> {
    let ends = tokio::time::sleep(limit);
    tokio::pin!(ends);
    // A call dropped unanswered (the router's deadline came first, the caller went away)
    // is stopped on the worker too; for an answered call this does nothing.
    let _guard = CancelOnDrop { link, id: dispatch };
    let mut forwarded = 0;
    loop {
        tokio::select! {
            biased;
            answer = &mut pending.reply => {
                // Events sent before the answer reach the caller before it.
                while let Ok(event) = pending.events.try_recv() {
                    forward(ctx, event).await;
                }
                return answer.unwrap_or_else(|_| Err(BackendError::Lost {
                    backend: link.describe(),
                    reason: "the session ended".into(),
                }));
            }
            Some(event) = pending.events.recv() => {
                let partial = matches!(event, CallEvent::Partial(_));
                forward(ctx, event).await;
                // The caller took it: the worker may send another in its place. Credit goes
                // back by half windows, not one message per partial.
                if partial {
                    forwarded += 1;
                    if forwarded >= PARTIAL_WINDOW / 2 {
                        link.credit(dispatch, forwarded);
                        forwarded = 0;
                    }
                }
            }
            () = &mut ends => {
                link.cancel(dispatch, "start-to-close timeout");
                return Err(BackendError::DeadlineExceeded(limit));
            }
            () = ctx.cancel.cancelled() => {
                link.cancel(dispatch, "cancelled by the caller");
                return Err(BackendError::Cancelled);
            }
        }
    }
}

/// Cancels a call on its worker when dropped; [`Link::cancel`] does nothing for a call
/// already answered or cancelled.
struct CancelOnDrop<'a> {
    link: &'a Link,
    id: &'a str,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        self.link.cancel(self.id, "the call ended before its answer");
    }
}

async fn forward(ctx: &CallContext, event: CallEvent) {
    match event {
        CallEvent::Progress { progress, total, message } => {
            ctx.events.progress(progress, total, message)
        }
        CallEvent::Partial(part) => ctx.events.partial(part).await,
        CallEvent::Log { level, logger, data } => ctx.events.log(level, logger, data),
    }
}
