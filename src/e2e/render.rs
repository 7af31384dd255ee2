//! The e2e section of a report: Markdown (conditions first, then latency and throughput),
//! CSV rows (one per run, one per request) and SVG plots (plotters' SVG backend: latency
//! percentiles against concurrency or rate; acceptance by draft position).
//!
//! An invalid run's throughput is never shown as a figure: its cells say `invalid` and the
//! reasons are listed.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use super::bootlog::BootLog;
use super::conditions::{Conditions, Sourced, SpecState};
use super::driver::RunResult;
use super::executor::{ExecStop, LoadPoint};
use super::metrics::Percentiles;
use super::E2eResults;
use crate::output::table::{grouped, markdown_table, thousands};
use crate::output::write::atomic_write;

fn src<T: std::fmt::Display>(s: &Option<Sourced<T>>) -> (String, String) {
    match s {
        Some(s) => (s.value.to_string(), s.source.clone()),
        None => ("unknown".into(), "—".into()),
    }
}

fn ms(x: f64) -> String {
    if x < 10.0e-3 {
        format!("{:.2}", x * 1e3)
    } else if x < 1.0 {
        format!("{:.1}", x * 1e3)
    } else {
        // Digit-grouped: 1,039.8.
        grouped(x * 1e3, 1)
    }
}

/// Fewest samples for which the `q` quantile is shown: with fewer, no sample lies beyond it
/// and the "percentile" is only the largest value (p90: 10, p95: 20, p99: 100).
pub fn min_n_for(q: f64) -> usize {
    (1.0 / (1.0 - q)).round() as usize
}

fn pctl(p: &Percentiles, q: f64, v: f64) -> String {
    if p.n >= min_n_for(q) {
        ms(v)
    } else {
        "—".into()
    }
}

/// Whether two percentile summaries hold the same figures (TTFC repeats TTFT when no reasoning
/// text precedes the first content token).
fn same_figures(a: &Option<Percentiles>, b: &Option<Percentiles>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => {
            let close = |x: f64, y: f64| (x - y).abs() <= 1e-9_f64.max(1e-6 * x.abs());
            a.n == b.n
                && close(a.p50, b.p50)
                && close(a.p90, b.p90)
                && close(a.p95, b.p95)
                && close(a.p99, b.p99)
                && close(a.mean, b.mean)
        }
        (None, None) => true,
        _ => false,
    }
}

fn pct(x: Option<f64>) -> String {
    match x {
        Some(v) if v > 0.0 && v < 0.001 => format!("{:.4}%", v * 100.0),
        Some(v) => format!("{:.1}%", v * 100.0),
        None => "unknown".into(),
    }
}

fn same<T: PartialEq + Clone>(runs: &[RunResult], f: impl Fn(&RunResult) -> T) -> Option<T> {
    let first = f(runs.first()?);
    runs.iter().all(|r| f(r) == first).then_some(first)
}

/// The derivation shown after a KV capacity, only when it holds: `(N blocks × B)` when
/// N × B is the capacity shown; otherwise the block facts are said to be separate.
fn kv_derivation(kv: &super::conditions::KvCondition, capacity: u64) -> String {
    match (kv.num_blocks, kv.block_size) {
        (Some(n), Some(b)) if n.checked_mul(b) == Some(capacity) => {
            format!(" ({} blocks × {b})", thousands(n))
        }
        (Some(n), Some(b)) => format!(
            " (stated by the engine; it also reports {} blocks of {b} tokens, which make {} tokens: not this figure's derivation)",
            thousands(n),
            thousands(n.saturating_mul(b))
        ),
        _ => String::new(),
    }
}

/// The input-length cell: what the prompts hold (content tokens, exact or not) and, for chat,
/// the prompt tokens the engine counted with its chat template.
fn input_length(l: &super::conditions::LengthCondition, chat: bool) -> String {
    let content = match (l.input_requested, l.input_exact) {
        (Some(n), Some(true)) => format!("{n} content tokens per request, token-exact"),
        (Some(n), Some(false)) => format!("{n} content tokens requested, not all exact"),
        (Some(n), None) => format!("~{n} content tokens (no tokenizer: approximate)"),
        (None, _) => "natural (prompt set)".into(),
    };
    match (l.input_reported_mean, l.template_tokens_mean) {
        (Some(p), Some(t)) if chat && t.abs() >= 0.5 => format!(
            "{content}; the engine counted {p:.0} prompt tokens per request: its chat template adds {t:.0}"
        ),
        (Some(p), _) => format!("{content}; the engine counted {p:.0} prompt tokens per request"),
        (None, _) if chat => format!(
            "{content} (the engine also sees its chat template's tokens; it reported no prompt counts)"
        ),
        (None, _) => content,
    }
}

/// The suite as it ran, after command-line overrides (lengths, load, cache, sampling), with
/// its own description (which states the values before any override) after it.
pub fn suite_as_run(s: &super::workload::Suite) -> String {
    use super::workload::{LoadMode, WorkloadKind};
    let w = &s.workload;
    let l = &s.load;
    let input = match (w.kind, w.input_tokens, w.shared_prefix_tokens) {
        (WorkloadKind::Fixed, Some(n), _) => format!("{n}-token prompts"),
        (WorkloadKind::SharedPrefix, Some(n), Some(p)) => {
            format!("{n}-token prompts sharing a {p}-token prefix")
        }
        _ => format!("the {} prompt set", w.prompt_set.name()),
    };
    let output = if w.ignore_eos {
        format!("{} output tokens (fixed, ignore_eos)", w.output_tokens)
    } else {
        format!("up to {} output tokens", w.output_tokens)
    };
    let list = |v: Vec<String>| v.join(", ");
    let load = match l.mode {
        LoadMode::Closed => format!(
            "closed loop at concurrency {}",
            list(l.concurrency.iter().map(u32::to_string).collect())
        ),
        LoadMode::Open => format!(
            "open loop at {} req/s ({:?}{}{})",
            list(l.rates.iter().map(|r| format!("{r}")).collect()),
            l.arrival,
            if l.burstiness != 1.0 {
                format!(", burstiness {}", l.burstiness)
            } else {
                String::new()
            },
            l.max_concurrency
                .map(|m| format!(", at most {m} in flight"))
                .unwrap_or_default()
        )
        .to_lowercase(),
    };
    let mut text = format!(
        "{} as run: {}, {}, {} API; {}; {} requests per point{}, {} warm-up; {:?} cache; temperature {}",
        crate::output::table::code(&s.name),
        input,
        output,
        match w.api {
            super::client::Api::Chat => "chat",
            super::client::Api::Completions => "completions",
        },
        load,
        l.requests,
        l.duration_s
            .map(|d| format!(" (at most {d} s)"))
            .unwrap_or_default(),
        l.warmup,
        l.cache,
        s.sampling.temperature
    );
    text = text
        .replace("Cold cache", "cold cache")
        .replace("Warm cache", "warm cache");
    if !s.description.is_empty() {
        text.push_str(&format!(
            " (the suite's own description, before command-line overrides: \"{}\")",
            s.description
        ));
    }
    text
}

