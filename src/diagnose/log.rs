//! Engine logs: what vLLM (V0 and V1), SGLang and llama.cpp's `llama-server` say about their
//! boots, KV cache, quantization kernels, speculative decoding and failures.
//!
//! Every line is first split by [`super::line::Line`], so collector prefixes never hide a level.
//! Then:
//! - **Boots.** Startup facts come in a fixed order: start (version, model loading) → KV memory
//!   (`Available KV cache memory`, V0 `kv_cache_size=`) → KV size (`GPU KV cache size: N
//!   tokens`, V0 `# GPU blocks: N`, SGLang `KV Cache is allocated. #tokens: N` /
//!   `max_total_num_tokens=N`, llama.cpp `llama_kv_cache: ... (N cells`) → max concurrency →
//!   ready (`Starting vLLM API server`, `Started server process`, `The server is fired up`,
//!   `server is listening`). A fact of an earlier stage than the current boot has reached, or a
//!   second value of the same fact from the same process, starts a new boot; the same fact from
//!   another rank (TP workers) stays in its boot. Each boot is a separate [`Boot`] record.
//! - **Errors.** Consecutive ERROR lines of one process and call site are one message (vLLM and
//!   glog print a multi-line message with a header on every line), so a traceback stays under
//!   its ERROR line; a plain `Traceback (most recent call last):` block is one error too. The
//!   same message from several ranks is one [`ErrorGroup`]. Each group's text is searched for a
//!   root cause ([`super::cause::classify`]); a generic wrapper (`EngineCore failed to start.`)
//!   points at the cause found elsewhere in the log.
//! - Line numbers are the file's own, 1-based.
//!
//! KV tokens are taken only from lines that state tokens (or blocks with a stated or implied
//! block size), never derived from GiB.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use super::cause::{classify, Cause};
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
    /// `GPU KV cache size: N tokens` (V1), SGLang's `#tokens`, llama.cpp's cells, or rigbench's
    /// `KV cache: N tokens`.
    pub kv_cache_tokens: Option<u64>,
    /// Line of `kv_cache_tokens`.
    pub kv_cache_tokens_line: Option<usize>,
    /// `# GPU blocks: N` (V0) or `num_gpu_blocks is: N`.
    pub gpu_blocks: Option<u64>,
    /// `# CPU blocks: N` (V0 swap space).
    pub cpu_blocks: Option<u64>,
    /// Tokens per KV block, when stated or implied.
    pub block_size: Option<u64>,
    /// Where `block_size` came from.
    pub block_size_source: Option<String>,
    /// `Maximum concurrency for L tokens per request: X x`: `(L, X)`.
    pub max_concurrency: Option<(u64, f64)>,
    /// Line of `max_concurrency`.
    pub max_concurrency_line: Option<usize>,
    /// `Available KV cache memory: X GiB` (V1) or `kv_cache_size=X GiB` (V0), bytes.
    pub available_kv_memory_bytes: Option<u64>,
    /// Line of `available_kv_memory_bytes`.
    pub available_kv_memory_line: Option<usize>,
    /// The context length the engine states (SGLang `context_len`, llama.cpp `n_ctx_slot`).
    pub context_len: Option<u64>,
    /// The line that says the server is up.
    pub ready_line: Option<usize>,
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
    #[serde(skip)]
    setters: BTreeMap<&'static str, Option<String>>,
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
    /// The exception line that ends its traceback, when present.
    pub exception: Option<String>,
    /// Traceback lines under it.
    pub traceback_lines: usize,
    /// The level printed (`None` for plain stderr lines).
    pub level: Option<Level>,
    /// The process tag.
    pub proc: Option<String>,
    /// Ranks that printed it.
    pub ranks: BTreeSet<u32>,
    /// How many times it appeared (ranks, repeats).
    pub occurrences: usize,
    /// The root cause its text names.
    pub cause: Option<Cause>,
    /// The line that names the cause.
    pub cause_line: Option<usize>,
    /// The boot it belongs to (1-based), if any.
    pub boot: Option<usize>,
    /// A generic wrapper (`EngineCore failed to start.`) that names no cause of its own.
    pub generic: bool,
    /// For a generic wrapper: the index of the error whose cause explains it.
    pub explained_by: Option<usize>,
    #[serde(skip)]
    text: Vec<(usize, String)>,
    #[serde(skip)]
    sites: BTreeSet<String>,
    #[serde(skip)]
    key: Option<(Option<String>, Option<String>)>,
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
}

