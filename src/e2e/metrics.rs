//! Serving metrics per request and per run.
//!
//! Definitions (the field's standard names; vLLM's `benchmark_serving` and NVIDIA GenAI-Perf use
//! the same ones):
//! - TTFT: request sent → the first chunk that carries a generated token, reasoning included. A
//!   chunk carries a token when its cumulative `usage.completion_tokens` grew (vLLM's
//!   `continuous_usage_stats`), when it lists token ids, or when it has non-empty content or
//!   reasoning text; a role chunk or an empty finish chunk carries none. vLLM holds back the
//!   text of a token that ends inside a UTF-8 sequence, so its first token may arrive in a chunk
//!   with an empty `content`: it counts. `vllm bench serve` stamps the first chunk with a
//!   `choices` entry (a role chunk included); that moment is kept as [`RequestRecord::first_chunk_s`]
//!   and reported beside TTFT when it differs;
//! - TTFC: request sent → first chunk with content (non-reasoning) text;
//! - E2E: request sent → end of the stream;
//! - TPOT = (E2E − TTFT) / (output tokens − 1), for requests with at least two output tokens
//!   that arrived in at least two chunks: when every token arrived in one chunk the decode time
//!   cannot be observed, and TPOT and ITL are "not observable" (not a tiny number);
//! - ITL: gaps between successive tokens. A chunk that carries n tokens (speculative decoding)
//!   contributes n gaps, each 1/n of the time since the previous chunk, so tokens are counted as
//!   tokens, not chunks;
//! - bursty delivery ([`Delivery`]): a request whose chunks carry several tokens each, or whose
//!   token chunks arrive in bursts (gaps under [`BURST_GAP_S`] and under a tenth of its mean
//!   gap, for at least [`BURSTY_SHARE`] of its gaps). llama.cpp's `llama-server` writes several
//!   tokens at once under load; then ITL measures how the server delivers, not how fast it
//!   decodes, and the report says so;
//! - closed loop: the requests of the opening wave (the first `concurrency` requests, released
//!   together once the warm-up has finished) queue behind each other and are left out of the
//!   latency statistics ([`RequestRecord::opening_wave`]); throughput covers the whole run;
//! - output tok/s = Σ output tokens of completed requests / run duration; request/s = completed
//!   requests / run duration; the run lasts from the first send (closed loop) or the schedule's
//!   start (open loop) to the last completion.
//!
//! Token counts come from the engine's `usage` when present, else from a tokenizer (the
//! engine's `/tokenize` or a local `tokenizer.json`), else from the number of text chunks; the
//! source is recorded ([`TokenSource`]). How a chunk's tokens are known is recorded as
//! [`ChunkSplit`].

use serde::{Deserialize, Serialize};

use super::stream::{StreamOutcome, TokenEvent};

/// Where a token count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// The engine's `usage` object.
    Usage,
    /// The engine's `POST /tokenize` on the received text.
    EngineTokenizer,
    /// A local `tokenizer.json` on the received text.
    LocalTokenizer,
    /// The number of text chunks (an approximation; marks the count as unverified).
    Chunks,
}

impl TokenSource {
    /// Short label for tables.
    pub fn label(self) -> &'static str {
        match self {
            TokenSource::Usage => "usage",
            TokenSource::EngineTokenizer => "engine /tokenize",
            TokenSource::LocalTokenizer => "local tokenizer",
            TokenSource::Chunks => "chunk count (approximate)",
        }
    }
}

/// How tokens were assigned to chunks (for ITL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChunkSplit {
    /// Every token chunk said how many tokens it carried (the increment of a cumulative `usage`
    /// with continuous usage stats, or its token ids): exact.
    UsagePerChunk,
    /// Output tokens equal the number of text chunks: one token per chunk.
    OnePerChunk,
    /// Output tokens spread over chunks in proportion to their text length.
    Estimated,
}

