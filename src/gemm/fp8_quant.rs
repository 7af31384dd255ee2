//! Per-token (row-wise) FP8 E4M3 activation quantization on the GPU (`kernels/fp8_quant.cu`), and
//! its fused RMSNorm + quantize variant: the launchers and their CPU references. [`launch_quant_rows`]
//! is the one per-token quantization of the GEMM layer ([`crate::gemm::ops`]): the kernel bench's
//! `fp8-rowwise` rows time it and the built-in runtime runs it in front of every FP8 linear whose
//! input no fused kernel quantized.
//!
//! Rule (the CPU's `runtime::backend::cpu::quantize_activations_fp8`, and the runtime's fused
//! quantizing kernels in `kernels/runtime.cu`): per row, `s = amax / 448` (1 for an all-zero or
//! non-finite row), `q = e4m3_satfinite(x · (1 / s))`; with a static input scale `s` (> 0, a
//! checkpoint's `input_scale`) every row uses `s`. Shapes: input BF16 `[M, K]`
//! (row stride K, 16-byte aligned rows for the vector variants), output E4M3 `[M, K]`, scales FP32
//! `[M]`. One CTA per row reading the row once (docs/w4a16-notes.md, "FP8 as engines run it").

use crate::formats::{e4m3, fp8::scale_from_amax};
use crate::gemm::launchers::fp8_quant;
use crate::gpu::{dim, DevPtr, Gpu, Module};

/// Source of the kernels (compiled at run time by NVRTC).
pub const SRC: &str = include_str!("../../kernels/fp8_quant.cu");

/// The one-pass variants: (threads per CTA, 16-byte vectors per thread), smallest first. A row of
/// K values fits a variant when `K ≤ threads · vectors · 8`.
pub const VARIANTS: &[(u32, u32)] = &[(128, 2), (256, 2), (256, 4), (512, 5), (1024, 8)];

/// Every kernel of [`SRC`].
pub fn kernel_names() -> Vec<String> {
    let mut v = Vec::new();
    for (t, n) in VARIANTS {
        v.push(quant_name(*t, *n));
        v.push(rmsnorm_name(*t, *n));
    }
    v.push(ANY_K.into());
    v.push(SCALE_OUT.into());
    v
}

/// The kernel that takes any K (two reads of each row).
pub const ANY_K: &str = "fp8_quant_rows_bf16_any";
/// The epilogue `out[t, n] = bf16(acc[t, n] · s_tok[t] · s_chan[n])`.
pub const SCALE_OUT: &str = "fp8_rowwise_scale_out";

fn quant_name(t: u32, v: u32) -> String {
    format!("fp8_quant_rows_bf16_t{t}_v{v}")
}

fn rmsnorm_name(t: u32, v: u32) -> String {
    format!("rmsnorm_fp8_quant_rows_bf16_t{t}_v{v}")
}

/// The one-pass variant for rows of `k` values: `Some((threads, vectors))`, or `None` when K is
/// not a multiple of 8 or longer than the largest variant (then [`ANY_K`] runs).
pub fn variant_for(k: usize) -> Option<(u32, u32)> {
    if k == 0 || k % 8 != 0 {
        return None;
    }
    VARIANTS
        .iter()
        .copied()
        .find(|(t, v)| k <= (*t * *v * 8) as usize)
}

/// What [`launch_quant_rows`] runs for rows of `k` values, in words (for the report's path).
pub fn describe(k: usize) -> String {
    match variant_for(k) {
        Some((t, v)) => format!(
            "per-token FP8 quantization (kernels/fp8_quant.cu, one {t}-thread CTA per row, {v} 16-byte loads per thread, one read of the row)"
        ),
        None => "per-token FP8 quantization (kernels/fp8_quant.cu, any-K kernel: one 1024-thread CTA per row, two reads of the row)".into(),
    }
}

/// Queue the per-token quantization of `m` rows of `k` BF16 values at `input` into E4M3 `out`
/// `[m, k]` and FP32 `scales` `[m]` (device addresses) with `module` (compiled from [`SRC`]).
/// `static_scale` > 0: every row is quantized with that scale (written to `scales` too); 0: the
/// dynamic per-token scale `amax / 448`. The one-pass variant runs when `k` has one and `input`
/// / `out` are 16- / 8-byte aligned, else the any-K kernel (the same codes).
///
/// # Errors
/// The launch fails (e.g. a kernel missing from `module`, or `m` or `k` over `i32`).
#[allow(clippy::too_many_arguments)]
pub fn launch_quant_rows(
    gpu: &Gpu,
    module: &Module,
    input: u64,
    m: usize,
    k: usize,
    static_scale: f32,
    out: u64,
    scales: u64,
) -> anyhow::Result<()> {
    let grid = (dim("M (fp8 row quantization grid)", m)?, 1, 1);
    match variant_for(k) {
        Some((t, v)) if input % 16 == 0 && out % 8 == 0 => fp8_quant::quant_rows(
            module,
            gpu,
            &quant_name(t, v),
            grid,
            (t, 1, 1),
            0,
            DevPtr::at(input),
            m,
            k,
            static_scale,
            DevPtr::at(out),
            DevPtr::at(scales),
        )?,
        _ => fp8_quant::fp8_quant_rows_bf16_any(
            module,
            gpu,
            grid,
            (1024, 1, 1),
            0,
            DevPtr::at(input),
            m,
            k,
            static_scale,
            DevPtr::at(out),
            DevPtr::at(scales),
        )?,
    }
    Ok(())
}

