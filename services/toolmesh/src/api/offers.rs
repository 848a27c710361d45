//! `ListResources`, `ReadResource`, `ListPrompts` and `GetPrompt`: what MCP servers offer
//! besides tools, as far as policy lets the caller see it. Policy sees a resource or a
//! prompt as a tool of its server's source, named as the server's tools are and tagged
//! `resource` or `prompt`, so rules select them as they select tools.

use std::sync::Arc;

use rmcp::model::{ContentBlock, Prompt, ResourceContents, Role};
use serde_json::{Map, Value, json};
use tonic::Status;
use toolmesh_core::{Principal, SourceKind, ToolSource, ToolSpec};
use toolmesh_mcp::{McpManager, OfferError, ServerOffers};
use toolmesh_policy::Scope;
use toolmesh_proto::v1;
use toolmesh_router::Router;

/// The tag policy sees on a resource or a resource template.
const RESOURCE_TAG: &str = "resource";
/// The tag policy sees on a prompt.
const PROMPT_TAG: &str = "prompt";

/// What policy sees of a resource or prompt of `server` the catalog names `name`.
fn spec(server: &str, name: &str, description: Option<&str>, tag: &str) -> ToolSpec {
    let source = ToolSource { kind: SourceKind::Mcp, name: server.to_owned() };
    let mut spec =
        ToolSpec::new(name, description.unwrap_or_default(), json!({"type": "object"}), source);
    spec.tags = vec![tag.to_owned()];
    spec
}

fn scope(router: &Router, principal: Arc<Principal>) -> Scope {
    router.admission().scope(principal)
}

fn status(error: &OfferError) -> Status {
    Status::new(toolmesh_proto::status_code(error.code()), error.to_string())
}

fn json_or_empty<T: serde::Serialize>(value: Option<&T>) -> String {
    value.and_then(|v| serde_json::to_string(v).ok()).unwrap_or_default()
}

/// The servers a request names (`server`, or every one).
fn servers(mcp: &McpManager, server: &str) -> Vec<ServerOffers> {
    mcp.offers().into_iter().filter(|s| server.is_empty() || s.server == server).collect()
}

/// `ListResources`.
pub(crate) fn list_resources(
    router: &Router,
    mcp: &McpManager,
    principal: Arc<Principal>,
    request: v1::ListResourcesRequest,
) -> v1::ListResourcesResponse {
    let scope = scope(router, principal);
    let mut listed = v1::ListResourcesResponse::default();
    for server in servers(mcp, &request.server) {
        let sees = |name: &str, description: Option<&str>| {
            let spec = spec(&server.server, &server.published(name), description, RESOURCE_TAG);
            scope.hidden_by(&spec).is_none()
        };
        for resource in &server.offers.resources {
            if !sees(&resource.name, resource.description.as_deref()) {
                continue;
            }
            listed.resources.push(v1::Resource {
                uri: resource.uri.clone(),
                name: resource.name.clone(),
                title: resource.title.clone().unwrap_or_default(),
                description: resource.description.clone().unwrap_or_default(),
                mime_type: resource.mime_type.clone().unwrap_or_default(),
                size: resource.size,
                server: server.server.clone(),
                meta_json: json_or_empty(resource.meta.as_ref()),
                annotations_json: json_or_empty(resource.annotations.as_ref()),
            });
        }
        for template in &server.offers.templates {
            if !sees(&template.name, template.description.as_deref()) {
                continue;
            }
            listed.templates.push(v1::ResourceTemplate {
                uri_template: template.uri_template.clone(),
                name: template.name.clone(),
                title: template.title.clone().unwrap_or_default(),
                description: template.description.clone().unwrap_or_default(),
                mime_type: template.mime_type.clone().unwrap_or_default(),
                server: server.server.clone(),
                meta_json: json_or_empty(template.meta.as_ref()),
            });
        }
    }
    listed
}

/// `ReadResource`: from the server that offers it, if policy lets the caller see it there
/// (a resource neither listed nor matched by a template is seen by its URI).
pub(crate) async fn read_resource(
    router: &Router,
    mcp: &McpManager,
    principal: Arc<Principal>,
    request: v1::ReadResourceRequest,
) -> Result<v1::ReadResourceResponse, Status> {
    if request.uri.is_empty() {
        return Err(Status::invalid_argument("uri: a resource URI is required"));
    }
    let server =
        mcp.resource_server(&request.uri, Some(&request.server)).map_err(|e| status(&e))?;
    let offers = mcp.offers().into_iter().find(|s| s.server == server);
    let named = offers.as_ref().and_then(|offers| {
        let listed = offers.offers.resources.iter().find(|r| r.uri == request.uri);
        let listed = listed.map(|r| (r.name.clone(), r.description.clone()));
        listed.or_else(|| {
            let templates = offers.offers.templates.iter();
            let template =
                templates.filter(|t| toolmesh_mcp::template_matches(&t.uri_template, &request.uri));
            template.map(|t| (t.name.clone(), t.description.clone())).next()
        })
    });
    let (name, description) = match (&offers, named) {
        (Some(offers), Some((name, description))) => (offers.published(&name), description),
        _ => (request.uri.clone(), None),
    };
    let seen = spec(&server, &name, description.as_deref(), RESOURCE_TAG);
    if scope(router, principal).hidden_by(&seen).is_some() {
        return Err(Status::not_found(format!(
            "no mcp server offers the resource {:?}",
            request.uri
        )));
    }
    let result = mcp.read_resource(&server, &request.uri).await.map_err(|e| status(&e))?;
    let contents = result.contents.into_iter().map(resource_contents).collect();
    Ok(v1::ReadResourceResponse { contents, server })
}

