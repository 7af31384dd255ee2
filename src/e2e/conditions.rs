//! The conditions of a run, read from the engine wherever possible rather than trusted from
//! flags: engine and version, model, thinking, speculative decoding, prefix-cache temperature,
//! KV capacity and pressure, input and output lengths, and where token counts came from.
//!
//! Speculative decoding (vLLM V1 metric names and definitions): from `/metrics` counter deltas
//! across the run, acceptance rate = Δaccepted_tokens / Δdraft_tokens, mean acceptance length =
//! 1 + Δaccepted_tokens / Δdrafts, per-position acceptance = Δaccepted_tokens_per_pos[i] /
//! Δdrafts.
//!
//! Prefix cache (vLLM V1 `vllm:prefix_cache_queries` / `vllm:prefix_cache_hits`, in tokens;
//! llama.cpp `llamacpp:prompt_tokens_cached` with `llamacpp:prompt_tokens`, see
//! [`super::adapters::prefix_cache_counts`]): hit rate = Δhits / Δqueries over the run.
//!
//! KV capacity: `vllm:cache_config_info` `num_gpu_blocks` × `block_size` (or a
//! `kv_cache_size_tokens` label), SGLang's `sglang:max_total_num_tokens`, else the engine's boot
//! log.

use serde::{Deserialize, Serialize};

use super::bootlog::BootLog;
use super::client::Api;
use super::metrics::{ChunkSplit, RequestRecord, TokenSource};
use super::workload::{CacheTemp, WorkloadKind};
use crate::diagnose::prometheus::Exposition;

/// A value with the place it was read from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sourced<T> {
    /// The value.
    pub value: T,
    /// Where it came from (`/version`, `/metrics`, `boot log`, `stated by --spec-method`, ...).
    pub source: String,
}

impl<T> Sourced<T> {
    /// Shorthand.
    pub fn new(value: T, source: impl Into<String>) -> Self {
        Self {
            value,
            source: source.into(),
        }
    }
}

/// Facts about the engine, gathered once per session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineFacts {
    /// Engine name (`rigbench`, `vllm`, `sglang`, `llama.cpp`).
    pub name: Option<Sourced<String>>,
    /// Engine version.
    pub version: Option<Sourced<String>>,
    /// Model id sent with requests.
    pub model: Option<Sourced<String>>,
    /// Whether `POST /tokenize` works.
    pub tokenize: bool,
    /// The engine's context length (`/tokenize`'s `max_model_len`).
    pub max_model_len: Option<u64>,
    /// Whether `GET /metrics` answered.
    pub metrics: bool,
    /// Speculative method, if known (boot log, the flags rigbench passed, or stated).
    pub spec_method: Option<Sourced<String>>,
    /// Speculative k, if stated or configured (the metrics' position count is preferred).
    pub spec_k: Option<Sourced<u32>>,
    /// Backend, device, model provenance, weight format and KV dtype, as the built-in runtime
    /// states them in `/version` (unknown for other engines).
    #[serde(default)]
    pub runtime: Option<super::runtime_facts::RuntimeFacts>,
    /// The engine rigbench adapts to (tokenize body, KV source, cache counters).
    #[serde(default)]
    pub kind: super::adapters::EngineKind,
    /// The `POST /tokenize` body that worked, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenize_form: Option<super::client::TokenizeForm>,
    /// Why `POST /tokenize` is not used, when it is not (absent, failed, counted nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenize_note: Option<String>,
    /// Why `GET /metrics` gave nothing usable when it was tried (stalled, too large, failed);
    /// absent when it answered or the engine has no such endpoint (404).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_note: Option<String>,
    /// Why `GET /version` or `GET /v1/models` gave nothing when tried (stalled, too large,
    /// failed); empty when they answered or the engine has no such endpoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub side_notes: Vec<String>,
    /// Prompt tokens the engine adds around the prompt text (chat template, BOS), measured once
    /// per session: the engine's `usage.prompt_tokens` for a probe prompt minus the tokenizer's
    /// count of that prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_overhead: Option<Sourced<i64>>,
}

/// Whether speculative decoding was on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpecState {
    /// Off: the engine's vLLM-style metrics carry no speculative-decoding counters, or no drafts.
    Off,
    /// On: drafts were counted during the run.
    On,
    /// Cannot tell (no `/metrics`, or names that are not vLLM's).
    Unknown,
}

/// Speculative decoding during a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpecCondition {
    /// On, off or unknown.
    pub state: SpecState,
    /// How the state was established.
    pub evidence: String,
    /// Method.
    pub method: Option<Sourced<String>>,
    /// Draft tokens per step.
    pub k: Option<Sourced<u32>>,
    /// Δ drafts.
    pub drafts: Option<u64>,
    /// Δ draft tokens.
    pub draft_tokens: Option<u64>,
    /// Δ accepted tokens.
    pub accepted_tokens: Option<u64>,
    /// Δaccepted / Δdraft tokens.
    pub acceptance_rate: Option<f64>,
    /// 1 + Δaccepted / Δdrafts.
    pub mean_acceptance_length: Option<f64>,
    /// Δaccepted_per_pos[i] / Δdrafts.
    pub per_position: Vec<f64>,
}

/// Prefix-cache temperature of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheCondition {
    /// Requested temperature.
    pub temperature: CacheTemp,
    /// `POST /reset_prefix_cache` before the run: `Some(true)` done, `Some(false)` refused,
    /// `None` not offered by the engine.
    pub reset: Option<bool>,
    /// Prompts carry a salt unique to the run.
    pub salted: bool,
    /// Δ prefix-cache queries, tokens.
    pub queries: Option<u64>,
    /// Δ prefix-cache hits, tokens.
    pub hits: Option<u64>,
    /// Δhits / Δqueries.
    pub hit_rate: Option<f64>,
    /// Most hits the workload itself can explain (shared prefixes within the run), tokens.
    pub hits_allowed: u64,
    /// Whether the requested temperature is confirmed by the counters (`None` = cannot tell).
    pub verified: Option<bool>,
    /// The hit counters read (`None`: the engine exposes none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<String>,
    /// Human-readable verdict.
    pub note: String,
}

