//! Root causes named from an engine's own words: out of memory (with the sizes), a KV cache too
//! small for `max_model_len`, a quantization method the card's compute capability cannot run,
//! an option or dtype that needs a newer card, a toolchain too old for the card (PTX ISA vs
//! `sm_XXXa`, a PyTorch build without the card's architecture), a command line the engine's
//! argument parser refused, and a port already in use. `docs/diagnose.md` lists the messages
//! per engine.
//!
//! Minimum PTX ISA per target, checked with ptxas of CUDA 13.0 (a `.version` below it gives
//! `PTX .version X does not support .target sm_XXXa`): sm_90a 8.0, sm_100a 8.6, sm_120a 8.7,
//! sm_103a and sm_121a 8.8, sm_110a 9.0. The CUDA release that introduced each PTX ISA version
//! follows NVIDIA's PTX ISA release notes (8.0 = 12.0 … 8.5 = 12.5, 8.6 = 12.7, 8.7 = 12.8,
//! 8.8 = 12.9, 9.0 = 13.0).

use std::sync::OnceLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// Why an engine stopped (or a request failed), when its log says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Cause {
    /// The KV cache cannot hold one request of `max_model_len` tokens.
    KvTooSmallForMaxLen {
        /// The requested max model length, tokens.
        max_model_len: u64,
        /// Tokens the KV cache holds (V0 wording).
        kv_cache_tokens: Option<u64>,
        /// KV memory needed, GiB (V1 wording).
        needed_gib: Option<f64>,
        /// KV memory available, GiB (V1 wording).
        available_gib: Option<f64>,
        /// The engine's estimate of the largest max length that fits (newer V1 wording).
        estimated_max_model_len: Option<u64>,
    },
    /// No memory left for any KV block (vLLM V0 `No available memory for the cache blocks`,
    /// SGLang `Not enough memory`).
    NoKvMemory {
        /// The engine's message.
        message: String,
    },
    /// CUDA / torch / ggml out of memory, with the sizes the message gives.
    OutOfMemory {
        /// `Tried to allocate X`.
        tried_to_allocate: Option<String>,
        /// `GPU N`.
        gpu: Option<u32>,
        /// Total capacity of that GPU.
        total: Option<String>,
        /// Free at the time.
        free: Option<String>,
        /// Memory in use by this process (non-PyTorch included).
        in_use: Option<String>,
        /// Allocated by PyTorch.
        allocated_by_pytorch: Option<String>,
    },
    /// The quantization method or scheme needs a newer compute capability.
    QuantizationUnsupported {
        /// The method (`mxfp4`), when named.
        method: Option<String>,
        /// Minimum capability, e.g. 100 for sm_100.
        min_capability: Option<u32>,
        /// The card's capability, e.g. 86.
        current_capability: Option<u32>,
    },
    /// An option, dtype or kernel that needs a newer compute capability than the card has
    /// (`Bfloat16 is only supported on GPUs with compute capability of at least 8.0`,
    /// `... requires compute capability 10.0`, `... is only supported on SM100`).
    CapabilityTooLow {
        /// What needs it, as the message names it.
        what: String,
        /// Minimum capability, e.g. 100 for sm_100.
        min_capability: Option<u32>,
        /// The card's capability, when stated.
        current_capability: Option<u32>,
    },
    /// The engine's argument parser refused the command line (`vllm: error: unrecognized
    /// arguments: --x`, argparse `invalid choice`, llama.cpp `error: invalid argument`,
    /// click `Error: No such option`).
    InvalidArguments {
        /// The program that printed it (`vllm`, `launch_server.py`), when named.
        program: Option<String>,
        /// The parser's message after `error:`.
        message: String,
    },
    /// The server could not bind its port (`[Errno 98] Address already in use`, llama.cpp
    /// `couldn't bind HTTP server socket`).
    PortInUse {
        /// The port, when stated.
        port: Option<u32>,
    },
    /// No attention backend of the engine accepts the model's attention on this card (vLLM
    /// `No valid attention backend found for cuda with AttentionSelectorConfig(head_size=576,
    /// …, use_mla=True, use_sparse=True, …). Reasons: {FLASHMLA: [compute capability not
    /// supported, …], …}`, `vllm/platforms/cuda.py` `get_attn_backend_cls`): each backend with
    /// the reasons it gave.
    NoAttentionBackend {
        /// The model's attention as the message states it (`head_size=576, use_mla=True, …`).
        config: String,
        /// Each backend and its reasons, in the message's order.
        reasons: Vec<(String, Vec<String>)>,
    },
    /// The compiler toolchain or a prebuilt binary does not know the card's architecture.
    ToolchainTooOld {
        /// The architecture target (`sm_120a`, `compute_120`).
        target: Option<String>,
        /// The PTX ISA version the failing PTX declared.
        ptx_isa: Option<String>,
        /// The PTX ISA the target needs.
        needs_ptx_isa: Option<String>,
        /// The CUDA release that brings it.
        needs_cuda: Option<String>,
        /// What failed, in words.
        detail: String,
    },
}

