//! The tensor-parallel composite predicted from one GPU's rows (src/multigpu/tp_model.rs,
//! docs/multi-gpu.md "Tensor-parallel composite from one GPU"), checked on recorded outputs:
//! the committed 2-GPU H200 report (NCCL all-reduce measured at TP = 2, and its own TP = 2
//! prediction) and the committed single-GPU H200 kernels report (the full qwen3.6-27b suite).

use rigbench::kernels::composite::compute_for;
use rigbench::kernels::schema::DecodeStep;
use rigbench::kernels::suite::ModelInfo;
use rigbench::kernels::KernelResults;
use rigbench::multigpu::schema::{AllReduceWorld, TpPrediction};
use rigbench::multigpu::tp_model::{
    predict, AllReduceModel, Estimate, DEFAULT_ALPHA_S, DEFAULT_BUSBW_BYTES_PER_S,
    DEFAULT_SOURCE_FILE,
};

const ONE_GPU: &str = "reports/nvidia-h200-sm90/20261201T194534Z/results.json";

fn load(rel: &str) -> serde_json::Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; this test reads the committed report there (git checkout it)",
            p.display()
        )
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn x2() -> (AllReduceWorld, TpPrediction, DecodeStep) {
    let v = load(DEFAULT_SOURCE_FILE);
    let mg = &v["multi_gpu"];
    let world: AllReduceWorld =
        serde_json::from_value(mg["allreduce"]["worlds"][0].clone()).expect("x2 all-reduce world");
    let tp: TpPrediction = serde_json::from_value(mg["tp"].clone()).expect("x2 tp prediction");
    let step: DecodeStep =
        serde_json::from_value(v["kernels"]["composite"]["step"].clone()).expect("x2 step");
    (world, tp, step)
}

fn one_gpu() -> KernelResults {
    serde_json::from_value(load(ONE_GPU)["kernels"].clone()).expect("1-GPU kernel results")
}

fn model(tp: &TpPrediction) -> ModelInfo {
    ModelInfo {
        name: "Qwen3.6-27B".into(),
        hidden_size: tp.hidden_size,
        layers: tp.layers,
        allreduces_per_layer: tp.allreduces_per_layer,
    }
}

/// The default α and busbw are the fit to the recorded 2-GPU all-reduces, not typed-in figures.
#[test]
fn default_allreduce_model_is_the_x2_reports_fit() {
    let (world, _, _) = x2();
    assert_eq!(world.devices.len(), 2);
    let (alpha, busbw) = AllReduceModel::fit_world(&world).expect("a fit");
    assert!((alpha / DEFAULT_ALPHA_S - 1.0).abs() < 1e-9, "{alpha}");
    assert!(
        (busbw / DEFAULT_BUSBW_BYTES_PER_S - 1.0).abs() < 1e-9,
        "{busbw}"
    );
    // The line stays within 18% of every measured decode-size all-reduce (10 KiB…2.5 MiB):
    // −5.6% at M = 1, −6.4% at M = 256, and above the measured time by +15.9% / +17.5% at
    // M = 64 / 128 (640 KiB / 1.25 MiB), where NCCL's time is still nearly flat
    // (docs/multi-gpu.md quotes these).
    let m = AllReduceModel::recorded_default();
    let mut worst = 0.0f64;
    for p in world.points.iter().filter(|p| p.m.is_some()) {
        let r = m.time_s(p.bytes, 2) / p.timing.median_s - 1.0;
        assert!(r.abs() < 0.18, "{} B: model {:+.1}%", p.bytes, r * 100.0);
        worst = worst.max(r.abs());
    }
    assert!((worst - 0.175).abs() < 0.001, "worst {:.1}%", worst * 100.0);
}

