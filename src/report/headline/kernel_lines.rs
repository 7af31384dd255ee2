//! The verdict's lines read from the rig's capability table and the kernel cases: the formats the
//! card runs natively or by fallback, the fastest format per shape and M, the crossovers, and the
//! measured limits with the throttling seen.

use std::collections::BTreeMap;

use super::words::{join_and, segments, short_name};
use crate::formats::GemmFormat;
use crate::kernels::schema::{KernelCase, KernelResults};
use crate::output::table::thousands;
use crate::report::schema::Results;
use crate::rig::Support;

pub(super) fn formats_line(r: &Results) -> String {
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
pub(super) fn passing_cases(k: &KernelResults) -> Vec<&KernelCase> {
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

pub(super) fn fastest_line(cases: &[&KernelCase], graph: bool) -> Option<String> {
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

pub(super) fn crossover_line(cases: &[&KernelCase], graph: bool) -> Option<String> {
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

pub(super) fn limits_line(r: &Results, k: &KernelResults) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
