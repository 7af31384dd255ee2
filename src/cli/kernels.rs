//! `rigbench kernels`: microkernel benches over a suite's shapes and M sweep.

use std::path::PathBuf;

use crate::cli::parse_list;
use crate::formats::GemmFormat;
use crate::kernels::bench::BenchOptions;
use crate::kernels::peers::PeerMode;
use crate::kernels::suite;
use crate::stats::StoppingRule;
use crate::{ExitStatus, RigError};

/// Options shared by `kernels` and `report` that select and time the kernel cases.
#[derive(Debug, Clone, clap::Args)]
pub struct KernelSelection {
    /// GPUs to bench, at the same time: `all` or CUDA indices (`0,1`). The first one's rows are
    /// the kernel section; the others are compared with it (per-GPU rows, spread, findings).
    #[arg(long, default_value = "0", value_parser = clap::builder::ValueParser::new(parse_devices))]
    pub devices: crate::multigpu::DeviceSelection,
    /// Suite: a built-in name (qwen3.6-27b, smoke) or a path to a suite TOML file.
    #[arg(long, default_value = suite::DEFAULT_SUITE)]
    pub suite: String,
    /// Formats to bench, comma-separated: bf16, fp8, w4a16, w4a4.
    #[arg(long, default_value = "bf16,fp8,w4a16,w4a4")]
    pub formats: String,
    /// Only these shapes of the suite (comma-separated names).
    #[arg(long)]
    pub shapes: Option<String>,
    /// Override the suite's M values (comma-separated positive integers).
    #[arg(long)]
    pub m: Option<String>,
    /// Stop sampling a case after this many seconds.
    #[arg(long, default_value_t = 0.25)]
    pub max_time: f64,
    /// Stop sampling once σ/mean of the samples is below this (nvbench's stdrel).
    #[arg(long, default_value_t = 0.01)]
    pub target_rel_std: f64,
    /// Minimum samples per case.
    #[arg(long, default_value_t = 10)]
    pub min_samples: usize,
    /// Maximum samples per case.
    #[arg(long, default_value_t = 200)]
    pub max_samples: usize,
    /// Warm-up launches before sampling.
    #[arg(
        long = "warmup-launches",
        alias = "warmup",
        value_name = "N",
        default_value_t = 3
    )]
    pub warmup: usize,
    /// Do not flush L2 before each sample (warm-cache figures; labelled in the report).
    #[arg(long)]
    pub warm_l2: bool,
    /// How to flush L2 before each sample: read (default; leaves clean lines) or write (memset,
    /// as nvbench; leaves dirty lines whose write-back is charged to the timed kernel).
    #[arg(long, value_enum, default_value_t = crate::gpu::FlushMethod::Read)]
    pub l2_flush: crate::gpu::FlushMethod,
    /// Run each implementation several times on the same inputs and compare outputs bit for bit.
    #[arg(long)]
    pub check_determinism: bool,
    /// Runs per determinism check.
    #[arg(long, default_value_t = 5)]
    pub determinism_runs: usize,
    /// M values at which the determinism check runs (comma-separated).
    #[arg(long, default_value = "1,16,64,1024")]
    pub determinism_m: String,
    /// Peer providers (scripts/peer_kernels.py: PyTorch cuBLAS, torch._scaled_mm, tinygemm INT4,
    /// gemlite INT4 W4A16 when `.peers/gemlite` is there, vLLM Marlin NVFP4 when importable).
    #[arg(long, value_enum, default_value_t = PeerMode::Auto)]
    pub peers: PeerMode,
    /// Only these peer providers (comma-separated): torch, gemlite, humming, vllm-marlin, vllm.
    /// Default: all (scripts/fetch-peers.sh fetches gemlite, Humming and vLLM's Marlin sources).
    #[arg(long, value_name = "LIST")]
    pub peer_providers: Option<String>,
    /// Timing mode: cold (one launch between CUDA events after an L2 flush), graph
    /// (back-to-back launches over rotating weight copies larger than 4× L2, captured in a CUDA
    /// graph), or both (cold, with graph beside it and whether they agree).
    #[arg(long, value_enum, default_value_t = crate::kernels::schema::TimingModes::Cold)]
    pub timing: crate::kernels::schema::TimingModes,
}

fn parse_devices(s: &str) -> Result<crate::multigpu::DeviceSelection, String> {
    s.parse()
}

