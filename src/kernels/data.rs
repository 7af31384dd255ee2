//! Seeded benchmark data, generated on the GPU by `kernels/util.cu` and mirrored bit-exactly
//! here, so the CPU reference can recompute any element without copying whole tensors back.
//!
//! Values are uniform (never all-zero: zeros make kernels look faster than real data, see the
//! device notes) and carry no meaning beyond being realistic bit patterns:
//! - BF16 tensors: `bf16_rn(u · scale)`, `u` uniform in [−1, 1) from 24 hash bits;
//! - FP8 weights: random E4M3 codes with exponent fields 4..9 (|x| in [2⁻³, 7.5]), never NaN;
//! - NVFP4 weights (ModelOpt layout, built on the host): random E2M1 codes (all 16), block scales
//!   with exponent fields 5..9 (0.25 .. 7.5), `weight_scale_2 = 1/64`.
//!
//! Hash: "lowbias32" (Chris Wellons, 2018), `h(i) = lowbias32(i ^ lowbias32(seed))`.

use crate::formats::nvfp4::{Nvfp4Weight, NVFP4_BLOCK};

/// The 32-bit integer hash used by the generators (a bijection on u32).
#[inline]
pub fn hash32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// Uniform value in [−1, 1) for element `i` (exactly as `uniform_pm1` in util.cu).
#[inline]
pub fn uniform_pm1(i: u32, seed: u32) -> f32 {
    let h = hash32(i ^ hash32(seed));
    (h >> 8) as f32 * (1.0 / 16_777_216.0) * 2.0 - 1.0
}

/// Element `i` of a `fill_uniform_bf16(seed, scale)` tensor, as f32 (a BF16 value).
#[inline]
pub fn bf16_uniform(i: u32, seed: u32, scale: f32) -> f32 {
    crate::formats::bf16_round(uniform_pm1(i, seed) * scale)
}

/// Element `i` of a `fill_fp8_codes(seed)` tensor: an E4M3 code.
#[inline]
pub fn fp8_code(i: u32, seed: u32) -> u8 {
    let h = hash32(i ^ hash32(seed));
    let sign = (h >> 31) << 7;
    let ex = 4 + ((h >> 8) % 6);
    let man = h & 7;
    (sign | (ex << 3) | man) as u8
}

/// Salt of the packed E2M1 code bytes of [`nvfp4_weight`].
pub const NVFP4_CODE_SALT: u32 = 0x5eed_0001;
/// Salt of the E4M3 block-scale bytes of [`nvfp4_weight`].
pub const NVFP4_SCALE_SALT: u32 = 0x5eed_0002;
/// `weight_scale_2` of every [`nvfp4_weight`].
pub const NVFP4_GLOBAL_SCALE: f32 = 1.0 / 64.0;

/// Byte `i` of the packed codes of [`nvfp4_weight`] with `seed` (row-major `[n, k/2]`).
#[inline]
pub fn nvfp4_code_byte(i: u32, seed: u32) -> u8 {
    hash32(i ^ hash32(seed ^ NVFP4_CODE_SALT)) as u8
}

/// Byte `i` of the block scales of [`nvfp4_weight`] with `seed` (row-major `[n, k/16]`): an
/// E4M3 code with exponent field 5..9 (0.25 .. 7.5), any mantissa, positive.
#[inline]
pub fn nvfp4_scale_byte(i: u32, seed: u32) -> u8 {
    let h = hash32(i ^ hash32(seed ^ NVFP4_SCALE_SALT));
    (((5 + (h >> 8) % 5) << 3) | (h & 7)) as u8
}

