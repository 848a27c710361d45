//! What the index keeps between messages, and the changes from one catalog to the next
//! (plain values and functions, tested without an actor).

use std::{collections::HashMap, hash::RandomState, sync::Arc, time::Instant};

use toolmesh_core::vector::{Point, PointId};
use toolmesh_registry::{Catalog, CatalogChange, ToolEntry};

use toolmesh_embed::lexical::{self, AVERAGE_TERMS, terms};

use crate::points::{payload, point_id};
use crate::{digest, tool_text};

/// The [`ToolSearchActor`]'s state.
#[derive(Debug)]
pub struct ToolSearchState {
    /// What is indexed, by tool name: the entry and the point (digest) of its text.
    pub(crate) indexed: Indexed,
    /// The catalog the index last caught up with: the next one is compared with it.
    pub(crate) caught_up: Option<Arc<Catalog>>,
    /// Tools indexed for the first time by this process whose older points are still to be
    /// swept, and when the catalog last changed.
    pub(crate) unswept: Vec<String>,
    pub(crate) changed_at: Instant,
    /// Whether a `Sweep` is on its way.
    pub(crate) sweeping: bool,
    /// The store's points, listed for a start's first indexes.
    pub(crate) listing: Listing,
    /// Batches of tools waiting for a dense vector.
    pub(crate) pending: Vec<Vec<Pending>>,
    /// Whether an `EmbedNext` is on its way.
    pub(crate) embedding: bool,
    /// Whether a retry after a store failure is on its way.
    pub(crate) retrying: bool,
    /// Whether the collection is known to exist.
    pub(crate) ensured: bool,
    /// When the current run of embedding started, and how many texts it embedded.
    pub(crate) run: Option<(Instant, usize)>,
    /// Picks the next batch.
    pub(crate) random: RandomState,
    pub(crate) picks: u64,
}

/// The store's points, by id, with whether each has its dense vector: listed once when a
/// first index asks about many tools, kept in step with this index's own writes, and
/// dropped once the catalog has been still for [`LISTING_FOR`]. At a start tools arrive
/// source by source, and every source's first index would otherwise list the whole
/// collection again.
#[derive(Debug, Default)]
pub(crate) struct Listing(pub(crate) Option<HashMap<PointId, bool>>);

impl Listing {
    /// Notes that the store holds the points `ids`, with their dense vector or without.
    pub(crate) fn hold(&mut self, ids: impl IntoIterator<Item = PointId>, dense: bool) {
        if let Some(listing) = &mut self.0 {
            listing.extend(ids.into_iter().map(|id| (id, dense)));
        }
    }

    /// Notes that the store no longer holds the points `ids`.
    pub(crate) fn forget(&mut self, ids: &[PointId]) {
        if let Some(listing) = &mut self.0 {
            for id in ids {
                listing.remove(id);
            }
        }
    }
}

/// A tool whose text is to be indexed, or is waiting for its dense vector.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub(crate) name: String,
    pub(crate) id: PointId,
    pub(crate) text: String,
}

impl Pending {
    /// The point of the text: its lexical vector, and the dense one when given.
    pub(crate) fn point(&self, dense: Option<Vec<f32>>) -> Point {
        let embedded = dense.is_some();
        Point {
            id: self.id,
            dense,
            lexical: Some(lexical::document(&terms(&self.text), AVERAGE_TERMS)),
            payload: payload(&self.name, embedded),
        }
    }
}

/// What is indexed, by tool name: the entry and the point of its text.
pub(crate) type Indexed = HashMap<String, (Arc<ToolEntry>, PointId)>;

/// How the catalog differs from what is indexed.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    /// New tools and tools whose text changed: name, entry, and the text to index.
    pub(crate) upserts: Vec<(String, Arc<ToolEntry>, Pending)>,
    /// Tools that went.
    pub(crate) removed: Vec<String>,
    /// Points no tool has any more: of removed tools, and the old texts of changed ones.
    pub(crate) gone: Vec<PointId>,
    /// Tools this process indexes for the first time. Any point under the same name but
    /// the one of the tool's text is of an older text, left by an earlier run.
    pub(crate) first: Vec<String>,
}

