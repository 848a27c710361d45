//! The meta-tools searchTools and callTool through CallTool, with routing profiles and
//! stateless search-before-call enforcement.

use std::time::Duration;

use serde_json::{Value, json};
use std::sync::Arc;
use tonic::Code;
use toolmesh::AppOptions;
use toolmesh_e2e::calls::call as call_tool_rpc;
use toolmesh_e2e::calls::{server, structured};
use toolmesh_e2e::tools::BlockingProbe;
use toolmesh_e2e::{TestServer, eventually};
use toolmesh_proto::v1::{CallToolRequest, CallToolResponse, ListToolsRequest};

/// Calls `name` with `arguments` in `session` under `profile`.
async fn call(
    server: &TestServer,
    name: &str,
    arguments: Value,
    session: &str,
    profile: &str,
) -> Result<CallToolResponse, tonic::Status> {
    let request = CallToolRequest {
        name: name.into(),
        arguments_json: arguments.to_string(),
        session_id: session.into(),
        profile: profile.into(),
        ..Default::default()
    };
    server.client().await.call_tool(request).await.map(tonic::Response::into_inner)
}

/// Runs searchTools until the index holds what it needs; returns the tool names, best
/// first, and the searchToken.
async fn search(
    server: &TestServer,
    query: &str,
    top_k: u64,
    session: &str,
    profile: &str,
    expect: &str,
) -> (Vec<String>, String) {
    eventually(Duration::from_secs(10), || async {
        let response =
            call(server, "searchTools", json!({"query": query, "topK": top_k}), session, profile)
                .await
                .unwrap();
        let result: Value = serde_json::from_str(response.structured_json.as_deref()?).unwrap();
        let names: Vec<String> = result["tools"]
            .as_array()?
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect();
        names
            .iter()
            .any(|n| n == expect)
            .then(|| (names, result["searchToken"].as_str().unwrap().to_owned()))
    })
    .await
    .unwrap_or_else(|| panic!("searchTools finds {expect} for {query:?}"))
}

async fn list(server: &TestServer, profile: &str) -> Vec<toolmesh_proto::v1::Tool> {
    let request = ListToolsRequest { profile: profile.into(), ..Default::default() };
    server.client().await.list_tools(request).await.unwrap().into_inner().tools
}

