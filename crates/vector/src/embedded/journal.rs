//! A collection's journal: every write, made durable before it is applied to the engine and
//! acknowledged, and replayed when the collection is loaded.
//!
//! qdrant-edge 0.7.2 keeps a write-ahead log but does not replay it when a shard is loaded,
//! so whatever was written since the shard last wrote its segments would be lost with the
//! process. The journal holds exactly that: the writes since the last checkpoint (the
//! shard's segments written, then the journal emptied). Records are framed with their
//! length and a CRC-32, so a record cut short by a crash is recognised and dropped: it was
//! never acknowledged.

use std::{
    fs,
    io::{self, Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
};

use serde_json::{Map, Value, json};
use toolmesh_core::vector::{Condition, Filter, Point, PointId, Scalar, SparseVector};

/// The journal's file in a collection's directory.
pub(super) const FILE: &str = "toolmesh-journal";

/// The bytes before each record: its length and its CRC-32.
const HEADER: usize = 8;
/// A length that marks an absent vector.
const NONE: u32 = u32::MAX;

/// One write to a collection.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Op {
    /// Store points, replacing those with the same ids.
    Upsert(Vec<Point>),
    /// Delete points by id.
    Delete(Vec<PointId>),
    /// Delete the points the filter keeps, then store the points: one record, so a crash
    /// leaves the old points or the new, never neither.
    Replace(Filter, Vec<Point>),
}

impl Op {
    /// The record of the write: framed, ready to append.
    pub(super) fn record(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(self.size_hint());
        match self {
            Op::Upsert(points) => {
                body.push(1);
                put_points(&mut body, points);
            }
            Op::Delete(ids) => {
                body.push(2);
                put_len(&mut body, ids.len());
                for id in ids {
                    body.extend_from_slice(&id.to_le_bytes());
                }
            }
            Op::Replace(filter, points) => {
                body.push(3);
                put_bytes(&mut body, filter_json(filter).to_string().as_bytes());
                put_points(&mut body, points);
            }
        }
        let mut record = Vec::with_capacity(HEADER + body.len());
        record.extend_from_slice(&(body.len() as u32).to_le_bytes());
        record.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        record.extend_from_slice(&body);
        record
    }

    fn size_hint(&self) -> usize {
        let points = |points: &[Point]| {
            points
                .iter()
                .map(|p| 32 + p.dense.as_ref().map_or(0, |d| d.len() * 4) + 256)
                .sum::<usize>()
        };
        match self {
            Op::Upsert(p) | Op::Replace(_, p) => 64 + points(p),
            Op::Delete(ids) => 8 + ids.len() * 8,
        }
    }

    fn decode(body: &[u8]) -> Option<Op> {
        let mut reader = Reader(body);
        let op = match reader.u8()? {
            1 => Op::Upsert(reader.points()?),
            2 => {
                let n = reader.len()?;
                Op::Delete((0..n).map(|_| reader.u64()).collect::<Option<_>>()?)
            }
            3 => {
                let filter: Value = serde_json::from_slice(reader.bytes()?).ok()?;
                Op::Replace(filter_from_json(&filter)?, reader.points()?)
            }
            _ => return None,
        };
        reader.0.is_empty().then_some(op)
    }
}

/// The journal of one collection, open for appending.
#[derive(Debug)]
pub(super) struct Journal {
    path: PathBuf,
    file: fs::File,
    /// Bytes held: everything before this offset is whole records.
    len: u64,
}

impl Journal {
    /// Opens the journal in `dir` (creating it) and reads its records. A torn or damaged
    /// tail (a write that a crash cut short, never acknowledged) is cut off.
    pub(super) fn open(dir: &Path) -> io::Result<(Journal, Vec<Op>)> {
        let path = dir.join(FILE);
        let mut file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (ops, whole) = decode_all(&bytes);
        if whole < bytes.len() {
            tracing::warn!(
                path = %path.display(),
                dropped_bytes = bytes.len() - whole,
                "the journal ends in a record a crash cut short; it was never acknowledged"
            );
            file.set_len(whole as u64)?;
            file.sync_data()?;
        }
        file.seek(SeekFrom::Start(whole as u64))?;
        Ok((Journal { path, file, len: whole as u64 }, ops))
    }

