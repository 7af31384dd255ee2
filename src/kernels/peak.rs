//! Compute throughput at large M: TFLOP/s of every timed case and its share of the highest
//! TFLOP/s its arithmetic reached in the same run (the measured peak).
//!
//! TFLOP/s = 2·M·N·K / median time ([`super::schema::Derived::tflops`]). The peak of an
//! arithmetic is the highest TFLOP/s any case of that arithmetic reached in this run (rigbench's
//! own rows and peers alike): a measured lower bound of what the card sustains on these shapes,
//! never a datasheet figure. W4A16 dequantizes to BF16 and multiplies on the BF16 tensor cores,
//! so its rows are held to the BF16 peak; FP8 rows to the FP8 peak; W4A4 rows to their own.

use super::schema::{KernelCase, KernelResults};
use crate::formats::GemmFormat;
use crate::output::table::markdown_table;

/// The highest TFLOP/s one arithmetic reached in a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Peak {
    /// The tensor-core arithmetic: `Bf16` (also W4A16's), `Fp8`, or `W4a4`.
    pub arithmetic: GemmFormat,
    /// The peak, TFLOP/s.
    pub tflops: f64,
    /// Where it was reached: `provider:implementation shape M=…`.
    pub at: String,
}

/// The tensor-core arithmetic a format's GEMM runs on: W4A16 multiplies in BF16.
pub fn arithmetic(f: GemmFormat) -> GemmFormat {
    match f {
        GemmFormat::W4a16 => GemmFormat::Bf16,
        other => other,
    }
}

fn label(c: &KernelCase) -> String {
    let who = if c.provider == "rigbench" {
        c.implementation.clone()
    } else {
        format!("{}:{}", c.provider, c.implementation)
    };
    format!("{who} {} M={}", c.shape, c.m)
}

fn usable(c: &KernelCase) -> bool {
    c.derived.tflops.is_finite()
        && c.derived.tflops > 0.0
        && c.check.as_ref().is_none_or(|x| x.passed)
}

/// The measured peak of each arithmetic present (BF16, FP8, W4A4, in that order). W4A16 rows
/// count towards BF16 only when they beat every BF16 row (they run on the same units).
pub fn measured_peaks(k: &KernelResults) -> Vec<Peak> {
    let mut out: Vec<Peak> = Vec::new();
    for a in [GemmFormat::Bf16, GemmFormat::Fp8, GemmFormat::W4a4] {
        let best = k
            .cases
            .iter()
            .filter(|c| usable(c) && arithmetic(c.format) == a)
            .max_by(|x, y| x.derived.tflops.total_cmp(&y.derived.tflops));
        if let Some(c) = best {
            out.push(Peak {
                arithmetic: a,
                tflops: c.derived.tflops,
                at: label(c),
            });
        }
    }
    out
}

/// `tflops` as a share of the peak of its arithmetic, percent.
pub fn pct_of_peak(peaks: &[Peak], format: GemmFormat, tflops: f64) -> Option<f64> {
    let p = peaks.iter().find(|p| p.arithmetic == arithmetic(format))?;
    (p.tflops > 0.0).then(|| 100.0 * tflops / p.tflops)
}

/// Format a TFLOP/s figure: three significant digits, digit-grouped above 1,000.
pub fn fmt_tflops(t: f64) -> String {
    if t >= 1000.0 {
        crate::output::table::thousands(t.round() as u64)
    } else if t >= 100.0 {
        format!("{t:.0}")
    } else if t >= 10.0 {
        format!("{t:.1}")
    } else {
        format!("{t:.2}")
    }
}

