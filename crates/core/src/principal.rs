//! Who is calling: the principal a request was authenticated as.

use std::{collections::BTreeMap, fmt, sync::Arc};

/// How a principal proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrincipalKind {
    /// No credential: the anonymous principal the configuration allows.
    Anonymous,
    /// An API key from the configuration.
    ApiKey,
    /// A JSON Web Token from a configured issuer.
    Jwt,
    /// The client certificate of a mutual-TLS connection.
    Certificate,
}

impl PrincipalKind {
    /// Returns the kind's stable name, for logs, spans and policy expressions.
    pub fn as_str(self) -> &'static str {
        match self {
            PrincipalKind::Anonymous => "anonymous",
            PrincipalKind::ApiKey => "api_key",
            PrincipalKind::Jwt => "jwt",
            PrincipalKind::Certificate => "certificate",
        }
    }

    /// Returns the kind named `name` (as [`PrincipalKind::as_str`] names it).
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Anonymous, Self::ApiKey, Self::Jwt, Self::Certificate]
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }
}

/// A credential kept for passing on to an upstream: never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<Arc<str>>) -> Self {
        Secret(value.into())
    }

    /// Returns the secret's text, to put where it is sent.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Who a request runs as: named, with roles and attributes (for example the agent id) that
/// policy rules look at. Cheap to share behind an [`Arc`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The principal's name: the API key's principal, the token's subject, the certificate's
    /// subject, or the configured anonymous name.
    pub name: String,
    /// How it authenticated.
    pub kind: PrincipalKind,
    /// The issuer (`iss`) of the token it authenticated with; `None` for other kinds.
    pub issuer: Option<String>,
    /// Roles, for rules written for a role.
    pub roles: Vec<String>,
    /// Further attributes (for example `agent`), for rules and for the agent id.
    pub attributes: BTreeMap<String, String>,
    /// The bearer credential the request carried, for an upstream that opted in to
    /// receiving the caller's own token; `None` for the anonymous and certificate kinds.
    pub credential: Option<Secret>,
}

impl Principal {
    /// Returns the anonymous principal named `name`.
    pub fn anonymous(name: impl Into<String>) -> Self {
        Principal {
            name: name.into(),
            kind: PrincipalKind::Anonymous,
            issuer: None,
            roles: Vec::new(),
            attributes: BTreeMap::new(),
            credential: None,
        }
    }

    /// Returns whether the principal holds `role`.
    pub fn has_role(&self, role: &str) -> bool {
        self.roles.iter().any(|r| r == role)
    }

    /// Returns the principal's name qualified by how it authenticated, unique across
    /// kinds and issuers: `api_key:alice`, `jwt:https://idp.example:alice`,
    /// `certificate:alice`, `anonymous:guest`. Limits and approvals are kept by it, so that
    /// a token whose subject is `alice` never shares them with the key named `alice`.
    pub fn qualified_name(&self) -> String {
        match &self.issuer {
            Some(issuer) => format!("{}:{issuer}:{}", self.kind.as_str(), self.name),
            None => format!("{}:{}", self.kind.as_str(), self.name),
        }
    }
}

/// The principal of calls made inside toolmesh itself, and of servers run without
/// authentication: anonymous, named `anonymous`.
pub fn open_principal() -> Arc<Principal> {
    static OPEN: std::sync::OnceLock<Arc<Principal>> = std::sync::OnceLock::new();
    OPEN.get_or_init(|| Arc::new(Principal::anonymous(ANONYMOUS))).clone()
}

/// Returns whether `principal` is [`open_principal`]: the server requires no credentials,
/// or the call is toolmesh's own.
pub fn is_open(principal: &Arc<Principal>) -> bool {
    Arc::ptr_eq(principal, &open_principal())
}

/// Marks a request that reached a public service under `[auth]` without a credential, where
/// `[auth]` names no anonymous principal: it has no principal, and a service that needs one
/// refuses it (it never falls back to [`open_principal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoPrincipal;

/// The name of the anonymous principal when the configuration names none.
pub const ANONYMOUS: &str = "anonymous";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualified_names_tell_kinds_and_issuers_apart() {
        let key = Principal { kind: PrincipalKind::ApiKey, ..Principal::anonymous("alice") };
        let token = |issuer: &str| Principal {
            kind: PrincipalKind::Jwt,
            issuer: Some(issuer.into()),
            ..Principal::anonymous("alice")
        };
        let names = [
            key.qualified_name(),
            token("https://a.example").qualified_name(),
            token("https://b.example").qualified_name(),
            Principal::anonymous("alice").qualified_name(),
        ];
        assert_eq!(names[0], "api_key:alice");
        assert_eq!(names[1], "jwt:https://a.example:alice");
        let distinct: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
    }

    #[test]
    fn a_secret_never_prints() {
        let principal = Principal {
            credential: Some(Secret::new("tm_live_0123456789")),
            ..Principal::anonymous("a")
        };
        let printed = format!("{principal:?}");
        assert!(!printed.contains("0123456789"), "{printed}");
        assert!(printed.contains("<redacted>"));
    }
}
