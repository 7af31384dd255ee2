//! `w4a16`: rigbench's own W4A16 NVFP4 GEMM kernels (kernels/w4a16.cu, w4a16_v2.cu, and the
//! wgmma kernel of [`super::w4a16_wg`]): their configurations, the candidates offered for one
//! (shape, M), the device weight and one launch. The kernel bench times them through
//! `kernels::impls::w4a16`, the runtime runs them; [`super::tuner`] chooses for both.
//! NVFP4 weights (ModelOpt layout, repacked offline by [`crate::formats::w4a16_pack`]), BF16
//! activations, BF16 output.
//!
//! Paths, all holding only the 4-bit weights between calls:
//! - fused (M ≤ 512): E2M1 → BF16 in registers and `mma.sync` BF16 with FP32 accumulation, split-K
//!   across CTAs with a deterministic fixed-order reduction; M > 64 runs as chunks of 64 tokens
//!   (kernels/w4a16.cu), or the Marlin-style version 2 (kernels/w4a16_v2.cu, M ≤ 128);
//! - wgmma (sm_90 only, any M): the same dequantization feeding Hopper's `wgmma` as its register
//!   A operand, tokens as its N (kernels/w4a16_wg.cu, [`super::w4a16_wg`]);
//! - dequant + GEMM (M ≥ 128): the weights are expanded to a BF16 scratch buffer and multiplied by
//!   cuBLASLt, as vLLM's AWQ path does for large batches (`awq_dequantize` + matmul once the
//!   token count reaches 256). Its time includes the expansion.
//!
//! Which path and launch configuration runs is chosen per (shape, M) by measurement among the
//! candidates below (each checked against the reference first); the report names the choice.

use crate::gpu::dim;
use crate::gpu::DevPtr;
use anyhow::Context;

use crate::formats::w4a16_pack::W4a16Packed;
use crate::gemm::W4Module;
use crate::gpu::cublaslt::{Lt, LtGemm};
use crate::gpu::{DevBuf, Gpu};

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

pub use super::w4a16_wg::module_for as wg_module_for;

/// The kind of a configuration: `fused`, `v2`, `wgmma` or `dequant` (the names the kernel
/// bench's `RIGBENCH_W4A16_KINDS` filter uses).
pub fn kind(cfg: &Config) -> &'static str {
    match cfg {
        Config::Fused { .. } => "fused",
        Config::V2 { .. } => "v2",
        Config::Wg { .. } => "wgmma",
        Config::DequantGemm => "dequant",
    }
}

/// Every configuration offered for `m` tokens of a weight with `strips` strips and `kt_n` k
/// tiles: the fused kernel's (M ≤ [`FUSED_MAX_M`]), version 2's, the wgmma kernel's when its
/// module is among `modules`, and dequantize + cuBLASLt from [`DEQUANT_MIN_M`] when `lt` is
/// there. Every path is offered: the kernel bench filters the list by its own development switch
/// (`RIGBENCH_W4A16_KINDS`), the runtime does not.
///
/// # Errors
/// A failing occupancy or attribute query.
pub fn all_candidates(
    gpu: &Gpu,
    modules: &[W4Module],
    v2: Option<&crate::gpu::Module>,
    has_lt: bool,
    strips: usize,
    kt_n: usize,
    m: usize,
) -> anyhow::Result<Vec<Config>> {
    let mut cands = Vec::new();
    if m <= FUSED_MAX_M && modules.iter().any(|f| !f.is_wg()) {
        cands.extend(fused_candidates(gpu, modules, strips, kt_n, m)?);
        if let Some(v2) = v2 {
            cands.extend(v2_candidates(gpu, v2, strips, kt_n, m)?);
        }
    }
    if let Some(wg) = modules.iter().find(|f| f.is_wg()) {
        cands.extend(super::w4a16_wg::candidates(
            gpu, &wg.module, strips, kt_n, m,
        )?);
    }
    if m >= DEQUANT_MIN_M && has_lt {
        cands.push(Config::DequantGemm);
    }
    Ok(cands)
}

/// Whether the fused kernel has an in-CTA split-K instance (`_ks`: the CTA's warps share its
/// strips and split K, summed in shared memory in warp order) for this token tile and strip
/// count: token tiles 1 and 2 (M ≤ 16), 1 or 2 strips.
pub fn has_ks(nt: usize, wn: usize) -> bool {
    nt <= 2 && wn <= 2
}

