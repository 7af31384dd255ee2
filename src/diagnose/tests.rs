//! `diagnose` on every real-world fixture (`tests/fixtures/real/`), with the right values its
//! README lists, plus the same faults in other prefixes, engines and numbers.

use std::collections::BTreeSet;

use super::cause::Cause;
use super::log::{BootStatus, EngineLog};
use super::spec::SpecLogGeneration;
use super::*;

fn fixtures() -> std::path::PathBuf {
    crate::real_fixture("")
}

/// The fixture of `kind` (logs, metrics, sse) whose name starts with `prefix`; panics when
/// absent (a test that silently returns has tested nothing).
fn fixture(kind: &str, prefix: &str) -> (String, String) {
    let dir = fixtures().join(kind);
    let rd = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(prefix) {
            let text = std::fs::read_to_string(e.path()).expect("fixture is UTF-8 text");
            return (name, text);
        }
    }
    panic!("no fixture {kind}/{prefix}* in {}", dir.display());
}

fn log(prefix: &str) -> EngineLog {
    EngineLog::parse(&fixture("logs", prefix).1)
}

fn diag_log(prefix: &str) -> Diagnosis {
    let (name, text) = fixture("logs", prefix);
    let mut d = Diagnosis {
        logs: vec![LogInput {
            name,
            log: EngineLog::parse(&text),
        }],
        ..Default::default()
    };
    d.findings = build_findings(&d);
    d
}

