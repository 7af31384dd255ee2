//! The engine readers on real output (`tests/fixtures/real/engines/`: llama.cpp 0c1e57098 and
//! vLLM 0.32 with the right values their README lists), and each fault kind on an input
//! written for it, with other numbers too. Inline lines copy the forms the engines print; each
//! test names where its form came from.

use super::cause::Cause;
use super::log::{BootStatus, EngineLog, KernelPath};
use super::spec::SpecLogGeneration;
use super::*;

fn engines_dir(engine: &str) -> std::path::PathBuf {
    crate::real_fixture(&format!("engines/{engine}"))
}

/// The fixture of `engine` whose name starts with `prefix`: (name, bytes). Panics when absent.
fn engine_fixture(engine: &str, prefix: &str) -> (String, Vec<u8>) {
    let dir = engines_dir(engine);
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(prefix) {
            return (name, std::fs::read(e.path()).unwrap());
        }
    }
    panic!("no fixture {engine}/{prefix}* in {}", dir.display());
}

const LLAMA: &str = "llama.cpp-0c1e57098";
const VLLM: &str = "vllm-0.32.0-cpu";

fn diag_logs(logs: Vec<(String, EngineLog)>) -> Diagnosis {
    let mut d = Diagnosis {
        logs: logs
            .into_iter()
            .map(|(name, log)| LogInput { name, log })
            .collect(),
        ..Default::default()
    };
    d.findings = build_findings(&d);
    d
}

fn diag_text(text: &str) -> Diagnosis {
    diag_logs(vec![("engine.log".into(), EngineLog::parse(text))])
}

fn diag_fixture(engine: &str, prefix: &str) -> (EngineLog, Diagnosis) {
    let (name, bytes) = engine_fixture(engine, prefix);
    let log = EngineLog::parse_bytes(&bytes);
    let d = diag_logs(vec![(name, log.clone())]);
    (log, d)
}

fn metrics(engine: &str, prefix: &str) -> MetricsInput {
    let (name, bytes) = engine_fixture(engine, prefix);
    parse_metrics(&name, &bytes)
}

fn diag_metrics(ms: Vec<MetricsInput>) -> Diagnosis {
    let mut d = Diagnosis {
        metrics: ms,
        ..Default::default()
    };
    d.findings = build_findings(&d);
    d
}

// ---- real llama.cpp output -------------------------------------------------------------------

#[test]
fn llamacpp_01_default_verbosity_capacity_from_slots_and_timings() {
    let (l, d) = diag_fixture(LLAMA, "01_");
    assert_eq!(l.engine.as_deref(), Some("llama.cpp"));
    assert_eq!(l.boots.len(), 1, "{:#?}", l.boots);
    let b = &l.boots[0];
    // load_model: initializing, n_slots = 4, n_ctx_slot = 2048, kv_unified = 'false'
    assert_eq!(b.capacity_tokens(), Some(8_192));
    assert_eq!(b.kv_cache_tokens_line, Some(6));
    let r = l.kv_reading().unwrap();
    assert_eq!((r.tokens, r.line), (8_192, 6));
    assert!(
        r.rule.contains("n_slots 4 × n_ctx_slot 2,048"),
        "{}",
        r.rule
    );
    assert_eq!(b.status, Some(BootStatus::Ready));
    // One-line `slot print_timing: id N | task T | prompt eval time = …` form.
    let t: Vec<_> = l
        .request_timings
        .iter()
        .filter(|t| t.generation_ms.is_some())
        .collect();
    assert_eq!(t.len(), 152);
    assert_eq!(
        t.iter().filter_map(|t| t.generated_tokens).sum::<u64>(),
        6_256
    );
    assert_eq!(
        t.iter().filter_map(|t| t.prompt_tokens).sum::<u64>(),
        65_127
    );
    assert!(!d.has_errors(), "{:#?}", d.findings);
    assert_eq!(d.findings_of("nothing-recognised").len(), 0);
    assert_eq!(d.findings_of("request-timings").len(), 1);
}

#[test]
fn llamacpp_05_verbose_cells_are_per_stream() {
    let (l, d) = diag_fixture(LLAMA, "05_");
    // common_params_print_info: build 1 (0c1e57098) … on line 2
    assert_eq!(l.engine_version.as_deref(), Some("b1 (0c1e57098)"));
    assert_eq!(l.engine_version_line, Some(2));
    let b = &l.boots[0];
    let c = b.kv_cells.as_ref().unwrap();
    assert_eq!(
        (c.cells, c.layers, c.seqs, c.streams, c.line),
        (2048, Some(2), Some(4), Some(4), 133)
    );
    // 4 MiB at 512 bytes per token = 8,192 tokens = 2,048 cells × 4 streams.
    assert_eq!(b.kv_cache_tokens, Some(8_192));
    assert_eq!(b.kv_pool_bytes, Some(4 * 1024 * 1024));
    assert_eq!(b.kv_pool_bytes.unwrap() / 512, 8_192);
    assert_eq!(b.n_ctx, Some((8_192, 119)));
    assert_eq!(b.kv_buffers.len(), 1);
    assert_eq!(b.kv_buffers[0].device, "CPU");
    assert!(b.kv_buffers[0].on_host());
    assert_eq!(l.spec_config.off_line, Some(148));
    // The slots line agrees with the cells line: no disagreement, and a CPU-only run is not
    // "KV off the GPU".
    assert!(d.findings_of("kv-inconsistent").is_empty());
    assert!(d.findings_of("kv-off-gpu").is_empty());
    let f = d.findings_of("kv-capacity");
    assert_eq!(f.len(), 1);
    assert!(
        f[0].detail.contains("2,048 cells × 4 streams"),
        "{}",
        f[0].detail
    );
}

#[test]
fn llamacpp_06_ngram_acceptance_is_not_a_draft_model() {
    let (l, d) = diag_fixture(LLAMA, "06_");
    let lines: Vec<_> = l
        .spec_lines
        .iter()
        .filter(|s| s.generation == SpecLogGeneration::Llamacpp)
        .collect();
    assert_eq!(lines.len(), 3);
    // draft acceptance = 0.16667 ( 2 accepted / 12 generated), mean len = 3.00
    assert_eq!(
        (
            lines[0].accepted,
            lines[0].drafted,
            lines[0].mean_acceptance_length
        ),
        (Some(2), Some(12), Some(3.0))
    );
    let p = l.spec_pooled().unwrap();
    assert_eq!((p.accepted, p.drafted), (2, 38));
    assert!(l.spec_config.method.is_none());
    assert_eq!(l.spec_config.drafter_line, None);
    let f: Vec<&Finding> = d
        .findings
        .iter()
        .filter(|f| f.id.starts_with("spec-"))
        .collect();
    assert_eq!(f.len(), 1, "{f:#?}");
    assert!(f[0].detail.contains("not a draft model"), "{}", f[0].detail);
    assert!(!f[0].title.contains("draft model"));
    // Lines whose timestamp a redactor turned into `<ip>` still count (task 797's eval line).
    let t797 = l
        .request_timings
        .iter()
        .find(|t| t.task == Some(797))
        .unwrap();
    assert_eq!(t797.generated_tokens, Some(128));
    assert_eq!(
        l.request_timings
            .iter()
            .filter(|t| t.generation_ms.is_some())
            .count(),
        9
    );
}

