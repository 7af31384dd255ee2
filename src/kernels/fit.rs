//! Fixed cost and streaming rate of each implementation: the least-squares line
//! `time = T0 + bytes / BW` through its (weight-stream bytes, median time) points over the
//! suite's shapes at one M (docs/w4a16-notes.md). At small M a GEMM is a weight stream, so `BW` is
//! the rate it streams weights at and `T0` what every launch costs on top (ramp-up, tail,
//! split-K reduction, launch).
//!
//! Ordinary least squares of `y = a + b·x` (x = bytes, y = seconds): `b = Σ(x − x̄)(y − ȳ) /
//! Σ(x − x̄)²`, `a = ȳ − b·x̄`, `R² = 1 − SS_res / SS_tot`; `T0 = a`, `BW = 1 / b`. GEMM time
//! only: FP8's separately timed activation quantization is not in it.

use super::composite::StepTiming;
use super::schema::{KernelCase, KernelResults};

/// A fitted line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    /// Intercept: the fixed cost per GEMM, seconds (may come out negative for a poor fit).
    pub t0_s: f64,
    /// 1 / slope: the streaming rate, bytes per second; `None` when time does not grow with bytes.
    pub bytes_per_s: Option<f64>,
    /// Coefficient of determination (1 = every point on the line; `None` when all times are
    /// equal).
    pub r2: Option<f64>,
    /// Points used.
    pub points: usize,
}

impl Fit {
    /// The time the line predicts for `bytes`, seconds (`None` without a streaming rate).
    pub fn predict(&self, bytes: f64) -> Option<f64> {
        Some(self.t0_s + bytes / self.bytes_per_s?)
    }
}

/// Fit `time = T0 + bytes / BW` through `(bytes, seconds)` points. `None` with fewer than two
/// distinct byte counts.
pub fn fit_line(points: &[(f64, f64)]) -> Option<Fit> {
    let n = points.len();
    if n < 2 {
        return None;
    }
    let xm = points.iter().map(|p| p.0).sum::<f64>() / n as f64;
    let ym = points.iter().map(|p| p.1).sum::<f64>() / n as f64;
    let sxx: f64 = points.iter().map(|p| (p.0 - xm).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - xm) * (p.1 - ym)).sum();
    let b = sxy / sxx;
    let a = ym - b * xm;
    let ss_tot: f64 = points.iter().map(|p| (p.1 - ym).powi(2)).sum();
    let ss_res: f64 = points.iter().map(|p| (p.1 - (a + b * p.0)).powi(2)).sum();
    Some(Fit {
        t0_s: a,
        bytes_per_s: (b > 0.0).then(|| 1.0 / b),
        r2: (ss_tot > 0.0).then(|| 1.0 - ss_res / ss_tot),
        points: n,
    })
}

/// The M the report fits at: 1 when measured, else the smallest M measured.
pub fn fit_m(k: &KernelResults) -> Option<usize> {
    k.cases.iter().map(|c| c.m).min()
}

/// One implementation's fit.
#[derive(Debug, Clone, PartialEq)]
pub struct ImplFit {
    /// Column key (`bf16`, `torch:torch.matmul`).
    pub column: String,
    /// The M fitted at.
    pub m: usize,
    /// Timing mode.
    pub timing: StepTiming,
    /// The shapes used.
    pub shapes: Vec<String>,
    /// The line (`None` when fewer than two distinct byte counts).
    pub fit: Option<Fit>,
}

fn column(c: &KernelCase) -> String {
    if c.provider == "rigbench" {
        c.implementation.clone()
    } else {
        format!("{}:{}", c.provider, c.implementation)
    }
}

/// The GEMM median of `c` in `mode`, if it has that timing.
pub fn median_in(c: &KernelCase, mode: StepTiming) -> Option<f64> {
    match mode {
        StepTiming::Cold => c.cold_timing().map(|t| t.median_s),
        StepTiming::Graph => c.graph_timings().map(|(t, _)| t.median_s),
    }
}

