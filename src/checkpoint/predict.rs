//! Kernel provenance, "what will run": from a checkpoint's per-layer quantization, a card and an
//! engine with its version, the kernel family the engine selects for each layer class (dense
//! linear, MoE experts, attention, Gated-DeltaNet, KV cache), whether it is native (the format's
//! arithmetic on the card's own tensor cores: W4A4 NVFP4 on FP4 tensor cores, not weight-only
//! dequantization) and the warning the engine prints, each with the rule's source.
//!
//! This module is the one home of these rules: `rigbench inspect --engine` prints them and
//! `rigbench diagnose` (`crate::diagnose`) compares them with the kernels an engine log names,
//! so a rule changes in one place. It knows only [`ModuleFormat`]; the inspection maps its
//! modules to a [`PredictInput`].
//!
//! Sources: each rule's `rule_source` names the engine file and function it was read from and
//! the releases read: the Python sources of the PyPI wheels of vLLM 0.23.0 to 0.34.0 (every
//! minor's x.y.0, 0.25.1 and 0.27.1; 0.34.0 is the newest on PyPI) and SGLang 0.5.1 to 0.5.23,
//! read 2026-12-07. A rule that was not read in those releases ends with [`NOT_VERIFIED`].
//! `predict_sources.rs` holds the table read from the sources, row by row, and tests these
//! rules against it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::format::ModuleFormat;

/// The suffix of every rule whose version range could not be checked against that version's
/// own source.
pub const NOT_VERIFIED: &str = "(not verified against this version's source)";

/// The warning vLLM 0.23.0–0.34.0 print when NVFP4 layers go to Marlin, word for word
/// (`vllm/model_executor/kernels/linear/nvfp4/marlin.py`
/// `MarlinNvFp4LinearKernel.process_weights_after_loading` for dense layers,
/// `vllm/model_executor/layers/quantization/utils/marlin_utils_fp4.py`
/// `prepare_nvfp4_moe_layer_for_marlin` for MoE experts).
pub const MARLIN_FP4_WARNING: &str = "Your GPU does not have native support for FP4 computation but FP4 quantization is being used. Weight-only FP4 compression will be used leveraging the Marlin kernel. This may degrade performance for compute-heavy workloads.";

/// The warning vLLM 0.23.0–0.34.0 print when FP8 layers go to Marlin, word for word
/// (`vllm/model_executor/layers/quantization/utils/marlin_utils_fp8.py`
/// `prepare_fp8_layer_for_marlin`, `prepare_fp8_moe_layer_for_marlin`).
pub const MARLIN_FP8_WARNING: &str = "Your GPU does not have native support for FP8 computation but FP8 quantization is being used. Weight-only FP8 compression will be used leveraging the Marlin kernel. This may degrade performance for compute-heavy workloads.";

/// The error SGLang's model loader raises when the card is below the quantization config's
/// minimum capability, word for word (`python/sglang/srt/model_loader/loader.py`
/// `_get_quantization_config`, 0.5.1–0.5.23): for ModelOpt NVFP4 (`ModelOptFp4Config`) the
/// minimum is 100 in 0.5.1–0.5.12 and 80 from 0.5.13. The method is the one SGLang resolved
/// (`modelopt_fp4` for an NVFP4 export; a MIXED_PRECISION export says `modelopt_mixed`).
pub fn sglang_min_capability_error(method: &str, min: u32, cc: u32) -> String {
    format!("ValueError: The quantization method {method} is not supported for the current GPU. Minimum capability: {min}. Current capability: {cc}.")
}

/// The error SGLang 0.5.7–0.5.23 raise for a compressed-tensors NVFP4 (W4A4) layer below
/// sm_100, as Python prints the tuple it is given
/// (`python/sglang/srt/layers/quantization/compressed_tensors/compressed_tensors.py`
/// `CompressedTensorsConfig._check_scheme_supported`, `CompressedTensorsW4A4Fp4.get_min_capability`
/// 100).
pub fn sglang_ct_scheme_error(cc: u32) -> String {
    format!("RuntimeError: ('Quantization scheme is not supported for ', 'the current GPU. Min capability: 100. ', 'Current capability: {cc}.')")
}

/// An inference engine the prediction covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// vLLM, 0.23 to 0.34.
    Vllm,
    /// SGLang 0.5.
    Sglang,
}

impl Engine {
    /// The engine named `vllm` or `sglang` (any case, surrounding spaces ignored); `None` for
    /// any other name.
    pub fn named(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "vllm" => Some(Engine::Vllm),
            "sglang" => Some(Engine::Sglang),
            _ => None,
        }
    }
}

/// An engine and its version, as `--engine vllm==0.34` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineSpec {
    /// Which engine.
    pub engine: Engine,
    /// Major, minor, patch (patch 0 when not given).
    pub version: (u32, u32, u32),
}

/// The accepted forms of `--engine`, for error messages and help.
pub const ENGINE_FORMS: &str = "vllm==0.23 … vllm==0.34 (a patch level such as vllm==0.34.1 is fine) or sglang==0.5 (sglang==0.5.x)";

impl FromStr for EngineSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: String| format!("'{s}' {why}; give ENGINE==VERSION: {ENGINE_FORMS}");
        let (name, ver) = s
            .trim()
            .split_once("==")
            .ok_or_else(|| bad("has no '=='".into()))?;
        let engine = Engine::named(name).ok_or_else(|| {
            bad(format!(
                "names an engine rigbench has no rules for ('{}')",
                name.trim()
            ))
        })?;
        let version =
            version_triple(ver).ok_or_else(|| bad("has no version MAJOR.MINOR".into()))?;
        let spec = EngineSpec { engine, version };
        if !spec.covered() {
            return Err(bad(format!(
                "is outside the versions covered ({}.{})",
                version.0, version.1
            )));
        }
        Ok(spec)
    }
}

impl EngineSpec {
    /// From an engine log's engine name and version (`vllm`, `0.34.0rc1`); `None` when either
    /// is missing or the version is outside the covered range.
    pub fn from_log(engine: Option<&str>, version: Option<&str>) -> Option<Self> {
        let engine = Engine::named(engine?)?;
        let spec = EngineSpec {
            engine,
            version: version_triple(version?)?,
        };
        spec.covered().then_some(spec)
    }

    /// Whether rigbench has rules for this version: vLLM 0.23 to 0.34, SGLang 0.5.
    pub fn covered(&self) -> bool {
        let (a, b, _) = self.version;
        match self.engine {
            Engine::Vllm => a == 0 && (23..=34).contains(&b),
            Engine::Sglang => a == 0 && b == 5,
        }
    }
}

impl fmt::Display for EngineSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b, c) = self.version;
        let name = match self.engine {
            Engine::Vllm => "vLLM",
            Engine::Sglang => "SGLang",
        };
        write!(f, "{name} {a}.{b}.{c}")
    }
}

