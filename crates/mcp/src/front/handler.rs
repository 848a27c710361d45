//! The MCP server toolmesh is: `tools/list` and `tools/call` of the mesh behind [`Mesh`],
//! for the principal the front door authenticated.

use std::{
    borrow::Cow,
    collections::HashMap,
    sync::{
        Arc, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
};

use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestParams,
        CompleteResult, ContentBlock, ElicitRequestParams, ElicitationAction, ErrorCode as McpCode,
        GetPromptRequestParams, GetPromptResponse, Implementation, InputRequiredResult, JsonObject,
        ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
        PaginatedRequestParams, ProgressNotificationParam, ProgressToken, Prompt,
        PromptsCapability, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
        Resource, ResourceTemplate, ResourceUpdatedNotificationParam, ResourcesCapability,
        ResultType, ServerCapabilities, ServerConfig, SubscribeRequestParams, SubscriptionFilter,
        Tool, ToolsCapability, UnsubscribeRequestParams,
    },
    service::{NotificationContext, Peer, RequestContext, SubscriptionContext},
};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use toolmesh_core::{
    Approval, ApprovalAnswer, ApprovalPrompt, CallEvent, CallFailure, ContentPart,
    ElicitationAnswer, ElicitationPrompt, ErrorCode, EventReceiver, EventSink, INPUT_REQUIRED,
    InputAnswers, InputRounds, MISSING_CLIENT_CAPABILITY, Principal, ResourceBody, SamplingAnswer,
    SamplingPrompt, ToolOutput, ToolSpec,
};
use tracing::{Instrument as _, Span};

use super::rounds::{Bound, SignedRounds};
use crate::metrics::Operation;

/// Where the MCP endpoint finds tools and calls them: the API layer's view of the router,
/// for one caller at a time.
#[async_trait::async_trait]
pub trait Mesh: Send + Sync + 'static {
    /// One page of the tools `caller` sees, after the tool named `after`.
    async fn list(&self, caller: &Caller, after: Option<&str>) -> Result<Page, CallFailure>;

    /// Calls `name` for `caller` through the call path every call takes; the tool's
    /// events go to `events`, and `cancel` ends the call.
    async fn call(
        &self,
        caller: &Caller,
        name: String,
        arguments: Map<String, Value>,
        events: EventSink,
        cancel: CancellationToken,
    ) -> Result<ToolOutput, CallFailure>;

    /// The catalog's version, which changes with every change of the catalog.
    fn changes(&self) -> tokio::sync::watch::Receiver<u64>;

    /// The resources, resource templates and prompts of the MCP servers that `caller`
    /// sees, under the names the catalog gives them.
    fn offers(&self, caller: &Caller) -> Offered;

    /// Reads the resource `uri` for `caller` from the server that offers it.
    async fn read_resource(
        &self,
        caller: &Caller,
        uri: &str,
    ) -> Result<ReadResourceResult, crate::OfferError>;

    /// Gets the prompt the catalog names `name` for `caller`; one that answers input rounds
    /// itself passes `rounds`, and may get a round the server asks for.
    async fn get_prompt(
        &self,
        caller: &Caller,
        name: &str,
        arguments: Option<JsonObject>,
        rounds: Option<&InputRounds>,
    ) -> Result<GetPromptResponse, crate::OfferError>;

    /// Completes an argument of a prompt or resource template `caller` sees, as the server
    /// that offers it completes it.
    async fn complete(
        &self,
        caller: &Caller,
        params: CompleteRequestParams,
    ) -> Result<CompleteResult, crate::OfferError>;

    /// A version that changes whenever what the servers offer changes.
    fn offer_changes(&self) -> tokio::sync::watch::Receiver<u64>;

    /// Subscribes `caller` to the updates of the resource `uri`, at the server that offers
    /// it (which must offer subscriptions); returns that server's name.
    async fn subscribe(&self, caller: &Caller, uri: &str) -> Result<String, crate::OfferError>;

    /// Ends one subscription to the resource `uri` of `server`.
    async fn unsubscribe(&self, server: &str, uri: &str) -> Result<(), crate::OfferError>;

    /// The updates of subscribed resources, from every server.
    fn resource_updates(&self) -> tokio::sync::broadcast::Receiver<crate::ResourceUpdate>;
}

/// What the MCP servers offer besides tools, as one caller sees it.
#[derive(Debug, Default)]
pub struct Offered {
    /// Resources.
    pub resources: Vec<Resource>,
    /// Resource templates.
    pub templates: Vec<ResourceTemplate>,
    /// Prompts.
    pub prompts: Vec<Prompt>,
}

/// How long a burst of catalog changes is gathered into one `list_changed` notification.
const CHANGES_SETTLE: std::time::Duration = std::time::Duration::from_millis(100);
/// How often a session without catalog changes checks that its client is still there.
const CLIENT_CHECK: std::time::Duration = std::time::Duration::from_secs(30);

/// One page of a listing.
#[derive(Debug, Default)]
pub struct Page {
    /// The tools, in catalog order, described as the caller sees them.
    pub tools: Vec<ToolSpec>,
    /// The name to list after for the next page; `None` on the last page.
    pub next: Option<String>,
}

/// Who asks, through which door.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The principal the front door authenticated.
    pub principal: Arc<Principal>,
    /// The routing profile the endpoint's path names; empty: the principal's.
    pub profile: String,
    /// The MCP session, empty when the client has none (a stateless request).
    pub session: String,
}

