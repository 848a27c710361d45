use std::{collections::VecDeque, sync::Arc, time::Duration};

use serde_json::Value;
use tokio::{
    sync::{Notify, mpsc, oneshot},
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use crate::ContentPart;

/// Something a running tool reports before its result.
#[derive(Debug, Clone, PartialEq)]
pub enum CallEvent {
    /// Progress so far, increasing with every event.
    Progress {
        /// Progress so far.
        progress: f64,
        /// The total, when known.
        total: Option<f64>,
        /// A human-readable message; may be empty.
        message: String,
    },
    /// A partial output, before the result.
    Partial(ContentPart),
    /// A log message the tool (an MCP server's `notifications/message`) sent while it ran.
    Log {
        /// Its severity, as MCP names it (`debug`, `info`, `notice`, `warning`, `error`,
        /// `critical`, `alert`, `emergency`).
        level: String,
        /// The logger that wrote it; may be empty.
        logger: String,
        /// What was logged.
        data: Value,
    },
}

/// A question a tool (or the server behind it) asks the caller during a call.
#[derive(Debug, Clone, PartialEq)]
pub struct Elicitation {
    /// What is asked, for a person.
    pub message: String,
    /// JSON Schema of the answer's content (an object of primitive properties); `Null` for
    /// a URL elicitation.
    pub requested_schema: Value,
    /// For a URL elicitation: the page the person should open.
    pub url: Option<String>,
}

/// The caller's answer to an [`Elicitation`].
#[derive(Debug, Clone, PartialEq)]
pub enum ElicitationAnswer {
    /// The person answered with this content.
    Accept(Value),
    /// The person declined to answer; the call goes on.
    Decline,
    /// The person dismissed the question (also the answer when nobody can answer).
    Cancel,
}

/// An [`Elicitation`] on its way to the caller, with the port for the answer.
#[derive(Debug)]
pub struct ElicitationPrompt {
    /// The question.
    pub elicitation: Elicitation,
    /// Where the answer goes.
    pub reply: oneshot::Sender<ElicitationAnswer>,
}

/// A request of an MCP server for a model's completion (`sampling/createMessage`) during a
/// call, relayed to a caller that said it can sample. toolmesh has no model of its own and
/// does not read the request: `params` are MCP's `CreateMessageRequestParams` (messages,
/// system prompt, model preferences, token limit, tools) as the server sent them.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// MCP's `CreateMessageRequestParams`, as JSON.
    pub params: Value,
}

/// The caller's answer to a [`Sampling`] request: MCP's `CreateMessageResult` as JSON (role,
/// content, model, stop reason), or why the caller did not sample.
pub type SamplingAnswer = Result<Value, String>;

/// A [`Sampling`] request on its way to the caller, with the port for the answer.
#[derive(Debug)]
pub struct SamplingPrompt {
    /// The request.
    pub sampling: Sampling,
    /// Where the answer goes.
    pub reply: oneshot::Sender<SamplingAnswer>,
}

/// A request for a person's consent to one call, which waits for it. Its id binds it to
/// that call (principal, tool, a digest of the arguments, the policy version, an expiry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    /// Names the request; the answer repeats it.
    pub id: String,
    /// The tool to be called.
    pub tool: String,
    /// Its arguments, as JSON.
    pub arguments_json: String,
    /// The policy rule that asks for consent.
    pub rule: String,
    /// Why, for the person.
    pub reason: String,
    /// After this the request is refused.
    pub expires_at: std::time::SystemTime,
}

/// The answer to an [`Approval`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalAnswer {
    /// The id of the approval answered.
    pub id: String,
    /// Whether the call may go ahead.
    pub approved: bool,
    /// A note from the person, for the audit log and a refusal.
    pub note: String,
}

/// An [`Approval`] on its way to the caller, with the port for the answer.
#[derive(Debug)]
pub struct ApprovalPrompt {
    /// The request.
    pub approval: Approval,
    /// Where the answer goes.
    pub reply: oneshot::Sender<ApprovalAnswer>,
}

/// Input an MCP server asked for, to be answered by the caller in a request of its own: the
/// 2026-07-28 input rounds, passed on to a caller that answers them itself (an MCP client of
/// toolmesh's MCP endpoint, which keeps no connection open between requests).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct InputRound {
    /// The server's input requests by key (each `{"method", "params"}`, as the server sent
    /// them).
    pub requests: serde_json::Map<String, Value>,
    /// The server's opaque state for the next round.
    pub state: Option<String>,
}

