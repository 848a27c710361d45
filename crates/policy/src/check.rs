//! A `when` condition checked against the shape of the variables it reads, before it is
//! ever evaluated.
//!
//! CEL is dynamically typed: `principal.role` (for `principal.roles`) compiles, and fails
//! at every evaluation, so the rule decides nothing — or, for an allow rule in front of a
//! deny default, hides every tool from everyone. `principal` and `tool` have a fixed shape,
//! so a field they do not have, a string method called on a list, or a list compared with
//! a string is known to fail at load. `args` has the shape of each call's arguments, and
//! is not checked.

use cel::{
    common::ast::{EntryExpr, Expr, LiteralValue, MapExpr, StructExpr, operators},
    parser::Expression,
};

/// What the checker knows of a value's type.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ty {
    String,
    Bool,
    Number,
    /// A list of strings.
    Strings,
    /// An object with these fields, as `principal` and `tool` are.
    Object(&'static Shape),
    /// Anything: a map with free keys, `args`, a comprehension's variable, a call's result.
    Dyn,
}

impl Ty {
    fn describe(self) -> &'static str {
        match self {
            Ty::String => "a string",
            Ty::Bool => "a bool",
            Ty::Number => "a number",
            Ty::Strings => "a list of strings",
            Ty::Object(_) => "an object",
            Ty::Dyn => "a value",
        }
    }
}

#[derive(Debug, PartialEq)]
struct Shape {
    name: &'static str,
    fields: &'static [(&'static str, Ty)],
}

const ANNOTATIONS: Shape = Shape {
    name: "tool.annotations",
    fields: &[
        ("read_only", Ty::Bool),
        ("destructive", Ty::Bool),
        ("idempotent", Ty::Bool),
        ("open_world", Ty::Bool),
    ],
};

const PRINCIPAL: Shape = Shape {
    name: "principal",
    fields: &[
        ("name", Ty::String),
        ("kind", Ty::String),
        ("issuer", Ty::String),
        ("roles", Ty::Strings),
        ("attributes", Ty::Dyn),
    ],
};

const TOOL: Shape = Shape {
    name: "tool",
    fields: &[
        ("name", Ty::String),
        ("source", Ty::String),
        ("kind", Ty::String),
        ("toolkit", Ty::String),
        ("tags", Ty::Strings),
        ("annotations", Ty::Object(&ANNOTATIONS)),
    ],
};

/// Checks `expression`; the error says what cannot work, in the user's words.
pub(crate) fn check(expression: &Expression) -> Result<(), String> {
    infer(expression, &mut Vec::new()).map(drop)
}

fn infer(expression: &Expression, shadowed: &mut Vec<String>) -> Result<Ty, String> {
    Ok(match &expression.expr {
        Expr::Ident(name) if shadowed.iter().any(|s| s == name) => Ty::Dyn,
        Expr::Ident(name) => match name.as_str() {
            "principal" => Ty::Object(&PRINCIPAL),
            "tool" => Ty::Object(&TOOL),
            _ => Ty::Dyn,
        },
        Expr::Select(select) => {
            let operand = infer(&select.operand, shadowed)?;
            let field = field(operand, &select.field)?;
            if select.test { Ty::Bool } else { field }
        }
        Expr::Literal(literal) => match literal {
            LiteralValue::String(_) => Ty::String,
            LiteralValue::Boolean(_) => Ty::Bool,
            LiteralValue::Int(_) | LiteralValue::UInt(_) | LiteralValue::Double(_) => Ty::Number,
            LiteralValue::Null | LiteralValue::Bytes(_) => Ty::Dyn,
        },
        Expr::Call(call) => {
            let target = match &call.target {
                Some(target) => Some(infer(target, shadowed)?),
                None => None,
            };
            let args =
                call.args.iter().map(|arg| infer(arg, shadowed)).collect::<Result<Vec<_>, _>>()?;
            let name = call.func_name.as_str();
            match (name, target, args.as_slice()) {
                (operators::INDEX, None, [operand, _]) => match &call.args[1].expr {
                    Expr::Literal(LiteralValue::String(key)) => field(*operand, key.inner())?,
                    _ => Ty::Dyn,
                },
                ("startsWith" | "endsWith" | "contains" | "matches", Some(target), _)
                    if !matches!(target, Ty::String | Ty::Dyn) =>
                {
                    return Err(format!(
                        "`{name}` needs a string, and is called on {}",
                        target.describe()
                    ));
                }
                (operators::IN, None, [_, container])
                    if !matches!(container, Ty::Strings | Ty::Object(_) | Ty::Dyn) =>
                {
                    return Err(format!(
                        "`in` needs a list or a map on its right, and has {}",
                        container.describe()
                    ));
                }
                (operators::EQUALS | operators::NOT_EQUALS, None, [a, b])
                    if *a != Ty::Dyn && *b != Ty::Dyn && a != b =>
                {
                    return Err(format!(
                        "compares {} with {}, which is never equal",
                        a.describe(),
                        b.describe()
                    ));
                }
                (
                    operators::EQUALS
                    | operators::NOT_EQUALS
                    | operators::LESS
                    | operators::LESS_EQUALS
                    | operators::GREATER
                    | operators::GREATER_EQUALS
                    | operators::LOGICAL_AND
                    | operators::LOGICAL_OR
                    | operators::LOGICAL_NOT
                    | operators::IN
                    | "startsWith"
                    | "endsWith"
                    | "contains"
                    | "matches",
                    _,
                    _,
                ) => Ty::Bool,
                _ => Ty::Dyn,
            }
        }
        Expr::Comprehension(c) => {
            infer(&c.iter_range, shadowed)?;
            let depth = shadowed.len();
            shadowed.push(c.iter_var.clone());
            shadowed.extend(c.iter_var2.clone());
            shadowed.push(c.accu_var.clone());
            let checked = [&c.accu_init, &c.loop_cond, &c.loop_step, &c.result]
                .into_iter()
                .try_for_each(|e| infer(e, shadowed).map(drop));
            shadowed.truncate(depth);
            checked?;
            Ty::Dyn
        }
        Expr::List(list) => {
            for element in &list.elements {
                infer(element, shadowed)?;
            }
            Ty::Dyn
        }
        Expr::Map(MapExpr { entries }) | Expr::Struct(StructExpr { entries, .. }) => {
            for entry in entries {
                match &entry.expr {
                    EntryExpr::MapEntry(entry) => {
                        infer(&entry.key, shadowed)?;
                        infer(&entry.value, shadowed)?;
                    }
                    EntryExpr::StructField(field) => {
                        infer(&field.value, shadowed)?;
                    }
                }
            }
            Ty::Dyn
        }
        Expr::Unspecified => Ty::Dyn,
    })
}

