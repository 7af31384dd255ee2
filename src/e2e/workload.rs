//! Workloads: suite files (`suites/e2e/*.toml`) and the requests they produce.
//!
//! Three kinds of workload:
//! - `fixed`: every prompt has exactly `input_tokens` tokens (filler prose cut to length with the
//!   engine's `POST /tokenize`, else a local `tokenizer.json`), and the output is fixed at
//!   `output_tokens` with `max_tokens` + `ignore_eos`;
//! - `prompts`: the narrative or code prompt set written for rigbench ([`super::prompts`]),
//!   with natural output lengths capped at `output_tokens`;
//! - `shared_prefix`: every prompt starts with the same `shared_prefix_tokens`-token prefix and
//!   is `input_tokens` long in all, to measure prefix caching.
//!
//! Every prompt starts with a salt unique to the run and the request (`[index:nonce] `), so no
//! request can hit a prefix cached before the run (the `cold` condition), except the fixed part of
//! a chat template that precedes the user message; the shared-prefix workload shares its salted
//! prefix within a run only.
//!
//! Token-exact means: the prompt text (the user message for chat, the prompt for completions)
//! tokenizes to the target count with the engine's own tokenizer and default special tokens. For
//! chat the engine adds its template on top; the prompt tokens it reports are recorded per
//! request.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use super::client::{Api, EngineClient, GenRequest, TokenizeForm};
use super::metrics::TokenSource;
use super::prompts::{filler_words, PromptSet};
use crate::RigError;

/// Suites shipped with rigbench, by name: `(name, TOML text)`.
pub const BUILTIN_SUITES: &[(&str, &str)] = &[
    ("tiny", include_str!("../../suites/e2e/tiny.toml")),
    (
        "fixed-1k-256",
        include_str!("../../suites/e2e/fixed-1k-256.toml"),
    ),
    ("narrative", include_str!("../../suites/e2e/narrative.toml")),
    ("code", include_str!("../../suites/e2e/code.toml")),
    (
        "shared-prefix",
        include_str!("../../suites/e2e/shared-prefix.toml"),
    ),
    ("open-loop", include_str!("../../suites/e2e/open-loop.toml")),
];

/// The kind of workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadKind {
    /// Fixed input and output lengths.
    Fixed,
    /// The narrative or code prompt set, natural output lengths.
    Prompts,
    /// A shared prefix plus a unique suffix.
    SharedPrefix,
}

/// `[workload]` of a suite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    /// Kind.
    pub kind: WorkloadKind,
    /// API used.
    #[serde(default)]
    pub api: Api,
    /// Prompt length in tokens (`fixed`, `shared_prefix`).
    #[serde(default)]
    pub input_tokens: Option<u32>,
    /// `max_tokens`: the fixed output length with `ignore_eos`, else a cap.
    pub output_tokens: u32,
    /// Send `ignore_eos` so the output has exactly `output_tokens` tokens.
    #[serde(default)]
    pub ignore_eos: bool,
    /// The prompt set (`prompts`), or the source of filler text.
    #[serde(default)]
    pub prompt_set: PromptSet,
    /// Tokens shared by all prompts of a run (`shared_prefix`).
    #[serde(default)]
    pub shared_prefix_tokens: Option<u32>,
}

impl WorkloadSpec {
    /// The most tokens one request of this workload holds (prompt + output), where the
    /// workload fixes its prompt length (`fixed`, `shared_prefix`: `input_tokens` counts the
    /// shared prefix); `None` for the prompt sets, whose lengths depend on the served model's
    /// tokenizer, or without an input length.
    pub fn max_request_tokens(&self) -> Option<u32> {
        match self.kind {
            WorkloadKind::Fixed | WorkloadKind::SharedPrefix => self
                .input_tokens
                .map(|i| i.saturating_add(self.output_tokens)),
            WorkloadKind::Prompts => None,
        }
    }
}

/// Closed or open loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LoadMode {
    /// A fixed number of requests in flight.
    #[default]
    Closed,
    /// Arrivals at a rate, independent of completions.
    Open,
}

/// Arrival process of an open loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ArrivalKind {
    /// Exponential inter-arrival times (a Poisson process).
    #[default]
    Poisson,
    /// Gamma inter-arrival times with shape `burstiness` (1 = Poisson, < 1 burstier), as in
    /// vLLM's `benchmark_serving --burstiness`.
    Gamma,
    /// The send times of a replayed trace (`--trace`; docs/traces.md); `rate` is then the
    /// trace's mean request rate.
    #[value(skip)]
    Trace,
}

