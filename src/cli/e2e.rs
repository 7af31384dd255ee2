//! `rigbench e2e`: see the module docs of `crate::e2e` for what it does.
//!
//! Writes a report folder (`reports/<rig>/<UTC time>/` or `--out`): `results.json` (the
//! versioned schema, with `e2e` filled in; rewritten after every sweep point), `report.md`,
//! `e2e_runs.csv`, `e2e_requests.csv`, SVG plots and `engine.log` (when rigbench started the
//! engine). Exit status: 0 when at least one run is valid; 1 on an error, an interruption, an
//! engine failure, or when no run is valid.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::e2e::client::Api;
use crate::e2e::launcher::EngineChoice;
use crate::e2e::workload::{ArrivalKind, CacheTemp, LoadMode, Suite};
use crate::e2e::E2eOptions;
use crate::report::folder::ReportDir;
use crate::report::Results;
use crate::{ExitStatus, RigError};

/// The built-in engine's flag for the quantization to apply at load.
pub const SERVE_QUANTIZE_FLAG: &str = "--quantize";
/// The built-in engine's flag for the speculative method (the same spelling as `e2e`'s).
pub const SERVE_SPEC_METHOD_FLAG: &str = "--spec-method";
/// The built-in engine's flag for the number of draft tokens (the same spelling as `e2e`'s).
pub const SERVE_SPEC_K_FLAG: &str = "--spec-k";

/// Which engine to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineKind {
    /// Start `rigbench serve` (the built-in runtime) on a free loopback port.
    Builtin,
    /// Start the command given with `--engine-cmd`.
    Cmd,
    /// Use the engine already running at `--url`.
    Url,
}

/// `enable_thinking` to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Thinking {
    /// `enable_thinking: true`.
    On,
    /// `enable_thinking: false`.
    Off,
    /// Send nothing (the engine's default applies).
    Unset,
}

/// Arguments of `rigbench e2e`.
#[derive(Debug, clap::Args)]
#[command(after_help = crate::cli::help::after_help(crate::cli::help::Cmd::E2e))]
pub struct E2eArgs {
    /// The flags (boxed: they are many, and the subcommand enum stays small).
    #[command(flatten)]
    pub flags: Box<E2eFlags>,
}

impl std::ops::Deref for E2eArgs {
    type Target = E2eFlags;
    fn deref(&self) -> &E2eFlags {
        &self.flags
    }
}

/// The flags of `rigbench e2e`: the engine and the load (shared with `report`), the built-in
/// engine's own flags, the suite, and where the report goes.
#[derive(Debug, clap::Args)]
pub struct E2eFlags {
    /// The engine, and what rigbench is told about it.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The workload and the load (override the suite's).
    #[command(flatten)]
    pub load: LoadArgs,
    /// Trace replay, SLO goodput and energy. Its own group, not inside `LoadArgs`: clap gives a
    /// struct with a flattened field no group of its own, and `report --render` refuses the
    /// `LoadArgs` group's flags by that group.
    #[command(flatten)]
    pub serving: crate::cli::serving::ServingArgs,
    /// Built-in engine: the model to serve (`synthetic:tiny`, a preset, a checkpoint folder, or
    /// a GGUF file; `rigbench serve --help` lists what each may hold).
    #[arg(long, default_value = "synthetic:tiny")]
    pub model: String,
    /// Built-in engine: quantize the weights at load (passed to `rigbench serve`).
    #[arg(long)]
    pub quantize: Option<String>,
    /// Extra argument for `rigbench serve` (repeatable), e.g. --serve-arg=--kv-cache-memory=1GiB.
    #[arg(long = "serve-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub serve_args: Vec<String>,
    /// Suite: a built-in name or a TOML file (`report` spells it --e2e-suite, beside its kernel
    /// --suite; both spellings work here).
    #[arg(long, visible_alias = "e2e-suite", default_value = "tiny")]
    pub suite: String,
    /// The old spelling of --warmup-requests.
    #[arg(
        long = "warmup",
        value_name = "N",
        hide = true,
        conflicts_with = "warmup_requests"
    )]
    pub warmup_old: Option<u32>,
    /// Report folder (default: reports/<rig>/<UTC time>/).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Do not redact host names, paths, IPs and tokens in the report.
    #[arg(long)]
    pub no_redact: bool,
    /// Replace a report already in --out (only once this run has measured something; without
    /// --force such a folder is refused).
    #[arg(long)]
    pub force: bool,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Before the sweep, send the same seeded prompts twice at temperature 0 and compare the
    /// outputs' hashes; nondeterminism is reported ahead of every speed or quality figure.
    #[arg(long)]
    pub check_determinism: bool,
    /// Before the sweep, probe quality: the perplexity of a fixed public-domain text through
    /// `echo` + `logprobs` (vLLM, `rigbench serve`; vLLM's `prompt_logprobs` too), and an
    /// exact-recall pass rate (a pass code hidden in filler text at several depths and
    /// lengths), reported beside speed.
    #[arg(long)]
    pub quality: bool,
}

