//! e2e against mocks that answer as the real engines did: llama.cpp's `llama-server`
//! (commit 0c1e57098) and vLLM 0.32 (CPU), from `../shared/fixtures/engines/` (their `/slots`,
//! `/metrics` scrapes, logs and SSE captures; these tests fail when the folder is absent).
//!
//! The mock is a small HTTP/1.1 server on 127.0.0.1:0 written here (not axum) so it can behave
//! as the engines' servers do on the wire:
//! - llama.cpp's `POST /tokenize` takes `{"content"}` and answers vLLM's `{"prompt"}` with
//!   `200 {"tokens": []}`; vLLM's takes `{"prompt"}` or `{"messages"}`;
//! - kept-alive connections: llama-server closes an idle one after 5 s (`Keep-Alive:
//!   timeout=5`). A client that sends on it as it closes gets its request reset with no answer.
//!   The mock does exactly that to a request that arrives on a connection idle longer than its
//!   keep-alive (it does not close idle connections on its own, so the crossing happens every
//!   time rather than by chance);
//! - SSE captures are replayed event by event, with the engine's own grouping (llama-server
//!   writes several events at once under load); the captures hold no arrival times, so the
//!   delays are set here and named as such;
//! - prompt tokens (`usage.prompt_tokens`) are counted with the tiny Qwen3 fixture's real BPE
//!   tokenizer over the fixture's chat template, so the template overhead is real;
//! - prefix-cache counters move as the engines' do: llama.cpp's `prompt_tokens_cached_total` by
//!   the longest common prefix with an earlier prompt, vLLM's `prefix_cache_hits_total` by whole
//!   16-token blocks.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use rigbench::e2e::adapters::EngineKind;
use rigbench::e2e::client::{EngineClient, GenRequest, StreamOutcome, TokenizeForm};
use rigbench::e2e::conditions::SpecState;
use rigbench::e2e::executor::StopSignal;
use rigbench::e2e::launcher::EngineChoice;
use rigbench::e2e::metrics::{split_tokens, ChunkSplit, Delivery, TokenSource};
use rigbench::e2e::workload::Suite;
use rigbench::e2e::{run_session, E2eOptions, E2eResults};

mod common;

// ---------------------------------------------------------------------------------------------
// Fixtures.

fn fixtures() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures");
    assert!(
        p.join("engines").is_dir(),
        "{} is missing: the shared fixtures must be beside the checkout",
        p.display()
    );
    p
}

fn llamacpp_file(prefix: &str) -> PathBuf {
    file_in("engines/llama.cpp-0c1e57098", prefix)
}

fn vllm_file(prefix: &str) -> PathBuf {
    file_in("engines/vllm-0.32.0-cpu", prefix)
}

fn file_in(dir: &str, prefix: &str) -> PathBuf {
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

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn tokenizer_path() -> PathBuf {
    fixtures().join("models/tiny-qwen3-transformers5/tokenizer.json")
}

/// The `data:` payloads of a capture (one `data:` line per chunk, `[DONE]` included).
fn sse_events(p: &Path) -> Vec<String> {
    read(p)
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.trim().to_string())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The mock engine.

#[derive(Clone, Copy, PartialEq, Debug)]
enum Flavor {
    LlamaCpp,
    Vllm,
}

/// An SSE capture to replay: the events, and how they are written: `(delay before the write,
/// number of events in it)`, in order (the last group takes the rest).
#[derive(Clone)]
struct Replay {
    events: Vec<String>,
    groups: Vec<(Duration, usize)>,
}

#[derive(Clone)]
struct Cfg {
    flavor: Flavor,
    /// A request on a connection idle longer than this is reset unanswered.
    keepalive: Option<Duration>,
    replay: Option<Replay>,
    /// Added to `usage.prompt_tokens` of every prompt but the session's probe (whose text
    /// starts `[probe]`): an engine that counts the run's prompts differently.
    prompt_delta: i64,
    /// `usage.prompt_tokens` multiplied by this (an engine with another tokenizer).
    prompt_scale: f64,
    /// The engine counts whitespace-separated words (not the BPE tokenizer): a served model
    /// whose tokenizer is not the one rigbench was given.
    word_tokenizer: bool,
    /// `POST /tokenize` answers `{"tokens": []}` to every body.
    tokenize_broken: bool,
    /// `/slots` answer (llama.cpp).
    slots: Option<Value>,
    /// `/props` answer (llama.cpp).
    props: Option<Value>,
    /// Per-request draft counts in the last chunk's `timings` (llama.cpp speculation).
    timings_drafts: Option<(u64, u64)>,
    /// Every generation request's connection is reset before an answer (the engine is fine,
    /// its generation endpoint is not reachable).
    generation_resets: bool,
    /// Delay between synthetic token chunks.
    token_delay: Duration,
}

impl Cfg {
    fn llamacpp() -> Self {
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
        }
    }

    fn vllm() -> Self {
        Cfg {
            flavor: Flavor::Vllm,
            slots: None,
            props: None,
            ..Cfg::llamacpp()
        }
    }
}

#[derive(Default)]
struct Counters {
    /// Earlier prompts (token ids), for the prefix cache.
    history: Vec<Vec<u32>>,
    /// llama.cpp: prompt tokens processed (not cached), cached.
    processed: u64,
    cached: u64,
    /// vLLM: queried and hit tokens.
    queries: u64,
    hits: u64,
    drafts: u64,
    draft_tokens: u64,
    accepted: u64,
}

