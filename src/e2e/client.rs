//! The OpenAI-compatible HTTP client: streaming chat and completions requests over
//! Server-Sent Events, and the engine's side endpoints (`/health`, `/version`, `/v1/models`,
//! `/metrics`, `/tokenize`, `/reset_prefix_cache`).
//!
//! SSE framing follows the WHATWG HTML "server-sent events" grammar (fields `data:` with one
//! optional space, events end at a blank line, `\n` or `\r\n` line ends, `:` comments). Chunk
//! contents follow OpenAI's streaming schema with the extensions vLLM and SGLang use:
//! `delta.reasoning_content` (vLLM ≤ 0.10, SGLang, `rigbench serve`) or `delta.reasoning`
//! (newer vLLM) for reasoning text, a final chunk carrying `usage`
//! (`stream_options.include_usage`), and optionally `usage` on every chunk
//! (`stream_options.continuous_usage_stats`, vLLM), which lets a chunk that carries several
//! tokens (speculative decoding) be counted exactly.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::diagnose::prometheus::Exposition;

/// The largest non-streamed answer body read from an engine (`/v1/models`, `/version`,
/// `/tokenize`, a non-streamed completion): 16 MiB. A larger one is refused with its size
/// (docs/reliability.md, "Engine numbers and bodies"); nothing is allocated beyond it.
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// The largest `/metrics` exposition read: 32 MiB (a vLLM scrape is tens to hundreds of KB).
pub const MAX_METRICS_BYTES: usize = 32 << 20;

/// The most of an error answer's body kept (only its first 200 characters are shown): 64 KiB.
pub const MAX_ERROR_BODY_BYTES: usize = 64 << 10;

/// How long one `GET /metrics` may take before it counts as stalled: 5 s (a scrape of a
/// healthy engine takes milliseconds; a stalled one must not cost 30 s per poll).
pub const METRICS_TIMEOUT: Duration = Duration::from_secs(5);

/// Read at most `limit` bytes of `resp`'s body and decode it lossily (an engine's invalid UTF-8
/// becomes U+FFFD). `truncate`: keep the first `limit` bytes of a longer body (error answers,
/// shown cut anyway); otherwise a longer body is an error naming `what`, its size and the limit.
///
/// # Errors
/// The body is larger than `limit` (and `truncate` is false), or reading it failed.
pub async fn read_body_limited(
    mut resp: reqwest::Response,
    limit: usize,
    truncate: bool,
    what: &str,
) -> Result<String, String> {
    let too_big = |n: String| {
        format!(
            "{what}: the answer body is {n} bytes, over rigbench's limit of {limit} bytes (not read)"
        )
    };
    if let Some(n) = resp.content_length() {
        if n > limit as u64 && !truncate {
            return Err(too_big(n.to_string()));
        }
    }
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let chunk = match resp.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) => return Err(format!("{what}: body: {}", error_chain(&e))),
        };
        if buf.len() + chunk.len() > limit {
            if truncate {
                let room = limit - buf.len();
                buf.extend_from_slice(&chunk[..room]);
                break;
            }
            return Err(too_big(format!("more than {limit}")));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The message added to an HTTP 401 or 403 from an engine: how to send its key.
pub const API_KEY_FIX: &str = "the engine wants an API key: pass --api-key KEY or set OPENAI_API_KEY (vLLM's --api-key, SGLang's --api-key, llama-server's --api-key)";

/// Default headers of every request to the engine: `Authorization: Bearer KEY` (marked
/// sensitive, so it never appears in a debug print) when a key is given.
fn auth_headers(api_key: Option<&str>) -> anyhow::Result<reqwest::header::HeaderMap> {
    let mut h = reqwest::header::HeaderMap::new();
    if let Some(k) = api_key.filter(|k| !k.is_empty()) {
        let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {k}"))
            .map_err(|_| anyhow::anyhow!("the API key (--api-key or OPENAI_API_KEY) holds characters an HTTP header cannot carry"))?;
        v.set_sensitive(true);
        h.insert(reqwest::header::AUTHORIZATION, v);
    }
    Ok(h)
}

static API_KEY: std::sync::RwLock<Option<String>> = std::sync::RwLock::new(None);

/// Set the API key every engine client of this process sends (`e2e`/`report` `--api-key` or
/// `OPENAI_API_KEY`), before any client is built. The key is sent only as
/// `Authorization: Bearer`; it is never written to any output.
pub fn set_api_key(key: Option<String>) {
    if let Ok(mut k) = API_KEY.write() {
        *k = key.filter(|k| !k.is_empty());
    }
}

/// The API key set with [`set_api_key`].
pub fn api_key() -> Option<String> {
    API_KEY.read().ok().and_then(|k| k.clone())
}

/// An HTTP client for the engine's side endpoints, sending the API key when one is set.
pub fn side_http() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .default_headers(auth_headers(api_key().as_deref()).unwrap_or_default())
        .build()
        .unwrap_or_default()
}

