//! Quality on trained weights: perplexity of a fixed text, and the fidelity of FP8, W4A16
//! NVFP4 and emulated W4A4 NVFP4 against BF16 on identical weights (docs/fidelity.md).
//!
//! Method (the same as llama.cpp's `llama-perplexity --kl-divergence`, which compares a
//! quantized model with a reference on a text corpus):
//! - every format is teacher-forced on the same token ids of the fixed text
//!   (`tests/fixtures/text/public-domain.txt`, [`FIXED_TEXT`], kept beside e2e's probes that send it); at each position the candidate's
//!   logit row is compared with BF16's: top-1 agreement (same arg-max) and KL(P_BF16 ‖ P_cand)
//!   in nats from log-softmax in f64; and each format's perplexity, `exp(mean NLL)` of the
//!   text's next tokens;
//! - greedy agreement: each format decodes the first prompts of
//!   [`crate::runtime_eval::check::FIDELITY_PROMPTS`], encoded by the model's own tokenizer, greedily
//!   (no EOS stop); the fraction of positions where its token equals BF16's, and the mean number
//!   of tokens before the first difference.
//!
//! BF16 is the weights as loaded (a GGUF file dequantized to BF16); FP8 and NVFP4 quantize
//! those weights with [`crate::runtime::weights::ModelWeights::quantize`]; W4A4 runs the NVFP4
//! weights on the CPU backend with its activations quantized to NVFP4 per token
//! ([`crate::runtime::backend::cpu::CpuBackend::with_emulated_w4a4`]): emulated, an accuracy
//! figure only.

use serde::{Deserialize, Serialize};

pub use crate::e2e::quality::{FIXED_TEXT, FIXED_TEXT_NAME};
use crate::runtime::backend::cpu::CpuBackend;
use crate::runtime::backend::Backend;
use crate::runtime::config::{KvCacheDtype, WeightFormat};
use crate::runtime::direct::{argmax, log_softmax, DirectSession, GreedyRun};
use crate::runtime::tokenizer::Tokenizer;
use crate::runtime::weights::ModelWeights;

/// Tokens per forward pass of the teacher-forced runs (bounds the logit rows held at once).
const CHUNK: usize = 128;

/// Perplexity of a token sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Perplexity {
    /// Tokens scored (the sequence length − 1: the first token is not predicted).
    pub tokens: usize,
    /// Mean negative log-likelihood of the scored tokens, nats.
    pub mean_nll: f64,
    /// `exp(mean_nll)`.
    pub ppl: f64,
}

impl Perplexity {
    /// From a sum of NLLs over `n` tokens.
    pub fn from_sum(sum: f64, n: usize) -> Self {
        let mean = sum / n.max(1) as f64;
        Perplexity {
            tokens: n,
            mean_nll: mean,
            ppl: mean.exp(),
        }
    }
}

/// Teacher-force `ids` through `backend` (one sequence) and call `row(i, logits)` with the row
/// that predicts `ids[i + 1]`, for every `i` in `0..ids.len() - 1`.
///
/// # Errors
/// Fewer than 2 ids, or a backend failure.
pub fn teacher_force(
    backend: &mut dyn Backend,
    ids: &[u32],
    row: &mut dyn FnMut(usize, &[f32]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    anyhow::ensure!(ids.len() >= 2, "need at least 2 tokens, got {}", ids.len());
    let n = ids.len() - 1;
    let mut s = DirectSession::new(backend, 1, n, 16, KvCacheDtype::Bf16, CHUNK)?;
    let mut off = 0;
    while off < n {
        let end = (off + CHUNK).min(n);
        let rows = s.run(&[(0, off, &ids[off..end], end - off)])?;
        for (j, r) in rows
            .into_iter()
            .next()
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            row(off + j, r)?;
        }
        off = end;
    }
    Ok(())
}

/// The perplexity of `ids` under `backend`.
///
/// # Errors
/// As [`teacher_force`].
pub fn perplexity(backend: &mut dyn Backend, ids: &[u32]) -> anyhow::Result<Perplexity> {
    let mut sum = 0f64;
    teacher_force(backend, ids, &mut |i, r| {
        let lp = log_softmax(r);
        let t = ids[i + 1] as usize;
        anyhow::ensure!(t < lp.len(), "token {t} outside the vocabulary");
        sum -= lp[t];
        Ok(())
    })?;
    Ok(Perplexity::from_sum(sum, ids.len() - 1))
}

