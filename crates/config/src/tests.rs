use std::collections::HashMap;

use super::*;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

#[test]
fn defaults_parse() {
    let config = load_str(None, &HashMap::new()).expect("defaults are valid");
    assert_eq!(config.server.listen.to_string(), "127.0.0.1:50051");
    assert!(config.builtin.reasoning && config.builtin.echo);
    assert!(config.telemetry.otlp_endpoint.is_none());
    assert!(config.tools.http.is_empty() && config.tools.command.is_empty());
}

#[test]
fn example_file_parses() {
    let text = include_str!("../../../deploy/toolmesh.toml");
    let config = load_str(Some(("toolmesh.toml", text)), &env(&[("WEATHER_API_TOKEN", "t0k")]))
        .expect("the example config is valid");
    assert!(!config.tools.http.is_empty());
    assert!(!config.tools.command.is_empty());
}

#[test]
fn file_overrides_defaults_and_env_overrides_file() {
    let file = "[server]\nlisten = \"127.0.0.1:7000\"\n[workers]\nsize = 3\n";
    let config = load_str(Some(("f.toml", file)), &env(&[])).unwrap();
    assert_eq!(config.server.listen.port(), 7000);
    assert_eq!(config.workers.size.get(), 3);
    assert_eq!(config.workers.queue, 256, "untouched keys keep their defaults");
    assert_eq!(config.workers.tool_share, 0.5);
    let err = load_str(Some(("f.toml", "[workers]\ntool_share = 0\n")), &env(&[])).unwrap_err();
    assert!(err.to_string().contains("workers.tool_share"), "{err}");

    let config = load_str(
        Some(("f.toml", file)),
        &env(&[("TOOLMESH__WORKERS__SIZE", "5"), ("TOOLMESH__TELEMETRY__LOG", "debug")]),
    )
    .unwrap();
    assert_eq!(config.workers.size.get(), 5);
    assert_eq!(config.telemetry.log, "debug");
}

#[test]
fn unknown_key_is_named() {
    let err = load_str(Some(("f.toml", "[server]\nlisten_addr = \"x\"\n")), &env(&[])).unwrap_err();
    let line = err.to_string();
    assert!(line.contains("f.toml") && line.contains("listen_addr"), "{line}");
    assert!(!line.contains('\n'));
}

#[test]
fn wrong_type_names_the_key_path() {
    let file = r#"
[[tools.command]]
name = "a"
description = "d"
command = "/bin/true"
timeout_ms = "soon"
"#;
    let err = load_str(Some(("f.toml", file)), &env(&[])).unwrap_err();
    match &err {
        ConfigError::Key { key, .. } => assert_eq!(key, "tools.command[0].timeout_ms"),
        other => panic!("unexpected error {other:?}"),
    }
}

#[test]
fn bad_listen_address_is_named() {
    let err =
        load_str(Some(("f.toml", "[server]\nlisten = \"nowhere\"\n")), &env(&[])).unwrap_err();
    assert!(err.to_string().contains("server.listen"), "{err}");
}

#[test]
fn header_env_references_resolve_or_fail_loudly() {
    let file = r#"
[[tools.http]]
name = "h"
description = "d"
url = "https://example.invalid/{{q}}"
headers = { Authorization = "Bearer ${TOKEN}" }
"#;
    let config = load_str(Some(("f.toml", file)), &env(&[("TOKEN", "s3cret")])).unwrap();
    assert_eq!(config.tools.http[0].headers["Authorization"], "Bearer s3cret");
    let err = load_str(Some(("f.toml", file)), &env(&[])).unwrap_err();
    assert!(err.to_string().contains("tools.http[0].headers.Authorization"), "{err}");
    assert!(err.to_string().contains("TOKEN"), "{err}");
}

#[test]
fn duplicate_and_invalid_names_are_rejected() {
    let file = r#"
[[tools.command]]
name = "x"
description = "d"
command = "/bin/true"
[[tools.http]]
name = "x"
description = "d"
url = "http://127.0.0.1/"
"#;
    let err = load_str(Some(("f.toml", file)), &env(&[])).unwrap_err();
    assert!(err.to_string().contains("already used"), "{err}");

    let file =
        "[[tools.command]]\nname = \"has space\"\ndescription = \"d\"\ncommand = \"/bin/true\"\n";
    let err = load_str(Some(("f.toml", file)), &env(&[])).unwrap_err();
    assert!(err.to_string().contains("tools.command[0].name"), "{err}");
}

#[test]
fn syntax_error_names_the_line() {
    let err = load_str(Some(("f.toml", "[server]\nlisten = \n")), &env(&[])).unwrap_err();
    assert!(matches!(err, ConfigError::Syntax { line: 2, .. }), "{err:?}");
}

