//! Correctness checks of the runtime, generic over the backend (they take `&mut dyn Backend`,
//! so the same check runs on the CPU reference and on the CUDA backend):
//!
//! - [`check_reference_greedy`]: a backend's greedy continuation against token ids another
//!   implementation produced (transformers' `generate` in `reference_greedy.json` files);
//! - [`parity`]: "correct before fast": backend B against backend A on the same weights, greedy
//!   tokens and logits, run before any end-to-end timing;
//! - [`fidelity`]: a quantized backend (FP8, W4A16) against the BF16 one on identical weights:
//!   greedy token agreement, top-1 agreement and mean KL divergence, teacher-forced on the BF16
//!   tokens.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::runtime::backend::Backend;
use crate::runtime::config::KvCacheDtype;
use crate::runtime::direct::{argmax, log_softmax, DirectSession};
use crate::RigError;

/// One case of a `reference_greedy.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReferenceCase {
    /// The prompt text (for messages only).
    pub prompt: String,
    /// Prompt token ids, as the reference encoded them.
    pub prompt_ids: Vec<u32>,
    /// The reference's greedy continuation.
    pub greedy_ids: Vec<u32>,
}

/// A `reference_greedy.json`: greedy continuations produced by another implementation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReferenceGreedy {
    /// How the reference was produced (library, version, settings).
    pub source: String,
    /// The cases.
    pub cases: Vec<ReferenceCase>,
    /// Token ids the reference could not produce: transformers' `min_new_tokens` sets the EOS
    /// ids' logits to −∞ until the continuation is long enough. Empty (absent from older files)
    /// means the model's own EOS ids (`eos_token_id` of its config).
    #[serde(default)]
    pub masked_ids: Vec<u32>,
}

impl ReferenceGreedy {
    /// Read a `reference_greedy.json`.
    ///
    /// # Errors
    /// [`RigError::BadFile`] when unreadable, not JSON of this shape, or with an empty case.
    pub fn load(path: &Path) -> Result<Self, RigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| RigError::file(path, format!("cannot read: {e}")))?;
        let r: ReferenceGreedy = serde_json::from_str(&text).map_err(|e| {
            RigError::file(
                path,
                format!("not a reference_greedy.json ({{source, cases: [{{prompt, prompt_ids, greedy_ids}}]}}): {e}"),
            )
        })?;
        if r.cases.is_empty()
            || r.cases
                .iter()
                .any(|c| c.prompt_ids.is_empty() || c.greedy_ids.is_empty())
        {
            return Err(RigError::file(
                path,
                "no cases, or a case with no prompt or no continuation",
            ));
        }
        Ok(r)
    }
}

/// Logit gap (in the f32 reference's logits) under which two candidate tokens are a near-tie:
/// BF16 rounding of the activations (unit roundoff 2⁻⁸) moves logits of this tiny fixture by up
/// to about 0.02, so a gap below 0.05 can flip under BF16 arithmetic.
pub const NEAR_TIE_LOGITS: f64 = 0.05;

/// Why a backend left a reference's greedy tokens: the f32 logits at the first mismatch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MismatchExplanation {
    /// Step of the first mismatch.
    pub step: usize,
    /// The reference's token there and the backend's.
    pub tokens: (u32, u32),
    /// f32 logit of the reference's token minus the backend's (teacher-forced on the reference,
    /// on the CPU backend in f32).
    pub f32_margin: f64,
    /// Whether that margin is below the near-tie threshold.
    pub near_tie: bool,
}