fn ids(d: &Diagnosis, sev: Severity) -> Vec<String> {
    d.findings
        .iter()
        .filter(|f| f.severity == sev)
        .map(|f| f.id.clone())
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn log01_v0_two_boots_implied_block_size_and_maxlen_error() {
    let l = log("01_");
    assert_eq!(l.boots.len(), 2, "{:#?}", l.boots);
    let (b1, b2) = (&l.boots[0], &l.boots[1]);
    assert_eq!((b1.gpu_blocks, b1.cpu_blocks), (Some(1952), Some(2048)));
    assert_eq!(b1.max_concurrency, Some((20000, 1.56)));
    assert_eq!(
        b1.available_kv_memory_bytes,
        Some((3.81 * 1073741824.0f64).round() as u64)
    );
    // V0 prints no block size; 1.56 × 20,000 / 1,952 = 15.98 → 16.
    assert_eq!(b1.block_size, Some(16));
    assert_eq!(b1.capacity_tokens(), Some(31_232));
    assert_eq!(b1.status, Some(BootStatus::Ready));
    assert_eq!(
        (b2.gpu_blocks, b2.max_concurrency),
        (Some(1478), Some((29000, 0.82)))
    );
    assert_eq!(b2.line, 9);
    assert_eq!(b2.status, Some(BootStatus::Failed));
    assert_eq!(l.errors.len(), 1);
    assert_eq!(l.errors[0].line, 13);
    assert_eq!(l.errors[0].boot, Some(2));
    assert_eq!(
        l.errors[0].cause,
        Some(Cause::KvTooSmallForMaxLen {
            max_model_len: 29000,
            kv_cache_tokens: Some(23648),
            needed_gib: None,
            available_gib: None,
            estimated_max_model_len: None,
        })
    );
    // The error's KV figure agrees with the boot's blocks × the implied block size.
    assert_eq!(b2.capacity_tokens(), Some(23_648));
    let d = diag_log("01_");
    assert_eq!(ids(&d, Severity::Error), vec!["kv-too-small-for-max-len"]);
}

#[test]
fn log02_v1_kv_size_with_separators() {
    let l = log("02_");
    assert_eq!(l.boots.len(), 1, "{:#?}", l.boots);
    let b = &l.boots[0];
    assert_eq!(b.kv_cache_tokens, Some(652_144));
    assert_eq!(b.kv_cache_tokens_line, Some(7));
    assert_eq!(b.max_concurrency, Some((4096, 159.21)));
    assert_eq!(
        b.available_kv_memory_bytes,
        Some((69.66 * 1073741824.0f64).round() as u64)
    );
    assert!(b.kv_check.as_ref().unwrap().consistent);
    assert_eq!(l.kv_capacity().map(|x| x.0), Some(652_144));
    assert!(l.errors.is_empty(), "{:?}", l.errors);
    let d = diag_log("02_");
    assert!(!d.has_errors());
    assert_eq!(d.findings_of("kv-capacity").len(), 1);
}

#[test]
fn log03_nvfp4_args_once_and_warnings_not_errors() {
    let l = log("03_");
    assert_eq!(l.kv_capacity().map(|x| x.0), Some(567_978));
    assert_eq!(l.boots[0].max_concurrency, Some((131_072, 4.33)));
    assert_eq!(l.quantization.as_deref(), Some("modelopt"));
    assert_eq!(l.kv_cache_dtype.as_deref(), Some("fp8"));
    assert!(l
        .non_default_args
        .as_deref()
        .unwrap()
        .contains("'enable_prefix_caching': True"));
    assert!(l.errors.is_empty(), "{:?}", l.errors);
    assert!(l.kv_scale_warnings.is_empty());
    assert!(l.marlin_fp4_fallback.is_none());
    assert_eq!(l.boots.len(), 1, "the args line repeated is not a new boot");
    assert!(!diag_log("03_").has_errors());
}

#[test]
fn log06_marlin_fallback_one_finding_two_ranks() {
    let l = log("06_");
    let m = l.marlin_fp4_fallback.clone().expect("finding");
    assert_eq!(m.ranks, BTreeSet::from([0, 1]));
    assert_eq!(m.occurrences, 3);
    assert_eq!(m.line, 7);
    assert_eq!(
        m.call_sites,
        BTreeSet::from([
            "marlin_utils_fp4.py:257".to_string(),
            "nvfp4_utils.py:144".to_string()
        ])
    );
    assert!(l.errors.is_empty());
    let d = diag_log("06_");
    let f = d.findings_of("marlin-fp4-fallback");
    assert_eq!(f.len(), 1);
    assert!(f[0].detail.contains("--checkpoint"), "{}", f[0].detail);
}

#[test]
fn log08_pooled_acceptance_is_ratio_of_sums() {
    let l = log("08_");
    assert_eq!(l.spec_lines.len(), 2);
    assert!(l
        .spec_lines
        .iter()
        .all(|s| s.generation == SpecLogGeneration::V1));
    let p = l.spec_pooled().unwrap();
    assert_eq!((p.accepted, p.drafted, p.k), (692, 1384, Some(4)));
    assert!(close(p.acceptance_rate.unwrap(), 0.5));
    // Not the mean of the per-interval rates (0.560 and 0.410 average to 0.485).
    assert!((p.acceptance_rate.unwrap() - 0.485).abs() > 0.01);
    // drafts = 828/4 + 556/4 = 346 → 1 + 692/346 = 3.0
    assert!(close(p.mean_acceptance_length.unwrap(), 3.0));
    assert!(close(
        p.per_position[0],
        (0.763 * 207.0 + 0.669 * 139.0) / 346.0
    ));
    assert_eq!(l.engine.as_deref(), Some("vllm"));
    let d = diag_log("08_");
    assert!(!d.has_errors());
    let s = d.findings_of("spec-decoding");
    assert!(
        s[0].title.contains("50.00%") && s[0].title.contains("k = 4"),
        "{}",
        s[0].title
    );
}

#[test]
fn log10_four_generations_and_v0_cumulative() {
    let l = log("10_");
    use SpecLogGeneration::*;
    let gens: Vec<_> = l.spec_lines.iter().map(|s| s.generation).collect();
    assert_eq!(
        gens,
        vec![
            V0Cumulative,
            V0Cumulative,
            V0Cumulative,
            V1EarlySpeculative,
            V1Early,
            V1
        ]
    );
    assert_eq!(l.spec_lines[0].k, Some(3));
    assert_eq!(l.spec_lines[0].accepted, Some(8547));
    assert_eq!(l.spec_lines[4].acceptance_rate, Some(1.0));
    assert_eq!(l.spec_lines[4].mean_acceptance_length, None);
    assert_eq!(l.spec_lines[5].per_position.len(), 5);
    assert!(close(l.spec_lines[5].acceptance_rate.unwrap(), 0.888));
    let b = spec::pool_spec(&l.spec_lines[1..3], None).unwrap();
    assert_eq!((b.accepted, b.drafted), (1, 15));
    let ab = spec::pool_spec(&l.spec_lines[0..3], None).unwrap();
    assert_eq!((ab.accepted, ab.drafted), (8547 + 1, 13311 + 15));
    let d = spec::pool_spec(&l.spec_lines[5..6], None).unwrap();
    assert!(close(d.mean_acceptance_length.unwrap(), 1.0 + 262.0 / 59.0));
}

#[test]
fn log12_startup_causes() {
    let l = log("12_");
    let kinds: Vec<&str> = l
        .errors
        .iter()
        .filter_map(|e| e.cause.as_ref().map(Cause::kind))
        .collect();
    assert_eq!(
        kinds,
        vec![
            "kv_too_small_for_max_len",
            "kv_too_small_for_max_len",
            "out_of_memory",
            "quantization_unsupported",
            "quantization_unsupported"
        ],
        "{:#?}",
        l.errors
    );
    let causes: Vec<(&Cause, usize)> = l
        .errors
        .iter()
        .filter_map(|e| Some((e.cause.as_ref()?, e.line)))
        .collect();
    assert!(
        matches!(causes[0], (Cause::KvTooSmallForMaxLen { max_model_len: 1_048_576, needed_gib: Some(n), available_gib: Some(a), estimated_max_model_len: None, .. }, 2) if *n == 24.0 && *a == 9.97)
    );
    assert!(
        matches!(causes[1], (Cause::KvTooSmallForMaxLen { max_model_len: 262_144, estimated_max_model_len: Some(34736), available_gib: Some(a), .. }, 4) if *a == 3.18)
    );
    assert!(
        matches!(causes[2], (Cause::OutOfMemory { tried_to_allocate: Some(t), free: Some(fr), .. }, 7) if t == "50.00 MiB" && fr == "21.75 MiB")
    );
    assert!(
        matches!(causes[3], (Cause::QuantizationUnsupported { method: Some(m), min_capability: Some(100), current_capability: Some(86) }, 13) if m == "mxfp4")
    );
    assert!(matches!(
        causes[4],
        (
            Cause::QuantizationUnsupported {
                method: None,
                min_capability: Some(80),
                current_capability: Some(75)
            },
            15
        )
    ));
    // The output-handler failure after the OOM is its consequence, not another cause.
    let handler = l
        .errors
        .iter()
        .find(|e| e.headline.as_deref() == Some("AsyncLLM output_handler failed."))
        .expect("grouped with its traceback");
    assert_eq!((handler.line, handler.last_line), (8, 11));
    assert!(handler.generic);
    assert_eq!(l.errors[handler.explained_by.unwrap()].line, 7);
    // Traceback lines are never errors of their own.
    assert!(!l.errors.iter().any(|e| e
        .headline
        .as_deref()
        .is_some_and(|h| h.starts_with("File") || h.starts_with("Traceback"))));
    let d = diag_log("12_");
    assert!(d.has_errors());
    assert!(
        d.findings_of("engine-error").is_empty(),
        "{:#?}",
        d.findings_of("engine-error")
    );
    // The card is read off the log when no --cc is given.
    assert_eq!(d.findings_of("quantization-unsupported").len(), 2);
}

#[test]
fn log13_docker_desktop_prefix_kv_and_one_error() {
    let l = log("13_");
    assert_eq!(l.boots.len(), 2, "{:#?}", l.boots);
    let b = &l.boots[0];
    assert_eq!(b.kv_cache_tokens, Some(235_136));
    assert_eq!(b.max_concurrency, Some((40_960, 5.74)));
    assert_eq!(b.gpu_blocks, Some(14_696));
    assert_eq!(b.block_size, Some(16), "235,136 / 14,696");
    assert!(b.kv_check.as_ref().unwrap().consistent);
    assert_eq!(b.status, Some(BootStatus::Ready));
    assert_eq!(l.boots[1].status, Some(BootStatus::Failed));
    assert_eq!(l.errors.len(), 1, "{:#?}", l.errors);
    let e = &l.errors[0];
    assert_eq!((e.line, e.last_line), (11, 20));
    assert_eq!(e.headline.as_deref(), Some("Error Internal"));
    assert_eq!(e.traceback_lines, 9);
    let d = diag_log("13_");
    let errs = d.findings_of("engine-error");
    assert_eq!(errs.len(), 1);
    assert!(
        errs[0].source.ends_with("lines 11–20"),
        "{}",
        errs[0].source
    );
    assert!(
        errs[0].detail.contains("cause not captured"),
        "{}",
        errs[0].detail
    );
}

/// The same log through every collector prefix gives the same facts and the same line numbers.
#[test]
fn log13_every_prefix_gives_the_same_answer() {
    let (_, text) = fixture("logs", "13_");
    let base = EngineLog::parse(&text);
    for prefix in [
        "",
        "Jun 01 06:42:29 gpu-host vllm[1234]: ",
        "2025-06-01T06:42:29.680123456Z ",
        "(EngineCore_DP0 pid=512) ",
        "[rank0]:",
        "vllm-1  | ",
    ] {
        let reprefixed: String = text
            .lines()
            .map(|l| {
                let body = l.split_once(" | ").map_or(l, |x| x.1);
                format!("{prefix}{body}\n")
            })
            .collect();
        let l = EngineLog::parse(&reprefixed);
        assert_eq!(l.boots.len(), 2, "{prefix:?}");
        assert_eq!(
            l.boots[0].kv_cache_tokens, base.boots[0].kv_cache_tokens,
            "{prefix:?}"
        );
        assert_eq!(l.errors.len(), 1, "{prefix:?}: {:#?}", l.errors);
        assert_eq!(
            (l.errors[0].line, l.errors[0].last_line),
            (11, 20),
            "{prefix:?}"
        );
    }
}

#[test]
fn log14_glog_ptxas_cause_and_enginecore_is_consequence() {
    let l = log("14_");
    let toolchain: Vec<_> = l.errors.iter().filter(|e| e.cause.is_some()).collect();
    assert_eq!(toolchain.len(), 1, "{:#?}", l.errors);
    assert_eq!(toolchain[0].cause_line, Some(1));
    match toolchain[0].cause.as_ref().unwrap() {
        Cause::ToolchainTooOld {
            target,
            ptx_isa,
            needs_ptx_isa,
            needs_cuda,
            detail,
        } => {
            assert_eq!(target.as_deref(), Some("sm_120a"));
            assert_eq!(ptx_isa.as_deref(), Some("8.4"));
            assert_eq!(needs_ptx_isa.as_deref(), Some("8.7"));
            assert_eq!(needs_cuda.as_deref(), Some("12.8"));
            assert!(detail.contains("CUDA 12.8"), "{detail}");
        }
        c => panic!("{c:?}"),
    }
    let start = l
        .errors
        .iter()
        .find(|e| e.headline.as_deref() == Some("EngineCore failed to start."))
        .unwrap();
    assert!(start.generic && start.explained_by.is_some());
    assert_eq!((start.line, start.last_line), (6, 10));
    let d = diag_log("14_");
    assert_eq!(ids(&d, Severity::Error), vec!["toolchain-too-old"]);
    let f = d.findings_of("toolchain-too-old")[0];
    assert!(f.title.contains("startup failed"));
    assert!(
        f.detail.contains("EngineCore failed to start"),
        "{}",
        f.detail
    );
}

#[test]
fn log15_two_boots_kept_apart_and_hybrid_disagreement() {
    let l = log("15_");
    assert_eq!(l.boots.len(), 2, "{:#?}", l.boots);
    let (b1, b2) = (&l.boots[0], &l.boots[1]);
    assert_eq!((b1.gpu_blocks, b1.block_size), (Some(50_000), Some(16)));
    assert_eq!(b1.capacity_tokens(), Some(800_000));
    assert_eq!(b1.max_concurrency, Some((4096, 195.31)));
    assert_eq!(b1.available_kv_memory_bytes, None);
    assert_eq!(b2.line, 5);
    assert_eq!(b2.kv_cache_tokens, Some(120_000));
    assert_eq!(b2.gpu_blocks, None, "boot 1's blocks stay out of boot 2");
    assert_eq!(b2.max_concurrency, Some((16_384, 25.0)));
    let k = b2.kv_check.as_ref().unwrap();
    assert_eq!((k.printed_tokens, k.implied_tokens), (120_000, 409_600));
    assert!(!k.consistent);
    assert!((k.factor - 3.41).abs() < 0.01);
    let d = diag_log("15_");
    let f = d.findings_of("kv-inconsistent");
    assert_eq!(f.len(), 1);
    assert!(f[0].title.contains("3.41"));
    assert!(f[0].detail.contains("120,000") && f[0].detail.contains("409,600"));
    assert!(f[0].title.starts_with("boot 2 of 2"));
    assert!(!d.has_errors());
}

#[test]
fn log16_traceback_only_excerpt() {
    let l = log("16_");
    assert_eq!(l.errors.len(), 1, "{:#?}", l.errors);
    assert_eq!(l.errors[0].headline, None);
    let d = diag_log("16_");
    let f = d.findings_of("engine-error");
    assert_eq!(f.len(), 1);
    assert_eq!(
        f[0].title,
        "engine error, cause not captured in this excerpt"
    );
    assert!(f[0].source.ends_with("lines 1–3"));
    assert!(d.has_errors());
}

#[test]
fn log17_drafter_accepts_nothing() {
    let l = log("17_");
    let p = l.spec_pooled().unwrap();
    assert_eq!(
        (p.accepted, p.drafted, p.k, p.drafts),
        (0, 780, Some(4), Some(195))
    );
    assert_eq!(p.acceptance_rate, Some(0.0));
    let d = diag_log("17_");
    let f = d.findings_of("spec-accepts-nothing");
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].severity, Severity::Error);
    assert!(f[0].title.contains("accepts nothing") && f[0].title.contains("k = 4"));
}

