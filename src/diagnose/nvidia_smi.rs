//! `nvidia-smi -q` (the text form): the conditions a measurement on the card ran under, per GPU:
//! P-state, clocks (current, applications, max), the clock event reasons (`Clocks Event
//! Reasons`, `Clocks Throttle Reasons` before driver 535), the power limit against its default,
//! ECC mode and error counters, remapped rows, memory use and temperature. Every value keeps
//! its line. Sections and keys are those of the driver's `nvidia-smi -q` (checked on driver
//! 550.127.05, `tests/fixtures/diagnose/nvidia-smi-q_driver-550.127.05_a40.txt`); a key the
//! text lacks stays unknown, never zero.
//!
//! Findings: `gpu-conditions` (info, per GPU: what a figure measured at that moment ran
//! under), `gpu-clock-events` (warning when a slowdown, thermal or power-brake reason is
//! active, or the software power cap with a limit below the default; info otherwise),
//! `gpu-power-cap-lowered` (warning: `Current Power Limit` below `Default Power Limit`),
//! `gpu-ecc-errors` (warning for uncorrectable errors, pending row remaps or a remapping
//! failure; info for correctable ones), `nothing-recognised` (no GPU block).

use serde::{Deserialize, Serialize};

use super::{f, Finding, Severity};

/// A value with the 1-based line it was read from.
pub type AtLine<T> = Option<(T, usize)>;

/// One GPU block of `nvidia-smi -q`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SmiGpu {
    /// `GPU 00000000:4F:00.0`, with its line.
    pub bus_id: String,
    /// Line of the GPU header.
    pub line: usize,
    /// `Product Name`.
    pub name: AtLine<String>,
    /// `Performance State` (`P0` … `P12`).
    pub pstate: AtLine<String>,
    /// `Clocks` → `SM`, MHz.
    pub sm_clock_mhz: AtLine<f64>,
    /// `Clocks` → `Memory`, MHz.
    pub mem_clock_mhz: AtLine<f64>,
    /// `Max Clocks` → `SM`, MHz.
    pub max_sm_clock_mhz: AtLine<f64>,
    /// `Max Clocks` → `Memory`, MHz.
    pub max_mem_clock_mhz: AtLine<f64>,
    /// `Applications Clocks` → `Graphics`, MHz.
    pub app_clock_mhz: AtLine<f64>,
    /// Active clock event reasons, with their lines.
    pub active_reasons: Vec<(String, usize)>,
    /// Whether the text had a clock event reasons block at all.
    pub reasons_read: bool,
    /// `GPU Power Readings` (or `Power Readings`) → `Power Draw`, W.
    pub power_draw_w: AtLine<f64>,
    /// `Current Power Limit` (older `Power Limit`), W.
    pub power_limit_w: AtLine<f64>,
    /// `Default Power Limit`, W.
    pub default_power_limit_w: AtLine<f64>,
    /// `ECC Mode` → `Current` (`Enabled` / `Disabled`).
    pub ecc_mode: AtLine<String>,
    /// ECC counters: (`Volatile` or `Aggregate`, key, count, line), only those above zero.
    pub ecc_errors: Vec<(String, String, u64, usize)>,
    /// `Remapped Rows` → `Pending` (`Yes` / `No`).
    pub remap_pending: AtLine<String>,
    /// `Remapped Rows` → `Remapping Failure Occurred`.
    pub remap_failure: AtLine<String>,
    /// `FB Memory Usage` → `Total`, MiB.
    pub mem_total_mib: AtLine<f64>,
    /// `FB Memory Usage` → `Used`, MiB.
    pub mem_used_mib: AtLine<f64>,
    /// `Temperature` → `GPU Current Temp`, °C.
    pub temp_c: AtLine<f64>,
}

/// What `nvidia-smi -q` said.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SmiReport {
    /// The file name as given.
    pub name: String,
    /// `Timestamp`, as printed.
    pub timestamp: AtLine<String>,
    /// `Driver Version`.
    pub driver: AtLine<String>,
    /// `CUDA Version`.
    pub cuda: AtLine<String>,
    /// One entry per GPU block.
    pub gpus: Vec<SmiGpu>,
}

