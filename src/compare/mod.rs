//! Baselines and verdicts: compare results with a committed baseline, metric by metric, with a
//! verdict a CI job can gate on and that does not cry wolf on noise.
//!
//! # Flow
//! 1. Both files are [`Results`] (the versioned results schema; a baseline is a results file
//!    saved by [`save_baseline`] at `baselines/<rig-label>/<suite>.json`).
//! 2. The rigs are checked ([`check_rig`]): a different GPU name, compute capability or driver
//!    major version is a *rig mismatch*, reported plainly and never turned into regression
//!    verdicts (exit 3 unless the caller allows it).
//! 3. Each file is flattened into [`Metric`]s ([`metrics_of`], extensible via [`MetricSource`])
//!    and metrics with the same id are compared ([`compare_metric`]).
//!
//! # Statistics
//! Timing samples: a two-sample percentile-bootstrap interval of the relative change of the
//! median (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13), seeded and
//! deterministic, at 99% confidence by default, set against a noise threshold (kernels 2%,
//! end-to-end 5% by default). Regressed / Improved only when the whole interval lies beyond the
//! threshold, Same when it lies within ±threshold, Ambiguous otherwise; see [`verdict`] and
//! [`bootstrap`] for the rules and their error rates. Deterministic values are compared against
//! their own tolerance, labels exactly or by rank.
//!
//! The comparator's own tests (`tests/compare_stats.rs`) check, over 200+ seeded trials at the
//! kernel bench's smallest reported sample count ([`DEFAULT_SAMPLE_COUNT`]): an A/A
//! false-regression rate ≤ 1%, a planted 10% slowdown called Regressed in ≥ 95% of trials, and
//! a 0.5% change never called Regressed at a 2% threshold.
//!
//! # Exit codes
//! 0 no regression; 2 a metric regressed **or a baseline metric is missing from the results**
//! (a metric that disappears most often means a case now fails its check or is skipped, and a
//! gate that ignored it would pass a run that measured less than its contract); 3 the baseline
//! is missing or unusable (unreadable, another schema version, another suite, rig mismatch);
//! 1 any other error (the results file unreadable, a write failing).

pub mod baseline;
pub mod bootstrap;
pub mod metric;
pub mod render;
pub mod verdict;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use baseline::{
    baseline_path, check_rig, find_baseline, list_baselines, save_baseline, RigCheck,
};
pub use bootstrap::{median_change_interval, ChangeInterval, MIN_SAMPLES};
pub use metric::{
    metrics_of, point_id, Direction, Group, Metric, MetricSource, MetricValue, Tolerance, Unit,
};
pub use verdict::{compare_metric, MetricThreshold, Row, Settings, Side, Verdict};

use crate::report::Results;
use crate::ExitStatus;

/// The sample count the comparator's acceptance tests use: the kernel bench's default
/// [`crate::stats::StoppingRule::min_samples`] (10), the fewest samples a converged kernel case
/// reports and so the hardest case for telling a change from noise.
pub const DEFAULT_SAMPLE_COUNT: usize = 10;

/// Identity of one side of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// File read.
    pub path: String,
    /// Rig label recorded in the file.
    pub rig_label: String,
    /// Suite recorded in the file, if any.
    pub suite: Option<String>,
    /// When the run started (UTC).
    pub created_utc: String,
    /// rigbench version that wrote it.
    pub rigbench_version: String,
    /// Whether the run finished.
    pub complete: bool,
}

impl RunInfo {
    /// Describe `results` read from `path`.
    pub fn of(results: &Results, path: &Path) -> Self {
        Self {
            path: path.display().to_string(),
            rig_label: results.rig_label.clone(),
            suite: results_suite(results),
            created_utc: results.created_utc.clone(),
            rigbench_version: results.rigbench_version.clone(),
            complete: results.complete,
        }
    }
}

/// The suite a results file records (today: its kernel suite's name), if any.
pub fn results_suite(results: &Results) -> Option<String> {
    results
        .kernels
        .as_ref()
        .map(|k| k.suite.name.clone())
        .filter(|s| !s.is_empty())
}

/// Verdict counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Regressed metrics.
    pub regressed: usize,
    /// Baseline metrics missing from the results.
    pub missing: usize,
    /// Metrics the data cannot decide.
    pub ambiguous: usize,
    /// Improved metrics.
    pub improved: usize,
    /// Metrics only in the results.
    pub new: usize,
    /// Unchanged metrics.
    pub same: usize,
    /// Timing metrics left out by `--deterministic-only` (listed in
    /// [`Comparison::not_compared`]).
    #[serde(default)]
    pub not_compared: usize,
}

