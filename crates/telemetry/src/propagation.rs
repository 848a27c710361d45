use opentelemetry::propagation::{Extractor, Injector};
use tonic::metadata::{KeyRef, MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Reads W3C trace-context headers (`traceparent`, `tracestate`) from gRPC metadata.
#[derive(Debug)]
pub struct MetadataExtractor<'a>(pub &'a MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|key| match key {
                KeyRef::Ascii(key) => Some(key.as_str()),
                KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// Writes W3C trace-context headers into gRPC metadata.
#[derive(Debug)]
pub struct MetadataInjector<'a>(pub &'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) =
            (MetadataKey::from_bytes(key.as_bytes()), MetadataValue::try_from(value.as_str()))
        {
            self.0.insert(key, value);
        }
    }
}

/// Makes the remote span named by the `traceparent` in `metadata` the parent of `span`.
/// Without a valid `traceparent`, `span` keeps its local parent.
pub fn set_parent_from_metadata(span: &tracing::Span, metadata: &MetadataMap) {
    let context = opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&MetadataExtractor(metadata))
    });
    use opentelemetry::trace::TraceContextExt;
    if context.span().span_context().is_valid() {
        // The only failure is a span that is already closed, which cannot happen here.
        let _ = span.set_parent(context);
    }
}

/// Makes the remote span named by the `traceparent` of `headers` (as [`context_headers`]
/// writes them, for example into a remote worker's call) the parent of `span`.
pub fn set_parent_from_headers(
    span: &tracing::Span,
    headers: &std::collections::HashMap<String, String>,
) {
    let context =
        opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(headers));
    use opentelemetry::trace::TraceContextExt;
    if context.span().span_context().is_valid() {
        let _ = span.set_parent(context);
    }
}

/// Returns the server span of one RPC, `service/method`, a child of the caller's
/// `traceparent` when `metadata` holds one.
pub fn rpc_server_span(
    service: &'static str,
    method: &'static str,
    metadata: &MetadataMap,
) -> tracing::Span {
    use crate::names;
    let span = tracing::info_span!(
        "rpc",
        otel.name = %format!("{service}/{method}"),
        otel.kind = "server",
        { names::RPC_SYSTEM } = "grpc",
        { names::RPC_SERVICE } = service,
        { names::RPC_METHOD } = method,
    );
    set_parent_from_metadata(&span, metadata);
    span
}

/// Writes the trace context of `span` into `metadata`, for an outgoing gRPC request.
pub fn inject_context(span: &tracing::Span, metadata: &mut MetadataMap) {
    let context = span.context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut MetadataInjector(metadata));
    });
}

/// Returns the W3C trace-context headers (`traceparent`, `tracestate`) of `span`, for a
/// request to another process in another protocol (for example an MCP request's `_meta`).
/// Empty when the span is not recorded.
pub fn context_headers(span: &tracing::Span) -> std::collections::HashMap<String, String> {
    let context = span.context();
    let mut headers = std::collections::HashMap::new();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut headers);
    });
    headers
}

/// The ids of a recorded span: its trace id and span id, as they appear on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanIds {
    /// The trace id.
    pub trace_id: [u8; 16],
    /// The span id.
    pub span_id: [u8; 8],
}

/// Returns the ids of `span`, or `None` when it is not recorded (no exporter).
pub fn span_ids(span: &tracing::Span) -> Option<SpanIds> {
    use opentelemetry::trace::TraceContextExt;
    if span.is_disabled() {
        return None;
    }
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then(|| SpanIds {
        trace_id: span_context.trace_id().to_bytes(),
        span_id: span_context.span_id().to_bytes(),
    })
}

/// Links `span` to the span with `ids` (possibly of another trace or process), with
/// `attributes` on the link.
pub fn add_link(span: &tracing::Span, ids: SpanIds, attributes: Vec<opentelemetry::KeyValue>) {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    let linked = SpanContext::new(
        TraceId::from_bytes(ids.trace_id),
        SpanId::from_bytes(ids.span_id),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    if linked.is_valid() {
        span.add_link_with_attributes(linked, attributes);
    }
}
