//! What keeps `rigbench serve` answering when clients are slow, idle, many or unwelcome:
//! the connection limit, the header-read and body timeouts, the API key, and the accept loop
//! that applies them (HTTP/1.1 through hyper; axum's own `serve` has neither a timeout nor a
//! limit, so 1,040 idle or half-sent connections used up a 1,024-descriptor limit and the
//! server stopped accepting; docs/reliability.md).
//!
//! - **Connection limit** ([`ServeLimits::max_connections`]): a connection over the limit gets
//!   `503` with an OpenAI-style JSON error at once and is closed, so the server never runs out
//!   of file descriptors. The default is the process's descriptor limit (`RLIMIT_NOFILE`) less
//!   [`RESERVED_FDS`] for model files, logs and the engine.
//! - **Header-read timeout** ([`ServeLimits::header_read_timeout`]): a request head (request
//!   line and headers) must arrive whole within it, counted from when the server starts waiting
//!   for it: for a new connection from its accept, for a kept-alive one from the end of its last
//!   response. So it is also how long an idle connection stays open (hyper's
//!   `header_read_timeout`, which starts that way).
//! - **Idle (body) timeout** ([`ServeLimits::idle_timeout`]): the longest pause between two
//!   parts of a request body; a client that sends half a body and stops is answered `400` and
//!   its connection closed.
//! - **Body-read timeout** ([`ServeLimits::body_read_timeout`]): the whole body must arrive
//!   within it, counted from when the handler starts reading it. Without it a client that sends
//!   one byte every 10 s never paused long enough for the idle timeout: 960 of them held every
//!   connection slot and the server answered 503 for 90 s (docs/reliability.md).
//! - **API key** ([`ApiKey`]): the header of vLLM's `--api-key`, on every route (also
//!   `/health` and `/metrics`, which vLLM leaves open: it checks only `/v1/...`):
//!   `Authorization: Bearer KEY`; otherwise `401` with a JSON error.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;

/// File descriptors kept back from the connection limit's default: the listener, standard
/// streams, model and tokenizer files, the engine's threads and logs.
pub const RESERVED_FDS: u64 = 64;

/// The default connection limit's ceiling when the descriptor limit is very high.
pub const MAX_DEFAULT_CONNECTIONS: usize = 16_384;

/// The limits of `rigbench serve` (flags `--max-connections`, `--header-read-timeout`,
/// `--idle-timeout`, `--max-chat-messages`, `--max-logprobs`).
#[derive(Debug, Clone, PartialEq)]
pub struct ServeLimits {
    /// Connections open at once; `None` = [`default_max_connections`].
    pub max_connections: Option<usize>,
    /// Time for a whole request head, from when the server waits for it (also the keep-alive
    /// idle time). Default 30 s (hyper's default).
    pub header_read_timeout: Duration,
    /// Longest pause inside a request body. Default 30 s.
    pub idle_timeout: Duration,
    /// Longest time to receive a whole request body. Default 60 s (64 MiB, the largest body
    /// accepted, at 1.1 MB/s).
    pub body_read_timeout: Duration,
    /// Most messages in one chat request (`/v1/chat/completions`, `/tokenize`); a request with
    /// more gets `400` naming the limit. Default [`DEFAULT_MAX_CHAT_MESSAGES`].
    pub max_chat_messages: usize,
    /// Most log-probability alternatives per token a request may ask for (`logprobs`,
    /// `top_logprobs`, `prompt_logprobs`); more gets `400` naming the field. vLLM's
    /// `--max-logprobs`, default [`DEFAULT_MAX_LOGPROBS`]; `usize::MAX` = the whole vocabulary
    /// (vLLM's `-1`), capped at the vocabulary by the server. Each alternative is one JSON entry
    /// per position (`"id": {logprob, rank, decoded_token}`, some 60 bytes by its form; not measured).
    pub max_logprobs: usize,
}

/// The default of [`ServeLimits::max_logprobs`]: vLLM's default `max_logprobs` (20), so that a
/// client written for vLLM meets the same limit here.
pub const DEFAULT_MAX_LOGPROBS: usize = 20;

/// The default of [`ServeLimits::max_chat_messages`]: far above any real conversation (a
/// 128k-token context holds a few thousand turns), low enough that one request's template
/// rendering stays a bounded job.
pub const DEFAULT_MAX_CHAT_MESSAGES: usize = 65_536;

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            max_connections: None,
            header_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(60),
            max_chat_messages: DEFAULT_MAX_CHAT_MESSAGES,
            max_logprobs: DEFAULT_MAX_LOGPROBS,
        }
    }
}

