//! The sparse MLP blocks of mixture-of-experts models on the CUDA backend (docs/runtime.md,
//! "Mixtures of experts"): the device layer ([`MoeDevLayer`]: router, routed experts with their
//! address tables, the shared expert's gate), the per-step buffers ([`MoeRt`]), the three ways a
//! layer is loaded (host weights, a checkpoint, a seed) and the forward pass of one block.
//!
//! One block, `t` tokens, top-k (every step inside the decode step's CUDA graph, no host sync):
//! RMSNorm → router GEMM (BF16 logits `[t, E]`) → routing (`moe_route`, `moe_sort`) → grouped
//! gate_up → SwiGLU (fused with the FP8 quantization when the experts are FP8) → grouped down →
//! the shared expert as a dense SwiGLU MLP with its sigmoid gate → combine into `hout`. The
//! routing, grouped GEMMs and combine are the GEMM layer's ([`crate::gemm::moe`]).

use anyhow::Context;

use super::load::Loader;
use super::{launchers, plan, CudaBackend, DLinear, LayerLinear, LinRef};
use crate::gemm::moe::{self as gm, ExpertTables, GroupedInput, Routing};
use crate::gpu::{dim, DevBuf, DevPtr, Gpu, Module};
use crate::model::moe::MoeConfig;
use crate::runtime::config::{ModelConfig, QuantRecipe, WeightFormat};
use crate::runtime::weights::{self, LinearRole as R, MoeWeights};

/// A sparse layer's device tensors other than the shared expert's MLP (which sits in the
/// layer's `gate_up` / `down`, as a dense MLP does).
pub(super) struct MoeDevLayer {
    /// `mlp.gate`, `[E, H]`, BF16.
    pub(super) router: DLinear,
    /// `mlp.shared_expert_gate`, `[1, H]` (with a shared expert).
    pub(super) shared_gate: Option<DLinear>,
    /// Per expert: `[gate; up]` `[2·I, H]` and `down` `[H, I]`, all in one format.
    experts: Vec<(DLinear, DLinear)>,
    /// The address tables of the grouped gate_up and down.
    pub(super) gu: ExpertTables,
    pub(super) down: ExpertTables,
    /// The buffers behind the tables.
    _tables: (DevBuf, Option<DevBuf>),
    /// The experts' format.
    pub(super) format: WeightFormat,
}

impl MoeDevLayer {
    /// Build the tables over `experts` (each `(gate_up, down)`).
    ///
    /// # Errors
    /// No experts, experts of mixed formats or shapes, or a failed upload.
    pub(super) fn new(
        gpu: &Gpu,
        router: DLinear,
        shared_gate: Option<DLinear>,
        experts: Vec<(DLinear, DLinear)>,
    ) -> anyhow::Result<Self> {
        let first = experts.first().context("a sparse layer without experts")?;
        let format = first.0.format();
        let shapes = (first.0.nk(), first.1.nk());
        anyhow::ensure!(
            experts
                .iter()
                .all(|(g, d)| g.format() == format
                    && d.format() == format
                    && (g.nk(), d.nk()) == shapes),
            "the routed experts of one layer must share one format and shape on the CUDA backend (its grouped GEMM runs them in one launch)"
        );
        let e = experts.len() as u64;
        let mut ptrs: Vec<u64> = Vec::with_capacity(4 * experts.len());
        let mut scales: Vec<f32> = Vec::new();
        for pick in [0usize, 1] {
            let lin = |x: &(DLinear, DLinear)| -> (u64, u64, f32) {
                match if pick == 0 { &x.0 } else { &x.1 } {
                    DLinear::Bf16 { w, .. } => (w.ptr(), 0, 0.0),
                    DLinear::Fp8 { w, scales, .. } => (w.ptr(), scales.ptr(), 0.0),
                    DLinear::W4 { dev } => (dev.wq.ptr(), dev.sc.ptr(), dev.out_scale),
                }
            };
            let v: Vec<(u64, u64, f32)> = experts.iter().map(lin).collect();
            ptrs.extend(v.iter().map(|x| x.0));
            ptrs.extend(v.iter().map(|x| x.1));
            scales.extend(v.iter().map(|x| x.2));
        }
        let table = gpu.upload(&ptrs)?;
        let os = if format == WeightFormat::Nvfp4 {
            Some(gpu.upload(&scales)?)
        } else {
            None
        };
        let base = table.ptr();
        let at = |i: u64| base + 8 * e * i;
        let tables = |w: u64, s: u64, os_at: u64, lin: &DLinear| -> ExpertTables {
            match lin {
                DLinear::Bf16 { .. } => ExpertTables::Bf16 { w },
                DLinear::Fp8 { .. } => ExpertTables::Fp8 { w, s },
                DLinear::W4 { dev } => ExpertTables::W4 {
                    wq: w,
                    sc: s,
                    out_scales: os_at,
                    strips: dev.strips,
                    kt_n: dev.kt_n,
                },
            }
        };
        let os_ptr = os.as_ref().map_or(0, |b| b.ptr());
        let gu = tables(at(0), at(1), os_ptr, &first.0);
        let down = tables(at(2), at(3), os_ptr + 4 * e, &first.1);
        Ok(Self {
            router,
            shared_gate,
            experts,
            gu,
            down,
            _tables: (table, os),
            format,
        })
    }

