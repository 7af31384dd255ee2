//! The multi-GPU section of a report: per-GPU kernel rows with their spread and findings, the
//! interconnect (peer-to-peer copy matrix, all-reduce bus bandwidth, all-reduce time per decode
//! step) beside PyTorch's figures, and the tensor-parallel prediction with what it leaves out.

use super::schema::{MultiGpuResults, PeerAllReduce, PeerCopy};
use crate::output::table::{human_bytes, human_seconds, markdown_table};
use crate::rig::RigFacts;

/// rigbench's figure and a peer's agree when they differ by at most this fraction
/// (docs/multi-gpu.md, "Peers").
pub const PEER_AGREEMENT: f64 = 0.10;

fn gbs(bytes_per_s: f64) -> String {
    format!("{:.1} GB/s", bytes_per_s / 1e9)
}

/// `(ours / theirs − 1)` as a signed percentage, and whether it is within [`PEER_AGREEMENT`].
pub fn agreement(ours: f64, theirs: f64) -> Option<(f64, bool)> {
    if !(ours.is_finite() && theirs.is_finite() && ours > 0.0 && theirs > 0.0) {
        return None;
    }
    let d = ours / theirs - 1.0;
    // A hair of slack so that exactly 10% counts as within (110/100 − 1 is 0.10000000000000009).
    Some((d * 100.0, d.abs() <= PEER_AGREEMENT + 1e-12))
}

fn agree_cell(ours: f64, theirs: Option<f64>) -> String {
    match theirs.and_then(|t| agreement(ours, t)) {
        Some((pct, true)) => format!("{pct:+.1}% ✓"),
        Some((pct, false)) => format!("{pct:+.1}% ✗"),
        None => "—".into(),
    }
}

/// Why rigbench's copy figure may differ from `tensor.to`'s.
const WHY_P2P: &str = "the methods differ: rigbench copies between two fixed `cuMemAlloc` buffers with `cuMemcpyPeerAsync`; `tensor.to` allocates the destination from PyTorch's caching allocator and makes the two GPUs' current streams wait on each other around each copy";

/// Why rigbench's all-reduce figure may differ from `torch.distributed`'s.
fn why_allreduce(mg: &MultiGpuResults) -> String {
    let ours = mg
        .allreduce
        .as_ref()
        .map(|a| format!("NCCL {} ({})", a.nccl_version, a.library))
        .unwrap_or_default();
    let theirs = mg
        .peers
        .as_ref()
        .and_then(|p| p.status.first())
        .map(|s| s.detail.clone())
        .unwrap_or_default();
    format!(
        "the methods differ: rigbench drives every GPU from one thread (one `ncclGroupStart`/`ncclAllReduce` per rank/`ncclGroupEnd` per all-reduce, as nccl-tests `-g N`) with {ours}; `torch.distributed` runs one process per GPU with the NCCL it ships ({theirs}); for small messages the host's launch path is most of the time, so the two launch paths decide the difference there"
    )
}

