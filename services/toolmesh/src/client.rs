//! A small client of the API, behind `toolmesh tools list` and `toolmesh call`.

use std::{path::PathBuf, time::Duration};

use anyhow::Context as _;
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

/// How a client speaks TLS to a server whose listener has `[tls]`: the options of every
/// command that connects to one. Any of them, or an `https://` address, means TLS.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientTls {
    /// PEM file with the CA certificates that verify the server's certificate (TLS;
    /// without it an https:// address is verified with the system's roots).
    #[arg(long = "ca-cert", env = "TOOLMESH_CA_CERT", value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// PEM file with this client's certificate chain, for mutual TLS (with --key).
    #[arg(long = "cert", env = "TOOLMESH_CLIENT_CERT", value_name = "FILE", requires = "key")]
    pub cert: Option<PathBuf>,
    /// PEM file with the private key of --cert.
    #[arg(long = "key", env = "TOOLMESH_CLIENT_KEY", value_name = "FILE", requires = "cert")]
    pub key: Option<PathBuf>,
}

impl ClientTls {
    /// Returns whether a file is given: then the connection is TLS whatever the address.
    pub fn is_set(&self) -> bool {
        self.ca_cert.is_some() || self.cert.is_some()
    }

    /// Returns the URL of `addr` (`host:port` or a URL): `https://` when TLS is asked for.
    pub fn url(&self, addr: &str) -> String {
        match addr.split_once("://") {
            Some(("http", rest)) if self.is_set() => format!("https://{rest}"),
            Some(_) => addr.to_owned(),
            None if self.is_set() => format!("https://{addr}"),
            None => format!("http://{addr}"),
        }
    }

    /// Returns tonic's TLS configuration for a server named `domain` (its certificate must
    /// name it: a DNS name, or an IP address).
    pub fn config(&self, domain: &str) -> anyhow::Result<tonic::transport::ClientTlsConfig> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let read = |path: &PathBuf, what: &str| {
            std::fs::read(path).with_context(|| format!("cannot read {what} {}", path.display()))
        };
        let mut config = ClientTlsConfig::new().domain_name(domain);
        config = match &self.ca_cert {
            Some(path) => config.ca_certificate(Certificate::from_pem(read(path, "--ca-cert")?)),
            None => config.with_native_roots(),
        };
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            config =
                config.identity(Identity::from_pem(read(cert, "--cert")?, read(key, "--key")?));
        }
        Ok(config)
    }

    /// Returns an endpoint of `url` (http or https) that speaks TLS to `domain` for https.
    pub fn endpoint(&self, url: &str, domain: &str) -> anyhow::Result<tonic::transport::Endpoint> {
        let endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
            .with_context(|| format!("not a server address: {url}"))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true);
        if !url.starts_with("https://") {
            return Ok(endpoint);
        }
        endpoint.tls_config(self.config(domain)?).context("the client's TLS configuration")
    }
}

/// Connects to a toolmesh server at `addr` (`host:port` or a URL), sending `token` (an API
/// key or a JWT) with every request.
pub async fn connect(
    addr: &str,
    token: Option<&str>,
) -> anyhow::Result<ToolServiceClient<Connection>> {
    connect_with(addr, token, &ClientTls::default()).await
}

/// [`connect`] with the TLS options `tls`.
pub async fn connect_with(
    addr: &str,
    token: Option<&str>,
    tls: &ClientTls,
) -> anyhow::Result<ToolServiceClient<Connection>> {
    Ok(ToolServiceClient::new(channel_with(addr, token, tls).await?))
}

/// Opens a channel to a toolmesh server at `addr` (`host:port` or a URL) that sends `token`
/// (an API key or a JWT) with every request.
pub async fn channel(addr: &str, token: Option<&str>) -> anyhow::Result<Connection> {
    channel_with(addr, token, &ClientTls::default()).await
}

/// [`channel`] with the TLS options `tls`.
pub async fn channel_with(
    addr: &str,
    token: Option<&str>,
    tls: &ClientTls,
) -> anyhow::Result<Connection> {
    let credential = Credential::bearer(token)?;
    let url = tls.url(addr);
    let endpoint = tls.endpoint(&url, &host(&url))?;
    let channel = endpoint.connect().await.map_err(|error| {
        anyhow::anyhow!("cannot connect to toolmesh at {url}: {}", causes(&error))
    })?;
    Ok(InterceptedService::new(channel, credential))
}

/// The host of `url` (`scheme://host:port/…`), without the brackets of an IPv6 address.
pub fn host(url: &str) -> String {
    let authority = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = authority.split('/').next().unwrap_or_default();
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    };
    host.trim_start_matches('[').trim_end_matches(']').to_owned()
}

/// `error` and its sources, for a message that says why (a TLS failure is a few sources
/// down from tonic's "transport error").
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let message = cause.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        next = cause.source();
    }
    text
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
            Some(Message::Log(log)) => {
                let logger =
                    if log.logger.is_empty() { String::new() } else { format!(" {}", log.logger) };
                on_progress(&format!("log {}{logger}: {}", log.level, log.data_json));
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
            // Asked only of a caller that said it samples, which this one does not.
            Some(Message::Started(_) | Message::Sampling(_)) | None => {}
        }
    }
    Err(tonic::Status::unavailable("the stream ended without a result"))
}

