//! The statistics of the CI gate: a two-level (repeat, sample) model of each timing metric,
//! between-run variances moderated across the metrics of a family (empirical Bayes), and
//! Bonferroni intervals that hold the family-wise error over every metric of a comparison.
//!
//! `docs/gate.md` is the long form (why, the choices, the measured rates).
//!
//! # Model
//! A timing metric is measured in `R` repeats per side (`report --repeats R`; one repeat when
//! not repeated). Repeat `r` of side `s` gives samples; its run-level value is
//! `y_{s,r} = ln median(samples of repeat r)`. The change of the metric is
//! `d = mean_r y_{c,r} − mean_r y_{b,r}` (the log ratio of the geometric means of the repeats'
//! medians; reported as `exp(d) − 1`).
//!
//! When both sides record each repeat's *slot* (the rank of the metric's implementation in that
//! repeat's rotated order, among the implementations the run timed), the change is instead the slot-adjusted `μ_c − μ_b` of the
//! least-squares fit `y = μ_side + π_slot + e` ([`Paired::slot_fit`]): the position in the
//! order moves a small kernel's time by a few percent on the H200, which would otherwise read as
//! between-run variance and bias `d` when the sides hold the slots in different proportions.
//!
//! Each `y_{s,r}` varies around the metric's true value by a between-run part (clocks and power
//! state, memory placement, library heuristics: what changes from one run to the next) plus the
//! within-run noise of a median. Its variance `σ²` is estimated from:
//! - the spread of the repeats of both sides: the slot fit's residual variance, or without
//!   slots `s_i²` with `R_b − 1 + R_c − 1` degrees of freedom (a baseline's stored
//!   [`RunSpread`] then stands for its side when present);
//! - a prior for the metric's *family* (the same implementation and part over shapes and M, or
//!   the same end-to-end metric over sweep points): `s0²` and `d0` estimated from the `s_i²` of
//!   the family by Smyth's empirical-Bayes method (Smyth 2004, *Linear models and empirical
//!   Bayes methods for assessing differential expression in microarray experiments*, SAGMB 3(1),
//!   §6), floored by the family's *empirical null* (Efron 2004, *Large-scale simultaneous
//!   hypothesis testing: the choice of a null hypothesis*, JASA 99): the robust spread (1.4826 ×
//!   MAD) of the standardized changes `d_i / √(1/R_b + 1/R_c)` over the family, which measures
//!   run-to-run variation directly even when repeats inside one process are more alike than
//!   separate runs;
//! - the moderated variance `σ̃² = (d0·s0² + df_i·s_i²) / (d0 + df_i)` with `d0 + df_i`
//!   degrees of freedom (Smyth's moderated t), never below the within-run variance of the
//!   repeats' medians.
//!
//! `se² = σ̃²/R_b + σ̃²/R_c` (with slots, `σ̃²` times the fit's factor). Without any between-run
//! information (one repeat per side, no stored spread, no family prior) only the within-run
//! noise is known: `se²` is the sum of the within-run variances of the two medians and the
//! comparison says so, because it then flags ordinary run-to-run drift (docs/gate.md).
//!
//! Within-run variance of `ln median`: the order-statistic standard error of McKean & Schrader
//! (1984, *A comparison of methods for studentizing the sample median*, Comm. Stat. B 13(6)):
//! `(x_(n−c+1) − x_(c)) / (2·z_{0.975})` with `c = round((n + 1)/2 − z_{0.975}·√(n/4))`, on the
//! sorted logs. It needs no resampling and, like the median, ignores a few wild samples.
//!
//! # Family-wise error
//! With `m` timing metrics in one comparison, each interval is built at two-sided confidence
//! `1 − α/m` (Bonferroni), `α = 1 −` the family-wise confidence (default 95%): the probability
//! that *any* metric's interval misses its true change is at most `α`, under any dependence
//! between metrics. A metric is Regressed only when its whole interval lies beyond the noise
//! threshold, so under no change beyond the threshold the chance that a comparison shows any
//! false regression is at most `α/2` when the model holds.
//!
//! # Shape aggregates
//! A slowdown of one implementation on one shape moves every M of that shape. For each
//! (provider, implementation, shape[, part]) measured at the same M values with the same repeat
//! counts on both sides, the comparison adds a derived metric
//! `kernels/<provider>/<impl>/<shape>/all_m[/<part>]/time_s` whose run-level value is the mean
//! of the M values' `y` (the log of the geometric mean of their medians). It is judged like any
//! other metric (its own family, counted in `m`).

