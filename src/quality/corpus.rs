//! The fixed corpus the distribution fidelity is teacher-forced on (docs/quality.md,
//! `tests/fixtures/quality/README.md` for each text's source).

use serde::Deserialize;
use serde_json::Value;

/// One document of the corpus.
#[derive(Debug, Clone, PartialEq)]
pub enum Document {
    /// Plain text, sent to `/v1/completions` as the prompt.
    Text {
        /// Short name (`public-domain`, `classics`).
        name: String,
        /// The text.
        text: String,
    },
    /// A chat transcript, sent to `/v1/chat/completions` as the messages, so each engine's own
    /// chat template renders it.
    Chat {
        /// Short name (`chat-1`, ...).
        name: String,
        /// OpenAI messages (`role`, `content`).
        messages: Vec<Value>,
    },
}

impl Document {
    /// Its name.
    pub fn name(&self) -> &str {
        match self {
            Document::Text { name, .. } | Document::Chat { name, .. } => name,
        }
    }
}

/// `tests/fixtures/text/public-domain.txt`.
const PUBLIC_DOMAIN: &str = include_str!("../../tests/fixtures/text/public-domain.txt");
/// `tests/fixtures/quality/corpus/classics.txt`.
const CLASSICS: &str = include_str!("../../tests/fixtures/quality/corpus/classics.txt");
/// `tests/fixtures/quality/corpus/chats.jsonl`.
const CHATS: &str = include_str!("../../tests/fixtures/quality/corpus/chats.jsonl");

/// What results call the corpus.
pub const CORPUS_NAME: &str = "rigbench quality corpus: tests/fixtures/text/public-domain.txt, tests/fixtures/quality/corpus/classics.txt (public domain), tests/fixtures/quality/corpus/chats.jsonl (8 transcripts written for the repository, CC0)";

#[derive(Deserialize)]
struct ChatLine {
    messages: Vec<Value>,
}

/// The corpus's documents, in order: the two texts, then the chat transcripts.
///
/// # Errors
/// A line of `chats.jsonl` that is not `{"messages": [...]}` (a broken fixture; named).
pub fn documents() -> anyhow::Result<Vec<Document>> {
    let mut out = vec![
        Document::Text {
            name: "public-domain".into(),
            text: PUBLIC_DOMAIN.to_string(),
        },
        Document::Text {
            name: "classics".into(),
            text: CLASSICS.to_string(),
        },
    ];
    for (i, line) in CHATS.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let c: ChatLine = serde_json::from_str(line).map_err(|e| {
            anyhow::anyhow!(
                "tests/fixtures/quality/corpus/chats.jsonl line {}: {e}",
                i + 1
            )
        })?;
        out.push(Document::Chat {
            name: format!("chat-{}", i + 1),
            messages: c.messages,
        });
    }
    Ok(out)
}

/// SHA-256 of the corpus's three files, concatenated in order (hex), so results made on
/// different corpora are never compared.
pub fn corpus_sha256() -> String {
    let mut all = Vec::new();
    for t in [PUBLIC_DOMAIN, CLASSICS, CHATS] {
        all.extend_from_slice(t.as_bytes());
    }
    crate::gpu::kernel_cache::sha256_hex(&all)
}

/// `text` cut at a word boundary to about `tokens` tokens (4 characters a token, English
/// prose's usual ratio), or whole when it is shorter: the `--limit` of a quick run.
pub fn cut_text(text: &str, tokens: usize) -> &str {
    let chars = tokens.saturating_mul(4);
    if text.len() <= chars {
        return text;
    }
    let mut end = chars;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    match text[..end].rfind(char::is_whitespace) {
        Some(i) if i > 0 => &text[..i],
        _ => &text[..end],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_corpus_has_its_texts_and_chats() {
        let d = documents().unwrap();
        assert_eq!(d.len(), 10);
        assert!(matches!(&d[2], Document::Chat { messages, .. } if messages.len() == 2));
        assert_eq!(corpus_sha256().len(), 64);
        assert_eq!(cut_text("one two three four", 2), "one two");
        assert_eq!(cut_text("short", 100), "short");
    }
}
