//! The compiled policy and the decisions it makes for one principal.

use std::{
    cell::OnceCell,
    collections::{BTreeMap, HashMap},
    fmt,
    hash::{BuildHasher, Hash, Hasher},
    sync::{Arc, OnceLock, PoisonError, RwLock},
};

use cel::common::{types::CelBool, value::Val};
use serde_json::{Value as Json, json};
use sha2::{Digest as _, Sha256};
use toolmesh_config::Selector;
use toolmesh_core::{Principal, ToolSpec};

use crate::{
    AuditLog, PolicyError,
    approval::{ApprovalMismatch, ApprovalSigner},
    check,
    compiled::{Compiled, Roots},
    config::{BindingConfig, Effect, PolicyConfig},
    limits::{LimitError, Limits, Permit, ResultLimit},
    variables::{self, Args, Variables},
    who::{Who, agent},
};

/// The rule name decisions cite when no rule matched and the default decided.
pub const DEFAULT_RULE: &str = "default";

/// [`DEFAULT_RULE`] as a decision's rule, shared: a decision of the default allocates
/// nothing.
fn default_rule() -> Arc<str> {
    static RULE: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| DEFAULT_RULE.into());
    RULE.clone()
}

/// A compiled `[policy]`: rules, agent tool lists, profile bindings and the audit log.
/// Cheap to share behind an [`Arc`]; a reload compiles a new one.
pub struct Policy {
    config: PolicyConfig,
    /// Whether there is a `[policy]` at all: without one every tool is allowed and
    /// nothing is audited.
    active: bool,
    version: String,
    rules: Vec<Rule>,
    agents: BTreeMap<String, (Arc<str>, Vec<Selector>)>,
    env: Arc<cel::Env>,
    audit: AuditLog,
    limits: Limits,
    signer: ApprovalSigner,
    /// What the rules make of a tool for a principal, without a call's arguments.
    plans: Plans,
    /// `[[policy.profiles]]`: whom each binds, and the profile.
    bindings: Vec<(Who, String)>,
}

/// The plans of (principal, tool) pairs met so far, by a keyed hash of the principal's name,
/// kind and agent and of the tool; each keeps the principal and tool it was made for, so
/// that a colliding hash (or a principal of the same name with other roles) is never taken
/// for a match. Cleared when full: principals and tools may come and go without bound.
#[derive(Default)]
struct Plans {
    hasher: foldhash::fast::RandomState,
    map: RwLock<HashMap<u64, Arc<Plan>, foldhash::fast::RandomState>>,
}

/// At most this many plans are kept; then the cache starts over.
const MAX_PLANS: usize = 65_536;

/// What the rules written for one principal make of one tool without a call's
/// arguments: whether it is hidden, and the rules a call of it goes through, in order,
/// each decided already unless its condition reads the arguments. A call evaluates only
/// those conditions.
struct Plan {
    principal: Arc<Principal>,
    tool: ToolKey,
    hidden: Option<Arc<str>>,
    steps: Vec<Step>,
}

struct Step {
    rule: usize,
    /// The rule's outcome for any arguments; `None`: its condition reads them.
    decided: Option<bool>,
}

/// What of a tool the rules look at: selectors, and the `tool` of a condition.
#[derive(PartialEq)]
struct ToolKey {
    name: String,
    source: String,
    kind: &'static str,
    toolkit: Option<String>,
    tags: Vec<String>,
    annotations: toolmesh_core::ToolAnnotations,
}

impl ToolKey {
    fn of(spec: &ToolSpec) -> Self {
        ToolKey {
            name: spec.name.clone(),
            source: spec.source.name.clone(),
            kind: spec.source.kind.as_str(),
            toolkit: spec.toolkit.clone(),
            tags: spec.tags.clone(),
            annotations: spec.hints(),
        }
    }

    fn is(&self, spec: &ToolSpec) -> bool {
        self.name == spec.name
            && self.source == spec.source.name
            && self.kind == spec.source.kind.as_str()
            && self.toolkit == spec.toolkit
            && self.tags == spec.tags
            && self.annotations == spec.hints()
    }

