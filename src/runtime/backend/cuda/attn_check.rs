//! Device checks and timing of the decode-attention kernels ([`super::decode_attn`]): the
//! flash-decoding kernel and the CUDA-core kernel against the CPU reference (and each other) on
//! paged caches with shuffled block tables, BF16 and FP8 KV, several head_dims, group sizes and
//! contexts; and the time of each against the KV bytes it must read.
//!
//! Used at load (one small case: a failure turns the flash kernel off, with a note) and by
//! `rigbench devcheck --only attention` (every case, timed).

use super::attention::{launch_decode_attention, DecodeAttnArgs};
use super::decode_attn::{self, DecodeAttn};
use super::launchers;
use super::{plan, CudaBackend, ATT_THREADS, PART_CAP};
use crate::formats::e4m3;
use crate::gpu::{dim, DevBuf, DevPtr, FlushMethod, L2Flusher, Module};
use crate::runtime::backend::{ForwardBatch, SeqSegment};

/// One decode-attention case: `tokens` decode tokens (one per sequence), sequence `i` at a
/// context of `ctx − (131 i mod ⌈ctx/8⌉)` positions (all within 1/8 of `ctx`, and different
/// wherever the context allows), `kv_heads` KV heads of `group` query heads,
/// `head_dim`, BF16 or FP8 KV, paged in blocks of `block_size` through a shuffled block table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnCase {
    /// head_dim.
    pub head_dim: usize,
    /// Query heads per KV head.
    pub group: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Context of the first sequence (positions attended, including the new token's).
    pub ctx: usize,
    /// Decode tokens (sequences) in the batch.
    pub tokens: usize,
    /// FP8 E4M3 KV (scales 0.02 for K and 0.015 for V) instead of BF16.
    pub fp8: bool,
    /// Tokens per KV block.
    pub block_size: usize,
}

impl AttnCase {
    /// Context of sequence `i`.
    pub fn ctx_of(&self, i: usize) -> usize {
        let spread = self.ctx.div_ceil(8).max(1);
        (self.ctx - (131 * i) % spread).max(1)
    }
    /// KV bytes the step must read (K and V of every attended position).
    pub fn kv_bytes(&self) -> u64 {
        let elem = if self.fp8 { 1 } else { 2 };
        (0..self.tokens)
            .map(|i| (self.ctx_of(i) * self.kv_heads * self.head_dim * elem * 2) as u64)
            .sum()
    }
    /// A short label: `hd128 G4 kv8 ctx4096 b1 BF16`.
    pub fn label(&self) -> String {
        format!(
            "hd{} G{} kv{} ctx{} b{} {}",
            self.head_dim,
            self.group,
            self.kv_heads,
            self.ctx,
            self.tokens,
            if self.fp8 { "FP8" } else { "BF16" }
        )
    }
}

/// The outcome of one [`AttnCase`] for one kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelOutcome {
    /// The kernel (`flash` or `cuda-cores`).
    pub kernel: &'static str,
    /// rel L2 error of its BF16 output against the CPU reference.
    pub rel_l2: f64,
    /// Median time of the attention launches (partitions + merge) over the timed runs, each
    /// after L2 was evicted, seconds (`None` when not timed).
    pub seconds: Option<f64>,
}

/// The outcomes of one case.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseOutcome {
    /// The case.
    pub case: AttnCase,
    /// Partitions the plan chose (grid z).
    pub parts: usize,
    /// The flash kernel, when [`decode_attn::choose`] allows it for the case.
    pub flash: Option<KernelOutcome>,
    /// The CUDA-core kernel, when it covers the case (head_dim ≤ 128).
    pub cuda_cores: Option<KernelOutcome>,
    /// rel L2 difference of the two kernels' outputs, when both ran.
    pub flash_vs_cuda_cores: Option<f64>,
}

impl CaseOutcome {
    /// Whether every kernel that ran is within [`decode_attn::FLASH_DECODE_REL_L2`] of the
    /// reference and, where both ran, within [`decode_attn::FLASH_VS_CUDA_CORES_REL_L2`] of
    /// each other.
    pub fn pass(&self) -> bool {
        [&self.flash, &self.cuda_cores]
            .iter()
            .filter_map(|k| k.as_ref())
            .all(|k| k.rel_l2 <= decode_attn::FLASH_DECODE_REL_L2)
            && (self.flash.is_some() || self.cuda_cores.is_some())
            && self
                .flash_vs_cuda_cores
                .is_none_or(|d| d <= decode_attn::FLASH_VS_CUDA_CORES_REL_L2)
    }
}

