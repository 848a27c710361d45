//! toolmesh's vector stores: Qdrant's engine in-process ([`EmbeddedStore`], the default,
//! persisted under the data directory) or a Qdrant server ([`ServerStore`], shared by
//! router replicas), both behind [`toolmesh_core::VectorStore`].
//!
//! This is the only crate that links the engine (`qdrant-edge`): everything else holds an
//! `Arc<dyn VectorStore>` of the [`VectorStores`] that [`open_all`] opens from the `[vector]`
//! section.

mod embedded;
mod filter;
mod provider;
mod server;

use std::{collections::BTreeMap, path::Path, sync::Arc, time::Duration};

use serde::Deserialize;
use toolmesh_core::{StoreError, VectorStore, VectorStores};
use tracing::warn;

pub use embedded::EmbeddedStore;
pub use provider::VectorProvider;
pub use server::{ServerStore, Timeouts};

/// The name of the configuration section this crate reads.
pub const SECTION: &str = "vector";

/// `[vector]`: where vectors are kept.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VectorConfig {
    /// `embedded` (Qdrant's engine in this process) or `qdrant` (a server).
    pub backend: BackendKind,
    /// The server's gRPC address, for `backend = "qdrant"`, for example
    /// `http://qdrant:6334`.
    pub url: Option<String>,
    /// The environment variable that holds the server's API key, if it needs one.
    pub api_key_env: String,
    /// How long one read (a search, a lookup) of the server may take, in milliseconds.
    pub timeout_ms: u64,
    /// How long one write (up to a thousand points, acknowledged once the server has them)
    /// may take, in milliseconds. Writes come in bulk when a catalog is first indexed, and
    /// a server busy indexing answers them slower than reads.
    pub write_timeout_ms: u64,
    /// For `backend = "embedded"`: the MiB the store keeps free on its disk. Below that it
    /// refuses writes (`RESOURCE_EXHAUSTED`, naming the disk), its health entry goes
    /// NOT_SERVING, and reads go on; writes resume once space is freed.
    pub min_free_mb: u64,
    /// `[vector.stores.NAME]`: more stores, each with the keys above, that knowledge
    /// collections may choose by name (`store = "NAME"`); the one above is `default`.
    pub stores: BTreeMap<String, VectorConfig>,
}

impl Default for VectorConfig {
    fn default() -> Self {
        VectorConfig {
            backend: BackendKind::Embedded,
            url: None,
            api_key_env: "QDRANT_API_KEY".into(),
            timeout_ms: 2_000,
            write_timeout_ms: 30_000,
            min_free_mb: embedded::DEFAULT_MIN_FREE_MB,
            stores: BTreeMap::new(),
        }
    }
}

/// `vector.backend`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Qdrant's engine in-process.
    #[default]
    Embedded,
    /// A Qdrant server.
    Qdrant,
}

impl toolmesh_config::Section for VectorConfig {
    const NAME: &'static str = SECTION;
    const DEFAULTS: &'static str = include_str!("default.toml");

    fn read(
        value: toml::Value,
        cx: &toolmesh_config::Reading<'_>,
    ) -> Result<Self, toolmesh_config::ConfigError> {
        cx.deserialize_checked(value, VectorConfig::validate)
    }
}

impl VectorConfig {
    /// The server's read and write deadlines, from `timeout_ms` and `write_timeout_ms`.
    pub fn timeouts(&self) -> Timeouts {
        Timeouts {
            read: Duration::from_millis(self.timeout_ms),
            write: Duration::from_millis(self.write_timeout_ms),
        }
    }