#[tokio::test]
async fn search_then_call_through_the_meta_tools() {
    let server = TestServer::start("", AppOptions::default()).await.unwrap();

    // An agent of the default profile sees only the two meta-tools; searchTools says what
    // is behind it.
    let visible = list(&server, "default").await;
    let names: Vec<&str> = visible.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["callTool", "searchTools"]);
    let description = &visible[1].description;
    assert!(description.contains("among 3 tools"), "{description}");
    assert!(description.contains("local builtin (3 tools)"), "{description}");
    assert!(description.contains("Toolkits: reasoning"), "{description}");
    assert!(description.contains("For example: "), "{description}");
    assert!(visible[1].input_schema_json.contains("query"));
    // They are tools of the whole catalog too.
    let all = list(&server, "").await;
    assert!(all.iter().any(|t| t.name == "searchTools") && all.iter().any(|t| t.name == "echo"));

    let (found, token) =
        search(&server, "return my arguments unchanged", 2, "s1", "", "echo").await;
    assert!(found.len() <= 2, "topK is honoured: {found:?}");
    assert!(!found.iter().any(|n| n == "searchTools" || n == "callTool"), "{found:?}");

    let echoed = call(
        &server,
        "callTool",
        json!({"name": "echo", "arguments": {"greeting": "hello"}, "searchToken": token}),
        "s1",
        "",
    )
    .await
    .unwrap();
    assert!(!echoed.is_error);
    assert!(toolmesh_e2e::text(&echoed).contains("hello"), "{}", toolmesh_e2e::text(&echoed));

    // Search first: no token, another session's token, or a tool the search did not return.
    let refused = |result: Result<CallToolResponse, tonic::Status>, why: &str| {
        let status = result.unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition, "{why}: {}", status.message());
        assert!(status.message().contains("Call searchTools"), "{}", status.message());
        status.message().to_owned()
    };
    let message =
        refused(call(&server, "callTool", json!({"name": "echo"}), "s1", "").await, "no token");
    assert!(message.contains("no searchToken"), "{message}");
    let other_session = call(
        &server,
        "callTool",
        json!({"name": "echo", "arguments": {}, "searchToken": token}),
        "s2",
        "",
    )
    .await;
    refused(other_session, "another session");
    let unlisted =
        ["think", "analyze"].into_iter().find(|n| !found.iter().any(|f| f == n)).unwrap();
    let message = refused(
        call(&server, "callTool", json!({"name": unlisted, "searchToken": token}), "s1", "").await,
        "not in the result",
    );
    assert!(message.contains(&format!("did not return {unlisted}")), "{message}");
    let forged = format!("{}A", &token[..token.len() - 1]);
    refused(
        call(&server, "callTool", json!({"name": "echo", "searchToken": forged}), "s1", "").await,
        "forged token",
    );

    // No recursion through callTool.
    for meta in ["callTool", "searchTools"] {
        let status =
            call(&server, "callTool", json!({"name": meta, "searchToken": token}), "s1", "")
                .await
                .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
    }

    // Arguments are still checked against the called tool's schema.
    let (_, token) = search(&server, "record one reasoning step", 3, "s1", "", "think").await;
    let status = call(
        &server,
        "callTool",
        json!({"name": "think", "arguments": {}, "searchToken": token}),
        "s1",
        "",
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
    assert!(status.message().contains("thought"), "{}", status.message());

    // Naming the profile, hidden tools cannot be called directly either.
    let status = call(&server, "echo", json!({}), "s1", "default").await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("callTool"), "{}", status.message());
    let status =
        call(&server, "searchTools", json!({"query": "x"}), "s1", "nope").await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("no routing profile `nope`"), "{}", status.message());
}

#[tokio::test]
async fn replicas_sharing_a_key_accept_each_others_searches() {
    let keyed = |key: &str| format!("[routing]\ntoken_key = \"{key}\"\n");
    let a = TestServer::start(&keyed("shared-secret"), AppOptions::default()).await.unwrap();
    let b = TestServer::start(&keyed("shared-secret"), AppOptions::default()).await.unwrap();
    let c = TestServer::start(&keyed("another-secret"), AppOptions::default()).await.unwrap();

    let (_, token) = search(&a, "return my arguments unchanged", 3, "agent-7", "", "echo").await;
    let arguments = json!({"name": "echo", "arguments": {"n": 1}, "searchToken": token});
    let on_b = call(&b, "callTool", arguments.clone(), "agent-7", "").await.unwrap();
    assert!(toolmesh_e2e::text(&on_b).contains("\"n\""));
    let on_c = call(&c, "callTool", arguments, "agent-7", "").await.unwrap_err();
    assert_eq!(on_c.code(), Code::FailedPrecondition);
    assert!(on_c.message().contains("not one that searchTools returned"), "{}", on_c.message());
}

#[tokio::test]
async fn profiles_set_what_is_exposed_searchable_and_enforced() {
    let config = r#"
[[routing.profiles]]
name = "ops"
expose = ["echo"]
pool = ["toolkit:reasoning"]
top_k = 1

[[routing.profiles]]
name = "open"
pool = ["th*"]
enforce_search_before_call = false
"#;
    let server = TestServer::start(config, AppOptions::default()).await.unwrap();

    let visible = list(&server, "ops").await;
    let names: Vec<&str> = visible.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["callTool", "echo", "searchTools"]);
    let description = &visible.iter().find(|t| t.name == "searchTools").unwrap().description;
    assert!(description.contains("among 2 tools"), "the ops pool: {description}");

    // The pool bounds the search; top_k is the profile's when the model gives none.
    let found = eventually(Duration::from_secs(10), || async {
        let response = call(
            &server,
            "searchTools",
            json!({"query": "return my arguments unchanged"}),
            "",
            "ops",
        )
        .await
        .unwrap();
        let result: Value = serde_json::from_str(response.structured_json.as_deref()?).unwrap();
        let tools = result["tools"].as_array()?.clone();
        (!tools.is_empty()).then_some(tools)
    })
    .await
    .unwrap();
    assert_eq!(found.len(), 1);
    assert!(["think", "analyze"].contains(&found[0]["name"].as_str().unwrap()), "{found:?}");

    // An exposed tool is callable directly and through callTool without a search.
    assert!(call(&server, "echo", json!({}), "", "ops").await.is_ok());
    assert!(call(&server, "callTool", json!({"name": "echo"}), "", "ops").await.is_ok());

    // Without enforcement, callTool calls any tool of the pool, and only of the pool.
    let thought = call(
        &server,
        "callTool",
        json!({"name": "think", "arguments": {"title": "Plan", "thought": "List the files first."}}),
        "",
        "open",
    )
    .await
    .unwrap();
    assert!(!thought.is_error);
    let outside = call(&server, "callTool", json!({"name": "echo"}), "", "open").await.unwrap_err();
    assert_eq!(outside.code(), Code::NotFound);
}

