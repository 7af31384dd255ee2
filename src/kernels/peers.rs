//! Peer providers run in the same session: `scripts/peer_kernels.py` (embedded in the binary and
//! written to a temporary file), driven with rigbench's shapes, M values, L2 flush size, stopping
//! rule and timing modes. Its rows are labelled by provider (e.g. `torch`, `gemlite`) and never
//! mixed with rigbench's own; their speedups use the same denominator as rigbench's rows
//! (rigbench's `bf16` at the same shape and M). The SM clock is polled while the script runs,
//! and each peer case gets the readings of its own wall-clock window. Pure-Python peers carried
//! to the GPU machine (gemlite) are looked for in `.peers/` (see `scripts/fetch-peers.sh`).

use std::path::PathBuf;
use std::process::Command;

use serde::Deserialize;

use super::bench::{fill_derived, timing_of, BenchOptions};
use super::clocks::ClockMonitor;
use super::schema::*;
use crate::formats::GemmFormat;
use crate::stats::StopReason;

/// The provider script.
pub const SCRIPT: &str = include_str!("../../scripts/peer_kernels.py");

/// Environment variable naming a folder of carried pure-Python peer packages (default: `.peers`
/// in the working directory, or next to the source tree the binary was built in).
pub const PEERS_DIR_ENV: &str = "RIGBENCH_PEERS_DIR";

/// The peer providers the script knows (`--peer-providers`): PyTorch's own ops, gemlite,
/// Humming, vLLM's Marlin built from its sources, and vLLM's ops when it is installed.
pub const PROVIDERS: &[&str] = &["torch", "gemlite", "humming", "vllm-marlin", "vllm"];

/// Whether to run peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PeerMode {
    /// Run them when `python3` with PyTorch and a GPU is found; say why not otherwise.
    Auto,
    /// Do not run them.
    Off,
    /// Run them, and note loudly when they cannot run.
    On,
}

#[derive(Deserialize)]
struct PeerOut {
    peers: Vec<PeerStatus>,
    cases: Vec<PeerCase>,
    skipped: Vec<PeerSkip>,
    /// The case the script was running when it last saved (`null` between cases).
    #[serde(default)]
    in_flight: Option<PeerKey>,
}

/// A peer case's key (the script's `in_flight`).
#[derive(Deserialize, Clone, Debug)]
struct PeerKey {
    provider: String,
    implementation: String,
    shape: String,
    m: usize,
}

/// Samples of one timed part as the script reports them.
#[derive(Deserialize)]
struct PeerTiming {
    name: String,
    samples_s: Vec<f64>,
    #[serde(default)]
    stop_reason: Option<StopReason>,
}

#[derive(Deserialize)]
struct PeerGraph {
    samples_s: Vec<f64>,
    #[serde(default)]
    stop_reason: Option<StopReason>,
    launches: usize,
    weight_copies: usize,
    weight_bytes_total: u64,
    #[serde(default)]
    extra: Vec<PeerTiming>,
}

#[derive(Deserialize)]
struct PeerCase {
    provider: String,
    implementation: String,
    format: GemmFormat,
    shape: String,
    m: usize,
    n: usize,
    k: usize,
    path: String,
    check: CheckResult,
    /// Cold samples (empty when only graph timing ran).
    samples_s: Vec<f64>,
    #[serde(default)]
    stop_reason: Option<StopReason>,
    #[serde(default)]
    weight_bytes: Option<u64>,
    #[serde(default)]
    extra: Vec<PeerTiming>,
    #[serde(default)]
    graph: Option<PeerGraph>,
    #[serde(default)]
    graph_skip: Option<String>,
    /// Unix seconds when the case's sampling began and ended.
    #[serde(default)]
    t_start: Option<f64>,
    #[serde(default)]
    t_end: Option<f64>,
    /// The configuration the implementation chose for this case (Humming's heuristic, Marlin's
    /// launch plan), in words.
    #[serde(default)]
    config: Option<String>,
}

#[derive(Deserialize)]
struct PeerSkip {
    provider: String,
    implementation: String,
    shape: String,
    m: usize,
    reason: String,
}

