//! The audit log: one JSON line per call, per approval and per discovery that hid tools,
//! written off the call path by a thread of its own, in batches. A call only copies its
//! event's fields into a queue; the writer formats the lines and writes them, a few dozen
//! at a time, letting the calls' threads have the core in between.

use std::{
    fs::OpenOptions,
    io::Write,
    sync::{Arc, Condvar, Mutex, PoisonError, mpsc},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use crate::{PolicyError, config::AuditTarget};

/// One audit event. It is written as one JSON line, `{"ts": <seconds since the Unix epoch,
/// to the microsecond>, "audit": {<the fields below, in this order; those marked optional
/// only when set>}}`.
#[derive(Debug, Clone)]
pub struct AuditEvent<'a> {
    /// `call`, `discovery`, `approval` or `definition_change` (an MCP tool definition that
    /// differs from its pin).
    pub event: &'a str,
    /// The principal's name.
    pub principal: &'a str,
    /// How it authenticated (`api_key`, `jwt`, `certificate`, `anonymous`): with the
    /// issuer, what tells a token's subject from a key of the same name.
    pub principal_kind: &'a str,
    /// The issuer of a `jwt` principal's token (optional).
    pub issuer: Option<&'a str>,
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
    /// When the event happened (for a call, when it ended): written as `ts`. An instant
    /// the caller has read anyway, so that recording reads no clock.
    pub at: Instant,
    /// The trace the call belongs to, when it is traced (optional: not when empty).
    pub trace_id: &'a str,
    /// The policy version that decided.
    pub policy: &'a str,
    /// For an approval: the person's note (optional).
    pub note: Option<&'a str>,
}

