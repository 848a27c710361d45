//! Layering of TOML tables: defaults < file < environment.

use std::collections::HashMap;

use toml::{Table, Value};

use crate::ConfigError;

/// Prefix of environment overrides; `__` separates the path segments.
const ENV_PREFIX: &str = "TOOLMESH__";

pub(crate) fn parse(origin: &str, text: &str) -> Result<Table, ConfigError> {
    text.parse::<Table>().map_err(|error| {
        let line = error.span().map_or(0, |span| text[..span.start].lines().count().max(1));
        ConfigError::Syntax {
            origin: origin.to_owned(),
            line,
            reason: error.message().trim().to_owned(),
        }
    })
}

/// Merges `over` into `base`: tables merge key by key, everything else is replaced.
pub(crate) fn merge(base: &mut Table, over: Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(Value::Table(base)), Value::Table(over)) => merge(base, over),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// Applies `TOOLMESH__SECTION__KEY=value` overrides. A value that parses as a TOML value
/// (a number, a boolean, an array, a quoted string) takes that type; anything else is a
/// string.
pub(crate) fn apply_env(
    table: &mut Table,
    env: &HashMap<String, String>,
) -> Result<(), ConfigError> {
    let mut overrides: Vec<_> = env.iter().filter(|(k, _)| k.starts_with(ENV_PREFIX)).collect();
    overrides.sort();
    for (name, raw) in overrides {
        let path: Vec<String> =
            name[ENV_PREFIX.len()..].split("__").map(str::to_ascii_lowercase).collect();
        if path.iter().any(String::is_empty) {
            return Err(ConfigError::Key {
                origin: "environment".into(),
                key: name.clone(),
                reason: "empty path segment".into(),
            });
        }
        let value = format!("v = {raw}")
            .parse::<Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| Value::String(raw.clone()));
        let (last, parents) = path.split_last().expect("path has at least one segment");
        let mut cursor = &mut *table;
        for segment in parents {
            let entry = cursor.entry(segment.clone()).or_insert_with(|| Value::Table(Table::new()));
            cursor = match entry {
                Value::Table(t) => t,
                _ => {
                    return Err(ConfigError::Key {
                        origin: "environment".into(),
                        key: name.clone(),
                        reason: format!("`{segment}` is not a table"),
                    });
                }
            };
        }
        cursor.insert(last.clone(), value);
    }
    Ok(())
}
