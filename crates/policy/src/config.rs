//! `[policy]`: who may see and call which tool.

use std::{collections::BTreeMap, path::PathBuf};

use serde::Deserialize;
use toolmesh_config::Selector;

/// `[policy]`. Without the section every principal sees and calls every tool, and nothing
/// is audited.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// What a call of a tool no rule matches gets: `allow` (the default) or `deny`.
    #[serde(default)]
    pub default: Effect,
    /// The rules, in any order: a matching `deny` wins over every `allow`.
    #[serde(default)]
    pub rules: Vec<RuleConfig>,
    /// Per-agent tool lists (`[policy.agents.<agent id>]`): a principal whose `agent`
    /// attribute names an agent listed here sees and calls only that agent's tools.
    #[serde(default)]
    pub agents: BTreeMap<String, AgentConfig>,
    /// Routing profiles bound to principals: the first binding that matches a principal
    /// decides its profile, and its requests may name no other.
    #[serde(default)]
    pub profiles: Vec<BindingConfig>,
    /// Where the audit events go.
    #[serde(default)]
    pub audit: AuditConfig,
    /// Rate, concurrency and size limits.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// How long a call that needs approval waits for the answer (bounded by the call's
    /// deadline); no answer in time is a refusal.
    #[serde(default = "default_approval_timeout_ms")]
    pub approval_timeout_ms: u64,
}

impl toolmesh_config::Section for PolicyConfig {
    const NAME: &'static str = crate::SECTION;
    const DEFAULTS: &'static str = include_str!("default.toml");

    fn read(
        value: toml::Value,
        cx: &toolmesh_config::Reading<'_>,
    ) -> Result<Self, toolmesh_config::ConfigError> {
        cx.deserialize(value)
    }
}

fn default_approval_timeout_ms() -> u64 {
    300_000
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            default: Effect::default(),
            rules: Vec::new(),
            agents: BTreeMap::new(),
            profiles: Vec::new(),
            audit: AuditConfig::default(),
            limits: LimitsConfig::default(),
            approval_timeout_ms: default_approval_timeout_ms(),
        }
    }
}

/// `[policy.limits]`: how often, how much at once and how large.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// The largest arguments a call may carry, in bytes of JSON; none by default (the
    /// request message is bounded by `server.max_message_bytes`).
    #[serde(default)]
    pub max_argument_bytes: Option<usize>,
    /// The largest result a call may return, in bytes of text and structured JSON; none
    /// by default.
    #[serde(default)]
    pub max_result_bytes: Option<usize>,
    /// Limits per principal: the first entry that matches a principal applies, to each
    /// principal on its own.
    #[serde(default)]
    pub principals: Vec<PrincipalLimitConfig>,
    /// Limits per tool: the first entry that selects a tool applies, to each tool on its
    /// own, whoever calls it.
    #[serde(default)]
    pub tools: Vec<ToolLimitConfig>,
}

/// One `[[policy.limits.principals]]`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PrincipalLimitConfig {
    /// Principal names (`*` globs); none: every principal.
    #[serde(default)]
    pub principals: Vec<String>,
    /// Roles: the principal holds at least one.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Agent ids (`*` globs).
    #[serde(default)]
    pub agents: Vec<String>,
    /// How the principal authenticated: `api_key`, `jwt`, `certificate`, `anonymous`.
    #[serde(default)]
    pub principal_kinds: Vec<String>,
    /// Token issuers (`*` globs): the principal authenticated with a token of one.
    #[serde(default)]
    pub issuers: Vec<String>,
    /// Calls per second, on average (a token bucket refilled at this rate).
    #[serde(default)]
    pub rate_per_s: Option<f64>,
    /// Calls in a burst (the bucket's size); default: one second's worth, at least 1.
    #[serde(default)]
    pub burst: Option<u32>,
    /// Calls running at once.
    #[serde(default)]
    pub max_concurrent: Option<usize>,
}

/// One `[[policy.limits.tools]]`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ToolLimitConfig {
    /// The tools, as rules select them.
    pub tools: Vec<Selector>,
    /// Calls per second of each tool, from all callers together.
    #[serde(default)]
    pub rate_per_s: Option<f64>,
    /// Calls in a burst; default: one second's worth, at least 1.
    #[serde(default)]
    pub burst: Option<u32>,
    /// The largest result, in place of `max_result_bytes`.
    #[serde(default)]
    pub max_result_bytes: Option<usize>,
    /// Cut a larger result to the limit, marked as cut, instead of failing the call.
    #[serde(default)]
    pub truncate_result: bool,
}

