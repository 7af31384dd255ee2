//! The decode-step composite in the verdict: its points ([`StepPoint`], [`composite_points`]) in
//! the timing the verdict reads ([`verdict_timing`]), the fastest format by M from it, rigbench's
//! kernels against the best peer of their format, and the composite headline
//! ([`composite_line`]).

use std::collections::BTreeMap;

use super::words::{segments, short_name};
use crate::formats::GemmFormat;
use crate::kernels::schema::KernelResults;
use crate::output::table::thousands;

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
pub(super) fn composite_rows(
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
pub(super) fn best_points(
    rows: &[crate::kernels::composite::CompositeRow],
    named: bool,
) -> Vec<StepPoint> {
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

/// The fastest format by M range from the decode-step composite, when the results have one:
/// `points` are the best implementation of each format at each M, named; formats within
/// [`SAME_WITHIN`] of the fastest are joined with "≈".
pub(super) fn fastest_by_composite(points: &[StepPoint], graph: bool) -> Option<String> {
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
pub(super) fn own_vs_peer_line(
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
