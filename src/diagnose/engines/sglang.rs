//! SGLang's line forms (0.4 to 0.5 and later; the header is `[YYYY-MM-DD hh:mm:ss TP0] ` or
//! `[… DP0 TP0 EP0] `, no level):
//! - `server_args=ServerArgs(…, mem_fraction_static=0.88, max_total_tokens=None, page_size=1,
//!   speculative_algorithm='EAGLE', speculative_num_steps=3, speculative_eagle_topk=1,
//!   speculative_num_draft_tokens=4, …)`;
//! - KV: `KV Cache is allocated. #tokens: 46611, K size: 1.42 GB, V size: 1.42 GB` (MHA),
//!   `KV Cache is allocated. #tokens: 524288, KV size: 17.16 GB` (MLA, newer), the older
//!   `KV Cache is allocated. K size: 2.82 GB, V size: 2.82 GB.` (no token count), and
//!   `max_total_num_tokens=46611, chunked_prefill_size=…, max_running_requests=…,
//!   context_len=32768, available_gpu_mem=3.38 GB`;
//! - memory: `Load weight begin. avail mem=78.58 GB`, `Load weight end. type=…, avail
//!   mem=8.37 GB, mem usage=…`, `Memory profiling: available_gpu_memory=57.01 GB,
//!   total_gpu_memory=93.58 GB, mem_fraction_static=0.60, rest_memory=19.58 GB` (some
//!   versions), `Memory pool end. avail mem=77.12 GB`, and `max_total_tokens=N is larger than
//!   the profiled value M. Use the profiled value instead.` (`model_runner.py`: a smaller
//!   `--max-total-tokens` is applied silently);
//! - speculative decoding: `Decode batch. #running-req: 1, #token: 120, token usage: 0.00,
//!   accept len: 2.40, accept rate: 0.47, …` (read by [`crate::diagnose::spec`]);
//! - attention: `Attention backend not explicitly specified. Use fa3 backend by default.`
//!   (0.5.1–0.5.6, `not specified` from 0.5.7) and `attention_backend='fa3'` in `server_args`
//!   (resolved there from 0.5.5); KV dtype: `kv_cache_dtype='auto'` in `server_args` and the
//!   resolved `Using KV cache dtype: torch.float8_e4m3fn` (0.5.3–0.5.10);
//! - ready: `The server is fired up and ready to roll!`.

use std::sync::OnceLock;

use regex::Regex;

use super::EngineReader;
use crate::diagnose::line::Line;
use crate::diagnose::log::{fnum, num, EngineLog, Repeat, SglangMemory};

/// SGLang's `GB` is 2^30 bytes (`memory_pool.py` `GB = 1024 * 1024 * 1024`,
/// `get_available_gpu_memory` divides by `1 << 30`).
const GIB: f64 = 1_073_741_824.0;

/// SGLang.
pub struct Sglang;

struct Pats {
    kv: Regex,
    kv_old: Regex,
    max_total: Regex,
    ctx: Regex,
    spec_alg: Regex,
    spec_steps: Regex,
    spec_topk: Regex,
    spec_draft: Regex,
    arg_max_total: Regex,
    arg_mfs: Regex,
    arg_page: Regex,
    arg_quant: Regex,
    arg_kvdtype: Regex,
    load_begin: Regex,
    load_end: Regex,
    profiling: Regex,
    pool_end: Regex,
    larger: Regex,
    kv_resolved: Regex,
    attn_default: Regex,
    arg_attn: Regex,
}

