//! Credentials with the real binaries: keys made by `toolmesh auth new-key`, the CLI with
//! `--token` and `TOOLMESH_TOKEN`, grpcurl on health and reflection without one, the Python
//! client, and workers (Rust and Python) that need the worker role.

use std::{path::Path, time::Duration};

use tonic::Code;
use toolmesh_e2e::{BinaryServer, BinaryWorker, eventually, python, text};
use toolmesh_proto::v1::CallToolRequest;

use super::{grpcurl, run, stderr, stdout};

/// Runs `toolmesh auth new-key`; returns (key, the configuration block).
async fn new_key(principal: &str, roles: &[&str]) -> (String, String) {
    let mut args = vec!["auth", "new-key", "--principal", principal];
    for role in roles {
        args.extend(["--role", role]);
    }
    let output = run(&args).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let key = stderr(&output).rsplit(' ').next().unwrap().trim().to_owned();
    assert!(key.starts_with("tm_"), "{}", stderr(&output));
    assert!(!stdout(&output).contains(&key), "the configuration holds only the digest");
    (key, stdout(&output))
}

/// Runs `toolmesh ARGS…` with extra environment `env`.
async fn run_env(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    tokio::process::Command::new(toolmesh_e2e::toolmesh_bin())
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("TOOLMESH_TOKEN")
        .envs(env.iter().copied())
        .output()
        .await
        .unwrap()
}

async fn word_count(addr: &str, token: &str) -> Result<String, tonic::Status> {
    let mut client = toolmesh::client::connect(addr, Some(token)).await.unwrap();
    let request = CallToolRequest {
        name: "word_count".into(),
        arguments_json: r#"{"text": "one two three"}"#.into(),
        ..Default::default()
    };
    let response = client.call_tool(request).await?.into_inner();
    Ok(format!("{} {}", response.structured_json.clone().unwrap_or_default(), text(&response)))
}

#[tokio::test]
async fn the_cli_grpcurl_and_python_clients_authenticate_with_a_token() {
    let (agent, agent_entry) = new_key("agent", &["user"]).await;
    let server = BinaryServer::with_config(&agent_entry, &[]).await.unwrap();
    let addr = server.addr.to_string();

    let refused = run_env(&["tools", "list", "--server", &addr], &[]).await;
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("requires a credential"), "{}", stderr(&refused));
    assert!(!stdout(&refused).contains("echo"), "nothing is listed: {}", stdout(&refused));

    let listed = run_env(&["tools", "list", "--server", &addr, "--token", &agent], &[]).await;
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert!(stdout(&listed).contains("echo"), "{}", stdout(&listed));

    let called = run_env(
        &["call", "echo", r#"{"via": "env"}"#, "--server", &addr],
        &[("TOOLMESH_TOKEN", &agent)],
    )
    .await;
    assert!(called.status.success(), "{}", stderr(&called));
    assert!(stdout(&called).contains("env"), "{}", stdout(&called));

    let wrong =
        run_env(&["call", "echo", "{}", "--server", &addr, "--token", "tm_nope"], &[]).await;
    assert!(!wrong.status.success());
    assert!(stderr(&wrong).contains("not valid"), "{}", stderr(&wrong));
    assert!(
        !stderr(&wrong).contains("tm_nope"),
        "the credential is not echoed: {}",
        stderr(&wrong)
    );

    // Health (the CLI and grpcurl) and reflection need no credential; the API does.
    let health = run_env(&["health", "--server", &addr], &[]).await;
    assert!(health.status.success(), "{}", stderr(&health));
    let grpcurl = |args: Vec<String>| async move {
        tokio::process::Command::new(grpcurl()).args(&args).output().await.unwrap()
    };
    let list = grpcurl(vec!["-plaintext".into(), addr.clone(), "list".into()]).await;
    assert!(stdout(&list).contains("toolmesh.v1.ToolService"), "{}", stderr(&list));
    let check =
        grpcurl(vec!["-plaintext".into(), addr.clone(), "grpc.health.v1.Health/Check".into()])
            .await;
    assert!(stdout(&check).contains("SERVING"), "{}", stderr(&check));
    let api = grpcurl(vec![
        "-plaintext".into(),
        addr.clone(),
        "toolmesh.v1.ToolService/ListTools".into(),
    ])
    .await;
    assert!(!api.status.success());
    assert!(stderr(&api).contains("Unauthenticated"), "{}", stderr(&api));
    let with_key = grpcurl(vec![
        "-plaintext".into(),
        "-H".into(),
        format!("authorization: Bearer {agent}"),
        addr.clone(),
        "toolmesh.v1.ToolService/ListTools".into(),
    ])
    .await;
    assert!(stdout(&with_key).contains("echo"), "{}", stderr(&with_key));

    // The Python client of tests/python with TOOLMESH_TOKEN.
    let python_client = toolmesh_e2e::python_client(&addr, &[("TOOLMESH_TOKEN", &agent)]).await;
    assert!(
        python_client.status.success(),
        "{}\n{}",
        stdout(&python_client),
        stderr(&python_client)
    );
    let without = toolmesh_e2e::python_client(&addr, &[]).await;
    assert!(!without.status.success());
    assert!(stderr(&without).contains("UNAUTHENTICATED"), "{}", stderr(&without));
}

