//! A boot's record ([`Boot`]): its status, the KV memory and size facts each engine prints
//! (paddings, block overrides, buffers, cells, slots, SGLang's memory lines, TensorRT-LLM's
//! reductions), the KV check, and the KV reading `rigbench e2e` uses.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// How a boot ended, as far as the log shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BootStatus {
    /// The KV cache was sized (the engine got past its memory profiling).
    Ready,
    /// A startup error ends the boot.
    Failed,
    /// The log stops (or the next boot begins) before the KV-size line.
    Incomplete,
}

/// vLLM's hybrid KV-cache allocator padding: `Add N padding layers, may waste at most X% KV
/// cache memory` (`vllm/v1/core/kv_cache_utils.py`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvPadding {
    /// Padding layers added.
    pub layers: u64,
    /// At most this fraction of the KV memory is wasted (0..1).
    pub waste: f64,
    /// 1-based line.
    pub line: usize,
}

/// vLLM's `Overriding num_gpu_blocks=P with num_gpu_blocks_override=O`: the blocks the
/// profiler found (0 on the profiling pass, before any KV memory is known) and the user's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockOverride {
    /// Blocks the engine computed from the memory it profiled (`P`).
    pub profiled: i64,
    /// Blocks the flag sets (`O`).
    pub blocks: u64,
    /// 1-based line.
    pub line: usize,
}

/// One llama.cpp KV buffer: `llama_kv_cache:      CUDA0 KV buffer size =   512.00 MiB`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvBuffer {
    /// The backend buffer's name (`CPU`, `CUDA0`, `ROCm0`, `Vulkan0`, `MTL0`, `CUDA_Host`).
    pub device: String,
    /// Size, MiB.
    pub mib: f64,
    /// 1-based line.
    pub line: usize,
}

impl KvBuffer {
    /// Whether the buffer lives in host memory (`CPU`, `CUDA_Host`, `CPU_Mapped`).
    pub fn on_host(&self) -> bool {
        let d = self.device.to_ascii_lowercase();
        d.contains("cpu") || d.ends_with("_host")
    }
}

/// llama.cpp's `llama_kv_cache: size = 4.00 MiB (2048 cells, 2 layers, 4/4 seqs)`: cells per
/// stream, layers, and (since the split KV cache) `n_seq_max/n_stream`
/// (`src/llama-kv-cache.cpp`, `llama_kv_cache::llama_kv_cache`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvCells {
    /// Cells per stream (`kv_size`).
    pub cells: u64,
    /// Layers holding this cache.
    pub layers: Option<u64>,
    /// Sequences (`n_seq_max`).
    pub seqs: Option<u64>,
    /// Streams (`n_stream`: 1 when unified, `n_seq_max` when not); `None` for the older form
    /// that prints one number (a unified cache).
    pub streams: Option<u64>,
    /// Size, MiB.
    pub mib: Option<f64>,
    /// 1-based line.
    pub line: usize,
}

/// llama-server's slots: `load_model: initializing, n_slots = 4, n_ctx_slot = 2048,
/// kv_unified = 'false'` (or the older `initializing slots, n_slots = 4` with per-slot
/// `new slot n_ctx_slot = 2048` lines).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Slots {
    /// `n_slots` (`-np`).
    pub n_slots: Option<u64>,
    /// Context per slot.
    pub n_ctx_slot: Option<u64>,
    /// `kv_unified`, when stated.
    pub unified: Option<bool>,
    /// 1-based line.
    pub line: usize,
}

/// SGLang's memory lines around the KV pool, for the `--max-total-tokens` cap.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SglangMemory {
    /// `server_args` `max_total_tokens` (the `--max-total-tokens` cap), with the line.
    pub max_total_tokens: Option<(u64, usize)>,
    /// `server_args` `mem_fraction_static`.
    pub mem_fraction_static: Option<f64>,
    /// `server_args` `page_size`.
    pub page_size: Option<u64>,
    /// `Load weight begin. avail mem=X GB` (the free memory SGLang sizes against), GB.
    pub avail_before_weights_gb: Option<f64>,
    /// `Load weight end. … avail mem=X GB`, GB.
    pub avail_after_weights_gb: Option<f64>,
    /// `Memory profiling: … rest_memory=X GB` (the KV budget SGLang computed), GB, with line.
    pub rest_memory_gb: Option<(f64, usize)>,
    /// `max_total_tokens=N is larger than the profiled value M`: (asked, profiled, line).
    pub larger_than_profiled: Option<(u64, i64, usize)>,
    /// `Memory pool end. avail mem=X GB`, GB, with line.
    pub avail_after_pool_gb: Option<(f64, usize)>,
}

