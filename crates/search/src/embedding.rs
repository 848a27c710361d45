//! Embedding in the background: the tools that lack a dense vector, a batch at a time.

use std::{
    hash::BuildHasher,
    panic::AssertUnwindSafe,
    sync::{Arc, PoisonError, atomic::Ordering},
};

use ractor::{ActorProcessingErr, ActorRef};
use toolmesh_core::{
    StoreError,
    vector::{Condition, DENSE, Filter, Point, PointId},
};
use toolmesh_embed::Embedder;
use tracing::{error, info};

use crate::{SearchMsg, ToolSearchActor, state::*};

impl ToolSearchActor {
    pub(crate) async fn embed_next(
        &self,
        myself: &ActorRef<SearchMsg>,
        state: &mut ToolSearchState,
    ) -> Result<(), ActorProcessingErr> {
        state.embedding = false;
        let Some(embedder) = self.shared.embedder.clone() else { return Ok(()) };
        if state.pending.is_empty() {
            return Ok(());
        }
        // A batch at random: routers sharing a store, started together, take different ones.
        state.picks += 1;
        let pick = state.random.hash_one(state.picks) as usize % state.pending.len();
        let mut batch = state.pending.swap_remove(pick);
        // Skip tools that changed or went since they were queued.
        batch.retain(|p| state.indexed.get(&p.name).is_some_and(|(_, id)| *id == p.id));
        match self.embed_batch(embedder, &mut batch, &mut state.listing).await {
            Ok(made) => {
                if let Some((_, count)) = &mut state.run {
                    *count += made;
                }
            }
            Err(error) => {
                // The batch waits for the store to come back.
                state.pending.push(batch);
                self.store_failed(myself, state, &error, SearchMsg::EmbedNext);
                return Ok(());
            }
        }
        if state.pending.is_empty() {
            if let Some((started, count)) = state.run.take()
                && count > 0
            {
                info!(
                    tools = count,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "embedded tool texts"
                );
            }
        } else {
            state.embedding = myself.cast(SearchMsg::EmbedNext).is_ok();
        }
        Ok(())
    }

    /// Embeds the tools of `batch` whose points still lack a dense vector and stores them.
    /// Returns how many texts were embedded. A model failure costs the batch its vectors
    /// (the tools stay searchable by their words); a store failure is returned.
    pub(crate) async fn embed_batch(
        &self,
        embedder: Arc<dyn Embedder>,
        batch: &mut Vec<Pending>,
        listing: &mut Listing,
    ) -> Result<usize, StoreError> {
        let store = &self.shared.store;
        let collection = &self.shared.collection;
        // Another router on the same store may have embedded some meanwhile.
        let ids: Vec<PointId> = batch.iter().map(|p| p.id).collect();
        let embedded = Filter {
            must: vec![Condition::HasId(ids), Condition::HasVector(DENSE.into())],
            must_not: vec![],
        };
        let done = store.ids(collection, Some(embedded)).await?;
        if !done.is_empty() {
            self.mark_dense(&done, listing);
            batch.retain(|p| !done.contains(&p.id));
        }
        if batch.is_empty() {
            return Ok(0);
        }
        let texts: Vec<String> = batch.iter().map(|p| p.text.clone()).collect();
        // The model's forward pass runs on a blocking thread; a panic in it costs this
        // batch its vectors, not the index its actor.
        let embedded = tokio::task::spawn_blocking(move || {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            std::panic::catch_unwind(AssertUnwindSafe(|| embedder.embed(&refs))).unwrap_or_else(
                |panic| {
                    Err(toolmesh_embed::EmbedError::Run(format!(
                        "the model panicked: {}",
                        panic_message(panic.as_ref())
                    )))
                },
            )
        })
        .await
        .unwrap_or_else(|e| Err(toolmesh_embed::EmbedError::Run(e.to_string())));
        let vectors = match embedded {
            Ok(vectors) => vectors,
            Err(error) => {
                let tools: Vec<&str> = batch.iter().map(|p| p.name.as_str()).collect();
                error!(%error, ?tools, "embedding tools failed; they are searchable lexically only");
                batch.clear();
                return Ok(0);
            }
        };
        let points: Vec<Point> =
            batch.iter().zip(vectors).map(|(p, vector)| p.point(Some(vector))).collect();
        let made = points.len();
        store.upsert(collection, points).await?;
        self.shared.embeddings.fetch_add(made as u64, Ordering::AcqRel);
        let ids: Vec<PointId> = batch.iter().map(|p| p.id).collect();
        self.mark_dense(&ids, listing);
        Ok(made)
    }

    /// Notes that the points `ids` have their dense vector.
    pub(crate) fn mark_dense(&self, ids: &[PointId], listing: &mut Listing) {
        listing.hold(ids.iter().copied(), true);
        let mut live = self.shared.live.write().unwrap_or_else(PoisonError::into_inner);
        for id in ids {
            if let Some(tool) = live.get_mut(id)
                && !tool.dense
            {
                tool.dense = true;
                self.shared.embedded.fetch_add(1, Ordering::AcqRel);
            }
        }
    }
}

/// The message a panic carried.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message")
}