/// Which OpenAI API a workload uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// `POST /v1/chat/completions` (the chat template applies; thinking can be toggled).
    #[default]
    Chat,
    /// `POST /v1/completions` (raw prompt; token-exact input).
    Completions,
}

impl Api {
    /// The endpoint path.
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
        }
    }
}

/// One generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenRequest {
    /// The API.
    pub api: Api,
    /// The `model` field.
    pub model: String,
    /// The user message (chat) or the prompt (completions).
    pub prompt: String,
    /// `max_tokens`.
    pub max_tokens: u32,
    /// `ignore_eos` (vLLM/SGLang extension): generate exactly `max_tokens`.
    pub ignore_eos: bool,
    /// `temperature` (0 = greedy).
    pub temperature: f64,
    /// `seed`.
    pub seed: Option<u64>,
    /// `chat_template_kwargs.enable_thinking` (chat only); `None` sends nothing.
    pub thinking: Option<bool>,
}

impl GenRequest {
    /// The JSON body, with `stream: true` and usage reporting requested.
    pub fn body(&self) -> Value {
        let mut b = json!({
            "model": self.model,
            "max_tokens": self.max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true, "continuous_usage_stats": true},
            "temperature": self.temperature,
        });
        match self.api {
            Api::Chat => {
                b["messages"] = json!([{"role": "user", "content": self.prompt}]);
                if let Some(t) = self.thinking {
                    b["chat_template_kwargs"] = json!({ "enable_thinking": t });
                }
            }
            Api::Completions => b["prompt"] = json!(self.prompt),
        }
        if self.ignore_eos {
            b["ignore_eos"] = json!(true);
        }
        if let Some(s) = self.seed {
            b["seed"] = json!(s);
        }
        b
    }
}

/// An incremental SSE decoder: feed bytes, get the `data` payload of each complete event.
///
/// Memory is bounded: an event (its pending line plus the data lines gathered so far) larger
/// than [`MAX_SSE_EVENT_BYTES`] is an error, not an ever-growing buffer. Work is linear in the
/// bytes fed, however they are cut into reads.
#[derive(Debug, Default)]
pub struct SseDecoder {
    buf: Vec<u8>,
    data: Option<String>,
}

/// The largest SSE event accepted, bytes (16 MiB: a chunk of an OpenAI stream is a few hundred
/// bytes; a final chunk with logprobs or metrics a few hundred KiB).
pub const MAX_SSE_EVENT_BYTES: usize = 16 << 20;

impl SseDecoder {
    /// Feed bytes; returns the data of every event completed by them.
    ///
    /// # Errors
    /// A line that is not UTF-8, or an event larger than [`MAX_SSE_EVENT_BYTES`].
    pub fn push(&mut self, bytes: &[u8]) -> anyhow::Result<Vec<String>> {
        let mut out = Vec::new();
        // Only the new bytes can hold the next newline: search from where the old ones ended.
        let mut searched = self.buf.len();
        self.buf.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(off) = self.buf[searched..].iter().position(|b| *b == b'\n') {
            let nl = searched + off;
            let mut line = &self.buf[start..nl];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = std::str::from_utf8(line)
                .context("SSE line is not UTF-8")?
                .to_string();
            if let Some(ev) = self.line(&line) {
                out.push(ev);
            }
            start = nl + 1;
            searched = start;
        }
        self.buf.drain(..start);
        let pending = self.buf.len() + self.data.as_ref().map_or(0, String::len);
        if pending > MAX_SSE_EVENT_BYTES {
            self.buf.clear();
            self.data = None;
            anyhow::bail!(
                "SSE event larger than {} MiB without an end: not an OpenAI-compatible stream",
                MAX_SSE_EVENT_BYTES >> 20
            );
        }
        Ok(out)
    }

