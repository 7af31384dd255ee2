//! The peer script's crash handling and resume (src/kernels/peers.rs), with a stand-in
//! `python3` first on PATH (this file is its own test process, so changing PATH is safe):
//! - a case that kills the script is recorded as skipped with the exit status and the script's
//!   last error line, and the script is started again with `resume` for the other cases;
//! - the cases finished before the crash are kept (nothing measured is lost);
//! - a stopped run's progress file is continued with `peers_resume`.

use rigbench::kernels::bench::BenchOptions;
use rigbench::kernels::peers::{run_into, PeerMode};
use rigbench::kernels::schema::{KernelResults, TimingModes};
use std::path::Path;

const CASE: &str = r#"{"provider":"torch","implementation":"torch.matmul","format":"bf16","shape":"SHAPE","m":1,"n":16,"k":32,"path":"p",
 "check":{"reference":"r","metric":"rel_l2","value":0.001,"tolerance_name":"PEER_REL_L2","tolerance":0.005,"passed":true},
 "samples_s":[2e-5,2e-5,2e-5],"stop_reason":"converged","weight_bytes":1024}"#;

fn case(shape: &str) -> String {
    CASE.replace("SHAPE", shape)
}

/// A stand-in python3: without `"resume":true` in the spec it writes one finished case and
/// `in_flight` = (torch.matmul, second, M=1), prints an error and exits 1 (as a CUDA illegal
/// memory access ends the real script); with it, it checks that the crashed case was recorded
/// as skipped, keeps the earlier case and adds a third, and exits 0. Every call is logged.
fn fake_python(dir: &Path) {
    let first = format!(
        r#"{{"peers":[{{"provider":"torch","implementations":["torch.matmul"],"available":true,"detail":"fake"}}],"cases":[{}],"skipped":[],"in_flight":{{"provider":"torch","implementation":"torch.matmul","shape":"second","m":1}}}}"#,
        case("first")
    );
    let script = format!(
        r#"#!/bin/sh
spec=$3; out=$5
echo call >> "{log}"
if grep -q '"resume":true' "$spec"; then
  grep -q 'died on this case' "$out" || {{ echo "resume without the crashed case skipped" >&2; exit 3; }}
  grep -q '"in_flight":null' "$out" || {{ echo "in_flight not cleared" >&2; exit 3; }}
  printf '%s' '{{"peers":[{{"provider":"torch","implementations":["torch.matmul"],"available":true,"detail":"fake"}}],"cases":[{c1},{c3}],"skipped":[{{"provider":"torch","implementation":"torch.matmul","shape":"second","m":1,"reason":"kept"}}],"in_flight":null}}' > "$out"
  exit 0
fi
printf '%s' '{first}' > "$out"
echo "torch.AcceleratorError: CUDA error: an illegal memory access was encountered" >&2
exit 1
"#,
        log = dir.join("calls.log").display(),
        c1 = case("first"),
        c3 = case("third"),
    );
    let p = dir.join("python3");
    std::fs::write(&p, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn opts(progress: &Path, resume: bool) -> BenchOptions {
    BenchOptions {
        suite: rigbench::kernels::suite::load("smoke").unwrap(),
        formats: vec![],
        stopping: rigbench::stats::StoppingRule::default(),
        warmup: 3,
        cold_l2: true,
        flush: rigbench::gpu::FlushMethod::Read,
        tune_samples: 5,
        determinism_m: vec![],
        determinism_runs: 5,
        peers: PeerMode::On,
        timing: TimingModes::Cold,
        peers_progress: Some(progress.to_path_buf()),
        peers_resume: resume,
    }
}

#[test]
fn a_crashing_case_is_skipped_and_the_script_restarted_for_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    fake_python(dir.path());
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    std::env::set_var("PATH", path);
    let progress = dir.path().join("peers-progress.json");

    let mut k = KernelResults::default();
    run_into(&opts(&progress, false), &mut k);
    let calls = std::fs::read_to_string(dir.path().join("calls.log")).unwrap();
    assert_eq!(calls.lines().count(), 2, "started once, then once again");
    let shapes: Vec<&str> = k.cases.iter().map(|c| c.shape.as_str()).collect();
    assert_eq!(
        shapes,
        ["first", "third"],
        "the case before the crash is kept"
    );
    let crashed: Vec<_> = k
        .skipped
        .iter()
        .filter(|s| s.shape == "second" && s.implementation == "torch.matmul")
        .collect();
    assert_eq!(crashed.len(), 1, "{:?}", k.skipped);
    assert!(
        k.notes.iter().all(|n| !n.contains("stopped early")),
        "the restarted script finished: {:?}",
        k.notes
    );
    assert!(progress.exists(), "the progress file stays for a resume");

    // A stopped run (its output holds one case and no in-flight one) is continued on resume.
    std::fs::write(
        &progress,
        format!(
            r#"{{"peers":[],"cases":[{}],"skipped":[{{"provider":"torch","implementation":"torch.matmul","shape":"second","m":1,"reason":"the peer process died on this case"}}],"in_flight":null}}"#,
            case("first")
        ),
    )
    .unwrap();
    let mut k = KernelResults::default();
    run_into(&opts(&progress, true), &mut k);
    let calls = std::fs::read_to_string(dir.path().join("calls.log")).unwrap();
    assert_eq!(calls.lines().count(), 3, "one more start, with resume");
    assert_eq!(k.cases.len(), 2);
}
