//! Small-M GEMMs ("GEMVs", M ≤ [`MAX_M`] tokens) for BF16 and FP8 E4M3 weights
//! (`kernels/gemv.cu`): the decode-step linears where cuBLASLt's fixed cost keeps a GEMM well
//! above its weight-streaming floor (docs/runtime.md). The tuner chooses them against cuBLASLt
//! per (shape, M bucket) on the card; they are never assumed faster.
//!
//! Shapes (docs/architecture.md, "Terms"): activations `x` M×K, weights `w` N×K, output `y` M×N,
//! all row-major. BF16: `y = bf16(Σ_k x·w)` with FP32 sums. FP8: `y = bf16(acc · xs[t] · ws[n])`
//! with `acc = Σ_k qx·qw` over E4M3 codes (FP32 sums), `xs` one FP32 scale per token (or one per
//! tensor) and `ws` one per output channel (or one per tensor): W8A8 as the runtime's FP8 path runs
//! it, the activations quantized by the kernel that produced them (the fused RMSNorm / SwiGLU +
//! FP8 kernels, or `kernels/fp8_quant.cu`).
//!
//! The kernel puts 16 weight rows on the M side of a tensor-core mma and up to 8 tokens on its N
//! side; each lane feeds the mma 16 contiguous bytes of K as if they were the K positions the
//! fragment layout names for it, in A and B alike (a dot product does not depend on the order of
//! K). [`emulate`] replays that index math on the CPU with the PTX fragment layouts, and the tests
//! hold it to the plain reference ([`reference_bf16`], [`reference_fp8`]).

use crate::formats::e4m3;
use crate::gpu::launch::{DevPtr, U32x4};
use crate::gpu::{Gpu, Module};

/// The source, compiled by NVRTC at run time.
pub const SRC: &str = include_str!("../../kernels/gemv.cu");

/// The most tokens one launch takes (the mma's N = 8).
pub const MAX_M: usize = 8;

/// Weight rows per CTA (the mma's M = 16).
pub const ROWS_PER_CTA: usize = 16;

/// The kernels `kernels/gemv.cu` has: weight format and output type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GemvFormat {
    /// BF16 weights and activations, BF16 output.
    Bf16,
    /// BF16 weights and activations, FP32 output (the lm_head's logits).
    Bf16F32,
    /// FP8 E4M3 weights and activations with FP32 scales, BF16 output.
    Fp8,
}

impl GemvFormat {
    /// K values per row in one step of one warp: 4 lanes × 16 bytes.
    pub fn k_step(self) -> usize {
        match self {
            GemvFormat::Bf16 | GemvFormat::Bf16F32 => 32,
            GemvFormat::Fp8 => 64,
        }
    }

    /// Bytes of one weight.
    pub fn weight_bytes(self) -> usize {
        match self {
            GemvFormat::Bf16 | GemvFormat::Bf16F32 => 2,
            GemvFormat::Fp8 => 1,
        }
    }

    /// Elements per 32-bit register of an mma operand: 2 (BF16) or 4 (E4M3).
    pub fn per_word(self) -> usize {
        4 / self.weight_bytes()
    }

    /// The mma's K: 16 (m16n8k16, BF16) or 32 (m16n8k32, E4M3); two mma's per step.
    pub fn mma_k(self) -> usize {
        self.k_step() / 2
    }

    /// The name's tag: `bf16`, `bf16f32`, `fp8`.
    pub fn tag(self) -> &'static str {
        match self {
            GemvFormat::Bf16 => "bf16",
            GemvFormat::Bf16F32 => "bf16f32",
            GemvFormat::Fp8 => "fp8",
        }
    }

    /// Every kernel family.
    pub const ALL: [GemvFormat; 3] = [GemvFormat::Bf16, GemvFormat::Bf16F32, GemvFormat::Fp8];
}

/// One compiled configuration: `warps` warps split K, each loading `unroll` steps before it
/// uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Variant {
    /// Warps per CTA (they split K).
    pub warps: u32,
    /// Steps loaded ahead per warp.
    pub unroll: u32,
}

/// Every configuration `kernels/gemv.cu` stamps out, in the tuner's order.
pub const VARIANTS: [Variant; 4] = [
    Variant {
        warps: 8,
        unroll: 4,
    },
    Variant {
        warps: 8,
        unroll: 2,
    },
    Variant {
        warps: 4,
        unroll: 4,
    },
    Variant {
        warps: 4,
        unroll: 2,
    },
];

