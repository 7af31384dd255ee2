//! llama.cpp's `llama-server` line forms (builds from 2024 to 0c1e57098 and later; with
//! `--log-prefix` every line starts `0.00.035.099 I `, optionally after `[pid] `):
//! - build: `build: 5462 (a1b2c3d4) with cc …` (older), `common_params_print_info: build 1
//!   (0c1e57098) with GNU 12.2.0 …` (newer, `-lv 4`);
//! - KV: `llama_kv_cache: size = 4.00 MiB (2048 cells, 2 layers, 4/4 seqs), K (f16): …` (cells
//!   per stream, `n_seq_max/n_stream` since the split KV cache; `src/llama-kv-cache.cpp`),
//!   `llama_kv_cache_unified: size = … (4096 cells, 32 layers, 1 seqs)` (older, one unified
//!   stream), the iSWA pair `llama_kv_cache_iswa: creating non-SWA KV cache, size = N cells` /
//!   `creating     SWA KV cache, size = M cells` each followed by its own size line, and per
//!   backend `llama_kv_cache:      CUDA0 KV buffer size =   512.00 MiB` (`CPU` when the KV
//!   lives in host memory); `llama_context: n_ctx = 8192`, `n_seq_max`, `kv_unified`;
//! - slots: `load_model: initializing, n_slots = 4, n_ctx_slot = 2048, kv_unified = 'false'`
//!   (printed at the default verbosity), older `initializing slots, n_slots = 4` with `new slot
//!   n_ctx_slot = 2048`; the KV capacity is n_slots × n_ctx_slot unless `kv_unified` (then the
//!   one shared `n_ctx_slot`);
//! - offload: `load_tensors: offloaded 20/33 layers to GPU`, `load_tensors: CUDA0 model buffer
//!   size = …`;
//! - speculative decoding: `spec common_specu: adding speculative implementation 'ngram-simple'`,
//!   `no implementations specified for speculative decoding`, `load_model: loading draft model`,
//!   per request `draft acceptance = …` and cumulative `statistics NAME: …` (read by
//!   [`crate::diagnose::spec`]), `--spec-type X` when the command line is in the log;
//! - per request `slot print_timing: id 3 | task 0 | prompt eval time = 860.05 ms / 20 tokens
//!   (…)` and `eval time = 118.34 ms / 16 tokens (…)` (older builds print the figures on lines
//!   of their own below `slot print_timing: id 0 | task 0 |`);
//! - ready: `llama_server: listening on http://…` (newer), `main: server is listening on …`.
//!
//! Startup errors (`error loading model`, `failed to load model`, `exiting due to model loading
//! error`, `cudaMalloc failed: out of memory`, `couldn't bind HTTP server socket`, argument
//! errors) are read by [`crate::diagnose::log`].

use std::sync::OnceLock;

use regex::Regex;

use super::EngineReader;
use crate::diagnose::line::Line;
use crate::diagnose::log::{
    fnum, num, Boot, EngineLog, KvBuffer, KvCells, Repeat, RequestTiming, Slots,
};
use crate::output::table::thousands;

/// llama.cpp's `llama-server`.
pub struct Llamacpp;

struct Pats {
    build: Regex,
    build_new: Regex,
    kv: Regex,
    kv_self: Regex,
    iswa: Regex,
    buffer: Regex,
    slots: Regex,
    slots_old: Regex,
    slot_ctx: Regex,
    n_ctx: Regex,
    offloaded: Regex,
    model_buffer: Regex,
    spec_impl: Regex,
    spec_type: Regex,
    stats_name: Regex,
    prompt: Regex,
    eval: Regex,
    task: Regex,
}

