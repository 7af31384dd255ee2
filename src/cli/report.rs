//! `rigbench report`: the main job. Rig probe, the CPU accuracy study, the kernel suite (when a
//! GPU is present), the checkpoint inspection (`--checkpoint DIR`) and the end-to-end runs against
//! the built-in runtime, written to `reports/<rig-label>/<UTC timestamp>/`.

use std::path::PathBuf;

use crate::cli::kernels::KernelSelection;
use crate::report::job::{self, Job};
use crate::{ExitStatus, RigError};

/// Arguments of `rigbench report`.
#[derive(Debug, clap::Args)]
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
    /// Also inspect this checkpoint folder (config.json, quantization metadata, safetensors headers).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Do not redact host names, user paths, IP addresses and tokens.
    #[arg(long)]
    pub no_redact: bool,
    /// Replace a report already in --out (it is replaced only once this run has measured
    /// something; without --force such a folder is refused).
    #[arg(long)]
    pub force: bool,
    /// Also save the results as the baseline for this rig and suite
    /// (`<baselines-dir>/<rig-label>/<suite>.json`), the file `rigbench compare --baseline-dir` reads.
    #[arg(long)]
    pub save_baseline: bool,
    /// Folder of baselines for `--save-baseline`.
    #[arg(long, default_value = "baselines")]
    pub baselines_dir: PathBuf,
    /// Re-render report.md, kernels.csv and plots from an existing results.json (or its folder)
    /// instead of measuring.
    #[arg(long, value_name = "RESULTS")]
    pub render: Option<PathBuf>,
}

/// Run `rigbench report`.
pub fn run(args: ReportArgs) -> anyhow::Result<ExitStatus> {
    if let Some(p) = &args.render {
        let file = if p.is_dir() {
            p.join("results.json")
        } else {
            p.clone()
        };
        let results = crate::report::Results::load(&file)?;
        let source = file
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .to_path_buf();
        let target = args.out.clone().unwrap_or_else(|| source.clone());
        let same = target.canonicalize().ok() == source.canonicalize().ok();
        let dir = if same {
            // In place: keep results.json (creating the folder afresh would clear it).
            crate::report::output::ReportDir::existing(&target, !args.no_redact)
        } else {
            let d = crate::report::output::ReportDir::create(
                Some(&target),
                &results.rig_label,
                !args.no_redact,
                args.force,
            )?;
            d.write_results(&results)?;
            d
        };
        if let Some(k) = &results.kernels {
            dir.write_text("kernels.csv", &crate::kernels::render::csv(k)?)?;
        }
        job::render_into(&dir, &results)?;
        if same {
            dir.redact_direct_writes()?;
        } else {
            dir.commit()?;
        }
        eprintln!("rigbench: re-rendered {}", dir.path.display());
        return Ok(ExitStatus::Ok);
    }
    if let Some(l) = &args.rig_label {
        if l.is_empty() || l.contains(['/', '\\']) || l.starts_with('.') {
            return Err(RigError::flag(
                "--rig-label",
                "use letters, digits, '-', '_' and '.'; no slashes",
            )
            .into());
        }
    }
    if let Some(c) = &args.checkpoint {
        if !c.is_dir() {
            return Err(
                RigError::flag("--checkpoint", format!("{} is not a folder", c.display())).into(),
            );
        }
    }
    let kernels = if args.no_kernels {
        None
    } else {
        Some(args.sel.resolve()?)
    };
    if args.save_baseline {
        // Refuse a baseline name that cannot be written before measuring anything.
        let suite = kernels
            .as_ref()
            .map(|k| k.suite.name.clone())
            .unwrap_or_else(|| "no-kernels".into());
        crate::compare::baseline_path(
            &args.baselines_dir,
            args.rig_label.as_deref().unwrap_or("rig"),
            &suite,
        )?;
    }
    // SIGINT/SIGTERM stop the run after the case in flight and write what was measured.
    crate::signals::install()?;
    let results = job::run(Job {
        kernels,
        accuracy: true,
        checkpoint: args.checkpoint.clone(),
        e2e: if args.no_e2e {
            None
        } else {
            Some(crate::e2e::E2eOptions::default_for_report())
        },
        out: args.out.clone(),
        rig_label: args.rig_label.clone(),
        redact: !args.no_redact,
        force: args.force,
        write_files: true,
        disabled: [
            (args.no_kernels, "kernels", "--no-kernels"),
            (args.no_e2e, "e2e", "--no-e2e"),
        ]
        .iter()
        .filter(|(off, _, _)| *off)
        .map(|(_, what, flag)| crate::report::Skip {
            what: what.to_string(),
            reason: format!("not requested ({flag})"),
        })
        .collect(),
        devices: args.sel.devices.clone(),
        interconnect: true,
    })?;
    if let Some(why) = &results.interrupted {
        let timed = results.kernels.as_ref().map(|k| k.cases.len()).unwrap_or(0);
        eprintln!(
            "rigbench: report INTERRUPTED ({why}): {timed} kernel cases timed; report.md and results.json hold what was measured{}",
            if args.save_baseline { " (no baseline saved from an interrupted run)" } else { "" }
        );
        return Ok(ExitStatus::Error);
    }
    if args.save_baseline {
        let suite = results
            .kernels
            .as_ref()
            .map(|k| k.suite.name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "no-kernels".into());
        let path = crate::compare::save_baseline(&results, &args.baselines_dir, &suite)?;
        eprintln!("rigbench: baseline saved to {}", path.display());
    }
    let timed = results.kernels.as_ref().map(|k| k.cases.len()).unwrap_or(0);
    let lint = results
        .checkpoint
        .as_ref()
        .filter(|c| c.has_errors())
        .map(|_| "; the checkpoint has lint errors (see its findings; `rigbench inspect` exits 4 on them)")
        .unwrap_or("");
    eprintln!(
        "rigbench: report complete: {timed} kernel cases timed, {} parts skipped (see report.md){lint}",
        results.skipped.len()
    );
    Ok(ExitStatus::Ok)
}
