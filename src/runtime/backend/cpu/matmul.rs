//! The CPU backend's matmul: `x · Wᵀ` with the weight rows dequantized on the fly (BF16, FP8,
//! NVFP4), split over threads by output rows, and the activation quantization of FP8 W8A8 and
//! of emulated NVFP4 W4A4.

use std::borrow::Cow;

use crate::formats::e4m3;
use crate::runtime::model::dot;
use crate::runtime::weights::Linear;

/// Multiply-adds below which a matmul or an attention call stays on one thread (spawning costs
/// about 10–50 µs per thread; 2¹⁸ MACs take about that long on one core).
pub(super) const PAR_MIN_WORK: usize = 1 << 18;

/// Quantize activations to E4M3 for a W8A8 matmul and return their dequantized values:
/// per token (row) with `scale = amax(|row|) / 448` when `input_scale` is `None` (vLLM's dynamic
/// per-token FP8), else with the static scale (values beyond ±448·scale saturate).
pub fn quantize_activations_fp8(x: &[f32], k: usize, input_scale: Option<f32>) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(k) {
        let s = input_scale.unwrap_or_else(|| {
            crate::formats::fp8::scale_from_amax(row.iter().fold(0f32, |m, v| m.max(v.abs())))
        });
        let inv = 1.0 / s;
        out.extend(row.iter().map(|v| e4m3::round_trip(v * inv) * s));
    }
    out
}

/// Quantize activations to NVFP4 and return their dequantized values, for the emulated W4A4
/// path: per token (row), a per-row FP32 scale `amax(|row|) / (6 · 448)` and an E4M3 scale per
/// 16 values (the weights' ModelOpt math, [`crate::formats::nvfp4::quantize`], applied to one
/// row). Dynamic per-token scaling is the best case of W4A4: engines use a calibrated static
/// per-tensor `input_scale` (docs/fidelity.md).
pub fn quantize_activations_nvfp4(x: &[f32], k: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(k) {
        match crate::formats::nvfp4::quantize(row, 1, k) {
            Ok(q) => out.extend(q.dequantize()),
            // K not a multiple of 16: NVFP4 weights could not exist either; keep the row.
            Err(_) => out.extend_from_slice(row),
        }
    }
    out
}

/// `y = x · Wᵀ` for `x` `[m, K]` and `w` `[N, K]`: returns `[m, N]`. FP8 weights also quantize
/// the activations (W8A8, see [`quantize_activations_fp8`]); BF16 and NVFP4 (W4A16) use the f32
/// activations as they are.
pub fn matmul(x: &[f32], m: usize, w: &Linear, threads: usize) -> Vec<f32> {
    let (n, k) = w.shape();
    debug_assert_eq!(x.len(), m * k);
    let xq: Cow<[f32]> = match w {
        Linear::Fp8 { input_scale, .. } => Cow::Owned(quantize_activations_fp8(x, k, *input_scale)),
        _ => Cow::Borrowed(x),
    };
    let mut out = vec![0f32; m * n];
    let t = if m * n * k < PAR_MIN_WORK {
        1
    } else {
        threads.min(n / 8).max(1)
    };
    if t == 1 {
        kernel(&xq, m, k, w, 0, n, &mut out);
        return out;
    }
    let per = n.div_ceil(t);
    let parts: Vec<(usize, Vec<f32>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..t)
            .map(|i| {
                let (j0, j1) = (i * per, ((i + 1) * per).min(n));
                let xq = &xq;
                s.spawn(move || {
                    let mut local = vec![0f32; m * (j1.saturating_sub(j0))];
                    if j1 > j0 {
                        kernel(xq, m, k, w, j0, j1, &mut local);
                    }
                    (j0, local)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    for (j0, local) in parts {
        let len = local.len().checked_div(m).unwrap_or(0);
        for i in 0..m {
            out[i * n + j0..i * n + j0 + len].copy_from_slice(&local[i * len..(i + 1) * len]);
        }
    }
    out
}

/// Rows `j0..j1` of `w` against all `m` rows of `x`, into `out` `[m, j1 - j0]`.
fn kernel(x: &[f32], m: usize, k: usize, w: &Linear, j0: usize, j1: usize, out: &mut [f32]) {
    let ld = j1 - j0;
    let mut wrow = vec![0f32; k];
    for j in j0..j1 {
        w.dequantize_row(j, &mut wrow);
        for i in 0..m {
            out[i * ld + (j - j0)] = dot(&x[i * k..(i + 1) * k], &wrow);
        }
    }
}
