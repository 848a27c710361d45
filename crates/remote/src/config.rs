//! `[remote]`: heartbeats and the timeouts of remote calls.

use std::{collections::BTreeMap, time::Duration};

use serde::Deserialize;

/// The section of the configuration file the remote workers define.
pub const SECTION: &str = "remote";

/// `[remote]`.
///
/// ```toml
/// [remote]
/// heartbeat_interval_ms = 5000
/// heartbeat_timeout_ms = 15000
/// schedule_to_start_ms = 10000
/// [remote.tools.report_build]
/// schedule_to_start_ms = 60000
/// start_to_close_ms = 300000
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RemoteConfig {
    /// How often the router and each worker send a heartbeat.
    pub heartbeat_interval_ms: u64,
    /// Silence after which a worker counts as gone: the calls in flight on it are answered
    /// (repeated elsewhere when the tool is read-only or idempotent).
    pub heartbeat_timeout_ms: u64,
    /// How long a call may wait for a worker with a free slot; then `RESOURCE_EXHAUSTED`
    /// (or `UNAVAILABLE` when no worker serves the tool), unless the caller's deadline
    /// comes first.
    pub schedule_to_start_ms: u64,
    /// How long one attempt may run on a worker; 0: the call's own timeout.
    pub start_to_close_ms: u64,
    /// Per-tool timeouts, by tool name.
    pub tools: BTreeMap<String, ToolTimeouts>,
    /// The role a worker's credential must carry when the server requires credentials
    /// (`[auth]`): serving tools to every caller is a trust no other role grants.
    pub worker_role: String,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            heartbeat_interval_ms: 5_000,
            heartbeat_timeout_ms: 15_000,
            schedule_to_start_ms: 10_000,
            start_to_close_ms: 0,
            tools: BTreeMap::new(),
            worker_role: "worker".into(),
        }
    }
}

/// `[remote.tools.<name>]`: one tool's timeouts; an unset one is `[remote]`'s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolTimeouts {
    /// As [`RemoteConfig::schedule_to_start_ms`].
    pub schedule_to_start_ms: Option<u64>,
    /// As [`RemoteConfig::start_to_close_ms`].
    pub start_to_close_ms: Option<u64>,
}

impl toolmesh_config::Section for RemoteConfig {
    const NAME: &'static str = SECTION;
    const DEFAULTS: &'static str = include_str!("default.toml");

    fn read(
        value: toml::Value,
        cx: &toolmesh_config::Reading<'_>,
    ) -> Result<Self, toolmesh_config::ConfigError> {
        cx.deserialize_checked(value, RemoteConfig::check)
    }
}

impl RemoteConfig {
    /// Checks the values: intervals and timeouts must be positive, and the heartbeat
    /// timeout longer than the interval. Returns the key and reason of the first problem.
    pub fn check(&self) -> Result<(), (String, String)> {
        let positive = [
            ("heartbeat_interval_ms", self.heartbeat_interval_ms),
            ("heartbeat_timeout_ms", self.heartbeat_timeout_ms),
            ("schedule_to_start_ms", self.schedule_to_start_ms),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err((format!("{SECTION}.{key}"), "must be greater than 0".into()));
            }
        }
        if self.heartbeat_timeout_ms <= self.heartbeat_interval_ms {
            return Err((
                format!("{SECTION}.heartbeat_timeout_ms"),
                "must be longer than heartbeat_interval_ms".into(),
            ));
        }
        for (tool, timeouts) in &self.tools {
            if timeouts.schedule_to_start_ms == Some(0) {
                return Err((
                    format!("{SECTION}.tools.{tool}.schedule_to_start_ms"),
                    "must be greater than 0".into(),
                ));
            }
        }
        Ok(())
    }

    /// The schedule-to-start and start-to-close timeouts of `tool` (`None`: the call's).
    pub fn timeouts(&self, tool: &str) -> (Duration, Option<Duration>) {
        let own = self.tools.get(tool).copied().unwrap_or_default();
        let schedule = own.schedule_to_start_ms.unwrap_or(self.schedule_to_start_ms);
        let close = own.start_to_close_ms.unwrap_or(self.start_to_close_ms);
        (Duration::from_millis(schedule), (close > 0).then(|| Duration::from_millis(close)))
    }

    /// The heartbeat interval.
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms)
    }

    /// The heartbeat timeout.
    pub fn heartbeat_timeout(&self) -> Duration {
        Duration::from_millis(self.heartbeat_timeout_ms)
    }
}
