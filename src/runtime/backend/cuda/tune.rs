//! Tuning at load, by measurement and checked before it is timed ("correct before fast"): the
//! FP8 scaling path and the W4A16 configuration of every distinct linear shape at each M bucket,
//! by the GEMM layer's one tuner ([`crate::gemm::tuner`], the kernel bench's rule), each
//! candidate timed with a cold L2 (median of [`TUNE_SAMPLES`]).

use super::launchers;
use crate::gpu::DevPtr;
use anyhow::Context;

use super::{
    grid1, rel_l2_bf16, CudaBackend, DLinear, LayerLinear, LinRef, FP8_PATHS_REL_L2, FP8_TUNE_MAX_M,
};
use crate::gemm::ops::{Fp8Scaling, GemmClass};
use crate::gemm::tuner::{self, median_cold, Trial, M_BUCKETS, TUNE_SAMPLES};
use crate::gemm::w4a16::{self as w4, Config as W4Config};
use crate::gpu::{DevBuf, Timer};
use crate::runtime::config::WeightFormat;

impl CudaBackend {
    /// The distinct `(N, K)` of the linears stored in `format` over all layers (a dense
    /// decoder's four: qkv, o, gate_up, down; a hybrid's Gated-DeltaNet layers add theirs), each
    /// with its first linear, in layer order.
    pub(super) fn distinct_linear_shapes(
        &self,
        format: WeightFormat,
    ) -> Vec<(usize, usize, LinRef)> {
        let mut shapes: Vec<(usize, usize, LinRef)> = Vec::new();
        for r in self.all_linears() {
            let lin = self.lin(r);
            if lin.format() != format {
                continue;
            }
            let (n, k) = lin.nk();
            if !shapes.iter().any(|s| s.0 == n && s.1 == k) {
                shapes.push((n, k, r));
            }
        }
        shapes
    }

    /// Synthesized BF16 activations, `rows × k`, normal(0, 1) with seed `seed + which.index()`,
    /// for tuning linear `which`: written to `act` for `down` (K = intermediate) and to `h`
    /// otherwise, both sized for `max_tokens × max K`. Returns the buffer's device address.
    ///
    /// # Errors
    /// The launch fails.
    pub(super) fn synth_tune_input(
        &self,
        which: LayerLinear,
        rows: usize,
        k: usize,
        seed: u64,
    ) -> anyhow::Result<u64> {
        let src = if which == LayerLinear::Down {
            self.bufs.act.ptr()
        } else {
            self.bufs.h.ptr()
        };
        let len = (rows * k) as u64;
        launchers::rt::rt_synth_bf16(
            &self.rt,
            &self.gpu,
            grid1(len as usize, 256),
            (256, 1, 1),
            0,
            DevPtr::at(src),
            len,
            seed + which.index(),
            0.0,
            1.0,
        )?;
        Ok(src)
    }

    /// A cold-L2 flush for the tuner's timed samples, as in the kernel bench and a decode step
    /// (a layer's weights are evicted by the other layers' before they are read again): a read
    /// pass over `flush` (at least 2 × L2) by `rt_amax_bf16`, which reads every element and
    /// writes one word (`ascale`'s first, which every timed run rewrites).
    pub(super) fn flush_l2(&self, flush: &DevBuf) -> anyhow::Result<()> {
        launchers::rt::rt_amax_bf16(
            &self.rt,
            &self.gpu,
            grid1(flush.bytes() / 2, 256).min((self.gpu.sm_count * 16, 1, 1)),
            (256, 1, 1),
            0,
            flush,
            flush.bytes() / 2,
            &self.bufs.ascale,
        )?;
        Ok(())
    }

    /// The flush buffer of [`CudaBackend::flush_l2`]: 2 × L2, at least 64 MiB, zeroed.
    pub(super) fn alloc_flush(&self) -> anyhow::Result<DevBuf> {
        let flush_elems = ((2 * self.gpu.l2_bytes as usize).max(64 << 20)) / 2;
        let flush = self.gpu.alloc(flush_elems * 2)?;
        self.gpu.memset(&flush, 0)?;
        Ok(flush)
    }

