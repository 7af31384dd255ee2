//! The kernel bench's half of rigbench's Hopper W4A16 kernel (`kernels/w4a16_wg.cu`; its
//! instances, configurations and launch are the GEMM layer's, [`crate::gemm::w4a16_wg`]):
//! [`probe`], what `rigbench devcheck --only wg-probe` runs in the child process that
//! [`crate::gemm::w4a16_wg::module_for`] starts before a bench or a runtime uses the kernel, and
//! [`emulate`]: a CPU mirror of one launch (loads, the activation permutation and swizzle, the
//! descriptor addressing, the wgmma fragment layouts, the stripes and the ordered split-K
//! reduction), checked against the reference GEMM in the tests. docs/w4a16-notes.md has the
//! design.

use crate::formats::w4a16_pack::{extract_reg, scale_bf16_bits, W4a16Packed};
use crate::gemm::w4a16::v2_owner;
use crate::gemm::w4a16_wg::*;
use crate::gpu::{Gpu, Module};

/// Probe shapes (N, K) and token counts: a partial group (N = 96), K not a multiple of 128,
/// several groups and splits, and token tiles beyond one.
pub const PROBE_CASES: &[(usize, usize, &[usize])] = &[
    (96, 5120, &[1, 16, 64]),
    (200, 1040, &[3, 40, 130]),
    (512, 2048, &[8, 257, 300]),
];

/// One probe result line per (shape, M): configurations run, passed, and the worst rel_l2.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeCase {
    /// N.
    pub n: usize,
    /// K.
    pub k: usize,
    /// M.
    pub m: usize,
    /// Configurations run.
    pub configs: usize,
    /// Failures: (configuration, what failed).
    pub failed: Vec<(String, String)>,
    /// Largest rel_l2 among the passing configurations.
    pub worst_rel_l2: f64,
}

/// Run every configuration [`candidates`] offers on each of [`PROBE_CASES`] (random NVFP4
/// weights, BF16 activations), each against the exact CPU reference of the whole output
/// (rel_l2 under the W4A16 tolerance, no non-finite or unwritten output), twice, and bit-exact
/// between the two runs. Meant for a child process: a fault poisons this process's context.
///
/// # Errors
/// A device failure outside the kernel's own launches (allocation, copy).
pub fn probe(gpu: &Gpu, module: &Module) -> anyhow::Result<Vec<ProbeCase>> {
    use crate::kernels::data::{bf16_uniform, nvfp4_weight};
    let mut out = Vec::new();
    for &(n, k, ms) in PROBE_CASES {
        let w = nvfp4_weight(n, k, 0x77A1 ^ n as u32, 4);
        let p = crate::formats::w4a16_pack::repack(&w)?;
        let dev = crate::gemm::w4a16::W4a16Device::upload(gpu, &p)?;
        let view = dev.view();
        for &m in ms {
            let seed = 0x5EED ^ (m as u32) ^ ((n as u32) << 8);
            let act: Vec<u16> = (0..m * k)
                .map(|i| half::bf16::from_f32(bf16_uniform(i as u32, seed, 1.0)).to_bits())
                .collect();
            let want = reference(&w, &act, m);
            let act_d = gpu.upload(&act)?;
            let out_d = gpu.alloc(m * n * 2)?;
            let cands = candidates(gpu, module, dev.strips, dev.kt_n, m)?;
            let (mut ws_f, mut ctr) = (1usize, 1usize);
            for c in &cands {
                let (a, b) = scratch(c, n, dev.kt_n);
                ws_f = ws_f.max(a);
                ctr = ctr.max(b);
            }
            let ws = gpu.alloc(ws_f * 4)?;
            let counters = gpu.alloc(ctr * 4)?;
            gpu.memset(&counters, 0)?;
            let mut case = ProbeCase {
                n,
                k,
                m,
                configs: cands.len(),
                failed: Vec::new(),
                worst_rel_l2: 0.0,
            };
            for c in &cands {
                let mut first: Option<Vec<u16>> = None;
                let mut verdict = Ok(0.0f64);
                for _ in 0..2 {
                    gpu.memset(&out_d, 0xFF)?;
                    if let Err(e) = launch(
                        gpu,
                        module,
                        &view,
                        c,
                        act_d.ptr(),
                        out_d.ptr(),
                        m,
                        ws.ptr(),
                        counters.ptr(),
                    )
                    .and_then(|_| Ok(gpu.sync()?))
                    {
                        verdict = Err(format!("{e:#}"));
                        break;
                    }
                    let got: Vec<u16> = gpu.download(&out_d, 0, m * n)?;
                    if let Some(f) = &first {
                        if *f != got {
                            let d = f.iter().zip(&got).filter(|(a, b)| a != b).count();
                            verdict = Err(format!("{d} outputs differ between two runs"));
                        }
                        break;
                    }
                    let nonfinite = got
                        .iter()
                        .filter(|b| !half::bf16::from_bits(**b).to_f32().is_finite())
                        .count();
                    let g: Vec<f64> = got
                        .iter()
                        .map(|b| half::bf16::from_bits(*b).to_f64())
                        .collect();
                    let e = crate::gemm::check::rel_l2(&g, &want);
                    if nonfinite > 0 || e.is_nan() || e > crate::gemm::check::W4A16_GEMM_REL_L2 {
                        verdict = Err(format!("rel_l2 {e:.3e}, {nonfinite} non-finite outputs"));
                        break;
                    }
                    verdict = Ok(e);
                    first = Some(got);
                }
                match verdict {
                    Ok(e) => case.worst_rel_l2 = case.worst_rel_l2.max(e),
                    Err(why) => case.failed.push((describe(c), why)),
                }
            }
            out.push(case);
        }
    }
    Ok(out)
}