/// What a rule, or the policy's default, does to the calls it matches.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    /// The call may go ahead (unless a `deny` rule matches too).
    #[default]
    Allow,
    /// The call is refused.
    Deny,
    /// The call waits for a person's approval, asked of the caller on `StreamCallTool`
    /// (unless a `deny` rule matches too); as a `default`, every call does.
    Approve,
}

impl Effect {
    /// Returns the effect's name, as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Allow => "allow",
            Effect::Deny => "deny",
            Effect::Approve => "approve",
        }
    }
}

/// One `[[policy.rules]]`.
///
/// A rule matches a call when every part it sets matches: the principal (its name, one of
/// its roles, its agent, how it authenticated, its token's issuer), the tool (name, source, kind, toolkit, tag) and the `when`
/// expression. A part left out matches everything.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// The rule's name: audit events and refusals cite it.
    pub name: String,
    /// `allow`, `deny` or `approve`.
    pub effect: Effect,
    /// Principal names (`*` globs).
    #[serde(default)]
    pub principals: Vec<String>,
    /// Roles: the principal holds at least one.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Agent ids (`*` globs), from the principal's `agent` attribute.
    #[serde(default)]
    pub agents: Vec<String>,
    /// How the principal authenticated: `api_key`, `jwt`, `certificate`, `anonymous`.
    #[serde(default)]
    pub principal_kinds: Vec<String>,
    /// Token issuers (`*` globs): the principal authenticated with a token of one.
    #[serde(default)]
    pub issuers: Vec<String>,
    /// Tools: `NAME`, `source:NAME`, `kind:KIND`, `toolkit:NAME`, `tag:NAME` (`*` globs).
    #[serde(default)]
    pub tools: Vec<Selector>,
    /// A CEL expression over `principal`, `tool` and `args`; the rule matches when it is
    /// true. A rule whose expression reads `args` is decided at each call; one that does not
    /// is decided at discovery too, so that a tool it denies is never listed.
    #[serde(default)]
    pub when: Option<String>,
    /// Why the rule refuses, for the caller: refusals that depend on the arguments say it.
    #[serde(default)]
    pub reason: Option<String>,
}

/// One `[policy.agents.<agent id>]`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The tools the agent may see and call, as rules select them.
    pub tools: Vec<Selector>,
}

/// One `[[policy.profiles]]`: the routing profile of the principals it matches.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BindingConfig {
    /// The routing profile (`[[routing.profiles]]`).
    pub profile: String,
    /// Principal names (`*` globs).
    #[serde(default)]
    pub principals: Vec<String>,
    /// Roles: the principal holds at least one.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Agent ids (`*` globs).
    #[serde(default)]
    pub agents: Vec<String>,
    /// How the principal authenticated: `api_key`, `jwt`, `certificate`, `anonymous`.
    #[serde(default)]
    pub principal_kinds: Vec<String>,
    /// Token issuers (`*` globs): the principal authenticated with a token of one.
    #[serde(default)]
    pub issuers: Vec<String>,
}

/// `[policy.audit]`: one JSON line per call and per discovery that hid tools.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    /// `stderr` (the default), `stdout`, `off`, or a file the lines are appended to.
    #[serde(default = "default_audit_to")]
    pub to: String,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig { to: default_audit_to() }
    }
}

fn default_audit_to() -> String {
    "stderr".into()
}

/// Where audit lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditTarget {
    /// Nowhere.
    Off,
    /// The process's standard error.
    Stderr,
    /// The process's standard output.
    Stdout,
    /// Appended to a file.
    File(PathBuf),
}

impl AuditConfig {
    /// Returns where the lines go.
    pub fn target(&self) -> AuditTarget {
        match self.to.as_str() {
            "off" | "" => AuditTarget::Off,
            "stderr" => AuditTarget::Stderr,
            "stdout" => AuditTarget::Stdout,
            path => AuditTarget::File(PathBuf::from(path)),
        }
    }
}
