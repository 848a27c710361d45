//! toolmesh's vector stores: Qdrant's engine in-process ([`EmbeddedStore`], the default,
//! persisted under the data directory) or a Qdrant server ([`ServerStore`], shared by
//! router replicas), both behind [`toolmesh_core::VectorStore`].
//!
//! This is the only crate that links the engine (`qdrant-edge`): everything else holds an
//! `Arc<dyn VectorStore>` that [`open`] returns from the `[vector]` section.

mod embedded;
mod filter;
mod provider;
mod server;

use std::{path::Path, sync::Arc, time::Duration};

use serde::Deserialize;
use toolmesh_core::{StoreError, VectorStore};

pub use embedded::EmbeddedStore;
pub use provider::VectorProvider;
pub use server::ServerStore;

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
    /// How long one request to the server may take, in milliseconds.
    pub timeout_ms: u64,
}

impl Default for VectorConfig {
    fn default() -> Self {
        VectorConfig {
            backend: BackendKind::Embedded,
            url: None,
            api_key_env: "QDRANT_API_KEY".into(),
            timeout_ms: 2_000,
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

impl VectorConfig {
    /// Checks the section on its own: a server backend needs its address. The error names
    /// the key and what is wrong with it.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        match (self.backend, &self.url) {
            (BackendKind::Qdrant, None) => {
                Err(("vector.url", "backend \"qdrant\" needs the server's gRPC address".into()))
            }
            _ if self.timeout_ms == 0 => Err(("vector.timeout_ms", "must be more than 0".into())),
            _ => Ok(()),
        }
    }
}

/// Opens the store `config` names; the embedded one under `data_dir/vector`.
pub async fn open(
    config: &VectorConfig,
    data_dir: &Path,
) -> Result<Arc<dyn VectorStore>, StoreError> {
    match config.backend {
        BackendKind::Embedded => Ok(Arc::new(EmbeddedStore::open(data_dir.join("vector")).await?)),
        BackendKind::Qdrant => {
            let url = config.url.as_deref().unwrap_or_default();
            let api_key = std::env::var(&config.api_key_env).ok().filter(|k| !k.is_empty());
            let timeout = Duration::from_millis(config.timeout_ms);
            Ok(Arc::new(ServerStore::connect(url, api_key, timeout)?))
        }
    }
}