/// `0.33.0rc1` → (0, 33, 0); `v0.11.1.dev41+g6c3c` → (0, 11, 1).
pub fn version_triple(v: &str) -> Option<(u32, u32, u32)> {
    let v = v.trim().trim_start_matches('v');
    let mut it = v.split(|c: char| !c.is_ascii_digit());
    let a = it.next()?.parse().ok()?;
    let b = it.next()?.parse().ok()?;
    let c = it.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    Some((a, b, c))
}

/// The kernel a vLLM build runs weight-only NVFP4 *dense linear* layers on for card `cc`:
/// `(kernel, why)`; the kernel is `None` when it depends on a version the caller does not know.
/// Read in vLLM 0.23.0–0.34.0 (`vllm/model_executor/kernels/linear/__init__.py`
/// `init_nvfp4_linear_kernel`, the `use_a16` branch): Marlin on every card before 0.30;
/// FlashInfer CuTe-DSL W4A16 on sm_100 and sm_103 from 0.30; Humming on sm_90 from 0.32
/// (`prefers_humming`); Marlin elsewhere (sm_120 and sm_121 included). MoE experts differ:
/// see [`vllm_w4a16_moe_kernel`].
pub fn vllm_w4a16_kernel(version: Option<&str>, cc: u32) -> (Option<&'static str>, String) {
    let Some((newer, from)) = w4a16_dense_newer(cc) else {
        return (
            Some("Marlin"),
            format!("vLLM runs weight-only NVFP4 on Marlin on sm_{cc} in every version"),
        );
    };
    let (fa, fb) = (from.0, from.1);
    match version.and_then(version_triple) {
        Some(v) if v >= from => (
            Some(newer),
            format!(
                "vLLM {}.{}.{} runs weight-only NVFP4 on {newer} on sm_{cc} ({fa}.{fb} and later)",
                v.0, v.1, v.2
            ),
        ),
        Some(v) => (
            Some("Marlin"),
            format!(
                "vLLM {}.{}.{} runs weight-only NVFP4 on Marlin on sm_{cc} (before {fa}.{fb})",
                v.0, v.1, v.2
            ),
        ),
        None => (
            None,
            format!(
                "vLLM before {fa}.{fb} runs weight-only NVFP4 on Marlin on sm_{cc}; {fa}.{fb} and later run it on {newer}, and the log does not state the version"
            ),
        ),
    }
}

/// The weight-only NVFP4 dense kernel that replaces Marlin on `cc`, with the first version
/// that selects it: FlashInfer CuTe-DSL W4A16 on sm_100/sm_103 from 0.30, Humming on sm_90
/// from 0.32.
fn w4a16_dense_newer(cc: u32) -> Option<(&'static str, (u32, u32, u32))> {
    match cc {
        90 => Some(("Humming", (0, 32, 0))),
        100 | 103 => Some(("FlashInfer CuTe-DSL", (0, 30, 0))),
        _ => None,
    }
}

/// The kernel a vLLM build runs weight-only NVFP4 *MoE experts* on (and W4A4 experts on
/// cards below sm_100): Humming on sm_90 from 0.32, Marlin otherwise, sm_100 and sm_103
/// included (`vllm/model_executor/layers/fused_moe/oracle/nvfp4.py`
/// `select_nvfp4_moe_backend`: no FlashInfer backend accepts BF16 activations).
pub fn vllm_w4a16_moe_kernel(version: (u32, u32, u32), cc: u32) -> &'static str {
    if cc == 90 && version >= (0, 32, 0) {
        "Humming"
    } else {
        "Marlin"
    }
}

/// The layer classes a prediction covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerClass {
    /// Linear layers outside the routed experts: MLP, shared expert, attention and
    /// Gated-DeltaNet projections.
    DenseLinear,
    /// Routed MoE experts (the fused MoE kernel).
    MoeExperts,
    /// Softmax attention (the attention backend).
    Attention,
    /// Gated-DeltaNet linear attention (the recurrence; its projections are dense linear).
    Gdn,
    /// The KV cache.
    KvCache,
}

impl LayerClass {
    /// Words for tables.
    pub fn label(self) -> &'static str {
        match self {
            Self::DenseLinear => "dense linear",
            Self::MoeExperts => "MoE experts",
            Self::Attention => "attention",
            Self::Gdn => "Gated-DeltaNet",
            Self::KvCache => "KV cache",
        }
    }
}

/// Linear modules of one class in one format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinearGroup {
    /// Dense linear or MoE experts.
    pub class: LayerClass,
    /// Their format.
    pub format: ModuleFormat,
    /// Which modules, in words (`MLP, full attention`).
    pub modules: String,
}

/// What the prediction needs from a checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PredictInput {
    /// Linear modules grouped by class and format.
    pub linear: Vec<LinearGroup>,
    /// Whether the model has softmax-attention layers (false only when it is known to have none).
    pub attention: bool,
    /// Gated-DeltaNet layers, with the format of their projections when known.
    pub gdn_layers: u64,
    /// The format of the Gated-DeltaNet projections, in words.
    pub gdn_projections: Option<String>,
    /// The KV-cache dtype: `FP8` when the checkpoint declares it (or `--kv-cache-dtype fp8`),
    /// else `None` (the model dtype).
    pub kv_cache: Option<String>,
    /// True when `kv_cache` comes from `--kv-cache-dtype`, false when from the checkpoint's
    /// declaration (engines differ in whether they follow the declaration).
    #[serde(default)]
    pub kv_from_flag: bool,
    /// The checkpoint's quantization method (`modelopt`, `compressed-tensors`, …), when known:
    /// SGLang routes NVFP4 by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quant_method: Option<String>,
}

/// One row of "What will run".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassPrediction {
    /// The layer class.
    pub layer_class: LayerClass,
    /// Its quantization, in words.
    pub quantization: String,
    /// Which modules the row covers.
    pub modules: String,
    /// The kernel family the engine selects.
    pub kernel: String,
    /// True when the format's arithmetic runs on the card's own units (FP4 tensor cores for
    /// W4A4, FP8 tensor cores for FP8); false for weight-only dequantization or no kernel.
    pub native: bool,
    /// The warning (or error) the engine prints, when it prints one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// Engine file and function the rule comes from, with its version range.
    pub rule_source: String,
}

/// What the engine will run for a checkpoint on a card.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnginePrediction {
    /// The engine and version predicted for (`vLLM 0.34.0`).
    pub engine: String,
    /// The card (`sm_121`).
    pub cc: String,
    /// One row per layer class and quantization.
    pub rows: Vec<ClassPrediction>,
}