    /// Median seconds of `run` over [`TUNE_SAMPLES`] samples, each after an L2 flush.
    pub(super) fn time_cold(
        &mut self,
        flush: &DevBuf,
        timer: &Timer,
        run: &mut dyn FnMut(&mut Self) -> anyhow::Result<()>,
    ) -> anyhow::Result<f64> {
        let me = std::cell::RefCell::new(self);
        median_cold(
            TUNE_SAMPLES,
            || me.borrow().flush_l2(flush),
            || {
                let mut b = me.borrow_mut();
                timer.start(&b.gpu)?;
                run(&mut b)?;
                Ok(timer.stop(&b.gpu)?)
            },
        )
    }

    /// One bucket of [`CudaBackend::tune_fp8`] by [`tuner::choose`]: the outer-vector path runs
    /// first and its output is the reference (`bufs.0`); the FP32 path is checked against it
    /// (relative L2 ≤ [`FP8_PATHS_REL_L2`]) before it is timed. Both include the per-token
    /// quantization. The reference output is written to `gu` and the candidate's to `qkv`
    /// (poisoned first), both `m × n` BF16.
    #[allow(clippy::too_many_arguments)]
    fn tune_fp8_bucket(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        w: (u64, u64, f32),
        src: u64,
        flush: &DevBuf,
        timer: &Timer,
    ) -> tuner::Tuned {
        let (ref_out, out) = (self.bufs.gu.ptr(), self.bufs.qkv.ptr());
        let me = std::cell::RefCell::new(self);
        // Whether the outer-vector path wrote the reference: without it the other path has
        // nothing to be checked against and is not used.
        let have_ref = std::cell::Cell::new(false);
        tuner::choose(
            Fp8Scaling::ALL.len(),
            FP8_PATHS_REL_L2,
            |i| {
                let mut b = me.borrow_mut();
                let way = Fp8Scaling::ALL[i];
                if way == Fp8Scaling::OuterVec {
                    b.fp8_gemm(m, n, k, w, src, ref_out, way)?;
                    b.gpu.sync()?;
                    have_ref.set(true);
                    return Ok(0.0);
                }
                anyhow::ensure!(have_ref.get(), "no outer-vector output to check it against");
                b.gpu.memset_range(&b.bufs.qkv, 0, m * n * 2, 0xFF)?;
                b.fp8_gemm(m, n, k, w, src, out, way)?;
                let want: Vec<u16> = b.gpu.download(&b.bufs.gu, 0, m * n)?;
                let got: Vec<u16> = b.gpu.download(&b.bufs.qkv, 0, m * n)?;
                Ok(rel_l2_bf16(&got, &want))
            },
            |i| {
                let way = Fp8Scaling::ALL[i];
                me.borrow_mut()
                    .time_cold(flush, timer, &mut |b| b.fp8_gemm(m, n, k, w, src, out, way))
            },
            |_, _| {},
        )
    }

    /// Choose, by measurement, how each FP8 linear (every distinct N × K) applies its scales at
    /// each M bucket up to [`FP8_TUNE_MAX_M`]: inside cuBLASLt (outer-vector scales) or after an
    /// FP32-output cuBLASLt GEMM with unit scales. On the H200 the outer-vector heuristic's
    /// choice at M = 1 ran `down` of Qwen3-32B at about 3× its weight-streaming time (run of
    /// 2026-11-30 in `reports/nvidia-h200-sm90/`), so this is measured, not assumed. The GEMM
    /// layer's tuner decides ([`CudaBackend::tune_fp8_bucket`]); where the outer-vector path
    /// fails, or the FP32 path disagrees with it or fails, outer-vector scaling is kept and a
    /// note says why.
    ///
    /// # Errors
    /// An allocation, the timer or the synthesis of the tuning input fails, or a linear listed
    /// as FP8 is not.
    pub(super) fn tune_fp8(&mut self) -> anyhow::Result<()> {
        if !self.fp8_rowwise {
            return Ok(());
        }
        let shapes = self.distinct_linear_shapes(WeightFormat::Fp8);
        let m_max = self.max_tokens.min(FP8_TUNE_MAX_M);
        let maxn = self.max_n();
        let acc_bytes = m_max * maxn * 4;
        if self
            .bufs
            .acc32
            .as_ref()
            .is_none_or(|b| b.bytes() < acc_bytes)
        {
            self.bufs.acc32 = Some(self.gpu.alloc(acc_bytes)?);
        }
        let timer = self.gpu.timer()?;
        let flush = self.alloc_flush()?;
        let mut rows_needed = 0usize;
        let mut summary: Vec<String> = Vec::new();
        for &(n, k, r) in &shapes {
            let which = r.which;
            let w = match self.lin(r) {
                DLinear::Fp8 {
                    w,
                    scales,
                    static_scale,
                    ..
                } => (w.ptr(), scales.ptr(), static_scale.unwrap_or(0.0)),
                _ => anyhow::bail!("FP8 tuning on a layer that is not FP8"),
            };
            let src = self.synth_tune_input(which, m_max, k, 0xF8_0000)?;
            let mut picks: Vec<String> = Vec::new();
            for &b in M_BUCKETS.iter().filter(|b| **b <= m_max) {
                let tuned = self.tune_fp8_bucket(b, n, k, w, src, &flush, &timer);
                let (way, said) = fp8_bucket_outcome(&tuned.trials);
                match said {
                    Ok(pick) => picks.push(format!("M={b} {pick}")),
                    Err(note) => self.notes.push(format!("FP8 {n}×{k} M = {b}: {note}")),
                }
                if way == Fp8Scaling::Fp32ThenScale {
                    rows_needed = rows_needed.max(b);
                }
                self.fp8_choice.insert((n, k, b), way);
            }
            summary.push(format!("{n}×{k}: {}", picks.join(", ")));
        }
        // Keep only the FP32 rows the chosen fallbacks need.
        if rows_needed == 0 {
            self.bufs.acc32 = None;
        } else if rows_needed < m_max {
            self.bufs.acc32 = Some(self.gpu.alloc(rows_needed * maxn * 4)?);
        }
        self.notes.push(format!(
            "FP8 scaling path by measurement (median of {TUNE_SAMPLES} with a cold L2, per-token quantization included): {}",
            summary.join("; ")
        ));
        Ok(())
    }

