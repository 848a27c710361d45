//! The deployment files, checked without a cluster or a container engine: the kustomize
//! base and production overlay rendered by a real kustomize (`kubectl kustomize`) and
//! validated with `kubernetes-validate --strict`, the compose file by `docker-compose
//! config`, and `toolmesh health`, which their health checks run; the shipped router and
//! worker files run as a router and a worker.

use std::{path::PathBuf, process::Output, time::Duration};

use tokio::process::Command;
use toolmesh_e2e::{BinaryServer, BinaryWorker, cli, eventually};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

async fn run(program: &str, args: &[&str]) -> Output {
    run_env(program, args, &[]).await
}

/// [`run`] with `env` set (a value of `None` removes the variable).
async fn run_env(program: &str, args: &[&str], env: &[(&str, Option<&str>)]) -> Output {
    let mut command = Command::new(program);
    command.args(args).current_dir(root());
    for (name, value) in env {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    command
        .output()
        .await
        .unwrap_or_else(|e| panic!("{program} runs (tests/setup installs it): {e}"))
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test]
async fn the_kustomizations_render_and_validate_strictly() {
    let dir = tempfile::tempdir().unwrap();
    for kustomization in ["deploy/k8s/base", "deploy/k8s/overlays/production"] {
        let rendered = run("kubectl", &["kustomize", kustomization]).await;
        assert!(rendered.status.success(), "{kustomization}: {}", text(&rendered));
        let file = dir.path().join(kustomization.replace('/', "_") + ".yaml");
        std::fs::write(&file, &rendered.stdout).unwrap();
        let checked =
            run("kubernetes-validate", &["--strict", "--quiet", file.to_str().unwrap()]).await;
        assert!(checked.status.success(), "{kustomization}: {}", text(&checked));
    }
    let production =
        std::fs::read_to_string(dir.path().join("deploy_k8s_overlays_production.yaml")).unwrap();
    for kind in [
        "kind: Deployment",
        "kind: StatefulSet",
        "kind: HorizontalPodAutoscaler",
        "kind: PodDisruptionBudget",
        "kind: ConfigMap",
        "clusterIP: None",
        "volumeClaimTemplates:",
        "startupProbe:",
        "readinessProbe:",
        "livenessProbe:",
        "service: toolmesh.v1.ToolService",
        // the worker's liveness, which a router outage does not fail
        "service: liveness",
        "toolmesh-router-headless:50051",
        "replicas: 3",
    ] {
        assert!(production.contains(kind), "the production overlay has {kind}:\n{production}");
    }
    // The token key comes from a Secret the operator creates: no key ships in the files.
    assert!(!production.contains("kind: Secret"), "{production}");
    assert!(
        production.contains("name: toolmesh-routing"),
        "the routers read the operator's Secret"
    );
    assert!(!production.contains("change-me"), "{production}");
    // Callers and workers authenticate with the keys of the operator's Secret toolmesh-keys.
    assert!(production.contains("name: toolmesh-keys"), "{production}");
    for key in ["key: agent-key", "key: worker-key", "name: TOOLMESH_TOKEN"] {
        assert!(production.contains(key), "the pods read {key}");
    }
    // Locked down: every pod under the runtime's seccomp profile, as a user, read-only; and
    // NetworkPolicies that select the pods by the label they carry.
    let pods = production.matches("\n  template:\n").count();
    assert_eq!(pods, 3, "the router, the worker and Qdrant");
    assert_eq!(production.matches("type: RuntimeDefault").count(), pods, "{production}");
    assert_eq!(production.matches("runAsNonRoot: true").count(), pods, "{production}");
    assert_eq!(production.matches("readOnlyRootFilesystem: true").count(), pods);
    assert_eq!(production.matches("allowPrivilegeEscalation: false").count(), pods);
    assert_eq!(production.matches("kind: NetworkPolicy").count(), 4, "{production}");
    // Prometheus scrapes the routers and workers; workers scale on the calls waiting for them.
    assert_eq!(production.matches("prometheus.io/scrape: \"true\"").count(), 2, "{production}");
    assert!(production.contains("name: toolmesh_remote_pending"), "{production}");
    for template in production.split("\n  template:\n").skip(1) {
        let labels = template.split("spec:").next().unwrap();
        assert!(labels.contains("app.kubernetes.io/part-of: toolmesh"), "{labels}");
    }
    // Kubernetes waits longer than toolmesh's own grace period, so SIGTERM drains first.
    let config = std::fs::read_to_string(root().join("deploy/k8s/base/router.toml")).unwrap();
    let grace_ms: u64 = config
        .lines()
        .find_map(|l| l.strip_prefix("shutdown_grace_ms = "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    let graces: Vec<&str> = production
        .lines()
        .filter(|l| l.trim_start().starts_with("terminationGracePeriodSeconds:"))
        .collect();
    assert_eq!(graces.len(), 2, "the router and the worker set their grace");
    for line in graces {
        let seconds: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(seconds * 1000 > grace_ms, "{line} vs shutdown_grace_ms = {grace_ms}");
    }
}

/// The Qdrant version the server tests run against (tests/run).
fn tested_qdrant() -> String {
    let run = std::fs::read_to_string(root().join("tests/run")).unwrap();
    let version = run.lines().find_map(|l| l.strip_prefix("qdrant_version=")).unwrap();
    format!("qdrant/qdrant:v{}", version.trim())
}

#[tokio::test]
async fn the_deploy_files_pin_the_qdrant_the_tests_ran() {
    let tested = tested_qdrant();
    for file in ["docker-compose.yml", "deploy/k8s/base/qdrant.yaml"] {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        let images: Vec<&str> =
            text.lines().filter_map(|l| l.trim().strip_prefix("image: qdrant/")).collect();
        assert_eq!(images.len(), 1, "{file} runs one Qdrant");
        assert_eq!(format!("qdrant/{}", images[0]), tested, "{file}");
    }
}

#[tokio::test]
async fn the_compose_file_is_valid() {
    const KEYS: [&str; 3] = ["TOOLMESH_TOKEN_KEY", "TOOLMESH_AGENT_KEY", "TOOLMESH_WORKER_KEY"];
    let compose_config = |without: Option<&'static str>| async move {
        let env: Vec<_> = KEYS
            .iter()
            .map(|k| (*k, (Some(*k) != without).then_some("a key of one's own")))
            .collect();
        run_env("docker-compose", &["-f", "docker-compose.yml", "config", "-q"], &env).await
    };
    let checked = compose_config(None).await;
    assert!(checked.status.success(), "{}", text(&checked));
    // Without a key of the operator's own, compose refuses to start, saying what to set.
    for key in KEYS {
        let keyless = compose_config(Some(key)).await;
        assert!(!keyless.status.success(), "{}", text(&keyless));
        assert!(text(&keyless).contains(&format!("set {key}")), "{}", text(&keyless));
    }
    let compose = std::fs::read_to_string(root().join("docker-compose.yml")).unwrap();
    // Traces go to the collector unless told otherwise.
    assert!(compose.contains(
        "OTEL_EXPORTER_OTLP_ENDPOINT: ${OTEL_EXPORTER_OTLP_ENDPOINT:-http://otel-collector:4317}"
    ));
    for service in ["router:", "worker:", "qdrant:", "otel-collector:", "jaeger:"] {
        assert!(compose.contains(&format!("\n  {service}")), "compose runs {service}");
    }
}

#[tokio::test]
async fn toolmesh_health_exits_by_status() {
    let server =
        BinaryServer::start(&[], &[("TOOLMESH__SEARCH__EMBEDDINGS", "false")]).await.unwrap();
    let addr = server.addr.to_string();
    let bin = toolmesh_e2e::toolmesh_bin();
    let bin = bin.to_str().unwrap();
    let serving = run(bin, &["health", "--server", &addr]).await;
    assert_eq!(serving.status.code(), Some(0), "{}", text(&serving));
    assert_eq!(String::from_utf8_lossy(&serving.stdout).trim(), "SERVING");
    let api =
        run(bin, &["health", "--server", &addr, "--service", "toolmesh.v1.ToolService"]).await;
    assert_eq!(api.status.code(), Some(0), "{}", text(&api));
    // Lexical search only: the embeddings entry is NOT_SERVING.
    let embeddings =
        run(bin, &["health", "--server", &addr, "--service", "toolmesh.search.embeddings"]).await;
    assert_eq!(embeddings.status.code(), Some(1), "{}", text(&embeddings));
    assert_eq!(String::from_utf8_lossy(&embeddings.stdout).trim(), "NOT_SERVING");
    let unknown =
        run(bin, &["health", "--server", &addr, "--service", "toolmesh.remote.none"]).await;
    assert_eq!(unknown.status.code(), Some(1), "{}", text(&unknown));
    assert_eq!(String::from_utf8_lossy(&unknown.stdout).trim(), "SERVICE_UNKNOWN");
    drop(server);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = listener.local_addr().unwrap().to_string();
    drop(listener);
    let unreachable = run(bin, &["health", "--server", &closed, "--timeout-ms", "2000"]).await;
    assert_eq!(unreachable.status.code(), Some(2), "{}", text(&unreachable));
}

/// A key as `openssl rand -hex 32` makes them, as the deploy files say to.
fn random_key() -> String {
    let mut bytes = [0u8; 32];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut bytes)
        .unwrap();
    bytes.iter().map(|b| format!("{b:02x}")).fold(String::from("tm_"), |key, b| key + &b)
}

#[tokio::test]
async fn the_shipped_router_and_worker_authenticate_callers_and_workers() {
    let (agent, worker_key) = (random_key(), random_key());
    let router_file = root().join("deploy/k8s/base/router.toml").display().to_string();
    let token_key = random_key();
    // As the pods run them, but with the embedded store (no Qdrant server at qdrant:6334)
    // and the metrics on a loopback port of their own.
    let metrics = ("TOOLMESH__TELEMETRY__METRICS_LISTEN", "127.0.0.1:0");
    let env = [
        ("TOOLMESH_AGENT_KEY", agent.as_str()),
        ("TOOLMESH_WORKER_KEY", worker_key.as_str()),
        ("TOOLMESH__ROUTING__TOKEN_KEY", token_key.as_str()),
        ("TOOLMESH__VECTOR__BACKEND", "embedded"),
        metrics,
    ];
    let router = BinaryServer::start(&["--config", &router_file], &env).await.unwrap();
    let addr = router.addr.to_string();

    // A caller without a key is refused; the agents' key lists the catalog.
    let open = cli::run(&["tools", "list", "--server", &addr]).await;
    assert!(!open.status.success(), "{}", cli::stdout(&open));
    assert!(cli::stderr(&open).contains("requires a credential"), "{}", cli::stderr(&open));
    let listed = cli::run(&["tools", "list", "--server", &addr, "--token", &agent]).await;
    assert!(listed.status.success(), "{}", cli::stderr(&listed));

    // The shipped worker joins with the workers' key, and its tool serves the agents.
    let worker_file = std::fs::read_to_string(root().join("deploy/k8s/base/worker.toml")).unwrap();
    let worker = BinaryWorker::start_with_env(
        &addr,
        &worker_file,
        &[],
        &[("TOOLMESH_TOKEN", &worker_key), metrics],
    )
    .unwrap();
    worker.joined(1).await.unwrap();
    let names = || async {
        let listed = cli::run(&["tools", "list", "--server", &addr, "--token", &agent]).await;
        cli::stdout(&listed).contains("disk_usage").then_some(())
    };
    eventually(Duration::from_secs(20), names).await.expect("the worker's tool is listed");
    let called =
        cli::run(&["call", "disk_usage", "{}", "--server", &addr, "--token", &agent]).await;
    assert!(called.status.success(), "{}", cli::stderr(&called));
    assert!(cli::stdout(&called).contains("Filesystem"), "{}", cli::stdout(&called));

    // The agents' key is no worker's: a worker with it is refused.
    let intruder = BinaryWorker::start_with_env(
        &addr,
        &worker_file,
        &[],
        &[("TOOLMESH_TOKEN", &agent), metrics],
    )
    .unwrap();
    let refused = eventually(Duration::from_secs(20), || async {
        intruder.logs().contains("needs the role \"worker\"").then_some(())
    })
    .await;
    assert!(refused.is_some(), "{}", intruder.logs());
    drop(router);

    // A router given a key from the documentation, or none, does not start, naming it.
    for (value, says) in [(Some("change-me"), "at least 32"), (None, "is not set")] {
        let mut env = env.to_vec();
        env.retain(|(name, _)| *name != "TOOLMESH_AGENT_KEY");
        if let Some(value) = value {
            env.push(("TOOLMESH_AGENT_KEY", value));
        }
        let mut command = Command::new(toolmesh_e2e::toolmesh_bin());
        command.args(["serve", "--listen", "127.0.0.1:0", "--config", &router_file]);
        command.env_remove("TOOLMESH_AGENT_KEY").envs(env.iter().copied());
        let data = tempfile::tempdir().unwrap();
        command.arg("--data-dir").arg(data.path());
        let output = tokio::time::timeout(Duration::from_secs(30), command.output())
            .await
            .expect("a router with a bad key exits")
            .unwrap();
        assert!(!output.status.success());
        let said = text(&output);
        assert!(said.contains("TOOLMESH_AGENT_KEY") && said.contains(says), "{said}");
        assert!(said.contains("auth.api_keys[0].key_env"), "{said}");
    }
}
