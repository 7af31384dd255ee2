//! TensorRT-LLM's line forms (C++ runtime `[TensorRT-LLM][INFO] …` since 0.8, the PyTorch
//! backend's `[MM/DD/YYYY-hh:mm:ss] [TRT-LLM] [I] …` since 0.17):
//! - version: `[TensorRT-LLM] TensorRT-LLM version: 0.17.0`;
//! - KV (`kvCacheManager.cpp`): `Number of blocks in KV cache primary pool: 4607`, `Number of
//!   blocks in KV cache secondary pool: 0, onboard blocks to primary memory before reuse: true`
//!   (host memory), `Number of tokens per block: 64.`, `[MemUsageChange] Allocated 62.99 GiB
//!   for max tokens in paged KV cache (294848).` (with or without the final dot); the PyTorch
//!   backend may size a small cache first and the real one after, so the last allocation of a
//!   process is the capacity and the earlier one is reported as replaced;
//! - lengths lowered to fit the KV cache: `maxAttentionWindow and maxSequenceLen are too large
//!   for at least one sequence to fit in kvCache. they are reduced to 5185`, `[TRT-LLM] [W]
//!   Adjusted max_seq_len to 8224`, `Attention window size 131072 exceeds upper bound 8224 for
//!   available blocks. Reducing to 8224.`; `max_seq_len=8224, max_num_requests=64, …`;
//! - `Both free_gpu_memory_fraction and max_tokens are set (to 0.9 and 8224, respectively). The
//!   smaller value will be used.`;
//! - ready: `Engine loaded and ready to serve`, uvicorn's `Application startup complete`;
//! - the 0.8-era C++ runtime's KV lines: `Allocate 21705523200 bytes for k/v cache.` (the pool
//!   in bytes, before the size), then `Using 220800 tokens in paged KV cache.`
//!   (`cpp/tensorrt_llm/runtime/gptSession.cpp` `GptSession::createKvCacheManager`, v0.8.0:
//!   `TLLM_LOG_INFO("Using %d tokens in paged KV cache.", maxNumTokens)`), and the in-flight
//!   batching form of the same releases `Using 31616 total tokens in paged KV cache, and 16
//!   blocks per sequence` (the batch manager, shipped as a static library then: the form is
//!   from published Triton logs of 0.8/0.9).

use std::sync::OnceLock;

use regex::Regex;

use super::EngineReader;
use crate::diagnose::line::Line;
use crate::diagnose::log::{fnum, num, to_bytes, EngineLog, Reduced, Repeat};

/// TensorRT-LLM.
pub struct Trtllm;

struct Pats {
    version: Regex,
    primary: Regex,
    secondary: Regex,
    per_block: Regex,
    allocated: Regex,
    reduced_old: Regex,
    adjusted: Regex,
    window: Regex,
    max_seq: Regex,
    allocate_old: Regex,
    tokens_old: Regex,
}

fn pats() -> &'static Pats {
    static P: OnceLock<Pats> = OnceLock::new();
    P.get_or_init(|| {
        let r = |s: &str| Regex::new(s).expect("static regex");
        Pats {
            version: r(r"TensorRT-LLM version: (?P<v>\d+\.\d+[\w.+-]*)"),
            primary: r(r"Number of blocks in KV cache primary pool: (?P<n>\d+)"),
            secondary: r(r"Number of blocks in KV cache secondary pool: (?P<n>\d+)"),
            per_block: r(r"Number of tokens per block: (?P<n>\d+)"),
            allocated: r(
                r"Allocated (?P<v>[\d.]+) (?P<u>[KMGT]i?B) for max tokens in paged KV cache \((?P<n>\d+)\)",
            ),
            reduced_old: r(
                r"maxAttentionWindow and maxSequenceLen are too large for at least one sequence to fit in kvCache\. they are reduced to (?P<n>\d+)",
            ),
            adjusted: r(r"Adjusted (?P<w>max_seq_len|max_num_tokens|max_input_len) to (?P<n>\d+)"),
            window: r(
                r"Attention window size (?P<a>\d+) exceeds upper bound (?P<b>\d+) for available blocks",
            ),
            max_seq: r(r"\bmax_seq_len=(?P<n>\d+), max_num_requests="),
            allocate_old: r(r"\bAllocate (?P<b>\d+) bytes for k/v cache"),
            tokens_old: r(
                r"\bUsing (?P<n>\d+) (?:total )?tokens in paged KV cache(?:, and (?P<s>\d+) blocks per sequence)?",
            ),
        }
    })
}

