//! The main job's orchestration, shared by `rigbench report` and `rigbench kernels`: probe the rig,
//! run the requested parts, and write the report folder incrementally (results.json and
//! kernels.csv after every case; report.md and plots at the end, or from a saved results.json
//! with `rigbench report --render`).

use std::path::PathBuf;

use super::folder::ReportDir;
use super::schema::{Results, Skip};
use crate::kernels::bench::BenchOptions;

/// What to run.
pub struct Job {
    /// Kernel benches (run only with a GPU).
    pub kernels: Option<BenchOptions>,
    /// The CPU reference accuracy study of each format (runs everywhere).
    pub accuracy: bool,
    /// The fidelity study on trained weights (`crate::runtime_eval::quality`), run on the CPU when the
    /// SmolLM2 GGUF is in the cache folder (`scripts/fetch-smollm2.sh`); skipped with the reason
    /// otherwise.
    pub quality: bool,
    /// Checkpoint to inspect (card and memory taken from the rig probe).
    pub checkpoint: Option<PathBuf>,
    /// End-to-end runs (the engine in it: the built-in runtime, or an external one).
    pub e2e: Option<crate::e2e::E2eOptions>,
    /// The model of the GPU runtime's runs (`synthetic:qwen3-8b` by default).
    pub runtime_model: String,
    /// Where the built-in runtime runs (resolved `--runtime-device`).
    pub runtime_device: crate::runtime::backend::Device,
    /// Report folder (default `reports/<rig-label>/<timestamp>/`).
    pub out: Option<PathBuf>,
    /// Rig label override.
    pub rig_label: Option<String>,
    /// Redact host names, user paths and IPs.
    pub redact: bool,
    /// Write the report folder (false: results only returned).
    pub write_files: bool,
    /// Parts the user turned off, recorded as skipped with the flag that did it.
    pub disabled: Vec<Skip>,
    /// Repeats of the kernel suite on the first device (`--repeats R`; see
    /// [`crate::kernels::repeats`]); other devices run the suite once, alongside.
    pub repeats: usize,
    /// Replace a report already in `out` (`--force`), once this run has measured something.
    pub force: bool,
    /// GPUs to bench (`--devices`); the first one's rows are the `kernels` section, the others
    /// run at the same time and are compared with it.
    pub devices: crate::multigpu::DeviceSelection,
    /// Measure the interconnect and predict tensor-parallel decode when two or more GPUs are
    /// selected (`report`).
    pub interconnect: bool,
    /// The all-reduce model of the tensor-parallel composite predicted from the first GPU's
    /// rows at TP = 2, 4, 8 (`report`; `None`: not predicted). See
    /// [`crate::multigpu::tp_model`].
    pub tp_allreduce: Option<crate::multigpu::tp_model::AllReduceModel>,
    /// Continue the interrupted report in this folder (`report --resume`): see [`resumable`].
    pub resume: Option<PathBuf>,
    /// The time budget's plan this job was shaped by (`report --budget`; `None`: no budget,
    /// or a command without one), recorded in the results and said in the report.
    pub budget: Option<super::schema::BudgetRecord>,
}

/// What differs between the rig facts of an interrupted run and of the process resuming it:
/// host name, GPU PCI bus id, driver version, NVRTC or cuBLASLt version (`None`: nothing).
fn rig_difference(was: &crate::rig::RigFacts, now: &crate::rig::RigFacts) -> Option<String> {
    let mut d = Vec::new();
    let pair = |what: &str, a: Option<&str>, b: Option<&str>, d: &mut Vec<String>| {
        if a != b {
            d.push(format!(
                "{what} {} then, {} now",
                a.unwrap_or("unknown"),
                b.unwrap_or("unknown")
            ));
        }
    };
    // results.json holds the host name redacted (`<host>`) unless --no-redact: then unknown.
    if !was.host.hostname.starts_with('<') && was.host.hostname != now.host.hostname {
        d.push("another host".into());
    }
    let bus = |r: &crate::rig::RigFacts| r.gpu.as_ref().and_then(|g| g.pci_bus_id.clone());
    for (what, a, b) in [
        ("GPU PCI bus", bus(was), bus(now)),
        (
            "driver",
            was.stack.driver_version.clone(),
            now.stack.driver_version.clone(),
        ),
        (
            "NVRTC",
            was.stack.nvrtc_version.clone(),
            now.stack.nvrtc_version.clone(),
        ),
        (
            "cuBLASLt",
            was.stack.cublaslt_version.clone(),
            now.stack.cublaslt_version.clone(),
        ),
    ] {
        pair(what, a.as_deref(), b.as_deref(), &mut d);
    }
    (!d.is_empty()).then(|| d.join(", "))
}

