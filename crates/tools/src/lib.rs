//! toolmesh's built-in local tools, all run on the [`WorkerPool`](toolmesh_workers::WorkerPool):
//!
//! - the reasoning toolkit ([`reasoning_toolkit`]): `think` and `analyze`;
//! - [`EchoTool`]: returns its arguments;
//! - [`HttpTool`]: one HTTP request per call, defined in configuration, with an SSRF guard;
//! - [`CommandTool`]: an executable run with the JSON arguments on stdin, defined in
//!   configuration, its process group killed on timeout or cancellation.
//!
//! [`config_tools`] builds the HTTP and command tools of a configuration, and
//! [`LocalProvider`] publishes them all: the local tools' provider.

mod addresses;
mod command;
mod config;
mod echo;
mod http;
mod provider;
mod reasoning;
mod template;

use std::sync::Arc;

pub use command::CommandTool;
pub use config::{
    BuiltinConfig, CommandToolConfig, HttpMethod, HttpToolConfig, ToolCommon, ToolsConfig,
};
pub use echo::EchoTool;
pub use http::{HttpTool, HttpToolError};
pub use provider::{EMBEDDED_SOURCE, LocalProvider, LocalTools, LocalToolsError};
pub use reasoning::{AnalyzeTool, REASONING_INSTRUCTIONS, ThinkTool, reasoning_toolkit};

use toolmesh_workers::{LocalToolInstall, ToolLimits};

/// Name of the source of configured tools.
pub const CONFIG_SOURCE: &str = "config";
/// Name of the source of built-in tools.
pub const BUILTIN_SOURCE: &str = "builtin";

/// Builds the HTTP and command tools of `config`.
pub fn config_tools(config: &ToolsConfig) -> Result<Vec<LocalToolInstall>, HttpToolError> {
    let mut tools: Vec<LocalToolInstall> = Vec::new();
    for http in &config.http {
        let limits = ToolLimits { max_concurrency: http.common.max_concurrency, max_queue: 0 };
        tools.push((Arc::new(HttpTool::new(http.clone())?), limits));
    }
    for command in &config.command {
        let limits = ToolLimits { max_concurrency: command.common.max_concurrency, max_queue: 0 };
        tools.push((Arc::new(CommandTool::new(command.clone())), limits));
    }
    Ok(tools)
}
