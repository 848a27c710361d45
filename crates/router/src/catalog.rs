//! `[catalog]`: what the operator states about tools over what their sources say.

use serde::Deserialize;
use toolmesh_config::{ConfigError, Reading, Section, Selector};
use toolmesh_core::{ToolAnnotations, validate_tool_name};
use toolmesh_registry::{Overrides, ToolOverride, ToolkitOverride};

/// `[catalog]`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CatalogConfig {
    /// `[[catalog.tools]]` and `[[catalog.toolkits]]`, in the order written.
    pub overrides: Overrides,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawCatalog {
    #[serde(default)]
    tools: Vec<RawOverride>,
    #[serde(default)]
    toolkits: Vec<RawToolkit>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToolkit {
    name: String,
    description: Option<String>,
    instructions: Option<String>,
    #[serde(default)]
    tools: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOverride {
    tool: String,
    name: Option<String>,
    title: Option<String>,
    description: Option<String>,
    annotations: Option<RawHints>,
    #[serde(default)]
    hidden: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHints {
    read_only: Option<bool>,
    destructive: Option<bool>,
    idempotent: Option<bool>,
    open_world: Option<bool>,
}

/// Reads `[[catalog.tools]]` (a selector each, a new name only for a selector of one tool)
/// and `[[catalog.toolkits]]` (a unique name each, selectors of their tools).
impl Section for CatalogConfig {
    const NAME: &'static str = "catalog";
    const DEFAULTS: &'static str = include_str!("catalog.toml");

    fn read(value: toml::Value, cx: &Reading<'_>) -> Result<Self, ConfigError> {
        let raw: RawCatalog = cx.deserialize(value)?;
        let mut overrides = Vec::with_capacity(raw.tools.len());
        for (i, raw) in raw.tools.into_iter().enumerate() {
            let key = |field: &str| format!("catalog.tools[{i}].{field}");
            let select = Selector::parse(&raw.tool).map_err(|r| cx.key_error(key("tool"), r))?;
            if let Some(name) = &raw.name {
                if !matches!(&select, Selector::Name(one) if !one.contains('*')) {
                    return Err(cx.key_error(
                        key("name"),
                        format!("`tool = \"{}\"` may select more than one tool, which cannot share a name", raw.tool),
                    ));
                }
                validate_tool_name(name).map_err(|e| cx.key_error(key("name"), e.to_string()))?;
            }
            let sets_something = raw.name.is_some()
                || raw.title.is_some()
                || raw.description.is_some()
                || raw.annotations.is_some()
                || raw.hidden;
            if !sets_something {
                return Err(cx.key_error(
                    format!("catalog.tools[{i}]"),
                    "sets nothing (name, title, description, annotations or hidden)",
                ));
            }
            overrides.push(ToolOverride {
                select: Some(select),
                name: raw.name,
                title: raw.title,
                description: raw.description,
                annotations: raw.annotations.map(|h| ToolAnnotations {
                    read_only: h.read_only,
                    destructive: h.destructive,
                    idempotent: h.idempotent,
                    open_world: h.open_world,
                }),
                hidden: raw.hidden,
            });
        }
        let mut toolkits: Vec<ToolkitOverride> = Vec::with_capacity(raw.toolkits.len());
        for (i, raw) in raw.toolkits.into_iter().enumerate() {
            let key = |field: &str| format!("catalog.toolkits[{i}].{field}");
            validate_tool_name(&raw.name).map_err(|_| {
                cx.key_error(
                    key("name"),
                    format!("{:?} must match ^[a-zA-Z0-9_-]{{1,64}}$", raw.name),
                )
            })?;
            if toolkits.iter().any(|kit| kit.name == raw.name) {
                return Err(cx.key_error(key("name"), format!("{:?} is declared twice", raw.name)));
            }
            if raw.description.is_none() && raw.instructions.is_none() && raw.tools.is_empty() {
                return Err(cx.key_error(
                    format!("catalog.toolkits[{i}]"),
                    "sets nothing (description, instructions or tools)",
                ));
            }
            let select = (raw.tools.iter().enumerate())
                .map(|(j, text)| {
                    Selector::parse(text).map_err(|r| cx.key_error(key(&format!("tools[{j}]")), r))
                })
                .collect::<Result<_, _>>()?;
            toolkits.push(ToolkitOverride {
                name: raw.name,
                description: raw.description,
                instructions: raw.instructions,
                select,
            });
        }
        Ok(CatalogConfig { overrides: Overrides { tools: overrides, toolkits } })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

    use std::collections::HashMap;

    use toolmesh_config::load_str;

    use super::*;

    fn catalog(text: &str) -> Result<CatalogConfig, ConfigError> {
        load_str(Some(("f.toml", text)), &HashMap::new())?.get()
    }

    #[test]
    fn overrides_parse_in_order_and_name_only_one_tool() {
        assert_eq!(catalog("").unwrap(), CatalogConfig::default());
        let config = catalog(
            r#"
[[catalog.tools]]
tool = "gh_delete"
name = "delete_repository"
annotations = { destructive = true }

[[catalog.tools]]
tool = "source:gh"
hidden = true
"#,
        )
        .unwrap();
        let [first, second] = &config.overrides.tools[..] else { panic!("{config:?}") };
        assert_eq!(first.name.as_deref(), Some("delete_repository"));
        assert_eq!(first.annotations.unwrap().destructive, Some(true));
        assert_eq!(first.annotations.unwrap().read_only, None);
        assert_eq!(second.select, Some(Selector::Source("gh".into())));
        assert!(second.hidden);

        let error = catalog("[[catalog.tools]]\ntool = \"gh_*\"\nname = \"x\"\n").unwrap_err();
        assert!(error.to_string().contains("catalog.tools[0].name"), "{error}");
        let error = catalog("[[catalog.tools]]\ntool = \"a\"\nname = \"no spaces\"\n").unwrap_err();
        assert!(error.to_string().contains("catalog.tools[0].name"), "{error}");
        let error = catalog("[[catalog.tools]]\ntool = \"a\"\n").unwrap_err();
        assert!(error.to_string().contains("sets nothing"), "{error}");
        let error = catalog("[[catalog.tools]]\ntool = \"a\"\nannotations = { readOnly = true }\n");
        assert!(error.unwrap_err().to_string().contains("readOnly"));
    }

    #[test]
    fn toolkits_are_declared_once_with_selectors_that_parse() {
        let config = catalog(
            r#"
[[catalog.toolkits]]
name = "repos"
instructions = "List before you delete."
tools = ["gh_*_repo", "source:gitlab"]

[[catalog.toolkits]]
name = "github"
description = "GitHub, through its MCP server."
"#,
        )
        .unwrap();
        let [repos, github] = &config.overrides.toolkits[..] else { panic!("{config:?}") };
        assert_eq!(repos.select.len(), 2);
        assert_eq!(repos.instructions.as_deref(), Some("List before you delete."));
        assert!(github.select.is_empty() && github.instructions.is_none());

        let twice = "[[catalog.toolkits]]\nname = \"a\"\ntools = [\"x\"]\n";
        let error = catalog(&format!("{twice}{twice}")).unwrap_err();
        assert!(error.to_string().contains("catalog.toolkits[1].name"), "{error}");
        let error = catalog("[[catalog.toolkits]]\nname = \"a b\"\ntools = [\"x\"]\n");
        assert!(error.unwrap_err().to_string().contains("catalog.toolkits[0].name"));
        let error = catalog("[[catalog.toolkits]]\nname = \"a\"\n").unwrap_err();
        assert!(error.to_string().contains("sets nothing"), "{error}");
        let error = catalog("[[catalog.toolkits]]\nname = \"a\"\ntools = [\"colour:red\"]\n");
        assert!(error.unwrap_err().to_string().contains("catalog.toolkits[0].tools[0]"));
    }
}
