//! The small-M path of the linears and the lm_head: the GEMM layer's GEMVs (`kernels/gemv.cu`,
//! [`crate::gemm::gemv`]) for BF16 and FP8 weights at M ≤ [`gemv::MAX_M`] tokens, chosen at
//! load against the cuBLASLt path by the GEMM layer's one tuner ([`tuner::choose`]): each GEMV
//! configuration is checked against the cuBLASLt output on the same operands (relative L2 ≤
//! [`GEMV_VS_CUBLASLT_REL_L2`]) before it is timed, and chosen only where it is faster than
//! cuBLASLt at that (shape, M bucket), with a cold L2 (median of [`TUNE_SAMPLES`]).

use std::collections::BTreeMap;

use anyhow::Context;

use super::{CudaBackend, DLinear, LayerLinear, LinRef};
use crate::gemm::gemv::{self, Fp8Scales, GemvFormat, Variant};
use crate::gemm::ops::GemmClass;
use crate::gemm::tuner::{self, bucket_for, M_BUCKETS, TUNE_SAMPLES};
use crate::gpu::{DevBuf, Timer};
use crate::runtime::config::WeightFormat;

/// Largest relative L2 difference allowed between a GEMV and cuBLASLt on the same operands:
/// both sum in FP32 (in another order) and round once to BF16 (2⁻⁸ relative), so they differ by
/// the output's rounding (FP32 output: by the order of the sums only).
pub const GEMV_VS_CUBLASLT_REL_L2: f64 = 1e-2;

/// One shape the GEMV may serve: its kernel family, N, K, and the linear (`None`: the lm_head).
type GemvShape = (GemvFormat, usize, usize, Option<LinRef>);

impl CudaBackend {
    /// The GEMV configuration the tuner chose for `format` `n × k` at `m` tokens, if any
    /// (M above [`gemv::MAX_M`], a shape it was not tuned for, or cuBLASLt faster: `None`).
    pub(super) fn gemv_for(
        &self,
        format: GemvFormat,
        n: usize,
        k: usize,
        m: usize,
    ) -> Option<Variant> {
        if m > gemv::MAX_M {
            return None;
        }
        let b = bucket_for(m)?;
        self.gemv_choice.get(&(format, n, k, b)).copied()
    }

