//! Engine logs: what vLLM (V0 and V1), SGLang, llama.cpp's `llama-server`, TensorRT-LLM and
//! `rigbench serve` say about their boots, KV cache, quantization kernels, speculative decoding
//! and failures. The line forms each engine prints, per version, are read by one reader per
//! engine ([`super::engines`]); `docs/diagnose.md` lists them.
//!
//! Every line is first split by [`super::line::Line`], so collector prefixes never hide a level.
//! Then:
//! - **Boots.** Startup facts come in a fixed order: start (version, model loading) → KV memory
//!   (`Available KV cache memory`, V0 `kv_cache_size=`) → KV size (`GPU KV cache size: N
//!   tokens`, V0 `# GPU blocks: N`, SGLang `KV Cache is allocated. #tokens: N`, llama.cpp
//!   `llama_kv_cache: size = … (N cells, …, S/T seqs)`, TensorRT-LLM `Allocated X GiB for max
//!   tokens in paged KV cache (N)`) → max concurrency → ready. A fact of an earlier stage than
//!   the current boot has reached, or another value of a fact the same process already stated,
//!   starts a new boot; the same value printed again by the same process is a repeated print of
//!   the same boot (counted in [`Boot::repeated_lines`]); the same fact from another rank (TP
//!   workers) stays in its boot. A process that runs once per boot (an API server, an engine
//!   core) appearing with a new pid after that role already failed with another pid starts a
//!   new boot too. Each boot is a separate [`Boot`] record.
//! - **Errors.** Consecutive ERROR lines of one process and call site are one message (vLLM and
//!   glog print a multi-line message with a header on every line), so a traceback stays under
//!   its ERROR line; a plain `Traceback (most recent call last):` block is one error too, and a
//!   chained traceback (`The above exception was the direct cause of the following exception`,
//!   `During handling of the above exception, another exception occurred`) stays one error with
//!   every exception of the chain in order. The same message from several ranks (or several
//!   processes of a worker pool) is one [`ErrorGroup`]; the same message from two runs of a
//!   once-per-boot process (two pids) is two. Each group's text is searched for every root
//!   cause it names ([`super::cause::classify`]); a generic wrapper (`EngineCore failed to
//!   start.`) points at the cause found elsewhere in the log. An error printed after the engine
//!   was told to shut down (SIGTERM, `shutdown triggered`) is marked so.
//! - Line numbers are the file's own, 1-based.
//!
//! KV tokens are taken only from lines that state tokens (or blocks with a stated or implied
//! block size, or cells and streams), never derived from GiB.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use super::cause::{classify, Cause};
use super::engines;
use super::line::{is_exception_line, Form, Level, Line};
use super::spec::{parse_spec_line, pool_spec, SpecLogLine, SpecPooled};

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
    setters: BTreeMap<&'static str, (Option<String>, String)>,
    #[serde(skip)]
    role_pids: BTreeMap<String, u32>,
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

/// One exception of a traceback chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChainLink {
    /// The exception line.
    pub exception: String,
    /// 1-based line.
    pub line: usize,
    /// How it relates to the one before: `direct cause` (`The above exception was the direct
    /// cause of the following exception`) or `during handling` (`During handling of the above
    /// exception, another exception occurred`); `None` for the first.
    pub relation: Option<String>,
}

/// An error message with everything under it (its traceback), deduplicated over ranks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ErrorGroup {
    /// First line (1-based).
    pub line: usize,
    /// Last line.
    pub last_line: usize,
    /// The message that opens it; `None` when the excerpt holds only traceback lines.
    pub headline: Option<String>,
    /// The exception line that ends its traceback, when present (the last of a chain).
    pub exception: Option<String>,
    /// Every exception of a chained traceback, first (the original) to last.
    pub chain: Vec<ChainLink>,
    /// Traceback lines under it.
    pub traceback_lines: usize,
    /// The level printed (`None` for plain stderr lines).
    pub level: Option<Level>,
    /// The process tag.
    pub proc: Option<String>,
    /// Process ids that printed it.
    pub pids: BTreeSet<u32>,
    /// Ranks that printed it.
    pub ranks: BTreeSet<u32>,
    /// How many times it appeared (ranks, repeats).
    pub occurrences: usize,
    /// The root cause its text names (the first of `causes`).
    pub cause: Option<Cause>,
    /// The line that names the cause.
    pub cause_line: Option<usize>,
    /// Every distinct cause its text names, with the line, in order.
    pub causes: Vec<(Cause, usize)>,
    /// The boot it belongs to (1-based), if any.
    pub boot: Option<usize>,
    /// A generic wrapper (`EngineCore failed to start.`) that names no cause of its own.
    pub generic: bool,
    /// For a generic wrapper: the index of the error whose cause explains it.
    pub explained_by: Option<usize>,
    /// Printed after the engine was asked to shut down (line of that request).
    pub after_shutdown: Option<usize>,
    #[serde(skip)]
    text: Vec<(usize, String)>,
    #[serde(skip)]
    sites: BTreeSet<String>,
    #[serde(skip)]
    key: Option<(Option<String>, Option<String>)>,
    #[serde(skip)]
    pending_relation: Option<String>,
}

impl ErrorGroup {
    /// The line that best names the error: its cause, else its exception, else its headline.
    pub fn summary(&self) -> String {
        if let Some(c) = &self.cause {
            return c.describe();
        }
        match (&self.headline, &self.exception) {
            (Some(h), Some(e)) if h != e => format!("{h} ({e})"),
            (Some(h), _) => h.clone(),
            (None, Some(e)) => e.clone(),
            (None, None) => "engine error, cause not captured in this excerpt".into(),
        }
    }
}

