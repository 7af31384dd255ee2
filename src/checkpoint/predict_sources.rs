//! The engines' own selection, as read in their released sources, and a test that
//! [`super::predict`] agrees with it.
//!
//! Read 2026-12-07 from the Python sources of the PyPI wheels (`pip download vllm==X
//! --no-deps --only-binary :all:`; the sdists could not be saved, pip builds their metadata
//! first): vLLM 0.23.0, 0.24.0, 0.25.0, 0.25.1, 0.26.0, 0.27.0, 0.27.1, 0.28.0, 0.29.0,
//! 0.30.0, 0.31.0, 0.32.0, 0.33.0, 0.34.0 (the newest on PyPI) and SGLang 0.5.1, 0.5.5, 0.5.10,
//! 0.5.12, 0.5.13, 0.5.15, 0.5.18, 0.5.20, 0.5.22, 0.5.23. Each row names the file and the
//! function whose code gives its answer, with the releases that code was read in; a change to
//! the rules that contradicts a row fails [`rules_agree_with_the_sources_read`].

use super::format::ModuleFormat;
use super::predict::{
    predict, EngineSpec, LayerClass, LinearGroup, PredictInput, MARLIN_FP4_WARNING,
    MARLIN_FP8_WARNING, NOT_VERIFIED, SGLANG_NVFP4_DENSE_ERROR, SGLANG_NVFP4_ERROR,
};

