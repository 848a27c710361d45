use std::collections::HashMap;

use toolmesh_config::{ConfigError, load_str};

use super::{ConnectMode, McpConfig, McpTransport, PrefixMode};

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// `[mcp]` of the file `text`, as a start reads it.
fn mcp(text: &str, env: &HashMap<String, String>) -> Result<McpConfig, ConfigError> {
    load_str(Some(("f.toml", text)), env)?.get()
}

#[test]
fn no_servers_by_default() {
    let config = load_str(None, &HashMap::new()).unwrap();
    assert!(config.get::<McpConfig>().unwrap().servers.is_empty());
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
    let config = mcp(file, &env(&[("T", "x")])).unwrap();
    let [stdio, http] = &config.servers[..] else { panic!("two servers") };
    assert!(matches!(&stdio.transport, McpTransport::Stdio { env, .. } if env["TOKEN"] == "x"));
    assert!(
        matches!(&http.transport, McpTransport::StreamableHttp { sse_fallback: true, headers, .. }
        if headers["Authorization"] == "Bearer x")
    );
    assert_eq!((http.prefix, http.connect), (PrefixMode::None, ConnectMode::Lazy));
    assert_eq!((stdio.max_concurrency.get(), http.max_concurrency.get()), (64, 8));
    let zero = "[[mcp.servers]]\nname = \"a\"\ntransport = \"stdio\"\ncommand = \"x\"\nmax_concurrency = 0\n";
    let err = mcp(zero, &env(&[])).unwrap_err();
    assert!(err.to_string().contains("mcp.servers[0].max_concurrency"), "{err}");

    let missing = "[[mcp.servers]]\nname = \"a\"\ntransport = \"stdio\"\n";
    let err = mcp(missing, &env(&[])).unwrap_err();
    assert!(err.to_string().contains("mcp.servers[0].command"), "{err}");
    let bad = "[[mcp.servers]]\nname = \"a\"\ntransport = \"pigeon\"\n";
    let err = mcp(bad, &env(&[])).unwrap_err();
    assert!(err.to_string().contains("mcp.servers[0].transport"), "{err}");
}

#[test]
fn a_server_over_stdio_cannot_send_the_callers_token() {
    let file = "[credentials.svc]\npass_caller_token = true\n[[mcp.servers]]\nname = \"s\"\n\
                transport = \"stdio\"\ncommand = \"x\"\ncredentials = [\"svc\"]\n";
    let err = mcp(file, &env(&[])).unwrap_err().to_string();
    assert!(err.contains("mcp.servers[0].credentials"), "{err}");
}

#[test]
fn annotations_are_untrusted_and_changed_definitions_warned_about_by_default() {
    let base = "[[mcp.servers]]\nname = \"s\"\ntransport = \"streamable-http\"\nurl = \"http://127.0.0.1:1/mcp\"\n";
    let server = &mcp(base, &env(&[])).unwrap().servers[0];
    assert!(!server.trust_annotations);
    assert_eq!(server.pin_definitions, super::PinMode::Warn);
    assert!(server.accept.is_empty());

    let file = format!(
        "{base}trust_annotations = true\npin_definitions = \"block\"\naccept = [\"send@0123456789abcdef\"]\n"
    );
    let server = &mcp(&file, &env(&[])).unwrap().servers[0];
    assert!(server.trust_annotations);
    assert_eq!(server.pin_definitions, super::PinMode::Block);
    assert_eq!(server.accept, [("send".to_owned(), "0123456789abcdef".to_owned())]);

    for bad in ["send", "send@abc", "@0123456789", "send@0123456789ABCDEF"] {
        let file = format!("{base}accept = [\"{bad}\"]\n");
        let error = mcp(&file, &env(&[])).unwrap_err().to_string();
        assert!(
            error.contains("mcp.servers[0].accept[0]") && error.contains("TOOL@DIGEST"),
            "{error}"
        );
    }
}