/// One request as measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Index within the run.
    pub index: usize,
    /// Scheduled send time since the run started, seconds (open loop only).
    pub scheduled_s: Option<f64>,
    /// Actual send time since the run started, seconds.
    pub sent_s: f64,
    /// Send time − scheduled time, seconds (open loop only): arrivals that could not be sent
    /// on time are data.
    pub lateness_s: Option<f64>,
    /// Completed with `[DONE]` and no error.
    pub ok: bool,
    /// Cancelled by the client (Ctrl-C or stop).
    pub cancelled: bool,
    /// Why it failed.
    pub error: Option<String>,
    /// HTTP status.
    pub http_status: Option<u16>,
    /// TTFT, seconds.
    pub ttft_s: Option<f64>,
    /// TTFC, seconds.
    pub ttfc_s: Option<f64>,
    /// E2E latency, seconds.
    pub e2e_s: Option<f64>,
    /// TPOT, seconds.
    pub tpot_s: Option<f64>,
    /// Mean ITL of this request, seconds.
    pub itl_mean_s: Option<f64>,
    /// Largest ITL of this request, seconds.
    pub itl_max_s: Option<f64>,
    /// Per-token ITLs (kept in memory for the run's percentiles; not written).
    #[serde(skip)]
    pub itl_s: Vec<f64>,
    /// Input length the workload asked for, tokens.
    pub input_tokens_requested: Option<u64>,
    /// Input length counted by the tokenizer when the prompt was built.
    pub input_tokens_counted: Option<u64>,
    /// Prompt tokens the engine reported (template included for chat).
    pub prompt_tokens: Option<u64>,
    /// Of those, served from the prefix cache (`usage.prompt_tokens_details.cached_tokens`),
    /// when the engine reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    /// `max_tokens` sent.
    pub output_tokens_requested: u32,
    /// Output tokens (reasoning included).
    pub output_tokens: Option<u64>,
    /// Where `output_tokens` came from.
    pub token_source: Option<TokenSource>,
    /// Reasoning tokens (usage details, else estimated from the reasoning share of the text).
    pub reasoning_tokens: Option<u64>,
    /// How tokens were assigned to chunks.
    pub chunk_split: Option<ChunkSplit>,
    /// Chunks received.
    pub chunks: usize,
    /// Content characters received.
    pub content_chars: usize,
    /// Reasoning characters received.
    pub reasoning_chars: usize,
    /// `finish_reason`.
    pub finish_reason: Option<String>,
    /// Output problems found by the validity guard (`empty`, `degenerate`, `truncated`, ...)
    /// and observations (`token count`, `decode not observable`).
    pub flags: Vec<String>,
    /// The engine's per-request speculative-decoding counts (newer vLLM's last chunk,
    /// llama.cpp's `timings`), when it sent them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<crate::diagnose::spec::RequestSpec>,
    /// Closed loop: one of the first `concurrency` requests, released together after the
    /// warm-up; left out of the latency statistics (its queueing is the burst's, not the
    /// steady state's).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub opening_wave: bool,
    /// Output tokens counted again by the tokenizer on the whole received text (no special
    /// tokens added), when `output_tokens` came from `usage` and a tokenizer was available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens_retokenized: Option<u64>,
    /// Send → first chunk with a `choices` entry, token or not (`vllm bench serve`'s TTFT),
    /// seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_chunk_s: Option<f64>,
    /// Chunks that carried a generated token.
    #[serde(default)]
    pub token_chunks: usize,
    /// How the tokens were delivered (bursts, several tokens per chunk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Delivery>,
    /// Sent again once on a fresh connection after a kept-alive connection failed before any
    /// response (0 or 1).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retries: u32,
    /// Send → the last chunk that carried a generated token, seconds (guidellm's "last token";
    /// see [`super::definitions`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_token_s: Option<f64>,
    /// Gaps between successive token chunks, one per chunk, seconds (vLLM's ITL; kept in memory,
    /// not written).
    #[serde(skip)]
    pub chunk_gaps_s: Vec<f64>,
}

