// Small-M GEMMs ("GEMVs", M <= 8 tokens) for BF16 and FP8 E4M3 weights, for the decode steps where
// cuBLASLt's fixed cost keeps a GEMM well above its weight-streaming floor (docs/runtime.md,
// "Missed targets"; docs/w4a16-notes.md for the W4A16 kernels, which already cover small M).
//
//   gemv_bf16_w{W}_u{U}:  y[t, n] = bf16_rn( sum_k x[t, k] * w[n, k] )                 (FP32 sums)
//   gemv_bf16f32_w{W}_u{U}: the same sums written as FP32 (the lm_head's logits)
//   gemv_fp8_w{W}_u{U}:   y[t, n] = bf16_rn( acc[t, n] * (xs[t * xs_stride] * ws[n * ws_stride]) ),
//                         acc[t, n] = sum_k qx[t, k] * qw[n, k]                           (FP32 sums)
//
// w: N x K row-major (BF16, or E4M3 codes); x: M x K row-major (BF16, or E4M3 codes with one FP32
// scale per token, as the runtime's fused RMSNorm + FP8 quantization and kernels/fp8_quant.cu write
// them); y: M x N row-major BF16 (FP32 for gemv_bf16f32). FP8 scales: ws per output channel (ws_stride 1) or per tensor
// (ws_stride 0); xs per token (xs_stride 1) or per tensor (xs_stride 0): W8A8 with per-token x
// per-channel scales, the runtime's FP8 path, or per-tensor scales.
//
// Design: the weight matrix is the M side of a tensor-core mma (16 weight rows per tile) and the
// tokens the N side (mma.sync m16n8k16 BF16 / m16n8k32 E4M3, FP32 accumulate; N = 8 holds up to 8
// tokens, the unused columns zero), so the arithmetic costs nothing next to the weight stream. One
// CTA owns 16 weight rows; its W warps split K in steps (32 BF16 / 64 E4M3 values per row and step,
// steps W apart, U steps loaded before they are used); each lane loads 16 bytes of each of its two
// rows (g and g + 8, g = lane / 4) and 16 bytes of token g's activations at the same K offset
// (lane % 4 picks the 16-byte quarter). A dot product does not depend on the order of K, so the
// lane's 16 bytes feed two mma's as if they were the K positions the fragment layout names for that
// lane, in A (weights) and B (activations) alike. Weights are read once with no L1 allocation;
// activations go through the read-only path (every CTA reads them, L2 holds them). The warps' 16 x 8
// FP32 tiles are summed through shared memory; warp 0 applies the scales and writes BF16.
//
// Requirements (the launcher checks them): 1 <= m <= 8; K a multiple of 32 (BF16) or 64 (E4M3);
// w, x 16-byte aligned. Grid: ceil(n / 16) CTAs of 32 * W threads.

#include "common.cuh"

