//! The CPU forward pass against a naive reference: contiguous (unpaged) f64 attention,
//! textbook loops, dequantized weights, written independently of the backend's code.

use super::*;

use crate::formats::e4m3;
use crate::runtime::backend::SeqSegment;
use crate::runtime::config::KvCacheDtype;
use crate::runtime::config::ModelConfig;
use crate::runtime::weights::{synthesize, Linear};

/// The GEMM layer's CPU reference of per-token FP8 quantization (`gemm::fp8_quant`, the rule
/// of the CUDA backend's quantization kernel) agrees with the runtime's CPU quantization.
#[test]
fn quant_row_is_the_runtimes_rule() {
    let x: Vec<f32> = crate::formats::test_uniform(3, 64)
        .into_iter()
        .map(|u| crate::formats::bf16_round(u * 2.5))
        .collect();
    let (q, s) = crate::gemm::fp8_quant::quant_row(&x);
    let deq: Vec<f32> = q
        .iter()
        .map(|c| crate::formats::e4m3::decode(*c) * s)
        .collect();
    let cpu = quantize_activations_fp8(&x, 64, None);
    assert_eq!(deq, cpu);
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert_eq!(s, amax / 448.0);
    // An all-zero row: scale 1, codes 0.
    let (q0, s0) = crate::gemm::fp8_quant::quant_row(&[0.0; 8]);
    assert_eq!((q0, s0), (vec![0u8; 8], 1.0));
    // A static input scale (ModelOpt `input_scale`): the GEMM layer's rule is the CPU's.
    let st = 0.0125f32;
    let cpu = quantize_activations_fp8(&x, 64, Some(st));
    let (q, s) = crate::gemm::fp8_quant::quant_row_with(&x, st);
    let deq: Vec<f32> = q
        .iter()
        .map(|c| crate::formats::e4m3::decode(*c) * s)
        .collect();
    assert_eq!((deq, s), (cpu, st));
}

