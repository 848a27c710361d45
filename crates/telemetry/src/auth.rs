//! Authentication outcomes as metrics.

use std::sync::OnceLock;

use opentelemetry::{KeyValue, metrics::Counter};

use crate::names;

/// Counts a request refused as unauthenticated (`toolmesh.auth.refusals`), by `reason`
/// (`missing`, `expired`, `signature`, ...).
pub fn record_unauthenticated(reason: &'static str) {
    static COUNTER: OnceLock<Counter<u64>> = OnceLock::new();
    COUNTER
        .get_or_init(|| {
            opentelemetry::global::meter("toolmesh")
                .u64_counter(names::METRIC_AUTH_REFUSALS)
                .with_description("Requests refused as unauthenticated, by reason")
                .build()
        })
        .add(1, &[KeyValue::new(names::TOOLMESH_AUTH_REASON, reason)]);
}
