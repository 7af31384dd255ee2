//! Multi-GPU parts as a user meets them: `--devices` errors exit 64 naming the flag; on a machine
//! with fewer than two GPUs (this one has none) the parts are skipped with the reason; a saved
//! multi-GPU result renders the GPUs, the topology and the multi-GPU section.

use crate::common;
use common::*;

use rigbench::multigpu::schema::{
    AllReducePoint, AllReduceResults, AllReduceWorld, MultiGpuResults, OpTiming, P2pCopy,
    P2pResults,
};
use rigbench::rig::topology::{TopoGpu, TopoLink, Topology};

#[test]
fn bad_device_lists_exit_64_naming_the_flag() {
    for v in ["0,0", "x", "", "-1"] {
        let arg = format!("--devices={v}");
        let o = rigbench(&["kernels", &arg]);
        assert_eq!(o.status.code(), Some(64), "--devices {v:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("--devices"), "{}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"));
    }
}

#[test]
fn fewer_than_two_gpus_skip_the_multi_gpu_parts_with_the_reason() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("r");
    let o = rigbench(&[
        "report",
        "--no-fidelity",
        "--devices",
        "all",
        "--no-kernels",
        "--no-e2e",
        "--peers",
        "off",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let gpus = results["rig"]["gpus"]
        .as_array()
        .map(|a| a.len())
        .unwrap_or(0);
    let skipped = results["skipped"].as_array().unwrap();
    let md = format!(
        "{}\n{}",
        std::fs::read_to_string(out.join("report.md")).unwrap(),
        std::fs::read_to_string(out.join("report-details.md")).unwrap_or_default()
    );
    if gpus < 2 {
        let s = skipped
            .iter()
            .find(|s| s["what"] == "multi-gpu")
            .unwrap_or_else(|| panic!("a multi-gpu skip: {skipped:?}"));
        let reason = s["reason"].as_str().unwrap();
        assert!(
            reason.contains("no GPU") || reason.contains("one GPU"),
            "{reason}"
        );
        assert!(md.contains("**multi-gpu**"), "{md}");
        assert!(results["multi_gpu"].is_null());
    } else {
        // A multi-GPU machine: the interconnect part ran or says why not.
        let mg = &results["multi_gpu"];
        assert_eq!(mg["devices"].as_array().unwrap().len(), gpus);
        assert!(
            !mg["p2p"].is_null() || skipped.iter().any(|s| s["what"] == "multi-gpu/p2p"),
            "{results}"
        );
        assert!(md.contains("## Multi-GPU"));
    }
}

#[test]
fn a_device_the_machine_lacks_is_a_flag_error_unless_there_is_no_gpu() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("r");
    let o = rigbench(&[
        "report",
        "--no-fidelity",
        "--devices",
        "63",
        "--no-kernels",
        "--no-e2e",
        "--out",
        out.to_str().unwrap(),
    ]);
    let rig = rigbench(&["rig", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&rig.stdout).unwrap();
    if v["gpu"].is_null() {
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    } else {
        assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
        assert!(stderr(&o).contains("--devices") && stderr(&o).contains("63"));
    }
}

/// Synthetic two-GPU results (shapes of real output, invented figures), rendered by the binary.
#[test]
fn saved_two_gpu_results_render_gpus_topology_and_interconnect() {
    let mut r = rigbench::report::Results::new(
        Default::default(),
        "nvidia-h200-sm90-x2".into(),
        "rigbench report --devices all".into(),
    );
    for i in 0..2 {
        r.rig.gpus.push(rigbench::rig::GpuFacts {
            index: i,
            name: "NVIDIA H200".into(),
            compute_capability: Some(rigbench::gpu::ComputeCapability::new(9, 0)),
            pci_bus_id: Some(format!("0000:{:02x}:00.0", 0x18 + i)),
            ..Default::default()
        });
    }
    r.rig.gpu = r.rig.gpus.first().cloned();
    r.rig.topology = Some(Topology {
        source: "nvml".into(),
        gpus: (0..2)
            .map(|i| TopoGpu {
                index: i,
                numa_node: Some(0),
                nvlinks_active: Some(18),
                ..Default::default()
            })
            .collect(),
        links: vec![TopoLink {
            a: 0,
            b: 1,
            connection: "NV18".into(),
            nvlinks: 18,
            p2p_access: Some(true),
            ..Default::default()
        }],
        notes: vec![],
    });
    let t = |s: f64| OpTiming {
        median_s: s,
        p10_s: s,
        p90_s: s,
        samples_s: vec![s],
    };
    r.multi_gpu = Some(MultiGpuResults {
        devices: vec![0, 1],
        p2p: Some(P2pResults {
            bytes: 256 << 20,
            method: "cuMemcpyPeerAsync".into(),
            copies: vec![P2pCopy {
                src: 0,
                dst: 1,
                peer_access: true,
                timing: t(1e-3),
                bytes_per_s: 268e9,
            }],
            ..Default::default()
        }),
        allreduce: Some(AllReduceResults {
            nccl_version: "2.28.9".into(),
            library: "libnccl.so.2".into(),
            env: vec!["NCCL_NVLS_ENABLE=0".into()],
            worlds: vec![AllReduceWorld {
                devices: vec![0, 1],
                check_passed: true,
                points: vec![AllReducePoint {
                    bytes: 10_240,
                    m: Some(1),
                    iters: 100,
                    timing: t(12e-6),
                    algbw: 10_240.0 / 12e-6,
                    busbw: 10_240.0 / 12e-6,
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    });
    r.complete = true;
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("results.json"),
        serde_json::to_vec(&r).unwrap(),
    )
    .unwrap();
    let o = rigbench(&["report", "--render", d.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let md = format!(
        "{}\n{}",
        std::fs::read_to_string(d.path().join("report.md")).unwrap(),
        std::fs::read_to_string(d.path().join("report-details.md")).unwrap_or_default()
    );
    for want in [
        "### GPUs",
        "| GPU1 | NVIDIA H200",
        "### Topology",
        "| GPU0 | X         | NV18, P2P | 0",
        "## Multi-GPU",
        "Topology: GPU0–GPU1 NV18, P2P on; NUMA node 0.",
        "268.0 GB/s",
        "NCCL 2.28.9",
        "NCCL_NVLS_ENABLE=0",
    ] {
        assert!(md.contains(want), "missing {want:?}:\n{md}");
    }
    assert!(!md.contains("not benched"), "{md}");
}
