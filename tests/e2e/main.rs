//! toolmesh end to end: real servers on 127.0.0.1, real binaries, real MCP servers and
//! clients. One module per feature; shared helpers live in `tests/support`
//! (`toolmesh_e2e`).

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod auth;
mod bench;
mod cli;
mod clients;
mod config_tools;
mod conformance;
mod credentials;
mod deploy;
mod durability;
mod knowledge;
mod mcp;
mod mcp_endpoint;
mod plugins;
mod policy;
mod remote;
mod search;
mod server;
mod telemetry;
mod tls;
mod tools;
