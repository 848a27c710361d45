//! The gRPC health service as toolmesh answers it: the overall entry and toolmesh's own
//! services to anyone (load balancers and probes carry no credentials), and the entries of
//! each provider's parts (`toolmesh.<kind>.<name>`: collections, pools, MCP servers) only to
//! an authenticated caller, since their names describe the deployment.

use std::sync::Arc;

use tonic::{Request, Response, Status};
use tonic_health::{
    pb::{HealthCheckRequest, HealthCheckResponse, health_server::Health},
    server::HealthService,
};
use toolmesh_core::{Principal, PrincipalKind};
use tracing::Instrument as _;

use super::Api;

/// Health answered by [`HealthService`], with provider entries kept from callers who did
/// not authenticate.
#[derive(Debug)]
pub(crate) struct GatedHealth {
    inner: HealthService,
    /// The entries anyone may ask about.
    public: Vec<&'static str>,
}

impl GatedHealth {
    /// Serves the statuses of `reporter`, `public` (and the overall entry) to anyone.
    pub(crate) fn new(
        reporter: tonic_health::server::HealthReporter,
        public: Vec<&'static str>,
    ) -> Self {
        GatedHealth { inner: HealthService::from_health_reporter(reporter), public }
    }

    /// Refuses a request for a provider's entry from a caller without a credential,
    /// whether the entry exists or not.
    fn admit(&self, request: &Request<HealthCheckRequest>) -> Result<(), Status> {
        let service = request.get_ref().service.as_str();
        if service.is_empty() || self.public.contains(&service) {
            return Ok(());
        }
        // Without `[auth]` every request is the open principal; under it, a request
        // without a credential has the configured anonymous principal or none.
        let authenticated = request.extensions().get::<Arc<Principal>>().is_some_and(|principal| {
            toolmesh_core::is_open(principal) || principal.kind != PrincipalKind::Anonymous
        });
        if !authenticated {
            return Err(Status::unauthenticated(
                "the health of a provider's part is answered to authenticated callers; \
                 the overall entry and toolmesh's services are public",
            ));
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl Health for GatedHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.admit(&request)?;
        self.inner.check(request).await
    }

    type WatchStream = <HealthService as Health>::WatchStream;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.admit(&request)?;
        self.inner.watch(request).await
    }
}

/// Starts the gRPC health service: SERVING for the API, and one entry per part of each
/// provider, kept in step with the board by a task that ends with the returned handle.
pub(crate) async fn health_service(
    api: &Api,
) -> (
    tonic_health::server::HealthReporter,
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
    tokio::task::JoinHandle<()>,
) {
    let health = tonic_health::server::HealthReporter::new();
    let health_service = tonic_health::pb::health_server::HealthServer::new(GatedHealth::new(
        health.clone(),
        super::services(api),
    ));
    for service in super::services(api) {
        health.set_service_status(service, tonic_health::ServingStatus::Serving).await;
    }
    // Before the first connection is accepted, every provider's entry is there; the task
    // follows the changes from then on.
    let mut changes = api.health.subscribe();
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
pub(crate) async fn not_serving(
    services: &[&'static str],
    health: &tonic_health::server::HealthReporter,
) {
    for &service in services {
        health.set_service_status(service, tonic_health::ServingStatus::NotServing).await;
    }
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
        let service = format!("{}{kind}.{name}", crate::PROVIDER_HEALTH_PREFIX);
        reporter.set_service_status(&service, status).await;
        names.insert(service);
    }
    for gone in known.difference(&names) {
        reporter.clear_service_status(gone).await;
    }
    *known = names;
}
