//! The request bodies of the generation endpoints and their checks: parsing (vLLM's field list
//! first, `crate::runtime::request_fields`), the fields chat and completions share
//! ([`Common`]), and [`validate`], which turns them into the engine's settings ([`Gen`]) or a
//! 400 naming the field at fault.

use axum::body::Bytes;
use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use crate::runtime::sampler::SamplingParams;

pub(super) fn parse_body<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("Invalid JSON body: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad("the request body must be a JSON object"));
    }
    serde_json::from_value(v).map_err(|e| ApiError::bad(format!("Invalid request: {e}")))
}

/// [`parse_body`] for a generation request, after its top-level fields are checked against
/// vLLM's (`crate::runtime::request_fields`): a field it does not know, or one this server does
/// not honour set to anything but its neutral value, is a 400 naming it.
pub(super) fn parse_request<T: for<'de> Deserialize<'de>>(
    body: &Bytes,
    ep: crate::runtime::request_fields::Endpoint,
) -> Result<T, ApiError> {
    if let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(body) {
        if let Err(r) = crate::runtime::request_fields::check(&m, ep) {
            let e = ApiError::bad(r.message);
            return Err(match r.param {
                Some(p) => e.param(p),
                None => e,
            });
        }
    }
    parse_body(body)
}

#[derive(Debug, Deserialize, Default)]
pub(super) struct StreamOptions {
    include_usage: Option<bool>,
}

/// Fields shared by chat and completions requests.
#[derive(Debug, Deserialize, Default)]
pub(super) struct Common {
    pub(super) model: Option<String>,
    pub(super) stream: Option<bool>,
    pub(super) stream_options: Option<StreamOptions>,
    pub(super) max_tokens: Option<Value>,
    pub(super) max_completion_tokens: Option<Value>,
    // Sampling numbers are read as JSON values and checked by `validate`, so that a wrong type
    // ("NaN", "0.7") gets an error naming the field, like a wrong value.
    pub(super) temperature: Option<Value>,
    pub(super) top_p: Option<Value>,
    pub(super) top_k: Option<Value>,
    pub(super) seed: Option<i64>,
    pub(super) ignore_eos: Option<bool>,
    pub(super) stop: Option<Value>,
    pub(super) n: Option<i64>,
    /// vLLM's extra field: the prompt tokens' log-probabilities with this many alternatives.
    pub(super) prompt_logprobs: Option<Value>,
    /// vLLM's `min_tokens`: no EOS, stop token or stop string before this many tokens.
    pub(super) min_tokens: Option<Value>,
}

/// An optional count of log-probability alternatives (`null` counts as absent), 0 to `max`
/// (the server's `--max-logprobs`, [`crate::runtime::serve_guard::ServeLimits::max_logprobs`]).
pub(super) fn logprob_count(
    v: &Option<Value>,
    name: &'static str,
    max: usize,
) -> Result<Option<usize>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(x) => {
            let n = int_field(x, name)?;
            if n < 0 || n as u64 > max as u64 {
                return Err(ApiError::bad(format!(
                    "{name} must be between 0 and {max} (this server's --max-logprobs), got {n}"
                ))
                .param(name));
            }
            Ok(Some(n as usize))
        }
    }
}

/// What a request asked for beyond text: log-probabilities and echo.
#[derive(Debug, Clone, Default)]
pub(super) struct Extras {
    /// Chat `logprobs: true`, or completions `logprobs: N`.
    pub(super) logprobs: bool,
    /// vLLM `prompt_logprobs` (returned as that field).
    pub(super) prompt_logprobs_field: bool,
    /// Completions `echo`: the prompt text and ids, returned before the completion.
    pub(super) echo: Option<(String, Vec<u32>)>,
}

#[derive(Debug, Deserialize)]
pub(super) struct ChatRequest {
    #[serde(flatten)]
    pub(super) common: Common,
    /// Chat: return the generated tokens' log-probabilities.
    pub(super) logprobs: Option<bool>,
    /// Chat: alternatives per token (0 to the server's `--max-logprobs`; needs `logprobs`).
    pub(super) top_logprobs: Option<Value>,
    pub(super) messages: Option<Value>,
    pub(super) chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    pub(super) add_generation_prompt: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub(super) struct CompletionRequest {
    #[serde(flatten)]
    pub(super) common: Common,
    pub(super) prompt: Option<Value>,
    pub(super) echo: Option<bool>,
    /// Completions: alternatives per token (0 to the server's `--max-logprobs`); present =
    /// return log-probabilities.
    pub(super) logprobs: Option<Value>,
}

/// Validated generation settings.
pub(super) struct Gen {
    pub(super) params: SamplingParams,
    pub(super) extras: Extras,
    pub(super) max_tokens: usize,
    pub(super) ignore_eos: bool,
    pub(super) stop: Vec<String>,
    pub(super) stream: bool,
    pub(super) include_usage: bool,
}

pub(super) fn int_field(v: &Value, name: &'static str) -> Result<i64, ApiError> {
    v.as_i64()
        .or_else(|| v.as_u64().map(|_| i64::MAX))
        .ok_or_else(|| ApiError::bad(format!("{name} must be an integer, got {v}")).param(name))
}

/// An optional number field (`null` counts as absent).
pub(super) fn num_field(v: &Option<Value>, name: &'static str) -> Result<Option<f64>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_f64()
            .map(Some)
            .ok_or_else(|| ApiError::bad(format!("{name} must be a number, got {x}")).param(name)),
    }
}

