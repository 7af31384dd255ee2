//! Statements `diagnose` must not make, and the cross-line conclusions it must draw, each on
//! the input that used to get it wrong (fixtures under `tests/fixtures/diagnose/` and
//! `tests/fixtures/real/`, see their READMEs for where each comes from).

use super::log::EngineLog;
use super::*;

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// A fixture's text; panics when absent (a test that returns early tests nothing).
fn read(rel: &str) -> String {
    let p = root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn diag(name: &str, text: &str, cc: Option<&str>) -> Diagnosis {
    let mut d = Diagnosis {
        logs: vec![LogInput {
            name: name.into(),
            log: EngineLog::parse(text),
        }],
        card: cc.map(|c| Card {
            cc: c.parse().unwrap(),
            source: "--cc".into(),
        }),
        ..Default::default()
    };
    d.findings = build_findings(&d);
    d
}

fn one<'a>(d: &'a Diagnosis, id: &str) -> &'a Finding {
    let v = d.findings_of(id);
    assert_eq!(v.len(), 1, "{id}: {:#?}", d.findings);
    v[0]
}

#[test]
fn the_card_named_by_cc_is_stated_not_called_unstated() {
    let log = "ERROR 07-01 10:00:00 [core.py:1] RuntimeError: FlashInfer TRTLLM MoE requires compute capability 10.0\n";
    let d = diag("e.log", log, Some("sm_89"));
    let f = d
        .findings
        .iter()
        .find(|f| f.id == "capability-too-low")
        .unwrap_or_else(|| panic!("{:#?}", d.findings));
    assert!(!f.detail.contains("not stated"), "{}", f.detail);
    assert!(f.detail.contains("sm_89 (8.9) (from --cc)"), "{}", f.detail);
    // Without a card: says what would tell.
    let d = diag("e.log", log, None);
    let f = &d.findings_of("capability-too-low")[0];
    assert!(f.detail.contains("give --cc or --rig"), "{}", f.detail);
}

#[test]
fn tensorrt_llm_0_8_kv_lines_give_the_capacity() {
    let d = diag(
        "trt08.log",
        &read("tests/fixtures/diagnose/trtllm-0.8_gptsession_kv-lines.log"),
        None,
    );
    let f = one(&d, "kv-capacity");
    assert!(f.title.contains("220,800 tokens"), "{}", f.title);
    assert!(
        f.detail
            .contains("(line 4: TensorRT-LLM's paged-KV tokens line (0.8 form))"),
        "{}",
        f.detail
    );
    assert!(
        f.detail.contains("(line 3)"),
        "the pool's bytes line: {}",
        f.detail
    );
    assert_eq!(d.logs[0].log.engine.as_deref(), Some("tensorrt-llm"));
    assert_eq!(d.logs[0].log.engine_version.as_deref(), Some("0.8.0"));
    assert_eq!(d.logs[0].log.boots[0].kv_pool_bytes, Some(21_705_523_200));
    let d = diag(
        "trt08-ifb.log",
        &read("tests/fixtures/diagnose/trtllm-0.8_inflight-batching_kv-lines.log"),
        None,
    );
    let f = one(&d, "kv-capacity");
    assert!(f.title.contains("219,776 tokens"), "{}", f.title);
    assert!(f.detail.contains("8 blocks per sequence"), "{}", f.detail);
}

#[test]
fn a_tensorrt_llm_log_without_a_read_line_is_named_as_tensorrt_llm() {
    let d = diag(
        "trt.log",
        &read("tests/fixtures/diagnose/trtllm_header-lines-only.log"),
        None,
    );
    let f = one(&d, "nothing-recognised");
    assert!(
        f.detail
            .contains("3 of the 3 lines carry TensorRT-LLM's header"),
        "{}",
        f.detail
    );
    assert!(!f.detail.contains("no line in a form"), "{}", f.detail);
}

#[test]
fn llamacpp_draft_mtp_statistics_give_k_per_position_and_mean_length() {
    let d = diag(
        "mtp.log",
        &read("tests/fixtures/diagnose/llamacpp_spec-draft-mtp_per-position_two-requests.log"),
        None,
    );
    let f = one(&d, "spec-decoding");
    // Σaccepted / Σdrafted over the two per-request lines: (374 + 243) / (564 + 392).
    assert!(f.title.contains("64.54%"), "{}", f.title);
    assert!(f.title.contains("k = 4"), "{}", f.title);
    // Drafts per request = accepted / (mean length − 1): 141 and 98, so 1 + 617 / 239.
    assert!(
        f.detail.contains("mean acceptance length 3.58"),
        "{}",
        f.detail
    );
    assert!(
        f.detail.contains("per-position acceptance (0.787"),
        "{}",
        f.detail
    );
    assert!(f.detail.contains("617 of 956"), "{}", f.detail);
}

