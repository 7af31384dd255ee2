//! The CUDA backend driven from outside, against the CPU reference, before any end-to-end timing
//! ("correct before fast"), and its device-side speed:
//!
//! - [`greedy_parity`]: a whole model on both backends (CPU with
//!   [`CpuBackend::with_gpu_rounding`]): greedy tokens for `n` steps on a set of prompts, and the
//!   logits' agreement under a named tolerance;
//! - [`decode_speed`]: decode and prefill throughput through the backend directly (no HTTP).
//!
//! The backend's checks of its own kernels (prefill against decode attention, synthesis and
//! quantization against the CPU) need its internals and live with it
//! (`crate::runtime::backend::cuda::self_check`).

use std::time::Instant;

use crate::runtime::backend::cpu::CpuBackend;
use crate::runtime::backend::cuda::{
    CudaBackend, CudaLoadSpec, CudaOptions, RowSampling, WeightSource,
};
use crate::runtime::backend::{Backend, ForwardBatch, KvCacheSpec, SeqSegment};
use crate::runtime::config::{KvCacheDtype, ModelConfig, WeightFormat};
use crate::runtime::sampler::argmax;
use crate::runtime::weights::{self, ModelWeights};

/// Named tolerances of the parity check, per weight format. The logits are compared row by row
/// (teacher-forced on the CPU reference's greedy tokens) by rel L2 error; BF16 and W4A16 round at
/// the same points on both backends, so their differences come from FP32 summation order and the
/// BF16 roundings it flips (unit roundoff 2⁻⁸ ≈ 3.9e-3; the bound allows five of them); FP8's
/// per-token E4M3 activation codes (unit roundoff 2⁻⁴) flip with those differences, so FP8 gets
/// a mean bound and a top-1 agreement floor instead of exact greedy equality.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParityTolerance {
    /// Largest rel L2 error of any logits row.
    pub max_rel_l2: f64,
    /// Largest mean rel L2 error over the rows.
    pub mean_rel_l2: f64,
    /// Smallest fraction of steps whose argmax equals the reference token; a disagreement
    /// where the reference's own top-2 margin is below `tie_margin` is a near-tie and counted
    /// apart.
    pub min_top1: f64,
    /// Top-2 margin (logit units) below which the reference's choice is a near-tie.
    pub tie_margin: f64,
}

/// `PARITY_BF16`: greedy tokens equal (up to near-ties), every logits row within 2e-2 rel L2.
pub const PARITY_BF16: ParityTolerance = ParityTolerance {
    max_rel_l2: 2e-2,
    mean_rel_l2: 5e-3,
    min_top1: 1.0,
    tie_margin: 0.05,
};
/// `PARITY_W4A16`: as BF16 (identical dequantized weights, same rounding points).
pub const PARITY_W4A16: ParityTolerance = PARITY_BF16;
/// `PARITY_FP8`: mean rel L2 within 5e-2 of the CPU's own FP8 path, 95% top-1 agreement.
pub const PARITY_FP8: ParityTolerance = ParityTolerance {
    max_rel_l2: 2.5e-1,
    mean_rel_l2: 5e-2,
    min_top1: 0.95,
    tie_margin: 0.05,
};

/// Greedy tokens per prompt and the logit rows in the order they were produced.
pub type GreedyOutput = (Vec<Vec<u32>>, Vec<Vec<f32>>);

/// Greedy tokens and logits of one backend over `prompts`: each prompt prefilled alone, then
/// `steps` decode steps with all sequences batched. Blocks are assigned sequentially.
///
/// # Errors
/// A backend failure.
pub fn greedy_run(
    be: &mut dyn Backend,
    prompts: &[Vec<u32>],
    steps: usize,
    block_size: usize,
) -> anyhow::Result<GreedyOutput> {
    forced_run(be, prompts, steps, block_size, None)
}