    /// The bytes the journal holds.
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// Appends records and makes them durable. On failure nothing of them stays: the file is
    /// cut back to where it was, so a later record never follows a torn one.
    pub(super) fn append<'a>(
        &mut self,
        records: impl IntoIterator<Item = &'a [u8]>,
    ) -> io::Result<()> {
        let written = (|| {
            let mut added = 0u64;
            for record in records {
                self.file.write_all(record)?;
                added += record.len() as u64;
            }
            self.file.sync_data()?;
            Ok(added)
        })();
        match written {
            Ok(added) => {
                self.len += added;
                Ok(())
            }
            Err(error) => {
                self.cut_back()?;
                Err(error)
            }
        }
    }

    fn cut_back(&mut self) -> io::Result<()> {
        self.file.set_len(self.len)?;
        self.file.seek(SeekFrom::Start(self.len))?;
        self.file.sync_data()
    }

    /// Empties the journal, once what it held is in the shard's segments on disk.
    pub(super) fn clear(&mut self) -> io::Result<()> {
        self.len = 0;
        self.cut_back()
    }

    /// The journal's path, for messages.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

/// Decodes whole records from the start; returns them and the bytes they take.
fn decode_all(bytes: &[u8]) -> (Vec<Op>, usize) {
    let mut ops = Vec::new();
    let mut at = 0;
    while bytes.len() - at >= HEADER {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("four bytes")) as usize;
        let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().expect("four bytes"));
        let Some(body) = bytes.get(at + HEADER..at + HEADER + len) else { break };
        if crc32fast::hash(body) != crc {
            break;
        }
        let Some(op) = Op::decode(body) else { break };
        ops.push(op);
        at += HEADER + len;
    }
    (ops, at)
}

