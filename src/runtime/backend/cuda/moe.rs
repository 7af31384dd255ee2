//! The sparse MLP blocks of mixture-of-experts models on the CUDA backend (docs/runtime.md,
//! "Mixtures of experts"): the three ways a layer is loaded (host weights, a checkpoint, a seed)
//! and the forward pass of one block; the device types (the layer's router, routed experts and
//! address tables, the per-step buffers) are in `moe_layer.rs`.
//!
//! One block, `t` tokens, top-k (every step inside the decode step's CUDA graph, no host sync):
//! RMSNorm → router GEMM (BF16 logits `[t, E]`) → routing (`moe_route`, `moe_sort`) → grouped
//! gate_up → SwiGLU (fused with the FP8 quantization when the experts are FP8) → grouped down →
//! the shared expert as a dense SwiGLU MLP with its sigmoid gate → combine into `hout`. Where
//! the shared expert has the routed experts' format and shape (the 35B-A3B's: 512 wide), it is
//! expert `E` of the grouped GEMMs instead (`CudaOptions::fuse_shared_expert`): the router GEMM
//! carries its gate's row, the routing gives each token a last pair with weight
//! `sigmoid(gate)`, and its four launches go. The routing, grouped GEMMs and combine are the GEMM
//! layer's ([`crate::gemm::moe`]).

use anyhow::Context;

use super::load::Loader;
use super::moe_layer::MoeDevLayer;
use super::{launchers, plan, CudaBackend, DLinear, LayerLinear, LinRef};
use crate::gemm::moe::{self as gm, ExpertTables, GroupedInput};
use crate::gpu::{dim, DevPtr, Module};
use crate::runtime::config::{ModelConfig, QuantRecipe, WeightFormat};
use crate::runtime::weights::{self, LinearRole as R, MoeWeights};

/// What a layer's MLP slots hold: `(gate_up, down, sparse block)`; a sparse layer's `gate_up` /
/// `down` are its shared expert, or empty without one.
pub(super) type LayerMlp = (DLinear, DLinear, Option<MoeDevLayer>);

