//! Predicted footprint and KV capacity, from metadata (a prediction, never a measurement).
//!
//! Formulas:
//! - KV bytes per token = full-attention layers × 2 (K and V) × KV heads × head_dim × KV dtype
//!   bytes (vLLM `AttentionSpec.page_size_bytes` per token, tensor parallelism 1).
//! - Sliding-window layers (`layer_types` `sliding_attention` with `sliding_window` W, as in
//!   gpt-oss and Gemma 2/3) keep at most W tokens per sequence: their KV per sequence =
//!   sliding layers × 2 × KV heads × head_dim × KV dtype bytes × min(W, length) (vLLM
//!   `SlidingWindowSpec`, whose pages past the window are freed). It does not grow with tokens
//!   past W.
//! - Gated-DeltaNet state per sequence = linear-attention layers × (conv_dim × (conv_kernel − 1)
//!   × conv dtype bytes + value_heads × value_head_dim × key_head_dim × SSM dtype bytes), with
//!   conv_dim = 2 × key_heads × key_head_dim + value_heads × value_head_dim (vLLM
//!   `MambaStateShapeCalculator.gated_delta_net_state_shape`). It is fixed per sequence and
//!   does not grow with tokens.
//! - KV budget = GPU memory × utilization − weights − reserve (vLLM's `Available KV cache
//!   memory`; the reserve stands for what vLLM measures by profiling: peak activations, the
//!   CUDA-graph pool, the CUDA context).
//! - KV tokens = (budget − one sequence's state) / KV bytes per token; maximum concurrency at
//!   `max_model_len` L = budget / (L × KV bytes per token + state per sequence) (vLLM's
//!   "Maximum concurrency for L tokens per request"); the state per sequence holds the
//!   Gated-DeltaNet state and the sliding-window layers' KV at min(W, L) tokens.
//! - With `--max-num-seqs N` (rigbench's built-in runtime: a state slot per sequence that may
//!   run, reserved before the KV cache), `slots = min(N, ⌊(budget − L × KV bytes per token) /
//!   state⌋)` states are reserved instead of one, and the concurrency is also at most `slots`.

use serde::{Deserialize, Serialize};

use super::config::ModelFacts;
use super::format::ModuleFormat;
use super::headers::Headers;
use super::quant::Rules;
use super::{InspectOptions, Rec};
use crate::output::table::human_bytes;

/// KV-cache dtype for the prediction (vLLM `--kv-cache-dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvCacheDtype {
    /// BF16 (2 bytes).
    Bf16,
    /// FP16 (2 bytes).
    F16,
    /// FP8 E4M3 or E5M2 (1 byte).
    Fp8,
    /// FP32 (4 bytes).
    F32,
}

impl KvCacheDtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Self::Bf16 | Self::F16 => 2,
            Self::Fp8 => 1,
            Self::F32 => 4,
        }
    }

    /// Name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Self::Bf16 => "BF16",
            Self::F16 => "FP16",
            Self::Fp8 => "FP8",
            Self::F32 => "FP32",
        }
    }

    /// From a torch/config dtype string (`bfloat16`, `float16`, `float32`, ...).
    pub fn from_torch(s: &str) -> Option<Self> {
        match s
            .trim()
            .trim_start_matches("torch.")
            .to_ascii_lowercase()
            .as_str()
        {
            "bfloat16" | "bf16" => Some(Self::Bf16),
            "float16" | "fp16" | "half" => Some(Self::F16),
            "float32" | "fp32" | "float" => Some(Self::F32),
            "fp8" | "fp8_e4m3" | "fp8_e5m2" | "float8_e4m3fn" => Some(Self::Fp8),
            _ => None,
        }
    }
}

impl std::str::FromStr for KvCacheDtype {
    type Err = String;
    /// `bf16`/`bfloat16`, `fp16`/`float16`/`half`, `fp8`/`fp8_e4m3`/`fp8_e5m2`, `fp32`/`float32`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_torch(s).ok_or_else(|| {
            format!("unknown KV-cache dtype '{s}'; expected auto, bf16, fp16, fp8 or fp32")
        })
    }
}

