//! Driving a [`Backend`] directly, without the scheduler or the engine thread: a fixed set of
//! sequences, each with its own contiguous run of KV blocks, prefilled in chunks and decoded
//! greedily in one batch. The correctness checks (`crate::runtime_eval::check`), the runtime
//! benchmarks (`crate::runtime_eval::bench`) and the fidelity study (`crate::runtime_eval::quality`)
//! use it so that they run unchanged on any backend (CPU or CUDA): they take `&mut dyn Backend`.
//!
//! Greedy decoding takes the arg-max of each logit row, ties to the lowest token id (as
//! `torch.argmax`, which transformers' greedy search uses).

use super::backend::{Backend, ForwardBatch, KvCacheSpec, SeqSegment};
use super::config::KvCacheDtype;

/// Index of the largest value, ties to the lowest index.
///
/// # Errors
/// An empty row or a NaN (a broken forward pass must not look like a token).
pub fn argmax(row: &[f32]) -> anyhow::Result<u32> {
    anyhow::ensure!(!row.is_empty(), "empty logit row");
    let mut best = 0usize;
    for (i, &v) in row.iter().enumerate() {
        anyhow::ensure!(!v.is_nan(), "logit {i} is NaN");
        if v > row[best] {
            best = i;
        }
    }
    Ok(best as u32)
}

/// `log softmax(row)` in f64 (max-subtracted, so large logits do not overflow).
pub fn log_softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
    let z: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
    let lz = m + z.ln();
    row.iter().map(|&v| v as f64 - lz).collect()
}

/// One sequence's greedy continuation.
#[derive(Debug, Clone, PartialEq)]
pub struct GreedyRun {
    /// Generated token ids.
    pub tokens: Vec<u32>,
    /// The logit row each token was taken from (kept only when asked for).
    pub logits: Vec<Vec<f32>>,
}

/// A backend with a KV cache laid out for `num_seqs` sequences of up to `max_len` tokens.
pub struct DirectSession<'a> {
    backend: &'a mut dyn Backend,
    num_seqs: usize,
    block_size: usize,
    blocks_per_seq: usize,
    max_batch_tokens: usize,
}

impl std::fmt::Debug for DirectSession<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectSession")
            .field("backend", &self.backend.name())
            .field("num_seqs", &self.num_seqs)
            .field("blocks_per_seq", &self.blocks_per_seq)
            .finish()
    }
}

