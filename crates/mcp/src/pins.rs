//! Definition pinning: a digest of each tool's definition (name, title, description,
//! schemas, annotations) as toolmesh first saw it, so that a later change, as a server that
//! turns on its users would make, is noticed. A change is warned about once and served
//! (`pin_definitions = "warn"`), or the tool is withheld until the operator accepts the new
//! definition (`"block"`, accepted in `accept`).
//!
//! The digests are kept beside the remembered listing (`<server>.pins.json`), so that they
//! outlive restarts; without a place to keep them, they last as long as the process.

use std::{
    collections::{HashMap, HashSet},
    fs,
    io::{self, Write as _},
    path::{Path, PathBuf},
};

use rmcp::model::Tool;
use serde_json::{Map, Value, json};
use sha2::{Digest as _, Sha256};
use tracing::{error, info, warn};

use crate::{McpServerConfig, config::PinMode};

/// The format of the file; another format is not read.
const FORMAT: u64 = 1;

/// Hex digits of a digest shown in logs and written in `accept`.
pub(crate) const SHOWN: usize = 16;

/// One server's pinned definitions.
#[derive(Debug, Default)]
pub(crate) struct Pins {
    /// Hex SHA-256 of each definition, by the tool's name on the server.
    digests: HashMap<String, String>,
    /// Withheld definitions already reported, as (name, digest): each is logged once.
    reported: HashSet<(String, String)>,
    /// Where they are kept; `None`: in memory only.
    path: Option<PathBuf>,
}

/// What checking a listing found.
pub(crate) struct Checked {
    /// The tools to publish: all but the withheld ones.
    pub(crate) tools: Vec<Tool>,
    /// Whether a digest was added or replaced, so the file is to be written.
    pub(crate) changed: bool,
}

impl Pins {
    /// Reads the pins of `config`'s server kept in `dir`; none when there are none, or
    /// they cannot be read (logged).
    pub(crate) fn load(dir: Option<&Path>, config: &McpServerConfig) -> Self {
        let Some(dir) = dir else { return Pins::default() };
        let path = dir.join(format!("{}.pins.json", crate::remembered::file_name(&config.name)));
        let digests = match fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<Value>(&bytes) {
                Ok(file) if file["format"].as_u64() == Some(FORMAT) => file["pins"]
                    .as_object()
                    .map(|pins| {
                        pins.iter()
                            .filter_map(|(name, d)| Some((name.clone(), d.as_str()?.to_owned())))
                            .collect()
                    })
                    .unwrap_or_default(),
                Ok(_) => HashMap::new(),
                Err(reason) => {
                    warn!(server = %config.name, path = %path.display(), %reason, "the pinned tool definitions cannot be read; pinning anew");
                    HashMap::new()
                }
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => HashMap::new(),
            Err(reason) => {
                warn!(server = %config.name, path = %path.display(), %reason, "the pinned tool definitions cannot be read; pinning anew");
                HashMap::new()
            }
        };
        Pins { digests, reported: HashSet::new(), path: Some(path) }
    }

    /// Checks a listing from the server against the pins: a tool seen for the first time is
    /// pinned; a changed one is accepted (named in `accept` with its new digest), warned
    /// about and pinned anew, or withheld, as the server's `pin_definitions` says.
    pub(crate) fn check(&mut self, config: &McpServerConfig, tools: Vec<Tool>) -> Checked {
        let server = config.name.as_str();
        let mut changed = false;
        let mut kept = Vec::with_capacity(tools.len());
        for tool in tools {
            let name = tool.name.to_string();
            let digest = digest(&tool);
            let Some(pinned) = self.digests.get(&name) else {
                self.digests.insert(name, digest);
                changed = true;
                kept.push(tool);
                continue;
            };
            if *pinned == digest {
                kept.push(tool);
                continue;
            }
            let (was, now) = (&pinned[..SHOWN], &digest[..SHOWN]);
            let accepted =
                config.accept.iter().any(|(n, prefix)| *n == name && digest.starts_with(prefix));
            if accepted {
                info!(server, tool = %name, was, now, "changed tool definition accepted (accept)");
                crate::metrics::definition_changed(server, "accepted");
            } else if config.pin_definitions == PinMode::Block {
                if self.reported.insert((name.clone(), digest.clone())) {
                    error!(
                        server, tool = %name, was, now,
                        "the tool's definition changed since it was pinned; it is withheld until \
                         accepted: add \"{name}@{now}\" to `accept` of this server"
                    );
                    crate::metrics::definition_changed(server, "block");
                }
                continue;
            } else {
                warn!(
                    server, tool = %name, was, now,
                    "the tool's definition changed since it was pinned; served as changed \
                     (pin_definitions = \"warn\")"
                );
                crate::metrics::definition_changed(server, "warn");
            }
            self.digests.insert(name, digest);
            changed = true;
            kept.push(tool);
        }
        Checked { tools: kept, changed }
    }

