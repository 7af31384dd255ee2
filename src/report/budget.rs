//! The time budget of `rigbench report`: a pure planner that chooses the kernel suite's M grid,
//! whether the peers run, and the repeats, so that the whole job fits a wall-time budget
//! (`--budget 5m` by default, `--budget none` for the full suite).
//!
//! What it ranks by (docs/report.md, "The time budget"):
//! - **M values** by how much of the decode-to-prefill range each adds: M = 1 (batch-1 decode)
//!   first, then, one at a time, the M farthest in log₂ M from every M already kept (the largest,
//!   prefill, second; then the middle of the widest gap; ties to the smaller M). Each added M
//!   halves the widest gap an interpolation between kept M values has to bridge.
//! - **What a plan keeps, in order:** three M values (decode, prefill, the middle), the peers,
//!   more M values, more repeats (up to [`AUTO_REPEATS_MAX`], the CI recipe of docs/gate.md).
//!   A plan is the best one in that order whose estimate fits the budget; when none fits, the
//!   smallest (one M value, no peers, one repeat) with `over_budget` set.
//!
//! The costs ([`Costs::measured`]) come from committed timings, each with its source in
//! [`Costs::sources`]; the estimate is a sum of those costs, never a measurement.

use serde::{Deserialize, Serialize};

/// The default budget of `rigbench report`, seconds (five minutes, from a cold kernel cache on
/// one H100 or H200).
pub const DEFAULT_BUDGET_S: f64 = 300.0;

/// The share of the budget a plan may fill: the estimates are fitted to one H200 and checked
/// against one H100 run, so a tenth is kept for the spread between cards and machines.
pub const PLAN_SHARE: f64 = 0.9;

/// The most repeats a plan chooses by itself (docs/gate.md: 3 repeats per CI run).
pub const AUTO_REPEATS_MAX: usize = 3;

/// M values a plan keeps before it adds the peers: decode (M = 1), prefill (the largest M) and
/// the middle of that range.
pub const CORE_M: usize = 3;

/// Parse `--budget`: `none` (or `full`, `off`) for no budget; else a number with an optional
/// unit `s`, `m` or `h` (`300`, `300s`, `5m`, `1.5h`). Returns seconds.
///
/// # Errors
/// A message naming the value and the accepted forms (the caller names the flag).
pub fn parse_budget(s: &str) -> Result<Option<f64>, String> {
    let t = s.trim().to_ascii_lowercase();
    if matches!(t.as_str(), "none" | "full" | "off") {
        return Ok(None);
    }
    let (num, scale) = match t.char_indices().next_back() {
        Some((i, 's')) => (&t[..i], 1.0),
        Some((i, 'm')) => (&t[..i], 60.0),
        Some((i, 'h')) => (&t[..i], 3600.0),
        _ => (t.as_str(), 1.0),
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(Some(v * scale)),
        _ => Err(format!(
            "'{s}' is not a time budget: give seconds or minutes (300, 300s, 5m, 1h), or none for the full suite"
        )),
    }
}

/// The costs the planner adds up, seconds, each measured on a GPU and named in [`Self::sources`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Costs {
    /// Process start, rig probe, the CPU accuracy study, the copy-bandwidth measurement.
    pub startup_s: f64,
    /// NVRTC builds of the bench's GEMM modules from a cold kernel cache (0 when warm).
    pub compile_s: f64,
    /// One rigbench case (one implementation at one shape and M): fixed part.
    pub case_fixed_s: f64,
    /// One case: per 10⁹ weight elements (N·K; weight synthesis, quantization, upload).
    pub case_per_gelem_s: f64,
    /// One case: per 10¹² M·N·K (the CPU check's sampled reference and the timed launches).
    pub case_per_tmnk_s: f64,
    /// The peer script's start (Python, PyTorch import, CUDA context), once.
    pub peer_start_s: f64,
    /// Peer implementations per (shape, M), each costing one rigbench case.
    pub peer_impls: f64,
    /// The built-in runtime's section (parity, benchmarks, the end-to-end runs of three
    /// formats) when it runs on the GPU; 0 when it does not.
    pub runtime_s: f64,
    /// Where each figure comes from.
    pub sources: Vec<String>,
}

