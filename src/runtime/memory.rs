//! Memory planning, as pure functions (no device calls; unit-tested on the CPU):
//!
//! - [`check_weights_fit`]: refuse a model whose weights exceed the free device memory before
//!   loading anything, naming both sizes;
//! - [`plan_kv`]: the KV-cache budget and block count. On a GPU it follows vLLM: budget =
//!   `--gpu-memory-utilization` × total memory − memory in use once the weights, activation
//!   buffers and workspace are resident (vLLM's "Available KV cache memory"; memory other
//!   processes hold counts as in use, as in vLLM). `--kv-cache-memory` sets the budget
//!   explicitly and wins over the utilization (as vLLM's `--kv-cache-memory-bytes` does); on the
//!   CPU backend the budget is `--kv-cache-memory` (default [`DEFAULT_CPU_KV_BYTES`]);
//! - [`kv_alloc_failure`]: the message for a KV allocation that failed (asked vs free);
//! - [`estimate_weight_bytes`]: bytes of a model's weights in a format, and the bytes one decode
//!   step reads ([`decode_step_bytes`]).

use serde::{Deserialize, Serialize};

use super::backend::DeviceMemory;
use super::config::{KvCacheDtype, ModelConfig, QuantRecipe, WeightFormat};
use super::kv_cache::{kv_bytes_per_block, KvCapacity};
use crate::output::table::{human_bytes, thousands};

/// The CPU backend's KV budget when `--kv-cache-memory` is not given: 512 MiB.
pub const DEFAULT_CPU_KV_BYTES: u64 = 512 << 20;

/// Default `--gpu-memory-utilization` (vLLM's).
pub const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;

/// Where the KV budget came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetSource {
    /// `--gpu-memory-utilization` × total − memory in use after load.
    GpuMemoryUtilization,
    /// `--kv-cache-memory` (explicit; wins over the utilization).
    KvCacheMemory,
    /// The CPU backend's default.
    CpuDefault,
}

/// The KV-cache plan of one engine start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvPlan {
    /// Bytes for the KV cache.
    pub budget_bytes: u64,
    /// Where the budget came from.
    pub source: BudgetSource,
    /// Bytes one block takes (K and V, all layers).
    pub bytes_per_block: u64,
    /// Blocks, tokens per block and request length.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Longest request.
    pub max_model_len: usize,
    /// `--gpu-memory-utilization` used (GPU only).
    pub gpu_memory_utilization: Option<f64>,
    /// Device memory facts the plan used (GPU only).
    pub device_memory: Option<DeviceMemorySnapshot>,
    /// Notes (which flag won, an ignored flag).
    pub notes: Vec<String>,
    /// Recurrent-state slots taken from the budget before the KV blocks (Gated-DeltaNet
    /// hybrids: one per sequence that may run at once; 0 for dense decoders).
    #[serde(default)]
    pub state_slots: usize,
    /// Bytes of one slot (all Gated-DeltaNet layers' convolution and delta-rule states).
    #[serde(default)]
    pub state_bytes_per_slot: u64,
    /// Layers with a KV cache, and Gated-DeltaNet layers (what "KV cache size" counts).
    #[serde(default)]
    pub layers: Option<(usize, usize)>,
}

/// The recurrent state a hybrid's plan reserves: one slot per running sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSpec {
    /// Bytes of one sequence's state ([`super::backend::Backend::state_bytes_per_slot`]).
    pub bytes_per_slot: u64,
    /// `--max-num-seqs`: slots wanted (fewer are planned when the budget cannot hold them and
    /// one request of `max_model_len` tokens).
    pub max_num_seqs: usize,
}

/// Serializable copy of [`DeviceMemory`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMemorySnapshot {
    /// Total device memory, bytes.
    pub total: u64,
    /// Free when loading started.
    pub free_before_load: u64,
    /// Free after weights, activations and workspace.
    pub free_after_load: u64,
    /// Resident weights.
    pub weights: u64,
    /// Activation buffers.
    pub activations: u64,
    /// Library workspaces and graph pools.
    pub workspace: u64,
}

impl From<&DeviceMemory> for DeviceMemorySnapshot {
    fn from(m: &DeviceMemory) -> Self {
        DeviceMemorySnapshot {
            total: m.total,
            free_before_load: m.free_before_load,
            free_after_load: m.free_after_load,
            weights: m.weights,
            activations: m.activations,
            workspace: m.workspace,
        }
    }
}

impl KvPlan {
    /// The capacity this plan gives.
    pub fn capacity(&self) -> KvCapacity {
        KvCapacity {
            num_blocks: self.num_blocks,
            block_size: self.block_size,
            max_model_len: self.max_model_len,
        }
    }

    /// Tokens the cache holds.
    pub fn tokens(&self) -> usize {
        self.num_blocks * self.block_size
    }