impl Variant {
    /// The kernel's name for `format`, e.g. `gemv_bf16_w8_u4`.
    pub fn kernel(&self, format: GemvFormat) -> String {
        format!("gemv_{}_w{}_u{}", format.tag(), self.warps, self.unroll)
    }
}

/// Every kernel of `kernels/gemv.cu`.
pub fn kernel_names() -> Vec<String> {
    GemvFormat::ALL
        .iter()
        .flat_map(|f| VARIANTS.iter().map(move |v| v.kernel(*f)))
        .chain(grouped_kernel_names())
        .collect()
}

/// The grouped expert GEMVs of the same source (`moe_gemv_{bf16,fp8}_w{W}_u{U}[_t8]`, stamped by
/// `MOE_GEMV_VARIANT`), which [`crate::gemm::moe`] launches: [`grouped_kernel_name`] of each.
pub fn grouped_kernel_names() -> Vec<String> {
    let mut v = Vec::new();
    for fp8 in [false, true] {
        for (w, u) in GROUPED_VARIANTS {
            for one_tile in [false, true] {
                v.push(grouped_kernel_name(fp8, (w, u), one_tile));
            }
        }
    }
    v
}

/// The grouped expert GEMV over BF16 or FP8 (`fp8`) weights with `(warps, unroll)`, in its
/// general form or its `_t8` form (`one_tile`: at most [`super::moe::PAIRS_PER_PASS`] pairs per
/// expert, which a batch of at most that many tokens guarantees; only the one-tile pass is
/// compiled, so the kernel keeps that pass's registers alone).
pub fn grouped_kernel_name(fp8: bool, (w, u): (u32, u32), one_tile: bool) -> String {
    format!(
        "moe_gemv_{}_w{w}_u{u}{}",
        if fp8 { "fp8" } else { "bf16" },
        if one_tile { "_t8" } else { "" }
    )
}

/// The `(warps, unroll)` pairs `MOE_GEMV_VARIANT` stamps out.
pub const GROUPED_VARIANTS: [(u32, u32); 2] = [(4, 4), (8, 2)];

/// Why the GEMV cannot run `m × n × k` in `format`, or `None` when it can: 1 ≤ M ≤ [`MAX_M`],
/// N ≥ 1, K a positive multiple of [`GemvFormat::k_step`] (so every row is 16-byte aligned), and
/// the grid and sizes within `i32`.
pub fn unsupported(format: GemvFormat, m: usize, n: usize, k: usize) -> Option<String> {
    if m == 0 || m > MAX_M {
        return Some(format!("M = {m}: the GEMV takes 1 to {MAX_M} tokens"));
    }
    let step = format.k_step();
    if k == 0 || k % step != 0 {
        return Some(format!(
            "K = {k}: the {} GEMV needs a positive multiple of {step}",
            format.tag()
        ));
    }
    if n == 0 || n > i32::MAX as usize || k > i32::MAX as usize {
        return Some(format!("N = {n}, K = {k}: outside the kernel's i32 sizes"));
    }
    None
}

/// The FP8 GEMV's scales: device addresses of FP32 arrays and whether each holds one value per
/// token / channel (`true`) or one for the whole tensor (`false`).
#[derive(Debug, Clone, Copy)]
pub struct Fp8Scales {
    /// Weight scales: `N` values, or one.
    pub w: u64,
    /// One weight scale per output channel.
    pub w_per_channel: bool,
    /// Activation scales: `M` values, or one.
    pub x: u64,
    /// One activation scale per token.
    pub x_per_token: bool,
}

