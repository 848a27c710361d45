//! JSON Web Tokens: one [`Issuer`] per `[[auth.jwt]]`, with a static key or a key set (JWKS)
//! from a file or a URL that is read again when a token names a key it does not hold.

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    str::FromStr,
    sync::Arc,
    time::{Duration, Instant},
};

use arc_swap::ArcSwap;
use jsonwebtoken::{
    Algorithm, DecodingKey, Validation,
    errors::ErrorKind,
    jwk::{Jwk, JwkSet},
};
use serde_json::{Map, Value};
use toolmesh_core::{Principal, PrincipalKind, Secret};
use tracing::{info, warn};

use crate::{AuthError, config::JwtConfig};

/// Least time between two reads of a key set caused by unknown `kid`s: a stream of tokens
/// naming made-up keys costs one read per period, not one per token.
pub(crate) const UNKNOWN_KID_COOLDOWN: Duration = Duration::from_secs(5);
/// Longest wait for a JWKS URL.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest key set read.
const MAX_JWKS_BYTES: usize = 1 << 20;

/// An issuer of tokens: what a token from it must show, and its keys.
pub(crate) struct Issuer {
    config: JwtConfig,
    /// One per algorithm the issuer may use.
    validations: Vec<Validation>,
    keys: Keys,
}

enum Keys {
    /// A secret or a public key from the configuration.
    Static(DecodingKey),
    /// A key set, read again when needed.
    Set(KeySet),
}

struct KeySet {
    source: Source,
    max_age: Duration,
    loaded: ArcSwap<Loaded>,
    /// Held while the set is read again; holds when the last read for an unknown `kid` was.
    reload: tokio::sync::Mutex<Option<Instant>>,
}

enum Source {
    File(PathBuf),
    Url { url: String, client: reqwest::Client },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::File(path) => write!(f, "{}", path.display()),
            Source::Url { url, .. } => f.write_str(url),
        }
    }
}

#[derive(Default)]
struct Loaded {
    by_kid: HashMap<String, DecodingKey>,
    /// Keys without a `kid`, for tokens that name none.
    unnamed: Vec<DecodingKey>,
    /// When it was read; `None` before the first successful read.
    at: Option<Instant>,
}

impl Issuer {
    /// Returns the issuer `config` describes; `Err` is (key below `auth.jwt[i]`, reason).
    /// A key set is read here: a file must be readable, a URL that fails is read again at
    /// the first token.
    pub(crate) async fn new(
        config: &JwtConfig,
        leeway_s: u64,
        env: &(dyn Fn(&str) -> Option<String> + Sync),
    ) -> Result<Issuer, (String, String)> {
        let sources = [
            config.secret_env.is_some(),
            config.public_key_file.is_some(),
            config.jwks_file.is_some(),
            config.jwks_url.is_some(),
        ];
        if sources.iter().filter(|set| **set).count() != 1 {
            return Err((
                "issuer".into(),
                "set exactly one of secret_env, public_key_file, jwks_file, jwks_url".into(),
            ));
        }
        if config.audiences.is_empty() {
            return Err(("audiences".into(), "name at least one audience".into()));
        }
        let (keys, default_algorithms) = if let Some(name) = &config.secret_env {
            let secret = env(name).filter(|s| !s.is_empty()).ok_or_else(|| {
                ("secret_env".to_owned(), format!("the environment variable {name} is not set"))
            })?;
            let key = DecodingKey::from_secret(secret.as_bytes())
                .map_err(|error| ("secret_env".to_owned(), error.to_string()))?;
            (Keys::Static(key), vec![Algorithm::HS256])
        } else if let Some(path) = &config.public_key_file {
            let pem = std::fs::read(path).map_err(|error| {
                ("public_key_file".to_owned(), format!("{}: {error}", path.display()))
            })?;
            if let Ok(key) = DecodingKey::from_rsa_pem(&pem) {
                (Keys::Static(key), vec![Algorithm::RS256])
            } else if let Ok(key) = DecodingKey::from_ec_pem(&pem) {
                (Keys::Static(key), vec![Algorithm::ES256])
            } else {
                return Err((
                    "public_key_file".into(),
                    format!("{}: not a PEM RSA or EC public key", path.display()),
                ));
            }
        } else {
            let source = match (&config.jwks_file, &config.jwks_url) {
                (Some(path), _) => Source::File(path.clone()),
                (None, Some(url)) => {
                    if !(url.starts_with("https://") || url.starts_with("http://")) {
                        return Err((
                            "jwks_url".into(),
                            "must start with https:// or http://".into(),
                        ));
                    }
                    let client = reqwest::Client::builder()
                        .timeout(FETCH_TIMEOUT)
                        .build()
                        .map_err(|error| ("jwks_url".to_owned(), error.to_string()))?;
                    Source::Url { url: url.clone(), client }
                }
                (None, None) => unreachable!("one source is set"),
            };
            let set = KeySet {
                source,
                max_age: Duration::from_secs(config.jwks_max_age_s.max(1)),
                loaded: ArcSwap::from_pointee(Loaded::default()),
                reload: tokio::sync::Mutex::new(None),
            };
            match set.read().await {
                Ok(loaded) => set.loaded.store(Arc::new(loaded)),
                Err(reason) if matches!(set.source, Source::File(_)) => {
                    return Err(("jwks_file".into(), reason));
                }
                Err(reason) => {
                    warn!(issuer = %config.issuer, %reason, "the key set could not be read; trying again at the first token");
                }
            }
            (Keys::Set(set), vec![Algorithm::RS256, Algorithm::ES256])
        };
        let algorithms = if config.algorithms.is_empty() {
            default_algorithms
        } else {
            config
                .algorithms
                .iter()
                .map(|name| {
                    Algorithm::from_str(name).map_err(|_| {
                        ("algorithms".to_owned(), format!("unknown algorithm {name:?}"))
                    })
                })
                .collect::<Result<_, _>>()?
        };
        // One validation per algorithm: jsonwebtoken refuses a key whose family differs from
        // any algorithm its validation allows, and a key set mixes RSA and EC keys.
        let validations = algorithms
            .into_iter()
            .map(|algorithm| {
                let mut validation = Validation::new(algorithm);
                validation.leeway = leeway_s;
                validation.validate_nbf = true;
                validation.set_issuer(&[&config.issuer]);
                validation.set_audience(&config.audiences);
                validation.set_required_spec_claims(&["exp", "iss", "aud"]);
                validation
            })
            .collect();
        Ok(Issuer { config: config.clone(), validations, keys })
    }

