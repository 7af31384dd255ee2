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
            // Peer rows (PyTorch) and derived rows (the decode-step composite) stand.
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
        r.notes.push(
            "--confirm: peer and decode-step composite rows are not re-measured; the verdict stands"
                .into(),
        );
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
        timing: policy.as_ref().map(|p| p.modes).unwrap_or_default(),
        peers_progress: None,
        peers_resume: false,
        peer_providers: Vec::new(),
    };
    let rig = crate::rig::probe();
    if let Some(reason) = rig.gpu_absent_reason {
        anyhow::bail!("no GPU on this machine ({reason})");
    }
    crate::kernels::repeats::run_repeated(&opts, req.repeats, false, |_| {})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::GemmFormat;
    use crate::kernels::schema::{CaseRepeats, KernelCase, SuiteRepeats, Timing};
    use rand::{rngs::StdRng, SeedableRng};
    use rand_distr::{Distribution, LogNormal, Normal};

    const SHAPES: [&str; 4] = ["qkv", "o_proj", "gate_up", "down"];
    const MS: [usize; 4] = [1, 16, 256, 2048];

    /// Kernel results of `repeats` repeats: 3 implementations × 4 shapes × 4 M, 1% between-run
    /// and 2% within-run noise; `slow` cases 10% slower.
    fn kernels(seed: u64, repeats: usize, slow: &dyn Fn(&str, &str) -> bool) -> KernelResults {
        let mut rng = StdRng::seed_from_u64(seed);
        let run = Normal::new(0.0, 0.01).unwrap();
        let within = LogNormal::new(0.0, 0.02).unwrap();
        let mut cases = Vec::new();
        let mut reps = Vec::new();
        for (ii, imp) in ["bf16", "fp8", "w4a16"].into_iter().enumerate() {
            for sh in SHAPES {
                for m in MS {
                    let t = 1e-5 * (1 + ii) as f64 * (1.0 + m as f64 / 100.0);
                    let s = if slow(imp, sh) { 1.1 } else { 1.0 };
                    let mut samples = Vec::new();
                    for _ in 0..repeats {
                        let u: f64 = run.sample(&mut rng);
                        samples.extend((0..15).map(|_| t * s * u.exp() * within.sample(&mut rng)));
                    }
                    cases.push(KernelCase {
                        provider: "rigbench".into(),
                        implementation: imp.into(),
                        format: imp.parse::<GemmFormat>().unwrap(),
                        shape: sh.into(),
                        m,
                        n: 64,
                        k: 64,
                        path: "p".into(),
                        check: None,
                        timing: Timing {
                            samples_s: samples,
                            ..Default::default()
                        },
                        extra: Vec::new(),
                        derived: Default::default(),
                        sm_clock_mhz: None,
                        throttle: Vec::new(),
                        graph: None,
                        graph_skip: None,
                        clocks: None,
                    });
                    reps.push(CaseRepeats {
                        provider: "rigbench".into(),
                        implementation: imp.into(),
                        shape: sh.into(),
                        m,
                        part: None,
                        sizes: vec![15; repeats],
                    });
                }
            }
        }
        KernelResults {
            cases,
            repeats: Some(SuiteRepeats {
                count: repeats,
                order: Vec::new(),
                cases: reps,
            }),
            ..Default::default()
        }
    }

    fn results(k: KernelResults) -> Results {
        let mut r = Results::new(Default::default(), "rig".into(), "t".into());
        r.complete = true;
        r.kernels = Some(k);
        r
    }

    fn first_comparison(slow_now: bool) -> (Results, Results, Comparison) {
        let base = results(kernels(1, 4, &|_, _| false));
        let cur = results(kernels(2, 2, &|i, s| {
            slow_now && i == "fp8" && s == "gate_up"
        }));
        let c = crate::compare::compare(
            &base,
            std::path::Path::new("b"),
            &cur,
            std::path::Path::new("c"),
            &Settings::default(),
            false,
        );
        (base, cur, c)
    }

    #[test]
    fn a_regression_that_does_not_reproduce_passes_and_one_that_does_stays() {
        let (base, cur, c) = first_comparison(true);
        assert_eq!(c.exit_code, 2, "{:?}", c.counts);
        let (cases, ids, peers) = flagged(&c, &cur);
        assert!(peers.is_empty());
        assert!(ids.iter().all(|i| i.contains("/fp8/gate_up/")), "{ids:?}");
        assert!(cases
            .iter()
            .all(|k| k.implementation == "fp8" && k.shape == "gate_up"));
        // The aggregate stands for every M.
        if ids.iter().any(|i| i.contains("all_m")) {
            assert_eq!(cases.len(), MS.len());
        }

        // Re-measured at the old speed: a transient, not reproduced.
        let mut asked = None;
        let mut transient = c.clone();
        confirm(
            &mut transient,
            &base,
            &cur,
            &Settings::default(),
            3,
            &mut |req| {
                asked = Some(req.clone());
                Ok(kernels(3, req.repeats, &|_, _| false))
            },
        );
        let req = asked.unwrap();
        assert_eq!(req.repeats, 3);
        assert_eq!(req.cases, cases);
        assert_eq!(transient.exit_code, 0, "{:?}", transient.counts);
        assert_eq!(transient.counts.regressed, 0);
        let cf = transient.confirm.as_ref().unwrap();
        assert_eq!((cf.reproduced, cf.not_reproduced), (0, ids.len()));
        let r = transient.rows.iter().find(|r| r.id == ids[0]).unwrap();
        assert_eq!(r.verdict, Verdict::NotReproduced);
        assert!(
            r.notes.iter().any(|n| n.contains("not reproduced")),
            "{r:?}"
        );

        // Re-measured still slow: confirmed.
        let mut real = c.clone();
        confirm(
            &mut real,
            &base,
            &cur,
            &Settings::default(),
            3,
            &mut |req| {
                Ok(kernels(4, req.repeats, &|i, s| {
                    i == "fp8" && s == "gate_up"
                }))
            },
        );
        assert_eq!(real.exit_code, 2);
        assert!(real.confirm.as_ref().unwrap().reproduced >= 1);
        assert!(real
            .rows
            .iter()
            .filter(|r| r.verdict == Verdict::Regressed)
            .all(|r| r.notes.iter().any(|n| n.contains("confirmed"))));

        // No GPU: the regressions stand, and the comparison says why.
        let mut none = c.clone();
        confirm(&mut none, &base, &cur, &Settings::default(), 3, &mut |_| {
            anyhow::bail!("no GPU on this machine (test)")
        });
        assert_eq!(none.exit_code, 2);
        assert!(none.warnings.iter().any(|w| w.contains("unconfirmed")));
        assert_eq!(
            none.confirm.as_ref().unwrap().problem.as_deref(),
            Some("no GPU on this machine (test)")
        );
    }

    #[test]
    fn nothing_flagged_measures_nothing() {
        let (base, cur, mut c) = first_comparison(false);
        assert_eq!(c.exit_code, 0, "{:?}", c.counts);
        confirm(&mut c, &base, &cur, &Settings::default(), 3, &mut |_| {
            panic!("nothing to re-measure")
        });
        assert_eq!(c.confirm.unwrap().cases, 0);
    }

    #[test]
    fn plants_apply_to_the_re_measurement_too() {
        let (base, _, _) = first_comparison(false);
        let cur = results(kernels(2, 2, &|_, _| false));
        let s = Settings {
            plants: vec!["kernels/rigbench/w4a16/down/*=10".parse().unwrap()],
            ..Settings::default()
        };
        let mut c = crate::compare::compare(
            &base,
            std::path::Path::new("b"),
            &cur,
            std::path::Path::new("c"),
            &s,
            false,
        );
        assert_eq!(c.exit_code, 2, "{:?}", c.counts);
        assert_eq!(c.planted.len(), MS.len());
        assert!(c.warnings.iter().any(|w| w.contains("TEST HOOK")));
        confirm(&mut c, &base, &cur, &s, 3, &mut |req| {
            Ok(kernels(5, req.repeats, &|_, _| false))
        });
        assert_eq!(
            c.exit_code, 2,
            "the planted slowdown reproduces: {:?}",
            c.counts
        );
    }
}
