//! Sampling: greedy (temperature 0) or temperature / top-k / top-p with a seeded generator,
//! with vLLM's semantics: temperature below 1e-5 is greedy (`_SAMPLING_EPS`), top-k ≤ 0 or ≥
//! vocab is off, top-p keeps the smallest set of most likely tokens whose mass reaches p.
//! Greedy ties go to the lowest id.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Temperatures below this are greedy (vLLM `_SAMPLING_EPS`).
pub const SAMPLING_EPS: f32 = 1e-5;

/// Per-request sampling settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; < 1e-5 is greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1].
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 = off.
    pub top_k: usize,
    /// Seed of the request's generator (None: drawn from the engine's seed and the request id).
    pub seed: Option<u64>,
    /// Log-probabilities of the generated tokens, with this many alternatives each (OpenAI
    /// `logprobs` / `top_logprobs`); `None` = none.
    pub logprobs: Option<usize>,
    /// Log-probabilities of the prompt tokens, with this many alternatives each (vLLM
    /// `prompt_logprobs`, and completions' `echo` with `logprobs`); `None` = none. The
    /// request's prompt is then computed in full (no prefix-cache hit).
    pub prompt_logprobs: Option<usize>,
    /// vLLM's `min_tokens`: the EOS ids are never sampled, and stop strings never end the
    /// request, until this many tokens are generated (vLLM's `MinTokensLogitsProcessor` and its
    /// stop check; 0 = off). The engine arms the mask per step ([`Sampler::mask_eos`]).
    pub min_tokens: usize,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
            logprobs: None,
            prompt_logprobs: None,
            min_tokens: 0,
        }
    }
}

impl SamplingParams {
    /// Whether this is greedy decoding.
    pub fn is_greedy(&self) -> bool {
        self.temperature < SAMPLING_EPS
    }
}

/// A request's sampler (its generator advances with every random draw).
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    seed: u64,
    /// Ids never sampled (their logits count as −∞), e.g. special tokens under `ignore_eos`.
    suppressed: Option<std::sync::Arc<Vec<u32>>>,
    /// The EOS ids `min_tokens` masks, and whether the mask is armed for the next draw.
    eos_mask: Option<(std::sync::Arc<Vec<u32>>, bool)>,
}