fn is_zero(x: &u32) -> bool {
    *x == 0
}

/// A gap between token chunks shorter than this (and shorter than a tenth of the request's mean
/// gap) is part of a burst: the chunks were written together, not decoded apart. 1 ms.
pub const BURST_GAP_S: f64 = 1e-3;

/// Share of a request's token gaps that must be burst gaps (at least 3) for the request to count
/// as bursty.
pub const BURSTY_SHARE: f64 = 0.10;

/// How a request's tokens were delivered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    /// Gaps between successive token chunks.
    pub gaps: usize,
    /// Gaps that were part of a burst (see [`BURST_GAP_S`]).
    pub burst_gaps: usize,
    /// Chunks that carried more than one token (counted exactly, or implied when the output
    /// has more tokens than token chunks).
    pub multi_token_chunks: usize,
    /// Tokens beyond one per chunk.
    pub extra_tokens: u64,
    /// Bursty: ITL measures delivery, not decode.
    pub bursty: bool,
}

impl Delivery {
    /// Judge the token chunks `events` with `tokens[i]` tokens each (from [`split_tokens`]);
    /// `exact`: the per-chunk counts are known rather than apportioned.
    pub fn of(events: &[TokenEvent], tokens: &[u64], total: Option<u64>, exact: bool) -> Self {
        let n = events.len();
        let mut d = Delivery {
            gaps: n.saturating_sub(1),
            ..Default::default()
        };
        if exact {
            d.multi_token_chunks = tokens.iter().filter(|t| **t > 1).count();
            d.extra_tokens = tokens.iter().map(|t| t.saturating_sub(1)).sum();
        } else if let Some(t) = total {
            d.extra_tokens = t.saturating_sub(n as u64);
            d.multi_token_chunks = (d.extra_tokens as usize).min(n);
        }
        if n >= 2 {
            let span = (events[n - 1].at - events[0].at).as_secs_f64();
            let mean = span / (n - 1) as f64;
            let limit = BURST_GAP_S.min(0.1 * mean);
            d.burst_gaps = events
                .windows(2)
                .filter(|w| w[1].at == w[0].at || (w[1].at - w[0].at).as_secs_f64() < limit)
                .count();
        }
        d.bursty = d.multi_token_chunks > 0
            || (d.burst_gaps >= 3 && d.burst_gaps as f64 >= BURSTY_SHARE * d.gaps as f64);
        d
    }

    /// One line for a request's flags.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.multi_token_chunks > 0 {
            parts.push(format!(
                "{} chunk(s) carried several tokens ({} tokens beyond one per chunk)",
                self.multi_token_chunks, self.extra_tokens
            ));
        }
        if self.burst_gaps > 0 {
            parts.push(format!(
                "{} of {} gaps between token chunks were bursts (< 1 ms)",
                self.burst_gaps, self.gaps
            ));
        }
        format!(
            "{BURSTY_FLAG}: {}; ITL measures how the server delivered tokens, not decode steps",
            parts.join(", ")
        )
    }
}

/// The flag of a request sent a second time on a fresh connection.
pub const RETRIED_FLAG: &str = "retried";

/// The flag of a request that produced tokens but no visible text.
pub const NO_TEXT_FLAG: &str = "no text";

/// The flag of a request whose tokens arrived in bursts.
pub const BURSTY_FLAG: &str = "bursty delivery";

/// The flag of a request whose tokens all arrived in one chunk.
pub const SINGLE_CHUNK_FLAG: &str = "decode not observable";