struct Mock {
    cfg: Cfg,
    tok: tokenizers::Tokenizer,
    c: Mutex<Counters>,
    /// Requests reset because they arrived on a connection idle beyond the keep-alive.
    stale_resets: AtomicUsize,
    /// Generation requests answered (streaming or not).
    generations: AtomicU64,
    /// `POST /tokenize` bodies, by their key (`content`, `prompt`, `messages`).
    tokenize_bodies: Mutex<HashMap<String, usize>>,
}

const TEMPLATE_HEAD: &str = "<|im_start|>user\n";
const TEMPLATE_TAIL: &str = "<|im_end|>\n<|im_start|>assistant\n";

impl Mock {
    fn ids(&self, text: &str) -> Vec<u32> {
        if self.cfg.word_tokenizer {
            return text.split_whitespace().map(|_| 7).collect();
        }
        self.tok.encode(text, false).unwrap().get_ids().to_vec()
    }

    /// The prompt as the engine sees it (the fixture model's chat template for chat).
    fn prompt_of(&self, body: &Value) -> String {
        match body.pointer("/messages/0/content").and_then(Value::as_str) {
            Some(c) => format!("{TEMPLATE_HEAD}{c}{TEMPLATE_TAIL}"),
            None => body["prompt"].as_str().unwrap_or("").to_string(),
        }
    }

    /// Count a prompt into the cache counters; its prompt tokens as reported.
    fn admit(&self, prompt: &str, probe: bool) -> u64 {
        let ids = self.ids(prompt);
        let n = ids.len() as u64;
        let mut c = self.c.lock().unwrap();
        let lcp = c
            .history
            .iter()
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
        let delta = if probe { 0 } else { self.cfg.prompt_delta };
        ((n as f64 * self.cfg.prompt_scale).round() as i64 + delta).max(1) as u64
    }

