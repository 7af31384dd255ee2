//! The kernel section of a report: rigbench's kernel goals ([`super::goals`]), the decode-step
//! composite ([`super::composite`]), the fitted fixed cost and streaming rate ([`super::fit`]),
//! cold against graph timing ([`super::timing_modes`]), Markdown tables per shape (rows M,
//! columns implementations with time and speedup against rigbench's `bf16`, one denominator for
//! every provider; FP8 with its activation quantization), crossover points, peers, kernel facts,
//! determinism, the CPU accuracy study, skips; `kernels.csv`; and SVG plots (plotters).

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;

use super::schema::{KernelCase, KernelResults, TimingModes};

/// File name of the decode-step composite chart.
pub const COMPOSITE_PLOT: &str = "kernels_composite.svg";
use crate::output::table::{human_bytes, human_seconds, markdown_table, thousands};

/// Column key of a case: `bf16`, or `torch:torch.matmul` for peers.
fn col_key(c: &KernelCase) -> String {
    if c.provider == "rigbench" {
        c.implementation.clone()
    } else {
        format!("{}:{}", c.provider, c.implementation)
    }
}

/// Shapes in suite order with their cases indexed by (column, M).
type ShapeCases<'a> = Vec<(String, BTreeMap<(String, usize), &'a KernelCase>)>;

fn by_shape(k: &KernelResults) -> ShapeCases<'_> {
    let mut order: Vec<String> = Vec::new();
    let mut map: BTreeMap<String, BTreeMap<(String, usize), &KernelCase>> = BTreeMap::new();
    for c in &k.cases {
        if !order.contains(&c.shape) {
            order.push(c.shape.clone());
        }
        map.entry(c.shape.clone())
            .or_default()
            .insert((col_key(c), c.m), c);
    }
    order
        .into_iter()
        .map(|s| {
            let m = map.remove(&s).unwrap_or_default();
            (s, m)
        })
        .collect()
}

fn columns(cases: &BTreeMap<(String, usize), &KernelCase>) -> Vec<String> {
    let mut cols: Vec<String> = cases.keys().map(|(c, _)| c.clone()).collect();
    cols.sort_by_key(|c| super::composite::column_rank(c));
    cols.dedup();
    cols
}

/// A row is flagged as noisy when its σ/mean exceeds this many times the stopping target.
pub const NOISY_FACTOR: f64 = 3.0;

/// Whether `c`'s spread is far above the stopping target `target_rel_std`.
pub fn noisy(c: &KernelCase, target_rel_std: f64) -> bool {
    c.timing.rel_std > NOISY_FACTOR * target_rel_std.max(1e-6)
}

/// Whether a column's cases include a separately timed activation quantization.
fn has_quant(cases: &BTreeMap<(String, usize), &KernelCase>, col: &str) -> bool {
    cases
        .iter()
        .any(|((c, _), x)| c == col && KernelCase::act_quant(&x.extra).is_some())
}

/// Intervals of M where `a` is faster than `b` (both measured), as text.
pub fn crossover(a: &str, b: &str, points: &[(usize, f64, f64)]) -> Option<String> {
    if points.is_empty() {
        return None;
    }
    let mut segs: Vec<(bool, usize, usize)> = Vec::new();
    for &(m, ta, tb) in points {
        let faster = ta < tb;
        match segs.last_mut() {
            Some(s) if s.0 == faster => s.2 = m,
            _ => segs.push((faster, m, m)),
        }
    }
    let fmt = |s: &(bool, usize, usize)| {
        if s.1 == s.2 {
            format!("M = {}", thousands(s.1 as u64))
        } else {
            format!("M = {}…{}", thousands(s.1 as u64), thousands(s.2 as u64))
        }
    };
    let wins: Vec<String> = segs.iter().filter(|s| s.0).map(fmt).collect();
    Some(if wins.is_empty() {
        format!("{a} is never faster than {b} here")
    } else if segs.len() == 1 {
        format!(
            "{a} is faster than {b} at every M measured ({})",
            fmt(&segs[0])
        )
    } else if segs[0].0 && segs.len() == 2 {
        format!(
            "{a} is faster than {b} up to M = {}; {b} is faster from M = {}",
            thousands(segs[0].2 as u64),
            thousands(segs[1].1 as u64)
        )
    } else {
        format!("{a} is faster than {b} at {}", wins.join(", "))
    })
}

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

