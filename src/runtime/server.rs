//! The OpenAI-compatible HTTP server (axum on tokio), shaped like vLLM's so that clients and the
//! e2e driver treat rigbench and vLLM alike.
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions` (SSE streaming or not,
//! `usage`, `stream_options.include_usage`, `chat_template_kwargs`, reasoning split into
//! `reasoning_content`), `GET /v1/models`, `GET /health`, `GET /version`, `GET /metrics`,
//! `POST /reset_prefix_cache`, `POST /tokenize`, `POST /detokenize`.
//!
//! Bad requests get HTTP 400 with OpenAI's error body `{"error": {"message", "type", "param",
//! "code"}}`. A client that disconnects aborts its request (its KV blocks are freed). Requests
//! that do not fit are queued, never dropped.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc as tmpsc;

pub use super::config::ServeConfig;
use super::engine::{
    self, EngineHandle, EngineInfo, FinishReason, GenerateRequest, ReasoningMode, RequestOutput,
    TokenLogprob,
};
use super::sampler::SamplingParams;

/// A running server.
#[derive(Debug)]
pub struct ServerHandle {
    addr: SocketAddr,
    engine: EngineHandle,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    engine_thread: Option<std::thread::JoinHandle<()>>,
}

impl ServerHandle {
    /// The bound address (the real port when started with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR` (no trailing slash).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The startup KV lines in vLLM's form (see [`crate::runtime::memory::KvPlan::lines`]).
    pub fn kv_lines(&self) -> Vec<String> {
        let i = &self.engine.info;
        i.kv_plan.lines(&i.backend)
    }

    /// Facts about the loaded engine.
    pub fn info(&self) -> &EngineInfo {
        &self.engine.info
    }

    /// Stop accepting connections, stop the engine (in-flight streams end), and wait for both
    /// (at most 10 s for open connections).
    pub async fn shutdown(mut self) {
        self.stop().await;
    }

    /// Wait until the server stops (e.g. after [`Self::shutdown`] from elsewhere or a fatal
    /// error).
    pub async fn wait(&mut self) {
        if let Some(t) = self.task.as_mut() {
            let _ = t.await;
            self.task = None;
        }
    }

    async fn stop(&mut self) {
        self.engine.shutdown();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let abort = t.abort_handle();
            if tokio::time::timeout(std::time::Duration::from_secs(10), t)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        if let Some(j) = self.engine_thread.take() {
            let _ = tokio::task::spawn_blocking(move || j.join()).await;
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.engine.shutdown();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Bind `host:port` ([`bind`]), load the model and serve in the background ([`start_on`]).
///
/// # Errors
/// Loading errors (naming the flag or file at fault) and bind errors naming `--host`/`--port`.
pub async fn start(config: ServeConfig) -> anyhow::Result<ServerHandle> {
    let listener = bind(&config).await?;
    start_on(listener, config).await
}

/// Bind `config`'s host and port. `rigbench serve` does it before loading the model, so that a
/// busy port is found at once, not after the model has loaded (minutes for a large preset);
/// connections wait in the backlog until [`start_on`] serves them.
///
/// # Errors
/// The address cannot be bound (a busy port, an address this host does not have): an error of
/// the environment (exit 1), naming the flags that choose another.
pub async fn bind(config: &ServeConfig) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind((config.host.as_str(), config.port))
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot listen on {}:{}: {e}; choose another with --host/--port (--port 0 picks a free one)",
                config.host,
                config.port
            )
        })
}

/// [`start`] on a listener already bound ([`bind`]): load the model, then serve.
///
/// # Errors
/// As [`start`].
pub async fn start_on(
    listener: tokio::net::TcpListener,
    config: ServeConfig,
) -> anyhow::Result<ServerHandle> {
    let cfg = config.clone();
    let loaded = tokio::task::spawn_blocking(move || engine::load(&cfg))
        .await
        .map_err(|e| anyhow::anyhow!("model loading panicked: {e}"))??;
    let addr = listener.local_addr()?;
    let (engine, engine_thread) = engine::spawn(loaded)?;
    let app = Arc::new(App {
        engine: engine.clone(),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        cpu_work: tokio::sync::Semaphore::new(
            std::thread::available_parallelism().map_or(1, |n| n.get()),
        ),
        max_chat_messages: config.limits.max_chat_messages,
    });
    let router = super::serve_guard::protect(
        router(app),
        config.api_key.clone(),
        config.limits.idle_timeout,
        config.limits.body_read_timeout,
    );
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let limits = config.limits.clone();
    let task = tokio::spawn(async move {
        super::serve_guard::serve(listener, router, &limits, async move {
            let _ = rx.await;
        })
        .await;
    });
    Ok(ServerHandle {
        addr,
        engine,
        shutdown: Some(tx),
        task: Some(task),
        engine_thread: Some(engine_thread),
    })
}

struct App {
    engine: EngineHandle,
    created: u64,
    /// Permits for CPU-bound request work ([`off_request_threads`]): one per core.
    cpu_work: tokio::sync::Semaphore,
    /// The most messages one chat request may have ([`ServeLimits::max_chat_messages`]).
    max_chat_messages: usize,
}

type AppState = Arc<App>;

fn router(app: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/version", get(version))
        .route("/metrics", get(metrics))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/rigbench/reset_peaks", post(reset_peaks))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(not_found)
        // Prompts up to a long context fit; axum's default limit is 2 MiB.
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::map_response(
            oversized_body_as_openai_error,
        ))
        .with_state(app)
}

