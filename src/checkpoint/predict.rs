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
//! Sources: each rule's `rule_source` names the engine file and function it was read from. The
//! engines' sources read were stored revisions whose release could not be identified (the
//! snapshots hold no tags), so every rule says "not verified against this version's source";
//! the version ranges are the ones rigbench documents (docs/diagnose.md, "Prediction rules").

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::format::ModuleFormat;

/// The suffix of every rule whose version range could not be checked against that version's
/// own source.
pub const NOT_VERIFIED: &str = "(not verified against this version's source)";

/// The warning vLLM prints when NVFP4 layers go to Marlin
/// (`vllm/model_executor/layers/quantization/utils/marlin_utils_fp4.py`,
/// `prepare_fp4_layer_for_marlin` and `prepare_nvfp4_moe_layer_for_marlin`).
pub const MARLIN_FP4_WARNING: &str = "Your GPU does not have native support for FP4 computation but FP4 quantization is being used. Weight-only FP4 compression will be used leveraging the Marlin kernel. This may degrade performance for compute-heavy workloads.";

/// The warning vLLM prints when FP8 layers go to Marlin on cards below sm_89
/// (`vllm/model_executor/layers/quantization/utils/marlin_utils_fp8.py`,
/// `prepare_fp8_layer_for_marlin`).
pub const MARLIN_FP8_WARNING: &str = "Your GPU does not have native support for FP8 computation but FP8 quantization is being used. Weight-only FP8 compression will be used leveraging the Marlin kernel. This may degrade performance for compute-heavy workloads.";

/// The error SGLang raises for NVFP4 below sm_100 (`python/sglang/srt/layers/quantization/
/// modelopt_quant.py`, `ModelOptNvFp4FusedMoEMethod.__init__`).
pub const SGLANG_NVFP4_ERROR: &str = "ValueError: Current platform does not support NVFP4 quantization. Please use Blackwell and above.";

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

/// The kernel a vLLM build runs weight-only NVFP4 layers on for card `cc`: `(kernel, why)`;
/// the kernel is `None` when it depends on a version the caller does not know. Before 0.33,
/// Marlin on every card; from 0.33, Humming on sm_90, FlashInfer CuTe-DSL on sm_100 and sm_103,
/// Marlin elsewhere (sm_120 and sm_121 included). docs/diagnose.md, "Which kernel runs
/// weight-only (W4A16) NVFP4 layers".
pub fn vllm_w4a16_kernel(version: Option<&str>, cc: u32) -> (Option<&'static str>, String) {
    let newer = match cc {
        90 => Some("Humming"),
        100 | 103 => Some("FlashInfer CuTe-DSL"),
        _ => None,
    };
    let Some(newer) = newer else {
        return (
            Some("Marlin"),
            format!("vLLM runs weight-only NVFP4 on Marlin on sm_{cc} in every version"),
        );
    };
    match version.and_then(version_triple) {
        Some(v) if v >= (0, 33, 0) => (
            Some(newer),
            format!(
                "vLLM {}.{}.{} runs weight-only NVFP4 on {newer} on sm_{cc} (0.33 and later)",
                v.0, v.1, v.2
            ),
        ),
        Some(v) => (
            Some("Marlin"),
            format!(
                "vLLM {}.{}.{} runs weight-only NVFP4 on Marlin on every card (before 0.33)",
                v.0, v.1, v.2
            ),
        ),
        None => (
            None,
            format!(
                "vLLM before 0.33 runs weight-only NVFP4 on Marlin on every card; 0.33 and later run it on {newer} on sm_{cc}, and the log does not state the version"
            ),
        ),
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
            Engine::Sglang => sglang_linear(cc, g.class, &g.format),
        };
        rows.push(row(g.class, quant_words(&g.format), g.modules.clone(), r));
    }
    let fp8_kv = input
        .kv_cache
        .as_deref()
        .is_some_and(|k| k.to_ascii_uppercase().contains("FP8"));
    let kv_words = if fp8_kv {
        "FP8 (E4M3)"
    } else {
        "model dtype (BF16/FP16)"
    };
    let attn = attention(spec, cc, fp8_kv);
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
        let r = gdn(spec);
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
    let kv = kv_cache(spec, cc, fp8_kv, &attn_kernel);
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
// The rules. Each names its source; see the module docs for what "verified" means here.

