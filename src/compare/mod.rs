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
//! Timing metrics ([`gate`]): the repeat is the unit. Each repeat of a case (`report --repeats
//! R`) gives one `ln median`; the change is the difference of their means between the sides; its
//! variance is the between-run variance of the repeats, moderated across the metric's family
//! (empirical Bayes, Smyth 2004) and floored by the family's empirical null (Efron 2004); each
//! interval is built at `1 − α/m` over the `m` timing metrics of the comparison (Bonferroni), so
//! the family-wise error is at most `α` (default 5%). Regressed / Improved only when the whole
//! interval lies beyond the noise threshold (kernels 2%, end-to-end 5% by default), Same when it
//! lies within ±threshold, Not enough samples when it is wider than ±threshold, Ambiguous
//! otherwise ([`verdict`]). Per (provider, implementation, shape) a derived `all_m` metric
//! judges the shape as a whole. `docs/gate.md` is the long form, with the false-alarm and
//! detection rates measured on the H200. Deterministic values are compared against their own
//! tolerance, labels exactly or by rank.
//!
//! `--confirm` ([`confirm`]) re-measures the kernel cases that regressed, with the current
//! binary, and keeps a regression only when it reproduces.
//!
//! # Exit codes
//! 0 no regression; 2 a metric regressed **or a baseline metric is missing from the results**
//! (a metric that disappears most often means a case now fails its check or is skipped, and a
//! gate that ignored it would pass a run that measured less than its contract); 3 the baseline
//! is missing or unusable (unreadable, another schema version, another suite, rig mismatch);
//! 1 any other error (the results file unreadable, a write failing).

pub mod baseline;
pub mod confirm;
pub mod fidelity;
pub mod gate;
pub mod metric;
pub mod quality;
pub mod render;
pub mod verdict;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use baseline::{
    baseline_path, check_rig, find_baseline, list_baselines, save_baseline, RigCheck,
};
pub use gate::{ChangeInterval, MIN_SAMPLES};
pub use metric::{
    metrics_of, point_id, Direction, Group, Metric, MetricSource, MetricValue, Tolerance, Unit,
};
pub use verdict::{compare_metric, MetricThreshold, Row, Settings, Side, Verdict};

