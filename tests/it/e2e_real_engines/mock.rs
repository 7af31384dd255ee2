//! The mock engines of these tests (llama.cpp's `llama-server` and vLLM as they answer on the
//! wire, from `tests/fixtures/real/engines/`), the fixtures they read, and the session helpers
//! every test module uses. The imports every module needs are re-exported here.

pub use std::collections::HashMap;
pub use std::path::{Path, PathBuf};
pub use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
pub use std::sync::{Arc, Mutex};
pub use std::time::{Duration, Instant};

pub use serde_json::{json, Value};
pub use tokio::io::{AsyncReadExt, AsyncWriteExt};
pub use tokio::net::{TcpListener, TcpStream};

pub use rigbench::e2e::adapters::EngineKind;
pub use rigbench::e2e::client::{EngineClient, GenRequest, TokenizeForm};
pub use rigbench::e2e::conditions::SpecState;
pub use rigbench::e2e::executor::StopSignal;
pub use rigbench::e2e::launcher::EngineChoice;
pub use rigbench::e2e::metrics::{split_tokens, ChunkSplit, Delivery, TokenSource};
pub use rigbench::e2e::stream::StreamOutcome;
pub use rigbench::e2e::workload::Suite;
pub use rigbench::e2e::{run_session, E2eOptions, E2eResults};

// ---------------------------------------------------------------------------------------------
// Fixtures.

pub fn fixtures() -> PathBuf {
    crate::common::real_fixture("engines");
    crate::common::real_fixture("")
}

pub fn llamacpp_file(prefix: &str) -> PathBuf {
    file_in("engines/llama.cpp-0c1e57098", prefix)
}

pub fn vllm_file(prefix: &str) -> PathBuf {
    file_in("engines/vllm-0.32.0-cpu", prefix)
}