/// The column header: FP8 columns with a timed activation quantization say they include it.
fn col_header(cases: &BTreeMap<(String, usize), &KernelCase>, col: &str) -> String {
    let fp8 = cases
        .iter()
        .any(|((c, _), x)| c == col && x.format == crate::formats::GemmFormat::Fp8);
    if has_quant(cases, col) {
        format!("{col} (+ act. quant)")
    } else if fp8 {
        format!("{col} (GEMM only: act. quant not timed)")
    } else {
        col.to_string()
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
/// word for each format ([`super::wording::skip_reason`]).
pub fn markdown_for(
    k: &KernelResults,
    plots: &[String],
    caps: &[crate::rig::Capability],
) -> String {
    let mut o = String::new();
    render_intro(&mut o, k);
    let composite = k.composite.clone().or_else(|| super::composite::compute(k));
    o.push_str(&super::goals::markdown(k, composite.as_ref()));
    if let Some(c) = &composite {
        let plot = plots
            .iter()
            .any(|p| p == COMPOSITE_PLOT)
            .then_some(COMPOSITE_PLOT);
        o.push_str(&super::composite::markdown(c, plot));
    }
    o.push_str(&super::fit::markdown(k));
    o.push_str(&super::timing_modes::markdown(k));
    let target = k.timing_policy.as_ref().map(|p| p.stopping.target_rel_std);
    for (shape, cases) in by_shape(k) {
        render_shape(&mut o, &shape, &cases, plots, target);
    }
    if plots.contains(&"kernels_fastest.svg".to_string()) {
        o.push_str("### Fastest format at each M\n\n![fastest implementation per shape and M](kernels_fastest.svg)\n\n");
    }
    o.push_str(&super::peak::markdown(k));
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
            let reason = super::wording::skip_reason(&s.implementation, &s.reason, caps);
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
    let label = super::peers::CONFIG_LABEL;
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

/// `kernels.csv`: one row per timed case.
///
/// # Errors
/// Only if the CSV writer fails (in memory).
pub fn csv(k: &KernelResults) -> anyhow::Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "provider",
        "implementation",
        "format",
        "shape",
        "m",
        "n",
        "k",
        "median_s",
        "p10_s",
        "p90_s",
        "samples",
        "rel_std",
        "stop_reason",
        "cold_l2",
        "tflops",
        "weight_bytes",
        "weight_bytes_per_s",
        "pct_copy_bw",
        "speedup_vs_bf16",
        "check_rel_l2",
        "check_tolerance",
        "sm_clock_mhz",
        "path",
        "act_quant_median_s",
        "total_s",
        "graph_median_s",
        "graph_rel_std",
        "graph_launches",
        "graph_weight_copies",
        "graph_skip",
        "sm_clock_min_mhz",
        "sm_clock_max_mhz",
        "throttle_seen",
    ])?;
    for c in &k.cases {
        let opt = |v: Option<f64>| v.map(|x| format!("{x}")).unwrap_or_default();
        w.write_record([
            c.provider.clone(),
            c.implementation.clone(),
            c.format.id().to_string(),
            c.shape.clone(),
            c.m.to_string(),
            c.n.to_string(),
            c.k.to_string(),
            format!("{}", c.timing.median_s),
            format!("{}", c.timing.p10_s),
            format!("{}", c.timing.p90_s),
            c.timing.samples_s.len().to_string(),
            format!("{}", c.timing.rel_std),
            c.timing
                .stop_reason
                .map(|r| format!("{r:?}"))
                .unwrap_or_default(),
            c.timing.cold_l2.to_string(),
            format!("{}", c.derived.tflops),
            c.derived.weight_bytes.to_string(),
            format!("{}", c.derived.weight_bytes_per_s),
            opt(c.derived.pct_copy_bw),
            opt(c.derived.speedup_vs_bf16),
            opt(c.check.as_ref().map(|x| x.value)),
            opt(c.check.as_ref().map(|x| x.tolerance)),
            c.sm_clock_mhz.map(|v| v.to_string()).unwrap_or_default(),
            c.path.clone(),
            opt(KernelCase::act_quant(&c.extra).map(|t| t.median_s)),
            format!("{}", c.total_s()),
            opt(c.graph_timings().map(|(t, _)| t.median_s)),
            opt(c.graph_timings().map(|(t, _)| t.rel_std)),
            c.graph_timings()
                .and_then(|(t, _)| t.graph.as_ref())
                .map(|g| g.launches.to_string())
                .unwrap_or_default(),
            c.graph_timings()
                .and_then(|(t, _)| t.graph.as_ref())
                .map(|g| g.weight_copies.to_string())
                .unwrap_or_default(),
            c.graph_skip.clone().unwrap_or_default(),
            c.clocks
                .as_ref()
                .and_then(|x| x.min_mhz)
                .map(|v| v.to_string())
                .unwrap_or_default(),
            c.clocks
                .as_ref()
                .and_then(|x| x.max_mhz)
                .map(|v| v.to_string())
                .unwrap_or_default(),
            c.throttle.join(" "),
        ])?;
    }
    Ok(String::from_utf8(w.into_inner()?)?)
}

