//! `[credentials.NAME]`: upstream credentials, shared or per principal, that HTTP tools
//! and MCP servers send.

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
};

use crate::ConfigError;

use serde::Deserialize;
use toolmesh_core::{Principal, Secret};

/// `[credentials.<name>]`: a secret an upstream (an HTTP tool, an MCP server over HTTP)
/// receives in a header on behalf of the caller: each principal's own secret (bring your
/// own key), or, where the operator opts in, the caller's own bearer token.
#[derive(Debug, Clone, PartialEq)]
pub struct CredentialConfig {
    /// The header it is sent in (lowercase), `authorization` unless configured.
    pub header: String,
    /// Put before the secret, `Bearer ` unless configured.
    pub prefix: String,
    /// Where the secret comes from.
    pub source: CredentialSource,
}

impl CredentialConfig {
    /// Returns the header value to send for `principal`: `None` when it has no secret.
    pub fn value_for(&self, principal: &Principal) -> Option<Secret> {
        let secret = match &self.source {
            // A qualified name (`jwt:https://idp.example:alice`) first, where one key of
            // the same name and a token's subject must not share a secret.
            CredentialSource::Principals { secrets, default } => secrets
                .get(&principal.qualified_name())
                .or_else(|| secrets.get(&principal.name))
                .or(default.as_ref())?,
            CredentialSource::CallerToken => principal.credential.as_ref()?,
        };
        Some(Secret::new(format!("{}{}", self.prefix, secret.expose())))
    }
}

/// Where a credential's secret comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum CredentialSource {
    /// Each principal's own, by principal name; `default` for the others (none: they are
    /// refused).
    Principals {
        /// The secrets by principal name, read from their environment variables or files.
        secrets: BTreeMap<String, Secret>,
        /// The secret of principals without their own.
        default: Option<Secret>,
    },
    /// The bearer token the caller authenticated with.
    CallerToken,
}

/// The credentials an upstream sends for its callers, with their names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpstreamCredentials(pub(crate) Vec<(String, CredentialConfig)>);

impl UpstreamCredentials {
    /// Returns whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Returns the headers (name, value) to send for `principal`. `Err` says which
    /// credential it has no secret of; it never holds a secret.
    pub fn headers(&self, principal: &Principal) -> Result<Vec<(String, Secret)>, String> {
        self.0
            .iter()
            .map(|(name, credential)| match credential.value_for(principal) {
                Some(value) => Ok((credential.header.clone(), value)),
                None if credential.source == CredentialSource::CallerToken => Err(format!(
                    "the credential `{name}` passes the caller's own token on, and principal \
                     {:?} did not authenticate with one",
                    principal.name
                )),
                None => Err(format!(
                    "principal {:?} has no secret of the credential `{name}` this tool sends \
                     ([credentials.{name}])",
                    principal.name
                )),
            })
            .collect()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCredential {
    #[serde(default = "default_credential_header")]
    pub(crate) header: String,
    #[serde(default = "default_credential_prefix")]
    pub(crate) prefix: String,
    #[serde(default)]
    pub(crate) pass_caller_token: bool,
    #[serde(default)]
    pub(crate) principals: BTreeMap<String, RawSecret>,
    pub(crate) default: Option<RawSecret>,
}

/// Where a secret is read: an environment variable or a file, never the file itself.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSecret {
    pub(crate) env: Option<String>,
    pub(crate) file: Option<PathBuf>,
}

pub(crate) fn default_credential_header() -> String {
    "authorization".into()
}

pub(crate) fn default_credential_prefix() -> String {
    "Bearer ".into()
}

/// Validates `[credentials.<name>]` (at `key`) and reads its secrets.
pub(crate) fn credential(
    key: &str,
    raw: RawCredential,
    env: &HashMap<String, String>,
    key_error: &dyn Fn(String, String) -> ConfigError,
) -> Result<CredentialConfig, ConfigError> {
    let header = raw.header.trim().to_ascii_lowercase();
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if header.is_empty() || !header.bytes().all(token) {
        return Err(key_error(format!("{key}.header"), format!("{header:?} is not a header name")));
    }
    if raw.prefix.bytes().any(|b| b.is_ascii_control()) {
        return Err(key_error(format!("{key}.prefix"), "must not hold control characters".into()));
    }
    let read = |raw: RawSecret, at: String| -> Result<Secret, ConfigError> {
        let value = match (raw.env, raw.file) {
            (Some(variable), None) => env.get(&variable).cloned().ok_or_else(|| {
                key_error(at.clone(), format!("environment variable {variable} is not set"))
            })?,
            (None, Some(file)) => std::fs::read_to_string(&file).map_err(|error| {
                key_error(at.clone(), format!("cannot read {}: {error}", file.display()))
            })?,
            _ => return Err(key_error(at, "give exactly one of `env` and `file`".into())),
        };
        // A file's trailing newline is not part of the secret.
        let value = value.trim();
        if value.is_empty() || value.bytes().any(|b| b.is_ascii_control()) {
            return Err(key_error(at, "the secret is empty or holds control characters".into()));
        }
        Ok(Secret::new(value))
    };
    let source = if raw.pass_caller_token {
        if !raw.principals.is_empty() || raw.default.is_some() {
            return Err(key_error(
                format!("{key}.pass_caller_token"),
                "either the caller's token or secrets of principals, not both".into(),
            ));
        }
        CredentialSource::CallerToken
    } else {
        if raw.principals.is_empty() && raw.default.is_none() {
            return Err(key_error(
                key.to_owned(),
                "give `principals` (each principal's secret), `default`, or \
                 `pass_caller_token = true`"
                    .into(),
            ));
        }
        let mut secrets = BTreeMap::new();
        for (principal, secret) in raw.principals {
            let at = format!("{key}.principals.{principal}");
            secrets.insert(principal, read(secret, at)?);
        }
        let default =
            raw.default.map(|secret| read(secret, format!("{key}.default"))).transpose()?;
        CredentialSource::Principals { secrets, default }
    };
    Ok(CredentialConfig { header, prefix: raw.prefix, source })
}

/// Reads `[credentials.NAME]`, secrets resolved from `env`.
pub(crate) fn credentials(
    raw: BTreeMap<String, RawCredential>,
    env: &HashMap<String, String>,
    key_error: &dyn Fn(String, String) -> ConfigError,
) -> Result<BTreeMap<String, CredentialConfig>, ConfigError> {
    let mut credentials = BTreeMap::new();
    for (name, raw) in raw {
        let key = format!("credentials.{name}");
        credentials.insert(name, credential(&key, raw, env, key_error)?);
    }
    Ok(credentials)
}

/// The credentials `names` that the tool or server at `key` sends, each defined under
/// `[credentials]`.
pub(crate) fn upstream(
    credentials: &BTreeMap<String, CredentialConfig>,
    names: Vec<String>,
    key: &str,
    key_error: &dyn Fn(String, String) -> ConfigError,
) -> Result<UpstreamCredentials, ConfigError> {
    let mut named = Vec::new();
    for name in names {
        let Some(credential) = credentials.get(&name) else {
            return Err(key_error(
                format!("{key}.credentials"),
                format!("no [credentials.{name}] section"),
            ));
        };
        named.push((name, credential.clone()));
    }
    Ok(UpstreamCredentials(named))
}
