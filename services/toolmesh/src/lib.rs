//! The `toolmesh` binary's library: it assembles the backends into one process and serves
//! them.
//!
//! - [`built_in`] is the one list of built-in backends, each a [`Plugin`]: local tools on
//!   the worker pool, MCP servers, the vector stores, the tool-search index, knowledge
//!   collections, remote workers. [`App`] assembles those and any an embedding program adds
//!   ([`AppOptions`]) through the same seam: their configuration sections are checked,
//!   their actors linked under the root supervisor, their gRPC services served, their
//!   providers started, reloaded and stopped, and every provider's health published (gRPC
//!   health `toolmesh.<kind>.<name>`, `ListTools`, `toolmesh.source.up`).
//! - [`api`] is the API layer: the gRPC services over the router, the meta-tools and the
//!   plug-ins' services, with health and reflection.
//! - [`serve`] runs the API through the front door ([`FrontDoor`]) until a shutdown signal,
//!   then shuts down in order: stop accepting, drain the calls in flight within the grace
//!   period, stop the providers; the caller's telemetry guard flushes last. The transport
//!   is bounded: [`Listener`] caps connections, closes those that never finish their HTTP/2
//!   handshake and those left idle, caps the connections of one client address, and backs
//!   off when out of descriptors; [`TrackCallsLayer`] counts each connection's calls and
//!   bounds health watches; [`MessageLimitLayer`] refuses oversized messages at their
//!   header; [`AuthLayer`] answers `UNAUTHENTICATED` to a request without an accepted
//!   credential (`[auth]`; health and reflection stay public, though a provider's health
//!   entries are answered to authenticated callers only) and hands the others' principal
//!   to the services. With `[tls]` ([`tls`]) the listener speaks TLS, and mutual TLS with a
//!   client CA: a client certificate names a principal.
//!
//! The actors, one supervision tree:
//!
//! ```text
//! RootSupervisor       restarts a child that ends unasked (at most 5 times a minute);
//!  │                   toolmesh.actor.<child> health shows the gap and the restarts
//!  ├── RegistryActor          resumes from the last published catalog
//!  ├── WorkerPoolActor        a fresh set of workers
//!  │    └── WorkerActor × N   (the pool replaces one that dies)
//!  ├── McpSupervisorActor     starts the configured servers again
//!  │    └── McpClientActor × servers (the MCP supervisor restarts one that fails)
//!  ├── ToolSearchActor        indexes the catalog again; search health is down until then
//!  ├── RetrieverActor         takes the next ingestion; the collections live on
//!  ├── … a plug-in's own actors
//!  └── RouterActor            the front door: serves gRPC, holds the routing profiles in
//!                             force (a reload goes through it), drains the calls in
//!                             flight; a fresh one takes over the running server. Each
//!                             call runs in its own task, never behind this mailbox
//! ```
//!
//! - [`client`] backs the `toolmesh tools list` and `toolmesh call` commands, [`ingest`]
//!   the `toolmesh ingest` command, [`worker`] the `toolmesh worker` process (the worker's
//!   side of the protocol is `toolmesh_remote::host`).
//!
//! Reading order for a newcomer: `proto/toolmesh/v1/tools.proto`, then [`built_in`] (what
//! runs), `crates/router` (the call path), then `crates/workers` (one backend).

pub mod api;
mod app;
mod auth;
mod builtin;
pub mod client;
mod front;
pub mod ingest;
mod listener;
pub mod metrics;
mod plugin;
mod server;
mod supervisor;
pub mod tls;
mod transport;
pub mod worker;

pub use app::{App, AppOptions, check_sections, default_config, sections, serve};
pub use auth::{AuthLayer, Authenticate, Sessions, authenticator, recheck, refusal};
pub use builtin::built_in;
pub use front::{FrontDoor, FrontDoorError, RouterActor, RouterMsg, RouterState};
pub use listener::{ConnectionInfo, ConnectionLimits, Listener, TrackCallsLayer};
pub use plugin::{Assembly, GrpcService, Parts, Plugin, Serving};
pub use server::{MCP_HEALTH_PREFIX, PROVIDER_HEALTH_PREFIX, SEARCH_EMBEDDINGS_HEALTH};
pub use supervisor::Children;
pub use transport::{LimitedBody, MessageLimit, MessageLimitLayer};
