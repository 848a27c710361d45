//! The metrics in Prometheus's text format, read from the meter provider when scraped.
//!
//! The same instruments feed the OTLP export and this reader: a scrape collects every
//! instrument's cumulative state and writes it as Prometheus expects it. Names follow
//! OpenTelemetry's mapping: dots become underscores, the unit `s` adds `_seconds`, a
//! monotonic sum is a counter named `_total`, and attribute keys become labels the same way.

use std::{
    fmt::Write as _,
    sync::{Arc, Weak},
    time::Duration,
};

use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::{
    error::OTelSdkResult,
    metrics::{
        InstrumentKind, ManualReader, Pipeline, Temporality,
        data::{AggregatedMetrics, Metric, MetricData, ResourceMetrics},
        reader::MetricReader,
    },
};

/// The reader a scrape collects through; cheap to clone.
#[derive(Debug, Clone)]
pub struct Prometheus {
    reader: Arc<ManualReader>,
}

impl Prometheus {
    pub(crate) fn new() -> (Prometheus, SharedReader) {
        let reader = Arc::new(ManualReader::builder().build());
        (Prometheus { reader: reader.clone() }, SharedReader(reader))
    }

    /// Returns every metric in Prometheus's text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut collected = ResourceMetrics::default();
        let mut out = String::new();
        if let Err(error) = self.reader.collect(&mut collected) {
            let _ = writeln!(out, "# toolmesh could not collect its metrics: {error}");
            return out;
        }
        for scope in collected.scope_metrics() {
            for metric in scope.metrics() {
                write_metric(&mut out, metric);
            }
        }
        out
    }
}

/// The provider's handle on the reader [`Prometheus`] collects through.
#[derive(Debug)]
pub(crate) struct SharedReader(Arc<ManualReader>);

impl MetricReader for SharedReader {
    fn register_pipeline(&self, pipeline: Weak<Pipeline>) {
        self.0.register_pipeline(pipeline);
    }

    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}

/// `name` as a Prometheus metric or label name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn sanitize(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == ':' { c } else { '_' })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

fn base_name(metric: &Metric) -> String {
    let name = sanitize(metric.name());
    match metric.unit() {
        "s" => format!("{name}_seconds"),
        "By" => format!("{name}_bytes"),
        _ => name,
    }
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn labels<'a>(
    attributes: impl Iterator<Item = &'a KeyValue>,
    extra: Option<(&str, &str)>,
) -> String {
    let mut pairs: Vec<(String, String)> = attributes
        .map(|kv| {
            let value = match &kv.value {
                Value::String(s) => s.as_str().to_owned(),
                other => other.to_string(),
            };
            (sanitize(kv.key.as_str()), value)
        })
        .collect();
    pairs.sort();
    if let Some((key, value)) = extra {
        pairs.push((key.to_owned(), value.to_owned()));
    }
    if pairs.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
    format!("{{{}}}", inner.join(","))
}

fn header(out: &mut String, name: &str, description: &str, kind: &str) {
    if !description.is_empty() {
        let _ = writeln!(out, "# HELP {name} {}", description.replace('\n', " "));
    }
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A float as Prometheus writes it.
fn number(value: f64) -> String {
    if value.is_infinite() {
        if value > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else {
        value.to_string()
    }
}

trait AsF64: Copy {
    fn as_f64(self) -> f64;
}

impl AsF64 for f64 {
    fn as_f64(self) -> f64 {
        self
    }
}

impl AsF64 for i64 {
    fn as_f64(self) -> f64 {
        self as f64
    }
}

impl AsF64 for u64 {
    fn as_f64(self) -> f64 {
        self as f64
    }
}

fn write_metric(out: &mut String, metric: &Metric) {
    match metric.data() {
        AggregatedMetrics::F64(data) => write_data(out, metric, data),
        AggregatedMetrics::I64(data) => write_data(out, metric, data),
        AggregatedMetrics::U64(data) => write_data(out, metric, data),
    }
}

fn write_data<T: AsF64>(out: &mut String, metric: &Metric, data: &MetricData<T>) {
    let name = base_name(metric);
    match data {
        MetricData::Gauge(gauge) => {
            header(out, &name, metric.description(), "gauge");
            for point in gauge.data_points() {
                let _ = writeln!(
                    out,
                    "{name}{} {}",
                    labels(point.attributes(), None),
                    number(point.value().as_f64())
                );
            }
        }
        MetricData::Sum(sum) => {
            let (name, kind) = if sum.is_monotonic() {
                (format!("{name}_total"), "counter")
            } else {
                (name, "gauge")
            };
            header(out, &name, metric.description(), kind);
            for point in sum.data_points() {
                let _ = writeln!(
                    out,
                    "{name}{} {}",
                    labels(point.attributes(), None),
                    number(point.value().as_f64())
                );
            }
        }
        MetricData::Histogram(histogram) => {
            header(out, &name, metric.description(), "histogram");
            for point in histogram.data_points() {
                let mut cumulative = 0;
                let bounds: Vec<f64> = point.bounds().collect();
                for (i, count) in point.bucket_counts().enumerate() {
                    cumulative += count;
                    let le = bounds.get(i).copied().map_or_else(|| "+Inf".to_owned(), number);
                    let _ = writeln!(
                        out,
                        "{name}_bucket{} {cumulative}",
                        labels(point.attributes(), Some(("le", &le)))
                    );
                }
                let plain = labels(point.attributes(), None);
                let _ = writeln!(out, "{name}_sum{plain} {}", number(point.sum().as_f64()));
                let _ = writeln!(out, "{name}_count{plain} {}", point.count());
            }
        }
        // Exponential histograms are not used by toolmesh's instruments.
        MetricData::ExponentialHistogram(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::{KeyValue, metrics::MeterProvider as _};
    use opentelemetry_sdk::metrics::SdkMeterProvider;

    use super::Prometheus;

    #[test]
    fn histograms_counters_and_gauges_render_as_prometheus_reads_them() {
        let (prometheus, reader) = Prometheus::new();
        let provider = SdkMeterProvider::builder().with_reader(reader).build();
        let meter = provider.meter("test");
        let duration = meter
            .f64_histogram("toolmesh.call.duration")
            .with_unit("s")
            .with_description("how long calls took")
            .with_boundaries(vec![0.001, 0.01])
            .build();
        let tool = [KeyValue::new("gen_ai.tool.name", "say \"hi\"")];
        for seconds in [0.0005, 0.005, 0.5] {
            duration.record(seconds, &tool);
        }
        meter.u64_counter("toolmesh.auth.refusals").build().add(2, &[]);
        meter.i64_gauge("toolmesh.source.up").build().record(1, &[KeyValue::new("a.b", "x")]);

        let text = prometheus.render();
        assert!(text.contains("# TYPE toolmesh_call_duration_seconds histogram"), "{text}");
        let label = r#"gen_ai_tool_name="say \"hi\"""#;
        for line in [
            format!(r#"toolmesh_call_duration_seconds_bucket{{{label},le="0.001"}} 1"#),
            format!(r#"toolmesh_call_duration_seconds_bucket{{{label},le="0.01"}} 2"#),
            format!(r#"toolmesh_call_duration_seconds_bucket{{{label},le="+Inf"}} 3"#),
            format!("toolmesh_call_duration_seconds_count{{{label}}} 3"),
            "toolmesh_auth_refusals_total 2".to_owned(),
            r#"toolmesh_source_up{a_b="x"} 1"#.to_owned(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