/// KV cache capacity and pressure.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KvCondition {
    /// Tokens the KV cache holds.
    pub capacity_tokens: Option<Sourced<u64>>,
    /// Tokens per block.
    pub block_size: Option<u64>,
    /// Blocks.
    pub num_blocks: Option<u64>,
    /// Largest KV-cache usage during the run (0..1): the engine's high-water mark when it keeps
    /// one (`rigbench serve`), else the largest `kv_cache_usage_perc` of the scrapes.
    pub peak_usage: Option<f64>,
    /// How `peak_usage` was obtained (high-water mark, or sampled with the scrape count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_usage_source: Option<String>,
    /// Δ preemptions.
    pub preemptions: Option<u64>,
    /// Most requests running at once (sampled).
    pub max_running: Option<f64>,
    /// Most requests waiting at once (sampled).
    pub max_waiting: Option<f64>,
    /// A disagreement between sources of the capacity, and which one was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_note: Option<String>,
}

/// Input and output lengths.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LengthCondition {
    /// Prompt tokens asked for (fixed and shared-prefix workloads).
    pub input_requested: Option<u64>,
    /// Whether every prompt was token-exact (`None` without a tokenizer).
    pub input_exact: Option<bool>,
    /// Mean prompt tokens the engine reported (chat template included).
    pub input_reported_mean: Option<f64>,
    /// Mean of (prompt tokens the engine reported − content tokens counted at preparation): the
    /// tokens the chat template adds around the user message (0 for completions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_tokens_mean: Option<f64>,
    /// `max_tokens` sent.
    pub output_requested: u32,
    /// `ignore_eos` sent (the output length is fixed).
    pub output_fixed: bool,
    /// Output tokens produced: smallest.
    pub output_min: Option<u64>,
    /// Output tokens produced: mean.
    pub output_mean: Option<f64>,
    /// Output tokens produced: largest.
    pub output_max: Option<u64>,
    /// Prompt lengths checked against the engine's `usage.prompt_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_check: Option<PromptCheck>,
}

/// Prompt lengths as prepared, checked against the prompt tokens the engine reported: for each
/// request with both, expected = tokens counted at preparation + the engine's known overhead
/// ([`EngineFacts::prompt_overhead`]); a difference beyond max([`PROMPT_TOLERANCE_REL`] ×
/// expected, [`PROMPT_TOLERANCE_TOKENS`]) is a mismatch, and any mismatch invalidates the run
/// (the prompts were not the lengths the report states). The token allowance covers a BPE merge
/// across the boundary between template and prompt text (one or two tokens on a short prompt).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PromptCheck {
    /// The overhead used, tokens.
    pub overhead: i64,
    /// Where it came from.
    pub overhead_source: String,
    /// Requests with both counts.
    pub checked: usize,
    /// Requests beyond the tolerance.
    pub mismatched: usize,
    /// Largest |reported − expected| seen, tokens.
    pub max_abs_diff: u64,
    /// The first mismatch, described.
    pub example: Option<String>,
}

/// Relative tolerance of a prompt length against the engine's count (2%).
pub const PROMPT_TOLERANCE_REL: f64 = 0.02;
/// Absolute tolerance of a prompt length against the engine's count, tokens.
pub const PROMPT_TOLERANCE_TOKENS: u64 = 2;

/// Check the prompt lengths of `records` against `overhead` (see [`PromptCheck`]); `None`
/// without an overhead or without a request that has both counts.
pub fn check_prompt_lengths(
    records: &[RequestRecord],
    overhead: Option<&Sourced<i64>>,
) -> Option<PromptCheck> {
    let o = overhead?;
    let mut c = PromptCheck {
        overhead: o.value,
        overhead_source: o.source.clone(),
        ..Default::default()
    };
    for r in records.iter().filter(|r| r.ok) {
        let (Some(counted), Some(reported)) = (r.input_tokens_counted, r.prompt_tokens) else {
            continue;
        };
        c.checked += 1;
        let expected = (counted as i64 + o.value).max(0) as u64;
        let diff = reported.abs_diff(expected);
        c.max_abs_diff = c.max_abs_diff.max(diff);
        let tol =
            ((PROMPT_TOLERANCE_REL * expected as f64).floor() as u64).max(PROMPT_TOLERANCE_TOKENS);
        if diff > tol {
            c.mismatched += 1;
            if c.example.is_none() {
                c.example = Some(format!(
                    "request {}: the engine counted {reported} prompt tokens, {expected} expected ({counted} prepared + {} overhead), off by {diff} ({:+.1}%)",
                    r.index,
                    o.value,
                    100.0 * (reported as f64 / expected.max(1) as f64 - 1.0)
                ));
            }
        }
    }
    (c.checked > 0).then_some(c)
}

/// Thinking (reasoning) condition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThinkingCondition {
    /// The API: thinking applies to chat only.
    pub api: Api,
    /// `enable_thinking` sent (`None`: not sent).
    pub sent: Option<bool>,
    /// Requests that produced reasoning text (in `reasoning_content`/`reasoning`).
    pub requests_with_reasoning: usize,
    /// Requests whose content holds `<think>` tags (no reasoning parser on the engine).
    pub requests_with_think_tags: usize,
    /// Σ reasoning tokens, when the engine reported them.
    pub reasoning_tokens: Option<u64>,
    /// A contradiction between what was sent and what came back.
    pub flag: Option<String>,
}