    fn line(&mut self, line: &str) -> Option<String> {
        if line.is_empty() {
            return self.data.take();
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        if field == "data" {
            match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            }
        }
        None
    }

    /// End of stream: the data of an event left without its closing blank line, if any
    /// (tolerated; the caller notes it).
    pub fn finish(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.buf);
        if !rest.is_empty() {
            if let Ok(s) = String::from_utf8(rest) {
                let s = s.trim_end_matches('\r').to_string();
                if let Some(ev) = self.line(&s) {
                    return Some(ev);
                }
            }
        }
        self.data.take()
    }
}

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
            return Ok(());
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
        if usage.is_some() {
            self.usage = usage;
        }
        let choices = match v.get("choices") {
            Some(Value::Array(a)) => a.as_slice(),
            Some(Value::Null) | None => &[],
            Some(_) => return Err("malformed chunk: `choices` is not an array".into()),
        };
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
}

/// The largest token count rigbench takes from an engine where no `max_tokens` bounds it (a
/// prompt's `usage.prompt_tokens`, a `/tokenize` count, a context length): 2^31 tokens, far
/// beyond any model's context; a larger one is refused as impossible.
pub const MAX_PLAUSIBLE_TOKENS: u64 = 1 << 31;

/// A connection-level failure (refused, reset): the engine may be gone.
pub fn is_connect_error(msg: &str) -> bool {
    msg.starts_with("connection failed")
}

/// Whether a request failed at the transport level (connection refused or reset, or a stream
/// cut off before `[DONE]`): consecutive ones mean the engine is gone, whatever the order in which
/// in-flight and new requests notice it.
pub fn is_transport_error(msg: &str) -> bool {
    is_connect_error(msg)
        || msg.starts_with("stream broke")
        || msg.starts_with("stream ended before")
}

/// How long a kept-alive connection may sit idle in the pool before it is dropped: below the
/// keep-alive timeout of the engines' HTTP servers (llama.cpp's `llama-server`: 5 s, `Keep-Alive:
/// timeout=5`; uvicorn under vLLM and SGLang: 5 s by default), so rigbench does not send a
/// request on a connection the server is closing. See docs/engines/llama.cpp.md.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// The engine's HTTP endpoints.
#[derive(Debug, Clone)]
pub struct EngineClient {
    base: String,
    http: reqwest::Client,
    /// No pooled connections: every request opens its own (the retry of a request whose kept-
    /// alive connection failed).
    fresh: reqwest::Client,
}

/// `POST /tokenize` answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Tokenized {
    /// Token count.
    pub count: usize,
    /// The engine's context length, when given.
    pub max_model_len: Option<u64>,
}

/// The body an engine's `POST /tokenize` takes (see docs/engines/).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TokenizeForm {
    /// vLLM, SGLang and `rigbench serve`: `{"model", "prompt", "add_special_tokens": false}` →
    /// `{"count", "tokens", "max_model_len"}`.
    #[default]
    Vllm,
    /// llama.cpp's `llama-server`: `{"content", "add_special": false}` → `{"tokens": [...]}`.
    /// It answers vLLM's form with `200 {"tokens": []}`.
    LlamaCpp,
}

impl TokenizeForm {
    /// The request body for `text`.
    pub fn body(self, model: &str, text: &str) -> Value {
        match self {
            TokenizeForm::Vllm => {
                json!({"model": model, "prompt": text, "add_special_tokens": false})
            }
            TokenizeForm::LlamaCpp => json!({"content": text, "add_special": false}),
        }
    }

    /// Short name for reports.
    pub fn label(self) -> &'static str {
        match self {
            TokenizeForm::Vllm => "POST /tokenize {\"prompt\"} (vLLM form)",
            TokenizeForm::LlamaCpp => "POST /tokenize {\"content\"} (llama.cpp form)",
        }
    }
}

