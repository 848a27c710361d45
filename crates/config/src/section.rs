//! Sections a crate defines: `[search]` belongs to the search crate, `[mcp]` to the MCP
//! crate, and so on. Each defines its type, its defaults (with comments, as `toolmesh
//! config defaults` prints them), and how it is read and checked; this crate layers the
//! file and the environment over those defaults and names a bad key the same way for all.

use std::collections::{BTreeMap, HashMap};

use serde::de::DeserializeOwned;

use crate::{
    Config, ConfigError, CredentialConfig, UpstreamCredentials, credentials::upstream, layer,
};

/// A section of the configuration file, defined by the crate that uses it.
pub trait Section: Sized + 'static {
    /// Its name: the file's `[NAME]`.
    const NAME: &'static str;

    /// Its defaults as TOML text with comments, `[NAME]` included: the part of `toolmesh
    /// config defaults` it contributes. A section that is off unless written (for example
    /// `[auth]`) gives its keys as comments only.
    const DEFAULTS: &'static str;

    /// Reads the section from `value` (its defaults, under the file, under the
    /// environment), checking it: an error names the key and what is wrong.
    fn read(value: toml::Value, cx: &Reading<'_>) -> Result<Self, ConfigError>;
}

/// What a section is read with: where it came from, the environment (for `${VAR}`
/// references) and the upstream credentials its tools or servers may name.
pub struct Reading<'a> {
    pub(crate) origin: &'a str,
    pub(crate) section: &'static str,
    pub(crate) env: &'a HashMap<String, String>,
    pub(crate) credentials: &'a BTreeMap<String, CredentialConfig>,
}

impl Reading<'_> {
    /// The error of a bad value at `key`, the whole dotted path (`search.rrf_k`).
    pub fn key_error(&self, key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError::Key { origin: self.origin.to_owned(), key: key.into(), reason: reason.into() }
    }

    /// The environment the configuration was loaded with.
    pub fn env(&self) -> &HashMap<String, String> {
        self.env
    }

    /// Deserializes the section into `T`; a bad key or value is one line naming
    /// `section.key`.
    pub fn deserialize<T: DeserializeOwned>(&self, value: toml::Value) -> Result<T, ConfigError> {
        serde_path_to_error::deserialize(value).map_err(|error| {
            let path = error.path().to_string();
            let key = if path == "." {
                self.section.to_owned()
            } else {
                format!("{}.{path}", self.section)
            };
            self.key_error(key, error.inner().message().trim())
        })
    }

    /// Deserializes the section as [`Reading::deserialize`] does, then checks it with
    /// `check`, whose error is the key and what is wrong with it.
    pub fn deserialize_checked<T: DeserializeOwned>(
        &self,
        value: toml::Value,
        check: impl FnOnce(&T) -> Result<(), (String, String)>,
    ) -> Result<T, ConfigError> {
        let section = self.deserialize(value)?;
        check(&section).map_err(|(key, reason)| self.key_error(key, reason))?;
        Ok(section)
    }

    /// The credentials `names` that the tool or server at `key` sends, each defined under
    /// `[credentials]`.
    pub fn upstream(
        &self,
        names: Vec<String>,
        key: &str,
    ) -> Result<UpstreamCredentials, ConfigError> {
        upstream(self.credentials, names, key, &|key, reason| self.key_error(key, reason))
    }
}

/// A section as the app knows it without its type: for the list of known sections, the
/// defaults printed, and the check that runs before a start.
#[derive(Clone, Copy)]
pub struct SectionDef {
    /// The section's name.
    pub name: &'static str,
    /// Its defaults, as [`Section::DEFAULTS`].
    pub defaults: &'static str,
    check: fn(&Config) -> Result<(), ConfigError>,
}

impl SectionDef {
    /// The definition of section `T`.
    pub const fn of<T: Section>() -> Self {
        SectionDef { name: T::NAME, defaults: T::DEFAULTS, check: check::<T> }
    }

    /// Reads the section of `config` as a start would, when the file or the environment
    /// writes it, and drops it.
    pub fn check(&self, config: &Config) -> Result<(), ConfigError> {
        (self.check)(config)
    }
}

impl std::fmt::Debug for SectionDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SectionDef").field(&self.name).finish()
    }
}

fn check<T: Section>(config: &Config) -> Result<(), ConfigError> {
    config.find::<T>().map(drop)
}

/// The table of section `T` that its defaults give.
pub(crate) fn defaults_of<T: Section>() -> Result<toml::Table, ConfigError> {
    let mut defaults = layer::parse(&format!("defaults of [{}]", T::NAME), T::DEFAULTS)?;
    Ok(match defaults.remove(T::NAME) {
        Some(toml::Value::Table(table)) => table,
        _ => toml::Table::new(),
    })
}

/// Every section's defaults after the core's: the text `toolmesh config defaults` prints.
pub fn defaults_text(sections: &[SectionDef]) -> String {
    let mut text = crate::DEFAULT_CONFIG.trim_end().to_owned();
    for section in sections {
        text.push_str("\n\n");
        text.push_str(section.defaults.trim());
    }
    text.push('\n');
    text
}
