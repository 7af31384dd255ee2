//! Cold versus graph timing (docs/architecture.md, "Terms"): for every implementation timed both
//! ways (`--timing both`), whether the two agree within [`AGREE_WITHIN`] per GEMM, and by how much
//! they differ where they do not. GEMM time only (FP8's activation quantization is timed in both
//! modes too, and compared in the detail table).

use std::collections::BTreeMap;

use super::schema::{KernelCase, KernelResults};
use crate::output::table::{human_seconds, markdown_table};

/// The agreement bound: |graph / cold − 1| ≤ 5 % (GPU.md: cuBLAS BF16 and FP8 at M = 1–64 agree
/// within about 5 % on the H200).
pub const AGREE_WITHIN: f64 = 0.05;

/// One implementation's agreement between the two modes.
#[derive(Debug, Clone, PartialEq)]
pub struct Agreement {
    /// Column key (`bf16`, `torch:torch.matmul`).
    pub column: String,
    /// Cases with both timings.
    pub compared: usize,
    /// Of those, how many agree within [`AGREE_WITHIN`].
    pub within: usize,
    /// Median over cases of graph median / cold median.
    pub median_ratio: Option<f64>,
    /// The case furthest from 1: (shape, M, graph / cold).
    pub worst: Option<(String, usize, f64)>,
    /// Why graph timing did not run, for cases without it (distinct reasons).
    pub not_run: Vec<String>,
}

fn column(c: &KernelCase) -> String {
    if c.provider == "rigbench" {
        c.implementation.clone()
    } else {
        format!("{}:{}", c.provider, c.implementation)
    }
}

/// graph median / cold median of a case with both timings.
pub fn ratio(c: &KernelCase) -> Option<f64> {
    let cold = c.cold_timing()?.median_s;
    let (g, _) = c.graph_timings()?;
    (cold > 0.0).then(|| g.median_s / cold)
}

/// The agreement of every implementation that has at least one cold timing and was asked for a
/// graph timing (a graph timing or a `graph_skip` reason), in first-seen order.
pub fn agreements(k: &KernelResults) -> Vec<Agreement> {
    let mut order: Vec<String> = Vec::new();
    let mut by: BTreeMap<String, Vec<&KernelCase>> = BTreeMap::new();
    for c in &k.cases {
        if c.cold_timing().is_none() || (c.graph.is_none() && c.graph_skip.is_none()) {
            continue;
        }
        let col = column(c);
        if !order.contains(&col) {
            order.push(col.clone());
        }
        by.entry(col).or_default().push(c);
    }
    order
        .into_iter()
        .map(|col| {
            let cases = by.remove(&col).unwrap_or_default();
            let ratios: Vec<(String, usize, f64)> = cases
                .iter()
                .filter_map(|c| Some((c.shape.clone(), c.m, ratio(c)?)))
                .collect();
            let mut not_run: Vec<String> =
                cases.iter().filter_map(|c| c.graph_skip.clone()).collect();
            not_run.sort();
            not_run.dedup();
            let within = ratios
                .iter()
                .filter(|r| (r.2 - 1.0).abs() <= AGREE_WITHIN)
                .count();
            let worst = ratios
                .iter()
                .max_by(|a, b| (a.2 - 1.0).abs().total_cmp(&(b.2 - 1.0).abs()))
                .cloned();
            let rs: Vec<f64> = ratios.iter().map(|r| r.2).collect();
            let median_ratio = crate::stats::percentile(&rs, 50.0);
            Agreement {
                column: col,
                compared: ratios.len(),
                within,
                median_ratio,
                worst,
                not_run,
            }
        })
        .collect()
}

/// The verdict text of one agreement.
pub fn verdict(a: &Agreement) -> String {
    if a.compared == 0 {
        return "graph timing did not run".into();
    }
    if a.within == a.compared {
        return format!("agree within {:.0}%", AGREE_WITHIN * 100.0);
    }
    match &a.worst {
        Some((shape, m, r)) => format!(
            "differ in {} of {} cases: up to {:+.0}% (graph {} at {shape} M = {m})",
            a.compared - a.within,
            a.compared,
            (r - 1.0) * 100.0,
            if *r < 1.0 { "faster" } else { "slower" }
        ),
        None => "differ".into(),
    }
}

