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
use super::config::{KvCacheDtype, ModelConfig, WeightFormat};
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

    /// Requests of `max_model_len` that fit at once (vLLM: blocks / blocks per request).
    pub fn max_concurrency(&self) -> f64 {
        self.capacity().max_concurrency()
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
    let cap =
        KvCapacity::from_budget(config, block_size, dtype, budget, max_model_len).map_err(|e| {
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

/// Bytes of the decoder linears of one layer in `format`.
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

/// Bytes of every weight of `c` with the decoder linears in `format` (embedding and lm_head
/// BF16, norms at 4 bytes as the runtime keeps them).
pub fn estimate_weight_bytes(c: &ModelConfig, format: WeightFormat) -> u64 {
    let emb = 2 * (c.vocab_size * c.hidden_size) as u64;
    let head = if c.tie_word_embeddings { 0 } else { emb };
    let norms = 4 * (c.num_layers * (2 * c.hidden_size + 2 * c.head_dim) + c.hidden_size) as u64;
    c.num_layers as u64 * layer_linear_bytes(c, format) + emb + head + norms
}

/// Bytes one batch-1 decode step reads at context `ctx`: every decoder linear in `format`, the
/// lm_head (BF16, the embedding when tied), one embedding row, the norms, and the KV cache of
/// `ctx` tokens (K and V, all layers, in `kv`). The weight-streaming floor of a decode step
/// (each byte read once; caches ignored).
pub fn decode_step_bytes(
    c: &ModelConfig,
    format: WeightFormat,
    kv: KvCacheDtype,
    ctx: usize,
) -> DecodeBytes {
    let head = 2 * (c.vocab_size * c.hidden_size) as u64;
    let norms = 4 * (c.num_layers * (2 * c.hidden_size + 2 * c.head_dim) + c.hidden_size) as u64;
    let weights = c.num_layers as u64 * layer_linear_bytes(c, format)
        + head
        + 2 * c.hidden_size as u64
        + norms;
    let kv_bytes = 2 * (c.num_layers * c.kv_dim() * ctx * kv.bytes()) as u64;
    DecodeBytes {
        weights,
        kv: kv_bytes,
    }
}

/// Bytes read by one decode step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecodeBytes {
    /// Weight bytes.
    pub weights: u64,
    /// KV-cache bytes.
    pub kv: u64,
}

impl DecodeBytes {
    /// Weights + KV.
    pub fn total(&self) -> u64 {
        self.weights + self.kv
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
