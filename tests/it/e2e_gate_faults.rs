//! The end-to-end faults of issue 13, each reproduced with a mock OpenAI-compatible engine
//! (axum on 127.0.0.1:0) and checked against the right value: the closed loop's opening burst,
//! truncated fixed-length runs, nondeterminism, usage counts that disagree with the text,
//! single-chunk answers, sampled KV peaks, a KV capacity label that states a wrong derivation,
//! and prompt lengths that do not say what they count.
use crate::common;
use common::session;

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::Path;
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

use rigbench::e2e::metrics::TokenSource;
use rigbench::e2e::workload::Suite;
use rigbench::e2e::E2eOptions;

#[derive(Clone)]
struct Cfg {
    /// One prefill slot: each request holds it this long before its first token.
    prefill_ms: u64,
    /// Delay between decoded tokens.
    decode_ms: u64,
    /// Stop after this many tokens (with `finish_reason` "length"), whatever was asked.
    stop_at: Option<u64>,
    /// `usage.completion_tokens` as this percentage of the tokens sent (100: exact).
    usage_percent: u64,
    /// Every token in one chunk.
    one_chunk: bool,
    /// The second answer to the same prompt differs.
    nondeterministic: bool,
    /// Chat template tokens around the user message.
    template_tokens: u64,
    /// `vllm:cache_config_info` labels.
    cache_info: &'static str,
    /// Send no `usage` object (llama.cpp without per-chunk usage): tokens are re-counted.
    no_usage: bool,
}

impl Default for Cfg {
    fn default() -> Self {
        Cfg {
            prefill_ms: 0,
            decode_ms: 1,
            stop_at: None,
            usage_percent: 100,
            one_chunk: false,
            nondeterministic: false,
            template_tokens: 0,
            cache_info: "block_size=\"16\",num_gpu_blocks=\"512\"",
            no_usage: false,
        }
    }
}

struct Mock {
    cfg: Cfg,
    prefill: tokio::sync::Mutex<()>,
    running: Mutex<u64>,
    seen: Mutex<HashMap<String, u64>>,
}

/// Tokens of a text: whitespace-separated words (the mock's tokenizer), plus a BOS when special
/// tokens are asked for (the default of a real `/tokenize`).
fn count(text: &str, add_special: bool) -> u64 {
    text.split_whitespace().count() as u64 + u64::from(add_special)
}

async fn metrics(State(m): State<Arc<Mock>>) -> String {
    let running = *m.running.lock().unwrap();
    format!(
        "vllm:prefix_cache_queries_total{{model_name=\"mock\"}} 0\n\
         vllm:prefix_cache_hits_total{{model_name=\"mock\"}} 0\n\
         vllm:num_preemptions_total{{model_name=\"mock\"}} 0\n\
         vllm:num_requests_running{{model_name=\"mock\"}} {running}\n\
         vllm:num_requests_waiting{{model_name=\"mock\"}} 0\n\
         vllm:kv_cache_usage_perc{{model_name=\"mock\"}} {}\n\
         vllm:cache_config_info{{{},model_name=\"mock\"}} 1.0\n",
        running as f64 * 0.1,
        m.cfg.cache_info
    )
}