/// The largest request body accepted, bytes (64 MiB).
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// axum answers a body over the limit with a plain-text 413; clients of an OpenAI-compatible
/// server expect a JSON error object, as for every other bad request (400).
async fn oversized_body_as_openai_error(res: Response) -> Response {
    if res.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::bad(format!(
            "the request body is larger than this server's limit of {} MiB",
            MAX_BODY_BYTES >> 20
        ))
        .into_response();
    }
    res
}

/// An OpenAI-style error response.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
    param: Option<&'static str>,
}

impl ApiError {
    fn bad(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: None,
        }
    }

    fn param(mut self, p: &'static str) -> Self {
        self.param = Some(p);
        self
    }

    fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            param: None,
        }
    }

    fn body(&self) -> Value {
        let kind = match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::NOT_FOUND => "NotFoundError",
            _ => "InternalServerError",
        };
        json!({"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status.as_u16()}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: "no such endpoint".into(),
        param: None,
    }
}

fn parse_body<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, ApiError> {
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
fn parse_request<T: for<'de> Deserialize<'de>>(
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
struct StreamOptions {
    include_usage: Option<bool>,
}

/// Fields shared by chat and completions requests.
#[derive(Debug, Deserialize, Default)]
struct Common {
    model: Option<String>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<Value>,
    max_completion_tokens: Option<Value>,
    // Sampling numbers are read as JSON values and checked by `validate`, so that a wrong type
    // ("NaN", "0.7") gets an error naming the field, like a wrong value.
    temperature: Option<Value>,
    top_p: Option<Value>,
    top_k: Option<Value>,
    seed: Option<i64>,
    ignore_eos: Option<bool>,
    stop: Option<Value>,
    n: Option<i64>,
    /// vLLM's extra field: the prompt tokens' log-probabilities with this many alternatives.
    prompt_logprobs: Option<Value>,
    /// vLLM's `min_tokens`: no EOS, stop token or stop string before this many tokens.
    min_tokens: Option<Value>,
}

/// Most alternatives per token a request may ask for (vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: i64 = 20;

/// An optional count of log-probability alternatives (`null` counts as absent), 0 to
/// [`MAX_LOGPROBS`].
fn logprob_count(v: &Option<Value>, name: &'static str) -> Result<Option<usize>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(x) => {
            let n = int_field(x, name)?;
            if !(0..=MAX_LOGPROBS).contains(&n) {
                return Err(ApiError::bad(format!(
                    "{name} must be between 0 and {MAX_LOGPROBS}, got {n}"
                ))
                .param(name));
            }
            Ok(Some(n as usize))
        }
    }
}