/// Reference decoder over a whole sequence, returning logits for every position.
/// `act_fp8` applies W8A8's dynamic per-token activation quantization before FP8 matmuls;
/// `kv_fp8` rounds K and V through E4M3 with scale 1.0 as the FP8 KV cache stores them;
/// otherwise K/V are rounded to BF16 as the BF16 cache stores them.
fn reference(w: &ModelWeights, tokens: &[u32], kv_fp8: bool) -> Vec<Vec<f64>> {
    let c = &w.config;
    let (h, hd) = (c.hidden_size, c.head_dim);
    let n = tokens.len();
    let deq = |l: &Linear| -> (Vec<f32>, usize, usize, bool, Option<f32>) {
        let (rows, cols) = l.shape();
        let (is8, is) = match l {
            Linear::Fp8 { input_scale, .. } => (true, *input_scale),
            _ => (false, None),
        };
        (l.dequantize(), rows, cols, is8, is)
    };
    let mm = |x: &[Vec<f64>], l: &Linear| -> Vec<Vec<f64>> {
        let (wd, rows, cols, is8, is) = deq(l);
        x.iter()
            .map(|xr| {
                let xr: Vec<f64> = if is8 {
                    // W8A8: per-token dynamic scale amax/448 (or the static input scale),
                    // each activation rounded through E4M3, in the f32 arithmetic vLLM's
                    // quantization kernel (and the backend) uses: the E4M3 rounding is
                    // discontinuous, so an f64 scale would move every rounding boundary.
                    let x32: Vec<f32> = xr.iter().map(|v| *v as f32).collect();
                    quantize_activations_fp8(&x32, x32.len(), is)
                        .into_iter()
                        .map(f64::from)
                        .collect()
                } else {
                    xr.clone()
                };
                (0..rows)
                    .map(|r| (0..cols).map(|j| wd[r * cols + j] as f64 * xr[j]).sum())
                    .collect()
            })
            .collect()
    };
    let norm = |x: &[f64], wgt: &[f32]| -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let inv = 1.0 / (ms + c.rms_norm_eps as f64).sqrt();
        x.iter()
            .zip(wgt)
            .map(|(v, g)| v * inv * *g as f64)
            .collect()
    };
    let rope = |x: &mut [f64], pos: usize| {
        let half = hd / 2;
        for i in 0..half {
            let f = 1.0 / (c.rope_theta as f64).powf(2.0 * i as f64 / hd as f64);
            let a = pos as f64 * f;
            let (x1, x2) = (x[i], x[i + half]);
            x[i] = x1 * a.cos() - x2 * a.sin();
            x[i + half] = x2 * a.cos() + x1 * a.sin();
        }
    };
    let store = |v: f64| -> f64 {
        if kv_fp8 {
            e4m3::round_trip(v as f32) as f64
        } else {
            crate::formats::bf16_round(v as f32) as f64
        }
    };
    let emb = w.embed.dequantize();
    let mut x: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| {
            emb[t as usize * h..(t as usize + 1) * h]
                .iter()
                .map(|v| *v as f64)
                .collect()
        })
        .collect();
    for l in &w.layers {
        let hn: Vec<Vec<f64>> = x.iter().map(|r| norm(r, &l.input_norm)).collect();
        let mut q = mm(&hn, &l.q);
        let mut k = mm(&hn, &l.k);
        let mut v = mm(&hn, &l.v);
        for p in 0..n {
            for hh in 0..c.num_heads {
                let s = &mut q[p][hh * hd..(hh + 1) * hd];
                if let Some(nw) = &l.q_norm {
                    let y = norm(s, nw);
                    s.copy_from_slice(&y);
                }
                rope(s, p);
            }
            for hh in 0..c.num_kv_heads {
                let s = &mut k[p][hh * hd..(hh + 1) * hd];
                if let Some(nw) = &l.k_norm {
                    let y = norm(s, nw);
                    s.copy_from_slice(&y);
                }
                rope(s, p);
            }
            k[p].iter_mut().for_each(|e| *e = store(*e));
            v[p].iter_mut().for_each(|e| *e = store(*e));
        }
        let group = c.num_heads / c.num_kv_heads;
        let attn: Vec<Vec<f64>> = (0..n)
            .map(|p| {
                let mut out = vec![0f64; c.q_dim()];
                for hh in 0..c.num_heads {
                    let g = hh / group;
                    let qh = &q[p][hh * hd..(hh + 1) * hd];
                    let sc: Vec<f64> = (0..=p)
                        .map(|t| {
                            qh.iter()
                                .zip(&k[t][g * hd..(g + 1) * hd])
                                .map(|(a, b)| a * b)
                                .sum::<f64>()
                                / (hd as f64).sqrt()
                        })
                        .collect();
                    let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for t in 0..=p {
                        for j in 0..hd {
                            out[hh * hd + j] += e[t] / z * v[t][g * hd + j];
                        }
                    }
                }
                out
            })
            .collect();
        let o = mm(&attn, &l.o);
        for p in 0..n {
            for j in 0..h {
                x[p][j] += o[p][j];
            }
        }
        let hn: Vec<Vec<f64>> = x.iter().map(|r| norm(r, &l.post_norm)).collect();
        let g = mm(&hn, &l.gate);
        let u = mm(&hn, &l.up);
        let act: Vec<Vec<f64>> = g
            .iter()
            .zip(&u)
            .map(|(gr, ur)| {
                gr.iter()
                    .zip(ur)
                    .map(|(a, b)| a / (1.0 + (-a).exp()) * b)
                    .collect()
            })
            .collect();
        let d = mm(&act, &l.down);
        for p in 0..n {
            for j in 0..h {
                x[p][j] += d[p][j];
            }
        }
    }
    let hn: Vec<Vec<f64>> = x.iter().map(|r| norm(r, &w.norm)).collect();
    mm(&hn, w.lm_head())
}

fn run_backend(
    w: &ModelWeights,
    tokens: &[u32],
    table: Vec<u32>,
    dtype: KvCacheDtype,
    threads: usize,
) -> Logits {
    let mut b = CpuBackend::new(w.clone(), threads);
    b.init_kv_cache(KvCacheSpec {
        num_blocks: 16,
        block_size: 4,
        dtype,
    })
    .unwrap();
    b.forward(&ForwardBatch {
        token_ids: tokens.to_vec(),
        seqs: vec![SeqSegment {
            start: 0,
            len: tokens.len(),
            first_pos: 0,
            block_table: table,
            num_logits: tokens.len(),
            state_slot: 0,
        }],
    })
    .unwrap()
}

/// Largest |a − b| over all logits divided by the RMS of the reference logits.
fn rel_max_err(got: &Logits, want: &[Vec<f64>]) -> f64 {
    let mut max = 0f64;
    let mut ss = 0f64;
    let mut cnt = 0f64;
    for (r, row) in want.iter().enumerate() {
        for (j, v) in row.iter().enumerate() {
            max = max.max((got.row(r)[j] as f64 - v).abs());
            ss += v * v;
            cnt += 1.0;
        }
    }
    max / (ss / cnt).sqrt()
}