/// The Marlin W4A16 fallback warning ("Your GPU does not have native support for FP4
/// computation ... Weight-only FP4 compression will be used leveraging the Marlin kernel"),
/// deduplicated over ranks and call sites into one finding.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MarlinFallback {
    /// Ranks that printed it; empty when lines carry no rank.
    pub ranks: BTreeSet<u32>,
    /// Source locations that printed it (`nvfp4_utils.py:144`).
    pub call_sites: BTreeSet<String>,
    /// Number of lines.
    pub occurrences: usize,
    /// First line.
    pub line: usize,
}

/// What a kernel named in the log does with 4-bit weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelPath {
    /// An FP4 tensor-core kernel (CUTLASS, FlashInfer CUTLASS/TRT-LLM/CuTe-DSL, cuBLASLt,
    /// TensorRT-LLM): the card runs FP4 natively.
    NativeFp4,
    /// A weight-only kernel that dequantizes 4-bit weights to BF16 (Marlin, Humming, a
    /// `…W4A16…` kernel, Triton MoE).
    WeightOnly,
    /// Emulation (quantize-dequantize, then a BF16 GEMM).
    Emulated,
    /// Not known to rigbench.
    Unknown,
}

/// A kernel or backend the engine says it chose (`Using MarlinNvFp4LinearKernel for NVFP4 GEMM`,
/// `Using 'MARLIN' NvFp4 MoE backend`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelChoice {
    /// What it serves: `NVFP4 GEMM` (dense linear layers), `NVFP4 MoE`, `MXFP4 MoE`.
    pub what: String,
    /// The kernel or backend named.
    pub kernel: String,
    /// 1-based line.
    pub line: usize,
    /// The candidates the engine says it chose among, in its order (vLLM's `… out of
    /// potential backends: ['FLASHINFER_CUTLASS', 'VLLM_CUTLASS', 'MARLIN']`: the backends it
    /// tries in priority order for this platform, `oracle/nvfp4.py`); empty when not printed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<String>,
}

impl KernelChoice {
    /// The candidates listed before the chosen one that would run FP4 on tensor cores: the
    /// native backends the engine tried first and did not take.
    pub fn native_candidates_passed_over(&self) -> Vec<&str> {
        let chosen = self.kernel.to_ascii_lowercase();
        self.candidates
            .iter()
            .take_while(|c| c.to_ascii_lowercase() != chosen)
            .filter(|c| {
                KernelChoice {
                    what: self.what.clone(),
                    kernel: (*c).clone(),
                    line: 0,
                    candidates: Vec::new(),
                }
                .path()
                    == KernelPath::NativeFp4
            })
            .map(String::as_str)
            .collect()
    }

    /// Whether it is the Marlin weight-only path.
    pub fn is_marlin(&self) -> bool {
        self.kernel.to_ascii_lowercase().contains("marlin")
    }

    /// What the kernel does, from its name (the engines' class and backend names, see
    /// `docs/diagnose.md`).
    pub fn path(&self) -> KernelPath {
        let k = self
            .kernel
            .to_ascii_lowercase()
            .replace(['-', '_', ' '], "");
        if k.contains("emulat") {
            KernelPath::Emulated
        } else if k.contains("marlin")
            || k.contains("humming")
            || k.contains("w4a16")
            || k.contains("triton")
        {
            KernelPath::WeightOnly
        } else if [
            "cutlass",
            "flashinfer",
            "trtllm",
            "cutedsl",
            "cublaslt",
            "cudnn",
            "b12x",
            "deepgemm",
        ]
        .iter()
        .any(|n| k.contains(n))
        {
            KernelPath::NativeFp4
        } else {
            KernelPath::Unknown
        }
    }
}

/// A warning about KV-cache scales (missing k/v scales, defaults of 1.0). Results written
/// before this struct held the message alone; those read back with line 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "ScaleWarningRepr")]
pub struct ScaleWarning {
    /// The message.
    pub message: String,
    /// First line.
    pub line: usize,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ScaleWarningRepr {
    Full { message: String, line: usize },
    Message(String),
}

impl From<ScaleWarningRepr> for ScaleWarning {
    fn from(r: ScaleWarningRepr) -> Self {
        match r {
            ScaleWarningRepr::Full { message, line } => ScaleWarning { message, line },
            ScaleWarningRepr::Message(message) => ScaleWarning { message, line: 0 },
        }
    }
}

/// Speculative decoding as the engine's configuration states it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SpecConfig {
    /// Method (`ngram`, `mtp`, `eagle`, `EAGLE`, `draft model`, llama.cpp's `ngram-simple`).
    pub method: Option<String>,
    /// Where the method was read.
    pub method_source: Option<String>,
    /// Draft tokens per step (vLLM `num_speculative_tokens`, SGLang `speculative_num_steps`).
    pub k: Option<u32>,
    /// SGLang `speculative_num_draft_tokens` (tokens verified per step, the bonus position
    /// included).
    pub draft_tokens: Option<u32>,
    /// SGLang `speculative_eagle_topk`.
    pub topk: Option<u32>,
    /// Line of the configuration.
    pub line: Option<usize>,
    /// Line where a drafter model was loaded.
    pub drafter_line: Option<usize>,
    /// The configuration says speculation is off (`speculative_config=None`,
    /// `speculative_algorithm=None`, llama.cpp `no implementations specified`).
    pub off_line: Option<usize>,
}

/// One request's timings from llama.cpp's `print_timings` (one line per figure since the
/// `slot print_timing: id N | task T | …` form, a block of lines before it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestTiming {
    /// Line of `prompt eval time`.
    pub line: usize,
    /// The task id, when the line names it.
    #[serde(default)]
    pub task: Option<u64>,
    /// Prompt tokens processed.
    pub prompt_tokens: Option<u64>,
    /// Prompt processing time, ms.
    pub prompt_ms: Option<f64>,
    /// Generated tokens.
    pub generated_tokens: Option<u64>,
    /// Generation time, ms.
    pub generation_ms: Option<f64>,
}

