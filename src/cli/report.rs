//! `rigbench report`: the main job. Rig probe, the CPU accuracy study, the kernel suite (when a
//! GPU is present), the checkpoint inspection (`--checkpoint DIR`) and the end-to-end runs against
//! the built-in runtime, written to `reports/<rig-label>/<UTC timestamp>/`.

use std::path::PathBuf;

use crate::cli::e2e::{BuiltinEngine, EngineArgs, LoadArgs};
use crate::cli::kernels::KernelSelection;
use crate::report::job::{self, Job};
use anyhow::Context;

use crate::report::folder::ReportDir;
use crate::{ExitStatus, RigError};

/// Arguments of `rigbench report`.
#[derive(Debug, clap::Args)]
#[command(after_help = crate::cli::help::after_help(crate::cli::help::Cmd::Report))]
pub struct ReportArgs {
    /// Report folder (default: reports/<rig-label>/<UTC timestamp>/).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Rig label for the folder name and baselines (default: from the GPU, e.g. nvidia-h200-sm90).
    #[arg(long)]
    pub rig_label: Option<String>,
    /// Kernel case selection and timing.
    #[command(flatten)]
    pub sel: KernelSelection,
    /// Skip the kernel benches.
    #[arg(long)]
    pub no_kernels: bool,
    /// Skip the end-to-end runs.
    #[arg(long)]
    pub no_e2e: bool,
    /// Skip the fidelity study on SmolLM2's trained weights (CPU; most of a CPU-only report's
    /// time).
    #[arg(long)]
    pub no_fidelity: bool,
    /// Also inspect this checkpoint folder (config.json, quantization metadata, safetensors headers).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// The model of the built-in runtime's end-to-end runs: a synthetic preset, a checkpoint
    /// folder or a GGUF file. On the GPU (BF16, FP8 and W4A16 on identical weights) the default
    /// is synthetic:qwen3-8b; on the CPU (no GPU, or --runtime-device cpu) it is synthetic:tiny,
    /// and a model given here is served on the CPU.
    #[arg(long)]
    pub model: Option<String>,
    /// Where the built-in runtime's e2e runs go: cuda[:N] or cpu (default: cuda:0 with a GPU,
    /// else cpu). A CPU run on a GPU rig is a harness self-test, kept out of baselines.
    #[arg(long)]
    pub runtime_device: Option<crate::runtime::backend::Device>,
    /// The engine of the end-to-end runs (the built-in runtime unless --url or --engine-cmd) and
    /// what rigbench is told about it: `e2e`'s flags.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The workload and load of the end-to-end runs: `e2e`'s flags, overriding the e2e suite's.
    #[command(flatten)]
    pub load: LoadArgs,
    /// Trace replay, SLO goodput and energy of the end-to-end runs: `e2e`'s flags.
    #[command(flatten)]
    pub serving: crate::cli::serving::ServingArgs,
    /// The end-to-end suite: a built-in name (tiny, fixed-1k-256, narrative, code, shared-prefix,
    /// open-loop) or a TOML file; `e2e --suite` (here --suite is the kernel suite).
    #[arg(long = "e2e-suite", value_name = "SUITE", default_value = "tiny")]
    pub e2e_suite: String,
    /// Do not redact host names, user paths, IP addresses and tokens.
    #[arg(long)]
    pub no_redact: bool,
    /// Replace a report already in --out (it is replaced only once this run has measured
    /// something; without --force such a folder is refused).
    #[arg(long)]
    pub force: bool,
    /// Also save the results as the baseline for this rig and suite
    /// (`<baseline-dir>/<rig-label>/<suite>.json`), the file `rigbench compare --baseline-dir` reads.
    #[arg(long)]
    pub save_baseline: bool,
    /// Folder of baselines for `--save-baseline` (checked for writing before anything is
    /// measured).
    #[arg(
        long = "baseline-dir",
        alias = "baselines-dir",
        value_name = "DIR",
        default_value = "baselines",
        requires = "save_baseline"
    )]
    pub baselines_dir: PathBuf,
    /// With --save-baseline: replace a baseline even when the new results lack a whole section
    /// the old one gates on (kernel timings, e2e, checkpoint, ...).
    #[arg(long, requires = "save_baseline")]
    pub force_baseline: bool,
    /// Run the kernel suite R times in this process, implementations interleaved (order rotated
    /// per repeat): the repeat is the unit of `compare`'s statistics, and a baseline saved from R
    /// ≥ 2 repeats stores each metric's between-run spread. The CI recipe measured on the H200:
    /// 6 for a baseline, 3 per CI run. See docs/gate.md.
    /// Default: 1, or up to 3 when the time budget leaves room for them.
    #[arg(long, value_name = "R", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeats: Option<u32>,
    /// Wall-time budget of the whole job on a GPU (`300`, `90s`, `5m`, `1h`), or `none` for
    /// the full suite: the kernel suite's M grid, the peers and the repeats are chosen to fit
    /// it from committed timings (docs/report.md, "The time budget"); what is given with --m,
    /// --peers on|off or --repeats is kept. The report says what the budget left out and the
    /// command that runs it. Default: 5m; none with --repeats or --save-baseline (a baseline
    /// and the CI runs compared with it measure the whole suite).
    #[arg(long, value_name = "TIME")]
    pub budget: Option<String>,
    /// Re-render report.md, the CSV files and plots from an existing results.json (or its
    /// folder) instead of measuring (only --out, --no-redact and --save-baseline go with it:
    /// the latter saves the rendered results as the baseline without measuring again).
    #[arg(long, value_name = "RESULTS", conflicts_with_all = RENDER_CONFLICTS)]
    pub render: Option<PathBuf>,
    /// Continue an interrupted report in this folder (e.g. one stopped by a CI time limit),
    /// with the same flags as the run that wrote it: its rigbench kernel cases are kept (its
    /// kernel bench must have finished), the peers continue from the cases they finished
    /// (`peers-progress.json`), and the later parts (checkpoint, end-to-end) run. One repeat,
    /// one GPU. The report says it was resumed and when.
    #[arg(long, value_name = "DIR", conflicts_with = "render")]
    pub resume: Option<PathBuf>,
    /// All-reduce bus bandwidth (nccl-tests' busbw), GB/s, for the tensor-parallel composite
    /// predicted from one GPU's rows (0.1 to 10,000; default: the fit to the committed 2-GPU
    /// H200 report, docs/multi-gpu.md).
    #[arg(long, value_name = "GB/s", conflicts_with = "render")]
    pub allreduce_busbw: Option<f64>,
    /// All-reduce fixed cost α, µs, for the same prediction (0 to 10,000; default as for
    /// --allreduce-busbw).
    #[arg(long, value_name = "µs", conflicts_with = "render")]
    pub allreduce_latency: Option<f64>,
}

