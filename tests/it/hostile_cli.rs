//! The binary against hostile inputs and surroundings: table cells longer than 65,535
//! characters (inspect, compare, report --render), a standard output whose reader went away
//! (`| head`), and SIGHUP (a dropped ssh session). Real child processes of the built binary.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::common;
use common::signalled;

const BIN: &str = env!("CARGO_BIN_EXE_rigbench");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn h200(run: &str) -> PathBuf {
    root().join("reports/nvidia-h200-sm90").join(run)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(root())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn no_panic(o: &Output, what: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("panicked") && o.status.code() != Some(101),
        "{what}: {:?} {err}",
        o.status
    );
}

/// A results.json whose rig label, engine name and version are `n` characters long.
fn long_results(dir: &Path, n: usize) -> PathBuf {
    let src = h200("20261130T062726Z").join("results.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&src).unwrap()).unwrap();
    let long = "L".repeat(n);
    v["rig_label"] = long.clone().into();
    v["e2e"]["engine"]["facts"]["version"]["value"] = long.clone().into();
    v["e2e"]["engine"]["facts"]["name"]["value"] = long.clone().into();
    v["e2e"]["engine"]["facts"]["model"]["value"] = long.clone().into();
    if let Some(runs) = v["e2e"]["runs"].as_array_mut() {
        for r in runs {
            r["conditions"]["engine_version"]["value"] = long.clone().into();
            r["conditions"]["model"]["value"] = long.clone().into();
        }
    }
    let p = dir.join("results.json");
    std::fs::write(&p, v.to_string()).unwrap();
    p
}

#[test]
fn cells_over_65535_characters_are_cut_in_compare_and_render() {
    let d = tempfile::tempdir().unwrap();
    for n in [70_000usize, 200_000] {
        let r = long_results(d.path(), n);
        let base = h200("20261130T062726Z");
        let o = run(&[
            "compare",
            "--allow-rig-mismatch",
            "--baseline",
            s(&base),
            s(&r),
        ]);
        no_panic(&o, "compare with a long rig label");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(matches!(o.status.code(), Some(0 | 2 | 3)), "{:?}", o.status);
        assert!(
            text.contains("[cut: ") || !text.contains(&"L".repeat(2000)),
            "a long cell is cut"
        );
        // `report --render` of such results draws report.md with the cells cut, saying so.
        let o = run(&["report", "--render", s(&r)]);
        no_panic(&o, "report --render");
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let md = format!(
            "{}\n{}",
            std::fs::read_to_string(d.path().join("report.md")).unwrap(),
            std::fs::read_to_string(d.path().join("report-details.md")).unwrap_or_default()
        );
        assert!(md.contains("[cut: "), "report.md says a cell was cut");
        // No table row carries the whole value (prose lines, e.g. the title, may).
        assert!(!md
            .lines()
            .any(|l| l.starts_with('|') && l.contains(&"L".repeat(5000))));
    }
}

#[test]
fn inspect_of_a_70_kb_config_json_renders() {
    let d = tempfile::tempdir().unwrap();
    let src = root().join("tests/fixtures/checkpoints/llama-bf16");
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d.path().join(e.file_name())).unwrap();
    }
    let cfg = d.path().join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    let long = "A".repeat(70_000);
    v["architectures"] = serde_json::json!([format!("Llama{long}ForCausalLM")]);
    v["model_type"] = format!("llama{long}").into();
    v["torch_dtype"] = format!("bfloat16{long}").into();
    std::fs::write(&cfg, v.to_string()).unwrap();
    assert!(std::fs::metadata(&cfg).unwrap().len() > 70_000);
    let o = run(&["inspect", s(d.path())]);
    no_panic(&o, "inspect on a 70 KB config.json");
    assert!(o.status.code().is_some_and(|c| c != 101), "{:?}", o.status);
    let o = run(&["inspect", s(d.path()), "--json"]);
    no_panic(&o, "inspect --json on a 70 KB config.json");
}

/// Run `args` with standard output a pipe whose reader reads `keep` bytes and goes away;
/// the exit code and stderr.
fn with_reader_gone(args: &[&str], keep: usize) -> (Option<i32>, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .current_dir(root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    if keep > 0 {
        let mut buf = vec![0u8; keep];
        let _ = out.read_exact(&mut buf);
    }
    drop(out);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (child.wait().unwrap().code(), err)
}

#[test]
fn a_closed_stdout_keeps_the_exit_code() {
    let a = h200("20261130T062726Z");
    let d = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<String>, i32)> = vec![
        (
            vec![
                "compare".into(),
                "--baseline".into(),
                s(&a).into(),
                s(&a).into(),
            ],
            0,
        ),
        (
            vec![
                "compare".into(),
                "--baseline".into(),
                s(&h200("20261130T062920Z")).into(),
                s(&h200("20261130T062948Z")).into(),
            ],
            2,
        ),
        (
            vec![
                "compare".into(),
                "--baseline-dir".into(),
                s(d.path()).into(),
                s(&a).into(),
            ],
            3,
        ),
        (vec!["rig".into()], 0),
        (vec!["--help".into()], 0),
    ];
    for (args, code) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // As the command has it with a reader that stays.
        let full = run(&args);
        assert_eq!(full.status.code(), Some(code), "{args:?}");
        if code != 3 {
            assert!(!full.stdout.is_empty(), "{args:?} writes to stdout");
        }
        for keep in [0, 1] {
            let (got, err) = with_reader_gone(&args, keep);
            assert_eq!(
                got,
                Some(code),
                "{args:?}, reader gone after {keep} bytes: {err}"
            );
            assert!(
                !err.contains("panicked") && !err.contains("Broken pipe"),
                "{err}"
            );
        }
    }
}

#[test]
fn sighup_stops_a_report_like_sigterm() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("hup");
    let (code, text) = signalled(
        &["report", "--no-e2e", "--out", s(&out)],
        "first-signal",
        &[libc::SIGHUP],
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("SIGHUP: stopping"), "{text}");
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    assert!(
        v["interrupted"]
            .as_str()
            .is_some_and(|s| s.contains("SIGHUP")),
        "{}",
        v["interrupted"]
    );
    assert!(out.join("report.md").exists());
    // A second SIGHUP exits at once with 128 + 1.
    let out2 = d.path().join("hup2");
    let (code, text) = signalled(
        &["report", "--no-e2e", "--out", s(&out2)],
        "forever",
        &[libc::SIGHUP, libc::SIGHUP],
    );
    assert_eq!(code, Some(129), "{text}");
}