    /// Device bytes of the router, the shared expert's gate and every routed expert.
    pub(super) fn bytes(&self) -> usize {
        self.router.bytes()
            + self.shared_gate.as_ref().map_or(0, |g| g.bytes())
            + self
                .experts
                .iter()
                .map(|(g, d)| g.bytes() + d.bytes())
                .sum::<usize>()
    }

    /// Device bytes of one routed expert (gate_up and down).
    pub(super) fn expert_bytes(&self) -> usize {
        self.experts
            .first()
            .map_or(0, |(g, d)| g.bytes() + d.bytes())
    }

    /// Routed experts.
    pub(super) fn num_experts(&self) -> usize {
        self.experts.len()
    }

    /// The first expert's gate_up (its format is every expert's).
    pub(super) fn experts_first(&self) -> Option<&DLinear> {
        self.experts.first().map(|x| &x.0)
    }
}

/// The buffers of the sparse blocks (one set, reused by every layer), sized for `t` tokens.
pub(super) struct MoeRt {
    module: Module,
    cfg: MoeConfig,
    logits: DevBuf,
    ids: DevBuf,
    wts: DevBuf,
    sorted: DevBuf,
    active: DevBuf,
    offsets: DevBuf,
    n_active: DevBuf,
    /// Experts touched per sparse layer by the last forward pass (`i32` each).
    log: DevBuf,
    gu: DevBuf,
    act: DevBuf,
    y: DevBuf,
    xq: DevBuf,
    xs: DevBuf,
    aq: DevBuf,
    a_scale: DevBuf,
    amax: DevBuf,
    arrivals: DevBuf,
    shared: DevBuf,
    sgate: DevBuf,
    /// Tokens the buffers hold.
    t_max: usize,
    /// Every sparse layer's expert ids of the last forward pass (`[layer][t_max · k]`), when
    /// captured ([`CudaBackend::set_moe_route_capture`]).
    capture: Option<DevBuf>,
}

impl MoeRt {
    /// Build `kernels/moe.cu` and the buffers for `t` tokens of `c`.
    ///
    /// # Errors
    /// Routing the GPU kernels do not take ([`gm::unsupported`]), a build or allocation failure.
    pub(super) fn new(gpu: &Gpu, c: &ModelConfig, t: usize) -> anyhow::Result<Self> {
        let m = c.moe.clone().context("not a mixture of experts")?;
        if let Some(why) = gm::unsupported(m.num_experts, m.top_k) {
            anyhow::bail!("{why}");
        }
        let names = gm::kernel_names();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let module = gpu
            .compile("moe", gm::SRC, &refs)
            .context("building kernels/moe.cu")?;
        let (e, k, h) = (m.num_experts, m.top_k, c.hidden_size);
        let i = m.expert_intermediate_size;
        let p = t * k;
        let cols = gm::max_active(e, k, t);
        let sparse = m.sparse_layers.iter().filter(|s| **s).count().max(1);
        let zeros = |n: usize| gpu.upload(&vec![0u32; n.max(1)]);
        Ok(Self {
            module,
            logits: gpu.alloc(t * e * 2)?,
            ids: gpu.alloc(p * 4)?,
            wts: gpu.alloc(p * 4)?,
            sorted: gpu.alloc(p * 4)?,
            active: gpu.alloc(cols * 4)?,
            offsets: gpu.alloc((cols + 1) * 4)?,
            n_active: zeros(1)?,
            log: zeros(sparse)?,
            gu: gpu.alloc(p * 2 * i * 2)?,
            act: gpu.alloc(p * i * 2)?,
            y: gpu.alloc(p * h * 2)?,
            xq: gpu.alloc(t * h)?,
            xs: gpu.alloc(t * 4)?,
            aq: gpu.alloc(p * i)?,
            a_scale: gpu.alloc(p * 4)?,
            amax: zeros(p)?,
            arrivals: zeros(p)?,
            shared: gpu.alloc(t * h * 2)?,
            sgate: gpu.alloc(t * 2)?,
            t_max: t,
            capture: None,
            cfg: m,
        })
    }

    /// Device bytes of the buffers.
    pub(super) fn bytes(&self) -> usize {
        [
            &self.logits,
            &self.ids,
            &self.wts,
            &self.sorted,
            &self.active,
            &self.offsets,
            &self.gu,
            &self.act,
            &self.y,
            &self.xq,
            &self.xs,
            &self.aq,
            &self.a_scale,
            &self.shared,
            &self.sgate,
        ]
        .iter()
        .map(|b| b.bytes())
        .sum()
    }