impl Cause {
    /// A short id (`out_of_memory`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Cause::KvTooSmallForMaxLen { .. } => "kv_too_small_for_max_len",
            Cause::NoKvMemory { .. } => "no_kv_memory",
            Cause::OutOfMemory { .. } => "out_of_memory",
            Cause::QuantizationUnsupported { .. } => "quantization_unsupported",
            Cause::CapabilityTooLow { .. } => "capability_too_low",
            Cause::InvalidArguments { .. } => "invalid_arguments",
            Cause::PortInUse { .. } => "port_in_use",
            Cause::ToolchainTooOld { .. } => "toolchain_too_old",
            Cause::NoAttentionBackend { .. } => "no_attention_backend",
        }
    }

    /// Rewrite the strings the cause copied from the log (messages, names, arguments) with `f`
    /// (redaction of user data); figures and rigbench's own words stay.
    pub fn map_input_text(&mut self, f: &dyn Fn(&str) -> String) {
        match self {
            Cause::NoKvMemory { message } => *message = f(message),
            Cause::CapabilityTooLow { what, .. } => *what = f(what),
            Cause::InvalidArguments { program, message } => {
                *message = f(message);
                if let Some(p) = program {
                    *p = f(p);
                }
            }
            Cause::QuantizationUnsupported {
                method: Some(m), ..
            } => *m = f(m),
            Cause::ToolchainTooOld { detail, .. } => *detail = f(detail),
            _ => {}
        }
    }

    /// The card's compute capability the cause states, e.g. 86.
    pub fn current_capability(&self) -> Option<u32> {
        match self {
            Cause::QuantizationUnsupported {
                current_capability, ..
            }
            | Cause::CapabilityTooLow {
                current_capability, ..
            } => *current_capability,
            _ => None,
        }
    }

    /// Whether this cause stops startup (as opposed to a request failing at run time).
    pub fn is_startup(&self) -> bool {
        !matches!(self, Cause::OutOfMemory { .. })
    }

    /// One sentence naming the cause with its figures.
    pub fn describe(&self) -> String {
        self.describe_for(None)
    }

    /// [`Cause::describe`], with the card the user named (`--cc`, `--rig`: its compute
    /// capability as `major * 10 + minor`, and where it came from) standing in where the
    /// message does not state the card's capability. Without either, the sentence says the
    /// message does not state it and what would (never a bare "not stated").
    pub fn describe_for(&self, card: Option<(u32, &str)>) -> String {
        let have = |current: &Option<u32>| match (current, card) {
            (Some(c), _) => cc_text(*c),
            (None, Some((c, from))) => format!("{} ({from})", cc_text(c)),
            (None, None) => {
                "a capability the message does not state (give --cc or --rig to name it)".into()
            }
        };
        let need = |min: &Option<u32>| {
            min.map(cc_text)
                .unwrap_or_else(|| "a capability the message does not state".into())
        };
        match self {
            Cause::KvTooSmallForMaxLen {
                max_model_len,
                kv_cache_tokens,
                needed_gib,
                available_gib,
                estimated_max_model_len,
            } => {
                let mut s = format!(
                    "KV cache too small for max_model_len {}: one request of that length does not fit",
                    thousands(*max_model_len)
                );
                if let Some(t) = kv_cache_tokens {
                    s.push_str(&format!(" (the KV cache holds {} tokens)", thousands(*t)));
                }
                if let (Some(n), Some(a)) = (needed_gib, available_gib) {
                    s.push_str(&format!(" ({n} GiB of KV needed, {a} GiB available)"));
                }
                if let Some(m) = estimated_max_model_len {
                    s.push_str(&format!(
                        "; the engine estimates that max_model_len {} would fit",
                        thousands(*m)
                    ));
                }
                s.push_str("; lower --max-model-len or raise --gpu-memory-utilization");
                s
            }
            Cause::NoKvMemory { message } => format!(
                "no memory left for the KV cache after the weights and activations ({message})"
            ),
            Cause::OutOfMemory {
                tried_to_allocate,
                gpu,
                total,
                free,
                in_use,
                allocated_by_pytorch,
            } => {
                let mut parts = Vec::new();
                if let Some(t) = tried_to_allocate {
                    parts.push(format!("tried to allocate {t}"));
                }
                match (gpu, total, free) {
                    (g, Some(t), Some(f)) => parts.push(format!(
                        "{} has {t} in total, {f} free",
                        g.map(|g| format!("GPU {g}")).unwrap_or_else(|| "the GPU".into())
                    )),
                    (_, _, Some(f)) => parts.push(format!("{f} free")),
                    _ => {}
                }
                if let Some(u) = in_use {
                    parts.push(format!("this process holds {u}"));
                }
                if let Some(a) = allocated_by_pytorch {
                    parts.push(format!("{a} allocated by PyTorch"));
                }
                if parts.is_empty() {
                    "CUDA out of memory".into()
                } else {
                    format!("CUDA out of memory: {}", parts.join(", "))
                }
            }
            Cause::QuantizationUnsupported {
                method,
                min_capability,
                current_capability,
            } => format!(
                "quantization {} unsupported on this card: it needs compute capability {} and the card has {}",
                method.as_deref().unwrap_or("scheme"),
                need(min_capability),
                have(current_capability),
            ),
            Cause::CapabilityTooLow {
                what,
                min_capability,
                current_capability,
            } => format!(
                "{what} needs compute capability {} and the card has {}",
                need(min_capability),
                have(current_capability),
            ),
            Cause::InvalidArguments { program, message } => format!(
                "the command line was refused by {}'s argument parser: {message}; fix the flag (see the engine's --help for its version)",
                program.as_deref().unwrap_or("the engine")
            ),
            Cause::PortInUse { port } => format!(
                "the server could not bind {}: another process holds it; stop it or choose another --port",
                port.map(|p| format!("port {p}")).unwrap_or_else(|| "its port".into())
            ),
            Cause::ToolchainTooOld { detail, .. } => format!("toolchain too old for this card: {detail}"),
            Cause::NoAttentionBackend { config, reasons } => attention_backend_text(config, reasons),
        }
    }
}