/// The kernel family of a kernel or backend name as engines log it (`FlashInferCutlassNvFp4LinearKernel`,
/// `NvFp4LinearBackend.MARLIN`, `VLLM_CUTLASS`, `flashinfer-cutlass`): the names predictions use.
pub fn kernel_family(name: &str) -> &'static str {
    let k = name.to_ascii_lowercase().replace(['-', '_', ' ', '.'], "");
    if k.contains("marlin") {
        "Marlin"
    } else if k.contains("humming") {
        "Humming"
    } else if k.contains("emulat") {
        "emulation"
    } else if k.contains("cutedsl") {
        "FlashInfer CuTe-DSL"
    } else if k.contains("trtllm") {
        "FlashInfer TRT-LLM"
    } else if k.contains("flashinfer") && k.contains("cutlass") {
        "FlashInfer CUTLASS"
    } else if k.contains("cutlass") {
        "vLLM CUTLASS"
    } else if k.contains("b12x") {
        "B12X"
    } else {
        "other"
    }
}

/// The attention-backend family of a backend name as engines log it or as a prediction words
/// it (`FLASH_ATTN`, `fa3`, `FlashAttention 3`, `FLASHINFER`, `trtllm_mha`, `TRITON_ATTN`):
/// `FlashAttention`, `FlashInfer`, `TRT-LLM`, `Triton`, `FlexAttention`, `torch`, else `other`.
pub fn attention_family(name: &str) -> &'static str {
    let k = name.to_ascii_lowercase().replace(['-', '_', ' ', '.'], "");
    if k.contains("trtllm") {
        "TRT-LLM"
    } else if k.contains("flashinfer") {
        "FlashInfer"
    } else if k.starts_with("fa3")
        || k.starts_with("fa4")
        || k.contains("flashattn")
        || k.contains("flashattention")
    {
        "FlashAttention"
    } else if k.contains("triton") {
        "Triton"
    } else if k.contains("flex") {
        "FlexAttention"
    } else if k.contains("torch") || k.contains("sdpa") {
        "torch"
    } else {
        "other"
    }
}

/// The Gated-DeltaNet prefill family of a kernel name (`Triton/FLA`, `FlashInfer`, a
/// prediction's words): `FLA Triton`, `FlashInfer`, else `other`.
pub fn gdn_family(name: &str) -> &'static str {
    let k = name.to_ascii_lowercase();
    if k.contains("flashinfer") {
        "FlashInfer"
    } else if k.contains("fla") || k.contains("triton") {
        "FLA Triton"
    } else {
        "other"
    }
}

/// The families a predicted kernel text allows, first the one it names first: the text
/// before its first `(`, `,` or ` when `, then each alternative it names after `else`, and
/// with `in_parens` those in `(X when …)` too. `family` maps a name to its family.
pub fn predicted_families(
    kernel: &str,
    family: fn(&str) -> &'static str,
    in_parens: bool,
) -> Vec<&'static str> {
    let head = kernel
        .split(['(', ','])
        .next()
        .unwrap_or(kernel)
        .split(" when ")
        .next()
        .unwrap_or(kernel);
    let mut out = vec![family(head)];
    let alternatives = kernel.split(" else ").skip(1).chain(
        kernel
            .split('(')
            .skip(1)
            .filter(|t| in_parens && t.contains(" when ")),
    );
    for alt in alternatives {
        let alt = alt.split(" when ").next().unwrap_or(alt);
        let f = family(alt.rsplit(';').next().unwrap_or(alt));
        if f != "other" && !out.contains(&f) {
            out.push(f);
        }
    }
    out
}

/// The KV-cache dtype class of an engine's dtype word (`fp8`, `fp8_e4m3`, `float8_e4m3fn`,
/// `bfloat16`, `auto`): `FP8`, `16-bit`, `FP4`, `auto` (the engine resolves it and the word
/// does not say to what), else `None`.
pub fn kv_dtype_class(word: &str) -> Option<&'static str> {
    let k = word.to_ascii_lowercase();
    if k == "auto" {
        Some("auto")
    } else if k.contains("fp8") || k.contains("float8") {
        Some("FP8")
    } else if k.contains("fp4") || k.contains("float4") {
        Some("FP4")
    } else if ["bf16", "bfloat16", "fp16", "float16", "half"]
        .iter()
        .any(|w| k == *w || k.ends_with(w))
    {
        Some("16-bit")
    } else {
        None
    }
}

/// A rule's answer before it becomes a row.
struct Rule {
    kernel: String,
    native: bool,
    warning: Option<String>,
    source: String,
}

fn rule(kernel: &str, native: bool, warning: Option<&str>, source: String) -> Rule {
    Rule {
        kernel: kernel.into(),
        native,
        warning: warning.map(str::to_string),
        source,
    }
}

/// Predict what `spec` runs for `input` on card `cc` (`90` for sm_90).
pub fn predict(spec: &EngineSpec, cc: u32, input: &PredictInput) -> EnginePrediction {
    let mut rows = Vec::new();
    for g in &input.linear {
        let r = match spec.engine {
            Engine::Vllm => vllm_linear(spec, cc, g.class, &g.format),
            Engine::Sglang => {
                sglang_linear(spec, cc, g.class, &g.format, input.quant_method.as_deref())
            }
        };
        rows.push(row(g.class, quant_words(&g.format), g.modules.clone(), r));
    }
    let fp8_kv = input
        .kv_cache
        .as_deref()
        .is_some_and(|k| k.to_ascii_uppercase().contains("FP8"));
    // SGLang before 0.5.3 keeps the model dtype for a checkpoint's FP8 KV declaration.
    let ignored =
        fp8_kv && !input.kv_from_flag && spec.engine == Engine::Sglang && spec.version < (0, 5, 3);
    let kv_words = if ignored {
        "FP8 declared by the checkpoint, not followed by this release"
    } else if fp8_kv {
        "FP8 (E4M3)"
    } else {
        "model dtype (BF16/FP16)"
    };
    let attn = attention(spec, cc, fp8_kv && !ignored);
    let attn_kernel = attn.kernel.clone();
    if input.attention {
        rows.push(row(
            LayerClass::Attention,
            format!("softmax attention, KV {kv_words}"),
            "full-attention layers".into(),
            attn,
        ));
    }
    if input.gdn_layers > 0 {
        let r = gdn(spec, cc);
        rows.push(row(
            LayerClass::Gdn,
            format!(
                "recurrence in BF16/FP32; projections {}",
                input.gdn_projections.as_deref().unwrap_or("unknown")
            ),
            format!("{} linear-attention layers", input.gdn_layers),
            r,
        ));
    }
    let kv = kv_cache(spec, cc, fp8_kv, input.kv_from_flag, &attn_kernel);
    rows.push(row(
        LayerClass::KvCache,
        kv_words.into(),
        "every attention layer".into(),
        kv,
    ));
    rows.sort_by_key(|r| r.layer_class);
    EnginePrediction {
        engine: spec.to_string(),
        cc: format!("sm_{cc}"),
        rows,
    }
}

