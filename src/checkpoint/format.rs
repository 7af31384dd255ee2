//! The storage/compute format of one module (a GEMM weight and its scales), as declared by
//! quantization metadata or as read from safetensors headers, and how it maps to the GEMM
//! formats of rigbench's capability table.

use serde::{Deserialize, Serialize};

use crate::formats::GemmFormat;

/// What one module (e.g. `model.layers.0.self_attn.q_proj`) is stored and run as.
///
/// Names follow the field: FP8 W8A8 (E4M3 weights and activations), W8A16 (FP8 weights,
/// BF16 activations), W4A16 NVFP4 / W4A4 NVFP4 (E2M1 weights, E4M3 scale per 16 along K,
/// FP32 per-tensor scale; with or without 4-bit activations), MXFP4 (OCP MX: E2M1, E8M0 scale
/// per 32), INT4 with a group size (GPTQ/AWQ/compressed-tensors `pack-quantized`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModuleFormat {
    /// BF16 weights (unquantized).
    Bf16,
    /// FP16 weights (unquantized).
    F16,
    /// FP32 weights (unquantized).
    F32,
    /// FP8 E4M3 weights.
    Fp8 {
        /// Weight-scale granularity: `per-tensor`, `per-channel`, `block 128x128`,
        /// `group 128`, or `unspecified`.
        scaling: String,
        /// Activations: `static` (an `input_scale` per tensor), `dynamic`, `weight-only`
        /// (BF16 activations, W8A16) or `unspecified`.
        activations: String,
    },
    /// NVFP4 weights (E2M1 + E4M3 block scales + FP32 tensor scale).
    Nvfp4 {
        /// True for W4A4 (activations quantized to NVFP4 too), false for W4A16.
        activations_4bit: bool,
        /// Elements per scale along K (NVFP4 defines 16).
        group_size: u32,
    },
    /// MXFP4 weights (E2M1 with an E8M0 scale per 32 elements).
    Mxfp4,
    /// INT4 weights with BF16/FP16 group scales (weight-only).
    Int4 {
        /// Elements per scale along K, when known.
        group_size: Option<u32>,
    },
    /// INT8 weights.
    Int8,
    /// Anything else, named as the metadata or the dtype names it.
    Other {
        /// What it is.
        name: String,
    },
}

impl ModuleFormat {
    /// True for anything that is not plain BF16/FP16/FP32.
    pub fn is_quantized(&self) -> bool {
        !matches!(self, Self::Bf16 | Self::F16 | Self::F32)
    }

    /// Weight bits per element (scales excluded): 16, 8, 4 or 32; `None` for `Other`.
    pub fn weight_bits(&self) -> Option<u32> {
        match self {
            Self::Bf16 | Self::F16 => Some(16),
            Self::F32 => Some(32),
            Self::Fp8 { .. } | Self::Int8 => Some(8),
            Self::Nvfp4 { .. } | Self::Mxfp4 | Self::Int4 { .. } => Some(4),
            Self::Other { .. } => None,
        }
    }

    /// True for 4-bit weights.
    pub fn is_4bit(&self) -> bool {
        self.weight_bits() == Some(4)
    }

    /// True for FP8 weights.
    pub fn is_fp8(&self) -> bool {
        matches!(self, Self::Fp8 { .. })
    }

    /// The GEMM format of rigbench's capability table this runs as, where one fits:
    /// BF16 → `bf16`; FP8 with quantized activations → `fp8`; W4A16 NVFP4 → `w4a16`;
    /// W4A4 NVFP4 → `w4a4`. FP16, FP32, weight-only FP8, MXFP4, INT4 and INT8 have none and are
    /// described in words by [`ModuleFormat::plain_verdict`].
    pub fn gemm_format(&self) -> Option<GemmFormat> {
        match self {
            Self::Bf16 => Some(GemmFormat::Bf16),
            Self::Fp8 { activations, .. } if activations != "weight-only" => Some(GemmFormat::Fp8),
            Self::Nvfp4 {
                activations_4bit: true,
                ..
            } => Some(GemmFormat::W4a4),
            Self::Nvfp4 {
                activations_4bit: false,
                ..
            } => Some(GemmFormat::W4a16),
            _ => None,
        }
    }

