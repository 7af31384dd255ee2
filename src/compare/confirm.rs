//! `rigbench compare --confirm`: re-measure, with the current binary, only the kernel cases
//! whose timing regressed, and keep a regression only when the re-measurement reproduces it.
//!
//! Which cases: every Regressed kernel timing of rigbench's own implementations (a shape
//! aggregate `…/<shape>/all_m/time_s` stands for every M of that shape). Peer rows (PyTorch) are
//! not re-measured; they keep their verdict, with a note.
//!
//! How: the cases are timed again ([`ConfirmRequest`]: the results' suite, the shapes, M values
//! and implementations involved, the results' timing policy) in `R` repeats (default 3, as
//! `report --repeats`), then compared with the baseline as in the first comparison, with the
//! first comparison's family priors and with `m` = the number of metrics re-judged (Bonferroni
//! over the confirmation). A regression stands when the re-measured interval also lies wholly
//! above the threshold; otherwise its verdict becomes Not reproduced (not a failure) and both
//! intervals are in its notes. A case that could not be re-measured keeps Regressed.
//!
//! A false regression must now pass two independent tests at family-wise level `α` each, so a
//! transient (a clock dip, another process on the GPU, a slow repeat) no longer fails the gate;
//! a real slowdown of the code reproduces and still does.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::metric::{metrics_of, Metric, MetricValue};
use super::verdict::{apply_plants, Row, Settings, Verdict};
use super::{compare_metrics_with, Comparison, Counts};
use crate::kernels::schema::TimingPolicy;
use crate::kernels::KernelResults;
use crate::report::Results;

/// Default repeats of a confirmation.
pub const DEFAULT_CONFIRM_REPEATS: usize = 3;

/// One kernel case to re-measure.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct CaseKey {
    /// Implementation id (`bf16`, `fp8`, `w4a16`, `w4a4`).
    pub implementation: String,
    /// Shape name.
    pub shape: String,
    /// M.
    pub m: usize,
}

/// What to re-measure.
#[derive(Debug, Clone, Serialize)]
pub struct ConfirmRequest {
    /// The suite: the file the results recorded when it exists, else its name.
    pub suite: String,
    /// The cases.
    pub cases: Vec<CaseKey>,
    /// Repeats.
    pub repeats: usize,
    /// The results' timing policy (stopping rule, warm-up, L2 flush), if recorded.
    pub policy: Option<TimingPolicy>,
}

/// What `--confirm` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ConfirmOutcome {
    /// Metric ids that had regressed and were re-judged.
    pub rejudged: Vec<String>,
    /// Cases re-measured.
    pub cases: usize,
    /// Repeats of the re-measurement.
    pub repeats: usize,
    /// Regressions the re-measurement reproduced.
    pub reproduced: usize,
    /// Regressions it did not reproduce.
    pub not_reproduced: usize,
    /// Why nothing (or not everything) could be re-measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// A parsed kernel timing id: `kernels/<provider>/<impl>/<shape>/{m=<M>|all_m}[/<part>]/time_s`.
struct KernelId<'a> {
    provider: &'a str,
    implementation: &'a str,
    shape: &'a str,
    /// `None` for a shape aggregate.
    m: Option<usize>,
}

fn parse_id(id: &str) -> Option<KernelId<'_>> {
    let segs: Vec<&str> = id.split('/').collect();
    if segs.len() < 6 || segs[0] != "kernels" || segs.last() != Some(&"time_s") {
        return None;
    }
    let m = if segs[4] == "all_m" {
        None
    } else {
        Some(segs[4].strip_prefix("m=")?.parse().ok()?)
    };
    Some(KernelId {
        provider: segs[1],
        implementation: segs[2],
        shape: segs[3],
        m,
    })
}