/// A maximum length the engine lowered to fit its KV cache (TensorRT-LLM `Adjusted
/// max_seq_len to N`, `maxAttentionWindow and maxSequenceLen are too large … reduced to N`,
/// `Attention window size A exceeds upper bound B … Reducing to B`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reduced {
    /// What was lowered.
    pub what: String,
    /// The value before, when stated.
    pub from: Option<u64>,
    /// The value after.
    pub to: u64,
    /// 1-based line.
    pub line: usize,
}

/// One engine start found in a log.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Boot {
    /// 1-based index in the log.
    pub index: usize,
    /// First line of the boot (1-based).
    pub line: usize,
    /// Last line attributed to it.
    pub last_line: usize,
    /// Engine version stated during this boot.
    pub engine_version: Option<String>,
    /// KV capacity in tokens as the engine states it (vLLM `GPU KV cache size: N tokens`,
    /// SGLang `#tokens`, llama.cpp cells × streams, TensorRT-LLM `max tokens in paged KV
    /// cache (N)`, rigbench's `KV cache: N tokens`).
    pub kv_cache_tokens: Option<u64>,
    /// Line of `kv_cache_tokens`.
    pub kv_cache_tokens_line: Option<usize>,
    /// How `kv_cache_tokens` was read from its line(s), when it took more than copying a
    /// number (`2,048 cells × 4 streams`).
    pub kv_cache_tokens_rule: Option<String>,
    /// `# GPU blocks: N` (V0), `num_gpu_blocks is: N`, TensorRT-LLM's primary-pool blocks.
    pub gpu_blocks: Option<u64>,
    /// `# CPU blocks: N` (V0 swap space), TensorRT-LLM's secondary (host) pool blocks.
    pub cpu_blocks: Option<u64>,
    /// Tokens per KV block, when stated or implied.
    pub block_size: Option<u64>,
    /// Where `block_size` came from.
    pub block_size_source: Option<String>,
    /// `Maximum concurrency for L tokens per request: X x`: `(L, X)`.
    pub max_concurrency: Option<(u64, f64)>,
    /// Line of `max_concurrency`.
    pub max_concurrency_line: Option<usize>,
    /// `Available KV cache memory: X GiB` (V1), `kv_cache_size=X GiB` (V0), the CPU backend's
    /// `Explicitly set (X/…) GiB for KV cache`, bytes.
    pub available_kv_memory_bytes: Option<u64>,
    /// Line of `available_kv_memory_bytes`.
    pub available_kv_memory_line: Option<usize>,
    /// Bytes of the KV pool itself (SGLang K + V size, TensorRT-LLM `Allocated X GiB`,
    /// llama.cpp `size = X MiB`).
    pub kv_pool_bytes: Option<u64>,
    /// Line of `kv_pool_bytes`.
    #[serde(default)]
    pub kv_pool_bytes_line: Option<usize>,
    /// The context length the engine states (SGLang `context_len`, llama.cpp `n_ctx_slot`,
    /// TensorRT-LLM `max_seq_len`).
    pub context_len: Option<u64>,
    /// The line that says the server is up.
    pub ready_line: Option<usize>,
    /// The first line that asks the engine to stop (SIGTERM, `shutdown triggered`).
    pub shutdown_line: Option<usize>,
    /// Ready, failed or incomplete (set by [`EngineLog::finish`]).
    pub status: Option<BootStatus>,
    /// Printed KV tokens against max concurrency × max length.
    pub kv_check: Option<KvCheck>,
    /// Indices into [`EngineLog::errors`] of the errors in this boot.
    pub errors: Vec<usize>,
    /// The furthest startup stage reached (0 start, 1 KV memory, 2 KV size, 3 concurrency,
    /// 4 ready).
    pub stage: u8,
    /// Description and line of the last startup stage seen.
    pub last_stage: Option<(String, usize)>,
    /// vLLM's KV padding layers: the first line of the boot.
    pub padding: Option<KvPadding>,
    /// vLLM's `--num-gpu-blocks-override` lines of the boot, in log order.
    #[serde(default)]
    pub block_overrides: Vec<BlockOverride>,
    /// Every padding line of the boot, in log order (a model with several KV-cache groups, or
    /// several ranks, prints one each).
    #[serde(default)]
    pub paddings: Vec<KvPadding>,
    /// llama.cpp KV buffers per backend.
    pub kv_buffers: Vec<KvBuffer>,
    /// llama.cpp's full-attention (non-SWA) KV cache line.
    pub kv_cells: Option<KvCells>,
    /// llama.cpp's sliding-window KV cache line (iSWA models), when there is one.
    pub kv_cells_swa: Option<KvCells>,
    /// llama-server's slots.
    pub slots: Option<Slots>,
    /// llama.cpp `llama_context: n_ctx = N`, with its line.
    pub n_ctx: Option<(u64, usize)>,
    /// llama.cpp `load_tensors: offloaded N/M layers to GPU`: (N, M, line).
    pub offloaded_layers: Option<(u64, u64, usize)>,
    /// llama.cpp model buffers on a GPU backend (`load_tensors: CUDA0 model buffer size`).
    pub gpu_model_buffer_line: Option<usize>,
    /// SGLang's memory lines.
    pub sglang: Option<SglangMemory>,
    /// Lengths the engine lowered to fit the KV cache.
    pub reduced: Vec<Reduced>,
    /// An earlier KV allocation of the same process that a later one replaced (TensorRT-LLM
    /// sizes a small cache first, then the real one): (tokens, line).
    pub replaced_allocation: Option<(u64, usize)>,
    /// Process ids seen in this boot.
    pub pids: BTreeSet<u32>,
    /// Startup lines printed again with the same value by the same process (ignored).
    pub repeated_lines: usize,
    #[serde(skip)]
    pub(super) setters: BTreeMap<&'static str, (Option<String>, String)>,
    #[serde(skip)]
    pub(super) role_pids: BTreeMap<String, u32>,
}