#[test]
fn log18_startup_incomplete_kv_unknown() {
    let l = log("18_");
    assert_eq!(l.boots.len(), 1);
    let b = &l.boots[0];
    assert_eq!(b.status, Some(BootStatus::Incomplete));
    assert_eq!(b.capacity_tokens(), None);
    assert_eq!(
        b.available_kv_memory_bytes,
        Some((7.12 * 1073741824.0f64).round() as u64)
    );
    assert_eq!(l.kv_capacity(), None);
    let d = diag_log("18_");
    let f = d.findings_of("startup-incomplete");
    assert_eq!(f.len(), 1);
    assert!(
        f[0].detail.contains("7.12 GiB") && f[0].detail.contains("line 3"),
        "{}",
        f[0].detail
    );
    assert!(!d.has_errors());
}

#[test]
fn every_log_fixture_parses_and_explains_itself() {
    let dir = fixtures().join("logs");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let bytes = std::fs::read(e.path()).unwrap();
        let l = EngineLog::parse_bytes(&bytes);
        assert!(!l.is_empty(), "{}", e.path().display());
        n += 1;
    }
    assert!(n >= 13);
}

#[test]
fn sse01_per_request_spec_metrics() {
    let (name, text) = fixture("sse", "01_");
    let s = parse_sse(&name, &text);
    let r = s.spec.clone().expect("object in the last chunk");
    assert_eq!(
        (r.drafts, r.accepted, r.drafted, r.k),
        (Some(43), Some(10), Some(129), Some(3))
    );
    assert_eq!(r.histogram_tokens(), Some(54));
    assert_eq!(s.completion_tokens, Some(54));
    let p = spec::pool_requests(&[r]).unwrap();
    assert!((p.acceptance_rate.unwrap() - 0.0775).abs() < 1e-4);
    assert!((p.mean_acceptance_length.unwrap() - (1.0 + 10.0 / 43.0)).abs() < 1e-12);
    let mut d = Diagnosis {
        sse: vec![s],
        ..Default::default()
    };
    d.findings = build_findings(&d);
    let f = d.findings_of("spec-low-acceptance");
    assert_eq!(f.len(), 1, "{:#?}", d.findings);
    assert!(f[0].title.contains("7.75%") && f[0].title.contains("k = 3"));
    assert!(d.findings_of("spec-histogram-mismatch").is_empty());
}

