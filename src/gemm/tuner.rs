//! The one tuner of the GEMM layer ([`crate::gemm::ops`]): the kernel bench's choice among an
//! implementation's configurations and the built-in runtime's choices at load (the W4A16
//! configuration and the FP8 scaling path of every linear shape at each M bucket) follow the
//! same rule, "correct before fast":
//!
//! 1. each candidate runs once and its output is compared with the reference (relative L2, a
//!    NaN never passes); a candidate over the tolerance, or whose launch fails, is never timed
//!    and never chosen;
//! 2. each passing candidate is timed (the caller's timing: the bench's stopping rule with a
//!    cold L2, the runtime's median of [`TUNE_SAMPLES`] with a cold L2); a time that is not a
//!    positive finite number counts as a failure;
//! 3. the fastest is chosen; a tie keeps the earlier candidate, so candidates are listed with the
//!    preferred default first.
//!
//! Timing and checking are closures, so the rule is tested on the CPU with mock candidates.

/// Token counts (M) the runtime tunes at load; another M uses the choice of the next larger
/// bucket ([`bucket_for`]), and an M above the last bucket the caller's default.
pub const M_BUCKETS: [usize; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/// Timed samples per candidate in the runtime's tuning (the bench's default too: its
/// `--tune-samples`); the median is kept.
pub const TUNE_SAMPLES: usize = 5;

/// The bucket of [`M_BUCKETS`] whose choice serves `m` tokens: the smallest bucket ≥ `m`, or
/// `None` above the last.
pub fn bucket_for(m: usize) -> Option<usize> {
    M_BUCKETS.iter().copied().find(|b| *b >= m)
}

/// What happened to one candidate.
#[derive(Debug, Clone, PartialEq)]
pub enum Trial {
    /// Passed its check and was timed: median seconds, and its relative L2 error.
    Timed {
        /// Median seconds per run.
        seconds: f64,
        /// Relative L2 error against the reference.
        rel_l2: f64,
    },
    /// Failed its check: relative L2 over the tolerance, or NaN.
    Rejected {
        /// Relative L2 error against the reference.
        rel_l2: f64,
    },
    /// Its launch (`stage` "check") or its timing (`stage` "timing") failed.
    Failed {
        /// `check` or `timing`.
        stage: &'static str,
        /// What went wrong.
        why: String,
    },
}

/// The tuner's outcome: the chosen candidate (`None` when none passed and timed) and every
/// candidate's trial, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuned {
    /// Index of the fastest candidate that passed its check.
    pub chosen: Option<usize>,
    /// One trial per candidate, in candidate order.
    pub trials: Vec<Trial>,
}

impl Tuned {
    /// Candidates that failed their check or launch or timing (not usable).
    pub fn unusable(&self) -> usize {
        self.trials
            .iter()
            .filter(|t| !matches!(t, Trial::Timed { .. }))
            .count()
    }

    /// Median seconds of candidate `i`, when it was timed.
    pub fn seconds(&self, i: usize) -> Option<f64> {
        match self.trials.get(i) {
            Some(Trial::Timed { seconds, .. }) => Some(*seconds),
            _ => None,
        }
    }
}