const PROMPT: [u32; 11] = [257, 117, 115, 101, 114, 10, 104, 105, 258, 10, 259];

/// f32 backend vs f64 reference on identical weights: the only differences are f32 rounding
/// in sums of at most 192 terms (K of down_proj) through 2 layers, about 1e-6 relative each;
/// 1e-4 of the logits' RMS leaves two orders of magnitude of margin and still catches any
/// real error (a wrong norm weight or RoPE position moves logits by >1e-2 of their RMS).
const TIGHT_REL_TOL: f64 = 1e-4;

#[test]
fn bf16_forward_matches_reference() {
    let w = synthesize(&ModelConfig::tiny(), 11);
    let want = reference(&w, &PROMPT, false);
    let got = run_backend(&w, &PROMPT, vec![0, 1, 2], KvCacheDtype::Bf16, 1);
    let e = rel_max_err(&got, &want);
    assert!(e < TIGHT_REL_TOL, "BF16 relative max error {e}");
    // The check has teeth: a different seed is far away.
    let other = reference(&synthesize(&ModelConfig::tiny(), 12), &PROMPT, false);
    assert!(rel_max_err(&got, &other) > 0.1);
}

/// Relative RMS error: ‖got − want‖₂ / ‖want‖₂ over all logits.
fn rel_rms_err(got: &Logits, want: &[Vec<f64>]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (r, row) in want.iter().enumerate() {
        for (j, v) in row.iter().enumerate() {
            num += (got.row(r)[j] as f64 - v).powi(2);
            den += v * v;
        }
    }
    (num / den).sqrt()
}

#[test]
fn nvfp4_forward_matches_reference_on_dequantized_weights() {
    // W4A16 dequantizes weights only: the forward pass is continuous in its inputs, so the
    // same tight tolerance as BF16 applies.
    let mut w = synthesize(&ModelConfig::tiny(), 11);
    w.quantize(WeightFormat::Nvfp4).unwrap();
    let want = reference(&w, &PROMPT, false);
    let got = run_backend(&w, &PROMPT, vec![3, 7, 1], KvCacheDtype::Bf16, 1);
    let e = rel_max_err(&got, &want);
    assert!(e < TIGHT_REL_TOL, "NVFP4: relative max error {e}");
}

#[test]
fn fp8_w8a8_matmul_matches_naive() {
    // On identical f32 inputs, the W8A8 matmul equals the naive product of dequantized
    // weights and E4M3-rounded activations up to f32 summation order.
    let mut w = synthesize(&ModelConfig::tiny(), 11);
    w.quantize(WeightFormat::Fp8).unwrap();
    for l in [&w.layers[0].gate, &w.layers[1].down] {
        let (n, k) = l.shape();
        let m = 5;
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i as f32) * 0.37).sin() * (1 + i % 7) as f32)
            .collect();
        let y = matmul(&x, m, l, 1);
        let wd = l.dequantize();
        for i in 0..m {
            let row = &x[i * k..(i + 1) * k];
            let amax = row.iter().fold(0f32, |a, v| a.max(v.abs()));
            let s = amax / 448.0;
            let xq: Vec<f64> = row
                .iter()
                .map(|v| (e4m3::round_trip(v / s) * s) as f64)
                .collect();
            for j in 0..n {
                let r: f64 = (0..k).map(|t| wd[j * k + t] as f64 * xq[t]).sum();
                assert!(
                    (r - y[i * n + j] as f64).abs() < 1e-4 * (1.0 + r.abs()),
                    "[{i},{j}] {r} vs {}",
                    y[i * n + j]
                );
            }
        }
    }
}

/// FP8 W8A8 forward vs the f64 reference with the same weights and the same activation
/// quantization (done in f32, as the backend and vLLM's kernel do), per position. Rounding
/// activations to E4M3 is discontinuous: an activation that the f32 backend and the f64
/// reference compute a few ulps apart can round to neighbouring E4M3 values (a 2⁻³ relative
/// step), and such a flip changes that position's logits by a few percent and, through the
/// KV cache, every later position. On this preset (seed 11) the first flip happens at
/// position 2 (measured 2e-7 at positions 0 and 1, then 2–9%). So: the positions before the
/// first flip agree to f32 rounding (`FP8_SAME_ROW_TOL`), there are at least two of them,
/// and no position is off by more than `FP8_FLIP_ROW_TOL`. That activation quantization is
/// applied at all is checked exactly by the matmul-level test above.
const FP8_SAME_ROW_TOL: f64 = 1e-5;
/// See [`FP8_SAME_ROW_TOL`].
const FP8_FLIP_ROW_TOL: f64 = 0.15;

