//! rigbench's kernel goals, evaluated on the run's own rows: ratios within one run (same card,
//! same conditions), in graph timing when the run has it (the fair view of peers dispatched from
//! Python), else cold. They are goals for rigbench's kernels against cuBLAS and against the
//! W4A16 kernels engines run (Humming, vLLM's Marlin), not properties of the card. Targets and
//! what each change bought: docs/w4a16-notes.md.
//!
//! - Decode-step composite ([`super::composite`]): rigbench's W4A16 no slower than Humming's at
//!   every M up to 1,024 and no slower than vLLM's Marlin (a peer's refused shapes count at
//!   rigbench's BF16, as the composite does); W4A16 at M = 64 ≥ 1.6× BF16; W4A16 at M = 1 ≥ 65%
//!   of its NVFP4 byte floor; W4A16 at M = 16 ≤ 1.15× its time at M = 1.
//! - Fits ([`super::fit`], W4A16 per M over the suite's shapes): at every M ≤ 16, T0 ≤ 6 µs and
//!   BW ≥ 3.8 TB/s; at M = 64, T0 ≤ 8 µs and BW ≥ 3 TB/s.
//! - FP8 as engines run it (`fp8-rowwise`): the per-token activation quantization ≤ 3 µs per GEMM
//!   at every shape and M ≤ 64, and its composite including the quantization within 10% of its
//!   GEMM-only composite at M ≤ 16.
//! - Every rigbench case passes its correctness check; every determinism check is bit-exact.
//!
//! A goal whose rows are missing (a peer that did not run, a timing not asked for) is "not
//! measured", with the reason, never met.

use super::composite::{Composite, CompositeRow, StepTiming};
use super::fit::fit_of;
use super::schema::KernelResults;
use crate::output::table::markdown_table;

/// Outcome of one goal.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Every case meets it.
    Met,
    /// At least one case misses it.
    NotMet,
    /// Nothing to evaluate, and why.
    NotMeasured(String),
}

impl Verdict {
    /// Text for the table.
    pub fn text(&self) -> String {
        match self {
            Self::Met => "met".into(),
            Self::NotMet => "NOT met".into(),
            Self::NotMeasured(why) => format!("not measured: {why}"),
        }
    }
}

/// One evaluated goal.
#[derive(Debug, Clone, PartialEq)]
pub struct Goal {
    /// What it asks.
    pub goal: String,
    /// The bound.
    pub need: String,
    /// What was measured (the worst case, and how many cases meet it).
    pub measured: String,
    /// The verdict.
    pub verdict: Verdict,
}

/// Evaluate `(label, value)` pairs against a lower bound `need` (`higher = true`) or an upper
/// bound; the worst case and the count meeting it go in `measured`.
fn judge(goal: String, need: f64, higher: bool, unit: &str, vals: Vec<(String, f64)>) -> Goal {
    let need_text = format!("{} {need}{unit}", if higher { "≥" } else { "≤" });
    if vals.is_empty() {
        return Goal {
            goal,
            need: need_text,
            measured: "—".into(),
            verdict: Verdict::NotMeasured("no case".into()),
        };
    }
    let ok = |v: f64| if higher { v >= need } else { v <= need };
    let worst = vals
        .iter()
        .min_by(|a, b| {
            if higher {
                a.1.total_cmp(&b.1)
            } else {
                b.1.total_cmp(&a.1)
            }
        })
        .cloned()
        .unwrap_or_default();
    let met = vals.iter().filter(|v| ok(v.1)).count();
    Goal {
        goal,
        need: need_text,
        measured: if vals.len() == 1 {
            format!("{:.2}{unit}", worst.1)
        } else {
            format!(
                "worst {:.2}{unit} ({}); {met}/{} meet it",
                worst.1,
                worst.0,
                vals.len()
            )
        },
        verdict: if met == vals.len() {
            Verdict::Met
        } else {
            Verdict::NotMet
        },
    }
}

/// `judge`, or "not measured: `why`" when there is nothing to judge.
fn judge_or(
    goal: String,
    need: f64,
    higher: bool,
    unit: &str,
    vals: Vec<(String, f64)>,
    why: impl FnOnce() -> String,
) -> Goal {
    let mut g = judge(goal, need, higher, unit, vals);
    if let Verdict::NotMeasured(w) = &mut g.verdict {
        *w = why();
    }
    g
}

fn row<'a>(c: &'a Composite, col: &str, m: usize, t: StepTiming) -> Option<&'a CompositeRow> {
    c.rows
        .iter()
        .find(|r| r.column() == col && r.m == m && r.timing == t)
}

