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
