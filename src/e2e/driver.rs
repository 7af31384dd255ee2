//! The e2e session: start or reach the engine, read its facts, then for each sweep point:
//! warm up, prepare unique prompts, set the cache temperature, scrape `/metrics`, run the load
//! while sampling gauges, scrape again, and turn what came back into a [`RunResult`] with its
//! conditions and validity.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::adapters::EngineKind;
use super::bootlog::BootLog;
use super::client::{Api, EngineClient, GenRequest};
use super::conditions::{
    cache_condition, kv_capacity, length_condition, spec_condition, thinking_condition,
    CacheExpectation, Conditions, EngineFacts, KvCondition, PollStats, Sourced, TokenCheck,
};
use super::engines::{fill_spec, stated, EngineProbe};
use super::executor::{
    execute, ExecConfig, ExecOutcome, ExecStop, LoadPoint, RawRecord, StopCause, StopSignal,
};
use super::launcher::{EngineChoice, EngineHandle};
use super::metrics::{
    latencies, split_tokens, LatencySummary, Lateness, RequestRecord, Throughput, TokenSource,
};
use super::validity::{assess, output_flags, Validity};
use super::workload::{
    prepare, CacheTemp, LoadMode, PreparedRequest, Suite, TokenCounter, WorkloadKind,
};
use super::{E2eResults, EngineSummary};
use crate::diagnose::prometheus::Exposition;

/// Everything a session needs.
#[derive(Debug, Clone)]
pub struct E2eOptions {
    /// The engine.
    pub engine: EngineChoice,
    /// An engine log to parse in addition to the captured one (`--engine-log`).
    pub engine_log: Option<PathBuf>,
    /// The workload and load.
    pub suite: Suite,
    /// The `model` field to send (default: the first id of `/v1/models`).
    pub served_model: Option<String>,
    /// A local tokenizer for engines without `/tokenize`.
    pub tokenizer: Option<PathBuf>,
    /// Speculative method, as stated (or passed to the built-in engine).
    pub spec_method: Option<String>,
    /// Speculative k, as stated.
    pub spec_k: Option<u32>,
    /// Per-request timeout.
    pub request_timeout: Duration,
    /// Engine startup timeout.
    pub startup_timeout: Duration,
    /// The shortest wait between `/metrics` scrapes during a run; the wait adapts between it and
    /// twice it (see [`super::conditions::next_scrape_interval`]). 1 s by default.
    pub metrics_interval: Duration,
    /// Idle pooled connections are dropped after this (below the engine's keep-alive timeout;
    /// [`super::client::POOL_IDLE_TIMEOUT`] by default).
    pub pool_idle_timeout: Duration,
    /// Show a progress bar (on a terminal).
    pub progress: bool,
    /// Stop cleanly on SIGINT (Ctrl-C) and SIGTERM, keeping what was measured
    /// (see `crate::signals`).
    pub handle_ctrl_c: bool,
    /// An open-loop arrival counts as late beyond this.
    pub lateness_tolerance: Duration,
    /// Conditions the user stated for engines that do not expose them.
    pub stated: super::engines::Stated,
    /// Before the sweep, send the same seeded prompts twice at temperature 0 and compare the
    /// outputs (`--check-determinism`; see [`super::checks::determinism_check`]).
    pub check_determinism: bool,
    /// Before the sweep, measure the perplexity of the fixed text and the exact-recall pass rate
    /// (`--quality`; see [`super::quality`]).
    pub quality: bool,
}

impl E2eOptions {
    /// Defaults around `suite` with the built-in engine (`synthetic:tiny`).
    pub fn with_suite(suite: Suite) -> Self {
        Self {
            engine: EngineChoice::Builtin {
                program: None,
                args: vec!["--model".into(), "synthetic:tiny".into()],
            },
            engine_log: None,
            suite,
            served_model: None,
            tokenizer: None,
            spec_method: None,
            spec_k: None,
            request_timeout: Duration::from_secs(600),
            startup_timeout: Duration::from_secs(120),
            metrics_interval: Duration::from_secs(1),
            pool_idle_timeout: super::client::POOL_IDLE_TIMEOUT,
            progress: true,
            handle_ctrl_c: true,
            lateness_tolerance: Duration::from_millis(10),
            stated: Default::default(),
            check_determinism: false,
            quality: false,
        }
    }

    /// The short default `rigbench report` runs: the built-in engine with `synthetic:tiny`, the
    /// `tiny` suite (fixed 64-token prompts, 32 output tokens with `ignore_eos`, concurrency
    /// 1/2/4, 8 requests each, cold cache, thinking off). Finishes well under a minute on a
    /// 2-core CPU.
    pub fn default_for_report() -> Self {
        let suite = Suite::load("tiny").expect("the built-in tiny suite parses (tested)");
        let mut o = Self::with_suite(suite);
        o.progress = false;
        o.request_timeout = Duration::from_secs(120);
        o
    }
}

/// One sweep point's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Label (`c=4`, `2.00 req/s`).
    pub label: String,
    /// The load.
    pub load: LoadPoint,
    /// Conditions.
    pub conditions: Conditions,
    /// The verdict.
    pub validity: Validity,
    /// Latency percentiles of completed requests.
    pub latency: LatencySummary,
    /// Throughput, present only when the run is valid.
    pub throughput: Option<Throughput>,
    /// Throughput as measured on an invalid run: diagnostics, not a result.
    pub throughput_invalid: Option<Throughput>,
    /// Open-loop punctuality.
    pub lateness: Option<Lateness>,
    /// How the run ended.
    pub stop: ExecStop,
    /// Warm-up requests sent before it (unmeasured).
    pub warmup_requests: usize,
    /// Gauge samples during the run.
    pub polls: PollStats,
    /// Per-request records.
    pub requests: Vec<RequestRecord>,
    /// The output text of the first [`OUTPUT_SAMPLES`] requests, at most
    /// [`OUTPUT_SAMPLE_CHARS`] characters each (reasoning first), so a report shows what the
    /// engine wrote; redacted with the rest of the results when written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_samples: Vec<String>,
}

/// Requests per run whose output text is kept as a sample.
pub const OUTPUT_SAMPLES: usize = 3;
/// Characters kept per sample.
pub const OUTPUT_SAMPLE_CHARS: usize = 200;

impl RunResult {
    /// The throughput to present, `None` for an invalid run.
    pub fn presented_throughput(&self) -> Option<&Throughput> {
        if self.validity.valid {
            self.throughput.as_ref()
        } else {
            None
        }
    }
}

