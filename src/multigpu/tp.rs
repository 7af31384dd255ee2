//! The all-reduce cost of a tensor-parallel decode step, and the predicted linear-layer time per
//! decode step at TP = 1, 2, … from the decode-step composite.
//!
//! Model (Megatron-LM's tensor parallelism, as vLLM and SGLang run it): each layer's attention
//! block and MLP end in a row-parallel linear layer whose partial outputs are summed by one
//! all-reduce of the BF16 activations, hidden size × M × 2 bytes; so a decode step makes
//! 2 × layers all-reduces. With the weights split over TP GPUs, each GPU runs 1/TP of every
//! linear layer. Prediction at TP = t for a composite time C(M) (the summed GEMM time of one
//! decode step on one GPU):
//!
//! `T(M, t) = C(M) / t + 2 · layers · AR_t(hidden · M · 2 bytes)` (and `T(M, 1) = C(M)`),
//!
//! with `AR_t` the all-reduce time measured over t GPUs in the same run, and `C(M)` the decode-step
//! composite of the same run ([`decode_composite`]).

use super::schema::{AllReducePerStep, AllReduceWorld, TpRow};
use crate::kernels::suite::ModelInfo;

/// One point of a decode-step composite: the summed GEMM time of one decode step at batch `m`
/// for one format or implementation.
#[derive(Debug, Clone, PartialEq)]
pub struct CompositePoint {
    /// Format or implementation (`bf16`, `fp8 (incl. activation quantization)`, `w4a16`, …).
    pub label: String,
    /// Decode batch.
    pub m: usize,
    /// Summed GEMM time of the step on one GPU, seconds.
    pub seconds: f64,
}

/// What the prediction leaves out (printed with it).
pub const LEAVES_OUT: &[&str] = &[
    "it is a prediction from single-GPU GEMM times and measured all-reduces, not a measured tensor-parallel run",
    "each GPU's linear layers are taken as 1/TP of the one-GPU composite; at small M a GEMM's fixed cost (a few µs) does not shrink with TP, so the linear time at TP > 1 is an optimistic bound",
    "attention and Gated-DeltaNet kernels, norms, activations, embeddings, sampling and launch gaps are not included",
    "all-reduces are NCCL's (`ncclAllReduce`, BF16, one per row-parallel layer); engines may use their own all-reduce for small messages (vLLM's custom all-reduce), fuse it with the norm, or overlap it with compute",
    "the vocabulary-parallel lm_head's gather and the imbalance of layers whose N does not split evenly are not included",
];

/// The all-reduce time per decode step for every communicator size and decode M measured.
pub fn allreduce_per_step(worlds: &[AllReduceWorld], model: &ModelInfo) -> Vec<AllReducePerStep> {
    let per_step = model.allreduces_per_layer * model.layers;
    let mut out = Vec::new();
    for w in worlds {
        let tp = w.devices.len();
        for p in &w.points {
            let Some(m) = p.m else { continue };
            if p.bytes != super::decode_message_bytes(model.hidden_size, m) {
                continue; // measured for another model's hidden size
            }
            out.push(AllReducePerStep {
                tp,
                m,
                bytes: p.bytes,
                allreduce_s: p.timing.median_s,
                per_step,
                step_s: per_step as f64 * p.timing.median_s,
            });
        }
    }
    out.sort_by_key(|r| (r.tp, r.m));
    out
}

/// Predict the linear-layer time per decode step at TP = 1 and at every TP whose all-reduce was
/// measured at the composite's M. Rows come per composite point, TP ascending.
pub fn predict(composite: &[CompositePoint], per_step: &[AllReducePerStep]) -> Vec<TpRow> {
    let mut tps: Vec<usize> = per_step.iter().map(|r| r.tp).collect();
    tps.sort_unstable();
    tps.dedup();
    let mut rows = Vec::new();
    for c in composite {
        if !(c.seconds.is_finite() && c.seconds > 0.0) {
            continue;
        }
        rows.push(TpRow {
            label: c.label.clone(),
            m: c.m,
            tp: 1,
            linear_s: c.seconds,
            allreduce_s: 0.0,
            total_s: c.seconds,
            speedup_vs_tp1: 1.0,
        });
        for &tp in &tps {
            let Some(ar) = per_step.iter().find(|r| r.tp == tp && r.m == c.m) else {
                continue;
            };
            let linear = c.seconds / tp as f64;
            let total = linear + ar.step_s;
            rows.push(TpRow {
                label: c.label.clone(),
                m: c.m,
                tp,
                linear_s: linear,
                allreduce_s: ar.step_s,
                total_s: total,
                speedup_vs_tp1: c.seconds / total,
            });
        }
    }
    rows
}

/// Why there is no composite to start from.
pub const NO_COMPOSITE: &str = "the kernel results have no decode-step composite (per implementation and M, the summed GEMM time of one decode step, from the suite's per-step shape counts); the prediction starts from it";

