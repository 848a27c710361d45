//! toolmesh telemetry: the tracing subscriber, OpenTelemetry trace and metric export over
//! OTLP/gRPC, the metrics in Prometheus's format ([`Prometheus`]), W3C trace-context
//! propagation across process boundaries, and the span and attribute
//! names every crate uses ([`names`]).
//!
//! [`init`] installs everything and returns a [`TelemetryGuard`]; dropping the guard
//! flushes and shuts the exporter down, so the last batch of spans is not lost.

mod auth;
mod export;
mod gauges;
mod health;
mod init;
pub mod names;
mod prometheus;
mod propagation;

pub use auth::record_unauthenticated;
pub use export::{ExportHealth, export_health};
pub use gauges::observe_gauge;
pub use health::record_source_up;
pub use init::{TelemetryError, TelemetryGuard, TelemetryOptions, init};
pub use prometheus::Prometheus;
pub use propagation::{
    MetadataExtractor, MetadataInjector, SpanIds, add_link, context_headers, inject_context,
    rpc_server_span, set_parent_from_headers, set_parent_from_metadata, span_ids,
};
