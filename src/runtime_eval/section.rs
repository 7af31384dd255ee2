//! The built-in runtime's part of `rigbench report` on a GPU rig: correct before fast (parity
//! of the CUDA backend with the CPU backend on identical weights, before any timing), then per
//! weight format (BF16, FP8, W4A16) on identical weights: an end-to-end session against
//! `rigbench serve --device cuda:N`, the runtime benchmarks ([`super::bench`]) with the decode
//! bound and prefill fraction from the kernel bench of the same run, and the fidelity of FP8 and
//! W4A16 against BF16 ([`super::check::fidelity`]). Every figure carries backend, device, model
//! provenance, weight format and KV dtype.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::bench::{RuntimeBench, RuntimeBenchSpec};
use super::check::{
    FidelityReport, ParityReport, ParityTolerance, FIDELITY_PROMPTS, FIDELITY_TOKENS,
};
use crate::e2e::E2eResults;
use crate::runtime::backend::cpu::CpuBackend;
use crate::runtime::backend::cuda::{CudaBackend, CudaLoadSpec, WeightSource};
use crate::runtime::backend::Backend;
use crate::runtime::config::{KvCacheDtype, ModelConfig, WeightFormat};

/// The formats the report runs, in order (BF16 first: the reference).
pub const REPORT_FORMATS: [WeightFormat; 3] =
    [WeightFormat::Bf16, WeightFormat::Fp8, WeightFormat::Nvfp4];

/// The GPU runtime's results in a report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RuntimeSection {
    /// The `--model` (a synthetic preset or a checkpoint folder).
    pub model: String,
    /// The device (`cuda:0`).
    pub device: String,
    /// The parity check run before any timing.
    pub parity: Option<ParityReport>,
    /// One entry per weight format.
    pub formats: Vec<FormatRun>,
    /// FP8 and W4A16 against BF16.
    pub fidelity: Vec<FidelityReport>,
    /// Parts not run, with the reason.
    pub skipped: Vec<String>,
}

/// One format's runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FormatRun {
    /// `bf16`, `fp8`, `nvfp4` (W4A16).
    pub format: String,
    /// The end-to-end session against `rigbench serve`.
    pub e2e: Option<E2eResults>,
    /// The runtime benchmarks.
    pub bench: Option<RuntimeBench>,
    /// What failed, if anything.
    pub error: Option<String>,
    /// Batch-1 decode at 128, 4k and 32k contexts with the per-op profile of one step at 128
    /// and 4k ([`super::decode_profile`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decode_contexts: Vec<super::decode_profile::ContextDecode>,
    /// The decode-attention kernel those rows ran with, in words (absent in older results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_attention: Option<String>,
}

/// What [`run_gpu`] needs.
#[derive(Debug, Clone)]
pub struct RuntimeReportOptions {
    /// `synthetic:NAME` or a checkpoint folder.
    pub model: String,
    /// CUDA ordinal.
    pub device: usize,
    /// Seed of synthetic weights.
    pub seed: u64,
    /// The e2e options (suite, timeouts); the engine is set per format.
    pub e2e: crate::e2e::E2eOptions,
    /// Benchmark sizes.
    pub bench: RuntimeBenchSpec,
    /// Total GPU memory, for `inspect`'s KV prediction.
    pub gpu_memory_bytes: Option<u64>,
}

fn is_gguf(model: &str) -> bool {
    !model.starts_with("synthetic:")
        && crate::checkpoint::gguf::is_gguf_path(std::path::Path::new(model))
}

fn load_cuda(
    o: &RuntimeReportOptions,
    config: &ModelConfig,
    quantize: Option<WeightFormat>,
    host: Option<&crate::runtime::weights::ModelWeights>,
) -> anyhow::Result<CudaBackend> {
    let weights = match (o.model.strip_prefix("synthetic:"), host) {
        (_, Some(w)) => WeightSource::Host(Box::new(w.clone())),
        (Some(_), None) => WeightSource::Synthetic {
            config: config.clone(),
            seed: o.seed,
        },
        (None, None) => WeightSource::Checkpoint {
            dir: o.model.clone().into(),
            config: config.clone(),
        },
    };
    let quantize = quantize.map(crate::runtime::config::QuantRecipe::from);
    let bench = o.bench.for_model(config);
    CudaBackend::load(CudaLoadSpec {
        device: o.device,
        weights,
        quantize,
        max_num_batched_tokens: bench.prefill_tokens.max(bench.batch_context).max(2048),
        max_num_seqs: bench.batch.max(FIDELITY_PROMPTS.len()),
        max_model_len: (bench.prefill_tokens + 1)
            .max(bench.batch_context + bench.batch_tokens)
            .max(super::decode_profile::MAX_CONTEXT + super::decode_profile::TIMED_STEPS + 16),
        kv_dtype: KvCacheDtype::Bf16,
        block_size: bench.block_size,
    })
}

fn model_config(model: &str) -> anyhow::Result<ModelConfig> {
    if is_gguf(model) {
        let g = crate::checkpoint::gguf::Gguf::open(std::path::Path::new(model))?;
        return Ok(crate::runtime::gguf_model::model_config(&g)?.0);
    }
    match model.strip_prefix("synthetic:") {
        Some(p) => ModelConfig::preset(p).ok_or_else(|| {
            crate::RigError::flag("--model", format!("unknown preset synthetic:{p}")).into()
        }),
        None => Ok(
            ModelConfig::read_hf_config(&std::path::Path::new(model).join("config.json"))?.config,
        ),
    }
}

