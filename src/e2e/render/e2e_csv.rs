//! The e2e CSV files: `e2e_runs.csv` (one row per run) and `e2e_requests.csv` (one row per
//! request).

use std::path::Path;

use anyhow::Context;

use crate::e2e::executor::LoadPoint;
use crate::e2e::metrics::Percentiles;
use crate::e2e::E2eResults;
use crate::output::write::atomic_write;

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

/// Write `e2e_runs.csv` (one row per run) and `e2e_requests.csv` (one row per request) into
/// `dir`; returns the names written. Throughput columns are empty for invalid runs.
///
/// # Errors
/// Writing failed.
pub fn write_csv(res: &E2eResults, dir: &Path) -> anyhow::Result<Vec<String>> {
    let runs_csv = runs_csv(res)?;
    let req_csv = requests_csv(res)?;
    atomic_write(&dir.join("e2e_runs.csv"), &runs_csv)?;
    atomic_write(&dir.join("e2e_requests.csv"), &req_csv)?;
    Ok(vec!["e2e_runs.csv".into(), "e2e_requests.csv".into()])
}

/// `e2e_runs.csv`: one row per run (load, counts, throughput of a valid run, latency
/// percentiles, conditions, why it is invalid).
fn runs_csv(res: &E2eResults) -> anyhow::Result<Vec<u8>> {
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
    w.into_inner().context("csv buffer")
}

/// `e2e_requests.csv`: one row per request of every run.
fn requests_csv(res: &E2eResults) -> anyhow::Result<Vec<u8>> {
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
    w.into_inner().context("csv buffer")
}