impl Counts {
    fn of(rows: &[Row]) -> Self {
        let mut c = Counts::default();
        for r in rows {
            *match r.verdict {
                Verdict::Regressed => &mut c.regressed,
                Verdict::Missing => &mut c.missing,
                Verdict::Ambiguous => &mut c.ambiguous,
                Verdict::Improved => &mut c.improved,
                Verdict::New => &mut c.new,
                Verdict::Same => &mut c.same,
            } += 1;
        }
        c
    }
}

/// The full outcome of `rigbench compare` (rendered as Markdown or JSON).
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The baseline, when one was read.
    pub baseline: Option<RunInfo>,
    /// The results judged.
    pub results: RunInfo,
    /// How timings were judged.
    pub settings: Settings,
    /// Rig check, when a baseline was read.
    pub rig: Option<RigCheck>,
    /// Whether a rig mismatch was allowed (`--allow-rig-mismatch`) and verdicts computed anyway.
    pub rig_mismatch_allowed: bool,
    /// Why no verdicts were computed (baseline missing, unreadable, incompatible); exit 3.
    pub problem: Option<String>,
    /// Warnings that do not change the verdicts (incomplete runs, unused threshold globs).
    pub warnings: Vec<String>,
    /// Per-metric comparisons: baseline order, then new metrics.
    pub rows: Vec<Row>,
    /// Ids of the timing metrics (in the baseline or the results) not compared because of
    /// `--deterministic-only`: baseline order, then those only in the results.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_compared: Vec<String>,
    /// Verdict counts.
    pub counts: Counts,
    /// The process exit code this outcome maps to.
    pub exit_code: u8,
}

impl Comparison {
    /// A comparison that could not be made: `problem` says why (exit 3).
    pub fn unusable(
        results: RunInfo,
        baseline: Option<RunInfo>,
        settings: &Settings,
        problem: String,
    ) -> Self {
        Self {
            baseline,
            results,
            settings: settings.clone(),
            rig: None,
            rig_mismatch_allowed: false,
            problem: Some(problem),
            warnings: Vec::new(),
            rows: Vec::new(),
            not_compared: Vec::new(),
            counts: Counts::default(),
            exit_code: ExitStatus::BaselineUnusable.code(),
        }
    }

    /// The exit status: 3 when unusable, 2 when any metric regressed or is missing, else 0.
    pub fn status(&self) -> ExitStatus {
        if self.problem.is_some() {
            ExitStatus::BaselineUnusable
        } else if self.rows.iter().any(|r| r.verdict.is_failure()) {
            ExitStatus::Regression
        } else {
            ExitStatus::Ok
        }
    }

    /// One-line summary for logs.
    pub fn summary_line(&self) -> String {
        if let Some(p) = &self.problem {
            return format!("baseline unusable: {p}");
        }
        let c = &self.counts;
        let mut line = format!(
            "{} regressed, {} missing, {} ambiguous, {} improved, {} new, {} same",
            c.regressed, c.missing, c.ambiguous, c.improved, c.new, c.same
        );
        if c.not_compared > 0 {
            line.push_str(&format!(
                ", {} timing metrics not compared (--deterministic-only)",
                c.not_compared
            ));
        }
        line
    }
}

/// Compare every metric of `baseline` with the same metric of `current`: rows in baseline
/// order, then metrics new in `current`. With [`Settings::deterministic_only`], timing metrics
/// are left out (see [`compare_metrics`] for their list).
pub fn compare_results(baseline: &Results, current: &Results, settings: &Settings) -> Vec<Row> {
    let (mut rows, _) = compare_metrics(&metrics_of(baseline), &metrics_of(current), settings);
    explain_missing(&mut rows, current);
    rows
}

/// Replace the note of each missing row by why `current` lacks that metric, when recorded.
fn explain_missing(rows: &mut [Row], current: &Results) {
    for r in rows.iter_mut().filter(|r| r.verdict == Verdict::Missing) {
        if let Some(why) = metric::missing_reason(current, &r.id) {
            r.notes = vec![why];
        }
    }
}

