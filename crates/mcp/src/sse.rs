//! The legacy MCP HTTP+SSE transport (protocol 2024-11-05), which rmcp no longer ships:
//! the client opens an SSE stream with GET; the server's first event, `endpoint`, names the
//! URL the client POSTs its messages to; the server's messages arrive as `message` events.

use std::{collections::BTreeMap, sync::Arc};

use futures::StreamExt as _;
use rmcp::{
    RoleClient,
    model::{ClientJsonRpcMessage, ServerJsonRpcMessage},
    transport::Transport,
};
use tokio::{sync::mpsc, task::JoinHandle};
use tracing::{Instrument, debug, warn};

/// Server messages buffered before the reader waits for the client to take them.
const BUFFER: usize = 256;

/// What went wrong on a legacy SSE connection.
#[derive(Debug, thiserror::Error)]
pub enum SseError {
    /// The HTTP request failed.
    #[error("{0}")]
    Http(String),
    /// The server broke the protocol.
    #[error("{0}")]
    Protocol(String),
}

impl SseError {
    /// The failure kind a caller sees: the server cannot be reached as it should.
    pub fn code(&self) -> toolmesh_core::ErrorCode {
        toolmesh_core::ErrorCode::Unavailable
    }
}

/// A client connection over the legacy HTTP+SSE transport.
pub struct SseClientTransport {
    client: reqwest::Client,
    endpoint: Arc<reqwest::Url>,
    headers: Arc<reqwest::header::HeaderMap>,
    messages: mpsc::Receiver<ServerJsonRpcMessage>,
    reader: JoinHandle<()>,
}

impl Drop for SseClientTransport {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// One event of an SSE stream.
#[derive(Debug, Default, PartialEq)]
struct Event {
    name: String,
    data: String,
}

/// An incremental SSE parser: feed bytes, take complete events.
#[derive(Default)]
struct Parser {
    buffer: Vec<u8>,
    event: Event,
    has_data: bool,
}

impl Parser {
    fn feed(&mut self, bytes: &[u8]) -> Vec<Event> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
            let mut line: Vec<u8> = self.buffer.drain(..=end).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line);
            if line.is_empty() {
                if self.has_data || !self.event.name.is_empty() {
                    events.push(std::mem::take(&mut self.event));
                }
                self.has_data = false;
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((&line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => self.event.name = value.to_owned(),
                "data" => {
                    if self.has_data {
                        self.event.data.push('\n');
                    }
                    self.event.data.push_str(value);
                    self.has_data = true;
                }
                _ => {}
            }
        }
        events
    }
}

impl SseClientTransport {
    /// Opens the SSE stream at `url` with `client` and waits for the server's `endpoint`
    /// event.
    pub async fn connect(
        client: reqwest::Client,
        url: &str,
        headers: &BTreeMap<String, String>,
    ) -> Result<Self, SseError> {
        let mut header_map = reqwest::header::HeaderMap::new();
        for (name, value) in headers {
            let name: reqwest::header::HeaderName =
                name.parse().map_err(|e| SseError::Http(format!("header {name}: {e}")))?;
            let value = value.parse().map_err(|e| SseError::Http(format!("header {name}: {e}")))?;
            header_map.insert(name, value);
        }
        let base = reqwest::Url::parse(url).map_err(|e| SseError::Http(format!("{url}: {e}")))?;
        let response = client
            .get(base.clone())
            .headers(header_map.clone())
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(|e| SseError::Http(format!("GET {url}: {e}")))?;
        if !response.status().is_success() {
            return Err(SseError::Http(format!("GET {url}: HTTP {}", response.status())));
        }
        let mut body = response.bytes_stream();
        let mut parser = Parser::default();
        let mut pending = Vec::new();
        let endpoint = 'found: loop {
            let chunk = body
                .next()
                .await
                .ok_or_else(|| {
                    SseError::Protocol("the stream ended before the endpoint event".into())
                })?
                .map_err(|e| SseError::Http(format!("reading {url}: {e}")))?;
            for event in parser.feed(&chunk) {
                if event.name == "endpoint" {
                    let endpoint = base.join(event.data.trim()).map_err(|e| {
                        SseError::Protocol(format!("bad endpoint {:?}: {e}", event.data))
                    })?;
                    break 'found endpoint;
                }
                pending.push(event);
            }
        };
        if base.origin() != endpoint.origin() {
            return Err(SseError::Protocol(format!(
                "the endpoint {endpoint} is on another origin than {base}"
            )));
        }
        let (tx, messages) = mpsc::channel(BUFFER);
        let reader = tokio::spawn(
            async move {
                let forward = |event: Event| {
                    let tx = tx.clone();
                    async move {
                        if event.name != "message" && !event.name.is_empty() {
                            return true;
                        }
                        match serde_json::from_str::<ServerJsonRpcMessage>(&event.data) {
                            Ok(message) => tx.send(message).await.is_ok(),
                            Err(error) => {
                                warn!(%error, "an SSE message is not JSON-RPC; skipped");
                                true
                            }
                        }
                    }
                };
                for event in pending {
                    if !forward(event).await {
                        return;
                    }
                }
                while let Some(chunk) = body.next().await {
                    let Ok(chunk) = chunk else { break };
                    for event in parser.feed(&chunk) {
                        if !forward(event).await {
                            return;
                        }
                    }
                }
                debug!("the SSE stream ended");
            }
            .instrument(tracing::Span::current()),
        );
        Ok(SseClientTransport {
            client,
            endpoint: Arc::new(endpoint),
            headers: Arc::new(header_map),
            messages,
            reader,
        })
    }
}

impl Transport<RoleClient> for SseClientTransport {
    type Error = SseError;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let (client, endpoint, headers) =
            (self.client.clone(), self.endpoint.clone(), self.headers.clone());
        async move {
            let body = serde_json::to_vec(&item).map_err(|e| SseError::Protocol(e.to_string()))?;
            let response = client
                .post((*endpoint).clone())
                .headers((*headers).clone())
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body)
                .send()
                .await
                .map_err(|e| SseError::Http(format!("POST {endpoint}: {e}")))?;
            if response.status().is_success() {
                Ok(())
            } else {
                Err(SseError::Http(format!("POST {endpoint}: HTTP {}", response.status())))
            }
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<ServerJsonRpcMessage>> + Send {
        self.messages.recv()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.reader.abort();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_events_across_chunks_and_line_endings() {
        let mut parser = Parser::default();
        assert!(parser.feed(b"event: endpoint\r\ndata: /message?session").is_empty());
        let events =
            parser.feed(b"Id=1\r\n\r\n: keep-alive\n\nevent: message\ndata: {\"a\":\ndata: 1}\n\n");
        assert_eq!(
            events,
            [
                Event { name: "endpoint".into(), data: "/message?sessionId=1".into() },
                Event { name: "message".into(), data: "{\"a\":\n1}".into() },
            ]
        );
    }
}
