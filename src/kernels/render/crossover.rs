//! Where one implementation is faster than another over M, as text: the kernel section's
//! per-shape crossovers and the decode-step composite's.

use crate::output::table::thousands;

/// Intervals of M where `a` is faster than `b` (both measured), as text.
pub fn crossover(a: &str, b: &str, points: &[(usize, f64, f64)]) -> Option<String> {
    if points.is_empty() {
        return None;
    }
    let mut segs: Vec<(bool, usize, usize)> = Vec::new();
    for &(m, ta, tb) in points {
        let faster = ta < tb;
        match segs.last_mut() {
            Some(s) if s.0 == faster => s.2 = m,
            _ => segs.push((faster, m, m)),
        }
    }
    let fmt = |s: &(bool, usize, usize)| {
        if s.1 == s.2 {
            format!("M = {}", thousands(s.1 as u64))
        } else {
            format!("M = {}…{}", thousands(s.1 as u64), thousands(s.2 as u64))
        }
    };
    let wins: Vec<String> = segs.iter().filter(|s| s.0).map(fmt).collect();
    Some(if wins.is_empty() {
        format!("{a} is never faster than {b} here")
    } else if segs.len() == 1 {
        format!(
            "{a} is faster than {b} at every M measured ({})",
            fmt(&segs[0])
        )
    } else if segs[0].0 && segs.len() == 2 {
        format!(
            "{a} is faster than {b} up to M = {}; {b} is faster from M = {}",
            thousands(segs[0].2 as u64),
            thousands(segs[1].1 as u64)
        )
    } else {
        format!("{a} is faster than {b} at {}", wins.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crossover_texts() {
        let pts = vec![
            (1, 1.0, 2.0),
            (16, 1.0, 2.0),
            (64, 3.0, 2.0),
            (1024, 3.0, 2.0),
        ];
        assert_eq!(
            crossover("w4a16", "fp8", &pts).unwrap(),
            "w4a16 is faster than fp8 up to M = 16; fp8 is faster from M = 64"
        );
        assert!(crossover("a", "b", &[(1, 3.0, 2.0)])
            .unwrap()
            .contains("never"));
        assert!(crossover("a", "b", &[(1, 1.0, 2.0), (2, 1.0, 2.0)])
            .unwrap()
            .contains("every M"));
    }
}
