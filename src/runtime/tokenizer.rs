//! Tokenizers: a checkpoint's `tokenizer.json` through the Hugging Face `tokenizers` crate, or a
//! byte-level tokenizer with the special tokens the chat template needs; and the incremental
//! detokenizer that turns a growing list of ids into text deltas without splitting UTF-8.

use std::path::Path;

use crate::RigError;

/// The byte-level tokenizer: ids 0..=255 are the bytes, then five special tokens; ids from 261
/// up to the model's vocabulary decode to filler words (`" a"`, `" b"`, ..., `" aa"`, ...) so
/// that a synthetic model with a large vocabulary still produces visible text. Filler words are
/// not produced by [`ByteTokenizer::encode`], so `encode(decode(ids))` is the identity only for
/// ids below 261.
#[derive(Debug, Clone)]
pub struct ByteTokenizer {
    vocab_size: usize,
}

impl ByteTokenizer {
    /// `<|endoftext|>` (special; an EOS).
    pub const ENDOFTEXT: u32 = crate::model::config::BYTE_TOKENIZER_ENDOFTEXT;
    /// `<|im_start|>` (special).
    pub const IM_START: u32 = 257;
    /// `<|im_end|>` (special; ends a chat turn, an EOS).
    pub const IM_END: u32 = 258;
    /// `<think>` (not special: visible when not split out as reasoning).
    pub const THINK: u32 = 259;
    /// `</think>`.
    pub const THINK_END: u32 = 260;
    /// The special token strings, in id order from 256.
    pub const SPECIALS: [&'static str; 5] = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<think>",
        "</think>",
    ];
    /// Smallest vocabulary the byte tokenizer needs.
    pub const MIN_VOCAB: usize = 261;

    /// A byte tokenizer for a model with `vocab_size` rows.
    ///
    /// # Errors
    /// When `vocab_size` is below [`Self::MIN_VOCAB`].
    pub fn new(vocab_size: usize) -> anyhow::Result<Self> {
        if vocab_size < Self::MIN_VOCAB {
            anyhow::bail!(
                "vocab_size {vocab_size} is below {} (256 bytes + 5 special tokens) needed by the byte-level tokenizer",
                Self::MIN_VOCAB
            );
        }
        Ok(ByteTokenizer { vocab_size })
    }

    /// Whether `id` is a special token skipped by `decode(.., skip_special_tokens = true)`.
    pub fn is_special(id: u32) -> bool {
        matches!(id, Self::ENDOFTEXT | Self::IM_START | Self::IM_END)
    }

