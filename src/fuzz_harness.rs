//! One entry point per parser of input written by other programs, shared by the coverage-guided
//! fuzz targets (`fuzz/`, cargo-fuzz + libFuzzer, run by `scripts/fuzz`) and by the regression
//! tests (`tests/fuzz_regressions.rs`) that replay every committed crash and seed input.
//!
//! Each function takes arbitrary bytes, feeds them to the parser the way rigbench meets such a
//! file or stream, then uses what parsed (queries, comparisons, rendering) the way the commands
//! do. The contract is the project's: an `Err` is fine, a panic is a bug. Parsers that read files
//! (safetensors, checkpoint configs, results) get the bytes through a scratch folder per thread,
//! next to copies of the committed fixture `tests/fixtures/checkpoints/qwen36-mixed-clean`.
//!
//! Targets (the names of `fuzz/fuzz_targets/*.rs` and of the corpus folders): [`TARGETS`].

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A fuzz target's entry point: one input, any bytes.
pub type Target = fn(&[u8]);

/// The fuzz targets, by name, with the function that runs one input.
pub const TARGETS: &[(&str, Target)] = &[
    ("safetensors_header", safetensors_header),
    ("config_json", config_json),
    ("hf_quant_config", hf_quant_config),
    ("prometheus", prometheus),
    ("sse", sse),
    ("engine_log", engine_log),
    ("suite_toml", suite_toml),
    ("results_json", results_json),
    ("gguf_header", gguf_header),
    ("nvidia_smi", nvidia_smi),
];

const FIXTURE_CONFIG: &[u8] =
    include_bytes!("../tests/fixtures/checkpoints/qwen36-mixed-clean/config.json");
const FIXTURE_HF_QUANT: &[u8] =
    include_bytes!("../tests/fixtures/checkpoints/qwen36-mixed-clean/hf_quant_config.json");
const FIXTURE_SAFETENSORS: &[u8] =
    include_bytes!("../tests/fixtures/checkpoints/qwen36-mixed-clean/model.safetensors");
const CI_BASELINE: &str = include_str!("../baselines/ci-cpu/qwen3.6-27b.json");

thread_local! {
    static SCRATCH: RefCell<Option<tempfile::TempDir>> = const { RefCell::new(None) };
}

/// Run `f` with this thread's scratch folder (created once; files from earlier inputs are
/// removed by the callers that need a clean folder).
fn with_scratch<R>(f: impl FnOnce(&Path) -> R) -> Option<R> {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.is_none() {
            *s = tempfile::Builder::new()
                .prefix("rigbench-fuzz-")
                .tempdir()
                .ok();
        }
        s.as_ref().map(|d| f(d.path()))
    })
}

fn put(dir: &Path, name: &str, bytes: &[u8]) -> Option<PathBuf> {
    let p = dir.join(name);
    std::fs::write(&p, bytes).ok()?;
    Some(p)
}