/// The MCP handler: one per session, or per request of a stateless client.
#[derive(Clone)]
pub(crate) struct Front {
    pub(crate) mesh: Arc<dyn Mesh>,
    /// The endpoint's path, before an optional `/<profile>`.
    pub(crate) path: Arc<str>,
    /// The least severity of the log messages relayed to this session (`logging/setLevel`),
    /// as a rank of [`LOG_LEVELS`]; every one until the client sets it.
    pub(crate) log_level: Arc<AtomicUsize>,
    /// The resources this session subscribed to, as (server, URI).
    pub(crate) subscriptions: Arc<std::sync::Mutex<std::collections::BTreeSet<(String, String)>>>,
    /// Wraps the upstream servers' states of the input rounds passed on to 2026-07-28
    /// clients.
    pub(crate) rounds: Arc<SignedRounds>,
}

/// Ends a session's subscriptions when the session ends.
struct Unsubscribe {
    mesh: Arc<dyn Mesh>,
    subscriptions: Arc<std::sync::Mutex<std::collections::BTreeSet<(String, String)>>>,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        let ended =
            std::mem::take(&mut *self.subscriptions.lock().unwrap_or_else(PoisonError::into_inner));
        if ended.is_empty() {
            return;
        }
        let mesh = self.mesh.clone();
        tokio::spawn(async move {
            for (server, uri) in ended {
                let _ = mesh.unsubscribe(&server, &uri).await;
            }
        });
    }
}

/// What a client that listens hears of.
enum Heard {
    /// The catalog changed (a burst of changes once).
    Tools,
    /// What the servers offer changed (a burst of changes once).
    Offers,
    /// A subscribed resource changed.
    Updated(crate::ResourceUpdate),
}

/// The changes a session or a `subscriptions/listen` stream follows, from when it began.
struct Listening {
    changes: tokio::sync::watch::Receiver<u64>,
    offers: tokio::sync::watch::Receiver<u64>,
    updates: tokio::sync::broadcast::Receiver<crate::ResourceUpdate>,
}

impl Listening {
    fn new(mesh: &dyn Mesh) -> Self {
        let mut changes = mesh.changes();
        changes.mark_unchanged();
        let mut offers = mesh.offer_changes();
        offers.mark_unchanged();
        Listening { changes, offers, updates: mesh.resource_updates() }
    }

    /// The next change heard, a list's once its burst has settled; `None` once the mesh
    /// has gone. Cancel-safe: a change not yet returned is returned by the next call.
    async fn next(&mut self) -> Option<Heard> {
        loop {
            tokio::select! {
                update = self.updates.recv() => match update {
                    Ok(update) => return Some(Heard::Updated(update)),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                },
                changed = self.changes.changed() => {
                    changed.ok()?;
                    tokio::time::sleep(CHANGES_SETTLE).await;
                    self.changes.mark_unchanged();
                    return Some(Heard::Tools);
                }
                changed = self.offers.changed() => {
                    changed.ok()?;
                    tokio::time::sleep(CHANGES_SETTLE).await;
                    self.offers.mark_unchanged();
                    return Some(Heard::Offers);
                }
            }
        }
    }
}

/// MCP's log severities, least first.
const LOG_LEVELS: [&str; 8] =
    ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"];

fn log_rank(level: &str) -> usize {
    LOG_LEVELS.iter().position(|l| *l == level).unwrap_or(0)
}

/// The session id a request presented, as the client knows it (rmcp is handed its own).
#[derive(Debug, Clone)]
pub(crate) struct ClientSession(pub(crate) String);

/// The session header of streamable HTTP.
pub(crate) const SESSION_HEADER: &str = "mcp-session-id";

fn refused(message: &str) -> ErrorData {
    ErrorData::new(McpCode::INVALID_REQUEST, message.to_owned(), None)
}

impl Front {
    /// The handler of a new session: the endpoint's, with a log level of its own.
    pub(crate) fn for_session(&self) -> Self {
        Front { log_level: Arc::default(), subscriptions: Arc::default(), ..self.clone() }
    }

