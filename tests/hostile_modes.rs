//! 48 broken-engine modes against the e2e driver: none crashes rigbench, every spoiled request is
//! reported with its reason.
//!
//! A mock engine written on a raw tokio `TcpListener` (127.0.0.1:0, so every byte, status line,
//! header and TCP write is the test's own) answers `/health`, `/v1/models`, `/tokenize` and the
//! session's prompt-overhead probe (`stream: false`) normally, and answers every streamed
//! generation request with one of 48 named faults: HTTP statuses with and without a JSON error
//! body, a 200 that is not a stream, SSE faults (bad JSON, wrong chunk shapes, errors mid-stream,
//! missing or early `[DONE]`, comments until the timeout, invalid UTF-8, a NUL byte, impossible
//! `usage` counts, odd `finish_reason` / `index`), and transport faults (a reset before the
//! status line, unfinished headers, stalls, a short body, bad chunked encoding, HTTP/1.0 without
//! a length, a redirect loop, a 1 GiB error body). Some of the 48 are legal but unusual framings
//! a correct client must accept (CRLF line ends, an event cut into one-byte writes, a slow drip,
//! a 2 MB line, HTTP/1.0 read to the close), or harmless oddities (an unknown `finish_reason`
//! after all tokens, a choice `index` of 3): those are `Works` and must give every request with
//! the right token count.
//!
//! Each mode runs a small session through `rigbench::e2e::run_session` (3 requests, concurrency
//! 2, a 2 s request timeout) on a thread of its own under `tokio::time::timeout` (30 s), so a
//! panic or a hang is recorded as that mode's outcome rather than ending the test.
//! `Fails(needle)` modes must record every request failed with a non-empty reason holding
//! `needle` (lowercase), and the run must not present a throughput. All outcomes are printed as
//! a table before the one assertion over them, so one broken mode does not hide the others.
//!
//! The behaviour asserted here is the one described in docs/reliability.md ("Faults and their
//! outcomes", "Hostile engines"); the error texts are those of src/e2e/client.rs.

use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use rigbench::e2e::executor::StopSignal;
use rigbench::e2e::launcher::EngineChoice;
use rigbench::e2e::workload::Suite;
use rigbench::e2e::{run_session, E2eOptions, E2eResults};

/// Requests per session, all answered with the mode's fault.
const REQUESTS: usize = 3;
/// `output_tokens` of the suite: the `max_tokens` of every request.
const OUTPUT_TOKENS: usize = 6;
/// rigbench's per-request timeout in every session.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// The wall-clock bound of one session (a hang past it is that mode's failure).
const SESSION_BOUND: Duration = Duration::from_secs(30);
/// How long a stalling mock waits for the client to go away before it gives up itself.
const STALL_CAP: Duration = Duration::from_secs(60);

/// What rigbench must make of a mode.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Every request succeeds with `OUTPUT_TOKENS` tokens, and no flag or validity reason calls
    /// the (complete) outputs failed, empty, truncated or degenerate.
    Works,
    /// Every request is recorded failed, its reason (lowercased) holding the needle.
    Fails(&'static str),
}