/// The tokenizer the model is served with: the byte-level one of the synthetic presets, a
/// checkpoint's `tokenizer.json`, or a GGUF file's vocabulary. The fidelity prompts are encoded
/// with it (real text as the model's own tokens, not bytes).
fn model_tokenizer(
    model: &str,
    config: &ModelConfig,
) -> anyhow::Result<crate::runtime::tokenizer::Tokenizer> {
    if model.starts_with("synthetic:") {
        return crate::runtime::tokenizer::Tokenizer::bytes(config.vocab_size, &[]);
    }
    if is_gguf(model) {
        let g = crate::checkpoint::gguf::Gguf::open(std::path::Path::new(model))?;
        let (hf, v) = crate::runtime::gguf_tokenizer::build(&g)?;
        return Ok(crate::runtime::tokenizer::Tokenizer::from_hf(
            hf,
            &config.eos_token_ids,
            v.bos.map(|b| b.0),
            v.eos.map(|e| e.0),
            "GGUF metadata".into(),
        ));
    }
    let dir = std::path::Path::new(model);
    if dir.join("tokenizer.json").is_file() {
        crate::runtime::tokenizer::Tokenizer::from_dir(dir, &config.eos_token_ids)
    } else {
        crate::runtime::tokenizer::Tokenizer::bytes(config.vocab_size, &config.eos_token_ids)
    }
}

fn provenance(o: &RuntimeReportOptions) -> String {
    if is_gguf(&o.model) {
        return match crate::checkpoint::gguf::Gguf::open(std::path::Path::new(&o.model)) {
            Ok(g) => format!("GGUF {} ({})", o.model, g.content_hash()),
            Err(e) => format!("GGUF {} (not opened: {e:#})", o.model),
        };
    }
    match o.model.strip_prefix("synthetic:") {
        Some(_) => format!("{} seed {}", o.model, o.seed),
        None => {
            match ModelConfig::read_hf_config(&std::path::Path::new(&o.model).join("config.json"))
                .and_then(|h| {
                    crate::runtime::weights::MappedCheckpoint::open(
                        std::path::Path::new(&o.model),
                        &h.config,
                    )
                }) {
                Ok(m) => format!("checkpoint {} ({})", o.model, m.content_hash()),
                Err(e) => format!("checkpoint {} (not opened: {e:#})", o.model),
            }
        }
    }
}

/// Correct before fast: the CUDA backend against the CPU backend on `synthetic:tiny` weights
/// (`synthetic:tiny-hybrid` when the report's model is a Gated-DeltaNet hybrid; identical:
/// passed as host weights), greedy tokens for 64 steps on 8 prompts and logits within
/// [`ParityTolerance::bf16_vs_f32`]. The CPU backend rounds to BF16 where the CUDA backend does
/// ([`CpuBackend::with_gpu_rounding`]), so both compute the same function up to FP32 summation
/// order and a greedy difference can only be a near-tie or a bug.
///
/// # Errors
/// The CUDA backend cannot load, or a forward fails.
pub fn gpu_parity(device: usize) -> anyhow::Result<ParityReport> {
    gpu_parity_of(device, "tiny")
}

/// [`gpu_parity`] on the synthetic preset `preset`.
///
/// # Errors
/// As [`gpu_parity`]; an unknown preset.
pub fn gpu_parity_of(device: usize, preset: &str) -> anyhow::Result<ParityReport> {
    let mc = ModelConfig::preset(preset)
        .ok_or_else(|| anyhow::anyhow!("unknown preset synthetic:{preset}"))?;
    let w = crate::runtime::weights::synthesize(&mc, 0);
    let mut cpu = CpuBackend::new(w.clone(), 2).with_gpu_rounding(true);
    let mut gpu = CudaBackend::load(CudaLoadSpec {
        device,
        weights: WeightSource::Host(Box::new(w)),
        quantize: None,
        max_num_batched_tokens: 2048,
        max_num_seqs: 8,
        max_model_len: 256,
        kv_dtype: KvCacheDtype::Bf16,
        block_size: 16,
    })?;
    let tok = crate::runtime::tokenizer::Tokenizer::bytes(mc.vocab_size, &[])?;
    let prompts: Vec<Vec<u32>> = FIDELITY_PROMPTS[..8]
        .iter()
        .map(|p| tok.encode(p, false))
        .collect::<anyhow::Result<_>>()?;
    super::check::parity(
        &mut cpu,
        &mut gpu,
        &prompts,
        64,
        ParityTolerance::bf16_vs_f32(),
    )
}

