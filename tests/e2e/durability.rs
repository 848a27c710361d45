//! What survives a kill and a full disk: acknowledged writes, a half-done first
//! embedding.

use nix::sys::signal::Signal;
use serde_json::json;
use std::{path::Path, time::Duration};
use tonic::Code;
use toolmesh_e2e::cli::{health_of, index_counts, ingest_documents, passages};
use toolmesh_e2e::{BinaryServer, eventually};
use toolmesh_proto::v1::CallToolRequest;

/// Documents acknowledged by Ingest, and a re-ingestion of some of them acknowledged just
/// before the router is killed with SIGKILL, are all there after a restart on the same data
/// directory, each once, at the version acknowledged last.
#[tokio::test]
async fn acknowledged_ingests_and_replacements_survive_a_kill() {
    let data = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmesh.toml");
    std::fs::write(
        &config,
        "[[knowledge.collections]]\nname = \"docs\"\ndescription = \"The handbook.\"\n",
    )
    .unwrap();
    let args = ["--config", config.to_str().unwrap(), "--data-dir", data.path().to_str().unwrap()];
    let text = |i: usize, version: &str| format!("Handbook page {i} about lighthouses, {version}.");
    let first: Vec<(String, String)> =
        (0..5).map(|i| (format!("page-{i}"), text(i, "first edition"))).collect();
    let second: Vec<(String, String)> =
        (0..3).map(|i| (format!("page-{i}"), text(i, "second edition"))).collect();

    let mut server = BinaryServer::start(&args, &[]).await.unwrap();
    let addr = server.addr.to_string();
    assert_eq!(ingest_documents(&addr, &first).await.unwrap(), 5);
    assert_eq!(ingest_documents(&addr, &second).await.unwrap(), 3);
    // Killed right after the acknowledgement: no shutdown, no flush.
    server.signal(Signal::SIGKILL);
    server.child.wait().await.unwrap();

    let server = BinaryServer::start(&args, &[]).await.unwrap();
    let addr = server.addr.to_string();
    let mut found = passages(&addr, "handbook page about lighthouses").await;
    found.sort();
    let mut expected: Vec<(String, String)> = second.iter().chain(&first[3..]).cloned().collect();
    expected.sort();
    assert_eq!(found, expected, "every acknowledged document once, at its last version");
}

/// The first start's embedding of the tool catalog, killed with SIGKILL half way, goes on
/// from where it was after a restart on the same data directory: the tools embedded before
/// the kill are not embedded again, and every tool is in the index once.
#[tokio::test]
async fn a_first_embedding_killed_half_way_goes_on_from_where_it_was() {
    const TOOLS: usize = 1500;
    let data = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmesh.toml");
    let words = ["invoices", "weather", "tickets", "orders", "calendars", "repositories"];
    let catalog: String = (0..TOOLS)
        .map(|i| {
            format!(
                "[[tools.command]]\nname = \"tool_{i}\"\ndescription = \"Lists the {} of \
                 account {i} and sums them up.\"\ncommand = \"true\"\n",
                words[i % words.len()]
            )
        })
        .collect();
    std::fs::write(&config, catalog).unwrap();
    let args = ["--config", config.to_str().unwrap(), "--data-dir", data.path().to_str().unwrap()];

    let mut server = BinaryServer::start(&args, &[]).await.unwrap();
    let addr = server.addr.to_string();
    let half_way = eventually(Duration::from_secs(120), || async {
        let (indexed, embedded) = index_counts(&addr).await?;
        // A few batches in, and far from done.
        (indexed as usize > TOOLS && embedded >= 200 && embedded + 500 < indexed)
            .then_some(embedded)
    })
    .await
    .expect("the embedding under way");
    server.signal(Signal::SIGKILL);
    server.child.wait().await.unwrap();

    let server = BinaryServer::start(&args, &[]).await.unwrap();
    let addr = server.addr.to_string();
    let indexed = eventually(Duration::from_secs(300), || async {
        let (indexed, embedded) = index_counts(&addr).await?;
        (indexed as usize > TOOLS && embedded == indexed).then_some(indexed)
    })
    .await
    .expect("the embedding completes");
    let logs = eventually(Duration::from_secs(10), || async {
        let logs = server.logs();
        logs.contains("embedded tool texts").then_some(logs)
    })
    .await
    .unwrap_or_else(|| panic!("the run's count is logged: {}", server.logs()));
    let made: u64 = logs
        .lines()
        .find(|line| line.contains("embedded tool texts"))
        .and_then(|line| line.split("tools=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the run's count is logged: {logs}"));
    assert!(
        made <= indexed - half_way,
        "{made} texts embedded again; {half_way} of {indexed} were before the kill: {logs}"
    );
}