/// The leading number of `1740 MHz`, `300.00 W`, `46068 MiB`, `29 C`; `None` for `N/A`.
fn lead_num(v: &str) -> Option<f64> {
    v.split_whitespace()
        .next()
        .and_then(|x| x.parse::<f64>().ok())
        .filter(|x| x.is_finite())
}

/// Parse the text of `nvidia-smi -q` (any driver; unknown keys are skipped). Never fails: a
/// text without a `GPU xxxxxxxx:xx:xx.x` block gives no GPU.
pub fn parse(name: &str, text: &str) -> SmiReport {
    let mut r = SmiReport {
        name: name.to_string(),
        ..Default::default()
    };
    // The section path by indentation: (indent, title).
    let mut path: Vec<(usize, String)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let no = i + 1;
        let line = raw.trim_end();
        if line.trim().is_empty() {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let body = line.trim();
        if indent == 0 && body.starts_with("GPU ") && !body.contains(" : ") {
            r.gpus.push(SmiGpu {
                bus_id: body[4..].trim().to_string(),
                line: no,
                ..Default::default()
            });
            path.clear();
            continue;
        }
        while path.last().is_some_and(|(ind, _)| *ind >= indent) {
            path.pop();
        }
        let Some((key, value)) = body.split_once(" : ").or_else(|| {
            body.strip_suffix(':')
                .or_else(|| body.strip_suffix(" :"))
                .map(|k| (k, ""))
        }) else {
            path.push((indent, body.to_string()));
            continue;
        };
        let key = key.trim();
        let value = value.trim();
        if value.is_empty() && !body.contains(" : ") {
            path.push((indent, key.to_string()));
            continue;
        }
        match (indent, key) {
            (0, "Timestamp") => r.timestamp = Some((value.to_string(), no)),
            (0, "Driver Version") => r.driver = Some((value.to_string(), no)),
            (0, "CUDA Version") => r.cuda = Some((value.to_string(), no)),
            _ => {}
        }
        let Some(g) = r.gpus.last_mut() else {
            continue;
        };
        let section: Vec<&str> = path.iter().map(|(_, s)| s.as_str()).collect();
        read_key(g, &section, key, value, no);
    }
    r
}

/// One `key : value` line of a GPU block, under its section titles.
fn read_key(g: &mut SmiGpu, section: &[&str], key: &str, value: &str, no: usize) {
    let top = section.first().copied().unwrap_or("");
    let n = || lead_num(value).map(|x| (x, no));
    match (top, key) {
        ("", "Product Name") => g.name = Some((value.to_string(), no)),
        ("", "Performance State") => g.pstate = Some((value.to_string(), no)),
        ("Clocks", "SM") => g.sm_clock_mhz = n(),
        ("Clocks", "Memory") => g.mem_clock_mhz = n(),
        ("Max Clocks", "SM") => g.max_sm_clock_mhz = n(),
        ("Max Clocks", "Memory") => g.max_mem_clock_mhz = n(),
        ("Applications Clocks", "Graphics") => g.app_clock_mhz = n(),
        ("Clocks Event Reasons" | "Clocks Throttle Reasons", k) => {
            g.reasons_read = true;
            if value == "Active" && !k.contains("Counters") {
                g.active_reasons.push((k.to_string(), no));
            }
        }
        ("GPU Power Readings" | "Power Readings", "Power Draw") => g.power_draw_w = n(),
        ("GPU Power Readings" | "Power Readings", "Current Power Limit" | "Power Limit") => {
            g.power_limit_w = n();
        }
        ("GPU Power Readings" | "Power Readings", "Default Power Limit") => {
            g.default_power_limit_w = n();
        }
        ("ECC Mode", "Current") => g.ecc_mode = Some((value.to_string(), no)),
        ("ECC Errors", k) => {
            if let (Some(kind), Ok(c)) = (section.get(1), value.parse::<u64>()) {
                if c > 0 {
                    g.ecc_errors
                        .push(((*kind).to_string(), k.to_string(), c, no));
                }
            }
        }
        ("Remapped Rows", "Pending") => g.remap_pending = Some((value.to_string(), no)),
        ("Remapped Rows", "Remapping Failure Occurred") => {
            g.remap_failure = Some((value.to_string(), no));
        }
        ("FB Memory Usage", "Total") => g.mem_total_mib = n(),
        ("FB Memory Usage", "Used") => g.mem_used_mib = n(),
        ("Temperature", "GPU Current Temp") => g.temp_c = n(),
        _ => {}
    }
}

