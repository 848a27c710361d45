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
    fs, io,
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
    /// When the file was last read or written here.
    read_at: Option<std::time::SystemTime>,
}

/// What checking a listing found.
pub(crate) struct Checked {
    /// The tools to publish: all but the withheld ones.
    pub(crate) tools: Vec<Tool>,
    /// Whether a digest was added or replaced, so the file is to be written.
    pub(crate) changed: bool,
    /// The definitions that differ from their pins (a withheld one once), for the audit log.
    pub(crate) changes: Vec<DefinitionChange>,
}

/// A tool definition that differs from its pin, and what toolmesh did about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefinitionChange {
    /// The server.
    pub server: String,
    /// The tool's name on the server.
    pub tool: String,
    /// The name the catalog lists it under.
    pub published: String,
    /// The first hex digits of the pinned digest (empty for a definition accepted with
    /// `toolmesh mcp accept`, which replaced the pin).
    pub was: String,
    /// The first hex digits of the new one, as `accept` names it.
    pub now: String,
    /// `warn` (served as changed), `block` (withheld until accepted) or `accept` (served:
    /// accepted in the configuration or with `toolmesh mcp accept`).
    pub action: &'static str,
}

/// Where definition changes are reported (the audit log).
pub type DefinitionAudit = std::sync::Arc<dyn Fn(&DefinitionChange) + Send + Sync>;

/// The file that keeps the pins of the server `server` in `dir`.
fn file_of(dir: &Path, server: &str) -> PathBuf {
    dir.join(format!("{}.pins.json", crate::remembered::file_name(server)))
}

/// Reads the pins kept in `path`: none when there is no file; an error when it cannot be
/// read or is not a pins file of this format.
fn read(path: &Path) -> io::Result<HashMap<String, String>> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(e) => return Err(e),
    };
    let file: Value = serde_json::from_slice(&bytes)?;
    if file["format"].as_u64() != Some(FORMAT) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a pins file of format 1"));
    }
    let pins = file["pins"].as_object().into_iter().flatten();
    Ok(pins.filter_map(|(name, d)| Some((name.clone(), d.as_str()?.to_owned()))).collect())
}

/// Writes `digests` to `path`, replacing the file whole (written beside it, then renamed).
fn write(path: &Path, digests: &HashMap<String, String>) -> io::Result<()> {
    let pins: Map<String, Value> =
        digests.iter().map(|(n, d)| (n.clone(), Value::String(d.clone()))).collect();
    crate::remembered::replace_file(path, |file| {
        Ok(serde_json::to_writer(file, &json!({"format": FORMAT, "pins": pins}))?)
    })
}