/// The caller's answers to an [`InputRound`], sent with the call again.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct InputAnswers {
    /// The answers by the key of the request each answers.
    pub responses: serde_json::Map<String, Value>,
    /// The server's state, as the round carried it.
    pub state: Option<String>,
}

/// How a caller that answers input in rounds takes part in a call: what it can answer, its
/// answers to the last round, and the round the call ends with when the server asks again.
#[derive(Debug, Default)]
pub struct InputRounds {
    /// The caller's client capabilities (MCP's `ClientCapabilities`: `elicitation`,
    /// `sampling`, `roots`), which tell a server what it may ask.
    pub capabilities: Value,
    /// The answers this request carries.
    pub answers: Option<InputAnswers>,
    asked: std::sync::Mutex<Option<InputRound>>,
}

impl InputRounds {
    /// Returns the rounds of a caller with these `capabilities`, whose request carries
    /// `answers`.
    pub fn new(capabilities: Value, answers: Option<InputAnswers>) -> Self {
        InputRounds { capabilities, answers, asked: Default::default() }
    }

    /// Records the round the call ends with.
    pub fn ask(&self, round: InputRound) {
        *self.asked.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(round);
    }

    /// Takes the round the call ended with, if it ended asking for input.
    pub fn asked(&self) -> Option<InputRound> {
        self.asked.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }
}

/// The [`CallFailure::kind`](crate::CallFailure) of a call that ended asking its caller for
/// input ([`InputRounds::asked`] holds what): not a failure of the tool.
pub const INPUT_REQUIRED: &str = "input_required";

/// The [`CallFailure::kind`](crate::CallFailure) of a call whose caller's answers to an
/// input round the MCP server refused as invalid.
pub const INVALID_INPUT_RESPONSES: &str = "invalid_input_responses";

/// The [`CallFailure::kind`](crate::CallFailure) of a call an MCP server refused because
/// the caller did not declare a client capability it needs; the failure's
/// [`FailureDetail::Info`](crate::FailureDetail) names them (`requiredCapabilities`, MCP's
/// `ClientCapabilities` as JSON).
pub const MISSING_CLIENT_CAPABILITY: &str = "missing_client_capability";

/// Events a stream holds for a reader that lags: partial outputs wait (the tool's
/// `partial` does not return) once this many are queued.
const QUEUED_EVENTS: usize = 16;

/// The queue between a running tool and the reader of its stream.
#[derive(Debug, Default)]
struct EventQueue {
    state: std::sync::Mutex<QueueState>,
    /// Told when an event is queued.
    readable: Notify,
    /// Told when room is made or the reader goes.
    writable: Notify,
}

#[derive(Debug, Default)]
struct QueueState {
    events: VecDeque<CallEvent>,
    /// The reader is gone: events are dropped and nothing waits.
    closed: bool,
}

impl EventQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // A panic while holding the lock leaves a queue of whole events: still usable.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Where a running tool sends its [`CallEvent`]s and [`Elicitation`]s.
///
/// Memory stays bounded however fast a tool reports and however slowly its caller reads:
/// progress never blocks the tool and is coalesced (the latest report replaces an unread
/// one), while a partial output waits for room once [`QUEUED_EVENTS`] are unread, which
/// slows the tool to its reader's pace. A caller that does not listen (a unary call) has a
/// disabled sink, and once the reader has gone every report is a no-op.
#[derive(Debug, Clone, Default)]
pub struct EventSink {
    queue: Option<Arc<EventQueue>>,
    elicit: Option<mpsc::Sender<ElicitationPrompt>>,
    approve: Option<mpsc::Sender<ApprovalPrompt>>,
    sample: Option<mpsc::Sender<SamplingPrompt>>,
    rounds: Option<Arc<InputRounds>>,
}

/// The reading end of an [`EventSink`]; dropping it tells the tool nobody listens.
#[derive(Debug)]
pub struct EventReceiver {
    queue: Arc<EventQueue>,
}

impl EventReceiver {
    /// Returns the next event, waiting for one. Cancel-safe: an event is taken only when
    /// it is returned.
    pub async fn recv(&mut self) -> CallEvent {
        let queue = self.queue.clone();
        loop {
            let queued = queue.readable.notified();
            if let Some(event) = self.try_recv() {
                return event;
            }
            queued.await;
        }
    }

    /// Returns the next event if one is queued.
    pub fn try_recv(&mut self) -> Option<CallEvent> {
        let event = self.queue.lock().events.pop_front();
        if event.is_some() {
            self.queue.writable.notify_waiters();
        }
        event
    }
}

