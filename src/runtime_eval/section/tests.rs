//! Tests of the runtime section: its e2e engine options, goals and rendering.
use super::*;

#[test]
fn the_e2e_engine_context_is_sized_to_the_suite() {
    // The report's default suite: 64-token prompts, 32 output tokens.
    let tiny = crate::e2e::workload::Suite::load("tiny").unwrap();
    assert_eq!(tiny.workload.max_request_tokens(), Some(96));
    assert_eq!(e2e_context_len(&tiny.workload), Some(1024));
    let mut w = tiny.workload.clone();
    w.input_tokens = Some(4096);
    w.output_tokens = 512;
    assert_eq!(e2e_context_len(&w), Some(5120));
    // At most the model's maximum, which serve would refuse to exceed.
    assert_eq!(capped_context_len(&w, 262_144), 5120);
    assert_eq!(capped_context_len(&w, 4096), 4096);
    w.kind = crate::e2e::workload::WorkloadKind::Prompts;
    assert_eq!(e2e_context_len(&w), None);
    assert_eq!(capped_context_len(&w, 32_768), 32_768);
}

#[test]
fn renders_targets_and_fidelity_from_figures() {
    let s = tiny_section();
    // Table columns are padded to their widths: compare with runs of spaces collapsed.
    let md = collapsed(&s);
    assert!(md.contains("W4A16 batch-1 ≥ 2.5× BF16"), "{md}");
    // No decode-by-context rows in this run: those goals say so, with the reason.
    assert!(
        md.contains("| bf16 batch-1 decode at a 128-token context ≥ 80% of the bound | not measured: no 128-token decode row"),
        "{md}"
    );
    assert!(md.contains("| decode attention at a 32,768 context, batch 1, ≤ 1.5× KV bytes ÷ copy rate | not measured:"), "{md}");
    // This run batched 2 sequences at 8-token contexts, not 32 at 1k.
    assert!(
        md.contains("not measured: this run batched 2 sequences at 8-token contexts"),
        "{md}"
    );
    // With rows: the goals are evaluated from them at the run's copy bandwidth (1 GB/s).
    let mut s = s;
    s.formats[0].decode_contexts = context_rows();
    let md = collapsed(&s);
    // 0.1 tok/s × 8.5 s = 85%: met against 80%.
    assert!(
        md.contains(
            "| bf16 batch-1 decode at a 128-token context ≥ 80% of the bound | 85.0% | met |"
        ),
        "{md}"
    );
    // Attention 2 s against 1 GB ÷ 1 GB/s: 2.00×, not met.
    assert!(
        md.contains("| decode attention at a 4,096 context, batch 1, ≤ 1.5× KV bytes ÷ copy rate (bf16 weights) | 2.00× | NOT met |"),
        "{md}"
    );
    assert!(md.contains("#### Batch-1 decode by context, bf16"), "{md}");
    assert!(!md.contains("MoE:"), "a dense model has no MoE goals: {md}");
    // A mixture of experts (a batch-N step that routed) gets its own goals beside these.
    let moe = with_moe(&s);
    let md = collapsed(&moe);
    // The same 85% row, against the MoE's 50%.
    assert!(
        md.contains("| MoE: bf16 batch-1 decode at a 128-token context ≥ 50% of the bound (the routed experts' bytes) | 85.0% | met |"),
        "{md}"
    );
    let (w, b) = (
        moe.formats
            .iter()
            .find(|f| f.format == "nvfp4")
            .and_then(|f| f.bench.as_ref())
            .expect("nvfp4"),
        moe.formats
            .iter()
            .find(|f| f.format == "bf16")
            .and_then(|f| f.bench.as_ref())
            .expect("bf16"),
    );
    let r = w.batch1.tok_per_s / b.batch1.tok_per_s;
    assert!(
        md.contains(&format!(
            "| MoE: W4A16 batch-1 ≥ 1.5× BF16 | {r:.2}× | {} |",
            if r >= 1.5 { "met" } else { "NOT met" }
        )),
        "{md}"
    );
    assert!(
        md.contains("of bound") && md.contains("backend cpu"),
        "{md}"
    );
    assert!(md.contains("the parity check did not run"));
    // The CPU backend records no kernel sources or load notes: nothing is said of them.
    assert!(
        !md.contains("Kernel sources built") && !md.contains("Load notes"),
        "{md}"
    );
    // A GPU run's: the sources once (shortened), the notes per format.
    let b = s.formats[1].bench.as_mut().expect("fp8 bench");
    b.kernel_sources
        .insert("kernels/fp8_quant.cu".into(), "0123456789abcdef".repeat(4));
    b.backend_notes = vec!["FP8 scaling path by measurement: 4096×4096: M=1 fp32+scale".into()];
    let md = render_markdown(&s);
    assert!(
        md.contains("Kernel sources built (SHA-256): `kernels/fp8_quant.cu` 0123456789ab."),
        "{md}"
    );
    assert!(
        md.contains(
            "Load notes, fp8:\n\n- FP8 scaling path by measurement: 4096×4096: M=1 fp32+scale\n"
        ),
        "{md}"
    );
    // Old results (without the fields) still parse, and empty fields are not written.
    let mut j = serde_json::to_value(&s).expect("json");
    let f0 = &mut j["formats"][0]["bench"];
    assert!(f0.get("kernel_sources").is_none() && f0.get("backend_notes").is_none());
    assert!(j["formats"][1]["bench"].get("kernel_sources").is_some());
    j["formats"][1]["bench"]
        .as_object_mut()
        .expect("object")
        .retain(|k, _| k != "kernel_sources" && k != "backend_notes");
    let back: RuntimeSection = serde_json::from_value(j).expect("parse");
    assert!(back.formats[1]
        .bench
        .as_ref()
        .expect("bench")
        .kernel_sources
        .is_empty());
}

