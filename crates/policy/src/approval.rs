//! Approvals bound to one call: an approval's id is a signed statement of whom, which tool,
//! which arguments (a digest), which policy version and until when; an answer counts only
//! for the call whose statement it repeats.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use hmac::{Hmac, Mac as _};
use sha2::{Digest as _, Sha256};
use toolmesh_core::Approval;

/// Signs and checks approval ids with a key of this process.
pub(crate) struct ApprovalSigner {
    key: Hmac<Sha256>,
}

/// Why an answer does not approve a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalMismatch {
    /// The id was not signed here, or was altered.
    #[error("the approval id is not one this server issued")]
    Forged,
    /// The id is for another principal, tool, arguments or policy version.
    #[error("the approval was given for another call ({0} differs)")]
    OtherCall(&'static str),
    /// The id is for this very call, but was issued to another request of it: an approval
    /// is given once, to the request that asked.
    #[error(
        "the approval was given to another request of the same call; each request is approved \
         with the id it was sent"
    )]
    OtherRequest,
    /// The approval's time is up.
    #[error("the approval has expired")]
    Expired,
}

/// What an approval is bound to.
struct Binding<'a> {
    principal: &'a str,
    tool: &'a str,
    arguments_json: &'a str,
    version: &'a str,
}

impl Binding<'_> {
    /// The parts, each as a digest, in the order of the id.
    fn parts(&self) -> [(&'static str, String); 4] {
        let digest = |text: &str| {
            Sha256::digest(text.as_bytes()).iter().take(12).map(|b| format!("{b:02x}")).collect()
        };
        [
            ("principal", digest(self.principal)),
            ("tool", digest(self.tool)),
            ("arguments", digest(canonical(self.arguments_json).as_str())),
            ("policy version", self.version.to_owned()),
        ]
    }
}

/// The arguments as JSON written one way, so that `{"a":1, "b":2}` and `{"b":2,"a":1}` are
/// one call; text that is not JSON stands for itself.
fn canonical(arguments_json: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(arguments_json) {
        Ok(value) => sorted(value).to_string(),
        Err(_) => arguments_json.to_owned(),
    }
}

/// `value` with the keys of every object in order (a map may keep insertion order).
fn sorted(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

fn unix_ms(at: SystemTime) -> u128 {
    at.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()
}

impl ApprovalSigner {
    pub(crate) fn new(key: &[u8]) -> Self {
        ApprovalSigner {
            key: <Hmac<Sha256> as hmac::KeyInit>::new_from_slice(key)
                .expect("HMAC accepts keys of any length"),
        }
    }

    fn mac(&self, text: &str) -> String {
        let mut mac = self.key.clone();
        mac.update(text.as_bytes());
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    }

    /// Returns the approval request of a call, valid for `ttl`.
    #[allow(clippy::too_many_arguments)] // The call's parts, each bound into the id.
    pub(crate) fn request(
        &self,
        principal: &str,
        tool: &str,
        arguments_json: &str,
        version: &str,
        rule: &str,
        reason: &str,
        ttl: Duration,
    ) -> Approval {
        let expires_at = SystemTime::now() + ttl;
        let binding = Binding { principal, tool, arguments_json, version };
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).expect("the operating system's random source");
        let nonce: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
        let mut statement: Vec<String> = binding.parts().into_iter().map(|(_, v)| v).collect();
        statement.push(unix_ms(expires_at).to_string());
        statement.push(nonce);
        let statement = statement.join(".");
        let id = format!("{statement}.{}", self.mac(&statement));
        Approval {
            id,
            tool: tool.to_owned(),
            arguments_json: arguments_json.to_owned(),
            rule: rule.to_owned(),
            reason: reason.to_owned(),
            expires_at,
        }
    }

    /// Checks that `id` was issued here for exactly this call and has not expired.
    pub(crate) fn check(
        &self,
        id: &str,
        principal: &str,
        tool: &str,
        arguments_json: &str,
        version: &str,
    ) -> Result<(), ApprovalMismatch> {
        let (statement, mac) = id.rsplit_once('.').ok_or(ApprovalMismatch::Forged)?;
        let mut check = self.key.clone();
        check.update(statement.as_bytes());
        let mac = URL_SAFE_NO_PAD.decode(mac).map_err(|_| ApprovalMismatch::Forged)?;
        check.verify_slice(&mac).map_err(|_| ApprovalMismatch::Forged)?;
        let fields: Vec<&str> = statement.split('.').collect();
        let [p, t, a, v, expires, _nonce] = fields.as_slice() else {
            return Err(ApprovalMismatch::Forged);
        };
        let binding = Binding { principal, tool, arguments_json, version };
        for ((name, expected), given) in binding.parts().into_iter().zip([p, t, a, v]) {
            if expected != **given {
                return Err(ApprovalMismatch::OtherCall(name));
            }
        }
        let expires: u128 = expires.parse().map_err(|_| ApprovalMismatch::Forged)?;
        if unix_ms(SystemTime::now()) > expires {
            return Err(ApprovalMismatch::Expired);
        }
        Ok(())
    }
}
