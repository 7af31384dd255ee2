//! The CUDA backend's check of its Gated-DeltaNet kernels against the CPU code, for `rigbench
//! devcheck --only hybrid` and `scripts/device/hybrid-check.sh`: [`gdn_kernels_match_cpu`] runs
//! the convolution and both delta-rule kernels on random inputs against
//! [`crate::runtime::gdn::mixer_core`] (BF16 rounding at the same points), at the model's
//! dimensions and at Qwen3.6-27B's (key and value heads of 128), outputs and states. The
//! whole-model hybrid checks and speed are in `runtime_eval::hybrid_check`. [`kernels_vs_cpu`]
//! runs the passes on the device, `mixer_reference` the same on the CPU, and `gdn_verdicts`
//! compares them.

use anyhow::Context;

use super::gdn::{GdnSeg, CHUNKED_THREADS};
use super::self_check::Check;
use super::{launchers, CudaBackend};
use crate::gpu::{dim, DevPtr};
use crate::runtime::gdn::GdnDims;
use crate::runtime::weights;

/// Largest rel L2 difference between the GDN kernels and the CPU reference (outputs and final
/// recurrent states): both round the convolution and mixer outputs to BF16 (unit roundoff
/// 2⁻⁸ ≈ 3.9e-3) and differ otherwise in FP32 summation order only, which flips some of those
/// roundings; 1e-2 allows them and catches any algebra error (a wrong decay, head mapping or
/// state hand-over moves outputs by more than 1e-1).
pub const GDN_KERNEL_REL_L2: f64 = 1e-2;

/// The GPU layer's one relative L2 error ([`crate::gemm::check::rel_l2`]: output under test
/// first, reference second, any non-finite value infinite).
pub use crate::gemm::check::rel_l2;

/// The GDN kernels against the CPU on random inputs: at the dimensions of `b`'s model and at
/// Qwen3.6-27B's per-head shape (2 key heads and 6 value heads of 128, kernel 4). Two passes:
/// (1) a 70-token prefill segment (chunked form) reset, beside a 3-token verification segment
/// (recurrent form) on another slot; (2) one decode token continuing the first slot.
///
/// # Errors
/// A device failure.
pub fn gdn_kernels_match_cpu(b: &CudaBackend) -> anyhow::Result<Vec<Check>> {
    let model = b
        .config
        .hybrid
        .as_ref()
        .map(GdnDims::from)
        .ok_or_else(|| anyhow::anyhow!("not a hybrid"))?;
    let big = GdnDims {
        nk: 2,
        nv: 6,
        dk: 128,
        dv: 128,
        kernel: 4,
    };
    let mut out = Vec::new();
    for (name, d) in [("model dims", model), ("27B head dims", big)] {
        out.extend(kernels_vs_cpu(b, &d, name)?);
    }
    Ok(out)
}

pub(super) fn check(name: String, err: f64, limit: f64, what: &str) -> Check {
    Check {
        pass: err.is_finite() && err <= limit,
        detail: format!("{what} rel L2 {err:.2e} (limit {limit:.0e})"),
        name,
    }
}

pub(super) fn rel(a: &[f32], b: &[f32]) -> f64 {
    rel_l2(a, b)
}

/// Shared memory of `gdn_chunked` for `chunk` rows at dims `d`, bytes.
fn chunked_smem(d: &GdnDims, chunk: usize) -> usize {
    4 * (3 * chunk * d.dk + chunk * d.dv + chunk * chunk + 2 * chunk + d.dk * d.dv)
}