/// A table of the CLI under `header`: no lines, columns two spaces apart and the first at
/// the margin, wrapped to `width` columns (none: as wide as its longest row).
fn table(header: &[&str], width: Option<u16>) -> comfy_table::Table {
    let mut table = comfy_table::Table::new();
    table
        .load_style(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Dynamic)
        .set_header(header.to_vec());
    if let Some(width) = width {
        table.set_width(width);
    }
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    table
}

/// The longest description `tools list` shows of a tool, in characters.
const DESCRIPTION_CHARS: usize = 200;

/// Renders `tools` as the table of `toolmesh tools list`, `width` columns wide (none: as
/// wide as its longest row, for a pipe): names, sources and descriptions that do not fit
/// are wrapped within their column instead of pushing the next ones out of line. A
/// description shows its first line, cut at 200 characters.
pub fn tools_table(tools: &[toolmesh_proto::v1::Tool], width: Option<u16>) -> String {
    let mut table = table(&["NAME", "TOOLKIT", "SOURCE", "UPSTREAM", "DESCRIPTION"], width);
    for tool in tools {
        let (source, upstream) =
            tool.source.as_ref().map_or(("", ""), |s| (s.name.as_str(), s.upstream_name.as_str()));
        let first = tool.description.lines().next().unwrap_or_default();
        let mut description: String = first.chars().take(DESCRIPTION_CHARS).collect();
        if description.len() < first.len() {
            description.push('…');
        }
        table.add_row([tool.name.as_str(), &tool.toolkit, source, upstream, &description]);
    }
    table.trim_fmt()
}

/// Renders the knowledge collections as the table of `toolmesh knowledge list`, `width`
/// columns wide as [`tools_table`] is; a collection whose counts could not be read says
/// why in the last column.
pub fn collections_table(
    collections: &[toolmesh_proto::v1::CollectionInfo],
    width: Option<u16>,
) -> String {
    let header = ["COLLECTION", "DOCUMENTS", "CHUNKS", "STORE", "TOOL", "DESCRIPTION"];
    let mut table = table(&header, width);
    for collection in collections {
        let counts = |n: u64| if collection.error.is_empty() { n.to_string() } else { "?".into() };
        let description = if collection.error.is_empty() {
            collection.description.clone()
        } else {
            format!("(counts unknown: {})", collection.error)
        };
        table.add_row([
            collection.name.clone(),
            counts(collection.documents),
            counts(collection.chunks),
            collection.store.clone(),
            collection.tool.clone(),
            description,
        ]);
    }
    table.trim_fmt()
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
        Some(Part::Resource(resource)) => match &resource.body {
            Some(toolmesh_proto::v1::resource_contents::Body::Text(text)) => text.clone(),
            Some(toolmesh_proto::v1::resource_contents::Body::Blob(blob)) => {
                format!("[{} {} · {} bytes]", resource.uri, resource.mime_type, blob.len())
            }
            None => format!("[resource {}]", resource.uri),
        },
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use toolmesh_proto::v1::{Tool, ToolSource};

    use super::tools_table;

    fn tool(name: &str, description: &str) -> Tool {
        Tool {
            name: name.into(),
            description: description.into(),
            source: Some(ToolSource { name: "github".into(), ..Default::default() }),
            ..Default::default()
        }
    }

    /// In a terminal of 80 columns no line is longer, however long a name or a description:
    /// they wrap within their columns, and every word of them is still shown.
    #[test]
    fn long_names_and_descriptions_wrap_within_the_width() {
        let long = "github_list_pull_request_review_comments_for_a_repository_and_branch";
        let tools = [
            tool(
                long,
                "Lists the review comments of every pull request of a repository, newest first, with their authors.",
            ),
            tool("echo", "Echoes its input."),
        ];
        let table = tools_table(&tools, Some(80));
        for line in table.lines() {
            assert!(
                line.chars().count() <= 80,
                "{} columns: {line}\n{table}",
                line.chars().count()
            );
        }
        // Each column read down its rows gives back what was put in.
        let header = table.lines().next().unwrap();
        let column = |from: &str, to: Option<&str>| -> Vec<String> {
            let start = header.find(from).unwrap();
            let end = to.map(|to| header.find(to).unwrap());
            (table.lines().skip(1))
                .map(|line| {
                    let cells: String = line.chars().skip(start).collect();
                    let cell: String = match end {
                        Some(end) => cells.chars().take(end - start).collect(),
                        None => cells,
                    };
                    cell.trim().to_owned()
                })
                .collect()
        };
        let names = column("NAME", Some("TOOLKIT")).concat();
        assert_eq!(names, format!("{long}echo"), "{table}");
        let descriptions = column("DESCRIPTION", None).join(" ");
        assert!(descriptions.contains("newest first, with their authors."), "{table}");
    }

    /// In a pipe each tool is one line, whole, under the header.
    #[test]
    fn a_pipe_gets_one_line_per_tool() {
        let long = "a_name_".repeat(20);
        let table = tools_table(&[tool(&long, "First line.\nSecond line.")], None);
        let lines: Vec<_> = table.lines().filter(|line| !line.trim().is_empty()).collect();
        assert_eq!(lines.len(), 2, "{table}");
        assert!(lines[0].contains("NAME") && lines[0].contains("DESCRIPTION"), "{table}");
        assert!(lines[1].contains(&long) && lines[1].contains("First line."), "{table}");
        assert!(!table.contains("Second line"), "{table}");
    }
}
