//! Tool search over the live catalog, behind `SearchTools`.
//!
//! [`ToolSearchActor`] follows the registry's published catalog: when it changes, the actor
//! diffs the tools' searchable text ([`tool_text`]) against what it indexed, by hash, and
//! updates only new, changed and removed tools. Searches go through a [`SearchHandle`]
//! straight to the vector store; they never wait on the actor's mailbox, and indexing never
//! blocks calls.
//!
//! The index lives in a [`toolmesh_core::VectorStore`]: one point per tool text, its id the
//! text's digest, in a collection per embedding model, holding a lexical vector (BM25 term
//! weights; the store applies the inverse document frequency) and, once the model has
//! embedded the text, the sentence embedding. A restart over an unchanged catalog, or a
//! second router sharing a Qdrant server, finds the points there and embeds nothing.
//! Ranking is the store's query: both vectors, fused by reciprocal rank in the store (or
//! by a convex combination of the two rankings, as `search.fusion` says).

mod actor;
mod config;
mod embedding;
mod error;
mod fusion;
mod handle;
mod indexing;
mod messages;
mod options;
mod points;
mod provider;
mod recent;
mod state;
#[cfg(test)]
mod testing;
mod text;

pub use actor::ToolSearchActor;
pub use config::SearchConfig;
pub use error::SearchError;
pub use fusion::Fusion;
pub use handle::{DEFAULT_MAX_QUERY_BYTES, SearchHandle, SearchHit};
pub use messages::SearchMsg;
pub use options::SearchOptions;
pub use provider::SearchProvider;
pub use state::ToolSearchState;
pub use text::{TextDigest, digest, tool_text};
