//! The verdict: five to ten lines at the top of a report that answer at a glance, written only
//! from the results (never from this machine), so `report --render` of an old results.json
//! writes the same verdict as the run that made it.
//!
//! Lines, each present only when its part of the results is:
//! 1. what the card runs natively per format, and what falls back to what (capability table);
//! 2. the fastest format by M range: the best implementation measured for each format, peers
//!    (engine kernels) included and named, FP8 including its activation quantization, over the
//!    decode-step composite (else the format fastest on most shapes at each M); formats within
//!    [`SAME_WITHIN`] of the fastest are joined with "≈";
//! 3. the crossovers per shape (W4A16 against FP8 and BF16, best implementation of each), and
//!    rigbench's own kernels against the best peer of their format (composite time ratios);
//! 4. the measured limits (copy bandwidth, highest BF16/FP8 TFLOP/s) and throttling seen;
//! 5. the decode-step composite headline;
//! 6. whether the end-to-end figures ran on this GPU, and on which backend;
//! 7. the checkpoint findings, when a checkpoint was given;
//! 8. the CPU reference accuracy of each format (every report has it);
//! 9. everything skipped, with the reason.
//!
//! Sections that are absent (no GPU, `--no-kernels`, `--no-e2e`, an interrupted run) give no
//! line or a line that says so; nothing here panics on partial results.

use std::collections::BTreeMap;

use super::schema::Results;
use crate::formats::GemmFormat;
use crate::kernels::schema::{KernelCase, KernelResults};
use crate::output::table::thousands;
use crate::rig::Support;

/// Formats whose composite times are within this fraction of the fastest are "≈" it.
pub const SAME_WITHIN: f64 = 0.02;

/// One point of the decode-step composite: the summed GEMM time of every linear layer of one
/// decode step of the suite's model at `m`, for one implementation (FP8 including its activation
/// quantization). See docs/architecture.md, "Terms", and [`crate::kernels::composite`].
#[derive(Debug, Clone, PartialEq)]
pub struct StepPoint {
    /// The format (`BF16`, `FP8`, `W4A16`, `W4A4`), or the format and the implementation
    /// (`W4A16 (Humming)`) in the lines that name it.
    pub format: String,
    /// Tokens in flight.
    pub m: usize,
    /// Summed GEMM time of one decode step, seconds.
    pub time_s: f64,
}

/// The timing the verdict reads: graph timing when peers (engine kernels, dispatched from Python)
/// have graph-timed composite rows, as cold single launches would charge them their host
/// dispatch; otherwise cold timing, or graph timing when the run had only that.
pub fn verdict_timing(
    c: &crate::kernels::composite::Composite,
) -> crate::kernels::composite::StepTiming {
    use crate::kernels::composite::StepTiming;
    let has = |t: StepTiming, peer: bool| {
        c.rows
            .iter()
            .any(|r| r.timing == t && (r.provider != "rigbench") == peer)
    };
    if has(StepTiming::Graph, true) && has(StepTiming::Graph, false) {
        StepTiming::Graph
    } else if has(StepTiming::Cold, false) || has(StepTiming::Cold, true) {
        StepTiming::Cold
    } else {
        StepTiming::Graph
    }
}

/// A short name for an implementation in the verdict: rigbench's own kernel is `rigbench`, its
/// cuBLASLt rows `cuBLASLt` (FP8 per tensor or per token), peers by their library.
pub fn impl_label(provider: &str, implementation: &str) -> String {
    match (provider, implementation) {
        ("rigbench", "w4a16") => "rigbench".into(),
        ("rigbench", "fp8") => "cuBLASLt, per-tensor act. quant".into(),
        ("rigbench", "fp8-rowwise") => "cuBLASLt, per-token act. quant".into(),
        ("rigbench", _) => "cuBLASLt".into(),
        ("humming", _) => "Humming".into(),
        ("vllm-marlin", _) => "vLLM Marlin".into(),
        ("vllm", _) => "vLLM".into(),
        ("gemlite", _) => "gemlite INT4 g128".into(),
        ("torch", "torch._weight_int4pack_mm") => "tinygemm INT4 g128".into(),
        ("torch", i) => i.to_string(),
        (p, i) => format!("{p}:{i}"),
    }
}

/// The decode-step composite rows the verdict reads (recorded, or computed from the suite's
/// per-step counts), in [`verdict_timing`]; with whether the shapes cover the whole step, and the
/// timing. Empty when the results carry no per-step counts.
fn composite_rows(
    k: &KernelResults,
) -> (
    Vec<crate::kernels::composite::CompositeRow>,
    bool,
    Option<crate::kernels::composite::StepTiming>,
) {
    let Some(c) = k
        .composite
        .clone()
        .or_else(|| crate::kernels::composite::compute(k))
    else {
        return (Vec::new(), false, None);
    };
    let t = verdict_timing(&c);
    let rows = c
        .rows
        .iter()
        .filter(|r| r.timing == t && r.median_s > 0.0)
        .cloned()
        .collect();
    (rows, c.step.complete, Some(t))
}

/// The decode-step composite of rigbench's own implementations in `k` (recorded, or computed
/// from the suite's per-step counts), in the verdict's timing ([`verdict_timing`]), the best of
/// each format; with whether the shapes cover the whole step. Empty when the results carry no
/// per-step counts (results written before the composite existed).
pub fn composite_points(k: &KernelResults) -> (Vec<StepPoint>, bool) {
    let (rows, complete, _) = composite_rows(k);
    let own: Vec<_> = rows
        .into_iter()
        .filter(|r| r.provider == "rigbench")
        .collect();
    (best_points(&own, false), complete)
}

/// The fastest row of each format at each M as points; `named`: the format carries the
/// implementation (`W4A16 (Humming)`).
fn best_points(rows: &[crate::kernels::composite::CompositeRow], named: bool) -> Vec<StepPoint> {
    let mut out: Vec<StepPoint> = Vec::new();
    let mut best: BTreeMap<(usize, GemmFormat), &crate::kernels::composite::CompositeRow> =
        BTreeMap::new();
    for r in rows {
        let e = best.entry((r.m, r.format)).or_insert(r);
        if r.median_s < e.median_s {
            *e = r;
        }
    }
    for ((m, f), r) in best {
        out.push(StepPoint {
            format: if named {
                format!(
                    "{} ({})",
                    short_name(f),
                    impl_label(&r.provider, &r.implementation)
                )
            } else {
                short_name(f).to_string()
            },
            m,
            time_s: r.median_s,
        });
    }
    out
}

/// The verdict's lines (Markdown inline: `**bold**` lead-ins and backticks).
pub fn lines(r: &Results) -> Vec<String> {
    let mut out = Vec::new();
    // A part that was asked for and failed comes first, with its whole reason.
    for f in &r.failed {
        out.push(format!(
            "**FAILED: {}**: {}.",
            f.what,
            one_line(&f.reason).trim_end_matches('.')
        ));
    }
    if !r.complete {
        out.push("**Run INCOMPLETE** (interrupted or still running): every line below covers only what was measured before it stopped.".to_string());
    }
    out.push(formats_line(r));
    if let Some(k) = &r.kernels {
        let cases = passing_cases(k);
        if cases.iter().any(|c| c.provider == "rigbench") {
            let (rows, complete, timing) = composite_rows(k);
            let graph = timing == Some(crate::kernels::composite::StepTiming::Graph);
            let named = best_points(&rows, true);
            if let Some(l) =
                fastest_by_composite(&named, graph).or_else(|| fastest_line(&cases, graph))
            {
                out.push(l);
            }
            if let Some(l) = crossover_line(&cases, graph) {
                out.push(l);
            }
            if let Some(l) = own_vs_peer_line(&rows, graph) {
                out.push(l);
            }
            if let Some(l) = limits_line(r, k) {
                out.push(l);
            }
            let mut l = composite_line(&named);
            if graph {
                l = l.replacen("(summed GEMM time", "(graph timing; summed GEMM time", 1);
            }
            if !named.is_empty() && !complete {
                l.push_str(" These shapes are only part of a decode step: the sums are a part of its linear-layer time.");
            }
            out.push(l);
        }
    }
    if let Some(l) = multigpu_line(r) {
        out.push(l);
    }
    if let Some(l) = runtime_line(r) {
        out.push(l);
    }
    if let Some(l) = e2e_line(r) {
        out.push(l);
    }
    if let Some(l) = checkpoint_line(r) {
        out.push(l);
    }
    // With timed kernels the accuracy study is in the kernel section; without, it is the only
    // kernel figure and belongs in the verdict.
    let timed = r.kernels.as_ref().is_some_and(|k| !k.cases.is_empty());
    if !timed {
        if let Some(l) = accuracy_line(r) {
            out.push(l);
        }
    }
    out.push(skipped_line(r));
    out
}

