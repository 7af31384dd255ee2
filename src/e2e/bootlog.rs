//! Engine boot and runtime log parsing: what an engine says about its KV cache, quantization,
//! speculative decoding and startup failures.
//!
//! Formats follow vLLM's log lines across versions (V0 0.6 to V1 0.24, examples in
//! `shared/fixtures/logs/`), plus `rigbench serve`'s one-line KV summary
//! (`KV cache: N tokens (B blocks × S); max concurrency at L tokens: X.Yx`). Lines may carry a
//! process prefix (`(Worker_TP1 pid=646936)`, `(EngineCore_DP0 pid=643458)`), numbers may carry
//! thousands separators, and two facts may share a line. Unrecognized lines are ignored.
//!
//! Speculative-decoding lines come in four generations (see [`SpecLogGeneration`]); V0 lines
//! carry cumulative counts, later ones per-interval counts. [`SpecPooled`] pools them the way
//! Prometheus' `increase()` would: interval counts are summed, cumulative counts contribute the
//! last value of each run of non-decreasing values (a drop marks an engine restart). The pooled
//! acceptance rate is Σaccepted / Σdrafted, never a mean of per-interval rates.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// One report of the KV cache's size (an engine boot prints one; a log may hold several boots).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KvReport {
    /// `GPU KV cache size: N tokens` (vLLM V1 and `rigbench serve` on a GPU), `CPU KV cache
    /// size: N tokens` (`rigbench serve` on its CPU backend) or rigbench's older `KV cache: N
    /// tokens`.
    pub kv_cache_tokens: Option<u64>,
    /// `# GPU blocks: N` (V0) or rigbench's block count.
    pub gpu_blocks: Option<u64>,
    /// `# CPU blocks: N` (V0 swap space).
    pub cpu_blocks: Option<u64>,
    /// Tokens per KV block, when the log states it (rigbench's line).
    pub block_size: Option<u64>,
    /// `Maximum concurrency for L tokens per request: X x`: `(L, X)`.
    pub max_concurrency: Option<(u64, f64)>,
    /// `Available KV cache memory: X GiB` (V1) or `kv_cache_size=X GiB` (V0 memory profile), bytes.
    pub available_kv_memory_bytes: Option<u64>,
    /// 1-based line number where this report starts.
    pub line: usize,
}

impl KvReport {
    /// KV capacity in tokens: stated, or blocks × block size when both are known.
    pub fn capacity_tokens(&self) -> Option<u64> {
        self.kv_cache_tokens
            .or_else(|| Some(self.gpu_blocks? * self.block_size?))
    }
}

/// The Marlin W4A16 fallback warning ("Your GPU does not have native support for FP4
/// computation ... Weight-only FP4 compression will be used leveraging the Marlin kernel"),
/// deduplicated over ranks and call sites into one finding.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MarlinFallback {
    /// Tensor-parallel (or worker) ranks that printed it; empty when lines carry no rank.
    pub ranks: BTreeSet<u32>,
    /// Source locations that printed it (`nvfp4_utils.py:144`).
    pub call_sites: BTreeSet<String>,
    /// Number of lines.
    pub occurrences: usize,
}

/// An engine failure found in the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StartupError {
    /// The KV cache cannot hold one request of `max_model_len` tokens.
    KvTooSmallForMaxLen {
        /// The requested max model length.
        max_model_len: u64,
        /// Tokens the KV cache holds (V0 wording).
        kv_cache_tokens: Option<u64>,
        /// KV memory needed, GiB (V1 wording).
        needed_gib: Option<f64>,
        /// KV memory available, GiB (V1 wording).
        available_gib: Option<f64>,
        /// The engine's estimate of the largest max length that fits (newer V1 wording).
        estimated_max_model_len: Option<u64>,
        /// 1-based line number.
        line: usize,
    },
    /// CUDA / torch out of memory.
    OutOfMemory {
        /// `Tried to allocate X`.
        tried_to_allocate: Option<String>,
        /// 1-based line number.
        line: usize,
    },
    /// The quantization method or scheme needs a newer compute capability.
    QuantizationUnsupported {
        /// The method (`mxfp4`), when named.
        method: Option<String>,
        /// Minimum capability, e.g. 100 for sm_100.
        min_capability: Option<u32>,
        /// The card's capability, e.g. 86.
        current_capability: Option<u32>,
        /// 1-based line number.
        line: usize,
    },
    /// Another `ERROR`-level line (tracebacks left out), deduplicated.
    Other {
        /// The message after the log prefix.
        message: String,
        /// 1-based line number of its first occurrence.
        line: usize,
    },
}

/// The generation of a speculative-decoding log line (formats changed across vLLM versions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpecLogGeneration {
    /// V0 `Speculative metrics: ... System efficiency ... Number of emitted tokens`:
    /// cumulative counts since start.
    V0Cumulative,
    /// Early V1 `Speculative metrics: Draft acceptance rate, Number of accepted tokens,
    /// Number of draft tokens` (per interval).
    V1EarlySpeculative,
    /// Early V1 `SpecDecoding metrics: Draft acceptance rate: X%, Accepted: N tokens,
    /// Drafted: N tokens` (per interval, no mean acceptance length).
    V1Early,
    /// V1 `SpecDecoding metrics:` with mean acceptance length and per-position rates
    /// (per interval).
    V1,
}