    /// The source's SHA-256 (for the report's kernel list).
    pub(super) fn source_sha256(&self) -> &str {
        &self.module.source_sha256
    }

    fn routing(&self) -> Routing {
        Routing {
            ids: self.ids.ptr(),
            weights: self.wts.ptr(),
            sorted: self.sorted.ptr(),
            active: self.active.ptr(),
            offsets: self.offsets.ptr(),
            n_active: self.n_active.ptr(),
        }
    }
}

/// Bytes the CUDA backend's routed experts take for `c` under `recipe` (every sparse layer's E
/// experts in the recipe's expert formats, NVFP4 in the kernel layout), the part of
/// [`super::gdn::predicted_weight_bytes`] that [`crate::model::roles::LinearRole::of_layer`]
/// leaves out.
pub(super) fn predicted_expert_bytes(c: &ModelConfig, recipe: QuantRecipe) -> u64 {
    let Some(m) = &c.moe else { return 0 };
    let per: u64 = R::EXPERT
        .iter()
        .map(|r| {
            let (n, k) = r.shape(c);
            crate::runtime::memory::linear_bytes(recipe.format_for(*r), n, k)
        })
        .sum();
    let sparse = (0..c.num_layers).filter(|&i| m.is_sparse(i)).count() as u64;
    sparse * m.num_experts as u64 * per
}

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
        let (cfg, r, bufs) = {
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
            (mr.cfg.clone(), mr.routing(), b)
        };
        let (logits, gu, act, y, (xq, xs), (aq, a_s, amax, arr), (shared, sgate, log)) = bufs;
        let (e, k, i) = (cfg.num_experts, cfg.top_k, cfg.expert_intermediate_size);
        let sparse_index = cfg.sparse_layers[..li].iter().filter(|s| **s).count();
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
        gm::launch_route(
            &self.gpu,
            &mr.module,
            logits,
            t,
            e,
            k,
            cfg.norm_topk_prob,
            &r,
        )?;
        gm::launch_sort(
            &self.gpu,
            &mr.module,
            t * k,
            e,
            &r,
            log + 4 * sparse_index as u64,
        )?;
        if let Some(cap) = &mr.capture {
            let at = sparse_index * mr.t_max * k * 4;
            self.gpu.copy_d2d_range(cap, at, &mr.ids, 0, t * k * 4)?;
        }
        self.op_end("MoE routing (softmax, top-k, group by expert)")?;
        let cols = gm::max_active(e, k, t);
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
            }
        } else {
            GroupedInput {
                x: h_ptr,
                scales: 0,
                x_div: k,
            }
        };
        gm::launch_grouped(
            &self.gpu,
            self.gemv.as_ref(),
            self.w4_module(),
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
            }
        } else {
            launchers::rt::rt_silu_mul(
                &self.rt,
                &self.gpu,
                super::grid1(p * i, 256),
                (256, 1, 1),
                0,
                DevPtr::at(gu),
                p,
                i,
                DevPtr::at(act),
            )?;
            GroupedInput {
                x: act,
                scales: 0,
                x_div: 1,
            }
        };
        self.op_end("expert SwiGLU")?;
        self.op_begin()?;
        gm::launch_grouped(
            &self.gpu,
            self.gemv.as_ref(),
            self.w4_module(),
            &dn_t,
            &a_in,
            &r,
            y,
            (hsz, i),
            cols,
        )?;
        self.op_end("grouped GEMM expert down")?;
        let shared_in = if has_shared {
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
            Some(self.gpu.alloc(sparse * mr.t_max * mr.cfg.top_k * 4)?)
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
        let sparse = mr.cfg.sparse_layers.iter().filter(|s| **s).count();
        let all: Vec<i32> = self.gpu.download(cap, 0, sparse * mr.t_max * k)?;
        Ok(all
            .chunks(mr.t_max * k)
            .map(|c| c[..t * k].to_vec())
            .collect())
    }

    /// The `kernels/w4a16.cu` module holding the grouped W4A16 GEMM (built when a linear is
    /// NVFP4).
    fn w4_module(&self) -> Option<&Module> {
        self.w4m.iter().find(|m| !m.is_wg()).map(|m| &m.module)
    }

    /// Experts touched per sparse layer by the last forward pass (synchronizes the stream).
    ///
    /// # Errors
    /// A device failure.
    pub fn moe_touched_experts_now(&self) -> anyhow::Result<Vec<usize>> {
        let Some(mr) = &self.moe else {
            return Ok(Vec::new());
        };
        let n = mr.cfg.sparse_layers.iter().filter(|s| **s).count();
        let v: Vec<i32> = self.gpu.download(&mr.log, 0, n)?;
        Ok(v.into_iter().map(|x| x.max(0) as usize).collect())
    }
}
