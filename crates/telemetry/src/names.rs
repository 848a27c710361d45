//! Span names and attribute keys, following the OpenTelemetry semantic conventions for
//! generative AI (`gen_ai.*`) and RPC (`rpc.*`), plus toolmesh's own (`toolmesh.*`).

/// Operation name of a tool execution (`gen_ai.operation.name`).
pub const OP_EXECUTE_TOOL: &str = "execute_tool";
/// `gen_ai.operation.name`.
pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
/// `gen_ai.tool.name`.
pub const GEN_AI_TOOL_NAME: &str = "gen_ai.tool.name";
/// `gen_ai.tool.call.id`.
pub const GEN_AI_TOOL_CALL_ID: &str = "gen_ai.tool.call.id";
/// `gen_ai.tool.type`.
pub const GEN_AI_TOOL_TYPE: &str = "gen_ai.tool.type";
/// `error.type`.
pub const ERROR_TYPE: &str = "error.type";
/// `rpc.system`.
pub const RPC_SYSTEM: &str = "rpc.system";
/// `rpc.service`.
pub const RPC_SERVICE: &str = "rpc.service";
/// `rpc.method`.
pub const RPC_METHOD: &str = "rpc.method";
/// `toolmesh.source.kind`: where the tool runs (local, remote, mcp, knowledge).
pub const TOOLMESH_SOURCE_KIND: &str = "toolmesh.source.kind";
/// `toolmesh.source.name`: the server, pool or collection the tool comes from.
pub const TOOLMESH_SOURCE_NAME: &str = "toolmesh.source.name";
/// `toolmesh.session.id`: the agent session of a call.
pub const TOOLMESH_SESSION_ID: &str = "toolmesh.session.id";

/// Span resolving a tool name against the catalog.
pub const SPAN_RESOLVE: &str = "toolmesh.resolve";
/// Span validating arguments against the input schema.
pub const SPAN_VALIDATE: &str = "toolmesh.validate";
/// Span handing a call to its backend.
pub const SPAN_DISPATCH: &str = "toolmesh.dispatch";
/// Span of a local worker running a tool.
pub const SPAN_WORKER_EXECUTE: &str = "toolmesh.worker.execute";
/// Span of a remote worker process running a call it was sent: a child of the router's
/// `toolmesh.dispatch` span, in the router's trace.
pub const SPAN_REMOTE_EXECUTE: &str = "toolmesh.remote.execute";

/// Gauge: 1 while a part of a provider can take calls (an MCP server connected, or idle
/// and lazy; the worker pool; the search index), 0 otherwise, and 0 once it is gone;
/// attributes `toolmesh.source.kind` and `toolmesh.source.name`.
pub const METRIC_SOURCE_UP: &str = "toolmesh.source.up";

