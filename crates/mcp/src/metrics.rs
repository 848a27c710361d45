//! The MCP backend's metrics, exported over OTLP when telemetry is configured.

use std::sync::OnceLock;

use opentelemetry::{
    KeyValue,
    metrics::{Counter, Gauge},
};
use toolmesh_telemetry::names;

struct Instruments {
    up: Gauge<i64>,
    failures: Counter<u64>,
}

fn instruments() -> &'static Instruments {
    static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();
    INSTRUMENTS.get_or_init(|| {
        let meter = opentelemetry::global::meter("toolmesh");
        Instruments {
            up: meter
                .i64_gauge(names::METRIC_MCP_SERVER_UP)
                .with_description("1 while the MCP server can take calls, 0 otherwise")
                .build(),
            failures: meter
                .u64_counter(names::METRIC_MCP_CONNECTION_FAILURES)
                .with_description("failed connection attempts and lost connections")
                .build(),
        }
    })
}

/// Records whether `server` can take calls.
pub(crate) fn server_up(server: &str, up: bool) {
    instruments().up.record(i64::from(up), &[KeyValue::new(names::MCP_SERVER, server.to_owned())]);
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
