//! `toolmesh ingest`: text and Markdown files into a knowledge collection.
//!
//! Each file is a document whose id is its path relative to the directory given (a file
//! given by itself: its name), after an optional prefix, so ingesting a tree again replaces
//! its documents; two files of one run with the same id are refused before anything is
//! sent. Files are read and checked here (text, within the size limit) and sent in
//! batches; each batch is one `Ingest` call, whose per-document results drive the
//! progress.

use std::{
    io::IsTerminal as _,
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use toolmesh_proto::v1::{
    Document, DocumentFormat, IngestRequest, ListCollectionsRequest,
    knowledge_service_client::KnowledgeServiceClient,
};

/// Bytes of documents sent in one call (well under the server's message limit).
const BATCH_BYTES: usize = 1 << 20;
/// Documents sent in one call, at most.
const BATCH_DOCUMENTS: usize = 64;

/// Progress steps an ingestion aims at: a run of few documents sends them in small batches,
/// so that the progress moves with the work (embedding, not sending, takes the time).
const PROGRESS_STEPS: usize = 20;

/// The documents of one batch, for `total` documents in all.
fn batch_documents(total: usize) -> usize {
    (total / PROGRESS_STEPS).clamp(1, BATCH_DOCUMENTS)
}

/// The knowledge client of a server.
pub type KnowledgeClient = KnowledgeServiceClient<crate::client::Connection>;

/// Connects to the knowledge service of the server at `addr`.
pub async fn connect(
    addr: &str,
    token: Option<&str>,
    tls: &crate::client::ClientTls,
) -> anyhow::Result<KnowledgeClient> {
    let channel = crate::client::channel_with(addr, token, tls).await?;
    Ok(KnowledgeServiceClient::new(channel).max_decoding_message_size(16 << 20))
}

/// What the server says of `collection`: `Ok(None)` when the caller may not list the
/// collections (ingesting may still be allowed); an error naming the collections there are
/// when it has no such collection, before any file is read.
pub async fn collection(
    client: &mut KnowledgeClient,
    collection: &str,
) -> anyhow::Result<Option<toolmesh_proto::v1::CollectionInfo>> {
    let listed = match client.list_collections(ListCollectionsRequest {}).await {
        Ok(listed) => listed.into_inner().collections,
        Err(status) if status.code() == tonic::Code::PermissionDenied => return Ok(None),
        Err(status) => anyhow::bail!("cannot list the collections: {}", status.message()),
    };
    let names: Vec<&str> = listed.iter().map(|c| c.name.as_str()).collect();
    match listed.iter().find(|c| c.name == collection) {
        Some(info) => Ok(Some(info.clone())),
        None if names.is_empty() => anyhow::bail!(
            "the server has no knowledge collection {collection:?}, nor any other: declare it \
             in [[knowledge.collections]]"
        ),
        None => anyhow::bail!(
            "the server has no knowledge collection {collection:?}; it has {} (declare a new \
             one in [[knowledge.collections]])",
            names.join(", ")
        ),
    }
}

/// A file to ingest: its document id and its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// The document id: the path relative to the directory given.
    pub id: String,
    /// Where it is.
    pub path: PathBuf,
    /// Whether it is Markdown.
    pub markdown: bool,
}

/// What an ingestion did.
#[derive(Debug, Default)]
pub struct IngestSummary {
    /// Documents in.
    pub ingested: u64,
    /// Chunks written.
    pub chunks: u64,
    /// Documents that failed, with the reason.
    pub failed: Vec<(String, String)>,
    /// Documents that failed beyond those the server named.
    pub unlisted_failures: u64,
    /// Files skipped: not text or Markdown by their extension.
    pub skipped: Vec<PathBuf>,
}

/// The format of a file by its extension: `Some(true)` Markdown, `Some(false)` text.
fn format_of(path: &Path) -> Option<bool> {
    match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
        "md" | "markdown" | "mdx" => Some(true),
        "txt" | "text" => Some(false),
        _ => None,
    }
}

/// What [`collect`] found under the paths it was given.
#[derive(Debug, Default)]
pub struct Collected {
    /// The text and Markdown files, by id.
    pub files: Vec<SourceFile>,
    /// Files skipped for their extension.
    pub skipped: Vec<PathBuf>,
    /// Links that lead out of the directory they were found in: not followed.
    pub links_out: Vec<PathBuf>,
}