/// The exact product of the NVFP4 weight and BF16 activations (`act` as BF16 bits, `[m, k]`),
/// `[m, n]` row-major.
fn reference(w: &crate::formats::nvfp4::Nvfp4Weight, act: &[u16], m: usize) -> Vec<f64> {
    let (n, k) = (w.n, w.k);
    let wf: Vec<f64> = (0..n * k).map(|i| w.value_f64(i / k, i % k)).collect();
    let af: Vec<f64> = act
        .iter()
        .map(|b| half::bf16::from_bits(*b).to_f64())
        .collect();
    let mut out = vec![0f64; m * n];
    for mi in 0..m {
        for ni in 0..n {
            out[mi * n + ni] = (0..k).map(|kk| wf[ni * k + kk] * af[mi * k + kk]).sum();
        }
    }
    out
}

/// The launch parameters [`emulate`] mirrors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmuLaunch {
    /// Token tile (wgmma N).
    pub tn: usize,
    /// Warpgroups per CTA.
    pub wg: usize,
    /// The `_p` instance: loads run stages − 2 ahead, one wgmma group stays in flight.
    pub pipe: bool,
    /// Pipeline stages.
    pub stages: usize,
    /// CTAs per token tile.
    pub ctas: usize,
}

/// Shared-memory address of the dynamic buffer in the emulation (the kernel's 16 bytes of
/// static shared memory come first); the kernel aligns its ring up from it.
const EMU_RAW: u32 = 16;

/// The 128-byte swizzle as the hardware applies it to a shared address: 16-byte chunk bits
/// 4..6 XOR row bits 7..9 (PTX ISA, "Shared Memory Matrix Layout", swizzling modes; CUTLASS
/// `Swizzle<3,4,3>`).
fn swizzle128(addr: u32) -> u32 {
    addr ^ (((addr >> 7) & 7) << 4)
}

/// The kernel's `desc_b`.
fn desc_b(addr: u32) -> u64 {
    ((addr >> 4) & 0x3FFF) as u64 | (1u64 << 16) | (64u64 << 32) | (1u64 << 62)
}

