//! The searchable text of a tool, and how it is cut into terms.

use serde_json::Value;
use toolmesh_core::ToolSpec;

/// Words too common to tell tools apart.
const STOPWORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "in", "is", "it", "of", "on",
    "or", "that", "the", "this", "to", "with", "you", "your", "can", "will", "which", "its",
];

/// Returns a tool's searchable text: its name, title, description, tags, and the names and
/// descriptions of its parameters.
pub fn tool_text(spec: &ToolSpec) -> String {
    let mut text =
        format!("{} {} {} {}", spec.name, spec.title, spec.description, spec.tags.join(" "));
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
    text
}

/// Cuts text into lowercase terms: splits on anything but letters and digits and at
/// camelCase boundaries, drops stopwords, and folds simple plurals (`files` → `file`).
pub fn terms(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut previous: Option<char> = None;
    for c in text.chars() {
        if !c.is_alphanumeric() {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            previous = None;
            continue;
        }
        // getUserToken → get user token; HTTPServer stays one word until the lowercase run.
        if let Some(p) = previous
            && c.is_uppercase()
            && p.is_lowercase()
            && !current.is_empty()
        {
            words.push(std::mem::take(&mut current));
        }
        current.extend(c.to_lowercase());
        previous = Some(c);
    }
    if !current.is_empty() {
        words.push(current);
    }
    words.into_iter().filter(|w| !STOPWORDS.contains(&w.as_str())).map(fold_plural).collect()
}

fn fold_plural(word: String) -> String {
    if word.len() > 3 && word.ends_with('s') && !word.ends_with("ss") && !word.ends_with("us") {
        let stem = &word[..word.len() - 1];
        return stem.strip_suffix("ie").map_or_else(|| stem.to_owned(), |s| format!("{s}y"));
    }
    word
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_split_case_and_punctuation_and_drop_noise() {
        assert_eq!(terms("getUserToken"), ["get", "user", "token"]);
        assert_eq!(
            terms("read_file / Files in the directories"),
            ["read", "file", "file", "directory"]
        );
        assert_eq!(terms("YituTech_conv-bert-base"), ["yitu", "tech", "conv", "bert", "base"]);
        assert_eq!(terms("Address status"), ["address", "status"]);
    }
}
