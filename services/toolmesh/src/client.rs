//! A small client of the API, behind `toolmesh tools list` and `toolmesh call`.

use std::time::Duration;
use toolmesh_core::Nesting;

use tonic::{
    metadata::{AsciiMetadataValue, MetadataValue},
    service::{Interceptor, interceptor::InterceptedService},
    transport::Channel,
};
use toolmesh_proto::v1::{
    ApprovalAnswer, CallToolClientMessage, CallToolRequest, CallToolResponse, ElicitationAction,
    ElicitationAnswer, ListToolsRequest, Tool, Toolkit, call_tool_client_message,
    call_tool_server_message, content_part::Part, tool_service_client::ToolServiceClient,
};

/// A channel to a toolmesh server that sends the caller's credential with every request.
pub type Connection = InterceptedService<Channel, Credential>;

/// The `authorization: Bearer …` metadata of every request (none when there is no token),
/// and, inside a tool that calls back into toolmesh, the nesting its caller told it
/// (`TOOLMESH_CALL_DEPTH` and `TOOLMESH_PARENT_CALL_ID` in the environment, sent as
/// `x-toolmesh-call-depth` and `x-toolmesh-parent-call-id`).
#[derive(Clone, Default)]
pub struct Credential(Option<AsciiMetadataValue>, Vec<(&'static str, AsciiMetadataValue)>);

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Credential(<redacted>)" } else { "Credential(None)" })
    }
}

impl Credential {
    /// Returns the credential of `token` (an API key or a JWT); none when `token` is
    /// `None` or empty.
    pub fn bearer(token: Option<&str>) -> anyhow::Result<Self> {
        let nesting = [
            (Nesting::DEPTH_HEADER, Nesting::DEPTH_ENV),
            (Nesting::PARENT_HEADER, Nesting::PARENT_ENV),
        ]
        .into_iter()
        .filter_map(|(key, var)| {
            let value = std::env::var(var).ok()?;
            Some((key, MetadataValue::try_from(value.trim()).ok()?))
        })
        .collect();
        let Some(token) = token.map(str::trim).filter(|t| !t.is_empty()) else {
            return Ok(Credential(None, nesting));
        };
        let mut value: AsciiMetadataValue = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| anyhow::anyhow!("the token must be printable ASCII"))?;
        value.set_sensitive(true);
        Ok(Credential(Some(value), nesting))
    }
}

impl Interceptor for Credential {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert("authorization", value.clone());
        }
        for (key, value) in &self.1 {
            request.metadata_mut().insert(*key, value.clone());
        }
        Ok(request)
    }
}

/// Connects to a toolmesh server at `addr` (`host:port` or a URL), sending `token` (an API
/// key or a JWT) with every request.
pub async fn connect(
    addr: &str,
    token: Option<&str>,
) -> anyhow::Result<ToolServiceClient<Connection>> {
    Ok(ToolServiceClient::new(channel(addr, token).await?))
}

/// Opens a channel to a toolmesh server at `addr` (`host:port` or a URL) that sends `token`
/// (an API key or a JWT) with every request.
pub async fn channel(addr: &str, token: Option<&str>) -> anyhow::Result<Connection> {
    let credential = Credential::bearer(token)?;
    let url = if addr.contains("://") { addr.to_owned() } else { format!("http://{addr}") };
    let channel = tonic::transport::Endpoint::from_shared(url.clone())?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|error| anyhow::anyhow!("cannot connect to toolmesh at {url}: {error}"))?;
    Ok(InterceptedService::new(channel, credential))
}

/// Lists every tool and toolkit, following pages.
pub async fn list_all(
    client: &mut ToolServiceClient<Connection>,
) -> Result<(Vec<Tool>, Vec<Toolkit>), tonic::Status> {
    list_profile(client, "").await
}

