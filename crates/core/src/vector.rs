//! The vector store seam: collections of points with a dense vector, an optional sparse
//! lexical vector and a JSON payload, queried by either or both with the store's own fusion.
//!
//! Two Qdrant backends implement [`VectorStore`] in `toolmesh-vector`: Qdrant's engine
//! in-process and a Qdrant server. Everything above (the tool index, knowledge collections)
//! speaks these types only.

use std::{collections::BTreeMap, fmt, sync::Arc};

use async_trait::async_trait;
use serde_json::{Map, Value};

use crate::ErrorCode;

/// A point's id within its collection.
pub type PointId = u64;

/// The name of the dense vector of every collection.
pub const DENSE: &str = "dense";
/// The name of the sparse lexical vector of collections that have one.
pub const LEXICAL: &str = "lexical";

/// What a collection holds; the store creates it on first use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectionSpec {
    /// The collection's name.
    pub name: String,
    /// Dimensions of the dense vector, compared by cosine similarity; `None`: points have
    /// no dense vector.
    pub dense_size: Option<usize>,
    /// How the dense vectors are stored.
    pub precision: Precision,
    /// Whether points carry a sparse lexical vector ([`LEXICAL`]): term weights from the
    /// caller, scaled by the inverse document frequency the store keeps.
    pub lexical: bool,
    /// Payload fields that filters match on, indexed as keywords.
    pub keyword_fields: Vec<String>,
}

/// How a collection stores its dense vectors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Precision {
    /// 32-bit floats, as given.
    #[default]
    Full,
    /// 16-bit floats: half the memory, and half the bytes an exact scan reads, for scores
    /// that differ from full precision's in the third or fourth decimal place.
    Half,
}

impl Precision {
    /// Both precisions, for lookups by name.
    pub const ALL: [Precision; 2] = [Precision::Full, Precision::Half];

    /// Its name: `full` or `half`.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Full => "full",
            Precision::Half => "half",
        }
    }

    /// The bytes one element of a vector takes.
    pub fn element_bytes(self) -> usize {
        match self {
            Precision::Full => 4,
            Precision::Half => 2,
        }
    }
}

/// A sparse vector: term ids and their weights.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SparseVector {
    /// Term ids, each once.
    pub indices: Vec<u32>,
    /// The weight of each term id.
    pub values: Vec<f32>,
}

impl SparseVector {
    /// Returns whether the vector has no terms.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
}

/// One point to store.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// Its id; storing a point with an existing id replaces that point.
    pub id: PointId,
    /// The dense vector, of the collection's size; a point may have none yet.
    pub dense: Option<Vec<f32>>,
    /// The lexical vector, for collections that have one.
    pub lexical: Option<SparseVector>,
    /// The payload.
    pub payload: Map<String, Value>,
}

/// A value a filter compares a payload field with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scalar {
    /// A string (keyword) value.
    Str(String),
    /// An integer value.
    Int(i64),
    /// A boolean value.
    Bool(bool),
}

impl Scalar {
    /// Returns the scalar of a JSON value, if it is a string, an integer or a boolean.
    pub fn from_json(value: &Value) -> Option<Scalar> {
        match value {
            Value::String(s) => Some(Scalar::Str(s.clone())),
            Value::Bool(b) => Some(Scalar::Bool(*b)),
            Value::Number(n) => n.as_i64().map(Scalar::Int),
            _ => None,
        }
    }

    /// Returns the scalar as JSON.
    pub fn to_json(&self) -> Value {
        match self {
            Scalar::Str(s) => Value::String(s.clone()),
            Scalar::Int(i) => Value::from(*i),
            Scalar::Bool(b) => Value::Bool(*b),
        }
    }
}

/// One condition on a payload field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// The field equals the value (or, for an array field, contains it).
    Is(String, Scalar),
    /// The field equals one of the values.
    In(String, Vec<Scalar>),
    /// The point's id is one of these.
    HasId(Vec<PointId>),
    /// The point has the named vector ([`DENSE`] or [`LEXICAL`]).
    HasVector(String),
}

impl Condition {
    /// Returns the payload field the condition looks at; `None` for ids.
    pub fn field(&self) -> Option<&str> {
        match self {
            Condition::Is(field, _) | Condition::In(field, _) => Some(field),
            Condition::HasId(_) | Condition::HasVector(_) => None,
        }
    }
}

/// Conditions on payload fields and ids: every `must` holds and no `must_not` does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Conditions that must all hold.
    pub must: Vec<Condition>,
    /// Conditions none of which may hold.
    pub must_not: Vec<Condition>,
}

impl Filter {
    /// Returns the filter that keeps points whose `field` is `value`.
    pub fn is(field: &str, value: Scalar) -> Filter {
        Filter { must: vec![Condition::Is(field.to_owned(), value)], must_not: Vec::new() }
    }

