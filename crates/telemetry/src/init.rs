use std::time::Duration;

use opentelemetry::{KeyValue, trace::TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::{
    Resource,
    metrics::SdkMeterProvider,
    propagation::TraceContextPropagator,
    runtime,
    trace::{SdkTracerProvider, span_processor_with_async_runtime::BatchSpanProcessor},
};
use tracing::Level;

use crate::prometheus::{Prometheus, SharedReader};
use tracing_subscriber::{
    EnvFilter, Layer as _,
    filter::LevelFilter,
    filter::{FilterExt as _, Targets, filter_fn},
    layer::SubscriberExt,
    util::SubscriberInitExt,
};

/// What [`init`] needs to know.
#[derive(Debug, Clone, Default)]
pub struct TelemetryOptions {
    /// Log filter in `EnvFilter` syntax; `RUST_LOG` wins when set.
    pub log_filter: String,
    /// Write each log line as one JSON object instead of readable text.
    pub json_logs: bool,
    /// OTLP/gRPC endpoint; `None` falls back to `OTEL_EXPORTER_OTLP_ENDPOINT`, and without
    /// that no spans are exported.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the spans; `OTEL_SERVICE_NAME` wins when set.
    pub service_name: String,
    /// Export the spans of ractor's actors too (its `Actor` and `message_parent` spans, one
    /// per actor and message): internals, left out by default.
    pub actor_spans: bool,
    /// Keep the metrics for Prometheus to scrape ([`TelemetryGuard::prometheus`]), whether
    /// or not they are exported over OTLP too.
    pub prometheus: bool,
}

/// Telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The log filter does not parse.
    #[error("invalid log filter {filter:?}: {reason}")]
    Filter {
        /// The filter.
        filter: String,
        /// The parser's complaint.
        reason: String,
    },
    /// The OTLP exporter could not be built.
    #[error("cannot set up OTLP export to {endpoint}: {reason}")]
    Exporter {
        /// The endpoint.
        endpoint: String,
        /// What failed.
        reason: String,
    },
    /// A global subscriber is already installed.
    #[error("a tracing subscriber is already installed")]
    AlreadyInstalled,
}

/// Keeps the exporter alive; dropping it flushes the spans still buffered and shuts the
/// exporter down.
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
    meters: Option<SdkMeterProvider>,
    prometheus: Option<Prometheus>,
}

impl TelemetryGuard {
    /// Returns whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Returns the metrics for Prometheus, when [`TelemetryOptions::prometheus`] asked for
    /// them.
    pub fn prometheus(&self) -> Option<&Prometheus> {
        self.prometheus.as_ref()
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        let (provider, meters) = (self.provider.take(), self.meters.take());
        if provider.is_none() && meters.is_none() {
            return;
        }
        // shutdown() blocks until the exporter tasks have flushed; those tasks run on the
        // tokio runtime, so block a plain thread, never a runtime worker.
        let done = std::thread::spawn(move || {
            let traces = provider.map(|p| p.shutdown());
            let metrics = meters.map(|m| m.shutdown());
            (traces, metrics)
        });
        if let Ok((traces, metrics)) = done.join() {
            if let Some(Err(error)) = traces {
                eprintln!("toolmesh: flushing traces at exit failed: {error}");
            }
            if let Some(Err(error)) = metrics {
                eprintln!("toolmesh: flushing metrics at exit failed: {error}");
            }
        }
    }
}

