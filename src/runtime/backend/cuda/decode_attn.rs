//! Decode attention: which kernel runs (pure, tested on the CPU), the flash-decoding kernel's
//! launch facts, and a CPU emulation of its split/merge arithmetic.
//!
//! Two kernels compute the same function (kernels/runtime.cu; docs/runtime.md "Decode
//! attention"):
//!
//! - `rt_attn_flash_{bf16,fp8}_hd{64,128,256}`: flash-decoding (Dao, Haziza, Massa, Sizov,
//!   "Flash-Decoding for long-context inference", 2023) on tensor cores: the KV sequence is split
//!   over partitions (grid z), each partition's 64-position chunks are staged with `cp.async`,
//!   S = Q·Kᵀ and O += P·V run on `mma.sync` m16n8k16 with the G query heads of one KV head as
//!   the rows of the A operand, four warps keep their own online softmax and are merged at the
//!   end, and `rt_attn_combine` merges the partitions (log-sum-exp merge);
//! - `rt_attn_decode_{bf16,fp8}`: the CUDA-core kernel (head_dim ≤ 128), kept as the fallback
//!   and the reference the flash kernel is checked against.
//!
//! [`choose`] picks one; [`emulate_split_merge`] reproduces the flash kernel's order of
//! operations (chunks, warps, partitions, P as BF16 hi/lo operands) on the CPU so the merge math is
//! tested against the plain softmax [`reference`] without a GPU.

use super::plan::ATT_CHUNK;

/// head_dims the flash-decoding kernel is built for.
pub const FLASH_HEAD_DIMS: [usize; 3] = [64, 128, 256];
/// Largest query-heads-per-KV-head group of the flash kernel (the 16 rows of one mma A operand).
pub const FLASH_MAX_GROUP: usize = 16;
/// Warps of the flash kernel (`FD_WARPS`); warp w owns keys 16w..16w+15 of each chunk.
pub const FLASH_WARPS: usize = 4;
/// Threads of the flash kernel.
pub const FLASH_THREADS: u32 = (FLASH_WARPS * 32) as u32;
/// Keys per warp per chunk (`ATT_CHUNK / FLASH_WARPS`).
const WARP_KEYS: usize = ATT_CHUNK / FLASH_WARPS;

/// rel L2 error allowed between either decode-attention kernel and the CPU reference (f64
/// softmax over the same BF16/E4M3 values): both round the output to BF16 (2⁻⁹ relative per
/// element); measured on the H200 1.4–1.7e-3 for both kernels. It would also pass a flash
/// kernel that rounds P to BF16 once (2.1–2.3e-3 measured), which is why the two kernels are
/// held to each other too ([`FLASH_VS_CUDA_CORES_REL_L2`]).
pub const FLASH_DECODE_REL_L2: f64 = 1e-2;

/// rel L2 difference allowed between the flash kernel's output and the CUDA-core kernel's on the
/// same case, where both run: with P as BF16 hi/lo operands the H200 measured 0 to 1.5e-4; with
/// P rounded to BF16 once, 2.1–2.5e-3 (the precision that failed whole-model parity).
pub const FLASH_VS_CUDA_CORES_REL_L2: f64 = 5e-4;

/// The target for decode attention's time: at most this multiple of its KV bytes ÷ the copy
/// rate measured in the same run, at 4k and 32k contexts, batch 1 and 32 (docs/runtime.md
/// "Decode attention").
pub const ATTENTION_BOUND_TARGET: f64 = 1.5;

/// Which decode-attention kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeAttn {
    /// `rt_attn_flash_*` (tensor cores, split KV).
    Flash,
    /// `rt_attn_decode_*` (CUDA cores), head_dim ≤ 128.
    CudaCores,
    /// Neither kernel of `kernels/runtime.cu` covers the shape (the hybrids' `hy_attn_decode_*`
    /// covers head_dim 256 on CUDA cores).
    None,
}

impl DecodeAttn {
    /// The kernel in words, for a report's conditions.
    pub fn describe(self) -> &'static str {
        match self {
            DecodeAttn::Flash => "flash-decoding on tensor cores (`rt_attn_flash_*`)",
            DecodeAttn::CudaCores => "CUDA cores (`rt_attn_decode_*`)",
            DecodeAttn::None => "the hybrids' CUDA-core kernel (`hy_attn_decode_*`)",
        }
    }
}

