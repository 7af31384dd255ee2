//! Every exit code every `--help` documents, run: for each command, one case per code of its
//! table (`rigbench::cli::help::exits`, the one source of the help texts and of the README's
//! table), with the code the process exits with checked. A code in a table without a case here
//! fails the test, so a code cannot be documented without being run.
//!
//! Codes that need a GPU (`kernels` 0, `report` 5) are run as documented where one is present;
//! on a machine without one the documented no-GPU outcome of the same command line is checked
//! instead, and the test says so on stderr. The signal cases use the test hook of
//! `rigbench::signals::test_hold` (the command waits for the signal before it measures), so
//! that no case depends on how fast the machine is.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use rigbench::cli::help::{exits, Cmd};

use crate::common;
use common::{real_fixture, signalled};

const BIN: &str = env!("CARGO_BIN_EXE_rigbench");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn run_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs")
}

fn run(args: &[&str]) -> Output {
    run_in(root(), args)
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

fn has_gpu() -> bool {
    let o = run(&["rig", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("rig --json");
    !v["gpu"].is_null()
}

/// Check `o` exited with `code` and did not panic.
fn expect(cmd: Cmd, code: u8, o: &Output, what: &str) {
    assert_eq!(
        o.status.code(),
        Some(i32::from(code)),
        "{} exit {code} ({what}): stderr {}",
        cmd.name(),
        err(o)
    );
    assert!(!err(o).contains("panicked"), "{}", err(o));
}

/// Every command's `--help` shows exactly the codes of its table, in its order.
#[test]
fn every_help_shows_the_codes_of_its_table() {
    for cmd in Cmd::ALL {
        let o = if cmd == Cmd::Top {
            run(&["--help"])
        } else {
            run(&[cmd.name(), "--help"])
        };
        assert_eq!(o.status.code(), Some(0), "{cmd:?}");
        let text = out(&o);
        let block = text
            .split("Exit codes:\n")
            .nth(1)
            .unwrap_or_else(|| panic!("{cmd:?}: no exit codes in --help: {text}"));
        let shown: Vec<u8> = block
            .lines()
            .take_while(|l| !l.trim().is_empty())
            .filter_map(|l| l.strip_prefix("  "))
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect();
        let table: Vec<u8> = exits(cmd).iter().map(|e| e.code).collect();
        assert_eq!(shown, table, "{cmd:?}: {block}");
    }
    // The README's table is the top-level table.
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(
        readme.contains(&rigbench::cli::help::exit_codes_markdown()),
        "README.md's exit-code table differs from `rigbench::cli::help::exit_codes_markdown()`; paste it:\n{}",
        rigbench::cli::help::exit_codes_markdown()
    );
}

/// `rigbench --help`: its table is the union of the commands' tables (checked in
/// `cli::help`'s unit tests), so each of its codes is run by a command's test below.
#[test]
fn rig_exit_codes() {
    for e in exits(Cmd::Rig) {
        match e.code {
            0 => expect(Cmd::Rig, 0, &run(&["rig"]), e.when),
            64 => expect(Cmd::Rig, 64, &run(&["rig", "--bogus"]), e.when),
            c => panic!("rig documents exit {c} and this test has no case for it"),
        }
    }
}

#[test]
fn kernels_exit_codes() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let gpu = has_gpu();
    let quick = ["kernels", "--suite", "smoke", "--peers", "off", "--m", "1"];
    for e in exits(Cmd::Kernels) {
        match e.code {
            0 | 5 => {
                let o = run(&quick);
                let want = if gpu { 0 } else { 5 };
                if !gpu && e.code == 0 {
                    eprintln!("kernels exit 0 needs a GPU: checked the no-GPU outcome (5) instead");
                }
                expect(Cmd::Kernels, want, &o, e.when);
                if want == 5 {
                    assert!(err(&o).contains("no case was timed"), "{}", err(&o));
                }
            }
            1 => {
                let mut a = quick.to_vec();
                let r = file.join("r");
                a.extend(["--out", s(&r)]);
                let o = run(&a);
                expect(Cmd::Kernels, 1, &o, e.when);
                assert!(err(&o).contains("plain-file"), "{}", err(&o));
                // Stopped by a signal before anything was measured: 1, marked interrupted.
                let out = d.path().join("k1");
                let mut a = quick.to_vec();
                a.extend(["--out", s(&out)]);
                let (code, text) = signalled(&a, "first-signal", &[libc::SIGTERM]);
                assert_eq!(code, Some(1), "{text}");
                assert!(text.contains("INTERRUPTED"), "{text}");
            }
            64 => {
                let o = run(&["kernels", "--suite", "/nonexistent/suite.toml"]);
                expect(Cmd::Kernels, 64, &o, e.when);
                assert!(err(&o).contains("/nonexistent/suite.toml"));
                let r = d.path().join("k64");
                std::fs::create_dir_all(&r).unwrap();
                std::fs::write(r.join("results.json"), b"{}").unwrap();
                let mut a = quick.to_vec();
                a.extend(["--out", s(&r)]);
                expect(Cmd::Kernels, 64, &run(&a), "--out over a report");
            }
            130 | 143 => {
                let sig = if e.code == 130 {
                    libc::SIGINT
                } else {
                    libc::SIGTERM
                };
                let (code, text) = signalled(&quick, "forever", &[sig, sig]);
                assert_eq!(code, Some(i32::from(e.code)), "{text}");
                assert!(text.contains("second signal"), "{text}");
            }
            c => panic!("kernels documents exit {c} and this test has no case for it"),
        }
    }
}

fn fixture(name: &str) -> PathBuf {
    root().join("tests/fixtures/checkpoints").join(name)
}

#[test]
fn inspect_exit_codes() {
    let clean = fixture("qwen36-mixed-clean");
    for e in exits(Cmd::Inspect) {
        let o = match e.code {
            0 => run(&["inspect", s(&clean), "--gpu-mem-gib", "80"]),
            1 => run(&["inspect", "/nonexistent/checkpoint"]),
            4 => run(&[
                "inspect",
                s(&clean),
                "--gpu-mem-gib",
                "1",
                "--reserve-gib",
                "5",
            ]),
            64 => {
                let o = run(&["inspect", s(&clean), "--cc", "sm_42"]);
                assert!(err(&o).contains("known: sm_75"), "{}", err(&o));
                o
            }
            c => panic!("inspect documents exit {c} and this test has no case for it"),
        };
        expect(Cmd::Inspect, e.code, &o, e.when);
    }
}

#[test]
fn serve_exit_codes() {
    for e in exits(Cmd::Serve) {
        match e.code {
            0 => {
                // While serving, and while the model loads (a large preset takes long to
                // synthesize: the signal arrives during it).
                for (model, until, says) in [
                    ("synthetic:tiny", "listening on", "shutting down"),
                    (
                        "synthetic:qwen3-8b",
                        "loading",
                        "stopped while loading the model",
                    ),
                ] {
                    let mut child = Command::new(BIN)
                        .args(["serve", "--model", model, "--port", "0", "--device", "cpu"])
                        .stdin(Stdio::null())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped())
                        .spawn()
                        .unwrap();
                    let (tx, rx) = mpsc::channel::<String>();
                    let (o, e2) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
                    let tx2 = tx.clone();
                    std::thread::spawn(move || {
                        for l in BufReader::new(o).lines().map_while(Result::ok) {
                            let _ = tx.send(l);
                        }
                    });
                    let errs = std::thread::spawn(move || {
                        let mut all = String::new();
                        for l in BufReader::new(e2).lines().map_while(Result::ok) {
                            all.push_str(&l);
                            all.push('\n');
                            let _ = tx2.send(l);
                        }
                        all
                    });
                    let mut seen = false;
                    while let Ok(l) = rx.recv_timeout(Duration::from_secs(120)) {
                        if l.contains(until) {
                            seen = true;
                            break;
                        }
                    }
                    assert!(seen, "{model}: never printed {until:?}");
                    // SAFETY: kill(2) on our own child.
                    unsafe {
                        libc::kill(child.id() as i32, libc::SIGTERM);
                    }
                    let st = child.wait().unwrap();
                    let text = errs.join().unwrap();
                    assert_eq!(st.code(), Some(0), "{model}: {text}");
                    assert!(text.contains(says), "{model}: {text}");
                }
            }
            1 => {
                // The port is checked before the model loads: no "loading" line.
                let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let port = busy.local_addr().unwrap().port().to_string();
                let o = run(&["serve", "--model", "synthetic:qwen3-8b", "--port", &port]);
                expect(Cmd::Serve, 1, &o, e.when);
                assert!(err(&o).contains("--port"), "{}", err(&o));
                assert!(
                    !err(&o).contains("loading"),
                    "bound after loading: {}",
                    err(&o)
                );
            }
            64 => expect(
                Cmd::Serve,
                64,
                &run(&["serve", "--quantize", "int3"]),
                e.when,
            ),
            c => panic!("serve documents exit {c} and this test has no case for it"),
        }
    }
}

fn free_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://127.0.0.1:{}", l.local_addr().unwrap().port())
}

