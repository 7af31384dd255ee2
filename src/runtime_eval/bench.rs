//! Runtime benchmarks for the runtime's targets (docs/runtime.md, "Benchmarks"), driven through the
//! [`Engine`] directly (no HTTP), generic over the backend (they take `Box<dyn Backend>` and give
//! it back):
//!
//! - batch-1 decode tok/s;
//! - batch-N decode throughput (N = 32 with 1,024-token contexts by default);
//! - prefill tok/s of one long prompt (4,096 tokens by default), in one forward pass;
//! - KV capacity allocated vs predicted (`inspect`'s formula,
//!   [`crate::checkpoint::capacity::predict_kv_tokens`]).
//!
//! Figures against the kernel bench of the same run ([`RuntimeBench::attach_roofline`]):
//! - decode bound: the bytes one batch-1 decode step reads ([`crate::runtime::memory::decode_step_bytes`]:
//!   weights in the run's format, BF16 lm_head, KV at the mean context) ÷ the device-to-device
//!   copy bandwidth measured in the same run = the weight-streaming upper bound on batch-1 tok/s;
//!   the fraction achieved is measured ÷ bound;
//! - prefill against the BF16 tensor peak: prefill FLOPs per token (`2·Σ N·K` over the decoder
//!   linears + `4 · layers · q_dim · (L+1)/2` for causal attention at prompt length L) × tok/s,
//!   ÷ the best BF16 TFLOP/s of the kernel rows of the same run.
//!
//! Timings here are wall-clock times of engine steps (the backend synchronizes in `forward`,
//! which returns host logits); every figure carries the backend, device, format and sizes.

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::runtime::backend::{Backend, KvCacheSpec};
use crate::runtime::config::{KvCacheDtype, ModelConfig};
use crate::runtime::engine::{Engine, EngineConfig, GenerateRequest, ReasoningMode};
use crate::runtime::memory::{decode_step_bytes, DecodeBytes};
use crate::runtime::sampler::SamplingParams;
use crate::runtime::scheduler::SchedulerConfig;
use crate::runtime::tokenizer::Tokenizer;
use crate::runtime::vllm_metrics::{CacheInfo, Metrics};
use crate::runtime::weights::{LinearRole, SplitMix64};

/// Sizes of the runtime benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeBenchSpec {
    /// Prompt tokens of the batch-1 decode run.
    pub batch1_prompt: usize,
    /// Tokens decoded at batch 1 (the first, from prefill, is not counted).
    pub batch1_tokens: usize,
    /// Sequences of the batched decode run.
    pub batch: usize,
    /// Context of each sequence when batched decoding is timed (prompt tokens).
    pub batch_context: usize,
    /// Tokens each batched sequence decodes.
    pub batch_tokens: usize,
    /// Prompt tokens of the prefill run (one forward pass).
    pub prefill_tokens: usize,
    /// KV block size.
    pub block_size: usize,
}

impl RuntimeBenchSpec {
    /// The runtime's targets (docs/runtime.md): batch-1 decode (128-token prompt, 128 tokens),
    /// batch 32 with 1,024-token contexts (32 tokens each), prefill of 4,096 tokens.
    pub fn runtime_targets() -> Self {
        RuntimeBenchSpec {
            batch1_prompt: 128,
            batch1_tokens: 128,
            batch: 32,
            batch_context: 1024,
            batch_tokens: 32,
            prefill_tokens: 4096,
            block_size: 16,
        }
    }
}

impl RuntimeBenchSpec {
    /// The sizes for model `c`: a Gated-DeltaNet hybrid decodes its batch at 4,096-token
    /// contexts (the hybrid targets: its attention layers' KV grows with the context while the
    /// state does not); dense decoders keep the sizes given.
    pub fn for_model(self, c: &ModelConfig) -> Self {
        if c.is_hybrid() {
            RuntimeBenchSpec {
                batch_context: self.batch_context.max(4096),
                ..self
            }
        } else {
            self
        }
    }
}

/// A decode throughput figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecodeFigure {
    /// Sequences decoding together.
    pub batch: usize,
    /// Prompt tokens of each (context when decoding starts).
    pub context: usize,
    /// Tokens timed (all sequences together).
    pub tokens: u64,
    /// Seconds of the timed decode steps.
    pub seconds: f64,
    /// `tokens / seconds`.
    pub tok_per_s: f64,
}

