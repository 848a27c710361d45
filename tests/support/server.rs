use std::{collections::HashMap, net::SocketAddr, time::Duration};

use tokio::{sync::oneshot, task::JoinHandle};
use toolmesh::{App, AppOptions};
use toolmesh_config::Config;
use toolmesh_proto::v1::tool_service_client::ToolServiceClient;

/// A toolmesh served in-process on `127.0.0.1:0`, with extra local tools; stopped on drop.
pub struct TestServer {
    /// The bound address.
    pub addr: SocketAddr,
    /// The running app.
    pub app: App,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<bool>>>,
    /// The data directory this server made for itself, removed with it.
    _data: Option<tempfile::TempDir>,
}

impl TestServer {
    /// Starts a server with the default configuration changed by `toml` and `options`.
    /// Its data (the embedded vector store) is in a fresh directory, removed with it.
    pub async fn start(toml: &str, options: AppOptions) -> anyhow::Result<Self> {
        let data = tempfile::tempdir()?;
        let mut server = Self::start_in(toml, options, data.path()).await?;
        server._data = Some(data);
        Ok(server)
    }

    /// Like [`TestServer::start`], with its data in `data_dir`, which outlives it: a
    /// server started again on it finds what the first one stored.
    pub async fn start_in(
        toml: &str,
        options: AppOptions,
        data_dir: &std::path::Path,
    ) -> anyhow::Result<Self> {
        let mut config = Self::config(toml)?;
        config.server.data_dir = Some(data_dir.to_owned());
        let app = App::start(&config, options).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = rx.await;
        };
        let server = toolmesh_config::ServerConfig {
            shutdown_grace: Duration::from_secs(5),
            ..config.server.clone()
        };
        let task = tokio::spawn(toolmesh::serve(listener, app.clone(), server, shutdown));
        Ok(TestServer { addr, app, shutdown: Some(tx), task: Some(task), _data: None })
    }

    /// Returns the data directory this server made for itself, if it made one.
    pub fn data_dir(&self) -> Option<&std::path::Path> {
        self._data.as_ref().map(tempfile::TempDir::path)
    }

    /// Parses a configuration over the defaults, with an empty environment.
    /// Tool vectors go to a cache shared by the test processes of this run, not the user's.
    pub fn config(toml: &str) -> anyhow::Result<Config> {
        let mut config = toolmesh_config::load_str(Some(("test.toml", toml)), &HashMap::new())?;
        let cache = std::env::temp_dir().join("toolmesh-e2e-cache");
        config.set("search.cache_dir", cache.display().to_string());
        Ok(config)
    }

    /// Returns a connected client.
    pub async fn client(&self) -> ToolServiceClient<toolmesh::client::Connection> {
        toolmesh::client::connect(&self.addr.to_string(), None)
            .await
            .expect("connect to the test server")
    }

    /// Returns the gRPC health of `service` (`""` for the whole server); `None` when the
    /// server does not know the service or cannot be asked.
    pub async fn health(
        &self,
        service: &str,
    ) -> Option<tonic_health::pb::health_check_response::ServingStatus> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .ok()?
            .connect()
            .await
            .ok()?;
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
        let request = tonic_health::pb::HealthCheckRequest { service: service.into() };
        health.check(request).await.ok().map(|r| r.into_inner().status())
    }

    /// Calls `name` with `arguments` over unary CallTool.
    pub async fn call(
        &self,
        name: &str,
        arguments: serde_json::Value,
    ) -> Result<toolmesh_proto::v1::CallToolResponse, tonic::Status> {
        let request = toolmesh_proto::v1::CallToolRequest {
            name: name.into(),
            arguments_json: arguments.to_string(),
            ..Default::default()
        };
        self.client().await.call_tool(request).await.map(tonic::Response::into_inner)
    }

    /// Triggers shutdown and waits for the server; returns whether calls drained in time.
    pub async fn stop(mut self) -> anyhow::Result<bool> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.task.take() {
            Some(task) => task.await?,
            None => Ok(true),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}
