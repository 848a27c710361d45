use std::time::Duration;

/// The kinds of failure toolmesh reports, each mapped to one gRPC status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The caller's input is wrong.
    InvalidArgument,
    /// No such tool, or one the caller may not see.
    NotFound,
    /// The call is not allowed in the current state.
    FailedPrecondition,
    /// The caller sees the tool but policy refuses this call (its arguments, its context).
    PermissionDenied,
    /// The call ran out of time.
    DeadlineExceeded,
    /// Limits are reached; retrying later may succeed.
    ResourceExhausted,
    /// The caller cancelled the call.
    Cancelled,
    /// The backend of the tool cannot be reached.
    Unavailable,
    /// toolmesh or the tool broke.
    Internal,
}

/// A call's failure as its caller sees it: the code, a stable kind (the `error.type` span
/// attribute), the message and rich details. Errors of every crate describe themselves this
/// way for the one status map of the proto crate, and a backend that makes a call on its
/// caller's behalf (`callTool`) passes the failure of that call up whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallFailure {
    /// The kind of failure.
    pub code: ErrorCode,
    /// A short, stable name of the error, for example `invalid_arguments`.
    pub kind: &'static str,
    /// What went wrong, for the caller.
    pub message: String,
    /// Machine-readable details.
    pub detail: FailureDetail,
}

/// Machine-readable details of a [`CallFailure`] (gRPC carries them as `google.rpc`
/// details).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum FailureDetail {
    /// None.
    #[default]
    None,
    /// Which request fields (or argument paths) are wrong and why (`google.rpc.BadRequest`).
    BadRequest(Vec<FieldViolation>),
    /// Why the call failed, with context (`google.rpc.ErrorInfo`).
    Info {
        /// A stable reason, for example `TOOL_CRASHED`.
        reason: &'static str,
        /// Context, for example the call id.
        metadata: std::collections::BTreeMap<String, String>,
    },
    /// A quota is spent: when a retry may succeed (`google.rpc.RetryInfo`), and why
    /// (`google.rpc.ErrorInfo`).
    RetryAfter {
        /// How long to wait before retrying.
        delay: std::time::Duration,
        /// A stable reason, for example `RATE_LIMITED`.
        reason: &'static str,
        /// Context, for example the limit's subject.
        metadata: std::collections::BTreeMap<String, String>,
    },
}

/// One wrong request field or argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// The field, or a JSON Pointer into the arguments (`/a`).
    pub field: String,
    /// What is wrong with it.
    pub description: String,
}

impl CallFailure {
    /// Returns a failure without details.
    pub fn new(code: ErrorCode, kind: &'static str, message: impl Into<String>) -> Self {
        CallFailure { code, kind, message: message.into(), detail: FailureDetail::None }
    }
}

/// Why a backend could not produce a result. A tool's own failure is not a
/// `BackendError` but a [`ToolOutput`](crate::ToolOutput) with `is_error` set.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    /// The tool's concurrency limit and queue are full.
    #[error("tool {tool} is overloaded: {reason}")]
    Overloaded {
        /// The tool.
        tool: String,
        /// Which limit was hit.
        reason: String,
    },
    /// The backend is down or unreachable.
    #[error("backend {backend} is unavailable: {reason}")]
    Unavailable {
        /// The backend (server, pool, worker).
        backend: String,
        /// What failed.
        reason: String,
    },
    /// The connection to the backend broke while the call was running: whether the tool
    /// ran, and what it did, is unknown. The router repeats the call (on another worker, or
    /// once the connection is back) only for a tool annotated read-only or idempotent.
    #[error("the connection to {backend} was lost during the call: {reason}")]
    Lost {
        /// The backend (worker, server).
        backend: String,
        /// What broke.
        reason: String,
    },
    /// The call was cancelled before it finished.
    #[error("call cancelled")]
    Cancelled,
    /// The call's deadline passed before it finished.
    #[error("call exceeded its deadline of {0:?}")]
    DeadlineExceeded(Duration),
    /// The tool crashed (for a local tool: it panicked and its worker was restarted).
    #[error("tool {tool} crashed during call {call_id}: {reason}")]
    Crashed {
        /// The tool.
        tool: String,
        /// The call during which it crashed.
        call_id: String,
        /// The panic message or exit reason.
        reason: String,
    },
    /// The backend rejected the arguments after schema validation passed.
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// The remote side rejected the call with an error of a known kind (for example a
    /// JSON-RPC error from an MCP server).
    #[error("{message}")]
    Remote {
        /// The kind of error.
        code: ErrorCode,
        /// What the remote side said.
        message: String,
    },
    /// Anything else that went wrong inside the backend.
    #[error("backend failure: {0}")]
    Internal(String),
    /// The call failed as described, passed through whole: the refusals of the meta-tools,
    /// and the failure of the tool `callTool` called, so that its status, details and
    /// error type are those a direct call gets.
    #[error("{}", .0.message)]
    Failure(Box<CallFailure>),
}