fn resource_contents(contents: ResourceContents) -> v1::ResourceContents {
    use v1::resource_contents::Body;
    match contents {
        ResourceContents::TextResourceContents { uri, mime_type, text, meta } => {
            v1::ResourceContents {
                uri,
                mime_type: mime_type.unwrap_or_default(),
                body: Some(Body::Text(text)),
                meta_json: json_or_empty(meta.as_ref()),
            }
        }
        ResourceContents::BlobResourceContents { uri, mime_type, blob, meta } => {
            use base64::Engine as _;
            // A blob travels as base64 in MCP and as bytes here; one that does not decode
            // is passed on as the text it is.
            let body = match base64::engine::general_purpose::STANDARD.decode(&blob) {
                Ok(bytes) => Body::Blob(bytes),
                Err(_) => Body::Text(blob),
            };
            v1::ResourceContents {
                uri,
                mime_type: mime_type.unwrap_or_default(),
                body: Some(body),
                meta_json: json_or_empty(meta.as_ref()),
            }
        }
        // A kind newer than this code travels as its JSON form.
        other => v1::ResourceContents {
            body: Some(Body::Text(serde_json::to_string(&other).unwrap_or_default())),
            ..Default::default()
        },
    }
}

fn prompt(server: &ServerOffers, prompt: &Prompt) -> v1::Prompt {
    let arguments = prompt.arguments.iter().flatten();
    v1::Prompt {
        name: server.published(&prompt.name),
        title: prompt.title.clone().unwrap_or_default(),
        description: prompt.description.clone().unwrap_or_default(),
        arguments: arguments
            .map(|a| v1::PromptArgument {
                name: a.name.clone(),
                title: a.title.clone().unwrap_or_default(),
                description: a.description.clone().unwrap_or_default(),
                required: a.required.unwrap_or(false),
            })
            .collect(),
        server: server.server.clone(),
    }
}

/// `ListPrompts`.
pub(crate) fn list_prompts(
    router: &Router,
    mcp: &McpManager,
    principal: Arc<Principal>,
    request: v1::ListPromptsRequest,
) -> v1::ListPromptsResponse {
    let scope = scope(router, principal);
    let mut listed = v1::ListPromptsResponse::default();
    for server in servers(mcp, &request.server) {
        for offered in &server.offers.prompts {
            let name = server.published(&offered.name);
            let seen = spec(&server.server, &name, offered.description.as_deref(), PROMPT_TAG);
            if scope.hidden_by(&seen).is_none() {
                listed.prompts.push(prompt(&server, offered));
            }
        }
    }
    listed
}

/// `GetPrompt`.
pub(crate) async fn get_prompt(
    router: &Router,
    mcp: &McpManager,
    principal: Arc<Principal>,
    request: v1::GetPromptRequest,
) -> Result<v1::GetPromptResponse, Status> {
    let (server, on_server) = mcp.prompt(&request.name).map_err(|e| status(&e))?;
    let seen = spec(&server, &request.name, None, PROMPT_TAG);
    if scope(router, principal).hidden_by(&seen).is_some() {
        return Err(Status::not_found(format!(
            "no mcp server offers the prompt {:?}",
            request.name
        )));
    }
    let arguments: Map<String, Value> =
        request.arguments.into_iter().map(|(k, v)| (k, Value::String(v))).collect();
    let arguments = (!arguments.is_empty()).then_some(arguments);
    let result = mcp.get_prompt(&server, &on_server, arguments).await.map_err(|e| status(&e))?;
    let messages = result
        .messages
        .into_iter()
        .map(|message| v1::PromptMessage {
            role: match message.role {
                Role::User => "user",
                Role::Assistant => "assistant",
            }
            .to_owned(),
            content: Some(content(message.content)),
        })
        .collect();
    Ok(v1::GetPromptResponse { description: result.description.unwrap_or_default(), messages })
}

/// A prompt message's content as the API carries tool output, an embedded resource as
/// its contents.
fn content(block: ContentBlock) -> v1::ContentPart {
    match block {
        ContentBlock::Resource(embedded) => v1::ContentPart {
            part: Some(v1::content_part::Part::Resource(resource_contents(
                embedded.resource.clone(),
            ))),
        },
        other => toolmesh_proto::convert::content_part(toolmesh_mcp::content_part(other)),
    }
}
