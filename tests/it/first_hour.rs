//! A new user's first hour (issue 16): the faults met on the way, each turned into a test, and
//! the CLI's promises (one spelling per concept, exit codes by the README's table, help with
//! exit codes, a report that opens with a verdict).

use crate::common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Output;

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/checkpoints")
        .join(name)
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 temp path")
}

fn no_panic(o: &Output) {
    assert!(!stderr(o).contains("panicked"), "panic: {}", stderr(o));
}

#[cfg(unix)]
#[test]
fn a_non_utf8_shard_name_is_read_by_its_os_path() {
    use std::os::unix::ffi::OsStrExt;
    let d = tempfile::tempdir().unwrap();
    let src = fixture("llama-bf16");
    std::fs::copy(src.join("config.json"), d.path().join("config.json")).unwrap();
    let odd = std::ffi::OsStr::from_bytes(b"model-\xff\xfe.safetensors");
    std::fs::copy(src.join("model.safetensors"), d.path().join(odd)).unwrap();
    let opts = rigbench::checkpoint::InspectOptions {
        cc: Some("sm_90".parse().unwrap()),
        card: Some("--cc".into()),
        ..Default::default()
    };
    let r = rigbench::checkpoint::inspect(d.path(), &opts).expect("read, not 'not found'");
    let plain = rigbench::checkpoint::inspect(&src, &opts).unwrap();
    assert!(r.tensors.headers_read);
    assert_eq!(r.tensors.tensor_count, plain.tensors.tensor_count);
    assert!(r.tensors.tensor_count > 0);
    // Shown lossily, but shown.
    assert!(
        r.tensors.files[0].file.starts_with("model-"),
        "{:?}",
        r.tensors.files
    );
}

