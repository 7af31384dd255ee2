//! `rigbench quality`: a reference against one or more candidates on the same model
//! (`crate::quality`, docs/quality.md).
//!
//! Sides: `--reference URL` / `--candidate URL` (engines already running), `--reference-cmd` /
//! `--candidate-cmd` (engine commands started one at a time, each listening on `--cmd-url`),
//! and the built-in runtime (`--reference-model` / `--candidate-model` with `--quantize`,
//! `rigbench serve` started as a child). Writes `DIR/results.json` (a `quality_comparison`
//! section), `DIR/quality.md` and `DIR/items.csv` (per-item pass/fail for every side). Exit 0
//! when every side was measured (whatever the verdicts: `compare` decides regressions), 1 when
//! a side could not be measured (what was measured is still written), 64 on a bad command line.

use std::path::PathBuf;
use std::time::Duration;

use crate::e2e::executor::StopSignal;
use crate::e2e::launcher::{EngineChoice, EngineHandle};
use crate::quality::client::{run_side, RunSpec, Sampling, Side, SideRun, Variant};
use crate::quality::verdict::Rules;
use crate::quality::{corpus, tasks, QualityComparison};
use crate::runtime::config::QuantRecipe;
use crate::{ExitStatus, RigError};

const AFTER_HELP: &str = "\
Exit codes: 0 every side measured (the verdicts are in results.json; `rigbench compare` gates on them); 1 a side could not be measured (what was measured is written); 64 a bad command line.

Examples:
  rigbench quality --reference http://127.0.0.1:8000 --candidate http://127.0.0.1:8001 --out q/
  rigbench quality --reference-model m.gguf --quantize fp8 --quantize nvfp4 --limit 64 --out q/
  rigbench quality --reference-cmd 'vllm serve M --dtype bfloat16' --candidate-cmd 'vllm serve M --quantization fp8' --out q/";

/// Arguments of `rigbench quality`.
#[derive(Debug, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub struct QualityArgs {
    /// The reference (A, usually BF16): the base URL of a running OpenAI-compatible engine.
    #[arg(long, value_name = "URL")]
    pub reference: Option<String>,
    /// A candidate (B, C, …): the base URL of a running engine (repeatable).
    #[arg(long, value_name = "URL")]
    pub candidate: Vec<String>,
    /// Start the reference with this command (`sh -c`); it must listen on --cmd-url.
    #[arg(long, value_name = "CMD")]
    pub reference_cmd: Option<String>,
    /// Start a candidate with this command (repeatable; one engine at a time, on --cmd-url).
    #[arg(long, value_name = "CMD")]
    pub candidate_cmd: Vec<String>,
    /// Where the engines of --reference-cmd / --candidate-cmd listen.
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:8000")]
    pub cmd_url: String,
    /// The reference as the built-in runtime (`rigbench serve --model PATH`, weights as stored).
    #[arg(long, value_name = "PATH")]
    pub reference_model: Option<String>,
    /// A candidate as the built-in runtime (repeatable; default: the --reference-model when
    /// --quantize is given).
    #[arg(long, value_name = "PATH")]
    pub candidate_model: Vec<String>,
    /// Quantization of the built-in candidates (bf16, fp8, nvfp4, nvfp4-mixed; repeatable):
    /// paired in order with --candidate-model, or each applied to a single candidate model.
    #[arg(long, value_name = "FORMAT")]
    pub quantize: Vec<QuantRecipe>,
    /// Extra argument of every built-in `rigbench serve` (repeatable, e.g. `--serve-arg=--threads=2`).
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    pub serve_arg: Vec<String>,
    /// The model name to send (default: the first of each side's /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    /// Cap on the corpus positions and on the task items per variant (a quick run).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Alternatives per position (1 to 1,000). Engines cap it: vLLM's and `rigbench serve`'s
    /// `--max-logprobs` (default 20) must be at least this; the built-in sides get it. More
    /// alternatives leave less probability mass in the tail bucket, so the KL is closer to the
    /// exact one (docs/quality.md).
    #[arg(long, default_value_t = 20)]
    pub top_k: usize,
    /// Task pack variants' thinking: off, on, or both.
    #[arg(long, default_value = "off", value_parser = ["off", "on", "both"])]
    pub thinking: String,
    /// Task pack sampling: greedy, seeded, or both.
    #[arg(long, default_value = "greedy", value_parser = ["greedy", "seeded", "both"])]
    pub sampling: String,
    /// Seed base of seeded sampling.
    #[arg(long, default_value_t = 1234)]
    pub seed: u64,
    /// Output tokens of a thinking-off answer.
    #[arg(long, default_value_t = 48)]
    pub max_tokens: u32,
    /// Output tokens of a thinking-on answer (reasoning included).
    #[arg(long, default_value_t = 1024)]
    pub max_tokens_thinking: u32,
    /// Skip the task pack (fidelity only).
    #[arg(long)]
    pub no_tasks: bool,
    /// Significance level of McNemar's test.
    #[arg(long, default_value_t = 0.05)]
    pub alpha: f64,
    /// Smallest pass-rate difference that matters (a tie must have had the power to see it).
    #[arg(long, default_value_t = 0.05)]
    pub min_effect: f64,
    /// Perplexity ratio above 1 + this is a loss.
    #[arg(long, default_value_t = 0.02)]
    pub ppl_margin: f64,
    /// Seconds per request.
    #[arg(long, default_value_t = 600.0)]
    pub request_timeout: f64,
    /// Seconds an engine started here has to become healthy.
    #[arg(long, default_value_t = 600.0)]
    pub startup_timeout: f64,
    /// Write the task pack as JSON lines to FILE and exit (no side is needed).
    #[arg(long, value_name = "FILE")]
    pub dump_tasks: Option<PathBuf>,
    /// Output folder (created): results.json, quality.md, items.csv.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// A side before it is reached: its label, how, and the engine to start or reach.