    /// Requests of `max_model_len` that fit at once (vLLM: blocks / blocks per request); for
    /// a hybrid also at most its state slots.
    pub fn max_concurrency(&self) -> f64 {
        let kv = self.capacity().max_concurrency();
        if self.state_slots > 0 {
            kv.min(self.state_slots as f64)
        } else {
            kv
        }
    }

    /// The startup lines, in vLLM's form (`GPU KV cache size: N tokens`, `Maximum concurrency
    /// for L tokens per request: X.XXx`; the CPU backend says `CPU KV cache size`), preceded by
    /// the budget line (vLLM's `Available KV cache memory: X GiB`).
    pub fn lines(&self, device_kind: &str) -> Vec<String> {
        let mut v = vec![format!(
            "Available KV cache memory: {:.2} GiB ({})",
            self.budget_bytes as f64 / (1u64 << 30) as f64,
            match self.source {
                BudgetSource::GpuMemoryUtilization => format!(
                    "--gpu-memory-utilization {} × total − in use after load",
                    self.gpu_memory_utilization.unwrap_or(0.0)
                ),
                BudgetSource::KvCacheMemory => "--kv-cache-memory".to_string(),
                BudgetSource::CpuDefault =>
                    "CPU backend default; set --kv-cache-memory".to_string(),
            }
        )];
        v.push(format!(
            "{} KV cache size: {} tokens",
            if device_kind == "cpu" { "CPU" } else { "GPU" },
            thousands(self.tokens() as u64)
        ));
        v.push(format!(
            "Maximum concurrency for {} tokens per request: {:.2}x",
            thousands(self.max_model_len as u64),
            self.max_concurrency()
        ));
        if let (Some((attn, gdn)), true) = (self.layers, self.state_slots > 0) {
            use crate::output::table::plural;
            v.push(format!(
                "Hybrid model: the KV cache size counts tokens of the {} only; the {} keep a fixed state of {} per running sequence instead, {} slots ({} of the budget, --max-num-seqs {}), so the concurrency is also at most {}",
                plural(attn as u64, "full-attention layer", "full-attention layers"),
                plural(gdn as u64, "Gated-DeltaNet layer", "Gated-DeltaNet layers"),
                human_bytes(self.state_bytes_per_slot),
                self.state_slots,
                human_bytes(self.state_slots as u64 * self.state_bytes_per_slot),
                self.state_slots,
                self.state_slots
            ));
        }
        v.extend(self.notes.iter().cloned());
        v
    }
}

/// Refuse weights larger than the free device memory, before loading.
///
/// # Errors
/// A message naming both sizes and the fixes.
pub fn check_weights_fit(weight_bytes: u64, free_bytes: u64, device: &str) -> Result<(), String> {
    if weight_bytes > free_bytes {
        return Err(format!(
            "the weights need {} but {device} has {} free: not loading. Use a smaller model (--num-layers, a quantized checkpoint, --quantize fp8|nvfp4) or free the GPU",
            human_bytes(weight_bytes),
            human_bytes(free_bytes)
        ));
    }
    Ok(())
}

/// The message for a KV-cache allocation that failed.
pub fn kv_alloc_failure(asked: u64, free: u64, device: &str, cause: &str) -> String {
    format!(
        "allocating the KV cache failed on {device}: asked for {} with {} free ({cause}); lower --gpu-memory-utilization or --kv-cache-memory",
        human_bytes(asked),
        human_bytes(free)
    )
}

/// Plan the KV cache.
///
/// `memory` is `Some` for a GPU backend ([`super::backend::Backend::device_memory`]); `None`
/// for the CPU backend. `explicit` is `--kv-cache-memory`.
///
/// # Errors
/// A message naming the flag at fault: a utilization outside (0, 1]; a budget that is not
/// positive (the weights and buffers already use more than the utilization allows); an
/// explicit budget above the free memory; a budget that holds fewer tokens than one request of
/// `max_model_len` (vLLM refuses to start then too).
#[allow(clippy::too_many_arguments)]
pub fn plan_kv(
    config: &ModelConfig,
    memory: Option<&DeviceMemory>,
    gpu_memory_utilization: f64,
    explicit: Option<u64>,
    block_size: usize,
    dtype: KvCacheDtype,
    max_model_len: usize,
    utilization_given: bool,
) -> Result<KvPlan, String> {
    plan_memory(
        config,
        memory,
        gpu_memory_utilization,
        explicit,
        block_size,
        dtype,
        max_model_len,
        utilization_given,
        None,
    )
}