#[test]
fn metrics_fixtures() {
    let (n, t) = fixture("metrics", "02_");
    let m = parse_metrics(&n, t.as_bytes());
    let s = m.facts.spec.as_ref().unwrap();
    assert_eq!(s.drafts, Some(188));
    assert_eq!(
        s.acceptance_rate, None,
        "no accepted-token total in the table"
    );
    assert_eq!(m.facts.engine.as_deref(), Some("vllm"));
    let (n, t) = fixture("metrics", "03_");
    let m = parse_metrics(&n, t.as_bytes());
    assert_eq!(m.facts.samples, 0);
    assert!(m.facts.families_without_samples.len() >= 3);
    let (n, t) = fixture("metrics", "04_");
    let m = parse_metrics(&n, t.as_bytes());
    assert!(!m.facts.warnings.is_empty());
    let mut d = Diagnosis {
        metrics: vec![m],
        ..Default::default()
    };
    d.findings = build_findings(&d);
    assert_eq!(d.findings_of("metrics-invalid-lines").len(), 1);
}

#[test]
fn sglang_and_llamacpp_logs() {
    let sglang = "\
[2025-03-08 12:29:05] server_args=ServerArgs(model_path='Qwen/Qwen3-8B', tp_size=2, speculative_algorithm='EAGLE', speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)
[2025-03-08 12:29:21 TP0] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=6.09 GB, mem usage=15.54 GB.
[2025-03-08 12:29:21 TP0] KV Cache is allocated. #tokens: 46611, K size: 1.42 GB, V size: 1.42 GB
[2025-03-08 12:29:21 TP1] KV Cache is allocated. #tokens: 46611, K size: 1.42 GB, V size: 1.42 GB
[2025-03-08 12:29:27 TP0] max_total_num_tokens=46611, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=48, context_len=32768, available_gpu_mem=3.38 GB
[2025-03-08 12:29:40] The server is fired up and ready to roll!
[2025-03-08 12:30:01 TP0] Decode batch. #running-req: 1, #token: 120, token usage: 0.00, accept len: 2.40, accept rate: 0.47, cuda graph: True, gen throughput (token/s): 80.12, #queue-req: 0
[2025-03-08 12:30:11 TP0] Decode batch. #running-req: 1, #token: 220, token usage: 0.00, accept len: 2.60, accept rate: 0.53, cuda graph: True, gen throughput (token/s): 85.50, #queue-req: 0
";
    let l = EngineLog::parse(sglang);
    assert_eq!(l.engine.as_deref(), Some("sglang"));
    assert_eq!(l.boots.len(), 1, "{:#?}", l.boots);
    assert_eq!(l.boots[0].kv_cache_tokens, Some(46_611));
    assert_eq!(l.boots[0].context_len, Some(32_768));
    assert_eq!(l.boots[0].status, Some(BootStatus::Ready));
    assert_eq!(l.spec_config.method.as_deref(), Some("EAGLE"));
    let p = l.spec_pooled().unwrap();
    assert!(!p.counts);
    assert_eq!(p.k, Some(3));
    assert!(close(p.mean_acceptance_length.unwrap(), 2.5));
    assert!(close(p.acceptance_rate.unwrap(), 0.5));

    let llama = "\
build: 5462 (a1b2c3d4) with cc (GCC) 13.2.0 for x86_64-linux-gnu
llama_model_loader: loaded meta data with 30 key-value pairs and 291 tensors from model.gguf (version GGUF V3 (latest))
llama_kv_cache_unified:      CUDA0 KV buffer size =   512.00 MiB
llama_kv_cache_unified: size =  512.00 MiB (  4096 cells,  32 layers,  1/1 seqs), K (f16):  256.00 MiB, V (f16):  256.00 MiB
srv    load_model: loading draft model 'draft.gguf'
slot   load_model: id  0 | task -1 | new slot n_ctx_slot = 4096
main: server is listening on http://127.0.0.1:8080 - starting the main loop
slot print_timing: id  0 | task 0 | 
prompt eval time =     100.00 ms /    10 tokens (   10.00 ms per token,   100.00 tokens per second)
       eval time =    1000.00 ms /   100 tokens (   10.00 ms per token,   100.00 tokens per second)
      total time =    1100.00 ms /   110 tokens
draft acceptance rate = 0.02000 (    1 accepted /    50 generated)
slot print_timing: id  0 | task 1 | 
prompt eval time =     100.00 ms /    10 tokens (   10.00 ms per token,   100.00 tokens per second)
       eval time =    1000.00 ms /   100 tokens (   10.00 ms per token,   100.00 tokens per second)
      total time =    1100.00 ms /   110 tokens
draft acceptance rate = 0.00000 (    0 accepted /    50 generated)
";
    let l = EngineLog::parse(llama);
    assert_eq!(l.engine.as_deref(), Some("llama.cpp"));
    assert_eq!(l.engine_version.as_deref(), Some("b5462 (a1b2c3d4)"));
    assert_eq!(l.boots.len(), 1, "{:#?}", l.boots);
    assert_eq!(l.boots[0].kv_cache_tokens, Some(4096));
    assert_eq!(l.boots[0].status, Some(BootStatus::Ready));
    assert_eq!(l.request_timings.len(), 2);
    assert_eq!(l.request_timings[1].generated_tokens, Some(100));
    let p = l.spec_pooled().unwrap();
    assert_eq!((p.accepted, p.drafted), (1, 100));
    let mut d = Diagnosis {
        logs: vec![LogInput {
            name: "llama.log".into(),
            log: l,
        }],
        ..Default::default()
    };
    d.findings = build_findings(&d);
    assert_eq!(
        d.findings_of("spec-accepts-nothing").len(),
        1,
        "{:#?}",
        d.findings
    );
    assert_eq!(d.findings_of("request-timings").len(), 1);
}

