//! Tuning at load, by measurement and checked before it is timed ("correct before fast"): the
//! FP8 scaling path and the W4A16 configuration of every distinct linear shape at each M bucket.

use super::launchers;
use crate::gpu::DevPtr;
use anyhow::Context;

use super::{
    gemm::{lt_plan, GemmClass},
    grid1, rel_l2_bf16, CudaBackend, DLinear, LayerLinear, LinRef, FP8_PATHS_REL_L2,
    FP8_TUNE_MAX_M, W4_BUCKETS,
};
use crate::gpu::DevBuf;
use crate::kernels::impls::w4a16::{self as w4, Config as W4Config};
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

    /// One bucket of [`CudaBackend::tune_fp8`]: run both FP8 scaling paths on the same input,
    /// compare their outputs, then time each (median of 7, L2 flushed by a read of `flush`
    /// before every sample). `bufs = (reference output, output)`, both `m × n` BF16.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn time_fp8_paths(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        w: (u64, u64, f32),
        src: u64,
        bufs: (u64, u64),
        flush: &DevBuf,
        timer: &crate::gpu::Timer,
    ) -> anyhow::Result<Fp8Trial> {
        let (ref_out, out) = bufs;
        self.fp8_gemm(m, n, k, w, src, ref_out, true)?;
        self.fp8_gemm(m, n, k, w, src, out, false)?;
        let want: Vec<u16> = self.gpu.download(&self.bufs.gu, 0, m * n)?;
        let got: Vec<u16> = self.gpu.download(&self.bufs.qkv, 0, m * n)?;
        let err = rel_l2_bf16(&got, &want);
        if !fp8_paths_agree(err) {
            return Ok(Fp8Trial::Disagree(err));
        }
        let amax = self.bufs.ascale.ptr(); // scratch word; the timed runs rewrite it
        let mut med = [0f64; 2];
        for (slot, in_gemm) in [(0usize, true), (1, false)] {
            let mut times = Vec::with_capacity(7);
            for _ in 0..7 {
                launchers::rt::rt_amax_bf16(
                    &self.rt,
                    &self.gpu,
                    grid1(flush.bytes() / 2, 256).min((self.gpu.sm_count * 16, 1, 1)),
                    (256, 1, 1),
                    0,
                    flush,
                    flush.bytes() / 2,
                    DevPtr::at(amax),
                )?;
                timer.start(&self.gpu)?;
                self.fp8_gemm(m, n, k, w, src, out, in_gemm)?;
                times.push(timer.stop(&self.gpu)?);
            }
            times.sort_by(f64::total_cmp);
            med[slot] = times[3];
        }
        Ok(Fp8Trial::Timed {
            outer_vec: med[0],
            fp32_scale: med[1],
        })
    }

    /// Choose, by measurement, how each FP8 linear (every distinct N × K) applies its scales at
    /// each M bucket up to [`FP8_TUNE_MAX_M`]: inside cuBLASLt (outer-vector scales) or after an
    /// FP32-output cuBLASLt GEMM with unit scales. On the H200 the outer-vector heuristic's
    /// choice at M = 1 ran `down` of Qwen3-32B at about 3× its weight-streaming time (run of
    /// 2026-11-30 in `reports/nvidia-h200-sm90/`), so this is measured, not assumed. The two
    /// paths are checked against each other (relative L2 ≤ [`FP8_PATHS_REL_L2`]) before the
    /// faster is kept, timed with a cold L2; a disagreement, or a failure of either path at a
    /// bucket, keeps the outer-vector path there and leaves a note.
    ///
    /// # Errors
    /// A launch, allocation or timer fails.
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
        // Cold L2 for every timed sample, as in the kernel bench and a decode step (a layer's
        // weights are evicted by the other layers' before they are read again): a read pass
        // over 2 × L2 (`rt_amax_bf16` reads every element and writes one word).
        let flush_elems = ((2 * self.gpu.l2_bytes as usize).max(64 << 20)) / 2;
        let flush = self.gpu.alloc(flush_elems * 2)?;
        self.gpu.memset(&flush, 0)?;
        let mut rows_needed = 0usize;
        let mut summary: Vec<String> = Vec::new();
        for &(n, k, r) in &shapes {
            let which = r.which;
            let (w, scales, st) = match self.lin(r) {
                DLinear::Fp8 {
                    w,
                    scales,
                    static_scale,
                    ..
                } => (w.ptr(), scales.ptr(), static_scale.unwrap_or(0.0)),
                _ => anyhow::bail!("FP8 tuning on a layer that is not FP8"),
            };
            let src = self.synth_tune_input(which, m_max, k, 0xF8_0000)?;
            let (ref_out, out) = (self.bufs.gu.ptr(), self.bufs.qkv.ptr());
            let mut picks: Vec<String> = Vec::new();
            for &b in W4_BUCKETS.iter().filter(|b| **b <= m_max) {
                match self.time_fp8_paths(
                    b,
                    n,
                    k,
                    (w, scales, st),
                    src,
                    (ref_out, out),
                    &flush,
                    &timer,
                ) {
                    Ok(Fp8Trial::Disagree(err)) => {
                        self.notes.push(format!(
                            "FP8 {n}×{k} M = {b}: the FP32-output path differs from cuBLASLt's outer-vector scaling by relative L2 {err:.2e} (> {FP8_PATHS_REL_L2:.0e}); outer-vector kept"
                        ));
                        self.fp8_choice.insert((n, k, b), true);
                    }
                    Ok(Fp8Trial::Timed {
                        outer_vec,
                        fp32_scale,
                    }) => {
                        let in_gemm = fp8_pick_in_gemm(outer_vec, fp32_scale);
                        if !in_gemm {
                            rows_needed = rows_needed.max(b);
                        }
                        self.fp8_choice.insert((n, k, b), in_gemm);
                        picks.push(format!(
                            "M={b} {} ({:.1} vs {:.1} µs)",
                            if in_gemm { "outer-vec" } else { "fp32+scale" },
                            1e6 * outer_vec.min(fp32_scale),
                            1e6 * outer_vec.max(fp32_scale)
                        ));
                    }
                    Err(e) => {
                        // The outer-vector path is the one gemm() runs without a choice; a
                        // failure of the other path costs only the choice.
                        self.notes.push(format!(
                            "FP8 {n}×{k} M = {b}: the scaling paths could not be compared ({e:#}); outer-vector kept"
                        ));
                        self.fp8_choice.insert((n, k, b), true);
                    }
                }
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
            "FP8 scaling path by measurement (median of 7 with a cold L2, per-token quantization included): {}",
            summary.join("; ")
        ));
        Ok(())
    }

    /// Choose the W4A16 configuration of every (shape, M bucket) by measurement, after checking
    /// each candidate against the dequantize + cuBLASLt result (exactly dequantized weights,
    /// FP32 accumulation) under the W4A16 GEMM tolerance: correct before fast.
    pub(super) fn tune_w4(&mut self) -> anyhow::Result<()> {
        let shapes = self.distinct_linear_shapes(WeightFormat::Nvfp4);
        let t_max = self.max_tokens;
        let timer = self.gpu.timer()?;
        // Inputs: synthesized BF16 activations in `h`/`act` (both hold t_max × max K).
        for &(n, k, r) in &shapes {
            let which = r.which;
            let src = self.synth_tune_input(which, t_max, k, 0x5EED_0000)?;
            let refbuf = self.bufs.gu.ptr();
            let outbuf = self.bufs.qkv.ptr();
            for &b in W4_BUCKETS.iter().filter(|b| **b <= t_max) {
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
                lt_plan(
                    &mut self.plans,
                    &self.lt,
                    self.bufs.one.ptr(),
                    (GemmClass::Bf16, b, n, k),
                )?;
                let gref = &self.plans[&(GemmClass::Bf16, b, n, k)];
                let scratch = self
                    .bufs
                    .w4_scratch
                    .as_ref()
                    .context("no W4A16 scratch")?
                    .ptr();
                w4::launch_view(
                    &self.gpu,
                    &self.w4m,
                    self.w4v2.as_ref(),
                    Some(&self.lt),
                    &view,
                    &W4Config::DequantGemm,
                    src,
                    refbuf,
                    b,
                    0,
                    0,
                    scratch,
                    Some(gref),
                )?;
                let want: Vec<u16> = self.gpu.download(&self.bufs.gu, 0, b * n)?;
                let mut best: Option<(f64, W4Config)> = None;
                let mut rejected = 0usize;
                for c in &cands {
                    let gemm = (c == &W4Config::DequantGemm).then_some(gref);
                    let run = |me: &Self| {
                        w4::launch_view(
                            &me.gpu,
                            &me.w4m,
                            me.w4v2.as_ref(),
                            Some(&me.lt),
                            &view,
                            c,
                            src,
                            outbuf,
                            b,
                            me.bufs.w4_ws.as_ref().map_or(0, |x| x.ptr()),
                            me.bufs.w4_counters.as_ref().map_or(0, |x| x.ptr()),
                            scratch,
                            gemm,
                        )
                    };
                    self.gpu.memset_range(&self.bufs.qkv, 0, b * n * 2, 0xFF)?;
                    if run(self).and_then(|_| Ok(self.gpu.sync()?)).is_err() {
                        rejected += 1; // a launch that fails (e.g. shared memory) is not used
                        continue;
                    }
                    let got: Vec<u16> = self.gpu.download(&self.bufs.qkv, 0, b * n)?;
                    let err = rel_l2_bf16(&got, &want);
                    if err.is_nan() || err > crate::kernels::reference::W4A16_GEMM_REL_L2 {
                        rejected += 1;
                        continue;
                    }
                    let mut times = Vec::with_capacity(5);
                    for _ in 0..5 {
                        timer.start(&self.gpu)?;
                        run(self)?;
                        times.push(timer.stop(&self.gpu)?);
                    }
                    times.sort_by(f64::total_cmp);
                    let t = times[2];
                    if best.as_ref().is_none_or(|(bt, _)| t < *bt) {
                        best = Some((t, c.clone()));
                    }
                }
                let (_, cfg) = best.with_context(|| {
                    format!(
                        "no W4A16 configuration for {n}×{k} at M = {b} passed its check against dequantize + cuBLASLt ({rejected} rejected)"
                    )
                })?;
                if rejected > 0 {
                    self.notes.push(format!(
                        "W4A16 {n}×{k} M = {b}: {rejected} configuration(s) failed the check and were not used"
                    ));
                }
                self.w4_choice.insert((n, k, b), cfg);
            }
        }
        Ok(())
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

/// Outcome of timing the two FP8 scaling paths at one (N, K, M bucket).
pub(super) enum Fp8Trial {
    /// Their outputs differ by this relative L2 (over [`FP8_PATHS_REL_L2`]): not timed.
    Disagree(f64),
    /// Median seconds of each, per-token quantization included.
    Timed {
        /// cuBLASLt with outer-vector scales.
        outer_vec: f64,
        /// Unit-scale cuBLASLt into FP32, then `rt_scale_f32_to_bf16`.
        fp32_scale: f64,
    },
}

/// Whether the two FP8 scaling paths agree: relative L2 `err` of one against the other is
/// finite and at most [`FP8_PATHS_REL_L2`].
pub(super) fn fp8_paths_agree(err: f64) -> bool {
    err.is_finite() && err <= FP8_PATHS_REL_L2
}

/// The FP8 scaling path to keep from two median times in seconds: `true` (outer-vector scales
/// inside cuBLASLt) unless the FP32-output path is strictly faster; ties and unusable times
/// keep outer-vector scaling, the path that needs no FP32 buffer.
pub(super) fn fp8_pick_in_gemm(outer_vec_s: f64, fp32_scale_s: f64) -> bool {
    !(fp32_scale_s.is_finite() && fp32_scale_s > 0.0 && fp32_scale_s < outer_vec_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_path_choice_keeps_outer_vector_unless_the_fallback_is_faster() {
        // H200, Qwen3-32B down at M = 1 (2026-11-30): 97.0 µs outer-vector, 50.3 µs FP32 + scale.
        assert!(!fp8_pick_in_gemm(97.0e-6, 50.3e-6));
        // M = 256 of the same run's qkv: outer-vector 43.2 µs against 49.2 µs.
        assert!(fp8_pick_in_gemm(43.2e-6, 49.2e-6));
        assert!(fp8_pick_in_gemm(40e-6, 40e-6), "a tie keeps outer-vector");
        assert!(fp8_pick_in_gemm(40e-6, f64::NAN));
        assert!(fp8_pick_in_gemm(40e-6, 0.0));
        assert!(fp8_paths_agree(0.0));
        assert!(fp8_paths_agree(FP8_PATHS_REL_L2));
        assert!(!fp8_paths_agree(2.0 * FP8_PATHS_REL_L2));
        assert!(!fp8_paths_agree(f64::NAN));
        assert!(!fp8_paths_agree(f64::INFINITY));
    }
}
