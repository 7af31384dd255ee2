//! Typed launchers of `kernels/util.cu` (random fills, FP8 per-tensor quantization, element
//! counts, gathers and the L2 flush read), declared with
//! [`kernel_launchers!`](crate::kernel_launchers) (see [`super::launch`]).

use super::launch::{Bf16, DevPtr, U32x4};

/// Source of `kernels/util.cu`, compiled at run time by NVRTC (the benches, the runtime's
/// checks and the L2 flush all load it: it belongs to the GPU foundation).
pub const SRC: &str = include_str!("../../../kernels/util.cu");
/// Kernels of `kernels/util.cu`.
pub const KERNELS: &[&str] = &[
    "fill_uniform_bf16",
    "fill_fp8_codes",
    "fp8_amax_bf16",
    "fp8_quant_bf16",
    "count_nonfinite_bf16",
    "count_diff_u16",
    "gather_u16",
    "l2_flush_read",
];

crate::kernel_launchers! {
    source "util";
    /// Fill `n` BF16 values with a hash of `seed` and the index, uniform in [-scale, scale].
    pub fn fill_uniform_bf16 = "fill_uniform_bf16"(out: DevPtr<Bf16>, n: u64, seed: u32, scale: f32);
    /// Fill `n` bytes with random finite E4M3 codes.
    pub fn fill_fp8_codes = "fill_fp8_codes"(out: DevPtr<u8>, n: u64, seed: u32);
    /// The absolute maximum of `n` BF16 values, as float bits, atomically into `amax_bits`.
    pub fn fp8_amax_bf16 = "fp8_amax_bf16"(x: DevPtr<Bf16>, n: u64, amax_bits: DevPtr<u32>);
    /// Quantize `n` BF16 values to E4M3 with the per-tensor scale amax / 448.
    pub fn fp8_quant_bf16 = "fp8_quant_bf16"(x: DevPtr<Bf16>, n: u64, amax_bits: DevPtr<u32>, q: DevPtr<u8>, scale: DevPtr<f32>);
    /// Count the non-finite values among `n` BF16 bit patterns.
    pub fn count_nonfinite_bf16 = "count_nonfinite_bf16"(x: DevPtr<u16>, n: u64, count: DevPtr<u32>);
    /// Count the positions where two arrays of `n` 16-bit values differ.
    pub fn count_diff_u16 = "count_diff_u16"(a: DevPtr<u16>, b: DevPtr<u16>, n: u64, count: DevPtr<u32>);
    /// `dst[i] = src[idx[i]]` for `i < n`.
    pub fn gather_u16 = "gather_u16"(src: DevPtr<u16>, idx: DevPtr<u64>, n: i32, dst: DevPtr<u16>);
    /// Read `n16` 16-byte words (evicting L2), folding them into `sink`.
    pub fn l2_flush_read = "l2_flush_read"(buf: DevPtr<U32x4>, n16: u64, sink: DevPtr<u32>);
}