    fn lock_subscriptions(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<(String, String)>> {
        self.subscriptions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The caller of a request, from the HTTP request rmcp hands over.
    fn caller(&self, context: &RequestContext<RoleServer>) -> Result<Caller, ErrorData> {
        let Some(parts) = context.extensions.get::<http::request::Parts>() else {
            return Ok(Caller {
                principal: toolmesh_core::open_principal(),
                profile: String::new(),
                session: String::new(),
            });
        };
        let principal = match parts.extensions.get::<Arc<Principal>>() {
            Some(principal) => principal.clone(),
            None if parts.extensions.get::<toolmesh_core::NoPrincipal>().is_some() => {
                return Err(refused("a request without a credential has no principal"));
            }
            None => toolmesh_core::open_principal(),
        };
        let profile = parts
            .uri
            .path()
            .strip_prefix(&*self.path)
            .map(|rest| rest.trim_matches('/'))
            .unwrap_or_default()
            .to_owned();
        let session = match parts.extensions.get::<ClientSession>() {
            Some(ClientSession(id)) => id.clone(),
            None => parts
                .headers
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
        };
        Ok(Caller { principal, profile, session })
    }
}

/// The protocol revision of a request, from its `MCP-Protocol-Version` header.
fn protocol_version(context: &RequestContext<RoleServer>) -> &str {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.headers.get("mcp-protocol-version"))
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// The server span of one MCP request, following the OpenTelemetry MCP conventions, a child
/// of the client's trace context (in `_meta`, else in the HTTP headers).
fn server_span(
    method: &'static str,
    tool: Option<&str>,
    caller: &Caller,
    context: &RequestContext<RoleServer>,
) -> Span {
    let version = protocol_version(context);
    let name = match tool {
        Some(tool) => format!("{method} {tool}"),
        None => method.to_owned(),
    };
    let span = tracing::info_span!(
        "mcp",
        otel.name = %name,
        otel.kind = "server",
        mcp.method.name = method,
        mcp.protocol.version = %version,
        mcp.session.id = tracing::field::Empty,
        gen_ai.tool.name = tracing::field::Empty,
        gen_ai.operation.name = tracing::field::Empty,
        jsonrpc.request.id = %context.id,
    );
    if !caller.session.is_empty() {
        span.record("mcp.session.id", caller.session.as_str());
    }
    if let Some(tool) = tool {
        span.record("gen_ai.tool.name", tool);
        span.record("gen_ai.operation.name", "execute_tool");
    }
    let mut carrier = HashMap::new();
    for key in ["traceparent", "tracestate"] {
        let value =
            context.meta.0.get(key).and_then(Value::as_str).map(str::to_owned).or_else(|| {
                context
                    .extensions
                    .get::<http::request::Parts>()
                    .and_then(|parts| parts.headers.get(key))
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            });
        if let Some(value) = value {
            carrier.insert(key.to_owned(), value);
        }
    }
    toolmesh_telemetry::set_parent_from_headers(&span, &carrier);
    span
}

impl ServerHandler for Front {
    fn get_info(&self) -> ServerConfig {
        let mut tools = ToolsCapability::default();
        tools.list_changed = Some(true);
        let mut capabilities = ServerCapabilities::default();
        capabilities.tools = Some(tools);
        let mut resources = ResourcesCapability::default();
        resources.list_changed = Some(true);
        // Subscriptions go to the upstream server that offers the resource.
        resources.subscribe = Some(true);
        capabilities.resources = Some(resources);
        let mut prompts = PromptsCapability::default();
        prompts.list_changed = Some(true);
        capabilities.prompts = Some(prompts);
        capabilities.completions = Some(Default::default());
        // Log messages of upstream servers' calls are relayed to sessions of the 2025
        // revisions (2026-07-28 has no logging).
        capabilities.logging = Some(Default::default());
        let mut info = ServerConfig::new(capabilities);
        info.server_info = Implementation::new("toolmesh", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(
            "toolmesh: the tools of a tool-execution mesh. Where only searchTools and callTool \
             are listed, search for a tool by what it should do, then call it through callTool."
                .into(),
        );
        info
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [rmcp::model::ProtocolVersion]> {
        Cow::Borrowed(rmcp::model::ProtocolVersion::KNOWN_VERSIONS)
    }

    /// Tells the client of a session `notifications/tools/list_changed` whenever the catalog
    /// changes, and `notifications/resources/list_changed` and `prompts/list_changed`
    /// whenever what the servers offer changes (a burst of changes once), until the client
    /// has gone.
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let mut heard = Listening::new(self.mesh.as_ref());
        let (mesh, subscriptions) = (self.mesh.clone(), self.subscriptions.clone());
        let peer = context.peer;
        tokio::spawn(async move {
            let _unsubscribe = Unsubscribe { mesh, subscriptions: subscriptions.clone() };
            let subscribed = |update: &crate::ResourceUpdate| {
                let subscriptions = subscriptions.lock().unwrap_or_else(PoisonError::into_inner);
                subscriptions.contains(&(update.server.clone(), update.uri.clone()))
            };
            loop {
                let told = tokio::select! {
                    heard = heard.next() => match heard {
                        None => return,
                        Some(Heard::Updated(update)) if subscribed(&update) => {
                            let param = ResourceUpdatedNotificationParam::new(update.uri);
                            peer.notify_resource_updated(param).await.is_ok()
                        }
                        Some(Heard::Updated(_)) => true,
                        Some(Heard::Tools) => peer.notify_tool_list_changed().await.is_ok(),
                        Some(Heard::Offers) => {
                            peer.notify_resource_list_changed().await.is_ok()
                                && peer.notify_prompt_list_changed().await.is_ok()
                        }
                    },
                    () = tokio::time::sleep(CLIENT_CHECK) => !peer.is_transport_closed(),
                };
                if !told {
                    return;
                }
            }
        });
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let caller = self.caller(&context)?;
        let span = server_span("tools/list", None, &caller, &context);
        let after = request.and_then(|r| r.cursor);
        let started = std::time::Instant::now();
        let page = self.mesh.list(&caller, after.as_deref()).instrument(span).await;
        let operation = Operation {
            method: "tools/list",
            tool: None,
            protocol_version: protocol_version(&context),
            error: page.as_ref().err().map(|failure| failure.kind),
        };
        operation.served(started.elapsed().as_secs_f64());
        let page = page.map_err(protocol_error)?;
        let mut result = ListToolsResult::with_all_items(page.tools.iter().map(tool).collect());
        result.next_cursor = page.next;
        Ok(result)
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let caller = self.caller(&context)?;
        let span = server_span("resources/subscribe", None, &caller, &context);
        let started = std::time::Instant::now();
        let subscribed = self.mesh.subscribe(&caller, &request.uri).instrument(span).await;
        let error = subscribed.as_ref().err().map(offer_error_type);
        served("resources/subscribe", &context, error, started);
        match subscribed {
            Ok(server) => {
                let key = (server, request.uri);
                let fresh = self.lock_subscriptions().insert(key.clone());
                // A repeated subscription is one: the server keeps the first.
                if !fresh {
                    let _ = self.mesh.unsubscribe(&key.0, &key.1).await;
                }
                Ok(())
            }
            Err(crate::OfferError::NotFound(message)) => {
                Err(ErrorData::new(McpCode::INVALID_PARAMS, message, None))
            }
            Err(error) => Err(offer_failure(error)),
        }
    }

    /// A 2026-07-28 client's notification stream accepts every category it asks for; the
    /// resources among them are subscribed to in [`Self::listen`] where the caller may read
    /// them (one it may not read, like one nobody offers, never changes).
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(requested.clone())
    }

    /// Serves one `subscriptions/listen` stream (2026-07-28): the list changes and resource
    /// updates it accepted, as a session hears them, until the client ends it. Its resource
    /// subscriptions end with it.
    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), ErrorData> {
        let caller = self.caller(subscription.request_context())?;
        let accepted = subscription.accepted().clone();
        let mut heard = Listening::new(self.mesh.as_ref());
        let held = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
        let _unsubscribe = Unsubscribe { mesh: self.mesh.clone(), subscriptions: held.clone() };
        for uri in accepted.resource_subscriptions.iter().flatten() {
            match self.mesh.subscribe(&caller, uri).await {
                Ok(server) => {
                    held.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert((server, uri.clone()));
                }
                Err(error) => {
                    tracing::debug!(%uri, %error, "a listened-to resource is not followed")
                }
            }
        }
        let sink = subscription.sink().clone();
        let wanted = |flag: Option<bool>| flag == Some(true);
        loop {
            let heard = tokio::select! {
                () = subscription.cancelled() => return Ok(()),
                heard = heard.next() => heard,
            };
            let sent = match heard {
                None => return Ok(()),
                Some(Heard::Updated(update)) => {
                    let key = (update.server, update.uri);
                    if !held.lock().unwrap_or_else(PoisonError::into_inner).contains(&key) {
                        continue;
                    }
                    sink.notify_resource_updated(key.1).await
                }
                Some(Heard::Tools) if wanted(accepted.tools_list_changed) => {
                    sink.notify_tool_list_changed().await
                }
                Some(Heard::Tools) => continue,
                Some(Heard::Offers) => {
                    let mut sent = Ok(());
                    if wanted(accepted.resources_list_changed) {
                        sent = sink.notify_resource_list_changed().await;
                    }
                    if sent.is_ok() && wanted(accepted.prompts_list_changed) {
                        sent = sink.notify_prompt_list_changed().await;
                    }
                    sent
                }
            };
            if sent.is_err() {
                // The stream has ended (or its client has gone).
                return Ok(());
            }
        }
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let caller = self.caller(&context)?;
        let span = server_span("resources/unsubscribe", None, &caller, &context);
        let started = std::time::Instant::now();
        let ours = {
            let mut subscriptions = self.lock_subscriptions();
            let ours = subscriptions.iter().find(|(_, uri)| *uri == request.uri).cloned();
            if let Some(key) = &ours {
                subscriptions.remove(key);
            }
            ours
        };
        // Unsubscribing from what the session did not subscribe to changes nothing.
        let ended = match ours {
            Some((server, uri)) => self.mesh.unsubscribe(&server, &uri).instrument(span).await,
            None => Ok(()),
        };
        served(
            "resources/unsubscribe",
            &context,
            ended.as_ref().err().map(offer_error_type),
            started,
        );
        ended.map_err(offer_failure)
    }

    async fn list_resources(
        &self,
        _: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let caller = self.caller(&context)?;
        let _span = server_span("resources/list", None, &caller, &context).entered();
        let started = std::time::Instant::now();
        let offered = self.mesh.offers(&caller);
        served("resources/list", &context, None, started);
        Ok(ListResourcesResult::with_all_items(offered.resources))
    }

    async fn list_resource_templates(
        &self,
        _: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let caller = self.caller(&context)?;
        let _span = server_span("resources/templates/list", None, &caller, &context).entered();
        let started = std::time::Instant::now();
        let offered = self.mesh.offers(&caller);
        served("resources/templates/list", &context, None, started);
        Ok(ListResourceTemplatesResult::with_all_items(offered.templates))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let caller = self.caller(&context)?;
        let span = server_span("resources/read", None, &caller, &context);
        let started = std::time::Instant::now();
        let read = self.mesh.read_resource(&caller, &request.uri).instrument(span).await;
        let error = read.as_ref().err().map(offer_error_type);
        served("resources/read", &context, error, started);
        match read {
            // An upstream server of an earlier revision sends no `resultType`; a client of
            // 2026-07-28 needs it (rmcp leaves it out again for earlier ones).
            Ok(mut result) => {
                result.result_type.get_or_insert(ResultType::COMPLETE);
                Ok(ReadResourceResponse::Complete(result))
            }
            // Nobody offers it, the caller may not see it, or the server that offers it says
            // it is not there: "not found" with the URI, as -32602 on 2026-07-28 (SEP-2164)
            // and -32002 before.
            Err(error)
                if matches!(error, crate::OfferError::NotFound(_))
                    || matches!(error.code(), ErrorCode::NotFound | ErrorCode::InvalidArgument) =>
            {
                let code = if in_session(&context) {
                    McpCode::RESOURCE_NOT_FOUND
                } else {
                    McpCode::INVALID_PARAMS
                };
                let message = match error {
                    crate::OfferError::NotFound(message) => message,
                    error => error.to_string(),
                };
                Err(ErrorData::new(code, message, Some(json!({"uri": request.uri}))))
            }
            Err(error) => Err(offer_failure(error)),
        }
    }

    async fn list_prompts(
        &self,
        _: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let caller = self.caller(&context)?;
        let _span = server_span("prompts/list", None, &caller, &context).entered();
        let started = std::time::Instant::now();
        let offered = self.mesh.offers(&caller);
        served("prompts/list", &context, None, started);
        Ok(ListPromptsResult::with_all_items(offered.prompts))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let caller = self.caller(&context)?;
        let span = server_span("prompts/get", None, &caller, &context);
        let started = std::time::Instant::now();
        let rounds = self.rounds(
            &context,
            || {
                Bound::new(
                    "prompts/get",
                    &request.name,
                    request.arguments.as_ref(),
                    &caller.principal,
                )
            },
            request.input_responses,
            request.request_state,
        )?;
        let asking = rounds.as_ref().map(|(_, rounds)| rounds);
        let got = (self.mesh.get_prompt(&caller, &request.name, request.arguments, asking))
            .instrument(span)
            .await;
        let error = got.as_ref().err().map(offer_error_type);
        served("prompts/get", &context, error, started);
        match (got, &rounds) {
            (Ok(GetPromptResponse::Complete(mut result)), _) => {
                result.result_type.get_or_insert(ResultType::COMPLETE);
                Ok(GetPromptResponse::Complete(result))
            }
            (Ok(GetPromptResponse::InputRequired(required)), Some((bound, _))) => {
                let requests = required.input_requests.unwrap_or_default();
                let required = self.input_required(bound, requests, required.request_state);
                Ok(GetPromptResponse::InputRequired(required))
            }
            (Ok(other), _) => Ok(other),
            (Err(crate::OfferError::NotFound(message)), _) => {
                Err(ErrorData::new(McpCode::INVALID_PARAMS, message, None))
            }
            (Err(error), _) => Err(offer_failure(error)),
        }
    }

    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let level = serde_json::to_value(request.level).unwrap_or_default();
        self.log_level.store(log_rank(level.as_str().unwrap_or_default()), Ordering::Relaxed);
        Ok(())
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let caller = self.caller(&context)?;
        let span = server_span("completion/complete", None, &caller, &context);
        let started = std::time::Instant::now();
        let completed = self.mesh.complete(&caller, request).instrument(span).await;
        let error = completed.as_ref().err().map(offer_error_type);
        served("completion/complete", &context, error, started);
        match completed {
            Ok(mut result) => {
                result.result_type.get_or_insert(ResultType::COMPLETE);
                Ok(result)
            }
            Err(crate::OfferError::NotFound(message)) => {
                Err(ErrorData::new(McpCode::INVALID_PARAMS, message, None))
            }
            Err(error) => Err(offer_failure(error)),
        }
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let caller = self.caller(&context)?;
        let name = request.name.to_string();
        let span = server_span("tools/call", Some(&name), &caller, &context);
        let started = std::time::Instant::now();
        let mut operation = Operation {
            method: "tools/call",
            tool: Some(&name),
            protocol_version: protocol_version(&context),
            error: None,
        };
        let progress = context.meta.get_progress_token();
        let client = context.peer.peer_info();
        // A session of the 2025 revisions has a channel back to the client; 2026-07-28 has
        // none (and no logging): what an upstream server asks its client is asked in input
        // rounds, and answered in the client's next request.
        let session = in_session(&context);
        let rounds = self.rounds(
            &context,
            || Bound::new("tools/call", &name, request.arguments.as_ref(), &caller.principal),
            request.input_responses,
            request.request_state,
        )?;
        let arguments = request.arguments.unwrap_or_default();
        let elicits = client.as_ref().is_some_and(|info| info.capabilities.elicitation.is_some());
        #[allow(deprecated)]
        let samples = client.as_ref().is_some_and(|info| info.capabilities.sampling.is_some());
        let logs = session;
        let (events, receiver) = EventSink::channel();
        let (events, rounds) = match rounds {
            Some((bound, rounds)) => {
                let (events, rounds) = events.with_input_rounds(rounds);
                (events, Some((bound, rounds)))
            }
            None => (events, None),
        };
        let (events, prompts) = if elicits && session {
            let (events, prompts) = events.with_elicitation();
            (events, Some(prompts))
        } else {
            (events, None)
        };
        // A session whose client can be asked is asked, as a form with one yes/no field, for
        // the approvals policy rules require (bound to the call as on StreamCallTool);
        // without one, a call that needs approval is refused.
        let (events, approvals) = if elicits && session {
            let (events, approvals) = events.with_approvals();
            (events, Some(approvals))
        } else {
            (events, None)
        };
        // A client that samples is asked for the completions upstream servers request.
        let (events, samplings) = if samples && session {
            let (events, samplings) = events.with_sampling();
            (events, Some(samplings))
        } else {
            (events, None)
        };
        let logs = logs.then(|| self.log_level.clone());
        let relay = Relay { peer: context.peer.clone(), progress, logs };
        let mut receiver = receiver;
        let call = self.mesh.call(&caller, name.clone(), arguments, events, context.ct.clone());
        let outcome = async {
            let relaying = relay.run(&mut receiver, Asked { prompts, approvals, samplings });
            tokio::pin!(relaying);
            tokio::select! {
                biased;
                outcome = call => outcome,
                () = &mut relaying => unreachable!("the relay runs until the call ends"),
            }
        }
        .instrument(span)
        .await;
        relay.flush(&mut receiver).await;
        operation.error = match &outcome {
            Ok(output) if output.is_error => Some("tool_error"),
            Ok(_) => None,
            Err(failure) if failure.kind == INPUT_REQUIRED => None,
            Err(failure) => Some(failure.kind),
        };
        operation.served(started.elapsed().as_secs_f64());
        // The call ended asking the client for input: the client answers in its next request.
        if let Err(failure) = &outcome
            && failure.kind == INPUT_REQUIRED
            && let Some((bound, rounds)) = &rounds
            && let Some(round) = rounds.asked()
        {
            let requests = crate::convert::input_requests(round.requests);
            let required = self.input_required(bound, requests, round.state);
            return Ok(CallToolResponse::InputRequired(required));
        }
        match outcome {
            Ok(output) => Ok(CallToolResponse::Complete(result(output))),
            Err(failure)
                if failure.code == ErrorCode::NotFound
                    || failure.kind == toolmesh_core::INVALID_INPUT_RESPONSES =>
            {
                Err(protocol_error(failure))
            }
            Err(failure) if failure.kind == MISSING_CLIENT_CAPABILITY => {
                Err(missing_capability(failure))
            }
            Err(failure) => Ok(CallToolResponse::Complete(failed(failure))),
        }
    }
}

