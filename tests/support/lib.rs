//! Helpers of toolmesh's end-to-end tests: servers on `127.0.0.1:0`, the real `toolmesh`
//! binary as a child process, and local tools with scripted behaviour; [`calls`] over the
//! gRPC API, [`cli`] for the binaries.

pub mod balancer;
mod binary;
pub mod calls;
pub mod cli;
pub mod otlp;
pub mod pki;
mod server;
pub mod tools;
mod upstream;

pub use binary::{BinaryServer, BinaryWorker, toolmesh_bench_bin, toolmesh_bin};
pub use server::TestServer;
pub use upstream::{PyHttpServer, py_server, py_stdio_config, python, python_client, serve_http};

use std::time::Duration;

/// Starts `command` as a child that toolmesh's reaper of orphans leaves alone: the tests
/// run toolmesh in this process too, and it reaps any child of the process that stays a
/// zombie, unless the child is registered, as every child toolmesh starts is.
pub fn spawn(command: &mut tokio::process::Command) -> std::io::Result<tokio::process::Child> {
    toolmesh_process::spawn_managed(|| command.spawn(), tokio::process::Child::id)
}

/// Polls `check` every 20 ms until it returns `Some`, for at most `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Returns whether a process with this pid exists (zombies count as gone).
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the parenthesised command name.
            let state = stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X"))
        }
        Err(_) => false,
    }
}

/// Writes an executable shell script `name` with `body` into `dir`.
pub fn write_script(dir: &std::path::Path, name: &str, body: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write the script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .expect("make it executable");
    path
}

/// Returns the text and JSON parts of a response, one per line.
pub fn text(response: &toolmesh_proto::v1::CallToolResponse) -> String {
    use toolmesh_proto::v1::content_part::Part;
    response
        .content
        .iter()
        .filter_map(|p| match &p.part {
            Some(Part::Text(t)) => Some(t.clone()),
            Some(Part::Json(j)) => Some(j.clone()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Returns the passages of a knowledge search's result as (document id, text), best first;
/// each has a score and a chunk position.
pub fn passages(response: &toolmesh_proto::v1::CallToolResponse) -> Vec<(String, String)> {
    assert!(!response.is_error, "{response:?}");
    let structured: serde_json::Value =
        serde_json::from_str(response.structured_json.as_deref().expect("structured output"))
            .expect("structured output is JSON");
    structured["passages"]
        .as_array()
        .expect("passages")
        .iter()
        .map(|p| {
            assert!(p["score"].is_number() && p["chunk"].is_u64(), "{p}");
            let field = |name: &str| p[name].as_str().expect("a string field").to_owned();
            (field("document_id"), field("text"))
        })
        .collect()
}
