//! The verdict's lines from the other parts of the results: multi-GPU, the built-in runtime,
//! end-to-end, the checkpoint, the CPU reference accuracy (when no kernel was timed) and what was
//! skipped.

use super::words::{first_clause, short_name};
use crate::formats::GemmFormat;
use crate::output::table::thousands;
use crate::report::schema::Results;

pub(super) fn e2e_line(r: &Results) -> Option<String> {
    let e = r.e2e.as_ref()?;
    let f = &e.engine.facts;
    let gpu_name = r.rig.gpu.as_ref().map(|g| g.name.clone());
    let model = f
        .model
        .as_ref()
        .map(|m| format!(" serving `{}`", m.value))
        .unwrap_or_default();
    let engine = match e.engine.kind.as_str() {
        "builtin" => format!("rigbench's built-in runtime{model}"),
        _ => {
            let name = f
                .name
                .as_ref()
                .map(|n| n.value.clone())
                .unwrap_or_else(|| "an engine".into());
            let ver = f
                .version
                .as_ref()
                .map(|v| format!(" {}", v.value))
                .unwrap_or_default();
            format!("{name}{ver}{model}")
        }
    };
    let rt = f.runtime.as_ref();
    let backend = rt
        .and_then(|r| r.backend.as_ref())
        .map(|b| b.value.to_ascii_uppercase());
    let not_here = |what: &str| {
        match &gpu_name {
        Some(g) => format!(
            "on the **{what} backend**, **not on {g}**: a harness self-test, not a figure of this card"
        ),
        None => format!("on the **{what} backend** (this machine has no GPU)"),
    }
    };
    let where_ = match (e.engine.kind.as_str(), backend.as_deref()) {
        (_, Some(b)) if b.contains("CUDA") || b.contains("GPU") => {
            let dev = rt
                .and_then(|r| r.device.as_ref())
                .map(|d| d.value.clone())
                .or_else(|| gpu_name.clone())
                .unwrap_or_default();
            format!("on the GPU: {dev}, {b} backend")
        }
        (_, Some(b)) => not_here(b),
        ("builtin", None) => format!(
            "{} (the backend is not recorded in these results; the built-in runtime had no other when they were written)",
            not_here("CPU")
        ),
        (_, None) => "on a device the engine does not report (rigbench cannot tell whether it used this GPU)".to_string(),
    };
    let valid = e.runs.iter().filter(|r| r.validity.valid).count();
    let mut s = format!(
        "**End to end:** {engine}, {where_}; {valid} of {} run{} valid",
        e.runs.len(),
        if e.runs.len() == 1 { "" } else { "s" }
    );
    if let Some(f) = &e.failure {
        s.push_str(&format!("; stopped: {}", first_clause(f)));
    }
    if e.interrupted {
        s.push_str("; interrupted");
    }
    if crate::e2e::render::random_weights_note(e).is_some() {
        s.push_str("; **random weights**: a harness figure, not a trained model's");
    }
    s.push('.');
    Some(s)
}

