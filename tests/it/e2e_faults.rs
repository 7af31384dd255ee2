//! The e2e driver against broken engines, and what rigbench leaves behind when it is stopped:
//! a mock engine that answers 500 / 429, sends malformed SSE, closes streams early and stalls
//! (each recorded per request with its reason, nothing waiting past the configured timeout);
//! engines that refuse connections, exit during start-up or die mid-run (`--engine-cmd`, with
//! the tail of their log); SIGTERM and a second SIGINT (the engine's whole process group is
//! stopped, the partial report written); `--out` holding an earlier report (refused without
//! `--force`, never emptied before anything is measured); redaction of tokens, hosts, IPs and
//! user paths from engine command lines and logs.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio_stream::wrappers::ReceiverStream;

use rigbench::e2e::executor::StopSignal;
use rigbench::e2e::launcher::EngineChoice;
use rigbench::e2e::workload::Suite;
use rigbench::e2e::{run_session, E2eOptions};

use crate::common;
use common::{alive, free_port, read_pid, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_rigbench");

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    Ok,
    Status(u16),
    Malformed,
    CloseEarly,
    Stall,
}

struct Mock {
    plan: Vec<Fault>,
    next: AtomicUsize,
}

fn chunk(text: &str) -> String {
    format!(
        "data: {}\n\n",
        json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
    )
}

async fn generate(State(m): State<Arc<Mock>>, Json(body): Json<Value>) -> Response {
    if body["stream"] == json!(false) {
        // The session's prompt-overhead probe (one plain answer): not part of the fault plan.
        return Json(json!({"choices": [{"index": 0, "message": {"content": "a"}, "finish_reason": "length"}], "usage": {"prompt_tokens": 8, "completion_tokens": 1}})).into_response();
    }
    let i = m.next.fetch_add(1, Ordering::SeqCst);
    let fault = m.plan[i % m.plan.len()];
    let n = body["max_tokens"].as_u64().unwrap_or(4);
    if let Fault::Status(code) = fault {
        let msg = if code == 429 {
            "slow down"
        } else {
            "boom inside"
        };
        let status = StatusCode::from_u16(code).unwrap();
        return (
            status,
            Json(json!({"error": {"message": msg, "type": "x", "code": code}})),
        )
            .into_response();
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, Infallible>>(16);
    tokio::spawn(async move {
        let _ = tx.send(Ok(chunk("a"))).await;
        match fault {
            Fault::Malformed => {
                let _ = tx.send(Ok("data: {\"choices\": [ broken\n\n".into())).await;
                return;
            }
            Fault::CloseEarly => {
                let _ = tx.send(Ok(chunk("b"))).await;
                return; // the connection ends without [DONE]
            }
            Fault::Stall => {
                // No bytes for far longer than the client's request timeout.
                tokio::time::sleep(Duration::from_secs(120)).await;
                return;
            }
            _ => {}
        }
        for _ in 1..n {
            let _ = tx.send(Ok(chunk("a"))).await;
        }
        let fin = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]});
        let usage = json!({"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": n}});
        let _ = tx.send(Ok(format!("data: {fin}\n\n"))).await;
        let _ = tx.send(Ok(format!("data: {usage}\n\n"))).await;
        let _ = tx.send(Ok("data: [DONE]\n\n".into())).await;
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(ReceiverStream::new(rx)))
        .unwrap()
}

async fn start_mock(plan: Vec<Fault>) -> String {
    let mock = Arc::new(Mock {
        plan,
        next: AtomicUsize::new(0),
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
                let n = b.get("prompt").and_then(Value::as_str).map_or(0, str::len);
                Json(json!({"count": n, "max_model_len": 4096}))
            }),
        )
        .route("/v1/completions", post(generate))
        .route("/v1/chat/completions", post(generate))
        .with_state(mock);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