/// The k-tile pairs `[begin, end)` warp `warp` of an in-CTA split-K (`_ks`) CTA takes of the
/// CTA's pairs `[pair0, pair1)` (as `w4a16_body` computes them with KS).
pub fn ks_pairs(pair0: usize, pair1: usize, warps: usize, warp: usize) -> (usize, usize) {
    let share = (pair1 - pair0).div_ceil(warps);
    let b = pair1.min(pair0 + warp * share);
    (b, pair1.min(b + share))
}

/// All kernel names in kernels/w4a16.cu.
pub fn kernel_names() -> Vec<String> {
    let mut v = Vec::new();
    for nt in NT_VARIANTS {
        for w in WARP_VARIANTS {
            for wn in WN_VARIANTS {
                v.push(fused_name(nt, w, wn, false));
                if has_ks(nt, wn) {
                    v.push(fused_name(nt, w, wn, true));
                }
            }
        }
    }
    v.push("w4a16_dequant_bf16".into());
    v.extend(grouped_kernel_names());
    v
}

/// The grouped expert W4A16 GEMMs of the same source (`w4a16_moe[_ns]_w{W}_n{WN}[_t8]`, stamped
/// by `W4A16_MOE_KERNEL`), which [`crate::gemm::moe`] launches: each of [`GROUPED_VARIANTS`] in
/// its general form and its one-tile form.
pub fn grouped_kernel_names() -> Vec<String> {
    GROUPED_VARIANTS
        .iter()
        .flat_map(|g| [g.kernel(false), g.kernel(true)])
        .collect()
}

/// One grouped expert W4A16 kernel of `kernels/w4a16.cu` (`w4a16_moe_expert`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupedW4 {
    /// Warps per CTA.
    pub warps: u32,
    /// 16-row strips per CTA (K split: its warps share them) or per warp (no split).
    pub wn: u32,
    /// The CTA's warps split K (`w4a16_moe_w*`); otherwise each warp runs its own strips over
    /// all of K (`w4a16_moe_ns_w*`).
    pub k_split: bool,
}

impl GroupedW4 {
    /// The kernel's name.
    pub fn name(&self) -> String {
        format!(
            "w4a16_moe{}_w{}_n{}",
            if self.k_split { "" } else { "_ns" },
            self.warps,
            self.wn
        )
    }

    /// The kernel's name in its general form (`one_tile` false: any number of pairs per
    /// expert) or its `_t8` form (`one_tile` true: at most [`super::moe::PAIRS_PER_PASS`] pairs
    /// per expert, which a batch of at most that many tokens guarantees; only the one-tile pass
    /// is compiled, so the kernel keeps that pass's registers alone).
    pub fn kernel(&self, one_tile: bool) -> String {
        format!("{}{}", self.name(), if one_tile { "_t8" } else { "" })
    }

    /// 16-row strips one CTA covers (the grid's x is `ceil(strips / this)`).
    pub fn strips_per_cta(&self) -> u32 {
        if self.k_split {
            self.wn
        } else {
            self.warps * self.wn
        }
    }
}

/// The grouped kernels `W4A16_MOE_KERNEL` stamps out.
pub const GROUPED_VARIANTS: [GroupedW4; 4] = [
    GroupedW4 {
        warps: 4,
        wn: 1,
        k_split: true,
    },
    GroupedW4 {
        warps: 8,
        wn: 1,
        k_split: true,
    },
    GroupedW4 {
        warps: 4,
        wn: 1,
        k_split: false,
    },
    GroupedW4 {
        warps: 4,
        wn: 2,
        k_split: false,
    },
];

/// The grouped kernel for experts of `kt_n` 64-wide k-tiles: the K split (4 warps) while each
/// warp keeps at least two k-tile pairs (`kt_n ≥ 16`, K ≥ 1,024: the gate_up of every MoE we
/// run), else one warp per strip over all of K (the down projection at K = 512–768, where a
/// split left each warp one pair and a CTA's fixed cost over 4 KiB of codes: 3–4× the byte
/// floor on the H100, `reports/nvidia-h100-80gb-hbm3-sm90/20261207T193800Z-round8-moe/`).
pub fn grouped_for(kt_n: usize) -> GroupedW4 {
    if kt_n >= 16 {
        GROUPED_VARIANTS[0]
    } else {
        GROUPED_VARIANTS[2]
    }
}

