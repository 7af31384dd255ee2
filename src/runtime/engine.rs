//! The engine: one thread that owns the backend and the scheduler and runs steps while there is
//! work; requests arrive and are aborted through a channel, and each request's outputs (text
//! deltas split into reasoning and content, token counts, finish reason) go back on its own
//! channel. Detokenization, stop strings, EOS, `max_tokens` and metrics live here too.
//!
//! [`load`] builds everything from a [`ServeConfig`]: weights (synthesized or read), tokenizer,
//! chat template, KV capacity; [`spawn`] starts the thread and returns an [`EngineHandle`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc as tmpsc, oneshot};

use anyhow::Context;

use super::backend::cpu::CpuBackend;
use super::backend::cuda::{CudaBackend, CudaLoadSpec, WeightSource};
use super::backend::RowSampling;
use super::backend::{Backend, Device, KvCacheSpec};
use super::config::{
    ModelConfig, ModelProvenance, ModelSource, QuantRecipe, ServeConfig, SpecConfig, WeightFormat,
};
use super::kv_cache::{BlockPool, KvCapacity};
use super::memory::KvPlan;
use super::sampler::{Sampler, SamplingParams};
use super::scheduler::{Scheduled, Scheduler, SchedulerConfig, Seq};
use super::spec::{self, NgramDrafter, SpecStats};
use super::template::ChatTemplate;
use super::tokenizer::{IncrementalDecoder, Tokenizer};
use super::vllm_metrics::{CacheInfo, FinishedLabel, Metrics};
use super::weights::MappedCheckpoint;
use crate::RigError;

/// Why prefix caching is off for Gated-DeltaNet hybrids (printed at start when it was asked for).
/// `--max-num-seqs` when not given (vLLM's default).
pub const DEFAULT_MAX_NUM_SEQS: usize = 256;

/// Why prefix caching is off for a Gated-DeltaNet hybrid.
pub const HYBRID_NO_PREFIX_CACHING: &str = "prefix caching off for this hybrid: a cached prefix holds the KV of its full-attention layers but not the Gated-DeltaNet state after it, so a hit could not be resumed (the runtime does not snapshot the state at block boundaries)";

/// How generated text is split into reasoning and content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningMode {
    /// Everything is content (completions; chat with thinking off).
    Off,
    /// The prompt left a `<think>` block open: text up to `</think>` is reasoning.
    InThink,
    /// Reasoning only if the output starts with `<think>` (templates that do not open it).
    Detect,
}

/// A generation request for the engine.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Prompt token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Sampling settings.
    pub params: SamplingParams,
    /// Most tokens to generate (≥ 1).
    pub max_tokens: usize,
    /// Keep generating through EOS.
    pub ignore_eos: bool,
    /// Stop strings (matched in the generated text; excluded from the output).
    pub stop: Vec<String>,
    /// Reasoning split.
    pub reasoning: ReasoningMode,
    /// When the request arrived (TTFT and E2E are measured from here).
    pub arrival: Instant,
}

/// Why a request finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS or a stop string (OpenAI `"stop"`).
    Stop,
    /// `max_tokens` or the context length (OpenAI `"length"`).
    Length,
    /// Aborted by the server.
    Abort,
    /// The engine failed on this request.
    Error(String),
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_openai(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error(_) => "error",
        }
    }
}

/// A token's log-probability under the model (log-softmax of the raw logits, before
/// temperature and top-k/top-p, as vLLM reports by default) and the most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub token: u32,
    /// Its log-probability, nats.
    pub logprob: f32,
    /// Its rank among all tokens (1 = the most likely).
    pub rank: usize,
    /// The `k` most likely tokens and their log-probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprob {
    /// The log-probability of `token` in a logit row, with the `k` most likely alternatives.
    pub fn of(row: &[f32], token: u32, k: usize) -> Self {
        let lp = super::direct::log_softmax(row);
        let chosen = lp.get(token as usize).copied().unwrap_or(f64::NEG_INFINITY);
        let rank = 1 + lp.iter().filter(|v| **v > chosen).count();
        let mut top: Vec<(u32, f32)> = Vec::with_capacity(k);
        if k > 0 {
            let mut idx: Vec<usize> = (0..lp.len()).collect();
            let k = k.min(idx.len());
            idx.select_nth_unstable_by(k.saturating_sub(1), |a, b| {
                lp[*b].total_cmp(&lp[*a]).then(a.cmp(b))
            });
            idx.truncate(k);
            idx.sort_by(|a, b| lp[*b].total_cmp(&lp[*a]).then(a.cmp(b)));
            top = idx.into_iter().map(|i| (i as u32, lp[i] as f32)).collect();
        }
        TokenLogprob {
            token,
            logprob: chosen as f32,
            rank,
            top,
        }
    }
}

/// One step's output for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestOutput {
    /// New content text.
    pub content: String,
    /// New reasoning text.
    pub reasoning: String,
    /// Tokens generated in this step.
    pub new_tokens: usize,
    /// Set on the last output.
    pub finish: Option<FinishReason>,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    /// Tokens generated so far.
    pub completion_tokens: usize,
    /// Log-probabilities of this output's tokens (when the request asked for them).
    pub logprobs: Vec<TokenLogprob>,
    /// Log-probabilities of the prompt tokens, one per prompt position (`None` for the first,
    /// which nothing predicts); on the first output of a request that asked for them.
    pub prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
}

/// Engine settings derived from a [`ServeConfig`].
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Scheduler limits.
    pub scheduler: SchedulerConfig,
    /// KV blocks and their layout.
    pub kv: KvCacheSpec,
    /// Longest prompt + output.
    pub max_model_len: usize,
    /// Prefix caching on.
    pub enable_prefix_caching: bool,
    /// Speculative decoding.
    pub spec: Option<SpecConfig>,
    /// Seed for requests without one.
    pub seed: u64,
}

/// Facts about a loaded engine, for logs and endpoints.
#[derive(Debug, Clone)]
pub struct EngineInfo {
    /// Name clients use.
    pub served_model_name: String,
    /// The `--model` value.
    pub model: String,
    /// Backend name (`cpu`, `cuda`).
    pub backend: String,
    /// The device, as the backend describes it (`cpu`, `cuda:0 (NVIDIA H200, sm_90)`).
    pub device: String,
    /// Where the weights came from (synthetic seed, or checkpoint path and content hash).
    pub provenance: ModelProvenance,
    /// Model shape.
    pub model_config: ModelConfig,
    /// Linear-layer weight format.
    pub weight_format: WeightFormat,
    /// Weight bytes as stored.
    pub weight_bytes: u64,
    /// KV capacity.
    pub capacity: KvCapacity,
    /// KV layout.
    pub kv: KvCacheSpec,
    /// The KV-cache plan (budget, its source, device memory facts).
    pub kv_plan: KvPlan,
    /// Prefix caching on.
    pub enable_prefix_caching: bool,
    /// Speculative decoding.
    pub spec: Option<SpecConfig>,
    /// Tokenizer source.
    pub tokenizer_source: String,
    /// Chat template source.
    pub template_source: String,
    /// Config defaults taken and loader notes (printed at start).
    pub notes: Vec<String>,
}

struct TextChannel {
    dec: IncrementalDecoder,
    pending: String,
}

impl TextChannel {
    fn new() -> Self {
        TextChannel {
            dec: IncrementalDecoder::new(),
            pending: String::new(),
        }
    }

    /// Add decoded text; returns (text to emit, stop string matched).
    fn push(&mut self, text: &str, stops: &[String], hold: usize, last: bool) -> (String, bool) {
        self.pending.push_str(text);
        let found = stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(i) = found {
            let out = self.pending[..i].to_string();
            self.pending.clear();
            return (out, true);
        }
        let mut cut = if last {
            self.pending.len()
        } else {
            self.pending.len().saturating_sub(hold)
        };
        while !self.pending.is_char_boundary(cut) {
            cut -= 1;
        }
        let out: String = self.pending.drain(..cut).collect();
        (out, false)
    }
}

