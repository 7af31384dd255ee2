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
//! | `kernels/reference_accuracy/<format>/<m×n×k>/rel_l2_vs_exact` | value, equal within 1e-6 relative |
//!
//! Adding a part (e.g. end-to-end latency, lint findings, KV capacity) is one `impl MetricSource`
//! that pushes [`Metric`]s, plus one line in [`metrics_of`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::checkpoint::InspectReport;
use crate::e2e::E2eResults;
use crate::kernels::schema::{KernelCase, Timing};
use crate::kernels::KernelResults;
use crate::report::Results;
use crate::rig::{RigFacts, Support};

/// Which way is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Smaller is better (times, errors).
    LowerIsBetter,
    /// Larger is better (throughput, capacity, ranked labels).
    HigherIsBetter,
    /// Any change is a regression (behaviour that must stay as it was).
    MustMatch,
}

/// Unit of a metric's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Seconds.
    Seconds,
    /// A dimensionless ratio (e.g. relative L2 error).
    Ratio,
    /// Tokens.
    Tokens,
    /// Tokens per second.
    TokensPerSecond,
    /// Bytes.
    Bytes,
    /// A count of things (e.g. lint findings).
    Count,
    /// A label (no unit).
    Label,
}

/// Which part of the results a metric comes from; selects the default noise threshold of timing
/// metrics (kernels: `--threshold-kernels`; everything else: `--threshold-e2e`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Group {
    /// Rig facts and the capability table.
    Rig,
    /// Kernel benches and references.
    Kernels,
    /// Checkpoint inspection.
    Checkpoint,
    /// End-to-end runs.
    E2e,
}

/// How a deterministic value is compared with its baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Tolerance {
    /// The value must stay on the good side of `limit` (≤ for lower-is-better, ≥ for
    /// higher-is-better). Inside the bound any change is "same"; crossing it is a regression;
    /// when both values are outside it, the worse one is worse.
    Bound {
        /// The limit.
        limit: f64,
        /// Its name (e.g. `BF16_OUTPUT_REL_L2`).
        name: String,
    },
    /// Equal when `|current − baseline| ≤ rel · |baseline|`.
    Relative {
        /// Relative tolerance (0 = exact).
        rel: f64,
    },
}

/// A metric's measured content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MetricValue {
    /// Repeated measurements (timings); compared with a bootstrap interval and a noise threshold.
    Samples {
        /// Every sample, in the metric's unit.
        samples: Vec<f64>,
    },
    /// One deterministic value with its own tolerance.
    Value {
        /// The value, in the metric's unit.
        value: f64,
        /// How it is compared.
        tolerance: Tolerance,
    },
    /// A categorical outcome (capability verdict, determinism, lint finding).
    Label {
        /// The label.
        value: String,
        /// Known labels from best to worst; empty when unordered (then any change is a
        /// regression, as for [`Direction::MustMatch`]).
        #[serde(default)]
        scale: Vec<String>,
    },
}

impl MetricValue {
    /// `samples`, `value` or `label`.
    pub fn kind_name(&self) -> &'static str {
        match self {
            MetricValue::Samples { .. } => "samples",
            MetricValue::Value { .. } => "value",
            MetricValue::Label { .. } => "label",
        }
    }
}

/// One comparable figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// Stable id (see the module docs), unique within one results file.
    pub id: String,
    /// Part of the results it comes from.
    pub group: Group,
    /// Unit of its values.
    pub unit: Unit,
    /// Which way is better.
    pub direction: Direction,
    /// What was measured.
    pub value: MetricValue,
    /// Conditions that must be equal for the comparison to mean anything (e.g. `n`, `k`,
    /// `cold_l2`). When they differ, the verdict is "ambiguous" and the difference is shown.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub conditions: BTreeMap<String, String>,
    /// Context shown next to a verdict when it differs between the two runs (e.g. the kernel
    /// path that ran, the SM clock, throttle reasons); never changes the verdict.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub context: BTreeMap<String, String>,
}

/// A part of the results schema that yields metrics.
pub trait MetricSource {
    /// Append this part's metrics to `out` (ids unique within the part).
    fn metrics(&self, out: &mut Vec<Metric>);

