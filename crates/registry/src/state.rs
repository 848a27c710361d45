use std::{
    collections::{BTreeSet, HashSet},
    sync::Arc,
};

use toolmesh_core::{ToolSource, Toolkit};
use tracing::warn;

use crate::{Catalog, Registered, RegistryError, SourceUpdate, ToolEntry, catalog::RegisteredKit};

/// The [`RegistryActor`](crate::RegistryActor)'s state: the catalog being edited. Every operation works on a copy and
/// commits it only when the whole operation succeeds, so a rejected request changes nothing.
#[derive(Debug, Default)]
pub struct RegistryState {
    /// The committed catalog, shared with the published snapshot rather than copied.
    catalog: Arc<Catalog>,
}

impl RegistryState {
    pub(crate) fn from_catalog(catalog: Arc<Catalog>) -> Self {
        RegistryState { catalog }
    }

    pub(crate) fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// Sets the overrides the tools that join from now on get, and lists the toolkits they
    /// declare; the catalog's version stays.
    pub(crate) fn set_overrides(&mut self, overrides: crate::Overrides) {
        let mut next = Catalog::clone(&self.catalog);
        let names: BTreeSet<String> = (next.overrides.toolkits.iter())
            .chain(&overrides.toolkits)
            .map(|kit| kit.name.clone())
            .collect();
        next.overrides = Arc::new(overrides);
        for name in names {
            next.relist_toolkit(&name);
        }
        self.catalog = Arc::new(next);
    }

    pub(crate) fn register(&mut self, tool: ToolEntry) -> Result<Registered, RegistryError> {
        let mut next = Catalog::clone(&self.catalog);
        not_nested(&tool)?;
        let Some(tool) = next.overrides.apply(tool) else { return Ok(Registered::Hidden) };
        let outcome = insert_standalone(&mut next, tool)?;
        self.commit(next);
        Ok(outcome)
    }

    pub(crate) fn register_toolkit(
        &mut self,
        toolkit: Toolkit,
        tools: Vec<ToolEntry>,
    ) -> Result<(), RegistryError> {
        let mut next = Catalog::clone(&self.catalog);
        let source = tools
            .first()
            .map_or_else(|| ToolSource::local(&toolkit.name), |t| t.spec.source.clone());
        insert_toolkit(&mut next, &source, toolkit, tools)?;
        self.commit(next);
        Ok(())
    }

    pub(crate) fn replace_source(&mut self, update: SourceUpdate) -> Result<(), RegistryError> {
        // Unchanged tools stay where they are, the same entries: a source of thousands of
        // tools of which one changed costs a catalog copy, not thousands of re-insertions.
        let unchanged: HashSet<&str> = update
            .unchanged
            .iter()
            .map(String::as_str)
            .filter(|name| {
                self.catalog.get(name).is_some_and(|t| {
                    t.spec.source == update.source && self.catalog.in_whole_toolkit(t).is_none()
                })
            })
            .collect();
        {
            let mut seen = HashSet::new();
            let names = update
                .tools
                .iter()
                .chain(update.toolkits.iter().flat_map(|(_, tools)| tools))
                .map(|t| t.spec.name.as_str());
            for name in names {
                if unchanged.contains(name) || !seen.insert(name) {
                    return Err(RegistryError::Duplicate(name.to_owned()));
                }
            }
        }
        let mut next = Catalog::clone(&self.catalog);
        remove_source(&mut next, &update.source, &unchanged);
        for (toolkit, mut tools) in update.toolkits {
            for tool in &mut tools {
                tool.spec.source = update.source.clone();
            }
            insert_toolkit(&mut next, &update.source, toolkit, tools)?;
        }
        let own = update.toolkit.and_then(|kit| own_toolkit(&mut next, &update.source, kit));
        for mut tool in update.tools {
            tool.spec.source = update.source.clone();
            not_nested(&tool)?;
            if let Some(mut tool) = next.overrides.apply(tool) {
                if tool.spec.toolkit.is_none() {
                    tool.spec.toolkit.clone_from(&own);
                }
                insert_standalone(&mut next, tool)?;
            }
        }
        self.commit(next);
        Ok(())
    }

