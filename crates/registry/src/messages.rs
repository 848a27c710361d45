use ractor::RpcReplyPort;
use toolmesh_core::{ToolSource, Toolkit};

use crate::{RegistryError, ToolEntry};

/// What registering a standalone tool did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registered {
    /// The name was free.
    Added,
    /// `[[catalog.tools]]` hides the tool: it was not added.
    Hidden,
    /// A standalone tool of that name was replaced; it came from `previous`.
    Replaced {
        /// The source of the replaced tool.
        previous: ToolSource,
    },
}

/// The complete set of tools and toolkits one source offers; applied atomically.
#[derive(Debug, Clone)]
pub struct SourceUpdate {
    /// The source whose tools are replaced.
    pub source: ToolSource,
    /// Its standalone tools.
    pub tools: Vec<ToolEntry>,
    /// Its toolkits, each with its tools.
    pub toolkits: Vec<(Toolkit, Vec<ToolEntry>)>,
    /// The source's own toolkit (an MCP server's, with the server's instructions), which
    /// its standalone tools join unless a `[[catalog.toolkits]]` takes them; its `tools`
    /// are not read.
    pub toolkit: Option<Toolkit>,
    /// Standalone tools of this source to keep exactly as published (the same entry, so
    /// followers of the catalog can tell at once that they did not change), by name. A
    /// name that the catalog holds under no such tool is ignored.
    pub unchanged: Vec<String>,
}

/// Messages of the [`RegistryActor`](crate::RegistryActor).
#[derive(Debug)]
pub enum RegistryMsg {
    /// Adds a standalone tool, replacing a standalone tool of the same name.
    Register {
        /// The tool.
        tool: ToolEntry,
        /// What happened.
        reply: RpcReplyPort<Result<Registered, RegistryError>>,
    },
    /// Adds a toolkit and its tools, all or nothing.
    RegisterToolkit {
        /// The toolkit (its `tools` list is filled from `tools`).
        toolkit: Toolkit,
        /// Its tools.
        tools: Vec<ToolEntry>,
        /// Success, or why nothing changed.
        reply: RpcReplyPort<Result<(), RegistryError>>,
    },
    /// Sets what the operator states about tools, for the tools that join from now on.
    SetOverrides {
        /// The overrides.
        overrides: crate::Overrides,
        /// Done.
        reply: RpcReplyPort<Result<(), RegistryError>>,
    },
    /// Replaces every tool and toolkit of one source with a new set, all or nothing.
    ReplaceSource {
        /// The new set.
        update: SourceUpdate,
        /// Success, or why nothing changed.
        reply: RpcReplyPort<Result<(), RegistryError>>,
    },
}
