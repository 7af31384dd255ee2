//! The e2e session: start or reach the engine, read its facts, then for each sweep point:
//! warm up, prepare unique prompts, set the cache temperature, scrape `/metrics`, run the load
//! while sampling gauges, scrape again, and turn what came back into a [`RunResult`] with its
//! conditions and validity.
//!
//! Files, by concern: this one the options, a sweep point's result and the blocking entry;
//! `session` the session (engine probe, counters, determinism, the sweep, how it stopped);
//! `point` one sweep point (warm-up, cache temperature, the load, its scrapes, its conditions
//! and validity); `records` raw records into request records; `facts` what the engine says of
//! itself (`/version`, `/metrics`, `/v1/models`, the log) and the prompt overhead.

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

mod facts;
mod point;
mod records;
mod search;
mod served;
mod session;

use facts::*;
pub use point::reset_message;
use point::*;
use records::*;
pub use session::run_session;

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
    /// Replay this trace instead of the suite's workload (`--trace`; docs/traces.md).
    pub trace: Option<super::trace_replay::TraceSpec>,
    /// Latency targets judged per sweep point (`--slo`; docs/goodput.md).
    pub slo: Option<super::goodput::Slo>,
    /// Search for the highest load meeting the SLO instead of the sweep (`--goodput-search`).
    pub goodput_search: Option<super::goodput::SearchSpec>,
    /// Where power readings come from (docs/energy.md).
    pub power: super::energy::PowerChoice,
    /// GPUs the engine uses (throughput per GPU in the goodput search's Pareto plot); 1 when
    /// unknown.
    pub gpus: u32,
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
            trace: None,
            slo: None,
            goodput_search: None,
            power: Default::default(),
            gpus: 1,
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
    /// SLO attainment, when an SLO was set (docs/goodput.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput: Option<super::goodput::Goodput>,
    /// Energy over the measured window (docs/energy.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy: Option<super::energy::Energy>,
    /// Why there is no energy figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_unknown: Option<String>,
    /// The replayed trace (docs/traces.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<super::trace_replay::TraceSummary>,
    /// TPOT and ITL of the same requests under vLLM's and guidellm's definitions
    /// (see [`super::definitions`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_tools: Vec<super::definitions::ToolMetrics>,
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

pub(super) fn sweep(suite: &Suite) -> Vec<LoadPoint> {
    let l = &suite.load;
    if l.arrival == super::workload::ArrivalKind::Trace {
        return vec![LoadPoint::Open {
            rate: l.rates.first().copied().unwrap_or(1.0),
            arrival: l.arrival,
            burstiness: 1.0,
            max_concurrency: None,
            seed: 0,
        }];
    }
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