    fn commit(&mut self, mut next: Catalog) {
        next.version = self.catalog.version + 1;
        self.catalog = Arc::new(next);
    }
}

/// A standalone tool comes in no toolkit of its source's choosing.
fn not_nested(tool: &ToolEntry) -> Result<(), RegistryError> {
    match &tool.spec.toolkit {
        Some(toolkit) => {
            Err(RegistryError::Nested { tool: tool.spec.name.clone(), toolkit: toolkit.clone() })
        }
        None => Ok(()),
    }
}

/// Registers `toolkit` as the toolkit of `source` that its standalone tools join; returns
/// its name, or `None` when another source's toolkit has it.
fn own_toolkit(catalog: &mut Catalog, source: &ToolSource, toolkit: Toolkit) -> Option<String> {
    let name = toolkit.name.clone();
    if let Some(other) = catalog.registered.get(&name).filter(|kit| kit.source != *source) {
        warn!(
            toolkit = %name,
            source = %source,
            other = %other.source,
            "a toolkit of this name belongs to another source; the tools join none"
        );
        return None;
    }
    let toolkit = Arc::new(toolkit);
    let kit = RegisteredKit { source: source.clone(), toolkit, whole: false };
    catalog.registered.insert(name.clone(), kit);
    catalog.relist_toolkit(&name);
    Some(name)
}

fn insert_standalone(catalog: &mut Catalog, tool: ToolEntry) -> Result<Registered, RegistryError> {
    let name = tool.spec.name.clone();
    let outcome = match catalog.get(&name) {
        None => Registered::Added,
        Some(existing) => {
            if let Some(toolkit) = catalog.in_whole_toolkit(existing) {
                return Err(RegistryError::MemberOfToolkit {
                    tool: name,
                    toolkit: toolkit.to_owned(),
                });
            }
            warn!(
                tool = %name,
                previous = %existing.spec.source,
                replacement = %tool.spec.source,
                "tool registered under a taken name replaces the previous tool"
            );
            Registered::Replaced { previous: existing.spec.source.clone() }
        }
    };
    catalog.insert(Arc::from(name), Arc::new(tool));
    Ok(outcome)
}

fn insert_toolkit(
    catalog: &mut Catalog,
    source: &ToolSource,
    mut toolkit: Toolkit,
    tools: Vec<ToolEntry>,
) -> Result<(), RegistryError> {
    let tools: Vec<ToolEntry> = tools
        .into_iter()
        .filter_map(|mut tool| {
            tool.spec.toolkit.get_or_insert_with(|| toolkit.name.clone());
            catalog.overrides.apply(tool)
        })
        .collect();
    if catalog.registered.contains_key(&toolkit.name) {
        return Err(RegistryError::ToolkitExists(toolkit.name));
    }
    let mut seen = BTreeSet::new();
    let mut taken = Vec::new();
    for tool in &tools {
        if let Some(other) = tool.spec.toolkit.as_ref().filter(|t| **t != toolkit.name) {
            return Err(RegistryError::Nested {
                tool: tool.spec.name.clone(),
                toolkit: other.clone(),
            });
        }
        if !seen.insert(tool.spec.name.as_str()) {
            return Err(RegistryError::Duplicate(tool.spec.name.clone()));
        }
        if let Some(existing) = catalog.get(&tool.spec.name) {
            taken.push(format!("{} (from {})", tool.spec.name, existing.spec.source));
        }
    }
    if !taken.is_empty() {
        return Err(RegistryError::ToolkitCollision { toolkit: toolkit.name, tools: taken });
    }
    toolkit.tools = tools.iter().map(|t| t.spec.name.clone()).collect();
    for mut tool in tools {
        tool.spec.toolkit = Some(toolkit.name.clone());
        catalog.insert(Arc::from(tool.spec.name.as_str()), Arc::new(tool));
    }
    let name = toolkit.name.clone();
    let kit = RegisteredKit { source: source.clone(), toolkit: Arc::new(toolkit), whole: true };
    catalog.registered.insert(name.clone(), kit);
    catalog.relist_toolkit(&name);
    Ok(())
}

