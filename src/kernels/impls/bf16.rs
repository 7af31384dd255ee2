//! `bf16`: cuBLASLt BF16 × BF16 → BF16 with FP32 accumulation (the baseline every speedup is
//! relative to).

use anyhow::Context;

use crate::formats::GemmFormat;
use crate::gemm::check::BF16_GEMM_REL_L2;
use crate::gemm::grid_for;
use crate::gpu::cublaslt::{LtGemm, LtKind};
use crate::gpu::ComputeCapability;
use crate::gpu::DevBuf;
use crate::kernels::data::bf16_uniform;
use crate::kernels::reference::sampled_gemm;
use crate::kernels::suite::Shape;
use crate::kernels::{Env, GemmImpl, MInputs};

/// Seed of the BF16 weights.
pub const SEED_W: u32 = 0xB16_0001;

/// The cuBLASLt BF16 implementation.
#[derive(Default)]
pub struct Bf16 {
    w: Option<DevBuf>,
    k: usize,
    gemm: Option<LtGemm>,
    /// Weight copies 1.. for graph timing (copy 0 is `w`).
    copies: Vec<DevBuf>,
}

impl Bf16 {
    fn weights(&self, copy: usize) -> anyhow::Result<&DevBuf> {
        super::pick_copy("bf16", self.w.as_ref(), &self.copies, copy)
    }

    fn run_with(&self, env: &Env, inp: &MInputs, w: &DevBuf) -> anyhow::Result<()> {
        let lt = env.lt.context("cuBLASLt is not available")?;
        let g = self.gemm.as_ref().context("bf16: prepare_m not called")?;
        g.run(lt, env.gpu, 1.0, w.ptr(), inp.act.ptr(), inp.out.ptr())?;
        Ok(())
    }
}

impl GemmImpl for Bf16 {
    fn id(&self) -> &'static str {
        "bf16"
    }
    fn format(&self) -> GemmFormat {
        GemmFormat::Bf16
    }
    fn unsupported(&self, cc: ComputeCapability, _shape: &Shape) -> Option<String> {
        (cc.as_int() < 80).then(|| format!("{cc} has no BF16 tensor cores (sm_80 and up)"))
    }
    fn prepare_shape(&mut self, env: &Env, shape: &Shape) -> anyhow::Result<()> {
        let n = shape.n * shape.k;
        let w = env.gpu.alloc(n * 2)?;
        crate::gpu::util_kernels::fill_uniform_bf16(
            env.util,
            env.gpu,
            grid_for(env.gpu, n),
            (256, 1, 1),
            0,
            &w,
            n,
            SEED_W,
            1.0,
        )?;
        env.gpu.sync()?;
        self.w = Some(w);
        self.k = shape.k;
        Ok(())
    }
    fn release_shape(&mut self) {
        self.copies.clear();
        self.w = None;
        self.gemm = None;
    }
    fn prepare_m(&mut self, env: &Env, inp: &MInputs) -> anyhow::Result<usize> {
        let lt = env.lt.context("cuBLASLt is not available")?;
        self.gemm = Some(LtGemm::plan(lt, LtKind::Bf16, inp.m, inp.n, inp.k)?);
        Ok(1)
    }
    fn select(&mut self, _i: usize) {}
    fn run(&self, env: &Env, inp: &MInputs) -> anyhow::Result<()> {
        self.run_with(env, inp, self.weights(0)?)
    }
    fn prepare_weight_copies(&mut self, env: &Env, count: usize) -> anyhow::Result<()> {
        self.copies.clear();
        self.copies = super::weight_copies(env, self.weights(0)?, count)?;
        Ok(())
    }
    fn run_on_copy(&self, env: &Env, inp: &MInputs, copy: usize) -> anyhow::Result<()> {
        self.run_with(env, inp, self.weights(copy)?)
    }
    fn release_weight_copies(&mut self) {
        self.copies.clear();
    }
    fn path(&self) -> String {
        self.gemm
            .as_ref()
            .map(|g| g.description.clone())
            .unwrap_or_default()
    }
    fn reference(
        &self,
        _env: &Env,
        inp: &MInputs,
        rows: &[usize],
        cols: &[usize],
    ) -> anyhow::Result<Vec<f64>> {
        let k = self.k;
        let w_row = |n: usize| -> Vec<f64> {
            (0..k)
                .map(|kk| bf16_uniform((n * k + kk) as u32, SEED_W, 1.0) as f64)
                .collect()
        };
        Ok(sampled_gemm(rows, cols, k, &|m| inp.act_row(m), &w_row))
    }
    fn tolerance(&self) -> (&'static str, f64) {
        ("BF16_GEMM_REL_L2", BF16_GEMM_REL_L2)
    }
}
