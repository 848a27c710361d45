//! A server's last tool listing, kept in the data directory.
//!
//! A restart publishes the remembered tools before the server has answered, so that the
//! catalog, its search index and the calls waiting for the connection need not wait for a
//! `tools/list` of thousands of tools; the server's own listing replaces them once it is
//! connected. A lazy server is not started only to learn its tools.
//!
//! One file per server: a header line, then one tool per line as the server sent it. The
//! header names the file's format and a digest of the server's transport, so that a listing
//! is never published for another server that took the name.

use std::{
    fs,
    io::{self, Write as _},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use crate::{McpServerConfig, McpTransport};
use rayon::prelude::*;
use rmcp::model::Tool;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::parallel::map_listing;

/// The format of the files; another format is not read.
const FORMAT: u64 = 1;

/// Where one server's listing is kept.
#[derive(Debug)]
pub(crate) struct Remembered {
    path: PathBuf,
    /// Digest of the server's transport (command and arguments, or URL and headers).
    identity: String,
    /// The newest listing handed to [`Remembered::store`]; older ones are not written over
    /// it.
    newest: AtomicU64,
    /// Held while a listing is written.
    writing: std::sync::Mutex<u64>,
}

impl Remembered {
    /// Returns where `config`'s server keeps its listing under `dir`.
    pub(crate) fn new(dir: &Path, config: &McpServerConfig) -> Self {
        // What says which server it is: the program and its arguments, or the URL; not the
        // credentials in its environment or headers, which may be rotated.
        let identity = match &config.transport {
            McpTransport::Stdio { command, args, cwd, .. } => {
                json!(["stdio", command, args, cwd])
            }
            McpTransport::StreamableHttp { url, .. } | McpTransport::Sse { url, .. } => {
                json!(["http", url])
            }
        };
        let identity = Sha256::digest(identity.to_string().as_bytes());
        Remembered {
            path: dir.join(format!("{}.jsonl", file_name(&config.name))),
            identity: identity.iter().map(|b| format!("{b:02x}")).collect(),
            newest: AtomicU64::new(0),
            writing: std::sync::Mutex::new(0),
        }
    }

    /// Reads the remembered listing; `None` when there is none, or it is of another format
    /// or another server, or it cannot be read (said in the error).
    pub(crate) fn load(&self) -> Result<Option<Vec<Tool>>, String> {
        let text = match fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(format!("cannot read {}: {error}", self.path.display())),
        };
        let mut lines = text.lines();
        let header: Value = lines
            .next()
            .and_then(|line| serde_json::from_str(line).ok())
            .ok_or_else(|| format!("{} has no header", self.path.display()))?;
        if header["format"].as_u64() != Some(FORMAT)
            || header["identity"].as_str() != Some(self.identity.as_str())
        {
            return Ok(None);
        }
        let lines: Vec<&str> = lines.collect();
        let tools: Result<Vec<Tool>, _> =
            map_listing(&lines, |line: &&str| serde_json::from_str::<Tool>(line));
        let tools = tools
            .map_err(|error| format!("{}: a tool does not parse: {error}", self.path.display()))?;
        if header["tools"].as_u64() != Some(tools.len() as u64) {
            return Err(format!("{} is cut short", self.path.display()));
        }
        Ok(Some(tools))
    }

    /// Returns a ticket for a listing about to be stored: a later ticket's listing is
    /// newer.
    pub(crate) fn ticket(&self) -> u64 {
        self.newest.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Writes `tools`, the listing of `ticket`, unless a newer one was written meanwhile.
    /// The file is replaced whole (written beside it, then renamed), so a crash leaves the
    /// old listing or the new one.
    pub(crate) fn store<'a>(
        &self,
        ticket: u64,
        tools: impl ParallelIterator<Item = &'a Tool>,
    ) -> io::Result<()> {
        let mut written = self.writing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *written > ticket {
            return Ok(());
        }
        let lines: Vec<String> = tools
            .map(|tool| serde_json::to_string(tool).map_err(io::Error::other))
            .collect::<Result<_, _>>()?;
        let header = json!({"format": FORMAT, "identity": self.identity, "tools": lines.len()});
        replace_file(&self.path, |file| {
            writeln!(file, "{header}")?;
            for line in &lines {
                writeln!(file, "{line}")?;
            }
            Ok(())
        })?;
        *written = ticket;
        Ok(())
    }

    /// Forgets the listing: the server was removed from the configuration.
    pub(crate) fn forget(&self) {
        let _ = fs::remove_file(&self.path);
    }

    /// Returns the file the listing is kept in.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// Replaces the file at `path` whole with what `write` writes: written beside it, synced,
/// then renamed over it, so that a crash leaves the old file or the new one.
pub(crate) fn replace_file(
    path: &Path,
    write: impl FnOnce(&mut io::BufWriter<fs::File>) -> io::Result<()>,
) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let mut file = io::BufWriter::new(fs::File::create(&temporary)?);
    write(&mut file)?;
    file.into_inner().map_err(io::IntoInnerError::into_error)?.sync_all()?;
    fs::rename(&temporary, path)
}

