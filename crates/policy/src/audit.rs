//! The audit log: one JSON line per call, per approval and per discovery that hid tools,
//! written off the call path by a thread of its own, in batches.

use std::{
    cell::RefCell,
    fs::OpenOptions,
    io::Write,
    sync::{Arc, Condvar, Mutex, PoisonError, mpsc},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::Serialize;

use crate::{PolicyError, config::AuditTarget};

/// One audit event.
#[derive(Debug, Clone, Serialize)]
pub struct AuditEvent<'a> {
    /// `call`, `discovery` or `approval`.
    pub event: &'static str,
    /// The principal's name.
    pub principal: &'a str,
    /// The principal's agent, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<&'a str>,
    /// The tool called; for a discovery, the RPC or meta-tool (`ListTools`, `searchTools`).
    pub tool: &'a str,
    /// The call id, for a call.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub call_id: &'a str,
    /// `allow`, `deny` or `hide`.
    pub decision: &'a str,
    /// The rule that decided (`default` when none matched; for a discovery, the rules
    /// that hid tools).
    pub rule: &'a str,
    /// For a discovery: how many tools were hidden.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden: Option<usize>,
    /// `ok`, `tool_error`, or the kind of the error the call ended with.
    pub outcome: &'a str,
    /// How long the call took, in milliseconds.
    pub duration_ms: f64,
    /// The trace the call belongs to, when it is traced.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub trace_id: &'a str,
    /// The policy version that decided.
    pub policy: &'a str,
    /// For an approval: the person's note.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<&'a str>,
}

/// How long the writer lets lines gather before it writes them: one wake-up and one write
/// per batch instead of per call.
const BATCH: Duration = Duration::from_millis(20);

/// How many bytes of lines may wait for the writer. A target that stops taking them (a
/// stalled disk, a full pipe) must not grow the process without bound: beyond this, events
/// are dropped, counted, and the writer says how many once it can write again.
const MAX_PENDING: usize = 64 << 20;

/// Lines waiting for the writer, and callers waiting for them to be written. An event is
/// serialized into a buffer of the calling thread and copied into `lines`, which the
/// writer swaps for its own emptied buffer: once the buffers have grown, recording an
/// event allocates nothing, and no memory is handed from one thread to another to free.
#[derive(Default)]
struct Queue {
    lines: Vec<u8>,
    /// Events dropped since the writer last looked, because `lines` was full.
    dropped: u64,
    flushes: Vec<mpsc::SyncSender<()>>,
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// At most this many bytes wait ([`MAX_PENDING`]).
    max_pending: usize,
    /// Told when the queue stops being empty, or closes.
    ready: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Where audit events go. Recording one never blocks the caller on I/O: lines are queued,
/// and a writer thread of its own writes them in batches.
#[derive(Debug)]
pub struct AuditLog {
    shared: Option<Arc<SharedHandle>>,
}

/// Closes the queue when the log is dropped, so that the writer writes what is left and
/// ends.
struct SharedHandle(Arc<Shared>);

impl std::fmt::Debug for SharedHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuditQueue")
    }
}

impl Drop for SharedHandle {
    fn drop(&mut self) {
        self.0.lock().closed = true;
        self.0.ready.notify_one();
    }
}

impl AuditLog {
    /// Returns a log that writes nothing.
    pub fn off() -> Self {
        AuditLog { shared: None }
    }

    /// Opens `target` (a file is created if needed and appended to).
    pub fn open(target: &AuditTarget) -> Result<Self, PolicyError> {
        let out: Box<dyn Write + Send> = match target {
            AuditTarget::Off => return Ok(Self::off()),
            AuditTarget::Stderr => Box::new(std::io::stderr()),
            AuditTarget::Stdout => Box::new(std::io::stdout()),
            AuditTarget::File(path) => {
                Box::new(OpenOptions::new().create(true).append(true).open(path).map_err(
                    |error| PolicyError::Audit { path: path.display().to_string(), error },
                )?)
            }
        };
        Self::with_writer(out, MAX_PENDING)
    }

    /// Starts the writer thread on `out`, with at most `max_pending` bytes waiting for it.
    fn with_writer(out: Box<dyn Write + Send>, max_pending: usize) -> Result<Self, PolicyError> {
        let shared =
            Arc::new(Shared { queue: Mutex::default(), max_pending, ready: Condvar::new() });
        let writer = shared.clone();
        std::thread::Builder::new()
            .name("toolmesh-audit".into())
            .spawn(move || write_lines(&writer, out))
            .map_err(|error| PolicyError::Audit { path: "(writer thread)".into(), error })?;
        Ok(AuditLog { shared: Some(Arc::new(SharedHandle(shared))) })
    }

    /// Returns whether events are written anywhere.
    pub fn is_on(&self) -> bool {
        self.shared.is_some()
    }