/// The body of an HTTP error answer.
#[derive(Clone, Copy, Debug)]
enum ErrBody {
    /// OpenAI's `{"error": {"message", "type", "code"}}` with this message.
    OpenAi(&'static str),
    /// FastAPI's validation error, `{"detail": [{"loc", "msg", "type"}]}`.
    FastApiDetail,
    /// Plain text (not JSON).
    Text(&'static str),
    /// An HTML page, as a proxy in front of the engine writes it.
    Html,
    /// No body at all.
    Empty,
}

/// What the mock does with a streamed generation request.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// An HTTP error status with a body.
    Status(u16, ErrBody),
    /// 500 with `Content-Length` 1 GiB of text, written until the client goes away.
    HugeErrorBody,
    /// 200 with `application/json` holding an OpenAI error object, no stream.
    JsonError200,
    /// A data line that is not JSON after the first token.
    DataNotJson,
    /// Chunks without `choices` (the text at top level), usage, `[DONE]`.
    NoChoices,
    /// `choices` an object, not an array.
    ChoicesNotArray,
    /// Every chunk with `choices: []`, usage claiming the tokens, `[DONE]`.
    ChoicesEmpty,
    /// `delta.content` a number.
    ContentWrongType,
    /// `event: error` with an error object after two tokens, then the end of the body.
    ErrorMidStream,
    /// The whole answer without `[DONE]`, then the end of the body.
    NoDoneThenClose,
    /// `[DONE]` and another chunk after it in the same write.
    DataAfterDone,
    /// Only the role chunk, then the end of the body.
    RoleChunkThenClose,
    /// 200, `text/event-stream`, `Content-Length: 0`.
    Empty200,
    /// `: keep-alive` comments every 200 ms until the client goes away.
    CommentsUntilTimeout,
    /// 200 with `text/html`.
    HtmlContentType,
    /// The whole stream with `\r\n` line ends (legal SSE).
    CrlfLineEnds,
    /// The whole stream one byte per write and per HTTP chunk (legal).
    OneByteWrites,
    /// One chunk's data line is 2 MB long (a padding field; under rigbench's 16 MiB bound).
    Line2Mb,
    /// Bytes 0xFF 0xFE inside a chunk's content.
    InvalidUtf8,
    /// A raw NUL byte inside a chunk's content string.
    NulByte,
    /// `usage.completion_tokens` = this JSON text (raw, so `NaN` can be sent).
    Usage(&'static str),
    /// `finish_reason: "banana"`.
    FinishReasonUnknown,
    /// The single choice carries `index: 3`.
    ChoiceIndexNonZero,
    /// The connection reset (SO_LINGER 0) before any byte of an answer.
    ResetBeforeStatus,
    /// A status line and one header, then nothing.
    HeadersNeverFinished,
    /// Nothing at all until the client goes away.
    StallBeforeFirstByte,
    /// Headers, the role chunk and one token, then nothing.
    StallAfterFirstToken,
    /// The whole stream in 16-byte pieces over about 0.7 s (under the 2 s timeout).
    SlowDrip,
    /// `Content-Length: 100000`, three chunks, then the connection closed.
    ContentLengthShort,
    /// One valid HTTP chunk, then a chunk-size line that is not hex.
    BadChunked,
    /// `HTTP/1.0 200` without a length, the whole stream, then the close (legal framing).
    Http10NoLength,
    /// 307 to the same path, for ever.
    RedirectToSelf,
}

struct Case {
    name: &'static str,
    mode: Mode,
    expect: Expect,
}

const fn case(name: &'static str, mode: Mode, expect: Expect) -> Case {
    Case { name, mode, expect }
}

use ErrBody::*;
use Expect::*;
use Mode::*;

/// The 48 modes.
const CASES: &[Case] = &[
    // HTTP statuses on the generation route, with and without a JSON error body.
    case(
        "http_400_openai_json",
        Status(400, OpenAi("max_tokens is too large for this model")),
        Fails("http 400 bad request: max_tokens is too large for this model"),
    ),
    case(
        "http_401_plain_text",
        Status(401, Text("Unauthorized")),
        Fails("http 401 unauthorized: unauthorized (the engine wants an api key"),
    ),
    case(
        "http_403_openai_json",
        Status(403, OpenAi("key lacks the scope generate")),
        Fails("http 403 forbidden: key lacks the scope generate (the engine wants an api key"),
    ),
    case(
        "http_404_plain_text",
        Status(404, Text("Not Found")),
        Fails("http 404 not found: not found"),
    ),
    case(
        "http_408_openai_json",
        Status(408, OpenAi("request queued too long")),
        Fails("http 408 request timeout: request queued too long"),
    ),
    case(
        "http_413_plain_text",
        Status(413, Text("Request Entity Too Large")),
        Fails("http 413 payload too large: request entity too large"),
    ),
    case(
        "http_422_fastapi_detail_json",
        Status(422, FastApiDetail),
        Fails("http 422 unprocessable entity: {\"detail\""),
    ),
    case(
        "http_429_plain_text",
        Status(429, Text("rate limited, retry later")),
        Fails("http 429 too many requests: rate limited"),
    ),
    case(
        "http_500_openai_json",
        Status(500, OpenAi("CUDA error: an illegal memory access")),
        Fails("http 500 internal server error: cuda error: an illegal memory access"),
    ),
    case(
        "http_500_empty_body",
        Status(500, Empty),
        Fails("http 500 internal server error"),
    ),
    case(
        "http_502_html_body",
        Status(502, Html),
        Fails("http 502 bad gateway: <html>"),
    ),
    case(
        "http_503_openai_json",
        Status(503, OpenAi("engine is loading the model")),
        Fails("http 503 service unavailable: engine is loading the model"),
    ),
    case(
        "http_504_empty_body",
        Status(504, Empty),
        Fails("http 504 gateway timeout: (the engine sent no body)"),
    ),
    case(
        "http_500_1gib_body",
        HugeErrorBody,
        Fails("http 500 internal server error: xxxx"),
    ),
    // Answers that are not the stream asked for.
    case(
        "json_error_object_with_200",
        JsonError200,
        Fails("expected a stream (text/event-stream), got content type 'application/json'"),
    ),
    case(
        "content_type_text_html",
        HtmlContentType,
        Fails("got content type 'text/html"),
    ),
    case(
        "empty_200_body",
        Empty200,
        Fails("stream ended before [done] after 0 chunks"),
    ),
    // SSE and chunk faults.
    case("sse_data_not_json", DataNotJson, Fails("malformed sse data (not json")),
    case("chunk_without_choices", NoChoices, Fails("but no chunk carried a choice")),
    case(
        "choices_not_an_array",
        ChoicesNotArray,
        Fails("`choices` is not an array"),
    ),
    case("choices_always_empty", ChoicesEmpty, Fails("but no chunk carried a choice")),
    case("delta_content_a_number", ContentWrongType, Fails("`choices[0].delta.content` is a number, not a string")),
    case(
        "error_event_mid_stream",
        ErrorMidStream,
        Fails("engine error in stream: cuda out of memory"),
    ),
    case(
        "no_done_then_close",
        NoDoneThenClose,
        Fails("stream ended before [done]"),
    ),
    case("data_after_done", DataAfterDone, Fails("data after [done]")),
    case(
        "role_chunk_then_close",
        RoleChunkThenClose,
        Fails("stream ended before [done] after 1 chunks"),
    ),
    case(
        "keepalive_comments_until_timeout",
        CommentsUntilTimeout,
        Fails("timed out after 2 s: http 200 headers arrived, then no sse data"),
    ),
    case("crlf_line_endings", CrlfLineEnds, Works),
    case("event_split_into_one_byte_writes", OneByteWrites, Works),
    case("single_2mb_line", Line2Mb, Works),
    case("invalid_utf8_in_content", InvalidUtf8, Fails("not utf-8")),
    case("nul_byte_in_content", NulByte, Fails("malformed sse data (not json")),
    case(
        "usage_completion_tokens_above_max",
        Usage("7"),
        Fails("impossible token count: the engine reported usage.completion_tokens = 7 for max_tokens 6"),
    ),
    case(
        "usage_completion_tokens_negative",
        Usage("-6"),
        Fails("usage.completion_tokens = "),
    ),
    case(
        "usage_completion_tokens_nan",
        Usage("NaN"),
        Fails("malformed sse data (not json"),
    ),
    case(
        "usage_completion_tokens_string",
        Usage("\"6\""),
        Fails("usage.completion_tokens = "),
    ),
    case(
        "usage_completion_tokens_u64_max",
        Usage("18446744073709551615"),
        Fails("usage.completion_tokens = 18446744073709551615 for max_tokens 6"),
    ),
    case("finish_reason_unknown", FinishReasonUnknown, Works),
    case("choice_index_not_zero", ChoiceIndexNonZero, Works),
    // Transport faults.
    case(
        "reset_before_status_line",
        ResetBeforeStatus,
        Fails("connection reset by peer"),
    ),
    case(
        "headers_never_finished",
        HeadersNeverFinished,
        Fails("timed out after 2 s: no response (status line and headers) had arrived"),
    ),
    case(
        "stall_before_first_byte",
        StallBeforeFirstByte,
        Fails("timed out after 2 s: no response (status line and headers) had arrived"),
    ),
    case(
        "stall_after_first_token",
        StallAfterFirstToken,
        Fails("timed out after 2 s: 2 chunks had arrived, 1 token-bearing"),
    ),
    case("slow_drip_under_timeout", SlowDrip, Works),
    case(
        "content_length_longer_than_body",
        ContentLengthShort,
        Fails("stream broke after"),
    ),
    case("invalid_chunked_encoding", BadChunked, Fails("stream broke after")),
    case("http_1_0_without_length", Http10NoLength, Works),
    case(
        "redirect_to_itself",
        RedirectToSelf,
        Fails("the engine's redirects: error following redirect"),
    ),
];

// ---------------------------------------------------------------------------------------------
// The mock engine.

/// What the mock saw, per session.
#[derive(Default)]
struct Stats {
    /// Streamed generation requests answered with the fault.
    streams: AtomicUsize,
    /// Most bytes of one answer body written (the 1 GiB body).
    max_body_written: AtomicU64,
}

struct Request {
    path: String,
    body: Value,
}

/// The mock's token count of a text: its bytes (as tests/e2e_faults.rs counts).
fn count(text: &str) -> usize {
    text.len()
}

/// The user text of a generation request (chat or completions).
fn prompt_of(body: &Value) -> &str {
    body.pointer("/messages/0/content")
        .or_else(|| body.get("prompt"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

async fn read_request(s: &mut TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 16 << 10];
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 || buf.len() > 1 << 20 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let path = lines.next()?.split(' ').nth(1)?.to_string();
    let len = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&tmp[..n]);
    }
    Some(Request {
        path,
        body: serde_json::from_slice(&body[..len]).unwrap_or(Value::Null),
    })
}

/// A whole answer with a length; the connection is closed after it.
async fn respond(s: &mut TcpStream, status: &str, ctype: &str, body: &[u8]) {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes()).await;
    let _ = s.write_all(body).await;
    let _ = s.flush().await;
}

async fn respond_json(s: &mut TcpStream, v: &Value) {
    respond(s, "200 OK", "application/json", v.to_string().as_bytes()).await;
}

/// Wait until the client closes its side (or `STALL_CAP`), reading and dropping what it sends.
async fn wait_client_gone(s: &mut TcpStream) {
    let _ = tokio::time::timeout(STALL_CAP, async {
        let mut b = [0u8; 256];
        while let Ok(n) = s.read(&mut b).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

const SSE_HEAD: &str = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";

/// One HTTP chunk in one write; `Err` once the client is gone.
async fn http_chunk(s: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    let mut b = format!("{:x}\r\n", data.len()).into_bytes();
    b.extend_from_slice(data);
    b.extend_from_slice(b"\r\n");
    s.write_all(&b).await?;
    s.flush().await
}

/// A chunked SSE answer: `pieces` as one HTTP chunk each, `gap` apart, then the last chunk.
async fn sse(s: &mut TcpStream, pieces: &[Vec<u8>], gap: Duration) {
    if s.write_all(SSE_HEAD.as_bytes()).await.is_err() {
        return;
    }
    for p in pieces {
        if http_chunk(s, p).await.is_err() {
            return;
        }
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
    }
    let _ = s.write_all(b"0\r\n\r\n").await;
    let _ = s.flush().await;
}

/// The text of the i-th token (one byte each, so the mock's count of the output is exact).
fn word(i: usize) -> &'static str {
    ["q", "u", "i", "c", "k", "b", "r", "o", "w", "n"][i % 10]
}

fn ev(v: &Value) -> Vec<u8> {
    format!("data: {v}\n\n").into_bytes()
}

fn role() -> Vec<u8> {
    ev(
        &json!({"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}),
    )
}

fn token_at(i: usize, index: u64) -> Vec<u8> {
    ev(
        &json!({"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": index, "delta": {"content": word(i)}, "finish_reason": null}]}),
    )
}

fn token(i: usize) -> Vec<u8> {
    token_at(i, 0)
}

fn finish(reason: &str) -> Vec<u8> {
    ev(
        &json!({"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}),
    )
}

/// The usage chunk, with `completion_tokens` as raw JSON text.
fn usage_raw(prompt: usize, completion: &str) -> Vec<u8> {
    format!(
        "data: {{\"id\": \"c1\", \"object\": \"chat.completion.chunk\", \"choices\": [], \"usage\": {{\"prompt_tokens\": {prompt}, \"completion_tokens\": {completion}}}}}\n\n"
    )
    .into_bytes()
}

fn done() -> Vec<u8> {
    b"data: [DONE]\n\n".to_vec()
}

/// A correct stream of `n` tokens: role, tokens, finish, usage, `[DONE]`.
fn normal(n: usize, prompt: usize) -> Vec<Vec<u8>> {
    let mut v = vec![role()];
    v.extend((0..n).map(token));
    v.push(finish("length"));
    v.push(usage_raw(prompt, &n.to_string()));
    v.push(done());
    v
}

/// `normal` with the usage chunk's `completion_tokens` replaced.
fn with_usage(n: usize, prompt: usize, completion: &str) -> Vec<Vec<u8>> {
    let mut v = normal(n, prompt);
    let k = v.len() - 2;
    v[k] = usage_raw(prompt, completion);
    v
}

async fn status(s: &mut TcpStream, code: u16, body: ErrBody) {
    let phrase = match code {
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    };
    let line = format!("{code} {phrase}");
    let (ctype, text) = match body {
        OpenAi(m) => (
            "application/json",
            json!({"object": "error", "error": {"message": m, "type": "EngineError", "code": code}})
                .to_string(),
        ),
        FastApiDetail => (
            "application/json",
            json!({"detail": [{"loc": ["body", "max_tokens"], "msg": "Input should be greater than 0", "type": "greater_than"}]})
                .to_string(),
        ),
        Text(t) => ("text/plain; charset=utf-8", t.to_string()),
        Html => (
            "text/html",
            "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body><center><h1>502 Bad Gateway</h1></center><hr><center>nginx</center></body>\r\n</html>\r\n".to_string(),
        ),
        Empty => ("text/plain", String::new()),
    };
    respond(s, &line, ctype, text.as_bytes()).await;
}

/// Answer one streamed generation request the mode's way.
async fn fault(s: &mut TcpStream, mode: Mode, req: &Request, stats: &Stats) {
    stats.streams.fetch_add(1, Ordering::SeqCst);
    let n = req.body["max_tokens"]
        .as_u64()
        .map_or(OUTPUT_TOKENS, |m| m as usize);
    let p = count(prompt_of(&req.body));
    let zero = Duration::ZERO;
    match mode {
        Status(code, body) => status(s, code, body).await,
        HugeErrorBody => {
            const GIB: u64 = 1 << 30;
            let head = format!("HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Length: {GIB}\r\nConnection: close\r\n\r\n");
            if s.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let block = vec![b'x'; 64 << 10];
            let mut sent = 0u64;
            while sent < GIB {
                if s.write_all(&block).await.is_err() {
                    break;
                }
                sent += block.len() as u64;
                stats.max_body_written.fetch_max(sent, Ordering::SeqCst);
            }
        }
        JsonError200 => {
            respond_json(
                s,
                &json!({"object": "error", "error": {"message": "The model `mock` does not exist.", "type": "NotFoundError", "code": 404}}),
            )
            .await
        }
        DataNotJson => {
            let mut v = normal(n, p);
            v.insert(2, b"data: {\"choices\": [{\"delta\": oops this is not JSON\n\n".to_vec());
            sse(s, &v, zero).await
        }
        NoChoices => {
            let mut v: Vec<Vec<u8>> = (0..n)
                .map(|i| {
                    ev(&json!({"id": "c1", "object": "chat.completion.chunk", "delta": {"content": word(i)}}))
                })
                .collect();
            v.push(usage_raw(p, &n.to_string()));
            v.push(done());
            sse(s, &v, zero).await
        }
        ChoicesNotArray => {
            let v = vec![
                role(),
                ev(&json!({"id": "c1", "choices": {"index": 0, "delta": {"content": "q"}}})),
                done(),
            ];
            sse(s, &v, zero).await
        }
        ChoicesEmpty => {
            let mut v: Vec<Vec<u8>> = (0..n)
                .map(|_| ev(&json!({"id": "c1", "object": "chat.completion.chunk", "choices": []})))
                .collect();
            v.push(usage_raw(p, &n.to_string()));
            v.push(done());
            sse(s, &v, zero).await
        }
        ContentWrongType => {
            let mut v = vec![role()];
            v.extend((0..n).map(|i| {
                ev(&json!({"id": "c1", "choices": [{"index": 0, "delta": {"content": 100 + i}, "finish_reason": null}]}))
            }));
            v.push(finish("length"));
            v.push(usage_raw(p, &n.to_string()));
            v.push(done());
            sse(s, &v, zero).await
        }
        ErrorMidStream => {
            let v = vec![
                role(),
                token(0),
                token(1),
                b"event: error\ndata: {\"error\": {\"message\": \"CUDA out of memory. Tried to allocate 2.00 GiB\", \"type\": \"InternalServerError\", \"code\": 500}}\n\n".to_vec(),
            ];
            sse(s, &v, zero).await
        }
        NoDoneThenClose => {
            let mut v = normal(n, p);
            v.pop();
            sse(s, &v, zero).await
        }
        DataAfterDone => {
            let mut v = normal(n, p);
            let last = v.len() - 1;
            v[last].extend_from_slice(&token(0));
            sse(s, &v, zero).await
        }
        RoleChunkThenClose => sse(s, &[role()], zero).await,
        Empty200 => respond(s, "200 OK", "text/event-stream", b"").await,
        CommentsUntilTimeout => {
            if s.write_all(SSE_HEAD.as_bytes()).await.is_err() {
                return;
            }
            let t = Instant::now();
            while t.elapsed() < STALL_CAP {
                if http_chunk(s, b": keep-alive\n\n").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        HtmlContentType => {
            respond(
                s,
                "200 OK",
                "text/html; charset=utf-8",
                b"<!doctype html><html><body><h1>Welcome to the model gateway</h1></body></html>",
            )
            .await
        }
        CrlfLineEnds => {
            let v: Vec<Vec<u8>> = normal(n, p)
                .into_iter()
                .map(|e| String::from_utf8(e).unwrap().replace('\n', "\r\n").into_bytes())
                .collect();
            sse(s, &v, zero).await
        }
        OneByteWrites => {
            let _ = s.set_nodelay(true);
            if s.write_all(SSE_HEAD.as_bytes()).await.is_err() {
                return;
            }
            let all: Vec<u8> = normal(n, p).concat();
            // Each byte its own HTTP chunk and its own write; a pause after each byte of the
            // first two events so that they also arrive in separate TCP segments.
            let first_two = role().len() + token(0).len();
            for (i, b) in all.iter().enumerate() {
                if http_chunk(s, std::slice::from_ref(b)).await.is_err() {
                    return;
                }
                if i < first_two {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                } else {
                    tokio::task::yield_now().await;
                }
            }
            let _ = s.write_all(b"0\r\n\r\n").await;
        }
        Line2Mb => {
            let mut v = normal(n, p);
            let pad = "p".repeat(2 << 20);
            v[2] = ev(
                &json!({"id": "c1", "choices": [{"index": 0, "delta": {"content": word(1)}, "finish_reason": null}], "padding": pad}),
            );
            sse(s, &v, zero).await
        }
        InvalidUtf8 => {
            let mut v = normal(n, p);
            v.insert(
                2,
                b"data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"x\xff\xfey\"}}]}\n\n"
                    .to_vec(),
            );
            sse(s, &v, zero).await
        }
        NulByte => {
            let mut v = normal(n, p);
            v.insert(
                2,
                b"data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"x\x00y\"}}]}\n\n"
                    .to_vec(),
            );
            sse(s, &v, zero).await
        }
        Usage(raw) => sse(s, &with_usage(n, p, raw), zero).await,
        FinishReasonUnknown => {
            let mut v = normal(n, p);
            let k = v.len() - 3;
            v[k] = finish("banana");
            sse(s, &v, zero).await
        }
        ChoiceIndexNonZero => {
            let mut v = vec![role()];
            v.extend((0..n).map(|i| token_at(i, 3)));
            v.push(finish("length"));
            v.push(usage_raw(p, &n.to_string()));
            v.push(done());
            sse(s, &v, zero).await
        }
        ResetBeforeStatus => {
            let _ = s.set_zero_linger();
        }
        HeadersNeverFinished => {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
                .await;
            let _ = s.flush().await;
            wait_client_gone(s).await;
        }
        StallBeforeFirstByte => wait_client_gone(s).await,
        StallAfterFirstToken => {
            if s.write_all(SSE_HEAD.as_bytes()).await.is_err() {
                return;
            }
            if http_chunk(s, &[role(), token(0)].concat()).await.is_err() {
                return;
            }
            wait_client_gone(s).await;
        }
        SlowDrip => {
            let all: Vec<u8> = normal(n, p).concat();
            let pieces: Vec<Vec<u8>> = all.chunks(16).map(<[u8]>::to_vec).collect();
            let gap = Duration::from_millis(700) / pieces.len() as u32;
            sse(s, &pieces, gap).await
        }
        ContentLengthShort => {
            let mut b = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n".to_vec();
            b.extend_from_slice(&[role(), token(0), token(1)].concat());
            let _ = s.write_all(&b).await;
            let _ = s.flush().await;
        }
        BadChunked => {
            if s.write_all(SSE_HEAD.as_bytes()).await.is_err() {
                return;
            }
            if http_chunk(s, &role()).await.is_err() {
                return;
            }
            let _ = s.write_all(b"zz;\r\nnot a chunk\r\n").await;
            let _ = s.flush().await;
        }
        Http10NoLength => {
            let mut b = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n".to_vec();
            b.extend_from_slice(&normal(n, p).concat());
            let _ = s.write_all(&b).await;
            let _ = s.flush().await;
        }
        RedirectToSelf => {
            let head = format!(
                "HTTP/1.1 307 Temporary Redirect\r\nLocation: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                req.path
            );
            let _ = s.write_all(head.as_bytes()).await;
            let _ = s.flush().await;
        }
    }
}

/// One connection, one request (every answer closes the connection).
async fn connection(mut s: TcpStream, mode: Mode, stats: Arc<Stats>) {
    let Some(req) = read_request(&mut s).await else {
        return;
    };
    match req.path.as_str() {
        "/health" => respond(&mut s, "200 OK", "text/plain", b"ok").await,
        "/v1/models" => {
            respond_json(
                &mut s,
                &json!({"object": "list", "data": [{"id": "mock", "object": "model", "owned_by": "tests"}]}),
            )
            .await
        }
        "/tokenize" => {
            let text = req
                .body
                .get("prompt")
                .or_else(|| req.body.get("content"))
                .and_then(Value::as_str)
                .unwrap_or("");
            respond_json(
                &mut s,
                &json!({"count": count(text), "max_model_len": 4096}),
            )
            .await
        }
        "/v1/chat/completions" | "/v1/completions" if req.body["stream"] == json!(true) => {
            fault(&mut s, mode, &req, &stats).await
        }
        "/v1/chat/completions" | "/v1/completions" => {
            // The session's prompt-overhead probe: a plain answer, not part of the fault.
            let p = count(prompt_of(&req.body));
            respond_json(
                &mut s,
                &json!({"id": "p", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "q"}, "finish_reason": "length"}], "usage": {"prompt_tokens": p, "completion_tokens": 1}}),
            )
            .await
        }
        _ => {
            respond(
                &mut s,
                "404 Not Found",
                "application/json",
                br#"{"detail":"Not Found"}"#,
            )
            .await
        }
    }
}

async fn start_mock(mode: Mode, stats: Arc<Stats>) -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(connection(s, mode, stats.clone()));
        }
    });
    (format!("http://{addr}"), server)
}

