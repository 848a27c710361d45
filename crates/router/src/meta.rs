//! The meta-tools `searchTools` and `callTool`: what an agent sees when the catalog is too
//! large for its model's context.
//!
//! Both are ordinary catalog tools, called through `CallTool`, so an agent in any language
//! hands their schemas to its model and forwards the model's calls. `searchTools` finds the
//! tools that fit a task within the routing profile's pool and returns them with a signed
//! `searchToken`; `callTool` calls one of them. With `enforce_search_before_call`, `callTool`
//! accepts only a tool that the token's search returned in the same session: the check is
//! stateless, so replicas sharing the token key accept each other's searches.

use std::{
    collections::BTreeMap,
    sync::{Arc, OnceLock, Weak},
    time::Duration,
};

use opentelemetry::{
    KeyValue,
    metrics::{Counter, Histogram},
};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolmesh_config::{ProfileConfig, RoutingConfig, Selector};
use toolmesh_core::{
    Backend, BackendError, CallContext, CallFailure, ContentPart, ECHO_CHARS, ErrorCode,
    ToolAnnotations, ToolOutput, ToolSource, ToolSpec, clip,
};
use toolmesh_registry::{Catalog, RegistryHandle, SourceUpdate, ToolEntry};
use toolmesh_search::SearchHandle;
use toolmesh_telemetry::{add_link, names, span_ids};
use tracing::{Instrument, field::Empty, info_span, warn};

use crate::{
    CallRequest, Router, RouterError,
    token::{SearchGrant, TokenError, TokenSigner},
};

/// The name of the search meta-tool.
pub const SEARCH_TOOLS: &str = "searchTools";
/// The name of the call meta-tool.
pub const CALL_TOOL: &str = "callTool";
/// The source the meta-tools belong to.
pub const META_SOURCE: &str = "meta";
/// The profile used when a request names none.
pub const DEFAULT_PROFILE: &str = "default";

/// Most tools per search.
const MAX_TOP_K: usize = 50;
/// Example capabilities in `searchTools`'s description.
const EXAMPLES: usize = 5;
/// Sources named in `searchTools`'s description.
const SOURCES: usize = 8;

/// Returns whether `spec` is one of the meta-tools.
pub fn is_meta(spec: &ToolSpec) -> bool {
    spec.source.name == META_SOURCE && matches!(spec.name.as_str(), SEARCH_TOOLS | CALL_TOOL)
}

/// The meta-tools and the routing profiles; cheap to clone.
#[derive(Debug, Clone)]
pub struct MetaTools {
    inner: Arc<MetaInner>,
}

#[derive(Debug)]
struct MetaInner {
    router: Router,
    search: SearchHandle,
    profiles: BTreeMap<String, ProfileConfig>,
    signer: TokenSigner,
    /// Cancelled when the meta-tools are dropped: ends the description follower.
    stop: CancellationToken,
}

impl Drop for MetaInner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl MetaTools {
    /// Returns the meta-tools over `router` and `search`, with `routing`'s profiles and key.
    /// Without a configured key, a random one is made, and a warning says that tokens then
    /// hold only on this process.
    pub fn new(router: Router, search: SearchHandle, routing: &RoutingConfig) -> Self {
        let key = match &routing.token_key {
            Some(key) => key.as_bytes().to_vec(),
            None => {
                warn!(
                    "routing.token_key is not set: searchTools tokens are signed with a random key, \
                     so other replicas and a restarted toolmesh reject them"
                );
                let mut key = vec![0; 32];
                getrandom::fill(&mut key).expect("the operating system's random source");
                key
            }
        };
        let mut profiles = routing.profiles.clone();
        profiles.entry(DEFAULT_PROFILE.to_owned()).or_default();
        MetaTools {
            inner: Arc::new(MetaInner {
                router,
                search,
                profiles,
                signer: TokenSigner::new(&key, routing.token_ttl),
                stop: CancellationToken::new(),
            }),
        }
    }