/// [`plan_kv`] for a model with a recurrent state (Gated-DeltaNet hybrids, `state` given): the
/// budget is computed the same way; `slots = min(--max-num-seqs, ⌊(budget − KV of one
/// max_model_len request) / state⌋)` state slots are taken from it first, and the rest is cut
/// into KV blocks (of the full-attention layers only). Fewer slots than asked leave a note.
///
/// # Errors
/// As [`plan_kv`], and a budget that cannot hold one sequence's state beside the KV of one
/// request of `max_model_len` tokens (both sizes named).
#[allow(clippy::too_many_arguments)]
pub fn plan_memory(
    config: &ModelConfig,
    memory: Option<&DeviceMemory>,
    gpu_memory_utilization: f64,
    explicit: Option<u64>,
    block_size: usize,
    dtype: KvCacheDtype,
    max_model_len: usize,
    utilization_given: bool,
    state: Option<StateSpec>,
) -> Result<KvPlan, String> {
    if !(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0) {
        return Err(format!(
            "--gpu-memory-utilization {gpu_memory_utilization} is not in (0, 1]"
        ));
    }
    let per_block = kv_bytes_per_block(config, block_size, dtype).max(1);
    let mut notes = Vec::new();
    let (budget, source) = match (memory, explicit) {
        (Some(m), Some(b)) => {
            if utilization_given {
                notes.push(format!(
                    "--kv-cache-memory {} wins over --gpu-memory-utilization {gpu_memory_utilization}",
                    human_bytes(b)
                ));
            }
            if b > m.free_after_load {
                return Err(format!(
                    "--kv-cache-memory asks for {} but only {} is free after loading the weights ({}), activations and workspace",
                    human_bytes(b),
                    human_bytes(m.free_after_load),
                    human_bytes(m.weights)
                ));
            }
            (b, BudgetSource::KvCacheMemory)
        }
        (Some(m), None) => {
            let allowed = (gpu_memory_utilization * m.total as f64).floor() as u64;
            let in_use = m.total.saturating_sub(m.free_after_load);
            if allowed <= in_use {
                return Err(format!(
                    "--gpu-memory-utilization {gpu_memory_utilization} allows {} of {} but {} is already in use after loading (weights {}, activations {}, workspace {}, other processes {}): no memory left for the KV cache; raise --gpu-memory-utilization or use a smaller model",
                    human_bytes(allowed),
                    human_bytes(m.total),
                    human_bytes(in_use),
                    human_bytes(m.weights),
                    human_bytes(m.activations),
                    human_bytes(m.workspace),
                    human_bytes(m.total.saturating_sub(m.free_before_load)),
                ));
            }
            (allowed - in_use, BudgetSource::GpuMemoryUtilization)
        }
        (None, b) => {
            if utilization_given {
                notes.push(
                    "--gpu-memory-utilization ignored: the CPU backend's KV cache lives in host memory (--kv-cache-memory sets it)"
                        .into(),
                );
            }
            match b {
                Some(b) => (b, BudgetSource::KvCacheMemory),
                None => (DEFAULT_CPU_KV_BYTES, BudgetSource::CpuDefault),
            }
        }
    };
    let flag = match source {
        BudgetSource::GpuMemoryUtilization => "--gpu-memory-utilization",
        _ => "--kv-cache-memory",
    };
    let (slots, state_bytes) = match state.filter(|s| s.bytes_per_slot > 0) {
        None => (0usize, 0u64),
        Some(s) => {
            let one_request = max_model_len.div_ceil(block_size) as u64 * per_block;
            let fit = budget.saturating_sub(one_request) / s.bytes_per_slot;
            let slots = (s.max_num_seqs as u64).min(fit) as usize;
            if slots == 0 {
                return Err(format!(
                    "{flag} gives a budget of {} ({} bytes); one sequence needs {} of Gated-DeltaNet state beside {} of KV cache for a request of --max-model-len {} tokens; raise {flag} or lower --max-model-len",
                    human_bytes(budget),
                    thousands(budget),
                    human_bytes(s.bytes_per_slot),
                    human_bytes(one_request),
                    thousands(max_model_len as u64)
                ));
            }
            if slots < s.max_num_seqs {
                notes.push(format!(
                    "--max-num-seqs {} lowered to {slots}: each running sequence of this hybrid holds {} of Gated-DeltaNet state, and the budget keeps room for the KV of one request of {} tokens",
                    s.max_num_seqs,
                    human_bytes(s.bytes_per_slot),
                    thousands(max_model_len as u64)
                ));
            }
            (slots, s.bytes_per_slot)
        }
    };
    let kv_budget = budget - slots as u64 * state_bytes;
    let cap = KvCapacity::from_budget(config, block_size, dtype, kv_budget, max_model_len)
        .map_err(|e| {
            if flag == "--kv-cache-memory" {
                e
            } else {
                e.replacen(
                    &format!("--kv-cache-memory {budget}"),
                    &format!("the KV budget from --gpu-memory-utilization ({budget} bytes)"),
                    1,
                )
                .replace(
                    "raise --kv-cache-memory",
                    "raise --gpu-memory-utilization (or set --kv-cache-memory)",
                )
            }
        })?;
    Ok(KvPlan {
        budget_bytes: budget,
        source,
        bytes_per_block: per_block,
        num_blocks: cap.num_blocks,
        block_size,
        max_model_len,
        gpu_memory_utilization: memory.map(|_| gpu_memory_utilization),
        device_memory: memory.map(DeviceMemorySnapshot::from),
        notes,
        state_slots: slots,
        state_bytes_per_slot: state_bytes,
        layers: config
            .is_hybrid()
            .then(|| (config.num_attention_layers(), config.num_gdn_layers())),
    })
}

