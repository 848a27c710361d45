use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use arc_swap::ArcSwap;

use tokio::{sync::Notify, time::Instant};
use tokio_util::sync::CancellationToken;
use toolmesh_core::{CallContext, EventSink, ToolOutput, ToolSource};
use toolmesh_policy::{AGENT_ATTRIBUTE, AuditEvent, Decision};
use toolmesh_registry::{RegistryHandle, ToolEntry};
use toolmesh_telemetry::names;
use tracing::{Instrument, Span, field::Empty, info_span};

use crate::{
    Admission, CallRequest, Door, RouterError, RouterOptions, Searched, approval, dispatch, steps,
    trace::trace_id,
};

/// Runs calls: resolve, admit, validate, dispatch with deadline and cancellation, shape
/// results. Cheap to clone; every call runs in the caller's own task.
#[derive(Debug, Clone)]
pub struct Router {
    registry: RegistryHandle,
    admission: Arc<ArcSwap<Admission>>,
    in_flight: Arc<InFlight>,
    options: RouterOptions,
}

/// The calls running through a router, for draining.
#[derive(Debug, Default)]
struct InFlight {
    count: AtomicUsize,
    /// Told when the count falls to zero.
    idle: Notify,
}

/// Counts one call while it runs.
struct Running<'a>(&'a InFlight);

