//! Trace replay, SLO goodput and energy against small mock engines (axum on 127.0.0.1:0):
//! - a mock that counts identical prefixes (whitespace tokens, 16-token blocks) confirms the
//!   prefix reuse a trace implies, token for token;
//! - a mock with a scripted latency distribution (every 5th request slow; or slow whenever more
//!   than 4 requests are in flight) gives the goodput and the search answer the script implies;
//! - a mock power source gives the energy of the window.
use crate::common;
use common::session;

use std::convert::Infallible;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
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

use rigbench::e2e::client::Api;
use rigbench::e2e::energy::{MockPower, PowerChoice};
use rigbench::e2e::goodput::{SearchAxis, SearchSpec, Slo};
use rigbench::e2e::trace::{Trace, TraceWindow};
use rigbench::e2e::trace_replay::TraceSpec;
use rigbench::e2e::workload::Suite;
use rigbench::e2e::E2eOptions;

/// The mock's prefix-cache block, tokens (as vLLM's default block size).
const BLOCK: usize = 16;

#[derive(Clone, Copy, Default)]
enum Latency {
    /// 2 ms to the first token.
    #[default]
    Fast,
    /// Every 5th request (by arrival) waits 400 ms before its first token.
    EveryFifthSlow,
    /// A request arriving while more than 4 are in flight (itself included) waits 400 ms.
    SlowAbove4,
}

#[derive(Default)]
struct Mock {
    latency: Latency,
    /// Token lists of every prompt seen (whitespace tokens).
    prompts: Mutex<Vec<Vec<String>>>,
    arrivals: AtomicU64,
    in_flight: AtomicU64,
}

/// Tokens served from the cache: the longest common token prefix with any earlier prompt,
/// in whole blocks.
fn cached(seen: &[Vec<String>], toks: &[String]) -> usize {
    let common = seen
        .iter()
        .map(|p| p.iter().zip(toks).take_while(|(a, b)| a == b).count())
        .max()
        .unwrap_or(0);
    common / BLOCK * BLOCK
}

async fn generate(State(m): State<Arc<Mock>>, Json(body): Json<Value>) -> Response {
    let prompt = body
        .get("prompt")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| {
            body.get("messages")
                .and_then(Value::as_array)
                .map(|ms| {
                    ms.iter()
                        .filter_map(|x| x.get("content").and_then(Value::as_str))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default()
        });
    let toks: Vec<String> = prompt.split_whitespace().map(str::to_string).collect();
    let hit = {
        let mut seen = m.prompts.lock().unwrap();
        let h = cached(&seen, &toks);
        seen.push(toks.clone());
        h
    };
    let n = m.arrivals.fetch_add(1, Ordering::SeqCst);
    let flying = m.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let slow = match m.latency {
        Latency::Fast => false,
        Latency::EveryFifthSlow => n % 5 == 4,
        Latency::SlowAbove4 => flying > 4,
    };
    let max_tokens = body.get("max_tokens").and_then(Value::as_u64).unwrap_or(8);
    let (tx, rx) = tokio::sync::mpsc::channel::<String>(64);
    let m2 = m.clone();
    let chat = body.get("messages").is_some();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(if slow { 400 } else { 2 })).await;
        let chunk = |t: &str| {
            if chat {
                json!({"choices":[{"index":0,"delta":{"content": t}}]})
            } else {
                json!({"choices":[{"index":0,"text": t}]})
            }
        };
        for i in 0..max_tokens {
            if tx
                .send(format!("data: {}\n\n", chunk(&format!("w{i} "))))
                .await
                .is_err()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Out of flight before the client can see the end (a closed loop's next request then
        // never counts this one).
        m2.in_flight.fetch_sub(1, Ordering::SeqCst);
        let usage = json!({"prompt_tokens": toks.len(), "completion_tokens": max_tokens,
            "prompt_tokens_details": {"cached_tokens": hit}});
        let mut fin = chunk("");
        fin["choices"][0]["finish_reason"] = json!("length");
        let _ = tx.send(format!("data: {fin}\n\n")).await;
        let _ = tx
            .send(format!(
                "data: {}\n\n",
                json!({"choices": [], "usage": usage})
            ))
            .await;
        let _ = tx.send("data: [DONE]\n\n".to_string()).await;
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(
            ReceiverStream::new(rx).map(Ok::<String, Infallible>),
        ))
        .unwrap()
}

async fn start(latency: Latency) -> (String, Arc<Mock>) {
    let mock = Arc::new(Mock {
        latency,
        ..Default::default()
    });
    let app = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(|| async { Json(json!({"data": [{"id": "mock", "owned_by": "tests"}]})) }),
        )
        .route(
            "/tokenize",
            post(|Json(b): Json<Value>| async move {
                let n = b
                    .get("prompt")
                    .and_then(Value::as_str)
                    .map_or(0, |p| p.split_whitespace().count());
                Json(json!({"count": n, "max_model_len": 8192}))
            }),
        )
        .route(
            "/reset_prefix_cache",
            post(|State(m): State<Arc<Mock>>| async move {
                m.prompts.lock().unwrap().clear();
                "ok"
            }),
        )
        .route("/v1/chat/completions", post(generate))
        .route("/v1/completions", post(generate))
        .with_state(mock.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), mock)
}

