//! `rigbench serve`'s own KV line: `KV cache: 1,048,576 tokens (65,536 blocks × 16); max
//! concurrency at 32,768 tokens: 32.0x` (`src/runtime/kv_cache.rs`). Its vLLM-form lines (`GPU
//! KV cache size: N tokens`) are read by [`super::vllm`].

use std::sync::OnceLock;

use regex::Regex;

use super::EngineReader;
use crate::diagnose::line::Line;
use crate::diagnose::log::{fnum, num, EngineLog, Repeat};

/// `rigbench serve`.
pub struct Rigbench;

fn kv_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(
            r"KV cache:\s*(?P<n>\d+(?:,\d{3})*)\s*tokens\s*\((?P<b>\d+(?:,\d{3})*)\s*blocks\s*[×x*]\s*(?P<bs>\d+)\)(?:;\s*max concurrency at\s*(?P<len>\d+(?:,\d{3})*)\s*tokens:\s*(?P<x>\d+(?:,\d{3})*(?:\.\d+)?)\s*x)?",
        )
        .expect("static regex")
    })
}

impl EngineReader for Rigbench {
    fn engine(&self) -> &'static str {
        "rigbench"
    }

    fn read(&self, log: &mut EngineLog, l: &Line<'_>) {
        let Some(c) = kv_re().captures(l.text()) else {
            return;
        };
        log.note_form("rigbench");
        let no = l.no;
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
                b.gpu_blocks = num(&c["b"]);
                b.block_size = num(&c["bs"]);
                b.block_size_source = Some("stated".into());
            }
        }
        if let (Some(len), Some(x)) = (c.name("len"), c.name("x")) {
            if let (Some(len), Some(x)) = (num(len.as_str()), fnum(x.as_str())) {
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
            }
        }
        log.recognised();
    }
}
