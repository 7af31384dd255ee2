//! The faults a new user and a hostile world found on a fresh clone (docs/first-hour.md, fifth
//! pass; docs/reliability.md, the fourth round), each run as the user met it: the `rigbench`
//! binary with the flags, signals and inputs of the report.

use crate::common;
use common::*;
use std::path::Path;

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 temp path")
}

fn no_panic(o: &std::process::Output) {
    assert!(
        !stderr(o).contains("panicked") && o.status.code() != Some(101),
        "panic: {}",
        stderr(o)
    );
}

#[test]
fn timeouts_double_sigterm_keeps_the_partial_report() {
    // timeout(1) sends SIGTERM to rigbench and then to its process group: two SIGTERMs
    // microseconds apart. They used to count as a second signal (exit 143 at once, no report).
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("twice");
    let (code, text) = signalled_at_once(
        &["report", "--no-e2e", "--no-fidelity", "--out", s(&out)],
        "first-signal",
        &[libc::SIGTERM, libc::SIGTERM],
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("taken as the same request"), "{text}");
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    assert!(
        v["interrupted"]
            .as_str()
            .is_some_and(|s| s.contains("SIGTERM")),
        "{}",
        v["interrupted"]
    );
    assert!(out.join("report.md").exists());
    // A third one, even at once, is a real second signal: exit 143 at once.
    let out3 = d.path().join("thrice");
    let (code, text) = signalled_at_once(
        &["report", "--no-e2e", "--no-fidelity", "--out", s(&out3)],
        "forever",
        &[libc::SIGTERM, libc::SIGTERM, libc::SIGTERM],
    );
    assert_eq!(code, Some(143), "{text}");
}