/// The verdict as a Markdown section (`## Verdict` and one bullet per line).
pub fn markdown(r: &Results) -> String {
    let mut o = String::from("## Verdict\n\n");
    for l in lines(r) {
        o.push_str(&format!("- {l}\n"));
    }
    o.push('\n');
    o
}

/// The verdict as plain text for a terminal: the Markdown emphasis removed.
pub fn text(r: &Results) -> String {
    lines(r)
        .iter()
        .map(|l| format!("- {}\n", l.replace("**", "")))
        .collect()
}

fn short_name(f: GemmFormat) -> &'static str {
    match f {
        GemmFormat::Bf16 => "BF16",
        GemmFormat::Fp8 => "FP8",
        GemmFormat::W4a16 => "W4A16",
        GemmFormat::W4a4 => "W4A4",
    }
}

fn join_and(v: &[String]) -> String {
    match v.len() {
        0 => String::new(),
        1 => v[0].clone(),
        n => format!("{} and {}", v[..n - 1].join(", "), v[n - 1]),
    }
}

/// The first clause of a long reason, for a one-line summary: up to the first `; ` that is not
/// inside parentheses, brackets, backticks or quotes (a command such as `(echo boom; exit 3)` is
/// never cut), on its first line.
fn first_clause(s: &str) -> &str {
    let line = s.lines().next().unwrap_or(s);
    let mut depth = 0i32;
    let mut quoted: Option<char> = None;
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match (quoted, c) {
            (Some(q), c) if c == q => quoted = None,
            (Some(_), _) => {}
            (None, '`') | (None, '"') => quoted = Some(c),
            // An apostrophe inside a word ("engine's") opens nothing.
            (None, '\'') if !prev.is_alphanumeric() => quoted = Some(c),
            (None, '(' | '[' | '{') => depth += 1,
            (None, ')' | ']' | '}') => depth -= 1,
            (None, ';') if depth <= 0 && line[i + 1..].starts_with(' ') => {
                return line[..i].trim_end_matches('.');
            }
            _ => {}
        }
        prev = c;
    }
    line.trim_end_matches('.')
}

/// A reason on one line: its lines trimmed and joined (`; ` after a line that ends a clause, a
/// space after one that ends with `:`).
fn one_line(s: &str) -> String {
    let mut o = String::new();
    for l in s.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !o.is_empty() {
            o.push_str(if o.ends_with(':') { " " } else { "; " });
        }
        o.push_str(l);
    }
    o
}

fn formats_line(r: &Results) -> String {
    let Some(cc) = r.rig.compute_capability() else {
        let why = r
            .rig
            .gpu_absent_reason
            .clone()
            .unwrap_or_else(|| "no GPU found".into());
        return format!("**No GPU on this machine** ({why}): no kernel was timed; the capability table below covers every compute capability.");
    };
    let name = r
        .rig
        .gpu
        .as_ref()
        .map(|g| g.name.clone())
        .unwrap_or_default();
    let caps = &r.rig.capabilities;
    if caps.is_empty() {
        return format!("**Formats on {name} ({cc}):** no capability table in these results.");
    }
    let native: Vec<String> = caps
        .iter()
        .filter(|c| c.support == Support::Native)
        .map(|c| c.format.display_name().to_string())
        .collect();
    let mut parts = Vec::new();
    if !native.is_empty() {
        parts.push(format!("native {}", join_and(&native)));
    }
    for c in caps.iter().filter(|c| c.support == Support::Fallback) {
        parts.push(format!(
            "{} is a **fallback**, since {}: it runs as the {}",
            c.format.display_name(),
            c.reason,
            c.path
        ));
    }
    for c in caps.iter().filter(|c| c.support == Support::Unsupported) {
        parts.push(format!(
            "{} is **unsupported** ({})",
            c.format.display_name(),
            c.reason
        ));
    }
    format!("**Formats on {name} ({cc}):** {}.", parts.join("; "))
}

/// Every timed case (rigbench's and peers') whose correctness check passed.
fn passing_cases(k: &KernelResults) -> Vec<&KernelCase> {
    k.cases
        .iter()
        .filter(|c| c.check.as_ref().is_none_or(|x| x.passed))
        .filter(|c| c.timing.median_s.is_finite() && c.timing.median_s > 0.0)
        .collect()
}

/// A case's time with its activation quantization (FP8) added, in graph timing (`graph`) or in
/// its cold timing; `None` when it has no such timing.
fn time_incl(c: &KernelCase, graph: bool) -> Option<f64> {
    if graph {
        c.graph_total_s()
    } else {
        let t = c.cold_timing()?;
        Some(t.median_s + KernelCase::act_quant(&c.extra).map_or(0.0, |q| q.median_s))
    }
}

/// (shape → (format → (M → the best time of the format's implementations))) in suite order of
/// shapes.
type Grid = Vec<(String, BTreeMap<GemmFormat, BTreeMap<usize, f64>>)>;

fn grid(cases: &[&KernelCase], graph: bool) -> Grid {
    let mut g: Grid = Vec::new();
    for c in cases {
        let Some(t) = time_incl(c, graph) else {
            continue;
        };
        let i = match g.iter().position(|(s, _)| *s == c.shape) {
            Some(i) => i,
            None => {
                g.push((c.shape.clone(), BTreeMap::new()));
                g.len() - 1
            }
        };
        let e = g[i].1.entry(c.format).or_default().entry(c.m).or_insert(t);
        if t < *e {
            *e = t;
        }
    }
    g
}

fn m_range(a: usize, b: usize) -> String {
    if a == b {
        format!("M = {}", thousands(a as u64))
    } else {
        format!("M = {}…{}", thousands(a as u64), thousands(b as u64))
    }
}

fn fastest_line(cases: &[&KernelCase], graph: bool) -> Option<String> {
    let g = grid(cases, graph);
    let mut ms: Vec<usize> = cases.iter().map(|c| c.m).collect();
    ms.sort_unstable();
    ms.dedup();
    // Per M: the format fastest on most shapes (ties joined with "/").
    let mut winners: Vec<(usize, String)> = Vec::new();
    for &m in &ms {
        let mut wins: BTreeMap<GemmFormat, usize> = BTreeMap::new();
        for (_, fm) in &g {
            let times: Vec<(GemmFormat, f64)> = fm
                .iter()
                .filter_map(|(f, t)| t.get(&m).map(|t| (*f, *t)))
                .collect();
            if times.len() < 2 {
                continue;
            }
            if let Some((f, _)) = times.iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
                *wins.entry(*f).or_default() += 1;
            }
        }
        let Some(best) = wins.values().copied().max() else {
            continue;
        };
        let names: Vec<&str> = wins
            .iter()
            .filter(|(_, n)| **n == best)
            .map(|(f, _)| short_name(*f))
            .collect();
        winners.push((m, names.join("/")));
    }
    if winners.is_empty() {
        return None;
    }
    let text = segments(winners);
    Some(format!(
        "**Fastest format by M** (best implementation of each format, peers included; FP8 including its activation quantization; {} timing; the format fastest on most of the {} shapes at each M): {}.",
        if graph { "graph" } else { "cold" },
        g.len(),
        text
    ))
}