/// A file name for a server: its name with anything but `[A-Za-z0-9._-]` escaped, so that
/// two names never share a file.
pub(crate) fn file_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || "_-".contains(c) || c == '.' && !out.is_empty() {
            out.push(c);
        } else {
            out.push_str(&format!("%{:x}", c as u32));
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

    use std::{sync::Arc, time::Duration};

    use crate::{ConnectMode, PrefixMode};

    use super::*;

    pub(crate) fn config(name: &str, url: &str) -> McpServerConfig {
        McpServerConfig {
            name: name.into(),
            transport: McpTransport::StreamableHttp {
                url: url.into(),
                headers: Default::default(),
                sse_fallback: false,
            },
            timeout: Duration::from_secs(1),
            prefix: PrefixMode::Always,
            connect: ConnectMode::Eager,
            idle_timeout: Duration::from_secs(1),
            ping_interval: None,
            reconnect_wait: std::time::Duration::from_secs(5),
            max_concurrency: std::num::NonZeroUsize::new(1).unwrap(),
            remember_tools: true,
            trust_annotations: false,
            pin_definitions: crate::config::PinMode::Warn,
            accept: Vec::new(),
            credentials: Default::default(),
        }
    }

    fn tool(name: &str) -> Tool {
        let schema = json!({"type": "object", "properties": {"q": {"type": "string"}}});
        let Value::Object(schema) = schema else { unreachable!() };
        Tool::new(name.to_owned(), format!("{name} does things"), Arc::new(schema))
    }

    #[test]
    fn a_listing_is_read_back_only_for_the_server_that_wrote_it() {
        let dir = tempfile::tempdir().unwrap();
        let remembered = Remembered::new(dir.path(), &config("a/../b", "http://one/mcp"));
        assert_eq!(remembered.load().unwrap(), None, "nothing yet");
        let tools = vec![tool("x"), tool("y")];
        remembered.store(remembered.ticket(), tools.par_iter()).unwrap();
        assert_eq!(remembered.load().unwrap(), Some(tools.clone()));
        assert!(remembered.path().starts_with(dir.path()), "{:?}", remembered.path());

        // Another URL under the same name is another server; new headers are not.
        let moved = Remembered::new(dir.path(), &config("a/../b", "http://two/mcp"));
        assert_eq!(moved.load().unwrap(), None);
        let mut rotated = config("a/../b", "http://one/mcp");
        if let McpTransport::StreamableHttp { headers, .. } = &mut rotated.transport {
            headers.insert("Authorization".into(), "Bearer new".into());
        }
        assert_eq!(Remembered::new(dir.path(), &rotated).load().unwrap(), Some(tools.clone()));

        // An older listing never replaces a newer one.
        let (older, newer) = (remembered.ticket(), remembered.ticket());
        remembered.store(newer, [tool("new")].par_iter()).unwrap();
        remembered.store(older, [tool("old")].par_iter()).unwrap();
        assert_eq!(remembered.load().unwrap(), Some(vec![tool("new")]));

        // A file cut short is an error, not a shorter listing.
        let text = std::fs::read_to_string(remembered.path()).unwrap();
        let mut lines = text.lines();
        let header = lines.next().unwrap().replace("\"tools\":1", "\"tools\":2");
        assert!(header.contains("\"tools\":2"), "{header}");
        std::fs::write(remembered.path(), format!("{header}\n{}\n", lines.next().unwrap()))
            .unwrap();
        assert!(remembered.load().unwrap_err().contains("cut short"));

        remembered.forget();
        assert_eq!(remembered.load().unwrap(), None);
    }
}
