//! The CPU accuracy study: how far each format's GEMM lands from the exact product on fixed,
//! seeded data. Deterministic (hash-based data, exact quantizers from [`crate::formats`]), needs
//! no GPU, and so serves CI baselines. W4A4 here is emulated (quantize, dequantize, multiply in
//! f64): an accuracy figure only, never a throughput.
//!
//! Data sets (ids `plain` and `outliers`): weights normal(0, 0.02) (a typical LLM init scale); activations normal(0, 1), and the
//! same with 1% of K channels scaled ×30 (the outlier channels that make activation quantization
//! hard, cf. Dettmers et al., "LLM.int8()", 2022). Normal values come from Box–Muller on the
//! generator's uniform hash values ([`super::data::uniform_pm1`]).

use super::data::uniform_pm1;
use super::schema::AccuracyCase;
use crate::formats::fp8::{self, Fp8Granularity};
use crate::formats::{bf16_round, nvfp4, GemmFormat};
use crate::gemm::check::{rel_l2, BF16_GEMM_REL_L2, FP8_GEMM_REL_L2, W4A16_GEMM_REL_L2};

const M: usize = 16;
const N: usize = 256;
const K: usize = 2048;

fn normal(i: u32, seed: u32) -> f32 {
    let u1 = (uniform_pm1(2 * i, seed) + 1.0) / 2.0; // [0, 1)
    let u2 = (uniform_pm1(2 * i + 1, seed) + 1.0) / 2.0;
    let r = (-2.0 * (1.0 - u1 as f64).ln()).sqrt();
    (r * (2.0 * std::f64::consts::PI * u2 as f64).cos()) as f32
}

fn gemm(a: &[f32], w: &[f32]) -> Vec<f64> {
    let mut c = vec![0f64; M * N];
    for m in 0..M {
        for n in 0..N {
            c[m * N + n] = (0..K)
                .map(|k| a[m * K + k] as f64 * w[n * K + k] as f64)
                .sum();
        }
    }
    c
}

fn quantized(format: GemmFormat, a: &[f32], w: &[f32]) -> (Vec<f32>, Vec<f32>) {
    match format {
        GemmFormat::Bf16 => (
            a.iter().map(|x| bf16_round(*x)).collect(),
            w.iter().map(|x| bf16_round(*x)).collect(),
        ),
        GemmFormat::Fp8 => {
            let qa = fp8::quantize(a, M, K, Fp8Granularity::PerTensor).map(|t| t.dequantize());
            let qw = fp8::quantize(w, N, K, Fp8Granularity::PerTensor).map(|t| t.dequantize());
            (qa.unwrap_or_default(), qw.unwrap_or_default())
        }
        GemmFormat::W4a16 => (
            a.iter().map(|x| bf16_round(*x)).collect(),
            nvfp4::quantize(w, N, K)
                .map(|t| t.dequantize())
                .unwrap_or_default(),
        ),
        GemmFormat::W4a4 => (
            nvfp4::quantize(a, M, K)
                .map(|t| t.dequantize())
                .unwrap_or_default(),
            nvfp4::quantize(w, N, K)
                .map(|t| t.dequantize())
                .unwrap_or_default(),
        ),
    }
}