#[tokio::test]
async fn a_worker_serves_tools_only_with_a_credential_of_the_worker_role() {
    let (agent, agent_entry) = new_key("agent", &["user"]).await;
    let (worker_key, worker_entry) = new_key("worker-1", &["worker"]).await;
    let server =
        BinaryServer::with_config(&format!("{agent_entry}\n{worker_entry}"), &[]).await.unwrap();
    let addr = server.addr.to_string();
    let tool = "[[tools.command]]\nname = \"word_count\"\ndescription = \"counts words\"\n\
                command = \"sh\"\nargs = [\"-c\", \"echo '{\\\"words\\\": 3}'\"]\n\
                [tools.command.parameters]\ntype = \"object\"\n";

    // No credential, then an agent's credential without the worker role: refused, named.
    let anonymous = BinaryWorker::start(&addr, tool, &[]).unwrap();
    let agent_worker = BinaryWorker::start(&addr, tool, &["--token", &agent]).unwrap();
    let refused = eventually(Duration::from_secs(20), || async {
        (anonymous.logs().contains("requires a credential")
            && agent_worker.logs().contains("may not serve tools"))
        .then_some(())
    })
    .await;
    assert!(refused.is_some(), "{}\n---\n{}", anonymous.logs(), agent_worker.logs());
    assert!(!agent_worker.logs().contains(&agent), "the credential is not logged");
    assert_eq!(word_count(&addr, &agent).await.unwrap_err().code(), Code::NotFound);
    drop((anonymous, agent_worker));

    // The worker role's key from the environment: the tool is served.
    let worker =
        BinaryWorker::start_with_env(&addr, tool, &[], &[("TOOLMESH_TOKEN", &worker_key)]).unwrap();
    worker.joined(1).await.unwrap();
    assert!(word_count(&addr, &agent).await.unwrap().contains('3'));
    drop(worker);

    // The Python example worker with TOOLMESH_TOKEN.
    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../services/python-worker/example.py");
    let _python_worker = tokio::process::Command::new(python())
        .arg(&example)
        .arg(&addr)
        .env("TOOLMESH_TOKEN", &worker_key)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let served = eventually(Duration::from_secs(30), || async {
        word_count(&addr, &agent).await.ok().filter(|out| out.contains('3'))
    })
    .await;
    let served = served.expect("the Python worker serves word_count with its token");
    let compact = served.replace(' ', "");
    assert!(compact.contains("\"caller\":\"agent\""), "the worker is told who calls: {served}");
}