impl KernelChoice {
    /// Whether it is the Marlin weight-only path.
    pub fn is_marlin(&self) -> bool {
        self.kernel.to_ascii_lowercase().contains("marlin")
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
    /// Method (`ngram`, `mtp`, `eagle`, `EAGLE`, `draft_model`).
    pub method: Option<String>,
    /// Draft tokens per step.
    pub k: Option<u32>,
    /// Line of the configuration.
    pub line: Option<usize>,
    /// Line where a drafter model was loaded.
    pub drafter_line: Option<usize>,
    /// The configuration says speculation is off (`speculative_config=None`,
    /// `speculative_algorithm=None`).
    pub off_line: Option<usize>,
}

/// One request's timing line pair from llama.cpp's `print_timings`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestTiming {
    /// Line of `prompt eval time`.
    pub line: usize,
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
    /// The engine that wrote it (`vllm`, `sglang`, `llama.cpp`, `rigbench`), from its line forms.
    pub engine: Option<String>,
    /// Engine version stated in the log.
    pub engine_version: Option<String>,
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
    /// The `non-default args: {...}` dictionary text, reported once however often it appears.
    pub non_default_args: Option<String>,
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
    forms: BTreeMap<&'static str, usize>,
}

struct Pats {
    kv_tokens: Regex,
    max_conc: Regex,
    avail_kv: Regex,
    v0_profile_kv: Regex,
    gpu_blocks: Regex,
    late_blocks: Regex,
    rigbench_kv: Regex,
    sglang_kv: Regex,
    sglang_max_total: Regex,
    sglang_ctx: Regex,
    llama_kv: Regex,
    llama_ctx: Regex,
    call_site: Regex,
    version: Regex,
    llama_build: Regex,
    quant_dict: Regex,
    quant_cfg: Regex,
    kvdtype_dict: Regex,
    kvdtype_cfg: Regex,
    kvdtype_using: Regex,
    spec_method: Regex,
    spec_k: Regex,
    sglang_spec_alg: Regex,
    sglang_spec_steps: Regex,
    kv_scale: Regex,
    nvfp4_gemm: Regex,
    nvfp4_moe: Regex,
    llama_prompt: Regex,
    llama_eval: Regex,
}

