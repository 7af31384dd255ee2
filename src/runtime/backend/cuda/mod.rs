//! The CUDA backend: the decoder on one GPU. The linear layers run through the GEMM layer the
//! kernel benches time ([`crate::gemm::ops`]: cuBLASLt BF16; cuBLASLt FP8 E4M3 with per-token
//! activation scales computed on the GPU by `kernels/fp8_quant.cu`; rigbench's W4A16 NVFP4
//! kernels), chosen by the same tuner ([`crate::gemm::tuner`]), so a kernel change shows up
//! end to end; everything else is rigbench's own NVRTC kernels in `kernels/runtime.cu`
//! (embedding, RMSNorm fused with the residual add, q/k norm + RoPE + paged KV write, paged
//! decode attention, tensor-core prefill attention, SwiGLU, the fused norm / SwiGLU + FP8
//! quantization, sampling, and weight synthesis / quantization at load).
//!
//! Numerics follow the CPU backend (the reference) with BF16 at the points where a GPU engine
//! rounds: GEMM inputs and outputs, the q vector after RoPE, the KV cache; the residual stream
//! stays f32. The CPU backend's `with_gpu_rounding` mode rounds at the same points, which is
//! what the parity check compares against.
//!
//! Projections that engines fuse run fused: q/k/v as one GEMM (`[q; k; v]` rows) and gate/up as
//! one (`[gate; up]`). FP8 carries one scale per output row (so parts with different scales
//! fuse exactly); NVFP4 parts must share `weight_scale_2` (ModelOpt exports them so, and
//! `--quantize nvfp4` quantizes them so).
//!
//! Decode steps (every sequence one new token) are replayed from CUDA graphs captured per
//! padded batch size ([`plan::graph_sizes`]) unless graphs are off.
//!
//! Files, by concern: `load` (device, kernels, weights, buffers), `tune` (FP8 scaling path and
//! W4A16 configuration by measurement), `gemm` (the linear layers and cuBLASLt plans),
//! `forward` (one forward pass, graphs, sampling), `attention` (paged decode and prefill
//! attention), [`plan`] (the per-batch metadata the kernels read), `profile` (per-op GPU time)
//! and [`self_check`] (the backend's checks of its own kernels against the CPU code).

mod attention;
pub mod attn_check;
pub mod decode_attn;
mod forward;
pub mod gdn;
mod gemm;
mod gemv;
pub mod hybrid_check;
pub mod launchers;
mod linear;
mod load;
mod moe;
mod moe_layer;
pub mod plan;
mod profile;
pub mod self_check;
mod tune;

use std::collections::HashMap;
use std::path::PathBuf;

use super::{Backend, DeviceMemory, ForwardBatch, KvCacheSpec, Logits};
use crate::gemm::ops::{Fp8Scaling, PlanCache};
use crate::gemm::w4a16::Config as W4Config;
use crate::gemm::W4Module;
use crate::gpu::cublaslt::Lt;
use crate::gpu::{DevBuf, Gpu, Graph, Module};
use crate::runtime::config::{KvCacheDtype, ModelConfig, QuantRecipe, WeightFormat};
use crate::runtime::weights::ModelWeights;
use linear::DLinear;
use profile::Profiler;

/// Source of the runtime kernels (compiled by NVRTC for the detected card).
pub const RUNTIME_SRC: &str = include_str!("../../../../kernels/runtime.cu");

