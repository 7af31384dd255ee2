//! The end-to-end session's metrics: per sweep point (its id from [`point_id`]) the request
//! counts, token counts, KV figures and the serving timings of a valid run; and the reasons an
//! e2e metric is missing.

use std::collections::BTreeMap;

use super::types::{
    exact_value, segment, serde_name, Direction, Group, Metric, MetricSource, MetricValue, Unit,
};
use crate::e2e::executor::LoadPoint;
use crate::e2e::workload::ArrivalKind;
use crate::e2e::{E2eResults, RunResult};

/// The id segment of a sweep point: `c=<concurrency>` (closed loop) or `rate=<req/s>`, with
/// `-gamma<shape>` for gamma arrivals and `-max_c=<cap>` for a concurrency cap (open loop).
pub fn point_id(p: &LoadPoint) -> String {
    match p {
        LoadPoint::Closed { concurrency } => format!("c={concurrency}"),
        LoadPoint::Open {
            rate,
            arrival,
            burstiness,
            max_concurrency,
            ..
        } => {
            let mut s = format!("rate={rate:.2}");
            if *arrival == ArrivalKind::Gamma {
                s.push_str(&format!("-gamma{burstiness}"));
            }
            if let Some(c) = max_concurrency {
                s.push_str(&format!("-max_c={c}"));
            }
            s
        }
    }
}

/// `e2e/<suite>`, the prefix of every end-to-end metric of `r`.
fn e2e_prefix(r: &E2eResults) -> String {
    format!(
        "e2e/{}",
        segment(r.suite.as_ref().map_or("unknown", |s| s.name.as_str()))
    )
}

/// The conditions under which an end-to-end run's timings are comparable.
fn e2e_conditions(run: &RunResult) -> BTreeMap<String, String> {
    let c = &run.conditions;
    let spec = match (&c.spec.method, &c.spec.k) {
        (Some(m), Some(k)) => format!("{} {} k={}", serde_name(&c.spec.state), m.value, k.value),
        (Some(m), None) => format!("{} {}", serde_name(&c.spec.state), m.value),
        _ => serde_name(&c.spec.state),
    };
    BTreeMap::from([
        (
            "model".to_string(),
            c.model
                .as_ref()
                .map_or_else(|| "unknown".into(), |m| m.value.clone()),
        ),
        (
            "input_tokens".to_string(),
            c.lengths
                .input_requested
                .map_or_else(|| "unknown".into(), |n| n.to_string()),
        ),
        (
            "output_tokens".to_string(),
            c.lengths.output_requested.to_string(),
        ),
        ("cache".to_string(), serde_name(&c.cache.temperature)),
        ("spec".to_string(), spec),
        (
            "thinking".to_string(),
            match c.thinking.sent {
                Some(true) => "on".into(),
                Some(false) => "off".into(),
                None => "unknown".into(),
            },
        ),
    ])
}

impl MetricSource for E2eResults {
    /// Per run, under `e2e/<suite>/<point>` ([`point_id`]):
    ///
    /// | id | kind |
    /// |---|---|
    /// | `determinism` (per suite, `--check-determinism`) | label: `deterministic` > `nondeterministic` |
    /// | `validity` | label: `valid` > `invalid` |
    /// | `requests/completed`, `requests/failed` | values, exact (more completed / fewer failed is better) |
    /// | `output_tokens/requested` | value, Σ `max_tokens` sent, must match |
    /// | `output_tokens/produced` | value, Σ output tokens of completed requests, must match; only when the suite fixes the output length (`ignore_eos`), else it depends on sampling |
    /// | `kv/capacity_tokens` | value, the KV capacity the engine reported, exact (more is better) |
    /// | `kv/preemptions` | value, preemptions during the run, exact (fewer is better) |
    /// | `ttft_s`, `tpot_s`, `itl_mean_s`, `e2e_latency_s` | timing samples, one per completed request outside a closed loop's opening wave (`itl_mean_s`: each request's mean ITL, since per-token ITLs are not stored), valid runs only |
    ///
    /// Throughput (output tok/s, req/s) is not a metric: a run yields one figure, not samples,
    /// so a change cannot be told from noise; and an invalid run's throughput is never
    /// presented ([`RunResult::presented_throughput`]). Timings of an invalid run are left out
    /// too (its `validity` label carries the regression).
    fn metrics(&self, out: &mut Vec<Metric>) {
        let prefix = e2e_prefix(self);
        if let Some(d) = &self.determinism {
            if d.identical + d.differing.len() > 0 {
                out.push(determinism_metric(&prefix, d));
            }
        }
        for run in &self.runs {
            let p = format!("{prefix}/{}", point_id(&run.load));
            out.push(validity_metric(run, &p));
            count_metrics(run, &p, out);
            if !run.validity.valid {
                continue;
            }
            timing_metrics(run, &p, out);
        }
    }

