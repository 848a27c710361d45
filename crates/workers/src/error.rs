/// The pool could not be started.
#[derive(Debug, thiserror::Error)]
pub enum WorkersError {
    /// An actor failed to spawn.
    #[error("cannot start the worker pool: {0}")]
    Spawn(String),
}
