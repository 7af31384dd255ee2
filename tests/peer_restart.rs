//! The peer script's crash handling and resume (src/kernels/peers.rs), with a stand-in
//! `python3` first on PATH (this file is its own test binary, not a module of `tests/it/`, so
//! changing PATH and sending SIGTERM to the test process are safe):
//! - a case that kills the script is recorded as skipped with the exit status and the script's
//!   last error line, and the script is started again with `resume` for the other cases;
//! - the cases finished before the crash are kept (nothing measured is lost);
//! - a stopped run's progress file is continued with `peers_resume`.

use rigbench::kernels::bench::BenchOptions;
use rigbench::kernels::peers::{run_into, PeerMode};
use rigbench::kernels::schema::KernelResults;
use std::path::Path;

const CASE: &str = r#"{"provider":"torch","implementation":"torch.matmul","format":"bf16","shape":"SHAPE","m":1,"n":16,"k":32,"path":"p",
 "check":{"reference":"r","metric":"rel_l2","value":0.001,"tolerance_name":"PEER_REL_L2","tolerance":0.005,"passed":true},
 "samples_s":[2e-5,2e-5,2e-5],"stop_reason":"converged","weight_bytes":1024}"#;

fn case(shape: &str) -> String {
    CASE.replace("SHAPE", shape)
}

/// A stand-in python3, its behaviour chosen by `FAKE_MODE`:
/// - `crash`: without `"resume":true` in the spec it writes one finished case and `in_flight` =
///   (torch.matmul, second, M=1), prints a CUDA error and exits 1; with it, it checks that the
///   crashed case was recorded as skipped and `in_flight` cleared, keeps the earlier case, adds
///   a third and exits 0;
/// - `die`: writes one finished case, no case in flight, exits 1 (a failure between cases);
/// - `term`: writes one case with one in flight and is killed by SIGTERM (as a process group's
///   signal stops it);
/// - `always`: crashes like `crash` on every start, resume or not;
/// - `sleep`: writes one case, then sleeps 30 s (to be stopped by rigbench's SIGTERM).
///
/// Every call is logged.
fn fake_python(dir: &Path) {
    let first = format!(
        r#"{{"peers":[{{"provider":"torch","implementations":["torch.matmul"],"available":true,"detail":"fake"}}],"cases":[{}],"skipped":[],"in_flight":{{"provider":"torch","implementation":"torch.matmul","shape":"second","m":1}}}}"#,
        case("first")
    );
    let between = format!(
        r#"{{"peers":[],"cases":[{}],"skipped":[],"in_flight":null}}"#,
        case("first")
    );
    let script = format!(
        r#"#!/bin/sh
spec=$3; out=$5
echo call >> "{log}"
case "$FAKE_MODE" in
sleep) printf '%s' '{between}' > "$out"; sleep 30; exit 0 ;;
die) printf '%s' '{between}' > "$out"; echo "RuntimeError: something between cases" >&2; exit 1 ;;
term) printf '%s' '{first}' > "$out"; kill -TERM $$ ;;
always) if [ -f "$out" ]; then sed -i 's/"in_flight":null/"in_flight":{{"provider":"torch","implementation":"torch.matmul","shape":"second","m":1}}/' "$out"; else printf '%s' '{first}' > "$out"; fi; echo "torch.AcceleratorError: CUDA error: an illegal memory access was encountered" >&2; echo "peers: second M=1 done (1 s)" >&2; exit 70 ;;
esac
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

