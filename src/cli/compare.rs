//! `rigbench compare`: see the module docs of [`crate::compare`] for what it does.
//!
//! Output: the Markdown table on stdout (or JSON with `--json`), also written to `--markdown
//! FILE` and appended to `$GITHUB_STEP_SUMMARY` when that variable is set; a one-line summary
//! on stderr. Exit codes: 0 no regression, 2 regression or missing metric, 3 baseline missing
//! or unusable, 1 error.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::compare::confirm::DEFAULT_CONFIRM_REPEATS;
use crate::compare::verdict::{parse_percent, Plant};
use crate::compare::{self, render, Comparison, MetricThreshold, RunInfo, Settings};
use crate::output::redact::Redactor;
use crate::report::Results;
use crate::{ExitStatus, RigError};

fn percent_arg(s: &str) -> Result<f64, String> {
    parse_percent(s)
}

fn confidence_arg(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("'{s}' is not a percentage (e.g. 99)"))?;
    if !(50.0..100.0).contains(&v) {
        return Err(format!(
            "'{s}': confidence must be at least 50 and below 100 percent"
        ));
    }
    Ok(v / 100.0)
}

fn repeats_arg(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=100).contains(&n) => Ok(n),
        _ => Err(format!("'{s}': use a whole number from 1 to 100")),
    }
}

/// The environment variable that allows the test hooks (`--plant`).
pub const TEST_HOOKS_ENV: &str = "RIGBENCH_TEST_HOOKS";

/// Arguments of `rigbench compare`.
#[derive(Debug, clap::Args)]
#[command(
    group(clap::ArgGroup::new("baseline_source").required(true).args(["baseline", "baseline_dir"])),
    after_help = crate::cli::help::after_help(crate::cli::help::Cmd::Compare)
)]
pub struct CompareArgs {
    /// The results to judge: a results.json, or a report folder that holds one.
    #[arg(value_name = "RESULTS")]
    pub results: PathBuf,
    /// The baseline: a results.json in the results schema (e.g. baselines/<rig>/<suite>.json), or
    /// a report folder that holds one.
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,
    /// A folder of baselines: picks DIR/<rig label of RESULTS>/<suite>.json.
    #[arg(long, alias = "baselines-dir", value_name = "DIR")]
    pub baseline_dir: Option<PathBuf>,
    /// Suite whose baseline --baseline-dir picks (default: the suite recorded in RESULTS).
    #[arg(long, value_name = "NAME", requires = "baseline_dir")]
    pub suite: Option<String>,
    /// Noise threshold of kernel timings, in percent.
    #[arg(long, value_name = "PERCENT", default_value = "2", value_parser = percent_arg)]
    pub threshold_kernels: f64,
    /// Noise threshold of end-to-end (all non-kernel) timings, in percent.
    #[arg(long, value_name = "PERCENT", default_value = "5", value_parser = percent_arg)]
    pub threshold_e2e: f64,
    /// Threshold for the timing metrics whose id matches GLOB (`*` any characters, `?` one),
    /// in percent; repeatable, the last match wins. E.g. `kernels/*/w4a4/*=5`.
    #[arg(
        long = "threshold-metric",
        alias = "metric-threshold",
        value_name = "GLOB=PERCENT"
    )]
    pub metric_threshold: Vec<MetricThreshold>,
    /// Family-wise confidence, in percent: the chance that every timing interval of the
    /// comparison covers its true change (each is built at 1 − (1 − confidence)/m).
    #[arg(long, value_name = "PERCENT", default_value = "95", value_parser = confidence_arg)]
    pub confidence: f64,
    /// Re-measure the kernel cases that regressed with this binary (needs the GPU the results
    /// came from) and keep a regression only when it reproduces.
    #[arg(long)]
    pub confirm: bool,
    /// Repeats of the --confirm re-measurement.
    #[arg(long, value_name = "R", default_value_t = DEFAULT_CONFIRM_REPEATS,
          value_parser = repeats_arg, requires = "confirm")]
    pub confirm_repeats: usize,
    /// Test hook for measuring the gate's detection rate: multiply the samples of the results'
    /// timing metrics matching GLOB by 1 + PERCENT/100 (and their --confirm re-measurements).
    /// Refused unless RIGBENCH_TEST_HOOKS=1; the output says it was used.
    #[arg(long, value_name = "GLOB=PERCENT", hide = true)]
    pub plant: Vec<Plant>,
    /// Compute verdicts even when the rigs differ in GPU, compute capability or driver major
    /// version (the mismatch is still shown); without it a mismatch exits 3.
    #[arg(long)]
    pub allow_rig_mismatch: bool,
    /// Compare only metrics whose verdict does not depend on timing (values and labels:
    /// correctness errors, reference accuracy, lint findings, module formats, KV capacity,
    /// request and token counts, validity); timing metrics are listed once as not compared,
    /// never as missing. For CI on a host other than the baseline's (e.g. a CPU-only runner).
    #[arg(long)]
    pub deterministic_only: bool,
    /// Print JSON (every row, counts, rig check, settings, exit code) instead of Markdown.
    #[arg(long)]
    pub json: bool,
    /// Also write the Markdown to FILE.
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
    /// Do not redact host name, user paths and IP addresses in the output.
    #[arg(long)]
    pub no_redact: bool,
}

/// `path` itself, or `path/results.json` when `path` is a folder.
fn results_file(path: &Path) -> Result<PathBuf, RigError> {
    if path.is_dir() {
        let f = path.join("results.json");
        if f.is_file() {
            Ok(f)
        } else {
            Err(RigError::file(
                path,
                "is a folder without a results.json; pass a report folder or its results.json",
            ))
        }
    } else if path.is_file() {
        Ok(path.to_path_buf())
    } else {
        Err(RigError::file(
            path,
            "no such file or folder; pass a results.json or a report folder",
        ))
    }
}