/// Prefix-cache temperature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum CacheTemp {
    /// No request may reuse a prefix cached before the run.
    #[default]
    Cold,
    /// Each prompt is sent once unmeasured, then replayed measured.
    Warm,
}

/// `[load]` of a suite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadSpec {
    /// Closed or open loop.
    #[serde(default)]
    pub mode: LoadMode,
    /// Concurrency sweep (closed loop).
    #[serde(default)]
    pub concurrency: Vec<u32>,
    /// Rate sweep, requests per second (open loop).
    #[serde(default)]
    pub rates: Vec<f64>,
    /// Arrival process (open loop).
    #[serde(default)]
    pub arrival: ArrivalKind,
    /// Gamma shape (open loop, `gamma`).
    #[serde(default = "one")]
    pub burstiness: f64,
    /// Cap on requests in flight in an open loop; arrivals beyond it wait and are late.
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// Requests per sweep point (also the number of unique prompts prepared).
    pub requests: u32,
    /// Stop sending after this many seconds of a sweep point.
    #[serde(default)]
    pub duration_s: Option<f64>,
    /// Unmeasured warm-up requests before each sweep point.
    #[serde(default)]
    pub warmup: u32,
    /// Cache temperature.
    #[serde(default)]
    pub cache: CacheTemp,
}

fn one() -> f64 {
    1.0
}

/// `[sampling]` of a suite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingSpec {
    /// Temperature (0 = greedy).
    #[serde(default)]
    pub temperature: f64,
    /// Seed sent with every request (offset by the request index).
    #[serde(default)]
    pub seed: Option<u64>,
    /// `enable_thinking` sent in `chat_template_kwargs`; absent = not sent.
    #[serde(default)]
    pub thinking: Option<bool>,
}

impl Default for SamplingSpec {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            seed: Some(0),
            thinking: Some(false),
        }
    }
}

/// The most tokens one request may ask for or send (`--output-tokens`, `--input-tokens`):
/// 2^20, beyond any model's context; prompts and per-token latency samples are sized by them.
pub const MAX_TOKENS_PER_REQUEST: u64 = 1 << 20;
/// The most requests per sweep point (`--requests`; the flag's own range too).
pub const MAX_REQUESTS: u64 = 100_000;
/// The most warm-up requests per sweep point (`--warmup-requests`).
pub const MAX_WARMUP_REQUESTS: u64 = 10_000;
/// The most requests in flight (`--concurrency`, `--max-concurrency`).
pub const MAX_CONCURRENCY: u64 = 100_000;
/// The slowest open-loop rate, requests/s (`--rate`): one request per 1,000 s.
pub const MIN_RATE: f64 = 1e-3;
/// The fastest open-loop rate, requests/s (`--rate`).
pub const MAX_RATE: f64 = 1e6;
/// The longest duration or timeout rigbench takes, seconds (`--duration`, `--request-timeout`,
/// `--startup-timeout`): a week.
pub const MAX_SECONDS: f64 = 7.0 * 86_400.0;

/// A suite file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Suite {
    /// Name.
    pub name: String,
    /// What it measures.
    #[serde(default)]
    pub description: String,
    /// The requests.
    pub workload: WorkloadSpec,
    /// The load.
    pub load: LoadSpec,
    /// Sampling.
    #[serde(default)]
    pub sampling: SamplingSpec,
}

impl Suite {
    /// Parse suite TOML; `origin` names the file in errors.
    ///
    /// # Errors
    /// [`RigError::BadFile`] for bad TOML or values, naming the field.
    pub fn from_toml(text: &str, origin: &Path) -> Result<Self, RigError> {
        let s: Suite = toml::from_str(text)
            .map_err(|e| RigError::file(origin, format!("not a valid e2e suite: {e}")))?;
        s.validate().map_err(|m| RigError::file(origin, m))?;
        Ok(s)
    }

    /// A built-in suite by name, or a suite file by path.
    ///
    /// # Errors
    /// [`RigError::BadFlag`] (`--suite`) when neither a built-in name nor a readable file.
    pub fn load(name_or_path: &str) -> Result<Self, RigError> {
        if let Some((n, t)) = BUILTIN_SUITES.iter().find(|(n, _)| *n == name_or_path) {
            return Self::from_toml(t, &PathBuf::from(format!("suites/e2e/{n}.toml (built in)")));
        }
        let p = Path::new(name_or_path);
        if p.is_file() {
            let t = std::fs::read_to_string(p)
                .map_err(|e| RigError::file(p, format!("cannot read suite: {e}")))?;
            return Self::from_toml(&t, p);
        }
        let names: Vec<&str> = BUILTIN_SUITES.iter().map(|(n, _)| *n).collect();
        Err(RigError::flag(
            "--suite",
            format!(
                "'{name_or_path}' is neither a built-in suite ({}) nor a file",
                names.join(", ")
            ),
        ))
    }

