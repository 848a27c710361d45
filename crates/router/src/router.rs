use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use arc_swap::ArcSwap;

use serde_json::Value;
use tokio::{sync::Notify, time::Instant};
use tokio_util::sync::CancellationToken;
use toolmesh_core::{
    BackendError, CallContext, CallFailure, ContentPart, ErrorCode, EventSink, FailureDetail,
    FieldViolation, Nesting, Principal, RetryPolicy, ToolOutput, ToolSource,
};
use toolmesh_policy::{AGENT_ATTRIBUTE, AuditEvent, Decision, LimitError, ResultLimit, Scope};
use toolmesh_registry::{RegistryHandle, ToolEntry};
use toolmesh_telemetry::{names, span_ids};
use tracing::{Instrument, Span, field::Empty, info_span, warn};

use crate::{
    Admission, CALL_TOOL, Door, RouterError, Searched, call_tool_not_found, is_meta, policy_refusal,
};

/// Timeouts the router applies.
#[derive(Debug, Clone, Copy)]
pub struct RouterOptions {
    /// Timeout of a call when neither the client nor the tool sets one.
    pub default_timeout: Duration,
    /// No call runs longer than this.
    pub max_timeout: Duration,
    /// How calls of read-only and idempotent tools whose connection broke are repeated.
    pub retry: RetryPolicy,
    /// The deepest call nesting accepted.
    pub max_call_depth: u32,
}

impl Default for RouterOptions {
    fn default() -> Self {
        RouterOptions {
            default_timeout: Duration::from_secs(60),
            max_timeout: Duration::from_secs(600),
            retry: RetryPolicy::default(),
            max_call_depth: 3,
        }
    }
}

/// One call as the router receives it.
#[derive(Debug, Clone)]
pub struct CallRequest {
    /// Tool name.
    pub name: String,
    /// Arguments as JSON text; empty means `{}`.
    pub arguments_json: String,
    /// Caller's call id; generated when empty.
    pub call_id: String,
    /// Agent session, if any.
    pub session_id: String,
    /// Routing profile, for the meta-tools; empty: the default profile.
    pub profile: String,
    /// The client's own deadline (from `grpc-timeout`), if any.
    pub client_timeout: Option<Duration>,
    /// Who is calling.
    pub principal: Arc<Principal>,
    /// How deep the call is nested (0: a caller's own call), and the call that made it.
    pub nesting: Option<Nesting>,
}

