//! A server's tool listing: read (every page), followed (`list_changed`, the 2026-07-28
//! subscription), and made ready for the registry.

use std::sync::Arc;

use ractor::ActorRef;
use rmcp::{
    RoleClient,
    model::{
        ClientRequest, Cursor, ListToolsRequest, PaginatedRequestParams, ServerNotification,
        ServerResult, SubscriptionFilter, Tool,
    },
    service::{Peer, ServiceError},
};
use tokio_util::sync::CancellationToken;
use toolmesh_core::ToolSource;
use toolmesh_registry::ToolEntry;
use tracing::{debug, error, warn};

use crate::parallel::map_listing;
use crate::{backend::McpBackend, convert, naming::publish_name, shared::ServerShared};
use crate::{messages::McpMsg, state::Listing};

/// A listing made ready for the registry.
pub(crate) struct Prepared {
    /// The listing, kept for the next one's comparison.
    pub(crate) listing: Listing,
    /// Entries of the new and changed tools.
    pub(crate) entries: Vec<ToolEntry>,
    /// Names of the tools that did not change.
    pub(crate) unchanged: Vec<String>,
    /// Whether the listing is the one published before, every tool unchanged.
    pub(crate) same: bool,
}

/// Names the tools of a listing, compares them with the `previous` one and builds the
/// entries of those that are new or changed (an unchanged tool keeps its entry: no
/// conversion and no schema compilation when one tool of thousands changes). A name taken
/// by another source, or by two tools of the server, is logged and left out.
pub(crate) fn prepare(
    shared: &Arc<ServerShared>,
    source: &ToolSource,
    catalog: &toolmesh_registry::Catalog,
    tools: Vec<Tool>,
    previous: &Listing,
) -> Prepared {
    let config = &shared.config;
    let server = shared.name();
    let check = |tool: &Tool| {
        let same = previous.get(tool.name.as_ref()) == Some(tool);
        (publish_name(config.prefix, server, &tool.name), same)
    };
    let checked: Vec<(String, bool)> = map_listing(&tools, check);
    let mut changed: Vec<(&Tool, String)> = Vec::new();
    let mut unchanged: Vec<String> = Vec::new();
    let mut published = std::collections::HashSet::new();
    for (tool, (name, same)) in tools.iter().zip(checked) {
        let existing = catalog.get(&name);
        if let Some(existing) = existing.filter(|e| e.spec.source != *source) {
            error!(
                tool = %name, server, other = %existing.spec.source,
                "tool name collides with a tool of another source; not published (set prefix = \"always\")"
            );
            continue;
        }
        if !published.insert(name.clone()) {
            error!(tool = %name, server, "two tools of the server map to one name; the second is not published");
            continue;
        }
        if existing.is_some() && same {
            unchanged.push(name);
        } else {
            changed.push((tool, name));
        }
    }
    let entry = |(tool, name): &(&Tool, String)| {
        let spec = convert::spec(config, name.clone(), tool);
        let backend = Arc::new(McpBackend { shared: shared.clone(), tool: tool.name.to_string() });
        // Schemas compile after publishing (see `compile_in_background`), or at a first call.
        match ToolEntry::deferred(spec, backend) {
            Ok(entry) => Some(entry),
            Err(error) => {
                warn!(tool = %name, server, %error, "tool not published");
                None
            }
        }
    };
    let entries: Vec<Option<ToolEntry>> = map_listing(&changed, entry);
    let entries: Vec<ToolEntry> = entries.into_iter().flatten().collect();
    let same = !previous.is_empty()
        && entries.is_empty()
        && unchanged.len() == tools.len()
        && previous.len() == tools.len();
    let listing = Arc::new(tools.into_iter().map(|t| (t.name.to_string(), t)).collect());
    Prepared { listing, entries, unchanged, same }
}

/// Lists every page of the server's tools. rmcp's `list_all_tools` would also keep a deep
/// copy of each page in its response cache, which toolmesh has no use for (it re-lists on
/// `tools/list_changed`) and which, for a server of thousands of tools, costs as much as
/// publishing the change.
pub(crate) async fn list_tools(peer: &Peer<RoleClient>) -> Result<Vec<Tool>, ServiceError> {
    pages(
        peer,
        |page| ClientRequest::ListToolsRequest(ListToolsRequest::with_param(page)),
        |result| match result {
            ServerResult::ListToolsResult(page) => Some((page.tools, page.next_cursor)),
            _ => None,
        },
    )
    .await
}

/// Every page of one listing: `request` asks for a page, `take` finds its items and the
/// next cursor in the answer.
pub(crate) async fn pages<T>(
    peer: &Peer<RoleClient>,
    request: impl Fn(PaginatedRequestParams) -> ClientRequest,
    take: impl Fn(ServerResult) -> Option<(Vec<T>, Option<Cursor>)>,
) -> Result<Vec<T>, ServiceError> {
    let mut items = Vec::new();
    let mut cursor: Option<Cursor> = None;
    loop {
        let page = PaginatedRequestParams::default().with_cursor(cursor.clone());
        let result = peer.send_request(request(page)).await?;
        let (page, next) = take(result).ok_or(ServiceError::UnexpectedResponse)?;
        items.extend(page);
        // A server that hands back the cursor it was given would be listed forever.
        match next {
            Some(next) if cursor.as_ref() != Some(&next) => cursor = Some(next),
            _ => return Ok(items),
        }
    }
}

/// Follows the changes of the tool, prompt and resource lists of a 2026-07-28 server, which
/// arrive on a `subscriptions/listen` stream instead of as plain notifications.
pub(crate) async fn follow_lists(
    peer: rmcp::service::Peer<RoleClient>,
    actor: ActorRef<McpMsg>,
    lost: CancellationToken,
) {
    let filter = SubscriptionFilter::builder()
        .tools_list_changed()
        .prompts_list_changed()
        .resources_list_changed()
        .build();
    let mut subscription = match peer.listen(filter).await {
        Ok(subscription) => subscription,
        Err(error) => {
            debug!(%error, "subscriptions/listen is not available");
            return;
        }
    };
    loop {
        tokio::select! {
            () = lost.cancelled() => return,
            next = subscription.next() => match next {
                Ok(Some(ServerNotification::ToolListChangedNotification(_))) => {
                    let _ = actor.cast(McpMsg::ToolsChanged);
                }
                Ok(Some(
                    ServerNotification::PromptListChangedNotification(_)
                    | ServerNotification::ResourceListChangedNotification(_),
                )) => {
                    let _ = actor.cast(McpMsg::OffersChanged);
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            },
        }
    }
}