use verdict::Pending;

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
    /// Metrics the data cannot decide (interval straddles the threshold, conditions differ).
    pub ambiguous: usize,
    /// Timing metrics whose interval is wider than the threshold (more samples or repeats
    /// needed).
    #[serde(default)]
    pub not_enough_samples: usize,
    /// Regressions that `--confirm` did not reproduce.
    #[serde(default)]
    pub not_reproduced: usize,
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
    /// Count the verdicts of `rows`.
    pub fn of(rows: &[Row]) -> Self {
        let mut c = Counts::default();
        for r in rows {
            *match r.verdict {
                Verdict::Regressed => &mut c.regressed,
                Verdict::Missing => &mut c.missing,
                Verdict::Ambiguous => &mut c.ambiguous,
                Verdict::NotEnoughSamples => &mut c.not_enough_samples,
                Verdict::NotReproduced => &mut c.not_reproduced,
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
    /// What `--confirm` re-measured and found, when it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirm: Option<confirm::ConfirmOutcome>,
    /// Ids of the results' metrics changed by a planted change (test hook).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub planted: Vec<String>,
    /// The process exit code this outcome maps to.
    pub exit_code: u8,
    /// The family priors the timing verdicts used (for `--confirm`).
    #[serde(skip)]
    pub priors: Priors,
}

/// Family → prior of the between-run variance (see [`gate::family_prior`]).
pub type Priors = BTreeMap<String, Option<gate::Prior>>;

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
            confirm: None,
            planted: Vec::new(),
            exit_code: ExitStatus::BaselineUnusable.code(),
            priors: Priors::new(),
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
            "{} regressed, {} missing, {} ambiguous, {} not enough samples, {} improved, {} new, {} same",
            c.regressed, c.missing, c.ambiguous, c.not_enough_samples, c.improved, c.new, c.same
        );
        if c.not_reproduced > 0 {
            line.push_str(&format!(
                ", {} not reproduced (--confirm)",
                c.not_reproduced
            ));
        }
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
    let mut cm = metrics_of(current);
    verdict::apply_plants(&mut cm, &settings.plants);
    let (mut rows, _) = compare_metrics(&metrics_of(baseline), &cm, settings);
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
/// (baseline order, then the derived shape aggregates, then metrics only in `cm`) and, with
/// [`Settings::deterministic_only`], the ids of the timing metrics left out (a metric is left
/// out when it is timing samples on either side; it is then neither missing nor new).
///
/// Timing rows are decided together: each metric's family prior comes from the other metrics of
/// its family, and the Bonferroni level from their number (see [`gate`]).
pub fn compare_metrics(
    bm: &[Metric],
    cm: &[Metric],
    settings: &Settings,
) -> (Vec<Row>, Vec<String>) {
    let (rows, not_compared, _) = compare_metrics_with(bm, cm, settings, None);
    (rows, not_compared)
}

/// [`compare_metrics`], with the family priors of an earlier comparison of the same metrics
/// standing in for those this one would estimate (families it lacks), and the priors it used.
pub fn compare_metrics_with(
    bm: &[Metric],
    cm: &[Metric],
    settings: &Settings,
    known: Option<&Priors>,
) -> (Vec<Row>, Vec<String>, Priors) {
    let by_id: BTreeMap<&str, &Metric> = cm.iter().map(|m| (m.id.as_str(), m)).collect();
    let base_ids: BTreeMap<&str, &Metric> = bm.iter().map(|m| (m.id.as_str(), m)).collect();
    let skip = |m: &Metric, other: Option<&&Metric>| {
        settings.deterministic_only
            && (!m.is_deterministic() || other.is_some_and(|o| !o.is_deterministic()))
    };
    let mut pending: Vec<Pending> = Vec::with_capacity(bm.len().max(cm.len()));
    let mut not_compared = Vec::new();
    for b in bm {
        let c = by_id.get(b.id.as_str());
        if skip(b, c) {
            not_compared.push(b.id.clone());
            continue;
        }
        match c {
            Some(c) => pending.push(verdict::begin_metric(b, c, settings)),
            None => pending.push(Pending::Done(verdict::missing_row(b, None))),
        }
    }
    pending.extend(aggregates(&pending, settings));
    let (mut rows, priors) = decide(pending, settings, known);
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
    (rows, not_compared, priors)
}

/// The family of a timing metric: its id with the shape and M (kernels) or the sweep point
/// (end-to-end) replaced by `*`. Metrics of one family share a prior.
pub fn family_of(id: &str) -> String {
    let mut segs: Vec<&str> = id.split('/').collect();
    match segs.first().copied() {
        Some("kernels") if segs.len() >= 6 => {
            segs[3] = "*";
            if segs[4].starts_with("m=") {
                segs[4] = "m=*";
            }
        }
        Some("e2e") if segs.len() >= 4 => segs[2] = "*",
        _ => {}
    }
    segs.join("/")
}

/// Decide every pending row: family priors (`known` ones first), then intervals at `1 − α/m`.
fn decide(
    pending: Vec<Pending>,
    settings: &Settings,
    known: Option<&Priors>,
) -> (Vec<Row>, Priors) {
    let timing: Vec<(usize, &gate::Paired, String)> = pending
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match p {
            Pending::Timing { row, paired, .. } => Some((i, paired, family_of(&row.id))),
            Pending::Done(_) => None,
        })
        .collect();
    let m = timing.len();
    let mut families: BTreeMap<&str, Vec<&gate::Paired>> = BTreeMap::new();
    for (_, p, f) in &timing {
        families.entry(f.as_str()).or_default().push(p);
    }
    let priors: Priors = families
        .iter()
        .map(|(f, members)| {
            let known = known.and_then(|k| k.get(*f)).copied().flatten();
            (f.to_string(), known.or_else(|| gate::family_prior(members)))
        })
        .collect();
    let rows = pending
        .into_iter()
        .map(|p| match p {
            Pending::Done(r) => r,
            Pending::Timing {
                row,
                paired,
                context,
            } => {
                let prior = priors.get(&family_of(&row.id)).copied().flatten();
                verdict::finish_timing(row, &paired, prior, settings, m, context)
            }
        })
        .collect();
    (rows, priors)
}

