//! Kernels the engine names, joined with the checkpoint and the card: whether the card runs
//! FP4 natively (an FP4 tensor-core kernel named for NVFP4 layers), and whether a weight-only
//! path (the Marlin FP4 fallback warning, a Marlin, Humming or `…W4A16…` kernel) is expected
//! for this checkpoint on this card with this engine version.
//!
//! Which kernel vLLM runs weight-only (W4A16) NVFP4 layers on depends on its version and the
//! card (`docs/diagnose.md`): dense layers on Marlin before 0.30; FlashInfer CuTe-DSL on sm_100
//! and sm_103 from 0.30, Humming on sm_90 from 0.32, Marlin elsewhere. W4A4 layers run natively on
//! cards with FP4 tensor cores (sm_100 and up) when the build has kernels for the card, and as
//! W4A16 below sm_100. The rules themselves (which kernel each engine version selects per
//! layer class and card) are `crate::checkpoint::predict`'s, shared with `inspect --engine`;
//! [`prediction_findings`] states where a log's kernels differ from them.

use super::log::{EngineLog, KernelChoice, KernelPath};
use super::{f, Card, CheckpointFacts, Finding, LogInput, Severity};
// The rules live in one module that `inspect --engine` uses too.
pub(crate) use crate::checkpoint::predict::vllm_w4a16_kernel;
use crate::checkpoint::predict::{self, EngineSpec, LayerClass};

fn choice_text(c: &KernelChoice) -> String {
    format!("{} → {} (line {})", c.what, c.kernel, c.line)
}