/// Bytes free on the file system of `path`.
fn free_bytes(path: &Path) -> u64 {
    let out = std::process::Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).lines().nth(1).unwrap().trim().parse().unwrap()
}

/// With the data directory on a small file system filled past `vector.min_free_mb` (256 MiB
/// by default), ingestion is refused with RESOURCE_EXHAUSTED naming the disk, the store's
/// health goes NOT_SERVING, and searches and other tools go on; freed space lets writes in
/// again. Needs a loop mount (root): skipped, saying so, where it cannot mount.
#[tokio::test]
async fn a_nearly_full_disk_refuses_writes_and_serves_everything_else() {
    let base = tempfile::tempdir().unwrap();
    let (image, mount) = (base.path().join("disk.img"), base.path().join("disk"));
    std::fs::create_dir_all(&mount).unwrap();
    let made = std::process::Command::new("truncate")
        .args(["-s", "400M"])
        .arg(&image)
        .status()
        .unwrap()
        .success()
        && std::process::Command::new("mkfs.ext4")
            .arg("-q")
            .arg(&image)
            .status()
            .is_ok_and(|s| s.success());
    let mounted = made
        && std::process::Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mount)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!(
            "SKIPPED a_nearly_full_disk_refuses_writes_and_serves_everything_else: cannot loop-mount a file system here (needs root and mkfs.ext4)"
        );
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mount.clone());
    let data = mount.join("data");
    let config = base.path().join("toolmesh.toml");
    std::fs::write(
        &config,
        "[[knowledge.collections]]\nname = \"docs\"\ndescription = \"The handbook.\"\n",
    )
    .unwrap();
    let args = ["--config", config.to_str().unwrap(), "--data-dir", data.to_str().unwrap()];
    let server = BinaryServer::start(&args, &[]).await.unwrap();
    let addr = server.addr.to_string();
    let first = [("page-0".to_owned(), "Lighthouses guide ships at night.".to_owned())];
    assert_eq!(ingest_documents(&addr, &first).await.unwrap(), 1);

    // Fill the disk to 200 MiB free, below the 256 MiB the store keeps.
    let filler = mount.join("filler");
    let fill = free_bytes(&mount).saturating_sub(200 << 20);
    assert!(
        std::process::Command::new("fallocate")
            .args(["-l", &fill.to_string()])
            .arg(&filler)
            .status()
            .unwrap()
            .success()
    );
    let second = [("page-1".to_owned(), "Foghorns sound in the mist.".to_owned())];
    let refused = ingest_documents(&addr, &second).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains(data.to_str().unwrap()), "{refused:?}");
    assert!(refused.message().contains("vector.min_free_mb"), "{refused:?}");
    let down = eventually(Duration::from_secs(15), || async {
        (health_of(&addr, "toolmesh.vector.embedded").await == Some(2)).then_some(())
    });
    assert!(down.await.is_some(), "the store's health goes NOT_SERVING");
    // Reads and other tools go on; the process is alive.
    let found = passages(&addr, "lighthouses").await;
    assert_eq!(found, [("page-0".to_owned(), first[0].1.clone())]);
    let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
    let echo = CallToolRequest {
        name: "echo".into(),
        arguments_json: json!({"text": "still here"}).to_string(),
        ..Default::default()
    };
    assert!(!client.call_tool(echo).await.unwrap().into_inner().is_error);

    // Space freed: writes go in again and the health comes back.
    std::fs::remove_file(&filler).unwrap();
    let up = eventually(Duration::from_secs(15), || async {
        (health_of(&addr, "toolmesh.vector.embedded").await == Some(1)).then_some(())
    });
    assert!(up.await.is_some(), "the store's health comes back");
    assert_eq!(ingest_documents(&addr, &second).await.unwrap(), 1);
    drop(server);
    tokio::time::sleep(Duration::from_secs(2)).await;
}