/// `min_tokens` (vLLM's checks: an integer from 0 to `max_tokens`; `null` is 0).
pub(super) fn min_tokens(c: &Common, max_tokens: usize) -> Result<usize, ApiError> {
    let Some(v) = c.min_tokens.as_ref().filter(|v| !v.is_null()) else {
        return Ok(0);
    };
    let n = int_field(v, "min_tokens")?;
    if n < 0 {
        return Err(
            ApiError::bad(format!("min_tokens must be at least 0, got {n}")).param("min_tokens"),
        );
    }
    if n as u64 > max_tokens as u64 {
        return Err(ApiError::bad(format!(
            "min_tokens must be less than or equal to max_tokens={max_tokens}, got {n}"
        ))
        .param("min_tokens"));
    }
    Ok(n as usize)
}

pub(super) fn validate(
    c: &Common,
    prompt_len: usize,
    max_model_len: usize,
    default_max: Option<usize>,
    max_logprobs: usize,
) -> Result<Gen, ApiError> {
    if let Some(n) = c.n {
        if n != 1 {
            return Err(ApiError::bad(format!("n = {n} is not supported; only n = 1")).param("n"));
        }
    }
    let temperature = num_field(&c.temperature, "temperature")?.unwrap_or(1.0);
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(ApiError::bad(format!(
            "temperature must be a number >= 0, got {temperature}"
        ))
        .param("temperature"));
    }
    let top_p = num_field(&c.top_p, "top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad(format!("top_p must be in (0, 1], got {top_p}")).param("top_p"));
    }
    let top_k = match c
        .top_k
        .as_ref()
        .filter(|v| !v.is_null())
        .map(|v| int_field(v, "top_k"))
        .transpose()?
    {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k as usize,
        Some(k) => {
            return Err(
                ApiError::bad(format!("top_k must be -1 (off) or at least 1, got {k}"))
                    .param("top_k"),
            )
        }
    };
    let stop = match &c.stop {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::bad("stop must be a string or a list of strings").param("stop")
            })?,
        Some(_) => {
            return Err(ApiError::bad("stop must be a string or a list of strings").param("stop"))
        }
    };
    if prompt_len >= max_model_len {
        return Err(ApiError::bad(format!(
            "This model's maximum context length is {max_model_len} tokens. However, your request has {prompt_len} input tokens. Please reduce the length of the input."
        )));
    }
    let room = max_model_len - prompt_len;
    let requested = match (&c.max_completion_tokens, &c.max_tokens) {
        (Some(v), _) if !v.is_null() => Some((
            int_field(v, "max_completion_tokens")?,
            "max_completion_tokens",
        )),
        (_, Some(v)) if !v.is_null() => Some((int_field(v, "max_tokens")?, "max_tokens")),
        _ => None,
    };
    let max_tokens = match requested {
        Some((m, name)) => {
            if m < 1 {
                return Err(
                    ApiError::bad(format!("{name} must be at least 1, got {m}")).param(
                        if name == "max_tokens" {
                            "max_tokens"
                        } else {
                            "max_completion_tokens"
                        },
                    ),
                );
            }
            if m as u64 > room as u64 {
                return Err(ApiError::bad(format!(
                    "This model's maximum context length is {max_model_len} tokens. However, you requested {} tokens ({prompt_len} in the input, {m} in the completion). Please reduce the length of the input or the completion.",
                    (prompt_len as u128) + (m as u128)
                ))
                .param(if name == "max_tokens" { "max_tokens" } else { "max_completion_tokens" }));
            }
            m as usize
        }
        None => default_max.unwrap_or(room).min(room),
    };
    let prompt_logprobs = logprob_count(&c.prompt_logprobs, "prompt_logprobs", max_logprobs)?;
    let min_tokens = min_tokens(c, max_tokens)?;
    Ok(Gen {
        params: SamplingParams {
            temperature: temperature as f32,
            top_p: top_p as f32,
            top_k,
            seed: c.seed.map(|s| s as u64),
            logprobs: None,
            prompt_logprobs,
            min_tokens,
        },
        extras: Extras {
            prompt_logprobs_field: prompt_logprobs.is_some(),
            ..Default::default()
        },
        max_tokens,
        ignore_eos: c.ignore_eos.unwrap_or(false),
        stop,
        stream: c.stream.unwrap_or(false),
        include_usage: c
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
    })
}
