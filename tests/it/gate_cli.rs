//! The CI gate's command line (issue 13): exits that cannot hide a failure, baseline
//! replacement safety, `--confirm` without a GPU, and the `--plant` test hook.
//!
//! GPUs are hidden with `CUDA_VISIBLE_DEVICES=` where a test needs "no GPU", so the tests give
//! the same answer on a GPU machine.

use std::path::Path;
use std::process::{Command, Output};

fn rigbench(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rigbench"));
    c.args(args).env_remove("RIGBENCH_TEST_HOOKS");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("the binary runs")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

const NO_GPU: (&str, &str) = ("CUDA_VISIBLE_DEVICES", "");

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn kernels_that_time_nothing_exit_5_and_say_why_in_the_json() {
    let o = rigbench(
        &[
            "kernels", "--suite", "smoke", "--peers", "on", "--json", "--m", "1",
        ],
        &[NO_GPU],
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(err.contains("no case was timed"), "{err}");
    // The kernel part's own reason, not the multi-GPU part's (which comes first in the list).
    assert!(err.contains("no case was timed (kernels: "), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON on stdout");
    let skipped = v["skipped"].as_array().unwrap();
    assert!(!skipped.is_empty(), "{v}");
    assert_eq!(skipped[0]["implementation"], "*");
    assert!(skipped[0]["reason"].as_str().unwrap().contains("GPU"));
    let notes: Vec<&str> = v["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        notes.iter().any(|n| n.contains("no kernel case was timed")),
        "{notes:?}"
    );
    assert!(
        notes.iter().any(|n| n.contains("--peers on")),
        "--peers on says why the peers did not run: {notes:?}"
    );
}

#[test]
fn baselines_dir_is_checked_before_measuring() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let out = d.path().join("report");
    let o = rigbench(
        &[
            "report",
            "--no-fidelity",
            "--no-e2e",
            "--no-kernels",
            "--rig-label",
            "t",
            "--save-baseline",
            "--baseline-dir",
            s(&file.join("sub")),
            "--out",
            s(&out),
        ],
        &[NO_GPU],
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(err.contains("--baseline-dir"), "{err}");
    assert!(!out.exists(), "nothing was measured or written");
    // --repeats is checked too.
    let o = rigbench(&["report", "--repeats", "0"], &[]);
    assert_eq!(o.status.code(), Some(64));
}

/// The committed CPU baseline (e2e runs, checkpoint, reference accuracy) as a report folder.
fn report_folder(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> std::path::PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("baselines/ci-cpu/qwen3.6-27b.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src).unwrap()).unwrap();
    edit(&mut v);
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("results.json"), v.to_string()).unwrap();
    dir.to_path_buf()
}

#[test]
fn replacing_a_baseline_says_what_changed_and_keeps_its_sections() {
    let d = tempfile::tempdir().unwrap();
    let bl = d.path().join("bl");
    let full = report_folder(&d.path().join("full"), |_| {});
    // Saved from an existing report, without measuring.
    let o = rigbench(
        &[
            "report",
            "--render",
            s(&full),
            "--save-baseline",
            "--baseline-dir",
            s(&bl),
        ],
        &[],
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let saved = bl.join("ci-cpu/qwen3.6-27b.json");
    assert!(saved.is_file(), "{err}");
    assert!(err.contains("baseline saved to"), "{err}");

    // Again: a replacement, with the counts per section.
    let o = rigbench(
        &[
            "report",
            "--render",
            s(&full),
            "--save-baseline",
            "--baseline-dir",
            s(&bl),
        ],
        &[],
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("replaced: metrics"), "{err}");
    assert!(err.contains("e2e "), "{err}");

    // A refresh without e2e is refused before measuring...
    let o = rigbench(
        &[
            "report",
            "--no-fidelity",
            "--no-e2e",
            "--rig-label",
            "ci-cpu",
            "--save-baseline",
            "--baseline-dir",
            s(&bl),
            "--out",
            s(&d.path().join("never")),
        ],
        &[NO_GPU],
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(
        err.contains("gates on") && err.contains("e2e") && err.contains("--force-baseline"),
        "{err}"
    );
    assert!(!d.path().join("never").exists());

    // ... and results that lack it are refused when saved, unless --force-baseline.
    let no_e2e = report_folder(&d.path().join("no-e2e"), |v| {
        v["e2e"] = serde_json::Value::Null
    });
    let args = |force: bool| {
        let mut a = vec![
            "report".to_string(),
            "--render".into(),
            s(&no_e2e).into(),
            "--save-baseline".into(),
            "--baseline-dir".into(),
            s(&bl).into(),
        ];
        if force {
            a.push("--force-baseline".into());
        }
        a
    };
    let before = std::fs::read(&saved).unwrap();
    let a = args(false);
    let o = rigbench(&a.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("refusing to replace baseline") && err.contains("no e2e metrics"),
        "{err}"
    );
    assert_eq!(std::fs::read(&saved).unwrap(), before, "untouched");
    let a = args(true);
    let o = rigbench(&a.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("dropped with --force-baseline: e2e"), "{err}");
}

fn h200(run: &str) -> String {
    format!(
        "{}/reports/nvidia-h200-sm90/{run}",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn confirm_without_a_gpu_keeps_the_regressions_and_says_so() {
    // The committed back-to-back pair: one run each, no between-run information; some cases
    // moved 6-16% between the two runs.
    let (a, b) = (h200("20261130T062920Z"), h200("20261130T062948Z"));
    let o = rigbench(&["compare", "--baseline", &a, &b], &[]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        out.contains("no between-run information"),
        "a one-run comparison warns that it cannot see run-to-run drift: {out}"
    );
    let o = rigbench(&["compare", "--baseline", &a, &b, "--confirm"], &[NO_GPU]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(out.contains("--confirm: could not re-measure"), "{out}");
    assert!(out.contains("stand unconfirmed"), "{out}");
}

#[test]
fn plant_is_a_test_hook_that_says_so() {
    let a = h200("20261130T062920Z");
    let o = rigbench(
        &[
            "compare",
            "--baseline",
            &a,
            &a,
            "--plant",
            "kernels/rigbench/w4a16/gate_up/*=10",
        ],
        &[],
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(err.contains("RIGBENCH_TEST_HOOKS=1"), "{err}");
    // Allowed: the same run against itself with w4a16 gate_up 10% slower regresses exactly
    // there, and the output says the samples were changed.
    let o = rigbench(
        &[
            "compare",
            "--baseline",
            &a,
            &a,
            "--json",
            "--plant",
            "kernels/rigbench/w4a16/gate_up/*=10",
        ],
        &[("RIGBENCH_TEST_HOOKS", "1")],
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["planted"].as_array().unwrap().len(), 14);
    assert!(v["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|w| w.as_str().unwrap().contains("TEST HOOK")));
    let regressed: Vec<&str> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["verdict"] == "regressed")
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert!(!regressed.is_empty());
    assert!(
        regressed
            .iter()
            .all(|id| id.starts_with("kernels/rigbench/w4a16/gate_up/")),
        "{regressed:?}"
    );
}