/// Log-only: the fallbacks the engine warned about, the FP4 kernels named, and the conclusion
/// they allow.
pub(crate) fn kernel_findings(l: &LogInput, out: &mut Vec<Finding>) {
    let log = &l.log;
    for w in &log.fallback_warnings {
        out.push(f(
            "kernel-fallback",
            Severity::Info,
            format!("the engine fell back: {}", w.message),
            format!(
                "a warning at line {}: the engine runs another kernel or backend than it first chose; figures measured on this run are those of the fallback",
                w.line
            ),
            format!("{}:{}", l.name, w.line),
        ));
    }
    let fp4: Vec<&KernelChoice> = log
        .kernel_choices
        .iter()
        .filter(|c| c.what.contains("FP4"))
        .collect();
    let native: Vec<&KernelChoice> = fp4
        .iter()
        .copied()
        .filter(|c| c.path() == KernelPath::NativeFp4)
        .collect();
    let weight_only: Vec<&KernelChoice> = fp4
        .iter()
        .copied()
        .filter(|c| matches!(c.path(), KernelPath::WeightOnly | KernelPath::Emulated))
        .collect();
    if let Some(first) = native.first() {
        out.push(f(
            "fp4-native",
            Severity::Info,
            format!(
                "the card runs FP4 natively: {}",
                native
                    .iter()
                    .map(|c| format!("{} for {}", c.kernel, c.what))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            format!(
                "the engine names FP4 tensor-core kernels: {}{}",
                native.iter().map(|c| choice_text(c)).collect::<Vec<_>>().join("; "),
                if weight_only.is_empty() {
                    String::new()
                } else {
                    format!(
                        ". Not every FP4 layer kind does: {} run weight-only (4-bit weights dequantized to BF16, BF16 activations)",
                        weight_only.iter().map(|c| choice_text(c)).collect::<Vec<_>>().join("; ")
                    )
                }
            ),
            format!("{}:{}", l.name, first.line),
        ));
    }
}

/// A weight-only FP4 backend chosen although the same line lists native FP4 candidates before
/// it. vLLM tries `AVAILABLE_BACKENDS` in order and takes the first whose
/// `is_supported_config` passes, logging each rejection only at DEBUG
/// (`vllm/model_executor/layers/fused_moe/oracle/nvfp4.py` `select_nvfp4_moe_backend`), unless
/// `--moe-backend` names one: so each native candidate before the chosen one was rejected for
/// this card, build or layer configuration, or a flag forced the choice. With a card that has
/// FP4 tensor cores, the Marlin warning's "your GPU does not have native support for FP4" then
/// describes the build's kernels, not the card.
pub(crate) fn passed_over_findings(l: &LogInput, card: Option<&Card>, out: &mut Vec<Finding>) {
    for c in &l.log.kernel_choices {
        if !matches!(c.path(), KernelPath::WeightOnly | KernelPath::Emulated) {
            continue;
        }
        let passed = c.native_candidates_passed_over();
        if passed.is_empty() {
            continue;
        }
        let warned = l.log.marlin_fp4_fallback.as_ref().map(|m| {
            format!(
                " The 'does not have native support for FP4' warning (line {}) ",
                m.line
            )
        });
        let (sev, judgement) = match card.map(|k| (k.cc.as_int(), k.source.as_str())) {
            Some((cc, from)) if cc >= 100 => (
                Severity::Warning,
                format!(
                    "sm_{cc} ({from}) has FP4 tensor cores, so the card is not the reason: each native candidate's support check rejected this build or layer configuration (vLLM logs each reason at DEBUG: rerun with VLLM_LOGGING_LEVEL=DEBUG to read them), or --moe-backend forced {}.{}",
                    c.kernel,
                    warned
                        .map(|w| format!("{w}is then wrong about the card: it is the build's kernels that are missing"))
                        .unwrap_or_default()
                ),
            ),
            Some((cc, from)) => (
                Severity::Info,
                format!("expected: sm_{cc} ({from}) has no FP4 tensor cores, so the native candidates cannot run on it"),
            ),
            None => (
                Severity::Info,
                "whether the card is the reason depends on it: give --cc sm_XX (sm_100 and up have FP4 tensor cores)".into(),
            ),
        };
        out.push(f(
            "native-candidates-passed-over",
            sev,
            format!(
                "{}: {} chosen over native candidates {}",
                c.what,
                c.kernel,
                passed.join(", ")
            ),
            format!(
                "line {} lists the backends vLLM tries in order ({}) and names {} as the one taken, after {}: {judgement}",
                c.line,
                c.candidates.join(", "),
                c.kernel,
                passed.join(", ")
            ),
            format!("{}:{}", l.name, c.line),
        ));
    }
}

/// Joins of the named kernels with the checkpoint and the card: the Marlin FP4 fallback (the
/// warning, or a Marlin kernel chosen for FP4 layers), and other weight-only FP4 kernels.
pub(crate) fn marlin_findings(
    l: &LogInput,
    ck: Option<&CheckpointFacts>,
    card: Option<&Card>,
    engine: &str,
    out: &mut Vec<Finding>,
) {
    let log = &l.log;
    let marlin_choice = log
        .kernel_choices
        .iter()
        .find(|c| c.what.contains("FP4") && c.is_marlin());
    let seen = match (&log.marlin_fp4_fallback, marlin_choice) {
        (Some(m), _) => Some((
            m.line,
            format!(
                "the Marlin FP4 warning ({} lines{}{})",
                m.occurrences,
                if m.ranks.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", ranks {}",
                        m.ranks
                            .iter()
                            .map(u32::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                },
                if m.call_sites.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", from {}",
                        m.call_sites
                            .iter()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(" and ")
                    )
                }
            ),
        )),
        (None, Some(c)) => Some((
            c.line,
            format!("the engine chose Marlin ({})", choice_text(c)),
        )),
        (None, None) => None,
    };
    if let Some((line, seen)) = seen {
        let (sev, title, detail) = explain_marlin(log, ck, card, engine);
        out.push(f(
            "marlin-fp4-fallback",
            sev,
            title,
            format!("{seen}: {detail}"),
            format!("{}:{line}", l.name),
        ));
    }
    // Other weight-only FP4 kernels (Humming, a W4A16 CuTe-DSL kernel, Triton).
    for c in log
        .kernel_choices
        .iter()
        .filter(|c| c.what.contains("FP4") && !c.is_marlin() && c.path() == KernelPath::WeightOnly)
    {
        let w4a4 = ck.map(|k| k.w4a4_kinds.clone()).unwrap_or_default();
        let moe = c.what.contains("MoE");
        let hit: Vec<String> = w4a4
            .iter()
            .filter(|k| k.contains("MoE") == moe)
            .cloned()
            .collect();
        let (sev, why) = match card.map(|c| c.cc.as_int()) {
            Some(cc) if cc >= 100 && !hit.is_empty() => (
                Severity::Warning,
                format!(
                    "sm_{cc} has FP4 tensor cores and the checkpoint's {} are W4A4: a native kernel would keep their 4-bit activations; this build chose a weight-only one (vLLM 0.23 to 0.34 list their W4A4 NVFP4 kernels before the weight-only ones, so a flag, VLLM_DISABLED_KERNELS or a missing FlashInfer chose this one, see docs/diagnose.md); disable it (VLLM_DISABLED_KERNELS) or update",
                    hit.join(", ")
                ),
            ),
            Some(cc) => (
                Severity::Info,
                match w4a16_rule(log.engine_version.as_deref(), cc, moe) {
                    (Some(k), why) => format!("{why}; the log names {} (expected kernel: {k})", c.kernel),
                    (None, why) => why,
                },
            ),
            None => (
                Severity::Info,
                "whether it is expected depends on the card: give --cc sm_XX".into(),
            ),
        };
        out.push(f(
            "fp4-weight-only",
            sev,
            format!("{} runs weight-only on {}", c.what, c.kernel),
            format!(
                "{}: 4-bit weights dequantized to BF16, BF16 activations (no FP4 tensor cores for these layers); {why}",
                choice_text(c)
            ),
            format!("{}:{}", l.name, c.line),
        ));
    }
}