/// Every kernel in kernels/runtime.cu.
pub const RUNTIME_KERNELS: &[&str] = &[
    "rt_synth_bf16",
    "rt_bf16_to_f32",
    "rt_amax_bf16",
    "rt_quant_fp8_tensor",
    "rt_quant_nvfp4",
    "rt_w4a16_repack",
    "rt_embed",
    "rt_add_rmsnorm",
    "rt_add_rows",
    "rt_qk_norm_rope_kv",
    "rt_silu_mul",
    "rt_add_rmsnorm_quant",
    "rt_silu_mul_quant",
    "rt_scale_cols_bf16",
    "rt_attn_decode_bf16",
    "rt_attn_decode_fp8",
    "rt_attn_combine",
    "rt_attn_prefill_bf16_hd16",
    "rt_attn_prefill_bf16_hd32",
    "rt_attn_prefill_bf16_hd64",
    "rt_attn_prefill_bf16_hd128",
    "rt_attn_prefill_fp8_hd16",
    "rt_attn_prefill_fp8_hd32",
    "rt_attn_prefill_fp8_hd64",
    "rt_attn_prefill_fp8_hd128",
    "rt_attn_flash_bf16_hd64",
    "rt_attn_flash_bf16_hd128",
    "rt_attn_flash_bf16_hd256",
    "rt_attn_flash_fp8_hd64",
    "rt_attn_flash_fp8_hd128",
    "rt_attn_flash_fp8_hd256",
    "rt_sample",
];

/// Head dimensions the tensor-core prefill kernel is built for.
pub const PREFILL_HEAD_DIMS: [usize; 4] = [16, 32, 64, 128];
/// Threads of the decode attention kernel (`ATT_THREADS`).
const ATT_THREADS: u32 = 128;
/// Query tokens × partitions the decode-attention partial buffer holds.
const PART_CAP: usize = 1024;

/// Largest M bucket at which [`CudaBackend::tune_fp8`] measures the two FP8 scaling paths
/// (above it, outer-vector scaling in cuBLASLt; the FP32 buffer of the other path grows with M).
pub const FP8_TUNE_MAX_M: usize = 256;

/// Largest relative L2 difference allowed between the two FP8 scaling paths on the same
/// quantized operands: both accumulate in FP32 and round once to BF16 (2⁻⁸ relative), so they
/// differ by BF16 rounding of the output only.
pub const FP8_PATHS_REL_L2: f64 = 1e-2;

/// Where the CUDA backend's weights come from.
#[derive(Debug)]
pub enum WeightSource {
    /// Seeded synthetic weights at a preset's shape, generated on the GPU, bit-identical to
    /// [`crate::runtime::weights::synthesize`] for the same config and seed.
    Synthetic {
        /// The shape (after `--num-layers`).
        config: ModelConfig,
        /// Seed.
        seed: u64,
    },
    /// A local checkpoint directory, memory-mapped and uploaded tensor by tensor.
    Checkpoint {
        /// The directory.
        dir: PathBuf,
        /// Its parsed config.json.
        config: ModelConfig,
    },
    /// Weights already on the host (tests and parity checks: identical weights on both
    /// backends).
    Host(Box<ModelWeights>),
}

/// Everything [`CudaBackend::load`] needs.
#[derive(Debug)]
pub struct CudaLoadSpec {
    /// CUDA device ordinal.
    pub device: usize,
    /// The weights.
    pub weights: WeightSource,
    /// Quantize BF16 weights on the GPU at load (`--quantize`).
    pub quantize: Option<QuantRecipe>,
    /// Largest number of tokens in one forward pass (activation buffers are sized for it).
    pub max_num_batched_tokens: usize,
    /// Most sequences in one forward pass.
    pub max_num_seqs: usize,
    /// Longest sequence (prompt + output).
    pub max_model_len: usize,
    /// KV cache element type (the per-layer FP8 scales come from the weights).
    pub kv_dtype: KvCacheDtype,
    /// Tokens per KV block.
    pub block_size: usize,
}