fn suite(requests: usize) -> Suite {
    let text = format!(
        "name = 'faults'\n[workload]\nkind = 'fixed'\ninput_tokens = 16\noutput_tokens = 6\nignore_eos = true\n[load]\nrequests = {requests}\nwarmup = 0\nconcurrency = [1]\n[sampling]\nthinking = false\n"
    );
    Suite::from_toml(&text, Path::new("faults.toml")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_is_recorded_per_request_with_its_reason_within_the_timeout() {
    let plan = vec![
        Fault::Ok,
        Fault::Status(500),
        Fault::Status(429),
        Fault::Malformed,
        Fault::CloseEarly,
        Fault::Stall,
        Fault::Ok,
    ];
    let url = start_mock(plan.clone()).await;
    let mut o = E2eOptions::with_suite(suite(plan.len()));
    o.engine = EngineChoice::Url { url };
    o.progress = false;
    o.handle_ctrl_c = false;
    o.metrics_interval = Duration::from_millis(20);
    o.request_timeout = Duration::from_secs(2);
    let t = Instant::now();
    let r = run_session(&o, StopSignal::new(), &mut |_| {})
        .await
        .unwrap();
    // One stalled request waits for the 2 s timeout; nothing else waits at all. The bound is
    // loose on purpose (a loaded 2-core machine), but far below the stall's 120 s.
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
    assert_eq!(r.runs.len(), 1, "{:?} {:?}", r.failure, r.skipped);
    let reqs = &r.runs[0].requests;
    assert_eq!(reqs.len(), plan.len());
    let want = [
        None,
        Some("HTTP 500"),
        Some("HTTP 429"),
        Some("malformed SSE data"),
        Some("stream ended before [DONE]"),
        Some("timed out after 2 s"),
        None,
    ];
    for (q, w) in reqs.iter().zip(want) {
        match w {
            None => {
                assert!(q.ok, "request {}: {:?}", q.index, q.error);
                assert_eq!(q.output_tokens, Some(6));
            }
            Some(w) => {
                assert!(!q.ok);
                let e = q.error.as_deref().unwrap_or_default();
                assert!(e.contains(w), "request {}: '{e}' lacks '{w}'", q.index);
            }
        }
    }
    assert_eq!(reqs[1].http_status, Some(500));
    assert!(reqs[1].error.as_deref().unwrap().contains("boom inside"));
    assert_eq!(reqs[2].http_status, Some(429));
    // A run with failed requests is not presented as a throughput figure.
    assert!(!r.runs[0].validity.valid);
    assert!(r.runs[0].presented_throughput().is_none());
}

// ---------------------------------------------------------------------------------------------
// The CLI against real processes.

fn health(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 12];
    s.read_exact(&mut buf).is_ok() && buf.starts_with(b"HTTP/1.1 200")
}

/// Wait for a child with a limit; kills it (and fails) past the limit.
fn wait_exit(child: &mut Child, limit: Duration) -> (Option<i32>, Duration) {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return (s.code(), t.elapsed());
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("rigbench did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stderr_of(child: &mut Child) -> String {
    use std::io::Read;
    let mut s = String::new();
    if let Some(e) = child.stderr.as_mut() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a process this test started.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// `rigbench e2e` against `--engine-cmd`: a shell that starts `rigbench serve` in the
/// background (not `exec`) and writes both pids, so that the shell and the server are two
/// processes of the engine's group, as with a real wrapper script.
fn e2e_with_engine(dir: &Path, port: u16, extra: &[&str]) -> Child {
    let cmd = format!(
        "echo $$ > {sh}; {BIN} serve --model synthetic:tiny --port {port} & echo $! > {srv}; wait",
        sh = dir.join("sh.pid").display(),
        srv = dir.join("srv.pid").display(),
    );
    Command::new(BIN)
        .args(["e2e", "--no-progress", "--engine-cmd", &cmd, "--port"])
        .arg(port.to_string())
        .args(["--startup-timeout", "120"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn sigterm_stops_the_engine_group_and_writes_the_partial_report() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rep");
    let port = free_port();
    let mut child = e2e_with_engine(
        d.path(),
        port,
        &[
            "--requests",
            "400",
            "--concurrency",
            "1,2",
            "--output-tokens",
            "32",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(
        wait_until(Duration::from_secs(120), || health(port)),
        "the engine never answered: {}",
        stderr_of(&mut child)
    );
    // Let requests flow, then do what timeout(1) and CI runners do.
    std::thread::sleep(Duration::from_millis(1500));
    let (sh, srv) = (
        read_pid(&d.path().join("sh.pid")).unwrap(),
        read_pid(&d.path().join("srv.pid")).unwrap(),
    );
    assert!(alive(sh) && alive(srv));
    signal(child.id(), libc::SIGTERM);
    let (code, _) = wait_exit(&mut child, Duration::from_secs(60));
    let err = stderr_of(&mut child);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("SIGTERM"), "{err}");
    // Neither the shell nor the server it started outlives rigbench.
    assert!(
        wait_until(Duration::from_secs(5), || !alive(sh)
            && !alive(srv)
            && !rigbench::signals::group_alive(sh)),
        "engine processes left running: sh {} server {}",
        alive(sh),
        alive(srv)
    );
    assert!(!health(port));
    // The partial report: parses, says it was interrupted, and re-renders.
    let r = rigbench::report::Results::load(&out.join("results.json")).unwrap();
    let e = r.e2e.as_ref().unwrap();
    assert!(e.interrupted, "{:?}", e.failure);
    assert!(!r.complete);
    assert!(out.join("report.md").is_file());
    assert!(out.join("engine.log").is_file());
    let o = Command::new(BIN)
        .args(["report", "--render"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
}

#[test]
fn a_second_sigint_exits_at_once_and_still_kills_the_engine_group() {
    let d = tempfile::tempdir().unwrap();
    let port = free_port();
    // An engine wrapper that ignores SIGTERM and SIGINT and lingers after its server: the
    // orderly stop would wait its 10 s grace before SIGKILL; the second signal must not.
    let cmd = format!(
        "trap '' TERM INT; echo $$ > {sh}; {BIN} serve --model synthetic:tiny --port {port} & echo $! > {srv}; wait; sleep 60",
        sh = d.path().join("sh.pid").display(),
        srv = d.path().join("srv.pid").display(),
    );
    let mut child = Command::new(BIN)
        .args(["e2e", "--no-progress", "--engine-cmd", &cmd, "--port"])
        .arg(port.to_string())
        .args(["--requests", "400", "--output-tokens", "32", "--out"])
        .arg(d.path().join("rep"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(120), || health(port)),
        "{}",
        stderr_of(&mut child)
    );
    std::thread::sleep(Duration::from_millis(500));
    let (sh, srv) = (
        read_pid(&d.path().join("sh.pid")).unwrap(),
        read_pid(&d.path().join("srv.pid")).unwrap(),
    );
    signal(child.id(), libc::SIGINT);
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the orderly stop cannot be over: the engine ignores SIGTERM for 10 s"
    );
    signal(child.id(), libc::SIGINT);
    let (code, took) = wait_exit(&mut child, Duration::from_secs(20));
    let err = stderr_of(&mut child);
    assert_eq!(code, Some(130), "{err}");
    assert!(took < Duration::from_secs(5), "{took:?}: {err}");
    assert!(err.contains("second signal"), "{err}");
    assert!(
        wait_until(Duration::from_secs(5), || !alive(srv)
            && !rigbench::signals::group_alive(sh)),
        "engine processes left running: {err}"
    );
}

#[test]
fn an_engine_that_dies_mid_run_is_reported_with_its_log_and_the_runs_so_far() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rep");
    let port = free_port();
    let mut child = e2e_with_engine(
        d.path(),
        port,
        &[
            "--requests",
            "400",
            "--output-tokens",
            "32",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(
        wait_until(Duration::from_secs(120), || health(port)),
        "{}",
        stderr_of(&mut child)
    );
    std::thread::sleep(Duration::from_millis(1000));
    let srv = read_pid(&d.path().join("srv.pid")).unwrap();
    signal(srv, libc::SIGKILL);
    let (code, _) = wait_exit(&mut child, Duration::from_secs(60));
    let err = stderr_of(&mut child);
    assert_eq!(code, Some(1), "{err}");
    let r = rigbench::report::Results::load(&out.join("results.json")).unwrap();
    let e = r.e2e.unwrap();
    // Whatever the session was doing when the engine died, the failure says the engine
    // exited, with the tail of its log.
    let failure = e.failure.clone().unwrap_or_default();
    assert!(
        failure.contains("exited") && failure.contains("last log lines"),
        "{failure}"
    );
    // Requests cut off by the death are recorded with a reason.
    let failed: Vec<_> = e
        .runs
        .iter()
        .flat_map(|r| r.requests.iter())
        .filter(|q| !q.ok)
        .collect();
    assert!(
        failed.iter().all(|q| q.error.is_some()),
        "a failed request without a reason"
    );
    assert!(out.join("engine.log").is_file() && out.join("report.md").is_file());
}

#[test]
fn a_dead_engine_cmd_is_reported_with_its_log_tail_and_engine_log_is_kept() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rep");
    let o = Command::new(BIN)
        .args([
            "e2e",
            "--no-progress",
            "--engine-cmd",
            "echo loading weights; echo 'RuntimeError: CUDA error: no kernel image is available' >&2; exit 3",
            "--port",
            &free_port().to_string(),
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("exited during startup"), "{err}");
    assert!(err.contains("no kernel image is available"), "{err}");
    let log = std::fs::read_to_string(out.join("engine.log")).unwrap();
    assert!(log.contains("loading weights") && log.contains("no kernel image"));
    assert!(!out.join("results.json").exists());
}

#[test]
fn refused_connections_are_an_environment_error_not_a_flag_error() {
    // Run from an empty folder without --out: the default report folder
    // (reports/<rig-label>/<time>/) must not be left behind, empty, when nothing was measured.
    let cwd = tempfile::tempdir().unwrap();
    let o = Command::new(BIN)
        .current_dir(cwd.path())
        .args(["e2e", "--no-progress", "--url"])
        .arg(format!("http://127.0.0.1:{}", free_port()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("--url") && err.contains("/health"), "{err}");
    assert!(!err.contains("panicked"));
    assert!(
        !cwd.path().join("reports").exists(),
        "an empty reports/ folder was left behind: {err}"
    );
}

fn make_report(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("results.json"), b"GOOD RESULTS").unwrap();
    std::fs::write(dir.join("report.md"), b"GOOD REPORT").unwrap();
}

fn untouched(dir: &Path) {
    assert_eq!(
        std::fs::read(dir.join("results.json")).unwrap(),
        b"GOOD RESULTS"
    );
    assert_eq!(
        std::fs::read(dir.join("report.md")).unwrap(),
        b"GOOD REPORT"
    );
}

#[test]
fn out_holding_a_report_is_refused_and_never_emptied_by_a_run_that_fails_to_start() {
    let d = tempfile::tempdir().unwrap();
    let rep = d.path().join("committed-report");
    make_report(&rep);
    let dead_url = format!("http://127.0.0.1:{}", free_port());
    // Without --force: refused before anything runs, naming the flag and the fix.
    let o = Command::new(BIN)
        .args(["e2e", "--no-progress", "--url", &dead_url, "--out"])
        .arg(&rep)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(
        err.contains("--force") && err.contains("committed-report"),
        "{err}"
    );
    untouched(&rep);
    // With --force and an unreachable URL: the earlier report survives.
    let o = Command::new(BIN)
        .args([
            "e2e",
            "--no-progress",
            "--force",
            "--url",
            &dead_url,
            "--out",
        ])
        .arg(&rep)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    untouched(&rep);
    // With --force and an engine that exits at start-up: the earlier report survives and the
    // engine's log is kept beside it.
    let o = Command::new(BIN)
        .args([
            "e2e",
            "--no-progress",
            "--force",
            "--engine-cmd",
            "echo 'ValueError: bad quantization' >&2; exit 1",
            "--port",
            &free_port().to_string(),
            "--out",
        ])
        .arg(&rep)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    untouched(&rep);
    let kept: Vec<PathBuf> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.to_string_lossy()
                .contains("committed-report.failed-start-")
        })
        .collect();
    assert_eq!(kept.len(), 1, "{err}");
    let log = std::fs::read_to_string(kept[0].join("engine.log")).unwrap();
    assert!(log.contains("bad quantization"));
    assert!(err.contains("engine.log"), "{err}");
    // The report command refuses it the same way.
    let o = Command::new(BIN)
        .args([
            "report",
            "--no-kernels",
            "--no-e2e",
            "--no-fidelity",
            "--out",
        ])
        .arg(&rep)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64));
    untouched(&rep);
}

#[test]
fn a_forced_run_replaces_the_earlier_report_only_after_measuring() {
    let d = tempfile::tempdir().unwrap();
    let rep = d.path().join("r");
    make_report(&rep);
    std::fs::write(rep.join("kernels_old.svg"), b"stale plot").unwrap();
    std::fs::write(rep.join("my-notes.txt"), b"mine").unwrap();
    let o = Command::new(BIN)
        .args([
            "report",
            "--no-kernels",
            "--no-e2e",
            "--no-fidelity",
            "--force",
            "--out",
        ])
        .arg(&rep)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r = rigbench::report::Results::load(&rep.join("results.json")).unwrap();
    assert!(r.complete);
    assert!(!rep.join("kernels_old.svg").exists(), "stale file kept");
    assert_eq!(std::fs::read(rep.join("my-notes.txt")).unwrap(), b"mine");
    let leftovers = std::fs::read_dir(d.path()).unwrap().count();
    assert_eq!(leftovers, 1, "staging folder left behind");
}

#[test]
fn tokens_hosts_ips_and_user_paths_from_engine_commands_and_logs_stay_out_of_reports() {
    let secrets = [
        "hf_Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2",
        "sk-live-0123456789abcdefABCDEF",
        "gpu-node-17.cluster.internal",
        "10.20.30.40",
        "/home/alice/models",
        "hunter2hunter2",
    ];
    let run = |redact: bool| -> (PathBuf, tempfile::TempDir) {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("rep");
        let port = free_port();
        let cmd = format!(
            "HF_TOKEN={} API_PASSWORD={} sh -c 'echo loading /home/alice/models on gpu-node-17.cluster.internal from 10.20.30.40 with --api-key {}'; exec {BIN} serve --model synthetic:tiny --port {port}",
            secrets[0], secrets[5], secrets[1]
        );
        let mut c = Command::new(BIN);
        c.args([
            "e2e",
            "--no-progress",
            "--engine-cmd",
            &cmd,
            "--port",
            &port.to_string(),
            "--requests",
            "2",
            "--concurrency",
            "1",
            "--output-tokens",
            "4",
            "--out",
        ])
        .arg(&out);
        if !redact {
            c.arg("--no-redact");
        }
        let o = c.output().unwrap();
        // Whether two requests make a valid run does not matter here; that a report was
        // written does.
        assert!(
            matches!(o.status.code(), Some(0) | Some(1)) && out.join("results.json").is_file(),
            "{:?}: {}",
            o.status.code(),
            String::from_utf8_lossy(&o.stderr)
        );
        (out, d)
    };
    let all_text = |dir: &Path| -> String {
        let mut s = String::new();
        for e in std::fs::read_dir(dir).unwrap() {
            s.push_str(&String::from_utf8_lossy(
                &std::fs::read(e.unwrap().path()).unwrap(),
            ));
        }
        s
    };
    let (out, _d) = run(true);
    let text = all_text(&out);
    assert!(text.contains("<token>") && text.contains("<host>"));
    for s in secrets {
        assert!(!text.contains(s), "'{s}' reached the report files");
    }
    let (out, _d2) = run(false);
    let text = all_text(&out);
    for s in secrets {
        assert!(text.contains(s), "--no-redact lost '{s}'");
    }
}

#[test]
fn sigterm_in_the_middle_of_report_leaves_a_parseable_interrupted_report() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rep");
    // 4,000 requests per sweep point keep the end-to-end part running for many seconds even in
    // a release build (the default 8 finish in well under the 1.5 s wait below).
    let mut child = Command::new(BIN)
        .args(["report", "--no-kernels", "--e2e-requests", "4000", "--out"])
        .arg(&out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the first part (the CPU accuracy study) is in results.json, then stop the run
    // while the fidelity study on SmolLM2 (minutes on the CPU; it must stop at the signal, not
    // run to its end) or the end-to-end part is running.
    let accuracy_done = || {
        std::fs::read_to_string(out.join("results.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .is_some_and(|v| {
                v.pointer("/kernels/reference_accuracy")
                    .and_then(Value::as_array)
                    .is_some_and(|a| !a.is_empty())
            })
    };
    assert!(
        wait_until(Duration::from_secs(300), accuracy_done),
        "{}",
        stderr_of(&mut child)
    );
    std::thread::sleep(Duration::from_millis(1500));
    signal(child.id(), libc::SIGTERM);
    let (code, _) = wait_exit(&mut child, Duration::from_secs(120));
    let err = stderr_of(&mut child);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("INTERRUPTED"), "{err}");
    let r = rigbench::report::Results::load(&out.join("results.json")).unwrap();
    assert!(!r.complete);
    assert!(
        r.interrupted
            .as_deref()
            .unwrap_or_default()
            .contains("SIGTERM"),
        "{:?}",
        r.interrupted
    );
    assert!(!r.kernels.unwrap().reference_accuracy.is_empty());
    // With SmolLM2 cached (as in CI), the signal lands in the fidelity study: stopped there, not
    // run to its end.
    if rigbench::runtime::gguf_model::smollm2_if_cached().is_some() {
        assert!(
            r.skipped
                .iter()
                .any(|s| s.what == "quality" && s.reason.contains("interrupted by SIGTERM")),
            "{:?}",
            r.skipped
        );
    }
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("INTERRUPTED (SIGTERM"), "{md}");
    std::fs::remove_file(out.join("report.md")).unwrap();
    let o = Command::new(BIN)
        .args(["report", "--render"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert!(std::fs::read_to_string(out.join("report.md"))
        .unwrap()
        .contains("INTERRUPTED"));
}