/// Explain `outcome`'s first mismatch with the f32 CPU backend over `weights`, teacher-forced on
/// the reference's continuation: the gap between the reference's token and the one the backend
/// chose. `None` when the outcome matches.
///
/// # Errors
/// A backend failure, or the case not in the reference.
pub fn explain_mismatch(
    weights: &crate::runtime::weights::ModelWeights,
    reference: &ReferenceGreedy,
    outcome: &ReferenceOutcome,
    tie: f64,
) -> anyhow::Result<MismatchExplanation> {
    let step = outcome
        .first_mismatch
        .ok_or_else(|| anyhow::anyhow!("'{}' matches the reference", outcome.prompt))?;
    let case = reference
        .cases
        .iter()
        .find(|c| c.prompt == outcome.prompt)
        .ok_or_else(|| anyhow::anyhow!("'{}' is not a reference case", outcome.prompt))?;
    let mut cpu = crate::runtime::backend::cpu::CpuBackend::new(weights.clone(), 2);
    let len = case.prompt_ids.len() + case.greedy_ids.len() + 1;
    let mut s = DirectSession::new(&mut cpu, 1, len, 16, KvCacheDtype::Bf16, len)?;
    let rows = s.teacher_forced(0, &case.prompt_ids, &case.greedy_ids)?;
    let row = rows
        .get(step)
        .ok_or_else(|| anyhow::anyhow!("step {step} beyond the reference"))?;
    let (want, got) = (case.greedy_ids[step], outcome.got[step]);
    let at = |t: u32| row.get(t as usize).copied().unwrap_or(f32::NEG_INFINITY) as f64;
    let margin = at(want) - at(got);
    Ok(MismatchExplanation {
        step,
        tokens: (want, got),
        f32_margin: margin,
        near_tie: margin.abs() < tie,
    })
}

/// What a backend produced for one reference case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReferenceOutcome {
    /// The prompt text.
    pub prompt: String,
    /// The reference's tokens.
    pub expected: Vec<u32>,
    /// The backend's tokens.
    pub got: Vec<u32>,
    /// First position where they differ (`None`: every token matches).
    pub first_mismatch: Option<usize>,
}

impl ReferenceOutcome {
    /// Whether every token matches.
    pub fn matches(&self) -> bool {
        self.first_mismatch.is_none()
    }
}

/// Run the reference's prompts through `backend` greedily (as many tokens as the reference has,
/// no EOS stop) and compare token by token. The references are made with `min_new_tokens`,
/// which masks the EOS ids, so the same ids are masked here ([`ReferenceGreedy::masked_ids`],
/// else the model's EOS ids): otherwise a model whose top pick is its end-of-text token would
/// fail where the reference had no choice.
///
/// # Errors
/// A prompt token outside the model's vocabulary, or a backend failure.
pub fn check_reference_greedy(
    backend: &mut dyn Backend,
    reference: &ReferenceGreedy,
) -> anyhow::Result<Vec<ReferenceOutcome>> {
    let vocab = backend.config().vocab_size;
    let masked: Vec<u32> = if reference.masked_ids.is_empty() {
        backend.config().eos_token_ids.clone()
    } else {
        reference.masked_ids.clone()
    };
    for c in &reference.cases {
        if let Some(t) = c.prompt_ids.iter().find(|t| **t as usize >= vocab) {
            anyhow::bail!(
                "prompt '{}' has token {t}, outside the model's vocabulary of {vocab}: the reference was made for another model",
                c.prompt
            );
        }
    }
    let n = reference
        .cases
        .iter()
        .map(|c| c.greedy_ids.len())
        .max()
        .unwrap_or(0);
    let longest = reference
        .cases
        .iter()
        .map(|c| c.prompt_ids.len())
        .max()
        .unwrap_or(0);
    let prompts: Vec<Vec<u32>> = reference
        .cases
        .iter()
        .map(|c| c.prompt_ids.clone())
        .collect();
    let mut s = DirectSession::new(
        backend,
        prompts.len(),
        longest + n,
        16,
        KvCacheDtype::Bf16,
        2048,
    )?;
    let runs = s.greedy_masked(&prompts, n, false, &masked)?;
    Ok(reference
        .cases
        .iter()
        .zip(runs)
        .map(|(c, r)| {
            let got: Vec<u32> = r.tokens[..c.greedy_ids.len()].to_vec();
            let first_mismatch = c.greedy_ids.iter().zip(&got).position(|(a, b)| a != b);
            ReferenceOutcome {
                prompt: c.prompt.clone(),
                expected: c.greedy_ids.clone(),
                got,
                first_mismatch,
            }
        })
        .collect())
}

/// The parity check's tolerance on logits: for each compared row, `max |a − b|` over the
/// vocabulary divided by `max |a|` (the reference row's largest magnitude) must not exceed
/// `max_rel_logit_diff`. A greedy token that differs where the reference's top-2 margin is
/// within that tolerance (times the row's scale) is a near-tie: counted, not a failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParityTolerance {
    /// Name shown in reports (`bf16-activations-vs-f32`, ...).
    pub name: String,
    /// Largest relative logit difference accepted.
    pub max_rel_logit_diff: f32,
}

