//! Number formats and packings: E2M1, E4M3, NVFP4 (block 16), FP8 tensors, BF16 helpers, and
//! the names of the GEMM formats that rigbench benches.
//!
//! Everything here is exact host-side arithmetic with no GPU dependency; kernels and the runtime
//! use it as their reference.

pub mod e2m1;
pub mod e4m3;
pub mod fp8;
pub mod ggml;
pub mod nvfp4;
pub mod w4a16_pack;

use serde::{Deserialize, Serialize};

/// Test data for this module's tests: `n` values uniform in [−1, 1) from the "lowbias32" hash
/// (Chris Wellons, 2018), the same values as `crate::kernels::data::uniform_pm1(i, seed)` for
/// `i` in `0..n` (a test there checks that they agree). Computed here because formats sits
/// below kernels (docs/architecture.md).
#[cfg(test)]
pub(crate) fn test_uniform(seed: u32, n: usize) -> Vec<f32> {
    fn lowbias32(mut x: u32) -> u32 {
        x ^= x >> 16;
        x = x.wrapping_mul(0x7feb_352d);
        x ^= x >> 15;
        x = x.wrapping_mul(0x846c_a68b);
        x ^= x >> 16;
        x
    }
    (0..n as u32)
        .map(|i| (lowbias32(i ^ lowbias32(seed)) >> 8) as f32 * (1.0 / 16_777_216.0) * 2.0 - 1.0)
        .collect()
}

/// Errors from format conversions: a shape that does not fit the format, or an invalid scale.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum FormatError {
    /// Sizes that do not fit the format (message names the expected shape).
    #[error("shape error: {0}")]
    Shape(String),
    /// A scale that is zero, negative or not finite.
    #[error("invalid scale: {0}")]
    InvalidScale(String),
}

/// The GEMM formats rigbench benches and classifies: weights × activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GemmFormat {
    /// BF16 weights and activations, FP32 accumulate.
    Bf16,
    /// FP8 E4M3 weights and activations with FP32 scales ("W8A8").
    Fp8,
    /// NVFP4 weights (E2M1 + E4M3 block-16 scales + FP32 tensor scale), BF16 activations.
    W4a16,
    /// NVFP4 weights and activations; needs FP4 tensor cores (sm_100 and up).
    W4a4,
}

impl GemmFormat {
    /// All formats, in report order.
    pub const ALL: [GemmFormat; 4] = [Self::Bf16, Self::Fp8, Self::W4a16, Self::W4a4];

    /// The short id used on the command line and in files (`bf16`, `fp8`, `w4a16`, `w4a4`).
    pub fn id(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::Fp8 => "fp8",
            Self::W4a16 => "w4a16",
            Self::W4a4 => "w4a4",
        }
    }

    /// The field's name for the format, for tables.
    pub fn display_name(self) -> &'static str {
        match self {
            Self::Bf16 => "BF16",
            Self::Fp8 => "FP8 W8A8",
            Self::W4a16 => "W4A16 NVFP4",
            Self::W4a4 => "W4A4 NVFP4",
        }
    }

    /// Bytes per weight element as stored (scales excluded): 2, 1, 0.5, 0.5.
    pub fn weight_bytes_per_element(self) -> f64 {
        match self {
            Self::Bf16 => 2.0,
            Self::Fp8 => 1.0,
            Self::W4a16 | Self::W4a4 => 0.5,
        }
    }

    /// Bytes of weight stream for an `[n, k]` weight: elements plus scales
    /// (FP8: one FP32 tensor scale; NVFP4: one E4M3 per 16 elements plus one FP32).
    pub fn weight_stream_bytes(self, n: usize, k: usize) -> u64 {
        let e = (n * k) as u64;
        match self {
            Self::Bf16 => 2 * e,
            Self::Fp8 => e + 4,
            Self::W4a16 | Self::W4a4 => e / 2 + e / 16 + 4,
        }
    }
}

impl std::fmt::Display for GemmFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.id())
    }
}

impl std::str::FromStr for GemmFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "bf16" => Ok(Self::Bf16),
            "fp8" | "w8a8" | "fp8-w8a8" => Ok(Self::Fp8),
            "w4a16" | "nvfp4-w4a16" => Ok(Self::W4a16),
            "w4a4" | "nvfp4" | "nvfp4-w4a4" => Ok(Self::W4a4),
            other => Err(format!(
                "unknown format '{other}'; expected one of bf16, fp8, w4a16, w4a4"
            )),
        }
    }
}

/// Round an f32 to BF16 (round to nearest even, as `__float2bfloat16_rn`) and back.
#[inline]
pub fn bf16_round(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

/// Convert f32 values to BF16 bit patterns (little-endian u16), round to nearest even.
pub fn to_bf16_bits(values: &[f32]) -> Vec<u16> {
    values
        .iter()
        .map(|v| half::bf16::from_f32(*v).to_bits())
        .collect()
}

/// Convert BF16 bit patterns to f32 (exact).
pub fn from_bf16_bits(bits: &[u16]) -> Vec<f32> {
    bits.iter()
        .map(|b| half::bf16::from_bits(*b).to_f32())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_ids_parse_back() {
        for f in GemmFormat::ALL {
            assert_eq!(f.id().parse::<GemmFormat>().unwrap(), f);
        }
        let err = "int3".parse::<GemmFormat>().unwrap_err();
        assert!(err.contains("int3") && err.contains("bf16"));
    }

    #[test]
    fn stream_bytes() {
        assert_eq!(GemmFormat::Bf16.weight_stream_bytes(16, 32), 1024);
        assert_eq!(GemmFormat::W4a16.weight_stream_bytes(16, 32), 256 + 32 + 4);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 is exactly half an ulp of bf16 at 1.0: ties to even → 1.0.
        assert_eq!(bf16_round(1.0 + 2f32.powi(-8)), 1.0);
        assert_eq!(bf16_round(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
        let bits = to_bf16_bits(&[1.5, -2.0]);
        assert_eq!(from_bf16_bits(&bits), vec![1.5, -2.0]);
    }
}