    /// Queues `event` as one JSON line, stamped with the time.
    pub fn record(&self, event: &AuditEvent<'_>) {
        let Some(shared) = &self.shared else { return };
        #[derive(Serialize)]
        struct Stamped<'a> {
            ts: f64,
            audit: &'a AuditEvent<'a>,
        }
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64();
        thread_local! {
            /// The line being serialized, outside the queue's lock; kept for the next one.
            static LINE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
        }
        LINE.with_borrow_mut(|line| {
            line.clear();
            if let Err(error) = serde_json::to_writer(&mut *line, &Stamped { ts, audit: event }) {
                tracing::error!(%error, "an audit event could not be written");
                return;
            }
            line.push(b'\n');
            let mut queue = shared.0.lock();
            let was_empty = queue.lines.is_empty();
            if queue.lines.len() + line.len() > shared.0.max_pending {
                queue.dropped += 1;
            } else {
                queue.lines.extend_from_slice(line);
            }
            drop(queue);
            // The writer waits only on an empty queue: one wake-up per batch.
            if was_empty {
                shared.0.ready.notify_one();
            }
            // One large event (a long approval note) leaves no large buffer behind.
            if line.capacity() > 64 << 10 {
                *line = Vec::new();
            }
        });
    }

    /// Waits, up to `timeout`, until every event recorded so far is written out.
    pub fn flush(&self, timeout: Duration) -> bool {
        let Some(shared) = &self.shared else { return true };
        let (done, wait) = mpsc::sync_channel(1);
        shared.0.lock().flushes.push(done);
        shared.0.ready.notify_one();
        wait.recv_timeout(timeout).is_ok()
    }
}

fn write_lines(shared: &Shared, mut out: Box<dyn Write + Send>) {
    let mut failed = false;
    // The buffer the writer writes from; swapped with the queue's, so both keep their
    // capacity.
    let mut lines = Vec::new();
    loop {
        let mut queue = shared.lock();
        while queue.lines.is_empty() && queue.flushes.is_empty() && !queue.closed {
            queue = shared.ready.wait(queue).unwrap_or_else(PoisonError::into_inner);
        }
        // Let a batch gather, unless someone waits for it or the log is closing.
        if queue.flushes.is_empty() && !queue.closed {
            drop(queue);
            std::thread::sleep(BATCH);
            queue = shared.lock();
        }
        lines.clear();
        std::mem::swap(&mut lines, &mut queue.lines);
        let dropped = std::mem::take(&mut queue.dropped);
        let flushes = std::mem::take(&mut queue.flushes);
        let closed = queue.closed;
        drop(queue);
        if dropped > 0 {
            tracing::error!(
                dropped,
                max_pending_bytes = shared.max_pending,
                "the audit log fell too far behind its target: events were dropped"
            );
        }
        match out.write_all(&lines).and_then(|()| out.flush()) {
            Ok(()) => failed = false,
            Err(error) if !failed => {
                failed = true;
                tracing::error!(%error, "cannot write the audit log");
            }
            Err(_) => {}
        }
        for done in flushes {
            let _ = done.send(());
        }
        if closed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{Receiver, channel};

    use super::*;

    /// A target that takes nothing until it is told to, then everything.
    struct Stalled {
        release: Receiver<()>,
        released: bool,
        written: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if !self.released {
                let _ = self.release.recv();
                self.released = true;
            }
            self.written.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn event(call_id: &str) -> AuditEvent<'_> {
        AuditEvent {
            event: "call",
            principal: "alice",
            agent: None,
            tool: "echo",
            call_id,
            decision: "allow",
            rule: "default",
            hidden: None,
            outcome: "ok",
            duration_ms: 0.25,
            trace_id: "",
            policy: "v1",
            note: None,
        }
    }

    #[test]
    fn a_stalled_target_bounds_the_queue_and_what_fits_is_written_whole() {
        let (release, wait) = channel();
        let written = Arc::new(Mutex::new(Vec::new()));
        let target = Stalled { release: wait, released: false, written: written.clone() };
        let log = AuditLog::with_writer(Box::new(target), 4096).expect("the writer starts");
        // The first batch is taken by the stalled writer; the queue then fills to its bound.
        log.record(&event("first"));
        std::thread::sleep(BATCH * 3);
        let ids: Vec<String> = (0..1000).map(|i| format!("call-{i}")).collect();
        for id in &ids {
            log.record(&event(id));
        }
        release.send(()).expect("the writer waits");
        assert!(log.flush(Duration::from_secs(10)));
        let text = written.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let lines: Vec<serde_json::Value> = String::from_utf8(text)
            .expect("UTF-8")
            .lines()
            .map(|line| serde_json::from_str(line).expect("each line is one JSON event"))
            .collect();
        assert_eq!(lines[0]["audit"]["call_id"], "first");
        let queued = lines.len() - 1;
        assert!(queued > 0 && queued < ids.len(), "{queued} of {} queued", ids.len());
        // What was kept is the oldest events, in order, none cut.
        for (line, id) in lines[1..].iter().zip(&ids) {
            assert_eq!(line["audit"]["call_id"], id.as_str());
        }
        // Once the target takes lines again, events are written again.
        log.record(&event("after"));
        assert!(log.flush(Duration::from_secs(10)));
        let text = written.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let last = String::from_utf8(text).expect("UTF-8").lines().last().map(str::to_owned);
        assert!(last.is_some_and(|line| line.contains(r#""call_id":"after""#)));
    }
}