impl Front {
    /// How a request (`bound` describes it) takes part in input rounds: `None` on a 2025
    /// session, which is asked during the call; for a 2026-07-28 request, what its client
    /// can answer and the answers it carries, with the upstream server's state unwrapped
    /// from toolmesh's. A state toolmesh did not issue for this request is refused (-32602).
    fn rounds(
        &self,
        context: &RequestContext<RoleServer>,
        bound: impl FnOnce() -> Bound,
        responses: Option<rmcp::model::InputResponses>,
        state: Option<String>,
    ) -> Result<Option<(Bound, InputRounds)>, ErrorData> {
        if in_session(context) {
            return Ok(None);
        }
        let bound = bound();
        let state = match state {
            Some(state) => self.rounds.unwrap(&state, &bound).map_err(|error| {
                tracing::debug!(%error, "MCP request with a request state refused");
                ErrorData::new(McpCode::INVALID_PARAMS, "Invalid or expired requestState", None)
            })?,
            None => None,
        };
        let answers = (responses.is_some() || state.is_some()).then(|| InputAnswers {
            responses: responses.unwrap_or_default().into_iter().collect(),
            state,
        });
        Ok(Some((bound, InputRounds::new(answerable(context), answers))))
    }

    /// The `InputRequiredResult` of a round an upstream server asked for, its state wrapped
    /// in toolmesh's for the request `bound`.
    fn input_required(
        &self,
        bound: &Bound,
        requests: rmcp::model::InputRequests,
        state: Option<String>,
    ) -> InputRequiredResult {
        InputRequiredResult::new(Some(requests), Some(self.rounds.wrap(bound, state)))
    }
}