#[test]
fn other_numbers_other_causes() {
    // A V1 boot whose numbers agree, and one hybrid boot 2% off is still consistent.
    let l = EngineLog::parse(
        "(EngineCore_DP0 pid=1) INFO 01-01 00:00:00 [kv_cache_utils.py:1] GPU KV cache size: 100,000 tokens\n\
         (EngineCore_DP0 pid=1) INFO 01-01 00:00:00 [kv_cache_utils.py:2] Maximum concurrency for 10,000 tokens per request: 10.10x\n",
    );
    assert!(l.boots[0].kv_check.as_ref().unwrap().consistent);
    // Low but non-zero acceptance: a warning, not an error; 3% an error.
    for (acc, id) in [
        (30u64, "spec-low-acceptance"),
        (12, "spec-accepts-nothing"),
        (200, "spec-decoding"),
    ] {
        let text = format!(
            "INFO 01-01 00:00:00 [metrics.py:1] SpecDecoding metrics: Mean acceptance length: 1.10, Accepted: {acc} tokens, Drafted: 400 tokens, Per-position acceptance rate: 0.1, 0.0\n"
        );
        let mut d = Diagnosis {
            logs: vec![LogInput {
                name: "x".into(),
                log: EngineLog::parse(&text),
            }],
            ..Default::default()
        };
        d.findings = build_findings(&d);
        assert_eq!(d.findings_of(id).len(), 1, "{acc}: {:#?}", d.findings);
    }
    // A drafter loaded and k configured: on, k stated, even without metrics lines.
    let l = EngineLog::parse(
        "(APIServer pid=1) INFO 01-01 00:00:00 [api_utils.py:1] non-default args: {'model': 'm', 'speculative_config': {'method': 'mtp', 'num_speculative_tokens': 3}}\n\
         (EngineCore pid=2) INFO 01-01 00:00:01 [gpu_model_runner.py:1] Loading drafter model...\n",
    );
    assert_eq!((l.spec_method.as_deref(), l.spec_k), (Some("mtp"), Some(3)));
    assert!(l.spec_on().unwrap().contains("line 2"));
    // A plain traceback on stderr ends in its exception, which names the cause.
    let l = EngineLog::parse(
        "Traceback (most recent call last):\n  File \"/x.py\", line 1, in <module>\n    main()\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.10 GiB of which 1.06 GiB is free.\nnext line\n",
    );
    assert_eq!(l.errors.len(), 1, "{:#?}", l.errors);
    assert_eq!((l.errors[0].line, l.errors[0].last_line), (1, 4));
    assert!(matches!(
        l.errors[0].cause,
        Some(Cause::OutOfMemory { gpu: Some(3), .. })
    ));
}

