//! The device types of the sparse MLP blocks (docs/runtime.md, "Mixtures of experts"): a sparse
//! layer's router, routed experts and their address tables ([`MoeDevLayer`]), the per-step
//! routing buffers ([`MoeRt`]). Loading, the forward pass and the prediction of the experts'
//! bytes are in `moe.rs`; this file names nothing of the rest of the runtime but the config, so
//! the backend's types do not depend on its loaders.

use anyhow::Context;

use super::linear::DLinear;
use crate::gemm::moe::{self as gm, ExpertTables, Routing};
use crate::gpu::{DevBuf, Gpu, Module};
use crate::model::moe::MoeConfig;
use crate::runtime::config::{ModelConfig, WeightFormat};

/// A sparse layer's device tensors other than the shared expert's MLP (which sits in the
/// layer's `gate_up` / `down`, as a dense MLP does).
pub(super) struct MoeDevLayer {
    /// `mlp.gate`, `[E, H]`, BF16; with the shared expert fused ([`Self::shared_fused`]),
    /// `[E + 1, H]`: the shared expert's gate is its last row.
    pub(super) router: DLinear,
    /// `mlp.shared_expert_gate`, `[1, H]` (with a shared expert that is not fused).
    pub(super) shared_gate: Option<DLinear>,
    /// Per expert: `[gate; up]` `[2·I, H]` and `down` `[H, I]`, all in one format.
    experts: Vec<(DLinear, DLinear)>,
    /// The address tables of the grouped gate_up and down (`E` entries, or `E + 1` with the
    /// shared expert's linears last).
    pub(super) gu: ExpertTables,
    pub(super) down: ExpertTables,
    /// The buffers behind the tables.
    _tables: (DevBuf, Option<DevBuf>),
    /// The experts' format.
    pub(super) format: WeightFormat,
    /// The shared expert runs as expert `E` of the grouped GEMMs
    /// ([`MoeDevLayer::fuse_shared_expert`], `gm::RouteSpec::shared`).
    pub(super) shared_fused: bool,
}

