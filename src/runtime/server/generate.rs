//! The two generation endpoints, `POST /v1/chat/completions` and `POST /v1/completions`: the
//! request parsed and its prompt built (the chat template, or text or token ids), the request
//! submitted to the engine, then the answer streamed or collected.

use std::convert::Infallible;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::Value;

use super::app::{off_request_threads, App, AppState};
use super::error::ApiError;
use super::request::{logprob_count, parse_request, validate, ChatRequest, CompletionRequest, Gen};
use super::response::{collect, new_id, now_secs, AbortGuard, Kind};
use super::stream::{next_events, StreamState};
use crate::runtime::engine::{GenerateRequest, ReasoningMode};

pub(super) fn render_chat(
    app: &App,
    messages: &Option<Value>,
    kwargs: &serde_json::Map<String, Value>,
    add_generation_prompt: bool,
) -> Result<(Vec<u32>, String), ApiError> {
    let msgs = match messages {
        None | Some(Value::Null) => {
            return Err(ApiError::bad("'messages' is required").param("messages"))
        }
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::bad("'messages' must not be empty").param("messages"))
        }
        Some(Value::Array(a)) if a.len() > app.max_chat_messages => {
            return Err(ApiError::bad(format!(
                "'messages' has {} messages; this server accepts at most {} in one request (rigbench serve --max-chat-messages)",
                a.len(),
                app.max_chat_messages
            ))
            .param("messages"))
        }
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(ApiError::bad("'messages' must be a list of messages").param("messages"))
        }
    };
    for (i, m) in msgs.iter().enumerate() {
        let Some(role) = m.get("role").and_then(Value::as_str) else {
            return Err(
                ApiError::bad(format!("messages[{i}] needs a string 'role'")).param("messages"),
            );
        };
        // The roles of the OpenAI chat API; anything else is a client mistake, not a prompt.
        const ROLES: [&str; 6] = [
            "system",
            "developer",
            "user",
            "assistant",
            "tool",
            "function",
        ];
        if !ROLES.contains(&role) {
            return Err(ApiError::bad(format!(
                "messages[{i}].role '{role}' is not one of {}",
                ROLES.join(", ")
            ))
            .param("messages"));
        }
    }
    let text = app
        .engine
        .template
        .render(msgs, add_generation_prompt, kwargs)
        .map_err(ApiError::bad)?;
    let ids = app
        .engine
        .tokenizer
        .encode(&text, false)
        .map_err(|e| ApiError::bad(e.to_string()))?;
    Ok((ids, text))
}

pub(super) fn reasoning_mode(
    app: &App,
    kwargs: &serde_json::Map<String, Value>,
    prompt: &[u32],
) -> ReasoningMode {
    if kwargs.get("enable_thinking").and_then(Value::as_bool) == Some(false) {
        return ReasoningMode::Off;
    }
    let tok = &app.engine.tokenizer;
    let (Some(start), Some(end)) = (tok.think_start, tok.think_end) else {
        return ReasoningMode::Off;
    };
    let last_start = prompt.iter().rposition(|t| *t == start);
    let last_end = prompt.iter().rposition(|t| *t == end);
    match (last_start, last_end) {
        (Some(_), None) => ReasoningMode::InThink,
        (Some(s), Some(e)) if s > e => ReasoningMode::InThink,
        _ => ReasoningMode::Detect,
    }
}