struct Planned {
    label: String,
    how: String,
    engine: EngineChoice,
}

/// The built-in runtime as a side: `serve --model M [--quantize Q]`, `--max-logprobs` raised to
/// `top_k` when above serve's default (unless `extra` sets it), then `extra`.
fn builtin(model: &str, q: Option<QuantRecipe>, extra: &[String], top_k: usize) -> EngineChoice {
    let mut args = vec!["--model".to_string(), model.to_string()];
    if let Some(q) = q {
        args.push("--quantize".into());
        args.push(q.id().to_string());
    }
    if top_k > crate::runtime::serve_guard::DEFAULT_MAX_LOGPROBS
        && !extra.iter().any(|x| x.starts_with("--max-logprobs"))
    {
        args.push("--max-logprobs".into());
        args.push(top_k.to_string());
    }
    args.extend(extra.iter().cloned());
    EngineChoice::Builtin {
        program: None,
        args,
    }
}

fn plan(a: &QualityArgs) -> Result<(Planned, Vec<Planned>), RigError> {
    let refs = usize::from(a.reference.is_some())
        + usize::from(a.reference_cmd.is_some())
        + usize::from(a.reference_model.is_some());
    if refs != 1 {
        return Err(RigError::flag(
            "--reference",
            "give exactly one of --reference URL, --reference-cmd CMD or --reference-model PATH",
        ));
    }
    let reference = if let Some(u) = &a.reference {
        Planned {
            label: "reference".into(),
            how: format!("url {u}"),
            engine: EngineChoice::Url { url: u.clone() },
        }
    } else if let Some(c) = &a.reference_cmd {
        Planned {
            label: "reference".into(),
            how: format!("command `{c}`"),
            engine: EngineChoice::Command {
                command: c.clone(),
                url: a.cmd_url.clone(),
            },
        }
    } else {
        let m = a.reference_model.clone().unwrap_or_default();
        Planned {
            label: "reference".into(),
            how: format!("rigbench serve --model {m} (as stored)"),
            engine: builtin(&m, None, &a.serve_arg, a.top_k),
        }
    };
    let mut cands = Vec::new();
    for u in &a.candidate {
        cands.push(Planned {
            label: String::new(),
            how: format!("url {u}"),
            engine: EngineChoice::Url { url: u.clone() },
        });
    }
    for c in &a.candidate_cmd {
        cands.push(Planned {
            label: String::new(),
            how: format!("command `{c}`"),
            engine: EngineChoice::Command {
                command: c.clone(),
                url: a.cmd_url.clone(),
            },
        });
    }
    let models: Vec<String> = match (&a.candidate_model[..], &a.reference_model) {
        ([], Some(r)) if !a.quantize.is_empty() => vec![r.clone()],
        (m, _) => m.to_vec(),
    };
    let pairs: Vec<(String, Option<QuantRecipe>)> = match (models.len(), a.quantize.len()) {
        (0, 0) => vec![],
        (0, _) => {
            return Err(RigError::flag(
                "--quantize",
                "needs --candidate-model PATH or --reference-model PATH (the built-in runtime's weights)",
            ))
        }
        (1, q) if q > 1 => a.quantize.iter().map(|q| (models[0].clone(), Some(*q))).collect(),
        (m, 0) => models.iter().map(|p| (p.clone(), None)).take(m).collect(),
        (m, q) if m == q => models.iter().cloned().zip(a.quantize.iter().map(|q| Some(*q))).collect(),
        (m, q) => {
            return Err(RigError::flag(
                "--quantize",
                format!("{q} --quantize for {m} --candidate-model: give one per model, or several for one model"),
            ))
        }
    };
    for (m, q) in pairs {
        let qs = q.map_or("as stored".to_string(), |q| {
            format!("--quantize {}", q.id())
        });
        cands.push(Planned {
            label: String::new(),
            how: format!("rigbench serve --model {m} {qs}"),
            engine: builtin(&m, q, &a.serve_arg, a.top_k),
        });
    }
    if cands.is_empty() {
        return Err(RigError::flag(
            "--candidate",
            "give at least one candidate: --candidate URL, --candidate-cmd CMD, or --candidate-model / --quantize",
        ));
    }
    for (i, c) in cands.iter_mut().enumerate() {
        c.label = format!("candidate-{}", i + 1);
        if let EngineChoice::Builtin { args, .. } = &c.engine {
            if let Some(q) = args.iter().position(|x| x == "--quantize") {
                c.label = format!("candidate-{}-{}", i + 1, args[q + 1]);
            }
        }
    }
    Ok((reference, cands))
}

