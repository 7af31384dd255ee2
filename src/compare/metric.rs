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

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::checkpoint::InspectReport;
use crate::e2e::executor::LoadPoint;
use crate::e2e::workload::ArrivalKind;
use crate::e2e::{E2eResults, RunResult};
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
    /// Repeated measurements (timings); compared with an interval (see [`super::gate`]) and a
    /// noise threshold.
    Samples {
        /// Every sample, in the metric's unit (all repeats, in repeat order).
        samples: Vec<f64>,
        /// Samples per repeat (`report --repeats R`), summing to `samples.len()`; empty for one
        /// run.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        repeats: Vec<usize>,
        /// The between-run spread stored with a baseline for this metric, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        between_run: Option<crate::report::schema::RunSpread>,
        /// Per repeat, the slot of the metric's implementation: its rank in that repeat's
        /// implementation order (`kernels.repeats.order`) among the formats the run timed;
        /// empty when unknown or not repeated.
        /// The comparison fits it as a block factor ([`super::gate::Paired::slot_fit`]).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        slots: Vec<usize>,
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

impl Metric {
    /// Whether the verdict on this metric does not depend on timing: a value or a label (not
    /// timing samples). `rigbench compare --deterministic-only` compares only these.
    pub fn is_deterministic(&self) -> bool {
        !matches!(self.value, MetricValue::Samples { .. })
    }
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

fn timing_metric(
    id: String,
    t: &Timing,
    case: &KernelCase,
    repeats: Vec<usize>,
    slots: Vec<usize>,
) -> Metric {
    let mut conditions = BTreeMap::from([
        ("format".to_string(), case.format.id().to_string()),
        ("n".to_string(), case.n.to_string()),
        ("k".to_string(), case.k.to_string()),
        ("cold_l2".to_string(), t.cold_l2.to_string()),
    ]);
    // Only graph timings carry the key, so cold figures compare with baselines written before
    // graph timing existed, and a graph figure never compares silently with a cold one.
    if let Some(g) = &t.graph {
        conditions.insert("timing".into(), "graph".into());
        conditions.insert("graph_launches".into(), g.launches.to_string());
        conditions.insert("graph_weight_copies".into(), g.weight_copies.to_string());
    }
    let mut context = BTreeMap::from([("path".to_string(), case.path.clone())]);
    if let Some(mhz) = case.sm_clock_mhz {
        context.insert("sm_clock_mhz".into(), mhz.to_string());
    }
    if let Some(c) = &case.clocks {
        if let (Some(lo), Some(hi)) = (c.min_mhz, c.max_mhz) {
            context.insert("sm_clock_range_mhz".into(), format!("{lo}–{hi}"));
        }
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
            repeats,
            between_run: None,
            slots,
        },
        conditions,
        context,
    }
}

impl MetricSource for KernelResults {
    /// Per timed case: the GEMM time, each extra timing, and the correctness check; per
    /// determinism record: `bit_exact`; per reference-accuracy case: `rel_l2_vs_exact`.
    fn metrics(&self, out: &mut Vec<Metric>) {
        // Per repeat: its sample count, and the slot of the case's format in that repeat's
        // (rotated) order: its rank among the formats this run timed (a format skipped on this
        // card, e.g. native W4A4 on sm_90, takes no slot wherever the order lists it). Slots
        // only for rigbench's own cases timed in every repeat (peers run in a fixed order after
        // each repeat).
        let timed: Vec<&str> = {
            let mut t: Vec<&str> = Vec::new();
            for c in self.cases.iter().filter(|c| c.provider == "rigbench") {
                if !t.contains(&c.format.id()) {
                    t.push(c.format.id());
                }
            }
            t
        };
        let sizes = |c: &KernelCase, part: Option<&str>| -> (Vec<usize>, Vec<usize>) {
            let Some(r) = self.repeats.as_ref() else {
                return Default::default();
            };
            let sizes = r.sizes_of(c, part).unwrap_or_default();
            let slots =
                if c.provider == "rigbench" && sizes.len() >= 2 && sizes.len() == r.order.len() {
                    r.order
                        .iter()
                        .map(|o| {
                            o.iter()
                                .filter(|f| timed.contains(&f.as_str()))
                                .position(|f| f == c.format.id())
                        })
                        .collect::<Option<Vec<usize>>>()
                        .unwrap_or_default()
                } else {
                    Vec::new()
                };
            (sizes, slots)
        };
        for c in &self.cases {
            let p = case_prefix(c);
            let (sz, sl) = sizes(c, None);
            out.push(timing_metric(format!("{p}/time_s"), &c.timing, c, sz, sl));
            for e in &c.extra {
                let (sz, sl) = sizes(c, Some(&e.name));
                out.push(timing_metric(
                    format!("{p}/{}/time_s", e.name),
                    &e.timing,
                    c,
                    sz,
                    sl,
                ));
            }
            if let Some(g) = &c.graph {
                let (sz, sl) = sizes(c, Some("graph"));
                out.push(timing_metric(
                    format!("{p}/graph/time_s"),
                    &g.timing,
                    c,
                    sz,
                    sl,
                ));
                for e in &g.extra {
                    let (sz, sl) = sizes(c, Some(&format!("graph/{}", e.name)));
                    out.push(timing_metric(
                        format!("{p}/graph/{}/time_s", e.name),
                        &e.timing,
                        c,
                        sz,
                        sl,
                    ));
                }
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
        if let Some(comp) = &self.composite {
            composite_metrics(comp, self, out);
        }
        for a in &self.reference_accuracy {
            out.push(Metric {
                // `<data_id>` tells the data sets apart; results written before it existed
                // have none (their second data set then gets the `#2` suffix).
                id: if a.data_id.is_empty() {
                    format!(
                        "kernels/reference_accuracy/{}/{}/rel_l2_vs_exact",
                        a.format.id(),
                        a.shape
                    )
                } else {
                    format!(
                        "kernels/reference_accuracy/{}/{}/{}/rel_l2_vs_exact",
                        a.format.id(),
                        a.shape,
                        segment(&a.data_id)
                    )
                },
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
        if segs[1] == "composite" {
            let col = if segs[2] == "rigbench" {
                segs[3].to_string()
            } else {
                format!("{}:{}", segs[2], segs[3])
            };
            let m = segs[4].strip_prefix("m=")?;
            let mode = if segs.get(5) == Some(&"graph") {
                "graph"
            } else {
                "cold"
            };
            let prefix = format!("{col} ({mode} timing) M = {m}:");
            return match &self.composite {
                None => Some("the results have no decode-step composite (the suite has no [decode_step], or no implementation covered every shape)".into()),
                Some(c) => c
                    .gaps
                    .iter()
                    .find(|g| g.starts_with(&prefix))
                    .map(|g| format!("left out of the composite: {g}")),
            };
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

/// Decode-step composite metrics: one per row, `kernels/composite/<provider>/<impl>/m=<M>/time_s`
/// (`.../graph/time_s` under graph timing). Their samples are the comonotone quantile sums
/// (see [`crate::kernels::composite`]): the median is the composite, the spread an upper bound,
/// so a verdict on them errs towards "same". Conditions: the step (shapes and counts) and whether
/// L2 was flushed; context: the fraction of the byte floor and the tok/s bound.
fn composite_metrics(
    comp: &crate::kernels::composite::Composite,
    k: &KernelResults,
    out: &mut Vec<Metric>,
) {
    use crate::kernels::composite::StepTiming;
    let step = comp
        .step
        .shapes
        .iter()
        .map(|s| format!("{}×{}", s.shape, s.count))
        .collect::<Vec<_>>()
        .join(",");
    let cold_l2 = k
        .timing_policy
        .as_ref()
        .map(|p| p.l2_flush_bytes > 0)
        .unwrap_or(true);
    for r in &comp.rows {
        let id = format!(
            "kernels/composite/{}/{}/m={}/{}time_s",
            r.provider,
            r.implementation,
            r.m,
            if r.timing == StepTiming::Graph {
                "graph/"
            } else {
                ""
            }
        );
        let mut conditions = BTreeMap::from([
            ("format".to_string(), r.format.id().to_string()),
            ("step".to_string(), step.clone()),
            (
                "act_quant_included".to_string(),
                r.act_quant_included.to_string(),
            ),
        ]);
        if r.timing == StepTiming::Cold {
            conditions.insert("cold_l2".into(), cold_l2.to_string());
        }
        let mut context = BTreeMap::new();
        if let Some(p) = r.pct_of_floor {
            context.insert("pct_of_byte_floor".to_string(), format!("{p:.1}"));
        }
        context.insert(
            "tok_per_s_bound".to_string(),
            format!("{:.0}", r.tok_per_s_bound),
        );
        out.push(Metric {
            id,
            group: Group::Kernels,
            unit: Unit::Seconds,
            direction: Direction::LowerIsBetter,
            value: MetricValue::Samples {
                samples: r.samples_s.clone(),
                repeats: Vec::new(),
                between_run: None,
                slots: Vec::new(),
            },
            conditions,
            context,
        });
    }
}

/// The serde name of a unit-like enum value (`cold`, `fp8`, ...), for ids and conditions.
fn serde_name<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

/// Make `s` usable as one `/`-separated id segment (slashes and whitespace become `_`).
fn segment(s: &str) -> String {
    let t: String = s
        .trim()
        .chars()
        .map(|c| {
            if c == '/' || c.is_whitespace() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if t.is_empty() {
        "unknown".into()
    } else {
        t
    }
}

/// An exact deterministic value (`Tolerance::Relative { rel: 0 }`).
fn exact_value(id: String, group: Group, unit: Unit, direction: Direction, value: f64) -> Metric {
    Metric {
        id,
        group,
        unit,
        direction,
        value: MetricValue::Value {
            value,
            tolerance: Tolerance::Relative { rel: 0.0 },
        },
        conditions: BTreeMap::new(),
        context: BTreeMap::new(),
    }
}

/// Lint severities from best to worst, the scale of `checkpoint/<name>/lint/<rule>` labels.
pub const LINT_SCALE: [&str; 4] = ["absent", "info", "warning", "error"];

/// The name a checkpoint's metrics are filed under: the folder name of
/// [`InspectReport::checkpoint`], else the model type, else `checkpoint`.
pub fn checkpoint_name(r: &InspectReport) -> String {
    std::path::Path::new(&r.checkpoint)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty() && n != "." && n != "..")
        .or_else(|| r.model.model_type.clone())
        .map(|n| segment(&n))
        .unwrap_or_else(|| "checkpoint".into())
}

impl MetricSource for InspectReport {
    /// Under `checkpoint/<name>` ([`checkpoint_name`]), all deterministic (from metadata alone):
    ///
    /// | id | kind |
    /// |---|---|
    /// | `lint/<rule>` | label per rule of [`crate::checkpoint::LINT_RULES`] (and any other rule found): its most severe finding, ranked `absent` > `info` > `warning` > `error` |
    /// | `lint/errors` | value, error findings; must not increase |
    /// | `modules/<kind>/<module pattern>` | label: `<format> ×<count> [layers <layers>]` of each table row of that pattern, joined by `; `; must match |
    /// | `capacity/kv_tokens` | value, predicted KV tokens, exact, when computed (conditions: GPU memory, utilization, reserve, max_model_len) |
    /// | `capacity/kv_bytes_per_token` | value, exact, when computed |
    /// | `capacity/weight_bytes` | value, exact, when known |
    fn metrics(&self, out: &mut Vec<Metric>) {
        let p = format!("checkpoint/{}", checkpoint_name(self));
        let scale: Vec<String> = LINT_SCALE.iter().map(|s| s.to_string()).collect();
        let mut rules: Vec<String> = crate::checkpoint::LINT_RULES
            .iter()
            .map(|r| r.to_string())
            .collect();
        for f in &self.findings {
            if !rules.contains(&f.rule) {
                rules.push(f.rule.clone());
            }
        }
        for rule in rules {
            let hits: Vec<&crate::checkpoint::Finding> =
                self.findings.iter().filter(|f| f.rule == rule).collect();
            // `Severity` orders Error < Warning < Info: the minimum is the most severe.
            let worst = hits.iter().map(|f| f.severity).min();
            let mut context = BTreeMap::new();
            if !hits.is_empty() {
                context.insert(
                    "modules".to_string(),
                    hits.iter().map(|f| f.module_count).sum::<u64>().to_string(),
                );
            }
            out.push(Metric {
                id: format!("{p}/lint/{}", segment(&rule)),
                group: Group::Checkpoint,
                unit: Unit::Label,
                direction: Direction::HigherIsBetter,
                value: MetricValue::Label {
                    value: worst.map_or_else(|| "absent".to_string(), |s| s.to_string()),
                    scale: scale.clone(),
                },
                conditions: BTreeMap::new(),
                context,
            });
        }
        let errors = self
            .findings
            .iter()
            .filter(|f| f.severity == crate::checkpoint::Severity::Error)
            .count();
        out.push(exact_value(
            format!("{p}/lint/errors"),
            Group::Checkpoint,
            Unit::Count,
            Direction::LowerIsBetter,
            errors as f64,
        ));

        // The module table: one label per (kind, pattern), rows in table order.
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for row in &self.modules {
            let key = format!("{}/{}", serde_name(&row.kind), segment(&row.module));
            let cell = format!("{} ×{} [layers {}]", row.format, row.count, row.layers);
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(cell),
                None => groups.push((key, vec![cell])),
            }
        }
        for (key, cells) in groups {
            out.push(Metric {
                id: format!("{p}/modules/{key}"),
                group: Group::Checkpoint,
                unit: Unit::Label,
                direction: Direction::MustMatch,
                value: MetricValue::Label {
                    value: cells.join("; "),
                    scale: Vec::new(),
                },
                conditions: BTreeMap::new(),
                context: BTreeMap::new(),
            });
        }

        // Capacity prediction: a function of metadata and the stated memory, so exact. A
        // change means the predictor (or the checkpoint) changed: must match.
        let cap = &self.capacity;
        if let Some(t) = cap.kv_tokens {
            let mut m = exact_value(
                format!("{p}/capacity/kv_tokens"),
                Group::Checkpoint,
                Unit::Tokens,
                Direction::MustMatch,
                t as f64,
            );
            m.conditions = BTreeMap::from([
                (
                    "gpu_memory_bytes".to_string(),
                    cap.gpu_memory_bytes
                        .map_or_else(|| "unknown".into(), |b| b.to_string()),
                ),
                (
                    "gpu_memory_utilization".to_string(),
                    cap.gpu_memory_utilization.to_string(),
                ),
                ("reserve_bytes".to_string(), cap.reserve_bytes.to_string()),
                (
                    "max_model_len".to_string(),
                    cap.max_model_len
                        .map_or_else(|| "unknown".into(), |b| b.to_string()),
                ),
            ]);
            if let Some(d) = &cap.kv_dtype {
                m.context.insert("kv_dtype".into(), d.clone());
            }
            out.push(m);
        }
        if let Some(b) = cap.kv_bytes_per_token {
            out.push(exact_value(
                format!("{p}/capacity/kv_bytes_per_token"),
                Group::Checkpoint,
                Unit::Bytes,
                Direction::MustMatch,
                b as f64,
            ));
        }
        if let Some(b) = cap.weight_bytes {
            out.push(exact_value(
                format!("{p}/capacity/weight_bytes"),
                Group::Checkpoint,
                Unit::Bytes,
                Direction::MustMatch,
                b as f64,
            ));
        }
    }
}

/// The id segment of a sweep point: `c=<concurrency>` (closed loop) or `rate=<req/s>`, with
/// `-gamma<shape>` for gamma arrivals and `-max_c=<cap>` for a concurrency cap (open loop).
pub fn point_id(p: &LoadPoint) -> String {
    match p {
        LoadPoint::Closed { concurrency } => format!("c={concurrency}"),
        LoadPoint::Open {
            rate,
            arrival,
            burstiness,
            max_concurrency,
            ..
        } => {
            let mut s = format!("rate={rate:.2}");
            if *arrival == ArrivalKind::Gamma {
                s.push_str(&format!("-gamma{burstiness}"));
            }
            if let Some(c) = max_concurrency {
                s.push_str(&format!("-max_c={c}"));
            }
            s
        }
    }
}

/// `e2e/<suite>`, the prefix of every end-to-end metric of `r`.
fn e2e_prefix(r: &E2eResults) -> String {
    format!(
        "e2e/{}",
        segment(r.suite.as_ref().map_or("unknown", |s| s.name.as_str()))
    )
}

/// The conditions under which an end-to-end run's timings are comparable.
fn e2e_conditions(run: &RunResult) -> BTreeMap<String, String> {
    let c = &run.conditions;
    let spec = match (&c.spec.method, &c.spec.k) {
        (Some(m), Some(k)) => format!("{} {} k={}", serde_name(&c.spec.state), m.value, k.value),
        (Some(m), None) => format!("{} {}", serde_name(&c.spec.state), m.value),
        _ => serde_name(&c.spec.state),
    };
    BTreeMap::from([
        (
            "model".to_string(),
            c.model
                .as_ref()
                .map_or_else(|| "unknown".into(), |m| m.value.clone()),
        ),
        (
            "input_tokens".to_string(),
            c.lengths
                .input_requested
                .map_or_else(|| "unknown".into(), |n| n.to_string()),
        ),
        (
            "output_tokens".to_string(),
            c.lengths.output_requested.to_string(),
        ),
        ("cache".to_string(), serde_name(&c.cache.temperature)),
        ("spec".to_string(), spec),
        (
            "thinking".to_string(),
            match c.thinking.sent {
                Some(true) => "on".into(),
                Some(false) => "off".into(),
                None => "unknown".into(),
            },
        ),
    ])
}

impl MetricSource for E2eResults {
    /// Per run, under `e2e/<suite>/<point>` ([`point_id`]):
    ///
    /// | id | kind |
    /// |---|---|
    /// | `determinism` (per suite, `--check-determinism`) | label: `deterministic` > `nondeterministic` |
    /// | `validity` | label: `valid` > `invalid` |
    /// | `requests/completed`, `requests/failed` | values, exact (more completed / fewer failed is better) |
    /// | `output_tokens/requested` | value, Σ `max_tokens` sent, must match |
    /// | `output_tokens/produced` | value, Σ output tokens of completed requests, must match; only when the suite fixes the output length (`ignore_eos`), else it depends on sampling |
    /// | `kv/capacity_tokens` | value, the KV capacity the engine reported, exact (more is better) |
    /// | `kv/preemptions` | value, preemptions during the run, exact (fewer is better) |
    /// | `ttft_s`, `tpot_s`, `itl_mean_s`, `e2e_latency_s` | timing samples, one per completed request outside a closed loop's opening wave (`itl_mean_s`: each request's mean ITL, since per-token ITLs are not stored), valid runs only |
    ///
    /// Throughput (output tok/s, req/s) is not a metric: a run yields one figure, not samples,
    /// so a change cannot be told from noise; and an invalid run's throughput is never
    /// presented ([`RunResult::presented_throughput`]). Timings of an invalid run are left out
    /// too (its `validity` label carries the regression).
    fn metrics(&self, out: &mut Vec<Metric>) {
        let prefix = e2e_prefix(self);
        if let Some(d) = &self.determinism {
            if d.identical + d.differing.len() > 0 {
                out.push(Metric {
                    id: format!("{prefix}/determinism"),
                    group: Group::E2e,
                    unit: Unit::Label,
                    direction: Direction::HigherIsBetter,
                    value: MetricValue::Label {
                        value: if d.deterministic() {
                            "deterministic"
                        } else {
                            "nondeterministic"
                        }
                        .into(),
                        scale: vec!["deterministic".into(), "nondeterministic".into()],
                    },
                    conditions: BTreeMap::from([
                        ("prompts".to_string(), d.prompts.to_string()),
                        ("max_tokens".to_string(), d.max_tokens.to_string()),
                    ]),
                    context: BTreeMap::new(),
                });
            }
        }
        for run in &self.runs {
            let p = format!("{prefix}/{}", point_id(&run.load));
            let g = Group::E2e;
            let mut v = Metric {
                id: format!("{p}/validity"),
                group: g,
                unit: Unit::Label,
                direction: Direction::HigherIsBetter,
                value: MetricValue::Label {
                    value: if run.validity.valid {
                        "valid"
                    } else {
                        "invalid"
                    }
                    .into(),
                    scale: vec!["valid".into(), "invalid".into()],
                },
                conditions: BTreeMap::new(),
                context: BTreeMap::new(),
            };
            if !run.validity.valid {
                v.context.insert(
                    "reasons".into(),
                    run.validity
                        .reasons
                        .iter()
                        .chain(run.validity.missing_conditions.iter())
                        .cloned()
                        .collect::<Vec<_>>()
                        .join("; "),
                );
            }
            out.push(v);
            let reqs = &run.requests;
            let completed = reqs.iter().filter(|r| r.ok).count();
            let failed = reqs.iter().filter(|r| !r.ok && !r.cancelled).count();
            out.push(exact_value(
                format!("{p}/requests/completed"),
                g,
                Unit::Count,
                Direction::HigherIsBetter,
                completed as f64,
            ));
            out.push(exact_value(
                format!("{p}/requests/failed"),
                g,
                Unit::Count,
                Direction::LowerIsBetter,
                failed as f64,
            ));
            out.push(exact_value(
                format!("{p}/output_tokens/requested"),
                g,
                Unit::Tokens,
                Direction::MustMatch,
                reqs.iter()
                    .map(|r| u64::from(r.output_tokens_requested))
                    .sum::<u64>() as f64,
            ));
            if run.conditions.lengths.output_fixed {
                let produced: u64 = reqs
                    .iter()
                    .filter(|r| r.ok)
                    .filter_map(|r| r.output_tokens)
                    .sum();
                let mut m = exact_value(
                    format!("{p}/output_tokens/produced"),
                    g,
                    Unit::Tokens,
                    Direction::MustMatch,
                    produced as f64,
                );
                let mut sources: Vec<&str> = run
                    .conditions
                    .token_sources
                    .iter()
                    .map(|s| s.label())
                    .collect();
                sources.dedup();
                m.context.insert("token_source".into(), sources.join(", "));
                out.push(m);
            }
            let kv = &run.conditions.kv;
            if let Some(cap) = &kv.capacity_tokens {
                let mut m = exact_value(
                    format!("{p}/kv/capacity_tokens"),
                    g,
                    Unit::Tokens,
                    Direction::HigherIsBetter,
                    cap.value as f64,
                );
                m.context.insert("source".into(), cap.source.clone());
                out.push(m);
            }
            if let Some(n) = kv.preemptions {
                out.push(exact_value(
                    format!("{p}/kv/preemptions"),
                    g,
                    Unit::Count,
                    Direction::LowerIsBetter,
                    n as f64,
                ));
            }
            if !run.validity.valid {
                continue;
            }
            let conditions = e2e_conditions(run);
            let mut context = BTreeMap::new();
            if let Some(e) = &run.conditions.engine {
                context.insert("engine".to_string(), e.value.clone());
            }
            if let Some(v) = &run.conditions.engine_version {
                context.insert("engine_version".to_string(), v.value.clone());
            }
            // The opening wave of a closed loop is left out, as in the report's statistics.
            let ok: Vec<&crate::e2e::metrics::RequestRecord> =
                reqs.iter().filter(|r| r.ok && !r.opening_wave).collect();
            type Pick = fn(&crate::e2e::metrics::RequestRecord) -> Option<f64>;
            let timings: [(&str, Pick); 4] = [
                ("ttft_s", |r| r.ttft_s),
                ("tpot_s", |r| r.tpot_s),
                ("itl_mean_s", |r| r.itl_mean_s),
                ("e2e_latency_s", |r| r.e2e_s),
            ];
            for (name, pick) in timings {
                let samples: Vec<f64> = ok.iter().filter_map(|r| pick(r)).collect();
                if samples.is_empty() {
                    continue;
                }
                out.push(Metric {
                    id: format!("{p}/{name}"),
                    group: g,
                    unit: Unit::Seconds,
                    direction: Direction::LowerIsBetter,
                    value: MetricValue::Samples {
                        samples,
                        repeats: Vec::new(),
                        between_run: None,
                        slots: Vec::new(),
                    },
                    conditions: conditions.clone(),
                    context: context.clone(),
                });
            }
        }
    }

    /// For `e2e/<suite>/<point>/...`: the run's invalidity (its timings are not metrics), the
    /// point's entry in [`E2eResults::skipped`], or what ended the session.
    fn missing_reason(&self, id: &str) -> Option<String> {
        let prefix = format!("{}/", e2e_prefix(self));
        let rest = id.strip_prefix(&prefix)?;
        let point = rest.split('/').next()?;
        if let Some(run) = self.runs.iter().find(|r| point_id(&r.load) == point) {
            if !run.validity.valid {
                let why: Vec<&str> = run
                    .validity
                    .reasons
                    .iter()
                    .chain(run.validity.missing_conditions.iter())
                    .map(String::as_str)
                    .collect();
                return Some(format!(
                    "run {} is invalid ({}); timings of invalid runs are not compared",
                    run.label,
                    why.join("; ")
                ));
            }
            return None;
        }
        if let Some(s) = self.skipped.iter().find(|s| {
            s.split_once(':')
                .is_some_and(|(label, _)| label_point_id(label) == point)
        }) {
            return Some(format!("skipped: {s}"));
        }
        if let Some(f) = &self.failure {
            return Some(format!("the e2e session ended early: {f}"));
        }
        self.interrupted
            .then(|| "the e2e session was interrupted".to_string())
    }
}

/// [`point_id`] from a sweep point's label ([`LoadPoint::label`]: `c=4`, `2.00 req/s`,
/// `2.00 req/s γ2`); the cap of an open loop is not in the label, so such points match only
/// through [`E2eResults::failure`].
fn label_point_id(label: &str) -> String {
    let label = label.trim();
    if label.starts_with("c=") {
        return label.to_string();
    }
    let mut words = label.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some(rate), Some("req/s"), gamma) => {
            let mut s = format!("rate={rate}");
            if let Some(g) = gamma.and_then(|g| g.strip_prefix('γ')) {
                s.push_str(&format!("-gamma{g}"));
            }
            s
        }
        _ => segment(label),
    }
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
            graph: None,
            graph_skip: None,
            clocks: None,
        }
    }

    #[test]
    fn ids_kinds_and_duplicates() {
        let mut r = Results::new(RigFacts::default(), "cpu-x86-64".into(), "t".into());
        r.rig.capabilities =
            crate::rig::capability::table(crate::gpu::ComputeCapability::new(12, 0));
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
        // No runs, no e2e metrics.
        let mut out = Vec::new();
        E2eResults::default().metrics(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn slots_rank_the_formats_that_ran() {
        // Three repeats; the orders list native W4A4 and W4A16, which timed nothing here: they
        // take no slot wherever they stand, so the slots rank bf16 and fp8 only.
        use crate::kernels::schema::{CaseRepeats, SuiteRepeats};
        let mut bf16 = case(1);
        bf16.implementation = "bf16".into();
        bf16.format = GemmFormat::Bf16;
        bf16.extra.clear();
        let mut fp8 = case(1);
        fp8.extra.clear();
        fp8.timing.samples_s = vec![1.0; 6];
        bf16.timing.samples_s = vec![1.0; 6];
        let order = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let rep = |c: &KernelCase| CaseRepeats {
            provider: c.provider.clone(),
            implementation: c.implementation.clone(),
            shape: c.shape.clone(),
            m: c.m,
            part: None,
            sizes: vec![2, 2, 2],
        };
        let k = KernelResults {
            repeats: Some(SuiteRepeats {
                count: 3,
                order: vec![
                    order(&["bf16", "w4a4", "fp8", "w4a16"]),
                    order(&["fp8", "w4a16", "bf16", "w4a4"]),
                    order(&["w4a16", "bf16", "fp8", "w4a4"]),
                ],
                cases: vec![rep(&bf16), rep(&fp8)],
            }),
            cases: vec![bf16, fp8],
            ..Default::default()
        };
        let mut out = Vec::new();
        k.metrics(&mut out);
        let slots = |id: &str| match &out.iter().find(|m| m.id == id).unwrap().value {
            MetricValue::Samples { slots, .. } => slots.clone(),
            _ => unreachable!(),
        };
        assert_eq!(slots("kernels/rigbench/fp8/qkv/m=1/time_s"), vec![1, 0, 1]);
        assert_eq!(slots("kernels/rigbench/bf16/qkv/m=1/time_s"), vec![0, 1, 0]);
        // A repeat that did not time the case (sizes shorter than the order): no slots.
        let mut k2 = k.clone();
        k2.repeats.as_mut().unwrap().cases[1].sizes = vec![3, 3];
        let mut out = Vec::new();
        k2.metrics(&mut out);
        let m = out
            .iter()
            .find(|m| m.id == "kernels/rigbench/fp8/qkv/m=1/time_s")
            .unwrap();
        assert!(matches!(&m.value, MetricValue::Samples { slots, .. } if slots.is_empty()));
    }

    #[test]
    fn reference_accuracy_ids_name_the_data_set() {
        let mut r = Results::new(RigFacts::default(), "ci-cpu".into(), "t".into());
        r.kernels = Some(KernelResults {
            reference_accuracy: crate::kernels::accuracy::study(),
            ..Default::default()
        });
        let ms = metrics_of(&r);
        let ids: Vec<&str> = ms.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids.len(), 8, "{ids:?}");
        assert!(
            ids.iter().all(|i| !i.contains('#')),
            "no #2 suffixes: {ids:?}"
        );
        assert!(ids.contains(&"kernels/reference_accuracy/w4a16/16×256×2048/plain/rel_l2_vs_exact"));
        assert!(
            ids.contains(&"kernels/reference_accuracy/w4a16/16×256×2048/outliers/rel_l2_vs_exact")
        );
        assert!(ms.iter().all(Metric::is_deterministic));
    }

    fn finding(rule: &str, severity: crate::checkpoint::Severity) -> crate::checkpoint::Finding {
        crate::checkpoint::Finding {
            rule: rule.into(),
            severity,
            why: String::new(),
            detail: String::new(),
            modules: Vec::new(),
            module_count: 2,
        }
    }

    #[test]
    fn inspect_metrics_rank_lint_findings_and_label_the_module_table() {
        use crate::checkpoint::{LayerKind, ModuleFormat, ModuleRow, Severity};
        let mut rep = InspectReport {
            checkpoint: "/models/Qwen3.6-27B-NVFP4/".into(),
            ..Default::default()
        };
        let row = |module: &str, layers: &str, format: ModuleFormat| ModuleRow {
            kind: LayerKind::LinearAttention,
            module: module.into(),
            layers: layers.into(),
            count: 1,
            format,
            declared: String::new(),
            evidence: String::new(),
        };
        rep.modules = vec![
            row("layers.*.linear_attn.in_proj_a", "0-2", ModuleFormat::Bf16),
            row("layers.*.linear_attn.in_proj_a", "3", ModuleFormat::Mxfp4),
        ];
        rep.findings = vec![
            finding("vision-quantized", Severity::Info),
            finding("vision-quantized", Severity::Warning),
            finding("gdn-ab-quantized", Severity::Error),
            finding("some-future-rule", Severity::Info),
        ];
        rep.capacity.kv_tokens = Some(1000);
        let mut out = Vec::new();
        rep.metrics(&mut out);
        let get = |id: &str| {
            out.iter().find(|m| m.id == id).unwrap_or_else(|| {
                panic!(
                    "{id} not in {:?}",
                    out.iter().map(|m| &m.id).collect::<Vec<_>>()
                )
            })
        };
        let label = |id: &str| match &get(id).value {
            MetricValue::Label { value, .. } => value.clone(),
            v => panic!("{v:?}"),
        };
        let p = "checkpoint/Qwen3.6-27B-NVFP4";
        assert_eq!(label(&format!("{p}/lint/vision-quantized")), "warning");
        assert_eq!(label(&format!("{p}/lint/gdn-ab-quantized")), "error");
        assert_eq!(label(&format!("{p}/lint/mtp-4bit")), "absent");
        assert_eq!(label(&format!("{p}/lint/some-future-rule")), "info");
        assert_eq!(
            get(&format!("{p}/lint/errors")).value,
            MetricValue::Value {
                value: 1.0,
                tolerance: Tolerance::Relative { rel: 0.0 }
            }
        );
        assert_eq!(
            label(&format!(
                "{p}/modules/linear_attention/layers.*.linear_attn.in_proj_a"
            )),
            "BF16 ×1 [layers 0-2]; MXFP4 (group 32) ×1 [layers 3]"
        );
        assert_eq!(
            get(&format!("{p}/capacity/kv_tokens")).direction,
            Direction::MustMatch
        );
        // A rule firing where it did not is a regression; a milder severity an improvement.
        let s = crate::compare::Settings::default();
        let mut before = get(&format!("{p}/lint/mtp-4bit")).clone();
        let mut after = before.clone();
        after.value = MetricValue::Label {
            value: "error".into(),
            scale: LINT_SCALE.iter().map(|x| x.to_string()).collect(),
        };
        let v = crate::compare::compare_metric(&before, &after, &s).verdict;
        assert_eq!(v, crate::compare::Verdict::Regressed);
        std::mem::swap(&mut before, &mut after);
        let v = crate::compare::compare_metric(&before, &after, &s).verdict;
        assert_eq!(v, crate::compare::Verdict::Improved);
        // Names.
        assert_eq!(checkpoint_name(&InspectReport::default()), "checkpoint");
        let dot = InspectReport {
            checkpoint: ".".into(),
            ..Default::default()
        };
        assert_eq!(checkpoint_name(&dot), "checkpoint");
    }

    #[test]
    fn sweep_point_ids() {
        use crate::e2e::executor::LoadPoint;
        assert_eq!(point_id(&LoadPoint::Closed { concurrency: 4 }), "c=4");
        let open = |arrival, max| LoadPoint::Open {
            rate: 2.0,
            arrival,
            burstiness: 0.5,
            max_concurrency: max,
            seed: 0,
        };
        assert_eq!(point_id(&open(ArrivalKind::Poisson, None)), "rate=2.00");
        assert_eq!(
            point_id(&open(ArrivalKind::Gamma, Some(8))),
            "rate=2.00-gamma0.5-max_c=8"
        );
        for p in [
            LoadPoint::Closed { concurrency: 4 },
            open(ArrivalKind::Poisson, None),
            open(ArrivalKind::Gamma, None),
        ] {
            assert_eq!(label_point_id(&p.label()), point_id(&p), "{}", p.label());
            assert!(!point_id(&p).contains('/'));
        }
    }

    #[test]
    fn graph_and_composite_metrics() {
        let mut r = Results::new(RigFacts::default(), "cpu-x86-64".into(), "t".into());
        let mut c = case(1);
        let graph_timing = Timing {
            samples_s: vec![1.0, 1.1],
            graph: Some(crate::kernels::schema::GraphSetup {
                launches: 8,
                weight_copies: 4,
                weight_bytes_total: 1,
            }),
            ..Default::default()
        };
        c.graph = Some(crate::kernels::schema::GraphTimings {
            timing: graph_timing.clone(),
            extra: vec![NamedTiming {
                name: "activation_quant".into(),
                timing: graph_timing.clone(),
            }],
        });
        // A case timed in graph mode only: its primary metric carries `timing = graph`.
        let mut g = case(16);
        g.timing = graph_timing;
        let mut k = KernelResults {
            cases: vec![c, g],
            ..Default::default()
        };
        k.suite.decode_step = Some(crate::kernels::schema::DecodeStep {
            description: "d".into(),
            complete: true,
            shapes: vec![crate::kernels::schema::StepShape {
                shape: "qkv".into(),
                n: 64,
                k: 32,
                count: 16,
            }],
        });
        crate::kernels::composite::refresh(&mut k);
        r.kernels = Some(k);
        let ms = metrics_of(&r);
        let get = |id: &str| {
            ms.iter()
                .find(|m| m.id == id)
                .unwrap_or_else(|| panic!("{id}"))
        };
        let cold = get("kernels/rigbench/fp8/qkv/m=1/time_s");
        assert!(
            !cold.conditions.contains_key("timing"),
            "cold figures keep old baselines comparable"
        );
        let gm = get("kernels/rigbench/fp8/qkv/m=1/graph/time_s");
        assert_eq!(
            gm.conditions.get("timing").map(String::as_str),
            Some("graph")
        );
        get("kernels/rigbench/fp8/qkv/m=1/graph/activation_quant/time_s");
        let primary_graph = get("kernels/rigbench/fp8/qkv/m=16/time_s");
        assert_eq!(
            primary_graph.conditions.get("timing").map(String::as_str),
            Some("graph")
        );
        let comp = get("kernels/composite/rigbench/fp8/m=1/time_s");
        assert_eq!(comp.unit, Unit::Seconds);
        assert_eq!(
            comp.conditions.get("step").map(String::as_str),
            Some("qkv×16")
        );
        match &comp.value {
            MetricValue::Samples { samples, .. } => {
                assert_eq!(samples.len(), crate::kernels::composite::QUANTILES.len())
            }
            other => panic!("{other:?}"),
        }
        get("kernels/composite/rigbench/fp8/m=1/graph/time_s");
        get("kernels/composite/rigbench/fp8/m=16/graph/time_s");
        // A composite row missing from the results is explained by its gap.
        let mut r2 = r.clone();
        if let Some(k2) = r2.kernels.as_mut() {
            let mut other = case(1);
            other.shape = "o_proj".into();
            k2.cases.push(other);
            if let Some(step) = k2.suite.decode_step.as_mut() {
                step.shapes.push(crate::kernels::schema::StepShape {
                    shape: "o_proj".into(),
                    n: 64,
                    k: 32,
                    count: 2,
                });
            }
            crate::kernels::composite::refresh(k2);
        }
        let why = missing_reason(&r2, "kernels/composite/rigbench/fp8/m=16/graph/time_s").unwrap();
        assert!(
            why.contains("left out of the composite") && why.contains("no timed case for o_proj"),
            "{why}"
        );
        if let Some(k2) = r2.kernels.as_mut() {
            k2.composite = None;
        }
        assert!(
            missing_reason(&r2, "kernels/composite/rigbench/fp8/m=1/time_s")
                .unwrap()
                .contains("no decode-step composite")
        );
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
