//! Why a knowledge request failed.

use toolmesh_core::{ErrorCode, StoreError};

/// Why a knowledge request failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KnowledgeError {
    /// No such collection.
    #[error("no knowledge collection {name:?} (collections: {known})")]
    NoCollection {
        /// The name asked for.
        name: String,
        /// The collections there are.
        known: String,
    },
    /// The request is wrong.
    #[error("{0}")]
    Invalid(String),
    /// The store failed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The embedding model failed.
    #[error("embedding failed: {0}")]
    Embedding(String),
    /// The retriever is gone (shutting down).
    #[error("the retriever is not running: {0}")]
    Gone(String),
}

impl KnowledgeError {
    /// Returns the failure kind for callers.
    pub fn code(&self) -> ErrorCode {
        match self {
            KnowledgeError::NoCollection { .. } => ErrorCode::NotFound,
            KnowledgeError::Invalid(_) => ErrorCode::InvalidArgument,
            KnowledgeError::Store(error) => error.code(),
            KnowledgeError::Embedding(_) => ErrorCode::Internal,
            KnowledgeError::Gone(_) => ErrorCode::Unavailable,
        }
    }
}

/// Says that no store is named `name`, naming those there are.
pub fn unknown_store(name: &str, known: &[&str]) -> String {
    format!("no vector store {name:?} (stores: {}); add [vector.stores.{name}]", known.join(", "))
}