pub fn file_in(dir: &str, prefix: &str) -> PathBuf {
    let d = fixtures().join(dir);
    std::fs::read_dir(&d)
        .unwrap_or_else(|e| panic!("{}: {e}", d.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .unwrap_or_else(|| panic!("no {prefix}* in {}", d.display()))
}

pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

pub fn tokenizer_path() -> PathBuf {
    fixtures().join("models/tiny-qwen3-transformers5/tokenizer.json")
}

/// The `data:` payloads of a capture (one `data:` line per chunk, `[DONE]` included).
pub fn sse_events(p: &Path) -> Vec<String> {
    read(p)
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.trim().to_string())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The mock engine.

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Flavor {
    LlamaCpp,
    Vllm,
}

/// An SSE capture to replay: the events, and how they are written: `(delay before the write,
/// number of events in it)`, in order (the last group takes the rest).
#[derive(Clone)]
pub struct Replay {
    pub events: Vec<String>,
    pub groups: Vec<(Duration, usize)>,
}

#[derive(Clone)]
pub struct Cfg {
    pub flavor: Flavor,
    /// A request on a connection idle longer than this is reset unanswered.
    pub keepalive: Option<Duration>,
    pub replay: Option<Replay>,
    /// Added to `usage.prompt_tokens` of every prompt but the session's probe (whose text
    /// starts `[probe]`): an engine that counts the run's prompts differently.
    pub prompt_delta: i64,
    /// `usage.prompt_tokens` multiplied by this (an engine with another tokenizer).
    pub prompt_scale: f64,
    /// The engine counts whitespace-separated words (not the BPE tokenizer): a served model
    /// whose tokenizer is not the one rigbench was given.
    pub word_tokenizer: bool,
    /// `POST /tokenize` answers `{"tokens": []}` to every body.
    pub tokenize_broken: bool,
    /// `/slots` answer (llama.cpp).
    pub slots: Option<Value>,
    /// `/props` answer (llama.cpp).
    pub props: Option<Value>,
    /// Per-request draft counts in the last chunk's `timings` (llama.cpp speculation).
    pub timings_drafts: Option<(u64, u64)>,
    /// Every generation request's connection is reset before an answer (the engine is fine,
    /// its generation endpoint is not reachable).
    pub generation_resets: bool,
    /// Delay between synthetic token chunks.
    pub token_delay: Duration,
    /// The prefix cache keeps only the last this many prompts (llama.cpp: one per slot, the
    /// slots' caches overwritten by later prompts); `None`: every prompt is kept.
    pub cache_slots: Option<usize>,
    /// A prompt served mostly from the prefix cache gets another greedy output (" u0 u1 …"
    /// instead of " t0 t1 …"): an engine whose cached and uncached prompts are computed
    /// differently. llama.cpp's `cache_prompt: false` (and vLLM's `/reset_prefix_cache`) keep a
    /// prompt out of the cache.
    pub cached_output_differs: bool,
    /// A log file the mock appends llama.cpp's `print_timing` lines to, one block per
    /// generation request (task ids from 1000 up): an engine log that grows during the run.
    pub log_to: Option<PathBuf>,
    /// `/slots` answer once a generation request was served (llama.cpp shows a slot's
    /// speculative parameters as of the last request it served).
    pub slots_after: Option<Value>,
}

impl Cfg {
    pub fn llamacpp() -> Self {
        let slots: Value = serde_json::from_str(&read(&llamacpp_file("04_"))).unwrap();
        Cfg {
            flavor: Flavor::LlamaCpp,
            keepalive: None,
            replay: None,
            prompt_delta: 0,
            prompt_scale: 1.0,
            word_tokenizer: false,
            tokenize_broken: false,
            slots: Some(slots),
            props: Some(json!({
                "build_info": "b1-0c1e57098",
                "total_slots": 4,
                "default_generation_settings": {"n_ctx": 2048, "params": {"speculative.types": "none"}},
                "endpoint_slots": true, "endpoint_metrics": true
            })),
            timings_drafts: None,
            generation_resets: false,
            token_delay: Duration::from_millis(1),
            cache_slots: None,
            cached_output_differs: false,
            log_to: None,
            slots_after: None,
        }
    }

    pub fn vllm() -> Self {
        Cfg {
            flavor: Flavor::Vllm,
            slots: None,
            props: None,
            ..Cfg::llamacpp()
        }
    }
}

#[derive(Default)]
pub struct Counters {
    /// Earlier prompts (token ids), for the prefix cache.
    pub history: Vec<Vec<u32>>,
    /// llama.cpp: prompt tokens processed (not cached), cached.
    pub processed: u64,
    pub cached: u64,
    /// vLLM: queried and hit tokens.
    pub queries: u64,
    pub hits: u64,
    pub drafts: u64,
    pub draft_tokens: u64,
    pub accepted: u64,
}

pub struct Mock {
    pub cfg: Cfg,
    pub tok: tokenizers::Tokenizer,
    pub c: Mutex<Counters>,
    /// Requests reset because they arrived on a connection idle beyond the keep-alive.
    pub stale_resets: AtomicUsize,
    /// Generation requests answered (streaming or not).
    pub generations: AtomicU64,
    /// `POST /tokenize` bodies, by their key (`content`, `prompt`, `messages`).
    pub tokenize_bodies: Mutex<HashMap<String, usize>>,
}

pub const TEMPLATE_HEAD: &str = "<|im_start|>user\n";
pub const TEMPLATE_TAIL: &str = "<|im_end|>\n<|im_start|>assistant\n";

impl Mock {
    pub fn ids(&self, text: &str) -> Vec<u32> {
        if self.cfg.word_tokenizer {
            return text.split_whitespace().map(|_| 7).collect();
        }
        self.tok.encode(text, false).unwrap().get_ids().to_vec()
    }

    /// The prompt as the engine sees it (the fixture model's chat template for chat).
    pub fn prompt_of(&self, body: &Value) -> String {
        match body.pointer("/messages/0/content").and_then(Value::as_str) {
            Some(c) => format!("{TEMPLATE_HEAD}{c}{TEMPLATE_TAIL}"),
            None => body["prompt"].as_str().unwrap_or("").to_string(),
        }
    }

    /// Count a prompt into the cache counters; its prompt tokens as reported.
    /// Reusing the cache only when `use_cache` (llama.cpp's `cache_prompt`); also the tokens
    /// reused and the prompt's own length.
    pub fn admit_cached(&self, prompt: &str, probe: bool, use_cache: bool) -> (u64, u64, u64) {
        let ids = self.ids(prompt);
        let n = ids.len() as u64;
        let mut c = self.c.lock().unwrap();
        let lcp = c
            .history
            .iter()
            .filter(|_| use_cache)
            .map(|h| h.iter().zip(&ids).take_while(|(a, b)| a == b).count() as u64)
            .max()
            .unwrap_or(0)
            .min(n.saturating_sub(1));
        match self.cfg.flavor {
            Flavor::LlamaCpp => {
                c.cached += lcp;
                c.processed += n - lcp;
            }
            Flavor::Vllm => {
                c.queries += n;
                c.hits += lcp / 16 * 16;
            }
        }
        c.history.push(ids);
        if let Some(k) = self.cfg.cache_slots {
            let drop = c.history.len().saturating_sub(k);
            c.history.drain(..drop);
        }
        let delta = if probe { 0 } else { self.cfg.prompt_delta };
        let reported = ((n as f64 * self.cfg.prompt_scale).round() as i64 + delta).max(1) as u64;
        (reported, lcp, n)
    }

    pub fn metrics(&self) -> String {
        let c = self.c.lock().unwrap();
        let set = |text: String, name: &str, v: u64| -> String {
            text.lines()
                .map(|l| {
                    if l.starts_with(name)
                        && (l[name.len()..].starts_with(' ') || l[name.len()..].starts_with('{'))
                    {
                        let cut = l.rfind(' ').unwrap();
                        format!("{} {v}", &l[..cut])
                    } else {
                        l.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")
                + "\n"
        };
        match self.cfg.flavor {
            Flavor::LlamaCpp => {
                let mut t = read(&llamacpp_file("02_"));
                t = set(t, "llamacpp:prompt_tokens_total", c.processed);
                t = set(t, "llamacpp:prompt_tokens_cached_total", c.cached);
                t = set(t, "llamacpp:spec_decode_num_drafts_total", c.drafts);
                t = set(
                    t,
                    "llamacpp:spec_decode_num_draft_tokens_total",
                    c.draft_tokens,
                );
                set(
                    t,
                    "llamacpp:spec_decode_num_accepted_tokens_total",
                    c.accepted,
                )
            }
            Flavor::Vllm => {
                let mut t = read(&vllm_file("03_"));
                t = set(t, "vllm:prefix_cache_queries_total", c.queries);
                set(t, "vllm:prefix_cache_hits_total", c.hits)
            }
        }
    }
}

pub async fn start(cfg: Cfg) -> (String, Arc<Mock>) {
    start_on(cfg, 0).await
}

/// [`start`] on 127.0.0.1:`port` (0: a free one).
pub async fn start_on(cfg: Cfg, port: u16) -> (String, Arc<Mock>) {
    let tok = tokenizers::Tokenizer::from_file(tokenizer_path()).unwrap();
    let mock = Arc::new(Mock {
        cfg,
        tok,
        c: Mutex::new(Counters::default()),
        stale_resets: AtomicUsize::new(0),
        generations: AtomicU64::new(0),
        tokenize_bodies: Mutex::new(HashMap::new()),
    });
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let m = mock.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let m = m.clone();
            tokio::spawn(async move {
                let _ = connection(m, sock).await;
            });
        }
    });
    (format!("http://{addr}"), mock)
}

pub struct Request {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
}

/// Read one request; `None` at the end of the connection.
pub async fn read_request(sock: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Request> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let mut lines = head.lines();
            let mut first = lines.next()?.split_whitespace();
            let method = first.next()?.to_string();
            let path = first.next()?.to_string();
            let len: usize = lines
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let mut tmp = [0u8; 8192];
                let n = sock.read(&mut tmp).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&tmp[..n]);
            }
            let body = buf[end + 4..end + 4 + len].to_vec();
            buf.drain(..end + 4 + len);
            return Some(Request { method, path, body });
        }
        let mut tmp = [0u8; 8192];
        let n = sock.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
}

