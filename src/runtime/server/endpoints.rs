//! The endpoints besides generation: `GET /v1/models`, `/health`, `/version`, `/metrics`,
//! `POST /reset_prefix_cache`, `/rigbench/reset_peaks`, `/tokenize` and `/detokenize`.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::app::{off_request_threads, AppState};
use super::error::ApiError;
use super::generate::render_chat;
use super::request::parse_body;

pub(super) async fn models(State(app): State<AppState>) -> Json<Value> {
    let i = &app.engine.info;
    Json(json!({"object": "list", "data": [{
        "id": i.served_model_name, "object": "model", "created": app.created, "owned_by": "rigbench",
        "root": i.model, "parent": null, "max_model_len": i.capacity.max_model_len,
    }]}))
}

pub(super) async fn health() -> StatusCode {
    StatusCode::OK
}

pub(super) async fn version(State(app): State<AppState>) -> Json<Value> {
    let i = &app.engine.info;
    Json(json!({
        "engine": "rigbench",
        "version": env!("CARGO_PKG_VERSION"),
        "backend": i.backend,
        "device": i.device,
        "model": i.served_model_name,
        "model_provenance": i.provenance,
        "weight_format": i.weight_format.id(),
        "kv_cache_dtype": i.kv.dtype.vllm_name(),
        "block_size": i.kv.block_size,
        "num_kv_blocks": i.kv.num_blocks,
        "kv_cache_budget_bytes": i.kv_plan.budget_bytes,
        "kv_cache_budget_source": i.kv_plan.source,
        "gpu_memory_utilization": i.kv_plan.gpu_memory_utilization,
        "kv_cache_tokens": i.capacity.tokens(),
        "max_model_len": i.capacity.max_model_len,
        "enable_prefix_caching": i.enable_prefix_caching,
        "speculative": i.spec.as_ref().map(|s| json!({
            "method": "ngram", "num_speculative_tokens": s.num_speculative_tokens,
            "prompt_lookup_min": s.prompt_lookup_min, "prompt_lookup_max": s.prompt_lookup_max,
        })),
    }))
}

pub(super) async fn metrics(State(app): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.engine.metrics.render(),
    )
        .into_response()
}

/// `POST /rigbench/reset_peaks`: restart the high-water marks of `/metrics`
/// (`rigbench:kv_cache_usage_peak_perc`) from the current values.
pub(super) async fn reset_peaks(State(app): State<AppState>) -> Response {
    app.engine.metrics.update(|m| m.reset_peaks());
    StatusCode::OK.into_response()
}

pub(super) async fn reset_prefix_cache(State(app): State<AppState>) -> Response {
    match app.engine.reset_prefix_cache().await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => ApiError::internal(e.to_string()).into_response(),
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct TokenizeRequest {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Value>,
    add_special_tokens: Option<bool>,
    add_generation_prompt: Option<bool>,
    chat_template_kwargs: Option<serde_json::Map<String, Value>>,
}

pub(super) async fn tokenize(State(app): State<AppState>, body: Bytes) -> Response {
    let r = off_request_threads(&app, move |app| -> Result<Value, ApiError> {
        let req: TokenizeRequest = parse_body(&body)?;
        app.check_model(&req.model)?;
        let tokens = match (&req.prompt, &req.messages) {
            (Some(p), None) => app
                .engine
                .tokenizer
                .encode(p, req.add_special_tokens.unwrap_or(true))
                .map_err(|e| ApiError::bad(e.to_string()))?,
            (None, Some(_)) => {
                let kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
                render_chat(
                    app,
                    &req.messages,
                    &kwargs,
                    req.add_generation_prompt.unwrap_or(true),
                )?
                .0
            }
            _ => return Err(ApiError::bad("give exactly one of 'prompt' or 'messages'")),
        };
        Ok(
            json!({"count": tokens.len(), "max_model_len": app.max_model_len(), "tokens": tokens, "token_strs": null}),
        )
    })
    .await;
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct DetokenizeRequest {
    model: Option<String>,
    tokens: Option<Vec<i64>>,
}

pub(super) async fn detokenize(State(app): State<AppState>, body: Bytes) -> Response {
    let r = (|| -> Result<Value, ApiError> {
        let req: DetokenizeRequest = parse_body(&body)?;
        app.check_model(&req.model)?;
        let vocab = app.engine.info.model_config.vocab_size as i64;
        let toks = req
            .tokens
            .ok_or_else(|| ApiError::bad("'tokens' is required").param("tokens"))?;
        let ids: Vec<u32> = toks
            .iter()
            .map(|t| {
                if (0..vocab).contains(t) {
                    Ok(*t as u32)
                } else {
                    Err(
                        ApiError::bad(format!("token {t} is outside the vocabulary (0..{vocab})"))
                            .param("tokens"),
                    )
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(json!({"prompt": app.engine.tokenizer.decode(&ids, false)}))
    })();
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}
