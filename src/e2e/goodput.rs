//! SLO goodput: the share of requests that meet latency targets, with a Wilson score interval,
//! and the search for the highest load whose attainment stays at or above a target
//! (docs/goodput.md).
//!
//! - An SLO (`--slo ttft=2s,tpot=50ms,e2e=10s`) sets targets on TTFT, TPOT and E2E latency, in
//!   the definitions of [`super::metrics`]. A request meets a target when its metric is at or
//!   under it; it meets the SLO when it meets every target set. A request that failed (error,
//!   timeout, no `[DONE]`) meets none. A request whose TPOT is not observable (one output token,
//!   or every token in one chunk) is not judged on TPOT, as vLLM's `benchmark_serving` goodput
//!   counts a TPOT of 0 for one-token outputs. Requests cancelled by the client (Ctrl-C) are not
//!   judged; closed-loop opening-wave requests are left out as in the latency statistics.
//! - Attainment p̂ = meeting / judged, with the Wilson score interval (Wilson 1927; E. B. Wilson,
//!   "Probable inference, the law of succession, and statistical inference", JASA 22:209):
//!   centre (p̂ + z²/2n) / (1 + z²/n), half-width z / (1 + z²/n) · √(p̂(1−p̂)/n + z²/4n²), with z
//!   the normal quantile 1 − α/2 (statrs).
//! - The search ([`next_probe`]) doubles the load (open-loop rate or closed-loop concurrency)
//!   while probes pass, then bisects between the highest pass and the lowest fail. A probe
//!   passes when its whole interval is at or above the target, fails when its whole interval is
//!   below it, and is undecided otherwise: then the load is at the target within the interval's
//!   resolution and the search stops there. It also stops when the bracket is narrower than the
//!   tolerance, or when the probe budget is spent.

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, Normal};

use super::metrics::RequestRecord;
use crate::RigError;

/// Latency targets (seconds); a target left out is not judged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    /// TTFT target, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_s: Option<f64>,
    /// TPOT target, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpot_s: Option<f64>,
    /// E2E latency target, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e2e_s: Option<f64>,
}

/// Parse a duration such as `2s`, `50ms`, `1.5s`, `800us` or `1m` into seconds.
///
/// # Errors
/// A message naming the text and the units taken.
pub fn parse_duration(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{text}' is not a duration (write e.g. 2s, 50ms, 800us, 1m)"))?;
    let scale = match unit.trim() {
        "s" | "" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "m" | "min" => 60.0,
        u => {
            return Err(format!(
                "'{text}': unknown unit '{u}' (take s, ms, us or m)"
            ))
        }
    };
    let s = v * scale;
    if !(s.is_finite() && s > 0.0) {
        return Err(format!("'{text}' must be a positive duration"));
    }
    Ok(s)
}