/// Index of the largest value (lowest index on ties; NaN never wins).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut bv = f32::NEG_INFINITY;
    for (i, v) in x.iter().enumerate() {
        if *v > bv {
            bv = *v;
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    /// A sampler seeded with `params.seed`, else `fallback_seed`.
    pub fn new(params: SamplingParams, fallback_seed: u64) -> Self {
        let seed = params.seed.unwrap_or(fallback_seed);
        Sampler {
            params,
            rng: StdRng::seed_from_u64(seed),
            seed,
            suppressed: None,
            eos_mask: None,
        }
    }

    /// The EOS ids that `min_tokens` keeps from being sampled while [`Self::mask_eos`] is armed
    /// (no effect when `params.min_tokens` is 0).
    pub fn with_min_tokens_eos(mut self, eos: std::sync::Arc<Vec<u32>>) -> Self {
        self.eos_mask = (self.params.min_tokens > 0 && !eos.is_empty()).then_some((eos, false));
        self
    }

    /// Arm the `min_tokens` mask for the next draws when `generated < params.min_tokens`
    /// (`generated`: tokens this request has produced so far), disarm it otherwise. Returns
    /// whether it is armed.
    pub fn mask_eos(&mut self, generated: usize) -> bool {
        let on = generated < self.params.min_tokens;
        match &mut self.eos_mask {
            Some((_, armed)) => {
                *armed = on;
                on
            }
            None => false,
        }
    }

    /// Never sample the ids in `ids` (see
    /// [`crate::runtime::tokenizer::Tokenizer::suppressed_under_ignore_eos`]).
    pub fn with_suppressed(mut self, ids: std::sync::Arc<Vec<u32>>) -> Self {
        self.suppressed = (!ids.is_empty()).then_some(ids);
        self
    }

    /// `logits` with the suppressed ids at −∞ (borrowed when nothing is suppressed).
    pub fn masked<'a>(&self, logits: &'a [f32]) -> std::borrow::Cow<'a, [f32]> {
        let eos = match &self.eos_mask {
            Some((ids, true)) => Some(ids),
            _ => None,
        };
        match (&self.suppressed, eos) {
            (None, None) => std::borrow::Cow::Borrowed(logits),
            (a, b) => {
                let mut v = logits.to_vec();
                for &i in a.iter().chain(b).flat_map(|ids| ids.iter()) {
                    if let Some(x) = v.get_mut(i as usize) {
                        *x = f32::NEG_INFINITY;
                    }
                }
                // Everything suppressed (cannot happen with a real vocabulary): fall back.
                if v.iter().all(|x| *x == f32::NEG_INFINITY) {
                    return std::borrow::Cow::Borrowed(logits);
                }
                std::borrow::Cow::Owned(v)
            }
        }
    }

    /// The greedy choice among the ids not suppressed.
    pub fn greedy(&self, logits: &[f32]) -> u32 {
        argmax(&self.masked(logits))
    }

    /// The seed of this request's generator (its own, or the fallback).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The settings.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The processed distribution (temperature, top-k, top-p), or `None` when greedy.
    pub fn distribution(&self, logits: &[f32]) -> Option<Vec<f32>> {
        if self.params.is_greedy() {
            return None;
        }
        let logits: &[f32] = &self.masked(logits);
        let t = self.params.temperature;
        let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut p: Vec<f32> = logits.iter().map(|l| ((l - max) / t).exp()).collect();
        let n = p.len();
        let k = self.params.top_k;
        if k > 0 && k < n {
            // Threshold at the k-th largest value; ties at the threshold are kept, as a sort-based
            // implementation keeping values >= the k-th would.
            let mut tmp = p.clone();
            let (_, kth, _) = tmp.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
            let kth = *kth;
            p.iter_mut().filter(|v| **v < kth).for_each(|v| *v = 0.0);
        }
        let z: f32 = p.iter().sum();
        p.iter_mut().for_each(|v| *v /= z);
        if self.params.top_p < 1.0 {
            let mut idx: Vec<u32> = (0..n as u32).filter(|i| p[*i as usize] > 0.0).collect();
            idx.sort_by(|a, b| p[*b as usize].total_cmp(&p[*a as usize]).then(a.cmp(b)));
            let mut cum = 0f32;
            let mut keep = idx.len();
            for (j, i) in idx.iter().enumerate() {
                cum += p[*i as usize];
                if cum >= self.params.top_p {
                    keep = j + 1;
                    break;
                }
            }
            for i in &idx[keep..] {
                p[*i as usize] = 0.0;
            }
            let z: f32 = p.iter().sum();
            p.iter_mut().for_each(|v| *v /= z);
        }
        Some(p)
    }

    /// Draw from a distribution (inverse CDF; falls back to its argmax on rounding).
    pub fn draw(&mut self, p: &[f32]) -> u32 {
        let u: f32 = self.rng.random::<f32>();
        let mut cum = 0f32;
        let mut last = 0u32;
        for (i, v) in p.iter().enumerate() {
            if *v > 0.0 {
                cum += v;
                last = i as u32;
                if u < cum {
                    return i as u32;
                }
            }
        }
        last
    }

    /// A uniform number in [0, 1) from the request's generator.
    pub fn uniform(&mut self) -> f32 {
        self.rng.random::<f32>()
    }

    /// Sample one token from logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        match self.distribution(logits) {
            None => self.greedy(logits),
            Some(p) => self.draw(&p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `min_tokens`: the EOS ids are never drawn while fewer than N tokens were generated, and
    /// are again from the N-th on; greedy and sampled alike.
    #[test]
    fn min_tokens_masks_eos_until_n() {
        // Token 1 (the EOS) is by far the most likely.
        let l = vec![0.0, 50.0, 1.0, 0.5];
        let eos = std::sync::Arc::new(vec![1u32]);
        for temperature in [0.0, 1.0] {
            let p = SamplingParams {
                temperature,
                min_tokens: 3,
                seed: Some(7),
                ..Default::default()
            };
            let mut s = Sampler::new(p, 0).with_min_tokens_eos(eos.clone());
            for generated in 0..3 {
                assert!(s.mask_eos(generated));
                for _ in 0..20 {
                    assert_ne!(s.sample(&l), 1, "EOS drawn after {generated} tokens");
                }
            }
            assert!(!s.mask_eos(3));
            assert_eq!(s.sample(&l), 1, "EOS is back once N tokens are out");
        }
        // min_tokens 0: nothing is masked, whatever the count.
        let mut s = Sampler::new(SamplingParams::default(), 0).with_min_tokens_eos(eos);
        assert!(!s.mask_eos(0));
        assert_eq!(s.greedy(&l), 1);
    }

    fn logits() -> Vec<f32> {
        vec![0.1, 2.0, 1.9, -1.0, 2.0, 0.5]
    }

    #[test]
    fn greedy_takes_first_max() {
        let mut s = Sampler::new(
            SamplingParams {
                temperature: 0.0,
                ..Default::default()
            },
            0,
        );
        assert_eq!(s.sample(&logits()), 1);
        assert!(s.distribution(&logits()).is_none());
    }

    #[test]
    fn top_k_and_top_p_restrict_support() {
        let s = Sampler::new(
            SamplingParams {
                top_k: 3,
                ..Default::default()
            },
            0,
        );
        let p = s.distribution(&logits()).unwrap();
        assert_eq!(p.iter().filter(|v| **v > 0.0).count(), 3);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        assert!(p[1] > 0.0 && p[2] > 0.0 && p[4] > 0.0);
        let s = Sampler::new(
            SamplingParams {
                top_p: 0.5,
                ..Default::default()
            },
            0,
        );
        let p = s.distribution(&logits()).unwrap();
        // 1 and 4 hold about 0.32 each: two tokens reach 0.5.
        assert_eq!(p.iter().filter(|v| **v > 0.0).count(), 2, "{p:?}");
        let s = Sampler::new(
            SamplingParams {
                top_p: 1e-6,
                ..Default::default()
            },
            0,
        );
        assert_eq!(
            s.distribution(&logits())
                .unwrap()
                .iter()
                .filter(|v| **v > 0.0)
                .count(),
            1
        );
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_follows_the_distribution() {
        let params = SamplingParams {
            temperature: 1.0,
            seed: Some(42),
            ..Default::default()
        };
        let mut a = Sampler::new(params.clone(), 0);
        let mut b = Sampler::new(params, 999);
        let l = logits();
        let sa: Vec<u32> = (0..50).map(|_| a.sample(&l)).collect();
        let sb: Vec<u32> = (0..50).map(|_| b.sample(&l)).collect();
        assert_eq!(sa, sb);
        let mut c = Sampler::new(SamplingParams::default(), 7);
        let p = c.distribution(&l).unwrap();
        let n = 20000;
        let mut counts = [0usize; 6];
        for _ in 0..n {
            counts[c.sample(&l) as usize] += 1;
        }
        for i in 0..6 {
            let f = counts[i] as f32 / n as f32;
            // 5 standard deviations of a binomial frequency at n = 20000.
            let sd = (p[i] * (1.0 - p[i]) / n as f32).sqrt();
            assert!(
                (f - p[i]).abs() < 5.0 * sd + 1e-4,
                "token {i}: {f} vs {}",
                p[i]
            );
        }
    }
}
