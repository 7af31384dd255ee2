//! The verdict of a candidate against the reference (docs/quality.md, "The verdict"):
//! McNemar's exact test on the task pack's paired pass/fail, a moving-block bootstrap interval
//! on the per-position perplexity and KL differences, and the number of items a tie would need.

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use statrs::distribution::{Binomial, ContinuousCDF, DiscreteCDF, Normal};

/// `worse`, `tie`, `better` or `undecided`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The candidate loses beyond noise: significantly more task items lost than won, or a
    /// perplexity ratio whose whole interval lies above `1 + margin`.
    Worse,
    /// No difference beyond noise, with enough items to have seen one of the smallest effect
    /// that matters, and a perplexity ratio whose interval lies below `1 + margin`.
    Tie,
    /// Significantly more task items won than lost, and not worse in perplexity.
    Better,
    /// Not enough evidence either way (`would_need` items).
    Undecided,
}

impl Verdict {
    /// As written in results (`worse`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Worse => "worse",
            Verdict::Tie => "tie",
            Verdict::Better => "better",
            Verdict::Undecided => "undecided",
        }
    }
}

/// Two-sided exact McNemar p-value for `b` pairs the reference passed and the candidate failed
/// and `c` the other way round: under H0 the discordant pairs split Binomial(b + c, ½), so
/// `p = min(1, 2·P(X ≤ min(b, c)))` (McNemar 1947; the exact form, as in R's
/// `binom.test(b, b + c)`). `1.0` when there is no discordant pair.
pub fn mcnemar_exact(b: usize, c: usize) -> f64 {
    let n = (b + c) as u64;
    if n == 0 {
        return 1.0;
    }
    match Binomial::new(0.5, n) {
        Ok(d) => (2.0 * d.cdf(b.min(c) as u64)).min(1.0),
        Err(_) => 1.0,
    }
}

/// Items a paired McNemar test needs to detect a pass-rate difference of `delta` at two-sided
/// level `alpha` with power `power`, when a share `psi` of the items is discordant (Connor
/// 1987, "Sample size for testing differences in proportions for the paired-sample design",
/// Biometrics 43:207): `n = (z_{1−α/2}·√ψ + z_{power}·√(ψ − δ²))² / δ²`. `psi` is raised to
/// `delta` when smaller (a difference of δ needs at least that share of discordant pairs).
pub fn items_needed(psi: f64, delta: f64, alpha: f64, power: f64) -> usize {
    let Ok(z) = Normal::new(0.0, 1.0) else {
        return usize::MAX;
    };
    if !(delta > 0.0 && delta < 1.0) {
        return usize::MAX;
    }
    let psi = psi.max(delta).min(1.0);
    let za = z.inverse_cdf(1.0 - alpha / 2.0);
    let zb = z.inverse_cdf(power);
    let n =
        (za * psi.sqrt() + zb * (psi - delta * delta).max(0.0).sqrt()).powi(2) / (delta * delta);
    n.ceil() as usize
}

/// A `level` (e.g. 0.95) percentile interval of the mean of `x` by a moving-block bootstrap
/// (Künsch 1989): resamples of `ceil(n / block)` blocks of `block` consecutive values, so
/// neighbouring positions of a text, which are correlated, stay together. `reps` resamples from
/// a fixed `seed` (reproducible). `None` for fewer than 2 values.
pub fn block_bootstrap_mean(
    x: &[f64],
    block: usize,
    reps: usize,
    seed: u64,
    level: f64,
) -> Option<(f64, f64)> {
    let n = x.len();
    if n < 2 || reps == 0 {
        return None;
    }
    let block = block.clamp(1, n);
    let starts = n - block + 1;
    let blocks = n.div_ceil(block);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut means: Vec<f64> = (0..reps)
        .map(|_| {
            let mut s = 0.0;
            for _ in 0..blocks {
                let at = rng.random_range(0..starts);
                s += x[at..at + block].iter().sum::<f64>();
            }
            s / (blocks * block) as f64
        })
        .collect();
    means.sort_by(f64::total_cmp);
    let q = |p: f64| means[((p * (reps - 1) as f64).round() as usize).min(reps - 1)];
    let tail = (1.0 - level) / 2.0;
    Some((q(tail), q(1.0 - tail)))
}

/// What the verdict is decided from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evidence {
    /// Task items run on both sides.
    pub items: usize,
    /// Passed by the reference only.
    pub ref_only: usize,
    /// Passed by the candidate only.
    pub cand_only: usize,
    /// Interval of the candidate-to-reference perplexity ratio (`None`: not measured).
    pub ppl_ratio_ci: Option<(f64, f64)>,
}

/// The rules: their thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rules {
    /// Significance level of McNemar's test (two-sided).
    pub alpha: f64,
    /// Smallest pass-rate difference that matters (a tie must have had the power to see it).
    pub min_effect: f64,
    /// Power a tie needs against `min_effect`.
    pub power: f64,
    /// Perplexity ratio above `1 + ppl_margin` is a loss.
    pub ppl_margin: f64,
}

impl Default for Rules {
    /// α 0.05, δ 0.05 (five points of pass rate), power 0.8, perplexity margin 2%.
    fn default() -> Self {
        Rules {
            alpha: 0.05,
            min_effect: 0.05,
            power: 0.8,
            ppl_margin: 0.02,
        }
    }
}

