//! `rigbench diagnose`: explain an engine's logs and `/metrics` scrapes, joined with a checkpoint
//! and the card. This module is the one parser and the one set of findings: `rigbench e2e`
//! (`--engine-log` and the captured log) and `rigbench report` read engine logs through
//! [`log::EngineLog`] and show [`findings_for_log`].
//!
//! Module map: [`line`] (prefixes, levels, pids), [`engines`] (one reader per engine behind
//! [`engines::EngineReader`]), [`log`] (boots, processes, errors, kernels, spec lines),
//! [`cause`] (root causes), [`spec`] (speculative decoding, pooled), [`prometheus`] (the
//! `/metrics` text parser, which e2e's scrapes use too), [`scrape`] (what a scrape says),
//! [`render`] (Markdown); the findings of a log are built in `boot_findings` (errors, boots, KV
//! warnings) and `kernels` (native FP4, weight-only paths). `docs/diagnose.md` lists the lines
//! and metrics read per engine and version, and every finding.
//!
//! Findings (id, severity):
//! - `out-of-memory`, `kv-too-small-for-max-len`, `no-kv-memory`, `quantization-unsupported`,
//!   `capability-too-low`, `toolchain-too-old`, `invalid-arguments`, `port-in-use` (error): a
//!   root cause the log names, with its figures; every distinct cause of an error is reported;
//! - `engine-error` (error): an error whose cause the log does not hold ("cause not captured in
//!   this excerpt" when only its traceback is there); `engine-error-at-shutdown` (info): one
//!   printed after the engine was asked to stop;
//! - `startup-incomplete` (warning): the log stops after the KV-memory line without a KV-size
//!   line (KV tokens unknown, never derived from GiB); `startup-state-unknown` (info): a boot
//!   with only its start;
//! - `kv-capacity` (info) per boot, with how it was read; `kv-inconsistent` (warning): two lines
//!   of a boot state capacities more than 2% apart (both reported);
//! - `kv-padding-waste`, `kv-off-gpu`, `kv-pool-capped`, `max-len-reduced`,
//!   `kv-allocation-replaced`: the engines' KV warnings that change a conclusion;
//! - `spec-decoding` (info): state, k, pooled acceptance; `spec-accepts-nothing` (error):
//!   acceptance 0 or below 5%, or a mean acceptance length of 1.00; `spec-low-acceptance`
//!   (warning): below 10%;
//! - `fp4-native` (info): the card runs FP4 natively; `marlin-fp4-fallback` and
//!   `fp4-weight-only` (info when expected for this checkpoint, card and engine version, warning
//!   when not); `kv-fp8-scale-1` (info/warning): FP8 KV at scale 1.0, whose fault;
//! - `kernel-fallback` (info): a warning that the engine fell back to another kernel;
//! - `kernel-differs-from-prediction` (warning when native and weight-only differ, else info):
//!   an NVFP4 kernel the log names that is not the family `crate::checkpoint::predict` gives
//!   for the checkpoint's layers of that class, on this card, with this engine version;
//! - `engine-counters`, `prefix-cache`, `metrics-no-data`, `metrics-invalid-lines`,
//!   `nothing-recognised`, `request-timings` (info); `metrics-unknown` (info): what a scrape
//!   cannot tell (KV capacity, prefix cache, speculation) and what would;
//! - `no-attention-backend` (error): no attention backend accepts the model's attention on the
//!   card, and whether a flag could change that; `native-candidates-passed-over` (warning /
//!   info): a weight-only FP4 backend named after native candidates on the same line;
//! - `gpu-conditions`, `gpu-power-cap-lowered`, `gpu-clock-events`, `gpu-ecc-errors`: an
//!   `nvidia-smi -q` snapshot ([`nvidia_smi`]).
//!
//! One finding per line of a kind, or one aggregate naming every line it rests on (worst
//! first); speculative lines of two boots are judged per boot. `tests_sentences.rs` checks on
//! every fixture that each number a finding states comes from the lines it cites.

