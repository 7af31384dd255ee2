//! The quality comparison (`rigbench quality`, docs/quality.md): a reference endpoint (A,
//! usually BF16) against one or more candidates on the same model, through their
//! OpenAI-compatible APIs.
//!
//! - distribution fidelity, teacher-forced on a fixed corpus ([`corpus`]): per position the
//!   top-k log-probabilities of both sides ([`logprobs`]), KL both ways with the tail mass
//!   stated, top-1 agreement, Δ log-probability of the corpus token, each side's perplexity
//!   ([`fidelity`]); a noise floor, the reference against a second run of itself;
//! - a task pack of exactly checked items ([`tasks`]), per-item pass/fail for every side;
//! - the verdict ([`verdict`]): McNemar's exact test on the items, bootstrap intervals on the
//!   KL and perplexity differences, beside the candidate's speed from the same session.
//!
//! The sides are reached by URL ([`client`]); the command starts engines (`--*-cmd`, the
//! built-in runtime) and hands their URLs here.

pub mod client;
pub mod corpus;
pub mod fidelity;
pub mod logprobs;
pub mod render;
pub mod tasks;
pub mod verdict;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use client::SideRun;
use fidelity::{FidelitySummary, PairedPosition};
use verdict::{Decision, Evidence, Rules, Verdict};

/// Published bands to read the figures against (never a pass mark for another model).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Anchor {
    /// The format.
    pub format: String,
    /// The model class the band was measured on.
    pub model_class: String,
    /// Mean KL(reference‖format), nats: low and high.
    pub kl: (f64, f64),
    /// Top-1 agreement: low and high.
    pub top1: (f64, f64),
}

/// The anchors docs/quality.md cites: FP8 on a 27B-class model about KL 0.005 and top-1 97%;
/// NVFP4 KL 0.05–0.11 and top-1 87–92%.
pub fn anchors() -> Vec<Anchor> {
    vec![
        Anchor {
            format: "FP8".into(),
            model_class: "27B-class".into(),
            kl: (0.005, 0.005),
            top1: (0.97, 0.97),
        },
        Anchor {
            format: "NVFP4".into(),
            model_class: "27B-class".into(),
            kl: (0.05, 0.11),
            top1: (0.87, 0.92),
        },
    ]
}

/// Speed measured in the same session as the quality figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Speed {
    /// Task requests timed.
    pub requests: usize,
    /// Their output tokens (`usage.completion_tokens`).
    pub output_tokens: u64,
    /// Sum of their wall times, seconds.
    pub seconds: f64,
    /// `output_tokens / seconds` (prefill and decode together).
    pub output_tokens_per_s: f64,
    /// Mean wall time of a request, seconds.
    pub mean_request_s: f64,
    /// The conditions, in words.
    pub conditions: String,
}

fn speed(run: &SideRun) -> Option<Speed> {
    if run.tasks.is_empty() {
        return None;
    }
    let tokens: u64 = run.tasks.iter().filter_map(|t| t.completion_tokens).sum();
    let secs: f64 = run.tasks.iter().map(|t| t.seconds).sum();
    Some(Speed {
        requests: run.tasks.len(),
        output_tokens: tokens,
        seconds: secs,
        output_tokens_per_s: if secs > 0.0 { tokens as f64 / secs } else { 0.0 },
        mean_request_s: secs / run.tasks.len() as f64,
        conditions: "the task pack's chat requests, one at a time (concurrency 1), non-streaming; output tokens over request wall time, prefill included".into(),
    })
}

/// Task counts of a candidate against the reference, paired by item and variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskCounts {
    /// Items run on both sides (item × variant).
    pub items: usize,
    /// Passed by the reference.
    pub passed_reference: usize,
    /// Passed by the candidate.
    pub passed_candidate: usize,
    /// Passed by the reference only.
    pub reference_only: usize,
    /// Passed by the candidate only.
    pub candidate_only: usize,
}

