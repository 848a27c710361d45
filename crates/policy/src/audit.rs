//! The audit log: one JSON line per call, per approval and per discovery that hid tools,
//! written off the call path by a thread of its own, in batches.

use std::{
    cell::RefCell,
    fs::OpenOptions,
    io::Write,
    sync::{Arc, Condvar, Mutex, PoisonError, mpsc},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::{PolicyError, config::AuditTarget};

/// One audit event. It is written as one JSON line, `{"ts": <seconds since the Unix epoch,
/// to the microsecond>, "audit": {<the fields below, in this order; those marked optional
/// only when set>}}`.
#[derive(Debug, Clone)]
pub struct AuditEvent<'a> {
    /// `call`, `discovery` or `approval`.
    pub event: &'static str,
    /// The principal's name.
    pub principal: &'a str,
    /// The principal's agent, if it has one (optional).
    pub agent: Option<&'a str>,
    /// The tool called; for a discovery, the RPC or meta-tool (`ListTools`, `searchTools`).
    pub tool: &'a str,
    /// The call id, for a call (optional: not when empty).
    pub call_id: &'a str,
    /// `allow`, `deny` or `hide`.
    pub decision: &'a str,
    /// The rule that decided (`default` when none matched; for a discovery, the rules
    /// that hid tools).
    pub rule: &'a str,
    /// For a discovery: how many tools were hidden (optional).
    pub hidden: Option<usize>,
    /// `ok`, `tool_error`, or the kind of the error the call ended with.
    pub outcome: &'a str,
    /// How long the call took; written as `duration_ms`, in milliseconds to the
    /// microsecond.
    pub duration: Duration,
    /// The trace the call belongs to, when it is traced (optional: not when empty).
    pub trace_id: &'a str,
    /// The policy version that decided.
    pub policy: &'a str,
    /// For an approval: the person's note (optional).
    pub note: Option<&'a str>,
}

impl AuditEvent<'_> {
    /// Appends the event, stamped `ts` (since the Unix epoch), to `line` as one line of
    /// JSON. Written by hand rather than through serde: this runs on every call, and its
    /// strings seldom need escaping, which is checked for a whole string at once.
    fn write_line(&self, ts: Duration, line: &mut Vec<u8>) {
        line.extend_from_slice(b"{\"ts\":");
        decimal(line, ts.as_secs(), ts.subsec_micros().into(), 6);
        line.extend_from_slice(b",\"audit\":{\"event\":");
        string(line, self.event);
        field(line, "principal", self.principal);
        if let Some(agent) = self.agent {
            field(line, "agent", agent);
        }
        field(line, "tool", self.tool);
        if !self.call_id.is_empty() {
            field(line, "call_id", self.call_id);
        }
        field(line, "decision", self.decision);
        field(line, "rule", self.rule);
        if let Some(hidden) = self.hidden {
            line.extend_from_slice(b",\"hidden\":");
            digits(line, hidden as u64, 1);
        }
        field(line, "outcome", self.outcome);
        line.extend_from_slice(b",\"duration_ms\":");
        let micros = u64::try_from(self.duration.as_micros()).unwrap_or(u64::MAX);
        decimal(line, micros / 1000, micros % 1000, 3);
        if !self.trace_id.is_empty() {
            field(line, "trace_id", self.trace_id);
        }
        field(line, "policy", self.policy);
        if let Some(note) = self.note {
            field(line, "note", note);
        }
        line.extend_from_slice(b"}}\n");
    }
}

/// Appends `,"name":"value"`.
fn field(line: &mut Vec<u8>, name: &str, value: &str) {
    line.extend_from_slice(b",\"");
    line.extend_from_slice(name.as_bytes());
    line.extend_from_slice(b"\":");
    string(line, value);
}

