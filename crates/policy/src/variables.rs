//! The variables a `when` condition reads — `principal`, `tool` and `args` — bound to a CEL
//! evaluation without copying the call's arguments where the expression allows it.
//!
//! A call's arguments are already parsed JSON. Converting them whole to CEL values copies
//! every string and builds a map per object, at every call, although a condition usually
//! reads one or two fields (`args.path.startsWith("/srv/")`). When an expression uses
//! `args` only to select fields by name (`args.f`, `has(args.f)`, `args["f"]`), `args` is
//! bound as [`Arguments`], which looks a field up in the JSON when the expression asks for
//! it: a string is handed over borrowed, anything else converted as before. Any other use
//! of `args` — compared whole, iterated, measured, passed to a function — binds the full
//! conversion, so that every operator of the language sees the values it expects.

use cel::{
    ExecutionError,
    common::{
        ast::{EntryExpr, Expr, LiteralValue, MapExpr, StructExpr},
        traits::Indexer,
        types::{self, CelString, Type},
        value::{CowVal, Val},
    },
    context::VariableResolver,
    parser::Expression,
};
use serde_json::{Map, Value as Json};

/// Whether `expression` uses the variable `args` only to select fields of it by name, so
/// that it may be bound as [`Arguments`]. A comprehension that names its own variable
/// `args` makes the answer no: the analysis does not follow scopes.
pub(crate) fn selects_args_fields_only(expression: &Expression) -> bool {
    fn walk(expr: &Expression) -> bool {
        match &expr.expr {
            Expr::Ident(name) => name != "args",
            Expr::Select(select) => is_args(&select.operand) || walk(&select.operand),
            Expr::Call(call) => {
                if call.func_name == "_[_]"
                    && call.args.len() == 2
                    && is_args(&call.args[0])
                    && matches!(call.args[1].expr, Expr::Literal(LiteralValue::String(_)))
                {
                    return true;
                }
                call.target.as_deref().is_none_or(walk) && call.args.iter().all(walk)
            }
            Expr::Comprehension(c) => {
                c.iter_var != "args"
                    && c.iter_var2.as_deref() != Some("args")
                    && c.accu_var != "args"
                    && [&c.iter_range, &c.accu_init, &c.loop_cond, &c.loop_step, &c.result]
                        .into_iter()
                        .all(walk)
            }
            Expr::List(list) => list.elements.iter().all(walk),
            Expr::Map(MapExpr { entries }) | Expr::Struct(StructExpr { entries, .. }) => {
                entries.iter().all(|entry| match &entry.expr {
                    EntryExpr::MapEntry(entry) => walk(&entry.key) && walk(&entry.value),
                    EntryExpr::StructField(field) => walk(&field.value),
                })
            }
            Expr::Literal(_) | Expr::Unspecified => true,
        }
    }
    fn is_args(expr: &Expression) -> bool {
        matches!(&expr.expr, Expr::Ident(name) if name == "args")
    }
    walk(expression)
}

/// How `args` is bound for one evaluation.
pub(crate) enum Args<'a> {
    /// Not read by the expression.
    Unbound,
    /// Fields looked up in the JSON object when selected.
    Fields(&'a Map<String, Json>),
    /// The arguments converted whole.
    Converted(&'a (dyn Val + 'static)),
}

/// The variables of one evaluation.
pub(crate) struct Variables<'a> {
    pub(crate) principal: Option<&'a (dyn Val + 'static)>,
    pub(crate) tool: Option<&'a (dyn Val + 'static)>,
    pub(crate) args: Args<'a>,
}

impl VariableResolver for Variables<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        match variable {
            "principal" => self.principal.map(CowVal::Borrowed),
            "tool" => self.tool.map(CowVal::Borrowed),
            "args" => match self.args {
                Args::Unbound => None,
                Args::Fields(fields) => Some(CowVal::owned(Arguments(fields))),
                Args::Converted(value) => Some(CowVal::Borrowed(value)),
            },
            _ => None,
        }
    }
}

/// Converts `value` whole to a CEL value, as `args` when an expression uses it otherwise than
/// by its fields, and as the fields' values that are not strings.
pub(crate) fn convert(value: &Json) -> Box<dyn Val + 'static> {
    let value = cel::to_value(value).unwrap_or(cel::Value::Null);
    // Every `Value` that `to_value` makes has a `Val` counterpart.
    Box::<dyn Val>::try_from(value).unwrap_or_else(|_| Box::new(types::CelNull))
}