/// Options that change how (not what) the backend computes; the defaults are the fast path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaOptions {
    /// Replay decode steps from CUDA graphs.
    pub cuda_graphs: bool,
    /// Use the tensor-core prefill attention kernel (when its self-check passes).
    pub tc_prefill: bool,
    /// Use the flash-decoding kernel for decode attention where [`decode_attn::choose`] allows
    /// it (and its self-check against the CPU reference passes at load); off: the CUDA-core
    /// kernel. On by default since P enters P·V as two BF16 operands (hi and lo,
    /// [`decode_attn::POperand::Bf16HiLo`]); with P rounded to BF16 once, its whole-model greedy
    /// parity on the H200 had failed the BF16 tolerance (docs/runtime.md, "Decode attention").
    pub flash_decode: bool,
    /// Also let the Gated-DeltaNet hybrids' attention layers take the flash-decoding kernel
    /// (with [`CudaOptions::flash_decode`]). On by default: on the H200 the hybrids' whole-model
    /// greedy parity with flash gave the CUDA-core kernels' figures within 1% on every row
    /// (docs/runtime.md, "Decode attention"; the head_dim-256 BF16-KV row misses its max by
    /// the same margin with either kernel), and the CUDA-core `hy_attn_decode_*` runs on a few
    /// CTAs (one per token, KV head and partition) at 133 µs a call at a 128-token context
    /// on the H100 (`synthetic:qwen3.6-35b-a3b`, 1.2 ms of a 6.7 ms step). Off: the hybrids
    /// keep the CUDA-core kernels (`rt_attn_decode_*` up to head_dim 128, `hy_attn_decode_*`
    /// above); `rigbench devcheck --only hybrid` runs both.
    pub flash_decode_hybrid: bool,
    /// FP8 linears: quantize their input in the kernel that produces it (residual add, RMSNorm
    /// and FP8 quantization before qkv and gate_up; SwiGLU and FP8 quantization before down),
    /// one launch instead of two, bit-identical; off: the GEMM layer's per-token quantization
    /// (`kernels/fp8_quant.cu`, [`crate::gemm::fp8_quant::launch_quant_rows`]) before each
    /// FP8 GEMM.
    pub fuse_fp8_quant: bool,
    /// Mixtures of experts with a shared expert: run it as one more expert of the grouped
    /// expert GEMMs (the router GEMM carries its gate's row; the routing gives every token a
    /// last pair with weight `sigmoid(gate)`), where it has the routed experts' format and
    /// shape; off: a separate dense SwiGLU MLP and gate GEMM per layer (four launches more).
    /// The combine adds the same terms in the same order either way, but the terms are not
    /// bit-identical: the gate logit comes out of the `[E + 1, H]` router GEMM, the shared
    /// expert's output out of the grouped kernels instead of the tuned dense GEMMs (FP8: its
    /// SwiGLU quantized per pair), so the two paths agree within the GEMMs' rounding.
    pub fuse_shared_expert: bool,
    /// Draft tokens per step the logits buffer must hold beyond one per sequence.
    pub max_drafts: usize,
    /// Measure, at load, which FP8 scaling path is faster at each decode M bucket
    /// ([`FP8_TUNE_MAX_M`]); off: cuBLASLt outer-vector scales at every M.
    pub tune_fp8: bool,
    /// Measure, at load, whether the GEMM layer's small-M GEMV (`kernels/gemv.cu`) beats
    /// cuBLASLt for each BF16 / FP8 linear and the lm_head at M ≤ 8 ([`CudaBackend::tune_gemv`]);
    /// off: cuBLASLt at every M.
    pub tune_gemv: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            cuda_graphs: true,
            tc_prefill: true,
            flash_decode: true,
            flash_decode_hybrid: true,
            fuse_fp8_quant: true,
            fuse_shared_expert: true,
            max_drafts: 0,
            tune_fp8: true,
            tune_gemv: true,
        }
    }
}

struct DLayer {
    input_norm: DevBuf,
    post_norm: DevBuf,
    q_norm: Option<DevBuf>,
    k_norm: Option<DevBuf>,
    qkv: DLinear,
    o: DLinear,
    gate_up: DLinear,
    down: DLinear,
    k_scale: f32,
    v_scale: f32,
    /// A Gated-DeltaNet layer's other tensors (its `qkv` is `[in_proj_qkv; in_proj_z]`, its `o`
    /// is `out_proj`; see [`gdn`]).
    gdn: Option<gdn::GdnDevLayer>,
    /// A sparse layer's router, routed experts and shared-expert gate (its `gate_up` / `down`
    /// are then the shared expert, or empty `0 × 0` without one; see [`moe`]).
    moe: Option<moe_layer::MoeDevLayer>,
}

