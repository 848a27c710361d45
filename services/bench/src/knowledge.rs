//! `toolmesh-bench --knowledge DIR`: a knowledge collection over a real corpus (BEIR
//! SciFact), ingested through `KnowledgeService` the way a user would, every labelled query
//! run through the collection's tool, scored at the document level.

use std::{path::Path, time::Instant};

use anyhow::Context as _;
use serde::Serialize;
use toolmesh_proto::v1::{
    CallToolRequest, Document, DocumentFormat, IngestRequest,
    knowledge_service_client::KnowledgeServiceClient,
};

use crate::load::{Programs, RemoveOnDrop, new_histogram, read_jsonl, score_ranking, start_child};

/// Passages asked per query: enough distinct documents for NDCG@10 after a document's
/// further chunks are dropped.
const PASSAGES: u32 = 40;
/// Documents per ingestion message.
const BATCH: usize = 64;

/// What `--knowledge` measured.
#[derive(Debug, Serialize)]
pub(crate) struct KnowledgeReport {
    pub(crate) documents: usize,
    pub(crate) chunks: u64,
    pub(crate) queries: usize,
    pub(crate) recall5: f64,
    pub(crate) recall10: f64,
    pub(crate) ndcg10: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) ingest_s: f64,
    pub(crate) chunks_per_s: f64,
    pub(crate) chunk_tokens: usize,
    pub(crate) chunk_overlap: usize,
}

pub(crate) async fn run(
    dir: &Path,
    programs: &Programs,
    chunk_tokens: usize,
    chunk_overlap: usize,
) -> anyhow::Result<KnowledgeReport> {
    let corpus = read_jsonl(&dir.join("corpus.jsonl"))?;
    let queries = read_jsonl(&dir.join("queries-dev.jsonl"))?;
    let data =
        std::env::temp_dir().join(format!("toolmesh-bench-knowledge-{}", std::process::id()));
    let _data = RemoveOnDrop(data.clone());
    let config = data.with_extension("toml");
    let _config = RemoveOnDrop(config.clone());
    std::fs::write(
        &config,
        format!(
            "[[knowledge.collections]]\nname = \"scifact\"\ndescription = \"Abstracts of scientific papers.\"\nchunk_tokens = {chunk_tokens}\nchunk_overlap = {chunk_overlap}\n"
        ),
    )?;
    let (config_arg, data_arg) = (config.display().to_string(), data.display().to_string());
    let toolmesh = start_child(
        &programs.toolmesh,
        &["serve", "--listen", "127.0.0.1:0", "--config", &config_arg, "--data-dir", &data_arg],
    )
    .await?;
    let addr = toolmesh.addr.to_string();
    let client = toolmesh::client::connect(&addr, None).await?;
    let mut knowledge = KnowledgeServiceClient::new(toolmesh::client::channel(&addr, None).await?);

    // Each abstract a Markdown document under its title, so every chunk carries the title.
    let documents: Vec<Document> = corpus
        .iter()
        .map(|d| Document {
            id: d["id"].as_str().unwrap_or_default().to_owned(),
            text: format!(
                "# {}\n\n{}",
                d["title"].as_str().unwrap_or_default(),
                d["text"].as_str().unwrap_or_default()
            ),
            format: DocumentFormat::Markdown as i32,
            metadata_json: String::new(),
        })
        .collect();
    let count = documents.len();
    let messages: Vec<IngestRequest> = documents
        .chunks(BATCH)
        .map(|batch| IngestRequest { collection: "scifact".into(), documents: batch.to_vec() })
        .collect();
    let started = Instant::now();
    let ingested = knowledge
        .ingest(futures::stream::iter(messages))
        .await
        .context("ingesting the corpus")?
        .into_inner();
    let ingest_s = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        ingested.failed == 0,
        "{} documents failed: {:?}",
        ingested.failed,
        ingested.results.iter().find(|r| !r.error.is_empty())
    );

    let mut histogram = new_histogram();
    let (mut recall5, mut recall10, mut ndcg) = (0.0, 0.0, 0.0);
    let mut scored = 0usize;
    for query in &queries {
        let text = query["query"].as_str().unwrap_or_default();
        let relevant: Vec<String> = query["relevant"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r.as_str().map(str::to_owned))
            .collect();
        if text.is_empty() || relevant.is_empty() {
            continue;
        }
        let request = CallToolRequest {
            name: "search_scifact".into(),
            arguments_json: serde_json::json!({"query": text, "top_k": PASSAGES}).to_string(),
            ..Default::default()
        };
        let sent = Instant::now();
        let response = client.clone().call_tool(request).await?.into_inner();
        histogram.saturating_record(sent.elapsed().as_nanos() as u64);
        let structured: serde_json::Value =
            serde_json::from_str(response.structured_json.as_deref().unwrap_or("{}"))?;
        // A document takes the rank of its best chunk.
        let mut ranked: Vec<String> = Vec::new();
        for passage in structured["passages"].as_array().into_iter().flatten() {
            let id = passage["document_id"].as_str().unwrap_or_default().to_owned();
            if !ranked.contains(&id) {
                ranked.push(id);
            }
        }
        let ([_, r5, r10], n, _) = score_ranking(&ranked, &relevant);
        recall5 += r5;
        recall10 += r10;
        ndcg += n;
        scored += 1;
    }
    toolmesh.terminate().await?;
    let n = scored.max(1) as f64;
    Ok(KnowledgeReport {
        documents: count,
        chunks: ingested.chunks,
        queries: scored,
        recall5: recall5 / n,
        recall10: recall10 / n,
        ndcg10: ndcg / n,
        p50_ms: histogram.value_at_quantile(0.5) as f64 / 1e6,
        p99_ms: histogram.value_at_quantile(0.99) as f64 / 1e6,
        ingest_s,
        chunks_per_s: ingested.chunks as f64 / ingest_s.max(1e-9),
        chunk_tokens,
        chunk_overlap,
    })
}

pub(crate) fn render(report: &KnowledgeReport) -> String {
    format!(
        "toolmesh-bench --knowledge: {} queries over {} documents ({} chunks of at most {} tokens, overlap {})\n\n\
         Recall@5   {:.3}\nRecall@10  {:.3}\nNDCG@10    {:.3}\n\n\
         query latency p50 {:.3} ms, p99 {:.3} ms (CallTool round trip, query embedding included, one at a time)\n\
         ingestion: {:.1} s for the corpus, {:.1} chunks/s (chunking and embedding included)\n",
        report.queries,
        report.documents,
        report.chunks,
        report.chunk_tokens,
        report.chunk_overlap,
        report.recall5,
        report.recall10,
        report.ndcg10,
        report.p50_ms,
        report.p99_ms,
        report.ingest_s,
        report.chunks_per_s,
    )
}
