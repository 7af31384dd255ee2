//! Loading: open the device, compile the kernels, upload (or synthesize on the GPU) and quantize
//! the weights, fuse the projections engines fuse, allocate the activation buffers, then tune the
//! GEMMs and run the self-checks ([`CudaBackend::load_with`]).

use super::launchers;
use crate::gpu::DevPtr;
use std::collections::HashMap;

use anyhow::Context;

use super::gdn;
use super::moe_layer;
use super::{
    grid1, plan, predicted_weight_bytes, Bufs, CudaBackend, CudaLoadSpec, CudaOptions, CudaStats,
    DLayer, DLinear, DWeights, WeightSource, PART_CAP, PREFILL_HEAD_DIMS, RUNTIME_KERNELS,
    RUNTIME_SRC,
};
use crate::formats::nvfp4::Nvfp4Weight;
use crate::formats::w4a16_pack::{self, repack};
use crate::gemm::ops::{GemmModules, ModuleWants, PlanCache};
use crate::gemm::w4a16::W4a16Device;
use crate::gpu::cublaslt::Lt;
use crate::gpu::{DevBuf, Gpu, Module};
use crate::runtime::backend::DeviceMemory;
use crate::runtime::config::{ModelConfig, QuantRecipe, WeightFormat};
use crate::runtime::weights::{self, Linear, ModelWeights};
use crate::RigError;

