//! Tool search over the live catalog, behind `SearchTools`.
//!
//! [`ToolSearchActor`] follows the registry's published catalog: when it changes, the actor
//! diffs the tools' searchable text ([`tool_text`]) against what it indexed, by hash, and
//! updates only new, changed and removed tools. Searches read the index directly through a
//! [`SearchHandle`]; they never wait on the actor's mailbox, and indexing never blocks calls.
//!
//! The ranking today is lexical: BM25 over the tool text ([`Bm25Index`]).

mod actor;
mod bm25;
mod handle;
mod text;

pub use actor::{SearchMsg, ToolSearchActor, ToolSearchState};
pub use bm25::Bm25Index;
pub use handle::{SearchHandle, SearchHit};
pub use text::{terms, tool_text};
