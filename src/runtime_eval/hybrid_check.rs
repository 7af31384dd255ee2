//! Whole-model device checks and measurements of the CUDA backend on Gated-DeltaNet hybrids,
//! for `rigbench devcheck --only hybrid` and `scripts/device/hybrid-check.sh` (the kernels'
//! own check against the CPU is `runtime::backend::cuda::hybrid_check`):
//!
//! - [`prefill_forms_agree`]: decoding after one chunked prefill against decoding after a
//!   token-by-token prefill on the GPU (state consistency);
//! - [`hybrid_speed`]: batch-1 and batch-32 decode (4,096-token contexts) and prefill through
//!   the backend, with the recurrent state kept consistent (the dense `decode_speed` revisits
//!   positions, which a recurrent state cannot).

use std::time::Instant;

use super::cuda_check::Speed;
use crate::gemm::check::rel_l2;
use crate::runtime::backend::cuda::self_check::Check;
use crate::runtime::backend::cuda::{CudaBackend, CudaLoadSpec, RowSampling, WeightSource};
use crate::runtime::backend::{Backend, ForwardBatch, KvCacheSpec, SeqSegment};
use crate::runtime::config::{KvCacheDtype, ModelConfig, QuantRecipe};
use crate::runtime::sampler::argmax;
use crate::runtime::weights::ModelWeights;

/// Largest rel L2 difference of a logits row between decoding after one chunked prefill and
/// after a token-by-token prefill on the GPU (BF16 activations: the two forms round their
/// outputs differently, each a few units of 2⁻⁸); the greedy tokens must agree except at
/// near-ties (top-2 margin below 0.05).
pub const PREFILL_FORMS_REL_L2: f64 = 3e-2;

fn seg(start: usize, len: usize, first_pos: usize, slot: u32, logits: usize) -> SeqSegment {
    SeqSegment {
        start,
        len,
        first_pos,
        block_table: (64 * slot..64 * slot + 64).collect(),
        num_logits: logits,
        state_slot: slot,
    }
}

fn margin(row: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in row {
        if x > a {
            b = a;
            a = x;
        } else if x > b {
            b = x;
        }
    }
    a - b
}

/// Decoding after one chunked prefill (70 tokens: the chunked form) against decoding after a
/// token-by-token prefill (the recurrent form), 16 greedy steps, on the GPU with `weights`.
///
/// # Errors
/// A device failure.
pub fn prefill_forms_agree(device: usize, weights: &ModelWeights) -> anyhow::Result<Check> {
    let load = || {
        let mut g = CudaBackend::load(CudaLoadSpec {
            device,
            weights: WeightSource::Host(Box::new(weights.clone())),
            quantize: None,
            max_num_batched_tokens: 256,
            max_num_seqs: 2,
            max_model_len: 1024,
            kv_dtype: KvCacheDtype::Bf16,
            block_size: 16,
        })?;
        g.init_kv_cache(KvCacheSpec {
            num_blocks: 128,
            block_size: 16,
            dtype: KvCacheDtype::Bf16,
        })?;
        g.init_state_slots(2)?;
        anyhow::Ok(g)
    };
    let (mut a, mut b) = (load()?, load()?);
    let vocab = weights.config.vocab_size as u32;
    let prompt: Vec<u32> = (0..70u32).map(|i| (i * 37 + 3) % vocab).collect();
    let la = a.forward(&ForwardBatch {
        token_ids: prompt.clone(),
        seqs: vec![seg(0, 70, 0, 0, 1)],
    })?;
    let mut lb = None;
    for (i, t) in prompt.iter().enumerate() {
        lb = Some(b.forward(&ForwardBatch {
            token_ids: vec![*t],
            seqs: vec![seg(0, 1, i, 0, 1)],
        })?);
    }
    let lb = lb.ok_or_else(|| anyhow::anyhow!("empty prompt"))?;
    let mut worst = rel_l2(la.row(0), lb.row(0));
    let (mut ta, mut tb) = (argmax(la.row(0)), argmax(lb.row(0)));
    let (mut equal, mut ties, mut steps) = (0usize, 0usize, 0usize);
    for s in 0..16 {
        steps += 1;
        if ta == tb {
            equal += 1;
        } else if margin(lb.row(0)) < 0.05 {
            ties += 1;
            tb = ta; // follow one sequence
        } else {
            break;
        }
        let pos = prompt.len() + s;
        let ra = a.forward(&ForwardBatch {
            token_ids: vec![ta],
            seqs: vec![seg(0, 1, pos, 0, 1)],
        })?;
        let rb = b.forward(&ForwardBatch {
            token_ids: vec![tb],
            seqs: vec![seg(0, 1, pos, 0, 1)],
        })?;
        worst = worst.max(rel_l2(ra.row(0), rb.row(0)));
        ta = argmax(ra.row(0));
        tb = argmax(rb.row(0));
    }
    Ok(Check {
        name: "decode after a chunked prefill = after a token-by-token prefill (GPU)".into(),
        pass: equal + ties == steps && steps == 16 && worst <= PREFILL_FORMS_REL_L2,
        detail: format!(
            "{equal}/{steps} greedy tokens equal (+{ties} near-ties); logits rel L2 max {worst:.2e} (limit {PREFILL_FORMS_REL_L2:.0e})"
        ),
    })
}

