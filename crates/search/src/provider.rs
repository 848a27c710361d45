use std::{
    sync::{Arc, PoisonError, atomic::Ordering},
    time::Duration,
};

use arc_swap::ArcSwap;
use ractor::{Actor, ActorCell, ActorRef};
use toolmesh_config::Config;
use toolmesh_core::{Health, Provider, ProviderError, VectorStore};
use toolmesh_embed::Embedder;
use toolmesh_registry::RegistryHandle;

use crate::{SearchConfig, SearchError, SearchHandle, SearchMsg, SearchOptions, ToolSearchActor};

/// The tool-search index as a provider: it follows the catalog by itself, so it has no
/// tools to publish. Health entries: `toolmesh.search.index` (down from a crash of the
/// index's actor until the restarted one has caught up with the catalog) and
/// `toolmesh.search.embeddings` (down while search is lexical only).
pub struct SearchProvider {
    handle: SearchHandle,
    /// The index's actor; a supervisor that restarts it swaps in the new one.
    actor: ArcSwap<ActorRef<SearchMsg>>,
    /// Why search is lexical only; `None` when it ranks with embeddings.
    lexical: Option<String>,
}

impl SearchProvider {
    /// Starts the index over `registry` with the `model` loaded for `config`, its points
    /// in `store`. Without a model, search is lexical, loudly, and its health says why.
    pub async fn from_config(
        registry: RegistryHandle,
        config: &SearchConfig,
        store: Arc<dyn VectorStore>,
        model: Result<Arc<dyn Embedder>, String>,
    ) -> Result<Self, SearchError> {
        let (embedder, lexical) = match model {
            Ok(embedder) => (Some(embedder), None),
            Err(reason) => (None, Some(reason)),
        };
        let options = SearchOptions {
            store,
            embedder,
            fusion: config.fusion,
            max_query_bytes: config.max_query_bytes.get(),
        };
        let mut provider = Self::start(registry, options).await?;
        provider.lexical = lexical;
        Ok(provider)
    }

    /// Starts the index over `registry`.
    pub async fn start(
        registry: RegistryHandle,
        options: SearchOptions,
    ) -> Result<Self, SearchError> {
        let lexical = options.embedder.is_none().then(|| "no embedding model".to_owned());
        let (actor, handle) = ToolSearchActor::start(registry, options)
            .await
            .map_err(|e| SearchError::Task(e.to_string()))?;
        Ok(SearchProvider { handle, actor: ArcSwap::from_pointee(actor), lexical })
    }

    /// Returns the index's actor, for a supervisor to link.
    pub fn actor(&self) -> ActorCell {
        self.actor.load().get_cell()
    }

    /// Starts a fresh index actor under `supervisor` after the old one failed: it indexes
    /// the whole catalog again (the store keeps the vectors), and until it has caught up
    /// the index's health is down; afterwards it says how often it was restarted.
    pub async fn respawn(
        &self,
        supervisor: ActorCell,
        reason: String,
    ) -> Result<ActorCell, ractor::SpawnErr> {
        let shared = &self.handle.shared;
        {
            let mut restarts = shared.restarts.lock().unwrap_or_else(PoisonError::into_inner);
            *restarts = (restarts.0 + 1, reason.clone());
        }
        *shared.recovering.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason);
        shared.changed.notify_one();
        shared.version.store(0, Ordering::Release);
        let actor = ToolSearchActor::over(self.handle.registry.clone(), shared.clone());
        let (actor, _) = Actor::spawn_linked(None, actor, (), supervisor).await?;
        self.actor.store(Arc::new(actor.clone()));
        Ok(actor.get_cell())
    }

    /// Returns the handle searches use.
    pub fn handle(&self) -> &SearchHandle {
        &self.handle
    }
}

