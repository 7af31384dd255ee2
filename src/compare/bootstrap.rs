//! Two-sample bootstrap interval of the relative change of the median.
//!
//! Method (percentile bootstrap; Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993,
//! ch. 13 "Confidence intervals based on bootstrap percentiles"): the baseline samples `a` and the
//! current samples `b` are resampled independently with replacement, each to its own size; for
//! every resample pair the statistic `median(b*) / median(a*) − 1` is recorded; the interval is
//! the `(1 − c)/2` and `(1 + c)/2` quantiles of those `B` values (linear interpolation, the same
//! type-7 rule as [`crate::stats::percentile`]). The point estimate is the statistic on the
//! original samples. The percentile interval is invariant under monotone transforms, so this
//! is also the interval of the log ratio, mapped back.
//!
//! The median (not the mean) is used because GPU timings have heavy right tails (clock dips,
//! preemption, a late L2 flush): one slow sample moves a mean, not a median. The same choice is
//! made by criterion.rs, which bootstraps the relative change of its estimates against a noise
//! threshold.
//!
//! Determinism: the generator is `rand::rngs::SmallRng` (Xoshiro256++ in rand 0.9 on 64-bit
//! hosts; a statistical, not a cryptographic, generator) seeded from the caller's seed, so an
//! interval is reproducible for a given rigbench build.

use rand::{rngs::SmallRng, RngCore, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::stats::percentile_sorted;

/// Fewest samples per side for which an interval is computed. Below it the percentile bootstrap
/// of a median has too few distinct values to mean anything (with 3 against 3 samples no
/// two-sample rank test can even reach p < 0.1), so the caller reports "ambiguous".
pub const MIN_SAMPLES: usize = 5;

/// The relative change `current / baseline − 1` of the median with its bootstrap interval
/// (dimensionless; +0.10 = 10% larger).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ChangeInterval {
    /// `median(current) / median(baseline) − 1` on the original samples.
    pub point: f64,
    /// Lower end of the interval.
    pub lo: f64,
    /// Upper end of the interval.
    pub hi: f64,
    /// Two-sided confidence level of the interval (e.g. 0.99).
    pub confidence: f64,
    /// Bootstrap resamples drawn.
    pub resamples: usize,
}

/// Why no interval could be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntervalError {
    /// Fewer than [`MIN_SAMPLES`] on a side.
    #[error("too few samples (baseline {baseline}, current {current}; need at least {MIN_SAMPLES} on each side)")]
    TooFewSamples {
        /// Baseline sample count.
        baseline: usize,
        /// Current sample count.
        current: usize,
    },
    /// A sample that is not a finite positive number (a timing must be > 0).
    #[error("{side} samples include a value that is not a finite positive number")]
    InvalidSample {
        /// `baseline` or `current`.
        side: &'static str,
    },
    /// Confidence outside (0, 1) or no resamples.
    #[error("invalid bootstrap settings: {0}")]
    Settings(String),
}

/// A uniform index in `0..n` by Lemire's multiply-shift (bias below `n / 2⁶⁴`, negligible for
/// any sample count).
fn index(rng: &mut SmallRng, n: usize) -> usize {
    ((u128::from(rng.next_u64()) * n as u128) >> 64) as usize
}

/// The median of `v` (average of the two middle values for even length), reordering `v`.
/// `v` must be non-empty and NaN-free.
fn median_in_place(v: &mut [f64]) -> f64 {
    let n = v.len();
    let mid = n / 2;
    let (left, m, _) = v.select_nth_unstable_by(mid, |a, b| a.total_cmp(b));
    let upper = *m;
    if n % 2 == 1 {
        upper
    } else {
        let lower = left.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        0.5 * (lower + upper)
    }
}

