//! `w4a4`: native NVFP4 × NVFP4 through cuBLASLt's block-scaled FP4 path (E2M1 operands, UE4M3
//! scales per 16 elements, FP32 accumulate, BF16 out), which needs FP4 tensor cores (sm_100 and
//! up). Below that it is recorded as skipped with the reason; nothing emulated is ever timed (the
//! CPU accuracy study in [`crate::kernels::accuracy`] covers W4A4's numerics).
//!
//! Weights: ModelOpt NVFP4 (packed `[N, K/2]`, low nibble first), block scales swizzled into
//! cuBLASLt's interleaved layout ([`crate::formats::nvfp4::swizzle_block_scales`]). Activations:
//! quantized to NVFP4 on the host with ModelOpt's math (dynamic per-tensor and per-block scales)
//! and uploaded; that quantization is not timed and the report says so. `alpha` carries the
//! product of the two FP32 per-tensor scales.

use anyhow::Context;

use crate::formats::nvfp4::{self, swizzle_block_scales, Nvfp4Weight};
use crate::formats::GemmFormat;
use crate::gemm::check::W4A4_GEMM_REL_L2;
use crate::gpu::cublaslt::{LtGemm, LtKind};
use crate::gpu::ComputeCapability;
use crate::gpu::DevBuf;
use crate::kernels::data::{host_threads, nvfp4_weight};
use crate::kernels::reference::sampled_gemm;
use crate::kernels::suite::Shape;
use crate::kernels::{Env, GemmImpl, MInputs};
use crate::rig::capability::has_fp4_tensor_cores;

/// Seed of the NVFP4 weights (same generator as `w4a16`, another seed).
pub const SEED_W: u32 = 0x4A04_0001;

/// The native W4A4 NVFP4 implementation.
#[derive(Default)]
pub struct W4a4 {
    w: Option<Nvfp4Weight>,
    w_packed: Option<DevBuf>,
    w_scales: Option<DevBuf>,
    a: Option<Nvfp4Weight>,
    a_packed: Option<DevBuf>,
    a_scales: Option<DevBuf>,
    gemm: Option<LtGemm>,
}

