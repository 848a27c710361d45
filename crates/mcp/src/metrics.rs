//! The MCP backend's metrics, exported over OTLP when telemetry is configured.

use std::sync::OnceLock;

use opentelemetry::{KeyValue, metrics::Counter};
use toolmesh_telemetry::names;

struct Instruments {
    failures: Counter<u64>,
}

fn instruments() -> &'static Instruments {
    static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();
    INSTRUMENTS.get_or_init(|| {
        let meter = opentelemetry::global::meter("toolmesh");
        Instruments {
            failures: meter
                .u64_counter(names::METRIC_MCP_CONNECTION_FAILURES)
                .with_description("failed connection attempts and lost connections")
                .build(),
        }
    })
}

/// Counts a failed connection attempt (`connect`) or a lost connection (`disconnect`).
pub(crate) fn connection_failed(server: &str, kind: &'static str) {
    instruments().failures.add(
        1,
        &[
            KeyValue::new(names::MCP_SERVER, server.to_owned()),
            KeyValue::new(names::ERROR_TYPE, kind),
        ],
    );
}