mod boot_findings;
pub mod cause;
pub mod engines;
mod kernels;
pub mod line;
pub mod log;
pub mod nvidia_smi;
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
use log::EngineLog;
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
    /// What the kernel prediction (`crate::checkpoint::predict`) needs: linear modules by class
    /// and format, attention and Gated-DeltaNet layers, KV dtype.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predict_input: Option<checkpoint::predict::PredictInput>,
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
    /// The engine and version from `--engine`, for logs that do not state their version (a
    /// version the log states comes first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<checkpoint::predict::EngineSpec>,
    /// `nvidia-smi -q` snapshots.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvidia_smi: Vec<nvidia_smi::SmiReport>,
    /// The measurement the snapshots are joined with (`--rig results.json`: the report and when
    /// it was created), when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<String>,
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

/// Rewrite every string the inputs supplied (file names, log messages and arguments, metric
/// names, the checkpoint path, where the card came from) with `redact`, and nothing rigbench
/// wrote itself: call it before [`build_findings`], so findings quote redacted input inside
/// rigbench's own, unredacted words (`KV bytes per token = …` stays as written).
pub fn redact_inputs(d: &mut Diagnosis, redact: &dyn Fn(&str) -> String) {
    for l in &mut d.logs {
        l.name = redact(&l.name);
        l.log.map_input_text(redact);
    }
    for m in &mut d.metrics {
        m.name = redact(&m.name);
        for x in &mut m.facts.families_without_samples {
            *x = redact(x);
        }
        for x in &mut m.facts.warnings {
            *x = redact(x);
        }
        if let Some(e) = m.exposition.as_mut() {
            for s in e.samples.iter_mut().chain(e.created.iter_mut()) {
                for v in s.labels.values_mut() {
                    *v = redact(v);
                }
            }
        }
    }
    for s in &mut d.sse {
        s.name = redact(&s.name);
    }
    for s in &mut d.nvidia_smi {
        s.name = redact(&s.name);
    }
    if let Some(c) = d.checkpoint.as_mut() {
        c.dir = redact(&c.dir);
        if let Some(k) = c.kv_declared.as_mut() {
            *k = redact(k);
        }
    }
    if let Some(c) = d.card.as_mut() {
        c.source = redact(&c.source);
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
    f.predict_input = Some(r.prediction_input(None));
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

pub(crate) fn f(
    id: &str,
    severity: Severity,
    title: String,
    detail: String,
    source: String,
) -> Finding {
    Finding {
        id: id.into(),
        severity,
        title,
        detail,
        source,
    }
}

pub(crate) fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

pub(crate) fn pct(x: f64) -> String {
    format!("{:.2}%", x * 100.0)
}

pub(crate) fn lines(name: &str, a: usize, b: usize) -> String {
    if a == b {
        format!("{name}:{a}")
    } else {
        format!("{name} lines {a}–{b}")
    }
}

/// The card a log names (`Current capability: 86`, `GPU has compute capability 7.0`, `CUDA
/// capability sm_120`), if any.
fn card_from_log(l: &LogInput) -> Option<Card> {
    for g in &l.log.errors {
        for (c, line) in &g.causes {
            if let Some(cur) = c.current_capability() {
                return Some(Card {
                    cc: ComputeCapability::new(cur / 10, cur % 10),
                    source: format!("{}:{line} (the card's capability in the message)", l.name),
                });
            }
            if let Cause::ToolchainTooOld {
                target: Some(t), ..
            } = c
            {
                let capability_line = g
                    .headline
                    .as_deref()
                    .is_some_and(|h| h.contains("capability"));
                if t.starts_with("sm_") && capability_line {
                    let n: String = t[3..].chars().take_while(|c| c.is_ascii_digit()).collect();
                    if let Ok(n) = n.parse::<u32>() {
                        return Some(Card {
                            cc: ComputeCapability::new(n / 10, n % 10),
                            source: format!("{}:{}", l.name, g.line),
                        });
                    }
                }
            }
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
        log_findings(l, card.as_ref(), &mut out);
        join_findings(
            l,
            d.checkpoint.as_ref(),
            card.as_ref(),
            d.engine.as_ref(),
            &mut out,
        );
    }
    for m in &d.metrics {
        metrics_findings(m, &mut out);
    }
    metrics_delta_findings(&d.metrics, &mut out);
    for s in &d.sse {
        sse_findings(s, &mut out);
    }
    for s in &d.nvidia_smi {
        nvidia_smi::findings(s, d.timing.as_deref(), &mut out);
    }
    if d.logs.is_empty() && d.metrics.is_empty() && d.sse.is_empty() && d.nvidia_smi.is_empty() {
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

fn log_findings(l: &LogInput, card: Option<&Card>, out: &mut Vec<Finding>) {
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
        out.push(nothing_recognised(name, log));
        return;
    }
    boot_findings::error_findings(name, log, card, out);
    boot_findings::boot_findings(l, out);
    kernels::kernel_findings(l, out);
    // Speculative decoding.
    spec_findings(name, log, out);
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

/// A log with no fact rigbench reads. When the lines carry one engine's header form
/// (TensorRT-LLM's `[TensorRT-LLM][INFO]`, vLLM's `INFO MM-DD …`), the finding names that
/// engine: its lines are there, just none of the forms `docs/diagnose.md` lists for it.
fn nothing_recognised(name: &str, log: &EngineLog) -> Finding {
    const UNKNOWN: &str =
        "KV capacity, startup state, errors and speculative decoding are unknown from this file";
    let detail = match log.engine.as_deref() {
        Some(e) => {
            let n = log.form_lines(e);
            format!(
                "{n} of the {} lines carry {}'s header, but none is a line rigbench reads for it (docs/diagnose.md lists the forms per engine and version): {UNKNOWN}; a log from the engine's start to its ready line would tell",
                log.lines_read,
                engine_label(e)
            )
        }
        None => format!(
            "no line in a form rigbench reads (vLLM, SGLang, llama.cpp, TensorRT-LLM, rigbench serve): {UNKNOWN}"
        ),
    };
    f(
        "nothing-recognised",
        Severity::Info,
        format!("{name}: nothing recognised in {} lines", log.lines_read),
        detail,
        name.to_string(),
    )
}

/// An engine's name as users write it.
fn engine_label(e: &str) -> &str {
    match e {
        "vllm" => "vLLM",
        "sglang" => "SGLang",
        "tensorrt-llm" => "TensorRT-LLM",
        "torch" => "PyTorch",
        other => other,
    }
}

/// The method in words, with what it means for where drafts come from.
fn method_words(log: &EngineLog) -> Option<String> {
    let cfg = &log.spec_config;
    let engine = log.engine.as_deref();
    match cfg.method.as_deref() {
        Some(m) if m.starts_with("ngram") || m.starts_with("NGRAM") => Some(format!(
            "n-gram, {m}: drafts are looked up in the prompt and the output so far, no draft model{}",
            cfg.method_source
                .as_ref()
                .map(|s| format!("; from {s}"))
                .unwrap_or_default()
        )),
        Some(m) => Some(format!(
            "{m}{}",
            cfg.method_source
                .as_ref()
                .map(|s| format!(", from {s}"))
                .unwrap_or_default()
        )),
        None if engine == Some("llama.cpp") => Some(match (log.model_load_line, cfg.drafter_line) {
            (Some(l), None) => format!(
                "self-speculation, not a draft model: the model loads at line {l} and no 'loading draft model' line follows, so drafts come from n-gram lookup (or an MTP head when the model has one); the log does not name the --spec-type"
            ),
            _ => "method not stated in the log: llama.cpp prints the same acceptance lines for n-gram, MTP and draft-model speculation".into(),
        }),
        None => None,
    }
}

/// The speculative-decoding lines grouped by the boot they follow (a boot's lines run from its
/// start to the next boot's start), with the boot's index; lines before any boot belong to the
/// first group.
fn spec_lines_per_boot(log: &EngineLog) -> Vec<(usize, Vec<spec::SpecLogLine>)> {
    let mut groups: Vec<(usize, Vec<spec::SpecLogLine>)> = Vec::new();
    for s in &log.spec_lines {
        let boot = log
            .boots
            .iter()
            .rev()
            .find(|b| b.line <= s.line)
            .map_or(0, |b| b.index);
        match groups.last_mut() {
            Some((i, g)) if *i == boot => g.push(s.clone()),
            _ => groups.push((boot, vec![s.clone()])),
        }
    }
    groups
}

/// Speculative-decoding findings for one log.
fn spec_findings(source: &str, log: &EngineLog, out: &mut Vec<Finding>) {
    let cfg = &log.spec_config;
    // The pooled figures rest on every spec line: cite them all (first to last).
    let src = match (log.spec_lines.first(), log.spec_lines.last()) {
        (Some(a), Some(b)) => lines(source, a.line, b.line),
        _ => source.to_string(),
    };
    let method = method_words(log);
    let per_boot = spec_lines_per_boot(log);
    if per_boot.len() > 1 {
        // Two engine starts in one file are two runs: never one pooled figure across them.
        for (boot, group) in &per_boot {
            let (a, b) = (group[0].line, group[group.len() - 1].line);
            if let Some(p) = spec::pool_spec(group, cfg.k) {
                let src = format!("{} (boot {boot}, its spec lines)", lines(source, a, b));
                judge_spec(&src, &p, method.as_deref(), out);
            }
        }
    } else if let Some(p) = log.spec_pooled() {
        judge_spec(&src, &p, method.as_deref(), out);
    } else if let Some(on) = log.spec_on() {
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
            format!(
                "{on}{}; no acceptance metrics in the log (vLLM prints them every 10 s while requests run, llama.cpp after each request; /metrics has the counters)",
                method.map(|m| format!("; method: {m}")).unwrap_or_default()
            ),
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

/// The acceptance verdict: 0 or below 5% is an error, below 10% a warning. A source without
/// counts or rate but with a mean acceptance length (SGLang without k) is judged on that:
/// 1.00 means nothing was accepted.
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
    let m = method
        .map(|m| format!(" ({})", m.split([',', ':']).next().unwrap_or(m)))
        .unwrap_or_default();
    let method_note = method.map(|m| format!(" Method: {m}.")).unwrap_or_default();
    let engine_rate = p
        .engine_rate
        .as_ref()
        .map(|(r, what)| format!(" The engine's own figure: {r:.2} ({what})."))
        .unwrap_or_default();
    let mal = p
        .mean_acceptance_length
        .map(|x| format!(", mean acceptance length {x:.2}"))
        .unwrap_or_default();
    let Some(rate) = p.acceptance_rate else {
        if let Some(len) = p.mean_acceptance_length {
            let summary = format!(
                "mean acceptance length {len:.2} (mean of {} interval values, the engine prints no counts; 1.00 means no draft token was accepted), {k}: the acceptance rate needs k.{engine_rate}{method_note}",
                p.samples
            );
            if len <= 1.005 {
                out.push(f(
                    "spec-accepts-nothing",
                    Severity::Error,
                    format!("the drafter accepts nothing: mean acceptance length {len:.2}"),
                    format!("{summary} Every step pays for its draft tokens and keeps none, so decoding is slower than without speculation: a broken draft model, a drafter that does not match the checkpoint, or a wrong draft configuration. Turn speculation off or fix the drafter"),
                    src.to_string(),
                ));
            } else {
                out.push(f(
                    "spec-decoding",
                    Severity::Info,
                    format!("speculative decoding on{m}: mean acceptance length {len:.2}, {k}"),
                    summary,
                    src.to_string(),
                ));
            }
            return;
        }
        out.push(f(
            "spec-decoding",
            Severity::Info,
            format!("speculative decoding on{m}, {k}"),
            format!(
                "{}acceptance not reported (no accepted-token counts){engine_rate}{method_note}",
                p.drafts
                    .map(|d| format!("{d} drafts; "))
                    .unwrap_or_default()
            ),
            src.to_string(),
        ));
        return;
    };
    let counts = match (&p.acceptance_rule, p.counts) {
        (Some(rule), _) => format!("acceptance = {rule}; mean of {} interval values", p.samples),
        (None, true) => format!("{} of {} drafted tokens accepted", p.accepted, p.drafted),
        (None, false) => format!(
            "mean of {} interval rates (the engine prints no counts)",
            p.samples
        ),
    };
    let per_pos = if p.per_position.is_empty() {
        String::new()
    } else {
        format!(
            ", per-position acceptance ({})",
            p.per_position
                .iter()
                .map(|r| format!("{r:.3}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let summary = format!(
        "acceptance {} at {k}{mal}{per_pos}: {counts}.{engine_rate}{method_note}",
        pct(rate)
    );
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
                "{summary} Every step pays for k draft tokens and keeps none, so decoding is slower than without speculation: a broken draft model, a drafter that does not match the checkpoint (other tokenizer, other fine-tune, a 4-bit MTP head), or a wrong draft configuration. Turn speculation off or fix the drafter"
            ),
            src.to_string(),
        ));
    } else if enough && rate < 0.10 {
        out.push(f(
            "spec-low-acceptance",
            Severity::Warning,
            format!("low draft acceptance: {} at {k}", pct(rate)),
            if method.is_some_and(|m| m.contains("n-gram")) {
                format!("{summary} N-gram drafts are copied from text already seen: on text that does not repeat they are rarely right, so low acceptance is their nature, not a fault; if decoding got slower, turn speculation off")
            } else {
                format!("{summary} Below 10% the drafting rarely pays for itself; check the drafter against the checkpoint, or lower k")
            },
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
    scrape_unknowns(m, out);
    counter_findings(
        x.tokens.as_ref(),
        x.prefix_cache.as_ref(),
        "since the engine started (counter totals)",
        name,
        out,
    );
    if let Some(p) = &x.spec {
        let why = x.spec_evidence.clone().unwrap_or_default();
        if p.drafts == Some(0) {
            let llama = x.engine.as_deref() == Some("llama.cpp");
            out.push(f(
                "spec-decoding",
                Severity::Info,
                if llama {
                    "no speculative draft counted".into()
                } else {
                    "speculative decoding configured, 0 drafts".into()
                },
                if llama {
                    format!("{why}; llama.cpp exports its spec_decode counters whether or not speculation is configured, so 0 says no draft was made, not whether speculation is on")
                } else {
                    why
                },
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

/// What a scrape cannot tell, said as "unknown" with what would tell: the KV capacity, the
/// prefix cache's use and speculative decoding, each when the scrape has no family for it.
/// llama.cpp's `/metrics` exports no KV capacity (none of its `llamacpp:` families states one:
/// see the build-0c1e57098 scrapes in `tests/fixtures/real/engines/`): its `/slots` endpoint
/// (`n_ctx` per slot) or the log's `load_model` line do.
fn scrape_unknowns(m: &MetricsInput, out: &mut Vec<Finding>) {
    let x = &m.facts;
    let engine = x.engine.as_deref();
    let mut unknown = Vec::new();
    if x.kv_capacity.is_none() {
        unknown.push(match engine {
            Some("llama.cpp") => "KV capacity: llama.cpp's /metrics exports none; its /slots endpoint (n_ctx per slot × slots) or the log's `load_model: initializing, n_slots = …, n_ctx_slot = …` line tells".to_string(),
            Some("sglang") => "KV capacity: no sglang:max_total_num_tokens sample; the log's `KV Cache is allocated. #tokens: …` line tells".into(),
            Some("vllm") => "KV capacity: no vllm:cache_config_info sample with num_gpu_blocks and block_size (or kv_cache_size_tokens); the log's `GPU KV cache size: … tokens` line tells".into(),
            _ => "KV capacity: no family of a known engine states it; the engine's startup log tells".into(),
        });
    }
    if x.prefix_cache.is_none() {
        unknown.push(match engine {
            Some("llama.cpp") => "prefix-cache use: no llamacpp:prompt_tokens_cached sample (older builds do not export it)".to_string(),
            Some("vllm") => "prefix-cache use: no vllm:prefix_cache_queries / vllm:prefix_cache_hits samples".into(),
            Some("sglang") => "prefix-cache use: no cache-hit family read from SGLang's scrape".into(),
            _ => "prefix-cache use: no prefix-cache counter".into(),
        });
    }
    if x.spec.is_none() {
        unknown.push(match engine {
            Some("llama.cpp") => "speculative decoding: no llamacpp:spec_decode_* samples (builds before these counters, or no speculation); the log's `draft acceptance` lines tell".to_string(),
            Some("vllm") => "speculative decoding: no vllm:spec_decode_* families (off, or a version without them); the log's `non-default args` / `SpecDecoding metrics` lines tell".into(),
            Some("sglang") => "speculative decoding: no sglang:spec_accept_length sample; the log's server_args (speculative_algorithm) tells".into(),
            _ => "speculative decoding: no counter of a known engine".into(),
        });
    }
    if unknown.is_empty() {
        return;
    }
    out.push(f(
        "metrics-unknown",
        Severity::Info,
        format!(
            "{}: {} unknown from this scrape",
            m.name,
            unknown
                .iter()
                .map(|u| u.split(':').next().unwrap_or(u))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        unknown.join("; "),
        m.name.clone(),
    ));
}

/// Prompt/generation counters and the prefix cache, as findings.
fn counter_findings(
    t: Option<&scrape::TokenCounters>,
    pc: Option<&scrape::PrefixCache>,
    when: &str,
    src: &str,
    out: &mut Vec<Finding>,
) {
    if let Some(t) = t {
        let speed = |n: Option<f64>, s: Option<f64>, what: &str| {
            match (n, s) {
            (Some(n), Some(s)) if s > 0.0 => Some(format!(
                "{what} {} tokens in {s:.2} s ({:.1} tok/s: seconds summed over slots, so a per-slot speed, not the server's throughput)",
                thousands(n.round() as u64),
                n / s
            )),
            (Some(n), _) => Some(format!("{what} {} tokens", thousands(n.round() as u64))),
            _ => None,
        }
        };
        let parts: Vec<String> = [
            speed(t.prompt_tokens, t.prompt_seconds, "prompt"),
            speed(t.generated_tokens, t.generation_seconds, "generated"),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !parts.is_empty() {
            out.push(f(
                "engine-counters",
                Severity::Info,
                format!("prompt and generation counters {when}"),
                format!("{} (from {})", parts.join("; "), t.source),
                src.to_string(),
            ));
        }
    }
    if let Some(c) = pc {
        out.push(f(
            "prefix-cache",
            Severity::Info,
            if c.queries > 0.0 {
                format!(
                    "prefix cache: {} of {} prompt tokens ({}) reused {when}",
                    thousands(c.hits.round() as u64),
                    thousands(c.queries.round() as u64),
                    pct(c.hits / c.queries)
                )
            } else {
                format!("prefix cache: no prompt token looked up {when}")
            },
            format!("from {}", c.source),
            src.to_string(),
        ));
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
    counter_findings(
        scrape::token_counters(Some(a), b).as_ref(),
        scrape::prefix_cache(Some(a), b).as_ref(),
        "between the scrapes",
        &format!("{} → {}", first.name, last.name),
        out,
    );
    if let Some((p, why)) = scrape::spec(Some(a), b) {
        let src = format!("{} → {} ({why})", first.name, last.name);
        if p.drafts == Some(0) {
            let generated = scrape::token_counters(Some(a), b)
                .and_then(|t| t.generated_tokens)
                .filter(|g| *g > 0.0);
            out.push(f(
                "spec-decoding",
                Severity::Info,
                "no drafts between the scrapes".into(),
                match generated {
                    Some(g) => format!(
                        "{} tokens were generated between the scrapes and not one draft was made: speculation proposed nothing (an n-gram drafter finds no match in free text), or it is not configured{}",
                        thousands(g.round() as u64),
                        if first.facts.engine.as_deref() == Some("llama.cpp") {
                            " (llama.cpp exports these counters either way)"
                        } else {
                            ""
                        }
                    ),
                    None => "no request ran between the scrapes (no generated tokens counted), or the counters reset".into(),
                },
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
    engine_flag: Option<&checkpoint::predict::EngineSpec>,
    out: &mut Vec<Finding>,
) {
    let log = &l.log;
    let engine = match (&log.engine, &log.engine_version) {
        (Some(e), Some(v)) => format!("{e} {v}"),
        (Some(e), None) => format!("{e} (version not in the log)"),
        _ => "the engine".into(),
    };
    kernels::marlin_findings(l, ck, card, &engine, out);
    kernels::passed_over_findings(l, card, out);
    kernels::prediction_findings(l, ck, card, engine_flag, out);
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

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_contradictions;
#[cfg(test)]
mod tests_engines;
#[cfg(test)]
mod tests_prediction;
#[cfg(test)]
mod tests_sentences;