    /// Choose the W4A16 configuration of every (shape, M bucket) by the GEMM layer's tuner
    /// ([`tuner::choose`]), after checking each candidate against the dequantize + cuBLASLt
    /// result (exactly dequantized weights, FP32 accumulation) under the W4A16 GEMM tolerance:
    /// correct before fast. Each candidate is timed with a cold L2 (median of
    /// [`TUNE_SAMPLES`]).
    ///
    /// # Errors
    /// No candidate passed at some (shape, bucket), or a device failure.
    pub(super) fn tune_w4(&mut self) -> anyhow::Result<()> {
        let shapes = self.distinct_linear_shapes(WeightFormat::Nvfp4);
        let t_max = self.max_tokens;
        let timer = self.gpu.timer()?;
        let flush = self.alloc_flush()?;
        // Inputs: synthesized BF16 activations in `h`/`act` (both hold t_max × max K).
        for &(n, k, r) in &shapes {
            let src = self.synth_tune_input(r.which, t_max, k, 0x5EED_0000)?;
            for &b in M_BUCKETS.iter().filter(|b| **b <= t_max) {
                let cfg = self.tune_w4_bucket((n, k, r), b, src, &flush, &timer)?;
                self.w4_choice.insert((n, k, b), cfg);
            }
        }
        Ok(())
    }