/// The latency row of `vllm bench serve`'s TTFT (the first chunk with a `choices` entry).
const FIRST_CHUNK_ROW: &str = "first chunk (vllm bench TTFT)";

/// When the engine served random weights (rigbench's built-in runtime on a `synthetic:` preset,
/// as the CPU report's e2e part does), a sentence saying so, for beside every throughput and
/// latency figure of the run: they exercise the harness and the runtime's arithmetic, not a
/// trained model's speed, and the output text is noise. `None` for a checkpoint or another
/// engine.
pub fn random_weights_note(res: &E2eResults) -> Option<String> {
    let f = &res.engine.facts;
    let from_runtime = f
        .runtime
        .as_ref()
        .and_then(|r| r.model_provenance.as_ref())
        .map(|p| p.value.clone());
    let model = from_runtime
        .or_else(|| f.model.as_ref().map(|m| m.value.clone()))
        .filter(|m| m.starts_with("synthetic:"))?;
    Some(format!(
        "**Random weights** ({}): these figures exercise the harness on a model of seeded random weights; they are not the speed, and say nothing of the quality, of a trained model.",
        crate::output::table::code(&model)
    ))
}

/// Render the e2e section.
pub fn render_markdown(res: &E2eResults) -> String {
    let mut o = String::new();
    render_preamble(&mut o, res);
    if res.runs.is_empty() {
        let _ = writeln!(o, "No run completed.\n");
        render_bootlog(&mut o, res.boot_log.as_ref());
        return o;
    }
    let runs = &res.runs;

    render_conditions(&mut o, res, runs);
    render_run_conditions(&mut o, runs);
    render_validity(&mut o, runs, res.engine_log_file.is_some());
    render_latency(&mut o, runs);
    render_throughput(&mut o, runs);
    if let Some(note) = random_weights_note(res) {
        let _ = writeln!(o, "{note}\n");
    }
    render_metrics_sampling(&mut o, runs);
    render_spec_acceptance(&mut o, runs);
    o.push_str(&super::render_serving::render(res));
    render_plots(&mut o, res);
    render_bootlog(&mut o, res.boot_log.as_ref());
    o
}

/// The section's heading, engine, suite, failure, determinism, output sample, quality, skipped runs and notes.
fn render_preamble(o: &mut String, res: &E2eResults) {
    match &res.self_test {
        Some(label) => {
            let _ = writeln!(o, "## End to end: {label}\n");
            let _ = writeln!(
                o,
                "These runs exercise the harness on the host CPU; they say nothing about the GPU and are kept out of rig baselines.\n"
            );
        }
        None => {
            let _ = writeln!(o, "## End to end\n");
        }
    }
    let eng = &res.engine;
    let _ = writeln!(
        o,
        "Engine: {} ({}){}.",
        eng.command
            .as_deref()
            .unwrap_or("an engine already running"),
        eng.kind,
        eng.url
            .as_deref()
            .map(|u| format!(" at {u}"))
            .unwrap_or_default()
    );
    if let Some(x) = &eng.exit {
        let _ = writeln!(o, "Engine exit: {x}.");
    }
    if let Some(s) = &res.suite {
        let _ = writeln!(o, "Suite: {}.", suite_as_run(s));
    }
    if res.interrupted {
        let _ = writeln!(
            o,
            "\n**Interrupted (Ctrl-C): the runs below are what was measured before the stop.**"
        );
    }
    if let Some(f) = &res.failure {
        let _ = writeln!(o, "\n**Failure:** {f}");
    }
    if let Some(d) = &res.determinism {
        // Ahead of every figure: a nondeterministic engine's figures are not reproducible.
        let _ = writeln!(
            o,
            "\n**Determinism ({} prompts sent twice at temperature {}, max_tokens {}, {} in flight):** {}",
            d.prompts, d.temperature, d.max_tokens, d.concurrency, d.summary()
        );
    }
    if let Some(r) = res.runs.iter().find(|r| !r.output_samples.is_empty()) {
        let _ = writeln!(
            o,
            "\nOutput sample ({}, first {} requests, up to {} characters each):",
            r.label,
            r.output_samples.len(),
            super::driver::OUTPUT_SAMPLE_CHARS
        );
        for s in &r.output_samples {
            let _ = writeln!(o, "- `{}`", s.replace('`', "'").replace('\n', "⏎"));
        }
    }
    if let Some(q) = &res.quality {
        let _ = writeln!(o, "\n{}", super::quality::render_markdown(q));
    }
    for s in &res.skipped {
        let _ = writeln!(o, "- skipped {s}");
    }
    for n in &res.notes {
        let _ = writeln!(o, "- note: {n}");
    }
    o.push('\n');
}

/// The table of conditions shared by every run.
fn render_conditions(o: &mut String, res: &E2eResults, runs: &[RunResult]) {
    let _ = writeln!(o, "### Conditions\n");
    let mut rows: Vec<Vec<String>> = Vec::new();
    let c0 = &runs[0].conditions;
    engine_condition_rows(&mut rows, res, c0);
    request_condition_rows(&mut rows, runs, c0);
    cache_condition_rows(&mut rows, res, runs, c0);
    length_condition_rows(&mut rows, res, runs, c0);
    token_condition_rows(&mut rows, res, runs);
    o.push_str(&markdown_table(&["condition", "value", "source"], &rows));
    o.push('\n');
}