fn fused_name(nt: usize, warps: usize, wn: usize, ks: bool) -> String {
    format!("w4a16_nt{nt}_w{warps}_n{wn}{}", if ks { "_ks" } else { "" })
}

/// Source of rigbench's W4A16 kernels (`kernels/w4a16.cu`), compiled at run time by NVRTC in
/// the flavours of [`crate::gemm::W4A16_FLAVORS`]; the kernel bench and the runtime both build
/// it from here.
pub const SRC: &str = include_str!("../../kernels/w4a16.cu");

/// Source of the version-2 kernel (Marlin-style: stripes over the SMs, cp.async ring).
pub const V2_SRC: &str = include_str!("../../kernels/w4a16_v2.cu");

/// The (token tiles, warps, strips per warp) instances of kernels/w4a16_v2.cu.
pub const V2_VARIANTS: &[(usize, usize, usize)] = &[
    (1, 4, 1),
    (1, 4, 2),
    (1, 4, 4),
    (1, 8, 1),
    (1, 8, 2),
    (2, 4, 1),
    (2, 4, 2),
    (2, 4, 4),
    (2, 8, 1),
    (2, 8, 2),
    (4, 4, 1),
    (4, 4, 2),
    (4, 4, 4),
    (4, 8, 1),
    (4, 8, 2),
    (8, 4, 1),
    (8, 4, 2),
    (8, 8, 1),
    (8, 8, 2),
    (16, 4, 1),
    (16, 8, 1),
];

/// Largest M the version-2 kernel takes in one launch (16 token tiles of 8).
pub const V2_MAX_M: usize = 128;

/// Pipeline depths offered to the tuner.
pub const V2_STAGES: [usize; 3] = [3, 4, 6];

/// Name of a version-2 kernel.
pub fn v2_name(nt: usize, warps: usize, wn: usize) -> String {
    format!("w4v2_nt{nt}_w{warps}_n{wn}")
}

/// All kernel names in kernels/w4a16_v2.cu.
pub fn v2_kernel_names() -> Vec<String> {
    V2_VARIANTS
        .iter()
        .map(|(nt, w, wn)| v2_name(*nt, *w, *wn))
        .collect()
}

/// Shared-memory bytes of one version-2 pipeline stage: packed codes (512 B) and scale words
/// (128 B) of every strip of the group, and the k tile (128 B per token) of 8·nt tokens.
pub fn v2_stage_bytes(nt: usize, warps: usize, wn: usize) -> usize {
    warps * wn * 640 + nt * 8 * 128
}

/// The CTA that owns unit `u` when `units` units are split into `ctas` contiguous stripes
/// (stripe `c` = `[c·units/ctas, (c+1)·units/ctas)`), as kernels/w4a16_v2.cu computes it.
pub fn v2_owner(u: usize, units: usize, ctas: usize) -> usize {
    ((u + 1) * ctas - 1) / units
}

/// The most slices (CTAs) any group's k range is split into, for `groups` groups of `kt_n`
/// k tiles over `ctas` stripes; 1 when no group is split.
pub fn v2_max_slices(groups: usize, kt_n: usize, ctas: usize) -> usize {
    let units = groups * kt_n;
    (0..groups)
        .map(|g| v2_owner(g * kt_n + kt_n - 1, units, ctas) - v2_owner(g * kt_n, units, ctas) + 1)
        .max()
        .unwrap_or(1)
}