/// File name of a shape's plot.
pub fn plot_name(shape: &str) -> String {
    format!("kernels_{}.svg", crate::rig::slug(shape))
}

use crate::output::plot::PALETTE;

/// Write one SVG per shape (time and weight bandwidth against M, with the copy roofline) and the
/// fastest-format chart; returns the file names.
///
/// # Errors
/// A plot cannot be drawn or written (the error names the file).
pub fn write_plots(k: &KernelResults, dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let shapes = by_shape(k);
    for (shape, cases) in &shapes {
        let name = plot_name(shape);
        let path = dir.join(&name);
        draw_shape(
            shape,
            cases,
            k.copy_bandwidth.as_ref().map(|c| c.bytes_per_s),
            &path,
        )
        .map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", path.display()))?;
        out.push(name);
    }
    if !shapes.is_empty() {
        let path = dir.join("kernels_fastest.svg");
        draw_fastest(&shapes, &path)
            .map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", path.display()))?;
        out.push("kernels_fastest.svg".into());
    }
    if let Some(c) = k.composite.clone().or_else(|| super::composite::compute(k)) {
        let path = dir.join(COMPOSITE_PLOT);
        crate::kernels::composite_chart::composite_chart(&c, &path)
            .map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", path.display()))?;
        out.push(COMPOSITE_PLOT.into());
    }
    Ok(out)
}

type PlotResult = Result<(), Box<dyn std::error::Error>>;