use serde::{Deserialize, Serialize};
use statrs::distribution::{ChiSquared, ContinuousCDF, Normal, StudentsT};

use crate::report::schema::RunSpread;

/// Fewest samples for a within-run standard error of a median (McKean–Schrader needs a few
/// order statistics on each side of the middle). A one-repeat side with fewer samples cannot be
/// judged ("too few samples").
pub const MIN_SAMPLES: usize = 5;

/// Smallest standard deviation of `ln median` assumed for any metric (0.01%): two runs whose
/// medians are bit-identical do not prove a zero variance (the timer has a resolution).
pub const MIN_SD_LOG: f64 = 1e-4;

/// Smallest family for an empirical null (robust spread of the changes across the family).
pub const MIN_NULL_FAMILY: usize = 10;

/// Smallest number of metrics with a between-run variance for a family prior.
pub const MIN_PRIOR_FAMILY: usize = 3;

/// The relative change `current / baseline − 1` with its interval (dimensionless; +0.10 = 10%
/// larger).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ChangeInterval {
    /// `exp(d) − 1`: the ratio of the geometric means of the repeats' medians, minus one (the
    /// ratio of the medians for one repeat per side).
    pub point: f64,
    /// Lower end of the interval.
    pub lo: f64,
    /// Upper end of the interval.
    pub hi: f64,
    /// Two-sided confidence of this metric's interval (`1 − α/m`, Bonferroni).
    pub confidence: f64,
    /// Degrees of freedom of the t quantile (`None`: normal quantile).
    #[serde(default)]
    pub df: Option<f64>,
    /// Standard error of `d = ln(1 + point)`.
    #[serde(default)]
    pub se_log: f64,
    /// What the variance rests on.
    #[serde(default)]
    pub basis: Basis,
}

/// What a metric's variance rests on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Basis {
    /// Only the within-run noise of the medians (no repeats, no stored spread, no family
    /// prior): run-to-run drift is not accounted for.
    #[default]
    WithinRun,
    /// The between-run variance of the repeats, moderated by the family prior.
    BetweenRun {
        /// Degrees of freedom from this metric's own repeats (and stored spread).
        own_df: usize,
        /// Prior degrees of freedom `d0` (`None`: no family prior).
        prior_df: Option<f64>,
        /// The moderated between-run standard deviation of `ln median`.
        sd_log: f64,
    },
}

/// Why a metric has no interval.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntervalError {
    /// Fewer than [`MIN_SAMPLES`] on a side measured once.
    #[error("too few samples (baseline {baseline}, current {current}; need at least {MIN_SAMPLES} on each side, or repeats)")]
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
}

/// One side of a timing metric at the run level.
#[derive(Debug, Clone, PartialEq)]
pub struct SideStats {
    /// `ln median` of each repeat.
    pub y: Vec<f64>,
    /// Within-run variance of each repeat's `ln median` (`None` below [`MIN_SAMPLES`]).
    pub within: Vec<Option<f64>>,
    /// Samples in all repeats.
    pub n: usize,
    /// Median of all samples pooled (for display).
    pub pooled_median: f64,
    /// The slot of each repeat: the rank of the metric's implementation in that repeat's
    /// implementation order (`report --repeats` rotates it) among the implementations the run
    /// timed; empty when unknown. See [`Paired::slot_fit`].
    pub slots: Vec<usize>,
}

/// Standard normal quantile `z_p`.
pub fn z(p: f64) -> f64 {
    Normal::standard().inverse_cdf(p)
}

/// The quantile of Student's t with `df` degrees of freedom (`None` or ≥ 1e6: normal).
pub fn t_quantile(p: f64, df: Option<f64>) -> f64 {
    match df {
        Some(d) if d.is_finite() && d > 0.0 && d < 1e6 => StudentsT::new(0.0, 1.0, d)
            .map(|t| t.inverse_cdf(p))
            .unwrap_or_else(|_| z(p)),
        _ => z(p),
    }
}

fn median_sorted(v: &[f64]) -> f64 {
    crate::stats::percentile_sorted(v, 50.0)
}

/// McKean–Schrader standard error of the median of `sorted` (ascending, n ≥ [`MIN_SAMPLES`]).
pub fn median_se(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    if n < MIN_SAMPLES {
        return None;
    }
    let z975 = 1.959_963_984_540_054;
    let c = (((n as f64 + 1.0) / 2.0) - z975 * (n as f64 / 4.0).sqrt()).round();
    let c = (c as usize).clamp(1, n.div_ceil(2));
    Some((sorted[n - c] - sorted[c - 1]) / (2.0 * z975))
}

