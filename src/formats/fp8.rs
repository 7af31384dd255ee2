//! FP8 E4M3 tensors with FP32 scales (W8A8 weights and activations, FP8 KV cache).
//!
//! Convention (NVIDIA ModelOpt FP8, vLLM `Fp8LinearMethod`, cuBLASLt `CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER`):
//! a stored scale `s` dequantizes as `x ≈ e4m3(q) · s`; per-tensor `s = amax / 448`,
//! per-channel one `s` per output row.

use super::{e4m3, FormatError};

/// Granularity of FP8 scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fp8Granularity {
    /// One scale for the whole tensor.
    PerTensor,
    /// One scale per row (output channel) of a `[N, K]` weight.
    PerChannel,
}

/// A row-major `[rows, cols]` FP8 E4M3 matrix with its scales.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Tensor {
    /// Rows (N for a weight, M for activations).
    pub rows: usize,
    /// Columns (K).
    pub cols: usize,
    /// E4M3 codes, row-major.
    pub data: Vec<u8>,
    /// One scale (per tensor) or `rows` scales (per channel).
    pub scales: Vec<f32>,
    /// How `scales` is laid out.
    pub granularity: Fp8Granularity,
}

/// Scale for an absolute maximum: `amax / 448`, or 1.0 for an all-zero (or non-finite) amax.
pub fn scale_from_amax(amax: f32) -> f32 {
    if amax > 0.0 && amax.is_finite() {
        amax / e4m3::E4M3_MAX
    } else {
        1.0
    }
}

/// Quantize a row-major `[rows, cols]` f32 matrix to E4M3 with the given granularity.
///
/// # Errors
/// [`FormatError::Shape`] when `data.len() != rows·cols`.
pub fn quantize(
    data: &[f32],
    rows: usize,
    cols: usize,
    granularity: Fp8Granularity,
) -> Result<Fp8Tensor, FormatError> {
    if data.len() != rows * cols {
        return Err(FormatError::Shape(format!(
            "matrix has {} values; [{rows}, {cols}] needs {}",
            data.len(),
            rows * cols
        )));
    }
    let amax = |s: &[f32]| s.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scales: Vec<f32> = match granularity {
        Fp8Granularity::PerTensor => vec![scale_from_amax(amax(data))],
        Fp8Granularity::PerChannel => {
            if cols == 0 {
                vec![1.0; rows]
            } else {
                data.chunks_exact(cols)
                    .map(|r| scale_from_amax(amax(r)))
                    .collect()
            }
        }
    };
    let mut q = Vec::with_capacity(data.len());
    for r in 0..rows {
        let s = match granularity {
            Fp8Granularity::PerTensor => scales[0],
            Fp8Granularity::PerChannel => scales[r],
        };
        let inv = 1.0 / s;
        q.extend(
            data[r * cols..(r + 1) * cols]
                .iter()
                .map(|v| e4m3::encode(v * inv)),
        );
    }
    Ok(Fp8Tensor {
        rows,
        cols,
        data: q,
        scales,
        granularity,
    })
}

impl Fp8Tensor {
    /// The scale that applies to row `r`.
    #[inline]
    pub fn row_scale(&self, r: usize) -> f32 {
        match self.granularity {
            Fp8Granularity::PerTensor => self.scales[0],
            Fp8Granularity::PerChannel => self.scales[r],
        }
    }

    /// Dequantized value of `(r, c)`.
    #[inline]
    pub fn get(&self, r: usize, c: usize) -> f32 {
        e4m3::decode(self.data[r * self.cols + c]) * self.row_scale(r)
    }

    /// Dequantize to row-major f32.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.data.len());
        for r in 0..self.rows {
            let s = self.row_scale(r);
            out.extend(
                self.data[r * self.cols..(r + 1) * self.cols]
                    .iter()
                    .map(|b| e4m3::decode(*b) * s),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_tensor_roundtrip_error_is_small() {
        let v: Vec<f32> = (0..256).map(|i| ((i as f32) * 0.37).sin() * 3.0).collect();
        let q = quantize(&v, 4, 64, Fp8Granularity::PerTensor).unwrap();
        assert_eq!(q.scales.len(), 1);
        let d = q.dequantize();
        let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (a, b) in v.iter().zip(&d) {
            // Half an ulp at 3 mantissa bits is ≤ 1/16 relative for normals; subnormal
            // steps are 2^-9·s absolute.
            assert!((a - b).abs() <= a.abs() / 16.0 + amax / 448.0 * 2f32.powi(-9) + 1e-7);
        }
        // The amax itself maps to 448 exactly.
        assert!(q.data.contains(&0x7E) || q.data.contains(&0xFE));
    }

    #[test]
    fn per_channel_scales_follow_rows() {
        let v = [1.0, -2.0, 0.5, 0.25, 100.0, 3.0, 0.0, 0.0];
        let q = quantize(&v, 2, 4, Fp8Granularity::PerChannel).unwrap();
        assert_eq!(q.scales, vec![2.0 / 448.0, 100.0 / 448.0]);
        assert_eq!(q.get(0, 1), -2.0);
        assert_eq!(q.get(1, 0), 100.0);
    }

    #[test]
    fn zero_and_shape_errors() {
        let q = quantize(&[0.0; 8], 2, 4, Fp8Granularity::PerTensor).unwrap();
        assert_eq!(q.scales, vec![1.0]);
        assert!(quantize(&[0.0; 7], 2, 4, Fp8Granularity::PerTensor).is_err());
    }
}
