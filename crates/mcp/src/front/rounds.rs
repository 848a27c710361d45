//! The `requestState` of the input rounds toolmesh passes on to 2026-07-28 clients.
//!
//! An upstream server that needs input answers a request with an `InputRequiredResult`;
//! toolmesh hands it to its own client with the server's state wrapped in a state of its
//! own, and the client's next request (with its answers and that state) goes to the server
//! again with the server's state unwrapped. Nothing is kept between the requests, so any
//! router replica that shares the key serves any round.
//!
//! A state is `<payload>.<mac>`, both base64url without padding: the payload is JSON
//! (`v` version, `exp` expiry in unix seconds, `m` the method, `t` its target (the tool or
//! prompt name), `a` a SHA-256 of the request's arguments, `p` a digest of the principal,
//! `s` the server's own state or null), the mac the first 16 bytes of its HMAC-SHA256 under
//! a key derived from the endpoint's. A state is accepted only for the request it was
//! issued for (same method, target and arguments), from the same principal, until it
//! expires. The server's state travels readable: servers protect their own.

use std::time::Duration;

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use toolmesh_core::Principal;

use super::sealed::{Sealer, now, principal_digest};

const VERSION: u8 = 1;
/// How long a client has to answer a round.
pub(crate) const ROUND_TTL: Duration = Duration::from_secs(600);

/// Why a `requestState` is not accepted; the client is told no more than that it is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StateError {
    #[error("not a request state this endpoint issued")]
    Invalid,
    #[error("the request state has expired")]
    Expired,
    #[error("the request state belongs to another request")]
    OtherRequest,
    #[error("the request state belongs to another principal")]
    OtherPrincipal,
}

/// The request a state is bound to: its method, target, arguments and principal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bound {
    method: &'static str,
    target: String,
    arguments: String,
    principal: String,
}

impl Bound {
    pub(crate) fn new(
        method: &'static str,
        target: &str,
        arguments: Option<&serde_json::Map<String, Value>>,
        principal: &Principal,
    ) -> Self {
        let mut hash = Sha256::new();
        match arguments {
            Some(arguments) => canonical_object(&mut hash, arguments),
            None => hash.update(b"-"),
        }
        let arguments = URL_SAFE_NO_PAD.encode(&hash.finalize()[..16]);
        let principal = URL_SAFE_NO_PAD.encode(principal_digest(principal));
        Bound { method, target: target.to_owned(), arguments, principal }
    }
}

/// Feeds `object` to `hash` with its keys in order at every depth, so that equal arguments
/// hash alike however their client ordered them (serde_json may keep insertion order).
fn canonical_object(hash: &mut Sha256, object: &serde_json::Map<String, Value>) {
    let mut keys: Vec<&String> = object.keys().collect();
    keys.sort_unstable();
    hash.update(b"{");
    for key in keys {
        hash.update(Value::from(key.as_str()).to_string().as_bytes());
        hash.update(b":");
        canonical(hash, &object[key]);
        hash.update(b",");
    }
    hash.update(b"}");
}

fn canonical(hash: &mut Sha256, value: &Value) {
    match value {
        Value::Object(object) => canonical_object(hash, object),
        Value::Array(items) => {
            hash.update(b"[");
            for item in items {
                canonical(hash, item);
                hash.update(b",");
            }
            hash.update(b"]");
        }
        scalar => hash.update(scalar.to_string().as_bytes()),
    }
}

#[derive(Serialize, Deserialize)]
struct Claims {
    v: u8,
    exp: u64,
    m: String,
    t: String,
    a: String,
    p: String,
    s: Option<String>,
}

/// Wraps and unwraps the servers' states with one key.
pub(crate) struct SignedRounds {
    sealer: Sealer,
    ttl: Duration,
}

impl std::fmt::Debug for SignedRounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignedRounds").field("ttl", &self.ttl).finish_non_exhaustive()
    }
}

impl SignedRounds {
    /// Returns the signer of states under a key derived from the endpoint's `key`, each
    /// accepted for `ttl`.
    pub(crate) fn new(key: &[u8], ttl: Duration) -> Self {
        // A key of its own, so that no session id is ever taken for a state or back.
        SignedRounds { sealer: Sealer::derived(key, b"toolmesh mcp requestState"), ttl }
    }

