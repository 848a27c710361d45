use std::collections::HashMap;

use toolmesh_config::{ConfigError, load_str};

use crate::{BuiltinConfig, ToolsConfig};

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// `[tools]` of the file `text`, as a start reads it.
fn tools(text: &str, env: &HashMap<String, String>) -> Result<ToolsConfig, ConfigError> {
    load_str(Some(("f.toml", text)), env)?.get()
}

#[test]
fn the_defaults_turn_the_built_in_tools_on_and_define_none_in_the_file() {
    let config = load_str(None, &HashMap::new()).unwrap();
    let builtin: BuiltinConfig = config.get().unwrap();
    assert!(builtin.reasoning && builtin.echo);
    let tools: ToolsConfig = config.get().unwrap();
    assert!(tools.http.is_empty() && tools.command.is_empty());
    let off = load_str(Some(("f.toml", "[builtin]\necho = false\n")), &HashMap::new()).unwrap();
    let builtin: BuiltinConfig = off.get().unwrap();
    assert!(builtin.reasoning && !builtin.echo, "untouched keys keep their defaults");
}

#[test]
fn example_file_parses() {
    let text = include_str!("../../../../deploy/toolmesh.toml");
    let config = load_str(Some(("toolmesh.toml", text)), &env(&[("WEATHER_API_TOKEN", "t0k")]))
        .expect("the example config loads");
    let tools: ToolsConfig = config.get().expect("its tools are valid");
    assert!(!tools.http.is_empty());
    assert!(!tools.command.is_empty());
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
    let err = tools(file, &env(&[])).unwrap_err();
    match &err {
        ConfigError::Key { key, .. } => assert_eq!(key, "tools.command[0].timeout_ms"),
        other => panic!("unexpected error {other:?}"),
    }
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
    let config = tools(file, &env(&[("TOKEN", "s3cret")])).unwrap();
    assert_eq!(config.http[0].headers["Authorization"], "Bearer s3cret");
    let err = tools(file, &env(&[])).unwrap_err();
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
    let err = tools(file, &env(&[])).unwrap_err();
    assert!(err.to_string().contains("already used"), "{err}");

    let file =
        "[[tools.command]]\nname = \"has space\"\ndescription = \"d\"\ncommand = \"/bin/true\"\n";
    let err = tools(file, &env(&[])).unwrap_err();
    assert!(err.to_string().contains("tools.command[0].name"), "{err}");
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
    let config = tools(file, &vars).unwrap();
    let credentials = &config.http[0].credentials;
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
    let config = tools(&file, &vars).unwrap();
    let credentials = &config.http[0].credentials;
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

    let error = |text: &str| tools(text, &vars).unwrap_err().to_string();
    let unknown = error(&format!("{tool}credentials = [\"nope\"]\n"));
    assert!(unknown.contains("tools.http[0].credentials") && unknown.contains("nope"), "{unknown}");
    let unset = error("[credentials.svc]\nprincipals.bob = { env = \"UNSET\" }\n");
    assert!(unset.contains("credentials.svc.principals.bob") && unset.contains("UNSET"), "{unset}");
    let both = error("[credentials.svc]\ndefault = { env = \"SHARED\", file = \"/x\" }\n");
    assert!(both.contains("credentials.svc.default"), "{both}");
    let mixed =
        error("[credentials.svc]\npass_caller_token = true\nprincipals.a = { env = \"ALICE\" }\n");
    assert!(mixed.contains("credentials.svc.pass_caller_token"), "{mixed}");
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
    tools(&good, &env(&[])).unwrap();
    let url = tool("https://h.invalid/w?q={{citty}}", "{}");
    let err = tools(&url, &env(&[])).unwrap_err().to_string();
    assert!(err.contains("tools.http[0].url") && err.contains("{{citty}}"), "{err}");
    assert!(err.contains("city"), "the parameters are named: {err}");
    let body = tool("https://h.invalid/w", r#"{ nested = ["in {{town}}"] }"#);
    let err = tools(&body, &env(&[])).unwrap_err().to_string();
    assert!(err.contains("tools.http[0].body") && err.contains("{{town}}"), "{err}");
}