/// Reasons a flag can change (the KV-cache dtype, the block size); every other reason is the
/// model's attention (MLA, sparse, head size, non-causal) or the card (compute capability).
const FLAG_REASONS: &[(&str, &str)] = &[
    ("kv_cache_dtype not supported", "--kv-cache-dtype"),
    ("block_size not supported", "--block-size"),
    ("block size not supported", "--block-size"),
];

/// Whether one backend's reasons are all ones a flag changes, with those flags.
fn flag_fixable(reasons: &[String]) -> Option<Vec<&'static str>> {
    let mut flags = Vec::new();
    for r in reasons {
        let flag = FLAG_REASONS
            .iter()
            .find(|(m, _)| r.contains(m))
            .map(|(_, f)| *f)?;
        if !flags.contains(&flag) {
            flags.push(flag);
        }
    }
    (!flags.is_empty()).then_some(flags)
}

/// The sentence of [`Cause::NoAttentionBackend`]: which backends a flag would admit, or that no
/// flag does because every backend rejects the model's attention or the card.
fn attention_backend_text(config: &str, reasons: &[(String, Vec<String>)]) -> String {
    let each = reasons
        .iter()
        .map(|(b, r)| format!("{b}: {}", r.join(", ")))
        .collect::<Vec<_>>()
        .join("; ");
    let fixable: Vec<String> = reasons
        .iter()
        .filter_map(|(b, r)| flag_fixable(r).map(|f| format!("{b} (change {})", f.join(", "))))
        .collect();
    let verdict = if reasons.is_empty() {
        "the message lists no reasons, so whether a flag helps is unknown".to_string()
    } else if fixable.is_empty() {
        "every backend rejects the model's attention itself or the card (none only for a flag's value), so no engine flag fixes it: it needs a card or an engine version with a kernel for this attention".to_string()
    } else {
        format!(
            "only a flag's value stands between the model and {}",
            fixable.join(", ")
        )
    };
    format!("no attention backend of the engine accepts this model's attention ({config}) on this card; the reasons per backend: {each}; {verdict}")
}