fn at<T: std::fmt::Display>(v: &AtLine<T>, unit: &str) -> String {
    match v {
        Some((x, l)) => format!("{x}{unit} (line {l})"),
        None => "unknown (not in the text)".into(),
    }
}

/// Findings of one `nvidia-smi -q` text (see the module docs). `timing` names the report or
/// measurement the snapshot is joined with, when one was given.
pub fn findings(r: &SmiReport, timing: Option<&str>, out: &mut Vec<Finding>) {
    if r.gpus.is_empty() {
        out.push(f(
            "nothing-recognised",
            Severity::Info,
            format!("{}: no GPU block of `nvidia-smi -q`", r.name),
            "expected the text of `nvidia-smi -q` (a `GPU 00000000:xx:00.0` line, then indented `key : value` lines); `nvidia-smi` without -q, or --query-gpu CSV, are other formats".into(),
            r.name.clone(),
        ));
        return;
    }
    let when = match (&r.timestamp, timing) {
        (Some((t, l)), Some(run)) => format!("the snapshot of {t} (line {l}) stands for the conditions of {run} only if it was taken during that run: clocks, power and throttling change from second to second"),
        (Some((t, l)), None) => format!("a snapshot taken {t} (line {l}): it states the conditions of a measurement only if taken during it"),
        (None, _) => "the text has no Timestamp line: when it was taken is unknown".into(),
    };
    for g in &r.gpus {
        gpu_findings(r, g, &when, out);
    }
}