/// Two or more GPUs (`--devices`): per-GPU spread, P2P copies, NCCL all-reduce at one decode
/// token and at its largest size, and the tensor-parallel prediction at the smallest M.
pub(super) fn multigpu_line(r: &Results) -> Option<String> {
    use crate::output::table::{human_bytes, human_seconds};
    let mg = r.multi_gpu.as_ref()?;
    if mg.devices.len() < 2 {
        return None;
    }
    let mut parts: Vec<String> = Vec::new();
    if let Some(sp) = &mg.spread {
        let worst = sp
            .devices
            .iter()
            .filter_map(|d| d.geomean_vs_fastest)
            .fold(None, |a: Option<f64>, g| Some(a.map_or(g, |a| a.max(g))));
        if let Some(w) = worst {
            parts.push(format!(
                "every GPU within {:+.1}% of the fastest GPU of each kernel case (geomean), {}",
                (w - 1.0) * 100.0,
                if sp.findings.is_empty() {
                    "no finding".to_string()
                } else {
                    format!(
                        "**{}**",
                        crate::output::table::plural(
                            sp.findings.len() as u64,
                            "finding",
                            "findings"
                        )
                    )
                }
            ));
        }
    }
    if let Some(p) = &mg.p2p {
        let bw: Vec<f64> = p.copies.iter().map(|c| c.bytes_per_s / 1e9).collect();
        if let (Some(lo), Some(hi)) = (
            bw.iter().copied().reduce(f64::min),
            bw.iter().copied().reduce(f64::max),
        ) {
            let each = if (hi - lo) < 0.05 {
                format!("{hi:.1} GB/s")
            } else {
                format!("{lo:.1}–{hi:.1} GB/s")
            };
            let both = p
                .bidirectional
                .iter()
                .map(|b| b.bytes_per_s / 1e9)
                .reduce(f64::min)
                .map(|b| format!(", {b:.1} GB/s both ways"))
                .unwrap_or_default();
            parts.push(format!("P2P copies {each} each way{both}"));
        }
    }
    if let Some(a) = &mg.allreduce {
        if let Some(w) = a
            .worlds
            .iter()
            .filter(|w| !w.points.is_empty())
            .max_by_key(|w| w.devices.len())
        {
            let small = w
                .points
                .iter()
                .filter(|p| p.m.is_some())
                .min_by_key(|p| p.bytes);
            let large = w.points.iter().max_by_key(|p| p.bytes);
            let mut s = format!(
                "NCCL {} all-reduce over {} GPUs",
                a.nccl_version,
                w.devices.len()
            );
            if let Some(p) = small {
                s.push_str(&format!(
                    " {} at {} (decode M = {})",
                    human_seconds(p.timing.median_s),
                    human_bytes(p.bytes),
                    p.m.unwrap_or(1)
                ));
            }
            if let Some(p) = large {
                s.push_str(&format!(
                    ", bus bandwidth {:.1} GB/s at {}",
                    p.busbw / 1e9,
                    human_bytes(p.bytes)
                ));
            }
            parts.push(s);
        }
    }
    if let Some(tp) = &mg.tp {
        let m = tp.rows.iter().map(|r| r.m).min();
        let t = tp.rows.iter().map(|r| r.tp).max();
        if let (Some(m), Some(t)) = (m, t) {
            let v: Vec<String> = tp
                .rows
                .iter()
                .filter(|r| r.m == m && r.tp == t && t > 1)
                .map(|r| {
                    let name = r.label.split(' ').next().unwrap_or(&r.label);
                    format!("{} {:.2}×", name.to_ascii_uppercase(), r.speedup_vs_tp1)
                })
                .collect();
            if !v.is_empty() {
                parts.push(format!(
                    "TP = {t} predicted (not measured) at M = {m}: {} against one GPU",
                    v.join(", ")
                ));
            }
        }
    }
    if parts.is_empty() {
        return None;
    }
    let gpus: Vec<String> = mg.devices.iter().map(|d| format!("GPU{d}")).collect();
    Some(format!(
        "**Multi-GPU** ({}): {}.",
        gpus.join(", "),
        parts.join("; ")
    ))
}

/// The built-in runtime on the GPU, one run per weight format (`results.runtime`).
pub(super) fn runtime_line(r: &Results) -> Option<String> {
    let rt = r.runtime.as_ref()?;
    let mut parts: Vec<String> = Vec::new();
    for f in &rt.formats {
        let name = match f.format.as_str() {
            "nvfp4" => "W4A16 NVFP4".to_string(),
            other => other.to_ascii_uppercase(),
        };
        match (&f.bench, &f.error) {
            (Some(b), _) => parts.push(format!(
                "{name} {} tok/s at batch 1, {} tok/s at batch {}",
                crate::output::table::grouped(b.batch1.tok_per_s, 0),
                crate::output::table::grouped(b.batched.tok_per_s, 0),
                b.batched.batch
            )),
            (None, Some(e)) => parts.push(format!("{name} failed: {}", first_clause(e))),
            (None, None) => {
                let valid = f
                    .e2e
                    .as_ref()
                    .map(|e| e.runs.iter().filter(|x| x.validity.valid).count())
                    .unwrap_or(0);
                parts.push(format!("{name}: {valid} valid e2e runs"))
            }
        }
    }
    let parity = match &rt.parity {
        Some(p) if p.passed => "; parity with the CPU reference passed".to_string(),
        Some(_) => {
            "; **parity with the CPU reference FAILED** (see the runtime section)".to_string()
        }
        None => String::new(),
    };
    let skipped = if rt.skipped.is_empty() {
        String::new()
    } else {
        format!(
            "; not run: {}",
            rt.skipped
                .iter()
                .map(|s| first_clause(s))
                .collect::<Vec<_>>()
                .join("; ")
        )
    };
    // The conditions of the tok/s figures, from the first format that ran its benchmark.
    let conditions = rt
        .formats
        .iter()
        .find_map(|f| f.bench.as_ref())
        .map(|b| {
            format!(
                "; decode tok/s at batch 1 after a {}-token prompt and at batch {} with {}-token contexts, KV {}",
                thousands(b.spec.batch1_prompt as u64),
                b.spec.batch,
                thousands(b.spec.batch_context as u64),
                b.kv_dtype
            )
        })
        .unwrap_or_default();
    Some(format!(
        "**Built-in runtime on this GPU** (`{}` on {}{conditions}; more in its section): {}{parity}{skipped}.",
        rt.model,
        rt.device,
        if parts.is_empty() {
            "no format ran".to_string()
        } else {
            parts.join("; ")
        }
    ))
}