impl ParityTolerance {
    /// Identical arithmetic (the CPU backend against itself): differences must be zero.
    pub fn exact() -> Self {
        Self::named("exact", 0.0)
    }

    fn named(name: &str, max_rel_logit_diff: f32) -> Self {
        ParityTolerance {
            name: name.into(),
            max_rel_logit_diff,
        }
    }

    /// A BF16 GPU forward (BF16 activations, FP32 accumulation) against the CPU backend's f32
    /// arithmetic on the same BF16 weights: 3% of the row's largest logit (BF16 keeps 8 bits
    /// of mantissa, about 0.4% per rounding, compounded over the layers).
    pub fn bf16_vs_f32() -> Self {
        Self::named("bf16-activations-vs-f32", 0.03)
    }
    /// The GPU's FP8 or W4A16 path against the CPU backend's own FP8 or W4A16 path (same
    /// quantized weights; activation rounding differs): 6%.
    pub fn quantized_vs_cpu() -> Self {
        Self::named("quantized-gpu-vs-cpu", 0.06)
    }
}

/// A greedy token on which the two backends differ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenMismatch {
    /// Prompt index.
    pub prompt: usize,
    /// Step (0 = first generated token).
    pub step: usize,
    /// Backend A's token.
    pub a: u32,
    /// Backend B's token (its arg-max on A's prefix).
    pub b: u32,
    /// A's top-1 minus top-2 logit, relative to the row's largest magnitude.
    pub a_margin_rel: f32,
    /// Whether the margin is within the tolerance (a near-tie).
    pub near_tie: bool,
}

/// The result of [`parity`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParityReport {
    /// Backend A (the reference) and its device.
    pub a: String,
    /// Backend B and its device.
    pub b: String,
    /// Prompts compared.
    pub prompts: usize,
    /// Greedy tokens per prompt.
    pub tokens: usize,
    /// The tolerance.
    pub tolerance: ParityTolerance,
    /// Largest relative logit difference over all compared rows.
    pub max_rel_logit_diff: f32,
    /// Tokens where B's arg-max differs from A's greedy token.
    pub mismatches: Vec<TokenMismatch>,
    /// Whether the check passed: no mismatch beyond near-ties and every row within tolerance.
    pub passed: bool,
}

fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = a
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()))
        .max(f32::MIN_POSITIVE);
    let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    if d.is_nan() {
        f32::INFINITY
    } else {
        d / scale
    }
}

fn top2_margin_rel(a: &[f32]) -> f32 {
    let (mut t1, mut t2) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in a {
        if v > t1 {
            t2 = t1;
            t1 = v;
        } else if v > t2 {
            t2 = v;
        }
    }
    let scale = a
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()))
        .max(f32::MIN_POSITIVE);
    (t1 - t2) / scale
}

/// "Correct before fast": greedy-decode `prompts` on backend `a` (the reference) for `tokens`
/// steps, then teacher-force `b` on A's tokens; compare B's arg-max with A's token and the logit
/// rows under `tol`. Both backends must hold the same weights.
///
/// # Errors
/// Backends of different vocabularies, or a backend failure.
pub fn parity(
    a: &mut dyn Backend,
    b: &mut dyn Backend,
    prompts: &[Vec<u32>],
    tokens: usize,
    tol: ParityTolerance,
) -> anyhow::Result<ParityReport> {
    anyhow::ensure!(
        a.config().vocab_size == b.config().vocab_size,
        "the backends have different vocabularies ({} and {})",
        a.config().vocab_size,
        b.config().vocab_size
    );
    anyhow::ensure!(tokens > 0 && !prompts.is_empty(), "nothing to compare");
    let (a_name, b_name) = (a.device_label(), b.device_label());
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let runs = DirectSession::new(
        a,
        prompts.len(),
        longest + tokens,
        16,
        KvCacheDtype::Bf16,
        2048,
    )?
    .greedy(prompts, tokens, true)?;
    let mut sb = DirectSession::new(b, 1, longest + tokens, 16, KvCacheDtype::Bf16, 2048)?;
    let mut max_rel = 0f32;
    let mut mismatches = Vec::new();
    for (pi, (p, run)) in prompts.iter().zip(&runs).enumerate() {
        let rows = sb.teacher_forced(0, p, &run.tokens)?;
        for (step, (ra, rb)) in run.logits.iter().zip(&rows).enumerate() {
            max_rel = max_rel.max(rel_diff(ra, rb));
            let bt = argmax(rb)?;
            if bt != run.tokens[step] {
                let m = top2_margin_rel(ra);
                mismatches.push(TokenMismatch {
                    prompt: pi,
                    step,
                    a: run.tokens[step],
                    b: bt,
                    a_margin_rel: m,
                    near_tie: m <= tol.max_rel_logit_diff,
                });
            }
        }
    }
    let passed = max_rel <= tol.max_rel_logit_diff && mismatches.iter().all(|m| m.near_tie);
    Ok(ParityReport {
        a: a_name,
        b: b_name,
        prompts: prompts.len(),
        tokens,
        tolerance: tol,
        max_rel_logit_diff: max_rel,
        mismatches,
        passed,
    })
}