/// The results of an interrupted report that `report --resume DIR` can continue with `job`:
/// its kernel bench finished (every (shape, M, format) of the suite has a rigbench case or a
/// skip), on the same rigbench version, suite, M values, formats and timing modes, on a GPU of
/// the same name, with one repeat on one device. What is kept: the rig facts, the accuracy
/// study and rigbench's own kernel cases, and the peer cases finished in `DIR/peers-progress.json`;
/// the remaining peers and every later part (checkpoint, end-to-end) run in the new process.
/// A finished report whose peer script stopped early (a skipped entry says so) can be
/// continued too.
///
/// # Errors
/// A flag error naming `--resume` and why the folder cannot be continued (no results.json,
/// a finished report, another version or suite, a kernel bench that stopped before its end).
pub fn resumable(
    dir: &std::path::Path,
    job: &Job,
    rig: &crate::rig::RigFacts,
) -> anyhow::Result<Results> {
    let bad = |m: String| -> anyhow::Error { crate::RigError::flag("--resume", m).into() };
    if !dir.exists() {
        return Err(bad(format!(
            "{} does not exist: give the folder of the interrupted report",
            dir.display()
        )));
    }
    if !dir.is_dir() {
        return Err(bad(format!(
            "{} is a file: --resume takes the report folder (the one holding results.json)",
            dir.display()
        )));
    }
    let file = dir.join("results.json");
    let prev = Results::load(&file).map_err(|e| bad(format!("{e}")))?;
    let peers_stopped = prev.kernels.as_ref().is_some_and(|k| {
        k.skipped
            .iter()
            .any(|s| s.provider == crate::kernels::peers::PEERS_STOPPED_PROVIDER)
    });
    if prev.interrupted.is_none() && prev.complete && !peers_stopped {
        return Err(bad(format!(
            "{} holds a finished report: nothing to continue (re-render it with --render)",
            dir.display()
        )));
    }
    let here = env!("CARGO_PKG_VERSION");
    if prev.rigbench_version != here {
        return Err(bad(format!(
            "{} was measured by rigbench {}, this is {here}: start a new report",
            file.display(),
            prev.rigbench_version
        )));
    }
    let Some(k) = prev.kernels.as_ref().filter(|k| !k.cases.is_empty()) else {
        return Err(bad(format!(
            "{} has no kernel cases: --resume continues a report whose kernel bench finished; start a new report",
            file.display()
        )));
    };
    let Some(opts) = job.kernels.as_ref() else {
        return Err(bad(
            "--no-kernels: --resume continues the peers of the kernel bench; pass the flags of the interrupted run without --no-kernels".into(),
        ));
    };
    if job.repeats > 1
        || job
            .devices
            .resolve(rig.gpus.len())
            .map(|d| d.len())
            .unwrap_or(1)
            > 1
    {
        return Err(bad(
            "--resume works with one repeat on one GPU: drop --repeats and pass --devices 0".into(),
        ));
    }
    if k.repeats.is_some() || prev.multi_gpu.as_ref().is_some_and(|m| m.devices.len() > 1) {
        return Err(bad(format!(
            "{} was measured with --repeats or on several GPUs (--devices): --resume continues one repeat on one GPU; start a new report",
            file.display()
        )));
    }
    if let Some(l) = job.rig_label.as_ref().filter(|l| **l != prev.rig_label) {
        return Err(bad(format!(
            "{} is labelled {}; --rig-label {l} would not match it: drop --rig-label",
            file.display(),
            prev.rig_label
        )));
    }
    // The same measurement settings as the interrupted run.
    let policy = k.timing_policy.as_ref();
    let mut differ = Vec::new();
    if k.suite.name != opts.suite.name {
        differ.push(format!(
            "suite {} (these flags: {})",
            k.suite.name, opts.suite.name
        ));
    }
    if let Some(p) = policy {
        if p.modes != opts.timing {
            differ.push(
                format!("--timing {:?} (these flags: {:?})", p.modes, opts.timing).to_lowercase(),
            );
        }
        if p.stopping != opts.stopping {
            differ.push(
                "the stopping rule (--max-time, --target-rel-std, --min-samples, --max-samples)"
                    .into(),
            );
        }
        if p.warmup_iters != opts.warmup {
            differ.push(format!(
                "--warmup-launches {} (these flags: {})",
                p.warmup_iters, opts.warmup
            ));
        }
        if (p.l2_flush_bytes > 0) != (opts.cold_l2 && opts.timing.cold()) {
            differ.push("--warm-l2".into());
        }
    }
    let in_grid = |shape: &str, m: usize, imp: &str| {
        opts.suite.shapes.iter().any(|s| s.name == shape)
            && opts.suite.m.contains(&m)
            && opts.formats.iter().any(|f| f.id() == imp)
    };
    if let Some(c) = k
        .cases
        .iter()
        .find(|c| c.provider == "rigbench" && !in_grid(&c.shape, c.m, &c.implementation))
    {
        differ.push(format!(
            "the cases it measured ({} {} M={} is not asked for by --shapes/--m/--formats)",
            c.implementation, c.shape, c.m
        ));
    }
    if !differ.is_empty() {
        return Err(bad(format!(
            "{} was measured with other settings: {}. Pass the flags of the interrupted run (its command line is in report.md)",
            file.display(),
            differ.join("; ")
        )));
    }
    let same_gpu = match (&prev.rig.gpu, &rig.gpu) {
        (Some(a), Some(b)) => a.name == b.name,
        _ => false,
    };
    if !same_gpu {
        let was = prev
            .rig
            .gpu
            .as_ref()
            .map(|g| g.name.as_str())
            .unwrap_or("no GPU");
        return Err(bad(format!(
            "{} was measured on {was}, this machine has {}: resume it on a machine with {was}",
            file.display(),
            rig.gpu
                .as_ref()
                .map(|g| g.name.as_str())
                .unwrap_or("no GPU"),
        )));
    }
    let mut missing = Vec::new();
    for shape in &opts.suite.shapes {
        for &m in &opts.suite.m {
            for f in &opts.formats {
                let id = f.id();
                let done = k.cases.iter().any(|c| {
                    c.provider == "rigbench"
                        && c.implementation == id
                        && c.shape == shape.name
                        && c.m == m
                }) || k.skipped.iter().any(|s| {
                    s.provider == "rigbench"
                        && (s.implementation == id || s.implementation == "*")
                        && (s.shape == shape.name || s.shape == "*")
                        && (s.m.is_none() || s.m == Some(m))
                });
                if !done {
                    missing.push(format!("{id} {} M={m}", shape.name));
                }
            }
        }
    }
    if !missing.is_empty() {
        return Err(bad(format!(
            "{}'s kernel bench stopped before its end ({} cases missing, e.g. {}): --resume continues after it (the peers and later parts); start a new report",
            file.display(),
            missing.len(),
            missing[0]
        )));
    }
    let progress = dir.join(super::folder::PEERS_PROGRESS);
    if progress.exists() {
        let ok = std::fs::read_to_string(&progress)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|v| v.get("cases").is_some_and(|c| c.is_array()));
        if !ok {
            return Err(bad(format!(
                "{} is not the peer script's output (unreadable or malformed): delete it to run every peer case again, or start a new report",
                progress.display()
            )));
        }
    }
    Ok(prev)
}

/// When SIGINT or SIGTERM has arrived (see `crate::signals`): record `what` as not run and
/// return true.
fn skip_if_interrupted(results: &mut Results, what: &str) -> bool {
    match crate::signals::interrupted() {
        Some(sig) => {
            results.skipped.push(Skip {
                what: what.into(),
                reason: format!("not run: interrupted by {sig}"),
            });
            true
        }
        None => false,
    }
}

