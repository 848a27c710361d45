//! Knowledge collections: ingestion, search, replacement, deletion, stores, and the
//! `toolmesh ingest` command.

use serde_json::{Value, json};
use std::time::Duration;
use tonic::Code;
use toolmesh::AppOptions;
use toolmesh_e2e::BinaryServer;
use toolmesh_e2e::cli::{run, stderr, stdout};
use toolmesh_e2e::{TestServer, eventually, text};
use toolmesh_proto::v1::CallToolRequest;

const KNOWLEDGE: &str = r#"
[[knowledge.collections]]
name = "docs"
description = "The product handbook: installing, billing and support."
filter_fields = ["lang"]
"#;

fn knowledge_document(
    id: &str,
    text: &str,
    markdown: bool,
    lang: &str,
) -> toolmesh_proto::v1::Document {
    toolmesh_proto::v1::Document {
        id: id.into(),
        text: text.into(),
        format: if markdown {
            toolmesh_proto::v1::DocumentFormat::Markdown
        } else {
            toolmesh_proto::v1::DocumentFormat::Text
        } as i32,
        metadata_json: json!({ "lang": lang }).to_string(),
    }
}

async fn knowledge_client(
    server: &TestServer,
) -> toolmesh_proto::v1::knowledge_service_client::KnowledgeServiceClient<
    toolmesh::client::Connection,
> {
    let channel = toolmesh::client::channel(&server.addr.to_string(), None).await.unwrap();
    toolmesh_proto::v1::knowledge_service_client::KnowledgeServiceClient::new(channel)
}

async fn ingest(
    server: &TestServer,
    collection: &str,
    documents: Vec<toolmesh_proto::v1::Document>,
) -> Result<toolmesh_proto::v1::IngestResponse, tonic::Status> {
    let request = toolmesh_proto::v1::IngestRequest { collection: collection.into(), documents };
    let mut client = knowledge_client(server).await;
    client.ingest(futures::stream::iter([request])).await.map(tonic::Response::into_inner)
}

/// 12,000 documents with long ids in one stream: the answer counts them and names the
/// first failures only, so that it stays far below a client's 4 MiB limit.
#[tokio::test]
async fn an_ingestion_answer_counts_documents_and_names_only_the_first_failures() {
    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start_in(KNOWLEDGE, AppOptions::default(), data.path()).await.unwrap();
    let long = "x".repeat(500);
    let mut messages: Vec<_> = (0..4)
        .map(|batch| toolmesh_proto::v1::IngestRequest {
            collection: "docs".into(),
            documents: (0..3_000)
                .map(|i| knowledge_document(&format!("{batch}-{i:04}-{long}"), " ", false, "en"))
                .collect(),
        })
        .collect();
    messages[3].documents.push(knowledge_document(
        "good.txt",
        "Reset it from the login page.",
        false,
        "en",
    ));
    let mut client = knowledge_client(&server).await;
    let answer = client.ingest(futures::stream::iter(messages)).await.unwrap().into_inner();
    assert_eq!((answer.ingested, answer.failed), (1, 12_000), "counted");
    assert_eq!(answer.results.len(), 100, "the first failures are named");
    assert!(answer.results[0].id.starts_with("0-0000-") && !answer.results[0].error.is_empty());
    let bytes = prost::Message::encoded_len(&answer);
    assert!(bytes < 64 << 10, "the answer is {bytes} bytes");
}

/// 120 "words" of 15,000 characters (a data URI, minified code) are a few tokens each to
/// the model: chunks are cut by bytes too, and a search answer stays small.
#[tokio::test]
async fn chunks_and_search_answers_are_bounded_in_bytes() {
    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start_in(KNOWLEDGE, AppOptions::default(), data.path()).await.unwrap();
    let word = "QUJD".repeat(3_750);
    let blob = vec![word.as_str(); 120].join(" ");
    let text = format!("The logo of the release notes, inline: {blob}");
    let ingested = ingest(&server, "docs", vec![knowledge_document("logo.md", &text, false, "en")])
        .await
        .unwrap();
    assert_eq!(ingested.failed, 0, "{ingested:?}");
    assert!(ingested.chunks >= 400, "cut by bytes: {} chunks", ingested.chunks);
    let answer = server
        .call("search_docs", json!({"query": "release notes logo", "top_k": 50}))
        .await
        .unwrap();
    let bytes = prost::Message::encoded_len(&answer);
    assert!(bytes < 600 << 10, "the answer is {bytes} bytes");
    let found = toolmesh_e2e::passages(&answer);
    assert!(
        !found.is_empty() && found.iter().all(|(_, text)| text.len() <= 4096),
        "{}",
        found.len()
    );
}

