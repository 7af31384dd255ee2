//! Trace replay: synthesise a trace's prompts, send its sessions concurrently on the trace's
//! clock, and say what reuse the trace implied against what the engine reported
//! (docs/traces.md).
//!
//! - Prompts for `hash_ids`: each hash id's text is `[<run nonce>:<hash id>]` followed by filler
//!   words, fitted with the served model's tokenizer to the block's token count
//!   ([`super::workload`]'s fitting), and the same for every request of the run that names it; a
//!   partial last block is the first tokens of the same text. A request's prompt is its blocks in
//!   order, so equal leading hash ids give equal leading token blocks. The nonce keeps blocks of
//!   different sweep points (and of earlier runs) apart. Each whole prompt is counted again:
//!   where block boundaries merge under the tokenizer, `token_exact` says so.
//! - Sessions run concurrently, each turn after the previous turn's answer plus its think time
//!   (and not before its own timestamp, when the trace gives one). Each request's scheduled and
//!   actual send times are recorded; their difference is the send lag.
//! - Conversations keep their history: every earlier message and the answers the engine gave,
//!   sent as chat messages (as one transcript for the completions API).

/// One replayed request's block labels (`hash_ids`) and its prompt length in tokens.
pub type HashedPrompt = (Vec<u64>, u32);

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::client::{Api, EngineClient, GenRequest};
use super::executor::{ExecConfig, ExecOutcome, ExecStop, RawRecord, StopCause, StopSignal};
use super::metrics::RequestRecord;
use super::trace::{implied_block_reuse, Trace, TraceSession, TraceWindow, TurnInput};
use super::workload::{fit, PreparedRequest, TokenCounter};

/// What a replay needs besides the engine: the trace and its window (`--trace` and friends).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSpec {
    /// The parsed trace.
    pub trace: Trace,
    /// Speed and window.
    pub window: TraceWindow,
}

/// One turn ready to send.
#[derive(Debug, Clone)]
struct PlannedTurn {
    /// The request (for blocks: the synthesised prompt).
    req: GenRequest,
    /// New messages of the turn (conversations).
    messages: Vec<(String, String)>,
    hash_ids: Vec<u64>,
    input_length: Option<u32>,
    counted: Option<u64>,
    think_s: f64,
    at_s: Option<f64>,
}

/// A trace ready to replay.
#[derive(Debug, Clone)]
pub struct ReplayPlan {
    sessions: Vec<(f64, Vec<PlannedTurn>)>,
    /// Prompts whose whole count differs from the sum of their blocks' counts.
    pub not_token_exact: usize,
    /// Requests planned.
    pub requests: usize,
}

/// The request fields every turn shares.
#[derive(Debug, Clone)]
pub struct RequestTemplate {
    /// API.
    pub api: Api,
    /// `model`.
    pub model: String,
    /// Temperature.
    pub temperature: f64,
    /// Seed (offset by the request index).
    pub seed: Option<u64>,
    /// `enable_thinking` (chat).
    pub thinking: Option<bool>,
}

/// Synthesise the prompts of `sessions`.
///
/// # Errors
/// The tokenizer failed.
pub async fn plan(
    sessions: &[TraceSession],
    block_tokens: u32,
    counter: &TokenCounter,
    tpl: &RequestTemplate,
    nonce: &str,
) -> anyhow::Result<ReplayPlan> {
    let mut blocks: HashMap<(u64, u32), (String, Option<usize>)> = HashMap::new();
    let mut hint = None;
    let mut out = Vec::new();
    let mut not_exact = 0;
    let mut index = 0u64;
    for s in sessions {
        let mut turns = Vec::new();
        for t in &s.turns {
            let mut req = GenRequest {
                api: tpl.api,
                model: tpl.model.clone(),
                prompt: String::new(),
                max_tokens: t.output_tokens,
                ignore_eos: true,
                temperature: tpl.temperature,
                seed: tpl.seed.map(|x| x.wrapping_add(index)),
                thinking: if tpl.api == Api::Chat {
                    tpl.thinking
                } else {
                    None
                },
            };
            index += 1;
            let (mut hash_ids, mut input_length, mut counted, mut messages) =
                (Vec::new(), None, None, Vec::new());
            match &t.input {
                TurnInput::Blocks {
                    hash_ids: ids,
                    input_length: n,
                } => {
                    let mut left = *n;
                    let mut sum = Some(0usize);
                    for h in ids {
                        let len = left.min(block_tokens);
                        left -= len;
                        if let std::collections::hash_map::Entry::Vacant(slot) =
                            blocks.entry((*h, len))
                        {
                            let words = crate::e2e::prompts::filler_words(
                                (*h as usize).wrapping_mul(37) % 9973,
                                len as usize + 16,
                            );
                            let b = fit(
                                counter,
                                &format!(" [{nonce}:{h}] "),
                                &words,
                                len as usize,
                                &mut hint,
                            )
                            .await?;
                            slot.insert(b);
                        }
                        let (text, c) = &blocks[&(*h, len)];
                        req.prompt.push_str(text);
                        sum = match (sum, c) {
                            (Some(a), Some(b)) => Some(a + b),
                            _ => None,
                        };
                    }
                    let whole = counter.count(&req.prompt).await?;
                    if let (Some(w), Some(s)) = (whole, sum) {
                        if w != s {
                            not_exact += 1;
                        }
                    }
                    hash_ids = ids.clone();
                    input_length = Some(*n);
                    counted = whole.map(|c| c as u64);
                }
                TurnInput::Messages(m) => {
                    messages = m.clone();
                    req.prompt = m.last().map(|(_, t)| t.clone()).unwrap_or_default();
                }
            }
            turns.push(PlannedTurn {
                req,
                messages,
                hash_ids,
                input_length,
                counted,
                think_s: t.think_s,
                at_s: t.at_s,
            });
        }
        out.push((s.start_s, turns));
    }
    Ok(ReplayPlan {
        requests: index as usize,
        sessions: out,
        not_token_exact: not_exact,
    })
}