/// Run the job; returns the results (also written to the folder when `write_files`).
///
/// SIGINT or SIGTERM (when the caller installed `crate::signals`) stops it after the case in
/// flight: parts not started are recorded as skipped, `results.json` keeps every finished case,
/// `report.md` is rendered from it, and [`Results::interrupted`] says which signal it was.
///
/// # Errors
/// Only for failures that lose the report (the folder cannot be written); failures of parts are
/// recorded in `Results::skipped`.
pub fn run(job: Job) -> anyhow::Result<Results> {
    run_with_dir(job).map(|(r, _)| r)
}

/// [`run`], also returning the report folder written (`None` without `write_files`).
///
/// # Errors
/// As [`run`].
pub fn run_with_dir(job: Job) -> anyhow::Result<(Results, Option<ReportDir>)> {
    let started = std::time::Instant::now();
    let rig = crate::rig::probe();
    let rig_now = rig.clone();
    let command_line = crate::output::shell::command_line();
    let resumed = match &job.resume {
        Some(d) => Some(resumable(d, &job, &rig)?),
        None => None,
    };
    let label = match &resumed {
        Some(prev) => prev.rig_label.clone(),
        None => job.rig_label.clone().unwrap_or_else(|| rig.label()),
    };
    let resumed_at = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let mut results = match &resumed {
        Some(prev) => resumed_results(prev, &resumed_at, &command_line),
        None => Results::new(rig, label.clone(), command_line),
    };
    if job.budget.is_some() {
        results.budget = job.budget.clone();
    }
    let dir = open_report_dir(&job, &label)?;
    save(&dir, &results)?;
    crate::signals::test_hold();

    // Resolve --devices before measuring anything (a device the machine lacks is a flag error).
    let devices = job.devices.resolve(results.rig.gpus.len())?;
    plan_multi_gpu(&devices, &mut results);

    results.skipped.extend(job.disabled.iter().cloned());
    if let (Some(prev), Some(opts)) = (&resumed, job.kernels.as_ref()) {
        let k = resume_peers(&job, opts, prev, &rig_now, &resumed_at, &mut results);
        results.kernels = Some(k);
        save(&dir, &results)?;
    }
    if resumed.is_none() && job.accuracy && !skip_if_interrupted(&mut results, "accuracy") {
        eprintln!("rigbench: CPU accuracy study of each format");
        let acc = crate::kernels::accuracy::study();
        results
            .kernels
            .get_or_insert_with(Default::default)
            .reference_accuracy = acc;
        save(&dir, &results)?;
    }

    let kernel_opts = job.kernels.clone().map(|mut o| {
        // The peers keep their progress in the report folder, for `report --resume`.
        if let (Some(d), 1) = (&dir, job.repeats) {
            o.peers_progress = Some(d.path.join(super::folder::PEERS_PROGRESS));
        }
        o
    });
    if let Some(opts) = kernel_opts
        .as_ref()
        .filter(|_| resumed.is_none())
        .filter(|_| !skip_if_interrupted(&mut results, "kernels"))
    {
        results.kernels.get_or_insert_with(Default::default).suite =
            crate::kernels::schema::SuiteInfo {
                name: opts.suite.name.clone(),
                file: opts.suite.file.display().to_string(),
                description: opts.suite.description.clone(),
                decode_step: opts.suite.decode_step(),
            };
        if let Some(reason) = results.rig.gpu_absent_reason.clone() {
            record_kernels_without_gpu(opts, &reason, &mut results);
        } else {
            bench_kernels(&job, opts, &devices, &dir, &mut results)?;
        }
    }

    if job.quality && resumed.is_none() && !skip_if_interrupted(&mut results, "quality") {
        run_quality(&mut results, &job.runtime_model);
        save(&dir, &results)?;
    }

    if job.interconnect {
        measure_interconnect(&job, &devices, &dir, &mut results)?;
    }

    if let Some(ar) = &job.tp_allreduce {
        let model = job.kernels.as_ref().and_then(|o| o.suite.model.clone());
        match super::multigpu::tp_model(&results, model.as_ref(), ar) {
            Ok(tp) => results.tp_model = Some(tp),
            Err(why) => results.skipped.push(Skip {
                what: "multi-gpu/tp-model".into(),
                reason: why,
            }),
        }
        save(&dir, &results)?;
    }

    if let Some(path) = job
        .checkpoint
        .as_ref()
        .filter(|_| !skip_if_interrupted(&mut results, "checkpoint"))
    {
        inspect_checkpoint(path, &mut results);
        save(&dir, &results)?;
    }

    let e2e_job = job
        .e2e
        .clone()
        .filter(|_| !skip_if_interrupted(&mut results, "e2e"));
    if let Some(opts) = &e2e_job {
        eprintln!("rigbench: end-to-end runs (suite {})", opts.suite.name);
    }
    let builtin = e2e_job
        .as_ref()
        .is_some_and(|o| matches!(o.engine, crate::e2e::launcher::EngineChoice::Builtin { .. }));
    let gpu_rig = results.rig.gpu.is_some();
    if let (Some(opts), true, crate::runtime::backend::Device::Cuda(device)) =
        (&e2e_job, builtin, job.runtime_device)
    {
        run_runtime_section(&job, opts, device, &dir, &mut results)?;
    } else if let Some(opts) = &e2e_job {
        run_e2e_part(opts, builtin && gpu_rig, &dir, &mut results)?;
    }

    match crate::signals::interrupted() {
        Some(sig) => {
            results.interrupted = Some(format!(
                "{sig} stopped the run; results hold every case finished before it"
            ));
            results.complete = false;
        }
        None => results.complete = true,
    }
    // The last write of results.json: the wall time is the job's, start to here.
    results.wall_s = Some(started.elapsed().as_secs_f64());
    save(&dir, &results)?;
    if let Some(d) = &dir {
        render_into(d, &results)?;
        d.commit()?;
    }
    Ok((results, dir))
}

