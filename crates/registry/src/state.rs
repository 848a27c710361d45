use std::{
    collections::{BTreeSet, HashSet},
    sync::Arc,
};

use toolmesh_core::{ToolSource, Toolkit};
use tracing::warn;

use crate::{Catalog, Registered, RegistryError, SourceUpdate, ToolEntry};

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

    /// Sets the overrides the tools that join from now on get; the catalog's version stays.
    pub(crate) fn set_overrides(&mut self, overrides: crate::Overrides) {
        let mut next = Catalog::clone(&self.catalog);
        next.overrides = Arc::new(overrides);
        self.catalog = Arc::new(next);
    }

    pub(crate) fn register(&mut self, tool: ToolEntry) -> Result<Registered, RegistryError> {
        let mut next = Catalog::clone(&self.catalog);
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
        insert_toolkit(&mut next, toolkit, tools)?;
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
                self.catalog
                    .get(name)
                    .is_some_and(|t| t.spec.source == update.source && t.spec.toolkit.is_none())
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
            insert_toolkit(&mut next, toolkit, tools)?;
        }
        for mut tool in update.tools {
            tool.spec.source = update.source.clone();
            if let Some(tool) = next.overrides.apply(tool) {
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

fn insert_standalone(
    catalog: &mut Catalog,
    mut tool: ToolEntry,
) -> Result<Registered, RegistryError> {
    if let Some(toolkit) = &tool.spec.toolkit {
        return Err(RegistryError::Nested {
            tool: tool.spec.name.clone(),
            toolkit: toolkit.clone(),
        });
    }
    let name = tool.spec.name.clone();
    let outcome = match catalog.get(&name) {
        None => Registered::Added,
        Some(existing) => {
            if let Some(toolkit) = &existing.spec.toolkit {
                return Err(RegistryError::MemberOfToolkit {
                    tool: name,
                    toolkit: toolkit.clone(),
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
    tool.spec.toolkit = None;
    catalog.insert(Arc::from(name), Arc::new(tool));
    Ok(outcome)
}

fn insert_toolkit(
    catalog: &mut Catalog,
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
    if catalog.toolkits.contains_key(&toolkit.name) {
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
    catalog.toolkits.insert(toolkit.name.clone(), Arc::new(toolkit));
    Ok(())
}

/// Removes the tools of `source` but those named in `keep`.
fn remove_source(catalog: &mut Catalog, source: &ToolSource, keep: &HashSet<&str>) {
    let Some(names) = catalog.names_of(source) else { return };
    let gone: Vec<Arc<str>> = names.iter().filter(|n| !keep.contains(&***n)).cloned().collect();
    // A toolkit belongs to the source of its tools; one left without tools is gone too.
    let mut toolkits = BTreeSet::new();
    for name in gone {
        if let Some(toolkit) = catalog.remove(&name).and_then(|t| t.spec.toolkit.clone()) {
            toolkits.insert(toolkit);
        }
    }
    for name in toolkits {
        let empty = catalog
            .toolkits
            .get(&name)
            .is_some_and(|toolkit| !toolkit.tools.iter().any(|t| catalog.contains(t)));
        if empty {
            catalog.toolkits.remove(&name);
        }
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
        let empty = |source: &str| SourceUpdate {
            source: ToolSource::local(source),
            tools: vec![],
            toolkits: vec![],
            unchanged: vec![],
        };
        state.replace_source(empty("one")).unwrap();
        let names: Vec<_> = state.catalog().iter().map(|(n, _)| n.to_owned()).collect();
        assert_eq!(names, ["x"]);
        assert_eq!(state.catalog().get("x").unwrap().spec.source, ToolSource::local("two"));
        assert!(state.catalog().toolkits.is_empty(), "the toolkit went with its tools");
        state.replace_source(empty("two")).unwrap();
        assert!(state.catalog().is_empty());
    }

    #[test]
    fn changes_since_an_older_catalog_are_exactly_the_changed_tools() {
        let mut state = RegistryState::default();
        let update = |tools: Vec<ToolEntry>, unchanged: &[&str]| SourceUpdate {
            source: ToolSource::local("s"),
            tools,
            toolkits: vec![],
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
