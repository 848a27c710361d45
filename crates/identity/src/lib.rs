//! Who a request runs as.
//!
//! [`Authenticator`] turns a request's credential into a [`Principal`]: an API key from
//! `[[auth.api_keys]]` (stored as its SHA-256 digest), a JSON Web Token from an issuer of
//! `[[auth.jwt]]` (HS256, RS256, ES256; a static key, or a key set from a file or URL that is
//! read again on an unknown `kid`), the client certificate of a mutual-TLS connection, or —
//! where `auth.anonymous` allows it — nothing, as the named anonymous principal. Without an
//! `[auth]` section every caller is the anonymous principal `anonymous`.
//!
//! A credential that fails is an [`AuthError`], which the front door answers with
//! `UNAUTHENTICATED` and nothing else.

mod config;
mod jwt;

use std::{
    collections::HashMap,
    sync::{Arc, OnceLock},
};

use sha2::{Digest as _, Sha256};
pub use toolmesh_core::Principal;
use toolmesh_core::{PrincipalKind, Secret};

pub use config::{ApiKeyConfig, AuthConfig, CertificatesConfig, DEFAULT_PUBLIC, JwtConfig};
use jwt::Issuer;

/// The configuration section this crate reads.
pub const SECTION: &str = "auth";

/// Why a request's credential was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The request carries no credential and anonymous access is off.
    #[error("this server requires a credential: send `authorization: Bearer <API key or token>`")]
    Missing,
    /// The `authorization` value is not `Bearer <credential>`.
    #[error("the authorization metadata must be `Bearer <API key or token>`")]
    NotBearer,
    /// Neither a known API key nor a token of a configured issuer.
    #[error("the credential is not valid")]
    Invalid,
    /// The token's `exp` has passed.
    #[error("the token has expired")]
    Expired,
    /// The token's `nbf` has not come yet.
    #[error("the token is not valid yet")]
    NotYetValid,
    /// The token's `aud` is not one this server accepts.
    #[error("the token's audience is not accepted")]
    Audience,
    /// The token's `iss` is not a configured issuer.
    #[error("the token's issuer is not accepted")]
    Issuer,
    /// The signature does not verify.
    #[error("the token's signature does not verify")]
    Signature,
    /// The token's algorithm is not accepted.
    #[error("the token's algorithm is not accepted ({0})")]
    Algorithm(String),
    /// The token names a key the issuer does not hold.
    #[error("the token's signing key {0:?} is not known")]
    UnknownKey(String),
    /// A claim the server needs is missing.
    #[error("the token has no `{0}` claim")]
    MissingClaim(String),
    /// The token cannot be decoded.
    #[error("the token is malformed: {0}")]
    Malformed(String),
}

impl AuthError {
    /// Returns a short, stable name, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            AuthError::Missing => "missing",
            AuthError::NotBearer => "not_bearer",
            AuthError::Invalid => "invalid",
            AuthError::Expired => "expired",
            AuthError::NotYetValid => "not_yet_valid",
            AuthError::Audience => "audience",
            AuthError::Issuer => "issuer",
            AuthError::Signature => "signature",
            AuthError::Algorithm(_) => "algorithm",
            AuthError::UnknownKey(_) => "unknown_key",
            AuthError::MissingClaim(_) => "missing_claim",
            AuthError::Malformed(_) => "malformed",
        }
    }
}

/// The identity a mutual-TLS client certificate shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateIdentity {
    /// The certificate's first DNS name, or else its first URI (a SPIFFE ID such as
    /// `spiffe://example.org/ns/agents/sa/support`), or else its subject's common name.
    pub name: String,
}

impl CertificateIdentity {
    /// Returns the identity of the DER certificate `der` (which the TLS handshake has
    /// verified); `None` when it is not a certificate or names nobody.
    pub fn from_der(der: &[u8]) -> Option<Self> {
        use x509_parser::prelude::{FromDer as _, GeneralName, X509Certificate};
        let (_, certificate) = X509Certificate::from_der(der).ok()?;
        let alternative = certificate.subject_alternative_name().ok().flatten();
        let names = alternative.iter().flat_map(|extension| &extension.value.general_names);
        let dns = names.clone().find_map(|name| match name {
            GeneralName::DNSName(dns) => Some(*dns),
            _ => None,
        });
        let uri = || {
            names.clone().find_map(|name| match name {
                GeneralName::URI(uri) => Some(*uri),
                _ => None,
            })
        };
        let common_name =
            || certificate.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok());
        let name = dns.or_else(uri).or_else(common_name)?.trim();
        (!name.is_empty()).then(|| CertificateIdentity { name: name.to_owned() })
    }
}