/// Run the GPU part of the report (see the module docs). Failures are recorded, never lost:
/// a failed parity check skips every timing with the reason.
pub fn run_gpu(
    o: &RuntimeReportOptions,
    kernels: Option<&crate::kernels::KernelResults>,
) -> RuntimeSection {
    let mut s = RuntimeSection {
        model: o.model.clone(),
        device: format!("cuda:{}", o.device),
        ..Default::default()
    };
    if !parity_passed(o, &mut s) {
        return s;
    }
    let config = match model_config(&o.model) {
        Ok(c) => c,
        Err(e) => {
            s.skipped.push(format!("the GPU runtime runs: {e:#}"));
            return s;
        }
    };
    let model_desc = provenance(o);
    let (bw, peak) = kernels
        .map(super::bench::roofline_of)
        .unwrap_or((None, None));
    // No kernel bench in this run: the decode bound's copy bandwidth is measured here, before
    // the runtime runs and again after it (below); the bound takes the higher of the two.
    let copy_before = if bw.is_none() {
        Some(section_copy_bandwidth(o.device))
    } else {
        None
    };
    // The prompts are the model's own tokens of real text.
    let prompts: Vec<Vec<u32>> = match model_tokenizer(&o.model, &config) {
        Ok(t) => FIDELITY_PROMPTS
            .iter()
            .filter_map(|p| t.encode(p, false).ok())
            .collect(),
        Err(e) => {
            s.skipped.push(format!(
                "fidelity: the model's tokenizer did not load: {e:#}"
            ));
            Vec::new()
        }
    };
    // A GGUF file's weights, dequantized once and handed to each CUDA load.
    let host = if is_gguf(&o.model) {
        match crate::runtime::gguf_model::GgufModel::load(std::path::Path::new(&o.model), None) {
            Ok(m) => Some(m.weights),
            Err(e) => {
                s.skipped.push(format!("the GGUF runs: {e:#}"));
                return s;
            }
        }
    } else {
        None
    };
    let ctx = FormatContext {
        o,
        config: &config,
        host: host.as_ref(),
        prompts: &prompts,
        model_desc: &model_desc,
        bw,
        peak: &peak,
    };
    for fmt in REPORT_FORMATS {
        let run = run_format(&ctx, fmt, &mut s);
        s.formats.push(run);
    }
    if bw.is_none() && s.formats.iter().any(|f| f.bench.is_some()) {
        attach_section_copy_bound(o.device, copy_before, &peak, &mut s);
    }
    s
}

/// Correct before fast: the GPU parity check of [`run_gpu`] (on the hybrid path for a hybrid
/// model: Gated-DeltaNet and gated attention kernels) into `s`; false, with every GPU timing
/// skipped and the reason, when it failed or could not run.
fn parity_passed(o: &RuntimeReportOptions, s: &mut RuntimeSection) -> bool {
    // A hybrid model is checked on the hybrid path (Gated-DeltaNet and gated attention kernels).
    let parity_preset = match model_config(&o.model) {
        Ok(c) if c.is_hybrid() => "tiny-hybrid",
        _ => "tiny",
    };
    match gpu_parity_of(o.device, parity_preset) {
        Ok(p) => {
            let passed = p.passed;
            s.parity = Some(p);
            if !passed {
                s.skipped.push("every GPU timing: the parity check against the CPU backend failed (correct before fast)".into());
                return false;
            }
        }
        Err(e) => {
            s.skipped.push(format!(
                "every GPU timing: the parity check could not run: {e:#}"
            ));
            return false;
        }
    }
    true
}

/// What every format's runs in [`run_gpu`] share.
struct FormatContext<'a> {
    o: &'a RuntimeReportOptions,
    config: &'a ModelConfig,
    /// A GGUF file's weights, dequantized once and handed to each CUDA load.
    host: Option<&'a crate::runtime::weights::ModelWeights>,
    /// The fidelity prompts (the model's own tokens of real text).
    prompts: &'a [Vec<u32>],
    model_desc: &'a str,
    /// The kernel bench's copy bandwidth, bytes/s (`None`: no kernel bench in this run).
    bw: Option<f64>,
    /// The kernel bench's BF16 peak and where it was measured.
    peak: &'a Option<(f64, String)>,
}

/// The `--max-model-len` the report gives `rigbench serve` for its end-to-end suite: what one
/// of the suite's requests holds ([`crate::e2e::workload::WorkloadSpec::max_request_tokens`])
/// plus 512 tokens for a chat template, rounded up to 1,024; `None` (the model's own maximum)
/// where the suite's prompt lengths are not fixed. Sized to the suite, not to the model's
/// maximum, so that a model whose weights leave little memory (a BF16 35B-A3B on an 80 GB card:
/// about 5 GiB left, short of one 262,144-token sequence) still serves it; the engine's command
/// line in the report shows the value.
fn e2e_context_len(w: &crate::e2e::workload::WorkloadSpec) -> Option<u32> {
    w.max_request_tokens()
        .map(|n| n.saturating_add(512).div_ceil(1024).saturating_mul(1024))
}

/// The context length the report's e2e engine runs with: [`e2e_context_len`] of the suite,
/// at most the model's `max_position_embeddings` (what it is without one; `rigbench serve`
/// refuses a longer one). The KV-capacity check predicts with the same value, as the engine
/// sizes its per-sequence state with it.
fn e2e_max_model_len(o: &RuntimeReportOptions, config: &ModelConfig) -> u64 {
    capped_context_len(&o.e2e.suite.workload, config.max_position_embeddings as u64)
}

/// [`e2e_context_len`] of `w`, at most `max` (and `max` without one).
fn capped_context_len(w: &crate::e2e::workload::WorkloadSpec, max: u64) -> u64 {
    e2e_context_len(w).map_or(max, |n| u64::from(n).min(max))
}