/// Shared address of element (k, n), k < 16, of wgmma's K-major B operand described by `desc`
/// (PTX ISA, "Matrix Descriptor Format" and the canonical K-major layouts; CUTLASS
/// `make_gmma_desc<Major::K>`: `Swizzle<3,4,3> o ((8,n),2):((8T,SBO),1)` in 16-byte units for
/// the 128-byte swizzle).
fn b_element_addr(desc: u64, k: usize, n: usize) -> u32 {
    let start = ((desc & 0x3FFF) as u32) << 4;
    let sbo = (((desc >> 32) & 0x3FFF) as u32) << 4;
    let layout = (desc >> 62) as u32;
    let base_offset = ((desc >> 49) & 7) as u32;
    assert_eq!(
        (layout, base_offset),
        (1, 0),
        "only the 128-byte swizzle with base offset 0 is modelled"
    );
    let linear = start + (n as u32 / 8) * sbo + (n as u32 % 8) * 128 + 2 * k as u32;
    swizzle128(linear)
}

fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Emulate one launch of `kernels/w4a16_wg.cu` on the CPU: `act` is `[m, p.k]` BF16 bits
/// (row stride K, as on the GPU); returns the `[m, p.n]` outputs before the kernel's final BF16
/// rounding (`Σ · out_scale` in f64), computed through the kernel's own index math: the
/// stripes and segments, the pre-pass that writes the activations in the packed K order
/// ([`permute_act`]), the cp.async destinations of codes, scales and activations in a byte
/// model of shared memory, the dequantization of each lane's fragments, each wgmma
/// reading A from the lanes' registers (the m16n8k16 A layout per warp) and B through the
/// shared-memory descriptor, the accumulator layout, and the split-K slots and their
/// slice-order reduction by the last CTA to arrive. CTAs of a token tile run one after another
/// in `order` (a permutation of `0..ctas`), which decides who arrives last; the result must not
/// depend on it.
///
/// # Panics
/// Parameters the kernel does not take (e.g. `tn` not an instance, `ctas` larger than the
/// units, `order` not a permutation); an out-of-bounds shared-memory or workspace access.
pub fn emulate(p: &W4a16Packed, act: &[u16], m: usize, l: EmuLaunch, order: &[usize]) -> Vec<f64> {
    let EmuLaunch {
        tn,
        wg,
        pipe,
        stages,
        ctas,
    } = l;
    assert!(instances().contains(&(tn, wg, pipe)));
    assert!((2..=8).contains(&stages) && (!pipe || stages >= 3));
    // The H200's opt-in shared memory per block (and the descriptor's 14-bit start address,
    // 256 KiB, would wrap beyond it).
    assert!(
        smem_bytes(tn, wg, stages) <= H200_SMEM_OPTIN,
        "{l:?} needs {} bytes of shared memory",
        smem_bytes(tn, wg, stages)
    );
    // Tiles loaded ahead (the kernel's `ahead`), and how many iterations after its last read a
    // stage may be reloaded: 1 when every wgmma is waited for within its iteration, 2 when one
    // commit group stays in flight into the next.
    let ahead = if pipe { stages - 2 } else { stages - 1 };
    let reuse_gap = if pipe { 2 } else { 1 };
    let (n, k) = (p.n, p.k);
    let strips = p.strips();
    let kt_n = p.k_tiles();
    let gs = group_strips(wg);
    let rows = gs * 16;
    let a_tile = tn * 128;
    let w_off = 2 * a_tile;
    let s_off = w_off + gs * 1024;
    let stage = stage_bytes(tn, wg);
    let pairs = kt_n / 2;
    let groups = strips.div_ceil(gs);
    let units = groups * pairs;
    assert!(ctas >= 1 && ctas <= units, "ctas {ctas} units {units}");
    let mut sorted = order.to_vec();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..ctas).collect::<Vec<_>>(),
        "order is a permutation"
    );
    let tiles = m.div_ceil(tn);
    // The pre-pass: the activations in the packed K order, row stride kpad.
    let kpad = 64 * kt_n;
    let actp = permute_act(act, m, k, kpad);
    let sbase = (EMU_RAW + 1023) & !1023;
    let smem_len = (sbase - EMU_RAW) as usize + stages * stage;
    let g = Emu {
        l,
        p,
        actp: &actp,
        ahead,
        reuse_gap,
        n,
        strips,
        kt_n,
        gs,
        rows,
        a_tile,
        w_off,
        s_off,
        stage,
        pairs,
        groups,
        units,
        kpad,
        sbase,
    };
    let mut out = vec![f64::NAN; m * n];
    let mut ws = vec![f64::NAN; tiles * ctas * 2 * rows * tn];
    let mut counters = vec![0u32; tiles * groups];
    for tile in 0..tiles {
        let tok0 = tile * tn;
        let mt = tn.min(m - tok0);
        for &c in order {
            // One CTA. Shared memory, indexed by shared address − EMU_RAW; NaN-like garbage.
            let mut smem = vec![0xFFu8; smem_len];
            let (u_begin, u_end) = stripe(c, units, ctas);
            // Zero the token rows never loaded.
            let per_tile = (tn - mt) * 8;
            for i in 0..stages * 2 * per_tile {
                let (tl, r) = (i / per_tile, i % per_tile);
                let at = sh(sbase)
                    + (tl >> 1) * stage
                    + (tl & 1) * a_tile
                    + (mt + (r >> 3)) * 128
                    + (r & 7) * 16;
                smem[at..at + 16].fill(0);
            }
            let mut u = u_begin;
            while u < u_end {
                let grp = u / pairs;
                let pa = u % pairs;
                let pb = pairs.min(pa + (u_end - u));
                let np = pb - pa;
                let strip0 = grp * gs;
                let span = EmuSpan {
                    tile,
                    c,
                    tok0,
                    mt,
                    grp,
                    strip0,
                    pa,
                    pb,
                    np,
                    later: u != u_begin,
                };
                let acc = emu_mainloop(&g, &span, &mut smem);
                // Epilogue.
                emu_epilogue(&g, &span, &acc, &mut out, &mut ws, &mut counters);
                u += np;
            }
        }
    }
    assert!(counters.iter().all(|c| *c == 0), "counters left non-zero");
    out
}