fn calls(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("calls.log"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// The skipped entry that says the peer run stopped before its end, if any.
fn stopped(k: &KernelResults) -> Option<String> {
    k.skipped
        .iter()
        .find(|s| s.provider == rigbench::kernels::peers::PEERS_STOPPED_PROVIDER)
        .map(|s| s.reason.clone())
}

fn opts(progress: &Path, resume: bool) -> BenchOptions {
    BenchOptions {
        formats: vec![],
        peers: PeerMode::On,
        peers_progress: Some(progress.to_path_buf()),
        peers_resume: resume,
        // The stand-in script needs no NVFP4 references (their computation would delay its
        // start past the SIGTERM phase's timer).
        peer_providers: vec!["torch".into()],
        ..BenchOptions::new(rigbench::kernels::suite::load("smoke").unwrap())
    }
}

/// One test (this file is its own process): it changes PATH and FAKE_MODE, which other tests
/// in the same process would see.
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
    // One phase: the fake script in `mode`, a fresh progress file, no resume; the results and
    // how many times the script was started.
    let phase = |mode: &str| {
        std::env::set_var("FAKE_MODE", mode);
        let _ = std::fs::remove_file(&progress);
        let before = calls(dir.path());
        let mut k = KernelResults::default();
        run_into(&opts(&progress, false), &mut k);
        (k, calls(dir.path()) - before)
    };

    // A case that kills the script: skipped with the exit and the error, the rest run.
    let (k, starts) = phase("crash");
    assert_eq!(starts, 2, "started once, then once again");
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
    assert_eq!(stopped(&k), None, "the restarted script finished");
    assert!(progress.exists(), "the progress file stays for a resume");
    let text = std::fs::read_to_string(&progress).unwrap();
    assert!(
        text.contains("third"),
        "the progress file holds the final output"
    );

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
    assert_eq!(calls(dir.path()), 3, "one more start, with resume");
    assert_eq!(k.cases.len(), 2);

    // The reason of a crash names the exit and the script's error line, not a progress line;
    // a case that crashes every time stops the restarts after PEER_RESTARTS.
    let (k, starts) = phase("always");
    assert_eq!(starts, 1 + rigbench::kernels::peers::PEER_RESTARTS);
    let crash = k
        .skipped
        .iter()
        .find(|s| s.reason.contains("died on this case"))
        .expect("the crashed case is skipped");
    assert!(
        crash.reason.contains("exit status: 70") && crash.reason.contains("illegal memory access"),
        "{}",
        crash.reason
    );
    let why = stopped(&k).expect("the stop is in the skipped list");
    assert!(
        why.contains("restarts") && why.contains("--resume"),
        "{why}"
    );
    assert_eq!(k.cases.len(), 1, "the finished case is kept");

    // Dying between cases: no restart (nothing to blame), the stop says how to continue.
    let (k, starts) = phase("die");
    assert_eq!(starts, 1);
    let why = stopped(&k).expect("the stop is in the skipped list");
    assert!(
        why.contains("something between cases") && why.contains("--resume"),
        "{why}"
    );
    assert_eq!(k.cases.len(), 1);

    // Stopped by SIGTERM from outside: not a crash of the case in flight, no restart.
    let (k, starts) = phase("term");
    assert_eq!(starts, 1);
    assert!(
        k.skipped
            .iter()
            .all(|s| !s.reason.contains("died on this case")),
        "{:?}",
        k.skipped
    );
    let why = stopped(&k).expect("the stop is in the skipped list");
    assert!(why.contains("signal 15"), "{why}");

    // SIGTERM to rigbench (last: the flag stays set for this process) reaches the script's
    // process group: it stops at once, and the case it finished is kept.
    std::env::set_var("FAKE_MODE", "sleep");
    std::fs::remove_file(&progress).unwrap();
    rigbench::signals::install().unwrap();
    std::thread::spawn(|| {
        std::thread::sleep(std::time::Duration::from_millis(800));
        // SAFETY: kill(2) on this process's own pid.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGTERM);
        }
    });
    let t0 = std::time::Instant::now();
    let mut k = KernelResults::default();
    run_into(&opts(&progress, false), &mut k);
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(15),
        "the sleeping script was stopped, not waited for ({:?})",
        t0.elapsed()
    );
    let why = stopped(&k).expect("the stop is in the skipped list");
    assert!(why.contains("interrupted by SIGTERM"), "{why}");
    assert_eq!(k.cases.len(), 1, "the case the script finished is kept");
    assert!(
        std::fs::read_to_string(&progress)
            .unwrap()
            .contains("\"in_flight\":null"),
        "the sleeping script's own output"
    );
}