/// Version-2 configurations for `m` tokens (`m` ≤ [`V2_MAX_M`]): every instance with the
/// smallest token tile that holds `m`, each pipeline depth whose shared memory fits, on a
/// persistent grid of (resident CTAs per SM × SMs) and of one CTA per SM (at most one CTA per
/// unit).
///
/// # Errors
/// A failing occupancy or attribute query.
pub fn v2_candidates(
    gpu: &Gpu,
    module: &crate::gpu::Module,
    strips: usize,
    kt_n: usize,
    m: usize,
) -> anyhow::Result<Vec<Config>> {
    if m == 0 || m > V2_MAX_M {
        return Ok(Vec::new());
    }
    let tiles = m.div_ceil(8);
    let nt = *[1usize, 2, 4, 8, 16]
        .iter()
        .find(|v| **v >= tiles)
        .unwrap_or(&16);
    let sm = gpu.sm_count.max(1) as usize;
    let mut out = Vec::new();
    for &(vnt, warps, wn) in V2_VARIANTS {
        if vnt != nt {
            continue;
        }
        let name = v2_name(nt, warps, wn);
        let attrs = module.attrs(&name)?;
        if attrs.local_bytes > 0 {
            continue;
        }
        let groups = strips.div_ceil(warps * wn);
        let units = groups * kt_n;
        for stages in V2_STAGES {
            let smem = stages * v2_stage_bytes(nt, warps, wn);
            if smem > gpu.max_smem_optin as usize {
                continue;
            }
            let occ = module.occupancy_smem(&name, (warps * 32) as u32, smem as u32)? as usize;
            if occ == 0 {
                continue;
            }
            let mut grids = vec![(occ * sm).min(units)];
            if occ > 1 {
                grids.push(sm.min(units));
            }
            for ctas in grids {
                let c = Config::V2 {
                    nt,
                    warps,
                    wn,
                    stages,
                    ctas,
                    groups,
                    max_slices: v2_max_slices(groups, kt_n, ctas),
                    smem,
                };
                if !out.contains(&c) {
                    out.push(c);
                }
            }
        }
    }
    Ok(out)
}

