use tokio::{sync::mpsc, time::Instant};
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

/// Where a running tool sends its [`CallEvent`]s. Sending never blocks the tool: a caller
/// that does not listen (a unary call) has a disabled sink, and a caller that stopped
/// listening makes sends no-ops.
#[derive(Debug, Clone, Default)]
pub struct EventSink {
    tx: Option<mpsc::UnboundedSender<CallEvent>>,
}

impl EventSink {
    /// Returns a sink whose events arrive, in order, on the returned receiver.
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<CallEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (EventSink { tx: Some(tx) }, rx)
    }

    /// Returns a sink that drops every event.
    pub fn disabled() -> Self {
        EventSink { tx: None }
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
    /// The tool's name in the catalog.
    pub tool: String,
    /// Cancelled when the caller cancels, goes away, or the deadline passes.
    pub cancel: CancellationToken,
    /// When the call must be finished.
    pub deadline: Instant,
    /// Where progress and partial outputs go.
    pub events: EventSink,
}
