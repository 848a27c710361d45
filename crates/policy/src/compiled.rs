//! A `when` condition compiled for the common case: evaluated directly over the JSON of
//! `principal`, `tool` and `args`, without the `cel` crate's interpreter.
//!
//! The interpreter walks the expression by name at every evaluation: it joins qualified
//! names to look them up, finds each function among its overloads by the types of its
//! arguments, and builds the error it would report for a comparison before comparing. A
//! condition on a call's arguments (`size(args.message) > 4096`) runs at every call, so
//! that work is on the hot path. Most conditions use a small part of the language: field
//! selection, literals, `&&`, `||`, `!`, `? :`, comparisons, `in`, `size`, `startsWith`,
//! `endsWith`, `contains` and `has`. Such an expression is compiled here into a tree that
//! evaluates those operations on the JSON values themselves, as the interpreter would on
//! their conversions.
//!
//! It never decides alone what the interpreter would decide otherwise: any value it does
//! not handle (a list compared for equality, a timestamp, an overflow), and every error,
//! makes [`Compiled::evaluate`] return `None`, and the caller evaluates the expression with
//! the interpreter, which then gives the answer or the error. An expression with anything
//! else in it is not compiled at all.

use std::cmp::Ordering;

use cel::{
    common::ast::{Expr, LiteralValue, operators},
    parser::Expression,
};
use serde_json::{Map, Number, Value as Json};

/// The values an evaluation reads: each variable as JSON, when the expression reads it.
pub(crate) struct Roots<'a> {
    pub(crate) principal: Option<&'a Json>,
    pub(crate) tool: Option<&'a Json>,
    pub(crate) args: Option<&'a Map<String, Json>>,
}

/// A compiled condition.
#[derive(Debug)]
pub(crate) struct Compiled(Node);

impl Compiled {
    /// Compiles `expression`, or `None` when it uses anything this module does not handle.
    pub(crate) fn new(expression: &Expression) -> Option<Self> {
        compile(expression).map(Compiled)
    }

    /// The condition's value, when it is a boolean reached without an error; `None` when the
    /// interpreter must tell.
    pub(crate) fn evaluate(&self, roots: &Roots<'_>) -> Option<bool> {
        match eval(&self.0, roots) {
            Ok(V::Bool(value)) => Some(value),
            _ => None,
        }
    }
}

#[derive(Debug)]
enum Node {
    Literal(Literal),
    List(Vec<Literal>),
    Variable(Root),
    Select(Box<Node>, Box<str>),
    Has(Box<Node>, Box<str>),
    Not(Box<Node>),
    /// `&&` when the bool is false (the value that decides it alone), `||` when true.
    Connective(Box<(Node, Node)>, bool),
    Conditional(Box<(Node, Node, Node)>),
    Equal(Box<(Node, Node)>),
    NotEqual(Box<(Node, Node)>),
    Compare(Box<(Node, Node)>, fn(Ordering) -> bool),
    In(Box<(Node, Node)>),
    Size(Box<Node>),
    Text(Box<(Node, Node)>, fn(&str, &str) -> bool),
}

#[derive(Debug, Clone, Copy)]
enum Root {
    Principal,
    Tool,
    Args,
}

#[derive(Debug)]
enum Literal {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Double(f64),
    String(Box<str>),
}

impl Literal {
    fn value(&self) -> V<'_> {
        match self {
            Literal::Null => V::Null,
            Literal::Bool(b) => V::Bool(*b),
            Literal::Int(i) => V::Int(*i),
            Literal::Uint(u) => V::Uint(*u),
            Literal::Double(d) => V::Double(*d),
            Literal::String(s) => V::String(s),
        }
    }
}

