//! Acceptance tests of the comparator's statistics (issues 7 and 13), through the public API
//! with the default settings (95% family-wise confidence, 2% kernel threshold).
//!
//! Part 1, one metric measured once per side (issue 7): the within-run interval of the change
//! of the median (`compare_metric`, `m = 1`).
//!
//! Timing model: a 100 µs kernel whose samples are `100 µs × LogNormal(0, σ)`, optionally with
//! outliers (probability 5% per sample, ×U(1.05, 1.5), like a clock dip or preemption).
//! The "default sample count" is [`DEFAULT_SAMPLE_COUNT`] = 10, the kernel bench's default
//! `StoppingRule::min_samples`: the fewest samples a kernel case reports, which it does only once
//! σ/mean ≤ 1%. The tests run at that count with σ = 1% (a converged case), 2% and 3% (twice and
//! three times the noise the stopping rule lets through at 10 samples), and 3% with outliers
//! (which the stopping rule would not stop at 10 samples for).
//!
//! Every trial draws fresh data from its own seed; the whole file is deterministic.

use std::collections::BTreeMap;

use rand::{rngs::StdRng, Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use rigbench::compare::{
    compare_metric, Direction, Group, Metric, MetricValue, Settings, Unit, Verdict,
    DEFAULT_SAMPLE_COUNT,
};

const TRIALS: usize = 200;

/// Noise of one scenario.
#[derive(Clone, Copy)]
struct Noise {
    sigma: f64,
    p_outlier: f64,
}

const CONVERGED: Noise = Noise {
    sigma: 0.01,
    p_outlier: 0.0,
};
const TWICE_CONVERGED: Noise = Noise {
    sigma: 0.02,
    p_outlier: 0.0,
};
const NOISY: Noise = Noise {
    sigma: 0.03,
    p_outlier: 0.0,
};
const NOISY_WITH_OUTLIERS: Noise = Noise {
    sigma: 0.03,
    p_outlier: 0.05,
};

fn draw(rng: &mut StdRng, n: usize, scale: f64, noise: Noise) -> Vec<f64> {
    let ln = LogNormal::new(0.0, noise.sigma).expect("valid sigma");
    (0..n)
        .map(|_| {
            let mut t = 100e-6 * scale * ln.sample(rng);
            if rng.random::<f64>() < noise.p_outlier {
                t *= rng.random_range(1.05..1.5);
            }
            t
        })
        .collect()
}

fn timing(samples: Vec<f64>) -> Metric {
    Metric {
        id: "kernels/rigbench/w4a16/gate_up/m=1/time_s".into(),
        group: Group::Kernels,
        unit: Unit::Seconds,
        direction: Direction::LowerIsBetter,
        value: MetricValue::Samples {
            samples,
            repeats: Vec::new(),
            between_run: None,
            slots: Vec::new(),
        },
        conditions: BTreeMap::new(),
        context: BTreeMap::new(),
    }
}

/// Verdict counts over `TRIALS` seeded trials of `n` baseline samples against `n` current
/// samples whose scale is `1 + change`.
fn trials(
    n: usize,
    noise: Noise,
    change: f64,
    settings: &Settings,
    seed: u64,
) -> BTreeMap<Verdict, usize> {
    let mut counts = BTreeMap::new();
    for t in 0..TRIALS {
        let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(t as u64));
        let base = draw(&mut rng, n, 1.0, noise);
        let cur = draw(&mut rng, n, 1.0 + change, noise);
        let row = compare_metric(&timing(base), &timing(cur), settings);
        *counts.entry(row.verdict).or_insert(0) += 1;
    }
    eprintln!(
        "n={n} sigma={} outliers={} change={change:+} threshold={}: {counts:?}",
        noise.sigma, noise.p_outlier, settings.threshold_kernels
    );
    counts
}

fn count(c: &BTreeMap<Verdict, usize>, v: Verdict) -> usize {
    c.get(&v).copied().unwrap_or(0)
}

#[test]
fn default_sample_count_is_the_stopping_rules_minimum() {
    assert_eq!(
        DEFAULT_SAMPLE_COUNT,
        rigbench::stats::StoppingRule::default().min_samples
    );
}