/// [`greedy_run`], but the token fed back after step `s` of prompt `i` is `forced[i][s]`
/// (teacher forcing) when given; the returned tokens are still this backend's argmax.
///
/// # Errors
/// A backend failure, or `forced` shorter than `steps`.
pub fn forced_run(
    be: &mut dyn Backend,
    prompts: &[Vec<u32>],
    steps: usize,
    block_size: usize,
    forced: Option<&[Vec<u32>]>,
) -> anyhow::Result<GreedyOutput> {
    if let Some(f) = forced {
        anyhow::ensure!(
            f.len() == prompts.len() && f.iter().all(|t| t.len() >= steps),
            "forced tokens do not cover {steps} steps of {} prompts",
            prompts.len()
        );
    }
    let pick = |i: usize, step: usize, argmax_tok: u32| -> u32 {
        forced.map_or(argmax_tok, |f| f[i][step])
    };
    let mut next_block = 0u32;
    let mut tables: Vec<Vec<u32>> = Vec::new();
    let mut seqs: Vec<Vec<u32>> = prompts.to_vec();
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut logits: Vec<Vec<f32>> = Vec::new();
    let need = |len: usize| len.div_ceil(block_size);
    for (i, p) in prompts.iter().enumerate() {
        let mut bt = Vec::new();
        while bt.len() < need(p.len() + steps + 1) {
            bt.push(next_block);
            next_block += 1;
        }
        tables.push(bt.clone());
        let batch = ForwardBatch {
            token_ids: p.clone(),
            seqs: vec![SeqSegment {
                start: 0,
                len: p.len(),
                first_pos: 0,
                block_table: bt,
                num_logits: 1,
                state_slot: i as u32,
            }],
        };
        let l = be.forward(&batch)?;
        let t = argmax(l.row(0));
        logits.push(l.row(0).to_vec());
        out[i].push(t);
        seqs[i].push(pick(i, 0, t));
    }
    for step in 1..steps {
        let mut batch = ForwardBatch::default();
        for (i, s) in seqs.iter().enumerate() {
            batch.seqs.push(SeqSegment {
                start: i,
                len: 1,
                first_pos: s.len() - 1,
                block_table: tables[i].clone(),
                num_logits: 1,
                state_slot: i as u32,
            });
            batch.token_ids.push(*s.last().unwrap_or(&0));
        }
        let l = be.forward(&batch)?;
        for i in 0..seqs.len() {
            let t = argmax(l.row(i));
            logits.push(l.row(i).to_vec());
            out[i].push(t);
            seqs[i].push(pick(i, step, t));
        }
    }
    Ok((out, logits))
}

/// Seeded prompts of 12..=44 token ids below `vocab`.
pub fn prompts(n: usize, vocab: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = weights::SplitMix64::new(seed);
    (0..n)
        .map(|i| {
            let len = 12 + (i * 11) % 33;
            (0..len)
                .map(|_| (rng.next_u64() % vocab.min(256) as u64) as u32)
                .collect()
        })
        .collect()
}

/// The outcome of [`greedy_parity`].
#[derive(Debug, Clone, PartialEq)]
pub struct Parity {
    /// Weight format.
    pub format: WeightFormat,
    /// Steps compared (prompts × steps).
    pub tokens: usize,
    /// Steps whose argmax equals the reference's greedy token (teacher-forced).
    pub top1_equal: usize,
    /// Disagreements at near-ties (reference top-2 margin below the tolerance's `tie_margin`).
    pub near_ties: usize,
    /// Whether the free-running greedy sequences are identical.
    pub greedy_identical: bool,
    /// Largest rel L2 error of a logits row.
    pub max_rel_l2: f64,
    /// Mean rel L2 error over the rows.
    pub mean_rel_l2: f64,
    /// Largest |Δ logit|.
    pub max_abs: f64,
    /// The tolerance applied.
    pub tol: ParityTolerance,
}

impl Parity {
    /// Within the tolerance.
    pub fn pass(&self) -> bool {
        let agree = (self.top1_equal + self.near_ties) as f64 / self.tokens.max(1) as f64;
        agree >= self.tol.min_top1
            && self.max_rel_l2 <= self.tol.max_rel_l2
            && self.mean_rel_l2 <= self.tol.mean_rel_l2
    }
}