/// The largest `--top-k`: a bound on the answers' size (some 60 bytes per alternative per
/// position); at 1,000 SmolLM2's tail mass measured 2.2% (docs/quality.md, "Figures").
const MAX_TOP_K: usize = 1000;

fn spec(a: &QualityArgs) -> Result<RunSpec, RigError> {
    if !(1..=MAX_TOP_K).contains(&a.top_k) {
        return Err(RigError::flag(
            "--top-k",
            format!(
                "{} is outside 1..={MAX_TOP_K} (each alternative is one JSON entry, some 60 bytes, per corpus position and side)",
                a.top_k
            ),
        ));
    }
    if a.limit == Some(0) {
        return Err(RigError::flag(
            "--limit",
            "0 measures nothing; leave it out for the whole corpus and pack",
        ));
    }
    let thinking: &[bool] = match a.thinking.as_str() {
        "on" => &[true],
        "both" => &[false, true],
        _ => &[false],
    };
    let sampling: &[Sampling] = match a.sampling.as_str() {
        "seeded" => &[Sampling::Seeded],
        "both" => &[Sampling::Greedy, Sampling::Seeded],
        _ => &[Sampling::Greedy],
    };
    let variants = thinking
        .iter()
        .flat_map(|t| {
            sampling.iter().map(|s| Variant {
                thinking: *t,
                sampling: *s,
            })
        })
        .collect();
    for (flag, v) in [
        ("--request-timeout", a.request_timeout),
        ("--startup-timeout", a.startup_timeout),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(RigError::flag(
                flag,
                format!("{v} is not a positive number of seconds"),
            ));
        }
    }
    Ok(RunSpec {
        limit: a.limit,
        top_k: a.top_k,
        variants,
        seed: a.seed,
        max_tokens_off: a.max_tokens,
        max_tokens_on: a.max_tokens_thinking,
        timeout: Duration::from_secs_f64(a.request_timeout),
        tasks: !a.no_tasks,
    })
}

fn rules(a: &QualityArgs) -> Result<Rules, RigError> {
    let r = Rules {
        alpha: a.alpha,
        min_effect: a.min_effect,
        power: Rules::default().power,
        ppl_margin: a.ppl_margin,
    };
    for (flag, v) in [("--alpha", r.alpha), ("--min-effect", r.min_effect)] {
        if !(v > 0.0 && v < 1.0) {
            return Err(RigError::flag(flag, format!("{v} is outside (0, 1)")));
        }
    }
    if !(r.ppl_margin >= 0.0 && r.ppl_margin.is_finite()) {
        return Err(RigError::flag(
            "--ppl-margin",
            format!("{} is not a non-negative number", r.ppl_margin),
        ));
    }
    Ok(r)
}