/// The capacity prediction with its inputs and assumptions. Unknown figures stay `None`, with
/// the reason in `not_computed`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CapacityPrediction {
    /// Always `prediction`: these figures come from metadata, not from an engine.
    pub kind: String,
    /// Weight bytes on the GPU.
    pub weight_bytes: Option<u64>,
    /// How `weight_bytes` was obtained (exact from headers, or an estimate).
    pub weight_source: String,
    /// KV-cache dtype used.
    pub kv_dtype: Option<String>,
    /// Why that dtype.
    pub kv_dtype_source: String,
    /// Layers with a per-token KV cache.
    pub full_attention_layers: Option<u64>,
    /// KV-cache bytes per token (all layers).
    pub kv_bytes_per_token: Option<u64>,
    /// Gated-DeltaNet layers (fixed state per sequence).
    pub linear_attention_layers: u64,
    /// Sliding-window attention layers, counted apart from full attention.
    #[serde(default)]
    pub sliding_attention_layers: u64,
    /// Their window, tokens.
    #[serde(default)]
    pub sliding_window: Option<u64>,
    /// KV bytes per token of the sliding-window layers (held for at most the window).
    #[serde(default)]
    pub sliding_bytes_per_token: Option<u64>,
    /// Recurrent + convolution state bytes per sequence (all linear-attention layers).
    pub state_bytes_per_sequence: Option<u64>,
    /// GPU memory used for the prediction, bytes.
    pub gpu_memory_bytes: Option<u64>,
    /// Where it came from.
    pub gpu_memory_source: Option<String>,
    /// `--gpu-memory-utilization`.
    pub gpu_memory_utilization: f64,
    /// Reserve assumed for activations, CUDA graphs and context, bytes.
    pub reserve_bytes: u64,
    /// Memory left for the KV cache and states, bytes (negative: the weights do not fit).
    pub kv_budget_bytes: Option<i64>,
    /// Whether the weights plus one sequence's state fit.
    pub fits: Option<bool>,
    /// Predicted KV-cache tokens (one sequence's state reserved).
    pub kv_tokens: Option<u64>,
    /// Tokens per request for the concurrency figure.
    pub max_model_len: Option<u64>,
    /// Where it came from (`--max-model-len` or config `max_position_embeddings`).
    pub max_model_len_source: Option<String>,
    /// Requests of `max_model_len` tokens that fit at once.
    pub max_concurrency: Option<f64>,
    /// Why the KV per token is not modelled (attention the dense formula does not describe:
    /// MLA, compressed or indexed attention, sliding windows); `None` when it is.
    #[serde(default)]
    pub kv_not_modelled: Option<String>,
    /// Figures not computed, and why.
    pub not_computed: Vec<String>,
    /// Assumptions behind the figures.
    pub assumptions: Vec<String>,
}

/// Bytes of one `[n, k]` weight in `fmt`, scales included (ModelOpt / compressed-tensors
/// layouts: NVFP4 n·k/2 + n·k/16 E4M3 + FP32 scalars; FP8 n·k + FP32 scales; INT4 n·k/2 +
/// BF16 scale per group).
pub(crate) fn weight_bytes(fmt: &ModuleFormat, n: u64, k: u64, model_dtype_bytes: u64) -> u64 {
    let e = n.saturating_mul(k);
    match fmt {
        ModuleFormat::Bf16 | ModuleFormat::F16 => e.saturating_mul(2),
        ModuleFormat::F32 => e.saturating_mul(4),
        ModuleFormat::Fp8 { scaling, .. } => e.saturating_add(if scaling == "per-tensor" {
            8
        } else if scaling.starts_with("block") {
            n.div_ceil(128)
                .saturating_mul(k.div_ceil(128))
                .saturating_mul(4)
        } else {
            n.saturating_mul(4)
        }),
        ModuleFormat::Nvfp4 { group_size, .. } => {
            (e / 2).saturating_add(e / (*group_size).max(1) as u64) + 8
        }
        ModuleFormat::Mxfp4 => (e / 2).saturating_add(e / 32),
        ModuleFormat::Int4 { group_size } => {
            (e / 2).saturating_add((e / group_size.unwrap_or(128).max(1) as u64).saturating_mul(2))
        }
        ModuleFormat::Int8 => e.saturating_add(n.saturating_mul(4)),
        ModuleFormat::Other { .. } => e.saturating_mul(model_dtype_bytes),
    }
}