pub async fn respond(sock: &mut TcpStream, status: u16, body: &Value) -> std::io::Result<()> {
    let text = body.to_string();
    let reason = if status == 200 { "OK" } else { "Error" };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nKeep-Alive: timeout=5, max=100\r\n\r\n",
        text.len()
    );
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(text.as_bytes()).await
}

pub async fn respond_text(sock: &mut TcpStream, text: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n",
        text.len()
    );
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(text.as_bytes()).await
}

/// Write `events` as one chunk of a chunked SSE body.
pub async fn write_events(sock: &mut TcpStream, events: &[String]) -> std::io::Result<()> {
    let data: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    sock.write_all(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes())
        .await?;
    sock.flush().await
}

pub async fn connection(m: Arc<Mock>, mut sock: TcpStream) -> std::io::Result<()> {
    let _ = sock.set_nodelay(true);
    let mut buf = Vec::new();
    let mut idle_since: Option<Instant> = None;
    loop {
        let Some(req) = read_request(&mut sock, &mut buf).await else {
            return Ok(());
        };
        // The server closed this idle connection as the request arrived: reset, no answer.
        if let (Some(limit), Some(t)) = (m.cfg.keepalive, idle_since) {
            if t.elapsed() > limit {
                m.stale_resets.fetch_add(1, Ordering::SeqCst);
                #[allow(deprecated)]
                let _ = sock.set_linger(Some(Duration::ZERO));
                drop(sock);
                return Ok(());
            }
        }
        let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        handle(&m, &mut sock, &req, &body).await?;
        idle_since = Some(Instant::now());
    }
}