fn pats() -> &'static Pats {
    static P: OnceLock<Pats> = OnceLock::new();
    P.get_or_init(|| {
        let r = |s: &str| Regex::new(s).expect("static regex");
        Pats {
            build: r(r"^build: (?P<v>\d+ \([0-9a-f]+\))"),
            build_new: r(r"(?:common_params_print_info: build|main: build =) (?P<n>\d+) \((?P<h>[0-9a-f]+)\)"),
            kv: r(
                r"llama_kv_cache(?:_unified)?(?:_iswa)?:\s+size\s*=\s*(?P<mib>[\d.]+) MiB \(\s*(?P<n>\d+) cells,\s*(?P<l>\d+) layers,\s*(?P<s>\d+)(?:/(?P<t>\d+))? seqs\)",
            ),
            kv_self: r(r"KV self size\s*=\s*(?P<mib>[\d.]+) MiB"),
            iswa: r(r"llama_kv_cache_iswa: creating\s+(?P<w>non-SWA|SWA) KV cache"),
            buffer: r(
                r"llama_kv_cache\w*:\s+(?P<dev>\S+) KV buffer size\s*=\s*(?P<mib>[\d.]+) MiB",
            ),
            slots: r(
                r"initializing, n_slots = (?P<s>\d+), n_ctx_slot = (?P<c>\d+)(?:, kv_unified = '(?P<u>true|false)')?",
            ),
            slots_old: r(r"initializing slots, n_slots = (?P<s>\d+)"),
            slot_ctx: r(r"new slot,? n_ctx(?:_slot)? = (?P<c>\d+)"),
            n_ctx: r(r"(?:llama_context|llama_new_context_with_model):\s+n_ctx\s*=\s*(?P<n>\d+)"),
            offloaded: r(r"offloaded (?P<a>\d+)/(?P<b>\d+) layers to GPU"),
            model_buffer: r(r"load_tensors:\s+(?P<dev>\S+) model buffer size"),
            spec_impl: r(r"adding speculative implementation '(?P<m>[\w\-]+)'"),
            spec_type: r(r"--spec-type[ =](?P<t>[\w\-]+)"),
            stats_name: r(r"statistics\s+(?P<n>[\w.\-]+):.*#gen drafts"),
            prompt: r(r"(?:^|\|\s*)prompt eval time =\s*(?P<ms>[\d.]+) ms /\s*(?P<n>\d+) tokens"),
            eval: r(r"(?:^|\|\s*)eval time =\s*(?P<ms>[\d.]+) ms /\s*(?P<n>\d+) (?:tokens|runs)"),
            task: r(r"\|\s*task (?P<t>\d+)\s*\|"),
        }
    })
}

/// The method a llama.cpp speculative implementation name stands for.
fn method_of(name: &str) -> String {
    let n = name.replace('_', "-");
    match n.as_str() {
        "draft" | "draft-simple" => "draft model".into(),
        "draft-mtp" => "mtp".into(),
        _ => n,
    }
}

impl EngineReader for Llamacpp {
    fn engine(&self) -> &'static str {
        "llama.cpp"
    }

    fn read(&self, log: &mut EngineLog, l: &Line<'_>) {
        let p = pats();
        let msg = l.text();
        let no = l.no;
        if let Some(c) = p.build.captures(msg) {
            log.note_form("llama.cpp");
            log.set_version(l, format!("b{}", &c["v"]));
        } else if let Some(c) = p.build_new.captures(msg) {
            log.note_form("llama.cpp");
            log.set_version(l, format!("b{} ({})", &c["n"], &c["h"]));
        }
        if [
            "llama_model_loader:",
            "llama_context:",
            "llama_server:",
            "load_tensors:",
            "print_info:",
            "srv ",
            "slot ",
            "main: server is listening",
        ]
        .iter()
        .any(|m| msg.starts_with(m))
        {
            log.note_form("llama.cpp");
        }
        if msg.contains("load_model: loading model '") {
            log.model_load_line.get_or_insert(no);
        }
        let drafting = log.pending.contains_key("draft");
        if !drafting
            && (msg.contains("llama_model_loader: loaded meta data")
                || msg.contains("load_model: loading model '"))
        {
            let b = log.boot_for(l, 0);
            if b.stage == 0 {
                b.last_stage = Some(("the model-loading line".into(), no));
            }
            log.recognised();
        }
        if msg.contains("loading draft model") {
            log.pending.insert("draft", no);
        }
        // The drafter's own context and KV cache (between `loading draft model` and the slots
        // line) are not the target's capacity.
        let drafter = log.pending.contains_key("draft");
        if drafter && (p.n_ctx.is_match(msg) || p.kv.is_match(msg) || p.buffer.is_match(msg)) {
            log.recognised();
            return;
        }
        read_kv(log, l, p, msg, no);
        read_slots(log, l, p, msg, no);
        read_spec_config(log, p, msg, no);
        read_request_timing(log, l, p, msg, no);
    }

    fn finish_boot(&self, b: &mut Boot) {
        if b.kv_cache_tokens.is_some() {
            return;
        }
        if let Some(s) = &b.slots {
            if let (Some(n), Some(c)) = (s.n_slots, s.n_ctx_slot) {
                let (tokens, rule) = if s.unified == Some(true) {
                    (
                        c,
                        format!(
                            "n_ctx_slot {} (kv_unified: the slots share one cache)",
                            thousands(c)
                        ),
                    )
                } else {
                    (
                        n.saturating_mul(c),
                        format!("n_slots {n} × n_ctx_slot {}", thousands(c)),
                    )
                };
                b.kv_cache_tokens = Some(tokens);
                b.kv_cache_tokens_line = Some(s.line);
                b.kv_cache_tokens_rule = Some(rule);
                return;
            }
        }
        if let (Some((n, line)), Some(_)) = (b.n_ctx, b.kv_pool_bytes) {
            b.kv_cache_tokens = Some(n);
            b.kv_cache_tokens_line = Some(line);
            b.kv_cache_tokens_rule = Some("n_ctx (one unified KV cache of n_ctx cells)".into());
        }
    }
}

