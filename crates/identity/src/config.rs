//! `[auth]`: who may connect, and as whom.

use std::{collections::BTreeMap, path::PathBuf};

use serde::Deserialize;

/// The services reachable without credentials unless `auth.public` says otherwise: health
/// checks and reflection.
pub const DEFAULT_PUBLIC: [&str; 3] = [
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// `[auth]`. Without the section every caller is the anonymous principal `anonymous`; with
/// it, a request needs a credential unless `anonymous` names the principal of those that
/// carry none.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// The principal of requests without credentials; `None`: they are refused.
    #[serde(default)]
    pub anonymous: Option<String>,
    /// The roles of the anonymous principal.
    #[serde(default)]
    pub anonymous_roles: Vec<String>,
    /// gRPC services (full names) reachable without credentials.
    #[serde(default = "default_public")]
    pub public: Vec<String>,
    /// Clock skew allowed when checking a token's `exp` and `nbf`, in seconds.
    #[serde(default = "default_leeway_s")]
    pub leeway_s: u64,
    /// API keys, stored as SHA-256 digests.
    #[serde(default)]
    pub api_keys: Vec<ApiKeyConfig>,
    /// Issuers of JSON Web Tokens.
    #[serde(default)]
    pub jwt: Vec<JwtConfig>,
    /// Client certificates of mutual TLS as principals (the listener's TLS is `[tls]`).
    #[serde(default)]
    pub certificates: Option<CertificatesConfig>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            anonymous: None,
            anonymous_roles: Vec::new(),
            public: default_public(),
            leeway_s: default_leeway_s(),
            api_keys: Vec::new(),
            jwt: Vec::new(),
            certificates: None,
        }
    }
}

impl toolmesh_config::Section for AuthConfig {
    const NAME: &'static str = crate::SECTION;
    const DEFAULTS: &'static str = include_str!("default.toml");

    fn read(
        value: toml::Value,
        cx: &toolmesh_config::Reading<'_>,
    ) -> Result<Self, toolmesh_config::ConfigError> {
        cx.deserialize(value)
    }
}

fn default_public() -> Vec<String> {
    DEFAULT_PUBLIC.iter().map(|s| (*s).to_owned()).collect()
}

fn default_leeway_s() -> u64 {
    30
}

/// One `[[auth.api_keys]]`: a key, known by its SHA-256 digest or read from the
/// environment, and the principal it authenticates.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// The principal's name.
    pub principal: String,
    /// The key's SHA-256 digest, in hex (`toolmesh auth new-key` prints a key with it).
    #[serde(default)]
    pub sha256: String,
    /// Instead of `sha256`: the environment variable that holds the key itself (a key from
    /// a Kubernetes Secret, say). Only its digest is kept.
    #[serde(default)]
    pub key_env: Option<String>,
    /// The principal's roles.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Further attributes, for example `agent = "support-bot"`.
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
}

/// One `[[auth.jwt]]`: an issuer of JSON Web Tokens and where its keys are.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// The `iss` a token must carry.
    pub issuer: String,
    /// The `aud` values accepted; a token must carry one of them.
    pub audiences: Vec<String>,
    /// Algorithms accepted (`HS256`, `RS256`, `ES256`, ...); by default those of the key:
    /// HS256 for a secret, RS256 and ES256 for public keys and key sets.
    #[serde(default)]
    pub algorithms: Vec<String>,
    /// The environment variable holding an HMAC secret (HS256).
    #[serde(default)]
    pub secret_env: Option<String>,
    /// A PEM file with the issuer's public key (RSA or EC).
    #[serde(default)]
    pub public_key_file: Option<PathBuf>,
    /// A JWKS file with the issuer's keys, read again on an unknown `kid`.
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    /// A JWKS URL with the issuer's keys, fetched again on an unknown `kid`.
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// Longest time a key set is used before it is fetched again, in seconds.
    #[serde(default = "default_jwks_max_age_s")]
    pub jwks_max_age_s: u64,
    /// The claim naming the principal.
    #[serde(default = "default_principal_claim")]
    pub principal_claim: String,
    /// The claim holding roles: an array of strings, or one string of space-separated names.
    #[serde(default = "default_roles_claim")]
    pub roles_claim: String,
    /// Roles every principal of this issuer holds.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Claims copied into the principal's attributes (strings, numbers and booleans).
    #[serde(default)]
    pub attribute_claims: Vec<String>,
}

fn default_jwks_max_age_s() -> u64 {
    300
}

fn default_principal_claim() -> String {
    "sub".into()
}

fn default_roles_claim() -> String {
    "roles".into()
}

/// `[auth.certificates]`: the client certificate of a mutual-TLS connection as a principal.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CertificatesConfig {
    /// Roles every certificate principal holds.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Roles by principal name (the certificate's first DNS name, or its subject's common
    /// name).
    #[serde(default)]
    pub principals: BTreeMap<String, Vec<String>>,
}