fn cc_text(c: u32) -> String {
    format!("sm_{c} ({}.{})", c / 10, c % 10)
}

pub use crate::output::table::thousands;

/// Minimum PTX ISA for an architecture target (see the module docs).
pub fn min_ptx_isa(target: &str) -> Option<&'static str> {
    let base = target.trim_end_matches(['a', 'f']);
    Some(match base {
        "sm_90" | "compute_90" => "8.0",
        "sm_100" | "compute_100" | "sm_101" | "compute_101" => "8.6",
        "sm_120" | "compute_120" => "8.7",
        "sm_103" | "compute_103" | "sm_121" | "compute_121" => "8.8",
        "sm_110" | "compute_110" => "9.0",
        _ => return None,
    })
}

/// The CUDA release that introduced a PTX ISA version.
pub fn cuda_for_ptx_isa(isa: &str) -> Option<&'static str> {
    Some(match isa {
        "8.0" => "12.0",
        "8.1" => "12.1",
        "8.2" => "12.2",
        "8.3" => "12.3",
        "8.4" => "12.4",
        "8.5" => "12.5",
        "8.6" => "12.7",
        "8.7" => "12.8",
        "8.8" => "12.9",
        "9.0" => "13.0",
        _ => return None,
    })
}

struct Pats {
    v0_maxlen: Regex,
    v1_maxlen: Regex,
    estimated: Regex,
    oom_tried: Regex,
    oom_gpu: Regex,
    oom_old: Regex,
    oom_in_use: Regex,
    oom_pytorch: Regex,
    quant_method: Regex,
    quant_scheme: Regex,
    ptx_version: Regex,
    ptxas_gpu_name: Regex,
    nvcc_arch: Regex,
    torch_arch: Regex,
    nvcc_version: Regex,
    cap_at_least: Regex,
    cap_requires: Regex,
    argparse: Regex,
    llama_args: Regex,
    click_args: Regex,
    port: Regex,
    cur_cap: Regex,
}

