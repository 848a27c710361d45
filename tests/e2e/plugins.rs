//! The plug-in seam: a backend of its own with a section, a supervised actor and a gRPC
//! service, assembled like the built-in ones.

use serde_json::{Value, json};
use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};
use toolmesh::AppOptions;
use toolmesh_e2e::{TestServer, eventually, text};
use toolmesh_proto::v1::{ListToolsRequest, SourceKind};

/// A backend as the next ones will be: a plug-in with a configuration section, a provider
/// that publishes a tool of its own source, an actor the root supervises, and a gRPC
/// service; its health, start, reload and stop are driven by the test.
struct FleetPlugin {
    made: std::sync::mpsc::Sender<Arc<FleetProvider>>,
}

/// The plug-in's own configuration section, `[fleet]`: defined, defaulted and checked
/// here, not in the config crate.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FleetSection {
    tool: String,
}

impl toolmesh_config::Section for FleetSection {
    const NAME: &'static str = "fleet";
    const DEFAULTS: &'static str =
        "# The fleet: off unless written.\n# [fleet]\n# tool = \"fleet_status\"\n";

    fn read(
        value: toml::Value,
        cx: &toolmesh_config::Reading<'_>,
    ) -> Result<Self, toolmesh_config::ConfigError> {
        cx.deserialize(value)
    }
}

impl FleetSection {
    fn read(config: &toolmesh_config::Config) -> anyhow::Result<FleetSection> {
        config.find::<FleetSection>()?.ok_or_else(|| anyhow::anyhow!("no [fleet]"))
    }
}

/// The fleet's provider: its tool and its health.
struct FleetProvider {
    registry: toolmesh_registry::RegistryHandle,
    health: std::sync::Mutex<toolmesh_core::Health>,
    changed: tokio::sync::Notify,
    reloads: std::sync::atomic::AtomicUsize,
    stopped: std::sync::atomic::AtomicBool,
}

struct FleetBackend;

/// The fleet's actor: it answers a ping with how many actors the fleet has started.
struct FleetActor;

/// The handle that owns the fleet's actor, and starts a fresh one when the root asks.
struct FleetActors {
    actor: std::sync::Mutex<ractor::ActorRef<ractor::RpcReplyPort<usize>>>,
    generation: std::sync::atomic::AtomicUsize,
}

impl FleetActors {
    async fn start() -> anyhow::Result<Self> {
        let (actor, _) = ractor::Actor::spawn(None, FleetActor, 1).await?;
        Ok(FleetActors { actor: std::sync::Mutex::new(actor), generation: 1.into() })
    }

    async fn ping(&self) -> Option<usize> {
        let actor = self.actor.lock().unwrap().clone();
        ractor::call!(actor, |reply| reply).ok()
    }
}

/// The fleet's gRPC service, `toolmesh.test.Fleet`: `Ping` answers the actor's generation.
#[derive(Clone)]
struct FleetService(Arc<FleetActors>);

type FleetCodec = tonic_prost::ProstCodec<String, String>;

struct FleetPing(Arc<FleetActors>);

#[async_trait::async_trait]
impl toolmesh::Plugin for FleetPlugin {
    fn name(&self) -> &'static str {
        "fleet"
    }

    fn sections(&self) -> &'static [toolmesh_config::SectionDef] {
        const SECTIONS: [toolmesh_config::SectionDef; 1] =
            [toolmesh_config::SectionDef::of::<FleetSection>()];
        &SECTIONS
    }

    /// The fleet is off unless written, and this test always writes it.
    fn check(&self, config: &toolmesh_config::Config) -> anyhow::Result<()> {
        FleetSection::read(config).map(drop)
    }

    async fn build(
        &self,
        assembly: &mut toolmesh::Assembly<'_>,
    ) -> anyhow::Result<toolmesh::Parts> {
        let actor = Arc::new(FleetActors::start().await?);
        let provider = Arc::new(FleetProvider {
            registry: assembly.registry.clone(),
            health: std::sync::Mutex::new(toolmesh_core::Health::up()),
            changed: tokio::sync::Notify::new(),
            reloads: Default::default(),
            stopped: Default::default(),
        });
        self.made.send(provider.clone())?;
        let service = {
            let actor = actor.clone();
            toolmesh::GrpcService::new::<FleetService>(move |routes, _| {
                routes.add_service(FleetService(actor.clone()));
            })
        };
        Ok(toolmesh::Parts::provider(provider).actor("fleet", actor).service(service))
    }
}

