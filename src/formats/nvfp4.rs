//! NVFP4: E2M1 elements in blocks of 16 along K, one E4M3 scale per block, one FP32 scale per
//! tensor.
//!
//! Layout (NVIDIA ModelOpt export, as read by vLLM's `ModelOptNvFp4LinearMethod`), for a weight
//! of N rows (output features) and K columns (input features), row-major with K contiguous:
//! - `weight`: uint8 `[N, K/2]`; byte `j` of row `n` holds element `2j` in its low nibble and
//!   element `2j+1` in its high nibble;
//! - `weight_scale`: F8_E4M3 `[N, K/16]`, the block scales;
//! - `weight_scale_2`: F32 scalar, the per-tensor scale;
//! - dequantized value = `e2m1(code) · e4m3(weight_scale[n, k/16]) · weight_scale_2`.
//!
//! Quantization math (ModelOpt `NVFP4QTensor`): `weight_scale_2 = amax(|W|) / (6 · 448)`;
//! per block, `scale = amax(|block|) / (6 · weight_scale_2)`, a zero scale replaced by 1.0, then
//! cast to E4M3 (saturating, round to nearest even); elements `W / (e4m3(scale) · weight_scale_2)`
//! rounded to E2M1 (nearest, ties to even, saturating at 6).
//!
//! compressed-tensors (`nvfp4-pack-quantized`) stores the same codes and block scales as
//! `weight_packed` / `weight_scale`, but its `weight_global_scale` is the reciprocal,
//! `(6 · 448) / amax`: see [`global_scale_from_compressed_tensors`].

use super::{e2m1, e4m3, FormatError};

/// Elements per NVFP4 block (along K).
pub const NVFP4_BLOCK: usize = 16;

/// A weight matrix `[n, k]` in the ModelOpt NVFP4 layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Nvfp4Weight {
    /// Rows (output features).
    pub n: usize,
    /// Columns (input features), a multiple of 16.
    pub k: usize,
    /// Packed E2M1 codes, `[n, k/2]`, low nibble = even k.
    pub packed: Vec<u8>,
    /// E4M3 block scales, `[n, k/16]`.
    pub block_scales: Vec<u8>,
    /// FP32 per-tensor scale (`weight_scale_2`).
    pub global_scale: f32,
}

/// Per-tensor scale from a tensor's absolute maximum: `amax / (6 · 448)`; 1.0 for an all-zero
/// tensor (any value encodes zeros exactly).
pub fn global_scale_from_amax(amax: f32) -> f32 {
    if amax > 0.0 && amax.is_finite() {
        amax / (e2m1::E2M1_MAX * e4m3::E4M3_MAX)
    } else {
        1.0
    }
}

/// Convert compressed-tensors' `weight_global_scale` (`(6·448)/amax`) to ModelOpt's
/// `weight_scale_2` (`amax/(6·448)`).
///
/// # Errors
/// [`FormatError::InvalidScale`] when the value is zero, negative or not finite.
pub fn global_scale_from_compressed_tensors(weight_global_scale: f32) -> Result<f32, FormatError> {
    if weight_global_scale > 0.0 && weight_global_scale.is_finite() {
        Ok(1.0 / weight_global_scale)
    } else {
        Err(FormatError::InvalidScale(format!(
            "compressed-tensors weight_global_scale = {weight_global_scale}; expected a positive finite value"
        )))
    }
}

/// Quantize a row-major `[n, k]` f32 matrix to NVFP4 with ModelOpt's math.
///
/// # Errors
/// [`FormatError::Shape`] when `data.len() != n·k` or `k` is not a multiple of 16.
pub fn quantize(data: &[f32], n: usize, k: usize) -> Result<Nvfp4Weight, FormatError> {
    check_shape(data.len(), n, k)?;
    let amax = data.iter().fold(0f32, |m, v| m.max(v.abs()));
    quantize_with_global_scale(data, n, k, global_scale_from_amax(amax))
}

