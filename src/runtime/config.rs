//! Configuration: the model's shape ([`ModelConfig`], read from a Hugging Face `config.json` or a
//! named preset) and the server's settings ([`ServeConfig`], the fields behind `rigbench serve`'s
//! flags), plus the small enums they use and the human-size parser for `--kv-cache-memory`.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::RigError;

/// The decoder families the runtime runs. All are pre-norm decoders with RMSNorm, GQA
/// attention with RoPE and a SwiGLU MLP; Qwen3 adds a per-head RMSNorm on q and k before RoPE
/// (`Qwen3Attention.q_norm` / `k_norm` in Hugging Face transformers); Qwen3.5 / 3.6 mix
/// Gated-DeltaNet layers with gated full-attention layers (see [`super::hybrid`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `model_type: "qwen3"` (Qwen3ForCausalLM): q/k RMSNorm per head, no attention bias.
    Qwen3,
    /// `model_type: "llama"` (LlamaForCausalLM): no q/k norm, no attention bias.
    Llama,
    /// `model_type: "qwen3_5_text"` (Qwen3_5ForCausalLM) and the text part of `qwen3_5`
    /// (Qwen3_5ForConditionalGeneration): Gated-DeltaNet + gated attention hybrid; the layer mix
    /// and the Gated-DeltaNet dimensions are in [`ModelConfig::hybrid`].
    Qwen35,
}

/// RoPE frequency scaling (the `rope_scaling` entry of `config.json`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE: `inv_freq[i] = theta^(-2i/d)` (Su et al., RoFormer, 2021).
    None,
    /// Linear position interpolation (transformers `_compute_linear_scaling_rope_parameters`):
    /// every inverse frequency divided by `factor`.
    Linear {
        /// `factor`.
        factor: f32,
    },
    /// Llama 3.1's frequency-dependent scaling (transformers `_compute_llama3_parameters`).
    Llama3 {
        /// `factor`.
        factor: f32,
        /// `low_freq_factor`.
        low_freq_factor: f32,
        /// `high_freq_factor`.
        high_freq_factor: f32,
        /// `original_max_position_embeddings`.
        original_max_position_embeddings: f32,
    },
}

/// The shape of a decoder (dense Qwen3 / Llama, or a Qwen3.5 / 3.6 Gated-DeltaNet hybrid), as in
/// Hugging Face `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The family (from `model_type`).
    pub arch: Arch,
    /// Hidden size H (`hidden_size`).
    pub hidden_size: usize,
    /// MLP inner size (`intermediate_size`).
    pub intermediate_size: usize,
    /// Decoder layers (`num_hidden_layers`).
    pub num_layers: usize,
    /// Query heads (`num_attention_heads`).
    pub num_heads: usize,
    /// Key/value heads (`num_key_value_heads`; GQA when fewer than `num_heads`).
    pub num_kv_heads: usize,
    /// Per-head dimension (`head_dim`, else `hidden_size / num_attention_heads`).
    pub head_dim: usize,
    /// Vocabulary rows of the embedding and lm_head (`vocab_size`).
    pub vocab_size: usize,
    /// RMSNorm epsilon (`rms_norm_eps`).
    pub rms_norm_eps: f32,
    /// RoPE base (`rope_theta`).
    pub rope_theta: f32,
    /// RoPE scaling.
    pub rope_scaling: RopeScaling,
    /// Longest context the model was built for (`max_position_embeddings`).
    pub max_position_embeddings: usize,
    /// Whether lm_head shares the embedding matrix (`tie_word_embeddings`).
    pub tie_word_embeddings: bool,
    /// End-of-sequence ids from `config.json` (`eos_token_id`, a number or a list).
    pub eos_token_ids: Vec<u32>,
    /// Leading dimensions of each head that RoPE rotates (`head_dim · partial_rotary_factor`;
    /// `head_dim` for full rotary embeddings). The rest pass through unrotated (transformers'
    /// `apply_rotary_pos_emb` with `rotary_dim = cos.shape[-1]`).
    pub rotary_dim: usize,
    /// The Gated-DeltaNet layer mix of a hybrid ([`Arch::Qwen35`]); `None` for dense decoders.
    pub hybrid: Option<super::hybrid::HybridConfig>,
}

/// `model_type` values the built-in runtime runs.
pub const SUPPORTED_MODEL_TYPES: [&str; 4] = ["qwen3", "llama", "qwen3_5_text", "qwen3_5"];

/// `architectures` entries the built-in runtime runs (one per supported `model_type`).
pub const SUPPORTED_ARCHITECTURES: [&str; 4] = [
    "Qwen3ForCausalLM",
    "LlamaForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration",
];

/// RoPE types the built-in runtime implements (`rope_parameters.rope_type` /
/// `rope_scaling.rope_type`).
pub const SUPPORTED_ROPE_TYPES: [&str; 3] = ["default", "linear", "llama3"];

/// A parsed `config.json`: the shape, and what the reader had to assume.
#[derive(Debug, Clone, PartialEq)]
pub struct HfConfig {
    /// The decoder's shape.
    pub config: ModelConfig,
    /// Fields that were absent and took a default, each naming the field, the value used and
    /// whose default it is. Print them: a wrong default changes every output token.
    pub warnings: Vec<String>,
    /// Model dtype: `dtype` (transformers 5) or `torch_dtype` (older), if stated.
    pub dtype: Option<String>,
}

/// Reads an optional number field of a JSON object (object, key, path prefix for messages).
pub(super) type FloatField =
    dyn Fn(&serde_json::Map<String, serde_json::Value>, &str, &str) -> anyhow::Result<Option<f64>>;