    fn hash(spec: &ToolSpec, state: &mut impl Hasher) {
        spec.name.hash(state);
        spec.source.name.hash(state);
        spec.source.kind.as_str().hash(state);
        spec.toolkit.hash(state);
        spec.tags.hash(state);
        let a = spec.hints();
        [a.read_only, a.destructive, a.idempotent, a.open_world].hash(state);
    }
}

/// Whether two principals are the same to the rules: name, kind, issuer, roles and
/// attributes (not the credential, which no rule reads).
fn same_principal(a: &Principal, b: &Principal) -> bool {
    a.name == b.name
        && a.kind == b.kind
        && a.issuer == b.issuer
        && a.roles == b.roles
        && a.attributes == b.attributes
}

/// Hashes what tells principals apart in practice (one service account may act for several
/// agents): the principal and its `agent`; [`same_principal`] decides.
fn hash_principal(principal: &Principal, agent: Option<&str>, state: &mut impl Hasher) {
    principal.name.hash(state);
    principal.kind.as_str().hash(state);
    agent.hash(state);
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("version", &self.version)
            .field("rules", &self.rules.len())
            .field("agents", &self.agents.len())
            .finish_non_exhaustive()
    }
}

struct Rule {
    name: Arc<str>,
    effect: Effect,
    who: Who,
    tools: Vec<Selector>,
    when: Option<When>,
    reason: Option<String>,
}

struct When {
    program: cel::Program,
    /// The expression compiled for direct evaluation, when it uses only what that handles.
    compiled: Option<Compiled>,
    /// Whether the expression reads `args`: then it is decided only at a call.
    reads_args: bool,
    /// Whether it reads `args` only by selecting fields by name: then the fields it selects
    /// are read from the call's JSON, not the arguments converted whole.
    args_by_field: bool,
    /// Whether it reads `principal` and `tool`: only what it reads is built for it.
    reads_principal: bool,
    reads_tool: bool,
}

impl Policy {
    /// Returns the policy of a configuration without `[policy]`: every principal sees and
    /// calls every tool, and nothing is audited.
    pub fn open() -> Self {
        Policy {
            config: PolicyConfig::default(),
            active: false,
            version: String::new(),
            rules: Vec::new(),
            agents: BTreeMap::new(),
            env: Arc::new(cel::Env::stdlib()),
            audit: AuditLog::off(),
            limits: Limits::none(),
            signer: ApprovalSigner::new(&random_key()),
            plans: Plans::default(),
            bindings: Vec::new(),
        }
    }

    /// Compiles `config`: every `when` expression is parsed, and the audit target opened.
    /// A bad rule is an error naming its key (`rules[2].when`).
    pub fn new(config: PolicyConfig) -> Result<Self, PolicyError> {
        let env = Arc::new(cel::Env::stdlib());
        let mut rules = Vec::with_capacity(config.rules.len());
        let mut names = std::collections::HashSet::new();
        for (i, rule) in config.rules.iter().enumerate() {
            if rule.name.trim().is_empty() {
                return Err(PolicyError::Rule {
                    key: format!("rules[{i}].name"),
                    reason: "must not be empty".into(),
                });
            }
            if !names.insert(rule.name.as_str()) {
                return Err(PolicyError::Rule {
                    key: format!("rules[{i}].name"),
                    reason: format!("another rule is named `{}`", rule.name),
                });
            }
            let when = match &rule.when {
                None => None,
                Some(source) => {
                    let program = env.compile(source).map_err(|error| PolicyError::Rule {
                        key: format!("rules[{i}].when"),
                        reason: format!("not a CEL expression: {error}"),
                    })?;
                    let references = program.references();
                    let reads_args = references.has_variable("args");
                    let reads_principal = references.has_variable("principal");
                    let reads_tool = references.has_variable("tool");
                    // A name other than the three variables fails every evaluation: say so now.
                    if let Err(cel::ExecutionError::UndeclaredReference(name)) =
                        program.execute(&probe(&env))
                    {
                        return Err(PolicyError::Rule {
                            key: format!("rules[{i}].when"),
                            reason: format!(
                                "`{name}` is not known: an expression reads `principal`, `tool` \
                                 and `args`"
                            ),
                        });
                    }
                    if let Err(reason) = check::check(program.expression()) {
                        return Err(PolicyError::Rule { key: format!("rules[{i}].when"), reason });
                    }
                    let args_by_field = variables::selects_args_fields_only(program.expression());
                    let compiled = Compiled::new(program.expression());
                    Some(When {
                        program,
                        compiled,
                        reads_args,
                        args_by_field,
                        reads_principal,
                        reads_tool,
                    })
                }
            };
            rules.push(Rule {
                name: rule.name.as_str().into(),
                effect: rule.effect,
                who: Who::new(
                    &format!("rules[{i}]"),
                    &rule.principals,
                    &rule.roles,
                    &rule.agents,
                    &rule.principal_kinds,
                    &rule.issuers,
                )?,
                tools: rule.tools.clone(),
                when,
                reason: rule.reason.clone(),
            });
        }
        let agents = config
            .agents
            .iter()
            .map(|(id, agent)| {
                (id.clone(), (Arc::from(format!("agents.{id}")), agent.tools.clone()))
            })
            .collect();
        let limits = Limits::new(&config.limits)?;
        let audit = AuditLog::open(&config.audit.target())?;
        let version = {
            let digest = Sha256::digest(format!("{config:?}").as_bytes());
            digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
        };
        let signer = ApprovalSigner::new(&random_key());
        let bindings = bindings(&config)?;
        Ok(Policy {
            config,
            active: true,
            version,
            rules,
            agents,
            env,
            audit,
            limits,
            signer,
            bindings,
            plans: Plans::default(),
        })
    }

