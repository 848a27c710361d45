//! The admission step of the call path: may this call, through this door, reach this tool?
//!
//! Two sets of rules decide. The routing profiles': a call that names a profile reaches
//! only the tools that profile shows its model (the meta-tools and the exposed tools);
//! `callTool` reaches the profile's pool besides. And the tool policy's (`[policy]`): a
//! principal never sees a tool it may not see, and a call it may not make is refused —
//! as an unknown tool when the tool is hidden from it, with `PERMISSION_DENIED` citing the
//! rule when only these arguments are refused. The policy also binds principals to
//! routing profiles.

use std::{collections::BTreeMap, sync::Arc};

use toolmesh_config::Selector;
use toolmesh_core::{CallFailure, ECHO_CHARS, ErrorCode, Principal, ToolSpec, clip};
use toolmesh_policy::{Policy, Scope};

use crate::{DEFAULT_PROFILE, ProfileConfig, RouterError, RoutingConfig};

/// The name of the search meta-tool.
pub const SEARCH_TOOLS: &str = "searchTools";
/// The name of the call meta-tool.
pub const CALL_TOOL: &str = "callTool";
/// The source the meta-tools belong to.
pub const META_SOURCE: &str = "meta";

/// Returns whether `spec` is one of the meta-tools.
pub fn is_meta(spec: &ToolSpec) -> bool {
    spec.source.name == META_SOURCE && matches!(spec.name.as_str(), SEARCH_TOOLS | CALL_TOOL)
}

/// How a call reached the tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// `CallTool` or `StreamCallTool` named it.
    Direct,
    /// `callTool` named it, with what its `searchToken` shows.
    CallTool(Searched),
}

/// What the `searchToken` given to `callTool` shows of the tool called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Searched {
    /// A search of this session and profile returned it.
    Returned,
    /// No token was given.
    NoToken,
    /// The token has expired.
    Expired,
    /// The token is not one that searchTools signed.
    Invalid,
    /// The token belongs to another session or profile.
    Elsewhere,
    /// That search did not return the tool.
    NotReturned,
}

/// The routing profiles, the tool policy, and the rules over them. Cheap to share.
#[derive(Debug, Clone)]
pub struct Admission {
    profiles: BTreeMap<String, ProfileConfig>,
    policy: Arc<Policy>,
}

impl Admission {
    /// Returns the admission of `routing`'s profiles (always with a `default` one) under
    /// `policy`.
    pub fn new(routing: &RoutingConfig, policy: Arc<Policy>) -> Self {
        let mut profiles = routing.profiles.clone();
        profiles.entry(DEFAULT_PROFILE.to_owned()).or_default();
        Admission { profiles, policy }
    }

    /// Returns the admission of `routing`'s profiles without a tool policy.
    pub fn open(routing: &RoutingConfig) -> Self {
        Self::new(routing, Arc::new(Policy::open()))
    }

    /// Returns the tool policy.
    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    /// Returns the policy as it applies to `principal`.
    pub fn scope(&self, principal: Arc<Principal>) -> Scope {
        self.policy.scope(principal)
    }

    /// Returns the routing profile a request of `principal` that names `requested` runs
    /// in: the profile the policy binds the principal to (a request may name it or none,
    /// `PERMISSION_DENIED` for another), else the one requested.
    pub fn profile_of(
        &self,
        principal: &Principal,
        requested: &str,
    ) -> Result<String, RouterError> {
        match self.policy.bound_profile(principal) {
            None => Ok(requested.to_owned()),
            Some(bound) if requested.is_empty() || requested == bound => Ok(bound.to_owned()),
            Some(bound) => Err(refusal(
                ErrorCode::PermissionDenied,
                "profile_bound",
                format!(
                    "principal {} uses routing profile {bound}; a request may not name another \
                     (it named {})",
                    principal.name,
                    clip(requested, ECHO_CHARS)
                ),
            )),
        }
    }