fn margin(row: &[f32]) -> f64 {
    let mut a = f32::NEG_INFINITY;
    let mut b = f32::NEG_INFINITY;
    for v in row {
        if *v > a {
            b = a;
            a = *v;
        } else if *v > b {
            b = *v;
        }
    }
    (a - b) as f64
}

/// Compare `test` with the reference run `reference` (logit rows in the same order; `tokens`
/// are the reference's greedy tokens), under `tol`.
pub fn compare_runs(
    format: WeightFormat,
    reference: &GreedyOutput,
    test_forced: &GreedyOutput,
    test_free: Option<&GreedyOutput>,
    tol: ParityTolerance,
) -> Parity {
    let (rt, rl) = reference;
    let (tt, tl) = test_forced;
    let n_prompts = rt.len();
    let steps = rt.first().map_or(0, |v| v.len());
    let (mut eq, mut ties) = (0, 0);
    for step in 0..steps {
        for i in 0..n_prompts {
            let row = if step == 0 { i } else { n_prompts * step + i };
            if tt[i][step] == rt[i][step] {
                eq += 1;
            } else if margin(&rl[row]) < tol.tie_margin {
                ties += 1;
            }
        }
    }
    let (mut max_rel, mut sum_rel, mut max_abs) = (0f64, 0f64, 0f64);
    for (a, b) in rl.iter().zip(tl) {
        let e = crate::gemm::check::rel_l2(b, a);
        max_rel = max_rel.max(e);
        sum_rel += e;
        for (x, y) in a.iter().zip(b) {
            max_abs = max_abs.max((x - y).abs() as f64);
        }
    }
    Parity {
        format,
        tokens: n_prompts * steps,
        top1_equal: eq,
        near_ties: ties,
        greedy_identical: test_free.is_some_and(|f| f.0 == *rt),
        max_rel_l2: max_rel,
        mean_rel_l2: sum_rel / rl.len().max(1) as f64,
        max_abs,
        tol,
    }
}

/// Parity of the CUDA backend against the CPU backend (with GPU rounding) on identical weights
/// (`weights`, quantized on the CPU to `format` and uploaded as they are): the CPU's greedy
/// tokens, the GPU teacher-forced on them (argmax agreement, logits error), and the GPU
/// free-running (identical greedy sequences or not).
///
/// # Errors
/// A backend failure.
pub fn greedy_parity(
    device: usize,
    weights: &ModelWeights,
    format: WeightFormat,
    kv_dtype: KvCacheDtype,
    n_prompts: usize,
    steps: usize,
) -> anyhow::Result<Parity> {
    greedy_parity_with(
        device,
        weights,
        format,
        kv_dtype,
        (n_prompts, steps),
        CudaOptions::default(),
    )
}

/// [`greedy_parity`] with the CUDA backend's options `opts` (e.g. the flash-decoding kernel off,
/// to tell its share of a difference from the rest of the model's).
///
/// # Errors
/// As [`greedy_parity`].
pub fn greedy_parity_with(
    device: usize,
    weights: &ModelWeights,
    format: WeightFormat,
    kv_dtype: KvCacheDtype,
    (n_prompts, steps): (usize, usize),
    opts: CudaOptions,
) -> anyhow::Result<Parity> {
    let mut w = weights.clone();
    w.quantize(format)?;
    // Bisecting an FP8 gap: the groups named in RIGBENCH_HYBRID_FP8_KEEP_BF16 stay BF16 on
    // both backends (`fp8_bisect`).
    super::fp8_bisect::KeepBf16::from_env()?.apply(&mut w, weights)?;
    let c = w.config.clone();
    let bs = 16;
    let ps = prompts(n_prompts, c.vocab_size, 7);
    let blocks: usize = ps.iter().map(|p| (p.len() + steps + 1).div_ceil(bs)).sum();
    let kv = KvCacheSpec {
        num_blocks: blocks + 1,
        block_size: bs,
        dtype: kv_dtype,
    };
    let mut cpu = CpuBackend::new(w.clone(), 4).with_gpu_rounding(true);
    cpu.init_kv_cache(kv)?;
    cpu.init_state_slots(n_prompts)?;
    let reference = greedy_run(&mut cpu, &ps, steps, bs)?;
    let mut gpu = CudaBackend::load_with(
        CudaLoadSpec {
            device,
            weights: WeightSource::Host(Box::new(w)),
            quantize: None,
            max_num_batched_tokens: 256,
            max_num_seqs: n_prompts.max(1),
            max_model_len: 1024,
            kv_dtype,
            block_size: bs,
        },
        opts,
    )?;
    gpu.init_kv_cache(kv)?;
    gpu.init_state_slots(n_prompts)?;
    let forced = forced_run(&mut gpu, &ps, steps, bs, Some(&reference.0))?;
    gpu.init_kv_cache(kv)?;
    let free = greedy_run(&mut gpu, &ps, steps, bs)?;
    let tol = match format {
        WeightFormat::Bf16 => PARITY_BF16,
        WeightFormat::Fp8 => PARITY_FP8,
        WeightFormat::Nvfp4 => PARITY_W4A16,
    };
    Ok(compare_runs(format, &reference, &forced, Some(&free), tol))
}