/// Whether a request belongs to a session of a 2025 revision, which has a channel back to
/// the client for questions and log messages; a 2026-07-28 request has none.
fn in_session(context: &RequestContext<RoleServer>) -> bool {
    context
        .peer
        .peer_info()
        .is_some_and(|info| info.protocol_version < rmcp::model::ProtocolVersion::V_2026_07_28)
}

/// What a 2026-07-28 client said it can answer in this request (elicitation, sampling,
/// roots), as the client capabilities toolmesh states for it to upstream servers.
#[allow(deprecated)]
fn answerable(context: &RequestContext<RoleServer>) -> Value {
    let declared = context
        .meta
        .client_capabilities()
        .or_else(|| context.peer.peer_info().map(|client| client.capabilities.clone()));
    let mut capabilities = rmcp::model::ClientCapabilities::default();
    if let Some(declared) = declared {
        capabilities.elicitation = declared.elicitation;
        capabilities.sampling = declared.sampling;
        capabilities.roots = declared.roots;
    }
    serde_json::to_value(capabilities).unwrap_or_else(|_| json!({}))
}

/// Forwards a call's progress (when the client asked for it with a token), log messages
/// (from the least severity the session hears; none on 2026-07-28, which has no logging)
/// and questions (when the client can answer them) to the client's session.
struct Relay {
    peer: Peer<RoleServer>,
    progress: Option<ProgressToken>,
    logs: Option<Arc<AtomicUsize>>,
}