impl Slo {
    /// Parse `ttft=2s,tpot=50ms,e2e=10s` (any subset, at least one).
    ///
    /// # Errors
    /// [`RigError::BadFlag`] naming `--slo`, the bad part and the form taken.
    pub fn parse(text: &str) -> Result<Self, RigError> {
        let mut slo = Slo::default();
        let bad = |m: String| RigError::flag("--slo", m);
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| {
                bad(format!(
                    "'{part}' is not metric=duration (e.g. ttft=2s,tpot=50ms,e2e=10s)"
                ))
            })?;
            let d = parse_duration(v).map_err(bad)?;
            let slot = match k.trim().to_ascii_lowercase().as_str() {
                "ttft" => &mut slo.ttft_s,
                "tpot" => &mut slo.tpot_s,
                "e2e" | "e2el" => &mut slo.e2e_s,
                other => {
                    return Err(bad(format!(
                        "unknown metric '{other}' (take ttft, tpot and e2e)"
                    )))
                }
            };
            if slot.replace(d).is_some() {
                return Err(bad(format!("'{k}' is given twice")));
            }
        }
        if slo.targets().is_empty() {
            return Err(bad(
                "no target given (e.g. ttft=2s,tpot=50ms,e2e=10s)".into()
            ));
        }
        Ok(slo)
    }

    /// The targets set, as `(metric, seconds)`.
    pub fn targets(&self) -> Vec<(&'static str, f64)> {
        [
            ("ttft", self.ttft_s),
            ("tpot", self.tpot_s),
            ("e2e", self.e2e_s),
        ]
        .into_iter()
        .filter_map(|(n, v)| v.map(|v| (n, v)))
        .collect()
    }

    /// Short text: `TTFT ≤ 2000 ms, TPOT ≤ 50 ms`.
    pub fn describe(&self) -> String {
        self.targets()
            .iter()
            .map(|(n, v)| format!("{} ≤ {} ms", n.to_ascii_uppercase(), fmt_ms(*v)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Whether `r` meets target `metric` (`None`: not judged on it).
    fn meets(metric: &str, target: f64, r: &RequestRecord) -> Option<bool> {
        if !r.ok {
            return Some(false);
        }
        match metric {
            "ttft" => Some(r.ttft_s.is_some_and(|v| v <= target)),
            "tpot" => r.tpot_s.map(|v| v <= target),
            _ => Some(r.e2e_s.is_some_and(|v| v <= target)),
        }
    }
}

fn fmt_ms(s: f64) -> String {
    let ms = s * 1e3;
    if (ms - ms.round()).abs() < 1e-9 {
        format!("{}", ms.round())
    } else {
        format!("{ms:.3}")
    }
}

/// The Wilson score interval of `k` successes in `n` trials at two-sided `confidence`
/// (e.g. 0.95): `(low, high)`; `(0, 1)` when `n` is 0. Formula in the module docs.
pub fn wilson(k: usize, n: usize, confidence: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let z = Normal::new(0.0, 1.0)
        .map(|d| d.inverse_cdf(1.0 - (1.0 - confidence.clamp(1e-9, 1.0 - 1e-9)) / 2.0))
        .unwrap_or(1.959_963_984_540_054);
    let n_f = n as f64;
    let p = k as f64 / n_f;
    let z2 = z * z;
    let denom = 1.0 + z2 / n_f;
    let centre = (p + z2 / (2.0 * n_f)) / denom;
    let half = z / denom * (p * (1.0 - p) / n_f + z2 / (4.0 * n_f * n_f)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// One target's attainment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetAttainment {
    /// `ttft`, `tpot` or `e2e`.
    pub metric: String,
    /// The target, seconds.
    pub target_s: f64,
    /// Requests judged on it.
    pub judged: usize,
    /// Of those, meeting it.
    pub meeting: usize,
    /// meeting / judged.
    pub attainment: f64,
}

/// A sweep point's SLO attainment (`goodput` in results.json).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Goodput {
    /// The targets.
    pub slo: Slo,
    /// Requests judged (sent and not cancelled by the client; closed-loop opening wave left
    /// out).
    pub requests: usize,
    /// Requests meeting every target.
    pub requests_meeting: usize,
    /// requests_meeting / requests.
    pub attainment: f64,
    /// Wilson interval, low end.
    pub wilson_low: f64,
    /// Wilson interval, high end.
    pub wilson_high: f64,
    /// The interval's two-sided confidence.
    pub confidence: f64,
    /// Each target on its own.
    pub per_target: Vec<TargetAttainment>,
    /// Requests meeting the SLO per second of the run (vLLM's "request goodput"), when the
    /// run's duration is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput_req_per_s: Option<f64>,
}

impl Goodput {
    /// Judge `records` against `slo`; `duration_s` (the run's) gives the goodput rate.
    /// `None` when no request can be judged.
    pub fn of(
        slo: &Slo,
        records: &[RequestRecord],
        duration_s: Option<f64>,
        confidence: f64,
    ) -> Option<Self> {
        let steady = records.iter().any(|r| r.ok && !r.opening_wave);
        let judged: Vec<&RequestRecord> = records
            .iter()
            .filter(|r| !r.cancelled && (!r.opening_wave || !steady))
            .collect();
        if judged.is_empty() {
            return None;
        }
        let targets = slo.targets();
        let mut per_target = Vec::new();
        for (m, t) in &targets {
            let verdicts: Vec<bool> = judged.iter().filter_map(|r| Slo::meets(m, *t, r)).collect();
            let meeting = verdicts.iter().filter(|v| **v).count();
            per_target.push(TargetAttainment {
                metric: (*m).to_string(),
                target_s: *t,
                judged: verdicts.len(),
                meeting,
                attainment: if verdicts.is_empty() {
                    1.0
                } else {
                    meeting as f64 / verdicts.len() as f64
                },
            });
        }
        let meeting = judged
            .iter()
            .filter(|r| {
                targets
                    .iter()
                    .all(|(m, t)| Slo::meets(m, *t, r).unwrap_or(true))
            })
            .count();
        let (lo, hi) = wilson(meeting, judged.len(), confidence);
        Some(Self {
            slo: *slo,
            requests: judged.len(),
            requests_meeting: meeting,
            attainment: meeting as f64 / judged.len() as f64,
            wilson_low: lo,
            wilson_high: hi,
            confidence,
            per_target,
            goodput_req_per_s: duration_s.filter(|d| *d > 0.0).map(|d| meeting as f64 / d),
        })
    }

    /// The probe's verdict against `target`.
    pub fn verdict(&self, target: f64) -> Verdict {
        if self.wilson_low >= target {
            Verdict::Pass
        } else if self.wilson_high < target {
            Verdict::Fail
        } else {
            Verdict::Undecided
        }
    }
}

/// What a probe's Wilson interval says about the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The whole interval is at or above the target.
    Pass,
    /// The whole interval is below the target.
    Fail,
    /// The interval contains the target.
    Undecided,
}

/// What the search varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchAxis {
    /// Open-loop arrival rate, requests/s.
    Rate,
    /// Closed-loop concurrency (integers).
    Concurrency,
}