struct TextState {
    mode_reasoning: bool,
    detect: bool,
    first: bool,
    think_start: Option<u32>,
    think_end: Option<u32>,
    reasoning: TextChannel,
    content: TextChannel,
    stops: Vec<String>,
    hold: usize,
}

#[derive(Default)]
struct Delta {
    reasoning: String,
    content: String,
    stopped: bool,
}

impl TextState {
    fn new(mode: ReasoningMode, tok: &Tokenizer, stops: Vec<String>) -> Self {
        let hold = stops
            .iter()
            .map(|s| s.len())
            .max()
            .unwrap_or(1)
            .saturating_sub(1);
        let usable = tok.think_end.is_some();
        TextState {
            mode_reasoning: usable && mode == ReasoningMode::InThink,
            detect: usable && mode == ReasoningMode::Detect,
            first: true,
            think_start: tok.think_start,
            think_end: tok.think_end,
            reasoning: TextChannel::new(),
            content: TextChannel::new(),
            stops,
            hold,
        }
    }

    fn push(&mut self, tok: &Tokenizer, id: u32, d: &mut Delta) {
        let first = std::mem::replace(&mut self.first, false);
        if first && self.detect && Some(id) == self.think_start {
            self.mode_reasoning = true;
            return;
        }
        if self.mode_reasoning {
            if Some(id) == self.think_end {
                let tail = self.reasoning.dec.flush(tok);
                let (out, stopped) = self.reasoning.push(&tail, &self.stops, self.hold, true);
                d.reasoning.push_str(&out);
                d.stopped |= stopped;
                self.mode_reasoning = false;
                return;
            }
            let t = self.reasoning.dec.step(tok, id);
            let (out, stopped) = self.reasoning.push(&t, &self.stops, self.hold, false);
            d.reasoning.push_str(&out);
            d.stopped |= stopped;
        } else {
            let t = self.content.dec.step(tok, id);
            let (out, stopped) = self.content.push(&t, &self.stops, self.hold, false);
            d.content.push_str(&out);
            d.stopped |= stopped;
        }
    }

    fn finish(&mut self, tok: &Tokenizer, d: &mut Delta) {
        for (ch, out) in [
            (&mut self.reasoning, &mut d.reasoning),
            (&mut self.content, &mut d.content),
        ] {
            let tail = ch.dec.flush(tok);
            let (o, _) = ch.push(&tail, &self.stops, self.hold, true);
            out.push_str(&o);
        }
    }
}

struct ReqState {
    tx: tmpsc::UnboundedSender<RequestOutput>,
    sampler: Sampler,
    max_tokens: usize,
    ignore_eos: bool,
    text: TextState,
    arrival: Instant,
    last_token_at: Option<Instant>,
    num_prompt: usize,
    num_output: usize,
    cached_tokens: usize,
    /// Alternatives per generated token's log-probability, when asked for.
    logprobs: Option<usize>,
    /// Alternatives per prompt token's log-probability, when asked for, and the entries so far.
    prompt_logprobs: Option<(usize, Vec<Option<TokenLogprob>>)>,
}

/// Commands to the engine thread.
enum Command {
    Add(
        u64,
        Box<GenerateRequest>,
        tmpsc::UnboundedSender<RequestOutput>,
    ),
    Abort(u64),
    ResetPrefixCache(oneshot::Sender<()>),
    Shutdown,
}

/// The engine (runs on its own thread after [`spawn`]; usable synchronously in tests).
pub struct Engine {
    backend: Box<dyn Backend>,
    scheduler: Scheduler,
    tokenizer: Arc<Tokenizer>,
    eos: HashSet<u32>,
    reqs: HashMap<u64, ReqState>,
    drafter: Option<NgramDrafter>,
    spec_stats: SpecStats,
    metrics: Arc<Metrics>,
    config: EngineConfig,
    /// Ids never sampled for `ignore_eos` requests (special and invisible tokens).
    suppress_ignore_eos: Arc<Vec<u32>>,
    /// The visible token (`a`) that replaces a suppressed one sampled on the device for an
    /// `ignore_eos` request: the device sampler takes no mask, the host sampler masks.
    ignore_eos_fallback: u32,
}

impl Engine {
    /// An engine over a backend whose KV cache it initializes from `config.kv`.
    ///
    /// # Errors
    /// When the backend cannot allocate the KV cache.
    pub fn new(
        mut backend: Box<dyn Backend>,
        tokenizer: Arc<Tokenizer>,
        config: EngineConfig,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        backend.init_kv_cache(config.kv)?;
        // Hybrids: one recurrent-state slot per sequence that may run (a no-op otherwise).
        backend.init_state_slots(config.scheduler.max_num_seqs)?;
        let pool = BlockPool::new(
            config.kv.num_blocks,
            config.kv.block_size,
            config.enable_prefix_caching,
        );
        let drafter = config.spec.as_ref().map(|s| NgramDrafter {
            k: s.num_speculative_tokens,
            min_n: s.prompt_lookup_min,
            max_n: s.prompt_lookup_max,
        });
        Ok(Engine {
            backend,
            scheduler: Scheduler::new(config.scheduler, pool),
            eos: tokenizer.eos_ids.iter().copied().collect(),
            ignore_eos_fallback: {
                let banned = tokenizer.suppressed_under_ignore_eos();
                tokenizer
                    .encode("a", false)
                    .ok()
                    .and_then(|v| v.first().copied())
                    .filter(|t| !banned.contains(t))
                    .or_else(|| (0u32..).take(1 << 20).find(|t| !banned.contains(t)))
                    .unwrap_or(0)
            },
            suppress_ignore_eos: Arc::new(tokenizer.suppressed_under_ignore_eos()),
            tokenizer,
            reqs: HashMap::new(),
            spec_stats: SpecStats::new(drafter.map_or(0, |d| d.k)),
            drafter,
            metrics,
            config,
        })
    }

    /// Stop the engine and hand its backend back (the runtime benchmarks reuse it).
    pub fn into_backend(self) -> Box<dyn Backend> {
        self.backend
    }

    /// Queue a request under `id`; outputs go to `tx`.
    pub fn add(
        &mut self,
        id: u64,
        req: GenerateRequest,
        tx: tmpsc::UnboundedSender<RequestOutput>,
    ) {
        let num_prompt = req.prompt.len();
        let (logprobs, prompt_logprobs) = (req.params.logprobs, req.params.prompt_logprobs);
        let text = TextState::new(req.reasoning, &self.tokenizer, req.stop.clone());
        let fallback = self.config.seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.reqs.insert(
            id,
            ReqState {
                tx,
                sampler: if req.ignore_eos {
                    // Under ignore_eos an EOS or another special token would be emitted as
                    // invisible output; never sample them (nor, for the byte tokenizer, bytes
                    // that are not printable text).
                    Sampler::new(req.params, fallback)
                        .with_suppressed(self.suppress_ignore_eos.clone())
                } else {
                    Sampler::new(req.params, fallback)
                },
                max_tokens: req.max_tokens.max(1),
                ignore_eos: req.ignore_eos,
                text,
                arrival: req.arrival,
                last_token_at: None,
                num_prompt,
                num_output: 0,
                cached_tokens: 0,
                logprobs,
                prompt_logprobs: prompt_logprobs.map(|k| (k, vec![None; num_prompt])),
            },
        );
        let mut seq = Seq::new(id, req.prompt);
        seq.prompt_logits = prompt_logprobs.is_some();
        self.scheduler.add(seq);
        self.publish_gauges();
    }