/// Condition rows: engine, version, model, the runtime's own facts and the workload.
fn engine_condition_rows(rows: &mut Vec<Vec<String>>, res: &E2eResults, c0: &Conditions) {
    let (v, s) = src(&c0.engine);
    rows.push(vec!["engine".into(), v, s]);
    let (v, s) = src(&c0.engine_version);
    rows.push(vec!["engine version".into(), v, s]);
    let (v, s) = src(&c0.model);
    rows.push(vec!["model".into(), v, s]);
    if let Some(rt) = &res.engine.facts.runtime {
        for (name, f) in [
            ("backend", &rt.backend),
            ("device", &rt.device),
            ("model provenance", &rt.model_provenance),
            ("weight format", &rt.weight_format),
            ("KV cache dtype", &rt.kv_cache_dtype),
        ] {
            let (v, s) = src(f);
            rows.push(vec![name.into(), v, s]);
        }
    }
    if let Some(s) = &res.suite {
        rows.push(vec![
            "workload".into(),
            format!(
                "{:?} ({}), {} API",
                s.workload.kind,
                s.workload.prompt_set.name(),
                match s.workload.api {
                    super::client::Api::Chat => "chat",
                    super::client::Api::Completions => "completions",
                }
            )
            .to_lowercase(),
            "suite".into(),
        ]);
    }
}

/// Condition rows: thinking, reasoning observed and speculative decoding.
fn request_condition_rows(rows: &mut Vec<Vec<String>>, runs: &[RunResult], c0: &Conditions) {
    let t = &c0.thinking;
    rows.push(vec![
        "thinking".into(),
        match (t.api, t.sent) {
            (super::client::Api::Completions, _) => "n/a (completions API)".into(),
            (_, None) => "not sent (engine default)".into(),
            (_, Some(b)) => format!("enable_thinking={b}"),
        },
        "request (chat_template_kwargs)".into(),
    ]);
    let reasoning: usize = runs
        .iter()
        .map(|r| r.conditions.thinking.requests_with_reasoning)
        .sum();
    let tags: usize = runs
        .iter()
        .map(|r| r.conditions.thinking.requests_with_think_tags)
        .sum();
    rows.push(vec![
        "reasoning observed".into(),
        format!("{reasoning} requests with reasoning text, {tags} with <think> tags in content"),
        "responses".into(),
    ]);
    let spec_state = same(runs, |r| r.conditions.spec.state);
    rows.push(vec![
        "speculative decoding".into(),
        match spec_state {
            Some(SpecState::On) => "on".into(),
            Some(SpecState::Off) => "off".into(),
            Some(SpecState::Unknown) => "unknown".into(),
            None => "varies by run".into(),
        },
        c0.spec.evidence.clone(),
    ]);
    if spec_state != Some(SpecState::Off) {
        let (v, s) = src(&c0.spec.method);
        rows.push(vec!["speculative method".into(), v, s]);
        let (v, s) = src(&c0.spec.k);
        rows.push(vec!["speculative k".into(), v, s]);
    }
}

/// Condition rows: cache temperature (with the verdict wording for the report) and KV capacity.
fn cache_condition_rows(
    rows: &mut Vec<Vec<String>>,
    res: &E2eResults,
    runs: &[RunResult],
    c0: &Conditions,
) {
    rows.push(vec![
        "cache temperature".into(),
        format!(
            "{:?}; prompts salted per run; {}: {}",
            c0.cache.temperature,
            res.engine.facts.kind.reset_path(),
            match c0.cache.reset {
                Some(true) => "done",
                Some(false) => "refused",
                None => "not offered",
            }
        )
        .to_lowercase(),
        {
            // One verdict wording for the whole report: this row says what the per-run rows
            // below can say.
            let verifiable: Vec<&str> = runs
                .iter()
                .filter_map(|r| r.conditions.cache.counters.as_deref())
                .collect();
            if verifiable.len() == runs.len() {
                format!("checked per run below ({})", verifiable[0])
            } else if verifiable.is_empty() {
                "cannot be verified: the engine exposes no prefix-cache hit counters".into()
            } else {
                format!(
                    "checked per run below where the counters were readable ({} of {} runs)",
                    verifiable.len(),
                    runs.len()
                )
            }
        },
    ]);
    let kv = &c0.kv;
    rows.push(vec![
        "KV capacity".into(),
        match &kv.capacity_tokens {
            Some(c) => format!(
                "{} tokens{}",
                thousands(c.value),
                kv_derivation(kv, c.value)
            ),
            None => "unknown".into(),
        },
        kv.capacity_tokens
            .as_ref()
            .map(|c| match &kv.capacity_note {
                Some(n) => format!("{}; {n}", c.source),
                None => c.source.clone(),
            })
            .or_else(|| kv.capacity_note.clone())
            .unwrap_or_else(|| "—".into()),
    ]);
}

/// Condition rows: input length, prompt length check, engine tokenizer, output length and temperature.
fn length_condition_rows(
    rows: &mut Vec<Vec<String>>,
    res: &E2eResults,
    runs: &[RunResult],
    c0: &Conditions,
) {
    let l = &c0.lengths;
    let chat = res
        .suite
        .as_ref()
        .is_some_and(|s| s.workload.api == super::client::Api::Chat);
    rows.push(vec![
        "input length".into(),
        input_length(l, chat),
        "tokenizer at preparation; prompt tokens from the engine's usage".into(),
    ]);
    let checks: Vec<&super::conditions::PromptCheck> = runs
        .iter()
        .filter_map(|r| r.conditions.lengths.prompt_check.as_ref())
        .collect();
    if let Some(first) = checks.first() {
        let checked: usize = checks.iter().map(|c| c.checked).sum();
        let bad: usize = checks.iter().map(|c| c.mismatched).sum();
        let max = checks.iter().map(|c| c.max_abs_diff).max().unwrap_or(0);
        rows.push(vec![
            "prompt length check".into(),
            if bad == 0 {
                format!(
                    "{checked} prompts: the engine's count = prepared + {} overhead tokens, within max({:.0}%, {} tokens) (largest difference {max})",
                    first.overhead,
                    100.0 * super::conditions::PROMPT_TOLERANCE_REL,
                    super::conditions::PROMPT_TOLERANCE_TOKENS
                )
            } else {
                format!(
                    "**{bad} of {checked} prompts disagree** with the engine's count beyond max({:.0}%, {} tokens) after {} overhead tokens (largest difference {max}): those runs are invalid",
                    100.0 * super::conditions::PROMPT_TOLERANCE_REL,
                    super::conditions::PROMPT_TOLERANCE_TOKENS,
                    first.overhead
                )
            },
            format!("overhead {}", first.overhead_source),
        ]);
    }
    if let Some(n) = &res.engine.facts.tokenize_note {
        rows.push(vec![
            "engine tokenizer".into(),
            "not used".into(),
            n.clone(),
        ]);
    } else if let Some(f) = res.engine.facts.tokenize_form {
        rows.push(vec![
            "engine tokenizer".into(),
            f.label().into(),
            "probed at session start".into(),
        ]);
    }
    rows.push(vec![
        "output length requested".into(),
        if l.output_fixed {
            format!(
                "{} tokens, fixed (max_tokens + ignore_eos)",
                l.output_requested
            )
        } else {
            format!(
                "up to {} tokens (max_tokens), natural end",
                l.output_requested
            )
        },
        "request".into(),
    ]);
    rows.push(vec![
        "temperature".into(),
        format!("{}", c0.temperature),
        "request".into(),
    ]);
}