/// Whether `sizes` (samples per repeat, from `kernels.repeats`) splits `n` samples into
/// non-empty repeats: at least one size, none zero, summing to `n` (a sum that overflows does
/// not add up).
pub fn sizes_add_up(n: usize, sizes: &[usize]) -> bool {
    !sizes.is_empty()
        && !sizes.contains(&0)
        && sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s)) == Some(n)
}

/// Split `samples` into repeats of `sizes` (one repeat when `sizes` is empty or does not add up
/// to the sample count).
pub fn split_repeats<'a>(samples: &'a [f64], sizes: &[usize]) -> Vec<&'a [f64]> {
    if sizes.len() < 2 || !sizes_add_up(samples.len(), sizes) {
        return vec![samples];
    }
    let mut out = Vec::with_capacity(sizes.len());
    let mut at = 0;
    for &s in sizes {
        out.push(&samples[at..at + s]);
        at += s;
    }
    out
}

impl SideStats {
    /// From all samples of a side and the sizes of its repeats (see [`split_repeats`]).
    ///
    /// # Errors
    /// A sample that is not finite and positive (`side` names the side in the error).
    pub fn of(samples: &[f64], sizes: &[usize], side: &'static str) -> Result<Self, IntervalError> {
        if samples.is_empty() || !samples.iter().all(|x| x.is_finite() && *x > 0.0) {
            return Err(IntervalError::InvalidSample { side });
        }
        let mut y = Vec::new();
        let mut within = Vec::new();
        for rep in split_repeats(samples, sizes) {
            let mut l: Vec<f64> = rep.iter().map(|x| x.ln()).collect();
            l.sort_by(|a, b| a.total_cmp(b));
            y.push(median_sorted(&l));
            within.push(median_se(&l).map(|s| s * s));
        }
        let mut all = samples.to_vec();
        all.sort_by(|a, b| a.total_cmp(b));
        Ok(Self {
            y,
            within,
            n: samples.len(),
            pooled_median: median_sorted(&all),
            slots: Vec::new(),
        })
    }

    /// The same side with the slot of each repeat (ignored unless there is one per repeat).
    pub fn with_slots(mut self, slots: &[usize]) -> Self {
        if slots.len() == self.y.len() {
            self.slots = slots.to_vec();
        }
        self
    }

    /// Repeats.
    pub fn repeats(&self) -> usize {
        self.y.len()
    }

    /// Mean of the repeats' `ln median`.
    pub fn mean(&self) -> f64 {
        self.y.iter().sum::<f64>() / self.y.len() as f64
    }

    /// The spread of the repeats (at least two).
    pub fn spread(&self) -> Option<RunSpread> {
        let r = self.y.len();
        if r < 2 {
            return None;
        }
        let m = self.mean();
        let ss: f64 = self.y.iter().map(|v| (v - m) * (v - m)).sum();
        Some(RunSpread {
            sd_log: (ss / (r - 1) as f64).sqrt(),
            df: r - 1,
        })
    }

    /// Mean within-run variance of the repeats' `ln median` (over repeats where it is known).
    pub fn within_mean(&self) -> Option<f64> {
        let v: Vec<f64> = self.within.iter().flatten().copied().collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }
}

/// A metric ready to be judged: both sides at the run level.
#[derive(Debug, Clone, PartialEq)]
pub struct Paired {
    /// Baseline.
    pub b: SideStats,
    /// Current.
    pub c: SideStats,
    /// The baseline's stored between-run spread, if any (stands for its repeats in the plain
    /// model; not used when the slots are fitted, whose fit holds the baseline's repeats).
    pub b_stored: Option<RunSpread>,
    /// [`Paired::slot_fit`], computed once by [`Paired::new`].
    fit: Option<SlotFit>,
}

/// The fit of one metric's repeats with the repeat *slot* as a block factor (see
/// [`Paired::slot_fit`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlotFit {
    /// The slot-adjusted change `d = μ_c − μ_b` (log scale).
    pub d: f64,
    /// `Var(d̂) / σ²`: `(XᵀX)⁻¹` at the contrast (`1/R_b + 1/R_c` when both sides hold the slots
    /// in the same proportions).
    pub factor: f64,
    /// Residual sum of squares.
    pub rss: f64,
    /// Residual degrees of freedom: repeats of both sides − distinct slots − 1 (at least 1).
    pub df: usize,
}