struct DWeights {
    embed: DevBuf,
    lm_head: Option<DevBuf>,
    norm: DevBuf,
    layers: Vec<DLayer>,
}

impl DWeights {
    /// The formats the decoder linears are stored in (the Gated-DeltaNet in_proj_a / b
    /// included), each once, in order of first appearance.
    fn linear_formats(&self) -> Vec<WeightFormat> {
        let mut v: Vec<WeightFormat> = Vec::new();
        for l in &self.layers {
            let gdn = l.gdn.as_ref().map(|g| &g.ab);
            let sparse = l.moe.iter().flat_map(|m| {
                m.experts_first()
                    .into_iter()
                    .chain(std::iter::once(&m.router))
                    .chain(m.shared_gate.as_ref())
            });
            for lin in [&l.qkv, &l.o, &l.gate_up, &l.down]
                .into_iter()
                .filter(|x| x.nk().0 > 0)
                .chain(gdn)
                .chain(sparse)
            {
                if !v.contains(&lin.format()) {
                    v.push(lin.format());
                }
            }
        }
        v
    }

    fn bytes(&self) -> usize {
        let mut b =
            self.embed.bytes() + self.norm.bytes() + self.lm_head.as_ref().map_or(0, |h| h.bytes());
        for l in &self.layers {
            b += l.input_norm.bytes()
                + l.post_norm.bytes()
                + l.q_norm.as_ref().map_or(0, |x| x.bytes())
                + l.k_norm.as_ref().map_or(0, |x| x.bytes());
            for w in [&l.qkv, &l.o, &l.gate_up, &l.down] {
                b += w.bytes();
            }
            b += l.gdn.as_ref().map_or(0, |g| g.bytes());
            b += l.moe.as_ref().map_or(0, |m| m.bytes());
        }
        b
    }
}

/// Activation buffers, sized for `max_num_batched_tokens` tokens and the logit rows of
/// `max_num_seqs` sequences.
struct Bufs {
    x: DevBuf,
    h: DevBuf,
    qkv: DevBuf,
    q: DevBuf,
    attn: DevBuf,
    gu: DevBuf,
    act: DevBuf,
    hout: DevBuf,
    hq: DevBuf,
    ascale: DevBuf,
    /// `rt_silu_mul_quant`'s per-row amax (float bits) and block arrivals: zero between launches.
    quant_amax: DevBuf,
    quant_arrivals: DevBuf,
    acc32: Option<DevBuf>,
    last_h: DevBuf,
    logits: DevBuf,
    part_ml: DevBuf,
    part_o: DevBuf,
    meta: DevBuf,
    inv_freq: DevBuf,
    one: DevBuf,
    smp_temp: DevBuf,
    smp_top_p: DevBuf,
    smp_top_k: DevBuf,
    smp_seed: DevBuf,
    smp_draw: DevBuf,
    smp_out: DevBuf,
    w4_ws: Option<DevBuf>,
    w4_counters: Option<DevBuf>,
    w4_scratch: Option<DevBuf>,
}

impl Bufs {
    fn bytes(&self) -> usize {
        [
            &self.x,
            &self.h,
            &self.qkv,
            &self.q,
            &self.attn,
            &self.gu,
            &self.act,
            &self.hout,
            &self.hq,
            &self.ascale,
            &self.last_h,
            &self.logits,
            &self.part_ml,
            &self.part_o,
            &self.meta,
        ]
        .iter()
        .map(|b| b.bytes())
        .sum::<usize>()
            + self.acc32.as_ref().map_or(0, |b| b.bytes())
            + self.w4_ws.as_ref().map_or(0, |b| b.bytes())
            + self.w4_scratch.as_ref().map_or(0, |b| b.bytes())
    }
}

