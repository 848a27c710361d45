//! An incremental BM25 index: tools come and go one at a time, with no rebuild.

use std::collections::HashMap;

/// BM25 term-frequency saturation.
const K1: f64 = 1.2;
/// BM25 length normalisation.
const B: f64 = 0.75;

/// A BM25 index over named documents.
#[derive(Debug, Default)]
pub struct Bm25Index {
    /// Document slot by name.
    slots: HashMap<String, u32>,
    /// Per slot: name, term counts, length; `None` once removed (slots are reused).
    docs: Vec<Option<Doc>>,
    free: Vec<u32>,
    /// Term → slot → count.
    postings: HashMap<String, HashMap<u32, u32>>,
    total_len: u64,
}

#[derive(Debug)]
struct Doc {
    name: String,
    terms: HashMap<String, u32>,
    len: u32,
}

impl Bm25Index {
    /// Returns the number of documents.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Returns whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Adds or replaces the document `name`.
    pub fn upsert(&mut self, name: &str, terms: &[String]) {
        self.remove(name);
        let mut counts: HashMap<String, u32> = HashMap::new();
        for term in terms {
            *counts.entry(term.clone()).or_default() += 1;
        }
        let slot = self.free.pop().unwrap_or_else(|| {
            self.docs.push(None);
            (self.docs.len() - 1) as u32
        });
        for (term, count) in &counts {
            self.postings.entry(term.clone()).or_default().insert(slot, *count);
        }
        let len = terms.len() as u32;
        self.total_len += u64::from(len);
        self.docs[slot as usize] = Some(Doc { name: name.to_owned(), terms: counts, len });
        self.slots.insert(name.to_owned(), slot);
    }

    /// Removes the document `name`, if present.
    pub fn remove(&mut self, name: &str) {
        let Some(slot) = self.slots.remove(name) else { return };
        if let Some(doc) = self.docs[slot as usize].take() {
            for term in doc.terms.keys() {
                if let Some(posting) = self.postings.get_mut(term) {
                    posting.remove(&slot);
                    if posting.is_empty() {
                        self.postings.remove(term);
                    }
                }
            }
            self.total_len -= u64::from(doc.len);
        }
        self.free.push(slot);
    }

    /// Returns every document matching at least one query term with its BM25 score, in
    /// no particular order.
    pub fn scores(&self, query: &[String]) -> Vec<(&str, f64)> {
        let n = self.slots.len() as f64;
        if n == 0.0 {
            return Vec::new();
        }
        let avg_len = self.total_len as f64 / n;
        // Dense accumulators: a few thousand floats are cheaper than a hash map per query.
        let mut scores = vec![0.0f64; self.docs.len()];
        let mut touched = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for term in query {
            if !seen.insert(term) {
                continue;
            }
            let Some(posting) = self.postings.get(term) else { continue };
            let df = posting.len() as f64;
            let idf = ((n - df + 0.5) / (df + 0.5) + 1.0).ln();
            for (slot, tf) in posting {
                let Some(doc) = &self.docs[*slot as usize] else { continue };
                let tf = f64::from(*tf);
                let norm = K1 * (1.0 - B + B * f64::from(doc.len) / avg_len);
                let score = &mut scores[*slot as usize];
                if *score == 0.0 {
                    touched.push(*slot);
                }
                *score += idf * tf * (K1 + 1.0) / (tf + norm);
            }
        }
        touched
            .into_iter()
            .filter_map(|slot| {
                self.docs[slot as usize].as_ref().map(|d| (d.name.as_str(), scores[slot as usize]))
            })
            .collect()
    }

    /// Returns every document matching at least one query term with its BM25 score, best
    /// first (ties by name, so results are stable).
    pub fn search(&self, query: &[String]) -> Vec<(&str, f64)> {
        let mut ranked = self.scores(query);
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        ranked
    }
}

/// Returns the `n` best of `scored` that `keep` accepts, best first (ties by name). Only
/// the head of the list is sorted, unless `keep` turns too many of it down.
pub(crate) fn best(
    mut scored: Vec<(&str, f64)>,
    n: usize,
    keep: impl Fn(&str) -> bool,
) -> Vec<(&str, f64)> {
    let order = |a: &(&str, f64), b: &(&str, f64)| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0));
    let head = (4 * n).min(scored.len());
    if head > 0 && head < scored.len() {
        scored.select_nth_unstable_by(head - 1, order);
        let mut first: Vec<(&str, f64)> = scored[..head].to_vec();
        first.sort_unstable_by(order);
        let kept: Vec<(&str, f64)> =
            first.into_iter().filter(|(name, _)| keep(name)).take(n).collect();
        if kept.len() == n {
            return kept;
        }
    }
    scored.sort_unstable_by(order);
    scored.into_iter().filter(|(name, _)| keep(name)).take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::terms;

    #[test]
    fn ranks_by_bm25_and_follows_updates() {
        let mut index = Bm25Index::default();
        index.upsert("weather", &terms("current weather forecast for a city"));
        index.upsert("stocks", &terms("stock price quote for a ticker symbol"));
        index.upsert("news", &terms("latest news headlines about weather and stocks"));
        let ranked = index.search(&terms("weather in Lisbon"));
        assert_eq!(ranked.iter().map(|r| r.0).collect::<Vec<_>>(), ["weather", "news"]);

        index.remove("weather");
        assert_eq!(
            index.search(&terms("weather")).iter().map(|r| r.0).collect::<Vec<_>>(),
            ["news"]
        );
        index.upsert("news", &terms("sports results"));
        assert!(index.search(&terms("weather")).is_empty());
        index.upsert("weather", &terms("weather"));
        assert_eq!(index.len(), 3);
        assert_eq!(index.search(&terms("weather"))[0].0, "weather");
    }

    #[test]
    fn best_selects_the_head_and_falls_back_when_keep_is_picky() {
        let names: Vec<String> = (0..100).map(|i| format!("t{i:03}")).collect();
        let scored: Vec<(&str, f64)> =
            names.iter().enumerate().map(|(i, n)| (n.as_str(), f64::from(i as u32))).collect();
        let top = best(scored.clone(), 3, |_| true);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), ["t099", "t098", "t097"]);
        // Only every tenth is kept: the head of 12 holds one, so the whole list is sorted.
        let picky = best(scored, 3, |name| name.ends_with('0'));
        assert_eq!(picky.iter().map(|t| t.0).collect::<Vec<_>>(), ["t090", "t080", "t070"]);
    }
}
