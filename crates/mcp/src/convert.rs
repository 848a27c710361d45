//! MCP ↔ toolmesh conversions.

use std::sync::Arc;

use base64::Engine as _;
use rmcp::model::{
    CallToolResult, ContentBlock, ElicitRequestParams, ElicitResult, ElicitationAction,
    ResourceContents, Tool,
};
use serde_json::Value;
use toolmesh_core::{
    ContentPart, Elicitation, ElicitationAnswer, ResourceBody, SourceKind, ToolAnnotations,
    ToolOutput, ToolSource, ToolSpec,
};

use crate::McpServerConfig;

/// Returns the catalog definition of an MCP tool published as `name` by the server of
/// `config`; its annotations are acted on only where the server's are trusted.
pub(crate) fn spec(config: &McpServerConfig, name: String, tool: &Tool) -> ToolSpec {
    let mut spec = ToolSpec::new(
        name,
        tool.description.as_deref().unwrap_or_default(),
        Value::Object((*tool.input_schema).clone()),
        ToolSource { kind: SourceKind::Mcp, name: config.name.clone() },
    );
    spec.annotations_trusted = config.trust_annotations;
    spec.title = tool
        .title
        .clone()
        .or_else(|| tool.annotations.as_ref().and_then(|a| a.title.clone()))
        .unwrap_or_default();
    spec.output_schema =
        tool.output_schema.as_ref().map(|s| Arc::new(Value::Object((**s).clone())));
    if let Some(a) = &tool.annotations {
        spec.annotations = ToolAnnotations {
            read_only: a.read_only_hint,
            destructive: a.destructive_hint,
            idempotent: a.idempotent_hint,
            open_world: a.open_world_hint,
        };
    }
    spec.timeout = Some(config.timeout);
    spec.upstream_name = (spec.name != *tool.name).then(|| tool.name.to_string());
    spec
}

fn decode(data: &str) -> bytes::Bytes {
    // A server that sends invalid base64 still gets its bytes through, undecoded.
    base64::engine::general_purpose::STANDARD
        .decode(data.as_bytes())
        .map(bytes::Bytes::from)
        .unwrap_or_else(|_| bytes::Bytes::copy_from_slice(data.as_bytes()))
}

/// Returns the toolmesh form of one MCP content block.
pub(crate) fn content(block: ContentBlock) -> ContentPart {
    match block {
        ContentBlock::Text(text) => ContentPart::Text(text.text),
        ContentBlock::Image(image) => {
            ContentPart::Media { mime_type: image.mime_type, data: decode(&image.data) }
        }
        ContentBlock::Audio(audio) => {
            ContentPart::Media { mime_type: audio.mime_type, data: decode(&audio.data) }
        }
        ContentBlock::Resource(embedded) => match embedded.resource {
            ResourceContents::TextResourceContents { uri, mime_type, text, .. } => {
                ContentPart::Resource {
                    uri,
                    mime_type: mime_type.unwrap_or_default(),
                    body: ResourceBody::Text(text),
                }
            }
            ResourceContents::BlobResourceContents { uri, mime_type, blob, .. } => {
                ContentPart::Resource {
                    uri,
                    mime_type: mime_type.unwrap_or_default(),
                    body: ResourceBody::Blob(decode(&blob)),
                }
            }
            other => ContentPart::Json(serde_json::to_value(&other).unwrap_or_default()),
        },
        ContentBlock::ResourceLink(link) => ContentPart::ResourceLink {
            uri: link.uri,
            name: link.name,
            description: link.description.unwrap_or_default(),
            mime_type: link.mime_type.unwrap_or_default(),
        },
        // Content kinds newer than this code travel as their JSON form.
        other => ContentPart::Json(serde_json::to_value(&other).unwrap_or_default()),
    }
}

/// Returns the toolmesh form of an MCP tool result.
pub(crate) fn output(result: CallToolResult) -> ToolOutput {
    ToolOutput {
        content: result.content.into_iter().map(content).collect(),
        structured: result.structured_content,
        is_error: result.is_error.unwrap_or(false),
    }
}

/// Returns the toolmesh form of an MCP elicitation; `None` for a mode this code does not know.
pub(crate) fn elicitation(params: ElicitRequestParams) -> Option<Elicitation> {
    match params {
        ElicitRequestParams::FormElicitationParams { message, requested_schema, .. } => {
            Some(Elicitation {
                message,
                requested_schema: serde_json::to_value(&requested_schema).unwrap_or_default(),
                url: None,
            })
        }
        ElicitRequestParams::UrlElicitationParams { message, url, .. } => {
            Some(Elicitation { message, requested_schema: Value::Null, url: Some(url) })
        }
        _ => None,
    }
}