#[async_trait::async_trait]
impl toolmesh_core::Backend for FleetBackend {
    async fn call(
        &self,
        _: toolmesh_core::CallContext,
        _: Value,
    ) -> Result<toolmesh_core::ToolOutput, toolmesh_core::BackendError> {
        Ok(toolmesh_core::ToolOutput {
            content: vec![toolmesh_core::ContentPart::Text("from the fleet".into())],
            ..Default::default()
        })
    }
}

#[async_trait::async_trait]
impl toolmesh_core::Provider<toolmesh_config::Config> for FleetProvider {
    fn kind(&self) -> &'static str {
        "remote"
    }

    async fn start(
        &self,
        config: &toolmesh_config::Config,
    ) -> Result<(), toolmesh_core::ProviderError> {
        let fail =
            |e: &dyn std::fmt::Display| toolmesh_core::ProviderError::new("remote", e.to_string());
        let section = FleetSection::read(config).map_err(|e| fail(&e))?;
        let source = toolmesh_core::ToolSource {
            kind: toolmesh_core::SourceKind::Remote,
            name: "fleet".into(),
        };
        let spec = toolmesh_core::ToolSpec::new(
            section.tool,
            "Pings the fleet.",
            json!({"type": "object"}),
            source,
        );
        let entry = toolmesh_registry::ToolEntry::new(spec, Arc::new(FleetBackend))
            .map_err(|e| fail(&e))?;
        self.registry.register(entry).await.map_err(|e| fail(&e))?;
        Ok(())
    }

    async fn reload(
        &self,
        _: &toolmesh_config::Config,
    ) -> Result<(), toolmesh_core::ProviderError> {
        self.reloads.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn health(&self) -> Vec<(String, toolmesh_core::Health)> {
        vec![("fleet".into(), self.health.lock().unwrap().clone())]
    }

    async fn health_changed(&self) {
        self.changed.notified().await;
    }

    async fn stop(&self, _: Duration) {
        self.stopped.store(true, Ordering::SeqCst);
    }
}

impl ractor::Actor for FleetActor {
    type Msg = ractor::RpcReplyPort<usize>;
    type State = usize;
    type Arguments = usize;

    async fn pre_start(
        &self,
        _: ractor::ActorRef<Self::Msg>,
        generation: usize,
    ) -> Result<usize, ractor::ActorProcessingErr> {
        Ok(generation)
    }

    async fn handle(
        &self,
        _: ractor::ActorRef<Self::Msg>,
        reply: Self::Msg,
        generation: &mut usize,
    ) -> Result<(), ractor::ActorProcessingErr> {
        let _ = reply.send(*generation);
        Ok(())
    }
}

#[async_trait::async_trait]
impl toolmesh_core::Supervised for FleetActors {
    fn actor(&self) -> ractor::ActorCell {
        self.actor.lock().unwrap().get_cell()
    }

    async fn respawn(
        &self,
        root: ractor::ActorCell,
        _: String,
    ) -> Result<ractor::ActorCell, String> {
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let (actor, _) = ractor::Actor::spawn_linked(None, FleetActor, generation, root)
            .await
            .map_err(|e| e.to_string())?;
        *self.actor.lock().unwrap() = actor.clone();
        Ok(actor.get_cell())
    }
}

impl tonic::server::NamedService for FleetService {
    const NAME: &'static str = "toolmesh.test.Fleet";
}

impl tower::Service<http::Request<tonic::body::Body>> for FleetService {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let ping = FleetPing(self.0.clone());
        Box::pin(async move {
            Ok(tonic::server::Grpc::new(FleetCodec::default()).unary(ping, request).await)
        })
    }
}

impl tonic::server::UnaryService<String> for FleetPing {
    type Response = String;
    type Future =
        futures::future::BoxFuture<'static, Result<tonic::Response<String>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<String>) -> Self::Future {
        let actors = self.0.clone();
        Box::pin(async move {
            let generation =
                actors.ping().await.ok_or_else(|| tonic::Status::unavailable("no actor"))?;
            Ok(tonic::Response::new(format!("{} from actor {generation}", request.into_inner())))
        })
    }
}