/// A results file `compare` accepts: a CPU report without kernels or e2e.
fn cpu_results(dir: &Path) -> PathBuf {
    let out = dir.join("r");
    let o = rigbench(&[
        "report",
        "--no-fidelity",
        "--no-e2e",
        "--no-kernels",
        "--rig-label",
        "first-hour",
        "--out",
        s(&out),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    out
}

#[test]
fn compare_markdown_into_a_missing_folder_is_refused_not_created() {
    let d = tempfile::tempdir().unwrap();
    let r = cpu_results(d.path());
    let missing = d.path().join("missing/dir/x.md");
    let o = rigbench(&[
        "compare",
        "--baseline",
        s(&r),
        "--markdown",
        s(&missing),
        s(&r),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
    assert!(!d.path().join("missing").exists(), "no folder created");
    // Into an existing folder it writes.
    let ok = d.path().join("x.md");
    let o = rigbench(&["compare", "--baseline", s(&r), "--markdown", s(&ok), s(&r)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(ok.is_file());
}

#[test]
fn e2e_checks_tokenizer_and_engine_log_paths_before_starting_anything() {
    let o = rigbench(&["e2e", "--tokenizer", "/nonexistent/tokenizer.json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("/nonexistent/tokenizer.json") && e.contains("--tokenizer"),
        "{e}"
    );
    assert!(!e.contains("sweep point"), "no run started: {e}");

    let o = rigbench(&["e2e", "--engine-log", "/dev/null"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("not a regular file") && !e.contains("not found"),
        "{e}"
    );
    let d = tempfile::tempdir().unwrap();
    let o = rigbench(&["e2e", "--engine-log", s(d.path())]);
    assert!(stderr(&o).contains("a folder"), "{}", stderr(&o));
    let o = rigbench(&["e2e", "--engine-log", "/no/such/log"]);
    assert!(stderr(&o).contains("not found"), "{}", stderr(&o));
    no_panic(&o);
}

#[test]
fn serve_with_a_kv_budget_below_one_block_says_only_what_helps() {
    let o = rigbench(&["serve", "--port", "0", "--kv-cache-memory", "1KiB"]);
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(!e.contains("at most 0"), "{e}");
    assert!(e.contains("raise --kv-cache-memory to at least"), "{e}");
}

#[test]
fn a_rig_label_with_a_space_is_refused_as_its_message_says() {
    for bad in ["a b", "a/b", ".hidden", ""] {
        let o = rigbench(&[
            "report",
            "--no-kernels",
            "--no-e2e",
            "--no-fidelity",
            "--rig-label",
            bad,
        ]);
        assert_eq!(o.status.code(), Some(64), "{bad:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("rig label"), "{}", stderr(&o));
    }
}

#[test]
fn inspect_says_does_not_fit_when_the_reserve_exceeds_the_memory() {
    let o = rigbench(&[
        "inspect",
        s(&fixture("qwen36-mixed-clean")),
        "--gpu-mem-gib",
        "1",
        "--reserve-gib",
        "5",
    ]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("capacity-does-not-fit"), "{out}");
    assert!(out.contains("(does not fit)"), "{out}");
    // With room to spare: no such finding.
    let o = rigbench(&[
        "inspect",
        s(&fixture("qwen36-mixed-clean")),
        "--gpu-mem-gib",
        "80",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stdout(&o).contains("capacity-does-not-fit"));
}

#[test]
fn rig_all_gives_reasons_and_only_instructions_each_card_has() {
    let o = rigbench(&["rig", "--all"]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert!(out.contains("What runs, and why"), "{out}");
    for l in out.lines().filter(|l| l.starts_with("| sm_")) {
        let cc = l[2..].split_whitespace().next().unwrap_or("");
        if ["sm_80", "sm_86", "sm_87", "sm_89", "sm_120", "sm_121"].contains(&cc) {
            assert!(!l.contains("wgmma") && !l.contains("tcgen05"), "{l}");
        }
        if cc == "sm_90" {
            assert!(!l.contains("tcgen05"), "{l}");
        }
    }
    assert!(out.contains("| sm_90  | W4A4 NVFP4  | fallback"), "{out}");
}

#[test]
fn a_card_newer_than_the_table_takes_sm121_paths() {
    let o = rigbench(&["inspect", s(&fixture("llama-ct-nvfp4")), "--cc", "sm_999"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("classified like sm_121"), "{out}");
    assert!(out.contains("mma.sync block_scale"), "{out}");
    assert!(!out.contains("tcgen05"), "{out}");
}

#[test]
fn every_help_shows_exit_codes_and_examples() {
    for cmd in [
        vec!["--help"],
        vec!["rig", "--help"],
        vec!["kernels", "--help"],
        vec!["inspect", "--help"],
        vec!["serve", "--help"],
        vec!["e2e", "--help"],
        vec!["report", "--help"],
        vec!["compare", "--help"],
        vec!["diagnose", "--help"],
    ] {
        let o = rigbench(&cmd);
        assert_eq!(o.status.code(), Some(0), "{cmd:?}");
        let out = stdout(&o);
        assert!(
            out.contains("Exit codes") && out.contains("64"),
            "{cmd:?}: {out}"
        );
        assert!(out.contains("Examples:"), "{cmd:?}: {out}");
        // Each example is one unbroken command line.
        let ex = out.split("Examples:").nth(1).unwrap_or("");
        for l in ex.lines().filter(|l| !l.trim().is_empty()) {
            let t = l.trim_start();
            assert!(
                t.starts_with("rigbench ")
                    || t.starts_with("curl ")
                    || l.starts_with("    ")
                    || !l.starts_with(' '),
                "{cmd:?}: an example line was wrapped: {l:?}"
            );
        }
    }
}

#[test]
fn one_spelling_per_concept_with_the_old_ones_hidden() {
    let help = |c: &str| stdout(&rigbench(&[c, "--help"]));
    // report and compare: --baseline-dir.
    assert!(
        help("report").contains("--baseline-dir") && !help("report").contains("--baselines-dir")
    );
    assert!(help("compare").contains("--baseline-dir"));
    // serve and e2e: --spec-method/--spec-k, --served-model-name.
    for c in ["serve", "e2e"] {
        let h = help(c);
        assert!(h.contains("--spec-method") && h.contains("--spec-k"), "{c}");
        assert!(h.contains("--served-model-name"), "{c}");
        assert!(!h.contains("--speculative-method") && !h.contains("--num-speculative-tokens"));
    }
    assert!(!help("e2e").contains("--served-model "));
    // --warmup says what it counts.
    assert!(help("kernels").contains("--warmup-launches"));
    assert!(help("e2e").contains("--warmup-requests"));
    assert!(help("e2e").contains("--no-ignore-eos"));
    // The old spellings still parse (a bad value after them proves clap took the flag).
    let o = rigbench(&["report", "--baselines-dir", "x", "--render", "/nonexistent"]);
    assert_eq!(
        o.status.code(),
        Some(64),
        "alias is a measuring flag: {}",
        stderr(&o)
    );
    let o = rigbench(&["kernels", "--warmup", "nope"]);
    assert!(stderr(&o).contains("--warmup-launches"), "{}", stderr(&o));
    let o = rigbench(&["serve", "--num-speculative-tokens", "3"]);
    assert_eq!(o.status.code(), Some(64));
    assert!(stderr(&o).contains("--spec-method"), "{}", stderr(&o));
}

#[test]
fn exit_codes_follow_the_readme_table() {
    // The environment: a busy port, nothing at --url -> 1.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    let o = rigbench(&["serve", "--port", &port]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--port"), "{}", stderr(&o));
    drop(busy);
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://127.0.0.1:{}", free.local_addr().unwrap().port());
    drop(free);
    let d = tempfile::tempdir().unwrap();
    let o = rigbench(&["e2e", "--url", &url, "--out", s(&d.path().join("e"))]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    // What the user typed wrong -> 64, the same in e2e as in serve.
    for cmd in [
        vec!["e2e", "--spec-method", "eagle"],
        vec![
            "serve",
            "--port",
            "0",
            "--spec-method",
            "eagle",
            "--spec-k",
            "3",
        ],
        vec!["report", "--render", "x", "--suite", "smoke"],
    ] {
        let o = rigbench(&cmd);
        assert_eq!(o.status.code(), Some(64), "{cmd:?}: {}", stderr(&o));
    }
    // A flag of an option that is off is not checked.
    let o = rigbench(&[
        "report",
        "--no-fidelity",
        "--no-e2e",
        "--determinism-runs",
        "1",
        "--rig-label",
        "x",
        "--out",
        s(&d.path().join("r")),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = rigbench(&["kernels", "--check-determinism", "--determinism-runs", "1"]);
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    // --resume: a folder that is not there, another --out, --save-baseline: 64, naming the fix.
    let r = d.path().join("r");
    for (cmd, want) in [
        (
            vec!["report", "--resume", "no-such-folder"],
            "does not exist",
        ),
        (
            vec!["report", "--resume", s(&r), "--out", "elsewhere"],
            "drop --out",
        ),
        (
            vec!["report", "--resume", s(&r), "--save-baseline"],
            "--render",
        ),
        (vec!["report", "--resume", s(&r)], "finished report"),
    ] {
        let o = rigbench(&cmd);
        assert_eq!(o.status.code(), Some(64), "{cmd:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{cmd:?}: {}", stderr(&o));
    }
}

/// File names in backticks (`results.json`, `e2e_runs.csv`) on a line of report.md.
fn files_in(line: &str) -> Vec<String> {
    line.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| !w.contains(' ') && w.contains('.'))
        .map(str::to_string)
        .collect()
}

#[test]
fn report_prints_its_verdict_and_render_lists_only_files_present() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("r");
    let o = rigbench(&[
        "report",
        "--no-fidelity",
        "--no-kernels",
        "--rig-label",
        "t",
        "--out",
        s(&out),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains(&format!("Report: {}", out.join("report.md").display())),
        "{text}"
    );
    assert!(
        text.contains("Verdict:") && text.contains("End to end:"),
        "{text}"
    );
    let md = format!(
        "{}\n{}",
        std::fs::read_to_string(out.join("report.md")).unwrap(),
        std::fs::read_to_string(out.join("report-details.md")).unwrap_or_default()
    );
    assert!(
        md.find("## Verdict").unwrap() < md.find("## Rig").unwrap(),
        "verdict first"
    );
    // e2e on the built-in runtime is a CPU figure and says so.
    assert!(md.contains("**CPU backend**"), "{md}");
    // Every file report.md lists exists.
    let listed = md
        .lines()
        .find(|l| l.starts_with("Machine-readable:"))
        .unwrap();
    for f in files_in(listed) {
        assert!(
            out.join(&f).is_file(),
            "report.md lists {f}, which is not there"
        );
    }
    // Re-rendered elsewhere: the CSV files come along, engine.log too, and the list matches.
    let again = d.path().join("again");
    let o = rigbench(&["report", "--render", s(&out), "--out", s(&again)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("Verdict:"));
    let md2 = format!(
        "{}\n{}",
        std::fs::read_to_string(again.join("report.md")).unwrap(),
        std::fs::read_to_string(again.join("report-details.md")).unwrap_or_default()
    );
    let listed = md2
        .lines()
        .find(|l| l.starts_with("Machine-readable:"))
        .unwrap();
    for f in files_in(listed) {
        assert!(
            again.join(&f).is_file(),
            "re-rendered report.md lists {f}, not there"
        );
    }
    assert!(listed.contains("e2e_runs.csv"), "{listed}");
    // No heading twice within a file (report-details.md repeats the summary's headings: it is
    // the whole report, the summary its head).
    for name in ["report.md", "report-details.md"] {
        let text = std::fs::read_to_string(again.join(name)).unwrap_or_default();
        let mut heads: Vec<&str> = text.lines().filter(|l| l.starts_with('#')).collect();
        let n = heads.len();
        heads.sort_unstable();
        heads.dedup();
        assert_eq!(heads.len(), n, "duplicate headings in {name}: {text}");
    }
}

#[test]
fn compare_finds_a_no_kernels_baseline_by_the_name_save_baseline_gives_it() {
    let d = tempfile::tempdir().unwrap();
    let r = cpu_results(d.path());
    let bl = d.path().join("bl");
    // No baseline yet: exit 3 naming the file it looked for (not 64 "no suite").
    let o = rigbench(&["compare", "--baseline-dir", s(&bl), s(&r)]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("first-hour/no-kernels.json"),
        "{}",
        stderr(&o)
    );
    std::fs::create_dir_all(bl.join("first-hour")).unwrap();
    std::fs::copy(
        r.join("results.json"),
        bl.join("first-hour/no-kernels.json"),
    )
    .unwrap();
    let o = rigbench(&[
        "compare",
        "--baseline-dir",
        s(&bl),
        "--deterministic-only",
        s(&r),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// The committed current H200 report (reports/nvidia-h200-sm90/README.md names it).
fn h200() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("reports/nvidia-h200-sm90/20261130T062726Z")
}

#[test]
fn the_committed_h200_report_opens_with_its_verdict() {
    let md = format!(
        "{}\n{}",
        std::fs::read_to_string(h200().join("report.md")).unwrap(),
        std::fs::read_to_string(h200().join("report-details.md")).unwrap_or_default()
    );
    let head: Vec<&str> = md.lines().take(16).collect();
    assert!(head.contains(&"## Verdict"), "{head:#?}");
    let verdict = md
        .split("## Verdict")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    let lines = verdict.lines().filter(|l| l.starts_with("- ")).count();
    assert!((5..=10).contains(&lines), "{lines} lines: {verdict}");
    assert!(
        verdict.contains("W4A4 NVFP4 is a **fallback**"),
        "{verdict}"
    );
    assert!(verdict.contains("**CPU backend**"), "{verdict}");
}

#[test]
fn re_rendering_old_results_keeps_their_engine_log_findings() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("r");
    let o = rigbench(&["report", "--render", s(&h200()), "--out", s(&out)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let md = format!(
        "{}\n{}",
        std::fs::read_to_string(out.join("report.md")).unwrap(),
        std::fs::read_to_string(out.join("report-details.md")).unwrap_or_default()
    );
    let log = md.split("### Engine log findings").nth(1).unwrap();
    assert!(
        log.contains("kv-capacity") && log.contains("2,097,152"),
        "the KV line of engine.log is found again: {log}"
    );
    // The data are the run's own: results.json is copied unchanged in substance.
    let a: serde_json::Value =
        serde_json::from_slice(&std::fs::read(h200().join("results.json")).unwrap()).unwrap();
    let b: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(a["kernels"]["cases"], b["kernels"]["cases"]);
}

/// `reports/nvidia-h200-sm90/README.md` states the exit code `compare` gives for its committed
/// pairs: it is what today's binary gives.
#[test]
fn the_reports_readme_states_the_compare_exit_codes_of_today() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("reports/nvidia-h200-sm90");
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    for (a, b, says) in [
        ("20261130T055604Z", "20261130T055632Z", "exits 2"),
        ("20261130T062920Z", "20261130T062948Z", "exit 2"),
    ] {
        let line = readme
            .lines()
            .find(|l| l.contains(&format!("`{a}`, `{b}`")))
            .unwrap_or_else(|| panic!("no line for the pair {a}, {b}"));
        assert!(line.contains(says), "{line}");
        let o = rigbench(&["compare", "--baseline", s(&dir.join(a)), s(&dir.join(b))]);
        assert_eq!(o.status.code(), Some(2), "{a} {b}: {}", stderr(&o));
    }
}