    /// For formats without a [`GemmFormat`]: what engines run them through, in one sentence
    /// (sources: vLLM's Marlin kernels for MXFP4/INT4/FP8 weight-only, sm_80 and up; CUDA
    /// Programming Guide for the tensor-core types).
    pub fn plain_verdict(&self) -> &'static str {
        match self {
            Self::F16 => "FP16 runs on the FP16 tensor cores every supported card has (sm_70 and up)",
            Self::F32 => "FP32 weights are usually cast to the model dtype at load; no FP32 tensor-core GEMM",
            Self::Fp8 { .. } => "weight-only FP8 (W8A16): FP8 weights dequantized to BF16 in a Marlin-style kernel (sm_80 and up) or run on FP8 tensor cores after casting activations (sm_89 and up)",
            Self::Mxfp4 => "MXFP4 runs natively on FP4 tensor cores (sm_100 and up); below that engines dequantize the weights to BF16 in a Marlin-style or Triton kernel (sm_80 and up)",
            Self::Int4 { .. } => "INT4 weight-only (W4A16) runs in Marlin / Machete-style kernels that dequantize to BF16/FP16 (sm_80 and up; GPTQ/AWQ exllama kernels below)",
            Self::Int8 => "INT8 needs INT8 tensor cores (sm_75 and up) or a W8A16 kernel, depending on the scheme",
            Self::Other { .. } => "not in rigbench's capability table",
            Self::Bf16 | Self::Nvfp4 { .. } => "",
        }
    }

    /// Parse a ModelOpt `quant_algo` value (as written in `hf_quant_config.json`,
    /// `quantized_layers` entries, or config.json's ModelOpt `quantization_config`).
    ///
    /// Source: NVIDIA ModelOpt export (`modelopt/torch/export/quant_utils.py` algo names) and
    /// vLLM `modelopt.py` (which algos it loads). `None` for `MIXED_PRECISION` (not a format).
    pub fn from_modelopt_algo(algo: &str, group_size: Option<u64>) -> Option<Self> {
        let g = group_size.map(|g| g.min(u32::MAX as u64) as u32);
        let up = algo.trim().to_ascii_uppercase();
        Some(match up.as_str() {
            "MIXED_PRECISION" => return None,
            "FP8" => Self::Fp8 {
                scaling: "per-tensor".into(),
                activations: "static".into(),
            },
            "FP8_PER_CHANNEL_PER_TOKEN" => Self::Fp8 {
                scaling: "per-channel".into(),
                activations: "dynamic".into(),
            },
            "FP8_PB_WO" => Self::Fp8 {
                scaling: "block 128x128".into(),
                activations: "weight-only".into(),
            },
            "FP8_BLOCKWISE" | "FP8_BLOCK" => Self::Fp8 {
                scaling: "block 128x128".into(),
                activations: "dynamic".into(),
            },
            "NVFP4" | "NVFP4_AWQ" => Self::Nvfp4 {
                activations_4bit: true,
                group_size: g.unwrap_or(16),
            },
            "W4A16_NVFP4" | "NVFP4_W4A16" => Self::Nvfp4 {
                activations_4bit: false,
                group_size: g.unwrap_or(16),
            },
            "MXFP4" | "W4A16_MXFP4" => Self::Mxfp4,
            "INT4_AWQ" | "W4A8_AWQ" | "W4A16_AWQ" => Self::Int4 { group_size: g },
            "INT8_SQ" | "W8A8_SQ_PER_CHANNEL" | "INT8" | "W8A16" => Self::Int8,
            _ => Self::Other {
                name: format!("ModelOpt {}", algo.trim()),
            },
        })
    }
}

impl std::fmt::Display for ModuleFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bf16 => f.write_str("BF16"),
            Self::F16 => f.write_str("FP16"),
            Self::F32 => f.write_str("FP32"),
            Self::Fp8 {
                scaling,
                activations,
            } => match activations.as_str() {
                "weight-only" => write!(f, "FP8 W8A16 ({scaling}, weight-only)"),
                "static" => write!(f, "FP8 W8A8 ({scaling}, static activation scale)"),
                "dynamic" => write!(f, "FP8 W8A8 ({scaling}, dynamic activations)"),
                other => write!(f, "FP8 ({scaling}, activations {other})"),
            },
            Self::Nvfp4 {
                activations_4bit,
                group_size,
            } => write!(
                f,
                "{} NVFP4 (group {group_size})",
                if *activations_4bit { "W4A4" } else { "W4A16" }
            ),
            Self::Mxfp4 => f.write_str("MXFP4 (group 32)"),
            Self::Int4 {
                group_size: Some(g),
            } => write!(f, "INT4 W4A16 (group {g})"),
            Self::Int4 { group_size: None } => f.write_str("INT4 W4A16"),
            Self::Int8 => f.write_str("INT8"),
            Self::Other { name } => f.write_str(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modelopt_algos() {
        assert_eq!(
            ModuleFormat::from_modelopt_algo("W4A16_NVFP4", Some(16)),
            Some(ModuleFormat::Nvfp4 {
                activations_4bit: false,
                group_size: 16
            })
        );
        assert_eq!(
            ModuleFormat::from_modelopt_algo("NVFP4", None)
                .unwrap()
                .gemm_format(),
            Some(GemmFormat::W4a4)
        );
        assert_eq!(
            ModuleFormat::from_modelopt_algo("fp8", None)
                .unwrap()
                .gemm_format(),
            Some(GemmFormat::Fp8)
        );
        assert_eq!(
            ModuleFormat::from_modelopt_algo("MIXED_PRECISION", None),
            None
        );
        let wo = ModuleFormat::from_modelopt_algo("FP8_PB_WO", None).unwrap();
        assert_eq!(wo.gemm_format(), None);
        assert!(wo.is_fp8() && wo.is_quantized());
        assert!(matches!(
            ModuleFormat::from_modelopt_algo("SOMETHING_NEW", None),
            Some(ModuleFormat::Other { .. })
        ));
        assert_eq!(
            ModuleFormat::Nvfp4 {
                activations_4bit: false,
                group_size: 16
            }
            .to_string(),
            "W4A16 NVFP4 (group 16)"
        );
        assert!(!ModuleFormat::Bf16.is_quantized());
        assert!(ModuleFormat::Int4 { group_size: None }.is_4bit());
    }
}
