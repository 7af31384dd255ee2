//! The quality gate: `compare` rows from the results' `quality_comparison` (docs/quality.md,
//! "Gating in CI").
//!
//! The quality verdict is made within one session (the reference and the candidate measured
//! side by side), so the results file alone decides it; the baseline only says which
//! candidates must be there. Per candidate one row, `quality/<candidate>/verdict`:
//! - `worse` → Regressed (a quality regression fails like a speed regression, exit 2);
//! - `undecided` → Not enough samples, with the items a decision would need (not a failure);
//! - `tie` → Same; `better` → Improved;
//! - a candidate the baseline's comparison has and the results' lacks → Missing (a failure,
//!   as for any metric that disappears).

use super::metric::{Direction, Unit};
use super::verdict::{Row, Side, Verdict};
use crate::quality::verdict::Verdict as Q;
use crate::report::Results;

fn row(
    id: String,
    baseline: Option<&str>,
    current: Option<&str>,
    verdict: Verdict,
    notes: Vec<String>,
) -> Row {
    let side = |v: Option<&str>| {
        v.map(|s| Side::Label {
            value: s.to_string(),
        })
    };
    Row {
        id,
        unit: Unit::Label,
        direction: Direction::HigherIsBetter,
        baseline: side(baseline),
        current: side(current),
        change: None,
        interval: None,
        threshold: None,
        verdict,
        notes,
    }
}

/// The rows of the quality gate (see the module docs); none when neither file has a quality
/// comparison.
pub fn rows(baseline: &Results, current: &Results) -> Vec<Row> {
    let mut out = Vec::new();
    let cur = current.quality_comparison.as_ref();
    let base = baseline.quality_comparison.as_ref();
    let find = |q: Option<&crate::quality::QualityComparison>, name: &str| {
        q.and_then(|q| q.candidates.iter().find(|c| c.name == name))
            .map(|c| c.verdict.as_str())
    };
    if let Some(q) = cur {
        for c in &q.candidates {
            let verdict = match c.verdict {
                Q::Worse => Verdict::Regressed,
                Q::Undecided => Verdict::NotEnoughSamples,
                Q::Tie => Verdict::Same,
                Q::Better => Verdict::Improved,
            };
            let mut notes = vec![format!(
                "{} against {} in the same session: {}",
                c.name,
                q.reference,
                c.reasons.join("; ")
            )];
            if let Some(n) = c.would_need {
                notes.push(format!("would need {n} task items to decide"));
            }
            out.push(row(
                format!("quality/{}/verdict", c.name),
                find(base, &c.name),
                Some(c.verdict.as_str()),
                verdict,
                notes,
            ));
        }
    }
    if let Some(b) = base {
        for c in &b.candidates {
            if find(cur, &c.name).is_none() {
                out.push(row(
                    format!("quality/{}/verdict", c.name),
                    Some(c.verdict.as_str()),
                    None,
                    Verdict::Missing,
                    vec!["the baseline compared this candidate's quality; the results do not (run `rigbench quality` with it)".into()],
                ));
            }
        }
    }
    out
}