/// Everything found in one engine log. Every field has a default, so results.json files
/// written by older versions (a `kv` list instead of `boots`) still read back.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EngineLog {
    /// The engine that wrote it (`vllm`, `sglang`, `llama.cpp`, `tensorrt-llm`, `rigbench`),
    /// from its line forms.
    pub engine: Option<String>,
    /// Engine version stated in the log.
    pub engine_version: Option<String>,
    /// The line that stated the version.
    pub engine_version_line: Option<usize>,
    /// Boots, in log order.
    pub boots: Vec<Boot>,
    /// The Marlin FP4 fallback, when warned.
    pub marlin_fp4_fallback: Option<MarlinFallback>,
    /// Kernel choices the engine logged.
    pub kernel_choices: Vec<KernelChoice>,
    /// Resolved quantization method (`modelopt`, `fp8`, `compressed-tensors`, ...).
    pub quantization: Option<String>,
    /// KV cache dtype (`fp8`, `auto`, ...).
    pub kv_cache_dtype: Option<String>,
    /// Speculative method from the engine config (kept for e2e's conditions).
    pub spec_method: Option<String>,
    /// Speculative k from the engine config.
    pub spec_k: Option<u32>,
    /// The speculative configuration with its lines.
    pub spec_config: SpecConfig,
    /// Warnings about KV-cache scales, deduplicated.
    pub kv_scale_warnings: Vec<ScaleWarning>,
    /// Warnings that say the engine fell back to another kernel or backend (`Failed to create
    /// oneDNN linear, fallback to torch linear`, `… falling back to …`), deduplicated; the
    /// Marlin FP4 fallback has its own record.
    pub fallback_warnings: Vec<ScaleWarning>,
    /// The `non-default args: {...}` dictionary text, reported once however often it appears.
    pub non_default_args: Option<String>,
    /// The line where the engine starts loading the model (llama.cpp `load_model: loading
    /// model`), for statements about what was (not) loaded with it.
    pub model_load_line: Option<usize>,
    /// Errors, each with its traceback and cause.
    pub errors: Vec<ErrorGroup>,
    /// Speculative-decoding metrics lines, in log order.
    pub spec_lines: Vec<SpecLogLine>,
    /// llama.cpp per-request timings.
    pub request_timings: Vec<RequestTiming>,
    /// Lines read.
    pub lines_read: usize,
    /// Lines that gave a fact.
    pub lines_recognised: usize,
    /// Why the input was not parsed (binary data), when it was not.
    pub unreadable: Option<String>,
    #[serde(skip)]
    open: BTreeMap<Option<String>, usize>,

    #[serde(skip)]
    plain_tb: Option<usize>,
    #[serde(skip)]
    chain_tail: Option<(usize, usize)>,
    #[serde(skip)]
    usage_line: Option<usize>,
    #[serde(skip)]
    forms: BTreeMap<&'static str, usize>,
    #[serde(skip)]
    pub(crate) pending: BTreeMap<&'static str, usize>,
}

/// Generic wrappers that name no cause of their own.
const GENERIC: &[&str] = &[
    "EngineCore failed to start",
    "Engine core initialization failed",
    "AsyncLLM output_handler failed",
    "EngineDeadError",
    "Engine process failed to start",
    "WorkerProc failed to start",
    "Worker failed with error",
    "died unexpectedly",
    "Received sigquit from a child process",
    "exiting due to model loading error",
    "failed to load model",
    "Executor worker returned error",
];

/// Lines that ask an engine to stop (vLLM `[shutdown]` lines and signal handling, uvicorn,
/// llama.cpp's interrupt handling, SGLang's SIGTERM handler).
const SHUTDOWN: &[&str] = &[
    "shutdown triggered",
    "received signal=SIGTERM",
    "received signal SIGTERM",
    "Received SIGTERM",
    "SIGTERM received",
    "Shutting down",
    "cleaning up before exit",
    "Received second interrupt",
    "KeyboardInterrupt",
];

/// The largest number of error groups kept (a crash-looping log repeats itself).
const MAX_ERRORS: usize = 200;
/// Text lines kept per error group for cause search.
const MAX_TEXT: usize = 400;

/// Whether `bytes` look like binary data rather than a log: NUL bytes, or more than 10% of
/// other control characters in the first 64 KiB.
pub fn binary_reason(bytes: &[u8]) -> Option<String> {
    let head = &bytes[..bytes.len().min(65536)];
    let nul = head.iter().filter(|b| **b == 0).count();
    let ctrl = head
        .iter()
        .filter(|b| **b < 0x20 && !matches!(**b, b'\n' | b'\r' | b'\t' | 0x1b))
        .count();
    if nul > 0 || (!head.is_empty() && ctrl * 10 > head.len()) {
        Some(format!(
            "binary data ({nul} NUL and {ctrl} other control bytes in the first {} bytes): not a text log, nothing recognised",
            head.len()
        ))
    } else {
        None
    }
}

/// A number as printed (`652,144`, `2048`).
pub(crate) fn num(s: &str) -> Option<u64> {
    s.replace(',', "").trim().parse().ok()
}

/// A finite float as printed (`1,024.00`, `0.38`).
pub(crate) fn fnum(s: &str) -> Option<f64> {
    s.trim()
        .trim_end_matches(',')
        .replace(',', "")
        .parse()
        .ok()
        .filter(|x: &f64| x.is_finite())
}

/// A size in `unit` (KiB … TiB, KB … TB) in bytes, when finite and below 10^19.
pub(crate) fn to_bytes(v: f64, unit: &str) -> Option<u64> {
    let mult = match unit {
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0f64.powi(4),
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => return None,
    };
    let b = v * mult;
    (b.is_finite() && (0.0..1e19).contains(&b)).then(|| b.round() as u64)
}

/// Whether a process role runs several processes per boot (a worker pool: `VllmWorker`,
/// `Worker_TP1`, `VllmWorkerProcess`, `RayWorkerWrapper`), as opposed to once per boot
/// (`APIServer`, `EngineCore_DP0`).
fn worker_role(role: &str) -> bool {
    role.contains("Worker") || role.contains("worker") || super::line::rank_of(role).is_some()
}

