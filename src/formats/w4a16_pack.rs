//! Offline repacking of ModelOpt NVFP4 weights into the layout of rigbench's W4A16 kernel
//! (`kernels/w4a16.cu`), and a bit-exact CPU emulation of the kernel's per-warp arithmetic.
//!
//! # The kernel's view
//! The kernel computes `Cᵀ[N, M] = W[N, K] · Aᵀ[K, M]` with `mma.sync.m16n8k16` BF16 (FP32
//! accumulate), weights in the MMA's A slot (16 rows of N) and tokens in the B slot (8 columns).
//! A warp owns a 16-row strip of W and walks K in tiles of 64. Lane `l = 4g + t` (g = 0..7,
//! t = 0..3) holds, per k16 step `j`, the A fragment rows `g` and `g+8` at MMA k-positions
//! `{2t, 2t+1, 2t+8, 2t+9}` (PTX ISA, "Matrix Fragments for mma.m16n8k16"). rigbench permutes K
//! inside each 64-wide tile so that those positions of step `j` hold the actual k offsets
//! `16t + 4j + {0, 1, 2, 3}`: over the 4 steps, lane `(g, t)` then sees exactly two whole NVFP4
//! blocks (rows g and g+8, block `4·kt + t`), one 16-byte load of packed codes and two scales.
//! The activations use the same permutation, so lane `(g, t)` reads 32 contiguous bytes of token
//! `g`'s row. The sum over K is unchanged by the permutation.
//!
//! # Bits
//! Each 32-bit word of a lane's 16-byte load is one k16 step: the four MMA A registers R0..R3
//! (R0 = row g offsets 4j+0/4j+1, R1 = row g+8 offsets 4j+0/4j+1, R2 = row g 4j+2/4j+3,
//! R3 = row g+8 4j+2/4j+3; low half first). The eight E2M1 codes are scattered so that each
//! register costs one or two integer ops: with `M = 0x81C081C0` (BF16 sign bits 15/31 and the top
//! exponent/mantissa bits 8..6 / 24..22), R0 = `q & M`, R1 = `rotl(q,4) & M`,
//! R2 = `rotl(q,10) & M`, R3 = `(rotl(q,6) & 0x00400040) | (rotl(q,14) & 0x81808180)`.
//! Placing an E2M1 code's sign at bit 15 and its three magnitude bits at 8..6 of a BF16 gives
//! exactly `value · 2⁻¹²⁶` (normal and subnormal codes alike; the trick vLLM's Marlin FP4
//! dequantizer uses). The block scale is re-encoded offline as an 8-bit unsigned E5M3 code `c`
//! whose BF16 image `0x7000 | c << 4` equals `scale · 2¹¹⁹`, so one BF16 multiply gives
//! `value · scale · 2⁻⁷` exactly (≤ 6 significant bits, no rounding); the FP32 epilogue
//! multiplies by `weight_scale_2 · 2⁷`.
//!
//! # Layout
//! - weights: `[strips = N_pad/16][KT = K_pad/64][32 lanes]` × 16 bytes;
//! - scales: `[strips][KT/2][32 lanes]` × 4 bytes: `[c(g, kt even), c(g+8, kt even),
//!   c(g, kt odd), c(g+8, kt odd)]` for block `4·kt + t`;
//! - `K_pad` is K rounded up to 128 and `N_pad` is N rounded up to 16, padded with zero codes.

use super::nvfp4::{Nvfp4Weight, NVFP4_BLOCK};
use super::{e4m3, FormatError};

/// The BF16 bits kept by each register's mask: sign and the 3 magnitude bits of two values.
pub const REG_MASK: u32 = 0x81C0_81C0;
/// Rotations (left) that bring R1 and R2 into place.
pub const ROT_R1: u32 = 4;
/// See [`ROT_R1`].
pub const ROT_R2: u32 = 10;
/// R3 is assembled from two rotations: bits in [`R3_MASK_A`] from `rotl(q, ROT_R3A)`, the rest
/// of [`REG_MASK`] from `rotl(q, ROT_R3B)`.
pub const ROT_R3A: u32 = 6;
/// See [`ROT_R3A`].
pub const ROT_R3B: u32 = 14;
/// See [`ROT_R3A`].
pub const R3_MASK_A: u32 = 0x0040_0040;
/// See [`ROT_R3A`].
pub const R3_MASK_B: u32 = REG_MASK & !R3_MASK_A;
/// Bits of a BF16 pair the scale code occupies above (`0x7000` in each half): exponent field
/// 224 + E5.
pub const SCALE_BF16_BASE: u32 = 0x7000_7000;
/// E5M3 exponent bias of the re-encoded block scale (`scale = 2^(E5 − 22) · (1 + m/8)`).
pub const SCALE_E5_BIAS: i32 = 22;
/// The FP32 epilogue factor beyond `weight_scale_2`: the kernel's weights carry `2⁻⁷`.
pub const EPILOGUE_POW2: f32 = 128.0;