#[test]
fn e2e_exit_codes() {
    let d = tempfile::tempdir().unwrap();
    for e in exits(Cmd::E2e) {
        match e.code {
            0 => {
                let o = run(&[
                    "e2e",
                    "--requests",
                    "2",
                    "--concurrency",
                    "1",
                    "--no-progress",
                    "--out",
                    s(&d.path().join("ok")),
                ]);
                expect(Cmd::E2e, 0, &o, e.when);
            }
            1 => {
                let url = free_url();
                let o = run(&["e2e", "--url", &url, "--out", s(&d.path().join("dead"))]);
                expect(Cmd::E2e, 1, &o, e.when);
            }
            64 => {
                let o = run(&["e2e", "--suite", "/nonexistent/suite.toml"]);
                expect(Cmd::E2e, 64, &o, e.when);
                // A flag the suite's workload would record and ignore is refused by name.
                let o = run(&["e2e", "--shared-prefix-tokens", "384"]);
                expect(
                    Cmd::E2e,
                    64,
                    &o,
                    "--shared-prefix-tokens on a fixed workload",
                );
                assert!(
                    err(&o).contains("--shared-prefix-tokens")
                        && err(&o).contains("--suite shared-prefix"),
                    "{}",
                    err(&o)
                );
            }
            130 | 143 => {
                let sig = if e.code == 130 {
                    libc::SIGINT
                } else {
                    libc::SIGTERM
                };
                let out = d.path().join(format!("sig{}", e.code));
                let (code, text) = signalled(&["e2e", "--out", s(&out)], "forever", &[sig, sig]);
                assert_eq!(code, Some(i32::from(e.code)), "{text}");
            }
            c => panic!("e2e documents exit {c} and this test has no case for it"),
        }
    }
}

