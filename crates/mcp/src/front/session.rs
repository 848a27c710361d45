//! Sessions that any router replica accepts: a session id is signed, and carries what the
//! client said in its `initialize`, so a replica that has not seen the session restores it
//! from the id alone (rmcp replays the handshake into a fresh handler). A load balancer
//! needs no affinity, a restart loses no session, and nothing is stored anywhere.
//!
//! An id is `<payload>.<mac>`, both base64url without padding. The payload is a version
//! byte, the issue time (unix seconds, u64 LE), 8 bytes of SHA-256 of the principal that
//! opened the session, 12 bytes of SHA-256 of rmcp's own (random) id for it, which make
//! each session's id its own, and the `initialize` parameters as JSON; the mac is the first 16
//! bytes of its HMAC-SHA256. A session is accepted for its principal only, until its
//! lifetime has passed. A session its client ended (`DELETE`) is refused by the replica that
//! ended it; other replicas accept it until its lifetime has passed, as nothing is shared.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use rmcp::transport::streamable_http_server::session::{
    SessionState, SessionStore, SessionStoreError,
};
use sha2::{Digest, Sha256};
use toolmesh_core::Principal;

use super::sealed::{Sealer, now, principal_digest};

const VERSION: u8 = 1;
/// Version, issue time, principal digest, nonce.
const FIXED: usize = 1 + 8 + 8 + 12;
/// Handshakes held between rmcp storing one and the response naming its session; more
/// means responses are not being sent, and the oldest are dropped.
const MAX_PENDING: usize = 4096;
/// Ended sessions remembered, to refuse them; the oldest are forgotten first.
const MAX_ENDED: usize = 65_536;
/// Sessions opened here whose local ids are remembered.
const MAX_ALIASES: usize = 65_536;

/// Why a session id is not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SessionError {
    #[error("not a session id this endpoint issued")]
    Invalid,
    #[error("the session has expired")]
    Expired,
    #[error("the session belongs to another principal")]
    OtherPrincipal,
    #[error("the session was ended by its client")]
    Ended,
}

/// Signs and opens session ids with one key, and is rmcp's session store: `store` keeps a
/// handshake until the response's session id is replaced by a signed one, and `load`
/// reads the handshake out of a signed id.
pub(crate) struct SignedSessions {
    sealer: Sealer,
    ttl: Duration,
    /// rmcp's own session id → the handshake it completed.
    pending: Mutex<HashMap<String, SessionState>>,
    /// Sessions their clients ended here, in the order they ended.
    ended: Mutex<Ended>,
    /// Signed id → rmcp's own id, for the sessions opened here.
    aliases: Mutex<HashMap<String, String>>,
}

#[derive(Debug, Default)]
struct Ended {
    ids: std::collections::HashSet<String>,
    order: std::collections::VecDeque<String>,
}

impl std::fmt::Debug for SignedSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignedSessions").field("ttl", &self.ttl).finish_non_exhaustive()
    }
}

impl SignedSessions {
    /// Returns the sessions signed with `key`, accepted for `ttl` after their handshake.
    pub(crate) fn new(key: &[u8], ttl: Duration) -> Self {
        SignedSessions {
            sealer: Sealer::new(key),
            ttl,
            pending: Mutex::default(),
            ended: Mutex::default(),
            aliases: Mutex::default(),
        }
    }

    /// Returns the signed id of the session rmcp opened as `local` for `principal`; `None`
    /// when rmcp stored no handshake under that id.
    pub(crate) fn sign(&self, local: &str, principal: &Principal) -> Option<String> {
        let state = self.pending.lock().unwrap_or_else(PoisonError::into_inner).remove(local)?;
        let params = serde_json::to_vec(&state.initialize_params).ok()?;
        let mut payload = Vec::with_capacity(FIXED + params.len());
        payload.push(VERSION);
        payload.extend_from_slice(&now().to_le_bytes());
        payload.extend_from_slice(&principal_digest(principal));
        payload.extend_from_slice(&Sha256::digest(local.as_bytes())[..12]);
        payload.extend_from_slice(&params);
        Some(self.sealer.seal(&payload))
    }

    /// Checks `id`'s signature and returns its payload.
    fn payload(&self, id: &str) -> Result<Vec<u8>, SessionError> {
        let payload = self.sealer.open(id).ok_or(SessionError::Invalid)?;
        if payload.len() < FIXED || payload[0] != VERSION {
            return Err(SessionError::Invalid);
        }
        Ok(payload)
    }