    /// Check the values; the message names the field, its range and the fix.
    ///
    /// # Errors
    /// A message naming the bad field.
    pub fn validate(&self) -> Result<(), String> {
        let w = &self.workload;
        let l = &self.load;
        if w.output_tokens == 0 {
            return Err("workload.output_tokens must be at least 1".into());
        }
        let limits = [
            (
                "workload.output_tokens (--output-tokens)",
                u64::from(w.output_tokens),
                MAX_TOKENS_PER_REQUEST,
            ),
            (
                "workload.input_tokens (--input-tokens)",
                u64::from(w.input_tokens.unwrap_or(0)),
                MAX_TOKENS_PER_REQUEST,
            ),
            (
                "load.requests (--requests)",
                u64::from(l.requests),
                MAX_REQUESTS,
            ),
            (
                "load.warmup (--warmup-requests)",
                u64::from(l.warmup),
                MAX_WARMUP_REQUESTS,
            ),
            (
                "load.max_concurrency (--max-concurrency)",
                u64::from(l.max_concurrency.unwrap_or(0)),
                MAX_CONCURRENCY,
            ),
        ];
        for (name, v, max) in limits {
            if v > max {
                return Err(format!(
                    "{name} is {v}, above the most rigbench takes ({max})"
                ));
            }
        }
        if let Some(c) = l.concurrency.iter().find(|c| **c as u64 > MAX_CONCURRENCY) {
            return Err(format!(
                "load.concurrency (--concurrency) lists {c}, above the most rigbench takes ({MAX_CONCURRENCY})"
            ));
        }
        match w.kind {
            WorkloadKind::Fixed | WorkloadKind::SharedPrefix => match w.input_tokens {
                Some(n) if n >= 4 => {}
                _ => return Err(
                    "workload.input_tokens must be set (≥ 4) for fixed and shared_prefix workloads"
                        .into(),
                ),
            },
            WorkloadKind::Prompts => {}
        }
        if w.kind == WorkloadKind::SharedPrefix {
            match (w.shared_prefix_tokens, w.input_tokens) {
                (Some(p), Some(n)) if p >= 1 && p + 4 <= n => {}
                _ => return Err(
                    "workload.shared_prefix_tokens must be set and at least 4 below input_tokens"
                        .into(),
                ),
            }
        }
        if l.requests == 0 {
            return Err("load.requests must be at least 1".into());
        }
        match l.mode {
            LoadMode::Closed => {
                if l.concurrency.is_empty() || l.concurrency.contains(&0) {
                    return Err(
                        "load.concurrency must list concurrencies ≥ 1 for a closed loop".into(),
                    );
                }
            }
            LoadMode::Open => {
                if l.rates.is_empty() || l.rates.iter().any(|r| !r.is_finite() || *r <= 0.0) {
                    return Err(
                        "load.rates must list rates > 0 (requests/s) for an open loop".into(),
                    );
                }
                if let Some(r) = l.rates.iter().find(|r| !(MIN_RATE..=MAX_RATE).contains(*r)) {
                    return Err(format!(
                        "load.rates (--rate) lists {r} requests/s, outside {MIN_RATE}..={MAX_RATE:e} (below {MIN_RATE}, one request would take over {:.0} s to arrive)",
                        1.0 / MIN_RATE
                    ));
                }
                if !(l.burstiness.is_finite() && l.burstiness > 0.0) {
                    return Err("load.burstiness must be > 0".into());
                }
                if l.max_concurrency == Some(0) {
                    return Err("load.max_concurrency must be at least 1".into());
                }
            }
        }
        if let Some(d) = l.duration_s {
            if !(d.is_finite() && d > 0.0) {
                return Err("load.duration_s must be > 0".into());
            }
            if d > MAX_SECONDS {
                return Err(format!(
                    "load.duration_s (--duration) is {d} s, above the most rigbench takes ({MAX_SECONDS} s, a week)"
                ));
            }
        }
        if !(self.sampling.temperature.is_finite() && self.sampling.temperature >= 0.0) {
            return Err("sampling.temperature must be ≥ 0".into());
        }
        if w.api == Api::Completions && self.sampling.thinking.is_some() {
            return Err("sampling.thinking applies to the chat API only; remove it for api = \"completions\"".into());
        }
        Ok(())
    }