/// Tokens per token chunk, and how they were found. `total` is the request's output token count
/// when known.
pub fn split_tokens(events: &[TokenEvent], total: Option<u64>) -> (Vec<u64>, ChunkSplit) {
    let n = events.len();
    if n == 0 {
        return (Vec::new(), ChunkSplit::OnePerChunk);
    }
    // Known per chunk (usage increments or token ids), and consistent with the total.
    if let Some(out) = events
        .iter()
        .map(|e| e.tokens)
        .collect::<Option<Vec<u64>>>()
    {
        let sum: u64 = out.iter().sum();
        if out.iter().all(|t| *t > 0) && total.is_none_or(|t| t == sum) {
            return (out, ChunkSplit::UsagePerChunk);
        }
    }
    let Some(total) = total else {
        return (vec![1; n], ChunkSplit::Estimated);
    };
    if total == n as u64 {
        return (vec![1; n], ChunkSplit::OnePerChunk);
    }
    // Largest-remainder apportionment by text length, at least one token per chunk when there
    // are enough tokens.
    let weights: Vec<f64> = events
        .iter()
        .map(|e| (e.content_chars + e.reasoning_chars).max(1) as f64)
        .collect();
    let floor_each = u64::from(total >= n as u64);
    let rest = total - floor_each * n as u64;
    let wsum: f64 = weights.iter().sum();
    let shares: Vec<f64> = weights.iter().map(|w| w / wsum * rest as f64).collect();
    let mut out: Vec<u64> = shares
        .iter()
        .map(|s| floor_each + s.floor() as u64)
        .collect();
    let mut left = total - out.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| {
        let fa = shares[a] - shares[a].floor();
        let fb = shares[b] - shares[b].floor();
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    for i in order {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
    (out, ChunkSplit::Estimated)
}

/// Latencies of one finished stream: `(ttft, ttfc, tpot, itls)` in seconds, from its token
/// chunks and the per-chunk token counts (definitions in the module docs).
pub fn latencies(
    o: &StreamOutcome,
    tokens: &[u64],
    output_tokens: Option<u64>,
) -> (Option<f64>, Option<f64>, Option<f64>, Vec<f64>) {
    let ttft = o.events.first().map(|e| e.at.as_secs_f64());
    let ttfc = o.first_content.map(|t| t.as_secs_f64());
    let e2e = o.end.as_secs_f64();
    // One chunk: the time between the first token and the end of the stream is not decode time.
    let tpot = match (ttft, output_tokens) {
        (Some(t), Some(n)) if n >= 2 && o.events.len() >= 2 => Some((e2e - t) / (n - 1) as f64),
        _ => None,
    };
    let mut itl = Vec::new();
    for i in 1..o.events.len() {
        let gap = (o.events[i].at - o.events[i - 1].at).as_secs_f64();
        let n = tokens.get(i).copied().unwrap_or(1).max(1);
        for _ in 0..n {
            itl.push(gap / n as f64);
        }
    }
    (ttft, ttfc, tpot, itl)
}

/// Percentiles of one metric, in seconds (linear interpolation, NumPy's default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Samples.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    /// Summarize; `None` without samples.
    pub fn of(samples: &[f64]) -> Option<Self> {
        let s = crate::stats::Summary::of(samples)?;
        Some(Self {
            n: s.n,
            mean: s.mean,
            p50: s.median,
            p90: s.p90,
            p95: s.p95,
            p99: s.p99,
            min: s.min,
            max: s.max,
        })
    }
}

/// Latency percentiles of a run's completed requests.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// TTFT.
    pub ttft: Option<Percentiles>,
    /// TTFC.
    pub ttfc: Option<Percentiles>,
    /// Send → first chunk with a `choices` entry (`vllm bench serve`'s TTFT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_chunk: Option<Percentiles>,
    /// ITL (per token, pooled over requests).
    pub itl: Option<Percentiles>,
    /// TPOT.
    pub tpot: Option<Percentiles>,
    /// E2E latency.
    pub e2e: Option<Percentiles>,
    /// Completed requests with two or more tokens that all arrived in one chunk (TPOT and ITL
    /// not observable for them).
    #[serde(default)]
    pub decode_not_observable: usize,
    /// Closed-loop opening-wave requests left out of these statistics.
    #[serde(default)]
    pub opening_wave_excluded: usize,
    /// Completed requests whose tokens arrived in bursts or several per chunk (ITL measures
    /// delivery for them; see [`Delivery`]).
    #[serde(default)]
    pub bursty: usize,
}

