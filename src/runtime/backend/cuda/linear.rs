//! A linear layer on the device, in its stored format ([`DLinear`]): what every loader makes and
//! the GEMM layer's launches read.

use crate::gemm::w4a16::W4a16Device;
use crate::gpu::DevBuf;
use crate::runtime::config::WeightFormat;

/// A linear layer on the device.
pub(super) enum DLinear {
    /// BF16 `[n, k]`.
    Bf16 { w: DevBuf, n: usize, k: usize },
    /// E4M3 `[n, k]` with one f32 scale per row and an optional static activation scale.
    Fp8 {
        w: DevBuf,
        scales: DevBuf,
        static_scale: Option<f32>,
        n: usize,
        k: usize,
    },
    /// NVFP4 in the W4A16 kernel layout.
    W4 { dev: W4a16Device },
}

impl DLinear {
    pub(super) fn nk(&self) -> (usize, usize) {
        match self {
            DLinear::Bf16 { n, k, .. } | DLinear::Fp8 { n, k, .. } => (*n, *k),
            DLinear::W4 { dev } => (dev.n, dev.k),
        }
    }
    pub(super) fn bytes(&self) -> usize {
        match self {
            DLinear::Bf16 { w, .. } => w.bytes(),
            DLinear::Fp8 { w, scales, .. } => w.bytes() + scales.bytes(),
            DLinear::W4 { dev } => dev.bytes(),
        }
    }
    pub(super) fn format(&self) -> WeightFormat {
        match self {
            DLinear::Bf16 { .. } => WeightFormat::Bf16,
            DLinear::Fp8 { .. } => WeightFormat::Fp8,
            DLinear::W4 { .. } => WeightFormat::Nvfp4,
        }
    }
}
