//! Knowledge collections: the operator's documents in the vector store, each collection
//! searched by one tool (`search_<collection>`) in the catalog.
//!
//! `[[knowledge.collections]]` names them ([`KnowledgeConfig`]). Documents come in through
//! [`KnowledgeHandle::ingest`] (the gRPC `KnowledgeService` and `toolmesh ingest`): each is
//! checked, chunked in the embedding model's tokens ([`chunk`], `text-splitter`, along
//! Markdown's structure for Markdown), embedded in batches off the runtime, and stored with
//! a lexical vector beside the dense one, replacing the document of the same id in one step.
//! A search embeds the query and asks the store for both rankings fused by reciprocal rank.
//!
//! The [`RetrieverActor`] owns the collections; [`KnowledgeProvider`] puts it on the
//! provider seam.

pub mod chunk;
mod config;
mod document;
mod error;
mod handle;
mod provider;
mod retriever;
mod shared;
mod tool;

pub use config::{CollectionConfig, KnowledgeConfig, MAX_TOP_K, SECTION};
pub use document::{CollectionInfo, Document, DocumentResult, Passage};
pub use error::{KnowledgeError, unknown_store};
pub use handle::KnowledgeHandle;
pub use provider::KnowledgeProvider;
pub use retriever::{RetrieverActor, RetrieverMsg, RetrieverState};