pub use super::RowSampling;

/// Counters of what the backend ran (for reports and tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CudaStats {
    /// Forward passes.
    pub forwards: u64,
    /// Decode steps replayed from a CUDA graph.
    pub graph_replays: u64,
    /// Graphs captured.
    pub graphs_captured: u64,
    /// Forward passes that took the tensor-core prefill kernel.
    pub prefill_tc: u64,
}

/// The CUDA backend.
pub struct CudaBackend {
    device: usize,
    gpu: Gpu,
    lt: Lt,
    rt: Module,
    w4m: Vec<W4Module>,
    w4v2: Option<Module>,
    /// `kernels/fp8_quant.cu` (per-token FP8 quantization, the FP32 path's epilogue), built
    /// when a linear is FP8.
    fp8q: Option<Module>,
    /// SHA-256 of every kernel source built at load, by path.
    kernel_sources: std::collections::BTreeMap<String, String>,
    config: ModelConfig,
    format: WeightFormat,
    weights: DWeights,
    bufs: Bufs,
    kv: Option<(DevBuf, KvCacheSpec)>,
    plans: PlanCache,
    w4_choice: HashMap<(usize, usize, usize), W4Config>,
    graphs: HashMap<usize, Graph>,
    graph_sizes: Vec<usize>,
    fp8_rowwise: bool,
    /// Tuned FP8 scaling path per (N, K, M bucket).
    fp8_choice: HashMap<(usize, usize, usize), Fp8Scaling>,
    /// `kernels/gemv.cu` (the small-M GEMVs), built when a BF16 or FP8 linear or the BF16
    /// lm_head may use it and the card has the mma it needs.
    gemv: Option<Module>,
    /// The GEMV configuration chosen over cuBLASLt per (kernel family, N, K, M bucket); absent:
    /// cuBLASLt ([`CudaBackend::tune_gemv`]).
    gemv_choice:
        HashMap<(crate::gemm::gemv::GemvFormat, usize, usize, usize), crate::gemm::gemv::Variant>,
    opts: CudaOptions,
    max_tokens: usize,
    max_rows: usize,
    memory: DeviceMemory,
    /// What ran.
    pub stats: CudaStats,
    /// Per-op GPU time profiling (eager steps only; see [`CudaBackend::set_profiling`]).
    prof: Option<Profiler>,
    /// Notes for reports (self-check outcomes, fallbacks taken).
    pub notes: Vec<String>,
    /// The Gated-DeltaNet kernels, buffers and state of a hybrid ([`gdn`]).
    hy: Option<gdn::HybridRt>,
    /// The routing kernels and buffers of a mixture of experts ([`moe`]).
    moe: Option<moe_layer::MoeRt>,
    /// The per-row sampling settings last copied to the device (temperature, top-p, top-k,
    /// seed): a decode step whose rows keep their settings copies only the draw counters.
    smp_uploaded: Option<SamplingUpload>,
}

/// Sampling settings as uploaded (see [`CudaBackend::smp_uploaded`]).
#[derive(Debug, Clone, PartialEq)]
struct SamplingUpload {
    temp: Vec<f32>,
    top_p: Vec<f32>,
    top_k: Vec<i32>,
    seed: Vec<u64>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaBackend({} on {} {})",
            self.format.id(),
            self.gpu.name,
            self.gpu.cc
        )
    }
}

fn grid1(n: usize, threads: usize) -> (u32, u32, u32) {
    (n.div_ceil(threads).clamp(1, 65_535 * 8) as u32, 1, 1)
}

