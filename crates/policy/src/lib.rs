//! Tool policy: which principal may see and call which tool, with what arguments.
//!
//! A [`Policy`] is compiled from `[policy]`: rules that allow or deny tools (selected by
//! name, source, kind, toolkit or tag, with `*` globs) to principals (by name, role or
//! agent), optionally under a CEL condition over `principal`, `tool` and `args`; per-agent
//! tool lists; and routing profiles bound to principals. Deny wins. [`Policy::scope`] gives
//! the policy as it applies to one principal: [`Scope::sees`] decides discovery (listing,
//! search, the searchTools description) and [`Scope::decide`] each call. A tool a
//! principal does not see is [`Decision::Hidden`] — answered as an unknown tool — while
//! one it sees but may not call with these arguments is [`Decision::Refused`], citing the
//! rule. Every decision can be written to the [`AuditLog`] as a JSON line. `[policy.limits]`
//! bounds how often a principal or a tool is called (token buckets), how many calls a
//! principal runs at once, and how large arguments and results may be.

mod approval;
mod audit;
mod check;
mod compiled;
mod config;
mod limits;
mod policy;
#[cfg(test)]
mod tests;
mod variables;
mod who;

pub use approval::ApprovalMismatch;
pub use audit::{AuditEvent, AuditLog};
pub use config::{
    AgentConfig, AuditConfig, AuditTarget, BindingConfig, Effect, LimitsConfig, PolicyConfig,
    PrincipalLimitConfig, RuleConfig, ToolLimitConfig,
};
pub use limits::{LimitError, Permit, ResultLimit};
pub use policy::{DEFAULT_RULE, Decision, Policy, Scope, Visible};
pub use who::AGENT_ATTRIBUTE;

/// The configuration section this crate reads.
pub const SECTION: &str = "policy";

/// Why a `[policy]` cannot be put in force.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A rule is wrong; `key` is its place under `policy`, for example `rules[2].when`.
    #[error("policy.{key}: {reason}")]
    Rule {
        /// Where.
        key: String,
        /// Why.
        reason: String,
    },
    /// The audit log cannot be opened.
    #[error("cannot open the audit log {path}: {error}")]
    Audit {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        error: std::io::Error,
    },
}
