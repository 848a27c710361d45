//! Conversions between core types and the API messages.

use toolmesh_core::{
    CallEvent, ContentPart, Elicitation, ElicitationAnswer, SourceKind, ToolOutput, ToolSpec,
    Toolkit,
};
use toolmesh_proto::v1;

pub(crate) fn source_kind(kind: SourceKind) -> v1::SourceKind {
    match kind {
        SourceKind::Local => v1::SourceKind::Local,
        SourceKind::Remote => v1::SourceKind::Remote,
        SourceKind::Mcp => v1::SourceKind::Mcp,
        SourceKind::Knowledge => v1::SourceKind::Knowledge,
    }
}

pub(crate) fn tool(spec: &ToolSpec, health: toolmesh_core::Health) -> v1::Tool {
    v1::Tool {
        name: spec.name.clone(),
        title: spec.title.clone(),
        description: spec.description.clone(),
        input_schema_json: spec.input_schema.to_string(),
        output_schema_json: spec.output_schema.as_ref().map(ToString::to_string),
        tags: spec.tags.clone(),
        toolkit: spec.toolkit.clone().unwrap_or_default(),
        source: Some(v1::ToolSource {
            kind: source_kind(spec.source.kind).into(),
            name: spec.source.name.clone(),
            available: health.up,
            status: health.status,
            upstream_name: spec.upstream_name.clone().unwrap_or_default(),
        }),
        annotations: Some(v1::ToolAnnotations {
            read_only: spec.annotations.read_only,
            destructive: spec.annotations.destructive,
            idempotent: spec.annotations.idempotent,
            open_world: spec.annotations.open_world,
        }),
    }
}

pub(crate) fn toolkit(toolkit: &Toolkit) -> v1::Toolkit {
    v1::Toolkit {
        name: toolkit.name.clone(),
        description: toolkit.description.clone(),
        instructions: toolkit.instructions.clone(),
        tools: toolkit.tools.clone(),
    }
}

pub(crate) fn content_part(part: ContentPart) -> v1::ContentPart {
    use v1::content_part::Part;
    let part = match part {
        ContentPart::Text(text) => Part::Text(text),
        ContentPart::Json(value) => Part::Json(value.to_string()),
        ContentPart::Media { mime_type, data } => {
            Part::Media(v1::Media { mime_type, data: data.to_vec() })
        }
        ContentPart::ResourceLink { uri, name, description, mime_type } => {
            Part::ResourceLink(v1::ResourceLink { uri, name, description, mime_type })
        }
    };
    v1::ContentPart { part: Some(part) }
}

pub(crate) fn response(call_id: String, output: ToolOutput) -> v1::CallToolResponse {
    v1::CallToolResponse {
        content: output.content.into_iter().map(content_part).collect(),
        structured_json: output.structured.map(|value| value.to_string()),
        is_error: output.is_error,
        call_id,
    }
}

pub(crate) fn event(event: CallEvent) -> v1::CallToolServerMessage {
    use v1::call_tool_server_message::Message;
    let message = match event {
        CallEvent::Progress { progress, total, message } => {
            Message::Progress(v1::Progress { progress, total, message })
        }
        CallEvent::Partial(part) => Message::Partial(content_part(part)),
    };
    v1::CallToolServerMessage { message: Some(message) }
}

pub(crate) fn elicitation(id: String, elicitation: Elicitation) -> v1::CallToolServerMessage {
    use v1::call_tool_server_message::Message;
    let requested_schema_json = match elicitation.requested_schema {
        serde_json::Value::Null => String::new(),
        schema => schema.to_string(),
    };
    v1::CallToolServerMessage {
        message: Some(Message::Elicitation(v1::ElicitationRequest {
            elicitation_id: id,
            message: elicitation.message,
            requested_schema_json,
            url: elicitation.url.unwrap_or_default(),
        })),
    }
}

/// An accepted answer whose content is not a JSON object is a cancel: the asker expects an
/// object, and a malformed answer must not reach it.
pub(crate) fn elicitation_answer(answer: &v1::ElicitationAnswer) -> ElicitationAnswer {
    match answer.action() {
        v1::ElicitationAction::Accept => match serde_json::from_str(&answer.content_json) {
            Ok(content @ serde_json::Value::Object(_)) => ElicitationAnswer::Accept(content),
            _ if answer.content_json.trim().is_empty() => {
                ElicitationAnswer::Accept(serde_json::json!({}))
            }
            _ => ElicitationAnswer::Cancel,
        },
        v1::ElicitationAction::Decline => ElicitationAnswer::Decline,
        v1::ElicitationAction::Cancel | v1::ElicitationAction::Unspecified => {
            ElicitationAnswer::Cancel
        }
    }
}