impl SpecLogGeneration {
    /// Whether counts are cumulative since engine start (else per logging interval).
    pub fn cumulative(self) -> bool {
        matches!(self, SpecLogGeneration::V0Cumulative)
    }
}

/// One speculative-decoding log line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpecLogLine {
    /// Its format generation.
    pub generation: SpecLogGeneration,
    /// Accepted draft tokens.
    pub accepted: Option<u64>,
    /// Drafted tokens.
    pub drafted: Option<u64>,
    /// Emitted tokens (V0).
    pub emitted: Option<u64>,
    /// The acceptance rate as printed (fraction, 0..1, percent signs converted).
    pub acceptance_rate: Option<f64>,
    /// Mean acceptance length as printed (1 + accepted / drafts).
    pub mean_acceptance_length: Option<f64>,
    /// Per-position acceptance rates as printed.
    pub per_position: Vec<f64>,
    /// Draft tokens per step: `Number of speculative tokens` or the per-position count.
    pub k: Option<u32>,
    /// 1-based line number.
    pub line: usize,
}

/// Speculative decoding pooled over all lines of a log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpecPooled {
    /// Σ accepted tokens.
    pub accepted: u64,
    /// Σ drafted tokens.
    pub drafted: u64,
    /// Σaccepted / Σdrafted.
    pub acceptance_rate: Option<f64>,
    /// 1 + Σaccepted / Σdrafts, where drafts = drafted / k per line (lines with k known).
    pub mean_acceptance_length: Option<f64>,
    /// Per-position acceptance pooled over lines that print it, weighted by their drafts.
    pub per_position: Vec<f64>,
    /// k when every line that states it agrees.
    pub k: Option<u32>,
}

/// Everything found in one engine log.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BootLog {
    /// Engine version stated in the log (`vLLM API server version X`, `LLM engine (vX)`).
    pub engine_version: Option<String>,
    /// KV cache reports, in log order (one per boot).
    pub kv: Vec<KvReport>,
    /// The Marlin FP4 fallback, when warned.
    pub marlin_fp4_fallback: Option<MarlinFallback>,
    /// Resolved quantization method (`modelopt`, `fp8`, `compressed-tensors`, ...).
    pub quantization: Option<String>,
    /// KV cache dtype (`fp8`, `auto`, ...).
    pub kv_cache_dtype: Option<String>,
    /// Speculative method from the engine config (`ngram`, `mtp`, `eagle`, ...).
    pub spec_method: Option<String>,
    /// Speculative k from the engine config.
    pub spec_k: Option<u32>,
    /// Warnings about KV-cache scales (missing k/v scales, defaults of 1.0), deduplicated.
    pub kv_scale_warnings: Vec<String>,
    /// The `non-default args: {...}` dictionary text, reported once however often it appears.
    pub non_default_args: Option<String>,
    /// Startup (and runtime) failures.
    pub errors: Vec<StartupError>,
    /// Speculative-decoding metrics lines, in log order.
    pub spec_lines: Vec<SpecLogLine>,
    /// Lines read.
    pub lines_read: usize,
}

struct Patterns {
    prefix: Regex,
    kv_tokens: Regex,
    max_conc: Regex,
    avail_kv: Regex,
    v0_profile_kv: Regex,
    gpu_blocks: Regex,
    rigbench_kv: Regex,
    call_site: Regex,
    version: Regex,
    quant_dict: Regex,
    quant_cfg: Regex,
    kvdtype_dict: Regex,
    kvdtype_cfg: Regex,
    spec_method: Regex,
    spec_k: Regex,
    kv_scale: Regex,
    err_v0_maxlen: Regex,
    err_v1_maxlen: Regex,
    err_estimated: Regex,
    err_oom_tried: Regex,
    err_quant_method: Regex,
    err_quant_scheme: Regex,
    per_position: Regex,
    level: Regex,
}

