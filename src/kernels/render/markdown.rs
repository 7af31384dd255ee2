//! The kernel section as Markdown: the intro (suite, legend, timing conditions, copy bandwidth,
//! clocks), the goals, composite, fit and timing-mode sections of their modules, one table per
//! shape with its noisy cases and crossovers, the measured peaks, what ran, peers, kernel facts,
//! determinism, the CPU accuracy study, skips and notes.

use std::collections::BTreeMap;

use super::cases::{by_shape, col_header, columns, has_quant, noisy, NOISY_FACTOR};
use super::crossover::crossover;
use super::plots::{plot_name, COMPOSITE_PLOT};
use crate::kernels::schema::{KernelCase, KernelResults, TimingModes};
use crate::output::table::{human_bytes, human_seconds, markdown_table, thousands};

/// A table cell: the case's time (FP8 with its activation quantization), the speedup against
/// rigbench's `bf16` median `base` (one denominator for every column), and `‡` when its spread
/// is far above the stopping target.
fn cell(c: Option<&&KernelCase>, base: Option<f64>, target: Option<f64>) -> String {
    match c {
        None => "—".into(),
        Some(c) => {
            let t = c.total_s();
            let mut s = human_seconds(t);
            if let Some(b) = base.filter(|_| t > 0.0) {
                s.push_str(&format!(" ({:.2}×)", b / t));
            }
            if target.is_some_and(|x| noisy(c, x)) {
                s.push_str(" ‡");
            }
            s
        }
    }
}

/// Serde name of a stop reason (`converged`, `sample_cap`, `time_cap`).
fn stop_name(r: Option<crate::stats::StopReason>) -> String {
    r.and_then(|r| serde_json::to_value(r).ok())
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "not recorded".into())
}

/// How many flagged cases the footnote under a table names before it counts the rest.
const FLAGGED_SHOWN: usize = 4;

/// One line on the SM clock polled while the cases were sampled.
fn clock_line(k: &KernelResults) -> Option<String> {
    let with: Vec<&KernelCase> = k.cases.iter().filter(|c| c.clocks.is_some()).collect();
    if with.is_empty() {
        return None;
    }
    let lo = with
        .iter()
        .filter_map(|c| c.clocks.as_ref()?.min_mhz)
        .min()?;
    let hi = with
        .iter()
        .filter_map(|c| c.clocks.as_ref()?.max_mhz)
        .max()?;
    let throttled = with.iter().filter(|c| !c.throttle.is_empty()).count();
    let source = with[0]
        .clocks
        .as_ref()
        .map(|c| c.source.clone())
        .unwrap_or_default();
    Some(format!(
        "SM clock while the cases were sampled ({source}): {lo}–{hi} MHz; harmful throttle reasons seen in {throttled} of {} cases{}.\n",
        with.len(),
        if throttled > 0 { " (named in the notes)" } else { "" }
    ))
}

/// The kernel section as Markdown; `plots` are file names written next to report.md.
pub fn markdown(k: &KernelResults, plots: &[String]) -> String {
    markdown_for(k, plots, &[])
}