/// vLLM's NVFP4 linear rule (W4A4 on sm_100 and up).
const SRC_VLLM_NVFP4_LINEAR: &str = "vllm 0.23–0.34: vllm/model_executor/layers/quantization/utils/nvfp4_utils.py select_nvfp4_linear_backend (auto: FlashInfer CUTLASS when the card is sm_100 or newer and FlashInfer is installed, else vLLM CUTLASS when its FP4 kernels were built for the card, else Marlin; read in a stored revision of the NvFp4LinearBackend form, release not identified; later revisions name kernel classes such as FlashInferCutlassNvFp4LinearKernel)";
/// vLLM's NVFP4 MoE rule.
const SRC_VLLM_NVFP4_MOE: &str = "vllm 0.23–0.34: vllm/model_executor/layers/fused_moe/oracle/nvfp4.py select_nvfp4_moe_backend (the first of AVAILABLE_BACKENDS FLASHINFER_TRTLLM, FLASHINFER_CUTEDSL, FLASHINFER_CUTEDSL_BATCHED, FLASHINFER_CUTLASS, VLLM_CUTLASS, MARLIN, HUMMING, EMULATION whose is_supported_config passes; read at revision 01362014; each kernel's per-card is_supported_config not read)";
/// The weight-only NVFP4 boundary of docs/diagnose.md.
const SRC_VLLM_W4A16: &str = "vllm 0.23–0.32: Marlin on every card; vllm 0.33–0.34: Humming on sm_90, FlashInfer CuTe-DSL on sm_100/sm_103, Marlin elsewhere (rigbench's documented boundary, docs/diagnose.md 'Which kernel runs weight-only (W4A16) NVFP4 layers'; the Marlin warning: vllm/model_executor/layers/quantization/utils/marlin_utils_fp4.py prepare_fp4_layer_for_marlin, prepare_nvfp4_moe_layer_for_marlin)";
/// vLLM ≤ 0.29 on sm_12x: the W4A16 CuTe-DSL kernel before the W4A4 ones.
const SRC_VLLM_12X_W4A16_FIRST: &str = "vllm 0.23–0.29 on sm_120/sm_121: NVFP4 linear kernel order, FlashInferCuteDslNvFp4W4A16LinearKernel before the W4A4 kernels (rigbench's documented rule, docs/diagnose.md 'fp4-weight-only')";
/// vLLM's FP8 linear / MoE rule.
const SRC_VLLM_FP8: &str = "vllm 0.23–0.34: vllm/model_executor/layers/quantization/fp8.py Fp8LinearMethod.__init__ and Fp8MoEMethod.__init__ (use_marlin = not has_device_capability(89)); warning: vllm/model_executor/layers/quantization/utils/marlin_utils_fp8.py prepare_fp8_layer_for_marlin (read in several stored revisions, releases not identified)";
/// vLLM's attention backend priorities.
const SRC_VLLM_ATTN: &str = "vllm 0.23–0.34: vllm/platforms/cuda.py _get_backend_priorities (non-MLA: FLASHINFER first on compute capability 10.x, FLASH_ATTN first elsewhere, then TRITON_ATTN, FLEX_ATTENTION) and CudaPlatformBase.get_attn_backend_cls (the first whose validate_configuration passes; read at revision 002db495; FP8 KV on FlashAttention only with FA3 on sm_90 is rigbench's reading, validate_configuration not read)";
/// vLLM's Gated-DeltaNet kernels.
const SRC_VLLM_GDN: &str = "vllm 0.23–0.34: vllm/model_executor/models/qwen3_next.py Qwen3NextGatedDeltaNet with vllm/model_executor/layers/fla/ops chunk_gated_delta_rule (prefill) and fused_recurrent_gated_delta_rule (decode) (imports read in stored revisions, releases not identified; newer revisions also carry a FlashInfer GDN decode kernel, not predicted)";
/// vLLM's FP8 KV cache.
const SRC_VLLM_KV: &str = "vllm 0.23–0.34: the checkpoint's kv_cache_quant_algo / kv_cache_scheme or --kv-cache-dtype fp8 stores the cache as FP8 E4M3 ('Using fp8 data type to store kv cache'), read by the attention backend of vllm/platforms/cuda.py get_attn_backend_cls (rigbench's reading)";
/// SGLang's NVFP4 rule.
const SRC_SGLANG_NVFP4: &str = "sglang 0.5: python/sglang/srt/layers/quantization/modelopt_quant.py ModelOptNvFp4FusedMoEMethod.__init__ (is_sm100_supported, else the ValueError) and compressed_tensors_w4a4_nvfp4_moe.py CompressedTensorsW4A4Nvfp4MoE.__init__ (is_blackwell_supported); ModelOptFp4LinearMethod alike; FlashInfer / sgl-kernel CUTLASS FP4 on sm_100 and up (read in stored revisions, releases not identified; later revisions add a Marlin fallback on sm_80–sm_90 behind --fp4-gemm-backend / --moe-runner-backend marlin)";
/// SGLang's FP8 rule.
const SRC_SGLANG_FP8: &str = "sglang 0.5: python/sglang/srt/layers/quantization/modelopt_quant.py ModelOptFp8LinearMethod.__init__ (cutlass_fp8_supported; Marlin when can_auto_enable_marlin_fp8, i.e. below sm_89) (read in a stored revision, release not identified)";
/// SGLang's attention default.
const SRC_SGLANG_ATTN: &str = "sglang 0.5: python/sglang/srt/server_args.py ServerArgs attention-backend default (FlashAttention-3 'fa3' on sm_90, 'trtllm_mha' / FlashInfer on sm_100, FlashInfer elsewhere; not read)";
/// SGLang's GDN kernels.
const SRC_SGLANG_GDN: &str = "sglang 0.5: python/sglang/srt/layers/attention/hybrid_linear_attn_backend.py with the FLA Triton kernels of python/sglang/srt/layers/attention/fla (not read)";

