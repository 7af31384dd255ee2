//! vLLM's line forms, V0 (0.6) to V1 (0.32 and later), GPU and CPU builds:
//! - version: `vLLM API server version 0.10.0`, `Initializing a V1 LLM engine (v0.32.0)`,
//!   `Initializing an LLM engine (v0.5.4)`, the banner's `version 0.32.0`;
//! - KV memory: V1 `Available KV cache memory: 69.66 GiB`, V0 `kv_cache_size=3.81GiB`, the CPU
//!   build's `Explicitly set (1.0/17.46) GiB for KV cache on node 0`;
//! - KV size: V1 `GPU KV cache size: 652,144 tokens` (the CPU build says `CPU KV cache size`,
//!   with the concurrency on the same line since 0.32), V0 `# GPU blocks: 1952, # CPU blocks:
//!   2048`, `num_gpu_blocks is: 14696`; `Maximum concurrency for 4,096 tokens per request:
//!   159.21x`;
//! - `Overriding num_gpu_blocks=13185 with num_gpu_blocks_override=43` (`--num-gpu-blocks-override`;
//!   V1 `vllm/v1/core/kv_cache_utils.py` `may_override_num_blocks`, V0 `llm_engine.py`): the
//!   user's flag replaced the block count the profiler found (0 on the profiling pass);
//! - the hybrid allocator's `Add 17 padding layers, may waste at most 89.47% KV cache memory`
//!   (`kv_cache_utils.py`; vLLM PR 29303 quotes it for gpt-oss + EAGLE3);
//! - the Marlin FP4 fallback warning `Your GPU does not have native support for FP4
//!   computation …` (`nvfp4_utils.py`, `marlin_utils_fp4.py`);
//! - configuration: `non-default args: {…}`, `… with config: …, quantization=…,
//!   kv_cache_dtype=…, speculative_config=…`, drafter loading (`Loading drafter model`,
//!   `Detected MTP model`).
//!
//! Errors (argparse's `vllm: error: unrecognized arguments`, tracebacks) are read by
//! [`crate::diagnose::log`] for every engine.

use std::sync::OnceLock;

use regex::Regex;

use super::EngineReader;
use crate::diagnose::line::Line;
use crate::diagnose::log::{fnum, num, to_bytes, EngineLog, KvPadding, MarlinFallback, Repeat};

/// vLLM.
pub struct Vllm;

struct Pats {
    version: Regex,
    banner: Regex,
    kv_tokens: Regex,
    max_conc: Regex,
    avail_kv: Regex,
    v0_profile_kv: Regex,
    cpu_kv: Regex,
    gpu_blocks: Regex,
    late_blocks: Regex,
    padding: Regex,
    blocks_override: Regex,
    call_site: Regex,
    quant_dict: Regex,
    quant_cfg: Regex,
    kvdtype_dict: Regex,
    kvdtype_cfg: Regex,
    kvdtype_using: Regex,
    spec_method: Regex,
    spec_k: Regex,
}

