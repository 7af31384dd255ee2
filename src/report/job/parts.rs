//! The parts of a job, each run into the results: the kernel benches (or their skip without a
//! GPU), the fidelity study, the interconnect, the checkpoint inspection, the built-in runtime's
//! section and the end-to-end runs, with how an e2e part failed ([`e2e_failure`]).

use super::options::Job;
use super::progress::save;
use crate::kernels::bench::BenchOptions;
use crate::report::folder::ReportDir;
use crate::report::schema::{Results, Skip};

/// No GPU: the kernel part is skipped with `reason`, said in the results and in the kernel
/// section itself.
pub(super) fn record_kernels_without_gpu(opts: &BenchOptions, reason: &str, results: &mut Results) {
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
pub(super) fn bench_kernels(
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
    let (outcome, other_kernels) =
        crate::report::multigpu::bench_devices(opts, &others, |others_now| {
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
pub(super) fn run_quality(results: &mut Results, runtime_model: &str) {
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
pub(super) fn measure_interconnect(
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
        crate::report::multigpu::interconnect(
            devices,
            model.as_ref(),
            peers,
            &mut mg,
            &mut skipped,
        );
        results.multi_gpu = Some(mg);
        results.skipped.extend(skipped);
        match crate::report::multigpu::tp_prediction(results, model.as_ref()) {
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
pub(super) fn inspect_checkpoint(path: &std::path::Path, results: &mut Results) {
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
pub(super) fn run_runtime_section(
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
pub(super) fn run_e2e_part(
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