    /// Returns the profile named `name` (`default` when empty).
    pub fn profile(&self, name: &str) -> Result<&ProfileConfig, RouterError> {
        let name = profile_name(name);
        self.inner.profiles.get(name).ok_or_else(|| RouterError::InvalidRequest {
            field: "profile",
            reason: format!(
                "no routing profile `{}` (configured: {})",
                clip(name, ECHO_CHARS),
                self.inner.profiles.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        })
    }

    /// Returns whether a model of `profile` sees `spec` without searching: a meta-tool or
    /// an exposed tool.
    pub fn visible(profile: &ProfileConfig, spec: &ToolSpec) -> bool {
        is_meta(spec) || selects(&profile.expose, spec)
    }

    /// Returns whether `spec` is in `profile`'s pool (never a meta-tool).
    pub fn in_pool(profile: &ProfileConfig, spec: &ToolSpec) -> bool {
        !is_meta(spec) && selects(&profile.pool, spec)
    }

    /// Returns `searchTools`'s description for `profile` over `catalog`: how many tools are
    /// behind it, from which sources and toolkits, and a few examples.
    pub fn describe(profile: &ProfileConfig, catalog: &Catalog) -> String {
        let pool: Vec<&ToolSpec> = catalog
            .tools
            .values()
            .map(|entry| &entry.spec)
            .filter(|spec| Self::in_pool(profile, spec))
            .collect();
        let mut sources: BTreeMap<String, Vec<&ToolSpec>> = BTreeMap::new();
        for spec in &pool {
            let source = match spec.source.kind {
                toolmesh_core::SourceKind::Mcp => format!("MCP server {}", spec.source.name),
                kind => format!("{} {}", kind.as_str(), spec.source.name),
            };
            sources.entry(source).or_default().push(spec);
        }
        let mut by_size: Vec<(&String, &Vec<&ToolSpec>)> = sources.iter().collect();
        by_size.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then_with(|| a.0.cmp(b.0)));
        let mut listed: Vec<String> = by_size
            .iter()
            .take(SOURCES)
            .map(|(source, tools)| format!("{source} ({} tools)", tools.len()))
            .collect();
        if by_size.len() > SOURCES {
            listed.push(format!("{} more", by_size.len() - SOURCES));
        }
        let toolkits: Vec<&str> = catalog
            .toolkits
            .values()
            .filter(|kit| {
                kit.tools
                    .iter()
                    .any(|t| catalog.get(t).is_some_and(|e| Self::in_pool(profile, &e.spec)))
            })
            .map(|kit| kit.name.as_str())
            .collect();
        // One example from each of the largest sources, round after round.
        let mut examples = Vec::new();
        for round in 0.. {
            let before = examples.len();
            for (_, tools) in &by_size {
                if examples.len() == EXAMPLES {
                    break;
                }
                if let Some(spec) = tools.iter().filter(|s| !s.description.is_empty()).nth(round) {
                    examples.push(format!("{}: {}", spec.name, first_sentence(&spec.description)));
                }
            }
            if examples.len() == EXAMPLES || examples.len() == before {
                break;
            }
        }
        let mut text = format!(
            "Finds the tools for a task among {} tools that are not listed here. Say in `query` \
             what you want to do; the answer lists the best matching tools with their input \
             schemas, and a searchToken. Then call one with callTool, giving its name, its \
             arguments and the searchToken.",
            pool.len()
        );
        if !listed.is_empty() {
            text.push_str(&format!("\nSources: {}.", listed.join(", ")));
        }
        if !toolkits.is_empty() {
            text.push_str(&format!("\nToolkits: {}.", toolkits.join(", ")));
        }
        if !examples.is_empty() {
            text.push_str(&format!("\nFor example: {}.", examples.join("; ")));
        }
        text
    }

    /// Returns `searchTools`'s description for the default profile over `catalog`, the one
    /// the catalog entry carries.
    fn default_description(&self, catalog: &Catalog) -> String {
        Self::describe(&self.inner.profiles[DEFAULT_PROFILE], catalog)
    }

