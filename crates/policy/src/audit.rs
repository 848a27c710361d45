//! The audit log: one JSON line per call and per discovery that hid tools, written off the
//! call path by a thread of its own.

use std::{
    fs::OpenOptions,
    io::{BufWriter, Write},
    sync::mpsc,
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

enum Line {
    Event(String),
    Flush(mpsc::SyncSender<()>),
}

/// Where audit events go. Writing one never blocks the caller: lines are queued to a
/// writer thread, which flushes whenever its queue is empty.
#[derive(Debug)]
pub struct AuditLog {
    tx: Option<mpsc::Sender<Line>>,
}

impl AuditLog {
    /// Returns a log that writes nothing.
    pub fn off() -> Self {
        AuditLog { tx: None }
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
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("toolmesh-audit".into())
            .spawn(move || write_lines(rx, BufWriter::new(out)))
            .map_err(|error| PolicyError::Audit { path: "(writer thread)".into(), error })?;
        Ok(AuditLog { tx: Some(tx) })
    }

    /// Returns whether events are written anywhere.
    pub fn is_on(&self) -> bool {
        self.tx.is_some()
    }

    /// Queues `event` as one JSON line, stamped with the time.
    pub fn record(&self, event: &AuditEvent<'_>) {
        let Some(tx) = &self.tx else { return };
        #[derive(Serialize)]
        struct Stamped<'a> {
            ts: f64,
            audit: &'a AuditEvent<'a>,
        }
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64();
        match serde_json::to_string(&Stamped { ts, audit: event }) {
            Ok(line) => {
                let _ = tx.send(Line::Event(line));
            }
            Err(error) => tracing::error!(%error, "an audit event could not be written"),
        }
    }

    /// Waits, up to `timeout`, until every event recorded so far is written out.
    pub fn flush(&self, timeout: Duration) -> bool {
        let Some(tx) = &self.tx else { return true };
        let (done, wait) = mpsc::sync_channel(1);
        tx.send(Line::Flush(done)).is_ok() && wait.recv_timeout(timeout).is_ok()
    }
}

fn write_lines(rx: mpsc::Receiver<Line>, mut out: BufWriter<Box<dyn Write + Send>>) {
    let mut failed = false;
    let mut write = |out: &mut BufWriter<_>, line: Line| match line {
        Line::Event(text) => {
            if let Err(error) = writeln!(out, "{text}")
                && !failed
            {
                failed = true;
                tracing::error!(%error, "cannot write the audit log");
            }
        }
        Line::Flush(done) => {
            let _ = out.flush();
            let _ = done.send(());
        }
    };
    while let Ok(line) = rx.recv() {
        write(&mut out, line);
        while let Ok(line) = rx.try_recv() {
            write(&mut out, line);
        }
        let _ = out.flush();
    }
    let _ = out.flush();
}
