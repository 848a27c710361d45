use std::process::Stdio;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use toolmesh_config::CommandToolConfig;
use toolmesh_core::{BackendError, CallContext, ToolOutput, ToolSource, ToolSpec};
use toolmesh_workers::LocalTool;
use tracing::debug;

use crate::CONFIG_SOURCE;

/// Longest stderr excerpt put into an error result.
const EXCERPT_CHARS: usize = 500;
/// Variables passed on from toolmesh's own environment; nothing else leaks to the tool.
const INHERITED_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR"];

/// A tool that runs an executable per call, from configuration (`[[tools.command]]`).
///
/// The JSON arguments go to stdin; stdout is the result (JSON when it parses, text
/// otherwise); a non-zero exit is an error result with an excerpt of stderr. The command
/// runs without a shell, in a process group of its own that is killed (SIGKILL) when the
/// call ends, is cancelled or times out, so no descendant outlives the call.
#[derive(Debug)]
pub struct CommandTool {
    config: CommandToolConfig,
}

impl CommandTool {
    /// Returns the tool for `config`.
    pub fn new(config: CommandToolConfig) -> Self {
        CommandTool { config }
    }

    async fn run(&self, arguments: &Value) -> Result<ToolOutput, String> {
        let config = &self.config;
        let mut command = tokio::process::Command::new(&config.command);
        command
            .args(&config.args)
            .env_clear()
            .envs(INHERITED_ENV.iter().filter_map(|k| std::env::var(k).ok().map(|v| (*k, v))))
            .envs(&config.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(cwd) = &config.cwd {
            command.current_dir(cwd);
        }
        let mut child = command
            .spawn()
            .map_err(|error| format!("cannot start {}: {error}", config.command.display()))?;
        let _group = child.id().map(ProcessGroup);

        let mut stdin = child.stdin.take().expect("stdin is piped");
        let input = serde_json::to_vec(arguments).expect("JSON values serialize");
        let write = async move {
            // A command that does not read its input closes the pipe early: not an error.
            let _ = stdin.write_all(&input).await;
        };
        let stdout =
            read_limited(child.stdout.take().expect("stdout is piped"), config.max_output_bytes);
        let stderr = read_limited(child.stderr.take().expect("stderr is piped"), 64 * 1024);
        let ((), stdout, stderr, status) = tokio::join!(write, stdout, stderr, child.wait());
        let status = status.map_err(|error| format!("waiting for the command: {error}"))?;
        let (stdout, overflow) = stdout.map_err(|error| format!("reading stdout: {error}"))?;
        let (stderr, _) = stderr.unwrap_or_default();

        if !status.success() {
            let code = status.code().map_or_else(|| "a signal".to_owned(), |c| c.to_string());
            let excerpt: String =
                String::from_utf8_lossy(&stderr).trim().chars().take(EXCERPT_CHARS).collect();
            return Err(format!("command exited with {code}: {excerpt}"));
        }
        if overflow {
            return Err(format!(
                "output larger than max_output_bytes ({} bytes)",
                config.max_output_bytes
            ));
        }
        let text = String::from_utf8_lossy(&stdout);
        Ok(match serde_json::from_str::<Value>(text.trim()) {
            Ok(json) if !text.trim().is_empty() => ToolOutput::json(json),
            _ => ToolOutput::text(text.trim_end().to_owned()),
        })
    }
}

/// Reads at most `limit` bytes, then keeps draining so the writer never blocks; returns the
/// bytes and whether more came.
async fn read_limited(
    mut reader: impl AsyncRead + Unpin,
    limit: usize,
) -> std::io::Result<(Vec<u8>, bool)> {
    let mut kept = Vec::new();
    let mut overflow = false;
    let mut buffer = [0u8; 8192];
    loop {
        let n = reader.read(&mut buffer).await?;
        if n == 0 {
            return Ok((kept, overflow));
        }
        let room = limit.saturating_sub(kept.len());
        kept.extend_from_slice(&buffer[..n.min(room)]);
        overflow |= n > room;
    }
}

/// Kills a process group when dropped: on completion, cancellation and timeout alike.
struct ProcessGroup(u32);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        let Ok(pid) = i32::try_from(self.0) else { return };
        // ESRCH (the group is already gone) is the usual outcome after a clean exit.
        if nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .is_ok()
        {
            debug!(pgid = pid, "killed the command's process group");
        }
    }
}

#[async_trait::async_trait]
impl LocalTool for CommandTool {
    fn spec(&self) -> ToolSpec {
        let common = &self.config.common;
        let mut spec = ToolSpec::new(
            &common.name,
            &common.description,
            common.parameters.clone(),
            ToolSource::local(CONFIG_SOURCE),
        );
        spec.tags = common.tags.clone();
        spec.timeout = Some(common.timeout);
        spec
    }

    async fn call(&self, _ctx: &CallContext, arguments: Value) -> Result<ToolOutput, BackendError> {
        Ok(self.run(&arguments).await.unwrap_or_else(ToolOutput::error))
    }
}
