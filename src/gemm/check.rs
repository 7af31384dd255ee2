//! The one error metric of the GPU layer's checks, and the named tolerances each GEMM is held to.
//!
//! `rel_l2 = ‖got − want‖₂ / ‖want‖₂` (METHOD.md's `‖out − ref‖ / ‖ref‖`): the kernel bench's
//! check before timing, the tuner's check of every candidate ([`super::tuner::choose`]), the
//! runtime's self-checks (GEMM paths, attention, the GDN kernels) and the CUDA backend's
//! whole-model parity all use [`rel_l2`], so "relative L2" means one thing in every report.

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
/// W4A4 NVFP4 vs the f64 reference of the same (exactly dequantized) NVFP4 operands: BF16 output
/// rounding and FP32 accumulation order only, as for the other formats.
pub const W4A4_GEMM_REL_L2: f64 = 5e-3;

/// Relative L2 error of `got` against the reference `want`: `‖got − want‖₂ / ‖want‖₂`, summed
/// in f64 (each element converted to f64 before the difference).
///
/// Argument order: the value under test first, the reference second (the denominator is the
/// reference's norm).
///
/// Never passes a bad output: the result is `+∞` when the lengths differ, when any element of
/// either side is NaN or infinite, or when `want` is all zero and `got` is not; two all-zero
/// slices give 0. So `rel_l2(got, want) <= tol` is false for every non-finite case, and a NaN
/// never reaches a comparison.
///
/// Works for `f32` and `f64` slices alike (BF16 bits are decoded first, see
/// [`rel_l2_bf16`]).
pub fn rel_l2<G, W>(got: &[G], want: &[W]) -> f64
where
    G: Copy + Into<f64>,
    W: Copy + Into<f64>,
{
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let (mut num, mut den) = (0f64, 0f64);
    for (g, w) in got.iter().zip(want) {
        let (g, w): (f64, f64) = ((*g).into(), (*w).into());
        if !g.is_finite() || !w.is_finite() {
            return f64::INFINITY;
        }
        num += (g - w) * (g - w);
        den += w * w;
    }
    if den == 0.0 {
        return if num == 0.0 { 0.0 } else { f64::INFINITY };
    }
    (num / den).sqrt()
}

/// [`rel_l2`] of BF16 values given as their bit patterns (`u16`, the upper half of an f32).
pub fn rel_l2_bf16(got: &[u16], want: &[u16]) -> f64 {
    let decode = |v: &[u16]| -> Vec<f32> {
        v.iter()
            .map(|b| f32::from_bits((*b as u32) << 16))
            .collect()
    };
    rel_l2(&decode(got), &decode(want))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rel_l2_cases() {
        assert_eq!(rel_l2(&[1.0f64, 2.0], &[1.0f64, 2.0]), 0.0);
        assert!((rel_l2(&[1.1f64, 0.0], &[1.0f64, 0.0]) - 0.1).abs() < 1e-12);
        // The reference's norm is the denominator: the order matters.
        assert!((rel_l2(&[2.0f32], &[1.0f32]) - 1.0).abs() < 1e-12);
        assert!((rel_l2(&[1.0f32], &[2.0f32]) - 0.5).abs() < 1e-12);
        assert_eq!(rel_l2(&[0.0f32], &[0.0f32]), 0.0);
        assert_eq!(rel_l2(&[1.0f64], &[0.0f64]), f64::INFINITY);
        assert_eq!(rel_l2(&[1.0f64, 2.0], &[1.0f64]), f64::INFINITY);
        // Mixed precisions: f32 under test, f64 reference.
        assert_eq!(rel_l2(&[0.5f32], &[0.5f64]), 0.0);
    }

    #[test]
    fn non_finite_never_passes() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            assert_eq!(rel_l2(&[bad, 1.0], &[1.0f32, 1.0]), f64::INFINITY);
            assert_eq!(rel_l2(&[1.0f32, 1.0], &[1.0, bad]), f64::INFINITY);
            assert!(rel_l2(&[bad], &[1.0f32]) > 1e300);
        }
    }

    #[test]
    fn bf16_bits_are_decoded() {
        let one = 0x3F80u16;
        let two = 0x4000u16;
        assert_eq!(rel_l2_bf16(&[one], &[one]), 0.0);
        assert!((rel_l2_bf16(&[two], &[one]) - 1.0).abs() < 1e-12);
        assert!(rel_l2_bf16(&[0x7FC0], &[one]).is_infinite());
        assert!(rel_l2_bf16(&[one], &[0]).is_infinite());
    }
}
