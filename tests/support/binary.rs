use std::{
    net::SocketAddr,
    path::PathBuf,
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

/// Returns the path of the `toolmesh` binary beside this test's target directory, which
/// `tests/run` builds before the tests (override with `TOOLMESH_BIN`).
pub fn toolmesh_bin() -> PathBuf {
    if let Ok(path) = std::env::var("TOOLMESH_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> → target/<profile>/toolmesh
    let bin = exe.parent().and_then(|deps| deps.parent()).expect("target dir").join("toolmesh");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo test --workspace`, which builds it",
        bin.display()
    );
    bin
}

/// Returns the path of the `toolmesh-bench` binary beside the `toolmesh` one.
pub fn toolmesh_bench_bin() -> PathBuf {
    let bin = toolmesh_bin().with_file_name("toolmesh-bench");
    assert!(bin.exists(), "{} is missing: tests/run builds it", bin.display());
    bin
}

/// The real `toolmesh serve` as a child process on `127.0.0.1:0`. Dropping it stops the
/// server as an operator would, with SIGTERM, so that it stops its MCP servers and their
/// processes; it exits within its shutdown grace period.
pub struct BinaryServer {
    /// The announced address.
    pub addr: SocketAddr,
    /// The child process.
    pub child: Child,
    /// Everything the server wrote to stderr so far.
    pub stderr: Arc<Mutex<String>>,
    /// The directory of a configuration written by [`BinaryServer::with_config`].
    _config: Option<tempfile::TempDir>,
    /// The data directory made for the server when the arguments name none.
    _data: Option<tempfile::TempDir>,
}

impl BinaryServer {
    /// Starts `toolmesh serve --listen 127.0.0.1:0 ARGS…` with extra environment `env`,
    /// and waits for the address line.
    pub async fn start(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Self> {
        Self::start_under(&[], args, env).await
    }

    /// Starts the server with the configuration file `toml` (written to a directory that
    /// lives as long as the server) and extra environment `env`.
    pub async fn with_config(toml: &str, env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("toolmesh.toml");
        std::fs::write(&config, toml)?;
        let mut server = Self::start(&["--config", &config.display().to_string()], env).await?;
        server._config = Some(dir);
        Ok(server)
    }

    /// Like [`BinaryServer::start`], run by the command `wrapper` (for example
    /// `["prlimit", "--nofile=1024:1024", "--"]`), which execs toolmesh.
    pub async fn start_under(
        wrapper: &[&str],
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let mut command = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut command = Command::new(program);
                command.args(rest).arg(toolmesh_bin());
                command
            }
            None => Command::new(toolmesh_bin()),
        };
        // Each server gets a data directory of its own unless the test names one.
        let data = if args.contains(&"--data-dir") { None } else { Some(tempfile::tempdir()?) };
        command.arg("serve").args(["--listen", "127.0.0.1:0"]);
        if let Some(data) = &data {
            command.arg("--data-dir").arg(data.path());
        }
        command
            .args(args)
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = crate::spawn(&mut command).context("starting toolmesh")?;
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let mut err_lines = BufReader::new(child.stderr.take().context("stderr")?).lines();
        tokio::spawn(async move {
            while let Ok(Some(line)) = err_lines.next_line().await {
                sink.lock().expect("stderr buffer").push_str(&(line + "\n"));
            }
        });
        let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
        let line = match first {
            Ok(Ok(Some(line))) => line,
            _ => anyhow::bail!(
                "toolmesh did not announce its address; stderr:\n{}",
                stderr.lock().expect("buffer")
            ),
        };
        let addr = line.rsplit(' ').next().and_then(|a| a.parse().ok()).context("address line")?;
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(BinaryServer { addr, child, stderr, _config: None, _data: data })
    }

    /// Returns the child's pid.
    pub fn pid(&self) -> i32 {
        self.child.id().expect("child is running") as i32
    }

    /// Sends `signal` to the server.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal)
            .expect("signal the server");
    }

    /// Returns what the server logged so far.
    pub fn logs(&self) -> String {
        self.stderr.lock().expect("stderr buffer").clone()
    }
}

impl Drop for BinaryServer {
    fn drop(&mut self) {
        // Not waited for here: the test's runtime must go on to close its connections,
        // which the server's graceful shutdown waits for (bounded by its grace period).
        if let Some(pid) = self.child.id() {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
    }
}

/// The real `toolmesh worker` as a child process, serving the tools of the configuration
/// `toml` for the router at `router`. Dropping it stops it with SIGTERM (it drains).
pub struct BinaryWorker {
    /// The child process.
    pub child: Child,
    /// Everything the worker wrote to stderr so far.
    pub stderr: Arc<Mutex<String>>,
    _config: tempfile::TempDir,
}

impl BinaryWorker {
    /// Starts `toolmesh worker --router ROUTER --config FILE ARGS…`; does not wait for it
    /// to join (see [`BinaryWorker::joined`]).
    pub fn start(router: &str, toml: &str, args: &[&str]) -> anyhow::Result<Self> {
        Self::start_with_env(router, toml, args, &[])
    }

    /// Like [`BinaryWorker::start`], with extra environment `env`.
    pub fn start_with_env(
        router: &str,
        toml: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("worker.toml");
        std::fs::write(&config, toml)?;
        let mut child = crate::spawn(
            Command::new(toolmesh_bin())
                .arg("worker")
                .args(["--router", router, "--config"])
                .arg(&config)
                .args(args)
                .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
                .env_remove("RUST_LOG")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .envs(env.iter().copied())
                .kill_on_drop(true),
        )
        .context("starting toolmesh worker")?;
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let mut lines = BufReader::new(child.stderr.take().context("stderr")?).lines();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                sink.lock().expect("stderr buffer").push_str(&(line + "\n"));
            }
        });
        Ok(BinaryWorker { child, stderr, _config: dir })
    }

    /// Waits until the worker says it is connected to `sessions` routers.
    pub async fn joined(&self, sessions: usize) -> anyhow::Result<()> {
        let connected = crate::eventually(Duration::from_secs(20), || async {
            (self.logs().matches(" connected").count() >= sessions).then_some(())
        })
        .await;
        connected.with_context(|| format!("the worker did not connect:\n{}", self.logs()))
    }

    /// Returns the child's pid.
    pub fn pid(&self) -> i32 {
        self.child.id().expect("child is running") as i32
    }

    /// Sends `signal` to the worker.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal)
            .expect("signal the worker");
    }

    /// Returns what the worker logged so far.
    pub fn logs(&self) -> String {
        self.stderr.lock().expect("stderr buffer").clone()
    }
}

impl Drop for BinaryWorker {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
    }
}