/// One candidate against the reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateComparison {
    /// The candidate's label.
    pub name: String,
    /// How it was reached or started.
    pub how: String,
    /// The model name it served.
    pub model: String,
    /// Mean KL(reference‖candidate) from the top-k, nats.
    pub kl_ref_to_candidate: f64,
    /// Mean KL(candidate‖reference), nats.
    pub kl_candidate_to_ref: f64,
    /// Fraction of positions with the same arg-max.
    pub top1_agreement: f64,
    /// Mean KL(reference‖reference second run), nats: differences below it are noise.
    pub noise_floor_kl: f64,
    /// 95% interval of the mean per-position KL(ref‖cand) − KL(ref‖ref second run), nats.
    pub kl_excess_ci: Option<(f64, f64)>,
    /// Everything else of the corpus comparison (perplexities, Δ log-prob, tail masses).
    pub fidelity: FidelitySummary,
    /// 95% interval of the candidate/reference perplexity ratio.
    pub ppl_ratio_ci: Option<(f64, f64)>,
    /// Task counts.
    pub tasks: TaskCounts,
    /// McNemar's exact two-sided p.
    pub mcnemar_p: f64,
    /// `worse`, `tie`, `better` or `undecided`.
    pub verdict: Verdict,
    /// Items a decision would need, when undecided for want of items.
    pub would_need: Option<usize>,
    /// Why, in words.
    pub reasons: Vec<String>,
    /// The candidate's speed in this session.
    pub speed: Option<Speed>,
}

/// The `quality_comparison` section of `results.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityComparison {
    /// The reference side's label, how it was reached and its model.
    pub reference: String,
    /// How the reference was reached or started.
    pub reference_how: String,
    /// The corpus.
    pub corpus: String,
    /// SHA-256 of the corpus's files.
    pub corpus_sha256: String,
    /// Positions compared (all documents).
    pub positions: usize,
    /// Alternatives per position.
    pub top_k: usize,
    /// Where the log-probabilities came from.
    pub logprob_source: String,
    /// The task pack: generator and size.
    pub task_pack: String,
    /// Variants run.
    pub variants: Vec<String>,
    /// The reference's perplexity of the corpus.
    pub reference_perplexity: Option<f64>,
    /// The reference against its own second run.
    pub noise_floor: FidelitySummary,
    /// The reference's speed in this session.
    pub reference_speed: Option<Speed>,
    /// Thresholds of the verdict.
    pub rules: Rules,
    /// Per candidate.
    pub candidates: Vec<CandidateComparison>,
    /// Published bands, as context only.
    pub anchors: Vec<Anchor>,
    /// What the reader should know (limits met in this run).
    pub notes: Vec<String>,
}

/// Pair every position of `a` with `b`'s.
///
/// # Errors
/// The sides scored different documents or different token ids (not the same model and
/// tokenizer): named with the first difference.
pub fn pair_runs(a: &SideRun, b: &SideRun) -> anyhow::Result<Vec<PairedPosition>> {
    anyhow::ensure!(
        a.docs.len() == b.docs.len(),
        "{} scored {} documents of the corpus and {} scored {}",
        a.side.label,
        a.docs.len(),
        b.side.label,
        b.docs.len()
    );
    let mut out = Vec::new();
    for (da, db) in a.docs.iter().zip(&b.docs) {
        if da.ids != db.ids {
            let at = da.ids.iter().zip(&db.ids).position(|(x, y)| x != y);
            anyhow::bail!(
                "{} and {} tokenize `{}` differently ({} and {} tokens; first difference at token {}): not the same model and tokenizer, so their distributions cannot be compared",
                a.side.label,
                b.side.label,
                da.name,
                da.ids.len(),
                db.ids.len(),
                at.map_or_else(|| "the end of the shorter".to_string(), |i| i.to_string())
            );
        }
        anyhow::ensure!(
            da.source == db.source,
            "{} and {} gave log-probabilities of different kinds ({} and {}): their token keys do not match",
            a.side.label,
            b.side.label,
            da.source.label(),
            db.source.label()
        );
        for (pa, pb) in da.positions.iter().zip(&db.positions) {
            out.push(fidelity::pair(pa, pb).map_err(anyhow::Error::msg)?);
        }
    }
    Ok(out)
}

fn task_counts(a: &SideRun, b: &SideRun) -> TaskCounts {
    let of = |r: &SideRun| -> BTreeMap<(String, String), bool> {
        r.tasks
            .iter()
            .map(|t| ((t.id.clone(), t.variant.clone()), t.passed))
            .collect()
    };
    let (ma, mb) = (of(a), of(b));
    let mut c = TaskCounts {
        items: 0,
        passed_reference: 0,
        passed_candidate: 0,
        reference_only: 0,
        candidate_only: 0,
    };
    for (k, pa) in &ma {
        let Some(pb) = mb.get(k) else { continue };
        c.items += 1;
        c.passed_reference += usize::from(*pa);
        c.passed_candidate += usize::from(*pb);
        c.reference_only += usize::from(*pa && !pb);
        c.candidate_only += usize::from(!pa && *pb);
    }
    c
}

