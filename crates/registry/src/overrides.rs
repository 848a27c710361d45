//! What the operator states about tools, over what their sources say: applied to each tool
//! as it joins the catalog.

use toolmesh_config::Selector;
use toolmesh_core::{ToolAnnotations, Toolkit};
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

/// One `[[catalog.toolkits]]`: a toolkit the operator declares, or the description and
/// instructions of a source's toolkit of that name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolkitOverride {
    /// The toolkit's name.
    pub name: String,
    /// What the toolkit is for, over its source's.
    pub description: Option<String>,
    /// How a model should use its tools together, over its source's.
    pub instructions: Option<String>,
    /// The tools it gathers, as their source publishes them: any tool one selects that is
    /// in no other toolkit (a tool of an MCP server's own toolkit joins this one instead).
    pub select: Vec<Selector>,
}

/// Every `[[catalog.tools]]` and `[[catalog.toolkits]]`, in the order written: where two
/// set one field of a tool, the later wins; a tool two toolkits select joins the first.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Overrides {
    /// `[[catalog.tools]]`.
    pub tools: Vec<ToolOverride>,
    /// `[[catalog.toolkits]]`.
    pub toolkits: Vec<ToolkitOverride>,
}

impl Overrides {
    /// Returns the `[[catalog.toolkits]]` named `name`.
    pub fn toolkit(&self, name: &str) -> Option<&ToolkitOverride> {
        self.toolkits.iter().find(|kit| kit.name == name)
    }

    /// Returns `toolkit` with the description and instructions the operator states for it.
    pub(crate) fn toolkit_over(&self, mut toolkit: Toolkit) -> Toolkit {
        if let Some(stated) = self.toolkit(&toolkit.name) {
            if let Some(description) = &stated.description {
                toolkit.description.clone_from(description);
            }
            if let Some(instructions) = &stated.instructions {
                toolkit.instructions.clone_from(instructions);
            }
        }
        toolkit
    }

    /// Returns `entry` with what the overrides that select it state, or `None` when one
    /// hides it. A tool in no toolkit joins the first `[[catalog.toolkits]]` that selects it.
    pub(crate) fn apply(&self, mut entry: ToolEntry) -> Option<ToolEntry> {
        let joins = match entry.spec.toolkit {
            Some(_) => None,
            None => self
                .toolkits
                .iter()
                .find(|kit| kit.select.iter().any(|s| s.selects(&entry.spec)))
                .map(|kit| kit.name.clone()),
        };
        let selected: Vec<&ToolOverride> = self
            .tools
            .iter()
            .filter(|o| o.select.as_ref().is_some_and(|s| s.selects(&entry.spec)))
            .collect();
        let spec = &mut entry.spec;
        if joins.is_some() {
            spec.toolkit = joins;
        }
        if selected.is_empty() {
            return Some(entry);
        }
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
        let tools = vec![
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
        ];
        let overrides = Overrides { tools, toolkits: vec![] };
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

    #[test]
    fn a_tool_in_no_toolkit_joins_the_first_toolkit_that_selects_it() {
        let kit = |name: &str, select: &[&str]| ToolkitOverride {
            name: name.into(),
            select: select.iter().map(|s| Selector::parse(s).unwrap()).collect(),
            ..ToolkitOverride::default()
        };
        let overrides = Overrides {
            tools: vec![],
            toolkits: vec![kit("repos", &["gh_*_repo"]), kit("github", &["source:gh"])],
        };
        let spec = |name: &str| overrides.apply(mcp_tool(name)).unwrap().spec;
        assert_eq!(spec("gh_delete_repo").toolkit.as_deref(), Some("repos"));
        assert_eq!(spec("gh_list_issues").toolkit.as_deref(), Some("github"));
        let mut member = mcp_tool("gh_delete_repo");
        member.spec.toolkit = Some("admin".into());
        let kept = overrides.apply(member).unwrap().spec;
        assert_eq!(kept.toolkit.as_deref(), Some("admin"), "toolkits do not nest");
    }
}