/// The flags that measure or choose what to measure: `--render` measures nothing, so it refuses
/// them (clap ids; `KernelSelection`, `EngineArgs` and `LoadArgs` are the groups of the flags of
/// those structs). With
/// `--save-baseline` it saves what it renders.
const RENDER_CONFLICTS: [&str; 12] = [
    "KernelSelection",
    "EngineArgs",
    "LoadArgs",
    "ServingArgs",
    "rig_label",
    "no_kernels",
    "no_e2e",
    "no_fidelity",
    "checkpoint",
    "repeats",
    "e2e_suite",
    "budget",
];

/// The suite name a baseline of `results` is filed under.
fn baseline_suite(results: &crate::report::Results) -> String {
    results
        .kernels
        .as_ref()
        .map(|k| k.suite.name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "no-kernels".into())
}

/// Save `results` as a baseline and say what it replaced.
fn save(args: &ReportArgs, results: &crate::report::Results) -> anyhow::Result<()> {
    let saved = crate::compare::save_baseline(
        results,
        &args.baselines_dir,
        &baseline_suite(results),
        args.force_baseline,
    )?;
    match &saved.replaced {
        Some(r) => eprintln!(
            "rigbench: baseline {} replaced: {}{}",
            saved.path.display(),
            r.summary(),
            if r.dropped.is_empty() {
                String::new()
            } else {
                format!(" (dropped with --force-baseline: {})", r.dropped.join(", "))
            }
        ),
        None => eprintln!("rigbench: baseline saved to {}", saved.path.display()),
    }
    if let Some(b) = crate::compare::baseline::between_run_of(results) {
        eprintln!(
            "rigbench: the baseline stores the between-run spread of {} timing metrics ({} repeats)",
            b.metrics.len(),
            b.repeats
        );
    }
    Ok(())
}