    /// Returns the issuer's `iss`.
    pub(crate) fn issuer(&self) -> &str {
        &self.config.issuer
    }

    /// Verifies `token` (its header already decoded) and returns its principal.
    pub(crate) async fn verify(
        &self,
        token: &str,
        header: &jsonwebtoken::Header,
    ) -> Result<Principal, AuthError> {
        let validation = self
            .validations
            .iter()
            .find(|validation| validation.algorithms[0] == header.alg)
            .ok_or_else(|| AuthError::Algorithm(format!("{:?}", header.alg)))?;
        let claims = match &self.keys {
            Keys::Static(key) => decode(token, key, validation)?,
            Keys::Set(set) => {
                let key = set.key(header.kid.as_deref()).await?;
                decode(token, &key, validation)?
            }
        };
        self.principal(token, claims)
    }

    fn principal(&self, token: &str, claims: Map<String, Value>) -> Result<Principal, AuthError> {
        let config = &self.config;
        let name = match claims.get(&config.principal_claim) {
            Some(Value::String(name)) if !name.is_empty() => name.clone(),
            _ => return Err(AuthError::MissingClaim(config.principal_claim.clone())),
        };
        let mut roles = config.roles.clone();
        match claims.get(&config.roles_claim) {
            Some(Value::Array(items)) => {
                roles.extend(items.iter().filter_map(Value::as_str).map(str::to_owned));
            }
            Some(Value::String(text)) => roles.extend(text.split_whitespace().map(str::to_owned)),
            _ => {}
        }
        roles.sort_unstable();
        roles.dedup();
        let mut attributes = BTreeMap::new();
        for claim in &config.attribute_claims {
            let value = match claims.get(claim) {
                Some(Value::String(s)) => s.clone(),
                Some(value @ (Value::Number(_) | Value::Bool(_))) => value.to_string(),
                _ => continue,
            };
            attributes.insert(claim.clone(), value);
        }
        Ok(Principal {
            name,
            kind: PrincipalKind::Jwt,
            issuer: Some(config.issuer.clone()),
            roles,
            attributes,
            credential: Some(Secret::new(token)),
        })
    }
}