/// RoPE base and scaling from `rope_parameters` (transformers 5) or `rope_theta` +
/// `rope_scaling` (older). Both forms present and disagreeing is an error; neither giving a base
/// takes transformers' default 10,000 with a warning.
///
/// `partial_ok`: the caller reads `partial_rotary_factor` and the `mrope_*` fields itself (the
/// Qwen3.5 family), so they are not refused here.
pub(super) fn parse_rope(
    root: &serde_json::Map<String, serde_json::Value>,
    family: &str,
    warnings: &mut Vec<String>,
    float: &FloatField,
    partial_ok: bool,
) -> anyhow::Result<(f32, RopeScaling)> {
    use serde_json::Value;
    let obj = |key: &str| -> anyhow::Result<Option<&serde_json::Map<String, Value>>> {
        match root.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(other) => anyhow::bail!("field {key}: expected an object, found {other}"),
        }
    };
    let mut params = obj("rope_parameters")?;
    let mut params_at = "rope_parameters.".to_string();
    // Per-layer-type parameters ({"full_attention": {...}, ...}): every layer here is full
    // attention.
    if let Some(p) = params {
        if !p.is_empty() && p.values().all(Value::is_object) {
            match p.get("full_attention") {
                Some(Value::Object(f)) => {
                    params = Some(f);
                    params_at = "rope_parameters.full_attention.".into();
                }
                _ => anyhow::bail!(
                    "rope_parameters has per-layer-type entries but none for full_attention"
                ),
            }
        }
    }
    let scaling = obj("rope_scaling")?;
    let top_theta = float(root, "rope_theta", "")?;
    let p_theta = match params {
        Some(p) => float(p, "rope_theta", &params_at)?,
        None => None,
    };
    let theta = match (p_theta, top_theta) {
        (Some(a), Some(b)) if (a - b).abs() > 1e-6 * a.abs().max(b.abs()) => anyhow::bail!(
            "{params_at}rope_theta = {a} and rope_theta = {b} disagree; fix config.json so that one RoPE base remains"
        ),
        (Some(a), _) | (None, Some(a)) => a,
        (None, None) => {
            warnings.push(format!(
                "rope_theta absent (neither rope_parameters.rope_theta nor rope_theta): using 10000 ({family}'s default)"
            ));
            10_000.0
        }
    };
    if !(theta > 0.0 && theta.is_finite()) {
        anyhow::bail!("rope_theta = {theta}; expected a positive number");
    }
    if let Some(f) = float(root, "partial_rotary_factor", "")?.filter(|_| !partial_ok) {
        if f != 1.0 {
            anyhow::bail!("partial_rotary_factor = {f}: only full rotary embeddings are supported");
        }
    }
    let kind_of = |m: &serde_json::Map<String, Value>| -> Option<String> {
        m.get("rope_type")
            .or_else(|| m.get("type"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    // The scaling description: rope_parameters in transformers 5, rope_scaling before.
    let (desc, at) = match (params, scaling) {
        (Some(p), Some(s)) => {
            let (a, b) = (
                kind_of(p).unwrap_or_else(|| "default".into()),
                kind_of(s).unwrap_or_else(|| "default".into()),
            );
            if a != b {
                anyhow::bail!(
                    "{params_at}rope_type = {a} and rope_scaling type = {b} disagree; fix config.json so that one RoPE description remains"
                );
            }
            (Some(p), params_at.clone())
        }
        (Some(p), None) => (Some(p), params_at.clone()),
        (None, Some(s)) => (Some(s), "rope_scaling.".to_string()),
        (None, None) => (None, String::new()),
    };
    let Some(d) = desc else {
        return Ok((theta as f32, RopeScaling::None));
    };
    let kind = kind_of(d).unwrap_or_else(|| "default".into());
    let allowed: &[&str] = match kind.as_str() {
        "default" => &[],
        "linear" => &["factor"],
        "llama3" => &[
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        ],
        other => anyhow::bail!(
            "{at}rope_type '{other}' is not supported by the built-in runtime (supported: {})",
            SUPPORTED_ROPE_TYPES.join(", ")
        ),
    };
    for (k, v) in d {
        if matches!(k.as_str(), "rope_type" | "type" | "rope_theta")
            || allowed.contains(&k.as_str())
        {
            continue;
        }
        if k == "partial_rotary_factor" && v.as_f64() == Some(1.0) {
            continue;
        }
        if partial_ok
            && matches!(
                k.as_str(),
                "partial_rotary_factor" | "mrope_section" | "mrope_interleaved"
            )
        {
            continue;
        }
        anyhow::bail!(
            "{at}{k} = {v} is not understood by the built-in runtime for rope_type '{kind}' (it reads {})",
            if allowed.is_empty() { "only rope_theta".to_string() } else { format!("rope_theta, {}", allowed.join(", ")) }
        );
    }
    let req = |k: &str| -> anyhow::Result<f32> {
        match float(d, k, &at)? {
            Some(v) if v > 0.0 && v.is_finite() => Ok(v as f32),
            Some(v) => anyhow::bail!("{at}{k} = {v}; expected a positive number"),
            None => anyhow::bail!("{at}{k} is required for rope_type '{kind}'"),
        }
    };
    let scaling = match kind.as_str() {
        "linear" => RopeScaling::Linear {
            factor: req("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: req("factor")?,
            low_freq_factor: req("low_freq_factor")?,
            high_freq_factor: req("high_freq_factor")?,
            original_max_position_embeddings: req("original_max_position_embeddings")?,
        },
        _ => RopeScaling::None,
    };
    if let RopeScaling::Llama3 {
        low_freq_factor,
        high_freq_factor,
        ..
    } = scaling
    {
        if high_freq_factor <= low_freq_factor {
            anyhow::bail!(
                "{at}high_freq_factor ({high_freq_factor}) must exceed low_freq_factor ({low_freq_factor})"
            );
        }
    }
    Ok((theta as f32, scaling))
}

/// The named presets of `--model synthetic:NAME`.
pub const PRESETS: [&str; 5] = [
    "tiny",
    "qwen3-8b",
    "qwen3-32b",
    "tiny-hybrid",
    "qwen3.6-27b",
];

impl ModelConfig {
    /// The `synthetic:tiny` shape: 2 layers, H = 64, 4 query heads and 2 KV heads of 16, MLP 192,
    /// vocabulary 320 (the 256 bytes, the 5 special tokens of the byte-level tokenizer and
    /// reserved ids), tied lm_head. Small enough that a 64-token generation takes milliseconds
    /// on one CPU core.
    pub fn tiny() -> Self {
        ModelConfig {
            arch: Arch::Qwen3,
            hidden_size: 64,
            intermediate_size: 192,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            vocab_size: 320,
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            rope_scaling: RopeScaling::None,
            max_position_embeddings: 32_768,
            tie_word_embeddings: true,
            eos_token_ids: vec![crate::runtime::tokenizer::ByteTokenizer::ENDOFTEXT],
            rotary_dim: 16,
            hybrid: None,
        }
    }

    /// A preset by name (`tiny`, `qwen3-8b`, `qwen3-32b`, `tiny-hybrid`, `qwen3.6-27b`). The
    /// Qwen3 presets carry the dimensions of the published `Qwen/Qwen3-8B` and `Qwen/Qwen3-32B`
    /// `config.json` files; `qwen3.6-27b` those of `Qwen/Qwen3.6-27B`'s text decoder
    /// ([`super::hybrid::qwen36_27b`]); `tiny-hybrid` is a small Gated-DeltaNet hybrid for tests.
    pub fn preset(name: &str) -> Option<Self> {
        let qwen3 = |hidden, inter, layers, heads| ModelConfig {
            arch: Arch::Qwen3,
            hidden_size: hidden,
            intermediate_size: inter,
            num_layers: layers,
            num_heads: heads,
            num_kv_heads: 8,
            head_dim: 128,
            vocab_size: 151_936,
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            rope_scaling: RopeScaling::None,
            max_position_embeddings: 40_960,
            tie_word_embeddings: false,
            // Qwen3's <|im_end|> (151645) and <|endoftext|> (151643).
            eos_token_ids: vec![151_645, 151_643],
            rotary_dim: 128,
            hybrid: None,
        };
        match name {
            "tiny" => Some(Self::tiny()),
            "qwen3-8b" => Some(qwen3(4096, 12288, 36, 32)),
            "qwen3-32b" => Some(qwen3(5120, 25600, 64, 64)),
            "tiny-hybrid" => Some(super::hybrid::tiny_hybrid()),
            "qwen3.6-27b" => Some(super::hybrid::qwen36_27b()),
            _ => None,
        }
    }

    /// Read a Hugging Face `config.json` (see [`Self::parse_hf_config`]).
    ///
    /// # Errors
    /// [`RigError::BadFile`] naming the file when it is unreadable, not JSON, of an unsupported
    /// `model_type` or architecture, or inconsistent (e.g. heads not dividing).
    pub fn read_hf_config(path: &Path) -> anyhow::Result<HfConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| RigError::file(path, format!("cannot read the model config: {e}")))?;
        Self::parse_hf_config(&text).map_err(|e| RigError::file(path, format!("{e:#}")).into())
    }

    /// The text of a `config.json` as the runtime reads it ([`ModelConfig::parse_hf_config`]):
    /// its warnings and whether it is a Gated-DeltaNet hybrid, or why it refuses the model (the
    /// whole error chain). `inspect` consults it
    /// ([`crate::checkpoint::runtime::ConfigReader`]).
    ///
    /// # Errors
    /// The refusal, as text.
    pub fn check_hf_config(text: &str) -> Result<(Vec<String>, bool), String> {
        Self::parse_hf_config(text)
            .map(|h| {
                let hybrid = h.config.is_hybrid();
                (h.warnings, hybrid)
            })
            .map_err(|e| format!("{e:#}"))
    }

    /// Parse the text of a Hugging Face `config.json`, in the form transformers 5 writes
    /// (`rope_parameters` holding `rope_theta`, `rope_type` and the scaling fields; `dtype`) and
    /// in the older one (`rope_theta` and `rope_scaling` at the top level; `torch_dtype`).
    ///
    /// Every field that changes the math is read or refused: a missing one takes the default
    /// transformers' `Qwen3Config` / `LlamaConfig` gives it and says so in
    /// [`HfConfig::warnings`] (naming the value used); a value the runtime does not implement
    /// (another RoPE type, a sliding-window layer, an activation other than SiLU, biases, a
    /// partial rotary factor) is an error.
    ///
    /// # Errors
    /// Not JSON; an unsupported `model_type` or `architectures` entry (the message lists the
    /// supported ones); a required field missing or of the wrong type; an unsupported value.
    pub fn parse_hf_config(text: &str) -> anyhow::Result<HfConfig> {
        use serde_json::Value;
        let root: Value = serde_json::from_str(text).context("not valid JSON for a config.json")?;
        let Value::Object(root) = root else {
            anyhow::bail!("not a JSON object (a config.json is one)");
        };
        let mut warnings = Vec::new();
        // The Qwen3.5 / 3.6 family (and its siblings, refused by name) has its own reader.
        if let Some(h) = super::hybrid::parse_family(&root)? {
            return Ok(h);
        }
        refuse_wrapper_config(&root)?;
        let arch = parse_arch(&root)?;
        let family = match arch {
            Arch::Qwen3 => "Qwen3Config",
            Arch::Llama => "LlamaConfig",
            Arch::Qwen35 => "Qwen3_5TextConfig",
        };
        let uint = |key: &str| -> anyhow::Result<Option<usize>> {
            match root.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Number(n)) => match n.as_u64() {
                    Some(v) => Ok(Some(v as usize)),
                    None => {
                        anyhow::bail!("field {key}: expected a non-negative integer, found {n}")
                    }
                },
                Some(other) => {
                    anyhow::bail!("field {key}: expected a non-negative integer, found {other}")
                }
            }
        };
        let float = |obj: &serde_json::Map<String, Value>,
                     key: &str,
                     at: &str|
         -> anyhow::Result<Option<f64>> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Number(n)) => Ok(n.as_f64()),
                Some(other) => anyhow::bail!("field {at}{key}: expected a number, found {other}"),
            }
        };
        let boolean = |key: &str| -> anyhow::Result<Option<bool>> {
            match root.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Bool(b)) => Ok(Some(*b)),
                Some(other) => anyhow::bail!("field {key}: expected true or false, found {other}"),
            }
        };
        let need = |key: &str| -> anyhow::Result<usize> {
            match uint(key)? {
                Some(0) => anyhow::bail!("field '{key}' is 0"),
                Some(x) => Ok(x),
                None => anyhow::bail!("missing field '{key}'"),
            }
        };
        if boolean("attention_bias")? == Some(true) || boolean("mlp_bias")? == Some(true) {
            anyhow::bail!(
                "attention_bias/mlp_bias = true is not supported by the built-in runtime"
            );
        }
        match root.get("hidden_act") {
            None | Some(Value::Null) => warnings.push(format!(
                "hidden_act absent: using silu ({family}'s default)"
            )),
            Some(Value::String(s)) if s == "silu" => {}
            Some(other) => anyhow::bail!(
                "hidden_act {other} is not supported; the built-in runtime implements SwiGLU with silu"
            ),
        }
        if boolean("use_sliding_window")? == Some(true) {
            anyhow::bail!(
                "use_sliding_window = true: sliding-window attention is not supported by the built-in runtime"
            );
        }
        if let Some(Value::Array(types)) = root.get("layer_types") {
            for (i, t) in types.iter().enumerate() {
                if t.as_str() != Some("full_attention") {
                    anyhow::bail!(
                        "layer_types[{i}] = {t}: the built-in runtime runs full_attention layers only"
                    );
                }
            }
        }
        let hidden_size = need("hidden_size")?;
        let num_heads = need("num_attention_heads")?;
        let num_kv_heads = match uint("num_key_value_heads")? {
            Some(n) => n,
            None => {
                warnings.push(format!(
                    "num_key_value_heads absent: using num_attention_heads = {num_heads} (multi-head attention, {family}'s default)"
                ));
                num_heads
            }
        };
        if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            anyhow::bail!(
                "num_attention_heads ({num_heads}) is not a multiple of num_key_value_heads ({num_kv_heads})"
            );
        }
        let head_dim = match uint("head_dim")? {
            Some(d) if d > 0 => d,
            Some(_) => anyhow::bail!("field 'head_dim' is 0"),
            None => {
                // transformers: Qwen3Config(head_dim=128); LlamaConfig derives H / heads.
                let d = match arch {
                    Arch::Qwen3 => 128,
                    Arch::Qwen35 => 256,
                    Arch::Llama => {
                        if hidden_size % num_heads != 0 {
                            anyhow::bail!(
                                "no head_dim and hidden_size is not a multiple of num_attention_heads"
                            );
                        }
                        hidden_size / num_heads
                    }
                };
                warnings.push(format!("head_dim absent: using {d} ({family}'s default)"));
                d
            }
        };
        if head_dim % 2 != 0 {
            anyhow::bail!("head_dim {head_dim} is odd; RoPE needs an even head_dim");
        }
        let (rope_theta, rope_scaling) = parse_rope(&root, family, &mut warnings, &float, false)?;
        let rms_norm_eps = match float(&root, "rms_norm_eps", "")? {
            Some(e) if e > 0.0 && e.is_finite() => e as f32,
            Some(e) => anyhow::bail!("rms_norm_eps = {e}; expected a small positive number"),
            None => {
                warnings.push(format!(
                    "rms_norm_eps absent: using 1e-6 ({family}'s default)"
                ));
                1e-6
            }
        };
        let tie_word_embeddings = match boolean("tie_word_embeddings")? {
            Some(b) => b,
            None => {
                warnings.push(format!(
                    "tie_word_embeddings absent: using false ({family}'s default): lm_head.weight must be in the checkpoint"
                ));
                false
            }
        };
        let max_position_embeddings = match uint("max_position_embeddings")? {
            Some(n) if n > 0 => n,
            _ => {
                let d = match arch {
                    Arch::Qwen3 | Arch::Qwen35 => 32_768,
                    Arch::Llama => 2048,
                };
                warnings.push(format!(
                    "max_position_embeddings absent: using {d} ({family}'s default)"
                ));
                d
            }
        };
        let dtype = config_dtype(&root, &mut warnings);
        let eos_token_ids = config_eos_token_ids(&root);
        Ok(HfConfig {
            config: ModelConfig {
                arch,
                hidden_size,
                intermediate_size: need("intermediate_size")?,
                num_layers: need("num_hidden_layers")?,
                num_heads,
                num_kv_heads,
                head_dim,
                vocab_size: need("vocab_size")?,
                rms_norm_eps,
                rope_theta,
                rope_scaling,
                max_position_embeddings,
                tie_word_embeddings,
                eos_token_ids,
                rotary_dim: head_dim,
                hybrid: None,
            },
            warnings,
            dtype,
        })
    }

    /// Query projection width: `num_heads · head_dim`.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Key (or value) projection width: `num_kv_heads · head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Whether the family has Qwen3's per-head q/k RMSNorm (Qwen3.5's attention layers have it
    /// too).
    pub fn has_qk_norm(&self) -> bool {
        matches!(self.arch, Arch::Qwen3 | Arch::Qwen35)
    }

    /// RoPE inverse frequencies, `rotary_dim / 2` of them (rotate-half convention of
    /// transformers' `rotate_half` over the first `rotary_dim` dimensions: pairs are
    /// `(x[i], x[i + rotary_dim/2])`; `inv_freq[i] = theta^(-2i / rotary_dim)`, as
    /// transformers' `compute_default_rope_parameters` with `partial_rotary_factor`).
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let d = self.rotary_dim;
        let base: Vec<f64> = (0..d / 2)
            .map(|i| 1.0 / (self.rope_theta as f64).powf(2.0 * i as f64 / d as f64))
            .collect();
        match self.rope_scaling {
            RopeScaling::None => base.iter().map(|x| *x as f32).collect(),
            RopeScaling::Linear { factor } => {
                base.iter().map(|x| (*x / factor as f64) as f32).collect()
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let (factor, lo, hi, omax) = (
                    factor as f64,
                    low_freq_factor as f64,
                    high_freq_factor as f64,
                    original_max_position_embeddings as f64,
                );
                let low_freq_wavelen = omax / lo;
                let high_freq_wavelen = omax / hi;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        let v = if wavelen < high_freq_wavelen {
                            f
                        } else if wavelen > low_freq_wavelen {
                            f / factor
                        } else {
                            let smooth = (omax / wavelen - lo) / (hi - lo);
                            (1.0 - smooth) * f / factor + smooth * f
                        };
                        v as f32
                    })
                    .collect()
            }
        }
    }

    /// Parameters of the decoder (embedding, layers, final norm, lm_head when untied).
    pub fn num_params(&self) -> u64 {
        if let Some(hy) = &self.hybrid {
            return hy.num_params(self);
        }
        let h = self.hidden_size as u64;
        let per_layer = h * (self.q_dim() as u64) * 2
            + h * (self.kv_dim() as u64) * 2
            + 3 * h * self.intermediate_size as u64
            + 2 * h;
        let emb = self.vocab_size as u64 * h;
        emb * if self.tie_word_embeddings { 1 } else { 2 } + per_layer * self.num_layers as u64 + h
    }
}