fn pats() -> &'static Pats {
    static P: OnceLock<Pats> = OnceLock::new();
    P.get_or_init(|| {
        let r = |s: &str| Regex::new(s).expect("static regex");
        Pats {
            v0_maxlen: r(
                r"max seq len \((?P<len>\d+)\) is larger than the maximum number of tokens that can be stored in KV cache \((?P<kv>\d+)\)",
            ),
            v1_maxlen: r(
                r"To serve at least one request with the models?'s max seq len \((?P<len>\d+)\), \((?P<need>[\d.]+) GiB KV cache is needed, which is larger than the available KV cache memory \((?P<avail>[\d.]+) GiB\)",
            ),
            estimated: r(r"estimated maximum model length is (?P<n>\d+)"),
            oom_tried: r(r"Tried to allocate (?P<t>[\d.]+ ?[KMGT]i?B)"),
            oom_gpu: r(
                r"GPU (?P<g>\d+) has a total capac(?:ity|ty) of (?P<t>[\d.]+ ?[KMGT]i?B) of which (?P<f>[\d.]+ ?[KMGT]i?B) is free",
            ),
            oom_old: r(
                r"\(GPU (?P<g>\d+); (?P<t>[\d.]+ ?[KMGT]i?B) total capacity; (?P<a>[\d.]+ ?[KMGT]i?B) already allocated; (?P<f>[\d.]+ ?[KMGT]i?B) free",
            ),
            oom_in_use: r(r"this process has (?P<u>[\d.]+ ?[KMGT]i?B) memory in use"),
            oom_pytorch: r(r"(?P<a>[\d.]+ ?[KMGT]i?B) is allocated by PyTorch"),
            quant_method: r(
                r"quantization method (?P<m>[\w-]+) is not supported for the current GPU\. Minimum capability: (?P<min>\d+)\. Current capability: (?P<cur>\d+)",
            ),
            quant_scheme: r(
                r"(?s)Quantization scheme is not supported for .*?Min capability: (?P<min>\d+)\..*?Current capability: (?P<cur>\d+)",
            ),
            ptx_version: r(
                r"PTX \.version (?P<isa>\d+\.\d+) does not support \.target (?P<t>sm_\d+[af]?)",
            ),
            ptxas_gpu_name: r(
                r"Value '(?P<t>sm_\d+[af]?)' is not defined for option 'gpu-name'",
            ),
            nvcc_arch: r(r"Unsupported gpu architecture '(?P<t>compute_\d+[af]?)'"),
            torch_arch: r(
                r"(?:CUDA capability )?(?P<t>sm_\d+) is not compatible with the current PyTorch installation",
            ),
            nvcc_version: r(r"cuda_nvcc-(?P<v>\d+\.\d+)"),
            // vLLM `_check_if_gpu_supports_dtype`: `Bfloat16 is only supported on GPUs with
            // compute capability of at least 8.0. Your Tesla V100 GPU has compute capability 7.0.`
            cap_at_least: r(
                r"(?P<what>[\w.\-/ ]+?) (?:is|are) only supported on GPUs with compute capability of at least (?P<min>\d+(?:\.\d)?)\.(?:.*?compute capability (?P<cur>\d+(?:\.\d)?))?",
            ),
            // `X requires compute capability 10.0`, `X requires SM100`, `X is only supported on
            // SM100`, `X is only supported on sm_100 and above`.
            cap_requires: r(
                r"(?P<what>[\w.\-/' ]{3,80}?) (?:requires|is only supported on|only supports?) (?:GPUs with )?(?:a )?(?:compute capability|SM ?|sm_?)\s*(?:>=?\s*)?(?P<min>\d+(?:\.\d)?)",
            ),
            argparse: r(
                r"^(?P<prog>[\w.\-]+): error: (?P<msg>(?:unrecognized arguments|argument |the following arguments are required|invalid choice|ambiguous option).*)$",
            ),
            llama_args: r(
                r"^error: (?P<msg>(?:invalid argument|unknown argument|error while handling argument).*)$",
            ),
            click_args: r(r"^Error: (?P<msg>(?:No such option|Invalid value for|Missing argument|Missing option|Got unexpected extra argument).*)$"),
            cur_cap: r(
                r"(?i)(?:current (?:capability|device)(?: is)?:?\s*(?:sm_?)?|GPU has compute capability )(?P<c>\d+(?:\.\d)?)",
            ),
            port: r(
                r"(?:\[Errno 98\] (?:error while attempting to bind on address .*?[,:] ?(?P<p1>\d+)\)?:? ?)?[Aa]ddress already in use|couldn't bind HTTP server socket, hostname: \S+, port: (?P<p2>\d+))",
            ),
        }
    })
}

fn num(s: &str) -> Option<u64> {
    s.replace(',', "").parse().ok()
}

fn fnum(s: &str) -> Option<f64> {
    s.parse().ok().filter(|x: &f64| x.is_finite())
}

/// `8.0` → 80, `100` → 100, `10` → 100 (a major version alone), `9.0` → 90.
fn capability(s: &str) -> Option<u32> {
    match s.split_once('.') {
        Some((a, b)) => Some(a.parse::<u32>().ok()? * 10 + b.parse::<u32>().ok()?),
        None => {
            let n: u32 = s.parse().ok()?;
            Some(if n < 20 { n * 10 } else { n })
        }
    }
}