/// Bootstrap block of the intervals, in positions: neighbouring positions of a text are
/// correlated, so 32 consecutive ones are resampled together ([`verdict::block_bootstrap_mean`]).
pub const BLOCK: usize = 32;
/// Bootstrap resamples of the intervals.
pub const REPS: usize = 2000;
/// Seed of the bootstrap (fixed: the same data gives the same interval).
pub const BOOT_SEED: u64 = 0x9a11_7e57;

/// Compare each candidate with the reference (`floor`: the reference's second run).
///
/// # Errors
/// A side that does not pair with the reference (see [`pair_runs`]).
pub fn compare(
    reference: &SideRun,
    floor: &SideRun,
    candidates: &[SideRun],
    rules: &Rules,
    top_k: usize,
) -> anyhow::Result<QualityComparison> {
    let floor_pairs = pair_runs(reference, floor)?;
    let floor_sum = fidelity::summarize(&floor_pairs);
    let mut out = Vec::new();
    for cand in candidates {
        let pairs = pair_runs(reference, cand)?;
        let s = fidelity::summarize(&pairs);
        let excess: Vec<f64> = pairs
            .iter()
            .zip(&floor_pairs)
            .map(|(c, f)| c.kl_ab - f.kl_ab)
            .collect();
        let nll_diff: Option<Vec<f64>> = pairs
            .iter()
            .map(|p| p.nll_b.zip(p.nll_a).map(|(b, a)| b - a))
            .collect();
        let ppl_ratio_ci = nll_diff
            .and_then(|d| verdict::block_bootstrap_mean(&d, BLOCK, REPS, BOOT_SEED, 0.95))
            .map(|(lo, hi)| (lo.exp(), hi.exp()));
        let tasks = task_counts(reference, cand);
        let Decision {
            verdict,
            mcnemar_p,
            would_need,
            reasons,
        } = verdict::decide(
            &Evidence {
                items: tasks.items,
                ref_only: tasks.reference_only,
                cand_only: tasks.candidate_only,
                ppl_ratio_ci,
            },
            rules,
        );
        out.push(CandidateComparison {
            name: cand.side.label.clone(),
            how: cand.side.how.clone(),
            model: cand.model.clone(),
            kl_ref_to_candidate: s.kl_ab,
            kl_candidate_to_ref: s.kl_ba,
            top1_agreement: s.top1_agreement,
            noise_floor_kl: floor_sum.kl_ab,
            kl_excess_ci: verdict::block_bootstrap_mean(&excess, BLOCK, REPS, BOOT_SEED, 0.95),
            fidelity: s,
            ppl_ratio_ci,
            tasks,
            mcnemar_p,
            verdict,
            would_need,
            reasons,
            speed: speed(cand),
        });
    }
    let mut variants: Vec<String> = reference.tasks.iter().map(|t| t.variant.clone()).collect();
    variants.dedup();
    let mut notes = Vec::new();
    if floor_sum.kl_ab > 0.0 {
        notes.push(format!(
            "the reference is not deterministic across two runs (noise floor KL {:.2e} nats): differences of that size are noise",
            floor_sum.kl_ab
        ));
    }
    Ok(QualityComparison {
        reference: reference.side.label.clone(),
        reference_how: format!("{} (model {})", reference.side.how, reference.model),
        corpus: corpus::CORPUS_NAME.into(),
        corpus_sha256: corpus::corpus_sha256(),
        positions: floor_pairs.len(),
        top_k,
        logprob_source: reference
            .docs
            .first()
            .map_or("none", |d| d.source.label())
            .into(),
        task_pack: format!(
            "src/quality/tasks.rs, seed {:#x}: {} kinds × {} items ({}), exact answers",
            tasks::PACK_SEED,
            tasks::KINDS.len(),
            tasks::PER_KIND,
            tasks::KINDS.join(", ")
        ),
        variants,
        reference_perplexity: floor_sum.perplexity_a,
        noise_floor: floor_sum,
        reference_speed: speed(reference),
        rules: *rules,
        candidates: out,
        anchors: anchors(),
        notes,
    })
}
