//! Summaries of samples: percentiles, mean, spread, and the stopping rule for timed loops.
//!
//! Percentiles use linear interpolation between closest ranks (NumPy's default `linear` method,
//! Hyndman & Fan type 7). The stopping rule follows nvbench's `stdrel` criterion: stop once the
//! relative standard deviation (σ/mean) of the samples is under a target, after a minimum number of
//! samples, or when a sample or time cap is reached.

pub mod rng;

use serde::{Deserialize, Serialize};

/// The `p`-th percentile (0 ≤ p ≤ 100) of `samples` by linear interpolation (type 7).
/// Returns `None` for an empty slice or when any sample is NaN.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    if samples.is_empty() || samples.iter().any(|v| v.is_nan()) {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    Some(percentile_sorted(&v, p))
}

/// [`percentile`] on data already sorted ascending (non-empty).
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    let p = p.clamp(0.0, 100.0) / 100.0;
    let h = (sorted.len() - 1) as f64 * p;
    let lo = h.floor() as usize;
    let hi = h.ceil() as usize;
    sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
}

/// Arithmetic mean (`None` when empty).
pub fn mean(samples: &[f64]) -> Option<f64> {
    if samples.is_empty() {
        None
    } else {
        Some(samples.iter().sum::<f64>() / samples.len() as f64)
    }
}

/// Sample standard deviation (n − 1 denominator; `None` below two samples).
pub fn std_dev(samples: &[f64]) -> Option<f64> {
    if samples.len() < 2 {
        return None;
    }
    let m = mean(samples)?;
    let var = samples.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (samples.len() - 1) as f64;
    Some(var.sqrt())
}

/// A summary of one set of samples, in the samples' unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Median (p50).
    pub median: f64,
    /// Mean.
    pub mean: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// Sample standard deviation (0 for one sample).
    pub std_dev: f64,
}

impl Summary {
    /// Summarize `samples`; `None` when empty or containing NaN.
    pub fn of(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() || samples.iter().any(|v| v.is_nan()) {
            return None;
        }
        let mut v = samples.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        Some(Self {
            n: v.len(),
            median: percentile_sorted(&v, 50.0),
            mean: mean(&v)?,
            p10: percentile_sorted(&v, 10.0),
            p90: percentile_sorted(&v, 90.0),
            p95: percentile_sorted(&v, 95.0),
            p99: percentile_sorted(&v, 99.0),
            min: v[0],
            max: v[v.len() - 1],
            std_dev: std_dev(&v).unwrap_or(0.0),
        })
    }

    /// Relative standard deviation σ/mean (nvbench's `stdrel`); 0 when the mean is 0.
    pub fn rel_std(&self) -> f64 {
        if self.mean == 0.0 {
            0.0
        } else {
            self.std_dev / self.mean.abs()
        }
    }
}

/// When a timed loop stops (nvbench-style `stdrel` rule with caps).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoppingRule {
    /// Never stop before this many samples.
    pub min_samples: usize,
    /// Always stop at this many samples.
    pub max_samples: usize,
    /// Stop when σ/mean of the samples falls below this (e.g. 0.01 = 1%).
    pub target_rel_std: f64,
    /// Stop when the loop has run this long, in seconds of wall time (but never below
    /// `min_samples`).
    pub max_time_s: f64,
}

impl Default for StoppingRule {
    fn default() -> Self {
        Self {
            min_samples: 10,
            max_samples: 500,
            target_rel_std: 0.01,
            max_time_s: 1.0,
        }
    }
}

/// Why a timed loop stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// σ/mean fell below the target.
    Converged,
    /// Hit `max_samples` first.
    SampleCap,
    /// Hit `max_time_s` first, after at least `min_samples` (the spread is then whatever it was).
    TimeCap,
}

impl StoppingRule {
    /// Decide after a new sample: `Some(reason)` to stop, `None` to go on.
    pub fn check(&self, samples: &[f64], elapsed_s: f64) -> Option<StopReason> {
        let n = samples.len();
        if n >= self.max_samples {
            return Some(StopReason::SampleCap);
        }
        if n >= self.min_samples {
            if let (Some(m), Some(s)) = (mean(samples), std_dev(samples)) {
                if m != 0.0 && s / m.abs() <= self.target_rel_std {
                    return Some(StopReason::Converged);
                }
            }
        }
        // The time cap never cuts a case below `min_samples`.
        if elapsed_s >= self.max_time_s && n >= self.min_samples.max(1) {
            return Some(StopReason::TimeCap);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_match_numpy_linear() {
        // numpy.percentile([1,2,3,4,5,6,7,8,9,10], [10, 50, 90, 99]) = [1.9, 5.5, 9.1, 9.91]
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(percentile(&v, 10.0).unwrap(), 1.9));
        assert!(close(percentile(&v, 50.0).unwrap(), 5.5));
        assert!(close(percentile(&v, 90.0).unwrap(), 9.1));
        assert!(close(percentile(&v, 99.0).unwrap(), 9.91));
        assert_eq!(percentile(&[3.0], 99.0), Some(3.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[1.0, f64::NAN], 50.0), None);
    }

    #[test]
    fn summary_is_order_free() {
        let s = Summary::of(&[5.0, 1.0, 3.0, 2.0, 4.0]).unwrap();
        assert_eq!(
            (s.n, s.median, s.min, s.max, s.mean),
            (5, 3.0, 1.0, 5.0, 3.0)
        );
        assert!((s.std_dev - 2.5f64.sqrt()).abs() < 1e-12);
    }

    #[test]
    fn stopping_rule() {
        let r = StoppingRule {
            min_samples: 5,
            max_samples: 8,
            target_rel_std: 0.01,
            max_time_s: 10.0,
        };
        assert_eq!(r.check(&[1.0; 4], 0.0), None, "below min samples");
        assert_eq!(r.check(&[1.0; 5], 0.0), Some(StopReason::Converged));
        let noisy = [1.0, 2.0, 1.0, 2.0, 1.0];
        assert_eq!(r.check(&noisy, 0.0), None);
        assert_eq!(r.check(&noisy, 11.0), Some(StopReason::TimeCap));
        assert_eq!(
            r.check(&noisy[..3], 11.0),
            None,
            "the time cap must not stop a case below min_samples"
        );
        assert_eq!(
            r.check(&[1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0], 0.0),
            Some(StopReason::SampleCap)
        );
    }
}
