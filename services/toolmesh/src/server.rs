use std::future::Future;

use tokio::net::TcpListener;
use toolmesh_config::ServerConfig;
use toolmesh_proto::v1::{
    knowledge_service_server::KnowledgeServiceServer, tool_service_server::ToolServiceServer,
    worker_service_server::WorkerServiceServer,
};

use crate::knowledge::KnowledgeServiceImpl;
use toolmesh_router::ToolServiceImpl;
use tracing::{Instrument, info, warn};

use crate::{App, ConnectionLimits, Listener, MessageLimitLayer, TrackCallsLayer};

/// Descriptors kept free of connections for everything else: MCP servers and their pipes,
/// outbound HTTP, files.
const RESERVED_DESCRIPTORS: usize = 128;

/// Returns `max_connections`, lowered (with a warning) so that connections alone cannot
/// exhaust the process's descriptors.
fn within_descriptors(max_connections: usize) -> usize {
    let Ok((soft, _)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    else {
        return max_connections;
    };
    let room =
        usize::try_from(soft).unwrap_or(usize::MAX).saturating_sub(RESERVED_DESCRIPTORS).max(1);
    if room < max_connections {
        warn!(
            max_connections,
            descriptors = soft,
            effective = room,
            "server.max_connections exceeds what the descriptor limit allows; lowered"
        );
    }
    room.min(max_connections)
}

/// Prefix of the health-check service of each part of each provider:
/// `toolmesh.<kind>.<name>`, for example `toolmesh.mcp.<server>`, `toolmesh.local.workers`,
/// `toolmesh.search.index`, `toolmesh.search.embeddings`.
pub const PROVIDER_HEALTH_PREFIX: &str = "toolmesh.";

/// The health service that is SERVING while tool search ranks with embeddings, and
/// NOT_SERVING when it is lexical only.
pub const SEARCH_EMBEDDINGS_HEALTH: &str = "toolmesh.search.embeddings";

/// Prefix of the health-check service name of each MCP server: `toolmesh.mcp.<server>`.
pub const MCP_HEALTH_PREFIX: &str = "toolmesh.mcp.";

/// Serves the API on `listener` with the limits of `config` until `shutdown` resolves;
/// then shuts down in order: the front door stops accepting and waits up to
/// `config.shutdown_grace` for calls in flight, then the providers stop (their processes
/// and connections with them). Telemetry is flushed by the caller's guard, last. Returns
/// whether every call finished within the grace period.
pub async fn serve(
    listener: TcpListener,
    app: App,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<bool> {
    let grace = config.shutdown_grace;
    let ended = app.front_door().serve(listener, app.clone(), config).await?;
    tokio::select! {
        // The server ended by itself: report why, after stopping what runs.
        result = ended => {
            app.shutdown().await;
            result.unwrap_or_else(|_| Err(anyhow::anyhow!("the front door stopped")))?;
            Ok(true)
        }
        () = shutdown => {
            info!("shutting down: no new calls; waiting for calls in flight");
            let drained = app.front_door().drain(grace).await;
            app.shutdown().await;
            Ok(drained)
        }
    }
}

/// The gRPC server with every service and limit, serving `listener` until `stop`.
pub(crate) fn grpc_server<H, S>(
    listener: TcpListener,
    app: &App,
    config: &ServerConfig,
    health_service: tonic_health::pb::health_server::HealthServer<H>,
    sessions: tokio_util::sync::CancellationToken,
    stop: S,
) -> anyhow::Result<impl Future<Output = Result<(), tonic::transport::Error>> + Send + use<H, S>>
where
    H: tonic_health::pb::health_server::Health,
    S: Future<Output = ()> + Send + 'static,
{
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(toolmesh_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(toolmesh_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let limits = ConnectionLimits::new(config, within_descriptors(config.max_connections.get()));
    let incoming = Listener::new(listener, limits, app.tls().clone());
    let max_message = config.max_message_bytes.get();
    Ok(tonic::transport::Server::builder()
        .max_concurrent_streams(config.max_concurrent_streams)
        .http2_keepalive_interval(config.keepalive_interval)
        .http2_keepalive_timeout(config.keepalive_interval.map(|_| config.keepalive_timeout))
        .layer(TrackCallsLayer::new(config))
        .layer(MessageLimitLayer::new(max_message))
        .layer(crate::auth::AuthLayer::new(app.identity().clone(), app.sessions().clone()))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(
            KnowledgeServiceServer::new(KnowledgeServiceImpl::new(
                app.knowledge().clone(),
                app.router().clone(),
            ))
            .max_decoding_message_size(max_message),
        )
        .add_service(
            WorkerServiceServer::new(app.remote().service(sessions, max_message))
                .max_decoding_message_size(max_message),
        )
        .add_service(
            ToolServiceServer::new(ToolServiceImpl::new(
                app.router().clone(),
                std::sync::Arc::new(app.meta().clone()),
                app.health().clone(),
            ))
            .max_decoding_message_size(max_message),
        )
        .serve_with_incoming_shutdown(incoming, stop))
}

/// Starts the gRPC health service: SERVING for the API, and one entry per part of each
/// provider, kept in step with the board by a task that ends with the returned handle.
pub(crate) async fn health_service(
    app: &App,
) -> (
    tonic_health::server::HealthReporter,
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
    tokio::task::JoinHandle<()>,
) {
    let health = tonic_health::server::HealthReporter::new();
    let health_service = tonic_health::pb::health_server::HealthServer::new(
        crate::health::GatedHealth::new(
            health.clone(),
            vec![
                <ToolServiceServer<ToolServiceImpl> as tonic::server::NamedService>::NAME,
                <KnowledgeServiceServer<KnowledgeServiceImpl> as tonic::server::NamedService>::NAME,
                <WorkerServiceServer<toolmesh_remote::WorkerServiceImpl> as tonic::server::NamedService>::NAME,
            ],
        ),
    );
    health.set_serving::<ToolServiceServer<ToolServiceImpl>>().await;
    health.set_serving::<KnowledgeServiceServer<KnowledgeServiceImpl>>().await;
    health.set_serving::<WorkerServiceServer<toolmesh_remote::WorkerServiceImpl>>().await;
    // Before the first connection is accepted, every provider's entry is there; the task
    // follows the changes from then on.
    let mut changes = app.health().subscribe();
    let mut known = std::collections::BTreeSet::new();
    let current = changes.borrow_and_update().clone();
    apply_health(&current, &mut health.clone(), &mut known).await;
    let mut reporter = health.clone();
    let task = tokio::spawn(
        async move {
            while changes.changed().await.is_ok() {
                let current = changes.borrow_and_update().clone();
                apply_health(&current, &mut reporter, &mut known).await;
            }
        }
        .instrument(tracing::info_span!("health", task = "grpc health")),
    );
    (health, health_service, task)
}

/// Marks the API NOT_SERVING, for a shutdown.
pub(crate) async fn not_serving(health: &tonic_health::server::HealthReporter) {
    health.set_not_serving::<ToolServiceServer<ToolServiceImpl>>().await;
    health.set_not_serving::<KnowledgeServiceServer<KnowledgeServiceImpl>>().await;
    health.set_not_serving::<WorkerServiceServer<toolmesh_remote::WorkerServiceImpl>>().await;
}

/// Logs that calls outlived the grace period.
pub(crate) fn grace_exceeded(grace: std::time::Duration, in_flight: usize) {
    warn!(
        grace_ms = grace.as_millis() as u64,
        in_flight, "calls still in flight after the grace period; exiting anyway"
    );
}

/// Sets the health-check service of every entry of `current`, and clears those of `known`
/// that are gone.
async fn apply_health(
    current: &std::collections::BTreeMap<(String, String), toolmesh_core::Health>,
    reporter: &mut tonic_health::server::HealthReporter,
    known: &mut std::collections::BTreeSet<String>,
) {
    let mut names = std::collections::BTreeSet::new();
    for ((kind, name), health) in current {
        let status = if health.up {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        let service = format!("{PROVIDER_HEALTH_PREFIX}{kind}.{name}");
        reporter.set_service_status(&service, status).await;
        names.insert(service);
    }
    for gone in known.difference(&names) {
        reporter.clear_service_status(gone).await;
    }
    *known = names;
}
