//! `rigbench compare` end to end: the binary on results files written to a temp folder.
//! Exit codes: 0 no regression, 2 regression or missing metric, 3 baseline missing or unusable,
//! 1 error, 64 bad command line.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rand::{rngs::StdRng, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use rigbench::formats::GemmFormat;
use rigbench::kernels::schema::{
    AccuracyCase, CheckResult, DeterminismResult, KernelCase, SkippedCase, SuiteInfo, Timing,
};
use rigbench::kernels::KernelResults;
use rigbench::report::Results;
use rigbench::rig::{ComputeCapability, GpuFacts, RigFacts};

fn h200(driver: &str) -> RigFacts {
    let mut f = RigFacts::default();
    f.host.arch = "x86_64".into();
    f.gpu = Some(GpuFacts {
        name: "NVIDIA H200".into(),
        compute_capability: Some(ComputeCapability::new(9, 0)),
        ..Default::default()
    });
    f.stack.driver_version = Some(driver.into());
    f.capabilities = rigbench::rig::capability::table(ComputeCapability::new(9, 0));
    f
}

fn samples(seed: u64, scale: f64) -> Vec<f64> {
    let mut rng = StdRng::seed_from_u64(seed);
    let ln = LogNormal::new(0.0, 0.01).unwrap();
    (0..30)
        .map(|_| 50e-6 * scale * ln.sample(&mut rng))
        .collect()
}

fn case(implementation: &str, format: GemmFormat, m: usize, seed: u64, scale: f64) -> KernelCase {
    KernelCase {
        provider: "rigbench".into(),
        implementation: implementation.into(),
        format,
        shape: "gate_up".into(),
        m,
        n: 4096,
        k: 2048,
        path: "test kernel".into(),
        check: Some(CheckResult {
            reference: "cpu-f64 of dequantized operands".into(),
            metric: "rel_l2".into(),
            value: 1e-3,
            tolerance_name: "BF16_OUTPUT_REL_L2".into(),
            tolerance: 1e-2,
            passed: true,
        }),
        timing: Timing {
            samples_s: samples(seed, scale),
            cold_l2: true,
            ..Default::default()
        },
        extra: Vec::new(),
        derived: Default::default(),
        sm_clock_mhz: Some(1980),
        throttle: Vec::new(),
    }
}

/// A complete H200 result of suite `test-suite`; the w4a16 M=1 case is `slow`× slower.
fn results(seed: u64, slow: f64) -> Results {
    let mut r = Results::new(
        h200("580.159.04"),
        "nvidia-h200-sm90".into(),
        "rigbench report".into(),
    );
    r.complete = true;
    r.kernels = Some(KernelResults {
        suite: SuiteInfo {
            name: "test-suite".into(),
            file: "suites/kernels/test-suite.toml".into(),
            description: "test".into(),
        },
        cases: vec![
            case("bf16", GemmFormat::Bf16, 1, seed, 1.0),
            case("w4a16", GemmFormat::W4a16, 1, seed + 1, slow),
            case("w4a16", GemmFormat::W4a16, 16, seed + 2, 1.0),
        ],
        determinism: vec![DeterminismResult {
            provider: "rigbench".into(),
            implementation: "w4a16".into(),
            shape: "gate_up".into(),
            m: 1,
            runs: 5,
            bit_exact: true,
            differing_elements: 0,
        }],
        reference_accuracy: vec![AccuracyCase {
            format: GemmFormat::W4a16,
            shape: "16x256x512".into(),
            data: "normal(0,1) seed 1".into(),
            rel_l2_vs_exact: 0.0712,
            kernel_tolerance: Some(1e-2),
            kernel_tolerance_name: "BF16_OUTPUT_REL_L2".into(),
        }],
        ..Default::default()
    });
    r
}

fn write(dir: &Path, name: &str, r: &Results) -> PathBuf {
    let p = dir.join(name);
    rigbench::report::write::atomic_write_json(&p, r).unwrap();
    p
}

