//! The steps of one call, each a plain function of what it needs, in the order
//! [`Router::run`](crate::Router) takes them: the nesting depth, resolve and admit, the
//! arguments' size, schema validation, the policy's decision, limits, the deadline, and
//! the shape of the result. The approval wait and dispatch with retries have files of
//! their own.

use std::{sync::Arc, time::Duration};

use serde_json::Value;
use toolmesh_core::{CallFailure, ContentPart, ErrorCode, EventSink, ResourceBody, ToolOutput};
use toolmesh_policy::{Decision, Permit, ResultLimit, Scope, Visible};
use toolmesh_registry::{RegistryHandle, ToolEntry};
use toolmesh_telemetry::names;
use tracing::info_span;

use crate::{
    Admission, CALL_TOOL, CallRequest, Door, RouterError, RouterOptions, call_tool_not_found,
    error::{approval_required, arguments_too_large, limit_refusal, too_deep},
    is_meta, policy_refusal,
};

/// The call's nesting depth, refused beyond `max`.
pub(crate) fn check_depth(request: &CallRequest, max: u32) -> Result<u32, RouterError> {
    let depth = request.nesting.as_ref().map_or(0, |n| n.depth);
    if depth > max {
        return Err(too_deep(&request.name, request.nesting.as_ref(), max));
    }
    Ok(depth)
}

/// Resolves the tool (once per call: here, or by `callTool`, which hands its `entry`
/// over) and admits it: a tool the caller may not see is answered as one that does not
/// exist, and the routing profile must let it through `door`. Returns the entry and, for a
/// tool under the policy, what the caller may do with it; a hiding rule is noted in
/// `decision`.
pub(crate) fn resolve(
    registry: &RegistryHandle,
    admission: &Admission,
    scope: &Scope,
    entry: Option<Arc<ToolEntry>>,
    door: Door,
    request: &CallRequest,
    decision: &mut Option<Decision>,
) -> Result<(Arc<ToolEntry>, Option<Visible>), RouterError> {
    let entry = match entry {
        Some(entry) => entry,
        None => registry
            .resolve(&request.name)
            .ok_or_else(|| RouterError::NotFound(request.name.clone()))?,
    };
    let visible = if is_meta(&entry.spec) {
        None
    } else {
        match scope.visible(&entry.spec) {
            Ok(visible) => Some(visible),
            Err(rule) => {
                *decision = Some(Decision::Hidden { rule });
                return Err(match door {
                    Door::Direct => RouterError::NotFound(request.name.clone()),
                    Door::CallTool(_) => {
                        RouterError::Refused(Box::new(call_tool_not_found(&request.name)))
                    }
                });
            }
        }
    };
    admission.admit(&request.profile, door, &entry.spec)?;
    Ok((entry, visible))
}

/// Refuses arguments larger than the policy's `limits.max_argument_bytes`.
pub(crate) fn check_size(scope: &Scope, request: &CallRequest) -> Result<(), RouterError> {
    match scope.max_argument_bytes() {
        Some(max) if request.arguments_json.len() > max => {
            Err(arguments_too_large(&request.name, request.arguments_json.len(), max))
        }
        _ => Ok(()),
    }
}

/// Parses the arguments (empty text is `{}`) and checks them against the tool's input
/// schema. A `null` given for an optional argument whose schema has no room for it is taken
/// as the argument left out (as models and MCP clients mean it), so the tool never sees it.
pub(crate) fn validate(entry: &ToolEntry, request: &CallRequest) -> Result<Value, RouterError> {
    let _span = info_span!(names::SPAN_VALIDATE).entered();
    let arguments: Value = if request.arguments_json.trim().is_empty() {
        Value::Object(Default::default())
    } else {
        serde_json::from_str(&request.arguments_json)
            .map_err(|error| RouterError::MalformedArguments(error.to_string()))?
    };
    let violations = entry.check_arguments(&arguments);
    if violations.is_empty() {
        return Ok(arguments);
    }
    if let Some(left_out) = without_refused_nulls(&entry.spec.input_schema, &arguments, &violations)
        && entry.check_arguments(&left_out).is_empty()
    {
        return Ok(left_out);
    }
    Err(RouterError::InvalidArguments { tool: request.name.clone(), violations })
}

