//! The CUDA backend: the decoder on one GPU. The linear layers run through the same code the
//! kernel benches time (cuBLASLt BF16; cuBLASLt FP8 E4M3 with per-token activation scales
//! computed on the GPU; rigbench's W4A16 NVFP4 kernel, `kernels/w4a16.cu`), so a kernel change
//! shows up end to end; everything else is rigbench's own NVRTC kernels in
//! `kernels/runtime.cu` (embedding, RMSNorm fused with the residual add, q/k norm + RoPE + paged
//! KV write, paged decode attention on CUDA cores, tensor-core prefill attention, SwiGLU,
//! per-token FP8 quantization, sampling, and weight synthesis / quantization at load).
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

pub mod plan;
pub mod selftest;

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Context;

use super::{Backend, DeviceMemory, ForwardBatch, KvCacheSpec, Logits};
use crate::formats::nvfp4::Nvfp4Weight;
use crate::formats::w4a16_pack::{self, repack};
use crate::gpu::cublaslt::{Lt, LtGemm, LtKind, OutType};
use crate::gpu::{DevBuf, Gpu, Graph, KArg, Module};
use crate::kernels::impls::w4a16::{self as w4, Config as W4Config, W4a16Device};
use crate::kernels::W4Module;
use crate::runtime::config::{KvCacheDtype, ModelConfig, WeightFormat};
use crate::runtime::weights::{self, Linear, ModelWeights};
use crate::RigError;

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
    "rt_quant_fp8_rows",
    "rt_scale_f32_to_bf16",
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
    "rt_sample",
];

/// Head dimensions the tensor-core prefill kernel is built for.
pub const PREFILL_HEAD_DIMS: [usize; 4] = [16, 32, 64, 128];
/// Threads of the decode attention kernel (`ATT_THREADS`).
const ATT_THREADS: u32 = 128;
/// Query tokens × partitions the decode-attention partial buffer holds.
const PART_CAP: usize = 1024;
/// W4A16 token counts tuned at load (other counts use the next larger bucket's choice).
const W4_BUCKETS: [usize; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

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
    pub quantize: Option<WeightFormat>,
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
    /// Draft tokens per step the logits buffer must hold beyond one per sequence.
    pub max_drafts: usize,
    /// Measure, at load, which FP8 scaling path is faster at each decode M bucket
    /// ([`FP8_TUNE_MAX_M`]); off: cuBLASLt outer-vector scales at every M.
    pub tune_fp8: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            cuda_graphs: true,
            tc_prefill: true,
            max_drafts: 0,
            tune_fp8: true,
        }
    }
}

/// A linear layer on the device.
enum DLinear {
    /// BF16 `[n, k]`.
    Bf16 { w: DevBuf, n: usize, k: usize },
    /// E4M3 `[n, k]` with one f32 scale per row and an optional static activation scale.
    Fp8 {
        w: DevBuf,
        scales: DevBuf,
        static_scale: Option<f32>,
        n: usize,
        k: usize,
    },
    /// NVFP4 in the W4A16 kernel layout.
    W4 { dev: W4a16Device },
}

