use std::{collections::BTreeMap, sync::Arc, time::Duration};

use tokio::sync::watch;

use crate::ToolSource;

/// A source of tools with a lifecycle: the local worker pool, the MCP servers, the search
/// index; later remote worker pools and knowledge collections. Beside [`Backend`]
/// (one call), it is the one seam a new backend implements: the binary starts every
/// provider, reloads and watches them alike, and stops them in order, knowing none by name.
///
/// `C` is the whole configuration; each provider reads its own section of it.
///
/// [`Backend`]: crate::Backend
#[async_trait::async_trait]
pub trait Provider<C: Sync + ?Sized>: Send + Sync + 'static {
    /// The kind, as in health names `toolmesh.<kind>.<name>` and the `toolmesh.source.up`
    /// metric: `local`, `mcp`, `search`.
    fn kind(&self) -> &'static str;

    /// Starts serving `config`: registers the provider's tools in the catalog.
    async fn start(&self, config: &C) -> Result<(), ProviderError>;

    /// Applies `config`, of which the provider's section may have changed; what did not
    /// change is left alone.
    async fn reload(&self, config: &C) -> Result<(), ProviderError>;

    /// Returns the health of each named part (a server, the pool, the model).
    fn health(&self) -> Vec<(String, Health)>;

    /// Resolves when [`Provider::health`] may have changed since it was last read.
    async fn health_changed(&self);

    /// Stops: new calls are refused, calls in flight get up to `grace` to finish, then
    /// everything the provider started (processes, connections, tasks) ends.
    async fn stop(&self, grace: Duration);
}

/// Why a provider could not start or apply its configuration.
#[derive(Debug, thiserror::Error)]
#[error("{kind}: {source}")]
pub struct ProviderError {
    /// The provider's kind.
    pub kind: &'static str,
    /// What went wrong.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl ProviderError {
    /// Returns the error of provider `kind`.
    pub fn new(
        kind: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ProviderError { kind, source: source.into() }
    }
}

/// The health of one part of a provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// Calls can reach it now (an idle server that connects on the next call counts).
    pub up: bool,
    /// What it is doing or why it is down; empty when there is nothing to say.
    pub status: String,
}

impl Health {
    /// Up, with nothing to say.
    pub fn up() -> Self {
        Health { up: true, status: String::new() }
    }

    /// Down, for `reason`.
    pub fn down(reason: impl Into<String>) -> Self {
        Health { up: false, status: reason.into() }
    }
}

/// Every provider's health by kind and name, as last published: what `ListTools` shows
/// of a tool's source. Cheap to clone; readers never wait.
#[derive(Debug, Clone)]
pub struct HealthBoard {
    current: watch::Sender<Arc<BTreeMap<(String, String), Health>>>,
}

impl Default for HealthBoard {
    fn default() -> Self {
        HealthBoard { current: watch::Sender::new(Arc::default()) }
    }
}

impl HealthBoard {
    /// Replaces the whole board.
    pub fn publish(&self, entries: BTreeMap<(String, String), Health>) {
        self.current.send_replace(Arc::new(entries));
    }

    /// Returns the health of part `name` of provider `kind`, if it reports one.
    pub fn get(&self, kind: &str, name: &str) -> Option<Health> {
        self.current.borrow().get(&(kind.to_owned(), name.to_owned())).cloned()
    }

    /// Returns the health of the tools of `source`: that of the provider part of the same
    /// kind and name, up when there is none (a local source, the meta-tools).
    pub fn of(&self, source: &ToolSource) -> Health {
        self.get(source.kind.as_str(), &source.name).unwrap_or_else(Health::up)
    }

    /// Returns a receiver that sees each publication.
    pub fn subscribe(&self) -> watch::Receiver<Arc<BTreeMap<(String, String), Health>>> {
        self.current.subscribe()
    }

    /// Returns the whole board.
    pub fn snapshot(&self) -> Arc<BTreeMap<(String, String), Health>> {
        self.current.borrow().clone()
    }
}