#[async_trait::async_trait]
impl Provider<Config> for SearchProvider {
    fn kind(&self) -> &'static str {
        "search"
    }

    async fn start(&self, _: &Config) -> Result<(), ProviderError> {
        Ok(())
    }

    /// The `[search]` section is read at start: the model, the fusion and the limits hold
    /// until a restart.
    async fn reload(&self, _: &Config) -> Result<(), ProviderError> {
        Ok(())
    }

    fn health(&self) -> Vec<(String, Health)> {
        let shared = &self.handle.shared;
        let restarts = shared.restarts.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let index = match &*shared.recovering.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(reason) => Health::down(format!("re-indexing: {reason}")),
            None if restarts.0 == 0 => Health::up(),
            None => Health {
                up: true,
                status: format!("restarted {} times; last failure: {}", restarts.0, restarts.1),
            },
        };
        let embeddings = match &self.lexical {
            None => Health::up(),
            Some(reason) => Health::down(format!("search is lexical only: {reason}")),
        };
        vec![("index".into(), index), ("embeddings".into(), embeddings)]
    }

    async fn health_changed(&self) {
        self.handle.shared.changed.notified().await;
    }

    async fn stop(&self, _grace: Duration) {
        let actor = self.actor.load_full();
        let _ = actor.stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(5))).await;
    }
}

/// Loads the embedding model for tool search; `Err` says why search is lexical.
#[async_trait::async_trait]
impl toolmesh_core::Supervised for SearchProvider {
    fn actor(&self) -> ractor::ActorCell {
        SearchProvider::actor(self)
    }

    async fn respawn(
        &self,
        root: ractor::ActorCell,
        reason: String,
    ) -> Result<ractor::ActorCell, String> {
        SearchProvider::respawn(self, root, reason).await.map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::{
        path::PathBuf,
        sync::atomic::{AtomicBool, AtomicUsize},
    };

    use toolmesh_core::{
        StoreError, ToolSource, ToolSpec,
        vector::{CollectionSpec, Filter, Hit, Point, PointId, Query, Record},
    };
    use toolmesh_embed::EmbedError;
    use toolmesh_registry::SourceUpdate;

    use ractor::{ActorProcessingErr, SupervisionEvent};

    use super::*;
    use crate::testing::{registry, tool};

    /// An embedder whose first batch panics, as a bug in a model would.
    struct PanicsOnce {
        panicked: AtomicBool,
        batches: AtomicUsize,
    }

    impl Embedder for PanicsOnce {
        fn model_id(&self) -> &str {
            "panics-once"
        }

        fn dimensions(&self) -> usize {
            2
        }

        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            self.batches.fetch_add(1, Ordering::SeqCst);
            if !self.panicked.swap(true, Ordering::SeqCst) {
                panic!("a bug in the model");
            }
            Ok(texts.iter().map(|_| vec![1.0, 0.0]).collect())
        }
    }

    /// An embedded store in a fresh directory, removed with it.
    struct Store(Arc<dyn VectorStore>, PathBuf);

    impl Drop for Store {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }

