use bytes::Bytes;
use serde_json::Value;

/// One part of a tool's output.
#[derive(Debug, Clone, PartialEq)]
pub enum ContentPart {
    /// Plain text.
    Text(String),
    /// A JSON value.
    Json(Value),
    /// An image, audio or other media.
    Media {
        /// The MIME type, for example `image/png`.
        mime_type: String,
        /// The raw bytes.
        data: Bytes,
    },
    /// A link to a resource the client may fetch.
    ResourceLink {
        /// The resource's URI.
        uri: String,
        /// Its name.
        name: String,
        /// Its description; may be empty.
        description: String,
        /// Its MIME type; may be empty.
        mime_type: String,
    },
    /// A resource's contents, embedded in the output.
    Resource {
        /// The resource's URI.
        uri: String,
        /// Its MIME type; may be empty.
        mime_type: String,
        /// Its contents.
        body: ResourceBody,
    },
}

/// The contents of an embedded resource.
#[derive(Debug, Clone, PartialEq)]
pub enum ResourceBody {
    /// Text.
    Text(String),
    /// Bytes.
    Blob(Bytes),
}

/// The result of a tool call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolOutput {
    /// The output parts, in order.
    pub content: Vec<ContentPart>,
    /// The structured result, when the tool produced one.
    pub structured: Option<Value>,
    /// The tool itself failed; `content` explains the failure to the model.
    pub is_error: bool,
}

impl ToolOutput {
    /// Returns a successful output of one text part.
    pub fn text(text: impl Into<String>) -> Self {
        ToolOutput {
            content: vec![ContentPart::Text(text.into())],
            structured: None,
            is_error: false,
        }
    }

    /// Returns a successful output whose structured result is `value`, with the same value
    /// as a JSON part for clients that read only content.
    pub fn json(value: Value) -> Self {
        ToolOutput {
            content: vec![ContentPart::Json(value.clone())],
            structured: Some(value),
            is_error: false,
        }
    }

    /// Returns a tool-level failure with one text part describing it.
    pub fn error(message: impl Into<String>) -> Self {
        ToolOutput {
            content: vec![ContentPart::Text(message.into())],
            structured: None,
            is_error: true,
        }
    }
}