/// Refuse a multimodal or wrapper config (no top-level hidden_size, a text_config), naming both model types.
fn refuse_wrapper_config(root: &serde_json::Map<String, serde_json::Value>) -> anyhow::Result<()> {
    use serde_json::Value;
    if root.get("hidden_size").is_none() && root.get("text_config").is_some_and(|v| !v.is_null()) {
        let inner = root
            .get("text_config")
            .and_then(|t| t.get("model_type"))
            .and_then(Value::as_str)
            .unwrap_or("?");
        let outer = root
            .get("model_type")
            .and_then(Value::as_str)
            .unwrap_or("?");
        anyhow::bail!(
            "model_type '{outer}' (text_config.model_type '{inner}') is a multimodal/wrapper \
                 config; the built-in runtime runs dense text decoders of model_type {} \
                 (architectures {})",
            SUPPORTED_MODEL_TYPES.join(", "),
            SUPPORTED_ARCHITECTURES.join(", ")
        );
    }
    Ok(())
}

/// The architecture from `model_type`, checked against every `architectures` entry.
fn parse_arch(root: &serde_json::Map<String, serde_json::Value>) -> anyhow::Result<Arch> {
    use serde_json::Value;
    let model_type = match root.get("model_type") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => anyhow::bail!(
            "no model_type; the built-in runtime runs model_type {} (architectures {})",
            SUPPORTED_MODEL_TYPES.join(", "),
            SUPPORTED_ARCHITECTURES.join(", ")
        ),
        Some(other) => anyhow::bail!("field model_type: expected a string, found {other}"),
    };
    let arch = match model_type.as_str() {
        "qwen3" => Arch::Qwen3,
        "llama" => Arch::Llama,
        other => anyhow::bail!(
            "model_type '{other}' is not supported by the built-in runtime; it runs model_type \
                 {} (architectures {}); use an external engine (--url / --engine-cmd) for others",
            SUPPORTED_MODEL_TYPES.join(", "),
            SUPPORTED_ARCHITECTURES.join(", ")
        ),
    };
    if let Some(Value::Array(a)) = root.get("architectures") {
        let want = match arch {
            Arch::Qwen3 => "Qwen3ForCausalLM",
            Arch::Llama => "LlamaForCausalLM",
            Arch::Qwen35 => "Qwen3_5ForCausalLM",
        };
        for v in a {
            let name = v.as_str().unwrap_or("(not a string)");
            if name != want {
                anyhow::bail!(
                    "architecture '{name}' is not supported by the built-in runtime for \
                         model_type '{model_type}'; supported architectures: {}",
                    SUPPORTED_ARCHITECTURES.join(", ")
                );
            }
        }
    }
    Ok(arch)
}

