//! The CUDA backend's Qwen3.5 / 3.6 hybrids: Gated-DeltaNet layers and the gated, partially
//! rotated attention layers (`kernels/gdn.cu`, compiled by NVRTC only for hybrid models).
//!
//! A Gated-DeltaNet layer reuses the slots of a [`DLayer`]: `qkv` holds the fused
//! `[in_proj_qkv; in_proj_z]` GEMM, `o` holds `out_proj`, the MLP is as in every layer, and
//! [`GdnDevLayer`] the fused `[in_proj_a; in_proj_b]` (BF16 as exported) and the small
//! parameters. Per forward pass: the two GEMMs, the causal convolution with its rolling state
//! (`gdn_conv_silu`), the delta rule (`gdn_recurrent` for segments decoded or verified token by
//! token, `gdn_chunked` for prefill chunks; the same rule as the CPU backend's `form_for`), the
//! gated RMSNorm (`gdn_gated_norm`), then `out_proj`. The recurrent state (FP32) and the
//! convolution state (BF16) live in device memory, one slot per sequence that may run plus one
//! that receives the padding rows of CUDA-graph batches.
//!
//! The gated attention layers run `hy_qk_norm_rope_kv` (query and output gate interleaved per
//! head in `q_proj`'s rows; RoPE over the first `rotary_dim` dimensions), the attention of
//! `kernels/runtime.cu` for head_dim ≤ 128 or `hy_attn_decode_*` (CUDA cores, head_dim ≤ 256)
//! with `rt_attn_combine`, then `hy_attn_gate`.
//!
//! Limits: no rollback of the recurrent state (n-gram speculation is refused on hybrids here;
//! the CPU backend implements it); head_dim ≤ 256, key head dim ≤ 128 and a multiple of 4,
//! value head dim ≤ 128 and a multiple of 8, convolution width ≤ 8.

use super::launchers;
use crate::gpu::{dim, DevPtr};
use anyhow::Context;

use super::load::Loader;
use super::{grid1, plan, CudaBackend, DLayer, DLinear, LinRef, ATT_THREADS};
use crate::gpu::{DevBuf, Module};
use crate::runtime::backend::ForwardBatch;
use crate::runtime::config::{KvCacheDtype, ModelConfig, QuantRecipe, WeightFormat};
use crate::runtime::gdn::GdnDims;
use crate::runtime::hybrid::LayerType;
use crate::runtime::weights::{self, LinearRole as R, NormRole as N};

/// Source of the hybrid kernels.
pub const GDN_SRC: &str = include_str!("../../../../kernels/gdn.cu");

/// Every kernel in kernels/gdn.cu.
pub const GDN_KERNELS: &[&str] = &[
    "gdn_conv_silu",
    "gdn_recurrent",
    "gdn_chunked",
    "gdn_gated_norm",
    "hy_qk_norm_rope_kv",
    "hy_attn_gate",
    "hy_attn_decode_bf16",
    "hy_attn_decode_fp8",
];

/// Threads of `gdn_chunked`.
const CHUNKED_THREADS: u32 = 512;
/// Threads of `hy_attn_decode_*` (`HY_THREADS`).
const HY_THREADS: u32 = 128;
/// Largest head_dim of the gated attention kernels (`HY_MAX_HD`).
pub const HY_MAX_HEAD_DIM: usize = 256;

/// Why this hybrid's shape does not fit the kernels, or `None` when it does.
pub fn unsupported_shape(c: &ModelConfig) -> Option<String> {
    let h = c.hybrid.as_ref()?;
    let g = c.num_heads / c.num_kv_heads.max(1);
    let mut why = Vec::new();
    if c.head_dim % 16 != 0 || c.head_dim > HY_MAX_HEAD_DIM {
        why.push(format!(
            "head_dim {} (a multiple of 16, at most {HY_MAX_HEAD_DIM})",
            c.head_dim
        ));
    }
    if g > 16 || g * c.head_dim > 2048 {
        why.push(format!(
            "{g} query heads per KV head of {} (at most 16, and (heads per KV head) × head_dim ≤ 2048)",
            c.head_dim
        ));
    }
    if h.key_head_dim % 4 != 0 || h.key_head_dim > 128 {
        why.push(format!(
            "linear_key_head_dim {} (a multiple of 4, at most 128)",
            h.key_head_dim
        ));
    }
    if h.value_head_dim % 8 != 0 || h.value_head_dim > 128 {
        why.push(format!(
            "linear_value_head_dim {} (a multiple of 8, at most 128)",
            h.value_head_dim
        ));
    }
    if h.conv_kernel < 1 || h.conv_kernel > 8 {
        why.push(format!("linear_conv_kernel_dim {} (1 to 8)", h.conv_kernel));
    }
    if c.rotary_dim > c.head_dim {
        why.push(format!("rotary_dim {} > head_dim", c.rotary_dim));
    }
    (!why.is_empty()).then(|| {
        format!(
            "the CUDA backend's hybrid kernels do not fit this model: {}",
            why.join("; ")
        )
    })
}

/// Rows of the largest fused first GEMM of any layer (`[q; k; v]` of a dense layer,
/// `[q·gate; k; v]` of a gated attention layer, `[in_proj_qkv; in_proj_z]` of a
/// Gated-DeltaNet layer): activation buffers are sized for it.
pub fn max_fused_rows(c: &ModelConfig) -> usize {
    let attn = c.q_proj_rows() + 2 * c.kv_dim();
    match &c.hybrid {
        Some(h) => attn.max(h.conv_dim() + h.value_dim()),
        None => attn,
    }
}

/// Largest K of any decoder linear (sizes the GEMM input buffers).
pub fn max_k(c: &ModelConfig) -> usize {
    let base = c.hidden_size.max(c.q_dim()).max(c.intermediate_size);
    match &c.hybrid {
        Some(h) => base.max(h.value_dim()),
        None => base,
    }
}

/// Bytes the CUDA backend's weights take for a hybrid `c` quantized by `recipe` (linears in
/// their formats, NVFP4 in the kernel layout with padding; BF16 embedding and lm_head; small
/// parameters in f32).
pub fn predicted_weight_bytes(c: &ModelConfig, recipe: QuantRecipe) -> u64 {
    let lin = |f: WeightFormat, n: u64, k: u64| -> u64 {
        match f {
            WeightFormat::Bf16 => 2 * n * k,
            WeightFormat::Fp8 => n * k + 4 * n,
            WeightFormat::Nvfp4 => {
                let np = n.div_ceil(16) * 16;
                let kp = k.div_ceil(128) * 128;
                np * kp / 2 + np * kp / 16
            }
        }
    };
    let h = c.hidden_size as u64;
    let mut total = 0u64;
    for i in 0..c.num_layers {
        for r in R::of_layer(c, i) {
            let (n, k) = r.shape(c);
            total += lin(recipe.format_for(*r), n as u64, k as u64);
        }
        total += match (&c.hybrid, c.layer_type(i)) {
            (Some(hy), LayerType::Gdn) => {
                4 * (2 * h
                    + (hy.conv_dim() * hy.conv_kernel + 2 * hy.num_value_heads + hy.value_head_dim)
                        as u64)
            }
            _ => 8 * h + 8 * c.head_dim as u64,
        };
    }
    let heads = if c.tie_word_embeddings { 1 } else { 2 };
    total + heads * 2 * c.vocab_size as u64 * h + 4 * h
}