// ---------------------------------------------------------------------------------------------
// Sessions and verdicts.

fn suite() -> Suite {
    let text = format!(
        "name = 'hostile-modes'\n[workload]\nkind = 'fixed'\ninput_tokens = 16\noutput_tokens = {OUTPUT_TOKENS}\nignore_eos = true\n[load]\nrequests = {REQUESTS}\nwarmup = 0\nconcurrency = [2]\n[sampling]\nthinking = false\n"
    );
    Suite::from_toml(&text, Path::new("hostile-modes.toml")).unwrap()
}

/// How a session ended.
enum Ended {
    /// `run_session` returned results (rendered and serialized without a panic).
    Results(Box<E2eResults>),
    /// `run_session` returned an error.
    Error(String),
    /// Something in rigbench panicked.
    Panic(String),
    /// Not over within `SESSION_BOUND`.
    Hang,
}

async fn run_mode(mode: Mode) -> (Ended, Arc<Stats>, Duration) {
    let stats = Arc::new(Stats::default());
    let (url, server) = start_mock(mode, stats.clone()).await;
    let mut o = E2eOptions::with_suite(suite());
    o.engine = EngineChoice::Url { url };
    o.progress = false;
    o.handle_ctrl_c = false;
    o.metrics_interval = Duration::from_millis(50);
    o.request_timeout = REQUEST_TIMEOUT;
    let t = Instant::now();
    // run_session's future is not `Send` (it holds a watch guard across an await), so each
    // session runs on a thread of its own with its own runtime, as `rigbench report` runs one
    // (`run_blocking`): a panic ends that thread, not the test; a hang is seen from here.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let r = rt.block_on(async {
            tokio::time::timeout(
                SESSION_BOUND,
                run_session(&o, StopSignal::new(), &mut |_| {}),
            )
            .await
        });
        if let Ok(Ok(r)) = &r {
            // What a report does with the results must not panic either.
            assert!(!rigbench::e2e::render_markdown(r).is_empty());
            serde_json::to_string(r).expect("the results serialize");
        }
        let _ = tx.send(r);
        rt.shutdown_background();
    });
    let ended = match tokio::time::timeout(SESSION_BOUND + Duration::from_secs(10), rx).await {
        // Not even the session's own timeout fired: the thread is left behind.
        Err(_) | Ok(Ok(Err(_))) => Ended::Hang,
        Ok(Err(_)) => {
            let msg = match thread.join() {
                Err(p) => p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a panic without a message".into()),
                Ok(()) => "the session thread ended without a result".into(),
            };
            Ended::Panic(msg)
        }
        Ok(Ok(Ok(Err(e)))) => Ended::Error(format!("{e:#}")),
        Ok(Ok(Ok(Ok(r)))) => Ended::Results(Box::new(r)),
    };
    let took = t.elapsed();
    server.abort();
    (ended, stats, took)
}