fn sweep(suite: &Suite) -> Vec<LoadPoint> {
    let l = &suite.load;
    match l.mode {
        LoadMode::Closed => l
            .concurrency
            .iter()
            .map(|&c| LoadPoint::Closed { concurrency: c })
            .collect(),
        LoadMode::Open => l
            .rates
            .iter()
            .enumerate()
            .map(|(i, &r)| LoadPoint::Open {
                rate: r,
                arrival: l.arrival,
                burstiness: l.burstiness,
                max_concurrency: l.max_concurrency,
                seed: suite.sampling.seed.unwrap_or(0).wrapping_add(i as u64),
            })
            .collect(),
    }
}

/// Engine name and version from `/version`, the metric names, `/v1/models` and the log.
async fn engine_facts(
    client: &EngineClient,
    opts: &E2eOptions,
    boot: &BootLog,
    probe: &EngineProbe,
) -> anyhow::Result<EngineFacts> {
    let mut f = EngineFacts::default();
    let version: Option<Value> = client.version().await.unwrap_or(None);
    if let Some(v) = &version {
        if let Some(n) = v
            .get("engine")
            .or_else(|| v.get("name"))
            .and_then(Value::as_str)
        {
            f.name = Some(Sourced::new(n.to_string(), "/version"));
        }
        if let Some(n) = v.get("version").and_then(Value::as_str) {
            f.version = Some(Sourced::new(n.to_string(), "/version"));
        }
    }
    f.runtime = version
        .as_ref()
        .and_then(super::runtime_facts::from_version);
    // An engine that refuses rigbench (401/403: it wants an API key) would fail every request:
    // stop here with the fix.
    let models = match client.models().await {
        Ok(m) => m,
        Err(e) if format!("{e:#}").contains(super::client::API_KEY_FIX) => return Err(e),
        Err(_) => Vec::new(),
    };
    let metrics = match client.metrics().await {
        Ok(m) => m,
        Err(e) => {
            f.metrics_note = Some(format!("{e:#}"));
            None
        }
    };
    f.metrics = metrics.is_some();
    if f.name.is_none() {
        let prefix = metrics
            .as_ref()
            .and_then(crate::diagnose::scrape::engine_of);
        let owned = models
            .first()
            .and_then(|m| m.1.clone())
            .filter(|o| !o.is_empty() && o != "organization-owner");
        f.name = match (prefix, owned) {
            (_, Some(o)) => Some(Sourced::new(o, "/v1/models owned_by")),
            (Some(p), None) => Some(Sourced::new(p, "/metrics name prefix")),
            _ => None,
        };
    }
    // `rigbench serve` states its speculative configuration in /version.
    let version_spec = version
        .as_ref()
        .and_then(|v| v.get("speculative"))
        .filter(|s| s.is_object());
    let version_method = version_spec
        .and_then(|s| s.get("method"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let version_k = version_spec
        .and_then(|s| s.get("num_speculative_tokens"))
        .and_then(Value::as_u64)
        .map(|k| k as u32);
    // Engines without /version: their own endpoints, the log, or the user's statement.
    if f.name.as_ref().is_none_or(|n| n.source != "/version") {
        f.name = probe.name.clone().or(f.name);
    }
    f.name = f.name.or_else(|| {
        boot.engine
            .clone()
            .map(|e| Sourced::new(e, "engine log (line forms)"))
    });
    f.version = f.version.or_else(|| probe.version.clone());
    if f.version.is_none() {
        if let Some(v) = &boot.engine_version {
            f.version = Some(Sourced::new(v.clone(), "engine log"));
        }
    }
    if f.version.is_none() {
        if let Some(v) = &opts.stated.engine_version {
            f.version = Some(Sourced::new(v.clone(), stated("--engine-version")));
        }
    }
    f.model = match &opts.served_model {
        Some(m) => Some(Sourced::new(m.clone(), "stated (--served-model-name)")),
        None => models
            .first()
            .map(|m| Sourced::new(m.0.clone(), "/v1/models")),
    };
    // Speculative method: what rigbench passed to its own engine, the engine's log, or stated.
    let builtin = matches!(opts.engine, EngineChoice::Builtin { .. });
    // Speculative config: the engine's own word (/version, its log) first, then what rigbench
    // passed to its own engine, then a statement.
    let command_spec = match &opts.engine {
        EngineChoice::Command { command, .. } => super::adapters::spec_from_command(command),
        _ => None,
    };
    f.spec_method = if let Some(m) = version_method {
        Some(Sourced::new(m, "/version"))
    } else if let Some(m) = probe.spec_method.clone() {
        Some(m)
    } else if let Some(m) = command_spec.as_ref().and_then(|c| c.method.clone()) {
        Some(m)
    } else if let Some(m) = &boot.spec_method {
        Some(Sourced::new(m.clone(), "engine log (config)"))
    } else {
        opts.spec_method.as_ref().map(|m| {
            Sourced::new(
                m.clone(),
                if builtin {
                    "passed to rigbench serve"
                } else {
                    "stated (--spec-method), not verified"
                },
            )
        })
    };
    f.spec_k = if let Some(k) = version_k {
        Some(Sourced::new(k, "/version"))
    } else if let Some(k) = probe.spec_k.clone() {
        Some(k)
    } else if let Some(k) = command_spec.as_ref().and_then(|c| c.k.clone()) {
        Some(k)
    } else if let Some(k) = boot.spec_k {
        Some(Sourced::new(k, "engine log (config)"))
    } else {
        opts.spec_k.map(|k| {
            Sourced::new(
                k,
                if builtin {
                    "passed to rigbench serve"
                } else {
                    "stated (--spec-k), not verified"
                },
            )
        })
    };
    f.kind = f
        .name
        .as_ref()
        .map(|n| EngineKind::from_name(&n.value))
        .unwrap_or_default();
    // The engine's tokenizer, in the body its kind takes (then the other one, for an engine of
    // unknown kind). Counting nothing for a non-empty text is a failure, never a length of 0.
    const PROBE_TEXT: &str = "rigbench counts the tokens of this sentence.";
    let model = f
        .model
        .as_ref()
        .map(|m| m.value.clone())
        .unwrap_or_default();
    let mut forms = vec![f.kind.tokenize_form()];
    forms.extend(f.kind.fallback_tokenize_form());
    let mut failures = Vec::new();
    for form in forms {
        match client.tokenize_as(form, &model, PROBE_TEXT).await {
            Ok(Some(t)) => {
                f.tokenize = true;
                f.tokenize_form = Some(form);
                f.max_model_len = t.max_model_len;
                break;
            }
            Ok(None) => {
                failures.push("the engine has no POST /tokenize (404)".to_string());
                break;
            }
            Err(e) => failures.push(format!("{e:#}")),
        }
    }
    if !f.tokenize {
        f.tokenize_note = Some(failures.join("; "));
    }
    f.max_model_len = f.max_model_len.or(probe.max_model_len);
    Ok(f)
}

/// One scrape during a run; a failure (a stalled or oversized `/metrics`) is kept in `polls`
/// with its reason, not taken for "no /metrics".
async fn scrape_into(client: &EngineClient, polls: &mut PollStats) -> Option<Exposition> {
    match client.metrics().await {
        Ok(e) => e,
        Err(e) => {
            polls.note_failure(format!("{e:#}"));
            None
        }
    }
}

/// The prompt tokens the engine adds around a prompt text (chat template, BOS): one
/// non-streaming request with the suite's API, thinking setting and a short probe text
/// (`max_tokens` 1), its `usage.prompt_tokens` minus `counter`'s count of the text. `None`
/// without a tokenizer or when the engine reports no prompt count.
async fn prompt_overhead(
    client: &EngineClient,
    opts: &E2eOptions,
    facts: &EngineFacts,
    counter: &TokenCounter,
) -> Option<Sourced<i64>> {
    const TEXT: &str = "[probe] Count the tokens of this short message, please.";
    let counted = counter.count(TEXT).await.ok().flatten()?;
    let s = &opts.suite;
    let req = GenRequest {
        api: s.workload.api,
        model: facts
            .model
            .as_ref()
            .map(|m| m.value.clone())
            .unwrap_or_else(|| "default".into()),
        prompt: TEXT.to_string(),
        max_tokens: 1,
        ignore_eos: false,
        temperature: 0.0,
        seed: s.sampling.seed,
        thinking: if s.workload.api == Api::Chat {
            s.sampling.thinking
        } else {
            None
        },
    };
    let reported = client.prompt_tokens_of(&req).await.ok().flatten()?;
    Some(Sourced::new(
        reported as i64 - counted as i64,
        format!(
            "measured: a probe {} request counted {reported} prompt tokens for a {counted}-token text ({})",
            match s.workload.api {
                Api::Chat => "chat",
                Api::Completions => "completions",
            },
            counter.source().map_or("no tokenizer", |t| t.label())
        ),
    ))
}

/// One scrape at the start or the end of a run, timed and counted into `polls`.
async fn timed_scrape(client: &EngineClient, polls: &mut PollStats) -> Option<Exposition> {
    let t = std::time::Instant::now();
    let e = scrape_into(client, polls).await;
    polls.timed(t.elapsed());
    if let Some(x) = &e {
        polls.add(x);
    }
    e
}

fn progress_bar(enabled: bool, n: usize, label: &str) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(n as u64);
    if let Ok(style) = ProgressStyle::with_template(
        "{prefix:>14} [{bar:30}] {pos}/{len} requests {elapsed_precise} {msg}",
    ) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_prefix(label.to_string());
    pb
}

/// Turn raw records into request records (token counts, latencies, flags); returns them with
/// the texts (content, reasoning) for the thinking check.
async fn finish_records(
    raw: Vec<RawRecord>,
    prepared: &[PreparedRequest],
    counter: &TokenCounter,
    output_fixed: bool,
    judge_repetition: bool,
) -> (Vec<RequestRecord>, Vec<(String, String)>) {
    let mut out = Vec::with_capacity(raw.len());
    let mut texts = Vec::new();
    let mut raw = raw;
    raw.sort_by_key(|r| r.index);
    for r in raw {
        let o = &r.outcome;
        let p = &prepared[r.index];
        let ok = o.error.is_none() && o.done;
        let usage = o.usage.unwrap_or_default();
        let mut token_source = None;
        let mut output_tokens = None;
        if ok {
            if let Some(n) = usage.completion_tokens {
                output_tokens = Some(n);
                token_source = Some(TokenSource::Usage);
            } else {
                let text = format!("{}{}", o.reasoning, o.content);
                if let Ok(Some(n)) = counter.count(&text).await {
                    output_tokens = Some(n as u64);
                    token_source = counter.source();
                } else {
                    output_tokens = Some(o.events.len() as u64);
                    token_source = Some(TokenSource::Chunks);
                }
            }
        }
        let reasoning_tokens = match usage.reasoning_tokens {
            Some(n) => Some(n),
            None if ok && !o.reasoning.is_empty() => counter
                .count(&o.reasoning)
                .await
                .ok()
                .flatten()
                .map(|n| n as u64),
            None => None,
        };
        let (tokens, split) = split_tokens(&o.events, output_tokens);
        let (ttft, ttfc, tpot, itl) = if ok {
            latencies(o, &tokens, output_tokens)
        } else {
            (None, None, None, Vec::new())
        };
        let delivery = (ok && !o.events.is_empty()).then(|| {
            super::metrics::Delivery::of(
                &o.events,
                &tokens,
                output_tokens,
                split == super::metrics::ChunkSplit::UsagePerChunk,
            )
        });
        let itl_p = super::metrics::Percentiles::of(&itl);
        let mut rec = RequestRecord {
            index: r.index,
            scheduled_s: r.scheduled.map(|d| d.as_secs_f64()),
            sent_s: r.sent.as_secs_f64(),
            lateness_s: r.scheduled.map(|s| r.sent.as_secs_f64() - s.as_secs_f64()),
            ok,
            cancelled: o.cancelled,
            error: if ok {
                None
            } else {
                o.error
                    .clone()
                    .or_else(|| Some("stream ended without [DONE]".into()))
            },
            http_status: o.http_status,
            ttft_s: ttft,
            ttfc_s: ttfc,
            e2e_s: ok.then_some(o.end.as_secs_f64()),
            tpot_s: tpot,
            itl_mean_s: itl_p.as_ref().map(|p| p.mean),
            itl_max_s: itl_p.as_ref().map(|p| p.max),
            itl_s: itl,
            input_tokens_requested: p.input_tokens_requested,
            input_tokens_counted: p.input_tokens_counted,
            prompt_tokens: usage.prompt_tokens,
            cached_tokens: usage.cached_tokens,
            output_tokens_requested: p.req.max_tokens,
            output_tokens,
            token_source,
            reasoning_tokens,
            chunk_split: (!o.events.is_empty()).then_some(split),
            chunks: o.chunks,
            content_chars: o.content.chars().count(),
            reasoning_chars: o.reasoning.chars().count(),
            finish_reason: o.finish_reason.clone(),
            flags: Vec::new(),
            spec: o.spec.clone(),
            opening_wave: false,
            output_tokens_retokenized: None,
            first_chunk_s: if ok {
                o.first_chunk.map(|t| t.as_secs_f64())
            } else {
                None
            },
            token_chunks: o.events.len(),
            delivery: delivery.clone(),
            retries: o.retries,
        };
        let text = format!("{}{}", o.reasoning, o.content);
        rec.flags = output_flags(&rec, &text, output_fixed, judge_repetition);
        if let Some(d) = delivery.filter(|d| d.bursty) {
            rec.flags.push(d.describe());
        }
        if let Some(why) = &o.retry_reason {
            rec.flags.push(format!(
                "{}: sent again on a fresh connection after the pooled one failed before any response ({why}); its latencies include the retry",
                super::metrics::RETRIED_FLAG
            ));
        }
        if ok && o.events.len() == 1 && output_tokens.unwrap_or(0) >= 2 {
            rec.flags.push(format!(
                "{}: {} tokens arrived in one chunk (TPOT and ITL not observable)",
                super::metrics::SINGLE_CHUNK_FLAG,
                output_tokens.unwrap_or(0)
            ));
        }
        if ok {
            texts.push((o.content.clone(), o.reasoning.clone()));
        }
        out.push(rec);
    }
    (out, texts)
}

struct Session<'a> {
    opts: &'a E2eOptions,
    client: EngineClient,
    facts: EngineFacts,
    probe: EngineProbe,
    counter: TokenCounter,
    stop: StopSignal,
    exec_cfg: ExecConfig,
    /// The prefix-cache reset was reported (once per session).
    reset_told: std::sync::atomic::AtomicBool,
}

