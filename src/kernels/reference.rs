//! CPU references for the kernel bench's GEMM checks. The error metric and the named tolerances
//! are the GEMM layer's ([`crate::gemm::check`]).
//!
//! Every case is checked before it is timed: the GPU output at a grid of sampled coordinates
//! (up to 32 token rows × 64 output columns, always including the first and last of each) is
//! compared with `Σ_k w[n][k] · a[m][k]` computed in f64 from the exact operand values the GPU
//! received (regenerated from the seeds, see [`super::data`]). Error metric:
//! [`crate::gemm::check::rel_l2`] over the sample; NaN or an unwritten (poisoned) output anywhere
//! in C fails the check.

/// Sampled coordinates: up to `max_m` distinct token rows and `max_n` output columns (first and
/// last always included), chosen from `seed`.
pub fn sample_axes(
    m: usize,
    n: usize,
    max_m: usize,
    max_n: usize,
    seed: u32,
) -> (Vec<usize>, Vec<usize>) {
    fn axis(len: usize, max: usize, seed: u32) -> Vec<usize> {
        if len <= max {
            return (0..len).collect();
        }
        let mut v = vec![0, len - 1];
        let mut i = 0u32;
        while v.len() < max {
            let c = (super::data::hash32(i ^ super::data::hash32(seed)) as usize) % len;
            if !v.contains(&c) {
                v.push(c);
            }
            i += 1;
        }
        v.sort_unstable();
        v
    }
    (axis(m, max_m, seed), axis(n, max_n, seed ^ 0x9e37_79b9))
}

/// Reference values at all (row, col) pairs of the sample, row-major over `rows × cols`:
/// `out[i·cols + j] = Σ_k w(cols[j], k) · a(rows[i], k)`, with the operand rows produced by the
/// given closures (each called once per sampled row).
pub fn sampled_gemm(
    rows: &[usize],
    cols: &[usize],
    k: usize,
    a_row: &(dyn Fn(usize) -> Vec<f64> + Sync),
    w_row: &(dyn Fn(usize) -> Vec<f64> + Sync),
) -> Vec<f64> {
    let a: Vec<Vec<f64>> = rows.iter().map(|m| a_row(*m)).collect();
    let w: Vec<Vec<f64>> = cols.iter().map(|n| w_row(*n)).collect();
    let mut out = Vec::with_capacity(rows.len() * cols.len());
    for ar in &a {
        for wr in &w {
            debug_assert_eq!(ar.len(), k);
            out.push(ar.iter().zip(wr).map(|(x, y)| x * y).sum());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_include_ends_and_are_distinct() {
        let (r, c) = sample_axes(8192, 248_320, 32, 64, 1);
        assert_eq!(r.len(), 32);
        assert_eq!(c.len(), 64);
        assert_eq!((r[0], *r.last().unwrap()), (0, 8191));
        assert_eq!((c[0], *c.last().unwrap()), (0, 248_319));
        let mut d = c.clone();
        d.dedup();
        assert_eq!(d.len(), 64);
        let (r, _) = sample_axes(3, 5, 32, 64, 1);
        assert_eq!(r, vec![0, 1, 2]);
    }

    #[test]
    fn sampled_gemm_matches_hand_computation() {
        let a = |m: usize| vec![m as f64, 1.0];
        let w = |n: usize| vec![1.0, n as f64];
        let out = sampled_gemm(&[2, 3], &[5], 2, &a, &w);
        assert_eq!(out, vec![2.0 + 5.0, 3.0 + 5.0]);
    }
}