    /// One (shape, M bucket) of [`CudaBackend::tune_w4`]: the candidates of
    /// [`w4::all_candidates`], the reference by dequantize + cuBLASLt into `gu`, each candidate's
    /// output in `qkv` (poisoned before each check).
    fn tune_w4_bucket(
        &mut self,
        (n, k, r): (usize, usize, LinRef),
        b: usize,
        src: u64,
        flush: &DevBuf,
        timer: &Timer,
    ) -> anyhow::Result<W4Config> {
        let (view, strips, kt_n) = {
            let DLinear::W4 { dev } = self.lin(r) else {
                anyhow::bail!("W4A16 tuning on a non-NVFP4 layer");
            };
            (dev.view(), dev.strips, dev.kt_n)
        };
        let cands = w4::all_candidates(
            &self.gpu,
            &self.w4m,
            self.w4v2.as_ref(),
            true,
            strips,
            kt_n,
            b,
        )?;
        // Reference: dequantize + cuBLASLt.
        self.ensure_w4_scratch(&cands, n, k)?;
        let refbuf = self.bufs.gu.ptr();
        let outbuf = self.bufs.qkv.ptr();
        let scratch = self
            .bufs
            .w4_scratch
            .as_ref()
            .context("no W4A16 scratch")?
            .ptr();
        let run = |me: &mut Self, c: &W4Config, out: u64| -> anyhow::Result<()> {
            let gemm = if c == &W4Config::DequantGemm {
                Some(
                    me.plans
                        .get(&me.lt, me.bufs.one.ptr(), (GemmClass::Bf16, b, n, k))?,
                )
            } else {
                None
            };
            w4::launch_view(
                &me.gpu,
                &me.w4m,
                me.w4v2.as_ref(),
                Some(&me.lt),
                &view,
                c,
                src,
                out,
                b,
                me.bufs.w4_ws.as_ref().map_or(0, |x| x.ptr()),
                me.bufs.w4_counters.as_ref().map_or(0, |x| x.ptr()),
                scratch,
                gemm,
            )
        };
        run(self, &W4Config::DequantGemm, refbuf)?;
        let want: Vec<u16> = self.gpu.download(&self.bufs.gu, 0, b * n)?;
        let me = std::cell::RefCell::new(&mut *self);
        let tuned = tuner::choose(
            cands.len(),
            crate::gemm::check::W4A16_GEMM_REL_L2,
            |i| {
                let mut m = me.borrow_mut();
                m.gpu.memset_range(&m.bufs.qkv, 0, b * n * 2, 0xFF)?;
                run(&mut m, &cands[i], outbuf)?;
                m.gpu.sync()?;
                let got: Vec<u16> = m.gpu.download(&m.bufs.qkv, 0, b * n)?;
                Ok(rel_l2_bf16(&got, &want))
            },
            |i| {
                me.borrow_mut()
                    .time_cold(flush, timer, &mut |m| run(m, &cands[i], outbuf))
            },
            |_, _| {},
        );
        let rejected = tuned.unusable();
        let cfg = tuned.chosen.map(|i| cands[i].clone()).with_context(|| {
            format!(
                "no W4A16 configuration for {n}×{k} at M = {b} passed its check against dequantize + cuBLASLt ({rejected} rejected)"
            )
        })?;
        if rejected > 0 {
            self.notes.push(format!(
                "W4A16 {n}×{k} M = {b}: {rejected} configuration(s) failed their check, launch or timing and were not used"
            ));
        }
        Ok(cfg)
    }

    pub(super) fn ensure_w4_scratch(
        &mut self,
        cands: &[W4Config],
        n: usize,
        k: usize,
    ) -> anyhow::Result<()> {
        let mut ws = 0usize;
        let mut ctr = 0usize;
        let mut scratch = n * k * 2;
        for c in cands {
            let (a, b, s) = w4::scratch_needs(c, n, k);
            ws = ws.max(a);
            ctr = ctr.max(b);
            scratch = scratch.max(s);
        }
        if ws > 0 && self.bufs.w4_ws.as_ref().is_none_or(|b| b.bytes() < ws * 4) {
            self.bufs.w4_ws = Some(self.gpu.alloc(ws * 4)?);
        }
        if ctr > 0
            && self
                .bufs
                .w4_counters
                .as_ref()
                .is_none_or(|b| b.bytes() < ctr * 4)
        {
            let c = self.gpu.alloc(ctr * 4)?;
            self.gpu.memset(&c, 0)?;
            self.bufs.w4_counters = Some(c);
        }
        if self
            .bufs
            .w4_scratch
            .as_ref()
            .is_none_or(|b| b.bytes() < scratch)
        {
            self.bufs.w4_scratch = Some(self.gpu.alloc(scratch)?);
        }
        Ok(())
    }
}