fn draw_shape(
    shape: &str,
    cases: &BTreeMap<(String, usize), &KernelCase>,
    copy_bw: Option<f64>,
    path: &Path,
) -> PlotResult {
    let root = SVGBackend::new(path, (1100, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(550);
    let cols = columns(cases);
    let ms: Vec<usize> = cases.keys().map(|(_, m)| *m).collect();
    let (mmin, mmax) = (
        *ms.iter().min().unwrap_or(&1) as f64,
        (*ms.iter().max().unwrap_or(&2) as f64).max(2.0),
    );
    let times: Vec<f64> = cases
        .values()
        .map(|c| c.total_s() * 1e6)
        .filter(|t| *t > 0.0)
        .collect();
    let (tmin, tmax) = (
        times
            .iter()
            .cloned()
            .fold(f64::INFINITY, f64::min)
            .max(1e-3),
        times.iter().cloned().fold(0.0, f64::max).max(1e-2),
    );
    let (n, kk) = cases.values().next().map(|c| (c.n, c.k)).unwrap_or((0, 0));
    let mut ch = ChartBuilder::on(&left)
        .caption(
            format!(
                "{shape} ({}×{}): median time",
                thousands(n as u64),
                thousands(kk as u64)
            ),
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (mmin..mmax).log_scale(),
            (tmin * 0.8..tmax * 1.25).log_scale(),
        )?;
    ch.configure_mesh()
        .x_desc("M (tokens)")
        .y_desc("µs")
        .x_label_formatter(&crate::output::axis::count_tick)
        .y_label_formatter(&crate::output::axis::tick)
        .draw()?;
    for (i, col) in cols.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let mut pts: Vec<(f64, f64)> = cases
            .iter()
            .filter(|((c, _), _)| c == col)
            .map(|((_, m), c)| (*m as f64, c.total_s() * 1e6))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        crate::output::plot::line_with_points(&mut ch, &pts, color, &col_header(cases, col))?;
    }
    ch.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;

    let bws: Vec<f64> = cases
        .values()
        .map(|c| c.derived.weight_bytes_per_s / 1e12)
        .collect();
    let ymax = bws
        .iter()
        .cloned()
        .fold(copy_bw.unwrap_or(0.0) / 1e12, f64::max)
        .max(0.1)
        * 1.15;
    let mut ch = ChartBuilder::on(&right)
        .caption(
            "weight stream bandwidth (bytes of W / time)",
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d((mmin..mmax).log_scale(), 0.0..ymax)?;
    ch.configure_mesh()
        .x_desc("M (tokens)")
        .y_desc("TB/s")
        .x_label_formatter(&crate::output::axis::count_tick)
        .y_label_formatter(&crate::output::axis::tick)
        .draw()?;
    if let Some(bw) = copy_bw {
        let y = bw / 1e12;
        ch.draw_series(LineSeries::new(
            vec![(mmin, y), (mmax, y)],
            BLACK.stroke_width(1),
        ))?
        .label(format!("copy bandwidth {y:.2} TB/s"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], BLACK));
    }
    for (i, col) in cols.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let mut pts: Vec<(f64, f64)> = cases
            .iter()
            .filter(|((c, _), _)| c == col)
            .map(|((_, m), c)| (*m as f64, c.derived.weight_bytes_per_s / 1e12))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        ch.draw_series(LineSeries::new(pts, color.stroke_width(2)))?;
    }
    ch.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}

