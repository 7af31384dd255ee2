//! Repeats of a kernel suite (`report --repeats R`, `kernels --repeats R`): the suite is run R
//! times in one process, each repeat a fresh bench (context, compiled kernels, weights, inputs,
//! tuning), with the implementation order rotated from one repeat to the next so that time drift
//! (clocks, power, temperature) is spread over every implementation instead of loading one; the
//! repeats are then merged into one [`KernelResults`] whose cases hold every repeat's samples in
//! repeat order, with [`SuiteRepeats`] saying how many came from each repeat.
//!
//! The repeat is the unit of the CI gate's statistics (see [`crate::compare::gate`]): the spread
//! of the repeats' medians is the between-run variance a single run cannot show.

use std::collections::BTreeMap;

use super::schema::{CaseRepeats, KernelCase, KernelResults, SuiteRepeats, Timing};
use crate::formats::GemmFormat;
use crate::stats::Summary;

/// `formats` rotated left by `repeat` places (repeat 0 keeps the given order).
pub fn rotated(formats: &[GemmFormat], repeat: usize) -> Vec<GemmFormat> {
    let mut f = formats.to_vec();
    if !f.is_empty() {
        let n = f.len();
        f.rotate_left(repeat % n);
    }
    f
}

/// The order of repeat `repeat`: the formats that `first` (repeat 0's results) timed, rotated
/// left by `repeat` places, then the formats it timed nothing of (e.g. native W4A4 below
/// sm_100), in the given order. Only formats that run take part in the rotation, so from repeat
/// 1 on a case's rank among the formats that run (its *slot*, which the comparison fits as a
/// block factor: [`crate::compare::gate::Paired::slot_fit`]) cycles with their period; repeat 0
/// (no `first` yet) keeps the given order, where a skipped format takes no slot either.
pub fn order_for(
    formats: &[GemmFormat],
    first: Option<&KernelResults>,
    repeat: usize,
) -> Vec<GemmFormat> {
    let Some(first) = first else {
        return rotated(formats, repeat);
    };
    let (timed, idle): (Vec<GemmFormat>, Vec<GemmFormat>) = formats.iter().partition(|f| {
        first
            .cases
            .iter()
            .any(|c| c.provider == "rigbench" && c.format == **f)
    });
    let mut o = rotated(&timed, repeat);
    o.extend(idle);
    o
}

/// Run the suite of `opts` `repeats` times on GPU 0 (implementation order rotated per repeat,
/// the determinism check in the first repeat only; peers after each repeat when `with_peers`)
/// and merge the repeats. `on_update` sees the merged results after every case.
///
/// # Errors
/// The first repeat failed to start (no GPU, NVRTC): as [`super::bench::run`]. A later repeat
/// that fails is recorded in the notes; the repeats before it are kept.
pub fn run_repeated(
    opts: &super::bench::BenchOptions,
    repeats: usize,
    with_peers: bool,
    on_update: impl FnMut(&KernelResults),
) -> anyhow::Result<KernelResults> {
    run_repeated_with(
        opts,
        repeats,
        with_peers,
        |o, upd| super::bench::run(o, upd),
        on_update,
    )
}

