//! Rendering a [`Comparison`] as Markdown, for terminals and CI job summaries (the JSON form is
//! the serde serialization of [`Comparison`]).

use crate::output::table::{human_bytes, human_seconds, markdown_table, thousands};

use super::metric::Unit;
use super::verdict::{Row, Side, Verdict};
use super::Comparison;

fn number(unit: Unit, v: f64) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    let int = v.fract() == 0.0 && v.abs() < 9.0e15;
    match unit {
        Unit::Seconds => human_seconds(v),
        Unit::Ratio => format!("{v:.3e}"),
        Unit::Tokens | Unit::Count if int && v >= 0.0 => thousands(v as u64),
        Unit::Bytes if int && v >= 0.0 => human_bytes(v as u64),
        Unit::TokensPerSecond => format!("{v:.1} tok/s"),
        _ => format!("{v}"),
    }
}

fn side(unit: Unit, s: &Option<Side>) -> String {
    match s {
        None => "—".into(),
        Some(Side::Samples { n, median, repeats }) => {
            let n = if *repeats > 1 {
                format!("n={n}, R={repeats}")
            } else {
                format!("n={n}")
            };
            match median {
                Some(m) => format!("{} ({n})", number(unit, *m)),
                None => format!("invalid ({n})"),
            }
        }
        Some(Side::Value { value }) => number(unit, *value),
        Some(Side::Label { value }) => value.clone(),
    }
}

fn pct(x: f64) -> String {
    format!("{:+.2}%", 100.0 * x)
}

fn row_cells(r: &Row) -> Vec<String> {
    let change = r.change.map(pct).unwrap_or_else(|| "—".into());
    let interval = match (&r.interval, r.threshold) {
        (Some(ci), Some(t)) => format!("[{}, {}] vs ±{:.1}%", pct(ci.lo), pct(ci.hi), 100.0 * t),
        (Some(ci), None) => format!("[{}, {}]", pct(ci.lo), pct(ci.hi)),
        (None, _) => "—".into(),
    };
    let verdict = match r.verdict {
        Verdict::Regressed | Verdict::Missing => format!("**{}**", r.verdict),
        v => v.to_string(),
    };
    vec![
        format!("`{}`", r.id),
        side(r.unit, &r.baseline),
        side(r.unit, &r.current),
        change,
        interval,
        verdict,
    ]
}

/// Markdown: header, verdict counts, rig check, the table (metric, baseline, current, change,
/// interval, verdict; failures first), notes, and the method.
pub fn markdown(c: &Comparison) -> String {
    let mut out = String::new();
    let suite = c
        .results
        .suite
        .clone()
        .or_else(|| c.baseline.as_ref().and_then(|b| b.suite.clone()))
        .unwrap_or_else(|| "unknown".into());
    out.push_str(&format!(
        "## rigbench compare: suite {}, rig {}\n\n",
        crate::output::table::code(&suite),
        crate::output::table::code(&c.results.rig_label)
    ));
    push_files(c, &mut out);
    push_verdict_counts(c, &mut out);
    push_not_compared(c, &mut out);
    push_rig_and_warnings(c, &mut out);
    push_rows(c, &mut out);
    push_method(c, &mut out);
    out
}

/// The two files compared: path, rig label, creation time and rigbench version of each.
fn push_files(c: &Comparison, out: &mut String) {
    let b = c.baseline.as_ref();
    let pick = |f: &dyn Fn(&super::RunInfo) -> String| b.map(f).unwrap_or_else(|| "—".into());
    let files = markdown_table(
        &["", "baseline", "results"],
        &[
            vec![
                "file".to_string(),
                pick(&|i| i.path.clone()),
                c.results.path.clone(),
            ],
            vec![
                "rig label".to_string(),
                pick(&|i| i.rig_label.clone()),
                c.results.rig_label.clone(),
            ],
            vec![
                "created (UTC)".to_string(),
                pick(&|i| i.created_utc.clone()),
                c.results.created_utc.clone(),
            ],
            vec![
                "rigbench".to_string(),
                pick(&|i| i.rigbench_version.clone()),
                c.results.rigbench_version.clone(),
            ],
        ],
    );
    out.push_str(&files);
    out.push('\n');
}

/// The headline: why there is no comparison, or the verdict counts, exit code and what
/// `--confirm` re-measured.
fn push_verdict_counts(c: &Comparison, out: &mut String) {
    if let Some(p) = &c.problem {
        out.push_str(&format!(
            "**No comparison: {p}** (exit {})\n\n",
            c.exit_code
        ));
    } else {
        let k = &c.counts;
        let head = if k.regressed + k.missing > 0 {
            format!("**{} regressed, {} missing**", k.regressed, k.missing)
        } else {
            "**No regression**".to_string()
        };
        out.push_str(&format!(
            "{head}: {} ambiguous, {} not enough samples, {} improved, {} new, {} same{} (exit {})\n\n",
            k.ambiguous,
            k.not_enough_samples,
            k.improved,
            k.new,
            k.same,
            if k.not_reproduced > 0 {
                format!(", {} not reproduced by --confirm", k.not_reproduced)
            } else {
                String::new()
            },
            c.exit_code
        ));
        if let Some(cf) = &c.confirm {
            out.push_str(&match &cf.problem {
                Some(p) => format!(
                    "--confirm: could not re-measure ({p}); {} regressions stand unconfirmed.\n\n",
                    cf.rejudged.len()
                ),
                None if cf.rejudged.is_empty() => {
                    "--confirm: no kernel regression to re-measure.\n\n".to_string()
                }
                None => format!(
                    "--confirm: re-measured {} cases ({} repeats) behind {} regressed metrics: {} reproduced, {} not reproduced.\n\n",
                    cf.cases, cf.repeats, cf.rejudged.len(), cf.reproduced, cf.not_reproduced
                ),
            });
        }
    }
}