/// A worker's key removed by a reload ends its session: its tools go at once, and it is
/// refused when it comes back with the same key.
#[tokio::test]
async fn a_revoked_worker_key_ends_the_workers_session_on_reload() {
    let (agent, agent_entry) = new_key("agent", &["user"]).await;
    let (worker_key, worker_entry) = new_key("worker-1", &["worker"]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmesh.toml");
    std::fs::write(&config, format!("{agent_entry}\n{worker_entry}")).unwrap();
    let server = BinaryServer::start(&["--config", config.to_str().unwrap()], &[]).await.unwrap();
    let addr = server.addr.to_string();
    let tool = "[[tools.command]]\nname = \"word_count\"\ndescription = \"counts words\"\n\
                command = \"sh\"\nargs = [\"-c\", \"echo '{\\\"words\\\": 3}'\"]\n\
                [tools.command.parameters]\ntype = \"object\"\n";
    let worker = BinaryWorker::start(&addr, tool, &["--token", &worker_key]).unwrap();
    worker.joined(1).await.unwrap();
    assert!(word_count(&addr, &agent).await.unwrap().contains('3'));

    std::fs::write(&config, &agent_entry).unwrap();
    server.signal(nix::sys::signal::Signal::SIGHUP);
    let gone = eventually(Duration::from_secs(10), || async {
        (word_count(&addr, &agent).await.err()?.code() == Code::NotFound).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the revoked worker still serves:\n{}", worker.logs());
    let refused =
        eventually(Duration::from_secs(20), || async {
            worker.logs().contains("UNAUTHENTICATED").then_some(()).or_else(|| {
                worker.logs().to_lowercase().contains("refused the worker").then_some(())
            })
        })
        .await;
    assert!(refused.is_some(), "{}", worker.logs());
    assert!(server.logs().contains("credential was revoked"), "{}", server.logs());
}

/// Calls in flight under a key a reload removes end with UNAUTHENTICATED naming the
/// revocation, streamed or not; another key's call in flight goes on.
#[tokio::test]
async fn a_revoked_key_ends_its_calls_in_flight_on_reload() {
    use futures::StreamExt as _;
    use toolmesh_proto::v1::{CallToolClientMessage, call_tool_client_message};
    let (alice, alice_entry) = new_key("alice", &["user"]).await;
    let (bob, bob_entry) = new_key("bob", &["user"]).await;
    let slow = "[[tools.command]]\nname = \"slow\"\ndescription = \"takes its time\"\n\
                command = \"sh\"\nargs = [\"-c\", \"sleep 60; echo '{}'\"]\n\
                [tools.command.parameters]\ntype = \"object\"\n";
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmesh.toml");
    std::fs::write(&config, format!("{alice_entry}\n{bob_entry}\n{slow}")).unwrap();
    let server = BinaryServer::start(&["--config", config.to_str().unwrap()], &[]).await.unwrap();
    let addr = server.addr.to_string();
    let slow = || CallToolRequest {
        name: "slow".into(),
        arguments_json: "{}".into(),
        ..Default::default()
    };
    let stream = |token: String| {
        let (addr, start) = (addr.clone(), slow());
        async move {
            let mut client = toolmesh::client::connect(&addr, Some(&token)).await.unwrap();
            let start = CallToolClientMessage {
                message: Some(call_tool_client_message::Message::Start(start)),
            };
            let outbound = futures::stream::iter([start]).chain(futures::stream::pending());
            let mut inbound = client.stream_call_tool(outbound).await.unwrap().into_inner();
            inbound.message().await.unwrap().expect("the call starts");
            inbound
        }
    };
    let mut alices_stream = stream(alice.clone()).await;
    let mut bobs_stream = stream(bob.clone()).await;
    let mut unary = toolmesh::client::connect(&addr, Some(&alice)).await.unwrap();
    let alices_call = tokio::spawn(async move { unary.call_tool(slow()).await });
    tokio::time::sleep(Duration::from_millis(500)).await;

    std::fs::write(
        &config,
        format!(
            "{bob_entry}\n[[tools.command]]\nname = \"slow\"\n\
        description = \"takes its time\"\ncommand = \"sh\"\n\
        args = [\"-c\", \"sleep 60; echo '{{}}'\"]\n[tools.command.parameters]\ntype = \"object\"\n"
        ),
    )
    .unwrap();
    server.signal(nix::sys::signal::Signal::SIGHUP);
    let ended = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match alices_stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the stream ended without a status"),
                Err(status) => return status,
            }
        }
    })
    .await
    .expect("the revoked stream ends");
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    assert!(ended.message().contains("revoked"), "{ended:?}");
    let ended = tokio::time::timeout(Duration::from_secs(5), alices_call)
        .await
        .expect("the revoked call ends")
        .unwrap()
        .unwrap_err();
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    assert!(ended.message().contains("revoked"), "{ended:?}");

    let bobs = tokio::time::timeout(Duration::from_secs(2), bobs_stream.message()).await;
    assert!(bobs.is_err(), "bob's call goes on: {bobs:?}");
    assert!(server.logs().contains("credential is no longer accepted"), "{}", server.logs());
}