/// What rigbench did to the engine's prefix cache, said once, after the first sweep point's
/// `POST /reset_prefix_cache` answered: emptied (2xx), refused, or not offered (404/405/501: then
/// nothing was emptied, and cold runs rest on the salted prompts).
pub fn reset_message(
    url: &str,
    path: &str,
    reset: Option<bool>,
    points: usize,
    cache: CacheTemp,
) -> String {
    let points = crate::output::table::plural(points as u64, "sweep point", "sweep points");
    match reset {
        Some(true) => format!(
            "POST {url}{path} emptied the engine's prefix cache; rigbench empties it before each of the {points}{}",
            if cache == CacheTemp::Warm {
                " (warm runs then prime it again)"
            } else {
                " (cold runs then check the hit counters)"
            }
        ),
        Some(false) => format!(
            "POST {url}{path} was refused: the engine's prefix cache was NOT emptied; cold runs rest on prompts salted per run and on the hit counters"
        ),
        None => format!(
            "the engine offers no POST {url}{path}: its prefix cache is not emptied; cold runs rest on prompts salted per run (and on the hit counters, where the engine has them)"
        ),
    }
}

impl Session<'_> {
    /// Say what the first reset did (engines rigbench did not build: `--engine-cmd`, `--url`).
    fn tell_reset(&self, reset: Option<bool>) {
        if self
            .reset_told
            .swap(true, std::sync::atomic::Ordering::SeqCst)
            || matches!(self.opts.engine, EngineChoice::Builtin { .. })
        {
            return;
        }
        let l = &self.opts.suite.load;
        let points = match l.mode {
            super::workload::LoadMode::Closed => l.concurrency.len(),
            super::workload::LoadMode::Open => l.rates.len(),
        };
        eprintln!(
            "rigbench e2e: {}",
            crate::output::redact::Redactor::for_this_host(true).secrets_only(&reset_message(
                self.client.base(),
                self.facts.kind.reset_path(),
                reset,
                points,
                l.cache
            ))
        );
    }

    fn model(&self) -> String {
        self.facts
            .model
            .as_ref()
            .map(|m| m.value.clone())
            .unwrap_or_else(|| "default".into())
    }

    async fn run_point(&self, point: &LoadPoint, boot: &BootLog) -> anyhow::Result<RunResult> {
        let suite = &self.opts.suite;
        let model = self.model();
        let nonce: String = {
            let mut rng = rand::rng();
            (0..8)
                .map(|_| format!("{:x}", rng.random_range(0..16u8)))
                .collect()
        };
        let conc = point.concurrency().unwrap_or(1).max(1);
        // Warm-up: its own prompts, never measured.
        let warm_n = suite.load.warmup as usize;
        if warm_n > 0 {
            self.warm_up(&model, &nonce, warm_n, conc).await?;
        }
        let prepared = Arc::new(
            prepare(
                suite,
                &self.counter,
                &model,
                &nonce,
                suite.load.requests as usize,
                self.facts.max_model_len,
            )
            .await?,
        );
        // Cache temperature.
        let reset = self
            .client
            .reset_prefix_cache_at(self.facts.kind.reset_path())
            .await
            .unwrap_or(None);
        self.tell_reset(reset);
        if suite.load.cache == CacheTemp::Warm {
            self.prime_cache(&prepared, conc).await;
        }
        let PointRun {
            outcome:
                ExecOutcome {
                    records,
                    duration,
                    stop,
                    healthy_after_failures,
                },
            polls,
            before,
            after,
            peaks_reset,
        } = self.measure(point, &prepared).await;
        let judge_repetition = !model.starts_with("synthetic:");
        let raw_texts: std::collections::BTreeMap<usize, String> = records
            .iter()
            .map(|r| {
                (
                    r.index,
                    format!("{}{}", r.outcome.reasoning, r.outcome.content),
                )
            })
            .collect();
        let output_samples: Vec<String> = raw_texts
            .values()
            .take(OUTPUT_SAMPLES)
            .map(|t| t.chars().take(OUTPUT_SAMPLE_CHARS).collect())
            .collect();
        let (mut requests, texts) = finish_records(
            records,
            &prepared,
            &self.counter,
            suite.output_fixed(),
            judge_repetition,
        )
        .await;
        let wave_note = super::checks::mark_opening_wave(point, &mut requests);
        let token_check = super::checks::cross_check_tokens(
            &mut requests,
            &raw_texts,
            &self.counter,
            (!judge_repetition).then_some(
                "synthetic weights (their random tokens do not survive a decode/encode round trip)",
            ),
        )
        .await;

        let hits_allowed = hits_allowed(suite, &requests);
        let kv = self.kv_condition(before.as_ref(), after.as_ref(), boot, &polls, peaks_reset);
        let evidence = PointEvidence {
            before: before.as_ref(),
            after: after.as_ref(),
            boot,
            reset,
            hits_allowed,
            judge_repetition,
        };
        let conditions = self.conditions(&requests, &texts, &evidence, kv, token_check);
        let validity = self.validity(
            &requests,
            &conditions,
            &stop,
            wave_note,
            healthy_after_failures,
            judge_repetition,
        );
        let measured = Throughput::of(&requests, duration.as_secs_f64());
        let (throughput, throughput_invalid) = if validity.valid {
            (measured, None)
        } else {
            (None, measured)
        };
        Ok(RunResult {
            label: point.label(),
            load: point.clone(),
            latency: LatencySummary::of(&requests),
            lateness: Lateness::of(&requests, self.opts.lateness_tolerance.as_secs_f64()),
            conditions,
            validity,
            throughput,
            throughput_invalid,
            stop,
            warmup_requests: warm_n,
            polls,
            requests,
            output_samples,
        })
    }

    /// The unmeasured warm-up of a sweep point: `warm_n` prompts of its own; an error when
    /// every one of them failed (and the session was not stopped).
    async fn warm_up(
        &self,
        model: &str,
        nonce: &str,
        warm_n: usize,
        conc: u32,
    ) -> anyhow::Result<()> {
        let w = prepare(
            &self.opts.suite,
            &self.counter,
            model,
            &format!("w{nonce}"),
            warm_n,
            self.facts.max_model_len,
        )
        .await?;
        let out = execute(
            &self.client,
            &LoadPoint::Closed {
                concurrency: conc.min(warm_n as u32),
            },
            Arc::new(w),
            &self.exec_cfg,
            &self.stop,
            ProgressBar::hidden(),
        )
        .await;
        let errs: Vec<&str> = out
            .records
            .iter()
            .filter_map(|r| r.outcome.error.as_deref())
            .collect();
        if !errs.is_empty() && errs.len() == out.records.len() && !self.stop.is_stopped() {
            anyhow::bail!("every warm-up request failed (first: {})", errs[0]);
        }
        Ok(())
    }

    /// A warm cache: each prompt sent once, unmeasured, with one output token.
    async fn prime_cache(&self, prepared: &[PreparedRequest], conc: u32) {
        let primed: Vec<PreparedRequest> = prepared
            .iter()
            .map(|p| {
                let mut p = p.clone();
                p.req.max_tokens = 1;
                p.req.ignore_eos = false;
                p
            })
            .collect();
        let _ = execute(
            &self.client,
            &LoadPoint::Closed { concurrency: conc },
            Arc::new(primed),
            &self.exec_cfg,
            &self.stop,
            ProgressBar::hidden(),
        )
        .await;
    }

    /// The measured load of a sweep point: the engine's high-water marks reset, `/metrics`
    /// scraped before and after, its gauges sampled while the requests run.
    async fn measure(&self, point: &LoadPoint, prepared: &Arc<Vec<PreparedRequest>>) -> PointRun {
        // The engine's high-water marks (rigbench serve) restart here.
        let peaks_reset = self.client.reset_peaks().await.ok().flatten() == Some(true);
        let mut polls = PollStats {
            min_interval_s: Some(self.opts.metrics_interval.as_secs_f64()),
            ..Default::default()
        };
        let before = timed_scrape(&self.client, &mut polls).await;
        // Sample gauges while the run goes: at most every 1–2 s (see `next_scrape_interval`).
        let (poll_stop_tx, mut poll_stop_rx) = tokio::sync::oneshot::channel::<()>();
        let poll_client = self.client.clone();
        let min_interval = self.opts.metrics_interval;
        let poller = tokio::spawn(async move {
            let mut stats = PollStats::default();
            let mut wait = min_interval;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = &mut poll_stop_rx => break,
                }
                let t = std::time::Instant::now();
                if let Some(e) = scrape_into(&poll_client, &mut stats).await {
                    stats.add(&e);
                }
                let took = t.elapsed();
                stats.timed(took);
                wait = super::conditions::next_scrape_interval(took, min_interval);
            }
            stats
        });
        let pb = progress_bar(self.opts.progress, prepared.len(), &point.label());
        let outcome = execute(
            &self.client,
            point,
            prepared.clone(),
            &self.exec_cfg,
            &self.stop,
            pb.clone(),
        )
        .await;
        pb.finish_and_clear();
        let _ = poll_stop_tx.send(());
        let during = poller.await.unwrap_or_default();
        polls.merge(&during);
        let after = timed_scrape(&self.client, &mut polls).await;
        PointRun {
            outcome,
            polls,
            before,
            after,
            peaks_reset,
        }
    }

    /// KV capacity: /metrics, then the engine's own endpoint (llama.cpp /slots, SGLang
    /// /get_server_info), then its log, then the user's statement. The live endpoint wins
    /// over the log: llama.cpp's `llama_kv_cache` line gives cells per sequence. With the
    /// run's peak usage, queue depths and preemptions.
    fn kv_condition(
        &self,
        before: Option<&Exposition>,
        after: Option<&Exposition>,
        boot: &BootLog,
        polls: &PollStats,
        peaks_reset: bool,
    ) -> KvCondition {
        let mut kv = kv_capacity(after.or(before), Some(boot));
        let from_metrics = kv
            .capacity_tokens
            .as_ref()
            .is_some_and(|c| c.source.starts_with("/metrics"));
        if let (false, Some(p)) = (from_metrics, &self.probe.kv_capacity) {
            if let Some(log) = kv.capacity_tokens.take().filter(|l| l.value != p.value) {
                kv.capacity_note = Some(format!(
                    "the engine log gives {} tokens ({}); the engine's own endpoint is used",
                    crate::output::table::thousands(log.value),
                    log.source
                ));
            }
            kv.capacity_tokens = Some(p.clone());
        }
        if kv.capacity_tokens.is_none() {
            kv.capacity_tokens = self
                .opts
                .stated
                .kv_capacity
                .map(|t| Sourced::new(t, stated("--kv-capacity")));
        }
        kv.peak_usage = polls.peak_kv_usage;
        let mark = after
            .filter(|_| peaks_reset)
            .and_then(|a| a.max("rigbench:kv_cache_usage_peak_perc"));
        kv.peak_usage_source = match (mark, polls.peak_kv_usage) {
            (Some(m), _) => {
                kv.peak_usage = Some(m);
                Some("high-water mark kept by the engine (rigbench:kv_cache_usage_peak_perc)".into())
            }
            (None, Some(_)) => Some(format!(
                "sampled: the largest of {} /metrics scrapes (at the start, at the end, and every {}–{} s in between; peaks between scrapes are missed)",
                polls.polls,
                self.opts.metrics_interval.as_secs_f64(),
                2.0 * self.opts.metrics_interval.as_secs_f64()
            )),
            (None, None) => None,
        };
        kv.max_running = polls.max_running;
        kv.max_waiting = polls.max_waiting;
        kv.preemptions = super::conditions::delta(before, after, "vllm:num_preemptions")
            .map(|x| x.round() as u64);
        kv
    }

    /// The run's conditions (engine, sampling, thinking, speculation, cache, KV, lengths,
    /// token sources), from its requests and the evidence around them.
    fn conditions(
        &self,
        requests: &[RequestRecord],
        texts: &[(String, String)],
        ev: &PointEvidence<'_>,
        kv: KvCondition,
        token_check: Option<TokenCheck>,
    ) -> Conditions {
        let suite = &self.opts.suite;
        let mut token_sources: Vec<TokenSource> =
            requests.iter().filter_map(|r| r.token_source).collect();
        token_sources.sort_by_key(|s| *s as u8);
        token_sources.dedup();
        let mut chunk_splits: Vec<_> = requests.iter().filter_map(|r| r.chunk_split).collect();
        chunk_splits.sort_by_key(|s| *s as u8);
        chunk_splits.dedup();
        let conditions = Conditions {
            engine: self.facts.name.clone(),
            engine_version: self.facts.version.clone(),
            model: self.facts.model.clone(),
            workload: suite.workload.kind,
            temperature: suite.sampling.temperature,
            thinking: thinking_condition(
                suite.workload.api,
                if suite.workload.api == Api::Chat {
                    suite.sampling.thinking
                } else {
                    None
                },
                requests,
                texts,
                ev.judge_repetition,
            ),
            spec: fill_spec(
                spec_condition(ev.before, ev.after, &self.facts),
                requests,
                &self.probe,
                Some(ev.boot),
                self.opts.stated.spec,
            ),
            cache: super::conditions::cache_condition_with_usage(
                cache_condition(
                    ev.before,
                    ev.after,
                    CacheExpectation {
                        temperature: suite.load.cache,
                        reset: ev.reset,
                        hits_allowed: ev.hits_allowed,
                    },
                ),
                requests,
            ),
            kv,
            lengths: length_condition(
                requests,
                suite.workload.output_tokens,
                suite.output_fixed(),
                suite
                    .workload
                    .input_tokens
                    .filter(|_| suite.workload.kind != WorkloadKind::Prompts)
                    .map(u64::from),
            ),
            token_sources,
            chunk_splits,
            token_check,
        };
        let mut conditions = conditions;
        conditions.lengths.prompt_check =
            super::conditions::check_prompt_lengths(requests, self.facts.prompt_overhead.as_ref());
        conditions
    }

    /// The run's verdict, with notes on its opening wave, on transport failures reached while
    /// the engine still answered, and on output text not judged (synthetic weights).
    fn validity(
        &self,
        requests: &[RequestRecord],
        conditions: &Conditions,
        stop: &ExecStop,
        wave_note: Option<String>,
        healthy_after_failures: usize,
        judge_repetition: bool,
    ) -> Validity {
        let mut validity = assess(requests, conditions, stop);
        validity.notes.extend(wave_note);
        if healthy_after_failures > 0 {
            validity.notes.push(format!(
                "{} consecutive transport failures {} reached while GET /health still answered: the engine was not declared unreachable",
                self.exec_cfg.connect_failure_limit,
                if healthy_after_failures == 1 { "once".to_string() } else { format!("{healthy_after_failures} times") }
            ));
        }
        if !judge_repetition {
            validity.notes.push(
                "output text not judged for repetition or <think> tags: the model has synthetic (random) weights".into(),
            );
        }
        validity
    }
}