/// The fit of every implementation (rigbench's and peers', in first-seen order) at `m`, in
/// `mode`, over the shapes it has a timing for there.
pub fn fits(k: &KernelResults, m: usize, mode: StepTiming) -> Vec<ImplFit> {
    let mut cols: Vec<String> = Vec::new();
    for c in &k.cases {
        let col = column(c);
        if !cols.contains(&col) {
            cols.push(col);
        }
    }
    cols.into_iter()
        .filter_map(|col| {
            let pts: Vec<(&KernelCase, f64)> = k
                .cases
                .iter()
                .filter(|c| c.m == m && column(c) == col && c.derived.weight_bytes > 0)
                .filter_map(|c| Some((c, median_in(c, mode)?)))
                .collect();
            if pts.is_empty() {
                return None;
            }
            let xy: Vec<(f64, f64)> = pts
                .iter()
                .map(|(c, t)| (c.derived.weight_bytes as f64, *t))
                .collect();
            Some(ImplFit {
                column: col,
                m,
                timing: mode,
                shapes: pts.iter().map(|(c, _)| c.shape.clone()).collect(),
                fit: fit_line(&xy),
            })
        })
        .collect()
}

/// The fit of one column at `m` in `mode`.
pub fn fit_of(k: &KernelResults, column_key: &str, m: usize, mode: StepTiming) -> Option<Fit> {
    fits(k, m, mode)
        .into_iter()
        .find(|f| f.column == column_key)?
        .fit
}

/// The report section: every implementation's fitted T0 and BW at [`fit_m`], per timing mode.
/// Empty without cases.
pub fn markdown(k: &KernelResults) -> String {
    let Some(m) = fit_m(k) else {
        return String::new();
    };
    let mut rows = Vec::new();
    let mut above_copy = false;
    for mode in [StepTiming::Cold, StepTiming::Graph] {
        for f in fits(k, m, mode) {
            let copy = k.copy_bandwidth.as_ref().map(|c| c.bytes_per_s);
            if let (Some(b), Some(c)) = (f.fit.and_then(|x| x.bytes_per_s), copy) {
                above_copy |= c > 0.0 && b > c;
            }
            rows.push(vec![
                f.column.clone(),
                mode.id().to_string(),
                f.shapes.len().to_string(),
                f.fit
                    .map(|x| crate::output::table::human_seconds(x.t0_s))
                    .unwrap_or_else(|| "—".into()),
                f.fit
                    .and_then(|x| x.bytes_per_s)
                    .map(|b| format!("{:.2} TB/s", b / 1e12))
                    .unwrap_or_else(|| "—".into()),
                match (f.fit.and_then(|x| x.bytes_per_s), copy) {
                    (Some(b), Some(c)) if c > 0.0 => format!("{:.0}%", 100.0 * b / c),
                    _ => "—".into(),
                },
                f.fit
                    .and_then(|x| x.r2)
                    .map(|r| format!("{r:.3}"))
                    .unwrap_or_else(|| "—".into()),
            ]);
        }
    }
    if rows.is_empty() {
        return String::new();
    }
    let which = if m == 1 {
        "M = 1".to_string()
    } else {
        format!("M = {m} (the smallest M measured; M = 1 was not)")
    };
    let mut o = format!("### Fixed cost and streaming rate: time = T0 + bytes / BW at {which}\n\n");
    o.push_str("A least-squares line through each implementation's (weight-stream bytes, median time) points over the shapes it ran at that M. T0 is what every GEMM costs on top of streaming its weights (ramp-up, tail, split-K reduction, launch); BW is the rate it streams them at, shown also as a share of the copy rate measured in this run. GEMM time only: FP8's activation quantization is not in it.\n\n");
    o.push_str(&crate::output::table::markdown_table(
        &[
            "implementation",
            "timing",
            "shapes",
            "T0",
            "BW",
            "BW % of copy rate",
            "R²",
        ],
        &rows,
    ));
    o.push('\n');
    if above_copy {
        o.push_str(ABOVE_COPY);
        o.push_str("\n\n");
    }
    o
}

