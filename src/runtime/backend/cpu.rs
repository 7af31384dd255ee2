//! The CPU backend: the decoder in f32 on the host, weights dequantized on the fly row by row
//! inside the matmul (so BF16, FP8 and NVFP4 weights cost their real storage and carry their
//! real rounding), paged KV cache in host memory.
//!
//! Parallelism: matmuls split the N output rows across `std::thread::scope` threads, attention
//! splits heads; small problems stay on one thread. The split never changes a summation order,
//! so results are identical for any thread count and any batch composition.

use std::borrow::Cow;

use anyhow::Context;

use super::{Backend, ForwardBatch, KvCacheSpec, Logits};
use crate::formats::e4m3;
use crate::runtime::config::{ModelConfig, WeightFormat};
use crate::runtime::gdn::{self, Form, GdnDims, GdnLayerState};
use crate::runtime::kv_cache::PagedKvStore;
use crate::runtime::model::{
    apply_rope, attend_one, dot, rms_norm, rms_norm_inplace, silu, AttnShape,
};
use crate::runtime::weights::{GdnWeights, LayerWeights, Linear, ModelWeights};

/// Multiply-adds below which a matmul or an attention call stays on one thread (spawning costs
/// about 10–50 µs per thread; 2¹⁸ MACs take about that long on one core).
const PAR_MIN_WORK: usize = 1 << 18;

/// Quantize activations to E4M3 for a W8A8 matmul and return their dequantized values:
/// per token (row) with `scale = amax(|row|) / 448` when `input_scale` is `None` (vLLM's dynamic
/// per-token FP8), else with the static scale (values beyond ±448·scale saturate).
pub fn quantize_activations_fp8(x: &[f32], k: usize, input_scale: Option<f32>) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(k) {
        let s = input_scale.unwrap_or_else(|| {
            crate::formats::fp8::scale_from_amax(row.iter().fold(0f32, |m, v| m.max(v.abs())))
        });
        let inv = 1.0 / s;
        out.extend(row.iter().map(|v| e4m3::round_trip(v * inv) * s));
    }
    out
}

/// Quantize activations to NVFP4 and return their dequantized values, for the emulated W4A4
/// path: per token (row), a per-row FP32 scale `amax(|row|) / (6 · 448)` and an E4M3 scale per
/// 16 values (the weights' ModelOpt math, [`crate::formats::nvfp4::quantize`], applied to one
/// row). Dynamic per-token scaling is the best case of W4A4: engines use a calibrated static
/// per-tensor `input_scale` (docs/fidelity.md).
pub fn quantize_activations_nvfp4(x: &[f32], k: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(k) {
        match crate::formats::nvfp4::quantize(row, 1, k) {
            Ok(q) => out.extend(q.dequantize()),
            // K not a multiple of 16: NVFP4 weights could not exist either; keep the row.
            Err(_) => out.extend_from_slice(row),
        }
    }
    out
}

