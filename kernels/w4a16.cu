// rigbench W4A16 NVFP4 GEMM: C[M, N] = A[M, K] (BF16) · W[N, K]^T (NVFP4), BF16 out.
//
// Weights are in the layout written by src/formats/w4a16_pack.rs (read its module docs first):
// per 16-row strip and 64-wide k tile, each lane loads 16 bytes holding its mma.m16n8k16 A
// fragments for 4 k16 steps (two whole NVFP4 blocks: rows g and g+8, block 4*kt + t), with K
// permuted inside the tile so that the activations of lane (g, t) are 16 contiguous BF16 values.
// E2M1 -> BF16 is two integer ops per register (value * 2^-126), times the block scale re-encoded
// as BF16 (scale * 2^119) in one bf16x2 multiply; the FP32 epilogue applies weight_scale_2 * 2^7.
// This file mirrors formats::w4a16_pack::{extract_reg, scale_bf16_bits, emulate_warp_tile}.
//
// Small M (<= 64): w4a16_nt{NT}_w{WARPS}_n{WN}[_ks]: weights stream from HBM with 16-byte
// L1::no_allocate loads through a 4-tile register ring; activations come through L1; split-K across CTAs
// (grid.y) with a deterministic fixed-order reduction done by the last CTA of each column of
// CTAs (threadfence reduction; counters reset themselves).
// Large M: w4a16_dequant_bf16 writes W' = value*scale*2^-7 as BF16 for a cuBLASLt GEMM.

#include "common.cuh"

#define REG_MASK 0x81C081C0u
#define R3_MASK_A 0x00400040u
#define R3_MASK_B 0x81808180u
#define SCALE_BASE 0x70007000u

__device__ __forceinline__ uint32_t rotl32(uint32_t x, int r) { return __funnelshift_l(x, x, r); }

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a);
  __nv_bfloat162 y = *reinterpret_cast<__nv_bfloat162*>(&b);
  __nv_bfloat162 z = __hmul2(x, y);
  return *reinterpret_cast<uint32_t*>(&z);
}

// Byte `b` of the scale word as a bf16x2 pair (scale * 2^119, twice).
__device__ __forceinline__ uint32_t scale2(uint32_t word, int b) {
  uint32_t y = __byte_perm(word, 0u, (uint32_t)(b | (4 << 4) | (b << 8) | (4 << 12)));
  return (y << 4) | SCALE_BASE;
}

// One k16 step: four A registers from one 32-bit word. a[0], a[2]: row g; a[1], a[3]: row g+8.
__device__ __forceinline__ void dequant_step(uint32_t q, uint32_t s_lo, uint32_t s_hi, uint32_t a[4]) {
  uint32_t r0 = q & REG_MASK;
  uint32_t r1 = rotl32(q, 4) & REG_MASK;
  uint32_t r2 = rotl32(q, 10) & REG_MASK;
  uint32_t r3 = (rotl32(q, 6) & R3_MASK_A) | (rotl32(q, 14) & R3_MASK_B);
  a[0] = bf16x2_mul(r0, s_lo);
  a[1] = bf16x2_mul(r1, s_hi);
  a[2] = bf16x2_mul(r2, s_lo);
  a[3] = bf16x2_mul(r3, s_hi);
}

__device__ __forceinline__ void mma_bf16_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Weight loads. W4_LOAD selects the flavour (compiled as separate modules by rigbench and chosen
// by measurement): 0 = ld.global.nc.L1::no_allocate (default), 1 = the same with an L2 256-byte
// prefetch hint, 2 = ld.global.cs (evict-first streaming), 3 = plain ld.global.
#ifndef W4_LOAD
#define W4_LOAD 0
#endif
#ifndef W4_RING
#define W4_RING 4
#endif
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
#if W4_LOAD == 1
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#elif W4_LOAD == 2
  asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#elif W4_LOAD == 3
  asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#else
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#endif
  return v;
}

__device__ __forceinline__ uint32_t u4get(const uint4& v, int j) {
  return j == 0 ? v.x : (j == 1 ? v.y : (j == 2 ? v.z : v.w));
}

