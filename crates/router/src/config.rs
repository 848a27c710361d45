//! `[routing]`: the routing profiles, and the key of search tokens.

use std::{collections::BTreeMap, time::Duration};

use serde::Deserialize;
use toolmesh_config::{
    ConfigError, Reading, Section, Selector,
    values::{default_true, positive_ms},
};

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

/// Keys published as examples in toolmesh's own files: refused as `routing.token_key`, since
/// anyone who read them could sign search tokens, MCP sessions and input-round states.
const PUBLISHED_KEYS: [&str; 1] = ["change-me-to-32-random-bytes"];

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

/// Reads `[routing]`: its profiles (the default one always there) and the search tokens'
/// key and lifetime.
impl Section for RoutingConfig {
    const NAME: &'static str = "routing";
    const DEFAULTS: &'static str = include_str!("default.toml");

    fn read(value: toml::Value, cx: &Reading<'_>) -> Result<Self, ConfigError> {
        let key_error = &|key: String, reason: String| cx.key_error(key, reason);
        routing(cx.deserialize(value)?, key_error)
    }
}

fn routing(
    raw: RawRouting,
    key_error: &dyn Fn(String, String) -> ConfigError,
) -> Result<RoutingConfig, ConfigError> {
    let mut profiles = BTreeMap::new();
    for (i, raw) in raw.profiles.into_iter().enumerate() {
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
    if PUBLISHED_KEYS.contains(&raw.token_key.trim()) {
        return Err(key_error(
            "routing.token_key".into(),
            "is the example key of toolmesh's own deploy files, which anyone can read and sign \
             tokens and sessions with: set a random key of your own, for example the output of \
             `openssl rand -base64 32`"
                .into(),
        ));
    }
    let routing = RoutingConfig {
        token_key: Some(raw.token_key).filter(|k| !k.is_empty()),
        token_ttl: positive_ms(
            raw.token_ttl_s.saturating_mul(1000),
            "routing.token_ttl_s",
            key_error,
        )?,
        profiles,
    };
    Ok(routing)
}

#[cfg(test)]
mod tests;