/// Launch the GEMV `y[M, N] = x[M, K] · w[N, K]ᵀ` of `format` in configuration `v` on `gpu`'s
/// stream (CUDA-graph safe: no allocation, no synchronization). `scales` is required for
/// [`GemvFormat::Fp8`] and ignored otherwise. Device addresses: `w`, `x` 16-byte aligned; `y`
/// holds M × N BF16 (FP32 for [`GemvFormat::Bf16F32`]).
///
/// # Errors
/// The shape is [`unsupported`], an address is misaligned, FP8 without scales, or the launch
/// fails.
#[allow(clippy::too_many_arguments)]
pub fn launch(
    gpu: &Gpu,
    module: &Module,
    format: GemvFormat,
    v: Variant,
    (w, x, y): (u64, u64, u64),
    scales: Option<Fp8Scales>,
    m: usize,
    n: usize,
    k: usize,
) -> anyhow::Result<()> {
    if let Some(why) = unsupported(format, m, n, k) {
        anyhow::bail!("{why}");
    }
    anyhow::ensure!(
        w % 16 == 0 && x % 16 == 0,
        "the GEMV reads 16-byte vectors: weights at {w:#x} and activations at {x:#x} must be 16-byte aligned"
    );
    let grid = (n.div_ceil(ROWS_PER_CTA) as u32, 1, 1);
    let block = (32 * v.warps, 1, 1);
    let name = v.kernel(format);
    let (m, n, k) = (m as i32, n as i32, k as i32);
    match format {
        GemvFormat::Bf16F32 => super::launchers::gemv::bf16f32(
            module,
            gpu,
            &name,
            grid,
            block,
            0,
            DevPtr::<U32x4>::at(w),
            DevPtr::<U32x4>::at(x),
            DevPtr::<f32>::at(y),
            m,
            n,
            k,
        )?,
        GemvFormat::Bf16 => super::launchers::gemv::bf16(
            module,
            gpu,
            &name,
            grid,
            block,
            0,
            DevPtr::<U32x4>::at(w),
            DevPtr::<U32x4>::at(x),
            DevPtr::<u16>::at(y),
            m,
            n,
            k,
        )?,
        GemvFormat::Fp8 => {
            let s = scales.ok_or_else(|| anyhow::anyhow!("the FP8 GEMV needs its scales"))?;
            super::launchers::gemv::fp8(
                module,
                gpu,
                &name,
                grid,
                block,
                0,
                DevPtr::<U32x4>::at(w),
                DevPtr::<U32x4>::at(x),
                DevPtr::<f32>::at(s.w),
                i32::from(s.w_per_channel),
                DevPtr::<f32>::at(s.x),
                i32::from(s.x_per_token),
                DevPtr::<u16>::at(y),
                m,
                n,
                k,
            )?
        }
    }
    Ok(())
}

/// CPU reference of the BF16 GEMV: `y[t][n] = Σ_k x[t][k] · w[n][k]` in FP64, as FP32 (`M × N`,
/// before the BF16 rounding the kernel applies). `w`: N×K BF16 bits; `x`: M×K BF16 bits.
pub fn reference_bf16(w: &[u16], x: &[u16], m: usize, n: usize, k: usize) -> Vec<f32> {
    dot_rows(
        m,
        n,
        k,
        |t, i| half::bf16::from_bits(x[t * k + i]).to_f32(),
        |r, i| half::bf16::from_bits(w[r * k + i]).to_f32(),
    )
}

