//! Model facts from a Hugging Face `config.json`: dimensions, layer types of hybrid models,
//! MTP layers and the nested `text_config` of multimodal wrappers.
//!
//! Field names follow Hugging Face `transformers` configs (`LlamaConfig`, `Qwen3MoeConfig`,
//! `Qwen3NextConfig`, `Qwen3_5MoeConfig` with `text_config`/`vision_config`, DeepSeek V3/V4).

use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::RigError;

/// Gated-DeltaNet (linear attention) dimensions of hybrid models (Qwen3-Next, Qwen3.5/3.6).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LinearAttentionFacts {
    /// `linear_num_key_heads`.
    pub num_key_heads: Option<u64>,
    /// `linear_num_value_heads`.
    pub num_value_heads: Option<u64>,
    /// `linear_key_head_dim`.
    pub key_head_dim: Option<u64>,
    /// `linear_value_head_dim`.
    pub value_head_dim: Option<u64>,
    /// `linear_conv_kernel_dim` (short causal convolution width).
    pub conv_kernel: Option<u64>,
    /// `mamba_ssm_dtype`: dtype of the recurrent state, when the config names it.
    pub ssm_dtype: Option<String>,
}

/// Vision tower dimensions (`vision_config`), used for the weight estimate only.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VisionFacts {
    /// Transformer blocks (`depth` or `num_hidden_layers`).
    pub depth: Option<u64>,
    /// `hidden_size`.
    pub hidden_size: Option<u64>,
    /// `intermediate_size`.
    pub intermediate_size: Option<u64>,
}

/// What `config.json` says about the model. Unknown stays `None`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelFacts {
    /// `architectures`.
    pub architectures: Vec<String>,
    /// Top-level `model_type`.
    pub model_type: Option<String>,
    /// `text_config.model_type` of multimodal wrappers.
    pub text_model_type: Option<String>,
    /// True when the language-model facts came from a nested `text_config`.
    pub from_text_config: bool,
    /// `num_hidden_layers` (decoder layers, MTP layers excluded).
    pub num_hidden_layers: Option<u64>,
    /// `hidden_size`.
    pub hidden_size: Option<u64>,
    /// `num_attention_heads`.
    pub num_attention_heads: Option<u64>,
    /// `num_key_value_heads` (equals the attention heads when the config omits it: MHA).
    pub num_key_value_heads: Option<u64>,
    /// `head_dim`, or `hidden_size / num_attention_heads` when absent (see `head_dim_derived`).
    pub head_dim: Option<u64>,
    /// True when `head_dim` was derived rather than read.
    pub head_dim_derived: bool,
    /// `intermediate_size` (dense MLP).
    pub intermediate_size: Option<u64>,
    /// `moe_intermediate_size` (per routed expert).
    pub moe_intermediate_size: Option<u64>,
    /// `shared_expert_intermediate_size`.
    pub shared_expert_intermediate_size: Option<u64>,
    /// Routed experts (`num_experts`, `n_routed_experts`, `num_local_experts`).
    pub num_experts: Option<u64>,
    /// Experts per token (`num_experts_per_tok`).
    pub num_experts_per_tok: Option<u64>,
    /// `vocab_size`.
    pub vocab_size: Option<u64>,
    /// `tie_word_embeddings` (lm_head shares the embedding matrix).
    pub tie_word_embeddings: Option<bool>,
    /// Model dtype (`torch_dtype` or `dtype`).
    pub dtype: Option<String>,
    /// `max_position_embeddings` (vLLM's default `max_model_len`).
    pub max_position_embeddings: Option<u64>,
    /// `attn_output_gate` (Qwen3.5/3.6: q_proj also produces an output gate, doubling its rows).
    pub attn_output_gate: Option<bool>,
    /// Per decoder layer: `full_attention`, `linear_attention`, `sliding_attention`, ...
    /// Empty when the config does not say (a plain decoder: all full attention).
    pub layer_types: Vec<String>,
    /// Where `layer_types` came from: `layer_types` or `full_attention_interval`.
    pub layer_types_source: Option<String>,
    /// Layers whose KV cache grows with every token: full attention (and every attention
    /// layer when the config has no `layer_types`). Sliding-window layers are counted apart
    /// when the config names them and states the window.
    pub full_attention_layers: Option<u64>,
    /// `layer_types` entries `sliding_attention` (gpt-oss, Gemma 2/3), counted apart from full
    /// attention when `sliding_window` states the window.
    #[serde(default)]
    pub sliding_attention_layers: u64,
    /// `sliding_window`: tokens a sliding-window layer keeps, when in use.
    #[serde(default)]
    pub sliding_window: Option<u64>,
    /// Gated-DeltaNet layers (fixed recurrent state per sequence).
    pub linear_attention_layers: u64,
    /// Gated-DeltaNet dimensions, for hybrid models.
    pub linear_attention: Option<LinearAttentionFacts>,
    /// MTP (multi-token prediction) draft layers, and the field that said so.
    pub mtp_layers: Option<u64>,
    /// `mtp_num_hidden_layers` or `num_nextn_predict_layers`.
    pub mtp_field: Option<String>,
    /// Vision tower, for multimodal wrappers.
    pub vision: Option<VisionFacts>,
    /// Attention fields the generic KV formula does not model (MLA ranks, sliding window,
    /// compression ratios), by name.
    pub attention_extras: Vec<String>,
}

