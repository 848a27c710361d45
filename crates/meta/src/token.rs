//! Search tokens: what `searchTools` returned, signed, so that `callTool` can check it on
//! any router replica that shares the key, with no session state anywhere.
//!
//! A token is base64url (no padding) of a payload and the first 16 bytes of its
//! HMAC-SHA256. The payload holds a version byte, the issue time (unix seconds, u64 LE),
//! 8 bytes of SHA-256 of the session id, 4 of the profile name, the trace and span ids of
//! the search span (zeros when not recorded), and 8 bytes of SHA-256 of each returned tool
//! name, in rank order. Tool names are hashed, so a token stays short and reveals nothing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use toolmesh_telemetry::SpanIds;

const VERSION: u8 = 1;
const MAC_LEN: usize = 16;
const FIXED: usize = 1 + 8 + 8 + 4 + 16 + 8 + 1;

/// What a search granted: the session and profile it ran in, when, its span, and the
/// tools it returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SearchGrant {
    pub(crate) issued: u64,
    pub(crate) session: [u8; 8],
    pub(crate) profile: [u8; 4],
    pub(crate) span: Option<SpanIds>,
    pub(crate) tools: Vec<[u8; 8]>,
}

/// Why a token is not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TokenError {
    #[error("the searchToken is not one that searchTools returned")]
    Invalid,
    #[error("the searchToken has expired")]
    Expired,
}

fn short<const N: usize>(text: &str) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(&Sha256::digest(text.as_bytes())[..N]);
    out
}

impl SearchGrant {
    /// Returns a grant for `tools` (best first) found now in `session` under `profile`.
    pub(crate) fn new<'a>(
        session: &str,
        profile: &str,
        span: Option<SpanIds>,
        tools: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        SearchGrant {
            issued: now(),
            session: short(session),
            profile: short(profile),
            span,
            tools: tools.into_iter().map(short).collect(),
        }
    }

    /// Returns whether the grant was made in `session` under `profile`.
    pub(crate) fn belongs_to(&self, session: &str, profile: &str) -> bool {
        self.session == short::<8>(session) && self.profile == short::<4>(profile)
    }

    /// Returns the 1-based rank at which the search returned `tool`.
    pub(crate) fn rank_of(&self, tool: &str) -> Option<usize> {
        let tool = short::<8>(tool);
        self.tools.iter().position(|t| *t == tool).map(|i| i + 1)
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Signs and checks search tokens with one key.
pub(crate) struct TokenSigner {
    key: Hmac<Sha256>,
    ttl: Duration,
}

impl std::fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSigner").field("ttl", &self.ttl).finish_non_exhaustive()
    }
}

impl TokenSigner {
    /// Returns a signer with `key` whose tokens are accepted for `ttl`.
    pub(crate) fn new(key: &[u8], ttl: Duration) -> Self {
        let key = <Hmac<Sha256> as KeyInit>::new_from_slice(key)
            .expect("HMAC accepts keys of any length");
        TokenSigner { key, ttl }
    }