/// Run `rigbench report`.
///
/// Exit codes: as `main`; 5 when a GPU was present, kernel cases were asked for, and none was
/// timed (every case failed its check or was skipped).
pub fn run(args: ReportArgs) -> anyhow::Result<ExitStatus> {
    if let Some(p) = &args.render {
        return render_saved(&args, p);
    }
    if let Some(dir) = &args.resume {
        check_resume_flags(&args, dir)?;
    }
    if let Some(l) = &args.rig_label {
        crate::compare::baseline::check_component("rig label", l)
            .map_err(|m| RigError::flag("--rig-label", m))?;
    }
    if let Some(c) = &args.checkpoint {
        if !c.is_dir() {
            return Err(
                RigError::flag("--checkpoint", format!("{} is not a folder", c.display())).into(),
            );
        }
    }
    // The end-to-end options, checked before anything is measured (a flag of a part that is
    // off is not checked).
    let e2e = if args.no_e2e {
        None
    } else {
        let mut o = crate::cli::e2e::e2e_options(
            "--e2e-suite",
            &args.e2e_suite,
            (&args.load, &args.serving),
            &args.engine,
            BuiltinEngine {
                model: "synthetic:tiny",
                quantize: None,
                serve_args: &[],
            },
            120.0,
        )?;
        o.progress = false;
        // --check-determinism covers the end-to-end runs too.
        o.check_determinism = args.sel.check_determinism;
        Some(o)
    };
    let gpus = match args.runtime_device {
        Some(crate::runtime::backend::Device::Cpu) => Default::default(),
        _ => crate::runtime::device::probe_gpus(),
    };
    let runtime_device = crate::runtime::device::resolve_device(args.runtime_device, &gpus)
        .map_err(|e| match e {
            RigError::BadFlag { message, .. } => RigError::flag("--runtime-device", message),
            other => other,
        })?;
    let model = args
        .model
        .clone()
        .unwrap_or_else(|| crate::runtime_eval::quality::DEFAULT_RUNTIME_MODEL.to_string());
    if !model.starts_with("synthetic:")
        && !std::path::Path::new(&model).is_dir()
        && !crate::checkpoint::gguf::is_gguf_path(std::path::Path::new(&model))
    {
        return Err(RigError::flag(
            "--model",
            format!("{model} is neither a synthetic:PRESET, a checkpoint folder nor a GGUF file"),
        )
        .into());
    }
    let budget_s = match &args.budget {
        Some(b) => {
            crate::report::budget::parse_budget(b).map_err(|m| RigError::flag("--budget", m))?
        }
        None if args.repeats.is_some() || args.save_baseline => None,
        None => Some(crate::report::budget::DEFAULT_BUDGET_S),
    };
    let mut kernels = if args.no_kernels {
        None
    } else {
        Some(args.sel.resolve()?)
    };
    // The budget plans the kernel suite on a GPU (probed here too when --runtime-device cpu
    // skipped the probe above).
    let gpu = kernels.is_some()
        && (gpus.count > 0
            || (args.runtime_device == Some(crate::runtime::backend::Device::Cpu)
                && crate::runtime::device::probe_gpus().count > 0));
    let runtime_on_gpu = runtime_device != crate::runtime::backend::Device::Cpu
        && e2e.as_ref().is_some_and(|o| {
            matches!(o.engine, crate::e2e::launcher::EngineChoice::Builtin { .. })
        });
    let budget = plan_budget(&args, budget_s, kernels.as_mut(), gpu, runtime_on_gpu);
    let repeats = budget
        .as_ref()
        .map(|b| b.plan.repeats)
        .unwrap_or(args.repeats.unwrap_or(1) as usize);
    let mut rig_label = args.rig_label.clone();
    if args.save_baseline {
        rig_label = Some(check_baseline(&args, kernels.as_ref(), rig_label)?);
    }
    // On the CPU the built-in runtime serves synthetic:tiny unless a model was named; a named
    // one is served (it was dropped without a word before).
    let mut e2e = e2e;
    if let (Some(o), Some(m), crate::runtime::backend::Device::Cpu) =
        (e2e.as_mut(), &args.model, runtime_device)
    {
        if let crate::e2e::launcher::EngineChoice::Builtin { args, .. } = &mut o.engine {
            set_flag(args, "--model", m);
        }
    }
    // An engine given with --url is reached now, before minutes of other parts: a dead or
    // refusing one used to fail the run only after them (79 s on a CPU-only report).
    if let Some(crate::e2e::launcher::EngineChoice::Url { url }) = e2e.as_ref().map(|o| &o.engine) {
        check_url_now(url)?;
    }
    // SIGINT/SIGTERM stop the run after the case in flight and write what was measured.
    crate::signals::install()?;
    let tp_allreduce = crate::multigpu::tp_model::AllReduceModel::with_flags(
        args.allreduce_busbw,
        args.allreduce_latency,
    )?;
    let (results, dir) = job::run_with_dir(Job {
        kernels,
        accuracy: true,
        quality: !args.no_fidelity,
        checkpoint: args.checkpoint.clone(),
        e2e,
        runtime_model: model.clone(),
        runtime_device,
        out: args.out.clone(),
        rig_label,
        redact: !args.no_redact,
        force: args.force,
        write_files: true,
        disabled: [
            (args.no_kernels, "kernels", "--no-kernels"),
            (args.no_e2e, "e2e", "--no-e2e"),
            (args.no_fidelity, "quality", "--no-fidelity"),
        ]
        .iter()
        .filter(|(off, _, _)| *off)
        .map(|(_, what, flag)| crate::report::Skip {
            what: what.to_string(),
            reason: format!("not requested ({flag})"),
        })
        .collect(),
        repeats,
        devices: args.sel.devices.clone(),
        interconnect: true,
        tp_allreduce: Some(tp_allreduce),
        resume: args.resume.clone(),
        budget,
    })?;
    finish(&args, &results, dir.as_ref())
}