impl LatencySummary {
    /// Summarize the completed requests among `records`, leaving out the opening wave (unless
    /// no other request completed, e.g. an interrupted run: then what was measured is shown).
    pub fn of(records: &[RequestRecord]) -> Self {
        let steady = records.iter().any(|r| r.ok && !r.opening_wave);
        let ok: Vec<&RequestRecord> = records
            .iter()
            .filter(|r| r.ok && (!r.opening_wave || !steady))
            .collect();
        let pick = |f: &dyn Fn(&RequestRecord) -> Option<f64>| {
            Percentiles::of(&ok.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
        };
        let itl: Vec<f64> = ok.iter().flat_map(|r| r.itl_s.iter().copied()).collect();
        Self {
            ttft: pick(&|r| r.ttft_s),
            ttfc: pick(&|r| r.ttfc_s),
            first_chunk: pick(&|r| r.first_chunk_s),
            itl: Percentiles::of(&itl),
            tpot: pick(&|r| r.tpot_s),
            e2e: pick(&|r| r.e2e_s),
            decode_not_observable: ok
                .iter()
                .filter(|r| r.flags.iter().any(|f| f.starts_with(SINGLE_CHUNK_FLAG)))
                .count(),
            opening_wave_excluded: if steady {
                records.iter().filter(|r| r.ok && r.opening_wave).count()
            } else {
                0
            },
            bursty: ok
                .iter()
                .filter(|r| r.delivery.as_ref().is_some_and(|d| d.bursty))
                .count(),
        }
    }
}

/// Throughput of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// Run duration, seconds.
    pub duration_s: f64,
    /// Requests completed.
    pub completed: usize,
    /// Requests failed (errors, not cancellations).
    pub failed: usize,
    /// Requests cancelled by the client.
    pub cancelled: usize,
    /// Σ output tokens of completed requests.
    pub output_tokens: u64,
    /// Σ prompt tokens of completed requests (as the engine reported them), when known for all.
    pub input_tokens: Option<u64>,
    /// Output tokens per second.
    pub output_tok_per_s: f64,
    /// Completed requests per second.
    pub requests_per_s: f64,
}

impl Throughput {
    /// From the records and the run's duration; `None` when nothing completed or the duration
    /// is zero.
    pub fn of(records: &[RequestRecord], duration_s: f64) -> Option<Self> {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok).collect();
        if ok.is_empty() || duration_s <= 0.0 {
            return None;
        }
        let output_tokens: u64 = ok.iter().filter_map(|r| r.output_tokens).sum();
        let input_tokens = ok.iter().map(|r| r.prompt_tokens).sum::<Option<u64>>();
        Some(Self {
            duration_s,
            completed: ok.len(),
            failed: records.iter().filter(|r| !r.ok && !r.cancelled).count(),
            cancelled: records.iter().filter(|r| r.cancelled).count(),
            output_tokens,
            input_tokens,
            output_tok_per_s: output_tokens as f64 / duration_s,
            requests_per_s: ok.len() as f64 / duration_s,
        })
    }
}

/// Open-loop punctuality: how many arrivals were sent late.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lateness {
    /// An arrival counts as late beyond this, seconds.
    pub tolerance_s: f64,
    /// Arrivals sent.
    pub arrivals: usize,
    /// Arrivals sent later than the tolerance.
    pub late: usize,
    /// Largest lateness, seconds.
    pub max_s: f64,
    /// 99th percentile of lateness, seconds.
    pub p99_s: f64,
}