#[test]
fn binary_and_garbage_never_panic() {
    let mut junk: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    let l = EngineLog::parse_bytes(&junk);
    assert!(l.unreadable.is_some());
    junk.retain(|b| *b != 0);
    let _ = EngineLog::parse_bytes(&junk);
    for t in [
        "",
        "\u{1}garbage",
        "GPU KV cache size: , tokens",
        "Maximum concurrency for x tokens per request: yx",
        "SpecDecoding metrics: Accepted: lots, Drafted:",
        "(Worker_TP pid=1) WARNING does not have native support for FP4 computation",
        "(broken pid=) ERROR",
        "KV cache: 99999999999999999999999 tokens (1 blocks × 16)",
        "Available KV cache memory: 1e400 GiB",
        "# GPU blocks: 99999999999999999999, # CPU blocks: 1\nMaximum concurrency for 1 tokens per request: 1e308x",
        "ERROR 01-01 00:00:00 [a.py:1]   File \"x\"",
        "Traceback (most recent call last):",
    ] {
        let l = EngineLog::parse(t);
        let mut d = Diagnosis {
            logs: vec![LogInput {
                name: "t".into(),
                log: l,
            }],
            ..Default::default()
        };
        d.findings = build_findings(&d);
        let _ = render::render_markdown(&d);
    }
    let m = parse_metrics("bin", &[0u8, 1, 2, 3]);
    assert!(m.unreadable.is_some());
}

