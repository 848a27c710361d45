//! `toolmesh worker`: the worker's side of the worker protocol ([`toolmesh_remote::host`]),
//! reaching routers with the command line's TLS options and credential.

use std::{net::SocketAddr, sync::Arc};

use anyhow::Context as _;
use tonic::{service::Interceptor as _, transport::Channel};
use toolmesh_config::Config;
use toolmesh_remote::host::Dial;

pub use toolmesh_remote::host::{WORKER_SECTION, WorkerConfig, check, is_worker_file};

use crate::client::{ClientTls, Credential};

/// What `toolmesh worker` was asked: the host's options, and how to reach the routers.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// The routers, the pool, the capacity, the health listener.
    pub host: toolmesh_remote::host::WorkerOptions,
    /// The worker's credential (an API key or a JWT), for routers that authenticate.
    pub token: Option<String>,
    /// TLS to the routers (their listeners' `[tls]`); a client certificate can be the
    /// worker's credential.
    pub tls: ClientTls,
}

/// Runs a worker until `shutdown` resolves and its calls are finished (or the grace period
/// passed). Returns whether every call finished within the grace period.
pub async fn run(
    config: Config,
    options: WorkerOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<bool> {
    let dial = Arc::new(RouterDial {
        credential: Credential::bearer(options.token.as_deref())?,
        tls: options.tls,
    });
    toolmesh_remote::host::run(config, options.host, dial, shutdown).await
}

/// Routers reached with the command line's TLS options, the worker's credential on every
/// request.
struct RouterDial {
    credential: Credential,
    tls: ClientTls,
}

#[async_trait::async_trait]
impl Dial for RouterDial {
    fn url(&self, router: &str) -> String {
        self.tls.url(router)
    }

    async fn connect(&self, url: &str, addr: SocketAddr) -> anyhow::Result<Channel> {
        // This address, under the URL's scheme; TLS verifies the certificate by its name.
        let scheme = url.split_once("://").map_or("http", |(scheme, _)| scheme);
        self.tls
            .endpoint(&format!("{scheme}://{addr}"), &crate::client::host(url))?
            .connect()
            .await
            .with_context(|| format!("cannot connect to {addr}"))
    }

    fn authorize(&self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        self.credential.clone().call(request)
    }
}