pub async fn handle(
    m: &Mock,
    sock: &mut TcpStream,
    req: &Request,
    body: &Value,
) -> std::io::Result<()> {
    let llama = m.cfg.flavor == Flavor::LlamaCpp;
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/health") => respond(sock, 200, &json!({"status": "ok"})).await,
        ("GET", "/v1/models") => {
            let (id, owner) = if llama {
                ("models/tiny-qwen3-f32.gguf", "llamacpp")
            } else {
                ("/models/tiny-qwen3-transformers5", "vllm")
            };
            respond(
                sock,
                200,
                &json!({"object": "list", "data": [{"id": id, "object": "model", "owned_by": owner}]}),
            )
            .await
        }
        ("GET", "/version") if !llama => respond(sock, 200, &json!({"version": "0.32.0"})).await,
        ("GET", "/props") if m.cfg.props.is_some() => {
            respond(sock, 200, m.cfg.props.as_ref().unwrap()).await
        }
        ("GET", "/slots") if m.cfg.slots.is_some() => {
            let served = m.generations.load(Ordering::SeqCst) > 0;
            match (&m.cfg.slots_after, served) {
                (Some(after), true) => respond(sock, 200, after).await,
                _ => respond(sock, 200, m.cfg.slots.as_ref().unwrap()).await,
            }
        }
        ("GET", "/metrics") => respond_text(sock, &m.metrics()).await,
        ("POST", "/reset_prefix_cache") if !llama => {
            m.c.lock().unwrap().history.clear();
            respond(sock, 200, &json!({})).await
        }
        ("POST", "/tokenize") => {
            let key = ["content", "prompt", "messages"]
                .into_iter()
                .find(|k| body.get(k).is_some())
                .unwrap_or("none");
            *m.tokenize_bodies
                .lock()
                .unwrap()
                .entry(key.to_string())
                .or_default() += 1;
            let text = match (m.cfg.flavor, key) {
                (_, _) if m.cfg.tokenize_broken => None,
                (Flavor::LlamaCpp, "content") => body["content"].as_str().map(str::to_string),
                (Flavor::Vllm, "prompt") => body["prompt"].as_str().map(str::to_string),
                (Flavor::Vllm, "messages") => Some(m.prompt_of(body)),
                _ => None,
            };
            let ids = text.map(|t| m.ids(&t)).unwrap_or_default();
            if llama {
                respond(sock, 200, &json!({"tokens": ids})).await
            } else {
                respond(
                    sock,
                    200,
                    &json!({"count": ids.len(), "max_model_len": 2048, "tokens": ids}),
                )
                .await
            }
        }
        ("POST", "/v1/chat/completions") | ("POST", "/v1/completions") => {
            if m.cfg.generation_resets {
                let _ = sock.shutdown().await;
                return Err(std::io::Error::other("reset"));
            }
            let task = 1000 + m.generations.fetch_add(1, Ordering::SeqCst);
            if let Some(p) = &m.cfg.log_to {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new().append(true).open(p)?;
                writeln!(
                    f,
                    "0.20.000.000 I slot print_timing: id  0 | task {task} | prompt eval time =      10.00 ms /    20 tokens (    0.50 ms per token,  2000.00 tokens per second)\n0.20.000.001 I slot print_timing: id  0 | task {task} |        eval time =      10.00 ms /     8 tokens (    1.25 ms per token,   800.00 tokens per second)\n0.20.000.002 I slot print_timing: id  0 | task {task} |       total time =      20.00 ms /    28 tokens"
                )?;
            }
            let prompt = m.prompt_of(body);
            let probe = prompt.contains("[probe]");
            let use_cache = !(llama && body["cache_prompt"] == json!(false));
            let (prompt_tokens, lcp, n) = m.admit_cached(&prompt, probe, use_cache);
            let from_cache = m.cfg.cached_output_differs && lcp * 2 > n;
            if body["stream"] != json!(true) {
                return respond(
                    sock,
                    200,
                    &json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": " t0"}, "finish_reason": "length"}],
                            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": prompt_tokens + 1}}),
                )
                .await;
            }
            sock.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nKeep-Alive: timeout=5, max=100\r\n\r\n",
            )
            .await?;
            let chat = req.path.contains("chat");
            match &m.cfg.replay {
                Some(r) => replay(sock, r, prompt_tokens).await?,
                None => synthetic(m, sock, body, chat, prompt_tokens, from_cache).await?,
            }
            sock.write_all(b"0\r\n\r\n").await
        }
        _ => {
            respond(
                sock,
                404,
                &json!({"error": {"code": 404, "message": "File Not Found"}}),
            )
            .await
        }
    }
}