pub(super) async fn chat_completions(State(app): State<AppState>, body: Bytes) -> Response {
    match chat_inner(app, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

pub(super) async fn chat_inner(app: AppState, body: Bytes) -> Result<Response, ApiError> {
    let arrival = Instant::now();
    let (req, kwargs, prompt) = off_request_threads(&app, move |app| {
        let req: ChatRequest =
            parse_request(&body, crate::runtime::request_fields::Endpoint::Chat)?;
        app.check_model(&req.common.model)?;
        let kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
        let (prompt, _) = render_chat(
            app,
            &req.messages,
            &kwargs,
            req.add_generation_prompt.unwrap_or(true),
        )?;
        Ok((req, kwargs, prompt))
    })
    .await?;
    let mut gen = validate(
        &req.common,
        prompt.len(),
        app.max_model_len(),
        None,
        app.max_logprobs,
    )?;
    let top = logprob_count(&req.top_logprobs, "top_logprobs", app.max_logprobs)?;
    match (req.logprobs, top) {
        (Some(true), t) => {
            gen.params.logprobs = Some(t.unwrap_or(0));
            gen.extras.logprobs = true;
        }
        (_, Some(_)) => {
            return Err(
                ApiError::bad("top_logprobs needs logprobs set to true").param("top_logprobs")
            )
        }
        _ => {}
    }
    let mode = reasoning_mode(&app, &kwargs, &prompt);
    run_generation(
        app,
        Kind::Chat,
        prompt,
        gen,
        mode,
        arrival,
        req.common.model.clone(),
    )
    .await
}

pub(super) async fn completions(State(app): State<AppState>, body: Bytes) -> Response {
    match completions_inner(app, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

pub(super) async fn completions_inner(app: AppState, body: Bytes) -> Result<Response, ApiError> {
    let arrival = Instant::now();
    let (req, prompt) = off_request_threads(&app, move |app| {
        let req: CompletionRequest =
            parse_request(&body, crate::runtime::request_fields::Endpoint::Completions)?;
        app.check_model(&req.common.model)?;
        let vocab = app.engine.info.model_config.vocab_size;
        let ids_of = |a: &[Value]| -> Result<Vec<u32>, ApiError> {
            a.iter()
                .map(|x| {
                    x.as_u64()
                        .filter(|t| (*t as usize) < vocab)
                        .map(|t| t as u32)
                        .ok_or_else(|| {
                            ApiError::bad(format!(
                                "prompt token {x} is not an id below the vocabulary size {vocab}"
                            ))
                            .param("prompt")
                        })
                })
                .collect()
        };
        let prompt: Vec<u32> = match &req.prompt {
            None | Some(Value::Null) => return Err(ApiError::bad("'prompt' is required").param("prompt")),
            Some(Value::String(s)) => app.engine.tokenizer.encode(s, true).map_err(|e| ApiError::bad(e.to_string()))?,
            Some(Value::Array(a)) if a.iter().all(Value::is_number) && !a.is_empty() => ids_of(a)?,
            Some(Value::Array(a)) if a.len() == 1 => match &a[0] {
                Value::String(s) => app.engine.tokenizer.encode(s, true).map_err(|e| ApiError::bad(e.to_string()))?,
                Value::Array(inner) => ids_of(inner)?,
                _ => return Err(ApiError::bad("prompt must be a string, a list of token ids, or a one-element list of either").param("prompt")),
            },
            Some(_) => {
                return Err(ApiError::bad("prompt must be a string, a list of token ids, or a one-element list of either (batched prompts are not supported)").param("prompt"))
            }
        };
        Ok((req, prompt))
    })
    .await?;
    if prompt.is_empty() {
        return Err(ApiError::bad("the prompt is empty after tokenization").param("prompt"));
    }
    // OpenAI's and vLLM's default for completions.
    let mut gen = validate(
        &req.common,
        prompt.len(),
        app.max_model_len(),
        Some(16),
        app.max_logprobs,
    )?;
    if let Some(k) = logprob_count(&req.logprobs, "logprobs", app.max_logprobs)? {
        gen.params.logprobs = Some(k);
        gen.extras.logprobs = true;
    }
    if req.echo == Some(true) {
        // The prompt comes back before the completion; with logprobs, its tokens' too.
        let text = app.engine.tokenizer.decode(&prompt, false);
        gen.extras.echo = Some((text, prompt.clone()));
        if let Some(k) = gen.params.logprobs {
            gen.params.prompt_logprobs = Some(gen.params.prompt_logprobs.unwrap_or(0).max(k));
        }
    }
    run_generation(
        app,
        Kind::Completion,
        prompt,
        gen,
        ReasoningMode::Off,
        arrival,
        req.common.model.clone(),
    )
    .await
}

pub(super) async fn run_generation(
    app: AppState,
    kind: Kind,
    prompt: Vec<u32>,
    gen: Gen,
    mode: ReasoningMode,
    arrival: Instant,
    model: Option<String>,
) -> Result<Response, ApiError> {
    let model = model.unwrap_or_else(|| app.engine.info.served_model_name.clone());
    let (id, rx) = app
        .engine
        .submit(GenerateRequest {
            prompt,
            params: gen.params.clone(),
            max_tokens: gen.max_tokens,
            ignore_eos: gen.ignore_eos,
            stop: gen.stop.clone(),
            reasoning: mode,
            arrival,
        })
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let guard = AbortGuard {
        engine: app.engine.clone(),
        id,
        done: false,
    };
    let rid = new_id(if kind == Kind::Chat {
        "chatcmpl"
    } else {
        "cmpl"
    });
    let created = now_secs();
    if gen.stream {
        let st = StreamState {
            rx,
            guard,
            kind,
            id: rid,
            created,
            model,
            include_usage: gen.include_usage,
            started: false,
            finished: false,
            app: app.clone(),
            extras: gen.extras.clone(),
            text_len: 0,
        };
        let stream = futures::stream::unfold(st, next_events)
            .flat_map(|v| futures::stream::iter(v.into_iter().map(Ok::<Event, Infallible>)));
        return Ok(Sse::new(stream).into_response());
    }
    collect(rx, guard, kind, rid, created, model, &app, &gen.extras).await
}