/// The prefill figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrefillFigure {
    /// Prompt tokens (one forward pass).
    pub tokens: usize,
    /// Seconds of that pass (the step that ran it).
    pub seconds: f64,
    /// `tokens / seconds`.
    pub tok_per_s: f64,
    /// FLOPs per prompt token (see the module docs).
    pub flops_per_token: f64,
    /// Achieved TFLOP/s.
    pub tflops: f64,
}

/// KV capacity: what the engine allocated vs `inspect`'s prediction for the same memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvCapacityCheck {
    /// Tokens the runtime allocated.
    pub allocated_tokens: u64,
    /// Tokens `inspect`'s formula predicts for this model, memory and utilization.
    pub predicted_tokens: u64,
    /// `allocated / predicted − 1`.
    pub relative_difference: f64,
    /// The prediction's inputs in words.
    pub basis: String,
}

/// The batch-1 decode bound from the copy roofline of the same run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecodeBound {
    /// Copy bandwidth measured in the same run, bytes/s.
    pub copy_bytes_per_s: f64,
    /// Bytes of one batch-1 decode step.
    pub step_bytes: DecodeBytes,
    /// `copy bandwidth / step bytes`: the batch-1 tok/s upper bound.
    pub bound_tok_per_s: f64,
    /// Measured batch-1 tok/s ÷ the bound.
    pub fraction: f64,
    /// Where the copy bandwidth came from (`None` in results written before this field: the
    /// kernel bench of the same run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_source: Option<String>,
}

/// Prefill against the BF16 tensor peak of the same run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrefillVsPeak {
    /// The best BF16 TFLOP/s among the kernel rows of the same run.
    pub bf16_peak_tflops: f64,
    /// Which kernel row gave it.
    pub peak_source: String,
    /// Prefill TFLOP/s ÷ the peak.
    pub fraction: f64,
}

/// What one batch-N decode step of a mixture of experts routed, and the bytes it must move at
/// the least ([`crate::runtime::moe::decode_step_floor`] over the experts it touched).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeBatchedStep {
    /// Distinct routed experts per sparse layer (the union over the batch), layer order.
    pub touched_per_layer: Vec<usize>,
    /// Routed experts per sparse layer.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// The step's byte floor at the batch's context.
    pub step_bytes: DecodeBytes,
}

impl MoeBatchedStep {
    /// Mean distinct experts per sparse layer.
    pub fn mean_touched(&self) -> f64 {
        self.touched_per_layer.iter().sum::<usize>() as f64
            / self.touched_per_layer.len().max(1) as f64
    }
}

/// The runtime benchmarks of one backend and format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimeBench {
    /// Backend (`cpu`, `cuda`).
    pub backend: String,
    /// Device label.
    pub device: String,
    /// Weight format of the decoder linears.
    pub weight_format: String,
    /// KV cache dtype.
    pub kv_dtype: String,
    /// Model provenance (synthetic seed, or checkpoint path and hash).
    pub model: String,
    /// The sizes.
    pub spec: RuntimeBenchSpec,
    /// Batch-1 decode.
    pub batch1: DecodeFigure,
    /// Batch-N decode.
    pub batched: DecodeFigure,
    /// Mixtures of experts: what the last timed batch-N step routed and its byte floor (GPU
    /// backends; absent for dense models and in older results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_batched: Option<MoeBatchedStep>,
    /// `batched.tok_per_s / batch1.tok_per_s`.
    pub batch_speedup: f64,
    /// Prefill.
    pub prefill: PrefillFigure,
    /// Bytes of one batch-1 decode step at the batch-1 run's mean context.
    pub decode_step_bytes: DecodeBytes,
    /// KV capacity check (GPU backends; the CPU backend's budget is a flag, not a measurement).
    pub kv_capacity: Option<KvCapacityCheck>,
    /// Decode bound (when the same run measured the copy bandwidth).
    pub decode_bound: Option<DecodeBound>,
    /// Prefill vs the BF16 peak (when the same run timed BF16 kernels).
    pub prefill_vs_peak: Option<PrefillVsPeak>,
    /// SHA-256 of every kernel source the backend built, by path (GPU backends; absent in
    /// older results).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub kernel_sources: std::collections::BTreeMap<String, String>,
    /// The backend's load notes: the tuner's choices (FP8 scaling path, rejected W4A16
    /// configurations), fallbacks, how the kernels were built (GPU backends; absent in older
    /// results).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_notes: Vec<String>,
}

