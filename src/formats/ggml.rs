//! ggml tensor types (the element formats of GGUF files, llama.cpp's `ggml_type`): their ids,
//! names, block sizes, and dequantization of the common ones to f32.
//!
//! Ids, block sizes and byte sizes follow `ggml/include/ggml.h` (`enum ggml_type`) and
//! `ggml/src/ggml-common.h` (the `block_*` structs); the dequantization formulas follow
//! `dequantize_row_*` in `ggml/src/ggml-quants.c`. Every block starts a new group of
//! `block_size` consecutive elements along the innermost GGUF dimension (`ne[0]`, the K of a
//! weight), so a row of K elements is K / block_size whole blocks. All multi-byte fields are
//! little-endian; `d`/`dmin`/`m` scales are IEEE FP16 except Q8_K's FP32 `d`.
//!
//! Dequantized here: F32, F16, BF16, F64, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K,
//! Q5_K, Q6_K, Q8_K. The others (IQ*, TQ*, MXFP4, integer types) are named and sized, and
//! [`dequantize`] refuses them with their name.

use half::f16;
use serde::{Deserialize, Serialize};

/// A ggml tensor type (`enum ggml_type`). Ids 4, 5 (Q4_2, Q4_3), 31–33 (Q4_0_4_4, Q4_0_4_8,
/// Q4_0_8_8) and 36–38 (IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8) were removed from ggml; files with
/// them are refused like unknown ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[allow(non_camel_case_types, missing_docs)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// Super-block size of the k-quants and i-quants (`QK_K`).
pub const QK_K: usize = 256;

