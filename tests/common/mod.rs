//! Helpers shared by the integration tests that run the `rigbench` binary (`mod common` of
//! `tests/it/main.rs`, by path, and of the test binaries beside it; `use crate::common;` in each
//! module that uses it; not every module uses every helper).
//!
//! `checkpoints.rs` beside this file is not one of its modules: it is the generator of the test
//! checkpoints, `mod checkpoints` of `tests/it/main.rs` (by path), used by the `inspect` tests.
#![allow(dead_code)]

use std::process::{Command, Output};

/// The path of the real-world fixture `rel` (e.g. `"logs"`, `"engines/vllm-0.32.0-cpu"`) inside
/// the checkout's `tests/fixtures/real/` (a byte copy of the project's shared fixture channel,
/// with `PROVENANCE.md` and `SHA256SUMS`). Fails the test, naming the path, when it
/// is absent: the fixtures are committed, so a missing one is a broken checkout.
pub fn real_fixture(rel: &str) -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/real")
        .join(rel);
    assert!(
        p.exists(),
        "fixture {} is missing: it is committed in the repository (tests/fixtures/real/, \
         checked by tests/it/fixtures_provenance.rs); restore it with `git checkout -- tests/fixtures/real`",
        p.display()
    );
    p
}

/// Run the `rigbench` binary built for these tests with `args`; its exit status and output.
pub fn rigbench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args(args)
        .output()
        .expect("the binary runs")
}

/// A run's stderr as text (lossy UTF-8).
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bound, read, released).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Whether a process is alive (not gone, not a zombie), from `/proc/PID/stat`.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s
                .rfind(')')
                .and_then(|i| s[i + 1..].split_whitespace().next().map(str::to_string));
            !matches!(state.as_deref(), Some("Z") | Some("X") | None)
        }
        Err(_) => false,
    }
}

/// Poll `f` every 50 ms until it holds or `limit` has passed; its last value.
pub fn wait_until(limit: std::time::Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = std::time::Instant::now();
    while t.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    f()
}

/// The pid written in file `p`, if any.
pub fn read_pid(p: &std::path::Path) -> Option<u32> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// Raise this process's soft `RLIMIT_NOFILE` to `want` (within the hard limit); fails the
/// test when the hard limit is lower.
pub fn raise_own_fd_limit(want: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: get/setrlimit(2) on plain structs.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        if r.rlim_cur < want {
            r.rlim_cur = want.min(r.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
    }
    assert!(
        r.rlim_cur >= want,
        "this test needs {want} file descriptors; the hard limit is {}",
        r.rlim_max
    );
}

/// Start `rigbench ARGS` (in the checkout) with the signal test hook `hold`, wait until it says
/// it holds, send `signals` (each after the previous one was taken, and a repeat of the first
/// after rigbench's 500 ms repeat window, so that it counts as a second signal), and return its
/// exit code and stderr; fails past 120 s after the last signal.
pub fn signalled(args: &[&str], hold: &str, signals: &[i32]) -> (Option<i32>, String) {
    signalled_with(args, hold, signals, true)
}

/// As [`signalled`], but each signal sent as soon as rigbench has said it took the previous
/// one, well within its repeat window (what `timeout(1)` does: its SIGTERM to the process, then
/// to the process group, microseconds apart; waiting for the line keeps the kernel from merging
/// the two into one delivery, which would make the test pass without the fix).
pub fn signalled_at_once(args: &[&str], hold: &str, signals: &[i32]) -> (Option<i32>, String) {
    signalled_with(args, hold, signals, false)
}

fn signalled_with(
    args: &[&str],
    hold: &str,
    signals: &[i32],
    spaced: bool,
) -> (Option<i32>, String) {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let mut child = Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("RIGBENCH_TEST_HOOKS", "1")
        .env("RIGBENCH_TEST_HOLD", hold)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            all.push_str(&line);
            all.push('\n');
            let _ = tx.send(line);
        }
        all
    });
    let wait_for = |needle: &str| -> bool {
        while let Ok(l) = rx.recv_timeout(Duration::from_secs(300)) {
            if l.contains(needle) {
                return true;
            }
        }
        false
    };
    assert!(
        wait_for("test hook: holding until a signal"),
        "{args:?}: never reached the hold"
    );
    for (i, sig) in signals.iter().enumerate() {
        // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
        unsafe {
            libc::kill(child.id() as i32, *sig);
        }
        if i + 1 < signals.len() {
            if spaced {
                assert!(
                    wait_for("stopping; what was measured"),
                    "{args:?}: first signal not taken"
                );
                std::thread::sleep(Duration::from_millis(600));
            } else {
                assert!(wait_for("rigbench: SIG"), "{args:?}: signal {i} not taken");
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{args:?}: did not exit after {signals:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.code(), reader.join().expect("reader"))
}

/// Options of an e2e session against the engine at `url` running `suite`, as the mock-engine
/// tests run them: no progress bar, no Ctrl-C handler, `/metrics` scraped every `metrics`, a
/// request abandoned after `timeout`.
pub fn url_session_options(
    url: &str,
    suite: rigbench::e2e::workload::Suite,
    metrics: std::time::Duration,
    timeout: std::time::Duration,
) -> rigbench::e2e::E2eOptions {
    let mut o = rigbench::e2e::E2eOptions::with_suite(suite);
    o.engine = rigbench::e2e::launcher::EngineChoice::Url {
        url: url.to_string(),
    };
    o.progress = false;
    o.handle_ctrl_c = false;
    o.metrics_interval = metrics;
    o.request_timeout = timeout;
    o
}

/// One session of `o` to its end (a session error fails the test).
pub async fn session(o: &rigbench::e2e::E2eOptions) -> rigbench::e2e::E2eResults {
    rigbench::e2e::run_session(o, rigbench::e2e::executor::StopSignal::new(), &mut |_| {})
        .await
        .expect("session")
}
