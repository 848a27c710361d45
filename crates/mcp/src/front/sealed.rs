//! The signed tokens of the MCP endpoint (session ids, the `requestState` of input rounds):
//! `<payload>.<mac>`, both base64url without padding, the mac the first 16 bytes of the
//! payload's HMAC-SHA256.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use toolmesh_core::Principal;

const MAC_LEN: usize = 16;

/// Seals payloads into tokens and opens tokens sealed with the same key.
pub(crate) struct Sealer {
    key: Hmac<Sha256>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer").finish_non_exhaustive()
    }
}

impl Sealer {
    /// Returns the sealer under `key`.
    pub(crate) fn new(key: &[u8]) -> Self {
        let key = <Hmac<Sha256> as KeyInit>::new_from_slice(key)
            .expect("HMAC accepts keys of any length");
        Sealer { key }
    }

    /// Returns the sealer under a key derived from `key` for `purpose`: tokens of one
    /// purpose are never taken for another's.
    pub(crate) fn derived(key: &[u8], purpose: &[u8]) -> Self {
        let mut derive = Self::new(key).key;
        derive.update(purpose);
        Self::new(&derive.finalize().into_bytes())
    }

    /// The token of `payload`.
    pub(crate) fn seal(&self, payload: &[u8]) -> String {
        let mut mac = self.key.clone();
        mac.update(payload);
        let tag = mac.finalize().into_bytes();
        format!("{}.{}", URL_SAFE_NO_PAD.encode(payload), URL_SAFE_NO_PAD.encode(&tag[..MAC_LEN]))
    }

    /// The payload of `token`, when this key sealed it.
    pub(crate) fn open(&self, token: &str) -> Option<Vec<u8>> {
        let (payload, tag) = token.trim().split_once('.')?;
        let payload = URL_SAFE_NO_PAD.decode(payload).ok()?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        if tag.len() != MAC_LEN {
            return None;
        }
        let mut mac = self.key.clone();
        mac.update(&payload);
        mac.verify_truncated_left(&tag).ok()?;
        Some(payload)
    }
}

/// Unix seconds.
pub(crate) fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// 8 bytes of SHA-256 of who `principal` is (name and issuer).
pub(crate) fn principal_digest(principal: &Principal) -> [u8; 8] {
    let mut hash = Sha256::new();
    hash.update(principal.name.as_bytes());
    hash.update([0]);
    hash.update(principal.issuer.as_deref().unwrap_or_default().as_bytes());
    let mut out = [0; 8];
    out.copy_from_slice(&hash.finalize()[..8]);
    out
}