/// The engine of end-to-end runs, how to reach it, and the facts rigbench is told about it:
/// shared by `rigbench e2e` and `rigbench report` (`#[command(flatten)]` in both), so that the two
/// spell every such flag the same way. A flag added here reaches both commands; read it in
/// [`e2e_options`].
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EngineArgs {
    /// Engine: builtin (default), cmd (with --engine-cmd) or url (with --url). Implied by
    /// --engine-cmd / --url when not given.
    #[arg(long, value_enum)]
    pub engine: Option<EngineKind>,
    /// Start this engine command (run through `sh -c`), capture its log, wait for /health.
    /// Needs --url or --port to reach it.
    #[arg(long, value_name = "COMMAND")]
    pub engine_cmd: Option<String>,
    /// Base URL of the engine (`http://host:port`); alone, uses an engine already running.
    #[arg(long)]
    pub url: Option<String>,
    /// Port on 127.0.0.1 where --engine-cmd will listen (instead of --url).
    #[arg(long)]
    pub port: Option<u16>,
    /// API key for an engine started with `--api-key` (vLLM, SGLang, llama-server): sent as
    /// `Authorization: Bearer KEY` on every request. Read from OPENAI_API_KEY when not given.
    /// Never written to any output (the recorded command line shows `<token>`).
    #[arg(
        long,
        value_name = "KEY",
        env = "OPENAI_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
    /// Parse this engine log too (e.g. the vLLM log of a server started elsewhere).
    #[arg(long, value_name = "FILE")]
    pub engine_log: Option<PathBuf>,
    /// The `model` field sent with requests (default: the first id of /v1/models).
    #[arg(
        long = "served-model-name",
        alias = "served-model",
        value_name = "NAME"
    )]
    pub served_model: Option<String>,
    /// A tokenizer.json (or a folder with one) for engines without POST /tokenize.
    #[arg(long, value_name = "PATH")]
    pub tokenizer: Option<PathBuf>,
    /// Seconds to wait for the engine to answer /health [default: 120 for the built-in engine,
    /// 1800 for --engine-cmd and --url].
    #[arg(long, value_name = "SECONDS")]
    pub startup_timeout: Option<f64>,
    /// Per-request timeout, seconds [default: 600 in `e2e`, 120 in `report`].
    #[arg(long, value_name = "SECONDS")]
    pub request_timeout: Option<f64>,
    /// The engine's version, for engines that do not expose it (marked "stated by the user").
    #[arg(long, value_name = "VERSION")]
    pub engine_version: Option<String>,
    /// The engine's KV capacity in tokens, for engines that do not expose it (marked "stated by
    /// the user").
    #[arg(long, value_name = "TOKENS")]
    pub kv_capacity: Option<u64>,
    /// Whether speculative decoding is on, for engines that do not expose it (marked "stated by
    /// the user"); `--spec-method none` says off too.
    #[arg(long, value_enum, value_name = "on|off")]
    pub spec: Option<SpecStated>,
    /// Speculative method: passed to the built-in engine; for other engines a statement used
    /// when their log does not say (marked "stated, not verified").
    #[arg(long)]
    pub spec_method: Option<String>,
    /// Draft tokens per step (k): passed to the built-in engine; stated for others.
    #[arg(long)]
    pub spec_k: Option<u32>,
}

/// The workload and the load of end-to-end runs, each overriding the suite's value: shared by
/// `rigbench e2e` and `rigbench report` (`#[command(flatten)]` in both).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LoadArgs {
    /// API: chat or completions (overrides the suite).
    #[arg(long, value_enum)]
    pub api: Option<Api>,
    /// Prompt length in tokens (overrides the suite).
    #[arg(long)]
    pub input_tokens: Option<u32>,
    /// Shared-prefix workloads: tokens shared by every prompt of a run (overrides the suite).
    #[arg(long)]
    pub shared_prefix_tokens: Option<u32>,
    /// Output length in tokens: max_tokens (overrides the suite).
    #[arg(long)]
    pub output_tokens: Option<u32>,
    /// Send ignore_eos so the output is exactly --output-tokens long (overrides the suite);
    /// --no-ignore-eos lets the model end early. (`--ignore-eos true|false` is still accepted.)
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL",
          hide_possible_values = true, overrides_with = "no_ignore_eos")]
    pub ignore_eos: Option<bool>,
    /// Do not send ignore_eos: the model may end before --output-tokens (overrides the suite).
    #[arg(long, overrides_with = "ignore_eos")]
    pub no_ignore_eos: bool,
    /// Closed-loop concurrency sweep, e.g. 1,4,16.
    #[arg(long, conflicts_with = "rate")]
    pub concurrency: Option<String>,
    /// Open-loop rate sweep in requests/s, e.g. 0.5,1,2.
    #[arg(long)]
    pub rate: Option<String>,
    /// Open-loop arrival process.
    #[arg(long, value_enum)]
    pub arrival: Option<ArrivalKind>,
    /// Gamma shape for --arrival gamma (1 = Poisson; below 1 is burstier).
    #[arg(long)]
    pub burstiness: Option<f64>,
    /// Open loop: most requests in flight; later arrivals wait and are recorded as late.
    #[arg(long)]
    pub max_concurrency: Option<u32>,
    /// Requests per sweep point (default: the suite's, 8 for `tiny`); `compare` names the count
    /// that would decide at its threshold when a point has too few.
    #[arg(long, alias = "e2e-requests", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=100000))]
    pub requests: Option<u32>,
    /// Stop sending new requests after this many seconds per sweep point.
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// Unmeasured warm-up requests before each sweep point (0 to 10,000).
    #[arg(long = "warmup-requests", value_name = "N",
          value_parser = clap::value_parser!(u32).range(0..=10000))]
    pub warmup_requests: Option<u32>,
    /// Prefix-cache temperature: cold (unique salted prompts, cache reset, hits verified 0) or
    /// warm (replay, hit rate measured).
    #[arg(long, value_enum)]
    pub cache: Option<CacheTemp>,
    /// Thinking: on, off or unset (chat API).
    #[arg(long, value_enum)]
    pub thinking: Option<Thinking>,
    /// Sampling temperature (0 = greedy).
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Sampling seed.
    #[arg(long)]
    pub seed: Option<u64>,
}

