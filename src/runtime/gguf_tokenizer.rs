//! A Hugging Face `tokenizers` tokenizer built from a GGUF file's metadata
//! (`tokenizer.ggml.*`), so that a GGUF checkpoint is served with its own vocabulary.
//!
//! Two vocabularies, as llama.cpp reads them (`src/llama-vocab.cpp`):
//! - `tokenizer.ggml.model = "gpt2"`: byte-level BPE from `tokens` and `merges`; the text is cut
//!   into words by the regular expressions llama.cpp picks for `tokenizer.ggml.pre` (see
//!   [`pre_split_regexes`]), then byte-level encoded; no normalizer.
//! - `tokenizer.ggml.model = "llama"`: SentencePiece BPE from `tokens` and `scores` (merges
//!   recovered from the scores, as transformers' `generate_merges` does), spaces written `▁`
//!   with a leading `▁` unless `tokenizer.ggml.add_space_prefix` is false, byte fallback to
//!   the `<0xNN>` tokens.
//!
//! Tokens typed CONTROL (3) in `tokenizer.ggml.token_type` become special added tokens (matched
//! whole in text, skipped when decoding with `skip_special_tokens`), USER_DEFINED (4) plain
//! added tokens. A BOS is prepended when `tokenizer.ggml.add_bos_token` is true (default true for
//! `llama`, false for `gpt2`, as llama.cpp).

use serde_json::{json, Value};

use crate::checkpoint::gguf::{Array, Gguf};

/// GPT-2's word split (`tokenizers`' ByteLevel pre-tokenizer with `use_regex`).
pub const GPT2_SPLIT: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama 3's word split (llama.cpp `LLAMA_VOCAB_PRE_TYPE_LLAMA3`).
pub const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's word split (llama.cpp `LLAMA_VOCAB_PRE_TYPE_QWEN2`).
pub const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The regular expressions llama.cpp applies, in order, for a `tokenizer.ggml.pre` value
/// (`llama_vocab::impl::load`, `llm_tokenizer_bpe`); `None` for values rigbench does not know.
pub fn pre_split_regexes(pre: &str) -> Option<Vec<&'static str>> {
    Some(match pre {
        "default" | "gpt-2" | "gpt2" | "phi-2" | "jina-es" | "jina-de" | "jina-v1-en"
        | "jina-v2-es" | "jina-v2-de" | "jina-v2-code" | "roberta-bpe" => vec![GPT2_SPLIT],
        // Digits one by one, then GPT-2's split.
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
            vec![r"\p{N}", GPT2_SPLIT]
        }
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" | "dbrx" | "smaug-bpe" => {
            vec![LLAMA3_SPLIT]
        }
        "qwen2" | "deepseek-r1-qwen" | "megrez" => vec![QWEN2_SPLIT],
        _ => return None,
    })
}

fn strs<'a>(g: &'a Gguf, key: &str) -> anyhow::Result<Option<&'a [String]>> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => match v.as_array() {
            Some(Array::Str(s)) => Ok(Some(s.as_slice())),
            _ => anyhow::bail!("{key} is {}, expected array[string]", v.type_name()),
        },
    }
}

/// What [`build`] returns besides the tokenizer.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`.
    pub model: String,
    /// `tokenizer.ggml.pre`, when present.
    pub pre: Option<String>,
    /// BOS token text and id.
    pub bos: Option<(String, u32)>,
    /// EOS token text and id.
    pub eos: Option<(String, u32)>,
    /// Other ids that end a turn (`eot_token_id`, `eom_token_id`).
    pub extra_eos: Vec<u32>,
    /// Whether a BOS is prepended.
    pub add_bos: bool,
}