fn row(class: LayerClass, quantization: String, modules: String, r: Rule) -> ClassPrediction {
    ClassPrediction {
        layer_class: class,
        quantization,
        modules,
        kernel: r.kernel,
        native: r.native,
        warning: r.warning,
        rule_source: r.source,
    }
}

/// A format in the table's words.
pub fn quant_words(f: &ModuleFormat) -> String {
    match f {
        ModuleFormat::Nvfp4 {
            activations_4bit: true,
            ..
        } => "NVFP4 W4A4".into(),
        ModuleFormat::Nvfp4 {
            activations_4bit: false,
            ..
        } => "NVFP4 W4A16 (weight-only)".into(),
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// The rules. Each names the file and function it was read from and the releases read (PyPI
// wheels of vLLM 0.23.0–0.34.0 and SGLang 0.5.1–0.5.23, read 2026-12-07; docs/diagnose.md,
// "Prediction rules"). A rule still marked NOT_VERIFIED was not read in those releases.

/// vLLM's NVFP4 W4A4 dense rule on FP4 cards.
const SRC_VLLM_NVFP4_LINEAR: &str = "vllm/model_executor/kernels/linear/__init__.py init_nvfp4_linear_kernel over _POSSIBLE_NVFP4_KERNELS (first whose is_supported passes): 0.23.0 FlashInferCutlassNvFp4LinearKernel, CutlassNvFp4LinearKernel, MarlinNvFp4LinearKernel, …; 0.24.0–0.34.0 FlashInferCuteDslNvFp4LinearKernel first (kernels/linear/nvfp4/flashinfer.py is_supported: is_device_capability_family(100) and FlashInfer), then FlashInferCutlassNvFp4LinearKernel (cutlass_fp4_supported() and has_device_capability(100) and FlashInfer); the W4A16 kernels come after the W4A4 ones in every release";
/// vLLM's NVFP4 W4A4 MoE rule on FP4 cards.
const SRC_VLLM_NVFP4_MOE: &str = "vllm/model_executor/layers/fused_moe/oracle/nvfp4.py select_nvfp4_moe_backend: the first of FLASHINFER_TRTLLM, FLASHINFER_CUTEDSL, FLASHINFER_CUTEDSL_BATCHED, FLASHINFER_CUTLASS, VLLM_CUTLASS, MARLIN, (HUMMING from 0.25.0), EMULATION whose is_supported_config passes; TrtLlmNvFp4ExpertsBase._supports_current_device is_device_capability_family(100); FlashInferExperts (experts/flashinfer_cutlass_moe.py) takes (kNvfp4Static, kNvfp4Dynamic) on has_device_capability(100), so sm_12x gets FlashInfer CUTLASS";
/// vLLM's weight-only NVFP4 dense rule (W4A16, or W4A4 below sm_100).
const SRC_VLLM_W4A16: &str = "vllm/model_executor/kernels/linear/__init__.py init_nvfp4_linear_kernel: W4A16 (use_a16) 0.23.0–0.29.0 force_kernel = MarlinNvFp4LinearKernel; 0.30.0–0.31.0 FlashInferCuteDslNvFp4W4A16LinearKernel when compute_capability in (100, 103), else Marlin; 0.32.0–0.34.0 the same, and on sm_90 (prefers_humming, utils/humming/priority.py _HUMMING_PREFERRED_CAPABILITIES = {90}) Humming before Marlin; W4A4 below sm_100: the auto list reaches MarlinNvFp4LinearKernel (is_fp4_marlin_supported: sm_75+), and from 0.32.0 prioritize_humming puts HummingNvFp4LinearKernel ahead of it on sm_90; the warning: kernels/linear/nvfp4/marlin.py MarlinNvFp4LinearKernel.process_weights_after_loading";
/// vLLM's weight-only NVFP4 MoE rule.
const SRC_VLLM_W4A16_MOE: &str = "vllm/model_executor/layers/fused_moe/oracle/nvfp4.py select_nvfp4_moe_backend: no FlashInfer or CUTLASS expert class accepts BF16 activations (kNvfp4Static, None) nor runs NVFP4 below sm_100, so MARLIN (experts/marlin_moe.py MarlinExpertsBase: sm_75+, any NVFP4 weight) is first in 0.23.0–0.31.0; from 0.32.0 AVAILABLE_BACKENDS = prioritize_humming(AVAILABLE_BACKENDS) puts HUMMING before MARLIN on sm_90 only; the warning: quantization/utils/marlin_utils_fp4.py prepare_nvfp4_moe_layer_for_marlin";
/// vLLM's FP8 W8A8 rule.
const SRC_VLLM_FP8: &str = "vllm/model_executor/kernels/linear/__init__.py init_fp8_linear_kernel → choose_scaled_mm_linear_kernel over _POSSIBLE_FP8_KERNELS (_POSSIBLE_FP8_BLOCK_KERNELS for block scales): 0.23.0–0.28.0 MarlinFP8ScaledMMLinearKernel first, is_supported refusing compute_capability >= 89; 0.29.0–0.34.0 FlashInfer (sm_100+, per-tensor scales), CUTLASS, …, Marlin; CutlassFP8ScaledMMLinearKernel.is_supported checks cutlass_fp8_supported() only from 0.31.0; MoE: fused_moe/oracle/fp8.py _get_priority_backends (TRITON before MARLIN; TritonExperts takes FP8 only when supports_fp8(), sm_89+); the warning: quantization/utils/marlin_utils_fp8.py prepare_fp8_layer_for_marlin, prepare_fp8_moe_layer_for_marlin";
/// vLLM's FP8 weight-only (W8A16) rule.
const SRC_VLLM_W8A16: &str = "vllm/model_executor/kernels/linear/__init__.py init_wfp8_a16_linear_kernel over _POSSIBLE_WFP8A16_KERNELS: 0.23.0–0.24.0 [MarlinFP8ScaledMMLinearKernel]; 0.25.0–0.34.0 [HummingFP8ScaledMMLinearKernel, MarlinFP8ScaledMMLinearKernel] (Humming: sm_75+); MoE: fused_moe/oracle/fp8.py, MARLIN before HUMMING except on sm_90 from 0.32.0 (prioritize_humming)";
/// vLLM's attention backend priorities.
const SRC_VLLM_ATTN: &str = "vllm 0.23.0–0.34.0: vllm/platforms/cuda.py _get_backend_priorities (non-MLA: FLASHINFER first when device_capability.major == 10, else FLASH_ATTN first, then TRITON_ATTN, FLEX_ATTENTION); FlashAttention's version: vllm/v1/attention/backends/fa_utils.py get_flash_attn_version (FA3 on major 9, FA2 below 10); FP8 KV: vllm/v1/attention/backends/flash_attn.py FlashAttentionBackend.supports_kv_cache_dtype (fp8 only with FA3 on is_device_capability_family(90); 0.31.0+ via fa_utils.flash_attn_supports_kv_cache_dtype, which adds FA4 on 10.x), so FP8 KV off sm_90 and 10.x falls to FLASHINFER";
/// vLLM's Gated-DeltaNet kernels.
const SRC_VLLM_GDN: &str = "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py _resolve_gdn_prefill_backend (QwenGatedDeltaNetAttention, used by models/qwen3_next.py and qwen3_5.py): auto → FlashInfer GDN prefill on is_device_capability(90) in 0.23.0–0.34.0; on sm_10x (0.23.0+) and sm_12x (0.30.0+) only with linear_key_head_dim == 128 and a CUDA 13 runtime; else the FLA Triton chunk_gated_delta_rule";
/// vLLM's FP8 KV cache.
const SRC_VLLM_KV: &str = "vllm 0.23.0–0.34.0: vllm/v1/attention/backends/flash_attn.py FlashAttentionBackend.supports_kv_cache_dtype decides whether FlashAttention reads an fp8 / fp8_e4m3 cache; otherwise the next backend of vllm/platforms/cuda.py _get_backend_priorities reads it";
/// SGLang's ModelOpt NVFP4 rule.
const SRC_SGLANG_NVFP4: &str = "read in sglang 0.5.1–0.5.18 and 0.5.23: python/sglang/srt/layers/quantization/modelopt_quant.py ModelOptFp4Config.get_min_capability is 100 in 0.5.1–0.5.12 and 80 from 0.5.13, enforced by python/sglang/srt/model_loader/loader.py _get_quantization_config before any layer is built (so ModelOptNvFp4FusedMoEMethod.__init__'s 'Current platform does not support NVFP4' is never reached); dense GEMM: 0.5.1–0.5.8 FlashInfer mm_fp4 when FlashInfer imports, else sgl-kernel cutlass_scaled_fp4_mm (modelopt_quant.py module imports); 0.5.9 --fp4-gemm-backend flashinfer_cutlass (ServerArgs default); 0.5.10–0.5.23 'auto' resolved by layers/quantization/fp4_utils.py initialize_fp4_gemm_config: 0.5.10–0.5.11 flashinfer_cudnn on sm_12x else flashinfer_cutlass, 0.5.12 also flashinfer_cutedsl on sm_10x, 0.5.13–0.5.23 flashinfer_cutedsl on sm_10x, marlin on sm_80–sm_9x, flashinfer_cutlass otherwise (sm_12x); ModelOptFp4LinearMethod.process_weights_after_loading raises 'native dense GEMM backends require SM100+' only for a native --fp4-gemm-backend below sm_100; MoE experts below sm_100: ModelOptNvFp4FusedMoEMethod.__init__ use_marlin_fallback = (8, 0) <= capability < (10, 0) (0.5.13+), no warning printed";
/// SGLang's compressed-tensors NVFP4 rule.
const SRC_SGLANG_CT_NVFP4: &str = "read in sglang 0.5.1–0.5.10, 0.5.13, 0.5.18 and 0.5.23: python/sglang/srt/layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4.py ships from 0.5.7 (CompressedTensorsW4A4Fp4.get_min_capability 100 in every release read), checked by compressed_tensors.py CompressedTensorsConfig._check_scheme_supported";
/// SGLang's FP8 rule.
const SRC_SGLANG_FP8: &str = "python/sglang/srt/layers/quantization/fp8_utils.py cutlass_fp8_supported (sm_89 with CUDA 12.4+, sm_90 and up with CUDA 12.0+) and can_auto_enable_marlin_fp8 (80 <= sm < 89), read 0.5.1–0.5.23; below sm_89: Fp8LinearMethod.__init__ (quantization/fp8.py, `fp8` checkpoints) takes Marlin in 0.5.1–0.5.23, ModelOptFp8LinearMethod.__init__ (quantization/modelopt_quant.py, ModelOpt FP8) only from 0.5.17 (use_marlin absent in 0.5.1–0.5.16)";
/// SGLang's FP8 rule on FP8 cards: which native GEMM (CUTLASS, DeepGEMM, Triton, FlashInfer)
/// serves each scaling was not read.
const SRC_SGLANG_FP8_NATIVE: &str = "sglang 0.5: python/sglang/srt/layers/quantization/fp8_utils.py apply_fp8_linear / the --fp8-gemm-backend runner (which native FP8 GEMM serves each scaling)";
/// SGLang's attention default (MHA models, no speculative decoding with topk > 1).
const SRC_SGLANG_ATTN: &str = "the default attention backend, read in sglang 0.5.1–0.5.10, 0.5.13, 0.5.18 and 0.5.23: 0.5.1–0.5.4 python/sglang/srt/model_executor/model_runner.py ModelRunner.model_specific_adjustment, 0.5.5–0.5.9 python/sglang/srt/server_args.py ServerArgs._handle_attention_backend_compatibility, 0.5.10–0.5.18 ServerArgs._get_default_attn_backend, 0.5.23 python/sglang/srt/arg_groups/model_override_base.py get_default_attn_backend: MHA on sm_9x (is_hopper_with_cuda_12_3) 'fa3', before 0.5.8 only when architectures[0] is in is_fa3_default_architecture (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, Gemma2/3, Glm4MoeForCausalLM, …), else 'flashinfer'; on sm_10x (is_sm100_supported: capability major 10, CUDA 12.8+) 'trtllm_mha' from 0.5.7 ('fa4' from 0.5.17 when the model's K and V head widths differ), 'flashinfer' before; elsewhere 'flashinfer' when FlashInfer is installed (and, from 0.5.13, the model has no attention sinks), else 'triton'; MLA models: 'fa3' on sm_9x, 'flashinfer' on sm_10x, 'triton' elsewhere; the log says `Attention backend not (explicitly) specified. Use X backend by default.`";
/// SGLang's Gated-DeltaNet kernels.
const SRC_SGLANG_GDN: &str = "read in sglang 0.5.1–0.5.10, 0.5.13, 0.5.18 and 0.5.23: python/sglang/srt/models/qwen3_next.py first ships in 0.5.2 (0.5.1 has no Gated-DeltaNet model); python/sglang/srt/layers/attention/hybrid_linear_attn_backend.py runs the FLA Triton chunk_gated_delta_rule (layers/attention/fla) in 0.5.2–0.5.23; ServerArgs.linear_attn_backend defaults to 'triton' (0.5.10+); ServerArgs._handle_linear_attn_backend (0.5.13+) sets --linear-attn-decode-backend flashinfer on sm_10x when mamba_ssm_dtype is bfloat16";
/// SGLang's KV-cache dtype.
const SRC_SGLANG_KV: &str = "read in sglang 0.5.1–0.5.10, 0.5.13–0.5.18 and 0.5.23: --kv-cache-dtype auto is the model dtype in 0.5.1–0.5.2 (python/sglang/srt/model_executor/model_runner.py ModelRunner.init_memory_pool), whatever the checkpoint declares; from 0.5.3 a checkpoint whose quant config has kv_cache_quant_algo FP8 gets float8_e4m3fn (ModelRunner.configure_kv_cache_dtype in 0.5.3–0.5.15, python/sglang/srt/mem_cache/kv_cache_dtype.py configure_kv_cache_dtype in 0.5.16–0.5.23); 0.5.3–0.5.10 log `Using KV cache dtype: …`";

/// The error SGLang 0.5.13 and later raise for NVFP4 dense layers below sm_100 when
/// `--fp4-gemm-backend` names a native backend (`python/sglang/srt/layers/quantization/modelopt_quant.py`,
/// `ModelOptFp4LinearMethod.process_weights_after_loading`); the default `auto` takes Marlin
/// there instead (`fp4_utils.py` `initialize_fp4_gemm_config`), so no prediction states it.
pub const SGLANG_NVFP4_DENSE_ERROR: &str = "ValueError: ModelOpt NVFP4 native dense GEMM backends require SM100+. Use --fp4-gemm-backend marlin on SM80-SM90.";

/// A rule not read in the releases covered: its text with the [`NOT_VERIFIED`] suffix.
fn src(s: &str) -> String {
    format!("{s} {NOT_VERIFIED}")
}

/// A rule read in the releases covered: its text with the version range it holds for.
fn read(range: &str, s: &str) -> String {
    format!("vllm {range}: {s}")
}

/// `0.32.0` for a version triple.
fn vstr(v: (u32, u32, u32)) -> String {
    format!("{}.{}.{}", v.0, v.1, v.2)
}

/// vLLM: the kernel of a linear group (dense or MoE) of format `f` on card `cc`.
fn vllm_linear(spec: &EngineSpec, cc: u32, class: LayerClass, f: &ModuleFormat) -> Rule {
    let moe = class == LayerClass::MoeExperts;
    match f {
        ModuleFormat::Nvfp4 {
            activations_4bit, ..
        } => vllm_nvfp4(spec, cc, moe, *activations_4bit),
        ModuleFormat::Fp8 {
            activations,
            scaling,
        } if activations != "weight-only" => vllm_fp8(spec.version, cc, moe, scaling),
        ModuleFormat::Fp8 { .. } => vllm_w8a16(spec.version, cc, moe),
        ModuleFormat::Bf16 | ModuleFormat::F16 => unquantized(moe),
        other => no_rule(other),
    }
}

/// vLLM FP8 W8A8: native from sm_89; below, Marlin (or, in 0.29–0.30 for per-tensor and
/// per-channel scales, the CUTLASS kernel, whose `is_supported` had no capability check).
fn vllm_fp8(v: (u32, u32, u32), cc: u32, moe: bool, scaling: &str) -> Rule {
    let block = scaling.starts_with("block") || scaling.starts_with("group");
    let s = read(&format!("{} (read 0.23.0–0.34.0)", vstr(v)), SRC_VLLM_FP8);
    if cc >= 89 {
        let k = if moe {
            "FP8 fused MoE (first of FlashInfer TRT-LLM, FlashInfer CUTLASS, DeepGEMM, vLLM CUTLASS, Triton whose checks pass)"
        } else if block {
            "block-scaled FP8 GEMM (first of FlashInfer DeepGEMM, DeepGEMM, CUTLASS block whose checks pass)"
        } else if cc >= 100 && scaling == "per-tensor" {
            "FlashInfer FP8 scaled_mm"
        } else {
            "CUTLASS FP8 scaled_mm"
        };
        return rule(k, true, None, s);
    }
    if !moe && !block && ((0, 29, 0)..(0, 31, 0)).contains(&v) {
        return rule(
            "vLLM CUTLASS FP8 scaled_mm (selected although the card has no FP8 units: CutlassFP8ScaledMMLinearKernel.is_supported checks no capability before 0.31)",
            false,
            None,
            s,
        );
    }
    rule(
        "Marlin (FP8 weight-only)",
        false,
        Some(MARLIN_FP8_WARNING),
        s,
    )
}

/// vLLM FP8 weight-only (W8A16): Humming for dense layers from 0.25, Marlin before; MoE
/// experts on Marlin except on sm_90 from 0.32 (Humming).
fn vllm_w8a16(v: (u32, u32, u32), cc: u32, moe: bool) -> Rule {
    let s = read(&format!("{} (read 0.23.0–0.34.0)", vstr(v)), SRC_VLLM_W8A16);
    let humming = if moe {
        cc == 90 && v >= (0, 32, 0)
    } else {
        v >= (0, 25, 0)
    };
    if humming {
        rule("Humming (FP8 weight-only, W8A16)", false, None, s)
    } else {
        rule(
            "Marlin (FP8 weight-only, W8A16)",
            false,
            Some(MARLIN_FP8_WARNING),
            s,
        )
    }
}

fn unquantized(moe: bool) -> Rule {
    if moe {
        rule(
            "Triton fused MoE (unquantized)",
            true,
            None,
            src("unquantized experts: vllm/model_executor/layers/fused_moe/oracle/unquantized.py (not read)"),
        )
    } else {
        rule(
            "cuBLAS GEMM (torch linear)",
            true,
            None,
            src("vllm 0.23–0.34: vllm/model_executor/layers/linear.py UnquantizedLinearMethod.apply (F.linear, cuBLAS; rigbench's reading, not read)"),
        )
    }
}

fn no_rule(f: &ModuleFormat) -> Rule {
    rule(
        "not predicted",
        false,
        None,
        format!("rigbench has no prediction rule for {f} yet"),
    )
}

/// vLLM NVFP4: native W4A4 on sm_100 and up, else the weight-only rules.
fn vllm_nvfp4(spec: &EngineSpec, cc: u32, moe: bool, w4a4: bool) -> Rule {
    let v = spec.version;
    let range = format!("{} (read 0.23.0–0.34.0)", vstr(v));
    if w4a4 && cc >= 100 {
        let k = match (moe, cc) {
            (false, 100 | 103) if v >= (0, 24, 0) => "FlashInfer CuTe-DSL (W4A4)",
            (false, _) => "FlashInfer CUTLASS",
            (true, 100 | 103) => "FlashInfer TRT-LLM",
            (true, _) => "FlashInfer CUTLASS",
        };
        let s = if moe {
            SRC_VLLM_NVFP4_MOE
        } else {
            SRC_VLLM_NVFP4_LINEAR
        };
        return rule(k, true, None, read(&range, s));
    }
    let (k, s) = if moe {
        (vllm_w4a16_moe_kernel(v, cc), SRC_VLLM_W4A16_MOE)
    } else if w4a4 {
        // W4A4 below sm_100: the auto list, where only Marlin (and Humming from 0.32 on
        // sm_90) accept the card.
        (vllm_w4a16_moe_kernel(v, cc), SRC_VLLM_W4A16)
    } else {
        let k = vllm_w4a16_kernel(Some(&vstr(v)), cc).0.unwrap_or("Marlin");
        (k, SRC_VLLM_W4A16)
    };
    let warning = (k == "Marlin").then_some(MARLIN_FP4_WARNING);
    rule(k, false, warning, read(&range, s))
}

/// SGLang: the kernel of a linear group.
fn sglang_linear(
    spec: &EngineSpec,
    cc: u32,
    class: LayerClass,
    f: &ModuleFormat,
    method: Option<&str>,
) -> Rule {
    let moe = class == LayerClass::MoeExperts;
    let v = spec.version;
    match f {
        ModuleFormat::Nvfp4 {
            activations_4bit: true,
            ..
        } => sglang_nvfp4(v, cc, moe, method),
        ModuleFormat::Nvfp4 { .. } => rule(
            "not predicted",
            false,
            None,
            "sglang 0.5: python/sglang/srt/layers/quantization/modelopt_quant.py: how SGLang runs weight-only (W4A16) NVFP4 was not read; no rule".into(),
        ),
        ModuleFormat::Fp8 { activations, .. } if activations != "weight-only" && cc >= 89 => {
            let k = if moe {
                "FP8 fused MoE (Triton / CUTLASS / DeepGEMM)"
            } else {
                "FP8 GEMM (CUTLASS / DeepGEMM / Triton)"
            };
            rule(k, true, None, src(SRC_SGLANG_FP8_NATIVE))
        }
        ModuleFormat::Fp8 { .. } => sglang_fp8_weight_only(v, cc),
        ModuleFormat::Bf16 | ModuleFormat::F16 => {
            let mut r = unquantized(moe);
            r.source = src("sglang 0.5: python/sglang/srt/layers/linear.py UnquantizedLinearMethod.apply / Triton fused MoE (not read)");
            r
        }
        other => no_rule(other),
    }
}

/// SGLang FP8 below sm_89 (or weight-only FP8): Marlin on sm_80–sm_88 for `fp8` checkpoints in
/// every 0.5 release, for ModelOpt FP8 checkpoints only from 0.5.17; below sm_80 no FP8 path.
fn sglang_fp8_weight_only(v: (u32, u32, u32), cc: u32) -> Rule {
    let s = sglang_read(v, SRC_SGLANG_FP8);
    if cc < 80 {
        return rule(
            "none: no FP8 kernel below sm_80 (can_auto_enable_marlin_fp8 needs 80 <= sm < 89)",
            false,
            None,
            s,
        );
    }
    let k = if v >= (0, 5, 17) {
        "Marlin (FP8 weight-only)"
    } else {
        "Marlin (FP8 weight-only) for `fp8` checkpoints; ModelOpt FP8 checkpoints get no weight-only fallback before 0.5.17"
    };
    rule(k, false, None, s)
}

/// A rule read in the SGLang releases covered: its text with the version predicted for.
fn sglang_read(v: (u32, u32, u32), s: &str) -> String {
    format!("sglang {}: {s}", vstr(v))
}

/// SGLang NVFP4 W4A4, by the checkpoint's method. ModelOpt: the loader refuses cards below the
/// config's minimum capability (100 before 0.5.13, then 80); from 0.5.13 sm_80–sm_9x run
/// weight-only Marlin (dense through `--fp4-gemm-backend auto`, MoE through the Marlin
/// fallback); on FP4 cards the dense GEMM backend follows the release. compressed-tensors: no
/// NVFP4 scheme before 0.5.7, then sm_100 and up only.
fn sglang_nvfp4(v: (u32, u32, u32), cc: u32, moe: bool, method: Option<&str>) -> Rule {
    if method.is_some_and(|m| m.contains("compressed")) {
        let s = sglang_read(v, SRC_SGLANG_CT_NVFP4);
        if v < (0, 5, 7) {
            return rule(
                "none: no compressed-tensors NVFP4 scheme before SGLang 0.5.7",
                false,
                None,
                s,
            );
        }
        if cc < 100 {
            return rule(
                "none: the load fails (CompressedTensorsW4A4Fp4 needs sm_100)",
                false,
                Some(&sglang_ct_scheme_error(cc)),
                s,
            );
        }
        // Which native kernel the compressed-tensors scheme calls was not read.
        return rule("FlashInfer / CUTLASS FP4 (native)", true, None, src(&s));
    }
    let s = sglang_read(v, SRC_SGLANG_NVFP4);
    let min = if v >= (0, 5, 13) { 80 } else { 100 };
    if cc < min {
        return rule(
            "none: the load fails (ModelOptFp4Config.get_min_capability)",
            false,
            Some(&sglang_min_capability_error("modelopt_fp4", min, cc)),
            s,
        );
    }
    if moe {
        if cc >= 100 {
            // Which fused-MoE runner `auto` picks for NVFP4 was not read.
            return rule(
                "FlashInfer CUTLASS / TRT-LLM fused MoE (--moe-runner-backend)",
                true,
                None,
                src(&s),
            );
        }
        return rule("Marlin", false, None, s);
    }
    let k = if cc < 100 {
        "Marlin (--fp4-gemm-backend auto; weight-only)"
    } else if v < (0, 5, 9) {
        "FlashInfer mm_fp4 (sgl-kernel CUTLASS when FlashInfer is missing)"
    } else if v < (0, 5, 10) {
        "FlashInfer CUTLASS (--fp4-gemm-backend flashinfer_cutlass)"
    } else if cc / 10 == 12 && v < (0, 5, 13) {
        "FlashInfer cuDNN (--fp4-gemm-backend auto)"
    } else if cc / 10 == 10 && v >= (0, 5, 12) {
        "FlashInfer CuTe-DSL (--fp4-gemm-backend auto)"
    } else {
        "FlashInfer CUTLASS (--fp4-gemm-backend auto)"
    };
    rule(k, cc >= 100, None, s)
}

/// The attention backend.
fn attention(spec: &EngineSpec, cc: u32, fp8_kv: bool) -> Rule {
    match spec.engine {
        Engine::Vllm => {
            let k = if cc / 10 == 10 {
                "FlashInfer"
            } else if fp8_kv && cc != 90 {
                "FlashInfer (FlashAttention takes FP8 KV only as FA3 on sm_90)"
            } else if cc == 90 {
                "FlashAttention 3"
            } else {
                "FlashAttention 2"
            };
            rule(k, true, None, SRC_VLLM_ATTN.into())
        }
        Engine::Sglang => sglang_attention(spec.version, cc),
    }
}

/// SGLang's default attention backend for MHA models (no `--attention-backend`, no speculative
/// decoding with topk > 1).
fn sglang_attention(v: (u32, u32, u32), cc: u32) -> Rule {
    let k = match cc / 10 {
        9 if v >= (0, 5, 8) => "FlashAttention 3 (fa3)",
        9 => "FlashAttention 3 (fa3) for the architectures of is_fa3_default_architecture (Llama, Qwen2, Qwen3, Qwen3-MoE, Gemma 2/3, GLM-4 MoE), else FlashInfer",
        10 if v >= (0, 5, 17) => "TRT-LLM MHA (trtllm_mha; fa4 when K and V head widths differ)",
        10 if v >= (0, 5, 7) => "TRT-LLM MHA (trtllm_mha)",
        _ => "FlashInfer (Triton when FlashInfer is missing or the model has attention sinks)",
    };
    rule(k, true, None, sglang_read(v, SRC_SGLANG_ATTN))
}

/// The Gated-DeltaNet recurrence (prefill kernel; decode not predicted per version).
fn gdn(spec: &EngineSpec, cc: u32) -> Rule {
    match spec.engine {
        Engine::Vllm => {
            let v = spec.version;
            let conditional = cc / 10 == 10 || (cc / 10 == 12 && v >= (0, 30, 0));
            let k = if cc == 90 {
                "FlashInfer GDN prefill (auto on sm_90)"
            } else if conditional {
                "FlashInfer GDN prefill when linear_key_head_dim is 128 and the CUDA runtime is 13+, else FLA Triton chunk_gated_delta_rule"
            } else {
                "FLA Triton chunk_gated_delta_rule (prefill)"
            };
            let s = read(&format!("{} (read 0.23.0–0.34.0)", vstr(v)), SRC_VLLM_GDN);
            rule(k, true, None, s)
        }
        Engine::Sglang => {
            let v = spec.version;
            let s = sglang_read(v, SRC_SGLANG_GDN);
            if v < (0, 5, 2) {
                rule(
                    "none: SGLang 0.5.1 has no Gated-DeltaNet model (qwen3_next.py ships from 0.5.2)",
                    false,
                    None,
                    s,
                )
            } else if cc / 10 == 10 && v >= (0, 5, 13) {
                rule("FLA Triton chunk_gated_delta_rule (prefill); FlashInfer GDN decode when mamba_ssm_dtype is bfloat16", true, None, s)
            } else {
                rule(
                    "FLA Triton chunk_gated_delta_rule (hybrid linear attention backend)",
                    true,
                    None,
                    s,
                )
            }
        }
    }
}

/// The KV cache: its dtype and who reads it. `from_flag`: the FP8 dtype came from
/// `--kv-cache-dtype`, not from the checkpoint's declaration.
fn kv_cache(spec: &EngineSpec, cc: u32, fp8_kv: bool, from_flag: bool, attn_kernel: &str) -> Rule {
    let source = match spec.engine {
        Engine::Vllm => SRC_VLLM_KV.into(),
        Engine::Sglang => sglang_read(spec.version, SRC_SGLANG_KV),
    };
    if fp8_kv && !from_flag && spec.engine == Engine::Sglang && spec.version < (0, 5, 3) {
        return rule(
            &format!("16-bit cache (model dtype: this release ignores the checkpoint's FP8 KV declaration without --kv-cache-dtype fp8_e4m3), read by {attn_kernel}"),
            true,
            None,
            source,
        );
    }
    if fp8_kv {
        // FP8 E4M3 tensor-core arithmetic exists from sm_89; below that the cache is upcast.
        rule(
            &format!("FP8 E4M3 cache, read by {attn_kernel}"),
            cc >= 89,
            None,
            source,
        )
    } else {
        rule(
            &format!("16-bit cache, read by {attn_kernel}"),
            true,
            None,
            source,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nvfp4(a4: bool) -> ModuleFormat {
        ModuleFormat::Nvfp4 {
            activations_4bit: a4,
            group_size: 16,
        }
    }

    #[test]
    fn engine_flags_parse_and_refuse() {
        let s: EngineSpec = "vllm==0.34".parse().unwrap();
        assert_eq!(s.version, (0, 34, 0));
        assert_eq!(
            "SGLang==0.5.3".parse::<EngineSpec>().unwrap().engine,
            Engine::Sglang
        );
        for bad in [
            "vllm",
            "vllm==0.22",
            "vllm==0.35",
            "trt==1.0",
            "sglang==0.4",
            "vllm==x",
        ] {
            let e = bad.parse::<EngineSpec>().unwrap_err();
            assert!(e.contains("ENGINE==VERSION"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_weight_only_boundaries_hold_for_dense_and_moe() {
        let v = |s: &str| s.parse::<EngineSpec>().unwrap();
        let k = |spec: &EngineSpec, cc, class| vllm_linear(spec, cc, class, &nvfp4(false)).kernel;
        let dense = LayerClass::DenseLinear;
        let moe = LayerClass::MoeExperts;
        assert_eq!(k(&v("vllm==0.31"), 90, dense), "Marlin");
        assert_eq!(k(&v("vllm==0.32"), 90, dense), "Humming");
        assert_eq!(k(&v("vllm==0.29"), 100, dense), "Marlin");
        assert_eq!(k(&v("vllm==0.30"), 100, dense), "FlashInfer CuTe-DSL");
        assert_eq!(k(&v("vllm==0.34"), 121, dense), "Marlin");
        // MoE experts: no FlashInfer backend takes BF16 activations.
        assert_eq!(k(&v("vllm==0.34"), 100, moe), "Marlin");
        assert_eq!(k(&v("vllm==0.32"), 90, moe), "Humming");
        assert_eq!(k(&v("vllm==0.31"), 90, moe), "Marlin");
        let (kernel, why) = vllm_w4a16_kernel(None, 90);
        assert_eq!(kernel, None);
        assert!(why.contains("0.32"), "{why}");
    }

    #[test]
    fn kernel_names_map_to_families() {
        assert_eq!(
            kernel_family("FlashInferCutlassNvFp4LinearKernel"),
            "FlashInfer CUTLASS"
        );
        assert_eq!(kernel_family("NvFp4LinearBackend.MARLIN"), "Marlin");
        assert_eq!(kernel_family("VLLM_CUTLASS"), "vLLM CUTLASS");
        assert_eq!(kernel_family("FlashInfer CuteDSL"), "FlashInfer CuTe-DSL");
        assert_eq!(kernel_family("FLASHINFER_TRTLLM"), "FlashInfer TRT-LLM");
    }
}
