//! The linear layers, through the GEMM layer the kernel bench times ([`crate::gemm::ops`]):
//! BF16 through cuBLASLt, FP8 W8A8 with per-token activation scales (inside cuBLASLt or after an
//! FP32-output GEMM, [`Fp8Scaling`]), and W4A16 NVFP4 through rigbench's kernel, each at the
//! configuration the tuner chose for its M bucket ([`crate::gemm::tuner`]); cuBLASLt plans
//! are cached per (class, M, N, K) ([`crate::gemm::ops::PlanCache`]).

use anyhow::Context;

use super::gdn;
use super::{CudaBackend, DLinear, LayerLinear, LinRef};
use crate::gpu::cublaslt::{LtGemm, LtKind};

use crate::gemm::fp8_quant;
use crate::gemm::gemv::{Fp8Scales, GemvFormat};
use crate::gemm::ops::{self, Fp8Scaling, GemmClass};
use crate::gemm::tuner::bucket_for;
use crate::gemm::w4a16::{self as w4, Config as W4Config};
use crate::runtime::config::WeightFormat;

impl CudaBackend {
    /// Plans the cuBLASLt GEMMs of the first decode sizes, and finds out whether FP8 per-token
    /// scaling is available in cuBLASLt on this card.
    pub(super) fn prepare_gemms(&mut self) -> anyhow::Result<()> {
        if let Some(first) = self.first_of_format(WeightFormat::Fp8) {
            let (n, k) = self.lin(first).nk();
            let kind = LtKind::Fp8RowWise {
                w_scales_ptr: self.bufs.one.ptr(),
                a_scales_ptr: self.bufs.ascale.ptr(),
            };
            match LtGemm::plan(&self.lt, kind, 1, n, k) {
                Ok(_) => self.fp8_rowwise = true,
                Err(e) => {
                    self.fp8_rowwise = false;
                    self.notes.push(format!(
                        "cuBLASLt has no FP8 GEMM with outer-vector (per-token × per-channel) scales here ({e}); the scales are applied after an FP32-output GEMM"
                    ));
                    let t = self.max_tokens;
                    let maxn = self.max_n();
                    self.bufs.acc32 = Some(self.gpu.alloc(t * maxn * 4)?);
                }
            }
        }
        Ok(())
    }

    pub(super) fn max_n(&self) -> usize {
        let c = &self.config;
        gdn::max_fused_rows(c)
            .max(2 * c.intermediate_size)
            .max(c.hidden_size)
    }

    /// Whether any decoder linear is stored in `f`.
    pub(super) fn has_format(&self, f: WeightFormat) -> bool {
        self.first_of_format(f).is_some()
    }

    /// The first decoder linear stored in `f`.
    fn first_of_format(&self, f: WeightFormat) -> Option<LinRef> {
        self.all_linears()
            .into_iter()
            .find(|r| self.lin(*r).format() == f)
    }

    /// Every decoder linear: per layer qkv, o, gate_up, down and, in Gated-DeltaNet layers,
    /// the fused in_proj_a / in_proj_b ([`LayerLinear::GdnAb`]).
    ///
    /// Sparse layers: their router and shared-expert gate, and their `gate_up` / `down` only
    /// when they hold a shared expert that runs as a dense MLP (the routed experts, and a
    /// shared expert fused into them, run the grouped GEMMs, not these: nothing to tune).
    pub(super) fn all_linears(&self) -> Vec<LinRef> {
        let mut v = Vec::new();
        for (layer, l) in self.weights.layers.iter().enumerate() {
            let fused = l.moe.as_ref().is_some_and(|m| m.shared_fused);
            v.extend(
                LayerLinear::ALL
                    .map(|which| LinRef { layer, which })
                    .into_iter()
                    .filter(|r| self.lin(*r).nk().0 > 0)
                    .filter(|r| {
                        !(fused && matches!(r.which, LayerLinear::GateUp | LayerLinear::Down))
                    }),
            );
            if l.gdn.is_some() {
                v.push(LinRef::new(layer, LayerLinear::GdnAb));
            }
            if let Some(m) = &l.moe {
                v.push(LinRef::new(layer, LayerLinear::Router));
                if m.shared_gate.is_some() {
                    v.push(LinRef::new(layer, LayerLinear::SharedGate));
                }
            }
        }
        v
    }