/// Build the tokenizer of `g` (see the module docs).
///
/// # Errors
/// A missing or mistyped `tokenizer.ggml.*` field, an unknown `tokenizer.ggml.model` or
/// `tokenizer.ggml.pre` (named, with the supported ones), or a vocabulary `tokenizers` refuses.
pub fn build(g: &Gguf) -> anyhow::Result<(tokenizers::Tokenizer, GgufVocab)> {
    let model = g
        .get("tokenizer.ggml.model")
        .and_then(|v| v.as_str())
        .ok_or_else(|| anyhow::anyhow!("no tokenizer.ggml.model: the file has no tokenizer"))?
        .to_string();
    let tokens = strs(g, "tokenizer.ggml.tokens")?
        .ok_or_else(|| anyhow::anyhow!("no tokenizer.ggml.tokens"))?;
    let types: Vec<i64> = match g.get("tokenizer.ggml.token_type") {
        None => vec![1; tokens.len()],
        Some(v) => v.as_array().and_then(Array::as_i64s).ok_or_else(|| {
            anyhow::anyhow!(
                "tokenizer.ggml.token_type is {}, expected an integer array",
                v.type_name()
            )
        })?,
    };
    anyhow::ensure!(
        types.len() == tokens.len(),
        "tokenizer.ggml.token_type has {} entries for {} tokens",
        types.len(),
        tokens.len()
    );
    let id_of = |key: &str| -> Option<u32> {
        g.get(key)
            .and_then(|v| v.as_u64())
            .filter(|i| (*i as usize) < tokens.len())
            .map(|i| i as u32)
    };
    let named = |id: Option<u32>| id.map(|i| (tokens[i as usize].clone(), i));
    let bos = named(id_of("tokenizer.ggml.bos_token_id"));
    let eos = named(id_of("tokenizer.ggml.eos_token_id"));
    let unk = id_of("tokenizer.ggml.unknown_token_id");
    let extra_eos: Vec<u32> = ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"]
        .iter()
        .filter_map(|k| id_of(k))
        .collect();
    let add_bos = g
        .get("tokenizer.ggml.add_bos_token")
        .and_then(|v| v.as_bool())
        .unwrap_or(model == "llama");
    let pre = g
        .get("tokenizer.ggml.pre")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    let mut added = Vec::new();
    for (i, (t, ty)) in tokens.iter().zip(&types).enumerate() {
        if *ty == 3 || *ty == 4 {
            added.push(
                json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": *ty == 3}),
            );
        }
    }
    let post = match (&bos, add_bos) {
        (Some((t, id)), true) => json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": t, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": t, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": t, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {t.as_str(): {"id": t, "ids": [id], "tokens": [t]}}
        }),
        _ => Value::Null,
    };
    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        // A duplicate spelling keeps its first id (llama.cpp's token_to_id map does the same).
        vocab.entry(t.clone()).or_insert(json!(i));
    }
    let tj = match model.as_str() {
        "gpt2" => {
            gpt2_json(g, pre.as_deref(), added, post, vocab)?
        }
        "llama" => {
            llama_json(g, tokens, unk, added, post, vocab)?
        }
        other => anyhow::bail!(
            "tokenizer.ggml.model = '{other}' is not supported (rigbench builds gpt2 byte-level BPE and llama SentencePiece tokenizers)"
        ),
    };
    let text = serde_json::to_string(&tj)?;
    let tok: tokenizers::Tokenizer = text
        .parse()
        .map_err(|e| anyhow::anyhow!("the vocabulary does not make a tokenizer: {e}"))?;
    Ok((
        tok,
        GgufVocab {
            model,
            pre,
            bos,
            eos,
            extra_eos,
            add_bos,
        },
    ))
}