/// Authenticates requests by the `[auth]` configuration. Cheap to share behind an `Arc`.
pub struct Authenticator {
    /// Whether `[auth]` is configured; without it every caller is `anonymous`.
    enforced: bool,
    anonymous: Option<Arc<Principal>>,
    public: Vec<String>,
    api_keys: HashMap<[u8; 32], KeyPrincipal>,
    issuers: Vec<Issuer>,
    certificates: Option<CertificatesConfig>,
}

/// The principal of an API key. Every request with the key is the same principal, the key
/// as its credential included, so it is built at the key's first use and then shared: a
/// request neither copies it nor makes the policy compare it field by field.
struct KeyPrincipal {
    configured: Principal,
    shared: OnceLock<Arc<Principal>>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("enforced", &self.enforced)
            .field("anonymous", &self.anonymous.as_ref().map(|p| &p.name))
            .field("api_keys", &self.api_keys.len())
            .field("issuers", &self.issuers.iter().map(Issuer::issuer).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// Returns the authenticator of a server without `[auth]`: every caller, whatever it
    /// sends, is the anonymous principal `anonymous`.
    pub fn open() -> Self {
        Authenticator {
            enforced: false,
            anonymous: Some(toolmesh_core::open_principal()),
            public: Vec::new(),
            api_keys: HashMap::new(),
            issuers: Vec::new(),
            certificates: None,
        }
    }

    /// Returns the authenticator `config` describes, reading environment variables with
    /// `env`. `Err` is (key below `auth`, reason).
    pub async fn new(
        config: &AuthConfig,
        env: &(dyn Fn(&str) -> Option<String> + Sync),
    ) -> Result<Self, (String, String)> {
        let mut api_keys = HashMap::new();
        for (i, key) in config.api_keys.iter().enumerate() {
            let at = |field: &str| format!("api_keys[{i}].{field}");
            if key.principal.is_empty() {
                return Err((at("principal"), "must not be empty".into()));
            }
            let digest = match (&key.key_env, key.sha256.is_empty()) {
                (Some(_), false) | (None, true) => {
                    return Err((at("sha256"), "set exactly one of sha256 and key_env".into()));
                }
                (Some(name), true) => {
                    let value = env(name).ok_or_else(|| {
                        (at("key_env"), format!("the environment variable {name} is not set"))
                    })?;
                    if value.trim().len() < MIN_KEY_LEN {
                        return Err((
                            at("key_env"),
                            format!(
                                "the key in {name} has {} characters; a key needs at least \
                                 {MIN_KEY_LEN} (toolmesh auth new-key makes one)",
                                value.trim().len()
                            ),
                        ));
                    }
                    Sha256::digest(value.trim().as_bytes()).into()
                }
                (None, false) => parse_digest(&key.sha256).ok_or_else(|| {
                    (at("sha256"), "must be 64 hexadecimal digits (the key's SHA-256)".to_owned())
                })?,
            };
            let principal = Principal {
                name: key.principal.clone(),
                kind: PrincipalKind::ApiKey,
                issuer: None,
                roles: key.roles.clone(),
                attributes: key.attributes.clone(),
                credential: None,
            };
            let key = KeyPrincipal { configured: principal, shared: OnceLock::new() };
            if api_keys.insert(digest, key).is_some() {
                return Err((at("sha256"), "the same key is configured twice".into()));
            }
        }
        let mut issuers: Vec<Issuer> = Vec::new();
        for (i, jwt) in config.jwt.iter().enumerate() {
            if issuers.iter().any(|issuer| issuer.issuer() == jwt.issuer) {
                return Err((format!("jwt[{i}].issuer"), "the issuer is configured twice".into()));
            }
            let issuer = Issuer::new(jwt, config.leeway_s, env)
                .await
                .map_err(|(key, reason)| (format!("jwt[{i}].{key}"), reason))?;
            issuers.push(issuer);
        }
        for (i, service) in config.public.iter().enumerate() {
            if service.starts_with("toolmesh.") {
                return Err((
                    format!("public[{i}]"),
                    format!(
                        "{service:?} is one of toolmesh's own services, which always \
                         authenticate their callers; to let callers without a credential in, \
                         name their principal in auth.anonymous"
                    ),
                ));
            }
        }
        let anonymous = match &config.anonymous {
            Some(name) if name.is_empty() => {
                return Err((
                    "anonymous".into(),
                    "must not be empty (omit it to refuse requests without credentials)".into(),
                ));
            }
            Some(name) => Some(Arc::new(Principal {
                roles: config.anonymous_roles.clone(),
                ..Principal::anonymous(name.clone())
            })),
            None => None,
        };
        Ok(Authenticator {
            enforced: true,
            anonymous,
            public: config.public.clone(),
            api_keys,
            issuers,
            certificates: config.certificates.clone(),
        })
    }

    /// Returns whether client certificates authenticate principals (`[auth.certificates]`).
    pub fn takes_certificates(&self) -> bool {
        self.certificates.is_some()
    }

    /// Returns the issuers (`iss`) whose tokens are accepted, in configuration order.
    pub fn issuers(&self) -> impl Iterator<Item = &str> {
        self.issuers.iter().map(Issuer::issuer)
    }

    /// Returns whether requests are authenticated at all (`[auth]` is configured).
    pub fn enforced(&self) -> bool {
        self.enforced
    }

    /// Returns whether gRPC service `service` (its full name) is reachable without a
    /// credential.
    pub fn is_public(&self, service: &str) -> bool {
        self.public.iter().any(|public| public == service)
    }

    /// Returns the principal of a request with `authorization` metadata (its value) and the
    /// client certificate of its connection. A bearer credential comes first, then the
    /// certificate, then the anonymous principal where allowed.
    pub async fn authenticate(
        &self,
        authorization: Option<&str>,
        certificate: Option<&CertificateIdentity>,
    ) -> Result<Arc<Principal>, AuthError> {
        if !self.enforced {
            return Ok(toolmesh_core::open_principal());
        }
        if let Some(value) = authorization {
            let token = bearer(value).ok_or(AuthError::NotBearer)?;
            let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
            if let Some(key) = self.api_keys.get(&digest) {
                // Only this key has this digest: the principal built at its first use, with
                // the key as its credential, is the one of this request too.
                let shared = key.shared.get_or_init(|| {
                    Arc::new(Principal {
                        credential: Some(Secret::new(token)),
                        ..key.configured.clone()
                    })
                });
                return Ok(shared.clone());
            }
            return self.token(token).await.map(Arc::new);
        }
        if let (Some(certificate), Some(config)) = (certificate, &self.certificates) {
            let mut roles = config.roles.clone();
            roles.extend(config.principals.get(&certificate.name).into_iter().flatten().cloned());
            return Ok(Arc::new(Principal {
                name: certificate.name.clone(),
                kind: PrincipalKind::Certificate,
                issuer: None,
                roles,
                attributes: Default::default(),
                credential: None,
            }));
        }
        self.anonymous.clone().ok_or(AuthError::Missing)
    }

    /// Returns the principal of a bearer credential that is no API key: a JWT.
    async fn token(&self, token: &str) -> Result<Principal, AuthError> {
        if self.issuers.is_empty() || token.bytes().filter(|b| *b == b'.').count() != 2 {
            return Err(AuthError::Invalid);
        }
        let header = jsonwebtoken::decode_header(token)
            .map_err(|error| AuthError::Malformed(error.to_string()))?;
        let issuer = match self.issuers.as_slice() {
            [only] => only,
            several => {
                let iss = peek_issuer(token)?;
                several.iter().find(|issuer| issuer.issuer() == iss).ok_or(AuthError::Issuer)?
            }
        };
        issuer.verify(token, &header).await
    }
}

/// Returns the credential of `Bearer <credential>` (the scheme in any case).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, credential) = value.trim().split_once(' ')?;
    let credential = credential.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !credential.is_empty()).then_some(credential)
}

