use std::process::Stdio;

use crate::CommandToolConfig;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use toolmesh_core::{BackendError, CallContext, Nesting, ToolOutput, ToolSource, ToolSpec};
use toolmesh_process::ProcessTag;
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
/// runs without a shell, in a process group of its own, tagged (see `toolmesh-process`).
/// When the call ends — it finished, was cancelled or timed out — the group and every
/// tagged descendant are killed, also those that left the group, so none outlives the call.
/// Once the command has exited, its output is read for `output_grace` more, not for as long
/// as a background descendant keeps the pipe open.
#[derive(Debug)]
pub struct CommandTool {
    config: CommandToolConfig,
}

impl CommandTool {
    /// Returns the tool for `config`.
    pub fn new(config: CommandToolConfig) -> Self {
        toolmesh_process::adopt_orphans();
        CommandTool { config }
    }

    async fn run(&self, arguments: &Value, nesting: &Nesting) -> Result<ToolOutput, String> {
        let config = &self.config;
        let mut command = tokio::process::Command::new(&config.command);
        command
            .args(&config.args)
            .env_clear()
            .envs(INHERITED_ENV.iter().filter_map(|k| std::env::var(k).ok().map(|v| (*k, v))))
            .envs(&config.env)
            // A command that calls back into toolmesh (`toolmesh call`) sends these.
            .envs(nesting.pairs(Nesting::DEPTH_ENV, Nesting::PARENT_ENV))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(cwd) = &config.cwd {
            command.current_dir(cwd);
        }
        let tag = ProcessTag::new();
        let mut child = toolmesh_process::spawn(&mut command, &tag)
            .map_err(|error| format!("cannot start {}: {error}", config.command.display()))?;
        // However the call ends, the tree goes with it.
        let tree = ProcessTree { leader: child.id(), tag };

        let mut stdin = child.stdin.take().expect("stdin is piped");
        let input = serde_json::to_vec(arguments).expect("JSON values serialize");
        let write = async move {
            // A command that does not read its input closes the pipe early: not an error.
            let _ = stdin.write_all(&input).await;
        };
        let stdout =
            read_limited(child.stdout.take().expect("stdout is piped"), config.max_output_bytes);
        let stderr = read_limited(child.stderr.take().expect("stderr is piped"), 64 * 1024);
        let reading = async { tokio::join!(write, stdout, stderr) };
        tokio::pin!(reading);
        let (status, outputs) = tokio::select! {
            outputs = &mut reading => (child.wait().await, outputs),
            status = child.wait() => {
                // Whatever still holds the pipes gets a moment, then goes.
                let outputs = match tokio::time::timeout(config.output_grace, &mut reading).await {
                    Ok(outputs) => outputs,
                    Err(_) => {
                        debug!(command = %config.command.display(), "descendants still hold the output; killing them");
                        tree.kill().await;
                        reading.await
                    }
                };
                (status, outputs)
            }
        };
        let ((), stdout, stderr) = outputs;
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

/// A command's process tree: killed whole when the call ends, on completion, cancellation
/// and timeout alike.
struct ProcessTree {
    /// The command's pid, which is its process group's id.
    leader: Option<u32>,
    tag: ProcessTag,
}

impl ProcessTree {
    fn group(&self) -> Option<i32> {
        self.leader.and_then(|pid| i32::try_from(pid).ok())
    }

    /// Kills the tree and waits until it is gone.
    async fn kill(&self) {
        let (group, tag) = (self.group(), self.tag.clone());
        let _ = tokio::task::spawn_blocking(move || toolmesh_process::kill_tree(group, &tag)).await;
    }
}

impl Drop for ProcessTree {
    fn drop(&mut self) {
        let (group, tag) = (self.group(), self.tag.clone());
        if let Some(leader) = self.leader {
            toolmesh_process::release(leader);
        }
        // A dropped call cannot wait: the group is killed now, the stragglers on a thread.
        if let Some(group) = group {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(group),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let stragglers = move || toolmesh_process::kill_tree(group, &tag);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(stragglers)),
            Err(_) => drop(std::thread::spawn(stragglers)),
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
        spec.annotations = common.annotations;
        spec
    }

    async fn call(&self, ctx: &CallContext, arguments: Value) -> Result<ToolOutput, BackendError> {
        Ok(self.run(&arguments, &Nesting::of(ctx)).await.unwrap_or_else(ToolOutput::error))
    }
}
