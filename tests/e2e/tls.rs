//! TLS and mutual TLS on the listener, with the real binaries and certificates the tests
//! make: the CLI, grpcurl, the Python client and a worker over TLS; a client certificate
//! as the principal; plaintext, unknown CAs and missing client certificates refused; a
//! rotated certificate served once its file changes.

use std::{path::Path, time::Duration};

use toolmesh_e2e::{
    BinaryServer, BinaryWorker,
    cli::{grpcurl, stderr, stdout},
    eventually,
    pki::{Ca, Pair},
};

/// Runs `toolmesh ARGS…` without the caller's TOOLMESH_* environment.
async fn toolmesh(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(toolmesh_e2e::toolmesh_bin())
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("TOOLMESH_TOKEN")
        .env_remove("TOOLMESH_CA_CERT")
        .env_remove("TOOLMESH_CLIENT_CERT")
        .env_remove("TOOLMESH_CLIENT_KEY")
        .output()
        .await
        .unwrap()
}

fn path(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `[tls]` of `server`, with `client_ca` for mutual TLS.
fn tls_section(server: &Pair, client_ca: Option<&Ca>) -> String {
    let mut section =
        format!("[tls]\ncert = {:?}\nkey = {:?}\n", path(&server.cert), path(&server.key));
    if let Some(ca) = client_ca {
        section.push_str(&format!("client_ca = {:?}\n", path(&ca.cert)));
    }
    section
}

/// `toolmesh tools list` over TLS verified by `ca`, with the client certificate `client`.
async fn list(addr: &str, ca: &Ca, client: Option<&Pair>) -> std::process::Output {
    let mut args = vec!["tools", "list", "--server", addr, "--ca-cert", path(&ca.cert)];
    if let Some(client) = client {
        args.extend(["--cert", path(&client.cert), "--key", path(&client.key)]);
    }
    toolmesh(&args).await
}

#[tokio::test]
async fn tls_serves_the_cli_grpcurl_and_python_and_refuses_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "main");
    let other = Ca::new(dir.path(), "other");
    let server =
        BinaryServer::with_config(&tls_section(&ca.server("server"), None), &[]).await.unwrap();
    let addr = server.addr.to_string();

    let listed = list(&addr, &ca, None).await;
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert!(stdout(&listed).contains("echo"), "{}", stdout(&listed));
    let health = toolmesh(&[
        "health",
        "--server",
        &format!("https://localhost:{}", server.addr.port()),
        "--ca-cert",
        path(&ca.cert),
    ])
    .await;
    assert!(health.status.success(), "{}", stderr(&health));
    assert_eq!(stdout(&health).trim(), "SERVING");

    // Plaintext, and a client that does not trust the server's CA: refused, and said why.
    let plaintext = toolmesh(&["tools", "list", "--server", &addr]).await;
    assert!(!plaintext.status.success());
    assert!(!stdout(&plaintext).contains("echo"));
    let untrusted = list(&addr, &other, None).await;
    assert!(!untrusted.status.success());
    assert!(
        stderr(&untrusted).to_lowercase().contains("certificate"),
        "the error names the certificate: {}",
        stderr(&untrusted)
    );

    // grpcurl: reflection and health over TLS with the test CA.
    let grpcurl = |args: &[&str]| {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        async move { tokio::process::Command::new(grpcurl()).args(&args).output().await.unwrap() }
    };
    let services = grpcurl(&["-cacert", path(&ca.cert), &addr, "list"]).await;
    assert!(stdout(&services).contains("toolmesh.v1.ToolService"), "{}", stderr(&services));
    let check = grpcurl(&["-cacert", path(&ca.cert), &addr, "grpc.health.v1.Health/Check"]).await;
    assert!(stdout(&check).contains("SERVING"), "{}", stderr(&check));
    let plain = grpcurl(&["-plaintext", &addr, "list"]).await;
    assert!(!plain.status.success(), "plaintext is refused: {}", stdout(&plain));

    // The Python client of tests/python (grpcio) with the CA from TOOLMESH_CA_CERT.
    let python_client =
        toolmesh_e2e::python_client(&addr, &[("TOOLMESH_CA_CERT", path(&ca.cert))]).await;
    assert!(
        python_client.status.success(),
        "{}\n{}",
        stdout(&python_client),
        stderr(&python_client)
    );
}

