//! Tool vectors by the digest of the text they embed, kept on disk so that a restart embeds
//! only what it has not seen.
//!
//! One file per model: an 8-byte magic, the dimension count (u32, little endian), then
//! records of a 16-byte text digest and the vector (f32, little endian). Writers append
//! whole records under an exclusive file lock, so processes sharing a cache directory do not
//! interleave; a torn record at the end (a crash mid-write) is cut off at the next open.

use std::{
    collections::{HashMap, HashSet},
    fs::{File, OpenOptions},
    io::{self, Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
    sync::Arc,
};

use sha2::{Digest as _, Sha256};
use tracing::{info, warn};

/// The digest of a tool's text: the first 16 bytes of its SHA-256.
pub type TextDigest = [u8; 16];

/// Returns the digest of `text`.
pub fn digest(text: &str) -> TextDigest {
    let full = Sha256::digest(text.as_bytes());
    let mut digest = [0; 16];
    digest.copy_from_slice(&full[..16]);
    digest
}

const MAGIC: &[u8; 8] = b"TMVEC01\n";
const HEADER: usize = MAGIC.len() + 4;
/// The file is rewritten with only the live vectors once it holds more than this many
/// records and four times as many as are live.
const COMPACT_FLOOR: usize = 20_000;

/// Vectors by text digest, in memory and, when opened on a file, on disk.
#[derive(Debug)]
pub struct VectorStore {
    vectors: HashMap<TextDigest, Arc<[f32]>>,
    dimensions: usize,
    file: Option<(PathBuf, File)>,
}

impl VectorStore {
    /// Returns a store that keeps vectors in memory only.
    pub fn in_memory(dimensions: usize) -> Self {
        VectorStore { vectors: HashMap::new(), dimensions, file: None }
    }

    /// Opens (or creates) the store of `model_id` in `dir`, loading the vectors it holds.
    /// A file of another dimension count, or one that is not a vector file, is started anew.
    pub fn open(dir: &Path, model_id: &str, dimensions: usize) -> io::Result<Self> {
        let name: String = model_id
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' })
            .collect();
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{name}.vectors"));
        let mut file =
            OpenOptions::new().read(true).append(true).create(true).truncate(false).open(&path)?;
        file.lock()?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let record = 16 + 4 * dimensions;
        let header = header(dimensions);
        let mut vectors = HashMap::new();
        if bytes.len() < HEADER || bytes[..HEADER] != header[..] {
            if !bytes.is_empty() {
                warn!(path = %path.display(), "the vector cache is of another format or model; starting it anew");
            }
            file.set_len(0)?;
            file.write_all(&header)?;
        } else {
            let whole = (bytes.len() - HEADER) / record;
            for chunk in bytes[HEADER..].chunks_exact(record) {
                vectors.insert(decode_digest(chunk), decode_vector(&chunk[16..]));
            }
            let end = (HEADER + whole * record) as u64;
            if end != bytes.len() as u64 {
                warn!(path = %path.display(), "cutting a torn record off the vector cache");
                file.set_len(end)?;
            }
            info!(path = %path.display(), vectors = vectors.len(), "loaded cached tool vectors");
        }
        file.unlock()?;
        Ok(VectorStore { vectors, dimensions, file: Some((path, file)) })
    }

    /// Returns the vector of the text with digest `digest`.
    pub fn get(&self, digest: &TextDigest) -> Option<Arc<[f32]>> {
        self.vectors.get(digest).cloned()
    }

    /// Returns how many vectors the store holds.
    pub fn len(&self) -> usize {
        self.vectors.len()
    }

    /// Returns whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.vectors.is_empty()
    }

    /// Adds vectors, appending them to the file; returns them shared. A failed write is
    /// logged and ends persistence for this store, never the search.
    pub fn insert(&mut self, batch: Vec<(TextDigest, Vec<f32>)>) -> Vec<Arc<[f32]>> {
        let mut bytes = Vec::with_capacity(batch.len() * (16 + 4 * self.dimensions));
        let mut shared = Vec::with_capacity(batch.len());
        for (digest, vector) in batch {
            if vector.len() != self.dimensions {
                shared.push(Arc::from(vector));
                continue;
            }
            encode(&mut bytes, &digest, &vector);
            let vector: Arc<[f32]> = vector.into();
            self.vectors.insert(digest, vector.clone());
            shared.push(vector);
        }
        if let Some((path, file)) = &mut self.file
            && let Err(error) = append(file, &bytes)
        {
            warn!(path = %path.display(), %error, "cannot write the vector cache; vectors stay in memory");
            self.file = None;
        }
        shared
    }

    /// Drops the vectors whose digests are not in `live` once the store has grown well
    /// beyond them, rewriting the file.
    pub fn compact(&mut self, live: &HashSet<TextDigest>) {
        if self.vectors.len() <= COMPACT_FLOOR.max(4 * live.len()) {
            return;
        }
        self.vectors.retain(|digest, _| live.contains(digest));
        let Some((path, file)) = &mut self.file else { return };
        let mut bytes = header(self.dimensions);
        for (digest, vector) in &self.vectors {
            encode(&mut bytes, digest, vector);
        }
        let rewrite = |file: &mut File| -> io::Result<()> {
            file.lock()?;
            let written = file.set_len(0).and_then(|()| file.write_all(&bytes));
            file.unlock()?;
            written
        };
        match rewrite(file) {
            Ok(()) => {
                info!(path = %path.display(), vectors = self.vectors.len(), "compacted the vector cache")
            }
            Err(error) => {
                warn!(path = %path.display(), %error, "cannot compact the vector cache; vectors stay in memory");
                self.file = None;
            }
        }
    }
}

