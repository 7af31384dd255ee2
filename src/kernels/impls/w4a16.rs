//! `w4a16` in the kernel bench: rigbench's own W4A16 NVFP4 GEMM as a [`GemmImpl`] (weights from
//! the bench's seeded data, checked against the f64 reference, then timed). The kernels, their
//! configurations, candidates and launches are the GEMM layer's ([`crate::gemm::w4a16`], the
//! runtime runs the same); this file keeps only the bench's life cycle and the development
//! switch [`ENV_KINDS`], which the runtime does not follow.

use anyhow::Context;

use crate::formats::nvfp4::Nvfp4Weight;
use crate::formats::w4a16_pack::{repack, W4a16Packed};
use crate::formats::GemmFormat;
use crate::gemm::check::W4A16_GEMM_REL_L2;
use crate::gemm::w4a16::{
    all_candidates, kernel_names, kind, launch_view, scratch_needs, v2_name, v2_stage_bytes,
    Config, W4a16View, V2_STAGES, V2_VARIANTS,
};
use crate::gemm::w4a16_wg;
use crate::gpu::cublaslt::{LtGemm, LtKind};
use crate::gpu::ComputeCapability;
use crate::gpu::DevBuf;
use crate::kernels::data::{host_threads, nvfp4_weight};
use crate::kernels::reference::sampled_gemm;
use crate::kernels::schema::KernelFacts;
use crate::kernels::suite::Shape;
use crate::kernels::{Env, GemmImpl, MInputs};
use crate::output::table::plural;

/// Seed of the NVFP4 weights.
pub const SEED_W: u32 = 0x4A16_0001;

/// Environment variable: a comma-separated subset of `fused`, `v2`, `wgmma`, `dequant`; only
/// those paths are offered to the kernel bench's tuner (default: all). A development switch
/// that makes one path's checks and times visible on every case; the runtime's tuning offers
/// every path whatever it says.
pub const ENV_KINDS: &str = "RIGBENCH_W4A16_KINDS";

/// Whether [`ENV_KINDS`] lets configurations of kind `k` ([`crate::gemm::w4a16::kind`]) be
/// offered to the bench.
pub fn kind_offered(k: &str) -> bool {
    match std::env::var(ENV_KINDS) {
        Ok(v) if !v.trim().is_empty() => v.split(',').any(|x| x.trim() == k),
        _ => true,
    }
}

/// The W4A16 implementation.
#[derive(Default)]
pub struct W4a16 {
    host: Option<Nvfp4Weight>,
    packed_meta: Option<(usize, usize, usize, usize, f32)>, // n_pad, k_pad, strips, kt_n, out_scale
    wq: Option<DevBuf>,
    sc: Option<DevBuf>,
    scratch: Option<DevBuf>,
    ws: Option<DevBuf>,
    counters: Option<DevBuf>,
    candidates: Vec<Config>,
    chosen: usize,
    gemm: Option<LtGemm>,
    n: usize,
    k: usize,
    flavor_names: Vec<String>,
    /// Extra copies of (codes, scales) for graph timing over rotating weights.
    copies: Vec<(DevBuf, DevBuf)>,
}

impl W4a16 {
    fn run_with(&self, env: &Env, inp: &MInputs, wq: &DevBuf, sc: &DevBuf) -> anyhow::Result<()> {
        let (_, _, strips, kt_n, out_scale) = self.meta()?;
        // A borrowed view of the shape's buffers (no copy): the launch reads pointers only.
        let view = W4a16View {
            wq: wq.ptr(),
            sc: sc.ptr(),
            n: inp.n,
            k: inp.k,
            strips,
            kt_n,
            out_scale,
        };
        launch_view(
            env.gpu,
            env.w4,
            env.w4v2,
            env.lt,
            &view,
            self.config()?,
            inp.act.ptr(),
            inp.out.ptr(),
            inp.m,
            self.ws.as_ref().map(|b| b.ptr()).unwrap_or(0),
            self.counters.as_ref().map(|b| b.ptr()).unwrap_or(0),
            self.scratch.as_ref().map(|b| b.ptr()).unwrap_or(0),
            self.gemm.as_ref(),
        )
    }

    fn meta(&self) -> anyhow::Result<(usize, usize, usize, usize, f32)> {
        self.packed_meta.context("w4a16: prepare_shape not called")
    }

    fn config(&self) -> anyhow::Result<&Config> {
        self.candidates
            .get(self.chosen)
            .context("w4a16: no configuration selected")
    }
}