/// What one sweep point's load returned, with the `/metrics` scrapes around it.
struct PointRun {
    outcome: ExecOutcome,
    polls: PollStats,
    before: Option<Exposition>,
    after: Option<Exposition>,
    /// The engine's high-water marks were reset before the run (rigbench serve).
    peaks_reset: bool,
}

/// What a sweep point's conditions are judged from, besides its requests.
struct PointEvidence<'a> {
    before: Option<&'a Exposition>,
    after: Option<&'a Exposition>,
    boot: &'a BootLog,
    /// What the prefix-cache reset before the run answered.
    reset: Option<bool>,
    /// Prefix-cache hits the workload itself explains ([`hits_allowed`]).
    hits_allowed: u64,
    /// Whether output text is judged (not for synthetic weights).
    judge_repetition: bool,
}

/// Hits the workload itself explains: the shared prefix within the run, and for chat the
/// template tokens around the user message (prompt tokens reported − tokens counted in the
/// message), which may precede the salt.
fn hits_allowed(suite: &Suite, requests: &[RequestRecord]) -> u64 {
    let shared = match (suite.workload.kind, suite.workload.shared_prefix_tokens) {
        (WorkloadKind::SharedPrefix, Some(p)) => {
            u64::from(p) * (requests.len().saturating_sub(1) as u64)
        }
        _ => 0,
    };
    let template: u64 = if suite.workload.api == Api::Chat {
        requests
            .iter()
            .filter_map(|r| Some(r.prompt_tokens?.saturating_sub(r.input_tokens_counted?)))
            .sum()
    } else {
        0
    };
    shared + template
}