fn src(s: &str) -> String {
    format!("{s} {NOT_VERIFIED}")
}

/// vLLM: the kernel of a linear group (dense or MoE) of format `f` on card `cc`.
fn vllm_linear(spec: &EngineSpec, cc: u32, class: LayerClass, f: &ModuleFormat) -> Rule {
    let moe = class == LayerClass::MoeExperts;
    match f {
        ModuleFormat::Nvfp4 {
            activations_4bit, ..
        } => vllm_nvfp4(spec, cc, moe, *activations_4bit),
        ModuleFormat::Fp8 { activations, .. } if activations != "weight-only" => {
            if cc >= 89 {
                let k = if moe {
                    "FP8 fused MoE (backend by fused_moe/oracle/fp8.py)"
                } else {
                    "CUTLASS FP8 scaled_mm"
                };
                rule(k, true, None, src(SRC_VLLM_FP8))
            } else {
                rule(
                    "Marlin (FP8 weight-only)",
                    false,
                    Some(MARLIN_FP8_WARNING),
                    src(SRC_VLLM_FP8),
                )
            }
        }
        ModuleFormat::Fp8 { .. } => rule(
            "Marlin (FP8 weight-only, W8A16)",
            false,
            Some(MARLIN_FP8_WARNING),
            src(SRC_VLLM_FP8),
        ),
        ModuleFormat::Bf16 | ModuleFormat::F16 => unquantized(moe),
        other => no_rule(other),
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

/// vLLM NVFP4: native W4A4 on sm_100 and up, else the weight-only rule.
fn vllm_nvfp4(spec: &EngineSpec, cc: u32, moe: bool, w4a4: bool) -> Rule {
    if w4a4 && cc >= 100 {
        if !moe && matches!(cc, 120 | 121) && spec.version < (0, 30, 0) {
            return rule(
                "FlashInfer CuTe-DSL (W4A16)",
                false,
                None,
                src(SRC_VLLM_12X_W4A16_FIRST),
            );
        }
        let k = match (moe, cc) {
            (false, _) => "FlashInfer CUTLASS",
            (true, 100 | 103) => "FlashInfer TRT-LLM",
            (true, _) => "FlashInfer CUTLASS",
        };
        let s = if moe {
            SRC_VLLM_NVFP4_MOE
        } else {
            SRC_VLLM_NVFP4_LINEAR
        };
        return rule(k, true, None, src(s));
    }
    let v = format!("{}.{}.{}", spec.version.0, spec.version.1, spec.version.2);
    let (k, _) = vllm_w4a16_kernel(Some(&v), cc);
    let k = k.unwrap_or("Marlin");
    let warning = (k == "Marlin").then_some(MARLIN_FP4_WARNING);
    let mut s = SRC_VLLM_W4A16.to_string();
    if moe && cc == 90 && spec.version >= (0, 33, 0) {
        s.push_str("; for MoE experts the oracle revision read (fused_moe/oracle/nvfp4.py select_nvfp4_moe_backend, 01362014) lists MARLIN before HUMMING, so the MoE half of this boundary is open");
    }
    rule(k, false, warning, src(&s))
}

/// SGLang: the kernel of a linear group.
fn sglang_linear(cc: u32, class: LayerClass, f: &ModuleFormat) -> Rule {
    let moe = class == LayerClass::MoeExperts;
    match f {
        ModuleFormat::Nvfp4 {
            activations_4bit: true,
            ..
        } => {
            if cc >= 100 {
                let k = if moe {
                    "FlashInfer CUTLASS / TRT-LLM fused MoE (--moe-runner-backend)"
                } else {
                    "FlashInfer / sgl-kernel CUTLASS FP4 GEMM"
                };
                rule(k, true, None, src(SRC_SGLANG_NVFP4))
            } else {
                rule(
                    "none: the load fails",
                    false,
                    Some(SGLANG_NVFP4_ERROR),
                    src(SRC_SGLANG_NVFP4),
                )
            }
        }
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
            rule(k, true, None, src(SRC_SGLANG_FP8))
        }
        ModuleFormat::Fp8 { .. } => {
            rule("Marlin (FP8 weight-only)", false, None, src(SRC_SGLANG_FP8))
        }
        ModuleFormat::Bf16 | ModuleFormat::F16 => {
            let mut r = unquantized(moe);
            r.source = src("sglang 0.5: python/sglang/srt/layers/linear.py UnquantizedLinearMethod.apply / Triton fused MoE (not read)");
            r
        }
        other => no_rule(other),
    }
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
            rule(k, true, None, src(SRC_VLLM_ATTN))
        }
        Engine::Sglang => {
            let k = match cc {
                90 => "FlashAttention 3 (fa3)",
                100 | 103 => "TRT-LLM MHA / FlashInfer",
                _ => "FlashInfer",
            };
            rule(k, true, None, src(SRC_SGLANG_ATTN))
        }
    }
}

