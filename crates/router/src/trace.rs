//! The trace a call runs in, for its audit events.

use toolmesh_telemetry::span_ids;
use tracing::Span;

/// The trace id of `span` in lowercase hex; empty when it is not recorded.
pub(crate) fn trace_id(span: &Span) -> String {
    span_ids(span)
        .map(|ids| opentelemetry::trace::TraceId::from_bytes(ids.trace_id).to_string())
        .unwrap_or_default()
}

/// The trace id of the current span, as [`trace_id`].
pub(crate) fn current_trace_id() -> String {
    trace_id(&Span::current())
}