/// The report section: the per-implementation summary and, folded, every case's two timings.
/// Empty when no case was asked for a graph timing.
pub fn markdown(k: &KernelResults) -> String {
    let ag = agreements(k);
    if ag.is_empty() {
        return String::new();
    }
    let mut o = String::from("### Timing modes: cold-L2 events against a CUDA graph\n\n");
    o.push_str("Each GEMM timed twice: *cold* (one launch between CUDA events, L2 flushed before every sample) and *graph* (back-to-back launches rotating over weight copies that together exceed 4× L2, captured in one CUDA graph; per-GEMM time = graph time / launches). Agreement means |graph / cold − 1| ≤ 5% (GEMM time; FP8 activation quantization compared in the detail table).\n\n");
    if let Some(g) = k.timing_policy.as_ref().and_then(|p| p.graph.as_ref()) {
        o.push_str(&format!("Graph set-up: {}.\n\n", g.description));
    }
    let rows: Vec<Vec<String>> = ag
        .iter()
        .map(|a| {
            vec![
                a.column.clone(),
                a.compared.to_string(),
                format!("{}/{}", a.within, a.compared),
                a.median_ratio
                    .map(|r| format!("{r:.3}"))
                    .unwrap_or_else(|| "—".into()),
                a.worst
                    .as_ref()
                    .map(|(s, m, r)| format!("{r:.3} ({s} M = {m})"))
                    .unwrap_or_else(|| "—".into()),
                if a.not_run.is_empty() {
                    verdict(a)
                } else {
                    format!(
                        "{}; not run for some cases: {}",
                        verdict(a),
                        a.not_run.join("; ")
                    )
                },
            ]
        })
        .collect();
    o.push_str(&markdown_table(
        &[
            "implementation",
            "cases timed both ways",
            "within 5%",
            "median graph/cold",
            "furthest from 1",
            "verdict",
        ],
        &rows,
    ));
    o.push('\n');
    let detail: Vec<Vec<String>> = k
        .cases
        .iter()
        .filter_map(|c| {
            let r = ratio(c)?;
            let (g, gextra) = c.graph_timings()?;
            let q = |e: &[super::schema::NamedTiming]| {
                KernelCase::act_quant(e).map(|t| human_seconds(t.median_s))
            };
            Some(vec![
                c.shape.clone(),
                c.m.to_string(),
                column(c),
                human_seconds(c.timing.median_s),
                human_seconds(g.median_s),
                format!("{r:.3}"),
                match (q(&c.extra), q(gextra)) {
                    (Some(a), Some(b)) => format!("{a} / {b}"),
                    _ => "—".into(),
                },
                g.graph
                    .as_ref()
                    .map(|s| format!("{} over {}", s.launches, s.weight_copies))
                    .unwrap_or_default(),
            ])
        })
        .collect();
    if !detail.is_empty() {
        o.push_str("<details><summary>Every case timed both ways</summary>\n\n");
        o.push_str(&markdown_table(
            &[
                "shape",
                "M",
                "implementation",
                "cold",
                "graph",
                "graph/cold",
                "act. quant cold / graph",
                "launches over copies",
            ],
            &detail,
        ));
        o.push_str("\n</details>\n\n");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::schema::*;

    fn case(imp: &str, shape: &str, m: usize, cold: f64, graph: Option<f64>) -> KernelCase {
        let t = |v: f64| Timing {
            samples_s: vec![v],
            median_s: v,
            p10_s: v,
            p90_s: v,
            rel_std: 0.0,
            stop_reason: None,
            cold_l2: true,
            graph: None,
        };
        KernelCase {
            provider: "rigbench".into(),
            implementation: imp.into(),
            format: crate::formats::GemmFormat::Bf16,
            shape: shape.into(),
            m,
            n: 1,
            k: 1,
            path: String::new(),
            check: None,
            timing: t(cold),
            extra: vec![],
            derived: Derived::default(),
            sm_clock_mhz: None,
            throttle: vec![],
            graph: graph.map(|g| GraphTimings {
                timing: Timing {
                    cold_l2: false,
                    graph: Some(GraphSetup {
                        launches: 8,
                        weight_copies: 4,
                        weight_bytes_total: 1,
                    }),
                    ..t(g)
                },
                extra: vec![],
            }),
            graph_skip: graph
                .is_none()
                .then(|| "w4a16 cannot run against rotating weight copies yet".into()),
            clocks: None,
        }
    }

    #[test]
    fn agreement_per_implementation() {
        let k = KernelResults {
            cases: vec![
                // PyTorch's figures on the H200, quoted when the timing modes were set:
                // o_proj M = 1, 18.7 µs graph against 19.9 µs cold (6% apart: outside 5%);
                // gate_up 91.7 against 90.1 (within).
                case("bf16", "o_proj", 1, 19.9e-6, Some(18.7e-6)),
                case("bf16", "gate_up", 1, 90.1e-6, Some(91.7e-6)),
                case("fp8", "o_proj", 1, 10e-6, Some(9.8e-6)),
                case("fp8", "gate_up", 1, 10e-6, Some(10.2e-6)),
                case("w4a16", "o_proj", 1, 10e-6, None),
            ],
            ..Default::default()
        };
        let a = agreements(&k);
        assert_eq!(a.len(), 3);
        assert_eq!((a[0].compared, a[0].within), (2, 1));
        let v = verdict(&a[0]);
        assert!(
            v.contains("1 of 2")
                && v.contains("-6%")
                && v.contains("faster")
                && v.contains("o_proj M = 1"),
            "{v}"
        );
        assert_eq!((a[1].compared, a[1].within), (2, 2));
        assert_eq!(verdict(&a[1]), "agree within 5%");
        assert_eq!(a[2].compared, 0);
        assert!(a[2].not_run[0].contains("rotating"));
        let md = markdown(&k);
        assert!(md.contains("agree within 5%") && md.contains("graph timing did not run"));
        assert!(md.contains("0.940 (o_proj M = 1)"), "{md}");
        // Nothing asked for graph timing: no section.
        let k2 = KernelResults {
            cases: vec![KernelCase {
                graph_skip: None,
                ..case("bf16", "q", 1, 1e-6, None)
            }],
            ..Default::default()
        };
        assert!(markdown(&k2).is_empty());
    }
}
