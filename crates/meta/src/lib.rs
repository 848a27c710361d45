//! The meta-tools `searchTools` and `callTool`: what an agent sees when the catalog is too
//! large for its model's context.
//!
//! Both are ordinary catalog tools, called through `CallTool`, so an agent in any language
//! hands their schemas to its model and forwards the model's calls. `searchTools` finds the
//! tools that fit a task within the routing profile's pool and returns them with a signed
//! `searchToken`; `callTool` calls one of them. With `enforce_search_before_call`, `callTool`
//! accepts only a tool that the token's search returned in the same session: the check is
//! stateless, so replicas sharing the token key accept each other's searches.
//!
//! The crate sits above the router and the search index, below the API: the `SearchTools`
//! RPC searches through [`MetaTools::find`] (the one search flow, shared with
//! `searchTools`), `ListTools` describes `searchTools` with [`MetaTools::description_of`]
//! (computed when read), and `callTool` hands the entry it resolved to the router's
//! admission step and dispatch.

mod meta;
mod token;

pub use meta::{Found, Keep, MetaTools};