/// One format's runs: end to end against `rigbench serve` on the GPU, then in process (decode
/// by context, fidelity against BF16 on identical weights, the benchmarks with their roofline
/// and KV-capacity check). Failures go into the run's error or `s.skipped`.
fn run_format(ctx: &FormatContext<'_>, fmt: WeightFormat, s: &mut RuntimeSection) -> FormatRun {
    let (o, config) = (ctx.o, ctx.config);
    let mut run = FormatRun {
        format: fmt.id().into(),
        e2e: None,
        bench: None,
        error: None,
        decode_contexts: Vec::new(),
        decode_attention: None,
    };
    // End to end against `rigbench serve` on the GPU.
    let mut args = vec![
        "--model".to_string(),
        o.model.clone(),
        "--device".into(),
        format!("cuda:{}", o.device),
        "--seed".into(),
        o.seed.to_string(),
    ];
    if fmt != WeightFormat::Bf16 {
        args.extend(["--quantize".into(), fmt.id().into()]);
    }
    let len = e2e_max_model_len(o, config);
    if len < config.max_position_embeddings as u64 {
        args.extend(["--max-model-len".into(), len.to_string()]);
    }
    let mut eo = o.e2e.clone();
    eo.engine = crate::e2e::launcher::EngineChoice::Builtin {
        program: None,
        args,
    };
    match crate::e2e::run_for_report(&eo) {
        Ok(r) => run.e2e = Some(r),
        Err(e) => run.error = Some(format!("e2e: {e:#}")),
    }
    // In-process benchmarks and fidelity.
    let quantize = (fmt != WeightFormat::Bf16).then_some(fmt);
    match load_cuda(o, config, quantize, ctx.host) {
        Ok(mut b) => {
            // Decode by context first: it sizes its own KV cache, which the benchmarks'
            // engine replaces with its planned one.
            match super::decode_profile::measure(
                &mut b,
                &super::decode_profile::TOK_S_CONTEXTS,
                &super::decode_profile::PROFILE_CONTEXTS,
            ) {
                Ok(v) => {
                    run.decode_contexts = v;
                    run.decode_attention = Some(b.decode_attention().describe().to_string());
                }
                Err(e) => s
                    .skipped
                    .push(format!("decode by context of {}: {e:#}", fmt.id())),
            }
            let mut b: Box<dyn Backend> = Box::new(b);
            if fmt != WeightFormat::Bf16 {
                measure_fidelity(ctx, fmt, b.as_mut(), s);
            }
            match super::bench::run(
                b,
                o.bench.for_model(config),
                KvCacheDtype::Bf16,
                ctx.model_desc,
            ) {
                Ok((mut bench, _back)) => {
                    bench.attach_roofline(ctx.bw, ctx.peak.clone());
                    attach_kv_check(ctx, fmt, run.e2e.as_ref(), &mut bench);
                    run.bench = Some(bench);
                }
                Err(e) => run.error = Some(format!("benchmarks: {e:#}")),
            }
        }
        Err(e) => {
            let prev = run
                .error
                .take()
                .map(|x| format!("{x}; "))
                .unwrap_or_default();
            run.error = Some(format!(
                "{prev}loading {} on cuda:{}: {e:#}",
                fmt.id(),
                o.device
            ));
        }
    }
    run
}

/// Fidelity of the quantized backend `b` against the BF16 reference on identical weights,
/// loaded only for the comparison (so that no e2e session shares the GPU with it), into
/// `s.fidelity` (or why not into `s.skipped`).
fn measure_fidelity(
    ctx: &FormatContext<'_>,
    fmt: WeightFormat,
    b: &mut dyn Backend,
    s: &mut RuntimeSection,
) {
    match load_cuda(ctx.o, ctx.config, None, ctx.host) {
        Ok(mut r) => match super::check::fidelity(&mut r, b, ctx.prompts, FIDELITY_TOKENS) {
            Ok(f) => s.fidelity.push(f),
            Err(e) => s.skipped.push(format!("fidelity of {}: {e:#}", fmt.id())),
        },
        Err(e) => s.skipped.push(format!(
            "fidelity of {}: the BF16 reference did not load: {e:#}",
            fmt.id()
        )),
    }
}

/// The KV capacity the e2e run's engine allocated (its /metrics) against inspect's prediction
/// for this format's weights, attached to `bench` (when both are known).
fn attach_kv_check(
    ctx: &FormatContext<'_>,
    fmt: WeightFormat,
    e2e: Option<&E2eResults>,
    bench: &mut RuntimeBench,
) {
    let config = ctx.config;
    let allocated = e2e
        .and_then(|e| e.runs.first())
        .and_then(|r| r.conditions.kv.capacity_tokens.as_ref())
        .map(|t| t.value);
    if let (Some(a), Some(mem)) = (allocated, ctx.o.gpu_memory_bytes) {
        let w = crate::runtime::memory::estimate_weight_bytes(config, fmt);
        let per_tok = crate::runtime::kv_cache::kv_bytes_per_block(config, 1, KvCacheDtype::Bf16);
        if let Some(p) = crate::checkpoint::capacity::predict_kv_tokens_with_states(
            mem,
            0.9,
            w,
            crate::checkpoint::DEFAULT_RESERVE_BYTES,
            per_tok,
            config.gdn_state_bytes(crate::runtime::hybrid::CONV_STATE_ELEM_BYTES),
            // The e2e engine runs with rigbench serve's default sequence count and the
            // context length `run_format` gave it.
            crate::runtime::engine::DEFAULT_MAX_NUM_SEQS as u64,
            e2e_max_model_len(ctx.o, config),
        ) {
            bench.attach_kv_capacity(a, p, format!(
                "inspect's formula: {} × 0.9 − weights {} − reserve {}, ÷ {per_tok} B/token; allocated from the e2e run's /metrics",
                crate::output::table::human_bytes(mem),
                crate::output::table::human_bytes(w),
                crate::output::table::human_bytes(crate::checkpoint::DEFAULT_RESERVE_BYTES)
            ));
        }
    }
}

