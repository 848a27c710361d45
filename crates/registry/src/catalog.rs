use std::{collections::BTreeMap, ops::Bound, sync::Arc};

use arc_swap::ArcSwap;
use imbl::{OrdMap, OrdSet, ordmap::DiffItem};
use tokio::sync::watch;

use toolmesh_core::{ToolSource, Toolkit};

use crate::ToolEntry;

/// An immutable snapshot of the catalog. Readers hold an `Arc<Catalog>` for as long as they
/// need a consistent view; writers publish a new one.
///
/// The tools are kept in a persistent map: a new version shares every part of the tree
/// its change did not touch with the version before it, so publishing one changed tool of
/// 100,000 copies a few nodes rather than the catalog, freeing the old version frees as
/// little, and [`Catalog::changes_since`] finds what changed without looking at the rest.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    /// Tools by name, ordered (so listing pages by name is stable). A name is shared, not
    /// copied: a new version copies the tree nodes its change touched, and with shared
    /// names copying (and later freeing) a node's keys is a reference count each rather
    /// than an allocation, which matters when a source's tools are spread over the whole
    /// tree.
    tools: OrdMap<Arc<str>, Published>,
    /// The names of each source's tools, so that replacing a source's tools looks at
    /// those only.
    by_source: OrdMap<ToolSource, OrdSet<Arc<str>>>,
    /// Toolkits by name, as listed: a source's, with what the operator states over it, or
    /// one `[[catalog.toolkits]]` declares. Their tools are [`Catalog::members`].
    pub toolkits: BTreeMap<String, Arc<Toolkit>>,
    /// The names of each toolkit's tools.
    by_toolkit: OrdMap<String, OrdSet<Arc<str>>>,
    /// The toolkits sources registered, as registered, by name.
    pub(crate) registered: BTreeMap<String, RegisteredKit>,
    /// What the operator states about tools, applied to each as it joins.
    pub overrides: Arc<crate::Overrides>,
    /// Increases with every published change.
    pub version: u64,
}

/// A toolkit a source registered.
#[derive(Debug, Clone)]
pub(crate) struct RegisteredKit {
    /// The source it belongs to.
    pub(crate) source: ToolSource,
    /// As the source gave it (the operator's statements are laid over it when listed).
    pub(crate) toolkit: Arc<Toolkit>,
    /// Whether its tools were registered with it, all or nothing, rather than joining it
    /// one by one as the source's standalone tools do (an MCP server's toolkit).
    pub(crate) whole: bool,
}

/// A tool's entry as the catalog holds it. Two are equal only when they are the same entry:
/// the registry builds a new entry whenever anything of a tool changes, and keeps the
/// entry of a tool that did not.
#[derive(Debug, Clone)]
struct Published(Arc<ToolEntry>);

impl PartialEq for Published {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// How one tool differs between two versions of the catalog.
#[derive(Debug, Clone, Copy)]
pub enum CatalogChange<'a> {
    /// A tool the older version did not have, or whose entry is new.
    Upserted(&'a str, &'a Arc<ToolEntry>),
    /// A tool the newer version no longer has.
    Removed(&'a str),
}

impl Catalog {
    /// Returns the tool named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<ToolEntry>> {
        self.tools.get(name).map(|p| &p.0)
    }

