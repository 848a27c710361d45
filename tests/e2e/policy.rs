//! Tool policy through the real gRPC API with several principals: what each may see
//! (ListTools, SearchTools, searchTools and its description) and call (CallTool,
//! StreamCallTool, callTool); a hidden tool answered as an unknown one, a refused call
//! citing its rule; per-agent tool lists; routing profiles bound to principals; the audit
//! log.

use std::{sync::Arc, time::Duration};

use serde_json::{Value, json};
use tonic::{Code, Status};
use toolmesh::AppOptions;
use toolmesh_e2e::{TestServer, eventually, tools::ArgsTool};
use toolmesh_proto::v1::{
    ApprovalAnswer, ApprovalRequest, CallToolClientMessage, CallToolRequest, CallToolResponse,
    ListCollectionsRequest, ListToolsRequest, SearchToolsRequest, call_tool_client_message,
    call_tool_server_message, knowledge_service_client::KnowledgeServiceClient,
    tool_service_client::ToolServiceClient,
};
use toolmesh_workers::{LocalTool, ToolLimits};

type Client = ToolServiceClient<toolmesh::client::Connection>;

/// The principals of these tests and their API keys.
struct Keys {
    alice: String,
    bob: String,
    bot: String,
}

fn tools() -> Vec<(Arc<dyn LocalTool>, ToolLimits)> {
    let path = json!({
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"]
    });
    [
        ArgsTool::new("file_read", "Reads a file from the disk", path.clone()).read_only(),
        ArgsTool::new("file_delete", "Deletes a file from the disk", path.clone()),
        ArgsTool::new("write_file", "Writes text into a file on the disk", path),
        ArgsTool::new("ticket_open", "Opens a support ticket", json!({"type": "object"}))
            .tagged(&["tickets"]),
    ]
    .into_iter()
    .map(|tool| (Arc::new(tool) as Arc<dyn LocalTool>, ToolLimits::default()))
    .collect()
}

/// A server with three principals — alice (admin), bob (dev), and a key of the agent
/// `support-bot` — and `policy` (TOML under `[policy]`), auditing to `audit`.
async fn server(policy: &str, audit: &std::path::Path) -> (TestServer, Keys) {
    server_with(policy, audit, Vec::new()).await
}

/// [`server`] with further tools.
async fn server_with(
    policy: &str,
    audit: &std::path::Path,
    extra: Vec<(Arc<dyn LocalTool>, ToolLimits)>,
) -> (TestServer, Keys) {
    let keys = Keys {
        alice: toolmesh_identity::new_key(),
        bob: toolmesh_identity::new_key(),
        bot: toolmesh_identity::new_key(),
    };
    let digest = toolmesh_identity::key_digest;
    let toml = format!(
        r#"
        [[auth.api_keys]]
        principal = "alice"
        sha256 = "{alice}"
        roles = ["admin"]

        [[auth.api_keys]]
        principal = "bob"
        sha256 = "{bob}"
        roles = ["dev"]

        [[auth.api_keys]]
        principal = "bot-key-1"
        sha256 = "{bot}"
        attributes = {{ agent = "support-bot" }}

        [[routing.profiles]]
        name = "support"
        expose = ["tag:tickets"]

        [policy.audit]
        to = "{audit}"

        {policy}
        "#,
        alice = digest(&keys.alice),
        bob = digest(&keys.bob),
        bot = digest(&keys.bot),
        audit = audit.display(),
    );
    let options =
        AppOptions { tools: tools().into_iter().chain(extra).collect(), ..Default::default() };
    let server = TestServer::start(&toml, options).await.expect("server starts");
    (server, keys)
}

const RULES: &str = r#"
    [[policy.rules]]
    name = "only-admins-delete"
    effect = "deny"
    tools = ["*delete*"]
    when = '!("admin" in principal.roles)'

    [[policy.rules]]
    name = "writes-under-tmp"
    effect = "deny"
    tools = ["write_file"]
    when = '!args.path.startsWith("/tmp/")'
    reason = "files are written under /tmp/ only"

    [policy.agents.support-bot]
    tools = ["tag:tickets", "toolkit:reasoning"]
"#;

async fn client(server: &TestServer, key: &str) -> Client {
    toolmesh::client::connect(&server.addr.to_string(), Some(key)).await.unwrap()
}