/// Everything recorded about the conditions of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Conditions {
    /// Engine name.
    pub engine: Option<Sourced<String>>,
    /// Engine version.
    pub engine_version: Option<Sourced<String>>,
    /// Model id.
    pub model: Option<Sourced<String>>,
    /// Workload kind.
    pub workload: WorkloadKind,
    /// Temperature sent.
    pub temperature: f64,
    /// Thinking.
    pub thinking: ThinkingCondition,
    /// Speculative decoding.
    pub spec: SpecCondition,
    /// Prefix cache.
    pub cache: CacheCondition,
    /// KV cache.
    pub kv: KvCondition,
    /// Lengths.
    pub lengths: LengthCondition,
    /// Where output token counts came from (per request; the set over the run).
    pub token_sources: Vec<TokenSource>,
    /// How tokens were assigned to chunks (the set over the run).
    pub chunk_splits: Vec<ChunkSplit>,
    /// The cross-check of `usage` against a re-tokenized count, when made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_check: Option<TokenCheck>,
}

/// The cross-check of the engine's `usage` output counts against the received text re-counted
/// by a tokenizer (the whole text at once, no special tokens added).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenCheck {
    /// The tokenizer used (`engine /tokenize`, `local tokenizer`), or why none was.
    pub source: String,
    /// Requests cross-checked.
    pub checked: usize,
    /// Requests whose counts differ by more than the tolerance.
    pub disagreeing: usize,
    /// Largest |re-counted − usage| / usage seen.
    pub max_rel_diff: f64,
    /// Tolerance, relative (0.02 = 2%).
    pub tolerance: f64,
}

/// Counter delta `after − before` (None when either side lacks data; negative = reset → None).
pub fn delta(before: Option<&Exposition>, after: Option<&Exposition>, name: &str) -> Option<f64> {
    let b = before?.sum(name)?;
    let a = after?.sum(name)?;
    (a >= b).then_some(a - b)
}

/// Gauge samples gathered while a run was going.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PollStats {
    /// Largest KV usage (0..1).
    pub peak_kv_usage: Option<f64>,
    /// Most requests running.
    pub max_running: Option<f64>,
    /// Most requests waiting.
    pub max_waiting: Option<f64>,
    /// Scrapes taken (the one at the start and the one at the end included).
    pub polls: usize,
    /// How long each scrape took, milliseconds, in order (start, in between, end).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scrape_ms: Vec<f64>,
    /// The shortest wait between scrapes during the run, seconds (the wait adapts up to twice
    /// it; see [`next_scrape_interval`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_interval_s: Option<f64>,
    /// Gauge values the engine sent that cannot be true (a usage fraction outside 0..1, a
    /// negative count) and scrapes that gave nothing (stalled, too large), each with its
    /// reason; rejected values are left out of the figures above.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<String>,
}

/// The most rejected gauge values kept per run (the first ones; the rest are the same kind).
const MAX_REJECTED: usize = 8;

/// An engine gauge checked before use: `Ok(Some(v))` for a value in `lo..=hi`, `Ok(None)` when
/// absent, `Err(reason)` for an impossible one (NaN and infinities never reach here:
/// [`Exposition::max`] skips them).
pub fn checked_gauge(name: &str, v: Option<f64>, lo: f64, hi: f64) -> Result<Option<f64>, String> {
    match v {
        None => Ok(None),
        Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(Some(x)),
        Some(x) => {
            // Short either way: -5, not -5e0; -1e308, not 309 digits.
            let shown = if x.is_finite() && x.abs() < 1e6 {
                format!("{x}")
            } else {
                format!("{x:e}")
            };
            Err(format!(
                "{name} = {shown} is impossible (allowed {lo}..={hi}); not used"
            ))
        }
    }
}

