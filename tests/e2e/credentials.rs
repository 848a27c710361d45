//! Upstream credentials through the real gRPC API: each principal's own secret goes to an
//! HTTP tool and to an MCP server over streamable HTTP as a header, the caller's token only
//! where a credential opts in to passing it on, a caller without a secret is refused before
//! any request, and no secret shows in a refusal or a listing.

use std::sync::{Arc, Mutex};

use axum::{Json, Router, http::HeaderMap, routing::get};
use serde_json::json;
use std::time::Duration;
use tonic::Code;
use toolmesh::AppOptions;
use toolmesh_e2e::BinaryServer;
use toolmesh_e2e::otlp::Receiver;
use toolmesh_e2e::{PyHttpServer, TestServer, eventually, serve_http};
use toolmesh_proto::v1::{CallToolRequest, ListToolsRequest};

/// The authorization headers the upstream saw, in order (`None`: no header).
type Seen = Arc<Mutex<Vec<Option<String>>>>;

async fn upstream() -> (std::net::SocketAddr, Seen) {
    let seen = Seen::default();
    let log = seen.clone();
    let app = Router::new().route(
        "/svc",
        get(move |headers: HeaderMap| {
            let log = log.clone();
            async move {
                let authorization =
                    headers.get("authorization").map(|v| v.to_str().unwrap().to_owned());
                log.lock().unwrap().push(authorization);
                Json(json!({"ok": true}))
            }
        }),
    );
    (serve_http(app).await, seen)
}

fn sha256(text: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

async fn call(
    server: &TestServer,
    token: &str,
    tool: &str,
) -> Result<toolmesh_proto::v1::CallToolResponse, tonic::Status> {
    let mut client =
        toolmesh::client::connect(&server.addr.to_string(), Some(token)).await.unwrap();
    let request =
        CallToolRequest { name: tool.into(), arguments_json: "{}".into(), ..Default::default() };
    client.call_tool(request).await.map(tonic::Response::into_inner)
}

#[tokio::test]
async fn each_principal_s_own_secret_reaches_http_tools_and_mcp_servers() {
    let (addr, seen) = upstream().await;
    let mcp = PyHttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let secret = |name: &str, value: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{value}\n")).unwrap();
        path.display().to_string()
    };
    let (alice_secret, bob_secret) =
        ("svc-secret-of-alice-0123456789", "svc-secret-of-bob-9876543210");
    let keys =
        [toolmesh_identity::new_key(), toolmesh_identity::new_key(), toolmesh_identity::new_key()];
    let [alice, bob, carol] = &keys;
    let digest = toolmesh_identity::key_digest;
    let toml = format!(
        r#"
        [[auth.api_keys]]
        principal = "alice"
        sha256 = "{alice_digest}"
        [[auth.api_keys]]
        principal = "bob"
        sha256 = "{bob_digest}"
        [[auth.api_keys]]
        principal = "carol"
        sha256 = "{carol_digest}"

        [credentials.svc]
        principals.alice = {{ file = "{alice_file}" }}
        principals.bob = {{ file = "{bob_file}" }}

        [credentials.caller]
        pass_caller_token = true

        [[tools.http]]
        name = "svc"
        description = "the service, as the caller"
        url = "http://{addr}/svc"
        allow_private_network = true
        credentials = ["svc"]

        [[tools.http]]
        name = "svc_as_caller"
        description = "the service, with the caller's own token"
        url = "http://{addr}/svc"
        allow_private_network = true
        credentials = ["caller"]

        [[tools.http]]
        name = "svc_plain"
        description = "the service, without credentials"
        url = "http://{addr}/svc"
        allow_private_network = true

        [[mcp.servers]]
        name = "py"
        transport = "streamable-http"
        url = "{mcp_url}"
        credentials = ["svc"]
        "#,
        alice_digest = digest(alice),
        bob_digest = digest(bob),
        carol_digest = digest(carol),
        alice_file = secret("alice", alice_secret),
        bob_file = secret("bob", bob_secret),
        mcp_url = mcp.url(),
    );
    let server = TestServer::start(&toml, AppOptions::default()).await.unwrap();

    // The HTTP tool: each principal's own secret; the caller's token only where the
    // credential passes it on; nothing on a tool without credentials.
    for token in [alice, bob] {
        assert!(!call(&server, token, "svc").await.unwrap().is_error);
    }
    assert!(!call(&server, alice, "svc_as_caller").await.unwrap().is_error);
    assert!(!call(&server, alice, "svc_plain").await.unwrap().is_error);
    assert_eq!(
        *seen.lock().unwrap(),
        [
            Some(format!("Bearer {alice_secret}")),
            Some(format!("Bearer {bob_secret}")),
            Some(format!("Bearer {alice}")),
            None
        ]
    );

    // A principal without a secret is refused before any request, and told which
    // credential it lacks; no secret is in the refusal.
    let refused = call(&server, carol, "svc").await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("carol") && refused.message().contains("svc"),
        "{}",
        refused.message()
    );
    assert_eq!(seen.lock().unwrap().len(), 4, "no request was made for carol");

    // The MCP server over streamable HTTP gets the caller's secret with its call.
    let listed = eventually(std::time::Duration::from_secs(30), || async {
        let mut client =
            toolmesh::client::connect(&server.addr.to_string(), Some(alice)).await.ok()?;
        let tools = client.list_tools(ListToolsRequest::default()).await.ok()?.into_inner().tools;
        tools.iter().any(|t| t.name == "py_http_authorization").then_some(tools)
    })
    .await
    .expect("the MCP server's tools are listed");
    for (token, expected) in [(alice, alice_secret), (bob, bob_secret)] {
        let answer = call(&server, token, "py_http_authorization").await.unwrap();
        assert_eq!(toolmesh_e2e::text(&answer), sha256(&format!("Bearer {expected}")));
    }
    let refused = call(&server, carol, "py_http_authorization").await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");

    // No secret in a refusal or a listing.
    let listing = format!("{listed:?}");
    for secret in [alice_secret, bob_secret] {
        assert!(!listing.contains(secret), "a secret in ListTools");
        assert!(!refused.message().contains(secret));
    }
}