impl Costs {
    /// The committed timings: `cold_cache` says whether NVRTC will run (an empty kernel cache),
    /// `runtime_on_gpu` whether the built-in runtime's section runs on the GPU.
    pub fn measured(cold_cache: bool, runtime_on_gpu: bool) -> Self {
        Self {
            startup_s: 5.0,
            compile_s: if cold_cache { 75.0 } else { 0.0 },
            case_fixed_s: 0.136,
            case_per_gelem_s: 0.123,
            case_per_tmnk_s: 0.297,
            peer_start_s: 11.0,
            peer_impls: 3.0,
            runtime_s: if runtime_on_gpu { 85.0 } else { 0.0 },
            sources: vec![
                "start-up 5 s: rig probe and CPU accuracy study took 1 s in reports/nvidia-h200-sm90/20261201T021503Z/report.log (02:15:03 to 02:15:04); process start and the copy-bandwidth measurement assumed within the rest".into(),
                if cold_cache {
                    "NVRTC 75 s (the kernel cache is empty): the same smoke report took 81.80 s from an empty and 6.79 s from a filled cache on the H200 (reports/nvidia-h200-sm90/20261202T001700Z-kernel-cache; 49.6 s of NVRTC in the report's process, the rest the wgmma probe's child)".into()
                } else {
                    "NVRTC 0 s: the kernel cache holds an entry for each GEMM module of the bench".into()
                },
                "per case (one implementation, one shape and M) 0.136 s + 0.123 s per 10⁹ weight elements + 0.297 s per 10¹² M·N·K: least squares over the 111 (shape, M) groups of reports/nvidia-h200-sm90/20261201T021503Z/report.log (3 implementations a group, both timing modes, so an upper bound for cold timing); it predicts 107 s for the default suite's 4 timed implementations, 157 s with 50 s of NVRTC, against 160 s measured on an H100 (docs/report.md)".into(),
                "peers: 11 s to start (the first peer group, start included, in the same log) and 3 PyTorch implementations a (shape, M), each at one rigbench case's cost: 91 s predicted for the default suite, 91 s measured on an H100 (docs/report.md)".into(),
                if runtime_on_gpu {
                    "built-in runtime 85 s: report --no-kernels --model synthetic:qwen3-8b took 83.44 s (20261202T001700Z-kernel-cache) and 85 s (20261202T035400Z-gemm-layer) on the H200; other models are not estimated and counted the same".into()
                } else {
                    "built-in runtime 0 s: it does not run on the GPU in this job".into()
                },
            ],
        }
    }

    /// One rigbench case at weights `n`×`k` and `m` tokens, seconds.
    pub fn case_s(&self, m: usize, n: usize, k: usize) -> f64 {
        let nk = n as f64 * k as f64;
        self.case_fixed_s
            + self.case_per_gelem_s * nk / 1e9
            + self.case_per_tmnk_s * m as f64 * nk / 1e12
    }
}

/// What the planner is asked to fit.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The budget, seconds (`None`: the full suite, no planning).
    pub budget_s: Option<f64>,
    /// The suite's weight shapes, (N, K).
    pub shapes: Vec<(usize, usize)>,
    /// The suite's M grid (or `--m`'s).
    pub m: Vec<usize>,
    /// `--m` was given: the grid is kept as it is.
    pub m_fixed: bool,
    /// Implementations per (shape, M) (formats, FP8's row-wise path counted).
    pub impls: usize,
    /// The peers may run (`--peers auto` with the peer script possible); `Some(b)` when
    /// `--peers on|off` decided it.
    pub peers_fixed: Option<bool>,
    /// `--repeats` when given (kept as it is); `None`: the planner chooses.
    pub repeats_fixed: Option<usize>,
}

