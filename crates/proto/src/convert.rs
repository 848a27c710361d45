//! Conversions between core types and the API messages, both ways: the router's answers,
//! and what remote workers announce and return.

use std::sync::Arc;

use toolmesh_core::{
    Approval, ApprovalAnswer, CallEvent, ContentPart, Elicitation, ElicitationAnswer, ErrorCode,
    ResourceBody, Sampling, SamplingAnswer, SourceKind, ToolAnnotations, ToolOutput, ToolSource,
    ToolSpec, Toolkit,
};

use crate::v1;

/// The API's source kind.
pub fn source_kind(kind: SourceKind) -> v1::SourceKind {
    match kind {
        SourceKind::Local => v1::SourceKind::Local,
        SourceKind::Remote => v1::SourceKind::Remote,
        SourceKind::Mcp => v1::SourceKind::Mcp,
        SourceKind::Knowledge => v1::SourceKind::Knowledge,
    }
}

/// The API's definition of a tool, with the health of its source.
pub fn tool(spec: &ToolSpec, health: toolmesh_core::Health) -> v1::Tool {
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
            untrusted: !spec.annotations_trusted,
        }),
    }
}

/// The API's toolkit.
pub fn toolkit(toolkit: &Toolkit) -> v1::Toolkit {
    v1::Toolkit {
        name: toolkit.name.clone(),
        description: toolkit.description.clone(),
        instructions: toolkit.instructions.clone(),
        tools: toolkit.tools.clone(),
    }
}

/// The API's content part.
pub fn content_part(part: ContentPart) -> v1::ContentPart {
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
        ContentPart::Resource { uri, mime_type, body } => Part::Resource(v1::ResourceContents {
            uri,
            mime_type,
            body: Some(match body {
                ResourceBody::Text(text) => v1::resource_contents::Body::Text(text),
                ResourceBody::Blob(data) => v1::resource_contents::Body::Blob(data.to_vec()),
            }),
            meta_json: String::new(),
        }),
    };
    v1::ContentPart { part: Some(part) }
}

/// The API's result of call `call_id`.
pub fn response(call_id: String, output: ToolOutput) -> v1::CallToolResponse {
    v1::CallToolResponse {
        content: output.content.into_iter().map(content_part).collect(),
        structured_json: output.structured.map(|value| value.to_string()),
        is_error: output.is_error,
        call_id,
    }
}

/// The stream message of a progress report, partial output or log message.
pub fn event(event: CallEvent) -> v1::CallToolServerMessage {
    use v1::call_tool_server_message::Message;
    let message = match event {
        CallEvent::Progress { progress, total, message } => {
            Message::Progress(v1::Progress { progress, total, message })
        }
        CallEvent::Partial(part) => Message::Partial(content_part(part)),
        CallEvent::Log { level, logger, data } => {
            Message::Log(v1::LogMessage { level, logger, data_json: data.to_string() })
        }
    };
    v1::CallToolServerMessage { message: Some(message) }
}

/// The stream message asking the caller to approve a call.
pub fn approval(approval: Approval) -> v1::CallToolServerMessage {
    use v1::call_tool_server_message::Message;
    let expires_at_unix_ms = approval
        .expires_at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    v1::CallToolServerMessage {
        message: Some(Message::Approval(v1::ApprovalRequest {
            approval_id: approval.id,
            tool: approval.tool,
            arguments_json: approval.arguments_json,
            rule: approval.rule,
            reason: approval.reason,
            expires_at_unix_ms,
        })),
    }
}

/// Returns the core form of a client's approval answer.
pub fn approval_answer(answer: v1::ApprovalAnswer) -> ApprovalAnswer {
    ApprovalAnswer { id: answer.approval_id, approved: answer.approved, note: answer.note }
}

