//! The OpenAI-compatible HTTP client: streaming chat and completions requests over
//! Server-Sent Events, and the engine's side endpoints (`/health`, `/version`, `/v1/models`,
//! `/metrics`, `/tokenize`, `/reset_prefix_cache`): requests, bodies and their limits, the API
//! key, transport errors. The SSE framing is `super::sse`'s, what each chunk says
//! `super::stream`'s.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::sse::SseDecoder;
use super::stream::{StreamOutcome, MAX_PLAUSIBLE_TOKENS};
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

/// The longest wait for a whole answer of an engine's side endpoints, `GET /version` and
/// `GET /v1/models` (they answer from memory in milliseconds; a stalled one used to cost 30 s
/// each, with no reason given).
pub const SIDE_TIMEOUT: Duration = Duration::from_secs(5);

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
pub const API_KEY_FIX: &str = "the engine wants an API key: pass --api-key KEY or set OPENAI_API_KEY (vLLM's --api-key or VLLM_API_KEY, SGLang's --api-key, llama-server's --api-key)";

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
    /// Fields added to every generation body ([`EngineClient::with_body_fields`]).
    body_extra: serde_json::Map<String, Value>,
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
            body_extra: serde_json::Map::new(),
        })
    }

    /// This client (same connections), adding the fields of the JSON object `fields` to every
    /// generation request's body: an engine's own per-request switches, such as llama.cpp's
    /// `cache_prompt: false` for the determinism check. Not an object: nothing is added.
    pub fn with_body_fields(&self, fields: &Value) -> Self {
        let mut c = self.clone();
        if let Some(o) = fields.as_object() {
            c.body_extra.extend(o.clone());
        }
        c
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

    /// `GET path` as JSON, the whole answer within [`SIDE_TIMEOUT`].
    ///
    /// # Errors
    /// 401/403 (with [`API_KEY_FIX`]), a transport failure, a body over [`MAX_BODY_BYTES`], or
    /// no whole answer in time (the message says `stalled`); a non-2xx answer is `Ok(None)`.
    async fn get_json(&self, path: &str) -> anyhow::Result<Option<Value>> {
        let work = async {
            let r = self
                .send_retrying(|c| c.get(self.url(path)).timeout(SIDE_TIMEOUT))
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
        };
        match tokio::time::timeout(SIDE_TIMEOUT + Duration::from_secs(1), work).await {
            Ok(Err(e)) if format!("{e:#}").contains("timed out") => Err(anyhow::anyhow!(
                "GET {path} stalled: no whole answer within {} s",
                SIDE_TIMEOUT.as_secs()
            )),
            Ok(r) => r,
            Err(_) => Err(anyhow::anyhow!(
                "GET {path} stalled: no whole answer within {} s",
                SIDE_TIMEOUT.as_secs()
            )),
        }
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
        self.stream_body(req, req.body(), timeout, stop).await
    }

    /// As [`EngineClient::stream`], with `body` sent in place of `req.body()` (a trace replay's
    /// chat history); `req` still gives the API and `max_tokens`.
    pub async fn stream_body(
        &self,
        req: &GenRequest,
        mut body: Value,
        timeout: Duration,
        stop: impl std::future::Future<Output = ()>,
    ) -> (Instant, StreamOutcome) {
        if let Some(b) = body.as_object_mut() {
            b.extend(self.body_extra.clone());
        }
        let sent = Instant::now();
        let mut out = StreamOutcome {
            max_tokens: Some(u64::from(req.max_tokens)),
            ..Default::default()
        };
        let res = {
            let work = self.stream_inner(req, &body, sent, &mut out);
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
        body: &Value,
        sent: Instant,
        out: &mut StreamOutcome,
    ) -> Result<(), String> {
        let send = |c: &reqwest::Client| {
            c.post(self.url(req.api.path()))
                .header("Accept", "text/event-stream")
                .json(body)
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

/// `e` and its sources, joined by ": " (reqwest's top-level message alone hides the cause, e.g.
/// "connection refused").
pub fn error_chain(e: &dyn std::error::Error) -> String {
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