/// [`run_repeated`] with the bench of one repeat given (e.g. on another CUDA device).
///
/// # Errors
/// As [`run_repeated`].
pub fn run_repeated_with(
    opts: &super::bench::BenchOptions,
    repeats: usize,
    with_peers: bool,
    mut bench: impl FnMut(
        &super::bench::BenchOptions,
        &mut dyn FnMut(&KernelResults),
    ) -> anyhow::Result<KernelResults>,
    mut on_update: impl FnMut(&KernelResults),
) -> anyhow::Result<KernelResults> {
    let repeats = repeats.max(1);
    let mut done: Vec<KernelResults> = Vec::new();
    let mut orders: Vec<Vec<String>> = Vec::new();
    for r in 0..repeats {
        let mut o = opts.clone();
        o.formats = order_for(&opts.formats, done.first(), r);
        if r > 0 {
            o.determinism_m.clear();
        }
        let order: Vec<String> = o.formats.iter().map(|f| f.id().to_string()).collect();
        let mut with_current = |partial: &KernelResults| {
            let mut all = done.clone();
            all.push(partial.clone());
            let mut ords = orders.clone();
            ords.push(order.clone());
            on_update(&merge(&all, &ords));
        };
        match bench(&o, &mut with_current) {
            Ok(mut k) => {
                // Stopped by SIGINT/SIGTERM: keep what was measured, start nothing new.
                let stopped = crate::signals::interrupted();
                if with_peers && stopped.is_none() {
                    super::peers::run_into(&o, &mut k);
                }
                done.push(k);
                orders.push(order);
                if let Some(sig) = stopped {
                    let mut m = merge(&done, &orders);
                    if r + 1 < repeats {
                        m.notes.push(format!(
                            "interrupted by {sig} during repeat {} of {repeats}: the repeats measured so far are kept",
                            r + 1
                        ));
                    }
                    return Ok(m);
                }
            }
            Err(e) if r == 0 => return Err(e),
            Err(e) => {
                let mut m = merge(&done, &orders);
                m.notes.push(format!(
                    "repeat {} of {repeats} failed ({e:#}); the {r} repeats before it are kept",
                    r + 1
                ));
                return Ok(m);
            }
        }
        if repeats > 1 {
            eprintln!("rigbench: repeat {} of {repeats} done", r + 1);
        }
    }
    Ok(merge(&done, &orders))
}

/// The samples of several timings pooled in order, summarized again.
fn pooled(parts: &[&Timing]) -> Timing {
    let samples: Vec<f64> = parts
        .iter()
        .flat_map(|t| t.samples_s.iter().copied())
        .collect();
    let first = parts.first().map(|t| (*t).clone()).unwrap_or_default();
    match Summary::of(&samples) {
        Some(s) => Timing {
            median_s: s.median,
            p10_s: s.p10,
            p90_s: s.p90,
            rel_std: s.rel_std(),
            samples_s: samples,
            ..first
        },
        None => first,
    }
}

/// (provider, implementation, shape, M): a case's identity across repeats.
type CaseKey = (String, String, String, usize);

fn key(c: &KernelCase) -> CaseKey {
    (
        c.provider.clone(),
        c.implementation.clone(),
        c.shape.clone(),
        c.m,
    )
}

/// Merge the results of the repeats of one suite (in repeat order; `orders` is each repeat's
/// implementation order). One repeat is returned as it is.
///
/// Per case (provider, implementation, shape, M): the samples of every repeat that timed it,
/// pooled in order, and summarized again; the worst correctness check; the lowest SM clock and
/// every throttle reason seen; the path of the first repeat (a note names any repeat whose path
/// differed); derived figures recomputed from the pooled median. Skips, notes and determinism
/// records of every repeat are kept (those of later repeats marked with the repeat); the suite,
/// timing policy, copy bandwidth, kernel facts, peers and reference accuracy are the first
/// repeat's.
pub fn merge(runs: &[KernelResults], orders: &[Vec<String>]) -> KernelResults {
    let Some(first) = runs.first() else {
        return KernelResults::default();
    };
    if runs.len() == 1 {
        return first.clone();
    }
    let mut out = KernelResults {
        cases: Vec::new(),
        skipped: Vec::new(),
        notes: Vec::new(),
        determinism: Vec::new(),
        repeats: None,
        ..first.clone()
    };
    // Cases in order of first appearance.
    let mut order: Vec<CaseKey> = Vec::new();
    let mut by_key: BTreeMap<CaseKey, Vec<(usize, &KernelCase)>> = BTreeMap::new();
    for (r, run) in runs.iter().enumerate() {
        for c in &run.cases {
            let k = key(c);
            if !by_key.contains_key(&k) {
                order.push(k.clone());
            }
            by_key.entry(k).or_default().push((r, c));
        }
    }
    let mut reps = SuiteRepeats {
        count: runs.len(),
        order: orders.to_vec(),
        cases: Vec::new(),
    };
    for k in &order {
        let group = &by_key[k];
        let (_, c0) = group[0];
        let mut c = c0.clone();
        pool_timings(&mut c, group, &mut reps);
        if let Some(clocks) = merged_clocks(group) {
            c.clocks = Some(clocks);
        }
        c.check = group
            .iter()
            .filter_map(|(_, g)| g.check.clone())
            .max_by(|a, b| a.value.total_cmp(&b.value));
        c.sm_clock_mhz = group.iter().filter_map(|(_, g)| g.sm_clock_mhz).min();
        let mut throttle: Vec<String> = group
            .iter()
            .flat_map(|(_, g)| g.throttle.iter().cloned())
            .collect();
        throttle.sort();
        throttle.dedup();
        c.throttle = throttle;
        repeat_notes(&c, group, runs.len(), &mut out.notes);
        out.cases.push(c);
    }
    // Derived figures from the pooled medians.
    let copy = out.copy_bandwidth.as_ref().map(|b| b.bytes_per_s);
    // One denominator for every provider: rigbench's bf16 at the same shape and M.
    let bf16: BTreeMap<(String, usize), f64> = out
        .cases
        .iter()
        .filter(|c| c.provider == "rigbench" && c.implementation == "bf16")
        .map(|c| ((c.shape.clone(), c.m), c.timing.median_s))
        .collect();
    for c in out.cases.iter_mut() {
        let b = bf16.get(&(c.shape.clone(), c.m)).copied();
        super::bench::fill_derived(c, copy, b);
    }
    keep_skips_and_notes(runs, &mut out);
    out.repeats = Some(reps);
    // The decode-step composite from the pooled cases.
    super::composite::refresh(&mut out);
    out
}