/// Bytes of one `[n, k]` linear weight stored in `format`, scales included: BF16 `2nk`; FP8
/// `nk + 4` (per-tensor scale); NVFP4 `nk/2 + nk/16 + 4` (E2M1 codes, E4M3 block scales, FP32
/// tensor scale).
pub fn linear_bytes(format: WeightFormat, n: usize, k: usize) -> u64 {
    let e = (n * k) as u64;
    match format {
        WeightFormat::Bf16 => 2 * e,
        WeightFormat::Fp8 => e + 4,
        WeightFormat::Nvfp4 => e / 2 + e / 16 + 4,
    }
}

/// Bytes of the decoder linears of one full-attention layer in `format`.
pub fn layer_linear_bytes(c: &ModelConfig, format: WeightFormat) -> u64 {
    use super::weights::LinearRole;
    LinearRole::ALL
        .iter()
        .map(|r| {
            let (n, k) = r.shape(c);
            linear_bytes(format, n, k)
        })
        .sum()
}

/// Bytes of every decoder linear of `c` quantized by `recipe` (per layer its attention or
/// Gated-DeltaNet linears and the MLP, or the sparse block with all its experts resident; each
/// role in [`QuantRecipe::format_for`]'s format).
pub fn decoder_linear_bytes(c: &ModelConfig, recipe: QuantRecipe) -> u64 {
    use super::weights::LinearRole;
    let bytes = |r: &LinearRole| {
        let (n, k) = r.shape(c);
        linear_bytes(recipe.format_for(*r), n, k)
    };
    let layers: u64 = (0..c.num_layers)
        .flat_map(|i| LinearRole::of_layer(c, i).iter())
        .map(bytes)
        .sum();
    // Every routed expert is resident (E of each expert linear per sparse layer).
    let experts: u64 = (0..c.num_layers)
        .filter_map(|i| c.moe.as_ref().filter(|m| m.is_sparse(i)))
        .map(|m| m.num_experts as u64 * LinearRole::EXPERT.iter().map(bytes).sum::<u64>())
        .sum();
    layers + experts
}

/// Bytes of the parameters other than the linears and the embedding, at 4 bytes each as the
/// runtime keeps them: RMSNorm weights (input, post-attention, q/k per head, final) and, in
/// Gated-DeltaNet layers, the convolution weights, `A_log`, `dt_bias` and the gated norm.
fn small_param_bytes(c: &ModelConfig) -> u64 {
    let per_layer = |i: usize| -> usize {
        match (&c.hybrid, c.layer_type(i)) {
            (Some(h), super::hybrid::LayerType::Gdn) => {
                2 * c.hidden_size
                    + h.conv_dim() * h.conv_kernel
                    + 2 * h.num_value_heads
                    + h.value_head_dim
            }
            _ => 2 * c.hidden_size + 2 * c.head_dim,
        }
    };
    4 * ((0..c.num_layers).map(per_layer).sum::<usize>() + c.hidden_size) as u64
}

/// Bytes of every weight of `c` with the decoder linears in `format` (embedding and lm_head
/// BF16, Gated-DeltaNet's in_proj_a / in_proj_b BF16, norms and the other small parameters at
/// 4 bytes as the runtime keeps them).
pub fn estimate_weight_bytes(c: &ModelConfig, format: WeightFormat) -> u64 {
    let emb = 2 * (c.vocab_size * c.hidden_size) as u64;
    let head = if c.tie_word_embeddings { 0 } else { emb };
    decoder_linear_bytes(c, QuantRecipe::Uniform(format)) + emb + head + small_param_bytes(c)
}

/// Bytes of every weight the runtime holds for `c` quantized by `recipe`: the decoder linears in
/// [`QuantRecipe::format_for`]'s formats (every routed expert resident), the BF16 embedding, the
/// lm_head when untied ([`QuantRecipe::lm_head_format`]), and the norms and other small
/// parameters at 4 bytes. The vision tower and MTP layers of a checkpoint are not loaded and not
/// counted.
pub fn recipe_weight_bytes(c: &ModelConfig, recipe: QuantRecipe) -> u64 {
    let (v, h) = (c.vocab_size, c.hidden_size);
    let head = if c.tie_word_embeddings {
        0
    } else {
        linear_bytes(recipe.lm_head_format(), v, h)
    };
    decoder_linear_bytes(c, recipe) + 2 * (v * h) as u64 + head + small_param_bytes(c)
}

