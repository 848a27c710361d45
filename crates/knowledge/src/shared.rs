//! What the retriever's actor, its handle and the collections' search tools share: the
//! configured collections and the stores they are in.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use arc_swap::ArcSwap;
use serde_json::{Map, Value};
use toolmesh_core::{
    StoreError, VectorStore, VectorStores,
    vector::{Condition, Filter, Query, Scalar},
};
use toolmesh_embed::{
    Embedder,
    lexical::{self, terms},
};
use tracing::{Instrument, info_span};

use crate::{CollectionConfig, KnowledgeError, Passage};

/// The payload fields of a chunk.
pub(crate) const DOC_ID: &str = "doc_id";
pub(crate) const POSITION: &str = "chunk";
pub(crate) const TEXT: &str = "text";
pub(crate) const METADATA: &str = "metadata";

/// A configured collection.
#[derive(Debug)]
pub(crate) struct Collection {
    pub(crate) config: CollectionConfig,
    /// Its name in the store.
    pub(crate) stored: String,
    /// The store it is in (`store` of its config).
    pub(crate) store: Arc<dyn VectorStore>,
    /// Held while a write to it runs: one ingestion or deletion at a time.
    pub(crate) writing: tokio::sync::Mutex<()>,
}

/// What the actor and the handle share.
pub(crate) struct Shared {
    /// The stores a collection may be in.
    pub(crate) stores: VectorStores,
    pub(crate) embedder: Option<Arc<dyn Embedder>>,
    pub(crate) collections: ArcSwap<BTreeMap<String, Arc<Collection>>>,
    pub(crate) max_document_bytes: std::sync::atomic::AtomicUsize,
    /// The role that ingests and deletes (`writer_role`).
    pub(crate) writer_role: ArcSwap<String>,
    /// Collections the store could not make, with the reason.
    pub(crate) failed: Mutex<BTreeMap<String, String>>,
    pub(crate) changed: tokio::sync::Notify,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("stores", &self.stores.names()).finish_non_exhaustive()
    }
}

impl Shared {
    /// Returns the best `top_k` passages of `collection` for `query` among those whose
    /// metadata matches `filter` (field → value, or → any of several values).
    pub(crate) async fn search(
        &self,
        collection: &str,
        query: &str,
        top_k: usize,
        filter: &Map<String, Value>,
    ) -> Result<Vec<Passage>, KnowledgeError> {
        let collection = self.collection(collection)?;
        let span = info_span!(
            "knowledge.query",
            knowledge.collection = %collection.config.name,
            knowledge.top_k = top_k as i64,
            knowledge.hits = tracing::field::Empty,
        );
        let found = async {
            if query.trim().is_empty() {
                return Err(KnowledgeError::Invalid("the query is empty".into()));
            }
            let filter = metadata_filter(&collection.config, filter)?;
            let dense = match self.embedder.clone() {
                Some(embedder) => {
                    let text = query.to_owned();
                    let vector = tokio::task::spawn_blocking(move || embedder.embed_query(&text))
                        .instrument(info_span!("knowledge.embed", knowledge.texts = 1_i64))
                        .await
                        .map_err(|e| KnowledgeError::Embedding(e.to_string()))?
                        .map_err(|e| KnowledgeError::Embedding(e.to_string()))?;
                    Some(vector)
                }
                None => None,
            };
            let lexical = Some(lexical::query(&terms(query))).filter(|l| !l.is_empty());
            let request = Query {
                dense,
                lexical,
                filter,
                limit: top_k,
                candidates: (4 * top_k).max(50),
                rrf_k: 0,
                payload: true,
            };
            let hits = match collection.store.query(&collection.stored, request).await {
                Ok(hits) => hits,
                Err(StoreError::NoCollection { .. }) => Vec::new(),
                Err(error) => return Err(error.into()),
            };
            Ok(hits
                .into_iter()
                .map(|hit| {
                    let mut payload = hit.payload;
                    let text = |v: Option<Value>| match v {
                        Some(Value::String(s)) => s,
                        _ => String::new(),
                    };
                    Passage {
                        document_id: text(payload.remove(DOC_ID)),
                        chunk: payload.remove(POSITION).and_then(|v| v.as_u64()).unwrap_or(0),
                        score: hit.score,
                        text: text(payload.remove(TEXT)),
                        metadata: match payload.remove(METADATA) {
                            Some(Value::Object(map)) => map,
                            _ => Map::new(),
                        },
                    }
                })
                .collect::<Vec<_>>())
        }
        .instrument(span.clone())
        .await?;
        span.record("knowledge.hits", found.len() as i64);
        Ok(found)
    }

    pub(crate) fn collection(&self, name: &str) -> Result<Arc<Collection>, KnowledgeError> {
        let collections = self.collections.load();
        collections.get(name).cloned().ok_or_else(|| KnowledgeError::NoCollection {
            name: name.to_owned(),
            known: if collections.is_empty() {
                "none configured".into()
            } else {
                collections.keys().cloned().collect::<Vec<_>>().join(", ")
            },
        })
    }
}

/// The store filter of a search's metadata filter; only the collection's `filter_fields`
/// may be named.
pub(crate) fn metadata_filter(
    config: &CollectionConfig,
    filter: &Map<String, Value>,
) -> Result<Option<Filter>, KnowledgeError> {
    let mut must = Vec::new();
    for (field, value) in filter {
        if !config.filter_fields.contains(field) {
            return Err(KnowledgeError::Invalid(format!(
                "collection {:?} cannot be filtered on {field:?} (filterable fields: {})",
                config.name,
                if config.filter_fields.is_empty() {
                    "none; list them in filter_fields".to_owned()
                } else {
                    config.filter_fields.join(", ")
                }
            )));
        }
        let key = format!("{METADATA}.{field}");
        let scalar = |v: &Value| {
            Scalar::from_json(v).ok_or_else(|| {
                KnowledgeError::Invalid(format!(
                    "filter {field:?}: a string, an integer or a boolean, or a list of them"
                ))
            })
        };
        must.push(match value {
            Value::Array(values) => {
                Condition::In(key, values.iter().map(scalar).collect::<Result<_, _>>()?)
            }
            value => Condition::Is(key, scalar(value)?),
        });
    }
    Ok((!must.is_empty()).then_some(Filter { must, must_not: Vec::new() }))
}