async fn names(client: &mut Client, profile: &str) -> Vec<String> {
    let request = ListToolsRequest { profile: profile.into(), ..Default::default() };
    let tools = client.list_tools(request).await.unwrap().into_inner().tools;
    tools.into_iter().map(|t| t.name).collect()
}

async fn call(
    client: &mut Client,
    name: &str,
    arguments: Value,
) -> Result<CallToolResponse, Status> {
    let request = CallToolRequest {
        name: name.into(),
        arguments_json: arguments.to_string(),
        ..Default::default()
    };
    client.call_tool(request).await.map(tonic::Response::into_inner)
}

async fn stream_call(client: &mut Client, name: &str, arguments: Value) -> Result<(), Status> {
    let start = CallToolClientMessage {
        message: Some(call_tool_client_message::Message::Start(CallToolRequest {
            name: name.into(),
            arguments_json: arguments.to_string(),
            ..Default::default()
        })),
    };
    let mut messages = client.stream_call_tool(tokio_stream::iter([start])).await?.into_inner();
    while let Some(message) = messages.message().await? {
        if let Some(call_tool_server_message::Message::Result(result)) = message.message {
            assert!(!result.is_error);
        }
    }
    Ok(())
}

/// The message of a refusal with `name` put back as `TOOL`: the shape of the message.
fn shape(status: &Status, name: &str) -> String {
    status.message().replace(name, "TOOL")
}

/// Waits until every tool of the catalog is indexed with its vector, so that rankings are
/// complete. Under a policy the index is not counted: the counts would tell a principal how
/// many tools it may not see.
async fn indexed(client: &Client) {
    let response = eventually(Duration::from_secs(60), || async {
        let request = SearchToolsRequest { query: "anything".into(), ..Default::default() };
        let response = client.clone().search_tools(request).await.unwrap().into_inner();
        response.index_complete.then_some(response)
    })
    .await
    .expect("every tool is indexed and embedded");
    assert_eq!((response.indexed_tools, response.embedded_tools), (0, 0), "nothing counted");
    assert!(response.index_version > 0);
}

/// The search hits of `query` for `client`, once the whole catalog is indexed.
async fn search(client: &Client, query: &str, top_k: u32) -> Vec<String> {
    indexed(client).await;
    let request = SearchToolsRequest { query: query.into(), top_k, ..Default::default() };
    let hits = client.clone().search_tools(request).await.unwrap().into_inner().hits;
    hits.into_iter().filter_map(|h| h.tool).map(|t| t.name).collect()
}

fn audit_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap()["audit"].clone())
        .collect()
}