/// Flags of a completed request that say its output is not what was asked (all 6 tokens of a
/// `Works` mode arrived, so none of them is true there).
const OUTPUT_PROBLEMS: [&str; 4] = ["empty", "truncated", "degenerate", "no text"];

fn short(s: &str, n: usize) -> String {
    let one_line = s.replace('\n', "\\n");
    if one_line.chars().count() <= n {
        one_line
    } else {
        format!("{}…", one_line.chars().take(n).collect::<String>())
    }
}

/// The observed outcome in words, and what is wrong with it for `case` (empty: as expected).
fn judge(case: &Case, ended: &Ended, stats: &Stats) -> (String, Vec<String>) {
    let mut bad = Vec::new();
    let r = match ended {
        Ended::Results(r) => r,
        Ended::Error(e) => {
            return (
                format!("session error: {}", short(e, 110)),
                vec![format!(
                    "run_session returned an error, no per-request records: {e}"
                )],
            )
        }
        Ended::Panic(m) => {
            return (
                format!("PANIC: {}", short(m, 110)),
                vec![format!("panic: {m}")],
            )
        }
        Ended::Hang => {
            return (
                "HANG".into(),
                vec![format!("the session did not end within {SESSION_BOUND:?}")],
            )
        }
    };
    let streams = stats.streams.load(Ordering::SeqCst);
    if streams < REQUESTS {
        bad.push(format!(
            "the mock answered {streams} streamed requests, fewer than the {REQUESTS} sent: the fault was not exercised"
        ));
    }
    if r.runs.len() != 1 {
        bad.push(format!(
            "{} runs (failure: {:?}, skipped: {:?})",
            r.runs.len(),
            r.failure,
            r.skipped
        ));
        return (format!("{} runs: {:?}", r.runs.len(), r.failure), bad);
    }
    let run = &r.runs[0];
    let reqs = &run.requests;
    if reqs.len() != REQUESTS {
        bad.push(format!("{} request records, not {REQUESTS}", reqs.len()));
    }
    // Never a throughput figure for an invalid run, whatever the mode.
    if !run.validity.valid && (run.throughput.is_some() || run.presented_throughput().is_some()) {
        bad.push("an invalid run carries a presented throughput".into());
    }
    for q in reqs {
        if let Some(e) = &q.error {
            if e.len() > 4096 {
                bad.push(format!(
                    "request {}: a {}-byte reason (unbounded engine text)",
                    q.index,
                    e.len()
                ));
            }
        }
    }
    let ok = reqs.iter().filter(|q| q.ok).count();
    let first_err = reqs.iter().find_map(|q| q.error.as_deref()).unwrap_or("");
    let observed = match case.expect {
        Works => {
            let tokens: Vec<String> = reqs
                .iter()
                .map(|q| q.output_tokens.map_or("-".into(), |n| n.to_string()))
                .collect();
            let flags: Vec<&String> = reqs.iter().flat_map(|q| q.flags.iter()).collect();
            let problem_flags: Vec<&&String> = flags
                .iter()
                .filter(|f| OUTPUT_PROBLEMS.iter().any(|p| f.starts_with(p)))
                .collect();
            for q in reqs {
                if !q.ok {
                    bad.push(format!(
                        "request {} failed: {}",
                        q.index,
                        q.error.as_deref().unwrap_or("(no reason)")
                    ));
                } else if q.output_tokens != Some(OUTPUT_TOKENS as u64) {
                    bad.push(format!(
                        "request {}: {:?} output tokens, not {OUTPUT_TOKENS}",
                        q.index, q.output_tokens
                    ));
                }
            }
            if let Some(f) = problem_flags.first() {
                bad.push(format!(
                    "{} output problem flag(s), e.g. '{f}'",
                    problem_flags.len()
                ));
            }
            // The run may carry notes, or even a reason that names something odd but harmless
            // (an unknown finish_reason); it must not call complete outputs failed, empty,
            // truncated or shorter than asked.
            for reason in &run.validity.reasons {
                let l = reason.to_lowercase();
                if [
                    "failed",
                    "empty",
                    "truncated",
                    "shorter",
                    "degenerate",
                    "no visible text",
                ]
                .iter()
                .any(|w| l.contains(w))
                {
                    bad.push(format!("the run is judged invalid for: {reason}"));
                }
            }
            let mut s = format!("{ok}/{} ok, tokens [{}]", reqs.len(), tokens.join(","));
            if let Some(f) = problem_flags.first() {
                s.push_str(&format!("; flag '{}'", short(f, 70)));
            } else if !first_err.is_empty() {
                s.push_str(&format!("; '{}'", short(first_err, 80)));
            }
            s
        }
        Fails(needle) => {
            for q in reqs {
                let e = q.error.as_deref().unwrap_or("");
                if q.ok {
                    let flags = q.flags.join("; ");
                    bad.push(format!(
                        "request {} recorded ok ({:?} tokens, flags: [{flags}]); expected failed with '{needle}'",
                        q.index, q.output_tokens
                    ));
                } else if e.trim().is_empty() {
                    bad.push(format!("request {} failed without a reason", q.index));
                } else if !e.to_lowercase().contains(needle) {
                    bad.push(format!(
                        "request {}: reason '{}' lacks '{needle}'",
                        q.index,
                        short(e, 300)
                    ));
                }
            }
            if run.validity.valid || run.presented_throughput().is_some() {
                bad.push("the run is presented as valid throughput".into());
            }
            if ok < reqs.len()
                && !run
                    .validity
                    .reasons
                    .iter()
                    .any(|x| x.contains("requests failed"))
            {
                bad.push(format!(
                    "the run's reasons do not count the failed requests: {:?}",
                    run.validity.reasons
                ));
            }
            if ok > 0 {
                let q = reqs.iter().find(|q| q.ok).unwrap();
                let verdict = match run.validity.reasons.first() {
                    Some(reason) => format!("run invalid: '{}'", short(reason, 70)),
                    None if run.validity.valid => "run VALID, throughput presented".to_string(),
                    None => "run invalid for missing conditions only".to_string(),
                };
                format!(
                    "{ok}/{} recorded ok ({:?} tokens from {:?}; flags [{}]); {verdict}",
                    reqs.len(),
                    q.output_tokens,
                    q.token_source,
                    short(&q.flags.join("; "), 70)
                )
            } else {
                format!(
                    "{}/{} failed: '{}'",
                    reqs.len(),
                    reqs.len(),
                    short(first_err, 100)
                )
            }
        }
    };
    let mut observed = observed;
    if let HugeErrorBody = case.mode {
        let sent = stats.max_body_written.load(Ordering::SeqCst);
        observed.push_str(&format!(
            "; the mock wrote at most {:.1} MiB of its 1 GiB body",
            sent as f64 / f64::from(1 << 20)
        ));
        if sent >= 64 << 20 {
            bad.push(format!(
                "the mock wrote {sent} bytes of the 1 GiB error body: not cut off at rigbench's 64 KiB limit"
            ));
        }
    }
    (observed, bad)
}

