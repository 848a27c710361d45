//! The messages of the [`ToolSearchActor`](crate::ToolSearchActor).

/// Messages of the [`ToolSearchActor`].
#[derive(Debug)]
pub enum SearchMsg {
    /// The registry published a new catalog (or the store failed and the index tries again).
    CatalogChanged,
    /// Embed the next batch of tools waiting for a vector.
    EmbedNext,
    /// Delete the points of older texts of the tools indexed for the first time, once the
    /// catalog has been still for a while.
    Sweep,
}