#[tokio::test]
async fn each_principal_sees_and_calls_only_what_the_policy_allows() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let (server, keys) = server(RULES, &audit).await;
    let mut alice = client(&server, &keys.alice).await;
    let mut bob = client(&server, &keys.bob).await;
    let mut bot = client(&server, &keys.bot).await;

    // Discovery: ListTools.
    let listed = names(&mut alice, "").await;
    assert!(listed.contains(&"file_delete".to_owned()), "{listed:?}");
    let listed = names(&mut bob, "").await;
    assert!(!listed.contains(&"file_delete".to_owned()), "{listed:?}");
    assert!(listed.contains(&"file_read".to_owned()) && listed.contains(&"write_file".to_owned()));
    let listed = names(&mut bot, "").await;
    assert_eq!(
        listed,
        ["analyze", "callTool", "searchTools", "think", "ticket_open"],
        "the agent's list (the meta-tools are always there)"
    );

    // Execution: a hidden tool is answered exactly as an unknown one, at every door.
    let hidden = call(&mut bob, "file_delete", json!({"path": "/tmp/a"})).await.unwrap_err();
    let unknown = call(&mut bob, "file_nothing", json!({"path": "/tmp/a"})).await.unwrap_err();
    assert_eq!(hidden.code(), Code::NotFound);
    assert_eq!(shape(&hidden, "file_delete"), shape(&unknown, "file_nothing"));
    assert_eq!(hidden.details(), unknown.details());
    let streamed = stream_call(&mut bob, "file_delete", json!({"path": "/tmp/a"})).await;
    assert_eq!(streamed.unwrap_err().code(), Code::NotFound);
    // Its arguments are not even looked at: invalid ones get the same answer.
    let invalid = call(&mut bob, "file_delete", json!({})).await.unwrap_err();
    assert_eq!(shape(&invalid, "file_delete"), shape(&unknown, "file_nothing"));
    let by_bot = call(&mut bot, "file_read", json!({"path": "/tmp/a"})).await.unwrap_err();
    assert_eq!(by_bot.code(), Code::NotFound, "{}", by_bot.message());

    assert!(!call(&mut alice, "file_delete", json!({"path": "/x"})).await.unwrap().is_error);
    assert!(!call(&mut bot, "ticket_open", json!({})).await.unwrap().is_error);
    stream_call(&mut alice, "file_delete", json!({"path": "/x"})).await.unwrap();

    // A rule on the arguments: the tool is listed, the call refused citing the rule.
    let refused = call(&mut bob, "write_file", json!({"path": "/etc/passwd"})).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(refused.message().contains("writes-under-tmp"), "{}", refused.message());
    assert!(refused.message().contains("under /tmp/ only"), "{}", refused.message());
    let ok = call(&mut bob, "write_file", json!({"path": "/tmp/notes"})).await.unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(ok.structured_json.as_deref().unwrap()).unwrap()["args"]["path"],
        "/tmp/notes"
    );

    // Search: the hidden tool is never returned, and the others still are.
    let query = "delete a file from the disk";
    let found = search(&alice, query, 3).await;
    assert!(found.contains(&"file_delete".to_owned()), "{found:?}");
    let found = search(&bob, query, 3).await;
    assert!(!found.contains(&"file_delete".to_owned()), "{found:?}");
    assert_eq!(found.len(), 3, "k allowed tools: {found:?}");
    // More than there are: all the others, and still not it.
    let found = search(&bob, query, 100).await;
    assert!(!found.is_empty() && !found.contains(&"file_delete".to_owned()), "{found:?}");

    // Every call and every discovery that hid a tool is audited, naming the rule.
    let server_policy = server.app.router().admission().policy().clone();
    assert!(server_policy.audit().flush(Duration::from_secs(5)));
    let lines = audit_lines(&audit);
    let find = |principal: &str, tool: &str, decision: &str| {
        lines
            .iter()
            .find(|l| l["principal"] == principal && l["tool"] == tool && l["decision"] == decision)
    };
    let line = find("bob", "file_delete", "hide").expect("bob's hidden call is audited");
    assert_eq!(line["rule"], "only-admins-delete");
    assert_eq!(line["outcome"], "tool_not_found");
    assert_eq!(line["event"], "call");
    let line = find("bob", "write_file", "deny").expect("bob's refused call is audited");
    assert_eq!(line["rule"], "writes-under-tmp");
    assert_eq!(line["outcome"], "policy_denied");
    let line = find("alice", "file_delete", "allow").expect("alice's call is audited");
    assert_eq!(line["outcome"], "ok");
    assert_eq!(line["rule"], "default");
    assert!(line["duration_ms"].as_f64().unwrap() >= 0.0);
    let line = find("bob", "ListTools", "hide").expect("bob's listing is audited");
    assert_eq!(line["hidden"], 1);
    assert_eq!(line["event"], "discovery");
    // Each search that hid the tool is audited, counting it once.
    let searches: Vec<&Value> =
        lines.iter().filter(|l| l["principal"] == "bob" && l["tool"] == "SearchTools").collect();
    assert_eq!(searches.len(), 2, "{searches:?}");
    for line in searches {
        assert_eq!(line["hidden"], 1, "{line}");
        assert_eq!(line["rule"], "only-admins-delete");
    }
    let line = find("bot-key-1", "ListTools", "hide").expect("the agent's listing is audited");
    assert_eq!(line["agent"], "support-bot");
    assert_eq!(line["rule"], "agents.support-bot");
    assert!(lines.iter().all(|l| l["policy"].as_str().is_some_and(|v| v.len() == 16)));
}