#[test]
fn mcp_servers_parse_and_validate() {
    let file = r#"
[[mcp.servers]]
name = "everything"
transport = "stdio"
command = "mcp-server-everything"
args = ["stdio"]
env = { TOKEN = "${T}" }

[[mcp.servers]]
name = "remote"
transport = "http"
url = "http://127.0.0.1:3001/mcp"
headers = { Authorization = "Bearer ${T}" }
prefix = "none"
connect = "lazy"
timeout_ms = 5000
max_concurrency = 8
"#;
    let config = load_str(Some(("f.toml", file)), &env(&[("T", "x")])).unwrap();
    let [stdio, http] = &config.mcp.servers[..] else { panic!("two servers") };
    assert!(matches!(&stdio.transport, McpTransport::Stdio { env, .. } if env["TOKEN"] == "x"));
    assert!(
        matches!(&http.transport, McpTransport::StreamableHttp { sse_fallback: true, headers, .. }
        if headers["Authorization"] == "Bearer x")
    );
    assert_eq!((http.prefix, http.connect), (PrefixMode::None, ConnectMode::Lazy));
    assert_eq!((stdio.max_concurrency.get(), http.max_concurrency.get()), (64, 8));
    let zero = "[[mcp.servers]]\nname = \"a\"\ntransport = \"stdio\"\ncommand = \"x\"\nmax_concurrency = 0\n";
    let err = load_str(Some(("f.toml", zero)), &env(&[])).unwrap_err();
    assert!(err.to_string().contains("mcp.servers[0].max_concurrency"), "{err}");

    let missing = "[[mcp.servers]]\nname = \"a\"\ntransport = \"stdio\"\n";
    let err = load_str(Some(("f.toml", missing)), &env(&[])).unwrap_err();
    assert!(err.to_string().contains("mcp.servers[0].command"), "{err}");
    let bad = "[[mcp.servers]]\nname = \"a\"\ntransport = \"pigeon\"\n";
    let err = load_str(Some(("f.toml", bad)), &env(&[])).unwrap_err();
    assert!(err.to_string().contains("mcp.servers[0].transport"), "{err}");
}

#[test]
fn routing_profiles_parse_with_a_default_always_present() {
    let config = load_str(None, &HashMap::new()).unwrap();
    let default = &config.routing.profiles["default"];
    assert_eq!(default.top_k, 5);
    assert!(default.enforce_search_before_call);
    assert!(default.expose.is_empty());
    assert_eq!(config.routing.token_key, None);

    let file = r#"
[routing]
token_ttl_s = 60

[[routing.profiles]]
name = "ops"
expose = ["echo", "source:github", "tag:read*"]
pool = ["toolkit:reasoning", "*_search"]
top_k = 3
enforce_search_before_call = false
"#;
    let config =
        load_str(Some(("f.toml", file)), &env(&[("TOOLMESH__ROUTING__TOKEN_KEY", "k3y")])).unwrap();
    assert_eq!(config.routing.token_key.as_deref(), Some("k3y"));
    assert_eq!(config.routing.token_ttl, std::time::Duration::from_secs(60));
    assert!(config.routing.profiles.contains_key("default"));
    let ops = &config.routing.profiles["ops"];
    assert_eq!(ops.top_k, 3);
    assert!(!ops.enforce_search_before_call);
    assert_eq!(ops.expose[1], Selector::Source("github".into()));
    let tool = |name: &str, source: &str, toolkit: Option<&str>, tags: &[&str]| {
        let mut spec = toolmesh_core::ToolSpec::new(
            name,
            "",
            serde_json::json!({}),
            toolmesh_core::ToolSource::local(source),
        );
        spec.toolkit = toolkit.map(str::to_owned);
        spec.tags = tags.iter().map(|t| (*t).to_owned()).collect();
        spec
    };
    assert!(ops.expose[2].selects(&tool("x", "builtin", None, &["readonly"])));
    assert!(ops.pool[0].selects(&tool("think", "builtin", Some("reasoning"), &[])));
    assert!(!ops.pool[0].selects(&tool("echo", "builtin", None, &[])));
    assert!(ops.pool[1].selects(&tool("github_search", "github", None, &[])));
    assert!(!ops.pool[1].selects(&tool("github_search_x", "github", None, &[])));
    assert!(Selector::parse("kind:local").unwrap().selects(&tool("x", "a", None, &[])));
    assert!(!Selector::parse("kind:mcp").unwrap().selects(&tool("x", "a", None, &[])));

    let bad = "[[routing.profiles]]\nname = \"x\"\npool = [\"server:github\"]\n";
    let err = load_str(Some(("f.toml", bad)), &env(&[])).unwrap_err().to_string();
    assert!(
        err.contains("routing.profiles[0].pool") && err.contains("unknown selector kind"),
        "{err}"
    );
    let twice = "[[routing.profiles]]\nname = \"x\"\n[[routing.profiles]]\nname = \"x\"\n";
    let err = load_str(Some(("f.toml", twice)), &env(&[])).unwrap_err().to_string();
    assert!(err.contains("defined twice"), "{err}");
}