#[test]
fn report_model_on_the_cpu_runs_the_named_model_end_to_end() {
    // The e2e part passed --model twice to `serve` (its default and the named one): exit 1 for
    // every model, synthetic:tiny included.
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("r");
    let o = rigbench(&[
        "report",
        "--model",
        "synthetic:tiny",
        "--runtime-device",
        "cpu",
        "--no-kernels",
        "--no-fidelity",
        "--out",
        s(&out),
    ]);
    no_panic(&o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    assert!(!v["e2e"].is_null(), "no e2e section: {}", stderr(&o));
}

#[test]
fn out_never_takes_a_users_files_without_force() {
    // A folder holding the user's own engine.log and kernels.csv (no results.json): a run used
    // to overwrite them or remove them at its end, without --force.
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("engine.log"), "my engine's log").unwrap();
    std::fs::write(d.path().join("kernels.csv"), "my,table").unwrap();
    let o = rigbench(&[
        "report",
        "--no-e2e",
        "--no-fidelity",
        "--no-kernels",
        "--out",
        s(d.path()),
    ]);
    no_panic(&o);
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("engine.log") && stderr(&o).contains("--force"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read_to_string(d.path().join("engine.log")).unwrap(),
        "my engine's log"
    );
    assert_eq!(
        std::fs::read_to_string(d.path().join("kernels.csv")).unwrap(),
        "my,table"
    );
    // `e2e --engine-log d/engine.log --out d` would delete its own input: refused, even with
    // --force, before any engine starts.
    let o = rigbench(&[
        "e2e",
        "--engine-log",
        s(&d.path().join("engine.log")),
        "--out",
        s(d.path()),
        "--force",
    ]);
    no_panic(&o);
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    assert!(stderr(&o).contains("own input"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(d.path().join("engine.log")).unwrap(),
        "my engine's log"
    );
}

/// Run `rigbench ARGS` with its standard error a pipe whose reader is already gone (what a
/// dropped ssh session or `2>&-` into a closed pipe leaves): its exit code.
fn with_stderr_closed(args: &[&str]) -> Option<i32> {
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stderr.take());
    let t = std::time::Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st.code();
        }
        if t.elapsed() > std::time::Duration::from_secs(120) {
            let _ = child.kill();
            panic!("{args:?} did not exit with its stderr closed");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_closed_stderr_never_turns_a_command_into_a_panic() {
    let d = tempfile::tempdir().unwrap();
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("baselines/ci-cpu/qwen3.6-27b.json");
    // compare of a run with a missing one: an error (exit 1) whose message cannot be written.
    assert_eq!(
        with_stderr_closed(&["compare", "--baseline", s(&base), s(&d.path().join("nope"))]),
        Some(1)
    );
    // report --render of a missing folder: exit 1, not 101.
    assert_eq!(
        with_stderr_closed(&["report", "--render", s(&d.path().join("nope"))]),
        Some(1)
    );
    // e2e with a missing engine log: exit 1 with the message dropped.
    assert_eq!(
        with_stderr_closed(&["e2e", "--engine-log", s(&d.path().join("nope.log"))]),
        Some(1)
    );
}

#[test]
fn vllm_api_key_in_the_environment_neither_stalls_nor_blames_health() {
    let d = tempfile::tempdir().unwrap();
    // The built-in engine reads VLLM_API_KEY and asks every request for it: rigbench sends it.
    let out = d.path().join("builtin");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args([
            "e2e",
            "--no-progress",
            "--requests",
            "4",
            "--concurrency",
            "1",
        ])
        .args(["--output-tokens", "4", "--out", s(&out)])
        .env("VLLM_API_KEY", "envKey0123456789")
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    no_panic(&o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for f in ["results.json", "report.md", "engine.log"] {
        let text = std::fs::read_to_string(out.join(f)).unwrap_or_default();
        assert!(!text.contains("envKey0123456789"), "{f} holds the key");
    }
    // An engine command that wants a key rigbench was not given: refused at its first answer,
    // not after the 120 s start-up wait, and the message says the key is the cause.
    let port = free_port();
    let cmd = format!(
        "exec env VLLM_API_KEY=otherKey987654321 {} serve --model synthetic:tiny --port {port}",
        env!("CARGO_BIN_EXE_rigbench")
    );
    let t2 = std::time::Instant::now();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args(["e2e", "--no-progress", "--engine-cmd", &cmd, "--port"])
        .arg(port.to_string())
        .args(["--requests", "2", "--out", s(&d.path().join("cmd"))])
        .env_remove("VLLM_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("--api-key") && err.contains("401"), "{err}");
    assert!(!err.contains("did not answer GET"), "{err}");
    assert!(
        t2.elapsed() < std::time::Duration::from_secs(60),
        "took {:?} (the start-up wait is 120 s)",
        t2.elapsed()
    );
}

#[test]
fn report_with_a_dead_url_fails_before_its_other_parts() {
    // Nothing listens on the port. The report used to run its kernels, accuracy and fidelity
    // parts first and fail at the e2e part (79 s on a CPU-only report).
    let d = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{}", free_port());
    let t = std::time::Instant::now();
    let o = rigbench(&["report", "--url", &url, "--out", s(&d.path().join("r"))]);
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--url") && stderr(&o).contains("before the report's other parts"),
        "{}",
        stderr(&o)
    );
    assert!(
        t.elapsed() < std::time::Duration::from_secs(30),
        "took {:?}",
        t.elapsed()
    );
    assert!(!d.path().join("r").join("results.json").exists());
}

#[test]
fn gguf_models_are_named_in_the_help_and_the_readme() {
    for cmd in ["serve", "e2e"] {
        let o = rigbench(&[cmd, "--help"]);
        assert_eq!(o.status.code(), Some(0));
        let help = String::from_utf8_lossy(&o.stdout);
        assert!(
            help.contains("GGUF"),
            "{cmd} --help says nothing of GGUF:\n{help}"
        );
    }
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    assert!(
        readme.contains("FILE.gguf"),
        "README: no GGUF in the serve line"
    );
    // The set-up commands keep Cargo.lock's versions.
    assert!(
        readme.contains("cargo install --locked --path ."),
        "README: no --locked"
    );
}

#[test]
fn a_suite_name_cannot_inject_markdown_into_report_md() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("baselines/ci-cpu/qwen3.6-27b.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(base).unwrap()).unwrap();
    let evil = "tiny`\n\n## Verdict: all clear\n\n[click](https://evil.example)`";
    v["e2e"]["suite"]["name"] = evil.into();
    v["kernels"]["suite"]["name"] = evil.into();
    v["command_line"] = format!("rigbench report --e2e-suite '{evil}'").into();
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("results.json"), v.to_string()).unwrap();
    let o = rigbench(&["report", "--render", s(d.path())]);
    no_panic(&o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let md = std::fs::read_to_string(d.path().join("report.md")).unwrap();
    assert!(md.contains("Verdict: all clear"), "the name is still shown");
    for line in md.lines() {
        assert!(
            !line.starts_with("## Verdict: all clear") && !line.starts_with("[click]"),
            "injected line in report.md: {line}"
        );
    }
}

#[test]
fn impossible_figures_and_huge_results_are_refused_by_render_board_and_compare() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("baselines/ci-cpu/qwen3.6-27b.json");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&base).unwrap()).unwrap();
    let d = tempfile::tempdir().unwrap();
    // Every number of an e2e run's TTFT summary set to 1e307: render used to loop for ever.
    let mut huge = v.clone();
    let mut hit = 0;
    if let Some(runs) = huge["e2e"]["runs"].as_array_mut() {
        for r in runs {
            if let Some(o) = r
                .pointer_mut("/latency/ttft")
                .and_then(|x| x.as_object_mut())
            {
                for x in o.values_mut() {
                    if x.is_number() {
                        *x = 1e307.into();
                        hit += 1;
                    }
                }
            }
        }
    }
    assert!(hit > 0, "the baseline has no e2e TTFT summary to corrupt");
    let hd = d.path().join("huge");
    std::fs::create_dir(&hd).unwrap();
    std::fs::write(hd.join("results.json"), huge.to_string()).unwrap();
    let t = std::time::Instant::now();
    let o = rigbench(&["report", "--render", s(&hd)]);
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("latency.ttft"), "{}", stderr(&o));
    assert!(t.elapsed() < std::time::Duration::from_secs(30));
    // A negative throughput: compare refuses the file (exit 1) instead of gating on it.
    let mut neg = v.clone();
    neg["e2e"]["runs"][0]["throughput"]["output_tok_per_s"] = (-50.0).into();
    let nd = d.path().join("neg");
    std::fs::create_dir(&nd).unwrap();
    std::fs::write(nd.join("results.json"), neg.to_string()).unwrap();
    let o = rigbench(&["compare", "--baseline", s(&base), s(&nd)]);
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("negative"), "{}", stderr(&o));
    // board: both are left out, each with its reason; the board of the sound one is made.
    let ok = d.path().join("ok");
    std::fs::create_dir(&ok).unwrap();
    std::fs::copy(&base, ok.join("results.json")).unwrap();
    let o = rigbench(&["board", s(d.path())]);
    no_panic(&o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let all = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(
        all.contains("latency.ttft") && all.contains("negative"),
        "{all}"
    );
}

