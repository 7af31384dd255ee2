//! Per-metric verdicts: a baseline [`Metric`] against the current one.
//!
//! Timing samples ([`MetricValue::Samples`]): the interval of the relative change (see
//! [`super::gate`]: repeats, between-run variance, Bonferroni over the `m` timing metrics of the
//! comparison) is set against a noise threshold `t`. For a lower-is-better metric (a time):
//!
//! - **Regressed** when the whole interval lies above `+t`;
//! - **Improved** when the whole interval lies below `−t`;
//! - **Same** when the whole interval lies within `[−t, +t]`;
//! - **Not enough samples** when the interval is wider than `±t` (the data cannot decide at
//!   this threshold: more requests, samples or repeats would; the note says about how many);
//! - **Ambiguous** otherwise (the interval straddles the threshold), when either side has too
//!   few or invalid samples, or when the conditions differ.
//!
//! (Mirrored for higher-is-better.) `rigbench compare --confirm` turns a Regressed kernel
//! timing that does not reproduce on re-measurement into **Not reproduced**.
//!
//! Deterministic values ([`MetricValue::Value`]) are compared against their own tolerance, and
//! labels ([`MetricValue::Label`]) exactly or by their rank.

use std::collections::BTreeMap;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::gate::{self, Basis, ChangeInterval, Paired, Prior, SideStats};
use super::metric::{Direction, Group, Metric, MetricValue, Tolerance, Unit};

/// Default noise threshold of kernel timings: 2%.
pub const DEFAULT_THRESHOLD_KERNELS: f64 = 0.02;
/// Default noise threshold of end-to-end (and any other non-kernel) timings: 5%.
pub const DEFAULT_THRESHOLD_E2E: f64 = 0.05;
/// Default family-wise confidence: the probability that every timing interval of a comparison
/// covers its true change (Bonferroni over the comparison's timing metrics).
pub const DEFAULT_CONFIDENCE: f64 = 0.95;

/// The outcome for one metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Worse beyond the noise threshold (or past its tolerance), with the stated confidence.
    Regressed,
    /// In the baseline, absent from the results.
    Missing,
    /// The data cannot tell (interval straddles the threshold, too few samples, conditions
    /// differ).
    Ambiguous,
    /// Flagged as regressed, but `--confirm` re-measured it and the slowdown did not reproduce
    /// (not a failure).
    NotReproduced,
    /// The interval is wider than the noise threshold: the data cannot decide at this
    /// threshold (more samples, requests or repeats would); not a failure.
    NotEnoughSamples,
    /// Better beyond the noise threshold, with the stated confidence.
    Improved,
    /// In the results, absent from the baseline.
    New,
    /// Within the noise threshold (or equal within its tolerance).
    Same,
}

impl Verdict {
    /// Whether this verdict fails a CI gate (exit code 2): regressed or missing.
    pub fn is_failure(self) -> bool {
        matches!(self, Verdict::Regressed | Verdict::Missing)
    }

    /// Display name (`Regressed`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Regressed => "Regressed",
            Verdict::Missing => "Missing",
            Verdict::Ambiguous => "Ambiguous",
            Verdict::NotReproduced => "Not reproduced",
            Verdict::NotEnoughSamples => "Not enough samples",
            Verdict::Improved => "Improved",
            Verdict::New => "New",
            Verdict::Same => "Same",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A per-metric threshold override: `GLOB=PERCENT` (e.g. `kernels/*/w4a4/*=5`).
///
/// The glob matches the whole metric id; `*` matches any run of characters (including `/`) and
/// `?` one character. The value is in percent (a trailing `%` is allowed).
#[derive(Debug, Clone, Serialize)]
pub struct MetricThreshold {
    /// The glob as given.
    pub glob: String,
    /// Threshold as a fraction (0.05 = 5%).
    pub threshold: f64,
    #[serde(skip)]
    regex: regex::Regex,
}

impl MetricThreshold {
    /// Build from a glob and a threshold fraction.
    ///
    /// # Errors
    /// An empty glob.
    pub fn new(glob: &str, threshold: f64) -> Result<Self, String> {
        if glob.is_empty() {
            return Err("empty glob".into());
        }
        let mut re = String::from("^");
        for ch in glob.chars() {
            match ch {
                '*' => re.push_str(".*"),
                '?' => re.push('.'),
                c => re.push_str(&regex::escape(&c.to_string())),
            }
        }
        re.push('$');
        let regex = regex::Regex::new(&re).map_err(|e| format!("bad glob '{glob}': {e}"))?;
        Ok(Self {
            glob: glob.to_string(),
            threshold,
            regex,
        })
    }

