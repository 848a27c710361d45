//! The backends built into toolmesh, each a [`Plugin`]: local tools on the worker pool,
//! MCP servers, the vector stores, the tool-search index, knowledge collections and remote
//! workers. [`built_in`] is the one list of them; a new backend is its crate and one line
//! there.

use std::sync::Arc;

use anyhow::Context as _;
use toolmesh_config::{Config, SectionDef};
use toolmesh_knowledge::{KnowledgeConfig, KnowledgeHandle, KnowledgeProvider, unknown_store};
use toolmesh_mcp::{McpConfig, McpManager};
use toolmesh_proto::v1::{
    knowledge_service_server::KnowledgeServiceServer, worker_service_server::WorkerServiceServer,
};
use toolmesh_remote::{RemoteConfig, RemoteWorkers, WorkerServiceImpl};
use toolmesh_search::{SearchConfig, SearchProvider};
use toolmesh_tools::{BuiltinConfig, LocalProvider, ToolsConfig};
use toolmesh_vector::{VectorConfig, VectorProvider};
use toolmesh_workers::WorkersConfig;
use tracing::info;

use crate::{
    api::KnowledgeServiceImpl,
    plugin::{Assembly, GrpcService, Parts, Plugin},
};

/// Every built-in backend, in start order (each may use what those before it share); they
/// stop in reverse.
pub fn built_in() -> Vec<Box<dyn Plugin>> {
    vec![
        Box::new(Local),
        Box::new(Mcp),
        Box::new(Vector),
        Box::new(Search),
        Box::new(Knowledge),
        Box::new(Remote),
    ]
}

/// Local tools (`[builtin]`, `[[tools.*]]`) on the supervised worker pool (`[workers]`).
struct Local;

#[async_trait::async_trait]
impl Plugin for Local {
    fn name(&self) -> &'static str {
        "local"
    }

    fn sections(&self) -> &'static [SectionDef] {
        const SECTIONS: [SectionDef; 3] = [
            SectionDef::of::<WorkersConfig>(),
            SectionDef::of::<BuiltinConfig>(),
            SectionDef::of::<ToolsConfig>(),
        ];
        &SECTIONS
    }

    async fn build(&self, assembly: &mut Assembly<'_>) -> anyhow::Result<Parts> {
        let embedded = assembly.local_tools.take().unwrap_or_default();
        let workers: WorkersConfig = assembly.config.get()?;
        let local =
            Arc::new(LocalProvider::new(&workers, assembly.registry.clone(), embedded).await?);
        let pool = local.pool().clone();
        assembly.handles.pool = Some(pool.clone());
        Ok(Parts::provider(local).actor("workers", Arc::new(pool)))
    }
}

/// MCP servers (`[[mcp.servers]]`), one supervised client each.
struct Mcp;

#[async_trait::async_trait]
impl Plugin for Mcp {
    fn name(&self) -> &'static str {
        "mcp"
    }

    fn sections(&self) -> &'static [SectionDef] {
        const SECTIONS: [SectionDef; 1] = [SectionDef::of::<McpConfig>()];
        &SECTIONS
    }

    async fn build(&self, assembly: &mut Assembly<'_>) -> anyhow::Result<Parts> {
        // MCP servers' last listings live beside the vector store, in the data directory.
        let remember_in = assembly.config.server.data_dir.as_ref().map(|dir| dir.join("mcp"));
        let mcp = McpManager::start(
            assembly.registry.clone(),
            remember_in,
            definition_audit(assembly.router.clone()),
        )
        .await
        .map_err(|e| anyhow::anyhow!("cannot start the mcp supervisor: {e}"))?;
        assembly.handles.mcp = Some(mcp.clone());
        Ok(Parts::provider(Arc::new(mcp.clone())).actor("mcp", Arc::new(mcp)))
    }
}