impl Paired {
    /// Both sides of a metric, with the slot fit computed once (see [`Paired::slot_fit`]).
    pub fn new(b: SideStats, c: SideStats, b_stored: Option<RunSpread>) -> Self {
        let fit = fit_slots(&b, &c);
        Self {
            b,
            c,
            b_stored,
            fit,
        }
    }

    /// The two-way fit `y = μ_side + π_slot + e` of the repeats' `ln median`, by least squares:
    /// `report --repeats` rotates the implementation order from one repeat to the next, and a
    /// case's time depends on its position in the order (on the H200, by up to 3-6% for the
    /// case timed first after a shape's weights are prepared: `docs/gate.md`). Fitting the slot
    /// as a block factor compares the sides like with like (only slots present on both sides
    /// inform `d`) and keeps the position effect out of the between-run variance.
    ///
    /// `None` when either side lacks slots, the sides share no slot, or no residual degree of
    /// freedom is left (repeats of both sides ≤ distinct slots + 1).
    pub fn slot_fit(&self) -> Option<SlotFit> {
        self.fit
    }

    /// `d = mean y_c − mean y_b`, slot-adjusted when both sides have slots
    /// ([`Paired::slot_fit`]).
    pub fn d(&self) -> f64 {
        match self.slot_fit() {
            Some(f) => f.d,
            None => self.c.mean() - self.b.mean(),
        }
    }

    /// `se(d)/σ`: `√(1/R_b + 1/R_c)`, or the slot fit's `√factor`.
    pub fn scale(&self) -> f64 {
        match self.slot_fit() {
            Some(f) => f.factor.sqrt(),
            None => (1.0 / self.b.repeats() as f64 + 1.0 / self.c.repeats() as f64).sqrt(),
        }
    }

    /// This metric's own pooled between-run variance of `ln median` and its degrees of freedom
    /// (`None` without repeats or a stored spread), floored at the within-run variance. With
    /// slots on both sides it is the slot fit's residual variance (the baseline's stored spread
    /// is then not used: the baseline's repeats are in the fit).
    pub fn own_variance(&self) -> Option<(f64, usize)> {
        if let Some(f) = self.slot_fit() {
            return Some(((f.rss / f.df as f64).max(self.within_floor()), f.df));
        }
        let mut parts: Vec<(f64, usize)> = Vec::new();
        if let Some(s) = self.b_stored.filter(|s| s.df > 0) {
            parts.push((s.sd_log * s.sd_log, s.df));
        } else if let Some(s) = self.b.spread() {
            parts.push((s.sd_log * s.sd_log, s.df));
        }
        if let Some(s) = self.c.spread() {
            parts.push((s.sd_log * s.sd_log, s.df));
        }
        let df: usize = parts.iter().map(|p| p.1).sum();
        if df == 0 {
            return None;
        }
        let v = parts.iter().map(|(v, d)| v * *d as f64).sum::<f64>() / df as f64;
        Some((v.max(self.within_floor()), df))
    }

    /// The larger within-run variance of the two sides' medians (at least [`MIN_SD_LOG`]²).
    pub fn within_floor(&self) -> f64 {
        self.b
            .within_mean()
            .unwrap_or(0.0)
            .max(self.c.within_mean().unwrap_or(0.0))
            .max(MIN_SD_LOG * MIN_SD_LOG)
    }