/// Bytes of weights a peer implementation streams for `[n, k]` (used when the script does not
/// report them).
fn peer_weight_bytes(implementation: &str, n: usize, k: usize) -> u64 {
    let e = (n * k) as u64;
    match implementation {
        "torch._scaled_mm" => e + 4,
        // INT4 codes plus a BF16 scale and zero per 128-element group.
        "torch._weight_int4pack_mm" | "gemlite.A16W4_INT_g128" => e / 2 + e / 128 * 4,
        _ => 2 * e,
    }
}

/// A timing from the script's samples; `None` when there are none. Peer scripts before stop
/// reasons were reported give `None` there.
fn peer_timing(
    samples: Vec<f64>,
    reason: Option<StopReason>,
    cold_l2: bool,
    graph: Option<GraphSetup>,
) -> Option<Timing> {
    // timing_of needs a reason; keep the script's, or none.
    let mut t = timing_of(
        samples,
        reason.unwrap_or(StopReason::SampleCap),
        cold_l2,
        graph,
    )
    .ok()?;
    t.stop_reason = reason;
    Some(t)
}

fn named(extra: Vec<PeerTiming>, cold_l2: bool, graph: Option<&GraphSetup>) -> Vec<NamedTiming> {
    extra
        .into_iter()
        .filter_map(|e| {
            Some(NamedTiming {
                name: e.name,
                timing: peer_timing(
                    e.samples_s,
                    e.stop_reason,
                    cold_l2,
                    graph.map(|g| GraphSetup {
                        weight_copies: 0,
                        weight_bytes_total: 0,
                        ..g.clone()
                    }),
                )?,
            })
        })
        .collect()
}

/// Turn the script's cases into kernel cases: timings (cold primary when present, else graph),
/// weight bytes, clocks from `clocks` over each case's window, and derived figures against
/// rigbench's `bf16` rows in `own` (one denominator for every provider).
fn to_cases(
    out: Vec<PeerCase>,
    own: &[KernelCase],
    cold_l2: bool,
    copy: Option<f64>,
    clocks: Option<&ClockMonitor>,
) -> Vec<KernelCase> {
    let mut cases = Vec::new();
    for c in out {
        let cold = peer_timing(c.samples_s, c.stop_reason, cold_l2, None);
        let cold_extra = named(c.extra, cold_l2, None);
        let graph = c.graph.and_then(|g| {
            let setup = GraphSetup {
                launches: g.launches,
                weight_copies: g.weight_copies,
                weight_bytes_total: g.weight_bytes_total,
            };
            let extra = named(g.extra, false, Some(&setup));
            Some(GraphTimings {
                timing: peer_timing(g.samples_s, g.stop_reason, false, Some(setup))?,
                extra,
            })
        });
        let (timing, extra, graph) = match (cold, graph) {
            (Some(t), g) => (t, cold_extra, g),
            (None, Some(g)) => (g.timing, g.extra, None),
            (None, None) => continue,
        };
        let stats = match (clocks, c.t_start, c.t_end) {
            (Some(m), Some(a), Some(b)) => m.window(a, b),
            _ => None,
        };
        let mut kc = KernelCase {
            provider: c.provider,
            derived: Derived {
                weight_bytes: c
                    .weight_bytes
                    .unwrap_or_else(|| peer_weight_bytes(&c.implementation, c.n, c.k)),
                ..Default::default()
            },
            implementation: c.implementation,
            format: c.format,
            shape: c.shape,
            m: c.m,
            n: c.n,
            k: c.k,
            path: match c.config.as_deref().filter(|x| !x.is_empty()) {
                Some(cfg) => format!("{}; {CONFIG_LABEL}{cfg}", c.path),
                None => c.path,
            },
            check: Some(c.check),
            timing,
            extra,
            sm_clock_mhz: stats.as_ref().and_then(|s| s.median_mhz),
            throttle: stats
                .as_ref()
                .map(|s| s.throttle_seen.clone())
                .unwrap_or_default(),
            graph,
            graph_skip: c.graph_skip,
            clocks: stats,
        };
        let base = own
            .iter()
            .find(|b| {
                b.provider == "rigbench"
                    && b.implementation == "bf16"
                    && b.shape == kc.shape
                    && b.m == kc.m
            })
            .map(|b| b.timing.median_s);
        fill_derived(&mut kc, copy, base);
        cases.push(kc);
    }
    cases
}

/// What precedes the configuration a peer chose in its case's `path`.
pub const CONFIG_LABEL: &str = "configuration: ";

