//! The conditions of the e2e section: the suite as run ([`suite_as_run`]), the table of
//! conditions every run shares (engine, requests, cache, lengths, tokens) and the conditions
//! that differ per run.

use std::fmt::Write as _;

use super::cells::{pct, same, src};
use crate::e2e::conditions::{Conditions, SpecState};
use crate::e2e::driver::RunResult;
use crate::e2e::E2eResults;
use crate::output::table::{markdown_table, thousands};

/// The derivation shown after a KV capacity, only when it holds: `(N blocks × B)` when
/// N × B is the capacity shown; otherwise the block facts are said to be separate.
fn kv_derivation(kv: &crate::e2e::conditions::KvCondition, capacity: u64) -> String {
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
fn input_length(l: &crate::e2e::conditions::LengthCondition, chat: bool) -> String {
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
pub fn suite_as_run(s: &crate::e2e::workload::Suite) -> String {
    use crate::e2e::workload::{LoadMode, WorkloadKind};
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
            crate::e2e::client::Api::Chat => "chat",
            crate::e2e::client::Api::Completions => "completions",
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

/// The table of conditions shared by every run.
pub(super) fn render_conditions(o: &mut String, res: &E2eResults, runs: &[RunResult]) {
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
                    crate::e2e::client::Api::Chat => "chat",
                    crate::e2e::client::Api::Completions => "completions",
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
            (crate::e2e::client::Api::Completions, _) => "n/a (completions API)".into(),
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
        .is_some_and(|s| s.workload.api == crate::e2e::client::Api::Chat);
    rows.push(vec![
        "input length".into(),
        input_length(l, chat),
        "tokenizer at preparation; prompt tokens from the engine's usage".into(),
    ]);
    let checks: Vec<&crate::e2e::conditions::PromptCheck> = runs
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
                    100.0 * crate::e2e::conditions::PROMPT_TOLERANCE_REL,
                    crate::e2e::conditions::PROMPT_TOLERANCE_TOKENS
                )
            } else {
                format!(
                    "**{bad} of {checked} prompts disagree** with the engine's count beyond max({:.0}%, {} tokens) after {} overhead tokens (largest difference {max}): those runs are invalid",
                    100.0 * crate::e2e::conditions::PROMPT_TOLERANCE_REL,
                    crate::e2e::conditions::PROMPT_TOLERANCE_TOKENS,
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
    let checks: Vec<&crate::e2e::conditions::TokenCheck> = runs
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
pub(super) fn render_run_conditions(o: &mut String, runs: &[RunResult]) {
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