/// A Gated-DeltaNet layer's device tensors other than the `DLayer` linears.
pub(super) struct GdnDevLayer {
    /// Fused `[in_proj_a; in_proj_b]`, `[2·value_heads, H]`.
    pub(super) ab: DLinear,
    conv_w: DevBuf,
    a_log: DevBuf,
    dt_bias: DevBuf,
    norm: DevBuf,
}

impl GdnDevLayer {
    pub(super) fn bytes(&self) -> usize {
        self.ab.bytes()
            + self.conv_w.bytes()
            + self.a_log.bytes()
            + self.dt_bias.bytes()
            + self.norm.bytes()
    }
}

/// One segment of the Gated-DeltaNet kernels: first token, tokens, state slot, reset.
pub type GdnSeg = [i32; 4];

/// The per-forward Gated-DeltaNet metadata: every segment (the convolution) and the segments of
/// each delta-rule form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GdnPlan {
    /// All segments, in batch order (padding rows last).
    pub all: Vec<GdnSeg>,
    /// Segments of the recurrent form (one token, or verification of drafts).
    pub recurrent: Vec<GdnSeg>,
    /// Segments of the chunked form (prefill chunks: several tokens, at most one logit row).
    pub chunked: Vec<GdnSeg>,
}

/// Plan the Gated-DeltaNet segments of `batch`: each segment's slot must exist and be used
/// once, and must continue where the slot's last segment ended (`positions`, updated) or start
/// at 0 (reset). With `pad_to = Some(b)` (a CUDA-graph decode batch) the padding rows become
/// one-token segments on the trash slot (index `positions.len()`), reset every time.
///
/// # Errors
/// A slot out of range or used twice, or a segment that does not continue its slot (the CUDA
/// backend keeps no snapshot to roll a state back to).
pub fn gdn_plan(
    batch: &ForwardBatch,
    pad_to: Option<usize>,
    positions: &mut [usize],
) -> anyhow::Result<GdnPlan> {
    let slots = positions.len();
    let mut seen = vec![false; slots];
    let mut p = GdnPlan::default();
    for s in &batch.seqs {
        let slot = s.state_slot as usize;
        anyhow::ensure!(
            slot < slots,
            "state slot {slot} of a batch segment; the backend has {slots} (init_state_slots)"
        );
        anyhow::ensure!(
            !seen[slot],
            "two segments of one batch use state slot {slot}"
        );
        seen[slot] = true;
        anyhow::ensure!(
            s.first_pos == 0 || s.first_pos == positions[slot],
            "state slot {slot} holds the state after {} tokens; a segment at position {} cannot continue it (the CUDA backend does not roll states back)",
            positions[slot],
            s.first_pos
        );
        let seg = [
            s.start as i32,
            s.len as i32,
            slot as i32,
            (s.first_pos == 0) as i32,
        ];
        p.all.push(seg);
        if s.len > 1 && s.num_logits <= 1 {
            p.chunked.push(seg);
        } else {
            p.recurrent.push(seg);
        }
    }
    if let Some(b) = pad_to {
        for t in batch.token_ids.len()..b {
            let seg = [t as i32, 1, slots as i32, 1];
            p.all.push(seg);
            p.recurrent.push(seg);
        }
    }
    for s in &batch.seqs {
        positions[s.state_slot as usize] = s.first_pos + s.len;
    }
    Ok(p)
}

/// Device state slots of every Gated-DeltaNet layer.
struct States {
    conv: DevBuf,
    ssm: DevBuf,
    /// Slots in use by sequences (the trash slot is one more).
    slots: usize,
    /// Tokens each slot has absorbed.
    positions: Vec<usize>,
}

/// The hybrid part of a [`CudaBackend`].
pub(super) struct HybridRt {
    module: Module,
    dims: GdnDims,
    layer_types: Vec<LayerType>,
    chunk: usize,
    chunk_smem: u32,
    mixed: DevBuf,
    core: DevBuf,
    normed: DevBuf,
    ab: DevBuf,
    /// `[all | recurrent | chunked]` int4 segments, `seg_cap` of each.
    segs: DevBuf,
    seg_cap: usize,
    counts: (usize, usize, usize),
    states: Option<States>,
}

impl HybridRt {
    /// SHA-256 of `kernels/gdn.cu` as built.
    pub(super) fn source_sha256(&self) -> &str {
        &self.module.source_sha256
    }

    /// Compile `kernels/gdn.cu` and allocate the activation buffers for `t_max` tokens.
    ///
    /// # Errors
    /// A shape the kernels do not fit, the compile, or an allocation.
    pub(super) fn new(
        gpu: &crate::gpu::Gpu,
        c: &ModelConfig,
        t_max: usize,
    ) -> anyhow::Result<Self> {
        if let Some(why) = unsupported_shape(c) {
            anyhow::bail!(why);
        }
        let h = c.hybrid.as_ref().context("not a hybrid")?;
        let dims = GdnDims::from(h);
        let module = gpu
            .compile("gdn", GDN_SRC, GDN_KERNELS)
            .context("building kernels/gdn.cu")?;
        // The chunk of the chunked form: 64 rows (the CPU's) when its shared memory fits the
        // card, else 32 (rounding differs, the state is the same function).
        let smem = |chunk: usize| -> usize {
            4 * (3 * chunk * dims.dk
                + chunk * dims.dv
                + chunk * chunk
                + 2 * chunk
                + dims.dk * dims.dv)
        };
        let chunk = if smem(64) <= gpu.max_smem_optin as usize {
            64
        } else {
            32
        };
        let chunk_smem = smem(chunk) as u32;
        anyhow::ensure!(
            chunk_smem <= gpu.max_smem_optin,
            "the chunked delta rule needs {chunk_smem} bytes of shared memory; {} allows {}",
            gpu.name,
            gpu.max_smem_optin
        );
        if chunk_smem > 48 << 10 {
            module.set_max_dynamic_smem("gdn_chunked", chunk_smem)?;
        }
        let t = t_max.max(1);
        let seg_cap = t + 1;
        Ok(HybridRt {
            module,
            dims,
            layer_types: (0..c.num_layers).map(|i| c.layer_type(i)).collect(),
            chunk,
            chunk_smem,
            mixed: gpu.alloc(t * dims.conv_dim() * 2)?,
            core: gpu.alloc(t * dims.value_dim() * 2)?,
            normed: gpu.alloc(t * dims.value_dim() * 2)?,
            ab: gpu.alloc(t * 2 * dims.nv * 2)?,
            segs: gpu.alloc(3 * seg_cap * 16)?,
            seg_cap,
            counts: (0, 0, 0),
            states: None,
        })
    }

    /// Bytes of the activation buffers.
    pub(super) fn buffer_bytes(&self) -> usize {
        self.mixed.bytes()
            + self.core.bytes()
            + self.normed.bytes()
            + self.ab.bytes()
            + self.segs.bytes()
    }

    /// Rows of the chunked form per chunk on this card.
    pub(super) fn chunk(&self) -> usize {
        self.chunk
    }

