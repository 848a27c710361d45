//! The configuration model. Serde structs with `deny_unknown_fields` are deserialized with
//! the key path tracked, then validated into typed values.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use toml::Table;

use crate::ConfigError;

use crate::{
    credentials::{self, CredentialConfig, RawCredential},
    mcp::{self, McpConfig, RawMcp},
    routing::{self, RawRouting, RoutingConfig},
    search::{self, RawSearch, SearchConfig},
    server::{self, RawServer, ServerConfig},
    telemetry::{self, RawTelemetry, TelemetryConfig},
    tools::{
        self, BuiltinConfig, RawBuiltin, RawTools, RawWorkers, ToolNames, ToolsConfig,
        WorkersConfig,
    },
};

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
        let credentials = credentials::credentials(raw.credentials, env, &key_error)?;
        let mut names = ToolNames::default();
        let http = tools::http_tools(raw.tools.http, &mut names, &credentials, env, &key_error)?;
        let command = tools::command_tools(raw.tools.command, &mut names, &key_error)?;
        Ok(Config {
            server: server::server(raw.server, env, &key_error)?,
            workers: tools::workers(raw.workers, &key_error)?,
            telemetry: telemetry::telemetry(raw.telemetry, &key_error)?,
            builtin: BuiltinConfig { reasoning: raw.builtin.reasoning, echo: raw.builtin.echo },
            tools: ToolsConfig { http, command },
            mcp: mcp::mcp(raw.mcp, &credentials, env, &key_error)?,
            search: search::search(raw.search, env, &key_error)?,
            routing: routing::routing(raw.routing, &key_error)?,
            credentials,
            sections,
            origin: origin.to_owned(),
        })
    }
}