impl ServeLimits {
    /// The connection limit in force: the configured one, else [`default_max_connections`].
    pub fn connections(&self) -> usize {
        self.max_connections.unwrap_or_else(default_max_connections)
    }
}

/// The process's soft descriptor limit (`RLIMIT_NOFILE`) less [`RESERVED_FDS`], at least 16
/// and at most [`MAX_DEFAULT_CONNECTIONS`].
pub fn default_max_connections() -> usize {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) only writes the plain struct behind the pointer, valid for writes.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
        r.rlim_cur
    } else {
        1024
    };
    (soft.saturating_sub(RESERVED_FDS) as usize).clamp(16, MAX_DEFAULT_CONNECTIONS)
}

/// An API key clients must send as `Authorization: Bearer KEY`. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// A key; `None` for an empty one (vLLM treats an empty `--api-key` as none).
    pub fn new(key: &str) -> Option<Self> {
        (!key.is_empty()).then(|| ApiKey(key.to_string()))
    }

    /// Whether an `Authorization` header value carries this key (`Bearer KEY`; compared in
    /// time independent of where the first difference is).
    pub fn accepts(&self, authorization: Option<&[u8]>) -> bool {
        let Some(v) = authorization else {
            return false;
        };
        let Some(token) = v.strip_prefix(b"Bearer ") else {
            return false;
        };
        let want = self.0.as_bytes();
        if token.len() != want.len() {
            return false;
        }
        token
            .iter()
            .zip(want)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// A JSON error in the OpenAI form the rest of the server uses.
fn json_error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = serde_json::json!({
        "error": {"message": message, "type": kind, "param": null, "code": status.as_u16()}
    });
    (status, axum::Json(body)).into_response()
}

/// The message of a `401`.
pub const UNAUTHORIZED: &str = "Unauthorized: this server needs an API key; send it as the header `Authorization: Bearer KEY` (the key given to rigbench serve with --api-key or VLLM_API_KEY)";

/// Wrap `router` so that every route needs `key` (when `Some`) and every request body is read
/// with `idle_timeout` as the longest pause and `body_timeout` as the longest time in all.
pub fn protect(
    router: Router,
    key: Option<ApiKey>,
    idle_timeout: Duration,
    body_timeout: Duration,
) -> Router {
    let key = key.map(Arc::new);
    router.layer(axum::middleware::from_fn(
        move |req: Request, next: Next| {
            let key = key.clone();
            async move {
                if let Some(k) = &key {
                    let auth = req
                        .headers()
                        .get(header::AUTHORIZATION)
                        .map(|v| v.as_bytes());
                    if !k.accepts(auth) {
                        return json_error(
                            StatusCode::UNAUTHORIZED,
                            "AuthenticationError",
                            UNAUTHORIZED,
                        );
                    }
                }
                next.run(with_body_timeout(req, idle_timeout, body_timeout))
                    .await
            }
        },
    ))
}

/// `req` with a body that fails when no part of it arrives within `idle`, or when the whole of
/// it has not arrived `total` after the first read (the handler's body extractor then answers
/// `400`, and hyper closes the connection).
fn with_body_timeout(req: Request, idle: Duration, total: Duration) -> Request {
    use futures::StreamExt;
    let (parts, body) = req.into_parts();
    let stream = body.into_data_stream();
    let timed = futures::stream::unfold(
        (Some(stream), None::<tokio::time::Instant>),
        move |(st, deadline)| async move {
            let mut st = st?;
            let now = tokio::time::Instant::now();
            let deadline = deadline.unwrap_or(now + total);
            let until = (now + idle).min(deadline);
            let item = match tokio::time::timeout_at(until, st.next()).await {
                Ok(Some(Ok(b))) => Ok(b),
                Ok(Some(Err(e))) => Err(std::io::Error::other(e.to_string())),
                Ok(None) => return None,
                Err(_) if until >= deadline => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "the request body did not arrive whole within {} s (rigbench serve --body-read-timeout)",
                        total.as_secs_f64()
                    ),
                )),
                Err(_) => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "no part of the request body arrived for {} s (rigbench serve --idle-timeout)",
                        idle.as_secs_f64()
                    ),
                )),
            };
            let next = if item.is_ok() { Some(st) } else { None };
            Some((item, (next, Some(deadline))))
        },
    );
    Request::from_parts(parts, axum::body::Body::from_stream(timed))
}

/// Whether `rigbench serve` bound only this host (a loopback address).
pub fn is_loopback(addr: &SocketAddr) -> bool {
    match addr.ip() {
        IpAddr::V4(a) => a.is_loopback(),
        IpAddr::V6(a) => a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v| v.is_loopback()),
    }
}