    /// Whether the glob matches the whole of `id`.
    pub fn matches(&self, id: &str) -> bool {
        self.regex.is_match(id)
    }
}

impl FromStr for MetricThreshold {
    type Err = String;
    /// Parse `GLOB=PERCENT`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (glob, value) = s
            .rsplit_once('=')
            .ok_or_else(|| format!("'{s}' is not GLOB=PERCENT (e.g. 'kernels/*/w4a4/*=5')"))?;
        Self::new(glob.trim(), parse_percent(value)?)
    }
}

/// A planted change, for measuring the gate's detection rate only (`rigbench compare --plant
/// GLOB=PERCENT`, refused unless `RIGBENCH_TEST_HOOKS=1`): every sample of the timing metrics
/// of the *results* whose id matches GLOB (and of their `--confirm` re-measurements) is
/// multiplied by `1 + PERCENT/100` before comparing, as a code change making them that much
/// slower would. The comparison records it in its settings and says so at the top.
#[derive(Debug, Clone, Serialize)]
pub struct Plant {
    /// The glob as given.
    pub glob: String,
    /// The change, as a fraction (0.10 = 10% slower).
    pub change: f64,
    #[serde(skip)]
    target: MetricThreshold,
}

impl FromStr for Plant {
    type Err = String;
    /// Parse `GLOB=PERCENT` (the percent may be negative: a speed-up).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (glob, value) = s.rsplit_once('=').ok_or_else(|| {
            format!("'{s}' is not GLOB=PERCENT (e.g. 'kernels/rigbench/w4a16/gate_up/*=10')")
        })?;
        let v: f64 = value
            .trim()
            .trim_end_matches('%')
            .parse()
            .map_err(|_| format!("'{value}' is not a percentage"))?;
        if !v.is_finite() || v <= -100.0 || v > 1000.0 {
            return Err(format!(
                "'{value}': a planted change must be in (-100, 1000] percent"
            ));
        }
        Ok(Plant {
            glob: glob.trim().to_string(),
            change: v / 100.0,
            target: MetricThreshold::new(glob.trim(), v / 100.0)?,
        })
    }
}

/// Apply `plants` to `metrics` (see [`Plant`]); returns the ids changed.
pub fn apply_plants(metrics: &mut [Metric], plants: &[Plant]) -> Vec<String> {
    let mut changed = Vec::new();
    for m in metrics.iter_mut() {
        let Some(p) = plants.iter().rev().find(|p| p.target.matches(&m.id)) else {
            continue;
        };
        if let MetricValue::Samples { samples, .. } = &mut m.value {
            for x in samples.iter_mut() {
                *x *= 1.0 + p.change;
            }
            changed.push(m.id.clone());
        }
    }
    changed
}

/// Parse a threshold in percent (`2`, `2.5`, `2%`) into a fraction; must be finite, ≥ 0 and
/// < 1000.
pub fn parse_percent(s: &str) -> Result<f64, String> {
    let t = s.trim().trim_end_matches('%').trim();
    let v: f64 = t
        .parse()
        .map_err(|_| format!("'{s}' is not a percentage (e.g. 2 or 2.5%)"))?;
    if !v.is_finite() || !(0.0..1000.0).contains(&v) {
        return Err(format!(
            "'{s}': a threshold must be between 0 and 1000 percent"
        ));
    }
    Ok(v / 100.0)
}