    /// Returns whether a tool is named `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.tools.contains_key(name)
    }

    /// Returns how many tools the catalog holds.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Returns whether the catalog holds no tool.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Returns the tools in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<ToolEntry>)> {
        self.after(None)
    }

    /// Returns the tools named after `after` (all of them without it), in name order.
    pub fn after(&self, after: Option<&str>) -> impl Iterator<Item = (&str, &Arc<ToolEntry>)> {
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.tools.range::<_, str>((start, Bound::Unbounded)).map(|(name, p)| (&**name, &p.0))
    }

    /// Returns the tools whose entry differs between `older` and this version: new and
    /// replaced ones, and removed ones. The parts of the catalog the two versions share are
    /// skipped unvisited, so one change costs about the same in a catalog of any size.
    pub fn changes_since<'a>(
        &'a self,
        older: &'a Catalog,
    ) -> impl Iterator<Item = CatalogChange<'a>> {
        older.tools.diff(&self.tools).map(|item| match item {
            DiffItem::Add(name, p) | DiffItem::Update { new: (name, p), .. } => {
                CatalogChange::Upserted(name, &p.0)
            }
            DiffItem::Remove(name, _) => CatalogChange::Removed(name),
        })
    }

    /// Returns the names of the tools in the toolkit `toolkit`: in the order its source
    /// registered them with it, or in name order for tools that joined it one by one.
    pub fn members(&self, toolkit: &str) -> Box<dyn Iterator<Item = &str> + '_> {
        let joined = self.by_toolkit.get(toolkit).into_iter().flat_map(|names| names.iter());
        let joined = joined.map(|name| &**name);
        match self.registered.get(toolkit).filter(|kit| kit.whole) {
            Some(kit) => {
                let own = &kit.toolkit.tools;
                let registered = own.iter().map(String::as_str).filter(|name| self.contains(name));
                // Tools a `[[catalog.toolkits]]` of its name added, after its own.
                Box::new(registered.chain(joined.filter(|name| !own.iter().any(|o| o == name))))
            }
            None => Box::new(joined),
        }
    }

    /// Returns whether the tool `entry` is a member of a toolkit registered with its tools,
    /// which no other tool may replace.
    pub(crate) fn in_whole_toolkit(&self, entry: &ToolEntry) -> Option<&str> {
        let toolkit = entry.spec.toolkit.as_deref()?;
        let (name, kit) = self.registered.get_key_value(toolkit)?;
        kit.whole.then_some(name.as_str())
    }

    /// Returns the names of the tools of `source`.
    pub(crate) fn names_of(&self, source: &ToolSource) -> Option<&OrdSet<Arc<str>>> {
        self.by_source.get(source)
    }

    /// Inserts or replaces the tool named `name`, returning the entry it replaced.
    pub(crate) fn insert(
        &mut self,
        name: Arc<str>,
        entry: Arc<ToolEntry>,
    ) -> Option<Arc<ToolEntry>> {
        let source = entry.spec.source.clone();
        let toolkit = entry.spec.toolkit.clone();
        self.by_source.entry(source.clone()).or_default().insert(name.clone());
        if let Some(toolkit) = &toolkit {
            self.by_toolkit.entry(toolkit.clone()).or_default().insert(name.clone());
        }
        let previous = self.tools.insert(name.clone(), Published(entry)).map(|p| p.0)?;
        if previous.spec.source != source {
            self.forget(&previous.spec.source, &name);
        }
        if let Some(was) =
            previous.spec.toolkit.as_ref().filter(|was| Some(*was) != toolkit.as_ref())
        {
            self.leave(was, &name);
        }
        Some(previous)
    }

    /// Removes the tool named `name`, returning its entry.
    pub(crate) fn remove(&mut self, name: &str) -> Option<Arc<ToolEntry>> {
        let removed = self.tools.remove(name).map(|p| p.0)?;
        self.forget(&removed.spec.source, name);
        if let Some(toolkit) = &removed.spec.toolkit {
            self.leave(toolkit, name);
        }
        Some(removed)
    }

    fn forget(&mut self, source: &ToolSource, name: &str) {
        if let Some(names) = self.by_source.get_mut(source) {
            names.remove(name);
            if names.is_empty() {
                self.by_source.remove(source);
            }
        }
    }

    fn leave(&mut self, toolkit: &str, name: &str) {
        if let Some(names) = self.by_toolkit.get_mut(toolkit) {
            names.remove(name);
            if names.is_empty() {
                self.by_toolkit.remove(toolkit);
            }
        }
    }

    /// Lists the toolkit `name` as what its source registered with what the operator
    /// states over it, or as the operator declares it, or not at all.
    pub(crate) fn relist_toolkit(&mut self, name: &str) {
        let listed = match self.registered.get(name) {
            Some(kit) => Some(self.overrides.toolkit_over(Toolkit::clone(&kit.toolkit))),
            None => self.overrides.toolkit(name).map(|stated| Toolkit {
                name: stated.name.clone(),
                description: stated.description.clone().unwrap_or_default(),
                instructions: stated.instructions.clone().unwrap_or_default(),
                tools: vec![],
            }),
        };
        match listed {
            Some(toolkit) => self.toolkits.insert(name.to_owned(), Arc::new(toolkit)),
            None => self.toolkits.remove(name),
        };
    }
}

/// Where the registry publishes: the current snapshot, read without locks, and its version,
/// which subscribers can wait on.
#[derive(Debug)]
pub struct PublishedCatalog {
    current: ArcSwap<Catalog>,
    version: watch::Sender<u64>,
}

impl Default for PublishedCatalog {
    fn default() -> Self {
        PublishedCatalog {
            current: ArcSwap::from_pointee(Catalog::default()),
            version: watch::channel(0).0,
        }
    }
}

impl PublishedCatalog {
    /// Returns the current snapshot.
    pub fn load(&self) -> Arc<Catalog> {
        self.current.load_full()
    }

    /// Returns the tool named `name` in the current snapshot.
    pub fn get(&self, name: &str) -> Option<Arc<crate::ToolEntry>> {
        self.current.load().get(name).cloned()
    }

    /// Publishes `catalog` and tells subscribers.
    pub fn store(&self, catalog: Arc<Catalog>) {
        let version = catalog.version;
        self.current.store(catalog);
        self.version.send_replace(version);
    }

    /// Returns a receiver that sees every newly published version.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }
}