impl EngineReader for Trtllm {
    fn engine(&self) -> &'static str {
        "tensorrt-llm"
    }

    fn read(&self, log: &mut EngineLog, l: &Line<'_>) {
        let p = pats();
        let msg = l.text();
        let no = l.no;
        if let Some(c) = p.version.captures(msg) {
            log.note_form("tensorrt-llm");
            log.set_version(l, c["v"].to_string());
        }
        if let Some(c) = p.primary.captures(msg) {
            log.note_form("tensorrt-llm");
            if let Some(n) = num(&c["n"]) {
                if let Some(b) = log.fact(
                    l,
                    2,
                    "blocks",
                    &n.to_string(),
                    "the primary-pool line",
                    Repeat::Replace,
                ) {
                    b.gpu_blocks = Some(n);
                }
            }
            log.recognised();
        }
        if let Some(c) = p.secondary.captures(msg) {
            let n = num(&c["n"]);
            super::aux_boot(log, l).cpu_blocks = n;
            log.recognised();
        }
        if let Some(c) = p.per_block.captures(msg) {
            let n = num(&c["n"]);
            let b = super::aux_boot(log, l);
            b.block_size = n;
            b.block_size_source = Some(format!("stated (line {no})"));
            log.recognised();
        }
        if let Some(c) = p.allocated.captures(msg) {
            log.note_form("tensorrt-llm");
            if let Some(n) = num(&c["n"]) {
                let bytes = fnum(&c["v"]).and_then(|v| to_bytes(v, &c["u"]));
                let before = log
                    .boots
                    .last()
                    .and_then(|b| Some((b.kv_cache_tokens?, b.kv_cache_tokens_line?)));
                if let Some(b) = log.fact(
                    l,
                    2,
                    "size",
                    &n.to_string(),
                    "the KV-allocation line",
                    Repeat::Replace,
                ) {
                    if let Some((t, line)) = before.filter(|(t, _)| *t != n) {
                        if b.kv_cache_tokens == Some(t) {
                            b.replaced_allocation = Some((t, line));
                        }
                    }
                    b.kv_cache_tokens = Some(n);
                    b.kv_cache_tokens_line = Some(no);
                    b.kv_pool_bytes = bytes;
                    b.kv_pool_bytes_line = Some(no);
                }
            }
            log.recognised();
        }
        old_kv_lines(p, log, l);
        let reduced = if let Some(c) = p.reduced_old.captures(msg) {
            num(&c["n"]).map(|n| Reduced {
                what: "maxAttentionWindow and maxSequenceLen".into(),
                from: None,
                to: n,
                line: no,
            })
        } else if let Some(c) = p.adjusted.captures(msg) {
            num(&c["n"]).map(|n| Reduced {
                what: c["w"].to_string(),
                from: None,
                to: n,
                line: no,
            })
        } else if let Some(c) = p.window.captures(msg) {
            num(&c["b"]).map(|n| Reduced {
                what: "attention window".into(),
                from: num(&c["a"]),
                to: n,
                line: no,
            })
        } else {
            None
        };
        if let Some(r) = reduced {
            log.note_form("tensorrt-llm");
            super::aux_boot(log, l).reduced.push(r);
            log.recognised();
        }
        if let Some(c) = p.max_seq.captures(msg) {
            if let (Some(n), Some(b)) = (num(&c["n"]), log.current_boot()) {
                b.context_len = Some(n);
            }
            log.recognised();
        }
    }
}

/// The 0.8-era KV lines (see the module docs): the pool's bytes, then its tokens.
fn old_kv_lines(p: &Pats, log: &mut EngineLog, l: &Line<'_>) {
    let msg = l.text();
    let no = l.no;
    if let Some(c) = p.allocate_old.captures(msg) {
        log.note_form("tensorrt-llm");
        if let Some(bytes) = num(&c["b"]) {
            if let Some(b) = log.fact(
                l,
                1,
                "kv-bytes",
                &bytes.to_string(),
                "the k/v-cache allocation line",
                Repeat::Replace,
            ) {
                b.kv_pool_bytes = Some(bytes);
                b.kv_pool_bytes_line = Some(no);
            }
        }
        log.recognised();
    }
    if let Some(c) = p.tokens_old.captures(msg) {
        log.note_form("tensorrt-llm");
        if let Some(n) = num(&c["n"]) {
            if let Some(b) = log.fact(
                l,
                2,
                "size",
                &n.to_string(),
                "the paged-KV tokens line",
                Repeat::Replace,
            ) {
                b.kv_cache_tokens = Some(n);
                b.kv_cache_tokens_line = Some(no);
                b.kv_cache_tokens_rule = Some(match c.name("s") {
                    Some(s) => format!(
                        "TensorRT-LLM's paged-KV tokens line (0.8 in-flight batching form; {} blocks per sequence)",
                        s.as_str()
                    ),
                    None => "TensorRT-LLM's paged-KV tokens line (0.8 form)".into(),
                });
            }
        }
        log.recognised();
    }
}