    fn gdn_index(&self, layer: usize) -> usize {
        self.layer_types[..layer]
            .iter()
            .filter(|t| **t == LayerType::Gdn)
            .count()
    }
}

/// Allocate `n` state slots (plus the trash slot) for every Gated-DeltaNet layer, zeroed.
pub(super) fn init_state_slots(b: &mut CudaBackend, n: usize) -> anyhow::Result<()> {
    let layers = b.config.num_gdn_layers();
    let Some(hy) = b.hy.as_mut() else {
        return Ok(());
    };
    b.gpu.bind()?;
    b.graphs.clear();
    hy.states = None;
    let d = hy.dims;
    let per_conv = d.conv_state_len() * 2;
    let per_ssm = d.ssm_state_len() * 4;
    let (conv_bytes, ssm_bytes) = (layers * (n + 1) * per_conv, layers * (n + 1) * per_ssm);
    let (free, _) = b.gpu.mem_info()?;
    let alloc = |bytes: usize| {
        b.gpu.alloc(bytes).map_err(|e| {
            anyhow::anyhow!(
                "allocating the Gated-DeltaNet state ({} for {n} sequences + 1 padding slot) failed with {} free: {e}",
                crate::output::table::human_bytes((conv_bytes + ssm_bytes) as u64),
                crate::output::table::human_bytes(free as u64)
            )
        })
    };
    let conv = alloc(conv_bytes)?;
    let ssm = alloc(ssm_bytes)?;
    b.gpu.memset(&conv, 0)?;
    b.gpu.memset(&ssm, 0)?;
    b.gpu.sync()?;
    hy.states = Some(States {
        conv,
        ssm,
        slots: n,
        positions: vec![0; n],
    });
    Ok(())
}

/// Bytes one batch-1 decode step of a hybrid must move for each op its profile names, where
/// the op has a byte floor (the hybrid part of `CudaBackend::op_bytes`): the mixers' GEMMs
/// (weights, the layers that run them), and the Gated-DeltaNet state, read and written once per
/// decoded token: the causal convolution's rolling state (BF16) with its weights, and the
/// delta rule's recurrent state (FP32), over every Gated-DeltaNet layer.
pub(super) fn op_bytes(b: &CudaBackend) -> Vec<(&'static str, u64)> {
    let Some(hy) = &b.hy else {
        return Vec::new();
    };
    let d = hy.dims;
    let mut qkvz = 0u64;
    let mut q_gate = 0u64;
    let mut ab = 0u64;
    let mut conv_w = 0u64;
    for l in &b.weights.layers {
        match &l.gdn {
            Some(g) => {
                qkvz += l.qkv.bytes() as u64;
                ab += g.ab.bytes() as u64;
                conv_w += g.conv_w.bytes() as u64;
            }
            None => q_gate += l.qkv.bytes() as u64,
        }
    }
    let layers = b.config.num_gdn_layers() as u64;
    let conv_state = layers * d.conv_state_len() as u64 * 2;
    let ssm_state = layers * d.ssm_state_len() as u64 * 4;
    vec![
        ("GEMM in_proj_qkv + in_proj_z", qkvz),
        ("GEMM qkv (query and gate)", q_gate),
        ("GEMM in_proj_a + in_proj_b", ab),
        ("Gated-DeltaNet causal conv", 2 * conv_state + conv_w),
        ("Gated-DeltaNet delta rule", 2 * ssm_state),
    ]
}

/// A slot's state as [`snapshot_state`] saves it on the device: every Gated-DeltaNet layer's
/// convolution state (BF16) then delta-rule state (FP32), one layer after the other.
struct CudaStateCopy {
    conv: DevBuf,
    ssm: DevBuf,
    layers: usize,
    dims: GdnDims,
}

/// Byte ranges of slot `slot` in layer `g` of the state buffers: (conv offset, conv bytes, ssm
/// offset, ssm bytes); `slots` counts the trash slot.
fn slot_ranges(d: &GdnDims, g: usize, slots: usize, slot: usize) -> (usize, usize, usize, usize) {
    let (cb, sb) = (d.conv_state_len() * 2, d.ssm_state_len() * 4);
    ((g * slots + slot) * cb, cb, (g * slots + slot) * sb, sb)
}

/// Save slot `slot`'s state (device-to-device copies, one pair per Gated-DeltaNet layer) and
/// its position (`Backend::snapshot_state`).
///
/// # Errors
/// Not a hybrid, no slots, a slot out of range, or a device failure.
pub(super) fn snapshot_state(
    b: &mut CudaBackend,
    slot: u32,
) -> anyhow::Result<crate::runtime::backend::StateSnapshot> {
    let layers = b.config.num_gdn_layers();
    let hy = b.hy.as_ref().context("not a hybrid: no recurrent state")?;
    let st = hy
        .states
        .as_ref()
        .context("snapshot before init_state_slots")?;
    let s = slot as usize;
    anyhow::ensure!(
        s < st.slots,
        "state slot {slot} to snapshot; the backend has {} (init_state_slots)",
        st.slots
    );
    let d = hy.dims;
    let (cb, sb) = (d.conv_state_len() * 2, d.ssm_state_len() * 4);
    b.gpu.bind()?;
    let conv = b.gpu.alloc(layers * cb)?;
    let ssm = b.gpu.alloc(layers * sb)?;
    for g in 0..layers {
        let (co, cl, so, sl) = slot_ranges(&d, g, st.slots + 1, s);
        b.gpu.copy_d2d_range(&conv, g * cb, &st.conv, co, cl)?;
        b.gpu.copy_d2d_range(&ssm, g * sb, &st.ssm, so, sl)?;
    }
    b.gpu.sync()?;
    Ok(crate::runtime::backend::StateSnapshot {
        position: st.positions[s],
        bytes: (layers * (cb + sb)) as u64,
        data: Box::new(CudaStateCopy {
            conv,
            ssm,
            layers,
            dims: d,
        }),
    })
}

/// Put a [`snapshot_state`] copy back into slot `slot` and set its position to
/// `snap.position` (`Backend::restore_state`).
///
/// # Errors
/// Not a hybrid, a slot out of range, a snapshot of another backend or shape, or a device
/// failure.
pub(super) fn restore_state(
    b: &mut CudaBackend,
    slot: u32,
    snap: &crate::runtime::backend::StateSnapshot,
) -> anyhow::Result<()> {
    let copy = snap
        .data
        .downcast_ref::<CudaStateCopy>()
        .context("a state snapshot of another backend cannot be restored on the GPU")?;
    let layers = b.config.num_gdn_layers();
    let hy = b.hy.as_mut().context("not a hybrid: no recurrent state")?;
    let d = hy.dims;
    anyhow::ensure!(
        copy.layers == layers && copy.dims == d,
        "a state snapshot of another model ({} Gated-DeltaNet layers; this one has {layers})",
        copy.layers
    );
    let st = hy
        .states
        .as_mut()
        .context("restore before init_state_slots")?;
    let s = slot as usize;
    anyhow::ensure!(
        s < st.slots,
        "state slot {slot} to restore; the backend has {} (init_state_slots)",
        st.slots
    );
    let (cb, sb) = (d.conv_state_len() * 2, d.ssm_state_len() * 4);
    b.gpu.bind()?;
    for g in 0..layers {
        let (co, cl, so, sl) = slot_ranges(&d, g, st.slots + 1, s);
        b.gpu.copy_d2d_range(&st.conv, co, &copy.conv, g * cb, cl)?;
        b.gpu.copy_d2d_range(&st.ssm, so, &copy.ssm, g * sb, sl)?;
    }
    b.gpu.sync()?;
    st.positions[s] = snap.position;
    Ok(())
}