/// How far the CPU backend's own logits move when the BF16 roundings at the CUDA backend's
/// rounding points are left out ([`CpuBackend::with_gpu_rounding`] on for the reference, off for
/// the run compared): a perturbation of each rounded activation below one BF16 unit roundoff
/// (2⁻⁹ relative), the kind of difference FP32 summation order makes between the two backends,
/// everywhere instead of at a few flipped roundings. It measures, on the CPU alone, how much a
/// model's quantized path amplifies such differences (FP8's per-token E4M3 activation codes flip
/// with them), so a GPU parity figure can be read against the model's own sensitivity. Same
/// prompts, teacher forcing and metrics as [`greedy_parity`], under `tol`.
///
/// # Errors
/// A backend failure.
pub fn cpu_rounding_parity(
    weights: &ModelWeights,
    format: WeightFormat,
    n_prompts: usize,
    steps: usize,
    tol: ParityTolerance,
) -> anyhow::Result<Parity> {
    let mut w = weights.clone();
    w.quantize(format)?;
    super::fp8_bisect::KeepBf16::from_env()?.apply(&mut w, weights)?;
    let c = w.config.clone();
    let bs = 16;
    let ps = prompts(n_prompts, c.vocab_size, 7);
    let blocks: usize = ps.iter().map(|p| (p.len() + steps + 1).div_ceil(bs)).sum();
    let kv = KvCacheSpec {
        num_blocks: blocks + 1,
        block_size: bs,
        dtype: KvCacheDtype::Bf16,
    };
    let run = |rounding: bool, forced: Option<&[Vec<u32>]>| -> anyhow::Result<GreedyOutput> {
        let mut cpu = CpuBackend::new(w.clone(), 2).with_gpu_rounding(rounding);
        cpu.init_kv_cache(kv)?;
        cpu.init_state_slots(n_prompts)?;
        forced_run(&mut cpu, &ps, steps, bs, forced)
    };
    let reference = run(true, None)?;
    let test = run(false, Some(&reference.0))?;
    Ok(compare_runs(format, &reference, &test, None, tol))
}

/// Decode and prefill throughput of one configuration, measured through the backend directly.
#[derive(Debug, Clone, PartialEq)]
pub struct Speed {
    /// Weight format.
    pub format: WeightFormat,
    /// Weight bytes one decode step reads (the embedding table left out).
    pub weight_bytes: u64,
    /// Batch-1 decode, tokens/s (graphs on).
    pub b1_tok_s: f64,
    /// Batch-1 decode, tokens/s (graphs off).
    pub b1_tok_s_no_graph: f64,
    /// Batch-32 decode at 1,024-token contexts, output tokens/s.
    pub b32_tok_s: f64,
    /// Prefill of one 4,096-token prompt, tokens/s.
    pub prefill_tok_s: f64,
    /// Notes of the backend (self-checks, fallbacks).
    pub notes: Vec<String>,
    /// Per-op GPU time of one batch-1 decode step at the 4,096-token context (profiled, eager):
    /// (op, calls per step, seconds per step).
    pub profile: Vec<(String, u64, f64)>,
    /// Batch-1 decode tokens/s at a 128-token context (graphs on).
    pub b1_short_tok_s: f64,
}