/// The shape aggregates: per (kernels provider, implementation, shape, part), the mean over M
/// of the repeats' `ln median`, when every M of the group is a timing on both sides with the
/// same repeat counts (see [`gate`], "Shape aggregates").
fn aggregates(pending: &[Pending], settings: &Settings) -> Vec<Pending> {
    // key: (provider/impl/shape, part) → [(M, row, paired)]
    let mut groups: BTreeMap<(String, String), Vec<(&Row, &gate::Paired)>> = BTreeMap::new();
    let mut order: Vec<(String, String)> = Vec::new();
    for p in pending {
        let Pending::Timing { row, paired, .. } = p else {
            continue;
        };
        let segs: Vec<&str> = row.id.split('/').collect();
        if segs.len() < 6
            || segs[0] != "kernels"
            || segs[1] == "composite"
            || !segs[4].starts_with("m=")
        {
            continue;
        }
        if segs.last() != Some(&"time_s") || row.id.contains('#') {
            continue;
        }
        let key = (segs[1..4].join("/"), segs[5..segs.len() - 1].join("/"));
        if !groups.contains_key(&key) {
            order.push(key.clone());
        }
        groups.entry(key).or_default().push((row, paired));
    }
    let mut out = Vec::new();
    for key in order {
        let members = &groups[&key];
        if members.len() < 2 {
            continue;
        }
        let (rb, rc) = (members[0].1.b.repeats(), members[0].1.c.repeats());
        if members
            .iter()
            .any(|(_, p)| p.b.repeats() != rb || p.c.repeats() != rc)
        {
            continue;
        }
        // Without repeats or a stored spread on any member there is no between-run information;
        // a mean over M would then look precise while hiding run-to-run drift.
        if rb < 2 && rc < 2 && members.iter().all(|(_, p)| p.b_stored.is_none()) {
            continue;
        }
        let k = members.len() as f64;
        let side = |f: &dyn Fn(&gate::Paired) -> &gate::SideStats, r: usize| gate::SideStats {
            y: (0..r)
                .map(|i| members.iter().map(|(_, p)| f(p).y[i]).sum::<f64>() / k)
                .collect(),
            within: (0..r)
                .map(|i| {
                    members
                        .iter()
                        .map(|(_, p)| f(p).within[i])
                        .sum::<Option<f64>>()
                        .map(|w| w / (k * k))
                })
                .collect(),
            n: members.iter().map(|(_, p)| f(p).n).sum(),
            pooled_median: (members
                .iter()
                .map(|(_, p)| f(p).pooled_median.ln())
                .sum::<f64>()
                / k)
                .exp(),
            // The members' slots when they all agree (the order rotates per repeat, not per M).
            slots: if members
                .iter()
                .all(|(_, p)| f(p).slots == f(members[0].1).slots)
            {
                f(members[0].1).slots.clone()
            } else {
                Vec::new()
            },
        };
        let b = side(&|p| &p.b, rb);
        let c = side(&|p| &p.c, rc);
        // A stored spread for the aggregate: from the members' stored spreads, as the spread of
        // a mean of independent repeats (conservative when the members move together).
        let b_stored = members
            .iter()
            .map(|(_, p)| p.b_stored)
            .collect::<Option<Vec<_>>>()
            .map(|v| crate::report::schema::RunSpread {
                sd_log: (v.iter().map(|s| s.sd_log * s.sd_log).sum::<f64>() / k).sqrt(),
                df: v.iter().map(|s| s.df).min().unwrap_or(0),
            });
        let ms: Vec<String> = members
            .iter()
            .filter_map(|(r, _)| {
                r.id.split('/')
                    .nth(4)
                    .map(|s| s.trim_start_matches("m=").to_string())
            })
            .collect();
        let id = if key.1.is_empty() {
            format!("kernels/{}/all_m/time_s", key.0)
        } else {
            format!("kernels/{}/all_m/{}/time_s", key.0, key.1)
        };
        let first = members[0].0;
        let row = Row {
            id: id.clone(),
            unit: first.unit,
            direction: first.direction,
            baseline: Some(Side::Samples {
                n: b.n,
                median: Some(b.pooled_median),
                repeats: rb,
            }),
            current: Some(Side::Samples {
                n: c.n,
                median: Some(c.pooled_median),
                repeats: rc,
            }),
            change: None,
            interval: None,
            threshold: Some(settings.threshold_for(&id, Group::Kernels)),
            verdict: Verdict::Ambiguous,
            notes: vec![format!(
                "derived: geometric mean over M = {} (medians shown are geometric means)",
                ms.join(", ")
            )],
        };
        out.push(Pending::Timing {
            row,
            paired: gate::Paired::new(b, c, b_stored),
            context: Vec::new(),
        });
    }
    out
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
    if let Some(why) = suite_mismatch(baseline, current, &binfo, &cinfo) {
        return Comparison::unusable(cinfo, Some(binfo), settings, why);
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
    let mut cm = metrics_of(current);
    let planted = verdict::apply_plants(&mut cm, &settings.plants);
    if !settings.plants.is_empty() {
        warnings.push(format!(
            "TEST HOOK: planted changes ({}) scaled the samples of {} metrics of the results; these verdicts do not describe the measured run",
            settings
                .plants
                .iter()
                .map(|p| format!("{} {:+.1}%", p.glob, 100.0 * p.change))
                .collect::<Vec<_>>()
                .join(", "),
            planted.len()
        ));
    }
    let bm = metrics_of(baseline);
    let bad_sizes = bad_repeat_sizes(&bm, &cm);
    let (mut rows, not_compared, priors) = compare_metrics_with(&bm, &cm, settings, None);
    explain_missing(&mut rows, current);
    if bad_sizes > 0 {
        warnings.push(format!(
            "{bad_sizes} timings have repeat sizes that do not add up to their samples (kernels.repeats of the baseline or results file): each was judged as one repeat; remake the file (see the rows' notes)"
        ));
    }
    warnings.extend(single_repeat_warning(&rows));
    warnings.extend(unmatched_threshold_warnings(settings, &rows));
    rows.extend(quality::rows(baseline, current));
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
        confirm: None,
        planted,
        exit_code: 0,
        priors,
    };
    c.exit_code = c.status().code();
    c
}

