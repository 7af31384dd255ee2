//! Hostile engines on loopback (docs/reliability.md, "Hostile engines"): impossible numbers
//! (token counts beyond `max_tokens`, NaN block counts, negative gauges, a `u64::MAX` `/tokenize`
//! count), endless bodies, a stalled `/metrics`, an engine that wants an API key, invalid UTF-8
//! on the engine's pipes, an engine that leaves its process group (`setsid`), rigbench killed
//! with SIGKILL, a busy port, flags out of range, and secrets of every common shape in engine
//! output (`tests/fixtures/secrets/corpus.txt`): 0 of them in any output file.

use std::convert::Infallible;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use rigbench::e2e::executor::StopSignal;
use rigbench::e2e::launcher::{EngineChoice, EngineHandle};
use rigbench::e2e::workload::Suite;
use rigbench::e2e::{run_session, E2eOptions};
use rigbench::output::redact::Redactor;

use crate::common;
use common::{alive, free_port, read_pid, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_rigbench");

/// What the mock engine does wrong.
#[derive(Clone, Debug, Default)]
struct Hostile {
    /// `usage.completion_tokens` claimed in the final chunk (None: the true count).
    claim_tokens: Option<u64>,
    /// `/metrics` text (None: 404).
    metrics: Option<String>,
    /// `/metrics` never answers.
    stall_metrics: bool,
    /// `/tokenize` answers this count.
    tokenize_count: Option<Value>,
    /// Streams answer 500 with an endless body.
    endless_500: bool,
    /// `/v1/models` answers an endless body.
    endless_models: bool,
    /// Every route but /health wants `Authorization: Bearer KEY`.
    key: Option<String>,
    /// `/version` and `/v1/models` never answer.
    stall_side: bool,
}

fn chunk(text: &str) -> String {
    format!(
        "data: {}\n\n",
        json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
    )
}

/// A body that never ends: 1 MiB chunks of `x`, for ever.
fn endless() -> Body {
    let s = futures::stream::repeat_with(|| Ok::<_, Infallible>(Bytes::from(vec![b'x'; 1 << 20])));
    Body::from_stream(s)
}

fn authorized(h: &Hostile, headers: &HeaderMap) -> bool {
    match &h.key {
        None => true,
        Some(k) => {
            headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                == Some(format!("Bearer {k}").as_str())
        }
    }
}

fn refused() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"error": {"message": "Unauthorized", "code": 401}})),
    )
        .into_response()
}

