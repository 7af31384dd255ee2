//! The board's quality columns: one row per candidate of a results file's
//! `quality_comparison` (`rigbench quality`, docs/quality.md), with its verdict against the
//! reference of the same session, KL(reference‖candidate), top-1 agreement and the task counts.
//! Quality figures are never ranked: each belongs to its own reference and model.

use super::Row;
use crate::report::Results;

/// One candidate's quality figures on the board.
#[derive(Debug, Clone, PartialEq)]
pub struct QualityCell {
    /// `worse`, `tie`, `better`, `undecided`.
    pub verdict: String,
    /// Items a decision would need (undecided for want of items).
    pub would_need: Option<usize>,
    /// Mean KL(reference‖candidate), nats, from the top-k.
    pub kl_ref_to_candidate: f64,
    /// Top-1 agreement with the reference.
    pub top1_agreement: f64,
    /// `passed by the candidate/items vs passed by the reference/items`.
    pub tasks: String,
    /// McNemar's exact p.
    pub mcnemar_p: f64,
    /// The reference, in words.
    pub reference: String,
}

impl QualityCell {
    /// The Markdown cell: `tie · KL 0.0050 · top-1 97.0% · tasks 110/150 vs 109/150`.
    pub fn markdown(&self) -> String {
        let v = match self.would_need {
            Some(n) if self.verdict == "undecided" => format!("undecided (would need {n} items)"),
            _ => self.verdict.clone(),
        };
        format!(
            "{v} · KL {:.4} · top-1 {:.1}% · tasks {} · vs {}",
            self.kl_ref_to_candidate,
            100.0 * self.top1_agreement,
            self.tasks,
            self.reference
        )
    }
}

/// Rows of `r`'s quality comparison (none without one), for report `idx`.
pub fn rows(r: &Results, idx: usize) -> Vec<Row> {
    let Some(q) = &r.quality_comparison else {
        return Vec::new();
    };
    q.candidates
        .iter()
        .map(|c| Row {
            report: idx,
            format: format!("{} ({})", c.name, c.how),
            composite_s: [None; 3],
            kernels: None,
            rank: None,
            e2e: Vec::new(),
            e2e_conditions: None,
            kv_capacity: None,
            checkpoint: Some(c.model.clone()),
            notes: if r.complete {
                Vec::new()
            } else {
                vec!["incomplete run".into()]
            },
            quality: Some(QualityCell {
                verdict: c.verdict.as_str().into(),
                would_need: c.would_need,
                kl_ref_to_candidate: c.kl_ref_to_candidate,
                top1_agreement: c.top1_agreement,
                tasks: format!(
                    "{}/{} vs {}/{}",
                    c.tasks.passed_candidate,
                    c.tasks.items,
                    c.tasks.passed_reference,
                    c.tasks.items
                ),
                mcnemar_p: c.mcnemar_p,
                reference: q.reference_how.clone(),
            }),
        })
        .collect()
}