impl Relay {
    // Logging is deprecated (SEP-2577), but sessions of the 2025 revisions still have it.
    #[allow(deprecated)]
    async fn deliver(&self, event: CallEvent) {
        match (event, self.progress.as_ref()) {
            (CallEvent::Progress { progress: done, total, message }, Some(token)) => {
                let mut param = ProgressNotificationParam::new(token.clone(), done);
                param.total = total;
                param.message = Some(message).filter(|m| !m.is_empty());
                let _ = self.peer.notify_progress(param).await;
            }
            (CallEvent::Log { level, logger, data }, _)
                if self
                    .logs
                    .as_ref()
                    .is_some_and(|least| log_rank(&level) >= least.load(Ordering::Relaxed)) =>
            {
                let mut param = json!({"level": level, "data": data});
                if !logger.is_empty() {
                    param["logger"] = json!(logger);
                }
                if let Ok(param) = serde_json::from_value(param) {
                    let _ = self.peer.notify_logging_message(param).await;
                }
            }
            _ => {}
        }
    }

    /// Relays events and asks questions until the call ends (the caller stops polling).
    async fn run(&self, events: &mut EventReceiver, mut asked: Asked) {
        loop {
            tokio::select! {
                event = events.recv() => self.deliver(event).await,
                Some(prompt) = next(&mut asked.prompts) => {
                    let answer = ask(&self.peer, &prompt.elicitation).await;
                    let _ = prompt.reply.send(answer);
                }
                Some(approval) = next(&mut asked.approvals) => {
                    let answer = ask_approval(&self.peer, &approval.approval).await;
                    let _ = approval.reply.send(answer);
                }
                Some(sampling) = next(&mut asked.samplings) => {
                    let answer = sample(&self.peer, sampling.sampling).await;
                    let _ = sampling.reply.send(answer);
                }
            }
        }
    }