    /// Abort a request and free its blocks (no output is sent).
    pub fn abort(&mut self, id: u64) {
        if self.scheduler.remove(id).is_some() {
            self.metrics
                .update(|m| m.finished[FinishedLabel::Abort as usize] += 1);
        }
        self.reqs.remove(&id);
        self.publish_gauges();
    }

    /// Forget all cached prefixes.
    pub fn reset_prefix_cache(&mut self) {
        self.scheduler.reset_prefix_cache();
    }

    /// Whether requests are queued or running.
    pub fn has_work(&self) -> bool {
        self.scheduler.has_work()
    }

    /// The scheduler (for inspection in tests).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    fn publish_gauges(&self) {
        let (running, waiting, usage) = (
            self.scheduler.running().len(),
            self.scheduler.num_waiting(),
            self.scheduler.pool().usage(),
        );
        let (prefix, pre) = (self.scheduler.prefix_stats, self.scheduler.num_preemptions);
        let spec = self.drafter.is_some().then(|| self.spec_stats.clone());
        self.metrics.update(|m| {
            m.running = running;
            m.waiting = waiting;
            m.set_kv_usage(usage);
            m.prefix = prefix;
            m.preemptions = pre;
            if spec.is_some() {
                m.spec = spec;
            }
        });
    }

    fn fail(&mut self, id: u64, msg: &str) {
        self.scheduler.remove(id);
        if let Some(r) = self.reqs.remove(&id) {
            let _ = r.tx.send(RequestOutput {
                content: String::new(),
                reasoning: String::new(),
                new_tokens: 0,
                finish: Some(FinishReason::Error(msg.to_string())),
                prompt_tokens: r.num_prompt,
                cached_tokens: r.cached_tokens,
                completion_tokens: r.num_output,
                logprobs: Vec::new(),
                prompt_logprobs: None,
            });
            self.metrics
                .update(|m| m.finished[FinishedLabel::Abort as usize] += 1);
        }
    }

    /// Run one step. Returns whether anything was computed.
    ///
    /// # Errors
    /// Never for request-level failures (those finish the request with an error); only for
    /// a broken engine invariant.
    pub fn step(&mut self) -> anyhow::Result<bool> {
        let plan = self.scheduler.schedule();
        if plan.is_empty() {
            if self.scheduler.running().is_empty() && self.scheduler.num_waiting() > 0 {
                // Cannot happen when one max_model_len request fits (checked at load); fail the
                // head of the queue rather than spin.
                let head = self.scheduler.first_waiting();
                if let Some(id) = head {
                    self.fail(id, "the request does not fit in the KV cache");
                }
            }
            self.publish_gauges();
            return Ok(false);
        }
        let batch = self.scheduler.batch(&plan);
        let now;
        // Log-probabilities need the logit rows on the host.
        let wants_rows = |p: &Scheduled| {
            self.reqs
                .get(&p.id)
                .is_some_and(|r| r.logprobs.is_some() || r.prompt_logprobs.is_some())
        };
        if self.backend.samples_on_device()
            && plan.iter().all(|p| p.drafts.is_empty() && !wants_rows(p))
        {
            // Sample on the device: only token ids cross to the host.
            let mut rows = Vec::new();
            for p in plan.iter().filter(|p| p.samples) {
                rows.push(match self.reqs.get(&p.id) {
                    Some(r) => {
                        let sp = r.sampler.params();
                        RowSampling {
                            temperature: sp.temperature,
                            top_p: sp.top_p,
                            top_k: sp.top_k.min(i32::MAX as usize) as i32,
                            seed: r.sampler.seed(),
                            draw: r.num_output as u64,
                        }
                    }
                    None => RowSampling {
                        temperature: 0.0,
                        top_p: 1.0,
                        top_k: 0,
                        seed: 0,
                        draw: 0,
                    },
                });
            }
            let tokens = match self.backend.forward_sampled(&batch, &rows) {
                Ok(t) => t,
                Err(e) => {
                    let msg = format!("forward pass failed: {e:#}");
                    for p in &plan {
                        self.fail(p.id, &msg);
                    }
                    self.publish_gauges();
                    return Ok(true);
                }
            };
            now = Instant::now();
            let mut row = 0;
            for p in &plan {
                if !p.samples {
                    self.scheduler.commit(p.id, p.num_tokens, &[]);
                    continue;
                }
                let t = tokens.get(row).copied();
                row += 1;
                let (Some(mut t), Some(r)) = (t, self.reqs.get(&p.id)) else {
                    continue;
                };
                // The device sampler cannot mask: a special or invisible token sampled for an
                // ignore_eos request is replaced by a visible one before it is committed.
                if r.ignore_eos && self.suppress_ignore_eos.binary_search(&t).is_ok() {
                    t = self.ignore_eos_fallback;
                }
                self.scheduler.commit(p.id, p.num_tokens, &[t]);
                let total_len = self.scheduler.get(p.id).map_or(0, |s| s.tokens.len());
                let cached = self.scheduler.get(p.id).map_or(0, |s| s.num_cached_tokens);
                self.process(p.id, &[t], total_len, cached, now, Vec::new());
            }
        } else {
            let logits = match self.backend.forward(&batch) {
                Ok(l) => l,
                Err(e) => {
                    let msg = format!("forward pass failed: {e:#}");
                    for p in &plan {
                        self.fail(p.id, &msg);
                    }
                    self.publish_gauges();
                    return Ok(true);
                }
            };
            now = Instant::now();
            let mut row = 0;
            for p in &plan {
                let rows = self.scheduler.logit_rows(p);
                // Rows before the sampling row(s) predict prompt tokens (prompt log-probs).
                let prompt_rows = if p.samples {
                    rows.saturating_sub(1 + p.drafts.len())
                } else {
                    rows
                };
                if prompt_rows > 0 {
                    let tokens = self
                        .scheduler
                        .get(p.id)
                        .map(|s| s.tokens.clone())
                        .unwrap_or_default();
                    if let Some((k, lps)) = self
                        .reqs
                        .get_mut(&p.id)
                        .and_then(|r| r.prompt_logprobs.as_mut())
                    {
                        for j in 0..prompt_rows {
                            let next = p.first_pos + j + 1;
                            if let (Some(slot), Some(&t)) = (lps.get_mut(next), tokens.get(next)) {
                                *slot = Some(TokenLogprob::of(logits.row(row + j), t, *k));
                            }
                        }
                    }
                }
                if !p.samples {
                    self.scheduler.commit(p.id, p.num_tokens, &[]);
                    row += rows;
                    continue;
                }
                let sample_row = row + prompt_rows;
                row += rows;
                let Some(r) = self.reqs.get_mut(&p.id) else {
                    continue;
                };
                let v = spec::verify(&logits, sample_row, &p.drafts, &mut r.sampler);
                let lps: Vec<TokenLogprob> = match r.logprobs {
                    Some(k) => v
                        .tokens
                        .iter()
                        .enumerate()
                        .map(|(i, t)| TokenLogprob::of(logits.row(sample_row + i), *t, k))
                        .collect(),
                    None => Vec::new(),
                };
                if self.drafter.is_some() {
                    self.spec_stats.record(p.drafts.len(), v.accepted);
                }
                self.scheduler
                    .commit(p.id, p.num_tokens + v.accepted, &v.tokens);
                let total_len = self.scheduler.get(p.id).map_or(0, |s| s.tokens.len());
                let cached = self.scheduler.get(p.id).map_or(0, |s| s.num_cached_tokens);
                self.process(p.id, &v.tokens, total_len, cached, now, lps);
            }
        }
        let _ = now;
        // Drafts for the next step.
        if let Some(d) = self.drafter {
            let max_len = self.config.max_model_len;
            for s in self.scheduler.running_mut() {
                if !s.is_decoding() {
                    continue;
                }
                let Some(r) = self.reqs.get(&s.id) else {
                    continue;
                };
                // Room for k drafts + the bonus token within max_tokens and max_model_len.
                let left_out = r.max_tokens.saturating_sub(r.num_output);
                let left_ctx = max_len.saturating_sub(s.tokens.len());
                let limit = left_out.min(left_ctx).saturating_sub(1);
                s.drafts = d.propose(&s.tokens, limit);
            }
        }
        self.publish_gauges();
        Ok(true)
    }

    /// Turn a sequence's new tokens into text and outputs; finish it when due.
    fn process(
        &mut self,
        id: u64,
        tokens: &[u32],
        total_len: usize,
        cached: usize,
        now: Instant,
        mut logprobs: Vec<TokenLogprob>,
    ) {
        let Some(r) = self.reqs.get_mut(&id) else {
            return;
        };
        r.cached_tokens = cached;
        let first = r.num_output == 0;
        let mut d = Delta::default();
        let mut finish = None;
        let mut produced = 0;
        // total_len counts all new tokens; find the length before them.
        let base_len = total_len - tokens.len();
        for (i, &t) in tokens.iter().enumerate() {
            produced += 1;
            r.num_output += 1;
            if !r.ignore_eos && self.eos.contains(&t) {
                finish = Some(FinishReason::Stop);
                break;
            }
            r.text.push(&self.tokenizer, t, &mut d);
            if d.stopped {
                finish = Some(FinishReason::Stop);
                break;
            }
            if r.num_output >= r.max_tokens || base_len + i + 1 >= self.config.max_model_len {
                finish = Some(FinishReason::Length);
                break;
            }
        }
        if matches!(finish, Some(FinishReason::Length))
            || (finish == Some(FinishReason::Stop) && !d.stopped)
        {
            r.text.finish(&self.tokenizer, &mut d);
        }
        logprobs.truncate(produced);
        let out = RequestOutput {
            content: d.content,
            reasoning: d.reasoning,
            new_tokens: produced,
            finish: finish.clone(),
            prompt_tokens: r.num_prompt,
            cached_tokens: cached,
            completion_tokens: r.num_output,
            logprobs,
            prompt_logprobs: if first {
                r.prompt_logprobs.take().map(|(_, v)| v)
            } else {
                None
            },
        };
        let (arrival, last, num_prompt, num_output) =
            (r.arrival, r.last_token_at, r.num_prompt, r.num_output);
        r.last_token_at = Some(now);
        let tx = r.tx.clone();
        // Metrics and the block pool are updated before the client hears of the output, so a
        // client that scrapes /metrics right after its response sees its request counted.
        self.metrics.update(|m| {
            m.generation_tokens += produced as u64;
            if first {
                m.prompt_tokens += num_prompt as u64;
                m.ttft.observe(now.duration_since(arrival).as_secs_f64());
            } else if let Some(l) = last {
                m.itl.observe(now.duration_since(l).as_secs_f64());
            }
            if let Some(f) = &finish {
                m.e2e.observe(now.duration_since(arrival).as_secs_f64());
                m.prompt_len.observe(num_prompt as f64);
                m.gen_len.observe(num_output as f64);
                let label = match f {
                    FinishReason::Stop => FinishedLabel::Stop,
                    FinishReason::Length => FinishedLabel::Length,
                    _ => FinishedLabel::Abort,
                };
                m.finished[label as usize] += 1;
            }
        });
        if finish.is_some() {
            self.scheduler.remove(id);
            self.reqs.remove(&id);
            self.publish_gauges();
        }
        let sent = tx.send(out).is_ok();
        if finish.is_none() && !sent {
            // The client is gone.
            self.abort(id);
        }
    }

    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Add(id, req, tx) => self.add(id, *req, tx),
            Command::Abort(id) => self.abort(id),
            Command::ResetPrefixCache(done) => {
                self.reset_prefix_cache();
                let _ = done.send(());
            }
            Command::Shutdown => return false,
        }
        true
    }

    fn run(mut self, rx: mpsc::Receiver<Command>) {
        'outer: loop {
            if !self.has_work() {
                match rx.recv() {
                    Ok(c) => {
                        if !self.handle(c) {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(c) => {
                        if !self.handle(c) {
                            break 'outer;
                        }
                    }
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => break 'outer,
                }
            }
            if self.has_work() {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step()));
                let failure = match r {
                    Ok(Ok(_)) => None,
                    Ok(Err(e)) => Some(format!("{e:#}")),
                    Err(p) => Some(
                        p.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "engine panic".into()),
                    ),
                };
                if let Some(msg) = failure {
                    eprintln!("rigbench serve: engine step failed: {msg}");
                    let ids: Vec<u64> = self.reqs.keys().copied().collect();
                    for id in ids {
                        self.fail(id, &msg);
                    }
                    self.publish_gauges();
                }
            }
        }
    }
}