impl<'a> DirectSession<'a> {
    /// Allocate the backend's KV cache (replacing any previous one) for `num_seqs` sequences of
    /// at most `max_len` tokens in blocks of `block_size`; forward passes carry at most
    /// `max_batch_tokens` tokens (longer prefills are chunked).
    ///
    /// # Errors
    /// Zero sizes, or the backend cannot allocate the cache.
    pub fn new(
        backend: &'a mut dyn Backend,
        num_seqs: usize,
        max_len: usize,
        block_size: usize,
        kv_dtype: KvCacheDtype,
        max_batch_tokens: usize,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            num_seqs > 0 && max_len > 0 && block_size > 0 && max_batch_tokens > 0,
            "direct session sizes must be positive (sequences {num_seqs}, length {max_len}, block {block_size}, batch tokens {max_batch_tokens})"
        );
        let blocks_per_seq = max_len.div_ceil(block_size);
        backend.init_kv_cache(KvCacheSpec {
            num_blocks: num_seqs * blocks_per_seq,
            block_size,
            dtype: kv_dtype,
        })?;
        // One recurrent-state slot per sequence (hybrids; a no-op for dense decoders).
        backend.init_state_slots(num_seqs)?;
        Ok(DirectSession {
            backend,
            num_seqs,
            block_size,
            blocks_per_seq,
            max_batch_tokens,
        })
    }

    /// The backend.
    pub fn backend(&mut self) -> &mut dyn Backend {
        self.backend
    }

    /// Longest sequence the cache holds.
    pub fn max_len(&self) -> usize {
        self.blocks_per_seq * self.block_size
    }

    fn table(&self, seq: usize, len: usize) -> Vec<u32> {
        let first = seq * self.blocks_per_seq;
        (first..first + len.div_ceil(self.block_size))
            .map(|b| b as u32)
            .collect()
    }

    /// Run `parts` — `(sequence, first position, tokens, logits wanted for the last n tokens)` —
    /// packing them into forward passes of at most `max_batch_tokens` tokens (a long part is cut
    /// into chunks; only its last chunk asks for logits). Returns each part's logit rows.
    ///
    /// # Errors
    /// A sequence index out of range, a part longer than the cache, or a backend failure.
    pub fn run(
        &mut self,
        parts: &[(usize, usize, &[u32], usize)],
    ) -> anyhow::Result<Vec<Vec<Vec<f32>>>> {
        let mut out: Vec<Vec<Vec<f32>>> = vec![Vec::new(); parts.len()];
        // Chunks: (part, first position, tokens, logits).
        let mut chunks: Vec<(usize, usize, &[u32], usize)> = Vec::new();
        for (pi, &(seq, pos, toks, nl)) in parts.iter().enumerate() {
            anyhow::ensure!(seq < self.num_seqs, "sequence {seq} of {}", self.num_seqs);
            anyhow::ensure!(
                !toks.is_empty() && nl <= toks.len(),
                "part {pi}: {} tokens, {nl} logits",
                toks.len()
            );
            anyhow::ensure!(
                pos + toks.len() <= self.max_len(),
                "sequence {seq} would reach {} tokens; the session holds {}",
                pos + toks.len(),
                self.max_len()
            );
            let mut off = 0;
            while off < toks.len() {
                let n = (toks.len() - off).min(self.max_batch_tokens);
                let last = off + n == toks.len();
                if last && nl > n {
                    anyhow::bail!(
                        "part {pi} asks for {nl} logit rows but forward passes carry at most {} tokens",
                        self.max_batch_tokens
                    );
                }
                chunks.push((
                    pi,
                    pos + off,
                    &toks[off..off + n],
                    if last { nl } else { 0 },
                ));
                off += n;
            }
        }
        let mut i = 0;
        while i < chunks.len() {
            let mut batch = ForwardBatch::default();
            let mut members = Vec::new();
            while i < chunks.len() {
                let (pi, pos, toks, nl) = chunks[i];
                if !batch.token_ids.is_empty()
                    && batch.token_ids.len() + toks.len() > self.max_batch_tokens
                {
                    break;
                }
                // One chunk of a sequence per pass (its later chunk needs the earlier's KV).
                if members.iter().any(|&m: &usize| parts[m].0 == parts[pi].0) {
                    break;
                }
                batch.seqs.push(SeqSegment {
                    start: batch.token_ids.len(),
                    len: toks.len(),
                    first_pos: pos,
                    block_table: self.table(parts[pi].0, pos + toks.len()),
                    num_logits: nl,
                    state_slot: parts[pi].0 as u32,
                });
                batch.token_ids.extend_from_slice(toks);
                members.push(pi);
                i += 1;
            }
            let logits = self.backend.forward(&batch)?;
            anyhow::ensure!(
                logits.rows() == batch.num_logits(),
                "the backend returned {} logit rows for {} asked",
                logits.rows(),
                batch.num_logits()
            );
            let mut row = 0;
            for (seg, &pi) in batch.seqs.iter().zip(&members) {
                for _ in 0..seg.num_logits {
                    out[pi].push(logits.row(row).to_vec());
                    row += 1;
                }
            }
        }
        Ok(out)
    }

    /// Greedy continuations of `prompts` (sequence `i` holds prompt `i`), `new_tokens` each,
    /// decoded in one batch; no EOS stop. `keep_logits` keeps each token's logit row.
    ///
    /// # Errors
    /// More prompts than sequences, a prompt plus continuation longer than the cache, a NaN
    /// logit, or a backend failure.
    pub fn greedy(
        &mut self,
        prompts: &[Vec<u32>],
        new_tokens: usize,
        keep_logits: bool,
    ) -> anyhow::Result<Vec<GreedyRun>> {
        self.greedy_masked(prompts, new_tokens, keep_logits, &[])
    }

    /// [`Self::greedy`] with the ids in `masked` never chosen (their logits count as −∞, as
    /// transformers' `min_new_tokens` does to the EOS ids); kept logit rows are unmasked.
    ///
    /// # Errors
    /// As [`Self::greedy`].
    pub fn greedy_masked(
        &mut self,
        prompts: &[Vec<u32>],
        new_tokens: usize,
        keep_logits: bool,
        masked: &[u32],
    ) -> anyhow::Result<Vec<GreedyRun>> {
        anyhow::ensure!(
            prompts.len() <= self.num_seqs,
            "{} prompts for a session of {} sequences",
            prompts.len(),
            self.num_seqs
        );
        let mut runs: Vec<GreedyRun> = prompts
            .iter()
            .map(|_| GreedyRun {
                tokens: Vec::with_capacity(new_tokens),
                logits: Vec::new(),
            })
            .collect();
        if new_tokens == 0 {
            return Ok(runs);
        }
        let parts: Vec<(usize, usize, &[u32], usize)> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| (i, 0, p.as_slice(), 1))
            .collect();
        let rows = self.run(&parts)?;
        let take = |runs: &mut Vec<GreedyRun>, i: usize, row: &[f32]| -> anyhow::Result<u32> {
            let t = if masked.is_empty() {
                argmax(row)?
            } else {
                let mut m = row.to_vec();
                for &id in masked {
                    if let Some(v) = m.get_mut(id as usize) {
                        *v = f32::NEG_INFINITY;
                    }
                }
                argmax(&m)?
            };
            runs[i].tokens.push(t);
            if keep_logits {
                runs[i].logits.push(row.to_vec());
            }
            Ok(t)
        };
        let mut last: Vec<u32> = Vec::with_capacity(prompts.len());
        for (i, r) in rows.iter().enumerate() {
            last.push(take(&mut runs, i, &r[0])?);
        }
        for step in 1..new_tokens {
            let toks: Vec<[u32; 1]> = last.iter().map(|t| [*t]).collect();
            let parts: Vec<(usize, usize, &[u32], usize)> = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| (i, p.len() + step - 1, &toks[i][..], 1))
                .collect();
            let rows = self.run(&parts)?;
            for (i, r) in rows.iter().enumerate() {
                last[i] = take(&mut runs, i, &r[0])?;
            }
        }
        Ok(runs)
    }

    /// Teacher forcing: the logit rows that predict each token of `continuation` after
    /// `prompt` (one prefill of `prompt + continuation[..n-1]` on sequence `seq`).
    ///
    /// # Errors
    /// An empty prompt or continuation, too long for the cache, or a backend failure.
    pub fn teacher_forced(
        &mut self,
        seq: usize,
        prompt: &[u32],
        continuation: &[u32],
    ) -> anyhow::Result<Vec<Vec<f32>>> {
        anyhow::ensure!(
            !prompt.is_empty() && !continuation.is_empty(),
            "empty prompt or continuation"
        );
        let mut toks = prompt.to_vec();
        toks.extend_from_slice(&continuation[..continuation.len() - 1]);
        let (len, n) = (toks.len(), continuation.len());
        // Chunk by chunk; the rows wanted (the last n positions) are a suffix of each chunk
        // they fall in.
        let mut rows = Vec::with_capacity(n);
        let mut off = 0;
        while off < len {
            let end = (off + self.max_batch_tokens).min(len);
            let nl = end.saturating_sub(off.max(len - n));
            let r = self.run(&[(seq, off, &toks[off..end], nl)])?;
            rows.extend(r.into_iter().next().unwrap_or_default());
            off = end;
        }
        anyhow::ensure!(
            rows.len() == n,
            "teacher forcing returned {} rows for {n}",
            rows.len()
        );
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::backend::cpu::CpuBackend;
    use crate::runtime::config::ModelConfig;
    use crate::runtime::weights::synthesize;

    #[test]
    fn argmax_ties_low_and_refuses_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]).unwrap(), 1);
        assert!(argmax(&[1.0, f32::NAN]).is_err());
        assert!(argmax(&[]).is_err());
        let l = log_softmax(&[1000.0, 1000.0]);
        assert!((l[0] - (0.5f64).ln()).abs() < 1e-12);
    }

    #[test]
    fn chunked_batched_and_teacher_forced_agree() {
        let w = synthesize(&ModelConfig::tiny(), 4);
        let prompts: Vec<Vec<u32>> = vec![(1..20).collect(), vec![5, 6, 7], (30..41).collect()];
        let mut a = CpuBackend::new(w.clone(), 1);
        let mut b = CpuBackend::new(w, 1);
        let ga = DirectSession::new(&mut a, 3, 64, 16, KvCacheDtype::Bf16, 512)
            .unwrap()
            .greedy(&prompts, 12, true)
            .unwrap();
        // Tiny passes (5 tokens) chunk every prefill; the tokens do not change.
        let mut sb = DirectSession::new(&mut b, 3, 64, 4, KvCacheDtype::Bf16, 5).unwrap();
        let gb = sb.greedy(&prompts, 12, true).unwrap();
        for (x, y) in ga.iter().zip(&gb) {
            assert_eq!(x.tokens, y.tokens);
        }
        // Teacher forcing on the greedy tokens reproduces the greedy logit rows.
        let rows = sb.teacher_forced(0, &prompts[0], &gb[0].tokens).unwrap();
        assert_eq!(rows.len(), 12);
        for (r, g) in rows.iter().zip(&gb[0].logits) {
            let d = r
                .iter()
                .zip(g)
                .map(|(p, q)| (p - q).abs())
                .fold(0f32, f32::max);
            assert!(d < 1e-4, "{d}");
        }
        assert!(
            sb.greedy(&[vec![1; 70]], 1, false).is_err(),
            "longer than the cache"
        );
    }
}