impl Drop for EventReceiver {
    fn drop(&mut self) {
        let mut state = self.queue.lock();
        state.closed = true;
        state.events.clear();
        drop(state);
        self.queue.writable.notify_waiters();
    }
}

impl EventSink {
    /// Returns a sink whose events arrive, in order, on the returned receiver.
    pub fn channel() -> (Self, EventReceiver) {
        let queue = Arc::new(EventQueue::default());
        let sink = EventSink { queue: Some(queue.clone()), ..Self::disabled() };
        (sink, EventReceiver { queue })
    }

    /// Returns this sink able to ask the caller questions, which arrive on the receiver.
    pub fn with_elicitation(mut self) -> (Self, mpsc::Receiver<ElicitationPrompt>) {
        let (tx, rx) = mpsc::channel(8);
        self.elicit = Some(tx);
        (self, rx)
    }

    /// Returns this sink able to ask the caller for approvals, which arrive on the receiver.
    pub fn with_approvals(mut self) -> (Self, mpsc::Receiver<ApprovalPrompt>) {
        let (tx, rx) = mpsc::channel(4);
        self.approve = Some(tx);
        (self, rx)
    }

    /// Returns whether the caller can answer approvals (a streamed call).
    pub fn can_approve(&self) -> bool {
        self.approve.as_ref().is_some_and(|tx| !tx.is_closed())
    }

    /// Asks the caller to approve; `None` when the caller cannot answer or has gone, or no
    /// answer came within `timeout`.
    pub async fn approve(&self, approval: Approval, timeout: Duration) -> Option<ApprovalAnswer> {
        let tx = self.approve.as_ref()?;
        let (reply, answer) = oneshot::channel();
        let asked = async {
            tx.send(ApprovalPrompt { approval, reply }).await.ok()?;
            answer.await.ok()
        };
        tokio::time::timeout(timeout, asked).await.ok().flatten()
    }

    /// Returns this sink able to ask the caller for samplings, which arrive on the receiver.
    pub fn with_sampling(mut self) -> (Self, mpsc::Receiver<SamplingPrompt>) {
        let (tx, rx) = mpsc::channel(4);
        self.sample = Some(tx);
        (self, rx)
    }

    /// Returns this sink for a caller that answers input in rounds of its own requests
    /// (see [`InputRounds`]); the caller keeps the returned handle to read the round a call
    /// ends with.
    pub fn with_input_rounds(mut self, rounds: InputRounds) -> (Self, Arc<InputRounds>) {
        let rounds = Arc::new(rounds);
        self.rounds = Some(rounds.clone());
        (self, rounds)
    }

    /// The input rounds of a caller that answers input in rounds of its own requests.
    pub fn input_rounds(&self) -> Option<&InputRounds> {
        self.rounds.as_deref()
    }

    /// Returns whether the caller said it can sample.
    pub fn can_sample(&self) -> bool {
        self.sample.as_ref().is_some_and(|tx| !tx.is_closed())
    }

    /// Asks the caller for a completion; an error says why there is none: the caller cannot
    /// sample, has gone, or did not answer within `timeout`.
    pub async fn sample(&self, sampling: Sampling, timeout: Duration) -> SamplingAnswer {
        let Some(tx) = &self.sample else {
            return Err("the caller of this call does not sample".into());
        };
        let (reply, answer) = oneshot::channel();
        let asked = async {
            tx.send(SamplingPrompt { sampling, reply })
                .await
                .map_err(|_| "the caller of this call has gone".to_owned())?;
            answer.await.map_err(|_| "the caller of this call did not answer".to_owned())?
        };
        match tokio::time::timeout(timeout, asked).await {
            Ok(answer) => answer,
            Err(_) => Err(format!("the caller did not answer within {} ms", timeout.as_millis())),
        }
    }

    /// Returns a sink that drops every event.
    pub fn disabled() -> Self {
        EventSink { queue: None, elicit: None, approve: None, sample: None, rounds: None }
    }

    /// Returns whether the caller can answer elicitations.
    pub fn can_elicit(&self) -> bool {
        self.elicit.as_ref().is_some_and(|tx| !tx.is_closed())
    }

    /// Asks the caller; returns [`ElicitationAnswer::Cancel`] when the caller cannot answer
    /// (a unary call), has gone, or does not answer within `timeout`, so a tool never waits
    /// forever for a person.
    pub async fn elicit(&self, elicitation: Elicitation, timeout: Duration) -> ElicitationAnswer {
        let Some(tx) = &self.elicit else { return ElicitationAnswer::Cancel };
        let (reply, answer) = oneshot::channel();
        let asked = async {
            tx.send(ElicitationPrompt { elicitation, reply }).await.ok()?;
            answer.await.ok()
        };
        tokio::time::timeout(timeout, asked)
            .await
            .ok()
            .flatten()
            .unwrap_or(ElicitationAnswer::Cancel)
    }

