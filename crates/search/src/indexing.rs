//! Indexing: the catalog's changes written to the store, earlier formats copied, old
//! points swept.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, PoisonError, atomic::Ordering},
    time::{Duration, Instant},
};

use ractor::{ActorProcessingErr, ActorRef};
use serde_json::Value;
use toolmesh_core::{
    StoreError,
    vector::{Condition, DENSE, Filter, Point, PointId},
};
use tracing::{debug, info, warn};

use crate::handle::{Live, NAME};
use crate::{SearchMsg, ToolSearchActor, points::*, state::*};

/// How long the catalog must have been still before the points of older texts are swept:
/// at a start, tools arrive source by source, and until the last has, the store holds
/// more points than are indexed without any of them being stale.
pub(crate) const SWEEP_AFTER: Duration = Duration::from_secs(1);

/// How long the catalog must have been still before the listing of the store's ids made for
/// a start's first indexes is dropped: a start's sources arrive within seconds of each
/// other, however loaded the machine.
pub(crate) const LISTING_FOR: Duration = Duration::from_secs(10);

impl ToolSearchActor {
    /// Brings the index up to the current catalog.
    pub(crate) async fn reindex(
        &self,
        myself: &ActorRef<SearchMsg>,
        state: &mut ToolSearchState,
    ) -> Result<(), ActorProcessingErr> {
        let catalog = self.registry.snapshot();
        if catalog.version == self.shared.version.load(Ordering::Acquire) && catalog.version != 0 {
            return Ok(());
        }
        state.retrying = false;
        let started = Instant::now();
        if !state.ensured {
            if let Err(error) = self.shared.store.ensure(&self.spec()).await {
                self.store_failed(myself, state, &error, SearchMsg::CatalogChanged);
                return Ok(());
            }
            state.ensured = true;
            for version in COPIED_FORMATS {
                if let Err(error) = self.copy_earlier(version).await {
                    warn!(%error, version, "copying the tool points of an earlier format failed; \
                                            tools it lacks are embedded again");
                }
            }
        }
        // Texts, digests and lexical vectors of a whole catalog are CPU work: on a blocking
        // thread, with the map of what is indexed lent to it.
        let (indexed, lexical) = (std::mem::take(&mut state.indexed), catalog.clone());
        let since = state.caught_up.clone();
        let (indexed, mut changes) =
            tokio::task::spawn_blocking(move || diff(&lexical, since.as_deref(), indexed)).await?;
        let diffed_us = started.elapsed().as_micros() as u64;
        state.indexed = indexed;
        let first = std::mem::take(&mut changes.first);
        match self.write(&changes, &mut state.listing).await {
            Ok(known) => {
                self.commit(myself, state, changes, &known);
                state.caught_up = Some(catalog.clone());
            }
            Err(error) => {
                self.store_failed(myself, state, &error, SearchMsg::CatalogChanged);
                return Ok(());
            }
        }
        let written_us = started.elapsed().as_micros() as u64;
        state.changed_at = Instant::now();
        state.unswept.extend(first);
        if (!state.unswept.is_empty() || state.listing.0.is_some()) && !state.sweeping {
            myself.send_after(SWEEP_AFTER, || SearchMsg::Sweep);
            state.sweeping = true;
        }
        self.shared.version.store(catalog.version, Ordering::Release);
        let recovered =
            self.shared.recovering.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(reason) = recovered {
            info!(%reason, version = catalog.version, "the search index caught up");
            self.shared.changed.notify_one();
        }
        debug!(
            version = catalog.version,
            waiting_for_vectors = state.pending.iter().map(Vec::len).sum::<usize>(),
            diffed_us,
            written_us,
            elapsed_us = started.elapsed().as_micros() as u64,
            "search index updated"
        );
        Ok(())
    }