    /// When this part recorded why the metric `id` was not measured (a skipped case), that
    /// reason. Used to explain metrics a baseline has and the results lack.
    fn missing_reason(&self, _id: &str) -> Option<String> {
        None
    }
}

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
    if let Some(e) = &results.e2e {
        e.metrics(&mut out);
    }
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for m in &mut out {
        let n = seen.entry(m.id.clone()).or_insert(0);
        *n += 1;
        if *n > 1 {
            m.id = format!("{}#{}", m.id, n);
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

fn support_label(s: Support) -> String {
    s.to_string()
}

impl MetricSource for RigFacts {
    /// One ranked label per capability-table row: `rig/capability/<format>/support`.
    fn metrics(&self, out: &mut Vec<Metric>) {
        let scale: Vec<String> = [Support::Native, Support::Fallback, Support::Unsupported]
            .into_iter()
            .map(support_label)
            .collect();
        for c in &self.capabilities {
            out.push(Metric {
                id: format!("rig/capability/{}/support", c.format.id()),
                group: Group::Rig,
                unit: Unit::Label,
                direction: Direction::HigherIsBetter,
                value: MetricValue::Label {
                    value: support_label(c.support),
                    scale: scale.clone(),
                },
                conditions: BTreeMap::new(),
                context: BTreeMap::from([("path".to_string(), c.path.clone())]),
            });
        }
    }
}

fn case_prefix(c: &KernelCase) -> String {
    format!(
        "kernels/{}/{}/{}/m={}",
        c.provider, c.implementation, c.shape, c.m
    )
}

fn timing_metric(id: String, t: &Timing, case: &KernelCase) -> Metric {
    let conditions = BTreeMap::from([
        ("format".to_string(), case.format.id().to_string()),
        ("n".to_string(), case.n.to_string()),
        ("k".to_string(), case.k.to_string()),
        ("cold_l2".to_string(), t.cold_l2.to_string()),
    ]);
    let mut context = BTreeMap::from([("path".to_string(), case.path.clone())]);
    if let Some(mhz) = case.sm_clock_mhz {
        context.insert("sm_clock_mhz".into(), mhz.to_string());
    }
    context.insert(
        "throttle".into(),
        if case.throttle.is_empty() {
            "none".into()
        } else {
            case.throttle.join(", ")
        },
    );
    if let Some(r) = t.stop_reason {
        context.insert(
            "stop_reason".into(),
            serde_json::to_value(r)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
        );
    }
    Metric {
        id,
        group: Group::Kernels,
        unit: Unit::Seconds,
        direction: Direction::LowerIsBetter,
        value: MetricValue::Samples {
            samples: t.samples_s.clone(),
        },
        conditions,
        context,
    }
}

impl MetricSource for KernelResults {
    /// Per timed case: the GEMM time, each extra timing, and the correctness check; per
    /// determinism record: `bit_exact`; per reference-accuracy case: `rel_l2_vs_exact`.
    fn metrics(&self, out: &mut Vec<Metric>) {
        for c in &self.cases {
            let p = case_prefix(c);
            out.push(timing_metric(format!("{p}/time_s"), &c.timing, c));
            for e in &c.extra {
                out.push(timing_metric(
                    format!("{p}/{}/time_s", e.name),
                    &e.timing,
                    c,
                ));
            }
            if let Some(chk) = &c.check {
                out.push(Metric {
                    id: format!("{p}/check/{}", chk.metric),
                    group: Group::Kernels,
                    unit: Unit::Ratio,
                    direction: Direction::LowerIsBetter,
                    value: MetricValue::Value {
                        value: chk.value,
                        tolerance: Tolerance::Bound {
                            limit: chk.tolerance,
                            name: chk.tolerance_name.clone(),
                        },
                    },
                    conditions: BTreeMap::from([
                        ("n".to_string(), c.n.to_string()),
                        ("k".to_string(), c.k.to_string()),
                    ]),
                    context: BTreeMap::from([("reference".to_string(), chk.reference.clone())]),
                });
            }
        }
        for d in &self.determinism {
            out.push(Metric {
                id: format!(
                    "kernels/{}/{}/{}/m={}/bit_exact",
                    d.provider, d.implementation, d.shape, d.m
                ),
                group: Group::Kernels,
                unit: Unit::Label,
                direction: Direction::HigherIsBetter,
                value: MetricValue::Label {
                    value: d.bit_exact.to_string(),
                    scale: vec!["true".into(), "false".into()],
                },
                conditions: BTreeMap::new(),
                context: BTreeMap::from([
                    ("runs".to_string(), d.runs.to_string()),
                    (
                        "differing_elements".to_string(),
                        d.differing_elements.to_string(),
                    ),
                ]),
            });
        }
        for a in &self.reference_accuracy {
            out.push(Metric {
                id: format!(
                    "kernels/reference_accuracy/{}/{}/rel_l2_vs_exact",
                    a.format.id(),
                    a.shape
                ),
                group: Group::Kernels,
                unit: Unit::Ratio,
                direction: Direction::LowerIsBetter,
                // CPU f64 arithmetic on fixed seeded data: equal up to summation-order effects
                // between hosts (FMA contraction, vector width).
                value: MetricValue::Value {
                    value: a.rel_l2_vs_exact,
                    tolerance: Tolerance::Relative { rel: 1e-6 },
                },
                conditions: BTreeMap::from([("data".to_string(), a.data.clone())]),
                context: BTreeMap::new(),
            });
        }
    }

    /// The reason of a [`crate::kernels::schema::SkippedCase`] whose provider, implementation,
    /// shape (or `*`) and M (or all) match the id's `kernels/<provider>/<impl>/<shape>/m=<M>`.
    fn missing_reason(&self, id: &str) -> Option<String> {
        let segs: Vec<&str> = id.split('/').collect();
        if segs.len() < 5 || segs[0] != "kernels" {
            return None;
        }
        let m = segs[4].strip_prefix("m=")?;
        self.skipped
            .iter()
            .find(|s| {
                s.provider == segs[1]
                    && s.implementation == segs[2]
                    && (s.shape == "*" || s.shape == segs[3])
                    && s.m.is_none_or(|x| x.to_string() == m)
            })
            .map(|s| format!("skipped: {}", s.reason))
    }
}

impl MetricSource for InspectReport {
    /// The checkpoint inspection has no comparable fields yet; the lead adds its metrics (lint
    /// findings as labels, predicted KV capacity as a value) when the inspect schema lands.
    fn metrics(&self, _out: &mut Vec<Metric>) {}
}

impl MetricSource for E2eResults {
    /// The end-to-end results have no comparable fields yet; the lead adds their metrics (TTFT,
    /// ITL and TPOT samples, token agreement, measured KV capacity) when the e2e schema lands.
    fn metrics(&self, _out: &mut Vec<Metric>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::GemmFormat;
    use crate::kernels::schema::{KernelCase, NamedTiming, SkippedCase};
    use crate::report::Skip;

    fn case(m: usize) -> KernelCase {
        KernelCase {
            provider: "rigbench".into(),
            implementation: "fp8".into(),
            format: GemmFormat::Fp8,
            shape: "qkv".into(),
            m,
            n: 64,
            k: 32,
            path: "p".into(),
            check: None,
            timing: Timing {
                samples_s: vec![1.0, 2.0],
                ..Default::default()
            },
            extra: vec![NamedTiming {
                name: "activation_quant".into(),
                timing: Timing::default(),
            }],
            derived: Default::default(),
            sm_clock_mhz: None,
            throttle: vec!["hw_slowdown".into()],
        }
    }

    #[test]
    fn ids_kinds_and_duplicates() {
        let mut r = Results::new(RigFacts::default(), "cpu-x86-64".into(), "t".into());
        r.rig.capabilities =
            crate::rig::capability::table(crate::rig::ComputeCapability::new(12, 0));
        r.kernels = Some(KernelResults {
            cases: vec![case(1), case(1)],
            ..Default::default()
        });
        let ms = metrics_of(&r);
        let ids: Vec<&str> = ms.iter().map(|m| m.id.as_str()).collect();
        assert!(ids.contains(&"rig/capability/w4a4/support"), "{ids:?}");
        assert!(ids.contains(&"kernels/rigbench/fp8/qkv/m=1/time_s"));
        assert!(ids.contains(&"kernels/rigbench/fp8/qkv/m=1/activation_quant/time_s"));
        assert!(
            ids.contains(&"kernels/rigbench/fp8/qkv/m=1/time_s#2"),
            "{ids:?}"
        );
        let t = ms.iter().find(|m| m.id.ends_with("m=1/time_s")).unwrap();
        assert_eq!(t.direction, Direction::LowerIsBetter);
        assert_eq!(t.conditions["n"], "64");
        assert_eq!(t.context["throttle"], "hw_slowdown");
        let mut seen = std::collections::BTreeSet::new();
        assert!(ids.iter().all(|i| seen.insert(*i)), "ids unique");
        // Stubs add nothing.
        let mut out = Vec::new();
        InspectReport::default().metrics(&mut out);
        E2eResults::default().metrics(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn reasons_for_missing_metrics() {
        let mut r = Results::new(RigFacts::default(), "cpu-x86-64".into(), "t".into());
        let id = "kernels/rigbench/w4a4/gate_up/m=8/time_s";
        assert_eq!(
            missing_reason(&r, id).as_deref(),
            Some("the results have no kernels section")
        );
        r.skipped.push(Skip {
            what: "kernels/w4a4".into(),
            reason: "no FP4 tensor cores".into(),
        });
        assert!(missing_reason(&r, id)
            .unwrap()
            .contains("no FP4 tensor cores"));
        r.kernels = Some(KernelResults {
            skipped: vec![SkippedCase {
                provider: "rigbench".into(),
                implementation: "w4a4".into(),
                shape: "*".into(),
                m: None,
                reason: "sm_90 has no FP4 tensor cores".into(),
            }],
            ..Default::default()
        });
        assert!(missing_reason(&r, id).unwrap().contains("sm_90"));
        assert!(missing_reason(&r, "kernels/rigbench/bf16/gate_up/m=8/time_s").is_none());
    }
}