/// A handle to the engine thread (cheap to clone).
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Command>,
    next_id: Arc<AtomicU64>,
    /// Metrics the engine updates.
    pub metrics: Arc<Metrics>,
    /// Facts about the engine.
    pub info: Arc<EngineInfo>,
    /// The tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template.
    pub template: Arc<ChatTemplate>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("info", &self.info)
            .finish()
    }
}

impl EngineHandle {
    /// Submit a request; returns its id and the receiver of its outputs.
    ///
    /// # Errors
    /// When the engine thread has stopped.
    pub fn submit(
        &self,
        req: GenerateRequest,
    ) -> anyhow::Result<(u64, tmpsc::UnboundedReceiver<RequestOutput>)> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tmpsc::unbounded_channel();
        self.tx
            .send(Command::Add(id, Box::new(req), tx))
            .map_err(|_| anyhow::anyhow!("the engine has stopped"))?;
        Ok((id, rx))
    }

    /// Abort a request (a no-op if it already finished).
    pub fn abort(&self, id: u64) {
        let _ = self.tx.send(Command::Abort(id));
    }

    /// Forget all cached prefixes; resolves once done.
    ///
    /// # Errors
    /// When the engine thread has stopped.
    pub async fn reset_prefix_cache(&self) -> anyhow::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::ResetPrefixCache(tx))
            .map_err(|_| anyhow::anyhow!("the engine has stopped"))?;
        rx.await
            .map_err(|_| anyhow::anyhow!("the engine has stopped"))
    }

    /// Ask the engine thread to stop.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
    }
}

/// Everything [`load`] builds.
pub struct Loaded {
    /// The engine, not yet running.
    pub engine: Engine,
    /// Facts.
    pub info: EngineInfo,
    /// Tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Chat template.
    pub template: Arc<ChatTemplate>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
}

fn read_generation_eos(dir: &std::path::Path) -> anyhow::Result<Vec<u32>> {
    let p = dir.join("generation_config.json");
    if !p.is_file() {
        return Ok(Vec::new());
    }
    let text =
        std::fs::read_to_string(&p).map_err(|e| RigError::file(&p, format!("cannot read: {e}")))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| RigError::file(&p, format!("not valid JSON: {e}")))?;
    Ok(match v.get("eos_token_id") {
        Some(serde_json::Value::Number(n)) => {
            n.as_u64().map(|x| vec![x as u32]).unwrap_or_default()
        }
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().map(|x| x as u32))
            .collect(),
        _ => Vec::new(),
    })
}