impl Default for CallRequest {
    fn default() -> Self {
        CallRequest {
            name: String::new(),
            arguments_json: String::new(),
            call_id: String::new(),
            session_id: String::new(),
            profile: String::new(),
            client_timeout: None,
            principal: toolmesh_core::open_principal(),
            nesting: None,
        }
    }
}

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
        let result = self
            .run(&admission, entry, door, request, call_id.clone(), events, cancel, &mut seen)
            .instrument(span.clone())
            .await;
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
        crate::metrics::call_ended(took, source.as_ref(), error_type);
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

    #[allow(clippy::too_many_arguments)] // One call's parts, passed on once.
    async fn run(
        &self,
        admission: &Admission,
        entry: Option<Arc<ToolEntry>>,
        door: Door,
        mut request: CallRequest,
        call_id: String,
        events: EventSink,
        cancel: CancellationToken,
        seen: &mut Seen,
    ) -> Result<ToolOutput, RouterError> {
        let depth = request.nesting.as_ref().map_or(0, |n| n.depth);
        if depth > self.options.max_call_depth {
            return Err(too_deep(&request, self.options.max_call_depth));
        }
        request.profile = admission.profile_of(&request.principal, &request.profile)?;
        let scope = admission.scope(request.principal.clone());
        // Resolved once per call: here, or by callTool, which hands the entry over.
        let (entry, visible) = info_span!(names::SPAN_RESOLVE).in_scope(|| {
            let entry = match entry {
                Some(entry) => entry,
                None => self
                    .registry
                    .resolve(&request.name)
                    .ok_or_else(|| RouterError::NotFound(request.name.clone()))?,
            };
            // A tool the caller may not see is answered as one that does not exist.
            let visible = if is_meta(&entry.spec) {
                None
            } else {
                match scope.visible(&entry.spec) {
                    Ok(visible) => Some(visible),
                    Err(rule) => {
                        seen.decision = Some(Decision::Hidden { rule });
                        return Err(match door {
                            Door::Direct => RouterError::NotFound(request.name.clone()),
                            Door::CallTool(_) => {
                                RouterError::Refused(Box::new(call_tool_not_found(&request.name)))
                            }
                        });
                    }
                }
            };
            admission.admit(&request.profile, door, &entry.spec)?;
            Ok::<_, RouterError>((entry, visible))
        })?;
        seen.source = Some(entry.spec.source.clone());
        let span = Span::current();
        span.record(names::TOOLMESH_SOURCE_KIND, entry.spec.source.kind.as_str());
        span.record(names::TOOLMESH_SOURCE_NAME, entry.spec.source.name.as_str());

        if let Some(max) = scope.max_argument_bytes()
            && request.arguments_json.len() > max
        {
            return Err(arguments_too_large(&request.name, request.arguments_json.len(), max));
        }
        let arguments = info_span!(names::SPAN_VALIDATE).in_scope(|| {
            let arguments: Value = if request.arguments_json.trim().is_empty() {
                Value::Object(Default::default())
            } else {
                serde_json::from_str(&request.arguments_json)
                    .map_err(|error| RouterError::MalformedArguments(error.to_string()))?
            };
            let violations = entry.check_arguments(&arguments);
            if violations.is_empty() {
                Ok(arguments)
            } else {
                Err(RouterError::InvalidArguments { tool: request.name.clone(), violations })
            }
        })?;
        if let Some(visible) = &visible
            && scope.policy().is_active()
        {
            let decision = scope.decide_visible(visible, &entry.spec, &arguments);
            let refusal = match &decision {
                Decision::Refused { rule, reason } => {
                    Some(policy_refusal(&request.name, rule, reason))
                }
                Decision::Approve { rule, reason } if !events.can_approve() => {
                    Some(approval_required(&request.name, rule, reason))
                }
                _ => None,
            };
            seen.decision = Some(decision);
            if let Some(refusal) = refusal {
                return Err(refusal);
            }
        }
        // Rate and concurrency limits; callTool's own call is not counted, the call it
        // makes is.
        let _permit = match entry.spec.name.as_str() {
            CALL_TOOL if is_meta(&entry.spec) => None,
            _ => Some(scope.admit(&entry.spec).map_err(limit_refusal)?),
        };

        // The sooner of the client's deadline and the tool's timeout; the default when
        // neither is set; never beyond the server's cap.
        let timeout = request
            .client_timeout
            .map(before_client_deadline)
            .into_iter()
            .chain(entry.spec.timeout)
            .min()
            .unwrap_or(self.options.default_timeout)
            .min(self.options.max_timeout);
        let deadline = Instant::now() + timeout;
        if let Some(Decision::Approve { rule, reason }) = &seen.decision {
            self.approved(&scope, &request, rule, reason, &events, deadline).await?;
        }

        // The call's token: cancelled by the caller, by the deadline, or when this future is
        // dropped (a client that went away), whichever comes first.
        let token = cancel;
        let _cancel_on_drop = token.clone().drop_guard();
        let ctx = CallContext {
            call_id: call_id.clone(),
            session_id: Some(request.session_id.clone()).filter(|s| !s.is_empty()),
            profile: Some(request.profile.clone()).filter(|s| !s.is_empty()),
            tool: request.name.clone(),
            cancel: token.clone(),
            deadline,
            events,
            attempt: 1,
            principal: request.principal.clone(),
            depth,
        };
        let (outcome, attempts) = self.dispatch(&entry, ctx, arguments, deadline).await;
        let deadline_error = || RouterError::DeadlineExceeded {
            tool: request.name.clone(),
            call_id: call_id.clone(),
            timeout_ms: timeout.as_millis(),
        };
        let output = match outcome {
            Err(_elapsed) => {
                token.cancel();
                return Err(deadline_error());
            }
            Ok(Err(BackendError::Cancelled)) | Ok(Err(BackendError::DeadlineExceeded(_)))
                if Instant::now() >= deadline =>
            {
                return Err(deadline_error());
            }
            Ok(Err(BackendError::Cancelled)) => {
                return Err(RouterError::Cancelled { tool: request.name, call_id });
            }
            Ok(Err(BackendError::Lost { backend, reason })) => {
                return Err(RouterError::ConnectionLost {
                    tool: request.name,
                    call_id,
                    cause: format!(
                        "the connection to {backend} was lost during the call: {reason}"
                    ),
                    attempts,
                    repeatable: entry.spec.annotations.read_only == Some(true)
                        || entry.spec.annotations.idempotent == Some(true),
                });
            }
            Ok(Err(error)) => return Err(error.into()),
            Ok(Ok(output)) => output,
        };

        let output = match scope.result_limit(&entry.spec) {
            Some(limit) => bounded(output, limit, &request.name)?,
            None => output,
        };
        if output.is_error {
            return Ok(output);
        }
        let violations = entry.check_output(output.structured.as_ref());
        if violations.is_empty() {
            Ok(output)
        } else {
            let list = violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
            Ok(ToolOutput {
                content: vec![ContentPart::Text(format!(
                    "the output of tool {} does not match its output schema: {list}",
                    request.name
                ))],
                structured: None,
                is_error: true,
            })
        }
    }
}

