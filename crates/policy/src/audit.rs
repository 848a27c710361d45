//! The audit log: one JSON line per call, per approval and per discovery that hid tools,
//! written off the call path by a thread of its own, in batches.

use std::{
    fs::OpenOptions,
    io::{BufWriter, Write},
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

/// Lines waiting for the writer, and callers waiting for them to be written.
#[derive(Default)]
struct Queue {
    lines: Vec<String>,
    flushes: Vec<mpsc::SyncSender<()>>,
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
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
        let shared = Arc::new(Shared { queue: Mutex::default(), ready: Condvar::new() });
        let writer = shared.clone();
        std::thread::Builder::new()
            .name("toolmesh-audit".into())
            .spawn(move || write_lines(&writer, BufWriter::new(out)))
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
        match serde_json::to_string(&Stamped { ts, audit: event }) {
            Ok(line) => {
                let mut queue = shared.0.lock();
                let was_empty = queue.lines.is_empty();
                queue.lines.push(line);
                drop(queue);
                // The writer waits only on an empty queue: one wake-up per batch.
                if was_empty {
                    shared.0.ready.notify_one();
                }
            }
            Err(error) => tracing::error!(%error, "an audit event could not be written"),
        }
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

fn write_lines(shared: &Shared, mut out: BufWriter<Box<dyn Write + Send>>) {
    let mut failed = false;
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
        let lines = std::mem::take(&mut queue.lines);
        let flushes = std::mem::take(&mut queue.flushes);
        let closed = queue.closed;
        drop(queue);
        for line in &lines {
            if let Err(error) = writeln!(out, "{line}")
                && !failed
            {
                failed = true;
                tracing::error!(%error, "cannot write the audit log");
            }
        }
        let _ = out.flush();
        for done in flushes {
            let _ = done.send(());
        }
        if closed {
            return;
        }
    }
}