#[tokio::test]
async fn mutual_tls_makes_the_client_certificate_the_principal() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "main");
    let stranger_ca = Ca::new(dir.path(), "stranger");
    let (agent, other, worker) =
        (ca.client("agent.example"), ca.client("other.example"), ca.client("worker.example"));
    let config = format!(
        "{}\n\
         [auth.certificates]\n\
         principals = {{ \"worker.example\" = [\"worker\"] }}\n\
         [policy]\n\
         [[policy.rules]]\n\
         name = \"others-no-echo\"\n\
         effect = \"deny\"\n\
         principals = [\"other.example\"]\n\
         tools = [\"echo\"]\n",
        tls_section(&ca.server("server"), Some(&ca)),
    );
    let server = BinaryServer::with_config(&config, &[]).await.unwrap();
    let addr = server.addr.to_string();

    // The certificate names the principal: the policy tells agent.example from
    // other.example.
    let as_agent = list(&addr, &ca, Some(&agent)).await;
    assert!(as_agent.status.success(), "{}", stderr(&as_agent));
    assert!(stdout(&as_agent).contains("echo"), "{}", stdout(&as_agent));
    let as_other = list(&addr, &ca, Some(&other)).await;
    assert!(as_other.status.success(), "{}", stderr(&as_other));
    assert!(!stdout(&as_other).contains("echo "), "denied to other.example: {}", stdout(&as_other));
    assert!(stdout(&as_other).contains("think"), "{}", stdout(&as_other));

    // No client certificate, or one from a CA the server does not trust: the handshake
    // fails, nothing is listed.
    for (client, what) in
        [(None, "no certificate"), (Some(&stranger_ca.client("agent.example")), "an unknown CA")]
    {
        let refused = list(&addr, &ca, client).await;
        assert!(!refused.status.success(), "{what}: {}", stdout(&refused));
        assert!(!stdout(&refused).contains("echo"), "{what}");
    }

    // The Python client with its certificate (TOOLMESH_CLIENT_CERT, TOOLMESH_CLIENT_KEY).
    let python_client = toolmesh_e2e::python_client(
        &addr,
        &[
            ("TOOLMESH_CA_CERT", path(&ca.cert)),
            ("TOOLMESH_CLIENT_CERT", path(&agent.cert)),
            ("TOOLMESH_CLIENT_KEY", path(&agent.key)),
        ],
    )
    .await;
    assert!(
        python_client.status.success(),
        "{}\n{}",
        stdout(&python_client),
        stderr(&python_client)
    );

    // A worker whose certificate names a principal of the worker role serves its tool;
    // one whose certificate names another is refused.
    let tool = "[[tools.command]]\nname = \"word_count\"\ndescription = \"counts words\"\n\
                command = \"sh\"\nargs = [\"-c\", \"echo '{\\\"words\\\": 3}'\"]\n\
                [tools.command.parameters]\ntype = \"object\"\n";
    let tls_args = |pair: &Pair| {
        vec![
            "--ca-cert".to_owned(),
            path(&ca.cert).to_owned(),
            "--cert".to_owned(),
            path(&pair.cert).to_owned(),
            "--key".to_owned(),
            path(&pair.key).to_owned(),
        ]
    };
    let router = format!("localhost:{}", server.addr.port());
    let agent_args = tls_args(&agent);
    let refused = BinaryWorker::start(
        &router,
        tool,
        &agent_args.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .unwrap();
    let said = eventually(Duration::from_secs(20), || async {
        refused.logs().contains("may not serve tools").then_some(())
    })
    .await;
    assert!(said.is_some(), "{}", refused.logs());
    drop(refused);
    let worker_args = tls_args(&worker);
    let served = BinaryWorker::start(
        &router,
        tool,
        &worker_args.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .unwrap();
    served.joined(1).await.unwrap();
    let listed = list(&addr, &ca, Some(&agent)).await;
    assert!(stdout(&listed).contains("word_count"), "{}", stdout(&listed));
}

#[tokio::test]
async fn a_rotated_certificate_is_served_once_its_file_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (Ca::new(dir.path(), "first"), Ca::new(dir.path(), "second"));
    let served = first.server("served");
    // The shipped reload poll (server.reload_poll_ms) notices the certificate's files.
    let server = BinaryServer::with_config(&tls_section(&served, None), &[]).await.unwrap();
    let addr = server.addr.to_string();
    assert!(list(&addr, &first, None).await.status.success());
    assert!(!list(&addr, &second, None).await.status.success());

    // A certificate of the second CA replaces the files, as a certificate manager would.
    let rotated = second.server("rotated");
    std::fs::copy(&rotated.key, &served.key).unwrap();
    std::fs::copy(&rotated.cert, &served.cert).unwrap();
    let switched = eventually(Duration::from_secs(20), || async {
        list(&addr, &second, None).await.status.success().then_some(())
    })
    .await;
    assert!(switched.is_some(), "the new certificate is served: {}", server.logs());
    assert!(!list(&addr, &first, None).await.status.success(), "and the old one no more");
}

#[tokio::test]
async fn a_bad_tls_section_names_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "main");
    let (one, two) = (ca.server("one"), ca.server("two"));
    let check = |toml: String| {
        let file = dir.path().join("check.toml");
        async move {
            std::fs::write(&file, toml).unwrap();
            toolmesh(&["config", "check", path(&file)]).await
        }
    };
    let missing = Pair { cert: dir.path().join("missing.pem"), key: one.key.clone() };
    let output = check(tls_section(&missing, None)).await;
    assert!(!output.status.success());
    assert!(stderr(&output).contains("tls.cert"), "{}", stderr(&output));
    assert!(stderr(&output).contains("missing.pem"), "{}", stderr(&output));
    let mismatched = Pair { cert: one.cert.clone(), key: two.key.clone() };
    let output = check(tls_section(&mismatched, None)).await;
    assert!(!output.status.success());
    assert!(stderr(&output).contains("tls.key"), "{}", stderr(&output));
    let output = check(tls_section(&one, None)).await;
    assert!(output.status.success(), "{}", stderr(&output));
}