fn draw_fastest(shapes: &ShapeCases<'_>, path: &Path) -> PlotResult {
    let mut all_ms: Vec<usize> = shapes
        .iter()
        .flat_map(|(_, c)| c.keys().map(|(_, m)| *m))
        .collect();
    all_ms.sort_unstable();
    all_ms.dedup();
    let mut impls: Vec<String> = Vec::new();
    let mut grid: Vec<(usize, usize, String)> = Vec::new();
    for (si, (_, cases)) in shapes.iter().enumerate() {
        for (mi, m) in all_ms.iter().enumerate() {
            if let Some((c, _)) = cases
                .iter()
                .filter(|((_, mm), _)| mm == m)
                .map(|((c, _), x)| (c.clone(), x.total_s()))
                .min_by(|a, b| a.1.total_cmp(&b.1))
            {
                if !impls.contains(&c) {
                    impls.push(c.clone());
                }
                grid.push((si, mi, c));
            }
        }
    }
    let h = 90 + 40 * shapes.len() as u32;
    let root = SVGBackend::new(path, (1200, h)).into_drawing_area();
    root.fill(&WHITE)?;
    let (chart_area, legend_area) = root.split_horizontally(960);
    let mut ch = ChartBuilder::on(&chart_area)
        .caption(
            "fastest implementation per shape and M (FP8 incl. act. quant)",
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(110)
        .build_cartesian_2d(
            (0..all_ms.len().saturating_sub(1)).into_segmented(),
            (0..shapes.len().saturating_sub(1)).into_segmented(),
        )?;
    let ms2 = all_ms.clone();
    let names: Vec<String> = shapes.iter().map(|(s, _)| s.clone()).collect();
    let label = |v: &SegmentValue<usize>, list: &dyn Fn(usize) -> String| match v {
        SegmentValue::CenterOf(i) => list(*i),
        _ => String::new(),
    };
    ch.configure_mesh()
        .disable_mesh()
        .x_labels(all_ms.len() + 1)
        .y_labels(shapes.len() + 1)
        .x_label_formatter(&|v| {
            label(v, &|i| {
                ms2.get(i).map(|m| thousands(*m as u64)).unwrap_or_default()
            })
        })
        .y_label_formatter(&|v| label(v, &|i| names.get(i).cloned().unwrap_or_default()))
        .x_desc("M (tokens)")
        .draw()?;
    for (idx, imp) in impls.iter().enumerate() {
        let color = PALETTE[idx % PALETTE.len()];
        ch.draw_series(grid.iter().filter(|g| &g.2 == imp).map(|(si, mi, _)| {
            Rectangle::new(
                [
                    (SegmentValue::Exact(*mi), SegmentValue::Exact(*si)),
                    (SegmentValue::Exact(mi + 1), SegmentValue::Exact(si + 1)),
                ],
                color.filled(),
            )
        }))?;
        ch.draw_series(grid.iter().filter(|g| &g.2 == imp).map(|(si, mi, _)| {
            Rectangle::new(
                [
                    (SegmentValue::Exact(*mi), SegmentValue::Exact(*si)),
                    (SegmentValue::Exact(mi + 1), SegmentValue::Exact(si + 1)),
                ],
                WHITE.stroke_width(3),
            )
        }))?;
        let y = 50 + 24 * idx as i32;
        legend_area.draw(&Rectangle::new([(10, y - 7), (24, y + 7)], color.filled()))?;
        legend_area.draw(&Text::new(imp.clone(), (32, y - 7), ("sans-serif", 14)))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::GemmFormat;
    use crate::kernels::schema::*;

    fn case(imp: &str, shape: &str, m: usize, t: f64) -> KernelCase {
        KernelCase {
            provider: "rigbench".into(),
            implementation: imp.into(),
            format: imp.parse().unwrap_or(GemmFormat::Bf16),
            shape: shape.into(),
            m,
            n: 64,
            k: 128,
            path: "test".into(),
            check: None,
            timing: Timing {
                samples_s: vec![t],
                median_s: t,
                p10_s: t,
                p90_s: t,
                rel_std: 0.0,
                stop_reason: None,
                cold_l2: true,
                graph: None,
            },
            extra: vec![],
            derived: Derived {
                weight_bytes_per_s: 1e12,
                speedup_vs_bf16: Some(1.0),
                ..Default::default()
            },
            sm_clock_mhz: None,
            throttle: vec![],
            graph: None,
            graph_skip: None,
            clocks: None,
        }
    }

    #[test]
    fn crossover_texts() {
        let pts = vec![
            (1, 1.0, 2.0),
            (16, 1.0, 2.0),
            (64, 3.0, 2.0),
            (1024, 3.0, 2.0),
        ];
        assert_eq!(
            crossover("w4a16", "fp8", &pts).unwrap(),
            "w4a16 is faster than fp8 up to M = 16; fp8 is faster from M = 64"
        );
        assert!(crossover("a", "b", &[(1, 3.0, 2.0)])
            .unwrap()
            .contains("never"));
        assert!(crossover("a", "b", &[(1, 1.0, 2.0), (2, 1.0, 2.0)])
            .unwrap()
            .contains("every M"));
    }

    #[test]
    fn wording_of_the_kernel_section() {
        // Nothing timed: no sentence about CUDA-event timing.
        let empty = KernelResults {
            timing_policy: None,
            ..Default::default()
        };
        let md = markdown(&empty, &[]);
        assert!(
            !md.contains("Times are medians") && md.contains("No kernel case was timed"),
            "{md}"
        );
        // FP8 with its activation quantization timed apart: both crossover lines, labelled.
        let mut fp8 = case("fp8", "qkv", 1, 0.9e-5);
        fp8.extra.push(NamedTiming {
            name: "activation_quant".into(),
            timing: Timing {
                median_s: 0.5e-5,
                ..fp8.timing.clone()
            },
        });
        let k = KernelResults {
            cases: vec![
                case("bf16", "qkv", 1, 3e-5),
                fp8,
                case("w4a16", "qkv", 1, 1e-5),
            ],
            skipped: ["qkv", "o_proj"]
                .iter()
                .map(|s| SkippedCase {
                    provider: "rigbench".into(),
                    implementation: "w4a4".into(),
                    shape: s.to_string(),
                    m: None,
                    reason: "unsupported on this card: sm_90 has no FP4 tensor cores".into(),
                })
                .collect(),
            ..Default::default()
        };
        let caps = crate::rig::capability::table("sm_90".parse().unwrap());
        let md = markdown_for(&k, &[], &caps);
        assert!(md.contains("Times are medians"), "{md}");
        assert!(
            md.contains("- FP8 excluding activation quantization: w4a16 is never faster than fp8"),
            "{md}"
        );
        assert!(
            md.contains(
                "- FP8 including activation quantization: w4a16 is faster than fp8 at every M"
            ),
            "{md}"
        );
        assert!(md.contains("### rigbench's kernel goals"), "{md}");
        assert!(md.contains("not a property of the card"), "{md}");
        // One row for the W4A4 skip on both shapes, with the capability table's word.
        assert!(
            md.contains("| qkv, o_proj ") || md.contains("all 2 shapes"),
            "{md}"
        );
        assert!(
            md.contains("fallback on this card") && !md.contains("unsupported"),
            "{md}"
        );
    }

    #[test]
    fn markdown_csv_and_plots_render() {
        let k = KernelResults {
            cases: vec![
                case("bf16", "qkv", 1, 3e-5),
                case("w4a16", "qkv", 1, 1e-5),
                case("bf16", "qkv", 64, 4e-5),
                case("w4a16", "qkv", 64, 2e-5),
            ],
            ..Default::default()
        };
        let md = markdown(&k, &["kernels_qkv.svg".into()]);
        assert!(md.contains("### `qkv`") && md.contains("kernels_qkv.svg"));
        assert!(md.contains("w4a16 is faster than bf16 at every M"));
        let c = csv(&k).unwrap();
        assert_eq!(c.lines().count(), 5);
        let d = tempfile::tempdir().unwrap();
        let files = write_plots(&k, d.path()).unwrap();
        assert_eq!(files, vec!["kernels_qkv.svg", "kernels_fastest.svg"]);
        let svg = std::fs::read_to_string(d.path().join("kernels_qkv.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("w4a16"));
    }

    fn with_quant(mut c: KernelCase, q: f64) -> KernelCase {
        c.extra.push(NamedTiming {
            name: ACT_QUANT.into(),
            timing: Timing {
                samples_s: vec![q],
                median_s: q,
                ..Default::default()
            },
        });
        c
    }

    fn step_results() -> KernelResults {
        let mut cases = Vec::new();
        for (shape, f) in [("a", 1.0), ("b", 2.0)] {
            for m in [1usize, 16] {
                cases.push(case("bf16", shape, m, 20e-6 * f));
                // FP8's GEMM alone is the fastest, but not with its activation quantization.
                cases.push(with_quant(case("fp8", shape, m, 8e-6 * f), 8e-6));
                cases.push(case("w4a16", shape, m, 10e-6 * f));
                let mut p = case("torch._scaled_mm", shape, m, 7e-6 * f);
                p.provider = "torch".into();
                p.format = GemmFormat::Fp8;
                cases.push(p);
            }
        }
        for c in &mut cases {
            c.derived.weight_bytes = if c.shape == "a" { 1_000_000 } else { 3_000_000 };
        }
        // A noisy case.
        cases[2].timing.rel_std = 0.2;
        KernelResults {
            suite: SuiteInfo {
                name: "t".into(),
                decode_step: Some(DecodeStep {
                    description: "a test step".into(),
                    complete: true,
                    shapes: vec![
                        StepShape {
                            shape: "a".into(),
                            n: 64,
                            k: 128,
                            count: 2,
                        },
                        StepShape {
                            shape: "b".into(),
                            n: 64,
                            k: 128,
                            count: 3,
                        },
                    ],
                }),
                ..Default::default()
            },
            timing_policy: Some(TimingPolicy {
                warmup_iters: 3,
                stopping: crate::stats::StoppingRule::default(),
                l2_flush_bytes: 1 << 20,
                timer: "events".into(),
                modes: TimingModes::Cold,
                graph: None,
            }),
            copy_bandwidth: Some(CopyBandwidth {
                bytes: 1 << 30,
                median_s: 5e-4,
                bytes_per_s: 4.2e12,
                samples: 20,
            }),
            cases,
            ..Default::default()
        }
    }

    #[test]
    fn one_denominator_quant_in_fastest_and_noisy_flags() {
        let k = step_results();
        let md = markdown(&k, &[]);
        // rigbench's fp8 column says it includes the quantization; the peer's says it does not.
        assert!(md.contains("fp8 (+ act. quant)"), "{md}");
        assert!(md.contains("torch:torch._scaled_mm (GEMM only: act. quant not timed)"));
        // fp8 total 16 µs against bf16's 20: 1.25×, and w4a16 (10 µs) is the fastest of
        // rigbench's rows once quantization is counted (the peer's GEMM alone is 7 µs).
        assert!(md.contains("16.0 µs (1.25×)"), "{md}");
        assert!(
            md.contains("7.0 µs (2.86×)"),
            "the peer's speedup uses rigbench's bf16: {md}"
        );
        assert!(md.contains("w4a16 is faster than fp8 at every M"), "{md}");
        assert!(
            md.contains(" ‡") && md.contains("w4a16 M = 1: σ/mean 20.0%"),
            "{md}"
        );
        // The composite, the fits and the goals are there.
        assert!(md.contains("### Decode-step composite: a test step"));
        assert!(md.contains("fp8 (incl. act. quant, per-tensor"), "{md}");
        assert!(md.contains("### Fixed cost and streaming rate"));
        assert!(md.contains("### rigbench's kernel goals"));
        assert!(
            !md.contains("### Timing modes"),
            "no graph timing asked for"
        );
        let d = tempfile::tempdir().unwrap();
        let files = write_plots(&k, d.path()).unwrap();
        assert!(files.contains(&COMPOSITE_PLOT.to_string()));
        let svg = std::fs::read_to_string(d.path().join(COMPOSITE_PLOT)).unwrap();
        assert!(svg.contains("NVFP4 byte floor"), "{svg}");
        assert!(svg.contains("w4a16") && svg.contains("torch:torch._scaled_mm"));
        let csv_text = csv(&k).unwrap();
        let header = csv_text.lines().next().unwrap();
        assert!(header.ends_with("throttle_seen") && header.contains(",total_s,"));
        let fp8_row = csv_text
            .lines()
            .find(|l| l.starts_with("rigbench,fp8,fp8,a,1,"))
            .unwrap();
        assert!(
            fp8_row.contains(&format!(",{},", 8e-6f64 + 8e-6)),
            "total_s = GEMM + quantization: {fp8_row}"
        );
    }

    #[test]
    fn graph_mode_is_said_in_the_conditions() {
        let mut k = step_results();
        if let Some(p) = k.timing_policy.as_mut() {
            p.modes = TimingModes::Graph;
        }
        let md = markdown(&k, &[]);
        assert!(md.contains("Timing mode: **graph**"), "{md}");
    }

    #[test]
    fn h200_report_renders_the_composite_rows() {
        let k = crate::kernels::composite::tests::h200_run();
        let md = markdown(&k, &[COMPOSITE_PLOT.to_string()]);
        assert!(md.contains("| 1     | 13.92 ms (1.00×)"), "{md}");
        // M digit-grouped, as in the per-shape tables.
        assert!(md.contains("| 1,024 |"), "{md}");
        assert!(md.contains("w4a16 is faster than bf16 up to M = 16; bf16 is faster from M = 32"));
        assert!(md.contains("![decode-step composite"));
        assert!(md.contains("| NVFP4   | 14.41 GB       | 3.40 ms"), "{md}");
    }
}