    /// For `e2e/<suite>/<point>/...`: the run's invalidity (its timings are not metrics), the
    /// point's entry in [`E2eResults::skipped`], or what ended the session.
    fn missing_reason(&self, id: &str) -> Option<String> {
        let prefix = format!("{}/", e2e_prefix(self));
        let rest = id.strip_prefix(&prefix)?;
        let point = rest.split('/').next()?;
        if let Some(run) = self.runs.iter().find(|r| point_id(&r.load) == point) {
            if !run.validity.valid {
                let why: Vec<&str> = run
                    .validity
                    .reasons
                    .iter()
                    .chain(run.validity.missing_conditions.iter())
                    .map(String::as_str)
                    .collect();
                return Some(format!(
                    "run {} is invalid ({}); timings of invalid runs are not compared",
                    run.label,
                    why.join("; ")
                ));
            }
            return None;
        }
        if let Some(s) = self.skipped.iter().find(|s| {
            s.split_once(':')
                .is_some_and(|(label, _)| label_point_id(label) == point)
        }) {
            return Some(format!("skipped: {s}"));
        }
        if let Some(f) = &self.failure {
            return Some(format!("the e2e session ended early: {f}"));
        }
        self.interrupted
            .then(|| "the e2e session was interrupted".to_string())
    }
}

/// `<prefix>/determinism`: whether repeated greedy requests gave identical outputs.
fn determinism_metric(prefix: &str, d: &crate::e2e::checks::DeterminismCheck) -> Metric {
    Metric {
        id: format!("{prefix}/determinism"),
        group: Group::E2e,
        unit: Unit::Label,
        direction: Direction::HigherIsBetter,
        value: MetricValue::Label {
            value: if d.deterministic() {
                "deterministic"
            } else {
                "nondeterministic"
            }
            .into(),
            scale: vec!["deterministic".into(), "nondeterministic".into()],
        },
        conditions: BTreeMap::from([
            ("prompts".to_string(), d.prompts.to_string()),
            ("max_tokens".to_string(), d.max_tokens.to_string()),
        ]),
        context: BTreeMap::new(),
    }
}

/// `<p>/validity`: the run's valid/invalid label, with the reasons of an invalid run.
fn validity_metric(run: &RunResult, p: &str) -> Metric {
    let g = Group::E2e;
    let mut v = Metric {
        id: format!("{p}/validity"),
        group: g,
        unit: Unit::Label,
        direction: Direction::HigherIsBetter,
        value: MetricValue::Label {
            value: if run.validity.valid {
                "valid"
            } else {
                "invalid"
            }
            .into(),
            scale: vec!["valid".into(), "invalid".into()],
        },
        conditions: BTreeMap::new(),
        context: BTreeMap::new(),
    };
    if !run.validity.valid {
        v.context.insert(
            "reasons".into(),
            run.validity
                .reasons
                .iter()
                .chain(run.validity.missing_conditions.iter())
                .cloned()
                .collect::<Vec<_>>()
                .join("; "),
        );
    }
    v
}