    /// Returns whether the filter has no conditions.
    pub fn is_empty(&self) -> bool {
        self.must.is_empty() && self.must_not.is_empty()
    }

    /// Returns every condition, kept or excluded.
    pub fn conditions(&self) -> impl Iterator<Item = &Condition> {
        self.must.iter().chain(&self.must_not)
    }
}

/// A search: by the dense vector, the lexical vector or both. With both, each ranking
/// contributes `candidates` points and the store fuses them by reciprocal rank.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Query {
    /// The dense query vector.
    pub dense: Option<Vec<f32>>,
    /// The lexical query vector (term weights of 1 for plain BM25).
    pub lexical: Option<SparseVector>,
    /// Only points this filter keeps are searched.
    pub filter: Option<Filter>,
    /// How many points to return.
    pub limit: usize,
    /// How many candidates each ranking contributes to the fusion.
    pub candidates: usize,
    /// The rank offset of the reciprocal-rank fusion: a point scores `1 / (k + rank)` in
    /// each ranking; 0 means [`DEFAULT_RRF_K`].
    pub rrf_k: usize,
    /// Whether hits carry their payload; without it a hit's payload is empty, and the store
    /// reads nothing but ids and scores.
    pub payload: bool,
}

/// The usual rank offset of reciprocal-rank fusion.
pub const DEFAULT_RRF_K: usize = 60;

impl Query {
    /// Returns the rank offset of the fusion.
    pub fn rrf_k(&self) -> usize {
        if self.rrf_k == 0 { DEFAULT_RRF_K } else { self.rrf_k }
    }
}

/// A point a query found.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    /// The point's id.
    pub id: PointId,
    /// Its score; higher is better. Fused scores are reciprocal-rank sums.
    pub score: f32,
    /// Its payload.
    pub payload: Map<String, Value>,
}

/// A stored point, read back by id.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The point's id.
    pub id: PointId,
    /// Its payload.
    pub payload: Map<String, Value>,
    /// Its dense vector, when vectors were asked for.
    pub dense: Option<Vec<f32>>,
    /// Its lexical vector, when vectors were asked for.
    pub lexical: Option<SparseVector>,
}

impl From<Record> for Point {
    /// The point a record was read from, with what of it was read.
    fn from(record: Record) -> Point {
        Point {
            id: record.id,
            dense: record.dense,
            lexical: record.lexical,
            payload: record.payload,
        }
    }
}

/// A vector store failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached or did not answer in time.
    #[error("vector store {store} is unavailable: {reason}")]
    Unavailable {
        /// The store (backend and address).
        store: String,
        /// Why.
        reason: String,
    },
    /// No such collection.
    #[error("vector store {store} has no collection {collection:?}")]
    NoCollection {
        /// The store.
        store: String,
        /// The collection asked for.
        collection: String,
    },
    /// The request does not fit the collection (a vector of another size, a bad filter).
    #[error("vector store {store}, collection {collection:?}: {reason}")]
    Invalid {
        /// The store.
        store: String,
        /// The collection.
        collection: String,
        /// What does not fit.
        reason: String,
    },
    /// The store refuses writes: the disk it writes to has less free space than it keeps
    /// in reserve. Reads go on.
    #[error(
        "vector store {store} refuses writes: the disk of {disk} has {free_mb} MiB free, less \
         than the {min_free_mb} MiB it keeps free (vector.min_free_mb); free space on that \
         disk or give the data directory a larger one"
    )]
    Full {
        /// The store.
        store: String,
        /// The directory whose disk is full.
        disk: String,
        /// MiB free on it.
        free_mb: u64,
        /// MiB the store keeps free.
        min_free_mb: u64,
    },
    /// The store failed otherwise.
    #[error("vector store {store} failed: {reason}")]
    Failed {
        /// The store.
        store: String,
        /// Why.
        reason: String,
    },
}

impl StoreError {
    /// Returns the failure kind for callers.
    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::Unavailable { .. } => ErrorCode::Unavailable,
            StoreError::NoCollection { .. } => ErrorCode::NotFound,
            StoreError::Invalid { .. } => ErrorCode::InvalidArgument,
            StoreError::Full { .. } => ErrorCode::ResourceExhausted,
            StoreError::Failed { .. } => ErrorCode::Internal,
        }
    }
}

/// A Qdrant store of collections, in-process or on a server.
///
/// Every method is async and bounded: the in-process engine runs on blocking threads, the
/// server backend under its request timeout, so no call waits on the store past its time.
#[async_trait]
pub trait VectorStore: Send + Sync + fmt::Debug {
    /// Names the backend in health entries and errors: `embedded` or `qdrant`.
    fn backend(&self) -> &'static str;