fn pats() -> &'static Pats {
    static P: OnceLock<Pats> = OnceLock::new();
    P.get_or_init(|| {
        let r = |s: &str| Regex::new(s).expect("static regex");
        Pats {
            // vLLM and `rigbench serve` on a GPU say "GPU"; rigbench's CPU backend says "CPU".
            kv_tokens: r(r"(?:GPU|CPU) KV cache size:\s*(?P<n>\d+(?:,\d{3})*)\s*tokens"),
            max_conc: r(
                r"(?i)Maximum concurrency for\s*(?P<len>\d+(?:,\d{3})*)\s*tokens per request:\s*(?P<x>\d+(?:,\d{3})*(?:\.\d+)?)\s*x",
            ),
            avail_kv: r(r"Available KV cache memory:\s*(?P<v>[\d.]+)\s*(?P<u>[KMGT]i?B)"),
            v0_profile_kv: r(r"\bkv_cache_size=(?P<v>[\d.]+)\s*(?P<u>[KMGT]i?B)"),
            gpu_blocks: r(
                r"#?\s*GPU blocks:\s*(?P<g>\d+(?:,\d{3})*)(?:,\s*#?\s*CPU blocks:\s*(?P<c>\d+(?:,\d{3})*))?",
            ),
            late_blocks: r(r"num_gpu_blocks is:\s*(?P<g>\d+)"),
            rigbench_kv: r(
                r"KV cache:\s*(?P<n>\d+(?:,\d{3})*)\s*tokens\s*\((?P<b>\d+(?:,\d{3})*)\s*blocks\s*[×x*]\s*(?P<bs>\d+)\)(?:;\s*max concurrency at\s*(?P<len>\d+(?:,\d{3})*)\s*tokens:\s*(?P<x>\d+(?:,\d{3})*(?:\.\d+)?)\s*x)?",
            ),
            sglang_kv: r(r"KV Cache is allocated\. #tokens: (?P<n>\d+)"),
            sglang_max_total: r(r"\bmax_total_num_tokens=(?P<n>\d+)"),
            sglang_ctx: r(r"\bcontext_len=(?P<n>\d+)"),
            llama_kv: r(r"llama_kv_cache(?:_unified)?(?:_iswa)?:\s+size\s*=.*?\(\s*(?P<n>\d+) cells"),
            llama_ctx: r(r"n_ctx_slot = (?P<n>\d+)"),
            call_site: r(r"\[?(?P<site>[\w.-]+\.py:\d+)\]"),
            version: r(
                r"(?:vLLM API server version|LLM engine \(v|vLLM version)\s*(?P<v>v?\d+\.\d+[\w.+-]*)",
            ),
            llama_build: r(r"^build: (?P<v>\d+ \([0-9a-f]+\))"),
            quant_dict: r(r"'quantization':\s*'(?P<q>[\w-]+)'"),
            quant_cfg: r(r"\bquantization=(?P<q>[\w-]+)"),
            kvdtype_dict: r(r"'kv_cache_dtype':\s*'(?P<q>[\w-]+)'"),
            kvdtype_cfg: r(r"\bkv_cache_dtype=(?P<q>[\w-]+)"),
            kvdtype_using: r(r"Using (?P<q>fp8\w*) data type to store kv cache"),
            spec_method: r(r#"['"]?method['"]?\s*[:=]\s*['"](?P<m>[\w-]+)['"]"#),
            spec_k: r(r#"['"]?num_spec(?:ulative)?_tokens['"]?\s*[:=]\s*(?P<k>\d+)"#),
            sglang_spec_alg: r(r"\bspeculative_algorithm=(?:'(?P<m>[\w-]+)'|None)"),
            sglang_spec_steps: r(r"\bspeculative_num_steps=(?P<k>\d+)"),
            kv_scale: r(
                r"(?i)(?:\b[kvq]_scale|kv_scale|prob_scale|KV cache scaling factor|k/v_scale|q scaling factor)",
            ),
            nvfp4_gemm: r(r"Using (?P<k>[\w.]+) for (?P<w>NVFP4|MXFP4|FP4) GEMM"),
            nvfp4_moe: r(r"Using '?(?P<k>[\w.]+)'? (?P<w>NvFp4|Nvfp4|NVFP4|Mxfp4|MXFP4) MoE backend"),
            llama_prompt: r(
                r"^\s*prompt eval time =\s*(?P<ms>[\d.]+) ms /\s*(?P<n>\d+) tokens",
            ),
            llama_eval: r(r"^\s*eval time =\s*(?P<ms>[\d.]+) ms /\s*(?P<n>\d+) (?:tokens|runs)"),
        }
    })
}

fn num(s: &str) -> Option<u64> {
    s.replace(',', "").parse().ok()
}

fn fnum(s: &str) -> Option<f64> {
    s.trim_end_matches(',')
        .replace(',', "")
        .parse()
        .ok()
        .filter(|x: &f64| x.is_finite())
}

fn to_bytes(v: f64, unit: &str) -> Option<u64> {
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

    fn note_form(&mut self, f: &'static str) {
        *self.forms.entry(f).or_insert(0) += 1;
    }

    /// The boot a startup fact of `stage` belongs to: the current one, or a new one when the
    /// fact goes back in the startup order or repeats from the same process.
    fn boot_for(
        &mut self,
        no: usize,
        stage: u8,
        field: &'static str,
        proc: &Option<String>,
    ) -> &mut Boot {
        let need_new = match self.boots.last() {
            None => true,
            Some(b) => {
                if stage < b.stage {
                    true
                } else {
                    match b.setters.get(field) {
                        Some(p) => p == proc,
                        None => false,
                    }
                }
            }
        };
        if need_new {
            let index = self.boots.len() + 1;
            self.boots.push(Boot {
                index,
                line: no,
                last_line: no,
                ..Default::default()
            });
        }
        let b = self.boots.last_mut().expect("pushed above");
        b.stage = b.stage.max(stage);
        b.last_line = no;
        b
    }

    /// Record a fact in the current boot; `false` when another rank already set it.
    fn set_fact(
        &mut self,
        no: usize,
        stage: u8,
        field: &'static str,
        proc: &Option<String>,
        what: &str,
    ) -> Option<&mut Boot> {
        let b = self.boot_for(no, stage, field, proc);
        if b.setters.contains_key(field) {
            return None;
        }
        b.setters.insert(field, proc.clone());
        b.last_stage = Some((what.to_string(), no));
        Some(b)
    }

    /// Feed one line (1-based `no`).
    pub fn push_line(&mut self, no: usize, raw: &str) {
        self.lines_read += 1;
        let l = Line::parse(no, raw);
        let recognised_before = self.lines_recognised;
        match l.form {
            Form::Vllm => self.note_form("vllm"),
            Form::Sglang => self.note_form("sglang"),
            Form::Glog => self.note_form("torch"),
            _ => {}
        }
        self.errors_from(&l);
        let msg = l.text();
        if msg.is_empty() {
            return;
        }
        let p = pats();
        let proc = l.proc.clone();

        // Engine and version.
        if let Some(c) = p.version.captures(msg) {
            let v = c["v"].trim_start_matches('v').to_string();
            self.note_form("vllm");
            if let Some(b) = self.set_fact(no, 0, "version", &proc, "engine start") {
                b.engine_version = Some(v.clone());
            }
            self.engine_version.get_or_insert(v);
        }
        if let Some(c) = p.llama_build.captures(msg) {
            self.note_form("llama.cpp");
            let v = format!("b{}", &c["v"]);
            if let Some(b) = self.set_fact(no, 0, "version", &proc, "engine start") {
                b.engine_version = Some(v.clone());
            }
            self.engine_version.get_or_insert(v);
        }
        if msg.starts_with("llama_model_loader:")
            || msg.starts_with("llama_context:")
            || msg.starts_with("srv ")
            || msg.starts_with("slot ")
            || msg.starts_with("main: server is listening")
        {
            self.note_form("llama.cpp");
        }
        for m in [
            "Loading model weights took",
            "Model loading took",
            "Loading weights took",
            "Load weight begin",
            "llama_model_loader: loaded meta data",
        ] {
            if msg.contains(m) {
                let b = self.boot_for(no, 0, "start-marker", &proc);
                if b.stage == 0 {
                    b.last_stage = Some((format!("'{m}'"), no));
                }
                self.lines_recognised += 1;
            }
        }
        if msg.contains("server_args=ServerArgs(") {
            self.note_form("sglang");
            self.boot_for(no, 0, "start-marker", &proc);
            self.lines_recognised += 1;
        }

        // KV memory (stage 1).
        if let Some(c) = p
            .avail_kv
            .captures(msg)
            .or_else(|| p.v0_profile_kv.captures(msg))
        {
            if let Some(bytes) = fnum(&c["v"]).and_then(|v| to_bytes(v, &c["u"])) {
                if let Some(b) = self.set_fact(no, 1, "memory", &proc, "the KV-memory line") {
                    b.available_kv_memory_bytes = Some(bytes);
                    b.available_kv_memory_line = Some(no);
                }
            }
        }

        // KV size (stage 2).
        if let Some(c) = p.rigbench_kv.captures(msg) {
            self.note_form("rigbench");
            if let Some(b) = self.set_fact(no, 2, "size", &proc, "the KV-size line") {
                b.kv_cache_tokens = num(&c["n"]);
                b.kv_cache_tokens_line = Some(no);
                b.gpu_blocks = num(&c["b"]);
                b.block_size = num(&c["bs"]);
                b.block_size_source = Some("stated".into());
            }
            if let (Some(l), Some(x)) = (c.name("len"), c.name("x")) {
                if let (Some(len), Some(x)) = (num(l.as_str()), fnum(x.as_str())) {
                    if let Some(b) =
                        self.set_fact(no, 3, "concurrency", &proc, "the max-concurrency line")
                    {
                        b.max_concurrency = Some((len, x));
                        b.max_concurrency_line = Some(no);
                    }
                }
            }
        } else {
            if let Some(c) = p.kv_tokens.captures(msg) {
                if let Some(n) = num(&c["n"]) {
                    if let Some(b) = self.set_fact(no, 2, "size", &proc, "the KV-size line") {
                        b.kv_cache_tokens = Some(n);
                        b.kv_cache_tokens_line = Some(no);
                    }
                }
            }
            if let Some(c) = p.gpu_blocks.captures(msg) {
                if let Some(g) = num(&c["g"]) {
                    let cpu = c.name("c").and_then(|m| num(m.as_str()));
                    if let Some(b) = self.set_fact(no, 2, "blocks", &proc, "the GPU-blocks line") {
                        b.gpu_blocks = Some(g);
                        b.cpu_blocks = cpu;
                        b.kv_cache_tokens_line.get_or_insert(no);
                    }
                }
            }
            if let Some(c) = p.max_conc.captures(msg) {
                if let (Some(len), Some(x)) = (num(&c["len"]), fnum(&c["x"])) {
                    if let Some(b) =
                        self.set_fact(no, 3, "concurrency", &proc, "the max-concurrency line")
                    {
                        b.max_concurrency = Some((len, x));
                        b.max_concurrency_line = Some(no);
                    }
                }
            }
        }
        if let Some(c) = p.late_blocks.captures(msg) {
            // `cache_config_info ... num_gpu_blocks is: N` comes after the concurrency line.
            if let (Some(g), Some(b)) = (num(&c["g"]), self.boots.last_mut()) {
                if b.gpu_blocks.is_none() {
                    b.gpu_blocks = Some(g);
                    b.last_line = no;
                    self.lines_recognised += 1;
                }
            }
        }
        if let Some(c) = p.sglang_kv.captures(msg) {
            self.note_form("sglang");
            if let Some(n) = num(&c["n"]) {
                if let Some(b) = self.set_fact(no, 2, "size", &proc, "the KV-size line") {
                    b.kv_cache_tokens = Some(n);
                    b.kv_cache_tokens_line = Some(no);
                }
            }
        }
        if let Some(c) = p.sglang_max_total.captures(msg) {
            self.note_form("sglang");
            let ctx = p.sglang_ctx.captures(msg).and_then(|c| num(&c["n"]));
            if let Some(n) = num(&c["n"]) {
                // The same figure as `#tokens` a few lines earlier: fill, never start a boot.
                let same_boot = self
                    .boots
                    .last()
                    .is_some_and(|b| b.stage <= 2 || b.kv_cache_tokens == Some(n));
                if same_boot {
                    let b = self.boots.last_mut().expect("checked");
                    b.kv_cache_tokens.get_or_insert(n);
                    b.kv_cache_tokens_line.get_or_insert(no);
                    b.context_len = b.context_len.or(ctx);
                    b.stage = b.stage.max(2);
                    b.last_line = no;
                } else if let Some(b) = self.set_fact(no, 2, "size", &proc, "the KV-size line") {
                    b.kv_cache_tokens = Some(n);
                    b.kv_cache_tokens_line = Some(no);
                    b.context_len = ctx;
                }
                self.lines_recognised += 1;
            }
        }
        if let Some(c) = p.llama_kv.captures(msg) {
            self.note_form("llama.cpp");
            if let Some(n) = num(&c["n"]) {
                if let Some(b) = self.set_fact(no, 2, "size", &proc, "the KV-size line") {
                    b.kv_cache_tokens = Some(n);
                    b.kv_cache_tokens_line = Some(no);
                }
            }
        }
        if let Some(c) = p.llama_ctx.captures(msg) {
            if let (Some(n), Some(b)) = (num(&c["n"]), self.boots.last_mut()) {
                b.context_len.get_or_insert(n);
                self.lines_recognised += 1;
            }
        }

        // Ready (stage 4).
        for m in [
            "Starting vLLM API server",
            "Started server process",
            "Application startup complete",
            "Uvicorn running on",
            "The server is fired up and ready to roll",
            "server is listening on",
        ] {
            if msg.contains(m) {
                if let Some(b) = self.boots.last_mut() {
                    if b.stage < 4 && b.ready_line.is_none() {
                        b.ready_line = Some(no);
                        b.last_stage = Some(("the server-ready line".into(), no));
                    }
                    b.stage = 4;
                    b.last_line = no;
                }
                self.lines_recognised += 1;
                break;
            }
        }

        // Marlin FP4 fallback: one finding over ranks and call sites.
        if msg.contains("does not have native support for FP4 computation") {
            let f = self
                .marlin_fp4_fallback
                .get_or_insert_with(|| MarlinFallback {
                    line: no,
                    ..Default::default()
                });
            f.occurrences += 1;
            if let Some(rank) = l.rank {
                f.ranks.insert(rank);
            }
            if let Some(site) = l
                .site
                .clone()
                .or_else(|| p.call_site.captures(raw).map(|c| c["site"].to_string()))
            {
                f.call_sites.insert(site);
            }
            self.lines_recognised += 1;
        }
        if let Some(c) = p.nvfp4_gemm.captures(msg) {
            self.push_choice(format!("{} GEMM", c["w"].to_ascii_uppercase()), &c["k"], no);
        }
        if let Some(c) = p.nvfp4_moe.captures(msg) {
            self.push_choice(format!("{} MoE", c["w"].to_ascii_uppercase()), &c["k"], no);
        }
        if msg.contains("Using Marlin backend")
            && l.site.as_deref().is_some_and(|s| s.starts_with("mxfp4"))
        {
            self.push_choice("MXFP4 MoE".into(), "Marlin", no);
        }

        // Engine configuration: non-default args (once), resolved quantization, KV dtype, spec.
        if let Some(pos) = msg.find("non-default args:") {
            let args = msg[pos + "non-default args:".len()..].trim().to_string();
            if self.non_default_args.is_none() {
                self.non_default_args = Some(args);
            }
            self.lines_recognised += 1;
        }
        let is_config = msg.contains("non-default args:")
            || msg.contains("with config:")
            || msg.contains("speculative_config")
            || msg.contains("server_args=");
        if is_config {
            if let Some(c) = p
                .quant_dict
                .captures(msg)
                .or_else(|| p.quant_cfg.captures(msg))
            {
                if c["q"] != *"None" {
                    self.quantization = Some(c["q"].to_string());
                }
            }
            if let Some(c) = p
                .kvdtype_dict
                .captures(msg)
                .or_else(|| p.kvdtype_cfg.captures(msg))
            {
                self.kv_cache_dtype = Some(c["q"].to_string());
            }
            if let Some(pos) = msg.find("speculative_config") {
                let tail = &msg[pos..];
                if tail.starts_with("speculative_config=None")
                    || tail.starts_with("speculative_config': None")
                {
                    self.spec_config.off_line.get_or_insert(no);
                }
                if let Some(c) = p.spec_method.captures(tail) {
                    if c["m"] != *"None" {
                        self.spec_config.method = Some(c["m"].to_string());
                        self.spec_config.line.get_or_insert(no);
                    }
                }
                if let Some(c) = p.spec_k.captures(tail) {
                    self.spec_config.k = c["k"].parse().ok();
                    self.spec_config.line.get_or_insert(no);
                }
            }
            if let Some(c) = p.sglang_spec_alg.captures(msg) {
                match c.name("m") {
                    Some(m) => {
                        self.spec_config.method = Some(m.as_str().to_string());
                        self.spec_config.line.get_or_insert(no);
                        if let Some(k) = p.sglang_spec_steps.captures(msg) {
                            self.spec_config.k = k["k"].parse().ok();
                        }
                    }
                    None => {
                        self.spec_config.off_line.get_or_insert(no);
                    }
                }
            }
        }
        if let Some(c) = p.kvdtype_using.captures(msg) {
            self.kv_cache_dtype.get_or_insert(c["q"].to_string());
        }
        if msg.contains("Loading drafter model")
            || msg.contains("Loading draft model")
            || msg.contains("loading draft model")
            || msg.contains("Detected MTP model")
        {
            self.spec_config.drafter_line.get_or_insert(no);
            self.lines_recognised += 1;
        }

        if l.level == Some(Level::Warning) && p.kv_scale.is_match(msg) {
            let m = msg.trim().to_string();
            if !self.kv_scale_warnings.iter().any(|w| w.message == m) {
                self.kv_scale_warnings.push(ScaleWarning {
                    message: m,
                    line: no,
                });
            }
            self.lines_recognised += 1;
        }

        if let Some(s) = parse_spec_line(no, msg) {
            self.spec_lines.push(s);
            self.lines_recognised += 1;
        }

        // llama.cpp per-request timings.
        if let Some(c) = p.llama_prompt.captures(l.msg) {
            self.request_timings.push(RequestTiming {
                line: no,
                prompt_tokens: num(&c["n"]),
                prompt_ms: fnum(&c["ms"]),
                generated_tokens: None,
                generation_ms: None,
            });
            self.lines_recognised += 1;
        } else if let Some(c) = p.llama_eval.captures(l.msg) {
            if let Some(t) = self
                .request_timings
                .last_mut()
                .filter(|t| t.generated_tokens.is_none() && no <= t.line + 3)
            {
                t.generated_tokens = num(&c["n"]);
                t.generation_ms = fnum(&c["ms"]);
                self.lines_recognised += 1;
            }
        }
        if self.lines_recognised == recognised_before
            && self.boots.last().is_some_and(|b| b.last_line == no)
        {
            self.lines_recognised += 1;
        }
    }

    fn push_choice(&mut self, what: String, kernel: &str, no: usize) {
        if !self
            .kernel_choices
            .iter()
            .any(|c| c.what == what && c.kernel == kernel)
        {
            self.kernel_choices.push(KernelChoice {
                what,
                kernel: kernel.to_string(),
                line: no,
            });
        }
        self.lines_recognised += 1;
    }

    /// Group error lines (see the module docs).
    fn errors_from(&mut self, l: &Line) {
        let text = l.text();
        let is_err = l.level.is_some_and(Level::is_error);
        let headered = matches!(
            l.form,
            Form::Vllm | Form::Glog | Form::Llamacpp | Form::Python
        );
        let key = (l.proc.clone(), l.site.clone());
        // A header from this process that is not an error closes its open group.
        if headered && !is_err {
            self.open.remove(&l.proc);
        }
        if is_err {
            if let Some(&gi) = self.open.get(&l.proc) {
                if self.errors[gi].key.as_ref() == Some(&key) {
                    self.extend_group(gi, l);
                    return;
                }
            }
            self.open.remove(&l.proc);
            if self.errors.len() >= MAX_ERRORS {
                return;
            }
            let piece = l.is_traceback_piece();
            let gi = self.errors.len();
            let mut g = ErrorGroup {
                line: l.no,
                last_line: l.no,
                level: l.level,
                proc: l.proc.clone(),
                occurrences: 1,
                boot: self.boots.last().map(|b| b.index),
                key: Some(key),
                ..Default::default()
            };
            if let Some(r) = l.rank {
                g.ranks.insert(r);
            }
            if piece {
                g.traceback_lines = 1;
                if text.starts_with("Traceback") {
                    g.traceback_lines = 1;
                }
            } else if is_exception_line(text) {
                g.exception = Some(text.to_string());
                g.headline = Some(text.to_string());
            } else if !text.is_empty() {
                g.headline = Some(text.to_string());
            }
            g.text.push((l.no, text.to_string()));
            g.sites.extend(l.site.clone());
            self.errors.push(g);
            self.open.insert(l.proc.clone(), gi);
            self.lines_recognised += 1;
            return;
        }
        // Plain (headerless) tracebacks and exception lines.
        if l.form == Form::Plain || l.form == Form::Sglang {
            if let Some(gi) = self.plain_tb {
                let same_proc = self.errors[gi].proc == l.proc;
                if same_proc && (l.is_traceback_piece() || text.is_empty()) {
                    self.extend_group(gi, l);
                    return;
                }
                if same_proc && is_exception_line(text) {
                    self.extend_group(gi, l);
                    self.plain_tb = None;
                    return;
                }
                self.plain_tb = None;
            }
            if text.contains("Traceback (most recent call last)") && self.errors.len() < MAX_ERRORS
            {
                let gi = self.errors.len();
                self.errors.push(ErrorGroup {
                    line: l.no,
                    last_line: l.no,
                    proc: l.proc.clone(),
                    occurrences: 1,
                    traceback_lines: 1,
                    boot: self.boots.last().map(|b| b.index),
                    headline: text
                        .find("Traceback (most recent call last)")
                        .map(|i| text[..i].trim().trim_end_matches(':').trim().to_string())
                        .filter(|h| !h.is_empty()),
                    text: vec![(l.no, text.to_string())],
                    ..Default::default()
                });
                self.plain_tb = Some(gi);
                self.lines_recognised += 1;
                return;
            }
        }
        // A line outside any error block that names a cause (plain `ValueError: ...`, the
        // engine's `Value error, ...`, a toolchain warning), or a plain exception line.
        let candidate = l.level.is_none()
            || (l.level == Some(Level::Warning)
                && text.contains("not compatible with the current PyTorch"));
        if candidate && self.errors.len() < MAX_ERRORS {
            let cause = classify(text, "");
            let exception = is_exception_line(text) && !text.contains("Warning");
            let plain_error = [
                "error loading model",
                "failed to load model",
                "exiting due to model loading error",
                "Scheduler hit an exception",
            ]
            .iter()
            .any(|m| text.contains(m));
            if cause.is_some() || exception || plain_error {
                self.errors.push(ErrorGroup {
                    line: l.no,
                    last_line: l.no,
                    headline: Some(text.to_string()),
                    exception: exception.then(|| text.to_string()),
                    level: l.level,
                    proc: l.proc.clone(),
                    ranks: l.rank.into_iter().collect(),
                    occurrences: 1,
                    cause,
                    cause_line: None,
                    boot: self.boots.last().map(|b| b.index),
                    text: vec![(l.no, text.to_string())],
                    ..Default::default()
                });
                self.lines_recognised += 1;
            }
        }
    }

    fn extend_group(&mut self, gi: usize, l: &Line) {
        let text = l.text();
        let g = &mut self.errors[gi];
        g.last_line = l.no;
        if let Some(r) = l.rank {
            g.ranks.insert(r);
        }
        if l.is_traceback_piece() {
            g.traceback_lines += 1;
        } else if is_exception_line(text) {
            g.traceback_lines += 1;
            g.exception = Some(text.to_string());
        } else if g.headline.is_none() && !text.is_empty() && g.traceback_lines == 0 {
            g.headline = Some(text.to_string());
        }
        if g.text.len() < MAX_TEXT {
            g.text.push((l.no, text.to_string()));
        }
        g.sites.extend(l.site.clone());
        self.lines_recognised += 1;
    }

    /// Close the parse: causes, deduplication, boot statuses and checks. Called by
    /// [`EngineLog::parse`]; call it after feeding lines with [`EngineLog::push_line`].
    pub fn finish(&mut self) {
        self.open.clear();
        self.plain_tb = None;
        // Causes from each group's whole text.
        for g in &mut self.errors {
            if g.cause.is_none() {
                let context = g
                    .sites
                    .iter()
                    .map(String::as_str)
                    .chain(g.text.iter().map(|(_, t)| t.as_str()))
                    .collect::<Vec<_>>()
                    .join("\n");
                for (no, t) in &g.text {
                    if let Some(c) = classify(t, &context) {
                        g.cause = Some(c);
                        g.cause_line = Some(*no);
                        break;
                    }
                }
            } else if g.cause_line.is_none() {
                g.cause_line = Some(g.line);
            }
            g.generic = g.cause.is_none()
                && g.headline
                    .as_deref()
                    .is_some_and(|h| GENERIC.iter().any(|m| h.contains(m)));
        }
        // Deduplicate: the same message (several ranks, repeats) is one group.
        let mut merged: Vec<ErrorGroup> = Vec::new();
        for g in std::mem::take(&mut self.errors) {
            let same = merged.iter_mut().find(|m| {
                m.headline == g.headline
                    && m.exception == g.exception
                    && m.cause == g.cause
                    && m.boot == g.boot
                    && (m.headline.is_some() || m.exception.is_some())
            });
            match same {
                Some(m) => {
                    m.occurrences += g.occurrences;
                    m.ranks.extend(g.ranks.iter().copied());
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
        // Boot statuses, implied block sizes and the KV check.
        let n = self.boots.len();
        for (bi, b) in self.boots.iter_mut().enumerate() {
            let startup_error = b.errors.iter().any(|&i| {
                let g = &self.errors[i];
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
            let _ = (bi, n);
        }
        // The engine: the most frequent line form wins; an explicit version line says vLLM.
        if self.engine.is_none() {
            self.engine = ["llama.cpp", "sglang", "rigbench", "vllm"]
                .iter()
                .filter_map(|e| self.forms.get(e).map(|n| (*n, *e)))
                .max_by_key(|(n, _)| *n)
                .map(|(_, e)| e.to_string())
                .or_else(|| {
                    (!self.spec_lines.is_empty()
                        && self.spec_lines.iter().all(|s| {
                            !matches!(
                                s.generation,
                                super::spec::SpecLogGeneration::Sglang
                                    | super::spec::SpecLogGeneration::Llamacpp
                            )
                        }))
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
            && self.non_default_args.is_none()
            && self.errors.is_empty()
            && self.spec_lines.is_empty()
            && self.request_timings.is_empty()
    }
}