/// Counter: requests refused as unauthenticated, by `toolmesh.auth.reason`.
pub const METRIC_AUTH_REFUSALS: &str = "toolmesh.auth.refusals";
/// Why a request was refused as unauthenticated.
pub const TOOLMESH_AUTH_REASON: &str = "toolmesh.auth.reason";
/// The principal a call runs as (OpenTelemetry's `enduser.id`).
pub const ENDUSER_ID: &str = "enduser.id";
/// Counter: failed connection attempts and lost connections of an MCP server; attributes
/// `mcp.server` and `error.type` (`connect` or `disconnect`).
pub const METRIC_MCP_CONNECTION_FAILURES: &str = "toolmesh.mcp.connection.failures";
/// Counter: tools of an MCP server whose definition changed since toolmesh pinned it;
/// attributes `mcp.server` and `action` (`warn`, `block`, `accepted`).
pub const METRIC_MCP_DEFINITION_CHANGES: &str = "toolmesh.mcp.definition_changes";
/// Histogram, seconds: MCP requests toolmesh's MCP endpoint served, as the OpenTelemetry
/// MCP conventions name it; attributes `mcp.method.name`, `mcp.protocol.version`,
/// `gen_ai.tool.name` (calls) and `error.type` (failures).
pub const METRIC_MCP_SERVER_OPERATION_DURATION: &str = "mcp.server.operation.duration";
/// Histogram, seconds: MCP requests toolmesh sent to an upstream server; attributes as
/// [`METRIC_MCP_SERVER_OPERATION_DURATION`], plus `mcp.server` and `network.transport`.
pub const METRIC_MCP_CLIENT_OPERATION_DURATION: &str = "mcp.client.operation.duration";
/// Histogram: how long calls took, in seconds, each one counted once; attributes
/// `toolmesh.call.outcome`, `toolmesh.source.kind`, `toolmesh.source.name` and
/// `gen_ai.tool.name` (when the tool was found: a name no tool has is not a label) and
/// `error.type` (when the call failed, `tool_error` when the tool reported a failure).
pub const METRIC_CALL_DURATION: &str = "toolmesh.call.duration";
/// Gauge: the local worker pool's workers (`toolmesh.pool.workers`), those running a call
/// (`toolmesh.pool.running`) and the calls admitted that wait for one (`toolmesh.pool.queued`).
pub const METRIC_POOL_WORKERS: &str = "toolmesh.pool.workers";
/// See [`METRIC_POOL_WORKERS`].
pub const METRIC_POOL_RUNNING: &str = "toolmesh.pool.running";
/// See [`METRIC_POOL_WORKERS`].
pub const METRIC_POOL_QUEUED: &str = "toolmesh.pool.queued";
/// Histogram, seconds: how long calls admitted to the local pool waited for a worker.
pub const METRIC_POOL_WAIT: &str = "toolmesh.pool.wait";
/// Gauge: calls of a remote pool (`toolmesh.source.name`) waiting for a free slot on one of
/// its workers (schedule-to-start); what Kubernetes scales workers on.
pub const METRIC_REMOTE_PENDING: &str = "toolmesh.remote.pending";
/// Gauge: calls of a remote pool running on its workers.
pub const METRIC_REMOTE_IN_FLIGHT: &str = "toolmesh.remote.in_flight";
/// Histogram, seconds: how long a remote call waited for a worker's slot, by pool.
pub const METRIC_REMOTE_SCHEDULE_TO_START: &str = "toolmesh.remote.schedule_to_start";
/// Gauge: calls in flight on an MCP server (`mcp.server`).
pub const METRIC_MCP_IN_FLIGHT: &str = "toolmesh.mcp.in_flight";
/// `toolmesh.call.outcome`: `ok`, `tool_error` (the tool reported a failure) or `error`.
pub const TOOLMESH_CALL_OUTCOME: &str = "toolmesh.call.outcome";
/// The bucket bounds of every duration histogram, in seconds: from 50 µs (a local tool) to
/// five minutes (a long tool), so that percentiles can be read at either end.
pub const DURATION_BUCKETS: [f64; 22] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 180.0, 300.0,
];
/// Counter: repetitions of calls whose connection broke (of read-only and idempotent
/// tools only); attributes `toolmesh.source.kind`, `toolmesh.source.name` and
/// `gen_ai.tool.name`.
pub const METRIC_CALL_RETRIES: &str = "toolmesh.call.retries";
/// `toolmesh.call.retries`: how many times a call was repeated after its connection broke.
pub const TOOLMESH_CALL_RETRIES: &str = "toolmesh.call.retries";
/// `toolmesh.call.attempt`: the attempt a dispatch span carries, 1 for the first.
pub const TOOLMESH_CALL_ATTEMPT: &str = "toolmesh.call.attempt";
/// `mcp.server`: the configured name of an MCP server.
pub const MCP_SERVER: &str = "mcp.server";

/// `toolmesh.profile`: the routing profile of a meta-tool call.
pub const TOOLMESH_PROFILE: &str = "toolmesh.profile";
/// `toolmesh.search.query`: what searchTools was asked.
pub const TOOLMESH_SEARCH_QUERY: &str = "toolmesh.search.query";
/// `toolmesh.search.results`: how many tools searchTools returned.
pub const TOOLMESH_SEARCH_RESULTS: &str = "toolmesh.search.results";
/// `toolmesh.search.in_result`: whether the tool callTool called was in the linked search
/// result.
pub const TOOLMESH_SEARCH_IN_RESULT: &str = "toolmesh.search.in_result";
/// `toolmesh.search.rank`: the 1-based rank at which the linked search returned the tool.
pub const TOOLMESH_SEARCH_RANK: &str = "toolmesh.search.rank";
/// `toolmesh.exposed`: the tool callTool called is exposed by the profile (visible without
/// a search).
pub const TOOLMESH_EXPOSED: &str = "toolmesh.exposed";
/// Counter: callTool calls; attributes `toolmesh.profile`, `toolmesh.search.in_result`,
/// `toolmesh.exposed`.
pub const METRIC_CALL_TOOL_CALLS: &str = "toolmesh.call_tool.calls";
/// Histogram: the rank at which the linked search returned the tool callTool called;
/// attribute `toolmesh.profile`.
pub const METRIC_CALL_TOOL_SEARCH_RANK: &str = "toolmesh.call_tool.search_rank";

/// Counter: tool policy decisions, by `toolmesh.policy.decision` (`allow`, `deny`, `hide`)
/// and `toolmesh.policy.stage` (`call`, `discovery`).
pub const METRIC_POLICY_DECISIONS: &str = "toolmesh.policy.decisions";
/// The decision of the tool policy: `allow`, `deny` or `hide`.
pub const TOOLMESH_POLICY_DECISION: &str = "toolmesh.policy.decision";
/// The policy rule that decided a call.
pub const TOOLMESH_POLICY_RULE: &str = "toolmesh.policy.rule";
/// Where the policy decided: `call` or `discovery`.
pub const TOOLMESH_POLICY_STAGE: &str = "toolmesh.policy.stage";
/// How deep a call is nested (0: a caller's own call).
pub const TOOLMESH_CALL_DEPTH: &str = "toolmesh.call.depth";
/// The call id of the call whose tool made this call.
pub const TOOLMESH_CALL_PARENT_ID: &str = "toolmesh.call.parent_id";