    /// Whether the output length is fixed (`ignore_eos`), so shortfalls are failures.
    pub fn output_fixed(&self) -> bool {
        self.workload.ignore_eos
    }
}

/// Counts tokens the way the engine will.
#[derive(Clone)]
pub enum TokenCounter {
    /// The engine's `POST /tokenize`.
    Engine {
        /// The engine.
        client: EngineClient,
        /// The model field to send.
        model: String,
        /// The body the engine takes (vLLM's `prompt` or llama.cpp's `content`).
        form: TokenizeForm,
    },
    /// A local `tokenizer.json`.
    Local(Arc<tokenizers::Tokenizer>),
    /// None available: lengths are approximate.
    None,
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TokenCounter::Engine { .. } => "TokenCounter::Engine",
            TokenCounter::Local(_) => "TokenCounter::Local",
            TokenCounter::None => "TokenCounter::None",
        })
    }
}

impl TokenCounter {
    /// Load a local tokenizer from a `tokenizer.json` file or a folder holding one.
    ///
    /// # Errors
    /// [`RigError::BadFile`] naming the file.
    pub fn local(path: &Path) -> Result<Self, RigError> {
        let file = if path.is_dir() {
            path.join("tokenizer.json")
        } else {
            path.to_path_buf()
        };
        let t = tokenizers::Tokenizer::from_file(&file)
            .map_err(|e| RigError::file(&file, format!("cannot load tokenizer: {e}")))?;
        Ok(TokenCounter::Local(Arc::new(t)))
    }

    /// Where counts come from; `None` without a tokenizer.
    pub fn source(&self) -> Option<TokenSource> {
        match self {
            TokenCounter::Engine { .. } => Some(TokenSource::EngineTokenizer),
            TokenCounter::Local(_) => Some(TokenSource::LocalTokenizer),
            TokenCounter::None => None,
        }
    }

    /// Token count of `text` (no special tokens added); `None` without a tokenizer.
    ///
    /// # Errors
    /// The engine's tokenizer failed, or counted 0 tokens for a non-empty text (see
    /// [`EngineClient::tokenize_as`]).
    pub async fn count(&self, text: &str) -> anyhow::Result<Option<usize>> {
        match self {
            TokenCounter::Engine {
                client,
                model,
                form,
            } => Ok(client
                .tokenize_as(*form, model, text)
                .await?
                .map(|t| t.count)),
            TokenCounter::Local(t) => {
                // No special tokens, as the engine's /tokenize is asked: a BOS would add one
                // token per count (per piece, when a text is counted in pieces).
                let enc = t
                    .encode(text, false)
                    .map_err(|e| anyhow::anyhow!("local tokenizer failed: {e}"))?;
                Ok(Some(enc.len()))
            }
            TokenCounter::None => Ok(None),
        }
    }
}

/// One prepared request.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedRequest {
    /// The request.
    pub req: GenRequest,
    /// Target input length, tokens (fixed and shared-prefix workloads).
    pub input_tokens_requested: Option<u64>,
    /// Input length as counted by the tokenizer, when one was available.
    pub input_tokens_counted: Option<u64>,
}