    /// The standard error of `d` and the degrees of freedom of its quantile, given the family
    /// prior; `None` when nothing is known (one repeat with too few samples on a side).
    pub fn estimate(
        &self,
        prior: Option<Prior>,
    ) -> Result<(f64, Option<f64>, Basis), IntervalError> {
        let (rb, rc) = (self.b.repeats() as f64, self.c.repeats() as f64);
        let own = self.own_variance();
        let moderated = match (own, prior) {
            (Some((v, df)), Some(p)) => {
                let (var, dfe) = match p.d0 {
                    Some(d0) => (
                        ((d0 * p.s0_sq + df as f64 * v) / (d0 + df as f64)).max(v),
                        Some(d0 + df as f64),
                    ),
                    None => (p.s0_sq, None),
                };
                Some((var, dfe, df, p.d0))
            }
            (Some((v, df)), None) => Some((v, Some(df as f64), df, None)),
            (None, Some(p)) => Some((p.s0_sq, p.d0, 0, p.d0)),
            (None, None) => None,
        };
        match moderated {
            Some((var, dfe, own_df, prior_df)) => {
                let wb = self.b.within_mean().unwrap_or(0.0);
                let wc = self.c.within_mean().unwrap_or(0.0);
                let var = var.max(MIN_SD_LOG * MIN_SD_LOG);
                let se2 = match self.slot_fit() {
                    Some(f) => var.max(wb).max(wc) * f.factor,
                    None => var.max(wb) / rb + var.max(wc) / rc,
                };
                Ok((
                    se2.sqrt(),
                    dfe,
                    Basis::BetweenRun {
                        own_df,
                        prior_df,
                        sd_log: var.sqrt(),
                    },
                ))
            }
            None => {
                let too_few = || IntervalError::TooFewSamples {
                    baseline: self.b.n,
                    current: self.c.n,
                };
                let wb = self.b.within_mean().ok_or_else(too_few)?;
                let wc = self.c.within_mean().ok_or_else(too_few)?;
                let se2 = match self.slot_fit() {
                    Some(f) => wb.max(wc) * f.factor,
                    None => wb / rb + wc / rc,
                };
                let n_min = self.b.n.min(self.c.n);
                Ok((
                    se2.sqrt().max(MIN_SD_LOG),
                    Some((n_min - 1) as f64),
                    Basis::WithinRun,
                ))
            }
        }
    }
}

/// [`Paired::slot_fit`] of the two sides.
fn fit_slots(b: &SideStats, c: &SideStats) -> Option<SlotFit> {
    if b.slots.len() != b.y.len() || c.slots.len() != c.y.len() || b.y.is_empty() {
        return None;
    }
    if c.y.is_empty() || !b.slots.iter().any(|s| c.slots.contains(s)) {
        return None;
    }
    let mut levels: Vec<usize> = b.slots.iter().chain(&c.slots).copied().collect();
    levels.sort_unstable();
    levels.dedup();
    // Parameters: μ_b, μ_c, then π of every slot but the first.
    let k = levels.len() + 1;
    let rows: Vec<(Vec<f64>, f64)> = [(0usize, b), (1, c)]
        .into_iter()
        .flat_map(|(side, st)| {
            let levels = &levels;
            st.y.iter().zip(&st.slots).map(move |(y, s)| {
                let mut x = vec![0.0; k];
                x[side] = 1.0;
                let li = levels.binary_search(s).unwrap_or(0);
                if li > 0 {
                    x[1 + li] = 1.0;
                }
                (x, *y)
            })
        })
        .collect();
    let mut xtx = vec![vec![0.0; k]; k];
    let mut xty = vec![0.0; k];
    for (x, y) in &rows {
        for i in 0..k {
            xty[i] += x[i] * y;
            for j in 0..k {
                xtx[i][j] += x[i] * x[j];
            }
        }
    }
    // No residual degree of freedom: the fit would know d but not its variance; the plain
    // model (with a stored spread, the family prior) then decides d and its variance together.
    if rows.len() <= k {
        return None;
    }
    let inv = invert(xtx)?;
    let theta: Vec<f64> = inv
        .iter()
        .map(|r| r.iter().zip(&xty).map(|(a, b)| a * b).sum())
        .collect();
    let rss = rows
        .iter()
        .map(|(x, y)| {
            let f: f64 = x.iter().zip(&theta).map(|(a, b)| a * b).sum();
            (y - f) * (y - f)
        })
        .sum();
    Some(SlotFit {
        d: theta[1] - theta[0],
        factor: inv[0][0] + inv[1][1] - 2.0 * inv[0][1],
        rss,
        df: rows.len().saturating_sub(k),
    })
}

/// The inverse of a small symmetric positive-definite matrix (Gauss–Jordan with partial
/// pivoting); `None` when it is singular.
fn invert(mut a: Vec<Vec<f64>>) -> Option<Vec<Vec<f64>>> {
    let n = a.len();
    let mut inv: Vec<Vec<f64>> = (0..n)
        .map(|i| (0..n).map(|j| f64::from(u8::from(i == j))).collect())
        .collect();
    for col in 0..n {
        let piv = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[piv][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, piv);
        inv.swap(col, piv);
        let p = a[col][col];
        for j in 0..n {
            a[col][j] /= p;
            inv[col][j] /= p;
        }
        for i in 0..n {
            if i != col {
                let f = a[i][col];
                if f != 0.0 {
                    for j in 0..n {
                        a[i][j] -= f * a[col][j];
                        inv[i][j] -= f * inv[col][j];
                    }
                }
            }
        }
    }
    Some(inv)
}

