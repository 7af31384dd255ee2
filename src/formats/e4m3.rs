//! FP8 E4M3 ("E4M3FN"): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinities;
//! NaN is S.1111.111 (0x7F and 0xFF); the largest finite magnitude is 1.75·2⁸ = 448 (0x7E);
//! subnormals are m/8·2⁻⁶ (smallest 2⁻⁹).
//!
//! Source: OCP 8-bit Floating Point Specification (OFP8) rev 1.0, §5.3 "E4M3", and NVIDIA's
//! `cuda_fp8.h` `__nv_fp8_e4m3`. Encoding rounds to nearest with ties to even and saturates finite
//! overflow (and ±Inf) to ±448, as `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)` does and
//! as NVIDIA ModelOpt's scale casts expect. NaN encodes as 0x7F (sign kept: 0xFF).

/// Largest finite E4M3 magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// Decode one E4M3 byte to f32 (exact: every E4M3 value is representable in f32).
#[inline]
pub fn decode(byte: u8) -> f32 {
    DECODE_TABLE[byte as usize]
}

/// Encode an f32 to an E4M3 byte: round to nearest, ties to even, saturating to ±448.
pub fn encode(x: f32) -> u8 {
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    if x.is_nan() {
        return sign | 0x7F;
    }
    let a = x.abs() as f64;
    if a >= E4M3_MAX as f64 {
        return sign | 0x7E;
    }
    // Subnormal range (below the smallest normal 2^-6): the code is the count of 2^-9 steps, and a
    // count of 8 is exactly the smallest normal's code 0x08, so no special case is needed.
    if a < 2f64.powi(-6) {
        let q = (a * 512.0).round_ties_even() as u8;
        return sign | q;
    }
    let mut e = a.log2().floor() as i32;
    // Guard against log2 rounding at exact powers of two.
    if 2f64.powi(e) > a {
        e -= 1;
    } else if 2f64.powi(e + 1) <= a {
        e += 1;
    }
    let mant = a / 2f64.powi(e) - 1.0; // exact: division by a power of two
    let mut m = (mant * 8.0).round_ties_even() as i32;
    if m == 8 {
        m = 0;
        e += 1;
    }
    let biased = e + 7;
    if biased > 15 || (biased == 15 && m == 7) {
        return sign | 0x7E;
    }
    sign | ((biased as u8) << 3) | (m as u8)
}

/// Round an f32 through E4M3 and back (the value a kernel sees after a cast).
#[inline]
pub fn round_trip(x: f32) -> f32 {
    decode(encode(x))
}

const fn decode_const(byte: u8) -> f32 {
    let sign = if byte & 0x80 != 0 { -1.0f32 } else { 1.0f32 };
    let exp = ((byte >> 3) & 0xF) as i32;
    let man = (byte & 0x7) as f32;
    if exp == 15 && (byte & 0x7) == 7 {
        return f32::NAN;
    }
    if exp == 0 {
        // m/8 * 2^-6 = m * 2^-9
        return sign * man * (1.0 / 512.0);
    }
    let mut scale = 1.0f32;
    let mut i = 0;
    if exp >= 7 {
        while i < exp - 7 {
            scale *= 2.0;
            i += 1;
        }
    } else {
        while i < 7 - exp {
            scale *= 0.5;
            i += 1;
        }
    }
    sign * (1.0 + man / 8.0) * scale
}

const fn build_table() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = decode_const(i as u8);
        i += 1;
    }
    t
}

static DECODE_TABLE: [f32; 256] = build_table();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_known_values() {
        assert_eq!(decode(0x00), 0.0);
        assert!(decode(0x80).is_sign_negative() && decode(0x80) == 0.0);
        assert_eq!(decode(0x01), 2f32.powi(-9));
        assert_eq!(decode(0x07), 7.0 * 2f32.powi(-9));
        assert_eq!(decode(0x08), 2f32.powi(-6));
        assert_eq!(decode(0x38), 1.0);
        assert_eq!(decode(0x3C), 1.5);
        assert_eq!(decode(0x7E), 448.0);
        assert_eq!(decode(0xFE), -448.0);
        assert!(decode(0x7F).is_nan());
        assert!(decode(0xFF).is_nan());
    }

    #[test]
    fn exactly_two_nan_codes() {
        let nans: Vec<u8> = (0..=255u8).filter(|b| decode(*b).is_nan()).collect();
        assert_eq!(nans, vec![0x7F, 0xFF]);
    }

    #[test]
    fn all_256_codes_round_trip() {
        for b in 0..=255u8 {
            let v = decode(b);
            if v.is_nan() {
                assert_eq!(encode(v) & 0x7F, 0x7F, "NaN code {b:#x}");
            } else {
                assert_eq!(encode(v), b, "code {b:#x} value {v}");
            }
        }
    }

    #[test]
    fn decode_is_monotonic_over_positive_codes() {
        for b in 0..0x7Eu8 {
            assert!(decode(b) < decode(b + 1), "{b:#x}");
        }
    }

    #[test]
    fn saturates_at_448() {
        assert_eq!(encode(448.0), 0x7E);
        assert_eq!(encode(460.0), 0x7E);
        assert_eq!(encode(1e9), 0x7E);
        assert_eq!(encode(f32::INFINITY), 0x7E);
        assert_eq!(encode(-1e9), 0xFE);
        assert_eq!(encode(f32::NEG_INFINITY), 0xFE);
    }

    #[test]
    fn ties_to_even_between_every_pair_of_neighbours() {
        for b in 0..0x7Eu8 {
            let lo = decode(b) as f64;
            let hi = decode(b + 1) as f64;
            let mid = ((lo + hi) / 2.0) as f32;
            assert_eq!(mid as f64, (lo + hi) / 2.0, "midpoint exact in f32");
            let expect = if b % 2 == 0 { b } else { b + 1 };
            assert_eq!(encode(mid), expect, "tie between {b:#x} and {:#x}", b + 1);
            // Just off the midpoint goes to the nearer neighbour.
            assert_eq!(encode(mid * (1.0 - 1e-6)), b);
            assert_eq!(encode(mid * (1.0 + 1e-6)), b + 1);
        }
    }

    #[test]
    fn nan_encodes_to_nan_with_sign() {
        assert_eq!(encode(f32::NAN), 0x7F);
        assert_eq!(encode(-f32::NAN), 0xFF);
    }
}