/// Run `rigbench compare`.
///
/// # Errors
/// The results cannot be read (exit 1), the suite cannot be told, or an output cannot be
/// written. A missing or unusable baseline is not an error: it is reported and exits 3.
pub fn run(args: CompareArgs) -> anyhow::Result<ExitStatus> {
    let settings = Settings {
        threshold_kernels: args.threshold_kernels,
        threshold_e2e: args.threshold_e2e,
        metric_thresholds: args.metric_threshold.clone(),
        confidence: args.confidence,
        deterministic_only: args.deterministic_only,
        plants: args.plant.clone(),
    };
    if !settings.plants.is_empty() && std::env::var(TEST_HOOKS_ENV).as_deref() != Ok("1") {
        return Err(RigError::flag(
            "--plant",
            format!("a test hook for measuring the gate (it changes the results' samples); set {TEST_HOOKS_ENV}=1 to use it"),
        )
        .into());
    }
    if let Some(f) = &args.markdown {
        // A typo in the folder must not create a tree of folders silently; checked before the
        // comparison so nothing computed is lost to it.
        let parent = f
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if !parent.is_dir() {
            return Err(RigError::file(
                parent,
                format!(
                    "the folder of --markdown {} does not exist; create it first or choose another path",
                    f.display()
                ),
            )
            .into());
        }
    }
    let results_path = results_file(&args.results)?;
    let current = Results::load(&results_path).context("cannot read the results to compare")?;
    let cinfo = RunInfo::of(&current, &results_path);

    let comparison = match baseline_file(&args, &current)? {
        Err(problem) => Comparison::unusable(cinfo, None, &settings, problem),
        Ok(bpath) => match Results::load(&bpath) {
            Err(e) => Comparison::unusable(
                cinfo,
                None,
                &settings,
                format!("the baseline cannot be used: {e}"),
            ),
            Ok(baseline) => {
                let mut c = compare::compare(
                    &baseline,
                    &bpath,
                    &current,
                    &results_path,
                    &settings,
                    args.allow_rig_mismatch,
                );
                if args.confirm && c.problem.is_none() {
                    compare::confirm::confirm(
                        &mut c,
                        &baseline,
                        &current,
                        &settings,
                        args.confirm_repeats,
                        &mut compare::confirm::gpu_measure,
                    );
                }
                c
            }
        },
    };
    emit(&args, &comparison)?;
    Ok(comparison.status())
}

/// The baseline file to read: `Ok(Ok(path))`, or `Ok(Err(problem))` when it is missing (exit 3).
fn baseline_file(args: &CompareArgs, current: &Results) -> anyhow::Result<Result<PathBuf, String>> {
    if let Some(f) = &args.baseline {
        let f = if f.is_dir() && f.join("results.json").is_file() {
            f.join("results.json")
        } else {
            f.clone()
        };
        return Ok(if f.is_file() {
            Ok(f)
        } else {
            Err(format!(
                "baseline {} does not exist; create one with `rigbench report --save-baseline`",
                f.display()
            ))
        });
    }
    let Some(dir) = &args.baseline_dir else {
        // clap's argument group makes one of the two required.
        return Err(
            RigError::flag("--baseline", "pass --baseline FILE or --baseline-dir DIR").into(),
        );
    };
    let suite = match (&args.suite, compare::results_suite(current)) {
        (Some(s), _) => s.clone(),
        (None, Some(s)) => s,
        // `report --no-kernels --save-baseline` saves under this name: find it the same way.
        (None, None) => "no-kernels".to_string(),
    };
    let expected = compare::baseline_path(dir, &current.rig_label, &suite)?;
    Ok(
        match compare::find_baseline(dir, &current.rig_label, &suite)? {
            Some(p) => Ok(p),
            None => {
                let present = compare::list_baselines(dir);
                Err(format!(
                "no baseline for rig '{}' and suite '{suite}': expected {}; baselines present under {}: {}. Create one on this rig with `rigbench report --save-baseline`",
                current.rig_label,
                expected.display(),
                dir.display(),
                if present.is_empty() {
                    "none".to_string()
                } else {
                    present.join(", ")
                }
            ))
            }
        },
    )
}

/// Print and write the outputs.
fn emit(args: &CompareArgs, c: &Comparison) -> anyhow::Result<()> {
    let redactor = if args.no_redact {
        Redactor::disabled()
    } else {
        Redactor::for_this_host(true)
    };
    let md = redactor.redact(&render::markdown(c));
    if args.json {
        let mut v = serde_json::to_value(c).context("cannot serialize the comparison")?;
        redactor.redact_json(&mut v);
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{md}");
    }
    if let Some(f) = &args.markdown {
        crate::output::write::atomic_write(f, md.as_bytes())
            .with_context(|| format!("cannot write --markdown {}", f.display()))?;
    }
    eprintln!(
        "rigbench compare: {} (exit {})",
        c.summary_line(),
        c.status().code()
    );
    if let Some(summary) = std::env::var_os("GITHUB_STEP_SUMMARY").filter(|s| !s.is_empty()) {
        let path = PathBuf::from(summary);
        let res = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{md}\n").as_bytes()));
        if let Err(e) = res {
            eprintln!(
                "warning: cannot append to $GITHUB_STEP_SUMMARY ({}): {e}",
                path.display()
            );
        }
    }
    Ok(())
}