/// Fit `head` + filler words to exactly `target` tokens. Returns the text and its count
/// (`None` without a tokenizer: then the length is estimated at 4 characters per token).
pub(crate) async fn fit(
    counter: &TokenCounter,
    head: &str,
    words: &[&str],
    target: usize,
    hint: &mut Option<usize>,
) -> anyhow::Result<(String, Option<usize>)> {
    let make = |w: usize| {
        let mut s = head.to_string();
        s.push_str(&words[..w].join(" "));
        s
    };
    if matches!(counter, TokenCounter::None) {
        let mut s = head.to_string();
        for w in words {
            if s.len() + w.len() + 1 > target * 4 {
                break;
            }
            s.push_str(w);
            s.push(' ');
        }
        return Ok((s.trim_end().to_string(), None));
    }
    let mut cache: HashMap<usize, usize> = HashMap::new();
    macro_rules! count_w {
        ($w:expr) => {{
            let w: usize = $w;
            match cache.get(&w) {
                Some(c) => *c,
                None => {
                    let c = counter
                        .count(&make(w))
                        .await?
                        .context("tokenizer disappeared")?;
                    cache.insert(w, c);
                    c
                }
            }
        }};
    }
    let c0 = count_w!(0);
    if c0 >= target {
        return Ok((make(0), Some(c0)));
    }
    let len = words.len();
    let start = hint.unwrap_or((target - c0) * 3 / 4).clamp(0, len);
    // Gallop to a bracket lo ≤ target < hi, then bisect.
    let (mut lo, mut hi);
    if count_w!(start) <= target {
        lo = start;
        hi = len + 1;
        let mut step = 1;
        while lo < len {
            let cand = (lo + step).min(len);
            if count_w!(cand) <= target {
                lo = cand;
                step *= 2;
            } else {
                hi = cand;
                break;
            }
        }
    } else {
        hi = start;
        let mut step = 1;
        loop {
            let cand = hi.saturating_sub(step);
            if cand == 0 || count_w!(cand) <= target {
                lo = cand;
                break;
            }
            hi = cand;
            step *= 2;
        }
    }
    while hi <= len && hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if count_w!(mid) <= target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    *hint = Some(lo);
    let mut best = make(lo);
    let mut best_c = count_w!(lo);
    // Refine below word granularity: part of the next word, then periods.
    if best_c < target && lo < len {
        let next = words[lo];
        let sep = if lo == 0 { "" } else { " " };
        for (k, _) in next
            .char_indices()
            .skip(1)
            .chain(std::iter::once((next.len(), ' ')))
        {
            let cand = format!("{best}{sep}{}", &next[..k]);
            let c = counter
                .count(&cand)
                .await?
                .context("tokenizer disappeared")?;
            if c <= target && c > best_c {
                best = cand;
                best_c = c;
            }
            if c >= target {
                break;
            }
        }
    }
    let mut tries = 0;
    while best_c < target && tries < 8 {
        tries += 1;
        let cand = format!("{best}.");
        let c = counter
            .count(&cand)
            .await?
            .context("tokenizer disappeared")?;
        if c > target {
            break;
        }
        best = cand;
        best_c = c;
    }
    Ok((best, Some(best_c)))
}