/// Appends `value` as a JSON string.
fn string(line: &mut Vec<u8>, value: &str) {
    let bytes = value.as_bytes();
    line.push(b'"');
    // Without a branch per byte, so that the check runs many bytes at a time.
    let plain = !bytes.iter().fold(false, |any, &b| any | (b < 0x20) | (b == b'"') | (b == b'\\'));
    if plain {
        line.extend_from_slice(bytes);
    } else {
        let mut start = 0;
        for (i, &b) in bytes.iter().enumerate() {
            let escaped: &[u8] = match b {
                b'"' => b"\\\"",
                b'\\' => b"\\\\",
                b'\n' => b"\\n",
                b'\r' => b"\\r",
                b'\t' => b"\\t",
                0x00..=0x1f => {
                    const HEX: &[u8; 16] = b"0123456789abcdef";
                    &[b'\\', b'u', b'0', b'0', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]
                }
                _ => continue,
            };
            line.extend_from_slice(&bytes[start..i]);
            line.extend_from_slice(escaped);
            start = i + 1;
        }
        line.extend_from_slice(&bytes[start..]);
    }
    line.push(b'"');
}

/// Appends `whole.fraction`, the fraction in `places` digits.
fn decimal(line: &mut Vec<u8>, whole: u64, fraction: u64, places: usize) {
    digits(line, whole, 1);
    line.push(b'.');
    digits(line, fraction, places);
}

/// Appends `value` in decimal, with leading zeros to at least `width` digits.
/// (`std::fmt` does the same several times slower, and this runs on every call.)
fn digits(line: &mut Vec<u8>, mut value: u64, width: usize) {
    let mut buffer = [0u8; 20];
    let mut start = buffer.len();
    while value > 0 || buffer.len() - start < width {
        start -= 1;
        buffer[start] = b'0' + (value % 10) as u8;
        value /= 10;
    }
    line.extend_from_slice(&buffer[start..]);
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
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        thread_local! {
            /// The line being serialized, outside the queue's lock; kept for the next one.
            static LINE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
        }
        LINE.with_borrow_mut(|line| {
            line.clear();
            event.write_line(ts, line);
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
            duration: Duration::from_micros(250),
            trace_id: "",
            policy: "v1",
            note: None,
        }
    }

    #[test]
    fn every_field_reads_back_as_written_whatever_its_characters() {
        let awkward: String =
            (0u8..0x20).map(char::from).chain("\"\\/é😀\u{7f}\u{2028}".chars()).collect();
        for text in ["", "plain", "say \"hi\"", r"C:\tools\", "line\nbreak", awkward.as_str()] {
            for optional in [false, true] {
                let event = AuditEvent {
                    event: "approval",
                    principal: text,
                    agent: optional.then_some(text),
                    tool: text,
                    call_id: if optional { text } else { "" },
                    decision: text,
                    rule: text,
                    hidden: optional.then_some(usize::MAX),
                    outcome: text,
                    duration: Duration::from_nanos(if optional { 1_234_567_890 } else { 999 }),
                    trace_id: if optional { text } else { "" },
                    policy: text,
                    note: optional.then_some(text),
                };
                let mut line = Vec::new();
                event.write_line(Duration::new(1_764_915_000, 12_345_678), &mut line);
                assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1, "one line");
                assert_eq!(line.last(), Some(&b'\n'));
                let value: serde_json::Value = serde_json::from_slice(&line).expect("JSON");
                assert_eq!(value["ts"], 1_764_915_000.012_345);
                let audit = value["audit"].as_object().expect("an object");
                for key in ["principal", "tool", "decision", "rule", "outcome", "policy"] {
                    assert_eq!(audit[key], text, "{key}");
                }
                assert_eq!(audit["event"], "approval");
                assert_eq!(audit["duration_ms"], if optional { 1234.567 } else { 0.0 });
                // Empty call and trace ids are left out, as absent agent and note are.
                let mut fields = 8;
                for (key, written) in [
                    ("agent", optional),
                    ("call_id", optional && !text.is_empty()),
                    ("trace_id", optional && !text.is_empty()),
                    ("note", optional),
                ] {
                    let expected = written.then_some(text);
                    assert_eq!(audit.get(key).and_then(|v| v.as_str()), expected, "{key}");
                    fields += usize::from(written);
                }
                let hidden = audit.get("hidden").and_then(serde_json::Value::as_u64);
                assert_eq!(hidden, optional.then_some(u64::MAX));
                assert_eq!(audit.len(), fields + usize::from(optional));
            }
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