    /// Copies the points of the collection of the earlier format `version` that the current
    /// one lacks (or holds without their dense vector), so that an upgrade embeds nothing
    /// again; then deletes that collection, unless the store is shared, where routers of
    /// the earlier version may still use it.
    pub(crate) async fn copy_earlier(&self, version: u32) -> Result<(), StoreError> {
        let (store, collection) = (&self.shared.store, &self.shared.collection);
        let embedder = self.shared.embedder.as_ref();
        let earlier = collection_name(version, embedder.map(|e| e.model_id()));
        let held = match store.ids(&earlier, None).await {
            Err(StoreError::NoCollection { .. }) => return Ok(()),
            held => held?,
        };
        let complete = embedder
            .map(|_| Filter { must: vec![Condition::HasVector(DENSE.into())], must_not: vec![] });
        let have: HashSet<PointId> = store.ids(collection, complete).await?.into_iter().collect();
        let missing: Vec<PointId> = held.into_iter().filter(|id| !have.contains(id)).collect();
        let started = Instant::now();
        for chunk in missing.chunks(STORE_BATCH) {
            let records = store.retrieve(&earlier, chunk.to_vec(), true).await?;
            store.upsert(collection, records.into_iter().map(Point::from).collect()).await?;
        }
        if !missing.is_empty() {
            info!(
                from = %earlier,
                to = %collection,
                points = missing.len(),
                ms = started.elapsed().as_millis() as u64,
                "copied the tool points of an earlier format"
            );
        }
        if store.shared() {
            info!(
                collection = %earlier,
                "the earlier format's collection is kept for routers of earlier versions \
                 sharing the store; delete it once none is left"
            );
            Ok(())
        } else {
            store.delete_collection(&earlier).await
        }
    }

    /// Writes the changes to the store: the points it does not have (lexical only, for
    /// now; their lexical vectors computed here, across the cores), and deletes those of
    /// changed and removed tools. Returns, by point id, whether each changed tool's point
    /// already had its dense vector.
    pub(crate) async fn write(
        &self,
        changes: &Changes,
        listing: &mut Listing,
    ) -> Result<HashMap<PointId, bool>, StoreError> {
        let store = &self.shared.store;
        let collection = &self.shared.collection;
        let ids: Vec<PointId> = changes.upserts.iter().map(|(_, _, p)| p.id).collect();
        let known = self.known(&ids, listing).await?;
        let fresh: Vec<Pending> = changes
            .upserts
            .iter()
            .map(|(_, _, p)| p)
            .filter(|p| !known.contains_key(&p.id))
            .cloned()
            .collect();
        let points = if fresh.len() > EMBED_BATCH {
            // A first index of thousands of texts: on a blocking thread, across the cores.
            tokio::task::spawn_blocking(move || {
                use rayon::prelude::*;
                fresh.par_iter().map(|p| p.point(None)).collect::<Vec<_>>()
            })
            .await
            .map_err(|e| StoreError::Failed {
                store: store.describe(),
                reason: format!("computing lexical vectors failed: {e}"),
            })?
        } else {
            fresh.iter().map(|p| p.point(None)).collect()
        };
        for chunk in points.chunks(STORE_BATCH) {
            store.upsert(collection, chunk.to_vec()).await?;
            listing.hold(chunk.iter().map(|p| p.id), false);
        }
        if !changes.gone.is_empty() {
            store.delete(collection, changes.gone.clone()).await?;
            listing.forget(&changes.gone);
        }
        Ok(known)
    }

    /// Returns which of the points `ids` the store holds and, for each, whether it has its
    /// dense vector. Ids only are read: a few of them by id; many from the `listing` of
    /// every id the collection holds, made now if there is none (without a model, no
    /// point has a dense vector, and one listing tells all).
    pub(crate) async fn known(
        &self,
        ids: &[PointId],
        listing: &mut Listing,
    ) -> Result<HashMap<PointId, bool>, StoreError> {
        let (store, collection) = (&self.shared.store, &self.shared.collection);
        let lacking = |mut filter: Filter| {
            filter.must_not.push(Condition::HasVector(DENSE.into()));
            Some(filter)
        };
        let mut known = HashMap::with_capacity(ids.len());
        if listing.0.is_none() && ids.len() >= LIST_ALL_FROM {
            let held = store.ids(collection, None).await?;
            let dense = self.shared.embedder.is_some();
            let mut listed: HashMap<PointId, bool> =
                held.into_iter().map(|id| (id, dense)).collect();
            if dense {
                for id in store.ids(collection, lacking(Filter::default())).await? {
                    listed.insert(id, false);
                }
            }
            listing.0 = Some(listed);
        }
        if let Some(listing) = &listing.0 {
            known.extend(ids.iter().filter_map(|id| listing.get(id).map(|dense| (*id, *dense))));
            return Ok(known);
        }
        for chunk in ids.chunks(STORE_BATCH) {
            let these = Filter { must: vec![Condition::HasId(chunk.to_vec())], must_not: vec![] };
            let held = store.ids(collection, Some(these.clone())).await?;
            if held.is_empty() {
                continue;
            }
            known.extend(held.into_iter().map(|id| (id, true)));
            for id in store.ids(collection, lacking(these)).await? {
                known.insert(id, false);
            }
        }
        Ok(known)
    }