impl Router {
    /// Asks the caller to approve the call, and waits for the answer until the approval
    /// timeout or the deadline, whichever is sooner. The answer must name this call's
    /// approval, whose id binds principal, tool, arguments and policy version. Every
    /// outcome is audited.
    async fn approved(
        &self,
        scope: &Scope,
        request: &CallRequest,
        rule: &str,
        reason: &str,
        events: &EventSink,
        deadline: Instant,
    ) -> Result<(), RouterError> {
        let policy = scope.policy();
        let wait =
            policy.approval_timeout().min(deadline.saturating_duration_since(Instant::now()));
        let principal = &request.principal;
        let approval =
            policy.approval(principal, &request.name, &request.arguments_json, rule, reason, wait);
        let issued = approval.id.clone();
        let started = std::time::Instant::now();
        let answer = events.approve(approval, wait).await;
        let (outcome, note, result) = match answer {
            None => (
                "timed_out",
                String::new(),
                Err(approval_refusal(
                    "approval_timed_out",
                    format!(
                        "the call of {} needs a person's approval (policy rule {rule}) and none \
                         came within {} ms: it was not made",
                        request.name,
                        wait.as_millis()
                    ),
                )),
            ),
            Some(answer) => {
                // Signed here for exactly this call, and the id this request was sent: the
                // approval of an identical call made earlier does not approve this one.
                let checked = policy
                    .check_approval(&answer.id, principal, &request.name, &request.arguments_json)
                    .and_then(|()| {
                        if answer.id == issued {
                            Ok(())
                        } else {
                            Err(toolmesh_policy::ApprovalMismatch::OtherRequest)
                        }
                    });
                match (checked, answer.approved) {
                    (Err(mismatch), _) => (
                        "mismatch",
                        answer.note,
                        Err(approval_refusal(
                            "approval_mismatch",
                            format!(
                                "the answer does not approve this call of {}: {mismatch}",
                                request.name
                            ),
                        )),
                    ),
                    (Ok(()), false) => {
                        let said = if answer.note.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", answer.note)
                        };
                        let message =
                            format!("the call of {} was not approved{said}", request.name);
                        ("denied", answer.note, Err(approval_refusal("approval_denied", message)))
                    }
                    (Ok(()), true) => ("approved", answer.note, Ok(())),
                }
            }
        };
        crate::metrics::policy_decided(
            if result.is_ok() { "approved" } else { "not_approved" },
            "approval",
            1,
        );
        if policy.audit().is_on() {
            let ended = std::time::Instant::now();
            policy.audit().record(&AuditEvent {
                event: "approval",
                principal: &principal.name,
                principal_kind: principal.kind.as_str(),
                issuer: principal.issuer.as_deref(),
                agent: principal.attributes.get(AGENT_ATTRIBUTE).map(String::as_str),
                tool: &request.name,
                call_id: &request.call_id,
                decision: outcome,
                rule,
                hidden: None,
                outcome: if result.is_ok() { "ok" } else { "refused" },
                duration: ended.duration_since(started),
                at: ended,
                trace_id: &current_trace_id(),
                policy: policy.version(),
                note: Some(&note).filter(|n| !n.is_empty()).map(String::as_str),
            });
        }
        result
    }

    /// Hands the call to its backend, within the deadline; a call whose connection broke
    /// is repeated while the tool is read-only or idempotent, the policy allows another
    /// attempt, and its wait ends before the deadline. The repetitions are recorded on the
    /// call's span (`toolmesh.call.retries`) and counted. Returns the outcome of the last
    /// attempt and the number of attempts.
    async fn dispatch(
        &self,
        entry: &ToolEntry,
        ctx: CallContext,
        arguments: Value,
        deadline: Instant,
    ) -> (Result<Result<ToolOutput, BackendError>, tokio::time::error::Elapsed>, u32) {
        let policy = self.options.retry;
        let annotations = &entry.spec.annotations;
        let repeatable = policy.attempts.get() > 1
            && (annotations.read_only == Some(true) || annotations.idempotent == Some(true));
        // Arguments are kept for another attempt only where there can be one.
        let mut kept = repeatable.then(|| arguments.clone());
        let mut this = arguments;
        let mut attempt = 1;
        let call = Span::current();
        loop {
            let span = info_span!(names::SPAN_DISPATCH, { names::TOOLMESH_CALL_ATTEMPT } = attempt);
            let dispatch =
                entry.backend.call(CallContext { attempt, ..ctx.clone() }, this).instrument(span);
            let outcome = tokio::time::timeout_at(deadline, dispatch).await;
            let Ok(Err(error)) = &outcome else { return (outcome, attempt) };
            if !error.retryable(annotations) || attempt >= policy.attempts.get() {
                return (outcome, attempt);
            }
            let wait = policy.wait(attempt + 1);
            if Instant::now() + wait >= deadline {
                return (outcome, attempt);
            }
            // The last attempt takes the kept arguments themselves.
            let next = if attempt + 1 < policy.attempts.get() { kept.clone() } else { kept.take() };
            let Some(next) = next else { return (outcome, attempt) };
            warn!(
                tool = %ctx.tool, call_id = %ctx.call_id, attempt, %error,
                wait_ms = wait.as_millis() as u64,
                "the call's connection broke; repeating it (the tool is read-only or idempotent)"
            );
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = ctx.cancel.cancelled() => return (Ok(Err(BackendError::Cancelled)), attempt),
            }
            crate::metrics::call_retried(&entry.spec.source, &ctx.tool);
            call.record(names::TOOLMESH_CALL_RETRIES, attempt);
            this = next;
            attempt += 1;
        }
    }
}

