//! The engines' own selection, as read in their released sources, and a test that
//! [`super::predict`] agrees with it.
//!
//! Read 2026-12-07 from the Python sources of the PyPI wheels (`pip download vllm==X
//! --no-deps --only-binary :all:`; the sdists could not be saved, pip builds their metadata
//! first): vLLM 0.23.0, 0.24.0, 0.25.0, 0.25.1, 0.26.0, 0.27.0, 0.27.1, 0.28.0, 0.29.0,
//! 0.30.0, 0.31.0, 0.32.0, 0.33.0, 0.34.0 (the newest on PyPI) and SGLang 0.5.1, 0.5.5, 0.5.10,
//! 0.5.12, 0.5.13, 0.5.15, 0.5.18, 0.5.20, 0.5.22, 0.5.23. SGLang's attention, KV-cache,
//! Gated-DeltaNet and FP8 weight-only rules were read 2026-12-08 in the wheels of 0.5.1 to
//! 0.5.10 (every x.y.z without post releases), 0.5.13, 0.5.18 and 0.5.23, and for the FP8 and
//! KV rows also 0.5.14 to 0.5.17 (`python/sglang/srt/server_args.py`,
//! `model_executor/model_runner.py`, `mem_cache/`, `layers/quantization/` only). Each row names
//! the file and the function whose code gives its answer, with the releases that code was read
//! in; a change to the rules that contradicts a row fails [`rules_agree_with_the_sources_read`].
//! A row whose kernel starts with `=` must match the prediction exactly, not only its start.

