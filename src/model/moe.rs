//! Mixture-of-experts MLPs: the sparse block of Qwen3-MoE (`Qwen3MoeSparseMoeBlock`) and of
//! Qwen3.5 / 3.6-MoE (`Qwen3_5MoeSparseMoeBlock`), as transformers 5 writes them.
//!
//! A sparse layer replaces the dense SwiGLU MLP by
//! - a router `mlp.gate` (`[E, H]`, no bias): `p = softmax(x · Wᵀ)` over the E experts, in FP32;
//! - the top-k experts of `p` (`num_experts_per_tok`), their weights renormalised to sum to 1
//!   when `norm_topk_prob` holds (Qwen3-MoE reads the field, default false in
//!   `Qwen3MoeConfig`; Qwen3.5-MoE's `Qwen3_5MoeTopKRouter` always renormalises);
//! - each chosen expert a SwiGLU MLP of width `moe_intermediate_size`
//!   (`down(silu(gate(x)) ⊙ up(x))`), its output scaled by its routing weight and summed;
//! - Qwen3.5-MoE only: a shared expert (a SwiGLU MLP of width
//!   `shared_expert_intermediate_size`) on every token, scaled by
//!   `sigmoid(shared_expert_gate · x)` (`shared_expert_gate` is `[1, H]`) and added.
//!
//! Which layers are sparse: Qwen3-MoE's layer `i` is sparse when `i` is not in
//! `mlp_only_layers` and `(i + 1) % decoder_sparse_step == 0` (`Qwen3MoeDecoderLayer`); every
//! Qwen3.5-MoE layer is sparse.

use serde_json::{Map, Value};

use super::config::{Arch, ModelConfig, RopeScaling};
use super::fields::Fields;
use super::hybrid::{interval_pattern, HybridConfig};

/// The sparse MLP part of a decoder's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeConfig {
    /// Routed experts E (`num_experts`; `num_local_experts` in transformers 5's Qwen3-MoE
    /// configs, the same attribute).
    pub num_experts: usize,
    /// Experts per token k (`num_experts_per_tok`).
    pub top_k: usize,
    /// Width of one routed expert's MLP (`moe_intermediate_size`).
    pub expert_intermediate_size: usize,
    /// Width of the shared expert (`shared_expert_intermediate_size`); 0 when the family has
    /// none (Qwen3-MoE).
    pub shared_expert_intermediate_size: usize,
    /// Whether the k routing weights are renormalised to sum to 1.
    pub norm_topk_prob: bool,
    /// Per decoder layer: sparse (true) or the dense MLP of width `intermediate_size` (false).
    pub sparse_layers: Vec<bool>,
}

impl MoeConfig {
    /// Whether layer `i` has the sparse block (false past the list).
    pub fn is_sparse(&self, i: usize) -> bool {
        self.sparse_layers.get(i).copied().unwrap_or(false)
    }

    /// Whether a shared expert runs beside the routed ones.
    pub fn has_shared_expert(&self) -> bool {
        self.shared_expert_intermediate_size > 0
    }

    /// Parameters of one sparse block at hidden size `h`: router `E·H`, experts
    /// `E · 3 · H · I_e`, shared expert `3 · H · I_s + H` (its gate) when present.
    pub fn block_params(&self, h: usize) -> u64 {
        let (h, e) = (h as u64, self.num_experts as u64);
        let experts = e * 3 * h * self.expert_intermediate_size as u64;
        let shared = if self.has_shared_expert() {
            3 * h * self.shared_expert_intermediate_size as u64 + h
        } else {
            0
        };
        e * h + experts + shared
    }

    /// Parameters one token touches in a sparse block: the router, k experts and the shared
    /// expert (the "active" parameters of an A3B model's MLPs).
    pub fn active_block_params(&self, h: usize) -> u64 {
        let (h64, e) = (h as u64, self.num_experts as u64);
        let experts = self.top_k as u64 * 3 * h64 * self.expert_intermediate_size as u64;
        let shared = if self.has_shared_expert() {
            3 * h64 * self.shared_expert_intermediate_size as u64 + h64
        } else {
            0
        };
        e * h64 + experts + shared
    }
}