impl BackendError {
    /// Returns the error's code.
    pub fn code(&self) -> ErrorCode {
        match self {
            BackendError::Overloaded { .. } => ErrorCode::ResourceExhausted,
            BackendError::Unavailable { .. } | BackendError::Lost { .. } => ErrorCode::Unavailable,
            BackendError::Cancelled => ErrorCode::Cancelled,
            BackendError::DeadlineExceeded(_) => ErrorCode::DeadlineExceeded,
            BackendError::Crashed { .. } => ErrorCode::Internal,
            BackendError::InvalidArguments(_) => ErrorCode::InvalidArgument,
            BackendError::Remote { code, .. } => *code,
            BackendError::Internal(_) => ErrorCode::Internal,
            BackendError::Failure(failure) => failure.code,
        }
    }

    /// Whether the call may be repeated: the connection broke and the tool's hints (its
    /// trusted annotations, [`ToolSpec::hints`](crate::ToolSpec::hints)) say that running it
    /// again is harmless.
    pub fn retryable(&self, hints: &crate::ToolAnnotations) -> bool {
        matches!(self, BackendError::Lost { .. }) && hints.repeatable()
    }

    /// Returns a short, stable name of the error kind, for the `error.type` span attribute.
    pub fn kind(&self) -> &'static str {
        match self {
            BackendError::Overloaded { .. } => "overloaded",
            BackendError::Unavailable { .. } => "unavailable",
            BackendError::Lost { .. } => "connection_lost",
            BackendError::Cancelled => "cancelled",
            BackendError::DeadlineExceeded(_) => "deadline_exceeded",
            BackendError::Crashed { .. } => "crashed",
            BackendError::InvalidArguments(_) => "invalid_arguments",
            BackendError::Remote { .. } => "remote_error",
            BackendError::Internal(_) => "internal",
            BackendError::Failure(failure) => failure.kind,
        }
    }
}

/// Characters of a caller's input (a tool or profile name) that an error message repeats.
pub const ECHO_CHARS: usize = 128;

/// Returns `text` when it has at most `max` characters, and otherwise its first `max`
/// characters followed by `…` and its length in bytes: error messages that repeat what a
/// caller sent stay short however large the input was (gRPC carries them in a header).
pub fn clip(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(max) {
        None => std::borrow::Cow::Borrowed(text),
        Some((at, _)) => {
            std::borrow::Cow::Owned(format!("{}… ({} bytes)", &text[..at], text.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_keeps_short_text_and_cuts_long_text_at_a_character() {
        assert_eq!(clip("echo", 8), "echo");
        assert_eq!(clip("ééééé", 5), "ééééé");
        assert_eq!(clip("ééééé", 2), "éé… (10 bytes)");
        let huge = "x".repeat(3 << 20);
        assert!(clip(&huge, ECHO_CHARS).len() < 160);
    }
}
