//! Dispatch with retries: the call handed to its backend within the deadline, repeated
//! after a broken connection where that is safe, and the backend's answer settled into
//! the call's outcome.

use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;
use toolmesh_core::{BackendError, CallContext, RetryPolicy, ToolOutput};
use toolmesh_registry::ToolEntry;
use toolmesh_telemetry::names;
use tracing::{Instrument, Span, info_span, warn};

use crate::{CallRequest, RouterError};

/// What one dispatch came to: the last attempt's outcome (or the deadline) and the number
/// of attempts.
pub(crate) type Dispatched =
    (Result<Result<ToolOutput, BackendError>, tokio::time::error::Elapsed>, u32);

/// Hands the call to its backend, within the deadline; a call whose connection broke
/// is repeated while the tool is read-only or idempotent (by its trusted annotations,
/// [`ToolSpec::hints`](toolmesh_core::ToolSpec::hints)), the policy allows another
/// attempt, and its wait ends before the deadline. The repetitions are recorded on the
/// call's span (`toolmesh.call.retries`) and counted. Returns the outcome of the last
/// attempt and the number of attempts.
pub(crate) async fn dispatch(
    policy: RetryPolicy,
    entry: &ToolEntry,
    ctx: CallContext,
    arguments: Value,
    deadline: Instant,
) -> Dispatched {
    let hints = entry.spec.hints();
    let repeatable = policy.attempts.get() > 1 && hints.repeatable();
    // Arguments are kept for another attempt only where there can be one.
    let mut kept = repeatable.then(|| arguments.clone());
    let mut this = arguments;
    let mut attempt = 1;
    let call = Span::current();
    loop {
        let span = info_span!(names::SPAN_DISPATCH, { names::TOOLMESH_CALL_ATTEMPT } = attempt);
        let dispatch =
            entry.backend.call(CallContext { attempt, ..ctx.clone() }, this).instrument(span);
        let outcome = tokio::time::timeout_at(deadline, dispatch).await;
        let Ok(Err(error)) = &outcome else { return (outcome, attempt) };
        if !error.retryable(&hints) || attempt >= policy.attempts.get() {
            return (outcome, attempt);
        }
        let wait = policy.wait(attempt + 1);
        if Instant::now() + wait >= deadline {
            return (outcome, attempt);
        }
        // The last attempt takes the kept arguments themselves.
        let next = if attempt + 1 < policy.attempts.get() { kept.clone() } else { kept.take() };
        let Some(next) = next else { return (outcome, attempt) };
        warn!(
            tool = %ctx.tool, call_id = %ctx.call_id, attempt, %error,
            wait_ms = wait.as_millis() as u64,
            "the call's connection broke; repeating it (the tool is read-only or idempotent)"
        );
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = ctx.cancel.cancelled() => return (Ok(Err(BackendError::Cancelled)), attempt),
        }
        crate::metrics::call_retried(&entry.spec.source, &ctx.tool);
        call.record(names::TOOLMESH_CALL_RETRIES, attempt);
        this = next;
        attempt += 1;
    }
}

/// The outcome of a dispatch as the caller learns it: the output, or the error naming the
/// tool and the call (the deadline, a cancellation, a connection lost after `attempts`).
pub(crate) fn settle(
    dispatched: Dispatched,
    entry: &ToolEntry,
    request: &CallRequest,
    call_id: &str,
    timeout: Duration,
    deadline: Instant,
) -> Result<ToolOutput, RouterError> {
    let (outcome, attempts) = dispatched;
    let deadline_error = || RouterError::DeadlineExceeded {
        tool: request.name.clone(),
        call_id: call_id.to_owned(),
        timeout_ms: timeout.as_millis(),
    };
    match outcome {
        Err(_elapsed) => Err(deadline_error()),
        Ok(Err(BackendError::Cancelled)) | Ok(Err(BackendError::DeadlineExceeded(_)))
            if Instant::now() >= deadline =>
        {
            Err(deadline_error())
        }
        Ok(Err(BackendError::Cancelled)) => {
            Err(RouterError::Cancelled { tool: request.name.clone(), call_id: call_id.to_owned() })
        }
        Ok(Err(BackendError::Lost { backend, reason })) => Err(RouterError::ConnectionLost {
            tool: request.name.clone(),
            call_id: call_id.to_owned(),
            cause: format!("the connection to {backend} was lost during the call: {reason}"),
            attempts,
            repeatable: entry.spec.hints().repeatable(),
        }),
        Ok(Err(error)) => Err(error.into()),
        Ok(Ok(output)) => Ok(output),
    }
}

#[cfg(test)]
mod tests {
    use std::{
        num::NonZeroU32,
        sync::{
            Arc,
            atomic::{AtomicU32, Ordering},
        },
    };

    use serde_json::json;
    use tokio_util::sync::CancellationToken;
    use toolmesh_core::{Backend, ContentPart, ToolSource, ToolSpec};

    use super::*;

    /// Loses its connection on the first `lost` attempts, then answers.
    struct Flaky {
        lost: u32,
        attempts: AtomicU32,
    }

