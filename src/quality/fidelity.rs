//! Distribution fidelity of one side against another from top-k log-probabilities
//! (docs/quality.md, "KL from the top k").
//!
//! An API gives the k most probable tokens of each position, not the whole vocabulary. Per
//! position the two sides' distributions are coarse-grained onto the same buckets: one bucket
//! per token either side lists (the union U of the two top-k lists), and one tail bucket for
//! every other token. A side's probability of a token it does not list is unknown but at most
//! its k-th probability; it is imputed as `min(p_k, r / (m + 1))`, where `r = 1 − Σ listed` is
//! that side's unlisted mass and `m` the number of union tokens it does not list, so the
//! imputed tokens never take the whole remainder and the tail bucket keeps
//! `r − Σ imputed > 0`. KL is then computed over the |U| + 1 buckets in nats. On exact
//! probabilities a coarse-grained KL is a lower bound of the full-vocabulary KL (the data
//! processing inequality); the tail mass is stated beside it, so a reader sees how much of
//! each distribution the figure did not resolve.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::logprobs::Position;

/// Smallest probability a bucket gets (keeps the logs finite; `1e-12` nats-scale effect).
const FLOOR: f64 = 1e-12;

/// One position of A against B.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PairedPosition {
    /// KL(A‖B), nats, over the buckets of the module docs.
    pub kl_ab: f64,
    /// KL(B‖A), nats.
    pub kl_ba: f64,
    /// Whether the two arg-maxes (first of each top-k) are the same token.
    pub top1_same: bool,
    /// Negative log-likelihood of the prompt token under A, nats (`None`: not given).
    pub nll_a: Option<f64>,
    /// Under B.
    pub nll_b: Option<f64>,
    /// A's probability mass outside its top-k list.
    pub tail_a: f64,
    /// B's.
    pub tail_b: f64,
}

/// Buckets of one side: listed probabilities, imputed ones, and the tail.
fn buckets(pos: &Position, union: &[&str]) -> Vec<f64> {
    let listed: BTreeMap<&str, f64> = pos.top.iter().map(|(k, l)| (k.as_str(), l.exp())).collect();
    let sum: f64 = listed.values().sum();
    let rest = (1.0 - sum).max(0.0);
    let kth = listed.values().copied().fold(f64::INFINITY, f64::min);
    let missing = union.iter().filter(|t| !listed.contains_key(**t)).count();
    let impute = kth.min(rest / (missing as f64 + 1.0));
    let mut out: Vec<f64> = union
        .iter()
        .map(|t| listed.get(t).copied().unwrap_or(impute).max(FLOOR))
        .collect();
    out.push((rest - impute * missing as f64).max(FLOOR));
    out
}

fn kl(p: &[f64], q: &[f64]) -> f64 {
    let (sp, sq): (f64, f64) = (p.iter().sum(), q.iter().sum());
    p.iter()
        .zip(q)
        .map(|(a, b)| {
            let (a, b) = (a / sp, b / sq);
            a * (a / b).ln()
        })
        .sum::<f64>()
        .max(0.0)
}

/// Compare one position of A with the same position of B.
///
/// # Errors
/// The two positions hold different prompt tokens (not the same text or tokenizer), or a side
/// listed no alternatives.
pub fn pair(a: &Position, b: &Position) -> Result<PairedPosition, String> {
    if a.token != b.token {
        return Err(format!(
            "the sides score different tokens ({} and {}): not the same tokenization",
            a.token, b.token
        ));
    }
    if a.top.is_empty() || b.top.is_empty() {
        return Err("a side listed no top-k alternatives".into());
    }
    let mut union: Vec<&str> = a.top.iter().map(|(k, _)| k.as_str()).collect();
    for (k, _) in &b.top {
        if !union.contains(&k.as_str()) {
            union.push(k);
        }
    }
    let (pa, pb) = (buckets(a, &union), buckets(b, &union));
    let tail = |p: &Position| (1.0 - p.top.iter().map(|(_, l)| l.exp()).sum::<f64>()).max(0.0);
    Ok(PairedPosition {
        kl_ab: kl(&pa, &pb),
        kl_ba: kl(&pb, &pa),
        top1_same: a.top[0].0 == b.top[0].0,
        nll_a: a.token_logprob.map(|l| -l),
        nll_b: b.token_logprob.map(|l| -l),
        tail_a: tail(a),
        tail_b: tail(b),
    })
}