/// Write results.json, and kernels.csv when there are kernel results, into the report folder
/// (nothing without one).
fn save(dir: &Option<ReportDir>, r: &Results) -> anyhow::Result<()> {
    if let Some(d) = dir {
        d.write_results(r)?;
        if let Some(k) = &r.kernels {
            d.write_text("kernels.csv", &crate::kernels::render::csv(k)?)?;
        }
    }
    Ok(())
}

/// The results `report --resume` starts from: the interrupted run's, its command line saying
/// when and by what it was resumed, with every part decided again by this run cleared.
fn resumed_results(prev: &Results, resumed_at: &str, command_line: &str) -> Results {
    let mut r = prev.clone();
    r.command_line = format!(
        "{} (resumed at {resumed_at} by: {command_line})",
        prev.command_line
    );
    r.interrupted = None;
    r.complete = false;
    // Every part-level skip is decided again by this run (multi-GPU, disabled parts,
    // checkpoint, e2e); the kernel section keeps its own skipped cases.
    r.skipped.clear();
    r.checkpoint = None;
    r.e2e = None;
    r.runtime = None;
    r
}

/// The report folder (created, or continued in place by `--resume`) when `write_files`,
/// saying where it is written.
fn open_report_dir(job: &Job, label: &str) -> anyhow::Result<Option<ReportDir>> {
    if !job.write_files {
        return Ok(None);
    }
    let d = match &job.resume {
        // Continued in place: nothing of it is replaced, so nothing is staged.
        Some(r) => ReportDir::continue_in(r, job.redact)?,
        None => ReportDir::create(job.out.as_deref(), label, job.redact, job.force)?,
    };
    if d.staged() {
        eprintln!(
            "rigbench: writing report to {} (moved to {} at the end)",
            d.path.display(),
            d.target.display()
        );
    } else {
        eprintln!("rigbench: writing report to {}", d.path.display());
    }
    Ok(Some(d))
}

/// The multi-GPU section for the resolved devices, or the reason it is skipped.
fn plan_multi_gpu(devices: &[usize], results: &mut Results) {
    if let Some(why) = super::multigpu::single_gpu_reason(
        devices,
        results.rig.gpus.len(),
        results.rig.gpu_absent_reason.as_deref(),
    ) {
        results.skipped.push(Skip {
            what: "multi-gpu".into(),
            reason: why,
        });
    } else {
        results.multi_gpu = Some(crate::multigpu::MultiGpuResults {
            devices: devices.to_vec(),
            ..Default::default()
        });
    }
}

/// `report --resume`: the kernel section of the interrupted run `prev` with rigbench's own
/// cases kept and the peers continued from their progress file (their earlier rows put back
/// when the continued run returns none), with notes saying what was resumed.
fn resume_peers(
    job: &Job,
    opts: &BenchOptions,
    prev: &Results,
    rig_now: &crate::rig::RigFacts,
    resumed_at: &str,
    results: &mut Results,
) -> crate::kernels::schema::KernelResults {
    // `report --resume`: rigbench's own cases are kept; the peers continue.
    let mut k = prev.kernels.clone().unwrap_or_default();
    let own = k.cases.iter().filter(|c| c.provider == "rigbench").count();
    // The peer rows the interrupted run finished come back from the progress file; they
    // are put back as they were whenever the continued peers return none (interrupted at
    // once, --peers off, python3 missing), and their SM clock readings are kept.
    let earlier_peers: Vec<crate::kernels::schema::KernelCase> = k
        .cases
        .iter()
        .filter(|c| c.provider != "rigbench")
        .cloned()
        .collect();
    let earlier_skips: Vec<crate::kernels::schema::SkippedCase> = k
        .skipped
        .iter()
        .filter(|s| {
            s.provider != "rigbench" && s.provider != crate::kernels::peers::PEERS_STOPPED_PROVIDER
        })
        .cloned()
        .collect();
    let earlier_status = k.peers.clone();
    let earlier_stop: Vec<crate::kernels::schema::SkippedCase> = k
        .skipped
        .iter()
        .filter(|s| s.provider == crate::kernels::peers::PEERS_STOPPED_PROVIDER)
        .cloned()
        .collect();
    k.cases.retain(|c| c.provider == "rigbench");
    k.skipped.retain(|s| s.provider == "rigbench");
    k.peers.clear();
    k.notes.retain(|n| {
        !n.starts_with("the peer script stopped early")
            && !n.starts_with("peer providers ran in")
            && !n.starts_with("peers were requested")
    });
    // The folder is continued in place (`ReportDir::continue_in`): the script goes on from
    // its own progress file there.
    let folder = job.resume.as_deref().unwrap_or(std::path::Path::new("."));
    let mut o = opts.clone();
    o.peers_progress = Some(folder.join(super::folder::PEERS_PROGRESS));
    o.peers_resume = true;
    if !skip_if_interrupted(results, "kernels/peers") {
        eprintln!("rigbench: resuming the peers of {}", folder.display());
        crate::kernels::peers::run_into(&o, &mut k);
    }
    if !earlier_peers.is_empty() && k.cases.iter().all(|c| c.provider == "rigbench") {
        k.notes.push(format!(
            "the continued peer run returned no cases; the {} peer cases of the interrupted run are kept as they were",
            earlier_peers.len()
        ));
        k.cases.extend(earlier_peers.iter().cloned());
        k.skipped.extend(earlier_skips);
        // Still not finished: keep saying so (and keep the report resumable).
        let stop_noted = k
            .skipped
            .iter()
            .any(|s| s.provider == crate::kernels::peers::PEERS_STOPPED_PROVIDER);
        if !stop_noted {
            k.skipped.extend(earlier_stop);
        }
    }
    // Provider statuses the continued run did not write (it stopped before, or did not run).
    for st in earlier_status {
        if !k.peers.iter().any(|p| p.provider == st.provider) {
            k.peers.push(st);
        }
    }
    for c in k
        .cases
        .iter_mut()
        .filter(|c| c.provider != "rigbench" && c.clocks.is_none())
    {
        if let Some(e) = earlier_peers.iter().find(|e| {
            e.provider == c.provider
                && e.implementation == c.implementation
                && e.shape == c.shape
                && e.m == c.m
        }) {
            c.clocks = e.clocks.clone();
            c.sm_clock_mhz = e.sm_clock_mhz;
            c.throttle = e.throttle.clone();
        }
    }
    if let Some(d) = rig_difference(&prev.rig, rig_now) {
        k.notes.push(format!(
            "the resuming process ran on a different machine state than the interrupted run ({d}): the rig section is the interrupted run's; the peers and later parts ran on this one"
        ));
    }
    k.notes.push(format!(
        "resumed at {resumed_at} by a new process (`report --resume`): the accuracy study and rigbench's {own} kernel cases are the interrupted run's (started {}); the peers went on from the {} peer cases that run finished; any later part (checkpoint, end-to-end) ran in the new process",
        prev.created_utc,
        earlier_peers.len()
    ));
    k
}

