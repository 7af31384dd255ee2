//! The rig as Markdown: host, card and stack facts, the GPUs and their topology, and the
//! format-capability tables (`rigbench rig` prints it; the report's rig section is it).

use super::{capability, RigFacts};
use crate::output::redact::Redactor;
use crate::output::table::{human_bytes, markdown_table};

/// Render the rig facts and capability tables as Markdown.
pub fn render(f: &RigFacts, all: bool, redactor: &Redactor) -> String {
    let mut out = String::new();
    out.push_str("## Rig\n\n");
    // Redact before the table is laid out, so the columns stay aligned.
    let host = if redactor.enabled() && !f.host.hostname.is_empty() {
        "<host>".to_string()
    } else {
        f.host.hostname.clone()
    };
    let mut rows: Vec<Vec<String>> = vec![
        vec!["host".into(), host],
        vec![
            "OS / kernel".into(),
            format!("{} / {}", f.host.os, f.host.kernel),
        ],
        vec![
            "CPU".into(),
            format!(
                "{} ({} logical cores, {})",
                f.host.cpu_model, f.host.cpu_logical_cores, f.host.arch
            ),
        ],
        vec!["RAM".into(), human_bytes(f.host.ram_bytes)],
    ];
    gpu_rows(&mut rows, f);
    stack_rows(&mut rows, f);
    out.push_str(&markdown_table(&["fact", "value"], &rows));
    if !f.stack.problems.is_empty() {
        out.push_str("\nProblems with the GPU stack:\n\n");
        for p in &f.stack.problems {
            out.push_str(&format!("- {p}\n"));
        }
    }
    if f.gpus.len() > 1 {
        out.push_str("\n## GPUs\n\n");
        out.push_str(&super::topology::render_gpus(&f.gpus));
        if let Some(t) = &f.topology {
            out.push_str("\n## Topology\n\n");
            out.push_str(&super::topology::render(t));
        }
    }
    render_card_capability(&mut out, f);
    if all || f.gpu.is_none() {
        render_capability_by_cc(&mut out);
    }
    out
}

/// Fact rows of the first GPU: its properties and telemetry, or why there is none.
fn gpu_rows(rows: &mut Vec<Vec<String>>, f: &RigFacts) {
    match &f.gpu {
        Some(g) => {
            rows.push(vec!["GPU".into(), g.name.clone()]);
            rows.push(vec![
                "compute capability".into(),
                g.compute_capability
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "unknown".into()),
            ]);
            rows.push(vec!["SMs".into(), g.sm_count.to_string()]);
            rows.push(vec!["memory".into(), human_bytes(g.memory_bytes)]);
            rows.push(vec!["L2".into(), human_bytes(g.l2_bytes)]);
            rows.push(vec![
                "shared memory per block (opt-in)".into(),
                human_bytes(g.max_shared_mem_per_block_optin),
            ]);
            if let Some(t) = &g.telemetry {
                let mhz = |v: Option<u32>| {
                    v.map(|x| format!("{x} MHz"))
                        .unwrap_or_else(|| "n/a".into())
                };
                rows.push(vec![
                    "SM clock at probe time (current / max)".into(),
                    format!("{} / {}", mhz(t.sm_clock_mhz), mhz(t.sm_clock_max_mhz)),
                ]);
                rows.push(vec![
                    "memory clock (current / max)".into(),
                    format!("{} / {}", mhz(t.mem_clock_mhz), mhz(t.mem_clock_max_mhz)),
                ]);
                rows.push(vec![
                    "power (draw / limit)".into(),
                    format!(
                        "{} / {}",
                        t.power_draw_w
                            .map(|w| format!("{w:.0} W"))
                            .unwrap_or_else(|| "n/a".into()),
                        t.power_limit_w
                            .map(|w| format!("{w:.0} W"))
                            .unwrap_or_else(|| "n/a".into())
                    ),
                ]);
                rows.push(vec![
                    "temperature".into(),
                    t.temperature_c
                        .map(|c| format!("{c} °C"))
                        .unwrap_or_else(|| "n/a".into()),
                ]);
                rows.push(vec![
                    "ECC".into(),
                    t.ecc_enabled
                        .map(|e| if e { "enabled" } else { "disabled" }.to_string())
                        .unwrap_or_else(|| "n/a".into()),
                ]);
                rows.push(vec![
                    "throttle reasons".into(),
                    if t.throttle_reasons.is_empty() {
                        "none".into()
                    } else {
                        t.throttle_reasons.join(", ")
                    },
                ]);
                rows.push(vec!["telemetry source".into(), t.source.clone()]);
            } else {
                rows.push(vec![
                    "telemetry".into(),
                    "NVML and nvidia-smi unavailable".into(),
                ]);
            }
        }
        None => rows.push(vec![
            "GPU".into(),
            f.gpu_absent_reason.clone().unwrap_or_else(|| "none".into()),
        ]),
    }
}

