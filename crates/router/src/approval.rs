//! The approval wait: a call a rule sends for approval waits here for a person's answer.

use tokio::time::Instant;
use toolmesh_core::EventSink;
use toolmesh_policy::{AGENT_ATTRIBUTE, AuditEvent, Scope};

use crate::{CallRequest, RouterError, error::approval_refusal, trace::current_trace_id};

/// Asks the caller to approve the call, and waits for the answer until the approval
/// timeout or the deadline, whichever is sooner. The answer must name this call's
/// approval, whose id binds principal, tool, arguments and policy version. Every
/// outcome is audited.
pub(crate) async fn approved(
    scope: &Scope,
    request: &CallRequest,
    rule: &str,
    reason: &str,
    events: &EventSink,
    deadline: Instant,
) -> Result<(), RouterError> {
    let policy = scope.policy();
    let wait = policy.approval_timeout().min(deadline.saturating_duration_since(Instant::now()));
    let principal = &request.principal;
    let approval =
        policy.approval(principal, &request.name, &request.arguments_json, rule, reason, wait);
    let issued = approval.id.clone();
    let started = std::time::Instant::now();
    let answer = events.approve(approval, wait).await;
    let (outcome, note, result) = match answer {
        None => (
            "timed_out",
            String::new(),
            Err(approval_refusal(
                "approval_timed_out",
                format!(
                    "the call of {} needs a person's approval (policy rule {rule}) and none \
                     came within {} ms: it was not made",
                    request.name,
                    wait.as_millis()
                ),
            )),
        ),
        Some(answer) => {
            // Signed here for exactly this call, and the id this request was sent: the
            // approval of an identical call made earlier does not approve this one.
            let checked = policy
                .check_approval(&answer.id, principal, &request.name, &request.arguments_json)
                .and_then(|()| {
                    if answer.id == issued {
                        Ok(())
                    } else {
                        Err(toolmesh_policy::ApprovalMismatch::OtherRequest)
                    }
                });
            match (checked, answer.approved) {
                (Err(mismatch), _) => (
                    "mismatch",
                    answer.note,
                    Err(approval_refusal(
                        "approval_mismatch",
                        format!(
                            "the answer does not approve this call of {}: {mismatch}",
                            request.name
                        ),
                    )),
                ),
                (Ok(()), false) => {
                    let said = if answer.note.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", answer.note)
                    };
                    let message = format!("the call of {} was not approved{said}", request.name);
                    ("denied", answer.note, Err(approval_refusal("approval_denied", message)))
                }
                (Ok(()), true) => ("approved", answer.note, Ok(())),
            }
        }
    };
    crate::metrics::policy_decided(
        if result.is_ok() { "approved" } else { "not_approved" },
        "approval",
        1,
    );
    if policy.audit().is_on() {
        let ended = std::time::Instant::now();
        policy.audit().record(&AuditEvent {
            event: "approval",
            principal: &principal.name,
            principal_kind: principal.kind.as_str(),
            issuer: principal.issuer.as_deref(),
            agent: principal.attributes.get(AGENT_ATTRIBUTE).map(String::as_str),
            tool: &request.name,
            call_id: &request.call_id,
            decision: outcome,
            rule,
            hidden: None,
            outcome: if result.is_ok() { "ok" } else { "refused" },
            duration: ended.duration_since(started),
            at: ended,
            trace_id: &current_trace_id(),
            policy: policy.version(),
            note: Some(&note).filter(|n| !n.is_empty()).map(String::as_str),
        });
    }
    result
}
