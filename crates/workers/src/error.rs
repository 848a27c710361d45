use toolmesh_core::ErrorCode;

/// The pool could not be started.
#[derive(Debug, thiserror::Error)]
pub enum WorkersError {
    /// An actor failed to spawn.
    #[error("cannot start the worker pool: {0}")]
    Spawn(#[source] ractor::SpawnErr),
}

impl WorkersError {
    /// The failure kind a caller sees.
    pub fn code(&self) -> ErrorCode {
        match self {
            WorkersError::Spawn(_) => ErrorCode::Internal,
        }
    }
}