fn literal(literal: &LiteralValue) -> Option<Literal> {
    Some(match literal {
        LiteralValue::Null => Literal::Null,
        LiteralValue::Boolean(b) => Literal::Bool(*b.inner()),
        LiteralValue::Int(i) => Literal::Int(*i.inner()),
        LiteralValue::UInt(u) => Literal::Uint(*u.inner()),
        LiteralValue::Double(d) => Literal::Double(*d.inner()),
        LiteralValue::String(s) => Literal::String(s.inner().into()),
        LiteralValue::Bytes(_) => return None,
    })
}

fn compile(expression: &Expression) -> Option<Node> {
    let pair = |a: &Expression, b: &Expression| Some(Box::new((compile(a)?, compile(b)?)));
    match &expression.expr {
        Expr::Literal(value) => literal(value).map(Node::Literal),
        Expr::List(list) if list.optional_indices.is_empty() => list
            .elements
            .iter()
            .map(|element| match &element.expr {
                Expr::Literal(value) => literal(value),
                _ => None,
            })
            .collect::<Option<_>>()
            .map(Node::List),
        // A variable is read only through its fields: the whole of one is a value this
        // module does not build.
        Expr::Select(select) => {
            let operand = match &select.operand.expr {
                Expr::Ident(name) => Node::Variable(root(name)?),
                _ => compile(&select.operand)?,
            };
            let field = select.field.as_str().into();
            Some(if select.test {
                Node::Has(Box::new(operand), field)
            } else {
                Node::Select(Box::new(operand), field)
            })
        }
        Expr::Call(call) => {
            let args = call.args.as_slice();
            match (call.target.as_deref(), call.func_name.as_str(), args) {
                (None, operators::LOGICAL_AND, [a, b]) => {
                    Some(Node::Connective(pair(a, b)?, false))
                }
                (None, operators::LOGICAL_OR, [a, b]) => Some(Node::Connective(pair(a, b)?, true)),
                (None, operators::LOGICAL_NOT, [a]) => Some(Node::Not(Box::new(compile(a)?))),
                (None, operators::CONDITIONAL, [c, a, b]) => {
                    Some(Node::Conditional(Box::new((compile(c)?, compile(a)?, compile(b)?))))
                }
                (None, operators::EQUALS, [a, b]) => pair(a, b).map(Node::Equal),
                (None, operators::NOT_EQUALS, [a, b]) => pair(a, b).map(Node::NotEqual),
                (None, operators::LESS, [a, b]) => {
                    Some(Node::Compare(pair(a, b)?, Ordering::is_lt))
                }
                (None, operators::LESS_EQUALS, [a, b]) => {
                    Some(Node::Compare(pair(a, b)?, Ordering::is_le))
                }
                (None, operators::GREATER, [a, b]) => {
                    Some(Node::Compare(pair(a, b)?, Ordering::is_gt))
                }
                (None, operators::GREATER_EQUALS, [a, b]) => {
                    Some(Node::Compare(pair(a, b)?, Ordering::is_ge))
                }
                (None, operators::IN, [a, b]) => pair(a, b).map(Node::In),
                (None, operators::INDEX, [operand, field]) => {
                    let Expr::Literal(LiteralValue::String(field)) = &field.expr else {
                        return None;
                    };
                    let operand = match &operand.expr {
                        Expr::Ident(name) => Node::Variable(root(name)?),
                        _ => compile(operand)?,
                    };
                    Some(Node::Select(Box::new(operand), field.inner().into()))
                }
                (None, "size", [a]) | (Some(a), "size", []) => {
                    Some(Node::Size(Box::new(compile(a)?)))
                }
                (Some(target), "startsWith", [a]) => {
                    Some(Node::Text(pair(target, a)?, |s, p| s.starts_with(p)))
                }
                (Some(target), "endsWith", [a]) => {
                    Some(Node::Text(pair(target, a)?, |s, p| s.ends_with(p)))
                }
                (Some(target), "contains", [a]) => {
                    Some(Node::Text(pair(target, a)?, |s, p| s.contains(p)))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

fn root(name: &str) -> Option<Root> {
    match name {
        "principal" => Some(Root::Principal),
        "tool" => Some(Root::Tool),
        "args" => Some(Root::Args),
        _ => None,
    }
}

/// A value during an evaluation, borrowed from the roots or the compiled literals.
#[derive(Clone, Copy)]
enum V<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Double(f64),
    String(&'a str),
    List(&'a [Json]),
    Literals(&'a [Literal]),
    Map(&'a Map<String, Json>),
}

/// An evaluation the interpreter must make instead.
struct Defer;

impl<'a> V<'a> {
    /// `value` as the `cel` crate converts JSON: a non-negative integer is a `uint`, a
    /// negative one an `int`, any other number a `double`.
    fn of(value: &'a Json) -> Self {
        match value {
            Json::Null => V::Null,
            Json::Bool(b) => V::Bool(*b),
            Json::Number(n) => number(n),
            Json::String(s) => V::String(s),
            Json::Array(items) => V::List(items),
            Json::Object(fields) => V::Map(fields),
        }
    }
}

fn number(n: &Number) -> V<'static> {
    if let Some(u) = n.as_u64() {
        V::Uint(u)
    } else if let Some(i) = n.as_i64() {
        V::Int(i)
    } else {
        // Every JSON number is one without serde_json's `arbitrary_precision`.
        V::Double(n.as_f64().unwrap_or(f64::NAN))
    }
}

fn eval<'a>(node: &'a Node, roots: &Roots<'a>) -> Result<V<'a>, Defer> {
    Ok(match node {
        Node::Literal(value) => value.value(),
        Node::List(items) => V::Literals(items),
        Node::Variable(root) => match root {
            Root::Principal => roots.principal.map(V::of).ok_or(Defer)?,
            Root::Tool => roots.tool.map(V::of).ok_or(Defer)?,
            Root::Args => roots.args.map(V::Map).ok_or(Defer)?,
        },
        Node::Select(operand, field) => match eval(operand, roots)? {
            V::Map(fields) => V::of(fields.get(&**field).ok_or(Defer)?),
            _ => return Err(Defer),
        },
        Node::Has(operand, field) => match eval(operand, roots)? {
            V::Map(fields) => V::Bool(fields.contains_key(&**field)),
            _ => return Err(Defer),
        },
        Node::Not(operand) => V::Bool(!boolean(eval(operand, roots))?),
        Node::Connective(both, decisive) => connective(both, *decisive, roots)?,
        Node::Conditional(parts) => {
            if boolean(eval(&parts.0, roots))? {
                eval(&parts.1, roots)?
            } else {
                eval(&parts.2, roots)?
            }
        }
        Node::Equal(both) => V::Bool(equal(eval(&both.0, roots)?, eval(&both.1, roots)?)?),
        Node::NotEqual(both) => V::Bool(!equal(eval(&both.0, roots)?, eval(&both.1, roots)?)?),
        Node::Compare(both, holds) => {
            V::Bool(holds(compare(eval(&both.0, roots)?, eval(&both.1, roots)?)?))
        }
        Node::In(both) => {
            let item = eval(&both.0, roots)?;
            let found = match eval(&both.1, roots)? {
                V::List(items) => items.iter().map(V::of).try_fold(false, |found, member| {
                    Ok::<_, Defer>(found || equal(member, item)?)
                })?,
                V::Literals(items) => {
                    items.iter().map(Literal::value).try_fold(false, |found, member| {
                        Ok::<_, Defer>(found || equal(member, item)?)
                    })?
                }
                _ => return Err(Defer),
            };
            V::Bool(found)
        }
        Node::Size(operand) => {
            let size = match eval(operand, roots)? {
                V::String(s) => s.chars().count(),
                V::List(items) => items.len(),
                V::Literals(items) => items.len(),
                V::Map(fields) => fields.len(),
                _ => return Err(Defer),
            };
            V::Int(i64::try_from(size).map_err(|_| Defer)?)
        }
        Node::Text(both, holds) => match (eval(&both.0, roots)?, eval(&both.1, roots)?) {
            (V::String(s), V::String(p)) => V::Bool(holds(s, p)),
            _ => return Err(Defer),
        },
    })
}

/// `a && b` (`decisive` false) or `a || b` (`decisive` true), as the interpreter: the
/// decisive value on either side decides, even if the other side is an error.
fn connective<'a>(
    both: &'a (Node, Node),
    decisive: bool,
    roots: &Roots<'a>,
) -> Result<V<'a>, Defer> {
    let left = boolean(eval(&both.0, roots));
    if matches!(left, Ok(value) if value == decisive) {
        return Ok(V::Bool(decisive));
    }
    match (left, boolean(eval(&both.1, roots))) {
        (Ok(_), Ok(right)) => Ok(V::Bool(right)),
        (Err(Defer), Ok(right)) if right == decisive => Ok(V::Bool(decisive)),
        _ => Err(Defer),
    }
}

fn boolean(value: Result<V<'_>, Defer>) -> Result<bool, Defer> {
    match value? {
        V::Bool(b) => Ok(b),
        _ => Err(Defer),
    }
}

/// CEL equality of two scalars: numbers compare across `int`, `uint` and `double`, values
/// of different kinds are unequal. Lists and maps are left to the interpreter.
fn equal(a: V<'_>, b: V<'_>) -> Result<bool, Defer> {
    Ok(match (a, b) {
        (V::List(_) | V::Literals(_) | V::Map(_), _)
        | (_, V::List(_) | V::Literals(_) | V::Map(_)) => {
            return Err(Defer);
        }
        (V::Null, V::Null) => true,
        (V::Bool(a), V::Bool(b)) => a == b,
        (V::String(a), V::String(b)) => a == b,
        (a, b) if is_number(a) && is_number(b) => compare(a, b).is_ok_and(Ordering::is_eq),
        _ => false,
    })
}

fn is_number(value: V<'_>) -> bool {
    matches!(value, V::Int(_) | V::Uint(_) | V::Double(_))
}

/// CEL ordering, as the `cel` crate's: within booleans, within strings, and across the
/// three kinds of numbers (an `int` or `uint` against a `double` converted to `double`).
fn compare(a: V<'_>, b: V<'_>) -> Result<Ordering, Defer> {
    match (a, b) {
        (V::Bool(a), V::Bool(b)) => Ok(a.cmp(&b)),
        (V::String(a), V::String(b)) => Ok(a.cmp(b)),
        (V::Int(a), V::Int(b)) => Ok(a.cmp(&b)),
        (V::Uint(a), V::Uint(b)) => Ok(a.cmp(&b)),
        (V::Int(a), V::Uint(b)) => Ok(u64::try_from(a).map_or(Ordering::Less, |a| a.cmp(&b))),
        (V::Uint(a), V::Int(b)) => Ok(i64::try_from(a).map_or(Ordering::Greater, |a| a.cmp(&b))),
        #[allow(clippy::cast_precision_loss)]
        (V::Int(a), V::Double(b)) => (a as f64).partial_cmp(&b).ok_or(Defer),
        #[allow(clippy::cast_precision_loss)]
        (V::Uint(a), V::Double(b)) => (a as f64).partial_cmp(&b).ok_or(Defer),
        #[allow(clippy::cast_precision_loss)]
        (V::Double(a), V::Int(b)) => a.partial_cmp(&(b as f64)).ok_or(Defer),
        #[allow(clippy::cast_precision_loss)]
        (V::Double(a), V::Uint(b)) => a.partial_cmp(&(b as f64)).ok_or(Defer),
        (V::Double(a), V::Double(b)) => a.partial_cmp(&b).ok_or(Defer),
        _ => Err(Defer),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::variables::{Args, Variables, convert};

    /// What the interpreter makes of `source`, as `Some(boolean)`, or `None` for an error or
    /// another type.
    fn interpret(source: &str, principal: &Json, tool: &Json, args: &Json) -> Option<bool> {
        let env = Arc::new(cel::Env::stdlib());
        let program = env.compile(source).expect("the expression compiles");
        let (principal, tool) = (convert(principal), convert(tool));
        let Json::Object(fields) = args else { panic!("arguments are an object") };
        let variables = Variables {
            principal: Some(principal.as_ref()),
            tool: Some(tool.as_ref()),
            args: Args::Fields(fields),
        };
        let mut context = cel::Context::with_env(env);
        context.set_variable_resolver(&variables);
        match program.execute(&context) {
            Ok(cel::Value::Bool(value)) => Some(value),
            _ => None,
        }
    }

    fn compiled(source: &str) -> Option<Compiled> {
        let program = cel::Env::stdlib().compile(source).expect("the expression compiles");
        Compiled::new(program.expression())
    }

    const COMPILED: &[&str] = &[
        "size(args.message) > 4096 || args.message.startsWith('rm -rf')",
        "args.message.size() > 3",
        "args.path.startsWith('/srv/')",
        "args.path.endsWith('.csv')",
        "args.path.contains('data')",
        "has(args.path) && args.path.startsWith('/srv/')",
        "!has(args.path)",
        "has(args.limits.max)",
        "has(args.path.x)",
        "args.count > 5",
        "args.count == 7",
        "args.count == 7.0",
        "args.count == 7u",
        "args.count != 7",
        "args.count < -1",
        "args.count <= 7 && args.count >= 7",
        "args.negative < 0",
        "args.negative < 0u",
        "args.negative == -2.0",
        "args.ratio < 1",
        "args.ratio >= 0.5",
        "args.ratio > 0u",
        "args.ratio == 0.5",
        "args.big > 9223372036854775807",
        "args.big == 18446744073709551615u",
        "args.big > 1.0",
        "args.nothing == null",
        "args.nothing != null",
        "args.count == null",
        "args.path == 1",
        "args.path != true",
        "args.dry_run == false",
        "args.dry_run",
        "!args.dry_run",
        "args.dry_run < true",
        "args.nothing < 1",
        "'b' in args.tags",
        "'z' in args.tags",
        "args.count in [1, 7, 9]",
        "args.count in [1u, 8u]",
        "args.ratio in [0.5]",
        "args.path in ['/a', '/srv/data/report.csv']",
        "7 in args.nums",
        "args.limits in args.tags",
        "'max' in args.limits",
        "args.tags in ['a']",
        "size(args.tags) == 2",
        "args.tags.size() == 2",
        "size(args.limits) == 2",
        "size(['a', 'b', 'c']) == 3",
        "size(args.count) == 1",
        "args.unicode.size() == 3",
        "size(args.unicode) == 5",
        "args.limits.max >= 5 && args.limits.unit == 'MiB'",
        "args['path'].endsWith('.csv')",
        "args.limits['unit'] == 'MiB'",
        "args.missing == 1",
        "args.missing == 1 || true",
        "true || args.missing == 1",
        "args.missing == 1 && false",
        "false && args.missing",
        "args.missing || args.dry_run",
        "args.missing && args.dry_run",
        "args.path || false",
        "args.path && true",
        "args.count > 5 ? args.path.startsWith('/srv') : false",
        "args.path ? true : false",
        "args.message.startsWith(1)",
        "args.count.startsWith('a')",
        "args.tags.contains('a')",
        "args.tags == ['a', 'b']",
        "args.limits == args.limits",
        "args.path < 'z'",
        "args.path >= '/srv'",
        "null == null",
        "1 == 1u",
        "1.0 == 1u",
        "-1 < 1u",
        "1u > -1",
        "'admin' in principal.roles",
        "principal.name == 'alice'",
        "principal.attributes.team == 'blue'",
        "principal.attributes.team.startsWith('b') && principal.kind == 'api_key'",
        "tool.name.contains('delete')",
        "tool.annotations.read_only",
        "!tool.annotations.destructive || 'admin' in principal.roles",
        "'x' in tool.tags",
        "tool.source == 'builtin' && tool.kind == 'local'",
        "tool.missing == 1 || tool.toolkit == ''",
    ];

    const INTERPRETED: &[&str] = &[
        "args.path + '!' == 'x!'",
        "args.tags.exists(t, t == 'a')",
        "size(args) > 2",
        "'path' in args",
        "args.path.matches('^/srv')",
        "int(args.count) > 5",
        "args.count * 2 > 10",
        "b'x' == b'x'",
        "args.tags[0] == 'a'",
        "[args.path].size() == 1",
        "{'a': 1}.a == 1",
        "principal == principal",
    ];

    fn argument_sets() -> [Json; 3] {
        [
            json!({
                "path": "/srv/data/report.csv",
                "message": "rm -rf /",
                "count": 7,
                "negative": -2,
                "ratio": 0.5,
                "big": 18_446_744_073_709_551_615_u64,
                "dry_run": false,
                "nothing": null,
                "tags": ["a", "b"],
                "nums": [1, 7.0, -3],
                "unicode": "héé",
                "limits": {"max": 5, "unit": "MiB"},
            }),
            json!({}),
            json!({
                "path": null,
                "message": 5,
                "count": "7",
                "negative": [],
                "ratio": {"a": 1},
                "big": -9_223_372_036_854_775_807_i64,
                "dry_run": "no",
                "tags": "a, b",
                "nums": [[7], {"7": 7}, 7],
                "unicode": "",
                "limits": ["max"],
                "missing": true,
            }),
        ]
    }

    /// Wherever the compiled condition gives an answer, it is the interpreter's; and on the
    /// first argument set, which has every field the expressions read with the type they
    /// expect, it gives one for most of them.
    #[test]
    fn a_compiled_condition_answers_as_the_interpreter_does() {
        let principals = [
            json!({"name": "alice", "kind": "api_key", "roles": ["admin", "team-0"],
                   "attributes": {"team": "blue"}}),
            json!({"name": "", "kind": "anonymous", "roles": [], "attributes": {}}),
        ];
        let tool = json!({"name": "delete_file", "source": "builtin", "kind": "local",
            "toolkit": "", "tags": ["x"], "annotations": {"read_only": false,
            "destructive": true, "idempotent": false, "open_world": true}});
        let mut answered = 0;
        for source in COMPILED {
            let condition = compiled(source).unwrap_or_else(|| panic!("{source} compiles"));
            for principal in &principals {
                for (i, args) in argument_sets().iter().enumerate() {
                    let Json::Object(fields) = args else { unreachable!() };
                    let roots =
                        Roots { principal: Some(principal), tool: Some(&tool), args: Some(fields) };
                    let expected = interpret(source, principal, &tool, args);
                    let got = condition.evaluate(&roots);
                    if got.is_some() {
                        assert_eq!(got, expected, "{source} with argument set {i}");
                        answered += usize::from(i == 0);
                    }
                }
            }
        }
        assert!(answered >= 2 * COMPILED.len() * 3 / 4, "{answered} of {}", 2 * COMPILED.len());
        for source in INTERPRETED {
            assert!(compiled(source).is_none(), "{source} is left to the interpreter");
        }
    }

    #[test]
    fn the_common_conditions_are_answered_without_the_interpreter() {
        let args = json!({"message": "hello", "path": "/srv/a"});
        let Json::Object(fields) = &args else { unreachable!() };
        let roots = Roots { principal: None, tool: None, args: Some(fields) };
        for (source, expected) in [
            ("size(args.message) > 4096 || args.message.startsWith('rm -rf')", false),
            ("has(args.path) && args.path.startsWith('/srv/')", true),
            ("args.message in ['hello', 'bye']", true),
        ] {
            let condition = compiled(source).expect("it compiles");
            assert_eq!(condition.evaluate(&roots), Some(expected), "{source}");
        }
    }
}