/// The repeats of one case, in repeat order: (repeat index, its case).
type Group<'a> = [(usize, &'a KernelCase)];

/// Pool the samples of `c`'s timing, extra parts and graph timings over the repeats of
/// `group`, recording each one's sizes per repeat in `reps`.
fn pool_timings(c: &mut KernelCase, group: &Group, reps: &mut SuiteRepeats) {
    c.timing = pooled(&group.iter().map(|(_, c)| &c.timing).collect::<Vec<_>>());
    reps.cases.push(CaseRepeats {
        provider: c.provider.clone(),
        implementation: c.implementation.clone(),
        shape: c.shape.clone(),
        m: c.m,
        part: None,
        sizes: group
            .iter()
            .map(|(_, c)| c.timing.samples_s.len())
            .collect(),
    });
    for e in c.extra.iter_mut() {
        let parts: Vec<&Timing> = group
            .iter()
            .filter_map(|(_, g)| g.extra.iter().find(|x| x.name == e.name))
            .map(|x| &x.timing)
            .collect();
        e.timing = pooled(&parts);
        reps.cases.push(CaseRepeats {
            provider: c.provider.clone(),
            implementation: c.implementation.clone(),
            shape: c.shape.clone(),
            m: c.m,
            part: Some(e.name.clone()),
            sizes: parts.iter().map(|t| t.samples_s.len()).collect(),
        });
    }
    if c.graph.is_some() {
        let graphs: Vec<&super::schema::GraphTimings> =
            group.iter().filter_map(|(_, g)| g.graph.as_ref()).collect();
        let part = |name: &str, ts: &[&Timing]| CaseRepeats {
            provider: c.provider.clone(),
            implementation: c.implementation.clone(),
            shape: c.shape.clone(),
            m: c.m,
            part: Some(name.to_string()),
            sizes: ts.iter().map(|t| t.samples_s.len()).collect(),
        };
        let ts: Vec<&Timing> = graphs.iter().map(|g| &g.timing).collect();
        reps.cases.push(part("graph", &ts));
        if let Some(g) = c.graph.as_mut() {
            g.timing = pooled(&ts);
            for e in g.extra.iter_mut() {
                let parts: Vec<&Timing> = graphs
                    .iter()
                    .filter_map(|x| x.extra.iter().find(|y| y.name == e.name))
                    .map(|y| &y.timing)
                    .collect();
                e.timing = pooled(&parts);
                reps.cases.push(part(&format!("graph/{}", e.name), &parts));
            }
        }
    }
}

