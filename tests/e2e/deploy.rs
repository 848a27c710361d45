//! The deployment files, checked without a cluster or a container engine: the kustomize
//! base and production overlay rendered by a real kustomize (`kubectl kustomize`) and
//! validated with `kubernetes-validate --strict`, the compose file by `docker-compose
//! config`, and `toolmesh health`, which their health checks run.

use std::{path::PathBuf, process::Output};

use tokio::process::Command;
use toolmesh_e2e::BinaryServer;

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

#[tokio::test]
async fn the_compose_file_is_valid() {
    let compose_config = |key: Option<&'static str>| async move {
        let env = [("TOOLMESH_TOKEN_KEY", key)];
        run_env("docker-compose", &["-f", "docker-compose.yml", "config", "-q"], &env).await
    };
    let checked = compose_config(Some("a key of the operator's own")).await;
    assert!(checked.status.success(), "{}", text(&checked));
    // Without a key of the operator's own, compose refuses to start, saying what to set.
    let keyless = compose_config(None).await;
    assert!(!keyless.status.success(), "{}", text(&keyless));
    assert!(text(&keyless).contains("set TOOLMESH_TOKEN_KEY"), "{}", text(&keyless));
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