/// `<p>/requests/*`, `<p>/output_tokens/*` and `<p>/kv/*`: the run's exact counts.
fn count_metrics(run: &RunResult, p: &str, out: &mut Vec<Metric>) {
    let g = Group::E2e;
    let reqs = &run.requests;
    let completed = reqs.iter().filter(|r| r.ok).count();
    let failed = reqs.iter().filter(|r| !r.ok && !r.cancelled).count();
    out.push(exact_value(
        format!("{p}/requests/completed"),
        g,
        Unit::Count,
        Direction::HigherIsBetter,
        completed as f64,
    ));
    out.push(exact_value(
        format!("{p}/requests/failed"),
        g,
        Unit::Count,
        Direction::LowerIsBetter,
        failed as f64,
    ));
    out.push(exact_value(
        format!("{p}/output_tokens/requested"),
        g,
        Unit::Tokens,
        Direction::MustMatch,
        reqs.iter()
            .map(|r| u64::from(r.output_tokens_requested))
            .sum::<u64>() as f64,
    ));
    if run.conditions.lengths.output_fixed {
        let produced: u64 = reqs
            .iter()
            .filter(|r| r.ok)
            .filter_map(|r| r.output_tokens)
            .sum();
        let mut m = exact_value(
            format!("{p}/output_tokens/produced"),
            g,
            Unit::Tokens,
            Direction::MustMatch,
            produced as f64,
        );
        let mut sources: Vec<&str> = run
            .conditions
            .token_sources
            .iter()
            .map(|s| s.label())
            .collect();
        sources.dedup();
        m.context.insert("token_source".into(), sources.join(", "));
        out.push(m);
    }
    let kv = &run.conditions.kv;
    if let Some(cap) = &kv.capacity_tokens {
        let mut m = exact_value(
            format!("{p}/kv/capacity_tokens"),
            g,
            Unit::Tokens,
            Direction::HigherIsBetter,
            cap.value as f64,
        );
        m.context.insert("source".into(), cap.source.clone());
        out.push(m);
    }
    if let Some(n) = kv.preemptions {
        out.push(exact_value(
            format!("{p}/kv/preemptions"),
            g,
            Unit::Count,
            Direction::LowerIsBetter,
            n as f64,
        ));
    }
}

/// `<p>/ttft_s`, `tpot_s`, `itl_mean_s`, `e2e_latency_s`: the timing samples of a valid run's
/// completed requests outside a closed loop's opening wave.
fn timing_metrics(run: &RunResult, p: &str, out: &mut Vec<Metric>) {
    let g = Group::E2e;
    let reqs = &run.requests;
    let conditions = e2e_conditions(run);
    let mut context = BTreeMap::new();
    if let Some(e) = &run.conditions.engine {
        context.insert("engine".to_string(), e.value.clone());
    }
    if let Some(v) = &run.conditions.engine_version {
        context.insert("engine_version".to_string(), v.value.clone());
    }
    // The opening wave of a closed loop is left out, as in the report's statistics.
    let ok: Vec<&crate::e2e::metrics::RequestRecord> =
        reqs.iter().filter(|r| r.ok && !r.opening_wave).collect();
    type Pick = fn(&crate::e2e::metrics::RequestRecord) -> Option<f64>;
    let timings: [(&str, Pick); 4] = [
        ("ttft_s", |r| r.ttft_s),
        ("tpot_s", |r| r.tpot_s),
        ("itl_mean_s", |r| r.itl_mean_s),
        ("e2e_latency_s", |r| r.e2e_s),
    ];
    for (name, pick) in timings {
        let samples: Vec<f64> = ok.iter().filter_map(|r| pick(r)).collect();
        if samples.is_empty() {
            continue;
        }
        out.push(Metric {
            id: format!("{p}/{name}"),
            group: g,
            unit: Unit::Seconds,
            direction: Direction::LowerIsBetter,
            value: MetricValue::Samples {
                samples,
                repeats: Vec::new(),
                between_run: None,
                slots: Vec::new(),
            },
            conditions: conditions.clone(),
            context: context.clone(),
        });
    }
}

/// [`point_id`] from a sweep point's label ([`LoadPoint::label`]: `c=4`, `2.00 req/s`,
/// `2.00 req/s γ2`); the cap of an open loop is not in the label, so such points match only
/// through [`E2eResults::failure`].
pub(super) fn label_point_id(label: &str) -> String {
    let label = label.trim();
    if label.starts_with("c=") {
        return label.to_string();
    }
    let mut words = label.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some(rate), Some("req/s"), gamma) => {
            let mut s = format!("rate={rate}");
            if let Some(g) = gamma.and_then(|g| g.strip_prefix('γ')) {
                s.push_str(&format!("-gamma{g}"));
            }
            s
        }
        _ => segment(label),
    }
}
