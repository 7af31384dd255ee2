//! The fidelity study's figures as comparable metrics (`report`'s `quality` section,
//! `crate::runtime_eval::quality`; docs/fidelity.md): a quality drop of a format on trained
//! weights fails `compare` as a kernel slowdown does. Before, `compare` never read them, so a
//! format that lost half its top-1 agreement passed CI.
//!
//! Per format (`fp8`, `nvfp4`, `nvfp4-w4a4`), under `quality/<format>/`:
//!
//! | id | direction | tolerance |
//! |---|---|---|
//! | `top1_agreement` | higher is better | relative 1% (one position of the 255-token text is 0.4%) |
//! | `greedy_agreement` | higher is better | relative 2% (128 greedy tokens: one token is 0.8%) |
//! | `mean_kl` | lower is better | relative 5% |
//!
//! Perplexity is not gated: on the 255-token text the change FP8 makes is inside the rounding
//! noise of activation quantization (docs/fidelity.md), so a gate on it would flag noise.
//! The figures are deterministic CPU arithmetic on fixed weights and text (values, not timing
//! samples): `compare --deterministic-only` compares them. The model, the backend and the text
//! length are conditions: figures of another model are not compared as if they were the same.

use std::collections::BTreeMap;

use super::metric::{Direction, Group, Metric, MetricValue, Tolerance, Unit};
use crate::report::Results;

/// Append the fidelity metrics of `results` (its `quality` section, when present) to `out`.
pub fn metrics(results: &Results, out: &mut Vec<Metric>) {
    let Some(q) = &results.quality else {
        return;
    };
    let conditions = BTreeMap::from([
        ("model".to_string(), q.model.clone()),
        ("backend".to_string(), q.backend.clone()),
        ("text_tokens".to_string(), q.text_tokens.to_string()),
        (
            "greedy".to_string(),
            format!("{} prompts x {} tokens", q.prompts, q.greedy_tokens),
        ),
    ]);
    for f in &q.formats {
        let emulated = BTreeMap::from([("emulated".to_string(), f.emulated.to_string())]);
        for (name, value, direction, rel) in [
            (
                "top1_agreement",
                f.top1_agreement,
                Direction::HigherIsBetter,
                0.01,
            ),
            (
                "greedy_agreement",
                f.greedy_agreement,
                Direction::HigherIsBetter,
                0.02,
            ),
            ("mean_kl", f.mean_kl, Direction::LowerIsBetter, 0.05),
        ] {
            out.push(Metric {
                id: format!("quality/{}/{name}", f.format),
                group: Group::Kernels,
                unit: Unit::Ratio,
                direction,
                value: MetricValue::Value {
                    value,
                    tolerance: Tolerance::Relative { rel },
                },
                conditions: conditions.clone(),
                context: emulated.clone(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::verdict::{compare_metric, Settings, Verdict};

    fn results(top1: f64, kl: f64) -> Results {
        let text = format!(
            r#"{{"model": "SmolLM2 test", "backend": "cpu", "text": "t", "text_tokens": 255,
            "prompts": 8, "greedy_tokens": 16,
            "bf16_perplexity": {{"ppl": 10.0, "mean_nll": 2.3, "tokens": 255}},
            "formats": [{{"format": "fp8", "label": "FP8", "emulated": false,
              "top1_agreement": {top1}, "mean_kl": {kl}, "max_kl": 1.0,
              "perplexity": {{"ppl": 10.1, "mean_nll": 2.31, "tokens": 255}},
              "greedy_agreement": 0.9, "mean_matched_prefix": 12.0}}],
            "w4a4_worse_than_w4a16_in_kl": null}}"#
        );
        let mut r = Results::new(Default::default(), "x".into(), "rigbench report".into());
        r.quality = Some(serde_json::from_str(&text).expect("a quality section"));
        r
    }

    fn verdict(base: &Results, cur: &Results, id: &str) -> Verdict {
        let find = |r: &Results| {
            let mut v = Vec::new();
            metrics(r, &mut v);
            v.into_iter().find(|m| m.id == id).expect(id)
        };
        compare_metric(&find(base), &find(cur), &Settings::default()).verdict
    }

    #[test]
    fn a_quality_drop_regresses_and_the_same_figures_are_same() {
        let base = results(0.92, 0.02);
        assert_eq!(
            verdict(&base, &base, "quality/fp8/top1_agreement"),
            Verdict::Same
        );
        let worse = results(0.80, 0.02);
        assert_eq!(
            verdict(&base, &worse, "quality/fp8/top1_agreement"),
            Verdict::Regressed
        );
        let worse_kl = results(0.92, 0.05);
        assert!(verdict(&base, &worse_kl, "quality/fp8/mean_kl").is_failure());
        // A one-position wobble of 255 (0.4%) is within the tolerance.
        let wobble = results(0.92 - 1.0 / 255.0, 0.02);
        assert_eq!(
            verdict(&base, &wobble, "quality/fp8/top1_agreement"),
            Verdict::Same
        );
    }
}