/// `y = x · Wᵀ` for `x` `[m, K]` and `w` `[N, K]`: returns `[m, N]`. FP8 weights also quantize
/// the activations (W8A8, see [`quantize_activations_fp8`]); BF16 and NVFP4 (W4A16) use the f32
/// activations as they are.
pub fn matmul(x: &[f32], m: usize, w: &Linear, threads: usize) -> Vec<f32> {
    let (n, k) = w.shape();
    debug_assert_eq!(x.len(), m * k);
    let xq: Cow<[f32]> = match w {
        Linear::Fp8 { input_scale, .. } => Cow::Owned(quantize_activations_fp8(x, k, *input_scale)),
        _ => Cow::Borrowed(x),
    };
    let mut out = vec![0f32; m * n];
    let t = if m * n * k < PAR_MIN_WORK {
        1
    } else {
        threads.min(n / 8).max(1)
    };
    if t == 1 {
        kernel(&xq, m, k, w, 0, n, &mut out);
        return out;
    }
    let per = n.div_ceil(t);
    let parts: Vec<(usize, Vec<f32>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..t)
            .map(|i| {
                let (j0, j1) = (i * per, ((i + 1) * per).min(n));
                let xq = &xq;
                s.spawn(move || {
                    let mut local = vec![0f32; m * (j1.saturating_sub(j0))];
                    if j1 > j0 {
                        kernel(xq, m, k, w, j0, j1, &mut local);
                    }
                    (j0, local)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    for (j0, local) in parts {
        let len = local.len().checked_div(m).unwrap_or(0);
        for i in 0..m {
            out[i * n + j0..i * n + j0 + len].copy_from_slice(&local[i * len..(i + 1) * len]);
        }
    }
    out
}

/// Rows `j0..j1` of `w` against all `m` rows of `x`, into `out` `[m, j1 - j0]`.
fn kernel(x: &[f32], m: usize, k: usize, w: &Linear, j0: usize, j1: usize, out: &mut [f32]) {
    let ld = j1 - j0;
    let mut wrow = vec![0f32; k];
    for j in j0..j1 {
        w.dequantize_row(j, &mut wrow);
        for i in 0..m {
            out[i * ld + (j - j0)] = dot(&x[i * k..(i + 1) * k], &wrow);
        }
    }
}

/// The CPU backend.
#[derive(Debug)]
pub struct CpuBackend {
    weights: ModelWeights,
    inv_freq: Vec<f32>,
    kv: Option<PagedKvStore>,
    threads: usize,
    gpu_rounding: bool,
    /// Recurrent-state slots of a hybrid (empty for dense decoders).
    states: Vec<SlotState>,
    emulate_w4a4: bool,
}

/// One sequence slot's Gated-DeltaNet state over all its layers.
#[derive(Debug, Clone)]
struct SlotState {
    /// Tokens the state has absorbed (the position its next segment starts at).
    pos: usize,
    /// Per Gated-DeltaNet layer.
    layers: Vec<GdnLayerState>,
    /// Taken before a segment that verifies drafts, so the state can go back to any position
    /// inside that segment.
    snap: Option<Snapshot>,
}

/// A slot's state as [`Backend::snapshot_state`] saves it on the CPU.
struct CpuStateCopy {
    layers: Vec<GdnLayerState>,
}

/// The state before a multi-logit segment and that segment's mixer inputs: replaying the first
/// `n` tokens from it gives the state a segment of exactly those tokens would have left.
#[derive(Debug, Clone)]
struct Snapshot {
    /// Position the segment started at.
    base: usize,
    /// Tokens in the segment.
    len: usize,
    /// The state before it.
    layers: Vec<GdnLayerState>,
    /// Per Gated-DeltaNet layer: the segment's `in_proj_qkv`, `in_proj_a`, `in_proj_b`
    /// outputs (`[len][conv_dim]`, `[len][nv]`, `[len][nv]`).
    inputs: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)>,
}

impl CpuBackend {
    /// A backend over `weights`, using `threads` threads (at least 1).
    pub fn new(weights: ModelWeights, threads: usize) -> Self {
        let inv_freq = weights.config.rope_inv_freq();
        CpuBackend {
            weights,
            inv_freq,
            kv: None,
            threads: threads.max(1),
            gpu_rounding: false,
            states: Vec::new(),
            emulate_w4a4: false,
        }
    }

    /// Emulated W4A4: the activations entering every NVFP4 linear layer are quantized to NVFP4
    /// first ([`quantize_activations_nvfp4`]), then multiplied in f32 (an accuracy figure only,
    /// never a speed). No effect on BF16 and FP8 layers. Off by default (W4A16).
    pub fn with_emulated_w4a4(mut self, on: bool) -> Self {
        self.emulate_w4a4 = on;
        self
    }

    /// Whether [`Self::with_emulated_w4a4`] is on.
    pub fn emulates_w4a4(&self) -> bool {
        self.emulate_w4a4
    }

    /// Round to BF16 where the CUDA backend does (every GEMM input and output, the q vector after
    /// RoPE; the residual stream stays f32; in Gated-DeltaNet layers the convolution output and
    /// the mixer output), so that the two backends compute the same function up to summation
    /// order: the reference of the GPU parity check. Off by default (plain f32).
    pub fn with_gpu_rounding(mut self, on: bool) -> Self {
        self.gpu_rounding = on;
        self
    }

    /// The weights.
    pub fn weights(&self) -> &ModelWeights {
        &self.weights
    }

    fn gdn_dims(&self) -> Option<GdnDims> {
        self.weights.config.hybrid.as_ref().map(GdnDims::from)
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn config(&self) -> &ModelConfig {
        &self.weights.config
    }

    fn weight_format(&self) -> WeightFormat {
        self.weights.linear_format()
    }

    fn weight_bytes(&self) -> u64 {
        self.weights.stored_bytes() as u64
    }

    fn init_kv_cache(&mut self, spec: KvCacheSpec) -> anyhow::Result<()> {
        let c = &self.weights.config;
        // Storage for the layers with attention only (all of them in dense decoders).
        let scales: Vec<(f32, f32)> = self
            .weights
            .layers
            .iter()
            .filter(|l| l.gdn.is_none())
            .map(|l| (l.k_scale.unwrap_or(1.0), l.v_scale.unwrap_or(1.0)))
            .collect();
        let kv_layers = c.num_attention_layers();
        let elems = spec.num_blocks as u128 * spec.block_size as u128 * c.kv_dim() as u128;
        anyhow::ensure!(
            elems <= isize::MAX as u128 / 2,
            "KV cache of {} blocks is too large for host memory",
            spec.num_blocks
        );
        // K and V for every layer, in host memory: refuse what cannot be allocated instead of
        // letting the allocator abort the process.
        let elem_bytes: u128 = match spec.dtype {
            crate::runtime::config::KvCacheDtype::Bf16 => 2,
            crate::runtime::config::KvCacheDtype::Fp8 => 1,
        };
        let bytes = elems * 2 * kv_layers as u128 * elem_bytes;
        check_host_memory(bytes, "KV cache", "--kv-cache-memory")?;
        self.kv = Some(PagedKvStore::new(
            kv_layers,
            c.kv_dim(),
            spec.num_blocks,
            spec.block_size,
            spec.dtype,
            &scales,
        ));
        Ok(())
    }

    /// f32 for both parts of the state (the convolution state holds f32 projection outputs
    /// here; a GPU stores it in BF16).
    fn state_bytes_per_slot(&self) -> u64 {
        self.weights.config.gdn_state_bytes(4)
    }

    fn init_state_slots(&mut self, n: usize) -> anyhow::Result<()> {
        let Some(d) = self.gdn_dims() else {
            self.states.clear();
            return Ok(());
        };
        let layers = self.weights.config.num_gdn_layers();
        check_host_memory(
            n as u128 * self.state_bytes_per_slot() as u128,
            "Gated-DeltaNet state",
            "--max-num-seqs",
        )?;
        self.states = (0..n)
            .map(|_| SlotState {
                pos: 0,
                layers: (0..layers).map(|_| GdnLayerState::zeros(&d)).collect(),
                snap: None,
            })
            .collect();
        Ok(())
    }

    fn supports_state_rollback(&self) -> bool {
        true
    }

    fn snapshot_state(&mut self, slot: u32) -> anyhow::Result<super::StateSnapshot> {
        let n = self.states.len();
        let st = self.states.get(slot as usize).with_context(|| {
            format!("state slot {slot} to snapshot; the backend has {n} (init_state_slots)")
        })?;
        Ok(super::StateSnapshot {
            position: st.pos,
            bytes: self.state_bytes_per_slot(),
            data: Box::new(CpuStateCopy {
                layers: st.layers.clone(),
            }),
        })
    }

    fn restore_state(&mut self, slot: u32, snap: &super::StateSnapshot) -> anyhow::Result<()> {
        let n = self.states.len();
        let want = self.weights.config.num_gdn_layers();
        let copy = snap
            .data
            .downcast_ref::<CpuStateCopy>()
            .context("a state snapshot of another backend cannot be restored on the CPU")?;
        anyhow::ensure!(
            copy.layers.len() == want,
            "a state snapshot of {} Gated-DeltaNet layers; this model has {want}",
            copy.layers.len()
        );
        let st = self.states.get_mut(slot as usize).with_context(|| {
            format!("state slot {slot} to restore; the backend has {n} (init_state_slots)")
        })?;
        st.layers = copy.layers.clone();
        st.pos = snap.position;
        // A draft-verification snapshot of the overwritten state no longer applies.
        st.snap = None;
        Ok(())
    }

    fn forward(&mut self, batch: &ForwardBatch) -> anyhow::Result<Logits> {
        let kv = self.kv.as_mut().context("forward before init_kv_cache")?;
        prepare_states(
            &self.weights,
            &mut self.states,
            batch,
            self.threads,
            self.gpu_rounding,
        )?;
        forward_impl(
            &self.weights,
            &self.inv_freq,
            kv,
            &mut self.states,
            batch,
            self.threads,
            (self.gpu_rounding, self.emulate_w4a4),
        )
    }
}

/// Refuse a host allocation larger than the available memory (instead of letting the allocator
/// abort the process), naming what and the flag that sizes it.
fn check_host_memory(bytes: u128, what: &str, flag: &str) -> anyhow::Result<()> {
    let available = sysinfo::System::new_with_specifics(
        sysinfo::RefreshKind::nothing()
            .with_memory(sysinfo::MemoryRefreshKind::nothing().with_ram()),
    )
    .map(|s| s.available_memory() as u128)
    .unwrap_or(u128::MAX);
    if bytes > available {
        return Err(crate::RigError::flag(
            flag,
            format!(
                "the CPU backend's {what} needs {} of host memory but only {} is available; choose a smaller {flag}",
                crate::output::table::human_bytes(bytes.min(u64::MAX as u128) as u64),
                crate::output::table::human_bytes(available.min(u64::MAX as u128) as u64)
            ),
        )
        .into());
    }
    Ok(())
}

/// Bring every hybrid segment's state slot to its `first_pos` before the pass: reset at 0,
/// continue where the slot ended, or roll back inside the slot's last multi-logit segment
/// (restore the snapshot and replay the kept tokens); then take a snapshot for segments that
/// produce more than one logit row (draft verification).
fn prepare_states(
    w: &ModelWeights,
    states: &mut [SlotState],
    batch: &ForwardBatch,
    threads: usize,
    round: bool,
) -> anyhow::Result<()> {
    let Some(hy) = &w.config.hybrid else {
        return Ok(());
    };
    let d = GdnDims::from(hy);
    let mut seen = std::collections::HashSet::new();
    for s in &batch.seqs {
        let slot = s.state_slot as usize;
        anyhow::ensure!(
            slot < states.len(),
            "state slot {slot} of a batch segment; the backend has {} (init_state_slots)",
            states.len()
        );
        anyhow::ensure!(
            seen.insert(slot),
            "two segments of one batch use state slot {slot}"
        );
        let st = &mut states[slot];
        if s.first_pos == 0 {
            st.layers.iter_mut().for_each(GdnLayerState::reset);
            st.pos = 0;
            st.snap = None;
        } else if s.first_pos != st.pos {
            let snap = st.snap.take().filter(|p| {
                s.first_pos >= p.base && s.first_pos < st.pos && s.first_pos - p.base <= p.len
            });
            let Some(snap) = snap else {
                anyhow::bail!(
                    "state slot {slot} holds the state after {} tokens; a segment at position {} cannot continue it",
                    st.pos,
                    s.first_pos
                );
            };
            let keep = s.first_pos - snap.base;
            st.layers = snap.layers;
            let gdn_layers = w.layers.iter().filter_map(|l| l.gdn.as_ref());
            for ((g, state), (qkv, a, b)) in gdn_layers.zip(&mut st.layers).zip(&snap.inputs) {
                if keep > 0 {
                    gdn::mixer_core(
                        &d,
                        &g.params(),
                        &qkv[..keep * d.conv_dim()],
                        &a[..keep * d.nv],
                        &b[..keep * d.nv],
                        keep,
                        state,
                        Form::Recurrent,
                        round,
                        threads,
                    );
                }
            }
            st.pos = s.first_pos;
        }
        st.snap = (s.num_logits > 1).then(|| Snapshot {
            base: s.first_pos,
            len: s.len,
            layers: st.layers.clone(),
            inputs: Vec::new(),
        });
        st.pos = s.first_pos + s.len;
    }
    Ok(())
}

/// The delta-rule form of a segment of `len` tokens asking for `num_logits` rows: chunked for a
/// prefill chunk (several tokens, at most one logit row), recurrent otherwise (decode, and draft
/// verification: token by token, the recurrent form gives every row exactly what decoding that
/// token alone gives, so speculative greedy output equals plain greedy output and a rollback by
/// replay matches a sequence that never saw the rejected drafts, bit for bit).
fn form_for(len: usize, num_logits: usize) -> Form {
    if len > 1 && num_logits <= 1 {
        Form::Chunked(gdn::CHUNK)
    } else {
        Form::Recurrent
    }
}

fn forward_impl(
    w: &ModelWeights,
    inv_freq: &[f32],
    kv: &mut PagedKvStore,
    states: &mut [SlotState],
    batch: &ForwardBatch,
    threads: usize,
    (gpu_rounding, emulate_w4a4): (bool, bool),
) -> anyhow::Result<Logits> {
    let c = &w.config;
    let (h, t) = (c.hidden_size, batch.token_ids.len());
    let mut total = 0;
    for s in &batch.seqs {
        anyhow::ensure!(
            s.start == total && s.len > 0 && s.num_logits <= s.len,
            "malformed segment {s:?}"
        );
        total += s.len;
    }
    anyhow::ensure!(total == t, "segments cover {total} tokens of {t}");
    // Slots of every token, checked once.
    let mut slots = Vec::with_capacity(t);
    for s in &batch.seqs {
        for i in 0..s.len {
            slots.push(kv.slot(&s.block_table, s.first_pos + i)?);
        }
    }
    // Embedding lookup.
    let mut x = vec![0f32; t * h];
    for (i, &id) in batch.token_ids.iter().enumerate() {
        anyhow::ensure!(
            (id as usize) < c.vocab_size,
            "token id {id} is outside the vocabulary ({})",
            c.vocab_size
        );
        w.embed
            .dequantize_row(id as usize, &mut x[i * h..(i + 1) * h]);
    }
    let p = Pass {
        c,
        batch,
        inv_freq,
        slots: &slots,
        shape: AttnShape {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        },
        group: c.num_heads / c.num_kv_heads,
        gated: c.attn_output_gate(),
        threads,
        gpu_rounding,
        emulate_w4a4,
    };
    let mut hbuf = vec![0f32; t * h];
    let (mut kctx, mut vctx) = (Vec::new(), Vec::new());
    let (mut kv_layer, mut gdn_layer) = (0usize, 0usize);
    for layer in &w.layers {
        for i in 0..t {
            rms_norm(
                &x[i * h..(i + 1) * h],
                &layer.input_norm,
                c.rms_norm_eps,
                &mut hbuf[i * h..(i + 1) * h],
            );
        }
        p.r(&mut hbuf);
        if let Some(g) = &layer.gdn {
            gdn_mixer_layer(&p, g, states, gdn_layer, &hbuf, &mut x)?;
            gdn_layer += 1;
        } else {
            let li = kv_layer;
            kv_layer += 1;
            attention_layer(&p, layer, li, kv, &hbuf, (&mut kctx, &mut vctx), &mut x)?;
        }
        mlp_layer(&p, layer, &mut hbuf, &mut x);
    }
    Ok(final_logits(&p, w, &x))
}

/// What every layer of one CPU forward pass reads: the config, the batch, the RoPE frequencies,
/// the KV-cache slot of every token, the attention shape, and the pass's numeric choices.
struct Pass<'a> {
    c: &'a ModelConfig,
    batch: &'a ForwardBatch,
    inv_freq: &'a [f32],
    /// The KV-cache slot of every token of the batch, in batch order.
    slots: &'a [usize],
    shape: AttnShape,
    /// Query heads per KV head.
    group: usize,
    /// q_proj also emits an output gate per head (Qwen3.5 attention).
    gated: bool,
    threads: usize,
    /// BF16 rounding at the CUDA backend's rounding points.
    gpu_rounding: bool,
    /// NVFP4 matmuls quantize their activations to NVFP4 (emulated W4A4).
    emulate_w4a4: bool,
}

impl Pass<'_> {
    /// BF16 rounding at the CUDA backend's rounding points (identity unless `gpu_rounding`).
    #[inline]
    fn r(&self, v: &mut [f32]) {
        if self.gpu_rounding {
            v.iter_mut()
                .for_each(|x| *x = crate::formats::bf16_round(*x));
        }
    }

    /// `x · Wᵀ` for `m` rows (activations quantized to NVFP4 first when emulating W4A4), rounded
    /// as [`Pass::r`].
    #[inline]
    fn mm(&self, x: &[f32], m: usize, l: &Linear) -> Vec<f32> {
        let mut y = match l {
            Linear::Nvfp4(w) if self.emulate_w4a4 => {
                matmul(&quantize_activations_nvfp4(x, w.k), m, l, self.threads)
            }
            _ => matmul(x, m, l, self.threads),
        };
        self.r(&mut y);
        y
    }
}

/// A Gated-DeltaNet layer (the `gdn_layer`-th): its projections, the delta rule per segment on
/// its state slot (inputs kept for a snapshot), the gated norm, out_proj added to `x`.
fn gdn_mixer_layer(
    p: &Pass,
    g: &GdnWeights,
    states: &mut [SlotState],
    gdn_layer: usize,
    hbuf: &[f32],
    x: &mut [f32],
) -> anyhow::Result<()> {
    let (c, t) = (p.c, p.batch.token_ids.len());
    // Gated-DeltaNet mixer.
    let d = GdnDims::from(
        c.hybrid
            .as_ref()
            .context("a Gated-DeltaNet layer in a dense config")?,
    );
    let qkv = p.mm(hbuf, t, &g.qkv);
    let z = p.mm(hbuf, t, &g.z);
    let a = p.mm(hbuf, t, &g.a);
    let b = p.mm(hbuf, t, &g.b);
    let (cd, vd, nv) = (d.conv_dim(), d.value_dim(), d.nv);
    let mut o = vec![0f32; t * vd];
    for s in &p.batch.seqs {
        let st = &mut states[s.state_slot as usize];
        let (r0, r1) = (s.start, s.start + s.len);
        let (sq, sa, sb) = (
            &qkv[r0 * cd..r1 * cd],
            &a[r0 * nv..r1 * nv],
            &b[r0 * nv..r1 * nv],
        );
        if let Some(snap) = &mut st.snap {
            snap.inputs.push((sq.to_vec(), sa.to_vec(), sb.to_vec()));
        }
        let out = gdn::mixer_core(
            &d,
            &g.params(),
            sq,
            sa,
            sb,
            s.len,
            &mut st.layers[gdn_layer],
            form_for(s.len, s.num_logits),
            p.gpu_rounding,
            p.threads,
        );
        o[r0 * vd..r1 * vd].copy_from_slice(&out);
    }
    gdn::gated_rms_norm(&mut o, &z, &g.norm, d.dv, c.rms_norm_eps);
    p.r(&mut o);
    let out = p.mm(&o, t, &g.out);
    for (a, b) in x.iter_mut().zip(&out) {
        *a += b;
    }
    Ok(())
}

/// A full-attention layer (KV layer `li`): q/k/v projections, the output gate split off q
/// (gated layers), q/k norm and RoPE with K/V stored, attention over the cache, the gate, and
/// o_proj added to `x`. `kctx`/`vctx` are the gather buffers, reused across layers.
fn attention_layer(
    p: &Pass,
    layer: &LayerWeights,
    li: usize,
    kv: &mut PagedKvStore,
    hbuf: &[f32],
    (kctx, vctx): (&mut Vec<f32>, &mut Vec<f32>),
    x: &mut [f32],
) -> anyhow::Result<()> {
    let (c, t) = (p.c, p.batch.token_ids.len());
    let (qd, hd) = (c.q_dim(), c.head_dim);
    let qp = p.mm(hbuf, t, &layer.q);
    let mut k = p.mm(hbuf, t, &layer.k);
    let v = p.mm(hbuf, t, &layer.v);
    // q_proj of a gated layer emits, per head, head_dim query values then head_dim gate
    // values (transformers' `view(..., -1, 2 · head_dim)` then `chunk(2)`).
    let (mut q, gate) = if p.gated {
        let mut q = vec![0f32; t * qd];
        let mut gt = vec![0f32; t * qd];
        for ti in 0..t {
            for hh in 0..c.num_heads {
                let src = ti * 2 * qd + hh * 2 * hd;
                let dst = ti * qd + hh * hd;
                q[dst..dst + hd].copy_from_slice(&qp[src..src + hd]);
                gt[dst..dst + hd].copy_from_slice(&qp[src + hd..src + 2 * hd]);
            }
        }
        (q, Some(gt))
    } else {
        (qp, None)
    };
    rope_and_store(p, layer, li, kv, &mut q, &mut k, &v);
    let mut attn = attend(p, li, kv, &q, kctx, vctx)?;
    p.r(&mut attn);
    if let Some(gt) = &gate {
        // Output gate: attn · sigmoid(gate) (transformers' Qwen3_5Attention).
        for (a, gv) in attn.iter_mut().zip(gt) {
            *a *= gdn::sigmoid(*gv);
        }
        p.r(&mut attn);
    }
    let o = p.mm(&attn, t, &layer.o);
    for (a, b) in x.iter_mut().zip(&o) {
        *a += b;
    }
    Ok(())
}

/// Per-head q/k norm (Qwen3) and RoPE (over the first rotary_dim dimensions) of every token,
/// then its K/V stored in the cache of KV layer `li`.
fn rope_and_store(
    p: &Pass,
    layer: &LayerWeights,
    li: usize,
    kv: &mut PagedKvStore,
    q: &mut [f32],
    k: &mut [f32],
    v: &[f32],
) {
    let (c, inv_freq) = (p.c, p.inv_freq);
    let (qd, kvd, hd) = (c.q_dim(), c.kv_dim(), c.head_dim);
    for s in &p.batch.seqs {
        for i in 0..s.len {
            let ti = s.start + i;
            let pos = s.first_pos + i;
            for hh in 0..c.num_heads {
                let qh = &mut q[ti * qd + hh * hd..ti * qd + (hh + 1) * hd];
                if let Some(nw) = &layer.q_norm {
                    rms_norm_inplace(qh, nw, c.rms_norm_eps);
                }
                apply_rope(qh, pos, inv_freq);
                p.r(qh);
            }
            for hh in 0..c.num_kv_heads {
                let kh = &mut k[ti * kvd + hh * hd..ti * kvd + (hh + 1) * hd];
                if let Some(nw) = &layer.k_norm {
                    rms_norm_inplace(kh, nw, c.rms_norm_eps);
                }
                apply_rope(kh, pos, inv_freq);
            }
            kv.write(
                li,
                p.slots[ti],
                &k[ti * kvd..(ti + 1) * kvd],
                &v[ti * kvd..(ti + 1) * kvd],
            );
        }
    }
}

/// Attention of every segment's queries `q` over all its positions (the new ones included),
/// read back from the cache of KV layer `li`; heads split over threads when the work is large.
fn attend(
    p: &Pass,
    li: usize,
    kv: &PagedKvStore,
    q: &[f32],
    kctx: &mut Vec<f32>,
    vctx: &mut Vec<f32>,
) -> anyhow::Result<Vec<f32>> {
    let (c, t, threads) = (p.c, p.batch.token_ids.len(), p.threads);
    let (qd, hd) = (c.q_dim(), c.head_dim);
    let (shape, group) = (p.shape, p.group);
    let mut attn = vec![0f32; t * qd];
    for s in &p.batch.seqs {
        let ctx = s.first_pos + s.len;
        kv.gather(li, &s.block_table, ctx, kctx, vctx)?;
        let (kctx, vctx): (&[f32], &[f32]) = (kctx, vctx);
        let work = s.len * ctx * qd;
        let nt = if work < PAR_MIN_WORK {
            1
        } else {
            threads.min(c.num_heads)
        };
        let per = c.num_heads.div_ceil(nt);
        let run = |h0: usize, h1: usize, out: &mut [f32]| {
            // out: [s.len, (h1 - h0) · hd]
            let width = (h1 - h0) * hd;
            let mut scores = vec![0f32; ctx];
            for i in 0..s.len {
                let ti = s.start + i;
                let pos = s.first_pos + i;
                for hh in h0..h1 {
                    let qh = &q[ti * qd + hh * hd..ti * qd + (hh + 1) * hd];
                    let o = &mut out[i * width + (hh - h0) * hd..i * width + (hh - h0 + 1) * hd];
                    attend_one(qh, kctx, vctx, shape, hh / group, pos, &mut scores, o);
                }
            }
        };
        if nt == 1 {
            run(
                0,
                c.num_heads,
                &mut attn[s.start * qd..(s.start + s.len) * qd],
            );
        } else {
            let parts: Vec<(usize, usize, Vec<f32>)> = std::thread::scope(|sc| {
                let hs: Vec<_> = (0..nt)
                    .map(|i| {
                        let (h0, h1) = (i * per, ((i + 1) * per).min(c.num_heads));
                        let run = &run;
                        sc.spawn(move || {
                            let mut local = vec![0f32; s.len * h1.saturating_sub(h0) * hd];
                            if h1 > h0 {
                                run(h0, h1, &mut local);
                            }
                            (h0, h1, local)
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                    .collect()
            });
            for (h0, h1, local) in parts {
                let width = (h1 - h0) * hd;
                for i in 0..s.len {
                    let dst = (s.start + i) * qd + h0 * hd;
                    attn[dst..dst + width].copy_from_slice(&local[i * width..(i + 1) * width]);
                }
            }
        }
    }
    Ok(attn)
}

/// The MLP of a layer: post-attention norm into `hbuf`, SwiGLU (or the sparse block of a
/// mixture-of-experts layer, `crate::runtime::moe`), down_proj added to `x`.
fn mlp_layer(p: &Pass, layer: &LayerWeights, hbuf: &mut [f32], x: &mut [f32]) {
    let (c, t) = (p.c, p.batch.token_ids.len());
    let h = c.hidden_size;
    for i in 0..t {
        rms_norm(
            &x[i * h..(i + 1) * h],
            &layer.post_norm,
            c.rms_norm_eps,
            &mut hbuf[i * h..(i + 1) * h],
        );
    }
    p.r(hbuf);
    if let (Some(moe), Some(cfg)) = (&layer.moe, &c.moe) {
        let ops = crate::runtime::moe::Ops {
            mm: &|x: &[f32], m: usize, l: &Linear| p.mm(x, m, l),
            round: &|v: &mut [f32]| p.r(v),
        };
        let (y, _) = crate::runtime::moe::moe_block(&ops, cfg, moe, hbuf, t, h);
        for (a, b) in x.iter_mut().zip(&y) {
            *a += b;
        }
        return;
    }
    let mut g = p.mm(hbuf, t, &layer.gate);
    let u = p.mm(hbuf, t, &layer.up);
    for (a, b) in g.iter_mut().zip(&u) {
        *a = silu(*a) * b;
    }
    p.r(&mut g);
    let d = p.mm(&g, t, &layer.down);
    for (a, b) in x.iter_mut().zip(&d) {
        *a += b;
    }
}

/// Final norm and lm_head on the rows that need logits.
fn final_logits(p: &Pass, w: &ModelWeights, x: &[f32]) -> Logits {
    let c = p.c;
    let h = c.hidden_size;
    let rows: Vec<usize> = p
        .batch
        .seqs
        .iter()
        .flat_map(|s| (s.start + s.len - s.num_logits)..(s.start + s.len))
        .collect();
    let mut hn = vec![0f32; rows.len() * h];
    for (r, &ti) in rows.iter().enumerate() {
        rms_norm(
            &x[ti * h..(ti + 1) * h],
            &w.norm,
            c.rms_norm_eps,
            &mut hn[r * h..(r + 1) * h],
        );
    }
    p.r(&mut hn);
    let data = matmul(&hn, rows.len(), w.lm_head(), p.threads);
    Logits {
        vocab: c.vocab_size,
        data,
    }
}

#[cfg(test)]
mod tests {
    //! The CPU forward pass against a naive reference: contiguous (unpaged) f64 attention,
    //! textbook loops, dequantized weights, written independently of the backend's code.
    use super::*;

    use crate::runtime::backend::SeqSegment;
    use crate::runtime::config::KvCacheDtype;
    use crate::runtime::config::ModelConfig;
    use crate::runtime::weights::synthesize;

    /// The GEMM layer's CPU reference of per-token FP8 quantization (`gemm::fp8_quant`, the rule
    /// of the CUDA backend's quantization kernel) agrees with the runtime's CPU quantization.
    #[test]
    fn quant_row_is_the_runtimes_rule() {
        let x: Vec<f32> = crate::formats::test_uniform(3, 64)
            .into_iter()
            .map(|u| crate::formats::bf16_round(u * 2.5))
            .collect();
        let (q, s) = crate::gemm::fp8_quant::quant_row(&x);
        let deq: Vec<f32> = q
            .iter()
            .map(|c| crate::formats::e4m3::decode(*c) * s)
            .collect();
        let cpu = quantize_activations_fp8(&x, 64, None);
        assert_eq!(deq, cpu);
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(s, amax / 448.0);
        // An all-zero row: scale 1, codes 0.
        let (q0, s0) = crate::gemm::fp8_quant::quant_row(&[0.0; 8]);
        assert_eq!((q0, s0), (vec![0u8; 8], 1.0));
        // A static input scale (ModelOpt `input_scale`): the GEMM layer's rule is the CPU's.
        let st = 0.0125f32;
        let cpu = quantize_activations_fp8(&x, 64, Some(st));
        let (q, s) = crate::gemm::fp8_quant::quant_row_with(&x, st);
        let deq: Vec<f32> = q
            .iter()
            .map(|c| crate::formats::e4m3::decode(*c) * s)
            .collect();
        assert_eq!((deq, s), (cpu, st));
    }

    /// Reference decoder over a whole sequence, returning logits for every position.
    /// `act_fp8` applies W8A8's dynamic per-token activation quantization before FP8 matmuls;
    /// `kv_fp8` rounds K and V through E4M3 with scale 1.0 as the FP8 KV cache stores them;
    /// otherwise K/V are rounded to BF16 as the BF16 cache stores them.
    fn reference(w: &ModelWeights, tokens: &[u32], kv_fp8: bool) -> Vec<Vec<f64>> {
        let c = &w.config;
        let (h, hd) = (c.hidden_size, c.head_dim);
        let n = tokens.len();
        let deq = |l: &Linear| -> (Vec<f32>, usize, usize, bool, Option<f32>) {
            let (rows, cols) = l.shape();
            let (is8, is) = match l {
                Linear::Fp8 { input_scale, .. } => (true, *input_scale),
                _ => (false, None),
            };
            (l.dequantize(), rows, cols, is8, is)
        };
        let mm = |x: &[Vec<f64>], l: &Linear| -> Vec<Vec<f64>> {
            let (wd, rows, cols, is8, is) = deq(l);
            x.iter()
                .map(|xr| {
                    let xr: Vec<f64> = if is8 {
                        // W8A8: per-token dynamic scale amax/448 (or the static input scale),
                        // each activation rounded through E4M3, in the f32 arithmetic vLLM's
                        // quantization kernel (and the backend) uses: the E4M3 rounding is
                        // discontinuous, so an f64 scale would move every rounding boundary.
                        let x32: Vec<f32> = xr.iter().map(|v| *v as f32).collect();
                        quantize_activations_fp8(&x32, x32.len(), is)
                            .into_iter()
                            .map(f64::from)
                            .collect()
                    } else {
                        xr.clone()
                    };
                    (0..rows)
                        .map(|r| (0..cols).map(|j| wd[r * cols + j] as f64 * xr[j]).sum())
                        .collect()
                })
                .collect()
        };
        let norm = |x: &[f64], wgt: &[f32]| -> Vec<f64> {
            let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
            let inv = 1.0 / (ms + c.rms_norm_eps as f64).sqrt();
            x.iter()
                .zip(wgt)
                .map(|(v, g)| v * inv * *g as f64)
                .collect()
        };
        let rope = |x: &mut [f64], pos: usize| {
            let half = hd / 2;
            for i in 0..half {
                let f = 1.0 / (c.rope_theta as f64).powf(2.0 * i as f64 / hd as f64);
                let a = pos as f64 * f;
                let (x1, x2) = (x[i], x[i + half]);
                x[i] = x1 * a.cos() - x2 * a.sin();
                x[i + half] = x2 * a.cos() + x1 * a.sin();
            }
        };
        let store = |v: f64| -> f64 {
            if kv_fp8 {
                e4m3::round_trip(v as f32) as f64
            } else {
                crate::formats::bf16_round(v as f32) as f64
            }
        };
        let emb = w.embed.dequantize();
        let mut x: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| {
                emb[t as usize * h..(t as usize + 1) * h]
                    .iter()
                    .map(|v| *v as f64)
                    .collect()
            })
            .collect();
        for l in &w.layers {
            let hn: Vec<Vec<f64>> = x.iter().map(|r| norm(r, &l.input_norm)).collect();
            let mut q = mm(&hn, &l.q);
            let mut k = mm(&hn, &l.k);
            let mut v = mm(&hn, &l.v);
            for p in 0..n {
                for hh in 0..c.num_heads {
                    let s = &mut q[p][hh * hd..(hh + 1) * hd];
                    if let Some(nw) = &l.q_norm {
                        let y = norm(s, nw);
                        s.copy_from_slice(&y);
                    }
                    rope(s, p);
                }
                for hh in 0..c.num_kv_heads {
                    let s = &mut k[p][hh * hd..(hh + 1) * hd];
                    if let Some(nw) = &l.k_norm {
                        let y = norm(s, nw);
                        s.copy_from_slice(&y);
                    }
                    rope(s, p);
                }
                k[p].iter_mut().for_each(|e| *e = store(*e));
                v[p].iter_mut().for_each(|e| *e = store(*e));
            }
            let group = c.num_heads / c.num_kv_heads;
            let attn: Vec<Vec<f64>> = (0..n)
                .map(|p| {
                    let mut out = vec![0f64; c.q_dim()];
                    for hh in 0..c.num_heads {
                        let g = hh / group;
                        let qh = &q[p][hh * hd..(hh + 1) * hd];
                        let sc: Vec<f64> = (0..=p)
                            .map(|t| {
                                qh.iter()
                                    .zip(&k[t][g * hd..(g + 1) * hd])
                                    .map(|(a, b)| a * b)
                                    .sum::<f64>()
                                    / (hd as f64).sqrt()
                            })
                            .collect();
                        let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                        let z: f64 = e.iter().sum();
                        for t in 0..=p {
                            for j in 0..hd {
                                out[hh * hd + j] += e[t] / z * v[t][g * hd + j];
                            }
                        }
                    }
                    out
                })
                .collect();
            let o = mm(&attn, &l.o);
            for p in 0..n {
                for j in 0..h {
                    x[p][j] += o[p][j];
                }
            }
            let hn: Vec<Vec<f64>> = x.iter().map(|r| norm(r, &l.post_norm)).collect();
            let g = mm(&hn, &l.gate);
            let u = mm(&hn, &l.up);
            let act: Vec<Vec<f64>> = g
                .iter()
                .zip(&u)
                .map(|(gr, ur)| {
                    gr.iter()
                        .zip(ur)
                        .map(|(a, b)| a / (1.0 + (-a).exp()) * b)
                        .collect()
                })
                .collect();
            let d = mm(&act, &l.down);
            for p in 0..n {
                for j in 0..h {
                    x[p][j] += d[p][j];
                }
            }
        }
        let hn: Vec<Vec<f64>> = x.iter().map(|r| norm(r, &w.norm)).collect();
        mm(&hn, w.lm_head())
    }

    fn run_backend(
        w: &ModelWeights,
        tokens: &[u32],
        table: Vec<u32>,
        dtype: KvCacheDtype,
        threads: usize,
    ) -> Logits {
        let mut b = CpuBackend::new(w.clone(), threads);
        b.init_kv_cache(KvCacheSpec {
            num_blocks: 16,
            block_size: 4,
            dtype,
        })
        .unwrap();
        b.forward(&ForwardBatch {
            token_ids: tokens.to_vec(),
            seqs: vec![SeqSegment {
                start: 0,
                len: tokens.len(),
                first_pos: 0,
                block_table: table,
                num_logits: tokens.len(),
                state_slot: 0,
            }],
        })
        .unwrap()
    }

    /// Largest |a − b| over all logits divided by the RMS of the reference logits.
    fn rel_max_err(got: &Logits, want: &[Vec<f64>]) -> f64 {
        let mut max = 0f64;
        let mut ss = 0f64;
        let mut cnt = 0f64;
        for (r, row) in want.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                max = max.max((got.row(r)[j] as f64 - v).abs());
                ss += v * v;
                cnt += 1.0;
            }
        }
        max / (ss / cnt).sqrt()
    }

    const PROMPT: [u32; 11] = [257, 117, 115, 101, 114, 10, 104, 105, 258, 10, 259];

    /// f32 backend vs f64 reference on identical weights: the only differences are f32 rounding
    /// in sums of at most 192 terms (K of down_proj) through 2 layers, about 1e-6 relative each;
    /// 1e-4 of the logits' RMS leaves two orders of magnitude of margin and still catches any
    /// real error (a wrong norm weight or RoPE position moves logits by >1e-2 of their RMS).
    const TIGHT_REL_TOL: f64 = 1e-4;

    #[test]
    fn bf16_forward_matches_reference() {
        let w = synthesize(&ModelConfig::tiny(), 11);
        let want = reference(&w, &PROMPT, false);
        let got = run_backend(&w, &PROMPT, vec![0, 1, 2], KvCacheDtype::Bf16, 1);
        let e = rel_max_err(&got, &want);
        assert!(e < TIGHT_REL_TOL, "BF16 relative max error {e}");
        // The check has teeth: a different seed is far away.
        let other = reference(&synthesize(&ModelConfig::tiny(), 12), &PROMPT, false);
        assert!(rel_max_err(&got, &other) > 0.1);
    }

    /// Relative RMS error: ‖got − want‖₂ / ‖want‖₂ over all logits.
    fn rel_rms_err(got: &Logits, want: &[Vec<f64>]) -> f64 {
        let (mut num, mut den) = (0f64, 0f64);
        for (r, row) in want.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                num += (got.row(r)[j] as f64 - v).powi(2);
                den += v * v;
            }
        }
        (num / den).sqrt()
    }

    #[test]
    fn nvfp4_forward_matches_reference_on_dequantized_weights() {
        // W4A16 dequantizes weights only: the forward pass is continuous in its inputs, so the
        // same tight tolerance as BF16 applies.
        let mut w = synthesize(&ModelConfig::tiny(), 11);
        w.quantize(WeightFormat::Nvfp4).unwrap();
        let want = reference(&w, &PROMPT, false);
        let got = run_backend(&w, &PROMPT, vec![3, 7, 1], KvCacheDtype::Bf16, 1);
        let e = rel_max_err(&got, &want);
        assert!(e < TIGHT_REL_TOL, "NVFP4: relative max error {e}");
    }

    #[test]
    fn fp8_w8a8_matmul_matches_naive() {
        // On identical f32 inputs, the W8A8 matmul equals the naive product of dequantized
        // weights and E4M3-rounded activations up to f32 summation order.
        let mut w = synthesize(&ModelConfig::tiny(), 11);
        w.quantize(WeightFormat::Fp8).unwrap();
        for l in [&w.layers[0].gate, &w.layers[1].down] {
            let (n, k) = l.shape();
            let m = 5;
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i as f32) * 0.37).sin() * (1 + i % 7) as f32)
                .collect();
            let y = matmul(&x, m, l, 1);
            let wd = l.dequantize();
            for i in 0..m {
                let row = &x[i * k..(i + 1) * k];
                let amax = row.iter().fold(0f32, |a, v| a.max(v.abs()));
                let s = amax / 448.0;
                let xq: Vec<f64> = row
                    .iter()
                    .map(|v| (e4m3::round_trip(v / s) * s) as f64)
                    .collect();
                for j in 0..n {
                    let r: f64 = (0..k).map(|t| wd[j * k + t] as f64 * xq[t]).sum();
                    assert!(
                        (r - y[i * n + j] as f64).abs() < 1e-4 * (1.0 + r.abs()),
                        "[{i},{j}] {r} vs {}",
                        y[i * n + j]
                    );
                }
            }
        }
    }

    /// FP8 W8A8 forward vs the f64 reference with the same weights and the same activation
    /// quantization (done in f32, as the backend and vLLM's kernel do), per position. Rounding
    /// activations to E4M3 is discontinuous: an activation that the f32 backend and the f64
    /// reference compute a few ulps apart can round to neighbouring E4M3 values (a 2⁻³ relative
    /// step), and such a flip changes that position's logits by a few percent and, through the
    /// KV cache, every later position. On this preset (seed 11) the first flip happens at
    /// position 2 (measured 2e-7 at positions 0 and 1, then 2–9%). So: the positions before the
    /// first flip agree to f32 rounding (`FP8_SAME_ROW_TOL`), there are at least two of them,
    /// and no position is off by more than `FP8_FLIP_ROW_TOL`. That activation quantization is
    /// applied at all is checked exactly by the matmul-level test above.
    const FP8_SAME_ROW_TOL: f64 = 1e-5;
    /// See [`FP8_SAME_ROW_TOL`].
    const FP8_FLIP_ROW_TOL: f64 = 0.15;

    #[test]
    fn fp8_forward_matches_reference_within_flip_tolerance() {
        let mut w = synthesize(&ModelConfig::tiny(), 11);
        w.quantize(WeightFormat::Fp8).unwrap();
        let want = reference(&w, &PROMPT, false);
        let got = run_backend(&w, &PROMPT, vec![3, 7, 1], KvCacheDtype::Bf16, 1);
        let rows: Vec<f64> = (0..want.len())
            .map(|r| {
                let (mut num, mut den) = (0f64, 0f64);
                for (j, v) in want[r].iter().enumerate() {
                    num += (got.row(r)[j] as f64 - v).powi(2);
                    den += v * v;
                }
                (num / den).sqrt()
            })
            .collect();
        let exact_prefix = rows.iter().take_while(|e| **e < FP8_SAME_ROW_TOL).count();
        assert!(
            exact_prefix >= 2,
            "FP8: the first positions must match the reference to f32 rounding: {rows:?}"
        );
        assert!(
            rows.iter().all(|e| *e < FP8_FLIP_ROW_TOL),
            "FP8: a position is off by more than E4M3 flips explain: {rows:?}"
        );
    }

    /// FP8 W8A8 vs the BF16 model (relative RMS error of all logits). E4M3 keeps 3 mantissa
    /// bits: a rounded operand carries a uniform relative error of up to 2⁻⁴ (RMS 2⁻⁴/√3 ≈
    /// 3.6%); with both weights and activations rounded each projection output is off by about
    /// 5%, and seven projections per layer through 2 layers give a measured 14% on this preset
    /// (seed 11). 0.25 bounds that with margin.
    const FP8_VS_BF16_REL_TOL: f64 = 0.25;
    /// NVFP4 W4A16 vs the BF16 model (relative RMS error of all logits). E2M1 has one mantissa
    /// bit; with a 16-element block scale the weight error is about 9% RMS on Gaussian weights
    /// (the formats module bounds it by 12% on uniform data); through 2 layers the measured
    /// error on this preset (seed 11) is 31%. 0.5 bounds it with margin.
    const NVFP4_VS_BF16_REL_TOL: f64 = 0.5;
    /// Both formats must visibly change the logits (so the tolerance tests cannot pass on a
    /// backend that silently ignored the quantization): at least 2% relative RMS.
    const MIN_QUANT_EFFECT: f64 = 0.02;

    #[test]
    fn quantized_forward_within_named_tolerances_of_bf16() {
        let w = synthesize(&ModelConfig::tiny(), 11);
        let want = reference(&w, &PROMPT, false);
        for (fmt, tol) in [
            (WeightFormat::Fp8, FP8_VS_BF16_REL_TOL),
            (WeightFormat::Nvfp4, NVFP4_VS_BF16_REL_TOL),
        ] {
            let mut q = w.clone();
            q.quantize(fmt).unwrap();
            let got = run_backend(&q, &PROMPT, vec![0, 1, 2], KvCacheDtype::Bf16, 1);
            let e = rel_rms_err(&got, &want);
            assert!(
                e < tol,
                "{fmt:?} vs BF16: relative RMS error {e} (tolerance {tol})"
            );
            assert!(e > MIN_QUANT_EFFECT, "{fmt:?} had no visible effect: {e}");
        }
    }

    /// FP8 E4M3 KV cache at scale 1.0 vs a reference that rounds K/V through E4M3 the same way:
    /// tight, as only f32 summation order differs.
    #[test]
    fn fp8_kv_cache_matches_reference() {
        let w = synthesize(&ModelConfig::tiny(), 5);
        let want = reference(&w, &PROMPT, true);
        let got = run_backend(&w, &PROMPT, vec![0, 1, 2], KvCacheDtype::Fp8, 1);
        let e = rel_max_err(&got, &want);
        assert!(e < TIGHT_REL_TOL, "FP8 KV relative max error {e}");
    }

    #[test]
    fn paged_equals_contiguous_and_threads_do_not_matter() {
        let w = synthesize(&ModelConfig::tiny(), 2);
        let contiguous = run_backend(&w, &PROMPT, vec![0, 1, 2], KvCacheDtype::Bf16, 1);
        let scattered = run_backend(&w, &PROMPT, vec![13, 4, 9], KvCacheDtype::Bf16, 1);
        assert_eq!(contiguous, scattered);
        let threaded = run_backend(&w, &PROMPT, vec![9, 4, 13], KvCacheDtype::Bf16, 3);
        assert_eq!(contiguous, threaded);
    }

    #[test]
    fn chunked_prefill_and_decode_equal_one_pass() {
        let w = synthesize(&ModelConfig::tiny(), 2);
        let full = run_backend(&w, &PROMPT, vec![0, 1, 2], KvCacheDtype::Bf16, 1);
        let mut b = CpuBackend::new(w, 1);
        b.init_kv_cache(KvCacheSpec {
            num_blocks: 8,
            block_size: 4,
            dtype: KvCacheDtype::Bf16,
        })
        .unwrap();
        let table = vec![5u32, 2, 7];
        let mut rows = Vec::new();
        // Chunk of 5, then 4, then 2 single-token steps, batched with an unrelated sequence.
        let mut start = 0;
        for len in [5usize, 4, 1, 1] {
            let seg = SeqSegment {
                start: 0,
                len,
                first_pos: start,
                block_table: table.clone(),
                num_logits: len,
                state_slot: 0,
            };
            let other = SeqSegment {
                start: len,
                len: 3,
                first_pos: 0,
                block_table: vec![0],
                num_logits: 1,
                state_slot: 1,
            };
            let mut toks = PROMPT[start..start + len].to_vec();
            toks.extend([1u32, 2, 3]);
            let out = b
                .forward(&ForwardBatch {
                    token_ids: toks,
                    seqs: vec![seg, other],
                })
                .unwrap();
            for r in 0..len {
                rows.push(out.row(r).to_vec());
            }
            start += len;
        }
        for (r, row) in rows.iter().enumerate() {
            assert_eq!(row.as_slice(), full.row(r), "row {r}");
        }
    }

    #[test]
    fn prefix_cache_hit_gives_identical_logits() {
        // Sequence A computes an 8-token prefix (2 blocks of 4) and its own tail; sequence B
        // shares A's two prefix blocks, as a prefix-cache hit does, and computes only its tail.
        // B's logits equal B computed from scratch in its own blocks, bit for bit.
        let w = synthesize(&ModelConfig::tiny(), 4);
        let prefix = &PROMPT[..8];
        let b_tokens: Vec<u32> = prefix.iter().copied().chain([72, 73, 74]).collect();
        let scratch = run_backend(&w, &b_tokens, vec![0, 1, 2], KvCacheDtype::Bf16, 1);
        let mut b = CpuBackend::new(w, 1);
        b.init_kv_cache(KvCacheSpec {
            num_blocks: 16,
            block_size: 4,
            dtype: KvCacheDtype::Bf16,
        })
        .unwrap();
        let a_tokens: Vec<u32> = prefix.iter().copied().chain([40, 41]).collect();
        b.forward(&ForwardBatch {
            token_ids: a_tokens.clone(),
            seqs: vec![SeqSegment {
                start: 0,
                len: 10,
                first_pos: 0,
                block_table: vec![6, 9, 2],
                num_logits: 1,
                state_slot: 0,
            }],
        })
        .unwrap();
        let hit = b
            .forward(&ForwardBatch {
                token_ids: b_tokens[8..].to_vec(),
                seqs: vec![SeqSegment {
                    start: 0,
                    len: 3,
                    first_pos: 8,
                    block_table: vec![6, 9, 11],
                    num_logits: 3,
                    state_slot: 0,
                }],
            })
            .unwrap();
        for r in 0..3 {
            assert_eq!(hit.row(r), scratch.row(8 + r), "row {r}");
        }
    }

    #[test]
    fn bad_batches_are_errors_not_panics() {
        let w = synthesize(&ModelConfig::tiny(), 2);
        let mut b = CpuBackend::new(w, 1);
        let batch = ForwardBatch {
            token_ids: vec![1, 2],
            seqs: vec![SeqSegment {
                start: 0,
                len: 2,
                first_pos: 0,
                block_table: vec![0],
                num_logits: 1,
                state_slot: 0,
            }],
        };
        assert!(b.forward(&batch).is_err(), "no KV cache yet");
        b.init_kv_cache(KvCacheSpec {
            num_blocks: 2,
            block_size: 1,
            dtype: KvCacheDtype::Bf16,
        })
        .unwrap();
        assert!(b
            .forward(&batch)
            .unwrap_err()
            .to_string()
            .contains("does not cover"));
        let mut bad = batch.clone();
        bad.token_ids = vec![1, 9999];
        bad.seqs[0].block_table = vec![0, 1];
        assert!(b
            .forward(&bad)
            .unwrap_err()
            .to_string()
            .contains("vocabulary"));
        let mut bad = batch.clone();
        bad.seqs[0].block_table = vec![0, 5];
        assert!(b.forward(&bad).is_err());
    }
}