/// `Exception`-like: a (dotted) CamelCase name, then `: ` or the end (`torch._dynamo.exc.
/// BackendCompilerFailed: …`), for the last line of a traceback whose name has no `Error`
/// suffix.
fn exception_like(text: &str) -> bool {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"^(?:[A-Za-z_]\w*\.)*[A-Z][A-Za-z0-9_]*(?::\s|:$|$)").expect("static regex")
    })
    .is_match(text.trim())
}

/// How a fact relates to what the current boot already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Repeat {
    /// Another value from the same process starts a new boot (the default).
    NewBoot,
    /// Another value from the same process replaces the first (TensorRT-LLM sizes a small KV
    /// cache before the real one).
    Replace,
}

impl EngineLog {
    /// Parse a whole log (text). Never fails; unrecognised lines are ignored.
    pub fn parse(text: &str) -> Self {
        let mut log = EngineLog::default();
        for (i, line) in text.lines().enumerate() {
            log.push_line(i + 1, line);
        }
        log.finish();
        log
    }

    /// Parse bytes: binary data gives an empty log with [`EngineLog::unreadable`] set; invalid
    /// UTF-8 is replaced.
    pub fn parse_bytes(bytes: &[u8]) -> Self {
        if let Some(why) = binary_reason(bytes) {
            return EngineLog {
                unreadable: Some(why),
                ..Default::default()
            };
        }
        Self::parse(&String::from_utf8_lossy(bytes))
    }

    /// Parse a log file.
    ///
    /// # Errors
    /// The file cannot be read ([`crate::RigError::BadFile`]).
    pub fn parse_file(path: &std::path::Path) -> Result<Self, crate::RigError> {
        let bytes = std::fs::read(path)
            .map_err(|e| crate::RigError::file(path, format!("cannot read engine log: {e}")))?;
        Ok(Self::parse_bytes(&bytes))
    }

    /// Count one line of `engine`'s own form (the engine is the most frequent form).
    pub(crate) fn note_form(&mut self, engine: &'static str) {
        *self.forms.entry(engine).or_insert(0) += 1;
    }

    /// Lines whose header (or a reader) counted as `engine`'s own form (`vllm`, `sglang`,
    /// `llama.cpp`, `tensorrt-llm`, `rigbench`, `torch`).
    pub fn form_lines(&self, engine: &str) -> usize {
        self.forms.get(engine).copied().unwrap_or(0)
    }

    /// Count a line that gave a fact.
    pub(crate) fn recognised(&mut self) {
        self.lines_recognised += 1;
    }

    /// Record the engine version (the first one stated is the log's; each boot keeps its own).
    pub(crate) fn set_version(&mut self, l: &Line, v: String) {
        if let Some(b) = self.fact(l, 0, "version", &v, "engine start", Repeat::NewBoot) {
            b.engine_version = Some(v.clone());
        }
        if self.engine_version.is_none() {
            self.engine_version = Some(v);
            self.engine_version_line = Some(l.no);
        }
        self.recognised();
    }

    /// The boot being read, if any.
    pub(crate) fn current_boot(&mut self) -> Option<&mut Boot> {
        self.boots.last_mut()
    }

    fn new_boot(&mut self, no: usize) {
        let index = self.boots.len() + 1;
        self.boots.push(Boot {
            index,
            line: no,
            last_line: no,
            ..Default::default()
        });
    }

    /// The boot a startup fact of `stage` belongs to (see the module docs), created when none
    /// fits. `start marker` facts (a model-loading line) only open a boot.
    pub(crate) fn boot_for(&mut self, l: &Line, stage: u8) -> &mut Boot {
        let need_new = match self.boots.last() {
            None => true,
            Some(b) => stage < b.stage,
        };
        if need_new {
            self.new_boot(l.no);
        }
        let b = self.boots.last_mut().expect("pushed above");
        b.stage = b.stage.max(stage);
        b.last_line = l.no;
        b
    }

    /// Record a fact in the current boot (see the module docs for when it starts a new boot);
    /// `None` when another rank already set it or the same process printed the same value again.
    pub(crate) fn fact(
        &mut self,
        l: &Line,
        stage: u8,
        field: &'static str,
        value: &str,
        what: &str,
        repeat: Repeat,
    ) -> Option<&mut Boot> {
        enum Decision {
            Repeated,
            OtherRank,
            Replace,
            NewBoot,
            Here,
        }
        let proc = l.proc.clone();
        let decision = match self.boots.last() {
            None => Decision::NewBoot,
            Some(b) => match b.setters.get(field) {
                Some((p, v)) if *p == proc && v == value => Decision::Repeated,
                Some((p, v)) if *p != proc && (v == value || stage >= b.stage) => {
                    Decision::OtherRank
                }
                Some((p, _)) if *p == proc && repeat == Repeat::Replace => Decision::Replace,
                Some(_) => Decision::NewBoot,
                None if stage < b.stage => Decision::NewBoot,
                None => Decision::Here,
            },
        };
        match decision {
            Decision::Repeated | Decision::OtherRank => {
                let b = self.boots.last_mut().expect("checked");
                if matches!(decision, Decision::Repeated) {
                    b.repeated_lines += 1;
                }
                b.last_line = l.no;
                return None;
            }
            Decision::NewBoot => self.new_boot(l.no),
            Decision::Replace | Decision::Here => {}
        }
        let b = self.boots.last_mut().expect("a boot");
        b.stage = b.stage.max(stage);
        b.last_line = l.no;
        b.setters.insert(field, (proc, value.to_string()));
        b.last_stage = Some((what.to_string(), l.no));
        Some(b)
    }

