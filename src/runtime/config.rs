//! Configuration: the model's shape ([`ModelConfig`], read from a Hugging Face `config.json` or a
//! named preset) and the server's settings ([`ServeConfig`], the fields behind `rigbench serve`'s
//! flags), plus the small enums they use and the human-size parser for `--kv-cache-memory`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

use crate::RigError;

/// The decoder families the runtime runs. Both are dense pre-norm decoders with RMSNorm, GQA
/// attention with RoPE and a SwiGLU MLP; Qwen3 adds a per-head RMSNorm on q and k before RoPE
/// (`Qwen3Attention.q_norm` / `k_norm` in Hugging Face transformers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `model_type: "qwen3"` (Qwen3ForCausalLM): q/k RMSNorm per head, no attention bias.
    Qwen3,
    /// `model_type: "llama"` (LlamaForCausalLM): no q/k norm, no attention bias.
    Llama,
}

/// RoPE frequency scaling (the `rope_scaling` entry of `config.json`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE: `inv_freq[i] = theta^(-2i/d)` (Su et al., RoFormer, 2021).
    None,
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

/// The shape of a dense Qwen3/Llama decoder, as in Hugging Face `config.json`.
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
}

/// The named presets of `--model synthetic:NAME`.
pub const PRESETS: [&str; 3] = ["tiny", "qwen3-8b", "qwen3-32b"];

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
        }
    }

    /// A preset by name (`tiny`, `qwen3-8b`, `qwen3-32b`). The Qwen3 presets carry the
    /// dimensions of the published `Qwen/Qwen3-8B` and `Qwen/Qwen3-32B` `config.json` files.
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
        };
        match name {
            "tiny" => Some(Self::tiny()),
            "qwen3-8b" => Some(qwen3(4096, 12288, 36, 32)),
            "qwen3-32b" => Some(qwen3(5120, 25600, 64, 64)),
            _ => None,
        }
    }

    /// Read a Hugging Face `config.json`.
    ///
    /// # Errors
    /// [`RigError::BadFile`] naming the file when it is unreadable, not JSON, of an unsupported
    /// `model_type`, or inconsistent (e.g. heads not dividing).
    pub fn from_hf_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| RigError::file(path, format!("cannot read the model config: {e}")))?;
        Self::from_hf_json(&text).map_err(|e| RigError::file(path, format!("{e:#}")).into())
    }

    /// Parse the text of a Hugging Face `config.json` (see [`Self::from_hf_file`]).
    pub fn from_hf_json(text: &str) -> anyhow::Result<Self> {
        #[derive(Deserialize)]
        struct Raw {
            model_type: Option<String>,
            hidden_size: Option<usize>,
            intermediate_size: Option<usize>,
            num_hidden_layers: Option<usize>,
            num_attention_heads: Option<usize>,
            num_key_value_heads: Option<usize>,
            head_dim: Option<usize>,
            vocab_size: Option<usize>,
            rms_norm_eps: Option<f64>,
            rope_theta: Option<f64>,
            rope_scaling: Option<serde_json::Value>,
            max_position_embeddings: Option<usize>,
            tie_word_embeddings: Option<bool>,
            attention_bias: Option<bool>,
            mlp_bias: Option<bool>,
            eos_token_id: Option<serde_json::Value>,
            text_config: Option<serde_json::Value>,
        }
        let raw: Raw = serde_json::from_str(text).context("not valid JSON for a config.json")?;
        if raw.hidden_size.is_none() && raw.text_config.is_some() {
            anyhow::bail!(
                "this is a multimodal/wrapper config (fields under text_config); the runtime runs \
                 dense Qwen3/Llama text decoders only"
            );
        }
        let model_type = raw.model_type.unwrap_or_default();
        let arch = match model_type.as_str() {
            "qwen3" => Arch::Qwen3,
            "llama" => Arch::Llama,
            other => anyhow::bail!(
                "model_type '{other}' is not supported by the built-in runtime; it runs dense \
                 'qwen3' and 'llama' decoders (use an external engine for others)"
            ),
        };
        if raw.attention_bias == Some(true) || raw.mlp_bias == Some(true) {
            anyhow::bail!(
                "attention_bias/mlp_bias = true is not supported by the built-in runtime"
            );
        }
        let need = |v: Option<usize>, name: &str| -> anyhow::Result<usize> {
            match v {
                Some(0) => anyhow::bail!("field '{name}' is 0"),
                Some(x) => Ok(x),
                None => anyhow::bail!("missing field '{name}'"),
            }
        };
        let hidden_size = need(raw.hidden_size, "hidden_size")?;
        let num_heads = need(raw.num_attention_heads, "num_attention_heads")?;
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(num_heads);
        if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            anyhow::bail!(
                "num_attention_heads ({num_heads}) is not a multiple of num_key_value_heads ({num_kv_heads})"
            );
        }
        let head_dim = match raw.head_dim {
            Some(d) if d > 0 => d,
            _ => {
                if hidden_size % num_heads != 0 {
                    anyhow::bail!(
                        "no head_dim and hidden_size is not a multiple of num_attention_heads"
                    );
                }
                hidden_size / num_heads
            }
        };
        if head_dim % 2 != 0 {
            anyhow::bail!("head_dim {head_dim} is odd; RoPE needs an even head_dim");
        }
        let rope_scaling = match &raw.rope_scaling {
            None | Some(serde_json::Value::Null) => RopeScaling::None,
            Some(v) => {
                let kind = v
                    .get("rope_type")
                    .or_else(|| v.get("type"))
                    .and_then(|t| t.as_str())
                    .unwrap_or("default");
                let num = |k: &str, d: f64| v.get(k).and_then(|x| x.as_f64()).unwrap_or(d) as f32;
                match kind {
                    "default" => RopeScaling::None,
                    "llama3" => RopeScaling::Llama3 {
                        factor: num("factor", 8.0),
                        low_freq_factor: num("low_freq_factor", 1.0),
                        high_freq_factor: num("high_freq_factor", 4.0),
                        original_max_position_embeddings: num(
                            "original_max_position_embeddings",
                            8192.0,
                        ),
                    },
                    other => anyhow::bail!(
                        "rope_scaling type '{other}' is not supported (supported: default, llama3)"
                    ),
                }
            }
        };
        let eos_token_ids = match raw.eos_token_id {
            Some(serde_json::Value::Number(n)) => {
                n.as_u64().map(|x| vec![x as u32]).unwrap_or_default()
            }
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .filter_map(|x| x.as_u64().map(|x| x as u32))
                .collect(),
            _ => Vec::new(),
        };
        Ok(ModelConfig {
            arch,
            hidden_size,
            intermediate_size: need(raw.intermediate_size, "intermediate_size")?,
            num_layers: need(raw.num_hidden_layers, "num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size: need(raw.vocab_size, "vocab_size")?,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6) as f32,
            rope_theta: raw.rope_theta.unwrap_or(10_000.0) as f32,
            rope_scaling,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            eos_token_ids,
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

    /// Whether the family has Qwen3's per-head q/k RMSNorm.
    pub fn has_qk_norm(&self) -> bool {
        self.arch == Arch::Qwen3
    }

    /// RoPE inverse frequencies, `head_dim / 2` of them (rotate-half convention of
    /// transformers' `rotate_half`: pairs are `(x[i], x[i + d/2])`).
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let d = self.head_dim;
        let base: Vec<f64> = (0..d / 2)
            .map(|i| 1.0 / (self.rope_theta as f64).powf(2.0 * i as f64 / d as f64))
            .collect();
        match self.rope_scaling {
            RopeScaling::None => base.iter().map(|x| *x as f32).collect(),
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
        let h = self.hidden_size as u64;
        let per_layer = h * (self.q_dim() as u64) * 2
            + h * (self.kv_dim() as u64) * 2
            + 3 * h * self.intermediate_size as u64
            + 2 * h;
        let emb = self.vocab_size as u64 * h;
        emb * if self.tie_word_embeddings { 1 } else { 2 } + per_layer * self.num_layers as u64 + h
    }
}

/// How linear-layer weights are stored (and dequantized on the fly in the matmul).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// `synthetic:tiny`, `synthetic:qwen3-8b`, `synthetic:qwen3-32b`, or a checkpoint directory
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
    pub quantize: Option<WeightFormat>,
    /// Seed of synthesized weights and of requests without their own seed.
    pub seed: u64,
    /// Keep only the first N decoder layers.
    pub num_layers: Option<usize>,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV cache budget in bytes.
    pub kv_cache_memory: u64,
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
}

impl ServeConfig {
    /// `synthetic:tiny` on 127.0.0.1 with a free port, seed 0, block 16, 64 MiB of BF16 KV,
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
            kv_cache_memory: 64 << 20,
            kv_cache_dtype: KvCacheDtype::Bf16,
            max_num_seqs: 16,
            max_num_batched_tokens: 512,
            max_model_len: Some(2048),
            speculative: None,
            enable_prefix_caching: true,
            num_threads: None,
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
        if !dir.is_dir() {
            return Err(RigError::file(
                &dir,
                "not a checkpoint directory (expected a folder with config.json and *.safetensors, or synthetic:tiny|qwen3-8b|qwen3-32b)",
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

/// Where weights come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// Synthesized from the seed at a preset shape.
    Synthetic(String),
    /// A local checkpoint directory.
    Dir(PathBuf),
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
        let c = ModelConfig::from_hf_json(q).unwrap();
        assert_eq!(c.arch, Arch::Qwen3);
        assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (16, 8, 128));
        assert!(c.tie_word_embeddings);
        assert_eq!(c.eos_token_ids, vec![151645]);
        let l = r#"{"model_type":"llama","hidden_size":4096,"intermediate_size":14336,
            "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,
            "vocab_size":128256,"rope_theta":500000.0,"eos_token_id":[128001,128008,128009],
            "rope_scaling":{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
            "original_max_position_embeddings":8192,"rope_type":"llama3"}}"#;
        let c = ModelConfig::from_hf_json(l).unwrap();
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
        let e = ModelConfig::from_hf_json("{not json").unwrap_err();
        assert!(format!("{e:#}").contains("JSON"));
        let e = ModelConfig::from_hf_json(r#"{"model_type":"qwen3_moe"}"#).unwrap_err();
        assert!(format!("{e:#}").contains("qwen3_moe"));
        let e = ModelConfig::from_hf_json(r#"{"model_type":"qwen3","hidden_size":8}"#).unwrap_err();
        assert!(format!("{e:#}").contains("num_attention_heads"));
        let e = ModelConfig::from_hf_json(
            r#"{"model_type":"llama","hidden_size":64,"num_attention_heads":4,"num_key_value_heads":3,
            "intermediate_size":8,"num_hidden_layers":1,"vocab_size":8}"#,
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("num_key_value_heads"));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(&p, "[]").unwrap();
        let e = ModelConfig::from_hf_file(&p).unwrap_err();
        assert!(e.to_string().contains("config.json"), "{e}");
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