    /// Returns the configuration the policy was compiled from.
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// Returns whether a `[policy]` is in force.
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// Returns a digest of the configuration: audit events and approvals name the policy
    /// they were decided by.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Returns the audit log.
    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// Returns how long a call waits for its approval.
    pub fn approval_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.config.approval_timeout_ms)
    }

    /// Returns the approval request of a call of `tool` with `arguments_json` by
    /// `principal`, which `rule` asks for: its id is bound to exactly this call and this
    /// policy version, and expires after `ttl`.
    pub fn approval(
        &self,
        principal: &Principal,
        tool: &str,
        arguments_json: &str,
        rule: &str,
        reason: &str,
        ttl: std::time::Duration,
    ) -> toolmesh_core::Approval {
        let principal = principal.qualified_name();
        self.signer.request(&principal, tool, arguments_json, &self.version, rule, reason, ttl)
    }

    /// Checks that the approval `id` was issued by this policy for exactly this call, and is
    /// still valid.
    pub fn check_approval(
        &self,
        id: &str,
        principal: &Principal,
        tool: &str,
        arguments_json: &str,
    ) -> Result<(), ApprovalMismatch> {
        self.signer.check(id, &principal.qualified_name(), tool, arguments_json, &self.version)
    }

    /// Returns the routing profile `principal` is bound to, if a binding matches it.
    pub fn bound_profile(&self, principal: &Principal) -> Option<&str> {
        self.bindings.iter().find(|(who, _)| who.matches(principal)).map(|(_, p)| p.as_str())
    }

    /// Returns the policy as it applies to `principal`: the rules written for it, and its
    /// agent's tool list.
    pub fn scope(self: &Arc<Self>, principal: Arc<Principal>) -> Scope {
        // The principal's part of the plans' keys; the rest is built only when needed.
        let mut hasher = self.plans.hasher.build_hasher();
        let mut agent_list = None;
        if self.active {
            let id = agent(&principal);
            agent_list = id.and_then(|id| self.agents.get(id)).map(|(name, _)| name.clone());
            hash_principal(&principal, id, &mut hasher);
        }
        Scope {
            policy: self.clone(),
            principal,
            rules: OnceLock::new(),
            agent: agent_list,
            principal_json: OnceLock::new(),
            principal_value: OnceLock::new(),
            principal_hash: hasher,
        }
    }
}

/// A context with every variable, empty, to find names an expression reads that are none of
/// them.
fn probe(env: &Arc<cel::Env>) -> cel::Context<'static, 'static> {
    let mut context = cel::Context::with_env(env.clone());
    context.add_variable_as_val(
        "principal",
        variables::convert(&principal_json(&Principal::anonymous(""))),
    );
    let spec = ToolSpec::new("", "", json!({}), toolmesh_core::ToolSource::local(""));
    context.add_variable_as_val("tool", variables::convert(&tool_json(&spec)));
    context.add_variable_as_val("args", variables::convert(&json!({})));
    context
}