async fn generate(State(m): State<Arc<Mock>>, Json(body): Json<Value>) -> Response {
    let prompt = body
        .pointer("/messages/0/content")
        .or_else(|| body.get("prompt"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let chat = body.get("messages").is_some();
    let max_tokens = body.get("max_tokens").and_then(Value::as_u64).unwrap_or(16);
    let nth = {
        let mut seen = m.seen.lock().unwrap();
        let n = seen.entry(prompt.clone()).or_insert(0);
        *n += 1;
        *n
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<String>(256);
    let m2 = m.clone();
    tokio::spawn(async move {
        let cfg = m2.cfg.clone();
        *m2.running.lock().unwrap() += 1;
        if cfg.prefill_ms > 0 {
            let _slot = m2.prefill.lock().await;
            tokio::time::sleep(Duration::from_millis(cfg.prefill_ms)).await;
        }
        let n = cfg.stop_at.map_or(max_tokens, |s| s.min(max_tokens));
        let words: Vec<String> = (0..n)
            .map(|i| {
                if cfg.nondeterministic && nth > 1 && i == n / 2 {
                    format!("other{nth} ")
                } else {
                    format!("w{i} ")
                }
            })
            .collect();
        let prompt_tokens = count(&prompt, false) + cfg.template_tokens;
        let delta = |text: &str| {
            if chat {
                json!({"choices":[{"index":0,"delta":{"content": text}}]})
            } else {
                json!({"choices":[{"index":0,"text": text}]})
            }
        };
        let chunks: Vec<String> = if cfg.one_chunk {
            vec![words.concat()]
        } else {
            words
        };
        for c in chunks {
            if tx.send(format!("data: {}\n\n", delta(&c))).await.is_err() {
                *m2.running.lock().unwrap() -= 1;
                return;
            }
            tokio::time::sleep(Duration::from_millis(cfg.decode_ms)).await;
        }
        let mut fin = delta("");
        fin["choices"][0]["finish_reason"] = json!("length");
        let _ = tx.send(format!("data: {fin}\n\n")).await;
        let usage = json!({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n * cfg.usage_percent / 100}});
        if !cfg.no_usage {
            let _ = tx.send(format!("data: {usage}\n\n")).await;
        }
        let _ = tx.send("data: [DONE]\n\n".to_string()).await;
        *m2.running.lock().unwrap() -= 1;
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(
            ReceiverStream::new(rx).map(Ok::<String, Infallible>),
        ))
        .unwrap()
}

async fn start(cfg: Cfg) -> String {
    let mock = Arc::new(Mock {
        cfg,
        prefill: tokio::sync::Mutex::new(()),
        running: Mutex::new(0),
        seen: Mutex::new(HashMap::new()),
    });
    let app = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/version",
            get(|| async { Json(json!({"engine": "mock", "version": "1.0"})) }),
        )
        .route(
            "/v1/models",
            get(|| async { Json(json!({"data": [{"id": "mock", "owned_by": "tests"}]})) }),
        )
        .route(
            "/tokenize",
            post(|Json(b): Json<Value>| async move {
                let text = b.get("prompt").and_then(Value::as_str).unwrap_or("");
                let special = b
                    .get("add_special_tokens")
                    .and_then(Value::as_bool)
                    .unwrap_or(true);
                Json(json!({"count": count(text, special), "max_model_len": 8192}))
            }),
        )
        .route("/reset_prefix_cache", post(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route("/v1/chat/completions", post(generate))
        .route("/v1/completions", post(generate))
        .with_state(mock);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

fn suite(load: &str, workload: &str) -> Suite {
    let text = format!(
        "name = 'faults'\n[workload]\n{workload}\n[load]\n{load}\n[sampling]\nthinking = false\ntemperature = 0.0\n"
    );
    Suite::from_toml(&text, Path::new("faults.toml")).unwrap()
}

fn options(url: &str, suite: Suite) -> E2eOptions {
    common::url_session_options(
        url,
        suite,
        Duration::from_millis(20),
        Duration::from_secs(60),
    )
}

const FIXED: &str = "kind = 'fixed'\ninput_tokens = 16\noutput_tokens = 12\nignore_eos = true";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_opening_burst_is_left_out_of_the_latency_statistics() {
    // One prefill slot (100 ms per prefill), 40 tokens decoded at 10 ms: the 4 requests
    // released together after the warm-up queue for prefill (TTFT ≈ 100, 200, 300, 400 ms);
    // in steady state a request waits for at most part of one other prefill.
    let url = start(Cfg {
        prefill_ms: 100,
        decode_ms: 10,
        ..Default::default()
    })
    .await;
    let workload = "kind = 'fixed'\ninput_tokens = 16\noutput_tokens = 40\nignore_eos = true";
    let r = session(&options(
        &url,
        suite("concurrency = [4]\nwarmup = 4\nrequests = 16", workload),
    ))
    .await;
    let run = &r.runs[0];
    assert!(run.validity.valid, "{:?}", run.validity);
    let wave: Vec<f64> = run
        .requests
        .iter()
        .filter(|q| q.opening_wave)
        .map(|q| q.ttft_s.unwrap())
        .collect();
    assert_eq!(wave.len(), 4);
    let worst_wave = wave.iter().copied().fold(0.0, f64::max);
    assert!(worst_wave > 0.35, "the burst queued: {wave:?}");
    let ttft = run.latency.ttft.as_ref().unwrap();
    assert_eq!(ttft.n, 12, "the opening wave is left out");
    assert_eq!(run.latency.opening_wave_excluded, 4);
    // Steady state: about one to two prefills (the issue measured 101–154 ms); with the burst
    // included p99 read 393 ms. (Relative to the burst, so a loaded machine does not matter.)
    assert!(
        ttft.p99 < 0.75 * worst_wave,
        "p99 TTFT {:.3} s vs the burst's {worst_wave:.3} s",
        ttft.p99
    );
    assert!(ttft.p50 >= 0.095, "every request waits for its own prefill");
    // Throughput still covers every request.
    assert_eq!(run.presented_throughput().unwrap().completed, 16);
    assert!(run
        .validity
        .notes
        .iter()
        .any(|n| n.contains("opening wave (4 requests")));
    let md = rigbench::e2e::render_markdown(&r);
    assert!(md.contains("opening wave"), "{md}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_length_runs_that_stop_short_are_truncated_and_present_no_throughput() {
    // ignore_eos with 40 tokens asked; the engine stops at 30 (75%: the old rule caught only
    // stops below 50%).
    let url = start(Cfg {
        stop_at: Some(30),
        ..Default::default()
    })
    .await;
    let workload = "kind = 'fixed'\ninput_tokens = 16\noutput_tokens = 40\nignore_eos = true";
    let r = session(&options(
        &url,
        suite("concurrency = [2]\nwarmup = 0\nrequests = 4", workload),
    ))
    .await;
    let run = &r.runs[0];
    assert!(!run.validity.valid);
    assert!(
        run.validity
            .reasons
            .iter()
            .any(|x| x.contains("4 of 4 outputs truncated")),
        "{:?}",
        run.validity
    );
    assert!(run
        .requests
        .iter()
        .all(|q| q.flags.contains(&"truncated: 30 of 40 tokens".to_string())));
    assert!(run.presented_throughput().is_none());
    // The same engine asked for 30: valid.
    let workload = "kind = 'fixed'\ninput_tokens = 16\noutput_tokens = 30\nignore_eos = true";
    let r = session(&options(
        &url,
        suite("concurrency = [2]\nwarmup = 0\nrequests = 4", workload),
    ))
    .await;
    assert!(r.runs[0].validity.valid, "{:?}", r.runs[0].validity);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_determinism_reports_different_outputs_at_temperature_zero() {
    let url = start(Cfg {
        nondeterministic: true,
        ..Default::default()
    })
    .await;
    let mut o = options(
        &url,
        suite("concurrency = [2]\nwarmup = 0\nrequests = 4", FIXED),
    );
    o.check_determinism = true;
    let r = session(&o).await;
    let d = r.determinism.as_ref().expect("ran");
    assert!(!d.deterministic());
    assert_eq!((d.prompts, d.differing.len(), d.identical), (4, 4, 0));
    assert_eq!(d.temperature, 0.0);
    // The texts differ from the middle token on ("w0 w1 ... w5 other2 ...").
    assert_eq!(d.differing[0].first_difference, "w0 w1 w2 w3 w4 w5 ".len());
    let md = rigbench::e2e::render_markdown(&r);
    let det = md
        .find("NONDETERMINISTIC: 4 of 4 prompts")
        .expect("reported");
    assert!(
        det < md.find("### Conditions").unwrap(),
        "ahead of every figure"
    );
    // And compare sees it.
    let mut res = rigbench::report::Results::new(Default::default(), "x".into(), "t".into());
    res.e2e = Some(r);
    let ids: Vec<String> = rigbench::compare::metrics_of(&res)
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert!(
        ids.contains(&"e2e/faults/determinism".to_string()),
        "{ids:?}"
    );

    // A deterministic engine.
    let url = start(Cfg::default()).await;
    let mut o = options(
        &url,
        suite("concurrency = [2]\nwarmup = 0\nrequests = 4", FIXED),
    );
    o.check_determinism = true;
    let r = session(&o).await;
    let d = r.determinism.as_ref().unwrap();
    assert!(d.deterministic(), "{}", d.summary());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_cross_checked_against_the_re_counted_text() {
    // Right usage: re-counting the whole text without special tokens agrees exactly (a BOS per
    // counted piece would have doubled a per-token count).
    let url = start(Cfg::default()).await;
    let r = session(&options(
        &url,
        suite("concurrency = [2]\nwarmup = 0\nrequests = 4", FIXED),
    ))
    .await;
    let c = &r.runs[0].conditions;
    assert_eq!(c.token_sources, vec![TokenSource::Usage]);
    let check = c.token_check.as_ref().expect("cross-checked");
    assert_eq!((check.checked, check.disagreeing), (4, 0));
    assert_eq!(check.max_rel_diff, 0.0);
    assert!(r.runs[0]
        .requests
        .iter()
        .all(|q| q.output_tokens_retokenized == Some(12)));

    // Usage that counts half the tokens sent: flagged on every request, with both numbers. (A
    // count above max_tokens, such as a double count here, is refused as impossible before any
    // cross-check: tests/it/hostile_engines.rs.)
    let url = start(Cfg {
        usage_percent: 50,
        ..Default::default()
    })
    .await;
    let r = session(&options(
        &url,
        suite("concurrency = [2]\nwarmup = 0\nrequests = 4", FIXED),
    ))
    .await;
    let run = &r.runs[0];
    let check = run.conditions.token_check.as_ref().unwrap();
    assert_eq!((check.checked, check.disagreeing), (4, 4));
    assert!((check.max_rel_diff - 1.0).abs() < 1e-12);
    assert!(run.requests.iter().all(|q| q
        .flags
        .contains(&"token count: usage 6 vs re-counted 12 (+100.0%)".to_string())));
    assert!(run
        .validity
        .notes
        .iter()
        .any(|n| n.contains("usage disagrees")));
    let md = rigbench::e2e::render_markdown(&r);
    assert!(
        md.contains("**4 of 4 requests disagree by more than 2%**"),
        "{md}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_chunk_answers_have_no_tpot_or_itl() {
    let url = start(Cfg {
        one_chunk: true,
        ..Default::default()
    })
    .await;
    let r = session(&options(
        &url,
        suite("concurrency = [1]\nwarmup = 0\nrequests = 4", FIXED),
    ))
    .await;
    let run = &r.runs[0];
    for q in &run.requests {
        assert_eq!(q.output_tokens, Some(12));
        assert_eq!(q.tpot_s, None, "decode time is not observable in one chunk");
        assert_eq!(q.itl_mean_s, None);
    }
    assert!(run.latency.tpot.is_none() && run.latency.itl.is_none());
    assert_eq!(run.latency.decode_not_observable, 4);
    assert!(run.latency.ttft.is_some());
    let md = rigbench::e2e::render_markdown(&r);
    assert!(
        md.contains("not observable: 4 requests arrived in one chunk"),
        "{md}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_state_only_derivations_that_hold() {
    // KV capacity stated as kv_cache_size_tokens, with blocks that do not multiply to it; a
    // chat template of 25 tokens around 64 content tokens; an external engine's KV peak sampled.
    let url = start(Cfg {
        template_tokens: 25,
        decode_ms: 2,
        cache_info: "block_size=\"4\",kv_cache_size_tokens=\"1179770\",num_gpu_blocks=\"20377\"",
        ..Default::default()
    })
    .await;
    let workload = "kind = 'fixed'\ninput_tokens = 64\noutput_tokens = 12\nignore_eos = true";
    let r = session(&options(
        &url,
        suite("concurrency = [2]\nwarmup = 0\nrequests = 4", workload),
    ))
    .await;
    let run = &r.runs[0];
    assert!(run.validity.valid, "{:?}", run.validity);
    let c = &run.conditions;
    assert_eq!(c.kv.capacity_tokens.as_ref().unwrap().value, 1_179_770);
    assert_eq!(c.lengths.template_tokens_mean, Some(25.0));
    assert_eq!(c.lengths.input_reported_mean, Some(89.0));
    let src = c.kv.peak_usage_source.as_deref().unwrap();
    assert!(
        src.starts_with(&format!(
            "sampled: the largest of {} /metrics scrapes",
            run.polls.polls
        )),
        "{src}"
    );
    let md = rigbench::e2e::render_markdown(&r);
    assert!(!md.contains("(20,377 blocks × 4)"), "{md}");
    assert!(md.contains("1,179,770 tokens"), "{md}");
    assert!(md.contains("20,377 blocks of 4 tokens, which make 81,508 tokens"));
    assert!(
        md.contains("64 content tokens per request, token-exact; the engine counted 89 prompt tokens per request: its chat template adds 25"),
        "{md}"
    );
    assert!(md.contains("(sampled, "), "{md}");
}

/// Issue 41: "bursty delivery" was claimed from a token count that included the tokenizer's BOS
/// (one token more than the chunks carried, so every request looked as if a chunk held two
/// tokens). Without `usage` the received text is re-counted by the engine's `/tokenize` without
/// special tokens (the mock adds a BOS when they are asked for): 12 tokens in 12 one-token
/// chunks, so no chunk is said to carry several tokens. (Whether the gaps between chunks look
/// like bursts depends on the mock's timing, not on the count, and is not asserted here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recount_without_usage_adds_no_bos_to_the_chunks() {
    let url = start(Cfg {
        no_usage: true,
        ..Default::default()
    })
    .await;
    let r = session(&options(
        &url,
        suite("concurrency = [2]\nwarmup = 0\nrequests = 4", FIXED),
    ))
    .await;
    let run = &r.runs[0];
    assert_eq!(
        run.conditions.token_sources,
        vec![TokenSource::EngineTokenizer]
    );
    assert_eq!(run.requests.len(), 4);
    for q in &run.requests {
        assert_eq!(q.output_tokens, Some(12), "{:?}", q.flags);
        assert_eq!(q.token_chunks, 12);
        let d = q.delivery.as_ref().expect("a streamed answer");
        assert_eq!((d.multi_token_chunks, d.extra_tokens), (0, 0), "{d:?}");
        assert!(
            !q.flags.iter().any(|f| f.contains("carried several tokens")),
            "{:?}",
            q.flags
        );
    }
}
