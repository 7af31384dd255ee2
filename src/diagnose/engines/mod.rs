//! One reader per engine, behind one interface ([`EngineReader`]): each knows its engine's line
//! forms across versions and records what they state into an [`EngineLog`]. Every reader sees
//! every line (a log may mix engines, e.g. a rigbench-captured log of an engine), so each one
//! matches only its own forms. `docs/diagnose.md` lists, per engine and version range, the
//! lines each reader reads; the test names cite where each form came from.
//!
//! Readers: [`vllm::Vllm`], [`sglang::Sglang`], [`llamacpp::Llamacpp`], [`trtllm::Trtllm`],
//! [`rigbench::Rigbench`]. Kernel-choice lines (`Using X for NVFP4 GEMM`, `Using 'X' NvFp4 MoE
//! backend`) are read here for every engine: vLLM and TensorRT-LLM print the same shape.

pub mod llamacpp;
pub mod rigbench;
pub mod sglang;
pub mod trtllm;
pub mod vllm;

use std::sync::OnceLock;

use regex::Regex;

use super::line::Line;
use super::log::{Boot, EngineLog};

/// One engine's line forms.
pub trait EngineReader: Sync {
    /// The engine's name as [`EngineLog::engine`] spells it (`vllm`, `sglang`, `llama.cpp`,
    /// `tensorrt-llm`, `rigbench`).
    fn engine(&self) -> &'static str;

    /// Read one line (its message is not empty) into `log`.
    fn read(&self, log: &mut EngineLog, l: &Line<'_>);

    /// Close a boot after the whole log was read (derive what takes several lines).
    fn finish_boot(&self, _boot: &mut Boot) {}
}

/// Every reader, in the order they see a line.
pub fn readers() -> &'static [&'static dyn EngineReader] {
    &[
        &vllm::Vllm,
        &sglang::Sglang,
        &llamacpp::Llamacpp,
        &trtllm::Trtllm,
        &rigbench::Rigbench,
        &Kernels,
    ]
}

/// Run every reader's [`EngineReader::finish_boot`] on every boot.
pub fn finish_boots(log: &mut EngineLog) {
    for b in &mut log.boots {
        for r in readers() {
            r.finish_boot(b);
        }
    }
}

/// The current boot, or a new one at stage 0 when there is none (for facts that belong to
/// whatever boot is being read and must never start one by themselves: buffers, memory notes).
pub(crate) fn aux_boot<'a>(log: &'a mut EngineLog, l: &Line) -> &'a mut Boot {
    if log.boots.is_empty() {
        log.boot_for(l, 0);
    }
    let b = log.current_boot().expect("a boot");
    b.last_line = b.last_line.max(l.no);
    b
}

/// Kernel choices, for every engine: vLLM `Using FlashInferCutlassNvFp4LinearKernel for NVFP4
/// GEMM`, `Using NvFp4LinearBackend.MARLIN for NVFP4 GEMM`, `Using flashinfer-cutlass for
/// NVFP4 GEMM`, `Using 'VLLM_CUTLASS' NvFp4 MoE backend out of potential backends: [...]`,
/// `Using FlashInfer CuteDSL NVFP4 MoE backend`, vLLM's MXFP4 `Using Marlin backend`;
/// TensorRT-LLM `Using cuBLASLt backend for NVFP4 GEMM`, `Using CUTLASS backend for FP4 GEMM`;
/// vLLM's attention backend (`Using FLASHINFER attention backend out of potential backends:
/// ['FLASHINFER', 'TRITON_ATTN']`, `Using AttentionBackendEnum.FLASH_ATTN backend.`, `Using
/// FlashInfer backend on V1 engine.`), `Using FlashAttention version 2` and the Gated-DeltaNet
/// prefill kernel (`Using Triton/FLA GDN prefill kernel`).
pub struct Kernels;

struct KernelPats {
    gemm: Regex,
    moe: Regex,
    candidates: Regex,
    attn: Regex,
    attn_enum: Regex,
    attn_v1: Regex,
    fa_version: Regex,
    gdn: Regex,
}