#[test]
fn results_written_by_older_versions_read_back() {
    let old = r#"{"engine_version": null, "errors": [], "kv": [{"gpu_blocks": 1, "line": 2}],
        "kv_scale_warnings": ["Using KV cache scaling factor 1.0"], "lines_read": 5,
        "marlin_fp4_fallback": null, "spec_k": null, "spec_lines": [], "spec_method": null}"#;
    let l: EngineLog = serde_json::from_str(old).expect("old boot_log reads");
    assert_eq!(
        l.kv_scale_warnings[0].message,
        "Using KV cache scaling factor 1.0"
    );
    // The committed baselines (engine logs included) read back as whole results: see
    // `committed_baselines_read_back` in `report::schema`.
}

/// A checkpoint folder from the Qwen3.6-35B-A3B ModelOpt fixture; with `w4a4_experts` the routed
/// experts become W4A4 NVFP4 (the shared expert and lm_head stay W4A16).
fn qwen36_checkpoint(w4a4_experts: bool) -> tempfile::TempDir {
    let c = fixtures().join("configs");
    let d = tempfile::tempdir().unwrap();
    // hf_quant_config.json carries the per-layer algorithms; config.json's copy is dropped so
    // that it is the one followed.
    let mut cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(c.join("nvidia--Qwen3.6-35B-A3B-NVFP4__config.json")).unwrap(),
    )
    .unwrap();
    cfg.as_object_mut().unwrap().remove("quantization_config");
    std::fs::write(d.path().join("config.json"), cfg.to_string()).unwrap();
    let mut q: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(c.join("nvidia--Qwen3.6-35B-A3B-NVFP4__hf_quant_config.json"))
            .unwrap(),
    )
    .unwrap();
    if w4a4_experts {
        let layers = q["quantization"]["quantized_layers"]
            .as_object_mut()
            .unwrap();
        for (k, v) in layers.iter_mut() {
            if k.ends_with("mlp.experts") {
                v["quant_algo"] = "NVFP4".into();
            }
        }
    }
    std::fs::write(d.path().join("hf_quant_config.json"), q.to_string()).unwrap();
    d
}

fn diag_with(log_text: &str, ck: Option<&std::path::Path>, cc: Option<&str>) -> Diagnosis {
    let card = cc.map(|c| Card {
        cc: c.parse().unwrap(),
        source: "--cc".into(),
    });
    let mut d = Diagnosis {
        logs: vec![LogInput {
            name: "engine.log".into(),
            log: EngineLog::parse(log_text),
        }],
        checkpoint: ck.map(|p| checkpoint_facts(p, card.as_ref().map(|c| c.cc)).unwrap()),
        card,
        ..Default::default()
    };
    d.findings = build_findings(&d);
    d
}