#[test]
fn a_a_false_regression_rate_is_at_most_one_percent() {
    let s = Settings::default();
    for (i, noise) in [CONVERGED, NOISY, NOISY_WITH_OUTLIERS]
        .into_iter()
        .enumerate()
    {
        let c = trials(DEFAULT_SAMPLE_COUNT, noise, 0.0, &s, 11 + i as u64);
        let reg = count(&c, Verdict::Regressed);
        assert!(
            reg * 100 <= TRIALS,
            "A/A sigma={} outliers={}: {reg}/{TRIALS} called Regressed ({c:?})",
            noise.sigma,
            noise.p_outlier
        );
        // Nor the mirror error.
        assert!(count(&c, Verdict::Improved) * 100 <= TRIALS, "{c:?}");
    }
}

#[test]
fn a_a_interval_is_calibrated_without_a_threshold() {
    // With no noise threshold, "Regressed" needs only the 99% interval to exclude zero from
    // below: nominally 0.5% of A/A trials. Allow binomial slack (4/200 = 2%) but no more; a
    // comparator of point estimates would call about half of these trials Regressed.
    let s = Settings {
        threshold_kernels: 0.0,
        confidence: 0.99,
        ..Settings::default()
    };
    let c = trials(DEFAULT_SAMPLE_COUNT, NOISY, 0.0, &s, 21);
    assert!(count(&c, Verdict::Regressed) <= 4, "{c:?}");
}

#[test]
fn planted_ten_percent_slowdown_is_regressed_in_95_percent() {
    let s = Settings::default();
    for (i, noise) in [CONVERGED, TWICE_CONVERGED].into_iter().enumerate() {
        let c = trials(DEFAULT_SAMPLE_COUNT, noise, 0.10, &s, 31 + i as u64);
        let reg = count(&c, Verdict::Regressed);
        assert!(
            reg * 100 >= 95 * TRIALS,
            "10% slowdown sigma={}: only {reg}/{TRIALS} Regressed ({c:?})",
            noise.sigma
        );
        assert_eq!(count(&c, Verdict::Same) + count(&c, Verdict::Improved), 0);
    }
    // At σ = 3% and 10 samples the power is lower (964 of 1000 trials when this was written);
    // the misses are Ambiguous, never Same.
    let c = trials(DEFAULT_SAMPLE_COUNT, NOISY, 0.10, &s, 35);
    assert!(count(&c, Verdict::Regressed) * 100 >= 90 * TRIALS, "{c:?}");
    assert_eq!(count(&c, Verdict::Same) + count(&c, Verdict::Improved), 0);
    // With outliers the same power needs more samples, which the stopping rule takes (a case with
    // outliers does not converge at 10 samples).
    let c = trials(30, NOISY_WITH_OUTLIERS, 0.10, &s, 33);
    assert!(count(&c, Verdict::Regressed) * 100 >= 95 * TRIALS, "{c:?}");
}

#[test]
fn half_percent_change_is_never_regressed_at_two_percent() {
    let s = Settings::default();
    assert_eq!(s.threshold_kernels, 0.02);
    for (i, noise) in [CONVERGED, NOISY, NOISY_WITH_OUTLIERS]
        .into_iter()
        .enumerate()
    {
        let c = trials(DEFAULT_SAMPLE_COUNT, noise, 0.005, &s, 41 + i as u64);
        assert_eq!(
            count(&c, Verdict::Regressed),
            0,
            "sigma={}: {c:?}",
            noise.sigma
        );
    }
    // And with ample samples of converged data it is called Same.
    let c = trials(30, CONVERGED, 0.005, &s, 44);
    assert!(count(&c, Verdict::Same) * 100 >= 95 * TRIALS, "{c:?}");
}