/// Choose among `candidates` by the rule of the module docs. `check(i)` runs candidate `i`
/// once and returns its relative L2 error against the reference; `time(i)` returns its median
/// seconds (called only for candidates that passed); `on_trial(i, trial)` is called after each
/// candidate's trial, while it is still the one set up (the bench's tuning log).
///
/// Call order (callers rely on it): candidates in index order, and for each `check(i)`, then
/// `time(i)` right after it (when it passed), then `on_trial(i, _)`; so `time` and `on_trial`
/// may use what `check` set up, and a candidate's check may use what earlier candidates' checks
/// left (the runtime's FP8 reference).
pub fn choose(
    candidates: usize,
    tolerance: f64,
    mut check: impl FnMut(usize) -> anyhow::Result<f64>,
    mut time: impl FnMut(usize) -> anyhow::Result<f64>,
    mut on_trial: impl FnMut(usize, &Trial),
) -> Tuned {
    let mut chosen: Option<(usize, f64)> = None;
    let mut trials = Vec::with_capacity(candidates);
    for i in 0..candidates {
        let trial = match check(i) {
            Err(e) => Trial::Failed {
                stage: "check",
                why: format!("{e:#}"),
            },
            Ok(err) if err.is_nan() || err > tolerance => Trial::Rejected { rel_l2: err },
            Ok(err) => match time(i) {
                Ok(s) if s.is_finite() && s > 0.0 => Trial::Timed {
                    seconds: s,
                    rel_l2: err,
                },
                Ok(s) => Trial::Failed {
                    stage: "timing",
                    why: format!("unusable time {s} s"),
                },
                Err(e) => Trial::Failed {
                    stage: "timing",
                    why: format!("{e:#}"),
                },
            },
        };
        if let Trial::Timed { seconds, .. } = trial {
            if chosen.is_none_or(|(_, best)| seconds < best) {
                chosen = Some((i, seconds));
            }
        }
        on_trial(i, &trial);
        trials.push(trial);
    }
    Tuned {
        chosen: chosen.map(|(i, _)| i),
        trials,
    }
}