/// Where vLLM runs weight-only NVFP4 on something other than Marlin (docs/diagnose.md,
/// "Prediction rules").
const W4A16_WHERE: &str = "except dense layers on sm_100/sm_103 from 0.30, FlashInfer CuTe-DSL, and every layer on sm_90 from 0.32, Humming";

/// The weight-only NVFP4 kernel vLLM selects for dense layers ([`vllm_w4a16_kernel`]) or, with
/// `moe`, for MoE experts ([`crate::checkpoint::predict::vllm_w4a16_moe_kernel`]: Humming on
/// sm_90 from 0.32, Marlin elsewhere, sm_100 and sm_103 included): `(kernel, why)`, the kernel
/// `None` when it depends on a version the log does not state.
fn w4a16_rule(version: Option<&str>, cc: u32, moe: bool) -> (Option<&'static str>, String) {
    use crate::checkpoint::predict::{version_triple, vllm_w4a16_moe_kernel};
    if !moe {
        return vllm_w4a16_kernel(version, cc);
    }
    match version.and_then(version_triple) {
        Some(v) => {
            let k = vllm_w4a16_moe_kernel(v, cc);
            (
                Some(k),
                format!(
                    "vLLM {}.{}.{} runs weight-only NVFP4 MoE experts on {k} on sm_{cc} (fused_moe/oracle/nvfp4.py select_nvfp4_moe_backend)",
                    v.0, v.1, v.2
                ),
            )
        }
        None if cc == 90 => (
            None,
            "vLLM before 0.32 runs weight-only NVFP4 MoE experts on Marlin on sm_90; 0.32 and later run them on Humming, and the log does not state the version".into(),
        ),
        None => (
            Some("Marlin"),
            format!("vLLM runs weight-only NVFP4 MoE experts on Marlin on sm_{cc} in every version (no FlashInfer MoE backend takes BF16 activations)"),
        ),
    }
}

pub(crate) fn list(v: &[String]) -> String {
    v.join(", ")
}