fn patterns() -> &'static Patterns {
    static P: OnceLock<Patterns> = OnceLock::new();
    P.get_or_init(|| {
        let r = |s: &str| Regex::new(s).expect("static regex");
        Patterns {
            prefix: r(r"^\((?P<proc>[^\s()]+) pid=\d+\)\s?"),
            kv_tokens: r(r"(?:GPU|CPU) KV cache size:\s*(?P<n>\d+(?:,\d{3})*)\s*tokens"),
            max_conc: r(
                r"(?i)Maximum concurrency for\s*(?P<len>\d+(?:,\d{3})*)\s*tokens per request:\s*(?P<x>\d+(?:,\d{3})*(?:\.\d+)?)\s*x",
            ),
            avail_kv: r(r"Available KV cache memory:\s*(?P<v>[\d.]+)\s*(?P<u>[KMGT]i?B)"),
            v0_profile_kv: r(r"\bkv_cache_size=(?P<v>[\d.]+)\s*(?P<u>[KMGT]i?B)"),
            gpu_blocks: r(r"#?\s*GPU blocks:\s*(?P<g>\d+(?:,\d{3})*)(?:,\s*#?\s*CPU blocks:\s*(?P<c>\d+(?:,\d{3})*))?"),
            rigbench_kv: r(
                r"KV cache:\s*(?P<n>\d+(?:,\d{3})*)\s*tokens\s*\((?P<b>\d+(?:,\d{3})*)\s*blocks\s*[×x*]\s*(?P<bs>\d+)\)(?:;\s*max concurrency at\s*(?P<len>\d+(?:,\d{3})*)\s*tokens:\s*(?P<x>\d+(?:,\d{3})*(?:\.\d+)?)\s*x)?",
            ),
            call_site: r(r"\[?(?P<site>[\w.-]+\.py:\d+)\]"),
            version: r(
                r"(?:vLLM API server version|LLM engine \(v|vLLM version)\s*(?P<v>v?\d+\.\d+[\w.+-]*)",
            ),
            quant_dict: r(r"'quantization':\s*'(?P<q>[\w-]+)'"),
            quant_cfg: r(r"\bquantization=(?P<q>[\w-]+)"),
            kvdtype_dict: r(r"'kv_cache_dtype':\s*'(?P<q>[\w-]+)'"),
            kvdtype_cfg: r(r"\bkv_cache_dtype=(?P<q>[\w-]+)"),
            spec_method: r(r#"['"]?method['"]?\s*[:=]\s*['"](?P<m>[\w-]+)['"]"#),
            spec_k: r(r#"['"]?num_spec(?:ulative)?_tokens['"]?\s*[:=]\s*(?P<k>\d+)"#),
            kv_scale: r(
                r"(?i)(?:\b[kvq]_scale|kv_scale|prob_scale|KV cache scaling factor|k/v_scale)",
            ),
            err_v0_maxlen: r(
                r"max seq len \((?P<len>\d+)\) is larger than the maximum number of tokens that can be stored in KV cache \((?P<kv>\d+)\)",
            ),
            err_v1_maxlen: r(
                r"To serve at least one request with the models?'s max seq len \((?P<len>\d+)\), \((?P<need>[\d.]+) GiB KV cache is needed, which is larger than the available KV cache memory \((?P<avail>[\d.]+) GiB\)",
            ),
            err_estimated: r(r"estimated maximum model length is (?P<n>\d+)"),
            err_oom_tried: r(r"Tried to allocate (?P<t>[\d.]+ [KMGT]i?B)"),
            err_quant_method: r(
                r"quantization method (?P<m>[\w-]+) is not supported for the current GPU\. Minimum capability: (?P<min>\d+)\. Current capability: (?P<cur>\d+)",
            ),
            err_quant_scheme: r(
                r"(?s)Quantization scheme is not supported for .*?Min capability: (?P<min>\d+)\..*?Current capability: (?P<cur>\d+)",
            ),
            per_position: r(r"Per-position acceptance rate:\s*(?P<l>[\d.]+(?:\s*,\s*[\d.]+)*)"),
            level: r(r"^(?:(?P<lvl>INFO|WARNING|ERROR|DEBUG|CRITICAL)\b[^\]]*\](?P<ws>\s*))?(?P<msg>.*)$"),
        }
    })
}

fn num(s: &str) -> Option<u64> {
    s.replace(',', "").parse().ok()
}

fn fnum(s: &str) -> Option<f64> {
    s.trim_end_matches(',').replace(',', "").parse().ok()
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
    Some((v * mult).round() as u64)
}

impl BootLog {
    /// Parse a whole log. Never fails; unrecognized lines are ignored.
    pub fn parse(text: &str) -> Self {
        let mut log = BootLog::default();
        for (i, line) in text.lines().enumerate() {
            log.push_line(i + 1, line);
        }
        log
    }

    /// Parse a log file.
    ///
    /// # Errors
    /// The file cannot be read ([`crate::RigError::BadFile`]). Non-UTF-8 bytes are replaced.
    pub fn parse_file(path: &std::path::Path) -> Result<Self, crate::RigError> {
        let bytes = std::fs::read(path)
            .map_err(|e| crate::RigError::file(path, format!("cannot read engine log: {e}")))?;
        Ok(Self::parse(&String::from_utf8_lossy(&bytes)))
    }

    fn current_kv(
        &mut self,
        line: usize,
        field_taken: impl Fn(&KvReport) -> bool,
    ) -> &mut KvReport {
        let need_new = match self.kv.last() {
            None => true,
            Some(k) => field_taken(k),
        };
        if need_new {
            self.kv.push(KvReport {
                line,
                ..Default::default()
            });
        }
        self.kv.last_mut().expect("pushed above")
    }

    /// Feed one line (1-based `line_no`).
    pub fn push_line(&mut self, line_no: usize, raw: &str) {
        let p = patterns();
        self.lines_read += 1;
        let raw = raw.trim_end_matches(['\r', '\n']);
        let (proc_name, rest) = match p.prefix.captures(raw) {
            Some(c) => (
                c.name("proc").map(|m| m.as_str().to_string()),
                &raw[c.get(0).map_or(0, |m| m.end())..],
            ),
            None => (None, raw),
        };
        let rest = rest.trim();
        if rest.is_empty() || rest.starts_with('#') && !rest.contains("GPU blocks") {
            return;
        }
        let lc = p.level.captures(rest);
        let level = lc.as_ref().and_then(|c| c.name("lvl")).map(|m| m.as_str());
        let msg = lc
            .as_ref()
            .and_then(|c| c.name("msg"))
            .map_or(rest, |m| m.as_str());
        // Indented text after the `[file.py:N]` tag is a traceback continuation.
        let continuation = lc
            .as_ref()
            .and_then(|c| c.name("ws"))
            .is_some_and(|m| m.as_str().len() > 1);

        if self.engine_version.is_none() {
            if let Some(c) = p.version.captures(rest) {
                self.engine_version = Some(c["v"].trim_start_matches('v').to_string());
            }
        }

        // KV cache size facts (possibly several on one line).
        if let Some(c) = p.rigbench_kv.captures(rest) {
            let k = self.current_kv(line_no, |k| k.kv_cache_tokens.is_some());
            k.kv_cache_tokens = num(&c["n"]);
            k.gpu_blocks = num(&c["b"]);
            k.block_size = num(&c["bs"]);
            if let (Some(l), Some(x)) = (c.name("len"), c.name("x")) {
                if let (Some(l), Some(x)) = (num(l.as_str()), fnum(x.as_str())) {
                    k.max_concurrency = Some((l, x));
                }
            }
        } else {
            if let Some(c) = p.kv_tokens.captures(rest) {
                let n = num(&c["n"]);
                let k = self.current_kv(line_no, |k| k.kv_cache_tokens.is_some());
                k.kv_cache_tokens = n;
            }
            if let Some(c) = p.gpu_blocks.captures(rest) {
                let g = num(&c["g"]);
                let cpu = c.name("c").and_then(|m| num(m.as_str()));
                let k = self.current_kv(line_no, |k| k.gpu_blocks.is_some());
                k.gpu_blocks = g;
                k.cpu_blocks = cpu;
            }
            if let Some(c) = p.max_conc.captures(rest) {
                if let (Some(l), Some(x)) = (num(&c["len"]), fnum(&c["x"])) {
                    let k = self.current_kv(line_no, |k| k.max_concurrency.is_some());
                    k.max_concurrency = Some((l, x));
                }
            }
        }
        if let Some(c) = p
            .avail_kv
            .captures(rest)
            .or_else(|| p.v0_profile_kv.captures(rest))
        {
            if let Some(b) = fnum(&c["v"]).and_then(|v| to_bytes(v, &c["u"])) {
                let k = self.current_kv(line_no, |k| k.available_kv_memory_bytes.is_some());
                k.available_kv_memory_bytes = Some(b);
            }
        }

        // Marlin FP4 fallback: one finding over ranks and call sites.
        if rest.contains("does not have native support for FP4 computation") {
            let f = self
                .marlin_fp4_fallback
                .get_or_insert_with(Default::default);
            f.occurrences += 1;
            if let Some(rank) = proc_name.as_deref().and_then(rank_of) {
                f.ranks.insert(rank);
            }
            if let Some(c) = p.call_site.captures(rest) {
                f.call_sites.insert(c["site"].to_string());
            }
        }

        // Engine configuration: non-default args (once), resolved quantization, KV dtype, spec.
        if let Some(pos) = rest.find("non-default args:") {
            let args = rest[pos + "non-default args:".len()..].trim().to_string();
            if self.non_default_args.is_none() {
                self.non_default_args = Some(args);
            }
        }
        let is_config = rest.contains("non-default args:")
            || rest.contains("with config:")
            || rest.contains("speculative_config");
        if is_config {
            if let Some(c) = p
                .quant_dict
                .captures(rest)
                .or_else(|| p.quant_cfg.captures(rest))
            {
                if c["q"] != *"None" {
                    self.quantization = Some(c["q"].to_string());
                }
            }
            if let Some(c) = p
                .kvdtype_dict
                .captures(rest)
                .or_else(|| p.kvdtype_cfg.captures(rest))
            {
                self.kv_cache_dtype = Some(c["q"].to_string());
            }
            if let Some(pos) = rest.find("speculative_config") {
                let tail = &rest[pos..];
                if let Some(c) = p.spec_method.captures(tail) {
                    if c["m"] != *"None" {
                        self.spec_method = Some(c["m"].to_string());
                    }
                }
                if let Some(c) = p.spec_k.captures(tail) {
                    self.spec_k = c["k"].parse().ok();
                }
            }
        }

        if level == Some("WARNING") && p.kv_scale.is_match(msg) {
            let m = msg.trim().to_string();
            if !self.kv_scale_warnings.contains(&m) {
                self.kv_scale_warnings.push(m);
            }
        }

        self.push_errors(line_no, level, msg, rest, continuation);

        if let Some(s) = parse_spec_line(line_no, rest) {
            self.spec_lines.push(s);
        }
    }

    fn push_errors(
        &mut self,
        line_no: usize,
        level: Option<&str>,
        msg: &str,
        rest: &str,
        continuation: bool,
    ) {
        let p = patterns();
        if let Some(c) = p.err_v0_maxlen.captures(rest) {
            self.errors.push(StartupError::KvTooSmallForMaxLen {
                max_model_len: num(&c["len"]).unwrap_or(0),
                kv_cache_tokens: num(&c["kv"]),
                needed_gib: None,
                available_gib: None,
                estimated_max_model_len: None,
                line: line_no,
            });
            return;
        }
        if let Some(c) = p.err_v1_maxlen.captures(rest) {
            self.errors.push(StartupError::KvTooSmallForMaxLen {
                max_model_len: num(&c["len"]).unwrap_or(0),
                kv_cache_tokens: None,
                needed_gib: fnum(&c["need"]),
                available_gib: fnum(&c["avail"]),
                estimated_max_model_len: p.err_estimated.captures(rest).and_then(|e| num(&e["n"])),
                line: line_no,
            });
            return;
        }
        if rest.contains("CUDA out of memory") || rest.contains("OutOfMemoryError") {
            let tried = p.err_oom_tried.captures(rest).map(|c| c["t"].to_string());
            let dup = self.errors.iter().any(|e| {
                matches!(e, StartupError::OutOfMemory { tried_to_allocate, .. } if *tried_to_allocate == tried)
            });
            if !dup {
                self.errors.push(StartupError::OutOfMemory {
                    tried_to_allocate: tried,
                    line: line_no,
                });
            }
            return;
        }
        if let Some(c) = p.err_quant_method.captures(rest) {
            self.errors.push(StartupError::QuantizationUnsupported {
                method: Some(c["m"].to_string()),
                min_capability: c["min"].parse().ok(),
                current_capability: c["cur"].parse().ok(),
                line: line_no,
            });
            return;
        }
        if let Some(c) = p.err_quant_scheme.captures(rest) {
            self.errors.push(StartupError::QuantizationUnsupported {
                method: None,
                min_capability: c["min"].parse().ok(),
                current_capability: c["cur"].parse().ok(),
                line: line_no,
            });
            return;
        }
        if matches!(level, Some("ERROR") | Some("CRITICAL")) {
            let m = msg.trim();
            let traceback = continuation
                || m.starts_with("Traceback")
                || m.starts_with("File \"")
                || m.is_empty();
            let dup = self
                .errors
                .iter()
                .any(|e| matches!(e, StartupError::Other { message, .. } if message == m));
            if !traceback && !dup && self.errors.len() < 32 {
                self.errors.push(StartupError::Other {
                    message: m.to_string(),
                    line: line_no,
                });
            }
        }
    }

    /// The last KV report that states a capacity.
    pub fn kv_capacity(&self) -> Option<(u64, &KvReport)> {
        self.kv
            .iter()
            .rev()
            .find_map(|k| k.capacity_tokens().map(|t| (t, k)))
    }

    /// Speculative decoding pooled over every line; `None` without spec lines.
    pub fn spec_pooled(&self) -> Option<SpecPooled> {
        pool_spec(&self.spec_lines)
    }

    /// Whether anything at all was recognized.
    pub fn is_empty(&self) -> bool {
        self.engine_version.is_none()
            && self.kv.is_empty()
            && self.marlin_fp4_fallback.is_none()
            && self.quantization.is_none()
            && self.kv_cache_dtype.is_none()
            && self.spec_method.is_none()
            && self.kv_scale_warnings.is_empty()
            && self.non_default_args.is_none()
            && self.errors.is_empty()
            && self.spec_lines.is_empty()
    }
}

/// `Worker_TP1` → 1; `Worker_PP0_TP3` → 3; `Worker_2` → 2.
fn rank_of(proc_name: &str) -> Option<u32> {
    static TP: OnceLock<Regex> = OnceLock::new();
    let re = TP.get_or_init(|| Regex::new(r"(?:TP|rank)(\d+)|_(\d+)$").expect("static regex"));
    let c = re.captures(proc_name)?;
    c.get(1).or_else(|| c.get(2))?.as_str().parse().ok()
}

/// A rate as printed: `88.8%` → 0.888, `0.642` → 0.642.
fn rate(v: &str) -> Option<f64> {
    let v = v.trim();
    match v.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().ok().map(|x| x / 100.0),
        None => v.parse().ok(),
    }
}

