use std::{collections::BTreeMap, sync::Arc};

use arc_swap::ArcSwap;
use tokio::sync::watch;

use toolmesh_core::Toolkit;

use crate::ToolEntry;

/// An immutable snapshot of the catalog. Readers hold an `Arc<Catalog>` for as long as they
/// need a consistent view; writers publish a new one.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    /// Tools by name, ordered (so listing pages by name is stable).
    pub tools: BTreeMap<String, Arc<ToolEntry>>,
    /// Toolkits by name.
    pub toolkits: BTreeMap<String, Arc<Toolkit>>,
    /// Increases with every published change.
    pub version: u64,
}

impl Catalog {
    /// Returns the tool named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<ToolEntry>> {
        self.tools.get(name)
    }
}

/// Where the registry publishes: the current snapshot, read without locks, and its version,
/// which subscribers can wait on.
#[derive(Debug)]
pub struct PublishedCatalog {
    current: ArcSwap<Catalog>,
    version: watch::Sender<u64>,
}

impl Default for PublishedCatalog {
    fn default() -> Self {
        PublishedCatalog {
            current: ArcSwap::from_pointee(Catalog::default()),
            version: watch::channel(0).0,
        }
    }
}

impl PublishedCatalog {
    /// Returns the current snapshot.
    pub fn load(&self) -> Arc<Catalog> {
        self.current.load_full()
    }

    /// Returns the tool named `name` in the current snapshot.
    pub fn get(&self, name: &str) -> Option<Arc<crate::ToolEntry>> {
        self.current.load().get(name).cloned()
    }

    /// Publishes `catalog` and tells subscribers.
    pub fn store(&self, catalog: Arc<Catalog>) {
        let version = catalog.version;
        self.current.store(catalog);
        self.version.send_replace(version);
    }

    /// Returns a receiver that sees every newly published version.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }
}