#[test]
fn a_run_compared_with_itself_has_no_ambiguous_row() {
    // The committed CPU baseline against itself: its e2e points with 4 requests a side used to
    // read "Ambiguous" (too few samples), beside "Not enough samples" for the same cause.
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("baselines/ci-cpu/qwen3.6-27b.json");
    let d = tempfile::tempdir().unwrap();
    std::fs::copy(&base, d.path().join("results.json")).unwrap();
    let o = rigbench(&["compare", "--baseline", s(&base), s(d.path())]);
    no_panic(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(out.contains("| Same"), "{out}");
    // No row reads "Ambiguous" (the method's legend may name the verdict).
    assert!(
        !out.lines()
            .any(|l| l.starts_with('|') && l.contains("Ambiguous")),
        "{out}"
    );
}

#[test]
fn random_weight_e2e_figures_say_so_in_the_verdict_and_beside_the_throughput() {
    // The committed CPU baseline: the built-in runtime on synthetic:tiny (seeded random weights).
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("baselines/ci-cpu/qwen3.6-27b.json");
    let d = tempfile::tempdir().unwrap();
    std::fs::copy(&base, d.path().join("results.json")).unwrap();
    let o = rigbench(&["report", "--render", s(d.path())]);
    no_panic(&o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let md = std::fs::read_to_string(d.path().join("report.md")).unwrap();
    let verdict = md
        .lines()
        .find(|l| l.contains("**End to end:**"))
        .expect("an e2e verdict line");
    assert!(verdict.contains("random weights"), "{verdict}");
    // The throughput table is in the details file (report.md keeps each part's first table).
    let details = std::fs::read_to_string(d.path().join("report-details.md")).unwrap();
    let after_table = details
        .split("### Throughput")
        .nth(1)
        .expect("a throughput table");
    let next_heading = after_table.find("\n#").unwrap_or(after_table.len());
    assert!(
        after_table[..next_heading].contains("**Random weights** (`synthetic:tiny"),
        "{}",
        &after_table[..next_heading]
    );
}
