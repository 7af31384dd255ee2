//! `rigbench compare` end to end: the binary on results files written to a temp folder.
//! Exit codes: 0 no regression, 2 regression or missing metric, 3 baseline missing or unusable,
//! 1 error, 64 bad command line.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rand::{rngs::StdRng, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use rigbench::formats::GemmFormat;
use rigbench::gpu::ComputeCapability;
use rigbench::kernels::schema::{
    AccuracyCase, CheckResult, DeterminismResult, KernelCase, SkippedCase, SuiteInfo, Timing,
};
use rigbench::kernels::KernelResults;
use rigbench::report::Results;
use rigbench::rig::{GpuFacts, RigFacts};

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
        graph: None,
        graph_skip: None,
        clocks: None,
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
            decode_step: None,
        },
        cases: vec![
            case("bf16", GemmFormat::Bf16, 1, seed, 1.0),
            case("w4a16", GemmFormat::W4a16, 1, seed + 1, slow),
            case("w4a16", GemmFormat::W4a16, 16, seed + 2, 1.0),
        ],
        determinism: vec![DeterminismResult {
            provider: "rigbench".into(),
            implementation: "w4a16".into(),
            path: "test".into(),
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
            data_id: "plain".into(),
            rel_l2_vs_exact: 0.0712,
            rel_l2_non_outlier: None,
            kernel_tolerance: Some(1e-2),
            kernel_tolerance_name: "BF16_OUTPUT_REL_L2".into(),
        }],
        ..Default::default()
    });
    r
}

fn write(dir: &Path, name: &str, r: &Results) -> PathBuf {
    let p = dir.join(name);
    rigbench::output::write::atomic_write_json(&p, r).unwrap();
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
    // --markdown writes into an existing folder (it never creates one silently).
    std::fs::create_dir_all(d.path().join("out")).unwrap();
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
        "--threshold-metric",
        "kernels/*/w4a16/*/m=1/*=15",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).0);
    // The old spelling is a hidden alias: it still parses, and help shows only the new one.
    let o = rigbench(&[
        "compare",
        "--baseline",
        s(&b),
        s(&c),
        "--metric-threshold",
        "kernels/*/w4a16/*/m=1/*=15",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).0);
    let help = text(&rigbench(&["compare", "--help"])).0;
    assert!(
        help.contains("--threshold-metric") && !help.contains("--metric-threshold"),
        "{help}"
    );
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
    let saved =
        rigbench::compare::save_baseline(&results(1, 1.0), &dir, "test-suite", false).unwrap();
    assert_eq!(saved.path, dir.join("nvidia-h200-sm90/test-suite.json"));
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
        vec!["--threshold-metric", "no-equals-sign"],
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

#[test]
fn deterministic_only_skips_timings_without_calling_them_missing() {
    let d = tempfile::tempdir().unwrap();
    let b = write(d.path(), "base.json", &results(1, 1.0));
    // A 10% slowdown is a timing verdict: not compared.
    let c = write(d.path(), "cur.json", &results(101, 1.10));
    let o = rigbench(&[
        "compare",
        "--deterministic-only",
        "--baseline",
        s(&b),
        s(&c),
    ]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    assert!(
        out.contains("Not compared (timing; --deterministic-only): 3 timing metrics"),
        "{out}"
    );
    assert!(
        !out.contains("| `kernels/rigbench/w4a16/gate_up/m=1/time_s`"),
        "{out}"
    );
    assert!(
        out.contains("check/rel_l2") && out.contains("bit_exact"),
        "{out}"
    );
    assert!(err.contains("3 timing metrics not compared"), "{err}");
    // Timings absent from the results are not missing either; a vanished check still is.
    let mut cur = results(101, 1.0);
    let k = cur.kernels.as_mut().unwrap();
    k.cases.retain(|c| c.m != 16);
    let c = write(d.path(), "fewer.json", &cur);
    let o = rigbench(&[
        "compare",
        "--deterministic-only",
        "--baseline",
        s(&b),
        s(&c),
    ]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("**0 regressed, 1 missing**"), "{out}");
    assert!(out.contains("m=16/check/rel_l2` (Missing)"), "{out}");
    // JSON lists every metric left out.
    let o = rigbench(&[
        "compare",
        "--deterministic-only",
        "--json",
        "--baseline",
        s(&b),
        s(&c),
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["settings"]["deterministic_only"], true);
    assert_eq!(v["counts"]["not_compared"], 3);
    assert_eq!(v["not_compared"].as_array().unwrap().len(), 3);
}

/// The committed CPU baseline that `.ci/run` gates on.
const CI_BASELINE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/baselines/ci-cpu/qwen3.6-27b.json"
);

fn ci_baseline() -> serde_json::Value {
    let text = std::fs::read_to_string(CI_BASELINE).expect("the committed CI baseline");
    serde_json::from_str(&text).expect("the CI baseline is JSON")
}

fn write_json(dir: &Path, name: &str, v: &serde_json::Value) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p
}