async fn start_mock(h: Hostile) -> String {
    let h = Arc::new(h);
    let gen = {
        let h = h.clone();
        move |headers: HeaderMap, Json(body): Json<Value>| {
            let h = h.clone();
            async move {
                if !authorized(&h, &headers) {
                    return refused();
                }
                if body["stream"] == json!(false) {
                    return Json(json!({"choices": [{"index": 0, "message": {"content": "a"}, "finish_reason": "length"}], "usage": {"prompt_tokens": 8, "completion_tokens": 1}})).into_response();
                }
                if h.endless_500 {
                    return Response::builder().status(500).body(endless()).unwrap();
                }
                let n = body["max_tokens"].as_u64().unwrap_or(4);
                let mut s = String::new();
                for _ in 0..n {
                    s.push_str(&chunk("a"));
                }
                let claimed = h.claim_tokens.unwrap_or(n);
                s.push_str(&format!(
                    "data: {}\n\n",
                    json!({"choices": [], "usage": {"prompt_tokens": 16, "completion_tokens": claimed}})
                ));
                s.push_str("data: [DONE]\n\n");
                Response::builder()
                    .header(header::CONTENT_TYPE, "text/event-stream")
                    .body(Body::from(s))
                    .unwrap()
            }
        }
    };
    let models = {
        let h = h.clone();
        move |headers: HeaderMap| {
            let h = h.clone();
            async move {
                if !authorized(&h, &headers) {
                    return refused();
                }
                if h.endless_models {
                    return Response::builder().body(endless()).unwrap();
                }
                if h.stall_side {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                Json(json!({"data": [{"id": "mock", "owned_by": "tests"}]})).into_response()
            }
        }
    };
    let metrics = {
        let h = h.clone();
        move || {
            let h = h.clone();
            async move {
                if h.stall_metrics {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                match &h.metrics {
                    Some(m) => m.clone().into_response(),
                    None => StatusCode::NOT_FOUND.into_response(),
                }
            }
        }
    };
    let tokenize = {
        let h = h.clone();
        move |Json(b): Json<Value>| {
            let h = h.clone();
            async move {
                let n = b.get("prompt").and_then(Value::as_str).map_or(0, str::len);
                let count = h.tokenize_count.clone().unwrap_or(json!(n));
                Json(json!({"count": count, "max_model_len": 4096}))
            }
        }
    };
    let version = {
        let h = h.clone();
        move || {
            let h = h.clone();
            async move {
                if h.stall_side {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                Json(json!({"version": "0.0-mock"})).into_response()
            }
        }
    };
    let app = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/version", get(version))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize))
        .route("/v1/completions", post(gen.clone()))
        .route("/v1/chat/completions", post(gen));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

fn suite(requests: usize, output_tokens: u32) -> Suite {
    let text = format!(
        "name = 'hostile'\n[workload]\nkind = 'fixed'\ninput_tokens = 16\noutput_tokens = {output_tokens}\nignore_eos = true\n[load]\nrequests = {requests}\nwarmup = 0\nconcurrency = [1]\n[sampling]\nthinking = false\n"
    );
    Suite::from_toml(&text, Path::new("hostile.toml")).unwrap()
}

fn opts(url: String, requests: usize, output_tokens: u32) -> E2eOptions {
    let mut o = E2eOptions::with_suite(suite(requests, output_tokens));
    o.engine = EngineChoice::Url { url };
    o.progress = false;
    o.handle_ctrl_c = false;
    o.metrics_interval = Duration::from_millis(50);
    o.request_timeout = Duration::from_secs(30);
    o
}

/// A session that must end (a hang is a failure, not a slow pass).
async fn session(o: &E2eOptions) -> rigbench::e2e::E2eResults {
    tokio::time::timeout(
        Duration::from_secs(300),
        run_session(o, StopSignal::new(), &mut |_| {}),
    )
    .await
    .expect("the session ended")
    .expect("the session ran")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_counts_beyond_max_tokens_fail_the_request_with_the_reason() {
    // 10^12 and u64::MAX made e2e allocate one latency sample per claimed token; 1,000,000 for
    // max_tokens 32 gave 49.5 M tok/s. Each is now an impossible count, the request failed.
    for claim in [1_000_000u64, 1_000_000_000_000, u64::MAX, 33] {
        let url = start_mock(Hostile {
            claim_tokens: Some(claim),
            ..Default::default()
        })
        .await;
        let r = session(&opts(url, 2, 32)).await;
        let reqs = &r.runs[0].requests;
        assert_eq!(reqs.len(), 2, "{:?}", r.failure);
        for q in reqs {
            assert!(
                !q.ok,
                "a claim of {claim} tokens for max_tokens 32 was taken"
            );
            let e = q.error.as_deref().unwrap_or_default();
            assert!(
                e.contains("impossible token count")
                    && e.contains(&claim.to_string())
                    && e.contains("max_tokens 32"),
                "{e}"
            );
        }
        assert!(r.runs[0].presented_throughput().is_none());
    }
    // The true count (32) still passes.
    let url = start_mock(Hostile::default()).await;
    let r = session(&opts(url, 2, 32)).await;
    assert!(r.runs[0]
        .requests
        .iter()
        .all(|q| q.ok && q.output_tokens == Some(32)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_gauges_block_counts_and_tokenize_counts_are_rejected_with_the_reason() {
    let metrics = "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"NaN\"} 1\n\
                   vllm:kv_cache_usage_perc{model_name=\"m\"} -1e308\n\
                   vllm:num_requests_running{model_name=\"m\"} -5\n"
        .to_string();
    let url = start_mock(Hostile {
        metrics: Some(metrics),
        tokenize_count: Some(json!(u64::MAX)),
        ..Default::default()
    })
    .await;
    let r = session(&opts(url, 2, 8)).await;
    let run = &r.runs[0];
    let kv = &run.conditions.kv;
    // "KV capacity 0 tokens" from a NaN block count: now unknown, with the reason.
    assert_eq!(kv.capacity_tokens, None);
    assert!(
        kv.capacity_note
            .as_deref()
            .unwrap_or_default()
            .contains("num_gpu_blocks=\"NaN\""),
        "{:?}",
        kv.capacity_note
    );
    // Peak KV "-inf%" from a negative usage gauge: now no figure, and the reason kept.
    assert_eq!(kv.peak_usage, None);
    assert_eq!(kv.max_running, None);
    let rejected = run.polls.rejected.join(" | ");
    assert!(
        rejected.contains("vllm:kv_cache_usage_perc = -1e308 is impossible"),
        "{rejected}"
    );
    assert!(
        rejected.contains("vllm:num_requests_running = -5 is impossible"),
        "{rejected}"
    );
    // A u64::MAX /tokenize count: refused, never "chat template adds -18446744073709551616".
    let note = r.engine.facts.tokenize_note.as_deref().unwrap_or_default();
    assert!(!r.engine.facts.tokenize, "{note}");
    assert!(
        note.contains("impossible `count` 18446744073709551615"),
        "{note}"
    );
    let md = rigbench::e2e::render::render_markdown(&r);
    assert!(
        !md.contains("-inf") && !md.contains("-18446744073709551616"),
        "{md}"
    );
    assert!(
        md.contains("is impossible"),
        "the report says what was rejected"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_bodies_are_read_only_up_to_their_limit() {
    // A 500 whose body never ends: the request fails with the status, the body cut at 64 KiB.
    let url = start_mock(Hostile {
        endless_500: true,
        ..Default::default()
    })
    .await;
    let r = session(&opts(url, 2, 8)).await;
    for q in &r.runs[0].requests {
        assert!(!q.ok);
        assert_eq!(q.http_status, Some(500));
        let e = q.error.as_deref().unwrap_or_default();
        assert!(
            e.starts_with("HTTP 500") && e.len() < 1000,
            "{}",
            &e[..e.len().min(300)]
        );
    }
    // /v1/models that never ends: refused at the 16 MiB limit, named.
    let url = start_mock(Hostile {
        endless_models: true,
        ..Default::default()
    })
    .await;
    let c = rigbench::e2e::client::EngineClient::new(&url).unwrap();
    let e = tokio::time::timeout(Duration::from_secs(120), c.models())
        .await
        .expect("the read ended")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("GET /v1/models") && e.contains("over rigbench's limit of 16777216 bytes"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_metrics_endpoint_is_reported_as_stalled() {
    let url = start_mock(Hostile {
        stall_metrics: true,
        ..Default::default()
    })
    .await;
    let c = rigbench::e2e::client::EngineClient::new(&url).unwrap();
    let e = c.metrics().await.unwrap_err().to_string();
    assert!(
        e.contains("GET /metrics stalled: no whole answer within 5 s"),
        "{e}"
    );
    let r = session(&opts(url, 1, 4)).await;
    let note = r.engine.facts.metrics_note.as_deref().unwrap_or_default();
    assert!(note.contains("stalled"), "{note}");
    assert!(r.runs[0]
        .polls
        .rejected
        .iter()
        .any(|x| x.contains("stalled")));
    assert_ne!(r.runs[0].conditions.spec.evidence, "no /metrics");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_version_and_models_cost_seconds_and_say_why() {
    // Each used to cost 30 s, with nothing said; now 5 s each at most, with the reason kept.
    let url = start_mock(Hostile {
        stall_side: true,
        ..Default::default()
    })
    .await;
    let t = Instant::now();
    let r = session(&opts(url, 1, 4)).await;
    let notes = r.engine.facts.side_notes.join("; ");
    assert!(
        notes.contains("GET /version stalled: no whole answer within 5 s")
            && notes.contains("GET /v1/models stalled"),
        "{notes}"
    );
    // The run itself is unaffected: its requests are served (the mock's token counts are not
    // what this test checks; its prompt-length check has its own tests).
    assert!(
        !r.runs[0].requests.is_empty() && r.runs[0].requests.iter().all(|q| q.ok),
        "the run itself is unaffected"
    );
    assert!(t.elapsed() < Duration::from_secs(40), "{:?}", t.elapsed());
}

// ---------------------------------------------------------------------------------------------
// The CLI against real processes.

fn all_files_text(dir: &Path) -> String {
    let mut s = String::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                s.push_str(&String::from_utf8_lossy(&std::fs::read(&p).unwrap()));
                s.push('\n');
            }
        }
    }
    s
}

/// Every (secret, line) of the corpus.
fn corpus() -> Vec<(String, String)> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/secrets/corpus.txt");
    let text = std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("the secrets corpus {} is missing: {e}", p.display()));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (v, t) = l.split_once('\t').expect("VALUE<TAB>LINE");
            assert!(t.contains(v), "{l}");
            (v.to_string(), t.to_string())
        })
        .collect()
}

#[test]
fn every_secret_shape_of_the_corpus_is_redacted_from_its_line() {
    let c = corpus();
    assert!(c.len() >= 25);
    let r = Redactor::with_literals(Vec::new(), true);
    for (v, t) in &c {
        let out = r.redact(t);
        assert!(!out.contains(v.as_str()), "'{v}' survived: {out}");
        assert!(out.contains("<token>") || out.contains("<user>"), "{out}");
    }
    // Also inside JSON: a secret-named key hides every string under it (a list of keys too).
    let mut j = json!({"args": {"api_key": ["abc123def456"], "max_tokens": 512, "tokenizer": "Qwen/Qwen3-8B"}});
    r.redact_json(&mut j);
    assert_eq!(j["args"]["api_key"], json!(["<token>"]));
    assert_eq!(j["args"]["max_tokens"], json!(512));
    assert_eq!(j["args"]["tokenizer"], json!("Qwen/Qwen3-8B"));
}

#[test]
fn no_secret_of_the_corpus_reaches_results_report_log_diagnose_or_baseline() {
    let c = corpus();
    let d = tempfile::tempdir().unwrap();
    let lines = d.path().join("engine-says.txt");
    let mut text: String = c.iter().map(|(_, t)| format!("{t}\n")).collect();
    // An engine that prints HF_TOKEN's value alone, and escape codes around a word.
    let hf_value = "Qm9vYmFyQmF6UXV4MTIzNDU2Nzg5";
    text.push_str(&format!(
        "{hf_value}\n\u{1b}]0;retitled\u{7}\u{1b}[2Jcleared\n"
    ));
    std::fs::write(&lines, text).unwrap();
    let port = free_port();
    let out = d.path().join("rep");
    let cmd = format!(
        "cat {} >&2; cat {} ; exec {BIN} serve --model synthetic:tiny --port {port}",
        lines.display(),
        lines.display()
    );
    let o = Command::new(BIN)
        .args(["e2e", "--no-progress", "--engine-cmd", &cmd, "--port"])
        .arg(port.to_string())
        .args([
            "--requests",
            "2",
            "--concurrency",
            "1",
            "--output-tokens",
            "4",
            "--out",
        ])
        .arg(&out)
        .env("HF_TOKEN", hf_value)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(out.join("results.json").is_file(), "{stderr}");
    let log = std::fs::read_to_string(out.join("engine.log")).unwrap();
    assert!(
        log.contains("non-default args"),
        "the engine's lines were captured"
    );
    // diagnose over the raw lines (as a user would run it on a saved log).
    let diag = d.path().join("diag");
    let od = Command::new(BIN)
        .args(["diagnose", "--log"])
        .arg(&lines)
        .arg("--out")
        .arg(&diag)
        .env("HF_TOKEN", hf_value)
        .output()
        .unwrap();
    assert!(
        diag.join("diagnose.json").is_file(),
        "{}",
        String::from_utf8_lossy(&od.stderr)
    );
    let all = format!(
        "{}{}{stderr}{}",
        all_files_text(&out),
        all_files_text(&diag),
        String::from_utf8_lossy(&o.stdout)
    );
    let mut leaked: Vec<&str> = c
        .iter()
        .map(|(v, _)| v.as_str())
        .filter(|v| all.contains(v))
        .collect();
    if all.contains(hf_value) {
        leaked.push(hf_value);
    }
    assert!(leaked.is_empty(), "secrets in the output files: {leaked:?}");
    assert!(!all.contains('\u{1b}'), "an escape code reached an output");
    // A baseline saved from results that hold the raw lines (as a `--no-redact` run's would):
    // redacted on the way in, since baselines are committed.
    let mut v: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    v["complete"] = json!(true);
    v["e2e"]["engine_log"] = json!(std::fs::read_to_string(&lines).unwrap());
    v["e2e"]["engine"]["command"] = json!(c
        .iter()
        .map(|(_, t)| t.as_str())
        .collect::<Vec<_>>()
        .join(" ; "));
    let raw = d.path().join("raw.json");
    std::fs::write(&raw, serde_json::to_string(&v).unwrap()).unwrap();
    let results = rigbench::report::Results::load(&raw).unwrap();
    let bdir = d.path().join("baselines");
    rigbench::compare::baseline::save_baseline(&results, &bdir, "hostile", false).unwrap();
    let b = all_files_text(&bdir);
    let leaked: Vec<&str> = c
        .iter()
        .map(|(v, _)| v.as_str())
        .filter(|v| b.contains(v))
        .collect();
    assert!(
        leaked.is_empty(),
        "secrets in the saved baseline: {leaked:?}"
    );
}

#[test]
fn invalid_utf8_on_both_pipes_keeps_the_engine_alive_and_every_line() {
    // One byte that is not UTF-8 stopped the log reader, which closed the pipe: on stdout the
    // engine died at its next write, on stderr 1 of 4,002 lines was kept.
    let d = tempfile::tempdir().unwrap();
    let port = free_port();
    let cmd = format!(
        "printf 'out \\377\\376 first\\n'; i=0; while [ $i -lt 4000 ]; do printf 'err line %d \\377\\n' $i >&2; i=$((i+1)); done; printf 'out \\300 second\\n'; exec {BIN} serve --model synthetic:tiny --port {port}"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let stop = StopSignal::new();
        let choice = EngineChoice::Command {
            command: cmd,
            url: format!("http://127.0.0.1:{port}"),
        };
        let mut h = EngineHandle::start(&choice, Duration::from_secs(300), &stop)
            .await
            .expect("the engine lived through its invalid UTF-8 and became healthy");
        let log = h.log_text();
        h.stop().await;
        let err_lines = log.lines().filter(|l| l.starts_with("err line ")).count();
        let out_lines = log.lines().filter(|l| l.starts_with("out ")).count();
        assert_eq!((out_lines, err_lines), (2, 4000), "all 4,002 lines kept");
        assert!(log.contains("err line 3999 \u{FFFD}"));
        assert!(log.contains("out \u{FFFD}\u{FFFD} first"));
    });
    drop(d);
}

/// Start `cmd` as an engine at `port`, read the pid of the process that left the engine's
/// process group from `pidfile`, stop the engine and check its log says so loudly; the process
/// must then be gone within 20 s (`what` names it in a failure).
fn escaped_process_is_stopped(cmd: String, port: u16, pidfile: &std::path::Path, what: &str) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pid = rt.block_on(async {
        let stop = StopSignal::new();
        let choice = EngineChoice::Command {
            command: cmd,
            url: format!("http://127.0.0.1:{port}"),
        };
        let mut h = EngineHandle::start(&choice, Duration::from_secs(300), &stop)
            .await
            .expect("healthy");
        assert!(wait_until(Duration::from_secs(20), || read_pid(pidfile).is_some()));
        let pid = read_pid(pidfile).expect("the escaped process's pid");
        assert!(alive(pid));
        h.stop().await;
        let log = h.log_text();
        assert!(
            log.contains("left the engine's process group (setsid)"),
            "said loudly; the engine log:\n{log}"
        );
        pid
    });
    assert!(
        wait_until(Duration::from_secs(20), || !alive(pid)),
        "the {what} {pid} outlived the stop"
    );
}

#[test]
fn an_engine_that_calls_setsid_is_still_stopped() {
    let d = tempfile::tempdir().unwrap();
    let port = free_port();
    let pidfile = d.path().join("srv.pid");
    // The server leaves the engine's process group and session; the shell waits for it.
    let cmd = format!(
        "setsid {BIN} serve --model synthetic:tiny --port {port} & echo $! > {}; wait",
        pidfile.display()
    );
    escaped_process_is_stopped(cmd, port, &pidfile, "setsid server");
}

#[test]
fn an_engine_that_forks_away_with_setsid_f_is_still_stopped() {
    // `setsid -f` forks, the child detaches and its parent exits at once: the detached process
    // is init's child before any scan sees it as the engine's descendant, so it used to
    // survive rigbench. It keeps the engine's environment tag, by which it is found.
    let d = tempfile::tempdir().unwrap();
    let port = free_port();
    let pidfile = d.path().join("daemon.pid");
    let cmd = format!(
        "setsid -f sh -c 'echo $$ > {}; exec sleep 600'; exec {BIN} serve --model synthetic:tiny --port {port}",
        pidfile.display()
    );
    escaped_process_is_stopped(cmd, port, &pidfile, "setsid -f process");
}

#[test]
fn an_engine_dies_with_rigbench_even_when_rigbench_is_sigkilled() {
    let d = tempfile::tempdir().unwrap();
    let port = free_port();
    let pidfile = d.path().join("srv.pid");
    let cmd = format!(
        "echo $$ > {}; exec {BIN} serve --model synthetic:tiny --port {port}",
        pidfile.display()
    );
    let mut child = Command::new(BIN)
        .args(["e2e", "--no-progress", "--engine-cmd", &cmd, "--port"])
        .arg(port.to_string())
        .args([
            "--requests",
            "100000",
            "--concurrency",
            "1",
            "--output-tokens",
            "64",
            "--out",
        ])
        .arg(d.path().join("rep"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(300), || read_pid(&pidfile)
            .is_some_and(alive)),
        "the engine started"
    );
    let srv = read_pid(&pidfile).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: SIGKILL to the rigbench this test started.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGKILL);
    }
    let _ = child.wait();
    assert!(
        wait_until(Duration::from_secs(20), || !alive(srv)),
        "the engine {srv} outlived a SIGKILLed rigbench"
    );
}

#[test]
fn a_busy_port_is_refused_before_the_engine_starts() {
    let d = tempfile::tempdir().unwrap();
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = other.local_addr().unwrap().port();
    let marker = d.path().join("started");
    let cmd = format!("touch {}; sleep 60", marker.display());
    let o = Command::new(BIN)
        .args(["e2e", "--no-progress", "--engine-cmd", &cmd, "--port"])
        .arg(port.to_string())
        .args(["--requests", "2", "--out"])
        .arg(d.path().join("rep"))
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        e.contains(&format!("port {port}")) && e.contains("--engine-cmd"),
        "{e}"
    );
    assert!(
        !marker.exists(),
        "the engine command ran although its port was busy"
    );
    drop(other);
}

#[test]
fn an_engine_that_wants_a_key_gets_it_from_the_flag_or_the_environment_and_it_is_never_written() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let key = "sk-test-0123456789abcdefghij";
    let url = rt.block_on(start_mock(Hostile {
        key: Some(key.into()),
        ..Default::default()
    }));
    let d = tempfile::tempdir().unwrap();
    let run = |args: &[&str], env_key: Option<&str>, out: &Path| {
        let mut c = Command::new(BIN);
        c.args([
            "e2e",
            "--no-progress",
            "--url",
            &url,
            "--requests",
            "2",
            "--concurrency",
            "1",
            "--output-tokens",
            "4",
            "--out",
        ])
        .arg(out)
        .args(args)
        .env_remove("OPENAI_API_KEY");
        if let Some(k) = env_key {
            c.env("OPENAI_API_KEY", k);
        }
        rt.block_on(async {
            tokio::task::spawn_blocking(move || c.output().unwrap())
                .await
                .unwrap()
        })
    };
    // Without a key: the 401 names the fix.
    let o = run(&[], None, &d.path().join("nokey"));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        e.contains("--api-key") && e.contains("OPENAI_API_KEY"),
        "{e}"
    );
    // With --api-key, then with OPENAI_API_KEY: the run works and the key is nowhere.
    for (i, (args, env)) in [(vec!["--api-key", key], None), (vec![], Some(key))]
        .into_iter()
        .enumerate()
    {
        let out = d.path().join(format!("key{i}"));
        let o = run(&args, env, &out);
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        let results = std::fs::read_to_string(out.join("results.json")).expect(&stderr);
        let v: Value = serde_json::from_str(&results).unwrap();
        let ok = v
            .pointer("/e2e/runs/0/requests")
            .and_then(Value::as_array)
            .map_or(0, |r| r.iter().filter(|q| q["ok"] == json!(true)).count());
        assert_eq!(ok, 2, "{stderr}");
        let all = format!(
            "{}{stderr}{}",
            all_files_text(&out),
            String::from_utf8_lossy(&o.stdout)
        );
        assert!(!all.contains(key), "the API key reached an output");
    }
}

#[test]
fn out_of_range_flags_are_refused_naming_the_flag_and_the_range() {
    for (flag, value, want) in [
        ("--request-timeout", "1e30", "at most 604800 seconds"),
        ("--startup-timeout", "1e30", "at most 604800 seconds"),
        ("--warmup-requests", "4000000000", "0..=10000"),
        ("--requests", "100000000", "1..=100000"),
        ("--rate", "1e-9", "outside the range rigbench takes: 0.001"),
        (
            "--output-tokens",
            "4000000000",
            "above the most rigbench takes (1048576)",
        ),
        (
            "--concurrency",
            "4000000000",
            "above the most rigbench takes (100000)",
        ),
    ] {
        let o = Command::new(BIN)
            .args([
                "e2e",
                "--no-progress",
                "--url",
                "http://127.0.0.1:9",
                flag,
                value,
            ])
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{flag} {value} was taken");
        assert!(e.contains(flag) && e.contains(want), "{flag} {value}: {e}");
        assert!(!e.contains("panicked"), "{e}");
    }
}