/// Measure [`Speed`] for a synthetic preset in `format` on `device`.
///
/// # Errors
/// A backend failure.
pub fn decode_speed(device: usize, preset: &str, format: WeightFormat) -> anyhow::Result<Speed> {
    let config = ModelConfig::preset(preset)
        .ok_or_else(|| anyhow::anyhow!("unknown preset synthetic:{preset}"))?;
    let bs = 16usize;
    let mut b = CudaBackend::load(CudaLoadSpec {
        device,
        weights: WeightSource::Synthetic { config, seed: 0 },
        quantize: Some(format.into()),
        max_num_batched_tokens: 4096,
        max_num_seqs: 32,
        max_model_len: 4096 + 64,
        kv_dtype: KvCacheDtype::Bf16,
        block_size: bs,
    })?;
    let c = b.config().clone();
    // 32 sequences × (1,024 + 64) tokens, or one of 4,096 + 64.
    let per_seq_blocks = (4096 + 64usize).div_ceil(bs);
    let num_blocks = (32 * (1024 + 64usize).div_ceil(bs)).max(per_seq_blocks) + 8;
    b.init_kv_cache(KvCacheSpec {
        num_blocks,
        block_size: bs,
        dtype: KvCacheDtype::Bf16,
    })?;
    let greedy = |n: usize| {
        vec![
            RowSampling {
                temperature: 0.0,
                top_p: 1.0,
                top_k: 0,
                seed: 0,
                draw: 0,
            };
            n
        ]
    };
    // Prefill of 4,096 tokens (timed on the second run).
    let bt: Vec<u32> = (0..per_seq_blocks as u32).collect();
    let pre = ForwardBatch {
        token_ids: (0..4096u32).map(|i| i % c.vocab_size as u32).collect(),
        seqs: vec![SeqSegment {
            start: 0,
            len: 4096,
            first_pos: 0,
            block_table: bt.clone(),
            num_logits: 1,
            state_slot: 0,
        }],
    };
    b.sample_forward(&pre, &greedy(1))?;
    let t0 = Instant::now();
    b.sample_forward(&pre, &greedy(1))?;
    let prefill_tok_s = 4096.0 / t0.elapsed().as_secs_f64();
    // Batch-1 decode after the 4,096-token context, graphs on then off.
    let decode1 = |b: &mut CudaBackend, steps: usize| -> anyhow::Result<f64> {
        let mut tok = 1u32;
        let mk = |pos: usize, tok: u32| ForwardBatch {
            token_ids: vec![tok],
            seqs: vec![SeqSegment {
                start: 0,
                len: 1,
                first_pos: pos,
                block_table: bt.clone(),
                num_logits: 1,
                state_slot: 0,
            }],
        };
        for i in 0..3 {
            tok = b.sample_forward(&mk(4096 + i, tok), &greedy(1))?[0];
        }
        let t0 = Instant::now();
        for i in 0..steps {
            tok = b.sample_forward(&mk(4096 + 3 + i % 60, tok), &greedy(1))?[0];
        }
        Ok(steps as f64 / t0.elapsed().as_secs_f64())
    };
    let b1_tok_s = decode1(&mut b, 64)?;
    b.set_cuda_graphs(false);
    let b1_tok_s_no_graph = decode1(&mut b, 32)?;
    // Profile 8 eager steps.
    b.set_profiling(true)?;
    decode1(&mut b, 8)?;
    let profile: Vec<(String, u64, f64)> = b
        .profile()
        .into_iter()
        .map(|(n, c, s)| (n, c / 11, s / 11.0)) // 3 warm-up + 8 steps
        .collect();
    b.set_profiling(false)?;
    b.set_cuda_graphs(true);
    // Short context: a 128-token prompt, then decode.
    let short = ForwardBatch {
        token_ids: (0..128u32).collect(),
        seqs: vec![SeqSegment {
            start: 0,
            len: 128,
            first_pos: 0,
            block_table: bt.clone(),
            num_logits: 1,
            state_slot: 0,
        }],
    };
    b.sample_forward(&short, &greedy(1))?;
    let mut tok = 1u32;
    for i in 0..3 {
        tok = b.sample_forward(
            &ForwardBatch {
                token_ids: vec![tok],
                seqs: vec![SeqSegment {
                    start: 0,
                    len: 1,
                    first_pos: 128 + i,
                    block_table: bt.clone(),
                    num_logits: 1,
                    state_slot: 0,
                }],
            },
            &greedy(1),
        )?[0];
    }
    let t0 = Instant::now();
    for i in 0..48 {
        tok = b.sample_forward(
            &ForwardBatch {
                token_ids: vec![tok],
                seqs: vec![SeqSegment {
                    start: 0,
                    len: 1,
                    first_pos: 131 + i,
                    block_table: bt.clone(),
                    num_logits: 1,
                    state_slot: 0,
                }],
            },
            &greedy(1),
        )?[0];
    }
    let b1_short_tok_s = 48.0 / t0.elapsed().as_secs_f64();
    // Batch 32 at 1,024-token contexts: 32 sequences with their own blocks (the contexts'
    // contents do not matter for the speed; they are whatever the cache holds).
    let per = (1024 + 64usize).div_ceil(bs);
    let tables: Vec<Vec<u32>> = (0..32)
        .map(|s| ((s * per) as u32..((s + 1) * per) as u32).collect())
        .collect();
    let mk32 = |pos: usize| ForwardBatch {
        token_ids: vec![1; 32],
        seqs: (0..32)
            .map(|s| SeqSegment {
                start: s,
                len: 1,
                first_pos: pos,
                block_table: tables[s].clone(),
                num_logits: 1,
                state_slot: s as u32,
            })
            .collect(),
    };
    for i in 0..3 {
        b.sample_forward(&mk32(1024 + i), &greedy(32))?;
    }
    let steps = 32;
    let t0 = Instant::now();
    for i in 0..steps {
        b.sample_forward(&mk32(1027 + i), &greedy(32))?;
    }
    let b32_tok_s = 32.0 * steps as f64 / t0.elapsed().as_secs_f64();
    Ok(Speed {
        format,
        weight_bytes: b.decode_weight_bytes(),
        b1_tok_s,
        b1_tok_s_no_graph,
        b32_tok_s,
        prefill_tok_s,
        notes: b.notes.clone(),
        profile,
        b1_short_tok_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn teacher_forcing_and_comparison_on_the_cpu() {
        // CPU f32 against CPU with GPU rounding: the same function up to BF16 roundings, so the
        // comparison machinery must find them close but not identical.
        let c = ModelConfig::tiny();
        let w = weights::synthesize(&c, 3);
        let ps = prompts(3, c.vocab_size, 5);
        let kv = KvCacheSpec {
            num_blocks: 64,
            block_size: 16,
            dtype: KvCacheDtype::Bf16,
        };
        let mut a = CpuBackend::new(w.clone(), 1);
        a.init_kv_cache(kv).unwrap();
        let reference = greedy_run(&mut a, &ps, 8, 16).unwrap();
        assert_eq!(reference.0.len(), 3);
        assert_eq!(reference.1.len(), 3 * 8);
        let mut b = CpuBackend::new(w, 1).with_gpu_rounding(true);
        b.init_kv_cache(kv).unwrap();
        let forced = forced_run(&mut b, &ps, 8, 16, Some(&reference.0)).unwrap();
        let p = compare_runs(WeightFormat::Bf16, &reference, &forced, None, PARITY_BF16);
        assert_eq!(p.tokens, 24);
        assert!(p.max_rel_l2 > 0.0, "BF16 rounding must change something");
        assert!(p.max_rel_l2 < 5e-2, "{p:?}");
        assert!(p.top1_equal + p.near_ties >= 22, "{p:?}");
        // The same run compared with itself is exact.
        let same = compare_runs(
            WeightFormat::Bf16,
            &reference,
            &reference,
            Some(&reference),
            PARITY_BF16,
        );
        assert!(same.pass() && same.greedy_identical && same.max_abs == 0.0);
        // Forcing needs enough tokens.
        let short = vec![vec![1u32]; 3];
        assert!(forced_run(&mut a, &ps, 8, 16, Some(&short)).is_err());
    }
}

/// The router scores within which two backends may choose different experts for a token
/// (the bound: the k-th and the (k+1)-th softmax probabilities within 1e-3).
pub const ROUTING_NEAR_TIE: f32 = 1e-3;

/// Routing parity of the CUDA backend with the CPU backend (BF16 rounding at the CUDA
/// backend's points) on one prefill of `tokens` seeded tokens: per sparse layer and token, the
/// same set of experts, except where the CPU's k-th and (k+1)-th probabilities are within
/// [`ROUTING_NEAR_TIE`], or downstream of such a flip: a token whose experts differ changes
/// its own hidden state and, through the Gated-DeltaNet recurrence and attention, every later
/// token's, so a difference at a later layer and the same or a later token is the flip's
/// consequence (counted apart), not a second error.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingParity {
    /// Sparse layers compared.
    pub layers: usize,
    /// (layer, token) routes compared.
    pub routes: usize,
    /// Routes with the same experts.
    pub equal: usize,
    /// Routes that differ at a near-tie.
    pub near_ties: usize,
    /// Routes that differ downstream of an earlier flip (a later layer, the same or a later
    /// token).
    pub downstream: usize,
    /// Routes that differ with a margin above the near-tie bound, the first few.
    pub mismatches: Vec<RouteMismatch>,
    /// How many differ beyond a near-tie.
    pub mismatch_count: usize,
}

impl RoutingParity {
    /// No route differs beyond a near-tie.
    pub fn pass(&self) -> bool {
        self.mismatch_count == 0 && self.routes > 0
    }
}

/// One route that differs beyond a near-tie: (sparse layer, token, the CPU's experts sorted,
/// the GPU's sorted, the CPU's margin between the k-th and the next probability).
pub type RouteMismatch = (usize, usize, Vec<usize>, Vec<usize>, f32);

/// [`RoutingParity`] of `weights` (a mixture of experts) in `format`.
///
/// # Errors
/// Not a mixture of experts, or a backend failure.
pub fn routing_parity(
    device: usize,
    weights: &ModelWeights,
    format: WeightFormat,
    tokens: usize,
) -> anyhow::Result<RoutingParity> {
    anyhow::ensure!(weights.config.is_moe(), "not a mixture of experts");
    let mut w = weights.clone();
    w.quantize(format)?;
    let c = w.config.clone();
    let bs = 16;
    let kv = KvCacheSpec {
        num_blocks: tokens.div_ceil(bs) + 2,
        block_size: bs,
        dtype: KvCacheDtype::Bf16,
    };
    let mut r = weights::SplitMix64::new(0x07E5);
    let ids: Vec<u32> = (0..tokens)
        .map(|_| (r.next_u64() % c.vocab_size as u64) as u32)
        .collect();
    let batch = ForwardBatch {
        token_ids: ids,
        seqs: vec![SeqSegment {
            start: 0,
            len: tokens,
            first_pos: 0,
            block_table: (0..tokens.div_ceil(bs) as u32 + 1).collect(),
            num_logits: 1,
            state_slot: 0,
        }],
    };
    let mut cpu = CpuBackend::new(w.clone(), 4)
        .with_gpu_rounding(true)
        .with_route_log();
    cpu.init_kv_cache(kv)?;
    cpu.init_state_slots(1)?;
    cpu.forward(&batch)?;
    let want = cpu.take_routes();
    let mut gpu = CudaBackend::load(CudaLoadSpec {
        device,
        weights: WeightSource::Host(Box::new(w)),
        quantize: None,
        max_num_batched_tokens: tokens.max(256),
        max_num_seqs: 1,
        max_model_len: tokens + 64,
        kv_dtype: KvCacheDtype::Bf16,
        block_size: bs,
    })?;
    gpu.init_kv_cache(kv)?;
    gpu.init_state_slots(1)?;
    gpu.set_moe_route_capture(true)?;
    gpu.forward(&batch)?;
    let got = gpu.moe_routes(tokens)?;
    Ok(compare_routes(&want, &got))
}

/// Compare the CPU's routes (per sparse layer, per token) with the GPU's expert ids (per sparse
/// layer, `tokens · k`), as sets of experts per token.
pub fn compare_routes(want: &[Vec<crate::runtime::moe::Route>], got: &[Vec<i32>]) -> RoutingParity {
    let mut p = RoutingParity {
        layers: want.len().min(got.len()),
        routes: 0,
        equal: 0,
        near_ties: 0,
        downstream: 0,
        mismatches: Vec::new(),
        mismatch_count: usize::from(want.len() != got.len()),
    };
    // The first token of any flip in the layers before the current one.
    let mut first_flip = usize::MAX;
    for (l, (w, g)) in want.iter().zip(got).enumerate() {
        let k = w.first().map_or(1, |r| r.experts.len()).max(1);
        if g.len() != w.len() * k {
            p.mismatch_count += 1;
            continue;
        }
        let mut first_here = usize::MAX;
        for (t, route) in w.iter().enumerate() {
            p.routes += 1;
            let mut a = route.experts.clone();
            let mut b: Vec<usize> = g[t * k..(t + 1) * k].iter().map(|x| *x as usize).collect();
            a.sort_unstable();
            b.sort_unstable();
            if a == b {
                p.equal += 1;
                continue;
            }
            first_here = first_here.min(t);
            if route.margin < ROUTING_NEAR_TIE {
                p.near_ties += 1;
            } else if t >= first_flip {
                p.downstream += 1;
            } else {
                p.mismatch_count += 1;
                if p.mismatches.len() < 5 {
                    p.mismatches.push((l, t, a, b, route.margin));
                }
            }
        }
        first_flip = first_flip.min(first_here);
    }
    p
}

#[cfg(test)]
mod routing_tests {
    use super::*;
    use crate::runtime::moe::Route;

    fn route(experts: Vec<usize>, margin: f32) -> Route {
        Route {
            weights: vec![0.5; experts.len()],
            experts,
            margin,
        }
    }

    #[test]
    fn routes_compare_as_sets_and_forgive_only_near_ties() {
        let want = vec![vec![
            route(vec![3, 1], 0.2),
            route(vec![0, 2], 5e-4),
            route(vec![4, 5], 0.1),
        ]];
        // Token 0: same set in another order; token 1: a near-tie; token 2: a real mismatch.
        let got = vec![vec![1, 3, 0, 7, 4, 6]];
        let p = compare_routes(&want, &got);
        assert_eq!(
            (p.routes, p.equal, p.near_ties, p.mismatch_count),
            (3, 1, 1, 1)
        );
        assert_eq!(p.mismatches[0].0..p.mismatches[0].1, 0..2);
        assert!(!p.pass());
        // In a later layer, a difference at a token at or after the first flip (token 1 above)
        // is downstream of it; one before it is an error.
        let two = vec![
            want[0].clone(),
            vec![
                route(vec![0, 1], 0.3),
                route(vec![2, 3], 0.3),
                route(vec![4, 5], 0.3),
            ],
        ];
        let got2 = vec![got[0].clone(), vec![0, 1, 2, 6, 4, 7]];
        let q = compare_routes(&two, &got2);
        assert_eq!((q.near_ties, q.downstream, q.mismatch_count), (1, 2, 1));
        let got3 = vec![got[0].clone(), vec![0, 7, 2, 3, 4, 5]];
        assert_eq!(compare_routes(&two, &got3).mismatch_count, 2);
        let p = compare_routes(&want[..0], &got[..0]);
        assert!(!p.pass(), "nothing compared is not a pass");
        // A layer count that differs is a mismatch.
        assert!(!compare_routes(&want, &[]).pass());
    }
}
