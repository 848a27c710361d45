//! `ListResources`, `ReadResource`, `ListPrompts` and `GetPrompt`: what MCP servers offer
//! besides tools, as far as policy lets the caller see it. Policy sees a resource or a
//! prompt as a tool of its server's source, named as the server's tools are and tagged
//! `resource` or `prompt`, so rules select them as they select tools.

use std::sync::Arc;

use rmcp::model::{
    CompleteRequestParams, CompleteResult, ContentBlock, GetPromptResponse, Prompt,
    ReadResourceResult, Reference, Resource, ResourceContents, ResourceTemplate, Role,
};
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

/// What one server offers that a caller sees.
pub(crate) struct Visible {
    pub(crate) server: ServerOffers,
    pub(crate) resources: Vec<Resource>,
    pub(crate) templates: Vec<ResourceTemplate>,
    pub(crate) prompts: Vec<Prompt>,
}

/// What the servers (`server`, or every one) offer that `principal` sees.
pub(crate) fn visible(
    router: &Router,
    mcp: &McpManager,
    principal: Arc<Principal>,
    server: &str,
) -> Vec<Visible> {
    let scope = scope(router, principal);
    let servers = mcp.offers().into_iter().filter(|s| server.is_empty() || s.server == server);
    servers
        .map(|server| {
            let sees = |name: &str, description: Option<&str>, tag: &str| {
                let spec = spec(&server.server, &server.published(name), description, tag);
                scope.hidden_by(&spec).is_none()
            };
            let offers = &server.offers;
            let resources = (offers.resources.iter())
                .filter(|r| sees(&r.name, r.description.as_deref(), RESOURCE_TAG))
                .cloned()
                .collect();
            let templates = (offers.templates.iter())
                .filter(|t| sees(&t.name, t.description.as_deref(), RESOURCE_TAG))
                .cloned()
                .collect();
            let prompts = (offers.prompts.iter())
                .filter(|p| sees(&p.name, p.description.as_deref(), PROMPT_TAG))
                .cloned()
                .collect();
            Visible { resources, templates, prompts, server }
        })
        .collect()
}

/// `ListResources`.
pub(crate) fn list_resources(
    router: &Router,
    mcp: &McpManager,
    principal: Arc<Principal>,
    request: v1::ListResourcesRequest,
) -> v1::ListResourcesResponse {
    let mut listed = v1::ListResourcesResponse::default();
    for visible in visible(router, mcp, principal, &request.server) {
        let server = &visible.server.server;
        listed.resources.extend(visible.resources.into_iter().map(|resource| v1::Resource {
            meta_json: json_or_empty(resource.meta.as_ref()),
            annotations_json: json_or_empty(resource.annotations.as_ref()),
            uri: resource.uri,
            name: resource.name,
            title: resource.title.unwrap_or_default(),
            description: resource.description.unwrap_or_default(),
            mime_type: resource.mime_type.unwrap_or_default(),
            size: resource.size,
            server: server.clone(),
        }));
        listed.templates.extend(visible.templates.into_iter().map(|template| {
            v1::ResourceTemplate {
                meta_json: json_or_empty(template.meta.as_ref()),
                uri_template: template.uri_template,
                name: template.name,
                title: template.title.unwrap_or_default(),
                description: template.description.unwrap_or_default(),
                mime_type: template.mime_type.unwrap_or_default(),
                server: server.clone(),
            }
        }));
    }
    listed
}

/// Reads `uri` from the server that offers it (`server`, when named), if policy lets
/// `principal` see it there (a resource neither listed nor matched by a template is seen
/// by its URI); returns the server and its answer.
pub(crate) async fn read(
    router: &Router,
    mcp: &McpManager,
    principal: Arc<Principal>,
    uri: &str,
    server: Option<&str>,
) -> Result<(String, ReadResourceResult), OfferError> {
    let server = readable(router, mcp, principal, uri, server)?;
    let result = mcp.read_resource(&server, uri).await?;
    Ok((server, result))
}