/// How timings are judged.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// Noise threshold of `kernels/*` timing metrics, as a fraction.
    pub threshold_kernels: f64,
    /// Noise threshold of every other timing metric (end-to-end), as a fraction.
    pub threshold_e2e: f64,
    /// Per-metric overrides; the last one whose glob matches wins.
    pub metric_thresholds: Vec<MetricThreshold>,
    /// Family-wise confidence in (0, 1): each of the `m` timing intervals of a comparison is
    /// built at `1 − (1 − confidence)/m` (Bonferroni).
    pub confidence: f64,
    /// Compare only metrics whose verdict does not depend on timing (values and labels, see
    /// [`super::Metric::is_deterministic`]); timing metrics are listed as not compared, never
    /// as missing (`rigbench compare --deterministic-only`, what CI runs on a CPU-only host).
    pub deterministic_only: bool,
    /// Planted changes (test hook, see [`Plant`]); empty in real use.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub plants: Vec<Plant>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            threshold_kernels: DEFAULT_THRESHOLD_KERNELS,
            threshold_e2e: DEFAULT_THRESHOLD_E2E,
            metric_thresholds: Vec::new(),
            confidence: DEFAULT_CONFIDENCE,
            deterministic_only: false,
            plants: Vec::new(),
        }
    }
}

impl Settings {
    /// The noise threshold (fraction) for a timing metric.
    pub fn threshold_for(&self, id: &str, group: Group) -> f64 {
        self.metric_thresholds
            .iter()
            .rev()
            .find(|m| m.matches(id))
            .map(|m| m.threshold)
            .unwrap_or(match group {
                Group::Kernels => self.threshold_kernels,
                _ => self.threshold_e2e,
            })
    }

    /// `α = 1 − confidence`, the family-wise error rate.
    pub fn alpha(&self) -> f64 {
        1.0 - self.confidence
    }
}

fn one() -> usize {
    1
}

/// What one side showed, for display and JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Side {
    /// Samples: count and median.
    Samples {
        /// Sample count (all repeats).
        n: usize,
        /// Median of all samples (`None` when there are no valid samples); for a shape aggregate,
        /// the geometric mean of the medians over M.
        median: Option<f64>,
        /// Repeats the samples came from.
        #[serde(default = "one")]
        repeats: usize,
    },
    /// A single value.
    Value {
        /// The value.
        value: f64,
    },
    /// A label.
    Label {
        /// The label.
        value: String,
    },
}

impl Side {
    fn of(v: &MetricValue) -> Self {
        match v {
            MetricValue::Samples {
                samples, repeats, ..
            } => Side::Samples {
                n: samples.len(),
                median: crate::stats::percentile(samples, 50.0),
                repeats: gate::split_repeats(samples, repeats).len(),
            },
            MetricValue::Value { value, .. } => Side::Value { value: *value },
            MetricValue::Label { value, .. } => Side::Label {
                value: value.clone(),
            },
        }
    }

    /// The side as a number, when it is one (a median or a value).
    pub fn number(&self) -> Option<f64> {
        match self {
            Side::Samples { median, .. } => *median,
            Side::Value { value } => Some(*value),
            Side::Label { .. } => None,
        }
    }
}

/// The comparison of one metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Metric id.
    pub id: String,
    /// Unit.
    pub unit: Unit,
    /// Which way is better.
    pub direction: Direction,
    /// Baseline side (absent for a new metric).
    pub baseline: Option<Side>,
    /// Current side (absent for a missing metric).
    pub current: Option<Side>,
    /// Relative change `current / baseline − 1` (of the median for samples), when defined.
    pub change: Option<f64>,
    /// Interval of the relative change (timings only; see [`super::gate`]).
    pub interval: Option<ChangeInterval>,
    /// Noise threshold applied (timings only), as a fraction.
    pub threshold: Option<f64>,
    /// The verdict.
    pub verdict: Verdict,
    /// Why, when the verdict needs a reason, and context that changed.
    pub notes: Vec<String>,
}