#[tokio::test]
async fn the_meta_tools_show_and_call_only_what_the_principal_may_see() {
    let dir = tempfile::tempdir().unwrap();
    let (server, keys) = server(RULES, &dir.path().join("audit.jsonl")).await;
    let mut alice = client(&server, &keys.alice).await;
    let mut bob = client(&server, &keys.bob).await;

    // The searchTools description counts and names only what each may see.
    let describe = |client: &mut Client| {
        let mut client = client.clone();
        async move {
            let request = ListToolsRequest { profile: "default".into(), ..Default::default() };
            let tools = client.list_tools(request).await.unwrap().into_inner().tools;
            tools.into_iter().find(|t| t.name == "searchTools").unwrap().description
        }
    };
    let of_alice = describe(&mut alice).await;
    let of_bob = describe(&mut bob).await;
    assert!(of_alice.contains("among 7 tools"), "{of_alice}");
    assert!(of_bob.contains("among 6 tools"), "{of_bob}");
    assert!(!of_bob.contains("file_delete"), "{of_bob}");

    // searchTools returns only what bob may see; callTool refuses the hidden tool as it
    // refuses one that does not exist, even with a token that returned it to alice.
    let meta = |client: &mut Client, name: &str, arguments: Value| {
        let mut client = client.clone();
        let request = CallToolRequest {
            name: name.into(),
            arguments_json: arguments.to_string(),
            session_id: "s".into(),
            profile: "default".into(),
            ..Default::default()
        };
        async move { client.call_tool(request).await.map(tonic::Response::into_inner) }
    };
    indexed(&alice).await;
    let searched = |client: &mut Client| {
        let mut client = client.clone();
        async move {
            let arguments = json!({"query": "delete a file from the disk", "topK": 3});
            let response = meta(&mut client, "searchTools", arguments).await.unwrap();
            let result: Value =
                serde_json::from_str(response.structured_json.as_deref().unwrap()).unwrap();
            let names: Vec<String> = result["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_owned())
                .collect();
            (names, result["searchToken"].as_str().unwrap().to_owned())
        }
    };
    let (found, alice_token) = searched(&mut alice).await;
    assert!(found.contains(&"file_delete".to_owned()), "{found:?}");
    let (found, bob_token) = searched(&mut bob).await;
    assert!(!found.contains(&"file_delete".to_owned()), "{found:?}");
    assert_eq!(found.len(), 3, "{found:?}");

    let hidden = meta(
        &mut bob,
        "callTool",
        json!({"name": "file_delete", "arguments": {"path": "/tmp/a"}, "searchToken": alice_token}),
    )
    .await
    .unwrap_err();
    let unknown = meta(
        &mut bob,
        "callTool",
        json!({"name": "file_nothing", "arguments": {}, "searchToken": bob_token}),
    )
    .await
    .unwrap_err();
    assert_eq!(hidden.code(), Code::NotFound);
    assert_eq!(shape(&hidden, "file_delete"), shape(&unknown, "file_nothing"));
    // Through callTool, the argument rule still refuses, citing it.
    let write = found.iter().any(|n| n == "write_file");
    if write {
        let refused = meta(&mut bob, "callTool", json!({"name": "write_file", "arguments": {"path": "/etc/x"}, "searchToken": bob_token})).await.unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{}", refused.message());
    }
    let allowed = meta(
        &mut alice,
        "callTool",
        json!({"name": "file_delete", "arguments": {"path": "/tmp/a"}, "searchToken": alice_token}),
    )
    .await
    .unwrap();
    assert!(!allowed.is_error);
}

#[tokio::test]
async fn a_default_deny_policy_still_gives_k_allowed_search_results() {
    let dir = tempfile::tempdir().unwrap();
    let policy = r#"
        [policy]
        default = "deny"

        [[policy.rules]]
        name = "files-only"
        effect = "allow"
        tools = ["file_*", "write_file"]
    "#;
    let (server, keys) = server(policy, &dir.path().join("audit.jsonl")).await;
    let mut bob = client(&server, &keys.bob).await;
    let listed = names(&mut bob, "").await;
    assert_eq!(listed, ["callTool", "file_delete", "file_read", "searchTools", "write_file"]);
    // "echo" is the best match of this query among all tools; three allowed ones come back.
    let found = search(&bob, "return my arguments unchanged", 3).await;
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found.iter().all(|n| n.starts_with("file_") || n == "write_file"), "{found:?}");
    let echo = call(&mut bob, "echo", json!({})).await.unwrap_err();
    assert_eq!(echo.code(), Code::NotFound);
}