/// The built-in engine's own settings, which `e2e` takes from its flags and `report` fixes.
#[derive(Debug, Clone, Copy)]
pub struct BuiltinEngine<'a> {
    /// `--model` of `rigbench serve`.
    pub model: &'a str,
    /// `--quantize` of `rigbench serve`.
    pub quantize: Option<&'a str>,
    /// Further `rigbench serve` arguments.
    pub serve_args: &'a [String],
}

/// `--spec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SpecStated {
    /// Speculative decoding is on.
    On,
    /// Speculative decoding is off.
    Off,
}

fn positive(flag: &str, v: f64) -> Result<f64, RigError> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(RigError::flag(
            flag,
            format!("{v} must be a positive number"),
        ))
    }
}

/// A number of seconds: positive and at most a week ([`crate::e2e::workload::MAX_SECONDS`]).
fn seconds(flag: &str, v: f64) -> Result<f64, RigError> {
    let max = crate::e2e::workload::MAX_SECONDS;
    if v.is_finite() && v > 0.0 && v <= max {
        Ok(v)
    } else {
        Err(RigError::flag(
            flag,
            format!("{v} is outside the range rigbench takes: more than 0 and at most {max} seconds (a week)"),
        ))
    }
}

impl E2eFlags {
    /// Turn the flags into session options (suite loaded and overridden, engine chosen).
    ///
    /// # Errors
    /// [`RigError::BadFlag`] / [`RigError::BadFile`] for bad values, naming the flag or file.
    pub fn options(&self) -> Result<E2eOptions, RigError> {
        let mut load = self.load.clone();
        if load.warmup_requests.is_none() {
            load.warmup_requests = self.warmup_old;
        }
        let mut o = e2e_options(
            "--suite",
            &self.suite,
            (&load, &self.serving),
            &self.engine,
            BuiltinEngine {
                model: &self.model,
                quantize: self.quantize.as_deref(),
                serve_args: &self.serve_args,
            },
            600.0,
        )?;
        o.progress = !self.no_progress;
        o.check_determinism = self.check_determinism;
        o.quality = self.quality;
        Ok(o)
    }
}