// 16 BF16 activations of token row `row` at k = kbase .. kbase+15, zero beyond K or for
// absent tokens. K is a multiple of 16, so a 16-wide group is wholly in or out.
__device__ __forceinline__ void load_act16(const __nv_bfloat16* __restrict__ row, bool valid, int kbase, int K, uint32_t b[8]) {
  if (valid && kbase + 16 <= K) {
    const uint4* p = reinterpret_cast<const uint4*>(row + kbase);
    uint4 lo = __ldg(p);
    uint4 hi = __ldg(p + 1);
    b[0] = lo.x; b[1] = lo.y; b[2] = lo.z; b[3] = lo.w;
    b[4] = hi.x; b[5] = hi.y; b[6] = hi.z; b[7] = hi.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) b[i] = 0u;
  }
}

// KS (K split inside the CTA): the CTA's WARPS warps share the same WN strips and each takes a
// contiguous share of the CTA's k-tile pairs; their sums are added in shared memory in warp
// order (deterministic) and warp 0 finishes as the other variants do. No cross-CTA reduction is
// needed when grid.y is 1: the small-M fixed cost of the threadfence / counter / second read.
//
// GATHER (the grouped expert GEMM w4a16_moe_*, grid.y 1): token m reads activation row
// grows[m] / x_div and writes output row grows[m].
template <int NT, int WARPS, int WN, bool KS = false, bool GATHER = false>
__device__ __forceinline__ void w4a16_body(
    const uint4* __restrict__ wq, const uint32_t* __restrict__ sc, const __nv_bfloat16* __restrict__ act,
    __nv_bfloat16* __restrict__ out, float* __restrict__ ws, unsigned* __restrict__ counters,
    int M, int N, int K, int strips, int kt_n, int splits, int pairs_per_split, float out_scale,
    const int* __restrict__ grows = nullptr, int x_div = 1) {
  constexpr int CTA_STRIPS = KS ? WN : WARPS * WN;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int strip0 = KS ? blockIdx.x * WN : (blockIdx.x * WARPS + warp) * WN;
  const int pairs = kt_n >> 1;
  int pair0 = blockIdx.y * pairs_per_split;
  int pair1 = min(pairs, pair0 + pairs_per_split);
  if (KS) {
    const int share = (pair1 - pair0 + WARPS - 1) / WARPS;
    pair0 = min(pair1, pair0 + warp * share);
    pair1 = min(pair1, pair0 + share);
  }
  const int kt0 = 2 * pair0;
  const int kt1 = 2 * pair1;
  // Writes of the final sums: every warp, or warp 0 alone after the in-CTA reduction.
  const bool writer = !KS || warp == 0;

  float acc[WN][NT][4];
#pragma unroll
  for (int r = 0; r < WN; ++r)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][nt][i] = 0.f;

  const __nv_bfloat16* arow[NT];
  bool aval[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    int m = nt * 8 + g;
    aval[nt] = m < M;
    arow[nt] = act + (size_t)(aval[nt] ? (GATHER ? grows[m] / x_div : m) : 0) * K;
  }
  bool sok[WN];
#pragma unroll
  for (int r = 0; r < WN; ++r) sok[r] = strip0 + r < strips;

  // Register ring, D tiles deep: tile kt+d lives in slot d while D-1 later tiles are in flight
  // (Little's law: one tile per warp in flight left the H200 at ~2.4 TB/s). D is even, so a
  // k-tile pair (one scale word) occupies slots (2i, 2i+1).
  constexpr int D = W4_RING;
  uint4 wb[D][WN];
  uint32_t sb[D / 2][WN];
  uint32_t ab[(NT <= 2) ? D : 1][(NT <= 2) ? NT : 1][8];
  auto load_tile = [&](int kt, int d) {
#pragma unroll
    for (int r = 0; r < WN; ++r) {
      const size_t strip = (size_t)(strip0 + r);
      const bool ok = sok[r] && kt < kt1;
      wb[d][r] = ok ? ld_stream(&wq[(strip * kt_n + kt) * 32 + lane]) : make_uint4(0u, 0u, 0u, 0u);
      // The scale word serves both tiles of a pair: it is refilled only after the pair's second
      // (odd) slot has been consumed, so it is loaded with the odd tile.
      if ((d & 1) == 1) sb[d / 2][r] = (sok[r] && kt - 1 < kt1) ? __ldg(&sc[(strip * pairs + (kt >> 1)) * 32 + lane]) : 0u;
    }
    if (NT <= 2) {
#pragma unroll
      for (int nt = 0; nt < ((NT <= 2) ? NT : 1); ++nt)
        load_act16(arow[nt], aval[nt] && kt < kt1, kt * 64 + 16 * t, K, ab[(NT <= 2) ? d : 0][nt]);
    }
  };
