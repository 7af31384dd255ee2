//! `rigbench diagnose`: explain an engine's logs and `/metrics` scrapes, joined with a checkpoint
//! and the card. This module is the one parser and the one set of findings: `rigbench e2e`
//! (`--engine-log` and the captured log) and `rigbench report` read engine logs through
//! [`log::EngineLog`] and show [`findings_for_log`].
//!
//! Module map: [`line`] (prefixes, levels), [`log`] (boots, errors, kernels, spec lines),
//! [`cause`] (root causes), [`spec`] (speculative decoding, pooled), [`prometheus`] (the
//! `/metrics` text parser, which e2e's scrapes use too), [`scrape`] (what a scrape says),
//! [`render`] (Markdown).
//!
//! Findings (id, severity):
//! - `out-of-memory`, `kv-too-small-for-max-len`, `no-kv-memory`, `quantization-unsupported`,
//!   `toolchain-too-old` (error): a root cause the log names, with its figures;
//! - `engine-error` (error): an error whose cause the log does not hold ("cause not captured in
//!   this excerpt" when only its traceback is there);
//! - `startup-incomplete` (warning): the log stops after the KV-memory line without a KV-size
//!   line (KV tokens unknown, never derived from GiB); `startup-state-unknown` (info): a boot
//!   with only its start;
//! - `kv-capacity` (info) per boot; `kv-inconsistent` (warning): printed KV tokens and max
//!   concurrency × max length disagree by more than 2% (both reported);
//! - `spec-decoding` (info): state, k, pooled acceptance; `spec-accepts-nothing` (error):
//!   acceptance 0 or below 5%; `spec-low-acceptance` (warning): below 10%;
//! - `marlin-fp4-fallback` (info when expected for this checkpoint on this card, warning when
//!   not); `kv-fp8-scale-1` (info/warning): FP8 KV at scale 1.0, whose fault;
//! - `metrics-no-data`, `metrics-invalid-lines`, `nothing-recognised`, `request-timings` (info).

pub mod cause;
pub mod line;
pub mod log;
pub mod prometheus;
pub mod render;
pub mod scrape;
pub mod spec;

use std::path::Path;

use serde::{Deserialize, Serialize};

pub use crate::checkpoint::Severity;
use crate::checkpoint::{self, InspectOptions, LayerKind, ModuleFormat};
use crate::gpu::ComputeCapability;
use cause::{thousands, Cause};
use log::{BootStatus, EngineLog};
use prometheus::Exposition;
use spec::{RequestSpec, SpecPooled};

/// One finding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// Finding id (see the module docs).
    pub id: String,
    /// error / warning / info.
    pub severity: Severity,
    /// One line.
    pub title: String,
    /// Why it matters, what explains it, what to do.
    pub detail: String,
    /// Where: `file:line`, `file lines a–b`, or the input.
    pub source: String,
}

/// A parsed engine log with its name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LogInput {
    /// The file name as given.
    pub name: String,
    /// What was found.
    pub log: EngineLog,
}

/// A parsed `/metrics` scrape with its name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsInput {
    /// The file name as given.
    pub name: String,
    /// What was found.
    pub facts: scrape::MetricsFacts,
    /// Why the input was not parsed (binary), when it was not.
    pub unreadable: Option<String>,
    /// The parsed scrape, kept for comparisons between scrapes.
    #[serde(skip)]
    pub exposition: Option<Exposition>,
}

/// A captured SSE stream (`data:` lines) with its per-request speculative metrics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SseInput {
    /// The file name as given.
    pub name: String,
    /// `data:` payloads read.
    pub chunks: usize,
    /// `usage.completion_tokens` of the last chunk that had it.
    pub completion_tokens: Option<u64>,
    /// vLLM's per-request object, when the stream carried one.
    pub spec: Option<RequestSpec>,
    /// Payloads that were not JSON.
    pub bad_chunks: usize,
}

/// The checkpoint facts the joins need.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointFacts {
    /// The folder as given.
    pub dir: String,
    /// Format per layer kind: (kind, format, modules).
    pub formats: Vec<(String, String, u64)>,
    /// Layer kinds in W4A16 NVFP4 (weights-only).
    pub w4a16_kinds: Vec<String>,
    /// Layer kinds in W4A4 NVFP4.
    pub w4a4_kinds: Vec<String>,
    /// KV-cache quantization declared (`FP8`), with the file.
    pub kv_declared: Option<String>,
    /// Layers holding both `k_scale` and `v_scale` tensors; `None` without a tensor list.
    pub kv_scale_layers: Option<usize>,
    /// Error-level lint findings of `inspect`, by rule.
    pub lint_errors: Vec<String>,
}

/// The card the diagnosis is for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Card {
    /// Compute capability.
    pub cc: ComputeCapability,
    /// Where it came from (`--cc`, `--rig FILE`, `engine log line N`).
    pub source: String,
}

/// Everything `diagnose` found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Diagnosis {
    /// Engine logs.
    pub logs: Vec<LogInput>,
    /// `/metrics` scrapes.
    pub metrics: Vec<MetricsInput>,
    /// SSE captures.
    pub sse: Vec<SseInput>,
    /// The checkpoint, when given.
    pub checkpoint: Option<CheckpointFacts>,
    /// The card, when known.
    pub card: Option<Card>,
    /// Findings, errors first.
    pub findings: Vec<Finding>,
}