/// The TP = 2 composite from the 1-GPU rows and the x2-fitted all-reduce model, set beside the
/// x2 report's own TP = 2 prediction (one-GPU composite / 2 + measured all-reduces) over the
/// same three shapes. The two rest on kernel rows of two runs a day apart (other code, other
/// card), so their TP = 1 composites differ; the test asserts the TP = 2 difference is that
/// difference halved plus at most 10% of the measured all-reduce time (the model's residuals
/// at the decode sizes are within 6.5% at M = 1 and 256).
#[test]
fn tp2_from_one_gpu_rows_matches_the_x2_prediction() {
    let (_, x2tp, step) = x2();
    let mut k = one_gpu();
    k.composite = compute_for(&k, &step);
    let pred = predict(&k, &model(&x2tp), &AllReduceModel::recorded_default(), &[2]).unwrap();
    let mut compared = 0;
    for xr in x2tp.rows.iter().filter(|r| r.tp == 2) {
        let imp = xr.label.split(' ').next().unwrap();
        let x1 = x2tp
            .rows
            .iter()
            .find(|r| r.label == xr.label && r.m == xr.m && r.tp == 1)
            .unwrap();
        let Some(p2) = pred
            .rows
            .iter()
            .find(|r| r.implementation == imp && r.m == xr.m && r.tp == 2)
        else {
            continue;
        };
        let p1 = pred
            .rows
            .iter()
            .find(|r| r.implementation == imp && r.m == xr.m && r.tp == 1)
            .unwrap();
        // The x2 report divided the activation quantization by 2 as well; do the same here.
        let same_method = p2.ideal_total_s - p2.act_quant_s + p2.act_quant_s / 2.0;
        let explained = (p1.total_s - x1.total_s).abs() / 2.0 + 0.10 * xr.allreduce_s;
        let diff = (same_method - xr.total_s).abs();
        assert!(
            diff <= explained,
            "{} M = {}: predicted {:.3} ms, x2 {:.3} ms, allowed {:.3} ms",
            xr.label,
            xr.m,
            same_method * 1e3,
            xr.total_s * 1e3,
            explained * 1e3
        );
        // The fitted-line estimate never beats the ideal split.
        assert!(p2.total_s >= p2.ideal_total_s * (1.0 - 1e-12));
        compared += 1;
    }
    assert!(
        compared >= 6,
        "bf16, fp8, w4a16 at M = 1 and 256: {compared}"
    );
}

/// The full suite: TP = 1 is the composite; GEMM time falls and all-reduce time rises with t;
/// every shape of the Qwen3.6 step has a split, and the fit covers them at every M measured.
#[test]
fn full_suite_invariants() {
    let (_, x2tp, _) = x2();
    let k = one_gpu();
    let comp = k.composite.clone().expect("a composite");
    assert!(comp.step.complete);
    let pred = predict(
        &k,
        &model(&x2tp),
        &AllReduceModel::recorded_default(),
        &[2, 4, 8],
    )
    .unwrap();
    assert!(pred.conditions.starts_with("predicted, not measured"));
    assert!(pred.conditions.contains(DEFAULT_SOURCE_FILE));
    for c in comp
        .rows
        .iter()
        .filter(|r| r.provider == "rigbench" && r.timing == pred.timing)
    {
        let rows: Vec<_> = pred
            .rows
            .iter()
            .filter(|r| r.implementation == c.implementation && r.m == c.m)
            .collect();
        assert_eq!(rows.iter().map(|r| r.tp).collect::<Vec<_>>(), [1, 2, 4, 8]);
        assert!(
            (rows[0].total_s / c.median_s - 1.0).abs() < 1e-9,
            "{} M = {}",
            c.implementation,
            c.m
        );
        assert_eq!(rows[0].allreduce_s, 0.0);
        for w in rows.windows(2) {
            assert!(w[1].gemm_s < w[0].gemm_s, "{} M={}", c.implementation, c.m);
            assert!(w[1].allreduce_s > w[0].allreduce_s);
            assert!(w[1].total_s >= w[1].ideal_total_s * (1.0 - 1e-12));
        }
        for r in &rows[1..] {
            assert!(r.shards.iter().all(|s| s.split.is_some()));
            assert!(
                r.shards.iter().all(|s| s.estimate == Estimate::Fit),
                "{}",
                r.estimate_summary()
            );
        }
    }
    let md = rigbench::multigpu::tp_model::markdown(&pred);
    assert!(md.contains("## Tensor-parallel composite (predicted, not measured)"));
    assert!(md.contains("Conditions: predicted, not measured"));
    assert!(md.contains("fitted line for all 8 shapes"));
    assert!(md.contains("What it leaves out"));
}