/// The decode-step composite the prediction starts from, read from `results.kernels`, with a
/// sentence naming its source.
///
/// The composite is the kernel results' (`kernels.composite`: `step.complete`, `step.description`,
/// and rows of `provider`, `implementation`, `m`, `timing` (`cold` / `graph`), `median_s`,
/// `act_quant_included`). It is read through the results' JSON form so that this module does not
/// depend on the composite's Rust types; see [`composite_points`].
///
/// # Errors
/// The reason no composite is available ([`NO_COMPOSITE`] when the results have none).
pub fn decode_composite(
    kernels: Option<&crate::kernels::KernelResults>,
) -> Result<(String, Vec<CompositePoint>), String> {
    let k = kernels.ok_or("no kernel results in this run")?;
    let v = serde_json::to_value(k).map_err(|e| format!("kernel results: {e}"))?;
    composite_points(&v)
}

/// [`decode_composite`] over the JSON of a `KernelResults`: rigbench's own rows, in cold timing
/// when there are any (else graph timing), labelled by implementation, FP8 marked when its
/// activation quantization is included.
///
/// # Errors
/// [`NO_COMPOSITE`], or a sentence saying which field is missing.
pub fn composite_points(
    kernels: &serde_json::Value,
) -> Result<(String, Vec<CompositePoint>), String> {
    let c = kernels
        .get("composite")
        .filter(|c| !c.is_null())
        .ok_or(NO_COMPOSITE)?;
    let rows = c
        .get("rows")
        .and_then(|r| r.as_array())
        .ok_or("the composite has no rows")?;
    let own: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r.get("provider").and_then(|p| p.as_str()) == Some("rigbench"))
        .collect();
    let mode = if own
        .iter()
        .any(|r| r.get("timing").and_then(|t| t.as_str()) == Some("cold"))
    {
        "cold"
    } else {
        "graph"
    };
    let mut points = Vec::new();
    for r in own
        .iter()
        .filter(|r| r.get("timing").and_then(|t| t.as_str()) == Some(mode))
    {
        let (Some(imp), Some(m), Some(s)) = (
            r.get("implementation").and_then(|x| x.as_str()),
            r.get("m").and_then(|x| x.as_u64()),
            r.get("median_s").and_then(|x| x.as_f64()),
        ) else {
            return Err("a composite row lacks implementation, m or median_s".into());
        };
        let quant = r
            .get("act_quant_included")
            .and_then(|x| x.as_bool())
            .unwrap_or(false);
        points.push(CompositePoint {
            label: if quant {
                format!("{imp} (incl. activation quantization)")
            } else {
                imp.to_string()
            },
            m: m as usize,
            seconds: s,
        });
    }
    if points.is_empty() {
        return Err("the composite has no rows of rigbench's own implementations".into());
    }
    let step = c.get("step");
    let complete = step
        .and_then(|s| s.get("complete"))
        .and_then(|x| x.as_bool())
        .unwrap_or(false);
    let description = step
        .and_then(|s| s.get("description"))
        .and_then(|x| x.as_str())
        .unwrap_or("");
    let source = format!(
        "this run's decode-step composite on the first GPU ({mode} timing; {description}){}",
        if complete {
            String::new()
        } else {
            "; the suite covers only PART of the step's linear layers, so the composite and the prediction are of that part".into()
        }
    );
    Ok((source, points))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::multigpu::schema::{AllReducePoint, OpTiming};

    fn model() -> ModelInfo {
        ModelInfo {
            name: "test".into(),
            hidden_size: 5120,
            layers: 64,
            allreduces_per_layer: 2,
        }
    }

    fn world(n: usize, points: &[(usize, f64)]) -> AllReduceWorld {
        AllReduceWorld {
            devices: (0..n).collect(),
            check_passed: true,
            points: points
                .iter()
                .map(|&(m, s)| AllReducePoint {
                    bytes: 5120 * m as u64 * 2,
                    m: Some(m),
                    timing: OpTiming {
                        median_s: s,
                        ..Default::default()
                    },
                    ..Default::default()
                })
                .chain(std::iter::once(AllReducePoint {
                    bytes: 32 << 20,
                    m: None,
                    ..Default::default()
                }))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn per_step_is_two_per_layer_times_layers() {
        let ps = allreduce_per_step(&[world(2, &[(1, 10e-6), (16, 12e-6)])], &model());
        assert_eq!(ps.len(), 2, "the large size is not a decode step");
        assert_eq!(ps[0].per_step, 128);
        assert!((ps[0].step_s - 1.28e-3).abs() < 1e-12);
        assert_eq!(ps[1].bytes, 163_840);
        // A size measured for another hidden size is not counted.
        let mut other = model();
        other.hidden_size = 4096;
        assert!(allreduce_per_step(&[world(2, &[(1, 1e-5)])], &other).is_empty());
    }

    #[test]
    fn prediction_splits_linear_time_and_adds_the_allreduces() {
        let ps = allreduce_per_step(
            &[
                world(2, &[(1, 10e-6), (16, 12e-6)]),
                world(4, &[(1, 15e-6)]),
            ],
            &model(),
        );
        let comp = vec![
            CompositePoint {
                label: "bf16".into(),
                m: 1,
                seconds: 13.9e-3,
            },
            CompositePoint {
                label: "bf16".into(),
                m: 16,
                seconds: 14.1e-3,
            },
            CompositePoint {
                label: "bf16".into(),
                m: 64,
                seconds: 14.4e-3,
            },
        ];
        let rows = predict(&comp, &ps);
        // M = 1: TP 1, 2, 4; M = 16: TP 1, 2; M = 64: TP 1 only (no all-reduce measured there).
        assert_eq!(rows.len(), 6);
        let r = rows.iter().find(|r| r.m == 1 && r.tp == 2).unwrap();
        // 13.9 ms / 2 + 128 × 10 µs = 6.95 + 1.28 = 8.23 ms.
        assert!((r.linear_s - 6.95e-3).abs() < 1e-12);
        assert!((r.allreduce_s - 1.28e-3).abs() < 1e-12);
        assert!((r.total_s - 8.23e-3).abs() < 1e-12);
        assert!((r.speedup_vs_tp1 - 13.9 / 8.23).abs() < 1e-9);
        let r4 = rows.iter().find(|r| r.m == 1 && r.tp == 4).unwrap();
        assert!((r4.total_s - (13.9e-3 / 4.0 + 128.0 * 15e-6)).abs() < 1e-12);
        let r1 = rows.iter().find(|r| r.m == 64).unwrap();
        assert_eq!((r1.tp, r1.allreduce_s, r1.speedup_vs_tp1), (1, 0.0, 1.0));
        // A slow link makes TP lose: 128 × 100 µs = 12.8 ms of all-reduce per step.
        let slow = allreduce_per_step(&[world(2, &[(1, 100e-6)])], &model());
        let rows = predict(&comp[..1], &slow);
        assert!(rows[1].speedup_vs_tp1 < 1.0);
        // Non-finite or zero composite points are left out.
        assert!(predict(
            &[CompositePoint {
                label: "x".into(),
                m: 1,
                seconds: f64::NAN
            }],
            &ps
        )
        .is_empty());
    }

    #[test]
    fn composite_rows_are_read_from_the_results() {
        assert!(decode_composite(None)
            .unwrap_err()
            .contains("no kernel results"));
        let k = crate::kernels::KernelResults::default();
        assert_eq!(decode_composite(Some(&k)).unwrap_err(), NO_COMPOSITE);
        // The composite's JSON form (the kernels schema), abridged.
        let k = serde_json::json!({"composite": {
        "step": {"description": "one Qwen3.6-27B decode step", "complete": true, "shapes": []},
        "rows": [
            {"provider": "rigbench", "implementation": "bf16", "m": 1, "timing": "cold", "median_s": 13.9e-3, "act_quant_included": false},
            {"provider": "rigbench", "implementation": "fp8", "m": 1, "timing": "cold", "median_s": 7.97e-3, "act_quant_included": true},
            {"provider": "rigbench", "implementation": "bf16", "m": 1, "timing": "graph", "median_s": 13.0e-3, "act_quant_included": false},
            {"provider": "torch", "implementation": "torch.matmul", "m": 1, "timing": "cold", "median_s": 14e-3, "act_quant_included": false}
        ]}});
        let (src, pts) = composite_points(&k).unwrap();
        assert!(
            src.contains("cold timing") && !src.contains("PART"),
            "{src}"
        );
        assert_eq!(pts.len(), 2, "rigbench's own cold rows only");
        assert_eq!(pts[1].label, "fp8 (incl. activation quantization)");
        assert_eq!((pts[0].m, pts[0].seconds), (1, 13.9e-3));
        // A partial step says so; graph timing is used when there is no cold row.
        let k = serde_json::json!({"composite": {
            "step": {"description": "part", "complete": false},
            "rows": [{"provider": "rigbench", "implementation": "w4a16", "m": 16, "timing": "graph", "median_s": 1e-3}]}});
        let (src, pts) = composite_points(&k).unwrap();
        assert!(
            src.contains("graph timing") && src.contains("PART"),
            "{src}"
        );
        assert_eq!(pts[0].label, "w4a16");
        let k = serde_json::json!({"composite": {"rows": [{"provider": "rigbench", "timing": "cold"}]}});
        assert!(composite_points(&k).unwrap_err().contains("lacks"));
    }

    /// The multi-GPU tensor-parallel prediction reads the composite through its JSON form
    /// ([`composite_points`]): the kernels schema must keep feeding it.
    #[test]
    fn the_multi_gpu_prediction_reads_this_schema() {
        let mut k = crate::kernels::composite::tests::h200_run();
        crate::kernels::composite::refresh(&mut k);
        let v = serde_json::to_value(&k).unwrap();
        let (src, pts) = composite_points(&v).unwrap();
        assert!(
            src.contains("cold timing") && !src.contains("PART"),
            "{src}"
        );
        let fp8 = pts
            .iter()
            .find(|p| p.label == "fp8 (incl. activation quantization)" && p.m == 1)
            .unwrap();
        assert!((fp8.seconds * 1e3 - 10.179055807879195).abs() < 1e-9);
        assert!(
            pts.iter().all(|p| !p.label.starts_with("torch")),
            "rigbench's rows only"
        );
    }
}
