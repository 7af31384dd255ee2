//! The prediction of what an engine runs (`checkpoint::predict`) joined with real engine logs
//! (`tests/fixtures/real/logs/`): the attention backend, Gated-DeltaNet kernel and KV dtype a
//! log names against the prediction for its checkpoint, card and engine version.

use super::log::EngineLog;
use super::*;

/// A real log of `logs/` whose name starts with `prefix`: (name, bytes).
fn real_log(prefix: &str) -> (String, Vec<u8>) {
    let dir = crate::real_fixture("logs");
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(prefix) {
            return (name, std::fs::read(e.path()).unwrap());
        }
    }
    panic!("no fixture logs/{prefix}* in {}", dir.display());
}

/// The diagnosis of one real log with a card, an `--engine` and, when given, a real config
/// pair of `configs/` (copied into a temporary checkpoint folder).
fn joined(
    prefix: &str,
    cc: &str,
    engine: Option<&str>,
    config: Option<&str>,
) -> (String, Diagnosis) {
    let (name, bytes) = real_log(prefix);
    let card = Card {
        cc: cc.parse().unwrap(),
        source: "--cc".into(),
    };
    let ck = config.map(|stem| {
        let src = crate::real_fixture("configs");
        let dir = tempfile::tempdir().unwrap();
        for f in ["config.json", "hf_quant_config.json"] {
            let p = src.join(format!("{stem}__{f}"));
            if p.exists() {
                std::fs::copy(&p, dir.path().join(f)).unwrap();
            }
        }
        checkpoint_facts(dir.path(), Some(card.cc)).unwrap()
    });
    let mut d = Diagnosis {
        logs: vec![LogInput {
            name: name.clone(),
            log: EngineLog::parse_bytes(&bytes),
        }],
        checkpoint: ck,
        card: Some(card),
        engine: engine.map(|e| e.parse().unwrap()),
        ..Default::default()
    };
    d.findings = build_findings(&d);
    (name, d)
}

fn one<'a>(d: &'a Diagnosis, id: &str) -> &'a Finding {
    let v = d.findings_of(id);
    assert_eq!(v.len(), 1, "{id}: {:#?}", d.findings);
    v[0]
}

/// The real vLLM 0.24 log (RTX 5090, sm_120; its excerpt has no version line, the issue states
/// v0.24.0, hence `--engine`) with its checkpoint, the real nvidia/Qwen3.6-35B-A3B-NVFP4
/// configs: the log's `kv_cache_dtype: 'fp8'` (non-default args, line 10) agrees with the FP8 KV
/// the checkpoint declares and the prediction; the log names no attention backend and no
/// Gated-DeltaNet kernel, and the join says so instead of agreeing.
#[test]
fn real_vllm_log_joins_its_kv_dtype_with_the_prediction() {
    let (name, d) = joined(
        "03_vllm-v0.24",
        "sm_120",
        Some("vllm==0.24"),
        Some("nvidia--Qwen3.6-35B-A3B-NVFP4"),
    );
    assert_eq!(d.logs[0].log.engine.as_deref(), Some("vllm"));
    assert_eq!(d.logs[0].log.engine_version, None);
    assert_eq!(d.logs[0].log.kv_cache_dtype.as_deref(), Some("fp8"));
    assert_eq!(d.logs[0].log.kv_cache_dtype_line, Some(10));
    let f = one(&d, "prediction-joined");
    assert!(f.title.contains("vLLM 0.24.0 on sm_120"), "{}", f.title);
    assert!(
        f.detail
            .contains("KV cache: 'fp8' at line 10 (FP8, as predicted)"),
        "{}",
        f.detail
    );
    assert!(
        f.detail
            .contains("does not state the attention backend, the Gated-DeltaNet prefill kernel"),
        "{}",
        f.detail
    );
    assert_eq!(f.source, format!("{name} lines 10"));
    assert!(d.findings_of("kernel-differs-from-prediction").is_empty());
}