#[test]
fn llamacpp_metrics_counters_cache_and_spec() {
    let m = metrics(LLAMA, "02_");
    assert_eq!(m.facts.engine.as_deref(), Some("llama.cpp"));
    let t = m.facts.tokens.as_ref().unwrap();
    assert_eq!(t.prompt_tokens, Some(18_849.0));
    assert_eq!(t.prompt_seconds, Some(10.4814));
    assert_eq!(t.generated_tokens, Some(2_416.0));
    assert_eq!(t.generation_seconds, Some(84.2749));
    let c = m.facts.prefix_cache.as_ref().unwrap();
    assert_eq!((c.hits, c.queries), (6_465.0, 6_465.0 + 18_849.0));
    let d = diag_metrics(vec![m]);
    let pc = d.findings_of("prefix-cache");
    assert!(pc[0].title.contains("6,465 of 25,314"), "{}", pc[0].title);
    // llama.cpp exports spec counters without speculation: 0 drafts says nothing about config.
    let s = d.findings_of("spec-decoding");
    assert_eq!(s.len(), 1);
    assert!(!s[0].title.contains("configured"), "{}", s[0].title);
    assert_eq!(d.findings_of("nothing-recognised").len(), 0);
    // Before/after 4 requests of an n-gram server: 512 tokens generated, no draft.
    let d = diag_metrics(vec![metrics(LLAMA, "08_"), metrics(LLAMA, "09_")]);
    let between: Vec<&Finding> = d
        .findings_of("spec-decoding")
        .into_iter()
        .filter(|f| f.source.contains('→'))
        .collect();
    assert_eq!(between.len(), 1);
    assert!(
        between[0].detail.contains("512 tokens were generated"),
        "{}",
        between[0].detail
    );
}

// ---- real vLLM 0.32 output ---------------------------------------------------------------------

#[test]
fn vllm032_session_shutdown_error_is_not_a_fault() {
    let (l, d) = diag_fixture(VLLM, "01_");
    assert_eq!(l.engine_version.as_deref(), Some("0.32.0"));
    let b = &l.boots[0];
    assert_eq!(b.kv_cache_tokens, Some(2_097_152));
    assert_eq!(b.max_concurrency, Some((2_048, 1024.0)));
    // `Explicitly set (1.0/17.46) GiB for KV cache on node 0`: the CPU form of the KV memory.
    assert_eq!(b.available_kv_memory_bytes, Some(1 << 30));
    assert_eq!(b.status, Some(BootStatus::Ready));
    assert!(b.shutdown_line.is_some());
    // The EngineDeadError after `[shutdown] … shutdown triggered` is a consequence of stopping.
    assert!(!d.has_errors(), "{:#?}", d.findings);
    assert_eq!(d.findings_of("engine-error-at-shutdown").len(), 1);
    assert_eq!(l.spec_config.off_line, Some(16));
    // The CPU build's kernel fallback, as printed.
    let f = d.findings_of("kernel-fallback");
    assert_eq!(f.len(), 1, "{:#?}", d.findings);
    assert!(
        f[0].title.contains("fallback to torch linear"),
        "{}",
        f[0].title
    );
    assert!(f[0].source.ends_with(":42"), "{}", f[0].source);
    // Other forms: TensorRT-LLM's and a `falling back to` wording.
    let d = diag_text("[12/20/2025-04:21:10] [TRT-LLM] [W] FlashInfer not available, falling back to the TRT-LLM attention backend\n");
    assert_eq!(d.findings_of("kernel-fallback").len(), 1);
    // Ctrl-C: the KeyboardInterrupt traceback is the stop itself.
    let d = diag_text("Traceback (most recent call last):\n  File \"/x/api_server.py\", line 3, in main\n    uvloop.run(serve())\nKeyboardInterrupt\n");
    assert!(!d.has_errors(), "{:#?}", d.findings);
    assert_eq!(d.findings_of("engine-error-at-shutdown").len(), 1);
}

#[test]
fn vllm032_argparse_error_is_a_startup_cause() {
    let (l, d) = diag_fixture(VLLM, "06_");
    assert_eq!(l.errors.len(), 1, "{:#?}", l.errors);
    let g = &l.errors[0];
    assert_eq!(
        (g.line, g.last_line),
        (2, 5),
        "the usage block opens the error"
    );
    assert_eq!(
        g.cause,
        Some(Cause::InvalidArguments {
            program: Some("vllm".into()),
            message: "unrecognized arguments: --no-such-flag".into()
        })
    );
    let f = d.findings_of("invalid-arguments");
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].severity, Severity::Error);
    // Other programs and other parser messages.
    for (line, prog, msg) in [
        (
            "launch_server.py: error: argument --quantization: invalid choice: 'nvfp5' (choose from 'awq', 'fp8')",
            Some("launch_server.py"),
            "argument --quantization: invalid choice: 'nvfp5' (choose from 'awq', 'fp8')",
        ),
        (
            "vllm: error: the following arguments are required: model_tag",
            Some("vllm"),
            "the following arguments are required: model_tag",
        ),
        ("error: invalid argument: --ctx", None, "invalid argument: --ctx"),
        ("Error: No such option: --bogus", None, "No such option: --bogus"),
    ] {
        let l = EngineLog::parse(line);
        assert_eq!(
            l.errors[0].cause,
            Some(Cause::InvalidArguments {
                program: prog.map(str::to_string),
                message: msg.into()
            }),
            "{line}"
        );
    }
}

#[test]
fn vllm032_metrics_created_series_are_data() {
    let at_boot = metrics(VLLM, "02_");
    assert_eq!(
        at_boot.facts.families_without_samples,
        vec![
            "http_request_duration_seconds",
            "http_request_size_bytes",
            "http_requests_total",
            "http_response_size_bytes"
        ]
    );
    let after = metrics(VLLM, "03_");
    assert!(
        after.facts.families_without_samples.is_empty(),
        "{:?}",
        after.facts.families_without_samples
    );
    let c = after.facts.prefix_cache.as_ref().unwrap();
    assert_eq!((c.hits, c.queries), (2_048.0, 78_140.0));
    assert_eq!(
        after.facts.tokens.as_ref().unwrap().generated_tokens,
        Some(33_472.0)
    );
    let d = diag_metrics(vec![after]);
    assert!(d.findings_of("metrics-no-data").is_empty());
}

// ---- KV warnings that change a conclusion -------------------------------------------------------

