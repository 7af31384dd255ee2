//! rigbench's kernel goals (docs/w4a16-notes.md), evaluated on the run's own rows: ratios within
//! one run (same card, same conditions). They are goals for rigbench's W4A16 kernel, not
//! properties of the card.
//!
//! - Decode-step composite ([`super::composite`]), rigbench's rows, primary timing: W4A16 at
//!   M = 1 ≥ 3.3× BF16 and ≥ 1.8× FP8 (FP8 with its activation quantization); M = 16 ≥ 3× BF16;
//!   M = 64 ≥ 2×; M = 128 ≥ 1.3×; every M ≥ 1024 ≥ 0.9× BF16.
//! - Per shape at M ≤ 16: W4A16 time ≤ 1.1 × (T0 + W4A16 bytes / BW), with T0 and BW fitted
//!   ([`super::fit`]) over the same run's BF16 rows at that M: W4A16 streams NVFP4 weights as
//!   efficiently as cuBLAS streams BF16.
//! - Every shape with N ≤ 128 (in_proj_ba, N = 96, in the Qwen suite): W4A16 never slower than
//!   BF16 at any M.
//! - Every W4A16 case passes its correctness check, and every determinism check of W4A16 is
//!   bit-exact.

use super::composite::{Composite, CompositeRow, StepTiming};
use super::fit::fit_of;
use super::schema::KernelResults;
use crate::output::table::markdown_table;

/// Shapes with at most this many output features count as "small N" (the in_proj_ba goal).
pub const SMALL_N: usize = 128;

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
            Self::NotMeasured(why) => format!("not measured ({why})"),
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

/// Say why a composite goal has nothing to evaluate.
fn explain(mut g: Goal, composite: Option<&Composite>) -> Goal {
    if let Verdict::NotMeasured(why) = &mut g.verdict {
        *why = match composite {
            None => "no decode-step composite: the suite gives no per_step counts, or no implementation covered every shape".into(),
            Some(_) => "w4a16 or its baseline has no composite row at that M (see the composite's gaps)".into(),
        };
    }
    g
}

fn row<'a>(c: &'a Composite, imp: &str, m: usize, t: StepTiming) -> Option<&'a CompositeRow> {
    c.rows
        .iter()
        .find(|r| r.provider == "rigbench" && r.implementation == imp && r.m == m && r.timing == t)
}

