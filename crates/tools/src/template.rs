//! `{{param}}` templates of configured tools.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

/// Characters left as they are in a URL component (RFC 3986 unreserved).
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Returns the text an argument contributes to a string: strings as they are, other
/// values as JSON, a missing argument as nothing.
fn as_text(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// Fills `{{param}}` placeholders in `template`, passing each value through `encode`.
fn fill(template: &str, arguments: &Value, encode: impl Fn(&str) -> String) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        let Some(len) = rest[start + 2..].find("}}") else { break };
        out.push_str(&rest[..start]);
        let name = rest[start + 2..start + 2 + len].trim();
        out.push_str(&encode(&as_text(arguments.get(name))));
        rest = &rest[start + 2 + len + 2..];
    }
    out.push_str(rest);
    out
}

/// Fills a URL template; every substituted value is percent-encoded, so an argument can
/// never add a path segment, a query parameter or change the host.
///
/// An argument that would make a whole path segment `.` or `..` is refused: URL parsers
/// resolve such a segment (percent-encoded as `%2E` too, by the WHATWG rules), which would
/// move the request to another path. The error names the arguments of that segment.
pub(crate) fn fill_url(template: &str, arguments: &Value) -> Result<String, String> {
    let encode = |value: &str| utf8_percent_encode(value, COMPONENT).to_string();
    let end = template.find(['?', '#']).unwrap_or(template.len());
    let (path, rest) = template.split_at(end);
    let filled = fill(path, arguments, encode);
    // Values cannot hold `/` (it is encoded), so filled and template segments pair up.
    for (segment, written) in filled.split('/').zip(path.split('/')) {
        if matches!(segment, "." | "..") && segment != written {
            let names = placeholders(written).join(", ");
            return Err(format!(
                "argument {names} makes the URL path segment {segment:?}, which would leave \
                 its place in the path"
            ));
        }
    }
    Ok(filled + &fill(rest, arguments, encode))
}

/// Returns the names of the `{{param}}` placeholders in `text`.
fn placeholders(text: &str) -> Vec<&str> {
    text.split("{{")
        .skip(1)
        .filter_map(|part| part.split_once("}}").map(|(name, _)| name.trim()))
        .collect()
}

/// Fills a JSON body template. A string that is exactly one placeholder becomes the
/// argument's JSON value (null when missing); other strings are filled as text.
pub(crate) fn fill_body(template: &Value, arguments: &Value) -> Value {
    match template {
        Value::String(s) => {
            let trimmed = s.trim();
            if let Some(name) = trimmed.strip_prefix("{{").and_then(|t| t.strip_suffix("}}"))
                && !name.contains("{{")
            {
                return arguments.get(name.trim()).cloned().unwrap_or(Value::Null);
            }
            Value::String(fill(s, arguments, str::to_owned))
        }
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| fill_body(v, arguments)).collect())
        }
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), fill_body(v, arguments))).collect())
        }
        other => other.clone(),
    }
}

/// Follows a dot path (`fields.summary`, `items.0.id`) into a JSON value.
pub(crate) fn extract<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').filter(|s| !s.is_empty()).try_fold(value, |current, segment| match current {
        Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
        Value::Object(map) => map.get(segment),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn url_values_are_encoded_and_cannot_escape_their_component() {
        let args = json!({"city": "São Paulo/../admin?x=1&y", "n": 3});
        assert_eq!(
            fill_url("https://h/w?city={{city}}&n={{ n }}&m={{missing}}", &args).unwrap(),
            "https://h/w?city=S%C3%A3o%20Paulo%2F..%2Fadmin%3Fx%3D1%26y&n=3&m="
        );
    }

    #[test]
    fn an_argument_cannot_make_a_dot_segment_of_the_path() {
        let template = "https://h/api/users/{{id}}/files/{{a}}{{b}}?q={{id}}";
        for (id, a, b) in [("..", "x", "y"), (".", "x", "y"), ("7", ".", "."), ("7", "", "..")] {
            let args = json!({"id": id, "a": a, "b": b});
            let error = fill_url(template, &args).unwrap_err();
            assert!(error.contains("path segment"), "{id} {a} {b}: {error}");
        }
        let error = fill_url(template, &json!({"id": "..", "a": "x", "b": "y"})).unwrap_err();
        assert!(error.starts_with("argument id makes"), "{error}");
        let args = json!({"id": "..x", "a": "%2e", "b": "%2E"});
        let url = fill_url(template, &args).unwrap();
        assert_eq!(url, "https://h/api/users/..x/files/%252e%252E?q=..x");
        // In the query a dot is only text, and the template's own dot segments are kept.
        let url = fill_url("https://h/a/../b?x={{id}}", &json!({"id": ".."})).unwrap();
        assert_eq!(url, "https://h/a/../b?x=..");
    }

    #[test]
    fn body_placeholders_keep_json_types() {
        let args = json!({"title": "Disk full", "priority": 2, "tags": ["a"]});
        let body = fill_body(
            &json!({"t": "{{title}}", "p": "{{priority}}", "tags": "{{tags}}",
                    "msg": "ticket: {{title}} (p{{priority}})", "none": "{{absent}}", "k": 1}),
            &args,
        );
        assert_eq!(
            body,
            json!({"t": "Disk full", "p": 2, "tags": ["a"], "msg": "ticket: Disk full (p2)",
                   "none": null, "k": 1})
        );
    }

    #[test]
    fn dot_paths_walk_objects_and_arrays() {
        let v = json!({"items": [{"id": 7}], "fields": {"summary": "ok"}});
        assert_eq!(extract(&v, "items.0.id"), Some(&json!(7)));
        assert_eq!(extract(&v, "fields.summary"), Some(&json!("ok")));
        assert_eq!(extract(&v, "items.1.id"), None);
        assert_eq!(extract(&v, "fields.summary.x"), None);
        assert_eq!(extract(&v, ""), Some(&v));
    }
}
