use toolmesh_core::ErrorCode;

/// Why a registry operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The tool's name is not a valid function name.
    #[error(transparent)]
    InvalidName(#[from] toolmesh_core::InvalidToolName),
    /// The tool's input or output schema is not a valid JSON Schema.
    #[error("tool {tool}: invalid {which} schema: {reason}")]
    InvalidSchema {
        /// The tool.
        tool: String,
        /// `input` or `output`.
        which: &'static str,
        /// What the schema compiler said.
        reason: String,
    },
    /// The tool's definition is larger than a definition may be.
    #[error(
        "tool {tool}: its definition is {bytes} bytes, more than the {limit} a definition may \
         have (description, title, tags and schemas)"
    )]
    TooLarge {
        /// The tool.
        tool: String,
        /// Its definition's size.
        bytes: usize,
        /// The bound.
        limit: usize,
    },
    /// Some of a toolkit's tools already exist; the toolkit was not registered.
    #[error("toolkit {toolkit} rejected: tools {tools:?} already exist")]
    ToolkitCollision {
        /// The rejected toolkit.
        toolkit: String,
        /// Its tools whose names are taken, with the owner of each name.
        tools: Vec<String>,
    },
    /// A toolkit of that name exists.
    #[error("toolkit {0} already exists")]
    ToolkitExists(String),
    /// A tool was given to a toolkit while it belongs to another toolkit.
    #[error("toolkits cannot nest: tool {tool} already belongs to toolkit {toolkit}")]
    Nested {
        /// The tool.
        tool: String,
        /// The toolkit it belongs to.
        toolkit: String,
    },
    /// A standalone tool would replace a member of a toolkit.
    #[error("tool {tool} belongs to toolkit {toolkit}; a standalone tool cannot replace it")]
    MemberOfToolkit {
        /// The tool.
        tool: String,
        /// Its toolkit.
        toolkit: String,
    },
    /// The same name appears twice in one request.
    #[error("tool {0} appears twice in one registration")]
    Duplicate(String),
    /// The registry did not answer in time.
    #[error("registry did not answer in time")]
    Timeout,
    /// The registry actor is gone.
    #[error("registry is unavailable")]
    Unavailable,
}

impl RegistryError {
    /// Returns the error's code.
    pub fn code(&self) -> ErrorCode {
        match self {
            RegistryError::InvalidName(_)
            | RegistryError::InvalidSchema { .. }
            | RegistryError::TooLarge { .. }
            | RegistryError::ToolkitCollision { .. }
            | RegistryError::ToolkitExists(_)
            | RegistryError::Nested { .. }
            | RegistryError::MemberOfToolkit { .. }
            | RegistryError::Duplicate(_) => ErrorCode::InvalidArgument,
            RegistryError::Timeout | RegistryError::Unavailable => ErrorCode::Unavailable,
        }
    }
}