    /// Record a kernel choice once.
    pub(crate) fn push_choice(&mut self, what: String, kernel: &str, no: usize) {
        self.push_choice_among(what, kernel, no, Vec::new());
    }

    /// Record a kernel choice once, with the candidates the line lists.
    pub(crate) fn push_choice_among(
        &mut self,
        what: String,
        kernel: &str,
        no: usize,
        candidates: Vec<String>,
    ) {
        if !self
            .kernel_choices
            .iter()
            .any(|c| c.what == what && c.kernel == kernel)
        {
            self.kernel_choices.push(KernelChoice {
                what,
                kernel: kernel.to_string(),
                line: no,
                candidates,
            });
        }
        self.recognised();
    }

    /// A new process of a once-per-boot role, after that role failed under another pid in the
    /// current boot, starts a new boot.
    fn track_process(&mut self, l: &Line) {
        let (Some(pid), Some(role)) = (l.pid, l.proc.as_deref()) else {
            return;
        };
        let role = role.to_string();
        let failed_role = |log: &EngineLog, b: &Boot, other: u32| {
            log.errors
                .iter()
                .any(|g| g.boot == Some(b.index) && g.pids.contains(&other))
        };
        let new = match self.boots.last() {
            Some(b) => match b.role_pids.get(&role) {
                Some(&other) if other != pid && !worker_role(&role) => failed_role(self, b, other),
                _ => false,
            },
            None => false,
        };
        if new {
            self.new_boot(l.no);
            if let Some(b) = self.boots.last_mut() {
                b.last_stage = Some((format!("a new {role} process (pid {pid})"), l.no));
            }
        }
        if let Some(b) = self.boots.last_mut() {
            b.role_pids.insert(role, pid);
            b.pids.insert(pid);
        }
    }

    /// Feed one line (1-based `no`).
    pub fn push_line(&mut self, no: usize, raw: &str) {
        self.lines_read += 1;
        let l = Line::parse(no, raw);
        let recognised_before = self.lines_recognised;
        match l.form {
            Form::Vllm => self.note_form("vllm"),
            Form::Sglang => self.note_form("sglang"),
            Form::Llamacpp => self.note_form("llama.cpp"),
            Form::Trtllm => self.note_form("tensorrt-llm"),
            Form::Glog => self.note_form("torch"),
            _ => {}
        }
        self.track_process(&l);
        self.errors_from(&l);
        let msg = l.text();
        if msg.is_empty() {
            return;
        }
        for r in engines::readers() {
            r.read(self, &l);
        }
        self.common(&l);
        if self.lines_recognised == recognised_before
            && self.boots.last().is_some_and(|b| b.last_line == no)
        {
            self.lines_recognised += 1;
        }
    }

    /// Lines every engine prints alike: ready and shutdown markers, KV-scale warnings,
    /// speculative-decoding metrics.
    fn common(&mut self, l: &Line) {
        let msg = l.text();
        for m in [
            "Starting vLLM API server",
            "Starting vLLM server on",
            "Started server process",
            "Application startup complete",
            "Uvicorn running on",
            "The server is fired up and ready to roll",
            "server is listening on",
            "llama_server: listening on",
            "Engine loaded and ready to serve",
        ] {
            if msg.contains(m) {
                if let Some(b) = self.boots.last_mut() {
                    if b.stage < 4 && b.ready_line.is_none() {
                        b.ready_line = Some(l.no);
                        b.last_stage = Some(("the server-ready line".into(), l.no));
                    }
                    b.stage = 4;
                    b.last_line = l.no;
                }
                self.recognised();
                break;
            }
        }
        if SHUTDOWN.iter().any(|m| msg.contains(m)) && !l.level.is_some_and(Level::is_error) {
            if let Some(b) = self.boots.last_mut() {
                b.shutdown_line.get_or_insert(l.no);
                b.last_line = l.no;
            }
            self.recognised();
        }
        if l.level == Some(Level::Warning) && kv_scale_re().is_match(msg) {
            let m = msg.trim().to_string();
            if !self.kv_scale_warnings.iter().any(|w| w.message == m) {
                self.kv_scale_warnings.push(ScaleWarning {
                    message: m,
                    line: l.no,
                });
            }
            self.recognised();
        }
        if l.level == Some(Level::Warning)
            && fallback_re().is_match(msg)
            && !msg.contains("native support for FP4")
        {
            let m: String = msg.trim().chars().take(240).collect();
            if !self.fallback_warnings.iter().any(|w| w.message == m) {
                self.fallback_warnings.push(ScaleWarning {
                    message: m,
                    line: l.no,
                });
            }
            self.recognised();
        }
        if let Some(s) = parse_spec_line(l.no, msg) {
            self.spec_lines.push(s);
            self.recognised();
        }
    }

