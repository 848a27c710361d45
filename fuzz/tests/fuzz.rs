//! Fuzz targets: nothing that arrives from the network may panic the server or be taken for
//! more than it is.

use std::{sync::Arc, time::Duration};

use bolero::{TypeGenerator, check};
use serde_json::{Value, json};
use toolmesh_core::{Backend, BackendError, CallContext, ToolOutput, ToolSource, ToolSpec};
use toolmesh_proto::v1;
use toolmesh_registry::ToolEntry;

/// How long each target runs under `cargo test`.
fn test_time() -> Duration {
    let seconds = std::env::var("TOOLMESH_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok());
    Duration::from_secs_f64(seconds.unwrap_or(5.0))
}

struct Never;

#[async_trait::async_trait]
impl Backend for Never {
    async fn call(&self, _: CallContext, _: Value) -> Result<ToolOutput, BackendError> {
        unreachable!("the fuzz targets only validate")
    }
}

/// Tool input schemas with the features real tools use: nested objects, arrays, enums,
/// patterns, formats, numeric bounds, combinators and references.
fn entries() -> Vec<ToolEntry> {
    let schemas = [
        json!({"type": "object", "properties": {"path": {"type": "string", "pattern": "^/tmp/[a-z0-9_./-]*$", "maxLength": 256}}, "required": ["path"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "amount": {"type": "number", "minimum": 0, "exclusiveMaximum": 1e6, "multipleOf": 0.01},
            "currency": {"enum": ["EUR", "USD"]},
            "tags": {"type": "array", "items": {"type": "string", "minLength": 1}, "uniqueItems": true, "maxItems": 8},
            "when": {"type": "string", "format": "date-time"},
            "to": {"type": "string", "format": "email"}
        }, "required": ["amount"]}),
        json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": {"node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}, "name": {"type": "string"}}}}, "$ref": "#/$defs/node"}),
        json!({"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}], "patternProperties": {"^x-": {"type": "integer"}}, "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["c"]}}),
    ];
    schemas
        .into_iter()
        .enumerate()
        .map(|(i, schema)| {
            let spec =
                ToolSpec::new(format!("tool_{i}"), "fuzz", schema, ToolSource::local("fuzz"));
            ToolEntry::new(spec, Arc::new(Never)).expect("the schemas compile")
        })
        .collect()
}

/// A JSON value shaped by the fuzzer, so that inputs reach deep into the schemas rather than
/// stopping at a parse error.
#[derive(Debug, Clone, TypeGenerator)]
enum Json {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
    List(Vec<Json>),
    Object(Vec<(Key, Json)>),
}

/// Keys the schemas know, and any other.
#[derive(Debug, Clone, TypeGenerator)]
enum Key {
    Known(u8),
    Other(String),
}

const KEYS: [&str; 12] =
    ["path", "amount", "currency", "tags", "when", "to", "children", "name", "a", "b", "c", "x-1"];

impl Json {
    fn value(&self, depth: usize) -> Value {
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => json!(b),
            Json::Int(i) => json!(i),
            Json::Float(f) => json!(f),
            Json::Text(s) => json!(s),
            Json::List(_) | Json::Object(_) if depth > 8 => Value::Null,
            Json::List(items) => Value::Array(items.iter().map(|i| i.value(depth + 1)).collect()),
            Json::Object(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(key, value)| {
                        let key = match key {
                            Key::Known(i) => KEYS[*i as usize % KEYS.len()].to_owned(),
                            Key::Other(s) => s.clone(),
                        };
                        (key, value.value(depth + 1))
                    })
                    .collect(),
            ),
        }
    }
}

/// Arguments, shaped or as raw text, checked against every schema: a violation is a list of
/// reasons, never a panic, and valid arguments are valid again once written and read back.
#[test]
fn arguments_against_tool_schemas() {
    // A panic is the finding: nothing is used after one.
    let entries = std::panic::AssertUnwindSafe(entries());
    check!().with_type::<(Json, Vec<u8>)>().with_test_time(test_time()).for_each(
        |(shaped, raw)| {
            let mut values = vec![shaped.value(0)];
            if let Ok(parsed) = serde_json::from_slice::<Value>(raw) {
                values.push(parsed);
            }
            for value in &values {
                for entry in entries.iter() {
                    let violations = entry.check_arguments(value);
                    if violations.is_empty() {
                        let again: Value = serde_json::from_str(&value.to_string()).unwrap();
                        assert!(entry.check_arguments(&again).is_empty(), "{value}");
                    }
                    for violation in &violations {
                        let _ = violation.to_string();
                    }
                }
            }
        },
    );
}