/// Compare `current` with `baseline` (deterministic metrics only): exit code and stdout.
fn gate(dir: &Path, baseline: &serde_json::Value, current: &serde_json::Value) -> (i32, String) {
    let b = write_json(dir, "gate-baseline.json", baseline);
    let c = write_json(dir, "gate-results.json", current);
    let o = rigbench(&[
        "compare",
        "--deterministic-only",
        "--baseline",
        s(&b),
        s(&c),
    ]);
    (o.status.code().unwrap_or(-1), text(&o).0)
}

fn row<'a>(out: &'a str, id: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(&format!("| `{id}`")))
        .unwrap_or_else(|| panic!("no row {id} in {out}"))
}

#[test]
fn ci_baseline_passes_on_itself_and_fails_when_perturbed() {
    let d = tempfile::tempdir().unwrap();
    let base = ci_baseline();
    let suite = base["kernels"]["suite"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(suite, "qwen3.6-27b", "the file name .ci/run passes");
    assert!(base["rig"]["gpu"].is_null(), "a CPU-only baseline");

    let (code, out) = gate(d.path(), &base, &base);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("**No regression**"), "{out}");
    assert!(
        out.contains("Not compared (timing; --deterministic-only)"),
        "{out}"
    );
    for id in [
        "e2e/tiny/c=1/kv/capacity_tokens",
        "e2e/tiny/c=4/output_tokens/produced",
        "e2e/tiny/c=2/validity",
        "kernels/reference_accuracy/w4a16/16×256×2048/plain/rel_l2_vs_exact",
        "kernels/reference_accuracy/w4a16/16×256×2048/outliers/rel_l2_vs_exact",
        "checkpoint/qwen36-mixed-clean/lint/gdn-ab-quantized",
        "checkpoint/qwen36-mixed-clean/lint/errors",
        "checkpoint/qwen36-mixed-clean/capacity/kv_bytes_per_token",
    ] {
        assert!(row(&out, id).contains("| Same"), "{id}: {out}");
    }
    assert!(!out.contains("tok_per_s") && !out.contains("throughput"));

    // Another CPU-only host (other CPU, architecture, RAM, kernel, host name): still comparable.
    let mut other_host = base.clone();
    other_host["rig"]["host"] = serde_json::json!({
        "arch": "aarch64",
        "cpu_logical_cores": 64,
        "cpu_model": "Neoverse-V2",
        "hostname": "ci-runner-7",
        "kernel": "6.1.0",
        "os": "Linux (Ubuntu 24.04)",
        "ram_bytes": 1u64 << 37
    });
    let (code, out) = gate(d.path(), &base, &other_host);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("Other rig differences (not blocking)") && out.contains("aarch64"));

    // A perturbed baseline: more KV capacity than the runtime now reports.
    let mut b = base.clone();
    let cap = &mut b["e2e"]["runs"][0]["conditions"]["kv"]["capacity_tokens"]["value"];
    *cap = (cap.as_u64().unwrap() + 16).into();
    let (code, out) = gate(d.path(), &b, &base);
    assert_eq!(code, 2, "{out}");
    assert!(
        row(&out, "e2e/tiny/c=1/kv/capacity_tokens").contains("**Regressed**"),
        "{out}"
    );

    // A perturbed baseline: a reference accuracy 1% better than the code now computes.
    let mut b = base.clone();
    let acc = b["kernels"]["reference_accuracy"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|a| a["format"] == "w4a16" && a["data_id"] == "plain")
        .unwrap();
    acc["rel_l2_vs_exact"] = (acc["rel_l2_vs_exact"].as_f64().unwrap() * 0.99).into();
    let (code, out) = gate(d.path(), &b, &base);
    assert_eq!(code, 2, "{out}");
    assert!(
        row(
            &out,
            "kernels/reference_accuracy/w4a16/16×256×2048/plain/rel_l2_vs_exact"
        )
        .contains("**Regressed**"),
        "{out}"
    );

    // A perturbed baseline: another format in the module table.
    let mut b = base.clone();
    let m = b["checkpoint"]["modules"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|m| {
            m["module"]
                .as_str()
                .unwrap()
                .ends_with("linear_attn.in_proj_a")
        })
        .unwrap();
    assert_eq!(m["format"]["kind"], "bf16");
    m["format"] = serde_json::json!({"kind": "f16"});
    let (code, out) = gate(d.path(), &b, &base);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("must match: FP16 ×1 [layers 0] → BF16 ×1 [layers 0]"),
        "{out}"
    );

    // Results with a new lint error: the rule's label and the error count regress.
    let mut c = base.clone();
    c["checkpoint"]["findings"] = serde_json::json!([{
        "rule": "gdn-ab-quantized",
        "severity": "error",
        "why": "test",
        "detail": "test",
        "modules": [],
        "module_count": 1
    }]);
    let (code, out) = gate(d.path(), &base, &c);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("**2 regressed, 0 missing**"), "{out}");
    assert!(
        row(&out, "checkpoint/qwen36-mixed-clean/lint/gdn-ab-quantized").contains("| absent")
            && row(&out, "checkpoint/qwen36-mixed-clean/lint/gdn-ab-quantized").contains("| error"),
        "{out}"
    );

    // Results whose run turned invalid, with a request fewer produced.
    let mut c = base.clone();
    c["e2e"]["runs"][1]["validity"]["valid"] = false.into();
    c["e2e"]["runs"][1]["validity"]["reasons"] = serde_json::json!(["planted by the test"]);
    c["e2e"]["runs"][1]["requests"][0]["ok"] = false.into();
    c["e2e"]["runs"][1]["requests"][0]["error"] = "planted".into();
    let (code, out) = gate(d.path(), &base, &c);
    assert_eq!(code, 2, "{out}");
    for id in [
        "e2e/tiny/c=2/validity",
        "e2e/tiny/c=2/requests/completed",
        "e2e/tiny/c=2/requests/failed",
        "e2e/tiny/c=2/output_tokens/produced",
    ] {
        assert!(row(&out, id).contains("**Regressed**"), "{id}: {out}");
    }
    // Without --deterministic-only the invalid run's timings are missing, with the reason.
    let b = write_json(d.path(), "b.json", &base);
    let cur = write_json(d.path(), "c.json", &c);
    let o = rigbench(&["compare", "--baseline", s(&b), s(&cur)]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        row(&out, "e2e/tiny/c=2/ttft_s").contains("**Missing**"),
        "{out}"
    );
    assert!(
        out.contains(
            "run c=2 is invalid (planted by the test); timings of invalid runs are not compared"
        ),
        "{out}"
    );
    // ... and the valid runs' timings are compared (identical samples: no regression; with 8
    // requests the interval is wide, so Same, Ambiguous or Not enough samples).
    let r = row(&out, "e2e/tiny/c=1/tpot_s");
    assert!(
        r.contains("| Same") || r.contains("| Ambiguous") || r.contains("| Not enough samples"),
        "{r}"
    );
}