/// `--goodput-search` settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SearchSpec {
    /// Rate or concurrency.
    pub axis: SearchAxis,
    /// Attainment the answer must reach (default 0.95).
    pub target: f64,
    /// Confidence of each probe's interval (default 0.95).
    pub confidence: f64,
    /// The first probe's load.
    pub start: f64,
    /// Most probes (default 8).
    pub max_probes: usize,
    /// Bisection stops when (fail − pass) / pass is under this (rate axis; default 0.1).
    pub tolerance: f64,
    /// The largest load probed.
    pub max_load: f64,
}

impl SearchSpec {
    /// Defaults on `axis` from `start`.
    pub fn new(axis: SearchAxis, start: f64) -> Self {
        Self {
            axis,
            target: 0.95,
            confidence: 0.95,
            start,
            max_probes: 8,
            tolerance: 0.1,
            max_load: match axis {
                SearchAxis::Rate => crate::e2e::workload::MAX_RATE,
                SearchAxis::Concurrency => 4096.0,
            },
        }
    }
}

/// One probe of the search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    /// The load probed (requests/s or concurrency).
    pub load: f64,
    /// The sweep point's label (its run is in `runs`).
    pub label: String,
    /// Its attainment, with the Wilson interval.
    pub attainment: f64,
    /// Wilson low.
    pub wilson_low: f64,
    /// Wilson high.
    pub wilson_high: f64,
    /// Requests judged.
    pub requests: usize,
    /// The verdict.
    pub verdict: Verdict,
    /// Output tokens per second per GPU (the Pareto plot's y), when the run is valid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tok_per_s_per_gpu: Option<f64>,
    /// Per-user interactivity: 1 / median TPOT, tokens/s (the Pareto plot's x).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tok_per_s_per_user: Option<f64>,
}

