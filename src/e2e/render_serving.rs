//! The serving part of the e2e section: SLO goodput and its search (with the Pareto plot of
//! throughput per GPU against per-user interactivity), energy per token, the replayed trace's
//! reuse, and the metric definitions with vLLM's and guidellm's TPOT and ITL of the same
//! requests (docs/goodput.md, docs/energy.md, docs/traces.md).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use super::goodput::{SearchAxis, Verdict};
use super::metrics::Percentiles;
use super::E2eResults;
use crate::output::table::{markdown_table, thousands};
use crate::output::write::atomic_write;

/// The Pareto plot's file name.
pub const PARETO_PLOT: &str = "e2e_goodput_pareto.svg";

fn ms(p: &Option<Percentiles>) -> String {
    p.as_ref()
        .map(|p| format!("{:.2}", p.p50 * 1e3))
        .unwrap_or_else(|| "n/a".into())
}

fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// The Markdown of the serving sections (empty when none applies).
pub fn render(res: &E2eResults) -> String {
    let mut o = String::new();
    goodput(&mut o, res);
    search(&mut o, res);
    energy(&mut o, res);
    trace(&mut o, res);
    definitions(&mut o, res);
    o
}

fn goodput(o: &mut String, res: &E2eResults) {
    let rows: Vec<Vec<String>> = res
        .runs
        .iter()
        .filter_map(|r| {
            let g = r.goodput.as_ref()?;
            let per: Vec<String> = g
                .per_target
                .iter()
                .map(|t| {
                    format!(
                        "{} {} ({}/{})",
                        t.metric.to_ascii_uppercase(),
                        pct(t.attainment),
                        t.meeting,
                        t.judged
                    )
                })
                .collect();
            Some(vec![
                r.label.clone(),
                format!("{}/{}", g.requests_meeting, g.requests),
                pct(g.attainment),
                format!("[{}, {}]", pct(g.wilson_low), pct(g.wilson_high)),
                per.join("; "),
                g.goodput_req_per_s
                    .map(|x| format!("{x:.3}"))
                    .unwrap_or_else(|| "n/a".into()),
            ])
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let slo = res
        .runs
        .iter()
        .find_map(|r| r.goodput.as_ref())
        .map(|g| (g.slo.describe(), g.confidence))
        .unwrap_or_default();
    let _ = writeln!(
        o,
        "### SLO goodput\n\nTargets: {}. A request meets the SLO when it meets every target; a failed request meets none; TPOT is not judged where it is not observable. Wilson score interval at {:.0} % confidence (docs/goodput.md).\n",
        slo.0,
        slo.1 * 100.0
    );
    o.push_str(&markdown_table(
        &[
            "run",
            "meeting",
            "attainment",
            "Wilson interval",
            "per target",
            "goodput req/s",
        ],
        &rows,
    ));
    o.push('\n');
}

fn search(o: &mut String, res: &E2eResults) {
    let Some(s) = &res.goodput_search else {
        return;
    };
    let unit = match s.spec.axis {
        SearchAxis::Rate => "req/s",
        SearchAxis::Concurrency => "concurrency",
    };
    let _ = writeln!(
        o,
        "### Goodput search\n\nThe highest {unit} whose attainment of {} stays at or above {} (each probe's Wilson interval at {:.0} %; doubling from {}, then bisection; at most {} probes).\n",
        s.slo.describe(),
        pct(s.spec.target),
        s.spec.confidence * 100.0,
        s.spec.start,
        s.spec.max_probes
    );
    let rows: Vec<Vec<String>> = s
        .probes
        .iter()
        .map(|p| {
            vec![
                format!("{}", p.load),
                pct(p.attainment),
                format!("[{}, {}]", pct(p.wilson_low), pct(p.wilson_high)),
                p.requests.to_string(),
                match p.verdict {
                    Verdict::Pass => "pass",
                    Verdict::Fail => "fail",
                    Verdict::Undecided => "undecided",
                }
                .to_string(),
                p.output_tok_per_s_per_gpu
                    .map(|x| format!("{x:.1}"))
                    .unwrap_or_else(|| "invalid".into()),
                p.tok_per_s_per_user
                    .map(|x| format!("{x:.1}"))
                    .unwrap_or_else(|| "n/a".into()),
            ]
        })
        .collect();
    o.push_str(&markdown_table(
        &[
            unit,
            "attainment",
            "Wilson interval",
            "requests",
            "verdict",
            "output tok/s per GPU",
            "tok/s per user (1/TPOT p50)",
        ],
        &rows,
    ));
    let _ = writeln!(
        o,
        "\n**Answer:** {} (lowest failing: {}). Stopped: {}.\n",
        s.answer
            .map(|a| format!("{a} {unit}"))
            .unwrap_or_else(|| "no load met the target".into()),
        s.lowest_fail
            .map(|a| format!("{a} {unit}"))
            .unwrap_or_else(|| "none".into()),
        s.stopped
    );
    if pareto_points(res).len() >= 2 {
        let _ = writeln!(o, "![{PARETO_PLOT}]({PARETO_PLOT})\n");
    }
}

fn energy(o: &mut String, res: &E2eResults) {
    let mut rows = Vec::new();
    let mut unknown = Vec::new();
    for r in &res.runs {
        match (&r.energy, &r.energy_unknown) {
            (Some(e), _) => {
                let f = |x: Option<f64>, d: usize| {
                    x.map(|x| format!("{x:.d$}"))
                        .unwrap_or_else(|| "n/a".into())
                };
                rows.push(vec![
                    r.label.clone(),
                    format!("{:.1}", e.joules),
                    f(e.j_per_output_token, 4),
                    f(e.j_per_total_token, 4),
                    f(e.output_tokens_per_j, 2),
                    format!("{:.1}", e.mean_w),
                    pct(e.coverage),
                    format!("{} at {:.1} Hz", e.samples, e.sample_rate_hz),
                    e.source.clone(),
                ]);
            }
            (None, Some(why)) => unknown.push(format!("{}: {why}", r.label)),
            (None, None) => {}
        }
    }
    if rows.is_empty() && unknown.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "### Energy\n\nBoard power sampled across each measured window, integrated by the trapezoid rule over the span the samples cover (docs/energy.md).\n"
    );
    if !rows.is_empty() {
        o.push_str(&markdown_table(
            &[
                "run",
                "J",
                "J / output token",
                "J / total token",
                "output tokens / J",
                "mean W",
                "window covered",
                "samples",
                "source",
            ],
            &rows,
        ));
        o.push('\n');
    }
    if !unknown.is_empty() {
        // Usually the same reason for every point: say it once.
        let mut reasons: Vec<String> = res
            .runs
            .iter()
            .filter_map(|r| r.energy_unknown.clone())
            .collect();
        reasons.dedup();
        if reasons.len() == 1 && unknown.len() == res.runs.len() {
            let _ = writeln!(o, "Energy unknown: {}.\n", reasons[0]);
        } else {
            for u in unknown {
                let _ = writeln!(o, "- energy unknown, {u}");
            }
            o.push('\n');
        }
    }
}

fn trace(o: &mut String, res: &E2eResults) {
    let rows: Vec<Vec<String>> = res
        .runs
        .iter()
        .filter_map(|r| {
            let t = r.trace.as_ref()?;
            let opt = |x: Option<u64>| x.map(thousands).unwrap_or_else(|| "not reported".into());
            Some(vec![
                r.label.clone(),
                format!(
                    "{} ({:?}, {} tokens/hash id)",
                    t.file, t.format, t.block_tokens
                ),
                format!("{}/{}", t.requests, t.requests_planned),
                t.sessions.to_string(),
                thousands(t.implied_prefix_reuse),
                opt(t.engine_cached_tokens),
                opt(t.metrics_cache_hits),
                t.reuse_gap
                    .map(|g| format!("{g:+}"))
                    .unwrap_or_else(|| "n/a".into()),
                t.send_lag_p99_s
                    .map(|s| format!("{:.2}", s * 1e3))
                    .unwrap_or_else(|| "n/a".into()),
                if t.not_token_exact == 0 {
                    "yes".into()
                } else {
                    format!("no ({} prompts)", t.not_token_exact)
                },
            ])
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "### Trace replay\n\nImplied reuse: the prompt tokens the trace's shared prefixes let an engine serve from its cache; the engine's figures are `usage.prompt_tokens_details.cached_tokens` and its `/metrics` prefix-cache hits; the gap is reported − implied (docs/traces.md).\n"
    );
    o.push_str(&markdown_table(
        &[
            "run",
            "trace",
            "requests sent",
            "sessions",
            "implied reuse (tokens)",
            "engine cached_tokens",
            "/metrics hits",
            "gap",
            "send lag p99 (ms)",
            "token-exact blocks",
        ],
        &rows,
    ));
    o.push('\n');
}

fn definitions(o: &mut String, res: &E2eResults) {
    let _ = writeln!(o, "### Metric definitions\n");
    let rows: Vec<Vec<String>> = res
        .definitions
        .tools
        .iter()
        .map(|d| {
            vec![
                d.tool.clone(),
                d.ttft.clone(),
                d.tpot.clone(),
                d.itl.clone(),
                d.source.clone(),
            ]
        })
        .collect();
    o.push_str(&markdown_table(
        &["tool", "TTFT", "TPOT", "ITL", "source"],
        &rows,
    ));
    let rows: Vec<Vec<String>> = res
        .runs
        .iter()
        .filter(|r| !r.other_tools.is_empty())
        .map(|r| {
            let mut row = vec![r.label.clone(), ms(&r.latency.tpot), ms(&r.latency.itl)];
            for t in &r.other_tools {
                row.push(ms(&t.tpot));
                row.push(ms(&t.itl));
            }
            row
        })
        .collect();
    if !rows.is_empty() {
        let _ = writeln!(
            o,
            "\nMedians of the same requests under each definition (ms):\n"
        );
        o.push_str(&markdown_table(
            &[
                "run",
                "rigbench TPOT",
                "rigbench ITL",
                "vLLM TPOT",
                "vLLM ITL",
                "guidellm TPOT",
                "guidellm ITL",
            ],
            &rows,
        ));
    }
    o.push('\n');
}

/// `(tok/s per user, output tok/s per GPU, load)` of the search's probes with both figures.
fn pareto_points(res: &E2eResults) -> Vec<(f64, f64, f64)> {
    res.goodput_search
        .iter()
        .flat_map(|s| s.probes.iter())
        .filter_map(|p| Some((p.tok_per_s_per_user?, p.output_tok_per_s_per_gpu?, p.load)))
        .collect()
}

/// Write the Pareto plot (throughput per GPU against per-user interactivity across the goodput
/// search's probes, the ones meeting the target marked) into `dir`; returns the file written.
///
/// # Errors
/// Drawing or writing failed (the error names the file).
pub fn write_pareto(res: &E2eResults, dir: &Path) -> anyhow::Result<Vec<String>> {
    let pts = pareto_points(res);
    if pts.len() < 2 {
        return Ok(Vec::new());
    }
    let perr = |e: &dyn std::fmt::Display| anyhow::anyhow!("plot drawing failed: {e}");
    let xmax = pts.iter().map(|p| p.0).fold(0.0, f64::max) * 1.1;
    let ymax = pts.iter().map(|p| p.1).fold(0.0, f64::max) * 1.1;
    let pass: Vec<f64> = res
        .goodput_search
        .iter()
        .flat_map(|s| s.probes.iter())
        .filter(|p| p.verdict != Verdict::Fail)
        .map(|p| p.load)
        .collect();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (860, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| perr(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Throughput per GPU against interactivity (goodput search)",
                ("sans-serif", 20),
            )
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..xmax.max(1e-9), 0.0..ymax.max(1e-9))
            .map_err(|e| perr(&e))?;
        chart
            .configure_mesh()
            .x_desc("tokens/s per user (1 / median TPOT)")
            .y_desc("output tokens/s per GPU")
            .draw()
            .map_err(|e| perr(&e))?;
        let mut sorted = pts.clone();
        sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
        let line: Vec<(f64, f64)> = sorted.iter().map(|p| (p.0, p.1)).collect();
        crate::output::plot::line_with_points(&mut chart, &line, RGBColor(31, 119, 180), "probes")?;
        let ok: Vec<(f64, f64)> = pts
            .iter()
            .filter(|p| pass.contains(&p.2))
            .map(|p| (p.0, p.1))
            .collect();
        chart
            .draw_series(
                ok.iter()
                    .map(|&(x, y)| Circle::new((x, y), 7, RGBColor(44, 160, 44).stroke_width(2))),
            )
            .map_err(|e| perr(&e))?
            .label("meets the target")
            .legend(|(x, y)| Circle::new((x, y), 5, RGBColor(44, 160, 44).stroke_width(2)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| perr(&e))?;
        root.present().map_err(|e| perr(&e))?;
    }
    let p = dir.join(PARETO_PLOT);
    atomic_write(&p, svg.as_bytes()).with_context(|| format!("cannot write {}", p.display()))?;
    Ok(vec![PARETO_PLOT.to_string()])
}