#pragma unroll
  for (int d = 0; d < D; ++d) load_tile(kt0 + d, d);

  for (int kt = kt0; kt < kt1; kt += D) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      if (kt + d < kt1) {
        const int h = d & 1;
        if (NT <= 2) {
#pragma unroll
          for (int r = 0; r < WN; ++r) {
            const uint32_t s_lo = scale2(sb[d / 2][r], 2 * h);
            const uint32_t s_hi = scale2(sb[d / 2][r], 2 * h + 1);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              uint32_t a[4];
              dequant_step(u4get(wb[d][r], j), s_lo, s_hi, a);
#pragma unroll
              for (int nt = 0; nt < ((NT <= 2) ? NT : 1); ++nt)
                mma_bf16_16816(acc[r][nt], a, ab[(NT <= 2) ? d : 0][nt][2 * j], ab[(NT <= 2) ? d : 0][nt][2 * j + 1]);
            }
          }
        } else {
          // Many token tiles: activations per k16 step (8 bytes per tile), one step ahead.
          uint32_t s_lo[WN], s_hi[WN];
#pragma unroll
          for (int r = 0; r < WN; ++r) {
            s_lo[r] = scale2(sb[d / 2][r], 2 * h);
            s_hi[r] = scale2(sb[d / 2][r], 2 * h + 1);
          }
          const int kbase = (kt + d) * 64 + 16 * t;
          const bool in_k = kbase + 16 <= K;
          uint2 bcur[NT], bnxt[NT];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
            bcur[nt] = (aval[nt] && in_k) ? __ldg(reinterpret_cast<const uint2*>(arow[nt] + kbase)) : make_uint2(0u, 0u);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (j < 3) {
#pragma unroll
              for (int nt = 0; nt < NT; ++nt)
                bnxt[nt] = (aval[nt] && in_k) ? __ldg(reinterpret_cast<const uint2*>(arow[nt] + kbase + 4 * (j + 1)))
                                              : make_uint2(0u, 0u);
            }
#pragma unroll
            for (int r = 0; r < WN; ++r) {
              uint32_t a[4];
              dequant_step(u4get(wb[d][r], j), s_lo[r], s_hi[r], a);
#pragma unroll
              for (int nt = 0; nt < NT; ++nt) mma_bf16_16816(acc[r][nt], a, bcur[nt].x, bcur[nt].y);
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) bcur[nt] = bnxt[nt];
          }
        }
      }
      load_tile(kt + d + D, d);
    }
  }

  if constexpr (KS) {
    __shared__ float red[WARPS][WN * NT * 4][32];
#pragma unroll
    for (int r = 0; r < WN; ++r)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) red[warp][(r * NT + nt) * 4 + i][lane] = acc[r][nt][i];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int r = 0; r < WN; ++r)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            float s = red[0][(r * NT + nt) * 4 + i][lane];
#pragma unroll
            for (int w = 1; w < WARPS; ++w) s += red[w][(r * NT + nt) * 4 + i][lane];
            acc[r][nt][i] = s;
          }
    }
  }

  if (gridDim.y == 1) {
#pragma unroll
    for (int r = 0; r < WN; ++r)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int n = (strip0 + r) * 16 + g + (i >= 2 ? 8 : 0);
          const int m = nt * 8 + 2 * t + (i & 1);
          if (writer && sok[r] && n < N && m < M)
            out[(size_t)(GATHER ? grows[m] : m) * N + n] = __float2bfloat16_rn(acc[r][nt][i] * out_scale);
        }
    return;
  }

  float* wsp = ws + (size_t)blockIdx.y * M * N;
