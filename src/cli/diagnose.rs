//! `rigbench diagnose`: see the module docs of `crate::diagnose` for what it finds.
//!
//! Writes the findings as Markdown to stdout (or JSON with `--json`); with `--out DIR` also
//! `DIR/diagnose.md` and `DIR/diagnose.json`. Exit codes: 0 no error-level finding; 4
//! ([`ExitStatus::LintErrors`]) at least one; 1 an unreadable input file or checkpoint; 64 a bad
//! flag value.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::diagnose::{
    self, build_findings, checkpoint_facts, parse_metrics, parse_sse, Card, Diagnosis, LogInput,
};
use crate::gpu::ComputeCapability;
use crate::output::redact::Redactor;
use crate::{ExitStatus, RigError};

/// Arguments of `rigbench diagnose`.
#[derive(Debug, clap::Args)]
#[command(after_help = crate::cli::help::after_help(crate::cli::help::Cmd::Diagnose))]
pub struct DiagnoseArgs {
    /// An engine log (vLLM V0/V1, SGLang, llama.cpp llama-server, TensorRT-LLM), as saved or
    /// pasted; any line prefix (docker, journald, kubectl, process tags) is fine. Repeatable.
    #[arg(long = "log", value_name = "FILE")]
    pub logs: Vec<PathBuf>,
    /// A `/metrics` scrape (Prometheus text, or a pasted query table). Repeatable; with two
    /// or more of one engine, counters are also compared between the first and the last.
    #[arg(long = "metrics", value_name = "FILE")]
    pub metrics: Vec<PathBuf>,
    /// A captured streaming response (`data: {...}` lines), for the per-request
    /// speculative-decoding object newer vLLM puts in the last chunk. Repeatable.
    #[arg(long = "sse", value_name = "FILE")]
    pub sse: Vec<PathBuf>,
    /// The text of `nvidia-smi -q` (clocks, clock event reasons, power limit, ECC, memory), taken
    /// during the run; with --rig its figures are the conditions of that report. Repeatable.
    #[arg(long = "nvidia-smi", value_name = "FILE")]
    pub nvidia_smi: Vec<PathBuf>,
    /// The checkpoint folder (config.json, hf_quant_config.json, and the safetensors headers or
    /// index when present), or hf://ORG/NAME[@REV], to explain fallbacks and KV scales.
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,
    /// The card's compute capability (sm_90, sm_100, 12.0, ...).
    #[arg(long, value_name = "CC", conflicts_with = "rig")]
    pub cc: Option<String>,
    /// The engine and version (vllm==0.34, sglang==0.5.9) for logs that do not state their
    /// version (SGLang's do not), so the log is joined with the prediction of "what will run";
    /// a version the log states comes first.
    #[arg(long, value_name = "ENGINE==VERSION")]
    pub engine: Option<String>,
    /// Take the card from a rigbench results.json (or a report folder holding one).
    #[arg(long, value_name = "FILE")]
    pub rig: Option<PathBuf>,
    /// Also write diagnose.md and diagnose.json into this folder (a folder that holds an earlier
    /// diagnosis is refused without --force).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Replace an earlier diagnosis in --out.
    #[arg(long, requires = "out")]
    pub force: bool,
    /// Print JSON instead of Markdown.
    #[arg(long)]
    pub json: bool,
    /// Do not redact host names, user paths and IP addresses.
    #[arg(long)]
    pub no_redact: bool,
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, RigError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            return Err(RigError::file(
                path,
                format!("is a folder; give the {what} file"),
            ))
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(RigError::file(path, format!("{what} not found")))
        }
        Err(e) => return Err(RigError::file(path, format!("cannot open {what}: {e}"))),
    }
    std::fs::read(path).map_err(|e| RigError::file(path, format!("cannot read {what}: {e}")))
}

fn name_of(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

/// The card from `--rig`: a results.json, or a report folder holding one.
fn card_from_results(path: &Path) -> Result<Card, RigError> {
    let file = if path.is_dir() {
        path.join("results.json")
    } else {
        path.to_path_buf()
    };
    let bytes = read(&file, "rigbench results (--rig)")?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
        RigError::file(
            &file,
            format!("not a rigbench results.json (invalid JSON: {e}); give the results.json of a `rigbench report`, or use --cc"),
        )
    })?;
    let cc = v
        .pointer("/rig/gpu/compute_capability")
        .filter(|c| !c.is_null())
        .ok_or_else(|| {
            RigError::file(
                &file,
                "holds no GPU compute capability (a run without a GPU?); give the card with --cc sm_XX",
            )
        })?;
    let cc: ComputeCapability = serde_json::from_value(cc.clone()).map_err(|e| {
        RigError::file(
            &file,
            format!("rig.gpu.compute_capability is malformed: {e}"),
        )
    })?;
    let name = v
        .pointer("/rig/gpu/name")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("GPU");
    Ok(Card {
        cc,
        source: format!("{name}, --rig {}", name_of(&file)),
    })
}

/// The report `--rig` names and when it was created (`created_utc` of its results.json), for
/// joining an `nvidia-smi -q` snapshot with it; `None` when the file does not say.
fn report_timing(path: &Path) -> Option<String> {
    let file = if path.is_dir() {
        path.join("results.json")
    } else {
        path.to_path_buf()
    };
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).ok()?).ok()?;
    let created = v.get("created_utc")?.as_str()?;
    Some(format!("the report {} (created {created})", name_of(&file)))
}