#[test]
fn vllm_padding_layers_are_reported_with_their_waste() {
    // vLLM PR 29303 (gpt-oss + EAGLE3) and PR 56445 (20 full + 30 sliding-window layers).
    for (line, layers, waste, sev) in [
        (
            "(EngineCore_DP0 pid=7) INFO 11-24 10:00:00 [kv_cache_utils.py:1106] Add 17 padding layers, may waste at most 89.47% KV cache memory",
            17,
            0.8947,
            Severity::Warning,
        ),
        (
            "INFO 09-11 10:00:00 [kv_cache_utils.py:1506] Add 10 padding layers, may waste at most 33.33% KV cache memory",
            10,
            0.3333,
            Severity::Warning,
        ),
        (
            "INFO 11-24 10:00:00 [kv_cache_utils.py:1106] Add 1 padding layers, may waste at most 5.56% KV cache memory",
            1,
            0.0556,
            Severity::Info,
        ),
    ] {
        let text = format!("{line}\nINFO 11-24 10:00:01 [kv_cache_utils.py:1] GPU KV cache size: 120,000 tokens\n");
        let d = diag_text(&text);
        let p = d.logs[0].log.boots[0].padding.clone().unwrap();
        assert_eq!(p.layers, layers);
        assert!((p.waste - waste).abs() < 1e-9);
        let f = d.findings_of("kv-padding-waste");
        assert_eq!(f.len(), 1, "{line}");
        assert_eq!(f[0].severity, sev);
        assert!(f[0].source.ends_with(":1"));
    }
}

#[test]
fn llamacpp_kv_partly_or_wholly_in_host_memory() {
    // `llama_kv_cache: %10s KV buffer size = %8.2f MiB` per backend (src/llama-kv-cache.cpp).
    let partly = "\
load_tensors: offloaded 28/33 layers to GPU
load_tensors:        CUDA0 model buffer size =  3577.56 MiB
llama_kv_cache:      CUDA0 KV buffer size =   448.00 MiB
llama_kv_cache:        CPU KV buffer size =    64.00 MiB
llama_kv_cache: size =  512.00 MiB (  4096 cells,  32 layers,  1/1 seqs), K (f16):  256.00 MiB, V (f16):  256.00 MiB
";
    let d = diag_text(partly);
    let f = d.findings_of("kv-off-gpu");
    assert_eq!(f.len(), 1, "{:#?}", d.findings);
    assert_eq!(f[0].severity, Severity::Warning);
    assert!(f[0].title.contains("12.5%"), "{}", f[0].title);
    assert!(f[0].detail.contains("28 of 33 layers"), "{}", f[0].detail);
    assert_eq!(d.logs[0].log.boots.len(), 1);
    assert_eq!(d.logs[0].log.boots[0].kv_cache_tokens, Some(4_096));
    // Other numbers: a third of the KV in host memory, two GPUs.
    let d = diag_text(
        "llama_kv_cache:      CUDA0 KV buffer size =   200.00 MiB\nllama_kv_cache:      CUDA1 KV buffer size =   200.00 MiB\nllama_kv_cache:        CPU KV buffer size =   200.00 MiB\n",
    );
    assert!(d.findings_of("kv-off-gpu")[0].title.contains("33.3%"));
    // All of it in host memory while the weights use the GPU (--no-kv-offload).
    let d = diag_text(
        "load_tensors:        CUDA0 model buffer size =  3577.56 MiB\nllama_kv_cache:        CPU KV buffer size =   512.00 MiB\n",
    );
    let f = d.findings_of("kv-off-gpu");
    assert!(f[0].title.contains("whole KV cache"), "{}", f[0].title);
    // Host memory only, no GPU in the log: a CPU run, nothing to warn about.
    let d = diag_text("llama_kv_cache:        CPU KV buffer size =   512.00 MiB\n");
    assert!(d.findings_of("kv-off-gpu").is_empty());
}

#[test]
fn llamacpp_iswa_and_unified_forms() {
    // gpt-oss on llama.cpp: the non-SWA cache gives the capacity, the SWA cache is bounded.
    let text = "\
llama_context: n_ctx         = 65536
llama_kv_cache_iswa: creating non-SWA KV cache, size = 65536 cells
llama_kv_cache: size = 2304.00 MiB ( 65536 cells,  18 layers,  4/1 seqs), K (f16): 1152.00 MiB, V (f16): 1152.00 MiB
llama_kv_cache_iswa: creating     SWA KV cache, size = 1024 cells
llama_kv_cache: size =   36.00 MiB (  1024 cells,  18 layers,  4/1 seqs), K (f16):   18.00 MiB, V (f16):   18.00 MiB
srv    load_model: initializing, n_slots = 4, n_ctx_slot = 65536, kv_unified = 'true'
";
    let l = EngineLog::parse(text);
    assert_eq!(l.boots.len(), 1, "{:#?}", l.boots);
    let b = &l.boots[0];
    // `4/1 seqs`: unified, one stream: the 65,536 cells are the whole capacity.
    assert_eq!(b.kv_cache_tokens, Some(65_536));
    assert_eq!(b.kv_cells_swa.as_ref().map(|c| c.cells), Some(1_024));
    let d = diag_logs(vec![("e.log".into(), l)]);
    assert!(
        d.findings_of("kv-inconsistent").is_empty(),
        "{:#?}",
        d.findings
    );
    // The older unified form (one number of seqs).
    let l = EngineLog::parse(
        "llama_kv_cache_unified: size =  512.00 MiB (  4096 cells,  32 layers,  1 seqs), K (f16):  256.00 MiB, V (f16):  256.00 MiB\n",
    );
    assert_eq!(l.boots[0].kv_cache_tokens, Some(4_096));
    // Disagreeing lines are both reported.
    let d = diag_text(
        "llama_kv_cache: size = 4.00 MiB ( 2048 cells, 2 layers, 4/4 seqs), K (f16): 2.00 MiB, V (f16): 2.00 MiB\nload_model: initializing, n_slots = 2, n_ctx_slot = 2048, kv_unified = 'false'\n",
    );
    let f = d.findings_of("kv-inconsistent");
    assert_eq!(f.len(), 1);
    assert!(f[0].detail.contains("8,192") && f[0].detail.contains("4,096"));
    // A drafter's own context does not replace the target's capacity.
    let l = EngineLog::parse(
        "llama_kv_cache: size = 4.00 MiB ( 2048 cells, 2 layers, 4/4 seqs), K (f16): 2.00 MiB, V (f16): 2.00 MiB\nsrv    load_model: loading draft model 'draft.gguf'\nllama_context: n_ctx = 2048\nllama_kv_cache: size = 1.00 MiB ( 512 cells, 2 layers, 4/4 seqs), K (f16): 0.50 MiB, V (f16): 0.50 MiB\nsrv    load_model: initializing, n_slots = 4, n_ctx_slot = 2048, kv_unified = 'false'\n",
    );
    assert_eq!(l.boots.len(), 1, "{:#?}", l.boots);
    assert_eq!(l.boots[0].kv_cache_tokens, Some(8_192));
    assert_eq!(l.spec_config.method.as_deref(), Some("draft model"));
    // The drafter's loader lines after the target's KV cache are not a new boot either.
    let l = EngineLog::parse(
        "llama_model_loader: loaded meta data with 30 key-value pairs and 291 tensors from target.gguf\nllama_kv_cache: size = 4.00 MiB ( 2048 cells, 2 layers, 4/4 seqs), K (f16): 2.00 MiB, V (f16): 2.00 MiB\nsrv    load_model: loading draft model 'draft.gguf'\nllama_model_loader: loaded meta data with 25 key-value pairs and 100 tensors from draft.gguf\nllama_context: n_ctx = 8192\nsrv    load_model: initializing, n_slots = 4, n_ctx_slot = 2048, kv_unified = 'false'\n",
    );
    assert_eq!(l.boots.len(), 1, "{:#?}", l.boots);
}

