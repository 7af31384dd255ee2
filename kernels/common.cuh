// rigbench's CUDA prelude, included by every kernels/*.cu (`#include "common.cuh"`): the CUDA
// headers, the fixed-width integer types NVRTC lacks, and the BF16 / E4M3 conversions whose
// rounding the CPU references fix. It reaches NVRTC through its include path: the gpu crate
// (crates/gpu/src/prelude.rs) embeds this file, writes it to a folder of its own and passes
// that folder as an include path; its SHA-256 is part of the compiled-kernel cache key, so an
// edit here recompiles every kernel (docs/architecture.md, "GPU layer").
//
// Keep it small: a helper goes here only when two or more sources use it verbatim.

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#ifdef __CUDACC_RTC__
// NVRTC ships no C library headers.
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif

// Every lane of a warp, for the __shfl_*_sync masks.
#define FULL 0xffffffffu
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

// BF16 bits -> f32 (exact).
__device__ __forceinline__ float bf2f(uint16_t b) { return __uint_as_float(((uint32_t)b) << 16); }
// f32 -> BF16 bits, round to nearest even.
__device__ __forceinline__ uint16_t f2bf(float x) {
  __nv_bfloat16 h = __float2bfloat16_rn(x);
  return *reinterpret_cast<uint16_t*>(&h);
}
// f32 -> E4M3 code, saturating to ±448 (NaN stays NaN).
__device__ __forceinline__ uint8_t f2e4m3(float x) {
  return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}
// E4M3 code -> f32 (exact).
__device__ __forceinline__ float e4m32f(uint8_t b) {
  __half_raw hr = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
  __half h = *reinterpret_cast<__half*>(&hr);
  return __half2float(h);
}

// The active expert a grouped expert GEMM's CTA column `col` runs (kernels/gemv.cu moe_gemv_*,
// kernels/w4a16.cu w4a16_moe_*, kernels/moe.cu moe_gemv_any), or -1 past the `n_active` ones:
// column 0 takes the last active expert and column c > 0 the (c-1)-th, so the highest expert id
// is dispatched first. With the shared expert fused (src/gemm/moe.rs RouteSpec) that is the
// shared expert, which has every token's pair: at a long prefill its columns run many passes,
// and started first they overlap the routed experts' instead of trailing after them.
__device__ __forceinline__ int moe_column_expert_slot(int col, int n_active) {
  if (col >= n_active) return -1;
  return col == 0 ? n_active - 1 : col - 1;
}