/// One launch configuration.
#[derive(Debug, Clone, PartialEq)]
pub enum Config {
    /// The fused kernel.
    Fused {
        /// Index into the compiled flavours ([`W4Module`]s, as [`all_candidates`] got them).
        flavor: usize,
        /// Token tiles of 8 per launch.
        nt: usize,
        /// Warps per CTA.
        warps: usize,
        /// Strips per warp.
        wn: usize,
        /// In-CTA split-K instance (`_ks`): the warps share the CTA's `wn` strips.
        ks: bool,
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
    /// The version-2 kernel (kernels/w4a16_v2.cu), all M tokens in one launch.
    V2 {
        /// Token tiles of 8.
        nt: usize,
        /// Warps per CTA.
        warps: usize,
        /// Strips per warp.
        wn: usize,
        /// Pipeline stages.
        stages: usize,
        /// CTAs (persistent grid).
        ctas: usize,
        /// Groups of warps·wn strips.
        groups: usize,
        /// Most slices a group's k range is split into.
        max_slices: usize,
        /// Dynamic shared memory, bytes.
        smem: usize,
    },
    /// The Hopper wgmma kernel (kernels/w4a16_wg.cu; [`super::w4a16_wg`]).
    Wg {
        /// Token tile (wgmma N): 8, 16, 32, 64, 128 or 256.
        tn: usize,
        /// Warpgroups per CTA (64 weight rows each).
        wg: usize,
        /// One commit group of wgmmas kept in flight across stages (the `_p` instances).
        pipe: bool,
        /// Pipeline stages (k-tile pairs in flight).
        stages: usize,
        /// CTAs per token tile (persistent stripes over (group, k-tile pair) units).
        ctas: usize,
        /// Token tiles (grid.y).
        tiles: usize,
        /// Dynamic shared memory, bytes.
        smem: usize,
    },
}

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
    anyhow::ensure!(
        modules.iter().any(|f| !f.is_wg()),
        "kernels/w4a16.cu did not compile"
    );
    let sm = gpu.sm_count.max(1) as usize;
    let chunk = m.min(64);
    let tiles = chunk.div_ceil(8);
    let nt = *NT_VARIANTS.iter().find(|v| **v >= tiles).unwrap_or(&8);
    let pairs = kt_n / 2;
    let mut out = Vec::new();
    for (flavor, fm) in modules.iter().enumerate() {
        if fm.is_wg() {
            continue;
        }
        let w4 = &fm.module;
        for (warps, wn, ks) in WARP_VARIANTS.iter().flat_map(|w| {
            WN_VARIANTS
                .iter()
                .flat_map(move |wn| [(*w, *wn, false), (*w, *wn, true)])
        }) {
            if ks && !has_ks(nt, wn) {
                continue;
            }
            let name = fused_name(nt, warps, wn, ks);
            let attrs = w4.attrs(&name)?;
            if attrs.local_bytes > 0 {
                continue; // spills registers to local memory
            }
            let occ = w4.occupancy(&name, (warps * 32) as u32)? as usize;
            if occ == 0 {
                continue;
            }
            let slots = occ * sm;
            let ctas_x = strips.div_ceil(if ks { wn } else { warps * wn });
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
            if ctas_x >= slots / 2 || ks {
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
                    ks,
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
    let _ = n;
    match cfg {
        Config::V2 {
            warps,
            wn,
            groups,
            max_slices,
            nt,
            ..
        } => (
            if *max_slices > 1 {
                groups * max_slices * warps * wn * 16 * nt * 8
            } else {
                0
            },
            *groups,
            0,
        ),
        Config::Fused {
            splits,
            ctas_x,
            chunk,
            ..
        } => (if *splits > 1 { splits * chunk * n } else { 0 }, *ctas_x, 0),
        Config::DequantGemm => (0, 0, n * k * 2),
        Config::Wg { .. } => {
            let (ws, ctr) = super::w4a16_wg::scratch(cfg, n, k.div_ceil(128) * 2);
            (ws, ctr, 0)
        }
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
    v2: Option<&crate::gpu::Module>,
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
    match cfg {
        Config::Fused {
            flavor,
            nt,
            warps,
            wn,
            ks,
            splits,
            pairs_per_split,
            ctas_x,
            chunk,
        } => {
            let w4 = &modules
                .get(*flavor)
                .context("w4a16: flavour index out of range")?
                .module;
            let name = fused_name(*nt, *warps, *wn, *ks);
            let mut m0 = 0;
            while m0 < m {
                let mc = (*chunk).min(m - m0);
                super::launchers::w4a16::gemm(
                    w4,
                    gpu,
                    &name,
                    (dim("*ctas_x", *ctas_x)?, dim("*splits", *splits)?, 1),
                    (dim("*warps * 32", *warps * 32)?, 1, 1),
                    0,
                    DevPtr::at(w.wq),
                    DevPtr::at(w.sc),
                    DevPtr::at(act + (m0 * w.k * 2) as u64),
                    DevPtr::at(out + (m0 * w.n * 2) as u64),
                    DevPtr::at(ws),
                    DevPtr::at(counters),
                    mc,
                    w.n,
                    w.k,
                    w.strips,
                    w.kt_n,
                    *splits,
                    *pairs_per_split,
                    w.out_scale,
                )?;
                m0 += mc;
            }
        }
        Config::V2 {
            nt,
            warps,
            wn,
            stages,
            ctas,
            groups: _,
            max_slices,
            smem,
        } => {
            let module = v2.context("kernels/w4a16_v2.cu did not compile")?;
            anyhow::ensure!(
                m <= nt * 8,
                "w4a16 v2: M = {m} exceeds the token tile {}",
                nt * 8
            );
            super::launchers::w4a16_v2::gemm(
                module,
                gpu,
                &v2_name(*nt, *warps, *wn),
                (dim("*ctas", *ctas)?, 1, 1),
                (dim("*warps * 32", *warps * 32)?, 1, 1),
                dim("*smem", *smem)?,
                DevPtr::at(w.wq),
                DevPtr::at(w.sc),
                DevPtr::at(act),
                DevPtr::at(out),
                DevPtr::at(ws),
                DevPtr::at(counters),
                m,
                w.n,
                w.k,
                w.strips,
                w.kt_n,
                w.strips.div_ceil(warps * wn) * w.kt_n,
                *stages,
                *max_slices,
                w.out_scale,
            )?;
        }
        Config::Wg { .. } => {
            let wg = modules
                .iter()
                .find(|f| f.is_wg())
                .context("kernels/w4a16_wg.cu is not loaded")?;
            super::w4a16_wg::launch(gpu, &wg.module, w, cfg, act, out, m, ws, counters)?;
        }
        Config::DequantGemm => {
            let first = modules
                .iter()
                .find(|f| !f.is_wg())
                .context("kernels/w4a16.cu did not compile")?;
            anyhow::ensure!(scratch != 0, "w4a16: no dequantization scratch");
            let units = w.strips * w.kt_n;
            super::launchers::w4a16::w4a16_dequant_bf16(
                &first.module,
                gpu,
                (dim("units.div_ceil(8)", units.div_ceil(8))?, 1, 1),
                (256, 1, 1),
                0,
                DevPtr::at(w.wq),
                DevPtr::at(w.sc),
                DevPtr::at(scratch),
                w.n,
                w.k,
                w.strips,
                w.kt_n,
            )?;
            let lt = lt.context("cuBLASLt is not available")?;
            let g = gemm.context("w4a16: no GEMM plan")?;
            g.run(lt, gpu, w.out_scale, scratch, act, out)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_instances_match_the_cuda_source_and_stripes_cover_every_unit() {
        for &(nt, w, wn) in V2_VARIANTS {
            let inst = format!("W4V2_KERNEL({nt}, {w}, {wn})");
            assert!(V2_SRC.contains(&inst), "{inst} missing from w4a16_v2.cu");
        }
        // Stripes: every unit has exactly one owner, owners are contiguous and in order, and
        // max_slices counts the CTAs that share a group.
        for (groups, kt_n, ctas) in [
            (40, 96, 132),
            (1, 80, 80),
            (272, 80, 264),
            (3, 2, 5),
            (7, 3, 1),
        ] {
            let units = groups * kt_n;
            let mut counts = vec![0usize; ctas];
            let mut prev = 0;
            for u in 0..units {
                let o = v2_owner(u, units, ctas);
                assert!(o < ctas && o >= prev, "unit {u} owner {o}");
                prev = o;
                counts[o] += 1;
                // The kernel's stripe of o contains u.
                assert!(o * units / ctas <= u && u < (o + 1) * units / ctas);
            }
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(
                hi - lo <= 1,
                "stripes differ by at most one unit: {lo}..{hi}"
            );
            let ms = v2_max_slices(groups, kt_n, ctas);
            let want = (0..groups)
                .map(|g| {
                    (g * kt_n..(g + 1) * kt_n)
                        .map(|u| v2_owner(u, units, ctas))
                        .collect::<std::collections::BTreeSet<_>>()
                        .len()
                })
                .max()
                .unwrap();
            assert_eq!(ms, want);
        }
        assert_eq!(v2_stage_bytes(1, 4, 2), 8 * 640 + 1024);
    }

    #[test]
    fn ks_warps_partition_the_ctas_pairs() {
        for (p0, p1, warps) in [(0, 40, 8), (0, 40, 4), (10, 13, 8), (0, 1, 8), (5, 5, 4)] {
            let mut next = p0;
            for w in 0..warps {
                let (b, e) = ks_pairs(p0, p1, warps, w);
                assert!(
                    b <= e && (b == next || b == e),
                    "{p0}..{p1} warp {w}: {b}..{e}"
                );
                if e > b {
                    next = e;
                }
            }
            assert_eq!(next, p1, "{p0}..{p1} over {warps} warps");
        }
        assert!(has_ks(1, 1) && has_ks(2, 2) && !has_ks(4, 1) && !has_ks(1, 4));
    }

    #[test]
    fn kernel_names_match_the_cuda_source() {
        let src = include_str!("../../kernels/w4a16.cu");
        for name in kernel_names() {
            if let Some(rest) = name.strip_prefix("w4a16_nt") {
                // W4A16_KERNEL(NT, WARPS, WN) or W4A16_KS_KERNEL(NT, WARPS, WN) for `_ks`
                let (rest, mac) = match rest.strip_suffix("_ks") {
                    Some(r) => (r, "W4A16_KS_KERNEL"),
                    None => (rest, "W4A16_KERNEL"),
                };
                let parts: Vec<&str> = rest
                    .split(['_', 'w', 'n'])
                    .filter(|s| !s.is_empty())
                    .collect();
                let inst = format!("{mac}({}, {}, {})", parts[0], parts[1], parts[2]);
                assert!(src.contains(&inst), "{inst} missing from w4a16.cu");
            } else if name.starts_with("w4a16_moe") {
                let (base, one) = match name.strip_suffix("_t8") {
                    Some(b) => (b, true),
                    None => (name.as_str(), false),
                };
                let g = GROUPED_VARIANTS
                    .iter()
                    .find(|g| g.name() == base)
                    .expect("a grouped kernel name is one of GROUPED_VARIANTS");
                let inst = format!(
                    "W4A16_MOE_KERNEL({name}, {}, {}, {}, {one})",
                    g.warps, g.wn, g.k_split
                );
                assert!(src.contains(&inst), "{inst} missing from w4a16.cu");
            } else {
                assert!(src.contains(&name), "{name} missing");
            }
        }
    }
}
