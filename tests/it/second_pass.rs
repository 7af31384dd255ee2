//! The second fresh reader's pass of issue 16 (docs/first-hour.md, "Second pass"): the committed
//! H200 reports, re-rendered from their results.json, answer at a glance and link only files
//! that are there.

use crate::common;
use common::*;
use std::path::{Path, PathBuf};

fn evidence(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// `report --render` of a committed report into a fresh folder; its report.md and the folder.
fn render(rel: &str) -> (String, tempfile::TempDir) {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("r");
    let o = rigbench(&[
        "report",
        "--render",
        evidence(rel).to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    (
        format!(
            "{}\n{}",
            std::fs::read_to_string(out.join("report.md")).unwrap(),
            std::fs::read_to_string(out.join("report-details.md")).unwrap_or_default()
        ),
        d,
    )
}

fn verdict(md: &str) -> &str {
    md.split("## Verdict")
        .nth(1)
        .unwrap()
        .split("\nCommand:")
        .next()
        .unwrap()
}

#[test]
fn kernels_of_record_give_the_lowest_clock_the_notes_give() {
    let (md, _d) = render("reports/nvidia-h200-sm90/20261130T225116Z");
    let v = verdict(&md);
    assert!(
        v.contains(
            "in 45 of 112 (shape, M) groups of rigbench's cases, lowest SM clock read 1,020 MHz"
        ),
        "{v}"
    );
    assert!(
        md.contains("(lowest SM clock read 1020 MHz)"),
        "the Notes agree"
    );
    // Digit grouping in the composite's tok/s table.
    assert!(md.contains("| 1,024 | 18% of floor · 15,309 tok/s"), "{md}");
}

#[test]
fn the_runtime_report_states_its_conditions_and_its_plots_are_there() {
    let (md, d) = render("reports/nvidia-h200-sm90/20261130T231352Z-runtime");
    let v = verdict(&md);
    assert!(
        v.contains("decode tok/s at batch 1 after a 128-token prompt and at batch 32 with 1,024-token contexts, KV bfloat16"),
        "{v}"
    );
    assert!(!v.contains("synthetic or given"), "{v}");
    assert!(v.contains("W4A16 NVFP4 93 tok/s at batch 1"), "{v}");
    assert!(md.contains("### rigbench runtime's goals"), "{md}");
    assert!(
        md.contains("| NOT met |") && !md.contains("| false |"),
        "{md}"
    );
    assert!(md.contains("248,976 vs 259,257 (-4.0%)"), "{md}");
    // Every image link resolves, the per-format e2e plots included.
    let dir = d.path().join("r");
    let mut links = 0;
    for part in md.split("](").skip(1) {
        let target = part.split(')').next().unwrap();
        if target.ends_with(".svg") {
            assert!(dir.join(target).is_file(), "{target} is linked but absent");
            links += 1;
        }
    }
    assert_eq!(links, 3, "one latency plot per format");
    assert!(md.contains("![e2e_latency.svg](e2e-fp8/e2e_latency.svg)"));
    // The per-format CSV files and engine log come along.
    assert!(dir.join("e2e-nvfp4/e2e_runs.csv").is_file());
    assert!(dir.join("e2e-nvfp4/engine.log").is_file());
    // No heading twice at the same level under one format.
    assert!(md.contains("#### Conditions") && !md.contains("\n### Conditions"));
    assert!(md.contains("No kernel case was timed in this run"), "{md}");
}

#[test]
fn the_two_gpu_report_has_a_multi_gpu_verdict_line() {
    let (md, _d) = render("reports/nvidia-h200-sm90-x2/20261130T230415Z/report");
    let v = verdict(&md);
    for want in [
        "**Multi-GPU** (GPU0, GPU1)",
        "every GPU within +0.6% of the fastest GPU of each kernel case (geomean), no finding",
        "P2P copies 393.6 GB/s each way, 761.0 GB/s both ways",
        "11.2 µs at 10.0 KiB (decode M = 1)",
        "bus bandwidth 318.5 GB/s at 512.0 MiB",
        "TP = 2 predicted (not measured) at M = 1: BF16 1.40×, FP8 1.28×, W4A16 1.07×",
    ] {
        assert!(v.contains(want), "missing {want:?} in {v}");
    }
    assert_eq!(md.matches("Why the all-reduce figures differ").count(), 1);
    assert!(md.contains("(2 per layer × 64 layers)"), "{md}");
}

/// The complete kernels of record (two device calls joined by `report --resume`): it
/// re-renders with every peer, both timing modes, the goals table, and says it was resumed.
#[test]
fn the_resumed_kernels_of_record_have_every_peer_and_say_they_were_resumed() {
    let (md, _d) = render("reports/nvidia-h200-sm90/20261201T021503Z");
    assert!(md.contains("run complete"), "not marked complete");
    assert!(
        md.contains("resumed at 2026-12-01T02:24:33Z"),
        "no resume note"
    );
    assert!(
        md.contains("(resumed at 2026-12-01T02:24:33Z by: "),
        "command line"
    );
    for peer in [
        "torch:torch.matmul",
        "torch:torch._scaled_mm",
        "torch:torch._weight_int4pack_mm",
        "gemlite:gemlite.A16W4_INT_g128",
    ] {
        assert!(md.contains(peer), "{peer} missing");
    }
    // gemlite's rows are all timed (FP32 split-K), none skipped.
    assert!(
        md.contains("| gemlite  | gemlite.A16W4_INT_g128                                    | yes | 112         | 0 "),
        "gemlite: 112 timed, 0 skipped"
    );
    assert!(md.contains("### rigbench's kernel goals"));
    assert!(md.contains("| decode-step composite, M = 64 (graph timing): w4a16 faster than bf16"));
    // The engine peers did not run in that report: their goals say so, never "met".
    assert!(md.contains("not measured: humming was not run"), "{md}");
    assert!(md.contains("Summed GEMM time per decode step, graph timing"));
}