impl KernelSelection {
    /// Validate and resolve into bench options.
    ///
    /// # Errors
    /// [`RigError::BadFlag`] / [`RigError::BadFile`] naming the flag or suite file.
    pub fn resolve(&self) -> Result<BenchOptions, RigError> {
        let mut s = suite::load(&self.suite).map_err(|e| super::suite_error("--suite", e))?;
        if let Some(sh) = &self.shapes {
            let names: Vec<String> = parse_list("--shapes", sh)?;
            s.select_shapes(&names)?;
        }
        if let Some(m) = &self.m {
            let ms: Vec<usize> = parse_list("--m", m)?;
            suite::check_m(&ms).map_err(|e| RigError::flag("--m", e))?;
            s.m = ms;
        }
        let formats: Vec<GemmFormat> = parse_list("--formats", &self.formats)?;
        if !(self.max_time > 0.0 && self.max_time.is_finite()) {
            return Err(RigError::flag(
                "--max-time",
                "must be a positive number of seconds",
            ));
        }
        if !(self.target_rel_std >= 0.0 && self.target_rel_std < 1.0) {
            return Err(RigError::flag(
                "--target-rel-std",
                "must be in [0, 1), e.g. 0.01 for 1%",
            ));
        }
        if self.min_samples == 0 || self.max_samples < self.min_samples {
            return Err(RigError::flag(
                "--min-samples/--max-samples",
                "need 1 ≤ min ≤ max",
            ));
        }
        // The determinism flags are checked only when the check is on: their defaults (and a
        // value left in a script) must not fail a run that does not use them.
        let det_m: Vec<usize> = if self.check_determinism {
            let m = parse_list("--determinism-m", &self.determinism_m)?;
            if self.determinism_runs < 2 {
                return Err(RigError::flag(
                    "--determinism-runs",
                    "needs at least 2 runs to compare",
                ));
            }
            m
        } else {
            Vec::new()
        };
        let peer_providers: Vec<String> = match &self.peer_providers {
            Some(list) => {
                let v: Vec<String> = parse_list("--peer-providers", list)?;
                if let Some(bad) = v
                    .iter()
                    .find(|p| !crate::kernels::peers::PROVIDERS.contains(&p.as_str()))
                {
                    return Err(RigError::flag(
                        "--peer-providers",
                        format!(
                            "unknown provider '{bad}'; known: {}",
                            crate::kernels::peers::PROVIDERS.join(", ")
                        ),
                    ));
                }
                v
            }
            None => Vec::new(),
        };
        Ok(BenchOptions {
            suite: s,
            formats,
            stopping: StoppingRule {
                min_samples: self.min_samples,
                max_samples: self.max_samples,
                target_rel_std: self.target_rel_std,
                max_time_s: self.max_time,
            },
            warmup: self.warmup,
            cold_l2: !self.warm_l2,
            flush: self.l2_flush,
            tune_samples: 5,
            determinism_m: det_m,
            determinism_runs: self.determinism_runs,
            peers: self.peers,
            timing: self.timing,
            peers_progress: None,
            peers_resume: false,
            peer_providers,
        })
    }
}

/// Arguments of `rigbench kernels`.
#[derive(Debug, clap::Args)]
#[command(after_help = crate::cli::help::after_help(crate::cli::help::Cmd::Kernels))]
pub struct KernelsArgs {
    /// Case selection and timing.
    #[command(flatten)]
    pub sel: KernelSelection,
    /// Write a report folder here (default: print tables only).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the kernel results as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Do not redact host name, user paths, IP addresses and tokens.
    #[arg(long)]
    pub no_redact: bool,
    /// Run the suite R times, implementations interleaved (see `rigbench report --repeats`).
    #[arg(long, value_name = "R", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeats: u32,
    /// Replace a report already in --out (only once this run has measured something).
    #[arg(long)]
    pub force: bool,
}

/// Run `rigbench kernels`.
///
/// Exit codes: as `main`; 5 when no case was timed (no GPU, or every case failed its check or
/// was skipped): the reasons are in the output (`skipped` and `notes` of the JSON).
pub fn run(args: KernelsArgs) -> anyhow::Result<ExitStatus> {
    let opts = args.sel.resolve()?;
    let job = crate::report::job::Job {
        kernels: Some(opts),
        accuracy: true,
        quality: false,
        checkpoint: None,
        e2e: None,
        runtime_model: String::new(),
        runtime_device: crate::runtime::backend::Device::Cpu,
        out: args.out.clone(),
        rig_label: None,
        redact: !args.no_redact,
        write_files: args.out.is_some(),
        disabled: Vec::new(),
        repeats: args.repeats as usize,
        force: args.force,
        devices: args.sel.devices.clone(),
        interconnect: false,
        tp_allreduce: None,
        resume: None,
        budget: None,
    };
    crate::signals::install()?;
    let results = crate::report::job::run(job)?;
    if args.json {
        let mut v = serde_json::to_value(&results.kernels)?;
        crate::output::redact::Redactor::for_this_host(!args.no_redact).redact_json(&mut v);
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let mut md = String::new();
        if let Some(k) = &results.kernels {
            md.push_str(&crate::kernels::render::markdown_for(
                k,
                &[],
                &results.rig.capabilities,
            ));
        }
        if let Some(mg) = &results.multi_gpu {
            md.push_str(&crate::multigpu::render::markdown(mg, &results.rig));
        }
        for s in &results.skipped {
            md.push_str(&format!("- skipped {}: {}\n", s.what, s.reason));
        }
        print!(
            "{}",
            crate::output::redact::Redactor::for_this_host(!args.no_redact).redact(&md)
        );
    }
    if let Some(why) = &results.interrupted {
        eprintln!("rigbench kernels: INTERRUPTED ({why})");
        return Ok(ExitStatus::Error);
    }
    let timed = results.kernels.as_ref().map_or(0, |k| k.cases.len());
    if timed == 0 {
        eprintln!(
            "rigbench kernels: no case was timed ({}); exit {}",
            // The kernel part's own reason (no GPU, …) before any other part's.
            results
                .skipped
                .iter()
                .find(|s| s.what == "kernels")
                .or_else(|| results.skipped.first())
                .map(|s| format!("{}: {}", s.what, s.reason))
                .unwrap_or_else(
                    || "every case failed its check or was skipped; see the output".into()
                ),
            ExitStatus::NothingTimed.code()
        );
        return Ok(ExitStatus::NothingTimed);
    }
    Ok(ExitStatus::Ok)
}