fn random_key() -> [u8; 32] {
    let mut key = [0; 32];
    getrandom::fill(&mut key).expect("the operating system's random source");
    key
}

/// The `[[policy.profiles]]` of `config`, compiled once: whom each binds, and to which
/// profile.
fn bindings(config: &PolicyConfig) -> Result<Vec<(Who, String)>, PolicyError> {
    config
        .profiles
        .iter()
        .enumerate()
        .map(|(i, binding): (usize, &BindingConfig)| {
            let who = Who::new(
                &format!("profiles[{i}]"),
                &binding.principals,
                &binding.roles,
                &binding.agents,
                &binding.principal_kinds,
                &binding.issuers,
            )?;
            Ok((who, binding.profile.clone()))
        })
        .collect()
}

/// What the policy decided for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The call may go ahead; the rule that allowed it (`default` when none matched).
    Allow {
        /// The allowing rule.
        rule: Arc<str>,
    },
    /// The principal may not see the tool: the call is answered as for an unknown tool.
    Hidden {
        /// The rule (or `agents.<id>`, or `default`) that hides it.
        rule: Arc<str>,
    },
    /// The principal sees the tool but may not make this call (its arguments, its
    /// context): `PERMISSION_DENIED`, citing the rule.
    Refused {
        /// The refusing rule.
        rule: Arc<str>,
        /// Why, for the caller.
        reason: String,
    },
    /// The call may go ahead once a person approves it.
    Approve {
        /// The rule that asks for approval.
        rule: Arc<str>,
        /// Why, for the person.
        reason: String,
    },
}

impl Decision {
    /// Returns the decision's name for audit and metrics: `allow`, `hide` or `deny`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Decision::Allow { .. } => "allow",
            Decision::Hidden { .. } => "hide",
            Decision::Refused { .. } => "deny",
            Decision::Approve { .. } => "approve",
        }
    }

    /// Returns the rule that decided.
    pub fn rule(&self) -> &str {
        match self {
            Decision::Allow { rule }
            | Decision::Hidden { rule }
            | Decision::Refused { rule, .. }
            | Decision::Approve { rule, .. } => rule,
        }
    }
}

/// The policy for one principal, for the length of one request.
pub struct Scope {
    policy: Arc<Policy>,
    principal: Arc<Principal>,
    /// Indices of the rules written for this principal, when a plan is made.
    rules: OnceLock<Vec<usize>>,
    /// `agents.<id>` when the principal's agent has a tool list.
    agent: Option<Arc<str>>,
    /// The principal as a condition sees it, when one reads it: as JSON, and converted for
    /// the interpreter.
    principal_json: OnceLock<Json>,
    principal_value: OnceLock<Box<dyn cel::common::value::Val>>,
    /// The hasher of the plans' keys, fed the principal.
    principal_hash: foldhash::fast::FoldHasher<'static>,
}

/// A tool the principal sees ([`Scope::visible`]), with what the rules make of it for the
/// principal: a call of it is decided from here ([`Scope::decide_visible`]).
pub struct Visible {
    /// `None` without a `[policy]`.
    plan: Option<Arc<Plan>>,
}

impl fmt::Debug for Visible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Visible")
            .field("tool", &self.plan.as_ref().map(|plan| &plan.tool.name))
            .finish()
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("principal", &self.principal.name)
            .field("rules", &self.rules.get().map(Vec::len))
            .field("agent", &self.agent)
            .finish()
    }
}

/// What one rule makes of a tool, at discovery or at a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Applies,
    DoesNot,
    /// Only a call can tell (the expression reads `args`).
    Undecided,
}

impl Scope {
    /// Returns the principal.
    pub fn principal(&self) -> &Arc<Principal> {
        &self.principal
    }

    /// Returns the largest arguments a call may carry, in bytes of JSON.
    pub fn max_argument_bytes(&self) -> Option<usize> {
        self.policy.limits.max_argument_bytes()
    }

    /// Returns the largest result `spec` may return, and whether a larger one is cut.
    pub fn result_limit(&self, spec: &ToolSpec) -> Option<ResultLimit> {
        self.policy.limits.result_limit(spec)
    }