/// Qwen3-MoE's sparse layers: layer `i` is sparse unless it is in `mlp_only_layers`, and when
/// `(i + 1) % decoder_sparse_step == 0` (`Qwen3MoeDecoderLayer.__init__`).
pub fn qwen3_sparse_layers(layers: usize, step: usize, mlp_only: &[usize]) -> Vec<bool> {
    (0..layers)
        .map(|i| !mlp_only.contains(&i) && step > 0 && (i + 1) % step == 0)
        .collect()
}

/// Which sparse block a family has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MoeFamily {
    /// `Qwen3MoeConfig`: no shared expert; `norm_topk_prob` read (default false);
    /// `decoder_sparse_step` and `mlp_only_layers` choose the sparse layers.
    Qwen3,
    /// `Qwen3_5MoeTextConfig`: a shared expert on every layer; the router always renormalises.
    Qwen35,
}

impl MoeFamily {
    fn class(self) -> &'static str {
        match self {
            MoeFamily::Qwen3 => "Qwen3MoeConfig",
            MoeFamily::Qwen35 => "Qwen3_5MoeTextConfig",
        }
    }
}

/// Read the sparse block's fields of `o` (`at` prefixes field names in messages): absent ones
/// take the family's transformers default, named in `warnings`.
///
/// # Errors
/// A field of the wrong type, zero where a count is needed, `num_experts_per_tok` above
/// `num_experts`, or an `mlp_only_layers` entry outside the layers.
pub(super) fn parse_moe(
    o: &Map<String, Value>,
    at: &str,
    family: MoeFamily,
    num_layers: usize,
    warnings: &mut Vec<String>,
) -> anyhow::Result<MoeConfig> {
    let class = family.class();
    let f = Fields::new(o, at);
    let uint = |key: &str| f.uint(key);
    let count =
        |key: &str, alt: Option<&str>, d: usize, w: &mut Vec<String>| -> anyhow::Result<usize> {
            let v = match uint(key)? {
                Some(v) => Some(v),
                None => match alt {
                    Some(a) => uint(a)?,
                    None => None,
                },
            };
            match v {
                Some(0) => anyhow::bail!("field '{at}{key}' is 0"),
                Some(v) => Ok(v),
                None => {
                    w.push(format!("{at}{key} absent: using {d} ({class}'s default)"));
                    Ok(d)
                }
            }
        };
    let (de, dk, di, ds) = match family {
        MoeFamily::Qwen3 => (128, 8, 768, 0),
        MoeFamily::Qwen35 => (256, 8, 512, 512),
    };
    // transformers 5's Qwen3MoeConfig stores num_experts as num_local_experts.
    let num_experts = count("num_experts", Some("num_local_experts"), de, warnings)?;
    let top_k = count("num_experts_per_tok", None, dk, warnings)?;
    if top_k > num_experts {
        anyhow::bail!("{at}num_experts_per_tok ({top_k}) exceeds num_experts ({num_experts})");
    }
    let expert_intermediate_size = count("moe_intermediate_size", None, di, warnings)?;
    let norm = match o.get("norm_topk_prob") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            anyhow::bail!("field {at}norm_topk_prob: expected true or false, found {other}")
        }
    };
    match family {
        MoeFamily::Qwen3 => {
            let norm_topk_prob = norm.unwrap_or_else(|| {
                warnings.push(format!(
                    "{at}norm_topk_prob absent: using false ({class}'s default: the top-k router weights are not renormalised)"
                ));
                false
            });
            let step = count("decoder_sparse_step", None, 1, warnings)?;
            let mlp_only = match o.get("mlp_only_layers") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(a)) => {
                    let mut v = Vec::with_capacity(a.len());
                    for (i, x) in a.iter().enumerate() {
                        match x.as_u64() {
                            Some(l) if (l as usize) < num_layers => v.push(l as usize),
                            _ => anyhow::bail!(
                                "{at}mlp_only_layers[{i}] = {x}: expected a layer index below num_hidden_layers ({num_layers})"
                            ),
                        }
                    }
                    v
                }
                Some(other) => {
                    anyhow::bail!("field {at}mlp_only_layers: expected a list, found {other}")
                }
            };
            Ok(MoeConfig {
                num_experts,
                top_k,
                expert_intermediate_size,
                shared_expert_intermediate_size: 0,
                norm_topk_prob,
                sparse_layers: qwen3_sparse_layers(num_layers, step, &mlp_only),
            })
        }
        MoeFamily::Qwen35 => {
            if norm == Some(false) {
                warnings.push(format!(
                    "{at}norm_topk_prob = false is not read by transformers' Qwen3_5MoeTopKRouter, which always renormalises the top-k weights; so does the built-in runtime"
                ));
            }
            let shared = count("shared_expert_intermediate_size", None, ds, warnings)?;
            Ok(MoeConfig {
                num_experts,
                top_k,
                expert_intermediate_size,
                shared_expert_intermediate_size: shared,
                norm_topk_prob: true,
                sparse_layers: vec![true; num_layers],
            })
        }
    }
}