/// Plan and upload the Gated-DeltaNet segments of the forward pass about to be queued.
pub(super) fn write_plan(
    b: &mut CudaBackend,
    batch: &ForwardBatch,
    pad_to: Option<usize>,
) -> anyhow::Result<()> {
    let Some(hy) = b.hy.as_mut() else {
        return Ok(());
    };
    let st = hy
        .states
        .as_mut()
        .context("forward of a hybrid before init_state_slots")?;
    let p = gdn_plan(batch, pad_to, &mut st.positions)?;
    anyhow::ensure!(
        p.all.len() <= hy.seg_cap,
        "{} segments; the backend holds {}",
        p.all.len(),
        hy.seg_cap
    );
    let cap = hy.seg_cap;
    for (i, list) in [&p.all, &p.recurrent, &p.chunked].into_iter().enumerate() {
        let flat: Vec<i32> = list.iter().flatten().copied().collect();
        b.gpu.write(&hy.segs, i * cap * 16, &flat)?;
    }
    hy.counts = (p.all.len(), p.recurrent.len(), p.chunked.len());
    Ok(())
}

/// Queue the token mixer of hybrid layer `li` (after its input norm, `h` holding the normed
/// rows): Gated-DeltaNet or gated attention. Returns the device address of `o_proj`'s (or
/// `out_proj`'s) input, `p.tokens` rows.
#[allow(clippy::too_many_arguments)]
pub(super) fn queue_mixer(
    b: &mut CudaBackend,
    li: usize,
    p: &plan::Plan,
    kc: u64,
    vc: u64,
    ks: f32,
    vs: f32,
    fp8_kv: bool,
    block_size: usize,
) -> anyhow::Result<u64> {
    // The hybrid runtime is taken out for the layer (the profiler's op marks borrow the backend
    // mutably) and always put back.
    let hy = b.hy.take().context("hybrid runtime missing")?;
    let r = mixer(b, &hy, li, p, (kc, vc, ks, vs, fp8_kv, block_size));
    b.hy = Some(hy);
    r
}

fn mixer(
    b: &mut CudaBackend,
    hy: &HybridRt,
    li: usize,
    p: &plan::Plan,
    (kc, vc, ks, vs, fp8_kv, block_size): (u64, u64, f32, f32, bool, usize),
) -> anyhow::Result<u64> {
    let t = p.tokens;
    let c = b.config.clone();
    b.op_begin()?;
    b.gemm(
        LinRef {
            layer: li,
            which: super::LayerLinear::Qkv,
        },
        t,
        b.bufs.h.ptr(),
        b.bufs.qkv.ptr(),
    )?;
    b.op_end(if c.layer_type(li) == LayerType::Gdn {
        "GEMM in_proj_qkv + in_proj_z"
    } else {
        "GEMM qkv (query and gate)"
    })?;
    if c.layer_type(li) == LayerType::Gdn {
        return queue_gdn(b, hy, li, t);
    }
    let meta = b.bufs.meta.ptr();
    let at = |off: usize| meta + (off * 4) as u64;
    let l = p.layout;
    let layer = &b.weights.layers[li];
    let (qn, kn) = (
        layer.q_norm.as_ref().map_or(0, |x| x.ptr()),
        layer.k_norm.as_ref().map_or(0, |x| x.ptr()),
    );
    b.op_begin()?;
    launchers::gdn::hy_qk_norm_rope_kv(
        &hy.module,
        &b.gpu,
        (
            dim("t", t)?,
            dim(
                "c.num_heads + 2 * c.num_kv_heads",
                c.num_heads + 2 * c.num_kv_heads,
            )?,
            1,
        ),
        (c.head_dim.clamp(32, 256) as u32 / 32 * 32, 1, 1),
        0,
        &b.bufs.qkv,
        t,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.rotary_dim,
        DevPtr::at(qn),
        DevPtr::at(kn),
        &b.bufs.inv_freq,
        c.rms_norm_eps,
        DevPtr::at(at(l.pos)),
        DevPtr::at(at(l.slot)),
        &b.bufs.q,
        DevPtr::at(kc),
        DevPtr::at(vc),
        block_size,
        fp8_kv,
        1.0 / ks,
        1.0 / vs,
    )?;
    b.op_end("q/k norm + partial RoPE + KV write")?;
    b.op_begin()?;
    if c.head_dim <= 128 || b.decode_attention() == super::decode_attn::DecodeAttn::Flash {
        b.attention(p, kc, vc, ks, vs, fp8_kv, block_size)?;
    } else {
        anyhow::ensure!(
            p.tiles == 0,
            "tensor-core prefill tiles planned for head_dim {}",
            c.head_dim
        );
        if p.dec_tokens > 0 {
            if fp8_kv {
                launchers::gdn::hy_attn_decode_fp8(
                    &hy.module,
                    &b.gpu,
                    (
                        dim("p.dec_tokens", p.dec_tokens)?,
                        dim("c.num_kv_heads", c.num_kv_heads)?,
                        dim("p.att_parts", p.att_parts)?,
                    ),
                    (HY_THREADS, 1, 1),
                    0,
                    DevPtr::at(at(l.dec_tok)),
                    &b.bufs.q,
                    DevPtr::at(at(l.tok_seq)),
                    DevPtr::at(at(l.pos)),
                    DevPtr::at(at(l.block_tables)),
                    DevPtr::at(meta),
                    DevPtr::at(kc),
                    DevPtr::at(vc),
                    ks,
                    vs,
                    c.num_heads,
                    c.num_kv_heads,
                    c.head_dim,
                    block_size,
                    1.0 / (c.head_dim as f32).sqrt(),
                    &b.bufs.attn,
                    &b.bufs.part_ml,
                    &b.bufs.part_o,
                )
            } else {
                launchers::gdn::hy_attn_decode_bf16(
                    &hy.module,
                    &b.gpu,
                    (
                        dim("p.dec_tokens", p.dec_tokens)?,
                        dim("c.num_kv_heads", c.num_kv_heads)?,
                        dim("p.att_parts", p.att_parts)?,
                    ),
                    (HY_THREADS, 1, 1),
                    0,
                    DevPtr::at(at(l.dec_tok)),
                    &b.bufs.q,
                    DevPtr::at(at(l.tok_seq)),
                    DevPtr::at(at(l.pos)),
                    DevPtr::at(at(l.block_tables)),
                    DevPtr::at(meta),
                    DevPtr::at(kc),
                    DevPtr::at(vc),
                    ks,
                    vs,
                    c.num_heads,
                    c.num_kv_heads,
                    c.head_dim,
                    block_size,
                    1.0 / (c.head_dim as f32).sqrt(),
                    &b.bufs.attn,
                    &b.bufs.part_ml,
                    &b.bufs.part_o,
                )
            }?;
            if p.att_parts > 1 {
                launchers::rt::rt_attn_combine(
                    &b.rt,
                    &b.gpu,
                    (
                        dim("p.dec_tokens", p.dec_tokens)?,
                        dim("c.num_heads", c.num_heads)?,
                        1,
                    ),
                    (
                        dim("c.head_dim.clamp(32, 256)", c.head_dim.clamp(32, 256))?,
                        1,
                        1,
                    ),
                    0,
                    DevPtr::at(at(l.dec_tok)),
                    DevPtr::at(at(l.pos)),
                    c.num_heads,
                    c.head_dim,
                    p.att_parts,
                    &b.bufs.part_ml,
                    &b.bufs.part_o,
                    &b.bufs.attn,
                )?;
            }
        }
    }
    b.op_end("attention")?;
    let _ = ATT_THREADS;
    b.op_begin()?;
    let width = 2 * c.q_dim() + 2 * c.kv_dim();
    launchers::gdn::hy_attn_gate(
        &hy.module,
        &b.gpu,
        grid1(t * c.q_dim(), 256),
        (256, 1, 1),
        0,
        &b.bufs.attn,
        &b.bufs.qkv,
        t,
        c.num_heads,
        c.head_dim,
        width,
    )?;
    b.op_end("attention output gate")?;
    Ok(b.bufs.attn.ptr())
}