    /// Returns whether anyone listens to this sink.
    pub fn is_enabled(&self) -> bool {
        self.queue.as_ref().is_some_and(|queue| !queue.lock().closed)
    }

    /// Reports progress; never waits. An unread progress report at the end of the queue is
    /// replaced by this one: a lagging reader sees the latest.
    pub fn progress(&self, progress: f64, total: Option<f64>, message: impl Into<String>) {
        let Some(queue) = &self.queue else { return };
        let event = CallEvent::Progress { progress, total, message: message.into() };
        let mut state = queue.lock();
        if state.closed {
            return;
        }
        match state.events.back_mut() {
            Some(last @ CallEvent::Progress { .. }) => *last = event,
            _ => state.events.push_back(event),
        }
        drop(state);
        queue.readable.notify_one();
    }

    /// Reports a log message; never waits. One that finds [`QUEUED_EVENTS`] unread is
    /// dropped: a reader that lags loses log lines, not the tool's time.
    pub fn log(&self, level: impl Into<String>, logger: impl Into<String>, data: Value) {
        let Some(queue) = &self.queue else { return };
        let mut state = queue.lock();
        if state.closed || state.events.len() >= QUEUED_EVENTS {
            return;
        }
        state.events.push_back(CallEvent::Log { level: level.into(), logger: logger.into(), data });
        drop(state);
        queue.readable.notify_one();
    }

