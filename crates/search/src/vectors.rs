//! The tool vectors that searches score, in one contiguous table.

use std::collections::HashMap;

/// Vectors of one dimension count by tool name, stored row after row, so that scoring a
/// query streams through memory once instead of chasing thousands of allocations.
/// Removal moves the last row into the hole, so the table stays dense.
#[derive(Debug, Default)]
pub(crate) struct VectorTable {
    dimensions: usize,
    rows: Vec<f32>,
    names: Vec<String>,
    slots: HashMap<String, usize>,
}

impl VectorTable {
    /// Sets `name`'s vector, replacing any it had. A vector of another dimension count than
    /// the table's is ignored (the first vector sets the table's).
    pub(crate) fn insert(&mut self, name: &str, vector: &[f32]) {
        if self.names.is_empty() {
            self.dimensions = vector.len();
        }
        if vector.len() != self.dimensions || vector.is_empty() {
            return;
        }
        match self.slots.get(name) {
            Some(&slot) => {
                self.rows[slot * self.dimensions..(slot + 1) * self.dimensions]
                    .copy_from_slice(vector);
            }
            None => {
                self.slots.insert(name.to_owned(), self.names.len());
                self.names.push(name.to_owned());
                self.rows.extend_from_slice(vector);
            }
        }
    }

    /// Drops `name`'s vector, if it has one.
    pub(crate) fn remove(&mut self, name: &str) {
        let Some(slot) = self.slots.remove(name) else { return };
        let last = self.names.len() - 1;
        if slot != last {
            let d = self.dimensions;
            self.rows.copy_within(last * d..(last + 1) * d, slot * d);
            self.names.swap(slot, last);
            self.slots.insert(self.names[slot].clone(), slot);
        }
        self.names.pop();
        self.rows.truncate(last * self.dimensions);
    }

    /// Returns how many tools have a vector.
    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    /// Returns every tool with its similarity to `query` (dot product; the vectors are
    /// normalised, so cosine).
    pub(crate) fn scores(&self, query: &[f32]) -> Vec<(&str, f64)> {
        if query.len() != self.dimensions || self.names.is_empty() {
            return Vec::new();
        }
        let mut similarities = vec![0.0; self.names.len()];
        toolmesh_embed::similarities(query, &self.rows, &mut similarities);
        self.names.iter().map(String::as_str).zip(similarities.into_iter().map(f64::from)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(mut scores: Vec<(&str, f64)>) -> Vec<(String, f64)> {
        scores.sort_by(|a, b| a.0.cmp(b.0));
        scores.into_iter().map(|(n, s)| (n.to_owned(), s)).collect()
    }

    #[test]
    fn scores_follow_inserts_replacements_and_removals() {
        let mut table = VectorTable::default();
        table.insert("a", &[1.0, 0.0]);
        table.insert("b", &[0.0, 1.0]);
        table.insert("c", &[0.6, 0.8]);
        assert_eq!(
            sorted(table.scores(&[1.0, 0.0])),
            [("a".into(), 1.0), ("b".into(), 0.0), ("c".into(), 0.6f32 as f64)]
        );
        // Removing from the middle moves the last row into the hole.
        table.remove("a");
        table.insert("b", &[0.8, 0.6]);
        assert_eq!(table.len(), 2);
        assert_eq!(
            sorted(table.scores(&[1.0, 0.0])),
            [("b".into(), 0.8f32 as f64), ("c".into(), 0.6f32 as f64)]
        );
        table.remove("c");
        table.remove("missing");
        assert_eq!(sorted(table.scores(&[0.0, 1.0])), [("b".into(), 0.6f32 as f64)]);
        // Another dimension count is not mixed in, nor is a query of one.
        table.insert("d", &[1.0, 0.0, 0.0]);
        assert_eq!(table.len(), 1);
        assert!(table.scores(&[1.0, 0.0, 0.0]).is_empty());
        table.remove("b");
        table.insert("d", &[1.0, 0.0, 0.0]);
        assert_eq!(sorted(table.scores(&[0.0, 0.0, 2.0])), [("d".into(), 0.0)]);
    }
}
