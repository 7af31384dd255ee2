//! The `rig`, `kernels` and `report` commands as a user runs them: bad input gives a clear error
//! naming the flag or file and the documented exit code; without a GPU everything still runs and
//! says what it skipped.

use crate::common;
use common::*;
use std::process::Output;

fn assert_no_panic(o: &Output) {
    let e = stderr(o);
    assert!(!e.contains("panicked"), "panic: {e}");
}

#[test]
fn bad_flags_and_bad_values_exit_64_naming_the_flag() {
    let o = rigbench(&["kernels", "--bogus"]);
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    for (args, flag) in [
        (vec!["kernels", "--formats", "bf16,int3"], "--formats"),
        (vec!["kernels", "--m", "0,1"], "--m"),
        (vec!["kernels", "--m", "abc"], "--m"),
        (vec!["kernels", "--suite", "no-such-suite"], "--suite"),
        (
            vec!["kernels", "--suite", "smoke", "--shapes", "nope"],
            "--shapes",
        ),
        (vec!["kernels", "--max-time", "0"], "--max-time"),
        (vec!["report", "--rig-label", "a/b"], "--rig-label"),
    ] {
        let o = rigbench(&args);
        assert_eq!(o.status.code(), Some(64), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(flag),
            "{args:?} should name {flag}: {}",
            stderr(&o)
        );
        assert_no_panic(&o);
    }
}

#[test]
fn malformed_suite_files_are_named() {
    let d = tempfile::tempdir().unwrap();
    let cases = [
        ("broken.toml", "name = [", "malformed"),
        (
            "empty-m.toml",
            "name='x'\nm=[]\n[[shapes]]\nname='a'\nn=16\nk=16\n",
            "`m`",
        ),
        (
            "zero.toml",
            "name='x'\nm=[1]\n[[shapes]]\nname='a'\nn=0\nk=16\n",
            "zero",
        ),
        (
            "dup.toml",
            "name='x'\nm=[1]\n[[shapes]]\nname='a'\nn=16\nk=16\n[[shapes]]\nname='a'\nn=16\nk=16\n",
            "twice",
        ),
    ];
    for (file, text, what) in cases {
        let p = d.path().join(file);
        std::fs::write(&p, text).unwrap();
        // A suite that cannot be used is a bad --suite value (64), as in every command.
        let o = rigbench(&["kernels", "--suite", p.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(64), "{file}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains(file) && e.contains(what), "{file}: {e}");
        assert_no_panic(&o);
    }
    // A missing suite file: 64 from every command that takes a suite, naming the file.
    for cmd in [
        vec!["kernels", "--suite", "/nonexistent/suite.toml"],
        vec!["report", "--suite", "/nonexistent/suite.toml"],
        vec!["report", "--e2e-suite", "/nonexistent/suite.toml"],
        vec!["e2e", "--suite", "/nonexistent/suite.toml"],
    ] {
        let o = rigbench(&cmd);
        assert_eq!(o.status.code(), Some(64), "{cmd:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("/nonexistent/suite.toml"), "{cmd:?}");
        assert!(stderr(&o).contains("--suite") || stderr(&o).contains("--e2e-suite"));
    }
    // An unknown key in a suite file and an unknown suite name: the same code, 64, both in
    // kernels and in e2e.
    let k = d.path().join("unknown-key.toml");
    std::fs::write(
        &k,
        "name='x'\nm=[1]\nbogus=1\n[[shapes]]\nname='a'\nn=16\nk=16\n",
    )
    .unwrap();
    let e = d.path().join("unknown-key-e2e.toml");
    std::fs::write(&e, "name = 'x'\nbogus = 1\n").unwrap();
    for cmd in [
        vec!["kernels", "--suite", k.to_str().unwrap()],
        vec!["kernels", "--suite", "no-such-suite"],
        vec!["e2e", "--suite", e.to_str().unwrap()],
        vec!["e2e", "--suite", "no-such-suite"],
    ] {
        let o = rigbench(&cmd);
        assert_eq!(o.status.code(), Some(64), "{cmd:?}: {}", stderr(&o));
        assert_no_panic(&o);
    }
}

#[test]
fn rig_runs_everywhere() {
    let o = rigbench(&["rig", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("rig --json prints JSON");
    assert!(
        v["gpu"].is_object() || v["gpu_absent_reason"].is_string(),
        "either a GPU or the reason there is none: {v}"
    );
    let o = rigbench(&["rig", "--all"]);
    assert_eq!(o.status.code(), Some(0));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("sm_75") && out.contains("sm_121"), "{out}");
}

#[test]
fn report_writes_a_complete_folder_and_says_what_it_skipped() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("r");
    let o = rigbench(&[
        "report",
        "--no-fidelity",
        "--no-e2e",
        "--peers",
        "off",
        "--suite",
        "smoke",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let md = format!(
        "{}\n{}",
        std::fs::read_to_string(out.join("report.md")).unwrap(),
        std::fs::read_to_string(out.join("report-details.md")).unwrap_or_default()
    );
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["complete"], true);
    assert_eq!(results["schema_version"], 1);
    assert!(md.contains("## Rig") && md.contains("Accuracy of each format"));
    if results["rig"]["gpu"].is_null() {
        assert!(
            md.contains("## Skipped") && md.contains("no CUDA driver found"),
            "{md}"
        );
        assert!(md.contains("The CPU reference accuracy study ran instead"));
    }
    // Re-render from the saved results.
    std::fs::remove_file(out.join("report.md")).unwrap();
    let o = rigbench(&["report", "--render", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(out.join("report.md").is_file());
    // Render of a missing or corrupt file names it.
    let o = rigbench(&[
        "report",
        "--render",
        d.path().join("nope.json").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("nope.json"));
    std::fs::write(out.join("results.json"), b"{ not json").unwrap();
    let o = rigbench(&["report", "--render", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("results.json"), "{}", stderr(&o));
    assert_no_panic(&o);
}

#[test]
fn report_into_a_file_path_fails_clearly() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("plain-file");
    std::fs::write(&f, b"x").unwrap();
    let o = rigbench(&[
        "report",
        "--no-fidelity",
        "--no-e2e",
        "--no-kernels",
        "--out",
        f.join("r").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("plain-file"), "{}", stderr(&o));
    assert_no_panic(&o);
}