/// Largest head_dim of the CUDA-core decode kernel (`ATT_MAX_HD`).
pub const CUDA_CORE_MAX_HEAD_DIM: usize = 128;

/// The decode-attention kernel for `head_dim`, `group` query heads per KV head, a device of
/// compute capability `cc_major` with `smem_optin` bytes of opt-in shared memory per block, and
/// `flash_enabled` (the option, and its self-check at load).
///
/// The flash kernel needs `mma.sync` BF16 (sm_80 and later), a head_dim in
/// [`FLASH_HEAD_DIMS`], `group ≤ 16` and its shared memory ([`flash_smem_bytes`] with FP8 or
/// BF16 KV, `kv_bytes`); otherwise the CUDA-core kernel runs when head_dim ≤ 128 and
/// `group · head_dim ≤ 2048`.
pub fn choose(
    head_dim: usize,
    group: usize,
    kv_bytes: usize,
    cc_major: u32,
    smem_optin: u32,
    flash_enabled: bool,
) -> DecodeAttn {
    let flash_fits = cc_major >= 8
        && FLASH_HEAD_DIMS.contains(&head_dim)
        && (1..=FLASH_MAX_GROUP).contains(&group)
        && flash_smem_bytes(head_dim, kv_bytes) <= smem_optin;
    if flash_enabled && flash_fits {
        DecodeAttn::Flash
    } else if head_dim <= CUDA_CORE_MAX_HEAD_DIM && group * head_dim <= 2048 {
        DecodeAttn::CudaCores
    } else {
        DecodeAttn::None
    }
}

/// The flash kernel's name for FP8 or BF16 KV and `head_dim` (one of [`FLASH_HEAD_DIMS`]).
pub fn flash_kernel_name(fp8_kv: bool, head_dim: usize) -> String {
    format!(
        "rt_attn_flash_{}_hd{head_dim}",
        if fp8_kv { "fp8" } else { "bf16" }
    )
}

/// Dynamic shared memory of the flash kernel, bytes: K and V staging of one 64-position chunk
/// (rows of `head_dim · kv_bytes + 16` bytes), 16 BF16 query rows of `head_dim + 8` elements,
/// and the warps' (max, sum) per row (the layout at `attn_flash_body` in kernels/runtime.cu).
pub fn flash_smem_bytes(head_dim: usize, kv_bytes: usize) -> u32 {
    let stage = 2 * ATT_CHUNK * (head_dim * kv_bytes + 16);
    let q = 16 * (head_dim + 8) * 2;
    let red = 2 * FLASH_WARPS * 16 * 4;
    (stage + q + red) as u32
}

