//! Qwen3.5 / Qwen3.6 hybrids: the configuration of the Gated-DeltaNet layer mix and its reader.
//!
//! The family (transformers' `Qwen3_5TextConfig`, `modeling_qwen3_5.py`) is a pre-norm decoder
//! whose token mixer alternates, per `layer_types`, between
//! - Gated-DeltaNet (`linear_attention`; Yang, Kautz and Hatamizadeh, "Gated Delta Networks",
//!   ICLR 2025): `in_proj_qkv`, `in_proj_z`, `in_proj_a`, `in_proj_b`, a causal depthwise
//!   `conv1d` with SiLU, `A_log`, `dt_bias`, the gated delta rule over an FP32 state of
//!   `value_heads × key_head_dim × value_head_dim` per sequence, a gated RMSNorm and `out_proj`
//!   (the math is in `crate::runtime::gdn`);
//! - full attention with an output gate (`q_proj` emits query and gate per head), q/k RMSNorm
//!   and partial RoPE (`partial_rotary_factor` of `head_dim`).
//!
//! Every RMSNorm of the family except the gated one is zero-centred: `y = norm(x) · (1 + w)`
//! (`Qwen3_5RMSNorm`, weights initialised to 0); the loader folds the `1 +` into the weight, so
//! the backends apply plain weights. The gated norm (`Qwen3_5RMSNormGated`) uses `w` as stored.
//!
//! [`parse_family`] reads `qwen3_5_text` configs and the `text_config` of `qwen3_5`
//! (`Qwen3_5ForConditionalGeneration`: the vision tower is not loaded, and the loader says so by
//! name); Qwen3-Next and the Qwen3.5 / 3.6 MoE siblings are refused by name, with the reason.

use serde_json::{Map, Value};

use super::config::{Arch, HfConfig, ModelConfig, RopeScaling};
use super::fields::Fields;

/// What a decoder layer's token mixer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerType {
    /// `full_attention`: gated softmax attention with a paged KV cache.
    Attention,
    /// `linear_attention`: Gated-DeltaNet with a fixed recurrent state per sequence.
    Gdn,
}

/// The Gated-DeltaNet part of a hybrid's shape (transformers' `Qwen3_5TextConfig` fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HybridConfig {
    /// Mixer of every decoder layer (`layer_types`), at least `num_layers` long.
    pub layer_types: Vec<LayerType>,
    /// `linear_num_key_heads`: query/key heads of the Gated-DeltaNet layers.
    pub num_key_heads: usize,
    /// `linear_num_value_heads` (a multiple of the key heads: each key head serves
    /// `value_heads / key_heads` consecutive value heads, transformers' `repeat_interleave`).
    pub num_value_heads: usize,
    /// `linear_key_head_dim`.
    pub key_head_dim: usize,
    /// `linear_value_head_dim`.
    pub value_head_dim: usize,
    /// `linear_conv_kernel_dim`: width of the causal depthwise convolution.
    pub conv_kernel: usize,
    /// `mtp_num_hidden_layers`: MTP draft layers in the checkpoint (never loaded).
    pub mtp_layers: usize,
}

/// Bytes per element of the convolution state the runtime keeps on a GPU (BF16: it holds the
/// BF16 outputs of `in_proj_qkv`), as vLLM's `MambaStateShapeCalculator` counts it.
pub const CONV_STATE_ELEM_BYTES: u64 = 2;
/// Bytes per element of the recurrent state (FP32 always).
pub const SSM_STATE_ELEM_BYTES: u64 = 4;

impl HybridConfig {
    /// `key_heads · key_head_dim` (width of the query, and of the key, part of `in_proj_qkv`).
    pub fn key_dim(&self) -> usize {
        self.num_key_heads * self.key_head_dim
    }

    /// `value_heads · value_head_dim` (width of the value part, of `in_proj_z` and of the
    /// mixer's output).
    pub fn value_dim(&self) -> usize {
        self.num_value_heads * self.value_head_dim
    }

    /// Channels of the convolution: `2 · key_dim + value_dim` (the rows of `in_proj_qkv`).
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Elements of one layer's convolution state: `(conv_kernel − 1) · conv_dim`.
    pub fn conv_state_elems(&self) -> usize {
        self.conv_kernel.saturating_sub(1) * self.conv_dim()
    }

    /// Elements of one layer's recurrent state: `value_heads · key_head_dim · value_head_dim`.
    pub fn ssm_state_elems(&self) -> usize {
        self.num_value_heads * self.key_head_dim * self.value_head_dim
    }