/// vLLM's `No valid attention backend found for … with AttentionSelectorConfig(…). Reasons:
/// {BACKEND: [reason, …], …}`; the reasons may follow on the next lines (`context`).
fn no_attention_backend(msg: &str, context: &str) -> Option<Cause> {
    static CFG: OnceLock<Regex> = OnceLock::new();
    static REASON: OnceLock<Regex> = OnceLock::new();
    let cfg = CFG.get_or_init(|| {
        Regex::new(r"No valid attention backend found for \w+ with \w*\((?P<c>[^)]*)\)?")
            .expect("static regex")
    });
    let reason = REASON.get_or_init(|| {
        Regex::new(r"(?P<b>[A-Z][A-Z0-9_]+):\s*\[(?P<r>[^\]]*)\]").expect("static regex")
    });
    let c = cfg.captures(msg)?;
    let config: String = c["c"]
        .split(", ")
        .filter(|kv| {
            [
                "head_size",
                "kv_cache_dtype",
                "use_mla",
                "use_sparse",
                "use_non_causal",
                "has_sink",
            ]
            .iter()
            .any(|k| kv.starts_with(k))
        })
        .collect::<Vec<_>>()
        .join(", ");
    let text = match msg.find("Reasons:") {
        Some(i) => &msg[i..],
        None => context.find("Reasons:").map_or("", |i| &context[i..]),
    };
    let reasons = reason
        .captures_iter(text)
        .map(|r| {
            (
                r["b"].to_string(),
                r["r"]
                    .split(',')
                    .map(|x| x.trim().to_string())
                    .filter(|x| !x.is_empty())
                    .collect(),
            )
        })
        .collect();
    Some(Cause::NoAttentionBackend { config, reasons })
}

/// The cause a message names, if any. `context` is the text of the lines around it (a
/// traceback or glog block), searched for supporting facts such as the ptxas version.
pub fn classify(msg: &str, context: &str) -> Option<Cause> {
    let p = pats();
    if let Some(c) = p.argparse.captures(msg.trim()) {
        return Some(Cause::InvalidArguments {
            program: Some(c["prog"].to_string()),
            message: c["msg"].trim().to_string(),
        });
    }
    if let Some(c) = p
        .llama_args
        .captures(msg.trim())
        .or_else(|| p.click_args.captures(msg.trim()))
    {
        return Some(Cause::InvalidArguments {
            program: None,
            message: c["msg"].trim().to_string(),
        });
    }
    if let Some(c) = p.port.captures(msg) {
        return Some(Cause::PortInUse {
            port: c
                .name("p1")
                .or_else(|| c.name("p2"))
                .and_then(|m| m.as_str().parse().ok()),
        });
    }
    if let Some(c) = p.v0_maxlen.captures(msg) {
        return Some(Cause::KvTooSmallForMaxLen {
            max_model_len: num(&c["len"])?,
            kv_cache_tokens: num(&c["kv"]),
            needed_gib: None,
            available_gib: None,
            estimated_max_model_len: None,
        });
    }
    if let Some(c) = p.v1_maxlen.captures(msg) {
        return Some(Cause::KvTooSmallForMaxLen {
            max_model_len: num(&c["len"])?,
            kv_cache_tokens: None,
            needed_gib: fnum(&c["need"]),
            available_gib: fnum(&c["avail"]),
            estimated_max_model_len: p.estimated.captures(msg).and_then(|e| num(&e["n"])),
        });
    }
    if let Some(c) = classify_memory(p, msg) {
        return Some(c);
    }
    if let Some(c) = no_attention_backend(msg, context) {
        return Some(c);
    }
    if let Some(c) = p.quant_method.captures(msg) {
        return Some(Cause::QuantizationUnsupported {
            method: Some(c["m"].to_string()),
            min_capability: c["min"].parse().ok(),
            current_capability: c["cur"].parse().ok(),
        });
    }
    if let Some(c) = p.quant_scheme.captures(msg) {
        return Some(Cause::QuantizationUnsupported {
            method: None,
            min_capability: c["min"].parse().ok(),
            current_capability: c["cur"].parse().ok(),
        });
    }
    if let Some(c) = classify_toolchain(p, msg, context) {
        return Some(c);
    }
    classify_capability(p, msg)
}

