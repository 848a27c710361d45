//! Upstream credentials through the real gRPC API: each principal's own secret goes to an
//! HTTP tool and to an MCP server over streamable HTTP as a header, the caller's token only
//! where a credential opts in to passing it on, a caller without a secret is refused before
//! any request, and no secret shows in a refusal or a listing.

use std::sync::{Arc, Mutex};

use axum::{Json, Router, http::HeaderMap, routing::get};
use serde_json::json;
use tonic::Code;
use toolmesh::AppOptions;
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