/// SGLang's lines as printed in a real boot (2026-02, a Qwen2 model with
/// `--max-total-tokens 20480`): the pool holds 20,480 tokens while 77 GB stay free.
const SGLANG_CAPPED: &str = "\
[2026-02-04 11:30:28] server_args=ServerArgs(model_path='Qwen/Qwen2.5-0.5B-Instruct', mem_fraction_static=0.88, max_total_tokens=20480, page_size=1, speculative_algorithm=None)
[2026-02-04 11:30:28] Load weight begin. avail mem=78.43 GB
[2026-02-04 11:30:29] Load weight end. elapsed=0.38 s, type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=77.45 GB, mem usage=0.98 GB.
[2026-02-04 11:30:29] KV Cache is allocated. #tokens: 20480, K size: 0.12 GB, V size: 0.12 GB
[2026-02-04 11:30:29] Memory pool end. avail mem=77.12 GB
[2026-02-04 11:30:31] max_total_num_tokens=20480, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=4096, context_len=32768, available_gpu_mem=76.95 GB
[2026-02-04 11:30:40] The server is fired up and ready to roll!
";

#[test]
fn sglang_pool_capped_far_below_the_profiler() {
    let d = diag_text(SGLANG_CAPPED);
    let l = &d.logs[0].log;
    assert_eq!(l.engine.as_deref(), Some("sglang"));
    let b = &l.boots[0];
    assert_eq!(b.kv_cache_tokens, Some(20_480));
    assert_eq!(b.context_len, Some(32_768));
    let f = d.findings_of("kv-pool-capped");
    assert_eq!(f.len(), 1, "{:#?}", d.findings);
    assert_eq!(f[0].severity, Severity::Warning);
    // (77.45 − 78.43 × 0.12) GiB over (0.24 GiB / 20,480 tokens) ≈ 5.8 million tokens.
    let rest: f64 = 77.45 - 78.43 * (1.0 - 0.88);
    let per_token = 0.24 * 1_073_741_824.0 / 20_480.0;
    let want = (rest * 1_073_741_824.0 / per_token).floor() as u64;
    assert!(
        f[0].title.contains(&crate::output::table::thousands(want)),
        "{} (want ≈{want})",
        f[0].title
    );
    assert!(f[0].detail.contains("77.12 GB"), "{}", f[0].detail);
    // Other numbers: the Memory profiling line states rest_memory; a cap close to it is info.
    let close = "\
[2026-05-15 09:09:22] server_args=ServerArgs(mem_fraction_static=0.60, max_total_tokens=1200000, page_size=1)
[2026-05-15 09:09:53 TP0] Memory profiling: available_gpu_memory=57.01 GB, total_gpu_memory=93.58 GB, mem_fraction_static=0.60, rest_memory=19.58 GB
[2026-05-15 09:09:54 TP0] KV Cache is allocated. #tokens: 1200000, KV size: 17.16 GB
";
    let d = diag_text(close);
    let f = d.findings_of("kv-pool-capped");
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].severity, Severity::Info);
    assert!(
        f[0].detail.contains("rest_memory 19.58 GB"),
        "{}",
        f[0].detail
    );
    // An EAGLE drafter whose weights load after the target's pool: still one boot.
    let d = diag_text(&SGLANG_CAPPED.replace(
        "[2026-02-04 11:30:29] Memory pool end. avail mem=77.12 GB",
        "[2026-02-04 11:30:29] Memory pool end. avail mem=77.12 GB\n[2026-02-04 11:30:30] Load weight begin. avail mem=77.10 GB",
    ));
    assert_eq!(d.logs[0].log.boots.len(), 1, "{:#?}", d.logs[0].log.boots);
    // No cap: nothing to say.
    let d = diag_text(&SGLANG_CAPPED.replace("max_total_tokens=20480", "max_total_tokens=None"));
    assert!(d.findings_of("kv-pool-capped").is_empty());
    // A cap above the profiled value: SGLang says so and uses the profiled one.
    let d = diag_text(
        "[2026-02-11 06:44:58] server_args=ServerArgs(max_total_tokens=131072)\n[2026-02-11 06:45:01] max_total_tokens=131072 is larger than the profiled value 50756. Use the profiled value instead.\n[2026-02-11 06:45:02] KV Cache is allocated. #tokens: 50756, K size: 1.00 GB, V size: 1.00 GB\n",
    );
    let f = d.findings_of("kv-pool-capped");
    assert!(
        f[0].title.contains("50756") && f[0].detail.contains("50,756"),
        "{f:?}"
    );
}