fn relative(b: f64, c: f64) -> Option<f64> {
    (b != 0.0 && b.is_finite() && c.is_finite()).then(|| c / b - 1.0)
}

/// A row for a metric only in the baseline. `reason` says why the results lack it, if known.
pub fn missing_row(b: &Metric, reason: Option<String>) -> Row {
    Row {
        id: b.id.clone(),
        unit: b.unit,
        direction: b.direction,
        baseline: Some(Side::of(&b.value)),
        current: None,
        change: None,
        interval: None,
        threshold: None,
        verdict: Verdict::Missing,
        notes: vec![reason.unwrap_or_else(|| "not in the results".into())],
    }
}

/// A row for a metric only in the results.
pub fn new_row(c: &Metric) -> Row {
    Row {
        id: c.id.clone(),
        unit: c.unit,
        direction: c.direction,
        baseline: None,
        current: Some(Side::of(&c.value)),
        change: None,
        interval: None,
        threshold: None,
        verdict: Verdict::New,
        notes: vec!["not in the baseline".into()],
    }
}

/// Differences between two string maps, as `key: a → b` lines.
fn map_diff(b: &BTreeMap<String, String>, c: &BTreeMap<String, String>) -> Vec<String> {
    let mut keys: Vec<&String> = b.keys().chain(c.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|k| {
            let (x, y) = (b.get(k), c.get(k));
            (x != y).then(|| {
                format!(
                    "{k}: {} → {}",
                    x.map(String::as_str).unwrap_or("(none)"),
                    y.map(String::as_str).unwrap_or("(none)")
                )
            })
        })
        .collect()
}

/// A comparison row still waiting for its timing verdict (which needs the other metrics: the
/// family prior and the number of timing metrics `m`).
// One short-lived value per metric of a comparison, most of them timings: boxing the larger
// variant would add an allocation per metric and save nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Pending {
    /// Already decided (values, labels, conditions that differ, bad samples).
    Done(Row),
    /// Timing samples on both sides, at the run level.
    Timing {
        /// The row so far.
        row: Row,
        /// Both sides.
        paired: Paired,
        /// Context differences to append to the notes.
        context: Vec<String>,
    },
}

/// Compare the same metric from the baseline (`b`) and the results (`c`) up to the point where a
/// timing verdict needs the other metrics (see [`finish_timing`]).
pub fn begin_metric(b: &Metric, c: &Metric, s: &Settings) -> Pending {
    let mut row = Row {
        id: c.id.clone(),
        unit: c.unit,
        direction: c.direction,
        baseline: Some(Side::of(&b.value)),
        current: Some(Side::of(&c.value)),
        change: None,
        interval: None,
        threshold: None,
        verdict: Verdict::Ambiguous,
        notes: Vec::new(),
    };
    if let (Some(x), Some(y)) = (
        row.baseline.as_ref().and_then(Side::number),
        row.current.as_ref().and_then(Side::number),
    ) {
        row.change = relative(x, y);
    }
    let cond = map_diff(&b.conditions, &c.conditions);
    if !cond.is_empty() {
        row.notes.push(format!(
            "conditions differ, not comparable: {}",
            cond.join("; ")
        ));
        return Pending::Done(row);
    }
    let ctx = map_diff(&b.context, &c.context);
    match (&b.value, &c.value) {
        (
            MetricValue::Samples {
                samples: bs,
                repeats: br,
                between_run,
                slots: bsl,
            },
            MetricValue::Samples {
                samples: cs,
                repeats: cr,
                slots: csl,
                ..
            },
        ) => {
            row.threshold = Some(s.threshold_for(&c.id, c.group));
            for (side, samples, sizes) in [("baseline's", bs, br), ("results'", cs, cr)] {
                if !sizes.is_empty() && !gate::sizes_add_up(samples.len(), sizes) {
                    row.notes.push(format!(
                        "the {side} repeat sizes {sizes:?} do not split its {} samples into repeats (kernels.repeats in its results.json): judged as one repeat; remake the file",
                        samples.len()
                    ));
                }
            }
            let sides = SideStats::of(bs, br, "baseline").and_then(|b| {
                SideStats::of(cs, cr, "current").map(|c| (b.with_slots(bsl), c.with_slots(csl)))
            });
            match sides {
                Ok((bst, cst)) => {
                    return Pending::Timing {
                        row,
                        paired: Paired::new(bst, cst, *between_run),
                        context: ctx,
                    }
                }
                Err(e) => row.notes.push(e.to_string()),
            }
        }
        (
            MetricValue::Value {
                value: bv,
                tolerance: bt,
            },
            MetricValue::Value {
                value: cv,
                tolerance: ct,
            },
        ) => {
            let (v, note) = value_verdict(*bv, bt, *cv, ct, c.direction);
            row.verdict = v;
            row.notes.extend(note);
        }
        (MetricValue::Label { value: bl, .. }, MetricValue::Label { value: cl, scale }) => {
            let (v, note) = label_verdict(bl, cl, scale, c.direction);
            row.verdict = v;
            row.notes.extend(note);
        }
        (bv, cv) => row.notes.push(format!(
            "metric kind changed from {} to {}; not comparable",
            bv.kind_name(),
            cv.kind_name()
        )),
    }
    row.notes.extend(ctx);
    Pending::Done(row)
}

