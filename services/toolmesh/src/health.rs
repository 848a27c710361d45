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