/// Bytes the CUDA backend's weights take on the device for `config` in `format` (BF16
/// embedding and lm_head, norms in f32; NVFP4 in the kernel layout with padding), used to
/// refuse a model that cannot fit before anything is loaded.
pub fn predicted_weight_bytes(config: &ModelConfig, format: WeightFormat) -> u64 {
    if config.is_hybrid() {
        return gdn::predicted_weight_bytes(config, QuantRecipe::Uniform(format));
    }
    let h = config.hidden_size as u64;
    let v = config.vocab_size as u64;
    let lin = |n: u64, k: u64| -> u64 {
        match format {
            WeightFormat::Bf16 => 2 * n * k,
            WeightFormat::Fp8 => n * k + 4 * n,
            WeightFormat::Nvfp4 => {
                let np = n.div_ceil(16) * 16;
                let kp = k.div_ceil(128) * 128;
                np * kp / 2 + np * kp / 16
            }
        }
    };
    let qkv = (config.q_dim() + 2 * config.kv_dim()) as u64;
    let i = config.intermediate_size as u64;
    let per_layer = lin(qkv, h)
        + lin(h, config.q_dim() as u64)
        + lin(2 * i, h)
        + lin(h, i)
        + 8 * h
        + 8 * config.head_dim as u64;
    let heads = if config.tie_word_embeddings { 1 } else { 2 };
    heads * 2 * v * h + 4 * h + config.num_layers as u64 * per_layer
}

impl CudaBackend {
    /// Weight bytes one batch-1 decode step reads: every decoder layer, the final norm and the
    /// lm_head (the embedding table is read only at the step's token rows, so it is left out
    /// unless it is the lm_head); of a sparse layer's routed experts only the top-k a token
    /// routes to.
    pub fn decode_weight_bytes(&self) -> u64 {
        let w = &self.weights;
        let embed = if w.lm_head.is_some() {
            w.embed.bytes() as u64
        } else {
            0
        };
        let top_k = self.config.moe.as_ref().map_or(0, |m| m.top_k);
        let untouched: u64 = w
            .layers
            .iter()
            .filter_map(|l| l.moe.as_ref())
            .map(|m| (m.num_experts().saturating_sub(top_k) * m.expert_bytes()) as u64)
            .sum();
        w.bytes() as u64 - embed - untouched
    }

    /// The GPU.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Options in effect (after self-checks).
    pub fn options(&self) -> CudaOptions {
        self.opts
    }

    /// Turn CUDA graphs on or off (captured graphs are dropped when turned off).
    pub fn set_cuda_graphs(&mut self, on: bool) {
        self.opts.cuda_graphs = on;
        if !on {
            self.graphs.clear();
        }
    }

    /// Turn the flash-decoding kernel on or off (off: the CUDA-core kernel; captured graphs are
    /// dropped, since they hold the kernel they were captured with). Turning it on where
    /// [`decode_attn::choose`] does not allow it changes nothing.
    pub fn set_flash_decode(&mut self, on: bool) {
        self.opts.flash_decode = on;
        self.graphs.clear();
    }

    /// Turn the fused FP8 quantization ([`CudaOptions::fuse_fp8_quant`]) on or off (captured
    /// graphs are dropped).
    pub fn set_fuse_fp8_quant(&mut self, on: bool) {
        self.opts.fuse_fp8_quant = on;
        self.graphs.clear();
    }

    /// The decode-attention kernel this backend runs (after options and self-checks).
    pub fn decode_attention(&self) -> decode_attn::DecodeAttn {
        let c = &self.config;
        decode_attn::choose(
            c.head_dim,
            c.num_heads / c.num_kv_heads.max(1),
            self.kv_elem(),
            self.gpu.cc.major,
            self.gpu.max_smem_optin,
            self.opts.flash_decode,
        )
    }

    fn kv_elem(&self) -> usize {
        self.kv.as_ref().map_or(2, |(_, s)| s.dtype.bytes())
    }
}