/// Removes the tools of `source` but those named in `keep`, and the toolkits it
/// registered (a toolkit the operator declares of one's name stays, as declared).
fn remove_source(catalog: &mut Catalog, source: &ToolSource, keep: &HashSet<&str>) {
    if let Some(names) = catalog.names_of(source) {
        let gone: Vec<Arc<str>> = names.iter().filter(|n| !keep.contains(&***n)).cloned().collect();
        for name in gone {
            catalog.remove(&name);
        }
    }
    let owned: Vec<String> = (catalog.registered.iter())
        .filter(|(_, kit)| kit.source == *source)
        .map(|(name, _)| name.clone())
        .collect();
    for name in owned {
        catalog.registered.remove(&name);
        catalog.relist_toolkit(&name);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{Value, json};
    use toolmesh_core::{
        Backend, BackendError, CallContext, ToolOutput, ToolSource, ToolSpec, Toolkit,
    };

    use super::*;
    use crate::CatalogChange;

    struct Nop;

    #[async_trait::async_trait]
    impl Backend for Nop {
        async fn call(&self, _: CallContext, _: Value) -> Result<ToolOutput, BackendError> {
            Ok(ToolOutput::default())
        }
    }

    fn tool(name: &str, source: &str) -> ToolEntry {
        let spec = ToolSpec::new(name, "d", json!({"type": "object"}), ToolSource::local(source));
        ToolEntry::new(spec, Arc::new(Nop)).unwrap()
    }

    /// An update that leaves the local source `source` without tools.
    fn empty(source: &str) -> SourceUpdate {
        SourceUpdate {
            source: ToolSource::local(source),
            tools: vec![],
            toolkits: vec![],
            toolkit: None,
            unchanged: vec![],
        }
    }

    fn kit(name: &str) -> Toolkit {
        Toolkit {
            name: name.into(),
            description: String::new(),
            instructions: "i".into(),
            tools: vec![],
        }
    }

    #[test]
    fn standalone_tool_replaces_a_taken_name() {
        let mut state = RegistryState::default();
        assert_eq!(state.register(tool("a", "one")).unwrap(), Registered::Added);
        let outcome = state.register(tool("a", "two")).unwrap();
        assert_eq!(outcome, Registered::Replaced { previous: ToolSource::local("one") });
        assert_eq!(state.catalog().get("a").unwrap().spec.source, ToolSource::local("two"));
        assert_eq!(state.catalog().version, 2);
    }

    #[test]
    fn colliding_toolkit_is_rejected_whole() {
        let mut state = RegistryState::default();
        state.register(tool("b", "one")).unwrap();
        let before = state.catalog().version;
        let err = state
            .register_toolkit(kit("k"), vec![tool("a", "kit"), tool("b", "kit"), tool("c", "kit")])
            .unwrap_err();
        assert!(matches!(&err, RegistryError::ToolkitCollision { tools, .. } if tools.len() == 1));
        assert!(err.to_string().contains("b (from local:one)"), "{err}");
        assert!(!state.catalog().contains("a"), "nothing of the toolkit was added");
        assert!(!state.catalog().toolkits.contains_key("k"));
        assert_eq!(state.catalog().version, before);
    }

    #[test]
    fn toolkit_members_are_marked_and_protected() {
        let mut state = RegistryState::default();
        state.register_toolkit(kit("k"), vec![tool("a", "kit"), tool("b", "kit")]).unwrap();
        assert_eq!(state.catalog().get("a").unwrap().spec.toolkit.as_deref(), Some("k"));
        assert_eq!(state.catalog().toolkits["k"].tools, vec!["a", "b"]);
        let err = state.register(tool("a", "other")).unwrap_err();
        assert!(matches!(err, RegistryError::MemberOfToolkit { .. }));
        let err = state.register_toolkit(kit("k"), vec![tool("z", "kit")]).unwrap_err();
        assert_eq!(err, RegistryError::ToolkitExists("k".into()));
    }

    #[test]
    fn toolkits_do_not_nest() {
        let mut state = RegistryState::default();
        let mut member = tool("a", "kit");
        member.spec.toolkit = Some("inner".into());
        let err = state.register_toolkit(kit("outer"), vec![member]).unwrap_err();
        assert!(matches!(err, RegistryError::Nested { .. }));
    }

    #[test]
    fn replace_source_swaps_atomically() {
        let mut state = RegistryState::default();
        state.register(tool("keep", "other")).unwrap();
        let update = |tools: Vec<ToolEntry>| SourceUpdate {
            source: ToolSource::local("config"),
            tools,
            toolkits: vec![],
            toolkit: None,
            unchanged: vec![],
        };
        state.replace_source(update(vec![tool("a", "config"), tool("b", "config")])).unwrap();
        state.replace_source(update(vec![tool("b", "config"), tool("c", "config")])).unwrap();
        let names: Vec<_> = state.catalog().iter().map(|(n, _)| n.to_owned()).collect();
        assert_eq!(names, vec!["b", "c", "keep"]);

        let err = state.replace_source(update(vec![tool("d", "config"), tool("d", "config")]));
        assert_eq!(err.unwrap_err(), RegistryError::Duplicate("d".into()));
        let names: Vec<_> = state.catalog().iter().map(|(n, _)| n.to_owned()).collect();
        assert_eq!(names, vec!["b", "c", "keep"], "a rejected update changes nothing");

        // Unchanged tools keep their very entry; a name of another source is not taken.
        let before = state.catalog().clone();
        let mut keep = update(vec![tool("d", "config")]);
        keep.unchanged = vec!["b".into(), "keep".into()];
        state.replace_source(keep).unwrap();
        let after = state.catalog().clone();
        let names: Vec<_> = after.iter().map(|(n, _)| n.to_owned()).collect();
        assert_eq!(names, vec!["b", "d", "keep"]);
        assert!(Arc::ptr_eq(before.get("b").unwrap(), after.get("b").unwrap()));
        let kept = after.get("keep").unwrap();
        assert!(Arc::ptr_eq(before.get("keep").unwrap(), kept), "the other source's tool stays");
        assert_eq!(kept.spec.source, ToolSource::local("other"));
    }

    #[test]
    fn replacing_a_source_removes_its_own_tools_only() {
        let mut state = RegistryState::default();
        state.register(tool("x", "one")).unwrap();
        state.register(tool("y", "one")).unwrap();
        // Another source takes x over: it is no longer one's.
        state.register(tool("x", "two")).unwrap();
        state.register_toolkit(kit("k"), vec![tool("a", "one"), tool("b", "one")]).unwrap();
        state.replace_source(empty("one")).unwrap();
        let names: Vec<_> = state.catalog().iter().map(|(n, _)| n.to_owned()).collect();
        assert_eq!(names, ["x"]);
        assert_eq!(state.catalog().get("x").unwrap().spec.source, ToolSource::local("two"));
        assert!(state.catalog().toolkits.is_empty(), "the toolkit went with its tools");
        state.replace_source(empty("two")).unwrap();
        assert!(state.catalog().is_empty());
    }

    fn stated(name: &str, instructions: Option<&str>, select: &[&str]) -> crate::ToolkitOverride {
        crate::ToolkitOverride {
            name: name.into(),
            description: None,
            instructions: instructions.map(str::to_owned),
            select: select.iter().map(|s| toolmesh_config::Selector::parse(s).unwrap()).collect(),
        }
    }

    fn members(state: &RegistryState, toolkit: &str) -> Vec<String> {
        state.catalog().members(toolkit).map(str::to_owned).collect()
    }

    #[test]
    fn a_declared_toolkit_gathers_standalone_tools_of_any_source() {
        let mut state = RegistryState::default();
        let toolkits = vec![stated("files", Some("Read before you write."), &["file_*"])];
        state.set_overrides(crate::Overrides { tools: vec![], toolkits });
        assert_eq!(state.catalog().toolkits["files"].instructions, "Read before you write.");
        state.register(tool("file_read", "one")).unwrap();
        state.register(tool("file_write", "two")).unwrap();
        state.register(tool("other", "two")).unwrap();
        state.register_toolkit(kit("k"), vec![tool("file_kit", "three")]).unwrap();
        assert_eq!(members(&state, "files"), ["file_read", "file_write"]);
        assert_eq!(members(&state, "k"), ["file_kit"], "a toolkit's own member stays in it");
        assert_eq!(state.catalog().get("other").unwrap().spec.toolkit, None);
        // The declared toolkit outlives its tools' sources.
        state.replace_source(empty("one")).unwrap();
        state.replace_source(empty("two")).unwrap();
        assert!(members(&state, "files").is_empty());
        assert!(state.catalog().toolkits.contains_key("files"));
    }

    #[test]
    fn a_sources_own_toolkit_takes_its_tools_and_the_operators_word() {
        let mut state = RegistryState::default();
        let toolkits = vec![stated("gh", Some("Ours."), &[]), stated("admin", None, &["gh_admin"])];
        state.set_overrides(crate::Overrides { tools: vec![], toolkits });
        let source = ToolSource { kind: toolmesh_core::SourceKind::Mcp, name: "gh".into() };
        let own = |instructions: &str| Toolkit {
            name: "gh".into(),
            description: "GitHub".into(),
            instructions: instructions.into(),
            tools: vec![],
        };
        let update =
            |tools: Vec<ToolEntry>, toolkit: Option<Toolkit>, unchanged: &[&str]| SourceUpdate {
                source: source.clone(),
                tools,
                toolkits: vec![],
                toolkit,
                unchanged: unchanged.iter().map(|&n| n.to_owned()).collect(),
            };
        state
            .replace_source(update(
                vec![tool("gh_list", "x"), tool("gh_admin", "x")],
                Some(own("Theirs.")),
                &[],
            ))
            .unwrap();
        assert_eq!(members(&state, "gh"), ["gh_list"]);
        assert_eq!(members(&state, "admin"), ["gh_admin"], "the operator's toolkit wins");
        let listed = &state.catalog().toolkits["gh"];
        assert_eq!(
            (listed.description.as_str(), listed.instructions.as_str()),
            ("GitHub", "Ours.")
        );
        // The same tools, the toolkit described anew: the entries stay.
        let before = state.catalog().get("gh_list").unwrap().clone();
        state.set_overrides(crate::Overrides::default());
        state.replace_source(update(vec![], Some(own("New.")), &["gh_list", "gh_admin"])).unwrap();
        assert!(Arc::ptr_eq(&before, state.catalog().get("gh_list").unwrap()));
        assert_eq!(state.catalog().toolkits["gh"].instructions, "New.");
        // Another source cannot take the name; its tools join no toolkit.
        let other = SourceUpdate {
            source: ToolSource::local("gh"),
            ..update(vec![tool("x", "x")], Some(own("")), &[])
        };
        state.replace_source(other).unwrap();
        assert_eq!(state.catalog().get("x").unwrap().spec.toolkit, None);
        assert_eq!(members(&state, "gh"), ["gh_list"]);
        // The source gone, its toolkit goes too.
        state.replace_source(update(vec![], None, &[])).unwrap();
        assert!(!state.catalog().toolkits.contains_key("gh"));
        assert!(members(&state, "gh").is_empty());
    }

    #[test]
    fn changes_since_an_older_catalog_are_exactly_the_changed_tools() {
        let mut state = RegistryState::default();
        let update = |tools: Vec<ToolEntry>, unchanged: &[&str]| SourceUpdate {
            source: ToolSource::local("s"),
            tools,
            toolkits: vec![],
            toolkit: None,
            unchanged: unchanged.iter().map(|&n| n.to_owned()).collect(),
        };
        let many: Vec<ToolEntry> = (0..1000).map(|i| tool(&format!("t{i:04}"), "s")).collect();
        state.replace_source(update(many, &[])).unwrap();
        let before = state.catalog().clone();
        let unchanged: Vec<String> =
            (0..1000).filter(|i| ![10, 500].contains(i)).map(|i| format!("t{i:04}")).collect();
        let unchanged: Vec<&str> = unchanged.iter().map(String::as_str).collect();
        state
            .replace_source(update(vec![tool("t0010", "s"), tool("t9999", "s")], &unchanged))
            .unwrap();
        let after = state.catalog().clone();
        let changes: Vec<String> = after
            .changes_since(&before)
            .map(|change| match change {
                CatalogChange::Upserted(name, entry) => {
                    assert!(Arc::ptr_eq(entry, after.get(name).unwrap()));
                    format!("+{name}")
                }
                CatalogChange::Removed(name) => format!("-{name}"),
            })
            .collect();
        assert_eq!(changes, ["+t0010", "-t0500", "+t9999"]);
        assert_eq!(after.changes_since(&after).count(), 0);
        assert_eq!(after.changes_since(&Catalog::default()).count(), after.len());
        // The older version is untouched by the newer one.
        assert_eq!(before.len(), 1000);
        assert!(before.contains("t0500") && !before.contains("t9999"));
    }

    #[test]
    fn arguments_are_checked_against_the_schema() {
        let spec = ToolSpec::new(
            "t",
            "d",
            json!({"type": "object", "required": ["city"],
                   "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}}}),
            ToolSource::local("x"),
        );
        let entry = ToolEntry::new(spec, Arc::new(Nop)).unwrap();
        assert!(entry.check_arguments(&json!({"city": "Lisbon"})).is_empty());
        let v = entry.check_arguments(&json!({"days": 0}));
        let rules: Vec<_> = v.iter().map(|v| (v.path.as_str(), v.rule.as_str())).collect();
        assert!(rules.contains(&("", "required")), "{v:?}");
        assert!(rules.contains(&("/days", "minimum")), "{v:?}");
    }

    #[test]
    fn draft7_schemas_are_understood() {
        let spec = ToolSpec::new(
            "t",
            "d",
            json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                   "properties": {"n": {"type": "number", "exclusiveMaximum": 10}},
                   "dependencies": {"a": ["b"]}}),
            ToolSource::local("x"),
        );
        let entry = ToolEntry::new(spec, Arc::new(Nop)).unwrap();
        assert!(entry.check_arguments(&json!({"n": 9})).is_empty());
        assert_eq!(entry.check_arguments(&json!({"n": 10}))[0].rule, "exclusiveMaximum");
        let missing_b = entry.check_arguments(&json!({"a": 1}));
        assert_eq!(missing_b.len(), 1, "draft-07 `dependencies` is enforced: {missing_b:?}");
        assert!(missing_b[0].message.contains("\"b\""), "{missing_b:?}");
    }

    #[test]
    fn a_deferred_entry_keeps_a_tool_whose_schema_does_not_compile() {
        let spec = ToolSpec::new("t", "d", json!({"type": "objekt"}), ToolSource::local("x"));
        let entry = ToolEntry::deferred(spec, Arc::new(Nop)).unwrap();
        assert!(entry.check_arguments(&json!({"anything": 1})).is_empty());
        assert!(matches!(entry.compile(), [RegistryError::InvalidSchema { which: "input", .. }]));
        // A schema that compiles is compiled at its first use, and shared by clones.
        let spec = ToolSpec::new(
            "u",
            "d",
            json!({"type": "object", "required": ["a"]}),
            ToolSource::local("x"),
        );
        let entry = ToolEntry::deferred(spec, Arc::new(Nop)).unwrap();
        let clone = entry.clone();
        assert_eq!(clone.check_arguments(&json!({}))[0].rule, "required");
        assert!(entry.compile().is_empty());
        assert!(Arc::ptr_eq(&entry.schemas, &clone.schemas));
        assert!(entry.schemas.get().is_some(), "compiled once, for both");
    }

    #[test]
    fn invalid_schema_is_rejected_at_registration() {
        let spec = ToolSpec::new("t", "d", json!({"type": "objekt"}), ToolSource::local("x"));
        let err = ToolEntry::new(spec, Arc::new(Nop)).unwrap_err();
        assert!(matches!(err, RegistryError::InvalidSchema { which: "input", .. }));
    }

    #[test]
    fn a_definition_past_the_bound_is_refused_however_it_is_published() {
        let schema = json!({"type": "object", "description": "d".repeat(300 << 10)});
        let spec = ToolSpec::new("big", "d", schema, ToolSource::local("x"));
        for refused in [
            ToolEntry::new(spec.clone(), Arc::new(Nop)).unwrap_err(),
            ToolEntry::deferred(spec, Arc::new(Nop)).unwrap_err(),
        ] {
            assert!(matches!(refused, RegistryError::TooLarge { limit: 262_144, .. }), "{refused}");
        }
        let within = json!({"type": "object", "description": "d".repeat(200 << 10)});
        ToolEntry::deferred(
            ToolSpec::new("ok", "d", within, ToolSource::local("x")),
            Arc::new(Nop),
        )
        .unwrap();
    }
}
