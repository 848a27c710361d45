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
            })
            .collect()
    };
    let value =
        json!({ "must": conditions(&filter.must), "must_not": conditions(&filter.must_not) });
    serde_json::from_value(value).map_err(|e| format!("bad filter: {e}"))
}

/// Returns the server's filter.
pub(crate) fn server_filter(filter: &Filter) -> server::Filter {
    let condition = |condition: &Condition| -> server::Condition {
        match condition {
            Condition::Is(field, Scalar::Str(s)) => server::Condition::matches(field, s.clone()),
            Condition::Is(field, Scalar::Int(i)) => server::Condition::matches(field, *i),
            Condition::Is(field, Scalar::Bool(b)) => server::Condition::matches(field, *b),
            Condition::In(field, values) => {
                let strings: Vec<String> = values
                    .iter()
                    .filter_map(|v| match v {
                        Scalar::Str(s) => Some(s.clone()),
                        _ => None,
                    })
                    .collect();
                if strings.len() == values.len() {
                    server::Condition::matches(field, strings)
                } else {
                    let integers: Vec<i64> = values
                        .iter()
                        .filter_map(|v| match v {
                            Scalar::Int(i) => Some(*i),
                            _ => None,
                        })
                        .collect();
                    server::Condition::matches(field, integers)
                }
            }
        }
    };
    server::Filter {
        must: filter.must.iter().map(condition).collect(),
        must_not: filter.must_not.iter().map(condition).collect(),
        ..Default::default()
    }
}