impl Diagnosis {
    /// Whether any finding is an error (`rigbench diagnose` exits 4).
    pub fn has_errors(&self) -> bool {
        self.findings.iter().any(|f| f.severity == Severity::Error)
    }

    /// Findings with one id.
    pub fn findings_of(&self, id: &str) -> Vec<&Finding> {
        self.findings.iter().filter(|f| f.id == id).collect()
    }
}

/// Parse SSE text: `data:` payloads (comments and `[DONE]` skipped).
pub fn parse_sse(name: &str, text: &str) -> SseInput {
    let mut s = SseInput {
        name: name.to_string(),
        ..Default::default()
    };
    for line in text.lines() {
        let Some(d) = line.strip_prefix("data:") else {
            continue;
        };
        let d = d.trim();
        if d == "[DONE]" || d.is_empty() {
            continue;
        }
        s.chunks += 1;
        match serde_json::from_str::<serde_json::Value>(d) {
            Ok(v) => {
                if let Some(n) = v
                    .pointer("/usage/completion_tokens")
                    .and_then(serde_json::Value::as_u64)
                {
                    s.completion_tokens = Some(n);
                }
                if let Some(r) = RequestSpec::from_chunk(&v) {
                    s.spec = Some(r);
                }
            }
            Err(_) => s.bad_chunks += 1,
        }
    }
    s
}

/// Read the checkpoint facts the joins need (never the weights).
///
/// # Errors
/// What [`checkpoint::inspect`] refuses (missing folder or config.json, malformed metadata).
pub fn checkpoint_facts(
    dir: &Path,
    cc: Option<ComputeCapability>,
) -> anyhow::Result<CheckpointFacts> {
    let opts = InspectOptions {
        cc,
        card: cc.map(|_| "diagnose".to_string()),
        runtime_config: Some(crate::runtime::ModelConfig::check_hf_config),
        ..Default::default()
    };
    let r = checkpoint::inspect(dir, &opts)?;
    let mut f = CheckpointFacts {
        dir: dir.display().to_string(),
        ..Default::default()
    };
    let push = |v: &mut Vec<String>, k: LayerKind| {
        let l = k.label().to_string();
        if !v.contains(&l) {
            v.push(l);
        }
    };
    for row in &r.modules {
        f.formats.push((
            row.kind.label().to_string(),
            row.format.to_string(),
            row.count,
        ));
        if let ModuleFormat::Nvfp4 {
            activations_4bit, ..
        } = row.format
        {
            if activations_4bit {
                push(&mut f.w4a4_kinds, row.kind);
            } else {
                push(&mut f.w4a16_kinds, row.kind);
            }
        }
    }
    f.kv_declared = r
        .quantization
        .sources
        .iter()
        .find_map(|s| s.kv_cache.clone().map(|k| format!("{k} ({})", s.file)));
    if let Ok(Some(h)) = checkpoint::headers::read_checkpoint(dir) {
        let layers = |suffix: &str| {
            h.tensors
                .iter()
                .filter(|t| t.name.ends_with(suffix))
                .map(|t| t.name.trim_end_matches(suffix).to_string())
                .collect::<std::collections::BTreeSet<_>>()
        };
        let k = layers(".k_scale");
        let v = layers(".v_scale");
        f.kv_scale_layers = Some(k.intersection(&v).count());
    }
    f.lint_errors = r
        .findings
        .iter()
        .filter(|x| x.severity == Severity::Error)
        .map(|x| x.rule.clone())
        .collect();
    Ok(f)
}

/// Parse a metrics file's bytes (binary data gives a note, not an error).
pub fn parse_metrics(name: &str, bytes: &[u8]) -> MetricsInput {
    if let Some(why) = log::binary_reason(bytes) {
        return MetricsInput {
            name: name.to_string(),
            unreadable: Some(why),
            ..Default::default()
        };
    }
    let e = Exposition::parse(&String::from_utf8_lossy(bytes));
    MetricsInput {
        name: name.to_string(),
        facts: scrape::facts(&e),
        unreadable: None,
        exposition: Some(e),
    }
}

