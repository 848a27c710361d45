use toolmesh_core::ErrorCode;

/// Why a search failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SearchError {
    /// The query is empty or blank.
    #[error("the query is empty")]
    EmptyQuery,
    /// The embedding model failed on the query.
    #[error("embedding the query failed: {0}")]
    Embedding(String),
    /// A search task died (it panicked).
    #[error("the search task failed: {0}")]
    Task(String),
    /// The vector store failed: unavailable, or it refused the request.
    #[error("tool search: {0}")]
    Store(#[from] toolmesh_core::StoreError),
}

impl SearchError {
    /// Returns the error's code.
    pub fn code(&self) -> ErrorCode {
        match self {
            SearchError::EmptyQuery => ErrorCode::InvalidArgument,
            SearchError::Embedding(_) | SearchError::Task(_) => ErrorCode::Internal,
            SearchError::Store(error) => error.code(),
        }
    }

    /// Returns a short, stable name of the error, for the `error.type` span attribute.
    pub fn kind(&self) -> &'static str {
        match self {
            SearchError::EmptyQuery => "empty_query",
            SearchError::Embedding(_) => "embedding_failed",
            SearchError::Task(_) => "search_failed",
            SearchError::Store(toolmesh_core::StoreError::Unavailable { .. }) => {
                "vector_store_unavailable"
            }
            SearchError::Store(_) => "vector_store_failed",
        }
    }
}
