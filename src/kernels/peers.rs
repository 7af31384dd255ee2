//! Peer providers run in the same session: `scripts/peer_kernels.py` (embedded in the binary and
//! written to a temporary file), driven with rigbench's shapes, M values, L2 flush size and
//! stopping rule. Its rows are labelled by provider (e.g. `torch`) and never mixed with
//! rigbench's own; their speedups are relative to the same provider's BF16 row.

use std::process::Command;

use serde::Deserialize;

use super::bench::{fill_derived, BenchOptions};
use super::schema::*;
use crate::formats::GemmFormat;
use crate::stats::Summary;

/// The provider script.
pub const SCRIPT: &str = include_str!("../../scripts/peer_kernels.py");

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
    samples_s: Vec<f64>,
}

#[derive(Deserialize)]
struct PeerSkip {
    provider: String,
    implementation: String,
    shape: String,
    m: usize,
    reason: String,
}

/// Bytes of weights a peer implementation streams for `[n, k]`.
fn peer_weight_bytes(implementation: &str, n: usize, k: usize) -> u64 {
    let e = (n * k) as u64;
    match implementation {
        "torch._scaled_mm" => e + 4,
        // INT4 codes plus a BF16 scale and zero per 128-element group.
        "torch._weight_int4pack_mm" => e / 2 + e / 128 * 4,
        _ => 2 * e,
    }
}

/// Run the peers and append their rows, statuses and skips to `k`. Problems are recorded, never
/// returned: peers are optional.
pub fn run_into(opts: &BenchOptions, k: &mut KernelResults) {
    if opts.peers == PeerMode::Off {
        return;
    }
    let started = std::time::Instant::now();
    match run_script(opts, k) {
        Ok(out) => {
            k.peers.extend(out.peers);
            let copy = k.copy_bandwidth.as_ref().map(|c| c.bytes_per_s);
            let mut new_cases = Vec::new();
            for c in out.cases {
                let Some(s) = Summary::of(&c.samples_s) else {
                    continue;
                };
                let mut kc = KernelCase {
                    provider: c.provider,
                    derived: Derived {
                        weight_bytes: peer_weight_bytes(&c.implementation, c.n, c.k),
                        ..Default::default()
                    },
                    implementation: c.implementation,
                    format: c.format,
                    shape: c.shape,
                    m: c.m,
                    n: c.n,
                    k: c.k,
                    path: c.path,
                    check: Some(c.check),
                    timing: Timing {
                        median_s: s.median,
                        p10_s: s.p10,
                        p90_s: s.p90,
                        rel_std: s.rel_std(),
                        stop_reason: None,
                        cold_l2: opts.cold_l2,
                        samples_s: c.samples_s,
                    },
                    extra: Vec::new(),
                    sm_clock_mhz: None,
                    throttle: Vec::new(),
                };
                fill_derived(&mut kc, copy, None);
                new_cases.push(kc);
            }
            let snapshot = new_cases.clone();
            for c in &mut new_cases {
                let base = snapshot
                    .iter()
                    .find(|b| {
                        b.provider == c.provider
                            && b.format == GemmFormat::Bf16
                            && b.shape == c.shape
                            && b.m == c.m
                    })
                    .map(|b| b.timing.median_s);
                fill_derived(c, copy, base);
            }
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
                "peer providers ran in {:.0} s",
                started.elapsed().as_secs_f64()
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
}

fn run_script(opts: &BenchOptions, k: &KernelResults) -> anyhow::Result<PeerOut> {
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("peer_kernels.py");
    std::fs::write(&script, SCRIPT)?;
    let spec = serde_json::json!({
        "shapes": opts.suite.shapes.iter().map(|s| serde_json::json!({"name": s.name, "n": s.n, "k": s.k})).collect::<Vec<_>>(),
        "m": opts.suite.m,
        "l2_flush_bytes": k.timing_policy.as_ref().map(|p| p.l2_flush_bytes).unwrap_or(0),
        "warmup": opts.warmup,
        "stopping": opts.stopping,
    });
    let spec_path = dir.path().join("spec.json");
    std::fs::write(&spec_path, serde_json::to_vec(&spec)?)?;
    let out_path = dir.path().join("peers.json");
    let status = crate::gpu::nccl::apply_child_env(&mut Command::new("python3"))
        .arg(&script)
        .arg("--spec")
        .arg(&spec_path)
        .arg("--out")
        .arg(&out_path)
        .env("PYTHONUNBUFFERED", "1")
        .status()
        .map_err(|e| {
            anyhow::anyhow!(
                "python3 could not be started ({e}); install Python 3 with PyTorch for peer rows"
            )
        })?;
    let text = std::fs::read_to_string(&out_path).map_err(|e| {
        anyhow::anyhow!("the peer script wrote no results ({e}); exit status {status}")
    })?;
    let out: PeerOut = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("the peer script's output is malformed: {e}"))?;
    if !status.success() {
        anyhow::bail!("the peer script failed with {status} after writing partial results");
    }
    Ok(out)
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
    fn the_script_is_embedded() {
        assert!(SCRIPT.contains("_weight_int4pack_mm") && SCRIPT.contains("--spec"));
    }
}