/// FLOPs per prompt token of a prefill of `len` tokens (module docs). For a Gated-DeltaNet
/// hybrid: each layer's own linears, causal attention in the full-attention layers only, and in
/// the Gated-DeltaNet layers the chunked delta rule, per value head and token about
/// `6·dk·dv` (state read, correction, update) `+ 2·64·(dk + dv)` (the 64-token chunk's
/// within-chunk products).
pub fn prefill_flops_per_token(c: &ModelConfig, len: usize) -> f64 {
    let attn = 4.0 * c.q_dim() as f64 * (len as f64 + 1.0) / 2.0;
    (0..c.num_layers)
        .map(|i| {
            let linear: f64 = LinearRole::of_layer(c, i)
                .iter()
                .map(|r| {
                    let (n, k) = r.shape(c);
                    2.0 * n as f64 * k as f64
                })
                .sum();
            let mixer = match (&c.hybrid, c.layer_type(i)) {
                (Some(h), crate::runtime::hybrid::LayerType::Gdn) => {
                    let (dk, dv) = (h.key_head_dim as f64, h.value_head_dim as f64);
                    h.num_value_heads as f64
                        * (6.0 * dk * dv + 2.0 * crate::runtime::gdn::CHUNK as f64 * (dk + dv))
                }
                _ => attn,
            };
            linear + mixer
        })
        .sum()
}

fn prompt(vocab: usize, len: usize, seed: u64) -> Vec<u32> {
    let mut r = SplitMix64::new(seed);
    // Ids past the byte tokenizer's specials, inside any vocabulary the presets use.
    let span = vocab.clamp(2, 256) as u64;
    (0..len).map(|_| (r.next_u64() % span) as u32).collect()
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt,
        params: SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        max_tokens,
        ignore_eos: true,
        stop: Vec::new(),
        reasoning: ReasoningMode::Off,
        arrival: Instant::now(),
    }
}