#[test]
fn scrapes_say_what_they_cannot_tell() {
    let bytes = std::fs::read(root().join(
        "tests/fixtures/real/engines/llama.cpp-0c1e57098/02_llama-server-0c1e57098_metrics_after-closed-loop.prom",
    ))
    .unwrap();
    let mut d = Diagnosis {
        metrics: vec![parse_metrics("llama.prom", &bytes)],
        ..Default::default()
    };
    d.findings = build_findings(&d);
    let f = one(&d, "metrics-unknown");
    assert!(f.title.contains("KV capacity"), "{}", f.title);
    assert!(f.detail.contains("/slots"), "{}", f.detail);
}

#[test]
fn every_padding_line_is_named_worst_first() {
    let log = "INFO 08-01 10:00:00 [kv_cache_utils.py:1] Add 2 padding layers, may waste at most 5.00% KV cache memory\nINFO 08-01 10:00:01 [kv_cache_utils.py:1] Add 17 padding layers, may waste at most 89.47% KV cache memory\n";
    let d = diag("p.log", log, None);
    let f = one(&d, "kv-padding-waste");
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        f.title.contains("89.47%") && f.title.contains("worst of 2"),
        "{}",
        f.title
    );
    let worst = f.detail.find("89.47%").unwrap();
    let other = f.detail.find("5.00%").unwrap();
    assert!(worst < other, "{}", f.detail);
    assert!(
        f.detail.contains("(line 1)") && f.detail.contains("(line 2)"),
        "{}",
        f.detail
    );
}

#[test]
fn two_boots_keep_their_own_acceptance() {
    let log = "INFO 08-01 10:00:00 [api_server.py:1] vLLM API server version 0.10.0\n\
INFO 08-01 10:00:05 [metrics.py:1] SpecDecoding metrics: Draft acceptance rate: 50.0%, Accepted: 50 tokens, Drafted: 100 tokens\n\
INFO 08-01 11:00:00 [api_server.py:1] vLLM API server version 0.11.0\n\
INFO 08-01 11:00:05 [metrics.py:1] SpecDecoding metrics: Draft acceptance rate: 2.0%, Accepted: 2 tokens, Drafted: 100 tokens\n";
    let d = diag("two.log", log, None);
    let all: Vec<&Finding> = d
        .findings
        .iter()
        .filter(|f| f.id.starts_with("spec-"))
        .collect();
    assert_eq!(all.len(), 2, "{all:#?}");
    assert!(all.iter().any(|f| f.title.contains("50.00%")), "{all:#?}");
    assert!(all.iter().any(|f| f.title.contains("2.00%")), "{all:#?}");
    assert!(
        !all.iter().any(|f| f.title.contains("26.00%")),
        "pooled across runs: {all:#?}"
    );
}

#[test]
fn marlin_chosen_over_native_candidates_is_not_the_cards_fault() {
    let log = "(EngineCore pid=274) WARNING 06-12 08:49:29 [marlin_utils_fp4.py:1] Your GPU does not have native support for FP4 computation but FP4 quantization is being used. Weight-only FP4 compression will be used leveraging the Marlin kernel. This may degrade performance for compute-heavy workloads.\n(EngineCore pid=274) INFO 06-12 08:49:30 [nvfp4.py:222] Using 'MARLIN' NvFp4 MoE backend out of potential backends: ['FLASHINFER_CUTLASS', 'VLLM_CUTLASS', 'MARLIN']\n";
    let d = diag("m.log", log, Some("sm_120"));
    let f = one(&d, "native-candidates-passed-over");
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        f.title.contains("FLASHINFER_CUTLASS, VLLM_CUTLASS"),
        "{}",
        f.title
    );
    assert!(
        f.detail.contains("is then wrong about the card"),
        "{}",
        f.detail
    );
    // Below sm_100 the same line is expected.
    let d = diag("m.log", log, Some("sm_89"));
    assert_eq!(
        one(&d, "native-candidates-passed-over").severity,
        Severity::Info
    );
}

#[test]
fn a_blocks_override_below_the_profiled_pool_is_the_binding_limit() {
    let log = "INFO 08-01 10:00:00 [api_server.py:1] vLLM API server version 0.24.0\n\
INFO 08-01 10:00:04 [gpu_worker.py:1] Available KV cache memory: 20.12 GiB\n\
INFO 08-01 10:00:04 [kv_cache_utils.py:829] Overriding num_gpu_blocks=13185 with num_gpu_blocks_override=43\n\
INFO 08-01 10:00:04 [kv_cache_utils.py:1] GPU KV cache size: 688 tokens\n";
    let d = diag("o.log", log, None);
    let f = one(&d, "kv-pool-capped");
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        f.title.contains("43 blocks, 13,185 profiled"),
        "{}",
        f.title
    );
    assert!(f.detail.contains("binding limit"), "{}", f.detail);
}

