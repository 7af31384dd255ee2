//! Speculative decoding with an n-gram (prompt-lookup) drafter (Saxena, "Prompt Lookup
//! Decoding", 2023; vLLM's `NgramProposer`): find the last `n` tokens of the context earlier in
//! the context (longest `n` first, from `prompt_lookup_max` down to `prompt_lookup_min`; the most
//! recent earlier match wins) and propose the up to `k` tokens that followed it. The target model
//! verifies the drafts in one forward pass over `[last token, d1..dk]`.
//!
//! Verification is speculative sampling (Leviathan et al., 2023; Chen et al., 2023) with a
//! deterministic proposal: the draft distribution is one-hot, so draft `d` is accepted with
//! probability `p(d)`, and on rejection the replacement is drawn from `p` with `d` removed and
//! renormalized; when all drafts are accepted, a bonus token is drawn from the last row. With
//! greedy sampling this reduces to "accept while the draft equals the argmax", so the output is
//! exactly the output without speculation.

use super::backend::Logits;
use super::sampler::Sampler;

/// The prompt-lookup drafter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramDrafter {
    /// k: most tokens proposed per step.
    pub k: usize,
    /// Shortest n-gram matched.
    pub min_n: usize,
    /// Longest n-gram tried first.
    pub max_n: usize,
}

impl NgramDrafter {
    /// Propose up to `min(self.k, limit)` tokens continuing `context`; empty when no n-gram of
    /// the allowed sizes recurs.
    pub fn propose(&self, context: &[u32], limit: usize) -> Vec<u32> {
        let k = self.k.min(limit);
        let len = context.len();
        if k == 0 {
            return Vec::new();
        }
        for n in (self.min_n..=self.max_n.min(len.saturating_sub(1))).rev() {
            if n == 0 {
                break;
            }
            let suffix = &context[len - n..];
            // Most recent earlier occurrence: start positions len-n-1 down to 0.
            for start in (0..len - n).rev() {
                if &context[start..start + n] == suffix {
                    let from = start + n;
                    let to = (from + k).min(len);
                    if to > from {
                        return context[from..to].to_vec();
                    }
                }
            }
        }
        Vec::new()
    }
}

/// Result of verifying one sequence's drafts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Drafts accepted (a prefix of the drafts).
    pub accepted: usize,
    /// New tokens: the accepted drafts, then one token sampled by the target.
    pub tokens: Vec<u32>,
}

/// Verify `drafts` against logits rows `first_row ..= first_row + drafts.len()` (row `i` is the
/// target's prediction after the `i`-th input token: the last committed token, then each
/// draft).
pub fn verify(
    logits: &Logits,
    first_row: usize,
    drafts: &[u32],
    sampler: &mut Sampler,
) -> Verified {
    let mut tokens = Vec::with_capacity(drafts.len() + 1);
    for (i, &d) in drafts.iter().enumerate() {
        let row = logits.row(first_row + i);
        match sampler.distribution(row) {
            None => {
                let t = sampler.greedy(row);
                if t == d {
                    tokens.push(d);
                } else {
                    tokens.push(t);
                    return Verified {
                        accepted: i,
                        tokens,
                    };
                }
            }
            Some(mut p) => {
                let pd = p.get(d as usize).copied().unwrap_or(0.0);
                if sampler.uniform() < pd {
                    tokens.push(d);
                } else {
                    if (d as usize) < p.len() {
                        p[d as usize] = 0.0;
                    }
                    let z: f32 = p.iter().sum();
                    let t = if z > 0.0 {
                        p.iter_mut().for_each(|v| *v /= z);
                        sampler.draw(&p)
                    } else {
                        sampler.greedy(row)
                    };
                    tokens.push(t);
                    return Verified {
                        accepted: i,
                        tokens,
                    };
                }
            }
        }
    }
    let last = logits.row(first_row + drafts.len());
    tokens.push(sampler.sample(last));
    Verified {
        accepted: drafts.len(),
        tokens,
    }
}

/// Cumulative speculative-decoding counters (vLLM's `vllm:spec_decode_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Steps in which a sequence had at least one draft verified.
    pub num_drafts: u64,
    /// Draft tokens verified.
    pub num_draft_tokens: u64,
    /// Draft tokens accepted.
    pub num_accepted_tokens: u64,
    /// Accepted drafts by position (index 0 = first draft), length k.
    pub accepted_per_pos: Vec<u64>,
}