/// The `synthetic:qwen3.6-35b-a3b` shape: the text decoder of `Qwen/Qwen3.6-35B-A3B` (and of
/// NVIDIA's `Qwen3.6-35B-A3B-NVFP4` export, whose `config.json` is in
/// `tests/fixtures/real/configs/`): hidden 2,048; 40 layers in 10 blocks of 3 Gated-DeltaNet +
/// 1 gated attention; attention 16 query / 2 KV heads of 256 with RoPE over the first 64
/// dimensions (`partial_rotary_factor` 0.25, θ = 10⁷); Gated-DeltaNet 16 key heads and 32
/// value heads of 128, width-4 convolution; every layer sparse: 256 experts, top-8, of width
/// 512, and a shared expert of width 512; vocabulary 248,320, untied; 262,144 positions; one
/// MTP layer (never loaded). `intermediate_size` is 0: no layer has a dense MLP.
pub fn qwen36_35b_a3b() -> ModelConfig {
    ModelConfig {
        arch: Arch::Qwen35,
        hidden_size: 2048,
        intermediate_size: 0,
        num_layers: 40,
        num_heads: 16,
        num_kv_heads: 2,
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
            layer_types: interval_pattern(40, 4),
            num_key_heads: 16,
            num_value_heads: 32,
            key_head_dim: 128,
            value_head_dim: 128,
            conv_kernel: 4,
            mtp_layers: 1,
        }),
        moe: Some(MoeConfig {
            num_experts: 256,
            top_k: 8,
            expert_intermediate_size: 512,
            shared_expert_intermediate_size: 512,
            norm_topk_prob: true,
            sparse_layers: vec![true; 40],
        }),
    }
}

/// The `synthetic:qwen3-30b-a3b` shape, as `Qwen/Qwen3-30B-A3B`'s `config.json` states it:
/// 48 layers, hidden 2,048, attention 32 query / 4 KV heads of 128 with q/k RMSNorm and RoPE
/// θ = 10⁶, every layer sparse (`decoder_sparse_step` 1, no `mlp_only_layers`): 128 experts,
/// top-8, of width 768, renormalised (`norm_topk_prob` true), no shared expert; dense
/// `intermediate_size` 6,144 (unused); vocabulary 151,936, untied; 40,960 positions.
pub fn qwen3_30b_a3b() -> ModelConfig {
    ModelConfig {
        arch: Arch::Qwen3,
        hidden_size: 2048,
        intermediate_size: 6144,
        num_layers: 48,
        num_heads: 32,
        num_kv_heads: 4,
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
        moe: Some(MoeConfig {
            num_experts: 128,
            top_k: 8,
            expert_intermediate_size: 768,
            shared_expert_intermediate_size: 0,
            norm_topk_prob: true,
            sparse_layers: vec![true; 48],
        }),
    }
}

/// The `synthetic:tiny-moe` shape: [`super::hybrid::tiny_hybrid`] (4 layers, 3 Gated-DeltaNet
/// and 1 gated attention, H = 64, the byte tokenizer's vocabulary of 320) with every MLP
/// sparse: 8 experts, top-2, of width 32, and a shared expert of width 48: milliseconds per
/// token on one CPU core, for tests and smoke runs.
pub fn tiny_moe() -> ModelConfig {
    let mut c = super::hybrid::tiny_hybrid();
    c.intermediate_size = 0;
    c.moe = Some(MoeConfig {
        num_experts: 8,
        top_k: 2,
        expert_intermediate_size: 32,
        shared_expert_intermediate_size: 48,
        norm_topk_prob: true,
        sparse_layers: vec![true; c.num_layers],
    });
    c
}