/// A runtime section of the CPU backend's runs of every report format on the tiny
/// synthetic model, with a 1 GB/s copy roofline and a BF16 peak of 1 TFLOP/s.
fn tiny_section() -> RuntimeSection {
    let w = crate::runtime::weights::synthesize(&ModelConfig::tiny(), 0);
    let spec = RuntimeBenchSpec {
        batch1_prompt: 4,
        batch1_tokens: 3,
        batch: 2,
        batch_context: 8,
        batch_tokens: 3,
        prefill_tokens: 16,
        block_size: 16,
    };
    let mut benches = Vec::new();
    for fmt in REPORT_FORMATS {
        let mut q = w.clone();
        q.quantize(fmt).unwrap();
        let (mut b, _) = super::super::bench::run(
            Box::new(CpuBackend::new(q, 1)),
            spec,
            KvCacheDtype::Bf16,
            "synthetic:tiny seed 0",
        )
        .unwrap();
        b.attach_roofline(Some(1e9), Some((1.0, "bf16 row".into())));
        benches.push(b);
    }
    RuntimeSection {
        model: "synthetic:tiny".into(),
        device: "cuda:0".into(),
        formats: benches
            .into_iter()
            .map(|b| FormatRun {
                format: b.weight_format.clone(),
                e2e: None,
                bench: Some(b),
                error: None,
                decode_contexts: Vec::new(),
                decode_attention: None,
            })
            .collect(),
        ..Default::default()
    }
}

/// The section's markdown with runs of spaces collapsed (table columns are padded).
fn collapsed(s: &RuntimeSection) -> String {
    render_markdown(s)
        .split(' ')
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Decode-by-context rows at 128 and 4,096 tokens, the second with an attention time.
fn context_rows() -> Vec<super::super::decode_profile::ContextDecode> {
    vec![
        super::super::decode_profile::ContextDecode {
            context: 128,
            tok_per_s: 0.1,
            weight_bytes: 8_000_000_000,
            kv_bytes: 500_000_000,
            state_bytes: 0,
            ops: Vec::new(),
        },
        super::super::decode_profile::ContextDecode {
            context: 4096,
            tok_per_s: 0.1,
            weight_bytes: 8_000_000_000,
            kv_bytes: 1_000_000_000,
            state_bytes: 0,
            ops: vec![super::super::decode_profile::OpTime {
                op: "attention".into(),
                calls: 2,
                seconds: 2.0,
                bytes: Some(1_000_000_000),
            }],
        },
    ]
}

/// `s` as a mixture of experts: every bench's batch-N step routed.
fn with_moe(s: &RuntimeSection) -> RuntimeSection {
    let mut moe = s.clone();
    for f in &mut moe.formats {
        if let Some(b) = f.bench.as_mut() {
            b.moe_batched = Some(super::super::bench::MoeBatchedStep {
                touched_per_layer: vec![8, 6],
                experts: 256,
                top_k: 8,
                step_bytes: crate::runtime::memory::DecodeBytes {
                    weights: 1_000_000,
                    kv: 0,
                    state: 0,
                },
            });
        }
    }
    moe
}
