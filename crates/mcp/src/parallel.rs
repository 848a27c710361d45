//! Work on a whole listing, on the calling thread or on every core.

use rayon::prelude::*;

/// Listings of fewer tools than this are named, compared, converted and read back on the
/// calling thread, larger ones on every core. At a start a hundred servers prepare their
/// listings at once, which keeps the cores busy already, and rayon's workers, handed a
/// small job each, spin between them for CPU that publishing needs.
const PARALLEL_TOOLS: usize = 4096;

/// Maps every item of a listing with `f`: on the calling thread below [`PARALLEL_TOOLS`]
/// items, on every core from there.
pub(crate) fn map_listing<'a, T, R, C>(items: &'a [T], f: impl Fn(&'a T) -> R + Sync + Send) -> C
where
    T: Sync,
    R: Send,
    C: FromIterator<R> + FromParallelIterator<R>,
{
    if items.len() < PARALLEL_TOOLS {
        items.iter().map(f).collect()
    } else {
        items.par_iter().map(f).collect()
    }
}
