//! One streamed answer, chunk by chunk: what each SSE data payload of an OpenAI-compatible
//! stream says (tokens, reasoning and content text, `usage`, `finish_reason`, errors), checked
//! as it arrives. Chunk contents follow OpenAI's streaming schema with the extensions vLLM and
//! SGLang use: `delta.reasoning_content` (vLLM ≤ 0.10, SGLang, `rigbench serve`) or
//! `delta.reasoning` (newer vLLM) for reasoning text, a final chunk carrying `usage`
//! (`stream_options.include_usage`), and optionally `usage` on every chunk
//! (`stream_options.continuous_usage_stats`, vLLM), which lets a chunk that carries several
//! tokens (speculative decoding) be counted exactly. The HTTP side is `super::client`'s.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The largest token count rigbench takes from an engine where no `max_tokens` bounds it (a
/// prompt's `usage.prompt_tokens`, a `/tokenize` count, a context length): 2^31 tokens, far
/// beyond any model's context; a larger one is refused as impossible.
pub const MAX_PLAUSIBLE_TOKENS: u64 = 1 << 31;

/// One chunk that carried at least one generated token (see [`StreamOutcome::apply`] for how a
/// chunk is recognised as such).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    /// Arrival time since the request was sent.
    pub at: Duration,
    /// Characters of content text in the chunk (may be 0: vLLM holds back the text of a token
    /// that ends inside a UTF-8 sequence, and special tokens have none).
    pub content_chars: usize,
    /// Characters of reasoning text in the chunk.
    pub reasoning_chars: usize,
    /// Tokens this chunk carried, when the stream says so: the increment of the cumulative
    /// `usage.completion_tokens` (vLLM's `continuous_usage_stats`), or the length of the chunk's
    /// `token_ids` / `tokens` list. `None`: at least one, count unknown.
    pub tokens: Option<u64>,
}

/// `usage` as the engine reported it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// `prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// `completion_tokens` (reasoning included).
    pub completion_tokens: Option<u64>,
    /// `completion_tokens_details.reasoning_tokens`, when given.
    pub reasoning_tokens: Option<u64>,
    /// `prompt_tokens_details.cached_tokens`: prompt tokens served from the prefix cache
    /// (llama.cpp always; vLLM with `--enable-prompt-tokens-details`; SGLang with
    /// `--enable-cache-report`).
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

/// Everything observed about one streamed request.
#[derive(Debug, Clone, Default)]
pub struct StreamOutcome {
    /// HTTP status, when a response arrived.
    pub http_status: Option<u16>,
    /// Chunks that carried a generated token, in arrival order.
    pub events: Vec<TokenEvent>,
    /// Content text.
    pub content: String,
    /// Reasoning text.
    pub reasoning: String,
    /// The last `usage` seen.
    pub usage: Option<Usage>,
    /// The `finish_reason` of the last choice that had one.
    pub finish_reason: Option<String>,
    /// Whether `data: [DONE]` arrived.
    pub done: bool,
    /// Time from send to the end of the stream (or the error).
    pub end: Duration,
    /// Why the request failed, if it did.
    pub error: Option<String>,
    /// The request was cancelled by the client (Ctrl-C, abort).
    pub cancelled: bool,
    /// Chunks seen (with or without text).
    pub chunks: usize,
    /// Per-request speculative-decoding counts the engine sent (see
    /// [`crate::diagnose::spec::RequestSpec`]).
    pub spec: Option<crate::diagnose::spec::RequestSpec>,
    /// Arrival of the first chunk with a non-empty `choices` list, token or not (a role chunk
    /// counts): the moment `vllm bench serve` stamps as its TTFT.
    pub first_chunk: Option<Duration>,
    /// Arrival of the first chunk with content text (TTFC).
    pub first_content: Option<Duration>,
    /// Chunks with a non-empty `choices` list.
    pub choice_chunks: usize,
    /// Chunks with a non-empty `choices` list that carried `usage`, counted while every such
    /// chunk did from the first on (vLLM's `continuous_usage_stats`): then each chunk's tokens
    /// are the increment of the cumulative count, exactly.
    pub usage_chunks: usize,
    /// The cumulative `usage.completion_tokens` of the last chunk with choices that carried it.
    pub last_completion_tokens: Option<u64>,
    /// A chunk's cumulative `usage.completion_tokens` went down: per-chunk usage is not used.
    pub usage_not_monotonic: bool,
    /// The request was sent again on a fresh connection because the first attempt failed before
    /// any response arrived (a kept-alive connection the engine had closed): 0 or 1.
    pub retries: u32,
    /// Why the first attempt failed, when it was retried.
    pub retry_reason: Option<String>,
    /// The request's `max_tokens`: a token count the engine claims above it is impossible and
    /// fails the request with the reason (never one latency sample per claimed token).
    pub max_tokens: Option<u64>,
}

