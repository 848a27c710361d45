//! Authentication through the real gRPC API: API keys and JWTs from the configuration,
//! `UNAUTHENTICATED` and nothing else without a valid credential, health open, the
//! principal carried to the tool. With the real binaries: keys made by `toolmesh auth
//! new-key`, the CLI with `--token` and `TOOLMESH_TOKEN`, grpcurl on health and reflection
//! without one, the Python client, and workers (Rust and Python) that need the worker role.

use std::{
    path::Path,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use tonic::{Code, Request};
use tonic_health::pb::health_check_response::ServingStatus;
use toolmesh::AppOptions;
use toolmesh_e2e::{
    BinaryServer, BinaryWorker, TestServer,
    cli::{grpcurl, run, stderr, stdout},
    eventually, python, text,
    tools::WhoAmITool,
};
use toolmesh_proto::v1::{
    CallToolClientMessage, CallToolRequest, ListCollectionsRequest, ListToolsRequest,
    SearchToolsRequest, call_tool_client_message, knowledge_service_client::KnowledgeServiceClient,
    tool_service_client::ToolServiceClient,
};
use toolmesh_workers::ToolLimits;

const ISSUER: &str = "https://idp.test/";
const AUDIENCE: &str = "toolmesh";

/// A server requiring credentials: one API key (alice, role `admin`) and ES256 tokens
/// verified with a public key file. Returns it with the key and the token signer.
async fn secured(extra: &str) -> (TestServer, String, EncodingKey, tempfile::TempDir) {
    let key = toolmesh_identity::new_key();
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let public = dir.path().join("issuer.pem");
    std::fs::write(&public, pair.public_key_pem()).unwrap();
    let toml = format!(
        r#"
        [[auth.api_keys]]
        principal = "alice"
        sha256 = "{digest}"
        roles = ["admin"]

        [[auth.jwt]]
        issuer = "{ISSUER}"
        audiences = ["{AUDIENCE}"]
        public_key_file = "{public}"
        {extra}
        "#,
        digest = toolmesh_identity::key_digest(&key),
        public = public.display(),
    );
    let tools = vec![(
        std::sync::Arc::new(WhoAmITool) as std::sync::Arc<dyn toolmesh_workers::LocalTool>,
        ToolLimits::default(),
    )];
    let server = TestServer::start(&toml, AppOptions { tools, ..Default::default() })
        .await
        .expect("server starts");
    let signer = EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap();
    (server, key, signer, dir)
}

fn now() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()).unwrap()
}

fn token(signer: &EncodingKey, claims: &Value) -> String {
    jsonwebtoken::encode(&Header::new(Algorithm::ES256), claims, signer).unwrap()
}