__device__ __forceinline__ uint4 gv_ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void gv_mma_bf16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void gv_mma_e4m3(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One lane's share of a step: 16 bytes of weight row g (wa), of row g + 8 (wb), of token g (xv).
// Words .x/.y feed the first mma, .z/.w the second: A = {row g L0, row g+8 L0, row g L1, row g+8 L1},
// B = {L0, L1}, where L0/L1 are the two K groups the fragment layout gives this lane.
template <bool FP8>
__device__ __forceinline__ void gv_step(float c[4], const uint4& wa, const uint4& wb, const uint4& xv) {
  if (FP8) {
    gv_mma_e4m3(c, wa.x, wb.x, wa.y, wb.y, xv.x, xv.y);
    gv_mma_e4m3(c, wa.z, wb.z, wa.w, wb.w, xv.z, xv.w);
  } else {
    gv_mma_bf16(c, wa.x, wb.x, wa.y, wb.y, xv.x, xv.y);
    gv_mma_bf16(c, wa.z, wb.z, wa.w, wb.w, xv.z, xv.w);
  }
}

// GATHER (the grouped expert GEMVs below): token slot s of the launch reads x row rows[s] / x_div
// (and its scale xs there) and writes y row rows[s]; otherwise slot s is row s of x and y.
// NT: token tiles of 8 (m <= 8 * NT); each weight vector loaded feeds the NT tiles' mma's, so
// NT tiles of tokens cost one pass over the weights.
template <bool FP8, bool F32OUT, int WARPS, int U, bool GATHER = false, int NT = 1>
__device__ __forceinline__ void gv_body(const uint4* __restrict__ w, const uint4* __restrict__ x,
                                        const float* __restrict__ ws, int ws_stride, const float* __restrict__ xs,
                                        int xs_stride, void* __restrict__ y, int m, int n, int k,
                                        const int* __restrict__ rows = nullptr, int x_div = 1) {
  __shared__ float red[WARPS][32][4 * NT];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int row0 = blockIdx.x * 16 + g, row1 = row0 + 8;
  // 16-byte vectors per row; 4 per step (one per lane of the quad).
  const int vecs = FP8 ? (k >> 4) : (k >> 3);
  const int steps = vecs >> 2;
  const bool ok0 = row0 < n, ok1 = row1 < n;
  const uint4* w0 = w + (size_t)(ok0 ? row0 : 0) * vecs + q;
  const uint4* w1 = w + (size_t)(ok1 ? row1 : 0) * vecs + q;
  bool okx[NT];
  const uint4* xr[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int tok = nt * 8 + g;
    okx[nt] = tok < m;
    const int xrow = okx[nt] ? (GATHER ? rows[tok] / x_div : tok) : 0;
    xr[nt] = x + (size_t)xrow * vecs + q;
  }
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  float c[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) c[nt][i] = 0.f;
  for (int s0 = warp; s0 < steps; s0 += WARPS * U) {
    uint4 wa[U], wb[U], xv[U][NT];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int s = s0 + u * WARPS;
      const bool in = s < steps;
      wa[u] = (in && ok0) ? gv_ld_stream(w0 + (size_t)s * 4) : zero;
      wb[u] = (in && ok1) ? gv_ld_stream(w1 + (size_t)s * 4) : zero;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) xv[u][nt] = (in && okx[nt]) ? __ldg(xr[nt] + (size_t)s * 4) : zero;
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) gv_step<FP8>(c[nt], wa[u], wb[u], xv[u][nt]);
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][lane][4 * nt + i] = c[nt][i];
  __syncthreads();
  // Warp 0 finishes (no early return: the grouped kernels call this body in a loop).
  if (warp == 0) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int v = 1; v < WARPS; ++v) {
#pragma unroll
        for (int i = 0; i < 4; ++i) c[nt][i] += red[v][lane][4 * nt + i];
      }
      // c[nt][0], c[nt][1]: row g, tokens 8nt + 2q, 8nt + 2q + 1; c[nt][2], c[nt][3]: row g + 8.
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int tok = nt * 8 + 2 * q + (i & 1);
        const int row = (i < 2) ? row0 : row1;
        if (tok >= m || row >= n) continue;
        const int yrow = GATHER ? rows[tok] : tok;
        float v = c[nt][i];
        if (FP8) v = v * (xs[(GATHER ? yrow / x_div : tok) * xs_stride] * ws[row * ws_stride]);
        if (F32OUT)
          ((float*)y)[(size_t)yrow * n + row] = v;
        else
          ((uint16_t*)y)[(size_t)yrow * n + row] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
      }
    }
  }
}

#define GEMV_VARIANT(W, U)                                                                                        \
  extern "C" __global__ void __launch_bounds__(W * 32) gemv_bf16_w##W##_u##U(                                   \
      const uint4* __restrict__ w, const uint4* __restrict__ x, uint16_t* __restrict__ y, int m, int n, int k) { \
    gv_body<false, false, W, U>(w, x, nullptr, 0, nullptr, 0, y, m, n, k);                                      \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(W * 32) gemv_bf16f32_w##W##_u##U(                                \
      const uint4* __restrict__ w, const uint4* __restrict__ x, float* __restrict__ y, int m, int n, int k) {    \
    gv_body<false, true, W, U>(w, x, nullptr, 0, nullptr, 0, y, m, n, k);                                       \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(W * 32) gemv_fp8_w##W##_u##U(                                    \
      const uint4* __restrict__ w, const uint4* __restrict__ x, const float* __restrict__ ws, int ws_stride,     \
      const float* __restrict__ xs, int xs_stride, uint16_t* __restrict__ y, int m, int n, int k) {              \
    gv_body<true, false, W, U>(w, x, ws, ws_stride, xs, xs_stride, y, m, n, k);                                  \
  }

GEMV_VARIANT(4, 2)
GEMV_VARIANT(4, 4)
GEMV_VARIANT(8, 2)
GEMV_VARIANT(8, 4)