/// Percentile-bootstrap interval of `median(current) / median(baseline) − 1` at two-sided
/// confidence `confidence` (in (0, 1)), from `resamples` resample pairs drawn with `seed`.
///
/// # Errors
/// [`IntervalError`] when a side has fewer than [`MIN_SAMPLES`] samples, a sample is not a
/// finite positive number, or the settings are out of range.
pub fn median_change_interval(
    baseline: &[f64],
    current: &[f64],
    confidence: f64,
    resamples: usize,
    seed: u64,
) -> Result<ChangeInterval, IntervalError> {
    if !(confidence > 0.0 && confidence < 1.0) {
        return Err(IntervalError::Settings(format!(
            "confidence {confidence} is not in (0, 1)"
        )));
    }
    if resamples < 100 {
        return Err(IntervalError::Settings(format!(
            "{resamples} resamples; use at least 100"
        )));
    }
    if baseline.len() < MIN_SAMPLES || current.len() < MIN_SAMPLES {
        return Err(IntervalError::TooFewSamples {
            baseline: baseline.len(),
            current: current.len(),
        });
    }
    let valid = |v: &[f64]| v.iter().all(|x| x.is_finite() && *x > 0.0);
    if !valid(baseline) {
        return Err(IntervalError::InvalidSample { side: "baseline" });
    }
    if !valid(current) {
        return Err(IntervalError::InvalidSample { side: "current" });
    }

    let point =
        median_in_place(&mut current.to_vec()) / median_in_place(&mut baseline.to_vec()) - 1.0;

    let mut rng = SmallRng::seed_from_u64(seed);
    let mut ra = vec![0.0; baseline.len()];
    let mut rb = vec![0.0; current.len()];
    let mut stats = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        for x in ra.iter_mut() {
            *x = baseline[index(&mut rng, baseline.len())];
        }
        for x in rb.iter_mut() {
            *x = current[index(&mut rng, current.len())];
        }
        stats.push(median_in_place(&mut rb) / median_in_place(&mut ra) - 1.0);
    }
    stats.sort_by(|a, b| a.total_cmp(b));
    let alpha = 1.0 - confidence;
    Ok(ChangeInterval {
        point,
        lo: percentile_sorted(&stats, 100.0 * alpha / 2.0),
        hi: percentile_sorted(&stats, 100.0 * (1.0 - alpha / 2.0)),
        confidence,
        resamples,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_matches_stats_percentile() {
        for v in [
            vec![3.0, 1.0, 2.0],
            vec![4.0, 1.0, 3.0, 2.0],
            vec![5.0],
            vec![1.0, 1.0, 9.0, 9.0, 2.0, 7.0],
        ] {
            let want = crate::stats::percentile(&v, 50.0).unwrap();
            assert_eq!(median_in_place(&mut v.clone()), want, "{v:?}");
        }
    }

    #[test]
    fn interval_brackets_the_point_and_is_deterministic() {
        let a: Vec<f64> = (0..20).map(|i| 1.0 + 0.01 * (i % 7) as f64).collect();
        let b: Vec<f64> = a.iter().map(|x| x * 1.1).collect();
        let r1 = median_change_interval(&a, &b, 0.99, 1000, 7).unwrap();
        let r2 = median_change_interval(&a, &b, 0.99, 1000, 7).unwrap();
        assert_eq!(r1, r2);
        assert!((r1.point - 0.1).abs() < 1e-12, "{r1:?}");
        assert!(r1.lo <= r1.point && r1.point <= r1.hi, "{r1:?}");
        assert!(r1.lo > 0.0, "a clean 10% shift must exclude zero: {r1:?}");
    }

    #[test]
    fn identical_constant_samples_give_a_point_interval() {
        let a = [2.0; 8];
        let r = median_change_interval(&a, &a, 0.95, 200, 1).unwrap();
        assert_eq!((r.point, r.lo, r.hi), (0.0, 0.0, 0.0));
    }

    #[test]
    fn rejects_bad_input() {
        let ok = [1.0; 6];
        assert!(matches!(
            median_change_interval(&[1.0; 4], &ok, 0.99, 1000, 0),
            Err(IntervalError::TooFewSamples {
                baseline: 4,
                current: 6
            })
        ));
        let mut bad = ok.to_vec();
        bad[2] = f64::NAN;
        assert_eq!(
            median_change_interval(&ok, &bad, 0.99, 1000, 0),
            Err(IntervalError::InvalidSample { side: "current" })
        );
        bad[2] = 0.0;
        assert!(median_change_interval(&bad, &ok, 0.99, 1000, 0).is_err());
        assert!(median_change_interval(&ok, &ok, 1.0, 1000, 0).is_err());
        assert!(median_change_interval(&ok, &ok, 0.9, 10, 0).is_err());
    }
}