/// Run a whole session. `on_update` is called after each sweep point with the results so far
/// (for incremental report writing). Ctrl-C (when enabled) or an engine failure ends the
/// session early with what was measured kept.
///
/// # Errors
/// The engine cannot be started or reached, or the workload cannot be prepared (bad lengths,
/// tokenizer failure). Failures during runs are recorded in the results instead.
pub async fn run_session(
    opts: &E2eOptions,
    stop: StopSignal,
    on_update: &mut (dyn FnMut(&E2eResults) + Send),
) -> anyhow::Result<E2eResults> {
    opts.suite
        .validate()
        .map_err(|m| anyhow::anyhow!("suite '{}': {m}", opts.suite.name))?;
    let mut results = E2eResults {
        suite: Some(opts.suite.clone()),
        engine: EngineSummary {
            kind: opts.engine.kind().to_string(),
            command: match &opts.engine {
                EngineChoice::Builtin { args, .. } => {
                    Some(format!("rigbench serve {}", args.join(" ")))
                }
                EngineChoice::Command { command, .. } => Some(command.clone()),
                EngineChoice::Url { .. } => None,
            },
            ..Default::default()
        },
        ..Default::default()
    };
    if opts.handle_ctrl_c {
        // SIGINT and SIGTERM (src/signals.rs): stop, stop the engine's process group, keep
        // what was measured; a second signal exits at once.
        crate::signals::install()?;
        let s = stop.clone();
        tokio::spawn(async move {
            crate::signals::wait().await;
            s.trigger(StopCause::Interrupted);
        });
    }
    let extra_log = match &opts.engine_log {
        Some(p) => Some(
            std::fs::read(p)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .map_err(|e| {
                    crate::RigError::file(p, format!("cannot read engine log (--engine-log): {e}"))
                })?,
        ),
        None => None,
    };
    results.engine.env = match &opts.engine {
        EngineChoice::Builtin { .. } => super::checks::kernel_env(None),
        EngineChoice::Command { command, .. } => super::checks::kernel_env(Some(command)),
        EngineChoice::Url { .. } => Default::default(),
    };
    let mut engine = EngineHandle::start(&opts.engine, opts.startup_timeout, &stop).await?;
    results.engine.url = Some(engine.url.clone());
    let boot = boot_of(&engine, &extra_log);
    let client = EngineClient::with_idle_timeout(&engine.url, opts.pool_idle_timeout)?;
    let probe = probe_engine(&client, opts, &engine, &extra_log).await;
    let mut facts = engine_facts(&client, opts, &boot, &probe).await?;
    let counter = choose_counter(&client, opts, &facts, &mut results.notes).await?;
    // The tokens the engine adds around a prompt (chat template, BOS), measured once with the
    // suite's own settings, so prompt lengths can be checked against usage.prompt_tokens.
    facts.prompt_overhead = prompt_overhead(&client, opts, &facts, &counter).await;
    results.engine.facts = facts.clone();
    let session = Session {
        opts,
        client,
        facts,
        probe,
        counter,
        reset_told: std::sync::atomic::AtomicBool::new(false),
        stop: stop.clone(),
        exec_cfg: ExecConfig {
            request_timeout: opts.request_timeout,
            duration: opts.suite.load.duration_s.map(Duration::from_secs_f64),
            connect_failure_limit: 3,
        },
    };
    on_update(&results);
    if opts.check_determinism {
        check_determinism(&session, &stop, &mut results).await;
        on_update(&results);
    }
    if opts.quality {
        if let Some(url) = results.engine.url.clone() {
            let q = super::quality::run(&url, &session.model(), opts.request_timeout).await;
            if opts.progress {
                eprint!("{}", super::quality::render_markdown(&q));
            }
            results.quality = Some(q);
            on_update(&results);
        }
    }
    run_sweep(
        &session,
        &engine,
        &extra_log,
        &stop,
        &mut results,
        on_update,
    )
    .await;
    record_stop(&stop, &engine, &mut results).await;
    engine.stop().await;
    results.engine.exit = engine.exit_status();
    let boot = boot_of(&engine, &extra_log);
    results.engine_log = Some(engine.log_text()).filter(|t| !t.trim().is_empty());
    results.boot_log = (!boot.is_empty()).then_some(boot);
    on_update(&results);
    Ok(results)
}