/// Writes a changed MCP tool definition to the audit log of the policy in force: event
/// `definition_change`, by the principal `toolmesh`, the action (`warn`, `block`,
/// `accept`) as the decision, `pin_definitions` as the rule, the digests in the note.
fn definition_audit(router: toolmesh_router::Router) -> toolmesh_mcp::DefinitionAudit {
    Arc::new(move |change: &toolmesh_mcp::DefinitionChange| {
        let admission = router.admission();
        let policy = admission.policy();
        if !policy.audit().is_on() {
            return;
        }
        let note = match change.was.as_str() {
            "" => format!(
                "server {:?}, tool {:?}: definition {}",
                change.server, change.tool, change.now
            ),
            was => format!(
                "server {:?}, tool {:?}: definition {was} changed to {}",
                change.server, change.tool, change.now
            ),
        };
        policy.audit().record(&toolmesh_policy::AuditEvent {
            event: "definition_change",
            principal: "toolmesh",
            principal_kind: "system",
            issuer: None,
            agent: None,
            tool: &change.published,
            call_id: "",
            decision: change.action,
            rule: "pin_definitions",
            hidden: None,
            outcome: if change.action == "block" { "withheld" } else { "served" },
            duration: std::time::Duration::ZERO,
            at: std::time::Instant::now(),
            trace_id: "",
            policy: policy.version(),
            note: Some(&note),
        });
    })
}

/// The vector stores (`[vector]`): the embedded engine under the data directory, or a
/// Qdrant server; the default one and each of `[vector.stores.NAME]`.
struct Vector;

#[async_trait::async_trait]
impl Plugin for Vector {
    fn name(&self) -> &'static str {
        "vector"
    }

    fn sections(&self) -> &'static [SectionDef] {
        const SECTIONS: [SectionDef; 1] = [SectionDef::of::<VectorConfig>()];
        &SECTIONS
    }

    async fn build(&self, assembly: &mut Assembly<'_>) -> anyhow::Result<Parts> {
        let vector: VectorConfig = assembly.config.get()?;
        let data_dir =
            assembly.config.server.data_dir.clone().context(
                "no data directory: set --data-dir, server.data_dir, XDG_DATA_HOME or HOME",
            )?;
        let stores = toolmesh_vector::open_all(&vector, &data_dir).await?;
        for (name, store) in stores.all() {
            let name = name.unwrap_or(toolmesh_core::VectorStores::DEFAULT);
            info!(name, store = %store.describe(), "vector store open");
        }
        assembly.stores = Some(stores.clone());
        Ok(Parts::provider(Arc::new(VectorProvider::new(stores))))
    }
}

/// The tool-search index (`[search]`), its vectors in the default store.
struct Search;

#[async_trait::async_trait]
impl Plugin for Search {
    fn name(&self) -> &'static str {
        "search"
    }

    fn sections(&self) -> &'static [SectionDef] {
        const SECTIONS: [SectionDef; 1] = [SectionDef::of::<SearchConfig>()];
        &SECTIONS
    }

    async fn build(&self, assembly: &mut Assembly<'_>) -> anyhow::Result<Parts> {
        let store = assembly.stores.as_ref().context("search needs the vector stores")?;
        let store = store.default_store().clone();
        let model = assembly.model().await;
        let section: SearchConfig = assembly.config.get()?;
        let search = Arc::new(
            SearchProvider::from_config(assembly.registry.clone(), &section, store, model).await?,
        );
        assembly.handles.search = Some(search.handle().clone());
        Ok(Parts::provider(search.clone()).actor("search", search))
    }
}

/// Knowledge collections (`[knowledge]`): retrieval as a tool, and the
/// `toolmesh.v1.KnowledgeService` that ingests into them.
struct Knowledge;

