//! Findings of one engine log's errors and boots: root causes (every one a group names), errors
//! without a cause, errors printed while the engine was being stopped, KV capacity per boot
//! (with how it was read), and the warnings that change what a user concludes about the KV
//! cache: vLLM's padding layers, llama.cpp's KV in host memory, SGLang's pool capped by
//! `--max-total-tokens`, TensorRT-LLM's lowered maximum length and replaced allocation.
//!
//! Every statement names its line; a figure the log does not hold is not stated.

use super::cause::Cause;
use super::log::{Boot, BootStatus, EngineLog, ErrorGroup};
use super::{f, gib, lines, Card, Finding, LogInput, Severity};
use crate::output::table::thousands;

fn join_nums(v: impl IntoIterator<Item = u32>) -> String {
    v.into_iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// ` (printed N times by ranks a, b; pids …)`, or empty for one print.
fn prints(g: &ErrorGroup) -> String {
    let mut parts = Vec::new();
    if g.ranks.len() > 1 || g.occurrences > 1 {
        parts.push(format!(
            "printed {} times{}",
            g.occurrences,
            if g.ranks.is_empty() {
                String::new()
            } else {
                format!(" by ranks {}", join_nums(g.ranks.iter().copied()))
            }
        ));
    }
    if !g.pids.is_empty() {
        parts.push(format!(
            "{}{} {}",
            g.proc
                .as_deref()
                .map(|p| format!("{p} "))
                .unwrap_or_default(),
            if g.pids.len() == 1 { "pid" } else { "pids" },
            join_nums(g.pids.iter().copied())
        ));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join("; "))
    }
}

/// The exceptions of a chained traceback, first to last, with how each follows the one before.
fn chain_text(g: &ErrorGroup) -> Option<String> {
    if g.chain.len() < 2 {
        return None;
    }
    let mut s = String::new();
    for (i, c) in g.chain.iter().enumerate() {
        if i > 0 {
            s.push_str(match c.relation.as_deref() {
                Some("direct cause") => " — the direct cause of → ",
                Some("during handling") => " — while handling it → ",
                _ => " → ",
            });
        }
        s.push_str(&format!("'{}' (line {})", c.exception, c.line));
    }
    Some(format!("one chained traceback: {s}"))
}

fn cause_title(c: &Cause) -> String {
    match c {
        Cause::KvTooSmallForMaxLen { max_model_len, .. } => format!(
            "KV cache too small for max_model_len {}",
            thousands(*max_model_len)
        ),
        Cause::NoKvMemory { .. } => "no memory for the KV cache".into(),
        Cause::OutOfMemory { .. } => "CUDA out of memory".into(),
        Cause::QuantizationUnsupported { method, .. } => format!(
            "quantization {} unsupported on this compute capability",
            method.as_deref().unwrap_or("scheme")
        ),
        Cause::CapabilityTooLow {
            what,
            min_capability,
            ..
        } => format!(
            "{what} needs {}",
            min_capability
                .map(|m| format!("sm_{m}"))
                .unwrap_or_else(|| "a newer card".into())
        ),
        Cause::InvalidArguments { message, .. } => {
            format!("the command line was refused: {message}")
        }
        Cause::PortInUse { port } => format!(
            "{} already in use",
            port.map(|p| format!("port {p}"))
                .unwrap_or_else(|| "the port".into())
        ),
        Cause::NoAttentionBackend { reasons, .. } => format!(
            "no attention backend for this model on this card ({} rejected)",
            reasons.len()
        ),
        Cause::ToolchainTooOld { target, .. } => format!(
            "toolchain too old for {}",
            target.as_deref().unwrap_or("this card")
        ),
    }
}