fn rigbench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args(args)
        .env_remove("GITHUB_STEP_SUMMARY")
        .output()
        .expect("run rigbench")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn same_results_exit_0_with_a_table() {
    let d = tempfile::tempdir().unwrap();
    let b = write(d.path(), "base.json", &results(1, 1.0));
    let c = write(d.path(), "cur.json", &results(101, 1.0));
    let o = rigbench(&["compare", "--baseline", s(&b), s(&c)]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    assert!(out.contains("| metric"), "{out}");
    assert!(
        out.contains("kernels/rigbench/w4a16/gate_up/m=1/time_s"),
        "{out}"
    );
    assert!(out.contains("**No regression**"), "{out}");
    assert!(out.contains("rig/capability/w4a16/support"), "{out}");
    assert!(!out.contains("**Regressed**"), "{out}");
    assert!(err.contains("0 regressed"), "{err}");
}

#[test]
fn ten_percent_slowdown_exits_2_and_names_the_metric() {
    let d = tempfile::tempdir().unwrap();
    let b = write(d.path(), "base.json", &results(1, 1.0));
    let c = write(d.path(), "cur.json", &results(101, 1.10));
    let md = d.path().join("out/summary.md");
    let gh = d.path().join("gh-summary.md");
    std::fs::write(&gh, "previous step\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args(["compare", "--baseline", s(&b), s(&c), "--markdown", s(&md)])
        .env("GITHUB_STEP_SUMMARY", &gh)
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}\n{err}");
    let line = out
        .lines()
        .find(|l| l.contains("w4a16/gate_up/m=1/time_s"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.contains("**Regressed**") && line.contains("+"),
        "{line}"
    );
    // The other cases did not change.
    let other = out
        .lines()
        .find(|l| l.contains("w4a16/gate_up/m=16/time_s"))
        .unwrap();
    assert!(!other.contains("Regressed"), "{other}");
    assert_eq!(std::fs::read_to_string(&md).unwrap(), out);
    let summary = std::fs::read_to_string(&gh).unwrap();
    assert!(summary.starts_with("previous step\n") && summary.contains("**Regressed**"));

    // A 15% threshold for that metric makes the 10% change not a regression.
    let o = rigbench(&[
        "compare",
        "--baseline",
        s(&b),
        s(&c),
        "--metric-threshold",
        "kernels/*/w4a16/*/m=1/*=15",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).0);
}

#[test]
fn json_output_is_machine_readable() {
    let d = tempfile::tempdir().unwrap();
    let b = write(d.path(), "base.json", &results(1, 1.0));
    let c = write(d.path(), "cur.json", &results(101, 1.10));
    let o = rigbench(&["compare", "--json", "--baseline", s(&b), s(&c)]);
    assert_eq!(o.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON on stdout");
    assert_eq!(v["exit_code"], 2);
    assert_eq!(v["counts"]["regressed"], 1);
    let row = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "kernels/rigbench/w4a16/gate_up/m=1/time_s")
        .unwrap();
    assert_eq!(row["verdict"], "regressed");
    let lo = row["interval"]["lo"].as_f64().unwrap();
    assert!(lo > 0.02, "{row}");
}

#[test]
fn missing_baseline_exits_3_and_says_where_it_looked() {
    let d = tempfile::tempdir().unwrap();
    let c = write(d.path(), "cur.json", &results(101, 1.0));
    let dir = d.path().join("baselines");
    std::fs::create_dir_all(dir.join("nvidia-h100-sm90")).unwrap();
    write(
        &dir.join("nvidia-h100-sm90"),
        "test-suite.json",
        &results(1, 1.0),
    );
    let o = rigbench(&["compare", "--baseline-dir", s(&dir), s(&c)]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(3), "{out}\n{err}");
    assert!(
        out.contains("nvidia-h200-sm90/test-suite.json")
            && out.contains("nvidia-h100-sm90/test-suite.json"),
        "names the expected file and what exists: {out}"
    );
    assert!(err.contains("baseline unusable"), "{err}");

    let o = rigbench(&[
        "compare",
        "--baseline",
        s(&d.path().join("nope.json")),
        s(&c),
    ]);
    assert_eq!(o.status.code(), Some(3));
    assert!(text(&o).0.contains("does not exist"));
}

#[test]
fn baseline_dir_picks_the_saved_baseline_and_results_folder_works() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("baselines");
    let saved = rigbench::compare::save_baseline(&results(1, 1.0), &dir, "test-suite").unwrap();
    assert_eq!(saved, dir.join("nvidia-h200-sm90/test-suite.json"));
    let report = d.path().join("reports/run1");
    write(&report, "results.json", &results(101, 1.0));
    let o = rigbench(&["compare", "--baseline-dir", s(&dir), s(&report)]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    // --suite overrides the recorded suite.
    let o = rigbench(&[
        "compare",
        "--baseline-dir",
        s(&dir),
        "--suite",
        "other",
        s(&report),
    ]);
    assert_eq!(o.status.code(), Some(3), "{:?}", text(&o));
}

#[test]
fn rig_mismatch_exits_3_unless_allowed() {
    let d = tempfile::tempdir().unwrap();
    let b = write(d.path(), "base.json", &results(1, 1.0));
    let mut cur = results(101, 1.0);
    cur.rig.stack.driver_version = Some("570.86.15".into());
    let c = write(d.path(), "cur.json", &cur);
    let o = rigbench(&["compare", "--baseline", s(&b), s(&c)]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(3), "{out}");
    assert!(
        out.contains("Rig mismatch") && out.contains("driver major version: 580"),
        "{out}"
    );
    assert!(out.contains("not a regression verdict"), "{out}");
    assert!(
        !out.contains("| metric"),
        "no verdict table on a mismatch: {out}"
    );

    let o = rigbench(&[
        "compare",
        "--allow-rig-mismatch",
        "--baseline",
        s(&b),
        s(&c),
    ]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("Rig mismatch") && out.contains("| metric"),
        "{out}"
    );

    // A different GPU.
    let mut other = results(101, 1.0);
    other.rig.gpu.as_mut().unwrap().name = "NVIDIA H100 80GB HBM3".into();
    let c = write(d.path(), "h100.json", &other);
    let o = rigbench(&["compare", "--baseline", s(&b), s(&c)]);
    assert_eq!(o.status.code(), Some(3));
    assert!(text(&o).0.contains("H100"));
}

#[test]
fn schema_version_mismatch_exits_3() {
    let d = tempfile::tempdir().unwrap();
    let mut v = serde_json::to_value(results(1, 1.0)).unwrap();
    v["schema_version"] = 0.into();
    let b = d.path().join("old.json");
    std::fs::write(&b, v.to_string()).unwrap();
    let c = write(d.path(), "cur.json", &results(101, 1.0));
    let o = rigbench(&["compare", "--baseline", s(&b), s(&c)]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(3), "{out}\n{err}");
    assert!(out.contains("schema version 0"), "{out}");
    // A baseline that is not JSON is unusable too.
    std::fs::write(&b, "{oops").unwrap();
    let o = rigbench(&["compare", "--baseline", s(&b), s(&c)]);
    assert_eq!(o.status.code(), Some(3));
    assert!(text(&o).0.contains("not valid JSON"));
}

#[test]
fn results_missing_a_metric_exit_2_with_the_reason() {
    let d = tempfile::tempdir().unwrap();
    let b = write(d.path(), "base.json", &results(1, 1.0));
    let mut cur = results(101, 1.0);
    let k = cur.kernels.as_mut().unwrap();
    k.cases.retain(|c| c.m != 16);
    k.skipped.push(SkippedCase {
        provider: "rigbench".into(),
        implementation: "w4a16".into(),
        shape: "gate_up".into(),
        m: Some(16),
        reason: "output did not match the reference".into(),
    });
    k.reference_accuracy.clear();
    let c = write(d.path(), "cur.json", &cur);
    let o = rigbench(&["compare", "--baseline", s(&b), s(&c)]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}\n{err}");
    assert!(
        out.contains("**0 regressed, 3 missing**"),
        "time, check and accuracy: {out}"
    );
    let row = out
        .lines()
        .find(|l| l.starts_with("| `kernels/rigbench/w4a16/gate_up/m=16/time_s`"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains("**Missing**"), "{row}");
    assert!(out.contains("did not match the reference"), "{out}");
    assert!(
        out.contains("rel_l2_vs_exact` (Missing): not in the results"),
        "{out}"
    );
}

#[test]
fn deterministic_metrics_and_suite_mismatch() {
    let d = tempfile::tempdir().unwrap();
    let b = write(d.path(), "base.json", &results(1, 1.0));
    let mut cur = results(101, 1.0);
    {
        let k = cur.kernels.as_mut().unwrap();
        k.determinism[0].bit_exact = false;
        k.cases[0].check.as_mut().unwrap().value = 0.5; // past its 1e-2 tolerance
    }
    let c = write(d.path(), "cur.json", &cur);
    let o = rigbench(&["compare", "--baseline", s(&b), s(&c)]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("2 regressed"), "{out}");
    assert!(
        out.contains("outside its tolerance BF16_OUTPUT_REL_L2"),
        "{out}"
    );

    let mut other = results(101, 1.0);
    other.kernels.as_mut().unwrap().suite.name = "another".into();
    let c = write(d.path(), "other.json", &other);
    let o = rigbench(&["compare", "--baseline", s(&b), s(&c)]);
    assert_eq!(o.status.code(), Some(3));
    assert!(text(&o).0.contains("suite 'test-suite'"));
}

#[test]
fn errors_and_bad_flags() {
    let d = tempfile::tempdir().unwrap();
    let b = write(d.path(), "base.json", &results(1, 1.0));
    let o = rigbench(&[
        "compare",
        "--baseline",
        s(&b),
        s(&d.path().join("missing.json")),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("missing.json"), "{:?}", text(&o));
    let c = write(d.path(), "cur.json", &results(2, 1.0));
    for bad in [
        vec!["--threshold-kernels", "abc"],
        vec!["--metric-threshold", "no-equals-sign"],
        vec!["--confidence", "100"],
    ] {
        let mut args = vec!["compare", "--baseline", s(&b), s(&c)];
        args.extend(bad.iter().copied());
        let o = rigbench(&args);
        assert_eq!(o.status.code(), Some(64), "{bad:?}: {:?}", text(&o));
    }
    // One of --baseline / --baseline-dir is required.
    assert_eq!(rigbench(&["compare", s(&c)]).status.code(), Some(64));
}
