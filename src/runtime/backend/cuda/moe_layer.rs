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