/// The time budget's plan (docs/report.md, "The time budget"), applied to the kernel options:
/// the M grid, the peers and the repeats. `None` (nothing changed) with `--budget none`, without
/// the kernel suite and without a GPU (the suite is not timed). With `--resume` the interrupted
/// run's plan holds: its M grid and peers are applied again, nothing is planned anew.
fn plan_budget(
    args: &ReportArgs,
    budget_s: Option<f64>,
    kernels: Option<&mut crate::kernels::bench::BenchOptions>,
    gpu: bool,
    runtime_on_gpu: bool,
) -> Option<crate::report::schema::BudgetRecord> {
    use crate::kernels::peers::PeerMode;
    let opts = kernels?;
    if let Some(dir) = &args.resume {
        // The interrupted run's plan (absent: it ran without one, and so does this).
        let prev = crate::report::Results::load(&dir.join("results.json")).ok()?;
        let b = prev.budget?;
        opts.suite.m = b.plan.m.clone();
        if !b.plan.peers {
            opts.peers = PeerMode::Off;
        }
        return Some(b);
    }
    let budget_s = budget_s?;
    if !gpu {
        return None;
    }
    let impls =
        opts.formats.len() + usize::from(opts.formats.contains(&crate::formats::GemmFormat::Fp8));
    let req = crate::report::budget::Request {
        budget_s: Some(budget_s),
        shapes: opts.suite.shapes.iter().map(|s| (s.n, s.k)).collect(),
        m: opts.suite.m.clone(),
        m_fixed: args.sel.m.is_some(),
        impls,
        peers_fixed: match opts.peers {
            PeerMode::Auto => None,
            PeerMode::On => Some(true),
            PeerMode::Off => Some(false),
        },
        repeats_fixed: args.repeats.map(|r| r as usize),
    };
    let costs = crate::report::budget::Costs::measured(!kernel_cache_warm(), runtime_on_gpu);
    let plan = crate::report::budget::plan(&req, &costs);
    opts.suite.m = plan.m.clone();
    if !plan.peers {
        opts.peers = PeerMode::Off;
    }
    eprintln!(
        "rigbench: budget {:.0} s: M = {}, peers {}, {}; estimated {:.0} s{}",
        budget_s,
        plan.m
            .iter()
            .map(|m| m.to_string())
            .collect::<Vec<_>>()
            .join(","),
        if plan.peers { "on" } else { "off" },
        plural(plan.repeats, "repeat", "repeats"),
        plan.estimate_s,
        if plan.over_budget {
            " (over the budget: what was asked for does not fit)"
        } else if plan.left_out.is_empty() {
            ""
        } else {
            "; the full suite: --budget none"
        }
    );
    Some(crate::report::schema::BudgetRecord {
        plan,
        full_command: full_command(),
    })
}