    /// Deletes the points of older texts of the tools this process indexed for the first
    /// time (`unswept`), once the catalog has been still for [`SWEEP_AFTER`]: a tool whose
    /// text changed while no router ran left its old point behind, which would take
    /// candidates from every search and weigh in the lexical statistics. Skipped when the
    /// store holds no more points than are indexed, as after a restart over an unchanged
    /// catalog. The listing of the store's ids made for the first indexes is dropped once
    /// the catalog has been still for [`LISTING_FOR`]: from then on the store is asked
    /// again, since other routers may write to it.
    pub(crate) async fn sweep(&self, myself: &ActorRef<SearchMsg>, state: &mut ToolSearchState) {
        let still = state.changed_at.elapsed();
        if still < SWEEP_AFTER {
            myself.send_after(SWEEP_AFTER - still, || SearchMsg::Sweep);
            return;
        }
        state.sweeping = false;
        let names = std::mem::take(&mut state.unswept);
        match self.sweep_names(&names).await {
            Ok(deleted) => state.listing.forget(&deleted),
            // Searchable as it is; the points are swept at the next start.
            Err(error) => warn!(%error, "deleting points of older tool texts failed"),
        }
        if state.listing.0.is_some() {
            if still >= LISTING_FOR {
                state.listing = Listing::default();
            } else {
                myself.send_after(LISTING_FOR - still, || SearchMsg::Sweep);
                state.sweeping = true;
            }
        }
    }

    /// Deletes the points of `names` other than their tools' current ones. The store's
    /// points that no indexed tool has are few (older texts, and tools of sources not
    /// connected yet): those are read, and the ones under these names deleted. Returns the
    /// points deleted.
    pub(crate) async fn sweep_names(&self, names: &[String]) -> Result<Vec<PointId>, StoreError> {
        let (store, collection) = (&self.shared.store, &self.shared.collection);
        let live = self.shared.live.read().unwrap_or_else(PoisonError::into_inner).len();
        if names.is_empty() || store.count(collection, None).await? as usize <= live {
            return Ok(Vec::new());
        }
        let held = store.ids(collection, None).await?;
        let others: Vec<PointId> = {
            let live = self.shared.live.read().unwrap_or_else(PoisonError::into_inner);
            held.into_iter().filter(|id| !live.contains_key(id)).collect()
        };
        let names: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
        let mut stale = Vec::new();
        for chunk in others.chunks(STORE_BATCH) {
            for record in store.retrieve(collection, chunk.to_vec(), false).await? {
                if record
                    .payload
                    .get(NAME)
                    .and_then(Value::as_str)
                    .is_some_and(|n| names.contains(n))
                {
                    stale.push(record.id);
                }
            }
        }
        if !stale.is_empty() {
            debug!(points = stale.len(), "deleting points of older tool texts");
            store.delete(collection, stale.clone()).await?;
        }
        Ok(stale)
    }

    /// Applies written changes to what searches read, and queues the tools that need a
    /// dense vector.
    pub(crate) fn commit(
        &self,
        myself: &ActorRef<SearchMsg>,
        state: &mut ToolSearchState,
        changes: Changes,
        known: &HashMap<PointId, bool>,
    ) {
        let embedding = self.shared.embedder.is_some();
        let mut waiting = Vec::new();
        {
            let mut live = self.shared.live.write().unwrap_or_else(PoisonError::into_inner);
            let mut embedded = 0isize;
            for id in &changes.gone {
                if live.remove(id).is_some_and(|tool| tool.dense) {
                    embedded -= 1;
                }
            }
            for name in &changes.removed {
                state.indexed.remove(name);
            }
            for (name, entry, pending) in changes.upserts {
                let dense = known.get(&pending.id).copied().unwrap_or(false);
                let name: Arc<str> = name.into();
                if let Some(old) = live.insert(pending.id, Live { name: name.clone(), dense }) {
                    embedded -= isize::from(old.dense);
                }
                embedded += isize::from(dense);
                state.indexed.insert(name.to_string(), (entry, pending.id));
                if embedding && !dense {
                    waiting.push(pending);
                }
            }
            if embedded >= 0 {
                self.shared.embedded.fetch_add(embedded as usize, Ordering::AcqRel);
            } else {
                self.shared.embedded.fetch_sub(embedded.unsigned_abs(), Ordering::AcqRel);
            }
        }
        if waiting.is_empty() {
            return;
        }
        waiting.sort_unstable_by_key(|p| p.text.len());
        let mut waiting = waiting.into_iter().peekable();
        while waiting.peek().is_some() {
            state.pending.push(waiting.by_ref().take(EMBED_BATCH).collect());
        }
        if !state.embedding {
            state.embedding = myself.cast(SearchMsg::EmbedNext).is_ok();
            state.run.get_or_insert((Instant::now(), 0));
        }
    }
}