fn kernel_pats() -> &'static KernelPats {
    static P: OnceLock<KernelPats> = OnceLock::new();
    P.get_or_init(|| KernelPats {
        gemm: Regex::new(
            r"Using (?P<k>[\w.\-]+)(?: backend)? for (?P<w>NVFP4|MXFP4|FP4|NvFp4|Mxfp4) GEMM",
        )
        .expect("static regex"),
        moe: Regex::new(
            r"Using '?(?P<k>[\w.\-]+(?: [A-Za-z][\w.\-]*)?)'? (?P<w>NvFp4|Nvfp4|NVFP4|Mxfp4|MXFP4) MoE backend",
        )
        .expect("static regex"),
        candidates: Regex::new(r"out of potential backends: [\[(](?P<l>[^\])]*)[\])]")
            .expect("static regex"),
        attn: Regex::new(r"Using (?P<k>\w+) attention backend out of potential backends")
            .expect("static regex"),
        attn_enum: Regex::new(r"Using AttentionBackendEnum\.(?P<k>\w+) backend\b")
            .expect("static regex"),
        attn_v1: Regex::new(r"Using (?P<k>[\w ]+?) backend on V1 engine").expect("static regex"),
        fa_version: Regex::new(r"Using FlashAttention version (?P<n>\d)").expect("static regex"),
        gdn: Regex::new(r"Using (?P<k>Triton/FLA|FlashInfer|[\w/]+) GDN prefill kernel")
            .expect("static regex"),
    })
}

impl EngineReader for Kernels {
    fn engine(&self) -> &'static str {
        "any"
    }

    fn read(&self, log: &mut EngineLog, l: &Line<'_>) {
        let msg = l.text();
        if !msg.contains("Using ") {
            return;
        }
        let p = kernel_pats();
        if let Some(c) = p.gemm.captures(msg) {
            log.push_choice(
                format!("{} GEMM", c["w"].to_ascii_uppercase()),
                &c["k"],
                l.no,
            );
        }
        if let Some(c) = p.moe.captures(msg) {
            let candidates = p
                .candidates
                .captures(msg)
                .map(|x| {
                    x["l"]
                        .split(',')
                        .map(|s| s.trim().trim_matches(['\'', '"']).to_string())
                        .filter(|s| !s.is_empty())
                        .collect()
                })
                .unwrap_or_default();
            log.push_choice_among(
                format!("{} MoE", c["w"].to_ascii_uppercase()),
                &c["k"],
                l.no,
                candidates,
            );
        }
        let listed = |msg: &str| -> Vec<String> {
            p.candidates
                .captures(msg)
                .map(|x| {
                    x["l"]
                        .split(',')
                        .map(|s| s.trim().trim_matches(['\'', '"']).to_string())
                        .filter(|s| !s.is_empty())
                        .collect()
                })
                .unwrap_or_default()
        };
        // vLLM's attention backend for the model's layers (not the vision encoder's `Using
        // backend AttentionBackendEnum.X for vit attention`).
        if let Some(c) = p
            .attn
            .captures(msg)
            .or_else(|| p.attn_enum.captures(msg))
            .or_else(|| p.attn_v1.captures(msg))
        {
            log.push_choice_among("attention".into(), &c["k"], l.no, listed(msg));
        }
        if let Some(c) = p.fa_version.captures(msg) {
            log.push_choice(
                "FlashAttention version".into(),
                &format!("FlashAttention {}", &c["n"]),
                l.no,
            );
        }
        if let Some(c) = p.gdn.captures(msg) {
            log.push_choice("GDN prefill".into(), &c["k"], l.no);
        }
        if msg.contains("Using Marlin backend")
            && l.site.as_deref().is_some_and(|s| s.starts_with("mxfp4"))
        {
            log.push_choice("MXFP4 MoE".into(), "Marlin", l.no);
        }
    }
}