/// Whether a request error happened before any response arrived on a connection that the
/// server had closed or reset (a kept-alive connection closed while idle, a refused connect):
/// such a request never reached the engine's scheduler and is sent again once, on a fresh
/// connection. Read from the error chain: I/O errors of kind reset, aborted, broken pipe or
/// unexpected EOF, hyper's "connection closed before message completed", or a failed connect.
pub fn is_stale_connection_error(e: &reqwest::Error) -> bool {
    if e.is_timeout() || e.is_status() || e.is_body() || e.is_decode() {
        return false;
    }
    if e.is_connect() {
        return true;
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            if matches!(
                io.kind(),
                K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof
            ) {
                return true;
            }
        }
        let m = c.to_string();
        if m.contains("connection closed before message completed")
            || m.contains("connection reset")
            || m.contains("broken pipe")
        {
            return true;
        }
        cur = c.source();
    }
    false
}

impl EngineClient {
    /// A client for the engine at `base` (`http://host:port`; a trailing `/` or `/v1` is
    /// removed), dropping idle pooled connections after [`POOL_IDLE_TIMEOUT`].
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub fn new(base: &str) -> anyhow::Result<Self> {
        Self::with_idle_timeout(base, POOL_IDLE_TIMEOUT)
    }

    /// As [`EngineClient::new`], with idle pooled connections dropped after `idle` (keep it
    /// below the engine's keep-alive timeout).
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub fn with_idle_timeout(base: &str, idle: Duration) -> anyhow::Result<Self> {
        let mut b = base.trim_end_matches('/').to_string();
        if let Some(s) = b.strip_suffix("/v1") {
            b = s.to_string();
        }
        let headers = auth_headers(api_key().as_deref())?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .default_headers(headers.clone())
            .tcp_nodelay(true)
            .pool_max_idle_per_host(1024)
            .pool_idle_timeout(idle)
            .build()
            .context("cannot build the HTTP client")?;
        let fresh = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .default_headers(headers)
            .tcp_nodelay(true)
            .pool_max_idle_per_host(0)
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Self {
            base: b,
            http,
            fresh,
        })
    }

    /// Send a request built by `make` on a pooled connection; when that fails before any
    /// response on a connection the server had closed ([`is_stale_connection_error`]), once
    /// more on a fresh connection. Side requests (`/metrics`, `/tokenize`, ...) are safe to
    /// repeat; a lost scrape would lose data.
    async fn send_retrying(
        &self,
        make: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> reqwest::Result<reqwest::Response> {
        match make(&self.http).send().await {
            Err(e) if is_stale_connection_error(&e) => make(&self.fresh).send().await,
            r => r,
        }
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `GET /health` answered 2xx within `timeout`.
    pub async fn health(&self, timeout: Duration) -> bool {
        matches!(
            self.send_retrying(|c| c.get(self.url("/health")).timeout(timeout))
                .await,
            Ok(r) if r.status().is_success()
        )
    }

    async fn get_json(&self, path: &str) -> anyhow::Result<Option<Value>> {
        let r = self
            .send_retrying(|c| c.get(self.url(path)).timeout(Duration::from_secs(30)))
            .await
            .with_context(|| format!("GET {path}"))?;
        if matches!(r.status().as_u16(), 401 | 403) {
            bail!("GET {path} answered {}: {API_KEY_FIX}", r.status());
        }
        if !r.status().is_success() {
            return Ok(None);
        }
        let text = read_body_limited(r, MAX_BODY_BYTES, false, &format!("GET {path}"))
            .await
            .map_err(anyhow::Error::msg)?;
        Ok(serde_json::from_str(&text).ok())
    }

    /// `GET /version` as JSON; `None` when absent or not JSON.
    pub async fn version(&self) -> anyhow::Result<Option<Value>> {
        self.get_json("/version").await
    }

    /// `GET /v1/models`: `(id, owned_by)` pairs.
    pub async fn models(&self) -> anyhow::Result<Vec<(String, Option<String>)>> {
        let v = self.get_json("/v1/models").await?;
        Ok(v.as_ref()
            .and_then(|v| v.get("data"))
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|m| {
                        Some((
                            m.get("id")?.as_str()?.to_string(),
                            m.get("owned_by")
                                .and_then(Value::as_str)
                                .map(str::to_string),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// `GET /metrics` parsed; `None` when the engine has no such endpoint.
    ///
    /// # Errors
    /// The scrape failed, stalled (no whole answer within [`METRICS_TIMEOUT`]: the message says
    /// `stalled`), or its body is over [`MAX_METRICS_BYTES`].
    pub async fn metrics(&self) -> anyhow::Result<Option<Exposition>> {
        let stalled = || {
            anyhow::anyhow!(
                "GET /metrics stalled: no whole answer within {} s",
                METRICS_TIMEOUT.as_secs()
            )
        };
        let work = async {
            let r = self
                .send_retrying(|c| c.get(self.url("/metrics")).timeout(METRICS_TIMEOUT))
                .await;
            let r = match r {
                Err(e) if e.is_timeout() => return Err(stalled()),
                r => r.context("GET /metrics")?,
            };
            if !r.status().is_success() {
                return Ok(None);
            }
            let text = read_body_limited(r, MAX_METRICS_BYTES, false, "GET /metrics")
                .await
                .map_err(anyhow::Error::msg)?;
            Ok(Some(Exposition::parse(&text)))
        };
        match tokio::time::timeout(METRICS_TIMEOUT + Duration::from_secs(1), work).await {
            Ok(r) => r,
            Err(_) => Err(stalled()),
        }
    }

    /// `POST /tokenize` in vLLM's form (see [`EngineClient::tokenize_as`]).
    ///
    /// # Errors
    /// As [`EngineClient::tokenize_as`].
    pub async fn tokenize(&self, model: &str, text: &str) -> anyhow::Result<Option<Tokenized>> {
        self.tokenize_as(TokenizeForm::Vllm, model, text).await
    }

    /// `POST /tokenize` with the body `form` describes; `None` when the engine has no such
    /// endpoint (404, 405, 501).
    ///
    /// # Errors
    /// The request failed, the answer is not JSON or not 2xx, it holds no count, or it counts 0
    /// tokens for a non-empty `text` (llama.cpp answers a body it does not understand with
    /// `200 {"tokens": []}`: a failed tokenization, never a count of 0).
    pub async fn tokenize_as(
        &self,
        form: TokenizeForm,
        model: &str,
        text: &str,
    ) -> anyhow::Result<Option<Tokenized>> {
        let r = self
            .send_retrying(|c| {
                c.post(self.url("/tokenize"))
                    .json(&form.body(model, text))
                    .timeout(Duration::from_secs(30))
            })
            .await
            .context("POST /tokenize")?;
        if matches!(r.status().as_u16(), 404 | 405 | 501) {
            return Ok(None);
        }
        let status = r.status();
        // `body`, not `text`: the count is checked against the text sent, further down.
        let body = read_body_limited(r, MAX_BODY_BYTES, false, "POST /tokenize")
            .await
            .map_err(anyhow::Error::msg)?;
        if !status.is_success() {
            let mut msg = format!(
                "POST /tokenize answered {status}: {}",
                body.chars().take(200).collect::<String>()
            );
            if matches!(status.as_u16(), 401 | 403) {
                msg.push_str(&format!("; {API_KEY_FIX}"));
            }
            bail!(msg);
        }
        let v: Value = serde_json::from_str(&body).context("POST /tokenize: body is not JSON")?;
        let count = match v.get("count") {
            Some(c) => Some(
                c.as_u64()
                    .filter(|n| *n <= MAX_PLAUSIBLE_TOKENS)
                    .with_context(|| {
                        format!("POST /tokenize: impossible `count` {c} (not a whole number from 0 to {MAX_PLAUSIBLE_TOKENS})")
                    })? as usize,
            ),
            None => None,
        }
        .or_else(|| v.get("tokens").and_then(Value::as_array).map(Vec::len))
        .context("POST /tokenize: answer has neither `count` nor `tokens`")?;
        if count == 0 && !text.trim().is_empty() {
            bail!(
                "POST /tokenize ({}) counted 0 tokens for a non-empty text of {} characters: the engine did not understand the request (a failed tokenization, not a count)",
                form.label(),
                text.chars().count()
            );
        }
        Ok(Some(Tokenized {
            count,
            max_model_len: v
                .get("max_model_len")
                .and_then(Value::as_u64)
                .filter(|n| (1..=MAX_PLAUSIBLE_TOKENS).contains(n)),
        }))
    }

    /// Send `req` once without streaming (`stream: false`, `max_tokens` 1) and return the
    /// `usage.prompt_tokens` the engine counted: the prompt as the engine sees it, chat template
    /// included. `None` when the answer carries no such count.
    ///
    /// # Errors
    /// The request failed or was answered with an error.
    pub async fn prompt_tokens_of(&self, req: &GenRequest) -> anyhow::Result<Option<u64>> {
        let mut body = req.body();
        body["stream"] = json!(false);
        body["max_tokens"] = json!(1);
        if let Some(o) = body.as_object_mut() {
            o.remove("stream_options");
            o.remove("ignore_eos");
        }
        let r = self
            .send_retrying(|c| {
                c.post(self.url(req.api.path()))
                    .json(&body)
                    .timeout(Duration::from_secs(120))
            })
            .await
            .with_context(|| format!("POST {}", req.api.path()))?;
        let status = r.status();
        if !status.is_success() {
            let text = read_body_limited(r, MAX_ERROR_BODY_BYTES, true, req.api.path())
                .await
                .unwrap_or_default();
            let fix = if matches!(status.as_u16(), 401 | 403) {
                format!("; {API_KEY_FIX}")
            } else {
                String::new()
            };
            bail!(
                "POST {} answered {status}: {}{fix}",
                req.api.path(),
                text.chars().take(200).collect::<String>()
            );
        }
        let text = read_body_limited(r, MAX_BODY_BYTES, false, req.api.path())
            .await
            .map_err(anyhow::Error::msg)?;
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("POST {}: the answer is not JSON", req.api.path()))?;
        match v.pointer("/usage/prompt_tokens") {
            None | Some(Value::Null) => Ok(None),
            Some(p) => match p.as_u64().filter(|n| *n <= MAX_PLAUSIBLE_TOKENS) {
                Some(n) => Ok(Some(n)),
                None => bail!(
                    "POST {}: impossible usage.prompt_tokens {p} (not a whole number from 0 to {MAX_PLAUSIBLE_TOKENS})",
                    req.api.path()
                ),
            },
        }
    }

    /// `POST /reset_prefix_cache` (vLLM, `rigbench serve`): see
    /// [`EngineClient::reset_prefix_cache_at`].
    ///
    /// # Errors
    /// The request failed.
    pub async fn reset_prefix_cache(&self) -> anyhow::Result<Option<bool>> {
        self.reset_prefix_cache_at("/reset_prefix_cache").await
    }

    /// Empty the engine's prefix cache with `POST path` (`/reset_prefix_cache` for vLLM,
    /// `/flush_cache` for SGLang): `Some(true)` when done, `Some(false)` when refused, `None`
    /// when the engine does not offer it (404/405/501).
    ///
    /// # Errors
    /// The request failed.
    pub async fn reset_prefix_cache_at(&self, path: &str) -> anyhow::Result<Option<bool>> {
        let r = self
            .send_retrying(|c| c.post(self.url(path)).timeout(Duration::from_secs(30)))
            .await
            .with_context(|| format!("POST {path}"))?;
        Ok(match r.status().as_u16() {
            404 | 405 | 501 => None,
            s => Some((200..300).contains(&s)),
        })
    }

    /// `POST /rigbench/reset_peaks` (`rigbench serve`: restart its high-water marks):
    /// `Some(true)` when done, `None` when the engine does not offer it.
    pub async fn reset_peaks(&self) -> anyhow::Result<Option<bool>> {
        let r = self
            .send_retrying(|c| {
                c.post(self.url("/rigbench/reset_peaks"))
                    .timeout(Duration::from_secs(30))
            })
            .await
            .context("POST /rigbench/reset_peaks")?;
        Ok(match r.status().as_u16() {
            404 | 405 | 501 => None,
            s => Some((200..300).contains(&s)),
        })
    }

    /// Send one streaming request and read it to the end, or until `stop` resolves (then the
    /// connection is dropped, which aborts the request on the engine), or until `timeout`.
    /// Returns the send instant and the outcome; never fails: problems land in
    /// [`StreamOutcome::error`].
    pub async fn stream(
        &self,
        req: &GenRequest,
        timeout: Duration,
        stop: impl std::future::Future<Output = ()>,
    ) -> (Instant, StreamOutcome) {
        let sent = Instant::now();
        let mut out = StreamOutcome {
            max_tokens: Some(u64::from(req.max_tokens)),
            ..Default::default()
        };
        let res = {
            let work = self.stream_inner(req, sent, &mut out);
            tokio::select! {
                r = tokio::time::timeout(timeout, work) => match r {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some((e, false)),
                    Err(_) => Some((String::new(), false)),
                },
                _ = stop => Some(("cancelled by the client".to_string(), true)),
            }
        };
        // A timeout says what had arrived, so a stall before the answer, after the headers and
        // in the middle of the tokens read differently.
        let res = res.map(|(e, c)| {
            if !e.is_empty() || c {
                return (e, c);
            }
            let seen = match (out.http_status, out.chunks) {
                (None, _) => "no response (status line and headers) had arrived".to_string(),
                (Some(s), _) if !(200..300).contains(&s) => {
                    format!("HTTP {s} headers arrived, then its error body stalled")
                }
                (Some(s), 0) => format!("HTTP {s} headers arrived, then no SSE data"),
                (Some(_), n) => format!(
                    "{n} chunk{} had arrived, {} token-bearing",
                    if n == 1 { "" } else { "s" },
                    out.events.len()
                ),
            };
            (
                format!("timed out after {:.0} s: {seen}", timeout.as_secs_f64()),
                false,
            )
        });
        if let Some((e, cancelled)) = res {
            out.error = Some(e);
            out.cancelled = cancelled;
        }
        out.end = sent.elapsed();
        (sent, out)
    }

    async fn stream_inner(
        &self,
        req: &GenRequest,
        sent: Instant,
        out: &mut StreamOutcome,
    ) -> Result<(), String> {
        let body = req.body();
        let send = |c: &reqwest::Client| {
            c.post(self.url(req.api.path()))
                .header("Accept", "text/event-stream")
                .json(&body)
                .send()
        };
        let resp = match send(&self.http).await {
            Ok(r) => r,
            // Failed before any response arrived, on a connection the server had closed: the
            // engine never got the request. Once more, on a connection of its own.
            Err(e) if is_stale_connection_error(&e) => {
                out.retries = 1;
                out.retry_reason = Some(error_chain(&e));
                send(&self.fresh)
                    .await
                    .map_err(|e2| {
                        if e2.is_redirect() {
                            return format!("the engine's redirects: {}", error_chain(&e2));
                        }
                        format!(
                            "connection failed twice (first on a pooled connection: {}; then on a fresh one: {})",
                            out.retry_reason.as_deref().unwrap_or(""),
                            error_chain(&e2)
                        )
                    })?
            }
            // A redirect loop is the engine's answer, not a lost connection (which would count
            // toward "engine unreachable").
            Err(e) if e.is_redirect() => {
                return Err(format!("the engine's redirects: {}", error_chain(&e)))
            }
            Err(e) => return Err(format!("connection failed: {}", error_chain(&e))),
        };
        let status = resp.status();
        out.http_status = Some(status.as_u16());
        if !status.is_success() {
            let body = read_body_limited(resp, MAX_ERROR_BODY_BYTES, true, req.api.path())
                .await
                .unwrap_or_default();
            let fix = if matches!(status.as_u16(), 401 | 403) {
                format!(" ({API_KEY_FIX})")
            } else {
                String::new()
            };
            let msg = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| {
                    v.pointer("/error/message")
                        .or_else(|| v.get("message"))
                        .or_else(|| v.get("detail"))
                        .and_then(Value::as_str)
                        .map(str::to_string)
                })
                .unwrap_or_else(|| body.chars().take(200).collect());
            let msg = if msg.trim().is_empty() {
                "(the engine sent no body)".to_string()
            } else {
                msg
            };
            return Err(format!("HTTP {status}: {msg}{fix}"));
        }
        let ctype = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        if !ctype.starts_with("text/event-stream") {
            return Err(format!(
                "expected a stream (text/event-stream), got content type '{ctype}'"
            ));
        }
        let mut dec = SseDecoder::default();
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| {
                format!(
                    "stream broke after {} chunks: {}",
                    out.chunks,
                    error_chain(&e)
                )
            })?;
            let at = sent.elapsed();
            for data in dec
                .push(&chunk)
                .map_err(|e| format!("malformed SSE: {e}"))?
            {
                out.apply(at, &data)?;
            }
            if out.done {
                return Ok(());
            }
        }
        if let Some(data) = dec.finish() {
            out.apply(sent.elapsed(), &data)?;
        }
        if !out.done {
            return Err(format!(
                "stream ended before [DONE] after {} chunks (the engine closed the connection)",
                out.chunks
            ));
        }
        Ok(())
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_framing() {
        let mut d = SseDecoder::default();
        assert!(d.push(b"data: {\"a\"").unwrap().is_empty());
        assert_eq!(d.push(b":1}\r\n\r\n").unwrap(), vec!["{\"a\":1}"]);
        assert_eq!(
            d.push(b": keep-alive\n\ndata:x\ndata: y\nevent: e\n\ndata: [DONE]\n\n")
                .unwrap(),
            vec!["x\ny", "[DONE]"]
        );
        assert!(d.push(b"data: tail").unwrap().is_empty());
        assert_eq!(d.finish().as_deref(), Some("tail"));
        assert!(SseDecoder::default().push(b"data: \xff\xfe\n\n").is_err());
    }

    #[test]
    fn sse_memory_is_bounded_and_cuts_do_not_matter() {
        // An engine that sends bytes without ever ending a line: an error at the bound.
        let mut d = SseDecoder::default();
        let junk = vec![b'x'; 1 << 20];
        let mut failed = false;
        for _ in 0..(MAX_SSE_EVENT_BYTES >> 20) + 2 {
            if d.push(&junk).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed, "an endless line was buffered without bound");
        // Data lines without the blank line that ends the event count too.
        let mut d = SseDecoder::default();
        let line = format!("data: {}\n", "y".repeat(1 << 20));
        let failed = (0..(MAX_SSE_EVENT_BYTES >> 20) + 2).any(|_| d.push(line.as_bytes()).is_err());
        assert!(failed, "an endless event was buffered without bound");
        // Many events in one read, and the same bytes one at a time, give the same events.
        let stream: String = (0..20_000).map(|i| format!("data: {i}\r\n\n")).collect();
        let whole = SseDecoder::default().push(stream.as_bytes()).unwrap();
        let mut d = SseDecoder::default();
        let mut bytewise = Vec::new();
        for b in stream.as_bytes() {
            bytewise.extend(d.push(std::slice::from_ref(b)).unwrap());
        }
        assert_eq!(whole.len(), 20_000);
        assert_eq!(whole, bytewise);
        assert_eq!(whole[19_999], "19999");
    }

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

        // Malformed in ways that were once read as success (tests/hostile_modes.rs): a count
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

    #[test]
    fn tokenize_bodies_per_engine() {
        assert_eq!(
            TokenizeForm::Vllm.body("m", "hi"),
            json!({"model": "m", "prompt": "hi", "add_special_tokens": false})
        );
        assert_eq!(
            TokenizeForm::LlamaCpp.body("m", "hi"),
            json!({"content": "hi", "add_special": false})
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_stale_connection_error() {
        // Nothing listens on port 9 of the loopback: a connect error, retried once.
        let e = reqwest::Client::new()
            .get("http://127.0.0.1:9/health")
            .send()
            .await
            .unwrap_err();
        assert!(is_stale_connection_error(&e), "{e:?}");
        let c = EngineClient::new("http://127.0.0.1:9/v1/").unwrap();
        assert_eq!(c.base(), "http://127.0.0.1:9");
        assert!(!c.health(Duration::from_secs(2)).await);
    }

    #[test]
    fn request_bodies() {
        let mut r = GenRequest {
            api: Api::Chat,
            model: "m".into(),
            prompt: "p".into(),
            max_tokens: 8,
            ignore_eos: true,
            temperature: 0.0,
            seed: Some(3),
            thinking: Some(false),
        };
        let b = r.body();
        assert_eq!(b["messages"][0]["content"], "p");
        assert_eq!(b["chat_template_kwargs"]["enable_thinking"], false);
        assert_eq!(b["ignore_eos"], true);
        assert_eq!(b["stream_options"]["include_usage"], true);
        r.api = Api::Completions;
        r.thinking = None;
        let b = r.body();
        assert_eq!(b["prompt"], "p");
        assert!(b.get("messages").is_none() && b.get("chat_template_kwargs").is_none());
    }
}