/// Queue the fused RMSNorm + per-token quantization: `y = bf16(x · r · w)` with
/// `r = 1 / sqrt(mean(x²) + eps)` and FP32 norm weights `weight` `[k]`, then `y` quantized as
/// [`launch_quant_rows`] does.
///
/// # Errors
/// `k` has no one-pass variant (not a multiple of 8, or longer than 65,536), or the launch fails.
#[allow(clippy::too_many_arguments)]
pub fn launch_rmsnorm_quant_rows(
    gpu: &Gpu,
    module: &Module,
    input: u64,
    weight: u64,
    eps: f32,
    m: usize,
    k: usize,
    out: u64,
    scales: u64,
) -> anyhow::Result<()> {
    let (t, v) = variant_for(k).ok_or_else(|| {
        anyhow::anyhow!(
            "the fused RMSNorm + FP8 quantization needs K a multiple of 8 up to 65,536; K = {k}"
        )
    })?;
    fp8_quant::rmsnorm_quant_rows(
        module,
        gpu,
        &rmsnorm_name(t, v),
        (dim("M (fp8 row quantization grid)", m)?, 1, 1),
        (t, 1, 1),
        0,
        DevPtr::at(input),
        DevPtr::at(weight),
        eps,
        m,
        k,
        DevPtr::at(out),
        DevPtr::at(scales),
    )?;
    Ok(())
}

/// CPU reference of one row: (E4M3 codes, scale), the dynamic rule of the module docs.
pub fn quant_row(x: &[f32]) -> (Vec<u8>, f32) {
    quant_row_with(x, 0.0)
}

/// CPU reference of one row with a static scale: `static_scale` > 0 quantizes with that scale,
/// 0 (or anything not > 0) is [`quant_row`]'s dynamic rule. Returns (E4M3 codes, scale).
pub fn quant_row_with(x: &[f32], static_scale: f32) -> (Vec<u8>, f32) {
    let s = if static_scale > 0.0 {
        static_scale
    } else {
        let amax = x
            .iter()
            .filter(|v| !v.is_nan())
            .fold(0f32, |m, v| m.max(v.abs()));
        scale_from_amax(amax)
    };
    let inv = 1.0 / s;
    (x.iter().map(|v| e4m3::encode(v * inv)).collect(), s)
}

/// CPU reference of the fused RMSNorm of one row (before quantization): `bf16(x · r · w)`, the
/// sum of squares in f64 (the GPU's FP32 sum in another order can differ in its last bit, which
/// moves a few values by one BF16 step).
pub fn rmsnorm_row(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ss: f64 = x.iter().map(|v| (*v as f64) * (*v as f64)).sum();
    let ms = (ss / x.len().max(1) as f64) as f32;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter()
        .zip(w)
        .map(|(v, w)| crate::formats::bf16_round(v * r * w))
        .collect()
}

