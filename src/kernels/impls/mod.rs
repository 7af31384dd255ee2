//! The implementations: `bf16` and `fp8` (cuBLASLt), `w4a16` (rigbench's NVRTC kernel), `w4a4`
//! (native NVFP4 through cuBLASLt's block-scaled FP4 path, sm_100 and up).

pub mod bf16;
pub mod fp8;
pub mod w4a16;
pub mod w4a4;

use super::GemmImpl;
use crate::formats::GemmFormat;

/// A fresh implementation for `format`.
pub fn make(format: GemmFormat) -> Box<dyn GemmImpl> {
    match format {
        GemmFormat::Bf16 => Box::new(bf16::Bf16::default()),
        GemmFormat::Fp8 => Box::new(fp8::Fp8::default()),
        GemmFormat::W4a16 => Box::new(w4a16::W4a16::default()),
        GemmFormat::W4a4 => Box::new(w4a4::W4a4::default()),
    }
}