/// `(M, label)` runs joined: `**A** at M = 1…4, **B** at M = 16`.
fn segments(points: Vec<(usize, String)>) -> String {
    let mut segs: Vec<(String, usize, usize)> = Vec::new();
    for (m, w) in points {
        match segs.last_mut() {
            Some(s) if s.0 == w => s.2 = m,
            _ => segs.push((w, m, m)),
        }
    }
    segs.iter()
        .map(|(w, a, b)| format!("**{w}** at {}", m_range(*a, *b)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The fastest format by M range from the decode-step composite, when the results have one:
/// `points` are the best implementation of each format at each M, named; formats within
/// [`SAME_WITHIN`] of the fastest are joined with "≈".
fn fastest_by_composite(points: &[StepPoint], graph: bool) -> Option<String> {
    let mut ms: Vec<usize> = points.iter().map(|p| p.m).collect();
    ms.sort_unstable();
    ms.dedup();
    let mut per_m: Vec<(usize, String)> = Vec::new();
    for m in ms {
        let mut here: Vec<&StepPoint> = points.iter().filter(|p| p.m == m).collect();
        if here.len() < 2 {
            continue;
        }
        here.sort_by(|a, b| a.time_s.total_cmp(&b.time_s));
        let best = here[0].time_s;
        let same: Vec<&str> = here
            .iter()
            .take_while(|p| p.time_s <= best * (1.0 + SAME_WITHIN))
            .map(|p| p.format.as_str())
            .collect();
        per_m.push((m, same.join(" ≈ ")));
    }
    if per_m.is_empty() {
        return None;
    }
    Some(format!(
        "**Fastest format by M** (the best implementation measured for each format, peers included and named, over one decode step, the composite below; {} timing; FP8 including its activation quantization; \"≈\": within {:.0}%): {}.",
        if graph { "graph" } else { "cold" },
        SAME_WITHIN * 100.0,
        segments(per_m)
    ))
}

/// rigbench's own kernel of each format against the best peer of the same format, as composite
/// time ratios (< 1: rigbench's is faster), at a few M.
fn own_vs_peer_line(
    rows: &[crate::kernels::composite::CompositeRow],
    graph: bool,
) -> Option<String> {
    let mut parts = Vec::new();
    for f in [GemmFormat::W4a16, GemmFormat::Fp8, GemmFormat::Bf16] {
        let mut ms: Vec<usize> = rows.iter().filter(|r| r.format == f).map(|r| r.m).collect();
        ms.sort_unstable();
        ms.dedup();
        let mut pts: Vec<(usize, f64, String)> = Vec::new();
        for m in ms {
            let best = |own: bool| {
                rows.iter()
                    .filter(|r| r.format == f && r.m == m && (r.provider == "rigbench") == own)
                    .min_by(|a, b| a.median_s.total_cmp(&b.median_s))
            };
            if let (Some(o), Some(p)) = (best(true), best(false)) {
                pts.push((
                    m,
                    o.median_s / p.median_s,
                    format!(
                        "{} vs {}",
                        impl_label(&o.provider, &o.implementation),
                        impl_label(&p.provider, &p.implementation)
                    ),
                ));
            }
        }
        if pts.is_empty() {
            continue;
        }
        let picked: Vec<&(usize, f64, String)> = pts
            .iter()
            .filter(|p| [1, 4, 16, 64, 128, 1024].contains(&p.0))
            .collect();
        let show: Vec<&(usize, f64, String)> = if picked.is_empty() {
            pts.iter().collect()
        } else {
            picked
        };
        // The pair compared is named where it changes.
        let mut last: Option<&str> = None;
        let list: Vec<String> = show
            .iter()
            .map(|(m, r, who)| {
                let named = if last == Some(who.as_str()) {
                    String::new()
                } else {
                    format!(" ({who})")
                };
                last = Some(who.as_str());
                format!("{r:.2} at M = {}{named}", thousands(*m as u64))
            })
            .collect();
        let summary = if pts.iter().all(|p| p.1 < 1.0) {
            "rigbench's faster at every M".to_string()
        } else {
            match pts.iter().take_while(|p| p.1 < 1.0).last() {
                Some(p) => format!("rigbench's faster up to M = {}", thousands(p.0 as u64)),
                None => "rigbench's slower from the smallest M".to_string(),
            }
        };
        parts.push(format!(
            "{}: own ÷ best peer time {}; {summary}",
            short_name(f),
            list.join(", ")
        ));
    }
    if parts.is_empty() {
        return None;
    }
    Some(format!(
        "**rigbench's kernels against the best peer of their format** (decode-step composite, {} timing): {}.",
        if graph { "graph" } else { "cold" },
        parts.join("; ")
    ))
}

/// How `a` compares with `b` on one shape over M.
#[derive(Debug, Clone, PartialEq)]
enum Cross {
    Always,
    Never,
    /// Faster from the smallest M up to this M, slower from the next M on.
    UpTo(usize),
    /// Slower at the smallest M, faster from this M on.
    From(usize),
    Mixed,
}

fn cross(a: &BTreeMap<usize, f64>, b: &BTreeMap<usize, f64>) -> Option<Cross> {
    let pts: Vec<(usize, bool)> = a
        .iter()
        .filter_map(|(m, ta)| b.get(m).map(|tb| (*m, ta < tb)))
        .collect();
    if pts.is_empty() {
        return None;
    }
    if pts.iter().all(|p| p.1) {
        return Some(Cross::Always);
    }
    if pts.iter().all(|p| !p.1) {
        return Some(Cross::Never);
    }
    let first_loss = pts.iter().position(|p| !p.1).unwrap_or(pts.len());
    let first_win = pts.iter().position(|p| p.1).unwrap_or(pts.len());
    if first_loss > 0 && pts[first_loss..].iter().all(|p| !p.1) {
        Some(Cross::UpTo(pts[first_loss - 1].0))
    } else if first_win > 0 && pts[first_win..].iter().all(|p| p.1) {
        Some(Cross::From(pts[first_win].0))
    } else {
        Some(Cross::Mixed)
    }
}

fn cross_summary(g: &Grid, a: GemmFormat, b: GemmFormat) -> Option<String> {
    let mut by: Vec<(String, Cross)> = Vec::new();
    for (shape, fm) in g {
        if let (Some(ta), Some(tb)) = (fm.get(&a), fm.get(&b)) {
            if let Some(c) = cross(ta, tb) {
                by.push((shape.clone(), c));
            }
        }
    }
    if by.is_empty() {
        return None;
    }
    let mut upto: BTreeMap<usize, usize> = BTreeMap::new();
    let mut from: BTreeMap<usize, usize> = BTreeMap::new();
    let mut never = Vec::new();
    let mut always = Vec::new();
    let mut mixed = Vec::new();
    for (s, c) in &by {
        match c {
            Cross::UpTo(m) => *upto.entry(*m).or_default() += 1,
            Cross::From(m) => *from.entry(*m).or_default() += 1,
            Cross::Never => never.push(format!("`{s}`")),
            Cross::Always => always.push(format!("`{s}`")),
            Cross::Mixed => mixed.push(format!("`{s}`")),
        }
    }
    let shapes = |c: usize| format!("{c} shape{}", if c == 1 { "" } else { "s" });
    let mut parts: Vec<String> = upto
        .iter()
        .map(|(m, c)| format!("up to M = {} on {}", thousands(*m as u64), shapes(*c)))
        .collect();
    parts.extend(
        from.iter()
            .map(|(m, c)| format!("from M = {} on {}", thousands(*m as u64), shapes(*c))),
    );
    if !always.is_empty() {
        parts.push(format!("at every M on {}", join_and(&always)));
    }
    if !never.is_empty() {
        parts.push(format!("never on {}", join_and(&never)));
    }
    if !mixed.is_empty() {
        parts.push(format!("at scattered M on {}", join_and(&mixed)));
    }
    let what = if b == GemmFormat::Fp8 {
        "FP8 (activation quantization included)".to_string()
    } else {
        short_name(b).to_string()
    };
    Some(format!("faster than {what} {}", parts.join(", ")))
}

fn crossover_line(cases: &[&KernelCase], graph: bool) -> Option<String> {
    let g = grid(cases, graph);
    let parts: Vec<String> = [GemmFormat::Fp8, GemmFormat::Bf16]
        .iter()
        .filter_map(|b| cross_summary(&g, GemmFormat::W4a16, *b))
        .collect();
    if parts.is_empty() {
        return None;
    }
    Some(format!(
        "**Crossovers** ({} shapes; best implementation of each format per shape and M, peers included; {} timing): W4A16 is {} (per-shape lines under each table).",
        g.len(),
        if graph { "graph" } else { "cold" },
        parts.join("; it is ")
    ))
}

fn limits_line(r: &Results, k: &KernelResults) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(c) = &k.copy_bandwidth {
        parts.push(format!("copy bandwidth {:.2} TB/s", c.bytes_per_s / 1e12));
    }
    for p in crate::kernels::peak::measured_peaks(k) {
        if p.arithmetic == GemmFormat::W4a4 {
            continue;
        }
        parts.push(format!(
            "{} up to {} TFLOP/s ({})",
            short_name(p.arithmetic),
            crate::kernels::peak::fmt_tflops(p.tflops),
            p.at
        ));
    }
    if parts.is_empty() {
        return None;
    }
    let mut s = format!("**Measured limits in this run:** {}", parts.join(", "));
    // Throttling seen, per (shape, M) group: rigbench's own cases, as the Notes count and name
    // them (one note per group, with the lowest SM clock any of the group's cases read); the
    // peers' cases after, when they saw it too.
    let (own, peers): (Vec<&KernelCase>, Vec<&KernelCase>) =
        k.cases.iter().partition(|c| c.provider == "rigbench");
    let max = r
        .rig
        .gpu
        .as_ref()
        .and_then(|g| g.telemetry.as_ref())
        .and_then(|t| t.sm_clock_max_mhz);
    let own_t = throttling(&own);
    let peer_t = throttling(&peers);
    let mhz = |l: Option<u32>| {
        l.map(|l| format!(", lowest SM clock read {} MHz", thousands(u64::from(l))))
            .unwrap_or_default()
    };
    match (&own_t, &peer_t) {
        (None, None) => s.push_str("; no throttling recorded."),
        (Some(t), _) => {
            s.push_str(&format!(
                "; throttling ({}) in {} of {} (shape, M) groups of rigbench's cases{}{}",
                t.reasons.join(", "),
                t.throttled,
                t.groups,
                mhz(t.lowest_mhz),
                max.map(|m| format!(" (max {} MHz)", thousands(u64::from(m))))
                    .unwrap_or_default()
            ));
            if let Some(p) = &peer_t {
                s.push_str(&format!(
                    "; the peers' cases in {} of {} groups{}",
                    p.throttled,
                    p.groups,
                    mhz(p.lowest_mhz)
                ));
            }
            s.push_str(": those figures may be low (see Notes).");
        }
        (None, Some(p)) => s.push_str(&format!(
            "; no throttling in rigbench's cases; throttling ({}) in {} of {} (shape, M) groups of the peers' cases{}: those figures may be low.",
            p.reasons.join(", "),
            p.throttled,
            p.groups,
            mhz(p.lowest_mhz)
        )),
    }
    Some(s)
}

/// Throttling seen in a set of kernel cases, counted per (shape, M) group.
struct Throttling {
    /// The harmful throttle reasons seen, sorted.
    reasons: Vec<String>,
    /// Groups with at least one throttled case.
    throttled: usize,
    /// Groups in all.
    groups: usize,
    /// The lowest SM clock any case of a throttled group read while sampled, as the kernel
    /// bench's Notes give it per group; for results without clock readings, the lowest median
    /// clock of a throttled case.
    lowest_mhz: Option<u32>,
}

fn throttling(cases: &[&KernelCase]) -> Option<Throttling> {
    let mut groups: Vec<(&str, usize)> = cases.iter().map(|c| (c.shape.as_str(), c.m)).collect();
    groups.sort_unstable();
    groups.dedup();
    let mut throttled: Vec<(&str, usize)> = cases
        .iter()
        .filter(|c| !c.throttle.is_empty())
        .map(|c| (c.shape.as_str(), c.m))
        .collect();
    throttled.sort_unstable();
    throttled.dedup();
    if throttled.is_empty() {
        return None;
    }
    let mut reasons: Vec<String> = cases.iter().flat_map(|c| c.throttle.clone()).collect();
    reasons.sort_unstable();
    reasons.dedup();
    let in_throttled = |c: &&&KernelCase| throttled.contains(&(c.shape.as_str(), c.m));
    let read = cases
        .iter()
        .filter(in_throttled)
        .filter_map(|c| c.clocks.as_ref().and_then(|st| st.min_mhz))
        .min();
    let median = cases
        .iter()
        .filter(|c| !c.throttle.is_empty())
        .filter_map(|c| c.sm_clock_mhz)
        .min();
    Some(Throttling {
        reasons,
        throttled: throttled.len(),
        groups: groups.len(),
        lowest_mhz: read.or(median),
    })
}

/// The decode-step composite headline from `points` (see [`composite_points`]).
pub fn composite_line(points: &[StepPoint]) -> String {
    if points.is_empty() {
        return "**Decode-step composite:** not in these results (they carry no per-step count of each shape), so no decode tok/s bound from the linear layers is given.".to_string();
    }
    let mut ms: Vec<usize> = points.iter().map(|p| p.m).collect();
    ms.sort_unstable();
    ms.dedup();
    let at = |m: usize| -> String {
        let mut v: Vec<&StepPoint> = points.iter().filter(|p| p.m == m).collect();
        v.sort_by(|a, b| a.time_s.total_cmp(&b.time_s));
        let list: Vec<String> = v
            .iter()
            .map(|p| {
                format!(
                    "{} {}",
                    p.format,
                    crate::output::table::human_seconds(p.time_s)
                )
            })
            .collect();
        // Every sequence in flight gains one token per step: M / time.
        let bound = v
            .first()
            .map(|p| {
                format!(
                    " (≤ {} tok/s{} from the linear layers alone)",
                    thousands((m as f64 / p.time_s).round() as u64),
                    if m == 1 {
                        String::new()
                    } else {
                        format!(" over the {m} sequences")
                    }
                )
            })
            .unwrap_or_default();
        format!(
            "at M = {}: {}{bound}",
            thousands(m as u64),
            list.join(" < ")
        )
    };
    let mut parts = vec![at(ms[0])];
    // The first M where the fastest format changes, if any.
    let fastest = |m: usize| {
        points
            .iter()
            .filter(|p| p.m == m)
            .min_by(|a, b| a.time_s.total_cmp(&b.time_s))
            .map(|p| p.format.clone())
    };
    let f0 = fastest(ms[0]);
    if let Some(m) = ms.iter().copied().find(|m| fastest(*m) != f0) {
        parts.push(at(m));
    }
    format!(
        "**Decode-step composite** (summed GEMM time of one decode step; FP8 including activation quantization): {}.",
        parts.join("; ")
    )
}

fn e2e_line(r: &Results) -> Option<String> {
    let e = r.e2e.as_ref()?;
    let f = &e.engine.facts;
    let gpu_name = r.rig.gpu.as_ref().map(|g| g.name.clone());
    let model = f
        .model
        .as_ref()
        .map(|m| format!(" serving `{}`", m.value))
        .unwrap_or_default();
    let engine = match e.engine.kind.as_str() {
        "builtin" => format!("rigbench's built-in runtime{model}"),
        _ => {
            let name = f
                .name
                .as_ref()
                .map(|n| n.value.clone())
                .unwrap_or_else(|| "an engine".into());
            let ver = f
                .version
                .as_ref()
                .map(|v| format!(" {}", v.value))
                .unwrap_or_default();
            format!("{name}{ver}{model}")
        }
    };
    let rt = f.runtime.as_ref();
    let backend = rt
        .and_then(|r| r.backend.as_ref())
        .map(|b| b.value.to_ascii_uppercase());
    let not_here = |what: &str| {
        match &gpu_name {
        Some(g) => format!(
            "on the **{what} backend**, **not on {g}**: a harness self-test, not a figure of this card"
        ),
        None => format!("on the **{what} backend** (this machine has no GPU)"),
    }
    };
    let where_ = match (e.engine.kind.as_str(), backend.as_deref()) {
        (_, Some(b)) if b.contains("CUDA") || b.contains("GPU") => {
            let dev = rt
                .and_then(|r| r.device.as_ref())
                .map(|d| d.value.clone())
                .or_else(|| gpu_name.clone())
                .unwrap_or_default();
            format!("on the GPU: {dev}, {b} backend")
        }
        (_, Some(b)) => not_here(b),
        ("builtin", None) => format!(
            "{} (the backend is not recorded in these results; the built-in runtime had no other when they were written)",
            not_here("CPU")
        ),
        (_, None) => "on a device the engine does not report (rigbench cannot tell whether it used this GPU)".to_string(),
    };
    let valid = e.runs.iter().filter(|r| r.validity.valid).count();
    let mut s = format!(
        "**End to end:** {engine}, {where_}; {valid} of {} run{} valid",
        e.runs.len(),
        if e.runs.len() == 1 { "" } else { "s" }
    );
    if let Some(f) = &e.failure {
        s.push_str(&format!("; stopped: {}", first_clause(f)));
    }
    if e.interrupted {
        s.push_str("; interrupted");
    }
    if crate::e2e::render::random_weights_note(e).is_some() {
        s.push_str("; **random weights**: a harness figure, not a trained model's");
    }
    s.push('.');
    Some(s)
}

/// Two or more GPUs (`--devices`): per-GPU spread, P2P copies, NCCL all-reduce at one decode
/// token and at its largest size, and the tensor-parallel prediction at the smallest M.
fn multigpu_line(r: &Results) -> Option<String> {
    use crate::output::table::{human_bytes, human_seconds};
    let mg = r.multi_gpu.as_ref()?;
    if mg.devices.len() < 2 {
        return None;
    }
    let mut parts: Vec<String> = Vec::new();
    if let Some(sp) = &mg.spread {
        let worst = sp
            .devices
            .iter()
            .filter_map(|d| d.geomean_vs_fastest)
            .fold(None, |a: Option<f64>, g| Some(a.map_or(g, |a| a.max(g))));
        if let Some(w) = worst {
            parts.push(format!(
                "every GPU within {:+.1}% of the fastest GPU of each kernel case (geomean), {}",
                (w - 1.0) * 100.0,
                if sp.findings.is_empty() {
                    "no finding".to_string()
                } else {
                    format!(
                        "**{}**",
                        crate::output::table::plural(
                            sp.findings.len() as u64,
                            "finding",
                            "findings"
                        )
                    )
                }
            ));
        }
    }
    if let Some(p) = &mg.p2p {
        let bw: Vec<f64> = p.copies.iter().map(|c| c.bytes_per_s / 1e9).collect();
        if let (Some(lo), Some(hi)) = (
            bw.iter().copied().reduce(f64::min),
            bw.iter().copied().reduce(f64::max),
        ) {
            let each = if (hi - lo) < 0.05 {
                format!("{hi:.1} GB/s")
            } else {
                format!("{lo:.1}–{hi:.1} GB/s")
            };
            let both = p
                .bidirectional
                .iter()
                .map(|b| b.bytes_per_s / 1e9)
                .reduce(f64::min)
                .map(|b| format!(", {b:.1} GB/s both ways"))
                .unwrap_or_default();
            parts.push(format!("P2P copies {each} each way{both}"));
        }
    }
    if let Some(a) = &mg.allreduce {
        if let Some(w) = a
            .worlds
            .iter()
            .filter(|w| !w.points.is_empty())
            .max_by_key(|w| w.devices.len())
        {
            let small = w
                .points
                .iter()
                .filter(|p| p.m.is_some())
                .min_by_key(|p| p.bytes);
            let large = w.points.iter().max_by_key(|p| p.bytes);
            let mut s = format!(
                "NCCL {} all-reduce over {} GPUs",
                a.nccl_version,
                w.devices.len()
            );
            if let Some(p) = small {
                s.push_str(&format!(
                    " {} at {} (decode M = {})",
                    human_seconds(p.timing.median_s),
                    human_bytes(p.bytes),
                    p.m.unwrap_or(1)
                ));
            }
            if let Some(p) = large {
                s.push_str(&format!(
                    ", bus bandwidth {:.1} GB/s at {}",
                    p.busbw / 1e9,
                    human_bytes(p.bytes)
                ));
            }
            parts.push(s);
        }
    }
    if let Some(tp) = &mg.tp {
        let m = tp.rows.iter().map(|r| r.m).min();
        let t = tp.rows.iter().map(|r| r.tp).max();
        if let (Some(m), Some(t)) = (m, t) {
            let v: Vec<String> = tp
                .rows
                .iter()
                .filter(|r| r.m == m && r.tp == t && t > 1)
                .map(|r| {
                    let name = r.label.split(' ').next().unwrap_or(&r.label);
                    format!("{} {:.2}×", name.to_ascii_uppercase(), r.speedup_vs_tp1)
                })
                .collect();
            if !v.is_empty() {
                parts.push(format!(
                    "TP = {t} predicted (not measured) at M = {m}: {} against one GPU",
                    v.join(", ")
                ));
            }
        }
    }
    if parts.is_empty() {
        return None;
    }
    let gpus: Vec<String> = mg.devices.iter().map(|d| format!("GPU{d}")).collect();
    Some(format!(
        "**Multi-GPU** ({}): {}.",
        gpus.join(", "),
        parts.join("; ")
    ))
}

/// The built-in runtime on the GPU, one run per weight format (`results.runtime`).
fn runtime_line(r: &Results) -> Option<String> {
    let rt = r.runtime.as_ref()?;
    let mut parts: Vec<String> = Vec::new();
    for f in &rt.formats {
        let name = match f.format.as_str() {
            "nvfp4" => "W4A16 NVFP4".to_string(),
            other => other.to_ascii_uppercase(),
        };
        match (&f.bench, &f.error) {
            (Some(b), _) => parts.push(format!(
                "{name} {} tok/s at batch 1, {} tok/s at batch {}",
                crate::output::table::grouped(b.batch1.tok_per_s, 0),
                crate::output::table::grouped(b.batched.tok_per_s, 0),
                b.batched.batch
            )),
            (None, Some(e)) => parts.push(format!("{name} failed: {}", first_clause(e))),
            (None, None) => {
                let valid = f
                    .e2e
                    .as_ref()
                    .map(|e| e.runs.iter().filter(|x| x.validity.valid).count())
                    .unwrap_or(0);
                parts.push(format!("{name}: {valid} valid e2e runs"))
            }
        }
    }
    let parity = match &rt.parity {
        Some(p) if p.passed => "; parity with the CPU reference passed".to_string(),
        Some(_) => {
            "; **parity with the CPU reference FAILED** (see the runtime section)".to_string()
        }
        None => String::new(),
    };
    let skipped = if rt.skipped.is_empty() {
        String::new()
    } else {
        format!(
            "; not run: {}",
            rt.skipped
                .iter()
                .map(|s| first_clause(s))
                .collect::<Vec<_>>()
                .join("; ")
        )
    };
    // The conditions of the tok/s figures, from the first format that ran its benchmark.
    let conditions = rt
        .formats
        .iter()
        .find_map(|f| f.bench.as_ref())
        .map(|b| {
            format!(
                "; decode tok/s at batch 1 after a {}-token prompt and at batch {} with {}-token contexts, KV {}",
                thousands(b.spec.batch1_prompt as u64),
                b.spec.batch,
                thousands(b.spec.batch_context as u64),
                b.kv_dtype
            )
        })
        .unwrap_or_default();
    Some(format!(
        "**Built-in runtime on this GPU** (`{}` on {}{conditions}; more in its section): {}{parity}{skipped}.",
        rt.model,
        rt.device,
        if parts.is_empty() {
            "no format ran".to_string()
        } else {
            parts.join("; ")
        }
    ))
}

fn checkpoint_line(r: &Results) -> Option<String> {
    let c = r.checkpoint.as_ref()?;
    use crate::checkpoint::Severity;
    let count = |sev: Severity| c.findings.iter().filter(|f| f.severity == sev).count();
    let (e, w) = (count(Severity::Error), count(Severity::Warning));
    let plural =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let name = std::path::Path::new(&c.checkpoint)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| c.checkpoint.clone());
    let mut s = format!(
        "**Checkpoint `{name}`:** {}, {}",
        plural(e, "error", "errors"),
        plural(w, "warning", "warnings")
    );
    if let Some(f) = c
        .findings
        .iter()
        .find(|f| f.severity == Severity::Error)
        .or_else(|| c.findings.iter().find(|f| f.severity == Severity::Warning))
    {
        s.push_str(&format!(" (first: `{}`: {})", f.rule, first_clause(&f.why)));
    }
    let v = &c.card.verdicts;
    if !v.is_empty() {
        // Modules grouped by how the card runs their format.
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for x in v {
            let word = x
                .support
                .map(|s| s.to_string())
                .unwrap_or_else(|| "not classified".into());
            let item = format!("{} {}", thousands(x.modules), x.format);
            match groups.iter_mut().find(|g| g.0 == word) {
                Some(g) => g.1.push(item),
                None => groups.push((word, vec![item])),
            }
        }
        let text: Vec<String> = groups
            .iter()
            .map(|(w, items)| format!("{w}: {}", items.join(", ")))
            .collect();
        s.push_str(&format!("; modules {}", text.join("; ")));
    }
    let cap = &c.capacity;
    match (cap.fits, cap.kv_tokens) {
        (Some(false), _) => s.push_str("; the weights **do not fit** in the GPU memory assumed"),
        (_, Some(t)) => s.push_str(&format!(
            "; predicted KV capacity {} tokens (a prediction from metadata)",
            thousands(t)
        )),
        _ => {}
    }
    s.push('.');
    Some(s)
}

fn accuracy_line(r: &Results) -> Option<String> {
    let k = r.kernels.as_ref()?;
    let plain: Vec<String> = k
        .reference_accuracy
        .iter()
        .filter(|a| a.data_id == "plain" || a.data_id.is_empty())
        .map(|a| {
            format!(
                "{} {:.1e}{}",
                short_name(a.format),
                a.rel_l2_vs_exact,
                if a.format == GemmFormat::W4a4 {
                    " (emulated)"
                } else {
                    ""
                }
            )
        })
        .collect();
    if plain.is_empty() {
        return None;
    }
    Some(format!(
        "**Accuracy** (CPU reference, relative L2 error against the exact product, normal data): {}.",
        plain.join(", ")
    ))
}

fn skipped_line(r: &Results) -> String {
    let mut items: Vec<String> = Vec::new();
    for s in &r.skipped {
        items.push(format!("{}: {}", s.what, first_clause(&s.reason)));
    }
    if let Some(k) = &r.kernels {
        // Group case skips by (provider, implementation, reason).
        let mut groups: Vec<(String, String, Vec<String>)> = Vec::new();
        for s in &k.skipped {
            let who = if s.provider == "rigbench" {
                s.implementation.clone()
            } else {
                format!("{}:{}", s.provider, s.implementation)
            };
            let reason = crate::kernels::wording::skip_reason(
                &s.implementation,
                &s.reason,
                &r.rig.capabilities,
            );
            let what = match s.m {
                Some(m) => format!("{} M={m}", s.shape),
                None => s.shape.clone(),
            };
            match groups.iter_mut().find(|g| g.0 == who && g.1 == reason) {
                Some(g) => g.2.push(what),
                None => groups.push((who, reason, vec![what])),
            }
        }
        let mut shapes: Vec<&str> = k
            .cases
            .iter()
            .map(|c| c.shape.as_str())
            .chain(k.skipped.iter().map(|s| s.shape.as_str()))
            .collect();
        shapes.sort_unstable();
        shapes.dedup();
        for (who, reason, cases) in groups {
            if who == "*" {
                // Every kernel case (no GPU, or the kernel part never started): the reason is
                // usually the `kernels` skip already listed; a row named `* (*)` says nothing.
                let why = first_clause(&reason);
                if !items.iter().any(|i| i.ends_with(why)) {
                    items.push(format!("every kernel case: {why}"));
                }
                continue;
            }
            let n = cases.len();
            let which = if n == 1 {
                cases[0].clone()
            } else if n == shapes.len() && cases.iter().all(|c| !c.contains(" M=")) {
                format!("all {n} shapes")
            } else {
                format!("{n} cases")
            };
            items.push(format!("{who} ({which}): {}", first_clause(&reason)));
        }
        for p in k.peers.iter().filter(|p| !p.available) {
            items.push(format!("peer {}: {}", p.provider, first_clause(&p.detail)));
        }
    }
    if let Some(e) = &r.e2e {
        for s in &e.skipped {
            items.push(format!("e2e {}", first_clause(s)));
        }
    }
    if items.is_empty() {
        "**Skipped:** nothing.".to_string()
    } else {
        format!("**Skipped:** {}.", items.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::ComputeCapability;
    use crate::kernels::schema::{CopyBandwidth, Derived, NamedTiming, SkippedCase, Timing};
    use crate::report::Skip;
    use crate::rig::{capability, GpuFacts, RigFacts};

    fn t(s: f64) -> Timing {
        Timing {
            samples_s: vec![s],
            median_s: s,
            p10_s: s,
            p90_s: s,
            rel_std: 0.0,
            stop_reason: None,
            cold_l2: true,
            graph: None,
        }
    }

    fn case(imp: &str, shape: &str, m: usize, secs: f64, quant: f64) -> KernelCase {
        KernelCase {
            provider: "rigbench".into(),
            implementation: imp.into(),
            format: imp.parse().unwrap(),
            shape: shape.into(),
            m,
            n: 1024,
            k: 1024,
            path: String::new(),
            check: None,
            timing: t(secs),
            extra: if quant > 0.0 {
                vec![NamedTiming {
                    name: crate::kernels::schema::ACT_QUANT.into(),
                    timing: t(quant),
                }]
            } else {
                vec![]
            },
            derived: Derived {
                tflops: 2.0 * (m * 1024 * 1024) as f64 / secs / 1e12,
                ..Default::default()
            },
            sm_clock_mhz: Some(1980),
            throttle: vec![],
            graph: None,
            graph_skip: None,
            clocks: None,
        }
    }

    fn h200() -> RigFacts {
        let cc = ComputeCapability::new(9, 0);
        RigFacts {
            gpu: Some(GpuFacts {
                name: "NVIDIA H200".into(),
                compute_capability: Some(cc),
                ..Default::default()
            }),
            capabilities: capability::table(cc),
            ..Default::default()
        }
    }

    /// Two shapes; W4A16 wins at small M, FP8 (with its quantization) from M = 16 on `a`; on `b`
    /// FP8 without its quantization would win at M = 1 but loses once it is included.
    fn kernels() -> KernelResults {
        let mut cases = Vec::new();
        for (shape, w4_1) in [("a", 10e-6), ("b", 10e-6)] {
            cases.push(case("bf16", shape, 1, 40e-6, 0.0));
            cases.push(case(
                "fp8",
                shape,
                1,
                if shape == "b" { 9e-6 } else { 20e-6 },
                7e-6,
            ));
            cases.push(case("w4a16", shape, 1, w4_1, 0.0));
            cases.push(case("bf16", shape, 16, 40e-6, 0.0));
            cases.push(case("fp8", shape, 16, 20e-6, 7e-6));
            cases.push(case("w4a16", shape, 16, 30e-6, 0.0));
            cases.push(case("bf16", shape, 1024, 200e-6, 0.0));
            cases.push(case("fp8", shape, 1024, 100e-6, 20e-6));
            cases.push(case("w4a16", shape, 1024, 250e-6, 0.0));
        }
        KernelResults {
            cases,
            copy_bandwidth: Some(CopyBandwidth {
                bytes: 1 << 30,
                median_s: 0.0005,
                bytes_per_s: 4.24e12,
                samples: 20,
            }),
            skipped: ["a", "b"]
                .iter()
                .map(|s| SkippedCase {
                    provider: "rigbench".into(),
                    implementation: "w4a4".into(),
                    shape: s.to_string(),
                    m: None,
                    reason: "unsupported on this card: sm_90 has no FP4 tensor cores (they start at sm_100); native W4A4 NVFP4 cannot run here".into(),
                })
                .collect(),
            reference_accuracy: crate::kernels::accuracy::study(),
            ..Default::default()
        }
    }

    fn results() -> Results {
        let mut r = Results::new(h200(), "nvidia-h200-sm90".into(), "rigbench report".into());
        r.kernels = Some(kernels());
        r.complete = true;
        r
    }

    #[test]
    fn h200_verdict_names_native_fallback_fastest_and_crossovers() {
        let r = results();
        let l = lines(&r);
        assert!((5..=10).contains(&l.len()), "{l:#?}");
        let all = l.join("\n");
        assert!(
            l[0].contains("native BF16, FP8 W8A8 and W4A16 NVFP4"),
            "{}",
            l[0]
        );
        assert!(
            l[0].contains("W4A4 NVFP4 is a **fallback**, since sm_90 has no FP4 tensor cores (they start at sm_100): it runs as the W4A16 Marlin-style path"),
            "{}",
            l[0]
        );
        // Activation quantization included: FP8 (9 + 7 µs) loses to W4A16 (10 µs) at M = 1 on b.
        assert!(
            all.contains("**W4A16** at M = 1, **FP8** at M = 16…1,024"),
            "{all}"
        );
        assert!(
            all.contains("W4A16 is faster than FP8 (activation quantization included) up to M = 1 on 2 shapes"),
            "{all}"
        );
        assert!(
            all.contains("faster than BF16 up to M = 16 on 2 shapes"),
            "{all}"
        );
        assert!(all.contains("copy bandwidth 4.24 TB/s"), "{all}");
        assert!(all.contains("no throttling recorded"), "{all}");
        assert!(all.contains("**Decode-step composite:** not in these results"));
        // One word for W4A4: the stored legacy reason is shown as a fallback.
        assert!(
            all.contains("w4a4 (all 2 shapes): fallback on this card"),
            "{all}"
        );
        assert!(!all.contains("unsupported"), "{all}");
        // Timed kernels: the accuracy study stays in the kernel section.
        assert!(!all.contains("**Accuracy**"), "{all}");
        // No e2e, no checkpoint: no line for them.
        assert!(!all.contains("End to end") && !all.contains("Checkpoint"));
        let md = markdown(&r);
        assert!(md.starts_with("## Verdict\n\n- **Formats on NVIDIA H200 (sm_90):**"));
        assert!(!text(&r).contains("**"));
    }

    #[test]
    fn cpu_only_partial_and_incomplete_results_do_not_break_it() {
        let mut r = Results::new(RigFacts::default(), "cpu-x86-64".into(), "x".into());
        r.rig.gpu_absent_reason = Some("no CUDA driver found".into());
        let l = lines(&r);
        assert!(l[0].contains("INCOMPLETE"), "{l:#?}");
        assert!(l[1].contains("**No GPU on this machine** (no CUDA driver found)"));
        assert_eq!(l.last().unwrap(), "**Skipped:** nothing.");
        r.complete = true;
        r.skipped.push(Skip {
            what: "kernels".into(),
            reason: "no CUDA driver found; GPU kernel benches need a GPU".into(),
        });
        r.kernels = Some(KernelResults {
            reference_accuracy: crate::kernels::accuracy::study(),
            // The whole-suite skip `report` also writes into the kernel section: the verdict
            // must not repeat it as "* (*)".
            skipped: vec![crate::kernels::schema::SkippedCase {
                provider: "rigbench".into(),
                implementation: "*".into(),
                shape: "*".into(),
                m: None,
                reason: "no CUDA driver found; GPU kernel benches need a GPU".into(),
            }],
            ..Default::default()
        });
        let l = lines(&r);
        assert_eq!(l.len(), 3, "{l:#?}");
        assert!(l[1].starts_with("**Accuracy**") && l[1].contains("W4A4 1.3e-1 (emulated)"));
        assert_eq!(l[2], "**Skipped:** kernels: no CUDA driver found.");
        // The kernel part's catch-all skip row (impl and shape `*`) is not listed again as
        // `* (*)`; alone, it reads "every kernel case".
        let wildcard = SkippedCase {
            provider: "rigbench".into(),
            implementation: "*".into(),
            shape: "*".into(),
            m: None,
            reason: "no CUDA driver found; GPU kernel benches need a GPU".into(),
        };
        r.kernels.as_mut().unwrap().skipped.push(wildcard);
        let l = lines(&r);
        assert_eq!(l[2], "**Skipped:** kernels: no CUDA driver found.");
        r.skipped.clear();
        let l = lines(&r);
        assert_eq!(
            l[2],
            "**Skipped:** every kernel case: no CUDA driver found."
        );
    }

    #[test]
    fn e2e_line_says_where_it_ran() {
        let mut r = results();
        let mut e = crate::e2e::E2eResults::default();
        e.engine.kind = "builtin".into();
        r.e2e = Some(e.clone());
        let l = e2e_line(&r).unwrap();
        assert!(
            l.contains("**CPU backend**") && l.contains("**not on NVIDIA H200**"),
            "{l}"
        );
        assert!(
            l.contains("not recorded") && l.contains("0 of 0 runs valid"),
            "{l}"
        );
        e.engine.facts.runtime = crate::e2e::runtime_facts::from_version(
            &serde_json::json!({"backend": "cpu", "device": "cpu"}),
        );
        r.e2e = Some(e.clone());
        let l = e2e_line(&r).unwrap();
        assert!(
            l.contains("**CPU backend**") && !l.contains("not recorded"),
            "{l}"
        );
        e.engine.facts.runtime = crate::e2e::runtime_facts::from_version(
            &serde_json::json!({"backend": "cuda", "device": "cuda:0 (NVIDIA H200, sm_90)"}),
        );
        r.e2e = Some(e.clone());
        assert!(e2e_line(&r)
            .unwrap()
            .contains("on the GPU: cuda:0 (NVIDIA H200, sm_90), CUDA backend"));
        e.engine.kind = "url".into();
        e.engine.facts.runtime = None;
        r.e2e = Some(e);
        assert!(e2e_line(&r)
            .unwrap()
            .contains("a device the engine does not report"));
    }

    #[test]
    fn checkpoint_line_counts_and_capacity() {
        let mut r = results();
        let mut c = crate::checkpoint::InspectReport {
            checkpoint: "tests/fixtures/checkpoints/x".into(),
            ..Default::default()
        };
        c.findings.push(crate::checkpoint::Finding {
            rule: "gdn-ab-quantized".into(),
            severity: crate::checkpoint::Severity::Error,
            why: "in_proj_a/b are quantized; engines expect BF16".into(),
            detail: String::new(),
            modules: vec![],
            module_count: 2,
        });
        c.capacity.kv_tokens = Some(1_234_567);
        r.checkpoint = Some(c);
        let l = checkpoint_line(&r).unwrap();
        assert!(
            l.starts_with("**Checkpoint `x`:** 1 error, 0 warnings (first: `gdn-ab-quantized`"),
            "{l}"
        );
        assert!(l.contains("1,234,567 tokens"), "{l}");
        r.checkpoint.as_mut().unwrap().capacity.fits = Some(false);
        assert!(checkpoint_line(&r).unwrap().contains("**do not fit**"));
    }

    #[test]
    fn with_a_decode_step_the_fastest_line_and_headline_come_from_the_composite() {
        use crate::kernels::schema::{DecodeStep, StepShape};
        let mut r = results();
        let k = r.kernels.as_mut().unwrap();
        k.suite.decode_step = Some(DecodeStep {
            description: "test step".into(),
            complete: true,
            shapes: vec![
                StepShape {
                    shape: "a".into(),
                    n: 1024,
                    k: 1024,
                    count: 2,
                },
                StepShape {
                    shape: "b".into(),
                    n: 1024,
                    k: 1024,
                    count: 1,
                },
            ],
        });
        // M = 1: W4A16 2·10 + 10 = 30 µs; FP8 2·(20 + 7) + (9 + 7) = 70 µs; BF16 120 µs.
        // M = 16: W4A16 90 µs; FP8 81 µs.
        let (p, complete) = composite_points(r.kernels.as_ref().unwrap());
        assert!(complete);
        let t = |f: &str, m: usize| p.iter().find(|x| x.format == f && x.m == m).unwrap().time_s;
        assert!((t("W4A16", 1) - 30e-6).abs() < 1e-12);
        assert!((t("FP8", 1) - 70e-6).abs() < 1e-12);
        let all = lines(&r).join("\n");
        assert!(
            all.contains("over one decode step")
                && all.contains("**W4A16 (rigbench)** at M = 1, **FP8 (cuBLASLt, per-tensor act. quant)** at M = 16…1,024"),
            "{all}"
        );
        assert!(
            all.contains("at M = 1: W4A16 (rigbench) 30.0 µs < FP8 (cuBLASLt, per-tensor act. quant) 70.0 µs < BF16 (cuBLASLt) 120.0 µs (≤ 33,333 tok/s from the linear layers alone)"),
            "{all}"
        );
        assert!(
            all.contains("at M = 16: FP8 (cuBLASLt, per-tensor act. quant) 81.0 µs < W4A16 (rigbench) 90.0 µs"),
            "{all}"
        );
        // No peers: no line comparing rigbench's kernels with them.
        assert!(!all.contains("best peer of their format"), "{all}");
        assert!(all.contains("over the 16 sequences"), "{all}");
    }

    #[test]
    fn throttling_counts_groups_and_gives_the_lowest_clock_the_notes_give() {
        let mut r = results();
        let k = r.kernels.as_mut().unwrap();
        let groups = {
            let mut g: Vec<(String, usize)> =
                k.cases.iter().map(|c| (c.shape.clone(), c.m)).collect();
            g.sort();
            g.dedup();
            g.len()
        };
        let c = &mut k.cases[0];
        c.throttle = vec!["sw_power_cap".into()];
        // The case's median clock is higher than the lowest reading its window saw.
        c.sm_clock_mhz = Some(1305);
        c.clocks = Some(crate::kernels::schema::ClockStats {
            readings: 3,
            min_mhz: Some(1020),
            median_mhz: Some(1305),
            max_mhz: Some(1980),
            throttle_seen: vec!["sw_power_cap".into()],
            source: "nvml".into(),
        });
        let all = lines(&r).join("\n");
        assert!(
            all.contains(&format!(
                "throttling (sw_power_cap) in 1 of {groups} (shape, M) groups of rigbench's cases, lowest SM clock read 1,020 MHz"
            )),
            "{all}"
        );
    }

    /// The kernels of record of 2026-12-01 said "lowest SM clock read 1,110 MHz (see Notes)",
    /// a peer case's reading, where the Notes (rigbench's cases) say 1,155: the verdict's figure
    /// is the Notes' one, the peers' given apart.
    #[test]
    fn a_peer_cases_lower_clock_is_not_given_as_the_notes_figure() {
        let clocks = |min: u32| crate::kernels::schema::ClockStats {
            readings: 3,
            min_mhz: Some(min),
            median_mhz: Some(1500),
            max_mhz: Some(1980),
            throttle_seen: vec!["sw_power_cap".into()],
            source: "nvml".into(),
        };
        for (own_min, peer_min) in [(1155, 1110), (1400, 990)] {
            let mut r = results();
            let k = r.kernels.as_mut().unwrap();
            let mut own = k.cases[0].clone();
            own.throttle = vec!["sw_power_cap".into()];
            own.clocks = Some(clocks(own_min));
            k.cases[0] = own.clone();
            // A peer case of the same group read a lower clock.
            let mut peer = own;
            peer.provider = "torch".into();
            peer.implementation = "torch.matmul".into();
            peer.clocks = Some(clocks(peer_min));
            k.cases.push(peer);
            let all = lines(&r).join("\n");
            let own_text = format!("lowest SM clock read {} MHz", thousands(u64::from(own_min)));
            let peer_text = format!(
                "the peers' cases in 1 of 1 groups, lowest SM clock read {} MHz",
                thousands(u64::from(peer_min))
            );
            assert!(
                all.contains(&format!("groups of rigbench's cases, {own_text}")),
                "{all}"
            );
            assert!(all.contains(&peer_text), "{all}");
            // The Notes' own note for that group gives the same figure.
            let group: Vec<KernelCase> = r
                .kernels
                .as_ref()
                .unwrap()
                .cases
                .iter()
                .filter(|c| c.provider == "rigbench" && c.shape == "a" && c.m == 1)
                .cloned()
                .collect();
            let note = crate::kernels::bench::throttle_note(&group, "a", 1).unwrap();
            assert!(
                note.contains(&format!("lowest SM clock read {own_min} MHz")),
                "{note}"
            );
        }
    }

    /// A reason is not cut inside parentheses or quotes: the command `echo boom; exit 3` stays
    /// whole, and a failure opens the verdict with all of its reason.
    #[test]
    fn reasons_are_not_cut_at_a_semicolon_inside_a_command() {
        assert_eq!(
            first_clause(
                "the engine (echo boom; exit 3) exited during startup\n  last log lines:\n    boom"
            ),
            "the engine (echo boom; exit 3) exited during startup"
        );
        assert_eq!(
            first_clause("the engine `a; b` died; see engine.log"),
            "the engine `a; b` died"
        );
        assert_eq!(
            first_clause("no CUDA driver found; GPU kernel benches need a GPU."),
            "no CUDA driver found"
        );
        assert_eq!(
            first_clause("the engine's log is empty; nothing to read"),
            "the engine's log is empty"
        );
        let mut r = results();
        r.failed.push(Skip {
            what: "e2e".into(),
            reason:
                "the engine (echo boom; exit 3) exited during startup\n  last log lines:\n    boom"
                    .into(),
        });
        let l = lines(&r);
        assert_eq!(
            l[0],
            "**FAILED: e2e**: the engine (echo boom; exit 3) exited during startup; last log lines: boom."
        );
    }

    #[test]
    fn composite_headline_from_points() {
        let p = |f: &str, m: usize, t: f64| StepPoint {
            format: f.into(),
            m,
            time_s: t,
        };
        let l = composite_line(&[
            p("W4A16 NVFP4", 1, 8.2e-3),
            p("FP8 W8A8", 1, 9.1e-3),
            p("BF16", 1, 14.0e-3),
            p("W4A16 NVFP4", 64, 40.0e-3),
            p("FP8 W8A8", 64, 9.5e-3),
        ]);
        assert!(
            l.contains(
                "at M = 1: W4A16 NVFP4 8.20 ms < FP8 W8A8 9.10 ms < BF16 14.00 ms (≤ 122 tok/s"
            ),
            "{l}"
        );
        assert!(
            l.contains("at M = 64: FP8 W8A8 9.50 ms < W4A16 NVFP4 40.00 ms"),
            "{l}"
        );
    }

    #[test]
    fn crossover_kinds() {
        let m = |v: &[(usize, f64)]| v.iter().copied().collect::<BTreeMap<usize, f64>>();
        let a = m(&[(1, 1.0), (2, 1.0), (4, 3.0)]);
        let b = m(&[(1, 2.0), (2, 2.0), (4, 2.0)]);
        assert_eq!(cross(&a, &b), Some(Cross::UpTo(2)));
        assert_eq!(cross(&b, &a), Some(Cross::From(4)));
        let c = m(&[(1, 3.0), (2, 1.0), (4, 3.0)]);
        assert_eq!(cross(&c, &b), Some(Cross::Mixed));
        assert_eq!(cross(&a, &a), Some(Cross::Never));
        assert_eq!(cross(&a, &m(&[(8, 1.0)])), None);
    }
}