/// Error findings: one per distinct cause (over the whole log), one per error without a cause,
/// an info finding for errors printed after a shutdown request.
pub(crate) fn error_findings(
    name: &str,
    log: &EngineLog,
    card: Option<&Card>,
    out: &mut Vec<Finding>,
) {
    let card = card.map(|c| (c.cc.major * 10 + c.cc.minor, format!("from {}", c.source)));
    let card = card.as_ref().map(|(c, s)| (*c, s.as_str()));
    // Causes already reported: the same cause again in the same boot and process is another
    // copy of the same traceback (a logger copy and a plain stderr copy), not another failure.
    let mut seen: Vec<(Cause, usize, Option<usize>, std::collections::BTreeSet<u32>)> = Vec::new();
    for (i, g) in log.errors.iter().enumerate() {
        let src = lines(name, g.line, g.last_line);
        let printed = prints(g);
        if let Some(s) = g.after_shutdown {
            out.push(f(
                "engine-error-at-shutdown",
                Severity::Info,
                format!("error while the engine was being stopped: {}", g.summary()),
                format!(
                    "printed after line {s} asked the engine to stop (a signal or a shutdown request): a consequence of stopping it, not a fault of the run{}{printed}",
                    chain_text(g).map(|c| format!("; {c}")).unwrap_or_default()
                ),
                src,
            ));
            continue;
        }
        if g.generic && g.explained_by.is_some() {
            continue; // folded into its cause below
        }
        if !g.causes.is_empty() {
            let consequences: Vec<String> = log
                .errors
                .iter()
                .filter(|x| x.explained_by == Some(i))
                .map(|x| {
                    format!(
                        "'{}' at line {}",
                        x.headline.as_deref().unwrap_or("error"),
                        x.line
                    )
                })
                .collect();
            for (c, cause_line) in &g.causes {
                let copy = seen.iter().find(|(x, _, boot, pids)| {
                    x == c
                        && *boot == g.boot
                        && (pids.is_empty() || g.pids.is_empty() || !pids.is_disjoint(&g.pids))
                });
                if let Some((_, first, _, _)) = copy {
                    // The same cause again (another copy of the traceback): say so once.
                    if let Some(fi) = out.iter_mut().find(|x| {
                        x.id == c.kind().replace('_', "-")
                            && x.detail.contains(&format!("(line {first}"))
                    }) {
                        fi.detail
                            .push_str(&format!("; named again at line {cause_line}"));
                    }
                    continue;
                }
                seen.push((c.clone(), *cause_line, g.boot, g.pids.clone()));
                let phase = if c.is_startup() {
                    "startup failed"
                } else {
                    "out of memory"
                };
                let mut detail = format!(
                    "{} (line {cause_line}{}){printed}",
                    c.describe_for(card),
                    if g.line != g.last_line {
                        format!(", the error spans lines {}–{}", g.line, g.last_line)
                    } else {
                        String::new()
                    }
                );
                if g.causes.len() > 1 {
                    detail.push_str(&format!(
                        "; this error names {} causes, each reported",
                        g.causes.len()
                    ));
                }
                if let Some(ch) = chain_text(g) {
                    detail.push_str(&format!("; {ch}"));
                }
                if !consequences.is_empty() {
                    detail.push_str(&format!(
                        "; then {}, which is the consequence, not the cause",
                        consequences.join(", ")
                    ));
                }
                out.push(f(
                    &c.kind().replace('_', "-"),
                    Severity::Error,
                    format!("{phase}: {}", cause_title(c)),
                    detail,
                    src.clone(),
                ));
            }
            continue;
        }
        let chain = chain_text(g).map(|c| format!("; {c}")).unwrap_or_default();
        let (title, detail) = match (&g.headline, &g.exception) {
            (None, None) => (
                "engine error, cause not captured in this excerpt".to_string(),
                format!(
                    "only traceback lines ({} of them) at error level: the message that opened the error and the exception that ended it are outside this excerpt; include the lines before line {} and after line {}",
                    g.traceback_lines, g.line, g.last_line
                ),
            ),
            (Some(h), None) if g.traceback_lines > 0 => (
                format!("engine error: {h}"),
                format!(
                    "the traceback under it (lines {}–{}) ends before its exception line: cause not captured in this excerpt{printed}",
                    g.line + 1,
                    g.last_line
                ),
            ),
            (Some(h), None) => (
                format!("engine error: {h}"),
                format!("no cause named in the log{printed}"),
            ),
            (h, Some(e)) => (
                format!(
                    "engine error: {}",
                    h.as_deref()
                        .or_else(|| g.chain.first().map(|c| c.exception.as_str()))
                        .unwrap_or(e)
                ),
                format!("raised {e}{printed}{chain}"),
            ),
        };
        out.push(f("engine-error", Severity::Error, title, detail, src));
    }
}

fn boot_tag(b: &Boot, n: usize) -> String {
    if n > 1 {
        format!("boot {} of {n}", b.index)
    } else {
        "boot".to_string()
    }
}

