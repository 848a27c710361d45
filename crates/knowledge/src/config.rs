//! `[knowledge]`: the collections, each a search tool.

use serde::Deserialize;
use toolmesh_core::validate_tool_name;

/// The name of the configuration section.
pub const SECTION: &str = "knowledge";

/// `[knowledge]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KnowledgeConfig {
    /// `[[knowledge.collections]]`.
    pub collections: Vec<CollectionConfig>,
    /// The longest document accepted, in bytes.
    pub max_document_bytes: usize,
    /// The role a principal needs to ingest and delete documents when callers
    /// authenticate (`[auth]`): writing into shared collections is a trust that reading
    /// them does not grant.
    pub writer_role: String,
}

impl KnowledgeConfig {
    /// The default of `max_document_bytes`: 2 MiB, well inside one gRPC message.
    pub const MAX_DOCUMENT_BYTES: usize = 2 << 20;
    /// The default of `writer_role`.
    pub const WRITER_ROLE: &str = "knowledge-writer";
}

impl Default for KnowledgeConfig {
    fn default() -> Self {
        KnowledgeConfig {
            collections: Vec::new(),
            max_document_bytes: Self::MAX_DOCUMENT_BYTES,
            writer_role: Self::WRITER_ROLE.into(),
        }
    }
}

/// `[[knowledge.collections]]`: a collection of documents, searched by one tool.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectionConfig {
    /// The collection's name: letters, digits, `_` and `-`.
    pub name: String,
    /// What the collection holds, as the model sees it in the tool's description.
    pub description: String,
    /// The tool's name; default `search_<name>`.
    #[serde(default)]
    pub tool_name: Option<String>,
    /// The tool's whole description; default one made from `description`.
    #[serde(default)]
    pub tool_description: Option<String>,
    /// Longest chunk, in the embedding model's tokens (at most what the model reads).
    #[serde(default = "default_chunk_tokens")]
    pub chunk_tokens: usize,
    /// Tokens a chunk repeats from the end of the one before.
    #[serde(default = "default_chunk_overlap")]
    pub chunk_overlap: usize,
    /// Longest chunk, in bytes: a "word" of thousands of characters (a data URI, minified
    /// code) is a few tokens to the model, but every byte of it goes into an answer.
    #[serde(default = "default_chunk_bytes")]
    pub chunk_bytes: usize,
    /// Passages returned when the caller names no `top_k`.
    #[serde(default = "default_top_k")]
    pub top_k: usize,
    /// Metadata fields a search may filter on (indexed in the store); a filter on another
    /// field is refused.
    #[serde(default)]
    pub filter_fields: Vec<String>,
    /// The vector store it is in: `default` (`[vector]`, also when unset) or the name of a
    /// `[vector.stores.NAME]`.
    #[serde(default)]
    pub store: Option<String>,
}

fn default_chunk_tokens() -> usize {
    120
}

fn default_chunk_overlap() -> usize {
    24
}

fn default_chunk_bytes() -> usize {
    4096
}

fn default_top_k() -> usize {
    5
}

/// The most passages one search returns.
pub const MAX_TOP_K: usize = 50;

/// The most bytes of passages (text and metadata) one search answer holds; passages past
/// it are left out, and the answer says how many.
pub(crate) const MAX_ANSWER_BYTES: usize = 256 << 10;

impl CollectionConfig {
    /// Returns the tool's name.
    pub fn tool_name(&self) -> String {
        self.tool_name.clone().unwrap_or_else(|| format!("search_{}", self.name))
    }

    /// Returns the tool's description.
    pub fn tool_description(&self) -> String {
        self.tool_description.clone().unwrap_or_else(|| {
            format!(
                "Searches the knowledge collection \"{}\": {} Returns the passages that best \
                 match the query, best first, each with its document id, position and score.",
                self.name,
                self.description.trim_end()
            )
        })
    }
}

impl toolmesh_config::Section for KnowledgeConfig {
    const NAME: &'static str = SECTION;
    const DEFAULTS: &'static str = include_str!("default.toml");

    fn read(
        value: toml::Value,
        cx: &toolmesh_config::Reading<'_>,
    ) -> Result<Self, toolmesh_config::ConfigError> {
        cx.deserialize_checked(value, KnowledgeConfig::validate)
    }
}

impl KnowledgeConfig {
    /// Checks the section: names, the tool names, chunk sizes. The error names the key.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let mut names = std::collections::HashSet::new();
        for (i, c) in self.collections.iter().enumerate() {
            let key = |field: &str| format!("knowledge.collections[{i}].{field}");
            if c.name.is_empty()
                || !c.name.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
            {
                return Err((key("name"), "letters, digits, _ and - only, not empty".into()));
            }
            if !names.insert(c.name.as_str()) {
                return Err((key("name"), format!("collection {:?} is defined twice", c.name)));
            }
            if let Err(error) = validate_tool_name(&c.tool_name()) {
                return Err((key("tool_name"), error.to_string()));
            }
            if c.chunk_tokens < 16 {
                return Err((key("chunk_tokens"), "must be at least 16".into()));
            }
            if c.chunk_overlap >= c.chunk_tokens {
                return Err((key("chunk_overlap"), "must be less than chunk_tokens".into()));
            }
            if c.chunk_bytes < 256 {
                return Err((key("chunk_bytes"), "must be at least 256".into()));
            }
            if c.top_k == 0 || c.top_k > MAX_TOP_K {
                return Err((key("top_k"), format!("must be 1 to {MAX_TOP_K}")));
            }
        }
        if self.writer_role.trim().is_empty() {
            return Err(("knowledge.writer_role".into(), "must not be empty".into()));
        }
        if self.max_document_bytes == 0 {
            return Err(("knowledge.max_document_bytes".into(), "must be more than 0".into()));
        }
        Ok(())
    }
}