/// Whether the compiled-kernel cache holds an entry for each GEMM module the bench builds
/// (`w4a16*.cu`, `fp8_quant.cu`): then NVRTC is not counted in the budget.
fn kernel_cache_warm() -> bool {
    let Some(dir) = crate::gpu::kernel_cache::cache_dir_from_env() else {
        return false;
    };
    let names: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".ptx"))
                .collect()
        })
        .unwrap_or_default();
    ["w4a16", "fp8_quant"]
        .iter()
        .all(|m| names.iter().any(|n| n.starts_with(m)))
}

/// This command line with `--budget none` instead of its budget (the full suite); secret flags'
/// values scrubbed as in the report's `Command:` line (the folder redacts the rest).
fn full_command() -> String {
    let all: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut out: Vec<String> = Vec::new();
    let mut args = crate::output::shell::scrub_secret_flags(&all).into_iter();
    while let Some(a) = args.next() {
        if a == "--budget" {
            args.next();
            continue;
        }
        if a.starts_with("--budget=") {
            continue;
        }
        out.push(a);
    }
    out.push("--budget".into());
    out.push("none".into());
    out.iter()
        .map(|a| crate::output::shell::shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `report --render`: report.md, the CSV files and plots drawn again from a saved results.json
/// (in place, or into `--out` with engine logs copied), and the baseline saved from it with
/// `--save-baseline`.
fn render_saved(args: &ReportArgs, p: &std::path::Path) -> anyhow::Result<ExitStatus> {
    let file = if p.is_dir() {
        p.join("results.json")
    } else {
        p.to_path_buf()
    };
    let mut results = crate::report::Results::load(&file)?;
    if args.save_baseline {
        crate::compare::baseline::check_writable(&args.baselines_dir)?;
    }
    let source = file
        .parent()
        .unwrap_or(std::path::Path::new("."))
        .to_path_buf();
    let target = args.out.clone().unwrap_or_else(|| source.clone());
    let same = target.canonicalize().ok() == source.canonicalize().ok();
    let dir = if same {
        // In place: keep results.json (creating the folder afresh would clear it).
        crate::report::folder::ReportDir::existing(&target, !args.no_redact)
    } else {
        let d = crate::report::folder::ReportDir::create(
            Some(&target),
            &results.rig_label,
            !args.no_redact,
            args.force,
        )?;
        d.write_results(&results)?;
        d
    };
    // In place, the CSV files the run wrote are kept as they are (a rewrite from
    // results.json can differ in columns or in the last digit of a float).
    if let Some(k) = results
        .kernels
        .as_ref()
        .filter(|_| !same || !dir.path.join("kernels.csv").is_file())
    {
        dir.write_text("kernels.csv", &crate::kernels::render::csv(k)?)?;
    }
    if let Some(e) = &results.e2e {
        if !same || !dir.path.join("e2e_runs.csv").is_file() {
            crate::e2e::render::write_csv(e, &dir.path)?;
        }
        // engine.log is not in results.json: carry it over from the source folder.
        let log = source.join("engine.log");
        if !same && log.is_file() {
            let text = std::fs::read_to_string(&log)
                .with_context(|| format!("cannot read {}", log.display()))?;
            dir.write_text("engine.log", &text)?;
        }
    }
    // The built-in runtime's per-format end-to-end folders, rewritten elsewhere from
    // results.json (their engine.log copied), as the run wrote them.
    if let Some(rt) = results.runtime.as_ref().filter(|_| !same) {
        for f in &rt.formats {
            let Some(e) = &f.e2e else { continue };
            let sub = crate::runtime_eval::section::e2e_dir(&f.format);
            std::fs::create_dir_all(dir.path.join(&sub))?;
            crate::e2e::render::write_csv(e, &dir.path.join(&sub))?;
            let log = source.join(&sub).join("engine.log");
            if log.is_file() {
                let text = std::fs::read_to_string(&log)
                    .with_context(|| format!("cannot read {}", log.display()))?;
                dir.write_text(&format!("{sub}/engine.log"), &text)?;
            }
        }
    }
    // Results written before the engine-log parser of `diagnose` stored its findings under
    // older field names, which read back as nothing recognised: for the report, read the
    // engine.log the run captured again (results.json is not changed).
    if let Some(e) = results.e2e.as_mut() {
        let log = source.join("engine.log");
        if e.boot_log.as_ref().is_some_and(|b| b.is_empty()) && log.is_file() {
            let bytes =
                std::fs::read(&log).with_context(|| format!("cannot read {}", log.display()))?;
            e.boot_log = Some(crate::e2e::bootlog::BootLog::parse_bytes(&bytes));
        }
    }
    job::render_into(&dir, &results)?;
    if same {
        dir.redact_direct_writes()?;
    } else {
        dir.commit()?;
    }
    eprintln!("rigbench: re-rendered {}", dir.target.display());
    print_summary(&dir, &results);
    if args.save_baseline {
        save(args, &results)?;
    }
    Ok(ExitStatus::Ok)
}

/// `--resume DIR` continues DIR in place: refuse an `--out` naming another folder, and
/// `--save-baseline`.
fn check_resume_flags(args: &ReportArgs, dir: &std::path::Path) -> anyhow::Result<()> {
    // The interrupted run's own command line usually has --out DIR: accept that folder.
    let same = |a: &std::path::Path, b: &std::path::Path| {
        a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
    };
    if let Some(out) = args.out.as_ref().filter(|o| !same(o, dir)) {
        return Err(RigError::flag(
            "--out",
            format!(
                "--resume continues {} in place; --out {} names another folder: drop --out",
                dir.display(),
                out.display()
            ),
        )
        .into());
    }
    if args.save_baseline {
        return Err(RigError::flag(
            "--save-baseline",
            format!(
                "not with --resume: once the resumed report is complete, save it with `rigbench report --render {} --save-baseline`",
                dir.display()
            ),
        )
        .into());
    }
    Ok(())
}

/// `--save-baseline`: refuse a baseline that cannot be written, or that would drop a section of
/// the one it replaces, before measuring anything. Returns the rig label it is filed under
/// (`rig_label`, else the probed rig's).
fn check_baseline(
    args: &ReportArgs,
    kernels: Option<&crate::kernels::bench::BenchOptions>,
    rig_label: Option<String>,
) -> anyhow::Result<String> {
    let suite = kernels
        .map(|k| k.suite.name.clone())
        .unwrap_or_else(|| "no-kernels".into());
    let label = rig_label.unwrap_or_else(|| crate::rig::probe().label());
    let path = crate::compare::baseline_path(&args.baselines_dir, &label, &suite)?;
    crate::compare::baseline::check_writable(&args.baselines_dir)?;
    if let (Ok(old), false) = (crate::report::Results::load(&path), args.force_baseline) {
        let have = crate::compare::baseline::sections(&old);
        let off: Vec<(&str, &str)> = [
            (args.no_e2e, "e2e", "--no-e2e"),
            (args.no_kernels, "kernel timings", "--no-kernels"),
            (args.checkpoint.is_none(), "checkpoint", "no --checkpoint"),
        ]
        .into_iter()
        .filter(|(off, sec, _)| *off && have.get(sec).is_some_and(|n| *n > 0))
        .map(|(_, sec, flag)| (sec, flag))
        .collect();
        if !off.is_empty() {
            return Err(RigError::flag(
                "--save-baseline",
                format!(
                    "the baseline {} gates on {}, which this run would not measure ({}); a later full run would compare them as new and pass. Run those parts, or pass --force-baseline to drop them",
                    path.display(),
                    off.iter().map(|x| x.0).collect::<Vec<_>>().join(", "),
                    off.iter().map(|x| x.1).collect::<Vec<_>>().join(", ")
                ),
            )
            .into());
        }
    }
    Ok(label)
}

/// After the run: say how it ended (interrupted, a part failed, complete), print the summary,
/// save the baseline when asked, and choose the exit status.
fn finish(
    args: &ReportArgs,
    results: &crate::report::Results,
    dir: Option<&ReportDir>,
) -> anyhow::Result<ExitStatus> {
    if let Some(why) = &results.interrupted {
        let timed = results.kernels.as_ref().map(|k| k.cases.len()).unwrap_or(0);
        eprintln!(
            "rigbench: report INTERRUPTED ({why}): {timed} kernel cases timed; report.md and results.json hold what was measured{}; if its kernel bench finished, `rigbench report --resume <its folder>` with the same flags continues it",
            if args.save_baseline { " (no baseline saved from an interrupted run)" } else { "" }
        );
        return Ok(ExitStatus::Error);
    }
    if !results.failed.is_empty() {
        for f in &results.failed {
            eprintln!(
                "rigbench: {} FAILED: {}",
                f.what,
                crate::output::redact::Redactor::for_this_host(true).secrets_only(&f.reason)
            );
        }
        if let Some(dir) = dir {
            print_summary(dir, results);
        }
        eprintln!(
            "rigbench: report written with what was measured, but a part it was asked for failed (exit {}){}",
            ExitStatus::Error.code(),
            if args.save_baseline { "; no baseline saved from it" } else { "" }
        );
        return Ok(ExitStatus::Error);
    }
    if args.save_baseline {
        if let Err(e) = save(args, results) {
            return Err(e.context(format!(
                "the report was written; once the cause is fixed, `rigbench report --render <its folder> --save-baseline` saves it without measuring again (baselines folder {})",
                args.baselines_dir.display()
            )));
        }
    }
    let timed = results.kernels.as_ref().map(|k| k.cases.len()).unwrap_or(0);
    let lint = results
        .checkpoint
        .as_ref()
        .filter(|c| c.has_errors())
        .map(|_| "; the checkpoint has lint errors (see its findings; `rigbench inspect` exits 4 on them)")
        .unwrap_or("");
    eprintln!(
        "rigbench: report complete: {}, {} skipped (see report.md){lint}",
        plural(timed, "kernel case timed", "kernel cases timed"),
        plural(results.skipped.len(), "part", "parts"),
    );
    if let Some(dir) = dir {
        print_summary(dir, results);
    }
    if !args.no_kernels && timed == 0 && results.rig.gpu_absent_reason.is_none() {
        eprintln!(
            "rigbench: a GPU was found and kernel cases were asked for, but none was timed (see the skipped cases in report.md); exit {}",
            ExitStatus::NothingTimed.code()
        );
        return Ok(ExitStatus::NothingTimed);
    }
    Ok(ExitStatus::Ok)
}

/// `1 part`, `2 parts`.
pub fn plural(n: usize, one: &str, many: &str) -> String {
    format!(
        "{} {}",
        crate::output::table::thousands(n as u64),
        if n == 1 { one } else { many }
    )
}

/// The short summary on stdout: where report.md is, and the verdict.
fn print_summary(dir: &ReportDir, results: &crate::report::Results) {
    let text = format!(
        "Report: {}\n\nVerdict:\n{}",
        dir.target.join("report.md").display(),
        crate::report::headline::text(results)
    );
    print!("{}", dir.redactor().redact(&text));
}

/// Reach the engine at `url` (`GET /health`, else `/v1/models`, 10 s each at most) before the
/// report measures anything.
///
/// # Errors
/// Nothing answers, or the engine refuses rigbench (a key it wants): the message says which and
/// names `--url`.
fn check_url_now(url: &str) -> anyhow::Result<()> {
    let client = crate::e2e::client::EngineClient::new(url)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let base = client.base().to_string();
    rt.block_on(crate::e2e::engines::reach(
        &base,
        std::time::Duration::from_secs(10),
    ))
    .map(|_| ())
    .map_err(|(_, why)| {
        anyhow::anyhow!("{why} (--url, checked before the report's other parts ran); start the engine first, or leave out --url to use the built-in engine")
    })
}

/// Set `flag` to `value` in a command line for `rigbench serve`: the value after the flag (or
/// of `flag=...`) replaced where the flag is already there, appended otherwise. The built-in
/// engine's defaults already hold `--model synthetic:tiny`; appending a second `--model` made
/// `serve` refuse the command line (it takes the flag once), so `report --model X
/// --runtime-device cpu` failed for every X.
fn set_flag(args: &mut Vec<String>, flag: &str, value: &str) {
    let eq = format!("{flag}=");
    let mut set = false;
    let mut i = 0;
    while i < args.len() {
        if args[i] == flag {
            if set {
                args.drain(i..(i + 2).min(args.len()));
                continue;
            }
            match args.get_mut(i + 1) {
                Some(v) => *v = value.to_string(),
                None => args.push(value.to_string()),
            }
            set = true;
            i += 2;
        } else if args[i].starts_with(&eq) {
            if set {
                args.remove(i);
                continue;
            }
            args[i] = format!("{eq}{value}");
            set = true;
            i += 1;
        } else {
            i += 1;
        }
    }
    if !set {
        args.extend([flag.to_string(), value.to_string()]);
    }
}

#[cfg(test)]
mod tests {
    use super::set_flag;

    #[test]
    fn a_named_model_replaces_the_builtin_default_once() {
        let defaults =
            crate::e2e::E2eOptions::with_suite(crate::e2e::workload::Suite::load("tiny").unwrap());
        let crate::e2e::launcher::EngineChoice::Builtin { mut args, .. } = defaults.engine else {
            panic!("the e2e default engine is the built-in one");
        };
        set_flag(&mut args, "--model", "/m/smollm2.gguf");
        let at: Vec<usize> = (0..args.len()).filter(|&i| args[i] == "--model").collect();
        assert_eq!(at.len(), 1, "{args:?}");
        assert_eq!(args[at[0] + 1], "/m/smollm2.gguf", "{args:?}");
        // `--model=` form, a repeat, and a command line without the flag.
        let mut a: Vec<String> = ["--model=x", "--port", "1", "--model", "y"]
            .map(String::from)
            .to_vec();
        set_flag(&mut a, "--model", "z");
        assert_eq!(a, ["--model=z", "--port", "1"]);
        let mut a: Vec<String> = vec!["--port".into(), "1".into()];
        set_flag(&mut a, "--model", "z");
        assert_eq!(a, ["--port", "1", "--model", "z"]);
    }
}
