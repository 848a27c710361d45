//! `/metrics` for Prometheus, on an address of its own (`[telemetry] metrics_listen`).

use std::net::SocketAddr;

use anyhow::Context as _;
use axum::{Router, http::header, response::IntoResponse, routing::get};
use toolmesh_telemetry::Prometheus;
use tracing::{Instrument as _, info, warn};

/// Serves `prometheus` at `http://ADDR/metrics` from now on; returns the bound address.
pub async fn serve(addr: SocketAddr, prometheus: Prometheus) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot serve metrics on {addr} (telemetry.metrics_listen)"))?;
    let bound = listener.local_addr()?;
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let prometheus = prometheus.clone();
            async move {
                let text = tokio::task::spawn_blocking(move || prometheus.render())
                    .await
                    .unwrap_or_else(|error| format!("# collecting failed: {error}\n"));
                ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text)
                    .into_response()
            }
        }),
    );
    info!(addr = %bound, "serving metrics at /metrics");
    tokio::spawn(
        async move {
            if let Err(error) = axum::serve(listener, app).await {
                warn!(%error, "the metrics server stopped");
            }
        }
        .instrument(tracing::info_span!("metrics", task = "serve")),
    );
    Ok(bound)
}
