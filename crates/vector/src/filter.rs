//! toolmesh's filters in each backend's terms.

use qdrant_client::qdrant as server;
use serde_json::{Value, json};
use toolmesh_core::vector::{Condition, Filter, Scalar};

/// Returns the engine's filter. The engine reads Qdrant's JSON filter form, so the filter
/// goes through it: the same shape the REST API documents.
pub(crate) fn edge_filter(filter: &Filter) -> Result<qdrant_edge::Filter, String> {
    let conditions = |conditions: &[Condition]| -> Vec<Value> {
        conditions
            .iter()
            .map(|condition| match condition {
                Condition::Is(field, value) => {
                    json!({ "key": field, "match": { "value": value.to_json() } })
                }
                Condition::In(field, values) => json!({
                    "key": field,
                    "match": { "any": values.iter().map(Scalar::to_json).collect::<Vec<_>>() }
                }),
                Condition::HasId(ids) => json!({ "has_id": ids }),
                Condition::HasVector(name) => json!({ "has_vector": name }),
            })
            .collect()
    };
    let value =
        json!({ "must": conditions(&filter.must), "must_not": conditions(&filter.must_not) });
    serde_json::from_value(value).map_err(|e| format!("bad filter: {e}"))
}

/// Returns the server's filter. "Any of" is a nested filter that keeps a point when one of
/// its equalities holds, so lists of any scalar type (or of mixed types) mean the same on
/// the server as in the engine.
pub(crate) fn server_filter(filter: &Filter) -> server::Filter {
    fn equals(field: &str, value: &Scalar) -> server::Condition {
        match value {
            Scalar::Str(s) => server::Condition::matches(field, s.clone()),
            Scalar::Int(i) => server::Condition::matches(field, *i),
            Scalar::Bool(b) => server::Condition::matches(field, *b),
        }
    }
    let condition = |condition: &Condition| match condition {
        Condition::Is(field, value) => equals(field, value),
        Condition::In(field, values) => {
            server::Filter::should(values.iter().map(|v| equals(field, v))).into()
        }
        Condition::HasId(ids) => server::Condition::has_id(ids.iter().copied()),
        Condition::HasVector(name) => server::Condition::has_vector(name.clone()),
    };
    server::Filter {
        must: filter.must.iter().map(condition).collect(),
        must_not: filter.must_not.iter().map(condition).collect(),
        ..Default::default()
    }
}