    /// Checks the section on its own: a server backend needs its address; a named store
    /// has a name that is not taken by the default store or a backend, and no stores of its
    /// own. The error names the key and what is wrong with it.
    pub fn validate(&self) -> Result<(), (String, String)> {
        self.validate_store(SECTION)?;
        for (name, store) in &self.stores {
            let at = format!("{SECTION}.stores.{name}");
            if name.is_empty()
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err((at, "a store's name is letters, digits, _ and - only".into()));
            }
            if [VectorStores::DEFAULT, "embedded", "qdrant"].contains(&name.as_str()) {
                return Err((at, format!("{name:?} names the default store or a backend")));
            }
            if !store.stores.is_empty() {
                return Err((format!("{at}.stores"), "a named store has no stores".into()));
            }
            store.validate_store(&at)?;
        }
        Ok(())
    }

    fn validate_store(&self, at: &str) -> Result<(), (String, String)> {
        match (self.backend, &self.url) {
            (BackendKind::Qdrant, None) => Err((
                format!("{at}.url"),
                "backend \"qdrant\" needs the server's gRPC address".into(),
            )),
            _ if self.timeout_ms == 0 => {
                Err((format!("{at}.timeout_ms"), "must be more than 0".into()))
            }
            _ if self.write_timeout_ms == 0 => {
                Err((format!("{at}.write_timeout_ms"), "must be more than 0".into()))
            }
            _ => Ok(()),
        }
    }
}

/// Opens the stores `config` names: the default one (an embedded one under
/// `data_dir/vector`) and each of `[vector.stores.NAME]` (an embedded one under
/// `data_dir/vector/stores/NAME`). A store that cannot be opened fails them all: the error
/// names it.
pub async fn open_all(config: &VectorConfig, data_dir: &Path) -> Result<VectorStores, StoreError> {
    let default = open(config, &data_dir.join("vector")).await?;
    let mut named = BTreeMap::new();
    for (name, store) in &config.stores {
        let dir = data_dir.join("vector").join("stores").join(name);
        named.insert(name.clone(), open(store, &dir).await?);
    }
    Ok(VectorStores::new(default, named))
}

/// Opens the one store `config` names (its `stores` aside); an embedded one in `dir`.
pub async fn open(config: &VectorConfig, dir: &Path) -> Result<Arc<dyn VectorStore>, StoreError> {
    match config.backend {
        BackendKind::Embedded => {
            Ok(Arc::new(EmbeddedStore::open_keeping(dir.to_owned(), config.min_free_mb).await?))
        }
        BackendKind::Qdrant => {
            let url = config.url.as_deref().unwrap_or_default();
            let api_key = std::env::var(&config.api_key_env).ok().filter(|k| !k.is_empty());
            let store = ServerStore::connect(url, api_key, config.timeouts())?;
            // A server too old for the store's queries is refused at start. One that does
            // not answer yet is not: the store reports it down until it does, and is
            // checked again then.
            match store.check().await {
                Err(error @ StoreError::Failed { .. }) => return Err(error),
                Err(error) => warn!(%error, "the vector store does not answer at start"),
                Ok(()) => {}
            }
            Ok(Arc::new(store))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_stores_are_checked_and_errors_name_the_key() {
        let server = |url: Option<&str>| VectorConfig {
            backend: BackendKind::Qdrant,
            url: url.map(str::to_owned),
            ..VectorConfig::default()
        };
        let with = |name: &str, store: VectorConfig| VectorConfig {
            stores: [(name.to_owned(), store)].into(),
            ..VectorConfig::default()
        };
        assert_eq!(with("shared", server(Some("http://q:6334"))).validate(), Ok(()));
        let error = |config: VectorConfig| config.validate().unwrap_err().0;
        assert_eq!(error(with("shared", server(None))), "vector.stores.shared.url");
        assert_eq!(error(with("default", VectorConfig::default())), "vector.stores.default");
        assert_eq!(error(with("qdrant", VectorConfig::default())), "vector.stores.qdrant");
        assert_eq!(error(with("a b", VectorConfig::default())), "vector.stores.a b");
        let nested = with("outer", with("inner", VectorConfig::default()));
        assert_eq!(error(nested), "vector.stores.outer.stores");
        assert_eq!(error(server(None)), "vector.url");
    }
}
