//! Selectors: how a section names tools (routing profiles, policy rules).

/// Picks tools: by name, source, toolkit or tag; `*` in the text matches any run of
/// characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Tools whose name matches.
    Name(String),
    /// Tools of a source whose name matches.
    Source(String),
    /// Tools of a toolkit whose name matches.
    Toolkit(String),
    /// Tools with a tag that matches.
    Tag(String),
    /// Tools of a source of a kind that matches (`local`, `mcp`, `remote`, `knowledge`).
    Kind(String),
}

impl Selector {
    /// Parses `NAME`, `source:NAME`, `toolkit:NAME`, `tag:NAME` or `kind:KIND`; `Err` is
    /// the reason, for the key error that names where the selector was written.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (kind, pattern) = match text.split_once(':') {
            Some((kind, pattern)) => (Some(kind), pattern),
            None => (None, text),
        };
        if pattern.is_empty() {
            return Err(format!("`{text}`: the pattern is empty"));
        }
        let pattern = pattern.to_owned();
        match kind {
            None => Ok(Selector::Name(pattern)),
            Some("source") => Ok(Selector::Source(pattern)),
            Some("toolkit") => Ok(Selector::Toolkit(pattern)),
            Some("tag") => Ok(Selector::Tag(pattern)),
            Some("kind") => Ok(Selector::Kind(pattern)),
            Some(other) => Err(format!(
                "`{text}`: unknown selector kind `{other}` (use a tool name, source:, toolkit:, \
                 tag: or kind:)"
            )),
        }
    }

    /// Returns whether `spec` is selected.
    pub fn selects(&self, spec: &toolmesh_core::ToolSpec) -> bool {
        match self {
            Selector::Name(pattern) => glob(pattern, &spec.name),
            Selector::Source(pattern) => glob(pattern, &spec.source.name),
            Selector::Toolkit(pattern) => spec.toolkit.as_deref().is_some_and(|t| glob(pattern, t)),
            Selector::Tag(pattern) => spec.tags.iter().any(|t| glob(pattern, t)),
            Selector::Kind(pattern) => glob(pattern, spec.source.kind.as_str()),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Selector {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Selector::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Matches `text` against `pattern`, where `*` stands for any run of characters. Allocates
/// nothing: policy rules match on every call.
pub fn glob(pattern: &str, text: &str) -> bool {
    let Some((first, after)) = pattern.split_once('*') else { return pattern == text };
    let (middle, last) = after.rsplit_once('*').unwrap_or(("", after));
    if text.len() < first.len() + last.len() || !text.starts_with(first) || !text.ends_with(last) {
        return false;
    }
    // What lies between the fixed prefix and suffix must hold the middle parts, in order.
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in middle.split('*').filter(|p| !p.is_empty()) {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}
