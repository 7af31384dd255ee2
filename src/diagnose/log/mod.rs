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
//!
//! Files: `boot.rs` (a boot's record and its KV facts), `records.rs` ([`EngineLog`] and the
//! other records, with the queries on a parsed log), `writer.rs` (what the engine readers write
//! through: facts into boots, kernel choices, the number helpers), `errors.rs` (error lines
//! grouped into [`ErrorGroup`]s), and here the reading itself: [`EngineLog::parse`], the line
//! loop, the lines every engine prints alike, and [`EngineLog::finish`].

mod boot;
mod errors;
mod records;
mod writer;

use std::sync::OnceLock;

use regex::Regex;

use super::cause::classify;
use super::engines;
use super::line::{Form, Level, Line};
use super::spec::parse_spec_line;

pub use boot::{
    BlockOverride, Boot, BootStatus, KvBuffer, KvCells, KvCheck, KvPadding, KvReading, Reduced,
    SglangMemory, Slots,
};
pub use records::{
    ChainLink, EngineLog, ErrorGroup, KernelChoice, KernelPath, MarlinFallback, RequestTiming,
    ScaleWarning, SpecConfig,
};
use writer::worker_role;
pub(crate) use writer::{fnum, num, to_bytes, Repeat};

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

    /// Close the parse: causes, deduplication, boot statuses and checks. Called by
    /// [`EngineLog::parse`]; call it after feeding lines with [`EngineLog::push_line`].
    pub fn finish(&mut self) {
        self.open.clear();
        self.plain_tb = None;
        self.chain_tail = None;
        self.find_group_causes();
        self.merge_duplicate_groups();
        self.explain_generic_groups();
        self.attach_groups_to_boots();
        engines::finish_boots(self);
        self.judge_boots();
        self.guess_engine();
        self.spec_method = self.spec_config.method.clone();
        self.spec_k = self.spec_config.k;
    }

    /// Causes from each group's whole text: every distinct one, in order; whether a group is a
    /// generic wrapper; an interrupt (Ctrl-C) marks the request to stop, not a fault.
    fn find_group_causes(&mut self) {
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
    }

    /// Deduplicate: the same message (several ranks, a worker pool, repeats) is one group;
    /// the same message from two pids of a once-per-boot process is two.
    fn merge_duplicate_groups(&mut self) {
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
    }

    /// Generic wrappers point at the cause found elsewhere (same boot first).
    fn explain_generic_groups(&mut self) {
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
    }

    /// Each group listed by the boot it belongs to, extending the boot's last line.
    fn attach_groups_to_boots(&mut self) {
        for (i, g) in self.errors.iter().enumerate() {
            if let Some(b) = g.boot.and_then(|b| self.boots.get_mut(b - 1)) {
                b.errors.push(i);
                b.last_line = b.last_line.max(g.last_line);
            }
        }
    }

    /// Boot statuses, implied block sizes and the KV check.
    fn judge_boots(&mut self) {
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
    }

    /// The engine, when no line named it: the most frequent line form wins.
    fn guess_engine(&mut self) {
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
