use std::collections::BTreeMap;

use toolmesh_core::{
    BackendError, CallFailure, ECHO_CHARS, ErrorCode, FailureDetail, FieldViolation, Nesting, clip,
};
use toolmesh_policy::LimitError;
use toolmesh_registry::SchemaViolation;

/// Why a call or listing failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RouterError {
    /// No tool of that name (or one the caller may not see).
    #[error("tool {} not found", clip(.0, ECHO_CHARS))]
    NotFound(String),
    /// `arguments_json` is not JSON.
    #[error("arguments_json is not valid JSON: {0}")]
    MalformedArguments(String),
    /// The arguments fail the tool's input schema.
    #[error("invalid arguments for tool {tool}: {}", join(.violations))]
    InvalidArguments {
        /// The tool.
        tool: String,
        /// Each failing path and rule.
        violations: Vec<SchemaViolation>,
    },
    /// A request field other than the arguments is wrong.
    #[error("invalid request: {field}: {reason}")]
    InvalidRequest {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The call ran past its deadline.
    #[error("tool {tool} did not finish within {timeout_ms} ms (call {call_id})")]
    DeadlineExceeded {
        /// The tool.
        tool: String,
        /// The call.
        call_id: String,
        /// The effective timeout.
        timeout_ms: u128,
    },
    /// The caller cancelled.
    #[error("call {call_id} of tool {tool} was cancelled")]
    Cancelled {
        /// The tool.
        tool: String,
        /// The call.
        call_id: String,
    },
    /// The connection to the tool's backend broke during the call: its outcome is unknown.
    #[error("{cause}; {}", lost_outcome(.tool, .call_id, *.attempts, *.repeatable))]
    ConnectionLost {
        /// The tool.
        tool: String,
        /// The call.
        call_id: String,
        /// What broke.
        cause: String,
        /// Attempts made.
        attempts: u32,
        /// Whether the tool may be repeated (read-only or idempotent).
        repeatable: bool,
    },
    /// Refused whole, with its own kind and details: by the admission step, or a search.
    #[error("{}", .0.message)]
    Refused(Box<CallFailure>),
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

fn lost_outcome(tool: &str, call_id: &str, attempts: u32, repeatable: bool) -> String {
    match (repeatable, attempts) {
        (false, _) => format!(
            "the outcome of call {call_id} is unknown: tool {tool} is not known to be read-only \
             or idempotent (by annotations toolmesh trusts), so it was not repeated"
        ),
        (true, 1) => format!(
            "call {call_id} was not repeated (server.retry_attempts is 1, or no time was left \
             before its deadline)"
        ),
        (true, n) => format!("call {call_id} failed in each of its {n} attempts"),
    }
}

fn join(violations: &[SchemaViolation]) -> String {
    violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

impl RouterError {
    /// Returns the error's code.
    pub fn code(&self) -> ErrorCode {
        match self {
            RouterError::NotFound(_) => ErrorCode::NotFound,
            RouterError::MalformedArguments(_)
            | RouterError::InvalidArguments { .. }
            | RouterError::InvalidRequest { .. } => ErrorCode::InvalidArgument,
            RouterError::DeadlineExceeded { .. } => ErrorCode::DeadlineExceeded,
            RouterError::Cancelled { .. } => ErrorCode::Cancelled,
            RouterError::ConnectionLost { .. } => ErrorCode::Unavailable,
            RouterError::Refused(failure) => failure.code,
            RouterError::Backend(error) => error.code(),
        }
    }

    /// Returns a short, stable name of the error, for the `error.type` span attribute.
    pub fn kind(&self) -> &'static str {
        match self {
            RouterError::NotFound(_) => "tool_not_found",
            RouterError::MalformedArguments(_) => "malformed_arguments",
            RouterError::InvalidArguments { .. } => "invalid_arguments",
            RouterError::InvalidRequest { .. } => "invalid_request",
            RouterError::DeadlineExceeded { .. } => "deadline_exceeded",
            RouterError::Cancelled { .. } => "cancelled",
            RouterError::ConnectionLost { .. } => "connection_lost",
            RouterError::Refused(failure) => failure.kind,
            RouterError::Backend(error) => error.kind(),
        }
    }

    /// Returns the failure as the caller sees it, with rich details: a `BadRequest` naming
    /// each failing argument path and rule, or an `ErrorInfo` carrying the call id of a
    /// crashed tool. A failure passed through by a backend (callTool's inner call) is
    /// returned as it is.
    pub fn failure(&self) -> CallFailure {
        let detail = match self {
            RouterError::Backend(BackendError::Failure(failure))
            | RouterError::Refused(failure) => {
                return (**failure).clone();
            }
            RouterError::InvalidArguments { violations, .. } => FailureDetail::BadRequest(
                violations
                    .iter()
                    .map(|v| FieldViolation {
                        field: if v.path.is_empty() { "/".to_owned() } else { v.path.clone() },
                        description: format!("{} ({})", v.message, v.rule),
                    })
                    .collect(),
            ),
            RouterError::MalformedArguments(reason) => {
                FailureDetail::BadRequest(vec![FieldViolation {
                    field: "arguments_json".into(),
                    description: reason.clone(),
                }])
            }
            RouterError::Backend(BackendError::Crashed { tool, call_id, .. }) => {
                FailureDetail::Info {
                    reason: "TOOL_CRASHED",
                    metadata: BTreeMap::from([
                        ("call_id".to_owned(), call_id.clone()),
                        ("tool".to_owned(), tool.clone()),
                    ]),
                }
            }
            RouterError::ConnectionLost { tool, call_id, attempts, .. } => FailureDetail::Info {
                reason: "OUTCOME_UNKNOWN",
                metadata: BTreeMap::from([
                    ("attempts".to_owned(), attempts.to_string()),
                    ("call_id".to_owned(), call_id.clone()),
                    ("tool".to_owned(), tool.clone()),
                ]),
            },
            _ => FailureDetail::None,
        };
        CallFailure { code: self.code(), kind: self.kind(), message: self.to_string(), detail }
    }
}

// The refusals of the call path, each with its code, kind and detail.

/// The refusal of a unary call of a tool that needs approval.
pub(crate) fn approval_required(tool: &str, rule: &str, reason: &str) -> RouterError {
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
pub(crate) fn approval_refusal(kind: &'static str, message: String) -> RouterError {
    RouterError::Refused(Box::new(CallFailure::new(ErrorCode::PermissionDenied, kind, message)))
}

/// The refusal of a call nested deeper than `max`.
pub(crate) fn too_deep(tool: &str, nesting: Option<&Nesting>, max: u32) -> RouterError {
    let depth = nesting.map_or(0, |n| n.depth);
    let parent = nesting.map_or("", |n| n.parent_call_id.as_str());
    RouterError::Refused(Box::new(CallFailure {
        code: ErrorCode::FailedPrecondition,
        kind: "call_depth_exceeded",
        message: format!(
            "the call of {tool} is nested {depth} deep (its parent call is {}), deeper than the \
             {max} this server allows (server.max_call_depth): a tool that calls tools must \
             not recurse without end",
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
pub(crate) fn arguments_too_large(tool: &str, bytes: usize, max: usize) -> RouterError {
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
pub(crate) fn limit_refusal(error: LimitError) -> RouterError {
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

/// The refusal of a call of `tool` that a policy rule does not allow.
pub fn policy_refusal(tool: &str, rule: &str, reason: &str) -> RouterError {
    let metadata = [("tool", tool), ("rule", rule)]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    RouterError::Refused(Box::new(CallFailure {
        code: ErrorCode::PermissionDenied,
        kind: "policy_denied",
        message: format!("policy rule {rule} does not allow this call of {tool}: {reason}"),
        detail: FailureDetail::Info { reason: "POLICY_DENIED", metadata },
    }))
}

/// The refusal `callTool` gives for a tool it cannot find, or one the caller may not see:
/// the same words for both.
pub fn call_tool_not_found(name: &str) -> CallFailure {
    CallFailure::new(
        ErrorCode::NotFound,
        "tool_not_found",
        format!("tool {} not found; call searchTools to find tools", clip(name, ECHO_CHARS)),
    )
}