/// The `tokenizers` JSON of a gpt2 byte-level BPE vocabulary: `tokenizer.ggml.merges`, and the
/// pre-tokenizer regexes of `tokenizer.ggml.pre`.
fn gpt2_json(
    g: &Gguf,
    pre: Option<&str>,
    added: Vec<Value>,
    post: Value,
    vocab: serde_json::Map<String, Value>,
) -> anyhow::Result<Value> {
    let merges = strs(g, "tokenizer.ggml.merges")?.ok_or_else(|| {
        anyhow::anyhow!("tokenizer.ggml.model is gpt2 but there is no tokenizer.ggml.merges")
    })?;
    let pairs: Vec<Value> = merges
        .iter()
        .map(|m| match m.split_once(' ') {
            Some((a, b)) => Ok(json!([a, b])),
            None => Err(anyhow::anyhow!(
                "merge '{m}' has no space between its two parts"
            )),
        })
        .collect::<anyhow::Result<_>>()?;
    let pre_name = pre.map_or_else(|| "default".to_string(), str::to_string);
    let splits = pre_split_regexes(&pre_name).ok_or_else(|| {
        anyhow::anyhow!(
            "tokenizer.ggml.pre = '{pre_name}' is not known to rigbench (it knows default, gpt-2, smollm, starcoder, refact, command-r, llama3, llama-bpe, dbrx, smaug-bpe, qwen2, deepseek-r1-qwen, ...); without it the text would be split into words wrongly"
        )
    })?;
    let mut pretok: Vec<Value> = splits
        .iter()
        .map(|r| json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false}))
        .collect();
    pretok.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}));
    Ok(json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pretok},
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": pairs}
    }))
}

/// The `tokenizers` JSON of a llama SentencePiece vocabulary: merges recovered from
/// `tokenizer.ggml.scores`, the space-prefix normalizer and byte-fallback decoder.
fn llama_json(
    g: &Gguf,
    tokens: &[String],
    unk: Option<u32>,
    added: Vec<Value>,
    post: Value,
    vocab: serde_json::Map<String, Value>,
) -> anyhow::Result<Value> {
    let scores: Vec<f32> = match g.get("tokenizer.ggml.scores") {
        Some(v) => v.as_array().and_then(Array::as_f32s).ok_or_else(|| {
            anyhow::anyhow!(
                "tokenizer.ggml.scores is {}, expected array[float32]",
                v.type_name()
            )
        })?,
        None => {
            anyhow::bail!("tokenizer.ggml.model is llama but there is no tokenizer.ggml.scores")
        }
    };
    anyhow::ensure!(
        scores.len() == tokens.len(),
        "tokenizer.ggml.scores has {} entries for {} tokens",
        scores.len(),
        tokens.len()
    );
    let pairs = spm_merges(tokens, &scores);
    let space_prefix = g
        .get("tokenizer.ggml.add_space_prefix")
        .and_then(|v| v.as_bool())
        .unwrap_or(true);
    let mut norms = Vec::new();
    if space_prefix {
        norms.push(json!({"type": "Prepend", "prepend": "\u{2581}"}));
    }
    norms.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}));
    let mut decs = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if space_prefix {
        decs.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    Ok(json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": norms},
        "pre_tokenizer": null,
        "post_processor": post,
        "decoder": {"type": "Sequence", "decoders": decs},
        "model": {"type": "BPE", "dropout": null,
                  "unk_token": unk.map(|u| tokens[u as usize].clone()),
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": pairs}
    }))
}