use super::format::ModuleFormat;
use super::predict::{
    predict, EngineSpec, LayerClass, LinearGroup, PredictInput, MARLIN_FP4_WARNING,
    MARLIN_FP8_WARNING, NOT_VERIFIED,
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
    /// The KV cache, with FP8 declared by the checkpoint (true) or not.
    Kv(bool),
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
const K: LayerClass = LayerClass::KvCache;

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
const SG_LIN: &str = "python/sglang/srt/layers/quantization/modelopt_quant.py ModelOptFp4LinearMethod.apply (fp4_gemm: flashinfer mm_fp4, else sgl_kernel cutlass_scaled_fp4_mm)";
const SG_LOADER: &str = "python/sglang/srt/model_loader/loader.py _get_quantization_config (capability < quant_config.get_min_capability()); modelopt_quant.py ModelOptFp4Config.get_min_capability";
const SG_FP4_AUTO: &str = "python/sglang/srt/layers/quantization/fp4_utils.py initialize_fp4_gemm_config (the 'auto' branch)";
const SG_ARGS_FP4: &str = "python/sglang/srt/server_args.py ServerArgs.fp4_gemm_runner_backend (default 'flashinfer_cutlass' in 0.5.9); fp4_utils.py initialize_fp4_gemm_config";
const SG_ATTN_OLD: &str = "python/sglang/srt/model_executor/model_runner.py ModelRunner.model_specific_adjustment (0.5.1–0.5.4); python/sglang/srt/utils.py is_fa3_default_architecture";
const SG_ATTN_MID: &str = "python/sglang/srt/server_args.py ServerArgs._handle_attention_backend_compatibility (0.5.5–0.5.9); utils/common.py is_sm100_supported (capability major 10)";
const SG_ATTN_NEW: &str = "python/sglang/srt/server_args.py ServerArgs._get_default_attn_backend (0.5.10–0.5.18); arg_groups/model_override_base.py get_default_attn_backend (0.5.23)";
const SG_KV_OLD: &str = "python/sglang/srt/model_executor/model_runner.py ModelRunner.init_memory_pool (0.5.1–0.5.2: auto is self.dtype)";
const SG_KV_NEW: &str = "python/sglang/srt/model_executor/model_runner.py ModelRunner.configure_kv_cache_dtype (0.5.3–0.5.15); mem_cache/kv_cache_dtype.py configure_kv_cache_dtype (0.5.16–0.5.23)";
const SG_GDN: &str = "python/sglang/srt/layers/attention/hybrid_linear_attn_backend.py HybridLinearAttnBackend (FLA chunk_gated_delta_rule); server_args.py ServerArgs._handle_linear_attn_backend (0.5.13+); models/qwen3_next.py absent in 0.5.1";
const SG_FP8: &str = "python/sglang/srt/layers/quantization/modelopt_quant.py ModelOptFp8LinearMethod.__init__ (use_marlin from 0.5.17); fp8_utils.py can_auto_enable_marlin_fp8 (80 <= sm < 89)";

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
    // SGLang ModelOpt NVFP4 (W4A4): the loader's minimum capability, Marlin from 0.5.13 on
    // sm_80–sm_9x, the dense GEMM backend on FP4 cards.
    row("sglang==0.5.1", 90, M, Input::W4a4, "none: the load fails", Some("ValueError: The quantization method modelopt_fp4 is not supported for the current GPU. Minimum capability: 100. Current capability: 90."), SG_LOADER),
    row("sglang==0.5.12", 89, D, Input::W4a4, "none: the load fails", Some("ValueError: The quantization method modelopt_fp4 is not supported for the current GPU. Minimum capability: 100. Current capability: 89."), SG_LOADER),
    row("sglang==0.5.13", 75, M, Input::W4a4, "none: the load fails", Some("ValueError: The quantization method modelopt_fp4 is not supported for the current GPU. Minimum capability: 80. Current capability: 75."), SG_LOADER),
    row("sglang==0.5.13", 90, M, Input::W4a4, "=Marlin", None, SG_MOE),
    row("sglang==0.5.23", 80, M, Input::W4a4, "=Marlin", None, SG_MOE),
    row("sglang==0.5.13", 90, D, Input::W4a4, "Marlin (--fp4-gemm-backend auto", None, SG_FP4_AUTO),
    row("sglang==0.5.23", 86, D, Input::W4a4, "Marlin (--fp4-gemm-backend auto", None, SG_FP4_AUTO),
    row("sglang==0.5.5", 100, D, Input::W4a4, "FlashInfer mm_fp4", None, SG_LIN),
    row("sglang==0.5.9", 100, D, Input::W4a4, "FlashInfer CUTLASS (--fp4-gemm-backend flashinfer_cutlass)", None, SG_ARGS_FP4),
    row("sglang==0.5.10", 120, D, Input::W4a4, "FlashInfer cuDNN", None, SG_FP4_AUTO),
    row("sglang==0.5.11", 100, D, Input::W4a4, "FlashInfer CUTLASS (--fp4-gemm-backend auto)", None, SG_FP4_AUTO),
    row("sglang==0.5.12", 100, D, Input::W4a4, "FlashInfer CuTe-DSL", None, SG_FP4_AUTO),
    row("sglang==0.5.12", 121, D, Input::W4a4, "FlashInfer cuDNN", None, SG_FP4_AUTO),
    row("sglang==0.5.23", 103, D, Input::W4a4, "FlashInfer CuTe-DSL", None, SG_FP4_AUTO),
    row("sglang==0.5.23", 120, D, Input::W4a4, "FlashInfer CUTLASS (--fp4-gemm-backend auto)", None, SG_FP4_AUTO),
    // SGLang's default attention backend (MHA, 16-bit KV).
    row(
        "sglang==0.5.1",
        90,
        A,
        Input::Attention(false),
        "FlashAttention 3 (fa3) for the architectures",
        None,
        SG_ATTN_OLD,
    ),
    row(
        "sglang==0.5.7",
        90,
        A,
        Input::Attention(false),
        "FlashAttention 3 (fa3) for the architectures",
        None,
        SG_ATTN_MID,
    ),
    row(
        "sglang==0.5.8",
        90,
        A,
        Input::Attention(false),
        "=FlashAttention 3 (fa3)",
        None,
        SG_ATTN_MID,
    ),
    row(
        "sglang==0.5.23",
        90,
        A,
        Input::Attention(false),
        "=FlashAttention 3 (fa3)",
        None,
        SG_ATTN_NEW,
    ),
    row(
        "sglang==0.5.6",
        100,
        A,
        Input::Attention(false),
        "FlashInfer",
        None,
        SG_ATTN_MID,
    ),
    row(
        "sglang==0.5.7",
        100,
        A,
        Input::Attention(false),
        "=TRT-LLM MHA (trtllm_mha)",
        None,
        SG_ATTN_MID,
    ),
    row(
        "sglang==0.5.23",
        103,
        A,
        Input::Attention(false),
        "TRT-LLM MHA (trtllm_mha; fa4",
        None,
        SG_ATTN_NEW,
    ),
    row(
        "sglang==0.5.23",
        120,
        A,
        Input::Attention(false),
        "FlashInfer",
        None,
        SG_ATTN_NEW,
    ),
    row(
        "sglang==0.5.1",
        89,
        A,
        Input::Attention(false),
        "FlashInfer",
        None,
        SG_ATTN_OLD,
    ),
    row(
        "sglang==0.5.10",
        80,
        A,
        Input::Attention(false),
        "FlashInfer",
        None,
        SG_ATTN_NEW,
    ),
    // SGLang's KV cache with the checkpoint's FP8 declaration and --kv-cache-dtype auto.
    row(
        "sglang==0.5.1",
        90,
        K,
        Input::Kv(true),
        "16-bit cache",
        None,
        SG_KV_OLD,
    ),
    row(
        "sglang==0.5.2",
        100,
        K,
        Input::Kv(true),
        "16-bit cache",
        None,
        SG_KV_OLD,
    ),
    row(
        "sglang==0.5.3",
        90,
        K,
        Input::Kv(true),
        "FP8 E4M3 cache",
        None,
        SG_KV_NEW,
    ),
    row(
        "sglang==0.5.23",
        100,
        K,
        Input::Kv(true),
        "FP8 E4M3 cache",
        None,
        SG_KV_NEW,
    ),
    row(
        "sglang==0.5.10",
        90,
        K,
        Input::Kv(false),
        "16-bit cache",
        None,
        SG_KV_NEW,
    ),
    // SGLang's Gated-DeltaNet layers.
    row(
        "sglang==0.5.1",
        90,
        G,
        Input::Gdn,
        "none: SGLang 0.5.1",
        None,
        SG_GDN,
    ),
    row(
        "sglang==0.5.2",
        90,
        G,
        Input::Gdn,
        "=FLA Triton chunk_gated_delta_rule (hybrid linear attention backend)",
        None,
        SG_GDN,
    ),
    row(
        "sglang==0.5.12",
        100,
        G,
        Input::Gdn,
        "=FLA Triton chunk_gated_delta_rule (hybrid linear attention backend)",
        None,
        SG_GDN,
    ),
    row(
        "sglang==0.5.13",
        100,
        G,
        Input::Gdn,
        "FLA Triton chunk_gated_delta_rule (prefill); FlashInfer GDN decode",
        None,
        SG_GDN,
    ),
    row(
        "sglang==0.5.23",
        120,
        G,
        Input::Gdn,
        "=FLA Triton chunk_gated_delta_rule (hybrid linear attention backend)",
        None,
        SG_GDN,
    ),
    // SGLang FP8 below sm_89.
    row(
        "sglang==0.5.16",
        80,
        D,
        Input::Fp8("per-tensor"),
        "Marlin (FP8 weight-only) for `fp8` checkpoints; ModelOpt",
        None,
        SG_FP8,
    ),
    row(
        "sglang==0.5.17",
        86,
        D,
        Input::Fp8("per-channel"),
        "=Marlin (FP8 weight-only)",
        None,
        SG_FP8,
    ),
    row(
        "sglang==0.5.1",
        75,
        D,
        Input::Fp8("per-tensor"),
        "none: no FP8 kernel below sm_80",
        None,
        SG_FP8,
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
        Input::Attention(_) | Input::Gdn | Input::Kv(_) => None,
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
        attention: matches!(r.input, Input::Attention(_) | Input::Kv(_)),
        gdn_layers: u64::from(matches!(r.input, Input::Gdn)),
        gdn_projections: None,
        kv_cache: matches!(r.input, Input::Attention(true) | Input::Kv(true)).then(|| "FP8".into()),
        kv_from_flag: false,
        // The SGLang NVFP4 rows read ModelOpt's path.
        quant_method: Some("modelopt".into()),
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
        let agrees = match r.kernel.strip_prefix('=') {
            Some(exact) => got.kernel == exact,
            None => got.kernel.starts_with(r.kernel),
        };
        assert!(
            agrees,
            "{at}: predicted {:?}, the source selects {:?}",
            got.kernel, r.kernel
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