/// Render the section (`## Multi-GPU`).
pub fn markdown(mg: &MultiGpuResults, rig: &RigFacts) -> String {
    let mut o = String::from("## Multi-GPU\n\n");
    let name = |d: usize| {
        rig.gpus
            .get(d)
            .map(|g| g.name.clone())
            .unwrap_or_else(|| "?".into())
    };
    o.push_str(&format!(
        "GPUs selected: {}.",
        mg.devices
            .iter()
            .map(|d| format!("GPU{d} ({})", name(*d)))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    if let Some(t) = &rig.topology {
        o.push_str(&format!(" Topology: {}.", t.summary()));
    }
    o.push_str("\n\n");

    render_spread(&mut o, mg);
    render_interconnect(&mut o, mg);
    render_allreduce_per_step(&mut o, mg);
    render_tp_prediction(&mut o, mg);
    if !mg.notes.is_empty() {
        for n in &mg.notes {
            o.push_str(&format!("- {n}\n"));
        }
        o.push('\n');
    }
    o
}

/// The kernels on every GPU: per-GPU rows, findings, per-case medians and per-GPU errors.
fn render_spread(o: &mut String, mg: &MultiGpuResults) {
    if let Some(sp) = &mg.spread {
        o.push_str("### Kernels on every GPU\n\n");
        o.push_str(&format!(
            "The suite ran on all selected GPUs at the same time (one context, stream and thread per GPU). Per GPU: its median time in each case against the fastest same-model GPU's in that case, as a geometric mean over the cases every same-model GPU ran (so +0.0% only for a GPU fastest in every case); a finding when one is more than {}% slower at the same clocks, or runs at lower clocks (median SM clock more than {}% below, or a power/thermal throttle reason seen).\n\n",
            super::spread::SLOWER_PCT,
            super::spread::CLOCK_LOWER_PCT
        ));
        let rows: Vec<Vec<String>> = sp
            .devices
            .iter()
            .map(|d| {
                vec![
                    format!("GPU{}", d.device),
                    d.name.clone(),
                    d.cases.to_string(),
                    d.geomean_vs_fastest
                        .map(|g| format!("{:+.1}%", (g - 1.0) * 100.0))
                        .unwrap_or_else(|| "—".into()),
                    d.median_sm_clock_mhz
                        .map(|c| format!("{c} MHz"))
                        .unwrap_or_else(|| "n/a".into()),
                    if d.throttle.is_empty() {
                        "none".into()
                    } else {
                        d.throttle.join(", ")
                    },
                ]
            })
            .collect();
        o.push_str(&markdown_table(
            &[
                "GPU",
                "name",
                "cases compared",
                "vs fastest per case (geomean)",
                "median SM clock",
                "throttle seen",
            ],
            &rows,
        ));
        o.push('\n');
        if sp.findings.is_empty() {
            o.push_str("Findings: none.\n\n");
        } else {
            o.push_str("Findings:\n\n");
            for f in &sp.findings {
                o.push_str(&format!("- **{}** `{}`: {}\n", f.severity, f.id, f.message));
            }
            o.push('\n');
        }
        if !sp.rows.is_empty() {
            let devs: Vec<usize> = sp.rows[0].medians.iter().map(|m| m.0).collect();
            let mut headers: Vec<String> =
                vec!["implementation".into(), "shape".into(), "M".into()];
            headers.extend(devs.iter().map(|d| format!("GPU{d}")));
            headers.push("spread".into());
            let rows: Vec<Vec<String>> = sp
                .rows
                .iter()
                .map(|r| {
                    let mut v = vec![r.implementation.clone(), r.shape.clone(), r.m.to_string()];
                    v.extend(r.medians.iter().map(|(_, s)| human_seconds(*s)));
                    v.push(format!("{:.1}%", r.spread_pct));
                    v
                })
                .collect();
            let h: Vec<&str> = headers.iter().map(String::as_str).collect();
            o.push_str("Median time per case and GPU (spread = slowest / fastest − 1):\n\n");
            o.push_str(&markdown_table(&h, &rows));
            o.push('\n');
        }
        for dk in &mg.device_kernels {
            if let Some(e) = &dk.error {
                o.push_str(&format!("- GPU{}: {e}\n", dk.device));
            }
        }
        if mg.device_kernels.iter().any(|d| d.error.is_some()) {
            o.push('\n');
        }
    }
}

/// The interconnect: peer-to-peer copies, all-reduce, the peers' status and where rigbench and PyTorch disagree.
fn render_interconnect(o: &mut String, mg: &MultiGpuResults) {
    if mg.p2p.is_some() || mg.allreduce.is_some() {
        o.push_str("### Interconnect\n\n");
    }
    let peer_copies: Vec<&PeerCopy> = mg.peers.iter().flat_map(|p| p.p2p.iter()).collect();
    let peer_ar: Vec<&PeerAllReduce> = mg.peers.iter().flat_map(|p| p.allreduce.iter()).collect();
    let mut disagreements: Vec<String> = Vec::new();
    render_p2p(o, mg, &peer_copies, &mut disagreements);
    render_allreduce(o, mg, &peer_ar, &mut disagreements);
    if let Some(p) = &mg.peers {
        for s in &p.status {
            o.push_str(&format!(
                "Peer `{}`: {} ({}).\n",
                s.provider,
                if s.available { "ran" } else { "did not run" },
                s.detail
            ));
        }
        for n in &p.notes {
            o.push_str(&format!("- peer: {n}\n"));
        }
        o.push('\n');
        if disagreements.is_empty() && (!peer_copies.is_empty() || !peer_ar.is_empty()) {
            o.push_str(&format!(
                "Every rigbench figure above is within {:.0}% of PyTorch's.\n\n",
                PEER_AGREEMENT * 100.0
            ));
        }
    }
    if !disagreements.is_empty() {
        o.push_str(&format!(
            "Figures more than {:.0}% from PyTorch's, and why:\n\n",
            PEER_AGREEMENT * 100.0
        ));
        for d in &disagreements {
            o.push_str(&format!("- {d}\n"));
        }
        // One reason for every all-reduce row, given once.
        if disagreements.iter().any(|d| d.starts_with("all-reduce")) {
            o.push_str(&format!(
                "\nWhy the all-reduce figures differ: {}.\n",
                why_allreduce(mg)
            ));
        }
        o.push('\n');
    }
}

/// The peer-to-peer copy matrix, noting copies far from PyTorch's in `disagreements`.
fn render_p2p(
    o: &mut String,
    mg: &MultiGpuResults,
    peer_copies: &[&PeerCopy],
    disagreements: &mut Vec<String>,
) {
    if let Some(p) = &mg.p2p {
        o.push_str(&format!(
            "**Peer-to-peer copies** ({} per copy). {}.\n\n",
            human_bytes(p.bytes),
            p.method
        ));
        let mut devs: Vec<usize> = p.copies.iter().flat_map(|c| [c.src, c.dst]).collect();
        devs.sort_unstable();
        devs.dedup();
        let mut headers: Vec<String> = vec!["from \\ to".into()];
        headers.extend(devs.iter().map(|d| format!("GPU{d}")));
        let mut rows = Vec::new();
        for &s in &devs {
            let mut r = vec![format!("GPU{s}")];
            for &d in &devs {
                if s == d {
                    r.push("—".into());
                    continue;
                }
                match p.copies.iter().find(|c| c.src == s && c.dst == d) {
                    Some(c) => {
                        let peer = peer_copies
                            .iter()
                            .find(|x| x.src == s && x.dst == d && x.bytes == p.bytes);
                        let mut cell = gbs(c.bytes_per_s);
                        if !c.peer_access {
                            cell.push_str(" (no peer access: staged through host)");
                        }
                        if let Some(x) = peer {
                            cell.push_str(&format!(
                                "; torch {} ({})",
                                gbs(x.bytes_per_s),
                                agree_cell(c.bytes_per_s, Some(x.bytes_per_s))
                            ));
                            if let Some((pct, false)) = agreement(c.bytes_per_s, x.bytes_per_s) {
                                disagreements.push(format!(
                                    "copy GPU{s} → GPU{d}: rigbench {} vs torch {} ({pct:+.1}%): {WHY_P2P}",
                                    gbs(c.bytes_per_s),
                                    gbs(x.bytes_per_s)
                                ));
                            }
                        }
                        r.push(cell);
                    }
                    None => r.push("failed".into()),
                }
            }
            rows.push(r);
        }
        let h: Vec<&str> = headers.iter().map(String::as_str).collect();
        o.push_str(&markdown_table(&h, &rows));
        o.push('\n');
        if !p.bidirectional.is_empty() {
            let rows: Vec<Vec<String>> = p
                .bidirectional
                .iter()
                .map(|b| {
                    vec![
                        format!("GPU{} ⇄ GPU{}", b.a, b.b),
                        human_seconds(b.timing.median_s),
                        gbs(b.bytes_per_s),
                    ]
                })
                .collect();
            o.push_str("Both directions at once (sum of the two directions):\n\n");
            o.push_str(&markdown_table(
                &["pair", "median time", "bandwidth"],
                &rows,
            ));
            o.push('\n');
        }
        for n in &p.notes {
            o.push_str(&format!("- {n}\n"));
        }
        if !p.notes.is_empty() {
            o.push('\n');
        }
    }
}

/// The all-reduce table, noting figures far from PyTorch's in `disagreements`.
fn render_allreduce(
    o: &mut String,
    mg: &MultiGpuResults,
    peer_ar: &[&PeerAllReduce],
    disagreements: &mut Vec<String>,
) {
    if let Some(a) = &mg.allreduce {
        o.push_str(&format!(
            "**All-reduce** through NCCL {} (`{}`), {}; environment: {}. Method: {}.\n\n",
            a.nccl_version,
            a.library,
            a.op,
            if a.env.is_empty() {
                "no NCCL_* set".into()
            } else {
                a.env.join(" ")
            },
            a.method
        ));
        for w in &a.worlds {
            let ranks = w.devices.len();
            o.push_str(&format!(
                "{} GPUs ({}). Check: {} ({}).\n\n",
                ranks,
                w.devices
                    .iter()
                    .map(|d| format!("GPU{d}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                w.check,
                if w.check_passed { "passed" } else { "FAILED" }
            ));
            if let Some(e) = &w.error {
                o.push_str(&format!("{e}\n\n"));
            }
            let rows: Vec<Vec<String>> = w
                .points
                .iter()
                .map(|p| {
                    let peer = peer_ar
                        .iter()
                        .find(|x| x.devices == w.devices && x.bytes == p.bytes);
                    if let Some(x) = peer {
                        if let Some((pct, false)) = agreement(p.timing.median_s, x.timing.median_s)
                        {
                            disagreements.push(format!(
                                "all-reduce of {} over {ranks} GPUs: rigbench {} vs torch {} ({pct:+.1}% time)",
                                human_bytes(p.bytes),
                                human_seconds(p.timing.median_s),
                                human_seconds(x.timing.median_s),
                            ));
                        }
                    }
                    vec![
                        human_bytes(p.bytes),
                        p.m.map(|m| m.to_string()).unwrap_or_else(|| "—".into()),
                        human_seconds(p.timing.median_s),
                        format!(
                            "{}–{}",
                            human_seconds(p.timing.p10_s),
                            human_seconds(p.timing.p90_s)
                        ),
                        gbs(p.algbw),
                        gbs(p.busbw),
                        peer.map(|x| human_seconds(x.timing.median_s))
                            .unwrap_or_else(|| "—".into()),
                        peer.map(|x| gbs(x.busbw)).unwrap_or_else(|| "—".into()),
                        agree_cell(p.timing.median_s, peer.map(|x| x.timing.median_s)),
                    ]
                })
                .collect();
            o.push_str(&markdown_table(
                &[
                    "message",
                    "decode M",
                    "time (median)",
                    "p10–p90",
                    "algBW",
                    "busBW",
                    "torch time",
                    "torch busBW",
                    "time vs torch",
                ],
                &rows,
            ));
            o.push('\n');
        }
    }
}

/// The all-reduce time per decode step table.
fn render_allreduce_per_step(o: &mut String, mg: &MultiGpuResults) {
    if !mg.allreduce_per_step.is_empty() {
        let mut tps: Vec<usize> = mg.allreduce_per_step.iter().map(|r| r.tp).collect();
        tps.sort_unstable();
        tps.dedup();
        let mut ms: Vec<usize> = mg.allreduce_per_step.iter().map(|r| r.m).collect();
        ms.sort_unstable();
        ms.dedup();
        let per_step = mg.allreduce_per_step[0].per_step;
        let shape = mg
            .tp
            .as_ref()
            .map(|t| {
                format!(
                    "{} per layer × {} layers), each of hidden size ({}) × M × 2 bytes",
                    t.allreduces_per_layer, t.layers, t.hidden_size
                )
            })
            .unwrap_or_else(|| "2 per layer × layers), each of hidden size × M × 2 bytes".into());
        o.push_str(&format!(
            "**All-reduce time per decode step**: {per_step} all-reduces per step ({shape}, at the measured median time.\n\n"
        ));
        let mut headers: Vec<String> = vec!["M".into(), "message".into()];
        headers.extend(tps.iter().map(|t| format!("TP={t}: per step (each)")));
        let rows: Vec<Vec<String>> = ms
            .iter()
            .map(|&m| {
                let any = mg.allreduce_per_step.iter().find(|r| r.m == m);
                let mut r = vec![
                    m.to_string(),
                    any.map(|a| human_bytes(a.bytes)).unwrap_or_default(),
                ];
                for &t in &tps {
                    r.push(
                        mg.allreduce_per_step
                            .iter()
                            .find(|x| x.m == m && x.tp == t)
                            .map(|x| {
                                format!(
                                    "{} ({})",
                                    human_seconds(x.step_s),
                                    human_seconds(x.allreduce_s)
                                )
                            })
                            .unwrap_or_else(|| "—".into()),
                    );
                }
                r
            })
            .collect();
        let h: Vec<&str> = headers.iter().map(String::as_str).collect();
        o.push_str(&markdown_table(&h, &rows));
        o.push('\n');
    }
}

/// The tensor-parallel prediction table and what it leaves out.
fn render_tp_prediction(o: &mut String, mg: &MultiGpuResults) {
    if let Some(tp) = &mg.tp {
        o.push_str("### Tensor-parallel prediction (not a measurement)\n\n");
        o.push_str(&format!(
            "Predicted linear-layer time per decode step of {} layers (hidden {}) at TP = t: composite / t + {} × layers all-reduces measured over t GPUs in this run. Composite: {}.\n\n",
            tp.layers, tp.hidden_size, tp.allreduces_per_layer, tp.composite_source
        ));
        let mut tps: Vec<usize> = tp.rows.iter().map(|r| r.tp).collect();
        tps.sort_unstable();
        tps.dedup();
        let mut keys: Vec<(String, usize)> = Vec::new();
        for r in &tp.rows {
            if !keys.contains(&(r.label.clone(), r.m)) {
                keys.push((r.label.clone(), r.m));
            }
        }
        let mut headers: Vec<String> = vec!["format".into(), "M".into()];
        headers.extend(tps.iter().map(|t| {
            if *t == 1 {
                "TP=1".to_string()
            } else {
                format!("TP={t} (linear + all-reduce, speedup)")
            }
        }));
        let rows: Vec<Vec<String>> = keys
            .iter()
            .map(|(label, m)| {
                let mut v = vec![label.clone(), m.to_string()];
                for &t in &tps {
                    v.push(
                        tp.rows
                            .iter()
                            .find(|r| &r.label == label && r.m == *m && r.tp == t)
                            .map(|r| {
                                if t == 1 {
                                    human_seconds(r.total_s)
                                } else {
                                    format!(
                                        "{} ({} + {}, {:.2}×)",
                                        human_seconds(r.total_s),
                                        human_seconds(r.linear_s),
                                        human_seconds(r.allreduce_s),
                                        r.speedup_vs_tp1
                                    )
                                }
                            })
                            .unwrap_or_else(|| "—".into()),
                    );
                }
                v
            })
            .collect();
        let h: Vec<&str> = headers.iter().map(String::as_str).collect();
        o.push_str(&markdown_table(&h, &rows));
        o.push_str("\nWhat it leaves out:\n\n");
        for l in &tp.leaves_out {
            o.push_str(&format!("- {l}\n"));
        }
        o.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::multigpu::schema::*;

    fn t(s: f64) -> OpTiming {
        OpTiming {
            median_s: s,
            p10_s: s * 0.98,
            p90_s: s * 1.03,
            samples_s: vec![s],
        }
    }

    /// Synthetic figures of the shape a 2-GPU run produces (not measurements).
    fn two_gpus() -> (MultiGpuResults, RigFacts) {
        let mut rig = RigFacts::default();
        for i in 0..2 {
            rig.gpus.push(crate::rig::GpuFacts {
                index: i,
                name: "NVIDIA H200".into(),
                ..Default::default()
            });
        }
        let mg = MultiGpuResults {
            devices: vec![0, 1],
            spread: Some(spread_fixture()),
            p2p: Some(p2p_fixture()),
            allreduce: Some(allreduce_fixture()),
            allreduce_per_step: vec![AllReducePerStep {
                tp: 2,
                m: 1,
                bytes: 10_240,
                allreduce_s: 10e-6,
                per_step: 128,
                step_s: 1.28e-3,
            }],
            tp: Some(tp_fixture()),
            peers: Some(peers_fixture()),
            ..Default::default()
        };
        (mg, rig)
    }

    /// Synthetic spread of two GPUs: the second 8% slower at the same clocks.
    fn spread_fixture() -> SpreadReport {
        SpreadReport {
            devices: vec![
                DeviceSummary {
                    device: 0,
                    name: "NVIDIA H200".into(),
                    cases: 1,
                    geomean_vs_fastest: Some(1.0),
                    median_sm_clock_mhz: Some(1980),
                    throttle: vec![],
                },
                DeviceSummary {
                    device: 1,
                    name: "NVIDIA H200".into(),
                    cases: 1,
                    geomean_vs_fastest: Some(1.08),
                    median_sm_clock_mhz: Some(1980),
                    throttle: vec![],
                },
            ],
            rows: vec![SpreadRow {
                implementation: "bf16".into(),
                shape: "o_proj".into(),
                m: 1,
                medians: vec![(0, 20e-6), (1, 21.6e-6)],
                spread_pct: 8.0,
            }],
            findings: vec![Finding {
                id: "multigpu/slower-at-same-clocks".into(),
                severity: "warning".into(),
                device: 1,
                message: "GPU1 is slower".into(),
            }],
        }
    }

    /// Synthetic peer-to-peer copies between the two GPUs, each way and both at once.
    fn p2p_fixture() -> P2pResults {
        P2pResults {
            bytes: 256 << 20,
            method: "m".into(),
            copies: vec![
                P2pCopy {
                    src: 0,
                    dst: 1,
                    peer_access: true,
                    timing: t(1e-3),
                    bytes_per_s: 400e9,
                },
                P2pCopy {
                    src: 1,
                    dst: 0,
                    peer_access: true,
                    timing: t(1e-3),
                    bytes_per_s: 300e9,
                },
            ],
            bidirectional: vec![P2pBidir {
                a: 0,
                b: 1,
                timing: t(1e-3),
                bytes_per_s: 700e9,
            }],
            notes: vec![],
        }
    }

    /// A synthetic NCCL all-reduce of one size over both GPUs.
    fn allreduce_fixture() -> AllReduceResults {
        AllReduceResults {
            nccl_version: "2.28.9".into(),
            library: "libnccl.so.2".into(),
            env: vec!["NCCL_NVLS_ENABLE=0".into()],
            op: "BF16 sum".into(),
            method: "nccl-tests".into(),
            worlds: vec![AllReduceWorld {
                devices: vec![0, 1],
                check: "c".into(),
                check_passed: true,
                points: vec![AllReducePoint {
                    bytes: 10_240,
                    m: Some(1),
                    iters: 100,
                    timing: t(10e-6),
                    algbw: 1.024e9,
                    busbw: 1.024e9,
                }],
                error: None,
            }],
        }
    }

    /// A synthetic tensor-parallel prediction from one composite point.
    fn tp_fixture() -> TpPrediction {
        TpPrediction {
            composite_source: "synthetic".into(),
            hidden_size: 5120,
            layers: 64,
            allreduces_per_layer: 2,
            rows: crate::multigpu::tp::predict(
                &[crate::multigpu::tp::CompositePoint {
                    label: "bf16".into(),
                    m: 1,
                    seconds: 13.9e-3,
                }],
                &[AllReducePerStep {
                    tp: 2,
                    m: 1,
                    bytes: 10_240,
                    allreduce_s: 10e-6,
                    per_step: 128,
                    step_s: 1.28e-3,
                }],
            ),
            leaves_out: vec!["attention".into()],
        }
    }

    /// Synthetic peer (torch) copies and all-reduce of the two GPUs.
    fn peers_fixture() -> MultiPeers {
        MultiPeers {
            status: vec![crate::kernels::schema::PeerStatus {
                provider: "torch".into(),
                implementations: vec!["tensor.to".into()],
                available: true,
                detail: "torch 2.11".into(),
            }],
            p2p: vec![
                PeerCopy {
                    src: 0,
                    dst: 1,
                    bytes: 256 << 20,
                    timing: t(1e-3),
                    bytes_per_s: 390e9,
                },
                PeerCopy {
                    src: 1,
                    dst: 0,
                    bytes: 256 << 20,
                    timing: t(1e-3),
                    bytes_per_s: 400e9,
                },
            ],
            allreduce: vec![PeerAllReduce {
                devices: vec![0, 1],
                bytes: 10_240,
                timing: t(10.5e-6),
                algbw: 0.97e9,
                busbw: 0.97e9,
            }],
            notes: vec![],
        }
    }

    #[test]
    fn agreement_is_ten_percent_either_way() {
        assert_eq!(agreement(110.0, 100.0).map(|a| a.1), Some(true));
        assert_eq!(agreement(111.0, 100.0).map(|a| a.1), Some(false));
        assert_eq!(agreement(90.0, 100.0).map(|a| a.1), Some(true));
        assert_eq!(agreement(1.0, 0.0), None);
        assert_eq!(agreement(f64::NAN, 1.0), None);
    }

    #[test]
    fn section_shows_rows_peers_disagreements_and_the_prediction() {
        let (mg, rig) = two_gpus();
        let md = markdown(&mg, &rig);
        for want in [
            "## Multi-GPU",
            "### Kernels on every GPU",
            "| GPU1 | NVIDIA H200 | 1",
            "+8.0%",
            "`multigpu/slower-at-same-clocks`",
            "| bf16           | o_proj | 1   | 20.0 µs | 21.6 µs | 8.0%",
            "400.0 GB/s; torch 390.0 GB/s (+2.6% ✓)",
            "300.0 GB/s; torch 400.0 GB/s (-25.0% ✗)",
            "GPU0 ⇄ GPU1",
            "NCCL 2.28.9",
            "NCCL_NVLS_ENABLE=0",
            "10.0 KiB",
            "-4.8% ✓",
            "copy GPU1 → GPU0: rigbench 300.0 GB/s vs torch 400.0 GB/s (-25.0%): the methods differ",
            "**All-reduce time per decode step**: 128 all-reduces",
            "| 1   | 10.0 KiB | 1.28 ms (10.0 µs)",
            "### Tensor-parallel prediction (not a measurement)",
            "8.23 ms (6.95 ms + 1.28 ms, 1.69×)",
            "What it leaves out:",
        ] {
            assert!(md.contains(want), "missing {want:?} in:\n{md}");
        }
        assert!(!md.contains("Every rigbench figure above is within"));
    }

    #[test]
    fn all_reduce_disagreements_give_their_reason_once_and_the_step_its_layers() {
        let (mut mg, rig) = two_gpus();
        let w = &mut mg.allreduce.as_mut().unwrap().worlds[0];
        let mut p2 = w.points[0].clone();
        p2.bytes = 20_480;
        p2.m = Some(2);
        w.points.push(p2);
        let peers = mg.peers.as_mut().unwrap();
        peers.allreduce[0].timing = t(24e-6);
        let mut x2 = peers.allreduce[0].clone();
        x2.bytes = 20_480;
        peers.allreduce.push(x2);
        let md = markdown(&mg, &rig);
        assert!(
            md.contains("- all-reduce of 10.0 KiB over 2 GPUs: rigbench 10.0 µs vs torch 24.0 µs")
                && md.contains("- all-reduce of 20.0 KiB over 2 GPUs"),
            "{md}"
        );
        assert_eq!(
            md.matches("Why the all-reduce figures differ").count(),
            1,
            "{md}"
        );
        // rigbench is the faster one here: the reason does not claim the opposite.
        assert!(!md.contains("is slower there"), "{md}");
        assert!(
            md.contains("128 all-reduces per step (2 per layer × 64 layers)"),
            "{md}"
        );
        assert!(md.contains("vs fastest per case (geomean)"), "{md}");
    }

    #[test]
    fn agreeing_figures_say_so() {
        let (mut mg, rig) = two_gpus();
        mg.p2p.as_mut().unwrap().copies[1].bytes_per_s = 395e9;
        let md = markdown(&mg, &rig);
        assert!(
            md.contains("Every rigbench figure above is within 10% of PyTorch's."),
            "{md}"
        );
        // Without peers and measurements the section is short and says nothing false.
        let bare = MultiGpuResults {
            devices: vec![0, 1],
            ..Default::default()
        };
        let md = markdown(&bare, &rig);
        assert!(md.contains("GPU0 (NVIDIA H200), GPU1 (NVIDIA H200)"));
        assert!(!md.contains("Interconnect") && !md.contains("within"));
    }
}