/// The file's first bytes: the magic and the dimension count.
fn header(dimensions: usize) -> Vec<u8> {
    let mut header = MAGIC.to_vec();
    header.extend_from_slice(&(dimensions as u32).to_le_bytes());
    header
}

/// Appends one record to `bytes`.
fn encode(bytes: &mut Vec<u8>, digest: &TextDigest, vector: &[f32]) {
    bytes.extend_from_slice(digest);
    for x in vector {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
}

fn append(file: &mut File, bytes: &[u8]) -> io::Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    file.lock()?;
    let written = file.seek(SeekFrom::End(0)).and_then(|_| file.write_all(bytes));
    file.unlock()?;
    written
}

fn decode_digest(chunk: &[u8]) -> TextDigest {
    let mut digest = [0; 16];
    digest.copy_from_slice(&chunk[..16]);
    digest
}

fn decode_vector(bytes: &[u8]) -> Arc<[f32]> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect::<Vec<_>>()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("toolmesh-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn vectors_survive_a_reopen_and_a_torn_tail_is_cut() {
        let dir = temp_dir("reopen");
        let (a, b) = (digest("alpha"), digest("beta"));
        {
            let mut store = VectorStore::open(&dir, "model/x", 3).unwrap();
            assert!(store.is_empty());
            store.insert(vec![(a, vec![1.0, 2.0, 3.0]), (b, vec![-1.0, 0.5, 0.25])]);
        }
        let path = dir.join("model_x.vectors");
        // A crash in the middle of a third record.
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(&[7; 20]).unwrap();
        drop(file);

        let mut store = VectorStore::open(&dir, "model/x", 3).unwrap();
        assert_eq!(store.len(), 2);
        assert_eq!(&*store.get(&b).unwrap(), &[-1.0, 0.5, 0.25]);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), (HEADER + 2 * (16 + 12)) as u64);
        store.insert(vec![(digest("gamma"), vec![0.0, 0.0, 1.0])]);
        assert_eq!(VectorStore::open(&dir, "model/x", 3).unwrap().len(), 3);

        // Another dimension count starts the file anew.
        assert!(VectorStore::open(&dir, "model/x", 4).unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn compaction_keeps_only_live_vectors() {
        let dir = temp_dir("compact");
        let mut store = VectorStore::open(&dir, "m", 1).unwrap();
        let all: Vec<_> =
            (0..COMPACT_FLOOR + 10).map(|i| (digest(&i.to_string()), vec![i as f32])).collect();
        store.insert(all);
        let live: HashSet<_> = [digest("3"), digest("5")].into();
        store.compact(&live);
        assert_eq!(store.len(), 2);
        let reopened = VectorStore::open(&dir, "m", 1).unwrap();
        assert_eq!(reopened.len(), 2);
        assert_eq!(&*reopened.get(&digest("5")).unwrap(), &[5.0]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
