//! `[[mcp.servers]]`: the MCP servers toolmesh is a client of.

use std::{
    collections::{BTreeMap, HashMap},
    num::NonZeroUsize,
    path::PathBuf,
    time::Duration,
};

use serde::Deserialize;
use toolmesh_config::{
    ConfigError, Reading, Section, UpstreamCredentials,
    values::{positive_ms, resolve_env_refs},
};

/// `[mcp]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct McpConfig {
    /// `[[mcp.servers]]`.
    pub servers: Vec<McpServerConfig>,
}

/// How toolmesh reaches an MCP server.
#[derive(Debug, Clone, PartialEq)]
pub enum McpTransport {
    /// A child process speaking JSON-RPC on stdin/stdout.
    Stdio {
        /// The executable.
        command: PathBuf,
        /// Its arguments.
        args: Vec<String>,
        /// Extra environment variables, `${VAR}` references resolved.
        env: BTreeMap<String, String>,
        /// Working directory.
        cwd: Option<PathBuf>,
    },
    /// Streamable HTTP.
    StreamableHttp {
        /// The MCP endpoint.
        url: String,
        /// Headers sent with every request, `${VAR}` references resolved.
        headers: BTreeMap<String, String>,
        /// Fall back to legacy HTTP+SSE when the server does not speak streamable HTTP.
        sse_fallback: bool,
    },
    /// Legacy HTTP+SSE.
    Sse {
        /// The SSE endpoint.
        url: String,
        /// Headers sent with every request.
        headers: BTreeMap<String, String>,
    },
}

/// How the names of a server's tools are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrefixMode {
    /// `<server>_<tool>`, unique across servers.
    Always,
    /// The tool's own name; a collision with another source is an error naming both.
    None,
}

/// When toolmesh connects to a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConnectMode {
    /// At start (and reload).
    Eager,
    /// Once at start to learn the tools (unless they are remembered from the last run), then
    /// closed; opened again by the first call of one of its tools, and closed after
    /// `idle_timeout_ms` without calls.
    Lazy,
}

/// What toolmesh does when a tool's definition (name, title, description, schemas,
/// annotations) differs from the one it pinned when it first saw the tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PinMode {
    /// Logs it once, counts it, and serves the changed tool.
    Warn,
    /// Withholds the changed tool until its new definition is accepted (`accept`).
    Block,
}