/// Per boot: capacity, incomplete startups, and the KV warnings of each engine.
pub(crate) fn boot_findings(l: &LogInput, out: &mut Vec<Finding>) {
    let name = &l.name;
    let log = &l.log;
    let n = log.boots.len();
    for b in &log.boots {
        let tag = boot_tag(b, n);
        let src = lines(name, b.line, b.last_line);
        let mem = b.available_kv_memory_bytes.map(|m| {
            format!(
                "{} available for KV (line {})",
                gib(m),
                b.available_kv_memory_line.unwrap_or(b.line)
            )
        });
        match b.status {
            Some(BootStatus::Incomplete) => {
                let last = b
                    .last_stage
                    .clone()
                    .unwrap_or_else(|| ("its start".into(), b.line));
                let next = (b.index < n).then(|| log.boots[b.index].line);
                let moves = match next {
                    Some(l) => format!("moves on to the next boot (line {l})"),
                    None => "stops".into(),
                };
                if b.available_kv_memory_bytes.is_some() {
                    out.push(f(
                        "startup-incomplete",
                        Severity::Warning,
                        format!("{tag}: startup incomplete, KV tokens unknown"),
                        format!(
                            "{}; the log {moves} after {} (line {}) without a KV-size line ('GPU KV cache size' / '# GPU blocks'); KV tokens are not derived from GiB. The engine may still be profiling, or died without an error line: look at the lines after the excerpt, or dmesg for an OOM kill",
                            mem.clone().unwrap_or_default(),
                            last.0,
                            last.1
                        ),
                        src.clone(),
                    ));
                } else {
                    let loading = last.0.starts_with("loading");
                    out.push(f(
                        "startup-state-unknown",
                        Severity::Info,
                        if loading {
                            format!("{tag}: the log stops mid-load, {} (line {})", last.0, last.1)
                        } else {
                            format!("{tag}: only its start is in the log")
                        },
                        format!(
                            "the log {moves} after {} (line {}), before any KV-cache line: the startup got that far and its state after it is unknown (still loading, killed, or the excerpt ends there); the engine's later lines, or its exit status, would tell",
                            last.0, last.1
                        ),
                        src.clone(),
                    ));
                }
            }
            Some(BootStatus::Failed) if !b.has_kv_size() => {} // the error findings say it
            _ if b.has_kv_size() => capacity_finding(b, &tag, &src, mem, out),
            _ => {}
        }
        engine_warnings(b, &tag, name, out);
    }
}