impl Lateness {
    /// From the records' `lateness_s`; `None` for closed-loop runs.
    pub fn of(records: &[RequestRecord], tolerance_s: f64) -> Option<Self> {
        let l: Vec<f64> = records.iter().filter_map(|r| r.lateness_s).collect();
        let p = Percentiles::of(&l)?;
        Some(Self {
            tolerance_s,
            arrivals: l.len(),
            late: l.iter().filter(|x| **x > tolerance_s).count(),
            max_s: p.max,
            p99_s: p.p99,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A token chunk at `ms` with `chars` characters carrying `tokens` tokens (when known).
    fn ev(ms: u64, chars: usize, tokens: Option<u64>) -> TokenEvent {
        TokenEvent {
            at: Duration::from_millis(ms),
            content_chars: chars,
            reasoning_chars: 0,
            tokens,
        }
    }

    #[test]
    fn multi_token_chunks_count_as_tokens() {
        // Continuous usage: 1, then 3 tokens in one chunk (speculative decoding), then 1.
        let e = vec![
            ev(100, 2, Some(1)),
            ev(130, 9, Some(3)),
            ev(150, 3, Some(1)),
        ];
        let (t, how) = split_tokens(&e, Some(5));
        assert_eq!((t.clone(), how), (vec![1, 3, 1], ChunkSplit::UsagePerChunk));
        let o = StreamOutcome {
            events: e,
            first_content: Some(Duration::from_millis(100)),
            end: Duration::from_millis(160),
            ..Default::default()
        };
        let (ttft, ttfc, tpot, itl) = latencies(&o, &t, Some(5));
        assert_eq!(ttft, Some(0.1));
        assert_eq!(ttfc, Some(0.1));
        assert!((tpot.unwrap() - 0.06 / 4.0).abs() < 1e-12);
        assert_eq!(itl.len(), 4, "3 tokens in one chunk give 3 gaps");
        assert!((itl[0] - 0.01).abs() < 1e-12 && (itl[3] - 0.02).abs() < 1e-12);
    }

    #[test]
    fn split_without_per_chunk_usage() {
        let e = vec![ev(1, 1, None), ev(2, 1, None), ev(3, 1, None)];
        assert_eq!(
            split_tokens(&e, Some(3)),
            (vec![1, 1, 1], ChunkSplit::OnePerChunk)
        );
        let e = vec![ev(1, 1, None), ev(2, 8, None), ev(3, 1, None)];
        let (t, how) = split_tokens(&e, Some(7));
        assert_eq!(how, ChunkSplit::Estimated);
        assert_eq!(t.iter().sum::<u64>(), 7);
        assert!(t[1] > t[0] && t.iter().all(|x| *x >= 1), "{t:?}");
        let (t, _) = split_tokens(&e, Some(2));
        assert_eq!(t.iter().sum::<u64>(), 2);
        // Per-chunk counts that disagree with the total are not trusted.
        let e = vec![ev(1, 1, Some(2)), ev(2, 1, Some(2))];
        assert_eq!(split_tokens(&e, Some(2)).1, ChunkSplit::OnePerChunk);
        assert_eq!(
            split_tokens(&e, Some(4)),
            (vec![2, 2], ChunkSplit::UsagePerChunk)
        );
    }

    #[test]
    fn reasoning_counts_for_ttft_not_ttfc() {
        let mut r = ev(50, 0, None);
        r.reasoning_chars = 4;
        let o = StreamOutcome {
            events: vec![r, ev(80, 3, None)],
            first_content: Some(Duration::from_millis(80)),
            end: Duration::from_millis(90),
            ..Default::default()
        };
        let (ttft, ttfc, tpot, _) = latencies(&o, &[1, 1], Some(2));
        assert_eq!((ttft, ttfc), (Some(0.05), Some(0.08)));
        assert!((tpot.unwrap() - 0.04).abs() < 1e-12);
        let (_, _, tpot, _) = latencies(&o, &[1], Some(1));
        assert_eq!(tpot, None, "TPOT needs two output tokens");
        // Two tokens in one chunk: the decode time is not observable.
        let one = StreamOutcome {
            events: vec![ev(50, 6, None)],
            end: Duration::from_millis(51),
            ..Default::default()
        };
        let (ttft, _, tpot, itl) = latencies(&one, &[2], Some(2));
        assert_eq!((ttft, tpot), (Some(0.05), None));
        assert!(itl.is_empty());
    }

    #[test]
    fn bursts_and_multi_token_chunks_are_flagged() {
        // Smooth: one token every 4 ms, one per chunk.
        let smooth: Vec<TokenEvent> = (0..20).map(|i| ev(100 + 4 * i, 2, Some(1))).collect();
        let d = Delivery::of(&smooth, &[1; 20], Some(20), true);
        assert_eq!((d.gaps, d.burst_gaps, d.multi_token_chunks), (19, 0, 0));
        assert!(!d.bursty);
        // Bursts: groups of 5 chunks written within 0.1 ms, a group every 20 ms (llama.cpp under
        // load); one token per chunk.
        let bursty: Vec<TokenEvent> = (0..20u64)
            .map(|i| TokenEvent {
                at: Duration::from_micros(100_000 + (i / 5) * 20_000 + (i % 5) * 20),
                content_chars: 2,
                reasoning_chars: 0,
                tokens: None,
            })
            .collect();
        let d = Delivery::of(&bursty, &[1; 20], Some(20), false);
        assert_eq!((d.gaps, d.burst_gaps, d.multi_token_chunks), (19, 16, 0));
        assert!(d.bursty && d.describe().contains("16 of 19 gaps"));
        // Several tokens per chunk without per-chunk counts: 32 tokens in 26 chunks.
        let merged: Vec<TokenEvent> = (0..26).map(|i| ev(100 + 4 * i, 2, None)).collect();
        let (t, how) = split_tokens(&merged, Some(32));
        assert_eq!(how, ChunkSplit::Estimated);
        let d = Delivery::of(&merged, &t, Some(32), false);
        assert_eq!((d.extra_tokens, d.multi_token_chunks), (6, 6));
        assert!(d.bursty && d.describe().contains("several tokens"));
        // Known per-chunk counts: exact.
        let d = Delivery::of(&smooth[..3], &[1, 3, 1], Some(5), true);
        assert_eq!((d.multi_token_chunks, d.extra_tokens), (1, 2));
        // A fast, smooth stream (0.3 ms per token) is not bursty: the bar is relative.
        let fast: Vec<TokenEvent> = (0..50u64)
            .map(|i| TokenEvent {
                at: Duration::from_micros(1000 + 300 * i),
                content_chars: 1,
                reasoning_chars: 0,
                tokens: Some(1),
            })
            .collect();
        assert!(!Delivery::of(&fast, &[1; 50], Some(50), true).bursty);
    }

    #[test]
    fn run_summaries() {
        let recs: Vec<RequestRecord> = (0..4)
            .map(|i| RequestRecord {
                index: i,
                ok: i < 3,
                cancelled: i == 3,
                ttft_s: Some(0.1 * (i + 1) as f64),
                output_tokens: Some(10),
                prompt_tokens: Some(5),
                lateness_s: Some(0.001 * i as f64 * 10.0),
                ..Default::default()
            })
            .collect();
        let t = Throughput::of(&recs, 2.0).unwrap();
        assert_eq!(
            (t.completed, t.failed, t.cancelled, t.output_tokens),
            (3, 0, 1, 30)
        );
        assert_eq!(
            (t.output_tok_per_s, t.requests_per_s, t.input_tokens),
            (15.0, 1.5, Some(15))
        );
        let l = LatencySummary::of(&recs);
        assert_eq!(l.ttft.as_ref().unwrap().n, 3);
        assert!((l.ttft.unwrap().p50 - 0.2).abs() < 1e-12);
        assert!(l.tpot.is_none());
        let late = Lateness::of(&recs, 0.005).unwrap();
        assert_eq!((late.arrivals, late.late), (4, 3));
        assert!(Throughput::of(&recs[3..], 1.0).is_none());
    }
}
