//! `[workers]`: the pool of supervised workers that runs local tools.

use std::num::NonZeroUsize;

use serde::Deserialize;
use toolmesh_config::{ConfigError, Reading, Section};

/// `[workers]`.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkersConfig {
    /// Number of supervised workers.
    pub size: NonZeroUsize,
    /// Calls that may wait for a worker.
    pub queue: usize,
    /// The largest share of the workers and of the queue one tool may hold, in (0, 1].
    pub tool_share: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkers {
    size: NonZeroUsize,
    queue: usize,
    tool_share: f64,
}

impl Section for WorkersConfig {
    const NAME: &'static str = "workers";
    const DEFAULTS: &'static str = include_str!("default.toml");

    fn read(value: toml::Value, cx: &Reading<'_>) -> Result<Self, ConfigError> {
        let raw: RawWorkers = cx.deserialize(value)?;
        if !(raw.tool_share > 0.0 && raw.tool_share <= 1.0) {
            return Err(cx.key_error("workers.tool_share", "must be greater than 0 and at most 1"));
        }
        Ok(WorkersConfig { size: raw.size, queue: raw.queue, tool_share: raw.tool_share })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn the_file_overrides_the_defaults_and_the_environment_the_file() {
        let file = "[workers]\nsize = 3\n";
        let config = toolmesh_config::load_str(Some(("f.toml", file)), &HashMap::new()).unwrap();
        let workers = config.get::<WorkersConfig>().unwrap();
        assert_eq!(workers.size.get(), 3);
        assert_eq!(workers.queue, 256, "untouched keys keep their defaults");
        assert_eq!(workers.tool_share, 0.5);

        let env = HashMap::from([("TOOLMESH__WORKERS__SIZE".to_owned(), "5".to_owned())]);
        let config = toolmesh_config::load_str(Some(("f.toml", file)), &env).unwrap();
        assert_eq!(config.get::<WorkersConfig>().unwrap().size.get(), 5);

        let config =
            toolmesh_config::load_str(Some(("f.toml", "[workers]\ntool_share = 0\n")), &env)
                .unwrap();
        let err = config.get::<WorkersConfig>().unwrap_err().to_string();
        assert!(err.contains("f.toml") && err.contains("workers.tool_share"), "{err}");
        let config =
            toolmesh_config::load_str(Some(("f.toml", "[workers]\nsise = 1\n")), &env).unwrap();
        let err = config.get::<WorkersConfig>().unwrap_err().to_string();
        assert!(err.contains("workers.sise") || err.contains("sise"), "{err}");
    }
}
