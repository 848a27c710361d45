//! Values that sections read alike: durations in milliseconds, JSON from TOML, `${VAR}`
//! references.

use std::{collections::HashMap, time::Duration};

use serde_json::Value as Json;

use crate::ConfigError;

/// `true`, for `#[serde(default = "...")]`.
pub fn default_true() -> bool {
    true
}

/// `ms` as a duration; 0 is refused, naming `key`.
pub fn positive_ms(
    ms: u64,
    key: &str,
    key_error: &dyn Fn(String, String) -> ConfigError,
) -> Result<Duration, ConfigError> {
    if ms == 0 {
        return Err(key_error(key.to_owned(), "must be greater than 0".into()));
    }
    Ok(Duration::from_millis(ms))
}

/// Converts a TOML value to JSON; TOML datetimes have no JSON counterpart.
pub fn to_json(value: toml::Value) -> Result<Json, String> {
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
pub fn resolve_env_refs(value: &str, env: &HashMap<String, String>) -> Result<String, String> {
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

/// The environment variables the configuration `text` reads that `env` does not set: each
/// `${NAME}` in its values, each `env = "NAME"` of its `[credentials]`, and each
/// `key_env`/`secret_env` of its `[auth]`, by name. `toolmesh config check` reports them
/// instead of failing, so that a file can be checked where its secrets are not (a build, a
/// review).
pub fn unset_variables(text: &str, env: &HashMap<String, String>) -> Vec<String> {
    fn walk(value: &toml::Value, section: &str, key: &str, found: &mut Vec<String>) {
        match value {
            toml::Value::String(text) => {
                let names_a_variable = match section {
                    "credentials" => key == "env",
                    "auth" => key == "key_env" || key == "secret_env",
                    _ => false,
                };
                if names_a_variable {
                    found.push(text.clone());
                }
                let mut rest = text.as_str();
                while let Some(start) = rest.find("${") {
                    let after = &rest[start + 2..];
                    let Some(end) = after.find('}') else { break };
                    found.push(after[..end].to_owned());
                    rest = &after[end + 1..];
                }
            }
            toml::Value::Array(items) => {
                items.iter().for_each(|item| walk(item, section, key, found));
            }
            toml::Value::Table(table) => {
                for (name, item) in table {
                    walk(item, section, name, found);
                }
            }
            _ => {}
        }
    }
    let Ok(table) = text.parse::<toml::Table>() else { return Vec::new() };
    let mut found = Vec::new();
    for (name, value) in &table {
        walk(value, name, name, &mut found);
    }
    let unset: std::collections::BTreeSet<String> =
        found.into_iter().filter(|name| !env.contains_key(name)).collect();
    unset.into_iter().collect()
}
