//! The checkpoint's metrics (from an [`InspectReport`]): lint findings as ranked labels, the
//! module table as labels, and the capacity figures as exact values.

use std::collections::BTreeMap;

use super::types::{
    exact_value, segment, serde_name, Direction, Group, Metric, MetricSource, MetricValue, Unit,
};
use crate::checkpoint::InspectReport;

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