fn capacity_finding(b: &Boot, tag: &str, src: &str, mem: Option<String>, out: &mut Vec<Finding>) {
    let mut parts = Vec::new();
    match (b.kv_cache_tokens, b.gpu_blocks, b.capacity_tokens()) {
        (Some(t), _, _) => parts.push(format!(
            "{} KV tokens (line {}{})",
            thousands(t),
            b.kv_cache_tokens_line.unwrap_or(b.line),
            b.kv_cache_tokens_rule
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        )),
        (None, Some(g), Some(t)) => parts.push(format!(
            "{} GPU blocks × {} = {} KV tokens (block size {})",
            thousands(g),
            b.block_size.unwrap_or(0),
            thousands(t),
            b.block_size_source.as_deref().unwrap_or("stated")
        )),
        (None, Some(g), None) => parts.push(format!(
            "{} GPU blocks (block size not in the log: KV tokens unknown)",
            thousands(g)
        )),
        _ => {}
    }
    if b.kv_cache_tokens.is_some() {
        if let Some(g) = b.gpu_blocks {
            parts.push(format!(
                "{} GPU blocks{}",
                thousands(g),
                b.block_size
                    .map(|s| format!(" of {s} tokens"))
                    .unwrap_or_default()
            ));
        }
    }
    if let Some(c) = b.cpu_blocks.filter(|c| *c > 0) {
        parts.push(format!(
            "{} blocks in host memory (swap / secondary pool, not part of the capacity)",
            thousands(c)
        ));
    }
    if let Some((len, x)) = b.max_concurrency {
        parts.push(format!(
            "max concurrency {x:.2}x at {} tokens per request (line {})",
            thousands(len),
            b.max_concurrency_line.unwrap_or(b.line)
        ));
    }
    if let Some(m) = mem {
        parts.push(m);
    }
    if let Some(p) = b.kv_pool_bytes {
        parts.push(format!(
            "the KV pool holds {}{}",
            crate::output::table::human_bytes(p),
            b.kv_pool_bytes_line
                .map(|n| format!(" (line {n})"))
                .unwrap_or_default()
        ));
    }
    if let Some(s) = &b.kv_cells_swa {
        parts.push(format!(
            "plus a sliding-window cache of {} cells (line {}), which bounds those layers to their window",
            thousands(s.cells),
            s.line
        ));
    }
    if let Some(v) = &b.engine_version {
        parts.push(format!("engine {v}"));
    }
    if b.repeated_lines > 0 {
        parts.push(format!(
            "{} startup {} printed again by the same process, counted once",
            b.repeated_lines,
            if b.repeated_lines == 1 {
                "line was"
            } else {
                "lines were"
            }
        ));
    }
    if b.status == Some(BootStatus::Failed) {
        parts.push("then a startup error (below)".into());
    }
    out.push(f(
        "kv-capacity",
        Severity::Info,
        format!(
            "{tag}: KV cache {}",
            b.capacity_tokens()
                .map(|t| format!("{} tokens", thousands(t)))
                .unwrap_or_else(|| "size unknown".into())
        ),
        parts.join("; "),
        src.to_string(),
    ));
    if let Some(k) = b.kv_check.as_ref().filter(|k| !k.consistent) {
        let (len, x) = b.max_concurrency.unwrap_or((0, 0.0));
        out.push(f(
            "kv-inconsistent",
            Severity::Warning,
            format!(
                "{tag}: KV size line and max-concurrency line disagree ({:.2}×)",
                k.factor
            ),
            format!(
                "printed {} tokens, but {x:.2} × {} tokens per request = {} tokens; they differ by more than 2%, so both are reported and neither is taken alone. Hybrid models (attention + Mamba / linear-attention layers) share the KV memory between layer groups, and vLLM computes the two lines differently for them; measure admission with concurrent long requests if it matters",
                thousands(k.printed_tokens),
                thousands(len),
                thousands(k.implied_tokens)
            ),
            src.to_string(),
        ));
    }
    // llama.cpp: the cells line and the slots line must agree.
    if let (Some(c), Some(s)) = (&b.kv_cells, &b.slots) {
        if let (Some(n), Some(ctx)) = (s.n_slots, s.n_ctx_slot) {
            let from_slots = if s.unified == Some(true) {
                ctx
            } else {
                n.saturating_mul(ctx)
            };
            let from_cells = c.cells.saturating_mul(c.streams.unwrap_or(1));
            if from_slots != from_cells {
                out.push(f(
                    "kv-inconsistent",
                    Severity::Warning,
                    format!("{tag}: the KV-cache line and the slots line disagree"),
                    format!(
                        "line {}: {} cells × {} streams = {} tokens; line {}: {} = {} tokens; both are reported and neither is taken alone",
                        c.line,
                        thousands(c.cells),
                        c.streams.unwrap_or(1),
                        thousands(from_cells),
                        s.line,
                        if s.unified == Some(true) {
                            format!("n_ctx_slot {} (kv_unified)", thousands(ctx))
                        } else {
                            format!("n_slots {n} × n_ctx_slot {}", thousands(ctx))
                        },
                        thousands(from_slots)
                    ),
                    src.to_string(),
                ));
            }
        }
    }
}