/// The server `principal` reads the resource `uri` from (`server`, when given), if policy
/// lets it see the resource.
pub(crate) fn readable(
    router: &Router,
    mcp: &McpManager,
    principal: Arc<Principal>,
    uri: &str,
    server: Option<&str>,
) -> Result<String, OfferError> {
    let route = mcp.resource(uri, server)?;
    let name = route.name.as_deref().unwrap_or(uri);
    let seen = spec(&route.server, name, route.description.as_deref(), RESOURCE_TAG);
    if scope(router, principal).hidden_by(&seen).is_some() {
        return Err(OfferError::NotFound(format!("no mcp server offers the resource {uri:?}")));
    }
    Ok(route.server)
}

/// Completes an argument of a prompt (named as the catalog names it) or of a resource
/// template, if policy lets `principal` see it, as the server that offers it completes it.
pub(crate) async fn complete(
    router: &Router,
    mcp: &McpManager,
    principal: Arc<Principal>,
    mut params: CompleteRequestParams,
) -> Result<CompleteResult, OfferError> {
    let (server, seen) = match &mut params.r#ref {
        Reference::Prompt(prompt) => {
            let (server, on_server) = mcp.prompt(&prompt.name)?;
            let seen = spec(&server, &prompt.name, None, PROMPT_TAG);
            prompt.name = on_server;
            (server, seen)
        }
        Reference::Resource(template) => {
            let route = mcp.template(&template.uri)?;
            let name = route.name.as_deref().unwrap_or(&template.uri);
            let seen = spec(&route.server, name, None, RESOURCE_TAG);
            (route.server, seen)
        }
        other => {
            return Err(OfferError::NotFound(format!(
                "cannot complete for the reference {other:?}"
            )));
        }
    };
    if scope(router, principal).hidden_by(&seen).is_some() {
        return Err(OfferError::NotFound(format!("nothing to complete for {:?}", seen.name)));
    }
    mcp.complete(&server, params).await
}

/// `ReadResource`.
pub(crate) async fn read_resource(
    router: &Router,
    mcp: &McpManager,
    principal: Arc<Principal>,
    request: v1::ReadResourceRequest,
) -> Result<v1::ReadResourceResponse, Status> {
    if request.uri.is_empty() {
        return Err(Status::invalid_argument("uri: a resource URI is required"));
    }
    let (server, result) = read(router, mcp, principal, &request.uri, Some(&request.server))
        .await
        .map_err(|e| status(&e))?;
    let contents = result.contents.into_iter().map(resource_contents).collect();
    Ok(v1::ReadResourceResponse { contents, server })
}

/// Gets the prompt the catalog names `name`, if policy lets `principal` see it.
pub(crate) async fn get(
    router: &Router,
    mcp: &McpManager,
    principal: Arc<Principal>,
    name: &str,
    arguments: Option<Map<String, Value>>,
    rounds: Option<&toolmesh_core::InputRounds>,
) -> Result<GetPromptResponse, OfferError> {
    let (server, on_server) = mcp.prompt(name)?;
    let seen = spec(&server, name, None, PROMPT_TAG);
    if scope(router, principal).hidden_by(&seen).is_some() {
        return Err(OfferError::NotFound(format!("no mcp server offers the prompt {name:?}")));
    }
    mcp.get_prompt(&server, &on_server, arguments, rounds).await
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
    let mut listed = v1::ListPromptsResponse::default();
    for visible in visible(router, mcp, principal, &request.server) {
        listed.prompts.extend(visible.prompts.iter().map(|p| prompt(&visible.server, p)));
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
    let arguments: Map<String, Value> =
        request.arguments.into_iter().map(|(k, v)| (k, Value::String(v))).collect();
    let arguments = (!arguments.is_empty()).then_some(arguments);
    let got = get(router, mcp, principal, &request.name, arguments, None).await;
    let GetPromptResponse::Complete(result) = got.map_err(|e| status(&e))? else {
        return Err(Status::failed_precondition(
            "the prompt asks its caller for input, which only an MCP client can give",
        ));
    };
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