    /// Returns the profile named `name` (`default` when empty), with its name.
    pub fn profile(&self, name: &str) -> Result<(&str, &ProfileConfig), RouterError> {
        let name = if name.is_empty() { DEFAULT_PROFILE } else { name };
        match self.profiles.get_key_value(name) {
            Some((name, profile)) => Ok((name.as_str(), profile)),
            None => Err(RouterError::InvalidRequest {
                field: "profile",
                reason: format!(
                    "no routing profile `{}` (configured: {})",
                    clip(name, ECHO_CHARS),
                    self.profiles.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            }),
        }
    }

    /// Returns the profile a request names; `None` when it names none.
    pub fn named(&self, name: &str) -> Result<Option<&ProfileConfig>, RouterError> {
        match name {
            "" => Ok(None),
            name => self.profile(name).map(|(_, profile)| Some(profile)),
        }
    }

    /// Returns whether a model of `profile` sees `spec` without searching: a meta-tool or
    /// an exposed tool.
    pub fn visible(profile: &ProfileConfig, spec: &ToolSpec) -> bool {
        is_meta(spec) || selects(&profile.expose, spec)
    }

    /// Returns whether `spec` is in `profile`'s pool (never a meta-tool).
    pub fn in_pool(profile: &ProfileConfig, spec: &ToolSpec) -> bool {
        !is_meta(spec) && selects(&profile.pool, spec)
    }

    /// Decides whether a call of `profile_name` through `door` reaches `spec`.
    ///
    /// - Directly, a call that names no profile reaches every tool; one that names a
    ///   profile reaches only what the profile shows (`FAILED_PRECONDITION`: search for
    ///   it and call it with callTool).
    /// - Through callTool, the profile's visible tools and its pool, never a meta-tool;
    ///   anything else is not there (`NOT_FOUND`). With `enforce_search_before_call`, a
    ///   pool tool only when the search of the given token returned it
    ///   (`FAILED_PRECONDITION` otherwise, saying why).
    pub fn admit(
        &self,
        profile_name: &str,
        door: Door,
        spec: &ToolSpec,
    ) -> Result<(), RouterError> {
        match door {
            Door::Direct => {
                let Some(profile) = self.named(profile_name)? else { return Ok(()) };
                if Self::visible(profile, spec) {
                    return Ok(());
                }
                Err(refusal(
                    ErrorCode::FailedPrecondition,
                    "not_visible",
                    format!(
                        "tool {} is not visible in routing profile {profile_name}: find it with \
                         searchTools and call it with callTool",
                        spec.name
                    ),
                ))
            }
            Door::CallTool(searched) => {
                let (name, profile) = self.profile(profile_name)?;
                if is_meta(spec) {
                    return Err(refusal(
                        ErrorCode::InvalidArgument,
                        "invalid_request",
                        format!("callTool cannot call {}: call the meta-tools directly", spec.name),
                    ));
                }
                if Self::visible(profile, spec) {
                    return Ok(());
                }
                if !Self::in_pool(profile, spec) {
                    return Err(refusal(
                        ErrorCode::NotFound,
                        "tool_not_found",
                        format!("tool {} is not available in routing profile {name}", spec.name),
                    ));
                }
                if !profile.enforce_search_before_call || searched == Searched::Returned {
                    return Ok(());
                }
                let why = match searched {
                    Searched::NoToken => "no searchToken was given".to_owned(),
                    Searched::Expired => "the searchToken has expired".to_owned(),
                    Searched::Invalid => {
                        "the searchToken is not one that searchTools returned".to_owned()
                    }
                    Searched::Elsewhere => {
                        "the searchToken belongs to another session or profile".to_owned()
                    }
                    Searched::NotReturned | Searched::Returned => {
                        format!("that search did not return {}", spec.name)
                    }
                };
                Err(refusal(
                    ErrorCode::FailedPrecondition,
                    "search_required",
                    format!(
                        "callTool can only call a tool that searchTools returned in this session, \
                         and {why}. Call searchTools with what you want to do first, then callTool \
                         with one of the tools it returns and its searchToken."
                    ),
                ))
            }
        }
    }
}

fn refusal(code: ErrorCode, kind: &'static str, message: String) -> RouterError {
    RouterError::Refused(Box::new(CallFailure::new(code, kind, message)))
}

fn selects(selectors: &[Selector], spec: &ToolSpec) -> bool {
    selectors.iter().any(|selector| selector.selects(spec))
}
