//! The kernel section of a report: rigbench's kernel goals ([`super::goals`]), the decode-step
//! composite ([`super::composite`]), the fitted fixed cost and streaming rate ([`super::fit`]),
//! cold against graph timing ([`super::timing_modes`]), Markdown tables per shape (rows M,
//! columns implementations with time and speedup against rigbench's `bf16`, one denominator for
//! every provider; FP8 with its activation quantization), crossover points, peers, kernel facts,
//! determinism, the CPU accuracy study, skips; `kernels.csv`; and SVG plots (plotters).
//!
//! The section's Markdown is in `markdown.rs`; the cases indexed per shape and column, with the
//! noisy-row flag, in `cases.rs`; the crossover text (the composite's too) in `crossover.rs`;
//! `kernels.csv` in `kernels_csv.rs`; the SVG plots and their file names in `plots.rs`.

mod cases;
pub(super) mod crossover;
mod kernels_csv;
mod markdown;
mod plots;

pub use cases::{noisy, NOISY_FACTOR};
pub use crossover::crossover;
pub use kernels_csv::csv;
pub use markdown::{markdown, markdown_for};
pub use plots::{plot_name, write_plots, COMPOSITE_PLOT};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::GemmFormat;
    use crate::kernels::schema::*;

    fn case(imp: &str, shape: &str, m: usize, t: f64) -> KernelCase {
        KernelCase {
            provider: "rigbench".into(),
            implementation: imp.into(),
            format: imp.parse().unwrap_or(GemmFormat::Bf16),
            shape: shape.into(),
            m,
            n: 64,
            k: 128,
            path: "test".into(),
            check: None,
            timing: Timing {
                samples_s: vec![t],
                median_s: t,
                p10_s: t,
                p90_s: t,
                rel_std: 0.0,
                stop_reason: None,
                cold_l2: true,
                graph: None,
            },
            extra: vec![],
            derived: Derived {
                weight_bytes_per_s: 1e12,
                speedup_vs_bf16: Some(1.0),
                ..Default::default()
            },
            sm_clock_mhz: None,
            throttle: vec![],
            graph: None,
            graph_skip: None,
            clocks: None,
        }
    }

    #[test]
    fn wording_of_the_kernel_section() {
        // Nothing timed: no sentence about CUDA-event timing.
        let empty = KernelResults {
            timing_policy: None,
            ..Default::default()
        };
        let md = markdown(&empty, &[]);
        assert!(
            !md.contains("Times are medians") && md.contains("No kernel case was timed"),
            "{md}"
        );
        // FP8 with its activation quantization timed apart: both crossover lines, labelled.
        let mut fp8 = case("fp8", "qkv", 1, 0.9e-5);
        fp8.extra.push(NamedTiming {
            name: "activation_quant".into(),
            timing: Timing {
                median_s: 0.5e-5,
                ..fp8.timing.clone()
            },
        });
        let k = KernelResults {
            cases: vec![
                case("bf16", "qkv", 1, 3e-5),
                fp8,
                case("w4a16", "qkv", 1, 1e-5),
            ],
            skipped: ["qkv", "o_proj"]
                .iter()
                .map(|s| SkippedCase {
                    provider: "rigbench".into(),
                    implementation: "w4a4".into(),
                    shape: s.to_string(),
                    m: None,
                    reason: "unsupported on this card: sm_90 has no FP4 tensor cores".into(),
                })
                .collect(),
            ..Default::default()
        };
        let caps = crate::rig::capability::table("sm_90".parse().unwrap());
        let md = markdown_for(&k, &[], &caps);
        assert!(md.contains("Times are medians"), "{md}");
        assert!(
            md.contains("- FP8 excluding activation quantization: w4a16 is never faster than fp8"),
            "{md}"
        );
        assert!(
            md.contains(
                "- FP8 including activation quantization: w4a16 is faster than fp8 at every M"
            ),
            "{md}"
        );
        assert!(md.contains("### rigbench's kernel goals"), "{md}");
        assert!(md.contains("not a property of the card"), "{md}");
        // One row for the W4A4 skip on both shapes, with the capability table's word.
        assert!(
            md.contains("| qkv, o_proj ") || md.contains("all 2 shapes"),
            "{md}"
        );
        assert!(
            md.contains("fallback on this card") && !md.contains("unsupported"),
            "{md}"
        );
    }

    #[test]
    fn markdown_csv_and_plots_render() {
        let k = KernelResults {
            cases: vec![
                case("bf16", "qkv", 1, 3e-5),
                case("w4a16", "qkv", 1, 1e-5),
                case("bf16", "qkv", 64, 4e-5),
                case("w4a16", "qkv", 64, 2e-5),
            ],
            ..Default::default()
        };
        let md = markdown(&k, &["kernels_qkv.svg".into()]);
        assert!(md.contains("### `qkv`") && md.contains("kernels_qkv.svg"));
        assert!(md.contains("w4a16 is faster than bf16 at every M"));
        let c = csv(&k).unwrap();
        assert_eq!(c.lines().count(), 5);
        let d = tempfile::tempdir().unwrap();
        let files = write_plots(&k, d.path()).unwrap();
        assert_eq!(files, vec!["kernels_qkv.svg", "kernels_fastest.svg"]);
        let svg = std::fs::read_to_string(d.path().join("kernels_qkv.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("w4a16"));
    }

    fn with_quant(mut c: KernelCase, q: f64) -> KernelCase {
        c.extra.push(NamedTiming {
            name: ACT_QUANT.into(),
            timing: Timing {
                samples_s: vec![q],
                median_s: q,
                ..Default::default()
            },
        });
        c
    }

    fn step_results() -> KernelResults {
        let mut cases = Vec::new();
        for (shape, f) in [("a", 1.0), ("b", 2.0)] {
            for m in [1usize, 16] {
                cases.push(case("bf16", shape, m, 20e-6 * f));
                // FP8's GEMM alone is the fastest, but not with its activation quantization.
                cases.push(with_quant(case("fp8", shape, m, 8e-6 * f), 8e-6));
                cases.push(case("w4a16", shape, m, 10e-6 * f));
                let mut p = case("torch._scaled_mm", shape, m, 7e-6 * f);
                p.provider = "torch".into();
                p.format = GemmFormat::Fp8;
                cases.push(p);
            }
        }
        for c in &mut cases {
            c.derived.weight_bytes = if c.shape == "a" { 1_000_000 } else { 3_000_000 };
        }
        // A noisy case.
        cases[2].timing.rel_std = 0.2;
        KernelResults {
            suite: SuiteInfo {
                name: "t".into(),
                decode_step: Some(DecodeStep {
                    description: "a test step".into(),
                    complete: true,
                    shapes: vec![
                        StepShape {
                            shape: "a".into(),
                            n: 64,
                            k: 128,
                            count: 2,
                        },
                        StepShape {
                            shape: "b".into(),
                            n: 64,
                            k: 128,
                            count: 3,
                        },
                    ],
                }),
                ..Default::default()
            },
            timing_policy: Some(TimingPolicy {
                warmup_iters: 3,
                stopping: crate::stats::StoppingRule::default(),
                l2_flush_bytes: 1 << 20,
                timer: "events".into(),
                modes: TimingModes::Cold,
                graph: None,
            }),
            copy_bandwidth: Some(CopyBandwidth {
                bytes: 1 << 30,
                median_s: 5e-4,
                bytes_per_s: 4.2e12,
                samples: 20,
            }),
            cases,
            ..Default::default()
        }
    }

    #[test]
    fn one_denominator_quant_in_fastest_and_noisy_flags() {
        let k = step_results();
        let md = markdown(&k, &[]);
        // rigbench's fp8 column says it includes the quantization; the peer's says it does not.
        assert!(md.contains("fp8 (+ act. quant)"), "{md}");
        assert!(md.contains("torch:torch._scaled_mm (GEMM only: act. quant not timed)"));
        // fp8 total 16 µs against bf16's 20: 1.25×, and w4a16 (10 µs) is the fastest of
        // rigbench's rows once quantization is counted (the peer's GEMM alone is 7 µs).
        assert!(md.contains("16.0 µs (1.25×)"), "{md}");
        assert!(
            md.contains("7.0 µs (2.86×)"),
            "the peer's speedup uses rigbench's bf16: {md}"
        );
        assert!(md.contains("w4a16 is faster than fp8 at every M"), "{md}");
        assert!(
            md.contains(" ‡") && md.contains("w4a16 M = 1: σ/mean 20.0%"),
            "{md}"
        );
        // The composite, the fits and the goals are there.
        assert!(md.contains("### Decode-step composite: a test step"));
        assert!(md.contains("fp8 (incl. act. quant, per-tensor"), "{md}");
        assert!(md.contains("### Fixed cost and streaming rate"));
        assert!(md.contains("### rigbench's kernel goals"));
        assert!(
            !md.contains("### Timing modes"),
            "no graph timing asked for"
        );
        let d = tempfile::tempdir().unwrap();
        let files = write_plots(&k, d.path()).unwrap();
        assert!(files.contains(&COMPOSITE_PLOT.to_string()));
        let svg = std::fs::read_to_string(d.path().join(COMPOSITE_PLOT)).unwrap();
        assert!(svg.contains("NVFP4 byte floor"), "{svg}");
        assert!(svg.contains("w4a16") && svg.contains("torch:torch._scaled_mm"));
        let csv_text = csv(&k).unwrap();
        let header = csv_text.lines().next().unwrap();
        assert!(header.ends_with("throttle_seen") && header.contains(",total_s,"));
        let fp8_row = csv_text
            .lines()
            .find(|l| l.starts_with("rigbench,fp8,fp8,a,1,"))
            .unwrap();
        assert!(
            fp8_row.contains(&format!(",{},", 8e-6f64 + 8e-6)),
            "total_s = GEMM + quantization: {fp8_row}"
        );
    }

    #[test]
    fn graph_mode_is_said_in_the_conditions() {
        let mut k = step_results();
        if let Some(p) = k.timing_policy.as_mut() {
            p.modes = TimingModes::Graph;
        }
        let md = markdown(&k, &[]);
        assert!(md.contains("Timing mode: **graph**"), "{md}");
    }

    #[test]
    fn h200_report_renders_the_composite_rows() {
        let k = crate::kernels::composite::tests::h200_run();
        let md = markdown(&k, &[COMPOSITE_PLOT.to_string()]);
        assert!(md.contains("| 1     | 13.92 ms (1.00×)"), "{md}");
        // M digit-grouped, as in the per-shape tables.
        assert!(md.contains("| 1,024 |"), "{md}");
        assert!(md.contains("w4a16 is faster than bf16 up to M = 16; bf16 is faster from M = 32"));
        assert!(md.contains("![decode-step composite"));
        assert!(md.contains("| NVFP4   | 14.41 GB       | 3.40 ms"), "{md}");
    }
}
