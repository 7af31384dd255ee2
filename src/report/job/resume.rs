//! `report --resume`: whether an interrupted report can be continued ([`resumable`]), the results
//! the continued run starts from, and its kernel section with rigbench's own cases kept and the
//! peers continued from their progress file.

use super::options::Job;
use super::progress::skip_if_interrupted;
use crate::kernels::bench::BenchOptions;
use crate::report::schema::Results;

/// What differs between the rig facts of an interrupted run and of the process resuming it:
/// host name, GPU PCI bus id, driver version, NVRTC or cuBLASLt version (`None`: nothing).
fn rig_difference(was: &crate::rig::RigFacts, now: &crate::rig::RigFacts) -> Option<String> {
    let mut d = Vec::new();
    let pair = |what: &str, a: Option<&str>, b: Option<&str>, d: &mut Vec<String>| {
        if a != b {
            d.push(format!(
                "{what} {} then, {} now",
                a.unwrap_or("unknown"),
                b.unwrap_or("unknown")
            ));
        }
    };
    // results.json holds the host name redacted (`<host>`) unless --no-redact: then unknown.
    if !was.host.hostname.starts_with('<') && was.host.hostname != now.host.hostname {
        d.push("another host".into());
    }
    let bus = |r: &crate::rig::RigFacts| r.gpu.as_ref().and_then(|g| g.pci_bus_id.clone());
    for (what, a, b) in [
        ("GPU PCI bus", bus(was), bus(now)),
        (
            "driver",
            was.stack.driver_version.clone(),
            now.stack.driver_version.clone(),
        ),
        (
            "NVRTC",
            was.stack.nvrtc_version.clone(),
            now.stack.nvrtc_version.clone(),
        ),
        (
            "cuBLASLt",
            was.stack.cublaslt_version.clone(),
            now.stack.cublaslt_version.clone(),
        ),
    ] {
        pair(what, a.as_deref(), b.as_deref(), &mut d);
    }
    (!d.is_empty()).then(|| d.join(", "))
}

/// The results of an interrupted report that `report --resume DIR` can continue with `job`:
/// its kernel bench finished (every (shape, M, format) of the suite has a rigbench case or a
/// skip), on the same rigbench version, suite, M values, formats and timing modes, on a GPU of
/// the same name, with one repeat on one device. What is kept: the rig facts, the accuracy
/// study and rigbench's own kernel cases, and the peer cases finished in `DIR/peers-progress.json`;
/// the remaining peers and every later part (checkpoint, end-to-end) run in the new process.
/// A finished report whose peer script stopped early (a skipped entry says so) can be
/// continued too.
///
/// # Errors
/// A flag error naming `--resume` and why the folder cannot be continued (no results.json,
/// a finished report, another version or suite, a kernel bench that stopped before its end).
pub fn resumable(
    dir: &std::path::Path,
    job: &Job,
    rig: &crate::rig::RigFacts,
) -> anyhow::Result<Results> {
    let bad = |m: String| -> anyhow::Error { crate::RigError::flag("--resume", m).into() };
    if !dir.exists() {
        return Err(bad(format!(
            "{} does not exist: give the folder of the interrupted report",
            dir.display()
        )));
    }
    if !dir.is_dir() {
        return Err(bad(format!(
            "{} is a file: --resume takes the report folder (the one holding results.json)",
            dir.display()
        )));
    }
    let file = dir.join("results.json");
    let prev = Results::load(&file).map_err(|e| bad(format!("{e}")))?;
    let peers_stopped = prev.kernels.as_ref().is_some_and(|k| {
        k.skipped
            .iter()
            .any(|s| s.provider == crate::kernels::peers::PEERS_STOPPED_PROVIDER)
    });
    if prev.interrupted.is_none() && prev.complete && !peers_stopped {
        return Err(bad(format!(
            "{} holds a finished report: nothing to continue (re-render it with --render)",
            dir.display()
        )));
    }
    let here = env!("CARGO_PKG_VERSION");
    if prev.rigbench_version != here {
        return Err(bad(format!(
            "{} was measured by rigbench {}, this is {here}: start a new report",
            file.display(),
            prev.rigbench_version
        )));
    }
    let Some(k) = prev.kernels.as_ref().filter(|k| !k.cases.is_empty()) else {
        return Err(bad(format!(
            "{} has no kernel cases: --resume continues a report whose kernel bench finished; start a new report",
            file.display()
        )));
    };
    let Some(opts) = job.kernels.as_ref() else {
        return Err(bad(
            "--no-kernels: --resume continues the peers of the kernel bench; pass the flags of the interrupted run without --no-kernels".into(),
        ));
    };
    if job.repeats > 1
        || job
            .devices
            .resolve(rig.gpus.len())
            .map(|d| d.len())
            .unwrap_or(1)
            > 1
    {
        return Err(bad(
            "--resume works with one repeat on one GPU: drop --repeats and pass --devices 0".into(),
        ));
    }
    if k.repeats.is_some() || prev.multi_gpu.as_ref().is_some_and(|m| m.devices.len() > 1) {
        return Err(bad(format!(
            "{} was measured with --repeats or on several GPUs (--devices): --resume continues one repeat on one GPU; start a new report",
            file.display()
        )));
    }
    if let Some(l) = job.rig_label.as_ref().filter(|l| **l != prev.rig_label) {
        return Err(bad(format!(
            "{} is labelled {}; --rig-label {l} would not match it: drop --rig-label",
            file.display(),
            prev.rig_label
        )));
    }
    // The same measurement settings as the interrupted run.
    let differ = settings_differ(k, opts);
    if !differ.is_empty() {
        return Err(bad(format!(
            "{} was measured with other settings: {}. Pass the flags of the interrupted run (its command line is in report.md)",
            file.display(),
            differ.join("; ")
        )));
    }
    let same_gpu = match (&prev.rig.gpu, &rig.gpu) {
        (Some(a), Some(b)) => a.name == b.name,
        _ => false,
    };
    if !same_gpu {
        let was = prev
            .rig
            .gpu
            .as_ref()
            .map(|g| g.name.as_str())
            .unwrap_or("no GPU");
        return Err(bad(format!(
            "{} was measured on {was}, this machine has {}: resume it on a machine with {was}",
            file.display(),
            rig.gpu
                .as_ref()
                .map(|g| g.name.as_str())
                .unwrap_or("no GPU"),
        )));
    }
    let missing = missing_cases(k, opts);
    if !missing.is_empty() {
        return Err(bad(format!(
            "{}'s kernel bench stopped before its end ({} cases missing, e.g. {}): --resume continues after it (the peers and later parts); start a new report",
            file.display(),
            missing.len(),
            missing[0]
        )));
    }
    let progress = dir.join(crate::report::folder::PEERS_PROGRESS);
    if progress.exists() {
        let ok = std::fs::read_to_string(&progress)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|v| v.get("cases").is_some_and(|c| c.is_array()));
        if !ok {
            return Err(bad(format!(
                "{} is not the peer script's output (unreadable or malformed): delete it to run every peer case again, or start a new report",
                progress.display()
            )));
        }
    }
    Ok(prev)
}

