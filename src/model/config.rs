//! The model's shape: [`ModelConfig`], read from a Hugging Face `config.json`
//! ([`ModelConfig::parse_hf_config`]: the dense reader in [`super::dense`], the Qwen3.5 / 3.6
//! family's in [`super::hybrid`]) or a named preset ([`ModelConfig::preset`]), and the derived
//! dimensions every consumer (the runtime, the checkpoint inspector) shares.

use std::path::Path;

use anyhow::Context;
use serde_json::{Map, Value};

pub use super::rope::SUPPORTED_ROPE_TYPES;

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
    /// The sparse MLP of a mixture-of-experts model (Qwen3-MoE, Qwen3.5 / 3.6-MoE); `None` for
    /// dense MLPs.
    pub moe: Option<super::moe::MoeConfig>,
}

/// `model_type` values the built-in runtime runs.
pub const SUPPORTED_MODEL_TYPES: [&str; 7] = [
    "qwen3",
    "llama",
    "qwen3_5_text",
    "qwen3_5",
    "qwen3_moe",
    "qwen3_5_moe_text",
    "qwen3_5_moe",
];

/// `architectures` entries the built-in runtime runs (one per supported `model_type`).
pub const SUPPORTED_ARCHITECTURES: [&str; 7] = [
    "Qwen3ForCausalLM",
    "LlamaForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3MoeForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration",
];

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

/// The named presets of `--model synthetic:NAME`.
pub const PRESETS: [&str; 8] = [
    "tiny",
    "qwen3-8b",
    "qwen3-32b",
    "tiny-hybrid",
    "qwen3.6-27b",
    "tiny-moe",
    "qwen3.6-35b-a3b",
    "qwen3-30b-a3b",
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
            eos_token_ids: vec![BYTE_TOKENIZER_ENDOFTEXT],
            rotary_dim: 16,
            hybrid: None,
            moe: None,
        }
    }

    /// A preset by name (`tiny`, `qwen3-8b`, `qwen3-32b`, `tiny-hybrid`, `qwen3.6-27b`, and the
    /// mixtures of experts `tiny-moe`, `qwen3.6-35b-a3b`, `qwen3-30b-a3b` of
    /// [`super::moe`]). The
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
            moe: None,
        };
        match name {
            "tiny" => Some(Self::tiny()),
            "qwen3-8b" => Some(qwen3(4096, 12288, 36, 32)),
            "qwen3-32b" => Some(qwen3(5120, 25600, 64, 64)),
            "tiny-hybrid" => Some(super::hybrid::tiny_hybrid()),
            "qwen3.6-27b" => Some(super::hybrid::qwen36_27b()),
            "tiny-moe" => Some(super::moe::tiny_moe()),
            "qwen3.6-35b-a3b" => Some(super::moe::qwen36_35b_a3b()),
            "qwen3-30b-a3b" => Some(super::moe::qwen3_30b_a3b()),
            _ => None,
        }
    }

    /// Read a Hugging Face `config.json` (see [`Self::parse_hf_config`]).
    ///
    /// # Errors
    /// [`crate::RigError::BadFile`] naming the file when it is unreadable, not JSON, of an unsupported
    /// `model_type` or architecture, or inconsistent (e.g. heads not dividing).
    pub fn read_hf_config(path: &Path) -> anyhow::Result<HfConfig> {
        Ok(super::ConfigFile::read_for_runtime(path)?.1)
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
        Self::from_hf_root(&parse_json_root(text)?)
    }

    /// [`Self::parse_hf_config`] on a `config.json` already decoded into its top-level object
    /// (the one decode of a model load: [`super::ConfigFile`]).
    ///
    /// # Errors
    /// As [`Self::parse_hf_config`], less the JSON errors.
    pub fn from_hf_root(root: &Map<String, Value>) -> anyhow::Result<HfConfig> {
        // The Qwen3.5 / 3.6 family (and its siblings, refused by name) has its own reader.
        if let Some(h) = super::hybrid::parse_family(root)? {
            return Ok(h);
        }
        super::dense::parse(root)
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
        let per_layer = h * (self.q_dim() as u64) * 2 + h * (self.kv_dim() as u64) * 2 + 2 * h;
        let mlps: u64 = (0..self.num_layers).map(|i| self.mlp_params(i)).sum();
        let emb = self.vocab_size as u64 * h;
        emb * if self.tie_word_embeddings { 1 } else { 2 }
            + per_layer * self.num_layers as u64
            + mlps
            + h
    }

    /// Whether the MLPs are (at least partly) mixtures of experts.
    pub fn is_moe(&self) -> bool {
        self.moe.is_some()
    }

    /// Whether layer `i` has a sparse MLP block.
    pub fn is_sparse_layer(&self, i: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| m.is_sparse(i))
    }

    /// Parameters of layer `i`'s MLP: `3 · H · intermediate_size` dense, else the sparse
    /// block's ([`super::moe::MoeConfig::block_params`]).
    pub fn mlp_params(&self, i: usize) -> u64 {
        match &self.moe {
            Some(m) if m.is_sparse(i) => m.block_params(self.hidden_size),
            _ => 3 * self.hidden_size as u64 * self.intermediate_size as u64,
        }
    }
}

/// The end-of-text id of the runtime's byte-level tokenizer (`<|endoftext|>`, id 256 after the
/// 256 bytes), the EOS of the small presets (`crate::runtime::tokenizer::ByteTokenizer`).
pub const BYTE_TOKENIZER_ENDOFTEXT: u32 = 256;

/// Decode the text of a `config.json` into its top-level object.
///
/// # Errors
/// Not JSON, or JSON that is not an object.
pub fn parse_json_root(text: &str) -> anyhow::Result<Map<String, Value>> {
    let root: Value = serde_json::from_str(text).context("not valid JSON for a config.json")?;
    let Value::Object(root) = root else {
        anyhow::bail!("not a JSON object (a config.json is one)");
    };
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