/// The rigbench kernel cases behind the Regressed timing rows of `c` (M values of an aggregate
/// from `current`), the ids re-judged, and the ids that cannot be re-measured (peers).
pub fn flagged(c: &Comparison, current: &Results) -> (Vec<CaseKey>, Vec<String>, Vec<String>) {
    let mut cases = BTreeSet::new();
    let mut ids = Vec::new();
    let mut peers = Vec::new();
    for r in c
        .rows
        .iter()
        .filter(|r| r.verdict == Verdict::Regressed && r.interval.is_some())
    {
        let Some(k) = parse_id(&r.id) else { continue };
        if k.provider != "rigbench" {
            peers.push(r.id.clone());
            continue;
        }
        ids.push(r.id.clone());
        match k.m {
            Some(m) => {
                cases.insert(CaseKey {
                    implementation: k.implementation.into(),
                    shape: k.shape.into(),
                    m,
                });
            }
            None => {
                for kc in current.kernels.iter().flat_map(|kr| kr.cases.iter()) {
                    if kc.provider == "rigbench"
                        && kc.implementation == k.implementation
                        && kc.shape == k.shape
                    {
                        cases.insert(CaseKey {
                            implementation: kc.implementation.clone(),
                            shape: kc.shape.clone(),
                            m: kc.m,
                        });
                    }
                }
            }
        }
    }
    (cases.into_iter().collect(), ids, peers)
}

/// Whether the timing metric `m` belongs to one of `cases`.
fn in_cases(m: &Metric, cases: &[CaseKey]) -> bool {
    matches!(m.value, MetricValue::Samples { .. })
        && parse_id(&m.id).is_some_and(|k| {
            k.provider == "rigbench"
                && cases.iter().any(|c| {
                    c.implementation == k.implementation && c.shape == k.shape && k.m == Some(c.m)
                })
        })
}

/// Re-judge the Regressed kernel timings of `c` with `measure` (see the module docs). `c` is
/// updated in place: verdicts, notes, counts, exit code and [`Comparison::confirm`].
pub fn confirm(
    c: &mut Comparison,
    baseline: &Results,
    current: &Results,
    settings: &Settings,
    repeats: usize,
    measure: &mut dyn FnMut(&ConfirmRequest) -> anyhow::Result<KernelResults>,
) {
    let (cases, ids, peers) = flagged(c, current);
    let mut outcome = ConfirmOutcome {
        repeats,
        ..Default::default()
    };
    for r in c.rows.iter_mut().filter(|r| peers.contains(&r.id)) {
        r.notes
            .push("--confirm: peer rows are not re-measured; the verdict stands".into());
    }
    if cases.is_empty() {
        c.confirm = Some(outcome);
        return;
    }
    let suite = current
        .kernels
        .as_ref()
        .map(|k| {
            if std::path::Path::new(&k.suite.file).is_file() {
                k.suite.file.clone()
            } else {
                k.suite.name.clone()
            }
        })
        .unwrap_or_default();
    let req = ConfirmRequest {
        suite,
        cases: cases.clone(),
        repeats,
        policy: current
            .kernels
            .as_ref()
            .and_then(|k| k.timing_policy.clone()),
    };
    outcome.cases = cases.len();
    outcome.rejudged = ids.clone();
    let measured = match measure(&req) {
        Ok(k) => k,
        Err(e) => {
            let why = format!("{e:#}");
            for r in c.rows.iter_mut().filter(|r| ids.contains(&r.id)) {
                r.notes.push(format!(
                    "--confirm could not re-measure ({why}); the regression stands unconfirmed"
                ));
            }
            c.warnings.push(format!(
                "--confirm could not re-measure the {} regressed kernel cases: {why}; the regressions stand unconfirmed",
                cases.len()
            ));
            outcome.problem = Some(why);
            c.confirm = Some(outcome);
            recount(c);
            return;
        }
    };
    let mut again = current.clone();
    again.kernels = Some(measured);
    let bm: Vec<Metric> = metrics_of(baseline)
        .into_iter()
        .filter(|m| in_cases(m, &cases))
        .collect();
    let mut cm: Vec<Metric> = metrics_of(&again)
        .into_iter()
        .filter(|m| in_cases(m, &cases))
        .collect();
    apply_plants(&mut cm, &settings.plants);
    let (rows, _, _) = compare_metrics_with(&bm, &cm, settings, Some(&c.priors));
    let by_id: BTreeMap<&str, &Row> = rows.iter().map(|r| (r.id.as_str(), r)).collect();
    for r in c.rows.iter_mut().filter(|r| ids.contains(&r.id)) {
        let first = r
            .interval
            .map(|ci| format!("[{:+.2}%, {:+.2}%]", 100.0 * ci.lo, 100.0 * ci.hi))
            .unwrap_or_default();
        match by_id.get(r.id.as_str()) {
            Some(again) if again.verdict == Verdict::Regressed => {
                outcome.reproduced += 1;
                r.notes.push(format!(
                    "confirmed by re-measurement ({repeats} repeats): {}",
                    describe(again)
                ));
            }
            Some(again) if again.interval.is_some() => {
                outcome.not_reproduced += 1;
                r.verdict = Verdict::NotReproduced;
                r.notes.push(format!(
                    "flagged {first}, not reproduced by re-measurement ({repeats} repeats): {} ({})",
                    describe(again),
                    again.verdict
                ));
            }
            Some(again) => r.notes.push(format!(
                "--confirm could not judge the re-measurement ({}); the regression stands",
                again.notes.join("; ")
            )),
            None => r.notes.push(
                "--confirm: the case was not timed again (failed or skipped); the regression stands"
                    .into(),
            ),
        }
    }
    c.confirm = Some(outcome);
    recount(c);
}

