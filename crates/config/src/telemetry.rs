//! `[telemetry]`: logs and OpenTelemetry export.

use crate::ConfigError;

use serde::Deserialize;

/// `[telemetry]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// Log filter.
    pub log: String,
    /// How log lines are written.
    pub log_format: LogFormat,
    /// OTLP/gRPC endpoint; `None` falls back to `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of exported spans.
    pub service_name: String,
    /// Where `/metrics` is served for Prometheus; `None`: nowhere.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Export the actor runtime's own spans too.
    pub actor_spans: bool,
}

/// How log lines are written on standard error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTelemetry {
    pub(crate) log: String,
    pub(crate) log_format: String,
    pub(crate) otlp_endpoint: String,
    pub(crate) service_name: String,
    pub(crate) metrics_listen: String,
    pub(crate) actor_spans: bool,
}

/// Refuses a log filter whose directive cannot mean what was written: a bare word that is
/// not a level (`inof` is read as a target, which silences every other log) or a level
/// that is none. Span and field filters (`target[span{f=v}]=debug`) are left to the
/// filter's own parser.
pub(crate) fn log_filter(filter: &str) -> Result<(), String> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    let is_level = |word: &str| LEVELS.iter().any(|level| level.eq_ignore_ascii_case(word.trim()));
    for directive in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if directive.contains('[') {
            continue;
        }
        match directive.rsplit_once('=') {
            Some((target, level)) if target.trim().is_empty() || !is_level(level) => {
                return Err(format!(
                    "`{directive}` is not `target=level` with a level among {}",
                    LEVELS.join(", ")
                ));
            }
            Some(_) => {}
            None if !is_level(directive) => {
                return Err(format!(
                    "`{directive}` is not a level ({}); a target needs one too: \
                     `{directive}=debug`",
                    LEVELS.join(", ")
                ));
            }
            None => {}
        }
    }
    Ok(())
}

/// Reads `[telemetry]`.
pub(crate) fn telemetry(
    raw: RawTelemetry,
    key_error: &dyn Fn(String, String) -> ConfigError,
) -> Result<TelemetryConfig, ConfigError> {
    log_filter(&raw.log).map_err(|reason| key_error("telemetry.log".into(), reason))?;
    let log_format = match raw.log_format.trim() {
        "text" => LogFormat::Text,
        "json" => LogFormat::Json,
        other => {
            return Err(key_error(
                "telemetry.log_format".into(),
                format!("`{other}` is not a log format: \"text\" or \"json\""),
            ));
        }
    };
    let metrics_listen = match raw.metrics_listen.trim() {
        "" => None,
        addr => Some(addr.parse().map_err(|_| {
            key_error(
                "telemetry.metrics_listen".into(),
                format!("`{addr}` is not an address and port, such as 0.0.0.0:9464"),
            )
        })?),
    };
    let telemetry = TelemetryConfig {
        log: raw.log,
        log_format,
        otlp_endpoint: Some(raw.otlp_endpoint).filter(|s| !s.trim().is_empty()),
        service_name: raw.service_name,
        metrics_listen,
        actor_spans: raw.actor_spans,
    };
    Ok(telemetry)
}