    fn metrics(&self) -> String {
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

async fn start(cfg: Cfg) -> (String, Arc<Mock>) {
    start_on(cfg, 0).await
}

/// [`start`] on 127.0.0.1:`port` (0: a free one).
async fn start_on(cfg: Cfg, port: u16) -> (String, Arc<Mock>) {
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

struct Request {
    method: String,
    path: String,
    body: Vec<u8>,
}

/// Read one request; `None` at the end of the connection.
async fn read_request(sock: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Request> {
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

async fn respond(sock: &mut TcpStream, status: u16, body: &Value) -> std::io::Result<()> {
    let text = body.to_string();
    let reason = if status == 200 { "OK" } else { "Error" };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nKeep-Alive: timeout=5, max=100\r\n\r\n",
        text.len()
    );
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(text.as_bytes()).await
}

async fn respond_text(sock: &mut TcpStream, text: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n",
        text.len()
    );
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(text.as_bytes()).await
}

/// Write `events` as one chunk of a chunked SSE body.
async fn write_events(sock: &mut TcpStream, events: &[String]) -> std::io::Result<()> {
    let data: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    sock.write_all(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes())
        .await?;
    sock.flush().await
}

async fn connection(m: Arc<Mock>, mut sock: TcpStream) -> std::io::Result<()> {
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

async fn handle(
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
            respond(sock, 200, m.cfg.slots.as_ref().unwrap()).await
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
            m.generations.fetch_add(1, Ordering::SeqCst);
            let prompt = m.prompt_of(body);
            let probe = prompt.contains("[probe]");
            let prompt_tokens = m.admit(&prompt, probe);
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
                None => synthetic(m, sock, body, chat, prompt_tokens).await?,
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
async fn replay(sock: &mut TcpStream, r: &Replay, prompt_tokens: u64) -> std::io::Result<()> {
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
async fn synthetic(
    m: &Mock,
    sock: &mut TcpStream,
    body: &Value,
    chat: bool,
    prompt_tokens: u64,
) -> std::io::Result<()> {
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
                json!({"content": format!(" t{i}")}),
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

fn suite(workload: &str, load: &str) -> Suite {
    let text = format!(
        "name = 'real'\ndescription = 'mock engines'\n[workload]\n{workload}\n[load]\n{load}\n[sampling]\ntemperature = 0.0\nseed = 0\nthinking = false\n"
    );
    Suite::from_toml(&text, Path::new("real.toml")).unwrap()
}

fn fixed(input: u32, output: u32) -> String {
    format!("kind = 'fixed'\napi = 'chat'\ninput_tokens = {input}\noutput_tokens = {output}\nignore_eos = true")
}

const CLOSED: &str = "concurrency = [1]\nrequests = 4\nwarmup = 0\ncache = 'cold'";

fn options(url: &str, suite: Suite) -> E2eOptions {
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

async fn session(o: &E2eOptions) -> E2eResults {
    run_session(o, StopSignal::new(), &mut |_| {})
        .await
        .expect("session")
}

/// The chat template's tokens around a message, counted with the fixture tokenizer (what the
/// session must measure).
fn template_overhead() -> i64 {
    let t = tokenizers::Tokenizer::from_file(tokenizer_path()).unwrap();
    let text = "[probe] Count the tokens of this short message, please.";
    let n = |s: &str| t.encode(s, false).unwrap().len() as i64;
    n(&format!("{TEMPLATE_HEAD}{text}{TEMPLATE_TAIL}")) - n(text)
}

// ---------------------------------------------------------------------------------------------
// 1. Prompt lengths against llama.cpp: its own /tokenize body, checked against usage.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llamacpp_prompts_are_token_exact_through_its_own_tokenize_body() {
    let (url, m) = start(Cfg::llamacpp()).await;
    let overhead = template_overhead();
    assert!(overhead > 0);
    // Two lengths (the 64 and 256).
    for input in [64u32, 256] {
        let r = session(&options(&url, suite(&fixed(input, 8), CLOSED))).await;
        assert!(r.failure.is_none(), "{:?}", r.failure);
        let f = &r.engine.facts;
        assert_eq!(f.kind, EngineKind::LlamaCpp);
        assert_eq!(f.tokenize_form, Some(TokenizeForm::LlamaCpp));
        assert_eq!(f.prompt_overhead.as_ref().unwrap().value, overhead);
        let run = &r.runs[0];
        assert!(run.validity.valid, "{:#?}", run.validity);
        for q in &run.requests {
            assert_eq!(q.input_tokens_counted, Some(u64::from(input)), "{q:?}");
            // The engine's count is the prompt plus the template, never a −100% mismatch.
            let p = q.prompt_tokens.unwrap() as i64;
            assert!(
                (p - i64::from(input) - overhead).abs() <= 2,
                "prompt {p} for {input} + {overhead}"
            );
        }
        let check = run.conditions.lengths.prompt_check.as_ref().unwrap();
        assert_eq!((check.checked, check.mismatched), (4, 0));
        assert_eq!(run.conditions.lengths.input_exact, Some(true));
        let md = rigbench::e2e::render_markdown(&r);
        assert!(
            md.contains(&format!("its chat template adds {overhead}")),
            "{md}"
        );
    }
    // llama.cpp was asked in its own body; vLLM's body would have counted nothing.
    let bodies = m.tokenize_bodies.lock().unwrap().clone();
    assert!(
        bodies.get("content").copied().unwrap_or(0) > 10,
        "{bodies:?}"
    );
    assert_eq!(bodies.get("prompt"), None, "{bodies:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_tokenization_is_an_error_never_zero() {
    // llama.cpp answers vLLM's body with 200 {"tokens": []}: an error, not 0 tokens.
    let (url, _m) = start(Cfg::llamacpp()).await;
    let c = EngineClient::new(&url).unwrap();
    let e = c
        .tokenize_as(TokenizeForm::Vllm, "m", "three short words")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("counted 0 tokens for a non-empty text"), "{e}");
    let ok = c
        .tokenize_as(TokenizeForm::LlamaCpp, "m", "three short words")
        .await
        .unwrap()
        .unwrap();
    assert!(ok.count >= 3);
    // The empty text is legitimately 0.
    assert_eq!(
        c.tokenize_as(TokenizeForm::LlamaCpp, "m", "")
            .await
            .unwrap()
            .unwrap()
            .count,
        0
    );
    // A server whose /tokenize counts nothing in either body: not used, said why, and the
    // prompt lengths are not claimed exact; with --tokenizer they are.
    let (url, _m) = start(Cfg {
        tokenize_broken: true,
        ..Cfg::vllm()
    })
    .await;
    let r = session(&options(&url, suite(&fixed(32, 4), CLOSED))).await;
    let f = &r.engine.facts;
    assert!(!f.tokenize);
    assert!(
        f.tokenize_note
            .as_deref()
            .unwrap()
            .contains("counted 0 tokens"),
        "{:?}",
        f.tokenize_note
    );
    let run = &r.runs[0];
    assert_eq!(run.conditions.lengths.input_exact, None);
    assert!(run
        .requests
        .iter()
        .all(|q| q.input_tokens_counted.is_none()));
    assert!(
        r.notes.iter().any(|n| n.contains("--tokenizer")),
        "{:?}",
        r.notes
    );
    let mut o = options(&url, suite(&fixed(32, 4), CLOSED));
    o.tokenizer = Some(tokenizer_path());
    let r = session(&o).await;
    let run = &r.runs[0];
    assert_eq!(run.conditions.lengths.input_exact, Some(true));
    assert!(run.validity.valid, "{:#?}", run.validity);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tokenizer_flag_is_used_when_given() {
    // The engine's own tokenizer agrees with --tokenizer: used, and said so.
    let (url, m) = start(Cfg::vllm()).await;
    let mut o = options(&url, suite(&fixed(48, 4), CLOSED));
    o.tokenizer = Some(tokenizer_path());
    let r = session(&o).await;
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("token counts from --tokenizer") && n.contains("agrees")),
        "{:?}",
        r.notes
    );
    let run = &r.runs[0];
    assert!(run.validity.valid, "{:#?}", run.validity);
    assert_eq!(
        run.conditions.token_check.as_ref().unwrap().source,
        TokenSource::LocalTokenizer.label()
    );
    // Prompts were fitted with the local tokenizer: the engine's /tokenize saw only the probes.
    assert!(
        m.tokenize_bodies
            .lock()
            .unwrap()
            .get("prompt")
            .copied()
            .unwrap_or(0)
            <= 2
    );
    // A served model whose tokenizer is not the one given: the probe says so, and the prompt
    // lengths the engine counts do not match: the run is invalid, with the reason.
    let (url, _m) = start(Cfg {
        word_tokenizer: true,
        ..Cfg::vllm()
    })
    .await;
    let mut o = options(&url, suite(&fixed(96, 4), CLOSED));
    o.tokenizer = Some(tokenizer_path());
    let r = session(&o).await;
    assert!(
        r.notes.iter().any(|n| n.contains("DISAGREES")),
        "{:?}",
        r.notes
    );
    let run = &r.runs[0];
    assert!(!run.validity.valid);
    assert!(
        run.validity
            .reasons
            .iter()
            .any(|w| w.contains("prompt lengths disagree with the engine's usage.prompt_tokens")),
        "{:?}",
        run.validity.reasons
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Prompt lengths against usage.prompt_tokens: max(2%, 2 tokens) after the known overhead.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_length_mismatches_beyond_the_tolerance_invalidate_the_run() {
    let ov = template_overhead();
    let tol = |input: u32| ((0.02 * (i64::from(input) + ov) as f64).floor() as i64).max(2);
    // (prompt length, tokens the engine counts beyond prompt + template on the measured
    // prompts only, valid?): a BPE merge of a token or two at the template boundary is within
    // the tolerance; more is not.
    let cases = [
        (16u32, 1i64, true),
        (16, tol(16), true),
        (16, tol(16) + 1, false),
        (200, tol(200), true),
        (200, -(tol(200) + 1), false),
        (200, 21, false),
    ];
    for (input, delta, valid) in cases {
        let (url, _m) = start(Cfg {
            prompt_delta: delta,
            ..Cfg::vllm()
        })
        .await;
        let r = session(&options(&url, suite(&fixed(input, 4), CLOSED))).await;
        let run = &r.runs[0];
        assert_eq!(
            r.engine.facts.prompt_overhead.as_ref().unwrap().value,
            ov,
            "the probe is counted as the engine counts it"
        );
        let check = run.conditions.lengths.prompt_check.as_ref().unwrap();
        assert_eq!(check.checked, 4);
        assert_eq!(check.max_abs_diff, delta.unsigned_abs(), "{input} {delta}");
        assert_eq!(
            run.validity.valid, valid,
            "{input} tokens, {delta:+}: {:#?}",
            run.validity
        );
        if !valid {
            let why = run.validity.reasons.join("; ");
            assert!(
                why.contains("4 of 4 prompt lengths disagree")
                    && why.contains(&format!("off by {}", delta.unsigned_abs())),
                "{why}"
            );
        }
    }
    // An engine that counts 10% more on every prompt (another tokenizer): the probe's
    // overhead absorbs the difference on a short text only; long prompts are caught.
    let (url, _m) = start(Cfg {
        prompt_scale: 1.10,
        ..Cfg::vllm()
    })
    .await;
    let r = session(&options(&url, suite(&fixed(300, 4), CLOSED))).await;
    assert!(!r.runs[0].validity.valid, "{:#?}", r.runs[0].validity);
}

// ---------------------------------------------------------------------------------------------
// 3. Connections: llama-server closes idle kept-alive connections after 5 s.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_on_a_connection_the_server_closed_is_retried_once_on_a_fresh_one() {
    let (url, m) = start(Cfg {
        keepalive: Some(Duration::from_millis(150)),
        ..Cfg::llamacpp()
    })
    .await;
    // A pool that keeps connections longer than the server does (as rigbench did).
    let c = EngineClient::with_idle_timeout(&url, Duration::from_secs(60)).unwrap();
    let req = GenRequest {
        api: rigbench::e2e::client::Api::Chat,
        model: "m".into(),
        prompt: "hello there".into(),
        max_tokens: 4,
        ignore_eos: true,
        temperature: 0.0,
        seed: None,
        thinking: None,
    };
    let (_, first) = c
        .stream(&req, Duration::from_secs(30), std::future::pending())
        .await;
    assert!(first.error.is_none() && first.retries == 0, "{first:?}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (_, second) = c
        .stream(&req, Duration::from_secs(30), std::future::pending())
        .await;
    assert_eq!(m.stale_resets.load(Ordering::SeqCst), 1);
    assert!(second.error.is_none(), "{:?}", second.error);
    assert!(second.done);
    assert_eq!(second.retries, 1);
    assert!(second.retry_reason.is_some());
    // Idle connections dropped before the server's limit: nothing to retry.
    let c = EngineClient::with_idle_timeout(&url, Duration::from_millis(50)).unwrap();
    for _ in 0..2 {
        let (_, o) = c
            .stream(&req, Duration::from_secs(30), std::future::pending())
            .await;
        assert!(o.error.is_none() && o.retries == 0, "{o:?}");
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(m.stale_resets.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_server_that_closed_idle_connections_is_not_unreachable() {
    // An open loop at 3 requests/s leaves connections idle beyond the server's 150 ms.
    let load = "mode = 'open'
rates = [3.0]
requests = 8
warmup = 0
cache = 'cold'";
    let (url, m) = start(Cfg {
        keepalive: Some(Duration::from_millis(150)),
        ..Cfg::llamacpp()
    })
    .await;
    let mut o = options(&url, suite(&fixed(32, 4), load));
    o.pool_idle_timeout = Duration::from_secs(60);
    // No scrape during the run: it would keep a pooled connection fresh for the requests. The
    // seeded arrival gaps leave several connections idle beyond 150 ms.
    o.metrics_interval = Duration::from_secs(30);
    let r = session(&o).await;
    assert!(r.failure.is_none(), "{:?}", r.failure);
    let run = &r.runs[0];
    let retried = run.requests.iter().filter(|q| q.retries > 0).count();
    assert!(m.stale_resets.load(Ordering::SeqCst) >= 1);
    assert!(retried >= 1, "{:?}", run.requests);
    assert!(run.requests.iter().all(|q| q.ok), "{:?}", run.requests);
    assert!(run.validity.valid, "{:#?}", run.validity);
    assert!(
        run.validity
            .notes
            .iter()
            .any(|n| n.contains("sent again once on a fresh connection")),
        "{:?}",
        run.validity.notes
    );
    // The default pool (idle connections dropped before the server's keep-alive): no reset
    // reaches a request.
    let (url, m) = start(Cfg {
        keepalive: Some(Duration::from_millis(300)),
        ..Cfg::llamacpp()
    })
    .await;
    let mut o = options(&url, suite(&fixed(32, 4), load));
    o.pool_idle_timeout = Duration::from_millis(100);
    let r = session(&o).await;
    assert_eq!(m.stale_resets.load(Ordering::SeqCst), 0);
    assert!(r.runs[0].validity.valid, "{:#?}", r.runs[0].validity);
    // Every generation connection reset while /health answers: requests fail (the run is
    // invalid), but the engine is not declared unreachable.
    let (url, _m) = start(Cfg {
        generation_resets: true,
        ..Cfg::llamacpp()
    })
    .await;
    let r = session(&options(&url, suite(&fixed(32, 4), CLOSED))).await;
    assert!(r.failure.is_none(), "{:?}", r.failure);
    let run = &r.runs[0];
    assert!(run.requests.iter().all(|q| !q.ok));
    assert!(!run.validity.valid);
    assert!(
        run.validity
            .notes
            .iter()
            .any(|n| n.contains("while GET /health still answered")),
        "{:?}",
        run.validity.notes
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Token accounting from every chunk: the real SSE captures.

/// Arrival times for a capture without them: `ms[i]` for event `i`.
fn outcome_of(events: &[String], ms: impl Fn(usize) -> f64) -> StreamOutcome {
    let mut o = StreamOutcome::default();
    for (i, e) in events.iter().enumerate() {
        o.apply(Duration::from_secs_f64(ms(i) / 1e3), e).unwrap();
    }
    o.end = Duration::from_secs_f64(ms(events.len()) / 1e3);
    o
}

#[test]
fn vllm_capture_counts_every_token_including_the_empty_content_chunks() {
    let events = sse_events(&vllm_file("09_"));
    // Synthetic arrival times (the capture holds none): one event every 2 ms from 50 ms.
    let o = outcome_of(&events, |i| 50.0 + 2.0 * i as f64);
    assert!(o.done);
    assert_eq!(o.chunks, 130, "129 choices chunks and the usage-only one");
    assert_eq!(o.choice_chunks, 129);
    let empty = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter(|v| v.pointer("/choices/0/delta/content") == Some(&json!("")))
        .count();
    assert_eq!(empty, 35);
    // 128 token chunks, one token each, counted from the cumulative usage.
    assert_eq!(o.events.len(), 128);
    let usage = o.usage.unwrap().completion_tokens;
    assert_eq!(usage, Some(128));
    let (tokens, split) = split_tokens(&o.events, usage);
    assert_eq!(split, ChunkSplit::UsagePerChunk);
    assert!(tokens.iter().all(|t| *t == 1));
    assert_eq!(
        o.events.iter().filter(|e| e.content_chars == 0).count(),
        34,
        "34 tokens arrived with an empty content (held back or special)"
    );
    // TTFT: the first token (event 1, empty content); TTFC: the first text (event 2); vllm bench
    // serve's first chunk: the role chunk (event 0).
    let (ttft, ttfc, tpot, itl) = rigbench::e2e::metrics::latencies(&o, &tokens, usage);
    assert_eq!(ttft, Some(0.052));
    assert_eq!(ttfc, Some(0.054));
    assert_eq!(o.first_chunk, Some(Duration::from_millis(50)));
    assert_eq!(itl.len(), 127);
    // The stream ends with the [DONE] event (131st) at 50 + 2 × 131 ms.
    assert!((tpot.unwrap() - (0.312 - 0.052) / 127.0).abs() < 1e-12);
    let d = Delivery::of(&o.events, &tokens, usage, true);
    assert!(!d.bursty, "{d:?}");
}

#[test]
fn llamacpp_capture_is_bursty_without_per_chunk_usage() {
    let events = sse_events(&llamacpp_file("13_"));
    // Synthetic arrival times after the fixture's README: the first ~10 tokens within 0.2 ms
    // of each other, then one chunk every 4 ms.
    let at = |i: usize| match i {
        0 => 30.0,
        1..=10 => 40.0 + 0.02 * (i - 1) as f64,
        _ => 40.2 + 4.0 * (i - 10) as f64,
    };
    let o = outcome_of(&events, at);
    assert!(o.done);
    // No usage until the end (llama-server ignores continuous_usage_stats).
    assert_eq!(o.usage_chunks, 0);
    assert_eq!(o.usage.unwrap().completion_tokens, Some(32));
    // The role chunk (content null) and the empty finish chunk carry no token.
    assert_eq!(o.events.len(), 26);
    let (tokens, split) = split_tokens(&o.events, Some(32));
    assert_eq!(split, ChunkSplit::Estimated);
    assert_eq!(tokens.iter().sum::<u64>(), 32);
    let (ttft, ttfc, _, _) = rigbench::e2e::metrics::latencies(&o, &tokens, Some(32));
    assert_eq!(ttft, Some(0.040));
    assert_eq!(ttfc, Some(0.040));
    assert_eq!(o.first_chunk, Some(Duration::from_millis(30)));
    let d = Delivery::of(&o.events, &tokens, Some(32), false);
    assert!(d.bursty);
    assert_eq!(d.burst_gaps, 9);
    assert_eq!((d.extra_tokens, d.multi_token_chunks), (6, 6));
    // The cached prompt tokens the engine reported with it.
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["timings"]["cache_n"], 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_vllm_capture_gives_128_tokens_and_the_first_token_time() {
    let events = sse_events(&vllm_file("09_"));
    // One event per write, 2 ms apart (the capture holds no times).
    let mut groups = vec![(Duration::from_millis(20), 1)];
    groups.extend(std::iter::repeat_n(
        (Duration::from_millis(2), 1),
        events.len() - 1,
    ));
    let (url, _m) = start(Cfg {
        replay: Some(Replay { events, groups }),
        ..Cfg::vllm()
    })
    .await;
    let r = session(&options(&url, suite(&fixed(32, 128), CLOSED))).await;
    assert!(r.failure.is_none(), "{:?}", r.failure);
    let run = &r.runs[0];
    assert!(run.validity.valid, "{:#?}", run.validity);
    for q in &run.requests {
        assert_eq!(q.output_tokens, Some(128));
        assert_eq!(q.token_chunks, 128);
        assert_eq!(q.chunks, 130);
        assert_eq!(q.chunk_split, Some(ChunkSplit::UsagePerChunk));
        assert!(q.ttft_s.unwrap() <= q.ttfc_s.unwrap());
        assert!(q.first_chunk_s.unwrap() <= q.ttft_s.unwrap());
        assert!(
            !q.flags
                .iter()
                .any(|f| f.contains("one chunk") || f.starts_with("empty")),
            "{:?}",
            q.flags
        );
    }
    assert_eq!(run.latency.decode_not_observable, 0);
    let md = rigbench::e2e::render_markdown(&r);
    assert!(
        md.contains("TTFT: request sent → the first chunk that carries a generated token"),
        "{md}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_llamacpp_capture_is_flagged_bursty_and_its_itl_marked() {
    let events = sse_events(&llamacpp_file("13_"));
    // The role chunk, then the first 10 token chunks in one write (a burst), then one by one.
    let mut groups = vec![
        (Duration::from_millis(20), 1),
        (Duration::from_millis(5), 10),
    ];
    groups.extend(std::iter::repeat_n(
        (Duration::from_millis(4), 1),
        events.len() - 11,
    ));
    let (url, _m) = start(Cfg {
        replay: Some(Replay { events, groups }),
        ..Cfg::llamacpp()
    })
    .await;
    let r = session(&options(&url, suite(&fixed(32, 32), CLOSED))).await;
    let run = &r.runs[0];
    assert!(run.validity.valid, "{:#?}", run.validity);
    for q in &run.requests {
        assert_eq!(q.output_tokens, Some(32));
        assert_eq!(q.token_chunks, 26);
        assert!(q.delivery.as_ref().unwrap().bursty);
        assert!(
            q.flags.iter().any(|f| f.starts_with("bursty delivery")),
            "{:?}",
            q.flags
        );
    }
    assert_eq!(run.latency.bursty, 4);
    let md = rigbench::e2e::render_markdown(&r);
    assert!(
        md.contains("ITL (delivery, not decode: 4 bursty requests)"),
        "{md}"
    );
}

// ---------------------------------------------------------------------------------------------
// 5. KV capacity, prefix-cache counters and speculation as llama.cpp reports them.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llamacpp_kv_capacity_from_slots_wins_over_the_cells_per_sequence_log_line() {
    let (url, _m) = start(Cfg::llamacpp()).await;
    // The verbose log whose `llama_kv_cache` line gives 2,048 cells (per sequence, 4 sequences).
    let mut o = options(&url, suite(&fixed(32, 4), CLOSED));
    o.engine_log = Some(llamacpp_file("05_"));
    let r = session(&o).await;
    let kv = &r.runs[0].conditions.kv;
    let cap = kv.capacity_tokens.as_ref().unwrap();
    assert_eq!(cap.value, 8192, "{cap:?}");
    assert!(
        cap.source
            .starts_with("/slots n_ctx summed over 4 slot(s) (4 × 2,048)"),
        "{}",
        cap.source
    );
    // The fixture's own line: `load_model: initializing, n_slots = 4, …, kv_unified = 'false'`.
    let line = read(&llamacpp_file("05_"))
        .lines()
        .position(|l| l.contains("kv_unified = 'false'"))
        .unwrap()
        + 1;
    assert!(
        cap.source
            .contains(&format!("(kv_unified = false, engine log line {line})")),
        "{}",
        cap.source
    );
    // Other numbers: a unified cache (every slot reports the whole 8,192) is one cache, not 4.
    let mut slots: Value = serde_json::from_str(&read(&llamacpp_file("04_"))).unwrap();
    for s in slots.as_array_mut().unwrap() {
        s["n_ctx"] = json!(8192);
    }
    let (url, _m) = start(Cfg {
        slots: Some(slots),
        ..Cfg::llamacpp()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("unified.log");
    std::fs::write(
        &log,
        "0.00.719.151 I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 8192, kv_unified = 'true'
",
    )
    .unwrap();
    let mut o = options(&url, suite(&fixed(32, 4), CLOSED));
    o.engine_log = Some(log);
    let r = session(&o).await;
    let cap = r.runs[0].conditions.kv.capacity_tokens.clone().unwrap();
    assert_eq!(cap.value, 8192, "{cap:?}");
    assert!(cap.source.contains("kv_unified = true"), "{}", cap.source);
    // /props alone (no /slots): n_ctx × total_slots.
    let (url, _m) = start(Cfg {
        slots: None,
        props: Some(json!({"build_info": "b1-0c1e57098", "total_slots": 2, "default_generation_settings": {"n_ctx": 4096}})),
        ..Cfg::llamacpp()
    })
    .await;
    let r = session(&options(&url, suite(&fixed(32, 4), CLOSED))).await;
    assert_eq!(
        r.runs[0]
            .conditions
            .kv
            .capacity_tokens
            .as_ref()
            .unwrap()
            .value,
        8192
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llamacpp_prompt_cache_counters_verify_cold_and_warm_in_one_wording() {
    let (url, _m) = start(Cfg::llamacpp()).await;
    let r = session(&options(&url, suite(&fixed(48, 4), CLOSED))).await;
    let c = &r.runs[0].conditions.cache;
    assert_eq!(c.verified, Some(true), "{}", c.note);
    assert!(c
        .counters
        .as_deref()
        .unwrap()
        .starts_with("llamacpp:prompt_tokens_cached"));
    assert!(c.queries.unwrap() > 0);
    // llama.cpp has no /reset_prefix_cache: said, not claimed.
    assert_eq!(c.reset, None);
    let md = rigbench::e2e::render_markdown(&r);
    assert!(!md.contains("unverified"), "{md}");
    assert!(
        md.contains("checked per run below (llamacpp:prompt_tokens_cached"),
        "{md}"
    );
    assert!(md.contains("not offered"), "{md}");
    // Warm: the replayed prompts are served from the slots' caches.
    let warm = "concurrency = [1]
requests = 4
warmup = 0
cache = 'warm'";
    let r = session(&options(&url, suite(&fixed(48, 4), warm))).await;
    let c = &r.runs[0].conditions.cache;
    assert_eq!(c.verified, Some(true), "{}", c.note);
    assert!(c.hit_rate.unwrap() > 0.5, "{c:?}");
    assert!(r.runs[0].validity.valid, "{:#?}", r.runs[0].validity);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llamacpp_ngram_speculation_is_reported_as_ngram_not_a_draft_model() {
    // /slots says speculative, and which type.
    let mut slots: Value = serde_json::from_str(&read(&llamacpp_file("04_"))).unwrap();
    for s in slots.as_array_mut().unwrap() {
        s["speculative"] = json!(true);
        s["params"]["speculative.types"] = json!("ngram-simple");
    }
    let (url, _m) = start(Cfg {
        slots: Some(slots.clone()),
        timings_drafts: Some((12, 2)),
        ..Cfg::llamacpp()
    })
    .await;
    let r = session(&options(&url, suite(&fixed(32, 8), CLOSED))).await;
    let s = &r.runs[0].conditions.spec;
    assert_eq!(s.state, SpecState::On, "{}", s.evidence);
    let m = s.method.as_ref().unwrap();
    assert_eq!(m.value, "ngram");
    assert!(
        m.source.contains("speculative.types = ngram-simple"),
        "{}",
        m.source
    );
    // 4 requests × (2 accepted of 12 drafted), from the /metrics deltas.
    assert_eq!((s.accepted_tokens, s.draft_tokens), (Some(8), Some(48)));
    // speculative: true with the per-request default type "none": on, method from the engine
    // command; and never guessed as a draft model.
    for s in slots.as_array_mut().unwrap() {
        s["params"]["speculative.types"] = json!("none");
    }
    let (url, _m) = start(Cfg {
        slots: Some(slots),
        ..Cfg::llamacpp()
    })
    .await;
    let r = session(&options(&url, suite(&fixed(32, 8), CLOSED))).await;
    let s = &r.runs[0].conditions.spec;
    assert_eq!(s.state, SpecState::On, "{}", s.evidence);
    assert!(s.method.is_none(), "{:?}", s.method);
    assert!(
        r.runs[0]
            .validity
            .missing_conditions
            .iter()
            .any(|m| m.contains("speculative method")),
        "{:?}",
        r.runs[0].validity.missing_conditions
    );
    // Started with --engine-cmd: the command says ngram-simple. The engine is this mock run as
    // the command's own process (an in-process mock cannot stand behind --engine-cmd: its
    // listener is older than the command, and rigbench refuses such a server).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let exe = std::env::current_exe().unwrap();
    let mut o = options(&url, suite(&fixed(32, 8), CLOSED));
    o.engine = EngineChoice::Command {
        command: format!(
            "RIGBENCH_TEST_MOCK_PORT={port} exec '{}' mock_llamacpp_engine_process --exact --ignored --nocapture # llama-server -m tiny-qwen3-f32.gguf -c 8192 -np 4 --metrics --spec-type ngram-simple --port {port}",
            exe.display()
        ),
        url: url.clone(),
    };
    o.startup_timeout = Duration::from_secs(30);
    let r = session(&o).await;
    let m = r.runs[0].conditions.spec.method.clone().unwrap();
    assert_eq!(m.value, "ngram");
    assert!(
        m.source.contains("--spec-type ngram-simple"),
        "{}",
        m.source
    );
}

/// Not a test: the `--engine-cmd` process of
/// `llamacpp_ngram_speculation_is_reported_as_ngram_not_a_draft_model`, started by it as this
/// test binary with `RIGBENCH_TEST_MOCK_PORT` set: the llama.cpp mock whose `/slots` says
/// speculative with the per-request type "none", on that port, until it is stopped. Run without
/// that variable, it fails.
#[test]
#[ignore = "the mock engine process of another test; fails when run on its own"]
fn mock_llamacpp_engine_process() {
    let port: u16 = std::env::var("RIGBENCH_TEST_MOCK_PORT")
        .expect("RIGBENCH_TEST_MOCK_PORT: this is the mock engine process of llamacpp_ngram_speculation_is_reported_as_ngram_not_a_draft_model, not a test")
        .parse()
        .unwrap();
    let mut slots: Value = serde_json::from_str(&read(&llamacpp_file("04_"))).unwrap();
    for s in slots.as_array_mut().unwrap() {
        s["speculative"] = json!(true);
        s["params"]["speculative.types"] = json!("none");
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let _mock = start_on(
            Cfg {
                slots: Some(slots),
                ..Cfg::llamacpp()
            },
            port,
        )
        .await;
        std::future::pending::<()>().await
    })
}

// ---------------------------------------------------------------------------------------------
// 6. What the run says about itself: scrapes, the reset, the suite, a failed start.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrapes_are_counted_and_timed() {
    let (url, _m) = start(Cfg {
        token_delay: Duration::from_millis(5),
        ..Cfg::vllm()
    })
    .await;
    let r = session(&options(&url, suite(&fixed(32, 24), CLOSED))).await;
    let p = &r.runs[0].polls;
    // The start and the end at least; every scrape answered and timed.
    assert!(p.scrape_ms.len() >= 2, "{p:?}");
    assert_eq!(p.scrape_ms.len(), p.polls);
    assert!(p.scrape_ms.iter().all(|ms| *ms >= 0.0));
    let md = rigbench::e2e::render_markdown(&r);
    assert!(
        md.contains(&format!("c=1: {} scrapes", p.scrape_ms.len())),
        "{md}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_says_what_the_reset_did_and_which_suite_ran() {
    let (url, _m) = start(Cfg::llamacpp()).await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rep");
    let (url2, out2) = (url.clone(), out.clone());
    let o = tokio::task::spawn_blocking(move || {
        common::rigbench(&[
            "e2e",
            "--url",
            &url2,
            "--suite",
            "tiny",
            "--input-tokens",
            "40",
            "--output-tokens",
            "6",
            "--concurrency",
            "2",
            "--requests",
            "4",
            "--no-progress",
            "--out",
            out2.to_str().unwrap(),
        ])
    })
    .await
    .unwrap();
    let err = common::stderr(&o);
    assert!(o.status.success(), "{err}");
    // llama.cpp has no /reset_prefix_cache: nothing claims it was emptied.
    assert!(!err.contains("emptied the engine's prefix cache"), "{err}");
    assert!(err.contains("offers no POST"), "{err}");
    assert!(
        err.contains("suite `tiny` as run: 40-token prompts, 6 output tokens"),
        "{err}"
    );
    let md = read(&out.join("report.md"));
    assert!(
        md.contains("Suite: `tiny` as run: 40-token prompts, 6 output tokens (fixed, ignore_eos), chat API; closed loop at concurrency 2; 4 requests per point"),
        "{md}"
    );
    // vLLM's reset answers 200: then it is said, after the fact.
    let (url, _m) = start(Cfg::vllm()).await;
    let out = dir.path().join("rep2");
    let o = tokio::task::spawn_blocking(move || {
        common::rigbench(&[
            "e2e",
            "--url",
            &url,
            "--suite",
            "tiny",
            "--concurrency",
            "1",
            "--requests",
            "2",
            "--output-tokens",
            "4",
            "--no-progress",
            "--out",
            out.to_str().unwrap(),
        ])
    })
    .await
    .unwrap();
    let err = common::stderr(&o);
    assert!(
        err.contains("/reset_prefix_cache emptied the engine's prefix cache"),
        "{err}"
    );
}

#[test]
fn a_startup_failure_is_reported_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // vLLM's own argparse failure (the fixture, rigbench-captured), then a path under a home.
    let log = vllm_file("06_");
    let cmd = format!(
        "cat '{}'; echo 'cannot open /home/alice/models/secret-model/config.json'; exit 2",
        log.display()
    );
    let o = common::rigbench(&[
        "e2e",
        "--engine-cmd",
        &cmd,
        "--port",
        &port.to_string(),
        "--no-progress",
        "--startup-timeout",
        "30",
        "--out",
        dir.path().join("rep").to_str().unwrap(),
    ]);
    let err = common::stderr(&o);
    assert!(!o.status.success());
    assert!(err.contains("exited during startup"), "{err}");
    assert!(err.contains("unrecognized arguments"), "{err}");
    // Paths are redacted as in the report (the home folder becomes `<home>`).
    assert!(!err.contains("/home/alice"), "{err}");
    assert!(err.contains("<home>/models"), "{err}");
}
