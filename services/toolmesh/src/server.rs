//! The server of the front door: the API's routes (gRPC, and the MCP endpoint over HTTP/1.1
//! and HTTP/2 on the same port) behind the listener's limits, TLS and authentication.

use std::{future::Future, sync::Arc};

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use toolmesh_config::ServerConfig;
use toolmesh_identity::Authenticator;
use tracing::warn;

use crate::{
    ConnectionLimits, Listener, MessageLimitLayer, Serving, TrackCallsLayer, api::Api,
    auth::Sessions, tls::ListenerTls,
};

/// Everything the front door serves: the API, and who may reach it over which TLS. Cheap to
/// clone; the authenticator and the certificates are replaced in place on reload.
#[derive(Clone)]
pub(crate) struct Front {
    pub(crate) api: Api,
    pub(crate) identity: Arc<ArcSwap<Authenticator>>,
    pub(crate) sessions: Sessions,
    pub(crate) tls: ListenerTls,
}

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

/// The gRPC server with the API's services behind the listener's limits, TLS and
/// authentication, serving `listener` until `stop`.
pub(crate) fn grpc_server<H, S>(
    listener: TcpListener,
    front: &Front,
    config: &ServerConfig,
    health_service: tonic_health::pb::health_server::HealthServer<H>,
    sessions: tokio_util::sync::CancellationToken,
    stop: S,
) -> anyhow::Result<impl Future<Output = Result<(), tonic::transport::Error>> + Send + use<H, S>>
where
    H: tonic_health::pb::health_server::Health,
    S: Future<Output = ()> + Send + 'static,
{
    let mut limits =
        ConnectionLimits::new(config, within_descriptors(config.max_connections.get()));
    let mcp = front.api.mcp.as_ref().map(|endpoint| crate::auth::McpResource {
        path: crate::api::MCP_PATH,
        public_url: endpoint
            .public_url
            .as_ref()
            .map(|url| url.strip_suffix(crate::api::MCP_PATH).unwrap_or(url).to_owned()),
        https: front.tls.acceptor().is_some(),
    });
    limits.accept_http1 = mcp.is_some();
    let incoming = Listener::new(listener, limits, front.tls.clone());
    let max_message = config.max_message_bytes.get();
    let serving = Serving { max_message_bytes: max_message, sessions };
    let routes = crate::api::routes(&front.api, health_service, &serving)?;
    Ok(tonic::transport::Server::builder()
        .accept_http1(limits.accept_http1)
        .max_concurrent_streams(config.max_concurrent_streams)
        .http2_keepalive_interval(config.keepalive_interval)
        .http2_keepalive_timeout(config.keepalive_interval.map(|_| config.keepalive_timeout))
        .layer(TrackCallsLayer::new(config))
        .layer(MessageLimitLayer::new(max_message))
        .layer(crate::auth::AuthLayer::new(front.identity.clone(), front.sessions.clone(), mcp))
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, stop))
}

/// Logs that calls outlived the grace period.
pub(crate) fn grace_exceeded(grace: std::time::Duration, in_flight: usize) {
    warn!(
        grace_ms = grace.as_millis() as u64,
        in_flight, "calls still in flight after the grace period; exiting anyway"
    );
}