/// What kind of JSON value `v` is, for error messages ("a number", "an object", ...).
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The token count at JSON pointer `p` of a `usage` object: `None` when absent or null; an
/// error naming the field when it is anything but a whole number from 0 (a negative count, a
/// fraction, a string, NaN): never silently dropped, which would let a re-count stand in for it.
fn usage_count(u: &Value, p: &str) -> Result<Option<u64>, String> {
    match u.pointer(p) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_u64()
            // A whole number written as a float (`6.0`, as some Python servers do) is a count.
            .or_else(|| {
                x.as_f64()
                    .filter(|f| f.is_finite() && *f >= 0.0 && f.fract() == 0.0 && *f <= 9.0e15)
                    .map(|f| f as u64)
            })
            .map(Some)
            .ok_or_else(|| {
            format!(
                "impossible token count: the engine reported usage{} = {} ({}, not a whole number from 0; not counted)",
                p.replace('/', "."),
                x.to_string().chars().take(40).collect::<String>(),
                json_kind(x)
            )
        }),
    }
}

impl StreamOutcome {
    /// Apply one SSE data payload. Returns `Err(why)` for a payload that makes the stream
    /// unusable (malformed JSON, an error object).
    pub fn apply(&mut self, at: Duration, data: &str) -> Result<(), String> {
        let data = data.trim();
        if data == "[DONE]" {
            return self.finish_stream();
        }
        if self.done {
            return Err("data after [DONE]".into());
        }
        let v: Value = serde_json::from_str(data).map_err(|e| {
            format!(
                "malformed SSE data (not JSON: {e}): {}",
                data.chars().take(80).collect::<String>()
            )
        })?;
        if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
            let msg = err
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| err.to_string());
            return Err(format!("engine error in stream: {msg}"));
        }
        self.chunks += 1;
        if let Some(spec) = crate::diagnose::spec::RequestSpec::from_chunk(&v) {
            self.spec = Some(spec);
        }
        let usage = self.chunk_usage(&v)?;
        if usage.is_some() {
            self.usage = usage;
        }
        let choices = match v.get("choices") {
            Some(Value::Array(a)) => a.as_slice(),
            Some(Value::Null) | None => &[],
            Some(_) => return Err("malformed chunk: `choices` is not an array".into()),
        };
        let (content_chars, reasoning_chars, token_ids) = self.take_choices(choices)?;
        if let (Some(n), Some(max)) = (token_ids, self.max_tokens) {
            let seen: u64 = self.events.iter().filter_map(|e| e.tokens).sum();
            if seen.saturating_add(n) > max {
                return Err(format!(
                    "impossible token count: the engine's chunks list {} token ids for max_tokens {max} (not counted)",
                    seen.saturating_add(n)
                ));
            }
        }
        if choices.is_empty() {
            // A usage summary (or a keep-alive object): never a token.
            return Ok(());
        }
        self.first_chunk.get_or_insert(at);
        if content_chars > 0 {
            self.first_content.get_or_insert(at);
        }
        // Per-chunk usage: the increment of the cumulative count is this chunk's tokens, so a
        // token whose text is held back (an empty `content`) is still counted when it arrives.
        // Only in a stream where every chunk with choices has carried usage from the first one
        // on: a `usage` that turns up on a late chunk (a finish chunk) is a total, not a step.
        let per_chunk = self.usage_chunks == self.choice_chunks;
        self.choice_chunks += 1;
        let chunk_usage = usage
            .and_then(|u| u.completion_tokens)
            .filter(|_| per_chunk);
        let tokens = match chunk_usage {
            Some(ct) if !self.usage_not_monotonic => {
                self.usage_chunks += 1;
                let prev = self.last_completion_tokens.unwrap_or(0);
                self.last_completion_tokens = Some(ct);
                if ct < prev {
                    self.usage_not_monotonic = true;
                    None
                } else {
                    Some(ct - prev)
                }
            }
            _ => None,
        };
        let tokens = match tokens {
            Some(0) => return Ok(()), // text (if any) of tokens already counted; a role chunk
            Some(n) => Some(n),
            None => match token_ids {
                Some(n) if n > 0 => Some(n),
                _ if content_chars + reasoning_chars > 0 => None,
                _ => return Ok(()), // no token: a role chunk, an empty finish chunk
            },
        };
        self.events.push(TokenEvent {
            at,
            content_chars,
            reasoning_chars,
            tokens,
        });
        Ok(())
    }

    /// `[DONE]`: the stream ends. An error when `usage` counted tokens that no chunk carried.
    fn finish_stream(&mut self) -> Result<(), String> {
        self.done = true;
        // Tokens counted by `usage` that no chunk carried: chunks without `choices`, or with
        // an empty list, are not a stream of tokens.
        if let Some(n) = self
            .usage
            .and_then(|u| u.completion_tokens)
            .filter(|n| *n > 0 && self.choice_chunks == 0)
        {
            return Err(format!(
                "malformed stream: usage.completion_tokens = {n}, but no chunk carried a choice (`choices` missing or empty in every chunk)"
            ));
        }
        Ok(())
    }

    /// The chunk's `usage`, when it has one; an error for a count that is not a whole number,
    /// above `max_tokens`, or an implausible prompt length.
    fn chunk_usage(&self, v: &Value) -> Result<Option<Usage>, String> {
        let usage = match v.get("usage").filter(|u| u.is_object()) {
            Some(u) => Some(Usage {
                prompt_tokens: usage_count(u, "/prompt_tokens")?,
                completion_tokens: usage_count(u, "/completion_tokens")?,
                reasoning_tokens: usage_count(u, "/completion_tokens_details/reasoning_tokens")?,
                cached_tokens: usage_count(u, "/prompt_tokens_details/cached_tokens")?,
            }),
            None => None,
        };
        if let (Some(u), Some(max)) = (usage, self.max_tokens) {
            for (name, v) in [
                ("usage.completion_tokens", u.completion_tokens),
                (
                    "usage.completion_tokens_details.reasoning_tokens",
                    u.reasoning_tokens,
                ),
            ] {
                if let Some(n) = v.filter(|n| *n > max) {
                    return Err(format!(
                        "impossible token count: the engine reported {name} = {n} for max_tokens {max} (not counted)"
                    ));
                }
            }
        }
        if let Some(n) = usage
            .and_then(|u| u.prompt_tokens)
            .filter(|n| *n > MAX_PLAUSIBLE_TOKENS)
        {
            return Err(format!(
                "impossible token count: the engine reported usage.prompt_tokens = {n} (over {MAX_PLAUSIBLE_TOKENS}; not counted)"
            ));
        }
        Ok(usage)
    }

    /// Take the chunk's choices: append their content and reasoning text, note the finish
    /// reason, count the token ids they list. Returns (content chars, reasoning chars, token
    /// ids); an error for a text field that is not a string.
    fn take_choices(&mut self, choices: &[Value]) -> Result<(usize, usize, Option<u64>), String> {
        let mut content_chars = 0;
        let mut reasoning_chars = 0;
        let mut token_ids: Option<u64> = None;
        for (i, c) in choices.iter().enumerate() {
            for p in [
                "/delta/content",
                "/text",
                "/delta/reasoning_content",
                "/delta/reasoning",
            ] {
                if let Some(x) = c.pointer(p).filter(|x| !x.is_null() && !x.is_string()) {
                    return Err(format!(
                        "malformed chunk: `choices[{i}]{}` is {}, not a string",
                        p.replace('/', "."),
                        json_kind(x)
                    ));
                }
            }
            let text = |p: &str| c.pointer(p).and_then(Value::as_str).unwrap_or("");
            let content = if c.get("delta").is_some() {
                text("/delta/content")
            } else {
                text("/text")
            };
            let reasoning = match text("/delta/reasoning_content") {
                "" => text("/delta/reasoning"),
                r => r,
            };
            content_chars += content.chars().count();
            reasoning_chars += reasoning.chars().count();
            self.content.push_str(content);
            self.reasoning.push_str(reasoning);
            if let Some(f) = c.get("finish_reason").and_then(Value::as_str) {
                self.finish_reason = Some(f.to_string());
            }
            // vLLM `return_token_ids` (`token_ids` on the choice), llama.cpp `tokens`.
            for key in ["token_ids", "tokens"] {
                if let Some(ids) = c.get(key).and_then(Value::as_array) {
                    *token_ids.get_or_insert(0) += ids.len() as u64;
                }
            }
        }
        Ok((content_chars, reasoning_chars, token_ids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_reasoning_usage_and_errors() {
        let mut o = StreamOutcome::default();
        let t = Duration::from_millis;
        o.apply(t(1), r#"{"choices":[{"delta":{"role":"assistant"}}]}"#)
            .unwrap();
        o.apply(
            t(2),
            r#"{"choices":[{"delta":{"reasoning_content":"hm"}}]}"#,
        )
        .unwrap();
        o.apply(t(3), r#"{"choices":[{"delta":{"reasoning":"ok"}}]}"#)
            .unwrap();
        o.apply(
            t(4),
            r#"{"choices":[{"delta":{"content":"Hi there"}}],"usage":{"completion_tokens":5}}"#,
        )
        .unwrap();
        o.apply(
            t(5),
            r#"{"choices":[{"delta":{},"finish_reason":"length"}]}"#,
        )
        .unwrap();
        o.apply(t(6), r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":6,"completion_tokens_details":{"reasoning_tokens":2}}}"#).unwrap();
        o.apply(t(7), "[DONE]").unwrap();
        assert_eq!(o.events.len(), 3);
        assert_eq!(o.reasoning, "hmok");
        assert_eq!(o.content, "Hi there");
        // Usage on a late chunk of a stream without per-chunk usage is a total, not a step.
        assert_eq!(o.events[2].tokens, None);
        assert_eq!(o.finish_reason.as_deref(), Some("length"));
        assert_eq!(
            o.usage,
            Some(Usage {
                prompt_tokens: Some(7),
                completion_tokens: Some(6),
                reasoning_tokens: Some(2),
                cached_tokens: None,
            })
        );
        assert!(o.done);
        assert!(o.apply(t(8), "{}").is_err(), "data after [DONE]");

        // Malformed in ways that were once read as success (tests/it/hostile_modes/): a count
        // that is not a whole number, text that is not a string, tokens no chunk carried.
        for (bad, needle) in [
            (
                r#"{"choices":[],"usage":{"completion_tokens":-6}}"#,
                "usage.completion_tokens = -6 (a number",
            ),
            (
                r#"{"choices":[],"usage":{"completion_tokens":"6"}}"#,
                "usage.completion_tokens = \"6\" (a string",
            ),
            (
                r#"{"choices":[],"usage":{"completion_tokens":6.5}}"#,
                "not a whole number",
            ),
            (
                r#"{"choices":[],"usage":{"completion_tokens":1e300}}"#,
                "not a whole number",
            ),
            (
                r#"{"choices":[],"usage":{"prompt_tokens_details":{"cached_tokens":-1}}}"#,
                "usage.prompt_tokens_details.cached_tokens",
            ),
            (
                r#"{"choices":[{"delta":{"content":7}}]}"#,
                "`choices[0].delta.content` is a number, not a string",
            ),
            (
                r#"{"choices":[{"text":["a"]}]}"#,
                "`choices[0].text` is an array",
            ),
            (
                r#"{"choices":[{"delta":{"reasoning_content":{}}}]}"#,
                "is an object",
            ),
        ] {
            let e = StreamOutcome::default().apply(t(1), bad).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
        let mut e = StreamOutcome::default();
        e.apply(t(1), r#"{"id":"x"}"#).unwrap();
        e.apply(t(2), r#"{"choices":[],"usage":{"completion_tokens":6}}"#)
            .unwrap();
        let why = e.apply(t(3), "[DONE]").unwrap_err();
        assert!(why.contains("no chunk carried a choice"), "{why}");
        // Null text and a zero count with no choices are fine.
        let mut z = StreamOutcome::default();
        z.apply(
            t(1),
            r#"{"choices":[{"delta":{"content":null,"role":"assistant"}}]}"#,
        )
        .unwrap();
        let mut z0 = StreamOutcome::default();
        z0.apply(t(1), r#"{"choices":[],"usage":{"completion_tokens":0}}"#)
            .unwrap();
        z0.apply(t(2), "[DONE]").unwrap();
        // A whole number written as a float is a count.
        let mut f = StreamOutcome::default();
        f.apply(t(1), r#"{"choices":[],"usage":{"completion_tokens":6.0}}"#)
            .unwrap();
        assert_eq!(f.usage.and_then(|u| u.completion_tokens), Some(6));

        let mut c = StreamOutcome::default();
        c.apply(t(1), r#"{"choices":[{"text":"abc","index":0}]}"#)
            .unwrap();
        assert_eq!(c.content, "abc");
        assert!(c
            .apply(t(2), "{not json")
            .unwrap_err()
            .contains("malformed SSE data"));
        assert!(c
            .apply(t(2), r#"{"error":{"message":"boom"}}"#)
            .unwrap_err()
            .contains("boom"));
        assert!(c.apply(t(2), r#"{"choices":5}"#).is_err());
    }

    #[test]
    fn every_chunk_that_carries_a_token_counts() {
        let t = Duration::from_millis;
        // vLLM with continuous usage: the role chunk (0), a token with empty content (1), text
        // (2), a chunk with text of a held-back token and no new token, a spec chunk of 3.
        let mut o = StreamOutcome::default();
        for (ms, d) in [
            (
                1,
                r#"{"choices":[{"delta":{"role":"assistant","content":""}}],"usage":{"completion_tokens":0}}"#,
            ),
            (
                2,
                r#"{"choices":[{"delta":{"content":""}}],"usage":{"completion_tokens":1}}"#,
            ),
            (
                3,
                r#"{"choices":[{"delta":{"content":"ab"}}],"usage":{"completion_tokens":2}}"#,
            ),
            (
                4,
                r#"{"choices":[{"delta":{"content":"c"}}],"usage":{"completion_tokens":2}}"#,
            ),
            (
                5,
                r#"{"choices":[{"delta":{"content":"defg"}}],"usage":{"completion_tokens":5}}"#,
            ),
            (6, r#"{"choices":[],"usage":{"completion_tokens":5}}"#),
        ] {
            o.apply(t(ms), d).unwrap();
        }
        let tokens: Vec<Option<u64>> = o.events.iter().map(|e| e.tokens).collect();
        assert_eq!(tokens, vec![Some(1), Some(1), Some(3)]);
        assert_eq!(
            o.events[0].at,
            t(2),
            "TTFT: the first token, with empty content"
        );
        assert_eq!(o.first_content, Some(t(3)));
        assert_eq!(o.first_chunk, Some(t(1)));
        assert_eq!((o.choice_chunks, o.usage_chunks), (5, 5));
        // Token ids on a chunk without text count too (vLLM `return_token_ids`).
        let mut o = StreamOutcome::default();
        o.apply(
            t(1),
            r#"{"choices":[{"delta":{"content":""},"token_ids":[7,8]}]}"#,
        )
        .unwrap();
        o.apply(t(2), r#"{"choices":[{"delta":{"content":"x"}}]}"#)
            .unwrap();
        // llama.cpp: a role chunk with null content and an empty finish chunk carry none.
        o.apply(
            t(3),
            r#"{"choices":[{"delta":{},"finish_reason":"length"}]}"#,
        )
        .unwrap();
        assert_eq!(
            o.events.iter().map(|e| e.tokens).collect::<Vec<_>>(),
            vec![Some(2), None]
        );
        // Cumulative usage that goes back is not used.
        let mut o = StreamOutcome::default();
        o.apply(
            t(1),
            r#"{"choices":[{"delta":{"content":"a"}}],"usage":{"completion_tokens":3}}"#,
        )
        .unwrap();
        o.apply(
            t(2),
            r#"{"choices":[{"delta":{"content":"b"}}],"usage":{"completion_tokens":2}}"#,
        )
        .unwrap();
        assert!(o.usage_not_monotonic);
        assert_eq!(o.events[1].tokens, None);
    }
}