fn fmax(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The wait before the next `/metrics` scrape during a run: 50 × the last scrape's duration
/// (so scraping takes about 2% of the engine's time: a CPU vLLM spends ~14 ms per scrape),
/// kept between `min` and 2 × `min` (`min` is 1 s by default: at most one scrape every 1–2 s).
pub fn next_scrape_interval(
    last: std::time::Duration,
    min: std::time::Duration,
) -> std::time::Duration {
    (last * 50).clamp(min, min * 2)
}

impl PollStats {
    /// Fold in the scrapes gathered by another sampler (the one running during the load).
    pub fn merge(&mut self, o: &PollStats) {
        self.polls += o.polls;
        self.scrape_ms.extend_from_slice(&o.scrape_ms);
        self.peak_kv_usage = fmax(self.peak_kv_usage, o.peak_kv_usage);
        self.max_running = fmax(self.max_running, o.max_running);
        self.max_waiting = fmax(self.max_waiting, o.max_waiting);
        for r in &o.rejected {
            if self.rejected.len() < MAX_REJECTED && !self.rejected.contains(r) {
                self.rejected.push(r.clone());
            }
        }
    }

    /// Record why a scrape gave nothing (stalled, too large, refused), once per reason.
    pub fn note_failure(&mut self, why: String) {
        if self.rejected.len() < MAX_REJECTED && !self.rejected.contains(&why) {
            self.rejected.push(why);
        }
    }

    /// Record one scrape attempt that took `took` (answered or not).
    pub fn timed(&mut self, took: std::time::Duration) {
        self.scrape_ms.push(took.as_secs_f64() * 1e3);
    }

    /// Fold one scrape in (vLLM V1 `kv_cache_usage_perc`, V0 `gpu_cache_usage_perc`; llama.cpp
    /// `requests_processing` / `requests_deferred`).
    pub fn add(&mut self, e: &Exposition) {
        self.polls += 1;
        let mut check = |name: &str, alt: &str, hi: f64| {
            let v = e.min(name).or_else(|| e.min(alt)).filter(|x| *x < 0.0);
            let v = v.or_else(|| e.max(name).or_else(|| e.max(alt)));
            match checked_gauge(name, v, 0.0, hi) {
                Ok(v) => v,
                Err(why) => {
                    if self.rejected.len() < MAX_REJECTED && !self.rejected.contains(&why) {
                        self.rejected.push(why);
                    }
                    None
                }
            }
        };
        // A usage fraction above 1 by rounding (1 + 1e-6) is still a full cache.
        let kv = check(
            "vllm:kv_cache_usage_perc",
            "vllm:gpu_cache_usage_perc",
            1.0 + 1e-6,
        )
        .map(|x| x.min(1.0));
        let running = check(
            "vllm:num_requests_running",
            "llamacpp:requests_processing",
            1e9,
        );
        let waiting = check(
            "vllm:num_requests_waiting",
            "llamacpp:requests_deferred",
            1e9,
        );
        self.peak_kv_usage = fmax(self.peak_kv_usage, kv);
        self.max_running = fmax(self.max_running, running);
        self.max_waiting = fmax(self.max_waiting, waiting);
    }
}

/// Speculative decoding from counter deltas.
pub fn spec_condition(
    before: Option<&Exposition>,
    after: Option<&Exposition>,
    facts: &EngineFacts,
) -> SpecCondition {
    let mut c = SpecCondition {
        state: SpecState::Unknown,
        evidence: facts
            .metrics_note
            .clone()
            .unwrap_or_else(|| "no /metrics".into()),
        method: facts.spec_method.clone(),
        k: facts.spec_k.clone(),
        drafts: None,
        draft_tokens: None,
        accepted_tokens: None,
        acceptance_rate: None,
        mean_acceptance_length: None,
        per_position: Vec::new(),
    };
    let Some(a) = after else { return c };
    let d = |n: &str| delta(before, after, n).map(|x| x.round() as u64);
    // llama.cpp: the counters exist whether speculation is on or off, so 0 drafts says nothing
    // about the configuration (the engine's endpoints, command or log decide; see
    // `engines::fill_spec`).
    if a.has_family("llamacpp:spec_decode_num_drafts") {
        c.drafts = d("llamacpp:spec_decode_num_drafts");
        c.draft_tokens = d("llamacpp:spec_decode_num_draft_tokens");
        c.accepted_tokens = d("llamacpp:spec_decode_num_accepted_tokens");
        match c.drafts {
            Some(n) if n > 0 => {
                c.state = SpecState::On;
                c.evidence = format!("{n} drafts during the run (/metrics llamacpp: deltas)");
                if let (Some(acc), Some(dt)) = (c.accepted_tokens, c.draft_tokens) {
                    if dt > 0 {
                        c.acceptance_rate = Some(acc as f64 / dt as f64);
                    }
                    c.mean_acceptance_length = Some(1.0 + acc as f64 / n as f64);
                }
            }
            Some(_) => {
                c.evidence = "0 drafts during the run (/metrics llamacpp: counters, which exist whether speculation is on or off)".into();
            }
            None => {
                c.evidence =
                    "llamacpp: speculative counters unreadable before or after the run".into();
            }
        }
        return c;
    }
    let vllm_names = a.samples.iter().any(|s| s.name.starts_with("vllm:"));
    let has_spec = a.has_family("vllm:spec_decode_num_drafts");
    if !has_spec {
        if vllm_names {
            c.state = SpecState::Off;
            c.evidence = "off: /metrics has vLLM names but no speculative-decoding counters".into();
        } else {
            c.evidence = "/metrics has no vLLM-named counters: speculative state unknown".into();
        }
        return c;
    }
    c.drafts = d("vllm:spec_decode_num_drafts");
    c.draft_tokens = d("vllm:spec_decode_num_draft_tokens");
    c.accepted_tokens = d("vllm:spec_decode_num_accepted_tokens");
    let pos_after = a.sum_by("vllm:spec_decode_num_accepted_tokens_per_pos", "position");
    let pos_before = before
        .map(|b| b.sum_by("vllm:spec_decode_num_accepted_tokens_per_pos", "position"))
        .unwrap_or_default();
    let mut positions: Vec<(u32, f64)> = pos_after
        .iter()
        .filter_map(|(p, v)| {
            let p: u32 = p.parse().ok()?;
            Some((
                p,
                v - pos_before.get(&p.to_string()).copied().unwrap_or(0.0),
            ))
        })
        .collect();
    positions.sort_by_key(|x| x.0);
    if !positions.is_empty() {
        c.k = Some(Sourced::new(
            positions.len() as u32,
            "/metrics (accepted-per-position series)",
        ));
    }
    match c.drafts {
        Some(0) => {
            c.state = SpecState::Off;
            c.evidence = "configured, but 0 drafts during the run".into();
        }
        Some(n) => {
            c.state = SpecState::On;
            c.evidence = format!("{n} drafts during the run (/metrics deltas)");
            if let (Some(acc), Some(dt)) = (c.accepted_tokens, c.draft_tokens) {
                if dt > 0 {
                    c.acceptance_rate = Some(acc as f64 / dt as f64);
                }
                c.mean_acceptance_length = Some(1.0 + acc as f64 / n as f64);
            }
            c.per_position = positions.iter().map(|(_, v)| v / n as f64).collect();
        }
        None => {
            c.evidence =
                "speculative counters present but unreadable before or after the run".into();
        }
    }
    c
}

/// The largest block or token count taken from `vllm:cache_config_info`'s labels: 2^40 (a
/// trillion tokens is beyond any GPU's KV cache; a larger label is refused as impossible).
const MAX_KV_LABEL: f64 = (1u64 << 40) as f64;

/// KV capacity: metrics first, then the boot log.
pub fn kv_capacity(e: Option<&Exposition>, boot: Option<&BootLog>) -> KvCondition {
    let mut k = KvCondition::default();
    if let Some(e) = e {
        if let Some(l) = e.labels_of("vllm:cache_config_info") {
            let mut rejected = Vec::new();
            let mut get = |n: &str| {
                let raw = l.get(n)?;
                let v = raw.parse::<f64>().ok();
                match v.filter(|v| {
                    v.is_finite() && *v >= 0.0 && v.fract() == 0.0 && *v <= MAX_KV_LABEL
                }) {
                    Some(v) => Some(v as u64),
                    None => {
                        rejected.push(format!(
                            "/metrics cache_config_info {n}=\"{}\" is not a count (a whole number from 0 to {MAX_KV_LABEL:e}); not used",
                            raw.chars().take(40).collect::<String>()
                        ));
                        None
                    }
                }
            };
            k.block_size = get("block_size");
            k.num_blocks = get("num_gpu_blocks");
            let kv_tokens = get("kv_cache_size_tokens");
            if !rejected.is_empty() {
                k.capacity_note = Some(rejected.join("; "));
            }
            if let Some(t) = kv_tokens {
                k.capacity_tokens = Some(Sourced::new(
                    t,
                    "/metrics cache_config_info kv_cache_size_tokens",
                ));
            } else if let Some(t) = k
                .block_size
                .zip(k.num_blocks)
                .and_then(|(b, n)| b.checked_mul(n))
                .filter(|t| *t > 0)
            {
                k.capacity_tokens = Some(Sourced::new(
                    t,
                    "/metrics cache_config_info num_gpu_blocks × block_size",
                ));
            }
        }
        if k.capacity_tokens.is_none() {
            if let Some(t) = e.max("sglang:max_total_num_tokens") {
                k.capacity_tokens = Some(Sourced::new(
                    t as u64,
                    "/metrics sglang:max_total_num_tokens",
                ));
            }
        }
    }
    if k.capacity_tokens.is_none() {
        if let Some(b) = boot {
            if let Some((t, rep)) = b.kv_capacity() {
                let mut src = format!(
                    "engine log line {}",
                    rep.kv_cache_tokens_line.unwrap_or(rep.line)
                );
                if let Some(c) = rep.kv_check.as_ref().filter(|c| !c.consistent) {
                    src.push_str(&format!(
                        "; disagrees with max concurrency × length ({} tokens, {:.2}×): see the engine-log findings",
                        c.implied_tokens, c.factor
                    ));
                }
                k.capacity_tokens = Some(Sourced::new(t, src));
                k.block_size = k.block_size.or(rep.block_size);
                k.num_blocks = k.num_blocks.or(rep.gpu_blocks);
            } else if let (Some(bs), Some(rep)) = (
                k.block_size,
                b.boots.iter().rev().find(|r| r.gpu_blocks.is_some()),
            ) {
                // V0 logs give blocks only; the block size came from /metrics.
                if let Some(g) = rep.gpu_blocks {
                    k.capacity_tokens = Some(Sourced::new(
                        g * bs,
                        format!(
                            "engine log line {} GPU blocks × /metrics block_size",
                            rep.line
                        ),
                    ));
                }
            }
        }
    }
    k
}

/// What the workload implies for the cache check.
#[derive(Debug, Clone, Copy)]
pub struct CacheExpectation {
    /// Requested temperature.
    pub temperature: CacheTemp,
    /// Reset result.
    pub reset: Option<bool>,
    /// Hits the workload can explain: shared prefix × (requests − 1), plus the chat-template
    /// tokens of every request (they may precede the salt).
    pub hits_allowed: u64,
}

/// The prefix-cache verdict from counter deltas.
pub fn cache_condition(
    before: Option<&Exposition>,
    after: Option<&Exposition>,
    exp: CacheExpectation,
) -> CacheCondition {
    let counts = super::adapters::prefix_cache_counts(before, after);
    let mut c = cache_verdict(
        counts.as_ref().and_then(|c| c.queries),
        counts.as_ref().map(|c| c.hits),
        exp,
    );
    c.counters = counts.map(|c| c.source.to_string());
    c
}

/// The verdict for `h` hit tokens of `q` queried (`None`: no counters) against `exp`.
fn cache_verdict(q: Option<u64>, h: Option<u64>, exp: CacheExpectation) -> CacheCondition {
    let hit_rate = match (q, h) {
        (Some(q), Some(h)) if q > 0 => Some(h as f64 / q as f64),
        _ => None,
    };
    let (verified, note) = match (exp.temperature, h) {
        (_, None) => (
            None,
            "cannot verify: no prefix-cache hit counters on /metrics".to_string(),
        ),
        (CacheTemp::Cold, Some(h)) if exp.hits_allowed == 0 => {
            if h == 0 {
                (
                    Some(true),
                    "cold: 0 prefix-cache hits during the run".into(),
                )
            } else {
                (
                    Some(false),
                    format!("NOT cold: {h} prefix-cache hit tokens during the run"),
                )
            }
        }
        (CacheTemp::Cold, Some(h)) => {
            if h <= exp.hits_allowed {
                (
                    Some(true),
                    if h == 0 {
                        "cold: 0 prefix-cache hits during the run".to_string()
                    } else {
                        format!(
                            "cold: {h} hit tokens, within what the workload shares (shared prefix within the run, chat-template tokens before the salt: ≤ {})",
                            exp.hits_allowed
                        )
                    },
                )
            } else {
                (
                    Some(false),
                    format!(
                        "NOT cold: {h} hit tokens exceed the {} the workload's shared tokens explain",
                        exp.hits_allowed
                    ),
                )
            }
        }
        // Warm means the replayed prompts were served from the cache: more hits than a cold run
        // gets from the workload's shared tokens (the shared prefix of every request, primed
        // before the first, and the chat template's tokens), not merely some hits.
        (CacheTemp::Warm, Some(h)) => {
            if h > exp.hits_allowed {
                (
                    Some(true),
                    if exp.hits_allowed == 0 {
                        format!("warm: replayed prompts hit the prefix cache ({h} hit tokens)")
                    } else {
                        format!(
                            "warm: {h} hit tokens, beyond the ≤ {} a cold run also reuses (shared prefix, chat-template tokens)",
                            exp.hits_allowed
                        )
                    },
                )
            } else if h > 0 {
                (
                    Some(false),
                    format!(
                        "NOT verified warm: {h} hit tokens, no more than a cold run also reuses (shared prefix, chat-template tokens: ≤ {}): the replayed prompts were not served from the cache (evicted before they were replayed?)",
                        exp.hits_allowed
                    ),
                )
            } else {
                (
                    Some(false),
                    "NOT warm: replayed prompts got 0 prefix-cache hits".into(),
                )
            }
        }
    };
    CacheCondition {
        temperature: exp.temperature,
        reset: exp.reset,
        salted: true,
        queries: q,
        hits: h,
        hit_rate,
        hits_allowed: exp.hits_allowed,
        verified,
        counters: None,
        note,
    }
}

/// Where `/metrics` has no prefix-cache counters, the requests' own
/// `usage.prompt_tokens_details.cached_tokens` (hits) over their `prompt_tokens` (queries), when
/// every completed request reported both; the same verdict rules as [`cache_condition`].
pub fn cache_condition_with_usage(c: CacheCondition, records: &[RequestRecord]) -> CacheCondition {
    if c.counters.is_some() {
        return c;
    }
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok).collect();
    let pairs: Option<Vec<(u64, u64)>> = ok
        .iter()
        .map(|r| Some((r.prompt_tokens?, r.cached_tokens?)))
        .collect();
    let Some(pairs) = pairs.filter(|p| !p.is_empty()) else {
        return c;
    };
    let queries: u64 = pairs.iter().map(|p| p.0).sum();
    let hits: u64 = pairs.iter().map(|p| p.1).sum();
    let mut u = cache_verdict(
        Some(queries),
        Some(hits),
        CacheExpectation {
            temperature: c.temperature,
            reset: c.reset,
            hits_allowed: c.hits_allowed,
        },
    );
    u.counters = Some("usage.prompt_tokens_details.cached_tokens of each request".into());
    u
}