impl KeySet {
    /// Returns the key `kid` names (the only key when the token names none), reading the
    /// set again when it is older than its maximum age or does not hold `kid`.
    async fn key(&self, kid: Option<&str>) -> Result<DecodingKey, AuthError> {
        let stale = self.loaded.load().at.is_none_or(|at| at.elapsed() >= self.max_age);
        if stale {
            self.reload(false).await;
        }
        if let Some(key) = self.find(kid)? {
            return Ok(key);
        }
        if kid.is_some()
            && self.reload(true).await
            && let Some(key) = self.find(kid)?
        {
            return Ok(key);
        }
        Err(AuthError::UnknownKey(kid.unwrap_or_default().to_owned()))
    }

    fn find(&self, kid: Option<&str>) -> Result<Option<DecodingKey>, AuthError> {
        let loaded = self.loaded.load();
        Ok(match kid {
            Some(kid) => loaded.by_kid.get(kid).cloned(),
            None => match (loaded.unnamed.as_slice(), loaded.by_kid.len()) {
                ([key], 0) => Some(key.clone()),
                ([], 1) => loaded.by_kid.values().next().cloned(),
                _ => return Err(AuthError::Malformed("the token names no key (kid)".into())),
            },
        })
    }

    /// Reads the set again unless another task just did; for an unknown `kid`, at most once
    /// per cooldown. Returns whether a read happened and succeeded.
    async fn reload(&self, unknown_kid: bool) -> bool {
        let before = self.loaded.load().at;
        let mut last_unknown = self.reload.lock().await;
        if self.loaded.load().at != before {
            // Another task read it while this one waited.
            return true;
        }
        if unknown_kid {
            if last_unknown.is_some_and(|at| at.elapsed() < UNKNOWN_KID_COOLDOWN) {
                return false;
            }
            *last_unknown = Some(Instant::now());
        }
        match self.read().await {
            Ok(loaded) => {
                info!(source = %self.source, keys = loaded.by_kid.len() + loaded.unnamed.len(), "key set read");
                self.loaded.store(Arc::new(loaded));
                true
            }
            Err(reason) => {
                warn!(source = %self.source, %reason, "the key set could not be read; keeping the keys held");
                false
            }
        }
    }

    async fn read(&self) -> Result<Loaded, String> {
        let bytes = match &self.source {
            Source::File(path) => tokio::fs::read(path)
                .await
                .map_err(|error| format!("{}: {error}", path.display()))?,
            Source::Url { url, client } => {
                let response = client
                    .get(url)
                    .send()
                    .await
                    .and_then(reqwest::Response::error_for_status)
                    .map_err(|error| format!("{url}: {error}"))?;
                let bytes = response.bytes().await.map_err(|error| format!("{url}: {error}"))?;
                bytes.to_vec()
            }
        };
        if bytes.len() > MAX_JWKS_BYTES {
            return Err(format!("{}: the key set is over {MAX_JWKS_BYTES} bytes", self.source));
        }
        let set: JwkSet = serde_json::from_slice(&bytes)
            .map_err(|error| format!("{}: not a JWKS document: {error}", self.source))?;
        let mut loaded = Loaded { at: Some(Instant::now()), ..Loaded::default() };
        for jwk in &set.keys {
            match decoding_key(jwk) {
                Ok(key) => match &jwk.common.key_id {
                    Some(kid) => {
                        loaded.by_kid.insert(kid.clone(), key);
                    }
                    None => loaded.unnamed.push(key),
                },
                Err(reason) => {
                    warn!(source = %self.source, kid = ?jwk.common.key_id, %reason, "a key of the set is skipped")
                }
            }
        }
        Ok(loaded)
    }
}

fn decoding_key(jwk: &Jwk) -> Result<DecodingKey, String> {
    DecodingKey::from_jwk(jwk).map_err(|error| error.to_string())
}

/// Verifies `token`'s signature with `key` and its claims against `validation`.
fn decode(
    token: &str,
    key: &DecodingKey,
    validation: &Validation,
) -> Result<Map<String, Value>, AuthError> {
    jsonwebtoken::decode::<Map<String, Value>>(token, key, validation)
        .map(|data| data.claims)
        .map_err(|error| match error.kind() {
            ErrorKind::ExpiredSignature => AuthError::Expired,
            ErrorKind::ImmatureSignature => AuthError::NotYetValid,
            ErrorKind::InvalidAudience => AuthError::Audience,
            ErrorKind::InvalidIssuer => AuthError::Issuer,
            ErrorKind::InvalidSignature => AuthError::Signature,
            ErrorKind::InvalidAlgorithm => AuthError::Algorithm("for this key".into()),
            ErrorKind::MissingRequiredClaim(claim) => AuthError::MissingClaim(claim.clone()),
            _ => AuthError::Malformed(error.to_string()),
        })
}