/// Composite column of a peer provider's W4A16 NVFP4 implementation.
fn peer_col(provider: &str) -> Option<&'static str> {
    match provider {
        "humming" => Some("humming:humming.nvfp4"),
        "vllm-marlin" => Some("vllm-marlin:marlin.nvfp4"),
        _ => None,
    }
}

/// Why a peer has no composite rows: it did not run (its status), or every M has a gap.
fn peer_missing(k: &KernelResults, composite: Option<&Composite>, provider: &str) -> String {
    if let Some(p) = k.peers.iter().find(|p| p.provider == provider) {
        if !p.available {
            let first = p.detail.split("; ").next().unwrap_or(&p.detail);
            return format!("{provider} did not run ({first})");
        }
    } else {
        return format!("{provider} was not run (no peer status in these results: run with --peers on after scripts/fetch-peers.sh)");
    }
    if composite.is_none() {
        return "no decode-step composite (the suite gives no per_step counts)".into();
    }
    let col = peer_col(provider).unwrap_or(provider);
    match k.skipped.iter().find(|s| s.provider == provider) {
        Some(s) => format!(
            "{col} has no composite row (e.g. {} M = {}: {})",
            s.shape,
            s.m.map(|m| m.to_string()).unwrap_or_else(|| "all".into()),
            s.reason.split("; ").next().unwrap_or(&s.reason)
        ),
        None => format!("{col} has no composite row in this timing (see the composite's gaps)"),
    }
}

/// The timing the goals read: graph when the composite (or, without one, any case) has it.
fn goal_timing(k: &KernelResults, composite: Option<&Composite>) -> StepTiming {
    let graph = match composite {
        Some(c) => c.rows.iter().any(|r| r.timing == StepTiming::Graph),
        None => k.cases.iter().any(|c| c.graph_timings().is_some()),
    };
    if graph {
        StepTiming::Graph
    } else {
        StepTiming::Cold
    }
}

/// Evaluate every goal on `k` (with its composite, if any).
pub fn evaluate(k: &KernelResults, composite: Option<&Composite>) -> Vec<Goal> {
    let mut out = Vec::new();
    let t = goal_timing(k, composite);
    peer_goals(&mut out, k, composite, t);
    composite_goals(&mut out, composite, t);
    fit_goals(&mut out, k, t);
    fp8_goals(&mut out, k, composite, t);
    correctness_goals(&mut out, k);
    out
}

/// The goals against the engines' kernels (Humming, vLLM's Marlin), every M ≤ 1024.
fn peer_goals(
    out: &mut Vec<Goal>,
    k: &KernelResults,
    composite: Option<&Composite>,
    t: StepTiming,
) {
    let tname = t.id();
    // Against the engines' kernels.
    for provider in ["humming", "vllm-marlin"] {
        let col = peer_col(provider).unwrap_or(provider);
        let vals: Vec<(String, f64)> = match composite {
            Some(c) => c
                .rows
                .iter()
                .filter(|r| r.column() == col && r.timing == t && r.m <= 1024)
                .filter_map(|p| {
                    let w = row(c, "w4a16", p.m, t)?;
                    (w.median_s > 0.0).then(|| (format!("M = {}", p.m), p.median_s / w.median_s))
                })
                .collect(),
            None => vec![],
        };
        let label = if provider == "humming" {
            "Humming"
        } else {
            "vLLM's Marlin"
        };
        // M values where rigbench's W4A16 has a row and the peer none: not judged there.
        let missing: Vec<String> = composite
            .map(|c| {
                c.rows
                    .iter()
                    .filter(|r| r.column() == "w4a16" && r.timing == t && r.m <= 1024)
                    .filter(|r| row(c, col, r.m, t).is_none())
                    .map(|r| r.m.to_string())
                    .collect()
            })
            .unwrap_or_default();
        // And M values where the peer has a row and rigbench's W4A16 none (a failed or skipped
        // w4a16 case): not judged there either, so never "met".
        let own_missing: Vec<String> = composite
            .map(|c| {
                c.rows
                    .iter()
                    .filter(|r| r.column() == col && r.timing == t && r.m <= 1024)
                    .filter(|r| row(c, "w4a16", r.m, t).is_none())
                    .map(|r| r.m.to_string())
                    .collect()
            })
            .unwrap_or_default();
        let partial = !vals.is_empty() && (!missing.is_empty() || !own_missing.is_empty());
        let mut g = judge_or(
            format!("decode-step composite, every M ≤ 1024 ({tname} timing): w4a16 no slower than {label} ({col}; time {provider} ÷ w4a16)"),
            1.0,
            true,
            "×",
            vals,
            || peer_missing(k, composite, provider),
        );
        if partial {
            let mut gaps = Vec::new();
            if !missing.is_empty() {
                gaps.push(format!("no {provider} row at M = {}", missing.join(", ")));
            }
            if !own_missing.is_empty() {
                gaps.push(format!("no w4a16 row at M = {}", own_missing.join(", ")));
            }
            g.measured.push_str(&format!("; {}", gaps.join("; ")));
            if g.verdict == Verdict::Met {
                g.verdict = Verdict::NotMeasured(format!("{col}: {}", gaps.join("; ")));
            }
        }
        out.push(g);
    }
}

