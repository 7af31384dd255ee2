//! `fp8`: cuBLASLt FP8 E4M3 W8A8 (TN), FP32 per-tensor scales through the scale pointers, BF16
//! output. Activations are quantized dynamically per tensor (`scale = amax / 448`, vLLM's
//! `scaled_fp8_quant` rule) by rigbench's kernels; that cost is timed separately as
//! `activation_quant`, and the GEMM is timed on already-quantized activations.

use anyhow::Context;

use crate::formats::{e4m3, GemmFormat};
use crate::gemm::check::FP8_GEMM_REL_L2;
use crate::gemm::grid_for;
use crate::gpu::cublaslt::{LtGemm, LtKind};
use crate::gpu::ComputeCapability;
use crate::gpu::DevBuf;
use crate::kernels::data::{bf16_uniform, fp8_code};
use crate::kernels::reference::sampled_gemm;
use crate::kernels::suite::Shape;
use crate::kernels::{Env, GemmImpl, MInputs};

/// Seed of the FP8 weight codes.
pub const SEED_W: u32 = 0xF8_0001;
/// Per-tensor scale of the FP8 weights.
pub const W_SCALE: f32 = 1.0 / 64.0;

/// The cuBLASLt FP8 implementation.
#[derive(Default)]
pub struct Fp8 {
    w: Option<DevBuf>,
    w_scale: Option<DevBuf>,
    k: usize,
    qa: Option<DevBuf>,
    amax: Option<DevBuf>,
    a_scale: Option<DevBuf>,
    gemm: Option<LtGemm>,
    /// Weight copies 1.. for graph timing (copy 0 is `w`; the per-tensor scale is shared).
    copies: Vec<DevBuf>,
}

impl Fp8 {
    fn weights(&self, copy: usize) -> anyhow::Result<&DevBuf> {
        super::pick_copy("fp8", self.w.as_ref(), &self.copies, copy)
    }

    fn run_with(&self, env: &Env, inp: &MInputs, w: &DevBuf) -> anyhow::Result<()> {
        let lt = env.lt.context("cuBLASLt is not available")?;
        let g = self.gemm.as_ref().context("fp8: prepare_m not called")?;
        let qa = self.qa.as_ref().context("fp8: prepare_m not called")?;
        g.run(lt, env.gpu, 1.0, w.ptr(), qa.ptr(), inp.out.ptr())?;
        Ok(())
    }

    fn quantize(&self, env: &Env, inp: &MInputs) -> anyhow::Result<()> {
        let (qa, amax, sc) = (
            self.qa.as_ref().context("fp8: no buffers")?,
            self.amax.as_ref().context("fp8: no buffers")?,
            self.a_scale.as_ref().context("fp8: no buffers")?,
        );
        let n = inp.m * inp.k;
        env.gpu.memset(amax, 0)?;
        crate::gpu::util_kernels::fp8_amax_bf16(
            env.util,
            env.gpu,
            grid_for(env.gpu, n),
            (256, 1, 1),
            0,
            &inp.act,
            n,
            amax,
        )?;
        crate::gpu::util_kernels::fp8_quant_bf16(
            env.util,
            env.gpu,
            grid_for(env.gpu, n),
            (256, 1, 1),
            0,
            &inp.act,
            n,
            amax,
            qa,
            sc,
        )?;
        Ok(())
    }
}

