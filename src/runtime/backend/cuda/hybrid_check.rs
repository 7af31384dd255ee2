//! The CUDA backend's check of its Gated-DeltaNet kernels against the CPU code, for `rigbench
//! devcheck --only hybrid` and `scripts/device/hybrid-check.sh`: [`gdn_kernels_match_cpu`] runs
//! the convolution and both delta-rule kernels on random inputs against
//! [`crate::runtime::gdn::mixer_core`] (BF16 rounding at the same points), at the model's
//! dimensions and at Qwen3.6-27B's (key and value heads of 128), outputs and states. The
//! whole-model hybrid checks and speed are in `runtime_eval::hybrid_check`.

use super::self_check::Check;
use super::CudaBackend;
use crate::runtime::gdn::GdnDims;

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
        out.extend(super::gdn::kernels_vs_cpu(b, &d, name)?);
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
