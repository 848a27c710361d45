use std::sync::Arc;

use ractor::ActorRef;
use rmcp::{
    ClientHandler, ErrorData, RoleClient,
    model::{
        ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction,
        ElicitationCapability, Implementation, ProgressNotificationParam, SamplingCapability,
        ServerNotification,
    },
    service::{InboundStreamOrigin, NotificationContext, RequestContext},
};
use tracing::debug;

use crate::{McpMsg, shared::ServerShared};

/// How long a server request may wait for the call it belongs to to be registered.
const ROUTE_WAIT: std::time::Duration = std::time::Duration::from_millis(500);
/// How long a server request whose stream names the call it belongs to waits for that call
/// to be registered.
const NAMED_ROUTE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// toolmesh's side of one MCP connection: routes progress to the call it belongs to,
/// tells the actor when the server's tool list changed, and answers server requests.
pub struct McpClientHandler {
    pub(crate) shared: Arc<ServerShared>,
    pub(crate) actor: ActorRef<McpMsg>,
}

/// What toolmesh's MCP client declares it can do. Elicitations are forwarded to callers on
/// StreamCallTool and MCP sessions; so are samplings, to callers that said they can sample
/// (without one, a server's sampling request gets an error that says so). On 2026-07-28 the
/// capabilities go with each request, and `sampling` only with a call whose caller samples.
#[allow(deprecated)]
pub(crate) fn capabilities(sampling: bool) -> ClientCapabilities {
    let mut capabilities = ClientCapabilities::default();
    capabilities.elicitation = Some(ElicitationCapability::new());
    capabilities.sampling = sampling.then(SamplingCapability::default);
    capabilities
}

/// Who toolmesh's MCP client says it is.
pub(crate) fn client_info() -> Implementation {
    Implementation::new("toolmesh", env!("CARGO_PKG_VERSION"))
}

impl McpClientHandler {
    /// Returns the sink of the call a server request that arrived on `origin` belongs to
    /// and that `fits` it, waiting a little for the call to be registered: the call
    /// registers its request id just after sending, and a fast server can ask before that.
    async fn asker(
        &self,
        origin: Option<&InboundStreamOrigin>,
        fits: impl Fn(&toolmesh_core::EventSink) -> bool,
    ) -> Option<toolmesh_core::EventSink> {
        // A request that names its call waits for that call however loaded the machine is
        // (nothing else can answer it); one that does not may belong to no call at all.
        let wait = match origin {
            Some(InboundStreamOrigin::OutboundRequest(_)) => NAMED_ROUTE_WAIT,
            _ => ROUTE_WAIT,
        };
        let waited = tokio::time::Instant::now() + wait;
        loop {
            let registered = self.shared.registered.notified();
            tokio::pin!(registered);
            registered.as_mut().enable();
            if let Some(sink) = self.caller(origin, &fits) {
                return Some(sink);
            }
            if tokio::time::timeout_at(waited, registered).await.is_err() {
                return None;
            }
        }
    }

    /// Handles a notification that arrived on `origin` outside rmcp's transport (on the
    /// stream of a call toolmesh sent itself), as rmcp's dispatch would.
    #[allow(deprecated)]
    pub(crate) fn notified(
        &self,
        notification: ServerNotification,
        origin: Option<&InboundStreamOrigin>,
    ) {
        match notification {
            ServerNotification::ProgressNotification(notification) => {
                self.shared.progress(notification.params);
            }
            ServerNotification::LoggingMessageNotification(notification) => {
                self.logged(notification.params, origin);
            }
            ServerNotification::ToolListChangedNotification(_) => self.tools_changed(),
            ServerNotification::ResourceListChangedNotification(_) => {
                self.offers_changed("resources/list_changed");
            }
            ServerNotification::PromptListChangedNotification(_) => {
                self.offers_changed("prompts/list_changed");
            }
            ServerNotification::ResourceUpdatedNotification(notification) => {
                self.resource_updated(notification.params);
            }
            other => debug!(server = self.shared.name(), ?other, "a notification left alone"),
        }
    }

    /// Passes a log message the server sends during a call on to that call's caller. Over
    /// streamable HTTP the transport says which request's stream it arrived on; elsewhere it
    /// goes to the only running call, and is left out when that is ambiguous.
    #[allow(deprecated)]
    fn logged(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        origin: Option<&InboundStreamOrigin>,
    ) {
        let Some(sink) = self.caller(origin, |_| true) else {
            debug!(server = self.shared.name(), "a log message outside any call");
            return;
        };
        let level = serde_json::to_value(params.level)
            .ok()
            .and_then(|level| level.as_str().map(str::to_owned))
            .unwrap_or_else(|| "info".into());
        sink.log(level, params.logger.unwrap_or_default(), params.data);
    }