/// The convolution and both delta-rule kernels against [`crate::runtime::gdn::mixer_core`] on
/// random inputs at dims `d` (see [`super::hybrid_check::gdn_kernels_match_cpu`]).
pub(super) fn kernels_vs_cpu(
    b: &CudaBackend,
    d: &GdnDims,
    name: &str,
) -> anyhow::Result<Vec<super::self_check::Check>> {
    use crate::runtime::gdn::GdnParams;
    let hy = b.hy.as_ref().context("not a hybrid backend")?;
    let gpu = &b.gpu;
    let (c, nv, vd) = (d.conv_dim(), d.nv, d.value_dim());
    let t = 74usize;
    let mut rng = weights::SplitMix64::new(0x6D_4E_7E);
    let mut normals = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| crate::formats::bf16_round(rng.normal_pair().0 * scale))
            .collect()
    };
    let x = normals(t * c, 1.0);
    let ab = normals(t * 2 * nv, 1.0);
    let conv_w = normals(c * d.kernel, 0.5);
    let a_log = normals(nv, 0.5)
        .iter()
        .map(|v| v - 1.0)
        .collect::<Vec<f32>>();
    let dt_bias = normals(nv, 0.5);
    let bf = |v: &[f32]| crate::formats::to_bf16_bits(v);
    let dx = gpu.upload(&bf(&x))?;
    let dab = gpu.upload(&bf(&ab))?;
    let dw = gpu.upload(&conv_w)?;
    let dal = gpu.upload(&a_log)?;
    let ddt = gpu.upload(&dt_bias)?;
    let slots = 2usize;
    let conv_state = gpu.alloc(slots * d.conv_state_len() * 2)?;
    let ssm = gpu.alloc(slots * d.ssm_state_len() * 4)?;
    gpu.memset(&conv_state, 0)?;
    gpu.memset(&ssm, 0)?;
    let mixed = gpu.alloc(t * c * 2)?;
    let out = gpu.alloc(t * vd * 2)?;
    let segs = gpu.alloc(3 * 4 * 16)?;
    let smem = chunked_smem(d, hy.chunk);
    if smem > 48 << 10 {
        hy.module.set_max_dynamic_smem("gdn_chunked", smem as u32)?;
    }
    let run = |all: &[GdnSeg], rec: &[GdnSeg], chunked: &[GdnSeg]| -> anyhow::Result<()> {
        for (i, list) in [all, rec, chunked].into_iter().enumerate() {
            let flat: Vec<i32> = list.iter().flatten().copied().collect();
            gpu.write(&segs, i * 4 * 16, &flat)?;
        }
        launchers::gdn::gdn_conv_silu(
            &hy.module,
            gpu,
            (
                dim("c.div_ceil(128)", c.div_ceil(128))?,
                dim("all.len()", all.len())?,
                1,
            ),
            (128, 1, 1),
            0,
            &dx,
            c,
            c,
            d.kernel,
            &dw,
            &segs,
            &conv_state,
            &mixed,
        )?;
        if !rec.is_empty() {
            launchers::gdn::gdn_recurrent(
                &hy.module,
                gpu,
                (dim("nv", nv)?, dim("recurrent segments", rec.len())?, 1),
                (dim("4·dv", 4 * d.dv)?, 1, 1),
                0,
                &mixed,
                &dab,
                &dal,
                &ddt,
                DevPtr::at(segs.ptr() + 4 * 16),
                d.nk,
                d.nv,
                d.dk,
                d.dv,
                &ssm,
                &out,
            )?;
        }
        if !chunked.is_empty() {
            launchers::gdn::gdn_chunked(
                &hy.module,
                gpu,
                (dim("nv", nv)?, dim("chunked segments", chunked.len())?, 1),
                (CHUNKED_THREADS, 1, 1),
                dim("shared memory bytes", smem)?,
                &mixed,
                &dab,
                &dal,
                &ddt,
                DevPtr::at(segs.ptr() + 2 * 4 * 16),
                d.nk,
                d.nv,
                d.dk,
                d.dv,
                hy.chunk,
                &ssm,
                &out,
            )?;
        }
        gpu.sync()?;
        Ok(())
    };
    // Pass 1: a 70-token prefill (slot 0, chunked) and a 3-token verification (slot 1).
    let (pre, ver) = ([0, 70, 0, 1], [70, 3, 1, 1]);
    run(&[pre, ver], &[ver], &[pre])?;
    // Pass 2: one decode token continuing slot 0.
    let dec = [73, 1, 0, 0];
    run(&[dec], &[dec], &[])?;
    let got_out: Vec<f32> =
        crate::formats::from_bf16_bits(&gpu.download::<u16>(&out, 0, t * vd)?);
    let got_ssm: Vec<f32> = gpu.download(&ssm, 0, slots * d.ssm_state_len())?;
    let got_conv: Vec<f32> = crate::formats::from_bf16_bits(&gpu.download::<u16>(
        &conv_state,
        0,
        slots * d.conv_state_len(),
    )?);
    // The CPU reference.
    let p = GdnParams {
        conv_w: &conv_w,
        a_log: &a_log,
        dt_bias: &dt_bias,
    };
    let (want_out, want_ssm, want_conv) = mixer_reference(d, hy.chunk, t, &x, &ab, &p);
    Ok(gdn_verdicts(
        d,
        name,
        (&got_out, &got_ssm, &got_conv),
        (&want_out, &want_ssm, &want_conv),
    ))
}