#[test]
fn marlin_fallback_explained_by_checkpoint_and_card() {
    let (_, log06) = fixture("logs", "06_");
    // W4A16 MLP (experts, shared expert, lm_head) and W4A4 experts on sm_100.
    let mixed = qwen36_checkpoint(true);
    let d = diag_with(&log06, Some(mixed.path()), Some("sm_100"));
    let f = d.findings_of("marlin-fp4-fallback")[0];
    assert_eq!(f.severity, Severity::Info);
    assert!(
        f.detail
            .contains("expected: these layers are weights-only NVFP4"),
        "{}",
        f.detail
    );
    assert!(
        f.detail
            .contains("which vLLM runs on Marlin on this card and version (except dense layers on sm_100/sm_103 from 0.30"),
        "{}",
        f.detail
    );
    assert!(
        f.detail
            .contains("the W4A4 layers (MoE routed experts) run natively"),
        "{}",
        f.detail
    );
    // All W4A16: expected on any card.
    let w4a16 = qwen36_checkpoint(false);
    let d = diag_with(&log06, Some(w4a16.path()), Some("sm_120"));
    let f = d.findings_of("marlin-fp4-fallback")[0];
    assert_eq!(f.severity, Severity::Info, "{}", f.detail);
    assert!(f.detail.contains("nothing native is lost"));
    // sm_120 with the MoE backend line: the W4A4 experts have no native path in this engine.
    let log = format!(
        "{log06}\n(EngineCore pid=274) INFO 06-12 08:49:30 [nvfp4.py:222] Using 'MARLIN' NvFp4 MoE backend out of potential backends: ['FLASHINFER_CUTLASS', 'VLLM_CUTLASS', 'MARLIN']\n"
    );
    let d = diag_with(&log, Some(mixed.path()), Some("sm_120"));
    let f = d.findings_of("marlin-fp4-fallback")[0];
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        f.detail.contains("no native path") && f.detail.contains("MoE routed experts"),
        "{}",
        f.detail
    );
    // Below sm_100: expected, the W4A4 layers lose their 4-bit activations.
    let d = diag_with(&log06, Some(mixed.path()), Some("sm_89"));
    let f = d.findings_of("marlin-fp4-fallback")[0];
    assert!(
        f.title.contains("expected on sm_89") && f.detail.contains("lose their 4-bit activations")
    );
    // Without a checkpoint: what would settle it.
    let d = diag_with(&log06, None, Some("sm_100"));
    assert!(d.findings_of("marlin-fp4-fallback")[0]
        .detail
        .contains("--checkpoint"));
}

#[test]
fn fp8_kv_at_scale_one_explained() {
    let log = "(EngineCore pid=1) WARNING 07-02 22:00:59 [kv_cache.py:148] Using KV cache scaling factor 1.0 for fp8_e4m3. If this is unintended, verify that k/v_scale scaling factors are properly set in the checkpoint.\n";
    // No checkpoint: say what would settle it.
    let d = diag_with(log, None, None);
    let f = d.findings_of("kv-fp8-scale-1")[0];
    assert!(f.detail.contains("--checkpoint"));
    // The checkpoint declares no KV quantization: expected, nobody's fault.
    let llama = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/checkpoints/llama-ct-nvfp4");
    let d = diag_with(log, Some(&llama), None);
    let f = d.findings_of("kv-fp8-scale-1")[0];
    assert!(
        f.detail.contains("declares no KV-cache quantization"),
        "{}",
        f.detail
    );
    // FP8 KV declared, no k/v scale tensors: the checkpoint's fault.
    let noscale = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/checkpoints/llama-fp8-kv-no-scales");
    let d = diag_with(log, Some(&noscale), None);
    let f = d.findings_of("kv-fp8-scale-1")[0];
    assert_eq!(f.severity, Severity::Warning);
    assert!(f.detail.contains("the checkpoint's fault"), "{}", f.detail);
}

#[test]
fn metrics_scrapes_k_from_counts_and_deltas() {
    let a = "vllm:spec_decode_num_drafts_total 100\nvllm:spec_decode_num_draft_tokens_total 300\nvllm:spec_decode_num_accepted_tokens_total 150\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1\n";
    let b = "vllm:spec_decode_num_drafts_total 200\nvllm:spec_decode_num_draft_tokens_total 600\nvllm:spec_decode_num_accepted_tokens_total 160\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1\n";
    let ma = parse_metrics("a.prom", a.as_bytes());
    let s = ma.facts.spec.clone().unwrap();
    assert_eq!((s.k, s.drafts), (Some(3), Some(100)));
    assert_eq!(
        s.k_source.as_deref(),
        Some("/metrics draft_tokens / drafts")
    );
    assert_eq!(ma.facts.kv_capacity.as_ref().unwrap().0, 16_000);
    let mut d = Diagnosis {
        metrics: vec![ma, parse_metrics("b.prom", b.as_bytes())],
        ..Default::default()
    };
    d.findings = build_findings(&d);
    // Between the scrapes: 10 of 300 accepted = 3.3% → the drafter accepts almost nothing.
    let f = d.findings_of("spec-accepts-nothing");
    assert_eq!(f.len(), 1, "{:#?}", d.findings);
    assert!(f[0].source.contains("a.prom → b.prom"), "{}", f[0].source);
    assert!(
        f[0].title.contains("3.33%") && f[0].title.contains("k = 3"),
        "{}",
        f[0].title
    );
}
