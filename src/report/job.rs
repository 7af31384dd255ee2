//! The main job's orchestration, shared by `rigbench report` and `rigbench kernels`: probe the rig,
//! run the requested parts, and write the report folder incrementally (results.json and
//! kernels.csv after every case; report.md and plots at the end, or from a saved results.json
//! with `rigbench report --render`).

use std::path::PathBuf;

use super::output::ReportDir;
use super::schema::{Results, Skip};
use crate::kernels::bench::BenchOptions;

/// What to run.
pub struct Job {
    /// Kernel benches (run only with a GPU).
    pub kernels: Option<BenchOptions>,
    /// The CPU reference accuracy study of each format (runs everywhere).
    pub accuracy: bool,
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
    let rig = crate::rig::probe();
    let label = job.rig_label.clone().unwrap_or_else(|| rig.label());
    let command_line = std::env::args().collect::<Vec<_>>().join(" ");
    let mut results = Results::new(rig, label.clone(), command_line);
    let dir = if job.write_files {
        let d = ReportDir::create(job.out.as_deref(), &label, job.redact, job.force)?;
        if d.staged() {
            eprintln!(
                "rigbench: writing report to {} (moved to {} at the end)",
                d.path.display(),
                d.target.display()
            );
        } else {
            eprintln!("rigbench: writing report to {}", d.path.display());
        }
        Some(d)
    } else {
        None
    };
    let save = |r: &Results| -> anyhow::Result<()> {
        if let Some(d) = &dir {
            d.write_results(r)?;
            if let Some(k) = &r.kernels {
                d.write_text("kernels.csv", &crate::kernels::render::csv(k)?)?;
            }
        }
        Ok(())
    };
    save(&results)?;

    // Resolve --devices before measuring anything (a device the machine lacks is a flag error).
    let devices = job.devices.resolve(results.rig.gpus.len())?;
    if let Some(why) = crate::multigpu::run::single_gpu_reason(
        &devices,
        results.rig.gpus.len(),
        results.rig.gpu_absent_reason.as_deref(),
    ) {
        results.skipped.push(Skip {
            what: "multi-gpu".into(),
            reason: why,
        });
    } else {
        results.multi_gpu = Some(crate::multigpu::MultiGpuResults {
            devices: devices.clone(),
            ..Default::default()
        });
    }

    results.skipped.extend(job.disabled.iter().cloned());
    if job.accuracy && !skip_if_interrupted(&mut results, "accuracy") {
        eprintln!("rigbench: CPU accuracy study of each format");
        let acc = crate::kernels::accuracy::study();
        results
            .kernels
            .get_or_insert_with(Default::default)
            .reference_accuracy = acc;
        save(&results)?;
    }