/// The grouped gate_up and down tables over `entries` (each `(gate_up, down)`, one format and
/// shape), and the device buffers behind them.
fn tables_over(
    gpu: &Gpu,
    entries: &[(&DLinear, &DLinear)],
) -> anyhow::Result<(ExpertTables, ExpertTables, (DevBuf, Option<DevBuf>))> {
    let first = entries.first().context("a sparse layer without experts")?;
    let format = first.0.format();
    let shapes = (first.0.nk(), first.1.nk());
    anyhow::ensure!(
        entries.iter().all(|(g, d)| g.format() == format
            && d.format() == format
            && (g.nk(), d.nk()) == shapes),
        "the routed experts of one layer must share one format and shape on the CUDA backend (its grouped GEMM runs them in one launch)"
    );
    let e = entries.len() as u64;
    let mut ptrs: Vec<u64> = Vec::with_capacity(4 * entries.len());
    let mut scales: Vec<f32> = Vec::new();
    for pick in [0usize, 1] {
        let v: Vec<(u64, u64, f32)> = entries
            .iter()
            .map(|x| match if pick == 0 { x.0 } else { x.1 } {
                DLinear::Bf16 { w, .. } => (w.ptr(), 0, 0.0),
                DLinear::Fp8 { w, scales, .. } => (w.ptr(), scales.ptr(), 0.0),
                DLinear::W4 { dev } => (dev.wq.ptr(), dev.sc.ptr(), dev.out_scale),
            })
            .collect();
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
    let gu = tables(at(0), at(1), os_ptr, first.0);
    let down = tables(at(2), at(3), os_ptr + 4 * e, first.1);
    Ok((gu, down, (table, os)))
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
        let refs: Vec<(&DLinear, &DLinear)> = experts.iter().map(|(g, d)| (g, d)).collect();
        let (gu, down, bufs) = tables_over(gpu, &refs)?;
        let format = refs[0].0.format();
        Ok(Self {
            router,
            shared_gate,
            experts,
            gu,
            down,
            _tables: bufs,
            format,
            shared_fused: false,
        })
    }

    /// Run the shared expert (`gate_up` `[2·I, H]`, `down` `[H, I]`, the layer's MLP slots) as
    /// expert `E` of the grouped GEMMs: the tables are rebuilt over `E + 1` entries and the
    /// router takes the shared gate's row (`[E + 1, H]`), so one router GEMM, one routing
    /// kernel, two grouped GEMMs and one combine run the whole block (the shared expert's
    /// gate GEMM, gate_up GEMM, SwiGLU and down GEMM go). Returns why not, leaving the layer
    /// as it was: no shared expert, a shared expert of another format or intermediate size
    /// than the routed ones, an FP8 one with a static activation scale (the grouped path
    /// quantizes per token), a router or gate not in BF16, or routing the kernels do not take.
    ///
    /// # Errors
    /// A device failure while building the new tables or router.
    pub(super) fn fuse_shared_expert(
        &mut self,
        gpu: &Gpu,
        spec: gm::RouteSpec,
        gate_up: &DLinear,
        down: &DLinear,
    ) -> anyhow::Result<Result<(), String>> {
        let Some(gate) = &self.shared_gate else {
            return Ok(Err("no shared expert".into()));
        };
        let first = self
            .experts
            .first()
            .context("a sparse layer without experts")?;
        if (gate_up.format(), down.format()) != (self.format, self.format)
            || (gate_up.nk(), down.nk()) != (first.0.nk(), first.1.nk())
        {
            return Ok(Err(format!(
                "the shared expert ({} {:?} / {:?}) differs from the routed experts ({} {:?} / {:?}) in format or shape",
                gate_up.format().id(),
                gate_up.nk(),
                down.nk(),
                self.format.id(),
                first.0.nk(),
                first.1.nk()
            )));
        }
        if [gate_up, down].iter().any(|l| {
            matches!(
                l,
                DLinear::Fp8 {
                    static_scale: Some(_),
                    ..
                }
            )
        }) {
            return Ok(Err(
                "the shared expert's FP8 linears carry a static activation scale; the grouped GEMMs quantize per token".into(),
            ));
        }
        let (DLinear::Bf16 { w: rw, n: e, k: h }, DLinear::Bf16 { w: gw, n: 1, .. }) =
            (&self.router, gate)
        else {
            return Ok(Err(
                "the router or the shared expert's gate is not BF16".into()
            ));
        };
        let (e, h) = (*e, *h);
        if let Some(why) = (gm::RouteSpec {
            shared: true,
            ..spec
        })
        .unsupported()
        {
            return Ok(Err(why));
        }
        let merged = gpu.alloc((e + 1) * h * 2)?;
        gpu.copy_d2d_range(&merged, 0, rw, 0, e * h * 2)?;
        gpu.copy_d2d_range(&merged, e * h * 2, gw, 0, h * 2)?;
        let mut refs: Vec<(&DLinear, &DLinear)> =
            self.experts.iter().map(|(g, d)| (g, d)).collect();
        refs.push((gate_up, down));
        let (gu, dn, bufs) = tables_over(gpu, &refs)?;
        self.gu = gu;
        self.down = dn;
        self._tables = bufs;
        self.router = DLinear::Bf16 {
            w: merged,
            n: e + 1,
            k: h,
        };
        self.shared_gate = None;
        self.shared_fused = true;
        Ok(Ok(()))
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
    pub(super) module: Module,
    pub(super) cfg: MoeConfig,
    pub(super) logits: DevBuf,
    pub(super) ids: DevBuf,
    pub(super) wts: DevBuf,
    pub(super) sorted: DevBuf,
    pub(super) active: DevBuf,
    pub(super) offsets: DevBuf,
    pub(super) n_active: DevBuf,
    /// Experts touched per sparse layer by the last forward pass (`i32` each).
    pub(super) log: DevBuf,
    pub(super) gu: DevBuf,
    pub(super) act: DevBuf,
    pub(super) y: DevBuf,
    pub(super) xq: DevBuf,
    pub(super) xs: DevBuf,
    pub(super) aq: DevBuf,
    pub(super) a_scale: DevBuf,
    pub(super) amax: DevBuf,
    pub(super) arrivals: DevBuf,
    pub(super) shared: DevBuf,
    pub(super) sgate: DevBuf,
    /// Tokens the buffers hold.
    pub(super) t_max: usize,
    /// Per decoder layer, its index among the sparse layers (the slot of its log and capture).
    pub(super) sparse_index: Vec<usize>,
    /// Every sparse layer's expert ids of the last forward pass (`[layer][t_max · k]`), when
    /// captured (`CudaBackend::set_moe_route_capture`).
    pub(super) capture: Option<DevBuf>,
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
        let h = c.hidden_size;
        let i = m.expert_intermediate_size;
        // Sized for the shared expert routed as one more expert where the model has one (the
        // layers that fuse it; the others use a prefix of each buffer).
        let widest = gm::RouteSpec {
            shared: m.has_shared_expert(),
            ..route_spec(&m, false)
        };
        let p = t * widest.pairs_per_token();
        let cols = widest.max_active(t);
        let sparse = m.sparse_layers.iter().filter(|s| **s).count().max(1);
        let zeros = |n: usize| gpu.upload(&vec![0u32; n.max(1)]);
        Ok(Self {
            module,
            logits: gpu.alloc(t * widest.table_experts() * 2)?,
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
            sparse_index: m
                .sparse_layers
                .iter()
                .scan(0, |n, s| {
                    let i = *n;
                    *n += usize::from(*s);
                    Some(i)
                })
                .collect(),
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

    /// Ids per token of each layer's slot in the route capture and `ids`: `k`, or `k + 1`
    /// where the model has a shared expert (a fused layer's last id is the shared expert).
    pub(super) fn capture_stride(&self) -> usize {
        self.cfg.top_k + usize::from(self.cfg.has_shared_expert())
    }

    /// The routing of a sparse layer (`shared_fused`: its shared expert runs as expert `E`).
    pub(super) fn spec(&self, shared_fused: bool) -> gm::RouteSpec {
        route_spec(&self.cfg, shared_fused)
    }

    pub(super) fn routing(&self) -> Routing {
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

/// The routing of a sparse layer of `m` (`shared_fused`: its shared expert runs as expert `E`).
pub(super) fn route_spec(m: &MoeConfig, shared_fused: bool) -> gm::RouteSpec {
    gm::RouteSpec {
        experts: m.num_experts,
        top_k: m.top_k,
        renormalize: m.norm_topk_prob,
        shared: shared_fused,
    }
}
