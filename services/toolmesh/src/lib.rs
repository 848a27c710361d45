//! The `toolmesh` binary's library: it wires the components into one process.
//!
//! - [`App`] starts the registry, the providers of tools (local tools on the worker pool,
//!   MCP servers, the search index, and any an embedding program adds), the meta-tools and
//!   the front door; it reloads and stops them alike, and publishes every provider's
//!   health (gRPC health `toolmesh.<kind>.<name>`, `ListTools`, `toolmesh.source.up`).
//! - [`serve`] runs the gRPC API (`toolmesh.v1.ToolService`, `KnowledgeService`,
//!   `WorkerService` where remote workers connect, `grpc.health.v1.Health`,
//!   server reflection v1 and v1alpha) through the [`RouterActor`] until a shutdown signal,
//!   then shuts down in order: stop accepting, drain the calls in flight within the grace
//!   period, stop the providers; the caller's telemetry guard flushes last. The front door
//!   is bounded: [`Listener`] caps connections, closes those that never finish their HTTP/2
//!   handshake and those left idle, caps the connections of one client address, and backs
//!   off when out of descriptors; [`TrackCallsLayer`] counts each connection's calls and
//!   bounds health watches; [`MessageLimitLayer`] refuses oversized messages at their
//!   header; [`AuthLayer`] answers `UNAUTHENTICATED` to a request without an accepted
//!   credential (`[auth]`; health and reflection stay public, though a provider's health
//!   entries are answered to authenticated callers only) and hands the others' principal
//!   to the services. With `[tls]` ([`tls`]) the listener
//!   speaks TLS, and mutual TLS with a client CA: a client certificate names a principal.
//!
//! The actors:
//!
//! ```text
//! RouterActor          the front door: serves gRPC, holds the routing profiles in force
//!                      (a reload goes through it), drains the calls in flight; each call
//!                      runs in its own task, never behind this mailbox
//! RootSupervisor       restarts a child that ends unasked (at most 5 times a minute);
//!  │                   toolmesh.actor.<child> health shows the gap and the restarts
//!  ├── RegistryActor          resumes from the last published catalog
//!  ├── WorkerPoolActor        a fresh set of workers
//!  │    └── WorkerActor × N   (the pool replaces one that dies)
//!  ├── McpSupervisorActor     starts the configured servers again
//!  │    └── McpClientActor × servers (the MCP supervisor restarts one that fails)
//!  └── ToolSearchActor        indexes the catalog again; search health is down until then
//! ```
//!
//! - [`client`] backs the `toolmesh tools list` and `toolmesh call` commands, [`ingest`]
//!   the `toolmesh ingest` command, [`worker`] the `toolmesh worker` process.
//!
//! Reading order for a newcomer: `proto/toolmesh/v1/tools.proto`, then
//! `crates/router` (the call path), then `crates/workers` (one backend).

mod app;
mod auth;
pub mod client;
mod front;
mod health;
pub mod ingest;
mod knowledge;
mod listener;
mod server;
mod supervisor;
pub mod tls;
mod transport;
pub mod worker;

pub use app::{App, AppOptions, ProviderFactory, SECTIONS, check_sections};
pub use auth::{AuthLayer, Authenticate, Sessions, authenticator, recheck, refusal};
pub use front::{FrontDoor, FrontDoorError, RouterActor, RouterMsg, RouterState};
pub use listener::{ConnectionInfo, ConnectionLimits, Listener, TrackCallsLayer};
pub use server::{MCP_HEALTH_PREFIX, PROVIDER_HEALTH_PREFIX, SEARCH_EMBEDDINGS_HEALTH, serve};
pub use supervisor::Children;
pub use transport::{LimitedBody, MessageLimit, MessageLimitLayer};
