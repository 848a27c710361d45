//! A Qdrant server over gRPC, for deployments where several routers share one store.
//!
//! Every request runs under a deadline (reads under one, writes under a longer one), so a
//! server that does not answer fails the request with `UNAVAILABLE` naming it instead of
//! holding the caller. The client's channels reconnect by themselves: a server that comes
//! back is used again without a restart.

use std::{collections::HashMap, time::Duration};

use async_trait::async_trait;
use qdrant_client::{
    Payload, Qdrant, QdrantError,
    qdrant::{
        self, CountPointsBuilder, CreateCollectionBuilder, CreateFieldIndexCollectionBuilder,
        DeletePointsBuilder, FacetCountsBuilder, FieldType, GetPointsBuilder, Modifier,
        PointStruct, PointsIdsList, PointsSelector, PointsUpdateOperation, PrefetchQueryBuilder,
        QueryPointsBuilder, ScrollPointsBuilder, SparseVectorParamsBuilder,
        SparseVectorsConfigBuilder, UpdateBatchPointsBuilder, VectorParamsBuilder,
        VectorsConfigBuilder,
        points_selector::PointsSelectorOneOf,
        points_update_operation::{self, Operation},
    },
};
use serde_json::{Map, Value};
use toolmesh_core::vector::{
    CollectionSpec, DENSE, Filter, Hit, LEXICAL, Point, PointId, Precision, Query, Record,
    SparseVector, StoreError, VectorStore,
};
use tracing::info;

use crate::filter::server_filter;

/// Points per page when ids are scrolled.
const SCROLL_PAGE: u32 = 10_000;

/// The oldest Qdrant server the store works with: hybrid queries fuse with a parametrised
/// reciprocal rank fusion (`Rrf { k }`), which Qdrant has from 1.16.
pub(crate) const MIN_SERVER_VERSION: (u64, u64) = (1, 16);

/// Returns `version` (`1.19.0`, `v1.16.2-dev`) as (major, minor); `None` when it is no
/// version.
fn major_minor(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.trim().trim_start_matches('v').split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// How long the store waits for the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// For a read: a search, a lookup, a listing, a health check; and for making a
    /// connection, so that a server that is down fails writes as fast as reads.
    pub read: Duration,
    /// For a write: an upsert, a deletion, a replacement, a new collection.
    pub write: Duration,
}

/// A Qdrant server.
pub struct ServerStore {
    /// Sends reads.
    client: Qdrant,
    /// Sends writes: the same server on a channel of its own, with the longer deadline.
    writer: Qdrant,
    url: String,
}

impl std::fmt::Debug for ServerStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerStore").field("url", &self.url).finish_non_exhaustive()
    }
}

impl ServerStore {
    /// Returns a store on the server at `url` (its gRPC port, for example
    /// `http://qdrant:6334`). Nothing is sent until the first request; each request gives up
    /// after its deadline in `timeouts`.
    pub fn connect(
        url: &str,
        api_key: Option<String>,
        timeouts: Timeouts,
    ) -> Result<ServerStore, StoreError> {
        let client = |timeout: Duration| {
            Qdrant::from_url(url)
                .api_key(api_key.clone())
                .timeout(timeout)
                .connect_timeout(timeouts.read)
                .keep_alive_while_idle()
                // The store checks the version itself, at start: see `check`.
                .skip_compatibility_check()
                .build()
                .map_err(|e| StoreError::Failed {
                    store: format!("qdrant at {url}"),
                    reason: format!("bad client configuration: {e}"),
                })
        };
        Ok(ServerStore {
            client: client(timeouts.read)?,
            writer: client(timeouts.write)?,
            url: url.to_owned(),
        })
    }

    /// Returns the server's points of `points`.
    fn points(&self, collection: &str, points: Vec<Point>) -> Result<Vec<PointStruct>, StoreError> {
        points.into_iter().map(point).collect::<Result<Vec<_>, _>>().map_err(|reason| {
            StoreError::Invalid {
                store: self.describe(),
                collection: collection.to_owned(),
                reason,
            }
        })
    }

