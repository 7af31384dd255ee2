//! The rig's metrics: one ranked support label per capability-table row.

use std::collections::BTreeMap;

use super::types::{Direction, Group, Metric, MetricSource, MetricValue, Unit};
use crate::rig::{RigFacts, Support};

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
