use std::time::Duration;

use serde_json::Value;
use tokio::{
    sync::{mpsc, oneshot},
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

/// Where a running tool sends its [`CallEvent`]s and [`Elicitation`]s. Sending never blocks
/// the tool: a caller that does not listen (a unary call) has a disabled sink, and a caller
/// that stopped listening makes sends no-ops.
#[derive(Debug, Clone, Default)]
pub struct EventSink {
    tx: Option<mpsc::UnboundedSender<CallEvent>>,
    elicit: Option<mpsc::Sender<ElicitationPrompt>>,
}

impl EventSink {
    /// Returns a sink whose events arrive, in order, on the returned receiver.
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<CallEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (EventSink { tx: Some(tx), elicit: None }, rx)
    }

    /// Returns this sink able to ask the caller questions, which arrive on the receiver.
    pub fn with_elicitation(mut self) -> (Self, mpsc::Receiver<ElicitationPrompt>) {
        let (tx, rx) = mpsc::channel(8);
        self.elicit = Some(tx);
        (self, rx)
    }

    /// Returns a sink that drops every event.
    pub fn disabled() -> Self {
        EventSink { tx: None, elicit: None }
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
        self.tx.as_ref().is_some_and(|tx| !tx.is_closed())
    }

    /// Reports progress.
    pub fn progress(&self, progress: f64, total: Option<f64>, message: impl Into<String>) {
        self.send(CallEvent::Progress { progress, total, message: message.into() });
    }

    /// Reports a partial output.
    pub fn partial(&self, part: ContentPart) {
        self.send(CallEvent::Partial(part));
    }

    /// Sends an event; a no-op when nobody listens.
    pub fn send(&self, event: CallEvent) {
        if let Some(tx) = &self.tx {
            // The receiver is gone only when the caller stopped listening; the call goes on.
            let _ = tx.send(event);
        }
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
}