/// Session options from the shared flags: the suite `suite` (named by `suite_flag` in errors)
/// loaded and overridden by `load`, the engine chosen and described by `args`, the built-in
/// engine configured by `builtin`; a request timeout of `request_timeout_s` seconds unless
/// `--request-timeout` says otherwise. Progress bars and the determinism check are the caller's.
///
/// # Errors
/// [`RigError::BadFlag`] for bad values, naming the flag (a suite that cannot be used is a bad
/// `suite_flag` value whose message names the file); [`RigError::BadFile`] for an unreadable
/// `--engine-log` or `--tokenizer`.
pub fn e2e_options(
    suite_flag: &str,
    suite: &str,
    (load, serving): (&LoadArgs, &crate::cli::serving::ServingArgs),
    args: &EngineArgs,
    builtin: BuiltinEngine<'_>,
    request_timeout_s: f64,
) -> Result<E2eOptions, RigError> {
    // The engine's API key: sent by every engine client of this process, replaced by `<token>`
    // wherever it would be written (docs/reliability.md).
    if let Some(k) = &args.api_key {
        if k.trim().is_empty() {
            return Err(RigError::flag(
                "--api-key",
                "the key is empty (check OPENAI_API_KEY); leave it out for an engine without one",
            ));
        }
        crate::output::redact::register_secret(k);
    }
    crate::e2e::client::set_api_key(args.api_key.clone());
    let mut suite = Suite::load(suite).map_err(|e| crate::cli::suite_error(suite_flag, e))?;
    apply_load_overrides(&mut suite, load)?;
    suite
        .validate()
        .map_err(|m| RigError::flag(format!("{suite_flag} and its overrides"), m))?;

    let kind = match (args.engine, &args.engine_cmd, &args.url) {
        (Some(k), _, _) => k,
        (None, Some(_), _) => EngineKind::Cmd,
        (None, None, Some(_)) => EngineKind::Url,
        (None, None, None) => EngineKind::Builtin,
    };
    let spec_none = args
        .spec_method
        .as_deref()
        .is_some_and(|m| matches!(m.to_ascii_lowercase().as_str(), "none" | "off"));
    let engine = choose_engine(args, &builtin, kind, spec_none)?;
    check_engine_args(args, &builtin, kind, &engine)?;
    // The built-in engine (`rigbench serve`, started with this environment) asks every request
    // for VLLM_API_KEY when it is set, as vLLM does: send it that key, unless one was given. It
    // used to answer 401 to everything and the run waited 120 s, blaming GET /health.
    if kind == EngineKind::Builtin && args.api_key.is_none() {
        if let Some(k) = std::env::var("VLLM_API_KEY")
            .ok()
            .filter(|k| !k.trim().is_empty())
        {
            crate::output::redact::register_secret(&k);
            crate::e2e::client::set_api_key(Some(k));
            eprintln!(
                "rigbench e2e: VLLM_API_KEY is set, so the built-in engine asks for it; rigbench's requests send it"
            );
        }
    }
    let mut o = E2eOptions::with_suite(suite);
    crate::cli::serving::apply(&mut o, serving)?;
    o.engine = engine;
    o.engine_log = args.engine_log.clone();
    o.served_model = args.served_model.clone();
    o.tokenizer = args.tokenizer.clone();
    o.spec_method = args.spec_method.clone().filter(|_| !spec_none);
    o.spec_k = args.spec_k;
    if let Some(0) = args.kv_capacity {
        return Err(RigError::flag("--kv-capacity", "must be at least 1 token"));
    }
    o.stated = crate::e2e::engines::Stated {
        engine_version: args.engine_version.clone(),
        kv_capacity: args.kv_capacity,
        spec: match (args.spec, spec_none) {
            (Some(SpecStated::On), true) => {
                return Err(RigError::flag(
                    "--spec",
                    "--spec on contradicts --spec-method none",
                ))
            }
            (Some(s), _) => Some(s == SpecStated::On),
            (None, true) => Some(false),
            // A stated method (for engines that do not expose one) says on.
            (None, false) if kind != EngineKind::Builtin => args.spec_method.as_ref().map(|_| true),
            (None, false) => None,
        },
    };
    o.request_timeout = Duration::from_secs_f64(seconds(
        "--request-timeout",
        args.request_timeout.unwrap_or(request_timeout_s),
    )?);
    o.startup_timeout = Duration::from_secs_f64(match args.startup_timeout {
        Some(t) => seconds("--startup-timeout", t)?,
        None if kind == EngineKind::Builtin => 120.0,
        None => 1800.0,
    });
    Ok(o)
}

/// The command line's workload, load and sampling overrides, applied to the suite.
fn apply_load_overrides(suite: &mut Suite, load: &LoadArgs) -> Result<(), RigError> {
    let w = &mut suite.workload;
    if let Some(a) = load.api {
        w.api = a;
    }
    if let Some(n) = load.input_tokens {
        w.input_tokens = Some(n);
    }
    if let Some(n) = load.shared_prefix_tokens {
        // Only a shared-prefix workload reads it: anywhere else it would be recorded in
        // results.json and change nothing.
        if w.kind != crate::e2e::workload::WorkloadKind::SharedPrefix {
            return Err(RigError::flag(
                "--shared-prefix-tokens",
                format!(
                    "suite `{}` has a `{}` workload, which has no shared prefix: use --suite shared-prefix (or a suite with workload.kind = \"shared_prefix\"), or leave the flag out",
                    suite.name,
                    match w.kind {
                        crate::e2e::workload::WorkloadKind::Fixed => "fixed",
                        _ => "prompts",
                    }
                ),
            ));
        }
        w.shared_prefix_tokens = Some(n);
    }
    if let Some(n) = load.output_tokens {
        w.output_tokens = n;
    }
    if load.no_ignore_eos {
        w.ignore_eos = false;
    } else if let Some(b) = load.ignore_eos {
        w.ignore_eos = b;
    }
    let l = &mut suite.load;
    if let Some(c) = &load.concurrency {
        l.mode = LoadMode::Closed;
        l.concurrency = crate::cli::parse_list("--concurrency", c)?;
    }
    if let Some(r) = &load.rate {
        l.mode = LoadMode::Open;
        l.rates = crate::cli::parse_list("--rate", r)?;
        let (lo, hi) = (
            crate::e2e::workload::MIN_RATE,
            crate::e2e::workload::MAX_RATE,
        );
        if let Some(bad) = l.rates.iter().find(|r| !(lo..=hi).contains(*r)) {
            return Err(RigError::flag(
                "--rate",
                format!("{bad} requests/s is outside the range rigbench takes: {lo} to {hi:e} (below {lo}, one request would take over {:.0} s to arrive)", 1.0 / lo),
            ));
        }
    }
    if let Some(a) = load.arrival {
        l.arrival = a;
    }
    if let Some(b) = load.burstiness {
        l.burstiness = positive("--burstiness", b)?;
    }
    if load.max_concurrency.is_some() {
        l.max_concurrency = load.max_concurrency;
    }
    if let Some(n) = load.requests {
        l.requests = n;
    }
    if let Some(d) = load.duration {
        l.duration_s = Some(seconds("--duration", d)?);
    }
    if let Some(n) = load.warmup_requests {
        l.warmup = n;
    }
    if let Some(c) = load.cache {
        l.cache = c;
    }
    let s = &mut suite.sampling;
    if let Some(t) = load.thinking {
        s.thinking = match t {
            Thinking::On => Some(true),
            Thinking::Off => Some(false),
            Thinking::Unset => None,
        };
    }
    if suite.workload.api == Api::Completions && load.thinking.is_none() {
        suite.sampling.thinking = None;
    }
    if let Some(t) = load.temperature {
        suite.sampling.temperature = t;
    }
    if let Some(seed) = load.seed {
        suite.sampling.seed = Some(seed);
    }
    Ok(())
}