#[tokio::test]
async fn keys_are_added_and_revoked_by_a_reload_without_a_restart() {
    let (first, first_entry) = new_key("first", &[]).await;
    let (second, second_entry) = new_key("second", &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmesh.toml");
    std::fs::write(&config, &first_entry).unwrap();
    let server = BinaryServer::start(&["--config", config.to_str().unwrap()], &[]).await.unwrap();
    let addr = server.addr.to_string();
    let lists = |token: String| {
        let addr = addr.clone();
        async move {
            let mut client = toolmesh::client::connect(&addr, Some(&token)).await.unwrap();
            client.list_tools(toolmesh_proto::v1::ListToolsRequest::default()).await.map(drop)
        }
    };
    lists(first.clone()).await.unwrap();
    assert_eq!(lists(second.clone()).await.unwrap_err().code(), Code::Unauthenticated);

    // The file now accepts the second key only: the change is picked up by itself.
    std::fs::write(&config, &second_entry).unwrap();
    let swapped = eventually(Duration::from_secs(20), || async {
        (lists(second.clone()).await.is_ok()
            && lists(first.clone()).await.is_err_and(|s| s.code() == Code::Unauthenticated))
        .then_some(())
    })
    .await;
    assert!(swapped.is_some(), "{}", server.logs());
}

/// A worker's HTTP tool sends the caller's own upstream secret, from the worker's own
/// `[credentials]`: the router tells the worker who calls (never the caller's credential).
#[tokio::test]
async fn a_worker_s_http_tool_sends_the_caller_s_own_secret() {
    let (alice, alice_entry) = new_key("alice", &["user"]).await;
    let (bob, bob_entry) = new_key("bob", &["user"]).await;
    let (worker_key, worker_entry) = new_key("worker-1", &["worker"]).await;
    let server =
        BinaryServer::with_config(&format!("{alice_entry}\n{bob_entry}\n{worker_entry}"), &[])
            .await
            .unwrap();
    let addr = server.addr.to_string();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let log = seen.clone();
    let upstream = toolmesh_e2e::serve_http(axum::Router::new().route(
        "/svc",
        axum::routing::get(move |headers: axum::http::HeaderMap| {
            let log = log.clone();
            async move {
                let value = headers.get("authorization").map(|v| v.to_str().unwrap().to_owned());
                log.lock().unwrap().push(value.unwrap_or_default());
                "ok"
            }
        }),
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("alice");
    std::fs::write(&secret, "alice-upstream-secret").unwrap();
    let tool = format!(
        "[credentials.svc]\nprincipals.alice = {{ file = {:?} }}\n\
         [[tools.http]]\nname = \"svc\"\ndescription = \"a service\"\n\
         url = \"http://{upstream}/svc\"\nallow_private_network = true\ncredentials = [\"svc\"]\n",
        secret.display().to_string()
    );
    let worker = BinaryWorker::start(&addr, &tool, &["--token", &worker_key]).unwrap();
    worker.joined(1).await.unwrap();
    let call = |token: String| {
        let addr = addr.clone();
        async move {
            let mut client = toolmesh::client::connect(&addr, Some(&token)).await.unwrap();
            let request = CallToolRequest { name: "svc".into(), ..Default::default() };
            client.call_tool(request).await.map(|r| r.into_inner())
        }
    };
    let answered = call(alice).await.unwrap();
    assert!(!answered.is_error, "{answered:?}");
    assert_eq!(*seen.lock().unwrap(), ["Bearer alice-upstream-secret"]);
    let refused = call(bob).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("bob"), "{}", refused.message());
    assert_eq!(seen.lock().unwrap().len(), 1, "no request for bob");
}
