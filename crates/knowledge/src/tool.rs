//! The search tool of a collection.

use std::sync::Arc;

use serde_json::{Map, Value, json};
use toolmesh_core::{
    Backend, BackendError, CallContext, ErrorCode, SourceKind, ToolAnnotations, ToolOutput,
    ToolSource, ToolSpec,
};

use crate::{
    KnowledgeError, Passage,
    config::{CollectionConfig, MAX_ANSWER_BYTES, MAX_TOP_K},
    shared::Shared,
};

/// `search_<collection>`: the passages of a collection that best match a query.
pub(crate) struct SearchTool {
    shared: Arc<Shared>,
    collection: String,
}

impl SearchTool {
    pub(crate) fn new(shared: Arc<Shared>, collection: String) -> Self {
        SearchTool { shared, collection }
    }

    /// The tool's definition for `config`.
    pub(crate) fn spec(config: &CollectionConfig) -> ToolSpec {
        let filter = if config.filter_fields.is_empty() {
            // Any field is refused by name ("'author' was unexpected"), not by a count.
            json!({"type": "object", "properties": {}, "additionalProperties": false,
                   "description": "This collection has no filterable fields."})
        } else {
            json!({
                "type": "object",
                "description": format!(
                    "Only passages whose document metadata matches: field → value, or → a list of values (any of them). Fields: {}.",
                    config.filter_fields.join(", ")
                ),
                "propertyNames": {"enum": config.filter_fields},
                "additionalProperties": {"type": ["string", "integer", "boolean", "array"]}
            })
        };
        let input = json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "description": "What to look for, in natural language."},
                "top_k": {"type": "integer", "minimum": 1, "maximum": MAX_TOP_K,
                          "description": format!("How many passages to return (default {}).", config.top_k)},
                "filter": filter,
            },
            "required": ["query"],
            "additionalProperties": false
        });
        let output = json!({
            "type": "object",
            "properties": {"passages": {"type": "array", "items": {
                "type": "object",
                "properties": {
                    "document_id": {"type": "string"},
                    "chunk": {"type": "integer"},
                    "score": {"type": "number"},
                    "text": {"type": "string"},
                    "metadata": {"type": "object"}
                },
                "required": ["document_id", "chunk", "score", "text", "metadata"]
            }},
            "left_out": {"type": "integer", "description": "Passages that matched but did not fit in the answer."}},
            "required": ["passages"]
        });
        let source = ToolSource { kind: SourceKind::Knowledge, name: config.name.clone() };
        let mut spec = ToolSpec::new(config.tool_name(), config.tool_description(), input, source);
        spec.title = format!("Search {}", config.name);
        spec.output_schema = Some(Arc::new(output));
        spec.tags = vec!["knowledge".into(), "retrieval".into()];
        spec.annotations = ToolAnnotations {
            read_only: Some(true),
            destructive: Some(false),
            idempotent: Some(true),
            open_world: Some(false),
        };
        spec
    }
}

/// Renders passages for a model to read.
fn render(collection: &str, query: &str, passages: &[Passage]) -> String {
    if passages.is_empty() {
        return format!("No passages of {collection:?} match {query:?}.");
    }
    let mut out = String::new();
    for (i, p) in passages.iter().enumerate() {
        out.push_str(&format!(
            "[{}] {} (chunk {}, score {:.3})\n{}\n\n",
            i + 1,
            p.document_id,
            p.chunk,
            p.score,
            p.text.trim()
        ));
    }
    out.truncate(out.trim_end().len());
    out
}