/// The engine to run against: the built-in server's command line, a command and its URL, or a URL.
fn choose_engine(
    args: &EngineArgs,
    builtin: &BuiltinEngine<'_>,
    kind: EngineKind,
    spec_none: bool,
) -> Result<EngineChoice, RigError> {
    Ok(match kind {
        EngineKind::Builtin => {
            if args.engine_cmd.is_some() || args.url.is_some() {
                return Err(RigError::flag(
                    "--engine",
                    "builtin starts its own server; drop --engine-cmd / --url",
                ));
            }
            let mut serve = vec!["--model".to_string(), builtin.model.to_string()];
            if let Some(q) = builtin.quantize {
                serve.extend([SERVE_QUANTIZE_FLAG.to_string(), q.to_string()]);
            }
            if let Some(m) = args.spec_method.as_ref().filter(|_| !spec_none) {
                serve.extend([SERVE_SPEC_METHOD_FLAG.to_string(), m.clone()]);
            }
            if let Some(k) = args.spec_k {
                serve.extend([SERVE_SPEC_K_FLAG.to_string(), k.to_string()]);
            }
            serve.extend(builtin.serve_args.iter().cloned());
            // What `rigbench serve` would reject is a bad command line here too.
            crate::cli::serve::check_args(&serve)?;
            EngineChoice::Builtin {
                program: None,
                args: serve,
            }
        }
        EngineKind::Cmd => {
            let command = args
                .engine_cmd
                .clone()
                .ok_or_else(|| RigError::flag("--engine", "cmd needs --engine-cmd \"COMMAND\""))?;
            let url = match (&args.url, args.port) {
                (Some(u), _) => u.clone(),
                (None, Some(p)) => format!("http://127.0.0.1:{p}"),
                (None, None) => return Err(RigError::flag(
                    "--engine-cmd",
                    "say where the engine will listen with --url http://HOST:PORT or --port PORT",
                )),
            };
            EngineChoice::Command { command, url }
        }
        EngineKind::Url => {
            let url = args
                .url
                .clone()
                .ok_or_else(|| RigError::flag("--engine", "url needs --url http://HOST:PORT"))?;
            EngineChoice::Url { url }
        }
    })
}

/// Refuse a URL without http(s), built-in-only flags with another engine, and an unreadable engine log or tokenizer.
fn check_engine_args(
    args: &EngineArgs,
    builtin: &BuiltinEngine<'_>,
    kind: EngineKind,
    engine: &EngineChoice,
) -> Result<(), RigError> {
    if let EngineChoice::Command { url: u, .. } | EngineChoice::Url { url: u } = &engine {
        if !(u.starts_with("http://") || u.starts_with("https://")) {
            return Err(RigError::flag(
                "--url",
                format!("'{u}' must start with http://"),
            ));
        }
    }
    if kind != EngineKind::Builtin && (builtin.quantize.is_some() || !builtin.serve_args.is_empty())
    {
        return Err(RigError::flag(
            "--quantize/--serve-arg",
            "these configure the built-in engine only; configure other engines in their own command",
        ));
    }
    if let Some(p) = &args.engine_log {
        check_engine_log(p)?;
    }
    if let Some(t) = &args.tokenizer {
        // Loaded now, so a wrong path fails before any engine starts, whether or not the
        // engine turns out to count tokens itself.
        crate::e2e::workload::TokenCounter::local(t).map_err(|e| match e {
            RigError::BadFile { path, message } => RigError::file(
                path,
                format!(
                    "--tokenizer: {message} (give a tokenizer.json or a folder that holds one)"
                ),
            ),
            other => other,
        })?;
    }
    Ok(())
}