#[test]
fn too_little_data_is_ambiguous_never_same() {
    // σ = 10% with 5 samples cannot tell a 10% slowdown from noise: the honest verdict is
    // Not enough samples (or Ambiguous), never Same or Improved.
    let s = Settings::default();
    let noise = Noise {
        sigma: 0.10,
        p_outlier: 0.05,
    };
    let c = trials(5, noise, 0.10, &s, 51);
    assert_eq!(count(&c, Verdict::Same), 0, "{c:?}");
    assert_eq!(count(&c, Verdict::Improved), 0, "{c:?}");
    assert!(
        count(&c, Verdict::Ambiguous) + count(&c, Verdict::NotEnoughSamples) > TRIALS / 2,
        "{c:?}"
    );
    // Below the minimum sample count no interval is computed at all.
    let row = compare_metric(
        &timing(vec![1.0; 4]),
        &timing(vec![2.0; 4]),
        &Settings::default(),
    );
    assert_eq!(row.verdict, Verdict::NotEnoughSamples);
    assert!(row.notes.join(" ").contains("too few samples"), "{row:?}");
}

#[test]
fn an_undecidable_sample_says_not_enough_samples_and_how_many() {
    // Eight end-to-end requests per point with a 30% spread cannot decide at ±5% (issue 13:
    // they used to read "Ambiguous" with an interval like −62%…+162%).
    let mut rng = StdRng::seed_from_u64(71);
    let noise = Noise {
        sigma: 0.30,
        p_outlier: 0.0,
    };
    let mk = |samples: Vec<f64>| Metric {
        id: "e2e/tiny/c=4/ttft_s".into(),
        group: Group::E2e,
        ..timing(samples)
    };
    let base = draw(&mut rng, 8, 1.0, noise);
    let cur = draw(&mut rng, 8, 1.0, noise);
    let row = compare_metric(&mk(base), &mk(cur), &Settings::default());
    assert_eq!(row.verdict, Verdict::NotEnoughSamples, "{row:?}");
    let note = row.notes.join(" ");
    assert!(
        note.contains("not enough samples (n = 8 and 8) to decide at ±5.0%"),
        "{note}"
    );
    // The count it names is enough: at that many requests the same noise decides.
    let n: usize = note
        .split("about ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .expect("a count");
    assert!(n > 8, "{note}");
    let base = draw(&mut rng, n, 1.0, noise);
    let cur = draw(&mut rng, n, 1.0, noise);
    let row = compare_metric(&mk(base), &mk(cur), &Settings::default());
    assert_ne!(row.verdict, Verdict::NotEnoughSamples, "{row:?}");
}

#[test]
fn throughput_direction_is_mirrored() {
    // Higher-is-better samples (e.g. tok/s): a 10% drop is a regression.
    let mut rng = StdRng::seed_from_u64(61);
    let mk = |samples: Vec<f64>| Metric {
        id: "e2e/x/output_tok_s".into(),
        group: Group::E2e,
        unit: Unit::TokensPerSecond,
        direction: Direction::HigherIsBetter,
        value: MetricValue::Samples {
            samples,
            repeats: Vec::new(),
            between_run: None,
            slots: Vec::new(),
        },
        conditions: BTreeMap::new(),
        context: BTreeMap::new(),
    };
    let base = draw(&mut rng, 30, 1.0, CONVERGED);
    let cur = draw(&mut rng, 30, 0.9, CONVERGED);
    let row = compare_metric(&mk(base.clone()), &mk(cur), &Settings::default());
    assert_eq!(row.verdict, Verdict::Regressed, "{row:?}");
    assert_eq!(
        row.threshold,
        Some(0.05),
        "non-kernel metrics use the e2e threshold"
    );
    let faster = draw(&mut rng, 30, 1.2, CONVERGED);
    assert_eq!(
        compare_metric(&mk(base), &mk(faster), &Settings::default()).verdict,
        Verdict::Improved
    );
}

// Part 2 (issue 13): a whole suite measured in repeats, with between-run variance that one run
// cannot see. A simulated H200-like suite: 3 implementations × 8 shapes × 6 M values, each case
// with its own between-run spread of the median (log-normal around 1.5%, one case in ten at 4%:
// the spreads measured between the committed H200 runs range from 0.4% to 9%), 20 samples per
// repeat with 2% within-run noise. Each run draws one run effect per case (the whole suite is
// re-prepared in every repeat). The recipe of docs/gate.md: a baseline of 4 repeats, results of
// 2 repeats.

const IMPLS: [&str; 3] = ["bf16", "fp8", "w4a16"];
const SHAPES: [&str; 8] = [
    "qkv",
    "o_proj",
    "in_proj_qkvz",
    "in_proj_ba",
    "out_proj",
    "gate_up",
    "down",
    "lm_head",
];
const MS: [usize; 6] = [1, 4, 16, 64, 256, 1024];

struct SuiteModel {
    /// Per case: (id, true time, between-run sd of ln median).
    cases: Vec<(String, f64, f64)>,
    /// Per case: the fixed effect on `ln median` of each slot (position in the implementation
    /// order, which rotates per repeat); zero without position effects.
    slot_effects: Vec<[f64; 3]>,
}

impl SuiteModel {
    fn new(seed: u64) -> Self {
        Self::with_slot_effects(seed, 0.0)
    }

    /// A suite whose cases also depend on their position in the rotated order: per case and
    /// slot a fixed effect with standard deviation `slot_sd` (on the H200 up to 3-6% for a small
    /// case timed first after its shape's weights are prepared: docs/gate.md).
    fn with_slot_effects(seed: u64, slot_sd: f64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let spread = LogNormal::new((0.015f64).ln(), 0.4).unwrap();
        let mut cases = Vec::new();
        for i in IMPLS {
            for sh in SHAPES {
                for m in MS {
                    let sd = if rng.random::<f64>() < 0.1 {
                        0.04
                    } else {
                        spread.sample(&mut rng)
                    };
                    let t = 1e-5 * (1.0 + m as f64 / 64.0) * rng.random_range(1.0..4.0);
                    cases.push((format!("kernels/rigbench/{i}/{sh}/m={m}/time_s"), t, sd));
                }
            }
        }
        let pos = rand_distr::Normal::new(0.0, slot_sd.max(1e-12)).unwrap();
        let slot_effects = cases
            .iter()
            .map(|_| {
                if slot_sd > 0.0 {
                    [0.0, pos.sample(&mut rng), pos.sample(&mut rng)]
                } else {
                    [0.0; 3]
                }
            })
            .collect();
        Self {
            cases,
            slot_effects,
        }
    }

    /// One run of `repeats` repeats: the metrics, cases matching `slow` scaled by 1.1.
    fn run(&self, rng: &mut StdRng, repeats: usize, slow: &dyn Fn(&str) -> bool) -> Vec<Metric> {
        self.run_slots(rng, repeats, slow, false)
    }

    /// [`SuiteModel::run`], the implementation order rotated per repeat (implementation `i` of
    /// [`IMPLS`] in slot `(i − r) mod 3` of repeat `r`), the slots recorded when `record`.
    fn run_slots(
        &self,
        rng: &mut StdRng,
        repeats: usize,
        slow: &dyn Fn(&str) -> bool,
        record: bool,
    ) -> Vec<Metric> {
        let within = LogNormal::new(0.0, 0.02).unwrap();
        self.cases
            .iter()
            .zip(&self.slot_effects)
            .map(|((id, t, sd), slot_effect)| {
                let effect = rand_distr::Normal::new(0.0, *sd).unwrap();
                let scale = if slow(id) { 1.10 } else { 1.0 };
                let imp = IMPLS
                    .iter()
                    .position(|i| id.starts_with(&format!("kernels/rigbench/{i}/")))
                    .unwrap_or(0);
                let slots: Vec<usize> = (0..repeats).map(|r| (imp + 3 - r % 3) % 3).collect();
                let mut samples = Vec::new();
                for slot in &slots {
                    let u = (effect.sample(rng) + slot_effect[*slot]).exp();
                    samples.extend((0..20).map(|_| t * scale * u * within.sample(rng)));
                }
                Metric {
                    id: id.clone(),
                    group: Group::Kernels,
                    unit: Unit::Seconds,
                    direction: Direction::LowerIsBetter,
                    value: MetricValue::Samples {
                        samples,
                        repeats: if repeats > 1 {
                            vec![20; repeats]
                        } else {
                            Vec::new()
                        },
                        between_run: None,
                        slots: if record && repeats > 1 {
                            slots
                        } else {
                            Vec::new()
                        },
                    },
                    conditions: BTreeMap::new(),
                    context: BTreeMap::new(),
                }
            })
            .collect()
    }
}

fn regressed(rows: &[rigbench::compare::Row]) -> Vec<String> {
    rows.iter()
        .filter(|r| r.verdict == Verdict::Regressed)
        .map(|r| r.id.clone())
        .collect()
}

const SUITE_TRIALS: usize = 40;

#[test]
fn repeated_a_a_comparisons_pass_at_the_default_thresholds() {
    let model = SuiteModel::new(81);
    let s = Settings::default();
    let mut failed = 0;
    for t in 0..SUITE_TRIALS {
        let mut rng = StdRng::seed_from_u64(8100 + t as u64);
        let base = model.run(&mut rng, 4, &|_| false);
        let cur = model.run(&mut rng, 2, &|_| false);
        let (rows, _) = rigbench::compare::compare_metrics(&base, &cur, &s);
        let reg = regressed(&rows);
        if !reg.is_empty() {
            eprintln!("A/A trial {t}: {reg:?}");
            failed += 1;
        }
        // Every case plus one aggregate per (implementation, shape).
        assert_eq!(rows.len(), model.cases.len() + IMPLS.len() * SHAPES.len());
    }
    eprintln!("repeated A/A: {failed}/{SUITE_TRIALS} comparisons with a regression");
    assert!(
        failed * 100 <= 5 * SUITE_TRIALS,
        "{failed}/{SUITE_TRIALS} A/A comparisons failed"
    );
}

#[test]
fn one_run_per_side_cries_wolf_where_repeats_do_not() {
    // The fault of issue 13: with one run per side, the within-run interval cannot see the
    // between-run spread, and a comparison of a suite with itself regresses.
    let model = SuiteModel::new(82);
    let s = Settings::default();
    let mut failed = 0;
    for t in 0..20 {
        let mut rng = StdRng::seed_from_u64(8200 + t as u64);
        let base = model.run(&mut rng, 1, &|_| false);
        let cur = model.run(&mut rng, 1, &|_| false);
        let (rows, _) = rigbench::compare::compare_metrics(&base, &cur, &s);
        failed += usize::from(!regressed(&rows).is_empty());
    }
    eprintln!("single-run A/A: {failed}/20 comparisons with a regression");
    // Far above the 5% a gate may cry wolf (the family's empirical null absorbs part of the
    // drift, not the metrics that drift more than their family).
    assert!(
        failed >= 5,
        "only {failed}/20 single-run A/A comparisons failed"
    );
}

#[test]
fn planted_ten_percent_on_one_shape_is_caught_and_nothing_else() {
    let model = SuiteModel::new(83);
    let s = Settings::default();
    let mut caught = 0;
    let mut trials_run = 0;
    for t in 0..SUITE_TRIALS {
        let imp = IMPLS[t % IMPLS.len()];
        let shape = SHAPES[(t / IMPLS.len()) % SHAPES.len()];
        let prefix = format!("kernels/rigbench/{imp}/{shape}/");
        let mut rng = StdRng::seed_from_u64(8300 + t as u64);
        let base = model.run(&mut rng, 4, &|_| false);
        let cur = model.run(&mut rng, 2, &|id| id.starts_with(&prefix));
        let (rows, _) = rigbench::compare::compare_metrics(&base, &cur, &s);
        let reg = regressed(&rows);
        let hit = reg.iter().any(|id| id.starts_with(&prefix));
        let other: Vec<&String> = reg.iter().filter(|id| !id.starts_with(&prefix)).collect();
        if hit && other.is_empty() {
            caught += 1;
        } else {
            eprintln!("trial {t} ({prefix}): hit {hit}, others {other:?}");
        }
        trials_run += 1;
    }
    eprintln!("planted 10%: caught {caught}/{trials_run}");
    assert!(
        caught * 100 >= 95 * trials_run,
        "caught {caught}/{trials_run}"
    );
}

#[test]
fn position_effects_are_fitted_when_the_slots_are_recorded() {
    // The rotated implementation order makes a case's time depend on its slot (on the H200 a
    // small case is up to 3-6% slower when timed first after its shape is prepared). Without
    // the slots those differences look like between-run variance, the intervals widen, and a
    // planted 10% slowdown is "not enough samples"; with them the slot is a block factor.
    // Baseline of 6 repeats, results of 3 (docs/gate.md): each slot on both sides.
    let model = SuiteModel::with_slot_effects(84, 0.04);
    let s = Settings::default();
    let (mut caught, mut caught_unfitted, mut aa_failed) = (0, 0, 0);
    let (mut undecided, mut undecided_unfitted) = (0.0, 0.0);
    // Mean standard error of the change (log scale) over the rows.
    let undecidable = |rows: &[rigbench::compare::Row]| {
        let se: Vec<f64> = rows
            .iter()
            .filter_map(|r| r.interval.map(|i| i.se_log))
            .collect();
        se.iter().sum::<f64>() / se.len().max(1) as f64
    };
    for t in 0..SUITE_TRIALS {
        let imp = IMPLS[t % IMPLS.len()];
        let shape = SHAPES[(t / IMPLS.len()) % SHAPES.len()];
        let prefix = format!("kernels/rigbench/{imp}/{shape}/");
        let slow = |id: &str| id.starts_with(&prefix);
        let mut rng = StdRng::seed_from_u64(8400 + t as u64);
        let base = model.run_slots(&mut rng, 6, &|_| false, true);
        let cur = model.run_slots(&mut rng, 3, &slow, true);
        let same = model.run_slots(&mut rng, 3, &|_| false, true);
        let clean = |rows: &[rigbench::compare::Row]| {
            let reg = regressed(rows);
            reg.iter().any(|id| id.starts_with(&prefix))
                && reg.iter().all(|id| id.starts_with(&prefix))
        };
        let (rows, _) = rigbench::compare::compare_metrics(&base, &cur, &s);
        caught += usize::from(clean(&rows));
        let (rows, _) = rigbench::compare::compare_metrics(&base, &same, &s);
        aa_failed += usize::from(!regressed(&rows).is_empty());
        undecided += undecidable(&rows);
        // The same data without the slots.
        let strip = |ms: &[Metric]| -> Vec<Metric> {
            ms.iter()
                .cloned()
                .map(|mut m| {
                    if let MetricValue::Samples { slots, .. } = &mut m.value {
                        slots.clear();
                    }
                    m
                })
                .collect()
        };
        let (rows, _) = rigbench::compare::compare_metrics(&strip(&base), &strip(&cur), &s);
        caught_unfitted += usize::from(clean(&rows));
        let (rows, _) = rigbench::compare::compare_metrics(&strip(&base), &strip(&same), &s);
        undecided_unfitted += undecidable(&rows);
    }
    eprintln!(
        "slot effects 4%: planted caught {caught}/{SUITE_TRIALS} with slots, {caught_unfitted} without; A/A failed {aa_failed}; mean se of the A/A changes {:.4} with slots, {:.4} without",
        undecided / SUITE_TRIALS as f64,
        undecided_unfitted / SUITE_TRIALS as f64
    );
    assert!(caught * 100 >= 95 * SUITE_TRIALS, "caught {caught}");
    assert!(caught >= caught_unfitted, "{caught} < {caught_unfitted}");
    assert!(
        aa_failed * 100 <= 5 * SUITE_TRIALS,
        "A/A failed {aa_failed}"
    );
    // The position effects stay out of the between-run variance: narrower intervals.
    assert!(
        undecided * 1.2 <= undecided_unfitted,
        "mean se: {undecided} with slots, {undecided_unfitted} without"
    );
}

#[test]
fn repeat_sizes_that_do_not_add_up_are_named_not_trusted() {
    // A hand-edited or truncated results.json: sizes that overflow or do not sum to the samples.
    let mut rng = StdRng::seed_from_u64(91);
    let base = timing(draw(&mut rng, 40, 1.0, CONVERGED));
    for bad in [vec![usize::MAX, 1, 0], vec![20, 19], vec![40, 0]] {
        let mut cur = timing(draw(&mut rng, 40, 1.0, CONVERGED));
        if let MetricValue::Samples { repeats, .. } = &mut cur.value {
            *repeats = bad.clone();
        }
        let row = compare_metric(&base, &cur, &Settings::default());
        assert!(
            row.notes
                .iter()
                .any(|n| n.contains("do not split its 40 samples") && n.contains("results.json")),
            "{bad:?}: {:?}",
            row.notes
        );
    }
}