/// The Gated-DeltaNet mixer of layer `li` after its fused `[in_proj_qkv; in_proj_z]` GEMM.
fn queue_gdn(b: &mut CudaBackend, hy: &HybridRt, li: usize, t: usize) -> anyhow::Result<u64> {
    b.op_begin()?;
    b.gemm(
        LinRef {
            layer: li,
            which: super::LayerLinear::GdnAb,
        },
        t,
        b.bufs.h.ptr(),
        hy.ab.ptr(),
    )?;
    b.op_end("GEMM in_proj_a + in_proj_b")?;
    let eps = b.config.rms_norm_eps;
    let st = hy
        .states
        .as_ref()
        .context("forward of a hybrid before init_state_slots")?;
    let g = hy.gdn_index(li);
    let d = hy.dims;
    let (cd, vd) = (d.conv_dim(), d.value_dim());
    let slots = st.slots + 1;
    let conv_state = st.conv.ptr() + (g * slots * d.conv_state_len() * 2) as u64;
    let ssm = st.ssm.ptr() + (g * slots * d.ssm_state_len() * 4) as u64;
    let (conv_w, a_log, dt_bias, norm_w) = {
        let layer = b.weights.layers[li]
            .gdn
            .as_ref()
            .context("a Gated-DeltaNet layer without its tensors")?;
        (
            layer.conv_w.ptr(),
            layer.a_log.ptr(),
            layer.dt_bias.ptr(),
            layer.norm.ptr(),
        )
    };
    let (n_all, n_rec, n_chunk) = hy.counts;
    let segs = |i: usize| hy.segs.ptr() + (i * hy.seg_cap * 16) as u64;
    b.op_begin()?;
    launchers::gdn::gdn_conv_silu(
        &hy.module,
        &b.gpu,
        (
            dim("cd.div_ceil(128)", cd.div_ceil(128))?,
            dim("n_all", n_all)?,
            1,
        ),
        (128, 1, 1),
        0,
        &b.bufs.qkv,
        cd + vd,
        cd,
        d.kernel,
        DevPtr::at(conv_w),
        DevPtr::at(segs(0)),
        DevPtr::at(conv_state),
        &hy.mixed,
    )?;
    b.op_end("Gated-DeltaNet causal conv")?;
    b.op_begin()?;
    if n_rec > 0 {
        launchers::gdn::gdn_recurrent(
            &hy.module,
            &b.gpu,
            (dim("nv", d.nv)?, dim("recurrent segments", n_rec)?, 1),
            (dim("4·dv", 4 * d.dv)?, 1, 1),
            0,
            &hy.mixed,
            &hy.ab,
            DevPtr::at(a_log),
            DevPtr::at(dt_bias),
            DevPtr::at(segs(1)),
            d.nk,
            d.nv,
            d.dk,
            d.dv,
            DevPtr::at(ssm),
            &hy.core,
        )?;
    }
    if n_chunk > 0 {
        launchers::gdn::gdn_chunked(
            &hy.module,
            &b.gpu,
            (dim("nv", d.nv)?, dim("chunked segments", n_chunk)?, 1),
            (CHUNKED_THREADS, 1, 1),
            hy.chunk_smem,
            &hy.mixed,
            &hy.ab,
            DevPtr::at(a_log),
            DevPtr::at(dt_bias),
            DevPtr::at(segs(2)),
            d.nk,
            d.nv,
            d.dk,
            d.dv,
            hy.chunk,
            DevPtr::at(ssm),
            &hy.core,
        )?;
    }
    b.op_end("Gated-DeltaNet delta rule")?;
    b.op_begin()?;
    launchers::gdn::gdn_gated_norm(
        &hy.module,
        &b.gpu,
        (dim("t", t)?, dim("d.nv", d.nv)?, 1),
        (d.dv.clamp(32, 256).div_ceil(32) as u32 * 32, 1, 1),
        0,
        &hy.core,
        DevPtr::at(b.bufs.qkv.ptr() + (cd * 2) as u64),
        cd + vd,
        DevPtr::at(norm_w),
        d.nv,
        d.dv,
        eps,
        &hy.normed,
    )?;
    b.op_end("Gated-DeltaNet gated RMSNorm")?;
    Ok(hy.normed.ptr())
}

/// The per-role format of a recipe (none: as stored).
fn fmt_of(recipe: Option<QuantRecipe>, role: R) -> Option<WeightFormat> {
    recipe.map(|r| r.format_for(role))
}