fn put_len(out: &mut Vec<u8>, len: usize) {
    out.extend_from_slice(&(len as u32).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

fn put_points(out: &mut Vec<u8>, points: &[Point]) {
    put_len(out, points.len());
    for point in points {
        out.extend_from_slice(&point.id.to_le_bytes());
        match &point.dense {
            Some(dense) => {
                put_len(out, dense.len());
                for x in dense {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
            None => out.extend_from_slice(&NONE.to_le_bytes()),
        }
        match &point.lexical {
            Some(lexical) => {
                put_len(out, lexical.indices.len());
                for (i, v) in lexical.indices.iter().zip(&lexical.values) {
                    out.extend_from_slice(&i.to_le_bytes());
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
            None => out.extend_from_slice(&NONE.to_le_bytes()),
        }
        let payload = serde_json::to_vec(&point.payload).expect("a JSON map serialises");
        put_bytes(out, &payload);
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn f32(&mut self) -> Option<f32> {
        Some(f32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn len(&mut self) -> Option<usize> {
        let len = self.u32()? as usize;
        // A length past the bytes left is damage, not a reason to allocate.
        (len <= self.0.len()).then_some(len)
    }

    fn optional_len(&mut self) -> Option<Option<usize>> {
        match self.u32()? {
            NONE => Some(None),
            len => Some(Some(len as usize)),
        }
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = self.len()?;
        self.take(len)
    }

    fn points(&mut self) -> Option<Vec<Point>> {
        let n = self.len()?;
        let mut points = Vec::with_capacity(n);
        for _ in 0..n {
            let id = self.u64()?;
            let dense = match self.optional_len()? {
                Some(len) => Some((0..len).map(|_| self.f32()).collect::<Option<Vec<_>>>()?),
                None => None,
            };
            let lexical = match self.optional_len()? {
                Some(len) => {
                    let mut sparse = SparseVector::default();
                    for _ in 0..len {
                        sparse.indices.push(self.u32()?);
                        sparse.values.push(self.f32()?);
                    }
                    Some(sparse)
                }
                None => None,
            };
            let payload: Map<String, Value> = serde_json::from_slice(self.bytes()?).ok()?;
            points.push(Point { id, dense, lexical, payload });
        }
        Some(points)
    }
}

fn filter_json(filter: &Filter) -> Value {
    let conditions = |conditions: &[Condition]| -> Vec<Value> {
        conditions
            .iter()
            .map(|condition| match condition {
                Condition::Is(field, value) => json!({ "is": [field, value.to_json()] }),
                Condition::In(field, values) => {
                    let values: Vec<Value> = values.iter().map(Scalar::to_json).collect();
                    json!({ "in": [field, values] })
                }
                Condition::HasId(ids) => json!({ "has_id": ids }),
                Condition::HasVector(name) => json!({ "has_vector": name }),
            })
            .collect()
    };
    json!({ "must": conditions(&filter.must), "must_not": conditions(&filter.must_not) })
}

fn filter_from_json(value: &Value) -> Option<Filter> {
    let conditions = |key: &str| -> Option<Vec<Condition>> {
        value
            .get(key)?
            .as_array()?
            .iter()
            .map(|condition| {
                let (kind, arguments) = condition.as_object()?.iter().next()?;
                Some(match kind.as_str() {
                    "is" => Condition::Is(
                        arguments.get(0)?.as_str()?.to_owned(),
                        Scalar::from_json(arguments.get(1)?)?,
                    ),
                    "in" => Condition::In(
                        arguments.get(0)?.as_str()?.to_owned(),
                        arguments
                            .get(1)?
                            .as_array()?
                            .iter()
                            .map(Scalar::from_json)
                            .collect::<Option<_>>()?,
                    ),
                    "has_id" => Condition::HasId(
                        arguments.as_array()?.iter().map(Value::as_u64).collect::<Option<_>>()?,
                    ),
                    "has_vector" => Condition::HasVector(arguments.as_str()?.to_owned()),
                    _ => return None,
                })
            })
            .collect()
    };
    Some(Filter { must: conditions("must")?, must_not: conditions("must_not")? })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(id: PointId) -> Point {
        let mut payload = Map::new();
        payload.insert("doc".into(), json!(format!("d{id}")));
        Point {
            id,
            dense: Some(vec![0.25, -1.5, f32::MIN_POSITIVE]),
            lexical: id
                .is_multiple_of(2)
                .then(|| SparseVector { indices: vec![3, 9], values: vec![0.5, 2.0] }),
            payload,
        }
    }

    fn ops() -> Vec<Op> {
        let filter = Filter {
            must: vec![
                Condition::Is("doc".into(), Scalar::Str("d1".into())),
                Condition::In("n".into(), vec![Scalar::Int(-4), Scalar::Bool(true)]),
            ],
            must_not: vec![Condition::HasId(vec![7]), Condition::HasVector("dense".into())],
        };
        vec![
            Op::Upsert(vec![point(1), point(2)]),
            Op::Delete(vec![1, u64::MAX]),
            Op::Replace(filter, vec![point(3)]),
            Op::Replace(Filter::default(), vec![]),
        ]
    }

    #[test]
    fn records_read_back_as_written_and_a_torn_tail_is_dropped() {
        let dir = std::env::temp_dir().join(format!("toolmesh-journal-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let (mut journal, read) = Journal::open(&dir).unwrap();
        assert!(read.is_empty());
        let records: Vec<Vec<u8>> = ops().iter().map(Op::record).collect();
        journal.append(records.iter().map(Vec::as_slice)).unwrap();
        drop(journal);
        assert_eq!(Journal::open(&dir).unwrap().1, ops());

        // A record cut short, then one with a flipped bit: both dropped, and the file is cut
        // back to the whole records, so the next append follows them.
        let path = dir.join(FILE);
        let whole = fs::read(&path).unwrap();
        let extra = Op::Upsert(vec![point(4)]).record();
        fs::write(&path, [&whole[..], &extra[..extra.len() - 3]].concat()).unwrap();
        let (mut journal, read) = Journal::open(&dir).unwrap();
        assert_eq!(read, ops());
        assert_eq!(journal.len(), whole.len() as u64);
        let mut flipped = extra.clone();
        *flipped.last_mut().unwrap() ^= 1;
        journal.append([&flipped[..]]).unwrap();
        drop(journal);
        let (mut journal, read) = Journal::open(&dir).unwrap();
        assert_eq!(read, ops());
        journal.append([&extra[..]]).unwrap();
        drop(journal);
        let mut expected = ops();
        expected.push(Op::Upsert(vec![point(4)]));
        let (mut journal, read) = Journal::open(&dir).unwrap();
        assert_eq!(read, expected);
        journal.clear().unwrap();
        drop(journal);
        assert!(Journal::open(&dir).unwrap().1.is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}
