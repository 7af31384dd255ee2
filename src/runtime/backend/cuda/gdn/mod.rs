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
//!
//! By concern: this file holds the kernels' source and names, the shapes they support, the
//! sizes the memory planner predicts, the per-pass segment plan ([`gdn_plan`]) and the device
//! state ([`HybridRt`]: activation buffers, state slots, snapshots); `forward` queues a layer's
//! kernels; `load` builds the device layers of a hybrid (host weights, checkpoint or seeded
//! synthesis); `tests` the plan and the sizes. The check of the kernels against the CPU is in
//! `super::hybrid_check`.

use anyhow::Context;

use super::{CudaBackend, DLinear};
use crate::gpu::{DevBuf, Module};
use crate::runtime::backend::ForwardBatch;
use crate::runtime::config::{KvCacheDtype, ModelConfig, QuantRecipe, WeightFormat};
use crate::runtime::gdn::GdnDims;
use crate::runtime::hybrid::LayerType;
use crate::runtime::weights::LinearRole as R;

mod forward;
mod load;
#[cfg(test)]
mod tests;

pub(super) use forward::{queue_mixer, write_plan};

/// Source of the hybrid kernels.
pub const GDN_SRC: &str = include_str!("../../../../../kernels/gdn.cu");

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
pub(super) const CHUNKED_THREADS: u32 = 512;
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

/// Bytes the CUDA backend's weights take for a hybrid or a mixture of experts `c` quantized by
/// `recipe` (linears in their formats, NVFP4 in the kernel layout with padding, every routed
/// expert; BF16 embedding and lm_head; small parameters in f32).
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
    total + heads * 2 * c.vocab_size as u64 * h + 4 * h + predicted_expert_bytes(c, recipe)
}

/// Bytes the CUDA backend's routed experts take for `c` under `recipe` (every sparse layer's E
/// experts in the recipe's expert formats, NVFP4 in the kernel layout), the part of
/// [`predicted_weight_bytes`] that [`crate::model::roles::LinearRole::of_layer`] leaves out.
pub fn predicted_expert_bytes(c: &ModelConfig, recipe: QuantRecipe) -> u64 {
    let Some(m) = &c.moe else { return 0 };
    let per: u64 = R::EXPERT
        .iter()
        .map(|r| {
            let (n, k) = r.shape(c);
            crate::runtime::memory::linear_bytes(recipe.format_for(*r), n, k)
        })
        .sum();
    let sparse = (0..c.num_layers).filter(|&i| m.is_sparse(i)).count() as u64;
    sparse * m.num_experts as u64 * per
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
    pub(super) module: Module,
    dims: GdnDims,
    layer_types: Vec<LayerType>,
    pub(super) chunk: usize,
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