/// Check the GPU's fused RMSNorm + quantization of one row (`codes`, `scale`) against the CPU
/// ([`rmsnorm_row`], then the rule of [`quant_row`]). The GPU sums the squares in FP32 in its
/// own order, so its `y` may differ from the CPU's by one BF16 step at a few elements: the scale
/// must be within one BF16 step (2⁻⁷ relative) of the CPU's, and the codes must equal the CPU's
/// `y` quantized with the GPU's scale at all but 1% of the elements.
///
/// # Errors
/// What differs, in words.
pub fn check_fused_row(
    x: &[f32],
    w: &[f32],
    eps: f32,
    codes: &[u8],
    scale: f32,
) -> Result<(), String> {
    if codes.len() != x.len() || w.len() != x.len() {
        return Err(format!(
            "{} codes and {} norm weights for a row of {}",
            codes.len(),
            w.len(),
            x.len()
        ));
    }
    let y = rmsnorm_row(x, w, eps);
    let (_, s) = quant_row(&y);
    if !(scale.is_finite() && scale > 0.0 && (scale - s).abs() <= s * (1.0 / 128.0)) {
        return Err(format!("scale {scale:e}, the CPU's {s:e}"));
    }
    let inv = 1.0 / scale;
    let differ = y
        .iter()
        .zip(codes)
        .filter(|(v, c)| e4m3::encode(*v * inv) != **c)
        .count();
    if differ > x.len() / 100 {
        return Err(format!(
            "{differ} of {} codes differ from the CPU's",
            x.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first `n` elements of the kernel bench's `bf16_uniform(seed, scale)` tensor (its
    /// `kernels::data`), from the formats' copy of the same hash: the GEMM layer sits below the
    /// bench.
    fn bf16_uniform(n: usize, seed: u32, scale: f32) -> Vec<f32> {
        crate::formats::test_uniform(seed, n)
            .into_iter()
            .map(|u| crate::formats::bf16_round(u * scale))
            .collect()
    }

    #[test]
    fn variants_cover_the_suite_and_fall_back() {
        assert_eq!(variant_for(5120), Some((256, 4)));
        assert_eq!(variant_for(6144), Some((256, 4)));
        assert_eq!(variant_for(17408), Some((512, 5)));
        assert_eq!(variant_for(2048), Some((128, 2)));
        assert_eq!(variant_for(8 * 1024 * 8), Some((1024, 8)));
        assert_eq!(variant_for(8 * 1024 * 8 + 8), None);
        assert_eq!(variant_for(100), None, "K not a multiple of 8");
        assert!(describe(100).contains("any-K"));
        let names = kernel_names();
        assert_eq!(names.len(), 2 * VARIANTS.len() + 2);
        for n in &names {
            assert!(
                SRC.contains(n.as_str()) || SRC.contains("FQ_VARIANT"),
                "{n}"
            );
        }
        assert!(SRC.contains(ANY_K) && SRC.contains(SCALE_OUT));
    }

    /// A static input scale: every row uses it, and 0 falls back to the dynamic per-token scale
    /// (the CPU backend's `input_scale` rule is held to it in `runtime::backend::cpu`'s tests).
    #[test]
    fn static_scale_replaces_the_dynamic_one() {
        let k = 64;
        let x: Vec<f32> = bf16_uniform(2 * k, 9, 4.0);
        let st = 0.0125f32;
        for (r, row) in x.chunks_exact(k).enumerate() {
            let (q, s) = quant_row_with(row, st);
            assert_eq!(s, st);
            let want: Vec<u8> = row.iter().map(|v| e4m3::encode(v * (1.0 / st))).collect();
            assert_eq!(q, want, "row {r}");
            assert_ne!(
                q,
                quant_row(row).0,
                "the static scale changes the codes of row {r}"
            );
        }
        assert_eq!(quant_row_with(&x[..k], 0.0), quant_row(&x[..k]));
    }

    #[test]
    fn the_fused_check_takes_the_cpus_result_and_refuses_wrong_ones() {
        let k = 512;
        let x: Vec<f32> = bf16_uniform(k, 5, 3.0);
        let w: Vec<f32> = (0..k).map(|i| 0.5 + (i % 16) as f32 / 16.0).collect();
        let (q, s) = quant_row(&rmsnorm_row(&x, &w, 1e-6));
        assert_eq!(check_fused_row(&x, &w, 1e-6, &q, s), Ok(()));
        // The norm weights reversed (a wrong index): most codes differ.
        let wr: Vec<f32> = w.iter().rev().copied().collect();
        let (qr, sr) = quant_row(&rmsnorm_row(&x, &wr, 1e-6));
        let e = check_fused_row(&x, &w, 1e-6, &qr, sr).unwrap_err();
        assert!(e.contains("codes differ") || e.contains("scale"), "{e}");
        // Without the norm (the plain quantization of x): the scale is off.
        let (qx, sx) = quant_row(&x);
        assert!(check_fused_row(&x, &w, 1e-6, &qx, sx)
            .unwrap_err()
            .contains("scale"));
        // A scale one BF16 step off passes (the codes then follow the GPU's scale).
        let s2 = s * (1.0 + 1.0 / 256.0);
        let q2: Vec<u8> = rmsnorm_row(&x, &w, 1e-6)
            .iter()
            .map(|v| e4m3::encode(v * (1.0 / s2)))
            .collect();
        assert_eq!(check_fused_row(&x, &w, 1e-6, &q2, s2), Ok(()));
        // A few codes wrong pass; many do not.
        let mut q3 = q.clone();
        q3[0] ^= 1;
        assert_eq!(check_fused_row(&x, &w, 1e-6, &q3, s), Ok(()));
        for c in q3.iter_mut().take(20) {
            *c ^= 1;
        }
        assert!(check_fused_row(&x, &w, 1e-6, &q3, s).is_err());
    }

    #[test]
    fn rmsnorm_row_normalizes() {
        let x = vec![3.0f32, 4.0];
        let y = rmsnorm_row(&x, &[1.0, 2.0], 0.0);
        // mean(x²) = 12.5, r = 1 / sqrt(12.5).
        let r = 1.0 / 12.5f32.sqrt();
        assert_eq!(
            y,
            vec![
                crate::formats::bf16_round(3.0 * r),
                crate::formats::bf16_round(8.0 * r)
            ]
        );
    }
}