#[tokio::test]
async fn health_says_whether_search_ranks_with_embeddings() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let service = toolmesh::SEARCH_EMBEDDINGS_HEALTH;
    let hybrid = TestServer::start("", AppOptions::default()).await.unwrap();
    assert_eq!(hybrid.health(service).await, Some(ServingStatus::Serving));
    let lexical =
        TestServer::start("[search]\nembeddings = false\n", AppOptions::default()).await.unwrap();
    assert_eq!(lexical.health(service).await, Some(ServingStatus::NotServing));
    // Lexical search still answers.
    let (found, _) = search(&lexical, "echo arguments unchanged", 3, "", "", "echo").await;
    assert!(!found.is_empty());
}

/// Through callTool, the called tool's refusal arrives as a direct call's does: the same
/// code, message and `google.rpc.BadRequest` naming each failing argument.
#[tokio::test]
async fn call_tool_passes_the_called_tools_errors_through_whole() {
    use tonic_types::StatusExt;
    let server = TestServer::start("", AppOptions::default()).await.unwrap();
    let arguments = json!({"title": 1});
    let direct = call(&server, "think", arguments.clone(), "s1", "").await.unwrap_err();
    let (_, token) = search(&server, "record one reasoning step", 3, "s1", "", "think").await;
    let nested = call(
        &server,
        "callTool",
        json!({"name": "think", "arguments": arguments, "searchToken": token}),
        "s1",
        "",
    )
    .await
    .unwrap_err();
    assert_eq!(nested.code(), Code::InvalidArgument);
    assert_eq!(nested.code(), direct.code());
    assert_eq!(nested.message(), direct.message());
    let fields = |status: &tonic::Status| {
        let details = status.get_details_bad_request().expect("a BadRequest detail");
        details.field_violations.iter().map(|v| v.field.clone()).collect::<Vec<_>>()
    };
    assert_eq!(fields(&nested), fields(&direct));
    assert!(fields(&nested).contains(&"/title".to_owned()), "{:?}", fields(&nested));

    // Malformed arguments of the called tool do not arise (callTool hands them on as JSON),
    // but an unknown one keeps NOT_FOUND.
    let unknown = call(&server, "callTool", json!({"name": "nope"}), "s1", "").await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
}

/// A reload puts new routing profiles in force through the front door: what a profile
/// exposes, lists and admits follows at once, and searchTools describes the new pool.
#[tokio::test]
async fn reloaded_routing_profiles_apply_to_the_next_calls() {
    let before = "[[routing.profiles]]\nname = \"ops\"\nexpose = [\"echo\"]\npool = [\"toolkit:reasoning\"]\n";
    let server = TestServer::start(before, AppOptions::default()).await.unwrap();
    let names = |tools: Vec<toolmesh_proto::v1::Tool>| {
        tools.into_iter().map(|t| t.name).collect::<Vec<_>>()
    };
    assert_eq!(names(list(&server, "ops").await), ["callTool", "echo", "searchTools"]);
    assert!(call(&server, "echo", json!({}), "", "ops").await.is_ok());

    let after = "[[routing.profiles]]\nname = \"ops\"\nexpose = [\"think\"]\npool = [\"echo\"]\n";
    server.app.reload(&TestServer::config(after).unwrap()).await.unwrap();
    let visible = list(&server, "ops").await;
    let description = visible.iter().find(|t| t.name == "searchTools").unwrap().description.clone();
    assert_eq!(names(visible), ["callTool", "searchTools", "think"]);
    assert!(description.contains("among 1 tools"), "the new pool: {description}");
    let refused = call(&server, "echo", json!({}), "", "ops").await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        call(&server, "think", json!({"title": "t", "thought": "ok"}), "", "ops").await.is_ok()
    );
}