/// Lists what an agent of routing profile `profile` sees (every tool when empty), following
/// pages.
pub async fn list_profile(
    client: &mut ToolServiceClient<Connection>,
    profile: &str,
) -> Result<(Vec<Tool>, Vec<Toolkit>), tonic::Status> {
    let mut tools = Vec::new();
    let mut toolkits: Vec<Toolkit> = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_tools(ListToolsRequest {
                page_size: 1000,
                page_token,
                profile: profile.to_owned(),
                ..Default::default()
            })
            .await?
            .into_inner();
        tools.extend(page.tools);
        for toolkit in page.toolkits {
            if !toolkits.iter().any(|t| t.name == toolkit.name) {
                toolkits.push(toolkit);
            }
        }
        if page.next_page_token.is_empty() {
            return Ok((tools, toolkits));
        }
        page_token = page.next_page_token;
    }
}

/// Calls a tool over `StreamCallTool`, handing each progress message to `on_progress`.
pub async fn call_streaming(
    client: &mut ToolServiceClient<Connection>,
    request: CallToolRequest,
    timeout: Option<Duration>,
    mut on_progress: impl FnMut(&str),
) -> Result<CallToolResponse, tonic::Status> {
    use call_tool_server_message::Message;
    let (outbound, requests) = tokio::sync::mpsc::channel(4);
    let start =
        CallToolClientMessage { message: Some(call_tool_client_message::Message::Start(request)) };
    outbound.send(start).await.map_err(|_| tonic::Status::internal("request stream closed"))?;
    // The request stream stays open while `outbound` lives, so that the server does not
    // see a half-close as the end of the conversation.
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(requests));
    if let Some(timeout) = timeout {
        request.set_timeout(timeout);
    }
    let mut stream = client.stream_call_tool(request).await?.into_inner();
    while let Some(message) = stream.message().await? {
        match message.message {
            Some(Message::Progress(p)) => {
                let total = p.total.map(|t| format!("/{t}")).unwrap_or_default();
                on_progress(&format!("progress {}{total} {}", p.progress, p.message));
            }
            Some(Message::Partial(part)) => {
                on_progress(&format!("partial {}", render_part(&part.part)))
            }
            Some(Message::Elicitation(question)) => {
                on_progress(&format!(
                    "question (answered cancel; toolmesh call is not interactive): {}",
                    question.message
                ));
                let answer = ElicitationAnswer {
                    elicitation_id: question.elicitation_id,
                    action: ElicitationAction::Cancel.into(),
                    content_json: String::new(),
                };
                let answer = CallToolClientMessage {
                    message: Some(call_tool_client_message::Message::ElicitationAnswer(answer)),
                };
                let _ = outbound.send(answer).await;
            }
            Some(Message::Approval(approval)) => {
                on_progress(&format!(
                    "approval of {} asked by policy rule {} (answered no; toolmesh call is not \
                     interactive): {}",
                    approval.tool, approval.rule, approval.reason
                ));
                let answer = ApprovalAnswer {
                    approval_id: approval.approval_id,
                    approved: false,
                    note: "toolmesh call cannot ask a person".into(),
                };
                let answer = CallToolClientMessage {
                    message: Some(call_tool_client_message::Message::ApprovalAnswer(answer)),
                };
                let _ = outbound.send(answer).await;
            }
            Some(Message::Result(result)) => return Ok(result),
            Some(Message::Started(_)) | None => {}
        }
    }
    Err(tonic::Status::unavailable("the stream ended without a result"))
}

/// Renders one content part for a terminal.
pub fn render_part(part: &Option<Part>) -> String {
    match part {
        Some(Part::Text(text)) => text.clone(),
        Some(Part::Json(json)) => serde_json::from_str::<serde_json::Value>(json)
            .and_then(|v| serde_json::to_string_pretty(&v))
            .unwrap_or_else(|_| json.clone()),
        Some(Part::Media(media)) => format!("[{} · {} bytes]", media.mime_type, media.data.len()),
        Some(Part::ResourceLink(link)) => format!("[resource {} {}]", link.name, link.uri),
        None => String::new(),
    }
}
