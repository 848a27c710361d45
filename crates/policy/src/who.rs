//! Whom a rule, a binding or a limit is for.

use toolmesh_config::glob;
use toolmesh_core::{Principal, PrincipalKind};

use crate::PolicyError;

/// The principal attribute that names the agent a principal acts for.
pub const AGENT_ATTRIBUTE: &str = "agent";

/// Whom a rule, a binding or a limit is for.
#[derive(Debug, Clone, Default)]
pub(crate) struct Who {
    pub(crate) principals: Vec<String>,
    pub(crate) roles: Vec<String>,
    pub(crate) agents: Vec<String>,
    pub(crate) kinds: Vec<PrincipalKind>,
    pub(crate) issuers: Vec<String>,
}

impl Who {
    /// Returns whom the entry at `key` (under `policy`) names; a kind that is not one is
    /// refused, naming `key.principal_kinds`.
    pub(crate) fn new(
        key: &str,
        principals: &[String],
        roles: &[String],
        agents: &[String],
        kinds: &[String],
        issuers: &[String],
    ) -> Result<Self, PolicyError> {
        let kinds = kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| {
                PrincipalKind::from_name(kind).ok_or_else(|| PolicyError::Rule {
                    key: format!("{key}.principal_kinds[{i}]"),
                    reason: format!(
                        "{kind:?} is not a kind of principal: one of api_key, jwt, certificate, \
                         anonymous"
                    ),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Who {
            principals: principals.to_vec(),
            roles: roles.to_vec(),
            agents: agents.to_vec(),
            kinds,
            issuers: issuers.to_vec(),
        })
    }

    pub(crate) fn matches(&self, principal: &Principal) -> bool {
        (self.principals.is_empty() || self.principals.iter().any(|p| glob(p, &principal.name)))
            && (self.roles.is_empty() || self.roles.iter().any(|r| principal.has_role(r)))
            && (self.agents.is_empty()
                || agent(principal).is_some_and(|a| self.agents.iter().any(|p| glob(p, a))))
            && (self.kinds.is_empty() || self.kinds.contains(&principal.kind))
            && (self.issuers.is_empty()
                || principal
                    .issuer
                    .as_deref()
                    .is_some_and(|i| self.issuers.iter().any(|p| glob(p, i))))
    }
}

/// The agent `principal` acts for, when it names one.
pub(crate) fn agent(principal: &Principal) -> Option<&str> {
    principal.attributes.get(AGENT_ATTRIBUTE).map(String::as_str)
}
