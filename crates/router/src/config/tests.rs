use std::collections::HashMap;

use toolmesh_config::{ConfigError, Selector, load_str};

use super::RoutingConfig;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// `[routing]` of the file `text`, as a start reads it.
fn routing(text: &str, env: &HashMap<String, String>) -> Result<RoutingConfig, ConfigError> {
    load_str(Some(("f.toml", text)), env)?.get()
}

#[test]
fn routing_profiles_parse_with_a_default_always_present() {
    let config: RoutingConfig = load_str(None, &HashMap::new()).unwrap().get().unwrap();
    let default = &config.profiles["default"];
    assert_eq!(default.top_k, 5);
    assert!(default.enforce_search_before_call);
    assert!(default.expose.is_empty());
    assert_eq!(config.token_key, None);

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
    let config = routing(file, &env(&[("TOOLMESH__ROUTING__TOKEN_KEY", "k3y")])).unwrap();
    assert_eq!(config.token_key.as_deref(), Some("k3y"));
    assert_eq!(config.token_ttl, std::time::Duration::from_secs(60));
    assert!(config.profiles.contains_key("default"));
    let ops = &config.profiles["ops"];
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
    let err = routing(bad, &env(&[])).unwrap_err().to_string();
    assert!(
        err.contains("routing.profiles[0].pool") && err.contains("unknown selector kind"),
        "{err}"
    );
    let twice = "[[routing.profiles]]\nname = \"x\"\n[[routing.profiles]]\nname = \"x\"\n";
    let err = routing(twice, &env(&[])).unwrap_err().to_string();
    assert!(err.contains("defined twice"), "{err}");
}

/// The example key of toolmesh's own deploy files is refused, wherever it comes from.
#[test]
fn the_published_example_key_is_refused() {
    let key = "change-me-to-32-random-bytes";
    let err = routing("", &env(&[("TOOLMESH__ROUTING__TOKEN_KEY", key)])).unwrap_err().to_string();
    assert!(err.contains("routing.token_key") && err.contains("openssl rand"), "{err}");
    let file = format!("[routing]\ntoken_key = \"{key}\"\n");
    assert!(routing(&file, &env(&[])).is_err());
}