    /// Value heads per key head.
    pub fn group(&self) -> usize {
        self.num_value_heads / self.num_key_heads.max(1)
    }

    pub(super) fn num_params(&self, c: &ModelConfig) -> u64 {
        let h = c.hidden_size as u64;
        let layers = c.num_layers.min(self.layer_types.len());
        let norms = 2 * h;
        let attn = h * (2 * c.q_dim()) as u64
            + 2 * h * c.kv_dim() as u64
            + c.q_dim() as u64 * h
            + 2 * c.head_dim as u64;
        let gdn = h * (self.conv_dim() + self.value_dim() + 2 * self.num_value_heads) as u64
            + (self.conv_dim() * self.conv_kernel) as u64
            + 2 * self.num_value_heads as u64
            + self.value_head_dim as u64
            + self.value_dim() as u64 * h;
        let per: u64 = self.layer_types[..layers]
            .iter()
            .enumerate()
            .map(|(i, t)| {
                norms
                    + c.mlp_params(i)
                    + match t {
                        LayerType::Attention => attn,
                        LayerType::Gdn => gdn,
                    }
            })
            .sum();
        let emb = c.vocab_size as u64 * h;
        emb * if c.tie_word_embeddings { 1 } else { 2 } + per + h
    }
}

impl ModelConfig {
    /// Whether this is a Gated-DeltaNet hybrid.
    pub fn is_hybrid(&self) -> bool {
        self.hybrid.is_some()
    }

    /// The mixer of layer `i` (full attention for dense decoders).
    pub fn layer_type(&self, i: usize) -> LayerType {
        self.hybrid
            .as_ref()
            .and_then(|h| h.layer_types.get(i).copied())
            .unwrap_or(LayerType::Attention)
    }

    /// Decoder layers with a KV cache (all of them for dense decoders).
    pub fn num_attention_layers(&self) -> usize {
        (0..self.num_layers)
            .filter(|i| self.layer_type(*i) == LayerType::Attention)
            .count()
    }

    /// Gated-DeltaNet layers (0 for dense decoders).
    pub fn num_gdn_layers(&self) -> usize {
        self.num_layers - self.num_attention_layers()
    }

    /// Rows of `q_proj`: `2 · num_heads · head_dim` when it also emits the output gate (the
    /// Qwen3.5 family), else `num_heads · head_dim`.
    pub fn q_proj_rows(&self) -> usize {
        if self.arch == Arch::Qwen35 {
            2 * self.q_dim()
        } else {
            self.q_dim()
        }
    }

    /// Whether the attention output is gated by `sigmoid(gate)` (the Qwen3.5 family).
    pub fn attn_output_gate(&self) -> bool {
        self.arch == Arch::Qwen35
    }

    /// Bytes of one sequence's Gated-DeltaNet state over all its layers with the convolution
    /// state stored in `conv_elem_bytes` per element and the recurrent state in FP32 (0 for
    /// dense decoders): `gdn_layers · (conv_state · conv_elem_bytes + ssm_state · 4)`, the
    /// shape of vLLM's `MambaStateShapeCalculator.gated_delta_net_state_shape`.
    pub fn gdn_state_bytes(&self, conv_elem_bytes: u64) -> u64 {
        match &self.hybrid {
            None => 0,
            Some(h) => {
                self.num_gdn_layers() as u64
                    * (h.conv_state_elems() as u64 * conv_elem_bytes
                        + h.ssm_state_elems() as u64 * SSM_STATE_ELEM_BYTES)
            }
        }
    }
}

/// The `synthetic:qwen3.6-27b` shape: the text decoder of `Qwen/Qwen3.6-27B` (the same as
/// `Qwen/Qwen3.5-27B`) as its model card and `config.json` state it: 64 layers in 16 blocks of
/// 3 Gated-DeltaNet + 1 gated attention, hidden 5,120, MLP 17,408, attention 24 query / 4 KV
/// heads of 256 with RoPE over the first 64 dimensions (`partial_rotary_factor` 0.25, θ = 10⁷),
/// Gated-DeltaNet 16 query/key heads and 48 value heads of 128 with a width-4 convolution,
/// vocabulary 248,320 (untied lm_head), 262,144 positions, one MTP layer (never loaded).
pub fn qwen36_27b() -> ModelConfig {
    ModelConfig {
        arch: Arch::Qwen35,
        hidden_size: 5120,
        intermediate_size: 17_408,
        num_layers: 64,
        num_heads: 24,
        num_kv_heads: 4,
        head_dim: 256,
        vocab_size: 248_320,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000_000.0,
        rope_scaling: RopeScaling::None,
        max_position_embeddings: 262_144,
        tie_word_embeddings: false,
        // Qwen3.5's <|im_end|> (248046) and <|endoftext|> (248044).
        eos_token_ids: vec![248_046, 248_044],
        rotary_dim: 64,
        hybrid: Some(HybridConfig {
            layer_types: interval_pattern(64, 4),
            num_key_heads: 16,
            num_value_heads: 48,
            key_head_dim: 128,
            value_head_dim: 128,
            conv_kernel: 4,
            mtp_layers: 1,
        }),
        moe: None,
    }
}