/// CPU reference of the FP8 GEMV: `y[t][n] = xs[t] · ws[n] · Σ_k e4m3(qx[t][k]) · e4m3(qw[n][k])`
/// (FP64 sums), as FP32 (`M × N`). `xs`: M scales or one; `ws`: N scales or one.
pub fn reference_fp8(
    w: &[u8],
    x: &[u8],
    (ws, xs): (&[f32], &[f32]),
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f32> {
    let acc = dot_rows(
        m,
        n,
        k,
        |t, i| e4m3::decode(x[t * k + i]),
        |r, i| e4m3::decode(w[r * k + i]),
    );
    let pick = |s: &[f32], i: usize| if s.len() == 1 { s[0] } else { s[i] };
    acc.iter()
        .enumerate()
        .map(|(j, a)| a * (pick(xs, j / n) * pick(ws, j % n)))
        .collect()
}

fn dot_rows(
    m: usize,
    n: usize,
    k: usize,
    x: impl Fn(usize, usize) -> f32,
    w: impl Fn(usize, usize) -> f32,
) -> Vec<f32> {
    let mut y = vec![0f32; m * n];
    for t in 0..m {
        for r in 0..n {
            let s: f64 = (0..k)
                .map(|i| f64::from(x(t, i)) * f64::from(w(r, i)))
                .sum();
            y[t * n + r] = s as f32;
        }
    }
    y
}

/// Where a lane's register holds an mma operand element, by the PTX ISA's fragment layouts of
/// `mma.sync.aligned.m16n8k16` (BF16: 2 elements per 32-bit register) and `m16n8k32` (E4M3: 4):
/// `(lane, register, element in the register)` of A's (row, κ) and of B's (κ, column).
fn a_slot(format: GemvFormat, row: usize, kappa: usize) -> (usize, usize, usize) {
    let per = format.per_word();
    let half = format.mma_k() / 2; // 8 (BF16) or 16 (E4M3): κ of the second register pair
    let lane = (row % 8) * 4 + (kappa % half) / per;
    let reg = usize::from(row >= 8) + 2 * usize::from(kappa >= half);
    (lane, reg, kappa % per)
}

fn b_slot(format: GemvFormat, kappa: usize, col: usize) -> (usize, usize, usize) {
    let per = format.per_word();
    let half = format.mma_k() / 2;
    (
        col * 4 + (kappa % half) / per,
        usize::from(kappa >= half),
        kappa % per,
    )
}

/// Replays `kernels/gemv.cu`'s index math on the CPU for one CTA's 16 rows starting at `row0`:
/// which bytes each lane loads, and what the mma computes from them under the PTX fragment
/// layouts ([`a_slot`], [`b_slot`]). Returns the CTA's `16 × 8` FP64 sums (rows × tokens, the
/// scales not applied). `elem(w_or_x, row_or_token, k)` gives an element's value; rows ≥ `n` and
/// tokens ≥ `m` are zero, as the kernel's masked loads make them.
pub fn emulate(
    format: GemvFormat,
    (m, n, k): (usize, usize, usize),
    warps: usize,
    row0: usize,
    elem: &dyn Fn(bool, usize, usize) -> f64,
) -> [[f64; 8]; 16] {
    let step = format.k_step();
    let per = format.per_word();
    let lane_k = per * 4; // K values per lane and step: its 16 bytes
    let mut d = [[0f64; 8]; 16];
    // Warp w runs steps w, w + warps, ...; the sums do not depend on which warp ran a step (the
    // kernel adds the warps' tiles), so the steps are replayed in order.
    debug_assert!(warps >= 1);
    for s in 0..k / step {
        for mma in 0..2 {
            // A[row][κ] and B[κ][col] as values.
            let mut a = vec![vec![0f64; format.mma_k()]; 16];
            let mut b = vec![vec![0f64; 8]; format.mma_k()];
            for lane in 0..32 {
                let (g, q) = (lane / 4, lane % 4);
                let kbase = s * step + q * lane_k;
                // The words this mma takes: .x/.y (first) or .z/.w (second).
                let wd = |j: usize| 2 * mma + j;
                // A registers: {row g word0, row g+8 word0, row g word1, row g+8 word1}.
                let a_regs = [(g, wd(0)), (g + 8, wd(0)), (g, wd(1)), (g + 8, wd(1))];
                for (reg, (row, word)) in a_regs.iter().enumerate() {
                    for e in 0..per {
                        let kk = kbase + word * per + e;
                        let r = row0 + row;
                        let v = if r < n { elem(true, r, kk) } else { 0.0 };
                        // Which (row, κ) this register slot is, by the layout.
                        let (rr, kap) = find_a(format, lane, reg, e);
                        debug_assert_eq!(rr, *row);
                        a[rr][kap] = v;
                    }
                }
                for (reg, word) in [wd(0), wd(1)].iter().enumerate() {
                    for e in 0..per {
                        let kk = kbase + word * per + e;
                        let v = if g < m { elem(false, g, kk) } else { 0.0 };
                        let (kap, col) = find_b(format, lane, reg, e);
                        debug_assert_eq!(col, g);
                        b[kap][col] = v;
                    }
                }
            }
            for (r, dr) in d.iter_mut().enumerate() {
                for (c, dc) in dr.iter_mut().enumerate() {
                    *dc += (0..format.mma_k())
                        .map(|kap| a[r][kap] * b[kap][c])
                        .sum::<f64>();
                }
            }
        }
    }
    d
}

fn find_a(format: GemvFormat, lane: usize, reg: usize, e: usize) -> (usize, usize) {
    let kk = format.mma_k();
    (0..16)
        .flat_map(|r| (0..kk).map(move |kap| (r, kap)))
        .find(|&(r, kap)| a_slot(format, r, kap) == (lane, reg, e))
        .expect("every A slot is some (row, κ)")
}

fn find_b(format: GemvFormat, lane: usize, reg: usize, e: usize) -> (usize, usize) {
    let kk = format.mma_k();
    (0..kk)
        .flat_map(|kap| (0..8).map(move |c| (kap, c)))
        .find(|&(kap, c)| b_slot(format, kap, c) == (lane, reg, e))
        .expect("every B slot is some (κ, column)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(is_w: bool, i: usize, k: usize) -> f64 {
        // Distinct, exactly representable values, so any misplaced index changes the sum.
        let h = (i * 131 + k * 17 + usize::from(is_w) * 7) % 61;
        (h as f64 - 30.0) / 8.0
    }

    #[test]
    fn the_fragment_layouts_cover_each_slot_once() {
        for f in [GemvFormat::Bf16, GemvFormat::Fp8] {
            let kk = f.mma_k();
            let mut seen = std::collections::HashSet::new();
            for r in 0..16 {
                for kap in 0..kk {
                    assert!(seen.insert(a_slot(f, r, kap)), "{f:?} A ({r}, {kap})");
                }
            }
            assert_eq!(
                seen.len(),
                32 * 4 * f.per_word(),
                "{f:?}: 4 registers per lane"
            );
            let mut seen = std::collections::HashSet::new();
            for kap in 0..kk {
                for c in 0..8 {
                    assert!(seen.insert(b_slot(f, kap, c)), "{f:?} B ({kap}, {c})");
                }
            }
            assert_eq!(
                seen.len(),
                32 * 2 * f.per_word(),
                "{f:?}: 2 registers per lane"
            );
        }
    }

    #[test]
    fn the_kernels_index_math_is_a_permutation_of_k() {
        for f in [GemvFormat::Bf16, GemvFormat::Fp8] {
            for &(m, n, k, row0) in &[(1, 16, 128, 0), (3, 40, 256, 16), (8, 20, 192, 16)] {
                let k = k / f.k_step() * f.k_step();
                let d = emulate(f, (m, n, k), 4, row0, &value);
                for (r, dr) in d.iter().enumerate() {
                    for (t, got) in dr.iter().enumerate() {
                        let row = row0 + r;
                        let want: f64 = if row < n && t < m {
                            (0..k)
                                .map(|i| value(true, row, i) * value(false, t, i))
                                .sum()
                        } else {
                            0.0
                        };
                        assert_eq!(*got, want, "{f:?} m={m} n={n} k={k} row {row} token {t}");
                    }
                }
            }
        }
    }

    #[test]
    fn references_apply_the_scales_per_token_and_channel() {
        // 1.0 is 0x38 in E4M3, 2.0 is 0x40; BF16 1.0 is 0x3f80, 2.0 0x4000.
        let (m, n, k) = (2, 3, 4);
        let w8 = vec![0x38u8; n * k];
        let x8 = [vec![0x38u8; k], vec![0x40u8; k]].concat();
        let y = reference_fp8(&w8, &x8, (&[1.0, 2.0, 4.0], &[0.5, 0.25]), m, n, k);
        assert_eq!(y, vec![2.0, 4.0, 8.0, 2.0, 4.0, 8.0]);
        let y = reference_fp8(&w8, &x8, (&[3.0], &[1.0]), m, n, k);
        assert_eq!(y, vec![12.0, 12.0, 12.0, 24.0, 24.0, 24.0]);
        let wb = vec![0x3f80u16; n * k];
        let xb = [vec![0x3f80u16; k], vec![0x4000u16; k]].concat();
        assert_eq!(
            reference_bf16(&wb, &xb, m, n, k),
            vec![4.0, 4.0, 4.0, 8.0, 8.0, 8.0]
        );
    }

    #[test]
    fn shapes_outside_the_kernel_are_refused_with_the_reason() {
        assert!(unsupported(GemvFormat::Bf16, 1, 4096, 4096).is_none());
        assert!(unsupported(GemvFormat::Fp8, 8, 96, 5120).is_none());
        assert!(unsupported(GemvFormat::Bf16, 9, 4096, 4096)
            .unwrap()
            .contains("1 to 8"));
        assert!(unsupported(GemvFormat::Bf16, 0, 4096, 4096).is_some());
        assert!(unsupported(GemvFormat::Fp8, 1, 4096, 4128)
            .unwrap()
            .contains("multiple of 64"));
        assert!(unsupported(GemvFormat::Bf16, 1, 4096, 4112).is_some());
        assert!(unsupported(GemvFormat::Bf16, 1, 0, 4096).is_some());
    }

    #[test]
    fn every_variant_has_a_distinct_kernel_name() {
        let names = kernel_names();
        assert_eq!(names.len(), 3 * VARIANTS.len() + 4 * GROUPED_VARIANTS.len());
        for (w, u) in GROUPED_VARIANTS {
            assert!(SRC.contains(&format!("MOE_GEMV_VARIANT({w}, {u})")));
        }
        let set: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(set.len(), names.len());
        assert!(names.contains(&"gemv_fp8_w8_u4".to_string()));
    }
}