/// The clock readings of every repeat merged: readings summed, lowest minimum, median of the
/// medians, highest maximum, every throttle reason seen. `None` when no repeat has them.
fn merged_clocks(group: &Group) -> Option<super::schema::ClockStats> {
    let clocks: Vec<&super::schema::ClockStats> = group
        .iter()
        .filter_map(|(_, g)| g.clocks.as_ref())
        .collect();
    if clocks.is_empty() {
        return None;
    }
    let mut medians: Vec<u32> = clocks.iter().filter_map(|k| k.median_mhz).collect();
    medians.sort_unstable();
    let mut seen: Vec<String> = clocks
        .iter()
        .flat_map(|k| k.throttle_seen.iter().cloned())
        .collect();
    seen.sort();
    seen.dedup();
    Some(super::schema::ClockStats {
        readings: clocks.iter().map(|k| k.readings).sum(),
        min_mhz: clocks.iter().filter_map(|k| k.min_mhz).min(),
        median_mhz: medians.get(medians.len() / 2).copied(),
        max_mhz: clocks.iter().filter_map(|k| k.max_mhz).max(),
        throttle_seen: seen,
        source: format!("{} (over {} repeats)", clocks[0].source, clocks.len()),
    })
}

/// Notes on a merged case: a repeat that ran another path than the first, and the repeats
/// that did not time it.
fn repeat_notes(c: &KernelCase, group: &Group, runs: usize, notes: &mut Vec<String>) {
    for (r, g) in group.iter().skip(1) {
        if g.path != c.path {
            notes.push(format!(
                "{} {} {} M={}: repeat {} ran another path ({}) than repeat 1 ({})",
                c.provider,
                c.implementation,
                c.shape,
                c.m,
                r + 1,
                g.path,
                c.path
            ));
        }
    }
    let missing: Vec<String> = (0..runs)
        .filter(|r| !group.iter().any(|(x, _)| x == r))
        .map(|r| (r + 1).to_string())
        .collect();
    if !missing.is_empty() {
        notes.push(format!(
            "{} {} {} M={}: not timed in repeat {} (see skipped)",
            c.provider,
            c.implementation,
            c.shape,
            c.m,
            missing.join(", ")
        ));
    }
}

