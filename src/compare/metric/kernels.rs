//! The kernel suite's metrics: per timed case its timings (cold and graph) and check, per
//! determinism record `bit_exact`, the reference-accuracy values and the decode-step composite;
//! and the reasons a kernel metric is missing.

use std::collections::BTreeMap;

use super::types::{segment, Direction, Group, Metric, MetricSource, MetricValue, Tolerance, Unit};
use crate::kernels::schema::{KernelCase, Timing};
use crate::kernels::KernelResults;

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