/// A random `[n, k]` NVFP4 weight in ModelOpt layout (built with `threads` threads).
pub fn nvfp4_weight(n: usize, k: usize, seed: u32, threads: usize) -> Nvfp4Weight {
    let mut packed = vec![0u8; n * k / 2];
    let mut scales = vec![0u8; n * k / NVFP4_BLOCK];
    let threads = threads.max(1);
    let fill = |buf: &mut [u8], offset: usize, f: fn(u32, u32) -> u8| {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = f((offset + i) as u32, seed);
        }
    };
    std::thread::scope(|s| {
        let chunk = packed.len().div_ceil(threads).max(1);
        for (ci, c) in packed.chunks_mut(chunk).enumerate() {
            s.spawn(move || fill(c, ci * chunk, nvfp4_code_byte));
        }
        let chunk = scales.len().div_ceil(threads).max(1);
        for (ci, c) in scales.chunks_mut(chunk).enumerate() {
            s.spawn(move || fill(c, ci * chunk, nvfp4_scale_byte));
        }
    });
    Nvfp4Weight {
        n,
        k,
        packed,
        block_scales: scales,
        global_scale: NVFP4_GLOBAL_SCALE,
    }
}

/// Row `row` of [`nvfp4_weight`]`(n, k, seed, _)` dequantized exactly in f64 (the value
/// [`Nvfp4Weight::value_f64`] gives), computed from the hashes without building the matrix.
pub fn nvfp4_row_f64(row: usize, k: usize, seed: u32) -> Vec<f64> {
    use crate::formats::{e2m1, e4m3};
    (0..k)
        .map(|kk| {
            let byte = nvfp4_code_byte(((row * k + kk) / 2) as u32, seed);
            let code = if kk % 2 == 0 { byte & 0xF } else { byte >> 4 };
            let sc = nvfp4_scale_byte(((row * k + kk) / NVFP4_BLOCK) as u32, seed);
            e2m1::decode(code) as f64 * e4m3::decode(sc) as f64 * NVFP4_GLOBAL_SCALE as f64
        })
        .collect()
}

/// Threads to use for host-side generation on this machine.
pub fn host_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The formats tests' data (computed there, below kernels) is this generator's.
    #[test]
    fn the_formats_test_data_is_this_generator() {
        for seed in [0u32, 3, 11, 0xDEAD_BEEF] {
            let want: Vec<f32> = (0..257u32).map(|i| uniform_pm1(i, seed)).collect();
            assert_eq!(crate::formats::test_uniform(seed, 257), want, "seed {seed}");
        }
    }

    #[test]
    fn hash_known_values() {
        // lowbias32 reference values (from the author's C implementation).
        assert_eq!(hash32(0), 0);
        let mut seen = std::collections::HashSet::new();
        for i in 0..10_000u32 {
            assert!(seen.insert(hash32(i)), "collision at {i}");
        }
    }

    #[test]
    fn uniform_range_and_spread() {
        let v: Vec<f32> = (0..100_000).map(|i| uniform_pm1(i, 7)).collect();
        assert!(v.iter().all(|x| (-1.0..1.0).contains(x)));
        let mean = v.iter().map(|x| *x as f64).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!(v.iter().filter(|x| **x == 0.0).count() < 5);
    }

    #[test]
    fn fp8_codes_are_never_nan_and_bounded() {
        for i in 0..50_000 {
            let c = fp8_code(i, 3);
            let v = crate::formats::e4m3::decode(c);
            assert!(v.is_finite());
            assert!((0.125..=7.5).contains(&v.abs()), "{c:#x} {v}");
        }
    }

    #[test]
    fn nvfp4_rows_from_the_hashes_equal_the_built_weight() {
        let w = nvfp4_weight(24, 64, 0x4A16_0001, 2);
        for row in [0, 7, 23] {
            let r = nvfp4_row_f64(row, 64, 0x4A16_0001);
            for (kk, v) in r.iter().enumerate() {
                assert_eq!(*v, w.value_f64(row, kk), "row {row} k {kk}");
            }
        }
    }

    #[test]
    fn nvfp4_weight_is_deterministic_and_thread_independent() {
        let a = nvfp4_weight(32, 64, 9, 1);
        let b = nvfp4_weight(32, 64, 9, 4);
        assert_eq!(a, b);
        assert!(a.block_scales.iter().all(|s| {
            let v = crate::formats::e4m3::decode(*s);
            (0.25..=7.5).contains(&v)
        }));
    }
}
