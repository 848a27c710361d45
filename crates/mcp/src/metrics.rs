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
                .with_boundaries(names::DURATION_BUCKETS.to_vec())
                .build(),
            client_operations: meter
                .f64_histogram(names::METRIC_MCP_CLIENT_OPERATION_DURATION)
                .with_unit("s")
                .with_description("MCP requests sent to upstream MCP servers")
                .with_boundaries(names::DURATION_BUCKETS.to_vec())
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

/// The servers whose calls in flight are reported, while they live.
static SERVERS: std::sync::Mutex<Vec<std::sync::Weak<crate::shared::ServerShared>>> =
    std::sync::Mutex::new(Vec::new());

/// Reports the calls in flight of `server` (and of every server) at each collection.
pub(crate) fn observe_server(server: &std::sync::Arc<crate::shared::ServerShared>) {
    static GAUGE: OnceLock<()> = OnceLock::new();
    let mut servers = SERVERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    servers.retain(|weak| weak.strong_count() > 0);
    servers.push(std::sync::Arc::downgrade(server));
    drop(servers);
    GAUGE.get_or_init(|| {
        toolmesh_telemetry::observe_gauge(
            names::METRIC_MCP_IN_FLIGHT,
            "calls in flight on an MCP server",
            |observe| {
                let servers = SERVERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                for server in servers.iter().filter_map(std::sync::Weak::upgrade) {
                    let calls = server.inflight_calls().len() as u64;
                    observe(calls, &[KeyValue::new(names::MCP_SERVER, server.config.name.clone())]);
                }
            },
        );
    });
}