/// Condition rows: where token counts came from, the usage cross-check and the engine environment.
fn token_condition_rows(rows: &mut Vec<Vec<String>>, res: &E2eResults, runs: &[RunResult]) {
    let mut sources: Vec<String> = runs
        .iter()
        .flat_map(|r| {
            r.conditions
                .token_sources
                .iter()
                .map(|s| s.label().to_string())
        })
        .collect();
    sources.sort();
    sources.dedup();
    rows.push(vec![
        "token counts from".into(),
        if sources.is_empty() {
            "unknown".into()
        } else {
            sources.join(", ")
        },
        "per request".into(),
    ]);
    let checks: Vec<&super::conditions::TokenCheck> = runs
        .iter()
        .filter_map(|r| r.conditions.token_check.as_ref())
        .collect();
    if let Some(first) = checks.first() {
        let checked: usize = checks.iter().map(|c| c.checked).sum();
        let bad: usize = checks.iter().map(|c| c.disagreeing).sum();
        let max = checks.iter().map(|c| c.max_rel_diff).fold(0.0, f64::max);
        rows.push(vec![
            "usage cross-check".into(),
            if checked == 0 {
                first.source.clone()
            } else if bad == 0 {
                format!(
                    "{checked} requests re-counted: all within {:.0}% (largest difference {:.1}%)",
                    100.0 * first.tolerance,
                    100.0 * max
                )
            } else {
                format!(
                    "**{bad} of {checked} requests disagree by more than {:.0}%** (largest {:.1}%): usage and the re-counted output differ",
                    100.0 * first.tolerance,
                    100.0 * max
                )
            },
            format!("{} on the whole received text, no special tokens", first.source),
        ]);
    }
    if !res.engine.env.is_empty() {
        rows.push(vec![
            "engine environment".into(),
            res.engine
                .env
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(", "),
            "variables that change kernels, as the engine rigbench started got them".into(),
        ]);
    }
}

/// The per-run conditions table.
fn render_run_conditions(o: &mut String, runs: &[RunResult]) {
    let mut rows = Vec::new();
    for r in runs {
        let c = &r.conditions;
        let cache = format!(
            "{}{}",
            match c.cache.verified {
                Some(true) => "verified: ",
                Some(false) => "CONTRADICTED: ",
                None => "unverified: ",
            },
            c.cache.note
        );
        let spec = match c.spec.state {
            SpecState::On => format!(
                "{} accepted, mean length {}",
                pct(c.spec.acceptance_rate),
                c.spec
                    .mean_acceptance_length
                    .map(|m| format!("{m:.2}"))
                    .unwrap_or_else(|| "unknown".into())
            ),
            SpecState::Off => "off".into(),
            SpecState::Unknown => "unknown".into(),
        };
        let out = match (
            c.lengths.output_min,
            c.lengths.output_mean,
            c.lengths.output_max,
        ) {
            (Some(a), Some(m), Some(b)) => format!("{a} / {m:.1} / {b}"),
            _ => "unknown".into(),
        };
        rows.push(vec![
            r.label.clone(),
            if r.validity.valid {
                "yes".into()
            } else {
                "**no**".into()
            },
            cache,
            pct(c.cache.hit_rate),
            spec,
            match (&c.kv.peak_usage, &c.kv.peak_usage_source) {
                (Some(_), Some(src)) if src.starts_with("high-water") => {
                    format!("{} (high-water mark)", pct(c.kv.peak_usage))
                }
                (Some(_), Some(_)) => format!(
                    "{} (sampled, {} scrapes)",
                    pct(c.kv.peak_usage),
                    r.polls.scrape_ms.len().max(r.polls.polls)
                ),
                _ => pct(c.kv.peak_usage),
            },
            c.kv.preemptions
                .map(|p| p.to_string())
                .unwrap_or_else(|| "unknown".into()),
            out,
            c.thinking.flag.clone().unwrap_or_else(|| "—".into()),
        ]);
    }
    o.push_str(&markdown_table(
        &[
            "run",
            "valid",
            "cache temperature",
            "prefix hit rate",
            "speculative",
            "peak KV usage",
            "preemptions",
            "output tokens min / mean / max",
            "thinking check",
        ],
        &rows,
    ));
    o.push('\n');
}

/// The validity list, where a run is invalid or has notes or unknown conditions.
fn render_validity(o: &mut String, runs: &[RunResult], log_given: bool) {
    let invalid: Vec<&RunResult> = runs.iter().filter(|r| !r.validity.valid).collect();
    if !invalid.is_empty()
        || runs
            .iter()
            .any(|r| !r.validity.notes.is_empty() || !r.validity.missing_conditions.is_empty())
    {
        let _ = writeln!(o, "### Validity\n");
        for r in runs {
            for why in r.validity.reasons.iter() {
                let _ = writeln!(o, "- {}: invalid: {why}", r.label);
            }
            for m in &r.validity.missing_conditions {
                let _ = writeln!(
                    o,
                    "- {}: condition unknown (not exposed by the engine): {m}{}",
                    r.label,
                    super::validity::hint_with_log(how_to_state(m), log_given)
                );
            }
            for n in &r.validity.notes {
                let _ = writeln!(o, "- {}: note: {n}", r.label);
            }
        }
        o.push('\n');
    }
}

