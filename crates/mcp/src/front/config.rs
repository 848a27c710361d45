//! `[mcp_endpoint]`: the MCP endpoint toolmesh serves.

use std::time::Duration;

use serde::Deserialize;
use toolmesh_config::{ConfigError, Reading, Section, values::positive_ms};

/// `[mcp_endpoint]`.
#[derive(Debug, Clone, PartialEq)]
pub struct McpEndpointConfig {
    /// Serve MCP at all.
    pub enabled: bool,
    /// Host headers accepted; empty: any.
    pub allowed_hosts: Vec<String>,
    /// Origin headers accepted; empty: any.
    pub allowed_origins: Vec<String>,
    /// How long a session id is accepted after its `initialize`.
    pub session_ttl: Duration,
    /// The endpoint's public URL, for the protected-resource metadata; `None`: from the
    /// request.
    pub public_url: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEndpoint {
    enabled: bool,
    allowed_hosts: Vec<String>,
    allowed_origins: Vec<String>,
    session_ttl_s: u64,
    public_url: String,
}

impl Section for McpEndpointConfig {
    const NAME: &'static str = "mcp_endpoint";
    const DEFAULTS: &'static str = include_str!("endpoint.toml");

    fn read(value: toml::Value, cx: &Reading<'_>) -> Result<Self, ConfigError> {
        let raw: RawEndpoint = cx.deserialize(value)?;
        let key_error = &|key: String, reason: String| cx.key_error(key, reason);
        for (i, origin) in raw.allowed_origins.iter().enumerate() {
            if origin != "null" && !origin.contains("://") {
                return Err(key_error(
                    format!("mcp_endpoint.allowed_origins[{i}]"),
                    format!("`{origin}` names no scheme: write it as https://host:port"),
                ));
            }
        }
        let public_url =
            Some(raw.public_url.trim_end_matches('/').to_owned()).filter(|url| !url.is_empty());
        if let Some(url) = &public_url
            && url::Url::parse(url).is_err()
        {
            return Err(key_error(
                "mcp_endpoint.public_url".into(),
                format!("`{url}` is not a URL"),
            ));
        }
        Ok(McpEndpointConfig {
            enabled: raw.enabled,
            allowed_hosts: raw.allowed_hosts,
            allowed_origins: raw.allowed_origins,
            session_ttl: positive_ms(
                raw.session_ttl_s.saturating_mul(1000),
                "mcp_endpoint.session_ttl_s",
                key_error,
            )?,
            public_url,
        })
    }
}