/// Out of memory, or no memory left for the KV cache blocks.
fn classify_memory(p: &Pats, msg: &str) -> Option<Cause> {
    if msg.contains("No available memory for the cache blocks")
        || msg.contains("Not enough memory. Please try to increase --mem-fraction-static")
    {
        return Some(Cause::NoKvMemory {
            message: msg.trim().chars().take(160).collect(),
        });
    }
    if msg.contains("CUDA out of memory")
        || msg.contains("OutOfMemoryError")
        || msg.contains("CUDA error: out of memory")
        || msg.contains("cudaMalloc failed: out of memory")
    {
        let (mut gpu, mut total, mut free, mut allocated) = (None, None, None, None);
        if let Some(c) = p.oom_gpu.captures(msg) {
            gpu = c["g"].parse().ok();
            total = Some(c["t"].to_string());
            free = Some(c["f"].to_string());
        } else if let Some(c) = p.oom_old.captures(msg) {
            gpu = c["g"].parse().ok();
            total = Some(c["t"].to_string());
            free = Some(c["f"].to_string());
            allocated = Some(c["a"].to_string());
        }
        return Some(Cause::OutOfMemory {
            tried_to_allocate: p.oom_tried.captures(msg).map(|c| c["t"].to_string()),
            gpu,
            total,
            free,
            in_use: p.oom_in_use.captures(msg).map(|c| c["u"].to_string()),
            allocated_by_pytorch: allocated
                .or_else(|| p.oom_pytorch.captures(msg).map(|c| c["a"].to_string())),
        });
    }
    None
}

/// A toolchain too old for the card: PTX ISA, ptxas, nvcc or PyTorch without the architecture.
fn classify_toolchain(p: &Pats, msg: &str, context: &str) -> Option<Cause> {
    if let Some(c) = p.ptx_version.captures(msg) {
        let target = c["t"].to_string();
        let isa = c["isa"].to_string();
        let needs = min_ptx_isa(&target);
        let needs_cuda = needs.and_then(cuda_for_ptx_isa);
        let mut detail = format!(
            "the PTX declares ISA {isa}{}, which cannot target {target}",
            cuda_for_ptx_isa(&isa)
                .map(|v| format!(" (CUDA {v})"))
                .unwrap_or_default()
        );
        if let (Some(n), Some(cu)) = (needs, needs_cuda) {
            detail.push_str(&format!(
                "; {target} needs PTX ISA {n} or newer (CUDA {cu}+)"
            ));
        }
        if let Some(v) = p.nvcc_version.captures(context) {
            detail.push_str(&format!(
                "; ptxas itself comes from CUDA {}, so the part that is too old is what emitted the PTX",
                &v["v"]
            ));
        }
        if context.contains("triton") || context.contains("_inductor") {
            detail.push_str(
                " (torch inductor's Triton): upgrade PyTorch/Triton to a build for this card",
            );
        }
        return Some(Cause::ToolchainTooOld {
            target: Some(target),
            ptx_isa: Some(isa),
            needs_ptx_isa: needs.map(str::to_string),
            needs_cuda: needs_cuda.map(str::to_string),
            detail,
        });
    }
    if let Some(c) = p.ptxas_gpu_name.captures(msg) {
        let target = c["t"].to_string();
        let needs = min_ptx_isa(&target);
        return Some(Cause::ToolchainTooOld {
            needs_cuda: needs.and_then(cuda_for_ptx_isa).map(str::to_string),
            needs_ptx_isa: needs.map(str::to_string),
            detail: format!(
                "ptxas does not know {target}{}",
                needs
                    .and_then(cuda_for_ptx_isa)
                    .map(|v| format!(": use ptxas from CUDA {v} or newer"))
                    .unwrap_or_default()
            ),
            target: Some(target),
            ptx_isa: None,
        });
    }
    if let Some(c) = p.nvcc_arch.captures(msg) {
        let target = c["t"].to_string();
        let needs = min_ptx_isa(&target.replace("compute_", "sm_"));
        return Some(Cause::ToolchainTooOld {
            needs_cuda: needs.and_then(cuda_for_ptx_isa).map(str::to_string),
            needs_ptx_isa: needs.map(str::to_string),
            detail: format!(
                "nvcc does not know {target}{}",
                needs
                    .and_then(cuda_for_ptx_isa)
                    .map(|v| format!(": use CUDA {v} or newer"))
                    .unwrap_or_default()
            ),
            target: Some(target),
            ptx_isa: None,
        });
    }
    if let Some(c) = p.torch_arch.captures(msg) {
        let target = c["t"].to_string();
        return Some(Cause::ToolchainTooOld {
            detail: format!(
                "this PyTorch build has no kernels for {target}: install a PyTorch wheel built for it (for Blackwell, a CUDA 12.8+ wheel)"
            ),
            target: Some(target),
            ptx_isa: None,
            needs_ptx_isa: None,
            needs_cuda: None,
        });
    }
    None
}

