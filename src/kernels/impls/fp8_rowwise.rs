//! `fp8-rowwise`: FP8 E4M3 W8A8 as the built-in runtime runs it, through the same GEMM layer
//! ([`crate::gemm::ops`]: its quantization kernel, cuBLASLt plans and epilogue): the
//! activations quantized per token (one FP32 scale per row, [`crate::gemm::fp8_quant`]), the
//! weights with one FP32 scale per output channel, BF16 output. Two ways to apply the scales are
//! offered to the bench's tuner, as the runtime measures them: inside cuBLASLt (outer-vector
//! scales, `CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F`), or an FP32-output GEMM with unit scales
//! followed by the scaling kernel (`fp8_rowwise_scale_out`). The per-token quantization is timed
//! separately as `activation_quant` (once per GEMM, as each linear quantizes its own input) and
//! enters the composite; the fused RMSNorm + quantization is timed beside it as `rmsnorm_quant`
//! (what an engine pays for the linears that follow a norm; not in the composite).

use anyhow::Context;

use crate::formats::{e4m3, GemmFormat};
use crate::gemm::check::FP8_GEMM_REL_L2;
use crate::gemm::fp8_quant;
use crate::gemm::grid_for;
use crate::gemm::ops::{self, Fp8Scaling};
use crate::gpu::cublaslt::LtGemm;
use crate::gpu::ComputeCapability;
use crate::gpu::DevBuf;
use crate::kernels::data::{bf16_uniform, fp8_code, hash32};
use crate::kernels::reference::sampled_gemm;
use crate::kernels::suite::Shape;
use crate::kernels::{Env, GemmImpl, MInputs};

/// Implementation id.
pub const ID: &str = "fp8-rowwise";
/// Name of the fused RMSNorm + quantization part.
pub const RMSNORM_QUANT: &str = "rmsnorm_quant";
/// RMSNorm epsilon of the fused part (Qwen3's `rms_norm_eps`).
pub const RMS_EPS: f32 = 1e-6;

/// Per-channel weight scale of output row `n`: `2⁻⁶ · (1 + j/8)`, `j = hash(n) mod 8` (exact in
/// FP32, different across channels so that a wrong channel index shows in the check).
pub fn channel_scale(n: usize) -> f32 {
    (1.0 + (hash32(n as u32 ^ 0x5CA1E) % 8) as f32 / 8.0) / 64.0
}

/// Norm weight `k` of the fused part: `0.5 + j/16`, `j = hash(k) mod 16`.
pub fn norm_weight(k: usize) -> f32 {
    0.5 + (hash32(k as u32 ^ 0x0A0B) % 16) as f32 / 16.0
}

/// The row-wise FP8 implementation.
#[derive(Default)]
pub struct Fp8RowWise {
    w: Option<DevBuf>,
    w_scales: Option<DevBuf>,
    one: Option<DevBuf>,
    norm_w: Option<DevBuf>,
    qa: Option<DevBuf>,
    a_scales: Option<DevBuf>,
    qa2: Option<DevBuf>,
    a_scales2: Option<DevBuf>,
    acc: Option<DevBuf>,
    ways: Vec<(Fp8Scaling, LtGemm)>,
    chosen: usize,
    copies: Vec<DevBuf>,
}

impl Fp8RowWise {
    fn weights(&self, copy: usize) -> anyhow::Result<&DevBuf> {
        super::pick_copy(ID, self.w.as_ref(), &self.copies, copy)
    }

    /// The GEMM half, as the runtime runs it ([`ops::fp8_rowwise_gemm`]) on weight copy `w`.
    fn run_with(&self, env: &Env, inp: &MInputs, w: &DevBuf) -> anyhow::Result<()> {
        let lt = env.lt.context("cuBLASLt is not available")?;
        let (way, g) = self
            .ways
            .get(self.chosen)
            .context("fp8-rowwise: prepare_m not called")?;
        let missing = || anyhow::anyhow!("fp8-rowwise: no buffers");
        let args = ops::Fp8RowWiseArgs {
            m: inp.m,
            n: inp.n,
            k: inp.k,
            w: w.ptr(),
            w_scales: self.w_scales.as_ref().ok_or_else(missing)?.ptr(),
            qa: self.qa.as_ref().ok_or_else(missing)?.ptr(),
            a_scales: self.a_scales.as_ref().ok_or_else(missing)?.ptr(),
            out: inp.out.ptr(),
            acc: self.acc.as_ref().map(|a| (a.ptr(), a.bytes())),
            one: self.one.as_ref().ok_or_else(missing)?.ptr(),
        };
        ops::fp8_rowwise_gemm(env.gpu, lt, env.fp8q, g, *way, &args)
    }

