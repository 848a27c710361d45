//! `[builtin]`, `[[tools.http]]` and `[[tools.command]]`: the local tools of the
//! configuration.

use std::{
    collections::{BTreeMap, HashMap},
    num::NonZeroUsize,
    path::PathBuf,
    time::Duration,
};

use toolmesh_config::{
    ConfigError, Reading, Section, UpstreamCredentials,
    values::{positive_ms, resolve_env_refs, to_json},
};

use serde::Deserialize;
use serde_json::Value as Json;
use toml::Table;
use toolmesh_core::ToolAnnotations;

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

#[allow(clippy::too_many_arguments)]
fn common(
    key: &str,
    name: String,
    description: String,
    parameters: toml::Value,
    tags: Vec<String>,
    timeout_ms: u64,
    max_concurrency: Option<NonZeroUsize>,
    key_error: &dyn Fn(String, String) -> ConfigError,
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

/// The tool names of the configuration so far, by the key that defined each: a name is
/// one tool's.
#[derive(Default)]
struct ToolNames(HashMap<String, String>);

impl ToolNames {
    /// Notes that the tool at `key` is called `name`; refused when another took it.
    fn check(
        &mut self,
        name: &str,
        key: &str,
        key_error: &dyn Fn(String, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        if let Some(previous) = self.0.insert(name.to_owned(), key.to_owned()) {
            return Err(key_error(
                format!("{key}.name"),
                format!("tool name {name:?} is already used by {previous}"),
            ));
        }
        Ok(())
    }
}

/// Reads `[[tools.http]]`: each tool's name, parameters, URL and body templates, headers
/// (`${VAR}` resolved from the environment) and upstream credentials.
fn http_tools(
    raw: Vec<RawHttpTool>,
    names: &mut ToolNames,
    cx: &Reading<'_>,
) -> Result<Vec<HttpToolConfig>, ConfigError> {
    let key_error = &|key: String, reason: String| cx.key_error(key, reason);
    let env = cx.env();
    let mut http = Vec::new();
    for (index, raw) in raw.into_iter().enumerate() {
        let key = format!("tools.http[{index}]");
        names.check(&raw.name, &key, key_error)?;
        let common = common(
            &key,
            raw.name,
            raw.description,
            raw.parameters,
            raw.tags,
            raw.timeout_ms,
            raw.max_concurrency,
            key_error,
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
        let tool_credentials = cx.upstream(raw.credentials, &key)?;
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
                Some(proxy) if !(proxy.starts_with("http://") || proxy.starts_with("https://")) => {
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
    Ok(http)
}

/// Reads `[[tools.command]]`.
fn command_tools(
    raw: Vec<RawCommandTool>,
    names: &mut ToolNames,
    key_error: &dyn Fn(String, String) -> ConfigError,
) -> Result<Vec<CommandToolConfig>, ConfigError> {
    let mut command = Vec::new();
    for (index, raw) in raw.into_iter().enumerate() {
        let key = format!("tools.command[{index}]");
        names.check(&raw.name, &key, key_error)?;
        let common = common(
            &key,
            raw.name,
            raw.description,
            raw.parameters,
            raw.tags,
            raw.timeout_ms,
            raw.max_concurrency,
            key_error,
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
    Ok(command)
}

impl Section for BuiltinConfig {
    const NAME: &'static str = "builtin";
    const DEFAULTS: &'static str = include_str!("config/builtin.toml");

    fn read(value: toml::Value, cx: &Reading<'_>) -> Result<Self, ConfigError> {
        let raw: RawBuiltin = cx.deserialize(value)?;
        Ok(BuiltinConfig { reasoning: raw.reasoning, echo: raw.echo })
    }
}

impl Section for ToolsConfig {
    const NAME: &'static str = "tools";
    const DEFAULTS: &'static str = include_str!("config/tools.toml");

    fn read(value: toml::Value, cx: &Reading<'_>) -> Result<Self, ConfigError> {
        let raw: RawTools = cx.deserialize(value)?;
        let key_error = &|key: String, reason: String| cx.key_error(key, reason);
        let mut names = ToolNames::default();
        let http = http_tools(raw.http, &mut names, cx)?;
        let command = command_tools(raw.command, &mut names, key_error)?;
        Ok(ToolsConfig { http, command })
    }
}

#[cfg(test)]
mod tests;