    /// Admits a call of `spec` under the rate and concurrency limits: the permit holds the
    /// principal's slot until it drops.
    pub fn admit(&self, spec: &ToolSpec) -> Result<Permit, LimitError> {
        self.policy.limits.admit(&self.principal, spec)
    }

    /// Returns the policy.
    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    /// Returns whether the principal may see `spec`: it is listed, counted, described and
    /// returned by searches only then. A tool is seen unless the agent's list leaves it
    /// out or a `deny` rule that does not read the arguments matches it; and then only when
    /// an `allow` rule may match it or the default allows.
    pub fn sees(&self, spec: &ToolSpec) -> bool {
        self.hidden_by(spec).is_none()
    }

    /// Returns the rule that hides `spec` from the principal (`agents.<id>` for an agent's
    /// tool list, `default` for the default); `None` when the principal sees it.
    pub fn hidden_by(&self, spec: &ToolSpec) -> Option<Arc<str>> {
        self.visible(spec).err()
    }

    /// Returns `spec` as the principal sees it, ready for deciding a call of it; `Err` is
    /// the rule that hides it, as [`Scope::hidden_by`].
    pub fn visible(&self, spec: &ToolSpec) -> Result<Visible, Arc<str>> {
        if !self.policy.active {
            return Ok(Visible { plan: None });
        }
        let plan = self.plan(spec);
        match &plan.hidden {
            Some(rule) => Err(rule.clone()),
            None => Ok(Visible { plan: Some(plan) }),
        }
    }

    /// Decides a call of `spec` with `arguments`: deny wins; a tool the principal does not
    /// see is [`Decision::Hidden`]; one it sees but may not call so is
    /// [`Decision::Refused`].
    pub fn decide(&self, spec: &ToolSpec, arguments: &Json) -> Decision {
        match self.visible(spec) {
            Err(rule) => Decision::Hidden { rule },
            Ok(visible) => self.decide_visible(&visible, spec, arguments),
        }
    }

    /// Decides a call of `spec`, which the principal sees as `visible`, with `arguments`:
    /// [`Decision::Allow`], [`Decision::Refused`] or [`Decision::Approve`]. Only the
    /// conditions that read the arguments are evaluated; the plan of the tool holds the
    /// others.
    pub fn decide_visible(&self, visible: &Visible, spec: &ToolSpec, arguments: &Json) -> Decision {
        let Some(plan) = &visible.plan else {
            return Decision::Allow { rule: default_rule() };
        };
        debug_assert!(plan.tool.is(spec), "`visible` is of another tool than {}", spec.name);
        let tool = ToolVariable::default();
        let converted = OnceCell::new();
        let mut allowed: Option<&Rule> = None;
        let mut refused: Option<(&Rule, Option<String>)> = None;
        let mut approval: Option<&Rule> = None;
        for step in &plan.steps {
            let rule = &self.policy.rules[step.rule];
            let outcome = match (step.decided, &rule.when) {
                (Some(true), _) => Evaluated::True,
                (Some(false), _) | (None, None) => Evaluated::False,
                (None, Some(when)) => {
                    let args = match arguments {
                        Json::Object(fields) if when.args_by_field => Args::Fields(fields),
                        _ => Args::Converted(
                            converted.get_or_init(|| variables::convert(arguments)).as_ref(),
                        ),
                    };
                    self.run(when, spec, &tool, args)
                }
            };
            match (rule.effect, outcome) {
                (Effect::Deny, Evaluated::True) => {
                    refused.get_or_insert((rule, None));
                }
                (Effect::Deny, Evaluated::Failed(error)) => {
                    // A deny rule that cannot be evaluated refuses: policy fails closed.
                    refused.get_or_insert((rule, Some(error)));
                }
                (Effect::Allow, Evaluated::True) => {
                    allowed.get_or_insert(rule);
                }
                // A condition that cannot be evaluated asks for approval: fails closed.
                (Effect::Approve, Evaluated::True | Evaluated::Failed(_)) => {
                    approval.get_or_insert(rule);
                }
                _ => {}
            }
        }
        if let Some((rule, error)) = refused {
            let reason = match (&rule.reason, error) {
                (_, Some(error)) => format!("its condition could not be evaluated: {error}"),
                (Some(reason), None) => reason.clone(),
                (None, None) => "the call's arguments are not allowed".to_owned(),
            };
            return Decision::Refused { rule: rule.name.clone(), reason };
        }
        if let Some(rule) = approval {
            let reason = rule.reason.clone().unwrap_or_else(|| {
                format!("policy rule {} asks a person to approve this call", rule.name)
            });
            return Decision::Approve { rule: rule.name.clone(), reason };
        }
        match (allowed, self.policy.config.default) {
            (Some(rule), _) => Decision::Allow { rule: rule.name.clone() },
            (None, Effect::Allow) => Decision::Allow { rule: default_rule() },
            (None, Effect::Approve) => Decision::Approve {
                rule: default_rule(),
                reason: "every call not allowed by a rule needs a person's approval".into(),
            },
            (None, Effect::Deny) => Decision::Refused {
                rule: default_rule(),
                reason: "no rule allows the call with these arguments".into(),
            },
        }
    }