/// One backend more is its plug-in and one line: the app checks its section, supervises
/// its actor, serves its gRPC service with a health entry, starts its provider, publishes
/// its health to gRPC health (`toolmesh.<kind>.<name>`) and to ListTools, hands it every
/// reload, and stops it.
#[tokio::test]
async fn a_plugin_is_checked_supervised_served_watched_reloaded_and_stopped_like_the_built_in_ones()
{
    use tonic_health::pb::health_check_response::ServingStatus;
    let (made, made_rx) = std::sync::mpsc::channel::<Arc<FleetProvider>>();
    let plugins: Vec<Box<dyn toolmesh::Plugin>> = vec![Box::new(FleetPlugin { made })];
    let section = "[fleet]\ntool = \"fleet_ping\"\n";
    let server =
        TestServer::start(section, AppOptions { plugins, ..Default::default() }).await.unwrap();
    let fleet = made_rx.recv().unwrap();

    let status = |service: &'static str| server.health(service);
    let entries = [
        "toolmesh.remote.fleet",
        "toolmesh.actor.fleet",
        "toolmesh.test.Fleet",
        "toolmesh.local.workers",
        "toolmesh.search.index",
    ];
    for service in entries {
        assert_eq!(status(service).await, Some(ServingStatus::Serving), "{service}");
    }
    let client = server.client().await;
    let listed = || {
        let mut client = client.clone();
        async move {
            let request = ListToolsRequest { source_name: "fleet".into(), ..Default::default() };
            let tools = client.list_tools(request).await.unwrap().into_inner().tools;
            tools.into_iter().next().and_then(|tool| tool.source).unwrap()
        }
    };
    let source = listed().await;
    assert_eq!((source.kind(), source.available), (SourceKind::Remote, true));
    assert_eq!(text(&server.call("fleet_ping", json!({})).await.unwrap()), "from the fleet");

    // Its service is served, behind the same authentication and limits as the API's.
    let ping = || async {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr)).unwrap();
        let mut grpc = tonic::client::Grpc::new(channel.connect().await.unwrap());
        grpc.ready().await.unwrap();
        let path = http::uri::PathAndQuery::from_static("/toolmesh.test.Fleet/Ping");
        let request = tonic::Request::new("ping".to_owned());
        grpc.unary(request, path, FleetCodec::default()).await.map(|r| r.into_inner())
    };
    assert_eq!(ping().await.unwrap(), "ping from actor 1");

    // Its actor is supervised: killed, it is restarted, and its health shows the restart.
    let (_, cell) = server.app.actors().into_iter().find(|(name, _)| *name == "fleet").unwrap();
    cell.kill();
    let restarted = eventually(Duration::from_secs(5), || async {
        ping().await.ok().filter(|answer| answer == "ping from actor 2")
    })
    .await;
    assert!(restarted.is_some(), "the root restarted the fleet's actor");
    let actor = server.app.health().snapshot();
    let actor = &actor[&("actor".to_owned(), "fleet".to_owned())];
    assert!(actor.up && actor.status.contains("restarted 1 times"), "{actor:?}");

    *fleet.health.lock().unwrap() = toolmesh_core::Health::down("draining");
    fleet.changed.notify_one();
    let down = eventually(Duration::from_secs(5), || async {
        (status("toolmesh.remote.fleet").await == Some(ServingStatus::NotServing)).then_some(())
    })
    .await;
    assert!(down.is_some(), "gRPC health follows the provider");
    let source = listed().await;
    assert_eq!((source.available, source.status.as_str()), (false, "draining"));

    // Its section is its own: parsed into its type, misspelt keys and sections refused
    // before any provider sees the configuration.
    server.app.reload(&TestServer::config(section).unwrap()).await.unwrap();
    assert_eq!(fleet.reloads.load(Ordering::SeqCst), 1);
    let typo = TestServer::config("[fleet]\ntol = \"x\"\n").unwrap();
    let error = format!("{:#}", server.app.reload(&typo).await.unwrap_err());
    assert!(error.contains("test.toml") && error.contains("fleet.tol"), "{error}");
    let unknown = TestServer::config(&format!("{section}[flet]\ntool = \"x\"\n")).unwrap();
    let error = format!("{:#}", server.app.reload(&unknown).await.unwrap_err());
    assert!(error.contains("flet") && error.contains("unknown section"), "{error}");
    assert_eq!(fleet.reloads.load(Ordering::SeqCst), 1, "refused before any provider ran");
    // Its defaults are printed with the built-in ones.
    let defaults = toolmesh_config::defaults_text(&server.app.sections());
    assert!(defaults.contains("[search]") && defaults.contains("# [fleet]"), "{defaults}");

    server.app.shutdown().await;
    assert!(fleet.stopped.load(Ordering::SeqCst), "stopped with the app");
}