    /// Returns the two catalog entries, `searchTools` described by `description`.
    fn entries(&self, description: String) -> Vec<ToolEntry> {
        let weak = Arc::downgrade(&self.inner);
        let source = ToolSource::local(META_SOURCE);
        let search = ToolSpec {
            annotations: ToolAnnotations {
                read_only: Some(true),
                destructive: Some(false),
                idempotent: Some(true),
                open_world: Some(false),
            },
            ..ToolSpec::new(
                SEARCH_TOOLS,
                description,
                json!({
                    "type": "object",
                    "properties": {
                        "query": {
                            "type": "string",
                            "minLength": 1,
                            "description": "What you want to do, in a sentence."
                        },
                        "topK": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_TOP_K,
                            "description": "How many tools to return."
                        }
                    },
                    "required": ["query"],
                    "additionalProperties": false
                }),
                source.clone(),
            )
        };
        let call = ToolSpec::new(
            CALL_TOOL,
            "Calls a tool that searchTools returned: give the tool's name, its arguments as \
             its input schema describes them, and the searchToken of that search.",
            json!({
                "type": "object",
                "properties": {
                    "name": { "type": "string", "minLength": 1, "description": "The tool's name." },
                    "arguments": { "type": "object", "description": "The tool's arguments." },
                    "searchToken": {
                        "type": "string",
                        "description": "The searchToken of the searchTools answer that returned the tool."
                    }
                },
                "required": ["name"],
                "additionalProperties": false
            }),
            source,
        );
        [(search, Which::Search), (call, Which::Call)]
            .into_iter()
            .map(|(spec, which)| {
                let backend = Arc::new(MetaBackend { inner: weak.clone(), which });
                ToolEntry::new(spec, backend).expect("the meta-tools' schemas compile")
            })
            .collect()
    }

    /// Publishes the meta-tools, and keeps `searchTools`'s description in step with the
    /// catalog until the meta-tools are dropped. Returns once they are published.
    pub async fn publish(&self, registry: &RegistryHandle) -> Result<(), String> {
        let update = |meta: &MetaTools, description: String| SourceUpdate {
            source: ToolSource::local(META_SOURCE),
            tools: meta.entries(description),
            toolkits: vec![],
            unchanged: vec![],
        };
        registry
            .replace_source(update(self, self.default_description(&registry.snapshot())))
            .await
            .map_err(|e| format!("cannot publish the meta-tools: {e}"))?;
        let (weak, registry) = (Arc::downgrade(&self.inner), registry.clone());
        let stop = self.inner.stop.clone();
        let mut changes = registry.subscribe();
        tokio::spawn(
            async move {
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        changed = changes.changed() => if changed.is_err() { return },
                    }
                    // Let a burst of changes settle before describing the catalog again.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    changes.borrow_and_update();
                    let Some(inner) = weak.upgrade() else { return };
                    let meta = MetaTools { inner };
                    let catalog = registry.snapshot();
                    let description = meta.default_description(&catalog);
                    if catalog.get(SEARCH_TOOLS).is_some_and(|e| e.spec.description != description)
                        && let Err(error) =
                            registry.replace_source(update(&meta, description)).await
                    {
                        warn!(%error, "cannot update the description of searchTools");
                    }
                }
            }
            .instrument(info_span!("meta", task = "describe searchTools")),
        );
        Ok(())
    }
}

/// The profile a request means: the one it names, or `default`.
fn profile_name(name: &str) -> &str {
    if name.is_empty() { DEFAULT_PROFILE } else { name }
}

fn selects(selectors: &[Selector], spec: &ToolSpec) -> bool {
    selectors.iter().any(|selector| {
        selector.matches(&spec.name, &spec.source.name, spec.toolkit.as_deref(), &spec.tags)
    })
}

fn first_sentence(text: &str) -> String {
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or_default().trim();
    let end = line.find(". ").map_or(line.len(), |i| i + 1);
    let sentence = line[..end].trim_end_matches('.');
    match sentence.char_indices().nth(100) {
        Some((at, _)) => format!("{}…", &sentence[..at]),
        None => sentence.to_owned(),
    }
}

#[derive(Debug, Clone, Copy)]
enum Which {
    Search,
    Call,
}

/// Runs the meta-tools. It holds the meta-tools weakly: the catalog holds the backend, and
/// the meta-tools hold the router, which holds the catalog.
struct MetaBackend {
    inner: Weak<MetaInner>,
    which: Which,
}

/// A refusal of the meta-tools, with the error type it has on the call's span.
fn refuse(code: ErrorCode, kind: &'static str, message: impl Into<String>) -> BackendError {
    BackendError::Failure(Box::new(CallFailure::new(code, kind, message)))
}

