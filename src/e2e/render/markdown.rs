//! The e2e section as Markdown ([`render_markdown`]): the preamble (engine, suite, failure,
//! determinism, output sample, quality), then, after the conditions, validity (with
//! [`how_to_state`] for an unknown condition), latency, throughput (with the
//! [`random_weights_note`]), metrics sampling, speculative acceptance, the serving part, plots
//! and the boot log.

use std::fmt::Write as _;

use super::cells::{min_n_for, ms, pct, pctl, same_figures};
use super::condition_tables::{render_conditions, render_run_conditions, suite_as_run};
use super::plots::plot_names;
use crate::e2e::bootlog::BootLog;
use crate::e2e::driver::RunResult;
use crate::e2e::executor::ExecStop;
use crate::e2e::E2eResults;
use crate::output::table::{grouped, markdown_table, thousands};

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
    o.push_str(&crate::e2e::render_serving::render(res));
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
            crate::e2e::driver::OUTPUT_SAMPLE_CHARS
        );
        for s in &r.output_samples {
            let _ = writeln!(o, "- `{}`", s.replace('`', "'").replace('\n', "⏎"));
        }
    }
    if let Some(q) = &res.quality {
        let _ = writeln!(o, "\n{}", crate::e2e::quality::render_markdown(q));
    }
    for s in &res.skipped {
        let _ = writeln!(o, "- skipped {s}");
    }
    for n in &res.notes {
        let _ = writeln!(o, "- note: {n}");
    }
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
                    crate::e2e::validity::hint_with_log(how_to_state(m), log_given)
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