#[test]
fn globs_match_whole_names() {
    let name = crate::glob;
    assert!(name("*", "anything"));
    assert!(name("echo", "echo"));
    assert!(!name("echo", "echo2"));
    assert!(name("git*", "github_search"));
    assert!(name("*search", "github_search"));
    assert!(name("g*_*h", "github_search"));
    assert!(!name("g*_*x", "github_search"));
    assert!(!name("ab*ba", "aba"));
    assert!(name("*ab*b", "abb"));
    assert!(!name("a*b*b", "ab"));
    assert!(name("a**b", "ab"));
    assert!(name("*", ""));
    assert!(!name("a*", ""));
    assert!(name("*delete*", "file_delete_all"));
    assert!(name("x*y*z", "xyz"));
    assert!(!name("x*y*z", "xz"));
}

#[test]
fn a_providers_section_is_parsed_into_its_own_type_with_keys_named() {
    #[derive(serde::Deserialize, Debug, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Fleet {
        pool: String,
        #[serde(default)]
        workers: u32,
    }
    let file = "[fleet]\npool = \"gpu\"\n";
    let config =
        load_str(Some(("f.toml", file)), &env(&[("TOOLMESH__FLEET__WORKERS", "3")])).unwrap();
    assert_eq!(
        config.section::<Fleet>("fleet").unwrap(),
        Some(Fleet { pool: "gpu".into(), workers: 3 }),
        "layered like the core sections"
    );
    assert_eq!(config.section::<Fleet>("other").unwrap(), None);
    assert!(config.check_sections(&["fleet"]).is_ok());

    let unclaimed = config.check_sections(&[]).unwrap_err().to_string();
    assert!(unclaimed.contains("f.toml") && unclaimed.contains("fleet"), "{unclaimed}");
    assert!(unclaimed.contains("unknown section"), "{unclaimed}");

    let typo = load_str(Some(("f.toml", "[fleet]\npool = \"a\"\nworkrs = 1\n")), &env(&[]))
        .unwrap()
        .section::<Fleet>("fleet")
        .unwrap_err()
        .to_string();
    assert!(typo.contains("f.toml") && typo.contains("fleet") && typo.contains("workrs"), "{typo}");
    assert!(!typo.contains('\n'));
}

#[test]
fn a_misspelt_core_section_is_still_refused() {
    let config = load_str(Some(("f.toml", "[serch]\nembeddings = false\n")), &env(&[])).unwrap();
    let err = config.check_sections(&[]).unwrap_err().to_string();
    assert!(err.contains("serch") && err.contains("search"), "names it and the known: {err}");
}

/// A secret given under a qualified name (`jwt:ISSUER:alice`) is that principal's alone:
/// the key named `alice` keeps the plain name's secret.
#[test]
fn a_qualified_principal_name_picks_its_own_upstream_secret() {
    let file = "[credentials.svc]\nprincipals.alice = { env = \"KEY\" }\n\
                principals.\"jwt:https://idp.example:alice\" = { env = \"TOKEN\" }\n\
                [[tools.http]]\nname = \"t\"\ndescription = \"d\"\nurl = \"https://x.test/\"\n\
                credentials = [\"svc\"]\n";
    let vars = env(&[("KEY", "key-secret"), ("TOKEN", "token-secret")]);
    let config = load_str(Some(("f.toml", file)), &vars).unwrap();
    let credentials = &config.tools.http[0].credentials;
    let secret = |principal: &toolmesh_core::Principal| {
        credentials.headers(principal).unwrap()[0].1.expose().to_owned()
    };
    let key = toolmesh_core::Principal {
        kind: toolmesh_core::PrincipalKind::ApiKey,
        ..toolmesh_core::Principal::anonymous("alice")
    };
    let token = toolmesh_core::Principal {
        kind: toolmesh_core::PrincipalKind::Jwt,
        issuer: Some("https://idp.example".into()),
        ..toolmesh_core::Principal::anonymous("alice")
    };
    assert_eq!(secret(&key), "Bearer key-secret");
    assert_eq!(secret(&token), "Bearer token-secret");
}