/// Whether the printed KV size agrees with max concurrency × max length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvCheck {
    /// Tokens printed (or blocks × block size).
    pub printed_tokens: u64,
    /// Max concurrency × tokens per request.
    pub implied_tokens: u64,
    /// larger / smaller.
    pub factor: f64,
    /// Within 2%.
    pub consistent: bool,
}

impl Boot {
    /// KV capacity in tokens: stated, or blocks × block size when both are known.
    pub fn capacity_tokens(&self) -> Option<u64> {
        self.kv_cache_tokens
            .or_else(|| self.gpu_blocks?.checked_mul(self.block_size?))
    }

    /// Whether the boot got its KV cache sized.
    pub fn has_kv_size(&self) -> bool {
        self.kv_cache_tokens.is_some() || self.gpu_blocks.is_some()
    }

    /// The KV capacity with the line it was read from and how, for callers that must say where
    /// a figure came from (`rigbench e2e` records it as the KV condition's source).
    pub fn kv_reading(&self) -> Option<KvReading> {
        let tokens = self.capacity_tokens()?;
        let line = self.kv_cache_tokens_line.unwrap_or(self.line);
        let rule = match (&self.kv_cache_tokens_rule, self.kv_cache_tokens) {
            (Some(r), _) => r.clone(),
            (None, Some(_)) => "as printed".into(),
            (None, None) => format!(
                "{} blocks × {} tokens per block ({})",
                self.gpu_blocks.unwrap_or(0),
                self.block_size.unwrap_or(0),
                self.block_size_source.as_deref().unwrap_or("stated")
            ),
        };
        Some(KvReading {
            tokens,
            line,
            rule,
            boot: self.index,
        })
    }
}

/// A KV capacity read from an engine log: tokens, the line, how they were read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvReading {
    /// Tokens the KV cache holds (all sequences together).
    pub tokens: u64,
    /// 1-based line of the figure.
    pub line: usize,
    /// How the tokens were read (`as printed`, `2,048 cells × 4 streams`, `n_slots 4 ×
    /// n_ctx_slot 2,048`).
    pub rule: String,
    /// The boot (1-based).
    pub boot: usize,
}
