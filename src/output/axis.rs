//! Axis tick labels for the report's plots: digit-grouped, no spurious decimals (`10,000`, not
//! `10000.0`), and nothing at fractional positions of an axis that counts things (M,
//! concurrency).

/// A tick label for a continuous axis: integers digit-grouped (`1,000`), other values with up
/// to three significant digits and no trailing zeros (`0.5`, `2.25`, `0.0012`).
pub fn tick(v: &f64) -> String {
    let v = *v;
    if !v.is_finite() {
        return String::new();
    }
    let r = v.round();
    if (v - r).abs() <= 1e-9 * v.abs().max(1.0) {
        let s = crate::output::table::thousands(r.abs() as u64);
        return if r < 0.0 { format!("-{s}") } else { s };
    }
    let a = v.abs();
    let decimals = if a >= 100.0 {
        0
    } else if a >= 10.0 {
        1
    } else if a >= 1.0 {
        2
    } else {
        // Three significant digits below 1.
        (2.0 - a.log10().floor()) as usize
    };
    let s = format!("{v:.decimals$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    if a >= 1000.0 {
        tick(&v.round())
    } else {
        s
    }
}

/// A tick label for an axis of counts: integers digit-grouped, nothing at fractional positions.
pub fn count_tick(v: &f64) -> String {
    if (v - v.round()).abs() > 1e-9 {
        String::new()
    } else {
        tick(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(tick(&10000.0), "10,000");
        assert_eq!(tick(&100000.0), "100,000");
        assert_eq!(tick(&1.0), "1");
        assert_eq!(tick(&0.5), "0.5");
        assert_eq!(tick(&2.25), "2.25");
        assert_eq!(tick(&12.5), "12.5");
        assert_eq!(tick(&0.00123), "0.00123");
        assert_eq!(tick(&1234.5), "1,235");
        assert_eq!(tick(&-3.0), "-3");
        assert_eq!(count_tick(&0.5), "");
        assert_eq!(count_tick(&4.0), "4");
        assert_eq!(count_tick(&8192.0), "8,192");
    }
}