/// The scaling path kept at one FP8 bucket, from the tuner's two trials (outer-vector first),
/// and what to say: `Ok` the pick with both times (for the summary), `Err` a note. Both paths
/// must have been timed for the FP32 path to be chosen, and only when strictly faster; a
/// disagreement, or a failure of either path at any stage, keeps outer-vector scaling, the path
/// `gemm` runs without a choice (a failure of either costs only the choice).
pub(super) fn fp8_bucket_outcome(trials: &[Trial]) -> (Fp8Scaling, Result<String, String>) {
    match trials {
        [Trial::Timed { seconds: ov, .. }, Trial::Timed { seconds: fp, .. }] => {
            let way = if fp < ov {
                Fp8Scaling::Fp32ThenScale
            } else {
                Fp8Scaling::OuterVec
            };
            let said = format!(
                "{} ({:.1} vs {:.1} µs)",
                way.short(),
                1e6 * ov.min(*fp),
                1e6 * ov.max(*fp)
            );
            (way, Ok(said))
        }
        [Trial::Timed { .. }, Trial::Rejected { rel_l2 }] => (
            Fp8Scaling::OuterVec,
            Err(format!(
                "the FP32-output path differs from cuBLASLt's outer-vector scaling by relative L2 {rel_l2:.2e} (> {FP8_PATHS_REL_L2:.0e}); outer-vector kept"
            )),
        ),
        trials => {
            let why: Vec<String> = trials
                .iter()
                .zip(Fp8Scaling::ALL)
                .filter_map(|(t, w)| match t {
                    Trial::Failed { stage, why } => Some(format!("{} {stage}: {why}", w.short())),
                    Trial::Rejected { rel_l2 } => {
                        Some(format!("{} rejected: relative L2 {rel_l2:.2e}", w.short()))
                    }
                    Trial::Timed { .. } => None,
                })
                .collect();
            (
                Fp8Scaling::OuterVec,
                Err(format!(
                    "the scaling paths could not be compared ({}); outer-vector kept",
                    why.join("; ")
                )),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runtime's tolerance between its two FP8 scaling paths, as the tuner applies it.
    /// The kept path and the words at one bucket, for every mix of trials; in particular the
    /// FP32 path is never kept unless outer-vector was timed too (the rule before the one tuner).
    #[test]
    fn fp8_bucket_keeps_outer_vector_unless_both_timed_and_fp32_faster() {
        let timed = |s: f64| Trial::Timed {
            seconds: s,
            rel_l2: 0.0,
        };
        let failed = |stage: &'static str| Trial::Failed {
            stage,
            why: "x".into(),
        };
        let (w, said) = fp8_bucket_outcome(&[timed(97.0e-6), timed(50.3e-6)]);
        assert_eq!(w, Fp8Scaling::Fp32ThenScale);
        assert_eq!(said.as_deref(), Ok("fp32+scale (50.3 vs 97.0 µs)"));
        let (w, said) = fp8_bucket_outcome(&[timed(43.2e-6), timed(49.2e-6)]);
        assert_eq!(w, Fp8Scaling::OuterVec);
        assert_eq!(said.as_deref(), Ok("outer-vec (43.2 vs 49.2 µs)"));
        assert_eq!(
            fp8_bucket_outcome(&[timed(4e-5), timed(4e-5)]).0,
            Fp8Scaling::OuterVec
        );
        let (w, said) = fp8_bucket_outcome(&[timed(4e-5), Trial::Rejected { rel_l2: 0.5 }]);
        assert_eq!(w, Fp8Scaling::OuterVec);
        assert!(said.unwrap_err().contains("differs"));
        // Outer-vector's timing failed, the FP32 path timed: outer-vector is still kept, and
        // the note says so.
        let (w, said) = fp8_bucket_outcome(&[failed("timing"), timed(1e-6)]);
        assert_eq!(w, Fp8Scaling::OuterVec);
        let note = said.unwrap_err();
        assert!(
            note.contains("outer-vec timing") && note.contains("outer-vector kept"),
            "{note}"
        );
        let (w, said) = fp8_bucket_outcome(&[failed("check"), failed("check")]);
        assert_eq!(w, Fp8Scaling::OuterVec);
        assert!(said.unwrap_err().contains("fp32+scale check"));
        assert_eq!(fp8_bucket_outcome(&[]).0, Fp8Scaling::OuterVec);
    }

    #[test]
    fn fp8_paths_tolerance_is_applied_by_the_tuner() {
        let pick = |err: f64, t: [f64; 2]| {
            tuner::choose(
                2,
                FP8_PATHS_REL_L2,
                |i| Ok(if i == 0 { 0.0 } else { err }),
                |i| Ok(t[i]),
                |_, _| {},
            )
            .chosen
        };
        assert_eq!(pick(0.0, [97.0e-6, 50.3e-6]), Some(1));
        assert_eq!(pick(FP8_PATHS_REL_L2, [97.0e-6, 50.3e-6]), Some(1));
        assert_eq!(pick(2.0 * FP8_PATHS_REL_L2, [97.0e-6, 50.3e-6]), Some(0));
        assert_eq!(pick(f64::NAN, [97.0e-6, 50.3e-6]), Some(0));
        assert_eq!(pick(f64::INFINITY, [97.0e-6, 50.3e-6]), Some(0));
    }
}