    /// Names the store for messages: the backend and its directory or address.
    fn describe(&self) -> String;

    /// Creates the collection if it does not exist; checks that an existing one fits `spec`.
    async fn ensure(&self, spec: &CollectionSpec) -> Result<(), StoreError>;

    /// Stores points, replacing those with the same ids.
    async fn upsert(&self, collection: &str, points: Vec<Point>) -> Result<(), StoreError>;

    /// Deletes points by id; ids that are not stored are ignored.
    async fn delete(&self, collection: &str, ids: Vec<PointId>) -> Result<(), StoreError>;

    /// Deletes the points `filter` keeps, then stores `points`, so that no point `filter`
    /// keeps survives unless it is among `points`. The embedded engine applies both under
    /// one lock, so queries see the old points or the new, never both; a server applies
    /// them as one ordered batch.
    async fn replace(
        &self,
        collection: &str,
        filter: Filter,
        points: Vec<Point>,
    ) -> Result<(), StoreError>;

    /// Reads points by id, with their vectors or without; missing ids are left out.
    async fn retrieve(
        &self,
        collection: &str,
        ids: Vec<PointId>,
        with_vectors: bool,
    ) -> Result<Vec<Record>, StoreError>;

    /// Returns the ids of the points `filter` keeps (all points without one), in no
    /// particular order; no payload or vector is read.
    async fn ids(
        &self,
        collection: &str,
        filter: Option<Filter>,
    ) -> Result<Vec<PointId>, StoreError>;

    /// Returns the best points for `query`, best first.
    async fn query(&self, collection: &str, query: Query) -> Result<Vec<Hit>, StoreError>;

    /// Counts the points `filter` keeps (all points without one).
    async fn count(&self, collection: &str, filter: Option<Filter>) -> Result<u64, StoreError>;

    /// Returns how many distinct values `field` has among the collection's points (up to
    /// `limit`).
    async fn distinct(
        &self,
        collection: &str,
        field: &str,
        limit: usize,
    ) -> Result<u64, StoreError>;

    /// Deletes the collection and every point in it; one that does not exist is not an
    /// error.
    async fn delete_collection(&self, collection: &str) -> Result<(), StoreError>;

    /// Returns whether other processes may use the store: a server's collections may be in
    /// use by routers of another version, an embedded store's are this process's alone.
    fn shared(&self) -> bool;

    /// Checks that the store answers.
    async fn check(&self) -> Result<(), StoreError>;

    /// Makes everything written so far durable (the embedded engine writes its segments to
    /// disk; a server has already).
    async fn flush(&self) -> Result<(), StoreError>;

    /// Closes the store at shutdown: the embedded engine writes and lets go of its
    /// directory, so another process (or a restarted app) may open it; later requests fail
    /// as unavailable. A server connection has nothing to let go of.
    async fn close(&self) {}
}

/// The stores of a process: the default one (`[vector]`), which the tool index uses, and
/// the named ones (`[vector.stores.NAME]`) that knowledge collections may choose. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct VectorStores {
    default: Arc<dyn VectorStore>,
    named: BTreeMap<String, Arc<dyn VectorStore>>,
}

impl VectorStores {
    /// The name that chooses the default store.
    pub const DEFAULT: &'static str = "default";

    /// Returns the stores: `default`, and `named` by their names.
    pub fn new(
        default: Arc<dyn VectorStore>,
        named: BTreeMap<String, Arc<dyn VectorStore>>,
    ) -> VectorStores {
        VectorStores { default, named }
    }

    /// Returns only `store`, as the default.
    pub fn single(store: Arc<dyn VectorStore>) -> VectorStores {
        VectorStores::new(store, Default::default())
    }

    /// Returns the default store.
    pub fn default_store(&self) -> &Arc<dyn VectorStore> {
        &self.default
    }

    /// Returns the store `name` chooses: the default for `None` or [`Self::DEFAULT`].
    pub fn get(&self, name: Option<&str>) -> Option<&Arc<dyn VectorStore>> {
        match name {
            None | Some(Self::DEFAULT) => Some(&self.default),
            Some(name) => self.named.get(name),
        }
    }

    /// Returns the names a store may be chosen by: [`Self::DEFAULT`], then the named ones.
    pub fn names(&self) -> Vec<&str> {
        std::iter::once(Self::DEFAULT).chain(self.named.keys().map(String::as_str)).collect()
    }

    /// Returns every store with its name (`None` for the default).
    pub fn all(&self) -> impl Iterator<Item = (Option<&str>, &Arc<dyn VectorStore>)> {
        std::iter::once((None, &self.default))
            .chain(self.named.iter().map(|(name, store)| (Some(name.as_str()), store)))
    }
}
