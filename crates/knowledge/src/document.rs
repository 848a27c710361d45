//! What callers hand the retriever and get back: documents in, passages out.

use serde_json::{Map, Value};

/// The longest document id, in bytes.
const MAX_ID_BYTES: usize = 512;

/// A document to ingest.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// Its id in the collection; ingesting an id again replaces the document.
    pub id: String,
    /// Its text.
    pub text: String,
    /// Whether the text is Markdown (chunked along its structure).
    pub markdown: bool,
    /// What the caller wants returned with its passages and filters on.
    pub metadata: Map<String, Value>,
}

/// What became of one document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentResult {
    /// The document's id.
    pub id: String,
    /// Its chunks now in the collection; 0 when it failed.
    pub chunks: usize,
    /// Why it failed; `None` when it is in.
    pub error: Option<String>,
}

/// A collection as `ListCollections` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectionInfo {
    /// The collection's name.
    pub name: String,
    /// What it holds.
    pub description: String,
    /// The tool that searches it.
    pub tool: String,
    /// Documents in it.
    pub documents: u64,
    /// Chunks in it.
    pub chunks: u64,
    /// The store it is in.
    pub store: String,
    /// Why the counts could not be read; `None` when they were.
    pub error: Option<String>,
}

/// One passage a search found.
#[derive(Debug, Clone, PartialEq)]
pub struct Passage {
    /// The document it is from.
    pub document_id: String,
    /// Its position among the document's chunks.
    pub chunk: u64,
    /// Its score; higher is better (a fused rank score).
    pub score: f32,
    /// The passage.
    pub text: String,
    /// The document's metadata.
    pub metadata: Map<String, Value>,
}

/// Checks a document before any work: an id, text that is text, within the size limit.
pub(crate) fn check(document: &Document, max_bytes: usize) -> Result<(), String> {
    if document.id.is_empty() || document.id.len() > MAX_ID_BYTES {
        return Err(format!("a document id has 1 to {MAX_ID_BYTES} bytes"));
    }
    if document.text.len() > max_bytes {
        return Err(format!(
            "the document is {} bytes; at most {max_bytes} are accepted (knowledge.max_document_bytes)",
            document.text.len()
        ));
    }
    if document.text.contains('\0') {
        return Err("the document is not text (it holds NUL bytes)".into());
    }
    if document.text.trim().is_empty() {
        return Err("the document is empty".into());
    }
    Ok(())
}
