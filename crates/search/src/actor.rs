use std::{
    collections::{HashMap, hash_map::DefaultHasher},
    hash::{Hash, Hasher},
    sync::{Arc, atomic::Ordering},
    time::Instant,
};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use toolmesh_embed::Embedder;
use toolmesh_registry::RegistryHandle;
use tracing::debug;

use crate::{SearchHandle, handle::SearchShared, terms, tool_text};

/// Messages of the [`ToolSearchActor`].
#[derive(Debug)]
pub enum SearchMsg {
    /// The registry published a new catalog.
    CatalogChanged,
}

/// Keeps the search index in step with the catalog.
#[derive(Debug)]
pub struct ToolSearchActor {
    registry: RegistryHandle,
    shared: Arc<SearchShared>,
}

/// Texts embedded per batch; the index is updated after each batch, so searches see
/// progress during a long first indexing.
const EMBED_BATCH: usize = 32;

/// The [`ToolSearchActor`]'s state: the hash of each indexed tool's text, and the vectors
/// of texts already embedded (by hash; a tool whose text is unchanged is not re-embedded).
#[derive(Debug, Default)]
pub struct ToolSearchState {
    hashes: HashMap<String, u64>,
    cache: HashMap<u64, Arc<[f32]>>,
}

impl ToolSearchActor {
    /// Starts the actor over `registry`, embedding with `embedder` when there is one;
    /// returns the handle searches use.
    pub async fn start(
        registry: RegistryHandle,
        embedder: Option<Arc<dyn Embedder>>,
    ) -> Result<(ActorRef<SearchMsg>, SearchHandle), ActorProcessingErr> {
        let shared = Arc::new(SearchShared { embedder, ..Default::default() });
        let actor = ToolSearchActor { registry: registry.clone(), shared: shared.clone() };
        let (actor, _) = Actor::spawn(None, actor, ()).await?;
        Ok((actor, SearchHandle { shared, registry }))
    }
}

fn hash(text: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

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
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                if actor.cast(SearchMsg::CatalogChanged).is_err() {
                    return;
                }
            }
        });
        myself.cast(SearchMsg::CatalogChanged)?;
        Ok(ToolSearchState::default())
    }

    async fn handle(
        &self,
        _: ActorRef<SearchMsg>,
        message: SearchMsg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let SearchMsg::CatalogChanged = message;
        let catalog = self.registry.snapshot();
        if catalog.version == self.shared.version.load(Ordering::Acquire) && catalog.version != 0 {
            return Ok(());
        }
        let started = Instant::now();
        // Work out the changes before taking the write lock, so searches wait only for the
        // updates themselves.
        let mut upserts = Vec::new();
        for (name, entry) in &catalog.tools {
            let text = tool_text(&entry.spec);
            let digest = hash(&text);
            if state.hashes.get(name) != Some(&digest) {
                upserts.push((name.clone(), terms(&text), digest));
            }
        }
        let removed: Vec<String> = state
            .hashes
            .keys()
            .filter(|name| !catalog.tools.contains_key(*name))
            .cloned()
            .collect();
        {
            let mut index =
                self.shared.index.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            for name in &removed {
                index.remove(name);
            }
            for (name, terms, _) in &upserts {
                index.upsert(name, terms);
            }
        }
        for name in &removed {
            state.hashes.remove(name);
        }
        for (name, _, digest) in upserts.iter() {
            state.hashes.insert(name.clone(), *digest);
        }
        self.shared.version.store(catalog.version, Ordering::Release);
        {
            let mut vectors =
                self.shared.vectors.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            for name in &removed {
                vectors.remove(name);
            }
        }
        if let Some(embedder) = self.shared.embedder.clone() {
            // Texts already embedded (same text, same model) are reused; the rest are
            // embedded in batches on a blocking thread.
            let mut missing = Vec::new();
            {
                let mut vectors =
                    self.shared.vectors.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                for (name, _, digest) in &upserts {
                    match state.cache.get(digest) {
                        Some(vector) => {
                            vectors.insert(name.clone(), vector.clone());
                        }
                        None => missing.push((name.clone(), *digest)),
                    }
                }
            }
            for batch in missing.chunks(EMBED_BATCH) {
                let texts: Vec<String> = batch
                    .iter()
                    .filter_map(|(name, _)| catalog.get(name).map(|t| tool_text(&t.spec)))
                    .collect();
                if texts.len() != batch.len() {
                    continue;
                }
                let embedder = embedder.clone();
                let embedded = tokio::task::spawn_blocking(move || {
                    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                    embedder.embed(&refs)
                })
                .await?;
                let embedded = match embedded {
                    Ok(embedded) => embedded,
                    Err(error) => {
                        tracing::warn!(%error, "embedding tools failed; they are searchable lexically only");
                        continue;
                    }
                };
                let mut vectors =
                    self.shared.vectors.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                for ((name, digest), vector) in batch.iter().zip(embedded) {
                    let vector: Arc<[f32]> = vector.into();
                    state.cache.insert(*digest, vector.clone());
                    vectors.insert(name.clone(), vector);
                }
            }
        }
        debug!(
            version = catalog.version,
            updated = upserts.len(),
            removed = removed.len(),
            elapsed_us = started.elapsed().as_micros() as u64,
            "search index updated"
        );
        Ok(())
    }
}