impl ModelFacts {
    /// Why the dense KV formula (layers × 2 × KV heads × head_dim × dtype) does not describe
    /// this model's KV cache, or `None` when it does: latent attention (MLA, `kv_lora_rank`),
    /// compressed or indexed attention (`compress_ratios`, `index_topk`, DeepSeek-V4 style),
    /// or sliding windows (`sliding_window` in use). `q_lora_rank` alone changes only the query
    /// projection and leaves the KV as it is.
    pub fn kv_not_modelled(&self) -> Option<String> {
        let has = |k: &str| self.attention_extras.iter().any(|x| x == k);
        let mut why = Vec::new();
        if has("kv_lora_rank") {
            why.push("latent attention (MLA, kv_lora_rank): the cache holds a compressed latent per token, not K and V per head");
        }
        if has("compress_ratios") {
            why.push("compressed attention (compress_ratios): layers keep one KV entry per several tokens");
        }
        if has("index_topk") {
            why.push("indexed sparse attention (index_topk): an indexer keeps its own cache");
        }
        if has("sliding_window") && !self.sliding_modelled() {
            why.push("sliding-window attention (sliding_window) without a layer_types list saying which layers use it: those layers keep only the last window of tokens");
        }
        (!why.is_empty()).then(|| {
            format!(
                "{}; config.json holds {}: the dense per-token formula does not apply, so no per-token figure is given (the engine's startup log states the real capacity)",
                why.join("; "),
                self.attention_extras.join(", ")
            )
        })
    }

    /// Whether sliding-window layers are counted apart (the config names them in `layer_types`
    /// and states `sliding_window`).
    pub fn sliding_modelled(&self) -> bool {
        self.sliding_attention_layers > 0 && self.sliding_window.is_some()
    }

    /// Layer `i`'s type, `full_attention` when the config has no per-layer types.
    pub fn layer_type(&self, i: u64) -> &str {
        self.layer_types
            .get(i as usize)
            .map(String::as_str)
            .unwrap_or("full_attention")
    }

    /// True for a hybrid model with Gated-DeltaNet layers.
    pub fn is_hybrid(&self) -> bool {
        self.linear_attention_layers > 0
    }

    /// The model_type that decides the language model's module names.
    pub fn lm_model_type(&self) -> Option<&str> {
        self.text_model_type
            .as_deref()
            .or(self.model_type.as_deref())
    }
}

