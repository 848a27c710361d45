use std::{fmt, sync::Arc, time::Duration};

use serde_json::Value;

/// Where a tool runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SourceKind {
    /// toolmesh's own worker pool.
    Local,
    /// A remote worker process.
    Remote,
    /// An MCP server.
    Mcp,
    /// A knowledge collection.
    Knowledge,
}

impl SourceKind {
    /// Returns the lowercase name used in configuration, logs and span attributes.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Local => "local",
            SourceKind::Remote => "remote",
            SourceKind::Mcp => "mcp",
            SourceKind::Knowledge => "knowledge",
        }
    }
}

/// The origin of a tool: a source kind and the name of the server, pool or collection.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ToolSource {
    /// The kind of source.
    pub kind: SourceKind,
    /// Its name, for example `builtin`, `config` or an MCP server's name.
    pub name: String,
}

impl ToolSource {
    /// Returns a local source of the given name.
    pub fn local(name: impl Into<String>) -> Self {
        ToolSource { kind: SourceKind::Local, name: name.into() }
    }
}

impl fmt::Display for ToolSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind.as_str(), self.name)
    }
}

/// Behaviour hints, as in MCP tool annotations; `None` means unknown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToolAnnotations {
    /// The tool does not modify its environment.
    pub read_only: Option<bool>,
    /// The tool may perform destructive updates.
    pub destructive: Option<bool>,
    /// Repeating a call with the same arguments has no further effect.
    pub idempotent: Option<bool>,
    /// The tool interacts with an open world of external entities.
    pub open_world: Option<bool>,
}

impl ToolAnnotations {
    /// Whether running a call again is harmless: the tool is read-only or idempotent.
    pub fn repeatable(&self) -> bool {
        self.read_only == Some(true) || self.idempotent == Some(true)
    }
}

/// The definition of one tool, as the catalog lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// Unique name, valid as a function name for model APIs.
    pub name: String,
    /// Human-readable title; may be empty.
    pub title: String,
    /// What the tool does, written for a model.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub input_schema: Arc<Value>,
    /// JSON Schema of the structured result, when declared.
    pub output_schema: Option<Arc<Value>>,
    /// Check the structured result against `output_schema`; a violation becomes an
    /// `is_error` result naming it.
    pub validate_output: bool,
    /// Free-form labels.
    pub tags: Vec<String>,
    /// The toolkit the tool belongs to, set by the registry when a toolkit registers it.
    pub toolkit: Option<String>,
    /// Where the tool runs.
    pub source: ToolSource,
    /// The tool's own name at its source, when the catalog name differs (a prefix, a
    /// shortened name); the source is called by it.
    pub upstream_name: Option<String>,
    /// Behaviour hints, as the source states them; listed as they are.
    pub annotations: ToolAnnotations,
    /// Whether toolmesh acts on `annotations` (repeats calls, lets policy conditions read
    /// them): true for tools the operator defines, false for an MCP server's unless its
    /// configuration trusts them. See [`ToolSpec::hints`].
    pub annotations_trusted: bool,
    /// The longest a call may run; the router also honours the caller's deadline.
    pub timeout: Option<Duration>,
}

impl ToolSpec {
    /// Returns a spec with the given name, description and input schema, from `source`,
    /// with every other field empty.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
        source: ToolSource,
    ) -> Self {
        ToolSpec {
            name: name.into(),
            title: String::new(),
            description: description.into(),
            input_schema: Arc::new(input_schema),
            output_schema: None,
            validate_output: false,
            tags: Vec::new(),
            toolkit: None,
            source,
            upstream_name: None,
            annotations: ToolAnnotations::default(),
            annotations_trusted: true,
            timeout: None,
        }
    }

    /// The behaviour hints toolmesh acts on: the stated annotations where they are trusted,
    /// every hint unknown where they are not.
    pub fn hints(&self) -> ToolAnnotations {
        if self.annotations_trusted { self.annotations } else { ToolAnnotations::default() }
    }
}

/// A named group of tools with shared instructions. Toolkits do not nest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toolkit {
    /// Unique toolkit name.
    pub name: String,
    /// What the toolkit is for.
    pub description: String,
    /// How a model should use the toolkit's tools together.
    pub instructions: String,
    /// Names of its tools.
    pub tools: Vec<String>,
}

/// A tool name that model APIs would reject.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid tool name {name:?}: must match ^[a-zA-Z0-9_-]{{1,64}}$")]
pub struct InvalidToolName {
    /// The rejected name.
    pub name: String,
}

/// Checks that `name` is a valid function name for model APIs: `^[a-zA-Z0-9_-]{1,64}$`.
pub fn validate_tool_name(name: &str) -> Result<(), InvalidToolName> {
    let valid = (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if valid { Ok(()) } else { Err(InvalidToolName { name: name.to_owned() }) }
}

/// The most bytes of tool definitions one discovery answer holds (a `ListTools` page, a
/// `SearchTools` answer, a `searchTools` result): with definitions of up to 256 KiB each, a
/// count alone could make an answer larger than the 4 MiB a gRPC client reads by default.
/// A page ends early (its token leads on); a search leaves the rest out and says how many.
pub const MAX_LISTING_BYTES: usize = 2 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_follow_the_model_api_rule() {
        assert!(validate_tool_name("get_weather-2").is_ok());
        assert!(validate_tool_name(&"a".repeat(64)).is_ok());
        assert!(validate_tool_name("").is_err());
        assert!(validate_tool_name(&"a".repeat(65)).is_err());
        assert!(validate_tool_name("has space").is_err());
        assert!(validate_tool_name("dot.ted").is_err());
        assert!(validate_tool_name("ünï").is_err());
    }
}
