/// A configuration that cannot be used. Its `Display` is one line naming the file, the
/// key and the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        reason: String,
    },
    /// The file is not valid TOML.
    #[error("{origin}: invalid TOML at line {line}: {reason}")]
    Syntax {
        /// The file (or `defaults`, `environment`).
        origin: String,
        /// 1-based line of the error.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A key has a wrong type or value, or is unknown.
    #[error("{origin}: key `{key}`: {reason}")]
    Key {
        /// The file (or `environment`).
        origin: String,
        /// The dotted key path, for example `tools.http[0].url`.
        key: String,
        /// What is wrong.
        reason: String,
    },
}