/// One format against BF16 on identical weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FormatQuality {
    /// `fp8`, `nvfp4` (W4A16) or `nvfp4-w4a4` (emulated).
    pub format: String,
    /// In words: `FP8 W8A8 (E4M3 weights and per-token activations)`, ...
    pub label: String,
    /// Whether the figure comes from an emulation (W4A4 on the CPU).
    pub emulated: bool,
    /// Teacher-forced on the text: fraction of positions where the arg-max equals BF16's.
    pub top1_agreement: f64,
    /// Teacher-forced on the text: mean KL(P_BF16 ‖ P_format), nats.
    pub mean_kl: f64,
    /// Largest per-position KL, nats.
    pub max_kl: f64,
    /// Perplexity of the text.
    pub perplexity: Perplexity,
    /// Free-running greedy: fraction of positions where the token equals BF16's.
    pub greedy_agreement: f64,
    /// Free-running greedy: mean tokens before the first difference.
    pub mean_matched_prefix: f64,
    /// 95% interval of the teacher-forced top-1 agreement: a moving-block bootstrap (blocks of
    /// [`crate::quality::BLOCK`] positions, [`crate::quality::REPS`] resamples, fixed seed) of
    /// the positions' 0/1 agreement. `None` in results written before it was measured.
    #[serde(default)]
    pub top1_ci: Option<(f64, f64)>,
    /// 95% interval of the perplexity ratio format / BF16: `exp` of the same bootstrap's
    /// interval of the mean per-token NLL difference (format − BF16, paired on the same
    /// positions; the ratio itself is `exp` of that mean). An interval that contains 1 means the
    /// change is within the noise of this text's length: the figure alone says nothing about
    /// which format is better. `None` in results written before it was measured.
    #[serde(default)]
    pub perplexity_ratio_ci: Option<(f64, f64)>,
}

impl FormatQuality {
    /// Whether the perplexity change clears the noise: its interval excludes 1. `None` when no
    /// interval was measured.
    pub fn perplexity_change_beyond_noise(&self) -> Option<bool> {
        self.perplexity_ratio_ci
            .map(|(lo, hi)| !(lo <= 1.0 && 1.0 <= hi))
    }
}

/// The 95% moving-block bootstrap interval of the mean of `x` with the quality verdict's
/// settings ([`crate::quality::BLOCK`], [`crate::quality::REPS`], [`crate::quality::BOOT_SEED`]).
fn interval(x: &[f64]) -> Option<(f64, f64)> {
    crate::quality::verdict::block_bootstrap_mean(
        x,
        crate::quality::BLOCK,
        crate::quality::REPS,
        crate::quality::BOOT_SEED,
        0.95,
    )
}

/// The fidelity study on trained weights (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityReport {
    /// The model and its identity (`checkpoint PATH (fnv1a64:...)`).
    pub model: String,
    /// `cpu` (the backend every figure comes from).
    pub backend: String,
    /// The text.
    pub text: String,
    /// Tokens of the text used (the first N of the tokenizer's ids).
    pub text_tokens: usize,
    /// Greedy prompts.
    pub prompts: usize,
    /// Greedy tokens per prompt.
    pub greedy_tokens: usize,
    /// BF16's perplexity of the text.
    pub bf16_perplexity: Perplexity,
    /// FP8, W4A16, W4A4 (emulated).
    pub formats: Vec<FormatQuality>,
    /// Whether W4A4 has a larger mean KL than W4A16 (`None` when one is missing).
    pub w4a4_worse_than_w4a16_in_kl: Option<bool>,
}

/// Sizes of the study.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QualitySpec {
    /// First N tokens of the fixed text.
    pub text_tokens: usize,
    /// First P prompts of `FIDELITY_PROMPTS`.
    pub prompts: usize,
    /// Greedy tokens per prompt.
    pub greedy_tokens: usize,
    /// CPU threads.
    pub threads: usize,
}

