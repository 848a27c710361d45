//! What one caller sees of the catalog: the tools of its routing profile that policy lets
//! it see, with `searchTools` described as that caller reads it. `ListTools` and the MCP
//! endpoint's `tools/list` list through it.

use std::{sync::Arc, time::Instant};

use toolmesh_core::{Principal, ToolSpec};
use toolmesh_meta::MetaTools;
use toolmesh_policy::Scope;
use toolmesh_registry::Catalog;
use toolmesh_router::{Admission, Hidden, ProfileConfig, Router, RouterError, is_meta};

/// The catalog as one principal sees it under one profile, at one moment.
pub(crate) struct View {
    admission: Arc<Admission>,
    profile_name: String,
    profile: Option<ProfileConfig>,
    hidden: Hidden,
    scope: Scope,
    pub(crate) catalog: Arc<Catalog>,
    started: Instant,
}

impl View {
    /// Returns what `principal` sees under the profile it asked for (`requested`, empty for
    /// its own), or why it may not use that profile.
    pub(crate) fn new(
        router: &Router,
        principal: Arc<Principal>,
        requested: &str,
    ) -> Result<Self, RouterError> {
        let admission = router.admission();
        let profile_name = admission.profile_of(&principal, requested)?;
        let profile = admission.named(&profile_name)?.cloned();
        let hidden = Hidden::new(principal.clone());
        let scope = admission.scope(principal);
        Ok(View {
            catalog: router.registry().snapshot(),
            admission,
            profile_name,
            profile,
            hidden,
            scope,
            started: Instant::now(),
        })
    }

    /// Returns whether the caller sees `spec`; a tool policy hides is counted for the audit.
    pub(crate) fn shows(&self, spec: &ToolSpec) -> bool {
        self.profile.as_ref().is_none_or(|profile| Admission::visible(profile, spec))
            && (is_meta(spec) || self.hidden.note(&spec.name, self.scope.hidden_by(spec)))
    }

    /// Returns whether the caller sees `spec`, without counting it.
    pub(crate) fn sees(&self, spec: &ToolSpec) -> bool {
        self.profile.as_ref().is_none_or(|profile| Admission::visible(profile, spec))
            && (is_meta(spec) || self.scope.hidden_by(spec).is_none())
    }

    /// Returns `spec`'s description as this caller reads it, where it differs from its own
    /// (`searchTools` describes this profile's pool, as the caller may see it).
    pub(crate) fn description(&self, meta: &MetaTools, spec: &ToolSpec) -> Option<String> {
        meta.description_of(spec, &self.profile_name, &self.catalog, &self.scope)
    }

    /// Audits the tools policy hid from this listing, as `rpc`.
    pub(crate) fn audit(&self, rpc: &str) {
        self.hidden.audit(&self.admission, rpc, self.started);
    }
}