#pragma unroll
  for (int r = 0; r < WN; ++r)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int n = (strip0 + r) * 16 + g + (i >= 2 ? 8 : 0);
        const int m = nt * 8 + 2 * t + (i & 1);
        if (writer && sok[r] && n < N && m < M) wsp[(size_t)m * N + n] = acc[r][nt][i];
      }
  __threadfence();
  __syncthreads();
  __shared__ unsigned s_last;
  if (threadIdx.x == 0) {
    unsigned prev = atomicAdd(&counters[blockIdx.x], 1u);
    s_last = (prev == (unsigned)(splits - 1)) ? 1u : 0u;
  }
  __syncthreads();
  if (s_last == 0u) return;
  __threadfence();
  const int n_lo = blockIdx.x * CTA_STRIPS * 16;
  const int n_hi = min(N, n_lo + CTA_STRIPS * 16);
  const int rows = n_hi - n_lo;
  const int total = rows * M;
  for (int idx = threadIdx.x; idx < total; idx += blockDim.x) {
    const int m = idx / rows;
    const int n = n_lo + idx % rows;
    float s = 0.f;
    for (int sp = 0; sp < splits; ++sp) s += __ldcg(&ws[((size_t)sp * M + m) * N + n]);
    out[(size_t)m * N + n] = __float2bfloat16_rn(s * out_scale);
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0u;
}

#define W4A16_KERNEL(NT, WARPS, WN)                                                                        \
  extern "C" __global__ void __launch_bounds__(WARPS * 32) w4a16_nt##NT##_w##WARPS##_n##WN(                \
      const uint4* __restrict__ wq, const uint32_t* __restrict__ sc, const __nv_bfloat16* __restrict__ act, \
      __nv_bfloat16* __restrict__ out, float* __restrict__ ws, unsigned* __restrict__ counters, int M,       \
      int N, int K, int strips, int kt_n, int splits, int pairs_per_split, float out_scale) {               \
    w4a16_body<NT, WARPS, WN>(wq, sc, act, out, ws, counters, M, N, K, strips, kt_n, splits,              \
                              pairs_per_split, out_scale);                                                 \
  }

#define W4A16_KS_KERNEL(NT, WARPS, WN)                                                                     \
  extern "C" __global__ void __launch_bounds__(WARPS * 32) w4a16_nt##NT##_w##WARPS##_n##WN##_ks(           \
      const uint4* __restrict__ wq, const uint32_t* __restrict__ sc, const __nv_bfloat16* __restrict__ act, \
      __nv_bfloat16* __restrict__ out, float* __restrict__ ws, unsigned* __restrict__ counters, int M,       \
      int N, int K, int strips, int kt_n, int splits, int pairs_per_split, float out_scale) {               \
    w4a16_body<NT, WARPS, WN, true>(wq, sc, act, out, ws, counters, M, N, K, strips, kt_n, splits,        \
                                    pairs_per_split, out_scale);                                           \
  }

W4A16_KS_KERNEL(1, 4, 1)
W4A16_KS_KERNEL(1, 4, 2)
W4A16_KS_KERNEL(1, 8, 1)
W4A16_KS_KERNEL(1, 8, 2)
W4A16_KS_KERNEL(2, 4, 1)
W4A16_KS_KERNEL(2, 4, 2)
W4A16_KS_KERNEL(2, 8, 1)
W4A16_KS_KERNEL(2, 8, 2)

