//! The diagnosis as Markdown: the findings (errors first, each with where it was found and
//! why), then per log its boots and the kernels it names (with what each does with FP4).

use std::fmt::Write;

use super::log::{BootStatus, KernelPath};
use super::{Diagnosis, Finding, Severity};
use crate::output::table::{markdown_table, thousands};

/// One finding as a Markdown list item: severity, id, title, where; the detail indented below.
pub fn finding_item(x: &Finding) -> String {
    format!(
        "- **{}** `{}` {} ({})\n  {}\n",
        x.severity, x.id, x.title, x.source, x.detail
    )
}

/// The findings as a Markdown list under a count line.
pub fn findings_markdown(findings: &[Finding]) -> String {
    let mut o = String::new();
    let n = |s: Severity| findings.iter().filter(|f| f.severity == s).count();
    let plural = crate::output::table::plural;
    let _ = writeln!(
        o,
        "{}, {}, {} info\n",
        plural(n(Severity::Error) as u64, "error", "errors"),
        plural(n(Severity::Warning) as u64, "warning", "warnings"),
        n(Severity::Info)
    );
    for x in findings {
        o.push_str(&finding_item(x));
    }
    o
}

/// Render a whole diagnosis.
pub fn render_markdown(d: &Diagnosis) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "## rigbench diagnose\n");
    let mut inputs: Vec<String> = Vec::new();
    for l in &d.logs {
        let eng = match (&l.log.engine, &l.log.engine_version) {
            (Some(e), Some(v)) => format!(", {e} {v}"),
            (Some(e), None) => format!(", {e}"),
            _ => String::new(),
        };
        inputs.push(format!(
            "log `{}` ({} lines{eng})",
            l.name, l.log.lines_read
        ));
    }
    for m in &d.metrics {
        inputs.push(format!(
            "metrics `{}` ({} samples{})",
            m.name,
            m.facts.samples,
            m.facts
                .engine
                .as_ref()
                .map(|e| format!(", {e}"))
                .unwrap_or_default()
        ));
    }
    for s in &d.sse {
        inputs.push(format!("stream `{}` ({} chunks)", s.name, s.chunks));
    }
    if let Some(c) = &d.checkpoint {
        inputs.push(format!("checkpoint `{}`", c.dir));
    }
    match &d.card {
        Some(c) => inputs.push(format!("card sm_{} ({})", c.cc.as_int(), c.source)),
        None => inputs.push("card unknown (--cc / --rig not given)".into()),
    }
    let _ = writeln!(o, "Inputs: {}.\n", inputs.join("; "));
    let _ = writeln!(o, "### Findings\n");
    o.push_str(&findings_markdown(&d.findings));
    o.push('\n');
    for l in &d.logs {
        if l.log.boots.is_empty() {
            continue;
        }
        let _ = writeln!(o, "### Boots in `{}`\n", l.name);
        let rows: Vec<Vec<String>> = l
            .log
            .boots
            .iter()
            .map(|b| {
                vec![
                    b.index.to_string(),
                    if b.line == b.last_line {
                        b.line.to_string()
                    } else {
                        format!("{}–{}", b.line, b.last_line)
                    },
                    match b.status {
                        Some(BootStatus::Ready) => "ready".into(),
                        Some(BootStatus::Failed) => "failed".into(),
                        Some(BootStatus::Incomplete) if b.available_kv_memory_bytes.is_some() => {
                            "startup incomplete".into()
                        }
                        Some(BootStatus::Incomplete) => "only its start logged".into(),
                        None => "-".into(),
                    },
                    b.capacity_tokens()
                        .map(thousands)
                        .unwrap_or_else(|| "unknown".into()),
                    b.max_concurrency
                        .map(|(len, x)| format!("{x:.2}x at {}", thousands(len)))
                        .unwrap_or_else(|| "-".into()),
                    b.available_kv_memory_bytes
                        .map(|m| format!("{:.2} GiB", m as f64 / (1u64 << 30) as f64))
                        .unwrap_or_else(|| "-".into()),
                    match &b.kv_check {
                        Some(k) if k.consistent => "consistent".into(),
                        Some(k) => format!(
                            "DISAGREE: {} vs {} ({:.2}×)",
                            thousands(k.printed_tokens),
                            thousands(k.implied_tokens),
                            k.factor
                        ),
                        None => "-".into(),
                    },
                ]
            })
            .collect();
        o.push_str(&markdown_table(
            &[
                "boot",
                "lines",
                "status",
                "KV tokens",
                "max concurrency",
                "KV memory",
                "tokens vs concurrency × length",
            ],
            &rows,
        ));
        o.push('\n');
    }
    for l in &d.logs {
        if l.log.kernel_choices.is_empty() {
            continue;
        }
        let _ = writeln!(o, "### Kernels named in `{}`\n", l.name);
        let rows: Vec<Vec<String>> = l
            .log
            .kernel_choices
            .iter()
            .map(|c| {
                vec![
                    c.what.clone(),
                    c.kernel.clone(),
                    match c.path() {
                        KernelPath::NativeFp4 => "FP4 tensor cores (native)".into(),
                        KernelPath::WeightOnly => {
                            "weight-only: 4-bit weights dequantized to BF16".into()
                        }
                        KernelPath::Emulated => "emulated".into(),
                        KernelPath::Unknown => "not known to rigbench".into(),
                        KernelPath::NotGemm => "not a quantized GEMM (attention / GDN)".into(),
                    },
                    c.line.to_string(),
                ]
            })
            .collect();
        o.push_str(&markdown_table(
            &["layers", "kernel", "runs as", "line"],
            &rows,
        ));
        o.push('\n');
    }
    o
}