impl DLinear {
    fn nk(&self) -> (usize, usize) {
        match self {
            DLinear::Bf16 { n, k, .. } | DLinear::Fp8 { n, k, .. } => (*n, *k),
            DLinear::W4 { dev } => (dev.n, dev.k),
        }
    }
    fn bytes(&self) -> usize {
        match self {
            DLinear::Bf16 { w, .. } => w.bytes(),
            DLinear::Fp8 { w, scales, .. } => w.bytes() + scales.bytes(),
            DLinear::W4 { dev } => dev.bytes(),
        }
    }
    fn format(&self) -> WeightFormat {
        match self {
            DLinear::Bf16 { .. } => WeightFormat::Bf16,
            DLinear::Fp8 { .. } => WeightFormat::Fp8,
            DLinear::W4 { .. } => WeightFormat::Nvfp4,
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
}

struct DWeights {
    embed: DevBuf,
    lm_head: Option<DevBuf>,
    norm: DevBuf,
    layers: Vec<DLayer>,
}

impl DWeights {
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
    config: ModelConfig,
    format: WeightFormat,
    weights: DWeights,
    bufs: Bufs,
    kv: Option<(DevBuf, KvCacheSpec)>,
    plans: HashMap<(u8, usize, usize, usize), LtGemm>,
    w4_choice: HashMap<(usize, usize, usize), W4Config>,
    graphs: HashMap<usize, Graph>,
    graph_sizes: Vec<usize>,
    fp8_rowwise: bool,
    /// Tuned FP8 scaling path per (N, K, M bucket): `true` = outer-vector scales in cuBLASLt.
    fp8_choice: HashMap<(usize, usize, usize), bool>,
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
    /// Open device `spec.device`, compile the kernels, load the weights and allocate the
    /// activation buffers, with the default [`CudaOptions`].
    ///
    /// # Errors
    /// No GPU or CUDA libraries ([`crate::RigError::NoGpu`]), weights that do not fit the free
    /// memory (both sizes named), or a device failure.
    pub fn load(spec: CudaLoadSpec) -> anyhow::Result<Self> {
        Self::load_with(spec, CudaOptions::default())
    }

    /// [`CudaBackend::load`] with explicit options.
    ///
    /// # Errors
    /// As [`CudaBackend::load`].
    pub fn load_with(spec: CudaLoadSpec, opts: CudaOptions) -> anyhow::Result<Self> {
        let gpu = Gpu::open_device_stream(spec.device, true)?;
        anyhow::ensure!(
            gpu.cc.as_int() >= 80,
            RigError::NoGpu(format!(
                "{} ({}) lacks the BF16 tensor cores (sm_80 and up) the CUDA backend uses",
                gpu.name, gpu.cc
            ))
        );
        let (free_before, total) = gpu.mem_info()?;
        let config = match &spec.weights {
            WeightSource::Synthetic { config, .. } | WeightSource::Checkpoint { config, .. } => {
                config.clone()
            }
            WeightSource::Host(w) => w.config.clone(),
        };
        {
            let g = config.num_heads / config.num_kv_heads.max(1);
            anyhow::ensure!(
                config.head_dim % 16 == 0
                    && config.head_dim <= 128
                    && g <= 16
                    && g * config.head_dim <= 2048,
                "the CUDA attention kernels need head_dim a multiple of 16 and at most 128, at most 16 query heads per KV head and (heads per KV head) × head_dim ≤ 2048; this model has head_dim {} and {g} heads per KV head",
                config.head_dim
            );
        }
        let mapped = match &spec.weights {
            WeightSource::Checkpoint { dir, config } => {
                Some(weights::MappedCheckpoint::open(dir, config)?)
            }
            _ => None,
        };
        let stored = match (&spec.weights, &mapped) {
            (WeightSource::Host(w), _) => w.linear_format(),
            (_, Some(m)) => m.format(),
            _ => WeightFormat::Bf16,
        };
        let format = spec.quantize.unwrap_or(stored);
        let need = predicted_weight_bytes(&config, format);
        if need > free_before as u64 {
            return Err(RigError::flag(
                "--model",
                format!(
                    "the weights need {} on {} but only {} is free; use a smaller model, --quantize fp8|nvfp4, or --num-layers",
                    crate::output::table::human_bytes(need),
                    gpu.name,
                    crate::output::table::human_bytes(free_before as u64)
                ),
            )
            .into());
        }
        let rt = gpu
            .compile("runtime", RUNTIME_SRC, RUNTIME_KERNELS)
            .context("building kernels/runtime.cu")?;
        let names = w4::kernel_names();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut w4m = Vec::new();
        if format == WeightFormat::Nvfp4 {
            for (flavor, defines) in crate::kernels::w4a16_flavors() {
                let defines: Vec<String> = defines.iter().map(|d| d.to_string()).collect();
                let module = gpu
                    .compile_with("w4a16", crate::kernels::bench::W4A16_SRC, &refs, &defines)
                    .context("building kernels/w4a16.cu")?;
                w4m.push(W4Module {
                    flavor: flavor.to_string(),
                    defines,
                    module,
                });
            }
        }
        let w4v2 = if format == WeightFormat::Nvfp4 {
            let names = w4::v2_kernel_names();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            Some(
                gpu.compile("w4a16_v2", w4::V2_SRC, &refs)
                    .context("building kernels/w4a16_v2.cu")?,
            )
        } else {
            None
        };
        let lt = Lt::new(&gpu)?;
        let loader = Loader { gpu: &gpu, rt: &rt };
        let weights = match spec.weights {
            WeightSource::Host(w) => loader.host_weights(&w, spec.quantize)?,
            WeightSource::Synthetic { config, seed } => {
                loader.synthetic(&config, seed, spec.quantize)?
            }
            WeightSource::Checkpoint { dir, .. } => {
                let m = mapped.as_ref().context("checkpoint not mapped")?;
                loader
                    .checkpoint(m, spec.quantize)
                    .with_context(|| format!("uploading {}", dir.display()))?
            }
        };
        let t_max = spec.max_num_batched_tokens.max(1);
        // Logit rows per forward: one per sequence (and its drafts) while serving; teacher
        // forcing (parity, fidelity) asks for up to a few hundred rows of one sequence.
        let rows = (spec.max_num_seqs * (1 + opts.max_drafts))
            .max(256)
            .clamp(1, t_max.max(1));
        let bufs = alloc_bufs(
            &gpu,
            &config,
            &weights,
            t_max,
            rows,
            spec.max_model_len,
            spec.block_size,
        )?;
        let mut me = CudaBackend {
            device: spec.device,
            gpu,
            lt,
            rt,
            w4m,
            w4v2,
            format: weights
                .layers
                .first()
                .map_or(WeightFormat::Bf16, |l| l.qkv.format()),
            config,
            weights,
            bufs,
            kv: None,
            plans: HashMap::new(),
            w4_choice: HashMap::new(),
            graphs: HashMap::new(),
            graph_sizes: plan::graph_sizes(spec.max_num_seqs.min(t_max)),
            fp8_rowwise: true,
            fp8_choice: HashMap::new(),
            opts,
            max_tokens: t_max,
            max_rows: rows,
            memory: DeviceMemory {
                total: total as u64,
                free_before_load: free_before as u64,
                free_after_load: 0,
                weights: 0,
                activations: 0,
                workspace: 0,
            },
            stats: CudaStats::default(),
            notes: Vec::new(),
            prof: None,
        };
        me.prepare_gemms()?;
        if me.format == WeightFormat::Nvfp4 {
            me.tune_w4()?;
        }
        if me.format == WeightFormat::Fp8 && me.opts.tune_fp8 {
            me.tune_fp8()?;
        }
        if me.opts.tc_prefill && PREFILL_HEAD_DIMS.contains(&me.config.head_dim) {
            match selftest::prefill_matches_decode(&mut me) {
                Ok(None) => {}
                Ok(Some(why)) => {
                    me.opts.tc_prefill = false;
                    me.notes.push(format!(
                        "tensor-core prefill attention disabled: its self-check against the decode kernel failed ({why})"
                    ));
                }
                Err(e) => {
                    me.opts.tc_prefill = false;
                    me.notes
                        .push(format!("tensor-core prefill attention disabled: {e:#}"));
                }
            }
        } else if me.opts.tc_prefill {
            me.opts.tc_prefill = false;
            me.notes.push(format!(
                "tensor-core prefill attention is built for head_dim {PREFILL_HEAD_DIMS:?}; head_dim {} uses the CUDA-core kernel",
                me.config.head_dim
            ));
        }
        // Freed load-time buffers (BF16 weights before quantization, tuning inputs) stay in the
        // stream-ordered pool until trimmed, and would count against the KV cache.
        if let Err(e) = me.gpu.trim_memory_pool() {
            me.gpu.sync()?;
            me.notes.push(format!(
                "the stream-ordered memory pool could not be trimmed after load ({e}); the KV cache may be smaller by what it holds"
            ));
        }
        let (free_after, _) = me.gpu.mem_info()?;
        me.memory.free_after_load = free_after as u64;
        me.memory.weights = me.weights.bytes() as u64;
        me.memory.activations = me.bufs.bytes() as u64;
        me.memory.workspace = (free_before as u64)
            .saturating_sub(free_after as u64)
            .saturating_sub(me.memory.weights + me.memory.activations);
        Ok(me)
    }

    /// Weight bytes one decode step reads: every decoder layer, the final norm and the lm_head
    /// (the embedding table is read only at the step's token rows, so it is left out unless it
    /// is the lm_head).
    pub fn decode_weight_bytes(&self) -> u64 {
        let w = &self.weights;
        let embed = if w.lm_head.is_some() {
            w.embed.bytes() as u64
        } else {
            0
        };
        w.bytes() as u64 - embed
    }

    /// The GPU.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Options in effect (after self-checks).
    pub fn options(&self) -> CudaOptions {
        self.opts
    }

    /// Profile forward passes per op (CUDA events around every launch group; turns CUDA graphs
    /// off, since a replay cannot be split). [`CudaBackend::profile`] reads the totals.
    ///
    /// # Errors
    /// Creating the events fails.
    pub fn set_profiling(&mut self, on: bool) -> anyhow::Result<()> {
        if on {
            self.set_cuda_graphs(false);
            let mut timers = Vec::new();
            for _ in 0..(16 * self.config.num_layers + 32) {
                timers.push(self.gpu.timer()?);
            }
            self.prof = Some(Profiler {
                timers,
                used: Vec::new(),
                totals: Default::default(),
            });
        } else {
            self.prof = None;
        }
        Ok(())
    }

    /// Per-op totals since profiling started: (op, calls, seconds), largest first.
    pub fn profile(&self) -> Vec<(String, u64, f64)> {
        let mut v: Vec<(String, u64, f64)> = self
            .prof
            .as_ref()
            .map(|p| {
                p.totals
                    .iter()
                    .map(|(k, (n, s))| (k.to_string(), *n, *s))
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by(|a, b| b.2.total_cmp(&a.2));
        v
    }

    fn op_begin(&mut self) -> anyhow::Result<()> {
        if let Some(p) = &mut self.prof {
            let i = p.used.len();
            if let Some(t) = p.timers.get(i) {
                t.start(&self.gpu)?;
            }
        }
        Ok(())
    }

    fn op_end(&mut self, name: &'static str) -> anyhow::Result<()> {
        if let Some(p) = &mut self.prof {
            let i = p.used.len();
            if let Some(t) = p.timers.get(i) {
                t.mark_end(&self.gpu)?;
                p.used.push(name);
            }
        }
        Ok(())
    }

    fn prof_collect(&mut self) -> anyhow::Result<()> {
        if let Some(p) = &mut self.prof {
            for (i, name) in p.used.drain(..).enumerate() {
                let s = p.timers[i].elapsed()?;
                let e = p.totals.entry(name).or_insert((0, 0.0));
                e.0 += 1;
                e.1 += s;
            }
        }
        Ok(())
    }

    /// Turn CUDA graphs on or off (captured graphs are dropped when turned off).
    pub fn set_cuda_graphs(&mut self, on: bool) {
        self.opts.cuda_graphs = on;
        if !on {
            self.graphs.clear();
        }
    }

    fn kv_elem(&self) -> usize {
        self.kv.as_ref().map_or(2, |(_, s)| s.dtype.bytes())
    }

    /// Plans the cuBLASLt GEMMs of the first decode sizes, and finds out whether FP8 per-token
    /// scaling is available in cuBLASLt on this card.
    fn prepare_gemms(&mut self) -> anyhow::Result<()> {
        if self.format == WeightFormat::Fp8 {
            let (n, k) = self.weights.layers[0].qkv.nk();
            let kind = LtKind::Fp8RowWise {
                w_scales_ptr: self.bufs.one.ptr(),
                a_scales_ptr: self.bufs.ascale.ptr(),
            };
            match LtGemm::plan(&self.lt, kind, 1, n, k) {
                Ok(_) => self.fp8_rowwise = true,
                Err(e) => {
                    self.fp8_rowwise = false;
                    self.notes.push(format!(
                        "cuBLASLt has no FP8 GEMM with outer-vector (per-token × per-channel) scales here ({e}); the scales are applied after an FP32-output GEMM"
                    ));
                    let t = self.max_tokens;
                    let maxn = self.max_n();
                    self.bufs.acc32 = Some(self.gpu.alloc(t * maxn * 4)?);
                }
            }
        }
        Ok(())
    }

    fn max_n(&self) -> usize {
        let c = &self.config;
        (c.q_dim() + 2 * c.kv_dim())
            .max(2 * c.intermediate_size)
            .max(c.hidden_size)
    }

    /// `out[m, N] = input[m, K] · Wᵀ` (BF16 in and out).
    fn gemm(&mut self, which: LinRef, m: usize, input: u64, out: u64) -> anyhow::Result<()> {
        let lin = self.lin(which);
        let (n, k) = lin.nk();
        match lin {
            DLinear::Bf16 { w, .. } => {
                let w = w.ptr();
                let g = lt_plan(&mut self.plans, &self.lt, self.bufs.one.ptr(), (0, m, n, k))?;
                g.run(&self.lt, &self.gpu, 1.0, w, input, out)?;
            }
            DLinear::Fp8 {
                w,
                scales,
                static_scale,
                ..
            } => {
                let (w, scales, st) = (w.ptr(), scales.ptr(), static_scale.unwrap_or(0.0));
                let in_gemm = self.fp8_in_gemm(n, k, m);
                self.fp8_gemm(m, n, k, (w, scales, st), input, out, in_gemm)?;
            }
            DLinear::W4 { dev } => {
                let view = dev.view();
                let cfg = self.w4_config(n, k, m)?;
                let gemm = if cfg == W4Config::DequantGemm {
                    Some(lt_plan(
                        &mut self.plans,
                        &self.lt,
                        self.bufs.one.ptr(),
                        (0, m, n, k),
                    )?)
                } else {
                    None
                };
                w4::launch_view(
                    &self.gpu,
                    &self.w4m,
                    self.w4v2.as_ref(),
                    Some(&self.lt),
                    &view,
                    &cfg,
                    input,
                    out,
                    m,
                    self.bufs.w4_ws.as_ref().map_or(0, |b| b.ptr()),
                    self.bufs.w4_counters.as_ref().map_or(0, |b| b.ptr()),
                    self.bufs.w4_scratch.as_ref().map_or(0, |b| b.ptr()),
                    gemm,
                )?;
            }
        }
        Ok(())
    }

    /// Whether the FP8 GEMM of `n × k` at `m` tokens applies the per-token × per-channel scales
    /// inside cuBLASLt (outer-vector scaling) rather than after an FP32-output GEMM: the tuned
    /// choice of M's bucket ([`CudaBackend::tune_fp8`]); outer-vector above the tuned buckets.
    fn fp8_in_gemm(&self, n: usize, k: usize, m: usize) -> bool {
        if !self.fp8_rowwise {
            return false;
        }
        match W4_BUCKETS.iter().copied().find(|b| *b >= m) {
            Some(b) => self.fp8_choice.get(&(n, k, b)).copied().unwrap_or(true),
            None => true,
        }
    }

    /// One FP8 W8A8 linear: per-token E4M3 quantization of `input` (`m × k` BF16) on the GPU,
    /// then either cuBLASLt with outer-vector scales (`in_gemm`) or cuBLASLt with unit scales
    /// into the FP32 buffer `acc32` followed by the scaling kernel. `w = (weights, N per-channel
    /// scales, static input scale or 0 for dynamic)`. Output `m × n` BF16 at `out`.
    #[allow(clippy::too_many_arguments)]
    fn fp8_gemm(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        w: (u64, u64, f32),
        input: u64,
        out: u64,
        in_gemm: bool,
    ) -> anyhow::Result<()> {
        let (w, scales, st) = w;
        self.rt.launch(
            &self.gpu,
            "rt_quant_fp8_rows",
            (m as u32, 1, 1),
            (1024, 1, 1),
            0,
            &[
                KArg::Ptr(input),
                KArg::I32(m as i32),
                KArg::I32(k as i32),
                KArg::F32(st),
                KArg::Ptr(self.bufs.hq.ptr()),
                KArg::Ptr(self.bufs.ascale.ptr()),
            ],
        )?;
        let hq = self.bufs.hq.ptr();
        if in_gemm {
            let ascale = self.bufs.ascale.ptr();
            let g = lt_plan(&mut self.plans, &self.lt, self.bufs.one.ptr(), (2, m, n, k))?;
            g.set_scale_pointers(scales, ascale)?;
            g.run(&self.lt, &self.gpu, 1.0, w, hq, out)?;
        } else {
            let acc = self
                .bufs
                .acc32
                .as_ref()
                .context("FP32 accumulation buffer missing")?;
            anyhow::ensure!(
                acc.bytes() >= m * n * 4,
                "FP32 accumulation buffer holds {} B, the FP8 GEMM {m}×{n} needs {} B",
                acc.bytes(),
                m * n * 4
            );
            let acc = acc.ptr();
            let one = self.bufs.one.ptr();
            let g = lt_plan(&mut self.plans, &self.lt, one, (3, m, n, k))?;
            g.set_scale_pointers(one, one)?;
            g.run(&self.lt, &self.gpu, 1.0, w, hq, acc)?;
            self.rt.launch(
                &self.gpu,
                "rt_scale_f32_to_bf16",
                grid1(m * n, 256),
                (256, 1, 1),
                0,
                &[
                    KArg::Ptr(acc),
                    KArg::I32(m as i32),
                    KArg::I32(n as i32),
                    KArg::Ptr(self.bufs.ascale.ptr()),
                    KArg::Ptr(scales),
                    KArg::Ptr(out),
                ],
            )?;
        }
        Ok(())
    }

    /// The distinct `(N, K)` of a layer's four linears (qkv, o, gate_up, down), each with the
    /// index of its first linear (0..4), in that order.
    fn distinct_linear_shapes(&self) -> Vec<(usize, usize, u8)> {
        let mut shapes: Vec<(usize, usize, u8)> = Vec::new();
        for which in 0..4u8 {
            let (n, k) = self.lin(LinRef { layer: 0, which }).nk();
            if !shapes.iter().any(|s| s.0 == n && s.1 == k) {
                shapes.push((n, k, which));
            }
        }
        shapes
    }

    /// Synthesized BF16 activations, `rows × k`, normal(0, 1) with seed `seed + which`, for
    /// tuning linear `which` (0..4): written to `act` for `down` (K = intermediate) and to `h`
    /// otherwise, both sized for `max_tokens × max K`. Returns the buffer's device address.
    ///
    /// # Errors
    /// The launch fails.
    fn synth_tune_input(&self, which: u8, rows: usize, k: usize, seed: u64) -> anyhow::Result<u64> {
        let src = if which == 3 {
            self.bufs.act.ptr()
        } else {
            self.bufs.h.ptr()
        };
        let len = (rows * k) as u64;
        self.rt.launch(
            &self.gpu,
            "rt_synth_bf16",
            grid1(len as usize, 256),
            (256, 1, 1),
            0,
            &[
                KArg::Ptr(src),
                KArg::U64(len),
                KArg::U64(seed + which as u64),
                KArg::F32(0.0),
                KArg::F32(1.0),
            ],
        )?;
        Ok(src)
    }

    /// One bucket of [`CudaBackend::tune_fp8`]: run both FP8 scaling paths on the same input,
    /// compare their outputs, then time each (median of 7, L2 flushed by a read of `flush`
    /// before every sample). `bufs = (reference output, output)`, both `m × n` BF16.
    #[allow(clippy::too_many_arguments)]
    fn time_fp8_paths(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        w: (u64, u64, f32),
        src: u64,
        bufs: (u64, u64),
        flush: &DevBuf,
        timer: &crate::gpu::Timer,
    ) -> anyhow::Result<Fp8Trial> {
        let (ref_out, out) = bufs;
        self.fp8_gemm(m, n, k, w, src, ref_out, true)?;
        self.fp8_gemm(m, n, k, w, src, out, false)?;
        let want: Vec<u16> = self.gpu.download(&self.bufs.gu, 0, m * n)?;
        let got: Vec<u16> = self.gpu.download(&self.bufs.qkv, 0, m * n)?;
        let err = rel_l2_bf16(&got, &want);
        if !fp8_paths_agree(err) {
            return Ok(Fp8Trial::Disagree(err));
        }
        let amax = self.bufs.ascale.ptr(); // scratch word; the timed runs rewrite it
        let mut med = [0f64; 2];
        for (slot, in_gemm) in [(0usize, true), (1, false)] {
            let mut times = Vec::with_capacity(7);
            for _ in 0..7 {
                self.rt.launch(
                    &self.gpu,
                    "rt_amax_bf16",
                    grid1(flush.bytes() / 2, 256).min((self.gpu.sm_count * 16, 1, 1)),
                    (256, 1, 1),
                    0,
                    &[
                        KArg::Ptr(flush.ptr()),
                        KArg::U64((flush.bytes() / 2) as u64),
                        KArg::Ptr(amax),
                    ],
                )?;
                timer.start(&self.gpu)?;
                self.fp8_gemm(m, n, k, w, src, out, in_gemm)?;
                times.push(timer.stop(&self.gpu)?);
            }
            times.sort_by(f64::total_cmp);
            med[slot] = times[3];
        }
        Ok(Fp8Trial::Timed {
            outer_vec: med[0],
            fp32_scale: med[1],
        })
    }

    /// Choose, by measurement, how each FP8 linear (every distinct N × K) applies its scales at
    /// each M bucket up to [`FP8_TUNE_MAX_M`]: inside cuBLASLt (outer-vector scales) or after an
    /// FP32-output cuBLASLt GEMM with unit scales. On the H200 the outer-vector heuristic's
    /// choice at M = 1 ran `down` of Qwen3-32B at about 3× its weight-streaming time (run of
    /// 2026-11-30 in `reports/nvidia-h200-sm90/`), so this is measured, not assumed. The two
    /// paths are checked against each other (relative L2 ≤ [`FP8_PATHS_REL_L2`]) before the
    /// faster is kept, timed with a cold L2; a disagreement, or a failure of either path at a
    /// bucket, keeps the outer-vector path there and leaves a note.
    ///
    /// # Errors
    /// A launch, allocation or timer fails.
    fn tune_fp8(&mut self) -> anyhow::Result<()> {
        if !self.fp8_rowwise {
            return Ok(());
        }
        let shapes = self.distinct_linear_shapes();
        let m_max = self.max_tokens.min(FP8_TUNE_MAX_M);
        let maxn = self.max_n();
        let acc_bytes = m_max * maxn * 4;
        if self
            .bufs
            .acc32
            .as_ref()
            .is_none_or(|b| b.bytes() < acc_bytes)
        {
            self.bufs.acc32 = Some(self.gpu.alloc(acc_bytes)?);
        }
        let timer = self.gpu.timer()?;
        // Cold L2 for every timed sample, as in the kernel bench and a decode step (a layer's
        // weights are evicted by the other layers' before they are read again): a read pass
        // over 2 × L2 (`rt_amax_bf16` reads every element and writes one word).
        let flush_elems = ((2 * self.gpu.l2_bytes as usize).max(64 << 20)) / 2;
        let flush = self.gpu.alloc(flush_elems * 2)?;
        self.gpu.memset(&flush, 0)?;
        let mut rows_needed = 0usize;
        let mut summary: Vec<String> = Vec::new();
        for &(n, k, which) in &shapes {
            let (w, scales, st) = match self.lin(LinRef { layer: 0, which }) {
                DLinear::Fp8 {
                    w,
                    scales,
                    static_scale,
                    ..
                } => (w.ptr(), scales.ptr(), static_scale.unwrap_or(0.0)),
                _ => anyhow::bail!("FP8 tuning on a layer that is not FP8"),
            };
            let src = self.synth_tune_input(which, m_max, k, 0xF8_0000)?;
            let (ref_out, out) = (self.bufs.gu.ptr(), self.bufs.qkv.ptr());
            let mut picks: Vec<String> = Vec::new();
            for &b in W4_BUCKETS.iter().filter(|b| **b <= m_max) {
                match self.time_fp8_paths(
                    b,
                    n,
                    k,
                    (w, scales, st),
                    src,
                    (ref_out, out),
                    &flush,
                    &timer,
                ) {
                    Ok(Fp8Trial::Disagree(err)) => {
                        self.notes.push(format!(
                            "FP8 {n}×{k} M = {b}: the FP32-output path differs from cuBLASLt's outer-vector scaling by relative L2 {err:.2e} (> {FP8_PATHS_REL_L2:.0e}); outer-vector kept"
                        ));
                        self.fp8_choice.insert((n, k, b), true);
                    }
                    Ok(Fp8Trial::Timed {
                        outer_vec,
                        fp32_scale,
                    }) => {
                        let in_gemm = fp8_pick_in_gemm(outer_vec, fp32_scale);
                        if !in_gemm {
                            rows_needed = rows_needed.max(b);
                        }
                        self.fp8_choice.insert((n, k, b), in_gemm);
                        picks.push(format!(
                            "M={b} {} ({:.1} vs {:.1} µs)",
                            if in_gemm { "outer-vec" } else { "fp32+scale" },
                            1e6 * outer_vec.min(fp32_scale),
                            1e6 * outer_vec.max(fp32_scale)
                        ));
                    }
                    Err(e) => {
                        // The outer-vector path is the one gemm() runs without a choice; a
                        // failure of the other path costs only the choice.
                        self.notes.push(format!(
                            "FP8 {n}×{k} M = {b}: the scaling paths could not be compared ({e:#}); outer-vector kept"
                        ));
                        self.fp8_choice.insert((n, k, b), true);
                    }
                }
            }
            summary.push(format!("{n}×{k}: {}", picks.join(", ")));
        }
        // Keep only the FP32 rows the chosen fallbacks need.
        if rows_needed == 0 {
            self.bufs.acc32 = None;
        } else if rows_needed < m_max {
            self.bufs.acc32 = Some(self.gpu.alloc(rows_needed * maxn * 4)?);
        }
        self.notes.push(format!(
            "FP8 scaling path by measurement (median of 7 with a cold L2, per-token quantization included): {}",
            summary.join("; ")
        ));
        Ok(())
    }

    fn lin(&self, r: LinRef) -> &DLinear {
        let l = &self.weights.layers[r.layer];
        match r.which {
            0 => &l.qkv,
            1 => &l.o,
            2 => &l.gate_up,
            _ => &l.down,
        }
    }

    fn w4_config(&self, n: usize, k: usize, m: usize) -> anyhow::Result<W4Config> {
        match W4_BUCKETS.iter().copied().find(|b| *b >= m) {
            Some(b) => self
                .w4_choice
                .get(&(n, k, b))
                .cloned()
                .with_context(|| format!("no tuned W4A16 configuration for {n}×{k} at M = {m}")),
            None => Ok(W4Config::DequantGemm),
        }
    }

    /// Choose the W4A16 configuration of every (shape, M bucket) by measurement, after checking
    /// each candidate against the dequantize + cuBLASLt result (exactly dequantized weights,
    /// FP32 accumulation) under the W4A16 GEMM tolerance: correct before fast.
    fn tune_w4(&mut self) -> anyhow::Result<()> {
        let shapes = self.distinct_linear_shapes();
        let t_max = self.max_tokens;
        let timer = self.gpu.timer()?;
        // Inputs: synthesized BF16 activations in `h`/`act` (both hold t_max × max K).
        for &(n, k, which) in &shapes {
            let src = self.synth_tune_input(which, t_max, k, 0x5EED_0000)?;
            let refbuf = self.bufs.gu.ptr();
            let outbuf = self.bufs.qkv.ptr();
            for &b in W4_BUCKETS.iter().filter(|b| **b <= t_max) {
                let (view, strips, kt_n) = {
                    let DLinear::W4 { dev } = self.lin(LinRef { layer: 0, which }) else {
                        anyhow::bail!("W4A16 tuning on a non-NVFP4 layer");
                    };
                    (dev.view(), dev.strips, dev.kt_n)
                };
                let mut cands = w4::fused_candidates(&self.gpu, &self.w4m, strips, kt_n, b)?;
                if let Some(v2) = &self.w4v2 {
                    cands.extend(w4::v2_candidates(&self.gpu, v2, strips, kt_n, b)?);
                }
                if b >= w4::DEQUANT_MIN_M {
                    cands.push(W4Config::DequantGemm);
                }
                // Reference: dequantize + cuBLASLt.
                self.ensure_w4_scratch(&cands, n, k)?;
                lt_plan(&mut self.plans, &self.lt, self.bufs.one.ptr(), (0, b, n, k))?;
                let gref = &self.plans[&(0, b, n, k)];
                let scratch = self
                    .bufs
                    .w4_scratch
                    .as_ref()
                    .context("no W4A16 scratch")?
                    .ptr();
                w4::launch_view(
                    &self.gpu,
                    &self.w4m,
                    self.w4v2.as_ref(),
                    Some(&self.lt),
                    &view,
                    &W4Config::DequantGemm,
                    src,
                    refbuf,
                    b,
                    0,
                    0,
                    scratch,
                    Some(gref),
                )?;
                let want: Vec<u16> = self.gpu.download(&self.bufs.gu, 0, b * n)?;
                let mut best: Option<(f64, W4Config)> = None;
                let mut rejected = 0usize;
                for c in &cands {
                    let gemm = (c == &W4Config::DequantGemm).then_some(gref);
                    let run = |me: &Self| {
                        w4::launch_view(
                            &me.gpu,
                            &me.w4m,
                            me.w4v2.as_ref(),
                            Some(&me.lt),
                            &view,
                            c,
                            src,
                            outbuf,
                            b,
                            me.bufs.w4_ws.as_ref().map_or(0, |x| x.ptr()),
                            me.bufs.w4_counters.as_ref().map_or(0, |x| x.ptr()),
                            scratch,
                            gemm,
                        )
                    };
                    self.gpu.memset_range(&self.bufs.qkv, 0, b * n * 2, 0xFF)?;
                    run(self)?;
                    let got: Vec<u16> = self.gpu.download(&self.bufs.qkv, 0, b * n)?;
                    let err = rel_l2_bf16(&got, &want);
                    if err.is_nan() || err > crate::kernels::reference::W4A16_GEMM_REL_L2 {
                        rejected += 1;
                        continue;
                    }
                    let mut times = Vec::with_capacity(5);
                    for _ in 0..5 {
                        timer.start(&self.gpu)?;
                        run(self)?;
                        times.push(timer.stop(&self.gpu)?);
                    }
                    times.sort_by(f64::total_cmp);
                    let t = times[2];
                    if best.as_ref().is_none_or(|(bt, _)| t < *bt) {
                        best = Some((t, c.clone()));
                    }
                }
                let (_, cfg) = best.with_context(|| {
                    format!(
                        "no W4A16 configuration for {n}×{k} at M = {b} passed its check against dequantize + cuBLASLt ({rejected} rejected)"
                    )
                })?;
                if rejected > 0 {
                    self.notes.push(format!(
                        "W4A16 {n}×{k} M = {b}: {rejected} configuration(s) failed the check and were not used"
                    ));
                }
                self.w4_choice.insert((n, k, b), cfg);
            }
        }
        Ok(())
    }

    fn ensure_w4_scratch(&mut self, cands: &[W4Config], n: usize, k: usize) -> anyhow::Result<()> {
        let mut ws = 0usize;
        let mut ctr = 0usize;
        let mut scratch = n * k * 2;
        for c in cands {
            let (a, b, s) = w4::scratch_needs(c, n, k);
            ws = ws.max(a);
            ctr = ctr.max(b);
            scratch = scratch.max(s);
        }
        if ws > 0 && self.bufs.w4_ws.as_ref().is_none_or(|b| b.bytes() < ws * 4) {
            self.bufs.w4_ws = Some(self.gpu.alloc(ws * 4)?);
        }
        if ctr > 0
            && self
                .bufs
                .w4_counters
                .as_ref()
                .is_none_or(|b| b.bytes() < ctr * 4)
        {
            let c = self.gpu.alloc(ctr * 4)?;
            self.gpu.memset(&c, 0)?;
            self.bufs.w4_counters = Some(c);
        }
        if self
            .bufs
            .w4_scratch
            .as_ref()
            .is_none_or(|b| b.bytes() < scratch)
        {
            self.bufs.w4_scratch = Some(self.gpu.alloc(scratch)?);
        }
        Ok(())
    }

    fn kv_ptrs(&self, layer: usize) -> anyhow::Result<(u64, u64)> {
        let (buf, spec) = self.kv.as_ref().context("forward before init_kv_cache")?;
        let c = &self.config;
        let region = (spec.num_blocks + 1)
            * c.num_kv_heads
            * spec.block_size
            * c.head_dim
            * spec.dtype.bytes();
        let base = buf.ptr() + (2 * layer * region) as u64;
        Ok((base, base + region as u64))
    }

    /// Queue the whole forward pass for an uploaded plan (no host synchronization inside, so it
    /// can be captured into a graph).
    fn queue_forward(&mut self, p: &plan::Plan) -> anyhow::Result<()> {
        let c = self.config.clone();
        let (h, t) = (c.hidden_size, p.tokens);
        let meta = self.bufs.meta.ptr();
        let at = |off: usize| meta + (off * 4) as u64;
        let l = p.layout;
        let spec = self.kv.as_ref().context("forward before init_kv_cache")?.1;
        let fp8_kv = spec.dtype == KvCacheDtype::Fp8;
        self.op_begin()?;
        self.rt.launch(
            &self.gpu,
            "rt_embed",
            (t as u32, 1, 1),
            (256, 1, 1),
            0,
            &[
                KArg::Ptr(at(l.ids)),
                KArg::I32(t as i32),
                KArg::Ptr(self.weights.embed.ptr()),
                KArg::I32(h as i32),
                KArg::Ptr(self.bufs.x.ptr()),
            ],
        )?;
        self.op_end("embedding")?;
        let nl = c.num_layers;
        for li in 0..nl {
            let (kc, vc) = self.kv_ptrs(li)?;
            let layer = &self.weights.layers[li];
            let (in_norm, post_norm) = (layer.input_norm.ptr(), layer.post_norm.ptr());
            let (qn, kn) = (
                layer.q_norm.as_ref().map_or(0, |b| b.ptr()),
                layer.k_norm.as_ref().map_or(0, |b| b.ptr()),
            );
            let (ks, vs) = (layer.k_scale, layer.v_scale);
            let delta = if li == 0 { 0 } else { self.bufs.hout.ptr() };
            self.op_begin()?;
            self.norm(delta, 0, t, in_norm, self.bufs.h.ptr())?;
            self.op_end("residual add + RMSNorm")?;
            self.op_begin()?;
            self.gemm(
                LinRef {
                    layer: li,
                    which: 0,
                },
                t,
                self.bufs.h.ptr(),
                self.bufs.qkv.ptr(),
            )?;
            self.op_end("GEMM qkv")?;
            self.op_begin()?;
            self.rt.launch(
                &self.gpu,
                "rt_qk_norm_rope_kv",
                (t as u32, (c.num_heads + 2 * c.num_kv_heads) as u32, 1),
                (c.head_dim.clamp(32, 128) as u32 / 32 * 32, 1, 1),
                0,
                &[
                    KArg::Ptr(self.bufs.qkv.ptr()),
                    KArg::I32(t as i32),
                    KArg::I32(c.num_heads as i32),
                    KArg::I32(c.num_kv_heads as i32),
                    KArg::I32(c.head_dim as i32),
                    KArg::Ptr(qn),
                    KArg::Ptr(kn),
                    KArg::Ptr(self.bufs.inv_freq.ptr()),
                    KArg::F32(c.rms_norm_eps),
                    KArg::Ptr(at(l.pos)),
                    KArg::Ptr(at(l.slot)),
                    KArg::Ptr(self.bufs.q.ptr()),
                    KArg::Ptr(kc),
                    KArg::Ptr(vc),
                    KArg::I32(spec.block_size as i32),
                    KArg::I32(fp8_kv as i32),
                    KArg::F32(1.0 / ks),
                    KArg::F32(1.0 / vs),
                ],
            )?;
            self.op_end("q/k norm + RoPE + KV write")?;
            self.op_begin()?;
            self.attention(p, kc, vc, ks, vs, fp8_kv, spec.block_size)?;
            self.op_end("attention")?;
            self.op_begin()?;
            self.gemm(
                LinRef {
                    layer: li,
                    which: 1,
                },
                t,
                self.bufs.attn.ptr(),
                self.bufs.hout.ptr(),
            )?;
            self.op_end("GEMM o_proj")?;
            self.op_begin()?;
            self.norm(self.bufs.hout.ptr(), 0, t, post_norm, self.bufs.h.ptr())?;
            self.op_end("residual add + RMSNorm")?;
            self.op_begin()?;
            self.gemm(
                LinRef {
                    layer: li,
                    which: 2,
                },
                t,
                self.bufs.h.ptr(),
                self.bufs.gu.ptr(),
            )?;
            self.op_end("GEMM gate_up")?;
            let i = c.intermediate_size;
            self.op_begin()?;
            self.rt.launch(
                &self.gpu,
                "rt_silu_mul",
                grid1(t * i, 256),
                (256, 1, 1),
                0,
                &[
                    KArg::Ptr(self.bufs.gu.ptr()),
                    KArg::I32(t as i32),
                    KArg::I32(i as i32),
                    KArg::Ptr(self.bufs.act.ptr()),
                ],
            )?;
            self.op_end("SwiGLU")?;
            self.op_begin()?;
            self.gemm(
                LinRef {
                    layer: li,
                    which: 3,
                },
                t,
                self.bufs.act.ptr(),
                self.bufs.hout.ptr(),
            )?;
            self.op_end("GEMM down")?;
        }
        self.op_begin()?;
        // Last residual add, final norm on the logit rows, lm_head in FP32.
        self.rt.launch(
            &self.gpu,
            "rt_add_rows",
            grid1(t * h, 256),
            (256, 1, 1),
            0,
            &[
                KArg::Ptr(self.bufs.x.ptr()),
                KArg::Ptr(self.bufs.hout.ptr()),
                KArg::U64((t * h) as u64),
            ],
        )?;
        self.op_end("final residual add")?;
        if p.rows > 0 {
            self.op_begin()?;
            self.norm(
                0,
                at(l.rows),
                p.rows,
                self.weights.norm.ptr(),
                self.bufs.last_h.ptr(),
            )?;
            self.op_end("final RMSNorm")?;
            self.op_begin()?;
            let head = self
                .weights
                .lm_head
                .as_ref()
                .unwrap_or(&self.weights.embed)
                .ptr();
            let v = c.vocab_size;
            let g = lt_plan(
                &mut self.plans,
                &self.lt,
                self.bufs.one.ptr(),
                (1, p.rows, v, h),
            )?;
            g.run(
                &self.lt,
                &self.gpu,
                1.0,
                head,
                self.bufs.last_h.ptr(),
                self.bufs.logits.ptr(),
            )?;
            self.op_end("GEMM lm_head (FP32 logits)")?;
        }
        Ok(())
    }

    fn norm(&self, delta: u64, rows: u64, r: usize, w: u64, out: u64) -> anyhow::Result<()> {
        // One block per row; 1,024 threads keep a decode step's single row from being latency
        // bound (a 256-thread block took 19 µs on a 5,120-wide row).
        self.rt.launch(
            &self.gpu,
            "rt_add_rmsnorm",
            (r as u32, 1, 1),
            (1024, 1, 1),
            0,
            &[
                KArg::Ptr(self.bufs.x.ptr()),
                KArg::Ptr(delta),
                KArg::Ptr(rows),
                KArg::I32(r as i32),
                KArg::Ptr(w),
                KArg::I32(self.config.hidden_size as i32),
                KArg::F32(self.config.rms_norm_eps),
                KArg::Ptr(out),
            ],
        )?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        p: &plan::Plan,
        kc: u64,
        vc: u64,
        ks: f32,
        vs: f32,
        fp8_kv: bool,
        block_size: usize,
    ) -> anyhow::Result<()> {
        let c = &self.config;
        let meta = self.bufs.meta.ptr();
        let at = |off: usize| meta + (off * 4) as u64;
        let l = p.layout;
        let sm_scale = 1.0 / (c.head_dim as f32).sqrt();
        if p.dec_tokens > 0 {
            let name = if fp8_kv {
                "rt_attn_decode_fp8"
            } else {
                "rt_attn_decode_bf16"
            };
            self.rt.launch(
                &self.gpu,
                name,
                (
                    p.dec_tokens as u32,
                    c.num_kv_heads as u32,
                    p.att_parts as u32,
                ),
                (ATT_THREADS, 1, 1),
                0,
                &[
                    KArg::Ptr(at(l.dec_tok)),
                    KArg::Ptr(self.bufs.q.ptr()),
                    KArg::Ptr(at(l.tok_seq)),
                    KArg::Ptr(at(l.pos)),
                    KArg::Ptr(at(l.block_tables)),
                    KArg::Ptr(meta),
                    KArg::Ptr(kc),
                    KArg::Ptr(vc),
                    KArg::F32(ks),
                    KArg::F32(vs),
                    KArg::I32(c.num_heads as i32),
                    KArg::I32(c.num_kv_heads as i32),
                    KArg::I32(c.head_dim as i32),
                    KArg::I32(block_size as i32),
                    KArg::F32(sm_scale),
                    KArg::Ptr(self.bufs.attn.ptr()),
                    KArg::Ptr(self.bufs.part_ml.ptr()),
                    KArg::Ptr(self.bufs.part_o.ptr()),
                ],
            )?;
            if p.att_parts > 1 {
                self.rt.launch(
                    &self.gpu,
                    "rt_attn_combine",
                    (p.dec_tokens as u32, c.num_heads as u32, 1),
                    (c.head_dim.clamp(32, 256) as u32, 1, 1),
                    0,
                    &[
                        KArg::Ptr(at(l.dec_tok)),
                        KArg::Ptr(at(l.pos)),
                        KArg::I32(c.num_heads as i32),
                        KArg::I32(c.head_dim as i32),
                        KArg::I32(p.att_parts as i32),
                        KArg::Ptr(self.bufs.part_ml.ptr()),
                        KArg::Ptr(self.bufs.part_o.ptr()),
                        KArg::Ptr(self.bufs.attn.ptr()),
                    ],
                )?;
            }
        }
        if p.tiles > 0 {
            let name = format!(
                "rt_attn_prefill_{}_hd{}",
                if fp8_kv { "fp8" } else { "bf16" },
                c.head_dim
            );
            let smem = (2 * 64 * (c.head_dim + 8) * 2) as u32;
            self.rt.launch(
                &self.gpu,
                &name,
                (p.tiles as u32, c.num_heads as u32, 1),
                (128, 1, 1),
                smem,
                &[
                    KArg::Ptr(self.bufs.q.ptr()),
                    KArg::Ptr(at(l.tiles)),
                    KArg::Ptr(at(l.block_tables)),
                    KArg::Ptr(meta),
                    KArg::Ptr(kc),
                    KArg::Ptr(vc),
                    KArg::F32(ks),
                    KArg::F32(vs),
                    KArg::I32(c.num_heads as i32),
                    KArg::I32(c.num_kv_heads as i32),
                    KArg::I32(block_size as i32),
                    KArg::F32(sm_scale),
                    KArg::Ptr(self.bufs.attn.ptr()),
                ],
            )?;
        }
        Ok(())
    }

    fn plan_env(&self) -> anyhow::Result<plan::PlanEnv> {
        let spec = self.kv.as_ref().context("forward before init_kv_cache")?.1;
        Ok(plan::PlanEnv {
            block_size: spec.block_size,
            num_blocks: spec.num_blocks,
            vocab: self.config.vocab_size,
            kv_heads: self.config.num_kv_heads,
            sm_count: self.gpu.sm_count as usize,
            part_cap: PART_CAP,
            tc_prefill: self.opts.tc_prefill,
        })
    }

    /// Run the forward pass of `batch` up to the logits on the device (graph replay for decode
    /// steps when graphs are on). Returns the plan.
    fn run_forward(&mut self, batch: &ForwardBatch) -> anyhow::Result<plan::Plan> {
        self.gpu.bind()?;
        let env = self.plan_env()?;
        anyhow::ensure!(
            batch.token_ids.len() <= self.max_tokens,
            "{} tokens in one forward pass; the backend was sized for {} (--max-num-batched-tokens)",
            batch.token_ids.len(),
            self.max_tokens
        );
        anyhow::ensure!(
            batch.num_logits() <= self.max_rows,
            "{} logit rows in one forward pass; the backend holds {}",
            batch.num_logits(),
            self.max_rows
        );
        let pad = if self.opts.cuda_graphs && plan::is_decode_step(batch) {
            plan::graph_batch(batch.token_ids.len(), &self.graph_sizes)
        } else {
            None
        };
        let p = plan::plan(batch, &env, pad)?;
        anyhow::ensure!(
            p.image.len() * 4 <= self.bufs.meta.bytes(),
            "batch metadata of {} bytes exceeds its buffer",
            p.image.len() * 4
        );
        self.gpu.write(&self.bufs.meta, 0, &p.image)?;
        self.stats.forwards += 1;
        if p.tiles > 0 {
            self.stats.prefill_tc += 1;
        }
        match pad {
            Some(b) => {
                if !self.graphs.contains_key(&b) {
                    // Plans (cuBLASLt heuristics) are made on first use, outside the capture:
                    // run the step once eagerly, then capture it.
                    self.queue_forward(&p)?;
                    self.gpu.sync()?;
                    self.gpu.begin_capture()?;
                    let r = self.queue_forward(&p);
                    let g = self.gpu.end_capture();
                    r?;
                    self.graphs.insert(b, g?);
                    self.stats.graphs_captured += 1;
                }
                self.graphs[&b].launch()?;
                self.stats.graph_replays += 1;
            }
            None => {
                self.queue_forward(&p)?;
                self.prof_collect()?;
            }
        }
        Ok(p)
    }

    /// Forward pass and sampling on the device: one token per logit row (rows in batch order).
    ///
    /// # Errors
    /// As [`Backend::forward`], or `rows.len()` different from the batch's logit rows.
    pub fn sample_forward(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowSampling],
    ) -> anyhow::Result<Vec<u32>> {
        anyhow::ensure!(
            rows.len() == batch.num_logits(),
            "{} sampling settings for {} logit rows",
            rows.len(),
            batch.num_logits()
        );
        let p = self.run_forward(batch)?;
        if p.real_rows == 0 {
            return Ok(Vec::new());
        }
        let n = p.real_rows;
        let temp: Vec<f32> = rows.iter().map(|r| r.temperature).collect();
        let top_p: Vec<f32> = rows.iter().map(|r| r.top_p).collect();
        let top_k: Vec<i32> = rows.iter().map(|r| r.top_k).collect();
        let seed: Vec<u64> = rows.iter().map(|r| r.seed).collect();
        let draw: Vec<u64> = rows.iter().map(|r| r.draw).collect();
        self.gpu.write(&self.bufs.smp_temp, 0, &temp)?;
        self.gpu.write(&self.bufs.smp_top_p, 0, &top_p)?;
        self.gpu.write(&self.bufs.smp_top_k, 0, &top_k)?;
        self.gpu.write(&self.bufs.smp_seed, 0, &seed)?;
        self.gpu.write(&self.bufs.smp_draw, 0, &draw)?;
        self.rt.launch(
            &self.gpu,
            "rt_sample",
            (n as u32, 1, 1),
            (1024, 1, 1),
            0,
            &[
                KArg::Ptr(self.bufs.logits.ptr()),
                KArg::I32(self.config.vocab_size as i32),
                KArg::Ptr(self.bufs.smp_temp.ptr()),
                KArg::Ptr(self.bufs.smp_top_p.ptr()),
                KArg::Ptr(self.bufs.smp_top_k.ptr()),
                KArg::Ptr(self.bufs.smp_seed.ptr()),
                KArg::Ptr(self.bufs.smp_draw.ptr()),
                KArg::Ptr(self.bufs.smp_out.ptr()),
            ],
        )?;
        let toks: Vec<i32> = self.gpu.download(&self.bufs.smp_out, 0, n)?;
        Ok(toks.into_iter().map(|t| t as u32).collect())
    }
}

/// Outcome of timing the two FP8 scaling paths at one (N, K, M bucket).
enum Fp8Trial {
    /// Their outputs differ by this relative L2 (over [`FP8_PATHS_REL_L2`]): not timed.
    Disagree(f64),
    /// Median seconds of each, per-token quantization included.
    Timed {
        /// cuBLASLt with outer-vector scales.
        outer_vec: f64,
        /// Unit-scale cuBLASLt into FP32, then `rt_scale_f32_to_bf16`.
        fp32_scale: f64,
    },
}

/// Whether the two FP8 scaling paths agree: relative L2 `err` of one against the other is
/// finite and at most [`FP8_PATHS_REL_L2`].
fn fp8_paths_agree(err: f64) -> bool {
    err.is_finite() && err <= FP8_PATHS_REL_L2
}

/// The FP8 scaling path to keep from two median times in seconds: `true` (outer-vector scales
/// inside cuBLASLt) unless the FP32-output path is strictly faster; ties and unusable times
/// keep outer-vector scaling, the path that needs no FP32 buffer.
fn fp8_pick_in_gemm(outer_vec_s: f64, fp32_scale_s: f64) -> bool {
    !(fp32_scale_s.is_finite() && fp32_scale_s > 0.0 && fp32_scale_s < outer_vec_s)
}

/// Plan-cache key: (kind class, M, N, K). Classes: 0 BF16 → BF16, 1 BF16 → FP32 (lm_head),
/// 2 FP8 with outer-vector scales → BF16, 3 FP8 unscaled → FP32.
type PlanKey = (u8, usize, usize, usize);

/// The cuBLASLt plan for `key`, planned on first use. FP8 plans are made with placeholder scale
/// pointers; the caller sets the real ones before each run.
fn lt_plan<'a>(
    plans: &'a mut HashMap<PlanKey, LtGemm>,
    lt: &Lt,
    placeholder: u64,
    key: PlanKey,
) -> anyhow::Result<&'a LtGemm> {
    if let std::collections::hash_map::Entry::Vacant(slot) = plans.entry(key) {
        let (class, m, n, k) = key;
        let (kind, out) = match class {
            0 => (LtKind::Bf16, OutType::Bf16),
            1 => (LtKind::Bf16, OutType::F32),
            2 => (
                LtKind::Fp8RowWise {
                    w_scales_ptr: placeholder,
                    a_scales_ptr: placeholder,
                },
                OutType::Bf16,
            ),
            _ => (
                LtKind::Fp8 {
                    w_scale_ptr: placeholder,
                    a_scale_ptr: placeholder,
                },
                OutType::F32,
            ),
        };
        slot.insert(LtGemm::plan_out(lt, kind, m, n, k, out)?);
    }
    Ok(&plans[&key])
}

/// Per-op GPU time of forward passes, from CUDA events around each op (timers are reused from a
/// pool; the totals are read after each step).
struct Profiler {
    timers: Vec<crate::gpu::Timer>,
    used: Vec<&'static str>,
    totals: std::collections::BTreeMap<&'static str, (u64, f64)>,
}

/// Which linear of a layer: 0 qkv, 1 o, 2 gate_up, 3 down.
#[derive(Debug, Clone, Copy)]
struct LinRef {
    layer: usize,
    which: u8,
}

/// rel L2 error of BF16 `got` against BF16 `want` (NaN → infinite).
fn rel_l2_bf16(got: &[u16], want: &[u16]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (g, w) in got.iter().zip(want) {
        let g = f32::from_bits((*g as u32) << 16) as f64;
        let w = f32::from_bits((*w as u32) << 16) as f64;
        if !g.is_finite() {
            return f64::INFINITY;
        }
        num += (g - w) * (g - w);
        den += w * w;
    }
    if den == 0.0 {
        if num == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        (num / den).sqrt()
    }
}

#[allow(clippy::too_many_arguments)]
fn alloc_bufs(
    gpu: &Gpu,
    c: &ModelConfig,
    w: &DWeights,
    t: usize,
    rows: usize,
    max_model_len: usize,
    block_size: usize,
) -> anyhow::Result<Bufs> {
    let (h, i) = (c.hidden_size, c.intermediate_size);
    let qkvd = c.q_dim() + 2 * c.kv_dim();
    let maxk = h.max(c.q_dim()).max(i);
    let _ = w;
    let max_blocks = max_model_len.div_ceil(block_size.max(1)) + 1;
    let caps = plan::Caps::for_batch(t, rows.max(1).min(t), rows);
    let meta_ints = plan::Layout::new(caps).len(max_blocks);
    let inv_freq = c.rope_inv_freq();
    Ok(Bufs {
        x: gpu.alloc(t * h * 4)?,
        h: gpu.alloc(t * maxk * 2)?,
        qkv: gpu.alloc(t * qkvd.max(2 * i).max(h) * 2)?,
        q: gpu.alloc(t * c.q_dim() * 2)?,
        attn: gpu.alloc(t * c.q_dim() * 2)?,
        gu: gpu.alloc(t * (2 * i).max(qkvd).max(h) * 2)?,
        act: gpu.alloc(t * maxk * 2)?,
        hout: gpu.alloc(t * h * 2)?,
        hq: gpu.alloc(t * maxk)?,
        ascale: gpu.alloc(t * 4)?,
        acc32: None,
        last_h: gpu.alloc(rows * h * 2)?,
        logits: gpu.alloc(rows * c.vocab_size * 4)?,
        part_ml: gpu.alloc(PART_CAP * c.num_heads * 2 * 4)?,
        part_o: gpu.alloc(PART_CAP * c.num_heads * c.head_dim * 4)?,
        meta: gpu.alloc(meta_ints * 4)?,
        inv_freq: gpu.upload(&inv_freq)?,
        one: gpu.upload(&vec![1.0f32; qkvd.max(2 * i).max(h)])?,
        smp_temp: gpu.alloc(rows * 4)?,
        smp_top_p: gpu.alloc(rows * 4)?,
        smp_top_k: gpu.alloc(rows * 4)?,
        smp_seed: gpu.alloc(rows * 8)?,
        smp_draw: gpu.alloc(rows * 8)?,
        smp_out: gpu.alloc(rows * 4)?,
        w4_ws: None,
        w4_counters: None,
        w4_scratch: None,
    })
}

/// Builds device weights.
struct Loader<'a> {
    gpu: &'a Gpu,
    rt: &'a Module,
}

