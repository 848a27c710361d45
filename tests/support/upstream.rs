//! Servers that toolmesh talks to, started on loopback for a test.

use std::{net::SocketAddr, path::Path, process::Stdio, time::Duration};

use crate::eventually;

/// The Python interpreter of the tests (`TOOLMESH_TEST_PYTHON`, else `python3`).
pub fn python() -> String {
    std::env::var("TOOLMESH_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Runs the Python grpcio client of `tests/python/client_test.py` against `addr`, with
/// extra environment `env` (`TOOLMESH_TOKEN`, `TOOLMESH_CA_CERT`, …).
pub async fn python_client(addr: &str, env: &[(&str, &str)]) -> std::process::Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/client_test.py");
    tokio::process::Command::new(python())
        .arg(script)
        .arg(addr)
        .env_remove("TOOLMESH_TOKEN")
        .envs(env.iter().copied())
        .output()
        .await
        .expect("python3 runs (tests/setup installs grpcio and grpcio-tools)")
}

/// The path of `tests/mcp/py_server.py`, the scripted Python SDK server.
pub fn py_server() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/py_server.py").display().to_string()
}

/// The `[[mcp.servers]]` entry of `tests/mcp/py_server.py` over stdio, named `py`.
pub fn py_stdio_config() -> String {
    format!(
        "[[mcp.servers]]\nname = \"py\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"{}\"]\n",
        python(),
        py_server()
    )
}

/// `tests/mcp/py_server.py` serving streamable HTTP on a free port; killed on drop.
pub struct PyHttpServer {
    /// The server process.
    pub child: tokio::process::Child,
    /// Its port on 127.0.0.1; the MCP endpoint is `/mcp`.
    pub port: u16,
}

impl PyHttpServer {
    /// Starts the server and waits until it listens.
    pub async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = crate::spawn(
            tokio::process::Command::new(python())
                .arg(py_server())
                .args(["http", &port.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true),
        )
        .expect("start the Python MCP server");
        eventually(Duration::from_secs(30), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()
        })
        .await
        .expect("the Python server listens");
        PyHttpServer { child, port }
    }

    /// Returns its MCP endpoint.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

/// Serves `app` on `127.0.0.1:0` for the rest of the test; returns its address.
pub async fn serve_http(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let addr = listener.local_addr().expect("a bound address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}
