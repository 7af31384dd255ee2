//! The main job's orchestration, shared by `rigbench report` and `rigbench kernels`: probe the rig,
//! run the requested parts, and write the report folder incrementally (results.json and
//! kernels.csv after every case; report.md and plots at the end, or from a saved results.json
//! with `rigbench report --render`).
//!
//! What a job runs is [`Job`] (`options.rs`); this file runs its parts in order and opens the
//! report folder. The parts themselves are in `parts.rs`; continuing an interrupted report
//! (`report --resume`) in `resume.rs`; saving results.json as it goes and skipping what a signal
//! stopped in `progress.rs`; writing report.md and the plots in `render.rs`.

mod options;
mod parts;
mod progress;
mod render;
mod resume;

use super::folder::ReportDir;
use super::schema::{Results, Skip};
use parts::{
    bench_kernels, inspect_checkpoint, measure_interconnect, record_kernels_without_gpu,
    run_e2e_part, run_quality, run_runtime_section,
};
use progress::{save, skip_if_interrupted};
use resume::{resume_peers, resumed_results};

pub use options::Job;
pub use parts::e2e_failure;
pub use render::render_into;
pub use resume::resumable;

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