/// Plain softmax attention of `group` query rows over `ctx` key/value rows (f64 throughout):
/// `out[g] = Σ_p softmax_p(q[g]·k[p] · sm_scale) v[p]`. `q` is `[group][hd]`, `k` and `v`
/// `[ctx][hd]`; returns `[group][hd]`.
pub fn reference(q: &[f32], k: &[f32], v: &[f32], hd: usize, sm_scale: f32) -> Vec<f32> {
    let group = q.len() / hd;
    let ctx = k.len() / hd;
    let mut out = vec![0f32; group * hd];
    for g in 0..group {
        let qr = &q[g * hd..(g + 1) * hd];
        let s: Vec<f64> = (0..ctx)
            .map(|p| {
                let kr = &k[p * hd..(p + 1) * hd];
                qr.iter()
                    .zip(kr)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>()
                    * sm_scale as f64
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let l: f64 = e.iter().sum();
        for d in 0..hd {
            let o: f64 = (0..ctx).map(|p| e[p] * v[p * hd + d] as f64).sum();
            out[g * hd + d] = (o / l) as f32;
        }
    }
    out
}

/// One online-softmax state: running max `m`, sum `l` (relative to `m`), unnormalized output.
#[derive(Debug, Clone)]
struct State {
    m: f64,
    l: f64,
    o: Vec<f64>,
}

impl State {
    fn new(hd: usize) -> Self {
        State {
            m: f64::NEG_INFINITY,
            l: 0.0,
            o: vec![0.0; hd],
        }
    }

    /// Log-sum-exp merge of states, in order: M = max mᵢ, L = Σ lᵢ e^(mᵢ−M), O = Σ oᵢ e^(mᵢ−M).
    fn merge(states: &[State], hd: usize) -> State {
        let m = states.iter().map(|s| s.m).fold(f64::NEG_INFINITY, f64::max);
        let mut out = State::new(hd);
        out.m = m;
        for s in states {
            if s.m == f64::NEG_INFINITY {
                continue;
            }
            let f = (s.m - m).exp();
            out.l += s.l * f;
            for (a, b) in out.o.iter_mut().zip(&s.o) {
                *a += b * f;
            }
        }
        out
    }
}

/// The partition split of the decode kernels (`att_split` in kernels/runtime.cu): a context of
/// `ctx` positions in [`ATT_CHUNK`]-position chunks over `z` partitions. Returns (chunks,
/// chunks per partition, partitions that get any chunk).
pub fn split(ctx: usize, z: usize) -> (usize, usize, usize) {
    let nchunks = ctx.div_ceil(ATT_CHUNK);
    let per = nchunks.div_ceil(z.max(1)).max(1);
    (nchunks, per, nchunks.div_ceil(per))
}

fn bf16_round(x: f64) -> f64 {
    half::bf16::from_f32(x as f32).to_f32() as f64
}

/// How the softmax probabilities P enter the P·V product of the flash kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum POperand {
    /// Unrounded (the plain softmax; for checking the split and merge alone).
    Exact,
    /// One BF16 operand, `bf16(p)` (8 significant bits: the kernel before the split, and the
    /// prefill kernel).
    Bf16,
    /// Two BF16 operands, `hi = bf16(p)` and `lo = bf16(p − hi)`, each multiplied by V (about
    /// 16 significant bits): what `rt_attn_flash_*` does.
    Bf16HiLo,
}

impl POperand {
    fn apply(self, p: f64) -> f64 {
        match self {
            POperand::Exact => p,
            POperand::Bf16 => bf16_round(p),
            POperand::Bf16HiLo => {
                // The kernel forms p − hi in f32 from the f32 p.
                let pf = p as f32 as f64;
                let hi = bf16_round(pf);
                hi + bf16_round((pf as f32 - hi as f32) as f64)
            }
        }
    }
}

/// The flash kernel's arithmetic on the CPU, in its order: the context split over `z`
/// partitions ([`split`]), each partition's chunks walked by [`FLASH_WARPS`] warps of 16 keys
/// with their own online softmax, the warps merged in order, then the partitions merged in
/// order (`rt_attn_combine`), each merge the log-sum-exp merge. `p` says how the probabilities
/// enter P·V ([`POperand::Bf16HiLo`] is the kernel's mma operands). Same shapes as
/// [`reference`].
pub fn emulate_split_merge(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    hd: usize,
    sm_scale: f32,
    z: usize,
    p: POperand,
) -> Vec<f32> {
    let group = q.len() / hd;
    let ctx = k.len() / hd;
    let (nchunks, per, nparts) = split(ctx, z);
    let mut out = vec![0f32; group * hd];
    for g in 0..group {
        let qr = &q[g * hd..(g + 1) * hd];
        let mut parts = Vec::with_capacity(nparts);
        for part in 0..nparts {
            let (c0, c1) = (part * per, ((part + 1) * per).min(nchunks));
            let mut warps = vec![State::new(hd); FLASH_WARPS];
            for c in c0..c1 {
                for (w, st) in warps.iter_mut().enumerate() {
                    let keys: Vec<usize> = (0..WARP_KEYS)
                        .map(|i| c * ATT_CHUNK + w * WARP_KEYS + i)
                        .filter(|p| *p < ctx)
                        .collect();
                    if keys.is_empty() {
                        continue;
                    }
                    let s: Vec<f64> = keys
                        .iter()
                        .map(|p| {
                            qr.iter()
                                .zip(&k[p * hd..(p + 1) * hd])
                                .map(|(a, b)| *a as f64 * *b as f64)
                                .sum::<f64>()
                                * sm_scale as f64
                        })
                        .collect();
                    let mnew = s.iter().cloned().fold(st.m, f64::max);
                    let corr = if st.m == f64::NEG_INFINITY {
                        0.0
                    } else {
                        (st.m - mnew).exp()
                    };
                    let e: Vec<f64> = s.iter().map(|x| (x - mnew).exp()).collect();
                    st.l = st.l * corr + e.iter().sum::<f64>();
                    for (d, o) in st.o.iter_mut().enumerate() {
                        let pv: f64 = keys
                            .iter()
                            .zip(&e)
                            .map(|(pos, e)| p.apply(*e) * v[pos * hd + d] as f64)
                            .sum();
                        *o = *o * corr + pv;
                    }
                    st.m = mnew;
                }
            }
            parts.push(State::merge(&warps, hd));
        }
        let all = State::merge(&parts, hd);
        for d in 0..hd {
            out[g * hd + d] = (all.o[d] / all.l) as f32;
        }
    }
    out
}

/// The GPU layer's one relative L2 error ([`crate::gemm::check::rel_l2`]: output under test
/// first, reference second, any non-finite value infinite), used by the attention checks.
pub use crate::gemm::check::rel_l2;

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-scale, scale) (SplitMix64).
    fn vals(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = s;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                ((z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * scale
            })
            .collect()
    }

    #[test]
    fn split_merge_without_rounding_is_the_plain_softmax() {
        // Contexts around chunk and warp edges, partitions that leave some empty.
        for (ctx, z, hd, group) in [
            (1, 1, 64, 1),
            (15, 4, 64, 4),
            (17, 1, 128, 8),
            (64, 64, 128, 4),
            (65, 2, 128, 4),
            (200, 3, 64, 16),
            (1000, 7, 256, 2),
            (4096, 64, 128, 4),
        ] {
            let q = vals(group * hd, 1, 1.0);
            let k = vals(ctx * hd, 2, 1.0);
            let v = vals(ctx * hd, 3, 1.0);
            let sm = 1.0 / (hd as f32).sqrt();
            let want = reference(&q, &k, &v, hd, sm);
            let got = emulate_split_merge(&q, &k, &v, hd, sm, z, POperand::Exact);
            let e = rel_l2(&got, &want);
            assert!(
                e < 1e-6,
                "ctx {ctx} z {z} hd {hd} G {group}: rel L2 {e:.2e}"
            );
        }
    }

    #[test]
    fn bf16_probabilities_stay_within_the_named_tolerance() {
        // Peaked scores (scale 4) make the rounding of P matter most.
        for (ctx, z) in [(100, 2), (4096, 64), (33_000, 64)] {
            let hd = 128;
            let q = vals(4 * hd, 7, 4.0);
            let k = vals(ctx * hd, 8, 1.0);
            let v = vals(ctx * hd, 9, 1.0);
            let sm = 1.0 / (hd as f32).sqrt();
            let want = reference(&q, &k, &v, hd, sm);
            let one = rel_l2(
                &emulate_split_merge(&q, &k, &v, hd, sm, z, POperand::Bf16),
                &want,
            );
            let split = rel_l2(
                &emulate_split_merge(&q, &k, &v, hd, sm, z, POperand::Bf16HiLo),
                &want,
            );
            assert!(one > 0.0, "rounding P must change something (ctx {ctx})");
            assert!(
                one < FLASH_DECODE_REL_L2 / 4.0,
                "ctx {ctx}: rel L2 {one:.2e}"
            );
            // The hi/lo split keeps about 8 more bits of P: its error is far below one
            // rounding's (the whole-model BF16 parity failed with one rounding).
            assert!(
                split < one / 16.0,
                "ctx {ctx}: hi/lo split rel L2 {split:.2e} against one rounding's {one:.2e}"
            );
        }
    }

    #[test]
    fn a_wrong_merge_is_caught() {
        // Summing partition outputs without the e^(mᵢ−M) factors is wrong whenever the
        // partitions' maxima differ; the check must see it.
        let (hd, ctx) = (64, 300);
        let q = vals(hd, 1, 4.0);
        let k = vals(ctx * hd, 2, 1.0);
        let v = vals(ctx * hd, 3, 1.0);
        let sm = 1.0 / (hd as f32).sqrt();
        let want = reference(&q, &k, &v, hd, sm);
        let (_, per, nparts) = split(ctx, 3);
        let mut naive = vec![0f64; hd];
        let mut lsum = 0f64;
        for part in 0..nparts {
            let p0 = part * per * ATT_CHUNK;
            let p1 = ((part + 1) * per * ATT_CHUNK).min(ctx);
            let s: Vec<f64> = (p0..p1)
                .map(|p| {
                    (0..hd)
                        .map(|d| q[d] as f64 * k[p * hd + d] as f64)
                        .sum::<f64>()
                        * sm as f64
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            for (i, p) in (p0..p1).enumerate() {
                let e = (s[i] - m).exp();
                lsum += e;
                for d in 0..hd {
                    naive[d] += e * v[p * hd + d] as f64;
                }
            }
        }
        let naive: Vec<f32> = naive.iter().map(|o| (o / lsum) as f32).collect();
        assert!(rel_l2(&naive, &want) > FLASH_DECODE_REL_L2);
    }

    #[test]
    fn split_matches_the_kernels_partitioning() {
        assert_eq!(split(1, 1), (1, 1, 1));
        assert_eq!(split(4096, 64), (64, 1, 64));
        // 100 positions = 2 chunks over 64 partitions: 2 partitions get one each.
        assert_eq!(split(100, 64), (2, 1, 2));
        // 33,000 positions = 516 chunks over 64 partitions of 9: 58 partitions used.
        assert_eq!(split(33_000, 64), (516, 9, 58));
    }

    #[test]
    fn the_rule_prefers_flash_where_it_is_built_and_falls_back() {
        let optin = 227 * 1024;
        assert_eq!(choose(128, 4, 2, 9, optin, true), DecodeAttn::Flash);
        assert_eq!(choose(64, 16, 1, 8, optin, true), DecodeAttn::Flash);
        assert_eq!(choose(256, 8, 2, 9, optin, true), DecodeAttn::Flash);
        // Disabled (option or failed self-check): the CUDA-core kernel, or none for 256.
        assert_eq!(choose(128, 4, 2, 9, optin, false), DecodeAttn::CudaCores);
        assert_eq!(choose(256, 8, 2, 9, optin, false), DecodeAttn::None);
        // No BF16 mma before sm_80.
        assert_eq!(choose(128, 4, 2, 7, optin, true), DecodeAttn::CudaCores);
        // head_dims it is not built for.
        assert_eq!(choose(96, 4, 2, 9, optin, true), DecodeAttn::CudaCores);
        assert_eq!(choose(32, 4, 2, 9, optin, true), DecodeAttn::CudaCores);
        // More than 16 query heads per KV head.
        assert_eq!(choose(64, 32, 2, 9, optin, true), DecodeAttn::CudaCores);
        assert_eq!(choose(128, 32, 2, 9, optin, true), DecodeAttn::None);
        // Not enough opt-in shared memory (a 48 KiB part) for head_dim 256 BF16.
        assert!(flash_smem_bytes(256, 2) > 48 * 1024);
        assert_eq!(choose(256, 8, 2, 9, 48 * 1024, true), DecodeAttn::None);
        assert_eq!(choose(128, 8, 2, 9, 48 * 1024, true), DecodeAttn::Flash);
    }

    #[test]
    fn shared_memory_follows_the_kernel_layout() {
        // 2 × 64 rows × (128 · 2 + 16) + 16 × 136 × 2 + 512.
        assert_eq!(flash_smem_bytes(128, 2), 34_816 + 4_352 + 512);
        assert_eq!(flash_smem_bytes(128, 1), 18_432 + 4_352 + 512);
        // The staging must hold the [16][head_dim] f32 merge buffer that reuses it.
        for hd in FLASH_HEAD_DIMS {
            for kvb in [1, 2] {
                assert!(2 * ATT_CHUNK * (hd * kvb + 16) >= 16 * hd * 4);
            }
        }
        assert_eq!(flash_kernel_name(true, 256), "rt_attn_flash_fp8_hd256");
        assert_eq!(flash_kernel_name(false, 64), "rt_attn_flash_bf16_hd64");
    }

    #[test]
    fn every_flash_kernel_is_declared() {
        for fp8 in [false, true] {
            for hd in FLASH_HEAD_DIMS {
                let n = flash_kernel_name(fp8, hd);
                assert!(super::super::RUNTIME_KERNELS.contains(&n.as_str()), "{n}");
            }
        }
    }
}