/// Folders of carried pure-Python peer packages that exist: `$RIGBENCH_PEERS_DIR`, `./.peers`,
/// and `.peers` at the root of the source tree the binary sits in (`target/release/rigbench`).
pub fn peer_dirs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os(PEERS_DIR_ENV) {
        v.push(PathBuf::from(d));
    }
    v.push(PathBuf::from(".peers"));
    if let Ok(exe) = std::env::current_exe() {
        if let Some(root) = exe
            .parent()
            .and_then(|p| p.parent())
            .and_then(|p| p.parent())
        {
            v.push(root.join(".peers"));
        }
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for d in v {
        if let Ok(abs) = std::fs::canonicalize(&d) {
            if abs.is_dir() && !out.contains(&abs) {
                out.push(abs);
            }
        }
    }
    out
}

/// Run the peers and append their rows, statuses and skips to `k`, then refresh the composite.
/// Problems are recorded, never returned: peers are optional.
pub fn run_into(opts: &BenchOptions, k: &mut KernelResults) {
    if opts.peers == PeerMode::Off {
        return;
    }
    let started = std::time::Instant::now();
    // Peers run on CUDA device 0; its telemetry is matched by PCI bus id.
    let clocks = ClockMonitor::for_reader(crate::rig::telemetry::TelemetryReader::for_pci_bus_id(
        crate::gpu::multi::pci_bus_id(0).as_deref(),
        0,
    ));
    let result = run_script(opts, k);
    match result {
        Ok((out, stopped)) => {
            if let Some(why) = stopped {
                // In the skipped list (the verdict shows it), with the way to finish the rest.
                k.skipped.push(SkippedCase {
                    provider: PEERS_STOPPED_PROVIDER.into(),
                    implementation: "*".into(),
                    shape: "*".into(),
                    m: None,
                    reason: format!(
                        "the peer script stopped before its end ({why}) after {} cases; the cases it finished are kept; `rigbench report --resume <this report's folder>` continues the rest",
                        out.cases.len()
                    ),
                });
            }
            k.peers.extend(out.peers);
            let copy = k.copy_bandwidth.as_ref().map(|c| c.bytes_per_s);
            let new_cases = to_cases(out.cases, &k.cases, opts.cold_l2, copy, Some(&clocks));
            k.cases.extend(new_cases);
            for s in out.skipped {
                k.skipped.push(SkippedCase {
                    provider: s.provider,
                    implementation: s.implementation,
                    shape: s.shape,
                    m: Some(s.m),
                    reason: s.reason,
                });
            }
            k.notes.push(format!(
                "peer providers ran in {:.0} s{}",
                started.elapsed().as_secs_f64(),
                if opts.peers_resume {
                    " in this process"
                } else {
                    ""
                }
            ));
        }
        Err(e) => {
            k.peers.push(PeerStatus {
                provider: "torch".into(),
                implementations: vec![],
                available: false,
                detail: format!("{e:#}"),
            });
            if opts.peers == PeerMode::On {
                k.notes.push(format!(
                    "peers were requested (--peers on) but could not run: {e:#}"
                ));
            }
        }
    }
    drop(clocks);
    super::composite::refresh(k);
}

/// The spec the script reads (see its docstring).
fn spec(opts: &BenchOptions, k: &KernelResults, dirs: &[PathBuf]) -> serde_json::Value {
    let policy = k.timing_policy.as_ref();
    serde_json::json!({
        "shapes": opts.suite.shapes.iter().map(|s| serde_json::json!({"name": s.name, "n": s.n, "k": s.k})).collect::<Vec<_>>(),
        "m": opts.suite.m,
        "l2_flush_bytes": policy.map(|p| p.l2_flush_bytes).unwrap_or(0),
        "warmup": opts.warmup,
        "stopping": opts.stopping,
        "timing": {
            "cold": opts.timing.cold(),
            "graph": opts.timing.graph(),
            "graph_min_total_bytes": policy.and_then(|p| p.graph.as_ref()).map(|g| g.min_total_weight_bytes).unwrap_or(0),
            "graph_min_launches": super::bench::GRAPH_MIN_LAUNCHES,
            "graph_max_copies": super::bench::GRAPH_MAX_COPIES,
        },
        "sys_path": dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>(),
        "providers": if opts.peer_providers.is_empty() { serde_json::Value::Null } else { serde_json::json!(opts.peer_providers) },
    })
}

