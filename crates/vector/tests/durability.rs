//! Acknowledged writes to the embedded engine survive the process being killed at any
//! moment: during writes, while segments merge, right after an acknowledgement.
//!
//! The test runs itself again as a writer child (`TOOLMESH_DURABILITY_WRITER` names its
//! directory), which replaces documents and upserts points from several tasks at once and
//! prints each acknowledgement; the parent kills it with SIGKILL at a random moment, opens
//! the directory, and checks every acknowledged write.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::{Map, Value, json};
use toolmesh_core::{
    VectorStore,
    vector::{CollectionSpec, Filter, Point, Precision, Scalar},
};
use toolmesh_vector::EmbeddedStore;

const WRITER: &str = "TOOLMESH_DURABILITY_WRITER";
const ROUND: &str = "TOOLMESH_DURABILITY_ROUND";
const COLLECTION: &str = "docs";
/// Documents the writer replaces again and again, each with this many chunks.
const DOCUMENTS: u64 = 150;
const CHUNKS: u64 = 20;
/// The writer's concurrent tasks.
const TASKS: u64 = 4;

fn spec() -> CollectionSpec {
    CollectionSpec {
        name: COLLECTION.into(),
        dense_size: Some(8),
        precision: Precision::Full,
        lexical: false,
        keyword_fields: vec!["doc".into()],
    }
}

fn chunk(doc: u64, chunk: u64, version: u64) -> Point {
    let Value::Object(payload) = json!({ "doc": doc.to_string(), "version": version }) else {
        unreachable!()
    };
    let seed = (doc * 31 + chunk * 7 + version) as f32;
    Point {
        id: doc * 1_000 + chunk,
        dense: Some((0..8).map(|i| (seed + i as f32).sin()).collect()),
        lexical: None,
        payload,
    }
}

/// The writer child: replaces documents and upserts single points until it is killed,
/// printing `replace DOC VERSION` and `upsert ID` once each write is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer() {
    let Ok(dir) = std::env::var(WRITER) else { return };
    let round: u64 = std::env::var(ROUND).unwrap().parse().unwrap();
    let store = Arc::new(EmbeddedStore::open(&dir).await.unwrap());
    store.ensure(&spec()).await.unwrap();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let store = store.clone();
            tokio::spawn(async move {
                for step in 0u64.. {
                    let version = round * 1_000_000 + step * TASKS + task;
                    let doc = (step * TASKS + task) % DOCUMENTS;
                    let points = (0..CHUNKS).map(|c| chunk(doc, c, version)).collect();
                    let old = Filter::is("doc", Scalar::Str(doc.to_string()));
                    store.replace(COLLECTION, old, points).await.unwrap();
                    println!("replace {doc} {version}");
                    let id = 10_000_000 + version;
                    store.upsert(COLLECTION, vec![chunk(id, 0, version)]).await.unwrap();
                    println!("upsert {}", id * 1_000);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// What the writer acknowledged: each document's newest version, and the single points.
#[derive(Default)]
struct Acknowledged {
    replaced: HashMap<u64, u64>,
    upserted: Vec<u64>,
}

fn run_writer(dir: &Path, round: u64, kill_after: Duration) -> Acknowledged {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "writer", "--nocapture", "--test-threads=1"])
        .env(WRITER, dir)
        .env(ROUND, round.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let acknowledged = Arc::new(Mutex::new(Acknowledged::default()));
    let reader = {
        let acknowledged = acknowledged.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let words: Vec<&str> = line.split(' ').collect();
                let mut acknowledged = acknowledged.lock().unwrap();
                match words[..] {
                    ["replace", doc, version] => {
                        let (doc, version) = (doc.parse().unwrap(), version.parse().unwrap());
                        let newest = acknowledged.replaced.entry(doc).or_insert(version);
                        *newest = (*newest).max(version);
                    }
                    ["upsert", id] => acknowledged.upserted.push(id.parse().unwrap()),
                    _ => {}
                }
            }
        })
    };
    std::thread::sleep(kill_after);
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
    Arc::try_unwrap(acknowledged).ok().unwrap().into_inner().unwrap()
}

fn version(payload: &Map<String, Value>) -> u64 {
    payload["version"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_a_kill_at_any_moment() {
    if std::env::var(WRITER).is_ok() {
        return;
    }
    let dir: PathBuf =
        std::env::temp_dir().join(format!("toolmesh-vector-durability-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut seed = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    let mut random = move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    let mut newest: HashMap<u64, u64> = HashMap::new();
    let mut upserted = Vec::new();
    let started = Instant::now();
    for round in 1..=10 {
        let kill_after = Duration::from_millis(300 + random(2_700));
        let acknowledged = run_writer(&dir, round, kill_after);
        for (doc, version) in acknowledged.replaced {
            newest.insert(doc, version);
        }
        upserted.extend(acknowledged.upserted);
        if newest.is_empty() && upserted.is_empty() {
            // Killed before its first acknowledgement (a slow start on a busy machine): the
            // collection may not exist yet, and there is nothing to check.
            eprintln!("round {round}: killed after {kill_after:?}, before any acknowledgement");
            continue;
        }

        let store = EmbeddedStore::open(&dir).await.unwrap();
        for (&doc, &acked) in &newest {
            let filter = Filter::is("doc", Scalar::Str(doc.to_string()));
            let ids = store.ids(COLLECTION, Some(filter)).await.unwrap();
            let records = store.retrieve(COLLECTION, ids, false).await.unwrap();
            // The document is there once, whole: one version of every chunk, never none,
            // never two; that version is the acknowledged one or a newer one that was
            // written but not yet acknowledged when the writer died.
            assert_eq!(
                records.len() as u64,
                CHUNKS,
                "round {round} (killed after {kill_after:?}): document {doc} has {} chunks",
                records.len()
            );
            let versions: Vec<u64> = records.iter().map(|r| version(&r.payload)).collect();
            assert!(
                versions.iter().all(|&v| v == versions[0] && v >= acked),
                "round {round} (killed after {kill_after:?}): document {doc} was acknowledged \
                 at version {acked} and holds {versions:?}"
            );
        }
        let held = store.retrieve(COLLECTION, upserted.clone(), false).await.unwrap();
        assert_eq!(
            held.len(),
            upserted.len(),
            "round {round} (killed after {kill_after:?}): acknowledged upserts are missing"
        );
        let total = store.count(COLLECTION, None).await.unwrap();
        assert!(total >= (newest.len() as u64) * CHUNKS + upserted.len() as u64);
        store.close().await;
        eprintln!(
            "round {round}: killed after {kill_after:?}, {} documents and {} points checked",
            newest.len(),
            upserted.len()
        );
    }
    assert!(newest.len() as u64 == DOCUMENTS, "the writer wrote too little to test");
    eprintln!("10 rounds in {:?}", started.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}