/// The search's record (`goodput_search` in results.json).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchResult {
    /// The settings.
    pub spec: SearchSpec,
    /// The SLO.
    pub slo: Slo,
    /// Probes in the order run.
    pub probes: Vec<Probe>,
    /// The highest load found to meet the target (a pass, or an undecided probe that ended the
    /// search); `None` when none did.
    pub answer: Option<f64>,
    /// The lowest load found to fail, when one did.
    pub lowest_fail: Option<f64>,
    /// Why the search ended.
    pub stopped: String,
}

/// The next load to probe after `probes`, or `Err(why the search ends)`.
pub fn next_probe(spec: &SearchSpec, probes: &[Probe]) -> Result<f64, String> {
    if probes.is_empty() {
        return Ok(spec.start);
    }
    if let Some(u) = probes.iter().find(|p| p.verdict == Verdict::Undecided) {
        return Err(format!(
            "at {} the attainment {:.3} has a Wilson interval [{:.3}, {:.3}] that contains the target {}: the load is at the target within the interval",
            u.load, u.attainment, u.wilson_low, u.wilson_high, spec.target
        ));
    }
    if probes.len() >= spec.max_probes {
        return Err(format!("the probe budget ({}) is spent", spec.max_probes));
    }
    let pass = probes
        .iter()
        .filter(|p| p.verdict == Verdict::Pass)
        .map(|p| p.load)
        .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.max(v))));
    let fail = probes
        .iter()
        .filter(|p| p.verdict == Verdict::Fail)
        .map(|p| p.load)
        .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.min(v))));
    let int = spec.axis == SearchAxis::Concurrency;
    match (pass, fail) {
        (Some(p), None) => {
            let next = if int { (p * 2.0).round() } else { p * 2.0 };
            if next > spec.max_load {
                Err(format!("the largest load ({}) passes", spec.max_load))
            } else {
                Ok(next)
            }
        }
        (None, Some(f)) => {
            let next = if int { (f / 2.0).floor() } else { f / 2.0 };
            if next
                < if int {
                    1.0
                } else {
                    crate::e2e::workload::MIN_RATE
                }
            {
                Err(format!("even the smallest load probed ({f}) fails"))
            } else {
                Ok(next)
            }
        }
        (Some(p), Some(f)) => {
            let narrow = if int {
                f - p <= 1.0
            } else {
                (f - p) / p < spec.tolerance
            };
            if narrow || f <= p {
                Err(format!("the bracket [{p}, {f}] is within the tolerance"))
            } else if int {
                Ok(((p + f) / 2.0).floor())
            } else {
                Ok((p + f) / 2.0)
            }
        }
        (None, None) => Err("no probe decided".into()),
    }
}