    /// Returns the plan of `spec` for this principal from the policy's cache, or made now.
    fn plan(&self, spec: &ToolSpec) -> Arc<Plan> {
        let plans = &self.policy.plans;
        let mut hasher = self.principal_hash.clone();
        ToolKey::hash(spec, &mut hasher);
        let key = hasher.finish();
        let found = plans.map.read().unwrap_or_else(PoisonError::into_inner).get(&key).cloned();
        // An API key's principal is shared by its requests: then one pointer says it.
        if let Some(plan) = found
            && plan.tool.is(spec)
            && (Arc::ptr_eq(&plan.principal, &self.principal)
                || same_principal(&plan.principal, &self.principal))
        {
            return plan;
        }
        let plan = Arc::new(self.make_plan(spec));
        let mut map = plans.map.write().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= MAX_PLANS {
            map.clear();
        }
        map.insert(key, plan.clone());
        plan
    }

    /// Works out what the rules make of `spec` for this principal without arguments.
    fn make_plan(&self, spec: &ToolSpec) -> Plan {
        let tool = ToolVariable::default();
        let mut steps = Vec::new();
        let mut hidden = None;
        let mut allowed = false;
        if let Some(agent) = &self.agent
            && !self.agent_lists(spec)
        {
            hidden = Some(agent.clone());
        }
        for (index, rule) in self.matching(spec) {
            let outcome = self.evaluate(rule, spec, &tool);
            match (rule.effect, outcome) {
                (Effect::Deny, Outcome::Applies) => {
                    hidden.get_or_insert_with(|| rule.name.clone());
                }
                (Effect::Allow | Effect::Approve, Outcome::Applies | Outcome::Undecided) => {
                    allowed = true;
                }
                _ => {}
            }
            let decided = match outcome {
                Outcome::Undecided => None,
                outcome => Some(Evaluated::from(outcome).is_true()),
            };
            steps.push(Step { rule: index, decided });
        }
        if hidden.is_none() && !allowed && self.policy.config.default == Effect::Deny {
            hidden = Some(default_rule());
        }
        Plan { principal: self.principal.clone(), tool: ToolKey::of(spec), hidden, steps }
    }

    fn agent_lists(&self, spec: &ToolSpec) -> bool {
        let Some(id) = agent(&self.principal) else { return true };
        self.policy.agents.get(id).is_none_or(|(_, tools)| tools.iter().any(|s| s.selects(spec)))
    }