#[tokio::test]
async fn search_tools_ranks_the_live_catalog() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("", &probe).await;
    let client = server.client().await;
    let search = |query: &str, source_name: &str| {
        let mut client = client.clone();
        let request = toolmesh_proto::v1::SearchToolsRequest {
            query: query.into(),
            top_k: 3,
            source_name: source_name.into(),
            ..Default::default()
        };
        async move { client.search_tools(request).await.map(|r| r.into_inner()) }
    };
    // The first start embeds the tools in the background at the lowest priority: beside the
    // other tests on a busy machine that can take seconds.
    let found = eventually(Duration::from_secs(60), || async {
        let response = search("record a reasoning step before acting", "").await.unwrap();
        (response.index_complete
            && response.hits.first().map(|h| h.tool.as_ref().unwrap().name.as_str())
                == Some("think"))
        .then_some(response)
    })
    .await
    .expect("think ranks first once the index is complete");
    // Without a policy the index is counted: every tool of the catalog, each with its vector.
    let catalog = server.app.registry().snapshot().len() as u64;
    assert_eq!((found.indexed_tools, found.embedded_tools), (catalog, catalog));
    assert!(
        found.ranking.starts_with("convex[dense=0.5](bm25, minilm"),
        "hybrid ranking with the real model: {}",
        found.ranking
    );
    assert!(found.hits.len() <= 3);
    assert!(found.hits.windows(2).all(|w| w[0].score >= w[1].score), "best first");
    let think = found.hits[0].tool.as_ref().unwrap();
    assert!(think.input_schema_json.contains("thought"), "hits carry the full definition");

    let filtered = search("record a reasoning step", "embedded").await.unwrap();
    assert!(
        filtered
            .hits
            .iter()
            .all(|h| h.tool.as_ref().unwrap().source.as_ref().unwrap().name == "embedded")
    );
    let empty = search("  ", "").await.unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument);

    // The index follows the catalog: a tool added by a reload is found, then forgotten.
    let config = r#"
[[tools.command]]
name = "word_count"
description = "Counts the words of a text document."
command = "/usr/bin/wc"
"#;
    server.app.reload(&TestServer::config(config).unwrap()).await.unwrap();
    let added = eventually(Duration::from_secs(5), || async {
        let response = search("count the words in my document", "").await.unwrap();
        response.hits.iter().any(|h| h.tool.as_ref().unwrap().name == "word_count").then_some(())
    })
    .await;
    assert!(added.is_some(), "a new tool is searchable");
    server.app.reload(&TestServer::config("").unwrap()).await.unwrap();
    let removed = eventually(Duration::from_secs(5), || async {
        let response = search("count the words in my document", "").await.unwrap();
        (!response.hits.iter().any(|h| h.tool.as_ref().unwrap().name == "word_count")).then_some(())
    })
    .await;
    assert!(removed.is_some(), "a removed tool is purged");
}

