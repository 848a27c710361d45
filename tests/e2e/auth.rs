//! Authentication through the real gRPC API: API keys and JWTs from the configuration,
//! `UNAUTHENTICATED` and nothing else without a valid credential, health open, the
//! principal carried to the tool.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use tonic::{Code, Request};
use tonic_health::pb::health_check_response::ServingStatus;
use toolmesh::AppOptions;
use toolmesh_e2e::{TestServer, eventually, tools::WhoAmITool};
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
