//! The verdict: five to ten lines at the top of a report that answer at a glance, written only
//! from the results (never from this machine), so `report --render` of an old results.json
//! writes the same verdict as the run that made it.
//!
//! Lines, each present only when its part of the results is:
//! 1. what the card runs natively per format, and what falls back to what (capability table);
//! 2. the fastest format by M range: the best implementation measured for each format, peers
//!    (engine kernels) included and named, FP8 including its activation quantization, over the
//!    decode-step composite (else the format fastest on most shapes at each M); formats within
//!    [`SAME_WITHIN`] of the fastest are joined with "≈";
//! 3. the crossovers per shape (W4A16 against FP8 and BF16, best implementation of each), and
//!    rigbench's own kernels against the best peer of their format (composite time ratios);
//! 4. the measured limits (copy bandwidth, highest BF16/FP8 TFLOP/s) and throttling seen;
//! 5. the decode-step composite headline;
//! 6. whether the end-to-end figures ran on this GPU, and on which backend;
//! 7. the checkpoint findings, when a checkpoint was given;
//! 8. the CPU reference accuracy of each format (every report has it);
//! 9. everything skipped, with the reason.
//!
//! Sections that are absent (no GPU, `--no-kernels`, `--no-e2e`, an interrupted run) give no
//! line or a line that says so; nothing here panics on partial results.
//!
//! The lines are built in `words.rs` (wording shared by every line), `composite.rs` (the
//! decode-step composite: its points, the fastest format by M from it, rigbench's kernels against
//! the best peer of their format, the composite headline), `kernel_lines.rs` (formats, fastest
//! format per shape, crossovers, measured limits) and `other_lines.rs` (multi-GPU, runtime,
//! end-to-end, checkpoint, accuracy, skipped); this file puts them in order.

mod composite;
mod kernel_lines;
mod other_lines;
mod words;

use super::schema::Results;
use composite::{best_points, composite_rows, fastest_by_composite, own_vs_peer_line};
use kernel_lines::{crossover_line, fastest_line, formats_line, limits_line, passing_cases};
use other_lines::{
    accuracy_line, checkpoint_line, e2e_line, multigpu_line, runtime_line, skipped_line,
};
use words::one_line;

pub use composite::{
    composite_line, composite_points, impl_label, verdict_timing, StepPoint, SAME_WITHIN,
};

/// The verdict's lines (Markdown inline: `**bold**` lead-ins and backticks).
pub fn lines(r: &Results) -> Vec<String> {
    let mut out = Vec::new();
    // A part that was asked for and failed comes first, with its whole reason.
    for f in &r.failed {
        out.push(format!(
            "**FAILED: {}**: {}.",
            f.what,
            one_line(&f.reason).trim_end_matches('.')
        ));
    }
    if !r.complete {
        out.push("**Run INCOMPLETE** (interrupted or still running): every line below covers only what was measured before it stopped.".to_string());
    }
    out.push(formats_line(r));
    if let Some(k) = &r.kernels {
        let cases = passing_cases(k);
        if cases.iter().any(|c| c.provider == "rigbench") {
            let (rows, complete, timing) = composite_rows(k);
            let graph = timing == Some(crate::kernels::composite::StepTiming::Graph);
            let named = best_points(&rows, true);
            if let Some(l) =
                fastest_by_composite(&named, graph).or_else(|| fastest_line(&cases, graph))
            {
                out.push(l);
            }
            if let Some(l) = crossover_line(&cases, graph) {
                out.push(l);
            }
            if let Some(l) = own_vs_peer_line(&rows, graph) {
                out.push(l);
            }
            if let Some(l) = limits_line(r, k) {
                out.push(l);
            }
            let mut l = composite_line(&named);
            if graph {
                l = l.replacen("(summed GEMM time", "(graph timing; summed GEMM time", 1);
            }
            if !named.is_empty() && !complete {
                l.push_str(" These shapes are only part of a decode step: the sums are a part of its linear-layer time.");
            }
            out.push(l);
        }
    }
    if let Some(l) = multigpu_line(r) {
        out.push(l);
    }
    if let Some(l) = runtime_line(r) {
        out.push(l);
    }
    if let Some(l) = e2e_line(r) {
        out.push(l);
    }
    if let Some(l) = checkpoint_line(r) {
        out.push(l);
    }
    // With timed kernels the accuracy study is in the kernel section; without, it is the only
    // kernel figure and belongs in the verdict.
    let timed = r.kernels.as_ref().is_some_and(|k| !k.cases.is_empty());
    if !timed {
        if let Some(l) = accuracy_line(r) {
            out.push(l);
        }
    }
    out.push(skipped_line(r));
    out
}

