//! The searchable text of a tool; [`toolmesh_embed::lexical`] cuts it into terms.

use serde_json::Value;
use sha2::{Digest as _, Sha256};
use toolmesh_core::ToolSpec;

/// The digest of a tool's text: the first 16 bytes of its SHA-256.
pub type TextDigest = [u8; 16];

/// Returns the digest of `text`.
pub fn digest(text: &str) -> TextDigest {
    let full = Sha256::digest(text.as_bytes());
    let mut digest = [0; 16];
    digest.copy_from_slice(&full[..16]);
    digest
}

/// Returns a tool's searchable text: its name, title, description, tags, and the names and
/// descriptions of its parameters, with identifiers split into words (`get_user_token` and
/// `getUserToken` read `get user token`), as the embedding model reads words.
///
/// The text's digest names the tool's point in the vector store, so this text must not
/// change from one version to the next: a different text is a new point, embedded again.
pub fn tool_text(spec: &ToolSpec) -> String {
    let mut text = String::with_capacity(
        spec.name.len() + spec.title.len() + spec.description.len() + 64 + 64 * spec.tags.len(),
    );
    let mut previous = None;
    let mut push = |piece: &str, text: &mut String| split_identifiers(piece, text, &mut previous);
    push(&spec.name, &mut text);
    push(" ", &mut text);
    push(&spec.title, &mut text);
    push(" ", &mut text);
    push(&spec.description, &mut text);
    push(" ", &mut text);
    for (i, tag) in spec.tags.iter().enumerate() {
        if i > 0 {
            push(" ", &mut text);
        }
        push(tag, &mut text);
    }
    if let Some(Value::Object(properties)) = spec.input_schema.get("properties") {
        for (name, property) in properties {
            push(" ", &mut text);
            push(name, &mut text);
            if let Some(Value::String(description)) = property.get("description") {
                push(" ", &mut text);
                push(description, &mut text);
            }
        }
    }
    text
}

/// Appends `piece` to `out` with underscores replaced by spaces and a space put at each
/// lower-to-upper case step; `previous` is the last character appended, so that pieces
/// appended one after another read as one text. ASCII runs are copied whole.
fn split_identifiers(piece: &str, out: &mut String, previous: &mut Option<char>) {
    if !piece.is_ascii() {
        for c in piece.chars() {
            if c == '_' {
                out.push(' ');
                *previous = None;
                continue;
            }
            if previous.is_some_and(char::is_lowercase) && c.is_uppercase() {
                out.push(' ');
            }
            out.push(c);
            *previous = Some(c);
        }
        return;
    }
    let mut start = 0;
    for (i, &byte) in piece.as_bytes().iter().enumerate() {
        if byte == b'_' {
            out.push_str(&piece[start..i]);
            out.push(' ');
            start = i + 1;
            *previous = None;
            continue;
        }
        if byte.is_ascii_uppercase() && previous.is_some_and(char::is_lowercase) {
            out.push_str(&piece[start..i]);
            out.push(' ');
            start = i;
        }
        *previous = Some(char::from(byte));
    }
    out.push_str(&piece[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolmesh_embed::lexical::terms;

    #[test]
    fn tool_text_splits_identifiers_into_words() {
        let spec = ToolSpec::new(
            "get_job_details",
            "Fetch a job; see fetchJobURL.",
            serde_json::json!({"properties": {"include_skills": {"description": "Skills too"}}}),
            toolmesh_core::ToolSource::local("test"),
        );
        let text = tool_text(&spec);
        assert!(text.starts_with("get job details "), "{text}");
        assert!(text.contains("fetch Job URL."), "{text}");
        assert!(text.ends_with(" include skills Skills too"), "{text}");
        // The text names the tool's stored point: it is the text toolmesh has always made
        // (one formatted string, split in a second pass), across case steps, underscores
        // and non-ASCII letters at the joins of its parts.
        let reference = |spec: &ToolSpec| {
            let mut text = format!(
                "{} {} {} {}",
                spec.name,
                spec.title,
                spec.description,
                spec.tags.join(" ")
            );
            if let Some(Value::Object(properties)) = spec.input_schema.get("properties") {
                for (name, property) in properties {
                    text.push(' ');
                    text.push_str(name);
                    if let Some(Value::String(description)) = property.get("description") {
                        text.push(' ');
                        text.push_str(description);
                    }
                }
            }
            let mut out = String::new();
            let mut previous: Option<char> = None;
            for c in text.chars() {
                if c == '_' {
                    out.push(' ');
                    previous = None;
                    continue;
                }
                if previous.is_some_and(char::is_lowercase) && c.is_uppercase() {
                    out.push(' ');
                }
                out.push(c);
                previous = Some(c);
            }
            out
        };
        let mut odd = ToolSpec::new(
            "ÉtéÜber_caféBar",
            "déjàVu _x_ ABCdef ñAÑ",
            serde_json::json!({"properties": {"é": {"description": "Ünder"}, "aB_c": {}}}),
            toolmesh_core::ToolSource::local("test"),
        );
        odd.title = "titleÉ".into();
        odd.tags = vec!["tagA".into(), "Tag_b".into(), "ü".into()];
        for spec in [&spec, &odd] {
            assert_eq!(tool_text(spec), reference(spec));
        }
        // Splitting identifiers changes nothing for BM25, which splits them too.
        assert_eq!(
            terms(&text),
            terms("get_job_details Fetch a job; see fetchJobURL. include_skills Skills too")
        );
    }
}