/// The planner's answer: what runs, its estimate and what the budget left out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The budget, seconds (`None`: `--budget none`).
    pub budget_s: Option<f64>,
    /// M values that run, ascending.
    pub m: Vec<usize>,
    /// Whether the peers run.
    pub peers: bool,
    /// Kernel-suite repeats.
    pub repeats: usize,
    /// The estimated wall time of the whole job, seconds (a sum of [`Costs`], not measured).
    pub estimate_s: f64,
    /// The estimate by part (`start-up`, `NVRTC`, `kernels`, `peers`, `runtime`), seconds.
    pub parts: Vec<(String, f64)>,
    /// What the budget left out, one line each (empty when nothing was).
    pub left_out: Vec<String>,
    /// No plan fitted: this one is the smallest, and it is over the budget.
    pub over_budget: bool,
    /// Where each cost comes from.
    pub sources: Vec<String>,
}

/// `ms` ranked by what each adds (module docs): M = 1 (or the smallest) first, then repeatedly
/// the M farthest in log₂ M from every M already ranked, ties to the smaller M.
pub fn rank_m(ms: &[usize]) -> Vec<usize> {
    let mut left: Vec<usize> = ms.to_vec();
    left.sort_unstable();
    left.dedup();
    let mut out = Vec::with_capacity(left.len());
    if left.is_empty() {
        return out;
    }
    out.push(left.remove(0));
    let lg = |m: usize| (m.max(1) as f64).log2();
    while !left.is_empty() {
        let mut best = 0;
        let mut best_d = f64::NEG_INFINITY;
        for (i, &m) in left.iter().enumerate() {
            let d = out
                .iter()
                .map(|&o| (lg(m) - lg(o)).abs())
                .fold(f64::INFINITY, f64::min);
            if d > best_d {
                best = i;
                best_d = d;
            }
        }
        out.push(left.remove(best));
    }
    out
}

/// The estimate of a job with `ms`, `peers` and `repeats`, by part.
fn estimate(
    req: &Request,
    costs: &Costs,
    ms: &[usize],
    peers: bool,
    repeats: usize,
) -> Vec<(String, f64)> {
    let group = |m: usize| -> f64 { req.shapes.iter().map(|&(n, k)| costs.case_s(m, n, k)).sum() };
    let kernels: f64 =
        ms.iter().map(|&m| group(m)).sum::<f64>() * req.impls as f64 * repeats as f64;
    let peers_s = if peers && !ms.is_empty() {
        costs.peer_start_s + ms.iter().map(|&m| group(m)).sum::<f64>() * costs.peer_impls
    } else {
        0.0
    };
    vec![
        ("start-up".into(), costs.startup_s),
        ("NVRTC".into(), costs.compile_s),
        ("kernels".into(), kernels),
        ("peers".into(), peers_s),
        ("runtime".into(), costs.runtime_s),
    ]
}

fn total(parts: &[(String, f64)]) -> f64 {
    parts.iter().map(|p| p.1).sum()
}