/// Build `count` requests for `suite`. `nonce` makes the salts unique to this run (and
/// purpose: measured requests and warm-up requests never share prompts).
///
/// # Errors
/// The tokenizer failed, or the lengths exceed the engine's context (`max_model_len`).
pub async fn prepare(
    suite: &Suite,
    counter: &TokenCounter,
    model: &str,
    nonce: &str,
    count: usize,
    max_model_len: Option<u64>,
) -> anyhow::Result<Vec<PreparedRequest>> {
    let w = &suite.workload;
    if let (Some(max), Some(inp)) = (max_model_len, w.input_tokens) {
        if u64::from(inp) + u64::from(w.output_tokens) > max {
            bail!(RigError::flag(
                "--input-tokens/--output-tokens",
                format!(
                    "{inp} input + {} output tokens exceed the engine's context of {max} tokens; use shorter lengths",
                    w.output_tokens
                )
            ));
        }
    }
    let mut out = Vec::with_capacity(count);
    let mut hint = None;
    let shared_prefix = match (w.kind, w.shared_prefix_tokens) {
        (WorkloadKind::SharedPrefix, Some(p)) => {
            let words = filler_words(0, p as usize + 16);
            let mut h = None;
            Some(fit(counter, &format!("[{nonce}] "), &words, p as usize, &mut h).await?)
        }
        _ => None,
    };
    for i in 0..count {
        // The request index comes first so that the first KV block after any chat-template
        // prefix already differs between requests of one run.
        let salt = format!("[{i}:{nonce}] ");
        let (prompt, counted, requested) = match w.kind {
            WorkloadKind::Fixed => {
                let target = w.input_tokens.unwrap_or(0) as usize;
                let words = filler_words(i * 37, target + 16);
                let (t, c) = fit(counter, &salt, &words, target, &mut hint).await?;
                (t, c, Some(target as u64))
            }
            WorkloadKind::SharedPrefix => {
                let target = w.input_tokens.unwrap_or(0) as usize;
                let (prefix, _) = shared_prefix.as_ref().context("shared prefix missing")?;
                let head = format!("{prefix}\n{salt}");
                let words = filler_words(i * 37 + 101, target + 16);
                let (t, c) = fit(counter, &head, &words, target, &mut hint).await?;
                (t, c, Some(target as u64))
            }
            WorkloadKind::Prompts => {
                let set = w.prompt_set.prompts();
                let t = format!("{salt}{}", set[i % set.len()]);
                let c = counter.count(&t).await?;
                (t, c, None)
            }
        };
        let seed = suite.sampling.seed.map(|s| s.wrapping_add(i as u64));
        out.push(PreparedRequest {
            req: GenRequest {
                api: w.api,
                model: model.to_string(),
                prompt,
                max_tokens: w.output_tokens,
                ignore_eos: w.ignore_eos,
                temperature: suite.sampling.temperature,
                seed,
                thinking: if w.api == Api::Chat {
                    suite.sampling.thinking
                } else {
                    None
                },
            },
            input_tokens_requested: requested,
            input_tokens_counted: counted.map(|c| c as u64),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_suites_parse_and_validate() {
        for (n, _) in BUILTIN_SUITES {
            let s = Suite::load(n).unwrap_or_else(|e| panic!("{n}: {e}"));
            assert_eq!(&s.name, n);
        }
        assert!(Suite::load("no-such-suite")
            .unwrap_err()
            .to_string()
            .contains("--suite"));
    }

    #[test]
    fn bad_suites_name_the_field() {
        let p = Path::new("x.toml");
        let base = "name='x'\n[workload]\nkind='fixed'\ninput_tokens=16\noutput_tokens=8\n[load]\nconcurrency=[1]\nrequests=2\n";
        assert!(Suite::from_toml(base, p).is_ok());
        let e = Suite::from_toml(&base.replace("input_tokens=16\n", ""), p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("input_tokens") && e.contains("x.toml"), "{e}");
        let e = Suite::from_toml(&base.replace("concurrency=[1]", "concurrency=[0]"), p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("load.concurrency"), "{e}");
        let e = Suite::from_toml(&format!("{base}bogus=1\n"), p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
        let e = Suite::from_toml(&base.replace("'fixed'", "'weird'"), p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("weird") || e.contains("kind"), "{e}");
        let open = base.replace("concurrency=[1]", "mode='open'\nrates=[-1.0]");
        assert!(Suite::from_toml(&open, p)
            .unwrap_err()
            .to_string()
            .contains("load.rates"));
    }

    /// A whitespace "tokenizer": one token per word plus one per period, to test fitting.
    fn word_counter() -> TokenCounter {
        use tokenizers::models::wordlevel::WordLevel;
        use tokenizers::pre_tokenizers::whitespace::Whitespace;
        let mut vocab = std::collections::HashMap::new();
        vocab.insert("[UNK]".to_string(), 0u32);
        let model = WordLevel::builder()
            .vocab(vocab.into_iter().collect())
            .unk_token("[UNK]".into())
            .build()
            .unwrap();
        let mut t = tokenizers::Tokenizer::new(model);
        t.with_pre_tokenizer(Some(Whitespace {}));
        TokenCounter::Local(Arc::new(t))
    }

    #[tokio::test]
    async fn fixed_prompts_are_token_exact_and_unique() {
        let mut s = Suite::load("tiny").unwrap();
        s.workload.input_tokens = Some(40);
        let c = word_counter();
        let reqs = prepare(&s, &c, "m", "abc", 5, Some(4096)).await.unwrap();
        assert_eq!(reqs.len(), 5);
        for r in &reqs {
            assert_eq!(
                c.count(&r.req.prompt).await.unwrap(),
                Some(40),
                "{}",
                r.req.prompt
            );
            assert_eq!(r.input_tokens_counted, Some(40));
        }
        let mut p: Vec<_> = reqs.iter().map(|r| r.req.prompt.clone()).collect();
        p.sort();
        p.dedup();
        assert_eq!(p.len(), 5, "salted prompts are unique");
        // Too long for the context: a clear error.
        let e = prepare(&s, &c, "m", "abc", 1, Some(50))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("context"), "{e}");
    }

    #[tokio::test]
    async fn shared_prefix_prompts_share_their_start() {
        let mut s = Suite::load("shared-prefix").unwrap();
        s.workload.input_tokens = Some(60);
        s.workload.shared_prefix_tokens = Some(30);
        let c = word_counter();
        let reqs = prepare(&s, &c, "m", "n1", 3, None).await.unwrap();
        let a = &reqs[0].req.prompt;
        let b = &reqs[1].req.prompt;
        let common = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
        let shared = c.count(&a[..common]).await.unwrap().unwrap();
        assert!(shared >= 30, "{shared}: {a} / {b}");
        for r in &reqs {
            assert_eq!(r.input_tokens_counted, Some(60));
        }
    }
}