impl Loader<'_> {
    /// An empty linear (`0 × 0`): the MLP slots of a sparse layer without a shared expert.
    pub(super) fn empty_linear(&self) -> anyhow::Result<DLinear> {
        Ok(DLinear::Bf16 {
            w: self.gpu.alloc(16)?,
            n: 0,
            k: 0,
        })
    }

    /// A layer's MLP from host weights (already quantized by the caller).
    pub(super) fn host_mlp(&self, l: &weights::LayerWeights) -> anyhow::Result<LayerMlp> {
        let Some(m) = &l.moe else {
            return Ok((
                self.fuse_host(&[&l.gate, &l.up])?,
                self.fuse_host(&[&l.down])?,
                None,
            ));
        };
        self.moe_from_host(m, None)
    }

    /// A sparse block from host linears, each uploaded in its format or, where `recipe` asks
    /// another and the linear is BF16, quantized on the GPU.
    pub(super) fn moe_from_host(
        &self,
        m: &MoeWeights,
        recipe: Option<QuantRecipe>,
    ) -> anyhow::Result<LayerMlp> {
        let up = |parts: &[&weights::Linear], role: R| -> anyhow::Result<DLinear> {
            let want = recipe.map(|r| r.format_for(role));
            match want {
                Some(f) if f != parts[0].format() && parts[0].format() == WeightFormat::Bf16 => {
                    let bf = self.fuse_host(parts)?;
                    let (n, k) = bf.nk();
                    let DLinear::Bf16 { w, .. } = bf else {
                        unreachable!("fused BF16 parts stay BF16")
                    };
                    self.quantize_dev(w, n, k, f)
                }
                _ => self.fuse_host(parts),
            }
        };
        let experts = m
            .experts
            .iter()
            .map(|x| {
                Ok((
                    up(&[&x.gate, &x.up], R::ExpertGate)?,
                    up(&[&x.down], R::ExpertDown)?,
                ))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let (gate_up, down, sg) = match &m.shared {
            Some(s) => (
                up(&[&s.mlp.gate, &s.mlp.up], R::SharedGate)?,
                up(&[&s.mlp.down], R::SharedDown)?,
                Some(up(&[&s.gate], R::SharedExpertGate)?),
            ),
            None => (self.empty_linear()?, self.empty_linear()?, None),
        };
        let router = up(&[&m.router], R::Router)?;
        Ok((
            gate_up,
            down,
            Some(MoeDevLayer::new(self.gpu, router, sg, experts)?),
        ))
    }

    /// Layer `i`'s sparse block synthesized from `seed` on the GPU, with the tensor ids and
    /// standard deviations of the CPU's `weights::moe::synthesize`, each linear in `recipe`'s
    /// format for its role (each expert's gate/up sharing one per-tensor scale, as the CPU's
    /// quantizer groups them).
    pub(super) fn synth_moe(
        &self,
        c: &ModelConfig,
        seed: u64,
        i: usize,
        recipe: QuantRecipe,
    ) -> anyhow::Result<LayerMlp> {
        let m = c.moe.as_ref().context("not a mixture of experts")?;
        let h = c.hidden_size;
        let id = |j: u64| weights::synth_moe_tensor_id(i, j);
        let inv = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
        let f = |r: R| recipe.format_for(r);
        let mlp = |j: u64, w: usize, g: R, d: R| -> anyhow::Result<(DLinear, DLinear)> {
            Ok((
                self.synth_linear(seed, &[(id(j), w), (id(j + 1), w)], h, inv(h), f(g))?,
                self.synth_linear(seed, &[(id(j + 2), h)], w, inv(w), f(d))?,
            ))
        };
        let ie = m.expert_intermediate_size;
        let experts = (0..m.num_experts as u64)
            .map(|e| mlp(16 + 3 * e, ie, R::ExpertGate, R::ExpertDown))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let router = self.synth_linear(seed, &[(id(0), m.num_experts)], h, inv(h), f(R::Router))?;
        let (gate_up, down, sg) = if m.has_shared_expert() {
            let (g, d) = mlp(
                1,
                m.shared_expert_intermediate_size,
                R::SharedGate,
                R::SharedDown,
            )?;
            let sg = self.synth_linear(seed, &[(id(4), 1)], h, inv(h), f(R::SharedExpertGate))?;
            (g, d, Some(sg))
        } else {
            (self.empty_linear()?, self.empty_linear()?, None)
        };
        Ok((
            gate_up,
            down,
            Some(MoeDevLayer::new(self.gpu, router, sg, experts)?),
        ))
    }
}

impl CudaBackend {
    /// The residual add + post-attention RMSNorm and the sparse MLP block of layer `li` (its
    /// output in `hout`).
    pub(super) fn moe_mlp(&mut self, li: usize, t: usize, post_norm: u64) -> anyhow::Result<()> {
        let h_ptr = self.bufs.h.ptr();
        self.op_begin()?;
        self.norm(self.bufs.hout.ptr(), 0, t, post_norm, h_ptr)?;
        self.op_end("residual add + RMSNorm")?;
        let hsz = self.config.hidden_size;
        let fused = self.weights.layers[li]
            .moe
            .as_ref()
            .is_some_and(|m| m.shared_fused);
        let (r, bufs, (spec, i), sparse_index, cap_stride) = {
            let mr = self
                .moe
                .as_ref()
                .context("a sparse layer without MoE buffers")?;
            let b = (
                mr.logits.ptr(),
                mr.gu.ptr(),
                mr.act.ptr(),
                mr.y.ptr(),
                (mr.xq.ptr(), mr.xs.ptr()),
                (
                    mr.aq.ptr(),
                    mr.a_scale.ptr(),
                    mr.amax.ptr(),
                    mr.arrivals.ptr(),
                ),
                (mr.shared.ptr(), mr.sgate.ptr(), mr.log.ptr()),
            );
            let shape = (mr.spec(fused), mr.cfg.expert_intermediate_size);
            (
                mr.routing(),
                b,
                shape,
                mr.sparse_index[li],
                mr.capture_stride(),
            )
        };
        let k = spec.pairs_per_token();
        let (logits, gu, act, y, (xq, xs), (aq, a_s, amax, arr), (shared, sgate, log)) = bufs;
        let (gu_t, dn_t, has_shared) = {
            let l = self.weights.layers[li]
                .moe
                .as_ref()
                .context("a sparse layer without experts")?;
            (l.gu, l.down, l.shared_gate.is_some())
        };
        self.op_begin()?;
        self.gemm(LinRef::new(li, LayerLinear::Router), t, h_ptr, logits)?;
        self.op_end("GEMM router")?;
        self.op_begin()?;
        let mr = self.moe.as_ref().context("MoE buffers")?;
        gm::launch_routing(
            &self.gpu,
            &mr.module,
            logits,
            t,
            &spec,
            &r,
            log + 4 * sparse_index as u64,
        )?;
        if let Some(cap) = &mr.capture {
            let at = sparse_index * mr.t_max * cap_stride * 4;
            self.gpu.copy_d2d_range(cap, at, &mr.ids, 0, t * k * 4)?;
        }
        self.op_end("MoE routing (softmax, top-k, group by expert)")?;
        let cols = spec.max_active(t);
        let p = t * k;
        let fp8 = matches!(gu_t, ExpertTables::Fp8 { .. });
        self.op_begin()?;
        let x_in = if fp8 {
            let fq = self
                .fp8q
                .as_ref()
                .context("kernels/fp8_quant.cu is not built (FP8 experts)")?;
            crate::gemm::fp8_quant::launch_quant_rows(&self.gpu, fq, h_ptr, t, hsz, 0.0, xq, xs)?;
            GroupedInput {
                x: xq,
                scales: xs,
                x_div: k,
                tokens: t,
            }
        } else {
            GroupedInput {
                x: h_ptr,
                scales: 0,
                x_div: k,
                tokens: t,
            }
        };
        gm::launch_grouped(
            &self.gpu,
            (
                self.gemv.as_ref(),
                self.moe.as_ref().map(|m| &m.module),
                self.w4_module(),
            ),
            &gu_t,
            &x_in,
            &r,
            gu,
            (2 * i, hsz),
            cols,
        )?;
        self.op_end("grouped GEMM expert gate_up")?;
        self.op_begin()?;
        let a_in = if fp8 {
            let slices = plan::silu_quant_slices(p, i, self.gpu.sm_count as usize);
            launchers::rt::rt_silu_mul_quant(
                &self.rt,
                &self.gpu,
                (dim("pairs", p)?, dim("slices", slices)?, 1),
                (1024, 1, 1),
                0,
                DevPtr::at(gu),
                p,
                i,
                DevPtr::at(act),
                0.0,
                DevPtr::at(aq),
                DevPtr::at(a_s),
                DevPtr::at(amax),
                DevPtr::at(arr),
            )?;
            GroupedInput {
                x: aq,
                scales: a_s,
                x_div: 1,
                tokens: t,
            }
        } else {
            self.silu_mul(gu, act, p, i)?;
            GroupedInput {
                x: act,
                scales: 0,
                x_div: 1,
                tokens: t,
            }
        };
        self.op_end("expert SwiGLU")?;
        self.op_begin()?;
        gm::launch_grouped(
            &self.gpu,
            (
                self.gemv.as_ref(),
                self.moe.as_ref().map(|m| &m.module),
                self.w4_module(),
            ),
            &dn_t,
            &a_in,
            &r,
            y,
            (hsz, i),
            cols,
        )?;
        self.op_end("grouped GEMM expert down")?;
        let shared_in = if has_shared && !fused {
            self.op_begin()?;
            self.gemm(LinRef::new(li, LayerLinear::SharedGate), t, h_ptr, sgate)?;
            self.op_end("GEMM shared_expert_gate")?;
            self.dense_mlp(li, t, shared)?;
            (shared, sgate)
        } else {
            (0, 0)
        };
        self.op_begin()?;
        let mr = self.moe.as_ref().context("MoE buffers")?;
        gm::launch_combine(
            &self.gpu,
            &mr.module,
            y,
            &r,
            (t, k, hsz),
            shared_in,
            self.bufs.hout.ptr(),
        )?;
        self.op_end("MoE combine")?;
        Ok(())
    }

    /// Keep (or stop keeping) every sparse layer's expert ids of each forward pass, for
    /// [`CudaBackend::moe_routes`] (the routing parity check). Captured graphs are dropped.
    ///
    /// # Errors
    /// Not a mixture of experts, or the buffer cannot be allocated.
    pub fn set_moe_route_capture(&mut self, on: bool) -> anyhow::Result<()> {
        self.graphs.clear();
        let mr = self.moe.as_mut().context("not a mixture of experts")?;
        mr.capture = if on {
            let sparse = mr.cfg.sparse_layers.iter().filter(|s| **s).count();
            Some(
                self.gpu
                    .alloc(sparse * mr.t_max * mr.capture_stride() * 4)?,
            )
        } else {
            None
        };
        Ok(())
    }

    /// The expert ids each sparse layer chose in the last forward pass of `t` tokens (captured
    /// by [`CudaBackend::set_moe_route_capture`]): per layer, `t · k` ids in token order, each
    /// token's in `torch.topk`'s order.
    ///
    /// # Errors
    /// No capture on, `t` above the buffers' tokens, or a device failure.
    pub fn moe_routes(&self, t: usize) -> anyhow::Result<Vec<Vec<i32>>> {
        let mr = self.moe.as_ref().context("not a mixture of experts")?;
        let cap = mr.capture.as_ref().context("route capture is off")?;
        anyhow::ensure!(t <= mr.t_max, "{t} tokens; the buffers hold {}", mr.t_max);
        let k = mr.cfg.top_k;
        let stride = mr.capture_stride();
        let fused = self.sparse_layers_fused();
        let all: Vec<i32> = self.gpu.download(cap, 0, fused.len() * mr.t_max * stride)?;
        // A fused layer's tokens carry a (k+1)-th pair, the shared expert: not a routing choice.
        Ok(all
            .chunks(mr.t_max * stride)
            .zip(&fused)
            .map(|(c, f)| {
                let kk = k + usize::from(*f);
                c[..t * kk]
                    .chunks(kk)
                    .flat_map(|tok| tok[..k].iter().copied())
                    .collect()
            })
            .collect())
    }

    /// Per sparse layer, in order: whether its shared expert runs as expert `E` of the grouped
    /// GEMMs ([`MoeDevLayer::fuse_shared_expert`]).
    fn sparse_layers_fused(&self) -> Vec<bool> {
        self.weights
            .layers
            .iter()
            .filter_map(|l| l.moe.as_ref().map(|m| m.shared_fused))
            .collect()
    }

    /// The `kernels/w4a16.cu` module holding the grouped W4A16 GEMM (built when a linear is
    /// NVFP4).
    fn w4_module(&self) -> Option<&Module> {
        self.w4m.iter().find(|m| !m.is_wg()).map(|m| &m.module)
    }

    /// Routed experts touched per sparse layer by the last forward pass (synchronizes the
    /// stream); a fused shared expert (always touched) is not counted.
    ///
    /// # Errors
    /// A device failure.
    pub fn moe_touched_experts_now(&self) -> anyhow::Result<Vec<usize>> {
        let Some(mr) = &self.moe else {
            return Ok(Vec::new());
        };
        let fused = self.sparse_layers_fused();
        let v: Vec<i32> = self.gpu.download(&mr.log, 0, fused.len())?;
        Ok(v.into_iter()
            .zip(fused)
            .map(|(x, f)| (x.max(0) as usize).saturating_sub(usize::from(f)))
            .collect())
    }

    /// Fuse every sparse layer's shared expert into its grouped GEMMs
    /// ([`MoeDevLayer::fuse_shared_expert`]); a layer that cannot keeps the separate path, and
    /// the first reason is noted.
    ///
    /// # Errors
    /// A device failure.
    pub(super) fn fuse_shared_experts(&mut self) -> anyhow::Result<()> {
        let Some(cfg) = self.config.moe.clone() else {
            return Ok(());
        };
        if !cfg.has_shared_expert() {
            return Ok(());
        }
        let spec = super::moe_layer::route_spec(&cfg, false);
        let mut refused: Option<String> = None;
        let mut fused = 0;
        for l in &mut self.weights.layers {
            let (gate_up, down) = (&l.gate_up, &l.down);
            let Some(m) = l.moe.as_mut() else { continue };
            match m.fuse_shared_expert(&self.gpu, spec, gate_up, down)? {
                Ok(()) => fused += 1,
                Err(why) => {
                    refused.get_or_insert(why);
                }
            }
        }
        let sparse = cfg.sparse_layers.iter().filter(|s| **s).count();
        self.notes.push(match refused {
            Some(why) => format!(
                "the shared expert runs as a separate dense MLP in {} of {sparse} sparse layers (as one more expert of the grouped expert GEMMs in {fused}): {why}",
                sparse - fused
            ),
            None => format!(
                "the shared expert runs as one more expert of the grouped expert GEMMs in all {sparse} sparse layers (its gate is the router GEMM's last row)"
            ),
        });
        Ok(())
    }
}