    /// Returns the token of `grant`.
    pub(crate) fn sign(&self, grant: &SearchGrant) -> String {
        let mut bytes = Vec::with_capacity(FIXED + 8 * grant.tools.len() + MAC_LEN);
        bytes.push(VERSION);
        bytes.extend_from_slice(&grant.issued.to_le_bytes());
        bytes.extend_from_slice(&grant.session);
        bytes.extend_from_slice(&grant.profile);
        let span = grant.span.unwrap_or(SpanIds { trace_id: [0; 16], span_id: [0; 8] });
        bytes.extend_from_slice(&span.trace_id);
        bytes.extend_from_slice(&span.span_id);
        bytes.push(grant.tools.len().min(255) as u8);
        for tool in grant.tools.iter().take(255) {
            bytes.extend_from_slice(tool);
        }
        let mut mac = self.key.clone();
        mac.update(&bytes);
        bytes.extend_from_slice(&mac.finalize().into_bytes()[..MAC_LEN]);
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// Returns a key for `purpose` derived from this signer's: HMAC-SHA256 of the purpose.
    pub(crate) fn derive(&self, purpose: &str) -> [u8; 32] {
        let mut mac = self.key.clone();
        mac.update(b"toolmesh key for ");
        mac.update(purpose.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// Checks `token`'s signature and age, and returns its grant.
    pub(crate) fn verify(&self, token: &str) -> Result<SearchGrant, TokenError> {
        let bytes = URL_SAFE_NO_PAD.decode(token.trim()).map_err(|_| TokenError::Invalid)?;
        if bytes.len() < FIXED + MAC_LEN {
            return Err(TokenError::Invalid);
        }
        let (payload, tag) = bytes.split_at(bytes.len() - MAC_LEN);
        let mut mac = self.key.clone();
        mac.update(payload);
        mac.verify_truncated_left(tag).map_err(|_| TokenError::Invalid)?;
        if payload[0] != VERSION {
            return Err(TokenError::Invalid);
        }
        let take = |at: usize, n: usize| &payload[at..at + n];
        let issued = u64::from_le_bytes(take(1, 8).try_into().map_err(|_| TokenError::Invalid)?);
        let count = usize::from(payload[FIXED - 1]);
        if payload.len() != FIXED + 8 * count {
            return Err(TokenError::Invalid);
        }
        if now().saturating_sub(issued) > self.ttl.as_secs() {
            return Err(TokenError::Expired);
        }
        let mut span = SpanIds { trace_id: [0; 16], span_id: [0; 8] };
        span.trace_id.copy_from_slice(take(21, 16));
        span.span_id.copy_from_slice(take(37, 8));
        let tools = payload[FIXED..]
            .chunks_exact(8)
            .map(|c| c.try_into().map_err(|_| TokenError::Invalid))
            .collect::<Result<_, _>>()?;
        Ok(SearchGrant {
            issued,
            session: take(9, 8).try_into().map_err(|_| TokenError::Invalid)?,
            profile: take(17, 4).try_into().map_err(|_| TokenError::Invalid)?,
            span: (span.span_id != [0; 8]).then_some(span),
            tools,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_round_trips_between_signers_sharing_a_key_and_nowhere_else() {
        let span = SpanIds { trace_id: [7; 16], span_id: [9; 8] };
        let grant = SearchGrant::new("s-1", "default", Some(span), ["github_search", "echo"]);
        let token = TokenSigner::new(b"shared key", Duration::from_secs(60)).sign(&grant);

        let replica = TokenSigner::new(b"shared key", Duration::from_secs(60));
        let read = replica.verify(&token).unwrap();
        assert_eq!(read, grant);
        assert!(read.belongs_to("s-1", "default"));
        assert!(!read.belongs_to("s-2", "default"));
        assert!(!read.belongs_to("s-1", "other"));
        assert_eq!(read.rank_of("echo"), Some(2));
        assert_eq!(read.rank_of("github_search"), Some(1));
        assert_eq!(read.rank_of("think"), None);

        let stranger = TokenSigner::new(b"another key", Duration::from_secs(60));
        assert_eq!(stranger.verify(&token), Err(TokenError::Invalid));

        // A token whose tool list was altered fails the signature.
        let mut bytes = URL_SAFE_NO_PAD.decode(&token).unwrap();
        bytes[FIXED] ^= 1;
        assert_eq!(replica.verify(&URL_SAFE_NO_PAD.encode(bytes)), Err(TokenError::Invalid));
        assert_eq!(replica.verify("not a token"), Err(TokenError::Invalid));
    }

    #[test]
    fn an_old_token_is_expired() {
        let mut grant = SearchGrant::new("", "default", None, ["echo"]);
        grant.issued -= 120;
        let signer = TokenSigner::new(b"k", Duration::from_secs(60));
        assert_eq!(signer.verify(&signer.sign(&grant)), Err(TokenError::Expired));
        grant.issued += 100;
        assert!(signer.verify(&signer.sign(&grant)).is_ok());
    }
}