/// Installs the global tracing subscriber (human-readable logs on stderr, and OTLP export
/// when an endpoint is configured) and the W3C trace-context propagator. Must be called
/// inside a tokio runtime when exporting.
pub fn init(options: &TelemetryOptions) -> Result<TelemetryGuard, TelemetryError> {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());

    let filter = match std::env::var("RUST_LOG") {
        Ok(filter) if !filter.is_empty() => filter,
        _ => options.log_filter.clone(),
    };
    let env_filter = EnvFilter::try_new(&filter)
        .map_err(|error| TelemetryError::Filter { filter, reason: error.to_string() })?;
    // Logs are events; spans are for traces. Keeping spans away from the log layer means
    // it never formats the fields of the per-call spans, and with no exporter no layer
    // wants those spans at all, so creating them costs next to nothing.
    let events = env_filter.and(filter_fn(|metadata| metadata.is_event()));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = if options.json_logs {
        // One object per line with the event's fields at its top level, as log collectors
        // read them; no ANSI colours, and no span context (spans are for traces).
        fmt.json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_filter(events)
            .boxed()
    } else {
        fmt.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(false)
            .with_filter(events)
            .boxed()
    };

    let endpoint = options
        .otlp_endpoint
        .clone()
        .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").ok())
        .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok())
        .filter(|endpoint| !endpoint.trim().is_empty());
    let provider =
        endpoint.as_deref().map(|endpoint| build_provider(endpoint, options)).transpose()?;
    let metrics_endpoint = options
        .otlp_endpoint
        .clone()
        .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT").ok())
        .or(endpoint)
        .filter(|endpoint| !endpoint.trim().is_empty());
    let (prometheus, scraped) = match options.prometheus {
        true => {
            let (prometheus, reader) = Prometheus::new();
            (Some(prometheus), Some(reader))
        }
        false => (None, None),
    };
    let meters = build_meters(metrics_endpoint.as_deref(), scraped, options)?;
    if let Some(meters) = &meters {
        opentelemetry::global::set_meter_provider(meters.clone());
    }

    // Two stacks rather than an `Option` layer: a `None` layer still registers interest in
    // every callsite, which would make every span cost as if it were recorded.
    let installed = match &provider {
        Some(provider) => {
            let mut targets = Targets::new().with_default(Level::INFO);
            if !options.actor_spans {
                targets = targets.with_target("ractor", LevelFilter::OFF);
            }
            let otel = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("toolmesh"))
                .with_filter(targets);
            tracing_subscriber::registry().with(fmt).with(otel).try_init()
        }
        None => tracing_subscriber::registry().with(fmt).try_init(),
    };
    installed.map_err(|_| TelemetryError::AlreadyInstalled)?;
    Ok(TelemetryGuard { provider, meters, prometheus })
}

fn resource(options: &TelemetryOptions) -> Resource {
    let service_name = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| options.service_name.clone());
    Resource::builder()
        .with_service_name(service_name)
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build()
}

/// The meter provider: metrics go to the same OTLP endpoint as traces, every
/// `OTEL_METRIC_EXPORT_INTERVAL` milliseconds (60 s by default), and are kept for Prometheus
/// to scrape through `scraped`. `None` when neither is wanted: instruments then cost nothing.
fn build_meters(
    endpoint: Option<&str>,
    scraped: Option<SharedReader>,
    options: &TelemetryOptions,
) -> Result<Option<SdkMeterProvider>, TelemetryError> {
    if endpoint.is_none() && scraped.is_none() {
        return Ok(None);
    }
    let mut builder = SdkMeterProvider::builder().with_resource(resource(options));
    if let Some(endpoint) = endpoint {
        let exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(Duration::from_secs(5))
            .build()
            .map_err(exporter_error(endpoint))?;
        let reader =
        opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader::builder(
            exporter,
            runtime::Tokio,
        )
        .build();
        builder = builder.with_reader(reader);
    }
    if let Some(scraped) = scraped {
        builder = builder.with_reader(scraped);
    }
    Ok(Some(builder.build()))
}

/// Maps a failure to build the OTLP exporter for `endpoint`.
fn exporter_error(
    endpoint: &str,
) -> impl FnOnce(opentelemetry_otlp::ExporterBuildError) -> TelemetryError {
    move |error| TelemetryError::Exporter {
        endpoint: endpoint.to_owned(),
        reason: error.to_string(),
    }
}

fn build_provider(
    endpoint: &str,
    options: &TelemetryOptions,
) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .with_timeout(Duration::from_secs(5))
        .build()
        .map_err(exporter_error(endpoint))?;
    let resource = resource(options);
    let exporter = crate::export::Watched::new(exporter, endpoint);
    let processor = BatchSpanProcessor::builder(exporter, runtime::Tokio).build();
    Ok(SdkTracerProvider::builder().with_span_processor(processor).with_resource(resource).build())
}