/// What a row feeds the prediction.
#[derive(Clone, Copy)]
enum Input {
    /// NVFP4 with 4-bit activations.
    W4a4,
    /// NVFP4 weight-only.
    W4a16,
    /// FP8 with quantized activations and this weight-scale granularity.
    Fp8(&'static str),
    /// FP8 weight-only.
    W8a16,
    /// Attention with an FP8 KV cache (true) or a 16-bit one.
    Attention(bool),
    /// Gated-DeltaNet layers.
    Gdn,
}

/// One selection read in an engine's source.
struct Row {
    /// `--engine` form.
    engine: &'static str,
    /// Compute capability (`90` for sm_90).
    cc: u32,
    /// Layer class (for linear inputs: dense or MoE).
    class: LayerClass,
    input: Input,
    /// The predicted kernel must start with this.
    kernel: &'static str,
    /// The warning the engine prints (`None`: none).
    warning: Option<&'static str>,
    /// File and function (and releases) the row was read from.
    source: &'static str,
}

const D: LayerClass = LayerClass::DenseLinear;
const M: LayerClass = LayerClass::MoeExperts;
const A: LayerClass = LayerClass::Attention;
const G: LayerClass = LayerClass::Gdn;

const NVFP4_LIN: &str = "vllm/model_executor/kernels/linear/__init__.py init_nvfp4_linear_kernel, _POSSIBLE_NVFP4_KERNELS; kernels/linear/nvfp4/flashinfer.py FlashInferCuteDslNvFp4LinearKernel.is_supported / FlashInferCutlassNvFp4LinearKernel.is_supported";
const NVFP4_A16: &str = "vllm/model_executor/kernels/linear/__init__.py init_nvfp4_linear_kernel (use_a16 branch: force_kernel); quantization/utils/humming/priority.py prefers_humming (0.32.0+)";
const NVFP4_MOE: &str = "vllm/model_executor/layers/fused_moe/oracle/nvfp4.py select_nvfp4_moe_backend (AVAILABLE_BACKENDS, prioritize_humming from 0.32.0); experts/*.py _supports_current_device, _supports_quant_scheme";
const FP8_LIN: &str = "vllm/model_executor/kernels/linear/__init__.py choose_scaled_mm_linear_kernel over _POSSIBLE_FP8_KERNELS; scaled_mm/marlin.py, scaled_mm/cutlass.py, scaled_mm/flashinfer.py is_supported";
const FP8_MOE: &str = "vllm/model_executor/layers/fused_moe/oracle/fp8.py _get_priority_backends; experts/triton_moe.py TritonExperts._supports_quant_scheme (FP8 only when supports_fp8())";
const W8A16: &str = "vllm/model_executor/kernels/linear/__init__.py init_wfp8_a16_linear_kernel, _POSSIBLE_WFP8A16_KERNELS";
const ATTN: &str = "vllm/platforms/cuda.py _get_backend_priorities; vllm/v1/attention/backends/flash_attn.py FlashAttentionBackend.supports_kv_cache_dtype; fa_utils.py get_flash_attn_version";
const GDN: &str =
    "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py _resolve_gdn_prefill_backend";
const SG_MOE: &str =
    "python/sglang/srt/layers/quantization/modelopt_quant.py ModelOptNvFp4FusedMoEMethod.__init__";
const SG_LIN: &str = "python/sglang/srt/layers/quantization/modelopt_quant.py ModelOptFp4LinearMethod.process_weights_after_loading";

/// The selections read, version by version and card by card.
const ROWS: &[Row] = &[
    // NVFP4 W4A4 dense on FP4 cards: 0.23 FlashInfer CUTLASS first; 0.24+ CuTe-DSL (sm_10x).
    row(
        "vllm==0.23.0",
        100,
        D,
        Input::W4a4,
        "FlashInfer CUTLASS",
        None,
        NVFP4_LIN,
    ),
    row(
        "vllm==0.24.0",
        100,
        D,
        Input::W4a4,
        "FlashInfer CuTe-DSL (W4A4)",
        None,
        NVFP4_LIN,
    ),
    row(
        "vllm==0.34.0",
        103,
        D,
        Input::W4a4,
        "FlashInfer CuTe-DSL (W4A4)",
        None,
        NVFP4_LIN,
    ),
    row(
        "vllm==0.23.0",
        120,
        D,
        Input::W4a4,
        "FlashInfer CUTLASS",
        None,
        NVFP4_LIN,
    ),
    row(
        "vllm==0.29.0",
        121,
        D,
        Input::W4a4,
        "FlashInfer CUTLASS",
        None,
        NVFP4_LIN,
    ),
    row(
        "vllm==0.34.0",
        121,
        D,
        Input::W4a4,
        "FlashInfer CUTLASS",
        None,
        NVFP4_LIN,
    ),
    // NVFP4 W4A4 below sm_100: Marlin; Humming on sm_90 from 0.32 (prioritize_humming).
    row(
        "vllm==0.31.0",
        90,
        D,
        Input::W4a4,
        "Marlin",
        Some(MARLIN_FP4_WARNING),
        NVFP4_LIN,
    ),
    row(
        "vllm==0.32.0",
        90,
        D,
        Input::W4a4,
        "Humming",
        None,
        NVFP4_LIN,
    ),
    row(
        "vllm==0.34.0",
        89,
        D,
        Input::W4a4,
        "Marlin",
        Some(MARLIN_FP4_WARNING),
        NVFP4_LIN,
    ),
    row(
        "vllm==0.34.0",
        80,
        D,
        Input::W4a4,
        "Marlin",
        Some(MARLIN_FP4_WARNING),
        NVFP4_LIN,
    ),
    // NVFP4 W4A16 dense.
    row(
        "vllm==0.29.0",
        100,
        D,
        Input::W4a16,
        "Marlin",
        Some(MARLIN_FP4_WARNING),
        NVFP4_A16,
    ),
    row(
        "vllm==0.30.0",
        100,
        D,
        Input::W4a16,
        "FlashInfer CuTe-DSL",
        None,
        NVFP4_A16,
    ),
    row(
        "vllm==0.33.0",
        103,
        D,
        Input::W4a16,
        "FlashInfer CuTe-DSL",
        None,
        NVFP4_A16,
    ),
    row(
        "vllm==0.31.0",
        90,
        D,
        Input::W4a16,
        "Marlin",
        Some(MARLIN_FP4_WARNING),
        NVFP4_A16,
    ),
    row(
        "vllm==0.32.0",
        90,
        D,
        Input::W4a16,
        "Humming",
        None,
        NVFP4_A16,
    ),
    row(
        "vllm==0.34.0",
        90,
        D,
        Input::W4a16,
        "Humming",
        None,
        NVFP4_A16,
    ),
    row(
        "vllm==0.34.0",
        120,
        D,
        Input::W4a16,
        "Marlin",
        Some(MARLIN_FP4_WARNING),
        NVFP4_A16,
    ),
    row(
        "vllm==0.34.0",
        121,
        D,
        Input::W4a16,
        "Marlin",
        Some(MARLIN_FP4_WARNING),
        NVFP4_A16,
    ),
    row(
        "vllm==0.34.0",
        89,
        D,
        Input::W4a16,
        "Marlin",
        Some(MARLIN_FP4_WARNING),
        NVFP4_A16,
    ),
    // NVFP4 MoE experts.
    row(
        "vllm==0.23.0",
        100,
        M,
        Input::W4a4,
        "FlashInfer TRT-LLM",
        None,
        NVFP4_MOE,
    ),
    row(
        "vllm==0.34.0",
        103,
        M,
        Input::W4a4,
        "FlashInfer TRT-LLM",
        None,
        NVFP4_MOE,
    ),
    row(
        "vllm==0.34.0",
        120,
        M,
        Input::W4a4,
        "FlashInfer CUTLASS",
        None,
        NVFP4_MOE,
    ),
    row(
        "vllm==0.25.0",
        90,
        M,
        Input::W4a4,
        "Marlin",
        Some(MARLIN_FP4_WARNING),
        NVFP4_MOE,
    ),
    row(
        "vllm==0.31.0",
        90,
        M,
        Input::W4a4,
        "Marlin",
        Some(MARLIN_FP4_WARNING),
        NVFP4_MOE,
    ),
    row(
        "vllm==0.32.0",
        90,
        M,
        Input::W4a4,
        "Humming",
        None,
        NVFP4_MOE,
    ),
    row(
        "vllm==0.33.0",
        90,
        M,
        Input::W4a16,
        "Humming",
        None,
        NVFP4_MOE,
    ),
    row(
        "vllm==0.34.0",
        90,
        M,
        Input::W4a16,
        "Humming",
        None,
        NVFP4_MOE,
    ),
    row(
        "vllm==0.34.0",
        100,
        M,
        Input::W4a16,
        "Marlin",
        Some(MARLIN_FP4_WARNING),
        NVFP4_MOE,
    ),
    row(
        "vllm==0.34.0",
        89,
        M,
        Input::W4a4,
        "Marlin",
        Some(MARLIN_FP4_WARNING),
        NVFP4_MOE,
    ),
    // FP8 W8A8.
    row(
        "vllm==0.23.0",
        80,
        D,
        Input::Fp8("per-tensor"),
        "Marlin",
        Some(MARLIN_FP8_WARNING),
        FP8_LIN,
    ),
    row(
        "vllm==0.28.0",
        80,
        D,
        Input::Fp8("per-channel"),
        "Marlin",
        Some(MARLIN_FP8_WARNING),
        FP8_LIN,
    ),
    row(
        "vllm==0.29.0",
        80,
        D,
        Input::Fp8("per-tensor"),
        "vLLM CUTLASS FP8",
        None,
        FP8_LIN,
    ),
    row(
        "vllm==0.30.0",
        86,
        D,
        Input::Fp8("per-channel"),
        "vLLM CUTLASS FP8",
        None,
        FP8_LIN,
    ),
    row(
        "vllm==0.31.0",
        80,
        D,
        Input::Fp8("per-tensor"),
        "Marlin",
        Some(MARLIN_FP8_WARNING),
        FP8_LIN,
    ),
    row(
        "vllm==0.34.0",
        89,
        D,
        Input::Fp8("per-tensor"),
        "CUTLASS FP8",
        None,
        FP8_LIN,
    ),
    row(
        "vllm==0.34.0",
        90,
        D,
        Input::Fp8("per-channel"),
        "CUTLASS FP8",
        None,
        FP8_LIN,
    ),
    row(
        "vllm==0.34.0",
        100,
        D,
        Input::Fp8("per-tensor"),
        "FlashInfer FP8",
        None,
        FP8_LIN,
    ),
    row(
        "vllm==0.30.0",
        80,
        M,
        Input::Fp8("per-tensor"),
        "Marlin",
        Some(MARLIN_FP8_WARNING),
        FP8_MOE,
    ),
    row(
        "vllm==0.34.0",
        90,
        M,
        Input::Fp8("per-tensor"),
        "FP8 fused MoE",
        None,
        FP8_MOE,
    ),
    // FP8 weight-only (W8A16): Humming first from 0.25.
    row(
        "vllm==0.24.0",
        90,
        D,
        Input::W8a16,
        "Marlin",
        Some(MARLIN_FP8_WARNING),
        W8A16,
    ),
    row("vllm==0.25.0", 90, D, Input::W8a16, "Humming", None, W8A16),
    row("vllm==0.34.0", 120, D, Input::W8a16, "Humming", None, W8A16),
    // Attention and the FP8 KV cache.
    row(
        "vllm==0.23.0",
        100,
        A,
        Input::Attention(false),
        "FlashInfer",
        None,
        ATTN,
    ),
    row(
        "vllm==0.34.0",
        103,
        A,
        Input::Attention(true),
        "FlashInfer",
        None,
        ATTN,
    ),
    row(
        "vllm==0.34.0",
        90,
        A,
        Input::Attention(false),
        "FlashAttention 3",
        None,
        ATTN,
    ),
    row(
        "vllm==0.23.0",
        90,
        A,
        Input::Attention(true),
        "FlashAttention 3",
        None,
        ATTN,
    ),
    row(
        "vllm==0.34.0",
        89,
        A,
        Input::Attention(false),
        "FlashAttention 2",
        None,
        ATTN,
    ),
    row(
        "vllm==0.34.0",
        120,
        A,
        Input::Attention(false),
        "FlashAttention 2",
        None,
        ATTN,
    ),
    row(
        "vllm==0.34.0",
        121,
        A,
        Input::Attention(true),
        "FlashInfer",
        None,
        ATTN,
    ),
    row(
        "vllm==0.28.0",
        80,
        A,
        Input::Attention(true),
        "FlashInfer",
        None,
        ATTN,
    ),
    // Gated-DeltaNet prefill.
    row(
        "vllm==0.23.0",
        90,
        G,
        Input::Gdn,
        "FlashInfer GDN prefill",
        None,
        GDN,
    ),
    row(
        "vllm==0.34.0",
        100,
        G,
        Input::Gdn,
        "FlashInfer GDN prefill when",
        None,
        GDN,
    ),
    row("vllm==0.29.0", 120, G, Input::Gdn, "FLA Triton", None, GDN),
    row(
        "vllm==0.30.0",
        121,
        G,
        Input::Gdn,
        "FlashInfer GDN prefill when",
        None,
        GDN,
    ),
    row("vllm==0.34.0", 89, G, Input::Gdn, "FLA Triton", None, GDN),
    // SGLang NVFP4 below sm_100.
    row(
        "sglang==0.5.1",
        90,
        M,
        Input::W4a4,
        "none: the load fails",
        Some(SGLANG_NVFP4_ERROR),
        SG_MOE,
    ),
    row(
        "sglang==0.5.12",
        89,
        M,
        Input::W4a4,
        "none: the load fails",
        Some(SGLANG_NVFP4_ERROR),
        SG_MOE,
    ),
    row("sglang==0.5.13", 90, M, Input::W4a4, "Marlin", None, SG_MOE),
    row("sglang==0.5.23", 80, M, Input::W4a4, "Marlin", None, SG_MOE),
    row(
        "sglang==0.5.23",
        90,
        D,
        Input::W4a4,
        "none: the load fails",
        Some(SGLANG_NVFP4_DENSE_ERROR),
        SG_LIN,
    ),
];

#[allow(clippy::too_many_arguments)]
const fn row(
    engine: &'static str,
    cc: u32,
    class: LayerClass,
    input: Input,
    kernel: &'static str,
    warning: Option<&'static str>,
    source: &'static str,
) -> Row {
    Row {
        engine,
        cc,
        class,
        input,
        kernel,
        warning,
        source,
    }
}

/// The prediction input of a row.
fn input_of(r: &Row) -> PredictInput {
    let format = match r.input {
        Input::W4a4 | Input::W4a16 => Some(ModuleFormat::Nvfp4 {
            activations_4bit: matches!(r.input, Input::W4a4),
            group_size: 16,
        }),
        Input::Fp8(scaling) => Some(ModuleFormat::Fp8 {
            scaling: scaling.into(),
            activations: "static".into(),
        }),
        Input::W8a16 => Some(ModuleFormat::Fp8 {
            scaling: "per-channel".into(),
            activations: "weight-only".into(),
        }),
        Input::Attention(_) | Input::Gdn => None,
    };
    PredictInput {
        linear: format
            .map(|format| LinearGroup {
                class: r.class,
                format,
                modules: "rows".into(),
            })
            .into_iter()
            .collect(),
        attention: matches!(r.input, Input::Attention(_)),
        gdn_layers: u64::from(matches!(r.input, Input::Gdn)),
        gdn_projections: None,
        kv_cache: matches!(r.input, Input::Attention(true)).then(|| "FP8".into()),
    }
}

#[test]
fn rules_agree_with_the_sources_read() {
    for r in ROWS {
        let spec: EngineSpec = r.engine.parse().unwrap();
        let p = predict(&spec, r.cc, &input_of(r));
        let got = p
            .rows
            .iter()
            .find(|x| x.layer_class == r.class)
            .unwrap_or_else(|| panic!("{} sm_{}: no {:?} row", r.engine, r.cc, r.class));
        let at = format!(
            "{} sm_{} {:?} (read in {})",
            r.engine, r.cc, r.class, r.source
        );
        assert!(
            got.kernel.starts_with(r.kernel),
            "{at}: predicted {:?}, the source selects {:?}",
            got.kernel,
            r.kernel
        );
        assert_eq!(got.warning.as_deref(), r.warning, "{at}: warning");
        assert!(
            !got.rule_source.contains(NOT_VERIFIED),
            "{at}: a rule read in the source still says {NOT_VERIFIED}: {}",
            got.rule_source
        );
    }
}

#[test]
fn every_row_names_a_file_and_a_function() {
    for r in ROWS {
        assert!(
            r.source.contains(".py ")
                && r.source.split(".py ").nth(1).is_some_and(|f| !f.is_empty()),
            "{}: {}",
            r.engine,
            r.source
        );
    }
}