impl<'a> Running<'a> {
    fn enter(in_flight: &'a InFlight) -> Self {
        in_flight.count.fetch_add(1, Ordering::AcqRel);
        Running(in_flight)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Router {
    /// Returns a router over `registry` that admits calls by `admission`.
    pub fn new(registry: RegistryHandle, admission: Admission, options: RouterOptions) -> Self {
        Router {
            registry,
            admission: Arc::new(ArcSwap::from_pointee(admission)),
            in_flight: Arc::default(),
            options,
        }
    }

    /// Returns the registry handle.
    pub fn registry(&self) -> &RegistryHandle {
        &self.registry
    }

    /// Returns the admission rules (the routing profiles) in force.
    pub fn admission(&self) -> Arc<Admission> {
        self.admission.load_full()
    }

    /// Puts `admission` in force for the calls that start from now on.
    pub fn set_admission(&self, admission: Admission) {
        self.admission.store(Arc::new(admission));
    }

    /// Returns the number of calls running (a callTool and the call it makes count twice).
    pub fn in_flight(&self) -> usize {
        self.in_flight.count.load(Ordering::Acquire)
    }

    /// Resolves once no call is running.
    pub async fn drained(&self) {
        loop {
            let idle = self.in_flight.idle.notified();
            tokio::pin!(idle);
            // Registered before the count is read, so the last call's notice is not missed.
            idle.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Returns a fresh call id (UUIDv7: unique and ordered by time).
    pub fn new_call_id() -> String {
        uuid::Uuid::now_v7().to_string()
    }

    /// Runs one call. Progress and partial outputs go to `events`. `cancel` belongs to this
    /// call: cancelling it, or dropping the returned future (which also cancels it), stops
    /// the tool. Returns the call id with the output.
    pub async fn call(
        &self,
        request: CallRequest,
        events: EventSink,
        cancel: CancellationToken,
    ) -> Result<(String, ToolOutput), RouterError> {
        self.enter(None, Door::Direct, request, events, cancel).await
    }

    /// Runs a call that `callTool` makes of `entry`, which it resolved: admitted through
    /// its door (the profile's pool, and what its search token shows), then as
    /// [`Router::call`].
    pub async fn call_resolved(
        &self,
        entry: Arc<ToolEntry>,
        searched: Searched,
        request: CallRequest,
        events: EventSink,
        cancel: CancellationToken,
    ) -> Result<(String, ToolOutput), RouterError> {
        self.enter(Some(entry), Door::CallTool(searched), request, events, cancel).await
    }

    async fn enter(
        &self,
        entry: Option<Arc<ToolEntry>>,
        door: Door,
        request: CallRequest,
        events: EventSink,
        cancel: CancellationToken,
    ) -> Result<(String, ToolOutput), RouterError> {
        let call_id =
            if request.call_id.is_empty() { Self::new_call_id() } else { request.call_id.clone() };
        let span = info_span!(
            "execute_tool",
            otel.name = %format!("{} {}", names::OP_EXECUTE_TOOL, request.name),
            otel.status_code = Empty,
            { names::GEN_AI_OPERATION_NAME } = names::OP_EXECUTE_TOOL,
            { names::GEN_AI_TOOL_NAME } = %request.name,
            { names::GEN_AI_TOOL_CALL_ID } = %call_id,
            { names::GEN_AI_TOOL_TYPE } = "function",
            { names::TOOLMESH_SESSION_ID } = %request.session_id,
            { names::TOOLMESH_CALL_DEPTH } = request.nesting.as_ref().map_or(0, |n| n.depth),
            { names::TOOLMESH_CALL_PARENT_ID } = request.nesting.as_ref().map(|n| n.parent_call_id.as_str()),
            { names::ENDUSER_ID } = %request.principal.name,
            { names::TOOLMESH_SOURCE_KIND } = Empty,
            { names::TOOLMESH_SOURCE_NAME } = Empty,
            { names::TOOLMESH_CALL_RETRIES } = Empty,
            { names::TOOLMESH_POLICY_DECISION } = Empty,
            { names::TOOLMESH_POLICY_RULE } = Empty,
            { names::ERROR_TYPE } = Empty,
        );
        let started = std::time::Instant::now();
        let _running = Running::enter(&self.in_flight);
        let admission = self.admission.load_full();
        let principal = request.principal.clone();
        let tool = request.name.clone();
        let mut seen = Seen::default();
        let call = Call { door, request, call_id: call_id.clone(), events, cancel };
        let result = self.run(&admission, entry, call, &mut seen).instrument(span.clone()).await;
        let source = seen.source;
        let error_type = match &result {
            Err(error) => {
                span.record("otel.status_code", "ERROR");
                Some(error.kind())
            }
            Ok(output) if output.is_error => Some("tool_error"),
            Ok(_) => None,
        };
        if let Some(kind) = error_type {
            span.record(names::ERROR_TYPE, kind);
        }
        // One reading for the metric and the audit, which then agree on how long it took.
        let ended = std::time::Instant::now();
        let took = ended.duration_since(started);
        crate::metrics::call_ended(took, &tool, source.as_ref(), error_type);
        let policy = admission.policy();
        if let Some(decision) = &seen.decision {
            span.record(names::TOOLMESH_POLICY_DECISION, decision.as_str());
            span.record(names::TOOLMESH_POLICY_RULE, decision.rule());
            crate::metrics::policy_decided(decision.as_str(), "call", 1);
        }
        if policy.audit().is_on() {
            let trace_id = trace_id(&span);
            policy.audit().record(&AuditEvent {
                event: "call",
                principal: &principal.name,
                principal_kind: principal.kind.as_str(),
                issuer: principal.issuer.as_deref(),
                agent: principal.attributes.get(AGENT_ATTRIBUTE).map(String::as_str),
                tool: &tool,
                call_id: &call_id,
                decision: seen.decision.as_ref().map_or("none", Decision::as_str),
                rule: seen.decision.as_ref().map_or("", Decision::rule),
                hidden: None,
                outcome: error_type.unwrap_or("ok"),
                duration: took,
                at: ended,
                trace_id: &trace_id,
                policy: policy.version(),
                note: None,
            });
        }
        result.map(|output| (call_id, output))
    }

    /// One call, in the order of the data-flow picture: the nesting depth, resolve and
    /// admit, the arguments' size, schema validation, the policy's decision, limits, the
    /// deadline, the approval wait, dispatch with retries, and the shape of the result.
    async fn run(
        &self,
        admission: &Admission,
        entry: Option<Arc<ToolEntry>>,
        call: Call,
        seen: &mut Seen,
    ) -> Result<ToolOutput, RouterError> {
        let Call { door, mut request, call_id, events, cancel } = call;
        let depth = steps::check_depth(&request, self.options.max_call_depth)?;
        request.profile = admission.profile_of(&request.principal, &request.profile)?;
        let scope = admission.scope(request.principal.clone());
        let (entry, visible) = info_span!(names::SPAN_RESOLVE).in_scope(|| {
            steps::resolve(
                &self.registry,
                admission,
                &scope,
                entry,
                door,
                &request,
                &mut seen.decision,
            )
        })?;
        seen.source = Some(entry.spec.source.clone());
        let span = Span::current();
        span.record(names::TOOLMESH_SOURCE_KIND, entry.spec.source.kind.as_str());
        span.record(names::TOOLMESH_SOURCE_NAME, entry.spec.source.name.as_str());

        steps::check_size(&scope, &request)?;
        let arguments = steps::validate(&entry, &request)?;
        if let Some(visible) = &visible {
            steps::decide(
                &scope,
                visible,
                &entry,
                &arguments,
                &events,
                &request,
                &mut seen.decision,
            )?;
        }
        let _permit = steps::take_permit(&scope, &entry)?;
        let timeout = steps::timeout(&self.options, &request, &entry);
        let deadline = Instant::now() + timeout;
        if let Some(Decision::Approve { rule, reason }) = &seen.decision {
            approval::approved(&scope, &request, rule, reason, &events, deadline).await?;
        }

        // The call's token: cancelled by the caller, by the deadline, or when this future is
        // dropped (a client that went away), whichever comes first.
        let _cancel_on_drop = cancel.clone().drop_guard();
        let ctx = CallContext {
            call_id: call_id.clone(),
            session_id: Some(request.session_id.clone()).filter(|s| !s.is_empty()),
            profile: Some(request.profile.clone()).filter(|s| !s.is_empty()),
            tool: request.name.clone(),
            cancel: cancel.clone(),
            deadline,
            events,
            attempt: 1,
            principal: request.principal.clone(),
            depth,
        };
        let dispatched =
            dispatch::dispatch(self.options.retry, &entry, ctx, arguments, deadline).await;
        if dispatched.0.is_err() {
            cancel.cancel();
        }
        let output = dispatch::settle(dispatched, &entry, &request, &call_id, timeout, deadline)?;
        steps::shape(output, &scope, &entry, &request.name)
    }
}

/// One call's parts, as the router's entry hands them to [`Router::run`].
struct Call {
    door: Door,
    request: CallRequest,
    call_id: String,
    events: EventSink,
    cancel: CancellationToken,
}

/// What the call path learnt of a call, for its metrics and audit event.
#[derive(Default)]
pub(crate) struct Seen {
    /// Where the tool runs, once resolved.
    source: Option<ToolSource>,
    /// What the tool policy decided.
    decision: Option<Decision>,
}