fn claims(sub: &str) -> Value {
    json!({"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "exp": now() + 300, "roles": ["reader"]})
}

async fn client(
    server: &TestServer,
    token: Option<&str>,
) -> ToolServiceClient<toolmesh::client::Connection> {
    toolmesh::client::connect(&server.addr.to_string(), token).await.unwrap()
}

fn whoami() -> CallToolRequest {
    CallToolRequest { name: "whoami".into(), arguments_json: "{}".into(), ..Default::default() }
}

/// Every RPC of the tool and knowledge services `token` may reach, each as its status code
/// and message (`Ok` as `(Code::Ok, "")`).
async fn every_rpc(server: &TestServer, token: Option<&str>) -> Vec<(&'static str, Code, String)> {
    let mut tools = client(server, token).await;
    let outcome = |name, result: Result<(), tonic::Status>| match result {
        Ok(()) => (name, Code::Ok, String::new()),
        Err(status) => (name, status.code(), status.message().to_owned()),
    };
    let mut out = vec![
        outcome("ListTools", tools.list_tools(ListToolsRequest::default()).await.map(drop)),
        outcome("CallTool", tools.call_tool(whoami()).await.map(drop)),
        outcome(
            "SearchTools",
            tools
                .search_tools(SearchToolsRequest { query: "who".into(), ..Default::default() })
                .await
                .map(drop),
        ),
    ];
    let start =
        CallToolClientMessage { message: Some(call_tool_client_message::Message::Start(whoami())) };
    let stream = tools.stream_call_tool(tokio_stream::iter([start])).await;
    let stream = match stream {
        Ok(response) => {
            let mut messages = response.into_inner();
            let mut result = Ok(());
            while let Some(message) = messages.message().await.transpose() {
                if let Err(status) = message {
                    result = Err(status);
                }
            }
            result
        }
        Err(status) => Err(status),
    };
    out.push(outcome("StreamCallTool", stream));
    let channel = toolmesh::client::channel(&server.addr.to_string(), token).await.unwrap();
    let mut knowledge = KnowledgeServiceClient::new(channel);
    out.push(outcome(
        "ListCollections",
        knowledge.list_collections(ListCollectionsRequest::default()).await.map(drop),
    ));
    out
}

#[tokio::test]
async fn without_a_valid_credential_every_call_is_unauthenticated_and_nothing_is_listed() {
    let (server, key, signer, _dir) = secured("").await;
    let expired =
        token(&signer, &json!({"iss": ISSUER, "aud": AUDIENCE, "sub": "bob", "exp": now() - 120}));
    let early = token(
        &signer,
        &json!({"iss": ISSUER, "aud": AUDIENCE, "sub": "bob", "exp": now() + 600, "nbf": now() + 300}),
    );
    let audience = token(
        &signer,
        &json!({"iss": ISSUER, "aud": "someone-else", "sub": "bob", "exp": now() + 300}),
    );
    let foreign = {
        let other = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let other = EncodingKey::from_ec_pem(other.serialize_pem().as_bytes()).unwrap();
        token(&other, &claims("bob"))
    };
    let cases: [(Option<&str>, &str); 7] = [
        (None, "requires a credential"),
        (Some("tm_not-a-key-of-this-server"), "not valid"),
        (Some(&key[..key.len() - 1]), "not valid"),
        (Some(&expired), "expired"),
        (Some(&early), "not valid yet"),
        (Some(&audience), "audience"),
        (Some(&foreign), "signature"),
    ];
    for (credential, reason) in cases {
        for (rpc, code, message) in every_rpc(&server, credential).await {
            assert_eq!(code, Code::Unauthenticated, "{rpc} with {credential:?}: {message}");
            assert!(
                message.contains(reason),
                "{rpc} with {credential:?}: {message:?} names {reason:?}"
            );
        }
    }
    // Not a bearer credential at all.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut basic = ToolServiceClient::new(channel);
    let mut request = Request::new(ListToolsRequest::default());
    request.metadata_mut().insert("authorization", "Basic YWxpY2U6c2VjcmV0".parse().unwrap());
    let status = basic.list_tools(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(status.message().contains("Bearer"), "{status:?}");

    // Health stays reachable without a credential.
    assert_eq!(server.health("").await, Some(ServingStatus::Serving));
}

#[tokio::test]
async fn toolmeshs_own_services_cannot_be_made_public() {
    for service in
        ["toolmesh.v1.ToolService", "toolmesh.v1.KnowledgeService", "toolmesh.v1.WorkerService"]
    {
        let toml = format!("[auth]\nanonymous = \"guest\"\npublic = [\"{service}\"]\n");
        let Err(error) = TestServer::start(&toml, AppOptions::default()).await else {
            panic!("{service} was accepted as public");
        };
        let error = format!("{error:#}");
        assert!(error.contains("auth.public[0]"), "{error}");
        assert!(error.contains("toolmesh's own services"), "{error}");
    }
}

#[tokio::test]
async fn a_public_service_checks_a_credential_that_is_sent() {
    let (server, key, _signer, _dir) = secured("").await;
    let health = |credential: Option<String>| {
        let addr = server.addr;
        async move {
            let channel =
                toolmesh::client::channel(&addr.to_string(), credential.as_deref()).await.unwrap();
            let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
            let request = tonic_health::pb::HealthCheckRequest { service: String::new() };
            health.check(request).await.map(|r| r.into_inner().status())
        }
    };
    assert_eq!(health(None).await.unwrap(), ServingStatus::Serving);
    assert_eq!(health(Some(key.clone())).await.unwrap(), ServingStatus::Serving);
    let forged = health(Some("tm_not-a-key-of-this-server".into())).await.unwrap_err();
    assert_eq!(forged.code(), Code::Unauthenticated, "{forged:?}");
}

/// The overall health entry and toolmesh's services are answered to anyone; a provider's
/// part (here the local worker pool) only to an authenticated caller, and an unknown name
/// is refused alike, so that the names of a deployment's parts do not leak. The configured
/// anonymous principal has no credential either.
#[tokio::test]
async fn provider_health_is_answered_to_authenticated_callers_only() {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    for extra in ["", "[auth]\nanonymous = \"guest\""] {
        let (server, key, _signer, _dir) = secured(extra).await;
        let health = |credential: Option<String>| {
            let addr = server.addr;
            async move {
                let channel = toolmesh::client::channel(&addr.to_string(), credential.as_deref())
                    .await
                    .unwrap();
                HealthClient::new(channel)
            }
        };
        let ask = |service: &str| HealthCheckRequest { service: service.into() };
        let mut anyone = health(None).await;
        for public in ["", "toolmesh.v1.ToolService", "toolmesh.v1.KnowledgeService"] {
            let answer = anyone.check(ask(public)).await.unwrap().into_inner();
            assert_eq!(answer.status(), ServingStatus::Serving, "{public:?} ({extra})");
        }
        for hidden in ["toolmesh.local.workers", "toolmesh.mcp.not-configured"] {
            let refused = anyone.check(ask(hidden)).await.unwrap_err();
            assert_eq!(refused.code(), Code::Unauthenticated, "{hidden} ({extra}): {refused:?}");
            let refused = anyone.watch(ask(hidden)).await.unwrap_err();
            assert_eq!(refused.code(), Code::Unauthenticated, "{hidden} ({extra}): {refused:?}");
        }
        let mut keyed = health(Some(key)).await;
        let answer = keyed.check(ask("toolmesh.local.workers")).await.unwrap().into_inner();
        assert_eq!(answer.status(), ServingStatus::Serving);
        let unknown = keyed.check(ask("toolmesh.mcp.not-configured")).await.unwrap_err();
        assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    }
}

/// The API key named `limited` and a token whose subject is `limited` are two principals:
/// each has its own rate bucket, a rule naming the token's issuer applies to the token
/// alone, and the audit log says which is which.
#[tokio::test]
async fn a_token_subject_and_a_key_of_one_name_are_two_principals() {
    let limited_key = toolmesh_identity::new_key();
    let audit = tempfile::tempdir().unwrap();
    let audit_file = audit.path().join("audit.jsonl");
    let extra = format!(
        r#"
        [[auth.api_keys]]
        principal = "limited"
        sha256 = "{digest}"

        [[policy.limits.principals]]
        principals = ["limited"]
        rate_per_s = 0.001
        burst = 1

        [[policy.rules]]
        name = "no-tokens-of-the-idp-for-bob"
        effect = "deny"
        principals = ["bob"]
        issuers = ["{ISSUER}"]
        tools = ["whoami"]

        [policy.audit]
        to = "{audit}"
        "#,
        digest = toolmesh_identity::key_digest(&limited_key),
        audit = audit_file.display(),
    );
    let (server, _key, signer, _dir) = secured(&extra).await;
    let limited_token = token(&signer, &claims("limited"));
    let mut by_key = client(&server, Some(&limited_key)).await;
    let mut by_token = client(&server, Some(&limited_token)).await;
    by_key.call_tool(whoami()).await.expect("the key's first call");
    let spent = by_key.call_tool(whoami()).await.expect_err("the key's bucket is empty");
    assert_eq!(spent.code(), Code::ResourceExhausted, "{spent:?}");
    by_token.call_tool(whoami()).await.expect("the token's bucket is its own");

    let bob = token(&signer, &claims("bob"));
    let refused = client(&server, Some(&bob)).await.call_tool(whoami()).await.unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "the rule hides the tool: {refused:?}");

    let lines = eventually(Duration::from_secs(5), || {
        let audit_file = audit_file.clone();
        async move {
            let text = std::fs::read_to_string(&audit_file).ok()?;
            let lines: Vec<Value> =
                text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
            (lines.len() >= 4).then_some(lines)
        }
    })
    .await
    .expect("four calls audited");
    let of = |kind: &str| {
        lines
            .iter()
            .filter(|line| line["audit"]["principal"] == "limited")
            .filter(|line| line["audit"]["principal_kind"] == kind)
            .count()
    };
    assert_eq!((of("api_key"), of("jwt")), (2, 1), "{lines:#?}");
    let token_line = lines
        .iter()
        .find(|line| line["audit"]["principal_kind"] == "jwt")
        .expect("the token's call");
    assert_eq!(token_line["audit"]["issuer"], ISSUER);
    let key_line = lines
        .iter()
        .find(|line| line["audit"]["principal_kind"] == "api_key")
        .expect("the key's call");
    assert!(key_line["audit"].get("issuer").is_none(), "{key_line}");
}

#[tokio::test]
async fn an_api_key_and_a_token_reach_every_rpc_and_the_tool_sees_the_principal() {
    let (server, key, signer, _dir) = secured("").await;
    let jwt = token(&signer, &claims("bob"));
    for credential in [key.as_str(), jwt.as_str()] {
        for (rpc, code, message) in every_rpc(&server, Some(credential)).await {
            assert_eq!(code, Code::Ok, "{rpc}: {message}");
        }
    }
    let mut as_alice = client(&server, Some(&key)).await;
    let listed = as_alice.list_tools(ListToolsRequest::default()).await.unwrap().into_inner();
    assert!(listed.tools.iter().any(|tool| tool.name == "whoami"));

    let who = |response: toolmesh_proto::v1::CallToolResponse| -> Value {
        serde_json::from_str(response.structured_json.as_deref().unwrap()).unwrap()
    };
    let alice = who(as_alice.call_tool(whoami()).await.unwrap().into_inner());
    assert_eq!(alice, json!({"name": "alice", "kind": "api_key", "roles": ["admin"]}));
    let mut as_bob = client(&server, Some(&jwt)).await;
    let bob = who(as_bob.call_tool(whoami()).await.unwrap().into_inner());
    assert_eq!(bob, json!({"name": "bob", "kind": "jwt", "roles": ["reader"]}));
}

#[tokio::test]
async fn anonymous_callers_are_the_configured_principal_when_the_configuration_allows_them() {
    let (server, key, _signer, _dir) =
        secured("[auth]\nanonymous = \"guest\"\nanonymous_roles = [\"visitor\"]").await;
    let mut anonymous = client(&server, None).await;
    let response = anonymous.call_tool(whoami()).await.unwrap().into_inner();
    let who: Value = serde_json::from_str(response.structured_json.as_deref().unwrap()).unwrap();
    assert_eq!(who, json!({"name": "guest", "kind": "anonymous", "roles": ["visitor"]}));
    // A credential that is present is still checked: a bad one is not downgraded.
    let status = client(&server, Some("tm_wrong")).await.call_tool(whoami()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    let response =
        client(&server, Some(&key)).await.call_tool(whoami()).await.unwrap().into_inner();
    assert!(response.structured_json.unwrap().contains("alice"));
}

#[tokio::test]
async fn without_an_auth_section_callers_are_the_open_anonymous_principal() {
    let tools = vec![(
        std::sync::Arc::new(WhoAmITool) as std::sync::Arc<dyn toolmesh_workers::LocalTool>,
        ToolLimits::default(),
    )];
    let server = TestServer::start("", AppOptions { tools, ..Default::default() }).await.unwrap();
    let response = client(&server, None).await.call_tool(whoami()).await.unwrap().into_inner();
    let who: Value = serde_json::from_str(response.structured_json.as_deref().unwrap()).unwrap();
    assert_eq!(who, json!({"name": "anonymous", "kind": "anonymous", "roles": []}));
}

#[tokio::test]
async fn only_the_writer_role_ingests_and_deletes_documents() {
    let writer = toolmesh_identity::new_key();
    let extra = format!(
        "[[auth.api_keys]]\nprincipal = \"docs-bot\"\nsha256 = \"{}\"\nroles = [\"knowledge-writer\"]\n\n\
         [[knowledge.collections]]\nname = \"docs\"\ndescription = \"The handbook.\"\n",
        toolmesh_identity::key_digest(&writer)
    );
    let (server, admin, _, _dir) = secured(&extra).await;
    let knowledge = |token: String| {
        let addr = server.addr.to_string();
        async move {
            let channel = toolmesh::client::channel(&addr, Some(&token)).await.unwrap();
            KnowledgeServiceClient::new(channel)
        }
    };
    let document = toolmesh_proto::v1::Document {
        id: "install.md".into(),
        text: "Install with the package manager.".into(),
        ..Default::default()
    };
    let ingest =
        toolmesh_proto::v1::IngestRequest { collection: "docs".into(), documents: vec![document] };
    let delete = toolmesh_proto::v1::DeleteRequest {
        collection: "docs".into(),
        document_ids: vec!["install.md".into()],
    };

    // An admin of tools is not a writer of documents: refused, the role named; reading
    // stays open to it.
    let mut reader = knowledge(admin).await;
    let refused = reader.ingest(tokio_stream::iter([ingest.clone()])).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("knowledge-writer"), "{}", refused.message());
    let refused = reader.delete(delete.clone()).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    let listed = reader.list_collections(ListCollectionsRequest::default()).await.unwrap();
    assert_eq!(listed.into_inner().collections[0].documents, 0, "nothing was written");

    // The writer role ingests and deletes.
    let mut writing = knowledge(writer).await;
    let ingested = writing.ingest(tokio_stream::iter([ingest])).await.unwrap().into_inner();
    assert!(ingested.failed == 0 && ingested.ingested > 0, "{ingested:?}");
    let deleted = writing.delete(delete).await.unwrap().into_inner();
    assert!(deleted.deleted_chunks > 0, "{deleted:?}");
}

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
    let _python_worker = toolmesh_e2e::spawn(
        tokio::process::Command::new(python())
            .arg(&example)
            .arg(&addr)
            .env("TOOLMESH_TOKEN", &worker_key)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true),
    )
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
    assert!(refused.is_some(), "{}\n{}", worker.logs(), server.logs());
    // The router names the revocation when it is what ended the session. A session that had
    // already ended (heartbeats missed on a loaded machine) is refused when the worker comes
    // back instead, which the worker reports and the router does not log.
    if worker.logs().contains("credential was revoked") {
        assert!(server.logs().contains("credential was revoked"), "{}", server.logs());
    }
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
