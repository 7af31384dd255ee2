//! `w4a16`: rigbench's own W4A16 NVFP4 GEMM (kernels/w4a16.cu): NVFP4 weights (ModelOpt layout,
//! repacked offline by [`crate::formats::w4a16_pack`]), BF16 activations, BF16 output.
//!
//! Two paths, both holding only the 4-bit weights between calls:
//! - fused (M ≤ 512): E2M1 → BF16 in registers and `mma.sync` BF16 with FP32 accumulation, split-K
//!   across CTAs with a deterministic fixed-order reduction; M > 64 runs as chunks of 64 tokens;
//! - dequant + GEMM (M ≥ 128): the weights are expanded to a BF16 scratch buffer and multiplied by
//!   cuBLASLt, as vLLM's AWQ path does for large batches (`awq_dequantize` + matmul once the
//!   token count reaches 256). Its time includes the expansion.
//!
//! Which path and launch configuration runs is chosen per (shape, M) by measurement among the
//! candidates below (each checked against the reference first); the report names the choice.

use anyhow::Context;

use crate::formats::nvfp4::Nvfp4Weight;
use crate::formats::w4a16_pack::{repack, W4a16Packed};
use crate::formats::GemmFormat;
use crate::gpu::cublaslt::{Lt, LtGemm, LtKind};
use crate::gpu::{DevBuf, Gpu, KArg};
use crate::kernels::data::{host_threads, nvfp4_weight};
use crate::kernels::reference::{sampled_gemm, W4A16_GEMM_REL_L2};
use crate::kernels::schema::KernelFacts;
use crate::kernels::suite::Shape;
use crate::kernels::{Env, GemmImpl, MInputs, W4Module};
use crate::rig::ComputeCapability;

/// Seed of the NVFP4 weights.
pub const SEED_W: u32 = 0x4A16_0001;
/// Token-tile sizes (8 tokens each) the fused kernel is built for.
pub const NT_VARIANTS: [usize; 4] = [1, 2, 4, 8];
/// Warps per CTA variants.
pub const WARP_VARIANTS: [usize; 2] = [4, 8];
/// 16-row strips per warp variants.
pub const WN_VARIANTS: [usize; 3] = [1, 2, 4];
/// Largest M the fused path is offered for (8 chunks of 64 tokens).
pub const FUSED_MAX_M: usize = 512;
/// Smallest M the dequant + GEMM path is offered for.
pub const DEQUANT_MIN_M: usize = 128;

/// All kernel names in kernels/w4a16.cu.
pub fn kernel_names() -> Vec<String> {
    let mut v = Vec::new();
    for nt in NT_VARIANTS {
        for w in WARP_VARIANTS {
            for wn in WN_VARIANTS {
                v.push(fused_name(nt, w, wn));
            }
        }
    }
    v.push("w4a16_dequant_bf16".into());
    v
}

fn fused_name(nt: usize, warps: usize, wn: usize) -> String {
    format!("w4a16_nt{nt}_w{warps}_n{wn}")
}

/// One launch configuration.
#[derive(Debug, Clone, PartialEq)]
pub enum Config {
    /// The fused kernel.
    Fused {
        /// Index into [`Env::w4`] (the compiled flavour).
        flavor: usize,
        /// Token tiles of 8 per launch.
        nt: usize,
        /// Warps per CTA.
        warps: usize,
        /// Strips per warp.
        wn: usize,
        /// CTAs along K (split-K).
        splits: usize,
        /// k-tile pairs per split.
        pairs_per_split: usize,
        /// CTAs along N.
        ctas_x: usize,
        /// Tokens per launch (M is run as ⌈M / chunk⌉ launches).
        chunk: usize,
    },
    /// Expand to BF16 scratch, then cuBLASLt.
    DequantGemm,
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
}