/// The leading integer of `464 tokens`.
fn count(v: &str) -> Option<u64> {
    v.split_whitespace().next().and_then(num)
}

fn parse_spec_line(line_no: usize, rest: &str) -> Option<SpecLogLine> {
    let (body, v1) = if let Some(i) = rest.find("SpecDecoding metrics:") {
        (&rest[i + "SpecDecoding metrics:".len()..], true)
    } else if let Some(i) = rest.find("Speculative metrics:") {
        (&rest[i + "Speculative metrics:".len()..], false)
    } else {
        return None;
    };
    let p = patterns();
    let mut per_position = Vec::new();
    let mut body = body.to_string();
    if let Some(c) = p.per_position.captures(&body.clone()) {
        per_position = c["l"]
            .split(',')
            .filter_map(|x| x.trim().parse().ok())
            .collect();
        body = body.replace(c.get(0).map_or("", |m| m.as_str()), "");
    }
    let mut kv: BTreeMap<String, String> = BTreeMap::new();
    for part in body.split(", ") {
        if let Some((k, v)) = part.split_once(':') {
            kv.insert(
                k.trim().to_ascii_lowercase(),
                v.trim().trim_end_matches(['.', ',']).to_string(),
            );
        }
    }
    let get = |keys: &[&str]| keys.iter().find_map(|k| kv.get(*k).cloned());
    let accepted = get(&["number of accepted tokens", "accepted"]).and_then(|v| count(&v));
    let drafted = get(&["number of draft tokens", "drafted"]).and_then(|v| count(&v));
    let emitted = get(&["number of emitted tokens"]).and_then(|v| count(&v));
    let acceptance_rate =
        get(&["draft acceptance rate", "avg draft acceptance rate"]).and_then(|v| rate(&v));
    let mean_acceptance_length = get(&["mean acceptance length"]).and_then(|v| fnum(&v));
    let stated_k = get(&["number of speculative tokens"]).and_then(|v| count(&v));
    let k = stated_k
        .map(|k| k as u32)
        .or_else(|| (!per_position.is_empty()).then_some(per_position.len() as u32));
    let generation = if !v1 {
        if kv.contains_key("system efficiency") || emitted.is_some() {
            SpecLogGeneration::V0Cumulative
        } else {
            SpecLogGeneration::V1EarlySpeculative
        }
    } else if mean_acceptance_length.is_some() || !per_position.is_empty() {
        SpecLogGeneration::V1
    } else {
        SpecLogGeneration::V1Early
    };
    if accepted.is_none() && drafted.is_none() && acceptance_rate.is_none() {
        return None;
    }
    Some(SpecLogLine {
        generation,
        accepted,
        drafted,
        emitted,
        acceptance_rate,
        mean_acceptance_length,
        per_position,
        k,
        line: line_no,
    })
}

