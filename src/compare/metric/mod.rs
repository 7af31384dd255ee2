//! The metric model: a [`Results`] flattened into a list of [`Metric`]s, each with a stable id,
//! a unit, a direction and a kind (timing samples, a value with its own tolerance, or a label).
//!
//! Each part of the results schema implements [`MetricSource`]; [`metrics_of`] walks them in a
//! fixed order. Ids are `/`-separated paths whose first segment names the part:
//!
//! | id | kind |
//! |---|---|
//! | `rig/capability/<format>/support` | label: `native` > `fallback` > `unsupported` |
//! | `kernels/<provider>/<implementation>/<shape>/m=<M>/time_s` | timing samples, seconds |
//! | `kernels/<provider>/<implementation>/<shape>/m=<M>/<extra>/time_s` | timing samples (e.g. `activation_quant`) |
//! | `kernels/<provider>/<implementation>/<shape>/m=<M>/check/<metric>` | value bounded by the check's tolerance |
//! | `kernels/<provider>/<implementation>/<shape>/m=<M>/bit_exact` | label: `true` > `false` |
//! | `kernels/<provider>/<implementation>/<shape>/m=<M>/graph/time_s` | timing samples, seconds (graph timing beside cold, `--timing both`) |
//! | `kernels/<provider>/<implementation>/<shape>/m=<M>/graph/<extra>/time_s` | timing samples, seconds |
//! | `kernels/composite/<provider>/<implementation>/m=<M>/time_s` | decode-step composite, seconds (comonotone quantile sums as samples) |
//! | `kernels/composite/<provider>/<implementation>/m=<M>/graph/time_s` | the same under graph timing |
//! | `kernels/reference_accuracy/<format>/<m×n×k>/<data_id>/rel_l2_vs_exact` | value, equal within 1e-6 relative |
//! | `checkpoint/<name>/lint/<rule>` | label: `absent` > `info` > `warning` > `error` |
//! | `checkpoint/<name>/lint/errors` | value, exact, must not increase |
//! | `checkpoint/<name>/modules/<kind>/<module pattern>` | label, must match |
//! | `checkpoint/<name>/capacity/{kv_tokens,kv_bytes_per_token,weight_bytes}` | value, exact, must match |
//! | `e2e/<suite>/<point>/validity` | label: `valid` > `invalid` |
//! | `e2e/<suite>/<point>/requests/{completed,failed}` | value, exact |
//! | `e2e/<suite>/<point>/output_tokens/{requested,produced}` | value, exact, must match |
//! | `e2e/<suite>/<point>/kv/{capacity_tokens,preemptions}` | value, exact |
//! | `e2e/<suite>/<point>/{ttft_s,tpot_s,itl_mean_s,e2e_latency_s}` | timing samples, seconds (valid runs) |
//!
//! See the `MetricSource` impls for the details of each part. Adding a part is one
//! `impl MetricSource` that pushes [`Metric`]s, plus one line in [`metrics_of`].
//!
//! Metrics whose verdict does not depend on timing ([`Metric::is_deterministic`]: values and
//! labels) are what `rigbench compare --deterministic-only` compares.
//!
//! Files: `types.rs` (the metric types, [`MetricSource`] and the id helpers the parts share),
//! one file per part (`rig.rs`, `kernels.rs`, `inspect.rs` for the checkpoint, `e2e.rs`), and
//! here the walk over them ([`metrics_of`], [`missing_reason`]).

mod e2e;
mod inspect;
mod kernels;
mod rig;
mod types;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use crate::report::Results;

pub use e2e::point_id;
pub use inspect::{checkpoint_name, LINT_SCALE};
pub use types::{Direction, Group, Metric, MetricSource, MetricValue, Tolerance, Unit};

/// Every metric of `results`, in a fixed order (rig, kernels, checkpoint, end-to-end), with
/// duplicate ids made unique by a `#2`, `#3`, ... suffix.
pub fn metrics_of(results: &Results) -> Vec<Metric> {
    let mut out = Vec::new();
    results.rig.metrics(&mut out);
    if let Some(k) = &results.kernels {
        k.metrics(&mut out);
    }
    if let Some(c) = &results.checkpoint {
        c.metrics(&mut out);
    }
    // A harness self-test (the CPU backend on a GPU rig) is no rig figure.
    if let Some(e) = results.e2e.as_ref().filter(|e| e.self_test.is_none()) {
        e.metrics(&mut out);
    }
    super::fidelity::metrics(results, &mut out);
    if let Some(rt) = &results.runtime {
        for f in &rt.formats {
            if let Some(e) = &f.e2e {
                let mut part = Vec::new();
                e.metrics(&mut part);
                for mut m in part {
                    m.id = format!("runtime/{}/{}", f.format, m.id);
                    out.push(m);
                }
            }
        }
    }
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for m in &mut out {
        let n = seen.entry(m.id.clone()).or_insert(0);
        *n += 1;
        if *n > 1 {
            m.id = format!("{}#{}", m.id, n);
        }
    }
    if let Some(spread) = &results.between_run {
        for m in &mut out {
            if let MetricValue::Samples { between_run, .. } = &mut m.value {
                *between_run = spread.metrics.get(&m.id).copied();
            }
        }
    }
    out
}

/// Why `results` lacks the metric `id`, from the parts' skip records and [`Results::skipped`];
/// `None` when nothing was recorded.
pub fn missing_reason(results: &Results, id: &str) -> Option<String> {
    let part = id.split('/').next().unwrap_or_default();
    let from_part = match part {
        "rig" => results.rig.missing_reason(id),
        "kernels" => match &results.kernels {
            Some(k) => k.missing_reason(id),
            None => None,
        },
        "checkpoint" => results
            .checkpoint
            .as_ref()
            .and_then(|c| c.missing_reason(id)),
        "e2e" => results.e2e.as_ref().and_then(|e| e.missing_reason(id)),
        _ => None,
    };
    if from_part.is_some() {
        return from_part;
    }
    // `Skip::what` is e.g. `kernels` or `kernels/w4a4`: its first segment names the part and
    // each further segment must appear somewhere in the id.
    let segs: Vec<&str> = id.split('/').collect();
    for s in &results.skipped {
        let mut w = s.what.split('/');
        if w.next() == Some(part) && w.all(|x| segs.contains(&x)) {
            return Some(format!("skipped ({}): {}", s.what, s.reason));
        }
    }
    let absent = match part {
        "kernels" => results.kernels.is_none(),
        "checkpoint" => results.checkpoint.is_none(),
        "e2e" => results.e2e.is_none(),
        _ => false,
    };
    absent.then(|| format!("the results have no {part} section"))
}