/// Skips, notes and determinism records of every repeat, those of later repeats marked with
/// the repeat.
fn keep_skips_and_notes(runs: &[KernelResults], out: &mut KernelResults) {
    for (r, run) in runs.iter().enumerate() {
        for s in &run.skipped {
            let mut s = s.clone();
            if r > 0 {
                s.reason = format!("repeat {}: {}", r + 1, s.reason);
            }
            if !out.skipped.contains(&s) {
                out.skipped.push(s);
            }
        }
        for n in &run.notes {
            let n = if r > 0 && !out.notes.contains(n) {
                format!("repeat {}: {n}", r + 1)
            } else {
                n.clone()
            };
            if !out.notes.contains(&n) {
                out.notes.push(n);
            }
        }
        out.determinism.extend(run.determinism.iter().cloned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::schema::{NamedTiming, SkippedCase};

    fn case(imp: &str, m: usize, samples: &[f64], path: &str) -> KernelCase {
        KernelCase {
            provider: "rigbench".into(),
            implementation: imp.into(),
            format: if imp == "bf16" {
                GemmFormat::Bf16
            } else {
                GemmFormat::Fp8
            },
            shape: "qkv".into(),
            m,
            n: 64,
            k: 32,
            path: path.into(),
            check: None,
            timing: Timing {
                samples_s: samples.to_vec(),
                median_s: crate::stats::percentile(samples, 50.0).unwrap(),
                ..Default::default()
            },
            extra: if imp == "fp8" {
                vec![NamedTiming {
                    name: "activation_quant".into(),
                    timing: Timing {
                        samples_s: samples.iter().map(|x| x / 10.0).collect(),
                        ..Default::default()
                    },
                }]
            } else {
                Vec::new()
            },
            derived: Default::default(),
            sm_clock_mhz: Some(1980),
            throttle: Vec::new(),
            graph: None,
            graph_skip: None,
            clocks: None,
        }
    }

    #[test]
    fn only_formats_that_ran_rotate() {
        let f = [
            GemmFormat::Bf16,
            GemmFormat::Fp8,
            GemmFormat::W4a16,
            GemmFormat::W4a4,
        ];
        let mut first = KernelResults::default();
        for (fmt, id) in [(GemmFormat::Bf16, "bf16"), (GemmFormat::W4a16, "w4a16")] {
            let mut c = case(id, 1, &[1e-5; 8], "p");
            c.format = fmt;
            first.cases.push(c);
        }
        // Only bf16 and w4a16 were timed: they alternate; fp8 and w4a4 follow in given order.
        assert_eq!(
            order_for(&f, Some(&first), 1),
            vec![
                GemmFormat::W4a16,
                GemmFormat::Bf16,
                GemmFormat::Fp8,
                GemmFormat::W4a4
            ]
        );
        assert_eq!(
            order_for(&f, Some(&first), 2)[..2],
            [GemmFormat::Bf16, GemmFormat::W4a16]
        );
        assert_eq!(order_for(&f, None, 1), rotated(&f, 1));
    }

    #[test]
    fn rotation_spreads_the_first_slot() {
        let f = [GemmFormat::Bf16, GemmFormat::Fp8, GemmFormat::W4a16];
        assert_eq!(rotated(&f, 0), f.to_vec());
        assert_eq!(rotated(&f, 1)[0], GemmFormat::Fp8);
        assert_eq!(rotated(&f, 3), f.to_vec());
        assert!(rotated(&[], 2).is_empty());
    }

    #[test]
    fn merge_pools_samples_in_repeat_order_and_records_sizes() {
        let a = KernelResults {
            cases: vec![
                case("bf16", 1, &[2.0, 2.0, 2.0], "p"),
                case("fp8", 1, &[1.0, 1.0], "p"),
            ],
            notes: vec!["n1".into()],
            ..Default::default()
        };
        let mut b = KernelResults {
            cases: vec![
                case("fp8", 1, &[1.5, 1.5, 1.5, 1.5], "q"),
                case("bf16", 1, &[3.0], "p"),
            ],
            notes: vec!["n1".into(), "n2".into()],
            skipped: vec![SkippedCase {
                provider: "rigbench".into(),
                implementation: "w4a16".into(),
                shape: "qkv".into(),
                m: Some(1),
                reason: "failed".into(),
            }],
            ..Default::default()
        };
        b.cases[0].sm_clock_mhz = Some(1500);
        b.cases[0].throttle = vec!["sw_power_cap".into()];
        let m = merge(&[a.clone(), b], &[]);
        assert_eq!(m.cases.len(), 2);
        let bf = &m.cases[0];
        assert_eq!(bf.implementation, "bf16");
        assert_eq!(bf.timing.samples_s, vec![2.0, 2.0, 2.0, 3.0]);
        assert_eq!(bf.timing.median_s, 2.0);
        let fp = &m.cases[1];
        assert_eq!(fp.sm_clock_mhz, Some(1500));
        assert_eq!(fp.throttle, vec!["sw_power_cap".to_string()]);
        let r = m.repeats.as_ref().unwrap();
        assert_eq!(r.count, 2);
        assert_eq!(r.sizes_of(bf, None), Some(vec![3, 1]));
        assert_eq!(r.sizes_of(fp, None), Some(vec![2, 4]));
        assert_eq!(r.sizes_of(fp, Some("activation_quant")), Some(vec![2, 4]));
        assert_eq!(fp.extra[0].timing.samples_s.len(), 6);
        assert!(m.notes.iter().any(|n| n.contains("another path (q)")));
        assert!(m.notes.contains(&"repeat 2: n2".to_string()));
        assert_eq!(m.notes.iter().filter(|n| n.contains("n1")).count(), 1);
        assert!(m.skipped[0].reason.starts_with("repeat 2: "));
        // One repeat is left as it is.
        assert_eq!(merge(std::slice::from_ref(&a), &[]), a);
    }
}