W4A16_KERNEL(1, 4, 1)
W4A16_KERNEL(1, 4, 2)
W4A16_KERNEL(1, 4, 4)
W4A16_KERNEL(1, 8, 1)
W4A16_KERNEL(1, 8, 2)
W4A16_KERNEL(1, 8, 4)
W4A16_KERNEL(2, 4, 1)
W4A16_KERNEL(2, 4, 2)
W4A16_KERNEL(2, 4, 4)
W4A16_KERNEL(2, 8, 1)
W4A16_KERNEL(2, 8, 2)
W4A16_KERNEL(2, 8, 4)
W4A16_KERNEL(4, 4, 1)
W4A16_KERNEL(4, 4, 2)
W4A16_KERNEL(4, 4, 4)
W4A16_KERNEL(4, 8, 1)
W4A16_KERNEL(4, 8, 2)
W4A16_KERNEL(4, 8, 4)
W4A16_KERNEL(8, 4, 1)
W4A16_KERNEL(8, 4, 2)
W4A16_KERNEL(8, 4, 4)
W4A16_KERNEL(8, 8, 1)
W4A16_KERNEL(8, 8, 2)
W4A16_KERNEL(8, 8, 4)

// Grouped expert GEMM (mixtures of experts, src/gemm/moe.rs; the routed pairs grouped by expert as
// kernels/gemv.cu's moe_gemv_* take them). Expert e: codes at wqp[e], scales at scp[e], epilogue
// factor out_scales[e]. An expert's pairs run in one pass of one token tile when they are at most
// 8, else 8 * MOE_W4_NT at a time (each dequantized weight fragment feeds MOE_W4_NT tiles, so an
// expert with up to 32 pairs streams its weights once).
//   (CTA column c runs active[j], j = moe_column_expert_slot(c): the last active expert first.)
//   w4a16_moe_w{W}_n{WN}:    CTA (b, 0, j) runs strips b*WN .. of expert active[j], its W warps
//                            splitting K (the _ks body, no cross-CTA reduction): for large K;
//   w4a16_moe_ns_w{W}_n{WN}: CTA (b, 0, j) runs strips (b*W + warp)*WN .. , one warp per WN
//                            strips over all of K: for small K (a K split would leave each warp
//                            one k-tile pair and the CTA's fixed cost over a few KiB of weights).
//   ONE (the _t8 kernels): the host guarantees at most 8 pairs per expert (a batch of at most 8
//   tokens): only the one-tile pass is compiled, with that pass's registers alone.
#define MOE_W4_NT 4
template <int WARPS, int WN, bool KS, bool ONE>
__device__ __forceinline__ void w4a16_moe_expert(const uint4* __restrict__ wq, const uint32_t* __restrict__ sc,
                                                 float os, const __nv_bfloat16* __restrict__ act, int x_div,
                                                 const int* __restrict__ sorted, int r0, int r1,
                                                 __nv_bfloat16* __restrict__ out, int n, int k, int strips,
                                                 int kt_n) {
  if (ONE || r1 - r0 <= 8) {
    w4a16_body<1, WARPS, WN, KS, true>(wq, sc, act, out, nullptr, nullptr, r1 - r0, n, k, strips, kt_n, 1, kt_n >> 1,
                                       os, sorted + r0, x_div);
    return;
  }
  if constexpr (!ONE) {
    for (int r = r0; r < r1; r += 8 * MOE_W4_NT) {
      __syncthreads();
      w4a16_body<MOE_W4_NT, WARPS, WN, KS, true>(wq, sc, act, out, nullptr, nullptr, min(8 * MOE_W4_NT, r1 - r), n, k,
                                                 strips, kt_n, 1, kt_n >> 1, os, sorted + r, x_div);
    }
  }
}