fn describe(r: &Row) -> String {
    match r.interval {
        Some(ci) => format!(
            "{:+.2}% [{:+.2}%, {:+.2}%]",
            100.0 * ci.point,
            100.0 * ci.lo,
            100.0 * ci.hi
        ),
        None => "no interval".into(),
    }
}

/// Recompute the counts and the exit code of `c` after verdicts changed.
pub fn recount(c: &mut Comparison) {
    c.counts = Counts {
        not_compared: c.counts.not_compared,
        ..Counts::of(&c.rows)
    };
    c.exit_code = c.status().code();
}

/// Re-measure `req` on this machine's GPU (see [`crate::kernels::repeats::run_repeated`]).
///
/// # Errors
/// No GPU, an unreadable suite, shapes or formats this build does not know, or the bench failing
/// to start.
pub fn gpu_measure(req: &ConfirmRequest) -> anyhow::Result<KernelResults> {
    use crate::formats::GemmFormat;
    let mut suite = crate::kernels::suite::load(&req.suite)?;
    let mut shapes: Vec<String> = req.cases.iter().map(|c| c.shape.clone()).collect();
    shapes.sort();
    shapes.dedup();
    suite.select_shapes(&shapes)?;
    let mut ms: Vec<usize> = req.cases.iter().map(|c| c.m).collect();
    ms.sort_unstable();
    ms.dedup();
    suite.m = ms;
    let mut formats: Vec<GemmFormat> = Vec::new();
    for c in &req.cases {
        let f: GemmFormat = c
            .implementation
            .parse()
            .map_err(|e: String| anyhow::anyhow!("cannot re-measure {}: {e}", c.implementation))?;
        if !formats.contains(&f) {
            formats.push(f);
        }
    }
    let policy = req.policy.clone();
    let opts = crate::kernels::bench::BenchOptions {
        suite,
        formats,
        stopping: policy
            .as_ref()
            .map(|p| p.stopping.clone())
            .unwrap_or_default(),
        warmup: policy.as_ref().map_or(3, |p| p.warmup_iters),
        cold_l2: policy.as_ref().is_none_or(|p| p.l2_flush_bytes > 0),
        flush: if policy.as_ref().is_some_and(|p| p.timer.contains("memset")) {
            crate::gpu::FlushMethod::Write
        } else {
            crate::gpu::FlushMethod::Read
        },
        tune_samples: 5,
        determinism_m: Vec::new(),
        determinism_runs: 2,
        peers: crate::kernels::peers::PeerMode::Off,
    };
    let rig = crate::rig::probe();
    if let Some(reason) = rig.gpu_absent_reason {
        anyhow::bail!("no GPU on this machine ({reason})");
    }
    crate::kernels::repeats::run_repeated(&opts, req.repeats, false, |_| {})
}