impl Loader<'_> {
    fn gdn_small(
        &self,
        conv_w: &[f32],
        a_log: &[f32],
        dt_bias: &[f32],
        norm: &[f32],
        ab: DLinear,
    ) -> anyhow::Result<GdnDevLayer> {
        Ok(GdnDevLayer {
            ab,
            conv_w: self.f32s(conv_w)?,
            a_log: self.f32s(a_log)?,
            dt_bias: self.f32s(dt_bias)?,
            norm: self.f32s(norm)?,
        })
    }

    /// A hybrid layer from host weights (already quantized by the caller).
    pub(super) fn hybrid_host_layer(&self, l: &weights::LayerWeights) -> anyhow::Result<DLayer> {
        let (qkv, o, gdn) = match &l.gdn {
            Some(g) => (
                self.fuse_host(&[&g.qkv, &g.z])?,
                self.fuse_host(&[&g.out])?,
                Some(self.gdn_small(
                    &g.conv_w,
                    &g.a_log,
                    &g.dt_bias,
                    &g.norm,
                    self.fuse_host(&[&g.a, &g.b])?,
                )?),
            ),
            None => (
                self.fuse_host(&[&l.q, &l.k, &l.v])?,
                self.fuse_host(&[&l.o])?,
                None,
            ),
        };
        Ok(DLayer {
            input_norm: self.f32s(&l.input_norm)?,
            post_norm: self.f32s(&l.post_norm)?,
            q_norm: l.q_norm.as_ref().map(|v| self.f32s(v)).transpose()?,
            k_norm: l.k_norm.as_ref().map(|v| self.f32s(v)).transpose()?,
            qkv,
            o,
            gate_up: self.fuse_host(&[&l.gate, &l.up])?,
            down: self.fuse_host(&[&l.down])?,
            k_scale: l.k_scale.unwrap_or(1.0),
            v_scale: l.v_scale.unwrap_or(1.0),
            gdn,
        })
    }

    /// Layer `i` of a hybrid checkpoint (BF16 linears quantized on the GPU by `recipe`).
    pub(super) fn hybrid_checkpoint_layer(
        &self,
        m: &weights::MappedCheckpoint,
        i: usize,
        recipe: Option<QuantRecipe>,
    ) -> anyhow::Result<DLayer> {
        let c = m.config();
        let mlp = (
            self.fuse_views(
                &[m.linear(i, R::Gate)?, m.linear(i, R::Up)?],
                fmt_of(recipe, R::Gate),
            )?,
            self.fuse_views(&[m.linear(i, R::Down)?], fmt_of(recipe, R::Down))?,
        );
        if c.layer_type(i) == LayerType::Gdn {
            let (conv_w, a_log, dt_bias) = m.gdn_params(i)?;
            let ab = self.fuse_views(
                &[m.linear(i, R::GdnA)?, m.linear(i, R::GdnB)?],
                fmt_of(recipe, R::GdnA),
            )?;
            return Ok(DLayer {
                input_norm: self.f32s(&m.norm(N::Input(i))?)?,
                post_norm: self.f32s(&m.norm(N::Post(i))?)?,
                q_norm: None,
                k_norm: None,
                qkv: self.fuse_views(
                    &[m.linear(i, R::GdnQkv)?, m.linear(i, R::GdnZ)?],
                    fmt_of(recipe, R::GdnQkv),
                )?,
                o: self.fuse_views(&[m.linear(i, R::GdnOut)?], fmt_of(recipe, R::GdnOut))?,
                gate_up: mlp.0,
                down: mlp.1,
                k_scale: 1.0,
                v_scale: 1.0,
                gdn: Some(self.gdn_small(
                    &conv_w,
                    &a_log,
                    &dt_bias,
                    &m.norm(N::GdnNorm(i))?,
                    ab,
                )?),
            });
        }
        let (ks, vs) = m.kv_scales(i);
        Ok(DLayer {
            input_norm: self.f32s(&m.norm(N::Input(i))?)?,
            post_norm: self.f32s(&m.norm(N::Post(i))?)?,
            q_norm: Some(self.f32s(&m.norm(N::Q(i))?)?),
            k_norm: Some(self.f32s(&m.norm(N::K(i))?)?),
            qkv: self.fuse_views(
                &[m.linear(i, R::Q)?, m.linear(i, R::K)?, m.linear(i, R::V)?],
                fmt_of(recipe, R::Q),
            )?,
            o: self.fuse_views(&[m.linear(i, R::O)?], fmt_of(recipe, R::O))?,
            gate_up: mlp.0,
            down: mlp.1,
            k_scale: ks.unwrap_or(1.0),
            v_scale: vs.unwrap_or(1.0),
            gdn: None,
        })
    }

    /// Synthesized f32 parameters (BF16 normals converted, as the CPU's `synth_gdn`).
    fn synth_f32(
        &self,
        seed: u64,
        id: u64,
        len: usize,
        mean: f32,
        std: f32,
    ) -> anyhow::Result<DevBuf> {
        let tmp = self.gpu.alloc(len * 2)?;
        self.synth_into(&tmp, 0, seed, id, len, mean, std)?;
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

    /// Layer `i` of a synthesized hybrid, bit-identical to
    /// [`crate::runtime::weights::synthesize`] (tensor ids of
    /// [`crate::runtime::weights::synth_tensor_id`]) and quantized as `recipe` quantizes the
    /// CPU's (fused groups sharing one per-tensor scale; in_proj_a / in_proj_b BF16).
    pub(super) fn hybrid_synth_layer(
        &self,
        c: &ModelConfig,
        seed: u64,
        i: usize,
        recipe: QuantRecipe,
    ) -> anyhow::Result<DLayer> {
        let h = c.hidden_size;
        let inv = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
        let id = |j: u64| weights::synth_tensor_id(Some(i), j);
        let f = |r: R| recipe.format_for(r);
        let gate_up = self.synth_linear(
            seed,
            &[(id(8), c.intermediate_size), (id(9), c.intermediate_size)],
            h,
            inv(h),
            f(R::Gate),
        )?;
        let down = self.synth_linear(
            seed,
            &[(id(10), h)],
            c.intermediate_size,
            inv(c.intermediate_size),
            f(R::Down),
        )?;
        let hy = c.hybrid.as_ref().context("not a hybrid")?;
        if c.layer_type(i) == LayerType::Gdn {
            let (cd, vd, nv) = (hy.conv_dim(), hy.value_dim(), hy.num_value_heads);
            let ab =
                self.synth_linear(seed, &[(id(13), nv), (id(14), nv)], h, inv(h), f(R::GdnA))?;
            let (am, asd) = weights::SYNTH_GDN_A_LOG;
            let (dm, dsd) = weights::SYNTH_GDN_DT_BIAS;
            let gdn = GdnDevLayer {
                ab,
                conv_w: self.synth_f32(
                    seed,
                    id(16),
                    cd * hy.conv_kernel,
                    0.0,
                    inv(hy.conv_kernel),
                )?,
                a_log: self.synth_f32(seed, id(17), nv, am, asd)?,
                dt_bias: self.synth_f32(seed, id(18), nv, dm, dsd)?,
                norm: self.synth_f32(
                    seed,
                    id(19),
                    hy.value_head_dim,
                    1.0,
                    weights::SYNTH_NORM_JITTER,
                )?,
            };
            return Ok(DLayer {
                input_norm: self.synth_norm(seed, id(0), h)?,
                post_norm: self.synth_norm(seed, id(7), h)?,
                q_norm: None,
                k_norm: None,
                qkv: self.synth_linear(
                    seed,
                    &[(id(11), cd), (id(12), vd)],
                    h,
                    inv(h),
                    f(R::GdnQkv),
                )?,
                o: self.synth_linear(seed, &[(id(15), h)], vd, inv(vd), f(R::GdnOut))?,
                gate_up,
                down,
                k_scale: 1.0,
                v_scale: 1.0,
                gdn: Some(gdn),
            });
        }
        Ok(DLayer {
            input_norm: self.synth_norm(seed, id(0), h)?,
            post_norm: self.synth_norm(seed, id(7), h)?,
            q_norm: Some(self.synth_norm(seed, id(5), c.head_dim)?),
            k_norm: Some(self.synth_norm(seed, id(6), c.head_dim)?),
            qkv: self.synth_linear(
                seed,
                &[
                    (id(1), c.q_proj_rows()),
                    (id(2), c.kv_dim()),
                    (id(3), c.kv_dim()),
                ],
                h,
                inv(h),
                f(R::Q),
            )?,
            o: self.synth_linear(seed, &[(id(4), h)], c.q_dim(), inv(c.q_dim()), f(R::O))?,
            gate_up,
            down,
            k_scale: 1.0,
            v_scale: 1.0,
            gdn: None,
        })
    }
}

