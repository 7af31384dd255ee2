//! The streamed answer (`"stream": true`): server-sent events, one chunk per engine output, the
//! chat role chunk first, the echoed prompt of a completion, `usage` last when asked, then
//! `[DONE]`.

use axum::response::sse::Event;
use serde_json::{json, Value};
use tokio::sync::mpsc as tmpsc;

use super::app::AppState;
use super::error::ApiError;
use super::request::Extras;
use super::response::{chat_logprobs, completion_logprobs, usage_json, AbortGuard, Kind};
use crate::runtime::engine::{FinishReason, RequestOutput, TokenLogprob};

pub(super) struct StreamState {
    pub(super) rx: tmpsc::UnboundedReceiver<RequestOutput>,
    pub(super) guard: AbortGuard,
    pub(super) kind: Kind,
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) model: String,
    pub(super) include_usage: bool,
    pub(super) started: bool,
    pub(super) finished: bool,
    pub(super) app: AppState,
    pub(super) extras: Extras,
    /// Characters of completion text sent so far (the `text_offset` of the next token).
    pub(super) text_len: usize,
}

impl StreamState {
    pub(super) fn chunk(&self, delta: Value, finish: Option<&str>) -> Event {
        self.chunk_with(delta, finish, Value::Null)
    }

    pub(super) fn chunk_with(&self, delta: Value, finish: Option<&str>, logprobs: Value) -> Event {
        let body = match self.kind {
            Kind::Chat => json!({
                "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
            }),
            Kind::Completion => json!({
                "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": delta.get("content").and_then(Value::as_str).unwrap_or(""), "logprobs": logprobs, "finish_reason": finish}],
            }),
        };
        Event::default().data(body.to_string())
    }

    /// The `logprobs` value of a chunk carrying `o`'s tokens (and, for the first chunk of an
    /// echoed completion, the prompt's).
    pub(super) fn logprobs_of(&mut self, o: &RequestOutput, content: &str) -> Value {
        if !self.extras.logprobs {
            return Value::Null;
        }
        match self.kind {
            Kind::Chat => chat_logprobs(&self.app, &o.logprobs),
            Kind::Completion => {
                let entries: Vec<(u32, Option<&TokenLogprob>)> =
                    o.logprobs.iter().map(|e| (e.token, Some(e))).collect();
                let v = completion_logprobs(&self.app, &entries, self.text_len);
                self.text_len += content.chars().count();
                v
            }
        }
    }
}

pub(super) async fn next_events(mut st: StreamState) -> Option<(Vec<Event>, StreamState)> {
    if st.finished {
        return None;
    }
    if st.kind == Kind::Chat && !st.started {
        st.started = true;
        let ev = st.chunk(json!({"role": "assistant", "content": ""}), None);
        return Some((vec![ev], st));
    }
    let mut evs = Vec::new();
    loop {
        // An echoed completion opens with the prompt (its log-probabilities come with the
        // first output, which carries them).
        let echo_first = st.kind == Kind::Completion && !st.started && st.extras.echo.is_some();
        let Some(o) = st.rx.recv().await else {
            st.finished = true;
            st.guard.done = true;
            let err = ApiError::internal("the engine stopped before the request finished");
            evs.push(Event::default().data(err.body().to_string()));
            evs.push(Event::default().data("[DONE]"));
            return Some((evs, st));
        };
        if let Some(FinishReason::Error(msg)) = &o.finish {
            st.finished = true;
            st.guard.done = true;
            evs.push(Event::default().data(ApiError::internal(msg.clone()).body().to_string()));
            evs.push(Event::default().data("[DONE]"));
            return Some((evs, st));
        }
        if !o.reasoning.is_empty() {
            if st.kind == Kind::Chat {
                evs.push(st.chunk(json!({"reasoning_content": o.reasoning}), None));
            } else {
                evs.push(st.chunk(json!({"content": o.reasoning}), None));
            }
        }
        if echo_first {
            st.started = true;
            if let Some((ptext, pids)) = st.extras.echo.clone() {
                let lp = if st.extras.logprobs {
                    let entries: Vec<(u32, Option<&TokenLogprob>)> = pids
                        .iter()
                        .enumerate()
                        .map(|(i, id)| {
                            (
                                *id,
                                o.prompt_logprobs
                                    .as_ref()
                                    .and_then(|v| v.get(i))
                                    .and_then(Option::as_ref),
                            )
                        })
                        .collect();
                    completion_logprobs(&st.app, &entries, 0)
                } else {
                    Value::Null
                };
                st.text_len = ptext.chars().count();
                evs.push(st.chunk_with(json!({"content": ptext}), None, lp));
            }
        }
        let finish = o.finish.as_ref().map(FinishReason::as_openai);
        if !o.content.is_empty() || !o.logprobs.is_empty() {
            let lp = st.logprobs_of(&o, &o.content);
            evs.push(st.chunk_with(json!({"content": o.content}), finish, lp));
        } else if finish.is_some() {
            evs.push(st.chunk(json!({}), finish));
        }
        if finish.is_some() {
            st.finished = true;
            st.guard.done = true;
            if st.include_usage {
                let body = json!({
                    "id": st.id,
                    "object": if st.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" },
                    "created": st.created, "model": st.model, "choices": [], "usage": usage_json(&o),
                });
                evs.push(Event::default().data(body.to_string()));
            }
            evs.push(Event::default().data("[DONE]"));
        }
        if !evs.is_empty() {
            return Some((evs, st));
        }
    }
}