/// Quantize with a given per-tensor scale (e.g. one calibrated elsewhere).
///
/// # Errors
/// [`FormatError::Shape`] as [`quantize`]; [`FormatError::InvalidScale`] for a non-positive or
/// non-finite `global_scale`.
pub fn quantize_with_global_scale(
    data: &[f32],
    n: usize,
    k: usize,
    global_scale: f32,
) -> Result<Nvfp4Weight, FormatError> {
    check_shape(data.len(), n, k)?;
    if !(global_scale > 0.0 && global_scale.is_finite()) {
        return Err(FormatError::InvalidScale(format!(
            "NVFP4 per-tensor scale {global_scale}; expected a positive finite value"
        )));
    }
    let blocks_per_row = k / NVFP4_BLOCK;
    let mut packed = vec![0u8; n * k / 2];
    let mut block_scales = vec![0u8; n * blocks_per_row];
    for row in 0..n {
        for b in 0..blocks_per_row {
            let start = row * k + b * NVFP4_BLOCK;
            let block = &data[start..start + NVFP4_BLOCK];
            let bamax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            let mut scale = bamax / (e2m1::E2M1_MAX * global_scale);
            if scale == 0.0 {
                scale = 1.0;
            }
            let scale_code = e4m3::encode(scale);
            block_scales[row * blocks_per_row + b] = scale_code;
            let mut denom = e4m3::decode(scale_code) * global_scale;
            if denom == 0.0 {
                // A block scale that underflows E4M3 to zero: the elements are negligible next
                // to amax; encode them against the smallest subnormal rather than divide by 0.
                denom = e4m3::decode(0x01) * global_scale;
            }
            for (j, pair) in block.chunks_exact(2).enumerate() {
                let lo = e2m1::encode(pair[0] / denom);
                let hi = e2m1::encode(pair[1] / denom);
                packed[start / 2 + j] = lo | (hi << 4);
            }
        }
    }
    Ok(Nvfp4Weight {
        n,
        k,
        packed,
        block_scales,
        global_scale,
    })
}

impl Nvfp4Weight {
    /// Build from raw tensors (as read from a checkpoint), checking their sizes.
    ///
    /// # Errors
    /// [`FormatError::Shape`] when `packed` is not `n·k/2` bytes, `block_scales` not `n·k/16`, or
    /// `k` not a multiple of 16.
    pub fn from_parts(
        n: usize,
        k: usize,
        packed: Vec<u8>,
        block_scales: Vec<u8>,
        global_scale: f32,
    ) -> Result<Self, FormatError> {
        if k % NVFP4_BLOCK != 0 {
            return Err(FormatError::Shape(format!(
                "NVFP4 K = {k} is not a multiple of the block size {NVFP4_BLOCK}"
            )));
        }
        if packed.len() != n * k / 2 {
            return Err(FormatError::Shape(format!(
                "NVFP4 packed weight has {} bytes; [N, K/2] = [{n}, {}] needs {}",
                packed.len(),
                k / 2,
                n * k / 2
            )));
        }
        if block_scales.len() != n * k / NVFP4_BLOCK {
            return Err(FormatError::Shape(format!(
                "NVFP4 block scales have {} entries; [N, K/16] = [{n}, {}] needs {}",
                block_scales.len(),
                k / NVFP4_BLOCK,
                n * k / NVFP4_BLOCK
            )));
        }
        Ok(Self {
            n,
            k,
            packed,
            block_scales,
            global_scale,
        })
    }

    /// The E2M1 code of element `(row, col)`.
    #[inline]
    pub fn code(&self, row: usize, col: usize) -> u8 {
        let byte = self.packed[(row * self.k + col) / 2];
        if col % 2 == 0 {
            byte & 0xF
        } else {
            byte >> 4
        }
    }

    /// The dequantized value of element `(row, col)`.
    #[inline]
    pub fn get(&self, row: usize, col: usize) -> f32 {
        let s = e4m3::decode(self.block_scales[row * (self.k / NVFP4_BLOCK) + col / NVFP4_BLOCK])
            * self.global_scale;
        e2m1::decode(self.code(row, col)) * s
    }

