//! The configuration model: the core sections, typed, and the sections the crates define,
//! layered and kept until a crate reads its own ([`Config::get`]).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use serde::Deserialize;
use toml::Table;

use crate::{
    ConfigError,
    credentials::{self, CredentialConfig, RawCredential},
    layer,
    section::{Reading, Section, defaults_of},
    server::{self, RawServer, ServerConfig},
    telemetry::{self, RawTelemetry, TelemetryConfig},
};

/// The whole configuration.
#[derive(Clone, PartialEq)]
pub struct Config {
    /// The front door: the listener, its limits, and the bounds of every call.
    pub server: ServerConfig,
    /// Logs and traces.
    pub telemetry: TelemetryConfig,
    /// Upstream credentials, by name: what HTTP tools and MCP servers send for a caller.
    pub credentials: BTreeMap<String, CredentialConfig>,
    /// The sections the crates define, as the file and the environment wrote them (without
    /// their defaults, which [`Config::get`] lays under them).
    sections: Table,
    /// The environment the file was loaded with: `${VAR}` references and default places.
    env: Arc<HashMap<String, String>>,
    /// Where the file came from, for the errors of those sections.
    origin: String,
}

/// The sections this crate defines; any other belongs to the crate that reads it.
const CORE_SECTIONS: [&str; 3] = ["server", "telemetry", "credentials"];

impl Config {
    /// Reads section `T`: its defaults, under what the file and the environment wrote. A bad
    /// key or value is one line naming `section.key`.
    pub fn get<T: Section>(&self) -> Result<T, ConfigError> {
        let mut table = defaults_of::<T>()?;
        let value = match self.sections.get(T::NAME).cloned() {
            Some(toml::Value::Table(written)) => {
                layer::merge(&mut table, written);
                toml::Value::Table(table)
            }
            Some(other) => other,
            None => toml::Value::Table(table),
        };
        T::read(value, &self.reading(T::NAME))
    }

    /// Reads section `T` when the file or the environment writes it; `None` otherwise: for
    /// a section that is off unless written, such as `[auth]`.
    pub fn find<T: Section>(&self) -> Result<Option<T>, ConfigError> {
        if !self.has(T::NAME) {
            return Ok(None);
        }
        self.get().map(Some)
    }

    /// Returns whether the file or the environment writes section `name`.
    pub fn has(&self, name: &str) -> bool {
        self.sections.contains_key(name)
    }

    /// Sets `key` (a dotted path into a crate's section, `search.cache_dir`) as if the file
    /// had written it: for a program or a test that starts from a file and changes a key.
    pub fn set(&mut self, key: &str, value: impl Into<toml::Value>) {
        let mut path: Vec<&str> = key.split('.').collect();
        let last = path.pop().unwrap_or_default();
        let mut table = &mut self.sections;
        for segment in path {
            let entry = table.entry(segment).or_insert_with(|| toml::Value::Table(Table::new()));
            if !entry.is_table() {
                *entry = toml::Value::Table(Table::new());
            }
            table = entry.as_table_mut().expect("made a table above");
        }
        table.insert(last.to_owned(), value.into());
    }

    /// Returns whether section `name` is written alike in `self` and `other`.
    pub fn same_section(&self, other: &Config, name: &str) -> bool {
        self.sections.get(name) == other.sections.get(name)
    }

    /// Returns the error of a bad value of `key` (for example `vector.url`), named as a
    /// bad key of this configuration is: for a check that spans sections.
    pub fn key_error(&self, key: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError::Key { origin: self.origin.clone(), key: key.to_owned(), reason: reason.into() }
    }

    /// Refuses a section that neither this crate nor the crates that read theirs
    /// (`claimed`) define: a misspelt section fails as a misspelt key does.
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

    fn reading(&self, section: &'static str) -> Reading<'_> {
        Reading { origin: &self.origin, section, env: &self.env, credentials: &self.credentials }
    }
}

/// Secrets stay out of a printed configuration: the environment is not shown, and
/// credentials show only their names.
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("server", &self.server)
            .field("telemetry", &self.telemetry)
            .field("credentials", &self.credentials.keys().collect::<Vec<_>>())
            .field("sections", &self.sections.keys().collect::<Vec<_>>())
            .field("origin", &self.origin)
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    server: RawServer,
    telemetry: RawTelemetry,
    #[serde(default)]
    credentials: BTreeMap<String, RawCredential>,
}

impl Config {
    pub(crate) fn from_table(
        origin: &str,
        mut table: Table,
        env: &HashMap<String, String>,
    ) -> Result<Config, ConfigError> {
        let key_error = |key: String, reason: String| ConfigError::Key {
            origin: origin.to_owned(),
            key,
            reason,
        };
        let crates: Vec<String> =
            table.keys().filter(|key| !CORE_SECTIONS.contains(&key.as_str())).cloned().collect();
        let sections: Table =
            crates.into_iter().filter_map(|key| table.remove_entry(&key)).collect();
        let raw: RawConfig =
            serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|error| {
                key_error(error.path().to_string(), error.inner().message().trim().to_owned())
            })?;
        Ok(Config {
            server: server::server(raw.server, env, &key_error)?,
            telemetry: telemetry::telemetry(raw.telemetry, &key_error)?,
            credentials: credentials::credentials(raw.credentials, env, &key_error)?,
            sections,
            env: Arc::new(env.clone()),
            origin: origin.to_owned(),
        })
    }
}