/// The Markdown subsection: the measured peaks, then per shape at its largest M the TFLOP/s of
/// each implementation and its % of the peak of its arithmetic. Empty when nothing was timed.
pub fn markdown(k: &KernelResults) -> String {
    let peaks = measured_peaks(k);
    if peaks.is_empty() {
        return String::new();
    }
    let mut o = String::from("### Compute throughput at large M\n\n");
    o.push_str("TFLOP/s = 2·M·N·K / median time. The peak of an arithmetic is the highest TFLOP/s any case of it reached in this run (a measured figure on these shapes, not the datasheet): ");
    let ps: Vec<String> = peaks
        .iter()
        .map(|p| {
            format!(
                "{} {} TFLOP/s ({})",
                p.arithmetic.display_name(),
                fmt_tflops(p.tflops),
                p.at
            )
        })
        .collect();
    o.push_str(&ps.join("; "));
    o.push_str(". W4A16 multiplies on the BF16 tensor cores, so it is held to the BF16 peak.\n\n");
    // Shapes in suite order, each at its largest M.
    let mut shapes: Vec<&str> = Vec::new();
    for c in &k.cases {
        if !shapes.contains(&c.shape.as_str()) {
            shapes.push(&c.shape);
        }
    }
    let mut cols: Vec<String> = Vec::new();
    for c in &k.cases {
        let key = if c.provider == "rigbench" {
            c.implementation.clone()
        } else {
            format!("{}:{}", c.provider, c.implementation)
        };
        if !cols.contains(&key) {
            cols.push(key);
        }
    }
    let rank = |c: &str| match c {
        "bf16" => 0,
        "fp8" => 1,
        "w4a16" => 2,
        "w4a4" => 3,
        _ => 4,
    };
    cols.sort_by_key(|c| (rank(c), c.clone()));
    let mut rows = Vec::new();
    for s in shapes {
        let Some(m) = k.cases.iter().filter(|c| c.shape == s).map(|c| c.m).max() else {
            continue;
        };
        let mut r = vec![s.to_string(), crate::output::table::thousands(m as u64)];
        for col in &cols {
            let c = k.cases.iter().find(|c| {
                c.shape == s
                    && c.m == m
                    && (if c.provider == "rigbench" {
                        c.implementation == *col
                    } else {
                        format!("{}:{}", c.provider, c.implementation) == *col
                    })
            });
            r.push(match c {
                Some(c) if usable(c) => match pct_of_peak(&peaks, c.format, c.derived.tflops) {
                    Some(p) => format!("{} ({p:.0}%)", fmt_tflops(c.derived.tflops)),
                    None => fmt_tflops(c.derived.tflops),
                },
                _ => "—".into(),
            });
        }
        rows.push(r);
    }
    let mut headers: Vec<&str> = vec!["shape", "M"];
    headers.extend(cols.iter().map(String::as_str));
    o.push_str("TFLOP/s at each shape's largest M (in parentheses: % of the measured peak of its arithmetic):\n\n");
    o.push_str(&markdown_table(&headers, &rows));
    o.push('\n');
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::schema::{Derived, Timing};

    fn case(
        provider: &str,
        imp: &str,
        f: GemmFormat,
        shape: &str,
        m: usize,
        tf: f64,
    ) -> KernelCase {
        KernelCase {
            provider: provider.into(),
            implementation: imp.into(),
            format: f,
            shape: shape.into(),
            m,
            n: 64,
            k: 64,
            path: String::new(),
            check: None,
            timing: Timing::default(),
            extra: vec![],
            derived: Derived {
                tflops: tf,
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
    fn peaks_per_arithmetic_and_shares() {
        let k = KernelResults {
            cases: vec![
                case("rigbench", "bf16", GemmFormat::Bf16, "a", 8192, 700.0),
                case("rigbench", "bf16", GemmFormat::Bf16, "a", 1, 3.5),
                case("rigbench", "w4a16", GemmFormat::W4a16, "a", 8192, 560.0),
                case("rigbench", "fp8", GemmFormat::Fp8, "a", 8192, 1200.0),
                case(
                    "torch",
                    "torch._scaled_mm",
                    GemmFormat::Fp8,
                    "a",
                    8192,
                    1500.0,
                ),
            ],
            ..Default::default()
        };
        let p = measured_peaks(&k);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].arithmetic, GemmFormat::Bf16);
        assert_eq!(p[0].tflops, 700.0);
        assert_eq!(p[1].tflops, 1500.0);
        assert_eq!(p[1].at, "torch:torch._scaled_mm a M=8192");
        // W4A16 is held to the BF16 peak: 560 / 700 = 80%.
        assert_eq!(pct_of_peak(&p, GemmFormat::W4a16, 560.0), Some(80.0));
        assert_eq!(pct_of_peak(&p, GemmFormat::Fp8, 1200.0), Some(80.0));
        assert_eq!(pct_of_peak(&p, GemmFormat::W4a4, 1.0), None);
        let md = markdown(&k);
        assert!(md.contains("BF16 700 TFLOP/s (bf16 a M=8192)"), "{md}");
        assert!(md.contains("560 (80%)"), "{md}");
        assert!(md.contains("1,500 (100%)"), "{md}");
        assert!(md.contains("| a     | 8,192 |"), "{md}");
    }

    #[test]
    fn nothing_timed_nothing_rendered() {
        assert_eq!(markdown(&KernelResults::default()), "");
        assert_eq!(fmt_tflops(1496.4), "1,496");
        assert_eq!(fmt_tflops(3.658), "3.66");
    }
}