impl CudaBackend {
    /// Open device `spec.device`, compile the kernels, load the weights and allocate the
    /// activation buffers, with the default [`CudaOptions`].
    ///
    /// # Errors
    /// No GPU or CUDA libraries ([`crate::gpu::GpuError::NoGpu`]), weights that do not fit the free
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
        check_attention_shape(&config)?;
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
        let quantize = resolve_quantize(spec.quantize, &config)?;
        let format = quantize.unwrap_or(stored);
        let need = match (config.is_hybrid() || config.is_moe(), spec.quantize) {
            (true, r) => {
                gdn::predicted_weight_bytes(&config, r.unwrap_or(QuantRecipe::Uniform(format)))
            }
            _ => predicted_weight_bytes(&config, format),
        };
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
        let lt = Lt::new(&gpu)?;
        let loader = Loader {
            gpu: &gpu,
            rt: &rt,
            recipe: spec.quantize,
        };
        let weights = match spec.weights {
            WeightSource::Host(w) => loader.host_weights(&w)?,
            WeightSource::Synthetic { config, seed } => {
                loader.synthetic(&config, seed, quantize)?
            }
            WeightSource::Checkpoint { dir, .. } => {
                let m = mapped.as_ref().context("checkpoint not mapped")?;
                loader
                    .checkpoint(m, quantize)
                    .with_context(|| format!("uploading {}", dir.display()))?
            }
        };
        let mods = build_gemm_modules(&gpu, spec.device, &weights)?;
        let mut kernel_sources = mods.sources.clone();
        let mut load_notes = mods.notes;
        // The routed experts in BF16 or FP8 run the grouped GEMVs of kernels/gemv.cu.
        let moe_gemv = weights.layers.iter().any(|l| {
            l.moe
                .as_ref()
                .is_some_and(|m| m.format != WeightFormat::Nvfp4)
        });
        let gemv = build_gemv(&gpu, &weights, opts.tune_gemv || moe_gemv, &mut load_notes);
        anyhow::ensure!(
            gemv.is_some() || !moe_gemv,
            "the routed experts need kernels/gemv.cu's grouped GEMV, which was not built: {}",
            load_notes.last().cloned().unwrap_or_default()
        );
        if let Some(m) = &gemv {
            kernel_sources.insert("kernels/gemv.cu".into(), m.source_sha256.clone());
        }
        kernel_sources.insert("kernels/runtime.cu".into(), rt.source_sha256.clone());
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
        let hy = if config.is_hybrid() {
            Some(gdn::HybridRt::new(&gpu, &config, t_max)?)
        } else {
            None
        };
        if let Some(h) = &hy {
            kernel_sources.insert("kernels/gdn.cu".into(), h.source_sha256().to_string());
        }
        let moe_rt = if config.is_moe() {
            Some(moe_layer::MoeRt::new(&gpu, &config, t_max)?)
        } else {
            None
        };
        if let Some(m) = &moe_rt {
            kernel_sources.insert("kernels/moe.cu".into(), m.source_sha256().to_string());
        }
        let mut me = CudaBackend {
            device: spec.device,
            gpu,
            lt,
            rt,
            w4m: mods.w4,
            w4v2: mods.w4v2,
            fp8q: mods.fp8q,
            kernel_sources,
            format: weights
                .layers
                .first()
                .map_or(WeightFormat::Bf16, |l| l.qkv.format()),
            config,
            weights,
            bufs,
            kv: None,
            plans: PlanCache::default(),
            w4_choice: HashMap::new(),
            graphs: HashMap::new(),
            graph_sizes: plan::graph_sizes(spec.max_num_seqs.min(t_max)),
            fp8_rowwise: true,
            fp8_choice: HashMap::new(),
            gemv,
            gemv_choice: HashMap::new(),
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
            notes: load_notes,
            prof: None,
            hy,
            moe: moe_rt,
            smp_uploaded: None,
        };
        me.add_load_notes(mapped.as_ref(), spec.quantize);
        if me.opts.fuse_shared_expert {
            me.fuse_shared_experts()?;
        }
        me.finish_load()?;
        Ok(me)
    }

    /// The load-time notes that depend on what was loaded: a hybrid's delta-rule chunk when it
    /// differs from the CPU reference's, a quantized lm_head run as BF16, the mixed recipe's
    /// BF16 lm_head.
    fn add_load_notes(
        &mut self,
        mapped: Option<&weights::MappedCheckpoint>,
        quantize: Option<QuantRecipe>,
    ) {
        if let Some(h) = &self.hy {
            if h.chunk() != crate::runtime::gdn::CHUNK {
                self.notes.push(format!(
                    "the chunked delta rule runs in chunks of {} rows on {} (its shared memory for {} does not fit); the CPU reference uses {}",
                    h.chunk(),
                    self.gpu.name,
                    crate::runtime::gdn::CHUNK,
                    crate::runtime::gdn::CHUNK
                ));
            }
        }
        if let Some(m) = mapped {
            if m.lm_head()
                .ok()
                .flatten()
                .is_some_and(|v| v.format() != WeightFormat::Bf16)
            {
                self.notes.push(
                    "the quantized lm_head runs dequantized to BF16 (its values exactly; the CUDA backend's lm_head GEMM is BF16 with FP32 logits)"
                        .into(),
                );
            }
        }
        if quantize == Some(QuantRecipe::Nvfp4Mixed) {
            self.notes.push(
                "--quantize nvfp4-mixed: the lm_head stays BF16 on the CUDA backend (the recipe's NVFP4 lm_head runs on the CPU backend only)"
                    .into(),
            );
        }
    }

    /// The load's last steps, after the weights and buffers: cuBLASLt plans and the FP8
    /// capability probe, the tuning of the W4A16 configurations and FP8 scaling paths, the
    /// tensor-core prefill self-check, the flash-decoding choice, the memory-pool trim and the
    /// memory accounting.
    ///
    /// # Errors
    /// A device failure, or no W4A16 configuration passing its check.
    fn finish_load(&mut self) -> anyhow::Result<()> {
        self.prepare_gemms()?;
        if self.has_format(WeightFormat::Nvfp4) {
            self.tune_w4()?;
        }
        if self.has_format(WeightFormat::Fp8) && self.opts.tune_fp8 {
            self.tune_fp8()?;
        }
        // After the FP8 scaling paths: the GEMV is held to, and timed against, the path chosen.
        if self.opts.tune_gemv {
            self.tune_gemv()?;
        }
        if self.opts.tc_prefill && PREFILL_HEAD_DIMS.contains(&self.config.head_dim) {
            match super::self_check::prefill_matches_decode(self) {
                Ok(None) => {}
                Ok(Some(why)) => {
                    self.opts.tc_prefill = false;
                    self.notes.push(format!(
                        "tensor-core prefill attention disabled: its self-check against the decode kernel failed ({why})"
                    ));
                }
                Err(e) => {
                    self.opts.tc_prefill = false;
                    self.notes
                        .push(format!("tensor-core prefill attention disabled: {e:#}"));
                }
            }
        } else if self.opts.tc_prefill {
            self.opts.tc_prefill = false;
            self.notes.push(format!(
                "tensor-core prefill attention is built for head_dim {PREFILL_HEAD_DIMS:?}; head_dim {} uses the CUDA-core kernel",
                self.config.head_dim
            ));
        }
        if self.config.is_hybrid() && !self.opts.flash_decode_hybrid {
            // CudaOptions::flash_decode_hybrid off: the hybrids keep their CUDA-core kernels.
            self.opts.flash_decode = false;
        }
        self.prepare_flash_decode();
        // Freed load-time buffers (BF16 weights before quantization, tuning inputs) stay in the
        // stream-ordered pool until trimmed, and would count against the KV cache.
        if let Err(e) = self.gpu.trim_memory_pool() {
            self.gpu.sync()?;
            self.notes.push(format!(
                "the stream-ordered memory pool could not be trimmed after load ({e}); the KV cache may be smaller by what it holds"
            ));
        }
        let (free_after, _) = self.gpu.mem_info()?;
        self.memory.free_after_load = free_after as u64;
        self.memory.weights = self.weights.bytes() as u64;
        self.memory.activations = (self.bufs.bytes()
            + self.hy.as_ref().map_or(0, |h| h.buffer_bytes())
            + self.moe.as_ref().map_or(0, |m| m.bytes())) as u64;
        self.memory.workspace = self
            .memory
            .free_before_load
            .saturating_sub(free_after as u64)
            .saturating_sub(self.memory.weights + self.memory.activations);
        Ok(())
    }
}