/// vLLM's `--num-gpu-blocks-override`: one finding per line. Below what the profiler found,
/// the flag is the binding limit of the KV pool (the printed KV tokens are the flag's, not the
/// memory's); above it, the pool claims memory the profiler did not find (an out-of-memory
/// risk); on the profiling pass (`num_gpu_blocks=0`) no profiled figure exists.
fn override_findings(b: &Boot, tag: &str, name: &str, out: &mut Vec<Finding>) {
    for o in &b.block_overrides {
        let tokens = b
            .block_size
            .map(|s| {
                format!(
                    " ({} × {s} = {} tokens)",
                    thousands(o.blocks),
                    thousands(o.blocks.saturating_mul(s))
                )
            })
            .unwrap_or_default();
        let (sev, title, detail) = match u64::try_from(o.profiled) {
            Ok(0) | Err(_) => (
                Severity::Info,
                format!("{tag}: --num-gpu-blocks-override sets {} KV blocks", thousands(o.blocks)),
                format!(
                    "line {} overrides the block count with {}{tokens} before any memory was profiled (num_gpu_blocks={}): whether the flag is below what the card holds is unknown from this line; a later override line, or vLLM's 'Available KV cache memory' line, tells",
                    o.line,
                    thousands(o.blocks),
                    o.profiled
                ),
            ),
            Ok(p) if o.blocks < p => (
                Severity::Warning,
                format!(
                    "{tag}: KV pool cut by --num-gpu-blocks-override to {} blocks, {} profiled",
                    thousands(o.blocks),
                    thousands(p)
                ),
                format!(
                    "line {}: the profiler found room for {} blocks and the flag set {}{tokens}, {:.1}% of it: the flag, not the memory, is the binding limit of the KV cache, so admission and preemption figures measure the flag; drop it to use the memory",
                    o.line,
                    thousands(p),
                    thousands(o.blocks),
                    o.blocks as f64 / p as f64 * 100.0
                ),
            ),
            Ok(p) if o.blocks > p => (
                Severity::Warning,
                format!(
                    "{tag}: --num-gpu-blocks-override sets {} KV blocks, above the {} profiled",
                    thousands(o.blocks),
                    thousands(p)
                ),
                format!(
                    "line {}: the flag asks for {} blocks{tokens} where the profiler found memory for {}: the pool claims memory the profiler did not find, an out-of-memory risk under load",
                    o.line,
                    thousands(o.blocks),
                    thousands(p)
                ),
            ),
            Ok(p) => (
                Severity::Info,
                format!("{tag}: --num-gpu-blocks-override equals the {} blocks profiled", thousands(p)),
                format!("line {}: the flag set what the profiler found", o.line),
            ),
        };
        out.push(f(
            "kv-pool-capped",
            sev,
            title,
            detail,
            format!("{name}:{}", o.line),
        ));
    }
}

