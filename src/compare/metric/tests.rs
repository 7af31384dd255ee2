//! Tests of the metric list: ids, kinds and duplicates, the parts' metrics, and the reasons
//! for missing ones.

use super::e2e::label_point_id;
use super::*;
use crate::checkpoint::InspectReport;
use crate::e2e::workload::ArrivalKind;
use crate::e2e::E2eResults;
use crate::formats::GemmFormat;
use crate::kernels::schema::{KernelCase, NamedTiming, SkippedCase, Timing};
use crate::kernels::KernelResults;
use crate::report::Skip;
use crate::rig::RigFacts;

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
    r.rig.capabilities = crate::rig::capability::table(crate::gpu::ComputeCapability::new(12, 0));
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
    assert!(ids.contains(&"kernels/reference_accuracy/w4a16/16×256×2048/outliers/rel_l2_vs_exact"));
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
