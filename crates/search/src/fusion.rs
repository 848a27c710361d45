//! How the lexical and the dense ranking become one.

use std::{collections::HashMap, hash::Hash};

/// `search.fusion`: how the lexical and the dense ranking become one. The search index
/// applies it; this is its one definition.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fusion {
    /// Reciprocal-rank fusion: a tool scores `1 / (k + rank)` in each list it is in.
    Rrf {
        /// The rank offset (`search.rrf_k`); 60 is the usual choice.
        k: f64,
    },
    /// A convex combination of scores normalised to [0, 1] per list (min-max over the
    /// candidates; all 1 when they score alike): `dense_weight * dense + (1 - dense_weight)
    /// * lexical`; a tool missing from a list scores 0 there.
    Convex {
        /// The weight of the embedding score (`search.dense_weight`).
        dense_weight: f64,
    },
}

impl Default for Fusion {
    fn default() -> Self {
        Fusion::Rrf { k: 60.0 }
    }
}

impl std::fmt::Display for Fusion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fusion::Rrf { k } => write!(f, "rrf[k={k}]"),
            Fusion::Convex { dense_weight } => write!(f, "convex[dense={dense_weight}]"),
        }
    }
}

/// How the index applies a [`Fusion`].
pub(crate) trait Fuse {
    /// Returns the fused ranking of two rankings of keys, best first (ties by key).
    fn fuse<K: Clone + Eq + Hash + Ord>(
        &self,
        lexical: &[(K, f64)],
        dense: &[(K, f64)],
    ) -> Vec<(K, f64)>;
}

impl Fuse for Fusion {
    fn fuse<K: Clone + Eq + Hash + Ord>(
        &self,
        lexical: &[(K, f64)],
        dense: &[(K, f64)],
    ) -> Vec<(K, f64)> {
        let mut fused: HashMap<&K, f64> = HashMap::new();
        match *self {
            Fusion::Rrf { k } => {
                for list in [lexical, dense] {
                    for (rank, (name, _)) in list.iter().enumerate() {
                        *fused.entry(name).or_default() += 1.0 / (k + rank as f64 + 1.0);
                    }
                }
            }
            Fusion::Convex { dense_weight } => {
                for (list, weight) in [(lexical, 1.0 - dense_weight), (dense, dense_weight)] {
                    let max = list.iter().map(|(_, s)| *s).fold(f64::NEG_INFINITY, f64::max);
                    let min = list.iter().map(|(_, s)| *s).fold(f64::INFINITY, f64::min);
                    for (name, score) in list {
                        // A list whose candidates all score alike ranks them all first.
                        let normalised = if max > min { (score - min) / (max - min) } else { 1.0 };
                        *fused.entry(name).or_default() += weight * normalised;
                    }
                }
            }
        }
        let mut ranked: Vec<(K, f64)> =
            fused.into_iter().map(|(key, score)| (key.clone(), score)).collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        ranked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[(&str, f64)]) -> Vec<(String, f64)> {
        items.iter().map(|(n, s)| ((*n).to_owned(), *s)).collect()
    }

    fn names(ranked: &[(String, f64)]) -> Vec<&str> {
        ranked.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn rrf_rewards_agreement_and_convex_follows_the_weights() {
        let lexical = list(&[("a", 9.0), ("b", 5.0), ("c", 1.0)]);
        let dense = list(&[("d", 0.9), ("b", 0.8), ("c", 0.1)]);
        // b is second in both lists, which beats first in one.
        assert_eq!(names(&Fusion::Rrf { k: 60.0 }.fuse(&lexical, &dense)), ["b", "c", "a", "d"]);
        let lexical_only = Fusion::Convex { dense_weight: 0.0 }.fuse(&lexical, &dense);
        assert_eq!(names(&lexical_only)[..3], ["a", "b", "c"]);
        let dense_only = Fusion::Convex { dense_weight: 1.0 }.fuse(&lexical, &dense);
        assert_eq!(names(&dense_only)[..2], ["d", "b"]);
        // a: 0.5 * 1; b: 0.5 * 0.5 + 0.5 * 0.875; d: 0.5 * 1; c: 0.
        let even = Fusion::Convex { dense_weight: 0.5 }.fuse(&lexical, &dense);
        assert_eq!(names(&even), ["b", "a", "d", "c"]);
        // A single lexical match (a rare word) is the lexical best, not the worst.
        let rare = Fusion::Convex { dense_weight: 0.5 }.fuse(&list(&[("c", 2.0)]), &dense);
        assert_eq!(names(&rare)[0], "c");
    }
}