/// Read a JSON object from `path`, with errors naming the file: missing, unreadable, not
/// UTF-8, not JSON, or not an object.
pub fn read_json_object(path: &Path) -> Result<Map<String, Value>, RigError> {
    let bytes = std::fs::read(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            RigError::file(path, "not found")
        } else {
            RigError::file(path, format!("cannot read: {e}"))
        }
    })?;
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        RigError::file(
            path,
            format!(
                "not UTF-8 text (invalid byte at offset {}); is this really a JSON file?",
                e.valid_up_to()
            ),
        )
    })?;
    let v: Value = serde_json::from_str(text)
        .map_err(|e| RigError::file(path, format!("not valid JSON: {e}")))?;
    match v {
        Value::Object(m) => Ok(m),
        other => Err(RigError::file(
            path,
            format!(
                "expected a JSON object at the top level, found {}",
                json_kind(&other)
            ),
        )),
    }
}

/// The JSON type name of a value, for error messages.
pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// An optional unsigned integer field; `null` counts as absent; anything else is an error
/// naming the field.
pub fn opt_u64(
    obj: &Map<String, Value>,
    key: &str,
    where_: &str,
    path: &Path,
) -> Result<Option<u64>, RigError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(|| {
            RigError::file(
                path,
                format!("field {where_}{key}: expected a non-negative integer, found {n}"),
            )
        }),
        Some(other) => Err(RigError::file(
            path,
            format!(
                "field {where_}{key}: expected a non-negative integer, found {}",
                json_kind(other)
            ),
        )),
    }
}

fn opt_bool(
    obj: &Map<String, Value>,
    key: &str,
    where_: &str,
    path: &Path,
) -> Result<Option<bool>, RigError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(RigError::file(
            path,
            format!(
                "field {where_}{key}: expected true or false, found {}",
                json_kind(other)
            ),
        )),
    }
}

fn opt_str(obj: &Map<String, Value>, key: &str) -> Option<String> {
    obj.get(key).and_then(Value::as_str).map(str::to_string)
}

/// Parse `config.json` (already read as an object) into [`ModelFacts`].
///
/// # Errors
/// A known numeric/boolean field of the wrong type, or `layer_types` that is not an array of
/// strings; the error names the file and the field.
pub fn parse_model_facts(root: &Map<String, Value>, path: &Path) -> anyhow::Result<ModelFacts> {
    let text_cfg = match root.get("text_config") {
        Some(Value::Object(t)) => Some(t),
        None | Some(Value::Null) => None,
        Some(other) => {
            return Err(RigError::file(
                path,
                format!(
                    "field text_config: expected an object, found {}",
                    json_kind(other)
                ),
            )
            .into())
        }
    };
    let (lm, pre) = match text_cfg {
        Some(t) => (t, "text_config."),
        None => (root, ""),
    };
    // A field of the language model: nested first, then top level.
    let num = |key: &str| -> Result<Option<u64>, RigError> {
        match opt_u64(lm, key, pre, path)? {
            Some(v) => Ok(Some(v)),
            None if text_cfg.is_some() => opt_u64(root, key, "", path),
            None => Ok(None),
        }
    };
    let first = |keys: &[&str]| -> Result<Option<u64>, RigError> {
        for k in keys {
            if let Some(v) = num(k)? {
                return Ok(Some(v));
            }
        }
        Ok(None)
    };

    let architectures = match root.get("architectures") {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    };
    let mut f = ModelFacts {
        architectures,
        model_type: opt_str(root, "model_type"),
        text_model_type: text_cfg.and_then(|t| opt_str(t, "model_type")),
        from_text_config: text_cfg.is_some(),
        num_hidden_layers: first(&["num_hidden_layers", "n_layer", "num_layers"])?,
        hidden_size: first(&["hidden_size", "n_embd", "d_model"])?,
        num_attention_heads: first(&["num_attention_heads", "n_head"])?,
        num_key_value_heads: first(&["num_key_value_heads", "num_kv_heads"])?,
        head_dim: num("head_dim")?,
        intermediate_size: num("intermediate_size")?,
        moe_intermediate_size: num("moe_intermediate_size")?,
        shared_expert_intermediate_size: num("shared_expert_intermediate_size")?,
        num_experts: first(&["num_experts", "n_routed_experts", "num_local_experts"])?,
        num_experts_per_tok: num("num_experts_per_tok")?,
        vocab_size: num("vocab_size")?,
        max_position_embeddings: num("max_position_embeddings")?,
        ..Default::default()
    };
    // Bounds that keep every later loop and product sane on hostile input.
    check_bounds(&f, pre, path)?;
    f.tie_word_embeddings = match opt_bool(lm, "tie_word_embeddings", pre, path)? {
        Some(b) => Some(b),
        None => opt_bool(root, "tie_word_embeddings", "", path)?,
    };
    f.attn_output_gate = opt_bool(lm, "attn_output_gate", pre, path)?;
    f.dtype = opt_str(lm, "torch_dtype")
        .or_else(|| opt_str(lm, "dtype"))
        .or_else(|| opt_str(root, "torch_dtype"))
        .or_else(|| opt_str(root, "dtype"));
    if f.num_key_value_heads.is_none() {
        f.num_key_value_heads = f.num_attention_heads;
    }
    if f.head_dim.is_none() {
        if let (Some(h), Some(n)) = (f.hidden_size, f.num_attention_heads) {
            if n > 0 && h % n == 0 {
                f.head_dim = Some(h / n);
                f.head_dim_derived = true;
            }
        }
    }

    parse_layer_types(&mut f, lm, pre, path)?;
    count_layer_kinds(&mut f, lm, pre, path)?;

    for key in ["mtp_num_hidden_layers", "num_nextn_predict_layers"] {
        if let Some(n) = num(key)? {
            if n > 1000 {
                return Err(RigError::file(
                    path,
                    format!("field {pre}{key} = {n} is implausible (more than 1000)"),
                )
                .into());
            }
            f.mtp_layers = Some(n);
            f.mtp_field = Some(key.to_string());
            break;
        }
    }

    parse_vision(&mut f, root, path)?;
    note_attention_extras(&mut f, lm);
    Ok(f)
}