/// No GPU: the kernel part is skipped with `reason`, said in the results and in the kernel
/// section itself.
fn record_kernels_without_gpu(opts: &BenchOptions, reason: &str, results: &mut Results) {
    let why = format!("{reason}; GPU kernel benches need an NVIDIA GPU with driver ≥ 580 (CUDA 13). The CPU reference accuracy study ran instead.");
    results.skipped.push(Skip {
        what: "kernels".into(),
        reason: why.clone(),
    });
    // The kernel section says it too (its JSON and tables are read on their own).
    let k = results.kernels.get_or_insert_with(Default::default);
    k.skipped.push(crate::kernels::schema::SkippedCase {
        provider: "rigbench".into(),
        implementation: "*".into(),
        shape: "*".into(),
        m: None,
        reason: why.clone(),
    });
    k.notes.push(format!("no kernel case was timed: {why}"));
    if opts.peers == crate::kernels::peers::PeerMode::On {
        k.notes.push(format!(
            "peers were requested (--peers on) but did not run: {reason}"
        ));
    }
}

/// The kernel benches on the GPUs: the first device's repeats (results saved after every
/// case), the other devices alongside, their spread, and one kernels_gpuN.csv per other device.
fn bench_kernels(
    job: &Job,
    opts: &BenchOptions,
    devices: &[usize],
    dir: &Option<ReportDir>,
    results: &mut Results,
) -> anyhow::Result<()> {
    eprintln!(
        "rigbench: kernels: suite {}, {} × {} × {} cases (a progress bar shows on a terminal)",
        opts.suite.name,
        crate::output::table::plural(opts.suite.shapes.len() as u64, "shape", "shapes"),
        crate::output::table::plural(opts.suite.m.len() as u64, "M value", "M values"),
        crate::output::table::plural(opts.formats.len() as u64, "format", "formats"),
    );
    let accuracy = results
        .kernels
        .as_ref()
        .map(|k| k.reference_accuracy.clone())
        .unwrap_or_default();
    let first = devices.first().copied().unwrap_or(0);
    let others: Vec<(usize, String)> = devices
        .iter()
        .skip(1)
        .map(|&d| {
            let name = results
                .rig
                .gpus
                .get(d)
                .map(|g| g.name.clone())
                .unwrap_or_default();
            (d, name)
        })
        .collect();
    let mut last_err = None;
    let (outcome, other_kernels) = super::multigpu::bench_devices(opts, &others, |others_now| {
        // Peers run on CUDA device 0 only.
        crate::kernels::repeats::run_repeated_with(
            opts,
            job.repeats,
            first == 0,
            |o, upd| crate::kernels::bench::run_on_device(first, o, upd),
            |partial| {
                let mut k = partial.clone();
                k.reference_accuracy = accuracy.clone();
                results.kernels = Some(k);
                if let Some(mg) = results.multi_gpu.as_mut() {
                    mg.device_kernels = others_now();
                }
                if let Err(e) = save(dir, results) {
                    last_err = Some(e);
                }
            },
        )
    });
    if let Some(mg) = results.multi_gpu.as_mut() {
        mg.device_kernels = other_kernels;
    }
    if let Some(e) = last_err {
        return Err(e);
    }
    match outcome {
        Ok(mut k) => {
            k.reference_accuracy = accuracy;
            if let Some(sig) = crate::signals::interrupted() {
                // The peer cases finished before the signal are kept (peers-progress.json).
                results.skipped.push(Skip {
                    what: "kernels/peers".into(),
                    reason: format!(
                        "stopped by {sig}: the peer cases finished before it are kept; `rigbench report --resume <this report's folder>` continues the rest"
                    ),
                });
            } else if first != 0 && opts.peers != crate::kernels::peers::PeerMode::Off {
                k.notes.push(format!("peers not run: they run on CUDA device 0, and the first device selected is {first}"));
            }
            results.kernels = Some(k);
        }
        Err(e) => results.skipped.push(Skip {
            what: "kernels".into(),
            reason: format!(
                "the kernel bench stopped: {e:#} (cases measured before the error are kept)"
            ),
        }),
    }
    if let Some(mg) = results.multi_gpu.as_mut() {
        mg.spread = Some(spread_of(
            &results.rig,
            first,
            results.kernels.as_ref(),
            &mg.device_kernels,
        ));
    }
    save(dir, results)?;
    if let (Some(d), Some(mg)) = (dir, &results.multi_gpu) {
        for dk in &mg.device_kernels {
            if let Some(k) = &dk.kernels {
                d.write_text(
                    &format!("kernels_gpu{}.csv", dk.device),
                    &crate::kernels::render::csv(k)?,
                )?;
            }
        }
    }
    Ok(())
}