/// Refuse a model the CUDA kernels cannot run: a Gated-DeltaNet shape outside the hybrid
/// kernels ([`gdn::unsupported_shape`]), or a dense model whose attention shape the decode
/// kernels do not cover.
///
/// # Errors
/// The shape, in words.
fn check_attention_shape(config: &ModelConfig) -> anyhow::Result<()> {
    if let Some(m) = &config.moe {
        if let Some(why) = crate::gemm::moe::unsupported(m.num_experts, m.top_k) {
            anyhow::bail!("{why}");
        }
    }
    if let Some(why) = gdn::unsupported_shape(config) {
        anyhow::bail!(why);
    }
    if !config.is_hybrid() {
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
    Ok(())
}

/// The format `--quantize` asks the linears to be quantized to at load (`None`: as stored): a
/// uniform recipe's format, or for the hybrids a mixed recipe's format of the gate projection.
///
/// # Errors
/// A mixed recipe for a model that is not a hybrid (`--quantize` named).
fn resolve_quantize(
    recipe: Option<QuantRecipe>,
    config: &ModelConfig,
) -> anyhow::Result<Option<WeightFormat>> {
    Ok(match recipe {
        None => None,
        Some(QuantRecipe::Uniform(f)) => Some(f),
        Some(r) if config.is_hybrid() || config.is_moe() => {
            Some(r.format_for(weights::LinearRole::Gate))
        }
        Some(r) => {
            return Err(RigError::flag(
                "--quantize",
                format!(
                    "{} is implemented by the CUDA backend for the Qwen3.5 / 3.6 hybrids and the mixtures of experts only",
                    r.id()
                ),
            )
            .into())
        }
    })
}

/// The GEMM layer's modules for these weights ([`GemmModules::build`], the kernel bench's
/// builder): the W4A16 kernels (the default flavour of `kernels/w4a16.cu`, `w4a16_v2.cu`, and
/// the wgmma kernel where the card runs it) when any linear is NVFP4, `kernels/fp8_quant.cu`
/// when any is FP8. The kernel bench's `RIGBENCH_W4A16_FLAVORS` is not the runtime's to follow.
///
/// # Errors
/// A module the weights need failed to build.
fn build_gemm_modules(gpu: &Gpu, device: usize, w: &DWeights) -> anyhow::Result<GemmModules> {
    let formats = w.linear_formats();
    let mods = GemmModules::build(
        gpu,
        &ModuleWants {
            w4: formats.contains(&WeightFormat::Nvfp4),
            w4_flavors: if formats.contains(&WeightFormat::Nvfp4) {
                vec![crate::gemm::W4A16_DEFAULT_FLAVOR]
            } else {
                Vec::new()
            },
            fp8: formats.contains(&WeightFormat::Fp8),
            device,
        },
    );
    let w4_missing = formats.contains(&WeightFormat::Nvfp4)
        && (mods.w4v2.is_none() || mods.w4.iter().all(|m| m.is_wg()));
    let fp8_missing = formats.contains(&WeightFormat::Fp8) && mods.fp8q.is_none();
    anyhow::ensure!(
        !w4_missing && !fp8_missing,
        "building the GEMM kernels: {}",
        mods.failures.join("; ")
    );
    Ok(mods)
}

/// `kernels/gemv.cu`, the GEMM layer's small-M GEMVs ([`crate::gemm::gemv`]), when `want`
/// and the card has the mma they use (BF16 m16n8k16 from sm_80, E4M3 m16n8k32 from sm_89): the
/// lm_head is BF16 in every format, so any model may use it. A build failure is a note (the
/// linears keep cuBLASLt), never a load failure.
fn build_gemv(gpu: &Gpu, w: &DWeights, want: bool, notes: &mut Vec<String>) -> Option<Module> {
    if !want {
        return None;
    }
    let cc = gpu.cc;
    let fp8 = w.linear_formats().contains(&WeightFormat::Fp8);
    if (cc.major, cc.minor) < (8, 0) || (fp8 && (cc.major, cc.minor) < (8, 9)) {
        notes.push(format!(
            "kernels/gemv.cu not built: it needs sm_80 (BF16) / sm_89 (FP8) tensor-core mma, the card is {cc}; cuBLASLt at every M"
        ));
        return None;
    }
    let names = crate::gemm::gemv::kernel_names();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    match gpu.compile_with("gemv", crate::gemm::gemv::SRC, &refs, &[]) {
        Ok(m) => {
            notes.push(format!("kernels/gemv.cu for {}: {}", m.arch, m.how_built()));
            Some(m)
        }
        Err(e) => {
            notes.push(format!(
                "kernels/gemv.cu failed to build ({e}); cuBLASLt at every M"
            ));
            None
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn alloc_bufs(
    gpu: &Gpu,
    c: &ModelConfig,
    w: &DWeights,
    t: usize,
    rows: usize,
    max_model_len: usize,
    block_size: usize,
) -> anyhow::Result<Bufs> {
    let (h, i) = (c.hidden_size, c.intermediate_size);
    let qkvd = gdn::max_fused_rows(c);
    let maxk = gdn::max_k(c);
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
        quant_amax: gpu.upload(&vec![0u32; t])?,
        quant_arrivals: gpu.upload(&vec![0u32; t])?,
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
pub(super) struct Loader<'a> {
    pub(super) gpu: &'a Gpu,
    pub(super) rt: &'a Module,
    /// `--quantize` (hybrids take their per-role formats from it).
    pub(super) recipe: Option<QuantRecipe>,
}

impl Loader<'_> {
    pub(super) fn f32s(&self, v: &[f32]) -> anyhow::Result<DevBuf> {
        Ok(self.gpu.upload(v)?)
    }

    /// Fuse host linears row-wise and upload in their (shared) format.
    pub(super) fn fuse_host(&self, parts: &[&Linear]) -> anyhow::Result<DLinear> {
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

    pub(super) fn host_weights(&self, w: &ModelWeights) -> anyhow::Result<DWeights> {
        let owned;
        let w = match self.recipe {
            Some(r) if r != QuantRecipe::Uniform(w.linear_format()) => {
                let mut c = w.clone();
                c.quantize_recipe(r)?;
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
            if w.config.is_hybrid() {
                layers.push(self.hybrid_host_layer(l)?);
                continue;
            }
            let (gate_up, down, moe) = self.host_mlp(l)?;
            layers.push(DLayer {
                input_norm: self.f32s(&l.input_norm)?,
                post_norm: self.f32s(&l.post_norm)?,
                q_norm: l.q_norm.as_ref().map(|v| self.f32s(v)).transpose()?,
                k_norm: l.k_norm.as_ref().map(|v| self.f32s(v)).transpose()?,
                qkv: self.fuse_host(&[&l.q, &l.k, &l.v])?,
                o: self.fuse_host(&[&l.o])?,
                gate_up,
                down,
                k_scale: l.k_scale.unwrap_or(1.0),
                v_scale: l.v_scale.unwrap_or(1.0),
                gdn: None,
                moe,
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
    pub(super) fn synth_into(
        &self,
        buf: &DevBuf,
        at: usize,
        seed: u64,
        id: u64,
        len: usize,
        mean: f32,
        std: f32,
    ) -> anyhow::Result<()> {
        launchers::rt::rt_synth_bf16(
            self.rt,
            self.gpu,
            grid1(len, 256),
            (256, 1, 1),
            0,
            DevPtr::at(buf.ptr() + (at * 2) as u64),
            len,
            weights::synth_stream_base(seed, id),
            mean,
            std,
        )?;
        Ok(())
    }

    pub(super) fn synth_norm(&self, seed: u64, id: u64, len: usize) -> anyhow::Result<DevBuf> {
        let tmp = self.gpu.alloc(len * 2)?;
        self.synth_into(&tmp, 0, seed, id, len, 1.0, weights::SYNTH_NORM_JITTER)?;
        let out = self.gpu.alloc(len * 4)?;
        launchers::rt::rt_bf16_to_f32(
            self.rt,
            self.gpu,
            grid1(len, 256),
            (256, 1, 1),
            0,
            &tmp,
            len,
            &out,
        )?;
        self.gpu.sync()?;
        Ok(out)
    }

    /// A synthesized (possibly fused) linear: parts `(tensor id, rows)` stacked row-wise, all
    /// with K columns and standard deviation `std`, quantized on the GPU to `format` with one
    /// per-tensor scale from the amax over all parts.
    pub(super) fn synth_linear(
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
    pub(super) fn quantize_dev(
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
        launchers::rt::rt_amax_bf16(
            self.rt,
            self.gpu,
            grid1(len, 256).min((self.gpu.sm_count * 16, 1, 1)),
            (256, 1, 1),
            0,
            &buf,
            len,
            &amax,
        )?;
        let scale = self.gpu.alloc(4)?;
        match format {
            WeightFormat::Fp8 => {
                let q = self.gpu.alloc(len)?;
                launchers::rt::rt_quant_fp8_tensor(
                    self.rt,
                    self.gpu,
                    grid1(len, 256).min((self.gpu.sm_count * 16, 1, 1)),
                    (256, 1, 1),
                    0,
                    &buf,
                    len,
                    &amax,
                    &q,
                    &scale,
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
                launchers::rt::rt_quant_nvfp4(
                    self.rt,
                    self.gpu,
                    grid1(len / 16, 256).min((self.gpu.sm_count * 16, 1, 1)),
                    (256, 1, 1),
                    0,
                    &buf,
                    n,
                    k,
                    &amax,
                    &packed,
                    &bsc,
                    &scale,
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
    pub(super) fn repack_dev(
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
        launchers::rt::rt_w4a16_repack(
            self.rt,
            self.gpu,
            grid1(units, 256).min((self.gpu.sm_count * 16, 1, 1)),
            (256, 1, 1),
            0,
            packed,
            bsc,
            n,
            k,
            strips,
            kt_n,
            &lut,
            &wq,
            &sc,
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
    pub(super) fn fuse_views(
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
    pub(super) fn checkpoint(
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
            if c.is_hybrid() {
                layers.push(self.hybrid_checkpoint_layer(m, i, self.recipe)?);
                continue;
            }
            let (ks, vs) = m.kv_scales(i);
            let (gate_up, down, moe) = match m.moe_weights(i)? {
                Some(mw) => self.moe_from_host(&mw, self.recipe)?,
                None => (
                    self.fuse_views(&[m.linear(i, R::Gate)?, m.linear(i, R::Up)?], q)?,
                    self.fuse_views(&[m.linear(i, R::Down)?], q)?,
                    None,
                ),
            };
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
                gate_up,
                down,
                k_scale: ks.unwrap_or(1.0),
                v_scale: vs.unwrap_or(1.0),
                gdn: None,
                moe,
            });
        }
        let embed = bf(m.embed()?)?;
        // A quantized lm_head (ModelOpt's mixed recipes) runs dequantized to BF16.
        let lm_head = match m.lm_head()? {
            Some(v) if v.format() != WeightFormat::Bf16 => {
                let vals = v.to_linear()?.dequantize();
                Some(self.gpu.upload(&crate::formats::to_bf16_bits(&vals))?)
            }
            other => other.map(bf).transpose()?,
        };
        let norm = self.f32s(&m.norm(N::Final)?)?;
        self.gpu.sync()?;
        Ok(DWeights {
            embed,
            lm_head,
            norm,
            layers,
        })
    }

    pub(super) fn synthetic(
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
            if c.is_hybrid() {
                let recipe = self.recipe.unwrap_or(QuantRecipe::Uniform(fmt));
                layers.push(self.hybrid_synth_layer(c, seed, i, recipe)?);
                continue;
            }
            let l = Some(i);
            let recipe = self.recipe.unwrap_or(QuantRecipe::Uniform(fmt));
            let fmt = recipe.format_for(weights::LinearRole::Q);
            let (gate_up, down, moe) = if c.is_sparse_layer(i) {
                self.synth_moe(c, seed, i, recipe)?
            } else {
                (
                    self.synth_linear(
                        seed,
                        &[
                            (id(l, 8), c.intermediate_size),
                            (id(l, 9), c.intermediate_size),
                        ],
                        h,
                        inv(h),
                        fmt,
                    )?,
                    self.synth_linear(
                        seed,
                        &[(id(l, 10), h)],
                        c.intermediate_size,
                        inv(c.intermediate_size),
                        fmt,
                    )?,
                    None,
                )
            };
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
                gate_up,
                down,
                k_scale: 1.0,
                v_scale: 1.0,
                gdn: None,
                moe,
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

impl CudaBackend {
    /// Raise the flash-decoding kernels' shared-memory limit where they need more than 48 KiB,
    /// then check them against the CPU reference ([`CudaBackend::flash_decode_self_check`]); a
    /// failure turns them off with a note (the CUDA-core kernel runs instead).
    fn prepare_flash_decode(&mut self) {
        let hd = self.config.head_dim;
        if !self.opts.flash_decode || !super::decode_attn::FLASH_HEAD_DIMS.contains(&hd) {
            return;
        }
        for (fp8, elem) in [(false, 2), (true, 1)] {
            let smem = super::decode_attn::flash_smem_bytes(hd, elem);
            if smem > 48 << 10 && smem <= self.gpu.max_smem_optin {
                let name = super::decode_attn::flash_kernel_name(fp8, hd);
                if let Err(e) = self.rt.set_max_dynamic_smem(&name, smem) {
                    self.opts.flash_decode = false;
                    self.notes.push(format!(
                        "flash-decoding attention disabled: {name} cannot have {smem} bytes of shared memory ({e})"
                    ));
                    return;
                }
            }
        }
        let why = match self.flash_decode_self_check() {
            Ok(None) => return,
            Ok(Some(why)) => format!("its self-check against the CPU reference failed ({why})"),
            Err(e) => format!("{e:#}"),
        };
        self.opts.flash_decode = false;
        self.notes.push(format!(
            "flash-decoding attention disabled, the CUDA-core decode kernel runs instead: {why}"
        ));
    }
}