/// Returns the MCP form of a caller's answer to a question with `requested_schema`. An
/// accepted form is completed with the schema's defaults for the fields the caller left
/// out (SEP-1034), as an MCP client completes it, so that the server gets what it asked for
/// whichever client answered.
pub(crate) fn elicit_result(answer: ElicitationAnswer, requested_schema: &Value) -> ElicitResult {
    match answer {
        ElicitationAnswer::Accept(mut content) => {
            with_defaults(&mut content, requested_schema);
            ElicitResult::new(ElicitationAction::Accept).with_content(content)
        }
        ElicitationAnswer::Decline => ElicitResult::new(ElicitationAction::Decline),
        ElicitationAnswer::Cancel => ElicitResult::new(ElicitationAction::Cancel),
    }
}

/// Returns the MCP form of a caller's answer to a sampling request: its `CreateMessageResult`,
/// or the error the server gets (the caller's refusal, or an answer that is no result).
#[allow(deprecated)]
pub(crate) fn sampled(
    answer: toolmesh_core::SamplingAnswer,
) -> Result<rmcp::model::CreateMessageResult, rmcp::ErrorData> {
    let result = answer.map_err(|refusal| rmcp::ErrorData::invalid_request(refusal, None))?;
    serde_json::from_value(result).map_err(|e| {
        rmcp::ErrorData::internal_error(
            format!("the caller's sampling answer is no CreateMessageResult: {e}"),
            None,
        )
    })
}

/// The round an `InputRequiredResult` asks for, in toolmesh's form (the requests as JSON).
pub(crate) fn input_round(required: rmcp::model::InputRequiredResult) -> toolmesh_core::InputRound {
    let requests = (required.input_requests.unwrap_or_default().into_iter())
        .filter_map(|(key, request)| Some((key, serde_json::to_value(request).ok()?)))
        .collect();
    toolmesh_core::InputRound { requests, state: required.request_state }
}

/// The input requests of a round in toolmesh's form, as MCP's again.
pub(crate) fn input_requests(
    requests: serde_json::Map<String, Value>,
) -> rmcp::model::InputRequests {
    (requests.into_iter())
        .filter_map(|(key, request)| Some((key, serde_json::from_value(request).ok()?)))
        .collect()
}

/// The `inputResponses` and `requestState` a caller's answers to a round send again.
pub(crate) fn answered(
    answers: &toolmesh_core::InputAnswers,
) -> (Option<rmcp::model::InputResponses>, Option<String>) {
    (Some(answers.responses.clone().into_iter().collect()), answers.state.clone())
}

/// Adds to the form `content` the default of every property of `schema` it lacks; an
/// answer without content gets the defaults alone. A value the caller gave is kept.
fn with_defaults(content: &mut Value, schema: &Value) {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return };
    let defaults = properties.iter().filter_map(|(name, p)| Some((name, p.get("default")?)));
    for (name, default) in defaults {
        if content.is_null() {
            *content = Value::Object(serde_json::Map::new());
        }
        let Some(form) = content.as_object_mut() else { return };
        form.entry(name.clone()).or_insert_with(|| default.clone());
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn accepted(content: Value, schema: &Value) -> Option<Value> {
        elicit_result(ElicitationAnswer::Accept(content), schema).content
    }

    /// SEP-1034: the fields an accepted form leaves out take their schema's defaults; what
    /// the caller gave is kept, and a field without a default stays out.
    #[test]
    fn an_accepted_form_is_completed_with_the_schemas_defaults() {
        let schema = json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "greeting": {"type": "string", "default": "hello"},
                "count": {"type": "integer", "default": 3},
                "notify": {"type": "boolean", "default": false},
                "colour": {"type": "string", "enum": ["red", "blue"], "default": "red"}
            }
        });
        assert_eq!(
            accepted(json!({"name": "Ada", "count": 5}), &schema),
            Some(
                json!({"name": "Ada", "greeting": "hello", "count": 5, "notify": false, "colour": "red"})
            )
        );
        assert_eq!(
            accepted(Value::Null, &schema),
            Some(json!({"greeting": "hello", "count": 3, "notify": false, "colour": "red"}))
        );
        let plain = json!({"type": "object", "properties": {"name": {"type": "string"}}});
        assert_eq!(accepted(json!({"name": "Ada"}), &plain), Some(json!({"name": "Ada"})));
        let declined = elicit_result(ElicitationAnswer::Decline, &schema);
        assert_eq!((declined.action, declined.content), (ElicitationAction::Decline, None));
    }
}