/// The `synthetic:tiny-hybrid` shape: 4 layers (3 Gated-DeltaNet + 1 gated attention), H = 64,
/// 4 query / 2 KV heads of 32 with RoPE over 8 dimensions, Gated-DeltaNet 2 key heads and 4
/// value heads of 16 with a width-4 convolution, MLP 192, the byte tokenizer's vocabulary of
/// 320, tied lm_head: milliseconds per token on one CPU core.
pub fn tiny_hybrid() -> ModelConfig {
    ModelConfig {
        arch: Arch::Qwen35,
        hidden_size: 64,
        intermediate_size: 192,
        num_layers: 4,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 32,
        vocab_size: 320,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        rope_scaling: RopeScaling::None,
        max_position_embeddings: 32_768,
        tie_word_embeddings: true,
        eos_token_ids: vec![super::config::BYTE_TOKENIZER_ENDOFTEXT],
        rotary_dim: 8,
        hybrid: Some(HybridConfig {
            layer_types: interval_pattern(4, 4),
            num_key_heads: 2,
            num_value_heads: 4,
            key_head_dim: 16,
            value_head_dim: 16,
            conv_kernel: 4,
            mtp_layers: 0,
        }),
        moe: None,
    }
}

/// transformers' default layer pattern: layer `i` is full attention when `(i + 1) % interval
/// == 0`, Gated-DeltaNet otherwise (`Qwen3_5TextConfig.__post_init__` with
/// `full_attention_interval`).
pub fn interval_pattern(layers: usize, interval: usize) -> Vec<LayerType> {
    (0..layers)
        .map(|i| {
            if (i + 1) % interval.max(1) == 0 {
                LayerType::Attention
            } else {
                LayerType::Gdn
            }
        })
        .collect()
}

/// Model types of the family's siblings that the runtime refuses, with the reason.
const REFUSED: &[(&str, &str)] = &[(
    "qwen3_next",
    "Qwen3-Next: its projections are fused as in_proj_qkvz / in_proj_ba and its MoE layout differs from Qwen3.5's, which the built-in runtime does not implement",
)];

