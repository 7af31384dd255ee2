//! Model weights: linear layers stored in BF16, FP8 or NVFP4 (dequantized on the fly by the
//! backend's matmul), loaded from a local safetensors checkpoint or synthesized from a seed.
//!
//! Tensor names follow Hugging Face transformers (`model.layers.{i}.self_attn.q_proj.weight`,
//! ...). Quantized layouts follow NVIDIA ModelOpt exports as vLLM reads them:
//! - FP8: `weight` F8_E4M3 `[N, K]`, `weight_scale` F32 (scalar per tensor, or `[N]`/`[N, 1]`
//!   per channel), optional `input_scale` F32 scalar (static activation scale);
//! - NVFP4: `weight` U8 `[N, K/2]`, `weight_scale` F8_E4M3 `[N, K/16]`, `weight_scale_2` F32,
//!   see [`crate::formats::nvfp4`];
//! - FP8 KV cache scales: `self_attn.k_proj.k_scale` / `self_attn.v_proj.v_scale` (ModelOpt) or
//!   `self_attn.k_scale` / `self_attn.v_scale` (vLLM, compressed-tensors).
//!
//! By concern: this file holds the weight types ([`Linear`], [`LayerWeights`], [`GdnWeights`],
//! [`ModelWeights`]), their quantization and [`load_dir`]; `mapped` the memory-mapped
//! checkpoint; `moe` the mixture-of-experts weights; `synth` the seeded synthesis
//! ([`synthesize`], [`SplitMix64`]); `tests` the checkpoint writer of the tests and the loading
//! and quantization tests.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;

use super::config::{ModelConfig, QuantRecipe, WeightFormat};
use crate::formats::fp8::{self, Fp8Granularity, Fp8Tensor};
use crate::formats::nvfp4::{self, Nvfp4Weight, NVFP4_BLOCK};
use crate::formats::{e2m1, e4m3};

mod mapped;
mod moe;
mod synth;
#[cfg(test)]
pub(crate) mod tests;
pub use mapped::{LinearRole, LinearView, MappedCheckpoint, NormRole};
pub use moe::{synth_moe_tensor_id, ExpertWeights, MoeWeights, SharedExpertWeights};
pub use synth::{
    synth_stream_base, synth_tensor_id, synthesize, synthesize_with_progress, SplitMix64,
    SYNTH_GDN_A_LOG, SYNTH_GDN_DT_BIAS, SYNTH_LOGIT_STD, SYNTH_NORM_JITTER,
};

/// A linear layer's weight `[N, K]` (row-major, K contiguous), kept in its stored format.
#[derive(Debug, Clone, PartialEq)]
pub enum Linear {
    /// BF16 bit patterns, `n·k` of them.
    Bf16 {
        /// Rows N (output features).
        n: usize,
        /// Columns K (input features).
        k: usize,
        /// BF16 bits, row-major.
        data: Vec<u16>,
    },
    /// FP8 E4M3 weight with its scale(s).
    Fp8 {
        /// The weight.
        w: Fp8Tensor,
        /// Static per-tensor activation scale (`input_scale`); `None` = dynamic per-token
        /// (`amax(|x_row|) / 448`).
        input_scale: Option<f32>,
    },
    /// NVFP4 weight (ModelOpt layout), BF16/f32 activations (W4A16).
    Nvfp4(Nvfp4Weight),
}

impl Linear {
    /// `(N, K)`.
    pub fn shape(&self) -> (usize, usize) {
        match self {
            Linear::Bf16 { n, k, .. } => (*n, *k),
            Linear::Fp8 { w, .. } => (w.rows, w.cols),
            Linear::Nvfp4(w) => (w.n, w.k),
        }
    }

    /// The stored format.
    pub fn format(&self) -> WeightFormat {
        match self {
            Linear::Bf16 { .. } => WeightFormat::Bf16,
            Linear::Fp8 { .. } => WeightFormat::Fp8,
            Linear::Nvfp4(_) => WeightFormat::Nvfp4,
        }
    }

    /// Bytes the weight occupies as stored (elements and scales).
    pub fn stored_bytes(&self) -> usize {
        match self {
            Linear::Bf16 { data, .. } => data.len() * 2,
            Linear::Fp8 { w, .. } => w.data.len() + 4 * w.scales.len(),
            Linear::Nvfp4(w) => w.stream_bytes(),
        }
    }