/// Why `baseline` and `current` cannot be compared at all: another recorded suite, or
/// end-to-end runs of another e2e suite. `None` when they are of the same suites.
fn suite_mismatch(
    baseline: &Results,
    current: &Results,
    binfo: &RunInfo,
    cinfo: &RunInfo,
) -> Option<String> {
    if let (Some(bs), Some(cs)) = (&binfo.suite, &cinfo.suite) {
        if bs != cs {
            return Some(format!(
                    "the baseline {} is for suite '{bs}', the results are for suite '{cs}'; pick the baseline of suite '{cs}'",
                    binfo.path
            ));
        }
    }
    // The end-to-end suites: another workload is another contract, not a set of missing
    // metrics (its sweep points and sizes differ).
    let e2e_suite = |r: &Results| {
        r.e2e
            .as_ref()
            .and_then(|e| e.suite.as_ref())
            .map(|s| s.name.clone())
    };
    if let (Some(bs), Some(cs)) = (e2e_suite(baseline), e2e_suite(current)) {
        if bs != cs {
            return Some(format!(
                    "the baseline {} has end-to-end runs of suite '{bs}', the results of suite '{cs}': another workload, not comparable; compare against a baseline made with the e2e suite '{cs}'",
                    binfo.path
            ));
        }
    }
    None
}

/// How many timings of either side have repeat sizes that do not add up to their samples.
fn bad_repeat_sizes(bm: &[Metric], cm: &[Metric]) -> usize {
    bm.iter()
        .chain(cm)
        .filter(|m| {
            matches!(&m.value, MetricValue::Samples { samples, repeats, .. }
                if !repeats.is_empty() && !gate::sizes_add_up(samples.len(), repeats))
        })
        .count()
}

/// The warning for kernel timings with no between-run information of their own (one repeat
/// on each side, no stored spread), if any.
fn single_repeat_warning(rows: &[Row]) -> Option<String> {
    let single: Vec<&str> = rows
        .iter()
        .filter(|r| {
            r.id.starts_with("kernels/")
                && r.interval.is_some_and(|ci| {
                    matches!(
                        ci.basis,
                        gate::Basis::WithinRun | gate::Basis::BetweenRun { own_df: 0, .. }
                    )
                })
        })
        .map(|r| r.id.as_str())
        .collect();
    if single.is_empty() {
        return None;
    }
    if single.iter().all(|id| id.starts_with("kernels/composite/")) {
        // Made with repeats, the per-case rows have their own spread; the decode-step sums
        // are derived from pooled samples and never do.
        Some(format!(
            "the {} decode-step composite timings (kernels/composite/…) are sums over cases with no repeats of their own: their intervals rest on within-run noise and the spread of their family; the per-case rows carry the between-run spread",
            single.len()
        ))
    } else {
        Some(format!(
            "{} kernel timings (e.g. {}) have no between-run information of their own (one repeat on each side and no spread stored in the baseline): their intervals rest on within-run noise and the spread of their family, and will flag cases that drift more than their family between runs; make the baseline and the results with `report --repeats` (docs/gate.md: 6 for the baseline, 3 per run)",
            single.len(),
            single[0]
        ))
    }
}

/// A warning for each `--threshold-metric` that matched no timing metric (none when only
/// deterministic metrics are judged).
fn unmatched_threshold_warnings(settings: &Settings, rows: &[Row]) -> Vec<String> {
    let mut warnings = Vec::new();
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
                "--threshold-metric '{}' matched no timing metric",
                mt.glob
            ));
        }
    }
    warnings
}
