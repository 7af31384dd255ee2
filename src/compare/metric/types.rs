//! The metric types: [`Metric`] with its id, [`Unit`], [`Direction`], [`Group`] and
//! [`MetricValue`] (timing samples, a value with its [`Tolerance`], or a ranked label); the
//! [`MetricSource`] trait each part of the results implements; and the small id and value
//! builders the parts share.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
    /// Repeated measurements (timings); compared with an interval (see
    /// [`crate::compare::gate`]) and a noise threshold.
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
        /// The comparison fits it as a block factor ([`crate::compare::gate::Paired::slot_fit`]).
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

/// The serde name of a unit-like enum value (`cold`, `fp8`, ...), for ids and conditions.
pub(super) fn serde_name<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

/// Make `s` usable as one `/`-separated id segment (slashes and whitespace become `_`).
pub(super) fn segment(s: &str) -> String {
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
pub(super) fn exact_value(
    id: String,
    group: Group,
    unit: Unit,
    direction: Direction,
    value: f64,
) -> Metric {
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