    if let Some(opts) = job
        .kernels
        .as_ref()
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
        } else {
            eprintln!(
                "rigbench: kernels: suite {}, {} × {} × {} cases (a progress bar shows on a terminal)",
                opts.suite.name,
                crate::report::table::plural(opts.suite.shapes.len() as u64, "shape", "shapes"),
                crate::report::table::plural(opts.suite.m.len() as u64, "M value", "M values"),
                crate::report::table::plural(opts.formats.len() as u64, "format", "formats"),
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
            let (outcome, other_kernels) =
                crate::multigpu::run::bench_devices(opts, &others, |others_now| {
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
                            if let Err(e) = save(&results) {
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
                    if skip_if_interrupted(&mut results, "kernels/peers") {
                    } else if first != 0 && opts.peers != crate::kernels::peers::PeerMode::Off {
                        k.notes.push(format!("peers not run: they run on CUDA device 0, and the first device selected is {first}"));
                    }
                    results.kernels = Some(k);
                }
                Err(e) => results.skipped.push(Skip {
                    what: "kernels".into(),
                    reason: format!("the kernel bench stopped: {e:#} (cases measured before the error are kept)"),
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
            save(&results)?;
            if let (Some(d), Some(mg)) = (&dir, &results.multi_gpu) {
                for dk in &mg.device_kernels {
                    if let Some(k) = &dk.kernels {
                        d.write_text(
                            &format!("kernels_gpu{}.csv", dk.device),
                            &crate::kernels::render::csv(k)?,
                        )?;
                    }
                }
            }
        }
    }

    if job.interconnect {
        let model = job.kernels.as_ref().and_then(|o| o.suite.model.clone());
        let peers = job
            .kernels
            .as_ref()
            .map(|o| o.peers)
            .unwrap_or(crate::kernels::peers::PeerMode::Auto);
        if let Some(mut mg) = results.multi_gpu.take() {
            let mut skipped = Vec::new();
            crate::multigpu::run::interconnect(
                &devices,
                model.as_ref(),
                peers,
                &mut mg,
                &mut skipped,
            );
            results.multi_gpu = Some(mg);
            results.skipped.extend(skipped);
            match crate::multigpu::run::tp_prediction(&results, model.as_ref()) {
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
            save(&results)?;
        }
    }

    if let Some(path) = job
        .checkpoint
        .as_ref()
        .filter(|_| !skip_if_interrupted(&mut results, "checkpoint"))
    {
        eprintln!("rigbench: inspecting checkpoint {}", path.display());
        let opts = crate::checkpoint::InspectOptions::from_rig(&results.rig);
        match crate::checkpoint::inspect(path, &opts) {
            Ok(r) => results.checkpoint = Some(r),
            Err(e) => results.skipped.push(Skip {
                what: "checkpoint".into(),
                reason: format!("{e:#}"),
            }),
        }
        save(&results)?;
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
        // The built-in runtime on the GPU: parity first, then BF16, FP8 and W4A16.
        let o = crate::runtime::report::RuntimeReportOptions {
            model: job.runtime_model.clone(),
            device,
            seed: 0,
            e2e: opts.clone(),
            bench: crate::runtime::bench::RuntimeBenchSpec::issue_targets(),
            gpu_memory_bytes: results.rig.gpu.as_ref().map(|g| g.memory_bytes),
        };
        let section = crate::runtime::report::run_gpu(&o, results.kernels.as_ref());
        if let Some(d) = &dir {
            for f in &section.formats {
                if let Some(e) = &f.e2e {
                    let sub = d.path.join(crate::runtime::report::e2e_dir(&f.format));
                    std::fs::create_dir_all(&sub)?;
                    crate::e2e::report::write_csv(e, &sub)?;
                    if let Some(log) = &e.engine_log {
                        d.write_text(&format!("e2e-{}/engine.log", f.format), log)?;
                    }
                }
            }
        }
        results.runtime = Some(section);
        save(&results)?;
    } else if let Some(opts) = &e2e_job {
        let mut opts = opts.clone();
        if let crate::e2e::launcher::EngineChoice::Builtin { args, .. } = &mut opts.engine {
            // The CPU backend, stated, so that a GPU rig's default does not apply.
            args.extend(["--device".to_string(), "cpu".to_string()]);
        }
        let outcome = crate::e2e::run_for_report(&opts).map(|mut r| {
            if builtin && gpu_rig {
                r.self_test = Some("harness self-test (CPU)".into());
            }
            r
        });
        match outcome {
            Ok(mut r) => {
                crate::e2e::parallel::annotate(&mut r, &results.rig, None);
                if let Some(d) = &dir {
                    crate::e2e::report::write_csv(&r, &d.path)?;
                    if let Some(log) = &r.engine_log {
                        d.write_text("engine.log", log)?;
                    }
                }
                results.e2e = Some(r)
            }
            Err(e) => {
                // An engine that failed to start: its log is the evidence; keep it.
                let failed = e.downcast_ref::<crate::e2e::launcher::EngineStartFailure>();
                if let (Some(d), Some(f)) = (&dir, failed) {
                    if !f.log.trim().is_empty() {
                        d.write_text("engine.log", &f.log)?;
                    }
                }
                results.skipped.push(Skip {
                    what: "e2e".into(),
                    reason: format!("{e:#}"),
                })
            }
        }
        save(&results)?;
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
    save(&results)?;
    if let Some(d) = &dir {
        render_into(d, &results)?;
        d.commit()?;
    }
    Ok((results, dir))
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
                let sub = crate::runtime::report::e2e_dir(&f.format);
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
    dir.write_text("report.md", &md)?;
    Ok(())
}