/// Index into the emulation's shared-memory bytes of the shared address `addr`.
fn sh(addr: u32) -> usize {
    (addr - EMU_RAW) as usize
}

/// One launch of [`emulate`]: its parameters, the packed weights, the permuted activations,
/// and the geometry the kernel derives from them (same names as in the kernel).
struct Emu<'a> {
    l: EmuLaunch,
    p: &'a W4a16Packed,
    /// The activations in the packed K order, row stride `kpad`.
    actp: &'a [u16],
    ahead: usize,
    reuse_gap: usize,
    n: usize,
    strips: usize,
    kt_n: usize,
    gs: usize,
    rows: usize,
    a_tile: usize,
    w_off: usize,
    s_off: usize,
    stage: usize,
    pairs: usize,
    groups: usize,
    units: usize,
    kpad: usize,
    sbase: u32,
}

/// The K-tile pairs `pa..pb` of group `grp` one CTA (`c`) runs for token tile `tile`.
struct EmuSpan {
    tile: usize,
    c: usize,
    tok0: usize,
    /// Tokens of the tile.
    mt: usize,
    grp: usize,
    strip0: usize,
    pa: usize,
    pb: usize,
    np: usize,
    /// Not the CTA's first span (its second split-K slot).
    later: bool,
}

/// `acc[warp][lane][r]`, the wgmma D fragments of each warp of a CTA.
type EmuAcc = Vec<Vec<Vec<f64>>>;

/// The A registers of a warpgroup's 4 warps: `a[h][warp][lane][j][reg]`.
type EmuFrags = Vec<Vec<Vec<[[u32; 4]; 4]>>>;