/// The fidelity study on trained weights (CPU) into `results.quality`: `--model` when it is a
/// GGUF file, else the fetched SmolLM2 ([`crate::runtime_eval::quality::fidelity_model`]); or
/// the reason it did not run (no model, a failure, an interruption).
fn run_quality(results: &mut Results, runtime_model: &str) {
    match crate::runtime_eval::quality::fidelity_model(runtime_model) {
        Ok((path, why)) => {
            eprintln!(
                "rigbench: fidelity on trained weights ({}, CPU backend)",
                path.display()
            );
            let outcome = crate::runtime::gguf_model::GgufModel::load(&path, None).and_then(|m| {
                let mut name =
                    crate::runtime_eval::quality::describe_gguf(&m.path, &m.content_hash, &m.notes);
                if let Some(w) = &why {
                    name.push_str(&format!(" ({w})"));
                }
                crate::runtime_eval::quality::study(
                    &m.weights,
                    &m.tokenizer,
                    &name,
                    crate::runtime_eval::quality::QualitySpec::report(),
                    &mut |what| eprintln!("rigbench: fidelity: {what}"),
                )
            });
            match outcome {
                Ok(q) => results.quality = Some(q),
                Err(e) if crate::signals::interrupted().is_some() => {
                    results.skipped.push(Skip {
                        what: "quality".into(),
                        reason: format!(
                            "not finished: interrupted by {} (the fidelity study keeps no partial figures; {e:#})",
                            crate::signals::interrupted().unwrap_or("a signal")
                        ),
                    })
                }
                Err(e) => results.skipped.push(Skip {
                    what: "quality".into(),
                    reason: format!("the fidelity study on SmolLM2 failed: {e:#}"),
                }),
            }
        }
        Err(reason) => results.skipped.push(Skip {
            what: "quality".into(),
            reason,
        }),
    }
}

/// With a multi-GPU section: the interconnect measured and the tensor-parallel prediction
/// from it (or why not), then saved.
fn measure_interconnect(
    job: &Job,
    devices: &[usize],
    dir: &Option<ReportDir>,
    results: &mut Results,
) -> anyhow::Result<()> {
    let model = job.kernels.as_ref().and_then(|o| o.suite.model.clone());
    let peers = job
        .kernels
        .as_ref()
        .map(|o| o.peers)
        .unwrap_or(crate::kernels::peers::PeerMode::Auto);
    if let Some(mut mg) = results.multi_gpu.take() {
        let mut skipped = Vec::new();
        super::multigpu::interconnect(devices, model.as_ref(), peers, &mut mg, &mut skipped);
        results.multi_gpu = Some(mg);
        results.skipped.extend(skipped);
        match super::multigpu::tp_prediction(results, model.as_ref()) {
            Ok(tp) => {
                if let Some(mg) = results.multi_gpu.as_mut() {
                    mg.tp = Some(tp);
                }
            }
            Err(why) => results.skipped.push(Skip {
                what: "multi-gpu/tp".into(),
                reason: why,
            }),
        }
        save(dir, results)?;
    }
    Ok(())
}

/// The checkpoint inspection (card and memory from the rig probe) into `results.checkpoint`,
/// or its error as a skip.
fn inspect_checkpoint(path: &std::path::Path, results: &mut Results) {
    eprintln!("rigbench: inspecting checkpoint {}", path.display());
    let opts = crate::checkpoint::InspectOptions::from_rig(&results.rig);
    match crate::checkpoint::inspect(path, &opts) {
        Ok(r) => results.checkpoint = Some(r),
        Err(e) => results.skipped.push(Skip {
            what: "checkpoint".into(),
            reason: format!("{e:#}"),
        }),
    }
}

/// The built-in runtime on the GPU: parity first, then BF16, FP8 and W4A16 (the runtime
/// section), each format's e2e CSV files and engine log written into its own folder.
fn run_runtime_section(
    job: &Job,
    opts: &crate::e2e::E2eOptions,
    device: usize,
    dir: &Option<ReportDir>,
    results: &mut Results,
) -> anyhow::Result<()> {
    let o = crate::runtime_eval::section::RuntimeReportOptions {
        model: job.runtime_model.clone(),
        device,
        seed: 0,
        e2e: opts.clone(),
        bench: crate::runtime_eval::bench::RuntimeBenchSpec::runtime_targets(),
        gpu_memory_bytes: results.rig.gpu.as_ref().map(|g| g.memory_bytes),
    };
    let section = crate::runtime_eval::section::run_gpu(&o, results.kernels.as_ref());
    if let Some(d) = dir {
        for f in &section.formats {
            if let Some(e) = &f.e2e {
                let sub = d
                    .path
                    .join(crate::runtime_eval::section::e2e_dir(&f.format));
                // As on the CPU path: a file that cannot be written (a full disk) loses that
                // file, never the measured section, and the failure is said.
                let written = std::fs::create_dir_all(&sub)
                    .map_err(anyhow::Error::from)
                    .and_then(|_| crate::e2e::render::write_csv(e, &sub))
                    .and_then(|_| match &e.engine_log {
                        Some(log) => d.write_text(&format!("e2e-{}/engine.log", f.format), log),
                        None => Ok(()),
                    });
                if let Err(err) = written {
                    results.failed.push(Skip {
                        what: format!("e2e files ({})", f.format),
                        reason: format!(
                            "the {} runs were measured, but writing their CSV files or engine.log into {} failed: {err:#}",
                            f.format,
                            sub.display()
                        ),
                    });
                }
            }
        }
    }
    results.runtime = Some(section);
    save(dir, results)?;
    Ok(())
}