#[test]
fn upstream_credentials_read_their_secrets_and_name_the_key_that_is_wrong() {
    let tool = "[[tools.http]]\nname = \"t\"\ndescription = \"d\"\nurl = \"https://x.test/\"\n";
    let file = format!(
        "[credentials.svc]\nprincipals.alice = {{ env = \"ALICE\" }}\ndefault = {{ env = \"SHARED\" }}\n\
         [credentials.caller]\nheader = \"X-Token\"\nprefix = \"\"\npass_caller_token = true\n\
         {tool}credentials = [\"svc\", \"caller\"]\n"
    );
    let vars = env(&[("ALICE", "alice-secret\n"), ("SHARED", "shared-secret")]);
    let config = load_str(Some(("f.toml", &file)), &vars).unwrap();
    let credentials = &config.tools.http[0].credentials;
    let alice = toolmesh_core::Principal {
        credential: Some(toolmesh_core::Secret::new("tm_alice")),
        ..toolmesh_core::Principal::anonymous("alice")
    };
    let headers: Vec<(String, String)> = credentials
        .headers(&alice)
        .unwrap()
        .into_iter()
        .map(|(name, value)| (name, value.expose().to_owned()))
        .collect();
    assert_eq!(
        headers,
        [
            ("authorization".to_owned(), "Bearer alice-secret".to_owned()),
            ("x-token".to_owned(), "tm_alice".to_owned())
        ]
    );
    // Bob has no secret of his own: the default; and no token to pass on: refused, and
    // the refusal holds no secret.
    let bob = toolmesh_core::Principal::anonymous("bob");
    let refused = credentials.headers(&bob).unwrap_err();
    assert!(refused.contains("caller") && refused.contains("bob"), "{refused}");
    assert!(!refused.contains("secret"), "{refused}");
    assert!(!format!("{config:?}").contains("alice-secret"), "secrets are redacted in Debug");

    let error = |text: &str| load_str(Some(("f.toml", text)), &vars).unwrap_err().to_string();
    let unknown = error(&format!("{tool}credentials = [\"nope\"]\n"));
    assert!(unknown.contains("tools.http[0].credentials") && unknown.contains("nope"), "{unknown}");
    let unset = error("[credentials.svc]\nprincipals.bob = { env = \"UNSET\" }\n");
    assert!(unset.contains("credentials.svc.principals.bob") && unset.contains("UNSET"), "{unset}");
    let both = error("[credentials.svc]\ndefault = { env = \"SHARED\", file = \"/x\" }\n");
    assert!(both.contains("credentials.svc.default"), "{both}");
    let mixed =
        error("[credentials.svc]\npass_caller_token = true\nprincipals.a = { env = \"ALICE\" }\n");
    assert!(mixed.contains("credentials.svc.pass_caller_token"), "{mixed}");
    let stdio = error(
        "[credentials.svc]\npass_caller_token = true\n[[mcp.servers]]\nname = \"s\"\n\
         transport = \"stdio\"\ncommand = \"x\"\ncredentials = [\"svc\"]\n",
    );
    assert!(stdio.contains("mcp.servers[0].credentials"), "{stdio}");
}

#[test]
fn a_placeholder_that_names_no_parameter_is_refused_naming_its_key() {
    let tool = |url: &str, body: &str| {
        format!(
            "[[tools.http]]\nname = \"w\"\ndescription = \"d\"\nmethod = \"POST\"\nurl = \"{url}\"\n\
             body = {body}\n[tools.http.parameters]\ntype = \"object\"\n\
             properties = {{ city = {{ type = \"string\" }} }}\n"
        )
    };
    let good = tool("https://h.invalid/w?q={{city}}", r#"{ q = "{{ city }}" }"#);
    load_str(Some(("f.toml", &good)), &env(&[])).unwrap();
    let url = tool("https://h.invalid/w?q={{citty}}", "{}");
    let err = load_str(Some(("f.toml", &url)), &env(&[])).unwrap_err().to_string();
    assert!(err.contains("tools.http[0].url") && err.contains("{{citty}}"), "{err}");
    assert!(err.contains("city"), "the parameters are named: {err}");
    let body = tool("https://h.invalid/w", r#"{ nested = ["in {{town}}"] }"#);
    let err = load_str(Some(("f.toml", &body)), &env(&[])).unwrap_err().to_string();
    assert!(err.contains("tools.http[0].body") && err.contains("{{town}}"), "{err}");
}

#[test]
fn a_log_filter_that_would_silence_the_logs_is_refused() {
    for good in
        ["info", "WARN,toolmesh=debug", "info,rmcp::transport::worker=off", "a[s{f=1}]=trace"]
    {
        let file = format!("[telemetry]\nlog = \"{good}\"\n");
        load_str(Some(("f.toml", &file)), &env(&[])).unwrap_or_else(|e| panic!("{good}: {e}"));
    }
    for bad in ["inof", "info,toolmesh=verbose", "=debug"] {
        let file = format!("[telemetry]\nlog = \"{bad}\"\n");
        let err = load_str(Some(("f.toml", &file)), &env(&[])).unwrap_err().to_string();
        assert!(err.contains("telemetry.log"), "{bad}: {err}");
    }
}