    /// The dequantized value of element `(row, col)` computed exactly in f64
    /// (`e2m1 · e4m3 · weight_scale_2` has at most 2 + 4 + 24 significant bits): the reference the
    /// kernel checks use.
    #[inline]
    pub fn value_f64(&self, row: usize, col: usize) -> f64 {
        let s = e4m3::decode(self.block_scales[row * (self.k / NVFP4_BLOCK) + col / NVFP4_BLOCK])
            as f64;
        e2m1::decode(self.code(row, col)) as f64 * s * self.global_scale as f64
    }

    /// Dequantize to a row-major `[n, k]` f32 matrix.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.n * self.k);
        for row in 0..self.n {
            self.dequantize_row_into(row, &mut out);
        }
        out
    }

    /// Append the dequantized row `row` (`k` values) to `out`.
    pub fn dequantize_row_into(&self, row: usize, out: &mut Vec<f32>) {
        let bpr = self.k / NVFP4_BLOCK;
        for b in 0..bpr {
            let s = e4m3::decode(self.block_scales[row * bpr + b]) * self.global_scale;
            let base = (row * self.k + b * NVFP4_BLOCK) / 2;
            for byte in &self.packed[base..base + NVFP4_BLOCK / 2] {
                out.push(e2m1::decode(byte & 0xF) * s);
                out.push(e2m1::decode(byte >> 4) * s);
            }
        }
    }

    /// Bytes the kernel streams for this weight: packed codes + block scales + the FP32 scale.
    pub fn stream_bytes(&self) -> usize {
        self.packed.len() + self.block_scales.len() + 4
    }
}

fn check_shape(len: usize, n: usize, k: usize) -> Result<(), FormatError> {
    if len != n * k {
        return Err(FormatError::Shape(format!(
            "matrix has {len} values; [N, K] = [{n}, {k}] needs {}",
            n * k
        )));
    }
    if k % NVFP4_BLOCK != 0 {
        return Err(FormatError::Shape(format!(
            "NVFP4 needs K to be a multiple of {NVFP4_BLOCK}; K = {k}"
        )));
    }
    Ok(())
}

/// Pack a sequence of E2M1 codes (even length) two per byte, low nibble first.
///
/// # Errors
/// [`FormatError::Shape`] on an odd number of codes.
pub fn pack_codes(codes: &[u8]) -> Result<Vec<u8>, FormatError> {
    if codes.len() % 2 != 0 {
        return Err(FormatError::Shape(format!(
            "cannot pack an odd number ({}) of 4-bit codes",
            codes.len()
        )));
    }
    Ok(codes
        .chunks_exact(2)
        .map(|p| (p[0] & 0xF) | ((p[1] & 0xF) << 4))
        .collect())
}