/// Weights in the kernel layout.
#[derive(Debug, Clone, PartialEq)]
pub struct W4a16Packed {
    /// Rows (N) of the original weight.
    pub n: usize,
    /// Columns (K) of the original weight.
    pub k: usize,
    /// N rounded up to 16.
    pub n_pad: usize,
    /// K rounded up to 128.
    pub k_pad: usize,
    /// Packed codes, `n_pad · k_pad / 2` bytes in the layout above.
    pub weights: Vec<u8>,
    /// Re-encoded block scales, `n_pad · k_pad / 16` bytes in the layout above.
    pub scales: Vec<u8>,
    /// FP32 factor for the epilogue: `weight_scale_2 · 2⁷`.
    pub out_scale: f32,
}

impl W4a16Packed {
    /// Row strips of 16.
    pub fn strips(&self) -> usize {
        self.n_pad / 16
    }
    /// K tiles of 64.
    pub fn k_tiles(&self) -> usize {
        self.k_pad / 64
    }
}

/// Target BF16-pair bit positions of register `r` (0..4): `[lo sign, lo e1, lo e0, lo m,
/// hi sign, hi e1, hi e0, hi m]`.
const TARGETS: [u32; 8] = [15, 8, 7, 6, 31, 24, 23, 22];

/// Where the kernel's extraction for register `reg` reads target bit `target` from.
fn stored_position(reg: usize, target: u32) -> u32 {
    let rot = match reg {
        0 => 0,
        1 => ROT_R1,
        2 => ROT_R2,
        _ => {
            if R3_MASK_A & (1 << target) != 0 {
                ROT_R3A
            } else {
                ROT_R3B
            }
        }
    };
    (target + 32 - rot) % 32
}

/// For each of the 8 value slots of a step word (register r, half h → slot 2r + h) and each
/// 4-bit code, the bits that code sets in the word.
fn slot_lut() -> [[u32; 16]; 8] {
    let mut lut = [[0u32; 16]; 8];
    for (slot, row) in lut.iter_mut().enumerate() {
        for (code, v) in row.iter_mut().enumerate() {
            let mut codes = [[0u8; 2]; 4];
            codes[slot / 2][slot % 2] = code as u8;
            *v = encode_step_word(codes);
        }
    }
    lut
}

/// [`slot_lut`] flattened to `[slot · 16 + code]`: the table the GPU repacking kernel
/// (`rt_w4a16_repack` in kernels/runtime.cu) reads.
pub fn slot_lut_flat() -> Vec<u32> {
    slot_lut().iter().flatten().copied().collect()
}

/// Scatter the 8 codes of one k16 step into a 32-bit word. `codes[r][0]` is register r's low
/// value, `codes[r][1]` its high value (4-bit E2M1 codes).
pub fn encode_step_word(codes: [[u8; 2]; 4]) -> u32 {
    let mut q = 0u32;
    for (r, pair) in codes.iter().enumerate() {
        for (half, code) in pair.iter().enumerate() {
            let bits = [(code >> 3) & 1, (code >> 2) & 1, (code >> 1) & 1, code & 1];
            for (i, b) in bits.iter().enumerate() {
                if *b != 0 {
                    q |= 1 << stored_position(r, TARGETS[half * 4 + i]);
                }
            }
        }
    }
    q
}

/// The kernel's extraction of register `r` from a step word (bit-exact mirror of the CUDA code):
/// a BF16 pair holding `value · 2⁻¹²⁶` for its two codes.
pub fn extract_reg(q: u32, r: usize) -> u32 {
    match r {
        0 => q & REG_MASK,
        1 => q.rotate_left(ROT_R1) & REG_MASK,
        2 => q.rotate_left(ROT_R2) & REG_MASK,
        _ => (q.rotate_left(ROT_R3A) & R3_MASK_A) | (q.rotate_left(ROT_R3B) & R3_MASK_B),
    }
}

