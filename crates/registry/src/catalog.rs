use std::{collections::BTreeMap, sync::Arc};

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