/// The CPU reference of [`kernels_vs_cpu`]'s passes over `t` tokens: the 70-token chunked
/// prefill and 3-token verification, then one decode token continuing slot 0. Returns the
/// mixer outputs and both slots' recurrent and convolution states.
fn mixer_reference(
    d: &GdnDims,
    chunk: usize,
    t: usize,
    x: &[f32],
    ab: &[f32],
    p: &crate::runtime::gdn::GdnParams<'_>,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    use crate::runtime::gdn::{self as g, Form, GdnLayerState};
    let (c, nv, vd) = (d.conv_dim(), d.nv, d.value_dim());
    let split = |r0: usize, r1: usize| {
        let mut a = Vec::new();
        let mut bb = Vec::new();
        for r in r0..r1 {
            a.extend_from_slice(&ab[r * 2 * nv..r * 2 * nv + nv]);
            bb.extend_from_slice(&ab[r * 2 * nv + nv..(r + 1) * 2 * nv]);
        }
        (a, bb)
    };
    let mut want_out = vec![0f32; t * vd];
    let mut s0 = GdnLayerState::zeros(d);
    let mut s1 = GdnLayerState::zeros(d);
    for (r0, r1, st, form) in [
        (0usize, 70usize, 0usize, Form::Chunked(chunk)),
        (70, 73, 1, Form::Recurrent),
        (73, 74, 0, Form::Recurrent),
    ] {
        let (a, bb) = split(r0, r1);
        let state = if st == 0 { &mut s0 } else { &mut s1 };
        let o = g::mixer_core(
            d,
            p,
            &x[r0 * c..r1 * c],
            &a,
            &bb,
            r1 - r0,
            state,
            form,
            true,
            4,
        );
        want_out[r0 * vd..r1 * vd].copy_from_slice(&o);
    }
    let mut want_ssm = s0.ssm.clone();
    want_ssm.extend_from_slice(&s1.ssm);
    let mut want_conv = s0.conv.clone();
    want_conv.extend_from_slice(&s1.conv);
    (want_out, want_ssm, want_conv)
}

/// The verdicts of [`kernels_vs_cpu`] (`got` from the GPU, `want` from the CPU; each as
/// outputs, recurrent states, convolution states): outputs and recurrent states within
/// [`super::hybrid_check::GDN_KERNEL_REL_L2`], convolution states exactly equal.
fn gdn_verdicts(
    d: &GdnDims,
    name: &str,
    (got_out, got_ssm, got_conv): (&[f32], &[f32], &[f32]),
    (want_out, want_ssm, want_conv): (&[f32], &[f32], &[f32]),
) -> Vec<super::self_check::Check> {
    let tag = |what: &str| {
        format!(
            "Gated-DeltaNet {what} ({name}: {}×{} key, {}×{} value heads)",
            d.nk, d.dk, d.nv, d.dv
        )
    };
    vec![
        check(
            tag("outputs: chunked prefill, recurrent verification and decode"),
            rel(got_out, want_out),
            GDN_KERNEL_REL_L2,
            "mixer output",
        ),
        check(
            tag("recurrent states"),
            rel(got_ssm, want_ssm),
            GDN_KERNEL_REL_L2,
            "state",
        ),
        super::self_check::Check {
            name: tag("convolution states"),
            pass: got_conv == want_conv,
            detail: format!(
                "{} of {} elements equal (exact: both keep the last inputs)",
                got_conv
                    .iter()
                    .zip(want_conv)
                    .filter(|(a, b)| a == b)
                    .count(),
                want_conv.len()
            ),
        },
    ]
}