impl GgmlType {
    /// Every known type, in id order.
    pub const ALL: [GgmlType; 32] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q8_1,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::Q8_K,
        Self::IQ2_XXS,
        Self::IQ2_XS,
        Self::IQ3_XXS,
        Self::IQ1_S,
        Self::IQ4_NL,
        Self::IQ3_S,
        Self::IQ2_S,
        Self::IQ4_XS,
        Self::I8,
        Self::I16,
        Self::I32,
        Self::I64,
        Self::F64,
        Self::IQ1_M,
        Self::BF16,
        Self::TQ1_0,
        Self::TQ2_0,
        Self::MXFP4,
    ];

    /// The type of a `ggml_type` id; `None` for unknown and removed ids.
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| t.id() == id)
    }

    /// The `ggml_type` id.
    pub fn id(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2_K => 10,
            Q3_K => 11,
            Q4_K => 12,
            Q5_K => 13,
            Q6_K => 14,
            Q8_K => 15,
            IQ2_XXS => 16,
            IQ2_XS => 17,
            IQ3_XXS => 18,
            IQ1_S => 19,
            IQ4_NL => 20,
            IQ3_S => 21,
            IQ2_S => 22,
            IQ4_XS => 23,
            I8 => 24,
            I16 => 25,
            I32 => 26,
            I64 => 27,
            F64 => 28,
            IQ1_M => 29,
            BF16 => 30,
            TQ1_0 => 34,
            TQ2_0 => 35,
            MXFP4 => 39,
        }
    }

    /// The name llama.cpp prints (`ggml_type_name`): `f32`, `q4_K`, ... upper-cased as the GGUF
    /// tooling shows them (`F32`, `Q4_K`, `IQ2_XXS`, `BF16`).
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            Q8_K => "Q8_K",
            IQ2_XXS => "IQ2_XXS",
            IQ2_XS => "IQ2_XS",
            IQ3_XXS => "IQ3_XXS",
            IQ1_S => "IQ1_S",
            IQ4_NL => "IQ4_NL",
            IQ3_S => "IQ3_S",
            IQ2_S => "IQ2_S",
            IQ4_XS => "IQ4_XS",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            IQ1_M => "IQ1_M",
            BF16 => "BF16",
            TQ1_0 => "TQ1_0",
            TQ2_0 => "TQ2_0",
            MXFP4 => "MXFP4",
        }
    }

    /// `(elements per block, bytes per block)` (`ggml_blck_size`, `ggml_type_size`).
    pub fn block(self) -> (usize, usize) {
        use GgmlType::*;
        match self {
            F32 | I32 => (1, 4),
            F16 | BF16 | I16 => (1, 2),
            I8 => (1, 1),
            I64 | F64 => (1, 8),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q8_1 => (32, 36),
            Q2_K => (QK_K, 84),
            Q3_K => (QK_K, 110),
            Q4_K => (QK_K, 144),
            Q5_K => (QK_K, 176),
            Q6_K => (QK_K, 210),
            Q8_K => (QK_K, 292),
            IQ2_XXS => (QK_K, 66),
            IQ2_XS => (QK_K, 74),
            IQ3_XXS => (QK_K, 98),
            IQ1_S => (QK_K, 50),
            IQ4_NL => (32, 18),
            IQ3_S => (QK_K, 110),
            IQ2_S => (QK_K, 82),
            IQ4_XS => (QK_K, 136),
            IQ1_M => (QK_K, 56),
            TQ1_0 => (QK_K, 54),
            TQ2_0 => (QK_K, 66),
            MXFP4 => (32, 17),
        }
    }

    /// Bits per weight, scales included (`8 · bytes per block / elements per block`): Q4_1 is
    /// 5.0, Q4_K 4.5, Q6_K 6.5625.
    pub fn bits_per_weight(self) -> f64 {
        let (b, s) = self.block();
        8.0 * s as f64 / b as f64
    }

    /// Bytes of `elements` values; `None` when `elements` is not a whole number of blocks or
    /// the size overflows.
    pub fn bytes_for(self, elements: u64) -> Option<u64> {
        let (b, s) = self.block();
        if elements % b as u64 != 0 {
            return None;
        }
        (elements / b as u64).checked_mul(s as u64)
    }

    /// Whether [`dequantize`] handles this type.
    pub fn dequantizable(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            F32 | F16
                | BF16
                | F64
                | Q4_0
                | Q4_1
                | Q5_0
                | Q5_1
                | Q8_0
                | Q8_1
                | Q2_K
                | Q3_K
                | Q4_K
                | Q5_K
                | Q6_K
                | Q8_K
        )
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[inline]
fn h(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Dequantize `data` (whole blocks of type `t`) into `out` (one f32 per element).
///
/// # Errors
/// A type [`GgmlType::dequantizable`] refuses (named), or `data`/`out` sizes that are not the
/// same whole number of blocks.
pub fn dequantize(t: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), String> {
    use GgmlType::*;
    if !t.dequantizable() {
        return Err(format!(
            "ggml type {t} is not dequantized by rigbench (it reads F32, F16, BF16, F64, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and Q8_K)"
        ));
    }
    let (bs, bb) = t.block();
    if out.len() % bs != 0 || data.len() != out.len() / bs * bb {
        return Err(format!(
            "{t}: {} bytes for {} values; expected {} ({} per block of {bs})",
            data.len(),
            out.len(),
            out.len() / bs * bb,
            bb
        ));
    }
    for (blk, y) in data.chunks_exact(bb).zip(out.chunks_exact_mut(bs)) {
        match t {
            F32 => y[0] = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]),
            F16 => y[0] = h(blk, 0),
            BF16 => y[0] = f32::from_bits((u16::from_le_bytes([blk[0], blk[1]]) as u32) << 16),
            F64 => {
                let mut a = [0u8; 8];
                a.copy_from_slice(blk);
                y[0] = f64::from_le_bytes(a) as f32;
            }
            Q4_0 => {
                let d = h(blk, 0);
                let qs = &blk[2..18];
                for j in 0..16 {
                    y[j] = ((qs[j] & 0xF) as i32 - 8) as f32 * d;
                    y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
                }
            }
            Q4_1 => {
                let (d, m) = (h(blk, 0), h(blk, 2));
                let qs = &blk[4..20];
                for j in 0..16 {
                    y[j] = (qs[j] & 0xF) as f32 * d + m;
                    y[j + 16] = (qs[j] >> 4) as f32 * d + m;
                }
            }
            Q5_0 | Q5_1 => {
                let (d, m, at) = if t == Q5_0 {
                    (h(blk, 0), 0.0, 2)
                } else {
                    (h(blk, 0), h(blk, 2), 4)
                };
                let qh = u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]]);
                let qs = &blk[at + 4..at + 20];
                let off = if t == Q5_0 { 16 } else { 0 };
                for j in 0..16 {
                    let h0 = (((qh >> j) << 4) & 0x10) as i32;
                    let h1 = ((qh >> (j + 12)) & 0x10) as i32;
                    let x0 = ((qs[j] & 0xF) as i32 | h0) - off;
                    let x1 = ((qs[j] >> 4) as i32 | h1) - off;
                    y[j] = x0 as f32 * d + m;
                    y[j + 16] = x1 as f32 * d + m;
                }
            }
            Q8_0 | Q8_1 => {
                let d = h(blk, 0);
                let at = if t == Q8_0 { 2 } else { 4 };
                for j in 0..32 {
                    y[j] = (blk[at + j] as i8) as f32 * d;
                }
            }
            Q8_K => {
                let d = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
                for j in 0..QK_K {
                    y[j] = (blk[4 + j] as i8) as f32 * d;
                }
            }
            Q2_K => dequant_q2_k(blk, y),
            Q3_K => dequant_q3_k(blk, y),
            Q4_K => dequant_q4_k(blk, y),
            Q5_K => dequant_q5_k(blk, y),
            Q6_K => dequant_q6_k(blk, y),
            _ => unreachable!("checked by dequantizable"),
        }
    }
    Ok(())
}

