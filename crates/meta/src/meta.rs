use std::{
    collections::BTreeMap,
    sync::{Arc, OnceLock, Weak},
};

use opentelemetry::{
    KeyValue,
    metrics::{Counter, Histogram},
};
use serde_json::{Value, json};
use tokio::time::Instant;
use toolmesh_core::{
    Backend, BackendError, CallContext, CallFailure, ContentPart, FailureDetail, FieldViolation,
    MAX_LISTING_BYTES, Nesting, ToolAnnotations, ToolOutput, ToolSource, ToolSpec,
};
use toolmesh_policy::Scope;
use toolmesh_registry::{Catalog, RegistryError, RegistryHandle, SourceUpdate, ToolEntry};
use toolmesh_router::{
    Admission, CALL_TOOL, CallRequest, MAX_TOP_K, META_SOURCE, ProfileConfig, Router, RouterError,
    RoutingConfig, SEARCH_TOOLS, Searched, call_tool_not_found, is_meta,
};
use toolmesh_search::{SearchError, SearchHandle};
use toolmesh_telemetry::{add_link, names, span_ids};
use tracing::{Instrument, field::Empty, info_span, warn};

use crate::token::{SearchGrant, TokenError, TokenSigner};

/// Example capabilities in `searchTools`'s description.
const EXAMPLES: usize = 5;
/// Sources named in `searchTools`'s description.
const SOURCES: usize = 8;

/// The meta-tools; cheap to clone.
#[derive(Debug, Clone)]
pub struct MetaTools {
    inner: Arc<MetaInner>,
}

#[derive(Debug)]
struct MetaInner {
    router: Router,
    search: SearchHandle,
    signer: TokenSigner,
}

/// What `searchTools` says of itself in the catalog; a model reads the description that
/// [`MetaTools::describe`] computes for its profile instead.
const STORED_DESCRIPTION: &str = "Finds the tools for a task among the tools that are not \
    listed here. Say in `query` what you want to do; the answer lists the best matching tools \
    with their input schemas, and a searchToken. Then call one with callTool, giving its name, \
    its arguments and the searchToken.";