/// Shared memory of `gdn_chunked` for `chunk` rows at dims `d`, bytes.
fn chunked_smem(d: &GdnDims, chunk: usize) -> usize {
    4 * (3 * chunk * d.dk + chunk * d.dv + chunk * chunk + 2 * chunk + d.dk * d.dv)
}

/// The convolution and both delta-rule kernels against [`crate::runtime::gdn::mixer_core`] on
/// random inputs at dims `d` (see [`super::hybrid_check::gdn_kernels_match_cpu`]).
pub(super) fn kernels_vs_cpu(
    b: &CudaBackend,
    d: &GdnDims,
    name: &str,
) -> anyhow::Result<Vec<super::self_check::Check>> {
    use crate::runtime::gdn::GdnParams;
    let hy = b.hy.as_ref().context("not a hybrid backend")?;
    let gpu = &b.gpu;
    let (c, nv, vd) = (d.conv_dim(), d.nv, d.value_dim());
    let t = 74usize;
    let mut rng = weights::SplitMix64::new(0x6D_4E_7E);
    let mut normals = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| crate::formats::bf16_round(rng.normal_pair().0 * scale))
            .collect()
    };
    let x = normals(t * c, 1.0);
    let ab = normals(t * 2 * nv, 1.0);
    let conv_w = normals(c * d.kernel, 0.5);
    let a_log = normals(nv, 0.5)
        .iter()
        .map(|v| v - 1.0)
        .collect::<Vec<f32>>();
    let dt_bias = normals(nv, 0.5);
    let bf = |v: &[f32]| crate::formats::to_bf16_bits(v);
    let dx = gpu.upload(&bf(&x))?;
    let dab = gpu.upload(&bf(&ab))?;
    let dw = gpu.upload(&conv_w)?;
    let dal = gpu.upload(&a_log)?;
    let ddt = gpu.upload(&dt_bias)?;
    let slots = 2usize;
    let conv_state = gpu.alloc(slots * d.conv_state_len() * 2)?;
    let ssm = gpu.alloc(slots * d.ssm_state_len() * 4)?;
    gpu.memset(&conv_state, 0)?;
    gpu.memset(&ssm, 0)?;
    let mixed = gpu.alloc(t * c * 2)?;
    let out = gpu.alloc(t * vd * 2)?;
    let segs = gpu.alloc(3 * 4 * 16)?;
    let smem = chunked_smem(d, hy.chunk);
    if smem > 48 << 10 {
        hy.module.set_max_dynamic_smem("gdn_chunked", smem as u32)?;
    }
    let run = |all: &[GdnSeg], rec: &[GdnSeg], chunked: &[GdnSeg]| -> anyhow::Result<()> {
        for (i, list) in [all, rec, chunked].into_iter().enumerate() {
            let flat: Vec<i32> = list.iter().flatten().copied().collect();
            gpu.write(&segs, i * 4 * 16, &flat)?;
        }
        launchers::gdn::gdn_conv_silu(
            &hy.module,
            gpu,
            (
                dim("c.div_ceil(128)", c.div_ceil(128))?,
                dim("all.len()", all.len())?,
                1,
            ),
            (128, 1, 1),
            0,
            &dx,
            c,
            c,
            d.kernel,
            &dw,
            &segs,
            &conv_state,
            &mixed,
        )?;
        if !rec.is_empty() {
            launchers::gdn::gdn_recurrent(
                &hy.module,
                gpu,
                (dim("nv", nv)?, dim("recurrent segments", rec.len())?, 1),
                (dim("4·dv", 4 * d.dv)?, 1, 1),
                0,
                &mixed,
                &dab,
                &dal,
                &ddt,
                DevPtr::at(segs.ptr() + 4 * 16),
                d.nk,
                d.nv,
                d.dk,
                d.dv,
                &ssm,
                &out,
            )?;
        }
        if !chunked.is_empty() {
            launchers::gdn::gdn_chunked(
                &hy.module,
                gpu,
                (dim("nv", nv)?, dim("chunked segments", chunked.len())?, 1),
                (CHUNKED_THREADS, 1, 1),
                dim("shared memory bytes", smem)?,
                &mixed,
                &dab,
                &dal,
                &ddt,
                DevPtr::at(segs.ptr() + 2 * 4 * 16),
                d.nk,
                d.nv,
                d.dk,
                d.dv,
                hy.chunk,
                &ssm,
                &out,
            )?;
        }
        gpu.sync()?;
        Ok(())
    };
    // Pass 1: a 70-token prefill (slot 0, chunked) and a 3-token verification (slot 1).
    let (pre, ver) = ([0, 70, 0, 1], [70, 3, 1, 1]);
    run(&[pre, ver], &[ver], &[pre])?;
    // Pass 2: one decode token continuing slot 0.
    let dec = [73, 1, 0, 0];
    run(&[dec], &[dec], &[])?;
    let got_out: Vec<f32> =
        crate::formats::from_bf16_bits(&gpu.download::<u16>(&out, 0, t * vd)?);
    let got_ssm: Vec<f32> = gpu.download(&ssm, 0, slots * d.ssm_state_len())?;
    let got_conv: Vec<f32> = crate::formats::from_bf16_bits(&gpu.download::<u16>(
        &conv_state,
        0,
        slots * d.conv_state_len(),
    )?);
    // The CPU reference.
    let p = GdnParams {
        conv_w: &conv_w,
        a_log: &a_log,
        dt_bias: &dt_bias,
    };
    let (want_out, want_ssm, want_conv) = mixer_reference(d, hy.chunk, t, &x, &ab, &p);
    Ok(gdn_verdicts(
        d,
        name,
        (&got_out, &got_ssm, &got_conv),
        (&want_out, &want_ssm, &want_conv),
    ))
}

/// The CPU reference of [`kernels_vs_cpu`]'s passes over `t` tokens: the 70-token chunked
/// prefill and 3-token verification, then one decode token continuing slot 0. Returns the
/// mixer outputs and both slots' recurrent and convolution states.
fn mixer_reference(
    d: &GdnDims,
    chunk: usize,
    t: usize,
    x: &[f32],
    ab: &[f32],
    p: &crate::runtime::gdn::GdnParams<'_>,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    use crate::runtime::gdn::{self as g, Form, GdnLayerState};
    let (c, nv, vd) = (d.conv_dim(), d.nv, d.value_dim());
    let split = |r0: usize, r1: usize| {
        let mut a = Vec::new();
        let mut bb = Vec::new();
        for r in r0..r1 {
            a.extend_from_slice(&ab[r * 2 * nv..r * 2 * nv + nv]);
            bb.extend_from_slice(&ab[r * 2 * nv + nv..(r + 1) * 2 * nv]);
        }
        (a, bb)
    };
    let mut want_out = vec![0f32; t * vd];
    let mut s0 = GdnLayerState::zeros(d);
    let mut s1 = GdnLayerState::zeros(d);
    for (r0, r1, st, form) in [
        (0usize, 70usize, 0usize, Form::Chunked(chunk)),
        (70, 73, 1, Form::Recurrent),
        (73, 74, 0, Form::Recurrent),
    ] {
        let (a, bb) = split(r0, r1);
        let state = if st == 0 { &mut s0 } else { &mut s1 };
        let o = g::mixer_core(
            d,
            p,
            &x[r0 * c..r1 * c],
            &a,
            &bb,
            r1 - r0,
            state,
            form,
            true,
            4,
        );
        want_out[r0 * vd..r1 * vd].copy_from_slice(&o);
    }
    let mut want_ssm = s0.ssm.clone();
    want_ssm.extend_from_slice(&s1.ssm);
    let mut want_conv = s0.conv.clone();
    want_conv.extend_from_slice(&s1.conv);
    (want_out, want_ssm, want_conv)
}