/// Load weights, tokenizer and template for `config`, build the backend for `config.device`
/// (CPU: weights on the host; CUDA: [`CudaBackend::load`], synthetic presets generated and
/// `--quantize` applied on the GPU), plan the KV cache from the backend's memory facts
/// ([`super::memory::plan_kv`]) and build the engine.
///
/// # Errors
/// [`RigError::BadFlag`] / [`RigError::BadFile`] naming the flag or file at fault (unknown
/// preset, missing checkpoint files, a checkpoint the runtime refuses — with `inspect`'s
/// finding id —, a KV budget too small for `max_model_len`, ...); a GPU backend that cannot
/// load (its reason) or cannot allocate the KV cache (asked and free sizes).
pub fn load(config: &ServeConfig) -> anyhow::Result<Loaded> {
    config.validate()?;
    let source = config.source()?;
    let mut notes: Vec<String> = Vec::new();
    // The shape, tokenizer, template and provenance; a checkpoint is mapped (headers only
    // read) and its format resolved here, before any weight is touched.
    let ModelParts {
        config: mc,
        tokenizer,
        template,
        provenance,
        mapped,
        gguf_weights,
    } = read_model(config, &source, &mut notes)?;
    let max_model_len = check_load_flags(config, mapped.as_ref(), &mc)?;
    let backend = build_backend(config, &source, &mc, mapped, gguf_weights, max_model_len)?;
    let memory = backend.device_memory();
    let hybrid = backend.config().is_hybrid();
    let enable_prefix_caching = config.enable_prefix_caching && !hybrid;
    if hybrid {
        if config.enable_prefix_caching {
            notes.push(HYBRID_NO_PREFIX_CACHING.to_string());
        }
        if config.speculative.is_some() && !backend.supports_state_rollback() {
            return Err(RigError::flag(
                "--spec-method",
                format!(
                    "n-gram speculation on a Gated-DeltaNet hybrid needs the recurrent state rolled back to the last accepted draft, which the {} backend does not implement; run without --spec-method (or on --device cpu)",
                    backend.name()
                ),
            )
            .into());
        }
    }
    let plan = plan_kv(
        config,
        backend.as_ref(),
        memory.as_ref(),
        max_model_len,
        hybrid,
    )?;
    let capacity = plan.capacity();
    let mc = backend.config().clone();
    let kv = KvCacheSpec {
        num_blocks: capacity.num_blocks,
        block_size: config.block_size,
        dtype: config.kv_cache_dtype,
    };
    let device_kind = backend.name().to_string();
    let info = EngineInfo {
        served_model_name: config.served_name().to_string(),
        model: config.model.clone(),
        backend: device_kind.clone(),
        device: backend.device_label(),
        provenance,
        model_config: mc.clone(),
        weight_format: backend.weight_format(),
        weight_bytes: backend.weight_bytes(),
        capacity,
        kv,
        kv_plan: plan.clone(),
        enable_prefix_caching,
        spec: config.speculative.clone(),
        tokenizer_source: tokenizer.source.clone(),
        template_source: template.source.clone(),
        notes,
    };
    let metrics = Arc::new(Metrics::new(
        config.served_name(),
        CacheInfo {
            block_size: config.block_size,
            num_blocks: capacity.num_blocks,
            device_kind: device_kind.clone(),
            gpu_memory_utilization: plan.gpu_memory_utilization,
            cache_dtype: config.kv_cache_dtype.vllm_name().into(),
            enable_prefix_caching,
        },
        max_model_len,
        config
            .speculative
            .as_ref()
            .map(|s| s.num_speculative_tokens),
    ));
    let tokenizer = Arc::new(tokenizer);
    let engine = Engine::new(
        backend,
        tokenizer.clone(),
        EngineConfig {
            scheduler: SchedulerConfig {
                // A hybrid runs at most as many sequences as it has state slots.
                max_num_seqs: if hybrid {
                    plan.state_slots
                } else {
                    config.max_num_seqs
                },
                max_num_batched_tokens: config.max_num_batched_tokens,
            },
            kv,
            max_model_len,
            enable_prefix_caching,
            spec: config.speculative.clone(),
            seed: config.seed,
        },
        metrics.clone(),
    )
    .map_err(|e| match &memory {
        Some(m) => anyhow::anyhow!(super::memory::kv_alloc_failure(
            plan.budget_bytes,
            m.free_after_load,
            &info.device,
            &format!("{e:#}"),
        )),
        None => e,
    })?;
    Ok(Loaded {
        engine,
        info,
        tokenizer,
        template: Arc::new(template),
        metrics,
    })
}

/// Refuse `--quantize` of a checkpoint stored in another format, and a `--max-model-len` beyond
/// the model's; returns the max model length.
fn check_load_flags(
    config: &ServeConfig,
    mapped: Option<&MappedCheckpoint>,
    mc: &ModelConfig,
) -> anyhow::Result<usize> {
    let stored = mapped.map_or(WeightFormat::Bf16, MappedCheckpoint::format);
    if let Some(recipe) = config.quantize {
        if stored != WeightFormat::Bf16 && QuantRecipe::Uniform(stored) != recipe {
            return Err(RigError::flag(
                "--quantize",
                format!(
                    "the checkpoint is already {}; only BF16 weights can be quantized at load",
                    stored.id()
                ),
            )
            .into());
        }
    }
    let max_model_len = config.max_model_len.unwrap_or(mc.max_position_embeddings);
    if max_model_len > mc.max_position_embeddings {
        return Err(RigError::flag(
            "--max-model-len",
            format!(
                "{max_model_len} exceeds the model's max_position_embeddings ({})",
                mc.max_position_embeddings
            ),
        )
        .into());
    }
    Ok(max_model_len)
}

/// What [`read_model`] reads of a model before any weight is touched.
struct ModelParts {
    config: ModelConfig,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    provenance: ModelProvenance,
    /// A checkpoint folder, mapped (headers read) with its format resolved.
    mapped: Option<MappedCheckpoint>,
    /// A GGUF file's weights, dequantized to BF16 while loading (both backends take them).
    gguf_weights: Option<super::weights::ModelWeights>,
}

/// The shape, tokenizer, template and provenance of the model `source` names (a synthetic
/// preset, a checkpoint folder, a GGUF file), with the notes reading it gave.
fn read_model(
    config: &ServeConfig,
    source: &ModelSource,
    notes: &mut Vec<String>,
) -> anyhow::Result<ModelParts> {
    let mut mapped = None;
    let mut gguf_weights: Option<super::weights::ModelWeights> = None;
    let (mc, tokenizer, template, provenance) = match source {
        ModelSource::Synthetic(name) => {
            let mut mc = ModelConfig::preset(name)
                .ok_or_else(|| RigError::flag("--model", format!("unknown preset {name}")))?;
            if let Some(n) = config.num_layers {
                mc.num_layers = mc.num_layers.min(n);
            }
            let tok = Tokenizer::bytes(mc.vocab_size, &[])?;
            let prov = ModelProvenance::Synthetic {
                preset: name.clone(),
                seed: config.seed,
                num_layers: mc.num_layers,
            };
            (mc, tok, ChatTemplate::builtin(), prov)
        }
        ModelSource::Dir(dir) => {
            let hf = ModelConfig::read_hf_config(&dir.join("config.json"))?;
            notes.extend(hf.warnings.iter().map(|w| format!("config.json: {w}")));
            let mut mc = hf.config;
            if let Some(n) = config.num_layers {
                mc.num_layers = mc.num_layers.min(n);
            }
            let m = MappedCheckpoint::open(dir, &mc)?;
            for n in m.notes() {
                if !notes.contains(n) {
                    notes.push(n.clone());
                }
            }
            let prov = ModelProvenance::Checkpoint {
                path: dir.display().to_string(),
                content_hash: m.content_hash(),
            };
            let mut eos = mc.eos_token_ids.clone();
            eos.extend(read_generation_eos(dir)?);
            let tok = if dir.join("tokenizer.json").is_file() {
                Tokenizer::from_dir(dir, &eos)?
            } else {
                Tokenizer::bytes(mc.vocab_size, &eos).map_err(|e| {
                    RigError::file(
                        dir.join("config.json"),
                        format!(
                            "no tokenizer.json, and the byte-level fallback cannot be used: {e}"
                        ),
                    )
                })?
            };
            let tmpl = ChatTemplate::from_dir(dir, tok.bos_token.clone(), tok.eos_token.clone())?
                .unwrap_or_else(ChatTemplate::builtin);
            mapped = Some(m);
            (mc, tok, tmpl, prov)
        }
        ModelSource::Gguf(path) => {
            let m = super::gguf_model::GgufModel::load(path, config.num_layers)?;
            notes.extend(m.notes.iter().cloned());
            let prov = ModelProvenance::Checkpoint {
                path: m.path.display().to_string(),
                content_hash: m.content_hash.clone(),
            };
            let (mc, tok, tmpl) = (m.config.clone(), m.tokenizer, m.template);
            gguf_weights = Some(m.weights);
            (mc, tok, tmpl, prov)
        }
    };
    Ok(ModelParts {
        config: mc,
        tokenizer,
        template,
        provenance,
        mapped,
        gguf_weights,
    })
}