/// No kernel bench in this run: the decode bound's copy bandwidth, measured again after the
/// runtime ran, the higher of `copy_before` and it (its source naming both) attached to every
/// format's benchmarks.
fn attach_section_copy_bound(
    device: usize,
    copy_before: Option<anyhow::Result<crate::kernels::schema::CopyBandwidth>>,
    peak: &Option<(f64, String)>,
    s: &mut RuntimeSection,
) {
    // On the H200 the copy after the runtime read 3.76–4.12 TB/s where the one before it,
    // the kernel bench and `devcheck` read 4.17–4.23 on the same machines: the bound takes
    // the higher measurement (the tighter bound), and its source names both.
    let after = section_copy_bandwidth(device);
    let (best, source) = match (copy_before, after) {
        (Some(Ok(b)), Ok(a)) => {
            let source = format!(
                "the higher of two device-to-device copies of {} MiB measured by this section (no kernel bench in this run): {:.2} TB/s before the runtime ran, {:.2} TB/s after",
                a.bytes.max(b.bytes) >> 20,
                b.bytes_per_s / 1e12,
                a.bytes_per_s / 1e12
            );
            (
                Ok(if b.bytes_per_s > a.bytes_per_s { b } else { a }),
                source,
            )
        }
        (Some(Ok(b)), Err(e)) => {
            let source = format!(
                "a {} MiB device-to-device copy measured by this section before the runtime ran (no kernel bench in this run; the copy after it failed: {e:#})",
                b.bytes >> 20
            );
            (Ok(b), source)
        }
        (before, after) => {
            let why = match &before {
                Some(Err(e)) => format!("the copy before the runtime failed: {e:#}"),
                _ => "not measured before the runtime".to_string(),
            };
            let source = after.as_ref().map_or(String::new(), |a| {
                format!(
                    "a {} MiB device-to-device copy measured by this section after the runtime ran (no kernel bench in this run; {why})",
                    a.bytes >> 20
                )
            });
            (after, source)
        }
    };
    match best {
        Ok(c) => {
            for f in &mut s.formats {
                if let Some(b) = &mut f.bench {
                    b.attach_roofline(Some(c.bytes_per_s), peak.clone());
                    if let Some(d) = &mut b.decode_bound {
                        d.copy_source = Some(source.clone());
                    }
                }
            }
        }
        Err(e) => s
            .skipped
            .push(format!("the copy bandwidth for the decode bound: {e:#}")),
    }
}

/// The device-to-device copy bandwidth of `device` ([`crate::kernels::bench::copy_bandwidth`]),
/// the memory pool trimmed afterwards (best effort: a failed trim keeps the measurement), so its
/// buffers never shrink a KV cache sized later in the process.
fn section_copy_bandwidth(device: usize) -> anyhow::Result<crate::kernels::schema::CopyBandwidth> {
    let g = crate::gpu::Gpu::open_device(device)?;
    let c = crate::kernels::bench::copy_bandwidth(&g)?;
    let _ = g.trim_memory_pool();
    Ok(c)
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// The report section (Markdown).
pub fn render_markdown(s: &RuntimeSection) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "## Built-in runtime on the GPU\n");
    let _ = writeln!(
        o,
        "Model `{}` on {}; every figure below is from the CUDA backend.\n",
        s.model, s.device
    );
    match &s.parity {
        Some(p) => {
            let _ = writeln!(
                o,
                "Correct before fast: {} vs {}: {} prompts × {} greedy tokens, {} token mismatches ({} near-ties), largest relative logit difference {:.4} (tolerance `{}` {:.3}): **{}**.\n",
                p.a, p.b, p.prompts, p.tokens, p.mismatches.len(),
                p.mismatches.iter().filter(|m| m.near_tie).count(),
                p.max_rel_logit_diff, p.tolerance.name, p.tolerance.max_rel_logit_diff,
                if p.passed { "passed" } else { "FAILED" }
            );
        }
        None => {
            let _ = writeln!(o, "Correct before fast: the parity check did not run.\n");
        }
    }
    for k in &s.skipped {
        let _ = writeln!(o, "- skipped {k}");
    }
    let benches: Vec<&RuntimeBench> = s.formats.iter().filter_map(|f| f.bench.as_ref()).collect();
    if !benches.is_empty() {
        render_benches(&mut o, s, &benches);
        render_runtime_goals(&mut o, s, &benches);
    }
    render_fidelity(&mut o, s);
    for f in &s.formats {
        if let Some(e) = &f.error {
            let _ = writeln!(o, "- {}: {e}", f.format);
        }
        if let Some(e) = &f.e2e {
            let _ = writeln!(o, "\n### End to end, {}\n", f.format);
            // One level down (its sections sit under this format's heading), and its plots
            // are in the format's own folder, `e2e-<format>/` (see `report::job::render_into`).
            let md = crate::e2e::render_markdown(e)
                .replacen("## End to end", "#### Session", 1)
                .replace("\n### ", "\n#### ")
                .replace("](e2e_", &format!("]({}/e2e_", e2e_dir(&f.format)));
            o.push_str(&md);
        }
    }
    o
}

/// What each format's backend built and chose at load: the SHA-256 of the kernel sources it
/// built (the first 12 hex digits; whole in results.json) and its load notes (the tuner's
/// choices, fallbacks, how its kernels were built). Nothing when no run recorded them (the CPU
/// backend, older results).
fn render_load_facts(o: &mut String, benches: &[&RuntimeBench]) {
    let mut sources: std::collections::BTreeMap<&str, &str> = std::collections::BTreeMap::new();
    for b in benches {
        for (path, sha) in &b.kernel_sources {
            sources.insert(path, sha);
        }
    }
    if !sources.is_empty() {
        let list: Vec<String> = sources
            .iter()
            .map(|(p, h)| format!("`{p}` {}", &h[..h.len().min(12)]))
            .collect();
        let _ = writeln!(o, "Kernel sources built (SHA-256): {}.\n", list.join(", "));
    }
    for b in benches.iter().filter(|b| !b.backend_notes.is_empty()) {
        let _ = writeln!(o, "Load notes, {}:\n", b.weight_format);
        for n in &b.backend_notes {
            let _ = writeln!(o, "- {n}");
        }
        o.push('\n');
    }
}

