//! The MCP backend's metrics, exported over OTLP when telemetry is configured.

use std::sync::OnceLock;

use opentelemetry::{
    KeyValue,
    metrics::{Counter, Histogram},
};
use toolmesh_telemetry::names;

struct Instruments {
    failures: Counter<u64>,
    definition_changes: Counter<u64>,
    server_operations: Histogram<f64>,
    client_operations: Histogram<f64>,
}

/// Bucket bounds of the operation durations, in seconds: from a tenth of a millisecond (a
/// proxied call to a fast server) to five minutes.
const OPERATION_BUCKETS: [f64; 20] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
    10.0, 30.0, 60.0, 120.0, 300.0,
];

fn instruments() -> &'static Instruments {
    static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();
    INSTRUMENTS.get_or_init(|| {
        let meter = opentelemetry::global::meter("toolmesh");
        Instruments {
            failures: meter
                .u64_counter(names::METRIC_MCP_CONNECTION_FAILURES)
                .with_description("failed connection attempts and lost connections")
                .build(),
            definition_changes: meter
                .u64_counter(names::METRIC_MCP_DEFINITION_CHANGES)
                .with_description("tools whose definition changed since it was pinned")
                .build(),
            server_operations: meter
                .f64_histogram(names::METRIC_MCP_SERVER_OPERATION_DURATION)
                .with_unit("s")
                .with_description("MCP requests the MCP endpoint served")
                .with_boundaries(OPERATION_BUCKETS.to_vec())
                .build(),
            client_operations: meter
                .f64_histogram(names::METRIC_MCP_CLIENT_OPERATION_DURATION)
                .with_unit("s")
                .with_description("MCP requests sent to upstream MCP servers")
                .with_boundaries(OPERATION_BUCKETS.to_vec())
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

/// Counts a tool whose definition changed since it was pinned, by what toolmesh did
/// (`warn`, `block`, `accepted`).
pub(crate) fn definition_changed(server: &str, action: &'static str) {
    instruments().definition_changes.add(
        1,
        &[KeyValue::new(names::MCP_SERVER, server.to_owned()), KeyValue::new("action", action)],
    );
}

/// One MCP request, as the OpenTelemetry MCP conventions describe it.
pub(crate) struct Operation<'a> {
    pub(crate) method: &'static str,
    pub(crate) tool: Option<&'a str>,
    pub(crate) protocol_version: &'a str,
    /// `error.type` of a failed request (a tool's own error result is `tool_error`).
    pub(crate) error: Option<&'a str>,
}

impl Operation<'_> {
    fn attributes(&self) -> Vec<KeyValue> {
        let mut attributes = vec![KeyValue::new("mcp.method.name", self.method)];
        if !self.protocol_version.is_empty() {
            attributes
                .push(KeyValue::new("mcp.protocol.version", self.protocol_version.to_owned()));
        }
        if let Some(tool) = self.tool {
            attributes.push(KeyValue::new("gen_ai.tool.name", tool.to_owned()));
        }
        if let Some(error) = self.error {
            attributes.push(KeyValue::new(names::ERROR_TYPE, error.to_owned()));
        }
        attributes
    }

    /// Records a request the MCP endpoint served, which took `seconds`.
    pub(crate) fn served(&self, seconds: f64) {
        instruments().server_operations.record(seconds, &self.attributes());
    }

    /// Records a request sent to the upstream `server` over `transport`, which took
    /// `seconds`.
    pub(crate) fn sent(&self, server: &str, transport: &'static str, seconds: f64) {
        let mut attributes = self.attributes();
        attributes.push(KeyValue::new(names::MCP_SERVER, server.to_owned()));
        attributes.push(KeyValue::new("network.transport", transport));
        instruments().client_operations.record(seconds, &attributes);
    }
}