/// [`markdown`] on a card whose capability table is `caps`: skip reasons then use the table's
/// word for each format ([`crate::kernels::wording::skip_reason`]).
pub fn markdown_for(
    k: &KernelResults,
    plots: &[String],
    caps: &[crate::rig::Capability],
) -> String {
    let mut o = String::new();
    render_intro(&mut o, k);
    let composite = k
        .composite
        .clone()
        .or_else(|| crate::kernels::composite::compute(k));
    o.push_str(&crate::kernels::goals::markdown(k, composite.as_ref()));
    if let Some(c) = &composite {
        let plot = plots
            .iter()
            .any(|p| p == COMPOSITE_PLOT)
            .then_some(COMPOSITE_PLOT);
        o.push_str(&crate::kernels::composite::markdown(c, plot));
    }
    o.push_str(&crate::kernels::fit::markdown(k));
    o.push_str(&crate::kernels::timing_modes::markdown(k));
    if let Some(g) = &k.moe_grouped {
        o.push_str(&crate::kernels::moe_grouped::markdown(g));
        if let Some(spec) = &g.spec {
            let rows = crate::kernels::moe_grouped::step_rows(k, spec);
            o.push_str(&crate::kernels::moe_grouped::step_markdown(
                &rows,
                g.copy_bytes_per_s,
            ));
        }
    }
    let target = k.timing_policy.as_ref().map(|p| p.stopping.target_rel_std);
    for (shape, cases) in by_shape(k) {
        render_shape(&mut o, &shape, &cases, plots, target);
    }
    if plots.contains(&"kernels_fastest.svg".to_string()) {
        o.push_str("### Fastest format at each M\n\n![fastest implementation per shape and M](kernels_fastest.svg)\n\n");
    }
    o.push_str(&crate::kernels::peak::markdown(k));
    render_what_ran(&mut o, k);
    if !k.peers.is_empty() {
        o.push_str(&peer_section(k));
    }
    render_kernel_facts(&mut o, k);
    render_determinism(&mut o, k);
    render_reference_accuracy(&mut o, k);
    render_skipped(&mut o, k, caps);
    if !k.notes.is_empty() {
        o.push_str("### Notes\n\n");
        for n in &k.notes {
            o.push_str(&format!("- {n}\n"));
        }
        o.push('\n');
    }
    o
}

/// The heading, suite description, GEMM legend, timing conditions, copy bandwidth and clocks.
fn render_intro(o: &mut String, k: &KernelResults) {
    if k.suite.name.is_empty() {
        // No suite ran (--no-kernels, or no GPU): no suite name to show.
        o.push_str("## Kernels\n\n");
    } else {
        o.push_str(&format!(
            "## Kernels: suite {}\n\n",
            crate::output::table::code(&k.suite.name)
        ));
    }
    if !k.suite.description.is_empty() {
        o.push_str(&format!("{}\n\n", k.suite.description));
    }
    if !k.cases.is_empty() {
        o.push_str("GEMM `C[M, N] = A[M, K] · W[N, K]ᵀ`, BF16 output. Times are medians of the samples. One denominator in every table: the figure in parentheses is rigbench's `bf16` (cuBLASLt) median at the same shape and M divided by the cell's time, peer columns included. FP8 columns marked `+ act. quant` include the activation quantization (timed separately; its share is in the `fp8 act. quant` column), and so do the `fastest` column and the crossovers marked so. `‡` marks a case whose σ/mean is more than 3× the stopping target.\n\n");
    }
    if let Some(p) = k.timing_policy.as_ref().filter(|_| !k.cases.is_empty()) {
        o.push_str(&format!(
            "Conditions: {}; warm-up {} launches; sampling stops at σ/mean ≤ {:.1}% (after ≥ {} samples), at {} samples, or after {:.2} s once {} samples are in; timer: {}.\n",
            if p.modes == TimingModes::Graph {
                "graph timing (no flush: the launches rotate over weight copies larger than 4× L2)".to_string()
            } else if p.l2_flush_bytes > 0 {
                format!("cold L2 (a {} L2 flush before every sample)", human_bytes(p.l2_flush_bytes))
            } else {
                "warm L2 (no flush)".into()
            },
            p.warmup_iters,
            p.stopping.target_rel_std * 100.0,
            p.stopping.min_samples,
            p.stopping.max_samples,
            p.stopping.max_time_s,
            p.stopping.min_samples,
            p.timer
        ));
        match p.modes {
            TimingModes::Cold => {}
            TimingModes::Graph => o.push_str("Timing mode: **graph** (every figure below is a per-GEMM time from back-to-back launches over rotating weight copies in a CUDA graph, not a cold single launch).\n"),
            TimingModes::Both => o.push_str("Timing modes: cold (the tables) and graph (beside it, in the timing-modes section and the composite).\n"),
        }
    }
    if let Some(c) = k.copy_bandwidth.as_ref().filter(|_| !k.cases.is_empty()) {
        o.push_str(&format!(
            "Memory roofline measured in the same run: device-to-device copy of {} at {:.2} TB/s (bytes read + written over the median of {} copies).\n",
            human_bytes(c.bytes),
            c.bytes_per_s / 1e12,
            c.samples
        ));
    }
    if let Some(l) = clock_line(k) {
        o.push_str(&l);
    }
    if k.cases.is_empty() {
        o.push_str("No kernel case was timed in this run (see the skips below).\n\n");
    } else {
        o.push('\n');
    }
}

