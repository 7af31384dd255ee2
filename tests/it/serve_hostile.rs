//! `rigbench serve` against hostile clients, on loopback: the API key on every route, the
//! header-read and body timeouts, the connection limit at a 1,024-descriptor limit, the chat
//! message limit, the chat template prepared off the request-handling threads, and the warning
//! for a non-loopback address (docs/reliability.md).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rigbench::runtime::serve_guard::{ApiKey, ServeLimits};
use rigbench::runtime::server::{start, ServeConfig, ServerHandle};
use serde_json::{json, Value};

use crate::common;
use common::raise_own_fd_limit;

const BIN: &str = env!("CARGO_BIN_EXE_rigbench");

/// One raw HTTP/1.1 request on a new connection; the status and the body (read to EOF; the
/// request asks the server to close).
fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let auth = auth
        .map(|a| format!("authorization: {a}\r\n"))
        .unwrap_or_default();
    // A server over its connection limit answers 503 and closes at once, possibly before the
    // request is written: the write then fails (broken pipe, reset) and what had arrived is
    // still read (the 503, or nothing: status 0). Callers check the status.
    let _ = write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{auth}\r\n{body}",
        body.len()
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn config(f: impl FnOnce(&mut ServeConfig)) -> ServeConfig {
    let mut c = ServeConfig::tiny();
    f(&mut c);
    c
}