/// Fused-kernel configurations for `m` tokens of a weight with `strips` 16-row strips and `kt_n`
/// 64-wide k tiles: every compiled variant for the token tile that does not spill registers,
/// each with split-K counts chosen from its occupancy so the grid fills the resident CTA slots
/// with little wave quantization.
///
/// # Errors
/// No compiled module, or a failing occupancy query.
pub fn fused_candidates(
    gpu: &Gpu,
    modules: &[W4Module],
    strips: usize,
    kt_n: usize,
    m: usize,
) -> anyhow::Result<Vec<Config>> {
    anyhow::ensure!(!modules.is_empty(), "kernels/w4a16.cu did not compile");
    let sm = gpu.sm_count.max(1) as usize;
    let chunk = m.min(64);
    let tiles = chunk.div_ceil(8);
    let nt = *NT_VARIANTS.iter().find(|v| **v >= tiles).unwrap_or(&8);
    let pairs = kt_n / 2;
    let mut out = Vec::new();
    for (flavor, fm) in modules.iter().enumerate() {
        let w4 = &fm.module;
        for warps in WARP_VARIANTS {
            for wn in WN_VARIANTS {
                let name = fused_name(nt, warps, wn);
                let attrs = w4.attrs(&name)?;
                if attrs.local_bytes > 0 {
                    continue; // spills registers to local memory
                }
                let occ = w4.occupancy(&name, (warps * 32) as u32)? as usize;
                if occ == 0 {
                    continue;
                }
                let slots = occ * sm;
                let ctas_x = strips.div_ceil(warps * wn);
                let total = |s: usize| ctas_x * pairs.div_ceil(pairs.div_ceil(s));
                let eff = |s: usize| {
                    let t = total(s);
                    t as f64 / (t.div_ceil(slots) * slots) as f64
                };
                let fill = slots.div_ceil(ctas_x).clamp(1, pairs);
                let mut splits = vec![fill];
                if let Some(best) =
                    (1..=pairs.min(4 * fill)).find(|s| total(*s) >= slots / 2 && eff(*s) >= 0.95)
                {
                    splits.push(best);
                }
                if ctas_x >= slots / 2 {
                    splits.push(1);
                }
                for sp in splits {
                    let pps = pairs.div_ceil(sp);
                    let sp = pairs.div_ceil(pps);
                    let c = Config::Fused {
                        flavor,
                        nt,
                        warps,
                        wn,
                        splits: sp,
                        pairs_per_split: pps,
                        ctas_x,
                        chunk,
                    };
                    if !out.contains(&c) {
                        out.push(c);
                    }
                }
            }
        }
    }
    Ok(out)
}

/// NVFP4 weights on the device in the kernel layout ([`crate::formats::w4a16_pack`]).
pub struct W4a16Device {
    /// Packed codes.
    pub wq: DevBuf,
    /// Re-encoded block scales.
    pub sc: DevBuf,
    /// Rows N.
    pub n: usize,
    /// Columns K.
    pub k: usize,
    /// 16-row strips.
    pub strips: usize,
    /// 64-wide k tiles (K padded to 128).
    pub kt_n: usize,
    /// FP32 epilogue factor (`weight_scale_2 · 2⁷`).
    pub out_scale: f32,
}

impl W4a16Device {
    /// Upload a packed weight.
    ///
    /// # Errors
    /// A failed allocation or copy.
    pub fn upload(gpu: &Gpu, p: &W4a16Packed) -> anyhow::Result<Self> {
        Ok(Self {
            wq: gpu.upload(&p.weights)?,
            sc: gpu.upload(&p.scales)?,
            n: p.n,
            k: p.k,
            strips: p.strips(),
            kt_n: p.k_tiles(),
            out_scale: p.out_scale,
        })
    }

    /// Device bytes of the weight stream (codes and scales).
    pub fn bytes(&self) -> usize {
        self.wq.bytes() + self.sc.bytes()
    }

    /// The pointers and shape a launch needs.
    pub fn view(&self) -> W4a16View {
        W4a16View {
            wq: self.wq.ptr(),
            sc: self.sc.ptr(),
            n: self.n,
            k: self.k,
            strips: self.strips,
            kt_n: self.kt_n,
            out_scale: self.out_scale,
        }
    }
}

/// Device pointers and shape of an NVFP4 weight in the kernel layout (valid while the owning
/// buffers live).
#[derive(Debug, Clone, Copy)]
pub struct W4a16View {
    /// Packed codes.
    pub wq: u64,
    /// Re-encoded block scales.
    pub sc: u64,
    /// Rows N.
    pub n: usize,
    /// Columns K.
    pub k: usize,
    /// 16-row strips.
    pub strips: usize,
    /// 64-wide k tiles.
    pub kt_n: usize,
    /// FP32 epilogue factor.
    pub out_scale: f32,
}

/// Scratch a configuration needs at `m` tokens: (split-K workspace floats, counters, BF16
/// dequantization scratch bytes).
pub fn scratch_needs(cfg: &Config, n: usize, k: usize) -> (usize, usize, usize) {
    match cfg {
        Config::Fused {
            splits,
            ctas_x,
            chunk,
            ..
        } => (if *splits > 1 { splits * chunk * n } else { 0 }, *ctas_x, 0),
        Config::DequantGemm => (0, 0, n * k * 2),
    }
}