#[test]
fn report_exit_codes() {
    let d = tempfile::tempdir().unwrap();
    let gpu = has_gpu();
    for e in exits(Cmd::Report) {
        match e.code {
            0 => {
                let o = run(&[
                    "report",
                    "--no-fidelity",
                    "--no-kernels",
                    "--no-e2e",
                    "--out",
                    s(&d.path().join("ok")),
                ]);
                expect(Cmd::Report, 0, &o, e.when);
            }
            1 => {
                // An engine it was asked to measure fails: 1, the reason on top, whole.
                let dir = d.path().join("boom");
                let o = run(&[
                    "report",
                    "--no-fidelity",
                    "--no-kernels",
                    "--engine-cmd",
                    "echo boom; exit 3",
                    "--url",
                    &free_url(),
                    "--out",
                    s(&dir),
                ]);
                expect(Cmd::Report, 1, &o, e.when);
                let verdict = out(&o);
                let first = verdict
                    .lines()
                    .find(|l| l.starts_with("- "))
                    .unwrap_or_default();
                assert!(
                    first.starts_with("- FAILED: e2e: the engine (echo boom; exit 3)"),
                    "{verdict}"
                );
                let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
                assert!(md.contains("## Failed"), "{md}");
                // The command line keeps its quoting.
                assert!(md.contains("--engine-cmd 'echo boom; exit 3'"), "{md}");
                // A dead --url too.
                let o = run(&[
                    "report",
                    "--no-fidelity",
                    "--no-kernels",
                    "--url",
                    &free_url(),
                    "--out",
                    s(&d.path().join("dead")),
                ]);
                expect(Cmd::Report, 1, &o, "a dead --url");
                // The reason names the flag and the fix. (What rigbench does to the prefix cache
                // of an engine it did not start is said after the engine's own reset route
                // answered, naming that route: a dead engine had nothing emptied.)
                assert!(
                    err(&o).contains("(--url, checked before the report's other parts ran); start the engine first"),
                    "{}",
                    err(&o)
                );
                assert!(!err(&o).contains("emptied"), "{}", err(&o));
            }
            5 => {
                let five = d.path().join("five");
                let a = [
                    "report",
                    "--no-fidelity",
                    "--suite",
                    "smoke",
                    "--m",
                    "1",
                    "--formats",
                    "w4a4",
                    "--no-e2e",
                    "--peers",
                    "off",
                    "--out",
                    s(&five),
                ];
                let o = run(&a);
                if gpu {
                    // W4A4 is a fallback below sm_100: nothing of it is timed there.
                    expect(Cmd::Report, 5, &o, e.when);
                } else {
                    eprintln!("report exit 5 needs a GPU: checked the no-GPU outcome (0) instead");
                    expect(
                        Cmd::Report,
                        0,
                        &o,
                        "without a GPU the kernel part is skipped",
                    );
                }
            }
            64 => {
                expect(
                    Cmd::Report,
                    64,
                    &run(&["report", "--e2e-suite", "/nonexistent/suite.toml"]),
                    e.when,
                );
                expect(
                    Cmd::Report,
                    64,
                    &run(&["report", "--render", "x", "--concurrency", "1"]),
                    "--render with a measuring flag",
                );
            }
            130 | 143 => {
                let sig = if e.code == 130 {
                    libc::SIGINT
                } else {
                    libc::SIGTERM
                };
                let out = d.path().join(format!("sig{}", e.code));
                let (code, text) = signalled(
                    &["report", "--no-e2e", "--out", s(&out)],
                    "forever",
                    &[sig, sig],
                );
                assert_eq!(code, Some(i32::from(e.code)), "{text}");
            }
            c => panic!("report documents exit {c} and this test has no case for it"),
        }
    }
}

