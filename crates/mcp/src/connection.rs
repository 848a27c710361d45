//! One connection to an MCP server: made over stdio, streamable HTTP or SSE, watched
//! for idleness and liveness, and retried with capped exponential backoff.

use std::{
    process::Stdio,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use crate::McpTransport;
use ractor::ActorRef;
use rmcp::{
    ClientServiceExt, RoleClient,
    model::{
        ClientRequest, DiscoverRequest, DiscoverRequestParams, PingRequest, ProtocolVersion, Tool,
    },
    service::{ClientInitializeError, ClientLifecycleMode, QuitReason, ServiceError},
    transport::{
        StreamableHttpClientTransport, TokioChildProcess,
        streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;
use toolmesh_process::ProcessTag;
use tracing::{Instrument, debug, info_span, warn};

use crate::{
    group::ProcessGroupGuard,
    listing::list_tools,
    messages::{Connection, McpMsg},
};
use crate::{
    handler::McpClientHandler, http_client::TracingHttpClient, shared::ServerShared,
    sse::SseClientTransport,
};

/// First reconnect delay; doubled after every failed attempt up to [`BACKOFF_CAP`].
pub(crate) const BACKOFF_BASE: Duration = Duration::from_millis(250);

/// Longest delay between reconnect attempts.
pub(crate) const BACKOFF_CAP: Duration = Duration::from_secs(30);

/// Liveness probes in a row that may fail before the connection is declared lost.
pub(crate) const PROBE_MISSES: u32 = 3;

/// Speaks 2026-07-28 (`server/discover`) with servers that offer it and falls back to the
/// `initialize` handshake (2025-11-25, 2025-06-18, ...) with the others: those that refuse
/// `server/discover` with an error, and those that answered it with something that is no
/// discover result.
pub(crate) fn lifecycle(shared: &ServerShared) -> ClientLifecycleMode {
    if shared.initialize_only.load(Ordering::Relaxed) {
        return ClientLifecycleMode::Initialize;
    }
    ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        legacy_version: None,
    }
}

/// Returns why the handshake failed. A server that answered `server/discover` with a
/// result that is not a discover result (`{}`, say) does not speak 2026-07-28, whatever it
/// answered: it is noted to be spoken to with `initialize`.
fn handshake_failed(shared: &ServerShared, error: &ClientInitializeError) -> String {
    if misanswered_discover(shared, error) {
        shared.initialize_only.store(true, Ordering::Relaxed);
        return format!("server/discover answered with no discover result ({error})");
    }
    format!("initialize failed: {error}")
}

/// Whether `error` is a discovery answered with what is no discover result.
fn misanswered_discover(shared: &ServerShared, error: &ClientInitializeError) -> bool {
    !shared.initialize_only.load(Ordering::Relaxed)
        && matches!(
            error,
            ClientInitializeError::ExpectedInitResult(_)
                | ClientInitializeError::ExpectedInitResponse(_)
        )
}

/// Connects over the legacy HTTP+SSE transport; such servers predate `server/discover`, so
/// the `initialize` handshake is used directly.
pub(crate) async fn connect_sse(
    handler: McpClientHandler,
    url: &str,
    headers: &std::collections::BTreeMap<String, String>,
) -> Result<Connection, String> {
    let client = handler.shared.http_client();
    let transport =
        SseClientTransport::connect(client, url, headers).await.map_err(|e| e.to_string())?;
    handler
        .serve_with_lifecycle(transport, ClientLifecycleMode::Initialize)
        .await
        .map_err(|e| format!("initialize failed: {e}"))
}

/// The variables of toolmesh's environment a stdio server inherits; the rest of what it
/// gets is `env` of its configuration.
pub(crate) const INHERITED: [&str; 6] = ["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"];

/// Opens the connection: transport, `server/discover` or `initialize`, then every page of
/// `tools/list`. A server whose answer to `server/discover` is no discover result is tried
/// again at once with `initialize`.
pub(crate) async fn connect(
    shared: Arc<ServerShared>,
    actor: ActorRef<McpMsg>,
) -> Result<(Connection, Option<ProcessGroupGuard>, Vec<Tool>), String> {
    let discovering = !shared.initialize_only.load(Ordering::Relaxed);
    match open(shared.clone(), actor.clone()).await {
        Err(error) if discovering && shared.initialize_only.load(Ordering::Relaxed) => {
            warn!(server = %shared.config.name, %error, "speaking initialize to the server instead");
            open(shared, actor).await
        }
        opened => opened,
    }
}

async fn open(
    shared: Arc<ServerShared>,
    actor: ActorRef<McpMsg>,
) -> Result<(Connection, Option<ProcessGroupGuard>, Vec<Tool>), String> {
    let fallback_actor = actor.clone();
    let handler = McpClientHandler { shared: shared.clone(), actor };
    let config = &shared.config;
    let mut group = None;
    let connection = match &config.transport {
        McpTransport::Stdio { command, args, env, cwd } => {
            let tag = ProcessTag::new();
            let mut cmd = tokio::process::Command::new(command);
            // A server gets the environment the MCP SDKs give theirs, not toolmesh's own
            // (which may hold keys and secrets): these few variables, and what the
            // configuration names.
            cmd.env_clear()
                .envs(INHERITED.iter().filter_map(|name| Some((name, std::env::var_os(name)?))))
                .args(args)
                .envs(env)
                .env(toolmesh_process::TAG_VAR, tag.as_str());
            if let Some(cwd) = cwd {
                cmd.current_dir(cwd);
            }
            let mut wrapped = process_wrap::tokio::CommandWrap::from(cmd);
            wrapped
                .wrap(process_wrap::tokio::ProcessGroup::leader())
                .wrap(process_wrap::tokio::KillOnDrop);
            let (transport, stderr) = toolmesh_process::spawn_managed(
                || TokioChildProcess::builder(wrapped).stderr(Stdio::piped()).spawn(),
                |(transport, _)| transport.id(),
            )
            .map_err(|e| format!("cannot start {}: {e}", command.display()))?;
            // The child leads its own process group (ProcessGroup::leader), so its pid is
            // the group id.
            group = transport
                .id()
                .and_then(|pid| i32::try_from(pid).ok())
                .map(|group| ProcessGroupGuard { group, tag });
            if let Some(stderr) = stderr {
                let server = config.name.clone();
                tokio::spawn(
                    async move {
                        let mut lines = BufReader::new(stderr).lines();
                        while let Ok(Some(line)) = lines.next_line().await {
                            debug!("stderr: {line}");
                        }
                    }
                    .instrument(info_span!("mcp", server = %server, task = "stderr")),
                );
            }
            handler
                .serve_with_lifecycle(transport, lifecycle(&shared))
                .await
                .map_err(|e| handshake_failed(&shared, &e))?
        }
        McpTransport::StreamableHttp { url, headers, sse_fallback } => {
            let mut http = StreamableHttpClientTransportConfig::with_uri(url.clone());
            let mut base = http::HeaderMap::new();
            for (name, value) in headers {
                let name: http::HeaderName =
                    name.parse().map_err(|e| format!("header {name}: {e}"))?;
                let value: http::HeaderValue =
                    value.parse().map_err(|e| format!("header value: {e}"))?;
                http.custom_headers.insert(name.clone(), value.clone());
                base.insert(name, value);
            }
            http.max_concurrent_requests = 256;
            // The new connection's session is noted once its client sends in it.
            shared.http_session.store(None);
            let endpoint = crate::direct::Endpoint {
                url: url.parse().map_err(|e| format!("{url}: {e}"))?,
                headers: base,
            };
            let client = TracingHttpClient::new(
                shared.http_client(),
                shared.call_headers.clone(),
                shared.http_session.clone(),
                endpoint,
            );
            let transport = StreamableHttpClientTransport::with_client(client, http);
            match handler.serve_with_lifecycle(transport, lifecycle(&shared)).await {
                Ok(connection) => connection,
                Err(error) if misanswered_discover(&shared, &error) => {
                    return Err(handshake_failed(&shared, &error));
                }
                Err(error) if *sse_fallback => {
                    debug!(server = %config.name, %error, "streamable HTTP failed; trying legacy SSE");
                    let handler =
                        McpClientHandler { shared: shared.clone(), actor: fallback_actor };
                    connect_sse(handler, url, headers).await.map_err(|sse| {
                        format!("streamable HTTP failed ({error}); legacy SSE failed too ({sse})")
                    })?
                }
                Err(error) => return Err(handshake_failed(&shared, &error)),
            }
        }
        McpTransport::Sse { url, headers } => connect_sse(handler, url, headers).await?,
    };
    let listing = std::time::Instant::now();
    let tools = list_tools(&connection).await.map_err(|e| format!("tools/list failed: {e}"))?;
    debug!(
        server = %config.name,
        tools = tools.len(),
        elapsed_us = listing.elapsed().as_micros() as u64,
        "tools listed"
    );
    Ok((connection, group, tools))
}

/// Closes a lazy server's connection `generation` once it has gone unused for the idle
/// timeout.
/// The delay before the next reconnect after `failures` failed attempts in a row.
pub(crate) fn reconnect_delay(failures: u32) -> Duration {
    BACKOFF_BASE.saturating_mul(1 << failures.min(16)).min(BACKOFF_CAP)
}

pub(crate) async fn watch_idle(
    shared: Arc<ServerShared>,
    actor: ActorRef<McpMsg>,
    lost: CancellationToken,
    generation: u64,
) {
    let idle = shared.config.idle_timeout;
    let step = (idle / 4).max(Duration::from_millis(20));
    loop {
        tokio::select! {
            () = lost.cancelled() => return,
            () = tokio::time::sleep(step) => {}
        }
        if shared.unused_for() >= idle && shared.inflight_calls().is_empty() {
            let _ = actor.cast(McpMsg::Idle { generation });
            return;
        }
    }
}

/// Probes the server every `interval` while connection `generation` lives, with the
/// lightest request its protocol revision defines: `ping` up to 2025-11-25, and
/// `server/discover` on 2026-07-28, which has no `ping`. Any answer, a JSON-RPC error
/// included, proves the peer alive; a closed transport, or [`PROBE_MISSES`] probes in a
/// row that fail or go unanswered within `interval` (after a miss, the next comes at a
/// fifth of the interval), declare the connection lost.
pub(crate) async fn probe(
    peer: rmcp::service::Peer<RoleClient>,
    modern: bool,
    interval: Duration,
    lost: CancellationToken,
    actor: ActorRef<McpMsg>,
    generation: u64,
) {
    let mut missed = 0;
    loop {
        // After a miss the next probe comes sooner: a dead server is found within about an
        // interval, and calls waiting on it (repeated ones too) learn it in seconds.
        let wait =
            if missed == 0 { interval } else { (interval / 5).max(Duration::from_millis(200)) };
        tokio::select! {
            () = lost.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        let request = if modern {
            ClientRequest::DiscoverRequest(DiscoverRequest::new(DiscoverRequestParams {}))
        } else {
            ClientRequest::PingRequest(PingRequest::default())
        };
        let miss = match tokio::time::timeout(interval, peer.send_request(request)).await {
            Ok(Ok(_) | Err(ServiceError::McpError(_) | ServiceError::UnexpectedResponse)) => {
                missed = 0;
                continue;
            }
            // The transport itself is gone: there is nothing to wait for.
            Ok(Err(ServiceError::TransportClosed)) => {
                let reason = "liveness probe failed: the transport is closed".to_owned();
                let _ = actor.cast(McpMsg::Disconnected { generation, reason });
                return;
            }
            Ok(Err(error)) => format!("liveness probe failed: {error}"),
            Err(_) => format!("no answer to the liveness probe within {interval:?}"),
        };
        // A server busy or starved for a moment is not a lost one: only several probes in
        // a row unanswered are.
        missed += 1;
        if missed < PROBE_MISSES {
            debug!(generation, missed, reason = %miss, "liveness probe missed");
            continue;
        }
        let reason = format!("{PROBE_MISSES} liveness probes in a row failed; the last: {miss}");
        let _ = actor.cast(McpMsg::Disconnected { generation, reason });
        return;
    }
}

pub(crate) fn describe(reason: Result<QuitReason, tokio::task::JoinError>) -> String {
    match reason {
        Ok(QuitReason::Cancelled) => "closed by toolmesh".into(),
        Ok(QuitReason::Closed) => "the server closed the connection".into(),
        Ok(other) => format!("{other:?}"),
        Err(error) => format!("connection task failed: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnects_back_off_exponentially_up_to_the_cap() {
        let delays: Vec<u64> = (0..10).map(|n| reconnect_delay(n).as_millis() as u64).collect();
        assert_eq!(delays, [250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]);
        assert_eq!(reconnect_delay(u32::MAX), BACKOFF_CAP);
    }
}