/// A family's prior for the between-run variance of `ln median`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Prior {
    /// Prior variance `s0²`.
    pub s0_sq: f64,
    /// Prior degrees of freedom `d0` (`None`: infinite, the family variance is taken as known).
    pub d0: Option<f64>,
}

/// Trigamma ψ′(x) for x > 0 (recurrence to x ≥ 10, then the asymptotic series).
pub fn trigamma(mut x: f64) -> f64 {
    let mut acc = 0.0;
    while x < 10.0 {
        acc += 1.0 / (x * x);
        x += 1.0;
    }
    let x2 = 1.0 / (x * x);
    acc + 1.0 / x
        + x2 / 2.0
        + (1.0 / 6.0 - x2 * (1.0 / 30.0 - x2 * (1.0 / 42.0 - x2 / 30.0))) / (x * x * x)
}

/// Tetragamma ψ″(x) for x > 0 (recurrence to x ≥ 10, then the asymptotic series).
pub fn tetragamma(mut x: f64) -> f64 {
    let mut acc = 0.0;
    while x < 10.0 {
        acc -= 2.0 / (x * x * x);
        x += 1.0;
    }
    let x2 = 1.0 / (x * x);
    acc - x2 - x2 / x - x2 * x2 * (0.5 - x2 * (1.0 / 6.0 - x2 * (1.0 / 6.0 - x2 * 3.0 / 10.0)))
}

/// The inverse of trigamma for y > 0 (Smyth 2004, appendix: Newton's method on 1/ψ′).
pub fn trigamma_inverse(y: f64) -> f64 {
    if y > 1e7 {
        return 1.0 / y.sqrt();
    }
    if y < 1e-6 {
        return 1.0 / y;
    }
    let mut x = 0.5 + 1.0 / y;
    for _ in 0..100 {
        let tri = trigamma(x);
        let dif = tri * (1.0 - tri / y) / tetragamma(x);
        x += dif;
        if -dif / x < 1e-8 {
            break;
        }
    }
    x
}

/// Smyth's (2004, §6) estimate of the prior `(s0², d0)` from per-metric variances `s_i²` with
/// `df_i` degrees of freedom. `None` below [`MIN_PRIOR_FAMILY`] metrics.
pub fn smyth_prior(vars: &[(f64, usize)]) -> Option<Prior> {
    let v: Vec<(f64, f64)> = vars
        .iter()
        .filter(|(s2, df)| *df > 0 && s2.is_finite() && *s2 > 0.0)
        .map(|(s2, df)| (*s2, *df as f64))
        .collect();
    let n = v.len();
    if n < MIN_PRIOR_FAMILY {
        return None;
    }
    let digamma = statrs::function::gamma::digamma;
    let e: Vec<f64> = v
        .iter()
        .map(|(s2, d)| s2.ln() - digamma(d / 2.0) + (d / 2.0).ln())
        .collect();
    let emean = e.iter().sum::<f64>() / n as f64;
    let evar = e.iter().map(|x| (x - emean) * (x - emean)).sum::<f64>() / (n - 1) as f64;
    let tri_mean = v.iter().map(|(_, d)| trigamma(d / 2.0)).sum::<f64>() / n as f64;
    let rhs = evar - tri_mean;
    if rhs <= 0.0 {
        // The variances scatter no more than sampling alone explains: one common variance.
        return Some(Prior {
            s0_sq: emean.exp(),
            d0: None,
        });
    }
    let d0 = 2.0 * trigamma_inverse(rhs);
    let s0_sq = (emean + digamma(d0 / 2.0) - (d0 / 2.0).ln()).exp();
    Some(Prior {
        s0_sq,
        d0: Some(d0),
    })
}

/// The median of the chi-square distribution with `df` degrees of freedom over `df` (the
/// median of `s²/σ²`), used to un-bias a median of variances.
pub fn chi2_median_ratio(df: usize) -> f64 {
    ChiSquared::new(df as f64)
        .map(|c| c.inverse_cdf(0.5) / df as f64)
        .unwrap_or(1.0)
}