/// The decode-step composite goals of w4a16: against bf16 at M = 64, its byte floor at M = 1, flatness to M = 16.
fn composite_goals(out: &mut Vec<Goal>, composite: Option<&Composite>, t: StepTiming) {
    let tname = t.id();
    let w4_missing = |m: usize| {
        format!("w4a16 or its baseline has no {tname}-timed composite row at M = {m} (see the composite's gaps)")
    };
    let ratio = |m: usize, base: &str| -> Vec<(String, f64)> {
        composite
            .and_then(|c| {
                let w = row(c, "w4a16", m, t)?;
                let b = row(c, base, m, t)?;
                (w.median_s > 0.0).then(|| vec![(format!("M = {m}"), b.median_s / w.median_s)])
            })
            .unwrap_or_default()
    };
    out.push(judge_or(
        format!("decode-step composite, M = 64 ({tname} timing): w4a16 faster than bf16"),
        1.6,
        true,
        "×",
        ratio(64, "bf16"),
        || {
            if composite.is_none() {
                no_comp()
            } else {
                w4_missing(64)
            }
        },
    ));
    let floor: Vec<(String, f64)> = composite
        .and_then(|c| row(c, "w4a16", 1, t))
        .and_then(|r| r.pct_of_floor)
        .map(|p| vec![("M = 1".to_string(), p)])
        .unwrap_or_default();
    out.push(judge_or(
        format!("decode-step composite, M = 1 ({tname} timing): w4a16 share of its NVFP4 byte floor (bytes ÷ copy rate ÷ time)"),
        65.0,
        true,
        "%",
        floor,
        || if composite.is_none() { no_comp() } else { "no w4a16 composite row at M = 1, or no copy rate".into() },
    ));
    let flat: Vec<(String, f64)> = composite
        .and_then(|c| {
            let a = row(c, "w4a16", 1, t)?;
            let b = row(c, "w4a16", 16, t)?;
            (a.median_s > 0.0)
                .then(|| vec![("M = 16 ÷ M = 1".to_string(), b.median_s / a.median_s)])
        })
        .unwrap_or_default();
    out.push(judge_or(
        format!("decode-step composite ({tname} timing): w4a16 time at M = 16 ÷ its time at M = 1"),
        1.15,
        false,
        "×",
        flat,
        || {
            if composite.is_none() {
                no_comp()
            } else {
                "w4a16 lacks a composite row at M = 1 or 16".into()
            }
        },
    ));
}

/// The goals on w4a16's fitted fixed cost and streaming rate, at M ≤ 16 and at M = 64.
fn fit_goals(out: &mut Vec<Goal>, k: &KernelResults, t: StepTiming) {
    let tname = t.id();
    // Fits.
    let mut ms: Vec<usize> = k
        .cases
        .iter()
        .filter(|c| c.provider == "rigbench" && c.implementation == "w4a16")
        .map(|c| c.m)
        .collect();
    ms.sort_unstable();
    ms.dedup();
    for (label, sel, t0_max, bw_min) in [
        (
            "every M ≤ 16",
            ms.iter().copied().filter(|m| *m <= 16).collect::<Vec<_>>(),
            6.0,
            3.8,
        ),
        (
            "M = 64",
            ms.iter().copied().filter(|m| *m == 64).collect::<Vec<_>>(),
            8.0,
            3.0,
        ),
    ] {
        let fits: Vec<(usize, super::fit::Fit)> = sel
            .iter()
            .filter_map(|m| Some((*m, fit_of(k, "w4a16", *m, t)?)))
            .collect();
        let why = || {
            if sel.is_empty() {
                format!("no w4a16 case at {label}")
            } else {
                format!("w4a16 has fewer than two shapes with a {tname} timing there")
            }
        };
        // An M of the selection without a fit is not judged: the goal is then not met by the
        // others alone.
        let unfitted: Vec<String> = sel
            .iter()
            .filter(|m| !fits.iter().any(|(fm, _)| fm == *m))
            .map(|m| m.to_string())
            .collect();
        let partial = |mut g: Goal| {
            if !fits.is_empty() && !unfitted.is_empty() {
                g.measured
                    .push_str(&format!("; no fit at M = {}", unfitted.join(", ")));
                if g.verdict == Verdict::Met {
                    g.verdict = Verdict::NotMeasured(format!(
                        "no {tname}-timed fit at M = {} (fewer than two shapes)",
                        unfitted.join(", ")
                    ));
                }
            }
            g
        };
        out.push(partial(judge_or(
            format!("w4a16 fitted fixed cost T0, {label} ({tname} timing)"),
            t0_max,
            false,
            " µs",
            fits.iter()
                .map(|(m, f)| (format!("M = {m}"), f.t0_s * 1e6))
                .collect(),
            why,
        )));
        out.push(partial(judge_or(
            format!("w4a16 fitted streaming rate BW, {label} ({tname} timing)"),
            bw_min,
            true,
            " TB/s",
            fits.iter()
                .map(|(m, f)| (format!("M = {m}"), f.bytes_per_s.unwrap_or(0.0) / 1e12))
                .collect(),
            why,
        )));
    }
}

