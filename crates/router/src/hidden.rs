//! What a discovery request left out because the caller may not see it.

use std::sync::Arc;

use toolmesh_core::Principal;

use crate::Admission;

/// The tools a discovery request left out because the caller may not see them, for its
/// audit event and the decisions metric. A search may look at a tool more than once (again
/// over every tool when its ranking holds fewer than k the caller may see): each tool
/// counts once.
pub struct Hidden {
    principal: Arc<Principal>,
    state: std::sync::Mutex<(std::collections::HashSet<String>, Vec<Arc<str>>)>,
}

impl Hidden {
    /// Starts the count of one request of `principal`.
    pub fn new(principal: Arc<Principal>) -> Self {
        Hidden { principal, state: Default::default() }
    }

    /// Notes the rule that hides the tool `name`, if one does; returns whether the tool is
    /// seen.
    pub fn note(&self, name: &str, rule: Option<Arc<str>>) -> bool {
        let Some(rule) = rule else { return true };
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if !state.0.contains(name) {
            state.0.insert(name.to_owned());
        }
        if !state.1.contains(&rule) {
            state.1.push(rule);
        }
        false
    }

    /// Counts the hidden tools and writes one audit event for `rpc`, when any was hidden.
    pub fn audit(&self, admission: &Admission, rpc: &str, started: std::time::Instant) {
        let (count, rules) = {
            let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.0.is_empty() {
                return;
            }
            (state.0.len(), state.1.join(","))
        };
        crate::metrics::policy_decided("hide", "discovery", count as u64);
        let policy = admission.policy();
        let ended = std::time::Instant::now();
        policy.audit().record(&toolmesh_policy::AuditEvent {
            event: "discovery",
            principal: &self.principal.name,
            principal_kind: self.principal.kind.as_str(),
            issuer: self.principal.issuer.as_deref(),
            agent: self
                .principal
                .attributes
                .get(toolmesh_policy::AGENT_ATTRIBUTE)
                .map(String::as_str),
            tool: rpc,
            call_id: "",
            decision: "hide",
            rule: &rules,
            hidden: Some(count),
            outcome: "ok",
            duration: ended.duration_since(started),
            at: ended,
            trace_id: &crate::trace::current_trace_id(),
            policy: policy.version(),
            note: None,
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use toolmesh_core::Principal;

    use super::Hidden;

    #[test]
    fn a_tool_looked_at_again_is_hidden_once() {
        let hidden = Hidden::new(Arc::new(Principal::anonymous("bob")));
        let rule: Arc<str> = "only-admins-delete".into();
        // The ranking, the pass over every tool, and the ranking again.
        for _ in 0..3 {
            assert!(!hidden.note("file_delete", Some(rule.clone())));
            assert!(hidden.note("echo", None));
        }
        assert!(!hidden.note("drop_table", Some("no-sql".into())));
        let state = hidden.state.lock().unwrap();
        assert_eq!(state.0.len(), 2);
        assert_eq!(state.1, vec![rule, "no-sql".into()]);
    }
}