/// The verdict as a Markdown section (`## Verdict` and one bullet per line).
pub fn markdown(r: &Results) -> String {
    let mut o = String::from("## Verdict\n\n");
    for l in lines(r) {
        o.push_str(&format!("- {l}\n"));
    }
    o.push('\n');
    o
}

/// The verdict as plain text for a terminal: the Markdown emphasis removed.
pub fn text(r: &Results) -> String {
    lines(r)
        .iter()
        .map(|l| format!("- {}\n", l.replace("**", "")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::words::first_clause;
    use super::*;
    use crate::gpu::ComputeCapability;
    use crate::kernels::schema::{
        CopyBandwidth, Derived, KernelCase, KernelResults, NamedTiming, SkippedCase, Timing,
    };
    use crate::output::table::thousands;
    use crate::report::Skip;
    use crate::rig::{capability, GpuFacts, RigFacts};

    fn t(s: f64) -> Timing {
        Timing {
            samples_s: vec![s],
            median_s: s,
            p10_s: s,
            p90_s: s,
            rel_std: 0.0,
            stop_reason: None,
            cold_l2: true,
            graph: None,
        }
    }

    fn case(imp: &str, shape: &str, m: usize, secs: f64, quant: f64) -> KernelCase {
        KernelCase {
            provider: "rigbench".into(),
            implementation: imp.into(),
            format: imp.parse().unwrap(),
            shape: shape.into(),
            m,
            n: 1024,
            k: 1024,
            path: String::new(),
            check: None,
            timing: t(secs),
            extra: if quant > 0.0 {
                vec![NamedTiming {
                    name: crate::kernels::schema::ACT_QUANT.into(),
                    timing: t(quant),
                }]
            } else {
                vec![]
            },
            derived: Derived {
                tflops: 2.0 * (m * 1024 * 1024) as f64 / secs / 1e12,
                ..Default::default()
            },
            sm_clock_mhz: Some(1980),
            throttle: vec![],
            graph: None,
            graph_skip: None,
            clocks: None,
        }
    }

    fn h200() -> RigFacts {
        let cc = ComputeCapability::new(9, 0);
        RigFacts {
            gpu: Some(GpuFacts {
                name: "NVIDIA H200".into(),
                compute_capability: Some(cc),
                ..Default::default()
            }),
            capabilities: capability::table(cc),
            ..Default::default()
        }
    }

    /// Two shapes; W4A16 wins at small M, FP8 (with its quantization) from M = 16 on `a`; on `b`
    /// FP8 without its quantization would win at M = 1 but loses once it is included.
    fn kernels() -> KernelResults {
        let mut cases = Vec::new();
        for (shape, w4_1) in [("a", 10e-6), ("b", 10e-6)] {
            cases.push(case("bf16", shape, 1, 40e-6, 0.0));
            cases.push(case(
                "fp8",
                shape,
                1,
                if shape == "b" { 9e-6 } else { 20e-6 },
                7e-6,
            ));
            cases.push(case("w4a16", shape, 1, w4_1, 0.0));
            cases.push(case("bf16", shape, 16, 40e-6, 0.0));
            cases.push(case("fp8", shape, 16, 20e-6, 7e-6));
            cases.push(case("w4a16", shape, 16, 30e-6, 0.0));
            cases.push(case("bf16", shape, 1024, 200e-6, 0.0));
            cases.push(case("fp8", shape, 1024, 100e-6, 20e-6));
            cases.push(case("w4a16", shape, 1024, 250e-6, 0.0));
        }
        KernelResults {
            cases,
            copy_bandwidth: Some(CopyBandwidth {
                bytes: 1 << 30,
                median_s: 0.0005,
                bytes_per_s: 4.24e12,
                samples: 20,
            }),
            skipped: ["a", "b"]
                .iter()
                .map(|s| SkippedCase {
                    provider: "rigbench".into(),
                    implementation: "w4a4".into(),
                    shape: s.to_string(),
                    m: None,
                    reason: "unsupported on this card: sm_90 has no FP4 tensor cores (they start at sm_100); native W4A4 NVFP4 cannot run here".into(),
                })
                .collect(),
            reference_accuracy: crate::kernels::accuracy::study(),
            ..Default::default()
        }
    }

    fn results() -> Results {
        let mut r = Results::new(h200(), "nvidia-h200-sm90".into(), "rigbench report".into());
        r.kernels = Some(kernels());
        r.complete = true;
        r
    }

    #[test]
    fn h200_verdict_names_native_fallback_fastest_and_crossovers() {
        let r = results();
        let l = lines(&r);
        assert!((5..=10).contains(&l.len()), "{l:#?}");
        let all = l.join("\n");
        assert!(
            l[0].contains("native BF16, FP8 W8A8 and W4A16 NVFP4"),
            "{}",
            l[0]
        );
        assert!(
            l[0].contains("W4A4 NVFP4 is a **fallback**, since sm_90 has no FP4 tensor cores (they start at sm_100): it runs as the W4A16 Marlin-style path"),
            "{}",
            l[0]
        );
        // Activation quantization included: FP8 (9 + 7 µs) loses to W4A16 (10 µs) at M = 1 on b.
        assert!(
            all.contains("**W4A16** at M = 1, **FP8** at M = 16…1,024"),
            "{all}"
        );
        assert!(
            all.contains("W4A16 is faster than FP8 (activation quantization included) up to M = 1 on 2 shapes"),
            "{all}"
        );
        assert!(
            all.contains("faster than BF16 up to M = 16 on 2 shapes"),
            "{all}"
        );
        assert!(all.contains("copy bandwidth 4.24 TB/s"), "{all}");
        assert!(all.contains("no throttling recorded"), "{all}");
        assert!(all.contains("**Decode-step composite:** not in these results"));
        // One word for W4A4: the stored legacy reason is shown as a fallback.
        assert!(
            all.contains("w4a4 (all 2 shapes): fallback on this card"),
            "{all}"
        );
        assert!(!all.contains("unsupported"), "{all}");
        // Timed kernels: the accuracy study stays in the kernel section.
        assert!(!all.contains("**Accuracy**"), "{all}");
        // No e2e, no checkpoint: no line for them.
        assert!(!all.contains("End to end") && !all.contains("Checkpoint"));
        let md = markdown(&r);
        assert!(md.starts_with("## Verdict\n\n- **Formats on NVIDIA H200 (sm_90):**"));
        assert!(!text(&r).contains("**"));
    }

    #[test]
    fn cpu_only_partial_and_incomplete_results_do_not_break_it() {
        let mut r = Results::new(RigFacts::default(), "cpu-x86-64".into(), "x".into());
        r.rig.gpu_absent_reason = Some("no CUDA driver found".into());
        let l = lines(&r);
        assert!(l[0].contains("INCOMPLETE"), "{l:#?}");
        assert!(l[1].contains("**No GPU on this machine** (no CUDA driver found)"));
        assert_eq!(l.last().unwrap(), "**Skipped:** nothing.");
        r.complete = true;
        r.skipped.push(Skip {
            what: "kernels".into(),
            reason: "no CUDA driver found; GPU kernel benches need a GPU".into(),
        });
        r.kernels = Some(KernelResults {
            reference_accuracy: crate::kernels::accuracy::study(),
            // The whole-suite skip `report` also writes into the kernel section: the verdict
            // must not repeat it as "* (*)".
            skipped: vec![crate::kernels::schema::SkippedCase {
                provider: "rigbench".into(),
                implementation: "*".into(),
                shape: "*".into(),
                m: None,
                reason: "no CUDA driver found; GPU kernel benches need a GPU".into(),
            }],
            ..Default::default()
        });
        let l = lines(&r);
        assert_eq!(l.len(), 3, "{l:#?}");
        assert!(l[1].starts_with("**Accuracy**") && l[1].contains("W4A4 1.3e-1 (emulated)"));
        assert_eq!(l[2], "**Skipped:** kernels: no CUDA driver found.");
        // The kernel part's catch-all skip row (impl and shape `*`) is not listed again as
        // `* (*)`; alone, it reads "every kernel case".
        let wildcard = SkippedCase {
            provider: "rigbench".into(),
            implementation: "*".into(),
            shape: "*".into(),
            m: None,
            reason: "no CUDA driver found; GPU kernel benches need a GPU".into(),
        };
        r.kernels.as_mut().unwrap().skipped.push(wildcard);
        let l = lines(&r);
        assert_eq!(l[2], "**Skipped:** kernels: no CUDA driver found.");
        r.skipped.clear();
        let l = lines(&r);
        assert_eq!(
            l[2],
            "**Skipped:** every kernel case: no CUDA driver found."
        );
    }

    #[test]
    fn e2e_line_says_where_it_ran() {
        let mut r = results();
        let mut e = crate::e2e::E2eResults::default();
        e.engine.kind = "builtin".into();
        r.e2e = Some(e.clone());
        let l = e2e_line(&r).unwrap();
        assert!(
            l.contains("**CPU backend**") && l.contains("**not on NVIDIA H200**"),
            "{l}"
        );
        assert!(
            l.contains("not recorded") && l.contains("0 of 0 runs valid"),
            "{l}"
        );
        e.engine.facts.runtime = crate::e2e::runtime_facts::from_version(
            &serde_json::json!({"backend": "cpu", "device": "cpu"}),
        );
        r.e2e = Some(e.clone());
        let l = e2e_line(&r).unwrap();
        assert!(
            l.contains("**CPU backend**") && !l.contains("not recorded"),
            "{l}"
        );
        e.engine.facts.runtime = crate::e2e::runtime_facts::from_version(
            &serde_json::json!({"backend": "cuda", "device": "cuda:0 (NVIDIA H200, sm_90)"}),
        );
        r.e2e = Some(e.clone());
        assert!(e2e_line(&r)
            .unwrap()
            .contains("on the GPU: cuda:0 (NVIDIA H200, sm_90), CUDA backend"));
        e.engine.kind = "url".into();
        e.engine.facts.runtime = None;
        r.e2e = Some(e);
        assert!(e2e_line(&r)
            .unwrap()
            .contains("a device the engine does not report"));
    }

    #[test]
    fn checkpoint_line_counts_and_capacity() {
        let mut r = results();
        let mut c = crate::checkpoint::InspectReport {
            checkpoint: "tests/fixtures/checkpoints/x".into(),
            ..Default::default()
        };
        c.findings.push(crate::checkpoint::Finding {
            rule: "gdn-ab-quantized".into(),
            severity: crate::checkpoint::Severity::Error,
            why: "in_proj_a/b are quantized; engines expect BF16".into(),
            detail: String::new(),
            modules: vec![],
            module_count: 2,
        });
        c.capacity.kv_tokens = Some(1_234_567);
        r.checkpoint = Some(c);
        let l = checkpoint_line(&r).unwrap();
        assert!(
            l.starts_with("**Checkpoint `x`:** 1 error, 0 warnings (first: `gdn-ab-quantized`"),
            "{l}"
        );
        assert!(l.contains("1,234,567 tokens"), "{l}");
        r.checkpoint.as_mut().unwrap().capacity.fits = Some(false);
        assert!(checkpoint_line(&r).unwrap().contains("**do not fit**"));
    }

    #[test]
    fn with_a_decode_step_the_fastest_line_and_headline_come_from_the_composite() {
        use crate::kernels::schema::{DecodeStep, StepShape};
        let mut r = results();
        let k = r.kernels.as_mut().unwrap();
        k.suite.decode_step = Some(DecodeStep {
            description: "test step".into(),
            complete: true,
            shapes: vec![
                StepShape {
                    shape: "a".into(),
                    n: 1024,
                    k: 1024,
                    count: 2,
                },
                StepShape {
                    shape: "b".into(),
                    n: 1024,
                    k: 1024,
                    count: 1,
                },
            ],
        });
        // M = 1: W4A16 2·10 + 10 = 30 µs; FP8 2·(20 + 7) + (9 + 7) = 70 µs; BF16 120 µs.
        // M = 16: W4A16 90 µs; FP8 81 µs.
        let (p, complete) = composite_points(r.kernels.as_ref().unwrap());
        assert!(complete);
        let t = |f: &str, m: usize| p.iter().find(|x| x.format == f && x.m == m).unwrap().time_s;
        assert!((t("W4A16", 1) - 30e-6).abs() < 1e-12);
        assert!((t("FP8", 1) - 70e-6).abs() < 1e-12);
        let all = lines(&r).join("\n");
        assert!(
            all.contains("over one decode step")
                && all.contains("**W4A16 (rigbench)** at M = 1, **FP8 (cuBLASLt, per-tensor act. quant)** at M = 16…1,024"),
            "{all}"
        );
        assert!(
            all.contains("at M = 1: W4A16 (rigbench) 30.0 µs < FP8 (cuBLASLt, per-tensor act. quant) 70.0 µs < BF16 (cuBLASLt) 120.0 µs (≤ 33,333 tok/s from the linear layers alone)"),
            "{all}"
        );
        assert!(
            all.contains("at M = 16: FP8 (cuBLASLt, per-tensor act. quant) 81.0 µs < W4A16 (rigbench) 90.0 µs"),
            "{all}"
        );
        // No peers: no line comparing rigbench's kernels with them.
        assert!(!all.contains("best peer of their format"), "{all}");
        assert!(all.contains("over the 16 sequences"), "{all}");
    }

    #[test]
    fn throttling_counts_groups_and_gives_the_lowest_clock_the_notes_give() {
        let mut r = results();
        let k = r.kernels.as_mut().unwrap();
        let groups = {
            let mut g: Vec<(String, usize)> =
                k.cases.iter().map(|c| (c.shape.clone(), c.m)).collect();
            g.sort();
            g.dedup();
            g.len()
        };
        let c = &mut k.cases[0];
        c.throttle = vec!["sw_power_cap".into()];
        // The case's median clock is higher than the lowest reading its window saw.
        c.sm_clock_mhz = Some(1305);
        c.clocks = Some(crate::kernels::schema::ClockStats {
            readings: 3,
            min_mhz: Some(1020),
            median_mhz: Some(1305),
            max_mhz: Some(1980),
            throttle_seen: vec!["sw_power_cap".into()],
            source: "nvml".into(),
        });
        let all = lines(&r).join("\n");
        assert!(
            all.contains(&format!(
                "throttling (sw_power_cap) in 1 of {groups} (shape, M) groups of rigbench's cases, lowest SM clock read 1,020 MHz"
            )),
            "{all}"
        );
    }

    /// The kernels of record of 2026-12-01 said "lowest SM clock read 1,110 MHz (see Notes)",
    /// a peer case's reading, where the Notes (rigbench's cases) say 1,155: the verdict's figure
    /// is the Notes' one, the peers' given apart.
    #[test]
    fn a_peer_cases_lower_clock_is_not_given_as_the_notes_figure() {
        let clocks = |min: u32| crate::kernels::schema::ClockStats {
            readings: 3,
            min_mhz: Some(min),
            median_mhz: Some(1500),
            max_mhz: Some(1980),
            throttle_seen: vec!["sw_power_cap".into()],
            source: "nvml".into(),
        };
        for (own_min, peer_min) in [(1155, 1110), (1400, 990)] {
            let mut r = results();
            let k = r.kernels.as_mut().unwrap();
            let mut own = k.cases[0].clone();
            own.throttle = vec!["sw_power_cap".into()];
            own.clocks = Some(clocks(own_min));
            k.cases[0] = own.clone();
            // A peer case of the same group read a lower clock.
            let mut peer = own;
            peer.provider = "torch".into();
            peer.implementation = "torch.matmul".into();
            peer.clocks = Some(clocks(peer_min));
            k.cases.push(peer);
            let all = lines(&r).join("\n");
            let own_text = format!("lowest SM clock read {} MHz", thousands(u64::from(own_min)));
            let peer_text = format!(
                "the peers' cases in 1 of 1 groups, lowest SM clock read {} MHz",
                thousands(u64::from(peer_min))
            );
            assert!(
                all.contains(&format!("groups of rigbench's cases, {own_text}")),
                "{all}"
            );
            assert!(all.contains(&peer_text), "{all}");
            // The Notes' own note for that group gives the same figure.
            let group: Vec<KernelCase> = r
                .kernels
                .as_ref()
                .unwrap()
                .cases
                .iter()
                .filter(|c| c.provider == "rigbench" && c.shape == "a" && c.m == 1)
                .cloned()
                .collect();
            let note = crate::kernels::bench::throttle_note(&group, "a", 1).unwrap();
            assert!(
                note.contains(&format!("lowest SM clock read {own_min} MHz")),
                "{note}"
            );
        }
    }

    /// A reason is not cut inside parentheses or quotes: the command `echo boom; exit 3` stays
    /// whole, and a failure opens the verdict with all of its reason.
    #[test]
    fn reasons_are_not_cut_at_a_semicolon_inside_a_command() {
        assert_eq!(
            first_clause(
                "the engine (echo boom; exit 3) exited during startup\n  last log lines:\n    boom"
            ),
            "the engine (echo boom; exit 3) exited during startup"
        );
        assert_eq!(
            first_clause("the engine `a; b` died; see engine.log"),
            "the engine `a; b` died"
        );
        assert_eq!(
            first_clause("no CUDA driver found; GPU kernel benches need a GPU."),
            "no CUDA driver found"
        );
        assert_eq!(
            first_clause("the engine's log is empty; nothing to read"),
            "the engine's log is empty"
        );
        let mut r = results();
        r.failed.push(Skip {
            what: "e2e".into(),
            reason:
                "the engine (echo boom; exit 3) exited during startup\n  last log lines:\n    boom"
                    .into(),
        });
        let l = lines(&r);
        assert_eq!(
            l[0],
            "**FAILED: e2e**: the engine (echo boom; exit 3) exited during startup; last log lines: boom."
        );
    }
}