/// Read every input and build the diagnosis.
///
/// # Errors
/// An input file that cannot be read, a checkpoint `inspect` refuses, a bad `--cc`/`--rig`, or
/// no input at all (a flag error).
pub fn diagnose(args: &DiagnoseArgs) -> anyhow::Result<Diagnosis> {
    if args.logs.is_empty()
        && args.metrics.is_empty()
        && args.sse.is_empty()
        && args.nvidia_smi.is_empty()
    {
        return Err(RigError::flag(
            "--log",
            "nothing to diagnose: give at least one --log FILE, --metrics FILE, --sse FILE or --nvidia-smi FILE",
        )
        .into());
    }
    let card = match (&args.cc, &args.rig) {
        (Some(c), _) => Some(Card {
            cc: crate::rig::capability::parse_card(c).map_err(|e| RigError::flag("--cc", e))?,
            source: "--cc".into(),
        }),
        (None, Some(r)) => Some(card_from_results(r)?),
        (None, None) => None,
    };
    let engine = args
        .engine
        .as_deref()
        .map(str::parse::<crate::checkpoint::predict::EngineSpec>)
        .transpose()
        .map_err(|e| RigError::flag("--engine", e))?;
    let mut d = Diagnosis {
        card,
        engine,
        timing: args.rig.as_deref().and_then(report_timing),
        ..Default::default()
    };
    for p in &args.nvidia_smi {
        let bytes = read(p, "nvidia-smi -q text (--nvidia-smi)")?;
        d.nvidia_smi.push(diagnose::nvidia_smi::parse(
            &name_of(p),
            &String::from_utf8_lossy(&bytes),
        ));
    }
    for p in &args.logs {
        let bytes = read(p, "engine log (--log)")?;
        d.logs.push(LogInput {
            name: name_of(p),
            log: diagnose::log::EngineLog::parse_bytes(&bytes),
        });
    }
    for p in &args.metrics {
        let bytes = read(p, "metrics scrape (--metrics)")?;
        d.metrics.push(parse_metrics(&name_of(p), &bytes));
    }
    for p in &args.sse {
        let bytes = read(p, "captured stream (--sse)")?;
        d.sse
            .push(parse_sse(&name_of(p), &String::from_utf8_lossy(&bytes)));
    }
    if let Some(dir) = &args.checkpoint {
        let hub = super::inspect::fetch_hub(dir)?;
        let local = hub.as_ref().map_or(dir.as_path(), |(t, _)| t.path());
        let mut facts = checkpoint_facts(local, d.card.as_ref().map(|c| c.cc))
            .with_context(|| format!("reading the checkpoint {} (--checkpoint)", dir.display()))?;
        if let Some((_, r)) = &hub {
            facts.dir = r.to_string();
        }
        d.checkpoint = Some(facts);
    }
    d.findings = build_findings(&d);
    Ok(d)
}

/// The files `--out` receives.
const OUT_FILES: [&str; 2] = ["diagnose.md", "diagnose.json"];

/// `--out DIR` must not hold an earlier diagnosis unless `--force` is given (as `report`, `e2e`
/// and `kernels` refuse a folder that holds a report).
///
/// # Errors
/// [`RigError::BadFlag`] naming `--out`, the file found and the fix.
pub fn check_out(out: &Path, force: bool) -> Result<(), RigError> {
    if force {
        return Ok(());
    }
    if let Some(f) = OUT_FILES.iter().map(|f| out.join(f)).find(|p| p.exists()) {
        return Err(RigError::flag(
            "--out",
            format!(
                "{} holds an earlier diagnosis ({}): pass --force to replace it, or choose another folder",
                out.display(),
                f.display()
            ),
        ));
    }
    Ok(())
}

/// Run `rigbench diagnose`: 0 without error findings, 4 with.
pub fn run(args: DiagnoseArgs) -> anyhow::Result<ExitStatus> {
    if let Some(out) = &args.out {
        check_out(out, args.force)?;
    }
    let mut d = diagnose(&args)?;
    // Redaction applies to what the inputs supplied, never to rigbench's own words: the inputs
    // are redacted and the findings rebuilt from them.
    let redactor = Redactor::for_this_host(!args.no_redact);
    if redactor.enabled() {
        diagnose::redact_inputs(&mut d, &|s: &str| redactor.redact(s));
        d.findings = build_findings(&d);
    }
    let md = diagnose::render::render_markdown(&d);
    let json = serde_json::to_value(&d)?;
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out)
            .map_err(|e| RigError::file(out, format!("cannot create the --out folder: {e}")))?;
        crate::output::write::atomic_write(&out.join("diagnose.md"), md.as_bytes())?;
        crate::output::write::atomic_write_json(&out.join("diagnose.json"), &json)?;
        eprintln!(
            "wrote {} and {}",
            out.join("diagnose.md").display(),
            out.join("diagnose.json").display()
        );
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print!("{md}");
    }
    Ok(if d.has_errors() {
        ExitStatus::LintErrors
    } else {
        ExitStatus::Ok
    })
}