/// Thinking: what was sent and what came back. `judge_tags`: look for `<think>` tags in the
/// content (off for synthetic weights, whose random output may hold the tag token by chance).
pub fn thinking_condition(
    api: Api,
    sent: Option<bool>,
    records: &[RequestRecord],
    texts: &[(String, String)],
    judge_tags: bool,
) -> ThinkingCondition {
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok).collect();
    let with_reasoning = ok.iter().filter(|r| r.reasoning_chars > 0).count();
    let with_tags = texts
        .iter()
        .filter(|_| judge_tags)
        .filter(|(content, _)| content.contains("<think>") || content.contains("</think>"))
        .count();
    let reasoning_tokens = {
        let v: Vec<u64> = ok.iter().filter_map(|r| r.reasoning_tokens).collect();
        (!v.is_empty()).then(|| v.iter().sum())
    };
    let flag = match sent {
        Some(false) if with_reasoning > 0 => Some(format!(
            "reasoning output with thinking off: {with_reasoning} of {} requests produced reasoning text",
            ok.len()
        )),
        Some(false) if with_tags > 0 => Some(format!(
            "<think> tags in the content with thinking off ({with_tags} requests)"
        )),
        Some(true) if with_reasoning == 0 && with_tags == 0 && !ok.is_empty() => Some(
            "thinking on, but no reasoning output observed (the model or template may ignore enable_thinking)".into(),
        ),
        _ => None,
    };
    ThinkingCondition {
        api,
        sent,
        requests_with_reasoning: with_reasoning,
        requests_with_think_tags: with_tags,
        reasoning_tokens,
        flag,
    }
}

