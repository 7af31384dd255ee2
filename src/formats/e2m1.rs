//! E2M1 (FP4): 1 sign bit, 2 exponent bits (bias 1), 1 mantissa bit; no Inf, no NaN.
//!
//! Source: OCP Microscaling Formats (MX) Specification v1.0, §5.3.3 "FP4 (E2M1)", and NVIDIA's
//! `cuda_fp4.h` `__nv_fp4_e2m1`. The eight magnitudes are 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the
//! sign. Encoding rounds to nearest with ties to even and saturates to ±6, matching NVIDIA
//! ModelOpt's `cast_to_fp4x2` thresholds (≤0.25→0, <0.75→0.5, ≤1.25→1, <1.75→1.5, ≤2.5→2, <3.5→3,
//! ≤5→4, >5→6).

/// Magnitudes of the codes 0..=7 (bit 3 clear); codes 8..=15 are their negatives.
pub const E2M1_MAGNITUDES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Largest finite E2M1 magnitude.
pub const E2M1_MAX: f32 = 6.0;

/// Decode one 4-bit code (only the low 4 bits of `code` are read) to f32.
///
/// Code 0b1000 decodes to -0.0.
#[inline]
pub fn decode(code: u8) -> f32 {
    let mag = E2M1_MAGNITUDES[(code & 0x7) as usize];
    if code & 0x8 != 0 {
        -mag
    } else {
        mag
    }
}

/// Encode an f32 to a 4-bit code: round to nearest, ties to even (even = mantissa bit 0),
/// saturating to ±6. NaN encodes as +6 (0x7): E2M1 has no NaN and a quantizer must not emit a
/// silent zero for a poisoned input; callers that care check for NaN before encoding.
#[inline]
pub fn encode(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7;
    }
    let sign = if x.is_sign_negative() { 0x8 } else { 0x0 };
    let a = x.abs();
    // Midpoints between consecutive magnitudes; at an exact midpoint the even code wins
    // (codes 0, 2, 4, 6 have mantissa bit 0).
    let code = if a <= 0.25 {
        0
    } else if a < 0.75 {
        1
    } else if a <= 1.25 {
        2
    } else if a < 1.75 {
        3
    } else if a <= 2.5 {
        4
    } else if a < 3.5 {
        5
    } else if a <= 5.0 {
        6
    } else {
        7
    };
    sign | code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_all_16_codes() {
        let expected = [
            0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
        ];
        for code in 0u8..16 {
            let d = decode(code);
            assert_eq!(d, expected[code as usize], "code {code:#x}");
            assert_eq!(d.is_sign_negative(), code >= 8, "sign of code {code:#x}");
        }
    }

    #[test]
    fn encode_decode_roundtrip_all_codes() {
        for code in 0u8..16 {
            assert_eq!(encode(decode(code)), code, "code {code:#x}");
        }
    }

    #[test]
    fn ties_go_to_even_and_saturate() {
        let cases = [
            (0.25, 0x0),
            (0.2500001, 0x1),
            (0.75, 0x2),
            (1.25, 0x2),
            (1.75, 0x4),
            (2.5, 0x4),
            (3.5, 0x6),
            (5.0, 0x6),
            (5.0001, 0x7),
            (6.0, 0x7),
            (1e30, 0x7),
            (f32::INFINITY, 0x7),
            (-0.75, 0xA),
            (-7.0, 0xF),
            (f32::NEG_INFINITY, 0xF),
        ];
        for (x, code) in cases {
            assert_eq!(encode(x), code, "x = {x}");
        }
    }

    #[test]
    fn encode_is_nearest_on_a_dense_grid() {
        // Every input maps to a magnitude at minimal distance (ties excluded above).
        let mut x = -7.0f32;
        while x <= 7.0 {
            let q = decode(encode(x));
            let best = E2M1_MAGNITUDES
                .iter()
                .flat_map(|m| [*m, -*m])
                .map(|m| (m - x.clamp(-6.0, 6.0)).abs())
                .fold(f32::INFINITY, f32::min);
            assert!(
                ((q - x.clamp(-6.0, 6.0)).abs() - best).abs() < 1e-6,
                "x = {x}, q = {q}"
            );
            x += 0.01;
        }
    }

    #[test]
    fn nan_saturates() {
        assert_eq!(encode(f32::NAN), 0x7);
    }
}
