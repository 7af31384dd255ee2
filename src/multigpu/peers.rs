//! PyTorch's figures for the multi-GPU transfers (`scripts/peer_multigpu.py`, embedded in the
//! binary and written to a temporary file): `tensor.to(other_device)` copies and
//! `torch.distributed.all_reduce` with NCCL, driven with rigbench's sizes, warm-up, sample and
//! per-sample counts, in a child whose environment carries `NCCL_NVLS_ENABLE=0`. The child is
//! stopped (its whole process group) if it runs past a deadline.

use std::process::Command;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::allreduce::allreduce_busbw;
use super::schema::{AllReduceResults, MultiPeers, OpTiming, P2pResults, PeerAllReduce, PeerCopy};
use crate::kernels::schema::PeerStatus;

/// The provider script.
pub const SCRIPT: &str = include_str!("../../scripts/peer_multigpu.py");

/// The longest the script may run.
pub const DEADLINE: Duration = Duration::from_secs(240);

#[derive(Deserialize)]
struct Out {
    status: Vec<PeerStatus>,
    #[serde(default)]
    p2p: Vec<OutCopy>,
    #[serde(default)]
    allreduce: Vec<OutAllReduce>,
    #[serde(default)]
    notes: Vec<String>,
}

#[derive(Deserialize)]
struct OutCopy {
    src: usize,
    dst: usize,
    bytes: u64,
    samples_s: Vec<f64>,
}

#[derive(Deserialize)]
struct OutAllReduce {
    devices: Vec<usize>,
    bytes: u64,
    samples_s: Vec<f64>,
}

/// The spec for the script: the copies of `p2p` (same devices, bytes) and the all-reduces of
/// `allreduce` (same communicators, sizes and all-reduces per sample), with rigbench's warm-up
/// and sample counts.
pub fn spec(
    devices: &[usize],
    p2p: Option<&P2pResults>,
    p2p_warmup: usize,
    p2p_samples: usize,
    allreduce: Option<&AllReduceResults>,
    ar_warmup: usize,
    ar_samples: usize,
) -> serde_json::Value {
    serde_json::json!({
        "p2p": p2p.filter(|p| !p.copies.is_empty()).map(|p| serde_json::json!({
            "devices": devices,
            "bytes": p.bytes,
            "warmup": p2p_warmup,
            "samples": p2p_samples,
        })),
        "allreduce": allreduce.and_then(|a| {
            let worlds: Vec<&Vec<usize>> = a.worlds.iter().filter(|w| !w.points.is_empty()).map(|w| &w.devices).collect();
            let first = a.worlds.iter().find(|w| !w.points.is_empty())?;
            Some(serde_json::json!({
                "worlds": worlds,
                "sizes": first.points.iter().map(|p| serde_json::json!({"bytes": p.bytes, "iters": p.iters})).collect::<Vec<_>>(),
                "warmup": ar_warmup,
                "samples": ar_samples,
            }))
        }),
    })
}

/// Turn the script's output into results.
fn convert(o: Out) -> MultiPeers {
    let mut p = MultiPeers {
        status: o.status,
        notes: o.notes,
        ..Default::default()
    };
    for c in o.p2p {
        if let Some(t) = OpTiming::of(c.samples_s) {
            p.p2p.push(PeerCopy {
                src: c.src,
                dst: c.dst,
                bytes: c.bytes,
                bytes_per_s: c.bytes as f64 / t.median_s,
                timing: t,
            });
        }
    }
    for a in o.allreduce {
        if let Some(t) = OpTiming::of(a.samples_s) {
            let algbw = a.bytes as f64 / t.median_s;
            p.allreduce.push(PeerAllReduce {
                busbw: allreduce_busbw(algbw, a.devices.len()),
                devices: a.devices,
                bytes: a.bytes,
                algbw,
                timing: t,
            });
        }
    }
    p
}

/// Run the script with `spec`; problems become a status entry saying why, never an error.
pub fn run(spec: &serde_json::Value) -> MultiPeers {
    match run_script(spec) {
        Ok(o) => convert(o),
        Err(e) => MultiPeers {
            status: vec![PeerStatus {
                provider: "torch".into(),
                implementations: vec![],
                available: false,
                detail: format!("{e:#}"),
            }],
            ..Default::default()
        },
    }
}