/// The linears of a decoder layer, in the order a layer runs them (a Gated-DeltaNet layer keeps
/// its `in_proj_qkvz` in `Qkv`'s place and `out_proj` in `O`'s, and adds [`LayerLinear::GdnAb`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LayerLinear {
    /// q, k and v fused: `[q; k; v]` rows.
    Qkv,
    /// The attention output projection.
    O,
    /// gate and up fused: `[gate; up]` rows.
    GateUp,
    /// The MLP down projection (K = intermediate size).
    Down,
    /// Gated-DeltaNet layers only: `in_proj_a` and `in_proj_b` fused, `[a; b]` rows.
    GdnAb,
    /// Sparse layers only: the router `mlp.gate`, `[E, H]`.
    Router,
    /// Sparse layers with a shared expert only: `mlp.shared_expert_gate`, `[1, H]`.
    SharedGate,
}

impl LayerLinear {
    /// The four every layer has, in order.
    const ALL: [LayerLinear; 4] = [
        LayerLinear::Qkv,
        LayerLinear::O,
        LayerLinear::GateUp,
        LayerLinear::Down,
    ];

    /// Position in [`LayerLinear::ALL`] (0..4; `GdnAb` 4, `Router` 5, `SharedGate` 6); the
    /// tuner offsets its input seeds by it.
    fn index(self) -> u64 {
        self as u64
    }
}

/// One linear of one layer.
#[derive(Debug, Clone, Copy)]
struct LinRef {
    layer: usize,
    which: LayerLinear,
}

impl LinRef {
    fn new(layer: usize, which: LayerLinear) -> Self {
        LinRef { layer, which }
    }
}

/// [`crate::gemm::check::rel_l2`] of BF16 bit patterns (output under test first).
use crate::gemm::check::rel_l2_bf16;