    /// The rules written for this principal that select `spec`, with their indices.
    fn matching<'a>(&'a self, spec: &'a ToolSpec) -> impl Iterator<Item = (usize, &'a Rule)> + 'a {
        let rules = self.rules.get_or_init(|| {
            let policy = &self.policy;
            (0..policy.rules.len())
                .filter(|&i| policy.rules[i].who.matches(&self.principal))
                .collect()
        });
        rules.iter().map(|&i| (i, &self.policy.rules[i])).filter(move |(_, rule)| {
            rule.tools.is_empty() || rule.tools.iter().any(|s| s.selects(spec))
        })
    }

    /// What `rule`'s condition makes of `spec` without the arguments.
    fn evaluate(&self, rule: &Rule, spec: &ToolSpec, tool: &ToolVariable) -> Outcome {
        match &rule.when {
            None => Outcome::Applies,
            Some(when) if when.reads_args => Outcome::Undecided,
            Some(when) => match self.run(when, spec, tool, Args::Unbound) {
                Evaluated::True => Outcome::Applies,
                Evaluated::False => Outcome::DoesNot,
                // Unevaluable: a deny rule applies (fail closed), an allow rule does not.
                Evaluated::Failed(_) => match rule.effect {
                    Effect::Deny | Effect::Approve => Outcome::Applies,
                    Effect::Allow => Outcome::DoesNot,
                },
            },
        }
    }

    fn run(&self, when: &When, spec: &ToolSpec, tool: &ToolVariable, args: Args<'_>) -> Evaluated {
        let principal = when
            .reads_principal
            .then(|| self.principal_json.get_or_init(|| principal_json(&self.principal)));
        let tool_json = when.reads_tool.then(|| tool.json.get_or_init(|| tool_json(spec)));
        if let Some(compiled) = &when.compiled {
            let args = match args {
                Args::Unbound => None,
                Args::Fields(fields) => Some(fields),
                // Arguments that are not an object: the interpreter reports it.
                Args::Converted(_) => {
                    return self.interpret(when, principal, tool_json, tool, args);
                }
            };
            let roots = Roots { principal, tool: tool_json, args };
            match compiled.evaluate(&roots) {
                Some(true) => return Evaluated::True,
                Some(false) => return Evaluated::False,
                None => {}
            }
        }
        self.interpret(when, principal, tool_json, tool, args)
    }

    /// Evaluates `when` with the `cel` crate's interpreter.
    fn interpret(
        &self,
        when: &When,
        principal: Option<&Json>,
        tool_json: Option<&Json>,
        tool: &ToolVariable,
        args: Args<'_>,
    ) -> Evaluated {
        let principal =
            principal.map(|json| &**self.principal_value.get_or_init(|| variables::convert(json)));
        let tool = tool_json.map(|json| &**tool.value.get_or_init(|| variables::convert(json)));
        let variables = Variables { principal, tool, args };
        let mut context = cel::Context::with_env(self.policy.env.clone());
        context.set_variable_resolver(&variables);
        match cel::Value::resolve_val(when.program.expression(), &context) {
            Ok(value) => match value.downcast_ref::<CelBool>() {
                Some(value) if *value.inner() => Evaluated::True,
                Some(_) => Evaluated::False,
                None => Evaluated::Failed(format!(
                    "the expression gave {}, not a boolean",
                    value.get_type().name()
                )),
            },
            Err(error) => Evaluated::Failed(error.to_string()),
        }
    }
}

/// The tool as a condition sees it, built when one reads it: as JSON, and converted for the
/// interpreter.
#[derive(Default)]
struct ToolVariable {
    json: OnceCell<Json>,
    value: OnceCell<Box<dyn Val>>,
}

enum Evaluated {
    True,
    False,
    Failed(String),
}

impl Evaluated {
    fn is_true(&self) -> bool {
        matches!(self, Evaluated::True)
    }
}

impl From<Outcome> for Evaluated {
    fn from(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Applies => Evaluated::True,
            Outcome::DoesNot | Outcome::Undecided => Evaluated::False,
        }
    }
}

fn principal_json(principal: &Principal) -> Json {
    json!({
        "name": principal.name,
        "kind": principal.kind.as_str(),
        "issuer": principal.issuer.as_deref().unwrap_or_default(),
        "roles": principal.roles,
        "attributes": principal.attributes,
    })
}

/// The `tool` of a condition; its `annotations` are the hints toolmesh trusts
/// ([`ToolSpec::hints`]), unknown ones at their cautious value.
fn tool_json(spec: &ToolSpec) -> Json {
    let a = spec.hints();
    json!({
        "name": spec.name,
        "source": spec.source.name,
        "kind": spec.source.kind.as_str(),
        "toolkit": spec.toolkit.as_deref().unwrap_or_default(),
        "tags": spec.tags,
        "annotations": {
            "read_only": a.read_only.unwrap_or(false),
            "destructive": a.destructive.unwrap_or(true),
            "idempotent": a.idempotent.unwrap_or(false),
            "open_world": a.open_world.unwrap_or(true),
        },
    })
}
