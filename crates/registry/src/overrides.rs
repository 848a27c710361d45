//! What the operator states about tools, over what their sources say: applied to each tool
//! as it joins the catalog.

use toolmesh_config::Selector;
use toolmesh_core::ToolAnnotations;
use tracing::debug;

use crate::ToolEntry;

/// One `[[catalog.tools]]`: fields that replace a tool's own, for the tools `select` picks.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolOverride {
    /// The tools it applies to, as their source publishes them.
    pub select: Option<Selector>,
    /// The catalog name instead of the source's (only for a selector of one name); the
    /// source is still called by its own.
    pub name: Option<String>,
    /// The title.
    pub title: Option<String>,
    /// The description a model reads.
    pub description: Option<String>,
    /// Hints the operator vouches for. They are acted on (retries, policy) whatever the
    /// source's trust; a hint left unset here stays the source's where its annotations are
    /// trusted, and is unknown where they are not.
    pub annotations: Option<ToolAnnotations>,
    /// Keeps the tools out of the catalog: neither listed, searched nor callable.
    pub hidden: bool,
}

/// Every `[[catalog.tools]]`, in the order written: where two set one field, the later wins.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Overrides(pub Vec<ToolOverride>);

impl Overrides {
    /// Returns `entry` with what the overrides that select it state, or `None` when one
    /// hides it.
    pub(crate) fn apply(&self, mut entry: ToolEntry) -> Option<ToolEntry> {
        let selected: Vec<&ToolOverride> = self
            .0
            .iter()
            .filter(|o| o.select.as_ref().is_some_and(|s| s.selects(&entry.spec)))
            .collect();
        if selected.is_empty() {
            return Some(entry);
        }
        let spec = &mut entry.spec;
        if selected.iter().any(|o| o.hidden) {
            debug!(tool = %spec.name, source = %spec.source, "tool hidden by [[catalog.tools]]");
            return None;
        }
        for o in selected {
            if let Some(name) = &o.name {
                spec.upstream_name.get_or_insert_with(|| spec.name.clone());
                spec.name.clone_from(name);
            }
            if let Some(title) = &o.title {
                spec.title.clone_from(title);
            }
            if let Some(description) = &o.description {
                spec.description.clone_from(description);
            }
            if let Some(stated) = o.annotations {
                let mut hints = spec.hints();
                for (mine, theirs) in [
                    (&mut hints.read_only, stated.read_only),
                    (&mut hints.destructive, stated.destructive),
                    (&mut hints.idempotent, stated.idempotent),
                    (&mut hints.open_world, stated.open_world),
                ] {
                    *mine = theirs.or(*mine);
                }
                spec.annotations = hints;
                spec.annotations_trusted = true;
            }
        }
        Some(entry)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

    use std::sync::Arc;

    use serde_json::{Value, json};
    use toolmesh_core::{
        Backend, BackendError, CallContext, SourceKind, ToolOutput, ToolSource, ToolSpec,
    };

    use super::*;

    struct Nop;

    #[async_trait::async_trait]
    impl Backend for Nop {
        async fn call(&self, _: CallContext, _: Value) -> Result<ToolOutput, BackendError> {
            Ok(ToolOutput::default())
        }
    }

    fn mcp_tool(name: &str) -> ToolEntry {
        let source = ToolSource { kind: SourceKind::Mcp, name: "gh".into() };
        let mut spec = ToolSpec::new(name, "theirs", json!({"type": "object"}), source);
        spec.annotations.read_only = Some(true);
        spec.annotations.destructive = Some(false);
        spec.annotations_trusted = false;
        ToolEntry::new(spec, Arc::new(Nop)).unwrap()
    }

    fn select(text: &str) -> Option<Selector> {
        Some(Selector::parse(text).unwrap())
    }

    #[test]
    fn overrides_rename_describe_vouch_and_hide() {
        let overrides = Overrides(vec![
            ToolOverride {
                select: select("gh_delete"),
                name: Some("delete_repository".into()),
                description: Some("Deletes a repository for good.".into()),
                annotations: Some(ToolAnnotations {
                    destructive: Some(true),
                    ..ToolAnnotations::default()
                }),
                ..ToolOverride::default()
            },
            ToolOverride {
                select: select("source:gh"),
                title: Some("GitHub".into()),
                ..Default::default()
            },
            ToolOverride { select: select("gh_admin_*"), hidden: true, ..Default::default() },
        ]);
        let spec = overrides.apply(mcp_tool("gh_delete")).unwrap().spec;
        assert_eq!(spec.name, "delete_repository");
        assert_eq!(spec.upstream_name.as_deref(), Some("gh_delete"));
        assert_eq!(
            (spec.title.as_str(), spec.description.as_str()),
            ("GitHub", "Deletes a repository for good.")
        );
        // The operator's hint counts; the untrusted server's claim of read-only does not.
        assert!(spec.annotations_trusted);
        assert_eq!(spec.hints(), ToolAnnotations { destructive: Some(true), ..Default::default() });

        let other = overrides.apply(mcp_tool("gh_list")).unwrap().spec;
        assert_eq!((other.name.as_str(), other.title.as_str()), ("gh_list", "GitHub"));
        assert!(!other.annotations_trusted, "no hint stated, the server's stay untrusted");
        assert!(overrides.apply(mcp_tool("gh_admin_purge")).is_none());
    }
}