#[test]
fn tensorrt_llm_kv_forms() {
    // C++ runtime lines (TensorRT-LLM 0.x, trtllm-bench output).
    let text = "\
[TensorRT-LLM] TensorRT-LLM version: 0.17.0
[TensorRT-LLM][INFO] Memory usage when calculating max tokens in paged kv cache: total: 79.10 GiB, available: 63.62 GiB
[TensorRT-LLM][INFO] Number of blocks in KV cache primary pool: 4607
[TensorRT-LLM][INFO] Number of blocks in KV cache secondary pool: 0, onboard blocks to primary memory before reuse: true
[TensorRT-LLM][INFO] Max KV cache pages per sequence: 65
[TensorRT-LLM][INFO] Number of tokens per block: 64.
[TensorRT-LLM][INFO] [MemUsageChange] Allocated 62.99 GiB for max tokens in paged KV cache (294848).
";
    let l = EngineLog::parse(text);
    assert_eq!(l.engine.as_deref(), Some("tensorrt-llm"));
    assert_eq!(l.engine_version.as_deref(), Some("0.17.0"));
    assert_eq!(l.boots.len(), 1, "{:#?}", l.boots);
    let b = &l.boots[0];
    assert_eq!(
        (b.kv_cache_tokens, b.gpu_blocks, b.block_size, b.cpu_blocks),
        (Some(294_848), Some(4_607), Some(64), Some(0))
    );
    assert_eq!(4_607 * 64, 294_848);
    assert_eq!(
        b.kv_pool_bytes,
        Some((62.99 * 1_073_741_824.0f64).round() as u64)
    );
    // Other numbers, without the final dot.
    let l = EngineLog::parse("[TensorRT-LLM][INFO] Number of blocks in KV cache primary pool: 8219\n[TensorRT-LLM][INFO] Number of tokens per block: 32.\n[TensorRT-LLM][INFO] [MemUsageChange] Allocated 16.05 GiB for max tokens in paged KV cache (263008)\n");
    assert_eq!(l.kv_capacity().map(|x| x.0), Some(263_008));
    // Lowered lengths: the C++ form and the PyTorch backend's forms.
    let d = diag_text("[TensorRT-LLM][WARNING] maxAttentionWindow and maxSequenceLen are too large for at least one sequence to fit in kvCache. they are reduced to 5185\n[TensorRT-LLM][INFO] [MemUsageChange] Allocated 1.28 GiB for max tokens in paged KV cache (5248).\n");
    let f = d.findings_of("max-len-reduced");
    assert_eq!(f.len(), 1);
    assert!(f[0].title.contains("5,185"));
    let d = diag_text("[12/20/2025-04:21:10] [TRT-LLM] [W] Attention window size 131072 exceeds upper bound 8224 for available blocks. Reducing to 8224.\n[12/20/2025-04:21:10] [TRT-LLM] [W] Adjusted max_seq_len to 8224\n[TensorRT-LLM][INFO] [MemUsageChange] Allocated 0.56 GiB for max tokens in paged KV cache (8224).\n[12/20/2025-04:21:10] [TRT-LLM] [I] max_seq_len=8224, max_num_requests=64, max_num_tokens=8192, max_batch_size=64\n");
    let f = d.findings_of("max-len-reduced");
    assert_eq!(f.len(), 2, "{:#?}", d.findings);
    assert!(f[0].detail.contains("131,072"));
    assert_eq!(d.logs[0].log.boots[0].context_len, Some(8_224));
    // A small allocation replaced by the real one stays one boot.
    let l = EngineLog::parse("[TensorRT-LLM][INFO] [MemUsageChange] Allocated 0.03 GiB for max tokens in paged KV cache (1024).\n[TensorRT-LLM][INFO] [MemUsageChange] Allocated 62.99 GiB for max tokens in paged KV cache (294848).\n");
    assert_eq!(l.boots.len(), 1, "{:#?}", l.boots);
    assert_eq!(l.boots[0].kv_cache_tokens, Some(294_848));
    assert_eq!(l.boots[0].replaced_allocation, Some((1_024, 1)));
}

// ---- kernels: native FP4 and weight-only paths -------------------------------------------------

#[test]
fn native_fp4_kernels_are_concluded_and_shown() {
    for (line, what, kernel, path) in [
        // vLLM 0.26 on an RTX 5090 and on GB10.
        (
            "INFO 08-01 10:00:00 [__init__.py:1077] Using FlashInferCutlassNvFp4LinearKernel for NVFP4 GEMM",
            "NVFP4 GEMM",
            "FlashInferCutlassNvFp4LinearKernel",
            KernelPath::NativeFp4,
        ),
        (
            "INFO 08-01 10:00:00 [nvfp4.py:222] Using 'VLLM_CUTLASS' NvFp4 MoE backend out of potential backends: ['FLASHINFER_TRTLLM', 'FLASHINFER_CUTEDSL', 'FLASHINFER_CUTLASS', 'VLLM_CUTLASS', 'MARLIN']",
            "NVFP4 MoE",
            "VLLM_CUTLASS",
            KernelPath::NativeFp4,
        ),
        (
            "Using FlashInfer CuteDSL NVFP4 MoE backend out of potential backends: [FlashInfer CuteDSL, Triton, Emulation]",
            "NVFP4 MoE",
            "FlashInfer CuteDSL",
            KernelPath::NativeFp4,
        ),
        (
            "[TensorRT-LLM][INFO] Using cuBLASLt backend for NVFP4 GEMM",
            "NVFP4 GEMM",
            "cuBLASLt",
            KernelPath::NativeFp4,
        ),
        (
            "INFO 08-01 10:00:00 [__init__.py:1077] Using NvFp4LinearBackend.MARLIN for NVFP4 GEMM",
            "NVFP4 GEMM",
            "NvFp4LinearBackend.MARLIN",
            KernelPath::WeightOnly,
        ),
        (
            "INFO 09-07 10:00:00 [__init__.py:1077] Using FlashInferCuteDslNvFp4W4A16LinearKernel for NVFP4 GEMM",
            "NVFP4 GEMM",
            "FlashInferCuteDslNvFp4W4A16LinearKernel",
            KernelPath::WeightOnly,
        ),
    ] {
        let d = diag_text(line);
        let c = &d.logs[0].log.kernel_choices;
        assert_eq!(c.len(), 1, "{line}");
        assert_eq!((c[0].what.as_str(), c[0].kernel.as_str()), (what, kernel));
        assert_eq!(c[0].path(), path, "{line}");
        let native = d.findings_of("fp4-native");
        assert_eq!(native.len(), usize::from(path == KernelPath::NativeFp4), "{line}");
        let md = render::render_markdown(&d);
        assert!(md.contains("### Kernels named in"), "{md}");
        if path == KernelPath::NativeFp4 {
            assert!(md.contains("FP4 tensor cores (native)"));
            assert!(md.contains("the card runs FP4 natively"), "{md}");
        }
    }
    // The Marlin choice alone raises the Marlin finding.
    let d = diag_text(
        "INFO 08-01 10:00:00 [__init__.py:1077] Using NvFp4LinearBackend.MARLIN for NVFP4 GEMM",
    );
    assert_eq!(d.findings_of("marlin-fp4-fallback").len(), 1);
}

fn marlin_log(version: Option<&str>) -> String {
    let (_, text) = {
        let d = crate::real_fixture("logs");
        let p = std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with("06_"))
            .expect("fixture logs/06_");
        ((), std::fs::read_to_string(p.path()).unwrap())
    };
    match version {
        Some(v) => {
            format!("INFO 03-17 17:00:00 [api_server.py:1] vLLM API server version {v}\n{text}")
        }
        None => text,
    }
}

fn marlin_verdict(version: Option<&str>, cc: &str) -> Finding {
    let mut d = Diagnosis {
        logs: vec![LogInput {
            name: "engine.log".into(),
            log: EngineLog::parse(&marlin_log(version)),
        }],
        card: Some(Card {
            cc: cc.parse().unwrap(),
            source: "--cc".into(),
        }),
        ..Default::default()
    };
    d.findings = build_findings(&d);
    d.findings_of("marlin-fp4-fallback")[0].clone()
}