impl GemmImpl for W4a16 {
    fn id(&self) -> &'static str {
        "w4a16"
    }
    fn format(&self) -> GemmFormat {
        GemmFormat::W4a16
    }
    fn unsupported(&self, cc: ComputeCapability, shape: &Shape) -> Option<String> {
        if cc.as_int() < 80 {
            return Some(format!(
                "{cc} lacks BF16 mma.sync (sm_80 and up) that the W4A16 kernel uses"
            ));
        }
        (shape.k % 16 != 0)
            .then(|| format!("NVFP4 needs K to be a multiple of 16; K = {}", shape.k))
    }
    fn prepare_shape(&mut self, env: &Env, shape: &Shape) -> anyhow::Result<()> {
        anyhow::ensure!(!env.w4.is_empty(), "kernels/w4a16.cu did not compile");
        let w = nvfp4_weight(shape.n, shape.k, SEED_W, host_threads());
        let p: W4a16Packed = repack(&w)?;
        self.wq = Some(env.gpu.upload(&p.weights)?);
        self.sc = Some(env.gpu.upload(&p.scales)?);
        self.packed_meta = Some((p.n_pad, p.k_pad, p.strips(), p.k_tiles(), p.out_scale));
        self.host = Some(w);
        self.n = shape.n;
        self.k = shape.k;
        Ok(())
    }
    fn release_shape(&mut self) {
        *self = Self::default();
    }
    fn prepare_m(&mut self, env: &Env, inp: &MInputs) -> anyhow::Result<usize> {
        let (_, _, strips, kt_n, _) = self.meta()?;
        let mut cands = all_candidates(
            env.gpu,
            env.w4,
            env.w4v2,
            env.lt.is_some(),
            strips,
            kt_n,
            inp.m,
        )?;
        cands.retain(|c| kind_offered(kind(c)));
        anyhow::ensure!(
            !cands.is_empty(),
            "no W4A16 path for M = {} (cuBLASLt missing, or {ENV_KINDS} offers none)",
            inp.m
        );
        // Buffers for the largest candidate.
        let mut ws_floats = 0usize;
        let mut ctas = 0usize;
        for c in &cands {
            let (w, ctr, _) = scratch_needs(c, inp.n, inp.k);
            ws_floats = ws_floats.max(w);
            ctas = ctas.max(ctr);
        }
        if ws_floats > 0
            && self
                .ws
                .as_ref()
                .map(|b| b.bytes() < ws_floats * 4)
                .unwrap_or(true)
        {
            self.ws = Some(env.gpu.alloc(ws_floats * 4)?);
        }
        if ctas > 0
            && self
                .counters
                .as_ref()
                .map(|b| b.bytes() < ctas * 4)
                .unwrap_or(true)
        {
            let c = env.gpu.alloc(ctas * 4)?;
            env.gpu.memset(&c, 0)?;
            self.counters = Some(c);
        }
        if cands.contains(&Config::DequantGemm) {
            if self.scratch.is_none() {
                self.scratch = Some(env.gpu.alloc(self.n * self.k * 2)?);
            }
            let lt = env.lt.context("cuBLASLt is not available")?;
            self.gemm = Some(LtGemm::plan(lt, LtKind::Bf16, inp.m, inp.n, inp.k)?);
        }
        self.candidates = cands;
        self.chosen = 0;
        self.flavor_names = env.w4.iter().map(|f| f.flavor.clone()).collect();
        Ok(self.candidates.len())
    }
    fn select(&mut self, i: usize) {
        self.chosen = i.min(self.candidates.len().saturating_sub(1));
    }
    fn run(&self, env: &Env, inp: &MInputs) -> anyhow::Result<()> {
        let wq = self.wq.as_ref().context("w4a16: no weights")?;
        let sc = self.sc.as_ref().context("w4a16: no scales")?;
        self.run_with(env, inp, wq, sc)
    }
    fn prepare_weight_copies(&mut self, env: &Env, count: usize) -> anyhow::Result<()> {
        let wq = self
            .wq
            .as_ref()
            .context("w4a16: prepare_shape not called")?;
        let sc = self
            .sc
            .as_ref()
            .context("w4a16: prepare_shape not called")?;
        let qs = super::weight_copies(env, wq, count)?;
        let ss = super::weight_copies(env, sc, count)?;
        self.copies = qs.into_iter().zip(ss).collect();
        Ok(())
    }
    fn run_on_copy(&self, env: &Env, inp: &MInputs, copy: usize) -> anyhow::Result<()> {
        if copy == 0 {
            return self.run(env, inp);
        }
        let (wq, sc) = self
            .copies
            .get(copy - 1)
            .with_context(|| format!("w4a16: weight copy {copy} was not made"))?;
        self.run_with(env, inp, wq, sc)
    }
    fn release_weight_copies(&mut self) {
        self.copies.clear();
    }
    fn path(&self) -> String {
        let n = self.candidates.len();
        let tuned = if n > 1 {
            format!("; fastest of {n} checked configurations on this card")
        } else {
            String::new()
        };
        match self.config() {
            Ok(Config::Fused {
                flavor,
                nt,
                warps,
                wn,
                ks,
                splits,
                chunk,
                ..
            }) => format!(
                "rigbench fused W4A16 (E2M1→BF16 in registers, mma.sync m16n8k16 BF16/FP32), flavour '{}': {}, {warps} warps/CTA, {}{}, split-K {splits}{}{tuned}",
                self.flavor_names.get(*flavor).map(String::as_str).unwrap_or("?"),
                plural(*chunk.min(&(nt * 8)) as u64, "token/launch", "tokens/launch"),
                plural(*wn as u64, "strip/warp", "strips/warp"),
                if *ks {
                    " shared by the CTA's warps, K split between them (in-CTA ordered sum)"
                } else {
                    ""
                },
                if *splits > 1 { " (deterministic fixed-order reduction)" } else { "" }
            ),
            Ok(Config::V2 {
                nt,
                warps,
                wn,
                stages,
                ctas,
                max_slices,
                ..
            }) => format!(
                "rigbench W4A16 v2 (Marlin-style: {ctas} persistent CTAs over K×N stripes, {stages}-stage cp.async ring, activations shared in smem, mma.sync m16n8k16 BF16/FP32): {} token slots, {warps} warps/CTA, {}{}{tuned}",
                nt * 8,
                plural(*wn as u64, "strip/warp", "strips/warp"),
                if *max_slices > 1 {
                    format!(", up to {max_slices} slices per column group (deterministic ordered reduction)")
                } else {
                    String::new()
                }
            ),
            Ok(c @ Config::Wg { .. }) => format!("{}{tuned}", w4a16_wg::describe(c)),
            Ok(Config::DequantGemm) => format!(
                "rigbench dequant NVFP4→BF16 scratch + {}{tuned}",
                self.gemm.as_ref().map(|g| g.description.as_str()).unwrap_or("cuBLASLt BF16")
            ),
            Err(_) => String::new(),
        }
    }
    fn reference(
        &self,
        _env: &Env,
        inp: &MInputs,
        rows: &[usize],
        cols: &[usize],
    ) -> anyhow::Result<Vec<f64>> {
        let w = self.host.as_ref().context("w4a16: no host weights")?;
        let k = self.k;
        let w_row = |n: usize| -> Vec<f64> { (0..k).map(|kk| w.value_f64(n, kk)).collect() };
        Ok(sampled_gemm(rows, cols, k, &|m| inp.act_row(m), &w_row))
    }
    fn tolerance(&self) -> (&'static str, f64) {
        ("W4A16_GEMM_REL_L2", W4A16_GEMM_REL_L2)
    }
    fn kernel_facts(&self, env: &Env) -> Vec<KernelFacts> {
        let mut out = Vec::new();
        for fm in env.w4 {
            let w4 = &fm.module;
            if fm.is_wg() {
                for (tn, wg, pipe) in w4a16_wg::instances() {
                    let name = w4a16_wg::name(tn, wg, pipe);
                    if let Ok(a) = w4.attrs(&name) {
                        out.push(KernelFacts {
                            name,
                            registers: a.registers,
                            local_bytes: a.local_bytes,
                            static_shared_bytes: a.static_shared_bytes,
                            dynamic_shared_bytes: w4a16_wg::smem_bytes(
                                tn,
                                wg,
                                w4a16_wg::STAGE_CHOICES[0],
                            ) as u32,
                            threads_per_block: (wg * 128) as u32,
                            max_threads_per_block: a.max_threads_per_block,
                            arch: w4.arch.clone(),
                        });
                    }
                }
                continue;
            }
            out.extend(kernel_names().iter().filter_map(|name| {
                let a = w4.attrs(name).ok()?;
                let threads = name
                    .split("_w")
                    .nth(1)
                    .and_then(|s| s.split('_').next())
                    .and_then(|w| w.parse::<u32>().ok())
                    .map(|w| w * 32)
                    .unwrap_or(256);
                Some(KernelFacts {
                    name: format!("{name} [{}]", fm.flavor),
                    registers: a.registers,
                    local_bytes: a.local_bytes,
                    static_shared_bytes: a.static_shared_bytes,
                    dynamic_shared_bytes: 0,
                    threads_per_block: threads,
                    max_threads_per_block: a.max_threads_per_block,
                    arch: w4.arch.clone(),
                })
            }));
        }
        if let Some(v2) = env.w4v2 {
            for &(nt, warps, wn) in V2_VARIANTS {
                let name = v2_name(nt, warps, wn);
                if let Ok(a) = v2.attrs(&name) {
                    out.push(KernelFacts {
                        name,
                        registers: a.registers,
                        local_bytes: a.local_bytes,
                        static_shared_bytes: a.static_shared_bytes,
                        dynamic_shared_bytes: (V2_STAGES[1] * v2_stage_bytes(nt, warps, wn)) as u32,
                        threads_per_block: (warps * 32) as u32,
                        max_threads_per_block: a.max_threads_per_block,
                        arch: v2.arch.clone(),
                    });
                }
            }
        }
        out
    }
}