/// `[[mcp.servers]]`: one MCP server.
#[derive(Debug, Clone, PartialEq)]
pub struct McpServerConfig {
    /// Unique server name, used in tool names, health and logs.
    pub name: String,
    /// How to reach it.
    pub transport: McpTransport,
    /// Longest a call to this server may run.
    pub timeout: Duration,
    /// How tool names are published.
    pub prefix: PrefixMode,
    /// When to connect.
    pub connect: ConnectMode,
    /// For a lazy server: how long a connection without calls stays open.
    pub idle_timeout: Duration,
    /// How often a connected server's liveness is probed (`ping`, or `server/discover` on
    /// 2026-07-28); three probes in a row without an answer (or a closed transport) mark the
    /// connection lost, fail its calls in flight with UNAVAILABLE and start a reconnect. Any answer, an error included, proves
    /// the server alive. `None`: no probes.
    pub ping_interval: Option<Duration>,
    /// How long after a lost connection a repeated call (a read-only or idempotent tool's)
    /// waits for the server to be connected again; past it the call fails with UNAVAILABLE,
    /// whatever its deadline, so a dead server fails its calls within seconds.
    pub reconnect_wait: Duration,
    /// Calls to this server that may run at once; more fail at once with
    /// RESOURCE_EXHAUSTED.
    pub max_concurrency: NonZeroUsize,
    /// Whether the server's last tool listing is kept in the data directory, so that a
    /// restart lists its tools at once (unavailable until the server is connected) and a
    /// lazy server is not started only to learn them.
    pub remember_tools: bool,
    /// Whether toolmesh acts on the server's tool annotations (`readOnlyHint`,
    /// `idempotentHint`, …): repeats a read-only or idempotent tool's call after a lost
    /// connection, and lets policy conditions read them. Off by default, as the MCP
    /// specification asks of annotations from a server that is not trusted: they are
    /// listed, and every hint counts as unknown.
    pub trust_annotations: bool,
    /// What a tool whose definition changed since toolmesh pinned it gets.
    pub pin_definitions: PinMode,
    /// Changed definitions accepted: (the tool's name on the server, the first hex digits
    /// of the new definition's digest), from `accept = ["TOOL@DIGEST"]`.
    pub accept: Vec<(String, String)>,
    /// Upstream credentials (`credentials`, names of `[credentials.<name>]`) sent with
    /// each caller's calls: streamable HTTP servers only.
    pub credentials: UpstreamCredentials,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawMcp {
    #[serde(default)]
    servers: Vec<RawMcpServer>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum RawMcpTransport {
    Stdio,
    Http,
    StreamableHttp,
    Sse,
}

fn default_mcp_timeout_ms() -> u64 {
    60_000
}

fn default_prefix() -> PrefixMode {
    PrefixMode::Always
}

fn default_connect() -> ConnectMode {
    ConnectMode::Eager
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMcpServer {
    name: String,
    transport: RawMcpTransport,
    command: Option<PathBuf>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<PathBuf>,
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default = "default_mcp_timeout_ms")]
    timeout_ms: u64,
    #[serde(default = "default_prefix")]
    prefix: PrefixMode,
    #[serde(default = "default_connect")]
    connect: ConnectMode,
    #[serde(default = "default_ping_interval_ms")]
    ping_interval_ms: u64,
    #[serde(default = "default_reconnect_wait_ms")]
    reconnect_wait_ms: u64,
    #[serde(default = "default_idle_timeout_ms")]
    idle_timeout_ms: u64,
    #[serde(default = "default_mcp_max_concurrency")]
    max_concurrency: NonZeroUsize,
    #[serde(default = "default_remember_tools")]
    remember_tools: bool,
    #[serde(default)]
    trust_annotations: bool,
    #[serde(default = "default_pin_definitions")]
    pin_definitions: PinMode,
    #[serde(default)]
    accept: Vec<String>,
    #[serde(default)]
    credentials: Vec<String>,
}

fn default_pin_definitions() -> PinMode {
    PinMode::Warn
}

fn default_remember_tools() -> bool {
    true
}

/// Calls one MCP server runs at once unless configured: enough for an agent fleet's
/// parallel tool calls, few enough that one client cannot flood a server.
fn default_mcp_max_concurrency() -> NonZeroUsize {
    NonZeroUsize::new(64).expect("64 is not zero")
}

fn default_idle_timeout_ms() -> u64 {
    300_000
}

fn default_ping_interval_ms() -> u64 {
    5_000
}

fn default_reconnect_wait_ms() -> u64 {
    5_000
}

/// Reads `[[mcp.servers]]`: unique names, a transport with what it needs (`${VAR}` in
/// headers and environment resolved from the environment), timeouts and upstream
/// credentials.
impl Section for McpConfig {
    const NAME: &'static str = "mcp";
    const DEFAULTS: &'static str = include_str!("default.toml");