/// Bytes one batch-1 decode step reads at context `ctx`: every decoder linear in `format`
/// (Gated-DeltaNet's in_proj_a / in_proj_b in BF16), the lm_head (BF16, the embedding when
/// tied), one embedding row, the norms and other small parameters, the KV cache of `ctx` tokens
/// (K and V, the layers with attention, in `kv`) and, for a Gated-DeltaNet hybrid, its state
/// read and written once (BF16 convolution state, FP32 recurrent state). The weight-streaming
/// floor of a decode step (each byte moved once; caches ignored).
pub fn decode_step_bytes(
    c: &ModelConfig,
    format: WeightFormat,
    kv: KvCacheDtype,
    ctx: usize,
) -> DecodeBytes {
    if let Some(m) = &c.moe {
        // A batch-1 step of a mixture of experts reads the top-k experts of each sparse layer.
        let sparse = (0..c.num_layers).filter(|&i| m.is_sparse(i)).count();
        return decode_step_floor(
            c,
            QuantRecipe::Uniform(format),
            kv,
            ctx,
            1,
            &vec![m.top_k; sparse],
        );
    }
    let head = 2 * (c.vocab_size * c.hidden_size) as u64;
    let weights = decoder_linear_bytes(c, QuantRecipe::Uniform(format))
        + head
        + 2 * c.hidden_size as u64
        + small_param_bytes(c);
    let kv_bytes = 2 * (c.num_attention_layers() * c.kv_dim() * ctx * kv.bytes()) as u64;
    DecodeBytes {
        weights,
        kv: kv_bytes,
        state: 2 * c.gdn_state_bytes(super::hybrid::CONV_STATE_ELEM_BYTES),
    }
}

/// The bytes one MoE decode step must move at the least (each byte once, caches ignored): the
/// non-expert decoder linears (attention or Gated-DeltaNet, router, shared expert and its gate,
/// dense MLPs) in `recipe`'s formats, the routed experts the step touches (`touched[l]` distinct
/// experts in the l-th sparse layer: the union over the batch, e.g. the non-zero entries of
/// [`crate::gemm::moe::routed_counts`]), the lm_head and one embedding row per token, the norms, the KV cache of
/// `batch` sequences at context `ctx` (K and V, attention layers, `kv` elements) and each
/// sequence's Gated-DeltaNet state read and written once. The floor the expert GEMMs and the
/// decode step are held to (docs/runtime.md).
///
/// Missing `touched` entries count as every expert.
pub fn decode_step_floor(
    c: &ModelConfig,
    recipe: QuantRecipe,
    kv: KvCacheDtype,
    ctx: usize,
    batch: usize,
    touched: &[usize],
) -> DecodeBytes {
    use crate::runtime::weights::LinearRole;
    let bytes = |r: &LinearRole| {
        let (n, k) = r.shape(c);
        linear_bytes(recipe.format_for(*r), n, k)
    };
    let mut weights: u64 = (0..c.num_layers)
        .flat_map(|i| LinearRole::of_layer(c, i).iter())
        .map(bytes)
        .sum();
    let expert: u64 = LinearRole::EXPERT.iter().map(bytes).sum();
    let mut sparse = 0;
    for i in 0..c.num_layers {
        if let Some(m) = c.moe.as_ref().filter(|m| m.is_sparse(i)) {
            let t = touched.get(sparse).copied().unwrap_or(m.num_experts);
            weights += t.min(m.num_experts) as u64 * expert;
            sparse += 1;
        }
    }
    let (v, h) = (c.vocab_size, c.hidden_size);
    let head = if c.tie_word_embeddings {
        2 * (v * h) as u64
    } else {
        linear_bytes(recipe.lm_head_format(), v, h)
    };
    weights += head + 2 * (batch * h) as u64;
    let kv_bytes = 2 * (batch * c.num_attention_layers() * c.kv_dim() * ctx * kv.bytes()) as u64;
    DecodeBytes {
        weights,
        kv: kv_bytes,
        state: 2 * batch as u64 * c.gdn_state_bytes(crate::runtime::hybrid::CONV_STATE_ELEM_BYTES),
    }
}

/// Bytes read by one decode step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecodeBytes {
    /// Weight bytes.
    pub weights: u64,
    /// KV-cache bytes.
    pub kv: u64,
    /// Recurrent-state bytes read and written (Gated-DeltaNet hybrids; 0 otherwise).
    #[serde(default)]
    pub state: u64,
}