    /// Dequantize row `row` (K values) into `out` (exactly K long): `bf16 → f32` exactly,
    /// `e4m3(q)·s` for FP8, `e2m1(q)·e4m3(block scale)·global scale` for NVFP4.
    #[inline]
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        match self {
            Linear::Bf16 { k, data, .. } => {
                for (o, b) in out.iter_mut().zip(&data[row * k..(row + 1) * k]) {
                    *o = f32::from_bits((*b as u32) << 16);
                }
            }
            Linear::Fp8 { w, .. } => {
                let s = w.row_scale(row);
                for (o, q) in out
                    .iter_mut()
                    .zip(&w.data[row * w.cols..(row + 1) * w.cols])
                {
                    *o = e4m3::decode(*q) * s;
                }
            }
            Linear::Nvfp4(w) => {
                let bpr = w.k / NVFP4_BLOCK;
                for b in 0..bpr {
                    let s = e4m3::decode(w.block_scales[row * bpr + b]) * w.global_scale;
                    let base = (row * w.k + b * NVFP4_BLOCK) / 2;
                    let dst = &mut out[b * NVFP4_BLOCK..(b + 1) * NVFP4_BLOCK];
                    for (j, byte) in w.packed[base..base + NVFP4_BLOCK / 2].iter().enumerate() {
                        dst[2 * j] = e2m1::decode(byte & 0xF) * s;
                        dst[2 * j + 1] = e2m1::decode(byte >> 4) * s;
                    }
                }
            }
        }
    }

    /// The whole weight dequantized to row-major f32 `[N, K]`.
    pub fn dequantize(&self) -> Vec<f32> {
        let (n, k) = self.shape();
        let mut out = vec![0f32; n * k];
        for r in 0..n {
            self.dequantize_row(r, &mut out[r * k..(r + 1) * k]);
        }
        out
    }

    /// Quantize a BF16 weight to `format` (FP8 per-tensor with dynamic per-token activations,
    /// or NVFP4 with ModelOpt's math); other formats are returned unchanged.
    ///
    /// # Errors
    /// A shape error from `formats` (NVFP4 needs K to be a multiple of 16).
    pub fn quantized(self, format: WeightFormat) -> anyhow::Result<Linear> {
        let Linear::Bf16 { n, k, .. } = &self else {
            return Ok(self);
        };
        let (n, k) = (*n, *k);
        match format {
            WeightFormat::Bf16 => Ok(self),
            WeightFormat::Fp8 => {
                let w = fp8::quantize(&self.dequantize(), n, k, Fp8Granularity::PerTensor)?;
                Ok(Linear::Fp8 {
                    w,
                    input_scale: None,
                })
            }
            WeightFormat::Nvfp4 => Ok(Linear::Nvfp4(nvfp4::quantize(&self.dequantize(), n, k)?)),
        }
    }

    /// Absolute maximum of a BF16 weight's values (NaN ignored); `None` for other formats.
    pub fn bf16_amax(&self) -> Option<f32> {
        match self {
            Linear::Bf16 { data, .. } => Some(data.iter().fold(0f32, |m, b| {
                let v = f32::from_bits((*b as u32) << 16).abs();
                if v.is_nan() {
                    m
                } else {
                    m.max(v)
                }
            })),
            _ => None,
        }
    }

    /// [`Linear::quantized`] with the per-tensor scale derived from `amax` instead of this
    /// weight's own absolute maximum: projections that engines fuse (q/k/v, gate/up) share one
    /// per-tensor scale, as NVIDIA ModelOpt exports them (its `preprocess_linear_fusion` unifies
    /// their amax so the fused layer has a single `weight_scale_2` / FP8 scale).
    ///
    /// # Errors
    /// As [`Linear::quantized`].
    pub fn quantized_with_amax(self, format: WeightFormat, amax: f32) -> anyhow::Result<Linear> {
        let Linear::Bf16 { n, k, .. } = &self else {
            return Ok(self);
        };
        let (n, k) = (*n, *k);
        match format {
            WeightFormat::Bf16 => Ok(self),
            WeightFormat::Fp8 => {
                let s = fp8::scale_from_amax(amax);
                let inv = 1.0 / s;
                let data = self
                    .dequantize()
                    .iter()
                    .map(|v| e4m3::encode(v * inv))
                    .collect();
                Ok(Linear::Fp8 {
                    w: Fp8Tensor {
                        rows: n,
                        cols: k,
                        data,
                        scales: vec![s],
                        granularity: Fp8Granularity::PerTensor,
                    },
                    input_scale: None,
                })
            }
            WeightFormat::Nvfp4 => Ok(Linear::Nvfp4(nvfp4::quantize_with_global_scale(
                &self.dequantize(),
                n,
                k,
                nvfp4::global_scale_from_amax(amax),
            )?)),
        }
    }

    /// Build a BF16 weight from f32 values (rounded to nearest even).
    pub fn bf16_from_f32(n: usize, k: usize, values: &[f32]) -> Linear {
        Linear::Bf16 {
            n,
            k,
            data: crate::formats::to_bf16_bits(values),
        }
    }
}

