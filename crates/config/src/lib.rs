//! toolmesh configuration: one TOML file layered over compiled-in defaults and
//! `TOOLMESH__SECTION__KEY` environment overrides, validated into typed values. [`load`]
//! is the entry point; a bad file yields one [`ConfigError`] line that names the key and
//! the problem.
//!
//! This crate defines the core sections (`[server]`, `[telemetry]`, `[credentials]`). Every
//! other section is defined, defaulted and checked by the crate that uses it, as a
//! [`Section`], and read with [`Config::get`].

mod credentials;
mod error;
mod layer;
mod model;
mod section;
mod selector;
mod server;
mod telemetry;
pub mod values;

pub use credentials::{CredentialConfig, CredentialSource, UpstreamCredentials};
pub use error::ConfigError;
pub use model::Config;
pub use section::{Reading, Section, SectionDef, defaults_text};
pub use selector::{Selector, glob};
pub use server::ServerConfig;
pub use telemetry::{LogFormat, TelemetryConfig};

use std::{collections::HashMap, path::Path};

/// The defaults of the core sections, with comments; [`defaults_text`] adds those of the
/// crates' sections.
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

/// Loads the configuration: the defaults, then the file at `path` (when given), then the
/// `TOOLMESH__*` variables of `env`. `env` also resolves `${VAR}` references in header
/// values. Tests pass their own map instead of touching the process environment.
pub fn load(path: Option<&Path>, env: &HashMap<String, String>) -> Result<Config, ConfigError> {
    let file = match path {
        Some(path) => Some((
            path.display().to_string(),
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.display().to_string(),
                reason: source.to_string(),
            })?,
        )),
        None => None,
    };
    load_str(file.as_ref().map(|(name, text)| (name.as_str(), text.as_str())), env)
}

/// Like [`load`], with the file's name and text given directly.
pub fn load_str(
    file: Option<(&str, &str)>,
    env: &HashMap<String, String>,
) -> Result<Config, ConfigError> {
    let mut table = layer::parse("defaults", DEFAULT_CONFIG)?;
    let origin = match file {
        Some((name, text)) => {
            layer::merge(&mut table, layer::parse(name, text)?);
            name
        }
        None => "defaults",
    };
    layer::apply_env(&mut table, env)?;
    model::Config::from_table(origin, table, env)
}

#[cfg(test)]
mod tests;