pub(super) fn checkpoint_line(r: &Results) -> Option<String> {
    let c = r.checkpoint.as_ref()?;
    use crate::checkpoint::Severity;
    let count = |sev: Severity| c.findings.iter().filter(|f| f.severity == sev).count();
    let (e, w) = (count(Severity::Error), count(Severity::Warning));
    let plural =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let name = std::path::Path::new(&c.checkpoint)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| c.checkpoint.clone());
    let mut s = format!(
        "**Checkpoint `{name}`:** {}, {}",
        plural(e, "error", "errors"),
        plural(w, "warning", "warnings")
    );
    if let Some(f) = c
        .findings
        .iter()
        .find(|f| f.severity == Severity::Error)
        .or_else(|| c.findings.iter().find(|f| f.severity == Severity::Warning))
    {
        s.push_str(&format!(" (first: `{}`: {})", f.rule, first_clause(&f.why)));
    }
    let v = &c.card.verdicts;
    if !v.is_empty() {
        // Modules grouped by how the card runs their format.
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for x in v {
            let word = x
                .support
                .map(|s| s.to_string())
                .unwrap_or_else(|| "not classified".into());
            let item = format!("{} {}", thousands(x.modules), x.format);
            match groups.iter_mut().find(|g| g.0 == word) {
                Some(g) => g.1.push(item),
                None => groups.push((word, vec![item])),
            }
        }
        let text: Vec<String> = groups
            .iter()
            .map(|(w, items)| format!("{w}: {}", items.join(", ")))
            .collect();
        s.push_str(&format!("; modules {}", text.join("; ")));
    }
    let cap = &c.capacity;
    match (cap.fits, cap.kv_tokens) {
        (Some(false), _) => s.push_str("; the weights **do not fit** in the GPU memory assumed"),
        (_, Some(t)) => s.push_str(&format!(
            "; predicted KV capacity {} tokens (a prediction from metadata)",
            thousands(t)
        )),
        _ => {}
    }
    s.push('.');
    Some(s)
}

pub(super) fn accuracy_line(r: &Results) -> Option<String> {
    let k = r.kernels.as_ref()?;
    let plain: Vec<String> = k
        .reference_accuracy
        .iter()
        .filter(|a| a.data_id == "plain" || a.data_id.is_empty())
        .map(|a| {
            format!(
                "{} {:.1e}{}",
                short_name(a.format),
                a.rel_l2_vs_exact,
                if a.format == GemmFormat::W4a4 {
                    " (emulated)"
                } else {
                    ""
                }
            )
        })
        .collect();
    if plain.is_empty() {
        return None;
    }
    Some(format!(
        "**Accuracy** (CPU reference, relative L2 error against the exact product, normal data): {}.",
        plain.join(", ")
    ))
}

pub(super) fn skipped_line(r: &Results) -> String {
    let mut items: Vec<String> = Vec::new();
    for s in &r.skipped {
        items.push(format!("{}: {}", s.what, first_clause(&s.reason)));
    }
    if let Some(k) = &r.kernels {
        // Group case skips by (provider, implementation, reason).
        let mut groups: Vec<(String, String, Vec<String>)> = Vec::new();
        for s in &k.skipped {
            let who = if s.provider == "rigbench" {
                s.implementation.clone()
            } else {
                format!("{}:{}", s.provider, s.implementation)
            };
            let reason = crate::kernels::wording::skip_reason(
                &s.implementation,
                &s.reason,
                &r.rig.capabilities,
            );
            let what = match s.m {
                Some(m) => format!("{} M={m}", s.shape),
                None => s.shape.clone(),
            };
            match groups.iter_mut().find(|g| g.0 == who && g.1 == reason) {
                Some(g) => g.2.push(what),
                None => groups.push((who, reason, vec![what])),
            }
        }
        let mut shapes: Vec<&str> = k
            .cases
            .iter()
            .map(|c| c.shape.as_str())
            .chain(k.skipped.iter().map(|s| s.shape.as_str()))
            .collect();
        shapes.sort_unstable();
        shapes.dedup();
        for (who, reason, cases) in groups {
            if who == "*" {
                // Every kernel case (no GPU, or the kernel part never started): the reason is
                // usually the `kernels` skip already listed; a row named `* (*)` says nothing.
                let why = first_clause(&reason);
                if !items.iter().any(|i| i.ends_with(why)) {
                    items.push(format!("every kernel case: {why}"));
                }
                continue;
            }
            let n = cases.len();
            let which = if n == 1 {
                cases[0].clone()
            } else if n == shapes.len() && cases.iter().all(|c| !c.contains(" M=")) {
                format!("all {n} shapes")
            } else {
                format!("{n} cases")
            };
            items.push(format!("{who} ({which}): {}", first_clause(&reason)));
        }
        for p in k.peers.iter().filter(|p| !p.available) {
            items.push(format!("peer {}: {}", p.provider, first_clause(&p.detail)));
        }
    }
    if let Some(e) = &r.e2e {
        for s in &e.skipped {
            items.push(format!("e2e {}", first_clause(s)));
        }
    }
    if items.is_empty() {
        "**Skipped:** nothing.".to_string()
    } else {
        format!("**Skipped:** {}.", items.join("; "))
    }
}