/// Run the study: every format on both data sets.
pub fn study() -> Vec<AccuracyCase> {
    let w: Vec<f32> = (0..(N * K) as u32).map(|i| 0.02 * normal(i, 101)).collect();
    let a_plain: Vec<f32> = (0..(M * K) as u32).map(|i| normal(i, 202)).collect();
    let mut a_out = a_plain.clone();
    let outlier: Vec<bool> = (0..K)
        .map(|k| crate::kernels::data::hash32(k as u32 ^ 0xA5A5) % 100 == 0)
        .collect();
    for k in (0..K).filter(|k| outlier[*k]) {
        for m in 0..M {
            a_out[m * K + k] *= 30.0;
        }
    }
    // The product over the non-outlier channels (K indices), for the error that the outliers'
    // norm hides: the full product less the part summed over the (1%) outlier channels, all in
    // f64.
    let outlier_ks: Vec<usize> = (0..K).filter(|k| outlier[*k]).collect();
    let non_outlier = |full: &[f64], a: &[f32], w: &[f32]| -> Vec<f64> {
        let mut c = full.to_vec();
        for m in 0..M {
            for n in 0..N {
                c[m * N + n] -= outlier_ks
                    .iter()
                    .map(|&k| a[m * K + k] as f64 * w[n * K + k] as f64)
                    .sum::<f64>();
            }
        }
        c
    };
    let mut out = Vec::new();
    for (data_id, label, a) in [
        (
            "plain",
            "weights normal(0,0.02) seed 101; activations normal(0,1) seed 202",
            &a_plain,
        ),
        (
            "outliers",
            "as above, activations with 1% of channels ×30 (outliers)",
            &a_out,
        ),
    ] {
        let exact = gemm(a, &w);
        let exact_non = (data_id == "outliers").then(|| non_outlier(&exact, a, &w));
        for f in GemmFormat::ALL {
            let (qa, qw) = quantized(f, a, &w);
            let q = gemm(&qa, &qw);
            let err = rel_l2(&q, &exact);
            let err_non = exact_non
                .as_ref()
                .map(|e| rel_l2(&non_outlier(&q, &qa, &qw), e));
            let (tn, tol) = match f {
                GemmFormat::Bf16 => ("BF16_GEMM_REL_L2", Some(BF16_GEMM_REL_L2)),
                GemmFormat::Fp8 => ("FP8_GEMM_REL_L2", Some(FP8_GEMM_REL_L2)),
                GemmFormat::W4a16 => ("W4A16_GEMM_REL_L2", Some(W4A16_GEMM_REL_L2)),
                GemmFormat::W4a4 => ("none (emulated: accuracy only)", None),
            };
            out.push(AccuracyCase {
                format: f,
                shape: format!("{M}×{N}×{K}"),
                data: label.into(),
                data_id: data_id.into(),
                rel_l2_vs_exact: err,
                rel_l2_non_outlier: err_non,
                kernel_tolerance: tol,
                kernel_tolerance_name: tn.into(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_generator_has_unit_variance() {
        let v: Vec<f64> = (0..20_000).map(|i| normal(i, 9) as f64).collect();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(
            mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "mean {mean} var {var}"
        );
    }

    #[test]
    fn study_is_deterministic_and_ordered_by_precision() {
        let a = study();
        let b = study();
        assert_eq!(a, b);
        let err = |f: GemmFormat, i: usize| {
            a.iter()
                .filter(|c| c.format == f)
                .nth(i)
                .unwrap()
                .rel_l2_vs_exact
        };
        for set in 0..2 {
            assert!(
                err(GemmFormat::Bf16, set) < err(GemmFormat::Fp8, set),
                "set {set}"
            );
            assert!(
                err(GemmFormat::Fp8, set) < err(GemmFormat::W4a16, set),
                "set {set}"
            );
            assert!(
                err(GemmFormat::W4a16, set) < err(GemmFormat::W4a4, set),
                "set {set}"
            );
            assert!(err(GemmFormat::Bf16, set) < 1e-2);
            assert!(err(GemmFormat::W4a4, set) < 0.5);
        }
        // Each (format, data set) has its own stable data-set id.
        let mut keys: Vec<(GemmFormat, &str)> =
            a.iter().map(|c| (c.format, c.data_id.as_str())).collect();
        keys.sort_by_key(|(f, d)| (f.id(), d.to_string()));
        keys.dedup();
        assert_eq!(keys.len(), a.len());
        assert!(a
            .iter()
            .all(|c| ["plain", "outliers"].contains(&c.data_id.as_str())));
        // Outlier channels hurt per-tensor FP8 activations more than block-16 NVFP4 ones.
        assert!(err(GemmFormat::Fp8, 1) > err(GemmFormat::Fp8, 0));

        // The non-outlier error exists only for the outlier data set.
        let non = |f: GemmFormat, i: usize| {
            a.iter()
                .filter(|c| c.format == f)
                .nth(i)
                .unwrap()
                .rel_l2_non_outlier
        };
        for f in GemmFormat::ALL {
            assert_eq!(non(f, 0), None, "{f:?}");
        }
        // W4A4: the outlier is its block's maximum and comes out exact, the rest of its block
        // loses precision: the overall error (dominated by the outliers) hides that.
        let w4a4 = non(GemmFormat::W4a4, 1).unwrap();
        assert!(w4a4 > 1.5 * err(GemmFormat::W4a4, 1), "{w4a4}");
        assert!(w4a4 > err(GemmFormat::W4a4, 0), "{w4a4}");
        // Weight-only and BF16 formats quantize activations per element or not at all: the
        // non-outlier error is close to the overall one.
        for f in [GemmFormat::Bf16, GemmFormat::W4a16] {
            let r = non(f, 1).unwrap() / err(f, 1);
            assert!((0.8..1.2).contains(&r), "{f:?}: {r}");
        }
    }
}
