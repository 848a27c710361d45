use std::{
    collections::HashMap,
    hash::RandomState,
    sync::{Arc, PoisonError, atomic::Ordering},
    time::{Duration, Instant},
};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use toolmesh_core::{
    StoreError,
    vector::{CollectionSpec, Precision},
};
use toolmesh_registry::RegistryHandle;
use tracing::{Instrument, warn};

use crate::{
    SearchHandle,
    handle::{NAME, SearchShared},
};
use crate::{SearchMsg, SearchOptions, points::*, state::*};

/// Keeps the tool points in the vector store in step with the catalog.
///
/// A tool is one point, its id the digest of its text: the same text has the same point in
/// every process and across restarts, so a restart over an unchanged catalog, or a second
/// router on a shared store, embeds nothing. On each published catalog the actor takes the
/// tools whose entry differs from the catalog it last caught up with (the registry keeps an
/// unchanged tool's entry), hashes the text of those only, asks the store which of their
/// points it has, writes the missing ones at once with their lexical vector, and deletes
/// the points of changed and removed tools (and, once the catalog has been still a while,
/// any point of an older text of a tool it indexed for the first time that an earlier run
/// left behind). Tools whose point has no dense vector yet wait in
/// batches of texts of similar length, embedded one batch per message in random order (so
/// routers sharing a store split a first embedding between them), with catalog changes
/// handled between batches.
#[derive(Debug)]
pub struct ToolSearchActor {
    pub(crate) registry: RegistryHandle,
    pub(crate) shared: Arc<SearchShared>,
}

impl ToolSearchActor {
    /// Starts the actor over `registry`; returns the handle searches use.
    pub async fn start(
        registry: RegistryHandle,
        options: SearchOptions,
    ) -> Result<(ActorRef<SearchMsg>, SearchHandle), ActorProcessingErr> {
        let collection = collection_name(FORMAT, options.embedder.as_ref().map(|e| e.model_id()));
        let shared = Arc::new(SearchShared {
            store: options.store,
            collection,
            live: Default::default(),
            embedded: Default::default(),
            embeddings: Default::default(),
            embedder: options.embedder,
            recent: Default::default(),
            fusion: options.fusion,
            version: Default::default(),
            max_query_bytes: options.max_query_bytes,
            recovering: Default::default(),
            restarts: Default::default(),
            changed: Default::default(),
        });
        let actor = Self::over(registry.clone(), shared.clone());
        let (actor, _) = Actor::spawn(None, actor, ()).await?;
        Ok((actor, SearchHandle { shared, registry }))
    }

    /// An actor over the index `shared`, as a supervisor restarts it.
    pub(crate) fn over(registry: RegistryHandle, shared: Arc<SearchShared>) -> Self {
        ToolSearchActor { registry, shared }
    }

    pub(crate) fn spec(&self) -> CollectionSpec {
        CollectionSpec {
            name: self.shared.collection.clone(),
            dense_size: self.shared.embedder.as_ref().map(|e| e.dimensions()),
            // Half the bytes a search's exact scan reads; on the benchmark's queries the
            // rankings are those of full precision.
            precision: Precision::Half,
            lexical: true,
            keyword_fields: vec![NAME.into()],
        }
    }

    /// The store failed: health says so, and the index tries again shortly.
    pub(crate) fn store_failed(
        &self,
        myself: &ActorRef<SearchMsg>,
        state: &mut ToolSearchState,
        error: &StoreError,
        retry: SearchMsg,
    ) {
        warn!(%error, "the tool index cannot follow the catalog; trying again");
        let reason = format!("the vector store fails: {error}");
        let mut recovering = self.shared.recovering.lock().unwrap_or_else(PoisonError::into_inner);
        if recovering.as_deref() != Some(reason.as_str()) {
            *recovering = Some(reason);
            self.shared.changed.notify_one();
        }
        if matches!(retry, SearchMsg::CatalogChanged) {
            if state.retrying {
                return;
            }
            state.retrying = true;
        }
        let actor = myself.clone();
        tokio::spawn(async move {
            tokio::time::sleep(RETRY_AFTER).await;
            let _ = actor.cast(retry);
        });
    }
}

/// How long the index waits before trying a failed store again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

impl Actor for ToolSearchActor {
    type Msg = SearchMsg;
    type State = ToolSearchState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<SearchMsg>,
        _: (),
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut changes = self.registry.subscribe();
        let actor = myself.clone();
        tokio::spawn(
            async move {
                while changes.changed().await.is_ok() {
                    if actor.cast(SearchMsg::CatalogChanged).is_err() {
                        return;
                    }
                }
            }
            .instrument(tracing::info_span!("search", task = "follow catalog")),
        );
        // A fresh actor (a restart) indexes the whole catalog again: what searches read
        // starts over with it; the store keeps the points, so nothing is embedded again.
        self.shared.live.write().unwrap_or_else(PoisonError::into_inner).clear();
        self.shared.embedded.store(0, Ordering::Release);
        myself.cast(SearchMsg::CatalogChanged)?;
        Ok(ToolSearchState {
            indexed: HashMap::new(),
            caught_up: None,
            unswept: Vec::new(),
            changed_at: Instant::now(),
            sweeping: false,
            listing: Listing::default(),
            pending: Vec::new(),
            embedding: false,
            retrying: false,
            ensured: false,
            run: None,
            random: RandomState::new(),
            picks: 0,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<SearchMsg>,
        message: SearchMsg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SearchMsg::CatalogChanged => self.reindex(&myself, state).await,
            SearchMsg::EmbedNext => self.embed_next(&myself, state).await,
            SearchMsg::Sweep => {
                self.sweep(&myself, state).await;
                Ok(())
            }
        }
    }
}