/// Bytes decoded as each request message the server accepts: a decoded message encodes and
/// decodes to itself.
#[test]
fn protobuf_request_decoding() {
    fn round_trip<M: prost::Message + Default + PartialEq + std::fmt::Debug>(bytes: &[u8]) {
        if let Ok(message) = M::decode(bytes) {
            let again = M::decode(message.encode_to_vec().as_slice()).expect("re-encoded decodes");
            assert_eq!(message, again);
        }
    }
    check!().with_test_time(test_time()).for_each(|bytes: &[u8]| {
        round_trip::<v1::CallToolRequest>(bytes);
        round_trip::<v1::CallToolClientMessage>(bytes);
        round_trip::<v1::ListToolsRequest>(bytes);
        round_trip::<v1::SearchToolsRequest>(bytes);
        round_trip::<v1::IngestRequest>(bytes);
        round_trip::<v1::WorkerMessage>(bytes);
    });
}

/// Shapes of credentials: raw text, and three dot-separated parts as a JWT has, with a
/// header and claims written as JSON.
#[derive(Debug, Clone, TypeGenerator)]
enum Credential {
    Raw(String),
    Jwt { header: Json, claims: Json, signature: Vec<u8>, alg: u8 },
}

/// Credentials parsed and verified by an authenticator with an API key and an HS256
/// issuer: only the key itself, or a token signed with the issuer's secret, is accepted;
/// everything else is refused, without a panic.
#[test]
fn bearer_credential_parsing() {
    use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let key = toolmesh_identity::new_key();
    let config = toolmesh_identity::AuthConfig {
        api_keys: vec![toolmesh_identity::ApiKeyConfig {
            principal: "fuzz".into(),
            sha256: toolmesh_identity::key_digest(&key),
            key_env: None,
            roles: vec![],
            attributes: Default::default(),
        }],
        jwt: vec![toolmesh_identity::JwtConfig {
            issuer: "https://issuer.test/".into(),
            audiences: vec!["toolmesh".into()],
            secret_env: Some("FUZZ_SECRET".into()),
            ..serde_json::from_value(json!({"issuer": "x", "audiences": ["y"]})).unwrap()
        }],
        ..Default::default()
    };
    let env =
        |name: &str| (name == "FUZZ_SECRET").then(|| "a secret of the fuzz issuer".to_owned());
    let authenticator =
        runtime.block_on(toolmesh_identity::Authenticator::new(&config, &env)).unwrap();
    // A panic is the finding: nothing is used after one.
    let guarded = std::panic::AssertUnwindSafe((&runtime, &authenticator));
    check!().with_type::<Credential>().with_test_time(test_time()).for_each(|credential| {
        let (runtime, authenticator) = *std::ops::Deref::deref(&guarded);
        let text = match credential {
            Credential::Raw(text) => text.clone(),
            Credential::Jwt { header, claims, signature, alg } => {
                let mut header = header.value(0);
                if let Value::Object(map) = &mut header {
                    let algs = ["HS256", "RS256", "ES256", "none", "HS512"];
                    map.insert("alg".into(), json!(algs[*alg as usize % algs.len()]));
                }
                format!(
                    "{}.{}.{}",
                    URL_SAFE_NO_PAD.encode(header.to_string()),
                    URL_SAFE_NO_PAD.encode(claims.value(0).to_string()),
                    URL_SAFE_NO_PAD.encode(signature)
                )
            }
        };
        let outcome =
            runtime.block_on(authenticator.authenticate(Some(&format!("Bearer {text}")), None));
        assert!(outcome.is_err() || text == key, "accepted {text:?}");
        let _ = runtime.block_on(authenticator.authenticate(Some(&text), None));
    });
}
