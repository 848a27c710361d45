use std::{
    fmt,
    sync::{Arc, OnceLock},
};

use jsonschema::Validator;
use serde_json::Value;
use toolmesh_core::{Backend, ToolSpec, clip, validate_tool_name};

use crate::RegistryError;

/// The largest definition a tool may have, in bytes of its description, title, tags and
/// schemas as JSON. Every client reads every definition it lists: three tools with schemas
/// of megabytes would put a listing past gRPC's default 4 MiB message.
pub const MAX_DEFINITION_BYTES: usize = 256 << 10;

/// Refuses a definition larger than [`MAX_DEFINITION_BYTES`]; counts without allocating.
fn within_bound(spec: &ToolSpec) -> Result<(), RegistryError> {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(
        spec.description.len()
            + spec.title.len()
            + spec.tags.iter().map(String::len).sum::<usize>(),
    );
    for schema in std::iter::once(&spec.input_schema).chain(&spec.output_schema) {
        // Writing into a counter cannot fail.
        let _ = serde_json::to_writer(&mut count, schema.as_ref());
    }
    if count.0 > MAX_DEFINITION_BYTES {
        return Err(RegistryError::TooLarge {
            tool: spec.name.clone(),
            bytes: count.0,
            limit: MAX_DEFINITION_BYTES,
        });
    }
    Ok(())
}

/// One tool of the catalog: its definition, compiled validators and backend.
#[derive(Clone)]
pub struct ToolEntry {
    /// The tool's definition.
    pub spec: ToolSpec,
    /// Runs the tool.
    pub backend: Arc<dyn Backend>,
    /// The compiled schemas; shared by clones of the entry, so that they compile once.
    pub(crate) schemas: Arc<OnceLock<Schemas>>,
}

/// An entry's compiled schemas.
pub(crate) struct Schemas {
    /// `None`: the input schema did not compile, and arguments are not checked.
    input: Option<Arc<Validator>>,
    /// Set when the tool declares an output schema and asks for its results to be checked.
    output: Option<Arc<Validator>>,
    /// Why a check is off.
    problems: Vec<RegistryError>,
}

/// One way in which a JSON value fails a schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaViolation {
    /// JSON Pointer to the failing value inside the instance, `""` for the root.
    pub path: String,
    /// The schema rule (keyword) that failed, for example `required` or `type`.
    pub rule: String,
    /// A human-readable explanation.
    pub message: String,
}

impl fmt::Display for SchemaViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() { "/" } else { &self.path };
        write!(f, "{path}: {} ({})", self.message, self.rule)
    }
}

impl fmt::Debug for ToolEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolEntry").field("spec", &self.spec).finish_non_exhaustive()
    }
}

impl ToolEntry {
    /// Checks the name and compiles the schemas. JSON Schema drafts 4, 6, 7, 2019-09 and
    /// 2020-12 are understood (`$schema` selects one; 2020-12 when absent).
    pub fn new(spec: ToolSpec, backend: Arc<dyn Backend>) -> Result<Self, RegistryError> {
        validate_tool_name(&spec.name)?;
        within_bound(&spec)?;
        let input = compile(&spec.name, "input", &spec.input_schema)?;
        let output = match (&spec.output_schema, spec.validate_output) {
            (Some(schema), true) => Some(compile(&spec.name, "output", schema)?),
            _ => None,
        };
        let schemas = Schemas { input: Some(input), output, problems: Vec::new() };
        Ok(ToolEntry { spec, backend, schemas: Arc::new(OnceLock::from(schemas)) })
    }

    /// Like [`ToolEntry::new`], for tools whose schemas come from elsewhere, such as MCP
    /// servers: only the name is checked here, and the schemas are compiled when first
    /// needed, or by [`ToolEntry::compile`], so that publishing thousands of tools costs no
    /// compilation. A schema that does not compile turns its check off instead of dropping
    /// the tool, which would make it unusable (the server still checks its own arguments);
    /// `compile` says why.
    pub fn deferred(spec: ToolSpec, backend: Arc<dyn Backend>) -> Result<Self, RegistryError> {
        validate_tool_name(&spec.name)?;
        within_bound(&spec)?;
        Ok(ToolEntry { spec, backend, schemas: Arc::default() })
    }

    /// Compiles the schemas if they are not yet; returns why a check is off, if one is.
    pub fn compile(&self) -> &[RegistryError] {
        &self.schemas().problems
    }

    /// Returns whether the schemas are compiled (see [`ToolEntry::compile`]).
    pub fn is_compiled(&self) -> bool {
        self.schemas.get().is_some()
    }

    fn schemas(&self) -> &Schemas {
        self.schemas.get_or_init(|| {
            let spec = &self.spec;
            let mut problems = Vec::new();
            let input = compile(&spec.name, "input", &spec.input_schema)
                .map_err(|problem| problems.push(problem))
                .ok();
            let output = match (&spec.output_schema, spec.validate_output) {
                (Some(schema), true) => compile(&spec.name, "output", schema)
                    .map_err(|problem| problems.push(problem))
                    .ok(),
                _ => None,
            };
            Schemas { input, output, problems }
        })
    }

    /// Returns every way in which `arguments` fail the input schema; empty when valid.
    pub fn check_arguments(&self, arguments: &Value) -> Vec<SchemaViolation> {
        match &self.schemas().input {
            Some(input) => violations(input, arguments),
            None => Vec::new(),
        }
    }

    /// Returns every way in which a structured result fails the declared output schema,
    /// when the tool asked for output validation; empty otherwise.
    pub fn check_output(&self, structured: Option<&Value>) -> Vec<SchemaViolation> {
        match (&self.schemas().output, structured) {
            (Some(validator), Some(value)) => violations(validator, value),
            (Some(_), None) => vec![SchemaViolation {
                path: String::new(),
                rule: "outputSchema".into(),
                message: "the tool declares an output schema but returned no structured result"
                    .into(),
            }],
            (None, _) => Vec::new(),
        }
    }
}

fn compile(
    tool: &str,
    which: &'static str,
    schema: &Value,
) -> Result<Arc<Validator>, RegistryError> {
    jsonschema::validator_for(schema).map(Arc::new).map_err(|error| RegistryError::InvalidSchema {
        tool: tool.to_owned(),
        which,
        reason: error.to_string(),
    })
}

/// Violations reported per value; a value failing in thousands of places gets the first.
const MAX_VIOLATIONS: usize = 20;
/// Characters of one violation's message, which quotes the failing value.
const VIOLATION_CHARS: usize = 200;

fn violations(validator: &Validator, value: &Value) -> Vec<SchemaViolation> {
    if validator.is_valid(value) {
        return Vec::new();
    }
    validator
        .iter_errors(value)
        .take(MAX_VIOLATIONS)
        .map(|error| SchemaViolation {
            path: clip(&error.instance_path().to_string(), VIOLATION_CHARS).into_owned(),
            rule: error.kind().keyword().to_owned(),
            message: clip(&error.to_string(), VIOLATION_CHARS).into_owned(),
        })
        .collect()
}