    /// Group error lines (see the module docs).
    fn errors_from(&mut self, l: &Line) {
        let text = l.text();
        let is_err = l.level.is_some_and(Level::is_error);
        let headered = matches!(
            l.form,
            Form::Vllm | Form::Glog | Form::Llamacpp | Form::Python | Form::Trtllm
        );
        // A process is its role and, when stated, its pid: two runs of one role are two.
        let process = match (&l.proc, l.pid) {
            (Some(p), Some(pid)) => Some(format!("{p}#{pid}")),
            (p, _) => p.clone(),
        };
        let key = (process.clone(), l.site.clone());
        // A header from this process that is not an error closes its open group.
        if headered && !is_err {
            self.open.remove(&process);
        }
        if is_err {
            if let Some(&gi) = self.open.get(&process) {
                if self.errors[gi].key.as_ref() == Some(&key) {
                    self.extend_group(gi, l);
                    return;
                }
            }
            self.open.remove(&process);
            if self.errors.len() >= MAX_ERRORS {
                return;
            }
            let piece = l.is_traceback_piece();
            let gi = self.errors.len();
            let mut g = self.group_at(l);
            g.key = Some(key);
            g.level = l.level;
            if piece {
                g.traceback_lines = 1;
            } else if is_exception_line(text) {
                g.exception = Some(text.to_string());
                g.headline = Some(text.to_string());
                g.chain.push(ChainLink {
                    exception: text.to_string(),
                    line: l.no,
                    relation: None,
                });
            } else if !text.is_empty() {
                g.headline = Some(text.to_string());
            }
            g.text.push((l.no, text.to_string()));
            g.sites.extend(l.site.clone());
            self.errors.push(g);
            self.open.insert(process, gi);
            self.chain_tail = None;
            self.recognised();
            return;
        }
        // A chained traceback continues after its exception line: blank lines, then the glue.
        if let Some((gi, _)) = self.chain_tail {
            let glue = text.starts_with("The above exception was the direct cause")
                || text.starts_with("During handling of the above exception");
            if glue && self.errors[gi].proc == l.proc {
                self.plain_tb = Some(gi);
                self.chain_tail = None;
                self.extend_group(gi, l);
                return;
            }
            if !text.is_empty() {
                self.chain_tail = None;
            }
        }
        // Plain (headerless) tracebacks and exception lines.
        if matches!(l.form, Form::Plain | Form::Sglang) {
            if let Some(gi) = self.plain_tb {
                let same_proc = self.errors[gi].proc == l.proc;
                if same_proc && (l.is_traceback_piece() || text.is_empty()) {
                    self.extend_group(gi, l);
                    return;
                }
                if same_proc
                    && (is_exception_line(text)
                        || (exception_like(text) && self.errors[gi].traceback_lines > 1))
                {
                    self.extend_group_exception(gi, l);
                    self.plain_tb = None;
                    self.chain_tail = Some((gi, l.no));
                    return;
                }
                self.plain_tb = None;
            }
            if text.contains("Traceback (most recent call last)") && self.errors.len() < MAX_ERRORS
            {
                let gi = self.errors.len();
                let mut g = self.group_at(l);
                g.traceback_lines = 1;
                g.headline = text
                    .find("Traceback (most recent call last)")
                    .map(|i| text[..i].trim().trim_end_matches(':').trim().to_string())
                    .filter(|h| !h.is_empty());
                g.text.push((l.no, text.to_string()));
                self.errors.push(g);
                self.plain_tb = Some(gi);
                self.recognised();
                return;
            }
            // argparse prints its usage block before `prog: error: …`.
            if text.starts_with("usage: ") {
                self.usage_line = Some(l.no);
                return;
            }
        }
        // A line outside any error block that names a cause (plain `ValueError: ...`, the
        // engine's `Value error, ...`, argparse's `prog: error: ...`, a toolchain warning), or a
        // plain exception line.
        let candidate = l.level.is_none()
            || (l.level == Some(Level::Warning)
                && text.contains("not compatible with the current PyTorch"));
        if candidate && self.errors.len() < MAX_ERRORS {
            let looks_error = is_exception_line(text)
                || text.to_ascii_lowercase().contains("error")
                || text.contains("not supported");
            let cause = classify(text, "").filter(|c| {
                !matches!(c, Cause::CapabilityTooLow { .. } | Cause::PortInUse { .. })
                    || looks_error
            });
            let exception = is_exception_line(text) && !text.contains("Warning");
            let plain_error = [
                "error loading model",
                "failed to load model",
                "exiting due to model loading error",
                "exiting due to HTTP server error",
                "Scheduler hit an exception",
                "failed to initialize the context",
            ]
            .iter()
            .any(|m| text.contains(m));
            if cause.is_some() || exception || plain_error {
                let first = match (&cause, self.usage_line) {
                    (Some(Cause::InvalidArguments { .. }), Some(u)) if l.no - u <= 40 => u,
                    _ => l.no,
                };
                let mut g = self.group_at(l);
                g.line = first;
                g.headline = Some(text.to_string());
                g.exception = exception.then(|| text.to_string());
                if exception {
                    g.chain.push(ChainLink {
                        exception: text.to_string(),
                        line: l.no,
                        relation: None,
                    });
                }
                g.level = l.level;
                if let Some(c) = cause {
                    g.causes.push((c.clone(), l.no));
                    g.cause = Some(c);
                    g.cause_line = Some(l.no);
                }
                g.text.push((l.no, text.to_string()));
                let gi = self.errors.len();
                self.errors.push(g);
                if exception {
                    self.chain_tail = Some((gi, l.no));
                }
                self.usage_line = None;
                self.recognised();
            }
        }
    }

    /// A new group opened by line `l`, in the current boot.
    fn group_at(&self, l: &Line) -> ErrorGroup {
        let boot = self.boots.last();
        ErrorGroup {
            line: l.no,
            last_line: l.no,
            proc: l.proc.clone(),
            pids: l.pid.into_iter().collect(),
            ranks: l.rank.into_iter().collect(),
            occurrences: 1,
            boot: boot.map(|b| b.index),
            after_shutdown: boot.and_then(|b| b.shutdown_line),
            ..Default::default()
        }
    }

    fn extend_group_exception(&mut self, gi: usize, l: &Line) {
        self.extend_group(gi, l);
        let text = l.text();
        let g = &mut self.errors[gi];
        if g.exception.as_deref() != Some(text) {
            g.exception = Some(text.to_string());
        }
        if !g.chain.iter().any(|c| c.line == l.no) {
            let relation = g.pending_relation.take();
            g.chain.push(ChainLink {
                exception: text.to_string(),
                line: l.no,
                relation,
            });
        }
    }