/// Why the Marlin FP4 warning appeared: (severity, title, explanation).
fn explain_marlin(
    log: &EngineLog,
    ck: Option<&CheckpointFacts>,
    card: Option<&Card>,
    engine: &str,
) -> (Severity, String, String) {
    let marlin_choices: Vec<String> = log
        .kernel_choices
        .iter()
        .filter(|c| c.is_marlin())
        .map(|c| format!("{} → {} (line {})", c.what, c.kernel, c.line))
        .collect();
    let native_choices: Vec<String> = log
        .kernel_choices
        .iter()
        .filter(|c| !c.is_marlin() && c.path() != KernelPath::NotGemm)
        .map(|c| format!("{} → {} (line {})", c.what, c.kernel, c.line))
        .collect();
    let choices = if marlin_choices.is_empty() && native_choices.is_empty() {
        String::new()
    } else {
        format!(
            " The log names its kernels: {}.",
            marlin_choices
                .iter()
                .chain(native_choices.iter())
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        )
    };
    let w4a16 = ck.map(|c| c.w4a16_kinds.clone()).unwrap_or_default();
    let w4a4 = ck.map(|c| c.w4a4_kinds.clone()).unwrap_or_default();
    let Some(card) = card else {
        return explain_marlin_without_card(ck, &w4a16, &w4a4, &choices);
    };
    let cc = card.cc;
    let ccs = format!("sm_{} ({})", cc.as_int(), card.source);
    // vLLM runs weight-only NVFP4 dense layers on FlashInfer CuTe-DSL (sm_100, sm_103) from 0.30
    // and on Humming (sm_90) from 0.32: there a Marlin fallback is not the expected path.
    // MoE experts follow their own rule (Marlin on sm_100/sm_103 too): when every Marlin line
    // of the log (or, without such lines, every W4A16 layer of the checkpoint) is MoE.
    let moe_only = if marlin_choices.is_empty() {
        !w4a16.is_empty() && w4a16.iter().all(|k| k.contains("MoE"))
    } else {
        marlin_choices.iter().all(|c| c.contains("MoE"))
    };
    let vllm_like = log.engine.as_deref().is_none_or(|e| e == "vllm");
    let keyed = vllm_like.then(|| w4a16_rule(log.engine_version.as_deref(), cc.as_int(), moe_only));
    if let Some((Some(k), why)) = &keyed {
        if *k != "Marlin" {
            return (
                Severity::Warning,
                format!("Marlin FP4 fallback on sm_{}: not expected with {engine}", cc.as_int()),
                format!(
                    "{why}, so a Marlin line means this build did not select {k}: {}, or a flag forced Marlin (VLLM_NVFP4_GEMM_BACKEND=marlin, --linear-backend marlin, --moe-backend marlin).{choices}",
                    if *k == "Humming" {
                        "Humming is an optional dependency (pip install humming)"
                    } else {
                        "FlashInfer is missing or too old for its CuTe-DSL kernels"
                    }
                ),
            );
        }
    }
    let version_note = match &keyed {
        Some((None, why)) => format!(" Which path is expected depends on the version: {why}."),
        _ => String::new(),
    };
    if cc.as_int() < 100 {
        let lose = if w4a4.is_empty() {
            String::new()
        } else {
            format!(" The checkpoint's W4A4 layers ({}) lose their 4-bit activations here: speed and accuracy are those of W4A16.", list(&w4a4))
        };
        return (
            Severity::Info,
            format!("Marlin FP4 fallback: expected on sm_{}", cc.as_int()),
            format!("{ccs} has no FP4 tensor cores, so every NVFP4 layer runs weight-only as W4A16 (4-bit weights dequantized to BF16 inside the kernel, BF16 activations).{lose}{version_note}{choices}"),
        );
    }
    let Some(_) = ck else {
        return (
            Severity::Info,
            format!("Marlin FP4 fallback on sm_{}: expected or not depends on the checkpoint", cc.as_int()),
            format!("{ccs} has FP4 tensor cores: weights-only (W4A16) NVFP4 layers may run on Marlin ({W4A16_WHERE}), but W4A4 layers should run natively.{version_note}{choices} Give --checkpoint DIR (config.json + hf_quant_config.json are enough) to tell which layers are which"),
        );
    };
    let consumer = matches!(cc.as_int(), 120 | 121);
    let expected_part = if w4a16.is_empty() {
        String::new()
    } else {
        format!(
            "these layers are weights-only NVFP4 ({}), which vLLM runs on Marlin on this card and version ({W4A16_WHERE})",
            list(&w4a16)
        )
    };
    if !consumer {
        if w4a4.is_empty() || !w4a16.is_empty() {
            let rest = if w4a4.is_empty() {
                "; the checkpoint has no W4A4 layers".to_string()
            } else {
                format!("; the W4A4 layers ({}) run natively", list(&w4a4))
            };
            let sev = if marlin_choices.iter().any(|c| c.contains("MoE"))
                && w4a4.iter().any(|k| k.contains("MoE"))
            {
                Severity::Warning
            } else {
                Severity::Info
            };
            return (
                sev,
                format!("Marlin FP4 fallback on sm_{}: expected", cc.as_int()),
                format!(
                    "expected: {}{rest}.{version_note}{choices}",
                    if expected_part.is_empty() {
                        "no W4A16 layer".into()
                    } else {
                        expected_part
                    }
                ),
            );
        }
        return (
            Severity::Warning,
            format!("Marlin FP4 fallback on sm_{}: not expected for this checkpoint", cc.as_int()),
            format!("{ccs} has FP4 tensor cores and every NVFP4 layer of the checkpoint is W4A4 ({}), so {engine} should run them natively: this build lacks (or did not select) its native FP4 kernels for the card.{choices} Check the engine's 'Using … for NVFP4 GEMM' / 'NvFp4 MoE backend' lines and its FlashInfer/CUTLASS build", list(&w4a4)),
        );
    }
    // sm_120 / sm_121: which layers have no native path in this engine build, and why.
    explain_marlin_12x(log, card, &w4a16, &w4a4, expected_part, engine, &choices)
}

/// Why the Marlin FP4 warning appeared when the card is unknown: it depends on the checkpoint's layers.
fn explain_marlin_without_card(
    ck: Option<&CheckpointFacts>,
    w4a16: &[String],
    w4a4: &[String],
    choices: &str,
) -> (Severity, String, String) {
    let settle = "give --cc sm_XX (or --rig results.json) to settle it";
    match ck {
            Some(_) if !w4a16.is_empty() => (
                Severity::Info,
                "Marlin FP4 fallback: expected for the W4A16 layers".into(),
                format!("the checkpoint's {} are weights-only NVFP4 (W4A16), which run on Marlin in vLLM ({W4A16_WHERE}).{} Whether its W4A4 layers ({}) run natively depends on the card: {settle}", list(w4a16), choices, if w4a4.is_empty() { "none".into() } else { list(w4a4) }),
            ),
            Some(_) => (
                Severity::Info,
                "Marlin FP4 fallback: expected only on a card without FP4 tensor cores".into(),
                format!("every NVFP4 layer of the checkpoint is W4A4 ({}): the fallback is expected below sm_100 and means a missing native kernel on sm_100 and up.{choices} {settle}", list(w4a4)),
            ),
            None => (
                Severity::Info,
                "Marlin FP4 fallback: expected or not depends on the checkpoint and the card".into(),
                format!("W4A16 NVFP4 layers run on Marlin in vLLM ({W4A16_WHERE}); W4A4 layers run natively only on cards with FP4 tensor cores (sm_100 and up) when the engine has kernels for them.{choices} Give --checkpoint DIR (config.json + hf_quant_config.json are enough) and --cc sm_XX to settle it"),
            ),
    }
}