/// The measurement settings of the interrupted run's kernel bench `k` that these flags `opts`
/// do not repeat: suite, timing modes, stopping rule, warm-up, L2 flushing, and cases outside
/// the grid asked for.
fn settings_differ(k: &crate::kernels::schema::KernelResults, opts: &BenchOptions) -> Vec<String> {
    let policy = k.timing_policy.as_ref();
    let mut differ = Vec::new();
    if k.suite.name != opts.suite.name {
        differ.push(format!(
            "suite {} (these flags: {})",
            k.suite.name, opts.suite.name
        ));
    }
    if let Some(p) = policy {
        if p.modes != opts.timing {
            differ.push(
                format!("--timing {:?} (these flags: {:?})", p.modes, opts.timing).to_lowercase(),
            );
        }
        if p.stopping != opts.stopping {
            differ.push(
                "the stopping rule (--max-time, --target-rel-std, --min-samples, --max-samples)"
                    .into(),
            );
        }
        if p.warmup_iters != opts.warmup {
            differ.push(format!(
                "--warmup-launches {} (these flags: {})",
                p.warmup_iters, opts.warmup
            ));
        }
        if (p.l2_flush_bytes > 0) != (opts.cold_l2 && opts.timing.cold()) {
            differ.push("--warm-l2".into());
        }
    }
    let in_grid = |shape: &str, m: usize, imp: &str| {
        opts.suite.shapes.iter().any(|s| s.name == shape)
            && opts.suite.m.contains(&m)
            && opts.formats.iter().any(|f| f.id() == imp)
    };
    if let Some(c) = k
        .cases
        .iter()
        .find(|c| c.provider == "rigbench" && !in_grid(&c.shape, c.m, &c.implementation))
    {
        differ.push(format!(
            "the cases it measured ({} {} M={} is not asked for by --shapes/--m/--formats)",
            c.implementation, c.shape, c.m
        ));
    }
    differ
}