/// The latency table and its notes.
fn render_latency(o: &mut String, runs: &[RunResult]) {
    let _ = writeln!(o, "### Latency (ms, completed requests)\n");
    let mut rows = Vec::new();
    let mut ttfc_hidden = 0;
    let mut short = false;
    for r in runs {
        let l = &r.latency;
        for (name, p) in [
            ("TTFT", &l.ttft),
            (FIRST_CHUNK_ROW, &l.first_chunk),
            ("TTFC", &l.ttfc),
            ("ITL", &l.itl),
            ("TPOT", &l.tpot),
            ("E2E", &l.e2e),
        ] {
            if name == "TTFC" && same_figures(&l.ttft, &l.ttfc) {
                ttfc_hidden += 1;
                continue;
            }
            if name == FIRST_CHUNK_ROW && (p.is_none() || same_figures(&l.ttft, p)) {
                continue;
            }
            let mut row = vec![r.label.clone(), name.to_string()];
            let decode = matches!(name, "ITL" | "TPOT");
            match p {
                Some(p) => {
                    short |= p.n < min_n_for(0.99);
                    row.extend([
                        thousands(p.n as u64),
                        ms(p.p50),
                        pctl(p, 0.90, p.p90),
                        pctl(p, 0.95, p.p95),
                        pctl(p, 0.99, p.p99),
                        ms(p.mean),
                    ])
                }
                None if decode && l.decode_not_observable > 0 => {
                    row.push("0".into());
                    row.push(format!(
                        "not observable: {} requests arrived in one chunk",
                        l.decode_not_observable
                    ));
                    row.extend(std::iter::repeat_n("—".to_string(), 4));
                }
                None => row.extend(std::iter::repeat_n("n/a".to_string(), 6)),
            }
            if decode && p.is_some() && l.decode_not_observable > 0 {
                row[1] = format!(
                    "{name} ({} single-chunk requests not observable)",
                    l.decode_not_observable
                );
            }
            if name == "ITL" && p.is_some() && l.bursty > 0 {
                row[1] = format!("ITL (delivery, not decode: {} bursty requests)", l.bursty);
            }
            if !r.validity.valid {
                row[1] = format!("{name} (invalid run)");
            }
            rows.push(row);
        }
    }
    o.push_str(&markdown_table(
        &["run", "metric", "n", "p50", "p90", "p95", "p99", "mean"],
        &rows,
    ));
    let _ = writeln!(
        o,
        "\nTTFT: request sent → the first chunk that carries a generated token (a per-chunk usage increment, token ids, or content or reasoning text; a chunk whose text the engine held back counts, a role chunk does not). TTFC: → the first chunk with content text. `vllm bench serve` stamps its TTFT at the first chunk with a `choices` entry, a role chunk included; where that differs it is shown as \"{FIRST_CHUNK_ROW}\"."
    );
    let bursty: usize = runs.iter().map(|r| r.latency.bursty).sum();
    if bursty > 0 {
        let _ = writeln!(
            o,
            "\n{bursty} requests received their tokens in bursts (chunks under 1 ms apart) or several tokens per chunk: their ITL measures how the server delivered tokens, not its decode steps; TPOT ((E2E − TTFT) / (tokens − 1)) is not affected."
        );
    }
    let excluded: Vec<String> = runs
        .iter()
        .filter(|r| r.latency.opening_wave_excluded > 0)
        .map(|r| format!("{}: {}", r.label, r.latency.opening_wave_excluded))
        .collect();
    if !excluded.is_empty() {
        let _ = writeln!(
            o,
            "\nClosed loop: the opening wave (requests released together after the warm-up) is left out of these statistics ({}); throughput below covers every request.",
            excluded.join(", ")
        );
    }
    o.push('\n');
    if short {
        let _ = writeln!(
            o,
            "n is the number of samples: requests for TTFT, TTFC, TPOT and E2E, token gaps for ITL. A percentile is shown only where n holds it (p90 from n ≥ {}, p95 from n ≥ {}, p99 from n ≥ {}); with fewer samples it would only repeat the largest value (—).\n",
            min_n_for(0.90),
            min_n_for(0.95),
            min_n_for(0.99)
        );
    }
    if ttfc_hidden > 0 {
        let _ = writeln!(
            o,
            "TTFC (first content token) equals TTFT {} (no reasoning text came before the first content token), so it is not repeated.\n",
            if ttfc_hidden == runs.len() {
                "in every run".to_string()
            } else {
                format!("in {ttfc_hidden} of {} runs", runs.len())
            }
        );
    }
}

/// The throughput table.
fn render_throughput(o: &mut String, runs: &[RunResult]) {
    let _ = writeln!(o, "### Throughput\n");
    let mut rows = Vec::new();
    for r in runs {
        let measured = r.throughput.as_ref().or(r.throughput_invalid.as_ref());
        let counts = measured
            .map(|t| format!("{} / {} / {}", t.completed, t.failed, t.cancelled))
            .unwrap_or_else(|| {
                let ok = r.requests.iter().filter(|q| q.ok).count();
                let c = r.requests.iter().filter(|q| q.cancelled).count();
                format!("{ok} / {} / {c}", r.requests.len() - ok - c)
            });
        let late = r
            .lateness
            .as_ref()
            .map(|l| format!("{} of {} (max {} ms)", l.late, l.arrivals, ms(l.max_s)))
            .unwrap_or_else(|| "—".into());
        match r.presented_throughput() {
            Some(t) => rows.push(vec![
                r.label.clone(),
                counts,
                format!("{} s", grouped(t.duration_s, 2)),
                grouped(t.output_tok_per_s, 1),
                grouped(t.requests_per_s, 3),
                t.input_tokens
                    .map(thousands)
                    .unwrap_or_else(|| "unknown".into()),
                thousands(t.output_tokens),
                late,
                stop_text(&r.stop),
            ]),
            None => rows.push(vec![
                r.label.clone(),
                counts,
                "—".into(),
                "invalid".into(),
                "invalid".into(),
                "—".into(),
                "—".into(),
                late,
                stop_text(&r.stop),
            ]),
        }
    }
    o.push_str(&markdown_table(
        &[
            "run",
            "completed / failed / cancelled",
            "duration",
            "output tok/s",
            "req/s",
            "input tokens",
            "output tokens",
            "late arrivals",
            "ended",
        ],
        &rows,
    ));
    o.push('\n');
}