/// Why a GEMM's weight stream can run faster than the copy roofline (a share above 100%).
pub const ABOVE_COPY: &str = "A share above 100% is not an error: the copy roofline is a device-to-device copy, which reads and writes every byte (its rate counts both, and the memory turns the bus around between reads and writes), while a GEMM's weight stream is almost all reads; HBM serves a read-only stream a few per cent faster. The copy rate is a practical ceiling for moving data, not a hard one for reading it.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_a_known_line() {
        // 5 µs fixed cost, 4 TB/s.
        let pts: Vec<(f64, f64)> = [1e6, 1e7, 1e8, 2.5e9]
            .iter()
            .map(|&b| (b, 5e-6 + b / 4e12))
            .collect();
        let f = fit_line(&pts).unwrap();
        assert!((f.t0_s - 5e-6).abs() < 1e-12, "{f:?}");
        assert!((f.bytes_per_s.unwrap() / 4e12 - 1.0).abs() < 1e-9);
        assert!((f.r2.unwrap() - 1.0).abs() < 1e-12);
        assert!((f.predict(2e6).unwrap() - (5e-6 + 2e6 / 4e12)).abs() < 1e-12);
    }

    #[test]
    fn degenerate_inputs() {
        assert!(fit_line(&[(1.0, 1.0)]).is_none());
        assert!(
            fit_line(&[(1.0, 1.0), (1.0, 2.0)]).is_none(),
            "one byte count"
        );
        let f = fit_line(&[(1.0, 2.0), (2.0, 1.0)]).unwrap();
        assert_eq!(f.bytes_per_s, None, "time falling with bytes has no rate");
        assert!(f.predict(3.0).is_none());
        let f = fit_line(&[(1.0, 2.0), (2.0, 2.0)]).unwrap();
        assert_eq!(f.r2, None);
    }

    /// A hand check with noise: points (1, 3), (2, 5), (3, 6): x̄ = 2, ȳ = 14/3, slope 1.5,
    /// intercept 5/3, SS_res = 1/6, SS_tot = 14/3, R² = 1 − 1/28.
    #[test]
    fn least_squares_by_hand() {
        let f = fit_line(&[(1.0, 3.0), (2.0, 5.0), (3.0, 6.0)]).unwrap();
        assert!((f.t0_s - 5.0 / 3.0).abs() < 1e-12);
        assert!((f.bytes_per_s.unwrap() - 1.0 / 1.5).abs() < 1e-12);
        assert!((f.r2.unwrap() - (1.0 - 1.0 / 28.0)).abs() < 1e-12);
    }

    /// GEMMs streaming their weights faster than the copy roofline (the H200's kernels of
    /// record: 103–106%) get the reason beside the table; at or below it, no such sentence.
    #[test]
    fn a_share_above_the_copy_rate_is_explained() {
        let with_rate = |copy_tbps: f64| {
            let mut k = KernelResults::default();
            for (shape, bytes) in [("a", 1e8), ("b", 4e8), ("c", 1.6e9)] {
                let mut c = crate::kernels::composite::tests::case_for_tests("bf16", 0.0);
                c.shape = shape.into();
                c.derived.weight_bytes = bytes as u64;
                // 5 µs fixed cost, weights streamed at 4.4 TB/s.
                let t = 5e-6 + bytes / 4.4e12;
                c.timing.median_s = t;
                c.timing.samples_s = vec![t];
                k.cases.push(c);
            }
            k.copy_bandwidth = Some(crate::kernels::schema::CopyBandwidth {
                bytes: 1 << 30,
                median_s: 1.0,
                bytes_per_s: copy_tbps * 1e12,
                samples: 20,
            });
            markdown(&k)
        };
        let above = with_rate(4.21);
        assert!(above.contains("| 105%"), "{above}");
        assert!(above.contains(ABOVE_COPY), "{above}");
        assert!(above.contains("reads and writes every byte"));
        let below = with_rate(4.6);
        assert!(below.contains("| 96%"), "{below}");
        assert!(!below.contains(ABOVE_COPY), "{below}");
    }
}