/// Whether provider `p` runs under `opts`.
fn wants(opts: &BenchOptions, p: &str) -> bool {
    opts.peer_providers.is_empty() || opts.peer_providers.iter().any(|x| x == p)
}

/// How many times the peer script is started again after a case killed it.
pub const PEER_RESTARTS: usize = 8;

/// The `provider` of the skipped entry that records a peer run stopped before its end (the one
/// entry with this provider; `report --resume` looks for it).
pub const PEERS_STOPPED_PROVIDER: &str = "peers";

/// Run the peer script; returns what it wrote and, when it did not finish, why (a signal to
/// rigbench or to the script, or a failure after partial results). The script saves its output
/// after every case (atomically) into `opts.peers_progress` (or a temporary file), so the cases
/// finished before a stop are kept: nothing already measured is lost.
///
/// A case that kills the script (a CUDA illegal memory access poisons the whole context, so the
/// process must end) stays named in the output's `in_flight`: it is recorded as skipped with
/// the exit status and the script's last error line, and the script is started again with
/// `resume`, so that the other cases still run (at most [`PEER_RESTARTS`] times).
///
/// # Errors
/// python3 cannot be started, or the script wrote no readable results at all.
fn run_script(opts: &BenchOptions, k: &KernelResults) -> anyhow::Result<(PeerOut, Option<String>)> {
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("peer_kernels.py");
    std::fs::write(&script, SCRIPT)?;
    let out_path = opts
        .peers_progress
        .clone()
        .unwrap_or_else(|| dir.path().join("peers.json"));
    let mut resume = opts.peers_resume && out_path.exists();
    let mut restarts = 0usize;
    // rigbench's NVFP4 operands and CPU references for the NVFP4 peers (computed once).
    let nvfp4 = ["humming", "vllm-marlin", "vllm"]
        .iter()
        .any(|p| wants(opts, p))
        .then(|| {
            super::peer_nvfp4::spec_section(
                &opts.suite,
                super::impls::w4a16::SEED_W,
                super::data::host_threads(),
            )
        });
    loop {
        if let Some(sig) = crate::signals::interrupted() {
            // Stopped before (re)starting the script: what an earlier start of this run (or
            // the run being resumed) saved is kept.
            let out = resume
                .then(|| std::fs::read_to_string(&out_path).ok())
                .flatten()
                .and_then(|t| serde_json::from_str::<PeerOut>(&t).ok())
                .unwrap_or(PeerOut {
                    peers: vec![],
                    cases: vec![],
                    skipped: vec![],
                    in_flight: None,
                });
            return Ok((
                out,
                Some(format!(
                    "rigbench was interrupted by {sig} before the peer script started"
                )),
            ));
        }
        let mut spec = spec(opts, k, &peer_dirs());
        spec["resume"] = serde_json::Value::Bool(resume);
        if let Some(v) = &nvfp4 {
            spec["nvfp4"] = v.clone();
        }
        let spec_path = dir.path().join("spec.json");
        std::fs::write(&spec_path, serde_json::to_vec(&spec)?)?;
        let (status, last_err) = run_once(&script, &spec_path, &out_path)?;
        let text = std::fs::read_to_string(&out_path).map_err(|e| {
            anyhow::anyhow!("the peer script wrote no results ({e}); exit status {status}")
        })?;
        let out: PeerOut = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("the peer script's output is malformed: {e}"))?;
        if status.success() {
            return Ok((out, None));
        }
        if let Some(sig) = crate::signals::interrupted() {
            return Ok((out, Some(format!("rigbench was interrupted by {sig}"))));
        }
        {
            use std::os::unix::process::ExitStatusExt;
            if let Some(sig) = status
                .signal()
                .filter(|s| [libc::SIGINT, libc::SIGTERM, libc::SIGHUP].contains(s))
            {
                // Stopped from outside (e.g. the process group's SIGTERM reached the script
                // before rigbench saw it): not a crash of the case in flight.
                return Ok((out, Some(format!("the script was stopped by signal {sig}"))));
            }
        }
        let why = format!(
            "it exited with {status}{}",
            last_err
                .as_deref()
                .map(|l| format!(" ({l})"))
                .unwrap_or_default()
        );
        let Some(crashed) = out.in_flight.clone() else {
            return Ok((out, Some(why)));
        };
        if restarts >= PEER_RESTARTS {
            return Ok((
                out,
                Some(format!(
                    "{why}; not started again after {PEER_RESTARTS} restarts"
                )),
            ));
        }
        restarts += 1;
        eprintln!(
            "rigbench: the peer script died on {} {} M={} ({why}); recording it as skipped and starting the script again for the remaining cases",
            crashed.implementation, crashed.shape, crashed.m
        );
        mark_crashed(&out_path, &crashed, &why)?;
        resume = true;
    }
}