fn h200(run: &str) -> PathBuf {
    root().join("reports/nvidia-h200-sm90").join(run)
}

#[test]
fn compare_exit_codes() {
    let d = tempfile::tempdir().unwrap();
    let a = h200("20261130T062726Z");
    for e in exits(Cmd::Compare) {
        match e.code {
            0 => {
                // A run compared with itself: no regression, and no Ambiguous row at +0.00%.
                let o = run(&["compare", "--baseline", s(&a), s(&a)]);
                expect(Cmd::Compare, 0, &o, e.when);
                assert!(err(&o).contains(" 0 ambiguous"), "{}", err(&o));
            }
            1 => expect(
                Cmd::Compare,
                1,
                &run(&["compare", "--baseline", s(&a), "/nonexistent/results.json"]),
                e.when,
            ),
            2 => {
                let o = run(&[
                    "compare",
                    "--baseline",
                    s(&h200("20261130T062920Z")),
                    s(&h200("20261130T062948Z")),
                ]);
                expect(Cmd::Compare, 2, &o, e.when);
            }
            3 => {
                let o = run(&["compare", "--baseline-dir", s(d.path()), s(&a)]);
                expect(Cmd::Compare, 3, &o, e.when);
                // Two different end-to-end suites: another workload, 3 (not 2 for "missing").
                let mut v: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(a.join("results.json")).unwrap())
                        .unwrap();
                v["e2e"]["suite"]["name"] = "code".into();
                let other = d.path().join("other-suite.json");
                std::fs::write(&other, v.to_string()).unwrap();
                let o = run(&["compare", "--baseline", s(&a), s(&other)]);
                expect(Cmd::Compare, 3, &o, "another e2e suite");
                assert!(err(&o).contains("suite 'code'"), "{}", err(&o));
            }
            64 => expect(
                Cmd::Compare,
                64,
                &run(&[
                    "compare",
                    "--baseline",
                    s(&a),
                    s(&a),
                    "--threshold-kernels",
                    "x",
                ]),
                e.when,
            ),
            c => panic!("compare documents exit {c} and this test has no case for it"),
        }
    }
}