/// Refuse dimensions that would make every later loop and product insane on hostile input.
fn check_bounds(f: &ModelFacts, pre: &str, path: &Path) -> anyhow::Result<()> {
    for (name, v, max) in [
        ("num_hidden_layers", f.num_hidden_layers, 100_000u64),
        ("num_experts", f.num_experts, 1_000_000),
        ("hidden_size", f.hidden_size, 1 << 24),
        ("num_attention_heads", f.num_attention_heads, 1 << 20),
        ("num_key_value_heads", f.num_key_value_heads, 1 << 20),
        ("head_dim", f.head_dim, 1 << 20),
        ("vocab_size", f.vocab_size, 1 << 30),
        ("intermediate_size", f.intermediate_size, 1 << 26),
        ("moe_intermediate_size", f.moe_intermediate_size, 1 << 26),
    ] {
        if let Some(v) = v.filter(|v| *v > max) {
            return Err(RigError::file(
                path,
                format!("field {pre}{name} = {v} is implausible (more than {max}); is this a model config?"),
            )
            .into());
        }
    }
    Ok(())
}

/// The layer types: the explicit list, or derived from full_attention_interval; checked against the layer count.
fn parse_layer_types(
    f: &mut ModelFacts,
    lm: &Map<String, Value>,
    pre: &str,
    path: &Path,
) -> anyhow::Result<()> {
    // Layer types: explicit list, or derived from full_attention_interval (Qwen3-Next rule:
    // layer i is full attention when (i + 1) % interval == 0).
    match lm.get("layer_types") {
        Some(Value::Array(a)) => {
            let mut v = Vec::with_capacity(a.len());
            for (i, t) in a.iter().enumerate() {
                match t.as_str() {
                    Some(s) => v.push(s.to_string()),
                    None => {
                        return Err(RigError::file(
                            path,
                            format!(
                                "field {pre}layer_types[{i}]: expected a string, found {}",
                                json_kind(t)
                            ),
                        )
                        .into())
                    }
                }
            }
            f.layer_types = v;
            f.layer_types_source = Some("layer_types".into());
        }
        None | Some(Value::Null) => {
            if let (Some(iv), Some(n)) = (
                opt_u64(lm, "full_attention_interval", pre, path)?,
                f.num_hidden_layers,
            ) {
                if iv > 0 && lm.contains_key("linear_num_value_heads") {
                    f.layer_types = (0..n)
                        .map(|i| {
                            if (i + 1) % iv == 0 {
                                "full_attention".to_string()
                            } else {
                                "linear_attention".to_string()
                            }
                        })
                        .collect();
                    f.layer_types_source = Some("full_attention_interval".into());
                }
            }
        }
        Some(other) => {
            return Err(RigError::file(
                path,
                format!(
                    "field {pre}layer_types: expected an array, found {}",
                    json_kind(other)
                ),
            )
            .into())
        }
    }
    if let Some(n) = f.num_hidden_layers {
        if !f.layer_types.is_empty() && f.layer_types.len() as u64 != n {
            return Err(RigError::file(
                path,
                format!(
                    "field {pre}layer_types has {} entries but num_hidden_layers is {n}",
                    f.layer_types.len()
                ),
            )
            .into());
        }
    }
    Ok(())
}