/// Run the three timed workloads on `backend` with a KV cache of `kv_dtype`; returns the
/// figures and the backend.
///
/// # Errors
/// A zero size, a backend that cannot hold the KV cache the workloads need, or a forward
/// failure.
pub fn run(
    backend: Box<dyn Backend>,
    spec: RuntimeBenchSpec,
    kv_dtype: KvCacheDtype,
    model: &str,
) -> anyhow::Result<(RuntimeBench, Box<dyn Backend>)> {
    anyhow::ensure!(
        spec.batch1_tokens >= 2
            && spec.batch >= 1
            && spec.batch_tokens >= 2
            && spec.prefill_tokens >= 1,
        "runtime bench sizes too small: {spec:?}"
    );
    let c = backend.config().clone();
    let (backend_name, device, fmt) = (
        backend.name().to_string(),
        backend.device_label(),
        backend.weight_format(),
    );
    let (kernel_sources, backend_notes) = (backend.kernel_sources(), backend.load_notes());
    let (mut engine, metrics, prefill_steps) =
        bench_engine(backend, &spec, kv_dtype, &backend_name, c.vocab_size)?;
    let generated = || metrics.snapshot().generation_tokens;
    let mut next_id = 1u64;
    let mut add = |e: &mut Engine, r: GenerateRequest| {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        e.add(next_id, r, tx);
        next_id += 1;
        rx
    };

    // Batch-1 decode: time the steps after the prefill step.
    let _rx = add(
        &mut engine,
        request(
            prompt(c.vocab_size, spec.batch1_prompt, 1),
            spec.batch1_tokens,
        ),
    );
    engine.step()?; // prefill + first token
    let (g0, t0) = (generated(), Instant::now());
    while engine.has_work() {
        engine.step()?;
    }
    let (tokens, secs) = (generated() - g0, t0.elapsed().as_secs_f64());
    let batch1 = DecodeFigure {
        batch: 1,
        context: spec.batch1_prompt,
        tokens,
        seconds: secs,
        tok_per_s: tokens as f64 / secs.max(1e-12),
    };

    // Batch-N decode: prefill every sequence first, then time the steps where all decode. The
    // engine interleaves the prompts' prefill with the decode of the sequences already in, so a
    // sequence that started early keeps decoding while the last prompts are prefilled: each asks
    // for enough tokens to outlast those prefill steps, and the timing stops at the first
    // sequence that finishes (every timed step decodes the whole batch).
    let mut rxs = Vec::new();
    for i in 0..spec.batch {
        rxs.push(add(
            &mut engine,
            request(
                prompt(c.vocab_size, spec.batch_context, 100 + i as u64),
                spec.batch_tokens + prefill_steps,
            ),
        ));
    }
    let all_decoding = |e: &Engine| {
        e.scheduler().running().len() == spec.batch
            && e.scheduler().running().iter().all(|s| s.is_decoding())
    };
    while engine.has_work() && !all_decoding(&engine) {
        engine.step()?;
    }
    let (g0, t0) = (generated(), Instant::now());
    let mut steps = 0usize;
    while steps < spec.batch_tokens && all_decoding(&engine) {
        engine.step()?;
        steps += 1;
    }
    let (tokens, secs) = (generated() - g0, t0.elapsed().as_secs_f64());
    // The last timed step decoded the whole batch: what it routed (after the timing, since
    // reading it synchronizes).
    let moe_batched = moe_batched_step(&c, &engine, fmt, kv_dtype, &spec, steps);
    while engine.has_work() {
        engine.step()?;
    }
    anyhow::ensure!(
        tokens > 0,
        "the batched decode run never had its {} sequences decoding together (KV blocks or state slots for fewer: see the engine's startup notes); no batch-{} figure",
        spec.batch,
        spec.batch
    );
    let batched = DecodeFigure {
        batch: spec.batch,
        context: spec.batch_context,
        tokens,
        seconds: secs,
        tok_per_s: tokens as f64 / secs.max(1e-12),
    };
    drop(rxs);

    // Prefill: one prompt in one forward pass.
    let _rx = add(
        &mut engine,
        request(prompt(c.vocab_size, spec.prefill_tokens, 7), 1),
    );
    let t0 = Instant::now();
    engine.step()?;
    let secs = t0.elapsed().as_secs_f64();
    while engine.has_work() {
        engine.step()?;
    }
    let fpt = prefill_flops_per_token(&c, spec.prefill_tokens);
    let tps = spec.prefill_tokens as f64 / secs.max(1e-12);
    let prefill = PrefillFigure {
        tokens: spec.prefill_tokens,
        seconds: secs,
        tok_per_s: tps,
        flops_per_token: fpt,
        tflops: fpt * tps / 1e12,
    };
    let mean_ctx = spec.batch1_prompt + spec.batch1_tokens / 2;
    let bench = RuntimeBench {
        backend: backend_name,
        device,
        weight_format: fmt.id().into(),
        kv_dtype: kv_dtype.vllm_name().into(),
        model: model.to_string(),
        spec,
        batch_speedup: batched.tok_per_s / batch1.tok_per_s.max(1e-12),
        batch1,
        batched,
        moe_batched,
        prefill,
        decode_step_bytes: decode_step_bytes(&c, fmt, kv_dtype, mean_ctx),
        kv_capacity: None,
        decode_bound: None,
        prefill_vs_peak: None,
        kernel_sources,
        backend_notes,
    };
    Ok((bench, engine.into_backend()))
}

/// The engine the workloads run on: a KV cache sized for the largest of them (the batched
/// run's sequences decode extra tokens while the last prompts prefill), a byte tokenizer, no
/// prefix caching. Returns the engine, its metrics and the batched run's prefill steps.
fn bench_engine(
    backend: Box<dyn Backend>,
    spec: &RuntimeBenchSpec,
    kv_dtype: KvCacheDtype,
    backend_name: &str,
    vocab_size: usize,
) -> anyhow::Result<(Engine, Arc<Metrics>, usize)> {
    let bs = spec.block_size;
    // Scheduler steps the batched run's prompts take to prefill (each step carries up to
    // `step_tokens`): its sequences decode that many extra tokens (see the batched run below).
    let step_tokens = spec
        .prefill_tokens
        .max(spec.batch_context)
        .max(spec.batch1_prompt);
    let prefill_steps = (spec.batch * spec.batch_context).div_ceil(step_tokens.max(1)) + 1;
    let per_seq = (spec.batch_context + spec.batch_tokens + prefill_steps)
        .max(spec.batch1_prompt + spec.batch1_tokens)
        .max(spec.prefill_tokens + 1);
    let blocks = spec.batch * per_seq.div_ceil(bs) + 1;
    let kv = KvCacheSpec {
        num_blocks: blocks,
        block_size: bs,
        dtype: kv_dtype,
    };
    let metrics = Arc::new(Metrics::new(
        "bench",
        CacheInfo {
            block_size: bs,
            num_blocks: blocks,
            device_kind: backend_name.to_string(),
            gpu_memory_utilization: None,
            cache_dtype: kv_dtype.vllm_name().into(),
            enable_prefix_caching: false,
        },
        per_seq,
        None,
    ));
    let tok = Arc::new(Tokenizer::bytes(vocab_size, &[])?);
    let engine = Engine::new(
        backend,
        tok,
        EngineConfig {
            scheduler: SchedulerConfig {
                max_num_seqs: spec.batch,
                max_num_batched_tokens: step_tokens,
            },
            kv,
            max_model_len: per_seq,
            enable_prefix_caching: false,
            spec: None,
            seed: 0,
        },
        metrics.clone(),
    )?;
    Ok((engine, metrics, prefill_steps))
}