    /// Maps a client error: transport failures and timeouts are `Unavailable`, a missing
    /// collection `NoCollection`, a refused request `Invalid`.
    fn error(&self, collection: &str, error: QdrantError) -> StoreError {
        let store = self.describe();
        match error {
            QdrantError::ResponseError { status } => match status.code() {
                tonic::Code::NotFound => {
                    StoreError::NoCollection { store, collection: collection.to_owned() }
                }
                tonic::Code::InvalidArgument => StoreError::Invalid {
                    store,
                    collection: collection.to_owned(),
                    reason: status.message().to_owned(),
                },
                // The client reports a connection it could not make as INTERNAL.
                tonic::Code::Internal if status.message().starts_with("Failed to connect") => {
                    StoreError::Unavailable { store, reason: status.message().to_owned() }
                }
                tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Cancelled
                | tonic::Code::Unknown => {
                    StoreError::Unavailable { store, reason: status.message().to_owned() }
                }
                _ => StoreError::Failed { store, reason: status.message().to_owned() },
            },
            other => StoreError::Unavailable { store, reason: other.to_string() },
        }
    }
}

fn point(point: Point) -> Result<PointStruct, String> {
    let mut vectors: HashMap<String, qdrant::Vector> = HashMap::new();
    if let Some(dense) = point.dense {
        vectors.insert(DENSE.to_owned(), qdrant::Vector::new_dense(dense));
    }
    if let Some(lexical) = point.lexical {
        vectors.insert(
            LEXICAL.to_owned(),
            qdrant::Vector::new_sparse(lexical.indices, lexical.values),
        );
    }
    let payload = Payload::try_from(Value::Object(point.payload)).map_err(|e| e.to_string())?;
    Ok(PointStruct::new(point.id, vectors, payload))
}

fn json(payload: HashMap<String, qdrant::Value>) -> Map<String, Value> {
    Payload::from(payload).into()
}

fn numeric(id: Option<qdrant::PointId>) -> Option<PointId> {
    match id?.point_id_options? {
        qdrant::point_id::PointIdOptions::Num(n) => Some(n),
        qdrant::point_id::PointIdOptions::Uuid(_) => None,
    }
}

fn dense_of(vector: qdrant::VectorOutput) -> Option<Vec<f32>> {
    match vector.into_vector() {
        qdrant::vector_output::Vector::Dense(dense) => Some(dense.data),
        _ => None,
    }
}

fn sparse_of(vector: qdrant::VectorOutput) -> Option<SparseVector> {
    match vector.into_vector() {
        qdrant::vector_output::Vector::Sparse(sparse) => {
            Some(SparseVector { indices: sparse.indices, values: sparse.values })
        }
        _ => None,
    }
}

fn selector(filter: qdrant::Filter) -> PointsSelector {
    PointsSelector { points_selector_one_of: Some(PointsSelectorOneOf::Filter(filter)) }
}