/// Re-encode a non-negative, finite, non-zero E4M3 block scale as the kernel's E5M3 code.
///
/// # Errors
/// [`FormatError::InvalidScale`] for NaN, negative or zero scales (callers handle zero and
/// negative scales before this).
pub fn scale_code(e4m3_byte: u8) -> Result<u8, FormatError> {
    let s = e4m3::decode(e4m3_byte);
    if s.is_nan() || s <= 0.0 {
        return Err(FormatError::InvalidScale(format!(
            "block scale {s} (E4M3 {e4m3_byte:#04x}) cannot be re-encoded"
        )));
    }
    let e = s.log2().floor() as i32;
    let m = (s / 2f32.powi(e) - 1.0) * 8.0;
    debug_assert!(m.fract() == 0.0 && (0.0..8.0).contains(&m));
    let e5 = e + SCALE_E5_BIAS;
    debug_assert!((1..=30).contains(&e5));
    Ok(((e5 as u8) << 3) | m as u8)
}

/// The BF16 bits of a scale code as the kernel builds them: `0x7000 | code << 4`.
pub fn scale_bf16_bits(code: u8) -> u16 {
    0x7000 | ((code as u16) << 4)
}

/// Repack a ModelOpt NVFP4 weight into the kernel layout.
///
/// Zero block scales zero their block's codes (the block is zero whatever its codes say);
/// negative block scales are folded into the codes' sign bits.
///
/// # Errors
/// [`FormatError::InvalidScale`] for a NaN block scale or a non-positive/non-finite
/// `global_scale`.
pub fn repack(w: &Nvfp4Weight) -> Result<W4a16Packed, FormatError> {
    if !(w.global_scale > 0.0 && w.global_scale.is_finite()) {
        return Err(FormatError::InvalidScale(format!(
            "weight_scale_2 = {}; expected a positive finite value",
            w.global_scale
        )));
    }
    let n_pad = w.n.div_ceil(16) * 16;
    let k_pad = w.k.div_ceil(128) * 128;
    let strips = n_pad / 16;
    let kt_n = k_pad / 64;
    let bpr = w.k / NVFP4_BLOCK;
    let one = e4m3::encode(1.0);
    // (code adjustment, scale code) for block (row, b): zero → codes forced to 0; negative →
    // sign flipped.
    let block_info = |row: usize, b: usize| -> Result<(bool, bool, u8), FormatError> {
        if row >= w.n || b >= bpr {
            return Ok((true, false, scale_code(one)?));
        }
        let byte = w.block_scales[row * bpr + b];
        let s = e4m3::decode(byte);
        if s.is_nan() {
            return Err(FormatError::InvalidScale(format!(
                "NaN block scale at row {row}, block {b}"
            )));
        }
        if s == 0.0 {
            return Ok((true, false, scale_code(one)?));
        }
        Ok((false, s < 0.0, scale_code(byte & 0x7F)?))
    };
    let code_at = |row: usize, col: usize, zero: bool, neg: bool| -> u8 {
        if zero || row >= w.n || col >= w.k {
            return 0;
        }
        let c = w.code(row, col);
        if neg {
            c ^ 0x8
        } else {
            c
        }
    };
    let mut weights = vec![0u8; n_pad * k_pad / 2];
    let mut scales = vec![0u8; n_pad * k_pad / 16];
    let lut = slot_lut();
    let w_strip = kt_n * 32 * 16;
    let s_strip = (kt_n / 2) * 32 * 4;
    // One strip's worth of output for strip `strip`.
    let do_strip = |strip: usize, wout: &mut [u8], sout: &mut [u8]| -> Result<(), FormatError> {
        for kt in 0..kt_n {
            for lane in 0..32 {
                let (g, t) = (lane / 4, lane % 4);
                let (r_lo, r_hi) = (strip * 16 + g, strip * 16 + g + 8);
                let b = 4 * kt + t;
                let (z_lo, n_lo, c_lo) = block_info(r_lo, b)?;
                let (z_hi, n_hi, c_hi) = block_info(r_hi, b)?;
                let base = (kt * 32 + lane) * 16;
                for j in 0..4 {
                    let k0 = 16 * b + 4 * j;
                    let codes = [
                        [
                            code_at(r_lo, k0, z_lo, n_lo),
                            code_at(r_lo, k0 + 1, z_lo, n_lo),
                        ],
                        [
                            code_at(r_hi, k0, z_hi, n_hi),
                            code_at(r_hi, k0 + 1, z_hi, n_hi),
                        ],
                        [
                            code_at(r_lo, k0 + 2, z_lo, n_lo),
                            code_at(r_lo, k0 + 3, z_lo, n_lo),
                        ],
                        [
                            code_at(r_hi, k0 + 2, z_hi, n_hi),
                            code_at(r_hi, k0 + 3, z_hi, n_hi),
                        ],
                    ];
                    let mut word = 0u32;
                    for (r, pair) in codes.iter().enumerate() {
                        word |= lut[r * 2][pair[0] as usize] | lut[r * 2 + 1][pair[1] as usize];
                    }
                    wout[base + 4 * j..base + 4 * j + 4].copy_from_slice(&word.to_le_bytes());
                }
                let sbase = ((kt / 2) * 32 + lane) * 4 + (kt % 2) * 2;
                sout[sbase] = c_lo;
                sout[sbase + 1] = c_hi;
            }
        }
        Ok(())
    };
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 32);
    let per = strips.div_ceil(threads).max(1);
    let results: Vec<Result<(), FormatError>> = std::thread::scope(|sc| {
        let handles: Vec<_> = weights
            .chunks_mut(per * w_strip)
            .zip(scales.chunks_mut(per * s_strip))
            .enumerate()
            .map(|(ci, (wc, scc))| {
                let do_strip = &do_strip;
                sc.spawn(move || {
                    for (i, (w1, s1)) in wc
                        .chunks_mut(w_strip)
                        .zip(scc.chunks_mut(s_strip))
                        .enumerate()
                    {
                        do_strip(ci * per + i, w1, s1)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(FormatError::Shape("repack thread panicked".into())))
            })
            .collect()
    });
    for r in results {
        r?;
    }
    Ok(W4a16Packed {
        n: w.n,
        k: w.k,
        n_pad,
        k_pad,
        weights,
        scales,
        out_scale: w.global_scale * EPILOGUE_POW2,
    })
}

/// BF16 multiply of two BF16 bit patterns, as `mul.rn.bf16` (round to nearest even; exact for
/// the products the kernel forms).
fn bf16_mul(a: u16, b: u16) -> f32 {
    let x = half::bf16::from_bits(a).to_f32() * half::bf16::from_bits(b).to_f32();
    half::bf16::from_f32(x).to_f32()
}

/// Emulate one warp of the kernel on one (strip, k-tile): returns the 16 × `tokens` partial
/// products `Σ_k w'[n][k] · a[m][k]` (with w' = value · scale · 2⁻⁷, BF16) as the MMAs compute
/// them, indexed `[row][token]`. `act` is row-major `[tokens, k_pad]` (f32 holding BF16 values).
/// Used by the tests to check the layout, permutation and bit tricks against the reference.
pub fn emulate_warp_tile(
    p: &W4a16Packed,
    strip: usize,
    kt: usize,
    act: &[f32],
    tokens: usize,
) -> Vec<Vec<f64>> {
    let kt_n = p.k_tiles();
    let mut out = vec![vec![0f64; tokens]; 16];
    for lane in 0..32 {
        let (g, t) = (lane / 4, lane % 4);
        let base = ((strip * kt_n + kt) * 32 + lane) * 16;
        let sbase = ((strip * (kt_n / 2) + kt / 2) * 32 + lane) * 4 + (kt % 2) * 2;
        let s_lo = scale_bf16_bits(p.scales[sbase]);
        let s_hi = scale_bf16_bits(p.scales[sbase + 1]);
        for j in 0..4 {
            let q = u32::from_le_bytes(
                p.weights[base + 4 * j..base + 4 * j + 4]
                    .try_into()
                    .unwrap(),
            );
            for r in 0..4 {
                let pair = extract_reg(q, r);
                let (row, scale) = if r % 2 == 0 { (g, s_lo) } else { (g + 8, s_hi) };
                let off = 16 * t + 4 * j + if r < 2 { 0 } else { 2 };
                for half in 0..2 {
                    let bits = (pair >> (16 * half)) as u16;
                    let w = bf16_mul(bits, scale) as f64;
                    let k = 64 * kt + off + half;
                    for (m, o) in out[row].iter_mut().enumerate() {
                        *o += w * act[m * p.k_pad + k] as f64;
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;
    use crate::formats::{e2m1, nvfp4};

    #[test]
    fn stored_positions_are_a_permutation_of_32_bits() {
        let mut seen = [false; 32];
        for r in 0..4 {
            for t in TARGETS {
                let p = stored_position(r, t) as usize;
                assert!(!seen[p], "bit {p} used twice");
                seen[p] = true;
            }
        }
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn every_code_in_every_slot_decodes_to_value_times_2_pow_minus_126() {
        for r in 0..4 {
            for half in 0..2 {
                for code in 0u8..16 {
                    let mut codes = [[0u8; 2]; 4];
                    codes[r][half] = code;
                    // Fill the other slots with other codes: extraction must ignore them.
                    for (rr, pair) in codes.iter_mut().enumerate() {
                        for (hh, c) in pair.iter_mut().enumerate() {
                            if (rr, hh) != (r, half) {
                                *c = ((rr * 2 + hh + 5) % 16) as u8;
                            }
                        }
                    }
                    let q = encode_step_word(codes);
                    for rr in 0..4 {
                        let pair = extract_reg(q, rr);
                        for hh in 0..2 {
                            let bits = (pair >> (16 * hh)) as u16;
                            let got = half::bf16::from_bits(bits).to_f64();
                            let want = e2m1::decode(codes[rr][hh]) as f64 * 2f64.powi(-126);
                            assert_eq!(got, want, "reg {rr} half {hh} code {:#x}", codes[rr][hh]);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn scale_codes_give_scale_times_2_pow_119_for_every_positive_e4m3() {
        for b in 1u8..0x7F {
            let s = e4m3::decode(b) as f64;
            let code = scale_code(b).unwrap();
            let v = half::bf16::from_bits(scale_bf16_bits(code)).to_f64();
            assert_eq!(v, s * 2f64.powi(119), "e4m3 {b:#x}");
        }
        assert!(scale_code(0).is_err());
        assert!(scale_code(0x7F).is_err());
        assert!(scale_code(0xB8).is_err(), "negative");
    }

    fn seeded(seed: u32, n: usize) -> Vec<f32> {
        crate::formats::test_uniform(seed, n)
    }

    fn check_emulation(n: usize, k: usize, tokens: usize) {
        let w = nvfp4::quantize(&seeded(11, n * k), n, k).unwrap();
        let p = repack(&w).unwrap();
        assert_eq!(p.weights.len(), p.n_pad * p.k_pad / 2);
        assert_eq!(p.scales.len(), p.n_pad * p.k_pad / 16);
        let a_raw = seeded(5, tokens * k);
        let mut act = vec![0f32; tokens * p.k_pad];
        for m in 0..tokens {
            for kk in 0..k {
                act[m * p.k_pad + kk] = crate::formats::bf16_round(a_raw[m * k + kk]);
            }
        }
        for strip in 0..p.strips() {
            let mut acc = vec![vec![0f64; tokens]; 16];
            for kt in 0..p.k_tiles() {
                let part = emulate_warp_tile(&p, strip, kt, &act, tokens);
                for r in 0..16 {
                    for m in 0..tokens {
                        acc[r][m] += part[r][m];
                    }
                }
            }
            for r in 0..16 {
                let row = strip * 16 + r;
                for m in 0..tokens {
                    let got = acc[r][m] * p.out_scale as f64;
                    if row >= n {
                        assert_eq!(got, 0.0, "padding rows are zero");
                        continue;
                    }
                    let want: f64 = (0..k)
                        .map(|kk| w.value_f64(row, kk) * act[m * p.k_pad + kk] as f64)
                        .sum();
                    assert!(
                        (got - want).abs() <= 1e-9 * (1.0 + want.abs()),
                        "row {row} token {m}: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn emulated_kernel_matches_reference_gemm() {
        check_emulation(32, 128, 3);
    }

    #[test]
    fn emulated_kernel_handles_padding_in_n_and_k() {
        // N = 24 (not a multiple of 16), K = 80 (not a multiple of 128).
        check_emulation(24, 80, 2);
    }

    #[test]
    fn zero_and_negative_block_scales() {
        let (n, k) = (16, 128);
        let mut w = nvfp4::quantize(&seeded(3, n * k), n, k).unwrap();
        w.block_scales[0] = 0x00; // zero scale: block 0 of row 0 is zero
        w.block_scales[1] |= 0x80; // negative scale on block 1 of row 0
        let p = repack(&w).unwrap();
        let mut act = vec![0f32; p.k_pad];
        for (i, a) in act.iter_mut().enumerate().take(k) {
            *a = crate::formats::bf16_round(((i * 7 % 13) as f32 - 6.0) / 6.0);
        }
        let mut acc = 0f64;
        for kt in 0..p.k_tiles() {
            acc += emulate_warp_tile(&p, 0, kt, &act, 1)[0][0];
        }
        let want: f64 = (0..k).map(|i| w.value_f64(0, i) * act[i] as f64).sum();
        assert!((acc * p.out_scale as f64 - want).abs() < 1e-9 * (1.0 + want.abs()));
        let mut bad = w.clone();
        bad.block_scales[2] = 0x7F;
        assert!(repack(&bad).is_err());
    }
}