fn run_script(spec: &serde_json::Value) -> anyhow::Result<Out> {
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("peer_multigpu.py");
    std::fs::write(&script, SCRIPT)?;
    let spec_path = dir.path().join("spec.json");
    std::fs::write(&spec_path, serde_json::to_vec(spec)?)?;
    let out_path = dir.path().join("peers.json");
    let mut cmd = Command::new("python3");
    cmd.arg(&script)
        .arg("--spec")
        .arg(&spec_path)
        .arg("--out")
        .arg(&out_path)
        .env("PYTHONUNBUFFERED", "1");
    crate::gpu::nccl::apply_child_env(&mut cmd);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    let mut child = cmd.spawn().map_err(|e| {
        anyhow::anyhow!(
            "python3 could not be started ({e}); install Python 3 with PyTorch for peer rows"
        )
    })?;
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if started.elapsed() > DEADLINE {
            // The script and its spawned ranks share the process group.
            let _ = Command::new("kill")
                .args(["-KILL", &format!("-{}", child.id())])
                .status();
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&out_path).map_err(|e| {
        anyhow::anyhow!(
            "the peer script wrote no results ({e}); {}",
            match &status {
                Some(s) => format!("exit status {s}"),
                None => format!("stopped after {} s", DEADLINE.as_secs()),
            }
        )
    })?;
    let mut out: Out = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("the peer script's output is malformed: {e}"))?;
    match status {
        None => out.notes.push(format!(
            "the peer script was stopped after {} s; rows measured before are kept",
            DEADLINE.as_secs()
        )),
        Some(s) if !s.success() => out.notes.push(format!(
            "the peer script failed with {s} after writing partial results"
        )),
        _ => {}
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::multigpu::schema::{AllReducePoint, AllReduceWorld};

    #[test]
    fn output_converts_with_nccl_tests_bandwidths() {
        let text = r#"{"status":[{"provider":"torch","implementations":["tensor.to"],"available":true,"detail":"torch 2.11"}],
          "p2p":[{"src":0,"dst":1,"bytes":1000,"samples_s":[2e-6,1e-6,3e-6]}],
          "allreduce":[{"devices":[0,1,2,3],"bytes":4000,"iters":20,"samples_s":[1e-6,1e-6]}],
          "notes":["n"]}"#;
        let p = convert(serde_json::from_str(text).unwrap());
        assert_eq!(p.p2p.len(), 1);
        assert_eq!(p.p2p[0].timing.median_s, 2e-6);
        assert!((p.p2p[0].bytes_per_s - 5e8).abs() < 1e-3);
        assert!((p.allreduce[0].algbw - 4e9).abs() < 1e-3);
        assert!((p.allreduce[0].busbw - 6e9).abs() < 1e-3, "4 ranks: ×1.5");
        assert_eq!(p.notes, vec!["n"]);
        // Empty sample lists are dropped, not turned into NaN rows.
        let text = r#"{"status":[],"p2p":[{"src":0,"dst":1,"bytes":1,"samples_s":[]}]}"#;
        assert!(convert(serde_json::from_str(text).unwrap()).p2p.is_empty());
    }

    #[test]
    fn spec_carries_rigbench_counts() {
        let ar = AllReduceResults {
            worlds: vec![AllReduceWorld {
                devices: vec![0, 1],
                points: vec![AllReducePoint {
                    bytes: 10_240,
                    iters: 100,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let s = spec(&[0, 1], None, 3, 20, Some(&ar), 5, 10);
        assert!(s["p2p"].is_null());
        assert_eq!(s["allreduce"]["worlds"][0], serde_json::json!([0, 1]));
        assert_eq!(s["allreduce"]["sizes"][0]["iters"], 100);
        assert_eq!(s["allreduce"]["samples"], 10);
    }

    #[test]
    fn the_script_is_embedded_and_keeps_nvls_off() {
        assert!(SCRIPT.contains("torch.distributed") && SCRIPT.contains("--spec"));
        assert!(SCRIPT.contains("NCCL_NVLS_ENABLE"));
    }
}