/// Refused /metrics gauge values and what the /metrics sampling cost.
fn render_metrics_sampling(o: &mut String, runs: &[RunResult]) {
    // Gauge values refused as impossible, and scrapes that gave nothing, with their reasons.
    for r in runs.iter().filter(|r| !r.polls.rejected.is_empty()) {
        let _ = writeln!(
            o,
            "/metrics during {}: {}.\n",
            r.label,
            r.polls.rejected.join("; ")
        );
    }

    // What the /metrics sampling cost and how often it ran.
    let scrapes: Vec<String> = runs
        .iter()
        .filter(|r| !r.polls.scrape_ms.is_empty())
        .map(|r| {
            let v = &r.polls.scrape_ms;
            let mut sorted = v.clone();
            sorted.sort_by(f64::total_cmp);
            let every = r
                .polls
                .min_interval_s
                .map(|m| format!(" (waits {}–{} s)", grouped(m, 2), grouped(2.0 * m, 2)))
                .unwrap_or_default();
            format!(
                "{}: {} scrapes{every}, each took {:.1} ms at the median, {:.1} ms at the longest",
                r.label,
                v.len(),
                sorted[sorted.len() / 2],
                sorted[sorted.len() - 1]
            )
        })
        .collect();
    if !scrapes.is_empty() {
        let _ = writeln!(
            o,
            "/metrics was scraped at the start and the end of each run, and in between after a wait of 50 × the last scrape's duration kept within the range shown, so scraping takes about 2% of the run (more when a scrape outlasts 1/50 of the longest wait): {}.\n",
            scrapes.join("; ")
        );
    }
}

/// The speculative acceptance by draft position table.
fn render_spec_acceptance(o: &mut String, runs: &[RunResult]) {
    let spec_runs: Vec<&RunResult> = runs
        .iter()
        .filter(|r| !r.conditions.spec.per_position.is_empty())
        .collect();
    if !spec_runs.is_empty() {
        let k = spec_runs
            .iter()
            .map(|r| r.conditions.spec.per_position.len())
            .max()
            .unwrap_or(0);
        let _ = writeln!(
            o,
            "### Speculative acceptance by draft position (/metrics deltas)\n"
        );
        let mut headers: Vec<String> = vec![
            "run".into(),
            "drafts".into(),
            "acceptance".into(),
            "mean length".into(),
        ];
        headers.extend((1..=k).map(|i| format!("pos {i}")));
        let h: Vec<&str> = headers.iter().map(String::as_str).collect();
        let rows: Vec<Vec<String>> = spec_runs
            .iter()
            .map(|r| {
                let s = &r.conditions.spec;
                let mut row = vec![
                    r.label.clone(),
                    s.drafts.map(thousands).unwrap_or_else(|| "unknown".into()),
                    pct(s.acceptance_rate),
                    s.mean_acceptance_length
                        .map(|m| format!("{m:.2}"))
                        .unwrap_or_else(|| "unknown".into()),
                ];
                row.extend((0..k).map(|i| {
                    s.per_position
                        .get(i)
                        .map(|v| format!("{:.3}", v))
                        .unwrap_or_default()
                }));
                row
            })
            .collect();
        o.push_str(&markdown_table(&h, &rows));
        o.push('\n');
    }
}

/// The plots' image links.
fn render_plots(o: &mut String, res: &E2eResults) {
    let plots = plot_names(res);
    if !plots.is_empty() {
        let _ = writeln!(o, "### Plots\n");
        for p in plots {
            let _ = writeln!(o, "![{p}]({p})");
        }
        o.push('\n');
    }
}

fn stop_text(s: &ExecStop) -> String {
    match s {
        ExecStop::Completed => "all sent".into(),
        ExecStop::DurationLimit => "duration limit".into(),
        ExecStop::Interrupted => "interrupted".into(),
        ExecStop::EngineFailed(_) => "engine failed".into(),
    }
}

fn render_bootlog(o: &mut String, b: Option<&BootLog>) {
    let Some(b) = b else { return };
    let _ = writeln!(o, "### Engine log findings\n");
    // The same findings as `rigbench diagnose --log` on this log.
    let input = crate::diagnose::LogInput {
        name: "engine log".into(),
        log: b.clone(),
    };
    let findings = crate::diagnose::findings_for_log(&input);
    o.push_str(&crate::diagnose::render::findings_markdown(&findings));
    o.push('\n');
}

const LATENCY_PLOT: &str = "e2e_latency.svg";
const ACCEPTANCE_PLOT: &str = "e2e_acceptance_by_position.svg";

/// `(x, run)` pairs of valid runs for the latency plot, and the x-axis name.
fn latency_points(res: &E2eResults) -> (Vec<(f64, &RunResult)>, &'static str) {
    let mut closed: Vec<(f64, &RunResult)> = Vec::new();
    let mut open: Vec<(f64, &RunResult)> = Vec::new();
    for r in res.runs.iter().filter(|r| r.validity.valid) {
        match &r.load {
            LoadPoint::Closed { concurrency } => closed.push((f64::from(*concurrency), r)),
            LoadPoint::Open { rate, .. } => open.push((*rate, r)),
        }
    }
    let (mut v, name) = if closed.len() >= open.len() {
        (closed, "concurrency (requests in flight)")
    } else {
        (open, "arrival rate (requests/s)")
    };
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    (v, name)
}

fn plot_names(res: &E2eResults) -> Vec<&'static str> {
    let mut v = Vec::new();
    if !latency_points(res).0.is_empty() {
        v.push(LATENCY_PLOT);
    }
    if res
        .runs
        .iter()
        .any(|r| r.validity.valid && !r.conditions.spec.per_position.is_empty())
    {
        v.push(ACCEPTANCE_PLOT);
    }
    v
}