/// Why the Marlin FP4 warning appeared on sm_120 / sm_121: which layers have no native path in this engine build, and why.
fn explain_marlin_12x(
    log: &EngineLog,
    card: &Card,
    w4a16: &[String],
    w4a4: &[String],
    expected_part: String,
    engine: &str,
    choices: &str,
) -> (Severity, String, String) {
    let cc = card.cc;
    let mut no_native: Vec<String> = Vec::new();
    for c in log.kernel_choices.iter().filter(|c| c.is_marlin()) {
        let kinds: Vec<String> = if c.what.contains("MoE") {
            w4a4.iter().filter(|k| k.contains("MoE")).cloned().collect()
        } else {
            w4a4.iter()
                .filter(|k| !k.contains("MoE"))
                .cloned()
                .collect()
        };
        if !kinds.is_empty() {
            let passed = c.native_candidates_passed_over();
            no_native.push(format!(
                "{} ({} chose {} at line {}{})",
                list(&kinds),
                c.what,
                c.kernel,
                c.line,
                if passed.is_empty() {
                    String::new()
                } else {
                    format!(
                        " after passing over the native candidates {} it lists",
                        passed.join(", ")
                    )
                }
            ));
        }
    }
    let why_12x = format!(
        "on sm_{} native NVFP4 needs FP4 kernels compiled for the card (sm_120a / sm_120f, or sm_121a): engine builds whose FP4 MoE kernels cover only sm_100, or only sm_120 on an sm_121 card, have none and fall back to Marlin (vLLM issues #31085, #50925)",
        cc.as_int()
    );
    let mut parts = Vec::new();
    if !expected_part.is_empty() {
        parts.push(format!(
            "expected{}: {expected_part}",
            if w4a4.is_empty() {
                ""
            } else {
                " for part of it"
            }
        ));
    }
    let sev;
    if w4a4.is_empty() {
        sev = Severity::Info;
        parts.push("the checkpoint has no W4A4 layers, so nothing native is lost".into());
    } else if !no_native.is_empty() {
        sev = Severity::Warning;
        parts.push(format!(
            "no native path taken in {engine} on this card for the W4A4 {}: {why_12x}",
            no_native.join("; ")
        ));
    } else if log.kernel_choices.is_empty() {
        let look = "the engine's 'Using … for NVFP4 GEMM' / 'NvFp4 MoE backend' lines (at INFO, or with VLLM_LOGGING_LEVEL=DEBUG) name the kernel per layer kind";
        if w4a16.is_empty() {
            sev = Severity::Warning;
            parts.push(format!(
                "every NVFP4 layer of the checkpoint is W4A4 ({}), so the warning means some of them have no native path in {engine} on this card: {why_12x}; {look}",
                list(w4a4)
            ));
        } else {
            sev = Severity::Info;
            parts.push(format!(
                "the log does not say whether the W4A4 layers ({}) fell back as well: {why_12x}; {look}",
                list(w4a4)
            ));
        }
    } else {
        sev = Severity::Info;
        parts.push(format!(
            "the W4A4 layers ({}) got native kernels",
            list(w4a4)
        ));
    }
    (
        sev,
        format!("Marlin FP4 fallback on sm_{}", cc.as_int()),
        format!("{}.{choices}", parts.join("; ")),
    )
}