/// The real SGLang 0.5.9 log (its docs CI; the log has no version line, so `--engine`): the
/// default attention backend it states (`Use fa3 backend by default`, line 5) is the one the
/// 0.5.9 rule gives on sm_90, and `kv_cache_dtype='auto'` leaves the dtype unstated. On a card
/// the rule sends to another backend (sm_100: TRT-LLM MHA from 0.5.7; sm_90 before 0.5.8 for an
/// architecture outside is_fa3_default_architecture is allowed FlashInfer too) the join reports
/// the difference with the rule's source, so the agreement above is not vacuous.
#[test]
fn real_sglang_log_joins_its_attention_backend_with_the_prediction() {
    let (name, d) = joined("19_sglang-0.5.9", "sm_90", Some("sglang==0.5.9"), None);
    let log = &d.logs[0].log;
    assert_eq!(log.engine.as_deref(), Some("sglang"));
    assert_eq!(log.engine_version, None);
    let attn: Vec<_> = log
        .kernel_choices
        .iter()
        .filter(|c| c.what == "attention")
        .collect();
    assert_eq!(attn.len(), 1, "{attn:?}");
    assert_eq!((attn[0].kernel.as_str(), attn[0].line), ("fa3", 5));
    assert_eq!(log.kv_cache_dtype.as_deref(), Some("auto"));
    let f = one(&d, "prediction-joined");
    assert!(
        f.detail
            .contains("attention: fa3 at line 5 (FlashAttention, as predicted)"),
        "{}",
        f.detail
    );
    assert!(
        f.detail
            .contains("kv_cache_dtype 'auto' at line 7 leaves the dtype to the engine"),
        "{}",
        f.detail
    );
    assert!(f.detail.contains("without --checkpoint"), "{}", f.detail);
    assert_eq!(f.source, format!("{name} lines 5, 7"));
    assert!(d.findings_of("kernel-differs-from-prediction").is_empty());

    // The same log said to come from a B200 (sm_100): SGLang 0.5.9 defaults to trtllm_mha there.
    let (_, d) = joined("19_sglang-0.5.9", "sm_100", Some("sglang==0.5.9"), None);
    let f = one(&d, "kernel-differs-from-prediction");
    assert!(
        f.title
            .contains("predicted TRT-LLM MHA (trtllm_mha) for attention on sm_100")
            && f.title.ends_with("the log shows fa3"),
        "{}",
        f.title
    );
    assert!(
        f.detail.contains("_handle_attention_backend_compatibility")
            && f.detail.contains("--attention-backend"),
        "{}",
        f.detail
    );
    // Without a version (no --engine), nothing is predicted or joined.
    let (_, d) = joined("19_sglang-0.5.9", "sm_90", None, None);
    assert!(d.findings_of("prediction-joined").is_empty());
    // A version for another engine than the log's is not used.
    let (_, d) = joined("19_sglang-0.5.9", "sm_90", Some("vllm==0.34"), None);
    assert!(d.findings_of("prediction-joined").is_empty());
}

/// Every attention line gets its own verdict (issue 41, "one finding per line of a kind"): two
/// boots of vLLM 0.34 on sm_90 (lines in the forms of the real logs quoted in
/// `docs/diagnose.md`): the first names FLASH_ATTN, the family predicted, but FlashAttention 2
/// where sm_90 gets 3; the second names FLASHINFER with FLASH_ATTN absent from its candidates.
/// Each difference is its own finding with its line; the agreement is listed with its line.
#[test]
fn every_attention_line_is_joined_not_only_the_first() {
    let text = "\
(EngineCore pid=10) INFO 11-02 10:00:00 [core.py:129] Initializing a V1 LLM engine (v0.34.0) with config: model='m', speculative_config=None, kv_cache_dtype=auto, device_config=cuda
(EngineCore pid=10) INFO 11-02 10:00:05 [cuda.py:482] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION'].
(EngineCore pid=10) INFO 11-02 10:00:05 [flash_attn.py:776] Using FlashAttention version 2
(EngineCore pid=20) INFO 11-02 10:05:00 [core.py:129] Initializing a V1 LLM engine (v0.34.0) with config: model='m', speculative_config=None, kv_cache_dtype=auto, device_config=cuda
(EngineCore pid=20) INFO 11-02 10:05:05 [cuda.py:482] Using FLASHINFER attention backend out of potential backends: ['FLASHINFER', 'TRITON_ATTN'].
";
    let mut d = Diagnosis {
        logs: vec![LogInput {
            name: "two-boots.log".into(),
            log: EngineLog::parse(text),
        }],
        card: Some(Card {
            cc: "sm_90".parse().unwrap(),
            source: "--cc".into(),
        }),
        ..Default::default()
    };
    d.findings = build_findings(&d);
    let differ = d.findings_of("kernel-differs-from-prediction");
    let at = |src: &str| {
        *differ
            .iter()
            .find(|f| f.source == src)
            .unwrap_or_else(|| panic!("no finding at {src}: {differ:#?}"))
    };
    assert_eq!(differ.len(), 2, "{differ:#?}");
    let fa2 = at("two-boots.log:3");
    assert!(
        fa2.title
            .contains("predicted FlashAttention 3 for attention on sm_90")
            && fa2.title.ends_with("the log shows FlashAttention 2"),
        "{}",
        fa2.title
    );
    let fi = at("two-boots.log:5");
    assert!(
        fi.detail
            .contains("FLASHINFER, TRITON_ATTN; FLASHINFER is first"),
        "{}",
        fi.detail
    );
    let joined = d.findings_of("prediction-joined");
    assert_eq!(joined.len(), 1);
    assert!(
        joined[0]
            .detail
            .contains("attention: FLASH_ATTN at line 2 (FlashAttention, as predicted)"),
        "{}",
        joined[0].detail
    );
}