    /// Wraps the server's `state` (if it gave one) for the next round of `bound`.
    pub(crate) fn wrap(&self, bound: &Bound, state: Option<String>) -> String {
        let claims = Claims {
            v: VERSION,
            exp: now() + self.ttl.as_secs(),
            m: bound.method.to_owned(),
            t: bound.target.clone(),
            a: bound.arguments.clone(),
            p: bound.principal.clone(),
            s: state,
        };
        self.sealer.seal(&serde_json::to_vec(&claims).unwrap_or_default())
    }

    /// Checks that `wrapped` was issued for `bound` and has not expired; returns the
    /// server's own state in it.
    pub(crate) fn unwrap(
        &self,
        wrapped: &str,
        bound: &Bound,
    ) -> Result<Option<String>, StateError> {
        let payload = self.sealer.open(wrapped).ok_or(StateError::Invalid)?;
        let claims: Claims = serde_json::from_slice(&payload).map_err(|_| StateError::Invalid)?;
        if claims.v != VERSION {
            return Err(StateError::Invalid);
        }
        if now() >= claims.exp {
            return Err(StateError::Expired);
        }
        if claims.m != bound.method || claims.t != bound.target || claims.a != bound.arguments {
            return Err(StateError::OtherRequest);
        }
        if claims.p != bound.principal {
            return Err(StateError::OtherPrincipal);
        }
        Ok(claims.s)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn arguments(value: Value) -> serde_json::Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn a_state_opens_on_any_replica_for_its_own_request_only() {
        let alice = Principal::anonymous("alice");
        let args = arguments(json!({"city": "Paris", "days": 3}));
        let bound = Bound::new("tools/call", "weather", Some(&args), &alice);
        let one = SignedRounds::new(b"shared key", ROUND_TTL);
        let state = one.wrap(&bound, Some("server state".into()));

        let two = SignedRounds::new(b"shared key", ROUND_TTL);
        assert_eq!(two.unwrap(&state, &bound), Ok(Some("server state".into())));
        let stateless = one.wrap(&bound, None);
        assert_eq!(two.unwrap(&stateless, &bound), Ok(None));

        // Built in the other order, as a client may send it.
        let mut reordered = serde_json::Map::new();
        reordered.insert("days".into(), json!(3));
        reordered.insert("city".into(), json!("Paris"));
        let same = Bound::new("tools/call", "weather", Some(&reordered), &alice);
        assert_eq!(two.unwrap(&state, &same), Ok(Some("server state".into())));
        let nested = arguments(json!({"city": "Paris", "days": 3, "at": [{"a": 1, "b": 2}]}));
        let mut inner = serde_json::Map::new();
        inner.insert("b".into(), json!(2));
        inner.insert("a".into(), json!(1));
        let mut nested_reordered = serde_json::Map::new();
        nested_reordered.insert("at".into(), json!([inner]));
        nested_reordered.insert("days".into(), json!(3));
        nested_reordered.insert("city".into(), json!("Paris"));
        let (first, second) = (
            Bound::new("tools/call", "weather", Some(&nested), &alice),
            Bound::new("tools/call", "weather", Some(&nested_reordered), &alice),
        );
        assert_eq!(first, second, "key order at any depth does not matter");
        let changed = arguments(json!({"city": "Rome", "days": 3}));
        let other = Bound::new("tools/call", "weather", Some(&changed), &alice);
        assert_eq!(two.unwrap(&state, &other), Err(StateError::OtherRequest));
        let prompt = Bound::new("prompts/get", "weather", Some(&args), &alice);
        assert_eq!(two.unwrap(&state, &prompt), Err(StateError::OtherRequest));
        let stolen = Bound::new("tools/call", "weather", Some(&args), &Principal::anonymous("eve"));
        assert_eq!(two.unwrap(&state, &stolen), Err(StateError::OtherPrincipal));

        let other_key = SignedRounds::new(b"another key", ROUND_TTL);
        assert_eq!(other_key.unwrap(&state, &bound), Err(StateError::Invalid));
        assert_eq!(two.unwrap(&format!("{state}-TAMPERED"), &bound), Err(StateError::Invalid));
        assert_eq!(two.unwrap("not a state", &bound), Err(StateError::Invalid));
    }

    #[test]
    fn a_state_past_its_lifetime_is_refused() {
        let bound = Bound::new("tools/call", "t", None, &Principal::anonymous("alice"));
        let rounds = SignedRounds::new(b"key", Duration::ZERO);
        let state = rounds.wrap(&bound, None);
        assert_eq!(rounds.unwrap(&state, &bound), Err(StateError::Expired));
    }
}