/// Credentials never show: not in the debug log, not in the exported spans, not in the
/// audit log, not in ListTools — neither an accepted API key nor a refused one, nor the
/// upstream secret an HTTP tool and an MCP server over streamable HTTP are sent for alice
/// (nor alice's key, which another HTTP tool passes on).
#[tokio::test]
async fn credentials_appear_in_no_log_span_audit_line_or_listing() {
    let (receiver, otlp) = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let key = toolmesh_identity::new_key();
    let unknown = toolmesh_identity::new_key();
    let upstream_secret = "upstream-secret-of-alice-5f1e2d3c4b5a";
    let secret_file = dir.path().join("alice-svc");
    std::fs::write(&secret_file, upstream_secret).unwrap();
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let log = received.clone();
    let upstream = toolmesh_e2e::serve_http(axum::Router::new().route(
        "/svc",
        axum::routing::get(move |headers: axum::http::HeaderMap| {
            let log = log.clone();
            async move {
                for value in headers.get_all("authorization") {
                    log.lock().unwrap().push(value.to_str().unwrap().to_owned());
                }
                "ok"
            }
        }),
    ))
    .await;
    let mcp = PyHttpServer::start().await;
    let toml = format!(
        "[[auth.api_keys]]\nprincipal = \"alice\"\nsha256 = \"{}\"\n\n[policy.audit]\nto = \"{}\"\n\n\
         [[mcp.servers]]\nname = \"py\"\ntransport = \"streamable-http\"\nurl = \"{}\"\n\
         credentials = [\"svc\"]\n\
         [credentials.svc]\nprincipals.alice = {{ file = {:?} }}\n\
         [credentials.caller]\npass_caller_token = true\n\
         [[tools.http]]\nname = \"svc\"\ndescription = \"a service\"\nurl = \"http://{upstream}/svc\"\n\
         allow_private_network = true\ncredentials = [\"svc\"]\n\
         [[tools.http]]\nname = \"svc_as_caller\"\ndescription = \"a service\"\n\
         url = \"http://{upstream}/svc\"\nallow_private_network = true\ncredentials = [\"caller\"]\n",
        toolmesh_identity::key_digest(&key),
        audit.display(),
        mcp.url(),
        secret_file.display().to_string(),
    );
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()), ("RUST_LOG", "debug")];
    let mut server = BinaryServer::with_config(&toml, &env).await.unwrap();
    let addr = server.addr.to_string();
    let mut client = toolmesh::client::connect(&addr, Some(&key)).await.unwrap();
    let listed = client.list_tools(ListToolsRequest::default()).await.unwrap().into_inner();
    let request = CallToolRequest {
        name: "echo".into(),
        arguments_json: r#"{"message":"hi"}"#.into(),
        ..Default::default()
    };
    assert!(!client.call_tool(request.clone()).await.unwrap().into_inner().is_error);
    for tool in ["svc", "svc_as_caller"] {
        let call = CallToolRequest { name: tool.into(), ..request.clone() };
        assert!(!client.call_tool(call).await.unwrap().into_inner().is_error, "{tool}");
    }
    assert_eq!(
        *received.lock().unwrap(),
        [format!("Bearer {upstream_secret}"), format!("Bearer {key}")],
        "the upstream got them"
    );
    let authorization = eventually(Duration::from_secs(30), || {
        let (mut client, request) = (client.clone(), request.clone());
        async move {
            let call = CallToolRequest {
                name: "py_http_authorization".into(),
                arguments_json: "{}".into(),
                ..request
            };
            client.call_tool(call).await.ok().map(|r| toolmesh_e2e::text(&r.into_inner()))
        }
    })
    .await
    .expect("the MCP server answers");
    let expected: String =
        <sha2::Sha256 as sha2::Digest>::digest(format!("Bearer {upstream_secret}"))
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
    assert_eq!(authorization, expected, "the MCP server got alice's secret");
    let mut refused = toolmesh::client::connect(&addr, Some(&unknown)).await.unwrap();
    let status = refused.call_tool(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(!status.message().contains(&unknown), "{}", status.message());

    let spans = receiver.spans_after_stop(&mut server, "execute_tool echo").await;
    let logs = server.logs();
    assert!(logs.contains("DEBUG"), "the log is at debug level: {logs}");
    let audit = std::fs::read_to_string(&audit).unwrap();
    assert!(audit.contains("\"principal\":\"alice\""), "{audit}");
    let spans = format!("{spans:?}");
    assert!(spans.contains("alice"), "the principal is on the spans");
    for secret in [key.as_str(), unknown.as_str(), upstream_secret] {
        // The key, and any long piece of it.
        let piece = &secret[secret.len() - 16..];
        assert!(!logs.contains(piece), "a credential in the log:\n{logs}");
        assert!(!spans.contains(piece), "a credential in a span");
        assert!(!audit.contains(piece), "a credential in the audit log");
        assert!(!format!("{listed:?}").contains(piece), "a credential in ListTools");
    }
}