fn gpu_findings(r: &SmiReport, g: &SmiGpu, when: &str, out: &mut Vec<Finding>) {
    let src = format!("{}:{}", r.name, g.line);
    let gpu = format!(
        "GPU {} ({})",
        g.bus_id,
        g.name
            .as_ref()
            .map_or("name not stated", |(n, _)| n.as_str())
    );
    out.push(f(
        "gpu-conditions",
        Severity::Info,
        format!("{gpu}: conditions"),
        format!(
            "driver {}, CUDA {}; P-state {}; SM clock {} of max {}; memory clock {} of max {}; applications clock {}; power draw {} at a limit of {} (default {}); ECC {}; memory used {} of {}; temperature {}. {when}",
            at(&r.driver, ""),
            at(&r.cuda, ""),
            at(&g.pstate, ""),
            at(&g.sm_clock_mhz, " MHz"),
            at(&g.max_sm_clock_mhz, " MHz"),
            at(&g.mem_clock_mhz, " MHz"),
            at(&g.max_mem_clock_mhz, " MHz"),
            at(&g.app_clock_mhz, " MHz"),
            at(&g.power_draw_w, " W"),
            at(&g.power_limit_w, " W"),
            at(&g.default_power_limit_w, " W"),
            at(&g.ecc_mode, ""),
            at(&g.mem_used_mib, " MiB"),
            at(&g.mem_total_mib, " MiB"),
            at(&g.temp_c, " °C"),
        ),
        src.clone(),
    ));
    let lowered = match (&g.power_limit_w, &g.default_power_limit_w) {
        (Some((cur, a)), Some((def, b))) if cur < def => {
            out.push(f(
                "gpu-power-cap-lowered",
                Severity::Warning,
                format!("{gpu}: power limit {cur} W below its default {def} W"),
                format!(
                    "Current Power Limit {cur} W (line {a}) against Default Power Limit {def} W (line {b}): sustained clocks, and so every throughput figure of this card, are lower than the card's own; `nvidia-smi -pl {def}` restores it (or say the cap in the figure's conditions)"
                ),
                src.clone(),
            ));
            true
        }
        _ => false,
    };
    if !g.active_reasons.is_empty() {
        let hard = g
            .active_reasons
            .iter()
            .any(|(k, _)| k.contains("HW") || k.contains("Thermal") || k.contains("Power Brake"));
        let sw_cap = g.active_reasons.iter().any(|(k, _)| k == "SW Power Cap");
        let idle_pstate = g
            .pstate
            .as_ref()
            .is_some_and(|(p, _)| p.as_str() >= "P5" || p.len() > 2);
        let sev = if hard || (sw_cap && lowered) {
            Severity::Warning
        } else {
            Severity::Info
        };
        let list = g
            .active_reasons
            .iter()
            .map(|(k, l)| format!("{k} (line {l})"))
            .collect::<Vec<_>>()
            .join(", ");
        out.push(f(
            "gpu-clock-events",
            sev,
            format!(
                "{gpu}: clock event reasons active: {}",
                g.active_reasons
                    .iter()
                    .map(|(k, _)| k.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            format!(
                "{list}{}; a figure measured while a reason is active ran below the card's clocks, so it carries that reason as a condition",
                if idle_pstate && !hard {
                    format!(
                        "; the card was idle at the snapshot ({}), where the software power cap is commonly reported active: a snapshot under load tells whether it limits a run",
                        at(&g.pstate, "")
                    )
                } else {
                    String::new()
                }
            ),
            src.clone(),
        ));
    } else if !g.reasons_read {
        out.push(f(
            "gpu-clock-events",
            Severity::Info,
            format!("{gpu}: clock event reasons unknown"),
            "the text has no `Clocks Event Reasons` (or `Clocks Throttle Reasons`) block: `nvidia-smi -q -d PERFORMANCE` prints it".into(),
            src.clone(),
        ));
    }
    ecc_findings(g, &gpu, &src, out);
}

fn ecc_findings(g: &SmiGpu, gpu: &str, src: &str, out: &mut Vec<Finding>) {
    let uncorrectable: Vec<String> = g
        .ecc_errors
        .iter()
        .filter(|(_, k, _, _)| k.contains("Uncorrectable"))
        .map(|(s, k, c, l)| format!("{s} {k} {c} (line {l})"))
        .collect();
    let correctable: Vec<String> = g
        .ecc_errors
        .iter()
        .filter(|(_, k, _, _)| !k.contains("Uncorrectable"))
        .map(|(s, k, c, l)| format!("{s} {k} {c} (line {l})"))
        .collect();
    let mut bad = uncorrectable.clone();
    if let Some((v, l)) = g.remap_pending.as_ref().filter(|(v, _)| v == "Yes") {
        bad.push(format!(
            "row remapping pending: {v} (line {l}); a GPU reset applies it"
        ));
    }
    if let Some((v, l)) = g.remap_failure.as_ref().filter(|(v, _)| v == "Yes") {
        bad.push(format!("remapping failure occurred: {v} (line {l})"));
    }
    if !bad.is_empty() {
        out.push(f(
            "gpu-ecc-errors",
            Severity::Warning,
            format!("{gpu}: uncorrectable memory errors or pending row remaps"),
            format!(
                "{}: figures from this card may be wrong or slow (retried pages, remaps); reset the GPU and check again before measuring",
                bad.join("; ")
            ),
            src.to_string(),
        ));
    } else if !correctable.is_empty() {
        out.push(f(
            "gpu-ecc-errors",
            Severity::Info,
            format!("{gpu}: correctable ECC errors counted"),
            format!(
                "{}: corrected in hardware, no effect on results; a count that grows between snapshots is worth watching",
                correctable.join("; ")
            ),
            src.to_string(),
        ));
    }
}