impl MetaTools {
    /// Returns the meta-tools over `router` (whose admission holds the routing profiles)
    /// and `search`, signing tokens with `routing`'s key. Without a configured key, a
    /// random one is made, and a warning says that tokens then hold only on this process.
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
        MetaTools {
            inner: Arc::new(MetaInner {
                router,
                search,
                signer: TokenSigner::new(&key, routing.token_ttl),
            }),
        }
    }

    /// Returns a key for `purpose` (for example the MCP endpoint's sessions), derived from
    /// the key of search tokens: replicas that share `routing.token_key` derive the same.
    pub fn derived_key(&self, purpose: &str) -> [u8; 32] {
        self.inner.signer.derive(purpose)
    }

    /// Returns `searchTools`'s description for `profile` over `catalog`, as `scope`'s
    /// principal may see it: how many tools are behind it, from which sources and
    /// toolkits, and a few examples.
    pub fn describe(profile: &ProfileConfig, catalog: &Catalog, scope: &Scope) -> String {
        let pool: Vec<&ToolSpec> = catalog
            .iter()
            .map(|(_, entry)| &entry.spec)
            .filter(|spec| Admission::in_pool(profile, spec) && scope.sees(spec))
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
                catalog.members(&kit.name).any(|t| {
                    catalog.get(t).is_some_and(|e| {
                        Admission::in_pool(profile, &e.spec) && scope.sees(&e.spec)
                    })
                })
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

    /// Returns the two catalog entries.
    fn entries(&self) -> Vec<ToolEntry> {
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
                STORED_DESCRIPTION,
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

    /// Publishes the meta-tools in the catalog, once: their descriptions are computed when
    /// read, so a catalog change writes nothing back.
    pub async fn publish(&self, registry: &RegistryHandle) -> Result<(), RegistryError> {
        registry
            .replace_source(SourceUpdate {
                source: ToolSource::local(META_SOURCE),
                tools: self.entries(),
                toolkits: vec![],
                toolkit: None,
                unchanged: vec![],
            })
            .await
    }
}

/// What a search found, and of which index.
#[derive(Debug, Clone, Default)]
pub struct Found {
    /// The tools, best first, with their scores.
    pub hits: Vec<(Arc<ToolEntry>, f64)>,
    /// How the index ranks, for example `bm25+minilm/rrf[k=60]`.
    pub ranking: String,
    /// Tools in the index.
    pub indexed: u64,
    /// Tools with a vector.
    pub embedded: u64,
    /// The catalog version the index reflects.
    pub index_version: u64,
    /// Whether the index had taken in the latest catalog, every tool with its vector.
    pub complete: bool,
    /// Bytes at the end of the query that were not searched (`search.max_query_bytes`).
    pub query_cut: usize,
}

/// A filter a search applies besides the profile's pool.
pub type Keep = Box<dyn Fn(&ToolSpec) -> bool + Send + Sync>;

impl MetaTools {
    /// The one search flow of `searchTools` and `SearchTools`: the `top_k` (else the
    /// profile's) best tools for `query` in the pool of `profile` (every tool but the
    /// meta-tools when `profile` is empty) that `keep` accepts.
    pub async fn find(
        &self,
        query: &str,
        top_k: Option<usize>,
        profile: &str,
        keep: Keep,
    ) -> Result<Found, RouterError> {
        let admission = self.inner.router.admission();
        let (_, named) = admission.profile(profile)?;
        let top_k = top_k.unwrap_or(named.top_k).clamp(1, MAX_TOP_K);
        let pool = (!profile.is_empty()).then(|| named.clone());
        let keep = move |spec: &ToolSpec| {
            keep(spec)
                && pool.as_ref().map_or(!is_meta(spec), |profile| Admission::in_pool(profile, spec))
        };
        let search = &self.inner.search;
        let query_cut = query.len() - search.cut_query(query).len();
        let hits = search.search(query, top_k, keep).await.map_err(search_refusal)?;
        Ok(Found {
            query_cut,
            hits: hits.into_iter().map(|hit| (hit.tool, hit.score)).collect(),
            ranking: search.ranking(),
            indexed: search.indexed() as u64,
            embedded: search.embedded() as u64,
            index_version: search.version(),
            complete: search.complete(),
        })
    }

    /// Returns the description of `spec` as a model of routing profile `profile` reads it,
    /// when it is computed from `catalog` (that of `searchTools`), counting only the tools
    /// `scope`'s principal may see; `None`: its own.
    pub fn description_of(
        &self,
        spec: &ToolSpec,
        profile: &str,
        catalog: &Catalog,
        scope: &Scope,
    ) -> Option<String> {
        if spec.name != SEARCH_TOOLS || !is_meta(spec) {
            return None;
        }
        let admission = self.inner.router.admission();
        let (_, profile) = admission.profile(profile).ok()?;
        Some(Self::describe(profile, catalog, scope))
    }
}

/// A failed search as the caller sees it: a bad query names the `query` field.
fn search_refusal(error: SearchError) -> RouterError {
    let detail = match &error {
        SearchError::EmptyQuery => FailureDetail::BadRequest(vec![FieldViolation {
            field: "query".into(),
            description: error.to_string(),
        }]),
        _ => FailureDetail::None,
    };
    let failure =
        CallFailure { code: error.code(), kind: error.kind(), message: error.to_string(), detail };
    RouterError::Refused(Box::new(failure))
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

#[async_trait::async_trait]
impl Backend for MetaBackend {
    async fn call(&self, ctx: CallContext, arguments: Value) -> Result<ToolOutput, BackendError> {
        let inner = self.inner.upgrade().ok_or_else(|| BackendError::Unavailable {
            backend: META_SOURCE.into(),
            reason: "toolmesh is shutting down".into(),
        })?;
        let meta = MetaTools { inner };
        let admission = meta.inner.router.admission();
        let (profile_name, profile) = admission
            .profile(ctx.profile.as_deref().unwrap_or_default())
            .map_err(|e| BackendError::Failure(Box::new(e.failure())))?;
        match self.which {
            Which::Search => meta.search_tools(&ctx, profile_name, &arguments).await,
            Which::Call => meta.call_tool(ctx, profile_name, profile, arguments).await,
        }
    }
}

impl MetaTools {
    async fn search_tools(
        &self,
        ctx: &CallContext,
        profile_name: &str,
        arguments: &Value,
    ) -> Result<ToolOutput, BackendError> {
        let query = arguments["query"].as_str().unwrap_or_default();
        let top_k = arguments["topK"].as_u64().map(|k| k as usize);
        let span = info_span!(
            "search_tools",
            otel.name = "toolmesh.search_tools",
            { names::TOOLMESH_SEARCH_QUERY } = query,
            { names::TOOLMESH_PROFILE } = profile_name,
            { names::TOOLMESH_SEARCH_RESULTS } = Empty,
        );
        // The caller's policy filters before the ranking is cut to top_k.
        let scope = self.inner.router.admission().scope(ctx.principal.clone());
        let keep = Box::new(move |spec: &ToolSpec| scope.sees(spec));
        let found = self
            .find(query, top_k, profile_name, keep)
            .instrument(span.clone())
            .await
            .map_err(|error| BackendError::Failure(Box::new(error.failure())))?;
        // Best first, while the result holds them: its text repeats the JSON, so half of
        // the bound goes to each.
        let (mut tools, mut hits, mut bytes, mut left_out) = (Vec::new(), Vec::new(), 0, 0);
        for (tool, score) in found.hits {
            let definition = json!({
                "name": tool.spec.name,
                "description": tool.spec.description,
                "inputSchema": *tool.spec.input_schema,
            });
            let size = definition.to_string().len();
            if tools.is_empty() || bytes + size <= MAX_LISTING_BYTES / 2 {
                bytes += size;
                tools.push(definition);
                hits.push((tool, score));
            } else {
                left_out += 1;
            }
        }
        span.record(names::TOOLMESH_SEARCH_RESULTS, hits.len() as i64);
        let grant = SearchGrant::new(
            ctx.session_id.as_deref().unwrap_or_default(),
            profile_name,
            span_ids(&span),
            hits.iter().map(|(tool, _)| tool.spec.name.as_str()),
        );
        let mut structured =
            json!({ "tools": tools, "searchToken": self.inner.signer.sign(&grant) });
        if left_out > 0 {
            structured["toolsLeftOut"] = json!(format!(
                "{left_out} more matching tools did not fit in this result; a narrower query \
                 finds them"
            ));
        }
        if found.query_cut > 0 {
            // The model learns that the end of what it asked was not searched.
            structured["queryCut"] = json!(format!(
                "only the first {} bytes of the query were searched; {} bytes at its end were not",
                query.len() - found.query_cut,
                found.query_cut
            ));
        }
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
        // Resolved once: the router dispatches this entry. A tool the caller may not see is
        // not there for it.
        let scope = self.inner.router.admission().scope(ctx.principal.clone());
        let entry = self
            .inner
            .router
            .registry()
            .resolve(&name)
            .filter(|entry| is_meta(&entry.spec) || scope.sees(&entry.spec))
            .ok_or_else(|| BackendError::Failure(Box::new(call_tool_not_found(&name))))?;
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
        let searched = match (&grant, found, rank) {
            (_, Some(_), Some(_)) => Searched::Returned,
            (None, ..) => Searched::NoToken,
            (Some(Err(TokenError::Expired)), ..) => Searched::Expired,
            (Some(Err(TokenError::Invalid)), ..) => Searched::Invalid,
            (Some(Ok(_)), None, _) => Searched::Elsewhere,
            (Some(Ok(_)), Some(_), None) => Searched::NotReturned,
        };
        let exposed = Admission::visible(profile, &entry.spec);
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
        if !is_meta(&entry.spec) && (exposed || Admission::in_pool(profile, &entry.spec)) {
            record_call(profile_name, exposed, rank);
        }
        let request = CallRequest {
            name: name.clone(),
            arguments_json: arguments.get("arguments").map_or_else(String::new, Value::to_string),
            call_id: String::new(),
            session_id: session.to_owned(),
            profile: profile_name.to_owned(),
            client_timeout: Some(ctx.deadline.saturating_duration_since(Instant::now())),
            principal: ctx.principal.clone(),
            // The call callTool makes is the caller's, as deep as callTool's own.
            nesting: (ctx.depth > 0)
                .then(|| Nesting { depth: ctx.depth, parent_call_id: ctx.call_id.clone() }),
        };
        let cancel = ctx.cancel.child_token();
        let call =
            self.inner.router.call_resolved(entry, searched, request, ctx.events.clone(), cancel);
        match call.instrument(span).await {
            Ok((_, output)) => Ok(output),
            Err(RouterError::Cancelled { .. }) => Err(BackendError::Cancelled),
            // The called tool's own failure keeps its kind; the router's refusals (bad
            // arguments, a tool outside the profile, a search required, a deadline) travel
            // whole, details included.
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