/// Compares `catalog` with what is `indexed` (entries by pointer: the registry keeps an
/// unchanged tool's entry), and hashes the text of new and changed tools only. With the
/// catalog the index last caught up with (`since`), only the tools whose entry differs
/// between the two are looked at; without it, every tool. Tools whose entry changed but not
/// their text are updated in the map at once. Lexical vectors are left to
/// [`ToolSearchActor::write`], for the texts the store does not hold.
pub(crate) fn diff(
    catalog: &Catalog,
    since: Option<&Catalog>,
    mut indexed: Indexed,
) -> (Indexed, Changes) {
    use rayon::prelude::*;
    let mut changes = Changes::default();
    let is_indexed = |indexed: &Indexed, name: &str, entry: &Arc<ToolEntry>| {
        indexed.get(name).is_some_and(|(known, _)| Arc::ptr_eq(known, entry))
    };
    let mut gone = Vec::new();
    let fresh: Vec<(&str, &Arc<ToolEntry>)> = match since {
        Some(since) => {
            let mut fresh = Vec::new();
            for change in catalog.changes_since(since) {
                match change {
                    CatalogChange::Upserted(name, entry) => {
                        if !is_indexed(&indexed, name, entry) {
                            fresh.push((name, entry));
                        }
                    }
                    CatalogChange::Removed(name) => gone.push(name.to_owned()),
                }
            }
            fresh
        }
        None => catalog.iter().filter(|(name, entry)| !is_indexed(&indexed, name, entry)).collect(),
    };
    // Texts, digests and lexical vectors of the tools whose entry is new, split across the
    // cores: every tool at a first start, one or a few after a change.
    let hashed: Vec<_> = fresh
        .into_par_iter()
        .map(|(name, entry)| {
            let text = tool_text(&entry.spec);
            let id = point_id(&digest(&text));
            (name, entry, text, id)
        })
        .collect();
    for (name, entry, text, id) in hashed {
        match indexed.get_mut(name) {
            // The same text under a new entry.
            Some((known, old)) if *old == id => *known = entry.clone(),
            previous => {
                match previous {
                    Some((_, old)) => changes.gone.push(*old),
                    None => changes.first.push(name.to_owned()),
                }
                let pending = Pending { name: name.to_owned(), id, text };
                changes.upserts.push((name.to_owned(), entry.clone(), pending));
            }
        }
    }
    if since.is_none() {
        // Every catalog tool is indexed or new: when the counts agree, nothing went.
        let new = changes.upserts.len() - changes.gone.len();
        if catalog.len() != indexed.len() + new {
            gone.extend(indexed.keys().filter(|name| !catalog.contains(name)).cloned());
        }
    }
    for name in gone {
        if let Some((_, id)) = indexed.get(&name) {
            changes.gone.push(*id);
            changes.removed.push(name);
        }
    }
    (indexed, changes)
}

/// Texts embedded per batch. Texts are sorted by length first, so a batch pads little.
pub(crate) const EMBED_BATCH: usize = 16;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

    use toolmesh_core::ToolSource;
    use toolmesh_registry::SourceUpdate;

    use super::*;
    use crate::testing::{registry, tool};

    /// What a successful write makes of `indexed`.
    pub(crate) fn apply(mut indexed: Indexed, changes: &Changes) -> Indexed {
        for name in &changes.removed {
            indexed.remove(name);
        }
        for (name, entry, pending) in &changes.upserts {
            indexed.insert(name.clone(), (entry.clone(), pending.id));
        }
        indexed
    }

    /// The changes, each list sorted: upserted names, removed names, gone points, first.
    pub(crate) fn summary(
        changes: &Changes,
    ) -> (Vec<String>, Vec<String>, Vec<PointId>, Vec<String>) {
        let sorted = |mut v: Vec<String>| {
            v.sort();
            v
        };
        let mut gone = changes.gone.clone();
        gone.sort_unstable();
        (
            sorted(changes.upserts.iter().map(|(name, ..)| name.clone()).collect()),
            sorted(changes.removed.clone()),
            gone,
            sorted(changes.first.clone()),
        )
    }

    /// Comparing a catalog with the one the index last caught up with finds what comparing
    /// it with everything indexed finds, looking at the changed tools only.
    #[tokio::test]
    pub(crate) async fn the_changes_since_the_last_catalog_are_those_of_the_whole() {
        let registry = registry().await;
        let update = |tools: Vec<ToolEntry>, unchanged: &[&str]| SourceUpdate {
            source: ToolSource::local("s"),
            tools,
            toolkits: vec![],
            toolkit: None,
            unchanged: unchanged.iter().map(|&n| n.to_owned()).collect(),
        };
        let (a, b, c, d) =
            (tool("a", "alpha"), tool("b", "beta"), tool("c", "gamma"), tool("d", "delta"));
        registry.replace_source(update(vec![a, b, c, d], &[])).await.unwrap();
        let first = registry.snapshot();
        let (indexed, changes) = diff(&first, None, Indexed::new());
        assert_eq!(summary(&changes).0, ["a", "b", "c", "d"]);
        assert_eq!(summary(&changes).3, ["a", "b", "c", "d"], "all indexed for the first time");
        let indexed = apply(indexed, &changes);
        let id = |name: &str| indexed[name].1;

        // b's text changes, c gets a new entry with the same text, d goes, e comes; a stays.
        let next = vec![tool("b", "beta, again"), tool("c", "gamma"), tool("e", "epsilon")];
        registry.replace_source(update(next, &["a"])).await.unwrap();
        let second = registry.snapshot();
        let (from_last, since) = diff(&second, Some(&first), indexed.clone());
        let (from_all, whole) = diff(&second, None, indexed.clone());
        assert_eq!(summary(&since), summary(&whole));
        let (upserted, removed, gone, new) = summary(&since);
        assert_eq!(upserted, ["b", "e"]);
        assert_eq!(removed, ["d"]);
        let mut expected = vec![id("b"), id("d")];
        expected.sort_unstable();
        assert_eq!(gone, expected, "b's old text and d");
        assert_eq!(new, ["e"]);
        // c's text is indexed already: only its entry is swapped, both ways.
        for indexed in [&from_last, &from_all] {
            assert!(Arc::ptr_eq(&indexed["c"].0, second.get("c").unwrap()));
            assert_eq!(indexed["c"].1, id("c"));
        }

        // Nothing changed since: nothing to do.
        let indexed = apply(from_last, &since);
        let (_, none) = diff(&second, Some(&second), indexed.clone());
        assert_eq!(summary(&none), Default::default());
        let (_, none) = diff(&second, None, indexed);
        assert_eq!(summary(&none), Default::default());
    }
}