/// The end-to-end runs against an engine (the built-in runtime on the CPU, or an external
/// one): their CSV files and engine log written, a failure said; `self_test` marks a CPU run
/// of the built-in runtime on a GPU rig.
fn run_e2e_part(
    opts: &crate::e2e::E2eOptions,
    self_test: bool,
    dir: &Option<ReportDir>,
    results: &mut Results,
) -> anyhow::Result<()> {
    let mut opts = opts.clone();
    if let crate::e2e::launcher::EngineChoice::Builtin { args, .. } = &mut opts.engine {
        // The CPU backend, stated, so that a GPU rig's default does not apply.
        args.extend(["--device".to_string(), "cpu".to_string()]);
    }
    let outcome = crate::e2e::run_for_report(&opts).map(|mut r| {
        if self_test {
            r.self_test = Some("harness self-test (CPU)".into());
        }
        r
    });
    match outcome {
        Ok(mut r) => {
            crate::e2e::parallel::annotate(&mut r, &results.rig, None);
            if let Some(d) = dir {
                // A file that cannot be written (a full disk) loses that file, never the
                // measured runs: they still go into results.json, and the failure is said.
                let written =
                    crate::e2e::render::write_csv(&r, &d.path).and_then(|_| match &r.engine_log {
                        Some(log) => d.write_text("engine.log", log),
                        None => Ok(()),
                    });
                if let Err(e) = written {
                    results.failed.push(Skip {
                        what: "e2e files".into(),
                        reason: format!(
                            "the e2e runs were measured, but writing their CSV files or engine.log into {} failed: {e:#}",
                            d.path.display()
                        ),
                    });
                }
            }
            if let Some(why) = e2e_failure(&r) {
                results.failed.push(Skip {
                    what: "e2e".into(),
                    reason: why,
                });
            }
            results.e2e = Some(r)
        }
        Err(e) => {
            // An engine that failed to start: its log is the evidence; keep it.
            let failed = e.downcast_ref::<crate::e2e::launcher::EngineStartFailure>();
            if let (Some(d), Some(f)) = (dir, failed) {
                if !f.log.trim().is_empty() {
                    d.write_text("engine.log", &f.log)?;
                }
            }
            results.failed.push(Skip {
                what: "e2e".into(),
                reason: format!("{e:#}"),
            })
        }
    }
    save(dir, results).map_err(|e| {
        e.context("writing results.json after the end-to-end runs failed, so they are not in it")
    })?;
    Ok(())
}

/// Why the end-to-end part failed, as `rigbench e2e` judges it (an engine that stopped during
/// the runs, no sweep point run, no valid run); `None` when it did not fail, or was interrupted
/// (an interruption has its own mark and exit).
pub fn e2e_failure(e: &crate::e2e::E2eResults) -> Option<String> {
    if e.interrupted {
        return None;
    }
    if let Some(f) = &e.failure {
        return Some(f.clone());
    }
    if e.runs.is_empty() {
        return Some("no sweep point ran".into());
    }
    if !e.any_valid() {
        return Some(format!(
            "no valid run of {} (see the Validity section)",
            crate::output::table::plural(e.runs.len() as u64, "sweep point", "sweep points")
        ));
    }
    None
}

/// The per-GPU comparison of the first device's kernel rows with the others'.
fn spread_of(
    rig: &crate::rig::RigFacts,
    first: usize,
    first_kernels: Option<&crate::kernels::KernelResults>,
    others: &[crate::multigpu::schema::DeviceKernels],
) -> crate::multigpu::schema::SpreadReport {
    use crate::multigpu::spread::{spread, DeviceRun};
    let name_of = |d: usize| rig.gpus.get(d).map(|g| g.name.as_str()).unwrap_or("?");
    let mut runs = Vec::new();
    if let Some(k) = first_kernels {
        runs.push(DeviceRun {
            device: first,
            name: name_of(first),
            kernels: k,
        });
    }
    for o in others {
        if let Some(k) = &o.kernels {
            runs.push(DeviceRun {
                device: o.device,
                name: name_of(o.device),
                kernels: k,
            });
        }
    }
    spread(&runs)
}