/// Decide a timing row: the interval at `1 − α/m` from `paired` and the family `prior`, set
/// against the row's threshold. `m` is the number of timing metrics of the comparison.
pub fn finish_timing(
    mut row: Row,
    paired: &Paired,
    prior: Option<Prior>,
    s: &Settings,
    m: usize,
    context: Vec<String>,
) -> Row {
    let t = row.threshold.unwrap_or(0.0);
    match gate::interval(paired, prior, s.alpha(), m) {
        Ok(ci) => {
            row.change = Some(ci.point);
            row.interval = Some(ci);
            row.verdict = timing_verdict(ci, t, row.direction);
            if row.verdict == Verdict::NotEnoughSamples {
                row.notes.push(not_enough_note(&ci, t, paired));
            }
            match ci.basis {
                Basis::WithinRun => row.notes.push(
                    "between-run spread unknown (one repeat per side, no stored spread): the interval reflects within-run noise only".into(),
                ),
                Basis::BetweenRun { own_df: 0, .. } => row.notes.push(
                    "no between-run spread of its own (one repeat per side, no stored spread): the interval uses its family's".into(),
                ),
                Basis::BetweenRun { .. } => {}
            }
        }
        Err(e) => {
            // Too few samples is what "Not enough samples" says: one label for one cause (a
            // run compared with itself at n = 4 per side showed "Ambiguous" rows).
            if matches!(e, gate::IntervalError::TooFewSamples { .. }) {
                row.verdict = Verdict::NotEnoughSamples;
            }
            row.notes.push(e.to_string());
        }
    }
    row.notes.extend(context);
    row
}

/// Why a timing cannot be decided, and about how much more data would decide it.
fn not_enough_note(ci: &ChangeInterval, t: f64, p: &Paired) -> String {
    let half = 0.5 * (ci.hi - ci.lo);
    let (rb, rc) = (p.b.repeats(), p.c.repeats());
    // The half-width scales with the standard error; aim at 80% of the threshold.
    let factor = (half / (0.8 * t.max(1e-9))).powi(2);
    match ci.basis {
        Basis::WithinRun => {
            let n = p.b.n.min(p.c.n);
            format!(
                "not enough samples (n = {} and {}) to decide at ±{:.1}%: the interval is ±{:.1}%; about {} per side would decide",
                p.b.n,
                p.c.n,
                100.0 * t,
                100.0 * half,
                ((n as f64 * factor).ceil() as u64).max(n as u64 + 1)
            )
        }
        Basis::BetweenRun { .. } => {
            // se² ∝ 1/R_b + 1/R_c (with slots, the fit's factor: `scale²`); R per side on both
            // sides (slots balanced) such that 2/R = scale²/factor.
            let now = p.scale().powi(2);
            let r = ((2.0 * factor / now).ceil() as u64).max(rb.max(rc) as u64 + 1);
            format!(
                "not enough repeats (R = {rb} and {rc}, n = {} and {}) to decide at ±{:.1}%: between runs this metric varies by about {:.1}%, the interval is ±{:.1}%; about R = {r} per side would decide (report --repeats)",
                p.b.n,
                p.c.n,
                100.0 * t,
                100.0 * match ci.basis {
                    Basis::BetweenRun { sd_log, .. } => sd_log,
                    Basis::WithinRun => 0.0,
                },
                100.0 * half,
            )
        }
    }
}