    /// Encode: special token strings become their ids, everything else its UTF-8 bytes.
    /// One pass over `text`: linear in its length (see [`Self::encode_counted`]).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.encode_counted(text).0
    }

    /// [`Self::encode`] and the number of steps it took (bytes visited plus special-token
    /// comparisons, at most `6 × text.len()`): what the tests of its linear cost count. (It
    /// searched the rest of the text for every special token after each one it found, which
    /// was quadratic in the number of chat turns: 20,000 messages took 17 s.)
    pub fn encode_counted(&self, text: &str) -> (Vec<u32>, usize) {
        let bytes = text.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut steps = 0usize;
        let mut i = 0;
        // No special token is a prefix of another, so at most one matches at a position.
        'outer: while i < bytes.len() {
            steps += 1;
            if bytes[i] == b'<' {
                for (k, sp) in Self::SPECIALS.iter().enumerate() {
                    steps += 1;
                    if bytes[i..].starts_with(sp.as_bytes()) {
                        out.push(256 + k as u32);
                        i += sp.len();
                        continue 'outer;
                    }
                }
            }
            out.push(u32::from(bytes[i]));
            i += 1;
        }
        (out, steps)
    }

    /// Decode to text (invalid UTF-8 becomes U+FFFD).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len());
        for &id in ids {
            match id {
                0..=255 => bytes.push(id as u8),
                256..=260 => {
                    if !(skip_special_tokens && Self::is_special(id)) {
                        bytes.extend_from_slice(Self::SPECIALS[(id - 256) as usize].as_bytes());
                    }
                }
                _ => {
                    bytes.push(b' ');
                    let mut n = (id - 261) as usize;
                    let mut word = Vec::new();
                    loop {
                        word.push(b'a' + (n % 26) as u8);
                        n /= 26;
                        if n == 0 {
                            break;
                        }
                        n -= 1;
                    }
                    word.reverse();
                    bytes.extend_from_slice(&word);
                }
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The vocabulary size it was built for.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

/// Which tokenizer.
#[derive(Debug, Clone)]
enum Kind {
    Hf(Box<tokenizers::Tokenizer>),
    Bytes(ByteTokenizer),
}

/// A tokenizer with the special-token facts the server needs.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    kind: Kind,
    /// Ids that end generation unless `ignore_eos` (EOS of config.json, generation_config.json
    /// and tokenizer_config.json, plus `<|im_end|>` and `<|endoftext|>` where they exist).
    pub eos_ids: Vec<u32>,
    /// `<think>` id, if the vocabulary has it.
    pub think_start: Option<u32>,
    /// `</think>` id, if the vocabulary has it.
    pub think_end: Option<u32>,
    /// `bos_token` text for chat templates.
    pub bos_token: Option<String>,
    /// `eos_token` text for chat templates.
    pub eos_token: Option<String>,
    /// `"tokenizer.json"` or `"byte-level"`.
    pub source: String,
}

impl Tokenizer {
    /// The byte-level tokenizer for a model with `vocab_size` rows.
    ///
    /// # Errors
    /// When `vocab_size` is below [`ByteTokenizer::MIN_VOCAB`].
    pub fn bytes(vocab_size: usize, extra_eos: &[u32]) -> anyhow::Result<Self> {
        let mut eos_ids = vec![ByteTokenizer::IM_END, ByteTokenizer::ENDOFTEXT];
        for e in extra_eos {
            if !eos_ids.contains(e) && (*e as usize) < vocab_size {
                eos_ids.push(*e);
            }
        }
        Ok(Tokenizer {
            kind: Kind::Bytes(ByteTokenizer::new(vocab_size)?),
            eos_ids,
            think_start: Some(ByteTokenizer::THINK),
            think_end: Some(ByteTokenizer::THINK_END),
            bos_token: None,
            eos_token: Some("<|im_end|>".into()),
            source: "byte-level".into(),
        })
    }

    /// Load `tokenizer.json` (and `tokenizer_config.json`'s bos/eos tokens when present) from a
    /// checkpoint directory; `extra_eos` adds the EOS ids of config.json/generation_config.json.
    ///
    /// # Errors
    /// [`RigError::BadFile`] naming the file when it cannot be read or parsed.
    pub fn from_dir(dir: &Path, extra_eos: &[u32]) -> anyhow::Result<Self> {
        let path = dir.join("tokenizer.json");
        let hf = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| RigError::file(&path, format!("cannot load the tokenizer: {e}")))?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Option<serde_json::Value> = if cfg_path.is_file() {
            let text = std::fs::read_to_string(&cfg_path)
                .map_err(|e| RigError::file(&cfg_path, format!("cannot read: {e}")))?;
            Some(
                serde_json::from_str(&text)
                    .map_err(|e| RigError::file(&cfg_path, format!("not valid JSON: {e}")))?,
            )
        } else {
            None
        };
        let token_text = |key: &str| -> Option<String> {
            let v = cfg.as_ref()?.get(key)?;
            match v {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
                _ => None,
            }
        };
        let bos_token = token_text("bos_token");
        let eos_token = token_text("eos_token");
        let mut eos_ids: Vec<u32> = Vec::new();
        let mut add = |id: Option<u32>| {
            if let Some(id) = id {
                if !eos_ids.contains(&id) {
                    eos_ids.push(id);
                }
            }
        };
        for e in extra_eos {
            add(Some(*e));
        }
        add(eos_token.as_deref().and_then(|t| hf.token_to_id(t)));
        add(hf.token_to_id("<|im_end|>"));
        add(hf.token_to_id("<|endoftext|>"));
        Ok(Tokenizer {
            think_start: hf.token_to_id("<think>"),
            think_end: hf.token_to_id("</think>"),
            kind: Kind::Hf(Box::new(hf)),
            eos_ids,
            bos_token,
            eos_token,
            source: "tokenizer.json".into(),
        })
    }

    /// Wrap a `tokenizers` tokenizer built elsewhere (a GGUF file's vocabulary: see
    /// `crate::runtime::gguf_tokenizer`). `eos_ids` end generation; `<|im_end|>` and
    /// `<|endoftext|>` are added when the vocabulary has them, as [`Tokenizer::from_dir`] does.
    pub fn from_hf(
        hf: tokenizers::Tokenizer,
        eos_ids: &[u32],
        bos_token: Option<String>,
        eos_token: Option<String>,
        source: String,
    ) -> Self {
        let mut ids: Vec<u32> = Vec::new();
        for id in eos_ids
            .iter()
            .copied()
            .chain(hf.token_to_id("<|im_end|>"))
            .chain(hf.token_to_id("<|endoftext|>"))
        {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        Tokenizer {
            think_start: hf.token_to_id("<think>"),
            think_end: hf.token_to_id("</think>"),
            kind: Kind::Hf(Box::new(hf)),
            eos_ids: ids,
            bos_token,
            eos_token,
            source,
        }
    }

    /// Encode text. `add_special_tokens` applies the tokenizer's post-processor (e.g. a BOS);
    /// special token strings in the text become their ids either way.
    ///
    /// # Errors
    /// When the Hugging Face tokenizer fails.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> anyhow::Result<Vec<u32>> {
        match &self.kind {
            Kind::Bytes(b) => Ok(b.encode(text)),
            Kind::Hf(t) => Ok(t
                .encode(text, add_special_tokens)
                .map_err(|e| anyhow::anyhow!("tokenizer failed: {e}"))?
                .get_ids()
                .to_vec()),
        }
    }

    /// Decode ids to text; ids outside the vocabulary are skipped.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        match &self.kind {
            Kind::Bytes(b) => b.decode(ids, skip_special_tokens),
            Kind::Hf(t) => t.decode(ids, skip_special_tokens).unwrap_or_else(|_| {
                // An out-of-range id makes the whole call fail: decode the valid ones.
                let n = t.get_vocab_size(true) as u32;
                let ok: Vec<u32> = ids.iter().copied().filter(|i| *i < n).collect();
                t.decode(&ok, skip_special_tokens).unwrap_or_default()
            }),
        }
    }

    /// Ids a request with `ignore_eos` must never produce: special tokens (EOS and the other
    /// control tokens, `<think>`/`</think>`) and tokens that decode to no visible text. For the
    /// byte-level tokenizer that is also every byte that is not printable ASCII or whitespace
    /// (bytes ≥ 0x80 alone are not UTF-8), so synthetic weights always yield visible text; for a
    /// `tokenizer.json`, the added tokens marked special and the ids that decode to nothing
    /// (multi-byte pieces stay allowed: real text needs them).
    pub fn suppressed_under_ignore_eos(&self) -> Vec<u32> {
        let mut out: Vec<u32> = match &self.kind {
            Kind::Bytes(b) => (0..b.vocab_size() as u32)
                .filter(|&id| match id {
                    0..=255 => {
                        let c = id as u8;
                        !(c.is_ascii_graphic() || c == b' ' || c == b'\n' || c == b'\t')
                    }
                    256..=260 => true,
                    _ => false,
                })
                .collect(),
            Kind::Hf(t) => {
                let mut ids: Vec<u32> = t
                    .get_added_tokens_decoder()
                    .iter()
                    .filter(|(_, tok)| tok.special)
                    .map(|(id, _)| *id)
                    .collect();
                for id in 0..t.get_vocab_size(true) as u32 {
                    if t.decode(&[id], true).map(|s| s.is_empty()).unwrap_or(true) {
                        ids.push(id);
                    }
                }
                ids
            }
        };
        out.extend(self.eos_ids.iter().copied());
        out.extend(self.think_start);
        out.extend(self.think_end);
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Ids the tokenizer knows (with added tokens).
    pub fn vocab_size(&self) -> usize {
        match &self.kind {
            Kind::Bytes(b) => b.vocab_size(),
            Kind::Hf(t) => t.get_vocab_size(true),
        }
    }

    /// The id of a token string, if it is one token.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.kind {
            Kind::Bytes(_) => ByteTokenizer::SPECIALS
                .iter()
                .position(|s| *s == token)
                .map(|i| 256 + i as u32)
                .or_else(|| (token.len() == 1).then(|| token.as_bytes()[0] as u32)),
            Kind::Hf(t) => t.token_to_id(token),
        }
    }
}