/// The verdicts of [`kernels_vs_cpu`] (`got` from the GPU, `want` from the CPU; each as
/// outputs, recurrent states, convolution states): outputs and recurrent states within
/// [`super::hybrid_check::GDN_KERNEL_REL_L2`], convolution states exactly equal.
fn gdn_verdicts(
    d: &GdnDims,
    name: &str,
    (got_out, got_ssm, got_conv): (&[f32], &[f32], &[f32]),
    (want_out, want_ssm, want_conv): (&[f32], &[f32], &[f32]),
) -> Vec<super::self_check::Check> {
    use super::hybrid_check::{check, rel, GDN_KERNEL_REL_L2};
    let tag = |what: &str| {
        format!(
            "Gated-DeltaNet {what} ({name}: {}×{} key, {}×{} value heads)",
            d.nk, d.dk, d.nv, d.dv
        )
    };
    vec![
        check(
            tag("outputs: chunked prefill, recurrent verification and decode"),
            rel(got_out, want_out),
            GDN_KERNEL_REL_L2,
            "mixer output",
        ),
        check(
            tag("recurrent states"),
            rel(got_ssm, want_ssm),
            GDN_KERNEL_REL_L2,
            "state",
        ),
        super::self_check::Check {
            name: tag("convolution states"),
            pass: got_conv == want_conv,
            detail: format!(
                "{} of {} elements equal (exact: both keep the last inputs)",
                got_conv
                    .iter()
                    .zip(want_conv)
                    .filter(|(a, b)| a == b)
                    .count(),
                want_conv.len()
            ),
        },
    ]
}

/// The KV-cache layout of a hybrid: the index of layer `li` among the layers with a KV cache.
pub fn attention_index(c: &ModelConfig, li: usize) -> usize {
    (0..li)
        .filter(|i| c.layer_type(*i) == LayerType::Attention)
        .count()
}

/// Bytes of the KV cache the CUDA backend allocates for `spec` (the layers with attention,
/// plus the trash block of graph padding).
pub fn kv_cache_bytes(
    c: &ModelConfig,
    num_blocks: usize,
    block_size: usize,
    dtype: KvCacheDtype,
) -> usize {
    2 * c.num_attention_layers()
        * (num_blocks + 1)
        * c.num_kv_heads
        * block_size
        * c.head_dim
        * dtype.bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::backend::SeqSegment;

    fn seg(start: usize, len: usize, first_pos: usize, slot: u32, logits: usize) -> SeqSegment {
        SeqSegment {
            start,
            len,
            first_pos,
            block_table: vec![0],
            num_logits: logits,
            state_slot: slot,
        }
    }

    #[test]
    fn segments_take_the_cpu_backends_forms_and_slots_continue() {
        let mut pos = vec![0usize; 4];
        // A prefill chunk (chunked), a decode token (recurrent), a verification (recurrent).
        let b = ForwardBatch {
            token_ids: vec![1; 10],
            seqs: vec![seg(0, 6, 0, 2, 1), seg(6, 1, 0, 0, 1), seg(7, 3, 0, 3, 3)],
        };
        let p = gdn_plan(&b, None, &mut pos).unwrap();
        assert_eq!(p.all, vec![[0, 6, 2, 1], [6, 1, 0, 1], [7, 3, 3, 1]]);
        assert_eq!(p.chunked, vec![[0, 6, 2, 1]]);
        assert_eq!(p.recurrent, vec![[6, 1, 0, 1], [7, 3, 3, 1]]);
        assert_eq!(pos, vec![1, 0, 6, 3]);
        // The next step continues (reset 0) and pads a graph batch with trash-slot rows.
        let b = ForwardBatch {
            token_ids: vec![1; 2],
            seqs: vec![seg(0, 1, 6, 2, 1), seg(1, 1, 1, 0, 1)],
        };
        let p = gdn_plan(&b, Some(4), &mut pos).unwrap();
        assert_eq!(
            p.recurrent,
            vec![[0, 1, 2, 0], [1, 1, 0, 0], [2, 1, 4, 1], [3, 1, 4, 1]]
        );
        assert!(p.chunked.is_empty());
        assert_eq!(pos, vec![2, 0, 7, 3]);
        // No rollback on the GPU; slots out of range or shared are errors.
        for (bad, want) in [
            (seg(0, 1, 5, 2, 1), "cannot continue"),
            (seg(0, 1, 0, 4, 1), "state slot 4"),
        ] {
            let b = ForwardBatch {
                token_ids: vec![1],
                seqs: vec![bad],
            };
            let e = gdn_plan(&b, None, &mut pos.clone())
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e}");
        }
        let b = ForwardBatch {
            token_ids: vec![1; 2],
            seqs: vec![seg(0, 1, 0, 1, 1), seg(1, 1, 0, 1, 1)],
        };
        assert!(gdn_plan(&b, None, &mut pos)
            .unwrap_err()
            .to_string()
            .contains("two segments"));
    }

    #[test]
    fn kernel_names_are_in_the_source() {
        for k in GDN_KERNELS {
            assert!(
                GDN_SRC.contains(&format!(" {k}(")),
                "{k} missing from kernels/gdn.cu"
            );
        }
    }

    #[test]
    fn shapes_and_sizes() {
        let c = crate::runtime::hybrid::qwen36_27b();
        assert!(unsupported_shape(&c).is_none());
        // [in_proj_qkv; in_proj_z] (10,240 + 6,144 rows) is wider than [q·gate; k; v] (14,336).
        assert_eq!(max_fused_rows(&c), 16_384);
        let mut bad = c.clone();
        bad.head_dim = 512;
        assert!(unsupported_shape(&bad).unwrap().contains("head_dim 512"));
        // 27B: the KV cache of 16 attention layers, the attention index skips GDN layers.
        assert_eq!(attention_index(&c, 3), 0);
        assert_eq!(attention_index(&c, 7), 1);
        assert_eq!(attention_index(&c, 63), 15);
        assert_eq!(
            kv_cache_bytes(&c, 9, 16, KvCacheDtype::Bf16),
            2 * 16 * 10 * 4 * 16 * 256 * 2
        );
        // Weights: BF16 about 53.6 GB, W4A16 less than a third of the linears.
        let bf = predicted_weight_bytes(&c, QuantRecipe::Uniform(WeightFormat::Bf16)) as f64;
        assert!((53.0e9..54.5e9).contains(&bf), "{bf}");
        let mixed = predicted_weight_bytes(&c, QuantRecipe::Nvfp4Mixed) as f64;
        let nv = predicted_weight_bytes(&c, QuantRecipe::Uniform(WeightFormat::Nvfp4)) as f64;
        assert!(nv < mixed && mixed < bf, "{nv} {mixed} {bf}");
    }
}
