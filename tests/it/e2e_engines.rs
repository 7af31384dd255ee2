//! e2e against engines other than vLLM, as a new user meets them: a plain OpenAI-compatible
//! server (no /health, no /metrics, no /version, no /tokenize), llama.cpp's `llama-server`
//! (/props, /slots, `timings` in the last chunk), SGLang (/get_server_info) and newer vLLM's
//! per-request speculative metrics in the last SSE chunk. Mock servers on 127.0.0.1:0.

use std::convert::Infallible;
use std::path::Path;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use rigbench::e2e::conditions::SpecState;
use rigbench::e2e::engines::Stated;
use rigbench::e2e::executor::StopSignal;
use rigbench::e2e::launcher::{EngineChoice, EngineHandle};
use rigbench::e2e::workload::Suite;
use rigbench::e2e::{run_session, E2eOptions, E2eResults};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Plain,
    Llamacpp,
    Sglang,
    VllmSse,
}

async fn generate(State(kind): State<Kind>, Json(body): Json<Value>) -> Response {
    let chat = body.get("messages").is_some();
    let max = body.get("max_tokens").and_then(Value::as_u64).unwrap_or(8);
    let mut out = String::new();
    for i in 0..max {
        let text = format!("word{i} ");
        let v = if chat {
            json!({"choices":[{"index":0,"delta":{"content": text}}]})
        } else {
            json!({"choices":[{"index":0,"text": text}]})
        };
        out.push_str(&format!("data: {v}\n\n"));
    }
    let mut last = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "usage": {"prompt_tokens": 40, "completion_tokens": max}});
    match kind {
        Kind::Llamacpp => {
            last["timings"] = json!({"predicted_n": max, "draft_n": 40, "draft_n_accepted": 10});
        }
        Kind::VllmSse => {
            last["metrics"] = json!({"speculative_decoding": {"num_spec_steps": 43, "num_accepted_draft_tokens": 10, "num_draft_tokens": 129, "num_spec_tokens": 3, "acceptance_histogram": [39, 1, 0, 3]}});
        }
        _ => {}
    }
    out.push_str(&format!("data: {last}\n\ndata: [DONE]\n\n"));
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(futures::stream::iter([Ok::<
            _,
            Infallible,
        >(out)])))
        .unwrap()
}