fn pats() -> &'static Pats {
    static P: OnceLock<Pats> = OnceLock::new();
    P.get_or_init(|| {
        let r = |s: &str| Regex::new(s).expect("static regex");
        Pats {
            version: r(
                r"(?:vLLM API server version|LLM engine \(v|vLLM version)\s*(?P<v>v?\d+\.\d+[\w.+-]*)",
            ),
            banner: r(r"█.*\bversion (?P<v>\d+\.\d+[\w.+-]*)"),
            // vLLM and `rigbench serve` on a GPU say "GPU"; CPU builds say "CPU".
            kv_tokens: r(r"(?:GPU|CPU) KV cache size:\s*(?P<n>\d+(?:,\d{3})*)\s*tokens"),
            max_conc: r(
                r"(?i)Maximum concurrency for\s*(?P<len>\d+(?:,\d{3})*)\s*tokens per request:\s*(?P<x>\d+(?:,\d{3})*(?:\.\d+)?)\s*x",
            ),
            avail_kv: r(r"Available KV cache memory:\s*(?P<v>[\d.]+)\s*(?P<u>[KMGT]i?B)"),
            v0_profile_kv: r(r"\bkv_cache_size=(?P<v>[\d.]+)\s*(?P<u>[KMGT]i?B)"),
            cpu_kv: r(r"Explicitly set \((?P<v>[\d.]+)/[\d.]+\) (?P<u>[KMGT]i?B) for KV cache"),
            gpu_blocks: r(
                r"#?\s*GPU blocks:\s*(?P<g>\d+(?:,\d{3})*)(?:,\s*#?\s*CPU blocks:\s*(?P<c>\d+(?:,\d{3})*))?",
            ),
            late_blocks: r(r"num_gpu_blocks is:\s*(?P<g>\d+)"),
            padding: r(
                r"Add (?P<n>\d+) padding layers?, may waste at most (?P<p>[\d.]+)% KV cache memory",
            ),
            blocks_override: r(
                r"Overriding num_gpu_blocks=(?P<p>-?\d+) with num_gpu_blocks_override=(?P<o>\d+)",
            ),
            call_site: r(r"\[?(?P<site>[\w.-]+\.py:\d+)\]"),
            quant_dict: r(r"'quantization':\s*'(?P<q>[\w-]+)'"),
            quant_cfg: r(r"\bquantization=(?P<q>[\w-]+)"),
            kvdtype_dict: r(r"'kv_cache_dtype':\s*'(?P<q>[\w-]+)'"),
            kvdtype_cfg: r(r"\bkv_cache_dtype=(?P<q>[\w-]+)"),
            kvdtype_using: r(r"Using (?P<q>fp8\w*) data type to store kv cache"),
            spec_method: r(r#"['"]?method['"]?\s*[:=]\s*['"](?P<m>[\w-]+)['"]"#),
            spec_k: r(r#"['"]?num_spec(?:ulative)?_tokens['"]?\s*[:=]\s*(?P<k>\d+)"#),
        }
    })
}

impl EngineReader for Vllm {
    fn engine(&self) -> &'static str {
        "vllm"
    }

    fn read(&self, log: &mut EngineLog, l: &Line<'_>) {
        let p = pats();
        let msg = l.text();
        let no = l.no;

        if let Some(c) = p.version.captures(msg).or_else(|| p.banner.captures(msg)) {
            log.note_form("vllm");
            log.set_version(l, c["v"].trim_start_matches('v').to_string());
        }
        for m in [
            "Loading model weights took",
            "Model loading took",
            "Loading weights took",
        ] {
            if msg.contains(m) {
                let b = log.boot_for(l, 0);
                if b.stage == 0 {
                    b.last_stage = Some((format!("'{m}'"), no));
                }
                log.recognised();
            }
        }
        load_progress(log, l, msg);
        read_kv(log, l, p, msg, no);
        read_marlin_fallback(log, l, p, msg, no);
        read_engine_config(log, p, msg, no);
    }
}

/// vLLM's KV lines: memory (stage 1), size and blocks (stage 2), concurrency (stage 3), padding.
fn read_kv(log: &mut EngineLog, l: &Line<'_>, p: &Pats, msg: &str, no: usize) {
    // KV memory (stage 1).
    if let Some(c) = p
        .avail_kv
        .captures(msg)
        .or_else(|| p.v0_profile_kv.captures(msg))
        .or_else(|| p.cpu_kv.captures(msg))
    {
        if let Some(bytes) = fnum(&c["v"]).and_then(|v| to_bytes(v, &c["u"])) {
            if let Some(b) = log.fact(
                l,
                1,
                "memory",
                &bytes.to_string(),
                "the KV-memory line",
                Repeat::NewBoot,
            ) {
                b.available_kv_memory_bytes = Some(bytes);
                b.available_kv_memory_line = Some(no);
            }
            log.recognised();
        }
    }

    // KV size (stage 2) and concurrency (stage 3).
    if let Some(c) = p.kv_tokens.captures(msg) {
        if let Some(n) = num(&c["n"]) {
            if let Some(b) = log.fact(
                l,
                2,
                "size",
                &n.to_string(),
                "the KV-size line",
                Repeat::NewBoot,
            ) {
                b.kv_cache_tokens = Some(n);
                b.kv_cache_tokens_line = Some(no);
            }
            log.recognised();
        }
    }
    if let Some(c) = p.gpu_blocks.captures(msg) {
        if let Some(g) = num(&c["g"]) {
            let cpu = c.name("c").and_then(|m| num(m.as_str()));
            if let Some(b) = log.fact(
                l,
                2,
                "blocks",
                &format!("{g}/{cpu:?}"),
                "the GPU-blocks line",
                Repeat::NewBoot,
            ) {
                b.gpu_blocks = Some(g);
                b.cpu_blocks = cpu;
                b.kv_cache_tokens_line.get_or_insert(no);
            }
            log.recognised();
        }
    }
    if let Some(c) = p.max_conc.captures(msg) {
        if let (Some(len), Some(x)) = (num(&c["len"]), fnum(&c["x"])) {
            if let Some(b) = log.fact(
                l,
                3,
                "concurrency",
                &format!("{len}/{x}"),
                "the max-concurrency line",
                Repeat::NewBoot,
            ) {
                b.max_concurrency = Some((len, x));
                b.max_concurrency_line = Some(no);
            }
            log.recognised();
        }
    }
    if let Some(c) = p.late_blocks.captures(msg) {
        // `cache_config_info ... num_gpu_blocks is: N` comes after the concurrency line.
        if let (Some(g), Some(b)) = (num(&c["g"]), log.current_boot()) {
            if b.gpu_blocks.is_none() {
                b.gpu_blocks = Some(g);
                b.last_line = no;
                log.recognised();
            }
        }
    }
    if let Some(c) = p.blocks_override.captures(msg) {
        if let (Ok(profiled), Some(o)) = (c["p"].parse::<i64>(), num(&c["o"])) {
            super::aux_boot(log, l)
                .block_overrides
                .push(crate::diagnose::log::BlockOverride {
                    profiled,
                    blocks: o,
                    line: no,
                });
            log.note_form("vllm");
            log.recognised();
        }
    }
    if let Some(c) = p.padding.captures(msg) {
        if let (Some(n), Some(pct)) = (num(&c["n"]), fnum(&c["p"])) {
            let b = super::aux_boot(log, l);
            let p = KvPadding {
                layers: n,
                waste: pct / 100.0,
                line: no,
            };
            b.padding.get_or_insert(p.clone());
            b.paddings.push(p);
            log.note_form("vllm");
            log.recognised();
        }
    }
}