/// Run the script once, its stderr passed through; returns its exit status and its last
/// non-empty stderr line other than progress lines. The script leads its own process group
/// (registered with `crate::signals`, so a second signal SIGKILLs it); a SIGINT/SIGTERM of
/// rigbench is passed on to that group (a terminal's Ctrl-C no longer reaches it directly).
///
/// # Errors
/// python3 cannot be started, or waiting for it fails.
fn run_once(
    script: &std::path::Path,
    spec_path: &std::path::Path,
    out_path: &std::path::Path,
) -> anyhow::Result<(std::process::ExitStatus, Option<String>)> {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    // Its own process group: a second signal to rigbench SIGKILLs the whole group (the script
    // and any worker it started), as for engines (src/signals.rs).
    let mut cmd = Command::new("python3");
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl(2),
    // which is async-signal-safe. PR_SET_PDEATHSIG: the script is SIGKILLed if rigbench dies
    // without stopping it (a SIGHUP or SIGKILL of rigbench), so it never outlives it.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = crate::gpu::nccl::apply_child_env(&mut cmd)
        .process_group(0)
        .arg(script)
        .arg("--spec")
        .arg(spec_path)
        .arg("--out")
        .arg(out_path)
        .env("PYTHONUNBUFFERED", "1")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| {
            anyhow::anyhow!(
                "python3 could not be started ({e}); install Python 3 with PyTorch for peer rows"
            )
        })?;
    let pgid = child.id();
    crate::signals::register_group(pgid);
    let last = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let reader = child.stderr.take().map(|err| {
        let last = last.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("{line}");
                // Progress lines ("peers: qkv M=1 done") do not explain an exit.
                if !line.trim().is_empty() && !line.starts_with("peers: ") {
                    if let Ok(mut l) = last.lock() {
                        *l = Some(line.trim().to_string());
                    }
                }
            }
        })
    });
    let mut signalled = false;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if !signalled && crate::signals::interrupted().is_some() {
            signalled = true;
            crate::signals::kill_group(pgid, libc::SIGTERM);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    // Anything the script left in its group (a worker) goes with it.
    crate::signals::kill_group(pgid, libc::SIGKILL);
    crate::signals::unregister_group(pgid);
    if let Some(r) = reader {
        let _ = r.join();
    }
    let last = last.lock().ok().and_then(|l| l.clone());
    Ok((status, last))
}