/// Means over the paired positions of a corpus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FidelitySummary {
    /// Positions compared.
    pub positions: usize,
    /// Mean KL(A‖B), nats (A the reference).
    pub kl_ab: f64,
    /// Mean KL(B‖A), nats.
    pub kl_ba: f64,
    /// Largest per-position KL(A‖B), nats.
    pub max_kl_ab: f64,
    /// Fraction of positions with the same arg-max.
    pub top1_agreement: f64,
    /// Mean of B's minus A's log-probability of the prompt token, nats (negative: B gives the
    /// text less probability). `None` when a side gave no prompt-token log-probabilities.
    pub delta_logprob: Option<f64>,
    /// A's perplexity of the scored tokens, `exp(mean NLL)`.
    pub perplexity_a: Option<f64>,
    /// B's.
    pub perplexity_b: Option<f64>,
    /// Mean probability mass outside A's top-k.
    pub tail_mass_a: f64,
    /// Outside B's top-k.
    pub tail_mass_b: f64,
}

/// Summarize paired positions.
pub fn summarize(p: &[PairedPosition]) -> FidelitySummary {
    let n = p.len().max(1) as f64;
    let mean = |f: &dyn Fn(&PairedPosition) -> f64| p.iter().map(f).sum::<f64>() / n;
    let nll = |f: &dyn Fn(&PairedPosition) -> Option<f64>| -> Option<f64> {
        let v: Option<Vec<f64>> = p.iter().map(f).collect();
        v.filter(|v| !v.is_empty())
            .map(|v| v.iter().sum::<f64>() / v.len() as f64)
    };
    let (na, nb) = (nll(&|x| x.nll_a), nll(&|x| x.nll_b));
    FidelitySummary {
        positions: p.len(),
        kl_ab: mean(&|x| x.kl_ab),
        kl_ba: mean(&|x| x.kl_ba),
        max_kl_ab: p.iter().map(|x| x.kl_ab).fold(0.0, f64::max),
        top1_agreement: p.iter().filter(|x| x.top1_same).count() as f64 / n,
        delta_logprob: na.zip(nb).map(|(a, b)| a - b),
        perplexity_a: na.map(f64::exp),
        perplexity_b: nb.map(f64::exp),
        tail_mass_a: mean(&|x| x.tail_a),
        tail_mass_b: mean(&|x| x.tail_b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(tok: &str, lp: f64, top: &[(&str, f64)]) -> Position {
        Position {
            token: tok.into(),
            token_logprob: Some(lp),
            top: top.iter().map(|(k, p)| (k.to_string(), p.ln())).collect(),
        }
    }

    #[test]
    fn identical_sides_have_zero_kl_and_full_agreement() {
        let a = pos("1", 0.6f64.ln(), &[("1", 0.6), ("2", 0.3)]);
        let p = pair(&a, &a).unwrap();
        assert!(p.kl_ab.abs() < 1e-12 && p.kl_ba.abs() < 1e-12 && p.top1_same);
        assert!((p.tail_a - 0.1).abs() < 1e-12);
    }

    #[test]
    fn kl_from_complete_lists_is_the_exact_kl() {
        // Both lists cover the whole distribution (no tail): the bucket KL is the exact KL.
        let a = pos("x", 0.5f64.ln(), &[("x", 0.5), ("y", 0.5)]);
        let b = pos("x", 0.8f64.ln(), &[("x", 0.8), ("y", 0.2)]);
        let p = pair(&a, &b).unwrap();
        let exact = 0.5 * (0.5f64 / 0.8).ln() + 0.5 * (0.5f64 / 0.2).ln();
        assert!((p.kl_ab - exact).abs() < 1e-9, "{} vs {exact}", p.kl_ab);
        let exact_ba = 0.8 * (0.8f64 / 0.5).ln() + 0.2 * (0.2f64 / 0.5).ln();
        assert!((p.kl_ba - exact_ba).abs() < 1e-9);
        let s = summarize(&[p]);
        assert!((s.delta_logprob.unwrap() - (0.8f64.ln() - 0.5f64.ln())).abs() < 1e-12);
        assert!(pair(&a, &pos("z", 0.0, &[("z", 1.0)])).is_err());
    }

    #[test]
    fn a_token_one_side_does_not_list_is_imputed_below_its_kth() {
        // B does not list "c"; its imputed share is at most min(0.1, 0.2/2).
        let a = pos("a", 0.5f64.ln(), &[("a", 0.5), ("c", 0.4)]);
        let b = pos("a", 0.7f64.ln(), &[("a", 0.7), ("d", 0.1)]);
        let p = pair(&a, &b).unwrap();
        assert!(p.kl_ab > 0.3 && p.kl_ab.is_finite(), "{}", p.kl_ab);
        assert!(p.top1_same);
    }
}
