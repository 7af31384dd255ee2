//! `w4a4`: native NVFP4 × NVFP4 needs FP4 tensor cores (sm_100 and up). Below that it is
//! recorded as skipped with the reason; nothing emulated is ever timed (the CPU accuracy study in
//! [`crate::kernels::accuracy`] covers W4A4's numerics).

use crate::formats::GemmFormat;
use crate::kernels::suite::Shape;
use crate::kernels::{Env, GemmImpl, MInputs};
use crate::rig::capability::has_fp4_tensor_cores;
use crate::rig::ComputeCapability;

/// The native W4A4 NVFP4 implementation.
pub struct W4a4;

impl GemmImpl for W4a4 {
    fn id(&self) -> &'static str {
        "w4a4"
    }
    fn format(&self) -> GemmFormat {
        GemmFormat::W4a4
    }
    fn unsupported(&self, cc: ComputeCapability, _shape: &Shape) -> Option<String> {
        if !has_fp4_tensor_cores(cc) {
            return Some(format!(
                "unsupported on this card: {cc} has no FP4 tensor cores (they start at sm_100); native W4A4 NVFP4 cannot run here, engines fall back to W4A16, and rigbench does not time emulation"
            ));
        }
        Some(format!(
            "{cc} has FP4 tensor cores, but this rigbench build has no native W4A4 kernel yet (cuBLASLt block-scaled FP4 path pending)"
        ))
    }
    fn prepare_shape(&mut self, _env: &Env, _shape: &Shape) -> anyhow::Result<()> {
        anyhow::bail!("w4a4 is not runnable in this build")
    }
    fn release_shape(&mut self) {}
    fn prepare_m(&mut self, _env: &Env, _inp: &MInputs) -> anyhow::Result<usize> {
        anyhow::bail!("w4a4 is not runnable in this build")
    }
    fn select(&mut self, _i: usize) {}
    fn run(&self, _env: &Env, _inp: &MInputs) -> anyhow::Result<()> {
        anyhow::bail!("w4a4 is not runnable in this build")
    }
    fn path(&self) -> String {
        String::new()
    }
    fn reference(
        &self,
        _env: &Env,
        _inp: &MInputs,
        _r: &[usize],
        _c: &[usize],
    ) -> anyhow::Result<Vec<f64>> {
        anyhow::bail!("w4a4 is not runnable in this build")
    }
    fn tolerance(&self) -> (&'static str, f64) {
        ("W4A4_GEMM_REL_L2", 5e-3)
    }
}