#[async_trait]
impl VectorStore for ServerStore {
    fn backend(&self) -> &'static str {
        "qdrant"
    }

    fn describe(&self) -> String {
        format!("qdrant at {}", self.url)
    }

    async fn ensure(&self, spec: &CollectionSpec) -> Result<(), StoreError> {
        let name = &spec.name;
        let exists = self.client.collection_exists(name).await.map_err(|e| self.error(name, e))?;
        if exists {
            return Ok(());
        }
        let mut create = CreateCollectionBuilder::new(name);
        if let Some(size) = spec.dense_size {
            let mut config = VectorsConfigBuilder::default();
            let datatype = match spec.precision {
                Precision::Full => qdrant::Datatype::Float32,
                Precision::Half => qdrant::Datatype::Float16,
            };
            config.add_named_vector_params(
                DENSE,
                VectorParamsBuilder::new(size as u64, qdrant::Distance::Cosine).datatype(datatype),
            );
            create = create.vectors_config(config);
        }
        if spec.lexical {
            let mut sparse = SparseVectorsConfigBuilder::default();
            sparse.add_named_vector_params(
                LEXICAL,
                SparseVectorParamsBuilder::default().modifier(Modifier::Idf as i32),
            );
            create = create.sparse_vectors_config(sparse);
        }
        match self.writer.create_collection(create).await {
            Ok(_) => {}
            // Another replica created it first.
            Err(QdrantError::ResponseError { status })
                if status.code() == tonic::Code::AlreadyExists
                    || status.message().contains("already exists") => {}
            Err(e) => return Err(self.error(name, e)),
        }
        for field in &spec.keyword_fields {
            self.writer
                .create_field_index(
                    CreateFieldIndexCollectionBuilder::new(name, field, FieldType::Keyword)
                        .wait(true),
                )
                .await
                .map_err(|e| self.error(name, e))?;
        }
        info!(collection = %name, store = %self.describe(), "created a collection");
        Ok(())
    }

    async fn upsert(&self, collection: &str, points: Vec<Point>) -> Result<(), StoreError> {
        if points.is_empty() {
            return Ok(());
        }
        let points = self.points(collection, points)?;
        self.writer
            .upsert_points(qdrant::UpsertPointsBuilder::new(collection, points).wait(true))
            .await
            .map_err(|e| self.error(collection, e))?;
        Ok(())
    }

    async fn delete(&self, collection: &str, ids: Vec<PointId>) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let ids = PointsIdsList { ids: ids.into_iter().map(Into::into).collect() };
        self.writer
            .delete_points(DeletePointsBuilder::new(collection).points(ids).wait(true))
            .await
            .map_err(|e| self.error(collection, e))?;
        Ok(())
    }

    async fn replace(
        &self,
        collection: &str,
        filter: Filter,
        points: Vec<Point>,
    ) -> Result<(), StoreError> {
        let points = self.points(collection, points)?;
        let mut operations = vec![PointsUpdateOperation {
            operation: Some(Operation::DeletePoints(points_update_operation::DeletePoints {
                points: Some(selector(server_filter(&filter))),
                ..Default::default()
            })),
        }];
        if !points.is_empty() {
            operations.push(PointsUpdateOperation {
                operation: Some(Operation::Upsert(points_update_operation::PointStructList {
                    points,
                    ..Default::default()
                })),
            });
        }
        self.writer
            .update_points_batch(UpdateBatchPointsBuilder::new(collection, operations).wait(true))
            .await
            .map_err(|e| self.error(collection, e))?;
        Ok(())
    }

    async fn retrieve(
        &self,
        collection: &str,
        ids: Vec<PointId>,
        with_vectors: bool,
    ) -> Result<Vec<Record>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<qdrant::PointId> = ids.into_iter().map(Into::into).collect();
        let request =
            GetPointsBuilder::new(collection, ids).with_payload(true).with_vectors(with_vectors);
        let found = self.client.get_points(request).await.map_err(|e| self.error(collection, e))?;
        Ok(found
            .result
            .into_iter()
            .filter_map(|point| {
                let mut named = match point.vectors.and_then(|v| v.vectors_options) {
                    Some(qdrant::vectors_output::VectorsOptions::Vectors(named)) => named.vectors,
                    _ => HashMap::new(),
                };
                Some(Record {
                    id: numeric(point.id)?,
                    payload: json(point.payload),
                    dense: named.remove(DENSE).and_then(dense_of),
                    lexical: named.remove(LEXICAL).and_then(sparse_of),
                })
            })
            .collect())
    }

    async fn ids(
        &self,
        collection: &str,
        filter: Option<Filter>,
    ) -> Result<Vec<PointId>, StoreError> {
        let filter = filter.as_ref().map(server_filter);
        let mut ids = Vec::new();
        let mut offset = None;
        loop {
            let mut request = ScrollPointsBuilder::new(collection)
                .limit(SCROLL_PAGE)
                .with_payload(false)
                .with_vectors(false);
            if let Some(filter) = filter.clone() {
                request = request.filter(filter);
            }
            if let Some(offset) = offset.take() {
                request = request.offset(offset);
            }
            let page = self.client.scroll(request).await.map_err(|e| self.error(collection, e))?;
            ids.extend(page.result.into_iter().filter_map(|point| numeric(point.id)));
            match page.next_page_offset {
                Some(next) => offset = Some(next),
                None => return Ok(ids),
            }
        }
    }

    async fn query(&self, collection: &str, query: Query) -> Result<Vec<Hit>, StoreError> {
        let filter = query.filter.as_ref().map(server_filter);
        let k = query.rrf_k();
        let candidates = query.candidates.max(query.limit) as u64;
        let payload = query.payload;
        let lexical = query.lexical.filter(|l| !l.is_empty());
        let mut request = QueryPointsBuilder::new(collection).limit(query.limit as u64);
        match (query.dense, lexical) {
            (Some(dense), Some(lexical)) => {
                request = request
                    .add_prefetch(
                        PrefetchQueryBuilder::default()
                            .query(qdrant::Query::new_nearest(dense))
                            .using(DENSE)
                            .limit(candidates),
                    )
                    .add_prefetch(
                        PrefetchQueryBuilder::default()
                            .query(qdrant::Query::new_nearest(qdrant::VectorInput::new_sparse(
                                lexical.indices,
                                lexical.values,
                            )))
                            .using(LEXICAL)
                            .limit(candidates),
                    )
                    .query(qdrant::Query::new_rrf(qdrant::Rrf {
                        k: Some(k as u32),
                        ..Default::default()
                    }));
            }
            (Some(dense), None) => {
                request = request.query(qdrant::Query::new_nearest(dense)).using(DENSE);
            }
            (None, Some(lexical)) => {
                request = request
                    .query(qdrant::Query::new_nearest(qdrant::VectorInput::new_sparse(
                        lexical.indices,
                        lexical.values,
                    )))
                    .using(LEXICAL);
            }
            (None, None) => return Ok(Vec::new()),
        }
        if let Some(filter) = filter {
            request = request.filter(filter);
        }
        let found = self
            .client
            .query(request.with_payload(payload))
            .await
            .map_err(|e| self.error(collection, e))?;
        Ok(found
            .result
            .into_iter()
            .filter_map(|point| {
                Some(Hit {
                    id: numeric(point.id)?,
                    score: point.score,
                    payload: json(point.payload),
                })
            })
            .collect())
    }

    async fn count(&self, collection: &str, filter: Option<Filter>) -> Result<u64, StoreError> {
        let mut request = CountPointsBuilder::new(collection).exact(true);
        if let Some(filter) = filter {
            request = request.filter(server_filter(&filter));
        }
        let counted = self.client.count(request).await.map_err(|e| self.error(collection, e))?;
        Ok(counted.result.map_or(0, |r| r.count))
    }

    async fn distinct(
        &self,
        collection: &str,
        field: &str,
        limit: usize,
    ) -> Result<u64, StoreError> {
        let request =
            FacetCountsBuilder::new(collection, field).limit(limit.max(1) as u64).exact(true);
        let facets = self.client.facet(request).await.map_err(|e| self.error(collection, e))?;
        Ok(facets.hits.len() as u64)
    }

    async fn delete_collection(&self, collection: &str) -> Result<(), StoreError> {
        match self.writer.delete_collection(collection).await {
            Ok(_) => {}
            Err(QdrantError::ResponseError { status })
                if status.code() == tonic::Code::NotFound => {}
            Err(e) => return Err(self.error(collection, e)),
        }
        info!(collection, store = %self.describe(), "deleted a collection");
        Ok(())
    }

    fn shared(&self) -> bool {
        true
    }

    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Checks that the server answers and is new enough: an older one is refused, saying
    /// which version it is and which the store needs.
    async fn check(&self) -> Result<(), StoreError> {
        let reply = self.client.health_check().await.map_err(|e| self.error("", e))?;
        let (min_major, min_minor) = MIN_SERVER_VERSION;
        match major_minor(&reply.version) {
            Some(version) if version >= MIN_SERVER_VERSION => Ok(()),
            _ => Err(StoreError::Failed {
                store: self.describe(),
                reason: format!(
                    "the server is Qdrant {:?}; toolmesh needs Qdrant {min_major}.{min_minor} or \
                     newer (its hybrid queries use parametrised RRF fusion)",
                    reply.version
                ),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::major_minor;

    #[test]
    fn versions_are_read_as_major_and_minor() {
        assert_eq!(major_minor("1.19.0"), Some((1, 19)));
        assert_eq!(major_minor("v1.16.2-dev"), Some((1, 16)));
        assert_eq!(major_minor("2.0"), Some((2, 0)));
        assert!(major_minor("1.15.4") < Some(super::MIN_SERVER_VERSION));
        assert!(major_minor("1.9.9") < Some(super::MIN_SERVER_VERSION));
        assert_eq!(major_minor("dev"), None);
    }
}