#[test]
fn a_log_that_stops_mid_load_says_where() {
    let log = "INFO 08-01 10:00:00 [api_server.py:1] vLLM API server version 0.24.0\n\
INFO 08-01 10:00:02 [gpu_model_runner.py:1] Starting to load model nvidia/X...\n\
Loading safetensors checkpoint shards:  40% Completed | 2/5 [00:10<00:15,  5.00s/it]\n";
    let d = diag("l.log", log, None);
    let f = one(&d, "startup-state-unknown");
    assert!(
        f.title
            .contains("stops mid-load, loading the weights, shard 2 of 5 (line 3)"),
        "{}",
        f.title
    );
}

#[test]
fn no_attention_backend_says_whether_a_flag_can_fix_it() {
    let log = "(EngineCore pid=1) ERROR 08-01 10:00:00 [core.py:1] ValueError: No valid attention backend found for cuda with AttentionSelectorConfig(head_size=576, dtype=torch.bfloat16, kv_cache_dtype=auto, block_size=None, use_mla=True, has_sink=False, use_sparse=True). Reasons: {FLASHMLA_SPARSE: [compute capability not supported], TRITON_MLA: [sparse not supported], FLASHINFER_MLA: [sparse not supported, compute capability not supported]}\n";
    let d = diag("a.log", log, Some("sm_120"));
    let f = one(&d, "no-attention-backend");
    assert_eq!(f.severity, Severity::Error);
    assert!(f.detail.contains("no engine flag fixes it"), "{}", f.detail);
    assert!(f.detail.contains("use_sparse=True"), "{}", f.detail);
    let fixable = log.replace(
        "TRITON_MLA: [sparse not supported]",
        "TRITON_MLA: [kv_cache_dtype not supported]",
    );
    let d = diag("a.log", &fixable, Some("sm_120"));
    let f = one(&d, "no-attention-backend");
    assert!(
        f.detail.contains("TRITON_MLA (change --kv-cache-dtype)"),
        "{}",
        f.detail
    );
}

#[test]
fn nvidia_smi_q_gives_the_conditions_with_their_lines() {
    let text = read("tests/fixtures/diagnose/nvidia-smi-q_driver-550.127.05_a40.txt");
    let r = nvidia_smi::parse("smi.txt", &text);
    assert_eq!(r.gpus.len(), 1);
    let g = &r.gpus[0];
    assert_eq!(g.bus_id, "00000000:4F:00.0");
    assert_eq!(g.max_sm_clock_mhz.as_ref().map(|x| x.0), Some(1740.0));
    assert_eq!(g.power_limit_w.as_ref().map(|x| x.0), Some(300.0));
    assert_eq!(g.active_reasons.len(), 1);
    assert_eq!(g.active_reasons[0].0, "SW Power Cap");
    assert_eq!(
        text.lines().nth(g.active_reasons[0].1 - 1).map(str::trim),
        Some("SW Power Cap                      : Active")
    );
    let mut d = Diagnosis {
        nvidia_smi: vec![r],
        timing: Some("the report results.json (created 2024-11-14T15:10:00Z)".into()),
        ..Default::default()
    };
    d.findings = build_findings(&d);
    let c = one(&d, "gpu-conditions");
    assert!(c.detail.contains("SM clock 0 MHz"), "{}", c.detail);
    assert!(c.detail.contains("of max 1740 MHz"), "{}", c.detail);
    assert!(
        c.detail.contains("only if it was taken during that run"),
        "{}",
        c.detail
    );
    // Idle (P8) with the software power cap and an unlowered limit: info, with why.
    let e = one(&d, "gpu-clock-events");
    assert_eq!(e.severity, Severity::Info);
    assert!(e.detail.contains("idle at the snapshot"), "{}", e.detail);
    assert!(d.findings_of("gpu-power-cap-lowered").is_empty());
    // 10 aggregate DRAM correctable errors: info, named with the line.
    let ecc = one(&d, "gpu-ecc-errors");
    assert_eq!(ecc.severity, Severity::Info);
    assert!(
        ecc.detail.contains("Aggregate DRAM Correctable 10"),
        "{}",
        ecc.detail
    );
    // The same card with its limit lowered: the cap is a warning.
    let lowered = text.replace(
        "Current Power Limit               : 300.00 W",
        "Current Power Limit               : 250.00 W",
    );
    let mut d = Diagnosis {
        nvidia_smi: vec![nvidia_smi::parse("smi.txt", &lowered)],
        ..Default::default()
    };
    d.findings = build_findings(&d);
    assert_eq!(one(&d, "gpu-power-cap-lowered").severity, Severity::Warning);
    assert_eq!(one(&d, "gpu-clock-events").severity, Severity::Warning);
}