/// The backend for `config.device`: on the CPU the weights on the host (synthesized with
/// progress lines, or read from the checkpoint; `--quantize` applied); on CUDA
/// [`CudaBackend::load`]. The mapped checkpoint is released before the weights are quantized
/// or uploaded.
fn build_backend(
    config: &ServeConfig,
    source: &ModelSource,
    mc: &ModelConfig,
    mapped: Option<MappedCheckpoint>,
    mut gguf_weights: Option<super::weights::ModelWeights>,
    max_model_len: usize,
) -> anyhow::Result<Box<dyn Backend>> {
    let backend: Box<dyn Backend> = match config.device {
        Device::Cpu => {
            let mut weights = match (&mapped, gguf_weights.take()) {
                (_, Some(w)) => w,
                (None, None) => {
                    // Large presets take minutes on a CPU: say how far synthesis is, as plain
                    // lines on stderr (a terminal is not needed), at most every 2 s.
                    let start = std::time::Instant::now();
                    let mut last = start;
                    let mut report = |done: usize, total: usize| {
                        let now = std::time::Instant::now();
                        if done > 0 && (now - last).as_secs_f64() >= 2.0 {
                            last = now;
                            eprintln!(
                                "rigbench serve: synthesizing weights: layer {done}/{total} ({:.0} s)",
                                (now - start).as_secs_f64()
                            );
                        }
                    };
                    super::weights::synthesize_with_progress(mc, config.seed, &mut report)
                }
                (Some(m), None) => m.to_weights()?,
            };
            drop(mapped);
            if let Some(recipe) = config.quantize {
                weights.quantize_recipe(recipe)?;
            }
            let threads = config
                .num_threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            Box::new(CpuBackend::new(weights, threads))
        }
        Device::Cuda(ordinal) => {
            drop(mapped);
            let weights = match source {
                ModelSource::Synthetic(_) => WeightSource::Synthetic {
                    config: mc.clone(),
                    seed: config.seed,
                },
                ModelSource::Dir(dir) => WeightSource::Checkpoint {
                    dir: dir.clone(),
                    config: mc.clone(),
                },
                ModelSource::Gguf(_) => WeightSource::Host(Box::new(
                    gguf_weights.take().context("GGUF weights not loaded")?,
                )),
            };
            let b = CudaBackend::load(CudaLoadSpec {
                device: ordinal,
                weights,
                quantize: config.quantize,
                max_num_batched_tokens: config.max_num_batched_tokens,
                max_num_seqs: config.max_num_seqs,
                max_model_len,
                kv_dtype: config.kv_cache_dtype,
                block_size: config.block_size,
            })
            .with_context(|| format!("loading {} on cuda:{ordinal}", config.model))?;
            Box::new(b)
        }
    };
    Ok(backend)
}

/// The memory plan of the KV cache (and a hybrid's state slots) from the backend's memory
/// facts; its error names the flag that sets the budget.
fn plan_kv(
    config: &ServeConfig,
    backend: &dyn Backend,
    memory: Option<&super::backend::DeviceMemory>,
    max_model_len: usize,
    hybrid: bool,
) -> anyhow::Result<KvPlan> {
    let utilization = config
        .gpu_memory_utilization
        .unwrap_or(super::memory::DEFAULT_GPU_MEMORY_UTILIZATION);
    let plan = super::memory::plan_memory(
        backend.config(),
        memory,
        utilization,
        config.kv_cache_memory,
        config.block_size,
        config.kv_cache_dtype,
        max_model_len,
        config.gpu_memory_utilization.is_some(),
        hybrid.then(|| super::memory::StateSpec {
            bytes_per_slot: backend.state_bytes_per_slot(),
            max_num_seqs: config.max_num_seqs,
        }),
    )
    .map_err(|e| {
        let flag = if config.kv_cache_memory.is_some() || memory.is_none() {
            "--kv-cache-memory"
        } else {
            "--gpu-memory-utilization"
        };
        RigError::flag(flag, e)
    })?;
    Ok(plan)
}

