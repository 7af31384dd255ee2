//! The CPU backend: the decoder in f32 on the host, weights dequantized on the fly row by row
//! inside the matmul (so BF16, FP8 and NVFP4 weights cost their real storage and carry their
//! real rounding), paged KV cache in host memory.
//!
//! Parallelism: matmuls split the N output rows across `std::thread::scope` threads, attention
//! splits heads; small problems stay on one thread. The split never changes a summation order,
//! so results are identical for any thread count and any batch composition.
//!
//! By concern: this file holds [`CpuBackend`], its [`Backend`] implementation and the
//! Gated-DeltaNet state slots of a hybrid (reset, continue, roll back by replay); `matmul` the
//! matmul over quantized weights and the activation quantization of W8A8 and emulated W4A4;
//! `forward` one forward pass, layer by layer; `tests` the forward pass against a naive
//! reference.

use anyhow::Context;

use super::{Backend, ForwardBatch, KvCacheSpec, Logits};
use crate::runtime::config::{ModelConfig, WeightFormat};
use crate::runtime::gdn::{self, Form, GdnDims, GdnLayerState};
use crate::runtime::kv_cache::PagedKvStore;
use crate::runtime::weights::ModelWeights;

mod forward;
mod matmul;
#[cfg(test)]
mod tests;

use forward::forward_impl;
pub use matmul::{matmul, quantize_activations_fp8, quantize_activations_nvfp4};

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
    /// The sparse layers' routes of the forward passes since [`Self::with_route_log`] (one
    /// entry per sparse layer and pass).
    route_log: Option<forward::RouteLog>,
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
            route_log: None,
        }
    }

    /// Record the routes of every sparse layer of the following forward passes (mixtures of
    /// experts; the routing parity check reads them with [`Self::take_routes`]).
    pub fn with_route_log(mut self) -> Self {
        self.route_log = Some(std::sync::Mutex::new(Vec::new()));
        self
    }

    /// The routes recorded since the last call: per sparse layer and pass, each token's route.
    pub fn take_routes(&self) -> Vec<Vec<crate::runtime::moe::Route>> {
        self.route_log
            .as_ref()
            .and_then(|m| m.lock().ok().map(|mut v| std::mem::take(&mut *v)))
            .unwrap_or_default()
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
            (
                self.gpu_rounding,
                self.emulate_w4a4,
                self.route_log.as_ref(),
            ),
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
