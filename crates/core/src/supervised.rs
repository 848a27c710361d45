//! The seam between an actor's owner and the root supervisor.

use ractor::ActorCell;

/// An actor the root supervisor links and restarts, through the handle that owns it: the
/// actor now, and how to start a fresh one under the root after it ended unasked. The
/// handle keeps whatever must outlive a crash (a catalog, a queue, collections) so that
/// the fresh actor takes up where the old one stopped.
#[async_trait::async_trait]
pub trait Supervised: Send + Sync + 'static {
    /// The actor now.
    fn actor(&self) -> ActorCell;

    /// Starts a fresh actor linked to `root`, after the old one ended for `reason`.
    async fn respawn(&self, root: ActorCell, reason: String) -> Result<ActorCell, String>;
}