    /// Checks that `id` is a session this endpoint (or a replica sharing its key) issued to
    /// `principal`, still within its lifetime.
    pub(crate) fn check(&self, id: &str, principal: &Principal) -> Result<(), SessionError> {
        let payload = self.payload(id)?;
        let issued =
            u64::from_le_bytes(payload[1..9].try_into().map_err(|_| SessionError::Invalid)?);
        if now().saturating_sub(issued) > self.ttl.as_secs() {
            return Err(SessionError::Expired);
        }
        if payload[9..17] != principal_digest(principal) {
            return Err(SessionError::OtherPrincipal);
        }
        if self.ended.lock().unwrap_or_else(PoisonError::into_inner).ids.contains(id) {
            return Err(SessionError::Ended);
        }
        Ok(())
    }

    /// Remembers that the session signed as `signed` runs here as rmcp's `local`.
    pub(crate) fn alias(&self, signed: &str, local: &str) {
        let mut aliases = self.aliases.lock().unwrap_or_else(PoisonError::into_inner);
        if aliases.len() >= MAX_ALIASES {
            // The sessions of a burst of handshakes are restored from their ids instead.
            aliases.clear();
        }
        aliases.insert(signed.to_owned(), local.to_owned());
    }

    /// Returns rmcp's own id of the session signed as `signed`, where it was opened here.
    pub(crate) fn local_of(&self, signed: &str) -> Option<String> {
        self.aliases.lock().unwrap_or_else(PoisonError::into_inner).get(signed).cloned()
    }

    /// Forgets the local id of a session that no longer runs here.
    pub(crate) fn forget(&self, signed: &str) {
        self.aliases.lock().unwrap_or_else(PoisonError::into_inner).remove(signed);
    }

    /// Remembers that the client of session `id` ended it.
    pub(crate) fn end(&self, id: &str) {
        let mut ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        if ended.ids.insert(id.to_owned()) {
            ended.order.push_back(id.to_owned());
        }
        while ended.order.len() > MAX_ENDED {
            if let Some(oldest) = ended.order.pop_front() {
                ended.ids.remove(&oldest);
            }
        }
    }
}

#[async_trait::async_trait]
impl SessionStore for SignedSessions {
    async fn load(&self, id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        let Ok(payload) = self.payload(id) else { return Ok(None) };
        Ok(serde_json::from_slice(&payload[FIXED..]).ok().map(SessionState::new))
    }

    async fn store(&self, id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        // A signed id is stored nowhere: this is rmcp's own id, on its way to be signed.
        if self.payload(id).is_err() {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            if pending.len() >= MAX_PENDING {
                pending.clear();
            }
            pending.insert(id.to_owned(), state.clone());
        }
        Ok(())
    }

    async fn delete(&self, _id: &str) -> Result<(), SessionStoreError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::{ClientCapabilities, Implementation, InitializeRequestParams};

    use super::*;

    fn handshake() -> SessionState {
        SessionState::new(InitializeRequestParams::new(
            ClientCapabilities::default(),
            Implementation::new("client", "1.0"),
        ))
    }

    #[tokio::test]
    async fn a_signed_session_opens_on_any_replica_with_the_key_for_its_principal_only() {
        let alice = Principal::anonymous("alice");
        let one = SignedSessions::new(b"shared key", Duration::from_secs(60));
        one.store("local-1", &handshake()).await.unwrap();
        let id = one.sign("local-1", &alice).expect("the handshake was stored");
        assert!(one.sign("local-1", &alice).is_none(), "a handshake is signed once");
        one.store("local-2", &handshake()).await.unwrap();
        let same_second = one.sign("local-2", &alice).unwrap();
        assert_ne!(id, same_second, "two handshakes alike in all but their session");

        let two = SignedSessions::new(b"shared key", Duration::from_secs(60));
        assert_eq!(two.check(&id, &alice), Ok(()));
        let restored = two.load(&id).await.unwrap().expect("the handshake travels in the id");
        assert_eq!(restored.initialize_params.client_info.name, "client");
        assert_eq!(
            two.check(&id, &Principal::anonymous("mallory")),
            Err(SessionError::OtherPrincipal)
        );

        let other_key = SignedSessions::new(b"another key", Duration::from_secs(60));
        assert_eq!(other_key.check(&id, &alice), Err(SessionError::Invalid));
        assert!(other_key.load(&id).await.unwrap().is_none());
        two.end(&id);
        assert_eq!(two.check(&id, &alice), Err(SessionError::Ended));
        assert_eq!(one.check(&id, &alice), Ok(()), "only the replica that ended it knows");
        let mut forged = id.clone();
        forged.insert(3, 'A');
        assert_eq!(two.check(&forged, &alice), Err(SessionError::Invalid));
    }

    #[tokio::test]
    async fn a_session_past_its_lifetime_is_refused() {
        let alice = Principal::anonymous("alice");
        let sessions = SignedSessions::new(b"key", Duration::ZERO);
        sessions.store("local", &handshake()).await.unwrap();
        let id = sessions.sign("local", &alice).unwrap();
        // Issued this second; a lifetime of zero has passed once the clock moves on.
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(sessions.check(&id, &alice), Err(SessionError::Expired));
    }
}
