//! The one health metric of every provider.

use std::sync::OnceLock;

use opentelemetry::{KeyValue, metrics::Gauge};

use crate::names;

/// Records `toolmesh.source.up` for part `name` of provider `kind`: 1 while it can take
/// calls, 0 otherwise (and once it is gone).
pub fn record_source_up(kind: &str, name: &str, up: bool) {
    static GAUGE: OnceLock<Gauge<i64>> = OnceLock::new();
    let gauge = GAUGE.get_or_init(|| {
        opentelemetry::global::meter("toolmesh")
            .i64_gauge(names::METRIC_SOURCE_UP)
            .with_description("1 while the source can take calls, 0 otherwise")
            .build()
    });
    gauge.record(
        i64::from(up),
        &[
            KeyValue::new(names::TOOLMESH_SOURCE_KIND, kind.to_owned()),
            KeyValue::new(names::TOOLMESH_SOURCE_NAME, name.to_owned()),
        ],
    );
}