/// Start (or reach) `p`, measure it `times` times (the reference twice: the noise floor's
/// second run has no tasks), stop it.
async fn measure(
    p: &Planned,
    model: &Option<String>,
    times: &[bool],
    spec: &RunSpec,
    startup: Duration,
) -> anyhow::Result<Vec<SideRun>> {
    let stop = StopSignal::new();
    let mut engine = EngineHandle::start(&p.engine, startup, &stop)
        .await
        .map_err(|e| anyhow::anyhow!("{}: the engine did not start or answer: {e:#}", p.label))?;
    let side = Side {
        label: p.label.clone(),
        how: p.how.clone(),
        url: engine.url.clone(),
        model: model.clone(),
    };
    let docs = corpus::documents()?;
    let items = tasks::pack();
    let mut out = Vec::new();
    let mut err = None;
    for (i, with_tasks) in times.iter().enumerate() {
        let s = RunSpec {
            tasks: *with_tasks,
            ..spec.clone()
        };
        let mut progress = |m: &str| {
            eprintln!(
                "rigbench quality: {m}{}",
                if i > 0 {
                    " (second run: the noise floor)"
                } else {
                    ""
                }
            )
        };
        match run_side(&side, &docs, &items, &s, &mut progress).await {
            Ok(r) => out.push(r),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    engine.stop().await;
    match err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

fn items_csv(runs: &[&SideRun]) -> anyhow::Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut head = vec!["item".to_string(), "variant".to_string()];
    head.extend(runs.iter().map(|r| format!("{}_passed", r.side.label)));
    w.write_record(&head)?;
    if let Some(first) = runs.first() {
        for (i, t) in first.tasks.iter().enumerate() {
            let mut row = vec![t.id.clone(), t.variant.clone()];
            for r in runs {
                row.push(
                    r.tasks
                        .get(i)
                        .map_or(String::new(), |x| x.passed.to_string()),
                );
            }
            w.write_record(&row)?;
        }
    }
    Ok(String::from_utf8(w.into_inner()?)?)
}

/// Write `quality_comparison` into `DIR/results.json`: into the report already there (every
/// other part kept), or into a new results file stamped with this rig (what `compare`, `board`
/// and `report` read).
fn write_results(out: &std::path::Path, q: &QualityComparison) -> anyhow::Result<()> {
    let path = out.join("results.json");
    let mut r = if path.exists() {
        crate::report::Results::load(&path)?
    } else {
        let rig = crate::rig::probe();
        let label = rig.label();
        let mut r = crate::report::Results::new(
            rig,
            label,
            crate::output::redact::Redactor::for_this_host(true)
                .redact(&std::env::args().collect::<Vec<_>>().join(" ")),
        );
        r.complete = true;
        r
    };
    r.quality_comparison = Some(q.clone());
    crate::output::write::atomic_write_json(&path, &r)
}

/// Run `rigbench quality`.
///
/// # Errors
/// A bad command line ([`RigError::BadFlag`]); an output that cannot be written.
pub fn run(a: QualityArgs) -> anyhow::Result<ExitStatus> {
    if let Some(p) = &a.dump_tasks {
        let mut s = String::new();
        for it in tasks::pack() {
            s.push_str(&serde_json::to_string(&it)?);
            s.push('\n');
        }
        crate::output::write::atomic_write(p, s.as_bytes())?;
        eprintln!(
            "rigbench quality: wrote {} items to {}",
            tasks::pack().len(),
            p.display()
        );
        return Ok(ExitStatus::Ok);
    }
    let out = a.out.clone().ok_or_else(|| {
        RigError::flag(
            "--out",
            "required: the folder for results.json, quality.md and items.csv",
        )
    })?;
    let (reference, cands) = plan(&a)?;
    let spec = spec(&a)?;
    let rules = rules(&a)?;
    std::fs::create_dir_all(&out)
        .map_err(|e| RigError::file(&out, format!("cannot create the --out folder: {e}")))?;
    let startup = Duration::from_secs_f64(a.startup_timeout);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (runs, failures) = rt.block_on(async {
        let mut failures = Vec::new();
        let refs = match measure(&reference, &a.model, &[true, false], &spec, startup).await {
            Ok(r) => r,
            Err(e) => return (None, vec![format!("{e:#}")]),
        };
        let mut cruns = Vec::new();
        for c in &cands {
            match measure(c, &a.model, &[true], &spec, startup).await {
                Ok(mut r) => cruns.push(r.remove(0)),
                Err(e) => failures.push(format!("{e:#}")),
            }
        }
        (Some((refs, cruns)), failures)
    });
    for f in &failures {
        eprintln!("rigbench quality: {f}");
    }
    let Some((refs, cruns)) = runs else {
        return Ok(ExitStatus::Error);
    };
    // What was measured is written before it is compared (a comparison that fails keeps it).
    let all: Vec<&SideRun> = std::iter::once(&refs[0]).chain(cruns.iter()).collect();
    crate::output::write::atomic_write_json(&out.join("runs.json"), &all)?;
    crate::output::write::atomic_write(&out.join("items.csv"), items_csv(&all)?.as_bytes())?;
    let q = crate::quality::compare(&refs[0], &refs[1], &cruns, &rules, spec.top_k)?;
    write_results(&out, &q)?;
    let md = crate::quality::render::render_markdown(&q);
    crate::output::write::atomic_write(&out.join("quality.md"), md.as_bytes())?;
    print!("{md}");
    eprintln!(
        "rigbench quality: wrote {}",
        out.join("results.json").display()
    );
    Ok(if failures.is_empty() {
        ExitStatus::Ok
    } else {
        ExitStatus::Error
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: QualityArgs,
    }

    fn parse(args: &[&str]) -> QualityArgs {
        T::try_parse_from(std::iter::once("q").chain(args.iter().copied()))
            .unwrap()
            .a
    }

    #[test]
    fn sides_are_planned_from_the_flags() {
        let a = parse(&[
            "--reference-model",
            "m.gguf",
            "--quantize",
            "fp8",
            "--quantize",
            "nvfp4",
        ]);
        let (r, c) = plan(&a).unwrap();
        assert!(r.how.contains("m.gguf"));
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].label, "candidate-1-fp8");
        assert_eq!(c[1].label, "candidate-2-nvfp4");
        let args = |p: &Planned| match &p.engine {
            EngineChoice::Builtin { args, .. } => args.join(" "),
            _ => String::new(),
        };
        assert!(
            !args(&r).contains("--max-logprobs"),
            "20 is serve's default"
        );
        // A larger --top-k raises the built-in engines' cap, unless --serve-arg sets it.
        let a = parse(&[
            "--reference-model",
            "m.gguf",
            "--quantize",
            "fp8",
            "--top-k",
            "500",
        ]);
        let (r, c) = plan(&a).unwrap();
        assert!(args(&r).contains("--max-logprobs 500"), "{}", args(&r));
        assert!(args(&c[0]).contains("--max-logprobs 500"));
        let a = parse(&[
            "--reference-model",
            "m.gguf",
            "--quantize",
            "fp8",
            "--top-k",
            "500",
            "--serve-arg=--max-logprobs=-1",
        ]);
        let (r, _) = plan(&a).unwrap();
        assert_eq!(
            args(&r).matches("--max-logprobs").count(),
            1,
            "{}",
            args(&r)
        );
        let a = parse(&[
            "--reference",
            "http://a",
            "--candidate",
            "http://b",
            "--candidate",
            "http://c",
        ]);
        assert_eq!(plan(&a).unwrap().1.len(), 2);
        let e = plan(&parse(&["--reference", "http://a"]))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("--candidate"), "{e}");
        let e = plan(&parse(&[
            "--reference",
            "http://a",
            "--reference-model",
            "x",
            "--candidate",
            "u",
        ]))
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("exactly one"), "{e}");
        let e = spec(&parse(&["--top-k", "1001"])).unwrap_err().to_string();
        assert!(e.contains("--top-k"), "{e}");
        let e = spec(&parse(&["--top-k", "0"])).unwrap_err().to_string();
        assert!(e.contains("--top-k"), "{e}");
        assert_eq!(spec(&parse(&["--top-k", "200"])).unwrap().top_k, 200);
    }
}
