//! The decoder's math, shared by the CPU backend: RMSNorm, RoPE, SiLU-gated MLP activation,
//! dot products and causal attention over a gathered K/V context.
//!
//! Conventions follow Hugging Face transformers' `Qwen3ForCausalLM` / `LlamaForCausalLM`:
//! - RMSNorm (Zhang and Sennrich, 2019): `y = x / sqrt(mean(x²) + eps) · w`;
//! - RoPE (Su et al., RoFormer, 2021) in the rotate-half layout: pairs `(x[i], x[i + d/2])`
//!   rotated by `pos · inv_freq[i]`;
//! - Qwen3 applies an RMSNorm over each head's q and k (weight of length `head_dim`) before RoPE;
//! - SwiGLU MLP (Shazeer, 2020): `down(silu(gate(x)) · up(x))`;
//! - attention scale `1/sqrt(head_dim)`, causal, GQA: query head `h` reads KV head
//!   `h / (num_heads / num_kv_heads)`.
//!
//! Everything is f32. Summation orders are fixed (independent of batch composition and of the
//! thread count), so one token's result does not depend on which other tokens share its batch:
//! this is what makes speculative greedy output, chunked prefill and prefix-cache hits
//! bit-identical to plain decoding.

/// Dot product with 8 independent accumulators (vectorizes; fixed summation order).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// RMSNorm of `x` into `out` (same length as `w`).
#[inline]
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms = dot(x, x) / x.len() as f32;
    let inv = 1.0 / (ms + eps).sqrt();
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = v * inv * g;
    }
}

/// RMSNorm in place.
#[inline]
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let ms = dot(x, x) / x.len() as f32;
    let inv = 1.0 / (ms + eps).sqrt();
    for (v, g) in x.iter_mut().zip(w) {
        *v = *v * inv * g;
    }
}

/// Rotate one head vector (length `2 · inv_freq.len()`) by position `pos`, rotate-half layout.
#[inline]
pub fn apply_rope(x: &mut [f32], pos: usize, inv_freq: &[f32]) {
    let half = inv_freq.len();
    for (i, f) in inv_freq.iter().enumerate() {
        let angle = pos as f32 * f;
        let (s, c) = angle.sin_cos();
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
    }
}

/// SiLU (swish): `x · sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Shape of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// Query heads.
    pub num_heads: usize,
    /// KV heads.
    pub num_kv_heads: usize,
    /// Per-head dimension.
    pub head_dim: usize,
}

/// Causal attention of one query head over a gathered context.
///
/// `q`: the head's query (head_dim); `k`, `v`: the context `[ctx, num_kv_heads · head_dim]`
/// f32; `kv_head`: which KV head; attends to positions `0..=pos`. Writes head_dim values to
/// `out`; `scores` is scratch of at least `pos + 1`.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn attend_one(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: AttnShape,
    kv_head: usize,
    pos: usize,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let d = shape.head_dim;
    let stride = shape.num_kv_heads * d;
    let off = kv_head * d;
    let scale = 1.0 / (d as f32).sqrt();
    let mut max = f32::NEG_INFINITY;
    for t in 0..=pos {
        let s = dot(q, &k[t * stride + off..t * stride + off + d]) * scale;
        scores[t] = s;
        if s > max {
            max = s;
        }
    }
    let mut sum = 0f32;
    for s in scores[..=pos].iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    let inv = 1.0 / sum;
    out[..d].fill(0.0);
    for t in 0..=pos {
        let p = scores[t] * inv;
        let row = &v[t * stride + off..t * stride + off + d];
        for (o, x) in out[..d].iter_mut().zip(row) {
            *o += p * x;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_naive() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let naive: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (*x as f64) * (*y as f64))
            .sum();
        assert!((dot(&a, &b) as f64 - naive).abs() < 1e-5);
    }

    #[test]
    fn rope_preserves_norm_and_is_identity_at_zero() {
        let inv: Vec<f32> = (0..4)
            .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / 8.0))
            .collect();
        let x0: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        let mut x = x0.clone();
        apply_rope(&mut x, 0, &inv);
        assert_eq!(x, x0);
        apply_rope(&mut x, 17, &inv);
        assert!((dot(&x, &x) - dot(&x0, &x0)).abs() < 1e-3);
        assert_ne!(x, x0);
    }

    #[test]
    fn attention_of_one_position_returns_its_value() {
        let shape = AttnShape {
            num_heads: 1,
            num_kv_heads: 1,
            head_dim: 4,
        };
        let (q, k, v) = (
            [1.0, 0.0, 0.0, 0.0],
            [0.5, 0.5, 0.5, 0.5],
            [1.0, 2.0, 3.0, 4.0],
        );
        let mut out = [0f32; 4];
        let mut s = [0f32; 1];
        attend_one(&q, &k, &v, shape, 0, 0, &mut s, &mut out);
        assert_eq!(out, v);
    }

    #[test]
    fn rms_norm_unit_rms() {
        let x = [3.0f32, -4.0, 0.0, 0.0];
        let mut o = [0f32; 4];
        rms_norm(&x, &[1.0; 4], 0.0, &mut o);
        let rms = (o.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
        assert_eq!(silu(0.0), 0.0);
    }
}