/// One decoder layer's weights.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// `input_layernorm.weight`, H.
    pub input_norm: Vec<f32>,
    /// `q_proj`, `[num_heads·head_dim, H]`.
    pub q: Linear,
    /// `k_proj`, `[num_kv_heads·head_dim, H]`.
    pub k: Linear,
    /// `v_proj`, `[num_kv_heads·head_dim, H]`.
    pub v: Linear,
    /// `o_proj`, `[H, num_heads·head_dim]`.
    pub o: Linear,
    /// Qwen3 `q_norm.weight`, head_dim (None for Llama).
    pub q_norm: Option<Vec<f32>>,
    /// Qwen3 `k_norm.weight`, head_dim (None for Llama).
    pub k_norm: Option<Vec<f32>>,
    /// `post_attention_layernorm.weight`, H.
    pub post_norm: Vec<f32>,
    /// `mlp.gate_proj`, `[I, H]`.
    pub gate: Linear,
    /// `mlp.up_proj`, `[I, H]`.
    pub up: Linear,
    /// `mlp.down_proj`, `[H, I]`.
    pub down: Linear,
    /// FP8 KV cache scale for K (checkpoint `k_scale`), if the checkpoint has one.
    pub k_scale: Option<f32>,
    /// FP8 KV cache scale for V (checkpoint `v_scale`), if the checkpoint has one.
    pub v_scale: Option<f32>,
    /// The Gated-DeltaNet mixer of a `linear_attention` layer of a hybrid; such a layer has no
    /// attention: its `q`, `k`, `v`, `o` are empty (0 × 0) and its q/k norms `None`.
    pub gdn: Option<GdnWeights>,
    /// The sparse MLP block of a mixture-of-experts layer; such a layer has no dense MLP: its
    /// `gate`, `up`, `down` are empty (0 × 0).
    pub moe: Option<MoeWeights>,
}

/// The Gated-DeltaNet mixer's weights of one layer (transformers' `Qwen3_5GatedDeltaNet`).
#[derive(Debug, Clone, PartialEq)]
pub struct GdnWeights {
    /// `in_proj_qkv`, `[2·key_dim + value_dim, H]`.
    pub qkv: Linear,
    /// `in_proj_z` (the output gate of the gated norm), `[value_dim, H]`.
    pub z: Linear,
    /// `in_proj_a` (decay input), `[value_heads, H]`.
    pub a: Linear,
    /// `in_proj_b` (β input), `[value_heads, H]`.
    pub b: Linear,
    /// `out_proj`, `[H, value_dim]`.
    pub out: Linear,
    /// `conv1d.weight` as `[conv_dim][K]` f32.
    pub conv_w: Vec<f32>,
    /// `A_log`, one per value head.
    pub a_log: Vec<f32>,
    /// `dt_bias`, one per value head.
    pub dt_bias: Vec<f32>,
    /// The gated RMSNorm weight, value_head_dim (used as stored).
    pub norm: Vec<f32>,
}

impl GdnWeights {
    /// The parameters other than the linears, for [`crate::runtime::gdn`].
    pub fn params(&self) -> crate::runtime::gdn::GdnParams<'_> {
        crate::runtime::gdn::GdnParams {
            conv_w: &self.conv_w,
            a_log: &self.a_log,
            dt_bias: &self.dt_bias,
        }
    }

    /// The five linears with their roles.
    pub fn linears(&self) -> [(LinearRole, &Linear); 5] {
        [
            (LinearRole::GdnQkv, &self.qkv),
            (LinearRole::GdnZ, &self.z),
            (LinearRole::GdnA, &self.a),
            (LinearRole::GdnB, &self.b),
            (LinearRole::GdnOut, &self.out),
        ]
    }

    fn extra_bytes(&self) -> usize {
        4 * (self.conv_w.len() + self.a_log.len() + self.dt_bias.len() + self.norm.len())
    }
}

impl LayerWeights {
    /// A Gated-DeltaNet layer: `input_norm`, the mixer, `post_norm` and the MLP
    /// (`[gate, up, down]`); the attention fields are empty.
    pub fn gdn_layer(
        input_norm: Vec<f32>,
        gdn: GdnWeights,
        post_norm: Vec<f32>,
        mlp: [Linear; 3],
    ) -> Self {
        let empty = || Linear::Bf16 {
            n: 0,
            k: 0,
            data: Vec::new(),
        };
        let [gate, up, down] = mlp;
        LayerWeights {
            input_norm,
            q: empty(),
            k: empty(),
            v: empty(),
            o: empty(),
            q_norm: None,
            k_norm: None,
            post_norm,
            gate,
            up,
            down,
            k_scale: None,
            v_scale: None,
            gdn: Some(gdn),
            moe: None,
        }
    }

