//! The vectors of recent queries: agents repeat searches (retries, the same step of a
//! plan), and a repeated query need not run the model again.
//!
//! Queries are kept by the digest of their text, not the text itself, and the whole cache
//! is bounded by bytes, so that long or many distinct queries cannot grow it.

use std::{collections::HashMap, sync::Arc};

use crate::TextDigest;

/// Bytes the query vectors may take (about 2,600 vectors of MiniLM's 384 dimensions).
const RECENT_BYTES: usize = 4 << 20;
/// What one entry costs besides its vector: the digest, the tick, the map's slot and the
/// vector's allocation header.
const ENTRY_OVERHEAD: usize = 64;

/// Query vectors within `budget` bytes; the least recently used go first.
#[derive(Debug)]
pub(crate) struct RecentQueries {
    budget: usize,
    used: usize,
    tick: u64,
    entries: HashMap<TextDigest, (Arc<[f32]>, u64)>,
}

impl Default for RecentQueries {
    fn default() -> Self {
        RecentQueries::new(RECENT_BYTES)
    }
}

fn cost(vector: &[f32]) -> usize {
    ENTRY_OVERHEAD + std::mem::size_of_val(vector)
}

impl RecentQueries {
    pub(crate) fn new(budget: usize) -> Self {
        RecentQueries { budget, used: 0, tick: 0, entries: HashMap::new() }
    }

    pub(crate) fn get(&mut self, query: &TextDigest) -> Option<Arc<[f32]>> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(query).map(|(vector, used)| {
            *used = tick;
            vector.clone()
        })
    }

    pub(crate) fn insert(&mut self, query: TextDigest, vector: Arc<[f32]>) {
        let size = cost(&vector);
        if size > self.budget || self.entries.contains_key(&query) {
            return;
        }
        if self.used + size > self.budget {
            // Evict the least recently used eighth at once, so eviction stays rare.
            let mut ticks: Vec<u64> = self.entries.values().map(|(_, used)| *used).collect();
            let cut = (ticks.len() / 8).max(1) - 1;
            let (_, limit, _) = ticks.select_nth_unstable(cut);
            let limit = *limit;
            let mut freed = 0;
            self.entries.retain(|_, (vector, used)| {
                let keep = *used > limit;
                if !keep {
                    freed += cost(vector);
                }
                keep
            });
            self.used -= freed;
        }
        self.tick += 1;
        self.used += size;
        self.entries.insert(query, (vector, self.tick));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest;

    #[test]
    fn keeps_the_most_recently_used() {
        let vector: Arc<[f32]> = Arc::from(vec![1.0; 4]);
        let mut recent = RecentQueries::new(8 * cost(&vector));
        for i in 0..8 {
            recent.insert(digest(&i.to_string()), vector.clone());
        }
        assert!(recent.get(&digest("0")).is_some(), "0 is now the most recent");
        recent.insert(digest("8"), vector.clone());
        assert!(recent.get(&digest("1")).is_none(), "the least recently used went");
        assert!(recent.get(&digest("0")).is_some() && recent.get(&digest("8")).is_some());
        assert_eq!(recent.entries.len(), 8);
    }

    #[test]
    fn stays_within_its_bytes_whatever_the_queries() {
        let vector: Arc<[f32]> = Arc::from(vec![0.5; 384]);
        let mut recent = RecentQueries::default();
        let long = "x".repeat(4096);
        for i in 0..4_000 {
            recent.insert(digest(&format!("{long}{i}")), vector.clone());
            assert!(recent.used <= RECENT_BYTES, "{} bytes after {i} queries", recent.used);
        }
        let counted: usize = recent.entries.values().map(|(v, _)| cost(v)).sum();
        assert_eq!(counted, recent.used);
        assert!(recent.entries.len() > 2000, "the budget is used: {}", recent.entries.len());
    }
}
