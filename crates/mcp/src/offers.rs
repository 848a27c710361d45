//! What an MCP server offers besides tools: resources, resource templates and prompts. They
//! are listed when the server connects and again when it says they changed, and read or
//! got through the server that offers them.

use rmcp::{
    RoleClient,
    model::{
        ClientRequest, CompleteRequest, CompleteRequestParams, CompleteResult, GetPromptRequest,
        GetPromptRequestParams, GetPromptResult, JsonObject, ListPromptsRequest,
        ListResourceTemplatesRequest, ListResourcesRequest, Prompt, ReadResourceRequest,
        ReadResourceRequestParams, ReadResourceResult, Resource, ResourceTemplate, ServerResult,
    },
    service::{Peer, ServiceError},
};

/// One server's resources, resource templates and prompts, as it lists them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Offers {
    /// Its resources.
    pub resources: Vec<Resource>,
    /// Its resource templates.
    pub templates: Vec<ResourceTemplate>,
    /// Its prompts, by their name on the server.
    pub prompts: Vec<Prompt>,
}

impl Offers {
    /// The name (on the server) and description of the resource `uri` the server lists.
    pub(crate) fn listed(&self, uri: &str) -> Option<(&str, Option<&str>)> {
        let resource = self.resources.iter().find(|r| r.uri == uri)?;
        Some((&resource.name, resource.description.as_deref()))
    }

    /// The name (on the server) and description of the server's first template that
    /// matches the resource `uri`, or that is `uri` when `uri` is a template.
    pub(crate) fn template(&self, uri: &str) -> Option<(&str, Option<&str>)> {
        let mut templates = self.templates.iter();
        let template =
            templates.find(|t| t.uri_template == uri || template_matches(&t.uri_template, uri))?;
        Some((&template.name, template.description.as_deref()))
    }
}

/// Lists what the server connected on `peer` offers, as far as its capabilities say it
/// offers anything.
pub(crate) async fn list(peer: &Peer<RoleClient>) -> Result<Offers, ServiceError> {
    let capabilities = peer.peer_info().map(|info| info.capabilities.clone()).unwrap_or_default();
    let mut offers = Offers::default();
    if capabilities.resources.is_some() {
        offers.resources = crate::listing::pages(
            peer,
            |page| ClientRequest::ListResourcesRequest(ListResourcesRequest::with_param(page)),
            |result| match result {
                ServerResult::ListResourcesResult(r) => Some((r.resources, r.next_cursor)),
                _ => None,
            },
        )
        .await?;
        // Templates are optional even for a server with resources.
        offers.templates = crate::listing::pages(
            peer,
            |page| {
                ClientRequest::ListResourceTemplatesRequest(
                    ListResourceTemplatesRequest::with_param(page),
                )
            },
            |result| match result {
                ServerResult::ListResourceTemplatesResult(r) => {
                    Some((r.resource_templates, r.next_cursor))
                }
                _ => None,
            },
        )
        .await
        .unwrap_or_default();
    }
    if capabilities.prompts.is_some() {
        offers.prompts = crate::listing::pages(
            peer,
            |page| ClientRequest::ListPromptsRequest(ListPromptsRequest::with_param(page)),
            |result| match result {
                ServerResult::ListPromptsResult(r) => Some((r.prompts, r.next_cursor)),
                _ => None,
            },
        )
        .await?;
    }
    Ok(offers)
}

/// Reads the resource `uri` from the server on `peer`.
pub(crate) async fn read(
    peer: &Peer<RoleClient>,
    uri: &str,
) -> Result<ReadResourceResult, ServiceError> {
    let request = ReadResourceRequest::new(ReadResourceRequestParams::new(uri));
    match peer.send_request(ClientRequest::ReadResourceRequest(request)).await? {
        ServerResult::ReadResourceResult(result) => Ok(result),
        _ => Err(ServiceError::UnexpectedResponse),
    }
}

/// Gets the prompt `name` (its name on the server) with `arguments`.
pub(crate) async fn get_prompt(
    peer: &Peer<RoleClient>,
    name: &str,
    arguments: Option<JsonObject>,
) -> Result<GetPromptResult, ServiceError> {
    let mut params = GetPromptRequestParams::new(name);
    params.arguments = arguments;
    let request = GetPromptRequest::new(params);
    match peer.send_request(ClientRequest::GetPromptRequest(request)).await? {
        ServerResult::GetPromptResult(result) => Ok(result),
        _ => Err(ServiceError::UnexpectedResponse),
    }
}

/// Asks the server on `peer` to complete an argument.
pub(crate) async fn complete(
    peer: &Peer<RoleClient>,
    params: CompleteRequestParams,
) -> Result<CompleteResult, ServiceError> {
    let request = CompleteRequest::new(params);
    match peer.send_request(ClientRequest::CompleteRequest(request)).await? {
        ServerResult::CompleteResult(result) => Ok(result),
        _ => Err(ServiceError::UnexpectedResponse),
    }
}

/// Whether `uri` is one the URI template `template` (RFC 6570) expands to: its literal
/// parts in order, each expression standing for any text, and a trailing query or fragment
/// expression (`{?a,b}`) for any query or none.
pub(crate) fn template_matches(template: &str, uri: &str) -> bool {
    let mut pattern = String::with_capacity(template.len());
    let mut rest = template;
    let mut optional_tail = false;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else { return false };
        pattern.push_str(&rest[..open]);
        let expression = &rest[open + 1..open + close];
        rest = &rest[open + close + 1..];
        if rest.is_empty() && matches!(expression.chars().next(), Some('?' | '&' | '#')) {
            optional_tail = true;
        } else {
            pattern.push('*');
        }
    }
    pattern.push_str(rest);
    toolmesh_config::glob(&pattern, uri)
        || optional_tail
            && uri
                .char_indices()
                .filter(|(_, c)| matches!(c, '?' | '&' | '#'))
                .any(|(at, _)| toolmesh_config::glob(&pattern, &uri[..at]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_match_what_they_expand_to() {
        assert!(template_matches("test://template/{id}/data", "test://template/7/data"));
        assert!(!template_matches("test://template/{id}/data", "test://template/7/other"));
        assert!(template_matches("file:///{+path}", "file:///etc/hosts"));
        assert!(template_matches("https://x.io/search{?q,lang}", "https://x.io/search?q=a"));
        assert!(template_matches("https://x.io/search{?q,lang}", "https://x.io/search"));
        assert!(!template_matches("https://x.io/search{?q,lang}", "https://x.io/searching"));
        assert!(template_matches("ui://widget", "ui://widget"));
        assert!(!template_matches("ui://widget", "ui://widget2"));
        assert!(!template_matches("ui://{name", "ui://x"), "a broken template matches nothing");
    }
}