/// The median of `samples` values of `sample()` (seconds), each sample preceded by `flush()`
/// (the L2 flush of a cold-L2 timing). For an even count the upper middle value.
///
/// # Errors
/// `samples` is 0, or a flush or sample fails.
pub fn median_cold(
    samples: usize,
    mut flush: impl FnMut() -> anyhow::Result<()>,
    mut sample: impl FnMut() -> anyhow::Result<f64>,
) -> anyhow::Result<f64> {
    anyhow::ensure!(samples > 0, "a median of 0 samples");
    let mut t = Vec::with_capacity(samples);
    for _ in 0..samples {
        flush()?;
        t.push(sample()?);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[samples / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(errs: &[anyhow::Result<f64>], times: &[f64], tol: f64) -> (Tuned, Vec<usize>) {
        let mut timed = Vec::new();
        let mut seen = Vec::new();
        let t = choose(
            errs.len(),
            tol,
            |i| match &errs[i] {
                Ok(e) => Ok(*e),
                Err(e) => Err(anyhow::anyhow!("{e}")),
            },
            |i| {
                timed.push(i);
                Ok(times[i])
            },
            |i, _| seen.push(i),
        );
        assert_eq!(seen, (0..errs.len()).collect::<Vec<_>>());
        (t, timed)
    }

    #[test]
    fn the_fastest_passing_candidate_wins_and_failures_are_never_timed() {
        let (t, timed) = run(
            &[
                Ok(1e-3),
                Ok(0.5),
                Err(anyhow::anyhow!("too much shared memory")),
                Ok(f64::NAN),
                Ok(2e-3),
            ],
            &[40e-6, 1e-6, 1e-6, 1e-6, 30e-6],
            1e-2,
        );
        assert_eq!(t.chosen, Some(4));
        assert_eq!(
            timed,
            vec![0, 4],
            "rejected and failed candidates are not timed"
        );
        assert_eq!(t.unusable(), 3);
        assert!(matches!(t.trials[1], Trial::Rejected { rel_l2 } if rel_l2 == 0.5));
        assert!(matches!(t.trials[2], Trial::Failed { stage: "check", .. }));
        assert!(matches!(t.trials[3], Trial::Rejected { rel_l2 } if rel_l2.is_nan()));
        assert_eq!(t.seconds(4), Some(30e-6));
        assert_eq!(t.seconds(1), None);
    }

    /// The runtime's FP8 scaling choice, outer-vector first: the FP32 path must be strictly
    /// faster to be chosen (the H200's Qwen3-32B `down` at M = 1, 2026-11-30: 97.0 µs
    /// outer-vector against 50.3 µs FP32 + scale; its `qkv` at M = 256: 43.2 against 49.2).
    #[test]
    fn ties_and_unusable_times_keep_the_first_candidate() {
        assert_eq!(
            run(&[Ok(0.0), Ok(1e-3)], &[97.0e-6, 50.3e-6], 1e-2)
                .0
                .chosen,
            Some(1)
        );
        assert_eq!(
            run(&[Ok(0.0), Ok(1e-3)], &[43.2e-6, 49.2e-6], 1e-2)
                .0
                .chosen,
            Some(0)
        );
        assert_eq!(
            run(&[Ok(0.0), Ok(1e-3)], &[40e-6, 40e-6], 1e-2).0.chosen,
            Some(0)
        );
        for bad in [f64::NAN, 0.0, -1.0, f64::INFINITY] {
            let (t, _) = run(&[Ok(0.0), Ok(1e-3)], &[40e-6, bad], 1e-2);
            assert_eq!(t.chosen, Some(0), "time {bad}");
            assert!(matches!(
                t.trials[1],
                Trial::Failed {
                    stage: "timing",
                    ..
                }
            ));
        }
        // Over the tolerance: not chosen however fast.
        assert_eq!(
            run(&[Ok(0.0), Ok(2e-2)], &[40e-6, 1e-6], 1e-2).0.chosen,
            Some(0)
        );
        // At the tolerance: passes.
        assert_eq!(
            run(&[Ok(0.0), Ok(1e-2)], &[40e-6, 1e-6], 1e-2).0.chosen,
            Some(1)
        );
    }

    #[test]
    fn calls_come_in_the_documented_order() {
        let log = std::cell::RefCell::new(Vec::new());
        let t = choose(
            3,
            1e-2,
            |i| {
                log.borrow_mut().push(format!("check {i}"));
                Ok(if i == 1 { 1.0 } else { 0.0 })
            },
            |i| {
                log.borrow_mut().push(format!("time {i}"));
                Ok(1e-6)
            },
            |i, _| log.borrow_mut().push(format!("trial {i}")),
        );
        assert_eq!(
            log.into_inner(),
            [
                "check 0", "time 0", "trial 0", "check 1", "trial 1", "check 2", "time 2",
                "trial 2"
            ]
        );
        assert_eq!(t.chosen, Some(0), "a tie keeps the earlier");
    }

    #[test]
    fn nothing_passes_nothing_is_chosen() {
        let (t, timed) = run(&[Ok(1.0), Err(anyhow::anyhow!("x"))], &[1e-6, 1e-6], 1e-2);
        assert_eq!(t.chosen, None);
        assert!(timed.is_empty());
        assert_eq!(t.unusable(), 2);
        assert_eq!(
            choose(0, 1.0, |_| Ok(0.0), |_| Ok(1.0), |_, _| {}).chosen,
            None
        );
    }

    #[test]
    fn median_flushes_before_every_sample() {
        let mut flushes = 0;
        let mut v = [5.0, 1.0, 4.0, 2.0, 3.0].into_iter();
        let m = median_cold(
            5,
            || {
                flushes += 1;
                Ok(())
            },
            || Ok(v.next().unwrap_or(f64::NAN)),
        )
        .expect("median");
        assert_eq!((m, flushes), (3.0, 5));
        assert!(median_cold(0, || Ok(()), || Ok(1.0)).is_err());
        assert!(median_cold(3, || anyhow::bail!("flush failed"), || Ok(1.0)).is_err());
    }

    #[test]
    fn buckets_round_up() {
        assert_eq!(bucket_for(1), Some(1));
        assert_eq!(bucket_for(3), Some(4));
        assert_eq!(bucket_for(1024), Some(1024));
        assert_eq!(bucket_for(1025), None);
        assert_eq!(bucket_for(0), Some(1));
    }
}