/// One shape's section: its table of M against implementation, noisy cases, crossovers and plot.
fn render_shape(
    o: &mut String,
    shape: &str,
    cases: &BTreeMap<(String, usize), &KernelCase>,
    plots: &[String],
    target: Option<f64>,
) {
    let any = cases.values().next().copied();
    let (n, kk) = any.map(|c| (c.n, c.k)).unwrap_or((0, 0));
    o.push_str(&format!(
        "### `{shape}` (N = {}, K = {})\n\n",
        thousands(n as u64),
        thousands(kk as u64)
    ));
    let cols = columns(cases);
    let mut ms: Vec<usize> = cases.keys().map(|(_, m)| *m).collect();
    ms.sort_unstable();
    ms.dedup();
    let mut headers: Vec<String> = vec!["M".into()];
    headers.extend(cols.iter().map(|c| col_header(cases, c)));
    let has_fp8q = has_quant(cases, "fp8");
    if has_fp8q {
        headers.push("fp8 act. quant".into());
    }
    headers.push("w4a16 % copy BW".into());
    headers.push("fastest (FP8 incl. act. quant)".into());
    let mut rows = Vec::new();
    let mut flagged = Vec::new();
    for m in &ms {
        let base = cases
            .get(&("bf16".to_string(), *m))
            .map(|c| c.timing.median_s);
        let mut r = vec![thousands(*m as u64)];
        for c in &cols {
            let x = cases.get(&(c.clone(), *m));
            if let (Some(x), Some(t)) = (x, target) {
                if noisy(x, t) {
                    flagged.push(format!(
                        "{c} M = {m}: σ/mean {:.1}% over {} samples (stop: {})",
                        x.timing.rel_std * 100.0,
                        x.timing.samples_s.len(),
                        stop_name(x.timing.stop_reason)
                    ));
                }
            }
            r.push(cell(x, base, target));
        }
        if has_fp8q {
            r.push(
                cases
                    .get(&("fp8".into(), *m))
                    .and_then(|c| KernelCase::act_quant(&c.extra))
                    .map(|e| human_seconds(e.median_s))
                    .unwrap_or_else(|| "—".into()),
            );
        }
        r.push(
            cases
                .get(&("w4a16".into(), *m))
                .and_then(|c| c.derived.pct_copy_bw)
                .map(|p| format!("{p:.0}%"))
                .unwrap_or_else(|| "—".into()),
        );
        let fastest = cols
            .iter()
            .filter_map(|c| cases.get(&(c.clone(), *m)).map(|x| (c, x.total_s())))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(c, _)| c.clone())
            .unwrap_or_default();
        r.push(fastest);
        rows.push(r);
    }
    let hdr: Vec<&str> = headers.iter().map(String::as_str).collect();
    o.push_str(&markdown_table(&hdr, &rows));
    o.push('\n');
    if !flagged.is_empty() {
        let more = flagged.len().saturating_sub(FLAGGED_SHOWN);
        flagged.truncate(FLAGGED_SHOWN);
        o.push_str(&format!(
            "‡ σ/mean more than {NOISY_FACTOR}× the stopping target ({:.1}%): {}{}.\n\n",
            target.unwrap_or(0.0) * 100.0,
            flagged.join("; "),
            if more > 0 {
                format!("; and {more} more (kernels.csv: rel_std, stop_reason)")
            } else {
                String::new()
            }
        ));
    }
    render_crossovers(o, cases, &ms, has_fp8q);
    let plot = plot_name(shape);
    if plots.contains(&plot) {
        o.push_str(&format!(
            "![{shape}: time and weight bandwidth against M]({plot})\n\n"
        ));
    }
}