    /// Launch GEMV configuration `v` (see [`gemv::launch`]).
    ///
    /// # Errors
    /// `kernels/gemv.cu` was not built, or the launch fails.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_gemv(
        &self,
        format: GemvFormat,
        v: Variant,
        (w, x, y): (u64, u64, u64),
        scales: Option<Fp8Scales>,
        m: usize,
        n: usize,
        k: usize,
    ) -> anyhow::Result<()> {
        let module = self.gemv.as_ref().context("kernels/gemv.cu is not built")?;
        gemv::launch(&self.gpu, module, format, v, (w, x, y), scales, m, n, k)
    }

    /// The shapes the GEMV may serve: every distinct BF16 and FP8 linear, and the lm_head (BF16,
    /// FP32 logits). Shapes the kernel cannot take ([`gemv::unsupported`] at M = 1) are left out.
    fn gemv_shapes(&self) -> Vec<GemvShape> {
        let mut v: Vec<GemvShape> = Vec::new();
        for (wf, gf) in [
            (WeightFormat::Bf16, GemvFormat::Bf16),
            (WeightFormat::Fp8, GemvFormat::Fp8),
        ] {
            for (n, k, r) in self.distinct_linear_shapes(wf) {
                v.push((gf, n, k, Some(r)));
            }
        }
        let c = &self.config;
        v.push((GemvFormat::Bf16F32, c.vocab_size, c.hidden_size, None));
        v.retain(|(f, n, k, _)| gemv::unsupported(*f, 1, *n, *k).is_none());
        v
    }

    /// Choose, per (shape, M bucket ≤ [`gemv::MAX_M`]), between the cuBLASLt path (candidate 0,
    /// the reference) and each GEMV configuration, by [`tuner::choose`]. A choice is recorded
    /// only where a GEMV won; the notes say, per shape and bucket, what ran and both times.
    ///
    /// # Errors
    /// An allocation, the timer or a synthesis launch fails.
    pub(super) fn tune_gemv(&mut self) -> anyhow::Result<()> {
        if self.gemv.is_none() {
            return Ok(());
        }
        let shapes = self.gemv_shapes();
        let b_max = self.max_tokens.min(gemv::MAX_M);
        if shapes.is_empty() || b_max == 0 {
            return Ok(());
        }
        let out_bytes = shapes.iter().map(|s| b_max * s.1 * 4).max().unwrap_or(0);
        let outs = (self.gpu.alloc(out_bytes)?, self.gpu.alloc(out_bytes)?);
        let timer = self.gpu.timer()?;
        let flush = self.alloc_flush()?;
        let mut summary: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for &shape in &shapes {
            let (f, n, k, r) = shape;
            let which = r.map_or(LayerLinear::Qkv, |r| r.which);
            let src = self.synth_tune_input(which, b_max, k, 0x6E_0000)?;
            for &b in M_BUCKETS.iter().filter(|b| **b <= b_max) {
                let tuned = self.tune_gemv_bucket(shape, b, src, &outs, &flush, &timer)?;
                let said = match (tuned.chosen, tuned.seconds(0)) {
                    (Some(i), Some(base)) if i > 0 => {
                        let v = gemv::VARIANTS[i - 1];
                        self.gemv_choice.insert((f, n, k, b), v);
                        let t = tuned.seconds(i).unwrap_or(f64::NAN);
                        format!(
                            "M={b} {} {:.1} vs cuBLASLt {:.1} µs",
                            v.kernel(f),
                            1e6 * t,
                            1e6 * base
                        )
                    }
                    (_, Some(base)) => format!("M={b} cuBLASLt {:.1} µs", 1e6 * base),
                    _ => format!("M={b} cuBLASLt (not timed)"),
                };
                summary
                    .entry(format!("{} {n}×{k}", f.tag()))
                    .or_default()
                    .push(said);
                let rejected = tuned.unusable();
                if rejected > 0 {
                    self.notes.push(format!(
                        "GEMV {} {n}×{k} M = {b}: {rejected} candidate(s) failed their check against cuBLASLt, launch or timing and were not used",
                        f.tag()
                    ));
                }
            }
        }
        let parts: Vec<String> = summary
            .into_iter()
            .map(|(shape, picks)| format!("{shape}: {}", picks.join(", ")))
            .collect();
        self.notes.push(format!(
            "small-M path by measurement (kernels/gemv.cu against cuBLASLt, checked first; median of {TUNE_SAMPLES} with a cold L2): {}",
            parts.join("; ")
        ));
        Ok(())
    }

    /// One (shape, bucket) of [`CudaBackend::tune_gemv`]: candidate 0 is the cuBLASLt path
    /// (for FP8 the GEMM half of the tuned scaling path, on activations quantized once before),
    /// whose output in `outs.0` is the reference; candidate `i ≥ 1` is
    /// `gemv::VARIANTS[i - 1]`, its output in `outs.1` (poisoned before each check).
    fn tune_gemv_bucket(
        &mut self,
        (f, n, k, r): GemvShape,
        b: usize,
        src: u64,
        outs: &(DevBuf, DevBuf),
        flush: &DevBuf,
        timer: &Timer,
    ) -> anyhow::Result<tuner::Tuned> {
        let elem = if f == GemvFormat::Bf16F32 { 4 } else { 2 };
        let (ref_out, out) = (outs.0.ptr(), outs.1.ptr());
        let w = self.gemv_weights(f, r)?;
        if f == GemvFormat::Fp8 {
            // The same quantized operands for every candidate.
            self.fp8_quant(b, k, w.2, src)?;
        }
        let me = std::cell::RefCell::new(&mut *self);
        let run = |me: &mut Self, i: usize, y: u64| -> anyhow::Result<()> {
            if i == 0 {
                return me.gemv_baseline(f, (n, k, b), w, src, y);
            }
            let (x, scales) = match f {
                GemvFormat::Fp8 => (
                    me.bufs.hq.ptr(),
                    Some(Fp8Scales {
                        w: w.1,
                        w_per_channel: true,
                        x: me.bufs.ascale.ptr(),
                        x_per_token: true,
                    }),
                ),
                _ => (src, None),
            };
            me.run_gemv(f, gemv::VARIANTS[i - 1], (w.0, x, y), scales, b, n, k)
        };
        let have_ref = std::cell::Cell::new(false);
        let tuned = tuner::choose(
            1 + gemv::VARIANTS.len(),
            GEMV_VS_CUBLASLT_REL_L2,
            |i| {
                let mut me = me.borrow_mut();
                if i == 0 {
                    run(&mut me, 0, ref_out)?;
                    me.gpu.sync()?;
                    have_ref.set(true);
                    return Ok(0.0);
                }
                anyhow::ensure!(have_ref.get(), "no cuBLASLt output to check it against");
                me.gpu.memset_range(&outs.1, 0, b * n * elem, 0xFF)?;
                run(&mut me, i, out)?;
                me.gpu.sync()?;
                gemv_rel_l2(&me, outs, b * n, elem)
            },
            |i| {
                me.borrow_mut()
                    .time_cold(flush, timer, &mut |m| run(m, i, out))
            },
            |_, _| {},
        );
        Ok(tuned)
    }

    /// `(weights, per-channel scales or 0, static input scale or 0)` of a shape's linear (the
    /// lm_head: its BF16 weights, or the tied embedding).
    fn gemv_weights(&self, f: GemvFormat, r: Option<LinRef>) -> anyhow::Result<(u64, u64, f32)> {
        let Some(r) = r else {
            let head = self.weights.lm_head.as_ref().unwrap_or(&self.weights.embed);
            return Ok((head.ptr(), 0, 0.0));
        };
        match (f, self.lin(r)) {
            (GemvFormat::Bf16, DLinear::Bf16 { w, .. }) => Ok((w.ptr(), 0, 0.0)),
            (
                GemvFormat::Fp8,
                DLinear::Fp8 {
                    w,
                    scales,
                    static_scale,
                    ..
                },
            ) => Ok((w.ptr(), scales.ptr(), static_scale.unwrap_or(0.0))),
            _ => anyhow::bail!(
                "GEMV tuning of {r:?}: the linear is not stored as {}",
                f.tag()
            ),
        }
    }

    /// The cuBLASLt path of a shape at `b` tokens, into `y`: BF16 (BF16 or FP32 output), or the
    /// GEMM half of the FP8 path on the activations already in `hq` / `ascale`.
    fn gemv_baseline(
        &mut self,
        f: GemvFormat,
        (n, k, b): (usize, usize, usize),
        w: (u64, u64, f32),
        src: u64,
        y: u64,
    ) -> anyhow::Result<()> {
        let class = match f {
            GemvFormat::Bf16 => GemmClass::Bf16,
            GemvFormat::Bf16F32 => GemmClass::Bf16ToF32,
            GemvFormat::Fp8 => {
                let way = self.fp8_scaling(n, k, b);
                return self.fp8_gemm_quantized_lt(b, n, k, (w.0, w.1), y, way);
            }
        };
        let g = self
            .plans
            .get(&self.lt, self.bufs.one.ptr(), (class, b, n, k))?;
        g.run(&self.lt, &self.gpu, 1.0, w.0, src, y)?;
        Ok(())
    }
}

/// Relative L2 of the candidate's output (`outs.1`) against the reference (`outs.0`), `len`
/// values of `elem` bytes (2: BF16, 4: FP32); a non-finite value never passes.
fn gemv_rel_l2(
    me: &CudaBackend,
    outs: &(DevBuf, DevBuf),
    len: usize,
    elem: usize,
) -> anyhow::Result<f64> {
    if elem == 2 {
        let want: Vec<u16> = me.gpu.download(&outs.0, 0, len)?;
        let got: Vec<u16> = me.gpu.download(&outs.1, 0, len)?;
        return Ok(super::rel_l2_bf16(&got, &want));
    }
    let want: Vec<f32> = me.gpu.download(&outs.0, 0, len)?;
    let got: Vec<f32> = me.gpu.download(&outs.1, 0, len)?;
    Ok(crate::gemm::check::rel_l2(&got, &want))
}