/// The type of `operand.name`, or why it has no such field.
fn field(operand: Ty, name: &str) -> Result<Ty, String> {
    match operand {
        Ty::Object(shape) => match shape.fields.iter().find(|(field, _)| *field == name) {
            Some((_, ty)) => Ok(*ty),
            None => {
                let known: Vec<_> = shape.fields.iter().map(|(field, _)| *field).collect();
                Err(format!(
                    "`{}.{name}` is not a field: {} has {}",
                    shape.name,
                    shape.name,
                    known.join(", ")
                ))
            }
        },
        Ty::Dyn => Ok(Ty::Dyn),
        other => Err(format!("`.{name}` is read from {}, which has no fields", other.describe())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(source: &str) -> Result<(), String> {
        let env = cel::Env::stdlib();
        let program = env.compile(source).expect("a CEL expression");
        check(program.expression())
    }

    #[test]
    fn conditions_that_can_work_pass() {
        for source in [
            r#""admin" in principal.roles"#,
            r#"principal.name == "alice" && principal.kind == "key""#,
            r#"principal.attributes.team == "x""#,
            r#"has(principal.attributes.team) && principal.attributes["team"] == "ops""#,
            r#"tool.annotations.read_only && !tool.annotations.destructive"#,
            r#"tool.tags.exists(t, t.startsWith("fs")) && "x" in tool.tags"#,
            r#"size(args.message) > 4096 || args.path.startsWith("/srv/")"#,
            r#"principal.roles.all(principal, principal.size() > 0)"#,
            r#"tool.name.startsWith("fs_") ? args.x == 1 : true"#,
        ] {
            assert_eq!(checked(source), Ok(()), "{source}");
        }
    }

    #[test]
    fn conditions_that_cannot_work_are_named() {
        for (source, says) in [
            (r#""admin" in principal.role"#, "`principal.role` is not a field"),
            (r#"principal["nmae"] == "x""#, "`principal.nmae` is not a field"),
            (r#"has(principal.role)"#, "`principal.role` is not a field"),
            (r#"tool.annotations.readOnly"#, "`tool.annotations.readOnly` is not a field"),
            (r#"principal.roles.startsWith("a")"#, "`startsWith` needs a string"),
            (r#"principal.roles == "admin""#, "compares a list of strings with a string"),
            (r#""ad" in principal.name"#, "`in` needs a list or a map"),
            (r#"principal.name.first == "a""#, "a string, which has no fields"),
            (r#"tool.tags.exists(t, tool.tag == t)"#, "`tool.tag` is not a field"),
        ] {
            let error = checked(source).expect_err(source);
            assert!(error.contains(says), "{source}: {error}");
        }
    }
}
