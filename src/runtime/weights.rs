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

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;

use super::config::{ModelConfig, QuantRecipe, WeightFormat};
use crate::formats::fp8::{self, Fp8Granularity, Fp8Tensor};
use crate::formats::nvfp4::{self, Nvfp4Weight, NVFP4_BLOCK};
use crate::formats::{e2m1, e4m3};

mod mapped;
mod moe;
pub use mapped::{LinearRole, LinearView, MappedCheckpoint, NormRole};
pub use moe::{ExpertWeights, MoeWeights, SharedExpertWeights};

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

/// Deterministic normal generator for synthesized weights: SplitMix64 (Steele, Lea and Flood,
/// "Fast splittable pseudorandom number generators", OOPSLA 2014) feeding Box-Muller. Written
/// here rather than taken from `rand` so that a seed gives the same weights across crate
/// versions and thread counts.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    #[inline]
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// Two independent standard normals (Box-Muller).
    #[inline]
    pub fn normal_pair(&mut self) -> (f32, f32) {
        let r = (-2.0 * self.unit().ln()).sqrt();
        let t = 2.0 * std::f64::consts::PI * self.unit();
        ((r * t.cos()) as f32, (r * t.sin()) as f32)
    }
}

fn mix(a: u64, b: u64) -> u64 {
    SplitMix64::new(a ^ b.wrapping_mul(0xD6E8_FEB8_6659_FD93)).next_u64()
}

/// The SplitMix64 stream base of synthesized tensor `tensor_id` under `seed`: chunk `c` of the
/// tensor is generated from `SplitMix64::new(mix(base, c))`. The CUDA backend's `rt_synth_bf16`
/// kernel starts from the same base, so both backends synthesize identical weights.
pub fn synth_stream_base(seed: u64, tensor_id: u64) -> u64 {
    mix(seed, tensor_id)
}

/// Tensor ids of [`synthesize`]: embedding 1, final norm 2, lm_head 3, and for layer `i` the
/// ids `1000 + 100·i + j` with `j` = 0 input norm, 1 q, 2 k, 3 v, 4 o, 5 q_norm, 6 k_norm,
/// 7 post-attention norm, 8 gate, 9 up, 10 down; Gated-DeltaNet layers use 11 in_proj_qkv,
/// 12 in_proj_z, 13 in_proj_a, 14 in_proj_b, 15 out_proj, 16 conv1d, 17 A_log, 18 dt_bias,
/// 19 the gated norm (and 0, 7–10 as above).
pub fn synth_tensor_id(layer: Option<usize>, j: u64) -> u64 {
    match layer {
        None => j,
        Some(i) => 1000 + 100 * i as u64 + j,
    }
}

/// Elements generated per independently seeded chunk (so results do not depend on threads).
const SYNTH_CHUNK: usize = 1 << 16;