#[test]
fn the_mode_list_has_48_distinct_names() {
    let mut names: Vec<&str> = CASES.iter().map(|c| c.name).collect();
    assert_eq!(names.len(), 48);
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), 48, "duplicate mode names");
    // Each mode is a distinct behaviour too, not one fault under two names.
    let mut modes: Vec<String> = CASES.iter().map(|c| format!("{:?}", c.mode)).collect();
    modes.sort_unstable();
    modes.dedup();
    assert_eq!(modes.len(), 48, "two names for one mock behaviour");
    for c in CASES {
        if let Fails(n) = c.expect {
            assert!(
                !n.is_empty() && n == n.to_lowercase(),
                "{}: a needle must be non-empty and lowercase",
                c.name
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_eight_broken_engine_modes_none_crashes_and_each_is_reported_with_its_reason() {
    assert_eq!(CASES.len(), 48);
    let t0 = Instant::now();
    let mut rows = Vec::new();
    let mut wrong = Vec::new();
    let mut reasons = Vec::new();
    for c in CASES {
        let (ended, stats, took) = run_mode(c.mode).await;
        let (observed, bad) = judge(c, &ended, &stats);
        let expect = match c.expect {
            Works => "Works".to_string(),
            Fails(n) => format!("Fails({})", short(n, 40)),
        };
        let verdict = if bad.is_empty() { "pass" } else { "FAIL" };
        rows.push(format!(
            "| {} | {expect} | {} | {verdict} | {:.1} s |",
            c.name,
            observed.replace('|', "/"),
            took.as_secs_f64()
        ));
        if !bad.is_empty() {
            wrong.push(format!("{}:\n    {}", c.name, bad.join("\n    ")));
        }
        if let Ended::Results(r) = &ended {
            let first = r
                .runs
                .iter()
                .flat_map(|run| run.requests.iter())
                .find_map(|q| q.error.clone());
            if let Some(e) = first {
                reasons.push(format!("- {}: {}", c.name, short(&e, 400)));
            }
        }
    }
    println!("\n| mode | expectation | observed | verdict | time |\n|---|---|---|---|---|");
    for r in &rows {
        println!("{r}");
    }
    println!("\nThe first recorded reason of each mode, in full:");
    for r in &reasons {
        println!("{r}");
    }
    println!(
        "\n{} of {} modes as expected; {:.1} s in all",
        CASES.len() - wrong.len(),
        CASES.len(),
        t0.elapsed().as_secs_f64()
    );
    assert!(
        wrong.is_empty(),
        "{} of {} modes not as expected:\n{}",
        wrong.len(),
        CASES.len(),
        wrong.join("\n")
    );
}