    /// Delivers what the call sent just before it ended, before its result goes out.
    async fn flush(&self, events: &mut EventReceiver) {
        while let Some(event) = events.try_recv() {
            self.deliver(event).await;
        }
    }
}

/// The questions a call may ask the client, each while the client can answer them.
struct Asked {
    prompts: Option<tokio::sync::mpsc::Receiver<ElicitationPrompt>>,
    approvals: Option<tokio::sync::mpsc::Receiver<ApprovalPrompt>>,
    samplings: Option<tokio::sync::mpsc::Receiver<SamplingPrompt>>,
}

/// The next question of `asked`; pending forever when the client cannot be asked.
async fn next<T>(asked: &mut Option<tokio::sync::mpsc::Receiver<T>>) -> Option<T> {
    match asked.as_mut() {
        Some(asked) => asked.recv().await,
        None => std::future::pending().await,
    }
}

/// Asks the person behind the client to approve a call a policy rule holds back, as a form
/// with one yes/no field (and an optional note). Only an accepted form that says yes
/// approves; the answer names the approval it was asked for, which binds it to this call.
async fn ask_approval(peer: &Peer<RoleServer>, approval: &Approval) -> ApprovalAnswer {
    let message = format!(
        "Approve the call of {} with {}? Policy rule {} asks: {}",
        approval.tool, approval.arguments_json, approval.rule, approval.reason
    );
    let question = toolmesh_core::Elicitation {
        message,
        requested_schema: json!({
            "type": "object",
            "properties": {
                "approve": {"type": "boolean", "title": "Approve this call", "default": false},
                "note": {"type": "string", "title": "Note for the audit log"},
            },
            "required": ["approve"],
        }),
        url: None,
    };
    let answer = ask(peer, &question).await;
    let (approved, note) = match answer {
        ElicitationAnswer::Accept(form) => (
            form.get("approve").and_then(Value::as_bool).unwrap_or(false),
            form.get("note").and_then(Value::as_str).unwrap_or_default().to_owned(),
        ),
        ElicitationAnswer::Decline => (false, "declined".to_owned()),
        ElicitationAnswer::Cancel => (false, "dismissed".to_owned()),
    };
    ApprovalAnswer { id: approval.id.clone(), approved, note }
}

/// Asks the client a tool's question.
async fn ask(
    peer: &Peer<RoleServer>,
    elicitation: &toolmesh_core::Elicitation,
) -> ElicitationAnswer {
    let params = match &elicitation.url {
        Some(url) => json!({
            "mode": "url",
            "message": elicitation.message,
            "url": url,
            "elicitationId": uuid_like(),
        }),
        None => json!({
            "mode": "form",
            "message": elicitation.message,
            "requestedSchema": elicitation.requested_schema,
        }),
    };
    let Ok(params) = serde_json::from_value::<ElicitRequestParams>(params) else {
        return ElicitationAnswer::Cancel;
    };
    match peer.create_elicitation(params).await {
        Ok(answer) => match answer.action {
            ElicitationAction::Accept => {
                ElicitationAnswer::Accept(answer.content.unwrap_or(Value::Null))
            }
            ElicitationAction::Decline => ElicitationAnswer::Decline,
            _ => ElicitationAnswer::Cancel,
        },
        Err(_) => ElicitationAnswer::Cancel,
    }
}

/// Asks the client's model for the completion an upstream server requested.
#[allow(deprecated)]
async fn sample(peer: &Peer<RoleServer>, sampling: toolmesh_core::Sampling) -> SamplingAnswer {
    let params = serde_json::from_value(sampling.params)
        .map_err(|e| format!("the sampling request is not one MCP clients take: {e}"))?;
    let result = peer.create_message(params).await.map_err(|error| match error {
        rmcp::ServiceError::McpError(error) => error.message.into_owned(),
        other => format!("the client did not sample: {other}"),
    })?;
    serde_json::to_value(result).map_err(|e| e.to_string())
}

/// An id for a URL elicitation.
fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{now:x}-{:x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A refusal of the request itself: a JSON-RPC error (a tool the caller cannot see).
/// Records one served request other than a call in `mcp.server.operation.duration`.
fn served(
    method: &'static str,
    context: &RequestContext<RoleServer>,
    error: Option<&'static str>,
    started: std::time::Instant,
) {
    let operation =
        Operation { method, tool: None, protocol_version: protocol_version(context), error };
    operation.served(started.elapsed().as_secs_f64());
}

/// `error.type` of a failed read or prompt.
fn offer_error_type(error: &crate::OfferError) -> &'static str {
    match error {
        crate::OfferError::NotFound(_) => "not_found",
        crate::OfferError::Unavailable { .. } => "unavailable",
        crate::OfferError::Timeout { .. } => "timeout",
        crate::OfferError::Failed { .. } => "upstream_error",
    }
}