/// A token as text (its own decoding, special tokens included).
fn token_text(app: &App, id: u32) -> String {
    app.engine.tokenizer.decode(&[id], false)
}

/// OpenAI's legacy completions `logprobs` object for `entries` (one per token; `None` for a
/// token nothing predicts, the first prompt token under `echo`), `text_offset` counted from
/// `offset` in characters of the returned text.
fn completion_logprobs(
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
fn chat_logprobs(app: &App, entries: &[TokenLogprob]) -> Value {
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
fn vllm_prompt_logprobs(app: &App, entries: &[Option<TokenLogprob>]) -> Value {
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

/// What a request asked for beyond text: log-probabilities and echo.
#[derive(Debug, Clone, Default)]
struct Extras {
    /// Chat `logprobs: true`, or completions `logprobs: N`.
    logprobs: bool,
    /// vLLM `prompt_logprobs` (returned as that field).
    prompt_logprobs_field: bool,
    /// Completions `echo`: the prompt text and ids, returned before the completion.
    echo: Option<(String, Vec<u32>)>,
}

#[derive(Debug, Deserialize)]
struct ChatRequest {
    #[serde(flatten)]
    common: Common,
    /// Chat: return the generated tokens' log-probabilities.
    logprobs: Option<bool>,
    /// Chat: alternatives per token (0-20; needs `logprobs`).
    top_logprobs: Option<Value>,
    messages: Option<Value>,
    chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    add_generation_prompt: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    #[serde(flatten)]
    common: Common,
    prompt: Option<Value>,
    echo: Option<bool>,
    /// Completions: alternatives per token (0-20); present = return log-probabilities.
    logprobs: Option<Value>,
}

impl App {
    fn check_model(&self, model: &Option<String>) -> Result<(), ApiError> {
        match model {
            None => Ok(()),
            Some(m) if *m == self.engine.info.served_model_name || *m == self.engine.info.model => {
                Ok(())
            }
            Some(m) => Err(ApiError::bad(format!(
                "The model `{m}` does not exist; this server serves `{}`",
                self.engine.info.served_model_name
            ))
            .param("model")),
        }
    }

    fn max_model_len(&self) -> usize {
        self.engine.info.capacity.max_model_len
    }
}

/// Validated generation settings.
struct Gen {
    params: SamplingParams,
    extras: Extras,
    max_tokens: usize,
    ignore_eos: bool,
    stop: Vec<String>,
    stream: bool,
    include_usage: bool,
}

fn int_field(v: &Value, name: &'static str) -> Result<i64, ApiError> {
    v.as_i64()
        .or_else(|| v.as_u64().map(|_| i64::MAX))
        .ok_or_else(|| ApiError::bad(format!("{name} must be an integer, got {v}")).param(name))
}

/// An optional number field (`null` counts as absent).
fn num_field(v: &Option<Value>, name: &'static str) -> Result<Option<f64>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_f64()
            .map(Some)
            .ok_or_else(|| ApiError::bad(format!("{name} must be a number, got {x}")).param(name)),
    }
}

/// `min_tokens` (vLLM's checks: an integer from 0 to `max_tokens`; `null` is 0).
fn min_tokens(c: &Common, max_tokens: usize) -> Result<usize, ApiError> {
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

fn validate(
    c: &Common,
    prompt_len: usize,
    max_model_len: usize,
    default_max: Option<usize>,
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
    let prompt_logprobs = logprob_count(&c.prompt_logprobs, "prompt_logprobs")?;
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

/// Run CPU-bound request work (parsing a body of up to [`MAX_BODY_BYTES`], the chat template,
/// the tokenizer) on tokio's blocking threads, at most one job per core at a time, so that the
/// threads that handle requests keep answering (`/health`, streams in flight) while a large
/// request is prepared.
///
/// # Errors
/// `f`'s error; a 500 when the job panicked or the server is shutting down.
async fn off_request_threads<T, F>(app: &AppState, f: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&App) -> Result<T, ApiError> + Send + 'static,
{
    let _permit = app
        .cpu_work
        .acquire()
        .await
        .map_err(|_| ApiError::internal("the server is shutting down"))?;
    let app = Arc::clone(app);
    tokio::task::spawn_blocking(move || f(&app))
        .await
        .map_err(|e| ApiError::internal(format!("request preparation failed: {e}")))?
}

fn render_chat(
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

fn reasoning_mode(
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

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn new_id(prefix: &str) -> String {
    format!(
        "{prefix}-{:016x}{:08x}",
        rand::random::<u64>(),
        rand::random::<u32>()
    )
}

/// Aborts the engine request when dropped before it finished (client gone).
struct AbortGuard {
    engine: EngineHandle,
    id: u64,
    done: bool,
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if !self.done {
            self.engine.abort(self.id);
        }
    }
}

fn usage_json(o: &RequestOutput) -> Value {
    json!({
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": o.completion_tokens,
        "total_tokens": o.prompt_tokens + o.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": o.cached_tokens},
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Completion,
}

async fn chat_completions(State(app): State<AppState>, body: Bytes) -> Response {
    match chat_inner(app, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn chat_inner(app: AppState, body: Bytes) -> Result<Response, ApiError> {
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
    let mut gen = validate(&req.common, prompt.len(), app.max_model_len(), None)?;
    let top = logprob_count(&req.top_logprobs, "top_logprobs")?;
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

async fn completions(State(app): State<AppState>, body: Bytes) -> Response {
    match completions_inner(app, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn completions_inner(app: AppState, body: Bytes) -> Result<Response, ApiError> {
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
    let mut gen = validate(&req.common, prompt.len(), app.max_model_len(), Some(16))?;
    if let Some(k) = logprob_count(&req.logprobs, "logprobs")? {
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

async fn run_generation(
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

#[allow(clippy::too_many_arguments)]
async fn collect(
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

struct StreamState {
    rx: tmpsc::UnboundedReceiver<RequestOutput>,
    guard: AbortGuard,
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    started: bool,
    finished: bool,
    app: AppState,
    extras: Extras,
    /// Characters of completion text sent so far (the `text_offset` of the next token).
    text_len: usize,
}

impl StreamState {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Event {
        self.chunk_with(delta, finish, Value::Null)
    }

    fn chunk_with(&self, delta: Value, finish: Option<&str>, logprobs: Value) -> Event {
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
    fn logprobs_of(&mut self, o: &RequestOutput, content: &str) -> Value {
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

async fn next_events(mut st: StreamState) -> Option<(Vec<Event>, StreamState)> {
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

async fn models(State(app): State<AppState>) -> Json<Value> {
    let i = &app.engine.info;
    Json(json!({"object": "list", "data": [{
        "id": i.served_model_name, "object": "model", "created": app.created, "owned_by": "rigbench",
        "root": i.model, "parent": null, "max_model_len": i.capacity.max_model_len,
    }]}))
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn version(State(app): State<AppState>) -> Json<Value> {
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

async fn metrics(State(app): State<AppState>) -> Response {
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
async fn reset_peaks(State(app): State<AppState>) -> Response {
    app.engine.metrics.update(|m| m.reset_peaks());
    StatusCode::OK.into_response()
}

async fn reset_prefix_cache(State(app): State<AppState>) -> Response {
    match app.engine.reset_prefix_cache().await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => ApiError::internal(e.to_string()).into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct TokenizeRequest {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Value>,
    add_special_tokens: Option<bool>,
    add_generation_prompt: Option<bool>,
    chat_template_kwargs: Option<serde_json::Map<String, Value>>,
}

async fn tokenize(State(app): State<AppState>, body: Bytes) -> Response {
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
struct DetokenizeRequest {
    model: Option<String>,
    tokens: Option<Vec<i64>>,
}

async fn detokenize(State(app): State<AppState>, body: Bytes) -> Response {
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