#define W4A16_MOE_KERNEL(NAME, WARPS, WN, KS, ONE)                                                              \
  extern "C" __global__ void __launch_bounds__(WARPS * 32) NAME(                                             \
      const uint64_t* __restrict__ wqp, const uint64_t* __restrict__ scp, const float* __restrict__ out_scales, \
      const __nv_bfloat16* __restrict__ act, int x_div, const int* __restrict__ sorted,                     \
      const int* __restrict__ active, const int* __restrict__ offsets, const int* __restrict__ n_active,     \
      __nv_bfloat16* __restrict__ out, int n, int k, int strips, int kt_n) {                                 \
    const int j = moe_column_expert_slot(blockIdx.z, *n_active);                                             \
    if (j < 0) return;                                                                                       \
    const int e = active[j];                                                                                 \
    w4a16_moe_expert<WARPS, WN, KS, ONE>(reinterpret_cast<const uint4*>(wqp[e]),                                  \
                                    reinterpret_cast<const uint32_t*>(scp[e]), out_scales[e], act, x_div,    \
                                    sorted, offsets[j], offsets[j + 1], out, n, k, strips, kt_n);            \
  }

W4A16_MOE_KERNEL(w4a16_moe_w4_n1, 4, 1, true, false)
W4A16_MOE_KERNEL(w4a16_moe_w8_n1, 8, 1, true, false)
W4A16_MOE_KERNEL(w4a16_moe_ns_w4_n1, 4, 1, false, false)
W4A16_MOE_KERNEL(w4a16_moe_ns_w4_n2, 4, 2, false, false)
W4A16_MOE_KERNEL(w4a16_moe_w4_n1_t8, 4, 1, true, true)
W4A16_MOE_KERNEL(w4a16_moe_w8_n1_t8, 8, 1, true, true)
W4A16_MOE_KERNEL(w4a16_moe_ns_w4_n1_t8, 4, 1, false, true)
W4A16_MOE_KERNEL(w4a16_moe_ns_w4_n2_t8, 4, 2, false, true)

// Large M: W'[N, K] = value * scale * 2^-7 (BF16, exact). One warp per (strip, k tile): it
// dequantizes the 16 x 64 tile into shared memory, then writes each row as 128 contiguous bytes.
#define DQ_WARPS 8
#define DQ_LD 72  // row stride of the smem tile in BF16 elements (64 + 8: 16-byte aligned, skewed banks)
extern "C" __global__ void __launch_bounds__(DQ_WARPS * 32) w4a16_dequant_bf16(
    const uint4* __restrict__ wq, const uint32_t* __restrict__ sc, __nv_bfloat16* __restrict__ wout, int N, int K,
    int strips, int kt_n) {
  __shared__ __align__(16) __nv_bfloat16 tile[DQ_WARPS][16 * DQ_LD];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const size_t unit = (size_t)blockIdx.x * DQ_WARPS + warp;
  if (unit >= (size_t)strips * kt_n) return;
  const int kt = (int)(unit % kt_n);
  const int strip = (int)(unit / kt_n);
  const int g = lane >> 2, t = lane & 3;
  const uint4 w = __ldg(&wq[unit * 32 + lane]);
  const uint32_t sw = __ldg(&sc[((size_t)strip * (kt_n >> 1) + (kt >> 1)) * 32 + lane]);
  const uint32_t s_lo = scale2(sw, 2 * (kt & 1));
  const uint32_t s_hi = scale2(sw, 2 * (kt & 1) + 1);
  uint32_t lo[8], hi[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t a[4];
    dequant_step(u4get(w, j), s_lo, s_hi, a);
    lo[2 * j] = a[0];
    lo[2 * j + 1] = a[2];
    hi[2 * j] = a[1];
    hi[2 * j + 1] = a[3];
  }
  __nv_bfloat16* tw = tile[warp];
  uint4* plo = reinterpret_cast<uint4*>(tw + g * DQ_LD + 16 * t);
  uint4* phi = reinterpret_cast<uint4*>(tw + (g + 8) * DQ_LD + 16 * t);
  plo[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  plo[1] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
  phi[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
  phi[1] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
  __syncwarp();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = lane + 32 * i;  // 16 rows x 8 chunks of 8 BF16
    const int row = c >> 3, chunk = c & 7;
    const int n = strip * 16 + row;
    const int k = kt * 64 + chunk * 8;
    if (n < N && k + 8 <= K) {
      *reinterpret_cast<uint4*>(wout + (size_t)n * K + k) = *reinterpret_cast<const uint4*>(tw + row * DQ_LD + chunk * 8);
    }
  }
}