/// SentencePiece merges recovered from the vocabulary and scores (transformers'
/// `generate_merges`): every split of a piece into two pieces of the vocabulary, ranked by the
/// merged piece's score, best first.
fn spm_merges(tokens: &[String], scores: &[f32]) -> Vec<Value> {
    let index: std::collections::HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .rev()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut merges: Vec<(f32, usize, usize, usize, usize)> = Vec::new();
    for (t, s) in tokens.iter().zip(scores) {
        let mut local = Vec::new();
        for (i, _) in t.char_indices().skip(1) {
            let (l, r) = (&t[..i], &t[i..]);
            if let (Some(&a), Some(&b)) = (index.get(l), index.get(r)) {
                local.push((a, b, l.chars().count(), r.chars().count()));
            }
        }
        local.sort_by_key(|(a, b, _, _)| (*a, *b));
        merges.extend(local.into_iter().map(|(a, b, la, lb)| (*s, la, lb, a, b)));
    }
    // Best score first; ties as Python's stable reverse sort of (score, len(l), len(r)).
    merges.sort_by(|x, y| y.0.total_cmp(&x.0).then(y.1.cmp(&x.1)).then(y.2.cmp(&x.2)));
    merges
        .into_iter()
        .map(|(_, _, _, a, b)| json!([tokens[a], tokens[b]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::gguf::tests::Writer;
    use crate::formats::ggml::GgmlType;

    fn open(w: &Writer) -> (tempfile::TempDir, Gguf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.gguf");
        std::fs::write(&p, w.bytes()).unwrap();
        let g = Gguf::open(&p).unwrap();
        (dir, g)
    }

    #[test]
    fn gpt2_vocab_with_digits_split_and_control_tokens() {
        // Byte-level spellings: 'Ġ' is the space.
        let toks = [
            "<|im_end|>",
            "a",
            "b",
            "Ġ",
            "1",
            "2",
            "ab",
            "Ġab",
            "12",
            "<think>",
        ];
        let mut w = Writer::new();
        w.str("tokenizer.ggml.model", "gpt2")
            .str("tokenizer.ggml.pre", "smollm")
            .strs("tokenizer.ggml.tokens", &toks)
            .i32s("tokenizer.ggml.token_type", &[3, 1, 1, 1, 1, 1, 1, 1, 1, 4])
            .strs("tokenizer.ggml.merges", &["a b", "Ġ ab", "1 2"])
            .u32("tokenizer.ggml.eos_token_id", 0);
        w.tensor("x", &[1], GgmlType::F32, vec![0; 4]);
        let (_d, g) = open(&w);
        let (t, v) = build(&g).unwrap();
        let ids = t
            .encode("ab ab12<|im_end|><think>", false)
            .unwrap()
            .get_ids()
            .to_vec();
        // "12" stays two tokens: llama.cpp's smollm split isolates every digit.
        assert_eq!(ids, vec![6, 7, 4, 5, 0, 9]);
        assert_eq!(t.decode(&ids, true).unwrap(), "ab ab12<think>");
        assert_eq!(v.eos, Some(("<|im_end|>".into(), 0)));
        assert!(!v.add_bos);
        // The default split merges the digits.
        let mut w2 = Writer::new();
        w2.kv = w.kv.clone();
        w2.kv[1] = (
            "tokenizer.ggml.pre".into(),
            8,
            crate::checkpoint::gguf::tests::s("default"),
        );
        w2.tensor("x", &[1], GgmlType::F32, vec![0; 4]);
        let (_d2, g2) = open(&w2);
        let (t2, _) = build(&g2).unwrap();
        assert_eq!(t2.encode("12", false).unwrap().get_ids(), &[8]);
        // An unknown pre-tokenizer is refused by name.
        let mut w3 = Writer::new();
        w3.kv = w.kv.clone();
        w3.kv[1] = (
            "tokenizer.ggml.pre".into(),
            8,
            crate::checkpoint::gguf::tests::s("martian"),
        );
        let (_d3, g3) = open(&w3);
        let e = build(&g3).unwrap_err().to_string();
        assert!(e.contains("martian"), "{e}");
    }

    #[test]
    fn sentencepiece_vocab_with_scores_bos_and_byte_fallback() {
        let toks = [
            "<unk>",
            "<s>",
            "</s>",
            "<0x0A>",
            "\u{2581}",
            "h",
            "i",
            "\u{2581}h",
            "\u{2581}hi",
        ];
        let mut w = Writer::new();
        w.str("tokenizer.ggml.model", "llama")
            .strs("tokenizer.ggml.tokens", &toks)
            .f32s(
                "tokenizer.ggml.scores",
                &[0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0],
            )
            .i32s("tokenizer.ggml.token_type", &[2, 3, 3, 6, 1, 1, 1, 1, 1])
            .u32("tokenizer.ggml.bos_token_id", 1)
            .u32("tokenizer.ggml.eos_token_id", 2)
            .u32("tokenizer.ggml.unknown_token_id", 0);
        let (_d, g) = open(&w);
        let (t, v) = build(&g).unwrap();
        assert!(v.add_bos);
        let ids = t.encode("hi\nhi", true).unwrap().get_ids().to_vec();
        // BOS, "▁hi", the newline by byte fallback, "h", "i".
        assert_eq!(ids, vec![1, 8, 3, 5, 6]);
        assert_eq!(t.decode(&ids, true).unwrap(), "hi\nhi");
    }
}