/// The decode bound, batching and prefill table, its conditions and each format's decode profile.
fn render_benches(o: &mut String, s: &RuntimeSection, benches: &[&RuntimeBench]) {
    let _ = writeln!(o, "\n### Decode bound, batching and prefill\n");
    let rows: Vec<Vec<String>> = benches
        .iter()
        .map(|b| {
            vec![
                b.weight_format.clone(),
                format!("{:.1}", b.batch1.tok_per_s),
                b.decode_bound
                    .as_ref()
                    .map_or("not measured (no copy roofline in this run)".into(), |d| {
                        format!("{:.1}", d.bound_tok_per_s)
                    }),
                b.decode_bound
                    .as_ref()
                    .map_or("—".into(), |d| pct(d.fraction)),
                format!(
                    "{:.1} ({:.1}× batch 1)",
                    b.batched.tok_per_s, b.batch_speedup
                ),
                crate::output::table::grouped(b.prefill.tok_per_s, 0),
                format!("{:.1}", b.prefill.tflops),
                b.prefill_vs_peak
                    .as_ref()
                    .map_or("—".into(), |p| pct(p.fraction)),
                b.kv_capacity.as_ref().map_or("—".into(), |k| {
                    format!(
                        "{} vs {} ({:+.1}%)",
                        crate::output::table::thousands(k.allocated_tokens),
                        crate::output::table::thousands(k.predicted_tokens),
                        100.0 * k.relative_difference
                    )
                }),
            ]
        })
        .collect();
    o.push_str(&crate::output::table::markdown_table(
        &[
            "format",
            "batch-1 tok/s",
            "bound tok/s",
            "of bound",
            "batch-N tok/s",
            "prefill tok/s",
            "prefill TFLOP/s",
            "of BF16 peak",
            "KV tokens allocated vs predicted",
        ],
        &rows,
    ));
    let b0 = benches[0];
    let _ = writeln!(
            o,
            "\nConditions: backend {}, device {}, model {}, KV {}; batch 1 after a {}-token prompt ({} tokens timed); batch {} at {}-token contexts; prefill of {} tokens in one pass. Bound = copy bandwidth ({}) ÷ bytes per decode step (weights in the format, BF16 lm_head, KV at the mean context).{}\n",
            b0.backend, b0.device, b0.model, b0.kv_dtype, b0.spec.batch1_prompt, b0.batch1.tokens, b0.spec.batch, crate::output::table::thousands(b0.spec.batch_context as u64), crate::output::table::thousands(b0.spec.prefill_tokens as u64),
            b0.decode_bound.as_ref().map_or("not measured".to_string(), |d| format!(
                "{:.2} TB/s, {}",
                d.copy_bytes_per_s / 1e12,
                d.copy_source.as_deref().unwrap_or("the copy roofline of this run's kernel bench")
            )),
            b0.prefill_vs_peak.as_ref().map_or(
                " Peak: no BF16 kernel row in this run, so prefill is not compared with it.".to_string(),
                |p| format!(" Peak = best BF16 TFLOP/s of this run's kernel rows ({}).", p.peak_source)
            )
        );
    for b in benches {
        if let Some(m) = &b.moe_batched {
            let bound = b.decode_bound.as_ref().map_or(String::new(), |d| {
                let tok = d.copy_bytes_per_s / m.step_bytes.total().max(1) as f64
                    * b.batched.batch as f64;
                format!(
                    "; its bound {:.0} tok/s, measured {} of it",
                    tok,
                    pct(b.batched.tok_per_s / tok)
                )
            });
            let _ = writeln!(
                o,
                "\n{} batch {}: the last timed step routed to {:.1} of {} experts per sparse layer on average (top-{}; {}–{} by layer), so it must move {} (weights of the touched experts, attention, GDN state, KV at the batch's context){bound}.",
                b.weight_format,
                b.batched.batch,
                m.mean_touched(),
                m.experts,
                m.top_k,
                m.touched_per_layer.iter().min().unwrap_or(&0),
                m.touched_per_layer.iter().max().unwrap_or(&0),
                crate::output::table::human_bytes(m.step_bytes.total())
            );
        }
    }
    render_load_facts(o, benches);
    for f in &s.formats {
        let bw = f
            .bench
            .as_ref()
            .and_then(|b| b.decode_bound.as_ref())
            .map(|d| d.copy_bytes_per_s);
        o.push_str(&super::decode_profile::render(
            &f.format,
            &f.decode_contexts,
            bw,
            f.decode_attention.as_deref(),
        ));
    }
}

