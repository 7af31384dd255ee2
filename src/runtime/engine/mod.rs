//! The engine: one thread that owns the backend and the scheduler and runs steps while there is
//! work; requests arrive and are aborted through a channel, and each request's outputs (text
//! deltas split into reasoning and content, token counts, finish reason) go back on its own
//! channel. Detokenization, stop strings, EOS, `max_tokens` and metrics live here too.
//!
//! [`load`] builds everything from a [`ServeConfig`]: weights (synthesized or read), tokenizer,
//! chat template, KV capacity; [`spawn`] starts the thread and returns an [`EngineHandle`].
//!
//! Files, by concern: this one the engine (its state, one scheduler step, the thread's loop);
//! `request` the public request and output types; `text` detokenization, stop strings and the
//! reasoning / content split; `handle` the handle to the engine thread and [`spawn`]; `load`
//! building an engine from a [`ServeConfig`]; `tests` the engine's tests.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc as tmpsc, oneshot};

use anyhow::Context;

use super::backend::cpu::CpuBackend;
use super::backend::cuda::{CudaBackend, CudaLoadSpec, WeightSource};
use super::backend::{Backend, Device, KvCacheSpec};
use super::backend::{ForwardBatch, RowSampling};
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

mod handle;
mod load;
mod request;
#[cfg(test)]
mod tests;
mod text;

pub use handle::{spawn, EngineHandle};
pub use load::{load, Loaded, DEFAULT_MAX_NUM_SEQS, HYBRID_NO_PREFIX_CACHING};
pub use request::*;
use text::*;

pub(super) struct ReqState {
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
    /// vLLM's `min_tokens`: no EOS and no stop string before this many tokens (0 = off).
    min_tokens: usize,
}

/// Commands to the engine thread.
pub(super) enum Command {
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
    /// The EOS ids, for the `min_tokens` mask of the host sampler.
    eos_ids: Arc<Vec<u32>>,
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
            eos_ids: Arc::new(tokenizer.eos_ids.clone()),
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

    /// The backend (read-only: what it recorded of the last step).
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
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
        let mut text = TextState::new(req.reasoning, &self.tokenizer, req.stop.clone());
        let min_tokens = req.params.min_tokens;
        // Stop strings are matched only once more than min_tokens tokens are out (vLLM's
        // detokenizer: `len(output_token_ids) > min_tokens`).
        text.stops_armed = min_tokens == 0;
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
                    Sampler::new(req.params, fallback).with_min_tokens_eos(self.eos_ids.clone())
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
                min_tokens,
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
        // Log-probabilities need the logit rows on the host.
        // So does the min_tokens mask (the device sampler takes no mask).
        let wants_rows = |p: &Scheduled| {
            self.reqs.get(&p.id).is_some_and(|r| {
                r.logprobs.is_some() || r.prompt_logprobs.is_some() || r.num_output < r.min_tokens
            })
        };
        let forwarded = if self.backend.samples_on_device()
            && plan.iter().all(|p| p.drafts.is_empty() && !wants_rows(p))
        {
            self.step_sampled_on_device(&plan, &batch)
        } else {
            self.step_sampled_on_host(&plan, &batch)
        };
        if !forwarded {
            return Ok(true);
        }
        self.propose_drafts();
        self.publish_gauges();
        Ok(true)
    }

    /// A step whose tokens are sampled on the device: only token ids cross to the host. False
    /// when the forward pass failed (every request of the plan then failed).
    fn step_sampled_on_device(&mut self, plan: &[Scheduled], batch: &ForwardBatch) -> bool {
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
        let tokens = match self.backend.forward_sampled(batch, &rows) {
            Ok(t) => t,
            Err(e) => {
                let msg = format!("forward pass failed: {e:#}");
                for p in plan {
                    self.fail(p.id, &msg);
                }
                self.publish_gauges();
                return false;
            }
        };
        let now = Instant::now();
        let mut row = 0;
        for p in plan {
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
        true
    }

    /// A step whose logit rows come to the host: prompt log-probabilities, the min_tokens EOS
    /// mask, speculative verification and sampling. False when the forward pass failed (every
    /// request of the plan then failed).
    fn step_sampled_on_host(&mut self, plan: &[Scheduled], batch: &ForwardBatch) -> bool {
        let logits = match self.backend.forward(batch) {
            Ok(l) => l,
            Err(e) => {
                let msg = format!("forward pass failed: {e:#}");
                for p in plan {
                    self.fail(p.id, &msg);
                }
                self.publish_gauges();
                return false;
            }
        };
        let now = Instant::now();
        let mut row = 0;
        for p in plan {
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
            // min_tokens: EOS masked while fewer are out (drafts never cross that count).
            r.sampler.mask_eos(r.num_output);
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
        true
    }

    /// Drafts for the next step: each decoding sequence's proposal, within what max_tokens,
    /// max_model_len and min_tokens leave room for.
    fn propose_drafts(&mut self) {
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
                let mut limit = left_out.min(left_ctx).saturating_sub(1);
                // Under min_tokens every token of a step is drawn with the same EOS mask: the
                // step stays below the count or starts at it.
                if r.num_output < r.min_tokens {
                    limit = limit.min(r.min_tokens - r.num_output - 1);
                }
                s.drafts = d.propose(&s.tokens, limit);
            }
        }
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
            r.text.stops_armed = r.num_output > r.min_tokens;
            if !r.ignore_eos && r.num_output >= r.min_tokens && self.eos.contains(&t) {
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