/// Start the engine thread.
///
/// # Errors
/// When the thread cannot be spawned.
pub fn spawn(loaded: Loaded) -> anyhow::Result<(EngineHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel();
    let Loaded {
        engine,
        info,
        tokenizer,
        template,
        metrics,
    } = loaded;
    let join = std::thread::Builder::new()
        .name("rigbench-engine".into())
        .spawn(move || engine.run(rx))?;
    Ok((
        EngineHandle {
            tx,
            next_id: Arc::new(AtomicU64::new(1)),
            metrics,
            info: Arc::new(info),
            tokenizer,
            template,
        },
        join,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::backend::{ForwardBatch, Logits};
    use crate::runtime::config::ServeConfig;

    fn engine(cfg: &ServeConfig) -> Loaded {
        load(cfg).unwrap()
    }

    fn req(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
        GenerateRequest {
            prompt,
            params: SamplingParams {
                temperature: 0.0,
                ..Default::default()
            },
            max_tokens,
            ignore_eos: true,
            stop: Vec::new(),
            reasoning: ReasoningMode::Off,
            arrival: Instant::now(),
        }
    }

    /// Run requests to completion; returns each one's generated text and token count.
    fn run(e: &mut Engine, reqs: Vec<GenerateRequest>) -> Vec<(String, usize, FinishReason)> {
        let mut rxs = Vec::new();
        for (i, r) in reqs.into_iter().enumerate() {
            let (tx, rx) = tmpsc::unbounded_channel();
            e.add(i as u64 + 1, r, tx);
            rxs.push(rx);
        }
        let mut steps = 0;
        while e.has_work() {
            e.step().unwrap();
            steps += 1;
            assert!(steps < 100_000);
        }
        rxs.into_iter()
            .map(|mut rx| {
                let mut text = String::new();
                let mut n = 0;
                let mut fin = None;
                while let Ok(o) = rx.try_recv() {
                    text.push_str(&o.reasoning);
                    text.push_str(&o.content);
                    n = o.completion_tokens;
                    if o.finish.is_some() {
                        fin = o.finish;
                    }
                }
                (text, n, fin.expect("finished"))
            })
            .collect()
    }

    fn prompt(l: &Loaded, text: &str) -> Vec<u32> {
        l.tokenizer.encode(text, false).unwrap()
    }

    /// A backend that "samples on the device" (the CUDA backend's engine path) by running the
    /// CPU backend and taking the argmax: the mock device of the engine's device-sampling path.
    struct DeviceSamplingMock(Box<dyn Backend>);

    impl Backend for DeviceSamplingMock {
        fn name(&self) -> &str {
            "mock-device"
        }
        fn config(&self) -> &ModelConfig {
            self.0.config()
        }
        fn weight_format(&self) -> WeightFormat {
            self.0.weight_format()
        }
        fn weight_bytes(&self) -> u64 {
            self.0.weight_bytes()
        }
        fn init_kv_cache(&mut self, spec: KvCacheSpec) -> anyhow::Result<()> {
            self.0.init_kv_cache(spec)
        }
        fn forward(&mut self, batch: &ForwardBatch) -> anyhow::Result<Logits> {
            self.0.forward(batch)
        }
        fn samples_on_device(&self) -> bool {
            true
        }
        fn forward_sampled(
            &mut self,
            batch: &ForwardBatch,
            rows: &[RowSampling],
        ) -> anyhow::Result<Vec<u32>> {
            let l = self.0.forward(batch)?;
            anyhow::ensure!(
                rows.len() == l.rows(),
                "{} rows for {} logit rows",
                rows.len(),
                l.rows()
            );
            Ok((0..l.rows())
                .map(|i| {
                    assert!(rows[i].temperature < 1e-5, "the test sends greedy requests");
                    super::super::sampler::argmax(l.row(i))
                })
                .collect())
        }
    }

    #[test]
    fn device_sampling_path_gives_the_host_sampling_output() {
        let cfg = ServeConfig::tiny();
        let mut host = engine(&cfg);
        let dev = engine(&cfg);
        let kv = dev.engine.config.kv;
        let econf = dev.engine.config.clone();
        let backend = dev.engine.into_backend();
        let mut mocked = Engine::new(
            Box::new(DeviceSamplingMock(backend)),
            dev.tokenizer.clone(),
            econf,
            dev.metrics.clone(),
        )
        .unwrap();
        let _ = kv;
        let prompts = ["the cat sat on the mat", "abcabc", "hi"];
        let mk = |l: &Loaded| {
            prompts
                .iter()
                .map(|p| req(prompt(l, p), 24))
                .collect::<Vec<_>>()
        };
        // Without ignore_eos both paths take the plain argmax (with it the host masks special
        // tokens and the device path replaces them: see the next test).
        let plain = |l: &Loaded| {
            mk(l)
                .into_iter()
                .map(|mut r| {
                    r.ignore_eos = false;
                    r
                })
                .collect::<Vec<_>>()
        };
        let (ra, rb) = (plain(&host), plain(&host));
        let a = run(&mut host.engine, ra);
        let b = run(&mut mocked, rb);
        assert_eq!(a, b);
        // With ignore_eos the device path never emits a special or invisible token either.
        let reqs: Vec<GenerateRequest> = (0..24)
            .map(|i| req(prompt(&host, &format!("p{i} {}", "q".repeat(i))), 16))
            .collect();
        for (i, (text, n, _)) in run(&mut mocked, reqs).into_iter().enumerate() {
            assert_eq!(n, 16);
            assert!(
                !text.trim().is_empty()
                    && !text.contains('\u{fffd}')
                    && !text.contains("<|")
                    && !text.contains("think>"),
                "request {i}: {text:?}"
            );
        }
    }

    #[test]
    fn ignore_eos_output_is_always_visible_text() {
        // Synthetic weights lock greedy decoding onto one token per prompt; when that token was
        // a special one, a whole fixed-length answer decoded to nothing and the e2e validity
        // guard called the run invalid ("empty output") at random.
        let mut l = engine(&ServeConfig::tiny());
        let suppressed = l.tokenizer.suppressed_under_ignore_eos();
        for id in [256, 257, 258, 259, 260, 0x80, 0xff, 0x00] {
            assert!(suppressed.contains(&id), "{id}");
        }
        assert!(!suppressed.contains(&u32::from(b'a')) && !suppressed.contains(&261));
        let mut reqs = Vec::new();
        for i in 0..48 {
            let mut r = req(
                prompt(&l, &format!("prompt {i}: {}", "xyz ".repeat(i % 7))),
                24,
            );
            if i % 2 == 1 {
                r.params = SamplingParams {
                    temperature: 1.0,
                    seed: Some(i as u64),
                    ..Default::default()
                };
            }
            reqs.push(r);
        }
        for (i, (text, n, fin)) in run(&mut l.engine, reqs).into_iter().enumerate() {
            assert_eq!((n, fin), (24, FinishReason::Length), "request {i}");
            assert!(!text.trim().is_empty(), "request {i}: empty output");
            assert!(
                !text.contains('\u{fffd}') && !text.contains("<|") && !text.contains("think>"),
                "request {i}: {text:?}"
            );
            assert!(text.chars().count() >= 24, "request {i}: {text:?}");
        }
    }

    #[test]
    fn speculative_greedy_equals_plain_greedy() {
        let plain_cfg = ServeConfig::tiny();
        let mut spec_cfg = ServeConfig::tiny();
        spec_cfg.speculative = Some(SpecConfig {
            num_speculative_tokens: 4,
            prompt_lookup_min: 1,
            prompt_lookup_max: 3,
        });
        let mut plain = engine(&plain_cfg);
        let mut spec = engine(&spec_cfg);
        let prompts = [
            "the cat sat on the mat; the cat sat on the",
            "abcabcabcabc",
            "hi",
        ];
        let mk = |l: &Loaded| {
            prompts
                .iter()
                .map(|p| req(prompt(l, p), 48))
                .collect::<Vec<_>>()
        };
        let reqs = mk(&plain);
        let a = run(&mut plain.engine, reqs);
        let reqs = mk(&spec);
        let b = run(&mut spec.engine, reqs);
        assert_eq!(a, b);
        let s = spec.metrics.snapshot().spec.unwrap();
        assert!(s.num_drafts > 0 && s.num_draft_tokens >= s.num_drafts);
        assert!(
            s.num_accepted_tokens > 0,
            "a repetitive greedy model accepts some drafts: {s:?}"
        );
        assert!(s.accepted_per_pos.iter().sum::<u64>() == s.num_accepted_tokens);
        assert!(plain.metrics.snapshot().spec.is_none());
        for (_, n, f) in &a {
            assert_eq!((*n, f), (48, &FinishReason::Length));
        }
    }

    fn hybrid_cfg() -> ServeConfig {
        let mut c = ServeConfig::tiny();
        c.model = "synthetic:tiny-hybrid".into();
        c
    }

    /// On a Gated-DeltaNet hybrid, n-gram speculation verifies drafts token by token through
    /// the recurrent state and rolls it back past rejected ones: the greedy output equals plain
    /// greedy output exactly, with drafts accepted and rejected along the way; sequences share
    /// state slots in turn (more requests than slots).
    #[test]
    fn hybrid_speculative_greedy_equals_plain_greedy() {
        let mut plain_cfg = hybrid_cfg();
        plain_cfg.max_num_seqs = 2;
        let mut spec_cfg = plain_cfg.clone();
        spec_cfg.speculative = Some(SpecConfig {
            num_speculative_tokens: 3,
            prompt_lookup_min: 1,
            prompt_lookup_max: 3,
        });
        let mut plain = engine(&plain_cfg);
        let mut spec = engine(&spec_cfg);
        assert_eq!(plain.engine.scheduler.running().len(), 0);
        let prompts = [
            "the cat sat on the mat; the cat sat on the",
            "abcabcabcabc",
            "hi",
            "one two one two one",
        ];
        let mk = |l: &Loaded| {
            prompts
                .iter()
                .map(|p| req(prompt(l, p), 40))
                .collect::<Vec<_>>()
        };
        let reqs = mk(&plain);
        let a = run(&mut plain.engine, reqs);
        let reqs = mk(&spec);
        let b = run(&mut spec.engine, reqs);
        assert_eq!(a, b);
        let s = spec.metrics.snapshot().spec.unwrap();
        assert!(s.num_drafts > 0, "{s:?}");
        assert!(
            s.num_draft_tokens > s.num_accepted_tokens,
            "some drafts are rejected (and rolled back): {s:?}"
        );
        for (_, n, f) in &a {
            assert_eq!((*n, f), (40, &FinishReason::Length));
        }
    }

    /// Preemption by recomputation restarts a hybrid's state from position 0 (its slot freed
    /// and retaken), and chunked prefill carries the state across chunks: every request still
    /// finishes with its full length. The tokens match the roomy run's wherever no near-tie
    /// intervenes: recomputed prefill runs the chunked form where the first run decoded token
    /// by token, which rounds differently in f32.
    #[test]
    fn hybrid_preemption_and_chunking_finish_every_request() {
        let base = hybrid_cfg();
        let mut tight = hybrid_cfg();
        let mc = ModelConfig::preset("tiny-hybrid").unwrap();
        let state = mc.gdn_state_bytes(4);
        tight.kv_cache_memory = Some(
            12 * crate::runtime::kv_cache::kv_bytes_per_block(&mc, 16, tight.kv_cache_dtype)
                + 4 * state,
        );
        tight.max_model_len = Some(128);
        tight.max_num_batched_tokens = 7;
        tight.max_num_seqs = 4;
        let mut a = engine(&base);
        let mut b = engine(&tight);
        assert_eq!(b.info.kv_plan.state_slots, 4);
        let prompts = ["one two three", "four five six seven", "eight nine", "ten"];
        let mk = |l: &Loaded| {
            prompts
                .iter()
                .map(|p| req(prompt(l, p), 48))
                .collect::<Vec<_>>()
        };
        let reqs = mk(&a);
        let ra = run(&mut a.engine, reqs);
        let reqs = mk(&b);
        let rb = run(&mut b.engine, reqs);
        assert!(
            b.engine.scheduler().num_preemptions > 0,
            "the budget forces preemption"
        );
        for ((ta, na, fa), (tb, nb, fb)) in ra.iter().zip(&rb) {
            assert_eq!((na, fa), (&48, &FinishReason::Length));
            assert_eq!((nb, fb), (&48, &FinishReason::Length));
            let common = ta
                .chars()
                .zip(tb.chars())
                .take_while(|(x, y)| x == y)
                .count();
            assert!(common > 0, "{ta:?} vs {tb:?}");
        }
        // On this preset and seed no near-tie intervenes: the texts are equal (measured; a
        // change of the arithmetic may move a near-tie, and then this line, not the above).
        assert_eq!(ra, rb);
    }

    #[test]
    fn preemption_and_chunking_do_not_change_greedy_output() {
        let base = ServeConfig::tiny();
        let mut tight = ServeConfig::tiny();
        // 12 blocks of 16 tokens for 4 requests of ~60 tokens each: preemption is certain.
        tight.kv_cache_memory = Some(
            12 * crate::runtime::kv_cache::kv_bytes_per_block(
                &ModelConfig::tiny(),
                16,
                tight.kv_cache_dtype,
            ),
        );
        tight.max_model_len = Some(128);
        tight.max_num_batched_tokens = 7;
        let mut a = engine(&base);
        let mut b = engine(&tight);
        let prompts = [
            "one two three",
            "four five six seven",
            "eight",
            "nine ten eleven twelve thirteen",
        ];
        let mk = |l: &Loaded| {
            prompts
                .iter()
                .map(|p| req(prompt(l, p), 40))
                .collect::<Vec<_>>()
        };
        let (qa, qb) = (mk(&a), mk(&b));
        let ra = run(&mut a.engine, qa);
        let rb = run(&mut b.engine, qb);
        assert_eq!(ra, rb);
        let m = b.metrics.snapshot();
        assert!(m.preemptions > 0, "expected preemptions");
        assert_eq!(m.kv_usage, 0.0);
        assert_eq!(m.finished[FinishedLabel::Length as usize], 4);
        assert_eq!(b.engine.scheduler().pool().num_free(), 12);
    }

    #[test]
    fn prefix_cache_hits_give_identical_output() {
        let mut l = engine(&ServeConfig::tiny());
        let p = prompt(&l, &"a long shared system prompt. ".repeat(4));
        let first = run(&mut l.engine, vec![req(p.clone(), 16)]);
        let before = l.metrics.snapshot().prefix;
        let second = run(&mut l.engine, vec![req(p.clone(), 16)]);
        let after = l.metrics.snapshot().prefix;
        assert_eq!(first, second);
        assert_eq!(after.queries - before.queries, p.len() as u64);
        let full_blocks = ((p.len() - 1) / 16 * 16) as u64;
        assert_eq!(after.hits - before.hits, full_blocks);
        assert!(full_blocks > 0);
        l.engine.reset_prefix_cache();
        run(&mut l.engine, vec![req(p, 16)]);
        assert_eq!(
            l.metrics.snapshot().prefix.hits,
            after.hits,
            "no hits after reset"
        );
    }

    #[test]
    fn eos_stop_strings_and_reasoning_split() {
        let mut l = engine(&ServeConfig::tiny());
        let p = prompt(
            &l,
            "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n<think>\n",
        );
        let plain = run(&mut l.engine, vec![req(p.clone(), 30)]);
        let text = plain[0].0.clone();
        assert!(!text.is_empty());
        // A stop string taken from the middle of the greedy output cuts it there.
        let chars: Vec<char> = text.chars().collect();
        if chars.len() > 6 {
            let stop: String = chars[3..5].iter().collect();
            let mut r = req(p.clone(), 30);
            r.stop = vec![stop.clone()];
            let out = run(&mut l.engine, vec![r]);
            assert_eq!(out[0].2, FinishReason::Stop);
            let idx = text.find(&stop).unwrap();
            assert_eq!(out[0].0, text[..idx]);
        }
        // With the think block open, everything before </think> is reasoning.
        let (tx, mut rx) = tmpsc::unbounded_channel();
        let mut r = req(p.clone(), 30);
        r.reasoning = ReasoningMode::InThink;
        l.engine.add(99, r, tx);
        while l.engine.has_work() {
            l.engine.step().unwrap();
        }
        let (mut reasoning, mut content) = (String::new(), String::new());
        while let Ok(o) = rx.try_recv() {
            reasoning.push_str(&o.reasoning);
            content.push_str(&o.content);
        }
        assert_eq!(
            format!("{reasoning}{content}"),
            text.replacen("</think>", "", 1)
        );
        assert!(!reasoning.is_empty());
        // EOS ends a request unless ignore_eos.
        let mut r = req(p, 200);
        r.ignore_eos = false;
        let out = run(&mut l.engine, vec![r]);
        assert!(matches!(
            out[0].2,
            FinishReason::Stop | FinishReason::Length
        ));
    }

    #[test]
    fn load_errors_name_flags_and_files() {
        let mut c = ServeConfig::tiny();
        c.kv_cache_memory = Some(1024);
        let e = load(&c).err().unwrap().to_string();
        assert!(e.contains("--kv-cache-memory"), "{e}");
        let mut c = ServeConfig::tiny();
        c.max_model_len = Some(1 << 20);
        let e = load(&c).err().unwrap().to_string();
        assert!(e.contains("--max-model-len"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let mut c = ServeConfig::tiny();
        c.model = dir.path().display().to_string();
        let e = load(&c).err().unwrap().to_string();
        assert!(e.contains("config.json"), "{e}");
    }

    #[test]
    fn loads_a_checkpoint_directory_and_quantizes() {
        let w = crate::runtime::weights::synthesize(&ModelConfig::tiny(), 0);
        let dir = tempfile::tempdir().unwrap();
        crate::runtime::weights::tests::write_checkpoint(dir.path(), &w);
        let mut c = ServeConfig::tiny();
        c.model = dir.path().display().to_string();
        c.max_model_len = Some(512);
        let mut from_dir = engine(&c);
        let mut synth = engine(&ServeConfig::tiny());
        let p = prompt(&synth, "same weights, same output");
        assert_eq!(
            run(&mut from_dir.engine, vec![req(p.clone(), 12)]),
            run(&mut synth.engine, vec![req(p.clone(), 12)])
        );
        c.quantize = Some(WeightFormat::Fp8.into());
        let q = engine(&c);
        assert_eq!(q.info.weight_format, WeightFormat::Fp8);
        assert_eq!(q.tokenizer.source, "byte-level");
    }
}