/// Pool speculative-decoding lines (see the module docs for the rule).
pub fn pool_spec(lines: &[SpecLogLine]) -> Option<SpecPooled> {
    if lines.is_empty() {
        return None;
    }
    // Per-line contributions (interval deltas): cumulative lines contribute only the last line
    // of each non-decreasing run.
    let mut contrib: Vec<&SpecLogLine> = Vec::new();
    let cumulative: Vec<&SpecLogLine> =
        lines.iter().filter(|l| l.generation.cumulative()).collect();
    for (i, l) in cumulative.iter().enumerate() {
        let next_resets = match cumulative.get(i + 1) {
            None => true,
            Some(n) => {
                n.drafted.unwrap_or(0) < l.drafted.unwrap_or(0)
                    || n.accepted.unwrap_or(0) < l.accepted.unwrap_or(0)
            }
        };
        if next_resets {
            contrib.push(l);
        }
    }
    contrib.extend(lines.iter().filter(|l| !l.generation.cumulative()));

    let mut accepted = 0u64;
    let mut drafted = 0u64;
    let mut acc_k = 0.0;
    let mut drafts_k = 0.0;
    let mut pos_sum: Vec<f64> = Vec::new();
    let mut pos_weight = 0.0;
    let mut ks = BTreeSet::new();
    for l in &contrib {
        let (Some(a), Some(d)) = (l.accepted, l.drafted) else {
            continue;
        };
        accepted += a;
        drafted += d;
        if let Some(k) = l.k.filter(|k| *k > 0) {
            ks.insert(k);
            let drafts = d as f64 / k as f64;
            acc_k += a as f64;
            drafts_k += drafts;
            if !l.per_position.is_empty() {
                if pos_sum.len() < l.per_position.len() {
                    pos_sum.resize(l.per_position.len(), 0.0);
                }
                for (i, r) in l.per_position.iter().enumerate() {
                    pos_sum[i] += r * drafts;
                }
                pos_weight += drafts;
            }
        }
    }
    for l in lines.iter().filter_map(|l| l.k) {
        ks.insert(l);
    }
    Some(SpecPooled {
        accepted,
        drafted,
        acceptance_rate: (drafted > 0).then(|| accepted as f64 / drafted as f64),
        mean_acceptance_length: (drafts_k > 0.0).then(|| 1.0 + acc_k / drafts_k),
        per_position: if pos_weight > 0.0 {
            pos_sum.iter().map(|s| s / pos_weight).collect()
        } else {
            Vec::new()
        },
        k: if ks.len() == 1 {
            ks.into_iter().next()
        } else {
            None
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(prefix: &str) -> Option<String> {
        let dir = std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../shared/fixtures/logs"
        ));
        let rd = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) => {
                eprintln!("SKIP: fixtures folder {} not readable ({e})", dir.display());
                return None;
            }
        };
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(prefix) {
                return std::fs::read_to_string(e.path()).ok();
            }
        }
        eprintln!("SKIP: no fixture log starting with {prefix}");
        None
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn log01_v0_two_boots_and_maxlen_error() {
        let Some(t) = fixture("01_") else { return };
        let l = BootLog::parse(&t);
        assert_eq!(l.kv.len(), 2, "{:?}", l.kv);
        assert_eq!(l.kv[0].gpu_blocks, Some(1952));
        assert_eq!(l.kv[0].cpu_blocks, Some(2048));
        assert_eq!(l.kv[0].max_concurrency, Some((20000, 1.56)));
        assert_eq!(l.kv[0].available_kv_memory_bytes, to_bytes(3.81, "GiB"));
        assert_eq!(l.kv[1].gpu_blocks, Some(1478));
        assert_eq!(l.kv[1].max_concurrency, Some((29000, 0.82)));
        // Block size is not in the V0 log: capacity stays unknown rather than assumed.
        assert_eq!(l.kv[0].capacity_tokens(), None);
        assert_eq!(
            l.errors,
            vec![StartupError::KvTooSmallForMaxLen {
                max_model_len: 29000,
                kv_cache_tokens: Some(23648),
                needed_gib: None,
                available_gib: None,
                estimated_max_model_len: None,
                line: 13,
            }]
        );
    }

    #[test]
    fn log02_v1_kv_size_with_separators() {
        let Some(t) = fixture("02_") else { return };
        let l = BootLog::parse(&t);
        assert_eq!(l.kv.len(), 1, "{:?}", l.kv);
        let k = &l.kv[0];
        assert_eq!(k.kv_cache_tokens, Some(652_144));
        assert_eq!(k.max_concurrency, Some((4096, 159.21)));
        assert_eq!(k.available_kv_memory_bytes, to_bytes(69.66, "GiB"));
        assert_eq!(l.kv_capacity().map(|x| x.0), Some(652_144));
        assert!(l.errors.is_empty(), "{:?}", l.errors);
    }

    #[test]
    fn log03_nvfp4_args_once_and_warnings_not_errors() {
        let Some(t) = fixture("03_") else { return };
        let l = BootLog::parse(&t);
        assert_eq!(l.kv_capacity().map(|x| x.0), Some(567_978));
        assert_eq!(l.kv[0].max_concurrency, Some((131_072, 4.33)));
        assert_eq!(l.kv[0].available_kv_memory_bytes, to_bytes(5.98, "GiB"));
        assert_eq!(l.quantization.as_deref(), Some("modelopt"));
        assert_eq!(l.kv_cache_dtype.as_deref(), Some("fp8"));
        let args = l.non_default_args.as_deref().expect("args");
        assert!(args.contains("'enable_prefix_caching': True"));
        assert!(
            l.errors.is_empty(),
            "unknown env var warnings are not errors: {:?}",
            l.errors
        );
        assert!(l.kv_scale_warnings.is_empty());
        assert!(l.marlin_fp4_fallback.is_none());
    }

    #[test]
    fn log06_marlin_fallback_one_finding_two_ranks() {
        let Some(t) = fixture("06_") else { return };
        let l = BootLog::parse(&t);
        let m = l.marlin_fp4_fallback.expect("finding");
        assert_eq!(m.ranks, BTreeSet::from([0, 1]));
        assert_eq!(m.occurrences, 3);
        assert_eq!(
            m.call_sites,
            BTreeSet::from([
                "marlin_utils_fp4.py:257".to_string(),
                "nvfp4_utils.py:144".to_string()
            ])
        );
        assert!(l.errors.is_empty());
    }

    #[test]
    fn log08_pooled_acceptance_is_ratio_of_sums() {
        let Some(t) = fixture("08_") else { return };
        let l = BootLog::parse(&t);
        assert_eq!(l.spec_lines.len(), 2);
        assert!(l
            .spec_lines
            .iter()
            .all(|s| s.generation == SpecLogGeneration::V1));
        assert_eq!(
            l.spec_lines[0].per_position,
            vec![0.763, 0.623, 0.459, 0.396]
        );
        assert!(close(l.spec_lines[0].acceptance_rate.unwrap(), 0.56));
        let p = l.spec_pooled().unwrap();
        assert_eq!((p.accepted, p.drafted, p.k), (692, 1384, Some(4)));
        assert!(close(p.acceptance_rate.unwrap(), 692.0 / 1384.0));
        // Not the mean of the per-interval rates (464/828 and 228/556 average to 0.485).
        assert!((p.acceptance_rate.unwrap() - 0.485).abs() > 0.01);
        // drafts = 828/4 + 556/4 = 346 → 1 + 692/346 = 3.0
        assert!(close(p.mean_acceptance_length.unwrap(), 3.0));
        assert!(close(
            p.per_position[0],
            (0.763 * 207.0 + 0.669 * 139.0) / 346.0
        ));
    }

    #[test]
    fn log10_four_generations_and_v0_cumulative() {
        let Some(t) = fixture("10_") else { return };
        let l = BootLog::parse(&t);
        use SpecLogGeneration::*;
        let gens: Vec<_> = l.spec_lines.iter().map(|s| s.generation).collect();
        assert_eq!(
            gens,
            vec![
                V0Cumulative,
                V0Cumulative,
                V0Cumulative,
                V1EarlySpeculative,
                V1Early,
                V1
            ]
        );
        assert_eq!(l.spec_lines[0].k, Some(3));
        assert_eq!(l.spec_lines[0].accepted, Some(8547));
        assert_eq!(l.spec_lines[4].acceptance_rate, Some(1.0));
        assert_eq!(l.spec_lines[4].mean_acceptance_length, None);
        assert_eq!(l.spec_lines[5].per_position.len(), 5);
        assert!(close(l.spec_lines[5].acceptance_rate.unwrap(), 0.888));
        // The two successive V0 lines of source (B) are cumulative: pooled = the last, not the sum.
        let b = pool_spec(&l.spec_lines[1..3]).unwrap();
        assert_eq!((b.accepted, b.drafted), (1, 15));
        // A drop in the cumulative counts is a restart: (A) and (B) are separate segments.
        let ab = pool_spec(&l.spec_lines[0..3]).unwrap();
        assert_eq!((ab.accepted, ab.drafted), (8547 + 1, 13311 + 15));
        let d = pool_spec(&l.spec_lines[5..6]).unwrap();
        assert!(close(d.mean_acceptance_length.unwrap(), 1.0 + 262.0 / 59.0));
    }

    #[test]
    fn log12_startup_errors() {
        let Some(t) = fixture("12_") else { return };
        let l = BootLog::parse(&t);
        let kinds: Vec<String> = l
            .errors
            .iter()
            .map(|e| {
                serde_json::to_value(e).unwrap()["kind"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(
            &kinds[..3],
            &[
                "kv_too_small_for_max_len",
                "kv_too_small_for_max_len",
                "out_of_memory"
            ],
            "{:?}",
            l.errors
        );
        match &l.errors[0] {
            StartupError::KvTooSmallForMaxLen {
                max_model_len,
                needed_gib,
                available_gib,
                estimated_max_model_len,
                ..
            } => {
                assert_eq!(*max_model_len, 1_048_576);
                assert_eq!((*needed_gib, *available_gib), (Some(24.0), Some(9.97)));
                assert_eq!(*estimated_max_model_len, None);
            }
            e => panic!("{e:?}"),
        }
        match &l.errors[1] {
            StartupError::KvTooSmallForMaxLen {
                estimated_max_model_len,
                available_gib,
                ..
            } => {
                assert_eq!(*estimated_max_model_len, Some(34736));
                assert_eq!(*available_gib, Some(3.18));
            }
            e => panic!("{e:?}"),
        }
        assert!(matches!(
            &l.errors[2],
            StartupError::OutOfMemory { tried_to_allocate: Some(t), .. } if t == "50.00 MiB"
        ));
        let quant: Vec<_> = l
            .errors
            .iter()
            .filter_map(|e| match e {
                StartupError::QuantizationUnsupported {
                    method,
                    min_capability,
                    current_capability,
                    ..
                } => Some((method.clone(), *min_capability, *current_capability)),
                _ => None,
            })
            .collect();
        assert_eq!(
            quant,
            vec![
                (Some("mxfp4".to_string()), Some(100), Some(86)),
                (None, Some(80), Some(75))
            ]
        );
        // Traceback lines are not separate errors.
        assert!(!l.errors.iter().any(|e| matches!(e, StartupError::Other { message, .. } if message.starts_with("Traceback") || message.starts_with("File"))));
    }

    #[test]
    fn rigbench_kv_line_and_config_lines() {
        let l = BootLog::parse(
            "KV cache: 1,234,560 tokens (77,160 blocks × 16); max concurrency at 32,768 tokens: 37.7x\n\
             INFO 01-01 00:00:00 [core.py:1] Initializing a V1 LLM engine (v0.10.1.1) with config: model='m', quantization=fp8, kv_cache_dtype=auto, speculative_config=SpeculativeConfig(method='ngram', model=None, num_spec_tokens=5)\n\
             WARNING 01-01 00:00:01 [kv_cache.py:9] Using KV cache scaling factor 1.0 for fp8_e4m3. Please make sure k/v_scale scaling factors are available in the fp8 checkpoint.\n\
             WARNING 01-01 00:00:01 [kv_cache.py:9] Using KV cache scaling factor 1.0 for fp8_e4m3. Please make sure k/v_scale scaling factors are available in the fp8 checkpoint.\n",
        );
        let k = &l.kv[0];
        assert_eq!(
            (k.kv_cache_tokens, k.gpu_blocks, k.block_size),
            (Some(1_234_560), Some(77_160), Some(16))
        );
        assert_eq!(k.max_concurrency, Some((32_768, 37.7)));
        assert_eq!(l.engine_version.as_deref(), Some("0.10.1.1"));
        assert_eq!(l.quantization.as_deref(), Some("fp8"));
        assert_eq!(l.kv_cache_dtype.as_deref(), Some("auto"));
        assert_eq!(
            (l.spec_method.as_deref(), l.spec_k),
            (Some("ngram"), Some(5))
        );
        assert_eq!(l.kv_scale_warnings.len(), 1);
    }

    #[test]
    fn rigbench_cpu_backend_kv_lines() {
        let l = BootLog::parse(
            "Available KV cache memory: 0.50 GiB (CPU backend default; set --kv-cache-memory)\n\
             CPU KV cache size: 2,097,152 tokens\n\
             Maximum concurrency for 2,048 tokens per request: 1024.00x\n",
        );
        let (t, _) = l.kv_capacity().unwrap();
        assert_eq!(t, 2_097_152);
    }

    #[test]
    fn malformed_input_never_panics() {
        for t in [
            "",
            "\u{0}\u{1}garbage",
            "GPU KV cache size: , tokens",
            "Maximum concurrency for x tokens per request: yx",
            "SpecDecoding metrics: Accepted: lots, Drafted:",
            "SpecDecoding metrics:",
            "(Worker_TP pid=1) WARNING does not have native support for FP4 computation",
            "(broken pid=) ERROR",
            "KV cache: 99999999999999999999999 tokens (1 blocks × 16)",
        ] {
            let l = BootLog::parse(t);
            assert!(l.kv.iter().all(|k| k.kv_cache_tokens != Some(0)));
        }
        let l = BootLog::parse(
            "(Worker_TP pid=1) WARNING does not have native support for FP4 computation",
        );
        assert_eq!(l.marlin_fp4_fallback.unwrap().ranks.len(), 0);
        assert!(BootLog::parse("SpecDecoding metrics:")
            .spec_lines
            .is_empty());
    }
}