/// Evaluate every goal on `k` (with its composite, if any).
pub fn evaluate(k: &KernelResults, composite: Option<&Composite>) -> Vec<Goal> {
    let mut out = Vec::new();
    let w4: Vec<_> = k
        .cases
        .iter()
        .filter(|c| c.provider == "rigbench" && c.implementation == "w4a16")
        .collect();
    // Composite goals.
    let comp_goals: [(&str, &str, usize, f64); 5] = [
        ("M = 1", "bf16", 1, 3.3),
        ("M = 1", "fp8", 1, 1.8),
        ("M = 16", "bf16", 16, 3.0),
        ("M = 64", "bf16", 64, 2.0),
        ("M = 128", "bf16", 128, 1.3),
    ];
    let timing = composite.and_then(|c| {
        [StepTiming::Cold, StepTiming::Graph]
            .into_iter()
            .find(|t| c.rows.iter().any(|r| r.timing == *t))
    });
    for (label, base, m, need) in comp_goals {
        let goal = format!(
            "decode-step composite, {label}: w4a16 faster than {base}{}",
            if base == "fp8" {
                " (FP8 with its activation quantization)"
            } else {
                ""
            }
        );
        let vals = match (composite, timing) {
            (Some(c), Some(t)) => match (row(c, "w4a16", m, t), row(c, base, m, t)) {
                (Some(w), Some(b)) if w.median_s > 0.0 => {
                    vec![(format!("M = {m}"), b.median_s / w.median_s)]
                }
                _ => vec![],
            },
            _ => vec![],
        };
        out.push(explain(judge(goal, need, true, "×", vals), composite));
    }
    let big: Vec<(String, f64)> = match (composite, timing) {
        (Some(c), Some(t)) => c
            .rows
            .iter()
            .filter(|r| {
                r.provider == "rigbench"
                    && r.implementation == "w4a16"
                    && r.m >= 1024
                    && r.timing == t
            })
            .filter_map(|w| {
                let b = row(c, "bf16", w.m, t)?;
                Some((format!("M = {}", w.m), b.median_s / w.median_s))
            })
            .collect(),
        _ => vec![],
    };
    out.push(explain(
        judge(
            "decode-step composite, every M ≥ 1024: w4a16 at least 90% of bf16's speed".into(),
            0.9,
            true,
            "×",
            big,
        ),
        composite,
    ));
    // Per shape, M ≤ 16: the BF16 line.
    let mut line = Vec::new();
    for c in w4.iter().filter(|c| c.m <= 16) {
        let Some(t) = c.cold_timing().map(|t| t.median_s) else {
            continue;
        };
        let Some(f) = fit_of(k, "bf16", c.m, StepTiming::Cold) else {
            continue;
        };
        if let Some(p) = f.predict(c.derived.weight_bytes as f64) {
            if p > 0.0 {
                line.push((format!("{} M = {}", c.shape, c.m), t / (1.1 * p)));
            }
        }
    }
    out.push(judge(
        "per shape, M ≤ 16: w4a16 time ÷ (1.1 × (T0 + w4a16 bytes / BW)), T0 and BW fitted on this run's bf16 rows at that M".into(),
        1.0,
        false,
        "",
        line,
    ));
    // Small N never slower than BF16.
    let small: Vec<(String, f64)> = w4
        .iter()
        .filter(|c| c.n <= SMALL_N)
        .filter_map(|c| {
            let b = k.cases.iter().find(|b| {
                b.provider == "rigbench"
                    && b.implementation == "bf16"
                    && b.shape == c.shape
                    && b.m == c.m
            })?;
            Some((
                format!("{} M = {}", c.shape, c.m),
                b.total_s() / c.total_s(),
            ))
        })
        .collect();
    out.push(judge(
        format!("shapes with N ≤ {SMALL_N} (in_proj_ba): w4a16 never slower than bf16, any M"),
        1.0,
        true,
        "×",
        small,
    ));
    // Correctness and determinism.
    let failed = k
        .skipped
        .iter()
        .filter(|s| {
            s.provider == "rigbench"
                && s.implementation == "w4a16"
                && s.reason.contains("correctness check")
        })
        .count();
    let passed = w4
        .iter()
        .filter(|c| c.check.as_ref().is_some_and(|x| x.passed))
        .count();
    out.push(Goal {
        goal: "every w4a16 case passes its correctness check".into(),
        need: "all".into(),
        measured: format!("{passed} passed, {failed} failed"),
        verdict: if passed + failed == 0 {
            Verdict::NotMeasured("no w4a16 case".into())
        } else if failed == 0 {
            Verdict::Met
        } else {
            Verdict::NotMet
        },
    });
    let det: Vec<_> = k
        .determinism
        .iter()
        .filter(|d| d.provider == "rigbench" && d.implementation == "w4a16")
        .collect();
    let exact = det.iter().filter(|d| d.bit_exact).count();
    out.push(Goal {
        goal: "every w4a16 determinism check is bit-exact".into(),
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
    out
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
    let mut o = String::from("### rigbench's kernel goals\n\nGoals for rigbench's own W4A16 kernel (docs/w4a16-notes.md), evaluated on this run's rows: every ratio is between two implementations measured in this run (same card, same conditions). They describe rigbench's kernel against cuBLAS, not a property of the card.");
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
        let m1 = &g[0];
        match &m1.verdict {
            Verdict::NotMeasured(why) => assert!(why.contains("per_step"), "{why}"),
            v => panic!("{v:?}"),
        }
        // The per-shape goals still evaluate from the rows.
        assert!(g
            .iter()
            .any(|x| x.goal.contains("M ≤ 16") && x.verdict == Verdict::NotMet));
    }
}