#[test]
fn fp8_forward_matches_reference_within_flip_tolerance() {
    let mut w = synthesize(&ModelConfig::tiny(), 11);
    w.quantize(WeightFormat::Fp8).unwrap();
    let want = reference(&w, &PROMPT, false);
    let got = run_backend(&w, &PROMPT, vec![3, 7, 1], KvCacheDtype::Bf16, 1);
    let rows: Vec<f64> = (0..want.len())
        .map(|r| {
            let (mut num, mut den) = (0f64, 0f64);
            for (j, v) in want[r].iter().enumerate() {
                num += (got.row(r)[j] as f64 - v).powi(2);
                den += v * v;
            }
            (num / den).sqrt()
        })
        .collect();
    let exact_prefix = rows.iter().take_while(|e| **e < FP8_SAME_ROW_TOL).count();
    assert!(
        exact_prefix >= 2,
        "FP8: the first positions must match the reference to f32 rounding: {rows:?}"
    );
    assert!(
        rows.iter().all(|e| *e < FP8_FLIP_ROW_TOL),
        "FP8: a position is off by more than E4M3 flips explain: {rows:?}"
    );
}

/// FP8 W8A8 vs the BF16 model (relative RMS error of all logits). E4M3 keeps 3 mantissa
/// bits: a rounded operand carries a uniform relative error of up to 2⁻⁴ (RMS 2⁻⁴/√3 ≈
/// 3.6%); with both weights and activations rounded each projection output is off by about
/// 5%, and seven projections per layer through 2 layers give a measured 14% on this preset
/// (seed 11). 0.25 bounds that with margin.
const FP8_VS_BF16_REL_TOL: f64 = 0.25;
/// NVFP4 W4A16 vs the BF16 model (relative RMS error of all logits). E2M1 has one mantissa
/// bit; with a 16-element block scale the weight error is about 9% RMS on Gaussian weights
/// (the formats module bounds it by 12% on uniform data); through 2 layers the measured
/// error on this preset (seed 11) is 31%. 0.5 bounds it with margin.
const NVFP4_VS_BF16_REL_TOL: f64 = 0.5;
/// Both formats must visibly change the logits (so the tolerance tests cannot pass on a
/// backend that silently ignored the quantization): at least 2% relative RMS.
const MIN_QUANT_EFFECT: f64 = 0.02;

#[test]
fn quantized_forward_within_named_tolerances_of_bf16() {
    let w = synthesize(&ModelConfig::tiny(), 11);
    let want = reference(&w, &PROMPT, false);
    for (fmt, tol) in [
        (WeightFormat::Fp8, FP8_VS_BF16_REL_TOL),
        (WeightFormat::Nvfp4, NVFP4_VS_BF16_REL_TOL),
    ] {
        let mut q = w.clone();
        q.quantize(fmt).unwrap();
        let got = run_backend(&q, &PROMPT, vec![0, 1, 2], KvCacheDtype::Bf16, 1);
        let e = rel_rms_err(&got, &want);
        assert!(
            e < tol,
            "{fmt:?} vs BF16: relative RMS error {e} (tolerance {tol})"
        );
        assert!(e > MIN_QUANT_EFFECT, "{fmt:?} had no visible effect: {e}");
    }
}

/// FP8 E4M3 KV cache at scale 1.0 vs a reference that rounds K/V through E4M3 the same way:
/// tight, as only f32 summation order differs.
#[test]
fn fp8_kv_cache_matches_reference() {
    let w = synthesize(&ModelConfig::tiny(), 5);
    let want = reference(&w, &PROMPT, true);
    let got = run_backend(&w, &PROMPT, vec![0, 1, 2], KvCacheDtype::Fp8, 1);
    let e = rel_max_err(&got, &want);
    assert!(e < TIGHT_REL_TOL, "FP8 KV relative max error {e}");
}

#[test]
fn paged_equals_contiguous_and_threads_do_not_matter() {
    let w = synthesize(&ModelConfig::tiny(), 2);
    let contiguous = run_backend(&w, &PROMPT, vec![0, 1, 2], KvCacheDtype::Bf16, 1);
    let scattered = run_backend(&w, &PROMPT, vec![13, 4, 9], KvCacheDtype::Bf16, 1);
    assert_eq!(contiguous, scattered);
    let threaded = run_backend(&w, &PROMPT, vec![9, 4, 13], KvCacheDtype::Bf16, 3);
    assert_eq!(contiguous, threaded);
}