/// The empirical-null variance of a family: (1.4826 × MAD of `d_i / scale_i`)², from
/// `(d_i, scale_i)` pairs; `None` below [`MIN_NULL_FAMILY`] metrics.
pub fn empirical_null(ds: &[(f64, f64)]) -> Option<f64> {
    if ds.len() < MIN_NULL_FAMILY {
        return None;
    }
    let mut zs: Vec<f64> = ds.iter().map(|(d, s)| d / s).collect();
    zs.sort_by(|a, b| a.total_cmp(b));
    let med = median_sorted(&zs);
    let mut dev: Vec<f64> = zs.iter().map(|x| (x - med).abs()).collect();
    dev.sort_by(|a, b| a.total_cmp(b));
    let s = 1.4826 * median_sorted(&dev);
    Some(s * s)
}

/// The prior of a family from its metrics: Smyth's estimate from the metrics with their own
/// between-run variance, floored by the family's empirical null (when the family is large
/// enough). With only an empirical null, `d0` is the family size − 1.
pub fn family_prior(members: &[&Paired]) -> Option<Prior> {
    let vars: Vec<(f64, usize)> = members.iter().filter_map(|p| p.own_variance()).collect();
    let smyth = smyth_prior(&vars);
    let null = empirical_null(
        &members
            .iter()
            .map(|p| (p.d(), p.scale()))
            .collect::<Vec<_>>(),
    );
    match (smyth, null) {
        (Some(p), Some(nv)) if nv > p.s0_sq => Some(Prior { s0_sq: nv, ..p }),
        (Some(p), _) => Some(p),
        (None, Some(nv)) if !vars.is_empty() || members.len() >= MIN_NULL_FAMILY => Some(Prior {
            s0_sq: nv.max(MIN_SD_LOG * MIN_SD_LOG),
            d0: Some((members.len() - 1) as f64),
        }),
        _ => None,
    }
}