/// The cases of the grid `opts` asks for that the interrupted kernel bench `k` neither timed
/// nor skipped.
fn missing_cases(k: &crate::kernels::schema::KernelResults, opts: &BenchOptions) -> Vec<String> {
    let mut missing = Vec::new();
    for shape in &opts.suite.shapes {
        for &m in &opts.suite.m {
            for f in &opts.formats {
                let id = f.id();
                let done = k.cases.iter().any(|c| {
                    c.provider == "rigbench"
                        && c.implementation == id
                        && c.shape == shape.name
                        && c.m == m
                }) || k.skipped.iter().any(|s| {
                    s.provider == "rigbench"
                        && (s.implementation == id || s.implementation == "*")
                        && (s.shape == shape.name || s.shape == "*")
                        && (s.m.is_none() || s.m == Some(m))
                });
                if !done {
                    missing.push(format!("{id} {} M={m}", shape.name));
                }
            }
        }
    }
    missing
}

/// The results `report --resume` starts from: the interrupted run's, its command line saying
/// when and by what it was resumed, with every part decided again by this run cleared.
pub(super) fn resumed_results(prev: &Results, resumed_at: &str, command_line: &str) -> Results {
    let mut r = prev.clone();
    r.command_line = format!(
        "{} (resumed at {resumed_at} by: {command_line})",
        prev.command_line
    );
    r.interrupted = None;
    r.complete = false;
    // Every part-level skip is decided again by this run (multi-GPU, disabled parts,
    // checkpoint, e2e); the kernel section keeps its own skipped cases.
    r.skipped.clear();
    r.checkpoint = None;
    r.e2e = None;
    r.runtime = None;
    r
}