/// Read from `s` until the server closes it (EOF or reset); what was read. Panics after `limit`
/// (far above the timeouts under test: it only keeps a broken server from hanging the test).
fn read_until_closed(s: &mut TcpStream, limit: Duration) -> String {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the server did not close the connection: {e}"),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_is_needed_on_every_route() {
    let s: ServerHandle = start(config(|c| c.api_key = ApiKey::new("k-123456")))
        .await
        .unwrap();
    let addr = s.addr();
    let chat = json!({"model": "synthetic:tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).to_string();
    let routes: Vec<(&str, &str, String)> = vec![
        ("GET", "/health", String::new()),
        ("GET", "/metrics", String::new()),
        ("GET", "/version", String::new()),
        ("GET", "/v1/models", String::new()),
        ("POST", "/v1/chat/completions", chat.clone()),
        (
            "POST",
            "/v1/completions",
            json!({"model": "synthetic:tiny", "prompt": "hi", "max_tokens": 2}).to_string(),
        ),
        ("POST", "/tokenize", json!({"prompt": "hi"}).to_string()),
        ("POST", "/detokenize", json!({"tokens": [104]}).to_string()),
        ("POST", "/reset_prefix_cache", String::new()),
        ("GET", "/no/such/route", String::new()),
    ];
    let r = tokio::task::spawn_blocking(move || {
        for (m, p, b) in &routes {
            for auth in [
                None,
                Some("Bearer wrong"),
                Some("k-123456"),
                Some("Bearer k-1234567"),
            ] {
                let (code, body) = http(addr, m, p, auth, b);
                assert_eq!(code, 401, "{m} {p} with {auth:?}: {body}");
                let v: Value = serde_json::from_str(&body).unwrap();
                assert_eq!(v["error"]["code"], 401, "{body}");
                let msg = v["error"]["message"].as_str().unwrap();
                assert!(
                    msg.contains("Authorization: Bearer") && msg.contains("--api-key"),
                    "{msg}"
                );
                assert!(!body.contains("k-123456"), "the key is never echoed");
            }
            let (code, body) = http(addr, m, p, Some("Bearer k-123456"), b);
            assert_ne!(code, 401, "{m} {p} with the key: {body}");
            if *p != "/no/such/route" {
                assert_eq!(code, 200, "{m} {p} with the key: {body}");
            }
        }
    })
    .await;
    s.shutdown().await;
    r.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_clients_are_disconnected() {
    let s = start(config(|c| {
        c.limits = ServeLimits {
            header_read_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            ..ServeLimits::default()
        }
    }))
    .await
    .unwrap();
    let addr = s.addr();
    let r = tokio::task::spawn_blocking(move || {
        // Connected, silent.
        let mut idle = TcpStream::connect(addr).unwrap();
        // Half a request head.
        let mut half_head = TcpStream::connect(addr).unwrap();
        half_head.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n").unwrap();
        // A whole head, then 10 of the 100 body bytes it announces.
        let mut half_body = TcpStream::connect(addr).unwrap();
        half_body
            .write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"prompt\":")
            .unwrap();
        // Kept alive after one answered request, then silent.
        let mut kept = TcpStream::connect(addr).unwrap();
        kept.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        let limit = Duration::from_secs(60);
        assert_eq!(read_until_closed(&mut idle, limit), "", "an idle connection gets nothing");
        let h = read_until_closed(&mut half_head, limit);
        assert!(h.is_empty() || h.starts_with("HTTP/1.1 408"), "{h}");
        let b = read_until_closed(&mut half_body, limit);
        assert!(b.starts_with("HTTP/1.1 400"), "half a body: {b}");
        let k = read_until_closed(&mut kept, limit);
        assert!(k.starts_with("HTTP/1.1 200"), "the first request was answered: {k}");
        // The server still serves.
        assert_eq!(http(addr, "GET", "/health", None, "").0, 200);
    })
    .await;
    s.shutdown().await;
    r.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_a_byte_at_a_time_is_cut_at_the_body_read_timeout() {
    // One byte every 0.5 s never pauses for the 2 s idle timeout: only the whole-body limit
    // (3 s) ends it. Before it, such clients held their connections for as long as they liked.
    let s = start(config(|c| {
        c.limits = ServeLimits {
            idle_timeout: Duration::from_secs(2),
            body_read_timeout: Duration::from_secs(3),
            ..ServeLimits::default()
        }
    }))
    .await
    .unwrap();
    let addr = s.addr();
    let r = tokio::task::spawn_blocking(move || {
        let mut slow = TcpStream::connect(addr).unwrap();
        slow.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n")
            .unwrap();
        let t = std::time::Instant::now();
        slow.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while t.elapsed() < Duration::from_secs(30) {
            if slow.write_all(b" ").is_err() {
                break;
            }
            match slow.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
        let text = String::from_utf8_lossy(&got).into_owned();
        assert!(text.starts_with("HTTP/1.1 400"), "after {:?}: {text}", t.elapsed());
        assert!(text.contains("--body-read-timeout"), "{text}");
        assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
        assert_eq!(http(addr, "GET", "/health", None, "").0, 200);
    })
    .await;
    s.shutdown().await;
    r.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_messages_get_a_400_naming_the_limit() {
    let s = start(config(|c| c.limits.max_chat_messages = 10))
        .await
        .unwrap();
    let addr = s.addr();
    let r = tokio::task::spawn_blocking(move || {
        let msgs = |n: usize| -> Vec<Value> {
            (0..n)
                .map(|_| json!({"role": "user", "content": "x"}))
                .collect()
        };
        for path in ["/v1/chat/completions", "/tokenize"] {
            let body = json!({"model": "synthetic:tiny", "messages": msgs(11), "max_tokens": 1})
                .to_string();
            let (code, text) = http(addr, "POST", path, None, &body);
            assert_eq!(code, 400, "{text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            let m = v["error"]["message"].as_str().unwrap();
            assert!(
                m.contains("11 messages")
                    && m.contains("at most 10")
                    && m.contains("--max-chat-messages"),
                "{m}"
            );
            let body = json!({"model": "synthetic:tiny", "messages": msgs(10), "max_tokens": 1})
                .to_string();
            assert_eq!(http(addr, "POST", path, None, &body).0, 200);
        }
    })
    .await;
    s.shutdown().await;
    r.unwrap();
}

/// The server on a runtime with one thread: if a request's chat template were rendered on the
/// request-handling thread, nothing else (not even accepting `/health`) could run until it is
/// done. The order of the answers shows where it ran: `/health`, sent after the whole large
/// request, is answered while that request has no answer yet.
#[test]
fn health_answers_while_a_huge_chat_request_is_prepared() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s = rt.block_on(start(ServeConfig::tiny())).unwrap();
    let addr = s.addr();
    // 60,000 messages of 1,000 bytes: a 61 MB body under the 64 MiB limit and the message limit.
    let content = "y".repeat(1000);
    let msgs: Vec<Value> = (0..60_000)
        .map(|_| json!({"role": "user", "content": content}))
        .collect();
    let body = json!({"model": "synthetic:tiny", "messages": msgs, "max_tokens": 1}).to_string();
    drop(msgs);
    let client = std::thread::spawn(move || {
        let mut big = TcpStream::connect(addr).unwrap();
        write!(
            big,
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        big.write_all(body.as_bytes()).unwrap();
        // The body is sent; /health on a new connection now.
        let sent = Instant::now();
        let (code, _) = http(addr, "GET", "/health", None, "");
        assert_eq!(code, 200);
        eprintln!("/health answered in {:.3} s", sent.elapsed().as_secs_f64());
        big.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        let answered_first =
            !matches!(big.peek(&mut b), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock);
        big.set_nonblocking(false).unwrap();
        let rest = read_until_closed(&mut big, Duration::from_secs(600));
        eprintln!(
            "the 60,000-message request was answered {:.3} s after its body was sent",
            sent.elapsed().as_secs_f64()
        );
        (answered_first, rest)
    });
    rt.block_on(async {
        while !client.is_finished() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let (answered_first, rest) = client.join().unwrap();
    rt.block_on(s.shutdown());
    assert!(
        !answered_first,
        "the huge request was answered before /health: it held the only request thread"
    );
    // Its answer: the context is too short for it, said after the template and tokenizer ran.
    assert!(
        rest.starts_with("HTTP/1.1 400") && rest.contains("maximum context length"),
        "{}",
        &rest[..rest.len().min(300)]
    );
}

/// Start `rigbench serve ARGS` on a free port with at most `nofile` descriptors; the child,
/// its address, and its stderr lines so far (a thread keeps reading).
fn serve_bin(
    args: &[&str],
    nofile: Option<u64>,
) -> (
    std::process::Child,
    String,
    std::sync::mpsc::Receiver<String>,
) {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--port", "0"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("VLLM_API_KEY");
    if let Some(n) = nofile {
        // SAFETY: setrlimit(2) is async-signal-safe; it runs in the child before exec.
        unsafe {
            cmd.pre_exec(move || {
                let r = libc::rlimit {
                    rlim_cur: n,
                    rlim_max: n,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "serve ended before listening"
        );
        if let Some(u) = line
            .trim()
            .strip_prefix("rigbench serve: listening on http://")
        {
            break u.to_string();
        }
    };
    std::thread::spawn(move || {
        let mut sink = String::new();
        let _ = out.read_to_string(&mut sink);
    });
    (child, addr, rx)
}

fn stop(mut child: std::process::Child) -> Option<i32> {
    // SAFETY: kill(2) on a child this test started and has not reaped.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    child.wait().unwrap().code()
}

/// 1,040 idle and half-sent connections against a server limited to 1,024 descriptors (the
/// usual default): it keeps serving. Over its connection limit it answers 503 at once; idle and
/// half-sent connections are closed after the header-read timeout, and `/health` is answered.
#[test]
fn a_thousand_idle_connections_do_not_stop_the_server() {
    raise_own_fd_limit(4096);
    let (child, addr, _err) = serve_bin(
        &["--header-read-timeout", "2", "--idle-timeout", "2"],
        Some(1024),
    );
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    let mut conns = Vec::new();
    for i in 0..1040 {
        let Ok(mut c) = TcpStream::connect(addr) else {
            continue;
        };
        match i % 3 {
            0 => {}
            1 => {
                let _ = c.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n");
            }
            _ => {
                let _ = c.write_all(
                    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{",
                );
            }
        }
        conns.push(c);
    }
    assert!(
        conns.len() >= 1000,
        "only {} connections opened",
        conns.len()
    );
    // /health answers (a fresh connection may first meet the limit: 503, then retried).
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(120);
    let mut statuses = Vec::new();
    loop {
        let (code, _) = http(addr, "GET", "/health", None, "");
        statuses.push(code);
        if code == 200 {
            break;
        }
        assert!(code == 503 || code == 0, "unexpected answer {code}");
        assert!(
            Instant::now() < deadline,
            "/health never answered: {statuses:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "/health answered 200 {:.1} s after the {} connections were open ({} tries before: {:?})",
        t0.elapsed().as_secs_f64(),
        conns.len(),
        statuses.len() - 1,
        &statuses[..statuses.len() - 1]
    );
    // Every one of the 1,040 was closed by the server (503 over the limit, or a timeout).
    let mut over_limit = 0;
    for c in &mut conns {
        let text = read_until_closed(c, Duration::from_secs(120));
        if text.starts_with("HTTP/1.1 503") {
            assert!(text.contains("--max-connections"), "{text}");
            over_limit += 1;
        }
    }
    eprintln!(
        "{over_limit} of {} connections answered 503 (over the limit)",
        conns.len()
    );
    drop(conns);
    assert_eq!(http(addr, "GET", "/health", None, "").0, 200);
    assert_eq!(stop(child), Some(0));
}

#[test]
fn a_non_loopback_address_is_warned_about_and_vllm_api_key_is_read() {
    let (child, addr, err) = serve_bin(&["--host", "0.0.0.0"], None);
    let port = addr.rsplit(':').next().unwrap().to_string();
    assert_eq!(stop(child), Some(0));
    let text: Vec<String> = err.iter().collect();
    assert!(
        text.iter()
            .any(|l| l.contains("warning: listening on 0.0.0.0") && l.contains("--api-key")),
        "{text:?}"
    );
    let (child, _, err) = serve_bin(&[], None);
    assert_eq!(stop(child), Some(0));
    assert!(
        !err.iter().any(|l| l.contains("warning: listening")),
        "loopback: no warning"
    );
    assert!(port.parse::<u16>().is_ok());
    // VLLM_API_KEY, as vLLM reads it.
    let mut cmd = Command::new(BIN);
    let mut child = cmd
        .args(["serve", "--port", "0"])
        .env("VLLM_API_KEY", "from-env-42")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0);
        if let Some(u) = line
            .trim()
            .strip_prefix("rigbench serve: listening on http://")
        {
            break u.parse::<std::net::SocketAddr>().unwrap();
        }
    };
    assert_eq!(http(addr, "GET", "/metrics", None, "").0, 401);
    assert_eq!(
        http(addr, "GET", "/metrics", Some("Bearer from-env-42"), "").0,
        200
    );
    assert_eq!(stop(child), Some(0));
}

#[test]
fn sighup_stops_serve_like_sigterm() {
    let (child, _, err) = serve_bin(&[], None);
    // SAFETY: kill(2) on a child this test started and has not reaped.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGHUP);
    }
    let mut child = child;
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(0), "SIGHUP: {st:?}");
    let text: Vec<String> = err.iter().collect();
    assert!(text.iter().any(|l| l.contains("shutting down")), "{text:?}");
}