    fn quantize(&self, env: &Env, inp: &MInputs, fused: bool) -> anyhow::Result<()> {
        let fq = env.fp8q.context("kernels/fp8_quant.cu did not compile")?;
        if fused {
            fp8_quant::launch_rmsnorm_quant_rows(
                env.gpu,
                fq,
                inp.act.ptr(),
                self.norm_w.as_ref().context("no norm weights")?.ptr(),
                RMS_EPS,
                inp.m,
                inp.k,
                self.qa2.as_ref().context("no buffers")?.ptr(),
                self.a_scales2.as_ref().context("no buffers")?.ptr(),
            )
        } else {
            fp8_quant::launch_quant_rows(
                env.gpu,
                fq,
                inp.act.ptr(),
                inp.m,
                inp.k,
                0.0,
                self.qa.as_ref().context("no buffers")?.ptr(),
                self.a_scales.as_ref().context("no buffers")?.ptr(),
            )
        }
    }
}

impl GemmImpl for Fp8RowWise {
    fn id(&self) -> &'static str {
        ID
    }
    fn format(&self) -> GemmFormat {
        GemmFormat::Fp8
    }
    fn unsupported(&self, cc: ComputeCapability, shape: &Shape) -> Option<String> {
        super::fp8::Fp8::default().unsupported(cc, shape)
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
            super::fp8::SEED_W,
        )?;
        let scales: Vec<f32> = (0..shape.n).map(channel_scale).collect();
        self.w_scales = Some(env.gpu.upload(&scales)?);
        let nw: Vec<f32> = (0..shape.k).map(norm_weight).collect();
        self.norm_w = Some(env.gpu.upload(&nw)?);
        self.one = Some(env.gpu.upload(&[1.0f32])?);
        env.gpu.sync()?;
        self.w = Some(w);
        Ok(())
    }
    fn release_shape(&mut self) {
        *self = Self::default();
    }
    fn prepare_m(&mut self, env: &Env, inp: &MInputs) -> anyhow::Result<usize> {
        let lt = env.lt.context("cuBLASLt is not available")?;
        anyhow::ensure!(
            env.fp8q.is_some(),
            "kernels/fp8_quant.cu did not compile (see the notes)"
        );
        self.qa = Some(env.gpu.alloc(inp.m * inp.k)?);
        self.a_scales = Some(env.gpu.alloc(inp.m * 4)?);
        self.qa2 = Some(env.gpu.alloc(inp.m * inp.k)?);
        self.a_scales2 = Some(env.gpu.alloc(inp.m * 4)?);
        self.quantize(env, inp, false)?;
        env.gpu.sync()?;
        let w_scales = self.w_scales.as_ref().context("no weights")?.ptr();
        let a_scales = self.a_scales.as_ref().context("no buffers")?.ptr();
        let one = self.one.as_ref().context("no weights")?.ptr();
        self.ways.clear();
        let mut why = Vec::new();
        for way in Fp8Scaling::ALL {
            // Outer-vector scales point at the real scales; the FP32 path's at 1.0
            // (ops::fp8_rowwise_gemm sets them again before each run).
            let (ws, as_) = match way {
                Fp8Scaling::OuterVec => (w_scales, a_scales),
                Fp8Scaling::Fp32ThenScale => (one, one),
            };
            match ops::plan(lt, way.class(), (inp.m, inp.n, inp.k), ws, as_) {
                Ok(g) => {
                    if way == Fp8Scaling::Fp32ThenScale {
                        self.acc = Some(env.gpu.alloc(inp.m * inp.n * 4)?);
                    }
                    self.ways.push((way, g));
                }
                Err(e) => why.push(match way {
                    Fp8Scaling::OuterVec => format!("outer-vector scales: {e}"),
                    Fp8Scaling::Fp32ThenScale => format!("FP32 output: {e}"),
                }),
            }
        }
        anyhow::ensure!(
            !self.ways.is_empty(),
            "no row-wise FP8 GEMM plan: {}",
            why.join("; ")
        );
        self.chosen = 0;
        Ok(self.ways.len())
    }
    fn select(&mut self, i: usize) {
        self.chosen = i.min(self.ways.len().saturating_sub(1));
    }
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
    fn weight_stream_bytes(&self, shape: &Shape) -> u64 {
        // E4M3 codes and one FP32 scale per output channel.
        (shape.n * shape.k + 4 * shape.n) as u64
    }
    fn path(&self) -> String {
        match self.ways.get(self.chosen) {
            Some((Fp8Scaling::OuterVec, g)) => format!(
                "{}, per-token × per-channel scales inside cuBLASLt (outer-vector); activations: per-token quantization, timed separately",
                g.description
            ),
            Some((Fp8Scaling::Fp32ThenScale, g)) => format!(
                "{} with FP32 output and unit scales, then fp8_rowwise_scale_out (per-token × per-channel); activations: per-token quantization, timed separately",
                g.description
            ),
            None => String::new(),
        }
    }
    fn extra_parts(&self) -> Vec<&'static str> {
        vec![crate::kernels::schema::ACT_QUANT, RMSNORM_QUANT]
    }
    fn run_extra(&self, env: &Env, inp: &MInputs, part: &str) -> anyhow::Result<()> {
        match part {
            crate::kernels::schema::ACT_QUANT => self.quantize(env, inp, false),
            RMSNORM_QUANT => self.quantize(env, inp, true),
            other => anyhow::bail!("{ID} has no part '{other}'"),
        }
    }
    fn reference(
        &self,
        env: &Env,
        inp: &MInputs,
        rows: &[usize],
        cols: &[usize],
    ) -> anyhow::Result<Vec<f64>> {
        let k = inp.k;
        let act = |row: usize| -> Vec<f32> {
            (0..k)
                .map(|kk| bf16_uniform((row * k + kk) as u32, inp.seed_a, 1.0))
                .collect()
        };
        // The GPU's per-token scales of the sampled rows must be the CPU's, bit for bit.
        let gpu_s: Vec<f32> = env.gpu.download(
            self.a_scales.as_ref().context("fp8-rowwise: no buffers")?,
            0,
            inp.m,
        )?;
        for &r in rows {
            let (_, s) = fp8_quant::quant_row(&act(r));
            anyhow::ensure!(
                gpu_s[r] == s,
                "GPU per-token scale of row {r} is {:e}, the CPU's {s:e}",
                gpu_s[r]
            );
        }
        // The codes of a few sampled rows, bit for bit; and the fused RMSNorm + quantization
        // (`rmsnorm_quant`, timed beside the case) on the same rows, so that no part is timed
        // unchecked.
        let qa = self.qa.as_ref().context("fp8-rowwise: no buffers")?;
        self.quantize(env, inp, true)?;
        env.gpu.sync()?;
        let fused_s: Vec<f32> = env.gpu.download(
            self.a_scales2.as_ref().context("fp8-rowwise: no buffers")?,
            0,
            inp.m,
        )?;
        let nw: Vec<f32> = (0..k).map(norm_weight).collect();
        for &r in rows.iter().take(4) {
            let x = act(r);
            let (want, _) = fp8_quant::quant_row(&x);
            let got: Vec<u8> = env.gpu.download(qa, r * k, k)?;
            let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            anyhow::ensure!(
                differ == 0,
                "failed its correctness check: the per-token FP8 codes of row {r} differ from the CPU's at {differ} of {k} positions"
            );
            let fused: Vec<u8> = env.gpu.download(
                self.qa2.as_ref().context("fp8-rowwise: no buffers")?,
                r * k,
                k,
            )?;
            fp8_quant::check_fused_row(&x, &nw, RMS_EPS, &fused, fused_s[r]).map_err(|e| {
                anyhow::anyhow!(
                    "failed its correctness check: the fused RMSNorm + FP8 quantization ({RMSNORM_QUANT}) of row {r}: {e}"
                )
            })?;
        }
        let a_row = |row: usize| -> Vec<f64> {
            let (q, s) = fp8_quant::quant_row(&act(row));
            q.iter()
                .map(|c| e4m3::decode(*c) as f64 * s as f64)
                .collect()
        };
        let w_row = |n: usize| -> Vec<f64> {
            let cs = channel_scale(n) as f64;
            (0..k)
                .map(|kk| {
                    e4m3::decode(fp8_code((n * k + kk) as u32, super::fp8::SEED_W)) as f64 * cs
                })
                .collect()
        };
        Ok(sampled_gemm(rows, cols, k, &a_row, &w_row))
    }
    fn tolerance(&self) -> (&'static str, f64) {
        ("FP8_GEMM_REL_L2", FP8_GEMM_REL_L2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_are_exact_and_varied() {
        let s: Vec<f32> = (0..64).map(channel_scale).collect();
        assert!(s.iter().all(|v| (1.0 / 64.0..2.0 / 64.0).contains(v)));
        let mut d = s.clone();
        d.sort_by(f32::total_cmp);
        d.dedup();
        assert!(d.len() >= 6, "{d:?}");
        assert!((0..64).all(|k| (0.5..1.5).contains(&norm_weight(k))));
    }
}