/// Choose the plan (module docs: the order of what is kept). Pure: the same request and costs
/// give the same plan; a plan whose `over_budget` is false has `estimate_s ≤ PLAN_SHARE ×
/// budget`.
pub fn plan(req: &Request, costs: &Costs) -> Plan {
    let ranked = rank_m(&req.m);
    let peers_ok = req.peers_fixed.unwrap_or(true);
    let build = |k: usize, peers: bool, repeats: usize| -> Plan {
        let mut m: Vec<usize> = ranked[..k.min(ranked.len())].to_vec();
        m.sort_unstable();
        let parts = estimate(req, costs, &m, peers, repeats);
        Plan {
            budget_s: req.budget_s,
            estimate_s: total(&parts),
            m,
            peers,
            repeats,
            parts,
            left_out: Vec::new(),
            over_budget: false,
            sources: costs.sources.clone(),
        }
    };
    let all = ranked.len();
    let fixed_repeats = req.repeats_fixed;
    let Some(budget) = req.budget_s else {
        return build(all, peers_ok, fixed_repeats.unwrap_or(1));
    };
    let cap = budget * PLAN_SHARE;
    let ks: Vec<usize> = if req.m_fixed {
        vec![all]
    } else {
        (1..=all).rev().collect()
    };
    // Candidates in the order of preference (module docs), the first that fits wins.
    let mut order: Vec<(usize, bool, usize)> = Vec::new();
    let repeats_choices: Vec<usize> = match fixed_repeats {
        Some(r) => vec![r],
        None => (1..=AUTO_REPEATS_MAX).rev().collect(),
    };
    let peer_choices: Vec<bool> = match req.peers_fixed {
        Some(b) => vec![b],
        None => vec![true, false],
    };
    let core = CORE_M.min(all);
    let push = |k: usize, p: bool, r: usize, order: &mut Vec<(usize, bool, usize)>| {
        if !order.contains(&(k, p, r)) {
            order.push((k, p, r));
        }
    };
    // More repeats only once the whole grid and the peers run.
    for &r in &repeats_choices {
        if r > 1 || fixed_repeats.is_some() {
            push(all, peers_ok, r, &mut order);
        }
    }
    let r_min = *repeats_choices.last().unwrap_or(&1);
    // With at least CORE_M values: peers first, then as many M values as fit.
    for &p in &peer_choices {
        for &k in ks.iter().filter(|&&k| k >= core) {
            push(k, p, r_min, &mut order);
        }
    }
    // Fewer than CORE_M: as many M values as fit, no peers unless asked for.
    for &k in ks.iter().filter(|&&k| k < core) {
        push(k, req.peers_fixed.unwrap_or(false), r_min, &mut order);
    }
    let fits = order
        .iter()
        .map(|&(k, p, r)| build(k, p, r))
        .find(|p| p.estimate_s <= cap);
    let mut chosen = match fits {
        Some(p) => p,
        None => {
            let (k, p, r) = order.last().copied().unwrap_or((all, false, r_min));
            let mut p = build(k, p, r);
            p.over_budget = true;
            p
        }
    };
    chosen.left_out = left_out(req, &chosen, &ranked);
    chosen
}