/// Linear, sliding-window and full-attention layer counts, the sliding window and the linear-attention dimensions.
fn count_layer_kinds(
    f: &mut ModelFacts,
    lm: &Map<String, Value>,
    pre: &str,
    path: &Path,
) -> anyhow::Result<()> {
    let linear = f
        .layer_types
        .iter()
        .filter(|t| t.as_str() == "linear_attention")
        .count() as u64;
    f.linear_attention_layers = linear;
    let in_use = lm.get("use_sliding_window") != Some(&Value::Bool(false));
    f.sliding_window = opt_u64(lm, "sliding_window", pre, path)
        .ok()
        .flatten()
        .filter(|w| in_use && *w > 0);
    let sliding = f
        .layer_types
        .iter()
        .filter(|t| t.as_str() == "sliding_attention")
        .count() as u64;
    // Sliding-window layers are apart only when the window is known; otherwise they are
    // counted with full attention (an upper bound, stated in the capacity assumptions).
    f.sliding_attention_layers = if f.sliding_window.is_some() {
        sliding
    } else {
        0
    };
    f.full_attention_layers = if f.layer_types.is_empty() {
        f.num_hidden_layers
    } else {
        Some(
            f.layer_types
                .iter()
                .filter(|t| t.contains("attention") && t.as_str() != "linear_attention")
                .count() as u64
                - f.sliding_attention_layers,
        )
    };
    if linear > 0 || lm.contains_key("linear_num_value_heads") {
        f.linear_attention = Some(LinearAttentionFacts {
            num_key_heads: opt_u64(lm, "linear_num_key_heads", pre, path)?,
            num_value_heads: opt_u64(lm, "linear_num_value_heads", pre, path)?,
            key_head_dim: opt_u64(lm, "linear_key_head_dim", pre, path)?,
            value_head_dim: opt_u64(lm, "linear_value_head_dim", pre, path)?,
            conv_kernel: opt_u64(lm, "linear_conv_kernel_dim", pre, path)?,
            ssm_dtype: opt_str(lm, "mamba_ssm_dtype"),
        });
    }
    Ok(())
}

/// The vision tower's dimensions from vision_config, checked for plausibility.
fn parse_vision(f: &mut ModelFacts, root: &Map<String, Value>, path: &Path) -> anyhow::Result<()> {
    if let Some(Value::Object(v)) = root.get("vision_config") {
        let vp = "vision_config.";
        let vf = VisionFacts {
            depth: match opt_u64(v, "depth", vp, path)? {
                Some(d) => Some(d),
                None => opt_u64(v, "num_hidden_layers", vp, path)?,
            },
            hidden_size: opt_u64(v, "hidden_size", vp, path)?,
            intermediate_size: opt_u64(v, "intermediate_size", vp, path)?,
        };
        if vf.depth.unwrap_or(0) > 10_000
            || vf.hidden_size.unwrap_or(0) > 1 << 24
            || vf.intermediate_size.unwrap_or(0) > 1 << 26
        {
            return Err(RigError::file(
                path,
                "vision_config dimensions are implausible (depth above 10,000 or sizes above 2^24/2^26)",
            )
            .into());
        }
        f.vision = Some(vf);
    }
    Ok(())
}