fn perr<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plot drawing failed: {e}")
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Write the plots into `dir`; returns the file names written. Only valid runs are plotted.
///
/// # Errors
/// Drawing or writing failed (the error names the file).
pub fn write_plots(res: &E2eResults, dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut written = Vec::new();
    let (pts, xname) = latency_points(res);
    if !pts.is_empty() {
        type Getter = fn(&RunResult) -> Option<&Percentiles>;
        type Pick = fn(&Percentiles) -> f64;
        let series: [(&str, Getter, Pick); 6] = [
            ("TTFT p50", |r| r.latency.ttft.as_ref(), |p| p.p50),
            ("TTFT p99", |r| r.latency.ttft.as_ref(), |p| p.p99),
            ("TPOT p50", |r| r.latency.tpot.as_ref(), |p| p.p50),
            ("TPOT p99", |r| r.latency.tpot.as_ref(), |p| p.p99),
            ("ITL p50", |r| r.latency.itl.as_ref(), |p| p.p50),
            ("ITL p99", |r| r.latency.itl.as_ref(), |p| p.p99),
        ];
        // p99 points only where n holds a p99 (see `min_n_for`).
        let data: Vec<(&str, Vec<(f64, f64)>)> = series
            .iter()
            .map(|(name, get, pick)| {
                let need = if name.ends_with("p99") {
                    min_n_for(0.99)
                } else {
                    0
                };
                (
                    *name,
                    pts.iter()
                        .filter_map(|(x, r)| {
                            get(r).filter(|p| p.n >= need).map(|p| (*x, pick(p) * 1e3))
                        })
                        .collect(),
                )
            })
            .collect();
        let xmax = pts.iter().map(|p| p.0).fold(0.0, f64::max) * 1.1 + 0.1;
        // TTFT (hundreds of ms under load) and the per-token gaps (ms) on separate axes, so
        // neither flattens the other.
        let closed = xname.starts_with("concurrency");
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (1100, 480)).into_drawing_area();
            root.fill(&WHITE).map_err(perr)?;
            let (left, right) = root.split_horizontally(550);
            for (area, title, range) in [
                (&left, "Time to first token (valid runs)", 0..2),
                (&right, "Per-token latency: TPOT and ITL (valid runs)", 2..6),
            ] {
                let panel = &data[range.clone()];
                let ymax = panel
                    .iter()
                    .flat_map(|(_, v)| v.iter().map(|p| p.1))
                    .fold(0.0, f64::max)
                    * 1.15
                    + 1e-3;
                let mut chart = ChartBuilder::on(area)
                    .caption(title, ("sans-serif", 16))
                    .margin(12)
                    .x_label_area_size(45)
                    .y_label_area_size(70)
                    .build_cartesian_2d(0.0..xmax, 0.0..ymax)
                    .map_err(perr)?;
                let xfmt: &dyn Fn(&f64) -> String = if closed {
                    &crate::output::axis::count_tick
                } else {
                    &crate::output::axis::tick
                };
                chart
                    .configure_mesh()
                    .x_desc(xname)
                    .y_desc("milliseconds")
                    .x_label_formatter(xfmt)
                    .y_label_formatter(&crate::output::axis::tick)
                    .draw()
                    .map_err(perr)?;
                for (i, (name, v)) in panel.iter().enumerate() {
                    if v.is_empty() {
                        continue;
                    }
                    let color = COLORS[(i + range.start) % COLORS.len()];
                    crate::output::plot::line_with_points(&mut chart, v, color, name)?;
                }
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperLeft)
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .draw()
                    .map_err(perr)?;
            }
            root.present().map_err(perr)?;
        }
        let p = dir.join(LATENCY_PLOT);
        atomic_write(&p, svg.as_bytes())
            .with_context(|| format!("cannot write {}", p.display()))?;
        written.push(LATENCY_PLOT.to_string());
    }
    let spec: Vec<&RunResult> = res
        .runs
        .iter()
        .filter(|r| r.validity.valid && !r.conditions.spec.per_position.is_empty())
        .collect();
    if !spec.is_empty() {
        let k = spec
            .iter()
            .map(|r| r.conditions.spec.per_position.len())
            .max()
            .unwrap_or(1);
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (860, 500)).into_drawing_area();
            root.fill(&WHITE).map_err(perr)?;
            let mut chart = ChartBuilder::on(&root)
                .caption(
                    "Speculative acceptance by draft position",
                    ("sans-serif", 20),
                )
                .margin(12)
                .x_label_area_size(45)
                .y_label_area_size(65)
                .build_cartesian_2d(0.5..(k as f64 + 0.5), 0.0..1.05)
                .map_err(perr)?;
            chart
                .configure_mesh()
                .x_desc("draft position")
                .y_desc("accepted / drafts")
                .x_labels(k.min(16))
                .draw()
                .map_err(perr)?;
            for (i, r) in spec.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                let v: Vec<(f64, f64)> = r
                    .conditions
                    .spec
                    .per_position
                    .iter()
                    .enumerate()
                    .map(|(j, a)| ((j + 1) as f64, *a))
                    .collect();
                crate::output::plot::line_with_points(&mut chart, &v, color, &r.label)?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(perr)?;
            root.present().map_err(perr)?;
        }
        let p = dir.join(ACCEPTANCE_PLOT);
        atomic_write(&p, svg.as_bytes())
            .with_context(|| format!("cannot write {}", p.display()))?;
        written.push(ACCEPTANCE_PLOT.to_string());
    }
    written.extend(super::render_serving::write_pareto(res, dir)?);
    Ok(written)
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