/// The body of a turn with its session's history.
fn body_of(t: &PlannedTurn, history: &[(String, String)]) -> Value {
    let mut b = t.req.body();
    if t.messages.is_empty() {
        return b;
    }
    let all: Vec<&(String, String)> = history.iter().chain(t.messages.iter()).collect();
    match t.req.api {
        Api::Chat => {
            b["messages"] = json!(all
                .iter()
                .map(|(r, c)| json!({"role": r, "content": c}))
                .collect::<Vec<_>>());
        }
        Api::Completions => {
            let mut p: String = all.iter().map(|(r, c)| format!("{r}: {c}\n")).collect();
            p.push_str("assistant:");
            b["prompt"] = json!(p);
        }
    }
    b
}

/// What a replay returns: the executor's outcome (records indexed into `prepared`) and the
/// requests as sent.
pub struct ReplayOutcome {
    /// Records, the stop and the duration, as for a sweep point.
    pub exec: ExecOutcome,
    /// One per planned request (index = record index).
    pub prepared: Vec<PreparedRequest>,
    /// Per planned request: its hash ids and prompt length (empty for conversations).
    pub blocks: Vec<(Vec<u64>, u32)>,
}

/// Replay `plan` against `client`: sessions concurrently, turns in order.
pub async fn replay(
    client: &EngineClient,
    plan: &ReplayPlan,
    cfg: &ExecConfig,
    stop: &StopSignal,
    progress: ProgressBar,
) -> ReplayOutcome {
    let t0 = Instant::now();
    let records = Arc::new(Mutex::new(Vec::new()));
    let deadline_hit = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    let mut base = 0usize;
    let mut prepared = Vec::with_capacity(plan.requests);
    let mut blocks = Vec::with_capacity(plan.requests);
    for (start, turns) in &plan.sessions {
        for t in turns {
            prepared.push(PreparedRequest {
                req: t.req.clone(),
                input_tokens_requested: t.input_length.map(u64::from),
                input_tokens_counted: t.counted,
            });
            blocks.push((t.hash_ids.clone(), t.input_length.unwrap_or(0)));
        }
        let (client, turns, start) = (client.clone(), turns.clone(), *start);
        let (records, stop, cfg, pb, hit) = (
            records.clone(),
            stop.clone(),
            cfg.clone(),
            progress.clone(),
            deadline_hit.clone(),
        );
        let first = base;
        base += turns.len();
        tasks.spawn(async move {
            let mut history: Vec<(String, String)> = Vec::new();
            let mut ready = start;
            for (k, t) in turns.iter().enumerate() {
                let at = match t.at_s {
                    Some(a) if k > 0 => ready.max(a),
                    _ => ready,
                };
                if cfg.duration.is_some_and(|d| at >= d.as_secs_f64()) {
                    hit.store(true, std::sync::atomic::Ordering::SeqCst);
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep_until((t0 + Duration::from_secs_f64(at)).into()) => {}
                    _ = stop.stopped() => break,
                }
                if stop.is_stopped() {
                    break;
                }
                let (sent, outcome) = client
                    .stream_body(
                        &t.req,
                        body_of(t, &history),
                        cfg.request_timeout,
                        stop.interrupted(),
                    )
                    .await;
                let sent_rel = sent.saturating_duration_since(t0);
                let end = (sent_rel + outcome.end).as_secs_f64();
                let failed = outcome.error.is_some() || !outcome.done;
                history.extend(t.messages.iter().cloned());
                history.push((
                    "assistant".into(),
                    format!("{}{}", outcome.reasoning, outcome.content),
                ));
                pb.inc(1);
                if let Ok(mut r) = records.lock() {
                    r.push(RawRecord {
                        index: first + k,
                        scheduled: Some(Duration::from_secs_f64(at)),
                        sent: sent_rel,
                        outcome,
                    });
                }
                if failed {
                    // An agent or a user does not go on after a failed answer.
                    break;
                }
                ready = end + turns.get(k + 1).map_or(0.0, |n| n.think_s);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let records = records
        .lock()
        .map(|mut r| std::mem::take(&mut *r))
        .unwrap_or_default();
    let end = records
        .iter()
        .map(|r| r.sent + r.outcome.end)
        .max()
        .unwrap_or_default();
    let stop_kind = match stop.cause() {
        Some(StopCause::Interrupted) => ExecStop::Interrupted,
        Some(StopCause::EngineFailed(m)) => ExecStop::EngineFailed(m),
        None if deadline_hit.load(std::sync::atomic::Ordering::SeqCst) => ExecStop::DurationLimit,
        None => ExecStop::Completed,
    };
    ReplayOutcome {
        exec: ExecOutcome {
            records,
            duration: end,
            stop: stop_kind,
            healthy_after_failures: 0,
        },
        prepared,
        blocks,
    }
}

/// What a replayed sweep point records (`trace` in results.json).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceSummary {
    /// The trace file (or built-in name).
    pub file: String,
    /// Its format.
    pub format: super::trace::TraceFormat,
    /// Tokens per hash id.
    pub block_tokens: u32,
    /// Speed and window.
    pub window: TraceWindow,
    /// Requests sent.
    pub requests: usize,
    /// Requests in the window, sent or not.
    pub requests_planned: usize,
    /// Sessions in the window.
    pub sessions: usize,
    /// Prompt tokens the trace implies are reused (hash-id formats: full blocks of a leading
    /// chain sent before; conversations: each later turn's previous prompt, as the engine
    /// counted it), over the requests sent.
    pub implied_prefix_reuse: u64,
    /// Σ `usage.prompt_tokens_details.cached_tokens` the engine reported, when it reported it
    /// for every completed request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_cached_tokens: Option<u64>,
    /// Prefix-cache hit tokens by the engine's `/metrics` counters over the run, when it has
    /// them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_cache_hits: Option<u64>,
    /// engine_cached_tokens (else metrics_cache_hits) − implied_prefix_reuse, tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reuse_gap: Option<i64>,
    /// Σ prompt tokens the engine reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    /// 99th percentile of (actual − scheduled send time), seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_lag_p99_s: Option<f64>,
    /// Largest send lag, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_lag_max_s: Option<f64>,
    /// Prompts whose whole token count differs from the sum of their blocks (block boundaries
    /// that merge under the tokenizer): 0 means the block reuse is token-exact.
    pub not_token_exact: usize,
}

impl TraceSummary {
    /// From the replay's request records (index = planned request) and blocks.
    pub fn of(
        spec: &TraceSpec,
        plan: &ReplayPlan,
        blocks: &[(Vec<u64>, u32)],
        records: &[RequestRecord],
        metrics_cache_hits: Option<u64>,
    ) -> Self {
        let mut sent: Vec<&RequestRecord> = records.iter().collect();
        sent.sort_by(|a, b| a.sent_s.total_cmp(&b.sent_s));
        let implied: u64 = if spec.trace.format == super::trace::TraceFormat::Conversations {
            // Each later turn of a session reuses its previous turn's prompt.
            let mut firsts = std::collections::HashSet::new();
            let mut start = 0;
            for (_, turns) in &plan.sessions {
                firsts.insert(start);
                start += turns.len();
            }
            records
                .iter()
                .filter(|r| !firsts.contains(&r.index))
                .filter_map(|r| {
                    records
                        .iter()
                        .find(|p| p.index + 1 == r.index)
                        .and_then(|p| p.prompt_tokens)
                })
                .sum()
        } else {
            let order: Vec<(&[u64], u32)> = sent
                .iter()
                .filter_map(|r| blocks.get(r.index).map(|(h, n)| (h.as_slice(), *n)))
                .collect();
            implied_block_reuse(&order, spec.trace.block_tokens)
                .iter()
                .sum()
        };
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok).collect();
        let engine_cached = if ok.is_empty() {
            None
        } else {
            ok.iter().map(|r| r.cached_tokens).sum::<Option<u64>>()
        };
        let lags: Vec<f64> = records.iter().filter_map(|r| r.lateness_s).collect();
        let reported = engine_cached.or(metrics_cache_hits);
        Self {
            file: spec.trace.origin.display().to_string(),
            format: spec.trace.format,
            block_tokens: spec.trace.block_tokens,
            window: spec.window,
            requests: records.len(),
            requests_planned: plan.requests,
            sessions: plan.sessions.len(),
            implied_prefix_reuse: implied,
            engine_cached_tokens: engine_cached,
            metrics_cache_hits,
            reuse_gap: reported.map(|r| r as i64 - implied as i64),
            prompt_tokens: ok.iter().map(|r| r.prompt_tokens).sum::<Option<u64>>(),
            send_lag_p99_s: crate::stats::percentile(&lags, 99.0),
            send_lag_max_s: lags
                .iter()
                .copied()
                .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.max(v)))),
            not_token_exact: plan.not_token_exact,
        }
    }
}