impl GemmImpl for Fp8 {
    fn id(&self) -> &'static str {
        "fp8"
    }
    fn format(&self) -> GemmFormat {
        GemmFormat::Fp8
    }
    fn unsupported(&self, cc: ComputeCapability, shape: &Shape) -> Option<String> {
        if cc.as_int() < 89 {
            return Some(format!(
                "{cc} has no FP8 tensor cores (sm_89 and up); cuBLASLt FP8 does not run"
            ));
        }
        (shape.k % 16 != 0).then(|| {
            format!(
                "cuBLASLt FP8 needs K to be a multiple of 16; K = {}",
                shape.k
            )
        })
    }
    fn prepare_shape(&mut self, env: &Env, shape: &Shape) -> anyhow::Result<()> {
        let n = shape.n * shape.k;
        let w = env.gpu.alloc(n)?;
        crate::gpu::util_kernels::fill_fp8_codes(
            env.util,
            env.gpu,
            grid_for(env.gpu, n),
            (256, 1, 1),
            0,
            &w,
            n,
            SEED_W,
        )?;
        self.w_scale = Some(env.gpu.upload(&[W_SCALE])?);
        env.gpu.sync()?;
        self.w = Some(w);
        self.k = shape.k;
        Ok(())
    }
    fn release_shape(&mut self) {
        *self = Self::default();
    }
    fn prepare_m(&mut self, env: &Env, inp: &MInputs) -> anyhow::Result<usize> {
        let lt = env.lt.context("cuBLASLt is not available")?;
        self.qa = Some(env.gpu.alloc(inp.m * inp.k)?);
        self.amax = Some(env.gpu.alloc(4)?);
        self.a_scale = Some(env.gpu.alloc(4)?);
        self.quantize(env, inp)?;
        env.gpu.sync()?;
        let kind = LtKind::Fp8 {
            w_scale_ptr: self.w_scale.as_ref().context("fp8: no weights")?.ptr(),
            a_scale_ptr: self.a_scale.as_ref().context("fp8: no buffers")?.ptr(),
        };
        self.gemm = Some(LtGemm::plan(lt, kind, inp.m, inp.n, inp.k)?);
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
            .map(|g| {
                format!(
                    "{}; activations quantized per tensor (amax/448) by rigbench, timed separately",
                    g.description
                )
            })
            .unwrap_or_default()
    }
    fn extra_parts(&self) -> Vec<&'static str> {
        vec!["activation_quant"]
    }
    fn run_extra(&self, env: &Env, inp: &MInputs, part: &str) -> anyhow::Result<()> {
        match part {
            "activation_quant" => self.quantize(env, inp),
            other => anyhow::bail!("fp8 has no part '{other}'"),
        }
    }
    fn reference(
        &self,
        env: &Env,
        inp: &MInputs,
        rows: &[usize],
        cols: &[usize],
    ) -> anyhow::Result<Vec<f64>> {
        let (m, k) = (inp.m, inp.k);
        // The activation scale from the whole tensor, as the GPU computes it.
        let threads = crate::kernels::data::host_threads();
        let per = m.div_ceil(threads).max(1);
        let amax = std::thread::scope(|s| {
            let hs: Vec<_> = (0..m)
                .step_by(per)
                .map(|r0| {
                    s.spawn(move || {
                        let mut a = 0f32;
                        for i in r0 * k..(r0 + per).min(m) * k {
                            a = a.max(bf16_uniform(i as u32, inp.seed_a, 1.0).abs());
                        }
                        a
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or(f32::NAN))
                .fold(0f32, f32::max)
        });
        let s = if amax > 0.0 { amax / 448.0 } else { 1.0 };
        let gpu_s: f32 =
            env.gpu
                .download(self.a_scale.as_ref().context("fp8: no buffers")?, 0, 1)?[0];
        anyhow::ensure!(
            gpu_s == s,
            "GPU activation scale {gpu_s:e} differs from the CPU's {s:e} (amax {amax:e} / 448)"
        );
        let inv = 1.0 / s;
        let a_row = |row: usize| -> Vec<f64> {
            (0..k)
                .map(|kk| {
                    let a = bf16_uniform((row * k + kk) as u32, inp.seed_a, 1.0);
                    e4m3::decode(e4m3::encode(a * inv)) as f64 * s as f64
                })
                .collect()
        };
        let w_row = |n: usize| -> Vec<f64> {
            (0..k)
                .map(|kk| {
                    e4m3::decode(fp8_code((n * k + kk) as u32, SEED_W)) as f64 * W_SCALE as f64
                })
                .collect()
        };
        Ok(sampled_gemm(rows, cols, k, &a_row, &w_row))
    }
    fn tolerance(&self) -> (&'static str, f64) {
        ("FP8_GEMM_REL_L2", FP8_GEMM_REL_L2)
    }
}