fn pats() -> &'static Pats {
    static P: OnceLock<Pats> = OnceLock::new();
    P.get_or_init(|| {
        let r = |s: &str| Regex::new(s).expect("static regex");
        Pats {
            kv: r(
                r"KV Cache is allocated\.(?: dtype: [\w.]+,)? #tokens: (?P<n>\d+)(?:, K size: (?P<k>[\d.]+) GB, V size: (?P<v>[\d.]+) GB|, KV size: (?P<kv>[\d.]+) GB)?",
            ),
            kv_old: r(r"KV Cache is allocated\. K size: (?P<k>[\d.]+) GB, V size: (?P<v>[\d.]+) GB"),
            max_total: r(r"\bmax_total_num_tokens=(?P<n>\d+)"),
            ctx: r(r"\bcontext_len=(?P<n>\d+)"),
            spec_alg: r(r"\bspeculative_algorithm=(?:'(?P<m>[\w-]+)'|None)"),
            spec_steps: r(r"\bspeculative_num_steps=(?P<k>\d+)"),
            spec_topk: r(r"\bspeculative_eagle_topk=(?P<k>\d+)"),
            spec_draft: r(r"\bspeculative_num_draft_tokens=(?P<k>\d+)"),
            arg_max_total: r(r"\bmax_total_tokens=(?P<n>\d+|None)"),
            arg_mfs: r(r"\bmem_fraction_static=(?P<f>[\d.]+)"),
            arg_page: r(r"\bpage_size=(?P<n>\d+)"),
            arg_quant: r(r"\bquantization='(?P<q>[\w-]+)'"),
            arg_kvdtype: r(r"\bkv_cache_dtype='(?P<q>[\w-]+)'"),
            load_begin: r(r"Load weight begin\. avail mem=(?P<g>[\d.]+) GB"),
            load_end: r(r"Load weight end\..*?avail mem=(?P<g>[\d.]+) GB"),
            profiling: r(r"Memory profiling: .*?rest_memory=(?P<g>-?[\d.]+) GB"),
            pool_end: r(r"Memory pool end\. avail mem=(?P<g>[\d.]+) GB"),
            larger: r(
                r"max_total_tokens=(?P<a>\d+) is larger than the profiled value (?P<p>-?\d+)",
            ),
            kv_resolved: r(r"Using KV cache dtype: (?:torch\.)?(?P<q>\w+)"),
            attn_default: r(
                r"Attention backend not (?:explicitly )?specified\. Use (?P<k>\w+) backend by default",
            ),
            arg_attn: r(r"\battention_backend='(?P<k>\w+)'"),
        }
    })
}

/// The current boot's SGLang memory record.
fn mem<'a>(log: &'a mut EngineLog, l: &Line) -> &'a mut SglangMemory {
    super::aux_boot(log, l)
        .sglang
        .get_or_insert_with(SglangMemory::default)
}

