//! The span exporter, watched: a collector that cannot be reached is said once (and again
//! once it can be), and shows in toolmesh's health, instead of staying silent until exit.

use std::{
    sync::{
        Arc, Mutex, OnceLock, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use opentelemetry_sdk::{
    Resource,
    error::OTelSdkResult,
    trace::{SpanData, SpanExporter},
};
use tokio::sync::Notify;
use tracing::{info, warn};

/// Whether spans reach the collector.
#[derive(Debug)]
pub struct ExportHealth {
    endpoint: String,
    up: AtomicBool,
    error: Mutex<String>,
    changed: Notify,
}

impl ExportHealth {
    /// Returns whether the last export succeeded (true before the first), and why not.
    pub fn status(&self) -> (bool, String) {
        let up = self.up.load(Ordering::Acquire);
        let error = self.error.lock().unwrap_or_else(PoisonError::into_inner).clone();
        (up, if up { String::new() } else { format!("{}: {error}", self.endpoint) })
    }

    /// Resolves at the next change of [`ExportHealth::status`].
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    fn exported(&self, result: &OTelSdkResult) {
        match result {
            Ok(()) => {
                if !self.up.swap(true, Ordering::AcqRel) {
                    info!(endpoint = %self.endpoint, "spans reach the OTLP collector again");
                    self.changed.notify_waiters();
                }
            }
            Err(error) => {
                *self.error.lock().unwrap_or_else(PoisonError::into_inner) = error.to_string();
                if self.up.swap(false, Ordering::AcqRel) {
                    warn!(
                        endpoint = %self.endpoint,
                        %error,
                        "spans cannot be exported to the OTLP collector; they are dropped \
                         until it answers (said once, and again when it does)"
                    );
                    self.changed.notify_waiters();
                }
            }
        }
    }
}

static HEALTH: OnceLock<Arc<ExportHealth>> = OnceLock::new();

/// Returns the health of the span export, when spans are exported.
pub fn export_health() -> Option<Arc<ExportHealth>> {
    HEALTH.get().cloned()
}

/// A span exporter that reports each export's outcome to [`export_health`].
#[derive(Debug)]
pub(crate) struct Watched<E> {
    inner: E,
    health: Arc<ExportHealth>,
}

impl<E> Watched<E> {
    pub(crate) fn new(inner: E, endpoint: &str) -> Self {
        let health = Arc::new(ExportHealth {
            endpoint: endpoint.to_owned(),
            up: AtomicBool::new(true),
            error: Mutex::new(String::new()),
            changed: Notify::new(),
        });
        // One exporter per process; a second init (tests) keeps the first's health.
        let health = HEALTH.get_or_init(|| health).clone();
        Watched { inner, health }
    }
}

impl<E: SpanExporter> SpanExporter for Watched<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let result = self.inner.export(batch).await;
        self.health.exported(&result);
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