/// The weights' dtype: `dtype`, else `torch_dtype` (a warning when they disagree).
fn config_dtype(
    root: &serde_json::Map<String, serde_json::Value>,
    warnings: &mut Vec<String>,
) -> Option<String> {
    use serde_json::Value;
    match (
        root.get("dtype").and_then(Value::as_str),
        root.get("torch_dtype").and_then(Value::as_str),
    ) {
        (Some(a), Some(b)) if a != b => {
            warnings.push(format!(
                "dtype = {a} and torch_dtype = {b} disagree: using dtype (transformers 5 reads dtype)"
            ));
            Some(a.to_string())
        }
        (Some(a), _) => Some(a.to_string()),
        (None, Some(b)) => Some(b.to_string()),
        (None, None) => None,
    }
}

/// `eos_token_id`: one id or a list.
fn config_eos_token_ids(root: &serde_json::Map<String, serde_json::Value>) -> Vec<u32> {
    use serde_json::Value;
    match root.get("eos_token_id") {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().map(|x| x as u32))
            .collect(),
        _ => Vec::new(),
    }
}

/// How linear-layer weights are stored (and dequantized on the fly in the matmul).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// BF16 weights, f32 activations and accumulation.
    Bf16,
    /// FP8 E4M3 weights with an FP32 per-tensor scale (ModelOpt FP8); activations quantized to
    /// E4M3 per token (dynamic) or with the checkpoint's static `input_scale` ("W8A8").
    Fp8,
    /// NVFP4 weights (ModelOpt layout: E2M1, E4M3 scale per 16 along K, FP32 per-tensor scale),
    /// f32 activations ("W4A16").
    Nvfp4,
}