    /// `out[m, N] = input[m, K] · Wᵀ` (BF16 in and out).
    pub(super) fn gemm(
        &mut self,
        which: LinRef,
        m: usize,
        input: u64,
        out: u64,
    ) -> anyhow::Result<()> {
        let lin = self.lin(which);
        let (n, k) = lin.nk();
        match lin {
            DLinear::Bf16 { w, .. } => {
                let w = w.ptr();
                if let Some(v) = self.gemv_for(GemvFormat::Bf16, n, k, m) {
                    return self.run_gemv(GemvFormat::Bf16, v, (w, input, out), None, m, n, k);
                }
                let g =
                    self.plans
                        .get(&self.lt, self.bufs.one.ptr(), (GemmClass::Bf16, m, n, k))?;
                g.run(&self.lt, &self.gpu, 1.0, w, input, out)?;
            }
            DLinear::Fp8 {
                w,
                scales,
                static_scale,
                ..
            } => {
                let (w, scales, st) = (w.ptr(), scales.ptr(), static_scale.unwrap_or(0.0));
                let way = self.fp8_scaling(n, k, m);
                self.fp8_gemm(m, n, k, (w, scales, st), input, out, way)?;
            }
            DLinear::W4 { dev } => {
                let view = dev.view();
                let cfg = self.w4_config(n, k, m)?;
                let gemm = if cfg == W4Config::DequantGemm {
                    Some(self.plans.get(
                        &self.lt,
                        self.bufs.one.ptr(),
                        (GemmClass::Bf16, m, n, k),
                    )?)
                } else {
                    None
                };
                w4::launch_view(
                    &self.gpu,
                    &self.w4m,
                    self.w4v2.as_ref(),
                    Some(&self.lt),
                    &view,
                    &cfg,
                    input,
                    out,
                    m,
                    self.bufs.w4_ws.as_ref().map_or(0, |b| b.ptr()),
                    self.bufs.w4_counters.as_ref().map_or(0, |b| b.ptr()),
                    self.bufs.w4_scratch.as_ref().map_or(0, |b| b.ptr()),
                    gemm,
                )?;
            }
        }
        Ok(())
    }

    /// How the FP8 GEMM of `n × k` at `m` tokens applies its per-token × per-channel scales:
    /// the tuned choice of M's bucket ([`CudaBackend::tune_fp8`]); outer-vector above the tuned
    /// buckets, and FP32 + scale where cuBLASLt has no outer-vector scaling.
    pub(super) fn fp8_scaling(&self, n: usize, k: usize, m: usize) -> Fp8Scaling {
        if !self.fp8_rowwise {
            return Fp8Scaling::Fp32ThenScale;
        }
        match bucket_for(m) {
            Some(b) => self
                .fp8_choice
                .get(&(n, k, b))
                .copied()
                .unwrap_or(Fp8Scaling::OuterVec),
            None => Fp8Scaling::OuterVec,
        }
    }

