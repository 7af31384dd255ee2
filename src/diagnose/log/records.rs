//! [`EngineLog`], everything found in one log, and its other records (error groups with their
//! traceback chain, the Marlin FP4 fallback, kernel choices, scale and fallback warnings, the
//! speculative configuration, per-request timings), with the queries on a parsed log.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::boot::{Boot, KvReading};
use crate::diagnose::cause::Cause;
use crate::diagnose::line::Level;
use crate::diagnose::spec::{pool_spec, SpecLogLine, SpecPooled};

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
    pub(super) text: Vec<(usize, String)>,
    #[serde(skip)]
    pub(super) sites: BTreeSet<String>,
    #[serde(skip)]
    pub(super) key: Option<(Option<String>, Option<String>)>,
    #[serde(skip)]
    pub(super) pending_relation: Option<String>,
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
    /// Not a quantized GEMM: the attention backend, the FlashAttention version or the
    /// Gated-DeltaNet kernel the engine names.
    NotGemm,
}

/// A kernel or backend the engine says it chose (`Using MarlinNvFp4LinearKernel for NVFP4 GEMM`,
/// `Using 'MARLIN' NvFp4 MoE backend`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelChoice {
    /// What it serves: `NVFP4 GEMM` (dense linear layers), `NVFP4 MoE`, `MXFP4 MoE`, and for
    /// the other layer classes `attention`, `FlashAttention version`, `GDN prefill`.
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
        if !self.what.contains("FP4") {
            return KernelPath::NotGemm;
        }
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
    /// The line that stated [`EngineLog::kv_cache_dtype`] (the first line that gave its value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_dtype_line: Option<usize>,
    /// True when [`EngineLog::kv_cache_dtype`] is what the engine resolved (SGLang's `Using KV
    /// cache dtype: …`), false when the user's arguments stated it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kv_cache_dtype_resolved: bool,
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
    pub(super) open: BTreeMap<Option<String>, usize>,

    #[serde(skip)]
    pub(super) plain_tb: Option<usize>,
    #[serde(skip)]
    pub(super) chain_tail: Option<(usize, usize)>,
    #[serde(skip)]
    pub(super) usage_line: Option<usize>,
    #[serde(skip)]
    pub(super) forms: BTreeMap<&'static str, usize>,
    #[serde(skip)]
    pub(crate) pending: BTreeMap<&'static str, usize>,
}

impl EngineLog {
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