    fn read(value: toml::Value, cx: &Reading<'_>) -> Result<Self, ConfigError> {
        mcp(cx.deserialize(value)?, cx)
    }
}

fn mcp(raw: RawMcp, cx: &Reading<'_>) -> Result<McpConfig, ConfigError> {
    let key_error = &|key: String, reason: String| cx.key_error(key, reason);
    let env = cx.env();
    let mut mcp = McpConfig::default();
    let mut server_names = HashMap::new();
    for (index, raw) in raw.servers.into_iter().enumerate() {
        let key = format!("mcp.servers[{index}]");
        let valid = (1..=32).contains(&raw.name.len())
            && raw.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(key_error(
                format!("{key}.name"),
                format!("{:?} must match ^[a-zA-Z0-9_-]{{1,32}}$", raw.name),
            ));
        }
        if let Some(previous) = server_names.insert(raw.name.clone(), key.clone()) {
            return Err(key_error(
                format!("{key}.name"),
                format!("server name {:?} is already used by {previous}", raw.name),
            ));
        }
        let resolve = |map: BTreeMap<String, String>, field: &str| {
            map.into_iter()
                .map(|(k, v)| {
                    resolve_env_refs(&v, env)
                        .map(|v| (k.clone(), v))
                        .map_err(|reason| key_error(format!("{key}.{field}.{k}"), reason))
                })
                .collect::<Result<BTreeMap<_, _>, _>>()
        };
        let url = |raw_url: Option<String>| -> Result<String, ConfigError> {
            let url = raw_url.ok_or_else(|| {
                key_error(format!("{key}.url"), "is required for this transport".into())
            })?;
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(key_error(
                    format!("{key}.url"),
                    "must start with http:// or https://".into(),
                ));
            }
            Ok(url)
        };
        let server_credentials = cx.upstream(raw.credentials, &key)?;
        if !server_credentials.is_empty()
            && !matches!(raw.transport, RawMcpTransport::Http | RawMcpTransport::StreamableHttp)
        {
            return Err(key_error(
                format!("{key}.credentials"),
                "only a server over streamable HTTP (transport = \"http\" or \"streamable-http\") \
                 can be sent a credential per caller"
                    .into(),
            ));
        }
        let mut accept = Vec::with_capacity(raw.accept.len());
        for (i, entry) in raw.accept.iter().enumerate() {
            let Some((name, digest)) = crate::pins::accepted(entry) else {
                return Err(key_error(
                    format!("{key}.accept[{i}]"),
                    format!("{entry:?} is not {}", crate::pins::ACCEPTED_FORM),
                ));
            };
            accept.push((name.to_owned(), digest.to_owned()));
        }
        let transport = match raw.transport {
            RawMcpTransport::Stdio => McpTransport::Stdio {
                command: raw.command.filter(|c| !c.as_os_str().is_empty()).ok_or_else(|| {
                    key_error(format!("{key}.command"), "is required for stdio".into())
                })?,
                args: raw.args,
                env: resolve(raw.env, "env")?,
                cwd: raw.cwd,
            },
            RawMcpTransport::Http | RawMcpTransport::StreamableHttp => {
                McpTransport::StreamableHttp {
                    url: url(raw.url)?,
                    headers: resolve(raw.headers, "headers")?,
                    sse_fallback: raw.transport == RawMcpTransport::Http,
                }
            }
            RawMcpTransport::Sse => {
                McpTransport::Sse { url: url(raw.url)?, headers: resolve(raw.headers, "headers")? }
            }
        };
        mcp.servers.push(McpServerConfig {
            name: raw.name,
            transport,
            timeout: positive_ms(raw.timeout_ms, &format!("{key}.timeout_ms"), key_error)?,
            prefix: raw.prefix,
            connect: raw.connect,
            idle_timeout: positive_ms(
                raw.idle_timeout_ms,
                &format!("{key}.idle_timeout_ms"),
                key_error,
            )?,
            ping_interval: (raw.ping_interval_ms > 0)
                .then(|| Duration::from_millis(raw.ping_interval_ms)),
            reconnect_wait: positive_ms(
                raw.reconnect_wait_ms,
                &format!("{key}.reconnect_wait_ms"),
                key_error,
            )?,
            max_concurrency: raw.max_concurrency,
            remember_tools: raw.remember_tools,
            trust_annotations: raw.trust_annotations,
            pin_definitions: raw.pin_definitions,
            accept,
            credentials: server_credentials,
        });
    }
    Ok(mcp)
}

#[cfg(test)]
mod tests;