impl WeightFormat {
    /// `bf16`, `fp8`, `nvfp4`.
    pub fn id(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::Fp8 => "fp8",
            Self::Nvfp4 => "nvfp4",
        }
    }
}

impl std::str::FromStr for WeightFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "bf16" => Ok(Self::Bf16),
            "fp8" | "w8a8" => Ok(Self::Fp8),
            "nvfp4" | "w4a16" => Ok(Self::Nvfp4),
            other => Err(format!(
                "unknown weight format '{other}'; expected bf16, fp8 or nvfp4"
            )),
        }
    }
}

/// What `--quantize` asks for: one format for every decoder linear, or NVIDIA's mixed recipe of
/// the Qwen3.5 / 3.6 hybrids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantRecipe {
    /// Every decoder linear in this format; the embedding, the lm_head and Gated-DeltaNet's
    /// `in_proj_a` / `in_proj_b` stay BF16 (as ModelOpt exports leave them).
    Uniform(WeightFormat),
    /// The recipe of NVIDIA's ModelOpt export `Qwen3.6-27B-NVFP4` (`quant_algo:
    /// MIXED_PRECISION`): MLP gate/up/down and the lm_head W4A16 NVFP4 (group 16); attention
    /// q/k/v/o and Gated-DeltaNet in_proj_qkv / in_proj_z / out_proj FP8 E4M3 (per-tensor
    /// weight scale; activations quantized per token here, as no calibration data exists for
    /// synthetic weights); Gated-DeltaNet in_proj_a / in_proj_b BF16.
    Nvfp4Mixed,
}

impl QuantRecipe {
    /// `bf16`, `fp8`, `nvfp4`, `nvfp4-mixed`.
    pub fn id(self) -> &'static str {
        match self {
            Self::Uniform(f) => f.id(),
            Self::Nvfp4Mixed => "nvfp4-mixed",
        }
    }

    /// The format of a decoder linear of `role`.
    pub fn format_for(self, role: super::weights::LinearRole) -> WeightFormat {
        use super::weights::LinearRole as R;
        match (self, role) {
            (_, R::GdnA | R::GdnB) => WeightFormat::Bf16,
            (Self::Uniform(f), _) => f,
            (Self::Nvfp4Mixed, R::Gate | R::Up | R::Down) => WeightFormat::Nvfp4,
            (Self::Nvfp4Mixed, _) => WeightFormat::Fp8,
        }
    }

    /// The format of an untied lm_head: BF16, or NVFP4 in the mixed recipe.
    pub fn lm_head_format(self) -> WeightFormat {
        match self {
            Self::Uniform(_) => WeightFormat::Bf16,
            Self::Nvfp4Mixed => WeightFormat::Nvfp4,
        }
    }
}

impl From<WeightFormat> for QuantRecipe {
    fn from(f: WeightFormat) -> Self {
        Self::Uniform(f)
    }
}

impl std::str::FromStr for QuantRecipe {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "nvfp4-mixed" | "nvfp4_mixed" | "mixed" => Ok(Self::Nvfp4Mixed),
            other => other.parse::<WeightFormat>().map(Self::Uniform).map_err(|_| {
                format!(
                    "unknown quantization '{other}'; expected bf16, fp8, nvfp4 or nvfp4-mixed (NVIDIA's Qwen3.6-NVFP4 recipe: NVFP4 MLP and lm_head, FP8 attention and Gated-DeltaNet projections, BF16 in_proj_a/in_proj_b)"
                )
            }),
        }
    }
}

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCacheDtype {
    /// BF16, 2 bytes per element.
    Bf16,
    /// FP8 E4M3 with one FP32 scale per layer for K and one for V (vLLM's `fp8_e4m3` KV cache:
    /// stored = e4m3(x / scale); scales from the checkpoint's `k_scale`/`v_scale`, else 1.0).
    Fp8,
}

impl KvCacheDtype {
    /// Bytes per element: 2 or 1.
    pub fn bytes(self) -> usize {
        match self {
            Self::Bf16 => 2,
            Self::Fp8 => 1,
        }
    }