/// vLLM's padding lines of one boot as one finding: the worst first, every line named (the
/// same figure printed again, by another rank or group, is listed with its lines, never
/// dropped).
fn padding_finding(b: &Boot, tag: &str, name: &str, out: &mut Vec<Finding>) {
    let mut all: Vec<&super::log::KvPadding> = b.paddings.iter().collect();
    if all.is_empty() {
        all.extend(b.padding.iter());
    }
    let Some(first) = all.first() else {
        return;
    };
    let first_line = first.line;
    // Distinct (layers, waste) figures, worst first, each with its lines.
    let mut figures: Vec<(u64, f64, Vec<usize>)> = Vec::new();
    for p in &all {
        match figures
            .iter_mut()
            .find(|(l, w, _)| *l == p.layers && (*w - p.waste).abs() < 1e-9)
        {
            Some(x) => x.2.push(p.line),
            None => figures.push((p.layers, p.waste, vec![p.line])),
        }
    }
    figures.sort_by(|a, b| b.1.total_cmp(&a.1));
    let (layers, waste, _) = figures[0].clone();
    let plural = |n: u64| if n == 1 { "" } else { "s" };
    let each = figures
        .iter()
        .map(|(l, w, lines)| {
            format!(
                "{} empty layer{} and up to {:.2}% wasted (line{} {})",
                l,
                plural(*l),
                w * 100.0,
                if lines.len() == 1 { "" } else { "s" },
                lines
                    .iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let last_line = all.iter().map(|p| p.line).max().unwrap_or(first_line);
    out.push(f(
        "kv-padding-waste",
        if waste >= 0.10 {
            Severity::Warning
        } else {
            Severity::Info
        },
        format!(
            "{tag}: up to {:.2}% of the KV memory wasted on {} padding layer{}{}",
            waste * 100.0,
            layers,
            plural(layers),
            if all.len() > 1 {
                format!(" (worst of {} padding lines)", all.len())
            } else {
                String::new()
            }
        ),
        format!(
            "vLLM's hybrid KV allocator groups layers of each attention type into groups of one size and pads the short group with empty layers: {each}. The KV tokens it prints are computed over pages that hold nothing for those layers, so up to that share of the KV memory holds no token; models mixing full and sliding-window attention with a drafter hit it (vLLM PR 29303 changed the grouping for gpt-oss + EAGLE3; newer vLLM groups by the greatest common divisor of the layer counts)"
        ),
        lines(name, first_line, last_line),
    ));
}

/// The warnings each engine prints about its KV cache, as findings.
fn engine_warnings(b: &Boot, tag: &str, name: &str, out: &mut Vec<Finding>) {
    padding_finding(b, tag, name, out);
    override_findings(b, tag, name, out);
    kv_off_gpu_finding(b, tag, name, out);
    pool_capped_finding(b, tag, name, out);
    reduced_findings(b, tag, name, out);
}

/// llama.cpp: KV buffers in host memory beside a GPU backend (`kv-off-gpu`).
fn kv_off_gpu_finding(b: &Boot, tag: &str, name: &str, out: &mut Vec<Finding>) {
    if !b.kv_buffers.is_empty() {
        let host: f64 = b
            .kv_buffers
            .iter()
            .filter(|x| x.on_host())
            .map(|x| x.mib)
            .sum();
        let dev: f64 = b
            .kv_buffers
            .iter()
            .filter(|x| !x.on_host())
            .map(|x| x.mib)
            .sum();
        let list = |host_side: bool| {
            b.kv_buffers
                .iter()
                .filter(|x| x.on_host() == host_side)
                .map(|x| format!("{} {:.2} MiB (line {})", x.device, x.mib, x.line))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let gpu_model =
            b.gpu_model_buffer_line.is_some() || b.offloaded_layers.is_some_and(|(a, _, _)| a > 0);
        let offload = b
            .offloaded_layers
            .map(|(a, t, line)| {
                format!("; the model has {a} of {t} layers on the GPU (line {line})")
            })
            .unwrap_or_default();
        if host > 0.0 && dev > 0.0 {
            out.push(f(
                "kv-off-gpu",
                Severity::Warning,
                format!(
                    "{tag}: {:.1}% of the KV cache is in host memory",
                    host / (host + dev) * 100.0
                ),
                format!(
                    "KV buffers in host memory: {}; on the GPU: {}{offload}. Attention over the layers whose KV sits in host memory reads it over PCIe on every step, which slows decoding; it happens when not every layer is offloaded (-ngl below the layer count) or with --no-kv-offload",
                    list(true),
                    list(false)
                ),
                format!("{name}:{}", b.kv_buffers[0].line),
            ));
        } else if host > 0.0 && gpu_model {
            out.push(f(
                "kv-off-gpu",
                Severity::Warning,
                format!("{tag}: the whole KV cache is in host memory while the model uses the GPU"),
                format!(
                    "KV buffers: {}{offload}{}: every decoding step reads the KV cache over PCIe (--no-kv-offload, or no layer offloaded)",
                    list(true),
                    b.gpu_model_buffer_line
                        .map(|l| format!("; model weights on a GPU backend (line {l})"))
                        .unwrap_or_default()
                ),
                format!("{name}:{}", b.kv_buffers[0].line),
            ));
        }
    }
}

/// SGLang: the pool capped by --max-total-tokens (`kv-pool-capped`).
fn pool_capped_finding(b: &Boot, tag: &str, name: &str, out: &mut Vec<Finding>) {
    if let (Some(s), Some(t)) = (&b.sglang, b.kv_cache_tokens) {
        if let Some((asked, profiled, line)) = s.larger_than_profiled {
            out.push(f(
                "kv-pool-capped",
                if profiled <= 0 {
                    Severity::Warning
                } else {
                    Severity::Info
                },
                format!(
                    "{tag}: --max-total-tokens {} is more than SGLang's profiler allows ({profiled})",
                    thousands(asked)
                ),
                format!(
                    "line {line}: SGLang uses the profiled value instead; the pool holds {} tokens",
                    thousands(t)
                ),
                format!("{name}:{line}"),
            ));
        } else if let Some((cap, line)) = s.max_total_tokens {
            let page = s.page_size.unwrap_or(1).max(1);
            if t <= cap && cap - t < page.max(1) {
                let per_token = b.kv_pool_bytes.map(|p| p as f64 / t.max(1) as f64);
                let profiled = profiled_tokens(s, per_token);
                let free = s.avail_after_pool_gb.map(|(g, l)| {
                    format!("{g:.2} GB (SGLang's GB: GiB) stayed free after the pool (line {l})")
                });
                let (sev, title, why) = match profiled {
                    Some((p, how)) if p as f64 >= 1.5 * t as f64 => (
                        Severity::Warning,
                        format!(
                            "{tag}: KV pool capped at {} tokens by --max-total-tokens, far below the ≈{} its profiler allows",
                            thousands(t),
                            thousands(p)
                        ),
                        format!("SGLang applies a smaller --max-total-tokens silently; {how}"),
                    ),
                    Some((p, how)) => (
                        Severity::Info,
                        format!(
                            "{tag}: KV pool capped at {} tokens by --max-total-tokens (its profiler allows ≈{})",
                            thousands(t),
                            thousands(p)
                        ),
                        how,
                    ),
                    None => (
                        Severity::Info,
                        format!(
                            "{tag}: KV pool capped at {} tokens by --max-total-tokens",
                            thousands(t)
                        ),
                        "SGLang applies a smaller --max-total-tokens silently and does not print what its profiler found; the memory lines needed to estimate it (Load weight begin/end, Memory profiling, K/V size) are not all in the log".into(),
                    ),
                };
                out.push(f(
                    "kv-pool-capped",
                    sev,
                    title,
                    format!(
                        "server_args max_total_tokens={} (line {line}) and the pool holds {} tokens (line {}); {why}{}",
                        thousands(cap),
                        thousands(t),
                        b.kv_cache_tokens_line.unwrap_or(b.line),
                        free.map(|x| format!("; {x}")).unwrap_or_default()
                    ),
                    format!("{name}:{line}"),
                ));
            }
        }
    }
}

/// TensorRT-LLM: lengths lowered to fit the KV cache (`max-len-reduced`); a replaced
/// allocation (`kv-allocation-replaced`).
fn reduced_findings(b: &Boot, tag: &str, name: &str, out: &mut Vec<Finding>) {
    for r in &b.reduced {
        out.push(f(
            "max-len-reduced",
            Severity::Warning,
            format!(
                "{tag}: the engine lowered {} to {} tokens to fit its KV cache",
                r.what,
                thousands(r.to)
            ),
            format!(
                "line {}{}: a request longer than {} tokens is refused or cut; more KV memory (free_gpu_memory_fraction, a smaller model or FP8 KV) or fewer concurrent requests give it back",
                r.line,
                r.from
                    .map(|x| format!(" (from {})", thousands(x)))
                    .unwrap_or_default(),
                thousands(r.to)
            ),
            format!("{name}:{}", r.line),
        ));
    }
    if let Some((t, line)) = b.replaced_allocation {
        out.push(f(
            "kv-allocation-replaced",
            Severity::Info,
            format!(
                "{tag}: an earlier KV allocation of {} tokens (line {line}) was replaced",
                thousands(t)
            ),
            format!(
                "the same process allocated its KV cache again ({} tokens at line {}); the last allocation is the capacity",
                b.kv_cache_tokens.map(thousands).unwrap_or_default(),
                b.kv_cache_tokens_line.unwrap_or(b.line)
            ),
            format!("{name}:{line}"),
        ));
    }
}

/// SGLang's profiled pool size when the log holds what SGLang computed it from: `rest_memory`
/// of the `Memory profiling` line, or (older versions) avail mem after the weights − avail mem
/// before them × (1 − mem_fraction_static) (`model_runner.py` `profile_max_num_token`), over
/// the pool's bytes per token (K + V size / #tokens).
fn profiled_tokens(s: &super::log::SglangMemory, per_token: Option<f64>) -> Option<(u64, String)> {
    let per_token = per_token.filter(|x| *x > 0.0)?;
    let (rest, how) = match (
        s.rest_memory_gb,
        s.avail_before_weights_gb,
        s.avail_after_weights_gb,
        s.mem_fraction_static,
    ) {
        (Some((r, line)), ..) => (r, format!("rest_memory {r:.2} GB (line {line})")),
        (None, Some(before), Some(after), Some(mfs)) => {
            let r = after - before * (1.0 - mfs);
            (
                r,
                format!(
                    "avail mem after the weights {after:.2} GB − {before:.2} GB × (1 − mem_fraction_static {mfs}) = {r:.2} GB (SGLang's profile rule)"
                ),
            )
        }
        _ => return None,
    };
    if rest <= 0.0 {
        return None;
    }
    // SGLang's GB is 2^30 bytes (see `super::engines::sglang`).
    let tokens = (rest * 1_073_741_824.0 / per_token).floor() as u64;
    Some((
        tokens,
        format!(
            "the profiler's KV budget is {how}, at {per_token:.0} bytes per token (K + V size / tokens of the pool) ≈ {} tokens",
            thousands(tokens)
        ),
    ))
}