/// Finds the files under `paths`, recursively, in a stable order. A symbolic link is
/// followed only where it leads to a place inside the directory given (a link to
/// `/etc/passwd` is not read), and every directory is read once, so links that loop end.
pub fn collect(paths: &[PathBuf], prefix: &str) -> anyhow::Result<Collected> {
    let mut found = Collected::default();
    for root in paths {
        let meta = std::fs::metadata(root).with_context(|| format!("{}", root.display()))?;
        if meta.is_file() {
            let id = root.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            match format_of(root) {
                Some(markdown) => found.files.push(SourceFile { id, path: root.clone(), markdown }),
                None => found.skipped.push(root.clone()),
            }
            continue;
        }
        let real_root =
            std::fs::canonicalize(root).with_context(|| format!("{}", root.display()))?;
        let mut visited = std::collections::HashSet::from([real_root.clone()]);
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
                .with_context(|| format!("{}", dir.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            entries.sort();
            for path in entries {
                // Where the path really is, links resolved; a dangling link is nowhere.
                let Ok(real) = std::fs::canonicalize(&path) else {
                    found.skipped.push(path);
                    continue;
                };
                if !real.starts_with(&real_root) {
                    found.links_out.push(path);
                } else if real.is_dir() {
                    if visited.insert(real) {
                        stack.push(path);
                    }
                } else if let Some(markdown) = format_of(&path) {
                    let relative = path.strip_prefix(root).unwrap_or(&path);
                    let id = relative.to_string_lossy().replace(std::path::MAIN_SEPARATOR, "/");
                    found.files.push(SourceFile { id, path, markdown });
                } else {
                    found.skipped.push(path);
                }
            }
        }
    }
    for file in &mut found.files {
        file.id.insert_str(0, prefix);
    }
    found.files.sort_by(|a, b| a.id.cmp(&b.id));
    // Two files of one id: the later would replace the earlier, unseen.
    if let Some(pair) = found.files.windows(2).find(|pair| pair[0].id == pair[1].id) {
        anyhow::bail!(
            "{} and {} would both be the document {:?} (a document is named by its path \
             within the directory given), and one would replace the other: ingest the \
             directories one at a time, each with a --prefix of its own",
            pair[0].path.display(),
            pair[1].path.display(),
            pair[0].id
        );
    }
    Ok(found)
}

/// Reads a file as a document's text; `Err` says why it cannot be one.
fn read(file: &SourceFile, max_bytes: u64) -> Result<String, String> {
    let size = std::fs::metadata(&file.path).map_err(|e| e.to_string())?.len();
    if size > max_bytes {
        return Err(format!(
            "the file is {size} bytes; at most {max_bytes} are accepted per document (--max-bytes)"
        ));
    }
    let bytes = std::fs::read(&file.path).map_err(|e| e.to_string())?;
    if bytes.contains(&0) {
        return Err("not a text file (it holds NUL bytes)".into());
    }
    let text = String::from_utf8(bytes).map_err(|_| "not a text file (not UTF-8)".to_owned())?;
    if text.trim().is_empty() {
        return Err("the file is empty".into());
    }
    Ok(text)
}

/// Shows progress: a bar on a terminal, a plain line per batch otherwise.
enum Progress {
    Bar(indicatif::ProgressBar),
    Lines { total: u64, done: u64 },
}

impl Progress {
    fn new(total: u64) -> Progress {
        if std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:40} {pos}/{len} documents {elapsed_precise} eta {eta} {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            // The clock moves while a batch is being embedded.
            bar.enable_steady_tick(std::time::Duration::from_millis(200));
            Progress::Bar(bar)
        } else {
            Progress::Lines { total, done: 0 }
        }
    }

    fn advance(&mut self, by: u64, chunks: u64) {
        match self {
            Progress::Bar(bar) => {
                bar.inc(by);
                bar.set_message(format!("{chunks} chunks"));
            }
            Progress::Lines { total, done } => {
                *done += by;
                eprintln!("ingested {done}/{total} documents ({chunks} chunks)");
            }
        }
    }

    fn note(&self, line: &str) {
        match self {
            Progress::Bar(bar) => bar.println(line),
            Progress::Lines { .. } => eprintln!("{line}"),
        }
    }

    fn finish(&self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

/// Ingests `files` into `collection` through `client`.
pub async fn ingest(
    client: &mut KnowledgeClient,
    collection: &str,
    files: &[SourceFile],
    max_bytes: u64,
) -> anyhow::Result<IngestSummary> {
    let batch_documents = batch_documents(files.len());
    let mut summary = IngestSummary::default();
    let mut progress = Progress::new(files.len() as u64);
    let mut batch: Vec<Document> = Vec::new();
    let mut bytes = 0;
    let mut pending = files.iter().peekable();
    while pending.peek().is_some() || !batch.is_empty() {
        while pending.peek().is_some() {
            if !batch.is_empty() && (batch.len() >= batch_documents || bytes >= BATCH_BYTES) {
                break;
            }
            let file = pending.next().expect("peeked");
            match read(file, max_bytes) {
                Ok(text) => {
                    bytes += text.len();
                    batch.push(Document {
                        id: file.id.clone(),
                        text,
                        format: if file.markdown {
                            DocumentFormat::Markdown
                        } else {
                            DocumentFormat::Text
                        } as i32,
                        metadata_json: serde_json::json!({ "path": file.id }).to_string(),
                    });
                }
                Err(reason) => {
                    progress.note(&format!("{}: {reason}", file.id));
                    summary.failed.push((file.id.clone(), reason));
                    progress.advance(1, summary.chunks);
                }
            }
        }
        if batch.is_empty() {
            continue;
        }
        let sent = batch.len() as u64;
        let request = IngestRequest {
            collection: collection.to_owned(),
            documents: std::mem::take(&mut batch),
        };
        bytes = 0;
        let response = client
            .ingest(futures::stream::iter([request]))
            .await
            .map_err(|status| anyhow::anyhow!("ingest into {collection:?}: {}", status.message()))?
            .into_inner();
        summary.ingested += response.ingested;
        summary.chunks += response.chunks;
        summary.unlisted_failures += response.failed.saturating_sub(response.results.len() as u64);
        for result in response.results {
            progress.note(&format!("{}: {}", result.id, result.error));
            summary.failed.push((result.id, result.error));
        }
        progress.advance(sent, summary.chunks);
    }
    progress.finish();
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_found_recursively_with_ids_relative_to_the_directory() {
        let dir = std::env::temp_dir().join(format!("toolmesh-ingest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("guide/deep")).unwrap();
        std::fs::write(dir.join("a.md"), "# A").unwrap();
        std::fs::write(dir.join("guide/deep/b.txt"), "b").unwrap();
        std::fs::write(dir.join("guide/logo.png"), [0u8, 1, 2]).unwrap();
        let found = collect(std::slice::from_ref(&dir), "").unwrap();
        let ids: Vec<(&str, bool)> =
            found.files.iter().map(|f| (f.id.as_str(), f.markdown)).collect();
        assert_eq!(ids, [("a.md", true), ("guide/deep/b.txt", false)]);
        assert_eq!(found.skipped, [dir.join("guide/logo.png")]);
        // A file given by itself is named by its file name.
        let one = collect(&[dir.join("guide/deep/b.txt")], "").unwrap();
        assert_eq!(one.files[0].id, "b.txt");
        std::fs::write(dir.join("empty.md"), "  \n").unwrap();
        let empty =
            SourceFile { id: "empty.md".into(), path: dir.join("empty.md"), markdown: true };
        assert_eq!(read(&empty, 100).unwrap_err(), "the file is empty");
        let big = SourceFile { id: "a.md".into(), path: dir.join("a.md"), markdown: true };
        assert!(read(&big, 2).unwrap_err().contains("at most 2"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn links_out_of_the_tree_are_not_followed_and_loops_end() {
        let base = std::env::temp_dir().join(format!("toolmesh-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (dir, outside) = (base.join("docs"), base.join("secret"));
        std::fs::create_dir_all(dir.join("guide")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(dir.join("guide/a.md"), "# A").unwrap();
        std::fs::write(outside.join("passwd.txt"), "root:x:0:0").unwrap();
        let link =
            |target: &Path, at: &str| std::os::unix::fs::symlink(target, dir.join(at)).unwrap();
        link(&outside.join("passwd.txt"), "passwd.txt");
        link(&outside, "secrets");
        link(&base, "up");
        link(Path::new(".."), "guide/parent");
        link(Path::new("."), "guide/here");
        link(&dir.join("guide/a.md"), "same.md");
        let found = collect(std::slice::from_ref(&dir), "").unwrap();
        let ids: Vec<&str> = found.files.iter().map(|f| f.id.as_str()).collect();
        // The link inside the tree is a document of its own; nothing outside is read, and
        // the loops back to the root and to the directory itself end.
        assert_eq!(ids, ["guide/a.md", "same.md"]);
        let mut out: Vec<PathBuf> = found.links_out.clone();
        out.sort();
        assert_eq!(out, [dir.join("passwd.txt"), dir.join("secrets"), dir.join("up")]);
        let _ = std::fs::remove_dir_all(&base);
    }

    /// Two trees with a file of the same relative path are refused, naming both files,
    /// unless a prefix tells them apart; few documents go in small batches.
    #[test]
    fn same_named_files_of_two_trees_are_refused_and_a_prefix_keeps_them_apart() {
        let base = std::env::temp_dir().join(format!("toolmesh-roots-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        for root in ["handbook", "wiki"] {
            std::fs::create_dir_all(base.join(root)).unwrap();
            std::fs::write(base.join(root).join("README.md"), format!("# {root}")).unwrap();
        }
        let both = [base.join("handbook"), base.join("wiki")];
        let error = collect(&both, "").unwrap_err().to_string();
        assert!(
            error.contains("handbook/README.md") && error.contains("wiki/README.md"),
            "{error}"
        );
        assert!(error.contains("--prefix"), "{error}");
        let one = collect(&both[..1], "handbook/").unwrap();
        assert_eq!(one.files[0].id, "handbook/README.md");
        let _ = std::fs::remove_dir_all(&base);

        assert_eq!(batch_documents(7), 1);
        assert_eq!(batch_documents(100), 5);
        assert_eq!(batch_documents(100_000), BATCH_DOCUMENTS);
    }
}