/// Replay a capture with its usage's prompt tokens set to what this mock counted.
pub async fn replay(sock: &mut TcpStream, r: &Replay, prompt_tokens: u64) -> std::io::Result<()> {
    let events: Vec<String> = r
        .events
        .iter()
        .map(|e| match serde_json::from_str::<Value>(e) {
            Ok(mut v) if v.get("usage").is_some_and(Value::is_object) => {
                let ct = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
                v["usage"]["prompt_tokens"] = json!(prompt_tokens);
                v["usage"]["total_tokens"] = json!(prompt_tokens + ct);
                v.to_string()
            }
            _ => e.clone(),
        })
        .collect();
    let mut i = 0;
    for (k, (delay, n)) in r.groups.iter().enumerate() {
        tokio::time::sleep(*delay).await;
        let end = if k + 1 == r.groups.len() {
            events.len()
        } else {
            (i + n).min(events.len())
        };
        write_events(sock, &events[i..end]).await?;
        i = end;
    }
    Ok(())
}

/// A stream in the engine's own shape: llama.cpp (a role chunk with `content: null`, one token
/// per chunk, usage and `timings` only at the end) or vLLM (usage on every chunk when
/// `continuous_usage_stats` is asked, a usage-only last chunk).
pub async fn synthetic(
    m: &Mock,
    sock: &mut TcpStream,
    body: &Value,
    chat: bool,
    prompt_tokens: u64,
    from_cache: bool,
) -> std::io::Result<()> {
    let letter = if from_cache { 'u' } else { 't' };
    let n = body["max_tokens"].as_u64().unwrap_or(8);
    let continuous = m.cfg.flavor == Flavor::Vllm
        && body
            .pointer("/stream_options/continuous_usage_stats")
            .and_then(Value::as_bool)
            == Some(true);
    let usage = |ct: u64| json!({"prompt_tokens": prompt_tokens, "completion_tokens": ct, "total_tokens": prompt_tokens + ct});
    let chunk = |delta: Value, finish: Option<&str>, ct: Option<u64>| {
        let mut v = if chat {
            json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        } else {
            json!({"object": "text_completion", "choices": [{"index": 0, "text": delta.get("content").and_then(Value::as_str).unwrap_or(""), "finish_reason": finish}]})
        };
        if let Some(ct) = ct {
            v["usage"] = usage(ct);
        }
        v.to_string()
    };
    if chat {
        let role = match m.cfg.flavor {
            Flavor::LlamaCpp => json!({"role": "assistant", "content": null}),
            Flavor::Vllm => json!({"role": "assistant", "content": ""}),
        };
        write_events(sock, &[chunk(role, None, continuous.then_some(0))]).await?;
    }
    for i in 0..n {
        tokio::time::sleep(m.cfg.token_delay).await;
        let finish = (m.cfg.flavor == Flavor::Vllm && i + 1 == n).then_some("length");
        write_events(
            sock,
            &[chunk(
                json!({"content": format!(" {letter}{i}")}),
                finish,
                continuous.then_some(i + 1),
            )],
        )
        .await?;
    }
    let mut tail = Vec::new();
    if m.cfg.flavor == Flavor::LlamaCpp {
        tail.push(chunk(json!({}), Some("length"), None));
    }
    let mut last = json!({"choices": [], "usage": usage(n)});
    if m.cfg.flavor == Flavor::LlamaCpp {
        last["timings"] = json!({"predicted_n": n, "prompt_n": prompt_tokens});
        if let Some((drafted, accepted)) = m.cfg.timings_drafts {
            last["timings"]["draft_n"] = json!(drafted);
            last["timings"]["draft_n_accepted"] = json!(accepted);
            let mut c = m.c.lock().unwrap();
            c.drafts += drafted / 4;
            c.draft_tokens += drafted;
            c.accepted += accepted;
        }
    }
    tail.push(last.to_string());
    tail.push("[DONE]".into());
    write_events(sock, &tail).await
}