/// The interval of one metric at two-sided confidence `1 − alpha/m`.
pub fn interval(
    p: &Paired,
    prior: Option<Prior>,
    alpha: f64,
    m: usize,
) -> Result<ChangeInterval, IntervalError> {
    let (se, df, basis) = p.estimate(prior)?;
    let level = 1.0 - alpha / m.max(1) as f64;
    let q = t_quantile(1.0 - (1.0 - level) / 2.0, df);
    let d = p.d();
    Ok(ChangeInterval {
        point: d.exp() - 1.0,
        lo: (d - q * se).exp() - 1.0,
        hi: (d + q * se).exp() - 1.0,
        confidence: level,
        df,
        se_log: se,
        basis,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(y: &[f64], slots: &[usize]) -> SideStats {
        SideStats {
            y: y.to_vec(),
            within: vec![None; y.len()],
            n: 20 * y.len(),
            pooled_median: 1.0,
            slots: slots.to_vec(),
        }
    }

    #[test]
    fn slot_fit_compares_like_with_like() {
        // Slot 1 is 5% slower than slot 0 on both sides; the current side is 10% slower.
        // Baseline slots 0, 1, 0, 1 (balanced), current slots 0, 1.
        let (s1, up) = (0.05f64.ln_1p(), 0.10f64.ln_1p());
        let p = Paired::new(
            side(&[0.0, s1, 0.0, s1], &[0, 1, 0, 1]),
            side(&[up, up + s1], &[0, 1]),
            None,
        );
        let f = p.slot_fit().expect("shared slots");
        assert!((f.d - up).abs() < 1e-12, "{f:?}");
        assert!(f.rss < 1e-20);
        assert_eq!(f.df, 6 - 3);
        assert!((f.factor - (1.0 / 4.0 + 1.0 / 2.0)).abs() < 1e-12);
        // Unbalanced: baseline slots 0, 1, 2, 0, current slots 0, 1 (slot 2 only in the
        // baseline). The plain mean is biased by the slot effects; the fit is not.
        let (s2, noise) = (-0.04f64, 0.003);
        let p = Paired::new(
            side(&[noise, s1, s2, -noise], &[0, 1, 2, 0]),
            side(&[up, up + s1], &[0, 1]),
            None,
        );
        let f = p.slot_fit().expect("shared slots");
        assert!((f.d - up).abs() < 1e-12, "{f:?}");
        assert_eq!(f.df, 6 - 4);
        assert!((p.d() - up).abs() < 1e-12);
        let plain = p.c.mean() - p.b.mean();
        assert!((plain - up).abs() > 0.01, "plain {plain}");
        // The residual variance holds the noise only: 2·noise² over 2 df.
        let (v, df) = p.own_variance().unwrap();
        assert_eq!(df, 2);
        assert!((v - noise * noise).abs() < 1e-12, "{v}");
        // No shared slot, or no slots on a side: no fit (the plain model).
        let q = Paired::new(side(&[0.0, s1], &[0, 1]), side(&[up], &[2]), None);
        assert!(q.slot_fit().is_none());
        let q = Paired::new(side(&[0.0, s1], &[]), side(&[up, up], &[0, 1]), None);
        assert!(q.slot_fit().is_none());
        assert!((q.d() - (up - s1 / 2.0)).abs() < 1e-12);
    }

    #[test]
    fn trigamma_and_its_inverse() {
        // ψ″(1) = −2ζ(3).
        assert!((tetragamma(1.0) + 2.0 * 1.202_056_903_159_594).abs() < 1e-9);
        // ψ′(1) = π²/6, ψ′(1/2) = π²/2.
        let pi2 = std::f64::consts::PI * std::f64::consts::PI;
        assert!((trigamma(1.0) - pi2 / 6.0).abs() < 1e-10);
        assert!((trigamma(0.5) - pi2 / 2.0).abs() < 1e-10);
        for x in [0.05, 0.3, 1.0, 2.5, 10.0, 200.0] {
            let y = trigamma(x);
            assert!((trigamma_inverse(y) - x).abs() < 1e-6 * x.max(1.0), "{x}");
        }
    }

    #[test]
    fn median_se_matches_mckean_schrader() {
        // n = 10: c = round(5.5 − 1.96·1.581) = round(2.40) = 2 → (x(9) − x(2)) / 3.92.
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert!((median_se(&v).unwrap() - 7.0 / (2.0 * 1.959_963_984_540_054)).abs() < 1e-12);
        assert_eq!(median_se(&v[..4]), None);
    }

    #[test]
    fn repeats_split_only_when_sizes_add_up() {
        assert!(!sizes_add_up(3, &[usize::MAX, 1, 3]));
        assert_eq!(split_repeats(&[1.0, 2.0, 3.0], &[usize::MAX, 4]).len(), 1);
        let s = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(split_repeats(&s, &[2, 2]).len(), 2);
        assert_eq!(split_repeats(&s, &[3, 2]).len(), 1);
        assert_eq!(split_repeats(&s, &[4]).len(), 1);
        let st = SideStats::of(&s, &[2, 2], "baseline").unwrap();
        assert_eq!(st.repeats(), 2);
        assert!((st.y[0] - (1.5f64.ln() + 0.0).max((1.0f64 * 2.0).sqrt().ln())).abs() < 0.5);
        assert!(SideStats::of(&[1.0, -1.0], &[], "current").is_err());
    }

    #[test]
    fn smyth_prior_recovers_a_common_variance() {
        // Variances that scatter exactly as χ²/df around σ² = 1e-4 (quantiles, df = 4): the
        // prior is close to 1e-4 with a large d0.
        let df = 4usize;
        let chi = ChiSquared::new(df as f64).unwrap();
        let vars: Vec<(f64, usize)> = (1..200)
            .map(|i| (1e-4 * chi.inverse_cdf(i as f64 / 200.0) / df as f64, df))
            .collect();
        let p = smyth_prior(&vars).unwrap();
        assert!((p.s0_sq / 1e-4 - 1.0).abs() < 0.1, "{p:?}");
        assert!(p.d0.is_none_or(|d| d > 20.0), "{p:?}");
        // Heterogeneous variances: a finite d0.
        let het: Vec<(f64, usize)> = (0..60)
            .map(|i| (1e-4 * (1.0 + (i % 6) as f64 * 3.0), df))
            .collect();
        let p = smyth_prior(&het).unwrap();
        assert!(p.d0.is_some_and(|d| d < 50.0), "{p:?}");
        assert!(smyth_prior(&vars[..2]).is_none());
    }

    #[test]
    fn empirical_null_is_robust_to_a_minority() {
        let mut ds: Vec<(f64, f64)> = (0..40)
            .map(|i| (0.01 * ((i % 9) as f64 - 4.0) / 4.0, 1.0))
            .collect();
        let base = empirical_null(&ds).unwrap();
        for d in ds.iter_mut().take(5) {
            d.0 += 0.10;
        }
        let planted = empirical_null(&ds).unwrap();
        assert!(planted < 2.0 * base, "{base} {planted}");
        assert!(empirical_null(&ds[..5]).is_none());
    }
}
