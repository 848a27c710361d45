//! The catalog of tools and toolkits.
//!
//! [`RegistryActor`] applies every write (register a tool, a toolkit, replace all tools of a
//! source) and then publishes an immutable [`Catalog`] snapshot. The hot path reads that
//! snapshot through [`RegistryHandle::snapshot`] without a mailbox round trip. Each
//! [`ToolEntry`] carries the tool's definition, its compiled argument and output
//! validators, and the [`Backend`](toolmesh_core::Backend) that runs it.
//!
//! Rules the actor enforces:
//! - a standalone tool registered under a taken standalone name replaces it (with a
//!   warning);
//! - a toolkit is atomic: if any of its tools collides with an existing tool, the whole
//!   toolkit is rejected and nothing changes;
//! - toolkits do not nest: a tool belongs to at most one toolkit;
//! - what the operator states about a tool ([`Overrides`]: name, title, description,
//!   annotations, hidden) replaces what its source says, as the tool joins; a toolkit the
//!   operator declares gathers the tools it selects that are in no other toolkit;
//! - a source's own toolkit (an MCP server's) takes the source's standalone tools that no
//!   declared toolkit took.

mod actor;
mod catalog;
mod entry;
mod error;
mod handle;
mod messages;
mod overrides;
mod state;

pub use actor::RegistryActor;
pub use catalog::{Catalog, CatalogChange, PublishedCatalog};
pub use entry::{MAX_DEFINITION_BYTES, SchemaViolation, ToolEntry};
pub use error::RegistryError;
pub use handle::RegistryHandle;
pub use messages::{Registered, RegistryMsg, SourceUpdate};
pub use overrides::{Overrides, ToolOverride, ToolkitOverride};
pub use state::RegistryState;