/// The main loop of one CTA over its span: stages loaded `ahead` (a stage reloaded only once
/// its reads are done), each iteration's fragments dequantized and its wgmmas run.
fn emu_mainloop(g: &Emu<'_>, span: &EmuSpan, smem: &mut [u8]) -> EmuAcc {
    let EmuLaunch { tn, wg, stages, .. } = g.l;
    let l = g.l;
    let (gs, ahead, reuse_gap, stage, sbase, a_tile) =
        (g.gs, g.ahead, g.reuse_gap, g.stage, g.sbase, g.a_tile);
    let (pa, np) = (span.pa, span.np);
    // acc[warp][lane][r], the wgmma D fragments of each warp.
    let mut acc = vec![vec![vec![0f64; tn / 2]; 32]; gs];
    // Iteration that last read each stage (the wgmmas' asynchronous reads included).
    let mut last_read: Vec<Option<usize>> = vec![None; stages];
    for s in 0..ahead {
        if s < np {
            emu_load(g, span, smem, s, pa + s);
        }
    }
    for i in 0..np {
        let nxt = i + ahead;
        if nxt < np {
            let st = nxt % stages;
            assert!(
                last_read[st].is_none_or(|r| r + reuse_gap <= i),
                "{l:?}: iteration {i} reloads stage {st} while iteration {:?} may still read it",
                last_read[st]
            );
            emu_load(g, span, smem, st, pa + nxt);
        }
        let st = i % stages;
        last_read[st] = Some(i);
        let b = sh(sbase) + st * stage;
        let bs = sbase + (st * stage) as u32;
        for warpgroup in 0..wg {
            let a = emu_fragments(g, smem, b, warpgroup);
            for (h, ah) in a.iter().enumerate() {
                for j in 0..4 {
                    let desc = desc_b(bs + (h * a_tile + 32 * j) as u32);
                    wgmma(
                        &mut acc[4 * warpgroup..4 * warpgroup + 4],
                        ah,
                        j,
                        tn,
                        |kk, nn| {
                            let at = sh(b_element_addr(desc, kk, nn));
                            half::bf16::from_bits(u16::from_le_bytes([smem[at], smem[at + 1]]))
                                .to_f64()
                        },
                    );
                }
            }
        }
    }
    acc
}

/// One stage's cp.async loads (stage `st`, K-tile pair `pp`): the group's code strips and
/// scales (zeros for strips past the last), and the tile's tokens' activations, swizzled.
fn emu_load(g: &Emu<'_>, span: &EmuSpan, smem: &mut [u8], st: usize, pp: usize) {
    let Emu {
        p,
        actp,
        gs,
        strips,
        kt_n,
        w_off,
        s_off,
        stage,
        pairs,
        kpad,
        sbase,
        a_tile,
        ..
    } = *g;
    let (strip0, mt, tok0) = (span.strip0, span.mt, span.tok0);
    let base = sbase + (st * stage) as u32;
    for i in 0..gs * 64 {
        let (r, ch) = (i >> 6, i & 63);
        let strip = strip0 + r;
        let ok = strip < strips;
        let src = ((if ok { strip } else { 0 }) * kt_n + 2 * pp) * 512 + ch * 16;
        let dst = sh(base + (w_off + r * 1024 + ch * 16) as u32);
        if ok {
            smem[dst..dst + 16].copy_from_slice(&p.weights[src..src + 16]);
        } else {
            smem[dst..dst + 16].fill(0);
        }
    }
    for i in 0..gs * 8 {
        let (r, part) = (i >> 3, i & 7);
        let strip = strip0 + r;
        let ok = strip < strips;
        let src = (((if ok { strip } else { 0 }) * pairs + pp) * 32 + part * 4) * 4;
        let dst = sh(base + (s_off + r * 128 + part * 16) as u32);
        if ok {
            smem[dst..dst + 16].copy_from_slice(&p.scales[src..src + 16]);
        } else {
            smem[dst..dst + 16].fill(0);
        }
    }
    for i in 0..mt * 16 {
        let (mm, h, ch) = (i >> 4, (i >> 3) & 1, i & 7);
        let src = (tok0 + mm) * kpad + (2 * pp + h) * 64 + ch * 8;
        let dst = sh(base + (h * a_tile + mm * 128 + ((ch ^ (mm & 7)) << 4)) as u32);
        for e in 0..8 {
            smem[dst + 2 * e..dst + 2 * e + 2].copy_from_slice(&actp[src + e].to_le_bytes());
        }
    }
}