/// Unpack bytes into E2M1 codes, low nibble first (inverse of [`pack_codes`]).
pub fn unpack_codes(packed: &[u8]) -> Vec<u8> {
    packed.iter().flat_map(|b| [b & 0xF, b >> 4]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: u32, n: usize) -> Vec<f32> {
        crate::formats::test_uniform(seed, n)
    }

    #[test]
    fn pack_unpack_roundtrip_and_nibble_order() {
        let codes: Vec<u8> = (0..32).map(|i| (i % 16) as u8).collect();
        let packed = pack_codes(&codes).unwrap();
        assert_eq!(
            packed[0], 0x10,
            "element 0 in the low nibble, element 1 in the high"
        );
        assert_eq!(packed[1], 0x32);
        assert_eq!(unpack_codes(&packed), codes);
        assert!(pack_codes(&[1, 2, 3]).is_err());
    }

    #[test]
    fn modelopt_scale_math_on_a_hand_block() {
        // One row, one block: amax 6 → global scale 6/(6·448) = 1/448; block scale
        // 6/(6·(1/448)) = 448 → E4M3 448 exactly; denominator 448·(1/448) = 1: codes are the
        // E2M1 encodings of the values themselves.
        let vals = [
            0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -1.0, -6.0, 0.25, 0.75, 2.5, 5.0, -3.5,
        ];
        let q = quantize(&vals, 1, 16).unwrap();
        assert_eq!(q.global_scale, 6.0 / (6.0 * 448.0));
        assert_eq!(q.block_scales, vec![0x7E]);
        let expect_codes: Vec<u8> = vals.iter().map(|v| e2m1::encode(*v)).collect();
        assert_eq!(unpack_codes(&q.packed), expect_codes);
        let deq = q.dequantize();
        for (d, v) in deq.iter().zip(vals) {
            assert!((d - e2m1::decode(e2m1::encode(v))).abs() < 1e-6);
        }
    }

    #[test]
    fn quantization_error_is_bounded() {
        let (n, k) = (8, 64);
        let w = lcg(7, n * k);
        let q = quantize(&w, n, k).unwrap();
        let d = q.dequantize();
        // Each element is within half an E2M1 step of the block's scale (≤ 1 unit at the top),
        // plus the E4M3 scale rounding (≤ 1/16 relative): bound |err| ≤ block_amax/6 · 1.0625.
        for row in 0..n {
            for b in 0..k / 16 {
                let idx = row * k + b * 16;
                let bamax = w[idx..idx + 16].iter().fold(0f32, |m, v| m.max(v.abs()));
                for i in idx..idx + 16 {
                    assert!((w[i] - d[i]).abs() <= bamax / 6.0 * 1.0625 + 1e-6);
                }
            }
        }
        let num: f32 = w.iter().zip(&d).map(|(a, b)| (a - b) * (a - b)).sum();
        let den: f32 = w.iter().map(|a| a * a).sum();
        let rel = (num / den).sqrt();
        assert!(rel < 0.12, "relative L2 error {rel}");
        assert!(
            rel > 0.01,
            "NVFP4 cannot be near-lossless on uniform data: {rel}"
        );
    }

    #[test]
    fn zero_tensor_and_zero_blocks() {
        let q = quantize(&[0.0; 32], 1, 32).unwrap();
        assert_eq!(q.global_scale, 1.0);
        assert!(q.dequantize().iter().all(|v| *v == 0.0));
        let mut v = vec![0.0f32; 32];
        v[20] = 3.0;
        let q = quantize(&v, 1, 32).unwrap();
        assert_eq!(
            e4m3::decode(q.block_scales[0]),
            1.0,
            "zero block scale becomes 1.0"
        );
        let d = q.dequantize();
        assert!((d[20] - 3.0).abs() < 1e-5);
        assert_eq!(d.iter().filter(|x| **x != 0.0).count(), 1);
    }

    #[test]
    fn get_matches_dequantize() {
        let (n, k) = (3, 48);
        let q = quantize(&lcg(3, n * k), n, k).unwrap();
        let d = q.dequantize();
        for r in 0..n {
            for c in 0..k {
                assert_eq!(q.get(r, c), d[r * k + c]);
            }
        }
    }

    #[test]
    fn shape_errors() {
        assert!(quantize(&[0.0; 24], 1, 24).is_err());
        assert!(quantize(&[0.0; 31], 1, 32).is_err());
        assert!(Nvfp4Weight::from_parts(2, 32, vec![0; 31], vec![0; 4], 1.0).is_err());
        assert!(Nvfp4Weight::from_parts(2, 32, vec![0; 32], vec![0; 3], 1.0).is_err());
        assert!(Nvfp4Weight::from_parts(2, 32, vec![0; 32], vec![0; 4], 1.0).is_ok());
        assert!(quantize_with_global_scale(&[0.0; 16], 1, 16, 0.0).is_err());
    }

    #[test]
    fn compressed_tensors_global_scale_is_reciprocal() {
        let amax = 3.0f32;
        let ct = 6.0 * 448.0 / amax;
        let ms = global_scale_from_compressed_tensors(ct).unwrap();
        assert!((ms - global_scale_from_amax(amax)).abs() < 1e-9);
        assert!(global_scale_from_compressed_tensors(0.0).is_err());
    }
}

/// Byte offset of block scale `(row, kb)` in the interleaved layout cuBLASLt reads for
/// `CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3` (NVIDIA cuBLAS docs, "1D Block Scaling Factors
/// Layout"; the same as vLLM's `swizzle_blockscale`): the `[rows, K/16]` scale matrix is padded to
/// multiples of 128 rows and 4 columns and cut into 128×4 tiles of 512 bytes, tiles in row-major
/// order; inside a tile, element `(r, c)` sits at `(r % 32)·16 + (r / 32)·4 + c`.
/// `kb_padded` is `K/16` rounded up to 4.
pub fn swizzled_scale_offset(row: usize, kb: usize, kb_padded: usize) -> usize {
    let tile = (row / 128) * (kb_padded / 4) + kb / 4;
    tile * 512 + (row % 32) * 16 + ((row / 32) % 4) * 4 + (kb % 4)
}