#[tokio::test]
async fn a_knowledge_collection_is_listed_to_whom_may_see_its_tool_and_to_its_writers() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let policy = r#"
        [[policy.rules]]
        name = "handbook-for-admins"
        effect = "deny"
        tools = ["search_handbook"]
        when = '!("admin" in principal.roles)'

        [knowledge]
        writer_role = "dev"

        [[knowledge.collections]]
        name = "handbook"
        description = "The staff handbook."

        [[knowledge.collections]]
        name = "faq"
        description = "Questions customers ask."
    "#;
    let (server, keys) = server(policy, &audit).await;
    let collections = |key: String| {
        let addr = server.addr.to_string();
        async move {
            let channel = toolmesh::client::channel(&addr, Some(&key)).await.unwrap();
            let mut client = KnowledgeServiceClient::new(channel);
            let listed = client.list_collections(ListCollectionsRequest::default()).await;
            let mut names: Vec<String> =
                listed.unwrap().into_inner().collections.into_iter().map(|c| c.name).collect();
            names.sort();
            names
        }
    };

    // alice may see both tools; the bot sees neither the tool nor its collection.
    assert_eq!(collections(keys.alice.clone()).await, ["faq", "handbook"]);
    let mut bot = client(&server, &keys.bot).await;
    assert!(!names(&mut bot, "").await.contains(&"search_handbook".to_owned()));
    assert_eq!(collections(keys.bot.clone()).await, ["faq"]);
    // bob may not search the handbook either, but writes to the collections: he sees them.
    let mut bob = client(&server, &keys.bob).await;
    assert!(!names(&mut bob, "").await.contains(&"search_handbook".to_owned()));
    assert_eq!(collections(keys.bob.clone()).await, ["faq", "handbook"]);

    // The hidden collection is audited as a discovery that hid a tool.
    let server_policy = server.app.router().admission().policy().clone();
    assert!(server_policy.audit().flush(Duration::from_secs(5)));
    let listed = audit_lines(&audit)
        .into_iter()
        .find(|event| event["tool"] == "ListCollections" && event["principal"] == "bot-key-1");
    let listed = listed.expect("an audit event of the bot's ListCollections");
    assert_eq!(listed["decision"], "hide");
    assert_eq!(listed["rule"], "handbook-for-admins");
    assert_eq!(listed["hidden"], 1);
}

#[tokio::test]
async fn a_principal_bound_to_a_profile_gets_its_view_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let policy = r#"
        [[policy.profiles]]
        profile = "support"
        agents = ["support-*"]
    "#;
    let (server, keys) = server(policy, &dir.path().join("audit.jsonl")).await;
    let mut bot = client(&server, &keys.bot).await;
    // Naming no profile, the bound one applies: its meta-tools and exposed tools.
    assert_eq!(names(&mut bot, "").await, ["callTool", "searchTools", "ticket_open"]);
    assert_eq!(names(&mut bot, "support").await, ["callTool", "searchTools", "ticket_open"]);
    let request = ListToolsRequest { profile: "default".into(), ..Default::default() };
    let status = bot.list_tools(request).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(status.message().contains("uses routing profile support"), "{}", status.message());
    // Direct calls reach only what the profile shows.
    let status = call(&mut bot, "file_read", json!({"path": "/tmp/a"})).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{}", status.message());
    // An unbound principal still chooses.
    let mut bob = client(&server, &keys.bob).await;
    assert!(names(&mut bob, "").await.contains(&"file_read".to_owned()));
}

#[tokio::test]
async fn a_reloaded_policy_applies_to_the_next_calls() {
    let dir = tempfile::tempdir().unwrap();
    let (server, keys) = server("", &dir.path().join("audit.jsonl")).await;
    let mut bob = client(&server, &keys.bob).await;
    assert!(!call(&mut bob, "file_delete", json!({"path": "/tmp/a"})).await.unwrap().is_error);
    let config = TestServer::config(&format!(
        r#"
        [[auth.api_keys]]
        principal = "bob"
        sha256 = "{bob}"
        roles = ["dev"]
        {RULES}
        "#,
        bob = toolmesh_identity::key_digest(&keys.bob),
    ))
    .unwrap();
    server.app.reload(&config).await.unwrap();
    let status = call(&mut bob, "file_delete", json!({"path": "/tmp/a"})).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    assert!(!names(&mut bob, "").await.contains(&"file_delete".to_owned()));
}