/// The A fragments of `warpgroup`'s 4 warps, dequantized from the stage at byte `b` of shared
/// memory: each lane's codes times its scales (`mul.bf16x2`).
fn emu_fragments(g: &Emu<'_>, smem: &[u8], b: usize, warpgroup: usize) -> EmuFrags {
    let (s_off, w_off) = (g.s_off, g.w_off);
    // Registers of the group's 4 warps: a[h][warp][lane][j][reg].
    let mut a = vec![vec![vec![[[0u32; 4]; 4]; 32]; 4]; 2];
    for wq in 0..4 {
        let warp = 4 * warpgroup + wq;
        for lane in 0..32 {
            let sw = read_u32(smem, b + s_off + warp * 128 + lane * 4);
            for (h, ah) in a.iter_mut().enumerate() {
                let wbase = b + w_off + warp * 1024 + 512 * h + lane * 16;
                let lo = scale_bf16_bits(sw.to_le_bytes()[2 * h]);
                let hi = scale_bf16_bits(sw.to_le_bytes()[2 * h + 1]);
                for (j, regs) in ah[wq][lane].iter_mut().enumerate() {
                    let q = read_u32(smem, wbase + 4 * j);
                    for (r, reg) in regs.iter_mut().enumerate() {
                        let pair = extract_reg(q, r);
                        // scale2: the scale's BF16 in both halves.
                        let s = if r % 2 == 0 { lo } else { hi } as u32;
                        *reg = bf16x2_mul(pair, s | (s << 16));
                    }
                }
            }
        }
    }
    a
}

/// The epilogue of a span: a span covering its group's whole K writes the outputs; a split
/// one writes its slot of the workspace, and the last of the group's CTAs to arrive sums the
/// slots in slice order into the outputs and resets the group's counter.
fn emu_epilogue(
    g: &Emu<'_>,
    span: &EmuSpan,
    acc: &[Vec<Vec<f64>>],
    out: &mut [f64],
    ws: &mut [f64],
    counters: &mut [u32],
) {
    let EmuLaunch { tn, ctas, .. } = g.l;
    let (p, n, rows, pairs, groups, units) = (g.p, g.n, g.rows, g.pairs, g.groups, g.units);
    let EmuSpan {
        tile,
        c,
        tok0,
        mt,
        grp,
        strip0,
        pa,
        pb,
        later,
        ..
    } = *span;
    let frag = |warp: usize, lane: usize, r: usize| {
        let (g, t) = (lane >> 2, lane & 3);
        (
            warp * 16 + g + 8 * ((r >> 1) & 1),
            8 * (r >> 2) + 2 * t + (r & 1),
        )
    };
    if pa == 0 && pb == pairs {
        for (warp, aw) in acc.iter().enumerate() {
            for (lane, al) in aw.iter().enumerate() {
                for (r, v) in al.iter().enumerate() {
                    let (row, mm) = frag(warp, lane, r);
                    let nn = strip0 * 16 + row;
                    if nn < n && mm < mt {
                        out[(tok0 + mm) * n + nn] = v * p.out_scale as f64;
                    }
                }
            }
        }
    } else {
        let first = v2_owner(grp * pairs, units, ctas);
        let last = v2_owner(grp * pairs + pairs - 1, units, ctas);
        let slices = last - first + 1;
        let gi = tile * groups + grp;
        let slot = ((tile * ctas + c) * 2 + usize::from(later)) * rows * tn;
        for (warp, aw) in acc.iter().enumerate() {
            for (lane, al) in aw.iter().enumerate() {
                for (r, v) in al.iter().enumerate() {
                    let (row, mm) = frag(warp, lane, r);
                    if mm < mt {
                        ws[slot + mm * rows + row] = *v;
                    }
                }
            }
        }
        let prev = counters[gi];
        counters[gi] += 1;
        if prev == (slices - 1) as u32 {
            let first_part = usize::from(stripe(first, units, ctas).0 < grp * pairs);
            for idx in 0..rows * mt {
                let (mm, row) = (idx / rows, idx % rows);
                let nn = strip0 * 16 + row;
                let mut s = 0f64;
                for q in first..=last {
                    let part = if q == first { first_part } else { 0 };
                    s += ws[((tile * ctas + q) * 2 + part) * rows * tn + idx];
                }
                if nn < n {
                    out[(tok0 + mm) * n + nn] = s * p.out_scale as f64;
                }
            }
            counters[gi] = 0;
        }
    }
}