/// What `plan` left out of the full suite, one line each.
fn left_out(req: &Request, plan: &Plan, ranked: &[usize]) -> Vec<String> {
    let mut out = Vec::new();
    let dropped: Vec<String> = {
        let mut d: Vec<usize> = ranked
            .iter()
            .copied()
            .filter(|m| !plan.m.contains(m))
            .collect();
        d.sort_unstable();
        d.iter().map(|m| m.to_string()).collect()
    };
    if !dropped.is_empty() {
        out.push(format!(
            "kernel suite at M = {} ({} of {} M values; {} cases)",
            dropped.join(", "),
            dropped.len(),
            ranked.len(),
            dropped.len() * req.shapes.len() * req.impls
        ));
    }
    if !plan.peers && req.peers_fixed.is_none() {
        out.push("the peers (PyTorch and the engines' kernels beside rigbench's)".into());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRID: [usize; 14] = [
        1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192,
    ];

    /// The suite qwen3.6-27b's shapes (suites/kernels/qwen3.6-27b.toml).
    fn shapes() -> Vec<(usize, usize)> {
        vec![
            (14336, 5120),
            (5120, 6144),
            (16384, 5120),
            (96, 5120),
            (5120, 6144),
            (34816, 5120),
            (5120, 17408),
            (248320, 5120),
        ]
    }

    fn req(budget: Option<f64>) -> Request {
        Request {
            budget_s: budget,
            shapes: shapes(),
            m: GRID.to_vec(),
            m_fixed: false,
            impls: 5,
            peers_fixed: None,
            repeats_fixed: None,
        }
    }

    #[test]
    fn budget_flag_forms() {
        assert_eq!(parse_budget("5m"), Ok(Some(300.0)));
        assert_eq!(parse_budget("300"), Ok(Some(300.0)));
        assert_eq!(parse_budget("90s"), Ok(Some(90.0)));
        assert_eq!(parse_budget("1.5h"), Ok(Some(5400.0)));
        assert_eq!(parse_budget("none"), Ok(None));
        assert_eq!(parse_budget("FULL"), Ok(None));
        for bad in ["", "0", "-5m", "5 minutes", "m", "nan"] {
            let e = parse_budget(bad).unwrap_err();
            assert!(e.contains("none for the full suite"), "{bad}: {e}");
        }
    }

    #[test]
    fn m_ranked_by_the_widest_log_gap() {
        let r = rank_m(&GRID);
        assert_eq!(&r[..4], &[1, 8192, 64, 8], "{r:?}");
        assert_eq!(r.len(), GRID.len());
        let mut s = r.clone();
        s.sort_unstable();
        assert_eq!(s, GRID.to_vec());
        assert_eq!(rank_m(&[]), Vec::<usize>::new());
        assert_eq!(rank_m(&[256, 1, 1]), vec![1, 256]);
    }

    #[test]
    fn the_estimate_reproduces_the_committed_timings() {
        // The default suite, 4 timed implementations, both timing modes' fit: 107 s (docs).
        let c = Costs::measured(false, false);
        let mut r = req(None);
        r.impls = 4;
        let p = plan(&r, &c);
        let k = p.parts.iter().find(|x| x.0 == "kernels").unwrap().1;
        assert!((100.0..115.0).contains(&k), "{k}");
        let peers = p.parts.iter().find(|x| x.0 == "peers").unwrap().1;
        assert!((85.0..97.0).contains(&peers), "{peers}");
    }

    #[test]
    fn nothing_over_budget_and_the_core_kept_first() {
        let c = Costs::measured(true, true);
        let full = plan(&req(None), &c);
        assert_eq!(full.m, GRID.to_vec());
        assert!(full.peers && full.repeats == 1 && full.left_out.is_empty());
        assert!(full.estimate_s > DEFAULT_BUDGET_S, "{}", full.estimate_s);
        for budget in [200.0, 250.0, 300.0, 400.0, 600.0, 3600.0] {
            let p = plan(&req(Some(budget)), &c);
            assert!(!p.over_budget, "{budget}");
            assert!(
                p.estimate_s <= budget * PLAN_SHARE + 1e-9,
                "{budget}: {p:?}"
            );
            assert!(p.m.contains(&1), "M = 1 always kept: {p:?}");
            // Kept M values are a prefix of the ranking.
            let ranked = rank_m(&GRID);
            let mut pre = ranked[..p.m.len()].to_vec();
            pre.sort_unstable();
            assert_eq!(pre, p.m, "{budget}");
        }
        // Five minutes from a cold cache: the core and the peers, not the whole grid.
        let p = plan(&req(Some(DEFAULT_BUDGET_S)), &c);
        assert!(p.m.len() >= CORE_M && p.m.len() < GRID.len(), "{p:?}");
        // The plan docs/report.md states for the default job on a cold cache.
        assert_eq!(p.m, vec![1, 8, 64, 512, 8192], "{p:?}");
        assert!((250.0..270.0).contains(&p.estimate_s), "{}", p.estimate_s);
        assert!(p.peers, "{p:?}");
        assert!(
            p.left_out[0].starts_with("kernel suite at M = "),
            "{:?}",
            p.left_out
        );
        // A budget the fixed costs alone exceed: the smallest plan, said to be over.
        let p = plan(&req(Some(60.0)), &c);
        assert!(
            p.over_budget && p.m == vec![1] && !p.peers && p.repeats == 1,
            "{p:?}"
        );
        // A big budget runs everything, with the CI recipe's repeats.
        let p = plan(&req(Some(3600.0)), &c);
        assert_eq!(
            (p.m.len(), p.peers, p.repeats),
            (GRID.len(), true, AUTO_REPEATS_MAX)
        );
        assert!(p.left_out.is_empty());
    }

    #[test]
    fn given_flags_are_kept() {
        let c = Costs::measured(true, true);
        let mut r = req(Some(DEFAULT_BUDGET_S));
        r.m_fixed = true;
        r.peers_fixed = Some(false);
        r.repeats_fixed = Some(2);
        let p = plan(&r, &c);
        assert_eq!((p.m.len(), p.peers, p.repeats), (GRID.len(), false, 2));
        assert!(
            p.over_budget,
            "the full grid twice does not fit five minutes: {p:?}"
        );
        assert!(
            p.left_out.is_empty(),
            "nothing the user asked for is called left out"
        );
        // Peers asked for: they stay, and the M grid shrinks around them.
        let mut r = req(Some(DEFAULT_BUDGET_S));
        r.peers_fixed = Some(true);
        let p = plan(&r, &c);
        assert!(p.peers && !p.over_budget, "{p:?}");
    }
}
