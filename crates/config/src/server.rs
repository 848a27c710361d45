//! `[server]`: the listener, its limits and timeouts, and the data directory.

use std::{
    collections::HashMap,
    net::SocketAddr,
    num::{NonZeroU32, NonZeroUsize},
    path::PathBuf,
    time::Duration,
};

use crate::{ConfigError, values::positive_ms};

use serde::Deserialize;
use toolmesh_core::RetryPolicy;

/// `[server]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// Where the embedded vector store keeps its collections; `None` when no place could
    /// be found (no `data_dir`, `XDG_DATA_HOME` or `HOME`).
    pub data_dir: Option<PathBuf>,
    /// Time in-flight calls get to finish on shutdown.
    pub shutdown_grace: Duration,
    /// Call timeout when neither client nor tool sets one.
    pub default_call_timeout: Duration,
    /// Upper bound of any call's timeout.
    pub max_call_timeout: Duration,
    /// Config file poll interval; `None`: reload on SIGHUP only.
    pub reload_poll: Option<Duration>,
    /// Longest request message accepted; longer ones are RESOURCE_EXHAUSTED.
    pub max_message_bytes: NonZeroUsize,
    /// Connections open at once.
    pub max_connections: NonZeroUsize,
    /// Connections one client address may have open at once; `None`: a quarter of the
    /// connections the server takes.
    pub max_connections_per_peer: Option<NonZeroUsize>,
    /// Longest wait for a new connection's HTTP/2 preface.
    pub handshake_timeout: Duration,
    /// A connection without a call in flight this long is closed; `None`: never. Health
    /// watches and reflection streams are not calls.
    pub idle_timeout: Option<Duration>,
    /// Health `Watch` streams one connection may have open at once.
    pub max_watches_per_connection: NonZeroUsize,
    /// Health `Watch` streams open at once in all.
    pub max_watches: NonZeroUsize,
    /// Calls (HTTP/2 streams) one connection may have open at once.
    pub max_concurrent_streams: u32,
    /// How often an HTTP/2 ping checks a connection's peer; `None`: no pings.
    pub keepalive_interval: Option<Duration>,
    /// How long a ping may go unanswered before the connection is closed.
    pub keepalive_timeout: Duration,
    /// How calls whose connection broke are repeated.
    pub retry: RetryPolicy,
    /// The deepest call nesting accepted: a tool calling back into toolmesh adds one.
    pub max_call_depth: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    pub(crate) listen: SocketAddr,
    pub(crate) data_dir: String,
    pub(crate) shutdown_grace_ms: u64,
    pub(crate) default_call_timeout_ms: u64,
    pub(crate) max_call_timeout_ms: u64,
    pub(crate) reload_poll_ms: u64,
    pub(crate) max_message_bytes: NonZeroUsize,
    pub(crate) max_connections: NonZeroUsize,
    pub(crate) max_connections_per_peer: Option<NonZeroUsize>,
    pub(crate) handshake_timeout_ms: u64,
    pub(crate) idle_timeout_ms: u64,
    pub(crate) max_watches_per_connection: NonZeroUsize,
    pub(crate) max_watches: NonZeroUsize,
    pub(crate) max_concurrent_streams: u32,
    pub(crate) keepalive_interval_ms: u64,
    pub(crate) keepalive_timeout_ms: u64,
    pub(crate) retry_attempts: NonZeroU32,
    pub(crate) retry_backoff_ms: u64,
    pub(crate) retry_max_backoff_ms: u64,
    pub(crate) max_call_depth: u32,
}

/// `$XDG_DATA_HOME/toolmesh`, else `$HOME/.local/share/toolmesh`, from `env`.
pub(crate) fn default_data_dir(env: &HashMap<String, String>) -> Option<PathBuf> {
    let non_empty = |name: &str| env.get(name).filter(|v| !v.is_empty());
    non_empty("XDG_DATA_HOME")
        .map(|dir| PathBuf::from(dir).join("toolmesh"))
        .or_else(|| non_empty("HOME").map(|home| PathBuf::from(home).join(".local/share/toolmesh")))
}

/// Reads `[server]`.
pub(crate) fn server(
    raw: RawServer,
    env: &HashMap<String, String>,
    key_error: &dyn Fn(String, String) -> ConfigError,
) -> Result<ServerConfig, ConfigError> {
    let server = ServerConfig {
        listen: raw.listen,
        data_dir: Some(PathBuf::from(&raw.data_dir))
            .filter(|dir| !dir.as_os_str().is_empty())
            .or_else(|| default_data_dir(env)),
        shutdown_grace: Duration::from_millis(raw.shutdown_grace_ms),
        default_call_timeout: positive_ms(
            raw.default_call_timeout_ms,
            "server.default_call_timeout_ms",
            &key_error,
        )?,
        max_call_timeout: positive_ms(
            raw.max_call_timeout_ms,
            "server.max_call_timeout_ms",
            &key_error,
        )?,
        reload_poll: (raw.reload_poll_ms > 0).then(|| Duration::from_millis(raw.reload_poll_ms)),
        max_message_bytes: raw.max_message_bytes,
        max_connections: raw.max_connections,
        max_connections_per_peer: raw.max_connections_per_peer,
        handshake_timeout: positive_ms(
            raw.handshake_timeout_ms,
            "server.handshake_timeout_ms",
            &key_error,
        )?,
        idle_timeout: (raw.idle_timeout_ms > 0).then(|| Duration::from_millis(raw.idle_timeout_ms)),
        max_watches_per_connection: raw.max_watches_per_connection,
        max_watches: raw.max_watches,
        max_concurrent_streams: match raw.max_concurrent_streams {
            0 => {
                return Err(key_error(
                    "server.max_concurrent_streams".into(),
                    "must be greater than 0".into(),
                ));
            }
            n => n,
        },
        keepalive_interval: (raw.keepalive_interval_ms > 0)
            .then(|| Duration::from_millis(raw.keepalive_interval_ms)),
        keepalive_timeout: positive_ms(
            raw.keepalive_timeout_ms,
            "server.keepalive_timeout_ms",
            &key_error,
        )?,
        retry: RetryPolicy {
            attempts: raw.retry_attempts,
            backoff: positive_ms(raw.retry_backoff_ms, "server.retry_backoff_ms", &key_error)?,
            max_backoff: positive_ms(
                raw.retry_max_backoff_ms,
                "server.retry_max_backoff_ms",
                &key_error,
            )?,
        },
        max_call_depth: raw.max_call_depth,
    };
    Ok(server)
}