/// The attention fields the generic KV formula ignores (latent, compressed or sliding attention).
fn note_attention_extras(f: &mut ModelFacts, lm: &Map<String, Value>) {
    for key in [
        "kv_lora_rank",
        "q_lora_rank",
        "sliding_window",
        "compress_ratios",
        "index_topk",
    ] {
        // Qwen2/3 configs carry a sliding_window with use_sliding_window = false: not in use.
        if key == "sliding_window" && lm.get("use_sliding_window") == Some(&Value::Bool(false)) {
            continue;
        }
        if lm.get(key).is_some_and(|v| !v.is_null()) {
            f.attention_extras.push(key.to_string());
        }
    }
}

/// Read and parse `dir/config.json`.
///
/// # Errors
/// Missing, unreadable, not UTF-8, not JSON, or a known field of the wrong type; the error
/// names the file.
pub fn read_model_facts(dir: &Path) -> anyhow::Result<(Map<String, Value>, ModelFacts)> {
    let path = dir.join("config.json");
    let root = read_json_object(&path).map_err(|e| match e {
        RigError::BadFile { path, message } if message == "not found" => RigError::file(
            path,
            "not found; a Hugging Face checkpoint folder needs config.json (download it with the weights' metadata)",
        ),
        other => other,
    })?;
    let facts =
        parse_model_facts(&root, &path).with_context(|| format!("reading {}", path.display()))?;
    Ok((root, facts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(json: &str) -> anyhow::Result<ModelFacts> {
        let v: Value = serde_json::from_str(json).unwrap();
        parse_model_facts(v.as_object().unwrap(), Path::new("config.json"))
    }

    #[test]
    fn dense_defaults() {
        let f = facts(
            r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":4096,
                "num_attention_heads":32,"num_hidden_layers":2,"intermediate_size":11008,
                "vocab_size":32000}"#,
        )
        .unwrap();
        assert_eq!(f.num_key_value_heads, Some(32));
        assert_eq!(f.head_dim, Some(128));
        assert!(f.head_dim_derived);
        assert_eq!(f.full_attention_layers, Some(2));
        assert_eq!(f.linear_attention_layers, 0);
        assert_eq!(f.tie_word_embeddings, None);
    }

    #[test]
    fn interval_derives_layer_types() {
        let f = facts(
            r#"{"model_type":"qwen3_next","num_hidden_layers":8,"full_attention_interval":4,
                "linear_num_value_heads":32,"hidden_size":2048,"num_attention_heads":16}"#,
        )
        .unwrap();
        assert_eq!(
            f.layer_types_source.as_deref(),
            Some("full_attention_interval")
        );
        assert_eq!(f.layer_type(3), "full_attention");
        assert_eq!(f.layer_type(0), "linear_attention");
        assert_eq!(f.full_attention_layers, Some(2));
        assert_eq!(f.linear_attention_layers, 6);
    }

    #[test]
    fn wrong_types_name_the_field() {
        let e = facts(r#"{"num_hidden_layers":"forty"}"#).unwrap_err();
        assert!(e.to_string().contains("num_hidden_layers"), "{e}");
        let e = facts(r#"{"text_config":{"hidden_size":-1}}"#).unwrap_err();
        assert!(e.to_string().contains("text_config.hidden_size"), "{e}");
        let e = facts(r#"{"num_hidden_layers":2,"layer_types":["full_attention"]}"#).unwrap_err();
        assert!(e.to_string().contains("layer_types"), "{e}");
        let e = facts(r#"{"text_config":[1]}"#).unwrap_err();
        assert!(e.to_string().contains("text_config"), "{e}");
        let e = facts(r#"{"num_hidden_layers":1000000000000,"full_attention_interval":4,"linear_num_value_heads":2}"#)
            .unwrap_err();
        assert!(e.to_string().contains("implausible"), "{e}");
    }
}