/// The refusal of a unary call of a tool that needs approval.
fn approval_required(tool: &str, rule: &str, reason: &str) -> RouterError {
    RouterError::Refused(Box::new(CallFailure {
        code: ErrorCode::FailedPrecondition,
        kind: "approval_required",
        message: format!(
            "the call of {tool} needs a person's approval (policy rule {rule}: {reason}); call it \
             with StreamCallTool, which asks the caller for it"
        ),
        detail: FailureDetail::Info {
            reason: "APPROVAL_REQUIRED",
            metadata: [("tool".to_owned(), tool.to_owned()), ("rule".to_owned(), rule.to_owned())]
                .into(),
        },
    }))
}

/// The refusal of a call that was not approved.
fn approval_refusal(kind: &'static str, message: String) -> RouterError {
    RouterError::Refused(Box::new(CallFailure::new(ErrorCode::PermissionDenied, kind, message)))
}

/// The refusal of a call nested deeper than `max`.
fn too_deep(request: &CallRequest, max: u32) -> RouterError {
    let nesting = request.nesting.as_ref();
    let depth = nesting.map_or(0, |n| n.depth);
    let parent = nesting.map_or("", |n| n.parent_call_id.as_str());
    RouterError::Refused(Box::new(CallFailure {
        code: ErrorCode::FailedPrecondition,
        kind: "call_depth_exceeded",
        message: format!(
            "the call of {} is nested {depth} deep (its parent call is {}), deeper than the \
             {max} this server allows (server.max_call_depth): a tool that calls tools must \
             not recurse without end",
            request.name,
            if parent.is_empty() { "not named" } else { parent },
        ),
        detail: FailureDetail::Info {
            reason: "CALL_DEPTH_EXCEEDED",
            metadata: [
                ("depth".to_owned(), depth.to_string()),
                ("max_call_depth".to_owned(), max.to_string()),
                ("parent_call_id".to_owned(), parent.to_owned()),
            ]
            .into(),
        },
    }))
}

/// The refusal of arguments larger than the limit.
fn arguments_too_large(tool: &str, bytes: usize, max: usize) -> RouterError {
    RouterError::Refused(Box::new(CallFailure {
        code: ErrorCode::InvalidArgument,
        kind: "arguments_too_large",
        message: format!(
            "the arguments of {tool} are {bytes} bytes, more than the {max} a call may carry \
             (policy.limits.max_argument_bytes)"
        ),
        detail: FailureDetail::BadRequest(vec![FieldViolation {
            field: "arguments_json".into(),
            description: format!("{bytes} bytes, more than {max}"),
        }]),
    }))
}