/// The decision: verdict, McNemar's p, the items a decision would need when undecided, and
/// the reasons in words.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// The verdict.
    pub verdict: Verdict,
    /// McNemar's exact two-sided p.
    pub mcnemar_p: f64,
    /// Items a tie would need (Connor's formula), when more than were run.
    pub would_need: Option<usize>,
    /// Why, in words.
    pub reasons: Vec<String>,
}

/// Decide (see [`Verdict`] for each rule).
pub fn decide(e: &Evidence, r: &Rules) -> Decision {
    let p = mcnemar_exact(e.ref_only, e.cand_only);
    let mut reasons = Vec::new();
    let sig = p < r.alpha;
    let tasks_worse = sig && e.ref_only > e.cand_only;
    let tasks_better = sig && e.cand_only > e.ref_only;
    reasons.push(format!(
        "task pack: {} items, reference only {} / candidate only {}, McNemar exact p = {:.3}{}",
        e.items,
        e.ref_only,
        e.cand_only,
        p,
        if sig { " (significant)" } else { "" }
    ));
    let limit = 1.0 + r.ppl_margin;
    let (ppl_worse, ppl_within) = match e.ppl_ratio_ci {
        Some((lo, hi)) => {
            reasons.push(format!(
                "perplexity ratio candidate/reference: 95% interval [{lo:.4}, {hi:.4}] against the margin {limit:.3}"
            ));
            (lo > limit, hi < limit)
        }
        None => {
            reasons.push("perplexity ratio: not measured".into());
            (false, false)
        }
    };
    let psi = if e.items > 0 {
        (e.ref_only + e.cand_only) as f64 / e.items as f64
    } else {
        0.0
    };
    let needed = items_needed(psi, r.min_effect, r.alpha, r.power);
    let (verdict, would_need) = if tasks_worse || ppl_worse {
        (Verdict::Worse, None)
    } else if tasks_better {
        (Verdict::Better, None)
    } else if e.items >= needed && ppl_within {
        (Verdict::Tie, None)
    } else {
        if e.items < needed {
            reasons.push(format!(
                "a tie needs {needed} items to see a {:.0}-point difference at power {:.0}% (discordant share {:.2}); {} were run",
                100.0 * r.min_effect,
                100.0 * r.power,
                psi.max(r.min_effect),
                e.items
            ));
        }
        if !ppl_within {
            reasons.push("the perplexity interval does not lie below the margin".into());
        }
        (Verdict::Undecided, (e.items < needed).then_some(needed))
    };
    Decision {
        verdict,
        mcnemar_p: p,
        would_need,
        reasons,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcnemar_matches_the_binomial_test() {
        // R: binom.test(2, 12)$p.value = 0.03857422 (2 of 12 discordant pairs one way).
        assert!((mcnemar_exact(2, 10) - 0.038_574_22).abs() < 1e-6);
        assert!((mcnemar_exact(10, 2) - 0.038_574_22).abs() < 1e-6);
        assert_eq!(mcnemar_exact(0, 0), 1.0);
        assert_eq!(mcnemar_exact(3, 3), 1.0);
        // binom.test(0, 5): 0.0625.
        assert!((mcnemar_exact(0, 5) - 0.0625).abs() < 1e-12);
    }

    #[test]
    fn items_needed_follows_connor() {
        // ψ = 0.2, δ = 0.05, α 0.05, power 0.8: (1.95996·0.44721 + 0.84162·0.44441)² / 0.0025.
        let n = items_needed(0.2, 0.05, 0.05, 0.8);
        let want = ((1.959_964 * 0.2f64.sqrt() + 0.841_621 * (0.2f64 - 0.0025).sqrt()).powi(2)
            / 0.0025)
            .ceil() as usize;
        assert_eq!(n, want);
        assert!((620..=630).contains(&n), "{n}");
    }

    #[test]
    fn bootstrap_brackets_the_mean_and_is_reproducible() {
        let x: Vec<f64> = (0..200).map(|i| (i % 7) as f64).collect();
        let m = x.iter().sum::<f64>() / 200.0;
        let (lo, hi) = block_bootstrap_mean(&x, 16, 500, 7, 0.95).unwrap();
        assert!(lo < m && m < hi, "{lo} {m} {hi}");
        assert_eq!(block_bootstrap_mean(&x, 16, 500, 7, 0.95), Some((lo, hi)));
        assert!(block_bootstrap_mean(&[1.0], 16, 500, 7, 0.95).is_none());
    }

    #[test]
    fn decisions() {
        let r = Rules::default();
        let worse = decide(
            &Evidence {
                items: 300,
                ref_only: 30,
                cand_only: 5,
                ppl_ratio_ci: Some((0.99, 1.01)),
            },
            &r,
        );
        assert_eq!(worse.verdict, Verdict::Worse);
        let tie = decide(
            &Evidence {
                items: 300,
                ref_only: 1,
                cand_only: 1,
                ppl_ratio_ci: Some((0.99, 1.01)),
            },
            &r,
        );
        assert_eq!(tie.verdict, Verdict::Tie, "{:?}", tie.reasons);
        let small = decide(
            &Evidence {
                items: 20,
                ref_only: 2,
                cand_only: 1,
                ppl_ratio_ci: Some((0.99, 1.01)),
            },
            &r,
        );
        assert_eq!(small.verdict, Verdict::Undecided);
        assert!(small.would_need.unwrap() > 20);
        let ppl = decide(
            &Evidence {
                items: 300,
                ref_only: 0,
                cand_only: 0,
                ppl_ratio_ci: Some((1.05, 1.2)),
            },
            &r,
        );
        assert_eq!(ppl.verdict, Verdict::Worse);
    }
}