/// Lengths requested vs produced.
pub fn length_condition(
    records: &[RequestRecord],
    output_requested: u32,
    output_fixed: bool,
    input_requested: Option<u64>,
) -> LengthCondition {
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok).collect();
    let outs: Vec<u64> = ok.iter().filter_map(|r| r.output_tokens).collect();
    let prompts: Vec<f64> = ok
        .iter()
        .filter_map(|r| r.prompt_tokens.map(|p| p as f64))
        .collect();
    let template: Vec<f64> = ok
        .iter()
        .filter_map(|r| Some(r.prompt_tokens? as f64 - r.input_tokens_counted? as f64))
        .collect();
    let exact = match input_requested {
        Some(_)
            if !records.is_empty() && records.iter().all(|r| r.input_tokens_counted.is_some()) =>
        {
            Some(
                records
                    .iter()
                    .all(|r| r.input_tokens_counted == r.input_tokens_requested),
            )
        }
        _ => None,
    };
    LengthCondition {
        input_requested,
        input_exact: exact,
        input_reported_mean: crate::stats::mean(&prompts),
        template_tokens_mean: crate::stats::mean(&template),
        output_requested,
        output_fixed,
        output_min: outs.iter().copied().min(),
        output_mean: crate::stats::mean(&outs.iter().map(|x| *x as f64).collect::<Vec<_>>()),
        output_max: outs.iter().copied().max(),
        prompt_check: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expo(s: &str) -> Exposition {
        Exposition::parse(s)
    }

    #[test]
    fn spec_from_counter_deltas() {
        let b = expo(
            "vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_draft_tokens_total 30\n\
             vllm:spec_decode_num_accepted_tokens_total 12\n\
             vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 6\n\
             vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"1\"} 4\n\
             vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"2\"} 2\n",
        );
        let a = expo(
            "vllm:spec_decode_num_drafts_total 30\nvllm:spec_decode_num_draft_tokens_total 90\n\
             vllm:spec_decode_num_accepted_tokens_total 42\n\
             vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 22\n\
             vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"1\"} 14\n\
             vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"2\"} 6\n",
        );
        let c = spec_condition(Some(&b), Some(&a), &EngineFacts::default());
        assert_eq!(c.state, SpecState::On);
        assert_eq!(
            (c.drafts, c.draft_tokens, c.accepted_tokens),
            (Some(20), Some(60), Some(30))
        );
        assert_eq!(c.acceptance_rate, Some(0.5));
        assert_eq!(c.mean_acceptance_length, Some(2.5));
        assert_eq!(c.per_position, vec![0.8, 0.5, 0.2]);
        assert_eq!(c.k.unwrap().value, 3);

        let off = spec_condition(
            None,
            Some(&expo("vllm:num_requests_running 0\n")),
            &EngineFacts::default(),
        );
        assert_eq!(off.state, SpecState::Off);
        let unk = spec_condition(
            None,
            Some(&expo("other_metric 1\n")),
            &EngineFacts::default(),
        );
        assert_eq!(unk.state, SpecState::Unknown);
        assert_eq!(
            spec_condition(None, None, &EngineFacts::default()).state,
            SpecState::Unknown
        );
    }

    #[test]
    fn cache_verdicts() {
        let b = expo("vllm:prefix_cache_queries_total 100\nvllm:prefix_cache_hits_total 40\n");
        let cold = expo("vllm:prefix_cache_queries_total 300\nvllm:prefix_cache_hits_total 40\n");
        let warm = expo("vllm:prefix_cache_queries_total 300\nvllm:prefix_cache_hits_total 140\n");
        let e = |t, allowed| CacheExpectation {
            temperature: t,
            reset: Some(true),
            hits_allowed: allowed,
        };
        let c = cache_condition(Some(&b), Some(&cold), e(CacheTemp::Cold, 0));
        assert_eq!(
            (c.verified, c.hits, c.hit_rate),
            (Some(true), Some(0), Some(0.0))
        );
        let c = cache_condition(Some(&b), Some(&warm), e(CacheTemp::Cold, 0));
        assert_eq!(c.verified, Some(false));
        assert!(c.note.contains("NOT cold"));
        let c = cache_condition(Some(&b), Some(&warm), e(CacheTemp::Cold, 100));
        assert_eq!(c.verified, Some(true));
        let c = cache_condition(Some(&b), Some(&warm), e(CacheTemp::Warm, 0));
        assert_eq!((c.verified, c.hit_rate), (Some(true), Some(0.5)));
        let c = cache_condition(Some(&b), Some(&cold), e(CacheTemp::Warm, 0));
        assert_eq!(c.verified, Some(false));
        // 100 hit tokens, all of which the shared prefix explains: what a cold run gets too.
        let c = cache_condition(Some(&b), Some(&warm), e(CacheTemp::Warm, 100));
        assert_eq!(c.verified, Some(false), "{}", c.note);
        assert!(
            c.note.starts_with("NOT verified warm: 100 hit tokens"),
            "{}",
            c.note
        );
        let c = cache_condition(Some(&b), Some(&warm), e(CacheTemp::Warm, 99));
        assert_eq!(c.verified, Some(true), "{}", c.note);
        // Counters absent: no verdict, never "0 hits".
        let c = cache_condition(None, Some(&cold), e(CacheTemp::Cold, 0));
        assert_eq!((c.verified, c.hits), (None, None));
    }

    #[test]
    fn cache_verdict_from_usage_cached_tokens_when_metrics_have_none() {
        let r = |p: u64, cached: Option<u64>| RequestRecord {
            ok: true,
            prompt_tokens: Some(p),
            cached_tokens: cached,
            ..Default::default()
        };
        let none = cache_condition(
            None,
            None,
            CacheExpectation {
                temperature: CacheTemp::Cold,
                reset: None,
                hits_allowed: 9 * 2,
            },
        );
        assert_eq!(none.verified, None);
        // llama.cpp reports cached_tokens per request (9 template tokens in the fixture's
        // capture): within what the template explains.
        let c = cache_condition_with_usage(none.clone(), &[r(36, Some(9)), r(36, Some(9))]);
        assert_eq!(
            (c.verified, c.hits, c.queries),
            (Some(true), Some(18), Some(72))
        );
        assert!(c.counters.unwrap().contains("cached_tokens"));
        let c = cache_condition_with_usage(none.clone(), &[r(36, Some(30)), r(36, Some(9))]);
        assert_eq!(c.verified, Some(false));
        // One request without the field: no verdict from usage.
        let c = cache_condition_with_usage(none, &[r(36, Some(9)), r(36, None)]);
        assert_eq!(c.verified, None);
    }

    #[test]
    fn prompt_lengths_against_usage() {
        let r = |index: usize, counted: u64, reported: u64| RequestRecord {
            index,
            ok: true,
            input_tokens_counted: Some(counted),
            prompt_tokens: Some(reported),
            ..Default::default()
        };
        let ov = Sourced::new(9i64, "measured");
        // Within max(2%, 2 tokens): a BPE merge at the template boundary on a short prompt.
        let c =
            check_prompt_lengths(&[r(0, 16, 26), r(1, 16, 27), r(2, 16, 23)], Some(&ov)).unwrap();
        assert_eq!((c.checked, c.mismatched, c.max_abs_diff), (3, 0, 2));
        // 3 tokens on 25 is beyond both.
        let c = check_prompt_lengths(&[r(0, 16, 28)], Some(&ov)).unwrap();
        assert_eq!(c.mismatched, 1);
        assert!(c.example.unwrap().contains("off by 3"));
        // Long prompts: 2% of 265 is 5 tokens.
        let c = check_prompt_lengths(&[r(0, 256, 270), r(1, 256, 271)], Some(&ov)).unwrap();
        assert_eq!(c.mismatched, 1);
        // llama.cpp's 0-token /tokenize made 64-token prompts 342 tokens long (−100%
        // "mismatch"): that cannot pass.
        let c = check_prompt_lengths(&[r(0, 342, 73)], Some(&ov)).unwrap();
        assert_eq!(c.mismatched, 1);
        // Nothing to check: no overhead, or no request with both counts.
        assert!(check_prompt_lengths(&[r(0, 16, 25)], None).is_none());
        let failed = RequestRecord {
            ok: false,
            ..r(0, 16, 25)
        };
        assert!(check_prompt_lengths(&[failed], Some(&ov)).is_none());
    }

    #[test]
    fn scrape_interval_adapts_within_one_to_two_minimums() {
        use std::time::Duration as D;
        let min = D::from_secs(1);
        // 14 ms (a CPU vLLM): 700 ms → the 1 s floor.
        assert_eq!(next_scrape_interval(D::from_millis(14), min), min);
        // 30 ms → 1.5 s.
        assert_eq!(
            next_scrape_interval(D::from_millis(30), min),
            D::from_millis(1500)
        );
        // 200 ms → capped at 2 s.
        assert_eq!(
            next_scrape_interval(D::from_millis(200), min),
            D::from_secs(2)
        );
        let mut p = PollStats::default();
        p.timed(D::from_millis(3));
        p.add(&expo("vllm:kv_cache_usage_perc 0.5\n"));
        let mut q = PollStats::default();
        q.timed(D::from_millis(5));
        q.add(&expo(
            "llamacpp:requests_processing 3\nllamacpp:requests_deferred 1\n",
        ));
        p.merge(&q);
        assert_eq!((p.polls, p.scrape_ms.len()), (2, 2));
        assert_eq!(
            (p.peak_kv_usage, p.max_running, p.max_waiting),
            (Some(0.5), Some(3.0), Some(1.0))
        );
    }

    #[test]
    fn llamacpp_spec_counters() {
        let b = expo("llamacpp:spec_decode_num_drafts_total 0\nllamacpp:spec_decode_num_draft_tokens_total 0\nllamacpp:spec_decode_num_accepted_tokens_total 0\n");
        let a = expo("llamacpp:spec_decode_num_drafts_total 10\nllamacpp:spec_decode_num_draft_tokens_total 40\nllamacpp:spec_decode_num_accepted_tokens_total 12\n");
        let c = spec_condition(Some(&b), Some(&a), &EngineFacts::default());
        assert_eq!(c.state, SpecState::On);
        assert_eq!(c.acceptance_rate, Some(0.3));
        assert_eq!(c.mean_acceptance_length, Some(2.2));
        // 0 drafts: the counters exist with speculation off too, so no verdict from them.
        let c = spec_condition(Some(&b), Some(&b), &EngineFacts::default());
        assert_eq!((c.state, c.drafts), (SpecState::Unknown, Some(0)));
    }

    #[test]
    fn kv_capacity_sources() {
        let e = expo("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1\n");
        let k = kv_capacity(Some(&e), None);
        assert_eq!(k.capacity_tokens.unwrap().value, 16000);
        let e = expo("vllm:cache_config_info{kv_cache_size_tokens=\"5000\",block_size=\"16\"} 1\n");
        assert_eq!(
            kv_capacity(Some(&e), None).capacity_tokens.unwrap().value,
            5000
        );
        let boot =
            BootLog::parse("INFO x [kv_cache_utils.py:1] GPU KV cache size: 652,144 tokens\n");
        let k = kv_capacity(None, Some(&boot));
        assert_eq!(k.capacity_tokens.as_ref().unwrap().value, 652_144);
        assert!(k.capacity_tokens.unwrap().source.contains("log"));
        // V0: blocks from the log, block size from /metrics.
        let boot = BootLog::parse("# GPU blocks: 1478, # CPU blocks: 2048\n");
        let e = expo("vllm:cache_config_info{block_size=\"16\"} 1\n");
        assert_eq!(
            kv_capacity(Some(&e), Some(&boot))
                .capacity_tokens
                .unwrap()
                .value,
            23648
        );
        assert!(kv_capacity(None, None).capacity_tokens.is_none());
    }

    #[test]
    fn thinking_flags() {
        let r = |reasoning: usize| RequestRecord {
            ok: true,
            reasoning_chars: reasoning,
            ..Default::default()
        };
        let t = thinking_condition(Api::Chat, Some(false), &[r(0), r(5)], &[], true);
        assert!(t
            .flag
            .unwrap()
            .contains("reasoning output with thinking off"));
        let t = thinking_condition(
            Api::Chat,
            Some(false),
            &[r(0)],
            &[("<think>x</think>y".into(), String::new())],
            true,
        );
        assert!(t.flag.unwrap().contains("<think>"));
        let t = thinking_condition(Api::Chat, Some(true), &[r(3)], &[], true);
        assert_eq!((t.flag, t.requests_with_reasoning), (None, 1));
    }
}