impl GemmImpl for W4a4 {
    fn id(&self) -> &'static str {
        "w4a4"
    }
    fn format(&self) -> GemmFormat {
        GemmFormat::W4a4
    }
    fn unsupported(&self, cc: ComputeCapability, shape: &Shape) -> Option<String> {
        if !has_fp4_tensor_cores(cc) {
            // The capability table's word (fallback on sm_80–sm_90, unsupported below).
            let cap = crate::rig::capability::capability(cc, GemmFormat::W4a4);
            let via = if cap.support == crate::rig::Support::Fallback {
                "; engines run W4A4 NVFP4 checkpoints as W4A16, which the w4a16 column measures"
            } else {
                ""
            };
            return Some(format!(
                "{} on this card: {}; native W4A4 NVFP4 is not timed{via}, and rigbench does not time an emulation",
                cap.support, cap.reason
            ));
        }
        (shape.k % 32 != 0).then(|| {
            format!(
                "cuBLASLt FP4 needs K to be a multiple of 32; K = {}",
                shape.k
            )
        })
    }
    fn prepare_shape(&mut self, env: &Env, shape: &Shape) -> anyhow::Result<()> {
        let w = nvfp4_weight(shape.n, shape.k, SEED_W, host_threads());
        self.w_packed = Some(env.gpu.upload(&w.packed)?);
        self.w_scales = Some(env.gpu.upload(&swizzle_block_scales(
            &w.block_scales,
            w.n,
            w.k / 16,
        )?)?);
        self.w = Some(w);
        Ok(())
    }
    fn release_shape(&mut self) {
        *self = Self::default();
    }
    fn prepare_m(&mut self, env: &Env, inp: &MInputs) -> anyhow::Result<usize> {
        let lt = env.lt.context("cuBLASLt is not available")?;
        let mut act = Vec::with_capacity(inp.m * inp.k);
        for row in 0..inp.m {
            act.extend(inp.act_row(row).into_iter().map(|v| v as f32));
        }
        let a = nvfp4::quantize(&act, inp.m, inp.k)?;
        self.a_packed = Some(env.gpu.upload(&a.packed)?);
        self.a_scales = Some(env.gpu.upload(&swizzle_block_scales(
            &a.block_scales,
            a.n,
            a.k / 16,
        )?)?);
        self.a = Some(a);
        let kind = LtKind::Nvfp4 {
            w_block_scales_ptr: self.w_scales.as_ref().context("w4a4: no weights")?.ptr(),
            a_block_scales_ptr: self
                .a_scales
                .as_ref()
                .context("w4a4: no activations")?
                .ptr(),
        };
        self.gemm = Some(LtGemm::plan(lt, kind, inp.m, inp.n, inp.k)?);
        Ok(1)
    }
    fn select(&mut self, _i: usize) {}
    fn run(&self, env: &Env, inp: &MInputs) -> anyhow::Result<()> {
        let lt = env.lt.context("cuBLASLt is not available")?;
        let (w, a) = (
            self.w.as_ref().context("w4a4: no weights")?,
            self.a.as_ref().context("w4a4: no activations")?,
        );
        let g = self.gemm.as_ref().context("w4a4: prepare_m not called")?;
        g.run(
            lt,
            env.gpu,
            w.global_scale * a.global_scale,
            self.w_packed.as_ref().context("w4a4: no weights")?.ptr(),
            self.a_packed
                .as_ref()
                .context("w4a4: no activations")?
                .ptr(),
            inp.out.ptr(),
        )?;
        Ok(())
    }
    fn path(&self) -> String {
        self.gemm
            .as_ref()
            .map(|g| {
                format!(
                    "{}; activations quantized to NVFP4 on the host (not timed)",
                    g.description
                )
            })
            .unwrap_or_default()
    }
    fn reference(
        &self,
        _env: &Env,
        inp: &MInputs,
        rows: &[usize],
        cols: &[usize],
    ) -> anyhow::Result<Vec<f64>> {
        let (w, a) = (
            self.w.as_ref().context("w4a4: no weights")?,
            self.a.as_ref().context("w4a4: no activations")?,
        );
        let k = inp.k;
        Ok(sampled_gemm(
            rows,
            cols,
            k,
            &|m| (0..k).map(|kk| a.value_f64(m, kk)).collect(),
            &|n| (0..k).map(|kk| w.value_f64(n, kk)).collect(),
        ))
    }
    fn tolerance(&self) -> (&'static str, f64) {
        ("W4A4_GEMM_REL_L2", W4A4_GEMM_REL_L2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_with_the_reason_below_sm100_and_offered_from_sm100() {
        let shape = Shape {
            name: "q".into(),
            n: 128,
            k: 5120,
            note: String::new(),
            per_step: None,
        };
        let r = W4a4::default()
            .unsupported(ComputeCapability::new(9, 0), &shape)
            .unwrap();
        assert!(
            r.contains("sm_90") && r.contains("no FP4 tensor cores"),
            "{r}"
        );
        // One word per card: the capability table's (fallback on sm_90, unsupported on sm_75).
        assert!(
            r.starts_with("fallback on this card") && !r.contains("unsupported"),
            "{r}"
        );
        let r75 = W4a4::default()
            .unsupported(ComputeCapability::new(7, 5), &shape)
            .unwrap();
        assert!(r75.starts_with("unsupported on this card"), "{r75}");
        for cc in [(10, 0), (10, 3), (12, 0), (12, 1)] {
            assert!(W4a4::default()
                .unsupported(ComputeCapability::new(cc.0, cc.1), &shape)
                .is_none());
        }
        let odd = Shape { k: 48, ..shape };
        assert!(W4a4::default()
            .unsupported(ComputeCapability::new(10, 0), &odd)
            .unwrap()
            .contains("multiple of 32"));
    }
}
