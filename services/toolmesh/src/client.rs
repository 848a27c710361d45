//! A small client of the API, behind `toolmesh tools list` and `toolmesh call`.

use std::time::Duration;

use tonic::transport::Channel;
use toolmesh_proto::v1::{
    CallToolClientMessage, CallToolRequest, CallToolResponse, ElicitationAction, ElicitationAnswer,
    ListToolsRequest, Tool, Toolkit, call_tool_client_message, call_tool_server_message,
    content_part::Part, tool_service_client::ToolServiceClient,
};

/// Connects to a toolmesh server at `addr` (`host:port` or a URL).
pub async fn connect(addr: &str) -> anyhow::Result<ToolServiceClient<Channel>> {
    Ok(ToolServiceClient::new(channel(addr).await?))
}

/// Opens a channel to a toolmesh server at `addr` (`host:port` or a URL).
pub async fn channel(addr: &str) -> anyhow::Result<Channel> {
    let url = if addr.contains("://") { addr.to_owned() } else { format!("http://{addr}") };
    tonic::transport::Endpoint::from_shared(url.clone())?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|error| anyhow::anyhow!("cannot connect to toolmesh at {url}: {error}"))
}

/// Lists every tool and toolkit, following pages.
pub async fn list_all(
    client: &mut ToolServiceClient<Channel>,
) -> Result<(Vec<Tool>, Vec<Toolkit>), tonic::Status> {
    list_profile(client, "").await
}

/// Lists what an agent of routing profile `profile` sees (every tool when empty), following
/// pages.
pub async fn list_profile(
    client: &mut ToolServiceClient<Channel>,
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
    client: &mut ToolServiceClient<Channel>,
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