/// `inspect`'s KV budget: `floor(GPU memory × utilization) − weights − reserve` (bytes; negative
/// when the weights do not fit).
pub fn kv_budget(gpu_memory: u64, utilization: f64, weights: u64, reserve: u64) -> i64 {
    let usable = (gpu_memory as f64 * utilization).floor() as i128;
    let budget = usable - weights as i128 - reserve as i128;
    budget.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// `inspect`'s KV-token prediction for a dense model (no recurrent state): the
/// [`kv_budget`] divided by the KV bytes per token; `None` when nothing fits. The runtime
/// benchmarks compare what the engine allocates with this figure.
pub fn predict_kv_tokens(
    gpu_memory: u64,
    utilization: f64,
    weights: u64,
    reserve: u64,
    kv_bytes_per_token: u64,
) -> Option<u64> {
    let b = kv_budget(gpu_memory, utilization, weights, reserve);
    (b > 0)
        .then(|| (b as u64).checked_div(kv_bytes_per_token))
        .flatten()
}

/// [`predict_kv_tokens`] for a model with a recurrent state per sequence (Gated-DeltaNet
/// hybrids): `slots = min(max_num_seqs, ⌊(budget − max_model_len × KV bytes per token) /
/// state⌋)` states are taken from the budget first, as rigbench's built-in runtime reserves
/// them; `state_bytes` 0 is [`predict_kv_tokens`].
#[allow(clippy::too_many_arguments)]
pub fn predict_kv_tokens_with_states(
    gpu_memory: u64,
    utilization: f64,
    weights: u64,
    reserve: u64,
    kv_bytes_per_token: u64,
    state_bytes: u64,
    max_num_seqs: u64,
    max_model_len: u64,
) -> Option<u64> {
    let b = kv_budget(gpu_memory, utilization, weights, reserve);
    if b <= 0 {
        return None;
    }
    let b = b as u64;
    let reserved = match state_bytes {
        0 => 0,
        s => {
            let one_request = max_model_len.saturating_mul(kv_bytes_per_token);
            let slots = max_num_seqs.min(b.saturating_sub(one_request) / s);
            if slots == 0 {
                return None;
            }
            slots * s
        }
    };
    (b - reserved).checked_div(kv_bytes_per_token)
}

/// What one sequence holds besides its KV, for the wording of the assumptions.
#[derive(Clone, Copy)]
struct SequenceState {
    /// Recurrent plus sliding-window state bytes of one sequence.
    state: u64,
    /// The sliding-window part of `state`.
    sliding_state: u64,
    /// State slots reserved before the KV cache (--max-num-seqs), if any.
    slots: Option<u64>,
}

/// Predict the footprint and capacity.
pub(crate) fn predict(
    facts: &ModelFacts,
    recs: &[Rec],
    followed: Option<&Rules>,
    other: Option<&Rules>,
    headers: Option<&Headers>,
    opts: &InspectOptions,
) -> CapacityPrediction {
    let mut p = CapacityPrediction {
        kind: "prediction".into(),
        gpu_memory_utilization: opts.gpu_memory_utilization,
        reserve_bytes: opts.reserve_bytes,
        linear_attention_layers: facts.linear_attention_layers,
        full_attention_layers: facts.full_attention_layers,
        sliding_attention_layers: facts.sliding_attention_layers,
        sliding_window: facts.sliding_window.filter(|_| facts.sliding_modelled()),
        ..Default::default()
    };
    let model_dtype = facts
        .dtype
        .as_deref()
        .and_then(KvCacheDtype::from_torch)
        .unwrap_or(KvCacheDtype::Bf16);
    let model_dtype_note = if facts.dtype.is_some() {
        format!("model dtype {}", model_dtype.name())
    } else {
        "model dtype unstated, BF16 assumed".into()
    };

    predict_weights(&mut p, recs, headers, model_dtype);
    let kv = predict_kv_dtype(
        &mut p,
        followed,
        other,
        opts,
        model_dtype,
        &model_dtype_note,
    );
    p.kv_dtype = kv.map(|d| d.name().to_string());

    predict_kv_per_token(&mut p, facts, kv);
    predict_gdn_state(&mut p, facts, model_dtype);

    p.gpu_memory_bytes = opts.gpu_memory_bytes;
    p.gpu_memory_source = opts.gpu_memory_source.clone();
    let (max_len, src) = match (opts.max_model_len, facts.max_position_embeddings) {
        (Some(l), _) => (Some(l), Some("--max-model-len".to_string())),
        (None, Some(l)) => (
            Some(l),
            Some("config.json max_position_embeddings (vLLM's default max_model_len)".to_string()),
        ),
        (None, None) => (None, None),
    };
    p.max_model_len = max_len;
    p.max_model_len_source = src;

    let gdn_state = p.state_bytes_per_sequence.unwrap_or(0);
    // One sequence's sliding-window KV at min(W, L) tokens (W when L is unknown).
    let sliding_state = match (p.sliding_bytes_per_token, p.sliding_window) {
        (Some(b), Some(w)) => b.saturating_mul(max_len.map_or(w, |l| l.min(w))),
        _ => 0,
    };
    let state = gdn_state.saturating_add(sliding_state);
    let slots = predict_tokens(&mut p, opts, max_len, state);
    if max_len.is_none() && p.kv_tokens.is_some() {
        p.not_computed.push(
            "maximum concurrency: config.json has no max_position_embeddings; pass --max-model-len"
                .into(),
        );
    }

    let st = SequenceState {
        state,
        sliding_state,
        slots,
    };
    predict_assumptions(&mut p, facts, recs, headers, opts, &st);
    p
}

/// The weight bytes and their source: from the headers, the index, or estimated from the modules.
fn predict_weights(
    p: &mut CapacityPrediction,
    recs: &[Rec],
    headers: Option<&Headers>,
    model_dtype: KvCacheDtype,
) {
    match headers {
        Some(h) if h.names_only => match h.index_total_size {
            Some(t) => {
                p.weight_bytes = Some(t);
                p.weight_source = "model.safetensors.index.json metadata.total_size (the index's own figure; no shard here to check it against)".into();
            }
            None => {
                p.weight_source =
                    "unknown: only the index is here and it states no metadata.total_size".into();
                p.not_computed
                    .push("weight bytes: no shard headers and no total_size in the index".into());
            }
        },
        Some(h) => {
            p.weight_bytes = Some(h.tensors.iter().map(|t| t.bytes).sum());
            p.weight_source = "exact: sum of every tensor in the safetensors headers (any vision tower and MTP weights included: engines load them even when unused)".into();
        }
        None if !recs.is_empty() => {
            let mut total = 0u64;
            for r in recs {
                if let Some((n, k)) = r.m.est_nk {
                    total += weight_bytes(&r.effective, n, k, model_dtype.bytes())
                        * r.m.multiplicity.max(1);
                }
                total += r.m.est_params * model_dtype.bytes();
            }
            p.weight_bytes = Some(total);
            p.weight_source = "estimate (no safetensors headers): config.json dimensions × the declared format of each module, scales included; norms and biases left out, vision tower approximated".into();
        }
        None => {
            p.weight_source = "unknown: no safetensors headers and module shapes of this architecture are not modelled".into();
            p.not_computed
                .push("weight bytes: no safetensors headers to read them from".into());
        }
    }
}

/// The KV cache dtype and its source: the command line, the followed metadata, or the model dtype.
fn predict_kv_dtype(
    p: &mut CapacityPrediction,
    followed: Option<&Rules>,
    other: Option<&Rules>,
    opts: &InspectOptions,
    model_dtype: KvCacheDtype,
    model_dtype_note: &str,
) -> Option<KvCacheDtype> {
    let declared_kv = |r: Option<&Rules>| r.and_then(|r| r.kv.clone().map(|k| (r.file.clone(), k)));
    let kv = match opts.kv_cache_dtype {
        Some(d) => {
            p.kv_dtype_source = "--kv-cache-dtype".into();
            Some(d)
        }
        None => match declared_kv(followed) {
            Some((file, k)) => match KvCacheDtype::from_torch(&k) {
                Some(d) => {
                    p.kv_dtype_source = format!("{file} declares {k} KV cache");
                    Some(d)
                }
                None => {
                    p.kv_dtype_source =
                        format!("{file} declares a {k} KV cache, which rigbench does not size");
                    None
                }
            },
            None => {
                let mut s = format!(
                    "no KV-cache quantization in {}: {model_dtype_note} (vLLM --kv-cache-dtype auto)",
                    followed
                        .map(|r| r.file.as_str())
                        .unwrap_or("the metadata")
                );
                if let Some((file, k)) = declared_kv(other) {
                    s.push_str(&format!(
                        "; {file} declares {k}, which vLLM does not read when config.json has a quantization_config: pass --kv-cache-dtype fp8 to predict for it"
                    ));
                }
                p.kv_dtype_source = s;
                Some(model_dtype)
            }
        },
    };
    kv
}

/// The KV bytes per token of the full-attention (and sliding-window) layers, or why not modelled.
fn predict_kv_per_token(p: &mut CapacityPrediction, facts: &ModelFacts, kv: Option<KvCacheDtype>) {
    match (
        facts.full_attention_layers,
        facts.num_key_value_heads,
        facts.head_dim,
        kv,
    ) {
        (Some(l), Some(h), Some(d), Some(b)) => {
            let per_layer = 2u64
                .checked_mul(h)
                .and_then(|x| x.checked_mul(d))
                .and_then(|x| x.checked_mul(b.bytes()));
            p.kv_bytes_per_token = per_layer.and_then(|x| x.checked_mul(l));
            if facts.sliding_modelled() {
                p.sliding_bytes_per_token =
                    per_layer.and_then(|x| x.checked_mul(facts.sliding_attention_layers));
            }
            if p.kv_bytes_per_token.is_none() {
                p.not_computed
                    .push("KV bytes per token: config.json dimensions overflow 64 bits".into());
            }
        }
        _ => p.not_computed.push(
            "KV bytes per token: config.json lacks layers, KV heads or head_dim, or the KV dtype is unknown"
                .into(),
        ),
    }

    if let Some(why) = facts.kv_not_modelled() {
        p.kv_bytes_per_token = None;
        p.kv_not_modelled = Some(why.clone());
        p.not_computed.push(format!(
            "KV bytes per token, KV tokens and concurrency: not modelled: {why}"
        ));
    }
}

/// The Gated-DeltaNet recurrent state per sequence, with its derivation as an assumption.
fn predict_gdn_state(p: &mut CapacityPrediction, facts: &ModelFacts, model_dtype: KvCacheDtype) {
    if facts.linear_attention_layers > 0 {
        let la = facts.linear_attention.clone().unwrap_or_default();
        match (
            la.num_key_heads,
            la.num_value_heads,
            la.key_head_dim,
            la.value_head_dim,
        ) {
            (Some(nk), Some(nv), Some(dk), Some(dv)) => {
                let ck = la.conv_kernel.unwrap_or(4);
                let conv_dim = nk
                    .saturating_mul(dk)
                    .saturating_mul(2)
                    .saturating_add(nv.saturating_mul(dv));
                let ssm = la
                    .ssm_dtype
                    .as_deref()
                    .and_then(KvCacheDtype::from_torch)
                    .unwrap_or(model_dtype);
                let per_layer = conv_dim
                    .saturating_mul(ck.saturating_sub(1))
                    .saturating_mul(model_dtype.bytes())
                    .saturating_add(
                        nv.saturating_mul(dv)
                            .saturating_mul(dk)
                            .saturating_mul(ssm.bytes()),
                    );
                p.state_bytes_per_sequence =
                    Some(per_layer.saturating_mul(facts.linear_attention_layers));
                p.assumptions.push(format!(
                    "Gated-DeltaNet state per sequence = {} layers × (conv {conv_dim} × {} × {} B + SSM {nv} × {dv} × {dk} × {} B) = {} (vLLM MambaStateShapeCalculator.gated_delta_net_state_shape; conv state in the model dtype, SSM state in {}{}); it does not grow with tokens",
                    facts.linear_attention_layers,
                    ck.saturating_sub(1),
                    model_dtype.bytes(),
                    ssm.bytes(),
                    human_bytes(per_layer.saturating_mul(facts.linear_attention_layers)),
                    ssm.name(),
                    if la.ssm_dtype.is_some() { " per config mamba_ssm_dtype" } else { ", the model dtype (config names no mamba_ssm_dtype)" },
                ));
                p.assumptions.push("vLLM's hybrid allocator pads attention and state pages to one page size and may keep extra states for prefix caching, so engines can report fewer tokens than predicted here for hybrid models".into());
            }
            _ => p.not_computed.push(
                "Gated-DeltaNet state: config.json lacks linear_num_*_heads or linear_*_head_dim"
                    .into(),
            ),
        }
    }
}

/// The KV budget, whether one sequence fits, KV tokens and concurrency; the state slots reserved, if any.
fn predict_tokens(
    p: &mut CapacityPrediction,
    opts: &InspectOptions,
    max_len: Option<u64>,
    state: u64,
) -> Option<u64> {
    let mut slots: Option<u64> = None;
    match (opts.gpu_memory_bytes, p.weight_bytes) {
        (Some(mem), Some(w)) => {
            let budget = kv_budget(mem, opts.gpu_memory_utilization, w, opts.reserve_bytes);
            p.kv_budget_bytes = Some(budget);
            let fits = budget > state as i64;
            p.fits = Some(fits);
            if !fits {
                p.not_computed.push(format!(
                    "KV tokens: the weights ({}) and reserve do not leave room for even one sequence in {} × {}",
                    human_bytes(w),
                    human_bytes(mem),
                    opts.gpu_memory_utilization
                ));
            } else if p.facts_ok_for_tokens() {
                let per_tok = p.kv_bytes_per_token.unwrap_or(0);
                // States reserved before the KV cache: one (vLLM), or a slot per sequence that
                // may run (--max-num-seqs, the built-in runtime), fewer when they would not
                // leave room for one request of max_model_len tokens.
                let reserved = match opts.max_num_seqs.filter(|_| state > 0) {
                    None => state,
                    Some(n) => {
                        let one_request = max_len.unwrap_or(0).saturating_mul(per_tok);
                        let fit = (budget as u64).saturating_sub(one_request) / state;
                        let s = n.min(fit).max(1);
                        slots = Some(s);
                        s.saturating_mul(state)
                    }
                };
                if let Some(tokens) = (budget as u64)
                    .saturating_sub(reserved)
                    .checked_div(per_tok)
                {
                    p.kv_tokens = Some(tokens);
                    if let Some(l) = max_len {
                        let per_seq = l as f64 * per_tok as f64 + state as f64;
                        let c = budget as f64 / per_seq;
                        p.max_concurrency = Some(match slots {
                            Some(s) => (tokens as f64 / l.max(1) as f64).min(s as f64),
                            None => c,
                        });
                    }
                } else if state > 0 {
                    p.max_concurrency = Some(budget as f64 / state as f64);
                }
            }
        }
        (None, _) => p.not_computed.push(
            "KV tokens and concurrency: need a GPU memory size (no GPU found; pass --gpu-mem-gib)"
                .into(),
        ),
        (Some(_), None) => p
            .not_computed
            .push("KV tokens and concurrency: need the weight bytes".into()),
    }
    slots
}

/// The prediction's assumptions, the general ones first, then those gathered in `p.assumptions`.
fn predict_assumptions(
    p: &mut CapacityPrediction,
    facts: &ModelFacts,
    recs: &[Rec],
    headers: Option<&Headers>,
    opts: &InspectOptions,
    st: &SequenceState,
) {
    let SequenceState {
        state,
        sliding_state,
        slots,
    } = *st;
    let mut a = vec![
        "a prediction from metadata, not a measurement: the engine reports the real figure at startup (vLLM: 'GPU KV cache size: N tokens', 'Maximum concurrency for L tokens per request')".to_string(),
        format!(
            "KV budget = GPU memory × {} − weights − reserve {}; the reserve is an assumption for peak activations at the prefill chunk, the CUDA-graph pool and the CUDA context (vLLM measures it by profiling; set it with --reserve-gib)",
            opts.gpu_memory_utilization,
            human_bytes(opts.reserve_bytes)
        ),
    ];
    if p.kv_not_modelled.is_none() {
        a.push("KV bytes per token = full-attention layers × 2 (K and V) × KV heads × head_dim × KV dtype bytes; per-tensor FP8 KV scales are negligible and not counted; one GPU (tensor parallelism 1)".to_string());
    }
    if let (Some(s), Some(n)) = (slots, opts.max_num_seqs) {
        a.push(format!(
            "--max-num-seqs {n}: {s} Gated-DeltaNet states of {} reserved before the KV cache ({}), as rigbench's built-in runtime reserves one slot per sequence that may run{}",
            human_bytes(state),
            human_bytes(s.saturating_mul(state)),
            if s < n { " (fewer than asked: more would not leave room for one request of max_model_len tokens)" } else { "" }
        ));
    }
    if facts.mtp_layers.unwrap_or(0) > 0 && p.kv_not_modelled.is_none() {
        let n = facts.mtp_layers.unwrap_or(0);
        a.push(format!(
            "the {} {} not counted in KV per token: engines allocate their KV only when MTP speculative decoding is on (add one full-attention layer each)",
            crate::output::table::plural(n, "MTP layer", "MTP layers"),
            if n == 1 { "is" } else { "are" }
        ));
    }
    if !facts.attention_extras.is_empty() && p.kv_not_modelled.is_none() {
        a.push(format!(
            "config.json has attention fields the generic formula ignores ({}): this architecture's KV layout differs (latent/compressed/sliding attention), so the per-token figure may be far off",
            facts.attention_extras.join(", ")
        ));
    }
    if let (Some(b), Some(w)) = (p.sliding_bytes_per_token, p.sliding_window) {
        a.push(format!(
            "{} sliding-window layers (config layer_types, sliding_window {}) keep at most {} tokens per sequence: {} per token up to the window, {} per sequence at min(window, max_model_len), reserved per sequence like a recurrent state; the {} full-attention layers give the KV bytes per token",
            facts.sliding_attention_layers,
            crate::output::table::thousands(w),
            crate::output::table::thousands(w),
            human_bytes(b),
            human_bytes(sliding_state),
            facts.full_attention_layers.unwrap_or(0)
        ));
    } else if facts.layer_types.iter().any(|t| t == "sliding_attention") {
        a.push(
            "sliding-window layers are counted as full attention (config.json states no sliding_window): an upper bound on their KV"
                .into(),
        );
    }
    if let Some(n) = recs
        .iter()
        .filter(|r| matches!(r.effective, ModuleFormat::Other { .. }))
        .map(|r| r.m.multiplicity.max(1))
        .reduce(|a, b| a + b)
        .filter(|_| headers.is_none())
    {
        a.push(format!(
            "{n} modules are in a format rigbench does not size; the weight estimate counts them at the model dtype (an upper bound)"
        ));
    }
    a.append(&mut p.assumptions);
    p.assumptions = a;
}

impl CapacityPrediction {
    fn facts_ok_for_tokens(&self) -> bool {
        self.kv_bytes_per_token.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names() {
        assert_eq!("fp8".parse::<KvCacheDtype>().unwrap().bytes(), 1);
        assert_eq!(
            "bfloat16".parse::<KvCacheDtype>().unwrap(),
            KvCacheDtype::Bf16
        );
        assert_eq!(
            KvCacheDtype::from_torch("torch.float32"),
            Some(KvCacheDtype::F32)
        );
        assert!("int3".parse::<KvCacheDtype>().is_err());
    }

    #[test]
    fn weight_byte_formulas() {
        let nv = ModuleFormat::Nvfp4 {
            activations_4bit: false,
            group_size: 16,
        };
        assert_eq!(weight_bytes(&nv, 64, 64, 2), 2048 + 256 + 8);
        assert_eq!(weight_bytes(&ModuleFormat::Bf16, 64, 64, 2), 8192);
        let fp8 = ModuleFormat::Fp8 {
            scaling: "per-tensor".into(),
            activations: "static".into(),
        };
        assert_eq!(weight_bytes(&fp8, 64, 64, 2), 4096 + 8);
    }
}