    /// vLLM's `cache_dtype` label: `bfloat16` (vLLM says `auto` for the model dtype) or
    /// `fp8_e4m3`.
    pub fn vllm_name(self) -> &'static str {
        match self {
            Self::Bf16 => "bfloat16",
            Self::Fp8 => "fp8_e4m3",
        }
    }
}

impl std::str::FromStr for KvCacheDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "bf16" | "bfloat16" | "auto" => Ok(Self::Bf16),
            "fp8" | "fp8_e4m3" | "e4m3" => Ok(Self::Fp8),
            other => Err(format!(
                "unknown KV cache dtype '{other}'; expected bf16 or fp8"
            )),
        }
    }
}

/// Speculative decoding settings (off when [`ServeConfig::speculative`] is `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecConfig {
    /// k: draft tokens proposed per step (≥ 1).
    pub num_speculative_tokens: usize,
    /// Shortest n-gram the prompt-lookup drafter matches (vLLM `prompt_lookup_min`).
    pub prompt_lookup_min: usize,
    /// Longest n-gram it tries first (vLLM `prompt_lookup_max`).
    pub prompt_lookup_max: usize,
}

/// Everything `rigbench serve` needs; build it in code with [`ServeConfig::tiny`] and adjust
/// fields, or from the command line through `crate::cli::serve::ServeArgs`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    /// `synthetic:tiny`, `synthetic:qwen3-8b`, `synthetic:qwen3-32b`, `synthetic:tiny-hybrid`,
    /// `synthetic:qwen3.6-27b`, or a checkpoint directory
    /// (with `config.json`, `*.safetensors`, optionally `tokenizer.json`,
    /// `tokenizer_config.json`, `generation_config.json`).
    pub model: String,
    /// Name served in `/v1/models` and accepted in requests (default: `model`).
    pub served_model_name: Option<String>,
    /// Address to bind.
    pub host: String,
    /// Port to bind; 0 picks a free port.
    pub port: u16,
    /// Quantize BF16 (or synthesized) weights at load; `None` keeps the stored format.
    pub quantize: Option<QuantRecipe>,
    /// Seed of synthesized weights and of requests without their own seed.
    pub seed: u64,
    /// Keep only the first N decoder layers.
    pub num_layers: Option<usize>,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Where the runtime runs (`--device`; resolved: see `crate::runtime::device`).
    pub device: super::backend::Device,
    /// Fraction of GPU memory the engine may use (`--gpu-memory-utilization`, (0, 1]); `None`
    /// = 0.9. The KV cache gets what is left of it after weights, activations and workspace.
    pub gpu_memory_utilization: Option<f64>,
    /// Explicit KV cache budget in bytes (`--kv-cache-memory`; wins over the utilization); `None`
    /// = from the utilization on a GPU, 512 MiB on the CPU.
    pub kv_cache_memory: Option<u64>,
    /// KV cache element type.
    pub kv_cache_dtype: KvCacheDtype,
    /// Most requests running at once.
    pub max_num_seqs: usize,
    /// Token budget of one engine step (prefill chunks and decode tokens together).
    pub max_num_batched_tokens: usize,
    /// Longest prompt + output; `None` = the model's `max_position_embeddings`.
    pub max_model_len: Option<usize>,
    /// n-gram speculative decoding; `None` = off.
    pub speculative: Option<SpecConfig>,
    /// Reuse KV blocks of identical prefixes.
    pub enable_prefix_caching: bool,
    /// CPU threads of the matmul; `None` = all available cores.
    pub num_threads: Option<usize>,
    /// Connection limit, timeouts and the chat message limit of the HTTP server.
    pub limits: super::serve_guard::ServeLimits,
    /// The key every request must carry (`--api-key`, `VLLM_API_KEY`); `None` = open.
    pub api_key: Option<super::serve_guard::ApiKey>,
}

impl ServeConfig {
    /// `synthetic:tiny` on the CPU, 127.0.0.1 with a free port, seed 0, block 16, 64 MiB of BF16 KV,
    /// 16 sequences, 512 batched tokens, max_model_len 2048, prefix caching on, no speculation.
    pub fn tiny() -> Self {
        ServeConfig {
            model: "synthetic:tiny".into(),
            served_model_name: None,
            host: "127.0.0.1".into(),
            port: 0,
            quantize: None,
            seed: 0,
            num_layers: None,
            block_size: 16,
            device: super::backend::Device::Cpu,
            gpu_memory_utilization: None,
            kv_cache_memory: Some(64 << 20),
            kv_cache_dtype: KvCacheDtype::Bf16,
            max_num_seqs: 16,
            max_num_batched_tokens: 512,
            max_model_len: Some(2048),
            speculative: None,
            enable_prefix_caching: true,
            num_threads: None,
            limits: Default::default(),
            api_key: None,
        }
    }

    /// The name clients use: `served_model_name` or `model`.
    pub fn served_name(&self) -> &str {
        self.served_model_name.as_deref().unwrap_or(&self.model)
    }