impl DecodeBytes {
    /// Weights + KV + state.
    pub fn total(&self) -> u64 {
        self.weights + self.kv + self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200_like(weights: u64) -> DeviceMemory {
        let total = 140u64 << 30;
        let other = 1 << 30;
        let (act, ws) = (2u64 << 30, 1u64 << 30);
        DeviceMemory {
            total,
            free_before_load: total - other,
            free_after_load: total - other - weights - act - ws,
            weights,
            activations: act,
            workspace: ws,
        }
    }

    #[test]
    fn gpu_budget_is_utilization_times_total_minus_in_use() {
        let c = ModelConfig::preset("qwen3-8b").unwrap();
        let w = estimate_weight_bytes(&c, WeightFormat::Bf16);
        let m = h200_like(w);
        let p = plan_kv(
            &c,
            Some(&m),
            0.9,
            None,
            16,
            KvCacheDtype::Bf16,
            40_960,
            false,
        )
        .unwrap();
        let want = (0.9 * m.total as f64).floor() as u64 - (m.total - m.free_after_load);
        assert_eq!(p.budget_bytes, want);
        assert_eq!(p.source, BudgetSource::GpuMemoryUtilization);
        // Qwen3-8B: 36 layers × 8 KV heads × 128 × 2 (K, V) × 2 bytes = 144 KiB per token.
        assert_eq!(p.bytes_per_block, 16 * 147_456);
        assert_eq!(p.num_blocks as u64, want / (16 * 147_456));
        let lines = p.lines("cuda");
        assert!(
            lines[1].starts_with("GPU KV cache size: ") && lines[1].ends_with(" tokens"),
            "{lines:?}"
        );
        assert!(lines[2].starts_with("Maximum concurrency for 40,960 tokens per request: "));
        assert!(lines[2].ends_with('x'));
        // The same figure inspect's formula predicts with the same reserve.
        assert!(p.tokens() > 500_000);
    }

    #[test]
    fn explicit_budget_wins_and_is_checked_against_free_memory() {
        let c = ModelConfig::preset("qwen3-8b").unwrap();
        let m = h200_like(16 << 30);
        let p = plan_kv(
            &c,
            Some(&m),
            0.5,
            Some(10 << 30),
            16,
            KvCacheDtype::Fp8,
            4096,
            true,
        )
        .unwrap();
        assert_eq!(
            (p.budget_bytes, p.source),
            (10 << 30, BudgetSource::KvCacheMemory)
        );
        assert!(p.notes[0].contains("wins over --gpu-memory-utilization"));
        let e = plan_kv(
            &c,
            Some(&m),
            0.9,
            Some(200 << 30),
            16,
            KvCacheDtype::Bf16,
            4096,
            false,
        )
        .unwrap_err();
        assert!(e.contains("200.0 GiB") && e.contains("free"), "{e}");
    }

    #[test]
    fn no_room_and_too_small_name_the_flag() {
        let c = ModelConfig::preset("qwen3-32b").unwrap();
        let m = h200_like(130 << 30);
        let e = plan_kv(&c, Some(&m), 0.9, None, 16, KvCacheDtype::Bf16, 4096, false).unwrap_err();
        assert!(
            e.contains("--gpu-memory-utilization") && e.contains("in use"),
            "{e}"
        );
        let m = h200_like(120 << 30);
        let e = plan_kv(
            &c,
            Some(&m),
            0.95,
            None,
            16,
            KvCacheDtype::Bf16,
            40_960,
            false,
        )
        .unwrap_err();
        assert!(
            e.contains("--gpu-memory-utilization") && e.contains("--max-model-len"),
            "{e}"
        );
        assert!(plan_kv(&c, Some(&m), 1.5, None, 16, KvCacheDtype::Bf16, 4096, false).is_err());
    }

    #[test]
    fn cpu_budget_and_its_lines() {
        let c = ModelConfig::tiny();
        let p = plan_kv(&c, None, 0.9, None, 16, KvCacheDtype::Bf16, 2048, true).unwrap();
        assert_eq!(
            (p.budget_bytes, p.source),
            (DEFAULT_CPU_KV_BYTES, BudgetSource::CpuDefault)
        );
        assert!(p.notes[0].contains("ignored"));
        let l = p.lines("cpu");
        assert!(l[1].starts_with("CPU KV cache size: "), "{l:?}");
        assert!(l.iter().all(|x| !x.contains("GPU")), "{l:?}");
        let e = plan_kv(
            &c,
            None,
            0.9,
            Some(1024),
            16,
            KvCacheDtype::Bf16,
            2048,
            false,
        )
        .unwrap_err();
        assert!(e.contains("--kv-cache-memory"), "{e}");
    }

    #[test]
    fn weights_larger_than_free_memory_are_refused_with_both_sizes() {
        let c = ModelConfig::preset("qwen3-32b").unwrap();
        let w = estimate_weight_bytes(&c, WeightFormat::Bf16);
        // Qwen3-32B in BF16: about 65.5 GB.
        assert!((65e9..66e9).contains(&(w as f64)), "{w}");
        let e = check_weights_fit(w, 48 << 30, "cuda:0").unwrap_err();
        assert!(e.contains("61.") && e.contains("48.0 GiB"), "{e}");
        assert!(check_weights_fit(
            estimate_weight_bytes(&c, WeightFormat::Nvfp4),
            48 << 30,
            "cuda:0"
        )
        .is_ok());
        let e = kv_alloc_failure(20 << 30, 3 << 30, "cuda:0", "CUDA_ERROR_OUT_OF_MEMORY");
        assert!(
            e.contains("20.0 GiB")
                && e.contains("3.0 GiB")
                && e.contains("--gpu-memory-utilization")
        );
    }

    /// The built-in runtime's KV cache of a hybrid (its full-attention layers' KV blocks after
    /// one state slot per sequence) against `inspect`'s prediction with `--max-num-seqs`, for
    /// the same config.json and the same budget. The bound is 3%; at the 27B shape the
    /// two agree to block rounding.
    const HYBRID_KV_VS_INSPECT: f64 = 0.03;

    fn inspect_dir(c: &ModelConfig, dir: &std::path::Path) {
        std::fs::write(
            dir.join("config.json"),
            crate::runtime::weights::tests::config_json(c).to_string(),
        )
        .unwrap();
    }

    #[test]
    fn hybrid_plan_agrees_with_inspect_at_the_27b_shape() {
        let c = ModelConfig::preset("qwen3.6-27b").unwrap();
        let dir = tempfile::tempdir().unwrap();
        inspect_dir(&c, dir.path());
        for (slots, max_len) in [(256u64, 32_768u64), (32, 262_144), (1024, 4096)] {
            let opts = crate::checkpoint::InspectOptions {
                gpu_memory_bytes: Some(141 << 30),
                gpu_memory_source: Some("H200".into()),
                max_num_seqs: Some(slots),
                max_model_len: Some(max_len),
                ..Default::default()
            };
            let r = crate::checkpoint::inspect(dir.path(), &opts).unwrap();
            let p = &r.capacity;
            let budget = p.kv_budget_bytes.unwrap() as u64;
            let predicted = p.kv_tokens.unwrap();
            // The runtime on a GPU: BF16 convolution state, FP32 recurrent state.
            let plan = plan_memory(
                &c,
                None,
                0.9,
                Some(budget),
                16,
                KvCacheDtype::Bf16,
                max_len as usize,
                false,
                Some(StateSpec {
                    bytes_per_slot: c
                        .gdn_state_bytes(crate::runtime::hybrid::CONV_STATE_ELEM_BYTES),
                    max_num_seqs: slots as usize,
                }),
            )
            .unwrap();
            assert_eq!(
                Some(plan.state_bytes_per_slot),
                p.state_bytes_per_sequence,
                "state per sequence"
            );
            let got = plan.tokens() as f64;
            let rel = got / predicted as f64 - 1.0;
            assert!(
                rel.abs() < HYBRID_KV_VS_INSPECT,
                "{slots} slots, {max_len}: runtime {got} vs inspect {predicted} ({rel:+.4})"
            );
            // What "KV cache size" counts is said.
            let lines = plan.lines("cuda");
            assert!(
                lines
                    .iter()
                    .any(|l| l.contains("16 full-attention layers only")
                        && l.contains("48 Gated-DeltaNet layers")),
                "{lines:?}"
            );
            assert!(plan.max_concurrency() <= plan.state_slots as f64);
            // Without --max-num-seqs inspect keeps vLLM's one-state reservation: far more tokens.
            if slots == 256 {
                let vllm = crate::checkpoint::inspect(
                    dir.path(),
                    &crate::checkpoint::InspectOptions {
                        max_num_seqs: None,
                        ..opts.clone()
                    },
                )
                .unwrap();
                assert!(vllm.capacity.kv_tokens.unwrap() as f64 > 1.5 * got);
            }
        }
    }

    #[test]
    fn hybrid_engine_allocates_what_inspect_predicts_on_the_cpu() {
        // A real engine start on the CPU backend from a checkpoint directory, and inspect of the
        // same directory with the budget set to the engine's (GPU memory = budget + weights,
        // utilization 1, no reserve).
        let c = crate::runtime::hybrid::tiny_hybrid();
        let w = crate::runtime::weights::synthesize(&c, 1);
        let dir = tempfile::tempdir().unwrap();
        crate::runtime::weights::tests::write_checkpoint(dir.path(), &w);
        let budget: u64 = 6 << 20;
        let mut sc = crate::runtime::ServeConfig::tiny();
        sc.model = dir.path().display().to_string();
        sc.kv_cache_memory = Some(budget);
        sc.max_num_seqs = 24;
        sc.max_model_len = Some(4096);
        sc.enable_prefix_caching = true;
        let loaded = crate::runtime::engine::load(&sc).unwrap();
        let info = &loaded.info;
        assert_eq!(info.kv_plan.state_slots, 24);
        assert!(
            !info.enable_prefix_caching,
            "prefix caching is off for hybrids"
        );
        assert!(
            info.notes
                .iter()
                .any(|n| n.contains("prefix caching off") && n.contains("Gated-DeltaNet")),
            "{:?}",
            info.notes
        );
        let allocated = info.capacity.tokens() as f64;
        let headers = crate::checkpoint::inspect(dir.path(), &Default::default()).unwrap();
        let weights = headers.capacity.weight_bytes.unwrap();
        let r = crate::checkpoint::inspect(
            dir.path(),
            &crate::checkpoint::InspectOptions {
                gpu_memory_bytes: Some(budget + weights),
                gpu_memory_source: Some("test".into()),
                gpu_memory_utilization: 1.0,
                reserve_bytes: 0,
                max_num_seqs: Some(24),
                max_model_len: Some(4096),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(r.capacity.kv_budget_bytes, Some(budget as i64));
        let predicted = r.capacity.kv_tokens.unwrap() as f64;
        let rel = allocated / predicted - 1.0;
        assert!(
            rel.abs() < HYBRID_KV_VS_INSPECT,
            "engine {allocated} vs inspect {predicted} ({rel:+.4})"
        );
        // The lines say what the size counts.
        let lines = info.kv_plan.lines("cpu");
        assert!(
            lines
                .iter()
                .any(|l| l.contains("1 full-attention layer only")),
            "{lines:?}"
        );
    }

    #[test]
    fn hybrid_slots_shrink_to_the_budget_with_a_note() {
        let c = ModelConfig::preset("qwen3.6-27b").unwrap();
        let state = c.gdn_state_bytes(crate::runtime::hybrid::CONV_STATE_ELEM_BYTES);
        let kv_per_token = kv_bytes_per_block(&c, 1, KvCacheDtype::Bf16);
        // 16 layers × 2 × 4 KV heads × 256 × 2 bytes.
        assert_eq!(kv_per_token, 65_536);
        let spec = |n| {
            Some(StateSpec {
                bytes_per_slot: state,
                max_num_seqs: n,
            })
        };
        // Room for the KV of one 8k request and 10.5 states: 10 slots, with a note.
        let budget = 8192 * kv_per_token + state * 21 / 2;
        let p = plan_memory(
            &c,
            None,
            0.9,
            Some(budget),
            16,
            KvCacheDtype::Bf16,
            8192,
            false,
            spec(256),
        )
        .unwrap();
        assert_eq!(p.state_slots, 10);
        assert!(p
            .notes
            .iter()
            .any(|n| n.contains("--max-num-seqs 256 lowered to 10")));
        // No room for one state beside one request: an error naming both sizes.
        let e = plan_memory(
            &c,
            None,
            0.9,
            Some(8192 * kv_per_token + state / 2),
            16,
            KvCacheDtype::Bf16,
            8192,
            false,
            spec(4),
        )
        .unwrap_err();
        assert!(
            e.contains("Gated-DeltaNet state") && e.contains("--max-model-len"),
            "{e}"
        );
    }

    #[test]
    fn hybrid_decode_bytes_count_the_state_read_and_written() {
        let c = ModelConfig::preset("qwen3.6-27b").unwrap();
        let b = decode_step_bytes(&c, WeightFormat::Bf16, KvCacheDtype::Bf16, 1024);
        // 48 GDN layers × (3 × 10,240 × 2 B + 48 × 128 × 128 × 4 B), read and written.
        assert_eq!(b.state, 2 * 48 * (3 * 10_240 * 2 + 48 * 128 * 128 * 4));
        // KV of the 16 attention layers only: 16 × 4 × 256 × 2 (K, V) × 2 B per token.
        assert_eq!(b.kv, 16 * 4 * 256 * 2 * 2 * 1024);
        // The weights are the model's: 26.9e9 parameters in BF16 less the embedding table
        // (one row read), about 51.3 GB.
        let gb = b.weights as f64 / 1e9;
        assert!((51.0..52.0).contains(&gb), "{gb}");
        assert_eq!(b.total(), b.weights + b.kv + b.state);
        // W4A16 reads far fewer weight bytes, the same state.
        let n = decode_step_bytes(&c, WeightFormat::Nvfp4, KvCacheDtype::Bf16, 1024);
        assert!(n.weights * 2 < b.weights && n.state == b.state);
        // The estimate of all weights: the 27B's BF16 checkpoint without vision and MTP.
        let w = estimate_weight_bytes(&c, WeightFormat::Bf16) as f64 / 1e9;
        assert!((53.5..54.5).contains(&w), "{w}");
    }

    #[test]
    fn decode_bytes_per_format() {
        let c = ModelConfig::preset("qwen3-32b").unwrap();
        let b = decode_step_bytes(&c, WeightFormat::Bf16, KvCacheDtype::Bf16, 0);
        let f = decode_step_bytes(&c, WeightFormat::Fp8, KvCacheDtype::Bf16, 0);
        let n = decode_step_bytes(&c, WeightFormat::Nvfp4, KvCacheDtype::Bf16, 0);
        assert!(b.weights > f.weights && f.weights > n.weights);
        assert_eq!(b.kv, 0);
        // 1,024 tokens of BF16 KV for Qwen3-32B: 64 layers × 1,024 KV dims × 2 × 2 bytes each.
        let k = decode_step_bytes(&c, WeightFormat::Bf16, KvCacheDtype::Bf16, 1024).kv;
        assert_eq!(k, 64 * 1024 * 2 * 2 * 1024);
        assert_eq!(linear_bytes(WeightFormat::Nvfp4, 16, 32), 256 + 32 + 4);
    }
}