/// The warning `rigbench serve` prints when it listens on `addr` beyond this host; `None` on
/// loopback.
pub fn exposure_warning(addr: &SocketAddr, has_key: bool) -> Option<String> {
    if is_loopback(addr) {
        return None;
    }
    Some(format!(
        "rigbench serve: warning: listening on {addr}, not a loopback address: other machines can reach this server{}",
        if has_key {
            " (every request needs the API key)"
        } else {
            " and use it without a key; give --api-key (or VLLM_API_KEY), or --host 127.0.0.1"
        }
    ))
}

/// The bytes sent to a connection over the limit before it is closed.
fn over_limit_response(limit: usize) -> Vec<u8> {
    let body = serde_json::json!({"error": {
        "message": format!("the server has {limit} connections open, its limit (rigbench serve --max-connections); try again later"),
        "type": "ServiceUnavailableError", "param": null, "code": 503}})
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Serve `router` on `listener` until `shutdown` resolves: at most `limits.connections()`
/// connections at once, each with the header-read timeout; then stop accepting, ask every
/// connection to finish its request in flight, and wait until all have closed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: &ServeLimits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let max = limits.connections();
    let permits = Arc::new(tokio::sync::Semaphore::new(max));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let over_limit = over_limit_response(max);
    let header_timeout = limits.header_read_timeout;
    let mut accept_error_said = false;
    tokio::pin!(shutdown);
    loop {
        let (tcp, _peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE/ENFILE and aborted handshakes: wait a little, go on (the limit
                    // keeps this rare: descriptors are reserved for the rest).
                    if !accept_error_said {
                        eprintln!("rigbench serve: accepting a connection failed: {e}; retrying");
                        accept_error_said = true;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            // Over the limit: say so without waiting for the client, and close.
            let _ = tcp.try_write(&over_limit);
            drop(tcp);
            continue;
        };
        // Without TCP_NODELAY Nagle's algorithm holds small SSE chunks back until the client's
        // delayed ACK (~40 ms), which e2e timings would then measure instead of the engine.
        let _ = tcp.set_nodelay(true);
        let svc = hyper_util::service::TowerToHyperService::new(router.clone());
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout);
            let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(tcp), svc);
            tokio::pin!(conn);
            let mut stopping = false;
            loop {
                tokio::select! {
                    _ = conn.as_mut() => break,
                    r = stop.wait_for(|v| *v), if !stopping => {
                        stopping = true;
                        if r.is_ok() {
                            conn.as_mut().graceful_shutdown();
                        }
                    }
                }
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection returns its permit when it closes.
    let _ = permits.acquire_many(max as u32).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_key_is_checked_and_never_shown() {
        let k = ApiKey::new("s3cret-key").unwrap();
        assert!(k.accepts(Some(b"Bearer s3cret-key")));
        for bad in [
            &b"Bearer s3cret-kex"[..],
            b"Bearer s3cret-key2",
            b"bearer s3cret-key",
            b"s3cret-key",
            b"Bearer ",
        ] {
            assert!(!k.accepts(Some(bad)), "{}", String::from_utf8_lossy(bad));
        }
        assert!(!k.accepts(None));
        assert!(!format!("{k:?}").contains("s3cret"));
        assert!(ApiKey::new("").is_none());
    }

    #[test]
    fn loopback_is_quiet_and_any_address_warns() {
        let lo: SocketAddr = "127.0.0.1:8000".parse().unwrap();
        let lo6: SocketAddr = "[::1]:8000".parse().unwrap();
        assert!(exposure_warning(&lo, false).is_none() && exposure_warning(&lo6, false).is_none());
        for a in ["0.0.0.0:8000", "[::]:8000", "10.1.2.3:9000"] {
            let a: SocketAddr = a.parse().unwrap();
            let w = exposure_warning(&a, false).unwrap();
            assert!(w.contains("--api-key") && w.contains(&a.to_string()), "{w}");
            assert!(!exposure_warning(&a, true)
                .unwrap()
                .contains("without a key"));
        }
    }

    #[test]
    fn default_connection_limit_leaves_descriptors_for_the_rest() {
        let n = default_max_connections();
        assert!((16..=MAX_DEFAULT_CONNECTIONS).contains(&n));
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit(2) fills a plain struct.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
        if r.rlim_cur > RESERVED_FDS + 16 {
            assert!(n as u64 + RESERVED_FDS <= r.rlim_cur);
        }
    }
}