impl Backend for CudaBackend {
    fn name(&self) -> &str {
        "cuda"
    }
    fn device_label(&self) -> String {
        format!("cuda:{} ({}, {})", self.device, self.gpu.name, self.gpu.cc)
    }
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn weight_format(&self) -> WeightFormat {
        self.format
    }
    fn weight_bytes(&self) -> u64 {
        self.weights.bytes() as u64
    }
    fn device_memory(&self) -> Option<DeviceMemory> {
        Some(self.memory)
    }
    fn kernel_sources(&self) -> std::collections::BTreeMap<String, String> {
        self.kernel_sources.clone()
    }
    fn moe_touched_experts(&self) -> Option<Vec<usize>> {
        self.moe.as_ref()?;
        self.moe_touched_experts_now().ok()
    }
    fn load_notes(&self) -> Vec<String> {
        self.notes.clone()
    }
    fn init_kv_cache(&mut self, spec: KvCacheSpec) -> anyhow::Result<()> {
        self.gpu.bind()?;
        self.graphs.clear();
        self.kv = None;
        let c = &self.config;
        // One extra (trash) block receives the K/V of padding tokens in graph batches.
        let region = (spec.num_blocks + 1)
            * c.num_kv_heads
            * spec.block_size
            * c.head_dim
            * spec.dtype.bytes();
        // The layers with attention only (all of them in a dense decoder).
        let bytes = 2 * c.num_attention_layers() * region;
        let (free, _) = self.gpu.mem_info()?;
        let buf = self.gpu.alloc(bytes).map_err(|e| {
            anyhow::anyhow!(
                "allocating the KV cache ({} for {} blocks of {} tokens) failed with {} free: {e}",
                crate::output::table::human_bytes(bytes as u64),
                spec.num_blocks,
                spec.block_size,
                crate::output::table::human_bytes(free as u64)
            )
        })?;
        // Zero it: stale NaN bit patterns must not reach attention through padding reads.
        self.gpu.memset(&buf, 0)?;
        self.gpu.sync()?;
        self.kv = Some((buf, spec));
        let _ = self.kv_elem();
        Ok(())
    }
    fn init_state_slots(&mut self, n: usize) -> anyhow::Result<()> {
        gdn::init_state_slots(self, n)
    }
    fn snapshot_state(&mut self, slot: u32) -> anyhow::Result<super::StateSnapshot> {
        gdn::snapshot_state(self, slot)
    }
    fn restore_state(&mut self, slot: u32, snap: &super::StateSnapshot) -> anyhow::Result<()> {
        gdn::restore_state(self, slot, snap)
    }
    fn samples_on_device(&self) -> bool {
        true
    }
    fn forward_sampled(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowSampling],
    ) -> anyhow::Result<Vec<u32>> {
        self.sample_forward(batch, rows)
    }
    fn forward(&mut self, batch: &ForwardBatch) -> anyhow::Result<Logits> {
        let p = self.run_forward(batch)?;
        let v = self.config.vocab_size;
        let data: Vec<f32> = if p.real_rows > 0 {
            self.gpu.download(&self.bufs.logits, 0, p.real_rows * v)?
        } else {
            self.gpu.sync()?;
            Vec::new()
        };
        Ok(Logits { vocab: v, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_are_in_the_source() {
        for k in RUNTIME_KERNELS {
            // Plain kernels are declared `NAME(`, the prefill instances through `FA_KERNEL(HD, NAME, KV)`.
            assert!(
                RUNTIME_SRC.contains(&format!(" {k}("))
                    || RUNTIME_SRC.contains(&format!(", {k}, ")),
                "{k} missing from kernels/runtime.cu"
            );
        }
    }

    #[test]
    fn the_moe_prediction_counts_every_expert_and_meets_the_cpu_formula() {
        use crate::runtime::memory::recipe_weight_bytes;
        let c = ModelConfig::preset("qwen3.6-35b-a3b").unwrap();
        for recipe in [
            QuantRecipe::Uniform(WeightFormat::Bf16),
            QuantRecipe::Uniform(WeightFormat::Fp8),
            QuantRecipe::Nvfp4Mixed,
        ] {
            let experts = gdn::predicted_expert_bytes(&c, recipe);
            let cuda = gdn::predicted_weight_bytes(&c, recipe);
            // 40 layers × 256 experts × 3 × 2048 × 512 values.
            let values = 40 * 256 * 3 * 2048 * 512u64;
            match recipe {
                QuantRecipe::Uniform(WeightFormat::Bf16) => assert_eq!(experts, 2 * values),
                // Codes, a scale byte per 16 values and a 4-byte global scale per linear.
                QuantRecipe::Nvfp4Mixed => {
                    assert_eq!(experts, values / 2 + values / 16 + 40 * 256 * 3 * 4)
                }
                _ => {}
            }
            // The CPU formula counts the mixed recipe's lm_head in NVFP4; the CUDA backend
            // keeps it BF16 (its load note says so): that difference alone.
            let head = (248_320 * 2048) as u64;
            let cpu = recipe_weight_bytes(&c, recipe)
                + if recipe == QuantRecipe::Nvfp4Mixed {
                    2 * head - (head / 2 + head / 16)
                } else {
                    0
                };
            let rel = cuda as f64 / cpu as f64 - 1.0;
            assert!(
                rel.abs() < 0.01,
                "{recipe:?}: CUDA {cuda} vs CPU {cpu} ({rel:+.4})"
            );
        }
    }

    #[test]
    fn predicted_weight_bytes_follow_the_formats() {
        let c = ModelConfig::preset("qwen3-8b").unwrap();
        let bf = predicted_weight_bytes(&c, WeightFormat::Bf16);
        let f8 = predicted_weight_bytes(&c, WeightFormat::Fp8);
        let f4 = predicted_weight_bytes(&c, WeightFormat::Nvfp4);
        // Qwen3-8B: 8.19e9 parameters, 16.4 GB in BF16.
        assert!((15.0e9..17.5e9).contains(&(bf as f64)), "{bf}");
        // Embedding and lm_head stay BF16 (2 × 1.24 GB).
        assert!(f8 < bf && f4 < f8, "{bf} {f8} {f4}");
        let emb = 2 * 2 * 151_936u64 * 4096;
        let lin_bf = bf - emb;
        let lin_f8 = f8 - emb;
        assert!((lin_f8 as f64 / lin_bf as f64 - 0.5).abs() < 0.01);
    }
}