/// Fidelity of a quantized run against the BF16 run on identical weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FidelityReport {
    /// The candidate's weight format (`fp8`, `nvfp4`).
    pub format: String,
    /// The reference's weight format (`bf16`).
    pub reference_format: String,
    /// Prompts.
    pub prompts: usize,
    /// Tokens per prompt.
    pub tokens: usize,
    /// Free-running greedy: fraction of positions where the candidate's own greedy token equals
    /// the reference's (positions after a divergence count as they fall).
    pub greedy_agreement: f64,
    /// Free-running greedy: mean number of tokens before the first divergence.
    pub mean_matched_prefix: f64,
    /// Teacher-forced on the reference's tokens: fraction of positions where the candidate's
    /// arg-max equals the reference's token.
    pub top1_agreement: f64,
    /// Teacher-forced: mean over positions of KL(P_ref ‖ P_cand), nats, from log-softmax of
    /// the logits in f64.
    pub mean_kl: f64,
    /// Teacher-forced: largest per-position KL, nats.
    pub max_kl: f64,
}

/// KL(P ‖ Q) in nats for two logit rows (log-softmax in f64).
pub fn kl_divergence(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let lp = log_softmax(p_logits);
    let lq = log_softmax(q_logits);
    lp.iter()
        .zip(&lq)
        .map(|(a, b)| {
            if a.is_finite() {
                a.exp() * (a - b)
            } else {
                0.0
            }
        })
        .sum::<f64>()
        .max(0.0)
}

/// Compare `candidate` with `reference` (same weights, candidate quantized) over `prompts`:
/// both decode greedily for `tokens` steps; then the candidate is teacher-forced on the
/// reference's tokens, so that one early divergence does not decide the rest.
///
/// # Errors
/// Different vocabularies, or a backend failure.
pub fn fidelity(
    reference: &mut dyn Backend,
    candidate: &mut dyn Backend,
    prompts: &[Vec<u32>],
    tokens: usize,
) -> anyhow::Result<FidelityReport> {
    anyhow::ensure!(
        reference.config().vocab_size == candidate.config().vocab_size,
        "the backends have different vocabularies"
    );
    anyhow::ensure!(tokens > 0 && !prompts.is_empty(), "nothing to compare");
    let (rf, cf) = (
        reference.weight_format().id().to_string(),
        candidate.weight_format().id().to_string(),
    );
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let max_len = longest + tokens;
    let r = DirectSession::new(
        reference,
        prompts.len(),
        max_len,
        16,
        KvCacheDtype::Bf16,
        2048,
    )?
    .greedy(prompts, tokens, true)?;
    let mut cs = DirectSession::new(
        candidate,
        prompts.len(),
        max_len,
        16,
        KvCacheDtype::Bf16,
        2048,
    )?;
    let c = cs.greedy(prompts, tokens, false)?;
    let (mut same, mut prefix, mut top1, mut kl_sum, mut kl_max) =
        (0usize, 0usize, 0usize, 0f64, 0f64);
    for (i, p) in prompts.iter().enumerate() {
        same += r[i]
            .tokens
            .iter()
            .zip(&c[i].tokens)
            .filter(|(a, b)| a == b)
            .count();
        prefix += r[i]
            .tokens
            .iter()
            .zip(&c[i].tokens)
            .take_while(|(a, b)| a == b)
            .count();
        let rows = cs.teacher_forced(i, p, &r[i].tokens)?;
        for (step, (rr, cr)) in r[i].logits.iter().zip(&rows).enumerate() {
            if argmax(cr)? == r[i].tokens[step] {
                top1 += 1;
            }
            let kl = kl_divergence(rr, cr);
            kl_sum += kl;
            kl_max = kl_max.max(kl);
        }
    }
    let total = (prompts.len() * tokens) as f64;
    Ok(FidelityReport {
        format: cf,
        reference_format: rf,
        prompts: prompts.len(),
        tokens,
        greedy_agreement: same as f64 / total,
        mean_matched_prefix: prefix as f64 / prompts.len() as f64,
        top1_agreement: top1 as f64 / total,
        mean_kl: kl_sum / total,
        max_kl: kl_max,
    })
}

