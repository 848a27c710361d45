//! Documents into chunks: sized in the embedding model's tokens by `text-splitter`, along
//! Markdown's structure for Markdown (headings, then paragraphs, then sentences) and along
//! paragraphs and sentences for plain text.
//!
//! A chunk of a Markdown document is embedded with the headings it sits under (its
//! "breadcrumb", `Guide > Install`) in front when it does not start with them, so that a
//! passage deep in a section still carries what the section is about.

use text_splitter::{ChunkConfig, ChunkSizer, MarkdownSplitter, TextSplitter};
use toolmesh_embed::Embedder;

/// One chunk of a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Its position in the document, from 0.
    pub position: usize,
    /// Byte offset of the chunk in the document.
    pub offset: usize,
    /// The chunk as the document has it, which searches return.
    pub text: String,
    /// What is embedded and indexed: the headings above it, then the text.
    pub indexed: String,
}

/// Sizes chunks in the model's tokens.
struct Tokens<'a>(&'a dyn Embedder);

impl ChunkSizer for Tokens<'_> {
    fn size(&self, chunk: &str) -> usize {
        self.0.count_tokens(chunk)
    }
}

/// Sizes chunks in words, without a model.
struct Words;

impl ChunkSizer for Words {
    fn size(&self, chunk: &str) -> usize {
        chunk.split_whitespace().count()
    }
}

/// Splits `text` into chunks of at most `tokens` tokens of `embedder` (words without one),
/// each repeating up to `overlap` tokens of the one before.
pub fn chunks(
    text: &str,
    markdown: bool,
    tokens: usize,
    overlap: usize,
    embedder: Option<&dyn Embedder>,
) -> Result<Vec<Chunk>, String> {
    let tokens = embedder.map_or(tokens, |e| tokens.min(e.max_tokens()));
    let overlap = overlap.min(tokens.saturating_sub(1));
    let pieces: Vec<(usize, &str)> = match embedder {
        Some(embedder) => {
            split(text, markdown, ChunkConfig::new(tokens).with_sizer(Tokens(embedder)), overlap)?
        }
        None => split(text, markdown, ChunkConfig::new(tokens).with_sizer(Words), overlap)?,
    };
    let headings = if markdown { headings(text) } else { Vec::new() };
    Ok(pieces
        .into_iter()
        .enumerate()
        .map(|(position, (offset, piece))| {
            let trail = breadcrumb(&headings, offset);
            let indexed = if trail.is_empty() || piece.starts_with('#') {
                piece.to_owned()
            } else {
                format!("{trail}\n\n{piece}")
            };
            Chunk { position, offset, text: piece.to_owned(), indexed }
        })
        .collect())
}

fn split<S: ChunkSizer>(
    text: &str,
    markdown: bool,
    config: ChunkConfig<S>,
    overlap: usize,
) -> Result<Vec<(usize, &str)>, String> {
    let config = config.with_overlap(overlap).map_err(|e| e.to_string())?;
    Ok(if markdown {
        MarkdownSplitter::new(config).chunk_indices(text).collect()
    } else {
        TextSplitter::new(config).chunk_indices(text).collect()
    })
}

/// The ATX headings of a Markdown text: byte offset, level and title; headings inside
/// fenced code are not headings.
fn headings(text: &str) -> Vec<(usize, usize, String)> {
    let mut found = Vec::new();
    let mut fenced = false;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fenced = !fenced;
        } else if !fenced && trimmed.starts_with('#') {
            let level = trimmed.chars().take_while(|c| *c == '#').count();
            let title = trimmed[level..].trim();
            if level <= 6
                && (trimmed[level..].starts_with(' ') || title.is_empty())
                && !title.is_empty()
            {
                found.push((offset, level, title.trim_end_matches('#').trim().to_owned()));
            }
        }
        offset += line.len();
    }
    found
}

/// The titles of the headings that a chunk at `offset` sits under, outermost first.
fn breadcrumb(headings: &[(usize, usize, String)], offset: usize) -> String {
    let mut trail: Vec<(usize, &str)> = Vec::new();
    for (at, level, title) in headings.iter().take_while(|(at, ..)| *at <= offset) {
        let _ = at;
        while trail.last().is_some_and(|(l, _)| *l >= *level) {
            trail.pop();
        }
        trail.push((*level, title));
    }
    trail.iter().map(|(_, t)| *t).collect::<Vec<_>>().join(" > ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_chunks_stay_within_size_and_carry_their_headings() {
        let text = "# Guide\n\nIntro words here.\n\n## Install\n\n".to_owned()
            + &"Run the installer and wait for it to finish. ".repeat(12)
            + "\n\n## Use\n\nCall the tool with a query.\n";
        let found = chunks(&text, true, 40, 8, None).unwrap();
        assert!(found.len() > 2, "{found:?}");
        assert!(found.iter().all(|c| c.text.split_whitespace().count() <= 40), "{found:?}");
        assert_eq!(
            found.iter().map(|c| c.position).collect::<Vec<_>>(),
            (0..found.len()).collect::<Vec<_>>()
        );
        // A chunk in the middle of "Install" is indexed under its headings.
        let inner = found.iter().find(|c| c.text.starts_with("Run the installer")).unwrap();
        assert!(inner.indexed.starts_with("Guide > Install\n\n"), "{inner:?}");
        let last = found.last().unwrap();
        assert!(last.text.contains("Call the tool"), "{last:?}");
        assert!(
            last.indexed.starts_with('#') || last.indexed.starts_with("Guide > Use"),
            "{last:?}"
        );
        // Offsets point at the chunk in the document.
        assert!(found.iter().all(|c| text[c.offset..].starts_with(&c.text)));
    }

    #[test]
    fn plain_text_chunks_overlap_and_code_fences_hold_no_headings() {
        let text = (0..60)
            .map(|i| format!("Sentence number {i} ends here."))
            .collect::<Vec<_>>()
            .join(" ");
        let found = chunks(&text, false, 30, 10, None).unwrap();
        assert!(found.len() >= 3);
        // The second chunk starts inside the first: they overlap.
        assert!(found[1].offset < found[0].offset + found[0].text.len(), "{found:?}");
        assert!(found.iter().all(|c| c.indexed == c.text));
        assert!(
            headings("```\n# not a heading\n```\n# Real\n")
                .iter()
                .map(|h| h.2.as_str())
                .eq(["Real"])
        );
    }
}