#[test]
fn marlin_fallback_keyed_on_vllm_version_and_card() {
    // Humming on sm_90 from vLLM 0.32, FlashInfer CuTe-DSL on sm_100/103 from 0.30.
    let f = marlin_verdict(Some("0.33.0"), "sm_90");
    assert_eq!(f.severity, Severity::Warning, "{}", f.detail);
    assert!(
        f.title.contains("not expected") && f.detail.contains("Humming"),
        "{}",
        f.detail
    );
    let f = marlin_verdict(Some("0.34.1"), "sm_100");
    assert_eq!(f.severity, Severity::Warning);
    assert!(f.detail.contains("FlashInfer CuTe-DSL"), "{}", f.detail);
    let f = marlin_verdict(Some("0.33.0rc2"), "sm_103");
    assert_eq!(f.severity, Severity::Warning);
    let f = marlin_verdict(Some("0.30.0"), "sm_100");
    assert_eq!(f.severity, Severity::Warning, "{}", f.detail);
    // Before 0.32, Marlin on sm_90: expected there.
    let f = marlin_verdict(Some("0.31.0"), "sm_90");
    assert_eq!(f.severity, Severity::Info, "{}", f.detail);
    assert!(f.title.contains("expected on sm_90"));
    // Marlin elsewhere in every version.
    let f = marlin_verdict(Some("0.33.0"), "sm_89");
    assert_eq!(f.severity, Severity::Info, "{}", f.detail);
    // The version unknown: both rules are stated, nothing is concluded.
    let f = marlin_verdict(None, "sm_90");
    assert_eq!(f.severity, Severity::Info);
    assert!(f.detail.contains("0.32"), "{}", f.detail);
    assert!(
        f.detail.contains("does not state the version"),
        "{}",
        f.detail
    );
}

/// MoE experts follow their own rule (`fused_moe/oracle/nvfp4.py`): no FlashInfer MoE backend
/// takes BF16 activations, so weight-only NVFP4 experts run on Marlin on sm_100 in every
/// version (the dense rule's CuTe-DSL would call that a fault), and on Humming on sm_90 from
/// 0.32.
#[test]
fn marlin_for_moe_experts_is_keyed_on_the_moe_rule() {
    let moe = |version: &str, cc: &str| {
        let text = format!(
            "INFO 03-17 17:00:00 [api_server.py:1] vLLM API server version {version}\n(EngineCore pid=274) WARNING 06-12 08:49:29 [marlin_utils_fp4.py:1] {}\n(EngineCore pid=274) INFO 06-12 08:49:30 [nvfp4.py:222] Using 'MARLIN' NvFp4 MoE backend\n",
            crate::checkpoint::predict::MARLIN_FP4_WARNING
        );
        let mut d = Diagnosis {
            logs: vec![LogInput {
                name: "engine.log".into(),
                log: EngineLog::parse(&text),
            }],
            card: Some(Card {
                cc: cc.parse().unwrap(),
                source: "--cc".into(),
            }),
            ..Default::default()
        };
        d.findings = build_findings(&d);
        d.findings_of("marlin-fp4-fallback")[0].clone()
    };
    let f = moe("0.34.0", "sm_100");
    assert!(
        !f.title.contains("not expected"),
        "{}: {}",
        f.title,
        f.detail
    );
    assert_ne!(f.severity, Severity::Warning, "{}", f.detail);
    let f = moe("0.34.0", "sm_90");
    assert_eq!(f.severity, Severity::Warning, "{}", f.detail);
    assert!(
        f.detail.contains("Humming") && f.detail.contains("MoE"),
        "{}",
        f.detail
    );
    let f = moe("0.31.0", "sm_90");
    assert_ne!(f.severity, Severity::Warning, "{}", f.detail);
}

// ---- events grouped by process and boot ----------------------------------------------------------

#[test]
fn two_failed_starts_with_two_pids_are_two_errors() {
    let err = "ValueError: To serve at least one request with the models's max seq len (262144), (24.0 GiB KV cache is needed, which is larger than the available KV cache memory (9.97 GiB).";
    // Without any boot line: the pids tell the two runs apart.
    let text = format!(
        "(EngineCore_DP0 pid=200) ERROR 06-01 04:42:29 [core.py:700] EngineCore failed to start.\n(EngineCore_DP0 pid=200) ERROR 06-01 04:42:29 [core.py:700] {err}\n(EngineCore_DP0 pid=400) ERROR 06-01 04:45:10 [core.py:700] EngineCore failed to start.\n(EngineCore_DP0 pid=400) ERROR 06-01 04:45:10 [core.py:700] {err}\n"
    );
    let d = diag_text(&text);
    let f = d.findings_of("kv-too-small-for-max-len");
    assert_eq!(f.len(), 2, "{:#?}", d.findings);
    assert!(f[0].detail.contains("pid 200") && f[1].detail.contains("pid 400"));
    // With boot lines from two API servers: two boots, each with its error.
    let text = format!(
        "(APIServer pid=100) INFO 06-01 04:42:00 [api_server.py:1] vLLM API server version 0.11.0\n(EngineCore_DP0 pid=200) ERROR 06-01 04:42:29 [core.py:700] {err}\n(APIServer pid=300) INFO 06-01 04:45:00 [api_server.py:1] vLLM API server version 0.11.0\n(EngineCore_DP0 pid=400) ERROR 06-01 04:45:10 [core.py:700] {err}\n"
    );
    let l = EngineLog::parse(&text);
    assert_eq!(l.boots.len(), 2, "{:#?}", l.boots);
    assert_eq!(l.errors.len(), 2);
    assert_eq!((l.errors[0].boot, l.errors[1].boot), (Some(1), Some(2)));
    // A new engine-core pid after the first one failed, without a banner: a new boot.
    let text = format!(
        "(EngineCore_DP0 pid=200) INFO 06-01 04:42:20 [gpu_worker.py:1] Available KV cache memory: 9.97 GiB\n(EngineCore_DP0 pid=200) ERROR 06-01 04:42:29 [core.py:700] {err}\n(EngineCore_DP0 pid=400) INFO 06-01 04:45:00 [gpu_worker.py:1] Available KV cache memory: 9.97 GiB\n(EngineCore_DP0 pid=400) ERROR 06-01 04:45:10 [core.py:700] {err}\n"
    );
    let l = EngineLog::parse(&text);
    assert_eq!(l.boots.len(), 2, "{:#?}", l.boots);
    // A worker pool: the same message from several pids of one role is one error.
    let l = EngineLog::parse(
        "(VllmWorkerProcess pid=11) ERROR 01-01 00:00:00 [multiproc_worker_utils.py:242] Exception in worker VllmWorkerProcess while processing method load_model.\n(VllmWorkerProcess pid=12) ERROR 01-01 00:00:00 [multiproc_worker_utils.py:242] Exception in worker VllmWorkerProcess while processing method load_model.\n",
    );
    assert_eq!(l.errors.len(), 1, "{:#?}", l.errors);
    assert_eq!(l.errors[0].pids.len(), 2);
}

#[test]
fn the_same_kv_lines_printed_twice_are_one_boot() {
    let once = "\
(EngineCore pid=107) INFO 07-06 22:52:09 [gpu_worker.py:508] Available KV cache memory: 5.98 GiB
(EngineCore pid=107) INFO 07-06 22:52:09 [kv_cache_utils.py:2146] GPU KV cache size: 567,978 tokens
(EngineCore pid=107) INFO 07-06 22:52:09 [kv_cache_utils.py:2147] Maximum concurrency for 131,072 tokens per request: 4.33x
";
    let d = diag_text(&format!("{once}{once}"));
    let l = &d.logs[0].log;
    assert_eq!(l.boots.len(), 1, "{:#?}", l.boots);
    assert_eq!(l.boots[0].repeated_lines, 3);
    assert_eq!(d.findings_of("kv-capacity").len(), 1);
    assert!(d.findings_of("startup-incomplete").is_empty());
    // Other numbers from the same process: another boot.
    let other = once.replace("567,978", "401,112");
    let l = EngineLog::parse(&format!("{once}{other}"));
    assert_eq!(l.boots.len(), 2);
    assert_eq!(l.boots[1].kv_cache_tokens, Some(401_112));
}