// Grouped expert GEMVs (mixtures of experts, src/gemm/moe.rs): one launch runs every expert a
// layer's tokens were routed to. The routing kernels (kernels/moe.cu) list the routed (token,
// choice) pairs grouped by expert: `sorted[offsets[j] .. offsets[j + 1])` are the pairs of the j-th
// active expert `active[j]`, `*n_active` of them. Grid: (ceil(n / 16), max active experts); CTA
// (b, c) runs rows 16b .. 16b + 15 of expert active[j], j = moe_column_expert_slot(c) (the last
// active expert first, common.cuh), on its pairs: all of them in one pass of
// one token tile when they are at most 8, else 8 * MOE_NT at a time (MOE_NT tiles per pass, each
// weight vector feeding them all: an expert with up to 32 pairs streams its weights once). Expert
// e's weights start at wptr[e] (N x K, as gemv_*), its FP8 row scales at sptr[e]. x row of a pair
// p: p / x_div (x_div = top-k: the token's row of the normed hidden states, for gate_up; 1: the
// pair's own row, for down); y row: p.
// ONE (the _t8 kernels): the host guarantees at most 8 pairs per expert (a batch of at most 8
// tokens), so only the one-tile pass is compiled and the kernel keeps the registers of that
// pass alone, not those of the MOE_NT-tile one.
#define MOE_NT 4
template <bool FP8, int W, int U, bool ONE>
__device__ __forceinline__ void moe_gemv_expert(const uint4* __restrict__ w, const float* __restrict__ ws,
                                                const uint4* __restrict__ x, const float* __restrict__ xs, int x_div,
                                                const int* __restrict__ sorted, int r0, int r1,
                                                uint16_t* __restrict__ y, int n, int k) {
  if (ONE || r1 - r0 <= 8) {
    gv_body<FP8, false, W, U, true, 1>(w, x, ws, 1, xs, 1, y, r1 - r0, n, k, sorted + r0, x_div);
    return;
  }
  if constexpr (!ONE) {
    for (int r = r0; r < r1; r += 8 * MOE_NT) {
      __syncthreads();
      gv_body<FP8, false, W, U, true, MOE_NT>(w, x, ws, 1, xs, 1, y, min(8 * MOE_NT, r1 - r), n, k, sorted + r, x_div);
    }
  }
}

// One grouped kernel (FP8: E4M3 weights with per-expert row scales at sptr[e] and per-row
// activation scales xs; else BF16, sptr and xs unused): both formats take the same arguments.
#define MOE_GEMV_KERNEL(NAME, FP8, W, U, ONE)                                                                  \
  extern "C" __global__ void __launch_bounds__(W * 32) NAME(                                                   \
      const uint64_t* __restrict__ wptr, const uint64_t* __restrict__ sptr, const uint4* __restrict__ x,       \
      const float* __restrict__ xs, int x_div, const int* __restrict__ sorted, const int* __restrict__ active, \
      const int* __restrict__ offsets, const int* __restrict__ n_active, uint16_t* __restrict__ y, int n,      \
      int k) {                                                                                                 \
    const int j = moe_column_expert_slot(blockIdx.y, *n_active);                                               \
    if (j < 0) return;                                                                                         \
    const int e = active[j];                                                                                   \
    moe_gemv_expert<FP8, W, U, ONE>(reinterpret_cast<const uint4*>(wptr[e]),                                   \
                                    FP8 ? reinterpret_cast<const float*>(sptr[e]) : nullptr, x, FP8 ? xs : nullptr, \
                                    x_div, sorted, offsets[j], offsets[j + 1], y, n, k);                       \
  }

#define MOE_GEMV_KERNELS(W, U, SUFFIX, ONE)                        \
  MOE_GEMV_KERNEL(moe_gemv_bf16_w##W##_u##U##SUFFIX, false, W, U, ONE) \
  MOE_GEMV_KERNEL(moe_gemv_fp8_w##W##_u##U##SUFFIX, true, W, U, ONE)

// Each (W, U): the general kernels and the _t8 ones (at most 8 pairs per expert).
#define MOE_GEMV_VARIANT(W, U) \
  MOE_GEMV_KERNELS(W, U, , false) \
  MOE_GEMV_KERNELS(W, U, _t8, true)

MOE_GEMV_VARIANT(4, 4)
MOE_GEMV_VARIANT(8, 2)