#[tokio::test]
async fn rate_concurrency_and_size_limits_refuse_with_clear_errors() {
    use tonic_types::StatusExt as _;
    let dir = tempfile::tempdir().unwrap();
    let probe = Arc::new(toolmesh_e2e::tools::BlockingProbe::default());
    let blocking = toolmesh_e2e::tools::BlockingTool(probe.clone());
    let policy = r#"
        [policy.limits]
        max_argument_bytes = 200
        max_result_bytes = 300

        [[policy.limits.principals]]
        principals = ["bob"]
        rate_per_s = 0.2
        burst = 3

        [[policy.limits.principals]]
        agents = ["support-*"]
        max_concurrent = 1

        [[policy.limits.tools]]
        tools = ["file_read"]
        max_result_bytes = 40
        truncate_result = true
    "#;
    let extra = vec![(Arc::new(blocking) as Arc<dyn LocalTool>, ToolLimits::default())];
    let (server, keys) = server_with(policy, &dir.path().join("audit.jsonl"), extra).await;
    let mut alice = client(&server, &keys.alice).await;
    let mut bob = client(&server, &keys.bob).await;
    let mut bot = client(&server, &keys.bot).await;

    // Bob's bucket holds three calls; the fourth is refused, saying when to come back.
    for _ in 0..3 {
        call(&mut bob, "write_file", json!({"path": "/tmp/a"})).await.unwrap();
    }
    let limited = call(&mut bob, "write_file", json!({"path": "/tmp/a"})).await.unwrap_err();
    assert_eq!(limited.code(), Code::ResourceExhausted);
    assert!(limited.message().contains("rate limit of principal bob"), "{}", limited.message());
    let delay = limited.get_details_retry_info().and_then(|r| r.retry_delay).unwrap();
    assert!(delay > Duration::ZERO && delay <= Duration::from_secs(5), "{delay:?}");
    // Alice has no rate limit.
    for _ in 0..5 {
        call(&mut alice, "write_file", json!({"path": "/tmp/a"})).await.unwrap();
    }

    // Arguments over the limit: INVALID_ARGUMENT naming the field, before the tool runs.
    let long = "x".repeat(250);
    let status = call(&mut alice, "write_file", json!({"path": long})).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("max_argument_bytes"), "{}", status.message());
    let fields = status.get_details_bad_request().unwrap().field_violations;
    assert_eq!(fields[0].field, "arguments_json");

    // A result over the limit is refused, saying the tool ran; a tool configured to cut
    // its results gets them cut and marked.
    let path = format!("/tmp/{}", "y".repeat(140));
    let status = call(&mut alice, "write_file", json!({"path": path})).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("the tool ran"), "{}", status.message());
    let cut = call(&mut alice, "file_read", json!({"path": path})).await.unwrap();
    assert!(cut.structured_json.is_none(), "a structured result is kept only whole");
    let text = toolmesh_e2e::text(&cut);
    assert!(text.contains("[truncated by toolmesh: the result was"), "{text}");
    assert!(text.starts_with("{\"args\":{\"path\":\"/tmp/yy"), "{text}");
    assert!(!cut.is_error);

    // The agent may run one call at a time.
    let running = tokio::spawn({
        let mut bot = bot.clone();
        async move { call(&mut bot, "block", json!({})).await }
    });
    eventually(Duration::from_secs(10), || async {
        (probe.started.load(std::sync::atomic::Ordering::SeqCst) == 1).then_some(())
    })
    .await
    .unwrap();
    let status = call(&mut bot, "ticket_open", json!({})).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("bot-key-1 has 1 calls running"), "{}", status.message());
    probe.gate.add_permits(1);
    assert!(!running.await.unwrap().unwrap().is_error);
    assert!(!call(&mut bot, "ticket_open", json!({})).await.unwrap().is_error);
}

const APPROVALS: &str = r#"
    [[policy.rules]]
    name = "writes-need-approval"
    effect = "approve"
    tools = ["write_file"]
    reason = "writing changes the disk"