#[async_trait::async_trait]
impl Backend for SearchTool {
    async fn call(&self, ctx: CallContext, arguments: Value) -> Result<ToolOutput, BackendError> {
        let query = arguments.get("query").and_then(Value::as_str).unwrap_or_default();
        let collection = self.shared.collection(&self.collection).map_err(failure)?;
        let top_k = arguments
            .get("top_k")
            .and_then(Value::as_u64)
            .map_or(collection.config.top_k, |k| (k as usize).clamp(1, MAX_TOP_K));
        let filter = match arguments.get("filter") {
            Some(Value::Object(filter)) => filter.clone(),
            _ => Map::new(),
        };
        let search = self.shared.search(&self.collection, query, top_k, &filter);
        let passages = tokio::select! {
            found = search => found.map_err(failure)?,
            () = ctx.cancel.cancelled() => return Err(BackendError::Cancelled),
        };
        let (passages, left_out) = within_answer(passages, MAX_ANSWER_BYTES);
        let mut structured = json!({
            "passages": passages.iter().map(|p| json!({
                "document_id": p.document_id,
                "chunk": p.chunk,
                "score": p.score,
                "text": p.text,
                "metadata": p.metadata,
            })).collect::<Vec<_>>()
        });
        let mut text = render(&self.collection, query, &passages);
        if left_out > 0 {
            structured["left_out"] = json!(left_out);
            text.push_str(&format!(
                "\n\n({left_out} more matching passages left out: an answer holds at most {} KiB)",
                MAX_ANSWER_BYTES >> 10
            ));
        }
        Ok(ToolOutput {
            content: vec![toolmesh_core::ContentPart::Text(text)],
            structured: Some(structured),
            is_error: false,
        })
    }
}

/// The passages, best first, that fit in an answer of `budget` bytes (each passage's text
/// is in it twice: rendered and structured), and how many were left out. A passage whose
/// document metadata alone does not fit goes without it.
fn within_answer(passages: Vec<Passage>, budget: usize) -> (Vec<Passage>, usize) {
    let (mut used, mut left_out) = (0, 0);
    let mut kept = Vec::with_capacity(passages.len());
    for mut passage in passages {
        let text = 2 * passage.text.len() + passage.document_id.len() + 128;
        let metadata = Value::Object(std::mem::take(&mut passage.metadata));
        let metadata_bytes = serde_json::to_string(&metadata).map_or(0, |m| m.len());
        if used + text + metadata_bytes <= budget {
            used += text + metadata_bytes;
            let Value::Object(metadata) = metadata else { unreachable!("made an object above") };
            passage.metadata = metadata;
            kept.push(passage);
        } else if used + text <= budget && metadata_bytes > budget / 4 {
            used += text;
            kept.push(passage);
        } else {
            left_out += 1;
        }
    }
    (kept, left_out)
}

fn failure(error: KnowledgeError) -> BackendError {
    match error.code() {
        ErrorCode::InvalidArgument => BackendError::InvalidArguments(error.to_string()),
        ErrorCode::Unavailable => {
            BackendError::Unavailable { backend: "knowledge".into(), reason: error.to_string() }
        }
        code => BackendError::Remote { code, message: error.to_string() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passage(id: &str, text_bytes: usize, metadata_bytes: usize) -> Passage {
        let mut metadata = Map::new();
        if metadata_bytes > 0 {
            metadata.insert("blob".into(), Value::String("m".repeat(metadata_bytes)));
        }
        Passage {
            document_id: id.into(),
            chunk: 0,
            score: 1.0,
            text: "t".repeat(text_bytes),
            metadata,
        }
    }

    #[test]
    fn an_answer_keeps_the_best_passages_that_fit_and_counts_the_rest() {
        let passages = vec![
            passage("a", 4096, 10),
            passage("huge-metadata", 4096, 1 << 20),
            passage("too-long", 200_000, 0),
            passage("b", 4096, 10),
        ];
        let (kept, left_out) = within_answer(passages, 64 << 10);
        let ids: Vec<_> = kept.iter().map(|p| p.document_id.as_str()).collect();
        assert_eq!(ids, ["a", "huge-metadata", "b"]);
        assert!(kept[1].metadata.is_empty(), "metadata that cannot fit is left out");
        assert_eq!(kept[0].metadata.len(), 1);
        assert_eq!(left_out, 1);
    }
}