#[async_trait::async_trait]
impl Backend for MetaBackend {
    async fn call(&self, ctx: CallContext, arguments: Value) -> Result<ToolOutput, BackendError> {
        let inner = self.inner.upgrade().ok_or_else(|| BackendError::Unavailable {
            backend: META_SOURCE.into(),
            reason: "toolmesh is shutting down".into(),
        })?;
        let meta = MetaTools { inner };
        let profile_name = profile_name(ctx.profile.as_deref().unwrap_or_default()).to_owned();
        let profile = meta
            .profile(&profile_name)
            .map_err(|e| BackendError::Failure(Box::new(e.failure())))?;
        match self.which {
            Which::Search => meta.search_tools(&ctx, &profile_name, profile, &arguments).await,
            Which::Call => meta.call_tool(ctx, &profile_name, profile, arguments).await,
        }
    }
}

impl MetaTools {
    async fn search_tools(
        &self,
        ctx: &CallContext,
        profile_name: &str,
        profile: &ProfileConfig,
        arguments: &Value,
    ) -> Result<ToolOutput, BackendError> {
        let query = arguments["query"].as_str().unwrap_or_default();
        let top_k =
            arguments["topK"].as_u64().map_or(profile.top_k, |k| k as usize).clamp(1, MAX_TOP_K);
        let span = info_span!(
            "search_tools",
            otel.name = "toolmesh.search_tools",
            { names::TOOLMESH_SEARCH_QUERY } = query,
            { names::TOOLMESH_PROFILE } = profile_name,
            { names::TOOLMESH_SEARCH_RESULTS } = Empty,
        );
        let hits = self
            .inner
            .search
            .search(query, top_k, {
                let profile = profile.clone();
                move |spec| Self::in_pool(&profile, spec)
            })
            .instrument(span.clone())
            .await
            .map_err(|error| match error.code() {
                ErrorCode::InvalidArgument => BackendError::InvalidArguments(error.to_string()),
                _ => BackendError::Internal(error.to_string()),
            })?;
        span.record(names::TOOLMESH_SEARCH_RESULTS, hits.len() as i64);
        let grant = SearchGrant::new(
            ctx.session_id.as_deref().unwrap_or_default(),
            profile_name,
            span_ids(&span),
            hits.iter().map(|hit| hit.tool.spec.name.as_str()),
        );
        let tools: Vec<Value> = hits
            .iter()
            .map(|hit| {
                json!({
                    "name": hit.tool.spec.name,
                    "description": hit.tool.spec.description,
                    "inputSchema": *hit.tool.spec.input_schema,
                })
            })
            .collect();
        let structured = json!({ "tools": tools, "searchToken": self.inner.signer.sign(&grant) });
        Ok(ToolOutput {
            content: vec![ContentPart::Text(structured.to_string())],
            structured: Some(structured),
            is_error: false,
        })
    }

