//! End-to-end engine runs: OpenAI streaming client, executors, workloads, Prometheus scrape,
//! engine boot-log parsing, engine launcher, conditions, validity guard and report.
//!
//! A session ([`driver::run_session`]) starts or reaches an engine (the built-in `rigbench
//! serve` by default, any command with `--engine-cmd`, or a running server with `--url`), reads
//! its facts (`/version`, `/v1/models`, `/tokenize`, `/metrics`, its log), then runs each sweep
//! point of a suite (`suites/e2e/*.toml`) and records, with every figure, the conditions it was
//! measured under. A run whose output is broken or whose conditions are unknown is marked invalid
//! and its throughput is not presented.
//!
//! Module map: [`adapters`] (what differs per engine: tokenize body, KV source, cache counters,
//! speculative method; docs/engines/), [`client`] (HTTP + SSE), [`executor`] (closed/open
//! loop), [`workload`] (suites, token-exact prompts), [`prompts`] (prompt sets), [`metrics`]
//! (serving metrics: TTFT, TTFC, ITL, TPOT, E2E), [`crate::diagnose::prometheus`] (`/metrics`
//! parser), [`bootlog`] (engine logs), [`conditions`], [`validity`], [`launcher`], [`driver`],
//! [`quality`] (perplexity and exact-recall probes), [`render`] (the e2e section of a report).

pub mod adapters;
pub mod bootlog;
pub mod checks;
pub mod client;
pub mod conditions;
pub mod definitions;
pub mod driver;
pub mod energy;
pub mod engines;
pub mod executor;
pub mod goodput;
pub mod launcher;
pub mod metrics;
pub mod ownership;
pub mod parallel;
pub mod prompts;
pub mod quality;
pub mod render;
pub mod render_serving;
pub mod runtime_facts;
pub mod sse;
pub mod stream;
pub mod trace;
pub mod trace_replay;
pub mod validity;
pub mod workload;

use serde::{Deserialize, Serialize};

pub use driver::{run_session, E2eOptions, RunResult};

/// The engine a session drove.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineSummary {
    /// `builtin`, `command` or `url`.
    pub kind: String,
    /// The command started, if any.
    pub command: Option<String>,
    /// Its base URL.
    pub url: Option<String>,
    /// What it said about itself.
    pub facts: conditions::EngineFacts,
    /// How it exited, when rigbench stopped it (or it died).
    pub exit: Option<String>,
    /// Environment variables that change kernels, as the engine got them, when rigbench
    /// started it (see [`checks::kernel_env`]).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub env: std::collections::BTreeMap<String, String>,
}

/// End-to-end results (filled in by `rigbench e2e` and `rigbench report`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct E2eResults {
    /// The engine.
    pub engine: EngineSummary,
    /// The suite as run (after command-line overrides).
    pub suite: Option<workload::Suite>,
    /// One result per sweep point run.
    pub runs: Vec<RunResult>,
    /// Findings from the engine's log (captured, plus `--engine-log`).
    pub boot_log: Option<bootlog::BootLog>,
    /// Sweep points not run, with the reason.
    pub skipped: Vec<String>,
    /// What ended the session early, if anything (engine failure, a point that could not run).
    pub failure: Option<String>,
    /// Ctrl-C stopped the session (what was measured is kept).
    pub interrupted: bool,
    /// Session-level notes.
    pub notes: Vec<String>,
    /// The determinism check (`e2e --check-determinism`), made before the sweep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub determinism: Option<checks::DeterminismCheck>,
    /// The quality probes (`e2e --quality`): perplexity of the fixed text and exact recall,
    /// made before the sweep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<quality::QualityProbes>,
    /// The captured engine log (written as `engine.log`, not into results.json); with `--url`
    /// and `--engine-log`, the part of that file written during the session.
    #[serde(skip)]
    pub engine_log: Option<String>,
    /// How the `--engine-log` file was read (its path, the byte range written during the
    /// session, where its boot ended); `None` when none was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_log_file: Option<String>,
    /// Set when these runs are a harness self-test rather than rig figures (the built-in
    /// runtime on the CPU backend of a GPU rig): the label and why. Such runs are kept out of
    /// rig baselines and comparisons.
    #[serde(default)]
    pub self_test: Option<String>,
    /// The engine's parallel layout and the rig's GPUs and topology (multi-GPU engines or rigs).
    #[serde(default)]
    pub multi_gpu: Option<parallel::EngineMultiGpu>,
    /// The formulas of TTFT, TPOT and ITL: rigbench's, vLLM's and guidellm's
    /// ([`definitions`]).
    #[serde(default)]
    pub definitions: definitions::Definitions,
    /// The goodput search (`--goodput-search`; its probes are in `runs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput_search: Option<goodput::SearchResult>,
}

impl E2eResults {
    /// Whether at least one run is valid.
    pub fn any_valid(&self) -> bool {
        self.runs.iter().any(|r| r.validity.valid)
    }
}

/// Render end-to-end results as Markdown (the report's e2e section: conditions first, then
/// latency and throughput tables, with links to the plots written by [`write_plots`]).
pub fn render_markdown(results: &E2eResults) -> String {
    let mut md = render::render_markdown(results);
    if let Some(m) = &results.multi_gpu {
        md.push_str(&parallel::render(m));
    }
    md
}

/// Write the e2e plots (SVG) into `dir`; returns the file names written (relative to `dir`).
///
/// # Errors
/// Drawing or writing a plot failed.
pub fn write_plots(results: &E2eResults, dir: &std::path::Path) -> anyhow::Result<Vec<String>> {
    render::write_plots(results, dir)
}

/// Run an e2e session synchronously for `rigbench report` (builds its own tokio runtime).
/// Use [`E2eOptions::default_for_report`] for the short default against the built-in engine.
///
/// # Errors
/// The engine cannot be started or the workload prepared; failures during runs are recorded in
/// the results instead.
pub fn run_for_report(opts: &E2eOptions) -> anyhow::Result<E2eResults> {
    driver::run_blocking(opts, &mut |_| {})
}