async fn start(kind: Kind) -> String {
    let mut app = Router::new()
        .route(
            "/v1/models",
            get(|| async {
                Json(json!({"object": "list", "data": [{"id": "m", "object": "model"}]}))
            }),
        )
        .route("/v1/chat/completions", post(generate))
        .route("/v1/completions", post(generate));
    app = match kind {
        Kind::Plain => app.route("/health", get(|| async { StatusCode::NOT_FOUND })),
        Kind::Llamacpp => app
            .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
            .route(
                "/props",
                get(|| async {
                    Json(json!({"build_info": "b5462-a1b2c3d4", "total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}))
                }),
            )
            .route(
                "/slots",
                get(|| async {
                    Json(json!([
                        {"id": 0, "n_ctx": 4096, "speculative": true, "params": {"speculative.n_max": 4}},
                        {"id": 1, "n_ctx": 4096, "speculative": true, "params": {"speculative.n_max": 4}}
                    ]))
                }),
            )
            .route(
                "/metrics",
                get(|| async { "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 10\n" }),
            ),
        Kind::Sglang => app
            .route("/health", get(|| async { "" }))
            .route(
                "/get_server_info",
                get(|| async {
                    Json(json!({"version": "0.4.6.post1", "speculative_algorithm": null, "max_total_num_tokens": 46611, "context_length": 32768}))
                }),
            ),
        Kind::VllmSse => app
            .route("/health", get(|| async { "" }))
            .route("/version", get(|| async { Json(json!({"version": "0.30.0"})) })),
    };
    let app = app.with_state(kind);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

fn options(url: &str) -> E2eOptions {
    let text = "name = 'engines'\n[workload]\nkind = 'fixed'\ninput_tokens = 32\noutput_tokens = 8\nignore_eos = true\n[load]\nrequests = 3\nwarmup = 0\nconcurrency = [1]\ncache = 'cold'\n[sampling]\nthinking = false\n";
    let mut o = E2eOptions::with_suite(Suite::from_toml(text, Path::new("engines.toml")).unwrap());
    o.engine = EngineChoice::Url {
        url: url.to_string(),
    };
    o.progress = false;
    o.handle_ctrl_c = false;
    o.metrics_interval = Duration::from_millis(20);
    o.request_timeout = Duration::from_secs(30);
    o
}

async fn session(o: &E2eOptions) -> E2eResults {
    run_session(o, StopSignal::new(), &mut |_| {})
        .await
        .expect("session")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_openai_server_runs_valid_with_stated_conditions() {
    let url = start(Kind::Plain).await;
    // No statement: the unknown conditions are listed, the run is still valid.
    let r = session(&options(&url)).await;
    assert!(r.failure.is_none(), "{:?}", r.failure);
    let run = &r.runs[0];
    assert!(run.validity.valid, "{:#?}", run.validity);
    let missing = run.validity.missing_conditions.join("; ");
    for m in ["engine version", "speculative decoding", "KV capacity"] {
        assert!(missing.contains(m), "{m}: {missing}");
    }
    assert!(run.throughput.is_some());
    // Stated: marked as such, and no longer unknown.
    let mut o = options(&url);
    o.stated = Stated {
        engine_version: Some("1.2.3".into()),
        kv_capacity: Some(100_000),
        spec: Some(false),
    };
    let r = session(&o).await;
    let c = &r.runs[0].conditions;
    assert!(r.runs[0].validity.valid);
    let v = c.engine_version.as_ref().unwrap();
    assert_eq!(v.value, "1.2.3");
    assert!(v.source.contains("stated by the user"), "{}", v.source);
    assert!(c
        .kv
        .capacity_tokens
        .as_ref()
        .unwrap()
        .source
        .contains("stated by the user"));
    assert_eq!(c.spec.state, SpecState::Off);
    assert!(c.spec.evidence.contains("stated by the user"));
    let md = rigbench::e2e::render_markdown(&r);
    assert!(md.contains("stated by the user"), "{md}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_falls_back_to_models_and_unreachable_is_not_a_flag_error() {
    let url = start(Kind::Plain).await;
    let note = rigbench::e2e::engines::reach(&url, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        note.contains("/health answered 404") && note.contains("/v1/models answered 200"),
        "{note}"
    );
    // Nothing listening: an environment error (exit 1), not a bad command line.
    let e = EngineHandle::start(
        &EngineChoice::Url {
            url: "http://127.0.0.1:9".into(),
        },
        Duration::from_secs(5),
        &StopSignal::new(),
    )
    .await
    .unwrap_err();
    assert!(!e.chain().any(|c| matches!(
        c.downcast_ref::<rigbench::RigError>(),
        Some(rigbench::RigError::BadFlag { .. })
    )));
    assert!(e.to_string().contains("no engine answers"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llamacpp_props_slots_and_timings() {
    let url = start(Kind::Llamacpp).await;
    let r = session(&options(&url)).await;
    let c = &r.runs[0].conditions;
    assert_eq!(c.engine.as_ref().unwrap().value, "llama.cpp");
    assert_eq!(c.engine_version.as_ref().unwrap().value, "b5462-a1b2c3d4");
    // Two slots of 4,096 and no log saying whether they share one cache (kv_unified): unknown,
    // with both candidates (issue 44), never summed on an assumption.
    assert_eq!(c.kv.capacity_tokens, None);
    let why = c.kv.capacity_note.as_deref().unwrap_or_default();
    assert!(
        why.contains("4,096 tokens if the slots share one cache")
            && why.contains("8,192 if each has its own"),
        "{why}"
    );
    assert_eq!(c.spec.state, SpecState::On);
    // 3 requests × (10 accepted of 40 drafted).
    assert_eq!(
        (c.spec.accepted_tokens, c.spec.draft_tokens),
        (Some(30), Some(120))
    );
    assert_eq!(c.spec.acceptance_rate, Some(0.25));
    assert_eq!(c.spec.k.as_ref().unwrap().value, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_server_info() {
    let url = start(Kind::Sglang).await;
    let r = session(&options(&url)).await;
    let c = &r.runs[0].conditions;
    assert_eq!(c.engine.as_ref().unwrap().value, "sglang");
    assert_eq!(c.engine_version.as_ref().unwrap().value, "0.4.6.post1");
    assert_eq!(c.kv.capacity_tokens.as_ref().unwrap().value, 46611);
    assert_eq!(c.spec.state, SpecState::Off);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_per_request_spec_metrics_without_metrics_endpoint() {
    let url = start(Kind::VllmSse).await;
    let r = session(&options(&url)).await;
    let c = &r.runs[0].conditions;
    assert_eq!(c.spec.state, SpecState::On, "{}", c.spec.evidence);
    assert_eq!(c.spec.k.as_ref().unwrap().value, 3);
    assert_eq!(c.spec.drafts, Some(3 * 43));
    assert!((c.spec.acceptance_rate.unwrap() - 10.0 / 129.0).abs() < 1e-12);
    assert!((c.spec.mean_acceptance_length.unwrap() - (1.0 + 10.0 / 43.0)).abs() < 1e-12);
    assert!(r.runs[0].requests.iter().all(|q| q.spec.is_some()));
}