#[test]
fn chained_tracebacks_are_one_error_with_their_cause() {
    // Plain stderr, `raise … from e`.
    let plain = "\
Traceback (most recent call last):
  File \"/x/gpu_worker.py\", line 10, in determine_available_memory
    self.model_runner.profile_run()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.06 GiB is free.

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File \"/x/core.py\", line 20, in run_engine_core
    raise RuntimeError(\"Engine core initialization failed\") from e
RuntimeError: Engine core initialization failed. See root cause above.
next line
";
    let l = EngineLog::parse(plain);
    assert_eq!(l.errors.len(), 1, "{:#?}", l.errors);
    let g = &l.errors[0];
    assert_eq!((g.line, g.last_line), (1, 11));
    assert_eq!(g.chain.len(), 2);
    assert_eq!(g.chain[1].relation.as_deref(), Some("direct cause"));
    assert!(matches!(
        g.cause,
        Some(Cause::OutOfMemory { gpu: Some(0), .. })
    ));
    let d = diag_logs(vec![("e.log".into(), l)]);
    assert!(
        d.findings_of("engine-error").is_empty(),
        "{:#?}",
        d.findings
    );
    let f = d.findings_of("out-of-memory");
    assert_eq!(f.len(), 1);
    assert!(f[0].detail.contains("direct cause"), "{}", f[0].detail);
    // `During handling …`, with an exception name that has no Error suffix.
    let handling = plain
        .replace(
            "The above exception was the direct cause of the following exception:",
            "During handling of the above exception, another exception occurred:",
        )
        .replace(
            "RuntimeError: Engine core initialization failed. See root cause above.",
            "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:",
        );
    let l = EngineLog::parse(&handling);
    assert_eq!(l.errors.len(), 1, "{:#?}", l.errors);
    assert_eq!(
        l.errors[0].chain[1].relation.as_deref(),
        Some("during handling")
    );
    assert_eq!(
        l.errors[0].exception.as_deref(),
        Some("torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:")
    );
    // Under vLLM's ERROR header: one group too.
    let headered: String = plain
        .lines()
        .take(12)
        .map(|x| format!("(EngineCore_DP0 pid=5) ERROR 06-01 04:42:29 [core.py:708] {x}\n"))
        .collect();
    let l = EngineLog::parse(&headered);
    assert_eq!(l.errors.len(), 1, "{:#?}", l.errors);
    assert_eq!(l.errors[0].chain.len(), 2);
}

#[test]
fn every_cause_of_an_error_is_reported() {
    // Two options that need sm_100, in one validation error.
    let text = "\
(APIServer pid=1) ERROR 06-01 04:42:29 [api_server.py:1] pydantic_core._pydantic_core.ValidationError: 2 validation errors for VllmConfig
(APIServer pid=1) ERROR 06-01 04:42:29 [api_server.py:1]   Value error, The quantization method mxfp4 is not supported for the current GPU. Minimum capability: 100. Current capability: 90.
(APIServer pid=1) ERROR 06-01 04:42:29 [api_server.py:1]   Value error, FlashInfer TRT-LLM attention requires compute capability 10.0, current capability: 9.0
";
    let d = diag_text(text);
    let l = &d.logs[0].log;
    assert_eq!(l.errors.len(), 1);
    assert_eq!(l.errors[0].causes.len(), 2, "{:#?}", l.errors[0].causes);
    let q = d.findings_of("quantization-unsupported");
    let c = d.findings_of("capability-too-low");
    assert_eq!((q.len(), c.len()), (1, 1), "{:#?}", d.findings);
    assert!(c[0].title.contains("sm_100"), "{}", c[0].title);
    // The card is read off the log.
    assert!(d.findings.iter().all(|f| !f.detail.is_empty()));
    // Other numbers and another form: bfloat16 on a V100, in two separate errors.
    let text = "\
ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla V100-SXM2-32GB GPU has compute capability 7.0. You can use float16 instead by explicitly setting the`dtype` flag in CLI, for example: --dtype=half.
ValueError: The quantization method fp8 is not supported for the current GPU. Minimum capability: 89. Current capability: 70.
";
    let d = diag_text(text);
    let c = d.findings_of("capability-too-low");
    assert_eq!(c.len(), 1, "{:#?}", d.findings);
    assert!(
        c[0].detail.contains("sm_80") && c[0].detail.contains("sm_70"),
        "{}",
        c[0].detail
    );
    assert_eq!(d.findings_of("quantization-unsupported").len(), 1);
    // The same cause printed twice by one process (a logger copy and a stderr copy): once.
    let oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB.";
    let d = diag_text(&format!(
        "(EngineCore pid=3) ERROR 01-01 00:00:00 [core.py:1] EngineCore encountered a fatal error.\n(EngineCore pid=3) ERROR 01-01 00:00:00 [core.py:1] Traceback (most recent call last):\n(EngineCore pid=3) ERROR 01-01 00:00:00 [core.py:1]   File \"/x.py\", line 1, in f\n(EngineCore pid=3) ERROR 01-01 00:00:00 [core.py:1] {oom}\n(EngineCore pid=3) Traceback (most recent call last):\n(EngineCore pid=3)   File \"/x.py\", line 1, in f\n(EngineCore pid=3) {oom}\n"
    ));
    assert_eq!(d.logs[0].log.errors.len(), 2, "{:#?}", d.logs[0].log.errors);
    let f = d.findings_of("out-of-memory");
    assert_eq!(f.len(), 1, "{:#?}", d.findings);
    assert!(
        f[0].detail.contains("named again at line 7"),
        "{}",
        f[0].detail
    );
    // Printed twice with the same headline: one error, counted twice.
    let d = diag_text(&format!(
        "(EngineCore pid=3) ERROR 01-01 00:00:00 [core.py:1] {oom}\n(EngineCore pid=3) {oom}\n"
    ));
    let f = d.findings_of("out-of-memory");
    assert_eq!(f.len(), 1, "{:#?}", d.findings);
    assert!(f[0].detail.contains("printed 2 times"), "{}", f[0].detail);
    // A port in use.
    let d = diag_text("OSError: [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use\n");
    assert!(matches!(
        d.logs[0].log.errors[0].cause,
        Some(Cause::PortInUse { port: Some(8000) })
    ));
    let d = diag_text("0.00.019.130 E srv    main: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080\n");
    assert!(matches!(
        d.logs[0].log.errors[0].cause,
        Some(Cause::PortInUse { port: Some(8080) })
    ));
}

// ---- speculative decoding ---------------------------------------------------------------------

#[test]
fn sglang_accept_len_counts_the_bonus_token() {
    // SGLang `log_decode_stats`: accept len = (accepted + bs) / steps; accept rate = accept len
    // / speculative_num_draft_tokens. 1.00 means nothing accepted.
    let nothing = "\
[2025-10-20 10:00:00] server_args=ServerArgs(model_path='m', speculative_algorithm='EAGLE', speculative_num_steps=8, speculative_eagle_topk=1, speculative_num_draft_tokens=9)
[2025-10-20 10:00:10 TP0] Decode batch. #running-req: 1, #token: 100, token usage: 0.00, accept len: 1.00, accept rate: 0.11, cuda graph: True, gen throughput (token/s): 40.00, #queue-req: 0,
[2025-10-20 10:00:20 TP0] Decode batch. #running-req: 1, #token: 140, token usage: 0.00, accept len: 1.00, accept rate: 0.11, cuda graph: True, gen throughput (token/s): 40.00, #queue-req: 0,
";
    let d = diag_text(nothing);
    let f = d.findings_of("spec-accepts-nothing");
    assert_eq!(f.len(), 1, "{:#?}", d.findings);
    assert!(
        f[0].title.contains("0.00%") && f[0].title.contains("k = 8"),
        "{}",
        f[0].title
    );
    assert!(!f[0].title.contains("11"), "{}", f[0].title);
    assert!(
        f[0].detail.contains("0.11 (SGLang's accept rate"),
        "{}",
        f[0].detail
    );
    assert!(f[0].detail.contains("mean acceptance length 1.00"));
    // Other numbers: accept len 2.40 at 3 steps: (2.40 − 1) / 3 = 46.67%.
    let good = "\
[2025-03-08 12:29:05] server_args=ServerArgs(speculative_algorithm='EAGLE', speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)
[2025-03-08 12:30:01 TP0] Decode batch. #running-req: 1, #token: 120, token usage: 0.00, accept len: 2.40, accept rate: 0.60, cuda graph: True, gen throughput (token/s): 80.12, #queue-req: 0
";
    let d = diag_text(good);
    let f = d.findings_of("spec-decoding");
    assert!(
        f[0].title.contains("46.67%") && f[0].title.contains("k = 3"),
        "{}",
        f[0].title
    );
    // Without the configuration (k unknown): judged on the accept len alone.
    let d = diag_text(&nothing.lines().skip(1).collect::<Vec<_>>().join("\n"));
    let f = d.findings_of("spec-accepts-nothing");
    assert_eq!(f.len(), 1, "{:#?}", d.findings);
    assert!(f[0].title.contains("mean acceptance length 1.00"));
    let d = diag_text(&good.lines().skip(1).collect::<Vec<_>>().join("\n"));
    let f = d.findings_of("spec-decoding");
    assert!(
        f[0].title.contains("mean acceptance length 2.40"),
        "{}",
        f[0].title
    );
    assert!(!f[0].title.contains('%'), "{}", f[0].title);
}

#[test]
fn llamacpp_statistics_lines_and_ngram_method() {
    // `common/speculative.cpp` statistics, cumulative per implementation (llama.cpp docs).
    let text = "\
spec common_specu: adding speculative implementation 'ngram-simple'
statistics ngram_simple: #calls = 10, #gen drafts = 3, #acc drafts = 3, #gen tokens = 100, #acc tokens = 40
statistics ngram_simple: #calls = 15, #gen drafts = 5, #acc drafts = 5, #gen tokens = 187, #acc tokens = 73
";
    let d = diag_text(text);
    let l = &d.logs[0].log;
    assert_eq!(l.spec_config.method.as_deref(), Some("ngram-simple"));
    let p = l.spec_pooled().unwrap();
    // Cumulative: the last line counts, not the sum.
    assert_eq!((p.accepted, p.drafted, p.drafts), (73, 187, Some(5)));
    assert!((p.mean_acceptance_length.unwrap() - (1.0 + 73.0 / 5.0)).abs() < 1e-9);
    let f = d.findings_of("spec-decoding");
    assert!(f[0].detail.contains("n-gram"), "{}", f[0].detail);
    // Per-request lines present: the statistics are not counted twice.
    let both = format!("{text}slot print_timing: id  0 | task 1 | draft acceptance = 0.50000 (   10 accepted /    20 generated), mean len =  2.00\n");
    let p = EngineLog::parse(&both).spec_pooled().unwrap();
    assert_eq!((p.accepted, p.drafted), (10, 20));
    // The newer `#calls(b,g,a)` form and MTP.
    let l = EngineLog::parse("[44105] 2.16.555.910 I statistics        draft-mtp: #calls(b,g,a) =    3   1922   1924, #gen drafts =   1924, #acc drafts =  1520, #gen tokens =   9620, #acc tokens =  4084, dur(b,g,a) = 0.003, 29216.128, 0.526 ms\n");
    assert_eq!(l.spec_config.method.as_deref(), Some("mtp"));
    assert_eq!(l.spec_lines[0].accepted, Some(4_084));
    // --spec-type on a command line in the log.
    let l =
        EngineLog::parse("+ llama-server -m m.gguf --spec-type ngram-mod --spec-ngram-size-n 8\n");
    assert_eq!(l.spec_config.method.as_deref(), Some("ngram-mod"));
}

// ---- redaction of inputs only ------------------------------------------------------------------

#[test]
fn redaction_rewrites_inputs_never_rigbench_words() {
    let mut d = diag_logs(vec![(
        "alice-host.log".into(),
        EngineLog::parse("FileNotFoundError: /home/alice/models/x/config.json\n"),
    )]);
    let r = |s: &str| {
        s.replace("/home/alice", "<home>")
            .replace("alice-host", "<host>")
    };
    redact_inputs(&mut d, &r);
    d.findings = build_findings(&d);
    let md = render::render_markdown(&d);
    assert!(
        !md.contains("/home/alice") && !md.contains("alice-host"),
        "{md}"
    );
    assert!(md.contains("<home>/models/x/config.json"), "{md}");
    assert!(md.contains("## rigbench diagnose"));
}

#[test]
fn the_redactor_keeps_rates_and_llama_timestamps() {
    // The redaction code's own words: rates are not secrets, llama.cpp's elapsed-time stamps
    // (`0.10.110.130 I …`, after a `[pid] ` too) are not addresses; real ones still go.
    let r = crate::output::redact::Redactor::with_literals(Vec::new(), true);
    let s = r.redact("KV bytes per token = full-attention layers × 2");
    assert_eq!(s, "KV bytes per token = full-attention layers × 2");
    assert!(r.redact("api_key = abcdefghijkl").contains("<token>"));
    let line = "0.10.110.130 I slot print_timing: id  1 | task 797 | eval time = 459.47 ms";
    assert_eq!(r.redact(line), line);
    let pid = "[44105] 2.16.555.898 I slot print_timing: id  1";
    assert_eq!(r.redact(pid), pid);
    assert_eq!(
        r.redact("connecting to 10.1.2.130 I think"),
        "connecting to <ip> I think"
    );
    assert!(r.redact("10.1.2.3 connected").contains("<ip>"));
}