/// Read a config of the Qwen3.5 / 3.6 family: `Ok(None)` when `root` is of another family (the
/// dense reader takes it), `Ok(Some)` for `qwen3_5_text`, `qwen3_5`, and their
/// mixture-of-experts siblings `qwen3_5_moe_text` and `qwen3_5_moe` (see
/// [`super::moe`]), an error naming the field (or the refused sibling and why) otherwise.
///
/// # Errors
/// A refused sibling (Qwen3-Next); a field missing, of the wrong type, or of a value the
/// runtime does not implement (named).
pub fn parse_family(root: &Map<String, Value>) -> anyhow::Result<Option<HfConfig>> {
    let model_type = root.get("model_type").and_then(Value::as_str).unwrap_or("");
    let archs: Vec<&str> = root
        .get("architectures")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let inner_type = root
        .get("text_config")
        .and_then(|t| t.get("model_type"))
        .and_then(Value::as_str)
        .unwrap_or("");
    for (mt, why) in REFUSED {
        if model_type == *mt || inner_type == *mt {
            anyhow::bail!(
                "model_type '{model_type}'{}: {why}; the built-in runtime runs the Qwen3.5 / 3.6 hybrids (model_type qwen3_5_text, qwen3_5, qwen3_5_moe_text, qwen3_5_moe), qwen3, qwen3_moe and llama; use an external engine (--url / --engine-cmd)",
                if inner_type.is_empty() { String::new() } else { format!(" (text_config.model_type '{inner_type}')") }
            );
        }
    }
    if let Some(a) = archs.iter().find(|a| a.starts_with("Qwen3Next")) {
        anyhow::bail!(
            "architecture '{a}' (Qwen3-Next) is not implemented by the built-in runtime; it runs Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration, Qwen3ForCausalLM, Qwen3MoeForCausalLM and LlamaForCausalLM"
        );
    }
    let mut warnings = Vec::new();
    match model_type {
        "qwen3_5_text" | "qwen3_5_moe_text" => {
            let moe = model_type == "qwen3_5_moe_text";
            let want = if moe {
                "Qwen3_5MoeForCausalLM"
            } else {
                "Qwen3_5ForCausalLM"
            };
            if let Some(a) = archs.iter().find(|a| **a != want) {
                anyhow::bail!(
                    "architecture '{a}' is not supported by the built-in runtime for model_type '{model_type}' (it runs {want})"
                );
            }
            let (config, dtype) = parse_text(root, "", moe, &mut warnings)?;
            Ok(Some(HfConfig {
                config,
                warnings,
                dtype,
            }))
        }
        "qwen3_5" | "qwen3_5_moe" => {
            let moe = model_type == "qwen3_5_moe";
            let (want, inner_want) = if moe {
                ("Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe_text")
            } else {
                ("Qwen3_5ForConditionalGeneration", "qwen3_5_text")
            };
            if let Some(a) = archs.iter().find(|a| **a != want) {
                anyhow::bail!(
                    "architecture '{a}' is not supported by the built-in runtime for model_type '{model_type}' (it runs the text part of {want})"
                );
            }
            let Some(Value::Object(text)) = root.get("text_config") else {
                anyhow::bail!(
                    "model_type '{model_type}' without a text_config object: the language model's dimensions live there"
                );
            };
            if !(inner_type.is_empty() || inner_type == inner_want) {
                anyhow::bail!(
                    "text_config.model_type '{inner_type}' inside model_type '{model_type}'; expected {inner_want}"
                );
            }
            let (mut config, mut dtype) = parse_text(text, "text_config.", moe, &mut warnings)?;
            // transformers' Qwen3_5Config has its own tie_word_embeddings (default false), and
            // the generation model ties by it.
            if let Some(v) = root.get("tie_word_embeddings") {
                let top = v.as_bool().ok_or_else(|| {
                    anyhow::anyhow!("field tie_word_embeddings: expected true or false, found {v}")
                })?;
                if text.contains_key("tie_word_embeddings") && top != config.tie_word_embeddings {
                    anyhow::bail!(
                        "tie_word_embeddings = {top} and text_config.tie_word_embeddings = {} disagree; fix config.json so that one remains",
                        config.tie_word_embeddings
                    );
                }
                config.tie_word_embeddings = top;
                warnings.retain(|w| !w.starts_with("text_config.tie_word_embeddings absent"));
            }
            if dtype.is_none() {
                dtype = root
                    .get("dtype")
                    .or_else(|| root.get("torch_dtype"))
                    .and_then(Value::as_str)
                    .map(str::to_string);
            }
            if config.eos_token_ids.is_empty() {
                config.eos_token_ids = eos_ids(root.get("eos_token_id"));
            }
            if root.get("vision_config").is_some_and(|v| !v.is_null()) {
                warnings.push(
                    "vision_config: the vision tower (model.visual.*) is not loaded; the built-in runtime runs the text decoder only, so image and video inputs are refused".into(),
                );
            }
            Ok(Some(HfConfig {
                config,
                warnings,
                dtype,
            }))
        }
        _ => Ok(None),
    }
}

fn eos_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().map(|x| x as u32))
            .collect(),
        _ => Vec::new(),
    }
}

/// The transformers config class whose defaults `parse_text` applies.
const FAMILY: &str = "Qwen3_5TextConfig";