/// How far the weight load got: `Starting to load model X...` and `Loading safetensors
/// checkpoint shards:  40% Completed | 2/5 [...]` (vLLM's `weight_utils.py` progress bar) move
/// the current boot's last stage, so a log that stops mid-load says where.
fn load_progress(log: &mut EngineLog, l: &Line<'_>, msg: &str) {
    static SHARDS: OnceLock<Regex> = OnceLock::new();
    let shards = SHARDS.get_or_init(|| {
        Regex::new(
            r"Loading safetensors checkpoint shards:\s*\d+% Completed \| (?P<a>\d+)/(?P<b>\d+)",
        )
        .expect("static regex")
    });
    let stage = if let Some(c) = shards.captures(msg) {
        format!("loading the weights, shard {} of {}", &c["a"], &c["b"])
    } else if msg.contains("Starting to load model") {
        "loading the model (its first load line)".to_string()
    } else {
        return;
    };
    let Some(b) = log.current_boot() else {
        return;
    };
    if b.stage == 0 {
        b.last_stage = Some((stage, l.no));
        b.last_line = b.last_line.max(l.no);
    }
    log.recognised();
}

/// vLLM's Marlin FP4 fallback warning: one finding over ranks and call sites.
fn read_marlin_fallback(log: &mut EngineLog, l: &Line<'_>, p: &Pats, msg: &str, no: usize) {
    if msg.contains("does not have native support for FP4 computation") {
        let site = l
            .site
            .clone()
            .or_else(|| p.call_site.captures(l.msg).map(|c| c["site"].to_string()));
        let f = log
            .marlin_fp4_fallback
            .get_or_insert_with(|| MarlinFallback {
                line: no,
                ..Default::default()
            });
        f.occurrences += 1;
        if let Some(rank) = l.rank {
            f.ranks.insert(rank);
        }
        if let Some(site) = site {
            f.call_sites.insert(site);
        }
        log.recognised();
    }
}

/// vLLM's engine configuration: non-default args (once), resolved quantization, KV dtype, speculative decoding.
fn read_engine_config(log: &mut EngineLog, p: &Pats, msg: &str, no: usize) {
    if let Some(pos) = msg.find("non-default args:") {
        let args = msg[pos + "non-default args:".len()..].trim().to_string();
        if log.non_default_args.is_none() {
            log.non_default_args = Some(args);
        }
        log.recognised();
    }
    let is_config = msg.contains("non-default args:")
        || msg.contains("with config:")
        || msg.contains("speculative_config");
    if is_config {
        if let Some(c) = p
            .quant_dict
            .captures(msg)
            .or_else(|| p.quant_cfg.captures(msg))
        {
            if c["q"] != *"None" {
                log.quantization = Some(c["q"].to_string());
            }
        }
        if let Some(c) = p
            .kvdtype_dict
            .captures(msg)
            .or_else(|| p.kvdtype_cfg.captures(msg))
        {
            log.set_kv_dtype(&c["q"], no, true);
        }
        if let Some(pos) = msg.find("speculative_config") {
            let tail = &msg[pos..];
            if tail.starts_with("speculative_config=None")
                || tail.starts_with("speculative_config': None")
            {
                log.spec_config.off_line.get_or_insert(no);
            }
            if let Some(c) = p.spec_method.captures(tail) {
                if c["m"] != *"None" {
                    log.spec_config.method = Some(c["m"].to_string());
                    log.spec_config.method_source =
                        Some(format!("speculative_config at line {no}"));
                    log.spec_config.line.get_or_insert(no);
                }
            }
            if let Some(c) = p.spec_k.captures(tail) {
                log.spec_config.k = c["k"].parse().ok();
                log.spec_config.line.get_or_insert(no);
            }
        }
    }
    if let Some(c) = p.kvdtype_using.captures(msg) {
        log.set_kv_dtype(&c["q"], no, false);
    }
    if msg.contains("Loading drafter model")
        || msg.contains("Loading draft model")
        || msg.contains("Detected MTP model")
    {
        log.spec_config.drafter_line.get_or_insert(no);
        log.recognised();
    }
}