/// A query beyond `search.max_query_bytes` (4096 by default) — a whole dialogue an agent
/// passed on — is searched by its beginning, and the answer says how much was cut, through
/// SearchTools and searchTools alike.
#[tokio::test]
async fn a_long_query_is_searched_by_its_beginning_and_the_cut_reported() {
    let probe = Arc::new(BlockingProbe::default());
    let config = "[[tools.command]]\nname = \"word_count\"\ndescription = \"Counts the words of a text document.\"\ncommand = \"/usr/bin/wc\"\n";
    let server = server(config, &probe).await;
    let mut client = server.client().await;
    // 18.7 KB, with a multi-byte character across the limit.
    let long = format!("count the words {}xé{}", "a ".repeat(2039), "talk ".repeat(2900));
    assert!(!long.is_char_boundary(4096), "the cut falls inside a character");
    let search = |query: &str| toolmesh_proto::v1::SearchToolsRequest {
        query: query.into(),
        ..Default::default()
    };
    // The index takes the tools in after the start.
    let short = eventually(Duration::from_secs(30), || {
        let mut client = client.clone();
        async move {
            let short = client.search_tools(search("count the words")).await.ok()?.into_inner();
            short.index_complete.then_some(short)
        }
    })
    .await
    .expect("the index takes in the catalog");
    assert_eq!(short.query_bytes_cut, 0);
    let answer = client.search_tools(search(&long)).await.expect("a long query is searched");
    let answer = answer.into_inner();
    assert_eq!(answer.query_bytes_cut as usize, long.len() - 4095);
    assert_eq!(answer.hits[0].tool.as_ref().unwrap().name, "word_count", "{answer:?}");

    let meta = call_tool_rpc(&mut client, "searchTools", json!({"query": long})).await.unwrap();
    let structured = structured(&meta);
    let cut = structured["queryCut"].as_str().unwrap();
    assert!(cut.contains("first 4095 bytes"), "{cut}");
    assert_eq!(structured["tools"][0]["name"], "word_count");
}

#[tokio::test]
async fn a_restart_on_the_same_data_embeds_no_tool_again_and_ranks_alike() {
    let data = tempfile::tempdir().unwrap();
    let described = |description: &str| {
        format!(
            "[[tools.command]]\nname = \"word_count\"\ndescription = \"{description}\"\ncommand = \"/usr/bin/wc\"\n"
        )
    };
    let config = described("Counts the words of a text document.");
    let settled = |server: &TestServer| {
        let search = server.app.search();
        search.version() > 0 && search.indexed() > 0 && search.embedded() == search.indexed()
    };
    let top = |server: &TestServer| {
        let search = server.app.search().clone();
        async move {
            let hits = search.search("record a reasoning step before acting", 3, |_| true).await;
            hits.unwrap().into_iter().map(|h| h.tool.spec.name.clone()).collect::<Vec<_>>()
        }
    };

    let first = TestServer::start_in(&config, AppOptions::default(), data.path()).await.unwrap();
    eventually(Duration::from_secs(60), || async { settled(&first).then_some(()) })
        .await
        .expect("every tool embedded");
    let tools = first.app.search().indexed();
    // A fresh data directory: every tool text is embedded once.
    assert_eq!(first.app.search().embeddings_made() as usize, tools);
    let ranked = top(&first).await;
    assert_eq!(ranked[0], "think");
    first.stop().await.unwrap();

    let second = TestServer::start_in(&config, AppOptions::default(), data.path()).await.unwrap();
    eventually(Duration::from_secs(10), || async {
        (settled(&second) && second.app.search().indexed() == tools).then_some(())
    })
    .await
    .expect("the index caught up from the store");
    assert_eq!(second.app.search().embeddings_made(), 0, "nothing is embedded again");
    assert_eq!(top(&second).await, ranked);
    second.stop().await.unwrap();

    // A description changed while nothing ran: its new text is embedded, and the point of
    // the old one does not stay behind in the store.
    let changed = described("Tallies lines, words and bytes of a file.");
    let third = TestServer::start_in(&changed, AppOptions::default(), data.path()).await.unwrap();
    eventually(Duration::from_secs(30), || async {
        (settled(&third) && third.app.search().indexed() == tools).then_some(())
    })
    .await
    .expect("the index caught up");
    let search = third.app.search();
    assert_eq!(search.embeddings_made(), 1, "only the changed text is embedded");
    // Swept once the catalog has been still for a second.
    let points = || async { search.store().count(search.collection(), None).await.unwrap() };
    let swept = eventually(Duration::from_secs(10), || async {
        (points().await as usize == tools).then_some(())
    })
    .await;
    assert!(swept.is_some(), "one point per tool, none of an old text: {}", points().await);
}