    /// Reports a partial output, waiting while the reader has [`QUEUED_EVENTS`] unread;
    /// returns at once when nobody listens.
    pub async fn partial(&self, part: ContentPart) {
        let Some(queue) = &self.queue else { return };
        loop {
            let room = queue.writable.notified();
            tokio::pin!(room);
            // Registered before the check, so that room made in between is not missed.
            room.as_mut().enable();
            {
                let mut state = queue.lock();
                if state.closed {
                    return;
                }
                if state.events.len() < QUEUED_EVENTS {
                    state.events.push_back(CallEvent::Partial(part));
                    drop(state);
                    queue.readable.notify_one();
                    return;
                }
            }
            room.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress_values(receiver: &mut EventReceiver) -> Vec<f64> {
        std::iter::from_fn(|| receiver.try_recv())
            .map(|event| match event {
                CallEvent::Progress { progress, .. } => progress,
                CallEvent::Partial(_) => -1.0,
                CallEvent::Log { .. } => -2.0,
            })
            .collect()
    }

    #[tokio::test]
    async fn a_sampling_reaches_only_a_caller_that_samples_and_its_answer_comes_back() {
        let sampling = || Sampling { params: serde_json::json!({"maxTokens": 5}) };
        let second = Duration::from_secs(1);
        let (unary, _) = EventSink::channel();
        assert!(!unary.can_sample());
        assert!(unary.sample(sampling(), second).await.unwrap_err().contains("does not sample"));

        let (sink, mut asked) = EventSink::disabled().with_sampling();
        assert!(sink.can_sample());
        let answering = tokio::spawn(async move {
            let prompt = asked.recv().await.unwrap();
            assert_eq!(prompt.sampling.params["maxTokens"], 5);
            prompt.reply.send(Ok(serde_json::json!({"model": "m"}))).unwrap();
            asked
        });
        assert_eq!(sink.sample(sampling(), second).await.unwrap()["model"], "m");
        // Nobody answers in time: the server learns so instead of waiting.
        let _asked = answering.await.unwrap();
        let late = sink.sample(sampling(), Duration::from_millis(20)).await.unwrap_err();
        assert!(late.contains("did not answer within 20 ms"), "{late}");
    }

    #[tokio::test]
    async fn progress_for_a_lagging_reader_is_coalesced_in_order() {
        let (sink, mut receiver) = EventSink::channel();
        for step in 1..=100_000 {
            sink.progress(f64::from(step), None, "x".repeat(2048));
        }
        assert_eq!(progress_values(&mut receiver), [100_000.0], "only the latest is kept");

        sink.progress(1.0, None, "");
        sink.partial(ContentPart::Text("a".into())).await;
        sink.progress(2.0, None, "");
        sink.progress(3.0, None, "");
        assert_eq!(progress_values(&mut receiver), [1.0, -1.0, 3.0], "order is kept");
    }

    #[tokio::test]
    async fn partials_wait_for_the_reader_and_stop_waiting_when_it_goes() {
        let (sink, mut receiver) = EventSink::channel();
        for i in 0..QUEUED_EVENTS {
            sink.partial(ContentPart::Text(i.to_string())).await;
        }
        let blocked = {
            let sink = sink.clone();
            tokio::spawn(async move { sink.partial(ContentPart::Text("more".into())).await })
        };
        tokio::task::yield_now().await;
        assert!(!blocked.is_finished(), "a full queue holds the tool back");
        // Progress still never waits, and the queue holds at most one more event.
        sink.progress(1.0, None, "");
        sink.progress(2.0, None, "");
        assert!(receiver.try_recv().is_some() && receiver.try_recv().is_some());
        blocked.await.unwrap();
        // 16 partials, the coalesced progress and the waiting partial, two of them read.
        assert_eq!(std::iter::from_fn(|| receiver.try_recv()).count(), QUEUED_EVENTS);

        for i in 0..QUEUED_EVENTS {
            sink.partial(ContentPart::Text(i.to_string())).await;
        }
        let waiting = {
            let sink = sink.clone();
            tokio::spawn(async move { sink.partial(ContentPart::Text("more".into())).await })
        };
        drop(receiver);
        waiting.await.unwrap();
        assert!(!sink.is_enabled());
        sink.partial(ContentPart::Text("ignored".into())).await;
    }
}

/// Everything a backend needs to know about one call besides its arguments.
#[derive(Debug, Clone)]
pub struct CallContext {
    /// The call id, unique per call.
    pub call_id: String,
    /// The agent session, when the caller named one.
    pub session_id: Option<String>,
    /// The routing profile the caller named, for the meta-tools.
    pub profile: Option<String>,
    /// The tool's name in the catalog.
    pub tool: String,
    /// Cancelled when the caller cancels, goes away, or the deadline passes.
    pub cancel: CancellationToken,
    /// When the call must be finished.
    pub deadline: Instant,
    /// Where progress and partial outputs go.
    pub events: EventSink,
    /// The attempt, 1 for the first; a call whose connection broke may be repeated.
    pub attempt: u32,
    /// Who is calling.
    pub principal: Arc<crate::Principal>,
    /// How deep the call is nested: 0 for a caller's own call, one more for each tool
    /// that called back into toolmesh. A backend tells its tool [`Nesting::of`] it, so
    /// that the tool's own calls carry it.
    pub depth: u32,
}

/// What a tool that calls back into toolmesh sends with its calls: the depth of the call
/// it makes (its own depth plus one) and its own call id, as `x-toolmesh-call-depth` and
/// `x-toolmesh-parent-call-id` gRPC metadata and HTTP headers, `TOOLMESH_CALL_DEPTH` and
/// `TOOLMESH_PARENT_CALL_ID` environment variables of a command, and `_meta` keys of an
/// MCP call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nesting {
    /// The depth of the calls the tool makes.
    pub depth: u32,
    /// The call id of the tool's own call.
    pub parent_call_id: String,
}

impl Nesting {
    /// The metadata key (and HTTP header) of the depth.
    pub const DEPTH_HEADER: &str = "x-toolmesh-call-depth";
    /// The metadata key (and HTTP header) of the parent call id.
    pub const PARENT_HEADER: &str = "x-toolmesh-parent-call-id";
    /// The environment variable of the depth.
    pub const DEPTH_ENV: &str = "TOOLMESH_CALL_DEPTH";
    /// The environment variable of the parent call id.
    pub const PARENT_ENV: &str = "TOOLMESH_PARENT_CALL_ID";
    /// The MCP `_meta` key of the depth.
    pub const DEPTH_META: &str = "io.toolmesh/callDepth";
    /// The MCP `_meta` key of the parent call id.
    pub const PARENT_META: &str = "io.toolmesh/parentCallId";

    /// Returns what the tool of `ctx` sends with the calls it makes.
    pub fn of(ctx: &CallContext) -> Self {
        Nesting { depth: ctx.depth.saturating_add(1), parent_call_id: ctx.call_id.clone() }
    }

    /// Returns the pairs of names and values to send, under the names `depth` and
    /// `parent` give.
    pub fn pairs<'a>(&self, depth: &'a str, parent: &'a str) -> [(&'a str, String); 2] {
        [(depth, self.depth.to_string()), (parent, self.parent_call_id.clone())]
    }
}