/// Deterministic values in [-scale, scale) (SplitMix64 from `seed`).
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

/// A permutation of `0..n` (a fixed stride walk; `n` and the stride coprime), so consecutive
/// positions of a sequence land in scattered blocks.
fn shuffled_blocks(n: usize) -> Vec<u32> {
    if n <= 2 {
        return (0..n as u32).collect();
    }
    // A stride coprime with n that is not 0 or 1 (mod n): a permutation in which no block
    // follows its neighbour (stride 1, the identity, was what 7919 % 7919 gave before).
    let mut stride = (7919 % n).max(2);
    while gcd(stride, n) != 1 {
        stride += 1; // ends at n - 1 at the latest, coprime with n
    }
    (0..n).map(|i| ((i * stride + 3) % n) as u32).collect()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

const K_SCALE: f32 = 0.02;
const V_SCALE: f32 = 0.015;

/// Run `case` on the device: each kernel that covers it once for correctness, then (with
/// `timed_runs > 0`) that many timed runs, each after `flush` evicts L2 (by reading a buffer
/// twice its size, so no dirty line's write-back lands in the timed kernel; the module is
/// kernels/util.cu's).
///
/// # Errors
/// A device failure.
pub fn run_case(
    b: &CudaBackend,
    case: AttnCase,
    timed_runs: usize,
    flush: Option<(&L2Flusher, &Module)>,
) -> anyhow::Result<CaseOutcome> {
    let gpu = &b.gpu;
    let (hd, g, nkv, bs) = (case.head_dim, case.group, case.kv_heads, case.block_size);
    let nh = g * nkv;
    // Blocks per sequence, all sequences' blocks shuffled over one pool.
    let (tables, nblocks) = block_tables(&case);
    // Host values: q [tokens][nh][hd] BF16; the cache [nblocks + 1][nkv][bs][hd].
    let q = crate::formats::from_bf16_bits(&crate::formats::to_bf16_bits(&vals(
        case.tokens * nh * hd,
        21,
        2.0,
    )));
    let region = (nblocks + 1) * nkv * bs * hd;
    let (k_host, v_host, k_dev, v_dev) = kv_cache_values(gpu, &case, region)?;
    let q_dev = gpu.upload(&crate::formats::to_bf16_bits(&q))?;
    let (ks, vs) = if case.fp8 {
        (K_SCALE, V_SCALE)
    } else {
        (1.0, 1.0)
    };
    // The CPU reference per (token, query head).
    let sm_scale = 1.0 / (hd as f32).sqrt();
    let want = reference_outputs(&case, &tables, &q, (&k_host, &v_host), sm_scale);
    let p = decode_plan(gpu, &case, &tables, nblocks)?;
    let meta = gpu.upload(&p.image)?;
    let part_ml = gpu.alloc(PART_CAP * nh * 2 * 4)?;
    let part_o = gpu.alloc(PART_CAP * nh * hd * 4)?;
    let out = gpu.alloc(case.tokens * nh * hd * 2)?;
    let at = |off: usize| meta.ptr() + (off * 4) as u64;
    let l = p.layout;
    let kernels = kernels_for(b, &case)?;
    let launch = |kernel: DecodeAttn, threads: u32, smem: u32| -> anyhow::Result<()> {
        launch_decode_attention(
            &b.rt,
            gpu,
            kernel,
            case.fp8,
            (
                dim("p.dec_tokens", p.dec_tokens)?,
                dim("nkv", nkv)?,
                dim("p.att_parts", p.att_parts)?,
            ),
            (threads, 1, 1),
            smem,
            &DecodeAttnArgs {
                tok_list: DevPtr::at(at(l.dec_tok)),
                q: DevPtr::at(q_dev.ptr()),
                tok_seq: DevPtr::at(at(l.tok_seq)),
                pos: DevPtr::at(at(l.pos)),
                block_tables: DevPtr::at(at(l.block_tables)),
                bt_stride: DevPtr::at(meta.ptr()),
                k_cache: k_dev.ptr(),
                v_cache: v_dev.ptr(),
                k_scale: ks,
                v_scale: vs,
                nh,
                nkv,
                hd,
                block_size: bs,
                sm_scale,
                out: DevPtr::at(out.ptr()),
                part_ml: DevPtr::at(part_ml.ptr()),
                part_o: DevPtr::at(part_o.ptr()),
            },
        )?;
        if p.att_parts > 1 {
            launchers::rt::rt_attn_combine(
                &b.rt,
                gpu,
                (dim("p.dec_tokens", p.dec_tokens)?, dim("nh", nh)?, 1),
                (dim("hd.clamp(32, 256)", hd.clamp(32, 256))?, 1, 1),
                0,
                DevPtr::at(at(l.dec_tok)),
                DevPtr::at(at(l.pos)),
                nh,
                hd,
                p.att_parts,
                &part_ml,
                &part_o,
                &out,
            )?;
        }
        Ok(())
    };
    let mut outcome = CaseOutcome {
        case,
        parts: p.att_parts,
        flash: None,
        cuda_cores: None,
        flash_vs_cuda_cores: None,
    };
    let mut outputs: Vec<Vec<f32>> = Vec::new();
    for (kernel, kind, threads, smem) in &kernels {
        // A stale output must not pass: fill it with NaN (0xFFFF) first.
        gpu.memset(&out, 0xFF)?;
        launch(*kind, *threads, *smem)?;
        let got: Vec<u16> = gpu.download(&out, 0, case.tokens * nh * hd)?;
        let got = crate::formats::from_bf16_bits(&got);
        let rel = decode_attn::rel_l2(&got, &want);
        let seconds = median_seconds(gpu, timed_runs, flush, || launch(*kind, *threads, *smem))?;
        let k = KernelOutcome {
            kernel,
            rel_l2: rel,
            seconds,
        };
        if *kernel == "flash" {
            outcome.flash = Some(k);
        } else {
            outcome.cuda_cores = Some(k);
        }
        outputs.push(got);
    }
    if outputs.len() == 2 {
        outcome.flash_vs_cuda_cores = Some(decode_attn::rel_l2(&outputs[0], &outputs[1]));
    }
    gpu.sync()?;
    Ok(outcome)
}

/// Each sequence's block table (blocks for its context, all sequences' blocks shuffled over
/// one pool), and the pool's size in blocks.
fn block_tables(case: &AttnCase) -> (Vec<Vec<u32>>, usize) {
    let bs = case.block_size;
    let need: Vec<usize> = (0..case.tokens)
        .map(|i| case.ctx_of(i).div_ceil(bs))
        .collect();
    let nblocks: usize = need.iter().sum();
    let perm = shuffled_blocks(nblocks);
    let mut tables = Vec::with_capacity(case.tokens);
    let mut next = 0;
    for n in &need {
        tables.push(perm[next..next + n].to_vec());
        next += n;
    }
    (tables, nblocks)
}

/// The K and V caches (`region` values each): as the host reads them (FP8 decoded with their
/// scales, or BF16-rounded) and uploaded in the case's storage format.
fn kv_cache_values(
    gpu: &crate::gpu::Gpu,
    case: &AttnCase,
    region: usize,
) -> anyhow::Result<(Vec<f32>, Vec<f32>, DevBuf, DevBuf)> {
    let (kf, vf) = (vals(region, 22, 1.0), vals(region, 23, 1.0));
    let (k_host, v_host, k_dev, v_dev): (Vec<f32>, Vec<f32>, DevBuf, DevBuf) = if case.fp8 {
        let enc =
            |x: &[f32], s: f32| -> Vec<u8> { x.iter().map(|v| e4m3::encode(v / s)).collect() };
        let (kb, vb) = (enc(&kf, K_SCALE), enc(&vf, V_SCALE));
        let dec =
            |x: &[u8], s: f32| -> Vec<f32> { x.iter().map(|b| e4m3::decode(*b) * s).collect() };
        (
            dec(&kb, K_SCALE),
            dec(&vb, V_SCALE),
            gpu.upload(&kb)?,
            gpu.upload(&vb)?,
        )
    } else {
        let (kb, vb) = (
            crate::formats::to_bf16_bits(&kf),
            crate::formats::to_bf16_bits(&vf),
        );
        (
            crate::formats::from_bf16_bits(&kb),
            crate::formats::from_bf16_bits(&vb),
            gpu.upload(&kb)?,
            gpu.upload(&vb)?,
        )
    };
    Ok((k_host, v_host, k_dev, v_dev))
}

/// The CPU reference of every (token, query head): each KV head's group of queries over the
/// K/V rows its block table gathers from the host caches.
fn reference_outputs(
    case: &AttnCase,
    tables: &[Vec<u32>],
    q: &[f32],
    (k_host, v_host): (&[f32], &[f32]),
    sm_scale: f32,
) -> Vec<f32> {
    let (hd, g, nkv, bs) = (case.head_dim, case.group, case.kv_heads, case.block_size);
    let nh = g * nkv;
    let mut want = vec![0f32; case.tokens * nh * hd];
    for (t, table) in tables.iter().enumerate() {
        let ctx = case.ctx_of(t);
        for kvh in 0..nkv {
            let rows = |src: &[f32]| -> Vec<f32> {
                let mut out = Vec::with_capacity(ctx * hd);
                for p in 0..ctx {
                    let blk = table[p / bs] as usize;
                    let base = ((blk * nkv + kvh) * bs + p % bs) * hd;
                    out.extend_from_slice(&src[base..base + hd]);
                }
                out
            };
            let qs = &q[(t * nh + kvh * g) * hd..(t * nh + (kvh + 1) * g) * hd];
            let o = decode_attn::reference(qs, &rows(k_host), &rows(v_host), hd, sm_scale);
            want[(t * nh + kvh * g) * hd..(t * nh + (kvh + 1) * g) * hd].copy_from_slice(&o);
        }
    }
    want
}

/// The runtime's plan of the case: one decode segment per sequence, all sent to the decode
/// kernel.
fn decode_plan(
    gpu: &crate::gpu::Gpu,
    case: &AttnCase,
    tables: &[Vec<u32>],
    nblocks: usize,
) -> anyhow::Result<plan::Plan> {
    let mut seqs = Vec::with_capacity(case.tokens);
    for (t, table) in tables.iter().enumerate() {
        seqs.push(SeqSegment {
            start: t,
            len: 1,
            first_pos: case.ctx_of(t) - 1,
            block_table: table.clone(),
            num_logits: 1,
            state_slot: t as u32,
        });
    }
    let batch = ForwardBatch {
        token_ids: vec![0; case.tokens],
        seqs,
    };
    let env = plan::PlanEnv {
        block_size: case.block_size,
        num_blocks: nblocks,
        vocab: 1,
        kv_heads: case.kv_heads,
        sm_count: gpu.sm_count as usize,
        part_cap: PART_CAP,
        tc_prefill: false,
    };
    let p = plan::plan(&batch, &env, None)?;
    anyhow::ensure!(
        p.dec_tokens == case.tokens,
        "the plan sent {} of {} tokens to the decode kernel",
        p.dec_tokens,
        case.tokens
    );
    Ok(p)
}

/// The decode-attention kernels that cover the case, with their threads and dynamic shared
/// memory: flash (when [`decode_attn::choose`] takes it; its shared-memory limit raised above
/// 48 KiB) and the CUDA-core kernel (head_dim and group within its limits).
fn kernels_for(
    b: &CudaBackend,
    case: &AttnCase,
) -> anyhow::Result<Vec<(&'static str, DecodeAttn, u32, u32)>> {
    let gpu = &b.gpu;
    let (hd, g) = (case.head_dim, case.group);
    let elem = if case.fp8 { 1 } else { 2 };
    let group_ok = g * hd <= 2048;
    let kernels: Vec<(&'static str, DecodeAttn, u32, u32)> = {
        let mut v = Vec::new();
        if decode_attn::choose(hd, g, elem, gpu.cc.major, gpu.max_smem_optin, true)
            == DecodeAttn::Flash
        {
            let smem = decode_attn::flash_smem_bytes(hd, elem);
            let name = decode_attn::flash_kernel_name(case.fp8, hd);
            if smem > 48 << 10 {
                b.rt.set_max_dynamic_smem(&name, smem)?;
            }
            v.push(("flash", DecodeAttn::Flash, decode_attn::FLASH_THREADS, smem));
        }
        if hd <= decode_attn::CUDA_CORE_MAX_HEAD_DIM && group_ok {
            v.push(("cuda-cores", DecodeAttn::CudaCores, ATT_THREADS, 0));
        }
        v
    };
    Ok(kernels)
}

/// With `timed_runs > 0`: the median time of that many runs of `launch`, each after `flush`
/// evicts L2 (`None` otherwise).
fn median_seconds(
    gpu: &crate::gpu::Gpu,
    timed_runs: usize,
    flush: Option<(&L2Flusher, &Module)>,
    launch: impl Fn() -> anyhow::Result<()>,
) -> anyhow::Result<Option<f64>> {
    let mut seconds = None;
    if timed_runs > 0 {
        let timer = gpu.timer()?;
        let mut times = Vec::with_capacity(timed_runs);
        for _ in 0..timed_runs {
            if let Some((f, util)) = flush {
                f.flush(gpu, util)?;
            }
            timer.start(gpu)?;
            launch()?;
            times.push(timer.stop(gpu)?);
        }
        times.sort_by(|a, b| a.total_cmp(b));
        seconds = Some(times[times.len() / 2]);
    }
    Ok(seconds)
}

/// The cases `devcheck --only attention` runs: every head_dim of the flash kernel with BF16 and
/// FP8 KV at short, chunk-edge and long contexts (Qwen3-8B's attention shape, 32 query heads
/// over 8 KV heads, at head_dim 128), batch 1 and 32, and group sizes 1, 8 and 16.
pub fn devcheck_cases() -> Vec<AttnCase> {
    let mut v = Vec::new();
    for fp8 in [false, true] {
        for (hd, g, nkv) in [(64, 8, 4), (128, 4, 8), (256, 4, 4)] {
            for (ctx, tokens) in [(1, 1), (130, 1), (4096, 1), (32_768, 1), (1024, 32)] {
                v.push(AttnCase {
                    head_dim: hd,
                    group: g,
                    kv_heads: nkv,
                    ctx,
                    tokens,
                    fp8,
                    block_size: 16,
                });
            }
        }
        for g in [1, 16] {
            v.push(AttnCase {
                head_dim: 128,
                group: g,
                kv_heads: 2,
                ctx: 777,
                tokens: 3,
                fp8,
                block_size: 32,
            });
        }
        // Batch 32 at 4k contexts (the issue's batch-32 attention target).
        v.push(AttnCase {
            head_dim: 128,
            group: 4,
            kv_heads: 8,
            ctx: 4096,
            tokens: 32,
            fp8,
            block_size: 16,
        });
    }
    v
}

impl CudaBackend {
    /// The flash kernel's check at load: one paged case at this model's head_dim and group
    /// (2 KV heads, 300 positions over several partitions, two sequences) with BF16 and with
    /// FP8 KV, against the CPU reference. `Ok(None)` when within
    /// [`decode_attn::FLASH_DECODE_REL_L2`] (or the flash kernel does not apply), else the reason.
    ///
    /// # Errors
    /// A device failure.
    pub fn flash_decode_self_check(&self) -> anyhow::Result<Option<String>> {
        let c = &self.config;
        let g = c.num_heads / c.num_kv_heads.max(1);
        for fp8 in [false, true] {
            let case = AttnCase {
                head_dim: c.head_dim,
                group: g,
                kv_heads: 2,
                ctx: 300,
                tokens: 2,
                fp8,
                block_size: 16,
            };
            let elem = if fp8 { 1 } else { 2 };
            if decode_attn::choose(
                c.head_dim,
                g,
                elem,
                self.gpu.cc.major,
                self.gpu.max_smem_optin,
                true,
            ) != DecodeAttn::Flash
            {
                return Ok(None);
            }
            let o = run_case(self, case, 0, None)?;
            if let Some(f) = &o.flash {
                if f.rel_l2 > decode_attn::FLASH_DECODE_REL_L2 {
                    return Ok(Some(format!(
                        "{}: rel L2 {:.2e} > {:.0e}",
                        case.label(),
                        f.rel_l2,
                        decode_attn::FLASH_DECODE_REL_L2
                    )));
                }
            }
        }
        Ok(None)
    }

    /// [`run_case`] for each of `cases` on this backend's GPU, timing each kernel `timed_runs`
    /// times, L2 evicted before each by reading a buffer of twice its size
    /// ([`FlushMethod::Read`]).
    ///
    /// # Errors
    /// A device failure, NVRTC failing on kernels/util.cu (a case's own failure is its
    /// outcome).
    pub fn check_decode_attention(
        &self,
        cases: &[AttnCase],
        timed_runs: usize,
    ) -> anyhow::Result<Vec<anyhow::Result<CaseOutcome>>> {
        let flush = if timed_runs > 0 {
            let util = self.gpu.compile(
                "util",
                crate::gpu::util_kernels::SRC,
                crate::gpu::util_kernels::KERNELS,
            )?;
            Some((L2Flusher::new(&self.gpu, FlushMethod::Read)?, util))
        } else {
            None
        };
        Ok(cases
            .iter()
            .map(|c| run_case(self, *c, timed_runs, flush.as_ref().map(|(f, u)| (f, u))))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_case_passes_only_with_both_kernels_near_the_reference_and_each_other() {
        let k = |kernel, rel_l2| {
            Some(KernelOutcome {
                kernel,
                rel_l2,
                seconds: None,
            })
        };
        let case = devcheck_cases()[0];
        // The H200's figures (docs/runtime.md, "Decode attention"): the hi/lo kernel passes.
        let hi_lo = CaseOutcome {
            case,
            parts: 64,
            flash: k("flash", 1.69e-3),
            cuda_cores: k("cuda-cores", 1.69e-3),
            flash_vs_cuda_cores: Some(1.5e-4),
        };
        assert!(hi_lo.pass());
        // The kernel that rounded P to BF16 once: near enough to the reference, but 2.35e-3
        // from the CUDA-core kernel: caught.
        let one_rounding = CaseOutcome {
            flash: k("flash", 2.23e-3),
            flash_vs_cuda_cores: Some(2.35e-3),
            ..hi_lo.clone()
        };
        assert!(!one_rounding.pass());
        // Far from the reference; nothing ran.
        assert!(!CaseOutcome {
            flash: k("flash", 2e-2),
            flash_vs_cuda_cores: None,
            cuda_cores: None,
            ..hi_lo.clone()
        }
        .pass());
        assert!(!CaseOutcome {
            flash: None,
            cuda_cores: None,
            flash_vs_cuda_cores: None,
            ..hi_lo
        }
        .pass());
    }

    #[test]
    fn shuffled_blocks_are_a_permutation_and_scatter() {
        for n in [1usize, 2, 7, 64, 7919, 7920, 2048] {
            let p = shuffled_blocks(n);
            let mut s = p.clone();
            s.sort_unstable();
            assert_eq!(s, (0..n as u32).collect::<Vec<_>>(), "n {n}");
            if n > 8 {
                // Not the identity: neighbours rarely stay neighbours.
                let adjacent = p.windows(2).filter(|w| w[1] == w[0] + 1).count();
                assert!(adjacent < n / 2, "n {n}: {adjacent} adjacent");
            }
        }
    }

    #[test]
    fn case_contexts_and_bytes() {
        let c = AttnCase {
            head_dim: 128,
            group: 4,
            kv_heads: 8,
            ctx: 4096,
            tokens: 1,
            fp8: false,
            block_size: 16,
        };
        // Qwen3-8B, one layer at 4k: 4096 × 8 × 128 × 2 bytes × (K, V) = 16.8 MB.
        assert_eq!(c.kv_bytes(), 16_777_216);
        let c3 = AttnCase {
            tokens: 3,
            fp8: true,
            ..c
        };
        // Spread 512: 4096, 4096 − 131, 4096 − 262.
        assert_eq!(c3.ctx_of(0), 4096);
        assert_eq!(c3.ctx_of(2), 3834);
        assert_eq!(c3.kv_bytes(), ((4096 + 3965 + 3834) * 8 * 128 * 2) as u64);
        let one = AttnCase {
            ctx: 1,
            tokens: 4,
            ..c
        };
        assert!((0..4).all(|i| one.ctx_of(i) == 1));
        assert_eq!(c.label(), "hd128 G4 kv8 ctx4096 b1 BF16");
    }

    #[test]
    fn devcheck_cases_cover_the_issue_shapes() {
        let v = devcheck_cases();
        for hd in decode_attn::FLASH_HEAD_DIMS {
            for fp8 in [false, true] {
                assert!(v
                    .iter()
                    .any(|c| c.head_dim == hd && c.fp8 == fp8 && c.ctx >= 32_768));
            }
        }
        assert!(v.iter().any(|c| c.tokens == 32 && c.ctx == 4096));
        assert!(v.iter().any(|c| c.group == 16));
        // Every case fits the partial buffer's token count.
        assert!(v.iter().all(|c| c.tokens <= PART_CAP));
    }
}