/// `block_q2_K`: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin.
fn dequant_q2_k(blk: &[u8], y: &mut [f32]) {
    let scales = &blk[0..16];
    let qs = &blk[16..80];
    let (d, min) = (h(blk, 80), h(blk, 82));
    let mut is = 0;
    let mut yi = 0;
    for n in 0..2 {
        let q = &qs[n * 32..n * 32 + 32];
        let mut shift = 0;
        for _ in 0..4 {
            for half in 0..2 {
                let sc = scales[is];
                is += 1;
                let (dl, ml) = (d * (sc & 0xF) as f32, min * (sc >> 4) as f32);
                for l in 0..16 {
                    y[yi] = dl * ((q[l + 16 * half] >> shift) & 3) as f32 - ml;
                    yi += 1;
                }
            }
            shift += 2;
        }
    }
}

/// `block_q3_K`: hmask[32], qs[64], scales[12] (16 six-bit scales), d.
fn dequant_q3_k(blk: &[u8], y: &mut [f32]) {
    let hm = &blk[0..32];
    let qs = &blk[32..96];
    let sc = &blk[96..108];
    let d_all = h(blk, 108);
    let a = |i: usize| u32::from_le_bytes([sc[4 * i], sc[4 * i + 1], sc[4 * i + 2], sc[4 * i + 3]]);
    let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
    let (a0, a1, tmp) = (a(0), a(1), a(2));
    let aux = [
        (a0 & k2) | ((tmp & k1) << 4),
        (a1 & k2) | (((tmp >> 2) & k1) << 4),
        ((a0 >> 4) & k2) | (((tmp >> 4) & k1) << 4),
        ((a1 >> 4) & k2) | (((tmp >> 6) & k1) << 4),
    ];
    let mut scales = [0i8; 16];
    for (i, w) in aux.iter().enumerate() {
        for (j, b) in w.to_le_bytes().iter().enumerate() {
            scales[4 * i + j] = *b as i8;
        }
    }
    let mut is = 0;
    let mut yi = 0;
    let mut m = 1u8;
    for n in 0..2 {
        let q = &qs[n * 32..n * 32 + 32];
        let mut shift = 0;
        for _ in 0..4 {
            for half in 0..2 {
                let dl = d_all * (scales[is] as i32 - 32) as f32;
                is += 1;
                for l in 0..16 {
                    let i = l + 16 * half;
                    let v = ((q[i] >> shift) & 3) as i32 - if hm[i] & m != 0 { 0 } else { 4 };
                    y[yi] = dl * v as f32;
                    yi += 1;
                }
            }
            shift += 2;
            m <<= 1;
        }
    }
}