    /// Tells the actor that the server's resources or prompts changed (`what` says which).
    fn offers_changed(&self, what: &'static str) {
        debug!(server = self.shared.name(), what);
        let _ = self.actor.cast(McpMsg::OffersChanged);
    }

    fn tools_changed(&self) {
        debug!(server = self.shared.name(), "tools/list_changed");
        let _ = self.actor.cast(McpMsg::ToolsChanged);
    }

    /// Passes the update of a subscribed resource on to the clients subscribed to it.
    fn resource_updated(&self, params: rmcp::model::ResourceUpdatedNotificationParam) {
        debug!(server = self.shared.name(), uri = %params.uri, "resources/updated");
        let update =
            crate::ResourceUpdate { server: self.shared.name().to_owned(), uri: params.uri };
        // Nobody listening is no error: the subscribers may have gone meanwhile.
        let _ = self.shared.offers_changed.updated.send(update);
    }

    /// Returns the sink of the call a server message that arrived on `origin` belongs to:
    /// the call of that request's stream, or else the only running call that `fits`.
    fn caller(
        &self,
        origin: Option<&InboundStreamOrigin>,
        fits: impl Fn(&toolmesh_core::EventSink) -> bool,
    ) -> Option<toolmesh_core::EventSink> {
        let calls = self.shared.inflight_calls();
        match origin {
            Some(InboundStreamOrigin::OutboundRequest(id)) => calls.get(id).cloned(),
            _ => {
                let mut able = calls.values().filter(|sink| fits(sink));
                match (able.next(), able.next()) {
                    (Some(only), None) => Some(only.clone()),
                    _ => None,
                }
            }
        }
    }
}

impl ClientHandler for McpClientHandler {
    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::default();
        info.capabilities = capabilities(true);
        info.client_info = client_info();
        info
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        self.shared.progress(params);
    }

    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        context: NotificationContext<RoleClient>,
    ) {
        self.logged(params, context.extensions.get::<InboundStreamOrigin>());
    }

    async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.tools_changed();
    }

    async fn on_resource_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.offers_changed("resources/list_changed");
    }

    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        self.resource_updated(params);
    }

    async fn on_prompt_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.offers_changed("prompts/list_changed");
    }

    /// Forwards the question to the caller of the call it belongs to. Over streamable HTTP
    /// the transport says which request's stream it arrived on; over stdio and SSE the
    /// protocol carries no such link, so it goes to the only running call that can answer,
    /// and is cancelled when that is ambiguous. No answer in time is `cancel`.
    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let origin = context.extensions.get::<InboundStreamOrigin>();
        let sink = self.asker(origin, toolmesh_core::EventSink::can_elicit).await;
        let Some(sink) = sink else {
            debug!(server = self.shared.name(), "elicitation with no caller to answer it: cancel");
            return Ok(ElicitResult::new(ElicitationAction::Cancel));
        };
        let Some(elicitation) = crate::convert::elicitation(request) else {
            debug!(server = self.shared.name(), "unknown elicitation mode: cancel");
            return Ok(ElicitResult::new(ElicitationAction::Cancel));
        };
        let schema = elicitation.requested_schema.clone();
        let answer = sink.elicit(elicitation, self.shared.config.timeout).await;
        Ok(crate::convert::elicit_result(answer, &schema))
    }

    /// Forwards the request for a completion to the caller of the call it belongs to, found
    /// as an elicitation's is, when that caller said it can sample; otherwise, or when the
    /// caller refuses or does not answer in time, the server gets an error that says why.
    /// toolmesh has no model of its own.
    #[allow(deprecated)]
    async fn create_message(
        &self,
        request: rmcp::model::CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<rmcp::model::CreateMessageResult, ErrorData> {
        let origin = context.extensions.get::<InboundStreamOrigin>();
        let Some(sink) = self.asker(origin, toolmesh_core::EventSink::can_sample).await else {
            debug!(server = self.shared.name(), "sampling with no caller that samples: refused");
            return Err(ErrorData::invalid_request(
                "sampling is not available: the caller of this call does not sample (toolmesh \
                 has no model of its own)",
                None,
            ));
        };
        let params = serde_json::to_value(request)
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let answer = sink.sample(toolmesh_core::Sampling { params }, self.shared.config.timeout);
        crate::convert::sampled(answer.await)
    }
}