impl EngineReader for Sglang {
    fn engine(&self) -> &'static str {
        "sglang"
    }

    fn read(&self, log: &mut EngineLog, l: &Line<'_>) {
        let p = pats();
        let msg = l.text();
        let no = l.no;
        if msg.contains("server_args=ServerArgs(") {
            log.note_form("sglang");
            let b = log.boot_for(l, 0);
            let s = b.sglang.get_or_insert_with(SglangMemory::default);
            if let Some(c) = p.arg_max_total.captures(msg) {
                s.max_total_tokens = num(&c["n"]).map(|n| (n, no));
            }
            s.mem_fraction_static = p.arg_mfs.captures(msg).and_then(|c| fnum(&c["f"]));
            s.page_size = p.arg_page.captures(msg).and_then(|c| num(&c["n"]));
            if let Some(c) = p.arg_quant.captures(msg) {
                log.quantization = Some(c["q"].to_string());
            }
            if let Some(c) = p.arg_kvdtype.captures(msg) {
                log.set_kv_dtype(&c["q"], no, true);
            }
            // 0.5.5 and later print the resolved backend here; 0.5.1–0.5.4 resolve it later
            // (`attention_backend=None` then, matched by nothing).
            if let Some(c) = p.arg_attn.captures(msg) {
                log.push_choice("attention".into(), &c["k"], no);
            }
            if let Some(c) = p.spec_alg.captures(msg) {
                match c.name("m") {
                    Some(m) => {
                        let sc = &mut log.spec_config;
                        sc.method = Some(m.as_str().to_string());
                        sc.method_source = Some(format!("server_args at line {no}"));
                        sc.line.get_or_insert(no);
                        let steps = p.spec_steps.captures(msg).and_then(|k| k["k"].parse().ok());
                        sc.draft_tokens =
                            p.spec_draft.captures(msg).and_then(|k| k["k"].parse().ok());
                        sc.topk = p.spec_topk.captures(msg).and_then(|k| k["k"].parse().ok());
                        // Draft tokens per verify step: the chain length (num_steps), else the
                        // verified tokens less the bonus position (NGRAM has no steps).
                        sc.k = steps.or_else(|| sc.draft_tokens.map(|d: u32| d.saturating_sub(1)));
                    }
                    None => {
                        log.spec_config.off_line.get_or_insert(no);
                    }
                }
            }
            log.recognised();
        }
        if let Some(c) = p.attn_default.captures(msg) {
            log.note_form("sglang");
            log.push_choice("attention".into(), &c["k"], no);
        }
        if let Some(c) = p.kv_resolved.captures(msg) {
            // The dtype `--kv-cache-dtype auto` resolved to (0.5.3–0.5.10).
            log.set_kv_dtype(&c["q"], no, true);
            log.kv_cache_dtype_resolved = true;
            log.recognised();
        }
        if msg.contains("Load weight begin") {
            // A drafter's weights may load after the target's KV pool: never a new boot.
            super::aux_boot(log, l);
            if let Some(c) = p.load_begin.captures(msg) {
                mem(log, l).avail_before_weights_gb = fnum(&c["g"]);
            }
            log.recognised();
        }
        if let Some(c) = p.load_end.captures(msg) {
            mem(log, l).avail_after_weights_gb = fnum(&c["g"]);
            log.recognised();
        }
        if let Some(c) = p.profiling.captures(msg) {
            mem(log, l).rest_memory_gb = fnum(&c["g"]).map(|g| (g, no));
            log.recognised();
        }
        if let Some(c) = p.pool_end.captures(msg) {
            let m = mem(log, l);
            if m.avail_after_pool_gb.is_none() {
                m.avail_after_pool_gb = fnum(&c["g"]).map(|g| (g, no));
            }
            log.recognised();
        }
        if let Some(c) = p.larger.captures(msg) {
            if let (Some(a), Ok(pr)) = (num(&c["a"]), c["p"].parse::<i64>()) {
                mem(log, l).larger_than_profiled = Some((a, pr, no));
            }
            log.note_form("sglang");
            log.recognised();
        }
        if let Some(c) = p.kv.captures(msg) {
            log.note_form("sglang");
            if let Some(n) = num(&c["n"]) {
                let pool = match (c.name("k"), c.name("v"), c.name("kv")) {
                    (Some(k), Some(v), _) => {
                        Some(fnum(k.as_str()).unwrap_or(0.0) + fnum(v.as_str()).unwrap_or(0.0))
                    }
                    (_, _, Some(kv)) => fnum(kv.as_str()),
                    _ => None,
                };
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
                    b.kv_pool_bytes = pool.map(|g| (g * GIB).round() as u64);
                    b.kv_pool_bytes_line = Some(no);
                }
            }
            log.recognised();
        } else if let Some(c) = p.kv_old.captures(msg) {
            log.note_form("sglang");
            let pool = fnum(&c["k"]).unwrap_or(0.0) + fnum(&c["v"]).unwrap_or(0.0);
            let b = log.boot_for(l, 2);
            b.kv_pool_bytes = Some((pool * GIB).round() as u64);
            b.kv_pool_bytes_line = Some(l.no);
            log.recognised();
        }
        if let Some(c) = p.max_total.captures(msg) {
            log.note_form("sglang");
            let ctx = p.ctx.captures(msg).and_then(|c| num(&c["n"]));
            if let Some(n) = num(&c["n"]) {
                // The same figure as `#tokens` a few lines earlier: fill, never start a boot.
                let same_boot = log
                    .boots
                    .last()
                    .is_some_and(|b| b.stage <= 2 || b.kv_cache_tokens == Some(n));
                if same_boot {
                    let b = log.current_boot().expect("checked");
                    if b.kv_cache_tokens.is_none() {
                        b.kv_cache_tokens = Some(n);
                        b.kv_cache_tokens_line = Some(no);
                    }
                    b.context_len = b.context_len.or(ctx);
                    b.stage = b.stage.max(2);
                    b.last_line = no;
                } else if let Some(b) = log.fact(
                    l,
                    2,
                    "size",
                    &n.to_string(),
                    "the KV-size line",
                    Repeat::NewBoot,
                ) {
                    b.kv_cache_tokens = Some(n);
                    b.kv_cache_tokens_line = Some(no);
                    b.context_len = ctx;
                }
                log.recognised();
            }
        }
    }
}