    fn extend_group(&mut self, gi: usize, l: &Line) {
        let text = l.text();
        let g = &mut self.errors[gi];
        g.last_line = l.no;
        if let Some(r) = l.rank {
            g.ranks.insert(r);
        }
        if let Some(p) = l.pid {
            g.pids.insert(p);
        }
        if text.starts_with("The above exception was the direct cause") {
            g.pending_relation = Some("direct cause".into());
        } else if text.starts_with("During handling of the above exception") {
            g.pending_relation = Some("during handling".into());
        }
        let exception = is_exception_line(text)
            || (exception_like(text) && g.traceback_lines > 1 && l.msg.len() == text.len());
        if exception && !l.is_traceback_piece() {
            g.traceback_lines += 1;
            g.exception = Some(text.to_string());
            let relation = g.pending_relation.take();
            g.chain.push(ChainLink {
                exception: text.to_string(),
                line: l.no,
                relation,
            });
        } else if l.is_traceback_piece() {
            g.traceback_lines += 1;
        } else if g.headline.is_none() && !text.is_empty() && g.traceback_lines == 0 {
            g.headline = Some(text.to_string());
        }
        if g.text.len() < MAX_TEXT {
            g.text.push((l.no, text.to_string()));
        }
        g.sites.extend(l.site.clone());
        self.recognised();
    }

    /// Close the parse: causes, deduplication, boot statuses and checks. Called by
    /// [`EngineLog::parse`]; call it after feeding lines with [`EngineLog::push_line`].
    pub fn finish(&mut self) {
        self.open.clear();
        self.plain_tb = None;
        self.chain_tail = None;
        // Causes from each group's whole text: every distinct one, in order.
        for g in &mut self.errors {
            let context = g
                .sites
                .iter()
                .map(String::as_str)
                .chain(g.text.iter().map(|(_, t)| t.as_str()))
                .collect::<Vec<_>>()
                .join("\n");
            for (no, t) in &g.text {
                if let Some(c) = classify(t, &context) {
                    if !g.causes.iter().any(|(x, _)| *x == c) {
                        g.causes.push((c, *no));
                    }
                }
            }
            if g.cause.is_none() {
                if let Some((c, no)) = g.causes.first() {
                    g.cause = Some(c.clone());
                    g.cause_line = Some(*no);
                }
            } else if g.cause_line.is_none() {
                g.cause_line = Some(g.line);
            }
            g.generic = g.cause.is_none()
                && g.headline
                    .as_deref()
                    .is_some_and(|h| GENERIC.iter().any(|m| h.contains(m)));
            // An interrupt (Ctrl-C) is the request to stop, not a fault.
            if g.after_shutdown.is_none() {
                if let Some(c) = g
                    .chain
                    .iter()
                    .find(|c| c.exception.contains("KeyboardInterrupt"))
                {
                    g.after_shutdown = Some(c.line);
                }
            }
        }
        // Deduplicate: the same message (several ranks, a worker pool, repeats) is one group;
        // the same message from two pids of a once-per-boot process is two.
        let mut merged: Vec<ErrorGroup> = Vec::new();
        for g in std::mem::take(&mut self.errors) {
            let same = merged.iter_mut().find(|m| {
                let two_runs = m.proc.is_some()
                    && m.proc == g.proc
                    && !m.proc.as_deref().is_some_and(worker_role)
                    && !m.pids.is_empty()
                    && !g.pids.is_empty()
                    && m.pids.is_disjoint(&g.pids);
                m.headline == g.headline
                    && m.exception == g.exception
                    && m.cause == g.cause
                    && m.boot == g.boot
                    && (m.headline.is_some() || m.exception.is_some())
                    && !two_runs
            });
            match same {
                Some(m) => {
                    m.occurrences += g.occurrences;
                    m.ranks.extend(g.ranks.iter().copied());
                    m.pids.extend(g.pids.iter().copied());
                }
                None => merged.push(g),
            }
        }
        self.errors = merged;
        // Generic wrappers point at the cause found elsewhere (same boot first).
        let causes: Vec<(usize, Option<usize>, usize)> = self
            .errors
            .iter()
            .enumerate()
            .filter(|(_, g)| g.cause.is_some())
            .map(|(i, g)| (i, g.boot, g.line))
            .collect();
        for g in self.errors.iter_mut().filter(|g| g.generic) {
            // The nearest cause at or before it in the same boot, else the first after it.
            let same_boot = causes.iter().filter(|(_, b, _)| *b == g.boot);
            g.explained_by = same_boot
                .clone()
                .filter(|(_, _, l)| *l <= g.line)
                .max_by_key(|(_, _, l)| *l)
                .or_else(|| same_boot.min_by_key(|(_, _, l)| *l))
                .map(|(i, _, _)| *i);
        }
        for (i, g) in self.errors.iter().enumerate() {
            if let Some(b) = g.boot.and_then(|b| self.boots.get_mut(b - 1)) {
                b.errors.push(i);
                b.last_line = b.last_line.max(g.last_line);
            }
        }
        engines::finish_boots(self);
        // Boot statuses, implied block sizes and the KV check.
        for b in self.boots.iter_mut() {
            let startup_error = b.errors.iter().any(|&i| {
                let g = &self.errors[i];
                if g.after_shutdown.is_some() {
                    return false;
                }
                match &g.cause {
                    Some(c) => {
                        c.is_startup()
                            || b.ready_line.is_none_or(|r| g.line < r) && !b.has_kv_size()
                    }
                    None => !b.has_kv_size(),
                }
            });
            b.status = Some(if startup_error {
                BootStatus::Failed
            } else if b.has_kv_size() {
                BootStatus::Ready
            } else {
                BootStatus::Incomplete
            });
            if b.block_size.is_none() {
                if let (Some(t), Some(g)) = (b.kv_cache_tokens, b.gpu_blocks) {
                    if g > 0 && t % g == 0 {
                        b.block_size = Some(t / g);
                        b.block_size_source = Some("KV tokens / GPU blocks".into());
                    }
                } else if let (Some(g), Some((len, x))) = (b.gpu_blocks, b.max_concurrency) {
                    let implied = len as f64 * x / g as f64;
                    let bs = implied.round().max(1.0);
                    let pow2 = (bs as u64).is_power_of_two();
                    if g > 0 && pow2 && bs <= 1024.0 && (implied - bs).abs() <= 0.02 * bs {
                        b.block_size = Some(bs as u64);
                        b.block_size_source = Some(format!(
                            "implied by the max-concurrency line ({x} × {len} / {g} blocks = {implied:.2}); V0 logs do not print it"
                        ));
                    }
                }
            }
            if let (Some(t), Some((len, x))) = (b.kv_cache_tokens, b.max_concurrency) {
                let implied = (len as f64 * x).round();
                if implied >= 1.0 && t > 0 {
                    let (hi, lo) = if implied > t as f64 {
                        (implied, t as f64)
                    } else {
                        (t as f64, implied)
                    };
                    let factor = hi / lo;
                    b.kv_check = Some(KvCheck {
                        printed_tokens: t,
                        implied_tokens: implied as u64,
                        factor,
                        consistent: factor <= 1.02,
                    });
                }
            }
        }
        // The engine: the most frequent line form wins.
        if self.engine.is_none() {
            self.engine = ["llama.cpp", "sglang", "tensorrt-llm", "rigbench", "vllm"]
                .iter()
                .filter_map(|e| self.forms.get(e).map(|n| (*n, *e)))
                .max_by_key(|(n, _)| *n)
                .map(|(_, e)| e.to_string())
                .or_else(|| {
                    (!self.spec_lines.is_empty()
                        && self.spec_lines.iter().all(|s| s.generation.is_vllm()))
                    .then(|| "vllm".to_string())
                });
        }
        self.spec_method = self.spec_config.method.clone();
        self.spec_k = self.spec_config.k;
    }