    /// Check values that clap cannot (ranges, combinations).
    ///
    /// # Errors
    /// [`RigError::BadFlag`] naming the flag and the fix.
    pub fn validate(&self) -> Result<(), RigError> {
        if self.block_size == 0 || self.block_size > 1024 {
            return Err(RigError::flag(
                "--block-size",
                format!("{} is out of range 1..=1024", self.block_size),
            ));
        }
        if self.max_num_seqs == 0 {
            return Err(RigError::flag("--max-num-seqs", "must be at least 1"));
        }
        if self.max_num_batched_tokens == 0 {
            return Err(RigError::flag(
                "--max-num-batched-tokens",
                "must be at least 1",
            ));
        }
        if self.max_model_len == Some(0) {
            return Err(RigError::flag("--max-model-len", "must be at least 1"));
        }
        if self.num_layers == Some(0) {
            return Err(RigError::flag("--num-layers", "must be at least 1"));
        }
        if let Some(u) = self.gpu_memory_utilization {
            if !(u > 0.0 && u <= 1.0) {
                return Err(RigError::flag(
                    "--gpu-memory-utilization",
                    format!("{u} is not in (0, 1]"),
                ));
            }
        }
        if self.num_threads == Some(0) {
            return Err(RigError::flag("--threads", "must be at least 1"));
        }
        if let Some(s) = &self.speculative {
            if s.num_speculative_tokens == 0 || s.num_speculative_tokens > 64 {
                return Err(RigError::flag(
                    "--spec-k",
                    format!("{} is out of range 1..=64", s.num_speculative_tokens),
                ));
            }
            if s.prompt_lookup_min == 0 || s.prompt_lookup_min > s.prompt_lookup_max {
                return Err(RigError::flag(
                    "--prompt-lookup-min",
                    format!(
                        "need 1 <= prompt_lookup_min ({}) <= prompt_lookup_max ({})",
                        s.prompt_lookup_min, s.prompt_lookup_max
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Where the model comes from.
    ///
    /// # Errors
    /// [`RigError::BadFlag`] for an unknown preset; [`RigError::BadFile`] for a directory that
    /// does not exist or has no `config.json`.
    pub fn source(&self) -> Result<ModelSource, RigError> {
        if let Some(name) = self.model.strip_prefix("synthetic:") {
            return match ModelConfig::preset(name) {
                Some(_) => Ok(ModelSource::Synthetic(name.to_string())),
                None => Err(RigError::flag(
                    "--model",
                    format!(
                        "unknown preset 'synthetic:{name}'; choose one of synthetic:{}",
                        PRESETS.join(", synthetic:")
                    ),
                )),
            };
        }
        let dir = PathBuf::from(&self.model);
        if crate::checkpoint::gguf::is_gguf_path(&dir) {
            return Ok(ModelSource::Gguf(dir));
        }
        if !dir.is_dir() {
            return Err(RigError::file(
                &dir,
                "not a checkpoint (expected a folder with config.json and *.safetensors, a .gguf file, or synthetic:tiny|qwen3-8b|qwen3-32b|tiny-hybrid|qwen3.6-27b)",
            ));
        }
        if !dir.join("config.json").is_file() {
            return Err(RigError::file(
                dir.join("config.json"),
                "missing; a checkpoint directory needs its Hugging Face config.json",
            ));
        }
        Ok(ModelSource::Dir(dir))
    }
}

/// Where a running model's weights came from: a condition of every figure measured on it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelProvenance {
    /// Seeded synthetic weights ([`crate::runtime::weights::synthesize`]).
    Synthetic {
        /// The preset (`qwen3-8b`, ...).
        preset: String,
        /// The seed.
        seed: u64,
        /// Decoder layers kept (`--num-layers`).
        num_layers: usize,
    },
    /// A checkpoint directory.
    Checkpoint {
        /// The directory as given.
        path: String,
        /// `MappedCheckpoint::content_hash` (a hash of the shard headers and sizes).
        content_hash: String,
    },
}

impl ModelProvenance {
    /// One line: `synthetic:qwen3-8b seed 0 (36 layers)` or `checkpoint DIR (fnv1a64:...)`.
    pub fn describe(&self) -> String {
        match self {
            ModelProvenance::Synthetic {
                preset,
                seed,
                num_layers,
            } => format!("synthetic:{preset} seed {seed} ({num_layers} layers)"),
            ModelProvenance::Checkpoint { path, content_hash } => {
                format!("checkpoint {path} ({content_hash})")
            }
        }
    }
}

/// Where weights come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// Synthesized from the seed at a preset shape.
    Synthetic(String),
    /// A local checkpoint directory.
    Dir(PathBuf),
    /// A GGUF file, or a folder holding one and no config.json (see
    /// `crate::runtime::gguf_model`).
    Gguf(PathBuf),
}

/// Parse a human size: a number (decimal point allowed) with an optional unit. `B`; decimal
/// `KB`, `MB`, `GB`, `TB` (powers of 1000); binary `KiB`, `MiB`, `GiB`, `TiB` and the bare
/// `K`, `M`, `G`, `T` (powers of 1024). Case-insensitive; spaces and `_`/`,` separators allowed.
///
/// # Errors
/// A message naming the bad text and the accepted forms.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t: String = text
        .chars()
        .filter(|c| !matches!(c, ' ' | '_' | ','))
        .collect();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = || format!("'{text}' is not a size; use e.g. 268435456, 256MiB, 1.5GiB or 512MB");
    let value: f64 = num.parse().map_err(|_| bad())?;
    let mult: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0f64.powi(4),
        _ => return Err(bad()),
    };
    let bytes = value * mult;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 / 2.0 {
        return Err(bad());
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256MiB").unwrap(), 256 << 20);
        assert_eq!(parse_size("256 mib").unwrap(), 256 << 20);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("512MB").unwrap(), 512_000_000);
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        for bad in ["", "MiB", "12 parsecs", "-5MiB", "1.2.3GiB", "1e400"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.contains("256MiB"), "{bad}: {e}");
        }
    }

    #[test]
    fn presets_have_real_dimensions() {
        let q8 = ModelConfig::preset("qwen3-8b").unwrap();
        // Qwen3-8B is published as 8.2B parameters.
        let p = q8.num_params() as f64 / 1e9;
        assert!((8.1..8.3).contains(&p), "{p}");
        let q32 = ModelConfig::preset("qwen3-32b").unwrap();
        let p = q32.num_params() as f64 / 1e9;
        assert!((32.5..33.0).contains(&p), "{p}");
        assert!(ModelConfig::preset("qwen3-9000b").is_none());
        let t = ModelConfig::tiny();
        assert_eq!(t.q_dim(), t.hidden_size);
        assert!(t.vocab_size >= 261);
    }