fn f(id: &str, severity: Severity, title: String, detail: String, source: String) -> Finding {
    Finding {
        id: id.into(),
        severity,
        title,
        detail,
        source,
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn pct(x: f64) -> String {
    format!("{:.2}%", x * 100.0)
}

fn lines(name: &str, a: usize, b: usize) -> String {
    if a == b {
        format!("{name}:{a}")
    } else {
        format!("{name} lines {a}–{b}")
    }
}

/// The card a log names (`Current capability: 86`, `CUDA capability sm_120`), if any.
fn card_from_log(l: &LogInput) -> Option<Card> {
    for g in &l.log.errors {
        match &g.cause {
            Some(Cause::QuantizationUnsupported {
                current_capability: Some(c),
                ..
            }) => {
                return Some(Card {
                    cc: ComputeCapability::new(c / 10, c % 10),
                    source: format!("{}:{} (Current capability)", l.name, g.line),
                })
            }
            Some(Cause::ToolchainTooOld {
                target: Some(t), ..
            }) if t.starts_with("sm_")
                && g.headline
                    .as_deref()
                    .is_some_and(|h| h.contains("capability")) =>
            {
                let n: String = t[3..].chars().take_while(|c| c.is_ascii_digit()).collect();
                if let Ok(n) = n.parse::<u32>() {
                    return Some(Card {
                        cc: ComputeCapability::new(n / 10, n % 10),
                        source: format!("{}:{}", l.name, g.line),
                    });
                }
            }
            _ => {}
        }
    }
    None
}

/// Findings of one engine log alone (no checkpoint, no card): what `rigbench e2e` and
/// `rigbench report` show under "Engine log findings".
pub fn findings_for_log(l: &LogInput) -> Vec<Finding> {
    let mut d = Diagnosis {
        logs: vec![l.clone()],
        ..Default::default()
    };
    d.findings = build_findings(&d);
    d.findings
}

/// Build the findings of a diagnosis from its inputs (card and checkpoint joins included),
/// errors first.
pub fn build_findings(d: &Diagnosis) -> Vec<Finding> {
    let mut out = Vec::new();
    let card = d
        .card
        .clone()
        .or_else(|| d.logs.iter().find_map(card_from_log));
    for l in &d.logs {
        log_findings(l, &mut out);
        join_findings(l, d.checkpoint.as_ref(), card.as_ref(), &mut out);
    }
    for m in &d.metrics {
        metrics_findings(m, &mut out);
    }
    metrics_delta_findings(&d.metrics, &mut out);
    for s in &d.sse {
        sse_findings(s, &mut out);
    }
    if d.logs.is_empty() && d.metrics.is_empty() && d.sse.is_empty() {
        out.push(f(
            "nothing-recognised",
            Severity::Info,
            "no engine log, metrics or stream given".into(),
            "give --log FILE and/or --metrics FILE".into(),
            "-".into(),
        ));
    }
    out.sort_by_key(|x| x.severity);
    out
}

fn log_findings(l: &LogInput, out: &mut Vec<Finding>) {
    let name = &l.name;
    let log = &l.log;
    if let Some(why) = &log.unreadable {
        out.push(f(
            "nothing-recognised",
            Severity::Info,
            format!("{name}: nothing recognised"),
            why.clone(),
            name.clone(),
        ));
        return;
    }
    if log.is_empty() {
        out.push(f(
            "nothing-recognised",
            Severity::Info,
            format!("{name}: nothing recognised in {} lines", log.lines_read),
            "no engine line rigbench knows (vLLM, SGLang, llama.cpp, rigbench serve): KV, startup, errors and speculative decoding are unknown from this file".into(),
            name.clone(),
        ));
        return;
    }
    // Errors.
    for (i, g) in log.errors.iter().enumerate() {
        let src = lines(name, g.line, g.last_line);
        let ranks = if g.ranks.len() > 1 || g.occurrences > 1 {
            format!(
                " (printed {} times{})",
                g.occurrences,
                if g.ranks.is_empty() {
                    String::new()
                } else {
                    format!(
                        " by ranks {}",
                        g.ranks
                            .iter()
                            .map(u32::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            )
        } else {
            String::new()
        };
        if g.generic && g.explained_by.is_some() {
            continue; // folded into its cause below
        }
        if let Some(c) = &g.cause {
            let consequences: Vec<String> = log
                .errors
                .iter()
                .filter(|x| x.explained_by == Some(i))
                .map(|x| {
                    format!(
                        "'{}' at line {}",
                        x.headline.as_deref().unwrap_or("error"),
                        x.line
                    )
                })
                .collect();
            let phase = if c.is_startup() {
                "startup failed"
            } else {
                "out of memory"
            };
            let mut detail = format!(
                "{} (line {}{}){ranks}",
                c.describe(),
                g.cause_line.unwrap_or(g.line),
                if g.line != g.last_line {
                    format!(", the error spans lines {}–{}", g.line, g.last_line)
                } else {
                    String::new()
                }
            );
            if !consequences.is_empty() {
                detail.push_str(&format!(
                    "; then {}, which is the consequence, not the cause",
                    consequences.join(", ")
                ));
            }
            out.push(f(
                &c.kind().replace('_', "-"),
                Severity::Error,
                format!(
                    "{phase}: {}",
                    match c {
                        Cause::KvTooSmallForMaxLen { max_model_len, .. } => format!(
                            "KV cache too small for max_model_len {}",
                            thousands(*max_model_len)
                        ),
                        Cause::NoKvMemory { .. } => "no memory for the KV cache".into(),
                        Cause::OutOfMemory { .. } => "CUDA out of memory".into(),
                        Cause::QuantizationUnsupported { method, .. } => format!(
                            "quantization {} unsupported on this compute capability",
                            method.as_deref().unwrap_or("scheme")
                        ),
                        Cause::ToolchainTooOld { target, .. } => format!(
                            "toolchain too old for {}",
                            target.as_deref().unwrap_or("this card")
                        ),
                    }
                ),
                detail,
                src,
            ));
            continue;
        }
        let (title, detail) = match (&g.headline, &g.exception) {
            (None, None) => (
                "engine error, cause not captured in this excerpt".to_string(),
                format!(
                    "only traceback lines ({} of them) at error level: the message that opened the error and the exception that ended it are outside this excerpt; include the lines before line {} and after line {}",
                    g.traceback_lines, g.line, g.last_line
                ),
            ),
            (Some(h), None) if g.traceback_lines > 0 => (
                format!("engine error: {h}"),
                format!(
                    "the traceback under it (lines {}–{}) ends before its exception line: cause not captured in this excerpt{ranks}",
                    g.line + 1,
                    g.last_line
                ),
            ),
            (Some(h), None) => (format!("engine error: {h}"), format!("no cause named in the log{ranks}")),
            (h, Some(e)) => (
                format!("engine error: {}", h.as_deref().unwrap_or(e)),
                format!("raised {e}{ranks}"),
            ),
        };
        out.push(f("engine-error", Severity::Error, title, detail, src));
    }
    // Boots.
    let n = log.boots.len();
    for b in &log.boots {
        let tag = if n > 1 {
            format!("boot {} of {n}", b.index)
        } else {
            "boot".to_string()
        };
        let src = lines(name, b.line, b.last_line);
        let mem = b.available_kv_memory_bytes.map(|m| {
            format!(
                "{} available for KV (line {})",
                gib(m),
                b.available_kv_memory_line.unwrap_or(b.line)
            )
        });
        match b.status {
            Some(BootStatus::Incomplete) => {
                let last = b
                    .last_stage
                    .clone()
                    .unwrap_or_else(|| ("its start".into(), b.line));
                let next = (b.index < n).then(|| log.boots[b.index].line);
                if b.available_kv_memory_bytes.is_some() {
                    out.push(f(
                        "startup-incomplete",
                        Severity::Warning,
                        format!("{tag}: startup incomplete, KV tokens unknown"),
                        format!(
                            "{}; the log {} after {} (line {}) without a KV-size line ('GPU KV cache size' / '# GPU blocks'); KV tokens are not derived from GiB. The engine may still be profiling, or died without an error line: look at the lines after the excerpt, or dmesg for an OOM kill",
                            mem.unwrap_or_default(),
                            match next {
                                Some(l) => format!("moves on to the next boot (line {l})"),
                                None => "stops".into(),
                            },
                            last.0,
                            last.1
                        ),
                        src,
                    ));
                } else {
                    out.push(f(
                        "startup-state-unknown",
                        Severity::Info,
                        format!("{tag}: only its start is in the log"),
                        format!(
                            "the log {} after {} (line {}), before any KV-cache line: startup state unknown",
                            match next {
                                Some(l) => format!("moves on to the next boot (line {l})"),
                                None => "stops".into(),
                            },
                            last.0,
                            last.1
                        ),
                        src,
                    ));
                }
            }
            Some(BootStatus::Failed) if !b.has_kv_size() => {} // the error findings say it
            _ => {
                if !b.has_kv_size() {
                    continue;
                }
                let mut parts = Vec::new();
                match (b.kv_cache_tokens, b.gpu_blocks, b.capacity_tokens()) {
                    (Some(t), _, _) => parts.push(format!(
                        "{} KV tokens (line {})",
                        thousands(t),
                        b.kv_cache_tokens_line.unwrap_or(b.line)
                    )),
                    (None, Some(g), Some(t)) => parts.push(format!(
                        "{} GPU blocks × {} = {} KV tokens (block size {})",
                        thousands(g),
                        b.block_size.unwrap_or(0),
                        thousands(t),
                        b.block_size_source.as_deref().unwrap_or("stated")
                    )),
                    (None, Some(g), None) => parts.push(format!(
                        "{} GPU blocks (block size not in the log: KV tokens unknown)",
                        thousands(g)
                    )),
                    _ => {}
                }
                if b.kv_cache_tokens.is_some() {
                    if let Some(g) = b.gpu_blocks {
                        parts.push(format!(
                            "{} GPU blocks{}",
                            thousands(g),
                            b.block_size
                                .map(|s| format!(" of {s} tokens"))
                                .unwrap_or_default()
                        ));
                    }
                }
                if let Some((len, x)) = b.max_concurrency {
                    parts.push(format!(
                        "max concurrency {x:.2}x at {} tokens per request (line {})",
                        thousands(len),
                        b.max_concurrency_line.unwrap_or(b.line)
                    ));
                }
                if let Some(m) = mem {
                    parts.push(m);
                }
                if let Some(v) = &b.engine_version {
                    parts.push(format!("engine {v}"));
                }
                if b.status == Some(BootStatus::Failed) {
                    parts.push("then a startup error (below)".into());
                }
                out.push(f(
                    "kv-capacity",
                    Severity::Info,
                    format!(
                        "{tag}: KV cache {}",
                        b.capacity_tokens()
                            .map(|t| format!("{} tokens", thousands(t)))
                            .unwrap_or_else(|| "size unknown".into())
                    ),
                    parts.join("; "),
                    src.clone(),
                ));
                if let Some(k) = b.kv_check.as_ref().filter(|k| !k.consistent) {
                    let (len, x) = b.max_concurrency.unwrap_or((0, 0.0));
                    out.push(f(
                        "kv-inconsistent",
                        Severity::Warning,
                        format!(
                            "{tag}: KV size line and max-concurrency line disagree ({:.2}×)",
                            k.factor
                        ),
                        format!(
                            "printed {} tokens, but {x:.2} × {} tokens per request = {} tokens; they differ by more than 2%, so both are reported and neither is taken alone. Hybrid models (attention + Mamba / linear-attention layers) share the KV memory between layer groups, and vLLM computes the two lines differently for them; measure admission with concurrent long requests if it matters",
                            thousands(k.printed_tokens),
                            thousands(len),
                            thousands(k.implied_tokens)
                        ),
                        src,
                    ));
                }
            }
        }
    }
    // Speculative decoding.
    spec_findings(
        name,
        log.spec_pooled(),
        log.spec_on(),
        &log.spec_config,
        log.spec_lines.first().map(|s| s.line),
        out,
    );
    // llama.cpp request timings.
    let t: Vec<_> = log
        .request_timings
        .iter()
        .filter(|t| t.generation_ms.is_some())
        .collect();
    if !t.is_empty() {
        let toks: u64 = t.iter().filter_map(|t| t.generated_tokens).sum();
        let ms: f64 = t.iter().filter_map(|t| t.generation_ms).sum();
        let ptoks: u64 = t.iter().filter_map(|t| t.prompt_tokens).sum();
        let pms: f64 = t.iter().filter_map(|t| t.prompt_ms).sum();
        out.push(f(
            "request-timings",
            Severity::Info,
            format!("{} requests timed by the engine", t.len()),
            format!(
                "decode {} tokens in {:.0} ms ({:.1} tok/s pooled, Σtokens / Σeval time); prompt {} tokens in {:.0} ms ({:.1} tok/s). The engine's own per-request timings: concurrency, prompt reuse and thinking are not in the log, so these are not comparable rigbench e2e figures",
                toks,
                ms,
                if ms > 0.0 { toks as f64 / ms * 1000.0 } else { 0.0 },
                ptoks,
                pms,
                if pms > 0.0 { ptoks as f64 / pms * 1000.0 } else { 0.0 },
            ),
            lines(name, t[0].line, t[t.len() - 1].line + 1),
        ));
    }
}

/// Speculative-decoding findings for one source.
fn spec_findings(
    source: &str,
    pooled: Option<SpecPooled>,
    on: Option<String>,
    cfg: &log::SpecConfig,
    first_line: Option<usize>,
    out: &mut Vec<Finding>,
) {
    let src = match first_line {
        Some(l) => format!("{source}:{l}"),
        None => source.to_string(),
    };
    if let Some(p) = pooled {
        judge_spec(&src, &p, cfg.method.as_deref(), out);
    } else if let Some(on) = on {
        let k = cfg
            .k
            .map(|k| format!(", k = {k}"))
            .unwrap_or_else(|| ", k not stated".into());
        out.push(f(
            "spec-decoding",
            Severity::Info,
            format!(
                "speculative decoding on{}{k}",
                cfg.method
                    .as_ref()
                    .map(|m| format!(" ({m})"))
                    .unwrap_or_default()
            ),
            format!("{on}; no acceptance metrics in the log (vLLM prints them every 10 s while requests run; /metrics has the counters)"),
            src,
        ));
    } else if let Some(l) = cfg.off_line {
        out.push(f(
            "spec-decoding",
            Severity::Info,
            "speculative decoding off".into(),
            format!("the engine configuration says none (line {l})"),
            format!("{source}:{l}"),
        ));
    }
}

/// The acceptance verdict: 0 or below 5% is an error, below 10% a warning.
fn judge_spec(src: &str, p: &SpecPooled, method: Option<&str>, out: &mut Vec<Finding>) {
    let k =
        p.k.map(|k| {
            format!(
                "k = {k}{}",
                p.k_source
                    .as_ref()
                    .map(|s| format!(" (from {s})"))
                    .unwrap_or_default()
            )
        })
        .unwrap_or_else(|| "k unknown".into());
    let m = method.map(|m| format!(" ({m})")).unwrap_or_default();
    let Some(rate) = p.acceptance_rate else {
        out.push(f(
            "spec-decoding",
            Severity::Info,
            format!("speculative decoding on{m}, {k}"),
            format!(
                "{}acceptance not reported (no accepted-token counts)",
                p.drafts
                    .map(|d| format!("{d} drafts; "))
                    .unwrap_or_default()
            ),
            src.to_string(),
        ));
        return;
    };
    let counts = if p.counts {
        format!("{} of {} drafted tokens accepted", p.accepted, p.drafted)
    } else {
        format!(
            "mean of {} interval rates (the engine prints no counts)",
            p.samples
        )
    };
    let mal = p
        .mean_acceptance_length
        .map(|x| format!(", mean acceptance length {x:.2}"))
        .unwrap_or_default();
    let summary = format!("acceptance {} at {k}{mal}: {counts}", pct(rate));
    let enough = !p.counts || p.drafted >= 20;
    if enough && (rate == 0.0 || rate < 0.05) {
        out.push(f(
            "spec-accepts-nothing",
            Severity::Error,
            format!(
                "the drafter accepts {}: acceptance {} at {k}",
                if rate == 0.0 { "nothing" } else { "almost nothing" },
                pct(rate)
            ),
            format!(
                "{summary}. Every step pays for k draft tokens and keeps none, so decoding is slower than without speculation: a broken draft model, a drafter that does not match the checkpoint (other tokenizer, other fine-tune, a 4-bit MTP head), or a wrong draft configuration. Turn speculation off or fix the drafter"
            ),
            src.to_string(),
        ));
    } else if enough && rate < 0.10 {
        out.push(f(
            "spec-low-acceptance",
            Severity::Warning,
            format!("low draft acceptance: {} at {k}", pct(rate)),
            format!("{summary}. Below 10% the drafting rarely pays for itself; check the drafter against the checkpoint, or lower k"),
            src.to_string(),
        ));
    } else {
        out.push(f(
            "spec-decoding",
            Severity::Info,
            format!(
                "speculative decoding on{m}: acceptance {} at {k}",
                pct(rate)
            ),
            format!(
                "{summary}{}",
                if enough {
                    String::new()
                } else {
                    " (too few drafted tokens to judge)".into()
                }
            ),
            src.to_string(),
        ));
    }
}

fn metrics_findings(m: &MetricsInput, out: &mut Vec<Finding>) {
    let name = &m.name;
    if let Some(why) = &m.unreadable {
        out.push(f(
            "nothing-recognised",
            Severity::Info,
            format!("{name}: nothing recognised"),
            why.clone(),
            name.clone(),
        ));
        return;
    }
    let x = &m.facts;
    if x.samples == 0 && x.families_without_samples.is_empty() {
        out.push(f(
            "nothing-recognised",
            Severity::Info,
            format!("{name}: nothing recognised"),
            format!(
                "no Prometheus sample or HELP/TYPE line{}",
                if x.warnings.is_empty() {
                    String::new()
                } else {
                    format!(" ({} lines skipped as invalid)", x.warnings.len())
                }
            ),
            name.clone(),
        ));
        return;
    }
    if !x.families_without_samples.is_empty() {
        out.push(f(
            "metrics-no-data",
            Severity::Info,
            format!(
                "{} metric families announced without samples: no data, not zero",
                x.families_without_samples.len()
            ),
            x.families_without_samples
                .iter()
                .take(8)
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            name.clone(),
        ));
    }
    if !x.warnings.is_empty() {
        out.push(f(
            "metrics-invalid-lines",
            Severity::Info,
            format!("{} invalid lines skipped", x.warnings.len()),
            x.warnings
                .iter()
                .take(3)
                .cloned()
                .collect::<Vec<_>>()
                .join("; "),
            name.clone(),
        ));
    }
    if let Some((t, why)) = &x.kv_capacity {
        out.push(f(
            "kv-capacity",
            Severity::Info,
            format!("KV cache {} tokens", thousands(*t)),
            format!("from {why}"),
            name.clone(),
        ));
    }
    if let Some(p) = &x.spec {
        let why = x.spec_evidence.clone().unwrap_or_default();
        if p.drafts == Some(0) {
            out.push(f(
                "spec-decoding",
                Severity::Info,
                "speculative decoding configured, 0 drafts".into(),
                why,
                name.clone(),
            ));
        } else if p.drafts.is_none() && p.mean_acceptance_length.is_none() {
            out.push(f(
                "spec-decoding",
                Severity::Info,
                "speculative decoding: no data".into(),
                why,
                name.clone(),
            ));
        } else {
            judge_spec(&format!("{name} ({why})"), p, None, out);
        }
    }
}

/// Two or more scrapes of one engine: speculative decoding between the first and the last
/// (counter deltas, the way `rigbench e2e` measures a run).
fn metrics_delta_findings(ms: &[MetricsInput], out: &mut Vec<Finding>) {
    let scrapes: Vec<&MetricsInput> = ms.iter().filter(|m| m.exposition.is_some()).collect();
    let (Some(first), Some(last)) = (scrapes.first(), scrapes.last()) else {
        return;
    };
    if scrapes.len() < 2 || first.facts.engine != last.facts.engine {
        return;
    }
    let (Some(a), Some(b)) = (&first.exposition, &last.exposition) else {
        return;
    };
    if let Some((p, why)) = scrape::spec(Some(a), b) {
        let src = format!("{} → {} ({why})", first.name, last.name);
        if p.drafts == Some(0) {
            out.push(f(
                "spec-decoding",
                Severity::Info,
                "no drafts between the scrapes".into(),
                "speculative decoding configured, but no request ran between the scrapes (or counters reset)".into(),
                src,
            ));
        } else if p.drafts.is_some() {
            judge_spec(&src, &p, None, out);
        }
    }
}

fn sse_findings(s: &SseInput, out: &mut Vec<Finding>) {
    let Some(r) = &s.spec else {
        if s.chunks == 0 {
            out.push(f(
                "nothing-recognised",
                Severity::Info,
                format!("{}: no SSE data lines", s.name),
                "expected `data: {...}` lines of an OpenAI-compatible stream".into(),
                s.name.clone(),
            ));
        }
        return;
    };
    if let Some(p) = spec::pool_requests(std::slice::from_ref(r)) {
        judge_spec(&format!("{} (last chunk)", s.name), &p, None, out);
    }
    if let (Some(h), Some(u)) = (r.histogram_tokens(), s.completion_tokens) {
        if h != u {
            out.push(f(
                "spec-histogram-mismatch",
                Severity::Warning,
                format!("acceptance histogram accounts for {h} tokens, usage says {u}"),
                "1 + Σ(j+1)·h_j should equal the completion tokens (the prefill step's token, then each verify step's accepted drafts and its own token): the engine's counts and its usage disagree".into(),
                s.name.clone(),
            ));
        }
    }
}

/// Joins of the log with the checkpoint and the card: the Marlin FP4 fallback and FP8 KV at
/// scale 1.0, explained.
fn join_findings(
    l: &LogInput,
    ck: Option<&CheckpointFacts>,
    card: Option<&Card>,
    out: &mut Vec<Finding>,
) {
    let log = &l.log;
    let engine = match (&log.engine, &log.engine_version) {
        (Some(e), Some(v)) => format!("{e} {v}"),
        (Some(e), None) => format!("{e} (version not in the log)"),
        _ => "the engine".into(),
    };
    if let Some(m) = &log.marlin_fp4_fallback {
        let src = format!("{}:{}", l.name, m.line);
        let seen = format!(
            "the Marlin FP4 warning ({} lines{}{})",
            m.occurrences,
            if m.ranks.is_empty() {
                String::new()
            } else {
                format!(
                    ", ranks {}",
                    m.ranks
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            },
            if m.call_sites.is_empty() {
                String::new()
            } else {
                format!(
                    ", from {}",
                    m.call_sites
                        .iter()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(" and ")
                )
            }
        );
        let (sev, title, detail) = explain_marlin(log, ck, card, &engine);
        out.push(f(
            "marlin-fp4-fallback",
            sev,
            title,
            format!("{seen}: {detail}"),
            src,
        ));
    }
    if let Some(w) = log.kv_scale_warnings.first() {
        let src = format!("{}:{}", l.name, w.line);
        let (sev, detail) = match ck {
            None => (
                Severity::Info,
                "whose fault it is depends on the checkpoint: give --checkpoint DIR (its hf_quant_config.json / config.json say whether FP8 KV was calibrated, and model.safetensors.index.json whether k_scale / v_scale tensors exist)".to_string(),
            ),
            Some(c) => match (&c.kv_declared, c.kv_scale_layers) {
                (Some(k), Some(n)) if n > 0 => (
                    Severity::Warning,
                    format!("the checkpoint declares KV {k} and ships k_scale/v_scale for {n} layers, yet the engine used 1.0: the engine's fault (it did not load the scales: a name mapping it does not know, or a version without support for this checkpoint's KV scales)"),
                ),
                (Some(k), Some(_)) => (
                    Severity::Warning,
                    format!("the checkpoint declares KV {k} but its weight map has no k_scale/v_scale tensors: the checkpoint's fault; the engine falls back to scale 1.0 (uncalibrated FP8 KV, an accuracy risk at long context)"),
                ),
                (Some(k), None) => (
                    Severity::Info,
                    format!("the checkpoint declares KV {k}; without safetensors headers or an index rigbench cannot see whether k_scale/v_scale tensors exist: their absence would be the checkpoint's fault, their presence the engine's"),
                ),
                (None, _) => (
                    Severity::Info,
                    "expected: the checkpoint declares no KV-cache quantization, so no calibrated KV scales exist and FP8 KV runs at scale 1.0 by the engine's --kv-cache-dtype choice; neither the checkpoint's fault nor the engine's (expect some accuracy loss against calibrated scales)".into(),
                ),
            },
        };
        out.push(f(
            "kv-fp8-scale-1",
            sev,
            format!(
                "FP8 KV cache with default scales ({} warning{})",
                log.kv_scale_warnings.len(),
                if log.kv_scale_warnings.len() == 1 {
                    ""
                } else {
                    "s"
                }
            ),
            format!("'{}': {detail}", w.message),
            src,
        ));
    }
}

fn list(v: &[String]) -> String {
    v.join(", ")
}

/// Why the Marlin FP4 warning appeared: (severity, title, explanation).
fn explain_marlin(
    log: &EngineLog,
    ck: Option<&CheckpointFacts>,
    card: Option<&Card>,
    engine: &str,
) -> (Severity, String, String) {
    let marlin_choices: Vec<String> = log
        .kernel_choices
        .iter()
        .filter(|c| c.is_marlin())
        .map(|c| format!("{} → {} (line {})", c.what, c.kernel, c.line))
        .collect();
    let native_choices: Vec<String> = log
        .kernel_choices
        .iter()
        .filter(|c| !c.is_marlin())
        .map(|c| format!("{} → {} (line {})", c.what, c.kernel, c.line))
        .collect();
    let choices = if log.kernel_choices.is_empty() {
        String::new()
    } else {
        format!(
            " The log names its kernels: {}.",
            marlin_choices
                .iter()
                .chain(native_choices.iter())
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        )
    };
    let w4a16 = ck.map(|c| c.w4a16_kinds.clone()).unwrap_or_default();
    let w4a4 = ck.map(|c| c.w4a4_kinds.clone()).unwrap_or_default();
    let Some(card) = card else {
        let settle = "give --cc sm_XX (or --rig results.json) to settle it";
        return match ck {
            Some(_) if !w4a16.is_empty() => (
                Severity::Info,
                "Marlin FP4 fallback: expected for the W4A16 layers".into(),
                format!("the checkpoint's {} are weights-only NVFP4 (W4A16), which run on Marlin on every card.{} Whether its W4A4 layers ({}) run natively depends on the card: {settle}", list(&w4a16), choices, if w4a4.is_empty() { "none".into() } else { list(&w4a4) }),
            ),
            Some(_) => (
                Severity::Info,
                "Marlin FP4 fallback: expected only on a card without FP4 tensor cores".into(),
                format!("every NVFP4 layer of the checkpoint is W4A4 ({}): the fallback is expected below sm_100 and means a missing native kernel on sm_100 and up.{choices} {settle}", list(&w4a4)),
            ),
            None => (
                Severity::Info,
                "Marlin FP4 fallback: expected or not depends on the checkpoint and the card".into(),
                format!("W4A16 NVFP4 layers run on Marlin on every card; W4A4 layers run natively only on cards with FP4 tensor cores (sm_100 and up) when the engine has kernels for them.{choices} Give --checkpoint DIR (config.json + hf_quant_config.json are enough) and --cc sm_XX to settle it"),
            ),
        };
    };
    let cc = card.cc;
    let ccs = format!("sm_{} ({})", cc.as_int(), card.source);
    if cc.as_int() < 100 {
        let lose = if w4a4.is_empty() {
            String::new()
        } else {
            format!(" The checkpoint's W4A4 layers ({}) lose their 4-bit activations here: speed and accuracy are those of W4A16.", list(&w4a4))
        };
        return (
            Severity::Info,
            format!("Marlin FP4 fallback: expected on sm_{}", cc.as_int()),
            format!("{ccs} has no FP4 tensor cores, so every NVFP4 layer runs on Marlin as W4A16 (4-bit weights dequantized to BF16 inside the kernel, BF16 activations).{lose}{choices}"),
        );
    }
    let Some(_) = ck else {
        return (
            Severity::Info,
            format!("Marlin FP4 fallback on sm_{}: expected or not depends on the checkpoint", cc.as_int()),
            format!("{ccs} has FP4 tensor cores: weights-only (W4A16) NVFP4 layers still run on Marlin on every card, but W4A4 layers should run natively.{choices} Give --checkpoint DIR (config.json + hf_quant_config.json are enough) to tell which layers are which"),
        );
    };
    let consumer = matches!(cc.as_int(), 120 | 121);
    let expected_part = if w4a16.is_empty() {
        String::new()
    } else {
        format!(
            "these layers are weights-only NVFP4 ({}), which run on Marlin on every card",
            list(&w4a16)
        )
    };
    if !consumer {
        if w4a4.is_empty() || !w4a16.is_empty() {
            let rest = if w4a4.is_empty() {
                "; the checkpoint has no W4A4 layers".to_string()
            } else {
                format!("; the W4A4 layers ({}) run natively", list(&w4a4))
            };
            let sev = if marlin_choices.iter().any(|c| c.contains("MoE"))
                && w4a4.iter().any(|k| k.contains("MoE"))
            {
                Severity::Warning
            } else {
                Severity::Info
            };
            return (
                sev,
                format!("Marlin FP4 fallback on sm_{}: expected", cc.as_int()),
                format!(
                    "expected: {}{rest}.{choices}",
                    if expected_part.is_empty() {
                        "no W4A16 layer".into()
                    } else {
                        expected_part
                    }
                ),
            );
        }
        return (
            Severity::Warning,
            format!("Marlin FP4 fallback on sm_{}: not expected for this checkpoint", cc.as_int()),
            format!("{ccs} has FP4 tensor cores and every NVFP4 layer of the checkpoint is W4A4 ({}), so {engine} should run them natively: this build lacks (or did not select) its native FP4 kernels for the card.{choices} Check the engine's 'Using … for NVFP4 GEMM' / 'NvFp4 MoE backend' lines and its FlashInfer/CUTLASS build", list(&w4a4)),
        );
    }
    // sm_120 / sm_121: which layers have no native path in this engine build, and why.
    let mut no_native: Vec<String> = Vec::new();
    for c in log.kernel_choices.iter().filter(|c| c.is_marlin()) {
        let kinds: Vec<String> = if c.what.contains("MoE") {
            w4a4.iter().filter(|k| k.contains("MoE")).cloned().collect()
        } else {
            w4a4.iter()
                .filter(|k| !k.contains("MoE"))
                .cloned()
                .collect()
        };
        if !kinds.is_empty() {
            no_native.push(format!(
                "{} ({} chose {} at line {})",
                list(&kinds),
                c.what,
                c.kernel,
                c.line
            ));
        }
    }
    let why_12x = format!(
        "on sm_{} native NVFP4 needs FP4 kernels compiled for the card (sm_120a / sm_120f, or sm_121a): engine builds whose FP4 MoE kernels cover only sm_100, or only sm_120 on an sm_121 card, have none and fall back to Marlin (vLLM issues #31085, #50925)",
        cc.as_int()
    );
    let mut parts = Vec::new();
    if !expected_part.is_empty() {
        parts.push(format!(
            "expected{}: {expected_part}",
            if w4a4.is_empty() {
                ""
            } else {
                " for part of it"
            }
        ));
    }
    let sev;
    if w4a4.is_empty() {
        sev = Severity::Info;
        parts.push("the checkpoint has no W4A4 layers, so nothing native is lost".into());
    } else if !no_native.is_empty() {
        sev = Severity::Warning;
        parts.push(format!(
            "no native path in {engine} on this card for the W4A4 {}: {why_12x}",
            no_native.join("; ")
        ));
    } else if log.kernel_choices.is_empty() {
        let look = "the engine's 'Using … for NVFP4 GEMM' / 'NvFp4 MoE backend' lines (at INFO, or with VLLM_LOGGING_LEVEL=DEBUG) name the kernel per layer kind";
        if w4a16.is_empty() {
            sev = Severity::Warning;
            parts.push(format!(
                "every NVFP4 layer of the checkpoint is W4A4 ({}), so the warning means some of them have no native path in {engine} on this card: {why_12x}; {look}",
                list(&w4a4)
            ));
        } else {
            sev = Severity::Info;
            parts.push(format!(
                "the log does not say whether the W4A4 layers ({}) fell back as well: {why_12x}; {look}",
                list(&w4a4)
            ));
        }
    } else {
        sev = Severity::Info;
        parts.push(format!(
            "the W4A4 layers ({}) got native kernels",
            list(&w4a4)
        ));
    }
    (
        sev,
        format!("Marlin FP4 fallback on sm_{}", cc.as_int()),
        format!("{}.{choices}", parts.join("; ")),
    )
}

#[cfg(test)]
mod tests;