/// Block scales `[rows, k_blocks]` (row-major, E4M3 bytes) in cuBLASLt's interleaved layout, padded
/// with zero bytes to `round_up(rows, 128) × round_up(k_blocks, 4)` (see
/// [`swizzled_scale_offset`]).
///
/// # Errors
/// [`FormatError::Shape`] when `scales.len() != rows · k_blocks`.
pub fn swizzle_block_scales(
    scales: &[u8],
    rows: usize,
    k_blocks: usize,
) -> Result<Vec<u8>, FormatError> {
    if scales.len() != rows * k_blocks {
        return Err(FormatError::Shape(format!(
            "{} block scales; [rows, K/16] = [{rows}, {k_blocks}] needs {}",
            scales.len(),
            rows * k_blocks
        )));
    }
    let rp = rows.div_ceil(128) * 128;
    let kp = k_blocks.div_ceil(4) * 4;
    let mut out = vec![0u8; rp * kp];
    for r in 0..rows {
        for c in 0..k_blocks {
            out[swizzled_scale_offset(r, c, kp)] = scales[r * k_blocks + c];
        }
    }
    Ok(out)
}

#[cfg(test)]
mod swizzle_tests {
    use super::*;

    /// The layout as a reshape/permute, written independently: padded `[R/128, 4, 32, Kp/4, 4]`
    /// permuted to `[R/128, Kp/4, 32, 4, 4]` (vLLM `swizzle_blockscale`).
    fn by_permutation(scales: &[u8], rows: usize, kb: usize) -> Vec<u8> {
        let rp = rows.div_ceil(128) * 128;
        let kp = kb.div_ceil(4) * 4;
        let src = |r: usize, c: usize| {
            if r < rows && c < kb {
                scales[r * kb + c]
            } else {
                0
            }
        };
        let mut out = Vec::with_capacity(rp * kp);
        for mt in 0..rp / 128 {
            for kt in 0..kp / 4 {
                for r32 in 0..32 {
                    for r4 in 0..4 {
                        for c4 in 0..4 {
                            out.push(src(mt * 128 + r4 * 32 + r32, kt * 4 + c4));
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn swizzle_matches_the_reshape_permute_definition() {
        for (rows, kb) in [(128, 4), (256, 8), (96, 320), (130, 5), (1, 1)] {
            let s: Vec<u8> = (0..rows * kb).map(|i| (i * 7 % 251) as u8 + 1).collect();
            assert_eq!(
                swizzle_block_scales(&s, rows, kb).unwrap(),
                by_permutation(&s, rows, kb),
                "{rows}×{kb}"
            );
        }
    }

    #[test]
    fn swizzle_is_a_bijection_and_pads_with_zero() {
        let (rows, kb) = (200, 6);
        let kp = 8;
        let mut seen = std::collections::HashSet::new();
        for r in 0..256 {
            for c in 0..kp {
                assert!(seen.insert(swizzled_scale_offset(r, c, kp)));
            }
        }
        assert_eq!(seen.len(), 256 * kp);
        let s = vec![9u8; rows * kb];
        let out = swizzle_block_scales(&s, rows, kb).unwrap();
        assert_eq!(out.len(), 256 * 8);
        assert_eq!(out.iter().filter(|b| **b == 9).count(), rows * kb);
        assert!(swizzle_block_scales(&s, rows, kb + 1).is_err());
        // First tile: row 33, column 2 → (33 % 32)·16 + (33 / 32)·4 + 2.
        assert_eq!(swizzled_scale_offset(33, 2, 8), 16 + 4 + 2);
        // Second tile along K.
        assert_eq!(swizzled_scale_offset(0, 4, 8), 512);
        // Second row tile.
        assert_eq!(swizzled_scale_offset(128, 0, 8), 1024);
    }
}