/// `--engine-log FILE` must be a readable regular file: "not found" only when it is missing.
///
/// # Errors
/// [`RigError::BadFile`] naming the file: missing, not a regular file (a folder, `/dev/null`, a
/// pipe), or unreadable.
pub fn check_engine_log(p: &std::path::Path) -> Result<(), RigError> {
    match std::fs::metadata(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(RigError::file(p, "engine log (--engine-log) not found"))
        }
        Err(e) => Err(RigError::file(
            p,
            format!("engine log (--engine-log) cannot be read: {e}"),
        )),
        Ok(m) if !m.is_file() => Err(RigError::file(
            p,
            format!(
                "engine log (--engine-log) is not a regular file ({}); give the file the engine's log was saved to",
                if m.is_dir() { "a folder" } else { "a device, pipe or socket" }
            ),
        )),
        Ok(_) => std::fs::File::open(p).map(|_| ()).map_err(|e| {
            RigError::file(p, format!("engine log (--engine-log) cannot be read: {e}"))
        }),
    }
}

/// An input file (`flag`'s value `input`) that sits in the report folder `out` under the name of
/// a file the report writes there (`engine.log`, `results.json`, ...) would be replaced, or
/// removed as stale, by the run that reads it; refused even with `--force`.
///
/// # Errors
/// [`RigError::BadFlag`] naming `flag`, the file and the fix.
pub fn check_input_outside_out(
    flag: &str,
    input: &std::path::Path,
    out: &std::path::Path,
) -> Result<(), RigError> {
    let (Ok(input_abs), Ok(out_abs)) = (input.canonicalize(), out.canonicalize()) else {
        return Ok(());
    };
    let named_like_output = input_abs
        .file_name()
        .is_some_and(|n| crate::report::folder::is_report_file(&n.to_string_lossy()));
    if named_like_output && input_abs.parent() == Some(out_abs.as_path()) {
        return Err(RigError::flag(
            flag,
            format!(
                "{} is inside --out {} under a name the report writes there, so the run would replace or remove its own input; copy it elsewhere, or choose another --out",
                input.display(),
                out.display()
            ),
        ));
    }
    Ok(())
}

/// Run `rigbench e2e`.
pub fn run(args: E2eArgs) -> anyhow::Result<ExitStatus> {
    let opts = args.options()?;
    // What the effective suite is, after the flags (the report's "Suite:" line says the same).
    eprintln!(
        "rigbench e2e: suite {}",
        crate::e2e::render::suite_as_run(&opts.suite)
    );
    let rig = crate::rig::probe();
    let label = rig.label();
    let existed = args.out.as_deref().is_some_and(|p| p.exists());
    if let (Some(log), Some(out)) = (&args.engine.engine_log, &args.out) {
        check_input_outside_out("--engine-log", log, out)?;
    }
    let dir = ReportDir::create(args.out.as_deref(), &label, !args.no_redact, args.force)?;
    let command_line = crate::cli::command_line();
    let results = Arc::new(std::sync::Mutex::new(Results::new(
        rig,
        label,
        command_line,
    )));
    let write_err: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let (res_cb, dir_cb, err_cb) = (results.clone(), dir.clone(), write_err.clone());
    let mut on_update = move |e: &crate::e2e::E2eResults| {
        if let Ok(mut r) = res_cb.lock() {
            r.e2e = Some(e.clone());
            if let Err(err) = dir_cb.write_results(&r) {
                if let Ok(mut w) = err_cb.lock() {
                    *w = Some(format!("{err:#}"));
                }
            }
        }
    };
    eprintln!("rigbench e2e: report folder {}", dir.target.display());
    crate::signals::install()?;
    crate::signals::test_hold();
    let mut e2e = match crate::e2e::driver::run_blocking(&opts, &mut on_update) {
        Ok(e) => e,
        Err(e) => {
            // An engine that failed to start: keep its whole log (that is when it matters),
            // without touching an earlier report in --out.
            // An engine's startup failure quotes its command and log: redacted like the report
            // (paths, hosts, IPs, tokens), unless --no-redact.
            let (e, kept_log) = match e.downcast_ref::<crate::e2e::launcher::EngineStartFailure>() {
                Some(f) => (
                    anyhow::Error::new(crate::e2e::launcher::EngineStartFailure {
                        message: dir.redactor().redact(&f.message),
                        log: f.log.clone(),
                    }),
                    Some(f.log.clone()).filter(|l| !l.trim().is_empty()),
                ),
                None => (e, None),
            };
            if let Some(log) = kept_log {
                match dir.keep_after_failed_start("engine.log", &log) {
                    Ok(p) => eprintln!("rigbench e2e: the engine's log is kept in {}", p.display()),
                    Err(w) => eprintln!("rigbench e2e: could not keep the engine's log: {w:#}"),
                }
                return Err(e);
            }
            dir.discard();
            // Nothing was measured: leave no empty report folder behind.
            if !existed && std::fs::read_dir(&dir.path).is_ok_and(|mut d| d.next().is_none()) {
                let _ = std::fs::remove_dir(&dir.path);
                if args.out.is_none() {
                    // The default location `reports/<rig-label>/<time>/`: its parents too, when
                    // this run left them empty (remove_dir refuses a folder that holds anything).
                    let mut up = dir.path.parent();
                    for _ in 0..2 {
                        match up {
                            Some(p) if std::fs::remove_dir(p).is_ok() => up = p.parent(),
                            _ => break,
                        }
                    }
                }
            }
            return Err(e);
        }
    };
    if let Ok(Some(w)) = write_err.lock().map(|w| w.clone()) {
        anyhow::bail!("cannot write results.json: {w}");
    }
    let mut results = results
        .lock()
        .map_err(|_| anyhow::anyhow!("results lock poisoned"))?
        .clone();
    let extra_log = opts
        .engine_log
        .as_ref()
        .and_then(|p| std::fs::read(p).ok())
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    crate::e2e::parallel::annotate(&mut e2e, &results.rig, extra_log.as_deref());
    results.e2e = Some(e2e.clone());
    results.complete = !e2e.interrupted;
    if e2e.runs.is_empty() {
        results.skipped.push(crate::report::Skip {
            what: "e2e".into(),
            reason: e2e
                .failure
                .clone()
                .unwrap_or_else(|| "no sweep point ran".into()),
        });
    }
    dir.write_results(&results)?;
    let plots = crate::e2e::write_plots(&e2e, &dir.path).context("cannot write the e2e plots")?;
    crate::e2e::render::write_csv(&e2e, &dir.path).context("cannot write the e2e CSV files")?;
    if let Some(log) = &e2e.engine_log {
        dir.write_text("engine.log", log)?;
    }
    let section = crate::e2e::render_markdown(&e2e);
    let md = format!(
        "# rigbench e2e report\n\nRig: {} · rigbench {} · {}\n\nCommand: {}\n\n{section}",
        crate::output::table::code(&results.rig_label),
        results.rigbench_version,
        results.created_utc,
        crate::output::table::code(&results.command_line)
    );
    dir.write_text("report.md", &md)?;
    dir.commit()?;
    println!("{}", dir.redactor().redact(&section));
    println!(
        "Report: {} (report.md, results.json, e2e_runs.csv, e2e_requests.csv{}{})",
        dir.target.display(),
        plots.iter().map(|p| format!(", {p}")).collect::<String>(),
        if e2e.engine_log.is_some() {
            ", engine.log"
        } else {
            ""
        }
    );
    if e2e.interrupted {
        eprintln!("rigbench e2e: interrupted; the report holds what was measured");
        return Ok(ExitStatus::Error);
    }
    if let Some(f) = &e2e.failure {
        eprintln!("rigbench e2e: {}", dir.redactor().redact(f));
        return Ok(ExitStatus::Error);
    }
    if !e2e.any_valid() {
        eprintln!("rigbench e2e: no valid run (see the Validity section of the report)");
        return Ok(ExitStatus::Error);
    }
    Ok(ExitStatus::Ok)
}