    /// The last boot that states a KV capacity, with the capacity.
    pub fn kv_capacity(&self) -> Option<(u64, &Boot)> {
        self.boots
            .iter()
            .rev()
            .find_map(|b| b.capacity_tokens().map(|t| (t, b)))
    }

    /// The KV capacity of the last boot that states one, with its line and how it was read
    /// (for llama.cpp: cells × streams of the `llama_kv_cache` line, else `n_slots ×
    /// n_ctx_slot` of the `load_model` line, or `n_ctx_slot` alone when `kv_unified`).
    /// `rigbench e2e` uses this when the engine's endpoints do not state the capacity.
    pub fn kv_reading(&self) -> Option<KvReading> {
        self.boots.iter().rev().find_map(Boot::kv_reading)
    }

    /// Speculative decoding pooled over every line; `None` without spec lines.
    pub fn spec_pooled(&self) -> Option<SpecPooled> {
        pool_spec(&self.spec_lines, self.spec_config.k)
    }

    /// Whether speculative decoding shows as on (a drafter loaded, a method configured, or
    /// metrics lines printed), with the evidence.
    pub fn spec_on(&self) -> Option<String> {
        if let Some(l) = self.spec_lines.first() {
            return Some(format!("speculative-decoding metrics from line {}", l.line));
        }
        if let Some(l) = self.spec_config.drafter_line {
            return Some(format!("a drafter is loaded at line {l}"));
        }
        if let (Some(m), Some(l)) = (&self.spec_config.method, self.spec_config.line) {
            return Some(format!("method {m} configured at line {l}"));
        }
        None
    }

    /// Rewrite every string this log copied from its input (messages, process names, paths in
    /// arguments, kernel names) with `f`, the redaction of user data; rigbench's own words and
    /// the figures stay as they are. Call after [`EngineLog::finish`].
    pub fn map_input_text(&mut self, f: &dyn Fn(&str) -> String) {
        let opt = |o: &mut Option<String>| {
            if let Some(s) = o.as_mut() {
                *s = f(s);
            }
        };
        opt(&mut self.engine_version);
        opt(&mut self.quantization);
        opt(&mut self.kv_cache_dtype);
        opt(&mut self.non_default_args);
        opt(&mut self.spec_method);
        opt(&mut self.spec_config.method);
        for b in &mut self.boots {
            opt(&mut b.engine_version);
            for k in &mut b.kv_buffers {
                k.device = f(&k.device);
            }
        }
        for g in &mut self.errors {
            opt(&mut g.headline);
            opt(&mut g.exception);
            opt(&mut g.proc);
            for c in &mut g.chain {
                c.exception = f(&c.exception);
            }
            if let Some(c) = g.cause.as_mut() {
                c.map_input_text(f);
            }
            for (c, _) in &mut g.causes {
                c.map_input_text(f);
            }
        }
        if let Some(m) = self.marlin_fp4_fallback.as_mut() {
            m.call_sites = m.call_sites.iter().map(|s| f(s)).collect();
        }
        for k in &mut self.kernel_choices {
            k.kernel = f(&k.kernel);
            for c in &mut k.candidates {
                *c = f(c);
            }
        }
        for w in self
            .kv_scale_warnings
            .iter_mut()
            .chain(self.fallback_warnings.iter_mut())
        {
            w.message = f(&w.message);
        }
    }

    /// Whether anything at all was recognised.
    pub fn is_empty(&self) -> bool {
        self.engine_version.is_none()
            && self.boots.is_empty()
            && self.marlin_fp4_fallback.is_none()
            && self.kernel_choices.is_empty()
            && self.quantization.is_none()
            && self.kv_cache_dtype.is_none()
            && self.spec_config == SpecConfig::default()
            && self.kv_scale_warnings.is_empty()
            && self.fallback_warnings.is_empty()
            && self.non_default_args.is_none()
            && self.errors.is_empty()
            && self.spec_lines.is_empty()
            && self.request_timings.is_empty()
    }
}

fn fallback_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"(?i)\b(?:fall(?:ing)? ?back|fallback) to\b").expect("static regex")
    })
}

fn kv_scale_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(
            r"(?i)(?:\b[kvq]_scale|kv_scale|prob_scale|KV cache scaling factor|k/v_scale|q scaling factor)",
        )
        .expect("static regex")
    })
}