/// The refusal of a call over a rate or concurrency limit: `RESOURCE_EXHAUSTED`, with a
/// `RetryInfo` when waiting helps.
fn limit_refusal(error: LimitError) -> RouterError {
    let (kind, detail) = match &error {
        LimitError::Rate { subject, retry_after, .. } => (
            "rate_limited",
            FailureDetail::RetryAfter {
                delay: *retry_after,
                reason: "RATE_LIMITED",
                metadata: [("subject".to_owned(), subject.clone())].into(),
            },
        ),
        LimitError::Concurrency { principal, max } => (
            "concurrency_limited",
            FailureDetail::Info {
                reason: "CONCURRENCY_LIMITED",
                metadata: [
                    ("principal".to_owned(), principal.clone()),
                    ("max_concurrent".to_owned(), max.to_string()),
                ]
                .into(),
            },
        ),
    };
    RouterError::Refused(Box::new(CallFailure {
        code: ErrorCode::ResourceExhausted,
        kind,
        message: error.to_string(),
        detail,
    }))
}

/// Holds `output` to `limit`: a larger result is refused, or cut to the limit and marked so
/// when the tool's limit says to cut.
fn bounded(output: ToolOutput, limit: ResultLimit, tool: &str) -> Result<ToolOutput, RouterError> {
    let part_bytes = |part: &ContentPart| match part {
        ContentPart::Text(text) => text.len(),
        ContentPart::Json(value) => value.to_string().len(),
        ContentPart::Media { data, .. } => data.len(),
        ContentPart::ResourceLink { uri, name, description, mime_type } => {
            uri.len() + name.len() + description.len() + mime_type.len()
        }
    };
    let structured = output.structured.as_ref().map_or(0, |v| v.to_string().len());
    let total = output.content.iter().map(part_bytes).sum::<usize>() + structured;
    if total <= limit.max_bytes {
        return Ok(output);
    }
    if !limit.truncate {
        return Err(RouterError::Refused(Box::new(CallFailure::new(
            ErrorCode::ResourceExhausted,
            "result_too_large",
            format!(
                "the result of {tool} is {total} bytes, more than the {} a call may return \
                 (policy.limits); the tool ran",
                limit.max_bytes
            ),
        ))));
    }
    // Parts are kept in order while they fit; the first that does not is cut (text) or
    // left out, and so is everything after it.
    let mut left = limit.max_bytes;
    let mut content = Vec::new();
    for part in output.content {
        let text = match part {
            ContentPart::Text(text) => text,
            ContentPart::Json(value) => value.to_string(),
            other => {
                let bytes = part_bytes(&other);
                if bytes > left {
                    break;
                }
                left -= bytes;
                content.push(other);
                continue;
            }
        };
        if text.len() <= left {
            left -= text.len();
            content.push(ContentPart::Text(text));
            continue;
        }
        let mut end = left;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        content.push(ContentPart::Text(text[..end].to_owned()));
        break;
    }
    content.push(ContentPart::Text(format!(
        "\n[truncated by toolmesh: the result was {total} bytes, of which {} are kept]",
        limit.max_bytes
    )));
    // A structured result cannot be cut and stay valid: it is kept only whole.
    let structured = output.structured.filter(|_| structured <= left);
    Ok(ToolOutput { content, structured, is_error: output.is_error })
}

/// What the call path learnt of a call, for its metrics and audit event.
#[derive(Default)]
struct Seen {
    /// Where the tool runs, once resolved.
    source: Option<ToolSource>,
    /// What the tool policy decided.
    decision: Option<Decision>,
}

/// The trace id of `span` in lowercase hex; empty when it is not recorded.
fn trace_id(span: &Span) -> String {
    span_ids(span)
        .map(|ids| opentelemetry::trace::TraceId::from_bytes(ids.trace_id).to_string())
        .unwrap_or_default()
}

/// The trace id of the current span, as [`trace_id`].
pub(crate) fn current_trace_id() -> String {
    trace_id(&Span::current())
}

/// The share of a client's deadline that the router keeps back. tonic's server enforces
/// `grpc-timeout` itself and answers CANCELLED when it passes; finishing a little earlier
/// lets the client see DEADLINE_EXCEEDED, with the tool named, as the gRPC spec intends.
fn before_client_deadline(timeout: Duration) -> Duration {
    let margin = (timeout / 20).clamp(Duration::from_millis(5), Duration::from_millis(100));
    timeout.saturating_sub(margin)
}