impl QualitySpec {
    /// What `rigbench report` and the tests run: 256 text tokens, 8 prompts × 16 greedy tokens
    /// (about four minutes of one 135M-parameter model on two cores, all formats).
    pub fn report() -> Self {
        QualitySpec {
            text_tokens: 256,
            prompts: 8,
            greedy_tokens: 16,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

fn greedy(
    b: &mut dyn Backend,
    prompts: &[Vec<u32>],
    tokens: usize,
) -> anyhow::Result<Vec<GreedyRun>> {
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    DirectSession::new(
        b,
        prompts.len(),
        longest + tokens,
        16,
        KvCacheDtype::Bf16,
        512,
    )?
    .greedy(prompts, tokens, false)
}

/// An error when SIGINT, SIGTERM or SIGHUP has arrived (`crate::signals`): the study stops at
/// its next token row or format instead of running its minutes to the end.
fn stop_if_interrupted() -> anyhow::Result<()> {
    match crate::signals::interrupted() {
        Some(sig) => anyhow::bail!("stopped by {sig} before the study finished"),
        None => Ok(()),
    }
}

/// Run the study on `weights` (BF16) with `tokenizer`, described as `model`.
///
/// # Errors
/// A text or prompt the tokenizer cannot encode, a quantization error, a backend failure; a
/// signal that stops the run (`crate::signals`), checked at every teacher-forced token row and
/// before and after each format's greedy runs (one greedy run, seconds, is not cut).
pub fn study(
    weights: &ModelWeights,
    tokenizer: &Tokenizer,
    model: &str,
    spec: QualitySpec,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<QualityReport> {
    let ids_all = tokenizer.encode(FIXED_TEXT, false)?;
    let ids: Vec<u32> = ids_all.iter().copied().take(spec.text_tokens).collect();
    anyhow::ensure!(
        ids.len() >= 2,
        "the fixed text encodes to {} tokens",
        ids.len()
    );
    let prompts: Vec<Vec<u32>> = crate::runtime_eval::check::FIDELITY_PROMPTS
        .iter()
        .take(spec.prompts)
        .map(|p| tokenizer.encode(p, false))
        .collect::<anyhow::Result<_>>()?;
    stop_if_interrupted()?;
    progress("BF16 reference");
    let mut bf16 = CpuBackend::new(weights.clone(), spec.threads);
    let mut ref_rows: Vec<Vec<f32>> = Vec::with_capacity(ids.len());
    let mut ref_nll: Vec<f64> = Vec::with_capacity(ids.len());
    teacher_force(&mut bf16, &ids, &mut |i, r| {
        ref_nll.push(-log_softmax(r)[ids[i + 1] as usize]);
        ref_rows.push(r.to_vec());
        stop_if_interrupted()
    })?;
    let bf16_ppl = Perplexity::from_sum(ref_nll.iter().sum(), ids.len() - 1);
    let ref_greedy = greedy(&mut bf16, &prompts, spec.greedy_tokens)?;
    drop(bf16);
    let mut formats = Vec::new();
    for (fmt, w4a4, id, label) in [
        (WeightFormat::Fp8, false, "fp8", "FP8 W8A8 (E4M3 weights, per-tensor scale; E4M3 activations, per-token scale)"),
        (WeightFormat::Nvfp4, false, "nvfp4", "W4A16 NVFP4 (E2M1 weights, E4M3 scale per 16, FP32 per-tensor scale; f32 activations)"),
        (WeightFormat::Nvfp4, true, "nvfp4-w4a4", "W4A4 NVFP4, emulated (W4A16's weights; activations quantized to NVFP4 per token, then multiplied in f32)"),
    ] {
        stop_if_interrupted()?;
        progress(id);
        let mut q = weights.clone();
        q.quantize(fmt)?;
        let mut b = CpuBackend::new(q, spec.threads).with_emulated_w4a4(w4a4);
        let (mut kl_sum, mut kl_max, mut nll) = (0f64, 0f64, 0f64);
        // Per position: 1 when the arg-max equals BF16's, and the NLL difference to BF16.
        let (mut agree, mut nll_diff) = (Vec::new(), Vec::new());
        teacher_force(&mut b, &ids, &mut |i, r| {
            let rr = &ref_rows[i];
            agree.push(f64::from(u8::from(argmax(r)? == argmax(rr)?)));
            let kl = crate::runtime_eval::check::kl_divergence(rr, r);
            kl_sum += kl;
            kl_max = kl_max.max(kl);
            let l = -log_softmax(r)[ids[i + 1] as usize];
            nll += l;
            nll_diff.push(l - ref_nll[i]);
            stop_if_interrupted()
        })?;
        let top1 = agree.iter().sum::<f64>();
        stop_if_interrupted()?;
        let n = ids.len() - 1;
        let g = greedy(&mut b, &prompts, spec.greedy_tokens)?;
        let (mut same, mut prefix) = (0usize, 0usize);
        for (a, c) in ref_greedy.iter().zip(&g) {
            same += a.tokens.iter().zip(&c.tokens).filter(|(x, y)| x == y).count();
            prefix += a
                .tokens
                .iter()
                .zip(&c.tokens)
                .take_while(|(x, y)| x == y)
                .count();
        }
        let total = (prompts.len() * spec.greedy_tokens).max(1) as f64;
        formats.push(FormatQuality {
            format: id.into(),
            label: label.into(),
            emulated: w4a4,
            top1_agreement: top1 / n as f64,
            mean_kl: kl_sum / n as f64,
            max_kl: kl_max,
            perplexity: Perplexity::from_sum(nll, n),
            greedy_agreement: same as f64 / total,
            mean_matched_prefix: prefix as f64 / prompts.len().max(1) as f64,
            top1_ci: interval(&agree),
            perplexity_ratio_ci: interval(&nll_diff).map(|(lo, hi)| (lo.exp(), hi.exp())),
        });
    }
    let kl = |f: &str| formats.iter().find(|x| x.format == f).map(|x| x.mean_kl);
    let order = match (kl("nvfp4"), kl("nvfp4-w4a4")) {
        (Some(a), Some(b)) => Some(b > a),
        _ => None,
    };
    Ok(QualityReport {
        model: model.to_string(),
        backend: "cpu".into(),
        text: FIXED_TEXT_NAME.into(),
        text_tokens: ids.len(),
        prompts: prompts.len(),
        greedy_tokens: spec.greedy_tokens,
        bf16_perplexity: bf16_ppl,
        formats,
        w4a4_worse_than_w4a16_in_kl: order,
    })
}

/// `1.012 (0.995–1.030)`, or the ratio alone for results written before the interval.
fn ratio_cell(f: &FormatQuality, bf16_ppl: f64) -> String {
    let ratio = f.perplexity.ppl / bf16_ppl;
    match f.perplexity_ratio_ci {
        Some((lo, hi)) => format!("{ratio:.3} ({lo:.3}–{hi:.3})"),
        None => format!("{ratio:.3}"),
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// The report section (Markdown).
pub fn render_markdown(r: &QualityReport) -> String {
    let mut o = String::from("## Fidelity on trained weights\n\n");
    o.push_str(&format!(
        "Model {}; every figure from the {} backend (format accuracy, not speed). Teacher-forced on the first {} tokens of {}; greedy on {} prompts × {} tokens. BF16 perplexity {:.3}.\n\n",
        r.model, r.backend, r.text_tokens, r.text, r.prompts, r.greedy_tokens, r.bf16_perplexity.ppl
    ));
    let rows: Vec<Vec<String>> = r
        .formats
        .iter()
        .map(|f| {
            vec![
                format!("{} vs bf16", f.format),
                match f.top1_ci {
                    Some((lo, hi)) => format!(
                        "{} ({:.1}–{:.1})",
                        pct(f.top1_agreement),
                        100.0 * lo,
                        100.0 * hi
                    ),
                    None => pct(f.top1_agreement),
                },
                format!("{:.4}", f.mean_kl),
                format!("{:.3}", f.max_kl),
                format!("{:.3}", f.perplexity.ppl),
                ratio_cell(f, r.bf16_perplexity.ppl),
                pct(f.greedy_agreement),
                format!("{:.1}", f.mean_matched_prefix),
            ]
        })
        .collect();
    o.push_str(&crate::output::table::markdown_table(
        &[
            "format",
            "top-1 agreement (teacher-forced)",
            "mean KL (nats)",
            "max KL",
            "perplexity",
            "perplexity ratio to BF16 (95% interval)",
            "greedy agreement",
            "mean tokens before divergence",
        ],
        &rows,
    ));
    o.push('\n');
    for f in &r.formats {
        o.push_str(&format!("- `{}`: {}\n", f.format, f.label));
    }
    let within: Vec<String> = r
        .formats
        .iter()
        .filter(|f| f.perplexity_change_beyond_noise() == Some(false))
        .map(|f| format!("`{}`", f.format))
        .collect();
    if r.formats.iter().any(|f| f.top1_ci.is_some()) {
        o.push_str(&format!(
            "\nIntervals: 95%, moving-block bootstrap over the {} positions (blocks of {}, paired with BF16 on the same positions).",
            r.text_tokens.saturating_sub(1),
            crate::quality::BLOCK
        ));
        if within.is_empty() {
            o.push('\n');
        } else {
            o.push_str(&format!(
                " The perplexity change of {} is within the noise of a {}-token text (its interval contains 1): this text cannot tell it from BF16; a longer corpus (`rigbench quality`) can.\n",
                within.join(", "),
                r.text_tokens
            ));
        }
    }
    match r.w4a4_worse_than_w4a16_in_kl {
        Some(true) => {
            o.push_str("\nW4A4 (emulated) is below W4A16 in KL, as 4-bit activations add error.\n")
        }
        Some(false) => o.push_str(
            "\nW4A4 (emulated) is NOT below W4A16 in KL on this text: its KL is not larger.\n",
        ),
        None => {}
    }
    o.push_str("\nMethod and the independent PyTorch emulation these figures are checked against: docs/fidelity.md.\n");
    o
}

/// The GGUF file the fidelity study of `report` runs on, for `report --model MODEL`: MODEL
/// itself when it is a GGUF file (anywhere: the study used to ignore `--model` and skip a GGUF
/// outside the cache folder), else the SmolLM2 that `scripts/fetch-smollm2.sh` fetched, with a
/// note saying why MODEL was not used. Returns (path, note).
///
/// # Errors
/// No usable model: MODEL is not a GGUF file and SmolLM2 is not in the cache (the reason says
/// how to fetch it).
pub fn fidelity_model(model: &str) -> Result<(std::path::PathBuf, Option<String>), String> {
    let p = std::path::Path::new(model);
    if !model.starts_with("synthetic:") && crate::checkpoint::gguf::is_gguf_path(p) && p.is_file() {
        return Ok((p.to_path_buf(), None));
    }
    let note = (model != DEFAULT_RUNTIME_MODEL).then(|| {
        format!("--model {model} is not a GGUF file (the study reads GGUF checkpoints), so it ran on SmolLM2")
    });
    match crate::runtime::gguf_model::smollm2_if_cached() {
        Some(s) => Ok((s, note)),
        None => Err(format!(
            "no trained model: --model is not a GGUF file and the SmolLM2 GGUF is not at {}; run scripts/fetch-smollm2.sh to fetch it, or pass --model FILE.gguf (fidelity figures below, if any, come from random weights)",
            crate::runtime::gguf_model::smollm2_path()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "(no cache folder: HOME unset)".into())
        )),
    }
}

/// `report`'s runtime model when `--model` is not given (see `cli/report.rs`).
pub const DEFAULT_RUNTIME_MODEL: &str = "synthetic:qwen3-8b";

/// How the study names a loaded GGUF model: its file, content hash, and what its "BF16"
/// reference is. A GGUF holds quantized weights (SmolLM2's file is Q4_1): the reference the
/// study calls BF16 is those weights dequantized to BF16, not the model's original BF16
/// release, and every other format is quantized from it.
pub fn describe_gguf(path: &std::path::Path, content_hash: &str, notes: &[String]) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    let types = notes
        .iter()
        .find_map(|n| {
            n.strip_prefix("GGUF weights (")
                .and_then(|r| r.split_once(')'))
                .map(|(t, _)| t.to_string())
        })
        .unwrap_or_else(|| "its GGUF types".into());
    format!(
        "{name} {} ({content_hash}); \"BF16\" below is this file's {types} weights dequantized to BF16, not the original BF16 model",
        path.display()
    )
}

#[cfg(test)]
mod model_choice_tests {
    use super::*;

    #[test]
    fn a_gguf_model_anywhere_is_the_one_studied_and_the_bf16_label_says_what_it_is() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("mine.Q8_0.gguf");
        std::fs::write(&p, b"GGUF\x03\0\0\0").unwrap();
        let (got, note) = fidelity_model(p.to_str().unwrap()).unwrap();
        assert_eq!((got, note), (p.clone(), None));
        // Not a GGUF: SmolLM2 when fetched, with the reason; else the reason it cannot run.
        match fidelity_model("synthetic:tiny") {
            Ok((_, note)) => assert!(note.unwrap().contains("not a GGUF file")),
            Err(why) => assert!(why.contains("--model FILE.gguf"), "{why}"),
        }
        let name = describe_gguf(
            &p,
            "fnv1a64:0",
            &["GGUF weights (F32, Q4_1) dequantized to BF16 at load".into()],
        );
        assert!(
            name.contains("mine.Q8_0.gguf")
                && name.contains("F32, Q4_1 weights dequantized to BF16"),
            "{name}"
        );
    }
}

#[cfg(test)]
mod interval_tests {
    use super::*;

    fn format(id: &str, ppl: f64, ci: Option<(f64, f64)>) -> FormatQuality {
        FormatQuality {
            format: id.into(),
            label: id.into(),
            emulated: false,
            top1_agreement: 0.92,
            mean_kl: 0.02,
            max_kl: 0.2,
            perplexity: Perplexity::from_sum(255.0 * ppl.ln(), 255),
            greedy_agreement: 0.5,
            mean_matched_prefix: 9.0,
            top1_ci: ci.map(|_| (0.88, 0.95)),
            perplexity_ratio_ci: ci,
        }
    }

    fn report(formats: Vec<FormatQuality>) -> QualityReport {
        QualityReport {
            model: "m".into(),
            backend: "cpu".into(),
            text: "t".into(),
            text_tokens: 256,
            prompts: 8,
            greedy_tokens: 16,
            bf16_perplexity: Perplexity::from_sum(255.0 * 18.0f64.ln(), 255),
            formats,
            w4a4_worse_than_w4a16_in_kl: None,
        }
    }

    #[test]
    fn a_perplexity_change_whose_interval_holds_1_is_reported_as_within_noise() {
        let fp8 = format("fp8", 18.1, Some((0.99, 1.02)));
        let w4 = format("nvfp4", 23.0, Some((1.2, 1.4)));
        assert_eq!(fp8.perplexity_change_beyond_noise(), Some(false));
        assert_eq!(w4.perplexity_change_beyond_noise(), Some(true));
        let md = render_markdown(&report(vec![fp8, w4]));
        assert!(
            md.contains("The perplexity change of `fp8` is within the noise of a 256-token text"),
            "{md}"
        );
        assert!(!md.contains("`nvfp4` is within"), "{md}");
        assert!(md.contains(" 1.006 (0.990–1.020) "), "{md}");
        assert!(md.contains("92.0% (88.0–95.0)"), "{md}");
        // Results written before the intervals: no interval, no noise sentence, the ratio alone.
        let old = format("fp8", 18.1, None);
        assert_eq!(old.perplexity_change_beyond_noise(), None);
        let md = render_markdown(&report(vec![old]));
        assert!(
            !md.contains("Intervals:") && md.contains(" 1.006 ") && !md.contains("1.006 ("),
            "{md}"
        );
    }

    #[test]
    fn results_without_the_intervals_still_read() {
        let f = format("fp8", 18.1, Some((0.99, 1.02)));
        let mut v = serde_json::to_value(&f).unwrap();
        let o = v.as_object_mut().unwrap();
        o.remove("top1_ci");
        o.remove("perplexity_ratio_ci");
        let back: FormatQuality = serde_json::from_value(v).unwrap();
        assert_eq!((back.top1_ci, back.perplexity_ratio_ci), (None, None));
    }

    #[test]
    fn the_interval_of_a_paired_difference_brackets_its_mean() {
        // Per-token NLL differences of a format against BF16: independent noise uniform on
        // ±0.3 (standard deviation 0.17, so a standard error of about 0.011 over 255
        // positions), centred, plus a shift: +0.005 nats is not resolved; +0.3 is.
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let raw: Vec<f64> = (0..255).map(|_| rng.random_range(-0.3..0.3)).collect();
        let centre = raw.iter().sum::<f64>() / raw.len() as f64;
        let noise: Vec<f64> = raw.iter().map(|x| x - centre).collect();
        let small: Vec<f64> = noise.iter().map(|x| x + 0.005).collect();
        let large: Vec<f64> = noise.iter().map(|x| x + 0.3).collect();
        let (lo, hi) = interval(&small).unwrap();
        assert!(lo < 0.0 && hi > 0.0, "{lo} {hi}");
        let (lo, hi) = interval(&large).unwrap();
        assert!(lo > 0.0 && lo < 0.3 && hi > 0.3, "{lo} {hi}");
    }
}