/// `report --resume`: the kernel section of the interrupted run `prev` with rigbench's own
/// cases kept and the peers continued from their progress file (their earlier rows put back
/// when the continued run returns none), with notes saying what was resumed.
pub(super) fn resume_peers(
    job: &Job,
    opts: &BenchOptions,
    prev: &Results,
    rig_now: &crate::rig::RigFacts,
    resumed_at: &str,
    results: &mut Results,
) -> crate::kernels::schema::KernelResults {
    // `report --resume`: rigbench's own cases are kept; the peers continue.
    let mut k = prev.kernels.clone().unwrap_or_default();
    let own = k.cases.iter().filter(|c| c.provider == "rigbench").count();
    // The peer rows the interrupted run finished come back from the progress file; they
    // are put back as they were whenever the continued peers return none (interrupted at
    // once, --peers off, python3 missing), and their SM clock readings are kept.
    let earlier_peers: Vec<crate::kernels::schema::KernelCase> = k
        .cases
        .iter()
        .filter(|c| c.provider != "rigbench")
        .cloned()
        .collect();
    let earlier_skips: Vec<crate::kernels::schema::SkippedCase> = k
        .skipped
        .iter()
        .filter(|s| {
            s.provider != "rigbench" && s.provider != crate::kernels::peers::PEERS_STOPPED_PROVIDER
        })
        .cloned()
        .collect();
    let earlier_status = k.peers.clone();
    let earlier_stop: Vec<crate::kernels::schema::SkippedCase> = k
        .skipped
        .iter()
        .filter(|s| s.provider == crate::kernels::peers::PEERS_STOPPED_PROVIDER)
        .cloned()
        .collect();
    k.cases.retain(|c| c.provider == "rigbench");
    k.skipped.retain(|s| s.provider == "rigbench");
    k.peers.clear();
    k.notes.retain(|n| {
        !n.starts_with("the peer script stopped early")
            && !n.starts_with("peer providers ran in")
            && !n.starts_with("peers were requested")
    });
    // The folder is continued in place (`ReportDir::continue_in`): the script goes on from
    // its own progress file there.
    let folder = job.resume.as_deref().unwrap_or(std::path::Path::new("."));
    let mut o = opts.clone();
    o.peers_progress = Some(folder.join(crate::report::folder::PEERS_PROGRESS));
    o.peers_resume = true;
    if !skip_if_interrupted(results, "kernels/peers") {
        eprintln!("rigbench: resuming the peers of {}", folder.display());
        crate::kernels::peers::run_into(&o, &mut k);
    }
    if !earlier_peers.is_empty() && k.cases.iter().all(|c| c.provider == "rigbench") {
        k.notes.push(format!(
            "the continued peer run returned no cases; the {} peer cases of the interrupted run are kept as they were",
            earlier_peers.len()
        ));
        k.cases.extend(earlier_peers.iter().cloned());
        k.skipped.extend(earlier_skips);
        // Still not finished: keep saying so (and keep the report resumable).
        let stop_noted = k
            .skipped
            .iter()
            .any(|s| s.provider == crate::kernels::peers::PEERS_STOPPED_PROVIDER);
        if !stop_noted {
            k.skipped.extend(earlier_stop);
        }
    }
    // Provider statuses the continued run did not write (it stopped before, or did not run).
    for st in earlier_status {
        if !k.peers.iter().any(|p| p.provider == st.provider) {
            k.peers.push(st);
        }
    }
    for c in k
        .cases
        .iter_mut()
        .filter(|c| c.provider != "rigbench" && c.clocks.is_none())
    {
        if let Some(e) = earlier_peers.iter().find(|e| {
            e.provider == c.provider
                && e.implementation == c.implementation
                && e.shape == c.shape
                && e.m == c.m
        }) {
            c.clocks = e.clocks.clone();
            c.sm_clock_mhz = e.sm_clock_mhz;
            c.throttle = e.throttle.clone();
        }
    }
    if let Some(d) = rig_difference(&prev.rig, rig_now) {
        k.notes.push(format!(
            "the resuming process ran on a different machine state than the interrupted run ({d}): the rig section is the interrupted run's; the peers and later parts ran on this one"
        ));
    }
    k.notes.push(format!(
        "resumed at {resumed_at} by a new process (`report --resume`): the accuracy study and rigbench's {own} kernel cases are the interrupted run's (started {}); the peers went on from the {} peer cases that run finished; any later part (checkpoint, end-to-end) ran in the new process",
        prev.created_utc,
        earlier_peers.len()
    ));
    k
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::schema::{KernelResults, SkippedCase, TimingModes, TimingPolicy};

    fn gpu(name: &str) -> crate::rig::RigFacts {
        crate::rig::RigFacts {
            gpu: Some(crate::rig::GpuFacts {
                name: name.into(),
                ..Default::default()
            }),
            gpus: vec![crate::rig::GpuFacts {
                name: name.into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn job(timing: TimingModes) -> Job {
        Job {
            kernels: Some(BenchOptions {
                formats: vec![
                    crate::formats::GemmFormat::Bf16,
                    crate::formats::GemmFormat::W4a4,
                ],
                peers: crate::kernels::peers::PeerMode::On,
                timing,
                ..BenchOptions::new(crate::kernels::suite::load("smoke").unwrap())
            }),
            accuracy: true,
            quality: false,
            checkpoint: None,
            e2e: None,
            runtime_model: "synthetic:tiny".into(),
            runtime_device: crate::runtime::backend::Device::Cpu,
            out: None,
            rig_label: None,
            redact: false,
            write_files: false,
            disabled: vec![],
            repeats: 1,
            force: false,
            devices: crate::multigpu::DeviceSelection::List(vec![0]),
            interconnect: false,
            tp_allreduce: None,
            resume: None,
            budget: None,
        }
    }

    /// An interrupted smoke report on `name`: bf16 cases for every (shape, M) but `drop`,
    /// w4a4 skipped per shape (as on sm_90), one peer row.
    fn interrupted(name: &str, drop: Option<(&str, usize)>) -> Results {
        let suite = crate::kernels::suite::load("smoke").unwrap();
        let mut k = KernelResults {
            timing_policy: Some(TimingPolicy {
                warmup_iters: 3,
                stopping: BenchOptions::new(suite.clone()).stopping,
                l2_flush_bytes: 120 << 20,
                timer: String::new(),
                modes: TimingModes::Cold,
                graph: None,
            }),
            ..Default::default()
        };
        k.suite.name = "smoke".into();
        for s in &suite.shapes {
            k.skipped.push(SkippedCase {
                provider: "rigbench".into(),
                implementation: "w4a4".into(),
                shape: s.name.clone(),
                m: None,
                reason: "fallback".into(),
            });
            for &m in &suite.m {
                if drop == Some((s.name.as_str(), m)) {
                    continue;
                }
                let mut c = crate::kernels::composite::tests::case_for_tests("bf16", 1e-5);
                c.shape = s.name.clone();
                c.m = m;
                k.cases.push(c);
            }
        }
        let mut peer = crate::kernels::composite::tests::case_for_tests("bf16", 1e-5);
        peer.provider = "torch".into();
        k.cases.push(peer);
        let mut r = Results::new(gpu(name), "rig".into(), "rigbench report".into());
        r.kernels = Some(k);
        r.interrupted = Some("SIGTERM stopped the run".into());
        r
    }

    fn resume_error(prev: &Results, j: &Job, here: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("results.json"),
            serde_json::to_vec(prev).unwrap(),
        )
        .unwrap();
        match resumable(dir.path(), j, &gpu(here)) {
            Ok(_) => String::new(),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn a_resume_on_another_host_or_driver_is_named() {
        let a = gpu("NVIDIA H200");
        assert_eq!(rig_difference(&a, &a.clone()), None);
        let mut redacted = a.clone();
        redacted.host.hostname = "<host>".into();
        assert_eq!(
            rig_difference(&redacted, &a),
            None,
            "a redacted name is unknown"
        );
        let mut b = a.clone();
        b.host.hostname = "other".into();
        b.stack.driver_version = Some("580.1".into());
        let d = rig_difference(&a, &b).unwrap();
        assert!(
            d.contains("another host") && d.contains("driver unknown then, 580.1 now"),
            "{d}"
        );
    }

    fn err(r: anyhow::Result<Results>) -> String {
        match r {
            Ok(_) => String::new(),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn resume_refuses_a_file_a_missing_folder_and_a_malformed_progress_file() {
        let j = job(TimingModes::Cold);
        let h200 = gpu("NVIDIA H200");
        let dir = tempfile::tempdir().unwrap();
        let e = err(resumable(&dir.path().join("nope"), &j, &h200));
        assert!(e.contains("does not exist"), "{e}");
        let file = dir.path().join("results.json");
        let prev = interrupted("NVIDIA H200", None);
        std::fs::write(&file, serde_json::to_vec(&prev).unwrap()).unwrap();
        let e = err(resumable(&file, &j, &h200));
        assert!(e.contains("takes the report folder"), "{e}");
        assert_eq!(err(resumable(dir.path(), &j, &h200)), "");
        let progress = dir.path().join(crate::report::folder::PEERS_PROGRESS);
        std::fs::write(&progress, "garbage{").unwrap();
        let e = err(resumable(dir.path(), &j, &h200));
        assert!(
            e.contains("peers-progress.json") && e.contains("delete it"),
            "{e}"
        );
        std::fs::write(&progress, r#"{"peers":[],"cases":[],"skipped":[]}"#).unwrap();
        assert_eq!(err(resumable(dir.path(), &j, &h200)), "");
    }

    #[test]
    fn resume_continues_only_a_finished_kernel_bench_of_the_same_suite_and_gpu() {
        let j = job(TimingModes::Cold);
        let done = interrupted("NVIDIA H200", None);
        assert_eq!(resume_error(&done, &j, "NVIDIA H200"), "");

        let cut = interrupted("NVIDIA H200", Some(("o_proj", 16)));
        let e = resume_error(&cut, &j, "NVIDIA H200");
        assert!(
            e.contains("--resume")
                && e.contains("stopped before its end")
                && e.contains("bf16 o_proj M=16"),
            "{e}"
        );

        let e = resume_error(&done, &j, "NVIDIA H100 80GB HBM3");
        assert!(e.contains("resume it on a machine with NVIDIA H200"), "{e}");

        let e = resume_error(&done, &job(TimingModes::Both), "NVIDIA H200");
        assert!(
            e.contains("--timing") && e.contains("Pass the flags of the interrupted run"),
            "{e}"
        );

        // Fewer M values than the interrupted run measured: its rows are outside the grid.
        let mut fewer = job(TimingModes::Cold);
        if let Some(o) = fewer.kernels.as_mut() {
            o.suite.m = vec![1];
        }
        let e = resume_error(&done, &fewer, "NVIDIA H200");
        assert!(e.contains("--shapes/--m/--formats"), "{e}");

        let mut no_kernels = job(TimingModes::Cold);
        no_kernels.kernels = None;
        let e = resume_error(&done, &no_kernels, "NVIDIA H200");
        assert!(e.contains("--no-kernels"), "{e}");

        let mut finished = done.clone();
        finished.interrupted = None;
        finished.complete = true;
        let e = resume_error(&finished, &j, "NVIDIA H200");
        assert!(e.contains("finished report"), "{e}");
        // Finished, but its peer script stopped before its end: that can be continued.
        if let Some(k) = finished.kernels.as_mut() {
            k.skipped.push(SkippedCase {
                provider: crate::kernels::peers::PEERS_STOPPED_PROVIDER.into(),
                implementation: "*".into(),
                shape: "*".into(),
                m: None,
                reason: "the peer script stopped before its end (it exited with exit status: 1) after 3 cases".into(),
            });
        }
        assert_eq!(resume_error(&finished, &j, "NVIDIA H200"), "");

        let mut other = done;
        other.rigbench_version = "0.0.0-other".into();
        let e = resume_error(&other, &j, "NVIDIA H200");
        assert!(e.contains("rigbench 0.0.0-other"), "{e}");
    }
}