/// `arguments` without the top-level `null`s the schema refused (`violations` name them by
/// path) of properties it does not require; `None` when there are none.
fn without_refused_nulls(
    schema: &Value,
    arguments: &Value,
    violations: &[toolmesh_registry::SchemaViolation],
) -> Option<Value> {
    let given = arguments.as_object()?;
    let required = schema.get("required").and_then(Value::as_array);
    let refused = |name: &str, value: &Value| {
        value.is_null()
            && !required.is_some_and(|r| r.iter().any(|n| n == name))
            && violations.iter().any(|v| v.path.strip_prefix('/') == Some(name))
    };
    if !given.iter().any(|(name, value)| refused(name, value)) {
        return None;
    }
    let kept = given.iter().filter(|(name, value)| !refused(name, value));
    Some(Value::Object(kept.map(|(name, value)| (name.clone(), value.clone())).collect()))
}

/// The policy's decision on this call with these arguments, noted in `decision`: a refusal,
/// or a call that needs approval where none can be asked (a unary call), ends here.
pub(crate) fn decide(
    scope: &Scope,
    visible: &Visible,
    entry: &ToolEntry,
    arguments: &Value,
    events: &EventSink,
    request: &CallRequest,
    decision: &mut Option<Decision>,
) -> Result<(), RouterError> {
    if !scope.policy().is_active() {
        return Ok(());
    }
    let decided = scope.decide_visible(visible, &entry.spec, arguments);
    let refusal = match &decided {
        Decision::Refused { rule, reason } => Some(policy_refusal(&request.name, rule, reason)),
        Decision::Approve { rule, reason } if !events.can_approve() => {
            Some(approval_required(&request.name, rule, reason))
        }
        _ => None,
    };
    *decision = Some(decided);
    refusal.map_or(Ok(()), Err)
}

/// A place within the rate and concurrency limits, held while the call runs. `callTool`'s
/// own call is not counted; the call it makes is.
pub(crate) fn take_permit(scope: &Scope, entry: &ToolEntry) -> Result<Option<Permit>, RouterError> {
    match entry.spec.name.as_str() {
        CALL_TOOL if is_meta(&entry.spec) => Ok(None),
        _ => scope.admit(&entry.spec).map(Some).map_err(limit_refusal),
    }
}

/// The call's timeout: the sooner of the client's deadline and the tool's timeout; the
/// default when neither is set; never beyond the server's cap.
pub(crate) fn timeout(
    options: &RouterOptions,
    request: &CallRequest,
    entry: &ToolEntry,
) -> Duration {
    request
        .client_timeout
        .map(before_client_deadline)
        .into_iter()
        .chain(entry.spec.timeout)
        .min()
        .unwrap_or(options.default_timeout)
        .min(options.max_timeout)
}

/// The result as the caller gets it: held to the policy's result limit, and an output
/// that does not match the tool's output schema turned into an error result naming why.
pub(crate) fn shape(
    output: ToolOutput,
    scope: &Scope,
    entry: &ToolEntry,
    tool: &str,
) -> Result<ToolOutput, RouterError> {
    let output = match scope.result_limit(&entry.spec) {
        Some(limit) => bounded(output, limit, tool)?,
        None => output,
    };
    if output.is_error {
        return Ok(output);
    }
    let violations = entry.check_output(output.structured.as_ref());
    if violations.is_empty() {
        return Ok(output);
    }
    let list = violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
    Ok(ToolOutput {
        content: vec![ContentPart::Text(format!(
            "the output of tool {tool} does not match its output schema: {list}"
        ))],
        structured: None,
        is_error: true,
    })
}

/// Holds `output` to `limit`: a larger result is refused, or cut to the limit and marked so
/// when the tool's limit says to cut.
fn bounded(output: ToolOutput, limit: ResultLimit, tool: &str) -> Result<ToolOutput, RouterError> {
    let part_bytes = |part: &ContentPart| match part {
        ContentPart::Text(text) => text.len(),
        ContentPart::Json(value) => value.to_string().len(),
        ContentPart::Media { data, .. } => data.len(),
        ContentPart::ResourceLink { uri, name, description, mime_type } => {
            uri.len() + name.len() + description.len() + mime_type.len()
        }
        ContentPart::Resource { uri, mime_type, body } => {
            uri.len()
                + mime_type.len()
                + match body {
                    ResourceBody::Text(text) => text.len(),
                    ResourceBody::Blob(data) => data.len(),
                }
        }
    };
    let structured = output.structured.as_ref().map_or(0, |v| v.to_string().len());
    let total = output.content.iter().map(part_bytes).sum::<usize>() + structured;
    if total <= limit.max_bytes {
        return Ok(output);
    }
    if !limit.truncate {
        return Err(RouterError::Refused(Box::new(CallFailure::new(
            ErrorCode::ResourceExhausted,
            "result_too_large",
            format!(
                "the result of {tool} is {total} bytes, more than the {} a call may return \
                 (policy.limits); the tool ran",
                limit.max_bytes
            ),
        ))));
    }
    // Parts are kept in order while they fit; the first that does not is cut (text) or
    // left out, and so is everything after it.
    let mut left = limit.max_bytes;
    let mut content = Vec::new();
    for part in output.content {
        let text = match part {
            ContentPart::Text(text) => text,
            ContentPart::Json(value) => value.to_string(),
            other => {
                let bytes = part_bytes(&other);
                if bytes > left {
                    break;
                }
                left -= bytes;
                content.push(other);
                continue;
            }
        };
        if text.len() <= left {
            left -= text.len();
            content.push(ContentPart::Text(text));
            continue;
        }
        let mut end = left;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        content.push(ContentPart::Text(text[..end].to_owned()));
        break;
    }
    content.push(ContentPart::Text(format!(
        "\n[truncated by toolmesh: the result was {total} bytes, of which {} are kept]",
        limit.max_bytes
    )));
    // A structured result cannot be cut and stay valid: it is kept only whole.
    let structured = output.structured.filter(|_| structured <= left);
    Ok(ToolOutput { content, structured, is_error: output.is_error })
}