#[cfg(test)]
mod tests {
    /// Every hint names a flag `e2e --help` has, or says that none states it.
    #[test]
    fn every_unknown_condition_names_a_flag_that_exists_or_says_none_does() {
        use clap::CommandFactory;
        let help = crate::cli::Cli::command()
            .find_subcommand_mut("e2e")
            .expect("e2e")
            .render_long_help()
            .to_string();
        for c in [
            "engine name",
            "engine version",
            "model id",
            "speculative decoding (no counters)",
            "KV capacity (no cache_config_info on /metrics and none in the engine log)",
            "cache temperature (no prefix-cache counters)",
            "output token counts (no usage)",
        ] {
            let h = crate::e2e::render::how_to_state(c);
            assert!(!h.is_empty(), "{c}");
            let flags: Vec<&str> = h
                .split(|ch: char| ch.is_whitespace() || ch == ',' || ch == ')' || ch == '(')
                .filter(|w| w.starts_with("--"))
                .collect();
            assert!(
                flags.len() + usize::from(h.contains("no flag states it")) >= 1,
                "{c}: {h}"
            );
            for f in flags {
                assert!(help.contains(f), "{c}: {f} is not a flag of e2e");
            }
        }
    }

    use super::*;

    #[test]
    fn an_engine_log_named_engine_log_inside_out_is_refused_even_with_force() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("engine.log");
        std::fs::write(&log, "INFO started").unwrap();
        let e = check_input_outside_out("--engine-log", &log, d.path()).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("--engine-log") && msg.contains("own input"),
            "{msg}"
        );
        // Elsewhere, or under a name the report does not write, it is fine.
        let other = d.path().join("vllm.log");
        std::fs::write(&other, "x").unwrap();
        assert!(check_input_outside_out("--engine-log", &other, d.path()).is_ok());
        let sub = d.path().join("out");
        std::fs::create_dir(&sub).unwrap();
        assert!(check_input_outside_out("--engine-log", &log, &sub).is_ok());
    }
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct T {
        #[command(flatten)]
        a: E2eArgs,
    }

    fn opts(args: &[&str]) -> Result<E2eOptions, RigError> {
        let mut v = vec!["x"];
        v.extend_from_slice(args);
        T::try_parse_from(v).expect("clap").a.options()
    }

    #[test]
    fn defaults_run_the_builtin_engine_with_tiny() {
        let o = opts(&[]).unwrap();
        assert_eq!(o.suite.name, "tiny");
        match o.engine {
            EngineChoice::Builtin { args, .. } => {
                assert_eq!(args, vec!["--model", "synthetic:tiny"])
            }
            e => panic!("{e:?}"),
        }
        let o = opts(&[
            "--spec-method",
            "ngram",
            "--spec-k",
            "3",
            "--serve-arg=--kv-cache-memory=64MiB",
        ])
        .unwrap();
        match o.engine {
            EngineChoice::Builtin { args, .. } => {
                assert!(args
                    .windows(2)
                    .any(|w| w == [SERVE_SPEC_METHOD_FLAG, "ngram"]));
                assert_eq!(
                    args.last().map(String::as_str),
                    Some("--kv-cache-memory=64MiB")
                );
            }
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn overrides_and_engine_choice() {
        let o = opts(&[
            "--rate",
            "1,2",
            "--requests",
            "5",
            "--cache",
            "warm",
            "--thinking",
            "unset",
        ])
        .unwrap();
        assert_eq!(o.suite.load.mode, LoadMode::Open);
        assert_eq!(o.suite.load.rates, vec![1.0, 2.0]);
        assert_eq!(o.suite.load.cache, CacheTemp::Warm);
        assert_eq!(o.suite.sampling.thinking, None);
        let o = opts(&["--url", "http://127.0.0.1:8000"]).unwrap();
        assert!(matches!(o.engine, EngineChoice::Url { .. }));
        let o = opts(&["--engine-cmd", "vllm serve m", "--port", "8000"]).unwrap();
        assert!(
            matches!(o.engine, EngineChoice::Command { ref url, .. } if url == "http://127.0.0.1:8000")
        );
        let o = opts(&["--api", "completions"]).unwrap();
        assert_eq!(o.suite.sampling.thinking, None);
    }

    #[test]
    fn the_cache_reset_is_told_as_it_happened() {
        use crate::e2e::driver::reset_message;
        let url = "http://127.0.0.1:8000";
        let done = reset_message(url, "/reset_prefix_cache", Some(true), 2, CacheTemp::Cold);
        assert!(
            done.contains("POST http://127.0.0.1:8000/reset_prefix_cache emptied")
                && done.contains("2 sweep points"),
            "{done}"
        );
        // 404 (llama.cpp has no such endpoint): nothing was emptied, and the message says so.
        let absent = reset_message(url, "/reset_prefix_cache", None, 1, CacheTemp::Cold);
        assert!(
            !absent.contains("reset_prefix_cache emptied") && absent.contains("not emptied"),
            "{absent}"
        );
        let refused = reset_message(url, "/flush_cache", Some(false), 1, CacheTemp::Warm);
        assert!(refused.contains("NOT emptied"), "{refused}");
    }

    #[test]
    fn one_spelling_per_concept_old_ones_still_parse() {
        // serve's spellings are e2e's; the old ones are hidden aliases.
        for (new, old) in [
            ("--served-model-name", "--served-model"),
            ("--warmup-requests", "--warmup"),
        ] {
            assert!(
                opts(&[new, "3"]).is_ok() && opts(&[old, "3"]).is_ok(),
                "{new}"
            );
        }
        let eos = |a: &[&str]| opts(a).unwrap().suite.workload.ignore_eos;
        assert!(eos(&["--ignore-eos"]));
        assert!(!eos(&["--no-ignore-eos"]));
        assert!(!eos(&["--ignore-eos", "false"]));
        assert!(eos(&["--ignore-eos=true"]));
        // The built-in engine's flags are checked as `rigbench serve` checks them: exit 64.
        let e = opts(&["--spec-method", "eagle"]).unwrap_err();
        assert!(matches!(e, RigError::BadFlag { .. }), "{e}");
        assert!(e.to_string().contains("--spec-method"), "{e}");
        let e = opts(&["--spec-k", "3"]).unwrap_err();
        assert!(e.to_string().contains("--spec-method"), "{e}");
        let e = opts(&["--serve-arg=--kv-cache-memory=lots"]).unwrap_err();
        assert!(e.to_string().contains("--serve-arg"), "{e}");
    }

    #[test]
    fn bad_flags_name_themselves() {
        let e = |a: &[&str]| opts(a).unwrap_err().to_string();
        assert!(e(&["--engine-cmd", "x"]).contains("--engine-cmd"));
        assert!(e(&["--concurrency", "0"]).contains("concurrency"));
        assert!(e(&["--concurrency", "a"]).contains("--concurrency"));
        assert!(e(&["--url", "localhost:8000"]).contains("--url"));
        assert!(e(&["--suite", "nope"]).contains("--suite"));
        assert!(e(&["--duration=-1"]).contains("--duration"));
        assert!(e(&["--url", "http://h:1", "--quantize", "fp8"]).contains("--quantize"));
        assert!(e(&["--api", "completions", "--thinking", "on"]).contains("thinking"));
        assert!(e(&["--engine-log", "/no/such/file"]).contains("/no/such/file"));
    }
}