"#;

/// Calls `name` over StreamCallTool, answering each approval request with what `answer`
/// makes of it (no answer: `None`); returns the result and the approval requests seen.
async fn stream_approving(
    client: &mut Client,
    name: &str,
    arguments: Value,
    mut answer: impl FnMut(&ApprovalRequest) -> Option<ApprovalAnswer>,
) -> (Result<CallToolResponse, Status>, Vec<ApprovalRequest>) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let start = CallToolRequest {
        name: name.into(),
        arguments_json: arguments.to_string(),
        ..Default::default()
    };
    tx.send(CallToolClientMessage {
        message: Some(call_tool_client_message::Message::Start(start)),
    })
    .await
    .unwrap();
    let mut asked = Vec::new();
    let stream = client.stream_call_tool(tokio_stream::wrappers::ReceiverStream::new(rx)).await;
    let mut messages = match stream {
        Ok(response) => response.into_inner(),
        Err(status) => return (Err(status), asked),
    };
    loop {
        match messages.message().await {
            Ok(Some(message)) => match message.message {
                Some(call_tool_server_message::Message::Approval(request)) => {
                    if let Some(reply) = answer(&request) {
                        let reply = call_tool_client_message::Message::ApprovalAnswer(reply);
                        tx.send(CallToolClientMessage { message: Some(reply) }).await.unwrap();
                    }
                    asked.push(request);
                }
                Some(call_tool_server_message::Message::Result(result)) => {
                    return (Ok(result), asked);
                }
                _ => {}
            },
            Ok(None) => return (Err(Status::unavailable("no result")), asked),
            Err(status) => return (Err(status), asked),
        }
    }
}

fn approve(request: &ApprovalRequest, approved: bool, note: &str) -> ApprovalAnswer {
    ApprovalAnswer { approval_id: request.approval_id.clone(), approved, note: note.into() }
}

