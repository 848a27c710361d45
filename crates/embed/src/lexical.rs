//! Lexical vectors: a text cut into terms ([`terms`]), and its BM25 term weights as a
//! sparse vector, for the store to score with the inverse document frequency it keeps. The
//! tool index and knowledge collections analyse text alike.
//!
//! A document's weight for a term is BM25's saturated term frequency,
//! `tf · (k1 + 1) / (tf + k1 · (1 − b + b · len / avg))`; a query's is 1 per distinct term.
//! The store multiplies by `ln(1 + (N − n + 0.5) / (n + 0.5))` over the points that have the
//! term, so a query's dot product with a document is the document's BM25 score. Term ids
//! are a stable hash of the term (FNV-1a), the same in every process and release, because
//! the vectors are stored and shared.

use std::{borrow::Cow, collections::HashMap};

use rust_stemmers::{Algorithm, Stemmer};

use toolmesh_core::vector::SparseVector;

/// BM25 term-frequency saturation.
const K1: f32 = 1.2;
/// BM25 length normalisation.
const B: f32 = 0.75;
/// The text length (in terms) lengths are normalised by: a tool's name, description and
/// parameters come to about this many. It is fixed rather than the catalog's mean, because
/// a stored vector must not depend on which other tools are in the catalog.
pub const AVERAGE_TERMS: f32 = 32.0;

/// Returns the id of `term`.
pub fn term_id(term: &str) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in term.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

/// Returns the lexical vector of a document made of `terms`, normalised by `average`
/// terms.
pub fn document(terms: &[String], average: f32) -> SparseVector {
    let mut counts: HashMap<u32, f32> = HashMap::new();
    for term in terms {
        *counts.entry(term_id(term)).or_default() += 1.0;
    }
    let norm = K1 * (1.0 - B + B * terms.len() as f32 / average);
    sparse(counts.into_iter().map(|(id, tf)| (id, tf * (K1 + 1.0) / (tf + norm))))
}

/// Returns the lexical vector of a query made of `terms`.
pub fn query(terms: &[String]) -> SparseVector {
    sparse(terms.iter().map(|t| (term_id(t), 1.0)))
}

/// A sparse vector from weights by id; the weight of an id given twice is the last one.
fn sparse(weights: impl Iterator<Item = (u32, f32)>) -> SparseVector {
    let mut pairs: Vec<(u32, f32)> = weights.collect();
    pairs.sort_unstable_by_key(|&(id, _)| id);
    pairs.dedup_by_key(|&mut (id, _)| id);
    let (indices, values) = pairs.into_iter().unzip();
    SparseVector { indices, values }
}

/// Words too common to tell tools apart.
const STOPWORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "in", "is", "it", "of", "on",
    "or", "that", "the", "this", "to", "with", "you", "your", "can", "will", "which", "its",
];

/// Cuts text into lowercase terms: splits on anything but letters and digits and at
/// camelCase boundaries, drops stopwords, folds simple plurals (`files` → `file`), and
/// stems with the Snowball English stemmer (`predicting`, `predicts` → `predict`).
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
    let stemmer = Stemmer::create(Algorithm::English);
    words
        .into_iter()
        .filter(|w| !STOPWORDS.contains(&w.as_str()))
        .map(|w| {
            let word = fold_plural(w);
            match stemmer.stem(&word) {
                Cow::Borrowed(stem) if stem.len() == word.len() => word,
                stem => stem.into_owned(),
            }
        })
        .collect()
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
            ["read", "file", "file", "directori"]
        );
        assert_eq!(terms("YituTech_conv-bert-base"), ["yitu", "tech", "conv", "bert", "base"]);
        assert_eq!(terms("Address status"), ["address", "status"]);
        // Inflections meet at one stem, in tool texts and queries alike.
        assert_eq!(terms("predicting predicts predicted"), ["predict", "predict", "predict"]);
        assert_eq!(terms("Translation"), terms("translations"));
    }

    #[test]
    fn weights_saturate_with_frequency_and_fall_with_length() {
        let short = document(&terms("weather forecast"), AVERAGE_TERMS);
        let long = document(
            &terms("weather forecast for a city, with wind, rain, humidity and pressure readings"),
            AVERAGE_TERMS,
        );
        let weather = term_id("weather");
        let weight =
            |v: &SparseVector| v.values[v.indices.iter().position(|i| *i == weather).unwrap()];
        assert!(weight(&short) > weight(&long));
        let repeated = document(&terms("weather weather weather forecast"), AVERAGE_TERMS);
        assert!(weight(&repeated) > weight(&short));
        assert!(weight(&repeated) < 3.0 * weight(&short));
        // The ids are sorted and distinct, as the store wants them.
        assert!(repeated.indices.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(query(&terms("weather weather")).values, [1.0]);
    }

    #[test]
    fn term_ids_are_stable_across_processes_and_releases() {
        // Stored vectors are read by later releases: these ids must never change.
        assert_eq!(term_id(""), 0x811c_9dc5);
        assert_eq!(term_id("a"), 0xe40c_292c);
        assert_eq!(term_id("weather"), term_id("weather"));
        assert_ne!(term_id("weather"), term_id("forecast"));
    }
}