#[test]
fn chunked_prefill_and_decode_equal_one_pass() {
    let w = synthesize(&ModelConfig::tiny(), 2);
    let full = run_backend(&w, &PROMPT, vec![0, 1, 2], KvCacheDtype::Bf16, 1);
    let mut b = CpuBackend::new(w, 1);
    b.init_kv_cache(KvCacheSpec {
        num_blocks: 8,
        block_size: 4,
        dtype: KvCacheDtype::Bf16,
    })
    .unwrap();
    let table = vec![5u32, 2, 7];
    let mut rows = Vec::new();
    // Chunk of 5, then 4, then 2 single-token steps, batched with an unrelated sequence.
    let mut start = 0;
    for len in [5usize, 4, 1, 1] {
        let seg = SeqSegment {
            start: 0,
            len,
            first_pos: start,
            block_table: table.clone(),
            num_logits: len,
            state_slot: 0,
        };
        let other = SeqSegment {
            start: len,
            len: 3,
            first_pos: 0,
            block_table: vec![0],
            num_logits: 1,
            state_slot: 1,
        };
        let mut toks = PROMPT[start..start + len].to_vec();
        toks.extend([1u32, 2, 3]);
        let out = b
            .forward(&ForwardBatch {
                token_ids: toks,
                seqs: vec![seg, other],
            })
            .unwrap();
        for r in 0..len {
            rows.push(out.row(r).to_vec());
        }
        start += len;
    }
    for (r, row) in rows.iter().enumerate() {
        assert_eq!(row.as_slice(), full.row(r), "row {r}");
    }
}

#[test]
fn prefix_cache_hit_gives_identical_logits() {
    // Sequence A computes an 8-token prefix (2 blocks of 4) and its own tail; sequence B
    // shares A's two prefix blocks, as a prefix-cache hit does, and computes only its tail.
    // B's logits equal B computed from scratch in its own blocks, bit for bit.
    let w = synthesize(&ModelConfig::tiny(), 4);
    let prefix = &PROMPT[..8];
    let b_tokens: Vec<u32> = prefix.iter().copied().chain([72, 73, 74]).collect();
    let scratch = run_backend(&w, &b_tokens, vec![0, 1, 2], KvCacheDtype::Bf16, 1);
    let mut b = CpuBackend::new(w, 1);
    b.init_kv_cache(KvCacheSpec {
        num_blocks: 16,
        block_size: 4,
        dtype: KvCacheDtype::Bf16,
    })
    .unwrap();
    let a_tokens: Vec<u32> = prefix.iter().copied().chain([40, 41]).collect();
    b.forward(&ForwardBatch {
        token_ids: a_tokens.clone(),
        seqs: vec![SeqSegment {
            start: 0,
            len: 10,
            first_pos: 0,
            block_table: vec![6, 9, 2],
            num_logits: 1,
            state_slot: 0,
        }],
    })
    .unwrap();
    let hit = b
        .forward(&ForwardBatch {
            token_ids: b_tokens[8..].to_vec(),
            seqs: vec![SeqSegment {
                start: 0,
                len: 3,
                first_pos: 8,
                block_table: vec![6, 9, 11],
                num_logits: 3,
                state_slot: 0,
            }],
        })
        .unwrap();
    for r in 0..3 {
        assert_eq!(hit.row(r), scratch.row(8 + r), "row {r}");
    }
}

#[test]
fn bad_batches_are_errors_not_panics() {
    let w = synthesize(&ModelConfig::tiny(), 2);
    let mut b = CpuBackend::new(w, 1);
    let batch = ForwardBatch {
        token_ids: vec![1, 2],
        seqs: vec![SeqSegment {
            start: 0,
            len: 2,
            first_pos: 0,
            block_table: vec![0],
            num_logits: 1,
            state_slot: 0,
        }],
    };
    assert!(b.forward(&batch).is_err(), "no KV cache yet");
    b.init_kv_cache(KvCacheSpec {
        num_blocks: 2,
        block_size: 1,
        dtype: KvCacheDtype::Bf16,
    })
    .unwrap();
    assert!(b
        .forward(&batch)
        .unwrap_err()
        .to_string()
        .contains("does not cover"));
    let mut bad = batch.clone();
    bad.token_ids = vec![1, 9999];
    bad.seqs[0].block_table = vec![0, 1];
    assert!(b
        .forward(&bad)
        .unwrap_err()
        .to_string()
        .contains("vocabulary"));
    let mut bad = batch.clone();
    bad.seqs[0].block_table = vec![0, 5];
    assert!(b.forward(&bad).is_err());
}