/// The runtime's goals (docs/runtime.md), as ratios within this run.
fn render_runtime_goals(o: &mut String, s: &RuntimeSection, benches: &[&RuntimeBench]) {
    let by = |f: &str| benches.iter().find(|b| b.weight_format == f).copied();
    let mut t: Vec<Vec<String>> = Vec::new();
    t.extend(memory_bound_goals(s));
    for b in benches {
        if let Some(d) = &b.decode_bound {
            t.push(vec![
                format!(
                    "{} batch-1 ≥ 75% of the weight-streaming bound",
                    b.weight_format
                ),
                pct(d.fraction),
                met(d.fraction >= 0.75),
            ]);
        }
    }
    if let (Some(w), Some(b), Some(f)) = (by("nvfp4"), by("bf16"), by("fp8")) {
        let (rb, rf) = (
            w.batch1.tok_per_s / b.batch1.tok_per_s,
            w.batch1.tok_per_s / f.batch1.tok_per_s,
        );
        t.push(vec![
            "W4A16 batch-1 ≥ 2.5× BF16".into(),
            format!("{rb:.2}×"),
            met(rb >= 2.5),
        ]);
        t.push(vec![
            "W4A16 batch-1 ≥ 1.4× FP8".into(),
            format!("{rf:.2}×"),
            met(rf >= 1.4),
        ]);
    }
    if benches.iter().any(|b| b.moe_batched.is_some()) {
        t.extend(moe_goals(s, by("bf16"), by("nvfp4")));
    }
    if let Some(b) = by("bf16") {
        t.push(vec![
            format!("BF16 batch-{} ≥ 20× batch-1", b.spec.batch),
            format!("{:.1}×", b.batch_speedup),
            met(b.batch_speedup >= 20.0),
        ]);
        if let Some(p) = &b.prefill_vs_peak {
            t.push(vec![
                format!(
                    "prefill of {} tokens ≥ 50% of the BF16 GEMM peak",
                    b.spec.prefill_tokens
                ),
                pct(p.fraction),
                met(p.fraction >= 0.5),
            ]);
        }
        if let Some(k) = &b.kv_capacity {
            t.push(vec![
                "KV capacity within 3% of inspect's prediction".into(),
                format!("{:+.1}%", 100.0 * k.relative_difference),
                met(k.relative_difference.abs() <= 0.03),
            ]);
        }
    }
    if !t.is_empty() {
        let _ = writeln!(o, "### rigbench runtime's goals (ratios within this run)\n");
        let _ = writeln!(
                o,
                "Goals for rigbench's own built-in runtime (docs/runtime.md): its decode against the weight-streaming bound, its formats and batching against each other, its KV allocation against `inspect`'s prediction. They describe rigbench's runtime, not a property of the card.\n"
            );
        o.push_str(&crate::output::table::markdown_table(
            &["target", "measured", "met"],
            &t,
        ));
        o.push('\n');
    }
}

/// The fidelity on identical weights table.
fn render_fidelity(o: &mut String, s: &RuntimeSection) {
    if !s.fidelity.is_empty() {
        if s.model.starts_with("synthetic:") {
            let _ = writeln!(
                o,
                "### Fidelity on identical weights (random weights: a numerics check, not a quality figure)\n"
            );
            let _ = writeln!(
                o,
                "The weights of `{}` are random: their logits are nearly flat, so any perturbation flips the arg-max. These figures check the formats' arithmetic; they say nothing about quality on a trained model (see the section on trained weights and docs/fidelity.md).\n",
                s.model
            );
        } else {
            let _ = writeln!(o, "### Fidelity on identical weights\n");
        }
        let rows: Vec<Vec<String>> = s
            .fidelity
            .iter()
            .map(|f| {
                vec![
                    format!("{} vs {}", f.format, f.reference_format),
                    pct(f.greedy_agreement),
                    format!("{:.1}", f.mean_matched_prefix),
                    pct(f.top1_agreement),
                    format!("{:.4}", f.mean_kl),
                    format!("{:.3}", f.max_kl),
                ]
            })
            .collect();
        o.push_str(&crate::output::table::markdown_table(
            &[
                "format",
                "greedy agreement",
                "mean tokens before divergence",
                "top-1 agreement (teacher-forced)",
                "mean KL (nats)",
                "max KL",
            ],
            &rows,
        ));
        if let Some(f) = s.fidelity.first() {
            let _ = writeln!(
                o,
                "\n{} prompts × {} tokens; top-1 and KL teacher-forced on the BF16 tokens.\n",
                f.prompts, f.tokens
            );
        }
    }
}

/// Batch-1 decode at a 128-token context against the weight-streaming bound, per format
/// (docs/runtime.md "Decode attention"): BF16 80%, FP8 70%, W4A16 60%.
pub const SHORT_CONTEXT_TARGETS: [(&str, f64); 3] =
    [("bf16", 0.80), ("fp8", 0.70), ("nvfp4", 0.60)];

/// One goal row `[name, measured, met]`: format `fmt`'s batch-1 decode at a 128-token context
/// as a share of its step's bound (bytes the step must move ÷ the run's copy bandwidth) against
/// `target`, or why it was not measured.
fn short_context_goal(s: &RuntimeSection, fmt: &str, target: f64, name: String) -> Vec<String> {
    let f = s.formats.iter().find(|f| f.format == fmt);
    let bw = f
        .and_then(|f| f.bench.as_ref())
        .and_then(|b| b.decode_bound.as_ref())
        .map(|d| d.copy_bytes_per_s);
    let row = f.and_then(|f| f.decode_contexts.iter().find(|r| r.context == 128));
    match (f, row, bw) {
        (None, _, _) => vec![
            name,
            format!("not measured: no {fmt} run in this section"),
            "—".into(),
        ],
        (_, None, _) => vec![
            name,
            "not measured: no 128-token decode row (see the skipped list)".into(),
            "—".into(),
        ],
        (_, _, None) => vec![
            name,
            "not measured: no copy bandwidth in this run".into(),
            "—".into(),
        ],
        (_, Some(r), Some(bw)) => {
            let x = r.fraction_of_bound(bw);
            vec![name, pct(x), met(x >= target)]
        }
    }
}

