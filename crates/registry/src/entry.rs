use std::{fmt, sync::Arc};

use jsonschema::Validator;
use serde_json::Value;
use toolmesh_core::{Backend, ToolSpec, clip, validate_tool_name};

use crate::RegistryError;

/// One tool of the catalog: its definition, compiled validators and backend.
#[derive(Clone)]
pub struct ToolEntry {
    /// The tool's definition.
    pub spec: ToolSpec,
    /// Runs the tool.
    pub backend: Arc<dyn Backend>,
    input: Arc<Validator>,
    output: Option<Arc<Validator>>,
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
        let input = compile(&spec.name, "input", &spec.input_schema)?;
        let output = match (&spec.output_schema, spec.validate_output) {
            (Some(schema), true) => Some(compile(&spec.name, "output", schema)?),
            _ => None,
        };
        Ok(ToolEntry { spec, backend, input, output })
    }

    /// Like [`ToolEntry::new`], but a tool whose input schema does not compile is kept,
    /// without argument validation (the server still checks its own arguments); the
    /// returned error says why. For tools whose schemas come from elsewhere, such as MCP
    /// servers, where dropping the tool would make it unusable.
    pub fn lenient(
        spec: ToolSpec,
        backend: Arc<dyn Backend>,
    ) -> Result<(Self, Option<RegistryError>), RegistryError> {
        validate_tool_name(&spec.name)?;
        let (input, problem) = match compile(&spec.name, "input", &spec.input_schema) {
            Ok(input) => (input, None),
            Err(error) => (compile(&spec.name, "input", &Value::Bool(true))?, Some(error)),
        };
        let output = match (&spec.output_schema, spec.validate_output) {
            (Some(schema), true) => Some(compile(&spec.name, "output", schema)?),
            _ => None,
        };
        Ok((ToolEntry { spec, backend, input, output }, problem))
    }

    /// Returns every way in which `arguments` fail the input schema; empty when valid.
    pub fn check_arguments(&self, arguments: &Value) -> Vec<SchemaViolation> {
        violations(&self.input, arguments)
    }

    /// Returns every way in which a structured result fails the declared output schema,
    /// when the tool asked for output validation; empty otherwise.
    pub fn check_output(&self, structured: Option<&Value>) -> Vec<SchemaViolation> {
        match (&self.output, structured) {
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
