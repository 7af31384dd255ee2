//! The e2e driver against a small mock OpenAI-compatible server (axum on 127.0.0.1:0): SSE
//! framing, usage, reasoning deltas, multi-token chunks, speculative counters, cache
//! temperature, open-loop lateness, interruption, a dying engine and malformed SSE.

use crate::common;
use common::session;
use std::collections::HashSet;
use std::convert::Infallible;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use rigbench::e2e::conditions::SpecState;
use rigbench::e2e::executor::{ExecStop, StopCause, StopSignal};
use rigbench::e2e::metrics::{ChunkSplit, TokenSource};
use rigbench::e2e::workload::Suite;
use rigbench::e2e::{run_session, E2eOptions, E2eResults};

#[derive(Default, Clone)]
struct Cfg {
    /// Emit reasoning_content before the content, whatever the request says.
    reasoning: bool,
    /// Speculative k (0 = off): chunks carry 1 + accepted tokens, with continuous usage.
    spec_k: u64,
    /// Per-token delay.
    delay_ms: u64,
    /// Send a malformed data line after this many tokens.
    malformed_after: Option<u64>,
    /// Die (stop accepting, end streams without [DONE]) after this many completed requests.
    die_after: Option<u64>,
    /// No usage at all (token counts from /tokenize).
    no_usage: bool,
    /// A chat template of this many tokens before the user message (shared by all requests).
    template_tokens: u64,
    /// Streamed requests from this ordinal on (1-based, in arrival order; the session's
    /// prompt-overhead probe is not streamed) send nothing until the client goes away: in
    /// flight for as long as it waits.
    hold_from: Option<u64>,
}

#[derive(Default)]
struct Counters {
    queries: u64,
    hits: u64,
    drafts: u64,
    draft_tokens: u64,
    accepted: u64,
    per_pos: Vec<u64>,
    seen: HashSet<String>,
    running: u64,
    template_seen: bool,
}

struct Mock {
    cfg: Cfg,
    c: Mutex<Counters>,
    /// Streamed generation requests received (the session's prompt-overhead probe, sent with
    /// `stream: false`, is not one).
    started: AtomicU64,
    completed: AtomicU64,
    dead: AtomicBool,
}

async fn metrics(State(m): State<Arc<Mock>>) -> String {
    let c = m.c.lock().unwrap();
    let mut s = String::new();
    s.push_str("# TYPE vllm:prefix_cache_queries counter\n");
    s.push_str(&format!(
        "vllm:prefix_cache_queries_total{{model_name=\"mock\"}} {}\n",
        c.queries
    ));
    s.push_str(&format!(
        "vllm:prefix_cache_hits_total{{model_name=\"mock\"}} {}\n",
        c.hits
    ));
    s.push_str("vllm:prefix_cache_hits_created{model_name=\"mock\"} 1700000000.5\n");
    s.push_str("vllm:num_preemptions_total{model_name=\"mock\"} 0\n");
    s.push_str(&format!(
        "vllm:num_requests_running{{model_name=\"mock\"}} {}\n",
        c.running
    ));
    s.push_str("vllm:num_requests_waiting{model_name=\"mock\"} 0\n");
    s.push_str(&format!(
        "vllm:kv_cache_usage_perc{{model_name=\"mock\"}} {}\n",
        c.running as f64 * 0.1
    ));
    s.push_str("vllm:cache_config_info{block_size=\"16\",model_name=\"mock\",num_gpu_blocks=\"512\"} 1.0\n");
    if m.cfg.spec_k > 0 {
        s.push_str(&format!(
            "vllm:spec_decode_num_drafts_total{{model_name=\"mock\"}} {}\n",
            c.drafts
        ));
        s.push_str(&format!(
            "vllm:spec_decode_num_draft_tokens_total{{model_name=\"mock\"}} {}\n",
            c.draft_tokens
        ));
        s.push_str(&format!(
            "vllm:spec_decode_num_accepted_tokens_total{{model_name=\"mock\"}} {}\n",
            c.accepted
        ));
        for (i, v) in c.per_pos.iter().enumerate() {
            s.push_str(&format!(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name=\"mock\",position=\"{i}\"}} {v}\n"
            ));
        }
    }
    s
}