/// What the last timed step of the batched run routed, for an MoE model (read after the
/// timing, since reading it synchronizes); `None` for a dense model or when nothing was timed.
fn moe_batched_step(
    c: &ModelConfig,
    engine: &Engine,
    fmt: crate::runtime::config::WeightFormat,
    kv_dtype: KvCacheDtype,
    spec: &RuntimeBenchSpec,
    steps: usize,
) -> Option<MoeBatchedStep> {
    match (&c.moe, engine.backend().moe_touched_experts()) {
        (Some(m), Some(touched)) if steps > 0 && !touched.is_empty() => Some(MoeBatchedStep {
            step_bytes: crate::runtime::moe::decode_step_floor(
                c,
                crate::runtime::config::QuantRecipe::Uniform(fmt),
                kv_dtype,
                spec.batch_context,
                spec.batch,
                &touched,
            ),
            touched_per_layer: touched,
            experts: m.num_experts,
            top_k: m.top_k,
        }),
        _ => None,
    }
}

impl RuntimeBench {
    /// Fill the decode bound and the prefill fraction from the kernel bench of the same run:
    /// `copy_bytes_per_s` (its copy roofline) and the best BF16 TFLOP/s with its row.
    pub fn attach_roofline(
        &mut self,
        copy_bytes_per_s: Option<f64>,
        bf16_peak: Option<(f64, String)>,
    ) {
        if let Some(bw) = copy_bytes_per_s.filter(|b| *b > 0.0) {
            let bound = bw / self.decode_step_bytes.total().max(1) as f64;
            self.decode_bound = Some(DecodeBound {
                copy_bytes_per_s: bw,
                step_bytes: self.decode_step_bytes,
                bound_tok_per_s: bound,
                fraction: self.batch1.tok_per_s / bound,
                copy_source: None,
            });
        }
        if let Some((peak, source)) = bf16_peak.filter(|p| p.0 > 0.0) {
            self.prefill_vs_peak = Some(PrefillVsPeak {
                bf16_peak_tflops: peak,
                peak_source: source,
                fraction: self.prefill.tflops / peak,
            });
        }
    }

    /// Compare the KV tokens the engine allocated with `inspect`'s prediction.
    pub fn attach_kv_capacity(
        &mut self,
        allocated_tokens: u64,
        predicted_tokens: u64,
        basis: String,
    ) {
        self.kv_capacity = Some(KvCapacityCheck {
            allocated_tokens,
            predicted_tokens,
            relative_difference: allocated_tokens as f64 / predicted_tokens.max(1) as f64 - 1.0,
            basis,
        });
    }
}