    #[test]
    fn hf_config_qwen3_and_llama() {
        let q = r#"{"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3","hidden_size":1024,
            "intermediate_size":3072,"num_hidden_layers":28,"num_attention_heads":16,
            "num_key_value_heads":8,"head_dim":128,"vocab_size":151936,"rms_norm_eps":1e-06,
            "rope_theta":1000000,"max_position_embeddings":40960,"tie_word_embeddings":true,
            "eos_token_id":151645,"rope_scaling":null,"attention_bias":false}"#;
        let c = ModelConfig::parse_hf_config(q).unwrap().config;
        assert_eq!(c.arch, Arch::Qwen3);
        assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (16, 8, 128));
        assert!(c.tie_word_embeddings);
        assert_eq!(c.eos_token_ids, vec![151645]);
        let l = r#"{"model_type":"llama","hidden_size":4096,"intermediate_size":14336,
            "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,
            "vocab_size":128256,"rope_theta":500000.0,"eos_token_id":[128001,128008,128009],
            "rope_scaling":{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
            "original_max_position_embeddings":8192,"rope_type":"llama3"}}"#;
        let c = ModelConfig::parse_hf_config(l).unwrap().config;
        assert_eq!(c.head_dim, 128);
        assert_eq!(c.eos_token_ids.len(), 3);
        let f = c.rope_inv_freq();
        // Highest frequency unchanged, lowest divided by the factor.
        assert_eq!(f[0], 1.0);
        let plain = 1.0 / 500000f64.powf(126.0 / 128.0);
        assert!(((f[63] as f64) - plain / 8.0).abs() / (plain / 8.0) < 1e-5);
    }

    #[test]
    fn hf_config_errors_name_the_problem() {
        let e = ModelConfig::parse_hf_config("{not json").unwrap_err();
        assert!(format!("{e:#}").contains("JSON"));
        let e = ModelConfig::parse_hf_config(r#"{"model_type":"qwen3_moe"}"#).unwrap_err();
        assert!(format!("{e:#}").contains("qwen3_moe"));
        let e =
            ModelConfig::parse_hf_config(r#"{"model_type":"qwen3","hidden_size":8}"#).unwrap_err();
        assert!(format!("{e:#}").contains("num_attention_heads"));
        let e = ModelConfig::parse_hf_config(
            r#"{"model_type":"llama","hidden_size":64,"num_attention_heads":4,"num_key_value_heads":3,
            "intermediate_size":8,"num_hidden_layers":1,"vocab_size":8}"#,
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("num_key_value_heads"));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(&p, "[]").unwrap();
        let e = ModelConfig::read_hf_config(&p).unwrap_err();
        assert!(e.to_string().contains("config.json"), "{e}");
    }

    #[test]
    fn transformers5_rope_parameters_and_dtype() {
        // The fixture's config.json as transformers 5.17 wrote it.
        let text = std::fs::read_to_string(crate::real_fixture(
            "models/tiny-qwen3-transformers5/config.json",
        ))
        .expect("the fixture config.json reads");
        let h = ModelConfig::parse_hf_config(&text).unwrap();
        assert_eq!(h.config.rope_theta, 1_000_000.0);
        assert_eq!(h.config.rope_scaling, RopeScaling::None);
        assert_eq!(h.dtype.as_deref(), Some("bfloat16"));
        assert_eq!((h.config.head_dim, h.config.num_kv_heads), (32, 2));
        assert!(!h.config.tie_word_embeddings);
        assert!(h.warnings.is_empty(), "{:?}", h.warnings);
        // The same facts in the older form read the same.
        let old = r#"{"model_type":"qwen3","architectures":["Qwen3ForCausalLM"],"hidden_size":128,
            "intermediate_size":256,"num_hidden_layers":2,"num_attention_heads":4,
            "num_key_value_heads":2,"head_dim":32,"vocab_size":383,"rms_norm_eps":1e-6,
            "rope_theta":1000000.0,"rope_scaling":null,"torch_dtype":"bfloat16","hidden_act":"silu",
            "max_position_embeddings":2048,"tie_word_embeddings":false,"eos_token_id":3}"#;
        let o = ModelConfig::parse_hf_config(old).unwrap();
        assert_eq!(o.config, h.config);
        assert_eq!(o.dtype, h.dtype);
        // Llama 3.1 scaling under rope_parameters, as transformers 5 writes it.
        let l = r#"{"model_type":"llama","hidden_size":4096,"intermediate_size":14336,
            "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,
            "vocab_size":128256,"rms_norm_eps":1e-5,"hidden_act":"silu","tie_word_embeddings":false,
            "max_position_embeddings":131072,"dtype":"bfloat16",
            "rope_parameters":{"rope_type":"llama3","rope_theta":500000.0,"factor":8.0,
            "low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}}"#;
        let c = ModelConfig::parse_hf_config(l).unwrap().config;
        assert_eq!(c.rope_theta, 500_000.0);
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
        // Linear scaling divides every frequency.
        let lin = l.replace(
            r#""rope_type":"llama3","rope_theta":500000.0,"factor":8.0,
            "low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192"#,
            r#""rope_type":"linear","rope_theta":500000.0,"factor":2.0"#,
        );
        let c2 = ModelConfig::parse_hf_config(&lin).unwrap().config;
        let mut plain = c2.clone();
        plain.rope_scaling = RopeScaling::None;
        assert_eq!(c2.rope_inv_freq()[5], plain.rope_inv_freq()[5] / 2.0);
    }

    #[test]
    fn math_fields_are_never_defaulted_silently() {
        let base = serde_json::json!({"model_type":"qwen3","hidden_size":64,"intermediate_size":128,
            "num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,
            "vocab_size":300,"rms_norm_eps":1e-6,"rope_theta":10000.0,"hidden_act":"silu",
            "tie_word_embeddings":true,"max_position_embeddings":512});
        let with = |f: &dyn Fn(&mut serde_json::Map<String, serde_json::Value>)| {
            let mut v = base.clone();
            f(v.as_object_mut().unwrap());
            ModelConfig::parse_hf_config(&v.to_string())
        };
        assert!(with(&|_| {}).unwrap().warnings.is_empty());
        // Each absent math field: a warning naming the field and the value used.
        for (field, value) in [
            ("rope_theta", "10000"),
            ("rms_norm_eps", "1e-6"),
            ("head_dim", "128"),
            ("num_key_value_heads", "4"),
            ("hidden_act", "silu"),
            ("tie_word_embeddings", "false"),
        ] {
            let h = with(&|m| {
                m.remove(field);
            })
            .unwrap();
            assert!(
                h.warnings
                    .iter()
                    .any(|w| w.contains(field) && w.contains(value)),
                "{field}: {:?}",
                h.warnings
            );
        }
        // Unknown or unsupported values: errors naming them.
        for (f, want) in [
            (
                serde_json::json!({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}),
                "yarn",
            ),
            (
                serde_json::json!({"rope_scaling": {"type": "dynamic", "factor": 2.0}}),
                "dynamic",
            ),
            (
                serde_json::json!({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}}),
                "low_freq_factor",
            ),
            (
                serde_json::json!({"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}),
                "disagree",
            ),
            (
                serde_json::json!({"rope_parameters": {"rope_theta": 1e4, "mrope_section": [1, 2]}}),
                "mrope_section",
            ),
            (serde_json::json!({"hidden_act": "gelu"}), "gelu"),
            (serde_json::json!({"use_sliding_window": true}), "sliding"),
            (
                serde_json::json!({"layer_types": ["sliding_attention"]}),
                "sliding_attention",
            ),
            (
                serde_json::json!({"partial_rotary_factor": 0.5}),
                "partial_rotary_factor",
            ),
            (
                serde_json::json!({"architectures": ["Qwen3MoeForCausalLM"]}),
                "Qwen3ForCausalLM",
            ),
            (serde_json::json!({"model_type": "mistral"}), "qwen3, llama"),
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
    fn serve_config_validation() {
        let mut c = ServeConfig::tiny();
        assert!(c.validate().is_ok());
        c.block_size = 0;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--block-size"));
        let mut c = ServeConfig::tiny();
        c.model = "synthetic:huge".into();
        assert!(c
            .source()
            .unwrap_err()
            .to_string()
            .contains("synthetic:tiny"));
        c.model = "/definitely/not/here".into();
        assert!(c
            .source()
            .unwrap_err()
            .to_string()
            .contains("/definitely/not/here"));
    }
}
