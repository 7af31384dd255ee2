//! The mock engine: a raw tokio `TcpListener` that answers every streamed generation request
//! with its mode's fault.

use super::*;

/// What the mock saw, per session.
#[derive(Default)]
pub(super) struct Stats {
    /// Streamed generation requests answered with the fault.
    pub(super) streams: AtomicUsize,
    /// Most bytes of one answer body written (the 1 GiB body).
    pub(super) max_body_written: AtomicU64,
}

pub(super) struct Request {
    pub(super) path: String,
    pub(super) body: Value,
}

/// The mock's token count of a text: its bytes (as tests/it/e2e_faults.rs counts).
pub(super) fn count(text: &str) -> usize {
    text.len()
}

/// The user text of a generation request (chat or completions).
pub(super) fn prompt_of(body: &Value) -> &str {
    body.pointer("/messages/0/content")
        .or_else(|| body.get("prompt"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub(super) fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

pub(super) async fn read_request(s: &mut TcpStream) -> Option<Request> {
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
pub(super) async fn respond(s: &mut TcpStream, status: &str, ctype: &str, body: &[u8]) {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes()).await;
    let _ = s.write_all(body).await;
    let _ = s.flush().await;
}

pub(super) async fn respond_json(s: &mut TcpStream, v: &Value) {
    respond(s, "200 OK", "application/json", v.to_string().as_bytes()).await;
}

/// Wait until the client closes its side (or `STALL_CAP`), reading and dropping what it sends.
pub(super) async fn wait_client_gone(s: &mut TcpStream) {
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

pub(super) const SSE_HEAD: &str = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";

/// One HTTP chunk in one write; `Err` once the client is gone.
pub(super) async fn http_chunk(s: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    let mut b = format!("{:x}\r\n", data.len()).into_bytes();
    b.extend_from_slice(data);
    b.extend_from_slice(b"\r\n");
    s.write_all(&b).await?;
    s.flush().await
}

/// A chunked SSE answer: `pieces` as one HTTP chunk each, `gap` apart, then the last chunk.
pub(super) async fn sse(s: &mut TcpStream, pieces: &[Vec<u8>], gap: Duration) {
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
pub(super) fn word(i: usize) -> &'static str {
    ["q", "u", "i", "c", "k", "b", "r", "o", "w", "n"][i % 10]
}

pub(super) fn ev(v: &Value) -> Vec<u8> {
    format!("data: {v}\n\n").into_bytes()
}

pub(super) fn role() -> Vec<u8> {
    ev(
        &json!({"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}),
    )
}

pub(super) fn token_at(i: usize, index: u64) -> Vec<u8> {
    ev(
        &json!({"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": index, "delta": {"content": word(i)}, "finish_reason": null}]}),
    )
}

pub(super) fn token(i: usize) -> Vec<u8> {
    token_at(i, 0)
}

pub(super) fn finish(reason: &str) -> Vec<u8> {
    ev(
        &json!({"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}),
    )
}

/// The usage chunk, with `completion_tokens` as raw JSON text.
pub(super) fn usage_raw(prompt: usize, completion: &str) -> Vec<u8> {
    format!(
        "data: {{\"id\": \"c1\", \"object\": \"chat.completion.chunk\", \"choices\": [], \"usage\": {{\"prompt_tokens\": {prompt}, \"completion_tokens\": {completion}}}}}\n\n"
    )
    .into_bytes()
}

pub(super) fn done() -> Vec<u8> {
    b"data: [DONE]\n\n".to_vec()
}

/// A correct stream of `n` tokens: role, tokens, finish, usage, `[DONE]`.
pub(super) fn normal(n: usize, prompt: usize) -> Vec<Vec<u8>> {
    let mut v = vec![role()];
    v.extend((0..n).map(token));
    v.push(finish("length"));
    v.push(usage_raw(prompt, &n.to_string()));
    v.push(done());
    v
}

/// `normal` with the usage chunk's `completion_tokens` replaced.
pub(super) fn with_usage(n: usize, prompt: usize, completion: &str) -> Vec<Vec<u8>> {
    let mut v = normal(n, prompt);
    let k = v.len() - 2;
    v[k] = usage_raw(prompt, completion);
    v
}

pub(super) async fn status(s: &mut TcpStream, code: u16, body: ErrBody) {
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
pub(super) async fn fault(s: &mut TcpStream, mode: Mode, req: &Request, stats: &Stats) {
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
pub(super) async fn connection(mut s: TcpStream, mode: Mode, stats: Arc<Stats>) {
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

pub(super) async fn start_mock(
    mode: Mode,
    stats: Arc<Stats>,
) -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(connection(s, mode, stats.clone()));
        }
    });
    (format!("http://{addr}"), server)
}
