//! The engine's public request and output types: what a caller submits, what comes back per
//! request, and the engine's configuration and facts.

use super::*;

/// How generated text is split into reasoning and content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningMode {
    /// Everything is content (completions; chat with thinking off).
    Off,
    /// The prompt left a `<think>` block open: text up to `</think>` is reasoning.
    InThink,
    /// Reasoning only if the output starts with `<think>` (templates that do not open it).
    Detect,
}

/// A generation request for the engine.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Prompt token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Sampling settings.
    pub params: SamplingParams,
    /// Most tokens to generate (≥ 1).
    pub max_tokens: usize,
    /// Keep generating through EOS.
    pub ignore_eos: bool,
    /// Stop strings (matched in the generated text; excluded from the output).
    pub stop: Vec<String>,
    /// Reasoning split.
    pub reasoning: ReasoningMode,
    /// When the request arrived (TTFT and E2E are measured from here).
    pub arrival: Instant,
}

/// Why a request finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS or a stop string (OpenAI `"stop"`).
    Stop,
    /// `max_tokens` or the context length (OpenAI `"length"`).
    Length,
    /// Aborted by the server.
    Abort,
    /// The engine failed on this request.
    Error(String),
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_openai(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error(_) => "error",
        }
    }
}

/// A token's log-probability under the model (log-softmax of the raw logits, before
/// temperature and top-k/top-p, as vLLM reports by default) and the most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub token: u32,
    /// Its log-probability, nats.
    pub logprob: f32,
    /// Its rank among all tokens (1 = the most likely).
    pub rank: usize,
    /// The `k` most likely tokens and their log-probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprob {
    /// The log-probability of `token` in a logit row, with the `k` most likely alternatives.
    pub fn of(row: &[f32], token: u32, k: usize) -> Self {
        let lp = crate::runtime::direct::log_softmax(row);
        let chosen = lp.get(token as usize).copied().unwrap_or(f64::NEG_INFINITY);
        let rank = 1 + lp.iter().filter(|v| **v > chosen).count();
        let k = k.min(lp.len());
        let mut top: Vec<(u32, f32)> = Vec::with_capacity(k);
        if k > 0 {
            let mut idx: Vec<usize> = (0..lp.len()).collect();
            idx.select_nth_unstable_by(k.saturating_sub(1), |a, b| {
                lp[*b].total_cmp(&lp[*a]).then(a.cmp(b))
            });
            idx.truncate(k);
            idx.sort_by(|a, b| lp[*b].total_cmp(&lp[*a]).then(a.cmp(b)));
            top = idx.into_iter().map(|i| (i as u32, lp[i] as f32)).collect();
        }
        TokenLogprob {
            token,
            logprob: chosen as f32,
            rank,
            top,
        }
    }
}

/// One step's output for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestOutput {
    /// New content text.
    pub content: String,
    /// New reasoning text.
    pub reasoning: String,
    /// Tokens generated in this step.
    pub new_tokens: usize,
    /// Set on the last output.
    pub finish: Option<FinishReason>,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    /// Tokens generated so far.
    pub completion_tokens: usize,
    /// Log-probabilities of this output's tokens (when the request asked for them).
    pub logprobs: Vec<TokenLogprob>,
    /// Log-probabilities of the prompt tokens, one per prompt position (`None` for the first,
    /// which nothing predicts); on the first output of a request that asked for them.
    pub prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
}

/// Engine settings derived from a [`ServeConfig`].
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Scheduler limits.
    pub scheduler: SchedulerConfig,
    /// KV blocks and their layout.
    pub kv: KvCacheSpec,
    /// Longest prompt + output.
    pub max_model_len: usize,
    /// Prefix caching on.
    pub enable_prefix_caching: bool,
    /// Speculative decoding.
    pub spec: Option<SpecConfig>,
    /// Seed for requests without one.
    pub seed: u64,
}

/// Facts about a loaded engine, for logs and endpoints.
#[derive(Debug, Clone)]
pub struct EngineInfo {
    /// Name clients use.
    pub served_model_name: String,
    /// The `--model` value.
    pub model: String,
    /// Backend name (`cpu`, `cuda`).
    pub backend: String,
    /// The device, as the backend describes it (`cpu`, `cuda:0 (NVIDIA H200, sm_90)`).
    pub device: String,
    /// Where the weights came from (synthetic seed, or checkpoint path and content hash).
    pub provenance: ModelProvenance,
    /// Model shape.
    pub model_config: ModelConfig,
    /// Linear-layer weight format.
    pub weight_format: WeightFormat,
    /// Weight bytes as stored.
    pub weight_bytes: u64,
    /// KV capacity.
    pub capacity: KvCapacity,
    /// KV layout.
    pub kv: KvCacheSpec,
    /// The KV-cache plan (budget, its source, device memory facts).
    pub kv_plan: KvPlan,
    /// Prefix caching on.
    pub enable_prefix_caching: bool,
    /// Speculative decoding.
    pub spec: Option<SpecConfig>,
    /// Tokenizer source.
    pub tokenizer_source: String,
    /// Chat template source.
    pub template_source: String,
    /// Config defaults taken and loader notes (printed at start).
    pub notes: Vec<String>,
}