/// A real engine log of the checkout's fixtures (`tests/fixtures/real/logs/14_…`).
fn shared_log() -> PathBuf {
    let dir = real_fixture("logs");
    std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("14_"))
        })
        .unwrap_or_else(|| panic!("no 14_… log in {}", dir.display()))
}

#[test]
fn diagnose_exit_codes() {
    let d = tempfile::tempdir().unwrap();
    let plain = d.path().join("plain.log");
    std::fs::write(&plain, "INFO: started\nINFO: ready\n").unwrap();
    for e in exits(Cmd::Diagnose) {
        match e.code {
            0 => expect(
                Cmd::Diagnose,
                0,
                &run(&["diagnose", "--log", s(&plain)]),
                e.when,
            ),
            1 => expect(
                Cmd::Diagnose,
                1,
                &run(&["diagnose", "--log", "/nonexistent/engine.log"]),
                e.when,
            ),
            4 => expect(
                Cmd::Diagnose,
                4,
                &run(&["diagnose", "--log", s(&shared_log())]),
                e.when,
            ),
            64 => {
                expect(
                    Cmd::Diagnose,
                    64,
                    &run(&["diagnose", "--log", s(&plain), "--cc", "sm_42"]),
                    e.when,
                );
                // --out over an earlier diagnosis: refused without --force, kept as it was.
                let out = d.path().join("diag");
                expect(
                    Cmd::Diagnose,
                    0,
                    &run(&["diagnose", "--log", s(&plain), "--out", s(&out)]),
                    "first diagnosis",
                );
                let before = std::fs::read(out.join("diagnose.md")).unwrap();
                let o = run(&["diagnose", "--log", s(&shared_log()), "--out", s(&out)]);
                expect(Cmd::Diagnose, 64, &o, "--out over a diagnosis");
                assert!(err(&o).contains("--force"), "{}", err(&o));
                assert_eq!(std::fs::read(out.join("diagnose.md")).unwrap(), before);
                let o = run(&[
                    "diagnose",
                    "--log",
                    s(&shared_log()),
                    "--out",
                    s(&out),
                    "--force",
                ]);
                expect(Cmd::Diagnose, 4, &o, "--force replaces it");
                assert_ne!(std::fs::read(out.join("diagnose.md")).unwrap(), before);
            }
            c => panic!("diagnose documents exit {c} and this test has no case for it"),
        }
    }
}

#[test]
fn board_exit_codes() {
    let d = tempfile::tempdir().unwrap();
    for e in exits(Cmd::Board) {
        let o = match e.code {
            0 => run(&["board", "reports", "--out", s(d.path())]),
            1 => run(&["board", "/nonexistent/reports"]),
            64 => run(&["board"]),
            c => panic!("board documents exit {c} and this test has no case for it"),
        };
        expect(Cmd::Board, e.code, &o, e.when);
    }
}