/// Read a `Qwen3_5TextConfig` object (`at` prefixes field names in messages). Absent math
/// fields take `Qwen3_5TextConfig`'s defaults and say so in `warnings`.
fn parse_text(
    o: &Map<String, Value>,
    at: &str,
    moe: bool,
    warnings: &mut Vec<String>,
) -> anyhow::Result<(ModelConfig, Option<String>)> {
    let f = Fields::new(o, at);
    let uint = |key: &str| f.uint(key);
    let float = super::fields::float;
    let boolean = |key: &str| f.boolean(key);
    let need = |key: &str| f.need(key);
    let or_default = |key: &str, d: usize, warnings: &mut Vec<String>| -> anyhow::Result<usize> {
        match uint(key)? {
            Some(0) => anyhow::bail!("field '{at}{key}' is 0"),
            Some(x) => Ok(x),
            None => {
                warnings.push(format!("{at}{key} absent: using {d} ({FAMILY}'s default)"));
                Ok(d)
            }
        }
    };
    if boolean("attention_bias")? == Some(true) || boolean("mlp_bias")? == Some(true) {
        anyhow::bail!(
            "{at}attention_bias/mlp_bias = true is not supported by the built-in runtime"
        );
    }
    match o.get("hidden_act") {
        None | Some(Value::Null) => warnings.push(format!(
            "{at}hidden_act absent: using silu ({FAMILY}'s default)"
        )),
        Some(Value::String(s)) if s == "silu" => {}
        Some(other) => anyhow::bail!(
            "{at}hidden_act {other} is not supported; the built-in runtime implements SwiGLU and the SiLU convolution with silu"
        ),
    }
    if boolean("use_sliding_window")? == Some(true) {
        anyhow::bail!(
            "{at}use_sliding_window = true: sliding-window attention is not supported by the built-in runtime"
        );
    }
    if boolean("attn_output_gate")? == Some(false) {
        anyhow::bail!(
            "{at}attn_output_gate = false: transformers' Qwen3_5Attention always splits q_proj into query and output gate, and so does the built-in runtime"
        );
    }
    let hidden_size = need("hidden_size")?;
    let num_layers = need("num_hidden_layers")?;
    let num_heads = need("num_attention_heads")?;
    let num_kv_heads = or_default("num_key_value_heads", if moe { 2 } else { 4 }, warnings)?;
    if num_heads % num_kv_heads != 0 {
        anyhow::bail!(
            "{at}num_attention_heads ({num_heads}) is not a multiple of num_key_value_heads ({num_kv_heads})"
        );
    }
    let head_dim = or_default("head_dim", 256, warnings)?;
    let layer_types = parse_layer_mix(o, at, num_layers, &uint, warnings)?;
    let conv_kernel = or_default("linear_conv_kernel_dim", 4, warnings)?;
    let key_head_dim = or_default("linear_key_head_dim", 128, warnings)?;
    let value_head_dim = or_default("linear_value_head_dim", 128, warnings)?;
    let num_key_heads = or_default("linear_num_key_heads", 16, warnings)?;
    let num_value_heads = or_default("linear_num_value_heads", 32, warnings)?;
    if num_value_heads % num_key_heads != 0 {
        anyhow::bail!(
            "{at}linear_num_value_heads ({num_value_heads}) is not a multiple of linear_num_key_heads ({num_key_heads})"
        );
    }
    let rotary_dim = partial_rotary_dim(o, at, head_dim, warnings, &float)?;
    let mut rope_warnings = Vec::new();
    let (rope_theta, rope_scaling) =
        super::rope::parse_rope(o, FAMILY, &mut rope_warnings, &float, true)
            .map_err(|e| anyhow::anyhow!("{at}{e:#}"))?;
    warnings.extend(rope_warnings.into_iter().map(|w| format!("{at}{w}")));
    let rms_norm_eps = match float(o, "rms_norm_eps", at)? {
        Some(e) if e > 0.0 && e.is_finite() => e as f32,
        Some(e) => anyhow::bail!("{at}rms_norm_eps = {e}; expected a small positive number"),
        None => {
            warnings.push(format!(
                "{at}rms_norm_eps absent: using 1e-6 ({FAMILY}'s default)"
            ));
            1e-6
        }
    };
    let tie_word_embeddings = match boolean("tie_word_embeddings")? {
        Some(b) => b,
        None => {
            warnings.push(format!(
                "{at}tie_word_embeddings absent: using false ({FAMILY}'s default): lm_head.weight must be in the checkpoint"
            ));
            false
        }
    };
    let max_position_embeddings = match uint("max_position_embeddings")? {
        Some(n) if n > 0 => n,
        _ => {
            warnings.push(format!(
                "{at}max_position_embeddings absent: using 32768 ({FAMILY}'s default)"
            ));
            32_768
        }
    };
    if let Some(d) = o.get("mamba_ssm_dtype").and_then(Value::as_str) {
        if !matches!(d, "float32" | "torch.float32" | "fp32") {
            warnings.push(format!(
                "{at}mamba_ssm_dtype = {d}: the built-in runtime keeps the recurrent state in FP32 (twice the bytes of {d} per state element)"
            ));
        }
    }
    let mtp_layers = uint("mtp_num_hidden_layers")?.unwrap_or(0);
    let dtype = o
        .get("dtype")
        .or_else(|| o.get("torch_dtype"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let config = ModelConfig {
        arch: Arch::Qwen35,
        hidden_size,
        // Every layer of the MoE sibling is sparse: no dense MLP width (0 when absent).
        intermediate_size: if moe {
            uint("intermediate_size")?.unwrap_or(0)
        } else {
            need("intermediate_size")?
        },
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        vocab_size: need("vocab_size")?,
        rms_norm_eps,
        rope_theta,
        rope_scaling,
        max_position_embeddings,
        tie_word_embeddings,
        eos_token_ids: eos_ids(o.get("eos_token_id")),
        rotary_dim,
        hybrid: Some(HybridConfig {
            layer_types,
            num_key_heads,
            num_value_heads,
            key_head_dim,
            value_head_dim,
            conv_kernel,
            mtp_layers,
        }),
        moe: if moe {
            Some(super::moe::parse_moe(
                o,
                at,
                super::moe::MoeFamily::Qwen35,
                num_layers,
                warnings,
            )?)
        } else {
            None
        },
    };
    Ok((config, dtype))
}

/// The layer mix: the explicit `layer_types`, or a full-attention layer every `full_attention_interval`.
fn parse_layer_mix(
    o: &Map<String, Value>,
    at: &str,
    num_layers: usize,
    uint: &dyn Fn(&str) -> anyhow::Result<Option<usize>>,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Vec<LayerType>> {
    Ok(match o.get("layer_types") {
        Some(Value::Array(a)) => {
            let mut v = Vec::with_capacity(a.len());
            for (i, t) in a.iter().enumerate() {
                v.push(match t.as_str() {
                    Some("full_attention") => LayerType::Attention,
                    Some("linear_attention") => LayerType::Gdn,
                    _ => anyhow::bail!(
                        "{at}layer_types[{i}] = {t}: the built-in runtime runs full_attention and linear_attention (Gated-DeltaNet) layers"
                    ),
                });
            }
            if v.len() != num_layers {
                anyhow::bail!(
                    "{at}layer_types has {} entries for num_hidden_layers = {num_layers}",
                    v.len()
                );
            }
            v
        }
        None | Some(Value::Null) => {
            let interval = match uint("full_attention_interval")? {
                Some(0) => anyhow::bail!("field '{at}full_attention_interval' is 0"),
                Some(n) => n,
                None => {
                    warnings.push(format!(
                        "{at}layer_types and full_attention_interval absent: using a full-attention layer every 4 ({FAMILY}'s default)"
                    ));
                    4
                }
            };
            interval_pattern(num_layers, interval)
        }
        Some(other) => anyhow::bail!("field {at}layer_types: expected a list, found {other}"),
    })
}

/// The rotary dimensions of partial RoPE (`partial_rotary_factor` × head_dim), checked even and in range.
fn partial_rotary_dim(
    o: &Map<String, Value>,
    at: &str,
    head_dim: usize,
    warnings: &mut Vec<String>,
    float: &super::rope::FloatField,
) -> anyhow::Result<usize> {
    // Partial RoPE: rope_parameters.partial_rotary_factor (transformers 5) or the top-level
    // field; transformers sets 0.25 when neither is given.
    let rp = match o.get("rope_parameters") {
        Some(Value::Object(m)) => Some(m),
        _ => None,
    };
    let in_rp = match rp {
        Some(m) => float(m, "partial_rotary_factor", &format!("{at}rope_parameters."))?,
        None => None,
    };
    let top = float(o, "partial_rotary_factor", at)?;
    let factor = match (in_rp, top) {
        (Some(a), Some(b)) if (a - b).abs() > 1e-9 => anyhow::bail!(
            "{at}rope_parameters.partial_rotary_factor = {a} and {at}partial_rotary_factor = {b} disagree; fix config.json so that one remains"
        ),
        (Some(a), _) | (None, Some(a)) => a,
        (None, None) => {
            warnings.push(format!(
                "{at}partial_rotary_factor absent: using 0.25 ({FAMILY}'s default)"
            ));
            0.25
        }
    };
    let rotary_dim = (head_dim as f64 * factor) as usize;
    if !(factor > 0.0 && factor <= 1.0) || rotary_dim == 0 || rotary_dim % 2 != 0 {
        anyhow::bail!(
            "{at}partial_rotary_factor = {factor} gives {rotary_dim} rotary dimensions of head_dim {head_dim}; RoPE needs an even number between 2 and head_dim"
        );
    }
    if let Some(m) = rp {
        if let Some(s) = m.get("mrope_section") {
            warnings.push(format!(
                "{at}rope_parameters.mrope_section = {s}: multimodal RoPE reduces to plain RoPE for text (the temporal, height and width positions of a text token are equal)"
            ));
        }
    }
    Ok(rotary_dim)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = "tests/fixtures/real/models/tiny-qwen35-hybrid-transformers5";

    #[test]
    fn the_tiny_fixture_config_reads_every_field() {
        let text = std::fs::read_to_string(format!("{FIXTURE}/config.json"))
            .expect("tests/fixtures/real/models/tiny-qwen35-hybrid-transformers5/config.json");
        let h = ModelConfig::parse_hf_config(&text).unwrap();
        let c = &h.config;
        assert!(h.warnings.is_empty(), "{:?}", h.warnings);
        assert_eq!(c.arch, Arch::Qwen35);
        assert_eq!((c.hidden_size, c.num_layers, c.head_dim), (128, 4, 64));
        assert_eq!((c.num_heads, c.num_kv_heads), (4, 2));
        assert_eq!(c.rotary_dim, 16, "head_dim 64 × partial_rotary_factor 0.25");
        assert_eq!(c.rope_inv_freq().len(), 8);
        assert_eq!(c.rope_theta, 10_000.0);
        let hy = c.hybrid.as_ref().unwrap();
        assert_eq!(
            hy.layer_types,
            vec![
                LayerType::Gdn,
                LayerType::Gdn,
                LayerType::Gdn,
                LayerType::Attention
            ]
        );
        assert_eq!((hy.num_key_heads, hy.num_value_heads), (2, 4));
        assert_eq!(
            (hy.key_head_dim, hy.value_head_dim, hy.conv_kernel),
            (32, 32, 4)
        );
        assert_eq!(
            hy.conv_dim(),
            256,
            "in_proj_qkv of the fixture has 256 rows"
        );
        assert_eq!(c.q_proj_rows(), 512, "q_proj of the fixture has 512 rows");
        assert_eq!((c.num_attention_layers(), c.num_gdn_layers()), (1, 3));
        assert!(!c.tie_word_embeddings);
        assert_eq!(c.eos_token_ids, vec![3]);
        assert_eq!(h.dtype.as_deref(), Some("bfloat16"));
    }

    #[test]
    fn the_27b_preset_has_the_published_shape() {
        let c = qwen36_27b();
        let hy = c.hybrid.as_ref().unwrap();
        assert_eq!((c.num_attention_layers(), c.num_gdn_layers()), (16, 48));
        assert_eq!(c.layer_type(3), LayerType::Attention);
        assert_eq!(c.layer_type(4), LayerType::Gdn);
        assert_eq!(hy.conv_dim(), 2 * 16 * 128 + 48 * 128);
        assert_eq!(c.rotary_dim, 64);
        // The card's "27B"; transformers' safetensors index of Qwen3.6-27B holds 27.78e9
        // parameters with the vision tower (about 0.46e9) and the MTP layer (about 0.43e9).
        let p = c.num_params() as f64 / 1e9;
        assert!((26.6..27.2).contains(&p), "{p}");
        // 48 layers × (3 × 10,240 × 2 B + 48 × 128 × 128 × 4 B) = 153.9 MB per sequence.
        assert_eq!(
            c.gdn_state_bytes(CONV_STATE_ELEM_BYTES),
            48 * (3 * 10_240 * 2 + 48 * 128 * 128 * 4)
        );
        assert_eq!(ModelConfig::preset("qwen3.6-27b").unwrap(), c);
    }

    fn base() -> serde_json::Value {
        serde_json::json!({"architectures":["Qwen3_5ForCausalLM"],"model_type":"qwen3_5_text",
            "hidden_size":64,"intermediate_size":128,"num_hidden_layers":4,"num_attention_heads":4,
            "num_key_value_heads":2,"head_dim":32,"vocab_size":300,"rms_norm_eps":1e-6,
            "hidden_act":"silu","tie_word_embeddings":true,"max_position_embeddings":512,
            "layer_types":["linear_attention","linear_attention","linear_attention","full_attention"],
            "linear_conv_kernel_dim":4,"linear_key_head_dim":16,"linear_value_head_dim":16,
            "linear_num_key_heads":2,"linear_num_value_heads":4,
            "rope_parameters":{"rope_type":"default","rope_theta":1e7,"partial_rotary_factor":0.25,
                "mrope_section":[11,11,10],"mrope_interleaved":true}})
    }

    fn with(f: &dyn Fn(&mut Map<String, Value>)) -> anyhow::Result<HfConfig> {
        let mut v = base();
        f(v.as_object_mut().unwrap());
        ModelConfig::parse_hf_config(&v.to_string())
    }

    #[test]
    fn defaults_are_named_and_bad_values_refused() {
        let h = with(&|_| {}).unwrap();
        assert_eq!(h.config.rotary_dim, 8);
        assert!(
            h.warnings.iter().any(|w| w.contains("mrope_section")),
            "{:?}",
            h.warnings
        );
        for (field, value) in [
            ("linear_conv_kernel_dim", "4"),
            ("linear_num_value_heads", "32"),
            ("head_dim", "256"),
            ("num_key_value_heads", "4"),
            ("layer_types", "every 4"),
        ] {
            let h = with(&|m| {
                m.remove(field);
            });
            let h = match h {
                Ok(h) => h,
                // Removing a dimension may make another check fail; it must name a field.
                Err(e) => {
                    assert!(
                        format!("{e:#}").contains("field") || format!("{e:#}").contains("multiple"),
                        "{field}: {e:#}"
                    );
                    continue;
                }
            };
            assert!(
                h.warnings
                    .iter()
                    .any(|w| w.contains(field) && w.contains(value)),
                "{field}: {:?}",
                h.warnings
            );
        }
        let h = with(&|m| {
            m.get_mut("rope_parameters")
                .unwrap()
                .as_object_mut()
                .unwrap()
                .remove("partial_rotary_factor");
        })
        .unwrap();
        assert!(h
            .warnings
            .iter()
            .any(|w| w.contains("partial_rotary_factor") && w.contains("0.25")));
        for (f, want) in [
            (
                serde_json::json!({"attn_output_gate": false}),
                "attn_output_gate",
            ),
            (
                serde_json::json!({"layer_types": ["linear_attention","sliding_attention","linear_attention","full_attention"]}),
                "sliding_attention",
            ),
            (
                serde_json::json!({"layer_types": ["full_attention"]}),
                "1 entries",
            ),
            (serde_json::json!({"linear_num_value_heads": 3}), "multiple"),
            (
                serde_json::json!({"partial_rotary_factor": 0.5}),
                "disagree",
            ),
            (serde_json::json!({"hidden_act": "gelu"}), "gelu"),
            (
                serde_json::json!({"architectures": ["Qwen3_5ForConditionalGeneration"]}),
                "Qwen3_5ForConditionalGeneration",
            ),
            (
                serde_json::json!({"model_type": "qwen3_next"}),
                "Qwen3-Next",
            ),
            (
                serde_json::json!({"model_type": "qwen3_5_moe_text"}),
                "Qwen3_5MoeForCausalLM",
            ),
            (
                serde_json::json!({"architectures": ["Qwen3NextForCausalLM"]}),
                "Qwen3-Next",
            ),
        ] {
            let e = with(&|m| {
                for (k, v) in f.as_object().unwrap() {
                    m.insert(k.clone(), v.clone());
                }
            })
            .unwrap_err();
            assert!(format!("{e:#}").contains(want), "{want}: {e:#}");
        }
    }

    #[test]
    fn the_conditional_generation_wrapper_reads_its_text_config() {
        let mut text = base();
        text.as_object_mut().unwrap().remove("tie_word_embeddings");
        let wrapped = serde_json::json!({
            "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "text_config": text, "vision_config": {"depth": 27, "hidden_size": 1152},
            "tie_word_embeddings": false, "dtype": "bfloat16"
        });
        let h = ModelConfig::parse_hf_config(&wrapped.to_string()).unwrap();
        assert!(
            !h.config.tie_word_embeddings,
            "the wrapper's tie_word_embeddings wins"
        );
        assert!(
            h.warnings.is_empty() || h.warnings.iter().all(|w| !w.contains("absent")),
            "{:?}",
            h.warnings
        );
        assert!(
            h.warnings
                .iter()
                .any(|w| w.contains("vision tower") && w.contains("model.visual")),
            "{:?}",
            h.warnings
        );
        assert!(h.config.is_hybrid());
        // Two tie_word_embeddings that disagree: an error naming both.
        let mut bad = wrapped.clone();
        bad["text_config"]["tie_word_embeddings"] = serde_json::json!(true);
        let e = format!(
            "{:#}",
            ModelConfig::parse_hf_config(&bad.to_string()).unwrap_err()
        );
        assert!(
            e.contains("text_config.tie_word_embeddings") && e.contains("disagree"),
            "{e}"
        );
        // The MoE sibling, wrapped, reads as a hybrid with a sparse block on every layer.
        let text = std::fs::read_to_string(
            "tests/fixtures/real/configs/nvidia--Qwen3.6-35B-A3B-NVFP4__config.json",
        )
        .expect("tests/fixtures/real/configs/nvidia--Qwen3.6-35B-A3B-NVFP4__config.json");
        let h = ModelConfig::parse_hf_config(&text).unwrap();
        assert!(h.config.is_hybrid() && h.config.is_moe());
        assert!(
            h.warnings.iter().any(|w| w.contains("vision tower")),
            "{:?}",
            h.warnings
        );
    }
}
