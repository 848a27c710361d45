use std::sync::Arc;

use ractor::ActorRef;
use rmcp::{
    ClientHandler, ErrorData, RoleClient,
    model::{
        ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction,
        Implementation, ProgressNotificationParam,
    },
    service::{NotificationContext, RequestContext},
};
use tracing::debug;

use crate::{McpMsg, shared::ServerShared};

/// toolmesh's side of one MCP connection: routes progress to the call it belongs to,
/// tells the actor when the server's tool list changed, and answers server requests.
pub struct McpClientHandler {
    pub(crate) shared: Arc<ServerShared>,
    pub(crate) actor: ActorRef<McpMsg>,
}

impl ClientHandler for McpClientHandler {
    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::default();
        info.capabilities = ClientCapabilities::default();
        info.client_info = Implementation::new("toolmesh", env!("CARGO_PKG_VERSION"));
        info
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        if let Some(sink) = self.shared.progress_sinks().get(&params.progress_token) {
            sink.progress(params.progress, params.total, params.message.unwrap_or_default());
        }
    }

    async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
        debug!(server = self.shared.name(), "tools/list_changed");
        let _ = self.actor.cast(McpMsg::ToolsChanged);
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        debug!(server = self.shared.name(), ?request, "elicitation answered with cancel");
        Ok(ElicitResult::new(ElicitationAction::Cancel))
    }
}
