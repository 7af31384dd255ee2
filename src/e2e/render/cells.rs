//! Cell formats shared by the e2e tables: a sourced value with its source, milliseconds,
//! percentiles shown only where enough samples hold them ([`min_n_for`]), percentages, and a
//! value every run shares.

use crate::e2e::conditions::Sourced;
use crate::e2e::driver::RunResult;
use crate::e2e::metrics::Percentiles;
use crate::output::table::grouped;

pub(super) fn src<T: std::fmt::Display>(s: &Option<Sourced<T>>) -> (String, String) {
    match s {
        Some(s) => (s.value.to_string(), s.source.clone()),
        None => ("unknown".into(), "—".into()),
    }
}

pub(super) fn ms(x: f64) -> String {
    if x < 10.0e-3 {
        format!("{:.2}", x * 1e3)
    } else if x < 1.0 {
        format!("{:.1}", x * 1e3)
    } else {
        // Digit-grouped: 1,039.8.
        grouped(x * 1e3, 1)
    }
}

/// Fewest samples for which the `q` quantile is shown: with fewer, no sample lies beyond it
/// and the "percentile" is only the largest value (p90: 10, p95: 20, p99: 100).
pub fn min_n_for(q: f64) -> usize {
    (1.0 / (1.0 - q)).round() as usize
}

pub(super) fn pctl(p: &Percentiles, q: f64, v: f64) -> String {
    if p.n >= min_n_for(q) {
        ms(v)
    } else {
        "—".into()
    }
}

/// Whether two percentile summaries hold the same figures (TTFC repeats TTFT when no reasoning
/// text precedes the first content token).
pub(super) fn same_figures(a: &Option<Percentiles>, b: &Option<Percentiles>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => {
            let close = |x: f64, y: f64| (x - y).abs() <= 1e-9_f64.max(1e-6 * x.abs());
            a.n == b.n
                && close(a.p50, b.p50)
                && close(a.p90, b.p90)
                && close(a.p95, b.p95)
                && close(a.p99, b.p99)
                && close(a.mean, b.mean)
        }
        (None, None) => true,
        _ => false,
    }
}

pub(super) fn pct(x: Option<f64>) -> String {
    match x {
        Some(v) if v > 0.0 && v < 0.001 => format!("{:.4}%", v * 100.0),
        Some(v) => format!("{:.1}%", v * 100.0),
        None => "unknown".into(),
    }
}

pub(super) fn same<T: PartialEq + Clone>(
    runs: &[RunResult],
    f: impl Fn(&RunResult) -> T,
) -> Option<T> {
    let first = f(runs.first()?);
    runs.iter().all(|r| f(r) == first).then_some(first)
}
