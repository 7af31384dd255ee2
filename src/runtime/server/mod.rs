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
//!
//! By concern: this file starts and stops the server ([`start`], [`bind`], [`start_on`],
//! [`ServerHandle`]) and routes the endpoints; `app` the state the handlers share; `error` the
//! OpenAI error body; `request` the request bodies and their validation; `generate` the two
//! generation endpoints; `response` the non-streamed answer and the parts of every answer
//! (usage, ids, log-probabilities); `stream` the SSE stream; `endpoints` the other endpoints.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

mod app;
mod endpoints;
mod error;
mod generate;
mod request;
mod response;
mod stream;

pub use super::config::ServeConfig;
use super::engine::{self, EngineHandle, EngineInfo};

use app::{App, AppState};
use endpoints::{
    detokenize, health, metrics, models, reset_peaks, reset_prefix_cache, tokenize, version,
};
use error::{not_found, ApiError};
use generate::{chat_completions, completions};

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
        // vLLM's -1 (usize::MAX here) means the whole vocabulary; no request asks for more.
        max_logprobs: config
            .limits
            .max_logprobs
            .min(engine.info.model_config.vocab_size),
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