impl Loader<'_> {
    fn f32s(&self, v: &[f32]) -> anyhow::Result<DevBuf> {
        Ok(self.gpu.upload(v)?)
    }

    /// Fuse host linears row-wise and upload in their (shared) format.
    fn fuse_host(&self, parts: &[&Linear]) -> anyhow::Result<DLinear> {
        let k = parts[0].shape().1;
        anyhow::ensure!(
            parts
                .iter()
                .all(|p| p.shape().1 == k && p.format() == parts[0].format()),
            "fused projections differ in K or format"
        );
        let n: usize = parts.iter().map(|p| p.shape().0).sum();
        match parts[0] {
            Linear::Bf16 { .. } => {
                let mut data = Vec::with_capacity(n * k);
                for p in parts {
                    if let Linear::Bf16 { data: d, .. } = p {
                        data.extend_from_slice(d);
                    }
                }
                Ok(DLinear::Bf16 {
                    w: self.gpu.upload(&data)?,
                    n,
                    k,
                })
            }
            Linear::Fp8 { .. } => {
                let mut data = Vec::with_capacity(n * k);
                let mut scales = Vec::with_capacity(n);
                let mut st: Option<f32> = None;
                for p in parts {
                    if let Linear::Fp8 { w, input_scale } = p {
                        data.extend_from_slice(&w.data);
                        for r in 0..w.rows {
                            scales.push(w.row_scale(r));
                        }
                        // vLLM runs a fused FP8 layer with the largest static input scale.
                        if let Some(s) = input_scale {
                            st = Some(st.map_or(*s, |x: f32| x.max(*s)));
                        }
                    }
                }
                Ok(DLinear::Fp8 {
                    w: self.gpu.upload(&data)?,
                    scales: self.gpu.upload(&scales)?,
                    static_scale: st,
                    n,
                    k,
                })
            }
            Linear::Nvfp4(first) => {
                let gs = first.global_scale;
                let mut packed = Vec::with_capacity(n * k / 2);
                let mut bs = Vec::with_capacity(n * k / 16);
                for p in parts {
                    if let Linear::Nvfp4(w) = p {
                        anyhow::ensure!(
                            w.global_scale == gs,
                            "NVFP4 projections that run fused (q/k/v, gate/up) have different weight_scale_2 ({} vs {gs}); rigbench's W4A16 GEMM needs one per fused layer, as ModelOpt exports them",
                            w.global_scale
                        );
                        packed.extend_from_slice(&w.packed);
                        bs.extend_from_slice(&w.block_scales);
                    }
                }
                let fused = Nvfp4Weight {
                    n,
                    k,
                    packed,
                    block_scales: bs,
                    global_scale: gs,
                };
                let p = repack(&fused)?;
                Ok(DLinear::W4 {
                    dev: W4a16Device::upload(self.gpu, &p)?,
                })
            }
        }
    }

    fn host_weights(
        &self,
        w: &ModelWeights,
        quantize: Option<WeightFormat>,
    ) -> anyhow::Result<DWeights> {
        let owned;
        let w = match quantize {
            Some(f) if f != w.linear_format() => {
                let mut c = w.clone();
                c.quantize(f)?;
                owned = c;
                &owned
            }
            _ => w,
        };
        let bf = |l: &Linear| -> anyhow::Result<DevBuf> {
            match l {
                Linear::Bf16 { data, .. } => Ok(self.gpu.upload(data)?),
                _ => anyhow::bail!("embedding and lm_head must be BF16"),
            }
        };
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            layers.push(DLayer {
                input_norm: self.f32s(&l.input_norm)?,
                post_norm: self.f32s(&l.post_norm)?,
                q_norm: l.q_norm.as_ref().map(|v| self.f32s(v)).transpose()?,
                k_norm: l.k_norm.as_ref().map(|v| self.f32s(v)).transpose()?,
                qkv: self.fuse_host(&[&l.q, &l.k, &l.v])?,
                o: self.fuse_host(&[&l.o])?,
                gate_up: self.fuse_host(&[&l.gate, &l.up])?,
                down: self.fuse_host(&[&l.down])?,
                k_scale: l.k_scale.unwrap_or(1.0),
                v_scale: l.v_scale.unwrap_or(1.0),
            });
        }
        Ok(DWeights {
            embed: bf(&w.embed)?,
            lm_head: w.lm_head.as_ref().map(bf).transpose()?,
            norm: self.f32s(&w.norm)?,
            layers,
        })
    }

    /// Synthesize `len` BF16 values of tensor `id` into `buf` at element offset `at`.
    #[allow(clippy::too_many_arguments)]
    fn synth_into(
        &self,
        buf: &DevBuf,
        at: usize,
        seed: u64,
        id: u64,
        len: usize,
        mean: f32,
        std: f32,
    ) -> anyhow::Result<()> {
        self.rt.launch(
            self.gpu,
            "rt_synth_bf16",
            grid1(len, 256),
            (256, 1, 1),
            0,
            &[
                KArg::Ptr(buf.ptr() + (at * 2) as u64),
                KArg::U64(len as u64),
                KArg::U64(weights::synth_stream_base(seed, id)),
                KArg::F32(mean),
                KArg::F32(std),
            ],
        )?;
        Ok(())
    }

    fn synth_norm(&self, seed: u64, id: u64, len: usize) -> anyhow::Result<DevBuf> {
        let tmp = self.gpu.alloc(len * 2)?;
        self.synth_into(&tmp, 0, seed, id, len, 1.0, weights::SYNTH_NORM_JITTER)?;
        let out = self.gpu.alloc(len * 4)?;
        self.rt.launch(
            self.gpu,
            "rt_bf16_to_f32",
            grid1(len, 256),
            (256, 1, 1),
            0,
            &[
                KArg::Ptr(tmp.ptr()),
                KArg::U64(len as u64),
                KArg::Ptr(out.ptr()),
            ],
        )?;
        self.gpu.sync()?;
        Ok(out)
    }

    /// A synthesized (possibly fused) linear: parts `(tensor id, rows)` stacked row-wise, all
    /// with K columns and standard deviation `std`, quantized on the GPU to `format` with one
    /// per-tensor scale from the amax over all parts.
    fn synth_linear(
        &self,
        seed: u64,
        parts: &[(u64, usize)],
        k: usize,
        std: f32,
        format: WeightFormat,
    ) -> anyhow::Result<DLinear> {
        let n: usize = parts.iter().map(|p| p.1).sum();
        let buf = self.gpu.alloc(n * k * 2)?;
        let mut row = 0;
        for (id, rows) in parts {
            self.synth_into(&buf, row * k, seed, *id, rows * k, 0.0, std)?;
            row += rows;
        }
        self.quantize_dev(buf, n, k, format)
    }

    /// Quantize a BF16 device weight `[n, k]` to `format` on the GPU (frees the BF16 copy).
    fn quantize_dev(
        &self,
        buf: DevBuf,
        n: usize,
        k: usize,
        format: WeightFormat,
    ) -> anyhow::Result<DLinear> {
        if format == WeightFormat::Bf16 {
            return Ok(DLinear::Bf16 { w: buf, n, k });
        }
        let len = n * k;
        let amax = self.gpu.alloc(4)?;
        self.gpu.memset(&amax, 0)?;
        self.rt.launch(
            self.gpu,
            "rt_amax_bf16",
            grid1(len, 256).min((self.gpu.sm_count * 16, 1, 1)),
            (256, 1, 1),
            0,
            &[
                KArg::Ptr(buf.ptr()),
                KArg::U64(len as u64),
                KArg::Ptr(amax.ptr()),
            ],
        )?;
        let scale = self.gpu.alloc(4)?;
        match format {
            WeightFormat::Fp8 => {
                let q = self.gpu.alloc(len)?;
                self.rt.launch(
                    self.gpu,
                    "rt_quant_fp8_tensor",
                    grid1(len, 256).min((self.gpu.sm_count * 16, 1, 1)),
                    (256, 1, 1),
                    0,
                    &[
                        KArg::Ptr(buf.ptr()),
                        KArg::U64(len as u64),
                        KArg::Ptr(amax.ptr()),
                        KArg::Ptr(q.ptr()),
                        KArg::Ptr(scale.ptr()),
                    ],
                )?;
                let s: Vec<f32> = self.gpu.download(&scale, 0, 1)?;
                drop(buf);
                Ok(DLinear::Fp8 {
                    w: q,
                    scales: self.gpu.upload(&vec![s[0]; n])?,
                    static_scale: None,
                    n,
                    k,
                })
            }
            WeightFormat::Nvfp4 => {
                anyhow::ensure!(k % 16 == 0, "NVFP4 needs K to be a multiple of 16; K = {k}");
                let packed = self.gpu.alloc(len / 2)?;
                let bsc = self.gpu.alloc(len / 16)?;
                self.rt.launch(
                    self.gpu,
                    "rt_quant_nvfp4",
                    grid1(len / 16, 256).min((self.gpu.sm_count * 16, 1, 1)),
                    (256, 1, 1),
                    0,
                    &[
                        KArg::Ptr(buf.ptr()),
                        KArg::I32(n as i32),
                        KArg::I32(k as i32),
                        KArg::Ptr(amax.ptr()),
                        KArg::Ptr(packed.ptr()),
                        KArg::Ptr(bsc.ptr()),
                        KArg::Ptr(scale.ptr()),
                    ],
                )?;
                drop(buf);
                let gs: Vec<f32> = self.gpu.download(&scale, 0, 1)?;
                self.repack_dev(&packed, &bsc, n, k, gs[0])
            }
            WeightFormat::Bf16 => unreachable!("handled above"),
        }
    }

    /// ModelOpt NVFP4 on the device → the W4A16 kernel layout (the GPU twin of
    /// [`crate::formats::w4a16_pack::repack`]).
    fn repack_dev(
        &self,
        packed: &DevBuf,
        bsc: &DevBuf,
        n: usize,
        k: usize,
        gs: f32,
    ) -> anyhow::Result<DLinear> {
        anyhow::ensure!(gs > 0.0 && gs.is_finite(), "weight_scale_2 = {gs}");
        let n_pad = n.div_ceil(16) * 16;
        let k_pad = k.div_ceil(128) * 128;
        let (strips, kt_n) = (n_pad / 16, k_pad / 64);
        let lut: Vec<u32> = w4a16_pack::slot_lut_flat();
        let lut = self.gpu.upload(&lut)?;
        let wq = self.gpu.alloc(n_pad * k_pad / 2)?;
        let sc = self.gpu.alloc(n_pad * k_pad / 16)?;
        let units = strips * kt_n * 32;
        self.rt.launch(
            self.gpu,
            "rt_w4a16_repack",
            grid1(units, 256).min((self.gpu.sm_count * 16, 1, 1)),
            (256, 1, 1),
            0,
            &[
                KArg::Ptr(packed.ptr()),
                KArg::Ptr(bsc.ptr()),
                KArg::I32(n as i32),
                KArg::I32(k as i32),
                KArg::I32(strips as i32),
                KArg::I32(kt_n as i32),
                KArg::Ptr(lut.ptr()),
                KArg::Ptr(wq.ptr()),
                KArg::Ptr(sc.ptr()),
            ],
        )?;
        self.gpu.sync()?;
        Ok(DLinear::W4 {
            dev: W4a16Device {
                wq,
                sc,
                n,
                k,
                strips,
                kt_n,
                out_scale: gs * w4a16_pack::EPILOGUE_POW2,
            },
        })
    }

    /// Fused linear from memory-mapped parts, written straight from the mapping into device
    /// buffers (no host copy of the weights); quantized on the GPU when `quantize` asks for a
    /// format other than the stored BF16.
    fn fuse_views(
        &self,
        parts: &[weights::LinearView<'_>],
        quantize: Option<WeightFormat>,
    ) -> anyhow::Result<DLinear> {
        use weights::LinearView as V;
        let (_, k) = parts[0].shape();
        anyhow::ensure!(
            parts
                .iter()
                .all(|p| p.shape().1 == k && p.format() == parts[0].format()),
            "fused projections differ in K or format"
        );
        let n: usize = parts.iter().map(|p| p.shape().0).sum();
        match &parts[0] {
            V::Bf16 { .. } => {
                let buf = self.gpu.alloc(n * k * 2)?;
                let mut at = 0;
                for p in parts {
                    if let V::Bf16 { data, .. } = p {
                        self.gpu.write(&buf, at, data)?;
                        at += data.len();
                    }
                }
                self.quantize_dev(buf, n, k, quantize.unwrap_or(WeightFormat::Bf16))
            }
            V::Fp8 { .. } => {
                let buf = self.gpu.alloc(n * k)?;
                let mut scales = Vec::with_capacity(n);
                let mut st: Option<f32> = None;
                let mut at = 0;
                for p in parts {
                    if let V::Fp8 {
                        n: pn,
                        data,
                        scales: s,
                        input_scale,
                        ..
                    } = p
                    {
                        self.gpu.write(&buf, at, data)?;
                        at += data.len();
                        for r in 0..*pn {
                            scales.push(if s.len() == 1 { s[0] } else { s[r] });
                        }
                        // vLLM runs a fused FP8 layer with the largest static input scale.
                        if let Some(x) = input_scale {
                            st = Some(st.map_or(*x, |y: f32| y.max(*x)));
                        }
                    }
                }
                Ok(DLinear::Fp8 {
                    w: buf,
                    scales: self.gpu.upload(&scales)?,
                    static_scale: st,
                    n,
                    k,
                })
            }
            V::Nvfp4 { global_scale, .. } => {
                let gs = *global_scale;
                let packed = self.gpu.alloc(n * k / 2)?;
                let bsc = self.gpu.alloc(n * k / 16)?;
                let (mut ap, mut ab) = (0, 0);
                for p in parts {
                    if let V::Nvfp4 {
                        packed: pk,
                        block_scales,
                        global_scale,
                        ..
                    } = p
                    {
                        anyhow::ensure!(
                            *global_scale == gs,
                            "NVFP4 projections that run fused (q/k/v, gate/up) have different weight_scale_2 ({global_scale} vs {gs}); rigbench's W4A16 GEMM needs one per fused layer, as ModelOpt exports them"
                        );
                        anyhow::ensure!(
                            !block_scales.iter().any(|b| b & 0x7F == 0x7F),
                            "an NVFP4 block scale is NaN"
                        );
                        self.gpu.write(&packed, ap, pk)?;
                        self.gpu.write(&bsc, ab, block_scales)?;
                        ap += pk.len();
                        ab += block_scales.len();
                    }
                }
                self.repack_dev(&packed, &bsc, n, k, gs)
            }
        }
    }

    /// Device weights from a memory-mapped checkpoint.
    fn checkpoint(
        &self,
        m: &weights::MappedCheckpoint,
        quantize: Option<WeightFormat>,
    ) -> anyhow::Result<DWeights> {
        use weights::{LinearRole as R, NormRole as N};
        let c = m.config().clone();
        let stored = m.format();
        if let Some(q) = quantize {
            if !(q == stored || stored == WeightFormat::Bf16) {
                return Err(RigError::flag(
                    "--quantize",
                    format!(
                        "the checkpoint is already {}; only BF16 weights can be quantized at load",
                        stored.id()
                    ),
                )
                .into());
            }
        }
        let q = quantize.filter(|q| *q != stored);
        let bf = |v: weights::LinearView<'_>| -> anyhow::Result<DevBuf> {
            match v {
                weights::LinearView::Bf16 { data, .. } => {
                    let b = self.gpu.alloc(data.len())?;
                    self.gpu.write(&b, 0, data)?;
                    Ok(b)
                }
                other => anyhow::bail!(
                    "the embedding and lm_head must be BF16 (found {})",
                    other.format().id()
                ),
            }
        };
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let (ks, vs) = m.kv_scales(i);
            layers.push(DLayer {
                input_norm: self.f32s(&m.norm(N::Input(i))?)?,
                post_norm: self.f32s(&m.norm(N::Post(i))?)?,
                q_norm: c
                    .has_qk_norm()
                    .then(|| m.norm(N::Q(i)).and_then(|v| self.f32s(&v)))
                    .transpose()?,
                k_norm: c
                    .has_qk_norm()
                    .then(|| m.norm(N::K(i)).and_then(|v| self.f32s(&v)))
                    .transpose()?,
                qkv: self.fuse_views(
                    &[m.linear(i, R::Q)?, m.linear(i, R::K)?, m.linear(i, R::V)?],
                    q,
                )?,
                o: self.fuse_views(&[m.linear(i, R::O)?], q)?,
                gate_up: self.fuse_views(&[m.linear(i, R::Gate)?, m.linear(i, R::Up)?], q)?,
                down: self.fuse_views(&[m.linear(i, R::Down)?], q)?,
                k_scale: ks.unwrap_or(1.0),
                v_scale: vs.unwrap_or(1.0),
            });
        }
        let embed = bf(m.embed()?)?;
        let lm_head = m.lm_head()?.map(bf).transpose()?;
        let norm = self.f32s(&m.norm(N::Final)?)?;
        self.gpu.sync()?;
        Ok(DWeights {
            embed,
            lm_head,
            norm,
            layers,
        })
    }

    fn synthetic(
        &self,
        c: &ModelConfig,
        seed: u64,
        quantize: Option<WeightFormat>,
    ) -> anyhow::Result<DWeights> {
        let fmt = quantize.unwrap_or(WeightFormat::Bf16);
        let h = c.hidden_size;
        let inv = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
        let emb_std = weights::SYNTH_LOGIT_STD / (h as f32).sqrt();
        let id = |layer: Option<usize>, j: u64| weights::synth_tensor_id(layer, j);
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let l = Some(i);
            layers.push(DLayer {
                input_norm: self.synth_norm(seed, id(l, 0), h)?,
                qkv: self.synth_linear(
                    seed,
                    &[
                        (id(l, 1), c.q_dim()),
                        (id(l, 2), c.kv_dim()),
                        (id(l, 3), c.kv_dim()),
                    ],
                    h,
                    inv(h),
                    fmt,
                )?,
                o: self.synth_linear(seed, &[(id(l, 4), h)], c.q_dim(), inv(c.q_dim()), fmt)?,
                q_norm: c
                    .has_qk_norm()
                    .then(|| self.synth_norm(seed, id(l, 5), c.head_dim))
                    .transpose()?,
                k_norm: c
                    .has_qk_norm()
                    .then(|| self.synth_norm(seed, id(l, 6), c.head_dim))
                    .transpose()?,
                post_norm: self.synth_norm(seed, id(l, 7), h)?,
                gate_up: self.synth_linear(
                    seed,
                    &[
                        (id(l, 8), c.intermediate_size),
                        (id(l, 9), c.intermediate_size),
                    ],
                    h,
                    inv(h),
                    fmt,
                )?,
                down: self.synth_linear(
                    seed,
                    &[(id(l, 10), h)],
                    c.intermediate_size,
                    inv(c.intermediate_size),
                    fmt,
                )?,
                k_scale: 1.0,
                v_scale: 1.0,
            });
        }
        let bf = |j: u64| -> anyhow::Result<DevBuf> {
            let b = self.gpu.alloc(c.vocab_size * h * 2)?;
            self.synth_into(&b, 0, seed, id(None, j), c.vocab_size * h, 0.0, emb_std)?;
            Ok(b)
        };
        let embed = bf(1)?;
        let lm_head = (!c.tie_word_embeddings).then(|| bf(3)).transpose()?;
        let norm = self.synth_norm(seed, id(None, 2), h)?;
        self.gpu.sync()?;
        Ok(DWeights {
            embed,
            lm_head,
            norm,
            layers,
        })
    }
}

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
        let bytes = 2 * c.num_layers * region;
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
    fn fp8_path_choice_keeps_outer_vector_unless_the_fallback_is_faster() {
        // H200, Qwen3-32B down at M = 1 (2026-11-30): 97.0 µs outer-vector, 50.3 µs FP32 + scale.
        assert!(!fp8_pick_in_gemm(97.0e-6, 50.3e-6));
        // M = 256 of the same run's qkv: outer-vector 43.2 µs against 49.2 µs.
        assert!(fp8_pick_in_gemm(43.2e-6, 49.2e-6));
        assert!(fp8_pick_in_gemm(40e-6, 40e-6), "a tie keeps outer-vector");
        assert!(fp8_pick_in_gemm(40e-6, f64::NAN));
        assert!(fp8_pick_in_gemm(40e-6, 0.0));
        assert!(fp8_paths_agree(0.0));
        assert!(fp8_paths_agree(FP8_PATHS_REL_L2));
        assert!(!fp8_paths_agree(2.0 * FP8_PATHS_REL_L2));
        assert!(!fp8_paths_agree(f64::NAN));
        assert!(!fp8_paths_agree(f64::INFINITY));
    }

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

    #[test]
    fn rel_l2_flags_nan_and_zero_reference() {
        let one = 0x3F80u16;
        assert_eq!(rel_l2_bf16(&[one], &[one]), 0.0);
        assert!(rel_l2_bf16(&[0x7FC0], &[one]).is_infinite());
        assert!(rel_l2_bf16(&[one], &[0]).is_infinite());
    }
}