/// Write `e2e_runs.csv` (one row per run) and `e2e_requests.csv` (one row per request) into
/// `dir`; returns the names written. Throughput columns are empty for invalid runs.
///
/// # Errors
/// Writing failed.
pub fn write_csv(res: &E2eResults, dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "run",
        "valid",
        "mode",
        "concurrency",
        "rate",
        "completed",
        "failed",
        "cancelled",
        "duration_s",
        "output_tok_per_s",
        "requests_per_s",
        "ttft_p50_s",
        "ttft_p99_s",
        "ttfc_p50_s",
        "itl_p50_s",
        "itl_p99_s",
        "tpot_p50_s",
        "tpot_p99_s",
        "e2e_p50_s",
        "e2e_p99_s",
        "cache",
        "cache_verified",
        "prefix_hit_rate",
        "spec_state",
        "spec_method",
        "spec_k",
        "acceptance_rate",
        "mean_acceptance_length",
        "kv_capacity_tokens",
        "peak_kv_usage",
        "preemptions",
        "output_requested",
        "output_mean",
        "thinking_sent",
        "reasoning_requests",
        "engine",
        "engine_version",
        "model",
        "invalid_reasons",
    ])?;
    for r in &res.runs {
        let c = &r.conditions;
        let t = r.presented_throughput();
        let (mode, conc, rate) = match &r.load {
            LoadPoint::Closed { concurrency } => ("closed", concurrency.to_string(), String::new()),
            LoadPoint::Open {
                rate,
                max_concurrency,
                ..
            } => ("open", opt(*max_concurrency), rate.to_string()),
        };
        let p = |x: &Option<Percentiles>, f: fn(&Percentiles) -> f64| opt(x.as_ref().map(f));
        let ok = r.requests.iter().filter(|q| q.ok).count();
        let cancelled = r.requests.iter().filter(|q| q.cancelled).count();
        w.write_record([
            r.label.clone(),
            r.validity.valid.to_string(),
            mode.into(),
            conc,
            rate,
            ok.to_string(),
            (r.requests.len() - ok - cancelled).to_string(),
            cancelled.to_string(),
            opt(t.map(|t| t.duration_s)),
            opt(t.map(|t| t.output_tok_per_s)),
            opt(t.map(|t| t.requests_per_s)),
            p(&r.latency.ttft, |p| p.p50),
            p(&r.latency.ttft, |p| p.p99),
            p(&r.latency.ttfc, |p| p.p50),
            p(&r.latency.itl, |p| p.p50),
            p(&r.latency.itl, |p| p.p99),
            p(&r.latency.tpot, |p| p.p50),
            p(&r.latency.tpot, |p| p.p99),
            p(&r.latency.e2e, |p| p.p50),
            p(&r.latency.e2e, |p| p.p99),
            format!("{:?}", c.cache.temperature).to_lowercase(),
            opt(c.cache.verified),
            opt(c.cache.hit_rate),
            format!("{:?}", c.spec.state).to_lowercase(),
            opt(c.spec.method.as_ref().map(|m| m.value.clone())),
            opt(c.spec.k.as_ref().map(|k| k.value)),
            opt(c.spec.acceptance_rate),
            opt(c.spec.mean_acceptance_length),
            opt(c.kv.capacity_tokens.as_ref().map(|k| k.value)),
            opt(c.kv.peak_usage),
            opt(c.kv.preemptions),
            c.lengths.output_requested.to_string(),
            opt(c.lengths.output_mean),
            opt(c.thinking.sent),
            c.thinking.requests_with_reasoning.to_string(),
            opt(c.engine.as_ref().map(|e| e.value.clone())),
            opt(c.engine_version.as_ref().map(|e| e.value.clone())),
            opt(c.model.as_ref().map(|e| e.value.clone())),
            r.validity
                .reasons
                .iter()
                .chain(r.validity.missing_conditions.iter())
                .cloned()
                .collect::<Vec<_>>()
                .join("; "),
        ])?;
    }
    let runs_csv = w.into_inner().context("csv buffer")?;
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "run",
        "index",
        "ok",
        "cancelled",
        "error",
        "scheduled_s",
        "sent_s",
        "lateness_s",
        "ttft_s",
        "ttfc_s",
        "e2e_s",
        "tpot_s",
        "itl_mean_s",
        "itl_max_s",
        "input_tokens_requested",
        "input_tokens_counted",
        "prompt_tokens",
        "output_tokens_requested",
        "output_tokens",
        "token_source",
        "reasoning_tokens",
        "chunks",
        "finish_reason",
        "flags",
        "first_chunk_s",
        "token_chunks",
        "cached_tokens",
        "retries",
    ])?;
    for r in &res.runs {
        for q in &r.requests {
            w.write_record([
                r.label.clone(),
                q.index.to_string(),
                q.ok.to_string(),
                q.cancelled.to_string(),
                q.error.clone().unwrap_or_default(),
                opt(q.scheduled_s),
                q.sent_s.to_string(),
                opt(q.lateness_s),
                opt(q.ttft_s),
                opt(q.ttfc_s),
                opt(q.e2e_s),
                opt(q.tpot_s),
                opt(q.itl_mean_s),
                opt(q.itl_max_s),
                opt(q.input_tokens_requested),
                opt(q.input_tokens_counted),
                opt(q.prompt_tokens),
                q.output_tokens_requested.to_string(),
                opt(q.output_tokens),
                opt(q.token_source.map(|s| s.label())),
                opt(q.reasoning_tokens),
                q.chunks.to_string(),
                q.finish_reason.clone().unwrap_or_default(),
                q.flags.join("; "),
                opt(q.first_chunk_s),
                q.token_chunks.to_string(),
                opt(q.cached_tokens),
                q.retries.to_string(),
            ])?;
        }
    }
    let req_csv = w.into_inner().context("csv buffer")?;
    atomic_write(&dir.join("e2e_runs.csv"), &runs_csv)?;
    atomic_write(&dir.join("e2e_requests.csv"), &req_csv)?;
    Ok(vec!["e2e_runs.csv".into(), "e2e_requests.csv".into()])
}

/// What gives a condition the engine did not expose, for its Validity line: the flag that
/// states it (marked "stated by the user"), or, where no flag can, what would let rigbench read
/// it. Matched on the condition's name, so results written earlier read the same.
pub fn how_to_state(condition: &str) -> &'static str {
    const HINTS: [(&str, &str); 7] = [
        ("engine version", "; state it with --engine-version"),
        ("KV capacity", "; state it with --kv-capacity, or give the engine's log with --engine-log"),
        ("speculative decoding", "; state it with --spec on|off"),
        ("model id", "; state it with --served-model-name"),
        ("output token counts", "; give the model's tokenizer with --tokenizer"),
        ("engine name", "; no flag states it: rigbench reads it from /version, /v1/models (owned_by), the /metrics name prefix or the engine's log (--engine-log)"),
        ("cache temperature", "; no flag states it: it is verified from the prefix-cache counters on /metrics, which this engine did not give"),
    ];
    HINTS
        .iter()
        .find(|(name, _)| condition.starts_with(name))
        .map_or("", |(_, hint)| hint)
}