/// llama.cpp's context and KV-cache lines: n_ctx, the SWA marker, KV buffers and cells.
fn read_kv(log: &mut EngineLog, l: &Line<'_>, p: &Pats, msg: &str, no: usize) {
    if let Some(c) = p.n_ctx.captures(msg) {
        if let Some(n) = num(&c["n"]) {
            if let Some(b) = log.fact(
                l,
                1,
                "n_ctx",
                &n.to_string(),
                "the n_ctx line",
                Repeat::NewBoot,
            ) {
                b.n_ctx = Some((n, no));
            }
            log.recognised();
        }
    }
    if let Some(c) = p.iswa.captures(msg) {
        log.pending.insert("swa", usize::from(&c["w"] == "SWA"));
        log.recognised();
    }
    if let Some(c) = p.buffer.captures(msg) {
        log.note_form("llama.cpp");
        if let Some(mib) = fnum(&c["mib"]) {
            let dev = c["dev"].to_string();
            let b = super::aux_boot(log, l);
            if !b.kv_buffers.iter().any(|x| x.line == no) {
                b.kv_buffers.push(KvBuffer {
                    device: dev,
                    mib,
                    line: no,
                });
            }
        }
        log.recognised();
    }
    if let Some(c) = p.kv.captures(msg) {
        log.note_form("llama.cpp");
        let swa = log.pending.remove("swa") == Some(1);
        if let Some(cells) = num(&c["n"]) {
            let kc = KvCells {
                cells,
                layers: num(&c["l"]),
                seqs: num(&c["s"]),
                streams: c.name("t").and_then(|m| num(m.as_str())),
                mib: fnum(&c["mib"]),
                line: no,
            };
            if swa {
                super::aux_boot(log, l).kv_cells_swa = Some(kc);
            } else {
                let tokens = cells.saturating_mul(kc.streams.unwrap_or(1));
                let rule = match kc.streams {
                    Some(t) => format!(
                        "{} cells × {t} stream{} (`{}/{t} seqs`: cells are per stream)",
                        thousands(cells),
                        if t == 1 { "" } else { "s" },
                        kc.seqs.unwrap_or(0)
                    ),
                    None => format!("{} cells (one unified stream)", thousands(cells)),
                };
                if let Some(b) = log.fact(
                    l,
                    2,
                    "size",
                    &tokens.to_string(),
                    "the KV-size line",
                    Repeat::NewBoot,
                ) {
                    b.kv_pool_bytes = kc.mib.map(|m| (m * 1048576.0).round() as u64);
                    b.kv_pool_bytes_line = Some(no);
                    b.kv_cells = Some(kc);
                    b.kv_cache_tokens = Some(tokens);
                    b.kv_cache_tokens_line = Some(no);
                    b.kv_cache_tokens_rule = Some(rule);
                }
            }
        }
        log.recognised();
    } else if let Some(c) = p.kv_self.captures(msg) {
        // The oldest form: one unified cache of n_ctx cells.
        let b = log.boot_for(l, 2);
        b.kv_pool_bytes = fnum(&c["mib"]).map(|m| (m * 1048576.0).round() as u64);
        b.kv_pool_bytes_line = Some(l.no);
        log.recognised();
    }
}