async fn generate(State(m): State<Arc<Mock>>, Json(body): Json<Value>) -> Response {
    if m.dead.load(Ordering::SeqCst) {
        // A dying engine drops its streams: an event stream that ends at once, without
        // [DONE], on a connection that is then closed. (A 503 on a kept-alive connection
        // would be an HTTP error, not a dead engine, and the test would race the moment the
        // server stops accepting.)
        return Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CONNECTION, "close")
            .body(Body::empty())
            .unwrap();
    }
    // The streamed request's ordinal (1-based); `None` for the non-streamed probe.
    let ordinal = (body.get("stream") == Some(&json!(true)))
        .then(|| m.started.fetch_add(1, Ordering::SeqCst) + 1);
    let chat = body.get("messages").is_some();
    let prompt = if chat {
        body.pointer("/messages/0/content")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    } else {
        body.get("prompt")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let max_tokens = body.get("max_tokens").and_then(Value::as_u64).unwrap_or(16);
    {
        let mut c = m.c.lock().unwrap();
        let len = prompt.len() as u64;
        c.queries += len;
        let key: String = prompt.chars().take(24).collect();
        if !c.seen.insert(key) {
            c.hits += len / 16 * 16;
        }
        let t = m.cfg.template_tokens;
        if t > 0 {
            c.queries += t;
            if c.template_seen {
                c.hits += t / 16 * 16;
            }
            c.template_seen = true;
        }
        c.running += 1;
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<String>(64);
    let m2 = m.clone();
    tokio::spawn(async move {
        let cfg = m2.cfg.clone();
        if cfg.hold_from.zip(ordinal).is_some_and(|(h, o)| o >= h) {
            tx.closed().await;
            m2.c.lock().unwrap().running -= 1;
            return;
        }
        let send = |v: Value| format!("data: {v}\n\n");
        let delta = |text: &str, reasoning: bool, usage: Option<u64>| {
            let mut v = if chat {
                if reasoning {
                    json!({"choices":[{"index":0,"delta":{"reasoning_content": text}}]})
                } else {
                    json!({"choices":[{"index":0,"delta":{"content": text}}]})
                }
            } else {
                json!({"choices":[{"index":0,"text": text}]})
            };
            if let Some(u) = usage {
                v["usage"] = json!({"prompt_tokens": prompt.len() as u64 + cfg.template_tokens, "completion_tokens": u});
            }
            v
        };
        let mut produced = 0u64;
        let mut step = 0u64;
        let reasoning_tokens = if cfg.reasoning { 3.min(max_tokens) } else { 0 };
        let mut ok = true;
        while produced < max_tokens {
            if m2.dead.load(Ordering::SeqCst) {
                ok = false;
                break;
            }
            let n = if cfg.spec_k > 0 {
                let acc = (step % (cfg.spec_k + 1)).min(max_tokens - produced - 1);
                let mut c = m2.c.lock().unwrap();
                if c.per_pos.len() < cfg.spec_k as usize {
                    c.per_pos.resize(cfg.spec_k as usize, 0);
                }
                c.drafts += 1;
                c.draft_tokens += cfg.spec_k;
                c.accepted += acc;
                for i in 0..acc as usize {
                    c.per_pos[i] += 1;
                }
                1 + acc
            } else {
                1
            };
            step += 1;
            let text: String = (produced..produced + n)
                .map(|i| format!("tok{i} "))
                .collect();
            let is_reasoning = produced < reasoning_tokens;
            produced += n;
            let usage = (cfg.spec_k > 0 && !cfg.no_usage).then_some(produced);
            if tx
                .send(send(delta(&text, is_reasoning, usage)))
                .await
                .is_err()
            {
                ok = false;
                break; // client went away
            }
            if cfg.malformed_after == Some(produced) {
                let _ = tx.send("data: {\"choices\": [oops\n\n".to_string()).await;
            }
            tokio::time::sleep(Duration::from_millis(cfg.delay_ms)).await;
        }
        if ok {
            let mut fin = delta("", false, None);
            fin["choices"][0]["finish_reason"] = json!("length");
            let _ = tx.send(send(fin)).await;
            if !cfg.no_usage {
                let _ = tx
                    .send(send(json!({"choices": [], "usage": {"prompt_tokens": prompt.len() as u64 + cfg.template_tokens, "completion_tokens": produced}})))
                    .await;
            }
            let _ = tx.send("data: [DONE]\n\n".to_string()).await;
            let done = m2.completed.fetch_add(1, Ordering::SeqCst) + 1;
            if cfg.die_after.is_some_and(|d| done >= d) {
                m2.dead.store(true, Ordering::SeqCst);
            }
        }
        m2.c.lock().unwrap().running -= 1;
    });
    let stream = ReceiverStream::new(rx).map(Ok::<String, Infallible>);
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

async fn start(cfg: Cfg) -> (String, Arc<Mock>) {
    let mock = Arc::new(Mock {
        cfg,
        c: Mutex::new(Counters::default()),
        started: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        dead: AtomicBool::new(false),
    });
    let app = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/version",
            get(|| async { Json(json!({"engine": "mock", "version": "9.9"})) }),
        )
        .route(
            "/v1/models",
            get(|| async { Json(json!({"data": [{"id": "mock", "owned_by": "tests"}]})) }),
        )
        .route(
            "/tokenize",
            post(|Json(b): Json<Value>| async move {
                let n = b.get("prompt").and_then(Value::as_str).map_or(0, str::len);
                Json(json!({"count": n, "max_model_len": 4096}))
            }),
        )
        .route(
            "/reset_prefix_cache",
            post(|State(m): State<Arc<Mock>>| async move {
                let mut c = m.c.lock().unwrap();
                c.seen.clear();
                c.template_seen = false;
                "ok"
            }),
        )
        .route("/metrics", get(metrics))
        .route("/v1/chat/completions", post(generate))
        .route("/v1/completions", post(generate))
        .with_state(mock.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let m2 = mock.clone();
    tokio::spawn(async move {
        // Stop accepting once "dead" (the engine went away).
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                while !m2.dead.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await;
    });
    (format!("http://{addr}"), mock)
}

fn suite(extra_load: &str, workload: &str) -> Suite {
    let text = format!(
        "name = 'mock'\n[workload]\n{workload}\n[load]\nrequests = 6\nwarmup = 1\n{extra_load}\n[sampling]\nthinking = false\n"
    );
    Suite::from_toml(&text, Path::new("mock.toml")).unwrap()
}

const FIXED: &str = "kind = 'fixed'\ninput_tokens = 48\noutput_tokens = 12\nignore_eos = true";

fn options(url: &str, suite: Suite) -> E2eOptions {
    common::url_session_options(
        url,
        suite,
        Duration::from_millis(10),
        Duration::from_secs(30),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_sweep_cold_cache_and_conditions() {
    let (url, _m) = start(Cfg {
        delay_ms: 1,
        ..Default::default()
    })
    .await;
    let r = session(&options(&url, suite("concurrency = [1, 3]", FIXED))).await;
    assert_eq!(r.runs.len(), 2, "{r:#?}");
    for run in &r.runs {
        assert!(run.validity.valid, "{:#?}", run.validity);
        let c = &run.conditions;
        assert_eq!(c.engine.as_ref().unwrap().value, "mock");
        assert_eq!(c.engine_version.as_ref().unwrap().value, "9.9");
        assert_eq!(c.model.as_ref().unwrap().value, "mock");
        assert_eq!(c.spec.state, SpecState::Off);
        assert_eq!(c.cache.verified, Some(true), "{}", c.cache.note);
        assert_eq!(c.cache.hits, Some(0));
        assert_eq!(c.cache.reset, Some(true));
        assert_eq!(c.kv.capacity_tokens.as_ref().unwrap().value, 16 * 512);
        assert_eq!(c.lengths.input_exact, Some(true));
        assert_eq!(
            (c.lengths.output_min, c.lengths.output_max),
            (Some(12), Some(12))
        );
        assert_eq!(c.token_sources, vec![TokenSource::Usage]);
        assert_eq!(c.thinking.sent, Some(false));
        assert!(c.kv.peak_usage.is_some());
        assert_eq!(run.requests.len(), 6);
        for q in &run.requests {
            assert!(q.ok, "{q:?}");
            assert_eq!(q.input_tokens_counted, Some(48));
            assert_eq!(q.prompt_tokens, Some(48), "the mock counts bytes");
            let ttft = q.ttft_s.unwrap();
            assert!(ttft > 0.0 && ttft <= q.e2e_s.unwrap());
            assert!(q.tpot_s.unwrap() > 0.0);
        }
        let t = run
            .presented_throughput()
            .expect("valid runs present throughput");
        assert_eq!(t.output_tokens, 72);
        assert!(t.output_tok_per_s > 0.0);
        // Every token gap of the requests outside the closed loop's opening wave.
        let measured = 6 - run.latency.opening_wave_excluded;
        assert_eq!(
            run.latency.opening_wave_excluded,
            if run.label == "c=1" { 0 } else { 3 }
        );
        assert!(run.latency.itl.as_ref().unwrap().n >= measured * 11);
    }
    let md = rigbench::e2e::render_markdown(&r);
    let cond = md.find("### Conditions").unwrap();
    assert!(
        cond < md.find("### Latency").unwrap()
            && md.find("### Latency").unwrap() < md.find("### Throughput").unwrap()
    );
    let dir = tempfile::tempdir().unwrap();
    let plots = rigbench::e2e::write_plots(&r, dir.path()).unwrap();
    assert_eq!(plots, vec!["e2e_latency.svg"]);
    let svg = std::fs::read_to_string(dir.path().join("e2e_latency.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("TTFT p50"));
    // Round trip through the results schema.
    let v = serde_json::to_string(&r).unwrap();
    let back: E2eResults = serde_json::from_str(&v).unwrap();
    assert_eq!(back.runs.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_decoding_multi_token_chunks_and_acceptance() {
    let (url, _m) = start(Cfg {
        spec_k: 3,
        ..Default::default()
    })
    .await;
    let mut s = suite("concurrency = [2]", FIXED);
    s.workload.output_tokens = 20;
    let r = session(&options(&url, s)).await;
    let run = &r.runs[0];
    let c = &run.conditions;
    assert_eq!(c.spec.state, SpecState::On);
    assert_eq!(c.spec.k.as_ref().unwrap().value, 3);
    let (drafts, dt, acc) = (
        c.spec.drafts.unwrap(),
        c.spec.draft_tokens.unwrap(),
        c.spec.accepted_tokens.unwrap(),
    );
    assert_eq!(dt, 3 * drafts);
    assert_eq!(
        acc + drafts,
        6 * 20,
        "each draft step emits 1 + accepted tokens"
    );
    assert!(
        (c.spec.mean_acceptance_length.unwrap() - (1.0 + acc as f64 / drafts as f64)).abs() < 1e-12
    );
    assert_eq!(c.spec.per_position.len(), 3);
    assert!(
        c.spec.per_position[0] >= c.spec.per_position[1]
            && c.spec.per_position[1] >= c.spec.per_position[2]
    );
    // Chunks carry several tokens: counted by tokens (continuous usage), not chunks.
    for q in &run.requests {
        assert_eq!(q.output_tokens, Some(20));
        assert!(q.chunks < 20, "{} chunks for 20 tokens", q.chunks);
        assert_eq!(q.chunk_split, Some(ChunkSplit::UsagePerChunk));
    }
    // Without a method the condition is unknown: listed with the run, which stays valid (only
    // what the run shows invalidates it).
    assert!(run.validity.valid, "{:?}", run.validity);
    assert!(
        run.validity
            .missing_conditions
            .iter()
            .any(|m| m.contains("speculative method")),
        "{:?}",
        run.validity
    );
    assert!(run.throughput.is_some());
    let md = rigbench::e2e::render_markdown(&r);
    assert!(md.contains("acceptance by draft position"), "{md}");
    if std::env::var("E2E_SHOW").is_ok() {
        eprintln!("{md}");
    }

    // Stated method: complete.
    let mut s = suite("concurrency = [2]", FIXED);
    s.workload.output_tokens = 20;
    let mut o = options(&url, s);
    o.spec_method = Some("ngram".into());
    let r = session(&o).await;
    assert!(r.runs[0].validity.valid, "{:?}", r.runs[0].validity);
    assert!(r.runs[0]
        .conditions
        .spec
        .method
        .as_ref()
        .unwrap()
        .source
        .contains("stated"));
    let dir = tempfile::tempdir().unwrap();
    let plots = rigbench::e2e::write_plots(&r, dir.path()).unwrap();
    assert!(plots.contains(&"e2e_acceptance_by_position.svg".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_with_thinking_off_is_flagged_and_ttfc_follows_reasoning() {
    let (url, _m) = start(Cfg {
        reasoning: true,
        delay_ms: 2,
        ..Default::default()
    })
    .await;
    let r = session(&options(&url, suite("concurrency = [2]", FIXED))).await;
    let run = &r.runs[0];
    assert_eq!(run.conditions.thinking.requests_with_reasoning, 6);
    assert!(run
        .conditions
        .thinking
        .flag
        .as_ref()
        .unwrap()
        .contains("thinking off"));
    assert!(!run.validity.valid);
    for q in &run.requests {
        assert!(
            q.ttfc_s.unwrap() > q.ttft_s.unwrap(),
            "content comes after the reasoning"
        );
        assert!(q.reasoning_chars > 0);
    }
    // Thinking on: no flag.
    let mut s = suite("concurrency = [2]", FIXED);
    s.sampling.thinking = Some(true);
    let r = session(&options(&url, s)).await;
    assert!(r.runs[0].conditions.thinking.flag.is_none());
    assert!(r.runs[0].validity.valid, "{:?}", r.runs[0].validity);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_replay_measures_hits_and_tokenizer_counts_without_usage() {
    let (url, _m) = start(Cfg {
        no_usage: true,
        ..Default::default()
    })
    .await;
    let r = session(&options(
        &url,
        suite("concurrency = [2]\ncache = 'warm'", FIXED),
    ))
    .await;
    let c = &r.runs[0].conditions;
    assert_eq!(c.cache.verified, Some(true), "{}", c.cache.note);
    assert!(c.cache.hit_rate.unwrap() > 0.5);
    // No usage: counts come from the engine's /tokenize (bytes in the mock), source recorded.
    assert_eq!(c.token_sources, vec![TokenSource::EngineTokenizer]);
    let q = &r.runs[0].requests[0];
    assert_eq!(
        q.output_tokens,
        Some("tok0 ".len() as u64 * 10 + "tok10 tok11 ".len() as u64)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_records_late_arrivals() {
    let (url, _m) = start(Cfg {
        delay_ms: 5,
        ..Default::default()
    })
    .await;
    // 200 req/s with one request in flight at a time: most arrivals must wait.
    let r = session(&options(
        &url,
        suite("mode = 'open'\nrates = [200.0]\nmax_concurrency = 1", FIXED),
    ))
    .await;
    let run = &r.runs[0];
    let l = run.lateness.as_ref().expect("open loop records lateness");
    assert_eq!(l.arrivals, 6);
    assert!(l.late >= 3, "{l:?}");
    assert!(run
        .requests
        .iter()
        .all(|q| q.scheduled_s.is_some() && q.lateness_s.is_some()));
    assert!(
        run.validity.valid,
        "lateness is data, not a failure: {:?}",
        run.validity
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_sse_fails_the_request_and_the_run() {
    let (url, _m) = start(Cfg {
        malformed_after: Some(4),
        ..Default::default()
    })
    .await;
    let mut s = suite("concurrency = [1]", FIXED);
    s.load.warmup = 0;
    let r = session(&options(&url, s)).await;
    let run = &r.runs[0];
    assert!(run.requests.iter().all(|q| !q.ok));
    assert!(
        run.requests[0]
            .error
            .as_ref()
            .unwrap()
            .contains("malformed SSE"),
        "{:?}",
        run.requests[0].error
    );
    assert!(!run.validity.valid);
    assert!(run.presented_throughput().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_keeps_what_was_measured() {
    // Interrupt once a few requests have ended at the client, and while one is certain to be
    // in flight, whatever the machine's load: the mock holds every streamed request from the
    // fifth on (it sends nothing until the client goes away), and the interrupt comes once the
    // fifth has arrived. At concurrency 2 each of the client's two workers sends its next
    // request only when its previous one has ended, so by then at least 3 have ended (kept),
    // the fourth may be in flight or done, and the fifth is in flight (cancelled). (The mock's
    // own count of finished streams would not do: it counts a stream finished when its last
    // event is queued, and under load the client had read none of 3 such streams.)
    let (url, m) = start(Cfg {
        delay_ms: 20,
        hold_from: Some(5),
        ..Default::default()
    })
    .await;
    let mut s = suite("concurrency = [2, 4]", FIXED);
    s.load.warmup = 0;
    s.load.requests = 40;
    let o = options(&url, s);
    let stop = StopSignal::new();
    let s2 = stop.clone();
    tokio::spawn(async move {
        while m.started.load(Ordering::SeqCst) < 5 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        s2.trigger(StopCause::Interrupted);
    });
    let r = run_session(&o, stop, &mut |_| {}).await.unwrap();
    assert!(r.interrupted);
    assert_eq!(r.runs.len(), 1);
    assert_eq!(r.skipped.len(), 1, "{:?}", r.skipped);
    let run = &r.runs[0];
    assert_eq!(run.stop, ExecStop::Interrupted);
    let ok = run.requests.iter().filter(|q| q.ok).count();
    let cancelled = run.requests.iter().filter(|q| q.cancelled).count();
    assert!((3..=4).contains(&ok), "completed requests are kept ({ok})");
    assert!((1..=2).contains(&cancelled), "{cancelled}");
    assert!(!run.validity.valid);
    assert!(
        run.latency.ttft.is_some(),
        "what was measured is summarized"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_that_dies_ends_the_session_with_completed_requests_kept() {
    let (url, _m) = start(Cfg {
        delay_ms: 2,
        // 4 measured requests and the session's prompt-overhead probe.
        die_after: Some(5),
        ..Default::default()
    })
    .await;
    let mut s = suite("concurrency = [1, 2]", FIXED);
    s.load.warmup = 0;
    s.load.requests = 12;
    let r = session(&options(&url, s)).await;
    assert_eq!(r.runs.len(), 1, "{:#?}", r.skipped);
    let run = &r.runs[0];
    assert!(
        matches!(run.stop, ExecStop::EngineFailed(_)),
        "{:?}",
        run.stop
    );
    assert_eq!(run.requests.iter().filter(|q| q.ok).count(), 4);
    assert!(run.requests.iter().any(|q| !q.ok));
    assert!(
        r.failure.as_ref().unwrap().contains("unreachable"),
        "{:?}",
        r.failure
    );
    assert_eq!(r.skipped.len(), 1);
    assert!(!run.validity.valid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_writes_a_report_folder() {
    let (url, _m) = start(Cfg::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rep");
    let out2 = out.clone();
    // A real vLLM log given with --engine-log (tests/fixtures/real/logs/).
    let log = Some(common::real_fixture(
        "logs/03_vllm-v0.24_qwen3.6-35b-a3b-nvfp4-modelopt_rtx5090_kv-pool__club3090-issue-612.log",
    ));
    let log2 = log.clone();
    let status = tokio::task::spawn_blocking(move || {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_rigbench"));
        cmd.args([
            "e2e",
            "--url",
            &url,
            "--no-progress",
            "--requests",
            "3",
            "--concurrency",
            "1,2",
            "--out",
        ])
        .arg(&out2);
        if let Some(l) = &log2 {
            cmd.arg("--engine-log").arg(l);
        }
        cmd.output().unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert!(status.status.success(), "{stderr}");
    for f in [
        "report.md",
        "results.json",
        "e2e_runs.csv",
        "e2e_requests.csv",
        "e2e_latency.svg",
    ] {
        assert!(out.join(f).is_file(), "{f} missing; {stderr}");
    }
    let md = format!(
        "{}\n{}",
        std::fs::read_to_string(out.join("report.md")).unwrap(),
        std::fs::read_to_string(out.join("report-details.md")).unwrap_or_default()
    );
    assert!(
        md.contains("### Conditions") && md.contains("### Throughput"),
        "{md}"
    );
    if log.is_some() {
        assert!(
            md.contains("Engine log findings")
                && md.contains("567,978 tokens")
                && md.contains("modelopt"),
            "{md}"
        );
    }
    let r = rigbench::report::Results::load(&out.join("results.json")).unwrap();
    assert!(r.complete);
    let e = r.e2e.unwrap();
    assert_eq!(e.runs.len(), 2);
    assert!(e.runs.iter().all(|r| r.validity.valid));
    let csv = std::fs::read_to_string(out.join("e2e_requests.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_template_prefix_hits_are_allowed_but_bounded() {
    // A 40-token template before every user message: its two full blocks hit on every request
    // after the first, which a cold run must tolerate (and only that).
    let (url, _m) = start(Cfg {
        template_tokens: 40,
        ..Default::default()
    })
    .await;
    let r = session(&options(&url, suite("concurrency = [2]", FIXED))).await;
    let c = &r.runs[0].conditions.cache;
    assert_eq!(c.hits, Some(5 * 32), "{}", c.note);
    assert_eq!(c.hits_allowed, 6 * 40);
    assert_eq!(c.verified, Some(true), "{}", c.note);
    assert!(c.note.contains("within"), "{}", c.note);
    assert!(r.runs[0].validity.valid, "{:?}", r.runs[0].validity);
    // The completions API has no template: the same hits contradict a cold run.
    let mut s = suite("concurrency = [2]", FIXED);
    s.workload.api = rigbench::e2e::client::Api::Completions;
    s.sampling.thinking = None;
    let r = session(&options(&url, s)).await;
    let c = &r.runs[0].conditions.cache;
    assert_eq!(c.verified, Some(false), "{}", c.note);
    assert!(!r.runs[0].validity.valid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_limit_stops_new_requests() {
    let (url, _m) = start(Cfg {
        delay_ms: 10,
        ..Default::default()
    })
    .await;
    let mut s = suite("concurrency = [2]\nduration_s = 0.3", FIXED);
    s.load.requests = 100;
    s.load.warmup = 0;
    let r = session(&options(&url, s)).await;
    let run = &r.runs[0];
    assert_eq!(run.stop, ExecStop::DurationLimit);
    let n = run.requests.len();
    assert!((2..20).contains(&n), "{n} requests sent in 0.3 s");
    assert!(
        run.requests.iter().all(|q| q.ok),
        "requests in flight finish"
    );
    assert!(run
        .validity
        .notes
        .iter()
        .any(|n| n.contains("duration limit")));
}