    async fn store(name: &str) -> Store {
        let dir =
            std::env::temp_dir().join(format!("toolmesh-search-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Store(Arc::new(toolmesh_vector::EmbeddedStore::open(&dir).await.unwrap()), dir)
    }

    /// A registry and a lexical-only index over it, in a fresh store.
    async fn lexical(name: &str) -> (RegistryHandle, Store, SearchProvider) {
        let registry = registry().await;
        let store = store(name).await;
        let options = SearchOptions::new(store.0.clone());
        let provider = SearchProvider::start(registry.clone(), options).await.unwrap();
        (registry, store, provider)
    }

    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let waited = tokio::time::timeout(Duration::from_secs(120), async {
            while !done() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        waited.await.unwrap_or_else(|_| panic!("{what}"));
    }

    #[tokio::test]
    async fn a_panic_in_an_embedding_batch_costs_its_vectors_not_the_index() {
        let registry = registry().await;
        let embedder =
            Arc::new(PanicsOnce { panicked: AtomicBool::new(false), batches: AtomicUsize::new(0) });
        let store = store("panic").await;
        let options = SearchOptions {
            embedder: Some(embedder.clone()),
            ..SearchOptions::new(store.0.clone())
        };
        let provider = SearchProvider::start(registry.clone(), options).await.unwrap();
        registry.register(tool("weather", "Gets the weather forecast.")).await.unwrap();
        until("the first batch ran", || embedder.batches.load(Ordering::SeqCst) == 1).await;

        // The index lives on: a later tool is indexed and embedded, both are searchable.
        registry.register(tool("stocks", "Gets stock prices.")).await.unwrap();
        until("the second tool is embedded", || provider.handle().embedded() == 1).await;
        assert_eq!(provider.handle().indexed(), 2);
        assert!(!provider.handle().complete(), "a tool without its vector: not complete");
        // The toy model gives every text one vector; the lexical ranking still finds weather.
        let hits = provider.handle().search("weather forecast", 3, |_| true).await.unwrap();
        assert!(hits.iter().any(|h| h.tool.spec.name == "weather"), "{hits:?}");
        assert!(provider.health().iter().all(|(_, health)| health.up));
        provider.stop(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn a_respawned_index_catches_up_and_health_shows_the_gap() {
        let (registry, _store, provider) = lexical("respawn").await;
        registry.register(tool("weather", "Gets the weather forecast.")).await.unwrap();
        until("indexed", || provider.handle().indexed() == 1).await;
        assert!(provider.handle().complete(), "lexical only: complete once indexed");
        let index = |provider: &SearchProvider| {
            provider.health().into_iter().find(|(name, _)| name == "index").unwrap().1
        };
        assert!(index(&provider).up);

        // A crash, and what a supervisor does about it: a fresh actor under it.
        let (supervisor, _) = Actor::spawn(None, Idle, ()).await.unwrap();
        let old = provider.actor();
        old.kill();
        old.wait(None).await.unwrap();
        registry.register(tool("stocks", "Gets stock prices.")).await.unwrap();
        assert!(!provider.handle().complete(), "the index is behind the catalog");
        let fresh = provider.respawn(supervisor.get_cell(), "killed".into()).await.unwrap();
        assert_ne!(fresh.get_id(), old.get_id());
        until("caught up", || index(&provider).up).await;
        assert_eq!(index(&provider).status, "restarted 1 times; last failure: killed");
        // The fresh actor indexed what changed while none ran, and follows the catalog.
        assert_eq!(provider.handle().indexed(), 2);
        assert!(provider.handle().complete());
        registry.register(tool("tides", "Gets tide tables.")).await.unwrap();
        until("the fresh actor follows the catalog", || provider.handle().indexed() == 3).await;
        provider.stop(Duration::from_secs(1)).await;
    }

    /// A model that counts the texts it embeds and knows one meaning: texts about the
    /// weather point one way, every other text the other.
    #[derive(Default)]
    struct Counted(AtomicUsize);

    impl Embedder for Counted {
        fn model_id(&self) -> &str {
            "counted"
        }

        fn dimensions(&self) -> usize {
            2
        }

        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            self.0.fetch_add(texts.len(), Ordering::SeqCst);
            let about = |text: &&str| text.to_lowercase().contains("weather");
            Ok(texts
                .iter()
                .map(|t| if about(t) { vec![1.0, 0.0] } else { vec![0.0, 1.0] })
                .collect())
        }
    }

    /// Starts an index over `registry` in `store`, embedding with `model`.
    async fn embedding(
        registry: &RegistryHandle,
        store: Arc<dyn VectorStore>,
        model: Arc<Counted>,
    ) -> SearchProvider {
        let options = SearchOptions { embedder: Some(model), ..SearchOptions::new(store) };
        SearchProvider::start(registry.clone(), options).await.unwrap()
    }

    /// Waits until `provider` has indexed `tools` tools, each with its vector.
    async fn until_embedded(what: &str, provider: &SearchProvider, tools: usize) {
        until(what, || {
            let handle = provider.handle();
            handle.indexed() == tools && handle.embedded() == tools
        })
        .await;
    }

    /// A store that counts the points written to the store under it, and the listings of
    /// every id in a collection made to index (not the sweep's, which counts first); and
    /// says it is shared when told to, as a server is.
    #[derive(Debug)]
    struct Writes {
        store: Arc<dyn VectorStore>,
        points: AtomicUsize,
        listings: AtomicUsize,
        counted: AtomicBool,
        shared: bool,
    }

    impl Writes {
        fn over(store: Arc<dyn VectorStore>) -> Arc<Self> {
            Writes::with(store, false)
        }

        fn with(store: Arc<dyn VectorStore>, shared: bool) -> Arc<Self> {
            Arc::new(Writes {
                store,
                points: AtomicUsize::new(0),
                listings: AtomicUsize::new(0),
                counted: AtomicBool::new(false),
                shared,
            })
        }
    }

    #[async_trait::async_trait]
    impl VectorStore for Writes {
        fn backend(&self) -> &'static str {
            self.store.backend()
        }
        fn describe(&self) -> String {
            self.store.describe()
        }
        async fn ensure(&self, spec: &CollectionSpec) -> Result<(), StoreError> {
            self.store.ensure(spec).await
        }
        async fn upsert(&self, collection: &str, points: Vec<Point>) -> Result<(), StoreError> {
            self.points.fetch_add(points.len(), Ordering::SeqCst);
            self.store.upsert(collection, points).await
        }
        async fn delete(&self, collection: &str, ids: Vec<PointId>) -> Result<(), StoreError> {
            self.store.delete(collection, ids).await
        }
        async fn replace(
            &self,
            collection: &str,
            filter: Filter,
            points: Vec<Point>,
        ) -> Result<(), StoreError> {
            self.points.fetch_add(points.len(), Ordering::SeqCst);
            self.store.replace(collection, filter, points).await
        }
        async fn retrieve(
            &self,
            collection: &str,
            ids: Vec<PointId>,
            with_dense: bool,
        ) -> Result<Vec<Record>, StoreError> {
            self.store.retrieve(collection, ids, with_dense).await
        }
        async fn ids(
            &self,
            collection: &str,
            filter: Option<Filter>,
        ) -> Result<Vec<PointId>, StoreError> {
            let listing = filter.is_none();
            let ids = self.store.ids(collection, filter).await;
            if listing && ids.is_ok() && !self.counted.swap(false, Ordering::SeqCst) {
                self.listings.fetch_add(1, Ordering::SeqCst);
            }
            ids
        }
        async fn query(&self, collection: &str, query: Query) -> Result<Vec<Hit>, StoreError> {
            self.store.query(collection, query).await
        }
        async fn count(&self, collection: &str, filter: Option<Filter>) -> Result<u64, StoreError> {
            self.counted.store(true, Ordering::SeqCst);
            self.store.count(collection, filter).await
        }
        async fn distinct(
            &self,
            collection: &str,
            field: &str,
            limit: usize,
        ) -> Result<u64, StoreError> {
            self.store.distinct(collection, field, limit).await
        }
        async fn delete_collection(&self, collection: &str) -> Result<(), StoreError> {
            self.store.delete_collection(collection).await
        }
        fn shared(&self) -> bool {
            self.shared
        }
        async fn check(&self) -> Result<(), StoreError> {
            self.store.check().await
        }
        async fn flush(&self) -> Result<(), StoreError> {
            self.store.flush().await
        }
    }

    /// An upgrade over a store that holds the tool points of the earlier format (dense
    /// vectors at full precision) copies them: nothing is embedded again. A shared store
    /// keeps the earlier collection for the routers of the earlier version; one that only
    /// this process uses deletes it, at the first start that finds nothing left to copy.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_upgrade_copies_the_earlier_formats_points_and_embeds_nothing() {
        const TOOLS: usize = 300;
        let registry = registry().await;
        let description =
            |i| if i == 7 { "Forecasts the weather.".into() } else { format!("Does thing {i}.") };
        let tools = (0..TOOLS).map(|i| tool(&format!("tool_{i}"), &description(i)));
        let source = ToolSource::local("t");
        let update = SourceUpdate {
            source,
            tools: tools.collect(),
            toolkits: vec![],
            toolkit: None,
            unchanged: vec![],
        };
        registry.replace_source(update).await.unwrap();
        let store = store("upgrade").await;

        // The earlier format's collection as a router of that version left it: this
        // version's points, written by its index, moved to a full-precision collection.
        let model = Arc::new(Counted::default());
        let first = embedding(&registry, store.0.clone(), model.clone()).await;
        until_embedded("every tool embedded", &first, TOOLS).await;
        let current = first.handle().collection().to_owned();
        first.stop(Duration::from_secs(1)).await;
        let earlier = crate::points::collection_name(1, Some(model.model_id()));
        let spec = CollectionSpec {
            name: earlier.clone(),
            dense_size: Some(model.dimensions()),
            precision: toolmesh_core::vector::Precision::Full,
            lexical: true,
            keyword_fields: vec![crate::handle::NAME.into()],
        };
        store.0.ensure(&spec).await.unwrap();
        let ids = store.0.ids(&current, None).await.unwrap();
        let mut held = store.0.retrieve(&current, ids, true).await.unwrap();
        held.sort_by_key(|r| r.id);
        let points = held.iter().cloned().map(Point::from).collect();
        store.0.upsert(&earlier, points).await.unwrap();
        store.0.delete_collection(&current).await.unwrap();

        // Upgraded, on a shared store: every point copied, none embedded, the earlier
        // collection kept.
        let shared = Writes::with(store.0.clone(), true);
        let model = Arc::new(Counted::default());
        let second = embedding(&registry, shared.clone(), model.clone()).await;
        until_embedded("every tool has its vector", &second, TOOLS).await;
        assert_eq!(model.0.load(Ordering::SeqCst), 0, "nothing embedded again");
        assert_eq!(shared.points.load(Ordering::SeqCst), TOOLS, "each point copied once");
        assert_eq!(store.0.count(&earlier, None).await.unwrap(), TOOLS as u64);
        let ids: Vec<PointId> = held.iter().map(|r| r.id).collect();
        let mut copied = store.0.retrieve(&current, ids, true).await.unwrap();
        copied.sort_by_key(|r| r.id);
        assert_eq!(copied.len(), TOOLS);
        for (copy, original) in copied.iter().zip(&held) {
            assert_eq!(copy.id, original.id);
            assert_eq!((&copy.lexical, &copy.payload), (&original.lexical, &original.payload));
            assert_eq!(copy.dense, original.dense, "the toy model's vectors are exact in half");
        }
        let hits = second.handle().search("weather", 1, |_| true).await.unwrap();
        assert_eq!(hits[0].tool.spec.name, "tool_7");
        second.stop(Duration::from_secs(1)).await;

        // Restarted on a store only it uses: nothing is left to copy, and the earlier
        // collection is deleted.
        let own = Writes::over(store.0.clone());
        let model = Arc::new(Counted::default());
        let third = embedding(&registry, own.clone(), model.clone()).await;
        until_embedded("every tool has its vector", &third, TOOLS).await;
        assert_eq!(model.0.load(Ordering::SeqCst), 0);
        assert_eq!(own.points.load(Ordering::SeqCst), 0);
        let gone = store.0.count(&earlier, None).await.unwrap_err();
        assert_eq!(gone.code(), toolmesh_core::ErrorCode::NotFound, "{gone}");
        third.stop(Duration::from_secs(1)).await;
    }

    /// When the caller keeps only tools that rank below every candidate of the first
    /// query, the store is asked again for those tools alone, and the caller still gets
    /// `top_k` of them, best first.
    #[tokio::test]
    async fn a_narrow_keep_still_gets_top_k() {
        let (registry, _store, provider) = lexical("narrow").await;
        let strong = crate::handle::CANDIDATES + 20;
        let mut tools: Vec<_> = (0..strong)
            .map(|i| tool(&format!("forecast_{i}"), "Weather forecast: the weather, by weather."))
            .collect();
        tools.push(tool("kept_close", "A weather station's readings."));
        tools.push(tool("kept_far", "Readings of a weather balloon, sensors and logs."));
        tools.push(tool("kept_none", "Stock prices."));
        let source = ToolSource::local("t");
        let update =
            SourceUpdate { source, tools, toolkits: vec![], toolkit: None, unchanged: vec![] };
        registry.replace_source(update).await.unwrap();
        until("indexed", || provider.handle().complete()).await;
        assert_eq!(provider.handle().indexed(), strong + 3);

        let handle = provider.handle();
        let everyone = handle.search("weather", 5, |_| true).await.unwrap();
        assert!(everyone.iter().all(|h| h.tool.spec.name.starts_with("forecast_")), "{everyone:?}");
        let kept = |spec: &ToolSpec| spec.name.starts_with("kept_");
        let hits = handle.search("weather", 2, kept).await.unwrap();
        let names: Vec<&str> = hits.iter().map(|h| h.tool.spec.name.as_str()).collect();
        assert_eq!(names, ["kept_close", "kept_far"]);
        // More than there are: every kept tool that matches a word of the query.
        assert_eq!(handle.search("weather", 10, kept).await.unwrap().len(), 2);
        provider.stop(Duration::from_secs(1)).await;
    }

    /// A restart over a catalog larger than a lookup by id suits (the index then lists the
    /// ids the store holds) writes nothing for the tools whose text it holds with its
    /// vector, and indexes and embeds exactly the one tool that changed while no index ran.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restart_over_a_large_catalog_writes_only_what_changed() {
        const TOOLS: usize = 12_000;
        let registry = registry().await;
        let store = store("large").await;
        let catalog = |changed: &str| {
            let tools = (0..TOOLS)
                .map(|i| {
                    let description = if i == 7 { changed } else { "Does one numbered thing." };
                    tool(&format!("tool_{i}"), description)
                })
                .collect();
            let source = ToolSource::local("t");
            SourceUpdate { source, tools, toolkits: vec![], toolkit: None, unchanged: vec![] }
        };

        registry.replace_source(catalog("Does the seventh thing.")).await.unwrap();
        let model = Arc::new(Counted::default());
        let first = embedding(&registry, store.0.clone(), model.clone()).await;
        until_embedded("every tool embedded", &first, TOOLS).await;
        assert_eq!(model.0.load(Ordering::SeqCst), TOOLS);
        first.stop(Duration::from_secs(1)).await;

        registry.replace_source(catalog("Does the seventh thing, differently.")).await.unwrap();
        let writes = Writes::over(store.0.clone());
        let model = Arc::new(Counted::default());
        let second = embedding(&registry, writes.clone(), model.clone()).await;
        until_embedded("every tool embedded again", &second, TOOLS).await;
        assert_eq!(model.0.load(Ordering::SeqCst), 1, "only the changed text is embedded");
        // Its lexical point, then the point with its vector.
        assert_eq!(writes.points.load(Ordering::SeqCst), 2);
        // The old text's point is swept once the catalog has been still a while: one point
        // per tool.
        let collection = second.handle().collection().to_owned();
        let swept = tokio::time::timeout(Duration::from_secs(30), async {
            while store.0.count(&collection, None).await.unwrap() != TOOLS as u64 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        swept.await.expect("the old text's point is swept");
        second.stop(Duration::from_secs(1)).await;
    }

    /// At a restart, tools arrive source by source. The first index of a large source lists
    /// the ids the store holds; the later sources are looked up in that listing, not in a
    /// listing of their own, and nothing whose point the store holds is written again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sources_arriving_at_a_restart_share_one_listing_of_the_store() {
        const PER_SOURCE: usize = crate::points::LIST_ALL_FROM;
        const SOURCES: usize = 3;
        let store = store("arriving").await;
        let source = |s: usize| {
            let tools = (0..PER_SOURCE)
                .map(|i| tool(&format!("tool_{s}_{i}"), &format!("Does thing {i} of set {s}.")))
                .collect();
            let source = ToolSource::local(format!("s{s}"));
            SourceUpdate { source, tools, toolkits: vec![], toolkit: None, unchanged: vec![] }
        };
        let first_run = registry().await;
        for s in 0..SOURCES {
            first_run.replace_source(source(s)).await.unwrap();
        }
        let first =
            SearchProvider::start(first_run, SearchOptions::new(store.0.clone())).await.unwrap();
        until("every tool indexed", || first.handle().indexed() == PER_SOURCE * SOURCES).await;
        first.stop(Duration::from_secs(1)).await;

        let registry = registry().await;
        let writes = Writes::over(store.0.clone());
        let second = SearchProvider::start(registry.clone(), SearchOptions::new(writes.clone()))
            .await
            .unwrap();
        for s in 0..SOURCES {
            registry.replace_source(source(s)).await.unwrap();
            until("the source is indexed", || second.handle().indexed() == PER_SOURCE * (s + 1))
                .await;
        }
        assert_eq!(writes.listings.load(Ordering::SeqCst), 1, "one listing for all sources");
        assert_eq!(writes.points.load(Ordering::SeqCst), 0, "the store held every point");
        second.stop(Duration::from_secs(1)).await;
    }

    /// A supervisor that does nothing.
    struct Idle;

    impl Actor for Idle {
        type Msg = ();
        type State = ();
        type Arguments = ();

        async fn pre_start(&self, _: ActorRef<()>, _: ()) -> Result<(), ActorProcessingErr> {
            Ok(())
        }

        async fn handle_supervisor_evt(
            &self,
            _: ActorRef<()>,
            _: SupervisionEvent,
            _: &mut (),
        ) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
    }
}