/// The passages of a knowledge search, as (document id, text).
async fn passages(server: &TestServer, arguments: Value) -> Vec<(String, String)> {
    toolmesh_e2e::passages(&server.call("search_docs", arguments).await.unwrap())
}

#[tokio::test]
async fn knowledge_is_ingested_found_replaced_deleted_and_kept_across_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start_in(KNOWLEDGE, AppOptions::default(), data.path()).await.unwrap();
    let install = "# Installing\n\nDownload the installer and run it; the setup wizard asks for a licence key.\n\n## Upgrades\n\nUpgrades keep your settings.";
    let ingested = ingest(
        &server,
        "docs",
        vec![
            knowledge_document("install.md", install, true, "en"),
            knowledge_document(
                "billing.txt",
                "Invoices are sent monthly by email. Refunds take five days.",
                false,
                "en",
            ),
            knowledge_document(
                "support.md",
                "# Support\n\nOpen a ticket; we answer within a day.",
                true,
                "de",
            ),
        ],
    )
    .await
    .unwrap();
    assert_eq!((ingested.ingested, ingested.failed), (3, 0), "{ingested:?}");
    assert!(ingested.chunks >= 3 && ingested.results.is_empty(), "{ingested:?}");

    // The collection's tool is in the catalog, read-only, searched like any tool.
    let tool = server.app.registry().resolve("search_docs").expect("the collection's tool");
    assert_eq!(tool.spec.annotations.read_only, Some(true));
    let found = passages(&server, json!({"query": "how do I install it with a licence key"})).await;
    assert_eq!(found[0].0, "install.md", "{found:?}");
    let response = server
        .call("search_docs", json!({"query": "refund of an invoice", "top_k": 1}))
        .await
        .unwrap();
    let text = text(&response);
    assert!(text.starts_with("[1] billing.txt (chunk 0, score"), "{text}");
    // A filter on a metadata field.
    let german = passages(&server, json!({"query": "ticket", "filter": {"lang": "de"}})).await;
    assert!(!german.is_empty() && german.iter().all(|(id, _)| id == "support.md"), "{german:?}");

    // Re-ingesting a document replaces it whole: its old text is gone.
    let changed = "# Removing\n\nUninstall from the control panel.";
    ingest(&server, "docs", vec![knowledge_document("install.md", changed, true, "en")])
        .await
        .unwrap();
    let found =
        passages(&server, json!({"query": "setup wizard licence key installer", "top_k": 10}))
            .await;
    assert!(found.iter().all(|(_, text)| !text.contains("wizard")), "{found:?}");
    assert!(found.iter().filter(|(id, _)| id == "install.md").count() <= 1);

    // Deleting a document leaves nothing of it.
    let mut client = knowledge_client(&server).await;
    let deleted = client
        .delete(toolmesh_proto::v1::DeleteRequest {
            collection: "docs".into(),
            document_ids: vec!["billing.txt".into(), "never-there".into()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(deleted.deleted_chunks, 1);
    assert_eq!(deleted.not_found, ["never-there"]);
    let found =
        passages(&server, json!({"query": "invoices refunds monthly email", "top_k": 10})).await;
    assert!(found.iter().all(|(id, _)| id != "billing.txt"), "{found:?}");

    let listed = client
        .list_collections(toolmesh_proto::v1::ListCollectionsRequest {})
        .await
        .unwrap()
        .into_inner();
    let docs = &listed.collections[0];
    assert_eq!(
        (docs.name.as_str(), docs.tool.as_str(), docs.documents),
        ("docs", "search_docs", 2)
    );
    assert!(docs.chunks >= 2 && docs.store.starts_with("embedded at "), "{docs:?}");
    server.stop().await.unwrap();

    // A restart finds the documents where they were.
    let server = TestServer::start_in(KNOWLEDGE, AppOptions::default(), data.path()).await.unwrap();
    let found = passages(&server, json!({"query": "uninstall from the control panel"})).await;
    assert_eq!(found[0].0, "install.md", "{found:?}");
}

#[tokio::test]
async fn knowledge_refuses_bad_input_clearly_and_loses_nothing_else() {
    let server = TestServer::start(KNOWLEDGE, AppOptions::default()).await.unwrap();
    let big = "word ".repeat(3 << 19); // 7.5 MiB is over a message; 2.5 MiB over the document limit
    let results = ingest(
        &server,
        "docs",
        vec![
            knowledge_document("empty.md", " \n ", true, "en"),
            knowledge_document("binary.txt", "abc\0def", false, "en"),
            knowledge_document("big.txt", &big[..(5 << 19)], false, "en"),
            knowledge_document("good.txt", "Passwords are reset from the login page.", false, "en"),
            toolmesh_proto::v1::Document {
                metadata_json: "[1]".into(),
                ..knowledge_document("meta.txt", "x", false, "en")
            },
        ],
    )
    .await
    .unwrap();
    let by_id: std::collections::HashMap<&str, &str> =
        results.results.iter().map(|r| (r.id.as_str(), r.error.as_str())).collect();
    assert_eq!(by_id["empty.md"], "the document is empty");
    assert!(by_id["binary.txt"].contains("not text"), "{results:?}");
    assert!(by_id["big.txt"].contains("knowledge.max_document_bytes"), "{results:?}");
    assert!(by_id["meta.txt"].contains("metadata_json"), "{results:?}");
    assert!(!by_id.contains_key("good.txt"), "only failures are listed: {results:?}");
    assert_eq!((results.ingested, results.failed), (1, 4));
    let found = passages(&server, json!({"query": "reset my password"})).await;
    assert_eq!(found[0].0, "good.txt");

    // A message beyond the server's limit is refused at once.
    let refused = ingest(&server, "docs", vec![knowledge_document("huge.txt", &big, false, "en")])
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");

    let missing = ingest(&server, "nope", vec![knowledge_document("a.txt", "a", false, "en")])
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert!(
        missing.message().contains("no knowledge collection \"nope\" (collections: docs)"),
        "{missing:?}"
    );

    let unknown = server
        .call("search_docs", json!({"query": "password", "filter": {"team": "x"}}))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::InvalidArgument, "{unknown:?}");
    assert!(unknown.message().contains("\"team\""), "{unknown:?}");
    // Nothing else was lost.
    assert_eq!(passages(&server, json!({"query": "reset my password"})).await[0].0, "good.txt");
}

/// Collections in three stores: the default one, a named embedded one, and a named Qdrant
/// server that does not answer (nothing listens on 127.0.0.1:1).
const STORES: &str = r#"
[vector.stores.archive]
backend = "embedded"

[vector.stores.remote]
backend = "qdrant"
url = "http://127.0.0.1:1"

[[knowledge.collections]]
name = "docs"
description = "The product handbook."

[[knowledge.collections]]
name = "archive"
description = "Handbooks of retired products."
store = "archive"

[[knowledge.collections]]
name = "remote"
description = "Documents on a shared server."
store = "remote"
"#;

#[tokio::test]
async fn knowledge_collections_live_in_the_store_they_name_and_a_store_that_is_down_fails_alone() {
    use tonic_health::pb::health_check_response::ServingStatus;

    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start_in(STORES, AppOptions::default(), data.path()).await.unwrap();
    let results = ingest(
        &server,
        "archive",
        vec![knowledge_document("fax.md", "The fax gateway sends invoices by fax.", true, "en")],
    )
    .await
    .unwrap();
    assert_eq!((results.ingested, results.failed), (1, 0), "{results:?}");
    let docs = ingest(
        &server,
        "docs",
        vec![knowledge_document(
            "reset.txt",
            "Passwords are reset from the login page.",
            false,
            "en",
        )],
    )
    .await
    .unwrap();
    assert_eq!(docs.ingested, 1, "{docs:?}");

    // Each collection is in its own store: the archive's passages are not in docs.
    let archived = server.call("search_archive", json!({"query": "send an invoice by fax"})).await;
    let archived = archived.unwrap();
    assert!(text(&archived).contains("fax.md"), "{archived:?}");
    let in_docs = passages(&server, json!({"query": "send an invoice by fax"})).await;
    assert!(in_docs.iter().all(|(id, _)| id != "fax.md"), "{in_docs:?}");
    assert!(data.path().join("vector/stores/archive").is_dir());

    // The server that does not answer fails its collection's calls at once, naming it...
    let started = std::time::Instant::now();
    let down = server.call("search_remote", json!({"query": "anything"})).await.unwrap_err();
    assert_eq!(down.code(), Code::Unavailable, "{down:?}");
    assert!(down.message().contains("127.0.0.1:1"), "{down:?}");
    let refused =
        ingest(&server, "remote", vec![knowledge_document("a.txt", "Some text.", false, "en")])
            .await
            .unwrap();
    assert_eq!(refused.failed, 1, "{refused:?}");
    assert!(refused.results[0].error.contains("127.0.0.1:1"), "{refused:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    // ...and its health says so, while the other stores are up...
    let health = |service: &'static str| {
        let server = &server;
        async move { server.health(service).await }
    };
    let reported = eventually(Duration::from_secs(15), || async {
        (health("toolmesh.vector.remote").await == Some(ServingStatus::NotServing)).then_some(())
    })
    .await;
    assert!(reported.is_some(), "toolmesh.vector.remote is not serving");
    assert_eq!(health("toolmesh.vector.archive").await, Some(ServingStatus::Serving));
    assert_eq!(health("toolmesh.vector.embedded").await, Some(ServingStatus::Serving));

    // ...the listing shows every collection, the one down with the reason...
    let listed = knowledge_client(&server)
        .await
        .list_collections(toolmesh_proto::v1::ListCollectionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .collections;
    let by_name: std::collections::HashMap<&str, &toolmesh_proto::v1::CollectionInfo> =
        listed.iter().map(|c| (c.name.as_str(), c)).collect();
    assert_eq!((by_name["archive"].documents, by_name["archive"].error.as_str()), (1, ""));
    assert!(by_name["archive"].store.contains("stores/archive"), "{listed:?}");
    assert_eq!(by_name["docs"].documents, 1);
    assert!(by_name["remote"].error.contains("127.0.0.1:1"), "{listed:?}");
    assert!(by_name["remote"].store.starts_with("qdrant"), "{listed:?}");

    // ...and everything else keeps working.
    assert_eq!(passages(&server, json!({"query": "reset my password"})).await[0].0, "reset.txt");
    let echoed = server.call("echo", json!({"still": "here"})).await.unwrap();
    assert!(!echoed.is_error, "{echoed:?}");
}

#[tokio::test]
async fn a_collection_naming_a_store_that_is_not_configured_fails_the_start_naming_the_key() {
    let config = r#"
[[knowledge.collections]]
name = "docs"
description = "The handbook."
store = "archive"
"#;
    let Err(error) = TestServer::start(config, AppOptions::default()).await else {
        panic!("the server started with a collection in a store that is not configured");
    };
    let message = format!("{error:#}");
    assert!(message.contains("knowledge.collections[0].store"), "{message}");
    assert!(message.contains("no vector store \"archive\" (stores: default)"), "{message}");
}

/// Two routers on one Qdrant server (`QDRANT_URL`, a gRPC address such as
/// `http://localhost:6334`): the tools are embedded once between them, and what one ingests
/// the other finds, and no longer finds once the other deleted it.
#[tokio::test]
#[cfg_attr(not(qdrant_url), ignore = "QDRANT_URL is not set: no Qdrant server to test against")]
async fn two_routers_on_one_qdrant_server_share_the_tool_index_and_the_documents() {
    let url = std::env::var("QDRANT_URL").unwrap();
    // A collection of this run only: the server outlives it.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let collection = format!("shared_{}_{}", std::process::id(), nanos.as_nanos());
    let config = format!(
        "[vector]\nbackend = \"qdrant\"\nurl = \"{url}\"\n\n[[knowledge.collections]]\n\
         name = \"{collection}\"\ndescription = \"Documents both routers see.\"\n"
    );
    let settled = |server: &TestServer| {
        let search = server.app.search();
        search.version() > 0 && search.indexed() > 0 && search.embedded() == search.indexed()
    };
    let first = TestServer::start(&config, AppOptions::default()).await.unwrap();
    eventually(Duration::from_secs(60), || async { settled(&first).then_some(()) })
        .await
        .expect("the first router has every tool's vector");
    let second = TestServer::start(&config, AppOptions::default()).await.unwrap();
    eventually(Duration::from_secs(30), || async { settled(&second).then_some(()) })
        .await
        .expect("the second router has every tool's vector");
    let tools = first.app.search().indexed() as u64;
    assert_eq!(second.app.search().embeddings_made(), 0, "the second router embedded nothing");
    assert!(first.app.search().embeddings_made() <= tools);

    let document =
        knowledge_document("shared.txt", "The VPN is set up with the office key.", false, "en");
    let ingested = ingest(&first, &collection, vec![document]).await.unwrap();
    assert_eq!(ingested.ingested, 1, "{ingested:?}");
    let tool = format!("search_{collection}");
    let ids = |server| passage_ids(server, &tool, "set up the VPN");
    assert_eq!(ids(&second).await, ["shared.txt"], "the second router finds the first's document");
    let deleted = knowledge_client(&second)
        .await
        .delete(toolmesh_proto::v1::DeleteRequest {
            collection: collection.clone(),
            document_ids: vec!["shared.txt".into()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(deleted.deleted_chunks, 1, "{deleted:?}");
    assert!(ids(&first).await.is_empty(), "the first router no longer finds it");
}

/// The document ids of the passages `tool` finds for `query`, best first.
async fn passage_ids(server: &TestServer, tool: &str, query: &str) -> Vec<String> {
    let response = server.call(tool, json!({ "query": query })).await.unwrap();
    toolmesh_e2e::passages(&response).into_iter().map(|(id, _)| id).collect()
}

#[tokio::test]
async fn toolmesh_ingest_loads_a_tree_names_each_bad_file_and_replaces_on_a_second_run() {
    let config = "[[knowledge.collections]]\nname = \"docs\"\ndescription = \"The handbook.\"\n";
    let server = BinaryServer::with_config(config, &[]).await.unwrap();
    let addr = server.addr.to_string();
    let tree = tempfile::tempdir().unwrap();
    let dir = tree.path();
    std::fs::create_dir_all(dir.join("guide")).unwrap();
    let write = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).unwrap();
    write("guide/install.md", b"# Guide\n\n## Installing\n\nRun the installer, then sign in.\n");
    write("faq.txt", b"Passwords are reset from the login page.");
    write("empty.txt", b" \n\n");
    write("blob.txt", b"GIF89a\0\0\x01\x02");
    write("guide/logo.png", b"\x89PNG");
    write("big.txt", "word ".repeat(10 << 20).as_bytes()); // 50 MiB

    let dir_arg = dir.display().to_string();
    let first = run(&["ingest", "--collection", "docs", "--server", &addr, &dir_arg]).await;
    let (out, err) = (stdout(&first), stderr(&first));
    // Some files failed: the exit code says so, each is named with its reason.
    assert_eq!(first.status.code(), Some(1), "{out}\n{err}");
    assert!(out.contains("ingested 2 documents") && out.contains("3 failed, 1 skipped"), "{out}");
    assert!(err.contains("empty.txt: the file is empty"), "{err}");
    assert!(err.contains("blob.txt: not a text file"), "{err}");
    assert!(err.contains("big.txt: the file is 52428800 bytes"), "{err}");
    assert!(err.contains("skipped") && err.contains("logo.png"), "{err}");
    // Not a terminal: progress is plain lines.
    assert!(err.contains("ingested 5/5 documents"), "{err}");

    let search = |query: &'static str| {
        let addr = addr.clone();
        async move {
            let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
            let request = CallToolRequest {
                name: "search_docs".into(),
                arguments_json: json!({ "query": query }).to_string(),
                ..Default::default()
            };
            toolmesh_e2e::passages(&client.call_tool(request).await.unwrap().into_inner())
        }
    };
    // Ids are paths relative to the directory given; Markdown keeps its headings.
    let found = search("how do I install it").await;
    assert_eq!(found[0].0, "guide/install.md", "{found:?}");
    assert!(found[0].1.contains("Installing"), "{found:?}");
    assert_eq!(search("reset my password").await[0].0, "faq.txt");

    // A second run over the changed tree replaces the documents: the old text is gone.
    write("faq.txt", b"Passwords are changed in the account settings.");
    for name in ["empty.txt", "blob.txt", "big.txt"] {
        std::fs::remove_file(dir.join(name)).unwrap();
    }
    let second = run(&["ingest", "--collection", "docs", "--server", &addr, &dir_arg]).await;
    assert!(second.status.success(), "{}\n{}", stdout(&second), stderr(&second));
    let found = search("reset my password").await;
    assert_eq!(found[0].0, "faq.txt", "{found:?}");
    assert!(found.iter().all(|(_, text)| !text.contains("login page")), "{found:?}");
    assert_eq!(found.iter().filter(|(id, _)| id == "faq.txt").count(), 1, "{found:?}");

    // A collection that does not exist: one clear line, nothing sent.
    let missing = run(&["ingest", "--collection", "nope", "--server", &addr, &dir_arg]).await;
    assert!(!missing.status.success());
    assert!(stderr(&missing).contains("no knowledge collection \"nope\""), "{}", stderr(&missing));
}

/// Two trees of the same file names go into one collection each under a prefix of its own
/// (together they are refused, naming both files); a tree ingested again says how many
/// documents it replaced; `toolmesh knowledge list` counts them and `delete` takes them out;
/// a filter on a collection without filterable fields says which field is wrong.
#[tokio::test]
async fn trees_keep_apart_under_prefixes_and_knowledge_lists_and_deletes() {
    let config = "[[knowledge.collections]]\nname = \"docs\"\ndescription = \"The handbook.\"\n";
    let server = BinaryServer::with_config(config, &[]).await.unwrap();
    let addr = server.addr.to_string();
    let trees = tempfile::tempdir().unwrap();
    for (root, text) in
        [("handbook", "Expenses are filed monthly."), ("wiki", "The wiki has recipes.")]
    {
        std::fs::create_dir_all(trees.path().join(root)).unwrap();
        std::fs::write(trees.path().join(root).join("README.md"), format!("# {root}\n\n{text}\n"))
            .unwrap();
    }
    let tree = |root: &str| trees.path().join(root).display().to_string();
    let ingest = |extra: Vec<String>| {
        let addr = addr.clone();
        async move {
            let mut args = vec!["ingest".to_owned(), "--collection".into(), "docs".into()];
            args.extend(["--server".to_owned(), addr]);
            args.extend(extra);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run(&args).await
        }
    };

    // An undeclared collection is said before any path is looked at.
    let missing =
        run(&["ingest", "--collection", "nope", "--server", &addr, "/no/such/path"]).await;
    let err = stderr(&missing);
    assert!(err.contains("no knowledge collection \"nope\"; it has docs"), "{err}");

    let together = ingest(vec![tree("handbook"), tree("wiki")]).await;
    assert!(!together.status.success());
    let err = stderr(&together);
    assert!(err.contains("handbook/README.md") && err.contains("wiki/README.md"), "{err}");
    assert!(err.contains("--prefix"), "{err}");

    for root in ["handbook", "wiki"] {
        let one = ingest(vec!["--prefix".into(), format!("{root}/"), tree(root)]).await;
        assert!(one.status.success(), "{}", stderr(&one));
        assert!(stdout(&one).contains("ingested 1 documents"), "{}", stdout(&one));
        assert!(!stdout(&one).contains("replacing"), "{}", stdout(&one));
    }
    let again = ingest(vec!["--prefix".into(), "wiki/".into(), tree("wiki")]).await;
    assert!(
        stdout(&again).contains("1 of them replacing a document of the same id"),
        "{}",
        stdout(&again)
    );

    let list = run(&["knowledge", "list", "--server", &addr]).await;
    assert!(list.status.success(), "{}", stderr(&list));
    let row = stdout(&list).lines().find(|l| l.starts_with("docs")).map(str::to_owned);
    let row = row.unwrap_or_else(|| panic!("{}", stdout(&list)));
    assert_eq!(row.split_whitespace().nth(1), Some("2"), "two documents: {row}");

    let delete = run(&[
        "knowledge",
        "delete",
        "--collection",
        "docs",
        "--server",
        &addr,
        "wiki/README.md",
        "wiki/nope.md",
    ])
    .await;
    assert_eq!(delete.status.code(), Some(1), "{}", stderr(&delete));
    assert!(stdout(&delete).contains("deleted 1 documents"), "{}", stdout(&delete));
    assert!(stderr(&delete).contains("no document \"wiki/nope.md\""), "{}", stderr(&delete));
    let list = run(&["knowledge", "list", "--server", &addr]).await;
    let row = stdout(&list).lines().find(|l| l.starts_with("docs")).map(str::to_owned).unwrap();
    assert_eq!(row.split_whitespace().nth(1), Some("1"), "one document left: {row}");

    let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
    let request = CallToolRequest {
        name: "search_docs".into(),
        arguments_json: json!({ "query": "expenses", "filter": {"author": "ann"} }).to_string(),
        ..Default::default()
    };
    let refused = client.call_tool(request).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("author"), "{}", refused.message());
    assert!(!refused.message().contains("more than 0 properties"), "{}", refused.message());
}
