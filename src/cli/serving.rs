//! The serving flags shared by `rigbench e2e` and `rigbench report`: trace replay (`--trace`,
//! `--trace-speed`, `--trace-start`, `--trace-duration`), SLO goodput (`--slo`,
//! `--goodput-search`) and energy (`--no-energy`). docs/traces.md, docs/goodput.md,
//! docs/energy.md.

use crate::e2e::goodput::{SearchAxis, SearchSpec, Slo};
use crate::e2e::trace::{Trace, TraceFormat, TraceWindow};
use crate::e2e::trace_replay::TraceSpec;
use crate::e2e::workload::{ArrivalKind, LoadMode};
use crate::e2e::E2eOptions;
use crate::RigError;

/// Trace replay, SLO and energy flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServingArgs {
    /// Replay a trace instead of the suite's workload: a built-in one (agentic, chat) or a file
    /// (Mooncake JSONL, vLLM timed_trace JSONL, ShareGPT-like conversations; docs/traces.md).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<String>,
    /// The trace's format (default: guessed; a file named *timed_trace* is vLLM's).
    #[arg(long, value_enum, requires = "trace")]
    pub trace_format: Option<TraceFormat>,
    /// Tokens per hash id (default: 512 for Mooncake, 16 for timed_trace).
    #[arg(long, value_name = "TOKENS", requires = "trace")]
    pub trace_block_tokens: Option<u32>,
    /// Time scale of the replay: 2 sends twice as fast (default 1).
    #[arg(long, value_name = "FACTOR", requires = "trace")]
    pub trace_speed: Option<f64>,
    /// Replay the sessions starting at or after this many trace seconds (default 0).
    #[arg(long, value_name = "SECONDS", requires = "trace")]
    pub trace_start: Option<f64>,
    /// Replay the sessions starting within this many trace seconds of --trace-start.
    #[arg(long, value_name = "SECONDS", requires = "trace")]
    pub trace_duration: Option<f64>,
    /// Latency targets: every sweep point reports the share of requests meeting each and all,
    /// with a Wilson interval (e.g. ttft=2s,tpot=50ms,e2e=10s).
    #[arg(long, value_name = "TARGETS")]
    pub slo: Option<String>,
    /// Search for the highest rate (open loop) or concurrency (closed loop) whose SLO
    /// attainment is at least --goodput-target, by doubling then bisection from the suite's
    /// first rate or concurrency (needs --slo).
    #[arg(long, requires = "slo")]
    pub goodput_search: bool,
    /// The attainment the search must reach (default 0.95).
    #[arg(long, value_name = "SHARE", requires = "goodput_search")]
    pub goodput_target: Option<f64>,
    /// Most probes of the search (default 8).
    #[arg(long, value_name = "N", requires = "goodput_search")]
    pub goodput_probes: Option<usize>,
    /// Do not sample GPU power (energy is then stated as unknown).
    #[arg(long)]
    pub no_energy: bool,
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

/// Apply the serving flags to `o` (its suite already overridden by the load flags).
///
/// # Errors
/// [`RigError::BadFlag`] naming the flag; [`RigError::BadFile`] naming the trace file and line.
pub fn apply(o: &mut E2eOptions, a: &ServingArgs) -> Result<(), RigError> {
    if let Some(s) = &a.slo {
        o.slo = Some(Slo::parse(s)?);
    }
    if a.no_energy {
        o.power = crate::e2e::energy::PowerChoice::Off;
    }
    if let Some(t) = &a.trace {
        let trace = Trace::load(t, a.trace_format, a.trace_block_tokens)?;
        let window = TraceWindow {
            speed: positive("--trace-speed", a.trace_speed.unwrap_or(1.0))?,
            start_s: match a.trace_start {
                Some(s) if !(s.is_finite() && s >= 0.0) => {
                    return Err(RigError::flag(
                        "--trace-start",
                        format!("{s} must be 0 or more seconds"),
                    ))
                }
                s => s.unwrap_or(0.0),
            },
            duration_s: a
                .trace_duration
                .map(|d| positive("--trace-duration", d))
                .transpose()?,
        };
        let sessions = trace.windowed(&window);
        let requests: usize = sessions.iter().map(|s| s.turns.len()).sum();
        if requests == 0 {
            return Err(RigError::flag(
                "--trace-start/--trace-duration",
                format!("the window holds no session of {}", trace.origin.display()),
            ));
        }
        let span = sessions.iter().map(|s| s.start_s).fold(0.0, f64::max);
        // The trace sets every length; the suite's prompt set only warms the engine up.
        o.suite.workload.kind = crate::e2e::workload::WorkloadKind::Prompts;
        o.suite.workload.ignore_eos = true;
        let l = &mut o.suite.load;
        l.mode = LoadMode::Open;
        l.arrival = ArrivalKind::Trace;
        l.rates = vec![if span > 0.0 {
            requests as f64 / span
        } else {
            requests as f64
        }];
        l.requests = requests.min(crate::e2e::workload::MAX_REQUESTS as usize) as u32;
        if a.goodput_search {
            return Err(RigError::flag(
                "--goodput-search",
                "searches over the rate or the concurrency, which a trace fixes; replay it at several --trace-speed values instead",
            ));
        }
        o.trace = Some(TraceSpec { trace, window });
    }
    if a.goodput_search {
        let l = &o.suite.load;
        let (axis, start) = match l.mode {
            LoadMode::Open => (SearchAxis::Rate, l.rates.first().copied().unwrap_or(1.0)),
            LoadMode::Closed => (
                SearchAxis::Concurrency,
                f64::from(l.concurrency.first().copied().unwrap_or(1)),
            ),
        };
        let mut spec = SearchSpec::new(axis, start);
        if let Some(t) = a.goodput_target {
            if !(t > 0.0 && t < 1.0) {
                return Err(RigError::flag(
                    "--goodput-target",
                    format!("{t} must be a share between 0 and 1 (e.g. 0.95)"),
                ));
            }
            spec.target = t;
        }
        if let Some(n) = a.goodput_probes {
            if !(1..=64).contains(&n) {
                return Err(RigError::flag(
                    "--goodput-probes",
                    format!("{n} must be 1 to 64"),
                ));
            }
            spec.max_probes = n;
        }
        o.goodput_search = Some(spec);
    }
    Ok(())
}