/// The stream message of an elicitation, named `id`.
pub fn elicitation(id: String, elicitation: Elicitation) -> v1::CallToolServerMessage {
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
pub fn elicitation_answer(answer: &v1::ElicitationAnswer) -> ElicitationAnswer {
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

/// A sampling request as the message that asks the caller, named `id`.
pub fn sampling(id: String, sampling: Sampling) -> v1::CallToolServerMessage {
    use v1::call_tool_server_message::Message;
    v1::CallToolServerMessage {
        message: Some(Message::Sampling(v1::SamplingRequest {
            sampling_id: id,
            params_json: sampling.params.to_string(),
        })),
    }
}

/// The caller's answer to a sampling request: its result, when it is a JSON object, or its
/// refusal.
pub fn sampling_answer(answer: &v1::SamplingAnswer) -> SamplingAnswer {
    if !answer.error.is_empty() {
        return Err(answer.error.clone());
    }
    match serde_json::from_str(&answer.result_json) {
        Ok(result @ serde_json::Value::Object(_)) => Ok(result),
        _ => Err("the caller's sampling answer is not a JSON object".into()),
    }
}

/// The spec of `tool` as a remote worker announced it, from `source`: its schemas parsed,
/// its source and toolkit those the router gives it. A schema that is not JSON is named.
pub fn announced_spec(tool: &v1::Tool, source: ToolSource) -> Result<ToolSpec, String> {
    let input = if tool.input_schema_json.trim().is_empty() {
        serde_json::json!({"type": "object"})
    } else {
        serde_json::from_str(&tool.input_schema_json)
            .map_err(|e| format!("tool {}: input_schema_json is not JSON: {e}", tool.name))?
    };
    let output = match &tool.output_schema_json {
        Some(schema) => Some(Arc::new(
            serde_json::from_str(schema)
                .map_err(|e| format!("tool {}: output_schema_json is not JSON: {e}", tool.name))?,
        )),
        None => None,
    };
    let mut spec = ToolSpec::new(&tool.name, &tool.description, input, source);
    spec.title = tool.title.clone();
    spec.validate_output = output.is_some();
    spec.output_schema = output;
    spec.tags = tool.tags.clone();
    if let Some(a) = &tool.annotations {
        spec.annotations = ToolAnnotations {
            read_only: a.read_only,
            destructive: a.destructive,
            idempotent: a.idempotent,
            open_world: a.open_world,
        };
        spec.annotations_trusted = !a.untrusted;
    }
    Ok(spec)
}

/// The content part of an API message; `None` for an empty one (an unknown kind).
pub fn part(part: v1::ContentPart) -> Option<ContentPart> {
    use v1::content_part::Part;
    Some(match part.part? {
        Part::Text(text) => ContentPart::Text(text),
        Part::Json(json) => match serde_json::from_str(&json) {
            Ok(value) => ContentPart::Json(value),
            // Not JSON after all: the text is not lost.
            Err(_) => ContentPart::Text(json),
        },
        Part::Media(media) => {
            ContentPart::Media { mime_type: media.mime_type, data: media.data.into() }
        }
        Part::ResourceLink(link) => ContentPart::ResourceLink {
            uri: link.uri,
            name: link.name,
            description: link.description,
            mime_type: link.mime_type,
        },
        Part::Resource(resource) => ContentPart::Resource {
            uri: resource.uri,
            mime_type: resource.mime_type,
            body: match resource.body? {
                v1::resource_contents::Body::Text(text) => ResourceBody::Text(text),
                v1::resource_contents::Body::Blob(blob) => ResourceBody::Blob(blob.into()),
            },
        },
    })
}

/// The output of an API result. A structured result that is not JSON makes the result an
/// error saying so, rather than a success without it.
pub fn output(response: v1::CallToolResponse) -> ToolOutput {
    let mut content: Vec<ContentPart> = response.content.into_iter().filter_map(part).collect();
    let (structured, is_error) = match response.structured_json.map(|s| serde_json::from_str(&s)) {
        None => (None, response.is_error),
        Some(Ok(value)) => (Some(value), response.is_error),
        Some(Err(error)) => {
            content.push(ContentPart::Text(format!("the structured result is not JSON: {error}")));
            (None, true)
        }
    };
    ToolOutput { content, structured, is_error }
}

/// The error code of a gRPC status code number, as a remote side reports it; a code
/// toolmesh does not report itself is `Internal`.
pub fn error_code(code: u32) -> ErrorCode {
    match tonic::Code::from(code as i32) {
        tonic::Code::InvalidArgument | tonic::Code::OutOfRange => ErrorCode::InvalidArgument,
        tonic::Code::NotFound => ErrorCode::NotFound,
        tonic::Code::FailedPrecondition | tonic::Code::Aborted => ErrorCode::FailedPrecondition,
        tonic::Code::PermissionDenied => ErrorCode::PermissionDenied,
        tonic::Code::DeadlineExceeded => ErrorCode::DeadlineExceeded,
        tonic::Code::ResourceExhausted => ErrorCode::ResourceExhausted,
        tonic::Code::Cancelled => ErrorCode::Cancelled,
        tonic::Code::Unavailable => ErrorCode::Unavailable,
        _ => ErrorCode::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_content_part_survives_the_api() {
        let parts = [
            ContentPart::Text("hi".into()),
            ContentPart::Json(serde_json::json!({"a": 1})),
            ContentPart::Media { mime_type: "image/png".into(), data: vec![1, 2].into() },
            ContentPart::ResourceLink {
                uri: "test://a".into(),
                name: "a".into(),
                description: String::new(),
                mime_type: "text/plain".into(),
            },
            ContentPart::Resource {
                uri: "test://b".into(),
                mime_type: "text/plain".into(),
                body: ResourceBody::Text("b".into()),
            },
            ContentPart::Resource {
                uri: "test://c".into(),
                mime_type: "image/png".into(),
                body: ResourceBody::Blob(vec![0, 255].into()),
            },
        ];
        for original in parts {
            assert_eq!(part(content_part(original.clone())), Some(original));
        }
    }
}
