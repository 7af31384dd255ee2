//! The e2e driver against the real built-in server (`rigbench serve --model synthetic:tiny`)
//! over loopback HTTP: streaming and usage, every condition filled in, thinking on/off,
//! speculative decoding with per-position counters, cold vs warm with the hit counters, a client
//! abort, and an engine killed mid-run.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rigbench::e2e::client::{Api, EngineClient, GenRequest};
use rigbench::e2e::conditions::SpecState;
use rigbench::e2e::executor::{ExecStop, StopCause, StopSignal};
use rigbench::e2e::launcher::{EngineChoice, EngineHandle};
use rigbench::e2e::metrics::TokenSource;
use rigbench::e2e::workload::{CacheTemp, Suite};
use rigbench::e2e::{run_session, E2eOptions, E2eResults};

use crate::common;
use common::free_port;

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_rigbench"))
}

fn builtin(extra: &[&str]) -> EngineChoice {
    let mut args = vec!["--model".to_string(), "synthetic:tiny".to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    EngineChoice::Builtin {
        program: Some(exe()),
        args,
    }
}

/// The tiny suite, made smaller for tests.
fn tiny(concurrency: &[u32], requests: u32) -> Suite {
    let mut s = Suite::load("tiny").unwrap();
    s.load.concurrency = concurrency.to_vec();
    s.load.requests = requests;
    s.load.warmup = 1;
    s.workload.input_tokens = Some(32);
    s.workload.output_tokens = 16;
    s
}

fn options(engine: EngineChoice, suite: Suite) -> E2eOptions {
    let mut o = E2eOptions::with_suite(suite);
    o.engine = engine;
    o.progress = false;
    o.handle_ctrl_c = false;
    o.metrics_interval = Duration::from_millis(50);
    o.request_timeout = Duration::from_secs(120);
    o
}

async fn session(o: &E2eOptions) -> E2eResults {
    run_session(o, StopSignal::new(), &mut |_| {})
        .await
        .expect("session")
}

async fn start_engine(extra: &[&str]) -> (EngineHandle, StopSignal) {
    let stop = StopSignal::new();
    let h = EngineHandle::start(&builtin(extra), Duration::from_secs(120), &stop)
        .await
        .expect("rigbench serve starts");
    (h, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builtin_session_fills_every_condition() {
    let mut o = options(builtin(&[]), tiny(&[1, 2], 4));
    o.check_determinism = true;
    let r = session(&o).await;
    assert!(r.failure.is_none(), "{:?}", r.failure);
    // The built-in runtime is deterministic at temperature 0.
    let d = r.determinism.as_ref().expect("--check-determinism ran");
    assert!(d.deterministic(), "{}", d.summary());
    assert_eq!((d.prompts, d.identical), (4, 4));
    assert_eq!(r.runs.len(), 2);
    let boot = r
        .boot_log
        .as_ref()
        .expect("the captured serve log is parsed");
    let (log_kv, _) = boot.kv_capacity().expect("KV line in the serve log");
    for run in &r.runs {
        assert!(run.validity.valid, "{}: {:#?}", run.label, run.validity);
        let c = &run.conditions;
        assert_eq!(c.engine.as_ref().unwrap().value, "rigbench");
        assert_eq!(c.engine.as_ref().unwrap().source, "/version");
        assert_eq!(
            c.engine_version.as_ref().unwrap().value,
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(c.model.as_ref().unwrap().value, "synthetic:tiny");
        assert_eq!(c.thinking.sent, Some(false));
        assert!(c.thinking.flag.is_none());
        assert_eq!(c.spec.state, SpecState::Off);
        assert_eq!(c.cache.reset, Some(true));
        assert_eq!(c.cache.verified, Some(true), "{}", c.cache.note);
        assert!(c.cache.queries.unwrap() > 0);
        // KV capacity from /metrics agrees with the serve log's KV line.
        let kv = c.kv.capacity_tokens.as_ref().unwrap();
        assert!(kv.source.contains("cache_config_info"), "{}", kv.source);
        assert_eq!(kv.value, log_kv);
        // The peak comes from the server's high-water mark, not from polling (which read 0.0%
        // on short runs under --release).
        assert!(c.kv.peak_usage.unwrap() > 0.0, "{:?}", c.kv);
        assert!(
            c.kv.peak_usage_source
                .as_deref()
                .unwrap()
                .starts_with("high-water mark"),
            "{:?}",
            c.kv.peak_usage_source
        );
        assert_eq!(c.kv.preemptions, Some(0));
        assert_eq!(c.lengths.input_exact, Some(true));
        assert_eq!(
            (c.lengths.output_min, c.lengths.output_max),
            (Some(16), Some(16))
        );
        assert_eq!(c.token_sources, vec![TokenSource::Usage]);
        for q in &run.requests {
            assert!(q.ok, "{q:?}");
            assert_eq!(q.output_tokens, Some(16));
            assert!(q.prompt_tokens.unwrap() > 32, "chat template adds tokens");
            assert!(q.ttft_s.unwrap() <= q.e2e_s.unwrap());
            assert!(q.chunks >= 2, "streamed in chunks");
        }
        let t = run.presented_throughput().unwrap();
        assert_eq!(t.output_tokens, 4 * 16);
    }
    assert!(
        r.engine.exit.as_deref().unwrap_or("").contains("exit"),
        "{:?}",
        r.engine.exit
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_on_streams_reasoning_content_and_off_does_not() {
    let (mut engine, _stop) = start_engine(&[]).await;
    let client = EngineClient::new(&engine.url).unwrap();
    // A prompt that leaves a `<think>` open puts the built-in engine in its reasoning section.
    let req = |thinking| GenRequest {
        api: Api::Chat,
        model: "synthetic:tiny".into(),
        prompt: "Think first. <think>".into(),
        max_tokens: 12,
        ignore_eos: true,
        temperature: 1.0,
        seed: Some(1),
        thinking,
    };
    let never = futures::future::pending::<()>();
    let (_, on) = client
        .stream(&req(Some(true)), Duration::from_secs(60), never)
        .await;
    assert!(on.error.is_none(), "{:?}", on.error);
    assert!(
        !on.reasoning.is_empty(),
        "reasoning_content deltas expected"
    );
    assert!(on.events.iter().any(|e| e.reasoning_chars > 0));
    assert_eq!(on.usage.unwrap().completion_tokens, Some(12));
    let never = futures::future::pending::<()>();
    let (_, off) = client
        .stream(&req(Some(false)), Duration::from_secs(60), never)
        .await;
    assert!(off.error.is_none(), "{:?}", off.error);
    assert!(
        off.reasoning.is_empty(),
        "thinking off: no reasoning deltas"
    );
    engine.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_decoding_per_position_counters() {
    let mut s = tiny(&[2], 4);
    s.sampling.temperature = 0.0;
    s.workload.output_tokens = 32;
    let mut o = options(
        builtin(&[
            "--speculative-method",
            "ngram",
            "--num-speculative-tokens",
            "3",
        ]),
        s,
    );
    o.spec_method = Some("ngram".into());
    o.spec_k = Some(3);
    let r = session(&o).await;
    let c = &r.runs[0].conditions;
    assert_eq!(c.spec.state, SpecState::On, "{}", c.spec.evidence);
    let m = c.spec.method.as_ref().unwrap();
    assert_eq!((m.value.as_str(), m.source.as_str()), ("ngram", "/version"));
    assert_eq!(c.spec.k.as_ref().unwrap().value, 3);
    let drafts = c.spec.drafts.unwrap();
    let accepted = c.spec.accepted_tokens.unwrap();
    let drafted = c.spec.draft_tokens.unwrap();
    assert!(drafts > 0 && drafted >= drafts && drafted <= 3 * drafts);
    assert!((c.spec.acceptance_rate.unwrap() - accepted as f64 / drafted as f64).abs() < 1e-12);
    assert!(
        (c.spec.mean_acceptance_length.unwrap() - (1.0 + accepted as f64 / drafts as f64)).abs()
            < 1e-12
    );
    let pos = &c.spec.per_position;
    assert_eq!(pos.len(), 3);
    // Σ accepted per position = accepted tokens (vLLM's invariant), positions non-increasing.
    let sum: f64 = pos.iter().map(|p| p * drafts as f64).sum();
    assert!((sum - accepted as f64).abs() < 1e-6, "{sum} vs {accepted}");
    assert!(pos.windows(2).all(|w| w[0] >= w[1]), "{pos:?}");
    // Every request still produced exactly its tokens, counted from usage.
    for q in &r.runs[0].requests {
        assert_eq!(q.output_tokens, Some(32), "{q:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_then_warm_with_hit_counters() {
    let (mut engine, _stop) = start_engine(&[]).await;
    let url = EngineChoice::Url {
        url: engine.url.clone(),
    };
    let cold = session(&options(url.clone(), tiny(&[2], 4))).await;
    let c = &cold.runs[0].conditions.cache;
    assert_eq!(
        (c.temperature, c.hits, c.verified),
        (CacheTemp::Cold, Some(0), Some(true)),
        "{}",
        c.note
    );
    let mut s = tiny(&[2], 4);
    s.load.cache = CacheTemp::Warm;
    s.workload.input_tokens = Some(64);
    let warm = session(&options(url, s)).await;
    let c = &warm.runs[0].conditions.cache;
    assert_eq!(c.verified, Some(true), "{}", c.note);
    let rate = c.hit_rate.unwrap();
    // Replayed 64-token prompts hit their full blocks (the last partial block is recomputed).
    assert!(rate > 0.3 && rate <= 1.0, "{rate}");
    assert!(warm.runs[0].validity.valid, "{:?}", warm.runs[0].validity);
    engine.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_abort_frees_the_request_on_the_engine() {
    let (mut engine, _stop) = start_engine(&[]).await;
    let client = EngineClient::new(&engine.url).unwrap();
    let req = GenRequest {
        api: Api::Completions,
        model: "synthetic:tiny".into(),
        prompt: "[abort] once upon a time".into(),
        max_tokens: 4000,
        ignore_eos: true,
        temperature: 1.0,
        seed: Some(2),
        thinking: None,
    };
    let (_, out) = client
        .stream(
            &req,
            Duration::from_secs(60),
            tokio::time::sleep(Duration::from_millis(600)),
        )
        .await;
    assert!(out.cancelled, "{:?}", out.error);
    assert!(
        !out.events.is_empty(),
        "some tokens arrived before the abort"
    );
    // The engine frees the request: nothing runs any more.
    let mut running = None;
    for _ in 0..100 {
        let m = client.metrics().await.unwrap().unwrap();
        running = m.sum("vllm:num_requests_running");
        if running == Some(0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(running, Some(0.0));

    // The same through a session: Ctrl-C keeps what was measured.
    let mut s = tiny(&[2], 40);
    s.load.warmup = 0;
    let o = options(
        EngineChoice::Url {
            url: engine.url.clone(),
        },
        s,
    );
    let stop = StopSignal::new();
    let s2 = stop.clone();
    let m_client = client.clone();
    tokio::spawn(async move {
        // Interrupt once a few requests completed (the session's prompt-overhead probe is one
        // more success on the engine).
        for _ in 0..400 {
            if let Ok(Some(m)) = m_client.metrics().await {
                if m.sum("vllm:request_success").unwrap_or(0.0) >= 4.0 {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        s2.trigger(StopCause::Interrupted);
    });
    let r = run_session(&o, stop, &mut |_| {}).await.unwrap();
    assert!(r.interrupted);
    let run = &r.runs[0];
    assert_eq!(run.stop, ExecStop::Interrupted);
    assert!(
        run.requests.iter().filter(|q| q.ok).count() >= 1,
        "{:#?}",
        run.requests
    );
    assert!(run.requests.iter().any(|q| q.cancelled));
    assert!(!run.validity.valid);
    engine.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_killed_mid_run_keeps_completed_requests() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let command = format!(
        "echo $$ > '{}'; exec '{}' serve --model synthetic:tiny --host 127.0.0.1 --port {port}",
        pid_file.display(),
        exe().display()
    );
    let mut s = tiny(&[2, 4], 60);
    s.load.warmup = 0;
    let o = options(
        EngineChoice::Command {
            command,
            url: url.clone(),
        },
        s,
    );
    // 3 measured requests plus the session's prompt-overhead probe.
    let killer = tokio::spawn(kill_after_successes(url, pid_file, 4));
    let r = session(&o).await;
    killer.await.unwrap();
    assert_eq!(r.runs.len(), 1, "{:?}", r.skipped);
    let run = &r.runs[0];
    assert!(
        matches!(run.stop, ExecStop::EngineFailed(_)),
        "{:?}",
        run.stop
    );
    assert!(run.requests.iter().filter(|q| q.ok).count() >= 3);
    assert!(run.requests.iter().any(|q| !q.ok && !q.cancelled));
    assert!(r.failure.is_some());
    assert_eq!(r.skipped.len(), 1);
    assert!(!run.validity.valid);
    assert!(
        r.engine.exit.as_deref().unwrap_or("").contains("signal"),
        "{:?}",
        r.engine.exit
    );
    assert!(
        run.latency.e2e.is_some(),
        "completed requests are summarized"
    );
}

async fn kill_after_successes(url: String, pid_file: PathBuf, n: u64) {
    // Wait for the engine, then for n completed requests, then SIGKILL it.
    let client = EngineClient::new(&url).unwrap();
    for _ in 0..2400 {
        if let Ok(Some(m)) = client.metrics().await {
            if m.sum("vllm:request_success").unwrap_or(0.0) >= n as f64 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let pid = std::fs::read_to_string(Path::new(&pid_file)).unwrap();
    let status = std::process::Command::new("kill")
        .args(["-KILL", pid.trim()])
        .status()
        .unwrap();
    assert!(status.success());
}