    async fn call_tool(
        &self,
        ctx: CallContext,
        profile_name: &str,
        profile: &ProfileConfig,
        arguments: Value,
    ) -> Result<ToolOutput, BackendError> {
        let name = arguments["name"].as_str().unwrap_or_default().to_owned();
        let catalog = self.inner.router.registry().snapshot();
        let entry = catalog.get(&name).ok_or_else(|| {
            refuse(
                ErrorCode::NotFound,
                "tool_not_found",
                format!(
                    "tool {} not found; call searchTools to find tools",
                    clip(&name, ECHO_CHARS)
                ),
            )
        })?;
        if is_meta(&entry.spec) {
            return Err(refuse(
                ErrorCode::InvalidArgument,
                "invalid_request",
                format!("callTool cannot call {name}: call the meta-tools directly"),
            ));
        }
        let exposed = Self::visible(profile, &entry.spec);
        if !exposed && !Self::in_pool(profile, &entry.spec) {
            return Err(refuse(
                ErrorCode::NotFound,
                "tool_not_found",
                format!("tool {name} is not available in routing profile {profile_name}"),
            ));
        }
        let session = ctx.session_id.as_deref().unwrap_or_default();
        let grant = arguments["searchToken"]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(|token| self.inner.signer.verify(token));
        let (found, rank) = match &grant {
            Some(Ok(grant)) if grant.belongs_to(session, profile_name) => {
                (Some(grant), grant.rank_of(&name))
            }
            _ => (None, None),
        };
        let span = info_span!(
            "call_tool",
            otel.name = "toolmesh.call_tool",
            { names::GEN_AI_TOOL_NAME } = %name,
            { names::TOOLMESH_PROFILE } = profile_name,
            { names::TOOLMESH_SEARCH_IN_RESULT } = rank.is_some(),
            { names::TOOLMESH_SEARCH_RANK } = Empty,
        );
        if let Some(rank) = rank {
            span.record(names::TOOLMESH_SEARCH_RANK, rank as i64);
        }
        if let Some(ids) = found.and_then(|g| g.span) {
            let mut attributes =
                vec![KeyValue::new(names::TOOLMESH_SEARCH_IN_RESULT, rank.is_some())];
            if let Some(rank) = rank {
                attributes.push(KeyValue::new(names::TOOLMESH_SEARCH_RANK, rank as i64));
            }
            add_link(&span, ids, attributes);
        }
        record_call(profile_name, exposed, rank);
        if profile.enforce_search_before_call && !exposed && rank.is_none() {
            let why = match &grant {
                None => "no searchToken was given".to_owned(),
                Some(Err(TokenError::Expired)) => "the searchToken has expired".to_owned(),
                Some(Err(TokenError::Invalid)) => {
                    "the searchToken is not one that searchTools returned".to_owned()
                }
                Some(Ok(_)) if found.is_none() => {
                    "the searchToken belongs to another session or profile".to_owned()
                }
                Some(Ok(_)) => format!("that search did not return {name}"),
            };
            return Err(refuse(
                ErrorCode::FailedPrecondition,
                "search_required",
                format!(
                    "callTool can only call a tool that searchTools returned in this session, and {why}. \
                     Call searchTools with what you want to do first, then callTool with one of the \
                     tools it returns and its searchToken."
                ),
            ));
        }
        let request = CallRequest {
            name: name.clone(),
            arguments_json: arguments.get("arguments").map_or_else(String::new, Value::to_string),
            call_id: String::new(),
            session_id: session.to_owned(),
            profile: String::new(),
            client_timeout: Some(ctx.deadline.saturating_duration_since(Instant::now())),
        };
        let cancel = ctx.cancel.child_token();
        match self.inner.router.call(request, ctx.events.clone(), cancel).instrument(span).await {
            Ok((_, output)) => Ok(output),
            Err(RouterError::Cancelled { .. }) => Err(BackendError::Cancelled),
            // The called tool's own failure keeps its kind; the router's refusals (bad
            // arguments, no such tool, a deadline) travel whole, details included.
            Err(RouterError::Backend(error)) => Err(error),
            Err(error) => Err(BackendError::Failure(Box::new(error.failure()))),
        }
    }
}

struct Instruments {
    calls: Counter<u64>,
    rank: Histogram<u64>,
}

fn instruments() -> &'static Instruments {
    static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();
    INSTRUMENTS.get_or_init(|| {
        let meter = opentelemetry::global::meter("toolmesh");
        Instruments {
            calls: meter
                .u64_counter(names::METRIC_CALL_TOOL_CALLS)
                .with_description(
                    "callTool calls, by whether the called tool was in the search result",
                )
                .build(),
            rank: meter
                .u64_histogram(names::METRIC_CALL_TOOL_SEARCH_RANK)
                .with_description("the rank at which searchTools returned the tool callTool called")
                .with_boundaries(vec![1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0])
                .build(),
        }
    })
}

fn record_call(profile: &str, exposed: bool, rank: Option<usize>) {
    let attributes = [
        KeyValue::new(names::TOOLMESH_PROFILE, profile.to_owned()),
        KeyValue::new(names::TOOLMESH_SEARCH_IN_RESULT, rank.is_some()),
        KeyValue::new(names::TOOLMESH_EXPOSED, exposed),
    ];
    instruments().calls.add(1, &attributes);
    if let Some(rank) = rank {
        instruments().rank.record(rank as u64, &attributes[..1]);
    }
}