/// `mul.rn.bf16x2` of two BF16 pairs (exact for the products the kernel forms).
fn bf16x2_mul(a: u32, b: u32) -> u32 {
    let one = |x: u16, y: u16| {
        let v = half::bf16::from_bits(x).to_f32() * half::bf16::from_bits(y).to_f32();
        half::bf16::from_f32(v).to_bits() as u32
    };
    one(a as u16, b as u16) | (one((a >> 16) as u16, (b >> 16) as u16) << 16)
}

/// One wgmma m64n`tn`k16 of a warpgroup: A from its 4 warps' registers `a[warp][lane][j]`
/// (per warp, the m16n8k16 A layout: register r of lane (g, t) holds row g + 8·(r % 2), k
/// columns 2t + 8·(r / 2) + {0, 1}, low half first; PTX ISA wgmma register fragments, CUTLASS
/// `ALayout_64x16`), B through `b(k, n)`, accumulated into `acc[warp][lane][r]` (D: row
/// 16·warp + g + 8·((r / 2) % 2), column 8·(r / 4) + 2t + r % 2; CUTLASS `CLayout_64xN`).
#[allow(clippy::type_complexity)]
fn wgmma(
    acc: &mut [Vec<Vec<f64>>],
    a: &[Vec<[[u32; 4]; 4]>],
    j: usize,
    tn: usize,
    b: impl Fn(usize, usize) -> f64,
) {
    // The 64 × 16 A tile as values.
    let mut av = [[0f64; 16]; 64];
    for (warp, aw) in a.iter().enumerate() {
        for (lane, regs) in aw.iter().enumerate() {
            let (g, t) = (lane >> 2, lane & 3);
            for (r, pair) in regs[j].iter().enumerate() {
                for e in 0..2 {
                    let row = 16 * warp + g + 8 * (r % 2);
                    let col = 2 * t + 8 * (r / 2) + e;
                    av[row][col] = half::bf16::from_bits((pair >> (16 * e)) as u16).to_f64();
                }
            }
        }
    }
    let bv: Vec<Vec<f64>> = (0..16)
        .map(|kk| (0..tn).map(|nn| b(kk, nn)).collect())
        .collect();
    for (warp, aw) in acc.iter_mut().enumerate() {
        for (lane, regs) in aw.iter_mut().enumerate() {
            let (g, t) = (lane >> 2, lane & 3);
            for (r, d) in regs.iter_mut().enumerate() {
                let row = 16 * warp + g + 8 * ((r >> 1) & 1);
                let col = 8 * (r >> 2) + 2 * t + (r & 1);
                *d += (0..16).map(|kk| av[row][kk] * bv[kk][col]).sum::<f64>();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::nvfp4;

    fn seeded(seed: u32, n: usize) -> Vec<f32> {
        (0..n as u32)
            .map(|i| crate::kernels::data::uniform_pm1(i, seed))
            .collect()
    }

    /// Emulate `l` on an `n × k` weight and `m` tokens, in two CTA arrival orders, and check the
    /// outputs against the exact reference and each other.
    fn check(n: usize, k: usize, m: usize, l: EmuLaunch) {
        let mut w = nvfp4::quantize(&seeded(11 ^ n as u32, n * k), n, k).unwrap();
        // A zero and a negative block scale: the repack's handling must survive the new path.
        w.block_scales[0] = 0;
        w.block_scales[1] |= 0x80;
        let p = crate::formats::w4a16_pack::repack(&w).unwrap();
        let a_raw = seeded(5 ^ m as u32, m * k);
        let act: Vec<u16> = a_raw
            .iter()
            .map(|v| half::bf16::from_f32(*v).to_bits())
            .collect();
        let want = reference(&w, &act, m);
        let fwd: Vec<usize> = (0..l.ctas).collect();
        let rev: Vec<usize> = (0..l.ctas).rev().collect();
        let got = emulate(&p, &act, m, l, &fwd);
        for (i, (g, r)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - r).abs() <= 1e-9 * (1.0 + r.abs()),
                "{l:?} n={n} k={k} m={m}: output (token {}, row {}) = {g}, reference {r}",
                i / n,
                i % n
            );
        }
        let again = emulate(&p, &act, m, l, &rev);
        assert!(
            got.iter()
                .zip(&again)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{l:?}: the split-K reduction depends on which CTA arrives last"
        );
    }

    #[test]
    fn emulated_wgmma_kernel_matches_reference_one_cta() {
        // N = 24: one group of 4 strips, 2 of them padding; K = 80: k tail inside the only pair.
        check(
            24,
            80,
            3,
            EmuLaunch {
                tn: 8,
                wg: 1,
                pipe: false,
                stages: 3,
                ctas: 1,
            },
        );
    }

    #[test]
    fn emulated_wgmma_kernel_matches_reference_split_k_and_groups() {
        // 13 strips: 4 groups of 4 (WG = 1) or 2 of 8 (WG = 2); K = 640: 5 pairs; stripes that
        // start and end inside groups; one CTA walking every group through a 2-stage ring;
        // several token tiles with a partial last one; the `_p` ring (loads 2 fewer ahead).
        for (tn, wg, pipe, stages, ctas, m) in [
            (8, 1, false, 2, 7, 1),
            (16, 1, false, 2, 1, 9),
            (16, 2, false, 3, 3, 40),
            (32, 1, false, 4, 20, 20),
            (64, 2, false, 6, 4, 64),
            (64, 1, true, 3, 3, 50),
            (64, 2, true, 4, 1, 64),
        ] {
            check(
                200,
                640,
                m,
                EmuLaunch {
                    tn,
                    wg,
                    pipe,
                    stages,
                    ctas,
                },
            );
        }
    }

    #[test]
    fn emulated_wgmma_kernel_large_token_tiles() {
        // TN = 128 and 256 (one and two token tiles), K not a multiple of 128.
        check(
            64,
            208,
            130,
            EmuLaunch {
                tn: 128,
                wg: 1,
                pipe: false,
                stages: 2,
                ctas: 2,
            },
        );
        check(
            40,
            128,
            300,
            EmuLaunch {
                tn: 256,
                wg: 2,
                pipe: false,
                stages: 2,
                ctas: 1,
            },
        );
        check(
            64,
            1024,
            200,
            EmuLaunch {
                tn: 256,
                wg: 1,
                pipe: true,
                stages: 3,
                ctas: 1,
            },
        );
    }

    #[test]
    fn descriptor_fields_and_swizzle() {
        let d = desc_b(0x2400 + 64);
        assert_eq!(d & 0x3FFF, (0x2400 + 64) >> 4);
        assert_eq!((d >> 16) & 0x3FFF, 1, "leading byte offset (unused)");
        assert_eq!((d >> 32) & 0x3FFF, 64, "stride byte offset 1024 >> 4");
        assert_eq!(d >> 62, 1, "128-byte swizzle");
        // Row r of an 8-row atom: chunk c lands at chunk c ^ r.
        for r in 0..8u32 {
            for c in 0..8u32 {
                assert_eq!(
                    swizzle128(1024 + r * 128 + c * 16),
                    1024 + r * 128 + (c ^ r) * 16
                );
            }
        }
        // Element (k, n) of step j: where the kernel's 16-byte copy put position 16j + k of
        // token n's permuted k tile (chunk (16j + k) / 8, swizzled by the row).
        for n in 0..16usize {
            for j in 0..4usize {
                for kk in 0..16 {
                    let at = b_element_addr(desc_b(2048 + 32 * j as u32), kk, n);
                    let pos = 16 * j + kk;
                    let want = 2048 + n * 128 + (((pos / 8) ^ (n & 7)) << 4) + 2 * (pos % 8);
                    assert_eq!(at as usize, want, "n {n} j {j} k {kk}");
                }
            }
        }
    }
}