/// llama.cpp's slots, per-slot context, offloaded layers and model buffers.
fn read_slots(log: &mut EngineLog, l: &Line<'_>, p: &Pats, msg: &str, no: usize) {
    if let Some(c) = p.slots.captures(msg) {
        log.note_form("llama.cpp");
        let s = Slots {
            n_slots: num(&c["s"]),
            n_ctx_slot: num(&c["c"]),
            unified: c.name("u").map(|u| u.as_str() == "true"),
            line: no,
        };
        let value = format!("{:?}/{:?}/{:?}", s.n_slots, s.n_ctx_slot, s.unified);
        log.pending.remove("draft");
        if let Some(b) = log.fact(l, 2, "slots", &value, "the slots line", Repeat::NewBoot) {
            b.slots = Some(s);
            b.context_len.get_or_insert(num(&c["c"]).unwrap_or(0));
        }
        log.recognised();
    } else if let Some(c) = p.slots_old.captures(msg) {
        let n = num(&c["s"]);
        log.pending.remove("draft");
        if let Some(b) = log.fact(
            l,
            2,
            "slots",
            &format!("{n:?}"),
            "the slots line",
            Repeat::NewBoot,
        ) {
            b.slots = Some(Slots {
                n_slots: n,
                n_ctx_slot: None,
                unified: None,
                line: no,
            });
        }
        log.recognised();
    }
    if let Some(c) = p.slot_ctx.captures(msg) {
        if let (Some(n), Some(b)) = (num(&c["c"]), log.current_boot()) {
            b.context_len.get_or_insert(n);
            if let Some(s) = b.slots.as_mut() {
                s.n_ctx_slot.get_or_insert(n);
            }
        }
        log.recognised();
    }
    if let Some(c) = p.offloaded.captures(msg) {
        if let (Some(a), Some(t)) = (num(&c["a"]), num(&c["b"])) {
            super::aux_boot(log, l).offloaded_layers = Some((a, t, no));
        }
        log.recognised();
    }
    if let Some(c) = p.model_buffer.captures(msg) {
        let dev = c["dev"].to_ascii_lowercase();
        if !(dev.contains("cpu") || dev.ends_with("_host")) {
            let b = super::aux_boot(log, l);
            b.gpu_model_buffer_line.get_or_insert(no);
        }
    }
}

/// llama.cpp's speculative decoding configuration.
fn read_spec_config(log: &mut EngineLog, p: &Pats, msg: &str, no: usize) {
    if let Some(c) = p.spec_impl.captures(msg) {
        let sc = &mut log.spec_config;
        sc.method = Some(method_of(&c["m"]));
        sc.method_source = Some(format!("'adding speculative implementation' at line {no}"));
        sc.line.get_or_insert(no);
        log.recognised();
    }
    if msg.contains("no implementations specified for speculative decoding") {
        log.spec_config.off_line.get_or_insert(no);
        log.recognised();
    }
    if msg.contains("loading draft model") {
        let sc = &mut log.spec_config;
        sc.drafter_line.get_or_insert(no);
        if sc.method.is_none() {
            sc.method = Some("draft model".into());
            sc.method_source = Some(format!("'loading draft model' at line {no}"));
        }
        log.recognised();
    }
    if let Some(c) = p.spec_type.captures(msg) {
        let sc = &mut log.spec_config;
        if sc.method.is_none() {
            sc.method = Some(method_of(&c["t"]));
            sc.method_source = Some(format!("--spec-type at line {no}"));
            sc.line.get_or_insert(no);
        }
    }
    if let Some(c) = p.stats_name.captures(msg) {
        let sc = &mut log.spec_config;
        if sc.method.is_none() {
            sc.method = Some(method_of(&c["n"]));
            sc.method_source = Some(format!("'statistics {}' at line {no}", &c["n"]));
        }
    }
}

/// llama.cpp's per-request prompt and generation timings.
fn read_request_timing(log: &mut EngineLog, l: &Line<'_>, p: &Pats, msg: &str, no: usize) {
    let task = p.task.captures(l.msg).and_then(|c| num(&c["t"]));
    if let Some(c) = p
        .prompt
        .captures(l.msg.trim_start())
        .or_else(|| p.prompt.captures(msg))
    {
        log.note_form("llama.cpp");
        log.request_timings.push(RequestTiming {
            line: no,
            task,
            prompt_tokens: num(&c["n"]),
            prompt_ms: fnum(&c["ms"]),
            generated_tokens: None,
            generation_ms: None,
        });
        log.recognised();
    } else if let Some(c) = p.eval.captures(msg) {
        if let Some(t) = log.request_timings.iter_mut().rev().take(64).find(|t| {
            t.generated_tokens.is_none()
                && match (t.task, task) {
                    (Some(a), Some(b)) => a == b,
                    _ => no <= t.line + 3,
                }
        }) {
            t.generated_tokens = num(&c["n"]);
            t.generation_ms = fnum(&c["ms"]);
            log.recognised();
        }
    }
}