/// The fixed fidelity prompt set: 32 short English prompts of varied topics (prose, code,
/// lists, dialogue), encoded by the model's tokenizer without special tokens.
pub const FIDELITY_PROMPTS: [&str; 32] = [
    "The quick brown fox jumps over the lazy dog because",
    "In 1869 the transcontinental railroad was completed, which meant that",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Ingredients: two cups of flour, one egg, a pinch of salt.",
    "Q: What is the capital of Australia?\nA:",
    "The mitochondria is the powerhouse of the cell, producing",
    "Dear hiring manager, I am writing to apply for",
    "SELECT name, price FROM products WHERE",
    "Once upon a time in a small village by the sea,",
    "The derivative of x squared with respect to x is",
    "To install the package, run the following command:",
    "Photosynthesis converts light energy into",
    "She opened the door and saw that the room was",
    "1, 2, 3, 5, 8, 13, 21,",
    "The GPU's memory bandwidth limits decode because every token",
    "fn main() {\n    let v: Vec<u32> = (0..10).collect();",
    "The treaty was signed in Paris, ending the war between",
    "A haiku about autumn:\n",
    "The function returns an error when the file",
    "Water boils at one hundred degrees Celsius at",
    "User: Can you summarize this article?\nAssistant:",
    "The stock market fell sharply on Monday after",
    "<html>\n<head>\n<title>",
    "Newton's second law states that force equals",
    "The committee will meet again next Tuesday to discuss",
    "for i in range(10):\n    print(",
    "The old lighthouse keeper climbed the stairs every night",
    "In machine learning, overfitting happens when a model",
    "The recipe calls for the oven to be preheated to",
    "Chapter 1\n\nIt was a bright cold day in April, and",
    "The patient reported a headache and",
    "Translate to French: The cat is sleeping on the sofa.",
];