    /// One FP8 W8A8 linear: per-token E4M3 quantization of `input` (`m × k` BF16) on the GPU,
    /// then the GEMM with its scales applied the `way` given ([`ops::fp8_rowwise_gemm`]).
    /// `w = (weights, N per-channel scales, static input scale or 0 for dynamic)`. Output
    /// `m × n` BF16 at `out`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fp8_gemm(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        w: (u64, u64, f32),
        input: u64,
        out: u64,
        way: Fp8Scaling,
    ) -> anyhow::Result<()> {
        let (w, scales, st) = w;
        self.fp8_quant(m, k, st, input)?;
        self.fp8_gemm_quantized(m, n, k, (w, scales), out, way)
    }

    /// Per-token E4M3 quantization of `input` (`m × k` BF16) into `hq` / `ascale` (`st > 0`:
    /// the static input scale), by the GEMM layer's kernel ([`fp8_quant::launch_quant_rows`]).
    pub(super) fn fp8_quant(&self, m: usize, k: usize, st: f32, input: u64) -> anyhow::Result<()> {
        let fq = self
            .fp8q
            .as_ref()
            .context("kernels/fp8_quant.cu is not built (no FP8 linear at load)")?;
        fp8_quant::launch_quant_rows(
            &self.gpu,
            fq,
            input,
            m,
            k,
            st,
            self.bufs.hq.ptr(),
            self.bufs.ascale.ptr(),
        )
    }

    /// The GEMM half of [`CudaBackend::fp8_gemm`] on activations already quantized into `hq` /
    /// `ascale` (by [`CudaBackend::fp8_quant`] or a fused norm / SwiGLU kernel): the GEMV where
    /// the tuner chose it for this shape and M ([`CudaBackend::gemv_for`]), else cuBLASLt with
    /// its scales applied the `way` given.
    pub(super) fn fp8_gemm_quantized(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        w: (u64, u64),
        out: u64,
        way: Fp8Scaling,
    ) -> anyhow::Result<()> {
        if let Some(v) = self.gemv_for(GemvFormat::Fp8, n, k, m) {
            let scales = Fp8Scales {
                w: w.1,
                w_per_channel: true,
                x: self.bufs.ascale.ptr(),
                x_per_token: true,
            };
            let x = self.bufs.hq.ptr();
            return self.run_gemv(GemvFormat::Fp8, v, (w.0, x, out), Some(scales), m, n, k);
        }
        self.fp8_gemm_quantized_lt(m, n, k, w, out, way)
    }

    /// The cuBLASLt half of [`CudaBackend::fp8_gemm_quantized`].
    pub(super) fn fp8_gemm_quantized_lt(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        w: (u64, u64),
        out: u64,
        way: Fp8Scaling,
    ) -> anyhow::Result<()> {
        let (w, w_scales) = w;
        let args = ops::Fp8RowWiseArgs {
            m,
            n,
            k,
            w,
            w_scales,
            qa: self.bufs.hq.ptr(),
            a_scales: self.bufs.ascale.ptr(),
            out,
            acc: self.bufs.acc32.as_ref().map(|a| (a.ptr(), a.bytes())),
            one: self.bufs.one.ptr(),
        };
        let g = self
            .plans
            .get(&self.lt, self.bufs.one.ptr(), (way.class(), m, n, k))?;
        ops::fp8_rowwise_gemm(&self.gpu, &self.lt, self.fp8q.as_ref(), g, way, &args)
    }

    /// The static input scale (0 for dynamic per-token scales) of `which` when its input may be
    /// quantized by the kernel that produces it (a fused RMSNorm or SwiGLU + FP8 quantization):
    /// the option is on and the linear is FP8. `None`: the input stays BF16 and the GEMM
    /// quantizes it.
    pub(super) fn fused_quant(&self, which: LinRef) -> Option<f32> {
        match self.lin(which) {
            DLinear::Fp8 { static_scale, .. } if self.opts.fuse_fp8_quant => {
                Some(static_scale.unwrap_or(0.0))
            }
            _ => None,
        }
    }

    /// `out[m, N] = hq[m, K] · Wᵀ` for an FP8 linear whose input the previous kernel quantized
    /// into `hq` / `ascale` ([`CudaBackend::fused_quant`]).
    ///
    /// # Errors
    /// `which` is not FP8, or a device failure.
    pub(super) fn gemm_prequantized(
        &mut self,
        which: LinRef,
        m: usize,
        out: u64,
    ) -> anyhow::Result<()> {
        let lin = self.lin(which);
        let (n, k) = lin.nk();
        let DLinear::Fp8 { w, scales, .. } = lin else {
            anyhow::bail!("{which:?} is not an FP8 linear; its input cannot be prequantized");
        };
        let (w, scales) = (w.ptr(), scales.ptr());
        let way = self.fp8_scaling(n, k, m);
        self.fp8_gemm_quantized(m, n, k, (w, scales), out, way)
    }

    pub(super) fn lin(&self, r: LinRef) -> &DLinear {
        let l = &self.weights.layers[r.layer];
        let m = l.moe.as_ref();
        match (r.which, &l.gdn) {
            (LayerLinear::Qkv, _) => &l.qkv,
            (LayerLinear::O, _) => &l.o,
            (LayerLinear::GateUp, _) => &l.gate_up,
            (LayerLinear::GdnAb, Some(g)) => &g.ab,
            // `GdnAb` is asked only of Gated-DeltaNet layers (all_linears, gdn::queue_mixer),
            // `Router` / `SharedGate` only of sparse layers (all_linears, moe_mlp).
            (LayerLinear::Router, _) => m.map_or(&l.down, |m| &m.router),
            (LayerLinear::SharedGate, _) => {
                m.and_then(|m| m.shared_gate.as_ref()).unwrap_or(&l.down)
            }
            (LayerLinear::Down | LayerLinear::GdnAb, _) => &l.down,
        }
    }

    pub(super) fn w4_config(&self, n: usize, k: usize, m: usize) -> anyhow::Result<W4Config> {
        match bucket_for(m) {
            Some(b) => self
                .w4_choice
                .get(&(n, k, b))
                .cloned()
                .with_context(|| format!("no tuned W4A16 configuration for {n}×{k} at M = {m}")),
            None => Ok(W4Config::DequantGemm),
        }
    }
}