fn offer_failure(error: crate::OfferError) -> ErrorData {
    let code = match error.code() {
        ErrorCode::InvalidArgument => McpCode::INVALID_PARAMS,
        _ => McpCode::INTERNAL_ERROR,
    };
    ErrorData::new(code, error.to_string(), Some(json!({"kind": offer_error_type(&error)})))
}

/// A call an upstream server refused for a capability the client did not declare: MCP's
/// own error for it (-32021, HTTP 400), naming the capabilities.
fn missing_capability(failure: CallFailure) -> ErrorData {
    let required = match &failure.detail {
        toolmesh_core::FailureDetail::Info { metadata, .. } => metadata
            .get("requiredCapabilities")
            .and_then(|json| serde_json::from_str(json).ok())
            .unwrap_or_else(|| json!({})),
        _ => json!({}),
    };
    ErrorData::new(
        McpCode::MISSING_REQUIRED_CLIENT_CAPABILITY,
        failure.message,
        Some(json!({"requiredCapabilities": required})),
    )
}

fn protocol_error(failure: CallFailure) -> ErrorData {
    let code = match failure.code {
        ErrorCode::NotFound | ErrorCode::InvalidArgument => McpCode::INVALID_PARAMS,
        _ => McpCode::INTERNAL_ERROR,
    };
    ErrorData::new(code, failure.message, Some(json!({"kind": failure.kind})))
}

/// A call that failed, as a tool result the model reads: the message, and the kind in
/// `_meta` for programs.
fn failed(failure: CallFailure) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(failure.message)]);
    let mut meta = rmcp::model::MetaObject::default();
    meta.0.insert(
        "io.toolmesh/error".into(),
        json!({"kind": failure.kind, "code": format!("{:?}", failure.code)}),
    );
    result.meta = Some(meta);
    result
}

/// The MCP form of a tool's definition.
pub(crate) fn tool(spec: &ToolSpec) -> Tool {
    let mut tool = json!({
        "name": spec.name,
        "description": spec.description,
        "inputSchema": spec.input_schema,
    });
    if !spec.title.is_empty() {
        tool["title"] = json!(spec.title);
    }
    if let Some(schema) = &spec.output_schema {
        tool["outputSchema"] = (**schema).clone();
    }
    let a = &spec.annotations;
    let mut annotations = Map::new();
    for (key, value) in [
        ("readOnlyHint", a.read_only),
        ("destructiveHint", a.destructive),
        ("idempotentHint", a.idempotent),
        ("openWorldHint", a.open_world),
    ] {
        if let Some(value) = value {
            annotations.insert(key.into(), json!(value));
        }
    }
    if !annotations.is_empty() {
        tool["annotations"] = Value::Object(annotations);
    }
    serde_json::from_value(tool).unwrap_or_else(|_| {
        // An input schema that is not an object: the tool is still listed and callable.
        Tool::new(spec.name.clone(), spec.description.clone(), Arc::new(Map::new()))
    })
}

/// The MCP form of a tool's output.
pub(crate) fn result(output: ToolOutput) -> CallToolResult {
    let content = output.content.into_iter().map(block).collect();
    let mut result = if output.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    result.structured_content = output.structured;
    result
}

fn block(part: ContentPart) -> ContentBlock {
    use base64::Engine as _;
    match part {
        ContentPart::Text(text) => ContentBlock::text(text),
        // What an upstream MCP server returned that toolmesh has no part for (an embedded
        // resource, a newer kind) travels as its MCP form and is given back as it was.
        ContentPart::Json(value) => match value.get("type").and_then(Value::as_str) {
            Some(_) => serde_json::from_value(value.clone())
                .unwrap_or_else(|_| ContentBlock::text(value.to_string())),
            None => ContentBlock::text(value.to_string()),
        },
        ContentPart::Media { mime_type, data } => {
            let data = base64::engine::general_purpose::STANDARD.encode(&data);
            if mime_type.starts_with("audio/") {
                ContentBlock::audio(data, mime_type)
            } else if mime_type.starts_with("image/") {
                ContentBlock::image(data, mime_type)
            } else {
                let blob = json!({"type": "resource", "resource": {
                    "uri": "data:", "mimeType": mime_type, "blob": data}});
                serde_json::from_value(blob).unwrap_or_else(|_| ContentBlock::text(""))
            }
        }
        ContentPart::Resource { uri, mime_type, body } => {
            let mut resource = json!({"uri": uri});
            if !mime_type.is_empty() {
                resource["mimeType"] = json!(mime_type);
            }
            match body {
                ResourceBody::Text(text) => resource["text"] = json!(text),
                ResourceBody::Blob(data) => {
                    resource["blob"] =
                        json!(base64::engine::general_purpose::STANDARD.encode(&data));
                }
            }
            let embedded = json!({"type": "resource", "resource": resource});
            serde_json::from_value(embedded).unwrap_or_else(|_| ContentBlock::text(uri))
        }
        ContentPart::ResourceLink { uri, name, description, mime_type } => {
            let mut link = json!({"type": "resource_link", "uri": uri, "name": name});
            if !description.is_empty() {
                link["description"] = json!(description);
            }
            if !mime_type.is_empty() {
                link["mimeType"] = json!(mime_type);
            }
            serde_json::from_value(link).unwrap_or_else(|_| ContentBlock::text(uri))
        }
    }
}