/// Decode and prefill throughput of a hybrid preset in `recipe` on `device`, through the
/// backend directly, every sequence's recurrent state continued step by step: prefill of one
/// 4,096-token prompt; batch-1 decode after it (graphs on, then off; 8 eager steps profiled);
/// batch-1 decode after a 128-token prompt; batch 32 after 32 prefills of 4,096 tokens.
///
/// # Errors
/// A backend failure.
pub fn hybrid_speed(device: usize, preset: &str, recipe: QuantRecipe) -> anyhow::Result<Speed> {
    let config = ModelConfig::preset(preset)
        .ok_or_else(|| anyhow::anyhow!("unknown preset synthetic:{preset}"))?;
    anyhow::ensure!(config.is_hybrid(), "synthetic:{preset} is not a hybrid");
    let bs = 16usize;
    let ctx = 4096usize;
    let max_len = ctx + 256;
    let mut b = CudaBackend::load(CudaLoadSpec {
        device,
        weights: WeightSource::Synthetic { config, seed: 0 },
        quantize: Some(recipe),
        max_num_batched_tokens: ctx,
        max_num_seqs: 32,
        max_model_len: max_len,
        kv_dtype: KvCacheDtype::Bf16,
        block_size: bs,
    })?;
    let per_seq = max_len.div_ceil(bs);
    b.init_kv_cache(KvCacheSpec {
        num_blocks: 32 * per_seq,
        block_size: bs,
        dtype: KvCacheDtype::Bf16,
    })?;
    b.init_state_slots(32)?;
    let vocab = b.config().vocab_size as u32;
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
    let table =
        |s: usize| -> Vec<u32> { ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect() };
    let one = |len: usize, first_pos: usize, slot: usize, toks: Vec<u32>| ForwardBatch {
        token_ids: toks,
        seqs: vec![SeqSegment {
            start: 0,
            len,
            first_pos,
            block_table: table(slot),
            num_logits: 1,
            state_slot: slot as u32,
        }],
    };
    let prompt = |len: usize, salt: u32| -> Vec<u32> {
        (0..len as u32)
            .map(|i| (i * 31 + salt) % vocab.min(50_000))
            .collect()
    };
    // Prefill of 4,096 tokens (timed on the second run; both start their slot afresh).
    b.sample_forward(&one(ctx, 0, 0, prompt(ctx, 1)), &greedy(1))?;
    let t0 = Instant::now();
    let mut tok = b.sample_forward(&one(ctx, 0, 0, prompt(ctx, 1)), &greedy(1))?[0];
    let prefill_tok_s = ctx as f64 / t0.elapsed().as_secs_f64();
    let mut pos = ctx;
    let decode = |b: &mut CudaBackend,
                  steps: usize,
                  pos: &mut usize,
                  tok: &mut u32|
     -> anyhow::Result<f64> {
        let t0 = Instant::now();
        for _ in 0..steps {
            *tok = b.sample_forward(&one(1, *pos, 0, vec![*tok]), &greedy(1))?[0];
            *pos += 1;
        }
        Ok(steps as f64 / t0.elapsed().as_secs_f64())
    };
    decode(&mut b, 3, &mut pos, &mut tok)?;
    let b1_tok_s = decode(&mut b, 64, &mut pos, &mut tok)?;
    b.set_cuda_graphs(false);
    let b1_tok_s_no_graph = decode(&mut b, 32, &mut pos, &mut tok)?;
    b.set_profiling(true)?;
    decode(&mut b, 8, &mut pos, &mut tok)?;
    let profile: Vec<(String, u64, f64)> = b
        .profile()
        .into_iter()
        .map(|(n, c, s)| (n, c / 8, s / 8.0))
        .collect();
    b.set_profiling(false)?;
    b.set_cuda_graphs(true);
    // Batch 1 after a 128-token prompt.
    let mut tok = b.sample_forward(&one(128, 0, 0, prompt(128, 2)), &greedy(1))?[0];
    let mut pos = 128;
    decode(&mut b, 3, &mut pos, &mut tok)?;
    let b1_short_tok_s = decode(&mut b, 48, &mut pos, &mut tok)?;
    // Batch 32 at 4,096-token contexts.
    let mut toks = Vec::with_capacity(32);
    for s in 0..32 {
        toks.push(b.sample_forward(&one(ctx, 0, s, prompt(ctx, 3 + s as u32)), &greedy(1))?[0]);
    }
    let mk32 = |pos: usize, toks: &[u32]| ForwardBatch {
        token_ids: toks.to_vec(),
        seqs: (0..32)
            .map(|s| SeqSegment {
                start: s,
                len: 1,
                first_pos: pos,
                block_table: table(s),
                num_logits: 1,
                state_slot: s as u32,
            })
            .collect(),
    };
    let mut pos = ctx;
    for _ in 0..3 {
        toks = b.sample_forward(&mk32(pos, &toks), &greedy(32))?;
        pos += 1;
    }
    let steps = 32;
    let t0 = Instant::now();
    for _ in 0..steps {
        toks = b.sample_forward(&mk32(pos, &toks), &greedy(32))?;
        pos += 1;
    }
    let b32_tok_s = 32.0 * steps as f64 / t0.elapsed().as_secs_f64();
    Ok(Speed {
        format: b.weight_format(),
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