/// Write report.md and the plots for `results` into `dir`.
pub fn render_into(dir: &ReportDir, results: &Results) -> anyhow::Result<()> {
    let mut plots = Vec::new();
    if let Some(k) = &results.kernels {
        plots.extend(crate::kernels::render::write_plots(k, &dir.path)?);
    }
    if let Some(e) = &results.e2e {
        plots.extend(crate::e2e::write_plots(e, &dir.path)?);
    }
    // The built-in runtime's end-to-end runs on the GPU, one folder per format: report.md
    // links their plots there.
    if let Some(rt) = &results.runtime {
        for f in &rt.formats {
            if let Some(e) = &f.e2e {
                let sub = crate::runtime_eval::section::e2e_dir(&f.format);
                std::fs::create_dir_all(dir.path.join(&sub))?;
                crate::e2e::write_plots(e, &dir.path.join(&sub))?;
            }
        }
    }
    let files: Vec<String> = std::fs::read_dir(&dir.path)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().is_file())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let md = super::markdown::render(results, &plots, &files, dir.redactor());
    // report.md: the verdict and one table per part; the details file: every table
    // (docs/report.md, "The report's layout").
    let details = format!(
        "{}\n\nEvery table of this run. The verdict and one table per part: [`report.md`](report.md).\n{}",
        md.lines().next().unwrap_or("# rigbench report").replacen(
            "# rigbench report",
            "# rigbench report details",
            1
        ),
        md.split_once('\n').map_or("", |(_, rest)| rest)
    );
    dir.write_text(super::markdown::DETAILS_FILE, &details)?;
    dir.write_text("report.md", &super::markdown::summary(&md))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::schema::{KernelResults, SkippedCase, TimingModes, TimingPolicy};

    fn gpu(name: &str) -> crate::rig::RigFacts {
        crate::rig::RigFacts {
            gpu: Some(crate::rig::GpuFacts {
                name: name.into(),
                ..Default::default()
            }),
            gpus: vec![crate::rig::GpuFacts {
                name: name.into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn job(timing: TimingModes) -> Job {
        Job {
            kernels: Some(BenchOptions {
                formats: vec![
                    crate::formats::GemmFormat::Bf16,
                    crate::formats::GemmFormat::W4a4,
                ],
                peers: crate::kernels::peers::PeerMode::On,
                timing,
                ..BenchOptions::new(crate::kernels::suite::load("smoke").unwrap())
            }),
            accuracy: true,
            quality: false,
            checkpoint: None,
            e2e: None,
            runtime_model: "synthetic:tiny".into(),
            runtime_device: crate::runtime::backend::Device::Cpu,
            out: None,
            rig_label: None,
            redact: false,
            write_files: false,
            disabled: vec![],
            repeats: 1,
            force: false,
            devices: crate::multigpu::DeviceSelection::List(vec![0]),
            interconnect: false,
            tp_allreduce: None,
            resume: None,
            budget: None,
        }
    }

    /// An interrupted smoke report on `name`: bf16 cases for every (shape, M) but `drop`,
    /// w4a4 skipped per shape (as on sm_90), one peer row.
    fn interrupted(name: &str, drop: Option<(&str, usize)>) -> Results {
        let suite = crate::kernels::suite::load("smoke").unwrap();
        let mut k = KernelResults {
            timing_policy: Some(TimingPolicy {
                warmup_iters: 3,
                stopping: BenchOptions::new(suite.clone()).stopping,
                l2_flush_bytes: 120 << 20,
                timer: String::new(),
                modes: TimingModes::Cold,
                graph: None,
            }),
            ..Default::default()
        };
        k.suite.name = "smoke".into();
        for s in &suite.shapes {
            k.skipped.push(SkippedCase {
                provider: "rigbench".into(),
                implementation: "w4a4".into(),
                shape: s.name.clone(),
                m: None,
                reason: "fallback".into(),
            });
            for &m in &suite.m {
                if drop == Some((s.name.as_str(), m)) {
                    continue;
                }
                let mut c = crate::kernels::composite::tests::case_for_tests("bf16", 1e-5);
                c.shape = s.name.clone();
                c.m = m;
                k.cases.push(c);
            }
        }
        let mut peer = crate::kernels::composite::tests::case_for_tests("bf16", 1e-5);
        peer.provider = "torch".into();
        k.cases.push(peer);
        let mut r = Results::new(gpu(name), "rig".into(), "rigbench report".into());
        r.kernels = Some(k);
        r.interrupted = Some("SIGTERM stopped the run".into());
        r
    }

    fn resume_error(prev: &Results, j: &Job, here: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("results.json"),
            serde_json::to_vec(prev).unwrap(),
        )
        .unwrap();
        match resumable(dir.path(), j, &gpu(here)) {
            Ok(_) => String::new(),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn a_resume_on_another_host_or_driver_is_named() {
        let a = gpu("NVIDIA H200");
        assert_eq!(rig_difference(&a, &a.clone()), None);
        let mut redacted = a.clone();
        redacted.host.hostname = "<host>".into();
        assert_eq!(
            rig_difference(&redacted, &a),
            None,
            "a redacted name is unknown"
        );
        let mut b = a.clone();
        b.host.hostname = "other".into();
        b.stack.driver_version = Some("580.1".into());
        let d = rig_difference(&a, &b).unwrap();
        assert!(
            d.contains("another host") && d.contains("driver unknown then, 580.1 now"),
            "{d}"
        );
    }

    fn err(r: anyhow::Result<Results>) -> String {
        match r {
            Ok(_) => String::new(),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn resume_refuses_a_file_a_missing_folder_and_a_malformed_progress_file() {
        let j = job(TimingModes::Cold);
        let h200 = gpu("NVIDIA H200");
        let dir = tempfile::tempdir().unwrap();
        let e = err(resumable(&dir.path().join("nope"), &j, &h200));
        assert!(e.contains("does not exist"), "{e}");
        let file = dir.path().join("results.json");
        let prev = interrupted("NVIDIA H200", None);
        std::fs::write(&file, serde_json::to_vec(&prev).unwrap()).unwrap();
        let e = err(resumable(&file, &j, &h200));
        assert!(e.contains("takes the report folder"), "{e}");
        assert_eq!(err(resumable(dir.path(), &j, &h200)), "");
        let progress = dir.path().join(super::super::folder::PEERS_PROGRESS);
        std::fs::write(&progress, "garbage{").unwrap();
        let e = err(resumable(dir.path(), &j, &h200));
        assert!(
            e.contains("peers-progress.json") && e.contains("delete it"),
            "{e}"
        );
        std::fs::write(&progress, r#"{"peers":[],"cases":[],"skipped":[]}"#).unwrap();
        assert_eq!(err(resumable(dir.path(), &j, &h200)), "");
    }

    #[test]
    fn resume_continues_only_a_finished_kernel_bench_of_the_same_suite_and_gpu() {
        let j = job(TimingModes::Cold);
        let done = interrupted("NVIDIA H200", None);
        assert_eq!(resume_error(&done, &j, "NVIDIA H200"), "");

        let cut = interrupted("NVIDIA H200", Some(("o_proj", 16)));
        let e = resume_error(&cut, &j, "NVIDIA H200");
        assert!(
            e.contains("--resume")
                && e.contains("stopped before its end")
                && e.contains("bf16 o_proj M=16"),
            "{e}"
        );

        let e = resume_error(&done, &j, "NVIDIA H100 80GB HBM3");
        assert!(e.contains("resume it on a machine with NVIDIA H200"), "{e}");

        let e = resume_error(&done, &job(TimingModes::Both), "NVIDIA H200");
        assert!(
            e.contains("--timing") && e.contains("Pass the flags of the interrupted run"),
            "{e}"
        );

        // Fewer M values than the interrupted run measured: its rows are outside the grid.
        let mut fewer = job(TimingModes::Cold);
        if let Some(o) = fewer.kernels.as_mut() {
            o.suite.m = vec![1];
        }
        let e = resume_error(&done, &fewer, "NVIDIA H200");
        assert!(e.contains("--shapes/--m/--formats"), "{e}");

        let mut no_kernels = job(TimingModes::Cold);
        no_kernels.kernels = None;
        let e = resume_error(&done, &no_kernels, "NVIDIA H200");
        assert!(e.contains("--no-kernels"), "{e}");

        let mut finished = done.clone();
        finished.interrupted = None;
        finished.complete = true;
        let e = resume_error(&finished, &j, "NVIDIA H200");
        assert!(e.contains("finished report"), "{e}");
        // Finished, but its peer script stopped before its end: that can be continued.
        if let Some(k) = finished.kernels.as_mut() {
            k.skipped.push(SkippedCase {
                provider: crate::kernels::peers::PEERS_STOPPED_PROVIDER.into(),
                implementation: "*".into(),
                shape: "*".into(),
                m: None,
                reason: "the peer script stopped before its end (it exited with exit status: 1) after 3 cases".into(),
            });
        }
        assert_eq!(resume_error(&finished, &j, "NVIDIA H200"), "");

        let mut other = done;
        other.rigbench_version = "0.0.0-other".into();
        let e = resume_error(&other, &j, "NVIDIA H200");
        assert!(e.contains("rigbench 0.0.0-other"), "{e}");
    }
}