/// One shape's crossovers between formats (FP8 lines with and without activation quantization).
fn render_crossovers(
    o: &mut String,
    cases: &BTreeMap<(String, usize), &KernelCase>,
    ms: &[usize],
    has_fp8q: bool,
) {
    let with_quant = |c: &KernelCase| c.total_s();
    let plain = |c: &KernelCase| c.timing.median_s;
    let excl = "FP8 excluding activation quantization: ";
    let incl = "FP8 including activation quantization: ";
    type Time = fn(&KernelCase) -> f64;
    let mut pairs: Vec<(&str, &str, &str, Time)> = vec![
        ("w4a16", "fp8", if has_fp8q { excl } else { "" }, plain),
        ("w4a16", "bf16", "", plain),
        ("fp8", "bf16", if has_fp8q { excl } else { "" }, plain),
    ];
    if has_fp8q {
        pairs.insert(1, ("w4a16", "fp8", incl, with_quant));
        pairs.push(("fp8", "bf16", incl, with_quant));
    }
    let mut lines = Vec::new();
    for (a, b, label, time) in pairs {
        // `time` applies to the FP8 side only.
        let t = |c: &KernelCase| {
            if c.implementation == "fp8" {
                time(c)
            } else {
                plain(c)
            }
        };
        let pts: Vec<(usize, f64, f64)> = ms
            .iter()
            .filter_map(|m| {
                let ta = t(cases.get(&(a.to_string(), *m))?);
                let tb = t(cases.get(&(b.to_string(), *m))?);
                Some((*m, ta, tb))
            })
            .collect();
        if let Some(t) = crossover(a, b, &pts) {
            lines.push(format!("- {label}{t}"));
        }
    }
    if !lines.is_empty() {
        // Each FP8 line says whether it counts the activation quantization.
        o.push_str("Crossovers:\n\n");
        o.push_str(&lines.join("\n"));
        o.push_str("\n\n");
    }
}

/// The path, SM clock and stop reason of every rigbench case.
fn render_what_ran(o: &mut String, k: &KernelResults) {
    let paths: Vec<Vec<String>> = k
        .cases
        .iter()
        .filter(|c| c.provider == "rigbench")
        .map(|c| {
            vec![
                c.shape.clone(),
                c.m.to_string(),
                c.implementation.clone(),
                c.path.clone(),
                c.clocks
                    .as_ref()
                    .and_then(|x| Some(format!("{}–{}", x.min_mhz?, x.max_mhz?)))
                    .unwrap_or_else(|| "—".into()),
                stop_name(c.timing.stop_reason),
            ]
        })
        .collect();
    if !paths.is_empty() {
        o.push_str("### What ran\n\n<details><summary>Path of every rigbench case, the SM clock polled while it was sampled, and why sampling stopped</summary>\n\n");
        o.push_str(&markdown_table(
            &["shape", "M", "impl", "path", "SM clock (MHz)", "stop"],
            &paths,
        ));
        o.push_str("\n</details>\n\n");
    }
}

