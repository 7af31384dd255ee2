//! The answer to a generation request that is not streamed ([`collect`]) and the parts every
//! answer has: ids and timestamps, `usage`, the log-probability objects of chat, completions and
//! vLLM's `prompt_logprobs`, and the guard that aborts the engine request of a client gone.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::mpsc as tmpsc;

use super::app::App;
use super::error::ApiError;
use super::request::Extras;
use crate::runtime::engine::{EngineHandle, FinishReason, RequestOutput, TokenLogprob};

/// A token as text (its own decoding, special tokens included).
pub(super) fn token_text(app: &App, id: u32) -> String {
    app.engine.tokenizer.decode(&[id], false)
}

/// OpenAI's legacy completions `logprobs` object for `entries` (one per token; `None` for a
/// token nothing predicts, the first prompt token under `echo`), `text_offset` counted from
/// `offset` in characters of the returned text.
pub(super) fn completion_logprobs(
    app: &App,
    entries: &[(u32, Option<&TokenLogprob>)],
    offset: usize,
) -> Value {
    let (mut tokens, mut lps, mut tops, mut offs) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut at = offset;
    for (id, e) in entries {
        let t = token_text(app, *id);
        offs.push(json!(at));
        at += t.chars().count();
        tokens.push(json!(t));
        match e {
            Some(e) => {
                lps.push(json!(e.logprob));
                let mut m = serde_json::Map::new();
                for (tid, lp) in &e.top {
                    m.insert(token_text(app, *tid), json!(lp));
                }
                tops.push(Value::Object(m));
            }
            None => {
                lps.push(Value::Null);
                tops.push(Value::Null);
            }
        }
    }
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs})
}

/// The chat `logprobs` object: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
pub(super) fn chat_logprobs(app: &App, entries: &[TokenLogprob]) -> Value {
    let one = |id: u32, lp: f32| {
        let t = token_text(app, id);
        json!({"token": t, "logprob": lp, "bytes": t.as_bytes()})
    };
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = one(e.token, e.logprob);
            v["top_logprobs"] = Value::Array(e.top.iter().map(|(t, lp)| one(*t, *lp)).collect());
            v
        })
        .collect();
    json!({ "content": content })
}

/// vLLM's `prompt_logprobs`: per prompt position `null` (the first) or
/// `{"<id>": {"logprob", "rank", "decoded_token"}}` with the prompt token and the alternatives.
pub(super) fn vllm_prompt_logprobs(app: &App, entries: &[Option<TokenLogprob>]) -> Value {
    Value::Array(
        entries
            .iter()
            .map(|e| match e {
                None => Value::Null,
                Some(e) => {
                    let mut m = serde_json::Map::new();
                    m.insert(
                        e.token.to_string(),
                        json!({"logprob": e.logprob, "rank": e.rank, "decoded_token": token_text(app, e.token)}),
                    );
                    for (i, (t, lp)) in e.top.iter().enumerate() {
                        m.entry(t.to_string()).or_insert_with(|| {
                            json!({"logprob": lp, "rank": i + 1, "decoded_token": token_text(app, *t)})
                        });
                    }
                    Value::Object(m)
                }
            })
            .collect(),
    )
}

pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(super) fn new_id(prefix: &str) -> String {
    format!(
        "{prefix}-{:016x}{:08x}",
        rand::random::<u64>(),
        rand::random::<u32>()
    )
}

/// Aborts the engine request when dropped before it finished (client gone).
pub(super) struct AbortGuard {
    pub(super) engine: EngineHandle,
    pub(super) id: u64,
    pub(super) done: bool,
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if !self.done {
            self.engine.abort(self.id);
        }
    }
}

pub(super) fn usage_json(o: &RequestOutput) -> Value {
    json!({
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": o.completion_tokens,
        "total_tokens": o.prompt_tokens + o.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": o.cached_tokens},
    })
}

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Kind {
    Chat,
    Completion,
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn collect(
    mut rx: tmpsc::UnboundedReceiver<RequestOutput>,
    mut guard: AbortGuard,
    kind: Kind,
    rid: String,
    created: u64,
    model: String,
    app: &App,
    extras: &Extras,
) -> Result<Response, ApiError> {
    let (mut content, mut reasoning) = (String::new(), String::new());
    let mut lps: Vec<TokenLogprob> = Vec::new();
    let mut prompt_lps: Option<Vec<Option<TokenLogprob>>> = None;
    loop {
        let Some(o) = rx.recv().await else {
            guard.done = true;
            return Err(ApiError::internal(
                "the engine stopped before the request finished",
            ));
        };
        content.push_str(&o.content);
        reasoning.push_str(&o.reasoning);
        lps.extend(o.logprobs.iter().cloned());
        if o.prompt_logprobs.is_some() {
            prompt_lps = o.prompt_logprobs.clone();
        }
        let Some(f) = &o.finish else { continue };
        guard.done = true;
        if let FinishReason::Error(msg) = f {
            return Err(ApiError::internal(msg.clone()));
        }
        let usage = usage_json(&o);
        let mut body = match kind {
            Kind::Chat => {
                let mut message = json!({"role": "assistant", "content": content});
                if !reasoning.is_empty() {
                    message["reasoning_content"] = Value::String(reasoning);
                }
                let logprobs = if extras.logprobs {
                    chat_logprobs(app, &lps)
                } else {
                    Value::Null
                };
                json!({
                    "id": rid, "object": "chat.completion", "created": created, "model": model,
                    "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": f.as_openai()}],
                    "usage": usage,
                })
            }
            Kind::Completion => {
                let (mut text, mut entries): (String, Vec<(u32, Option<&TokenLogprob>)>) =
                    (String::new(), Vec::new());
                if let Some((ptext, pids)) = &extras.echo {
                    text.push_str(ptext);
                    for (i, id) in pids.iter().enumerate() {
                        entries.push((
                            *id,
                            prompt_lps
                                .as_ref()
                                .and_then(|v| v.get(i))
                                .and_then(Option::as_ref),
                        ));
                    }
                }
                text.push_str(&content);
                entries.extend(lps.iter().map(|e| (e.token, Some(e))));
                let logprobs = if extras.logprobs {
                    completion_logprobs(app, &entries, 0)
                } else {
                    Value::Null
                };
                json!({
                    "id": rid, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": f.as_openai()}],
                    "usage": usage,
                })
            }
        };
        if extras.prompt_logprobs_field {
            let v = vllm_prompt_logprobs(app, prompt_lps.as_deref().unwrap_or(&[]));
            // vLLM puts it in the choice for completions and at the top for chat.
            match kind {
                Kind::Completion => body["choices"][0]["prompt_logprobs"] = v,
                Kind::Chat => body["prompt_logprobs"] = v,
            }
        }
        return Ok(Json(body).into_response());
    }
}