    #[async_trait::async_trait]
    impl Backend for Flaky {
        async fn call(&self, ctx: CallContext, _: Value) -> Result<ToolOutput, BackendError> {
            let attempt = self.attempts.fetch_add(1, Ordering::SeqCst) + 1;
            assert_eq!(ctx.attempt, attempt, "each attempt is numbered");
            if attempt <= self.lost {
                return Err(BackendError::Lost {
                    backend: "worker w1".into(),
                    reason: "reset".into(),
                });
            }
            Ok(ToolOutput { content: vec![ContentPart::Text("done".into())], ..Default::default() })
        }
    }

    fn entry(lost: u32, read_only: bool) -> (ToolEntry, Arc<Flaky>) {
        let backend = Arc::new(Flaky { lost, attempts: AtomicU32::new(0) });
        let mut spec = ToolSpec::new(
            "fetch",
            "Fetches.",
            json!({"type": "object"}),
            ToolSource::local("test"),
        );
        spec.annotations.read_only = Some(read_only);
        (ToolEntry::new(spec, backend.clone()).unwrap(), backend)
    }

    fn context(deadline: Instant) -> CallContext {
        CallContext {
            call_id: "c1".into(),
            session_id: None,
            profile: None,
            tool: "fetch".into(),
            cancel: CancellationToken::new(),
            deadline,
            events: Default::default(),
            attempt: 1,
            principal: toolmesh_core::open_principal(),
            depth: 0,
        }
    }

    fn retry(attempts: u32) -> RetryPolicy {
        RetryPolicy {
            attempts: NonZeroU32::new(attempts).unwrap(),
            backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(2),
        }
    }

    #[tokio::test]
    async fn a_lost_connection_is_repeated_only_for_read_only_tools_within_the_attempts() {
        let deadline = Instant::now() + Duration::from_secs(10);
        let (tool, backend) = entry(2, true);
        let (outcome, attempts) =
            dispatch(retry(3), &tool, context(deadline), json!({}), deadline).await;
        assert!(matches!(outcome, Ok(Ok(_))), "the third attempt answered");
        assert_eq!((attempts, backend.attempts.load(Ordering::SeqCst)), (3, 3));

        // One loss more than the attempts allow: the last loss is the outcome.
        let (tool, backend) = entry(3, true);
        let (outcome, attempts) =
            dispatch(retry(3), &tool, context(deadline), json!({}), deadline).await;
        assert!(matches!(outcome, Ok(Err(BackendError::Lost { .. }))));
        assert_eq!((attempts, backend.attempts.load(Ordering::SeqCst)), (3, 3));

        // A tool with side effects is never repeated.
        let (tool, backend) = entry(1, false);
        let (outcome, attempts) =
            dispatch(retry(3), &tool, context(deadline), json!({}), deadline).await;
        assert!(matches!(outcome, Ok(Err(BackendError::Lost { .. }))));
        assert_eq!((attempts, backend.attempts.load(Ordering::SeqCst)), (1, 1));

        // Nor is one that only claims to be read-only, from a source not trusted with it.
        let (mut tool, backend) = entry(1, true);
        tool.spec.annotations_trusted = false;
        let (outcome, attempts) =
            dispatch(retry(3), &tool, context(deadline), json!({}), deadline).await;
        assert!(matches!(outcome, Ok(Err(BackendError::Lost { .. }))));
        assert_eq!((attempts, backend.attempts.load(Ordering::SeqCst)), (1, 1));
    }

    #[tokio::test]
    async fn no_attempt_is_made_whose_wait_would_end_after_the_deadline() {
        let deadline = Instant::now() + Duration::from_millis(50);
        let (tool, backend) = entry(1, true);
        let slow = RetryPolicy {
            backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(5),
            ..retry(3)
        };
        let (outcome, attempts) =
            dispatch(slow, &tool, context(deadline), json!({}), deadline).await;
        assert!(matches!(outcome, Ok(Err(BackendError::Lost { .. }))));
        assert_eq!((attempts, backend.attempts.load(Ordering::SeqCst)), (1, 1));
    }

    #[tokio::test]
    async fn settle_names_the_tool_and_call_of_every_failure() {
        let (tool, _) = entry(0, true);
        let request = CallRequest { name: "fetch".into(), ..Default::default() };
        let later = Instant::now() + Duration::from_secs(60);
        let timeout = Duration::from_secs(60);
        let settled =
            |outcome, deadline| settle((outcome, 2), &tool, &request, "c1", timeout, deadline);

        let lost = settled(
            Ok(Err(BackendError::Lost { backend: "w1".into(), reason: "reset".into() })),
            later,
        );
        let Err(RouterError::ConnectionLost { attempts, repeatable, cause, .. }) = lost else {
            panic!("a lost connection: {lost:?}");
        };
        assert!(attempts == 2 && repeatable && cause.contains("w1"), "{cause}");
        assert!(matches!(
            settled(Ok(Err(BackendError::Cancelled)), later),
            Err(RouterError::Cancelled { .. })
        ));
        // Cancelled because the deadline passed: the deadline is what the caller learns.
        let passed = Instant::now();
        assert!(matches!(
            settled(Ok(Err(BackendError::Cancelled)), passed),
            Err(RouterError::DeadlineExceeded { timeout_ms: 60_000, .. })
        ));
        assert_eq!(settled(Ok(Ok(ToolOutput::default())), later).unwrap(), ToolOutput::default());
    }
}