    /// An empty (0 × 0) linear: the placeholder of a projection a layer does not have.
    pub fn empty_linear() -> Linear {
        Linear::Bf16 {
            n: 0,
            k: 0,
            data: Vec::new(),
        }
    }

    /// Make this layer's MLP the sparse block `moe` (its dense gate/up/down become empty).
    pub fn with_moe(mut self, moe: MoeWeights) -> Self {
        self.gate = Self::empty_linear();
        self.up = Self::empty_linear();
        self.down = Self::empty_linear();
        self.moe = Some(moe);
        self
    }

    /// Every linear of the layer with its role (the attention or the Gated-DeltaNet ones, then
    /// the MLP).
    pub fn linears(&self) -> Vec<(LinearRole, &Linear)> {
        let mut v: Vec<(LinearRole, &Linear)> = match &self.gdn {
            Some(g) => g.linears().to_vec(),
            None => vec![
                (LinearRole::Q, &self.q),
                (LinearRole::K, &self.k),
                (LinearRole::V, &self.v),
                (LinearRole::O, &self.o),
            ],
        };
        match &self.moe {
            Some(m) => v.extend(m.linears()),
            None => v.extend([
                (LinearRole::Gate, &self.gate),
                (LinearRole::Up, &self.up),
                (LinearRole::Down, &self.down),
            ]),
        }
        v
    }
}

/// A whole decoder's weights.
#[derive(Debug, Clone)]
pub struct ModelWeights {
    /// The shape (after `--num-layers` truncation).
    pub config: ModelConfig,
    /// `embed_tokens`, BF16 `[vocab, H]` (also the lm_head when tied).
    pub embed: Linear,
    /// Decoder layers.
    pub layers: Vec<LayerWeights>,
    /// Final `norm.weight`, H.
    pub norm: Vec<f32>,
    /// `lm_head`, `[vocab, H]`; `None` when tied to `embed`.
    pub lm_head: Option<Linear>,
}