/// When `path` was last modified, if it exists.
fn modified(path: &Path) -> Option<std::time::SystemTime> {
    fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Reads `TOOL@DIGEST` (the tool's name on the server, and 8 to 64 lowercase hex digits
/// of its definition's digest, as the log gives them), as `accept` and `toolmesh mcp
/// accept` take it.
pub(crate) fn accepted(entry: &str) -> Option<(&str, &str)> {
    entry.rsplit_once('@').filter(|(name, digest)| {
        !name.is_empty()
            && (8..=64).contains(&digest.len())
            && digest.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// What `TOOL@DIGEST` is, for an error that names one that is not.
pub(crate) const ACCEPTED_FORM: &str = "TOOL@DIGEST (the tool's name on the server, and at \
    least 8 lowercase hex digits of its new definition's digest, as the log gives them)";

/// Accepts `definition` (`TOOL@DIGEST`) for the server `server` whose pins are kept in
/// `dir` (`<data-dir>/mcp`): `toolmesh mcp accept`. Returns the tool and the file written;
/// a running toolmesh reads it at its next reload or listing of that server.
pub fn accept(dir: &Path, server: &str, definition: &str) -> io::Result<(String, PathBuf)> {
    let Some((tool, digest)) = accepted(definition) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{definition:?} is not {ACCEPTED_FORM}"),
        ));
    };
    let path = file_of(dir, server);
    let mut digests = read(&path)?;
    digests.insert(tool.to_owned(), digest.to_owned());
    write(&path, &digests)?;
    Ok((tool.to_owned(), path))
}

impl Pins {
    /// Reads the pins of `config`'s server kept in `dir`; none when there are none, or
    /// they cannot be read (logged).
    pub(crate) fn load(dir: Option<&Path>, config: &McpServerConfig) -> Self {
        let Some(dir) = dir else { return Pins::default() };
        let path = file_of(dir, &config.name);
        let read_at = modified(&path);
        let digests = read(&path).unwrap_or_else(|reason| {
            warn!(server = %config.name, path = %path.display(), %reason, "the pinned tool definitions cannot be read; pinning anew");
            HashMap::new()
        });
        Pins { digests, reported: HashSet::new(), path: Some(path), read_at }
    }

    /// Reads the file again when something else changed it (`toolmesh mcp accept`).
    fn refresh(&mut self, server: &str) {
        let Some(path) = &self.path else { return };
        let now = modified(path);
        if now == self.read_at {
            return;
        }
        match read(path) {
            Ok(digests) => {
                info!(server, path = %path.display(), "the pinned tool definitions changed on disk; read again");
                self.digests = digests;
                self.read_at = now;
            }
            Err(reason) => {
                warn!(server, path = %path.display(), %reason, "the pinned tool definitions cannot be read; the ones read before stay");
            }
        }
    }

    /// Whether a changed definition is being withheld (until accepted).
    pub(crate) fn withholds(&self) -> bool {
        !self.reported.is_empty()
    }

    /// Checks a listing from the server against the pins: a tool seen for the first time is
    /// pinned; a changed one is accepted (named in `accept` with its new digest), warned
    /// about and pinned anew, or withheld, as the server's `pin_definitions` says.
    pub(crate) fn check(&mut self, config: &McpServerConfig, tools: Vec<Tool>) -> Checked {
        let server = config.name.as_str();
        self.refresh(server);
        let mut changed = false;
        let mut changes = Vec::new();
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
            // A pin is a whole digest, or the first digits `toolmesh mcp accept` wrote.
            if digest.starts_with(pinned.as_str()) && pinned.len() >= 8 {
                if pinned.len() < digest.len() {
                    info!(server, tool = %name, now = &digest[..SHOWN], "changed tool definition accepted (toolmesh mcp accept)");
                    crate::metrics::definition_changed(server, "accepted");
                    changes.push(DefinitionChange {
                        server: server.to_owned(),
                        tool: name.clone(),
                        published: crate::publish_name(config.prefix, server, &name),
                        was: String::new(),
                        now: digest[..SHOWN].to_owned(),
                        action: "accept",
                    });
                    self.digests.insert(name, digest);
                    changed = true;
                }
                kept.push(tool);
                continue;
            }
            let (was, now) = (&pinned[..SHOWN], &digest[..SHOWN]);
            let change = |action| DefinitionChange {
                server: server.to_owned(),
                tool: name.clone(),
                published: crate::publish_name(config.prefix, server, &name),
                was: was.to_owned(),
                now: now.to_owned(),
                action,
            };
            let accepted =
                config.accept.iter().any(|(n, prefix)| *n == name && digest.starts_with(prefix));
            if accepted {
                info!(server, tool = %name, was, now, "changed tool definition accepted (accept)");
                crate::metrics::definition_changed(server, "accepted");
                changes.push(change("accept"));
            } else if config.pin_definitions == PinMode::Block {
                if self.reported.insert((name.clone(), digest.clone())) {
                    error!(
                        server, tool = %name, was, now,
                        "the tool's definition changed since it was pinned; it is withheld until \
                         accepted: add \"{name}@{now}\" to `accept` of this server"
                    );
                    crate::metrics::definition_changed(server, "block");
                    changes.push(change("block"));
                }
                continue;
            } else {
                changes.push(change("warn"));
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
        // A withheld definition that is served now (accepted) is reported again if it recurs.
        if !self.reported.is_empty() {
            let served: HashSet<&str> = kept.iter().map(|t| t.name.as_ref()).collect();
            self.reported.retain(|(name, _)| !served.contains(name.as_str()));
        }
        Checked { tools: kept, changed, changes }
    }

    /// Writes the pins, replacing the file whole (written beside it, then renamed).
    pub(crate) fn store(&mut self) -> io::Result<()> {
        let Some(path) = &self.path else { return Ok(()) };
        write(path, &self.digests)?;
        self.read_at = modified(path);
        Ok(())
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

    #[test]
    fn a_definition_accepted_in_the_file_is_read_by_the_running_process() {
        let dir = tempfile::tempdir().unwrap();
        let block = config(PinMode::Block, &[]);
        let mut pins = Pins::load(Some(dir.path()), &block);
        pins.check(&block, vec![tool("a", "adds")]);
        pins.store().unwrap();
        let rug = tool("a", "adds; and deletes your files");
        assert!(names(&pins.check(&block, vec![rug.clone()])).is_empty());
        assert!(pins.withholds());

        let now = digest(&rug);
        let refused = accept(dir.path(), "s", "a@xyz").unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::InvalidInput);
        accept(dir.path(), "s", &format!("a@{}", &now[..SHOWN])).unwrap();
        let accepted = pins.check(&block, vec![rug.clone()]);
        assert_eq!(names(&accepted), ["a"]);
        assert!(accepted.changed, "the whole digest replaces the accepted digits");
        assert_eq!(accepted.changes[0].action, "accept");
        assert!(!pins.withholds());
        pins.store().unwrap();
        assert_eq!(Pins::load(Some(dir.path()), &block).digests["a"], now);
    }
}