fn suite(load: &str) -> Suite {
    let text = format!(
        "name = 'mock'\n[workload]\nkind = 'fixed'\napi = 'completions'\ninput_tokens = 24\noutput_tokens = 8\nignore_eos = true\n[load]\n{load}\nwarmup = 0\n[sampling]\ntemperature = 0.0\n"
    );
    Suite::from_toml(&text, Path::new("mock.toml")).unwrap()
}

fn options(url: &str, suite: Suite) -> E2eOptions {
    common::url_session_options(
        url,
        suite,
        Duration::from_millis(20),
        Duration::from_secs(30),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_counting_engine_confirms_the_implied_reuse_token_for_token() {
    let (url, m) = start(Latency::Fast).await;
    let mut o = options(&url, suite("concurrency = [1]\nrequests = 1"));
    // The built-in agentic trace: vLLM timed_trace records, 16 tokens per hash id, 6 sessions
    // of 5 growing steps sharing a 192-token system prompt; replayed 20 times faster.
    let trace = Trace::load("agentic", None, None).unwrap();
    let planned = trace.requests();
    o.trace = Some(TraceSpec {
        trace,
        window: TraceWindow {
            speed: 20.0,
            ..Default::default()
        },
    });
    o.suite.load.mode = rigbench::e2e::workload::LoadMode::Open;
    o.suite.load.arrival = rigbench::e2e::workload::ArrivalKind::Trace;
    o.suite.load.rates = vec![1.0];
    let res = session(&o).await;
    assert_eq!(res.runs.len(), 1, "{:?} {:?}", res.failure, res.skipped);
    let r = &res.runs[0];
    let t = r.trace.as_ref().expect("trace summary");
    assert_eq!(t.requests, planned);
    assert_eq!(t.sessions, 6);
    assert_eq!(t.not_token_exact, 0);
    assert!(t.implied_prefix_reuse > 0);
    // Token for token: the engine's cached tokens are the trace's implied reuse.
    assert_eq!(
        t.engine_cached_tokens,
        Some(t.implied_prefix_reuse),
        "{t:?}"
    );
    assert_eq!(t.reuse_gap, Some(0));
    // Every prompt has exactly the trace's input length.
    for req in &r.requests {
        assert_eq!(req.prompt_tokens, req.input_tokens_requested, "{req:?}");
    }
    assert!(t.send_lag_p99_s.is_some_and(|l| l >= 0.0));
    assert_eq!(m.prompts.lock().unwrap().len(), planned);
    let md = rigbench::e2e::render_markdown(&res);
    assert!(
        md.contains("### Trace replay") && md.contains("### Metric definitions"),
        "{md}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goodput_matches_the_scripted_distribution_within_its_interval() {
    let (url, _m) = start(Latency::EveryFifthSlow).await;
    let mut o = options(&url, suite("concurrency = [1]\nrequests = 40"));
    o.slo = Some(Slo::parse("ttft=200ms").unwrap());
    let res = session(&o).await;
    let g = res.runs[0].goodput.as_ref().expect("goodput");
    // 40 consecutive arrivals: 8 slow whatever request the count starts on.
    assert_eq!(g.requests, 40);
    assert!(
        g.wilson_low <= 0.8 && 0.8 <= g.wilson_high,
        "the scripted 80 % lies outside [{}, {}]",
        g.wilson_low,
        g.wilson_high
    );
    assert_eq!(g.requests_meeting, 32, "{g:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_search_finds_the_concurrency_the_script_implies() {
    let (url, _m) = start(Latency::SlowAbove4).await;
    let mut o = options(&url, suite("concurrency = [1]\nrequests = 24"));
    o.slo = Some(Slo::parse("ttft=200ms").unwrap());
    let mut spec = SearchSpec::new(SearchAxis::Concurrency, 1.0);
    // 23 judged requests all meeting: Wilson low 0.857, so a target of 0.8 can pass.
    spec.target = 0.8;
    o.goodput_search = Some(spec);
    let res = session(&o).await;
    let s = res.goodput_search.as_ref().expect("search");
    let loads: Vec<f64> = s.probes.iter().map(|p| p.load).collect();
    assert_eq!(loads, vec![1.0, 2.0, 4.0, 8.0, 6.0, 5.0], "{s:?}");
    // The mock is slow above 4 requests in flight: c <= 4 always meets the SLO and c >= 6 never
    // does; at c = 5 a request meets it when it ran before the fifth arrived, so that probe may
    // fail or sit at the target within its interval (seen both ways under load). Either way the
    // answer is the load just below the lowest failing one.
    let a = s.answer.expect("an answer");
    assert!(a == 4.0 || a == 5.0, "{s:?}");
    assert_eq!(s.lowest_fail, Some(a + 1.0), "{s:?}");
    assert_eq!(res.runs.len(), s.probes.len(), "every probe's run is kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mock_power_source_gives_the_windows_energy() {
    let (url, _m) = start(Latency::Fast).await;
    let mut o = options(&url, suite("concurrency = [2]\nrequests = 30"));
    o.power = PowerChoice::Source(Arc::new(|| Box::new(MockPower::new(|_| 250.0))));
    o.suite.workload.api = Api::Completions;
    let res = session(&o).await;
    let r = &res.runs[0];
    let e = r.energy.as_ref().expect("energy");
    assert!(r.energy_unknown.is_none());
    // Constant 250 W: joules = 250 W × the span the samples cover, within 1 %.
    let covered = e.coverage * e.window_s;
    assert!(
        (e.joules - 250.0 * covered).abs() / (250.0 * covered) < 0.01,
        "{e:?}"
    );
    let out = r
        .throughput
        .as_ref()
        .or(r.throughput_invalid.as_ref())
        .unwrap()
        .output_tokens as f64;
    assert!((e.j_per_output_token.unwrap() - e.joules / out).abs() < 1e-9);
    assert!(e.j_per_total_token.unwrap() < e.j_per_output_token.unwrap());
}

/// Bad serving flags and trace files get a clear error naming the flag or the file and line,
/// before any engine starts.
#[test]
fn bad_flags_and_traces_name_the_flag_or_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad_trace.jsonl");
    std::fs::write(
        &bad,
        "{\"timestamp\": 0, \"input_length\": 40, \"output_length\": 4, \"hash_ids\": [1, 2, 3]}\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_rigbench"))
            .arg("e2e")
            .args(args)
            .args(["--out", dir.path().join("out").to_str().unwrap()])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, err) = run(&["--slo", "ttft=fast"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("--slo"), "{err}");
    let (code, err) = run(&["--trace", bad.to_str().unwrap()]);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("bad_trace.jsonl")
            && err.contains("line 1")
            && err.contains("--trace-block-tokens"),
        "{err}"
    );
    let (_, err) = run(&["--trace", "no-such-trace"]);
    assert!(err.contains("--trace") && err.contains("agentic"), "{err}");
    let (_, err) = run(&["--goodput-search"]);
    assert!(err.contains("--slo"), "{err}");
}