/// A call's arguments, a JSON object, as a CEL map whose fields are read when selected.
#[derive(Debug)]
pub(crate) struct Arguments<'a>(&'a Map<String, Json>);

impl Val for Arguments<'_> {
    fn get_type(&self) -> &Type {
        &types::MAP_TYPE
    }

    fn cel_type() -> &'static Type {
        &types::MAP_TYPE
    }

    fn as_indexer<'b, 'v>(&'b self) -> Option<&'b (dyn Indexer + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v>
    where
        Self: 'v,
    {
        Box::new(Arguments(self.0))
    }
}

impl Indexer for Arguments<'_> {
    fn get<'b, 'v>(&'b self, index: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        let Some(name) = index.downcast_ref::<CelString>().map(CelString::inner) else {
            return Err(ExecutionError::function_error("_[_]", "arguments are named by strings"));
        };
        match self.0.get(name) {
            Some(Json::String(text)) => Ok(CowVal::owned(CelString::from(text.as_str()))),
            Some(value) => Ok(CowVal::Owned(convert(value))),
            None => Err(ExecutionError::no_such_key(name)),
        }
    }

    fn steal<'v>(self: Box<Self>, index: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.get(index).map(CowVal::into_owned)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    /// Evaluates `source` with `args` bound by field when `by_field`, else converted whole.
    fn evaluate(source: &str, args: &Json, by_field: bool) -> Result<cel::Value, String> {
        let env = Arc::new(cel::Env::stdlib());
        let program = env.compile(source).expect("the expression compiles");
        let converted = convert(args);
        let args = match args {
            Json::Object(fields) if by_field => Args::Fields(fields),
            _ => Args::Converted(converted.as_ref()),
        };
        let variables = Variables { principal: None, tool: None, args };
        let mut context = cel::Context::with_env(env);
        context.set_variable_resolver(&variables);
        program.execute(&context).map_err(|error| error.to_string())
    }

    #[test]
    fn field_selections_are_told_from_other_uses_of_args() {
        let by_field = |source: &str| {
            let program = cel::Env::stdlib().compile(source).expect("the expression compiles");
            selects_args_fields_only(program.expression())
        };
        for source in [
            "args.path.startsWith('/srv/')",
            "has(args.path) && args['mode'] == 'r'",
            "size(args.message) > 4096 || args.message.startsWith('rm -rf')",
            "args.limits.max > 3",
            "args.items.exists(i, i > 3)",
            "principal.name == 'alice' && tool.name.contains('delete')",
        ] {
            assert!(by_field(source), "{source}");
        }
        for source in [
            "size(args) > 2",
            "'path' in args",
            "args == {'a': 1}",
            "args.exists(k, k == 'path')",
            "[args].size() == 1",
            "args[principal.name] == 1",
            "[1].exists(args, args > 0)",
        ] {
            assert!(!by_field(source), "{source}");
        }
    }

    #[test]
    fn fields_read_from_the_json_evaluate_as_the_arguments_converted_whole() {
        let args = json!({
            "path": "/srv/data/report.csv",
            "message": "rm -rf /",
            "count": 7,
            "negative": -2,
            "ratio": 0.5,
            "dry_run": false,
            "nothing": null,
            "tags": ["a", "b"],
            "limits": {"max": 5, "unit": "MiB"},
        });
        for source in [
            "args.path.startsWith('/srv/')",
            "args.message.startsWith('rm -rf')",
            "size(args.message) > 4096",
            "args.count > 5",
            "args.count == 7",
            "args.negative < 0",
            "args.ratio < 1.0",
            "args.dry_run",
            "args.nothing == null",
            "'b' in args.tags",
            "args.tags.exists(t, t == 'a')",
            "size(args.tags) == 2",
            "args.limits.max >= 5 && args.limits.unit == 'MiB'",
            "has(args.path)",
            "has(args.missing)",
            "has(args.limits.max)",
            "args['path'].endsWith('.csv')",
            "args.missing == 1",
            "args.path + '!'",
            "args.count",
        ] {
            assert_eq!(evaluate(source, &args, true), evaluate(source, &args, false), "{source}");
        }
        assert_eq!(evaluate("has(args.missing)", &args, true), Ok(cel::Value::Bool(false)));
        assert!(evaluate("args.missing == 1", &args, true).is_err());
    }
}