/// The prediction of `crate::checkpoint::predict` joined with the kernels the log names: for
/// each NVFP4 kernel line (dense linear or MoE experts), whether its family is the one the
/// engine's version selects on this card for the checkpoint's layers of that class; then the
/// attention backend, Gated-DeltaNet prefill kernel and KV-cache dtype ([`join_other_classes`]).
/// Needs the card and an engine version the rules cover (the log's, else `--engine`); the
/// NVFP4 join needs the checkpoint too. Says nothing without them.
pub(crate) fn prediction_findings(
    l: &LogInput,
    ck: Option<&CheckpointFacts>,
    card: Option<&Card>,
    engine_flag: Option<&EngineSpec>,
    out: &mut Vec<Finding>,
) {
    let log = &l.log;
    let Some(card) = card else {
        return;
    };
    // The log's own version first; `--engine` only for a log that does not state one, and
    // only when it names the log's engine (or the log names none).
    let spec =
        EngineSpec::from_log(log.engine.as_deref(), log.engine_version.as_deref()).or_else(|| {
            let flag = *engine_flag?;
            let same = log.engine_version.is_none()
                && log
                    .engine
                    .as_deref()
                    .is_none_or(|e| predict::Engine::named(e) == Some(flag.engine));
            same.then_some(flag)
        });
    let Some(spec) = spec else {
        return;
    };
    let cc = card.cc.as_int();
    let assumed = predict::PredictInput {
        attention: true,
        ..Default::default()
    };
    let (input, ck_input) = match ck.and_then(|c| c.predict_input.as_ref()) {
        Some(i) => (i, true),
        None => (&assumed, false),
    };
    join_other_classes(l, input, ck_input, &spec, card, out);
    if !ck_input {
        return;
    }
    let p = predict::predict(&spec, cc, input);
    for c in log
        .kernel_choices
        .iter()
        .filter(|c| c.what.contains("NVFP4") || c.what.contains("NvFp4"))
    {
        let class = if c.what.contains("MoE") {
            LayerClass::MoeExperts
        } else {
            LayerClass::DenseLinear
        };
        let rows: Vec<_> = p
            .rows
            .iter()
            .filter(|r| r.layer_class == class && r.quantization.starts_with("NVFP4"))
            .collect();
        if rows.is_empty() {
            continue;
        }
        let seen = predict::kernel_family(&c.kernel);
        if rows
            .iter()
            .any(|r| predict::kernel_family(&r.kernel) == seen)
        {
            continue;
        }
        let log_native = c.path() == KernelPath::NativeFp4;
        let sev = if rows.iter().any(|r| r.native != log_native) {
            Severity::Warning
        } else {
            Severity::Info
        };
        let predicted = rows
            .iter()
            .map(|r| format!("{} for {} {}", r.kernel, r.quantization, class.label()))
            .collect::<Vec<_>>()
            .join(" and ");
        let sources = rows
            .iter()
            .map(|r| r.rule_source.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        out.push(f(
            "kernel-differs-from-prediction",
            sev,
            format!(
                "predicted {predicted} on sm_{cc} ({}) with {spec}; the log shows {}",
                card.source, c.kernel
            ),
            format!(
                "{} ({} family, {}). The rule: {sources}. A difference means a flag or environment variable chose the kernel (VLLM_NVFP4_GEMM_BACKEND, --linear-backend, --moe-backend, VLLM_DISABLED_KERNELS), an optional dependency is missing (Humming, FlashInfer), the build lacks kernels for this card, or the rule does not hold for this build: check the log's candidate list and rerun with VLLM_LOGGING_LEVEL=DEBUG for each rejection",
                choice_text(c),
                seen,
                if log_native {
                    "native FP4"
                } else {
                    "weight-only"
                }
            ),
            format!("{}:{}", l.name, c.line),
        ));
    }
}

/// Where a prediction and a log differ for one layer class, why it may (the rules' conditions
/// that the prediction does not know).
const ATTENTION_WHY: &str = "the engine's own choice differs from the default when a flag or variable sets it (--attention-backend, VLLM_ATTENTION_BACKEND), when the model has a feature the rule does not model (MLA, attention sinks, a head size or sliding window the first backend refuses, speculative decoding with topk > 1), or when a package is missing (FlashInfer, FlashAttention for this card)";
const GDN_WHY: &str = "the Gated-DeltaNet prefill kernel follows a flag (vLLM --gdn-prefill-backend, SGLang --linear-attn-prefill-backend) and, for FlashInfer, conditions the prediction cannot see from a config (the CUDA runtime, FlashInfer's build)";

/// The attention backend, the FlashAttention version, the Gated-DeltaNet prefill kernel and the
/// KV-cache dtype the log names, joined with the prediction for the same engine, card and
/// checkpoint: one finding per class that differs (with why it may), and one that lists what
/// agrees, what the log's own KV flag changed, and which classes the log does not state.
fn join_other_classes(
    l: &LogInput,
    input: &predict::PredictInput,
    from_checkpoint: bool,
    spec: &EngineSpec,
    card: &Card,
    out: &mut Vec<Finding>,
) {
    let log = &l.log;
    let cc = card.cc.as_int();
    let mut input = input.clone();
    let mut j = Joined::default();
    if !from_checkpoint {
        j.notes.push("without --checkpoint the prediction assumes a model with softmax attention (no MLA), no Gated-DeltaNet layers and no KV declaration".into());
    }
    // A KV dtype the log's arguments set replaces the checkpoint's declaration; a resolved one
    // (SGLang's `Using KV cache dtype`) is compared with the prediction instead.
    let kv_word = log.kv_cache_dtype.as_deref();
    let kv_line = log.kv_cache_dtype_line;
    let kv_class = kv_word.and_then(predict::kv_dtype_class);
    let declared_fp8 = input
        .kv_cache
        .as_deref()
        .is_some_and(|k| k.to_ascii_uppercase().contains("FP8"));
    if let (Some(word), Some(class @ ("FP8" | "16-bit")), false) =
        (kv_word, kv_class, log.kv_cache_dtype_resolved)
    {
        if declared_fp8 != (class == "FP8") && from_checkpoint {
            j.notes.push(format!(
                "the log's kv_cache_dtype '{word}'{} replaces the checkpoint's KV declaration ({}), so the prediction below is made for a {class} cache",
                at_line(kv_line),
                if declared_fp8 { "FP8" } else { "none: the model dtype" }
            ));
        }
        input.kv_cache = (class == "FP8").then(|| "FP8".to_string());
        input.kv_from_flag = true;
    }
    let p = predict::predict(spec, cc, &input);
    let row = |c: LayerClass| p.rows.iter().find(|r| r.layer_class == c);
    let ctx = JoinCtx { l, spec, card, cc };
    if let Some(r) = row(LayerClass::Attention) {
        join_attention(&ctx, r, &mut j, out);
    }
    if let Some(r) = row(LayerClass::Gdn) {
        join_gdn(&ctx, r, &mut j, out);
    }
    if let Some(r) = row(LayerClass::KvCache) {
        join_kv(&ctx, r, (kv_word, kv_class, kv_line), &mut j, out);
    }
    let Joined {
        agreed,
        notes,
        unstated,
        mut cited,
    } = j;
    if agreed.is_empty() && notes.is_empty() && unstated.is_empty() {
        return;
    }
    cited.sort_unstable();
    cited.dedup();
    let mut parts = Vec::new();
    if !agreed.is_empty() {
        parts.push(format!("agrees with the prediction: {}", agreed.join("; ")));
    }
    parts.extend(notes);
    if !unstated.is_empty() {
        parts.push(format!(
            "unknown, the log does not state {} (vLLM prints `Using X attention backend` and the GDN prefill kernel at INFO; SGLang `Attention backend not specified. Use X backend by default.` and `server_args=…`)",
            unstated.join(", ")
        ));
    }
    out.push(f(
        "prediction-joined",
        Severity::Info,
        format!(
            "what will run for {spec} on sm_{cc} ({}), joined with the log",
            card.source
        ),
        format!("{}.", parts.join("; ")),
        if cited.is_empty() {
            l.name.clone()
        } else {
            format!(
                "{} lines {}",
                l.name,
                cited
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    ));
}

/// What the join found besides differences, for its summary finding: classes that agree,
/// notes, classes the log does not state, and the log lines cited.
#[derive(Default)]
struct Joined {
    agreed: Vec<String>,
    notes: Vec<String>,
    unstated: Vec<&'static str>,
    cited: Vec<usize>,
}

/// The log, engine and card a prediction is joined with.
struct JoinCtx<'a> {
    l: &'a LogInput,
    spec: &'a EngineSpec,
    card: &'a Card,
    /// The card's compute capability, as `sm_NN` writes it.
    cc: u32,
}

impl JoinCtx<'_> {
    /// The kernel choices of kind `what` the log names, in log order.
    fn choices(&self, what: &str) -> Vec<&KernelChoice> {
        self.l
            .log
            .kernel_choices
            .iter()
            .filter(|c| c.what == what)
            .collect()
    }

    /// The finding for a log line `c` of class `class` whose kernel (of family `seen`) is not
    /// the predicted row `r`'s, with the engine's candidate list and `why` a difference may be
    /// explained.
    fn differs(
        &self,
        class: LayerClass,
        r: &predict::ClassPrediction,
        c: &KernelChoice,
        seen: &str,
        why: &str,
    ) -> Finding {
        let (l, spec, card, cc) = (self.l, self.spec, self.card, self.cc);
        let before = c
            .candidates
            .iter()
            .take_while(|x| !x.eq_ignore_ascii_case(&c.kernel))
            .count();
        let listed = if c.candidates.is_empty() {
            String::new()
        } else if before > 0 {
            format!(
                " The engine listed its candidates in order: {}; those before {} were refused for this model, card or build, or a flag chose it.",
                c.candidates.join(", "),
                c.kernel
            )
        } else {
            format!(
                " The engine listed its candidates in order: {}; {} is first, so the predicted backend was not a candidate: it refused this model's configuration (dtype, head size, KV dtype) or a flag narrowed the list.",
                c.candidates.join(", "),
                c.kernel
            )
        };
        f(
            "kernel-differs-from-prediction",
            Severity::Info,
            format!(
                "predicted {} for {} on sm_{cc} ({}) with {spec}; the log shows {}",
                r.kernel,
                class.label(),
                card.source,
                c.kernel
            ),
            format!(
                "{} ({seen} family). The rule: {}.{listed} A difference is explained when {why}",
                choice_text(c),
                r.rule_source
            ),
            format!("{}:{}", l.name, c.line),
        )
    }
}

/// Attention: each backend line the log names, and the FlashAttention version when the
/// prediction names one and FlashAttention ran, against the predicted row `r`.
fn join_attention(
    ctx: &JoinCtx,
    r: &predict::ClassPrediction,
    j: &mut Joined,
    out: &mut Vec<Finding>,
) {
    let allowed = predict::predicted_families(&r.kernel, predict::attention_family, true);
    let attn = ctx.choices("attention");
    if attn.is_empty() {
        j.unstated.push("the attention backend");
    }
    // Every line, one verdict each: two boots may name two backends.
    let mut flash = false;
    for c in attn {
        let seen = predict::attention_family(&c.kernel);
        j.cited.push(c.line);
        if allowed.contains(&seen) {
            j.agreed.push(format!(
                "attention: {} at line {} ({seen}, as predicted)",
                c.kernel, c.line
            ));
            flash |= seen == "FlashAttention";
        } else {
            out.push(ctx.differs(LayerClass::Attention, r, c, seen, ATTENTION_WHY));
        }
    }
    // The FlashAttention version, when the prediction names one and FlashAttention ran.
    let predicted_fa = ["FlashAttention 2", "FlashAttention 3"]
        .into_iter()
        .find(|v| r.kernel.starts_with(v));
    if let (Some(want), true) = (predicted_fa, flash) {
        for v in ctx.choices("FlashAttention version") {
            j.cited.push(v.line);
            if v.kernel == want {
                j.agreed.push(format!("{} at line {}", v.kernel, v.line));
            } else {
                out.push(ctx.differs(LayerClass::Attention, r, v, &v.kernel, ATTENTION_WHY));
            }
        }
    }
}

/// Gated-DeltaNet: each prefill-kernel line the log names against the predicted row `r`.
fn join_gdn(ctx: &JoinCtx, r: &predict::ClassPrediction, j: &mut Joined, out: &mut Vec<Finding>) {
    let allowed = predict::predicted_families(&r.kernel, predict::gdn_family, false);
    let gdn = ctx.choices("GDN prefill");
    if gdn.is_empty() {
        j.unstated.push("the Gated-DeltaNet prefill kernel");
    }
    for c in gdn {
        let seen = predict::gdn_family(&c.kernel);
        j.cited.push(c.line);
        if allowed.contains(&seen) {
            j.agreed.push(format!(
                "Gated-DeltaNet prefill: {} at line {} ({seen}, as predicted)",
                c.kernel, c.line
            ));
        } else {
            out.push(ctx.differs(LayerClass::Gdn, r, c, seen, GDN_WHY));
        }
    }
}

/// The KV-cache dtype the log states (word, class, line) against the predicted row `r`.
fn join_kv(
    ctx: &JoinCtx,
    r: &predict::ClassPrediction,
    (kv_word, kv_class, kv_line): (Option<&str>, Option<&str>, Option<usize>),
    j: &mut Joined,
    out: &mut Vec<Finding>,
) {
    let (l, spec, card, cc) = (ctx.l, ctx.spec, ctx.card, ctx.cc);
    let predicted = if r.kernel.starts_with("FP8") {
        "FP8"
    } else {
        "16-bit"
    };
    match (kv_word, kv_class) {
        (Some(word), Some(class @ ("FP8" | "16-bit"))) => {
            if let Some(n) = kv_line {
                j.cited.push(n);
            }
            if class == predicted {
                j.agreed.push(format!(
                    "KV cache: '{word}'{} ({class}, as predicted)",
                    at_line(kv_line)
                ));
            } else {
                out.push(f(
                    "kernel-differs-from-prediction",
                    Severity::Warning,
                    format!(
                        "predicted a {predicted} KV cache on sm_{cc} ({}) with {spec}; the log shows '{word}'",
                        card.source
                    ),
                    format!(
                        "the engine states its KV-cache dtype '{word}'{}; the prediction: {} (the rule: {}). Capacity and accuracy figures then hold for a {class} cache: check the checkpoint's KV declaration (kv_cache_quant_algo) and --kv-cache-dtype",
                        at_line(kv_line),
                        r.kernel,
                        r.rule_source
                    ),
                    match kv_line {
                        Some(n) => format!("{}:{n}", l.name),
                        None => l.name.clone(),
                    },
                ));
            }
        }
        (Some(word), _) => {
            if let Some(n) = kv_line {
                j.cited.push(n);
            }
            j.notes.push(format!(
                "the log's kv_cache_dtype '{word}'{} leaves the dtype to the engine, and the log does not state what it resolved to (predicted: {predicted})",
                at_line(kv_line)
            ));
        }
        (None, _) => j.unstated.push("the KV-cache dtype"),
    }
}

/// ` at line N`, or nothing without a line.
fn at_line(n: Option<usize>) -> String {
    n.map(|n| format!(" at line {n}")).unwrap_or_default()
}