/// The timing metrics left out by `--deterministic-only`, the first few named.
fn push_not_compared(c: &Comparison, out: &mut String) {
    if !c.not_compared.is_empty() {
        const SHOWN: usize = 4;
        let mut ids: Vec<String> = c
            .not_compared
            .iter()
            .take(SHOWN)
            .map(|i| format!("`{i}`"))
            .collect();
        if c.not_compared.len() > SHOWN {
            ids.push(format!("and {} more", c.not_compared.len() - SHOWN));
        }
        out.push_str(&format!(
            "Not compared (timing; --deterministic-only): {} timing metrics ({}).\n\n",
            c.not_compared.len(),
            ids.join(", ")
        ));
    }
}

/// The rig check (mismatches, other differences) and the comparison's warnings.
fn push_rig_and_warnings(c: &Comparison, out: &mut String) {
    if let Some(rig) = &c.rig {
        if rig.compatible() {
            out.push_str("Rig: same GPU, compute capability and driver major version.\n");
        } else {
            out.push_str(if c.rig_mismatch_allowed {
                "**Rig mismatch** (allowed by --allow-rig-mismatch; verdicts below compare different rigs):\n"
            } else {
                "**Rig mismatch** (not a regression verdict):\n"
            });
            for m in &rig.mismatches {
                out.push_str(&format!("- {m}\n"));
            }
        }
        if !rig.differences.is_empty() {
            out.push_str("Other rig differences (not blocking):\n");
            for d in &rig.differences {
                out.push_str(&format!("- {d}\n"));
            }
        }
        out.push('\n');
    }
    for w in &c.warnings {
        out.push_str(&format!("Warning: {w}\n"));
    }
    if !c.warnings.is_empty() {
        out.push('\n');
    }
}

/// The table of rows (failures first) and the notes of the rows that have them.
fn push_rows(c: &Comparison, out: &mut String) {
    if !c.rows.is_empty() {
        let mut rows: Vec<&Row> = c.rows.iter().collect();
        rows.sort_by_key(|r| r.verdict); // stable: failures first, metric order within
        let cells: Vec<Vec<String>> = rows.iter().map(|r| row_cells(r)).collect();
        out.push_str(&markdown_table(
            &[
                "metric", "baseline", "current", "change", "interval", "verdict",
            ],
            &cells,
        ));
        let noted: Vec<&&Row> = rows
            .iter()
            .filter(|r| !r.notes.is_empty() && r.verdict != Verdict::New)
            .collect();
        if !noted.is_empty() {
            out.push_str("\nNotes:\n");
            for r in noted {
                out.push_str(&format!(
                    "- `{}` ({}): {}\n",
                    r.id,
                    r.verdict,
                    r.notes.join("; ")
                ));
            }
        }
        out.push('\n');
    }
}

/// How the verdicts were reached: the method, thresholds and confidence.
fn push_method(c: &Comparison, out: &mut String) {
    let s = &c.settings;
    if s.deterministic_only {
        out.push_str(
            "Method: --deterministic-only: values are compared against their own tolerance, \
             labels exactly or by rank; timing metrics are not compared. Missing metrics fail \
             the comparison (exit 2).\n",
        );
        return;
    }
    let mut overrides = String::new();
    for m in &s.metric_thresholds {
        overrides.push_str(&format!(", `{}` ±{:.1}%", m.glob, 100.0 * m.threshold));
    }
    let m = c.rows.iter().filter(|r| r.interval.is_some()).count();
    out.push_str(&format!(
        "Method: the repeat is the unit: each repeat of a timing gives the log of its median; the \
         change is the ratio of the geometric means of the repeats' medians. Its interval uses the \
         between-run variance of the repeats, moderated across the metric's family (empirical \
         Bayes, Smyth 2004) and floored by the family's empirical null (Efron 2004); without \
         repeats or a stored spread, only the within-run noise of the medians (McKean–Schrader). \
         Each of the {m} timing intervals is built at {:.4}% confidence (Bonferroni: {:.1}% \
         family-wise). Noise thresholds: kernels ±{:.1}%, end-to-end ±{:.1}%{overrides}. \
         Regressed or Improved only when the whole interval lies beyond the threshold, Same when \
         it lies within it, Not enough samples when it is wider than the threshold, Ambiguous \
         otherwise; `all_m` rows judge a shape over its M values. Values are compared against \
         their own tolerance, labels exactly or by rank. Missing metrics fail the comparison \
         (exit 2). See docs/gate.md.\n",
        100.0 * (1.0 - s.alpha() / m.max(1) as f64),
        100.0 * s.confidence,
        100.0 * s.threshold_kernels,
        100.0 * s.threshold_e2e,
    ));
}