/// The Gated-DeltaNet recurrence.
fn gdn(spec: &EngineSpec) -> Rule {
    match spec.engine {
        Engine::Vllm => rule(
            "FLA Triton (chunk_gated_delta_rule prefill, fused_recurrent decode)",
            true,
            None,
            src(SRC_VLLM_GDN),
        ),
        Engine::Sglang => rule(
            "FLA Triton (hybrid linear attention backend)",
            true,
            None,
            src(SRC_SGLANG_GDN),
        ),
    }
}

/// The KV cache: its dtype and who reads it.
fn kv_cache(spec: &EngineSpec, cc: u32, fp8_kv: bool, attn_kernel: &str) -> Rule {
    let source = match spec.engine {
        Engine::Vllm => src(SRC_VLLM_KV),
        Engine::Sglang => src(
            "sglang 0.5: python/sglang/srt/server_args.py ServerArgs.kv_cache_dtype (fp8_e4m3) / the checkpoint's KV declaration (not read)",
        ),
    };
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
    fn the_humming_boundary_holds_for_weight_only_dense() {
        let v = |s: &str| s.parse::<EngineSpec>().unwrap();
        let k = |spec: &EngineSpec, cc| {
            vllm_linear(spec, cc, LayerClass::DenseLinear, &nvfp4(false)).kernel
        };
        assert_eq!(k(&v("vllm==0.32"), 90), "Marlin");
        assert_eq!(k(&v("vllm==0.33"), 90), "Humming");
        assert_eq!(k(&v("vllm==0.34"), 100), "FlashInfer CuTe-DSL");
        assert_eq!(k(&v("vllm==0.34"), 121), "Marlin");
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