/// The 6-bit scale and min `j` (0..8) of a Q4_K/Q5_K block (`get_scale_min_k4`).
#[inline]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// `block_q4_K`: d, dmin, scales[12], qs[128].
fn dequant_q4_k(blk: &[u8], y: &mut [f32]) {
    let (d, min) = (h(blk, 0), h(blk, 2));
    let scales = &blk[4..16];
    let qs = &blk[16..144];
    for g in 0..4 {
        let (s1, m1) = scale_min_k4(2 * g, scales);
        let (s2, m2) = scale_min_k4(2 * g + 1, scales);
        let (d1, m1) = (d * s1 as f32, min * m1 as f32);
        let (d2, m2) = (d * s2 as f32, min * m2 as f32);
        let q = &qs[32 * g..32 * g + 32];
        for l in 0..32 {
            y[64 * g + l] = d1 * (q[l] & 0xF) as f32 - m1;
            y[64 * g + 32 + l] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// `block_q5_K`: d, dmin, scales[12], qh[32], qs[128].
fn dequant_q5_k(blk: &[u8], y: &mut [f32]) {
    let (d, min) = (h(blk, 0), h(blk, 2));
    let scales = &blk[4..16];
    let qh = &blk[16..48];
    let qs = &blk[48..176];
    let (mut u1, mut u2) = (1u8, 2u8);
    for g in 0..4 {
        let (s1, m1) = scale_min_k4(2 * g, scales);
        let (s2, m2) = scale_min_k4(2 * g + 1, scales);
        let (d1, m1) = (d * s1 as f32, min * m1 as f32);
        let (d2, m2) = (d * s2 as f32, min * m2 as f32);
        let ql = &qs[32 * g..32 * g + 32];
        for l in 0..32 {
            let hi1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let hi2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[64 * g + l] = d1 * ((ql[l] & 0xF) + hi1) as f32 - m1;
            y[64 * g + 32 + l] = d2 * ((ql[l] >> 4) + hi2) as f32 - m2;
        }
        u1 <<= 2;
        u2 <<= 2;
    }
}

/// `block_q6_K`: ql[128], qh[64], scales[16] (int8), d.
fn dequant_q6_k(blk: &[u8], y: &mut [f32]) {
    let d = h(blk, 208);
    for n in 0..2 {
        let ql = &blk[64 * n..64 * n + 64];
        let qh = &blk[128 + 32 * n..128 + 32 * n + 32];
        let sc = &blk[192 + 8 * n..192 + 8 * n + 8];
        let yy = &mut y[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            yy[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            yy[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            yy[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            yy[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_removed_ids_are_unknown() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 40, 1000] {
            assert_eq!(GgmlType::from_id(id), None, "{id}");
        }
        assert_eq!(GgmlType::Q4_1.bits_per_weight(), 5.0);
        assert_eq!(GgmlType::Q4_K.bits_per_weight(), 4.5);
        assert_eq!(GgmlType::Q6_K.bits_per_weight(), 6.5625);
        assert_eq!(GgmlType::Q8_0.bytes_for(64), Some(68));
        assert_eq!(GgmlType::Q8_0.bytes_for(63), None);
    }

    /// Random blocks of every type, dequantized by gguf-py (llama.cpp's Python package), made by
    /// `scripts/ref/smollm2_reference.py`.
    #[test]
    fn every_dequantized_type_matches_gguf_py() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/smollm2/dequant_cases.json"
        );
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let cases = v["cases"].as_array().unwrap();
        assert!(cases.len() >= 12);
        for c in cases {
            let name = c["type"].as_str().unwrap();
            let t = GgmlType::ALL
                .into_iter()
                .find(|t| t.name() == name)
                .unwrap();
            let hex = c["bytes_hex"].as_str().unwrap();
            let bytes: Vec<u8> = (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
                .collect();
            let want: Vec<f32> = c["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            let mut got = vec![0f32; want.len()];
            dequantize(t, &bytes, &mut got).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g == w || (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                    "{name} element {i}: {g} vs gguf-py {w}"
                );
            }
        }
    }

    #[test]
    fn q4_1_and_q8_0_by_hand() {
        // Q4_1: d = 0.5, m = -1: value = q·0.5 − 1.
        let mut b = vec![0u8; 20];
        b[0..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        b[2..4].copy_from_slice(&f16::from_f32(-1.0).to_bits().to_le_bytes());
        b[4] = 0x3A; // element 0: 0xA = 10, element 16: 3
        let mut y = [0f32; 32];
        dequantize(GgmlType::Q4_1, &b, &mut y).unwrap();
        assert_eq!((y[0], y[16], y[1]), (4.0, 0.5, -1.0));
        // Q8_0: d = 0.25.
        let mut b = vec![0u8; 34];
        b[0..2].copy_from_slice(&f16::from_f32(0.25).to_bits().to_le_bytes());
        b[2] = (-8i8) as u8;
        b[33] = 12;
        let mut y = [0f32; 32];
        dequantize(GgmlType::Q8_0, &b, &mut y).unwrap();
        assert_eq!((y[0], y[31], y[5]), (-2.0, 3.0, 0.0));
        // Sizes are checked; unknown kinds are named.
        assert!(dequantize(GgmlType::Q8_0, &b[..33], &mut y).is_err());
        let e = dequantize(GgmlType::IQ2_XXS, &[0; 66], &mut [0f32; 256]).unwrap_err();
        assert!(e.contains("IQ2_XXS"), "{e}");
    }
}
