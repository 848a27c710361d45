//! What an MCP server offers besides tools: resources, resource templates and prompts. They
//! are listed when the server connects and again when it says they changed, and read or
//! got through the server that offers them.

use rmcp::{
    ErrorData, RoleClient,
    model::{
        ClientRequest, CompleteRequest, CompleteRequestParams, CompleteResult, GetPromptRequest,
        GetPromptRequestParams, GetPromptResponse, JsonObject, ListPromptsRequest,
        ListResourceTemplatesRequest, ListResourcesRequest, Prompt, ReadResourceRequest,
        ReadResourceRequestParams, ReadResourceResult, RequestMetaObject, Resource,
        ResourceTemplate, ServerNotification, ServerResult, SubscribeRequestParams,
        SubscriptionFilter, UnsubscribeRequestParams,
    },
    service::{Peer, PeerRequestOptions, ServiceError},
};
use toolmesh_core::InputRounds;

use crate::backend::CAPABILITIES_META;

/// A resource a client subscribed to changed: the server said so with
/// `notifications/resources/updated`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceUpdate {
    /// The server whose resource it is.
    pub server: String,
    /// The resource's URI.
    pub uri: String,
}

/// What the servers tell the readers of their offers, shared by every server: a version
/// that changes with their listings, and the updates of subscribed resources.
#[derive(Debug)]
pub(crate) struct OfferSignals {
    pub(crate) changed: tokio::sync::watch::Sender<u64>,
    pub(crate) updated: tokio::sync::broadcast::Sender<ResourceUpdate>,
}

/// Updates of subscribed resources a slow reader may fall behind by before it loses some.
const UPDATES_BUFFERED: usize = 256;

impl Default for OfferSignals {
    fn default() -> Self {
        OfferSignals {
            changed: tokio::sync::watch::channel(0).0,
            updated: tokio::sync::broadcast::channel(UPDATES_BUFFERED).0,
        }
    }
}

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

/// Whether the server on `peer` offers resource subscriptions.
pub(crate) fn subscribable(peer: &Peer<RoleClient>) -> bool {
    peer.peer_info()
        .and_then(|info| info.capabilities.resources.as_ref()?.subscribe)
        .unwrap_or(false)
}

/// Whether the server on `peer` speaks 2026-07-28: it has no session, and what a 2025
/// session holds (the client's capabilities, its log level, its subscriptions, the last a
/// `subscriptions/listen` stream) goes with each request.
pub(crate) fn per_request(peer: &Peer<RoleClient>) -> bool {
    peer.peer_info()
        .is_some_and(|info| info.protocol_version >= rmcp::model::ProtocolVersion::V_2026_07_28)
}

/// Follows the updates of the resources clients subscribed to on a 2026-07-28 connection:
/// one `subscriptions/listen` stream for the resources in `subscribed`, opened again
/// whenever they change, its `notifications/resources/updated` passed on as `server`'s.
pub(crate) async fn follow_resources(
    peer: Peer<RoleClient>,
    server: String,
    mut subscribed: tokio::sync::watch::Receiver<std::collections::BTreeMap<String, usize>>,
    updated: tokio::sync::broadcast::Sender<ResourceUpdate>,
    lost: tokio_util::sync::CancellationToken,
) {
    loop {
        let uris: Vec<String> = subscribed.borrow_and_update().keys().cloned().collect();
        let mut subscription = None;
        if !uris.is_empty() {
            let filter = SubscriptionFilter::builder().resource_subscriptions(uris).build();
            match peer.listen(filter).await {
                Ok(listening) => subscription = Some(listening),
                Err(error) => tracing::warn!(%server, %error, "subscribing to resources failed"),
            }
        }
        // This stream is followed until the resources change (or it ends, and then until
        // they change).
        loop {
            let next = async {
                match subscription.as_mut() {
                    Some(listening) => listening.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = lost.cancelled() => return,
                changed = subscribed.changed() => match changed {
                    Ok(()) => break,
                    Err(_) => return,
                },
                next = next => match next {
                    Ok(Some(ServerNotification::ResourceUpdatedNotification(update))) => {
                        let uri = update.params.uri;
                        let _ = updated.send(ResourceUpdate { server: server.clone(), uri });
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => subscription = None,
                },
            }
        }
    }
}

/// Subscribes to the resource `uri` of the server on `peer` (`resources/subscribe`, the
/// 2025 revisions' way).
#[allow(deprecated)]
pub(crate) async fn subscribe(peer: &Peer<RoleClient>, uri: &str) -> Result<(), ServiceError> {
    let request = rmcp::model::SubscribeRequest::new(SubscribeRequestParams::new(uri));
    peer.send_request(ClientRequest::SubscribeRequest(request)).await.map(|_| ())
}

/// Ends the subscription to the resource `uri` of the server on `peer`.
#[allow(deprecated)]
pub(crate) async fn unsubscribe(peer: &Peer<RoleClient>, uri: &str) -> Result<(), ServiceError> {
    let request = rmcp::model::UnsubscribeRequest::new(UnsubscribeRequestParams::new(uri));
    peer.send_request(ClientRequest::UnsubscribeRequest(request)).await.map(|_| ())
}

/// Gets the prompt `name` (its name on the server) with `arguments`. For a caller that
/// answers input rounds itself (`rounds`), its answers go with the request and a round the
/// server asks for is its answer; any other caller gets a server's round as an error.
pub(crate) async fn get_prompt(
    peer: &Peer<RoleClient>,
    name: &str,
    arguments: Option<JsonObject>,
    rounds: Option<&InputRounds>,
) -> Result<GetPromptResponse, ServiceError> {
    let mut params = GetPromptRequestParams::new(name);
    params.arguments = arguments;
    let mut options = PeerRequestOptions::default();
    if let Some(rounds) = rounds {
        if let Some(answers) = &rounds.answers {
            (params.input_responses, params.request_state) = crate::convert::answered(answers);
        }
        if per_request(peer) {
            let mut meta = RequestMetaObject::default();
            meta.0.0.insert(CAPABILITIES_META.into(), rounds.capabilities.clone());
            options.meta = Some(meta);
        }
    }
    let request = ClientRequest::GetPromptRequest(GetPromptRequest::new(params));
    match peer.send_request_with_option(request, options).await?.await_response().await? {
        ServerResult::GetPromptResult(result) => Ok(GetPromptResponse::Complete(result)),
        ServerResult::InputRequiredResult(required) if rounds.is_some() => {
            Ok(GetPromptResponse::InputRequired(required))
        }
        ServerResult::InputRequiredResult(_) => Err(ServiceError::McpError(ErrorData::new(
            rmcp::model::ErrorCode::INVALID_REQUEST,
            "the prompt asks its caller for input, which only an MCP client can give",
            None,
        ))),
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
