//! The API layer: the gRPC services toolmesh serves. They sit above the domain crates and
//! only call down; each request is authenticated, limited and traced by the server's
//! layers before it reaches them.
//!
//! - [`ToolServiceImpl`] is `toolmesh.v1.ToolService`: paging and filters for `ListTools`,
//!   `SearchTools` through the meta-tools' search, `CallTool`, and the `StreamCallTool`
//!   stream of progress, partial outputs, approvals, elicitations and the result, every
//!   call through the router's call path; and the MCP servers' resources and prompts
//!   (`offers`), under policy.
//! - [`KnowledgeServiceImpl`] is `toolmesh.v1.KnowledgeService`, served by the knowledge
//!   plug-in; `toolmesh.v1.WorkerService` is served by the remote plug-in.
//! - [`McpMesh`] is the MCP endpoint's view of the router: at [`MCP_PATH`] (and
//!   `/mcp/<profile>`), MCP clients list and call the tools gRPC callers do, through the
//!   same call path.
//! - [`health`] answers `grpc.health.v1.Health`: the API's services, and each provider's
//!   parts to authenticated callers only; reflection v1 and v1alpha describe them all.

pub(crate) mod health;
mod knowledge;
mod mcp;
mod offers;
mod tools;
mod view;

pub(crate) use knowledge::KnowledgeServiceImpl;
pub(crate) use mcp::McpMesh;
pub use tools::{ToolServiceImpl, principal};

use std::sync::Arc;

use toolmesh_core::HealthBoard;
use toolmesh_meta::MetaTools;
use toolmesh_proto::v1::tool_service_server::ToolServiceServer;
use toolmesh_router::Router;

use crate::{GrpcService, Serving};

/// What the API serves: the call path, the meta-tools, every provider's health, and the
/// plug-ins' services. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Api {
    pub(crate) router: Router,
    pub(crate) meta: MetaTools,
    pub(crate) health: HealthBoard,
    pub(crate) services: Arc<Vec<GrpcService>>,
    /// The MCP endpoint's settings; `None` where it is off.
    pub(crate) mcp: Option<toolmesh_mcp::McpEndpointConfig>,
    /// The MCP servers, for their resources and prompts.
    pub(crate) servers: toolmesh_mcp::McpManager,
}

/// The path of the MCP endpoint; `<MCP_PATH>/<profile>` serves a named routing profile.
pub(crate) const MCP_PATH: &str = "/mcp";

/// The names of the API's gRPC services: `toolmesh.v1.ToolService` and the plug-ins'.
pub(crate) fn services(api: &Api) -> Vec<&'static str> {
    std::iter::once(<ToolServiceServer<ToolServiceImpl> as tonic::server::NamedService>::NAME)
        .chain(api.services.iter().map(GrpcService::name))
        .collect()
}

/// Every service of the API on one set of routes: health (as `health` answers it),
/// reflection, the tools API, and the plug-ins' services.
pub(crate) fn routes<H>(
    api: &Api,
    health: tonic_health::pb::health_server::HealthServer<H>,
    serving: &Serving,
) -> anyhow::Result<tonic::service::Routes>
where
    H: tonic_health::pb::health_server::Health,
{
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(toolmesh_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(toolmesh_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let tools = ToolServiceImpl::new(
        api.router.clone(),
        api.meta.clone(),
        api.health.clone(),
        api.servers.clone(),
    );
    let mut routes = tonic::service::RoutesBuilder::default();
    routes
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(
            ToolServiceServer::new(tools).max_decoding_message_size(serving.max_message_bytes),
        );
    for service in api.services.iter() {
        service.add_to(&mut routes, serving);
    }
    let mut routes = routes.routes();
    if let Some(config) = &api.mcp {
        let mesh = Arc::new(McpMesh {
            router: api.router.clone(),
            meta: api.meta.clone(),
            servers: api.servers.clone(),
        });
        let endpoint = toolmesh_mcp::Endpoint::new(
            mesh,
            MCP_PATH,
            config,
            &api.meta.derived_key("mcp-session"),
            serving.max_message_bytes,
            serving.sessions.clone(),
        );
        let router = std::mem::take(routes.axum_router_mut());
        *routes.axum_router_mut() = router
            .route_service(MCP_PATH, endpoint.clone())
            .route_service(&format!("{MCP_PATH}/{{profile}}"), endpoint);
    }
    Ok(routes)
}