/// Compare the same metric from the baseline (`b`) and the results (`c`) on its own: a timing
/// interval at the full family-wise confidence (`m = 1`, no family prior).
pub fn compare_metric(b: &Metric, c: &Metric, s: &Settings) -> Row {
    match begin_metric(b, c, s) {
        Pending::Done(r) => r,
        Pending::Timing {
            row,
            paired,
            context,
        } => finish_timing(row, &paired, None, s, 1, context),
    }
}

/// The verdict of a timing interval against threshold `t` (see the module docs).
pub fn timing_verdict(ci: ChangeInterval, t: f64, direction: Direction) -> Verdict {
    let (lo, hi) = (ci.lo, ci.hi);
    if lo >= -t && hi <= t {
        return Verdict::Same;
    }
    let above = lo > t;
    let below = hi < -t;
    match (direction, above, below) {
        (Direction::LowerIsBetter, true, _) => Verdict::Regressed,
        (Direction::LowerIsBetter, _, true) => Verdict::Improved,
        (Direction::HigherIsBetter, true, _) => Verdict::Improved,
        (Direction::HigherIsBetter, _, true) => Verdict::Regressed,
        (Direction::MustMatch, true, _) | (Direction::MustMatch, _, true) => Verdict::Regressed,
        // Wider than the threshold, measured as the interval is built: on the log of the ratio
        // (an interval centred on no change is symmetric there, so it is Same or Not enough
        // samples, never Ambiguous).
        _ if 0.5 * ((1.0 + hi).ln() - (1.0 + lo).ln()) > (1.0 + t).ln() => {
            Verdict::NotEnoughSamples
        }
        _ => Verdict::Ambiguous,
    }
}

fn value_verdict(
    b: f64,
    bt: &Tolerance,
    c: f64,
    ct: &Tolerance,
    direction: Direction,
) -> (Verdict, Option<String>) {
    if b.is_nan() || c.is_nan() {
        return (Verdict::Ambiguous, Some("a value is not a number".into()));
    }
    // `worse(x, y)`: x is worse than y in this direction.
    let worse = |x: f64, y: f64| match direction {
        Direction::LowerIsBetter => x > y,
        Direction::HigherIsBetter => x < y,
        Direction::MustMatch => x != y,
    };
    // For must-match metrics any difference is "worse".
    let by_order = |b: f64, c: f64| {
        if b == c {
            Verdict::Same
        } else if worse(c, b) {
            Verdict::Regressed
        } else {
            Verdict::Improved
        }
    };
    match ct {
        Tolerance::Bound { limit, name } => {
            let within = |x: f64, lim: f64| !worse(x, lim);
            let blim = match bt {
                Tolerance::Bound { limit, .. } => *limit,
                Tolerance::Relative { .. } => *limit,
            };
            let (bok, cok) = (within(b, blim), within(c, *limit));
            let mut note = None;
            if blim != *limit {
                note = Some(format!("tolerance {name} changed: {blim:e} → {limit:e}"));
            }
            let v = match (bok, cok) {
                (true, true) => Verdict::Same,
                (true, false) => {
                    note = Some(format!("outside its tolerance {name} = {limit:e}"));
                    Verdict::Regressed
                }
                (false, true) => {
                    note = Some(format!("now within its tolerance {name} = {limit:e}"));
                    Verdict::Improved
                }
                (false, false) => {
                    note = Some(format!(
                        "outside its tolerance {name} = {limit:e} in baseline and results"
                    ));
                    by_order(b, c)
                }
            };
            (v, note)
        }
        Tolerance::Relative { rel } => {
            if (c - b).abs() <= rel * b.abs() {
                (Verdict::Same, None)
            } else {
                (
                    by_order(b, c),
                    Some(if *rel == 0.0 {
                        "differs (must be exactly equal)".to_string()
                    } else {
                        format!("differs by more than {rel:e} relative")
                    }),
                )
            }
        }
    }
}

