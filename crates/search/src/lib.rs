//! Tool search over the live catalog, behind `SearchTools`.
//!
//! [`ToolSearchActor`] follows the registry's published catalog: when it changes, the actor
//! diffs the tools' searchable text ([`tool_text`]) against what it indexed, by hash, and
//! updates only new, changed and removed tools. Searches read the index directly through a
//! [`SearchHandle`]; they never wait on the actor's mailbox, and indexing never blocks calls.
//!
//! Ranking is BM25 over the tool text ([`Bm25Index`]) and, with an embedding model, the
//! cosine similarity of sentence embeddings, fused. Tool vectors are kept by the digest of
//! their text in a [`VectorStore`], on disk when a cache directory is set, so a restart
//! embeds only texts it has not seen; searches score them in one contiguous table.

mod actor;
mod bm25;
mod error;
mod fusion;
mod handle;
mod provider;
mod recent;
mod store;
mod text;
mod vectors;

pub use actor::{SearchMsg, SearchOptions, ToolSearchActor, ToolSearchState};
pub use bm25::Bm25Index;
pub use error::SearchError;
pub use fusion::Fusion;
pub use handle::{DEFAULT_MAX_QUERY_BYTES, SearchHandle, SearchHit};
pub use provider::SearchProvider;
pub use store::{TextDigest, VectorStore, digest};
pub use text::{terms, tool_text};