/// What the engine's endpoints say about it, completed from its logs (llama.cpp's unified KV
/// cache) and from the command that started it (speculative decoding).
async fn probe_engine(
    client: &EngineClient,
    opts: &E2eOptions,
    engine: &EngineHandle,
    extra_log: &Option<String>,
) -> EngineProbe {
    let mut probe = super::engines::probe(client).await;
    // llama.cpp: one cache shared by the slots, or one per slot (its log says which).
    // Each log alone, so the line number is that file's own.
    if !probe.slot_ctx.is_empty() {
        let unified = super::adapters::llamacpp_kv_unified(&engine.log_text()).or_else(|| {
            extra_log
                .as_deref()
                .and_then(super::adapters::llamacpp_kv_unified)
        });
        if let Some((unified, line)) = unified {
            super::engines::apply_kv_unified(&mut probe, unified, line);
        }
    }
    // The command that started the engine says whether (and how) it speculates, where the
    // engine's endpoints do not.
    if let EngineChoice::Command { command, .. } = &opts.engine {
        if let Some(c) = super::adapters::spec_from_command(command) {
            if probe.spec_on.is_none() && (c.off || c.method.is_some()) {
                let src = c
                    .method
                    .as_ref()
                    .map(|m| m.source.clone())
                    .unwrap_or_else(|| "engine command (--spec-type none)".into());
                probe.spec_on = Some(Sourced::new(!c.off, src));
            }
            if probe.spec_method.is_none() {
                probe.spec_method = c.method;
            }
        }
    }
    probe
}

