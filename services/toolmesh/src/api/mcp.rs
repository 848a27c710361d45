//! The MCP endpoint's view of the mesh: `tools/list` lists what `ListTools` lists, and
//! `tools/call` takes the path `CallTool` takes (admission, validation, policy, limits,
//! retries, audit, spans), with the call's events relayed to the MCP client.

use rmcp::model::{
    CompleteRequestParams, CompleteResult, GetPromptResponse, JsonObject, ReadResourceResult,
};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use toolmesh_core::{CallFailure, EventSink, InputRounds, MAX_LISTING_BYTES, ToolOutput};
use toolmesh_mcp::{Caller, McpManager, Mesh, OfferError, Offered, Page};
use toolmesh_meta::MetaTools;
use toolmesh_router::{CallRequest, Router};

use super::view::View;

/// Most tools one `tools/list` page holds (a page is also bounded in bytes).
const PAGE_SIZE: usize = 1000;

/// The router and the meta-tools, as the MCP endpoint calls them, and the MCP servers'
/// resources and prompts.
pub(crate) struct McpMesh {
    pub(crate) router: Router,
    pub(crate) meta: MetaTools,
    pub(crate) servers: McpManager,
}

#[async_trait::async_trait]
impl Mesh for McpMesh {
    async fn list(&self, caller: &Caller, after: Option<&str>) -> Result<Page, CallFailure> {
        let view = View::new(&self.router, caller.principal.clone(), &caller.profile)
            .map_err(|e| e.failure())?;
        let mut page = Page::default();
        let mut bytes = 0;
        for (_, entry) in view.catalog.after(after) {
            let spec = &entry.spec;
            if !view.shows(spec) {
                continue;
            }
            let mut spec = spec.clone();
            if let Some(description) = view.description(&self.meta, &spec) {
                spec.description = description;
            }
            let size = spec.description.len() + spec.input_schema.to_string().len();
            let fits = page.tools.len() < PAGE_SIZE && bytes + size <= MAX_LISTING_BYTES;
            if !page.tools.is_empty() && !fits {
                page.next = page.tools.last().map(|last| last.name.clone());
                break;
            }
            bytes += size;
            page.tools.push(spec);
        }
        view.audit("tools/list");
        Ok(page)
    }

    async fn call(
        &self,
        caller: &Caller,
        name: String,
        arguments: Map<String, Value>,
        events: EventSink,
        cancel: CancellationToken,
    ) -> Result<ToolOutput, CallFailure> {
        let request = CallRequest {
            name,
            arguments_json: Value::Object(arguments).to_string(),
            call_id: String::new(),
            session_id: caller.session.clone(),
            profile: caller.profile.clone(),
            client_timeout: None,
            principal: caller.principal.clone(),
            nesting: None,
        };
        match self.router.call(request, events, cancel).await {
            Ok((_, output)) => Ok(output),
            Err(error) => Err(error.failure()),
        }
    }

    fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.router.registry().subscribe()
    }

    /// Resources keep their servers' URIs and names (the URI is what a client asks for);
    /// prompts are named as the servers' tools are, so that two servers' prompts differ.
    fn offers(&self, caller: &Caller) -> Offered {
        let mut offered = Offered::default();
        let visible =
            super::offers::visible(&self.router, &self.servers, caller.principal.clone(), "");
        for visible in visible {
            let server = &visible.server;
            offered.resources.extend(visible.resources);
            offered.templates.extend(visible.templates);
            offered.prompts.extend(visible.prompts.into_iter().map(|mut prompt| {
                prompt.name = server.published(&prompt.name);
                prompt
            }));
        }
        offered
    }

    async fn read_resource(
        &self,
        caller: &Caller,
        uri: &str,
    ) -> Result<ReadResourceResult, OfferError> {
        let principal = caller.principal.clone();
        let read = super::offers::read(&self.router, &self.servers, principal, uri, None).await;
        read.map(|(_, result)| result)
    }

    async fn get_prompt(
        &self,
        caller: &Caller,
        name: &str,
        arguments: Option<JsonObject>,
        rounds: Option<&InputRounds>,
    ) -> Result<GetPromptResponse, OfferError> {
        let principal = caller.principal.clone();
        super::offers::get(&self.router, &self.servers, principal, name, arguments, rounds).await
    }

    async fn complete(
        &self,
        caller: &Caller,
        params: CompleteRequestParams,
    ) -> Result<CompleteResult, OfferError> {
        let principal = caller.principal.clone();
        super::offers::complete(&self.router, &self.servers, principal, params).await
    }

    fn offer_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.servers.offer_changes()
    }

    /// Subscribing is reading's twin: the resource is routed and seen by policy as a read
    /// is, and a caller may subscribe to what it may read.
    async fn subscribe(&self, caller: &Caller, uri: &str) -> Result<String, OfferError> {
        let principal = caller.principal.clone();
        let server = super::offers::readable(&self.router, &self.servers, principal, uri, None)?;
        self.servers.subscribe(&server, uri).await?;
        Ok(server)
    }

    async fn unsubscribe(&self, server: &str, uri: &str) -> Result<(), OfferError> {
        self.servers.unsubscribe(server, uri).await
    }

    fn resource_updates(&self) -> tokio::sync::broadcast::Receiver<toolmesh_mcp::ResourceUpdate> {
        self.servers.resource_updates()
    }
}