/// The share of a client's deadline that the router keeps back. tonic's server enforces
/// `grpc-timeout` itself and answers CANCELLED when it passes; finishing a little earlier
/// lets the client see DEADLINE_EXCEEDED, with the tool named, as the gRPC spec intends.
fn before_client_deadline(timeout: Duration) -> Duration {
    let margin = (timeout / 20).clamp(Duration::from_millis(5), Duration::from_millis(100));
    timeout.saturating_sub(margin)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;
    use toolmesh_core::{
        Backend, BackendError, CallContext, ContentPart, Nesting, ToolOutput, ToolSource, ToolSpec,
    };
    use toolmesh_policy::{Policy, ResultLimit};

    use super::*;

    struct Nothing;

    #[async_trait::async_trait]
    impl Backend for Nothing {
        async fn call(&self, _: CallContext, _: Value) -> Result<ToolOutput, BackendError> {
            Ok(ToolOutput::default())
        }
    }

    fn entry(schema: Value, output: Option<Value>, timeout: Option<Duration>) -> ToolEntry {
        let mut spec = ToolSpec::new("count", "Counts.", schema, ToolSource::local("test"));
        spec.validate_output = output.is_some();
        spec.output_schema = output.map(Arc::new);
        spec.timeout = timeout;
        ToolEntry::new(spec, Arc::new(Nothing)).unwrap()
    }

    fn request(arguments: &str) -> CallRequest {
        CallRequest { name: "count".into(), arguments_json: arguments.into(), ..Default::default() }
    }

    fn open_scope() -> Scope {
        let config = toolmesh_config::load_str(None, &Default::default()).unwrap();
        let routing: crate::RoutingConfig = config.get().unwrap();
        let admission = Admission::new(&routing, Arc::new(Policy::open()));
        admission.scope(toolmesh_core::open_principal())
    }

    #[test]
    fn a_call_nested_deeper_than_the_maximum_is_refused_naming_its_parent() {
        let mut nested = request("");
        assert_eq!(check_depth(&nested, 3).unwrap(), 0);
        nested.nesting = Some(Nesting { depth: 3, parent_call_id: "parent-1".into() });
        assert_eq!(check_depth(&nested, 3).unwrap(), 3);
        nested.nesting = Some(Nesting { depth: 4, parent_call_id: "parent-1".into() });
        let refused = check_depth(&nested, 3).unwrap_err().failure();
        assert_eq!(
            (refused.code, refused.kind),
            (ErrorCode::FailedPrecondition, "call_depth_exceeded")
        );
        assert!(
            refused.message.contains("parent-1") && refused.message.contains("3"),
            "{refused:?}"
        );
    }

    #[test]
    fn arguments_are_parsed_and_checked_against_the_input_schema() {
        let schema = json!({
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
        });
        let tool = entry(schema, None, None);
        assert_eq!(validate(&tool, &request(r#"{"n": 2}"#)).unwrap(), json!({"n": 2}));
        assert!(matches!(
            validate(&tool, &request("{not json")),
            Err(RouterError::MalformedArguments(_))
        ));
        let Err(RouterError::InvalidArguments { tool: name, violations }) =
            validate(&tool, &request(r#"{"n": "two"}"#))
        else {
            panic!("a string is not an integer");
        };
        assert_eq!((name.as_str(), violations.len()), ("count", 1));
        // Empty arguments are `{}`, which this schema refuses for the missing `n`.
        assert!(matches!(
            validate(&tool, &request("  ")),
            Err(RouterError::InvalidArguments { .. })
        ));
    }

    #[test]
    fn a_null_optional_argument_is_left_out_unless_the_schema_takes_null() {
        let schema = json!({
            "type": "object",
            "properties": {
                "region": {"type": "string"},
                "verbose": {"type": "boolean"},
                "note": {"type": ["string", "null"]},
            },
            "required": ["region"],
        });
        let tool = entry(schema, None, None);
        let given = r#"{"region": "eu", "verbose": null, "note": null}"#;
        assert_eq!(
            validate(&tool, &request(given)).unwrap(),
            json!({"region": "eu", "note": null})
        );
        // A required argument's null stays an error, as does any other violation.
        assert!(matches!(
            validate(&tool, &request(r#"{"region": null}"#)),
            Err(RouterError::InvalidArguments { .. })
        ));
        let Err(RouterError::InvalidArguments { violations, .. }) =
            validate(&tool, &request(r#"{"region": "eu", "verbose": null, "note": 3}"#))
        else {
            panic!("3 is no string");
        };
        assert_eq!(violations.len(), 2, "both violations of the call as given: {violations:?}");
    }

    #[test]
    fn the_timeout_is_the_soonest_of_client_and_tool_else_the_default_within_the_cap() {
        let options = RouterOptions {
            default_timeout: Duration::from_secs(60),
            max_timeout: Duration::from_secs(600),
            ..Default::default()
        };
        let plain = entry(json!({"type": "object"}), None, None);
        let slow = entry(json!({"type": "object"}), None, Some(Duration::from_secs(900)));
        let quick = entry(json!({"type": "object"}), None, Some(Duration::from_secs(5)));
        let mut call = request("");
        assert_eq!(timeout(&options, &call, &plain), Duration::from_secs(60));
        assert_eq!(timeout(&options, &call, &slow), Duration::from_secs(600), "capped");
        assert_eq!(timeout(&options, &call, &quick), Duration::from_secs(5));
        // The client's deadline, less the margin that lets it see DEADLINE_EXCEEDED.
        call.client_timeout = Some(Duration::from_secs(2));
        assert_eq!(timeout(&options, &call, &quick), Duration::from_millis(1900));
        assert_eq!(timeout(&options, &call, &plain), Duration::from_millis(1900));
    }

    #[test]
    fn a_result_over_its_limit_is_refused_or_cut_at_a_character() {
        let output = || ToolOutput {
            content: vec![ContentPart::Text("ééééé".into()), ContentPart::Text("rest".into())],
            structured: Some(json!({"long": "x".repeat(40)})),
            is_error: false,
        };
        let refused = bounded(output(), ResultLimit { max_bytes: 5, truncate: false }, "count");
        let failure = refused.unwrap_err().failure();
        assert_eq!(
            (failure.code, failure.kind),
            (ErrorCode::ResourceExhausted, "result_too_large")
        );

        let cut = bounded(output(), ResultLimit { max_bytes: 5, truncate: true }, "count").unwrap();
        let ContentPart::Text(first) = &cut.content[0] else { panic!("text") };
        assert_eq!(first, "éé", "cut at a character boundary, within 5 bytes");
        let ContentPart::Text(note) = cut.content.last().unwrap() else { panic!("text") };
        assert!(note.contains("truncated by toolmesh"), "{note}");
        assert_eq!(cut.structured, None, "a structured result is kept only whole");

        let whole = bounded(output(), ResultLimit { max_bytes: 1 << 20, truncate: false }, "count");
        assert_eq!(whole.unwrap(), output());
    }

    #[test]
    fn an_output_that_does_not_match_its_schema_becomes_an_error_result() {
        let schema =
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
        let tool = entry(json!({"type": "object"}), Some(schema), None);
        let scope = open_scope();
        let good = ToolOutput { structured: Some(json!({"n": 1})), ..Default::default() };
        assert_eq!(shape(good.clone(), &scope, &tool, "count").unwrap(), good);
        let bad = ToolOutput { structured: Some(json!({"n": "one"})), ..Default::default() };
        let shaped = shape(bad, &scope, &tool, "count").unwrap();
        assert!(shaped.is_error);
        let ContentPart::Text(text) = &shaped.content[0] else { panic!("text") };
        assert!(text.contains("does not match its output schema"), "{text}");
        // A tool's own error result is passed on as it is.
        let failed = ToolOutput { is_error: true, ..Default::default() };
        assert_eq!(shape(failed.clone(), &scope, &tool, "count").unwrap(), failed);
    }
}