// ---------------------------------------------------------------------------------------------
// Sessions.

pub fn suite(workload: &str, load: &str) -> Suite {
    let text = format!(
        "name = 'real'\ndescription = 'mock engines'\n[workload]\n{workload}\n[load]\n{load}\n[sampling]\ntemperature = 0.0\nseed = 0\nthinking = false\n"
    );
    Suite::from_toml(&text, Path::new("real.toml")).unwrap()
}

pub fn fixed(input: u32, output: u32) -> String {
    format!("kind = 'fixed'\napi = 'chat'\ninput_tokens = {input}\noutput_tokens = {output}\nignore_eos = true")
}

pub const CLOSED: &str = "concurrency = [1]\nrequests = 4\nwarmup = 0\ncache = 'cold'";

pub fn options(url: &str, suite: Suite) -> E2eOptions {
    let mut o = E2eOptions::with_suite(suite);
    o.engine = EngineChoice::Url {
        url: url.to_string(),
    };
    o.progress = false;
    o.handle_ctrl_c = false;
    o.metrics_interval = Duration::from_millis(20);
    o.request_timeout = Duration::from_secs(60);
    o
}

/// A loopback port free at the time of the call (for an engine command to listen on), and its
/// base URL.
pub fn free_port() -> (u16, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    (port, format!("http://127.0.0.1:{port}"))
}

pub async fn session(o: &E2eOptions) -> E2eResults {
    run_session(o, StopSignal::new(), &mut |_| {})
        .await
        .expect("session")
}

/// The chat template's tokens around a message, counted with the fixture tokenizer (what the
/// session must measure).
pub fn template_overhead() -> i64 {
    let t = tokenizers::Tokenizer::from_file(tokenizer_path()).unwrap();
    let text = "[probe] Count the tokens of this short message, please.";
    let n = |s: &str| t.encode(s, false).unwrap().len() as i64;
    n(&format!("{TEMPLATE_HEAD}{text}{TEMPLATE_TAIL}")) - n(text)
}
