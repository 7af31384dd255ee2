//! `kernels.csv`: one row per timed case.

use crate::kernels::schema::{KernelCase, KernelResults};

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