/// The kernel facts table (registers, spills, shared memory, threads).
fn render_kernel_facts(o: &mut String, k: &KernelResults) {
    if !k.kernel_facts.is_empty() {
        o.push_str("### Kernel facts\n\n");
        let rows: Vec<Vec<String>> = k
            .kernel_facts
            .iter()
            .map(|f| {
                vec![
                    f.name.clone(),
                    f.arch.clone(),
                    f.registers.to_string(),
                    f.local_bytes.to_string(),
                    f.static_shared_bytes.to_string(),
                    f.threads_per_block.to_string(),
                ]
            })
            .collect();
        o.push_str(&markdown_table(
            &[
                "kernel",
                "arch",
                "registers/thread",
                "local (spill) bytes/thread",
                "static smem bytes",
                "threads/block",
            ],
            &rows,
        ));
        o.push('\n');
    }
}

/// The determinism table.
fn render_determinism(o: &mut String, k: &KernelResults) {
    if !k.determinism.is_empty() {
        o.push_str("### Determinism\n\n");
        let rows: Vec<Vec<String>> = k
            .determinism
            .iter()
            .map(|d| {
                vec![
                    if d.path.is_empty() {
                        d.implementation.clone()
                    } else {
                        format!("{} [{}]", d.implementation, d.path)
                    },
                    d.shape.clone(),
                    d.m.to_string(),
                    d.runs.to_string(),
                    if d.bit_exact {
                        "bit-exact".into()
                    } else {
                        format!("CHANGES between runs ({} elements)", d.differing_elements)
                    },
                ]
            })
            .collect();
        o.push_str(&markdown_table(
            &["implementation", "shape", "M", "runs", "outputs"],
            &rows,
        ));
        o.push('\n');
    }
}

/// The accuracy of each format against the CPU reference.
fn render_reference_accuracy(o: &mut String, k: &KernelResults) {
    if !k.reference_accuracy.is_empty() {
        o.push_str("### Accuracy of each format (CPU reference, no GPU involved)\n\n");
        o.push_str("Relative L2 error of the format's GEMM against the exact product of the unquantized operands. W4A4 here is emulated (quantize, dequantize, multiply): an accuracy figure, never a speed.\n\n");
        let split = k
            .reference_accuracy
            .iter()
            .any(|a| a.rel_l2_non_outlier.is_some());
        let rows: Vec<Vec<String>> = k
            .reference_accuracy
            .iter()
            .map(|a| {
                let mut r = vec![
                    a.format.display_name().into(),
                    a.shape.clone(),
                    a.data.clone(),
                    format!("{:.2e}", a.rel_l2_vs_exact),
                ];
                if split {
                    r.push(match a.rel_l2_non_outlier {
                        // Flag the case where the overall figure hides a worse error on the
                        // ordinary channels (W4A4: the outlier is exact, the rest of its block
                        // loses precision).
                        Some(e) if e > 1.2 * a.rel_l2_vs_exact => {
                            format!("**{e:.2e}** (worse than overall)")
                        }
                        Some(e) => format!("{e:.2e}"),
                        None => "—".into(),
                    });
                }
                r
            })
            .collect();
        let mut headers = vec!["format", "M×N×K", "data", "rel. L2 error vs exact"];
        if split {
            headers.push("same, non-outlier channels only");
        }
        o.push_str(&markdown_table(&headers, &rows));
        o.push('\n');
        if split {
            o.push_str("With outlier channels, the outliers dominate the norm of the product and are represented almost exactly (each is the largest value of its block), so the overall error can look no worse than on plain data; the last column is the error of the product over the other channels, which is what the outliers cost them.\n\n");
        }
    }
}

