//! The index's points in the store: one per tool text, named by the text's digest, in a
//! collection per embedding model and format.

use serde_json::{Map, Value, json};
use toolmesh_core::vector::PointId;

use crate::{
    TextDigest,
    handle::{EMBEDDED, NAME},
};

/// Points written or read per request to the store.
pub(crate) const STORE_BATCH: usize = 1_000;

/// Points looked up at once above which the store lists every id it holds instead of
/// looking them up by id: a first index of a large catalog.
pub(crate) const LIST_ALL_FROM: usize = 10_000;

/// The point id of a text digest.
pub(crate) fn point_id(digest: &TextDigest) -> PointId {
    let mut bytes = [0; 8];
    bytes.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(bytes)
}

/// The version of the tool points' format in the name of their collection, so that a
/// change of format starts a new collection. 1: full-precision dense vectors; 2: the same
/// points, their dense vectors at half precision.
pub(crate) const FORMAT: u32 = 2;

/// The earlier formats whose points a new collection copies instead of embedding their
/// texts again: the same digests, lexical vectors and payloads.
pub(crate) const COPIED_FORMATS: [u32; 1] = [1];

/// The collection of the tool points of `model` (or of lexical search alone) in the points'
/// format `version`.
pub(crate) fn collection_name(version: u32, model: Option<&str>) -> String {
    let model: String = model
        .unwrap_or("bm25")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' })
        .collect();
    format!("toolmesh-tools-v{version}-{model}")
}

/// A point's payload: its tool's name, and whether it has its dense vector.
pub(crate) fn payload(name: &str, embedded: bool) -> Map<String, Value> {
    let Value::Object(map) = json!({ NAME: name, EMBEDDED: embedded }) else {
        unreachable!("a JSON object literal")
    };
    map
}