/// The goals of a mixture of experts (docs/runtime.md, "Mixtures of experts"): its batch-1
/// decode moves only the experts it routes to (the bound counts those), and a decode step that
/// is barely weight-bound is where NVFP4's smaller weights must still pay: BF16 at a 128-token
/// context ≥ [`MOE_BF16_TARGET`] of the bound, W4A16 batch-1 ≥ [`MOE_W4A16_OVER_BF16`]× BF16.
fn moe_goals(
    s: &RuntimeSection,
    bf16: Option<&RuntimeBench>,
    w4: Option<&RuntimeBench>,
) -> Vec<Vec<String>> {
    let mut t = vec![short_context_goal(
        s,
        "bf16",
        MOE_BF16_TARGET,
        format!(
            "MoE: bf16 batch-1 decode at a 128-token context ≥ {:.0}% of the bound (the routed experts' bytes)",
            100.0 * MOE_BF16_TARGET
        ),
    )];
    let name = format!("MoE: W4A16 batch-1 ≥ {MOE_W4A16_OVER_BF16}× BF16");
    t.push(match (w4, bf16) {
        (Some(w), Some(b)) => {
            let r = w.batch1.tok_per_s / b.batch1.tok_per_s;
            vec![name, format!("{r:.2}×"), met(r >= MOE_W4A16_OVER_BF16)]
        }
        _ => vec![
            name,
            "not measured: this run has no nvfp4 and bf16 pair".into(),
            "—".into(),
        ],
    });
    t
}

/// The MoE's BF16 batch-1 target: share of the bound counting the routed experts' bytes (the
/// published anchor: about 31% for Qwen3-30B-A3B at concurrency 1 on vLLM).
pub const MOE_BF16_TARGET: f64 = 0.5;

/// The MoE's W4A16 batch-1 target, as a multiple of BF16's tok/s.
pub const MOE_W4A16_OVER_BF16: f64 = 1.5;

/// The memory-bound goals of the runtime section, from the run's own rows: batch-1 decode at a
/// 128-token context per format against [`SHORT_CONTEXT_TARGETS`], and decode attention at 4k
/// and 32k contexts against `ATTENTION_BOUND_TARGET` × (KV bytes ÷ copy rate). A goal without
/// its row says "not measured" and why.
fn memory_bound_goals(s: &RuntimeSection) -> Vec<Vec<String>> {
    use crate::runtime::backend::cuda::decode_attn::ATTENTION_BOUND_TARGET;
    let mut t = Vec::new();
    for (fmt, target) in SHORT_CONTEXT_TARGETS {
        let name = format!(
            "{fmt} batch-1 decode at a 128-token context ≥ {:.0}% of the bound",
            100.0 * target
        );
        t.push(short_context_goal(s, fmt, target, name));
    }
    for ctx in [4096usize, 32_768] {
        let name = format!(
            "decode attention at a {} context, batch 1, ≤ {ATTENTION_BOUND_TARGET}× KV bytes ÷ copy rate",
            crate::output::table::thousands(ctx as u64)
        );
        let mut got = None;
        for f in &s.formats {
            let bw = f
                .bench
                .as_ref()
                .and_then(|b| b.decode_bound.as_ref())
                .map(|d| d.copy_bytes_per_s);
            if let (Some(r), Some(bw)) = (f.decode_contexts.iter().find(|r| r.context == ctx), bw) {
                if let Some(x) = r.attention_vs_bound(bw) {
                    got = Some((f.format.clone(), x));
                    break;
                }
            }
        }
        t.push(match got {
            Some((f, x)) => vec![format!("{name} ({f} weights)"), format!("{x:.2}×"), met(x <= ATTENTION_BOUND_TARGET)],
            None => vec![
                name,
                format!(
                    "not measured: no profiled {} step with a copy bandwidth in this run (see the skipped list)",
                    crate::output::table::thousands(ctx as u64)
                ),
                "—".into(),
            ],
        });
    }
    let bf = s
        .formats
        .iter()
        .find(|f| f.format == "bf16")
        .and_then(|f| f.bench.as_ref());
    t.push(match bf {
        Some(b) if b.spec.batch == 32 && b.spec.batch_context == 1024 => vec![
            "BF16 batch-32 at 1k contexts ≥ 15× batch 1".into(),
            format!("{:.1}×", b.batch_speedup),
            met(b.batch_speedup >= 15.0),
        ],
        Some(b) => vec![
            "BF16 batch-32 at 1k contexts ≥ 15× batch 1".into(),
            format!(
                "not measured: this run batched {} sequences at {}-token contexts",
                b.spec.batch, b.spec.batch_context
            ),
            "—".into(),
        ],
        None => vec![
            "BF16 batch-32 at 1k contexts ≥ 15× batch 1".into(),
            "not measured: no BF16 benchmark in this section".into(),
            "—".into(),
        ],
    });
    t.push(vec![
        "decode attention at 4k and 32k contexts, batch 32, ≤ 1.5× KV bytes ÷ copy rate".into(),
        "not measured: the section profiles batch 1 (batch 32: `rigbench devcheck --only attention`)".into(),
        "—".into(),
    ]);
    t
}

/// A goal's verdict, in the words of the kernel goals table.
fn met(ok: bool) -> String {
    if ok { "met" } else { "NOT met" }.to_string()
}

/// The folder, relative to report.md, that holds one format's end-to-end CSV files, engine
/// log and plots.
pub fn e2e_dir(format: &str) -> String {
    format!("e2e-{format}")
}

#[cfg(test)]
mod tests;