/// The skipped kernel cases, one row per provider, implementation, M and reason.
fn render_skipped(o: &mut String, k: &KernelResults, caps: &[crate::rig::Capability]) {
    if !k.skipped.is_empty() {
        o.push_str("### Skipped kernel cases\n\n");
        // One row per (provider, implementation, M, reason), the shapes it covers joined.
        let mut groups: Vec<(String, String, String, String, Vec<String>)> = Vec::new();
        for s in &k.skipped {
            let m = s.m.map(|m| m.to_string()).unwrap_or_else(|| "all".into());
            let reason = crate::kernels::wording::skip_reason(&s.implementation, &s.reason, caps);
            match groups
                .iter_mut()
                .find(|g| g.0 == s.provider && g.1 == s.implementation && g.2 == m && g.3 == reason)
            {
                Some(g) => g.4.push(s.shape.clone()),
                None => groups.push((
                    s.provider.clone(),
                    s.implementation.clone(),
                    m,
                    reason,
                    vec![s.shape.clone()],
                )),
            }
        }
        let all_shapes = by_shape(k).len().max(
            k.skipped
                .iter()
                .map(|s| s.shape.as_str())
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
        );
        let rows: Vec<Vec<String>> = groups
            .into_iter()
            .map(|(p, i, m, reason, shapes)| {
                let shape = if shapes.len() > 1 && shapes.len() == all_shapes {
                    format!("all {} shapes", shapes.len())
                } else {
                    shapes.join(", ")
                };
                vec![p, i, shape, m, reason]
            })
            .collect();
        o.push_str(&markdown_table(
            &["provider", "impl", "shape", "M", "reason"],
            &rows,
        ));
        o.push('\n');
    }
}

/// The peer section: which providers were tried, which ran, their timed and skipped cases with
/// the first reason, and how many of their rows are noisy.
fn peer_section(k: &KernelResults) -> String {
    let mut o = String::from("### Peers\n\nPeer rows (columns named `provider:implementation`) ran in the same session with the same shapes, M values, L2 flush, stopping rule and timing modes; they are never mixed with rigbench's own rows, and their speedups use the same denominator (rigbench's `bf16`). Every provider tried is listed, with why it did not run where it did not.\n\n");
    let target = k.timing_policy.as_ref().map(|p| p.stopping.target_rel_std);
    let rows: Vec<Vec<String>> = k
        .peers
        .iter()
        .map(|p| {
            let mine: Vec<&KernelCase> = k
                .cases
                .iter()
                .filter(|c| c.provider == p.provider)
                .collect();
            let skips: Vec<_> = k
                .skipped
                .iter()
                .filter(|s| s.provider == p.provider)
                .collect();
            let noisy_n = target
                .map(|t| mine.iter().filter(|c| noisy(c, t)).count())
                .unwrap_or(0);
            vec![
                p.provider.clone(),
                p.implementations.join(", "),
                if p.available { "yes" } else { "no" }.into(),
                mine.len().to_string(),
                match skips.first() {
                    None => "0".into(),
                    Some(s) => format!(
                        "{} (e.g. {} {} M = {}: {})",
                        skips.len(),
                        s.implementation,
                        s.shape,
                        s.m.map(|m| m.to_string()).unwrap_or_else(|| "all".into()),
                        s.reason
                    ),
                },
                noisy_n.to_string(),
                p.detail.clone(),
            ]
        })
        .collect();
    o.push_str(&markdown_table(
        &[
            "provider",
            "implementations",
            "ran",
            "cases timed",
            "cases skipped",
            "noisy rows ‡",
            "detail",
        ],
        &rows,
    ));
    o.push('\n');
    // The configuration each peer chose (Humming's heuristic, Marlin's launch plan), per case.
    let label = crate::kernels::peers::CONFIG_LABEL;
    let chosen: Vec<Vec<String>> = k
        .cases
        .iter()
        .filter(|c| c.provider != "rigbench")
        .filter_map(|c| {
            let cfg = c.path.split(label).nth(1)?;
            Some(vec![
                format!("{}:{}", c.provider, c.implementation),
                c.shape.clone(),
                thousands(c.m as u64),
                cfg.to_string(),
            ])
        })
        .collect();
    if !chosen.is_empty() {
        o.push_str("<details><summary>Configuration each peer chose, per case</summary>\n\n");
        o.push_str(&markdown_table(
            &["implementation", "shape", "M", "configuration"],
            &chosen,
        ));
        o.push_str("\n</details>\n\n");
    }
    o
}