/// Incremental detokenization as vLLM does it (`detokenize_incrementally`): decode a window
/// `ids[prefix_offset..]` and emit what it adds over `ids[prefix_offset..read_offset]`, holding
/// the text back while it ends in U+FFFD (an incomplete UTF-8 sequence).
#[derive(Debug, Clone, Default)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDecoder {
    /// A decoder with no ids yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add one id; returns the new text (possibly empty).
    pub fn step(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.ids.push(id);
        self.emit(tok, false)
    }

    /// Everything still held back (an incomplete UTF-8 tail is emitted as U+FFFD).
    pub fn flush(&mut self, tok: &Tokenizer) -> String {
        self.emit(tok, true)
    }

    fn emit(&mut self, tok: &Tokenizer, force: bool) -> String {
        if self.read_offset >= self.ids.len() {
            return String::new();
        }
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], true);
        let full = tok.decode(&self.ids[self.prefix_offset..], true);
        if full.len() > prefix.len() && (force || !full.ends_with('\u{FFFD}')) {
            let delta = match full.strip_prefix(&prefix) {
                Some(d) => d.to_string(),
                None => full.get(prefix.len()..).unwrap_or_default().to_string(),
            };
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            delta
        } else {
            if force {
                self.read_offset = self.ids.len();
            }
            String::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The earlier search (earliest special token, lowest id on a tie), kept as the reference.
    fn encode_reference(text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let next = ByteTokenizer::SPECIALS
                .iter()
                .enumerate()
                .filter_map(|(i, s)| rest.find(s).map(|p| (p, i, s.len())))
                .min_by_key(|(p, i, _)| (*p, *i));
            match next {
                Some((p, i, len)) => {
                    out.extend(rest[..p].bytes().map(u32::from));
                    out.push(256 + i as u32);
                    rest = &rest[p + len..];
                }
                None => {
                    out.extend(rest.bytes().map(u32::from));
                    break;
                }
            }
        }
        out
    }

    #[test]
    fn byte_encoding_is_linear_in_chat_turns() {
        use crate::runtime::template::ChatTemplate;
        let b = ByteTokenizer::new(ByteTokenizer::MIN_VOCAB).unwrap();
        for text in [
            "",
            "<",
            "<<|im_end|>",
            "<|im_end",
            "a</think><think><|endoftext|>é<|im_start|>x<|im_end|><",
            "<thin<think>",
        ] {
            assert_eq!(b.encode(text), encode_reference(text), "{text:?}");
        }
        let t = ChatTemplate::builtin();
        let chat = |n: usize| -> (usize, usize) {
            let msgs: Vec<serde_json::Value> = (0..n)
                .map(|i| {
                    serde_json::json!({
                        "role": if i % 2 == 0 { "user" } else { "assistant" },
                        "content": format!("turn {i}: <b>hello</b>")
                    })
                })
                .collect();
            let text = t.render(&msgs, true, &serde_json::Map::new()).unwrap();
            let (ids, steps) = b.encode_counted(&text);
            if n <= 200 {
                assert_eq!(ids, encode_reference(&text));
            }
            assert!(
                steps <= 6 * text.len(),
                "{steps} steps for {} bytes",
                text.len()
            );
            (text.len(), steps)
        };
        chat(200);
        let (len5, steps5) = chat(5_000);
        let (len20, steps20) = chat(20_000);
        // 4× the messages: about 4× the bytes and 4× the steps (a quadratic search: about 16×).
        let bytes_ratio = len20 as f64 / len5 as f64;
        let steps_ratio = steps20 as f64 / steps5 as f64;
        eprintln!(
            "5,000 messages: {len5} bytes, {steps5} steps; 20,000: {len20} bytes, {steps20} steps"
        );
        assert!(
            (3.9..4.2).contains(&bytes_ratio) && steps_ratio < bytes_ratio * 1.05,
            "bytes ×{bytes_ratio:.2}, steps ×{steps_ratio:.2}"
        );
    }

    #[test]
    fn byte_tokenizer_round_trip_and_specials() {
        let t = Tokenizer::bytes(320, &[]).unwrap();
        let text = "<|im_start|>user\nhé 😀<|im_end|>\n<think>\n</think>";
        let ids = t.encode(text, true).unwrap();
        assert_eq!(ids[0], ByteTokenizer::IM_START);
        assert!(ids.contains(&ByteTokenizer::IM_END));
        assert!(ids.contains(&ByteTokenizer::THINK) && ids.contains(&ByteTokenizer::THINK_END));
        assert_eq!(t.decode(&ids, false), text);
        assert_eq!(t.decode(&ids, true), "user\nhé 😀\n<think>\n</think>");
        assert_eq!(t.decode(&[261, 262, 261 + 26], true), " a b aa");
        assert_eq!(t.token_to_id("<think>"), Some(259));
        assert!(Tokenizer::bytes(100, &[]).is_err());
    }

    #[test]
    fn incremental_decoder_holds_split_utf8() {
        let t = Tokenizer::bytes(320, &[]).unwrap();
        let ids = t.encode("a😀b", true).unwrap();
        assert_eq!(ids.len(), 6);
        let mut d = IncrementalDecoder::new();
        let deltas: Vec<String> = ids.iter().map(|i| d.step(&t, *i)).collect();
        assert_eq!(deltas, vec!["a", "", "", "", "😀", "b"]);
        // A lone invalid byte at the end is released on flush.
        let mut d = IncrementalDecoder::new();
        assert_eq!(d.step(&t, 0xF0), "");
        assert_eq!(d.flush(&t), "\u{FFFD}");
        assert_eq!(d.flush(&t), "");
        // Special tokens are skipped.
        let mut d = IncrementalDecoder::new();
        assert_eq!(d.step(&t, ByteTokenizer::IM_END), "");
        assert_eq!(d.step(&t, b'x' as u32), "x");
    }

    #[test]
    fn hf_tokenizer_from_dir_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        // A minimal word-level tokenizer.json.
        let tj = r#"{"version":"1.0","truncation":null,"padding":null,
          "added_tokens":[{"id":3,"content":"<|im_end|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
                          {"id":4,"content":"<think>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":false}],
          "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
          "model":{"type":"WordLevel","vocab":{"hello":0,"world":1,"[UNK]":2,"<|im_end|>":3,"<think>":4},"unk_token":"[UNK]"}}"#;
        std::fs::write(dir.path().join("tokenizer.json"), tj).unwrap();
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"eos_token":{"content":"<|im_end|>"}}"#,
        )
        .unwrap();
        let t = Tokenizer::from_dir(dir.path(), &[7]).unwrap();
        assert_eq!(
            t.encode("hello world<|im_end|>", false).unwrap(),
            vec![0, 1, 3]
        );
        assert_eq!(t.eos_ids, vec![7, 3]);
        assert_eq!(t.think_start, Some(4));
        assert_eq!(t.think_end, None);
        assert_eq!(t.eos_token.as_deref(), Some("<|im_end|>"));
        std::fs::write(dir.path().join("tokenizer.json"), "{").unwrap();
        let e = Tokenizer::from_dir(dir.path(), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("tokenizer.json"), "{e}");
    }
}