/// The goals on FP8 as engines run it: the activation quantization's time and its share of the composite.
fn fp8_goals(out: &mut Vec<Goal>, k: &KernelResults, composite: Option<&Composite>, t: StepTiming) {
    let tname = t.id();
    // FP8 as engines run it.
    let rw = super::impls::fp8_rowwise::ID;
    let quant: Vec<(String, f64)> = k
        .cases
        .iter()
        .filter(|c| c.provider == "rigbench" && c.implementation == rw && c.m <= 64)
        .filter_map(|c| {
            let extra = match t {
                StepTiming::Graph => c.graph_timings()?.1,
                StepTiming::Cold => &c.extra,
            };
            let q = super::schema::KernelCase::act_quant(extra)?;
            Some((format!("{} M = {}", c.shape, c.m), q.median_s * 1e6))
        })
        .collect();
    // A shape and M ≤ 64 where fp8-rowwise was skipped (failed its check, or did not run) is not
    // judged: the goal is then not met by the others alone.
    let rw_skipped: Vec<String> = k
        .skipped
        .iter()
        .filter(|s| s.provider == "rigbench" && s.implementation == rw)
        .filter(|s| s.m.is_none_or(|m| m <= 64))
        .map(|s| {
            format!(
                "{} M = {}",
                s.shape,
                s.m.map_or_else(|| "all".to_string(), |m| m.to_string())
            )
        })
        .collect();
    let mut g = judge_or(
        format!("{rw}: per-token FP8 activation quantization per GEMM, every shape, M ≤ 64 ({tname} timing)"),
        3.0,
        false,
        " µs",
        quant,
        || format!("no {rw} case with a timed activation quantization at M ≤ 64 (FP8 not run, or kernels/fp8_quant.cu did not build: see the notes)"),
    );
    if !rw_skipped.is_empty() && g.verdict == Verdict::Met {
        g.measured
            .push_str(&format!("; skipped: {}", rw_skipped.join(", ")));
        g.verdict = Verdict::NotMeasured(format!("{rw} was skipped at {}", rw_skipped.join(", ")));
    }
    out.push(g);
    let share: Vec<(String, f64)> = composite
        .map(|c| {
            c.rows
                .iter()
                .filter(|r| r.column() == rw && r.timing == t && r.m <= 16 && r.act_quant_s > 0.0)
                .filter(|r| r.median_s > r.act_quant_s)
                .map(|r| {
                    (
                        format!("M = {}", r.m),
                        r.median_s / (r.median_s - r.act_quant_s),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    out.push(judge_or(
        format!("{rw} decode-step composite with its activation quantization ÷ GEMM only, M ≤ 16 ({tname} timing)"),
        1.10,
        false,
        "×",
        share,
        || if composite.is_none() { no_comp() } else { format!("no {rw} composite row with its quantization at M ≤ 16") },
    ));
}

/// The goals on the correctness and determinism checks of rigbench's own cases.
fn correctness_goals(out: &mut Vec<Goal>, k: &KernelResults) {
    // Correctness and determinism of rigbench's own cases.
    let failed = k
        .skipped
        .iter()
        .filter(|s| s.provider == "rigbench" && s.reason.contains("correctness check"))
        .count();
    let own: Vec<_> = k
        .cases
        .iter()
        .filter(|c| c.provider == "rigbench")
        .collect();
    // A graph timing whose output failed the check (discarded, the case kept with its cold
    // timing) is a failed check too.
    let graph_failed = |c: &super::schema::KernelCase| {
        c.graph_skip
            .as_deref()
            .is_some_and(|g| g.contains("correctness check"))
    };
    let failed = failed + own.iter().filter(|c| graph_failed(c)).count();
    let passed = own
        .iter()
        .filter(|c| c.check.as_ref().is_some_and(|x| x.passed) && !graph_failed(c))
        .count();
    out.push(Goal {
        goal: "every rigbench case passes its correctness check".into(),
        need: "all".into(),
        measured: format!("{passed} passed, {failed} failed"),
        verdict: if passed + failed == 0 {
            Verdict::NotMeasured("no rigbench case".into())
        } else if failed == 0 {
            Verdict::Met
        } else {
            Verdict::NotMet
        },
    });
    let det: Vec<_> = k
        .determinism
        .iter()
        .filter(|d| d.provider == "rigbench")
        .collect();
    let exact = det.iter().filter(|d| d.bit_exact).count();
    out.push(Goal {
        goal: "every determinism check of rigbench's cases is bit-exact".into(),
        need: "all".into(),
        measured: format!("{exact}/{} bit-exact", det.len()),
        verdict: if det.is_empty() {
            Verdict::NotMeasured("run with --check-determinism".into())
        } else if exact == det.len() {
            Verdict::Met
        } else {
            Verdict::NotMet
        },
    });
}

/// Why a composite goal is not measured when there is no composite.
fn no_comp() -> String {
    "no decode-step composite: the suite gives no per_step counts, or no implementation covered every shape".to_string()
}

/// The goals table for the report (empty when no w4a16 case was timed).
pub fn markdown(k: &KernelResults, composite: Option<&Composite>) -> String {
    if !k
        .cases
        .iter()
        .any(|c| c.provider == "rigbench" && c.implementation == "w4a16")
    {
        return String::new();
    }
    let goals = evaluate(k, composite);
    let mut o = String::from("### rigbench's kernel goals\n\nGoals for rigbench's own kernels (targets and what each change bought: docs/w4a16-notes.md), evaluated on this run's rows: every ratio is between two implementations measured in this run (same card, same conditions), in graph timing when the run has it. They describe rigbench's kernels against cuBLAS and against the W4A16 kernels engines run (Humming, vLLM's Marlin), not a property of the card. A goal whose rows are missing is not measured, never met.");
    if let Some(c) = composite {
        if !c.step.complete {
            o.push_str(&format!(
                " The composite here covers only part of a decode step ({}), so its goals are indicative.",
                c.step.description
            ));
        }
    }
    o.push_str("\n\n");
    let rows: Vec<Vec<String>> = goals
        .iter()
        .map(|g| {
            vec![
                g.goal.clone(),
                g.need.clone(),
                g.measured.clone(),
                g.verdict.text(),
            ]
        })
        .collect();
    o.push_str(&markdown_table(
        &["goal", "need", "measured", "verdict"],
        &rows,
    ));
    o.push('\n');
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judge_bounds_both_ways() {
        let g = judge(
            "g".into(),
            2.0,
            true,
            "×",
            vec![("a".into(), 3.0), ("b".into(), 1.5)],
        );
        assert_eq!(g.verdict, Verdict::NotMet);
        assert!(g.measured.contains("worst 1.50× (b)") && g.measured.contains("1/2"));
        let g = judge("g".into(), 1.0, false, "", vec![("a".into(), 0.9)]);
        assert_eq!(g.verdict, Verdict::Met);
        assert_eq!(g.measured, "0.90");
        let g = judge("g".into(), 1.0, false, "", vec![]);
        assert!(matches!(g.verdict, Verdict::NotMeasured(_)));
    }

    #[test]
    fn without_a_composite_the_goals_say_why() {
        let mut k = crate::kernels::composite::tests::h200_run();
        k.suite.decode_step = None;
        let g = evaluate(&k, None);
        let humming = &g[0];
        match &humming.verdict {
            Verdict::NotMeasured(why) => assert!(why.contains("humming"), "{why}"),
            v => panic!("{v:?}"),
        }
        assert!(humming.verdict.text().starts_with("not measured: "));
        let m64 = g.iter().find(|x| x.goal.contains("M = 64 (")).unwrap();
        match &m64.verdict {
            Verdict::NotMeasured(why) => assert!(why.contains("per_step"), "{why}"),
            v => panic!("{v:?}"),
        }
        // The fits still evaluate from the rows (cold timing: this run had no graph timing).
        let t0 = g
            .iter()
            .find(|x| x.goal.contains("T0, every M ≤ 16 (cold timing)"))
            .unwrap();
        assert_eq!(t0.verdict, Verdict::NotMet, "{t0:?}");
    }
}