fn clear(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn inspect_options() -> crate::checkpoint::InspectOptions {
    crate::checkpoint::InspectOptions {
        cc: Some(crate::gpu::ComputeCapability {
            major: 12,
            minor: 0,
        }),
        card: Some("fuzz".into()),
        gpu_memory_bytes: Some(32 << 30),
        gpu_memory_source: Some("fuzz".into()),
        ..Default::default()
    }
}

/// Inspect the checkpoint in `dir` and render what came out, as `rigbench inspect` does.
fn inspect_and_render(dir: &Path) {
    if let Ok(r) = crate::checkpoint::inspect(dir, &inspect_options()) {
        let _ = crate::checkpoint::render_markdown(&r);
        let _ = r.has_errors();
        let _ = serde_json::to_string(&r);
    }
}

/// A whole `model.safetensors` file: the 8-byte little-endian header length, the JSON header,
/// the data. Read with [`crate::checkpoint::headers::read_header`].
pub fn safetensors_header(data: &[u8]) {
    with_scratch(|dir| {
        if let Some(p) = put(dir, "model.safetensors", data) {
            let _ = crate::checkpoint::headers::read_header(&p, "model.safetensors");
        }
    });
}

/// A whole GGUF file: header, metadata, tensor table and data, parsed by
/// [`crate::checkpoint::gguf::parse`]; what parses is written to a scratch file and inspected
/// and rendered as `rigbench inspect FILE.gguf` does, and its tokenizer built as the runtime
/// builds it.
pub fn gguf_header(data: &[u8]) {
    if crate::checkpoint::gguf::parse(data).is_err() {
        return;
    }
    with_scratch(|dir| {
        clear(dir);
        if let Some(p) = put(dir, "model.gguf", data) {
            if let Ok(g) = crate::checkpoint::gguf::Gguf::open(&p) {
                let r = crate::checkpoint::gguf_inspect::inspect_gguf(&g, &Default::default());
                let _ = crate::checkpoint::gguf_inspect::render_markdown(&r);
                let _ = serde_json::to_string(&r);
            }
        }
    });
}

/// `config.json` (with or without an inline `quantization_config`), next to the fixture's
/// safetensors file; inputs of odd length also get the fixture's `hf_quant_config.json` (the
/// two-file case, where the files may disagree), inputs of even length do not (config.json
/// alone decides); inspected and rendered.
pub fn config_json(data: &[u8]) {
    with_scratch(|dir| {
        clear(dir);
        if put(dir, "config.json", data).is_none()
            || put(dir, "model.safetensors", FIXTURE_SAFETENSORS).is_none()
        {
            return;
        }
        if data.len() % 2 == 1 && put(dir, "hf_quant_config.json", FIXTURE_HF_QUANT).is_none() {
            return;
        }
        inspect_and_render(dir);
    });
}

/// `hf_quant_config.json` (ModelOpt), next to the fixture's config.json and safetensors file;
/// inspected and rendered.
pub fn hf_quant_config(data: &[u8]) {
    with_scratch(|dir| {
        clear(dir);
        if put(dir, "config.json", FIXTURE_CONFIG).is_none()
            || put(dir, "model.safetensors", FIXTURE_SAFETENSORS).is_none()
            || put(dir, "hf_quant_config.json", data).is_none()
        {
            return;
        }
        inspect_and_render(dir);
    });
}

/// Prometheus exposition text (or a pasted query table), then every query the e2e driver makes
/// of a scrape.
pub fn prometheus(data: &[u8]) {
    use crate::e2e::conditions::{cache_condition, kv_capacity, spec_condition, CacheExpectation};
    let text = String::from_utf8_lossy(data);
    let e = crate::diagnose::prometheus::Exposition::parse(&text);
    let empty = crate::diagnose::prometheus::Exposition::default();
    for name in [
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_hits",
        "vllm:spec_decode_num_accepted_tokens",
        "vllm:time_to_first_token_seconds",
    ] {
        let _ = e.sum(name);
        let _ = e.max(name);
        let _ = e.histogram(name);
        let _ = e.sum_by(name, "position");
        let _ = e.labels_of(name);
    }
    let _ = kv_capacity(Some(&e), None);
    let facts = crate::e2e::conditions::EngineFacts::default();
    let _ = spec_condition(Some(&empty), Some(&e), &facts);
    let _ = spec_condition(Some(&e), Some(&e), &facts);
    for temperature in [
        crate::e2e::workload::CacheTemp::Cold,
        crate::e2e::workload::CacheTemp::Warm,
    ] {
        let _ = cache_condition(
            Some(&empty),
            Some(&e),
            CacheExpectation {
                temperature,
                reset: Some(true),
                hits_allowed: 0,
            },
        );
    }
    let mut stats = crate::e2e::conditions::PollStats::default();
    stats.add(&e);
}

/// A server-sent event stream as an engine sends it: the first byte picks how the bytes are cut
/// into network reads; every completed event is applied to a request's outcome.
pub fn sse(data: &[u8]) {
    let Some((&cut, body)) = data.split_first() else {
        return;
    };
    let step = usize::from(cut % 64) + 1;
    let mut dec = crate::e2e::sse::SseDecoder::default();
    let mut out = crate::e2e::stream::StreamOutcome::default();
    let mut at = Duration::ZERO;
    for chunk in body.chunks(step) {
        at += Duration::from_millis(1);
        match dec.push(chunk) {
            Ok(events) => {
                for ev in events {
                    if out.apply(at, &ev).is_err() {
                        return;
                    }
                }
            }
            Err(_) => return,
        }
    }
    if let Some(ev) = dec.finish() {
        let _ = out.apply(at, &ev);
    }
}

/// An engine log (vLLM, SGLang, llama.cpp), then the findings `diagnose` and the e2e driver
/// derive from it.
pub fn engine_log(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let log = crate::e2e::bootlog::BootLog::parse(&text);
    let _ = log.kv_capacity();
    let _ = log.spec_pooled();
    let _ = log.is_empty();
    let _ = crate::e2e::conditions::kv_capacity(None, Some(&log));
    let _ = serde_json::to_string(&log);
    // The findings `diagnose` builds from it, with a card that has FP4 tensor cores and one
    // that has none (the cross-line joins: candidates passed over, capability causes).
    for cc in [None, Some((12, 0)), Some((8, 9))] {
        let mut d = crate::diagnose::Diagnosis {
            logs: vec![crate::diagnose::LogInput {
                name: "fuzz.log".into(),
                log: crate::diagnose::log::EngineLog::parse_bytes(data),
            }],
            card: cc.map(|(a, b)| crate::diagnose::Card {
                cc: crate::gpu::ComputeCapability::new(a, b),
                source: "--cc".into(),
            }),
            ..Default::default()
        };
        d.findings = crate::diagnose::build_findings(&d);
        let _ = crate::diagnose::render::render_markdown(&d);
    }
}

/// The text of `nvidia-smi -q`, then the findings `diagnose --nvidia-smi` builds from it.
pub fn nvidia_smi(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let r = crate::diagnose::nvidia_smi::parse("fuzz.txt", &text);
    let mut d = crate::diagnose::Diagnosis {
        nvidia_smi: vec![r],
        timing: Some("a report".into()),
        ..Default::default()
    };
    d.findings = crate::diagnose::build_findings(&d);
    let _ = crate::diagnose::render::render_markdown(&d);
    let _ = serde_json::to_string(&d);
}

/// A suite file: parsed both as a kernel suite (`suites/kernels/*.toml`) and as an e2e suite
/// (`suites/e2e/*.toml`).
pub fn suite_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("fuzz.toml");
    let _ = crate::kernels::suite::parse(text, path);
    if let Ok(s) = crate::e2e::workload::Suite::from_toml(text, path) {
        let _ = s.validate();
        let _ = s.output_fixed();
    }
}

fn ci_baseline() -> Option<&'static crate::report::Results> {
    static B: std::sync::OnceLock<Option<crate::report::Results>> = std::sync::OnceLock::new();
    B.get_or_init(|| serde_json::from_str(CI_BASELINE).ok())
        .as_ref()
}

/// A `results.json` (a report's, or a baseline: the same schema): loaded, compared both ways
/// against the committed CI baseline, and rendered as `report --render` would.
pub fn results_json(data: &[u8]) {
    with_scratch(|dir| {
        let Some(p) = put(dir, "results.json", data) else {
            return;
        };
        let Ok(r) = crate::report::Results::load(&p) else {
            return;
        };
        let settings = crate::compare::Settings::default();
        if let Some(b) = ci_baseline() {
            let _ = crate::compare::compare_results(b, &r, &settings);
            let _ = crate::compare::compare_results(&r, b, &settings);
        }
        let _ = crate::compare::compare_results(&r, &r, &settings);
        let redactor = crate::output::redact::Redactor::disabled();
        let files = ["results.json".to_string(), "engine.log".to_string()];
        let _ = crate::report::markdown::render(&r, &[], &files, &redactor);
    });
}
