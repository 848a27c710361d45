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

/// Splits `text` into chunks of at most `tokens` tokens of `embedder` (words without one)
/// and at most `bytes` bytes, each repeating up to `overlap` tokens of the one before.
pub fn chunks(
    text: &str,
    markdown: bool,
    (tokens, bytes): (usize, usize),
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
    // A few tokens may be megabytes (a data URI, minified code): such a piece is cut again
    // by bytes, in one linear pass.
    let pieces = pieces.into_iter().flat_map(|(offset, piece)| by_bytes(offset, piece, bytes));
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

/// `piece` (at `offset`) in parts of at most `bytes` bytes, cut after the last whitespace
/// in a part's second half where there is one, else at a character boundary.
fn by_bytes(offset: usize, piece: &str, bytes: usize) -> Vec<(usize, &str)> {
    let bytes = bytes.max(4);
    let mut parts = Vec::with_capacity(piece.len() / bytes + 1);
    let (mut at, mut rest) = (offset, piece);
    while rest.len() > bytes {
        let mut end = bytes;
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        if let Some(space) = rest[end / 2..end].rfind(char::is_whitespace) {
            let space = end / 2 + space;
            end = space + rest[space..].chars().next().map_or(1, char::len_utf8);
        }
        let (part, tail) = rest.split_at(end);
        let kept = part.trim_end();
        if !kept.trim_start().is_empty() {
            parts.push((at, kept));
        }
        at += end;
        rest = tail;
    }
    if !rest.trim().is_empty() {
        parts.push((at, rest));
    }
    parts
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
        let found = chunks(&text, true, (40, 4096), 8, None).unwrap();
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
        let found = chunks(&text, false, (30, 4096), 10, None).unwrap();
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

    #[test]
    fn long_words_are_cut_by_bytes_as_well_as_by_tokens() {
        // 120 "words" of 15,000 characters: 120 tokens by the count, 1.8 MB by the bytes.
        let word = "A".repeat(15_000);
        let text = vec![word.as_str(); 120].join(" ");
        let found = chunks(&text, false, (120, 4096), 24, None).unwrap();
        assert!(found.iter().all(|c| c.text.len() <= 4096), "a chunk over 4096 bytes");
        let covered: usize = found.iter().map(|c| c.text.len()).sum();
        assert!(covered >= text.len() - 120, "the whole text is chunked: {covered}");
        assert!(found.iter().all(|c| text[c.offset..].starts_with(&c.text)), "offsets hold");
        let mixed = format!("{} é {}", "é".repeat(3000), "b ".repeat(3000));
        let parts = chunks(&mixed, false, (120, 4096), 0, None).unwrap();
        assert!(
            parts.iter().all(|c| c.text.len() <= 4096 && mixed[c.offset..].starts_with(&c.text))
        );
        // Ordinary prose is cut by its tokens, as before.
        let prose = (0..60).map(|i| format!("Sentence {i} ends.")).collect::<Vec<_>>().join(" ");
        let by_tokens = chunks(&prose, false, (30, 4096), 0, None).unwrap();
        assert!(by_tokens.iter().all(|c| c.text.split_whitespace().count() <= 30));
        assert!(by_tokens.iter().any(|c| c.text.split_whitespace().count() > 25));
    }
}