fn label_verdict(
    b: &str,
    c: &str,
    scale: &[String],
    direction: Direction,
) -> (Verdict, Option<String>) {
    if b == c {
        return (Verdict::Same, None);
    }
    let change = format!("{b} → {c}");
    if scale.is_empty() || direction == Direction::MustMatch {
        return (Verdict::Regressed, Some(format!("must match: {change}")));
    }
    let rank = |x: &str| scale.iter().position(|s| s == x);
    match (rank(b), rank(c)) {
        // The scale is best-first: a larger index is worse.
        (Some(rb), Some(rc)) if rc > rb => (Verdict::Regressed, Some(change)),
        (Some(_), Some(_)) => (Verdict::Improved, Some(change)),
        _ => (
            Verdict::Ambiguous,
            Some(format!(
                "{change}: label not on the known scale ({})",
                scale.join(" > ")
            )),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ci(lo: f64, hi: f64) -> ChangeInterval {
        ChangeInterval {
            point: 0.5 * (lo + hi),
            lo,
            hi,
            confidence: 0.99,
            df: None,
            se_log: 0.01,
            basis: Basis::WithinRun,
        }
    }

    #[test]
    fn timing_verdict_rules() {
        let t = 0.02;
        let l = Direction::LowerIsBetter;
        assert_eq!(timing_verdict(ci(0.03, 0.05), t, l), Verdict::Regressed);
        assert_eq!(timing_verdict(ci(-0.05, -0.03), t, l), Verdict::Improved);
        assert_eq!(timing_verdict(ci(-0.01, 0.015), t, l), Verdict::Same);
        assert_eq!(timing_verdict(ci(0.01, 0.05), t, l), Verdict::Ambiguous);
        assert_eq!(timing_verdict(ci(-0.005, 0.03), t, l), Verdict::Ambiguous);
        assert_eq!(
            timing_verdict(ci(-0.05, 0.05), t, l),
            Verdict::NotEnoughSamples
        );
        // A run compared with itself (+0.00%): its interval is symmetric on the log scale, as
        // [-1.97%, +2.01%] of the committed H200 report was, and is Same or Not enough samples,
        // never Ambiguous, at any width and threshold.
        assert_eq!(
            timing_verdict(ci(-0.0197, 0.0201), t, l),
            Verdict::NotEnoughSamples
        );
        for t in [0.01, 0.02, 0.05] {
            for half in [0.001, 0.0099, 0.0198, 0.019803, 0.0199, 0.03, 0.2] {
                let v = timing_verdict(ci(f64::exp(-half) - 1.0, f64::exp(half) - 1.0), t, l);
                assert!(
                    matches!(v, Verdict::Same | Verdict::NotEnoughSamples),
                    "±{half} at {t}: {v:?}"
                );
            }
        }
        let h = Direction::HigherIsBetter;
        assert_eq!(timing_verdict(ci(0.03, 0.05), t, h), Verdict::Improved);
        assert_eq!(timing_verdict(ci(-0.05, -0.03), t, h), Verdict::Regressed);
    }

    #[test]
    fn percent_and_globs() {
        assert_eq!(parse_percent("2").unwrap(), 0.02);
        assert_eq!(parse_percent(" 2.5% ").unwrap(), 0.025);
        assert!(parse_percent("-1").is_err());
        assert!(parse_percent("abc").is_err());
        assert!(parse_percent("NaN").is_err());
        let m: MetricThreshold = "kernels/*/w4a4/*=5".parse().unwrap();
        assert_eq!(m.threshold, 0.05);
        assert!(m.matches("kernels/rigbench/w4a4/gate_up/m=1/time_s"));
        assert!(!m.matches("kernels/rigbench/w4a16/gate_up/m=1/time_s"));
        assert!("no-equals".parse::<MetricThreshold>().is_err());
        assert!("=5".parse::<MetricThreshold>().is_err());
        let dot: MetricThreshold = "a.b=1".parse().unwrap();
        assert!(dot.matches("a.b") && !dot.matches("axb"), "'.' is literal");

        let s = Settings {
            metric_thresholds: vec![
                "kernels/*=3".parse().unwrap(),
                "kernels/*/m=1/*=7".parse().unwrap(),
            ],
            ..Settings::default()
        };
        assert_eq!(
            s.threshold_for("kernels/a/b/c/m=1/time_s", Group::Kernels),
            0.07
        );
        assert_eq!(
            s.threshold_for("kernels/a/b/c/m=2/time_s", Group::Kernels),
            0.03
        );
        assert_eq!(s.threshold_for("e2e/x", Group::E2e), DEFAULT_THRESHOLD_E2E);
    }

    #[test]
    fn values_against_their_tolerance() {
        let bound = |l: f64| Tolerance::Bound {
            limit: l,
            name: "TOL".into(),
        };
        let l = Direction::LowerIsBetter;
        assert_eq!(
            value_verdict(1e-3, &bound(1e-2), 5e-3, &bound(1e-2), l).0,
            Verdict::Same
        );
        let (v, n) = value_verdict(1e-3, &bound(1e-2), 2e-2, &bound(1e-2), l);
        assert_eq!(v, Verdict::Regressed);
        assert!(n.unwrap().contains("TOL"));
        assert_eq!(
            value_verdict(2e-2, &bound(1e-2), 1e-3, &bound(1e-2), l).0,
            Verdict::Improved
        );
        assert_eq!(
            value_verdict(2e-2, &bound(1e-2), 3e-2, &bound(1e-2), l).0,
            Verdict::Regressed
        );
        let rel = Tolerance::Relative { rel: 1e-6 };
        assert_eq!(
            value_verdict(0.1, &rel, 0.1 * (1.0 + 1e-9), &rel, l).0,
            Verdict::Same
        );
        assert_eq!(
            value_verdict(0.1, &rel, 0.11, &rel, l).0,
            Verdict::Regressed
        );
        assert_eq!(value_verdict(0.1, &rel, 0.09, &rel, l).0, Verdict::Improved);
        assert_eq!(
            value_verdict(100.0, &rel, 101.0, &rel, Direction::MustMatch).0,
            Verdict::Regressed
        );
        assert_eq!(
            value_verdict(f64::NAN, &rel, 1.0, &rel, l).0,
            Verdict::Ambiguous
        );
    }

    #[test]
    fn labels_by_rank_or_exact() {
        let scale: Vec<String> = ["native", "fallback", "unsupported"]
            .map(String::from)
            .to_vec();
        let h = Direction::HigherIsBetter;
        assert_eq!(
            label_verdict("native", "fallback", &scale, h).0,
            Verdict::Regressed
        );
        assert_eq!(
            label_verdict("unsupported", "native", &scale, h).0,
            Verdict::Improved
        );
        assert_eq!(
            label_verdict("native", "native", &scale, h).0,
            Verdict::Same
        );
        assert_eq!(
            label_verdict("native", "weird", &scale, h).0,
            Verdict::Ambiguous
        );
        assert_eq!(label_verdict("a", "b", &[], h).0, Verdict::Regressed);
    }
}