/// Fact rows of the other GPUs and of the driver and CUDA stack.
fn stack_rows(rows: &mut Vec<Vec<String>>, f: &RigFacts) {
    if f.gpus.len() > 1 {
        rows.push(vec![
            "GPUs".into(),
            format!(
                "{} (every GPU below; `--devices` selects which are benched)",
                f.gpus.len()
            ),
        ]);
    } else {
        // Results written before `gpus` existed.
        for og in &f.other_gpus {
            rows.push(vec!["other GPU (not benched)".into(), og.clone()]);
        }
    }
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "not found".into());
    rows.push(vec!["NVIDIA driver".into(), opt(&f.stack.driver_version)]);
    rows.push(vec![
        "driver CUDA version".into(),
        opt(&f.stack.driver_cuda_version),
    ]);
    rows.push(vec![
        "rigbench built for CUDA".into(),
        f.stack.built_for_cuda.clone(),
    ]);
    rows.push(vec!["NVRTC".into(), opt(&f.stack.nvrtc_version)]);
    rows.push(vec!["cuBLASLt".into(), opt(&f.stack.cublaslt_version)]);
    rows.push(vec!["CUDA headers".into(), opt(&f.stack.cuda_include_dir)]);
}

/// The format-capability table of this card, or the note that there is no GPU.
fn render_card_capability(out: &mut String, f: &RigFacts) {
    out.push_str("\n## Format capability on this card\n\n");
    match f.compute_capability() {
        Some(cc) => {
            let rows: Vec<Vec<String>> = f
                .capabilities
                .iter()
                .map(|c| {
                    vec![
                        c.format.display_name().to_string(),
                        c.support.to_string(),
                        c.path.clone(),
                        c.reason.clone(),
                    ]
                })
                .collect();
            out.push_str(&format!("Card: {cc}\n\n"));
            out.push_str(&markdown_table(&["format", "support", "runs as", "reason"], &rows));
        }
        None => out.push_str(
            "No GPU: no capability verdict for this machine; the table of every compute capability follows.\n",
        ),
    }
}

/// The format-capability tables of every known compute capability, and what runs and why.
fn render_capability_by_cc(out: &mut String) {
    out.push_str("\n## Format capability by compute capability\n\n");
    let rows: Vec<Vec<String>> = capability::KNOWN
        .iter()
        .map(|(cc, arch)| {
            let mut r = vec![cc.to_string(), arch.to_string()];
            for c in capability::table(*cc) {
                r.push(c.support.to_string());
            }
            r
        })
        .collect();
    out.push_str(&markdown_table(
        &[
            "cc",
            "architecture",
            "BF16",
            "FP8 W8A8",
            "W4A16 NVFP4",
            "W4A4 NVFP4",
        ],
        &rows,
    ));
    // What each cell means: the path that runs and why, per compute capability.
    out.push_str("\nWhat runs, and why:\n\n");
    let rows: Vec<Vec<String>> = capability::KNOWN
        .iter()
        .flat_map(|(cc, _)| {
            capability::table(*cc).into_iter().map(move |c| {
                vec![
                    cc.to_string(),
                    c.format.display_name().to_string(),
                    c.support.to_string(),
                    c.path,
                    c.reason,
                ]
            })
        })
        .collect();
    out.push_str(&markdown_table(
        &["cc", "format", "support", "runs as", "reason"],
        &rows,
    ));
}