#[async_trait::async_trait]
impl Plugin for Knowledge {
    fn name(&self) -> &'static str {
        "knowledge"
    }

    fn sections(&self) -> &'static [SectionDef] {
        const SECTIONS: [SectionDef; 1] = [SectionDef::of::<KnowledgeConfig>()];
        &SECTIONS
    }

    /// A collection's store is one that `[vector]` opens.
    fn check(&self, config: &Config) -> anyhow::Result<()> {
        let knowledge: KnowledgeConfig = config.get()?;
        let vector: VectorConfig = config.get()?;
        let stores: Vec<&str> = std::iter::once(toolmesh_core::VectorStores::DEFAULT)
            .chain(vector.stores.keys().map(String::as_str))
            .collect();
        for (i, collection) in knowledge.collections.iter().enumerate() {
            if let Some(name) = collection.store.as_deref().filter(|name| !stores.contains(name)) {
                let key = format!("knowledge.collections[{i}].store");
                return Err(config.key_error(&key, unknown_store(name, &stores)).into());
            }
        }
        Ok(())
    }

    async fn build(&self, assembly: &mut Assembly<'_>) -> anyhow::Result<Parts> {
        let stores = assembly.stores.clone().context("knowledge needs the vector stores")?;
        let model = assembly.model().await.ok();
        let knowledge = KnowledgeHandle::start(stores, model, assembly.registry.clone())
            .await
            .context("starting the retriever")?;
        assembly.handles.knowledge = Some(knowledge.clone());
        let service = {
            let (knowledge, router) = (knowledge.clone(), assembly.router.clone());
            GrpcService::new::<KnowledgeServiceServer<KnowledgeServiceImpl>>(
                move |routes, serving| {
                    let service = KnowledgeServiceImpl::new(knowledge.clone(), router.clone());
                    routes.add_service(
                        KnowledgeServiceServer::new(service)
                            .max_decoding_message_size(serving.max_message_bytes),
                    );
                },
            )
        };
        Ok(Parts::provider(Arc::new(KnowledgeProvider::new(knowledge.clone())))
            .actor("knowledge", Arc::new(knowledge))
            .service(service))
    }
}

/// Remote workers (`[remote]`): processes that connect to `toolmesh.v1.WorkerService` and
/// serve tools.
struct Remote;

#[async_trait::async_trait]
impl Plugin for Remote {
    fn name(&self) -> &'static str {
        "remote"
    }

    fn sections(&self) -> &'static [SectionDef] {
        const SECTIONS: [SectionDef; 1] = [SectionDef::of::<RemoteConfig>()];
        &SECTIONS
    }

    async fn build(&self, assembly: &mut Assembly<'_>) -> anyhow::Result<Parts> {
        let remote = RemoteWorkers::new(assembly.registry.clone());
        assembly.handles.remote = Some(remote.clone());
        let service = {
            let remote = remote.clone();
            GrpcService::new::<WorkerServiceServer<WorkerServiceImpl>>(move |routes, serving| {
                let service = remote.service(serving.sessions.clone(), serving.max_message_bytes);
                routes.add_service(
                    WorkerServiceServer::new(service)
                        .max_decoding_message_size(serving.max_message_bytes),
                );
            })
        };
        Ok(Parts::provider(Arc::new(remote)).service(service))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use toolmesh_config::{Section, load_str};

    use super::*;

    /// What `toolmesh config defaults` prints is what a start reads without a file: each
    /// crate's text agrees with its code.
    #[test]
    fn the_printed_defaults_are_what_a_start_reads_without_them() {
        let text = crate::default_config();
        for section in crate::sections() {
            assert!(text.contains(section.defaults.trim()), "[{}] is printed", section.name);
        }
        let env = HashMap::from([("HOME".to_owned(), "/home/a".to_owned())]);
        let printed = load_str(Some(("defaults", &text)), &env).expect("the text loads");
        crate::check_sections(&printed).expect("and passes the check");
        let bare = load_str(None, &env).unwrap();
        fn same<T: Section + PartialEq + std::fmt::Debug>(a: &Config, b: &Config) {
            assert_eq!(a.get::<T>().unwrap(), b.get::<T>().unwrap(), "[{}]", T::NAME);
        }
        same::<WorkersConfig>(&printed, &bare);
        same::<BuiltinConfig>(&printed, &bare);
        same::<ToolsConfig>(&printed, &bare);
        same::<McpConfig>(&printed, &bare);
        same::<SearchConfig>(&printed, &bare);
        same::<toolmesh_router::RoutingConfig>(&printed, &bare);
        // The sections a crate defaults through its type print those values.
        assert_eq!(bare.get::<VectorConfig>().unwrap(), VectorConfig::default());
        assert_eq!(bare.get::<KnowledgeConfig>().unwrap(), KnowledgeConfig::default());
        assert_eq!(bare.get::<RemoteConfig>().unwrap(), RemoteConfig::default());
        // Those that are off unless written print only comments.
        for off in ["[auth]", "[policy]", "[tls]"] {
            assert!(text.contains(&format!("# {off}")), "{off} is commented out");
        }
        assert!(!printed.has("auth") && !printed.has("policy") && !printed.has("tls"));
    }
}
