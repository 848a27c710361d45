//! The router's metrics, exported over OTLP when telemetry is configured.

use std::{sync::OnceLock, time::Duration};

use opentelemetry::{
    KeyValue,
    metrics::{Counter, Histogram},
};
use toolmesh_core::ToolSource;
use toolmesh_telemetry::names;

fn duration() -> &'static Histogram<f64> {
    static DURATION: OnceLock<Histogram<f64>> = OnceLock::new();
    DURATION.get_or_init(|| {
        opentelemetry::global::meter("toolmesh")
            .f64_histogram(names::METRIC_CALL_DURATION)
            .with_unit("s")
            .with_description("how long calls took, by tool, source and outcome")
            .with_boundaries(names::DURATION_BUCKETS.to_vec())
            .build()
    })
}

/// Records one call: how long it took, the tool and where it ran (when it was found) and
/// how it ended.
pub(crate) fn call_ended(
    took: Duration,
    tool: &str,
    source: Option<&ToolSource>,
    error_type: Option<&'static str>,
) {
    let mut attributes = Vec::with_capacity(5);
    let outcome = match error_type {
        None => "ok",
        Some("tool_error") => "tool_error",
        Some(_) => "error",
    };
    attributes.push(KeyValue::new(names::TOOLMESH_CALL_OUTCOME, outcome));
    if let Some(source) = source {
        attributes.push(KeyValue::new(names::TOOLMESH_SOURCE_KIND, source.kind.as_str()));
        attributes.push(KeyValue::new(names::TOOLMESH_SOURCE_NAME, source.name.clone()));
        attributes.push(KeyValue::new(names::GEN_AI_TOOL_NAME, tool.to_owned()));
    }
    if let Some(kind) = error_type {
        attributes.push(KeyValue::new(names::ERROR_TYPE, kind));
    }
    duration().record(took.as_secs_f64(), &attributes);
}

fn retries() -> &'static Counter<u64> {
    static RETRIES: OnceLock<Counter<u64>> = OnceLock::new();
    RETRIES.get_or_init(|| {
        opentelemetry::global::meter("toolmesh")
            .u64_counter(names::METRIC_CALL_RETRIES)
            .with_description("calls repeated after their connection broke, by source and tool")
            .build()
    })
}

/// Records that a call of `tool` from `source` was repeated once more.
pub(crate) fn call_retried(source: &ToolSource, tool: &str) {
    retries().add(
        1,
        &[
            KeyValue::new(names::TOOLMESH_SOURCE_KIND, source.kind.as_str()),
            KeyValue::new(names::TOOLMESH_SOURCE_NAME, source.name.clone()),
            KeyValue::new(names::GEN_AI_TOOL_NAME, tool.to_owned()),
        ],
    );
}

fn decisions() -> &'static Counter<u64> {
    static DECISIONS: OnceLock<Counter<u64>> = OnceLock::new();
    DECISIONS.get_or_init(|| {
        opentelemetry::global::meter("toolmesh")
            .u64_counter(names::METRIC_POLICY_DECISIONS)
            .with_description("tool policy decisions, by decision and stage")
            .build()
    })
}

/// Records `count` decisions of the tool policy.
pub(crate) fn policy_decided(decision: &'static str, stage: &'static str, count: u64) {
    decisions().add(
        count,
        &[
            KeyValue::new(names::TOOLMESH_POLICY_DECISION, decision),
            KeyValue::new(names::TOOLMESH_POLICY_STAGE, stage),
        ],
    );
}