/// The session's token counter: `--tokenizer` when given (the engine's POST /tokenize compared
/// with it on a probe text), else the engine's, else none; `notes` say which and why.
async fn choose_counter(
    client: &EngineClient,
    opts: &E2eOptions,
    facts: &EngineFacts,
    notes: &mut Vec<String>,
) -> anyhow::Result<TokenCounter> {
    let engine_counter = facts.tokenize.then(|| TokenCounter::Engine {
        client: client.clone(),
        model: facts
            .model
            .as_ref()
            .map(|m| m.value.clone())
            .unwrap_or_default(),
        form: facts.tokenize_form.unwrap_or_default(),
    });
    // A tokenizer the user gives is the one used: it was asked for. The engine's own count of
    // a probe text is compared with it, so a mismatch is visible.
    let counter = if let Some(t) = &opts.tokenizer {
        let local = TokenCounter::local(t)?;
        notes.push(match &engine_counter {
            Some(e) => {
                const CHECK: &str = "The quick brown fox jumps over the lazy dog, 1234567890 times.";
                match (local.count(CHECK).await, e.count(CHECK).await) {
                    (Ok(Some(a)), Ok(Some(b))) if a == b => format!(
                        "token counts from --tokenizer (as asked); the engine's POST /tokenize agrees on a probe text ({a} tokens)"
                    ),
                    (Ok(Some(a)), Ok(Some(b))) => format!(
                        "token counts from --tokenizer (as asked); the engine's POST /tokenize DISAGREES on a probe text ({a} vs {b} tokens): --tokenizer may not be the served model's tokenizer"
                    ),
                    _ => "token counts from --tokenizer (as asked); the engine's POST /tokenize could not be compared".into(),
                }
            }
            None => format!(
                "token counts from --tokenizer; the engine's POST /tokenize is not used ({})",
                facts.tokenize_note.as_deref().unwrap_or("not available")
            ),
        });
        local
    } else if let Some(e) = engine_counter {
        e
    } else {
        notes.push(format!(
            "no usable POST /tokenize ({}) and no --tokenizer: prompt lengths are approximate; give --tokenizer PATH (the model's tokenizer.json) for exact lengths",
            facts.tokenize_note.as_deref().unwrap_or("not available")
        ));
        TokenCounter::None
    };
    if facts.tokenize && opts.tokenizer.is_none() {
        if let Some(form) = facts.tokenize_form {
            if form != facts.kind.tokenize_form() {
                notes.push(format!(
                    "the engine's POST /tokenize answers {} (not the form its kind takes)",
                    form.label()
                ));
            }
        }
    }
    Ok(counter)
}