/// `len` BF16 values `~ N(mean, std²)` from `(seed, tensor_id)`, generated in parallel.
fn synth_bf16(seed: u64, tensor_id: u64, len: usize, mean: f32, std: f32) -> Vec<u16> {
    let mut out = vec![0u16; len];
    let base = synth_stream_base(seed, tensor_id);
    let fill = |ci: usize, chunk: &mut [u16]| {
        let mut rng = SplitMix64::new(mix(base, ci as u64));
        let mut i = 0;
        while i < chunk.len() {
            let (a, b) = rng.normal_pair();
            chunk[i] = half::bf16::from_f32(mean + std * a).to_bits();
            if i + 1 < chunk.len() {
                chunk[i + 1] = half::bf16::from_f32(mean + std * b).to_bits();
            }
            i += 2;
        }
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunks: Vec<(usize, &mut [u16])> = out.chunks_mut(SYNTH_CHUNK).enumerate().collect();
    if threads <= 1 || chunks.len() <= 1 {
        for (ci, c) in chunks {
            fill(ci, c);
        }
    } else {
        let per = chunks.len().div_ceil(threads);
        let mut groups: Vec<Vec<(usize, &mut [u16])>> = Vec::new();
        let mut it = chunks.into_iter().peekable();
        while it.peek().is_some() {
            groups.push(it.by_ref().take(per).collect());
        }
        std::thread::scope(|s| {
            for g in groups {
                s.spawn(move || {
                    for (ci, c) in g {
                        fill(ci, c);
                    }
                });
            }
        });
    }
    out
}

pub(crate) fn synth_linear(seed: u64, id: u64, n: usize, k: usize, std: f32) -> Linear {
    Linear::Bf16 {
        n,
        k,
        data: synth_bf16(seed, id, n * k, 0.0, std),
    }
}

fn synth_norm(seed: u64, id: u64, len: usize) -> Vec<f32> {
    crate::formats::from_bf16_bits(&synth_bf16(seed, id, len, 1.0, SYNTH_NORM_JITTER))
}

/// Standard deviation of the jitter around 1.0 of synthesized RMSNorm weights: non-unit so that
/// a forward pass that forgot to apply a norm weight differs from the reference.
pub const SYNTH_NORM_JITTER: f32 = 0.1;

/// Logit spread targeted by synthesized embedding/lm_head weights: with a unit-RMS final hidden
/// state, `std(logit) ≈ sqrt(H) · std(w) = SYNTH_LOGIT_STD`, so sampling is neither uniform nor
/// one-hot.
pub const SYNTH_LOGIT_STD: f32 = 2.5;

/// Synthesize BF16 weights for `config` from `seed`: linear weights `~ N(0, 1/fan_in)` (so
/// activations keep unit scale through each projection), RMSNorm weights `~ N(1, 0.1²)`,
/// embedding and lm_head `~ N(0, (2.5/sqrt(H))²)`. Every tensor has its own stream, so a
/// truncated model (`--num-layers`) shares its layers with the full one.
pub fn synthesize(config: &ModelConfig, seed: u64) -> ModelWeights {
    synthesize_with_progress(config, seed, &mut |_, _| {})
}

/// [`synthesize`], calling `progress(layers done, layers)` after each decoder layer (and once
/// with `(0, layers)` before the first), so a caller can show progress on large presets.
pub fn synthesize_with_progress(
    config: &ModelConfig,
    seed: u64,
    progress: &mut dyn FnMut(usize, usize),
) -> ModelWeights {
    let h = config.hidden_size;
    progress(0, config.num_layers);
    let inv = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
    let emb_std = SYNTH_LOGIT_STD / (h as f32).sqrt();
    let mut layers = Vec::with_capacity(config.num_layers);
    for i in 0..config.num_layers {
        let id = |j: u64| synth_tensor_id(Some(i), j);
        let mlp = || {
            [
                synth_linear(seed, id(8), config.intermediate_size, h, inv(h)),
                synth_linear(seed, id(9), config.intermediate_size, h, inv(h)),
                synth_linear(
                    seed,
                    id(10),
                    h,
                    config.intermediate_size,
                    inv(config.intermediate_size),
                ),
            ]
        };
        let sparse = |l: LayerWeights| match &config.moe {
            Some(m) if m.is_sparse(i) => l.with_moe(moe::synthesize(seed, i, h, m)),
            _ => l,
        };
        let dense_mlp = || {
            if config.is_sparse_layer(i) {
                [
                    LayerWeights::empty_linear(),
                    LayerWeights::empty_linear(),
                    LayerWeights::empty_linear(),
                ]
            } else {
                mlp()
            }
        };
        if let (Some(hy), crate::runtime::hybrid::LayerType::Gdn) =
            (&config.hybrid, config.layer_type(i))
        {
            let gdn = synth_gdn(seed, &id, h, hy);
            layers.push(sparse(LayerWeights::gdn_layer(
                synth_norm(seed, id(0), h),
                gdn,
                synth_norm(seed, id(7), h),
                dense_mlp(),
            )));
            progress(i + 1, config.num_layers);
            continue;
        }
        let [gate, up, down] = dense_mlp();
        layers.push(sparse(LayerWeights {
            input_norm: synth_norm(seed, id(0), h),
            q: synth_linear(seed, id(1), config.q_proj_rows(), h, inv(h)),
            k: synth_linear(seed, id(2), config.kv_dim(), h, inv(h)),
            v: synth_linear(seed, id(3), config.kv_dim(), h, inv(h)),
            o: synth_linear(seed, id(4), h, config.q_dim(), inv(config.q_dim())),
            q_norm: config
                .has_qk_norm()
                .then(|| synth_norm(seed, id(5), config.head_dim)),
            k_norm: config
                .has_qk_norm()
                .then(|| synth_norm(seed, id(6), config.head_dim)),
            post_norm: synth_norm(seed, id(7), h),
            gate,
            up,
            down,
            k_scale: None,
            v_scale: None,
            gdn: None,
            moe: None,
        }));
        progress(i + 1, config.num_layers);
    }
    ModelWeights {
        config: config.clone(),
        embed: synth_linear(seed, 1, config.vocab_size, h, emb_std),
        layers,
        norm: synth_norm(seed, 2, h),
        lm_head: (!config.tie_word_embeddings)
            .then(|| synth_linear(seed, 3, config.vocab_size, h, emb_std)),
    }
}

/// Mean and standard deviation of synthesized Gated-DeltaNet parameters other than the linears
/// (`(mean, std)` of the BF16 normals): `conv1d` N(0, 1/K) (unit-variance outputs from
/// unit-variance inputs), `A_log` N(−1, 0.5²) and `dt_bias` N(0, 0.5²) (decays
/// `exp(−e^{A_log} · softplus(a + dt_bias))` around 0.6 per token: the state keeps a few tokens'
/// history, in the range trained models show), the gated norm N(1, 0.1²) like every norm.
pub const SYNTH_GDN_A_LOG: (f32, f32) = (-1.0, 0.5);
/// See [`SYNTH_GDN_A_LOG`].
pub const SYNTH_GDN_DT_BIAS: (f32, f32) = (0.0, 0.5);

/// A synthesized Gated-DeltaNet mixer (tensor ids 11–19 of [`synth_tensor_id`]).
fn synth_gdn(
    seed: u64,
    id: &dyn Fn(u64) -> u64,
    h: usize,
    hy: &crate::runtime::hybrid::HybridConfig,
) -> GdnWeights {
    let inv = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
    let f32s = |j: u64, len: usize, (mean, std): (f32, f32)| {
        crate::formats::from_bf16_bits(&synth_bf16(seed, id(j), len, mean, std))
    };
    let (cd, vd, nv) = (hy.conv_dim(), hy.value_dim(), hy.num_value_heads);
    GdnWeights {
        qkv: synth_linear(seed, id(11), cd, h, inv(h)),
        z: synth_linear(seed, id(12), vd, h, inv(h)),
        a: synth_linear(seed, id(13), nv, h, inv(h)),
        b: synth_linear(seed, id(14), nv, h, inv(h)),
        out: synth_linear(seed, id(15), h, vd, inv(vd)),
        conv_w: f32s(16, cd * hy.conv_kernel, (0.0, inv(hy.conv_kernel))),
        a_log: f32s(17, nv, SYNTH_GDN_A_LOG),
        dt_bias: f32s(18, nv, SYNTH_GDN_DT_BIAS),
        norm: f32s(19, hy.value_head_dim, (1.0, SYNTH_NORM_JITTER)),
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;

    /// The `config.json` of `c` in transformers' form (`qwen3`, or `qwen3_5_text` for hybrids,
    /// with `mamba_ssm_dtype: float32` as the published Qwen3.5 / 3.6 configs).
    pub(crate) fn config_json(c: &ModelConfig) -> serde_json::Value {
        let mut cfg = serde_json::json!({
            "model_type": "qwen3", "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "vocab_size": c.vocab_size,
            "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
            "max_position_embeddings": c.max_position_embeddings,
            "tie_word_embeddings": c.tie_word_embeddings, "eos_token_id": c.eos_token_ids,
        });
        if let Some(h) = &c.hybrid {
            let m = cfg.as_object_mut().unwrap();
            m.remove("rope_theta");
            let types: Vec<&str> = h.layer_types[..c.num_layers]
                .iter()
                .map(|t| match t {
                    crate::runtime::hybrid::LayerType::Attention => "full_attention",
                    crate::runtime::hybrid::LayerType::Gdn => "linear_attention",
                })
                .collect();
            for (k, v) in [
                ("model_type", serde_json::json!("qwen3_5_text")),
                ("architectures", serde_json::json!(["Qwen3_5ForCausalLM"])),
                ("hidden_act", serde_json::json!("silu")),
                ("layer_types", serde_json::json!(types)),
                ("linear_conv_kernel_dim", serde_json::json!(h.conv_kernel)),
                ("linear_key_head_dim", serde_json::json!(h.key_head_dim)),
                ("linear_value_head_dim", serde_json::json!(h.value_head_dim)),
                ("linear_num_key_heads", serde_json::json!(h.num_key_heads)),
                (
                    "linear_num_value_heads",
                    serde_json::json!(h.num_value_heads),
                ),
                ("mamba_ssm_dtype", serde_json::json!("float32")),
                ("dtype", serde_json::json!("bfloat16")),
                (
                    "rope_parameters",
                    serde_json::json!({"rope_type": "default", "rope_theta": c.rope_theta,
                        "partial_rotary_factor": c.rotary_dim as f64 / c.head_dim as f64}),
                ),
            ] {
                m.insert(k.into(), v);
            }
        }
        cfg
    }

    /// Write `weights` as a ModelOpt-style safetensors checkpoint with its config.json into
    /// `dir` (used by loader tests here and in the backend tests).
    pub(crate) fn write_checkpoint(dir: &Path, w: &ModelWeights) {
        let mut bufs: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let lin = |name: &str, l: &Linear, bufs: &mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>| {
            match l {
                Linear::Bf16 { n, k, data } => bufs.push((
                    format!("{name}.weight"),
                    Dtype::BF16,
                    vec![*n, *k],
                    data.iter().flat_map(|x| x.to_le_bytes()).collect(),
                )),
                Linear::Fp8 { w, input_scale } => {
                    bufs.push((
                        format!("{name}.weight"),
                        Dtype::F8_E4M3,
                        vec![w.rows, w.cols],
                        w.data.clone(),
                    ));
                    bufs.push((
                        format!("{name}.weight_scale"),
                        Dtype::F32,
                        vec![],
                        f32s(&w.scales),
                    ));
                    if let Some(s) = input_scale {
                        bufs.push((
                            format!("{name}.input_scale"),
                            Dtype::F32,
                            vec![],
                            f32s(&[*s]),
                        ));
                    }
                }
                Linear::Nvfp4(w) => {
                    bufs.push((
                        format!("{name}.weight"),
                        Dtype::U8,
                        vec![w.n, w.k / 2],
                        w.packed.clone(),
                    ));
                    bufs.push((
                        format!("{name}.weight_scale"),
                        Dtype::F8_E4M3,
                        vec![w.n, w.k / 16],
                        w.block_scales.clone(),
                    ));
                    bufs.push((
                        format!("{name}.weight_scale_2"),
                        Dtype::F32,
                        vec![],
                        f32s(&[w.global_scale]),
                    ));
                }
            }
        };
        // The Qwen3.5 family stores its zero-centred norms as w (applied as 1 + w).
        let hybrid = w.config.is_hybrid();
        let norm = |v: &[f32]| -> Vec<u8> {
            if hybrid {
                f32s(&v.iter().map(|x| x - 1.0).collect::<Vec<f32>>())
            } else {
                f32s(v)
            }
        };
        lin("model.embed_tokens", &w.embed, &mut bufs);
        if let Some(h) = &w.lm_head {
            lin("lm_head", h, &mut bufs);
        }
        bufs.push((
            "model.norm.weight".into(),
            Dtype::F32,
            vec![w.norm.len()],
            norm(&w.norm),
        ));
        for (i, l) in w.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            for (role, x) in l.linears() {
                lin(&format!("{p}.{}", role.module()), x, &mut bufs);
            }
            if let Some(g) = &l.gdn {
                let c = g.conv_w.len() / w.config.hybrid.as_ref().map_or(1, |h| h.conv_kernel);
                let kk = g.conv_w.len() / c.max(1);
                for (n, shape, v) in [
                    ("conv1d.weight", vec![c, 1, kk], &g.conv_w),
                    ("A_log", vec![g.a_log.len()], &g.a_log),
                    ("dt_bias", vec![g.dt_bias.len()], &g.dt_bias),
                    ("norm.weight", vec![g.norm.len()], &g.norm),
                ] {
                    bufs.push((format!("{p}.linear_attn.{n}"), Dtype::F32, shape, f32s(v)));
                }
            }
            bufs.push((
                format!("{p}.input_layernorm.weight"),
                Dtype::F32,
                vec![l.input_norm.len()],
                norm(&l.input_norm),
            ));
            bufs.push((
                format!("{p}.post_attention_layernorm.weight"),
                Dtype::F32,
                vec![l.post_norm.len()],
                norm(&l.post_norm),
            ));
            if let (Some(q), Some(k)) = (&l.q_norm, &l.k_norm) {
                bufs.push((
                    format!("{p}.self_attn.q_norm.weight"),
                    Dtype::F32,
                    vec![q.len()],
                    norm(q),
                ));
                bufs.push((
                    format!("{p}.self_attn.k_norm.weight"),
                    Dtype::F32,
                    vec![k.len()],
                    norm(k),
                ));
            }
            if let Some(s) = l.k_scale {
                bufs.push((
                    format!("{p}.self_attn.k_proj.k_scale"),
                    Dtype::F32,
                    vec![],
                    f32s(&[s]),
                ));
            }
            if let Some(s) = l.v_scale {
                bufs.push((
                    format!("{p}.self_attn.v_proj.v_scale"),
                    Dtype::F32,
                    vec![],
                    f32s(&[s]),
                ));
            }
        }
        let views: Vec<(String, TensorView)> = bufs
            .iter()
            .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        let bytes = safetensors::serialize(views, None).unwrap();
        std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
        let c = &w.config;
        let cfg = config_json(c);
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        write_quant_config(dir, w);
    }

    /// Write hf_quant_config.json for quantized weights: ModelOpt's MIXED_PRECISION form when
    /// several formats are mixed, else one algorithm for every linear layer.
    fn write_quant_config(dir: &Path, w: &ModelWeights) {
        let c = &w.config;
        // Several quantized formats: ModelOpt's MIXED_PRECISION form, one entry per quantized
        // module (as NVIDIA's Qwen3.6 exports).
        let algo_of = |l: &Linear| match l {
            Linear::Fp8 { .. } => Some(serde_json::json!({"quant_algo": "FP8"})),
            Linear::Nvfp4(_) => {
                Some(serde_json::json!({"quant_algo": "W4A16_NVFP4", "group_size": 16}))
            }
            Linear::Bf16 { .. } => None,
        };
        let mut layers = serde_json::Map::new();
        let mut formats = std::collections::BTreeSet::new();
        for (i, l) in w.layers.iter().enumerate() {
            for (role, x) in l.linears() {
                if let Some(a) = algo_of(x) {
                    formats.insert(x.format().id());
                    layers.insert(format!("model.layers.{i}.{}", role.module()), a);
                }
            }
        }
        if let Some(a) = w.lm_head.as_ref().and_then(algo_of) {
            formats.insert(w.lm_head().format().id());
            layers.insert("lm_head".into(), a);
        }
        if formats.len() > 1 {
            let q = serde_json::json!({
                "producer": {"name": "modelopt", "version": "0.44.0"},
                "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": null,
                    "quantized_layers": layers},
            });
            std::fs::write(dir.join("hf_quant_config.json"), q.to_string()).unwrap();
            return;
        }
        // ModelOpt's quantization metadata for quantized weights (without it, the metadata
        // declares BF16 and the loader refuses the checkpoint as inspect's
        // metadata-tensor-mismatch).
        let algo = match w.linear_format() {
            WeightFormat::Bf16 => None,
            WeightFormat::Fp8 => Some("FP8_PER_CHANNEL_PER_TOKEN"),
            WeightFormat::Nvfp4 => Some("W4A16_NVFP4"),
        };
        if let Some(algo) = algo {
            let mut exclude = vec!["lm_head"];
            if c.is_hybrid() {
                // ModelOpt leaves the Gated-DeltaNet decay and β inputs in BF16.
                exclude.extend([
                    "*linear_attn.in_proj_a",
                    "*linear_attn.in_proj_b",
                    "*conv1d",
                ]);
            }
            let q = serde_json::json!({
                "producer": {"name": "modelopt", "version": "0.29.0"},
                "quantization": {"quant_algo": algo, "group_size": 16,
                    "kv_cache_quant_algo": null, "exclude_modules": exclude},
            });
            std::fs::write(dir.join("hf_quant_config.json"), q.to_string()).unwrap();
        }
    }

    #[test]
    fn synthesis_is_deterministic_and_scaled() {
        let c = ModelConfig::tiny();
        let a = synthesize(&c, 7);
        let b = synthesize(&c, 7);
        let d = synthesize(&c, 8);
        assert_eq!(a.layers[1].q, b.layers[1].q);
        assert_ne!(a.layers[1].q, d.layers[1].q);
        let q = a.layers[0].gate.dequantize();
        let var = q.iter().map(|x| x * x).sum::<f32>() / q.len() as f32;
        let want = 1.0 / c.hidden_size as f32;
        assert!((var / want - 1.0).abs() < 0.1, "variance {var} vs {want}");
        // A truncated model shares its layers with the full one.
        let mut c1 = c.clone();
        c1.num_layers = 1;
        assert_eq!(synthesize(&c1, 7).layers[0].down, a.layers[0].down);
    }

    #[test]
    fn quantize_keeps_shapes_and_changes_values() {
        let mut w = synthesize(&ModelConfig::tiny(), 1);
        let before = w.layers[0].up.dequantize();
        w.quantize(WeightFormat::Nvfp4).unwrap();
        assert_eq!(w.linear_format(), WeightFormat::Nvfp4);
        assert_eq!(w.embed.format(), WeightFormat::Bf16);
        let after = w.layers[0].up.dequantize();
        assert_eq!(before.len(), after.len());
        assert_ne!(before, after);
        assert!(w.stored_bytes() < synthesize(&ModelConfig::tiny(), 1).stored_bytes());
    }

    #[test]
    fn checkpoint_round_trip_all_formats() {
        for fmt in [WeightFormat::Bf16, WeightFormat::Fp8, WeightFormat::Nvfp4] {
            let mut w = synthesize(&ModelConfig::tiny(), 3);
            w.quantize(fmt).unwrap();
            w.layers[1].k_scale = Some(0.5);
            let dir = tempfile::tempdir().unwrap();
            write_checkpoint(dir.path(), &w);
            let cfg = ModelConfig::read_hf_config(&dir.path().join("config.json"))
                .unwrap()
                .config;
            let back = load_dir(dir.path(), &cfg).unwrap();
            assert_eq!(back.layers.len(), 2);
            assert_eq!(back.layers[1].down, w.layers[1].down, "{fmt:?}");
            assert_eq!(back.layers[1].k_scale, Some(0.5));
            assert_eq!(back.layers[0].k_scale, None);
            assert_eq!(back.embed, w.embed);
            assert!(back.lm_head.is_none());
            // --num-layers 1 reads only the first layer.
            let mut c1 = cfg.clone();
            c1.num_layers = 1;
            assert_eq!(load_dir(dir.path(), &c1).unwrap().layers.len(), 1);
        }
    }

    #[test]
    fn hybrid_checkpoint_round_trip_and_recipe() {
        let c = crate::runtime::hybrid::tiny_hybrid();
        for recipe in [
            QuantRecipe::Uniform(WeightFormat::Bf16),
            QuantRecipe::Uniform(WeightFormat::Fp8),
            QuantRecipe::Uniform(WeightFormat::Nvfp4),
        ] {
            let mut w = synthesize(&c, 3);
            w.quantize_recipe(recipe).unwrap();
            let dir = tempfile::tempdir().unwrap();
            write_checkpoint(dir.path(), &w);
            let cfg = ModelConfig::read_hf_config(&dir.path().join("config.json"))
                .unwrap()
                .config;
            assert_eq!(cfg, c, "{recipe:?}");
            let back = load_dir(dir.path(), &cfg).unwrap();
            for (a, b) in back.layers.iter().zip(&w.layers) {
                assert_eq!(a.linears(), b.linears(), "{recipe:?}");
                assert_eq!(a.gdn, b.gdn);
                for (x, y) in a.input_norm.iter().zip(&b.input_norm) {
                    assert!((x - y).abs() < 1e-6, "1 + (w - 1) round trip");
                }
            }
        }
        // The mixed recipe: NVFP4 MLP and lm_head, FP8 attention and GDN projections, BF16 a/b.
        let mut c2 = c.clone();
        c2.tie_word_embeddings = false;
        let mut w = synthesize(&c2, 3);
        w.quantize_recipe(QuantRecipe::Nvfp4Mixed).unwrap();
        // Written as ModelOpt's MIXED_PRECISION export (whose FP8 modules carry a static
        // activation scale, as NVIDIA's do), it loads module by module in its own formats.
        let mut exported = w.clone();
        let set = |l: &mut Linear| {
            if let Linear::Fp8 { input_scale, .. } = l {
                *input_scale = Some(0.02);
            }
        };
        for l in &mut exported.layers {
            for x in [&mut l.q, &mut l.k, &mut l.v, &mut l.o] {
                set(x);
            }
            if let Some(g) = &mut l.gdn {
                for x in [&mut g.qkv, &mut g.z, &mut g.out] {
                    set(x);
                }
            }
        }
        let w = exported;
        let dir = tempfile::tempdir().unwrap();
        write_checkpoint(dir.path(), &w);
        let m = MappedCheckpoint::open(dir.path(), &c2).unwrap();
        assert_eq!(
            m.formats(),
            &[WeightFormat::Bf16, WeightFormat::Fp8, WeightFormat::Nvfp4]
        );
        let back = m.to_weights().unwrap();
        for (a, b) in back.layers.iter().zip(&w.layers) {
            assert_eq!(a.linears(), b.linears());
        }
        assert_eq!(back.lm_head, w.lm_head);
        let g = w.layers[0].gdn.as_ref().unwrap();
        assert_eq!(
            [
                g.qkv.format(),
                g.z.format(),
                g.a.format(),
                g.b.format(),
                g.out.format()
            ],
            [
                WeightFormat::Fp8,
                WeightFormat::Fp8,
                WeightFormat::Bf16,
                WeightFormat::Bf16,
                WeightFormat::Fp8
            ]
        );
        let attn = &w.layers[3];
        assert_eq!(
            [
                attn.q.format(),
                attn.o.format(),
                attn.gate.format(),
                attn.down.format()
            ],
            [
                WeightFormat::Fp8,
                WeightFormat::Fp8,
                WeightFormat::Nvfp4,
                WeightFormat::Nvfp4
            ]
        );
        assert_eq!(w.lm_head().format(), WeightFormat::Nvfp4);
        assert_eq!(w.embed.format(), WeightFormat::Bf16);
        // in_proj_qkv and in_proj_z run as one GEMM: one per-tensor scale.
        let scale = |l: &Linear| match l {
            Linear::Fp8 { w, .. } => w.scales.clone(),
            _ => panic!("FP8 expected"),
        };
        assert_eq!(scale(&g.qkv), scale(&g.z));
    }

    #[test]
    fn loader_errors_name_the_tensor() {
        let w = synthesize(&ModelConfig::tiny(), 3);
        let dir = tempfile::tempdir().unwrap();
        write_checkpoint(dir.path(), &w);
        let mut cfg = ModelConfig::read_hf_config(&dir.path().join("config.json"))
            .unwrap()
            .config;
        cfg.hidden_size = 32;
        let e = load_dir(dir.path(), &cfg).unwrap_err().to_string();
        assert!(e.contains("tensor 'model.") && e.contains("shape"), "{e}");
        let mut cfg3 = ModelConfig::tiny();
        cfg3.num_layers = 3;
        let e = load_dir(dir.path(), &cfg3).unwrap_err().to_string();
        assert!(e.contains("model.layers.2"), "{e}");
        std::fs::write(dir.path().join("model.safetensors"), b"garbage").unwrap();
        let e = load_dir(dir.path(), &ModelConfig::tiny()).unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("model.safetensors") && e.contains("safetensors"),
            "{e}"
        );
        let empty = tempfile::tempdir().unwrap();
        std::fs::copy(
            dir.path().join("config.json"),
            empty.path().join("config.json"),
        )
        .unwrap();
        let e = load_dir(empty.path(), &ModelConfig::tiny())
            .unwrap_err()
            .to_string();
        assert!(e.contains("no *.safetensors"), "{e}");
    }
}