/// Returns a token's `iss`, unverified: only to pick the issuer whose key verifies it.
fn peek_issuer(token: &str) -> Result<String, AuthError> {
    #[derive(serde::Deserialize)]
    struct Iss {
        iss: Option<String>,
    }
    let claims: Iss = jsonwebtoken::dangerous::insecure_decode_claims(token)
        .map_err(|error| AuthError::Malformed(error.to_string()))?;
    claims.iss.ok_or_else(|| AuthError::MissingClaim("iss".into()))
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim().as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut digest = [0u8; 32];
    for (byte, pair) in digest.iter_mut().zip(hex.chunks_exact(2)) {
        let text = std::str::from_utf8(pair).ok()?;
        *byte = u8::from_str_radix(text, 16).ok()?;
    }
    Some(digest)
}

/// Returns the SHA-256 digest of `key` in hex, as `[[auth.api_keys]]` stores it.
pub fn key_digest(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// The shortest key `key_env` accepts: 24 random bytes in base64. Keys of `new_key` have 46.
const MIN_KEY_LEN: usize = 32;

/// Returns a new random API key: `tm_` and 256 random bits in URL-safe base64.
pub fn new_key() -> String {
    use base64::Engine as _;
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the system's random source");
    format!("tm_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

#[cfg(test)]
mod tests;
