use std::collections::BTreeMap;

use toolmesh_core::{
    BackendError, CallFailure, ECHO_CHARS, ErrorCode, FailureDetail, FieldViolation, clip,
};
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
            "the outcome of call {call_id} is unknown: tool {tool} is not annotated read-only \
             or idempotent, so it was not repeated"
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

    /// Returns the gRPC status for this error ([`RouterError::failure`], mapped once).
    pub fn to_status(&self) -> tonic::Status {
        toolmesh_proto::status(&self.failure())
    }
}