impl ModelWeights {
    /// The lm_head (the embedding when tied).
    pub fn lm_head(&self) -> &Linear {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// The format of the decoder's linear layers: the first layer's first projection (q_proj,
    /// or in_proj_qkv of a Gated-DeltaNet layer; mixed checkpoints report their attention
    /// format).
    pub fn linear_format(&self) -> WeightFormat {
        self.layers
            .first()
            .map(|l| match &l.gdn {
                Some(g) => g.qkv.format(),
                None => l.q.format(),
            })
            .unwrap_or(WeightFormat::Bf16)
    }

    /// Bytes of all weights as stored.
    pub fn stored_bytes(&self) -> usize {
        let mut b = self.embed.stored_bytes() + 4 * self.norm.len();
        if let Some(h) = &self.lm_head {
            b += h.stored_bytes();
        }
        for l in &self.layers {
            for (_, w) in l.linears() {
                b += w.stored_bytes();
            }
            if let Some(g) = &l.gdn {
                b += g.extra_bytes();
            }
        }
        b
    }

    /// Quantize every decoder linear layer stored in BF16 to `format` (embedding and lm_head stay
    /// BF16, as ModelOpt exports leave them by default; so do Gated-DeltaNet's `in_proj_a` /
    /// `in_proj_b`). q/k/v share one per-tensor scale, and so do gate/up and Gated-DeltaNet's
    /// in_proj_qkv/in_proj_z (see [`Linear::quantized_with_amax`]): serving engines, and the
    /// CUDA backend, run each group as one fused GEMM.
    ///
    /// # Errors
    /// A shape error when a K is not a multiple of 16 for NVFP4.
    pub fn quantize(&mut self, format: WeightFormat) -> anyhow::Result<()> {
        self.quantize_recipe(QuantRecipe::Uniform(format))
    }

    /// Quantize the BF16 linears by `recipe` ([`QuantRecipe::format_for`] per role, the fused
    /// groups of [`Self::quantize`] sharing one per-tensor scale); the untied lm_head too when
    /// the recipe names a format for it.
    ///
    /// # Errors
    /// As [`Self::quantize`].
    pub fn quantize_recipe(&mut self, recipe: QuantRecipe) -> anyhow::Result<()> {
        if recipe == QuantRecipe::Uniform(WeightFormat::Bf16) {
            return Ok(());
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let group = |ws: &[&Linear]| -> f32 {
            ws.iter().filter_map(|w| w.bf16_amax()).fold(0f32, f32::max)
        };
        for (i, l) in self.layers.iter_mut().enumerate() {
            let gu = group(&[&l.gate, &l.up]);
            let own_d = l.down.bf16_amax().unwrap_or(0.0);
            let mut slots: Vec<(&mut Linear, f32, WeightFormat)> = Vec::new();
            match &mut l.gdn {
                Some(g) => {
                    let qz = group(&[&g.qkv, &g.z]);
                    let own_out = g.out.bf16_amax().unwrap_or(0.0);
                    let own_a = g.a.bf16_amax().unwrap_or(0.0);
                    let own_b = g.b.bf16_amax().unwrap_or(0.0);
                    slots.push((&mut g.qkv, qz, recipe.format_for(LinearRole::GdnQkv)));
                    slots.push((&mut g.z, qz, recipe.format_for(LinearRole::GdnZ)));
                    slots.push((&mut g.a, own_a, recipe.format_for(LinearRole::GdnA)));
                    slots.push((&mut g.b, own_b, recipe.format_for(LinearRole::GdnB)));
                    slots.push((&mut g.out, own_out, recipe.format_for(LinearRole::GdnOut)));
                }
                None => {
                    let qkv = group(&[&l.q, &l.k, &l.v]);
                    let own_o = l.o.bf16_amax().unwrap_or(0.0);
                    slots.push((&mut l.q, qkv, recipe.format_for(LinearRole::Q)));
                    slots.push((&mut l.k, qkv, recipe.format_for(LinearRole::K)));
                    slots.push((&mut l.v, qkv, recipe.format_for(LinearRole::V)));
                    slots.push((&mut l.o, own_o, recipe.format_for(LinearRole::O)));
                }
            }
            match &mut l.moe {
                Some(m) => {
                    // One per-tensor scale per group (an expert's gate/up, as engines fuse
                    // them), every other linear its own.
                    let mut amax: HashMap<usize, f32> = HashMap::new();
                    for (_, w, g) in m.linears_mut() {
                        let a = w.bf16_amax().unwrap_or(0.0);
                        let e = amax.entry(g).or_insert(0.0);
                        *e = e.max(a);
                    }
                    for (role, w, g) in m.linears_mut() {
                        slots.push((w, amax[&g], recipe.format_for(role)));
                    }
                }
                None => {
                    slots.push((&mut l.gate, gu, recipe.format_for(LinearRole::Gate)));
                    slots.push((&mut l.up, gu, recipe.format_for(LinearRole::Up)));
                    slots.push((&mut l.down, own_d, recipe.format_for(LinearRole::Down)));
                }
            }
            let results: Vec<anyhow::Result<()>> = std::thread::scope(|s| {
                let chunk = slots.len().div_ceil(threads.max(1));
                let handles: Vec<_> = slots
                    .chunks_mut(chunk.max(1))
                    .map(|group| {
                        s.spawn(move || -> anyhow::Result<()> {
                            for (w, amax, fmt) in group.iter_mut() {
                                let owned = std::mem::replace(
                                    &mut **w,
                                    Linear::Bf16 {
                                        n: 0,
                                        k: 0,
                                        data: Vec::new(),
                                    },
                                );
                                **w = owned.quantized_with_amax(*fmt, *amax)?;
                            }
                            Ok(())
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(anyhow::anyhow!("quantizer thread panicked")))
                    })
                    .collect()
            });
            for r in results {
                r.with_context(|| format!("quantizing layer {i} to {}", recipe.id()))?;
            }
        }
        let head = recipe.lm_head_format();
        if head != WeightFormat::Bf16 {
            if let Some(h) = self.lm_head.take() {
                let q = h.quantized(head).context("quantizing lm_head")?;
                self.lm_head = Some(q);
            }
        }
        Ok(())
    }
}

/// Load a checkpoint directory's weights for `config` (its first `config.num_layers` layers):
/// the shards are memory-mapped ([`MappedCheckpoint`]) and the CPU backend's owned weights built
/// tensor by tensor (FP16/FP32 weights converted to BF16).
///
/// # Errors
/// [`RigError::BadFile`] naming the folder, file or tensor: a checkpoint the runtime refuses
/// (with `rigbench inspect`'s finding id), a tensor missing, of the wrong shape or of an
/// unsupported dtype.
pub fn load_dir(dir: &Path, config: &ModelConfig) -> anyhow::Result<ModelWeights> {
    MappedCheckpoint::open(dir, config)?.to_weights()
}