/// `--check-determinism`, before the sweep: its result, or why it could not run, into the
/// results.
async fn check_determinism(session: &Session<'_>, stop: &StopSignal, results: &mut E2eResults) {
    let opts = session.opts;
    let conc = opts
        .suite
        .load
        .concurrency
        .iter()
        .copied()
        .max()
        .unwrap_or(1);
    let n = (opts.suite.load.requests as usize).clamp(2, 8);
    match super::checks::determinism_check(
        &session.client,
        &opts.suite,
        &session.counter,
        &session.model(),
        session.facts.max_model_len,
        n,
        conc.min(n as u32),
        &session.exec_cfg,
        stop,
    )
    .await
    {
        Ok(d) => {
            if opts.progress {
                eprintln!("{}", d.summary());
            }
            results.determinism = Some(d);
        }
        Err(e) => results
            .notes
            .push(format!("the determinism check could not run: {e:#}")),
    }
}

/// The sweep points in turn, each run's line on stderr; once the session is stopped or a point
/// fails, the points left are recorded as not run. `on_update` after each point.
async fn run_sweep(
    session: &Session<'_>,
    engine: &EngineHandle,
    extra_log: &Option<String>,
    stop: &StopSignal,
    results: &mut E2eResults,
    on_update: &mut (dyn FnMut(&E2eResults) + Send),
) {
    let opts = session.opts;
    let points = sweep(&opts.suite);
    for (i, point) in points.iter().enumerate() {
        if let Some(cause) = stop.cause() {
            for p in &points[i..] {
                results
                    .skipped
                    .push(format!("{}: not run ({})", p.label(), cause_text(&cause)));
            }
            break;
        }
        let boot = boot_of(engine, extra_log);
        // Plain lines on stderr, with or without a terminal (the bar needs one).
        eprintln!(
            "rigbench e2e: sweep point {}/{}: {} ({} requests)",
            i + 1,
            points.len(),
            point.label(),
            opts.suite.load.requests
        );
        match session.run_point(point, &boot).await {
            Ok(r) => {
                eprintln!("{}", one_line(&r));
                results.runs.push(r);
            }
            Err(e) => {
                // Was it the engine dying? Give its watcher a moment to say so (the message,
                // with the engine's exit and last log lines, is added below).
                let _ = engine.wait_exit(Duration::from_secs(2)).await;
                results.failure = Some(format!("{}: {e:#}", point.label()));
                for p in &points[i + 1..] {
                    results.skipped.push(format!(
                        "{}: not run (the previous point failed)",
                        p.label()
                    ));
                }
                on_update(results);
                break;
            }
        }
        on_update(results);
    }
}

/// Why the session stopped, into the results: interrupted, or the engine's failure added to
/// the failure (with the engine's exit and last log lines when its process ended).
async fn record_stop(stop: &StopSignal, engine: &EngineHandle, results: &mut E2eResults) {
    match stop.cause() {
        Some(StopCause::Interrupted) => results.interrupted = true,
        Some(StopCause::EngineFailed(m)) => match &mut results.failure {
            // The requests may notice a dead engine (transport failures) before its watcher
            // does; the first cause wins the stop, so add the exit here when it comes.
            _ if !m.contains("the engine process") => {
                let m = match engine.wait_exit(Duration::from_secs(2)).await {
                    Some(desc) => format!(
                        "{m}; the engine process {desc} (last log lines: {})",
                        engine.log_tail(10)
                    ),
                    None => m,
                };
                match &mut results.failure {
                    Some(f) if !f.contains(&m) => f.push_str(&format!(" (engine: {m})")),
                    Some(_) => {}
                    None => results.failure = Some(m),
                }
            }
            // A point that failed because the engine died: say so, with the engine's words.
            Some(f) if !f.contains(&m) => f.push_str(&format!(" (engine: {m})")),
            Some(_) => {}
            None => results.failure = Some(m),
        },
        None => {}
    }
}

/// The engine's log: the captured one, or the `--engine-log` file when nothing was captured
/// (or only the file states a KV capacity). Each is parsed alone, so line numbers are the
/// file's own.
fn boot_of(engine: &EngineHandle, extra: &Option<String>) -> BootLog {
    let captured = BootLog::parse(&engine.log_text());
    match extra {
        Some(x) => {
            let file = BootLog::parse(x);
            if captured.is_empty()
                || (captured.kv_capacity().is_none() && file.kv_capacity().is_some())
            {
                file
            } else {
                captured
            }
        }
        None => captured,
    }
}

fn cause_text(c: &StopCause) -> String {
    match c {
        StopCause::Interrupted => "interrupted".into(),
        StopCause::EngineFailed(m) => format!("engine failed: {m}"),
    }
}

fn one_line(r: &RunResult) -> String {
    let verdict = if r.validity.valid {
        "valid".to_string()
    } else {
        format!(
            "INVALID: {}",
            r.validity
                .reasons
                .iter()
                .chain(r.validity.missing_conditions.iter().map(|m| m as &String))
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        )
    };
    let ms = |p: &Option<super::metrics::Percentiles>| {
        p.as_ref()
            .map(|p| format!("{:.1} ms", p.p50 * 1e3))
            .unwrap_or_else(|| "n/a".into())
    };
    match r.presented_throughput() {
        Some(t) => format!(
            "{:>14}: {:.1} output tok/s, {:.2} req/s, TTFT p50 {}, TPOT p50 {} ({verdict})",
            r.label,
            t.output_tok_per_s,
            t.requests_per_s,
            ms(&r.latency.ttft),
            ms(&r.latency.tpot)
        ),
        None => format!("{:>14}: {verdict}", r.label),
    }
}

/// Synchronous wrapper: builds its own tokio runtime and runs a session (Ctrl-C handled when
/// `opts.handle_ctrl_c`).
///
/// # Errors
/// As [`run_session`], or the runtime cannot be built.
pub fn run_blocking(
    opts: &E2eOptions,
    on_update: &mut (dyn FnMut(&E2eResults) + Send),
) -> anyhow::Result<E2eResults> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(run_session(opts, StopSignal::new(), on_update))
}
