//! The vectors of recent queries: agents repeat searches (retries, the same step of a
//! plan), and a repeated query need not run the model again.

use std::{collections::HashMap, sync::Arc};

/// At most `capacity` query vectors; the least recently used goes first.
#[derive(Debug)]
pub(crate) struct RecentQueries {
    capacity: usize,
    tick: u64,
    entries: HashMap<String, (Arc<[f32]>, u64)>,
}

/// Query vectors kept for repeated searches.
const RECENT_QUERIES: usize = 1024;

impl Default for RecentQueries {
    fn default() -> Self {
        RecentQueries::new(RECENT_QUERIES)
    }
}

impl RecentQueries {
    pub(crate) fn new(capacity: usize) -> Self {
        RecentQueries { capacity, tick: 0, entries: HashMap::new() }
    }

    pub(crate) fn get(&mut self, query: &str) -> Option<Arc<[f32]>> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(query).map(|(vector, used)| {
            *used = tick;
            vector.clone()
        })
    }

    pub(crate) fn insert(&mut self, query: &str, vector: Arc<[f32]>) {
        if self.capacity == 0 {
            return;
        }
        if self.entries.len() >= self.capacity && !self.entries.contains_key(query) {
            // Evict the least recently used eighth at once, so eviction stays rare.
            let mut ticks: Vec<u64> = self.entries.values().map(|(_, used)| *used).collect();
            let cut = (self.capacity / 8).max(1) - 1;
            let (_, limit, _) = ticks.select_nth_unstable(cut);
            let limit = *limit;
            self.entries.retain(|_, (_, used)| *used > limit);
        }
        self.tick += 1;
        self.entries.insert(query.to_owned(), (vector, self.tick));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_most_recently_used() {
        let mut recent = RecentQueries::new(8);
        let vector: Arc<[f32]> = Arc::from(vec![1.0]);
        for i in 0..8 {
            recent.insert(&i.to_string(), vector.clone());
        }
        assert!(recent.get("0").is_some(), "0 is now the most recent");
        recent.insert("8", vector.clone());
        assert!(recent.get("1").is_none(), "the least recently used went");
        assert!(recent.get("0").is_some() && recent.get("8").is_some());
        assert_eq!(recent.entries.len(), 8);
    }
}