/// Compare the metrics `bm` of the baseline with the metrics `cm` of the results: the rows
/// (baseline order, then metrics only in `cm`) and, with [`Settings::deterministic_only`], the
/// ids of the timing metrics left out (a metric is left out when it is timing samples on either
/// side; it is then neither missing nor new).
pub fn compare_metrics(
    bm: &[Metric],
    cm: &[Metric],
    settings: &Settings,
) -> (Vec<Row>, Vec<String>) {
    let by_id: BTreeMap<&str, &Metric> = cm.iter().map(|m| (m.id.as_str(), m)).collect();
    let base_ids: BTreeMap<&str, &Metric> = bm.iter().map(|m| (m.id.as_str(), m)).collect();
    let skip = |m: &Metric, other: Option<&&Metric>| {
        settings.deterministic_only
            && (!m.is_deterministic() || other.is_some_and(|o| !o.is_deterministic()))
    };
    let mut rows = Vec::with_capacity(bm.len().max(cm.len()));
    let mut not_compared = Vec::new();
    for b in bm {
        let c = by_id.get(b.id.as_str());
        if skip(b, c) {
            not_compared.push(b.id.clone());
            continue;
        }
        match c {
            Some(c) => rows.push(compare_metric(b, c, settings)),
            None => rows.push(verdict::missing_row(b, None)),
        }
    }
    for c in cm {
        let b = base_ids.get(c.id.as_str());
        if b.is_none() {
            if skip(c, None) {
                not_compared.push(c.id.clone());
            } else {
                rows.push(verdict::new_row(c));
            }
        }
    }
    (rows, not_compared)
}

/// Compare `current` (read from `current_path`) with `baseline` (read from `baseline_path`):
/// suite and rig checks first, then per-metric verdicts.
///
/// A different recorded suite, or a rig mismatch when `allow_rig_mismatch` is false, gives an
/// unusable comparison (exit 3) with the reason; with `allow_rig_mismatch` the mismatch is shown
/// and verdicts are computed anyway.
pub fn compare(
    baseline: &Results,
    baseline_path: &Path,
    current: &Results,
    current_path: &Path,
    settings: &Settings,
    allow_rig_mismatch: bool,
) -> Comparison {
    let binfo = RunInfo::of(baseline, baseline_path);
    let cinfo = RunInfo::of(current, current_path);
    if let (Some(bs), Some(cs)) = (&binfo.suite, &cinfo.suite) {
        if bs != cs {
            return Comparison::unusable(
                cinfo.clone(),
                Some(binfo.clone()),
                settings,
                format!(
                    "the baseline {} is for suite '{bs}', the results are for suite '{cs}'; pick the baseline of suite '{cs}'",
                    binfo.path
                ),
            );
        }
    }
    let rig = check_rig(&baseline.rig, &current.rig);
    if !rig.compatible() && !allow_rig_mismatch {
        let mut c = Comparison::unusable(
            cinfo,
            Some(binfo),
            settings,
            format!(
                "rig mismatch, so timings are not comparable ({}); this is not a regression verdict. Compare against a baseline of this rig, or pass --allow-rig-mismatch to compare anyway",
                rig.mismatches.join("; ")
            ),
        );
        c.rig = Some(rig);
        return c;
    }
    let mut warnings = Vec::new();
    if !baseline.complete {
        warnings.push("the baseline records an incomplete run".to_string());
    }
    if !current.complete {
        warnings.push(
            "the results record an incomplete run (interrupted or in progress); missing metrics may be cases not reached".to_string(),
        );
    }
    let (mut rows, not_compared) =
        compare_metrics(&metrics_of(baseline), &metrics_of(current), settings);
    explain_missing(&mut rows, current);
    for mt in settings
        .metric_thresholds
        .iter()
        .filter(|_| !settings.deterministic_only)
    {
        if !rows
            .iter()
            .any(|r| r.threshold.is_some() && mt.matches(&r.id))
        {
            warnings.push(format!(
                "--metric-threshold '{}' matched no timing metric",
                mt.glob
            ));
        }
    }
    let mut c = Comparison {
        baseline: Some(binfo),
        results: cinfo,
        settings: settings.clone(),
        rig_mismatch_allowed: !rig.compatible(),
        rig: Some(rig),
        problem: None,
        warnings,
        counts: Counts {
            not_compared: not_compared.len(),
            ..Counts::of(&rows)
        },
        rows,
        not_compared,
        exit_code: 0,
    };
    c.exit_code = c.status().code();
    c
}