#[tokio::test]
async fn a_call_that_needs_approval_waits_for_the_person_and_is_bound_to_its_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let (server, keys) = server(APPROVALS, &audit).await;
    let mut bob = client(&server, &keys.bob).await;

    // Listed as usual; a unary call cannot ask, so it is refused saying how to call it.
    assert!(names(&mut bob, "").await.contains(&"write_file".to_owned()));
    let status = call(&mut bob, "write_file", json!({"path": "/tmp/a"})).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("needs a person's approval"), "{}", status.message());
    assert!(status.message().contains("StreamCallTool"), "{}", status.message());
    // Other tools need none.
    assert!(!call(&mut bob, "file_read", json!({"path": "/tmp/a"})).await.unwrap().is_error);

    // Approved: the request shows the tool, the arguments, the rule and why; the call runs.
    let (result, asked) =
        stream_approving(&mut bob, "write_file", json!({"path": "/tmp/a"}), |r| {
            Some(approve(r, true, "fine"))
        })
        .await;
    let result = result.unwrap();
    assert!(!result.is_error);
    assert_eq!(asked.len(), 1);
    let first = &asked[0];
    assert_eq!(first.tool, "write_file");
    assert_eq!(serde_json::from_str::<Value>(&first.arguments_json).unwrap()["path"], "/tmp/a");
    assert_eq!(first.rule, "writes-need-approval");
    assert_eq!(first.reason, "writing changes the disk");
    let now_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
            as i64;
    assert!(first.expires_at_unix_ms > now_ms, "the default timeout leaves time to answer");

    // Denied, with a note: PERMISSION_DENIED saying so.
    let (result, _) = stream_approving(&mut bob, "write_file", json!({"path": "/tmp/b"}), |r| {
        Some(approve(r, false, "not today"))
    })
    .await;
    let status = result.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(status.message().contains("not approved: not today"), "{}", status.message());

    // The first approval replayed for other arguments is refused: it names its call.
    let replayed = first.clone();
    let (result, asked) =
        stream_approving(&mut bob, "write_file", json!({"path": "/etc/x"}), |_| {
            Some(approve(&replayed, true, "replay"))
        })
        .await;
    let status = result.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(status.message().contains("another call (arguments differs)"), "{}", status.message());
    assert_ne!(asked[0].approval_id, first.approval_id);
    // Nor does an id that was altered count.
    let (result, _) = stream_approving(&mut bob, "write_file", json!({"path": "/tmp/c"}), |r| {
        let mut forged = approve(r, true, "");
        forged.approval_id.insert(3, 'x');
        Some(forged)
    })
    .await;
    assert!(result.unwrap_err().message().contains("not one this server issued"));

    // Every decision is audited.
    assert!(server.app.router().admission().policy().audit().flush(Duration::from_secs(5)));
    let lines = audit_lines(&audit);
    let approvals: Vec<(&str, &str)> = lines
        .iter()
        .filter(|l| l["event"] == "approval")
        .map(|l| (l["decision"].as_str().unwrap(), l["note"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(
        approvals,
        [("approved", "fine"), ("denied", "not today"), ("mismatch", "replay"), ("mismatch", "")]
    );
    assert!(
        lines
            .iter()
            .any(|l| l["event"] == "call" && l["decision"] == "approve" && l["outcome"] == "ok")
    );
}

#[tokio::test]
async fn a_toolkit_names_only_the_members_the_caller_may_see() {
    let dir = tempfile::tempdir().unwrap();
    let rule = r#"
        [[policy.rules]]
        name = "no-thinking-for-devs"
        effect = "deny"
        tools = ["think"]
        when = '"dev" in principal.roles'
    "#;
    let (server, keys) = server(rule, &dir.path().join("audit.jsonl")).await;
    let members = |key: String| {
        let server = &server;
        async move {
            let mut client = client(server, &key).await;
            let request = ListToolsRequest { toolkit: "reasoning".into(), ..Default::default() };
            let listed = client.list_tools(request).await.unwrap().into_inner();
            let tools: Vec<String> = listed.tools.into_iter().map(|t| t.name).collect();
            let toolkit = listed.toolkits.into_iter().find(|k| k.name == "reasoning").unwrap();
            (tools, toolkit.tools)
        }
    };
    let (tools, members_for_bob) = members(keys.bob.clone()).await;
    assert_eq!(tools, ["analyze"]);
    assert_eq!(members_for_bob, ["analyze"], "the hidden tool is not named by its toolkit");
    let (_, members_for_alice) = members(keys.alice.clone()).await;
    assert!(members_for_alice.contains(&"think".to_owned()), "{members_for_alice:?}");
}

#[tokio::test]
async fn an_approval_id_approves_its_own_request_only() {
    let dir = tempfile::tempdir().unwrap();
    let (server, keys) = server(APPROVALS, &dir.path().join("audit.jsonl")).await;
    let mut bob = client(&server, &keys.bob).await;
    let arguments = json!({"path": "/tmp/same"});
    let (result, asked) =
        stream_approving(&mut bob, "write_file", arguments.clone(), |r| Some(approve(r, true, "")))
            .await;
    assert!(!result.unwrap().is_error);
    // The same call again, on another stream, answered with the first request's id: refused,
    // although principal, tool, arguments and policy are the same and the id has not expired.
    let first = asked[0].clone();
    let (result, asked) = stream_approving(&mut bob, "write_file", arguments.clone(), |_| {
        Some(approve(&first, true, "replayed"))
    })
    .await;
    let status = result.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(status.message().contains("another request of the same call"), "{status:?}");
    assert_ne!(asked[0].approval_id, first.approval_id);
    // Answered with its own id, it runs.
    let (result, _) =
        stream_approving(&mut bob, "write_file", arguments, |r| Some(approve(r, true, ""))).await;
    assert!(!result.unwrap().is_error);
}

#[tokio::test]
async fn an_approval_not_answered_in_time_is_a_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let policy = format!("[policy]\napproval_timeout_ms = 300\n{APPROVALS}");
    let (server, keys) = server(&policy, &dir.path().join("audit.jsonl")).await;
    let mut bob = client(&server, &keys.bob).await;
    let started = std::time::Instant::now();
    let (result, asked) =
        stream_approving(&mut bob, "write_file", json!({"path": "/tmp/a"}), |_| None).await;
    let status = result.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(status.message().contains("none came within 300 ms"), "{}", status.message());
    assert_eq!(asked.len(), 1);
    assert!(started.elapsed() < Duration::from_secs(10));
}