impl AuditEvent<'_> {
    /// Appends the event, stamped `ts` (since the Unix epoch), to `line` as one line of
    /// JSON. Written by hand rather than through serde: this runs for every event, and its
    /// strings seldom need escaping, which is checked for a whole string at once.
    fn write_line(&self, ts: Duration, line: &mut Vec<u8>) {
        line.extend_from_slice(b"{\"ts\":");
        decimal(line, ts.as_secs(), ts.subsec_micros().into(), 6);
        line.extend_from_slice(b",\"audit\":{\"event\":");
        string(line, self.event);
        field(line, "principal", self.principal);
        field(line, "principal_kind", self.principal_kind);
        if let Some(issuer) = self.issuer {
            field(line, "issuer", issuer);
        }
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

/// An event as it waits for the writer: its times and flags, then its strings, each after
/// its length. Queueing an event copies its strings and nothing more; the writer turns
/// events into JSON lines, a batch at a time, off the call path.
mod record {
    use std::time::{Duration, Instant};

    use super::AuditEvent;

    const AGENT: u8 = 1;
    const HIDDEN: u8 = 2;
    const NOTE: u8 = 4;
    const ISSUER: u8 = 8;

    /// The bytes before the strings: `at` (after the log's start, or before it if
    /// negative) and the duration in nanoseconds, `hidden`, the flags.
    const HEAD: usize = 8 + 8 + 8 + 1;

    impl AuditEvent<'_> {
        fn strings(&self) -> [&str; 13] {
            [
                self.event,
                self.principal,
                self.principal_kind,
                self.issuer.unwrap_or_default(),
                self.agent.unwrap_or_default(),
                self.tool,
                self.call_id,
                self.decision,
                self.rule,
                self.outcome,
                self.trace_id,
                self.policy,
                self.note.unwrap_or_default(),
            ]
        }

        /// How many bytes [`AuditEvent::encode`] appends.
        pub(super) fn encoded_len(&self) -> usize {
            HEAD + self.strings().iter().map(|s| 4 + s.len()).sum::<usize>()
        }

        /// Appends the event to `out`; `at` as its time after `start`.
        pub(super) fn encode(&self, start: Instant, out: &mut Vec<u8>) {
            let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            // Signed: an event may be stamped before the log started.
            let at = match self.at.checked_duration_since(start) {
                Some(after) => i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
                None => -i64::try_from((start - self.at).as_nanos()).unwrap_or(i64::MAX),
            };
            out.extend_from_slice(&at.to_le_bytes());
            out.extend_from_slice(&nanos(self.duration).to_le_bytes());
            out.extend_from_slice(&(self.hidden.unwrap_or_default() as u64).to_le_bytes());
            let mut flags = 0;
            let optional = [
                self.agent.is_some(),
                self.hidden.is_some(),
                self.note.is_some(),
                self.issuer.is_some(),
            ];
            for (set, flag) in optional.into_iter().zip([AGENT, HIDDEN, NOTE, ISSUER]) {
                if set {
                    flags |= flag;
                }
            }
            out.push(flags);
            for s in self.strings() {
                // An event is far below 4 GiB: the queue holds 64 MiB at most.
                out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                out.extend_from_slice(s.as_bytes());
            }
        }
    }

    /// Reads the events that [`AuditEvent::encode`] appended to `bytes` with `start`, in
    /// order.
    pub(super) fn decode(bytes: &[u8], start: Instant) -> Events<'_> {
        Events { bytes, start }
    }

    pub(super) struct Events<'a> {
        bytes: &'a [u8],
        start: Instant,
    }

    impl<'a> Events<'a> {
        fn take(&mut self, n: usize) -> Option<&'a [u8]> {
            let (taken, rest) = self.bytes.split_at_checked(n)?;
            self.bytes = rest;
            Some(taken)
        }

        fn number(&mut self) -> Option<u64> {
            Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
        }

        fn string(&mut self) -> Option<&'a str> {
            let len = u32::from_le_bytes(self.take(4)?.try_into().ok()?);
            std::str::from_utf8(self.take(len as usize)?).ok()
        }

        fn event(&mut self) -> Option<AuditEvent<'a>> {
            let at = self.number()?.cast_signed();
            let at = match u64::try_from(at) {
                Ok(after) => self.start.checked_add(Duration::from_nanos(after))?,
                Err(_) => self.start.checked_sub(Duration::from_nanos(at.unsigned_abs()))?,
            };
            let duration = Duration::from_nanos(self.number()?);
            let hidden = usize::try_from(self.number()?).unwrap_or(usize::MAX);
            let flags = self.take(1)?[0];
            let has = |flag: u8| flags & flag != 0;
            let event = AuditEvent {
                event: self.string()?,
                principal: self.string()?,
                principal_kind: self.string()?,
                issuer: Some(self.string()?).filter(|_| has(ISSUER)),
                agent: Some(self.string()?).filter(|_| has(AGENT)),
                tool: self.string()?,
                call_id: self.string()?,
                decision: self.string()?,
                rule: self.string()?,
                outcome: self.string()?,
                trace_id: self.string()?,
                policy: self.string()?,
                note: Some(self.string()?).filter(|_| has(NOTE)),
                hidden: has(HIDDEN).then_some(hidden),
                duration,
                at,
            };
            Some(event)
        }
    }

    impl<'a> Iterator for Events<'a> {
        type Item = AuditEvent<'a>;

        fn next(&mut self) -> Option<Self::Item> {
            if self.bytes.is_empty() {
                return None;
            }
            let event = self.event();
            // Only `encode` writes the queue: a record that does not read back is a bug,
            // and the rest of the batch cannot be framed. Said, never passed over.
            if event.is_none() {
                tracing::error!(
                    unread_bytes = self.bytes.len(),
                    "an audit record does not read back: the rest of its batch is lost"
                );
                self.bytes = &[];
            }
            event
        }
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

/// How many bytes of events may wait for the writer. A target that stops taking them (a
/// stalled disk, a full pipe) must not grow the process without bound: beyond this, events
/// are dropped, counted, and the writer says how many once it can write again.
const MAX_PENDING: usize = 64 << 20;

/// Events waiting for the writer, and callers waiting for them to be written. An event is
/// encoded straight into `records` ([`AuditEvent::encode`]), which the writer swaps for its
/// own emptied buffer: once the buffers have grown, recording an event allocates nothing,
/// and no memory is handed from one thread to another to free.
#[derive(Default)]
struct Queue {
    records: Vec<u8>,
    /// Events dropped since the writer last looked, because `records` was full.
    dropped: u64,
    flushes: Vec<mpsc::SyncSender<()>>,
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Events are queued with their time after this.
    start: Instant,
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
        let shared = Arc::new(Shared {
            queue: Mutex::default(),
            start: Instant::now(),
            max_pending,
            ready: Condvar::new(),
        });
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

    /// Queues `event`, to be written as one JSON line.
    pub fn record(&self, event: &AuditEvent<'_>) {
        let Some(shared) = &self.shared else { return };
        let len = event.encoded_len();
        let mut queue = shared.0.lock();
        let was_empty = queue.records.is_empty();
        if queue.records.len() + len > shared.0.max_pending {
            queue.dropped += 1;
        } else {
            event.encode(shared.0.start, &mut queue.records);
        }
        drop(queue);
        // The writer waits only on an empty queue: one wake-up per batch.
        if was_empty {
            shared.0.ready.notify_one();
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

fn write_lines(shared: &Shared, mut out: Box<dyn Write + Send>) {
    let mut failed = false;
    // The buffer of events the writer reads; swapped with the queue's, so both keep their
    // capacity.
    let mut records = Vec::new();
    // The JSON lines of a batch, kept for the next one.
    let mut lines = Vec::new();
    loop {
        let mut queue = shared.lock();
        while queue.records.is_empty() && queue.flushes.is_empty() && !queue.closed {
            queue = shared.ready.wait(queue).unwrap_or_else(PoisonError::into_inner);
        }
        // Let a batch gather, unless someone waits for it or the log is closing.
        if queue.flushes.is_empty() && !queue.closed {
            drop(queue);
            std::thread::sleep(BATCH);
            queue = shared.lock();
        }
        records.clear();
        std::mem::swap(&mut records, &mut queue.records);
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
        // The wall clock now, and the instant with it: an event's time in the log is the
        // wall clock's, however that was set since the log started.
        let (now, wall) = (Instant::now(), SystemTime::now());
        // In pieces, each letting go of the core after: a batch formatted and written at
        // once would hold it for a tenth of a millisecond or more, and the calls that
        // arrive meanwhile would wait for it.
        let mut events = record::decode(&records, shared.start).peekable();
        while events.peek().is_some() {
            lines.clear();
            for event in events.by_ref().take(PIECE) {
                let at = wall.checked_sub(now.saturating_duration_since(event.at));
                let ts = at.and_then(|at| at.duration_since(UNIX_EPOCH).ok()).unwrap_or_default();
                event.write_line(ts, &mut lines);
            }
            match out.write_all(&lines) {
                Ok(()) => failed = false,
                Err(error) if !failed => {
                    failed = true;
                    tracing::error!(%error, "cannot write the audit log");
                }
                Err(_) => {}
            }
            std::thread::yield_now();
        }
        if let Err(error) = out.flush()
            && !failed
        {
            failed = true;
            tracing::error!(%error, "cannot write the audit log");
        }
        for done in flushes {
            let _ = done.send(());
        }
        // One large batch (a burst, a long approval note) leaves no large buffers behind.
        for buffer in [&mut records, &mut lines] {
            if buffer.capacity() > MAX_KEPT {
                *buffer = Vec::new();
            }
        }
        if closed {
            return;
        }
    }
}

/// How many events the writer formats and writes before it lets other threads run.
const PIECE: usize = 32;

/// The writer keeps buffers up to this size from one batch to the next.
const MAX_KEPT: usize = 4 << 20;

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
            principal_kind: "api_key",
            issuer: None,
            agent: None,
            tool: "echo",
            call_id,
            decision: "allow",
            rule: "default",
            hidden: None,
            outcome: "ok",
            duration: Duration::from_micros(250),
            at: Instant::now(),
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
                    principal_kind: text,
                    issuer: optional.then_some(text),
                    agent: optional.then_some(text),
                    tool: text,
                    call_id: if optional { text } else { "" },
                    decision: text,
                    rule: text,
                    hidden: optional.then_some(usize::MAX),
                    outcome: text,
                    duration: Duration::from_nanos(if optional { 1_234_567_890 } else { 999 }),
                    at: Instant::now(),
                    trace_id: if optional { text } else { "" },
                    policy: text,
                    note: optional.then_some(text),
                };
                // As the writer reads it: queued as a record, then written as a line.
                // Stamped after the log's start, or before it.
                let start = if optional {
                    event.at - Duration::from_secs(3)
                } else {
                    event.at + Duration::from_millis(1500)
                };
                let mut records = Vec::new();
                event.encode(start, &mut records);
                assert_eq!(records.len(), event.encoded_len());
                let mut queued = record::decode(&records, start);
                let read = queued.next().expect("the record reads back");
                assert!(queued.next().is_none(), "one record");
                assert_eq!(read.at, event.at);
                let mut line = Vec::new();
                read.write_line(Duration::new(1_764_915_000, 12_345_678), &mut line);
                assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1, "one line");
                assert_eq!(line.last(), Some(&b'\n'));
                let value: serde_json::Value = serde_json::from_slice(&line).expect("JSON");
                assert_eq!(value["ts"], 1_764_915_000.012_345);
                let audit = value["audit"].as_object().expect("an object");
                for key in
                    ["principal", "principal_kind", "tool", "decision", "rule", "outcome", "policy"]
                {
                    assert_eq!(audit[key], text, "{key}");
                }
                assert_eq!(audit["event"], "approval");
                assert_eq!(audit["duration_ms"], if optional { 1234.567 } else { 0.0 });
                // Empty call and trace ids are left out, as absent agent and note are.
                let mut fields = 9;
                for (key, written) in [
                    ("agent", optional),
                    ("issuer", optional),
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