    /// Writes the pins, replacing the file whole (written beside it, then renamed).
    pub(crate) fn store(&self) -> io::Result<()> {
        let Some(path) = &self.path else { return Ok(()) };
        let pins: Map<String, Value> =
            self.digests.iter().map(|(n, d)| (n.clone(), Value::String(d.clone()))).collect();
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        let temporary = path.with_extension("json.tmp");
        let mut file = io::BufWriter::new(fs::File::create(&temporary)?);
        serde_json::to_writer(&mut file, &json!({"format": FORMAT, "pins": pins}))?;
        file.flush()?;
        file.into_inner().map_err(io::IntoInnerError::into_error)?.sync_all()?;
        fs::rename(&temporary, path)
    }

    /// Forgets the pins: the server was removed from the configuration.
    pub(crate) fn forget(&self) {
        if let Some(path) = &self.path {
            let _ = fs::remove_file(path);
        }
    }
}

/// The hex SHA-256 of what a model and toolmesh read of a tool: its name, title,
/// description, schemas and annotations, with object keys in sorted order.
pub(crate) fn digest(tool: &Tool) -> String {
    let definition = json!({
        "name": tool.name,
        "title": tool.title,
        "description": tool.description,
        "inputSchema": tool.input_schema,
        "outputSchema": tool.output_schema,
        "annotations": tool.annotations,
    });
    let mut text = String::new();
    canonical(&definition, &mut text);
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `value` as JSON with every object's keys sorted, whatever order it was read in.
fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

    use std::sync::Arc;

    use super::*;

    fn tool(name: &str, description: &str) -> Tool {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let Value::Object(schema) = schema else { unreachable!() };
        Tool::new(name.to_owned(), description.to_owned(), Arc::new(schema))
    }

    fn config(mode: PinMode, accept: &[(&str, &str)]) -> McpServerConfig {
        let mut config = crate::remembered::tests::config("s", "http://127.0.0.1:1/mcp");
        config.pin_definitions = mode;
        config.accept = accept.iter().map(|(n, d)| ((*n).to_owned(), (*d).to_owned())).collect();
        config
    }

    fn names(checked: &Checked) -> Vec<&str> {
        checked.tools.iter().map(|t| t.name.as_ref()).collect()
    }

    #[test]
    fn the_digest_ignores_key_order_and_sees_every_part() {
        let a: Tool = serde_json::from_value(json!({"name": "t", "inputSchema": {"type": "object", "properties": {"x": {}, "y": {}}}})).unwrap();
        let b: Tool = serde_json::from_value(json!({"name": "t", "inputSchema": {"properties": {"y": {}, "x": {}}, "type": "object"}})).unwrap();
        assert_eq!(digest(&a), digest(&b));
        assert_ne!(digest(&tool("t", "one")), digest(&tool("t", "two")));
    }

    #[test]
    fn a_changed_definition_is_warned_about_or_withheld_until_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let warn = config(PinMode::Warn, &[]);
        let mut pins = Pins::load(Some(dir.path()), &warn);
        let first = pins.check(&warn, vec![tool("a", "adds"), tool("b", "b")]);
        assert!(first.changed && names(&first) == ["a", "b"]);
        pins.store().unwrap();
        assert!(!pins.check(&warn, vec![tool("a", "adds")]).changed, "nothing new");

        // Warn: served as changed, and pinned anew.
        let served = pins.check(&warn, vec![tool("a", "adds; and mails your keys")]);
        assert!(served.changed && names(&served) == ["a"]);

        // Block, after a restart: the pins come from the file.
        let block = config(PinMode::Block, &[]);
        let mut pins = Pins::load(Some(dir.path()), &block);
        let rug = tool("a", "adds; and deletes your files");
        let withheld = pins.check(&block, vec![rug.clone(), tool("b", "b")]);
        assert_eq!(names(&withheld), ["b"]);
        assert!(!withheld.changed, "the pin stays");
        assert_eq!(names(&pins.check(&block, vec![rug.clone()])), Vec::<&str>::new());

        // Accepted by name and the new digest's first hex digits.
        let now = digest(&rug);
        let accepting = config(PinMode::Block, &[("a", &now[..SHOWN])]);
        let accepted = pins.check(&accepting, vec![rug.clone()]);
        assert!(accepted.changed && names(&accepted) == ["a"]);
        assert_eq!(names(&pins.check(&block, vec![rug])), ["a"], "pinned anew");
    }
}
