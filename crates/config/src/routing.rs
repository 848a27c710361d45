//! `[routing]`: the routing profiles, and the selectors that name tools.

use std::{collections::BTreeMap, time::Duration};

use crate::{
    ConfigError,
    values::{default_true, positive_ms},
};

use serde::Deserialize;

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

impl<'de> serde::Deserialize<'de> for Selector {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Selector::parse(&text).map_err(serde::de::Error::custom)
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRouting {
    pub(crate) token_key: String,
    pub(crate) token_ttl_s: u64,
    #[serde(default)]
    pub(crate) profiles: Vec<RawProfile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProfile {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) expose: Vec<String>,
    #[serde(default = "default_pool")]
    pub(crate) pool: Vec<String>,
    #[serde(default = "default_top_k")]
    pub(crate) top_k: usize,
    #[serde(default = "default_true")]
    pub(crate) enforce_search_before_call: bool,
}

pub(crate) fn default_pool() -> Vec<String> {
    vec!["*".into()]
}

pub(crate) fn default_top_k() -> usize {
    5
}

/// Reads `[routing]`: its profiles (the default one always there) and the search tokens'
/// key and lifetime.
pub(crate) fn routing(
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