/// The copy bandwidth and best BF16 TFLOP/s row of a kernel bench, for [`RuntimeBench::attach_roofline`].
pub fn roofline_of(k: &crate::kernels::KernelResults) -> (Option<f64>, Option<(f64, String)>) {
    let bw = k.copy_bandwidth.as_ref().map(|c| c.bytes_per_s);
    let peak = k
        .cases
        .iter()
        .filter(|c| {
            c.format == crate::formats::GemmFormat::Bf16
                && c.check.as_ref().is_some_and(|x| x.passed)
        })
        .max_by(|a, b| a.derived.tflops.total_cmp(&b.derived.tflops))
        .map(|c| {
            (
                c.derived.tflops,
                format!(
                    "{} {} M={} ({} × {})",
                    c.implementation, c.shape, c.m, c.n, c.k
                ),
            )
        });
    (bw, peak)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::backend::cpu::CpuBackend;
    use crate::runtime::weights::synthesize;

    /// Prompts that each take a whole scheduler step (as the hybrids' 4,096-token contexts do)
    /// used to let the first sequences finish before the last was admitted, timing nothing and
    /// reporting 0 tok/s: the batch still decodes together for `batch_tokens` steps.
    #[test]
    fn a_batch_whose_prefill_takes_many_steps_is_still_timed_together() {
        let w = synthesize(&ModelConfig::tiny(), 0);
        let spec = RuntimeBenchSpec {
            batch1_prompt: 8,
            batch1_tokens: 2,
            batch: 4,
            batch_context: 40,
            batch_tokens: 2,
            prefill_tokens: 40,
            block_size: 16,
        };
        let (b, _) = run(
            Box::new(CpuBackend::new(w, 1)),
            spec,
            KvCacheDtype::Bf16,
            "synthetic:tiny seed 0",
        )
        .unwrap();
        assert_eq!(b.batched.tokens, 4 * 2);
        assert!(b.batched.tok_per_s > 0.0);
    }

    #[test]
    fn runs_on_the_cpu_with_every_condition_filled() {
        let w = synthesize(&ModelConfig::tiny(), 0);
        let spec = RuntimeBenchSpec {
            batch1_prompt: 8,
            batch1_tokens: 6,
            batch: 3,
            batch_context: 20,
            batch_tokens: 4,
            prefill_tokens: 40,
            block_size: 16,
        };
        let (mut b, back) = run(
            Box::new(CpuBackend::new(w, 1)),
            spec,
            KvCacheDtype::Bf16,
            "synthetic:tiny seed 0",
        )
        .unwrap();
        assert_eq!(back.name(), "cpu");
        assert_eq!(
            (
                b.backend.as_str(),
                b.device.as_str(),
                b.weight_format.as_str()
            ),
            ("cpu", "cpu", "bf16")
        );
        assert_eq!(
            (b.kv_dtype.as_str(), b.model.as_str()),
            ("bfloat16", "synthetic:tiny seed 0")
        );
        // Every decode step after the first token is timed at batch 1 (5); batched, the
        // `batch_tokens` steps in which all 3 sequences decode (the 40-token step budget
        // prefills two prompts of 20, then the third while the first two decode; each asks for
        // 4 + 3 tokens so that none finishes inside the timed steps): 3 × 4 = 12.
        assert_eq!(b.batch1.tokens, 5);
        assert_eq!(b.batched.tokens, 12);
        assert!(b.batch1.tok_per_s > 0.0 && b.batched.tok_per_s > 0.0 && b.prefill.tok_per_s > 0.0);
        assert!((b.batch_speedup - b.batched.tok_per_s / b.batch1.tok_per_s).abs() < 1e-9);
        // FLOPs: 2·Σ N·K + 4·q_dim·(L+1)/2 per layer.
        let c = ModelConfig::tiny();
        let lin = 2.0 * (64.0 * 64.0 * 2.0 + 32.0 * 64.0 * 2.0 + 3.0 * 192.0 * 64.0);
        let want = 2.0 * (lin + 4.0 * 64.0 * 41.0 / 2.0);
        assert_eq!(prefill_flops_per_token(&c, 40), want);
        assert!((b.prefill.tflops - want * b.prefill.tok_per_s / 1e12).abs() < 1e-12);
        // Bound arithmetic: bandwidth / bytes, fraction = measured / bound.
        b.attach_roofline(Some(1e12), Some((100.0, "bf16 row".into())));
        let d = b.decode_bound.as_ref().unwrap();
        assert_eq!(d.bound_tok_per_s, 1e12 / b.decode_step_bytes.total() as f64);
        assert!((d.fraction - b.batch1.tok_per_s / d.bound_tok_per_s).abs() < 1e-12);
        let p = b.prefill_vs_peak.as_ref().unwrap();
        assert_eq!(p.fraction, b.prefill.tflops / 100.0);
        b.attach_kv_capacity(1030, 1000, "test".into());
        assert!((b.kv_capacity.as_ref().unwrap().relative_difference - 0.03).abs() < 1e-12);
        // No copy roofline measured: no bound (never a made-up one).
        let mut c2 = b.clone();
        c2.decode_bound = None;
        c2.attach_roofline(None, None);
        assert!(c2.decode_bound.is_none());
    }
}