impl SpecStats {
    /// Counters for `k` positions.
    pub fn new(k: usize) -> Self {
        SpecStats {
            accepted_per_pos: vec![0; k],
            ..Default::default()
        }
    }

    /// Record one verification of `drafted` tokens with `accepted` accepted.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.num_drafts += 1;
        self.num_draft_tokens += drafted as u64;
        self.num_accepted_tokens += accepted as u64;
        for i in 0..accepted.min(self.accepted_per_pos.len()) {
            self.accepted_per_pos[i] += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::sampler::SamplingParams;

    #[test]
    fn drafter_finds_most_recent_longest_match() {
        let d = NgramDrafter {
            k: 3,
            min_n: 1,
            max_n: 3,
        };
        // ... 1 2 3 [9 8 7] ... 1 2 3 -> propose 9 8 7
        let ctx = [5, 1, 2, 3, 9, 8, 7, 4, 1, 2, 3];
        assert_eq!(d.propose(&ctx, 10), vec![9, 8, 7]);
        assert_eq!(d.propose(&ctx, 2), vec![9, 8]);
        // Only a 1-gram recurs; the most recent earlier "3" is followed by 9.
        let ctx = [3, 9, 6, 3];
        assert_eq!(d.propose(&ctx, 10), vec![9, 6, 3]);
        assert!(d.propose(&[1, 2, 3, 4], 10).is_empty());
        assert!(d.propose(&[7], 10).is_empty());
        let d2 = NgramDrafter {
            k: 3,
            min_n: 2,
            max_n: 3,
        };
        assert!(
            d2.propose(&[3, 9, 6, 3], 10).is_empty(),
            "1-grams below min_n are not used"
        );
    }

    #[test]
    fn greedy_verification_accepts_matching_prefix() {
        // vocab 4; argmax per row: 2, 1, 3, 0
        let rows = [
            [0.0, 0.0, 1.0, 0.0],
            [0.0, 1.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 1.0],
            [1.0, 0.0, 0.0, 0.0],
        ];
        let logits = Logits {
            vocab: 4,
            data: rows.iter().flatten().copied().collect(),
        };
        let mut s = Sampler::new(
            SamplingParams {
                temperature: 0.0,
                ..Default::default()
            },
            0,
        );
        assert_eq!(
            verify(&logits, 0, &[2, 1, 3], &mut s),
            Verified {
                accepted: 3,
                tokens: vec![2, 1, 3, 0]
            }
        );
        assert_eq!(
            verify(&logits, 0, &[2, 0, 3], &mut s),
            Verified {
                accepted: 1,
                tokens: vec![2, 1]
            }
        );
        assert_eq!(
            verify(&logits, 0, &[], &mut s),
            Verified {
                accepted: 0,
                tokens: vec![2]
            }
        );
        let mut st = SpecStats::new(3);
        st.record(3, 1);
        st.record(3, 3);
        st.record(0, 0);
        assert_eq!(
            (st.num_drafts, st.num_draft_tokens, st.num_accepted_tokens),
            (2, 6, 4)
        );
        assert_eq!(st.accepted_per_pos, vec![2, 1, 1]);
    }

    #[test]
    fn sampled_verification_never_accepts_impossible_drafts() {
        // Row 0 puts all mass (after top-k 1) on token 1: a draft of 0 is always rejected.
        let logits = Logits {
            vocab: 3,
            data: vec![0.0, 5.0, 0.0, 0.0, 0.0, 5.0],
        };
        let mut s = Sampler::new(
            SamplingParams {
                top_k: 1,
                seed: Some(3),
                ..Default::default()
            },
            0,
        );
        for _ in 0..20 {
            let v = verify(&logits, 0, &[0], &mut s);
            assert_eq!(
                v,
                Verified {
                    accepted: 0,
                    tokens: vec![1]
                }
            );
            let v = verify(&logits, 0, &[1], &mut s);
            assert_eq!(
                v,
                Verified {
                    accepted: 1,
                    tokens: vec![1, 2]
                }
            );
        }
    }
}
