//! CPU references for the GEMM checks, and the named tolerances each kernel is held to.
//!
//! Every case is checked before it is timed: the GPU output at a grid of sampled coordinates
//! (up to 32 token rows × 64 output columns, always including the first and last of each) is
//! compared with `Σ_k w[n][k] · a[m][k]` computed in f64 from the exact operand values the GPU
//! received (regenerated from the seeds, see [`super::data`]). Error metric:
//! `rel_l2 = ‖out − ref‖₂ / ‖ref‖₂` over the sample (METHOD.md's `‖out − ref‖ / ‖ref‖`); NaN or an
//! unwritten (poisoned) output anywhere in C fails the check.

/// BF16 GEMM vs f64 reference of the same BF16 operands. The output is rounded to BF16
/// (relative error ≤ 2⁻⁹ per element, ≈ 1.1e-3 RMS) and FP32 accumulation order differs; 5e-3
/// leaves room for that and nothing else.
pub const BF16_GEMM_REL_L2: f64 = 5e-3;
/// FP8 W8A8 GEMM vs f64 reference of the same E4M3 operands and scales (activations quantized
/// by the same rule on the CPU): again only BF16 output rounding and accumulation order.
pub const FP8_GEMM_REL_L2: f64 = 5e-3;
/// W4A16 NVFP4 vs f64 reference of the exactly dequantized NVFP4 weights and the BF16
/// activations: the kernel's dequantization is exact (see formats::w4a16_pack), so only BF16
/// output rounding and FP32 accumulation order remain.
pub const W4A16_GEMM_REL_L2: f64 = 5e-3;

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

/// ‖got − want‖₂ / ‖want‖₂; infinity when any value is NaN or `want` is all zero while `got`
/// is not.
pub fn rel_l2(got: &[f64], want: &[f64]) -> f64 {
    if got.len() != want.len() || got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = got.iter().zip(want).map(|(g, w)| (g - w) * (g - w)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    if den == 0.0 {
        return if num == 0.0 { 0.0 } else { f64::INFINITY };
    }
    (num / den).sqrt()
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
    fn rel_l2_cases() {
        assert_eq!(rel_l2(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!((rel_l2(&[1.1, 0.0], &[1.0, 0.0]) - 0.1).abs() < 1e-12);
        assert_eq!(rel_l2(&[f64::NAN], &[1.0]), f64::INFINITY);
        assert_eq!(rel_l2(&[1.0], &[0.0]), f64::INFINITY);
        assert_eq!(rel_l2(&[0.0], &[0.0]), 0.0);
    }

    #[test]
    fn sampled_gemm_matches_hand_computation() {
        let a = |m: usize| vec![m as f64, 1.0];
        let w = |n: usize| vec![1.0, n as f64];
        let out = sampled_gemm(&[2, 3], &[5], 2, &a, &w);
        assert_eq!(out, vec![2.0 + 5.0, 3.0 + 5.0]);
    }
}