/// Tokens per fidelity prompt (at least 64: docs/runtime.md, "Fidelity").
pub const FIDELITY_TOKENS: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::backend::cpu::CpuBackend;
    use crate::runtime::config::{ModelConfig, WeightFormat};
    use crate::runtime::weights::synthesize;

    fn prompts(n: usize) -> Vec<Vec<u32>> {
        let tok = crate::runtime::tokenizer::Tokenizer::bytes(ModelConfig::tiny().vocab_size, &[])
            .unwrap();
        FIDELITY_PROMPTS[..n]
            .iter()
            .map(|p| tok.encode(p, false).unwrap())
            .collect()
    }

    #[test]
    fn parity_of_the_cpu_backend_with_itself() {
        let w = synthesize(&ModelConfig::tiny(), 11);
        let mut a = CpuBackend::new(w.clone(), 1);
        let mut b = CpuBackend::new(w.clone(), 2);
        let r = parity(&mut a, &mut b, &prompts(8), 64, ParityTolerance::exact()).unwrap();
        assert!(r.passed, "{r:?}");
        assert_eq!((r.prompts, r.tokens), (8, 64));
        assert_eq!(r.max_rel_logit_diff, 0.0);
        assert!(r.mismatches.is_empty());
        // Different weights: the check fails, naming where.
        let mut c = CpuBackend::new(synthesize(&ModelConfig::tiny(), 12), 1);
        let r = parity(
            &mut a,
            &mut c,
            &prompts(2),
            16,
            ParityTolerance::bf16_vs_f32(),
        )
        .unwrap();
        assert!(!r.passed);
        assert!(r.max_rel_logit_diff > 0.03);
        assert!(!r.mismatches.is_empty());
    }

    #[test]
    fn the_prompt_set_is_as_large_as_the_issue_asks() {
        assert!(FIDELITY_PROMPTS.len() >= 32 && FIDELITY_TOKENS >= 64);
        let p = prompts(FIDELITY_PROMPTS.len());
        assert!(p.iter().all(|x| !x.is_empty()));
    }

    #[test]
    fn fidelity_orders_the_formats() {
        let w = synthesize(&ModelConfig::tiny(), 5);
        let mut bf16 = CpuBackend::new(w.clone(), 2);
        let mut same = CpuBackend::new(w.clone(), 2);
        // The report runs FIDELITY_PROMPTS × FIDELITY_TOKENS; a quarter of each keeps the test
        // fast in debug builds and checks the same arithmetic.
        let (np, nt) = (FIDELITY_PROMPTS.len() / 4, FIDELITY_TOKENS / 4);
        let p = prompts(np);
        let id = fidelity(&mut bf16, &mut same, &p, nt).unwrap();
        assert_eq!((id.greedy_agreement, id.top1_agreement), (1.0, 1.0));
        assert_eq!(id.mean_kl, 0.0);
        assert_eq!(id.mean_matched_prefix, nt as f64);
        let mut kls = Vec::new();
        for fmt in [WeightFormat::Fp8, WeightFormat::Nvfp4] {
            let mut q = w.clone();
            q.quantize(fmt).unwrap();
            let mut cand = CpuBackend::new(q, 2);
            let f = fidelity(&mut bf16, &mut cand, &p, nt).unwrap();
            assert_eq!(f.format, fmt.id());
            assert_eq!((f.prompts, f.tokens), (np, nt));
            assert!(f.mean_kl > 0.0 && f.mean_kl <= f.max_kl, "{f:?}");
            assert!(f.top1_agreement < 1.0 && f.top1_agreement > 0.5, "{f:?}");
            assert!(f.greedy_agreement <= 1.0);
            kls.push(f.mean_kl);
        }
        // 4-bit weights lose more than 8-bit ones.
        assert!(kls[1] > kls[0], "{kls:?}");
    }

    /// The tiny Qwen3 saved by transformers 5.17 (`tests/fixtures/real/models/`).
    pub(crate) fn tiny_qwen3_t5() -> std::path::PathBuf {
        crate::real_fixture("models/tiny-qwen3-transformers5")
    }

    #[test]
    fn cpu_backend_reproduces_transformers_greedy() {
        let dir = tiny_qwen3_t5();
        let dir = dir.as_path();
        let hf = ModelConfig::read_hf_config(&dir.join("config.json"))
            .expect("fixture tiny-qwen3-transformers5 reads");
        let reference = ReferenceGreedy::load(&dir.join("reference_greedy.json")).unwrap();
        let w = crate::runtime::weights::load_dir(dir, &hf.config).unwrap();
        let mut b = CpuBackend::new(w.clone(), 2);
        let out = check_reference_greedy(&mut b, &reference).unwrap();
        assert_eq!(out.len(), 4);
        for o in &out {
            assert_eq!(o.expected.len(), 24);
            assert!(
                o.matches(),
                "'{}' left transformers' tokens at {:?}: {:?} vs {:?}",
                o.prompt,
                o.first_mismatch,
                o.got,
                o.expected
            );
        }
        // The fault the fixture was made for: RoPE base defaulted to 10,000 instead of read from
        // rope_parameters. The check must catch it.
        let mut wrong = w;
        wrong.config.rope_theta = 10_000.0;
        let mut b = CpuBackend::new(wrong, 2);
        let out = check_reference_greedy(&mut b, &reference).unwrap();
        assert!(out.iter().any(|o| !o.matches()));
    }

    #[test]
    fn bf16_activations_leave_the_f32_reference_only_at_a_near_tie() {
        // The CUDA backend rounds GEMM inputs and outputs to BF16; the CPU backend's GPU-rounding
        // mode does the same. On this fixture it follows transformers' f32 tokens on 3 prompts
        // and leaves 'the quick brown' at step 2, where the f32 logits of the two candidates
        // (93 and 327) differ by 0.0075: a near-tie, which the explanation must name.
        let dir = tiny_qwen3_t5();
        let dir = dir.as_path();
        let hf = ModelConfig::read_hf_config(&dir.join("config.json"))
            .expect("fixture tiny-qwen3-transformers5 reads");
        let reference = ReferenceGreedy::load(&dir.join("reference_greedy.json")).unwrap();
        let w = crate::runtime::weights::load_dir(dir, &hf.config).unwrap();
        let mut b = CpuBackend::new(w.clone(), 2).with_gpu_rounding(true);
        let out = check_reference_greedy(&mut b, &reference).unwrap();
        assert_eq!(out.iter().filter(|o| o.matches()).count(), 3);
        let miss = out.iter().find(|o| !o.matches()).unwrap();
        assert_eq!(miss.prompt, "the quick brown");
        assert_eq!(miss.first_mismatch, Some(2));
        let e = explain_mismatch(&w, &reference, miss, NEAR_TIE_LOGITS).unwrap();
        let m = e.f32_margin;
        assert!((m - 0.0075).abs() < 1e-3, "{e:?}");
        assert!(e.near_tie, "{e:?}");
        // A mismatch where the reference's choice was clear is not explained away.
        let mut fake = miss.clone();
        fake.first_mismatch = Some(0);
        fake.got[0] = (fake.expected[0] + 1) % 383;
        let e = explain_mismatch(&w, &reference, &fake, NEAR_TIE_LOGITS).unwrap();
        assert!(!e.near_tie, "{e:?}");
    }

    #[test]
    fn the_reference_check_masks_what_the_reference_masked() {
        // A reference made with the model's first greedy pick masked (as min_new_tokens masks
        // EOS): the check passes only when it masks the same id.
        let w = synthesize(&ModelConfig::tiny(), 9);
        let p = prompts(2);
        let mut b = CpuBackend::new(w.clone(), 1);
        let first = DirectSession::new(&mut b, 2, 128, 16, KvCacheDtype::Bf16, 512)
            .unwrap()
            .greedy(&p, 1, false)
            .unwrap()[0]
            .tokens[0];
        let masked = DirectSession::new(&mut b, 2, 128, 16, KvCacheDtype::Bf16, 512)
            .unwrap()
            .greedy_masked(&p, 8, false, &[first])
            .unwrap();
        assert_ne!(masked[0].tokens[0], first);
        let mut reference = ReferenceGreedy {
            source: "test".into(),
            cases: p
                .iter()
                .zip(&masked)
                .map(|(p, r)| ReferenceCase {
                    prompt: format!("{p:?}"),
                    prompt_ids: p.clone(),
                    greedy_ids: r.tokens.clone(),
                })
                .collect(),
            masked_ids: vec![first],
        };
        let out = check_reference_greedy(&mut b, &reference).unwrap();
        assert!(out.iter().all(ReferenceOutcome::matches), "{out:?}");
        // Without the mask (the model's EOS ids instead), prompt 0 leaves at step 0.
        reference.masked_ids.clear();
        let out = check_reference_greedy(&mut b, &reference).unwrap();
        assert_eq!(out[0].first_mismatch, Some(0));
        // A file without the field reads as no explicit mask.
        let r: ReferenceGreedy = serde_json::from_str(r#"{"source":"s","cases":[]}"#).unwrap();
        assert!(r.masked_ids.is_empty());
    }

    #[test]
    fn kl_is_zero_for_equal_rows_and_positive_otherwise() {
        assert_eq!(kl_divergence(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]), 0.0);
        // Shift invariance.
        assert!(kl_divergence(&[1.0, 2.0, 3.0], &[11.0, 12.0, 13.0]) < 1e-12);
        let k = kl_divergence(&[0.0, 0.0], &[0.0, (3f32).ln()]);
        // P = (1/2, 1/2), Q = (1/4, 3/4): KL = ½ln2 + ½ln(2/3).
        let want = 0.5 * 2f64.ln() + 0.5 * (2.0f64 / 3.0).ln();
        assert!((k - want).abs() < 1e-6, "{k} vs {want}");
    }
}