/// Record the case that killed the script as skipped in its output file (and clear
/// `in_flight`), so that a resumed run does not try it again.
fn mark_crashed(out_path: &std::path::Path, case: &PeerKey, why: &str) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(out_path)?;
    let mut v: serde_json::Value = serde_json::from_str(&text)?;
    let skip = serde_json::json!({
        "provider": case.provider,
        "implementation": case.implementation,
        "shape": case.shape,
        "m": case.m,
        "reason": format!("the peer process died on this case and was started again for the others: {why}"),
    });
    match v.get_mut("skipped").and_then(|s| s.as_array_mut()) {
        Some(a) => a.push(skip),
        None => v["skipped"] = serde_json::Value::Array(vec![skip]),
    }
    v["in_flight"] = serde_json::Value::Null;
    let tmp = out_path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec(&v)?)?;
    std::fs::rename(&tmp, out_path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_peer_output() {
        let text = r#"{"peers":[{"provider":"torch","implementations":["torch.matmul"],"available":true,"detail":"torch 2.11"}],
          "cases":[{"provider":"torch","implementation":"torch.matmul","format":"bf16","shape":"q","m":1,"n":16,"k":32,"path":"p",
                    "check":{"reference":"r","metric":"rel_l2","value":0.001,"tolerance_name":"PEER_REL_L2","tolerance":0.005,"passed":true},
                    "samples_s":[1e-5,2e-5]}],
          "skipped":[{"provider":"torch","implementation":"torch._scaled_mm","shape":"q","m":1,"reason":"x"}]}"#;
        let o: PeerOut = serde_json::from_str(text).unwrap();
        assert_eq!(o.cases.len(), 1);
        assert_eq!(o.cases[0].format, GemmFormat::Bf16);
        assert_eq!(
            peer_weight_bytes("torch._weight_int4pack_mm", 128, 128),
            8192 + 512
        );
    }

    #[test]
    fn peer_rows_use_rigbench_bf16_and_keep_stop_reasons_and_graph_timings() {
        let text = r#"{"peers":[],"skipped":[],"cases":[
          {"provider":"torch","implementation":"torch.matmul","format":"bf16","shape":"q","m":1,"n":16,"k":32,"path":"p",
           "check":{"reference":"r","metric":"rel_l2","value":0.001,"tolerance_name":"PEER_REL_L2","tolerance":0.005,"passed":true},
           "samples_s":[2e-5,2e-5,2e-5],"stop_reason":"time_cap","weight_bytes":1024,
           "graph":{"samples_s":[1.9e-5,1.9e-5],"stop_reason":"converged","launches":8,"weight_copies":4,"weight_bytes_total":4096,"extra":[]},
           "t_start":100.0,"t_end":101.0},
          {"provider":"torch","implementation":"torch._scaled_mm","format":"fp8","shape":"q","m":1,"n":16,"k":32,"path":"p",
           "check":{"reference":"r","metric":"rel_l2","value":0.001,"tolerance_name":"PEER_REL_L2","tolerance":0.005,"passed":true},
           "samples_s":[1e-5],"extra":[{"name":"activation_quant","samples_s":[4e-6],"stop_reason":"sample_cap"}]},
          {"provider":"gemlite","implementation":"gemlite.A16W4_INT_g128","format":"w4a16","shape":"q","m":1,"n":16,"k":128,"path":"p",
           "check":{"reference":"r","metric":"rel_l2","value":0.001,"tolerance_name":"PEER_REL_L2","tolerance":0.005,"passed":true},
           "samples_s":[],"graph":{"samples_s":[5e-6],"stop_reason":"sample_cap","launches":16,"weight_copies":16,"weight_bytes_total":16},
           "graph_skip":null}]}"#;
        let o: PeerOut = serde_json::from_str(text).unwrap();
        let mut own = crate::kernels::composite::tests::case_for_tests("bf16", 1e-5);
        own.timing.median_s = 1e-5;
        let cases = to_cases(o.cases, &[own], true, Some(1e12), None);
        assert_eq!(cases.len(), 3);
        let mm = &cases[0];
        // One denominator: rigbench's bf16 (10 µs) over the peer's 20 µs.
        assert_eq!(mm.derived.speedup_vs_bf16, Some(0.5));
        assert_eq!(mm.timing.stop_reason, Some(StopReason::TimeCap));
        assert_eq!(mm.derived.weight_bytes, 1024);
        let g = mm.graph.as_ref().unwrap();
        assert_eq!(g.timing.graph.as_ref().unwrap().weight_copies, 4);
        assert_eq!(g.timing.stop_reason, Some(StopReason::Converged));
        assert!(!g.timing.cold_l2);
        let sm = &cases[1];
        assert!(
            (sm.total_s() - 1.4e-5).abs() < 1e-15,
            "GEMM + activation quantization"
        );
        assert_eq!(
            sm.timing.stop_reason, None,
            "an older script reports no reason"
        );
        assert_eq!(
            sm.derived.weight_bytes,
            peer_weight_bytes("torch._scaled_mm", 16, 32)
        );
        // Graph only: the graph timing is the primary one.
        let gl = &cases[2];
        assert!(gl.graph.is_none() && gl.timing.graph.is_some());
        assert_eq!(gl.cold_timing(), None);
        assert_eq!(gl.derived.speedup_vs_bf16, Some(2.0));
    }

    #[test]
    fn spec_carries_timing_modes_and_peer_folders() {
        let opts = BenchOptions {
            formats: vec![],
            peers: PeerMode::On,
            timing: TimingModes::Both,
            ..BenchOptions::new(crate::kernels::suite::load("smoke").unwrap())
        };
        let k = KernelResults {
            timing_policy: Some(TimingPolicy {
                warmup_iters: 3,
                stopping: opts.stopping.clone(),
                l2_flush_bytes: 120 << 20,
                timer: String::new(),
                modes: TimingModes::Both,
                graph: Some(GraphPolicy {
                    min_total_weight_bytes: 240 << 20,
                    min_launches: 8,
                    description: String::new(),
                }),
            }),
            ..Default::default()
        };
        let v = spec(&opts, &k, &[PathBuf::from("/x/.peers")]);
        assert_eq!(v["timing"]["cold"], true);
        assert_eq!(v["timing"]["graph"], true);
        assert_eq!(v["timing"]["graph_min_total_bytes"], 240u64 << 20);
        assert_eq!(v["sys_path"][0], "/x/.peers");
        assert_eq!(v["stopping"]["min_samples"], opts.stopping.min_samples);
    }

    /// The script's pure helpers against rigbench's (python3 runs them; no torch needed): the
    /// hash, the NVFP4 code and scale bytes, the activation bits, Marlin's padding, its weight
    /// permutation (a permutation of one 16×64 block group) and the refusal prefix the composite
    /// reads.
    #[test]
    fn peer_script_helpers_match_rigbench() {
        use crate::kernels::data::{hash32, nvfp4_code_byte, nvfp4_scale_byte};
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("peer_kernels.py");
        std::fs::write(&script, SCRIPT).unwrap();
        let vals: Vec<u32> = vec![0, 1, 2, 255, 65_535, 123_456_789, 4_000_000_000, u32::MAX];
        let arg: Vec<String> = vals.iter().map(|v| v.to_string()).collect();
        let out = Command::new("python3")
            .arg(&script)
            .arg("--self-test")
            .arg(arg.join(","))
            .output()
            .expect("python3 runs (the peer script needs it; install Python 3)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let seed = super::super::impls::w4a16::SEED_W;
        assert_eq!(seed, 0x4A16_0001, "the self-test's seed");
        for (i, x) in vals.iter().enumerate() {
            assert_eq!(
                v["hash32"][i].as_u64().unwrap(),
                hash32(*x) as u64,
                "hash32({x})"
            );
            assert_eq!(
                v["code_bits"][i].as_u64().unwrap(),
                nvfp4_code_byte(*x, seed) as u64,
                "code byte {x}"
            );
            assert_eq!(
                v["scale_bits"][i].as_u64().unwrap(),
                nvfp4_scale_byte(*x, seed) as u64,
                "scale byte {x}"
            );
            let bits = v["uniform_bits"][i].as_u64().unwrap() as f32;
            let value = bits * (1.0 / 16_777_216.0) * 2.0 - 1.0;
            assert_eq!(
                crate::formats::bf16_round(value),
                crate::kernels::data::bf16_uniform(*x, 7, 1.0),
                "activation {x}"
            );
        }
        assert_eq!(
            v["marlin_padded_nk"],
            serde_json::json!([[128, 5120], [5120, 6144], [128, 256]])
        );
        let perm: Vec<u64> = v["marlin_weight_perm"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        let mut sorted = perm.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1024).collect::<Vec<u64>>());
        assert_eq!(&perm[..8], &[0, 128, 8, 136, 16, 144, 24, 152]);
        let sp: Vec<u64> = v["marlin_scale_perm"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(&sp[..10], &[0, 8, 16, 24, 32, 40, 48, 56, 1, 9]);
        assert_eq!(
            v["refused"].as_str().unwrap(),
            crate::kernels::composite::REFUSED_PREFIX
        );
    }

    #[test]
    fn the_script_is_embedded() {
        assert!(SCRIPT.contains("_weight_int4pack_mm") && SCRIPT.contains("--spec"));
        assert!(SCRIPT.contains("HummingLayer") && SCRIPT.contains("libmarlin_nvfp4.so"));
        assert!(SCRIPT.contains("gemlite") && SCRIPT.contains("CUDAGraph"));
        // The script's copy rule is rigbench's.
        assert!(SCRIPT.contains("copies = max(2, min_total // max(1, nbytes) + 1)"));
    }
}