/// The answer after the search: the highest load that passed or ended the search undecided,
/// and the lowest that failed.
pub fn answer(probes: &[Probe]) -> (Option<f64>, Option<f64>) {
    let ok = probes
        .iter()
        .filter(|p| p.verdict != Verdict::Fail)
        .map(|p| p.load)
        .fold(None, |a: Option<f64>, v| {
            Some(a.map_or(v, |a: f64| a.max(v)))
        });
    let fail = probes
        .iter()
        .filter(|p| p.verdict == Verdict::Fail)
        .map(|p| p.load)
        .fold(None, |a: Option<f64>, v| {
            Some(a.map_or(v, |a: f64| a.min(v)))
        });
    (ok, fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slo_parses_and_names_the_flag() {
        let s = Slo::parse("ttft=2s,tpot=50ms,e2e=1.5m").unwrap();
        assert_eq!(s.ttft_s, Some(2.0));
        assert!((s.tpot_s.unwrap() - 0.05).abs() < 1e-12);
        assert_eq!(s.e2e_s, Some(90.0));
        for bad in [
            "",
            "ttft",
            "ttft=2x",
            "foo=1s",
            "ttft=1s,ttft=2s",
            "ttft=-1s",
        ] {
            let e = Slo::parse(bad).unwrap_err().to_string();
            assert!(e.contains("--slo"), "{bad}: {e}");
        }
    }

    #[test]
    fn wilson_matches_the_textbook_value() {
        // 81 of 263 at 95 %: (0.2553, 0.3662) (Newcombe 1998, Table I style check by hand:
        // centre 0.3117, half-width 0.0554).
        let (lo, hi) = wilson(81, 263, 0.95);
        assert!(
            (lo - 0.2553).abs() < 5e-4 && (hi - 0.3662).abs() < 5e-4,
            "{lo} {hi}"
        );
        assert_eq!(wilson(0, 0, 0.95), (0.0, 1.0));
        let (lo, hi) = wilson(10, 10, 0.95);
        assert!(hi == 1.0 && lo > 0.69 && lo < 0.73, "{lo}");
    }

    fn rec(ok: bool, ttft: f64, tpot: Option<f64>) -> RequestRecord {
        RequestRecord {
            ok,
            ttft_s: Some(ttft),
            tpot_s: tpot,
            e2e_s: Some(ttft + 1.0),
            ..Default::default()
        }
    }

    #[test]
    fn attainment_counts_each_target_and_all() {
        let slo = Slo::parse("ttft=100ms,tpot=10ms").unwrap();
        let rs = vec![
            rec(true, 0.05, Some(0.005)),
            rec(true, 0.20, Some(0.005)),
            rec(true, 0.05, Some(0.02)),
            rec(true, 0.05, None), // TPOT not observable: judged on TTFT only
            rec(false, 0.05, Some(0.005)),
        ];
        let g = Goodput::of(&slo, &rs, Some(2.0), 0.95).unwrap();
        assert_eq!(g.requests, 5);
        assert_eq!(g.requests_meeting, 2);
        assert_eq!(g.per_target[0].meeting, 3);
        assert_eq!(g.per_target[1].judged, 4);
        assert_eq!(g.per_target[1].meeting, 2);
        assert_eq!(g.goodput_req_per_s, Some(1.0));
        assert!(g.wilson_low < 0.4 && g.wilson_high > 0.4);
    }

    /// A load model: attainment 1 up to `knee`, 0.5 beyond; each probe judged on 200 requests.
    fn run_search(axis: SearchAxis, start: f64, knee: f64) -> (Vec<Probe>, String) {
        let spec = SearchSpec::new(axis, start);
        let mut probes = Vec::new();
        loop {
            match next_probe(&spec, &probes) {
                Ok(load) => {
                    let n = 200;
                    let k = if load <= knee { n } else { n / 2 };
                    let (lo, hi) = wilson(k, n, spec.confidence);
                    let g = Goodput {
                        slo: Slo::default(),
                        requests: n,
                        requests_meeting: k,
                        attainment: k as f64 / n as f64,
                        wilson_low: lo,
                        wilson_high: hi,
                        confidence: 0.95,
                        per_target: vec![],
                        goodput_req_per_s: None,
                    };
                    probes.push(Probe {
                        load,
                        label: String::new(),
                        attainment: g.attainment,
                        wilson_low: lo,
                        wilson_high: hi,
                        requests: n,
                        verdict: g.verdict(spec.target),
                        output_tok_per_s_per_gpu: None,
                        tok_per_s_per_user: None,
                    });
                }
                Err(why) => return (probes, why),
            }
        }
    }

    #[test]
    fn search_doubles_then_bisects_to_the_knee() {
        let (p, why) = run_search(SearchAxis::Concurrency, 1.0, 6.0);
        let loads: Vec<f64> = p.iter().map(|p| p.load).collect();
        assert_eq!(loads, vec![1.0, 2.0, 4.0, 8.0, 6.0, 7.0], "{why}");
        assert_eq!(answer(&p), (Some(6.0), Some(7.0)));
        let (p, _) = run_search(SearchAxis::Rate, 1.0, 5.0);
        let (a, f) = answer(&p);
        assert!(
            a.unwrap() <= 5.0
                && f.unwrap() > 5.0
                && (f.unwrap() - a.unwrap()) / a.unwrap() < 0.1 + 1e-9
                || p.len() == 8
        );
        // Budget: never more than max_probes.
        assert!(p.len() <= 8);
    }
}