/// Queue one W4A16 GEMM `out[m, N] = act[m, K] · Wᵀ` with configuration `cfg`. `ws` and
/// `counters` must be sized per [`scratch_needs`] (counters zeroed once; the kernel leaves them
/// zeroed); `scratch` and `gemm` are needed by [`Config::DequantGemm`] only.
///
/// # Errors
/// A missing module or buffer, or a launch failure.
#[allow(clippy::too_many_arguments)]
pub fn launch_view(
    gpu: &Gpu,
    modules: &[W4Module],
    lt: Option<&Lt>,
    w: &W4a16View,
    cfg: &Config,
    act: u64,
    out: u64,
    m: usize,
    ws: u64,
    counters: u64,
    scratch: u64,
    gemm: Option<&LtGemm>,
) -> anyhow::Result<()> {
    let first = modules
        .first()
        .context("kernels/w4a16.cu did not compile")?;
    match cfg {
        Config::Fused {
            flavor,
            nt,
            warps,
            wn,
            splits,
            pairs_per_split,
            ctas_x,
            chunk,
        } => {
            let w4 = &modules
                .get(*flavor)
                .context("w4a16: flavour index out of range")?
                .module;
            let name = fused_name(*nt, *warps, *wn);
            let mut m0 = 0;
            while m0 < m {
                let mc = (*chunk).min(m - m0);
                w4.launch(
                    gpu,
                    &name,
                    (*ctas_x as u32, *splits as u32, 1),
                    ((*warps * 32) as u32, 1, 1),
                    0,
                    &[
                        KArg::Ptr(w.wq),
                        KArg::Ptr(w.sc),
                        KArg::Ptr(act + (m0 * w.k * 2) as u64),
                        KArg::Ptr(out + (m0 * w.n * 2) as u64),
                        KArg::Ptr(ws),
                        KArg::Ptr(counters),
                        KArg::I32(mc as i32),
                        KArg::I32(w.n as i32),
                        KArg::I32(w.k as i32),
                        KArg::I32(w.strips as i32),
                        KArg::I32(w.kt_n as i32),
                        KArg::I32(*splits as i32),
                        KArg::I32(*pairs_per_split as i32),
                        KArg::F32(w.out_scale),
                    ],
                )?;
                m0 += mc;
            }
        }
        Config::DequantGemm => {
            anyhow::ensure!(scratch != 0, "w4a16: no dequantization scratch");
            let units = w.strips * w.kt_n;
            first.module.launch(
                gpu,
                "w4a16_dequant_bf16",
                (units.div_ceil(8) as u32, 1, 1),
                (256, 1, 1),
                0,
                &[
                    KArg::Ptr(w.wq),
                    KArg::Ptr(w.sc),
                    KArg::Ptr(scratch),
                    KArg::I32(w.n as i32),
                    KArg::I32(w.k as i32),
                    KArg::I32(w.strips as i32),
                    KArg::I32(w.kt_n as i32),
                ],
            )?;
            let lt = lt.context("cuBLASLt is not available")?;
            let g = gemm.context("w4a16: no GEMM plan")?;
            g.run(lt, gpu, w.out_scale, scratch, act, out)?;
        }
    }
    Ok(())
}

impl W4a16 {
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
        let mut cands = Vec::new();
        if inp.m <= FUSED_MAX_M {
            let (_, _, strips, kt_n, _) = self.meta()?;
            cands.extend(fused_candidates(env.gpu, env.w4, strips, kt_n, inp.m)?);
        }
        if inp.m >= DEQUANT_MIN_M && env.lt.is_some() {
            cands.push(Config::DequantGemm);
        }
        anyhow::ensure!(
            !cands.is_empty(),
            "no W4A16 path for M = {} (cuBLASLt missing)",
            inp.m
        );
        // Buffers for the largest candidate.
        let mut ws_floats = 0usize;
        let mut ctas = 0usize;
        for c in &cands {
            if let Config::Fused {
                splits,
                ctas_x,
                chunk,
                ..
            } = c
            {
                if *splits > 1 {
                    ws_floats = ws_floats.max(splits * chunk * inp.n);
                }
                ctas = ctas.max(*ctas_x);
            }
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
        let (n_pad, k_pad, strips, kt_n, out_scale) = self.meta()?;
        let _ = (n_pad, k_pad);
        let wq = self.wq.as_ref().context("w4a16: no weights")?;
        let sc = self.sc.as_ref().context("w4a16: no scales")?;
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
                splits,
                chunk,
                ..
            }) => format!(
                "rigbench fused W4A16 (E2M1→BF16 in registers, mma.sync m16n8k16 BF16/FP32), flavour '{}': {} tokens/launch, {warps} warps/CTA, {wn} strip(s)/warp, split-K {splits}{}{tuned}",
                self.flavor_names.get(*flavor).map(String::as_str).unwrap_or("?"),
                chunk.min(&(nt * 8)),
                if *splits > 1 { " (deterministic fixed-order reduction)" } else { "" }
            ),
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
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_match_the_cuda_source() {
        let src = include_str!("../../../kernels/w4a16.cu");
        for name in kernel_names() {
            if let Some(rest) = name.strip_prefix("w4a16_nt") {
                // W4A16_KERNEL(NT, WARPS, WN)
                let parts: Vec<&str> = rest
                    .split(['_', 'w', 'n'])
                    .filter(|s| !s.is_empty())
                    .collect();
                let inst = format!("W4A16_KERNEL({}, {}, {})", parts[0], parts[1], parts[2]);
                assert!(src.contains(&inst), "{inst} missing from w4a16.cu");
            } else {
                assert!(src.contains(&name), "{name} missing");
            }
        }
    }
}