/// A compute capability below what a kernel or scheme requires, or no kernel image for the card.
fn classify_capability(p: &Pats, msg: &str) -> Option<Cause> {
    if let Some(c) = p.cap_at_least.captures(msg) {
        return Some(Cause::CapabilityTooLow {
            what: c["what"].trim().to_string(),
            min_capability: capability(&c["min"]),
            current_capability: c.name("cur").and_then(|m| capability(m.as_str())),
        });
    }
    if let Some(c) = p.cap_requires.captures(msg) {
        let what = c["what"]
            .trim()
            .trim_start_matches(|ch: char| !ch.is_alphanumeric() && ch != '-')
            .to_string();
        // `Current capability: 90` / `current device is sm_90` when stated.
        let cur = p.cur_cap.captures(msg).and_then(|m| capability(&m["c"]));
        if !what.is_empty() {
            return Some(Cause::CapabilityTooLow {
                what,
                min_capability: capability(&c["min"]),
                current_capability: cur,
            });
        }
    }
    if msg.contains("no kernel image is available for execution on the device") {
        return Some(Cause::ToolchainTooOld {
            target: None,
            ptx_isa: None,
            needs_ptx_isa: None,
            needs_cuda: None,
            detail: "a CUDA binary (PyTorch, the engine's kernels or a plugin) was not built for this card's architecture ('no kernel image is available')".into(),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ooms_with_sizes_new_and_old_wording() {
        let c = classify("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has a total capacity of 23.56 GiB of which 21.75 MiB is free. Including non-PyTorch memory, this process has 23.50 GiB memory in use. Of the allocated memory 22.88 GiB is allocated by PyTorch, with", "").unwrap();
        assert_eq!(
            c,
            Cause::OutOfMemory {
                tried_to_allocate: Some("50.00 MiB".into()),
                gpu: Some(0),
                total: Some("23.56 GiB".into()),
                free: Some("21.75 MiB".into()),
                in_use: Some("23.50 GiB".into()),
                allocated_by_pytorch: Some("22.88 GiB".into()),
            }
        );
        assert!(c.describe().contains("tried to allocate 50.00 MiB"));
        let c = classify("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 1; 23.69 GiB total capacity; 22.50 GiB already allocated; 10.06 MiB free; 22.6 GiB reserved)", "").unwrap();
        assert!(
            matches!(c, Cause::OutOfMemory { gpu: Some(1), ref free, .. } if free.as_deref() == Some("10.06 MiB"))
        );
        assert!(matches!(
            classify("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9000.00 MiB on device 0: cudaMalloc failed: out of memory", ""),
            Some(Cause::OutOfMemory { .. })
        ));
    }

    #[test]
    fn toolchain_for_every_blackwell_target() {
        for (t, isa, cuda) in [
            ("sm_100a", "8.6", "12.7"),
            ("sm_120a", "8.7", "12.8"),
            ("sm_121a", "8.8", "12.9"),
            ("sm_103a", "8.8", "12.9"),
            ("sm_110a", "9.0", "13.0"),
        ] {
            let c = classify(
                &format!("ptxas /tmp/x.ptx, line 6; error   : PTX .version 8.4 does not support .target {t}"),
                "",
            )
            .unwrap();
            match c {
                Cause::ToolchainTooOld {
                    needs_ptx_isa,
                    needs_cuda,
                    ptx_isa,
                    ..
                } => {
                    assert_eq!(needs_ptx_isa.as_deref(), Some(isa), "{t}");
                    assert_eq!(needs_cuda.as_deref(), Some(cuda), "{t}");
                    assert_eq!(ptx_isa.as_deref(), Some("8.4"));
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(
            classify(
                "ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'",
                ""
            ),
            Some(Cause::ToolchainTooOld { .. })
        ));
        assert!(matches!(
            classify("nvcc fatal   : Unsupported gpu architecture 'compute_120'", ""),
            Some(Cause::ToolchainTooOld { ref detail, .. }) if detail.contains("12.8")
        ));
        assert!(matches!(
            classify("NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current PyTorch installation.", ""),
            Some(Cause::ToolchainTooOld { .. })
        ));
        assert_eq!(classify("EngineCore failed to start.", ""), None);
    }
}
