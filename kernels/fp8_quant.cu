// Per-token (row-wise) dynamic FP8 E4M3 activation quantization, as engines run it in front of a
// W8A8 GEMM with per-token activation scales and per-channel weight scales (the built-in runtime's
// FP8 path, src/runtime/backend/cuda; docs/w4a16-notes.md, "FP8 as engines run it").
//
// Rule (the same as the CPU's quantize_activations_fp8 and the runtime's fused quantizing kernels
// in kernels/runtime.cu): per row t, s[t] = amax(|x[t, :]|) / 448 (1 when the row is all zero or
// not finite), and q[t, k] = e4m3_satfinite(x[t, k] · (1 / s[t])), the divide and the multiply
// correctly rounded. With static_scale > 0 (a checkpoint's static input scale, ModelOpt
// `input_scale`) s[t] = static_scale for every row instead. These are the kernels both the kernel
// bench (fp8-rowwise) and the built-in runtime run (src/kernels/ops.rs).
//
// Layout: BF16 input [M, K] (row stride K), E4M3 output [M, K], FP32 scales [M]. One CTA per row;
// each thread keeps its V 16-byte vectors (8 BF16 values each) of the row in registers, so the
// row is read from global memory once: load, reduce the amax across the CTA, scale, convert, store
// 8 bytes per vector. Variants `_t{THREADS}_v{V}` take rows of up to THREADS · V · 8 values; K
// must be a multiple of 8 and the rows 16-byte aligned. `fp8_quant_rows_bf16_any` takes any K
// (two reads of the row, the second from L2).
//
// The fused variant rmsnorm_fp8_quant_rows_* computes y = bf16_rn(x · r · w) with
// r = 1 / sqrt(mean(x²) + eps) (FP32 sum of squares across the CTA) and FP32 norm weights w [K],
// then quantizes y by the rule above: the output an RMSNorm kernel writing BF16 followed by the
// quantization kernel gives, in one pass over x.
//
// fp8_rowwise_scale_out: out[t, n] = bf16_rn(acc[t, n] · (s_tok[t] · s_chan[n])), the epilogue
// of an FP32-output FP8 GEMM when cuBLASLt offers no outer-vector scaling.

#include "common.cuh"

__device__ __forceinline__ float fq_bf2f(uint32_t h) { return __uint_as_float(h << 16); }

__device__ __forceinline__ uint32_t fq_f2bf_bits(float f) {
  return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(f));
}

__device__ __forceinline__ uint32_t fq_e4m3(float v) {
  return (uint32_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

// Max over the CTA (every thread gets it); red holds 32 floats.
template <int THREADS>
__device__ __forceinline__ float fq_block_max(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (threadIdx.x & 31) < (THREADS / 32) ? red[threadIdx.x & 31] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  return v;
}

template <int THREADS>
__device__ __forceinline__ float fq_block_sum(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (threadIdx.x & 31) < (THREADS / 32) ? red[threadIdx.x & 31] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  return v;
}

// amax → scale; NaN values are skipped (as the runtime's kernel does), and a row that is all
// zero or whose amax is not finite gets scale 1.
__device__ __forceinline__ float fq_scale(float amax) {
  return (amax > 0.f && amax <= 3.402823466e38f) ? __fdiv_rn(amax, 448.0f) : 1.0f;
}

__device__ __forceinline__ float fq_absmax8(const float (&v)[8], float m) {
#pragma unroll
  for (int j = 0; j < 8; j++) {
    const float a = fabsf(v[j]);
    if (a == a) m = fmaxf(m, a);
  }
  return m;
}

__device__ __forceinline__ void fq_unpack8(uint4 u, float (&v)[8]) {
  v[0] = fq_bf2f(u.x & 0xFFFFu); v[1] = fq_bf2f(u.x >> 16);
  v[2] = fq_bf2f(u.y & 0xFFFFu); v[3] = fq_bf2f(u.y >> 16);
  v[4] = fq_bf2f(u.z & 0xFFFFu); v[5] = fq_bf2f(u.z >> 16);
  v[6] = fq_bf2f(u.w & 0xFFFFu); v[7] = fq_bf2f(u.w >> 16);
}

__device__ __forceinline__ uint2 fq_pack8(const float (&v)[8], float inv) {
  uint2 o;
  o.x = fq_e4m3(__fmul_rn(v[0], inv)) | (fq_e4m3(__fmul_rn(v[1], inv)) << 8) |
        (fq_e4m3(__fmul_rn(v[2], inv)) << 16) | (fq_e4m3(__fmul_rn(v[3], inv)) << 24);
  o.y = fq_e4m3(__fmul_rn(v[4], inv)) | (fq_e4m3(__fmul_rn(v[5], inv)) << 8) |
        (fq_e4m3(__fmul_rn(v[6], inv)) << 16) | (fq_e4m3(__fmul_rn(v[7], inv)) << 24);
  return o;
}

template <int THREADS, int V>
__device__ __forceinline__ void fq_rows(const uint16_t* __restrict__ in, int M, int K, float static_scale,
                                        uint8_t* __restrict__ out, float* __restrict__ scales) {
  __shared__ float red[32];
  const int t = blockIdx.x;
  if (t >= M) return;
  const int nv = K >> 3;
  const uint4* row = reinterpret_cast<const uint4*>(in + (size_t)t * K);
  uint4 r[V];
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < V; i++) {
    const int j = threadIdx.x + i * THREADS;
    r[i] = j < nv ? __ldg(row + j) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int i = 0; i < V; i++) {
    float v[8];
    fq_unpack8(r[i], v);
    m = fq_absmax8(v, m);
  }
  // Every thread takes part in the block max (it synchronizes); static_scale is the same for all.
  const float bm = fq_block_max<THREADS>(m, red);
  const float s = static_scale > 0.f ? static_scale : fq_scale(bm);
  const float inv = __fdiv_rn(1.0f, s);
  if (threadIdx.x == 0) scales[t] = s;
  uint2* o = reinterpret_cast<uint2*>(out + (size_t)t * K);
#pragma unroll
  for (int i = 0; i < V; i++) {
    const int j = threadIdx.x + i * THREADS;
    if (j < nv) {
      float v[8];
      fq_unpack8(r[i], v);
      o[j] = fq_pack8(v, inv);
    }
  }
}

template <int THREADS, int V>
__device__ __forceinline__ void fq_rmsnorm_rows(const uint16_t* __restrict__ in,
                                                const float* __restrict__ w, float eps, int M,
                                                int K, uint8_t* __restrict__ out,
                                                float* __restrict__ scales) {
  __shared__ float red[32];
  const int t = blockIdx.x;
  if (t >= M) return;
  const int nv = K >> 3;
  const uint4* row = reinterpret_cast<const uint4*>(in + (size_t)t * K);
  uint4 r[V];
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < V; i++) {
    const int j = threadIdx.x + i * THREADS;
    r[i] = j < nv ? __ldg(row + j) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int i = 0; i < V; i++) {
    float v[8];
    fq_unpack8(r[i], v);
#pragma unroll
    for (int k = 0; k < 8; k++) ss = __fmaf_rn(v[k], v[k], ss);
  }
  const float ms = __fdiv_rn(fq_block_sum<THREADS>(ss, red), (float)K);
  const float rinv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
  // y = bf16(x · r · w), kept as BF16 bits in r (the row's registers).
  const float4* w4 = reinterpret_cast<const float4*>(w);
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < V; i++) {
    const int j = threadIdx.x + i * THREADS;
    if (j < nv) {
      float v[8];
      fq_unpack8(r[i], v);
      const float4 wa = __ldg(w4 + 2 * j), wb = __ldg(w4 + 2 * j + 1);
      const float ww[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
      uint32_t b[8];
#pragma unroll
      for (int k = 0; k < 8; k++) b[k] = fq_f2bf_bits(__fmul_rn(__fmul_rn(v[k], rinv), ww[k]));
      r[i] = make_uint4(b[0] | (b[1] << 16), b[2] | (b[3] << 16), b[4] | (b[5] << 16), b[6] | (b[7] << 16));
      fq_unpack8(r[i], v);
      m = fq_absmax8(v, m);
    }
  }
  const float s = fq_scale(fq_block_max<THREADS>(m, red));
  const float inv = __fdiv_rn(1.0f, s);
  if (threadIdx.x == 0) scales[t] = s;
  uint2* o = reinterpret_cast<uint2*>(out + (size_t)t * K);
#pragma unroll
  for (int i = 0; i < V; i++) {
    const int j = threadIdx.x + i * THREADS;
    if (j < nv) {
      float v[8];
      fq_unpack8(r[i], v);
      o[j] = fq_pack8(v, inv);
    }
  }
}

#define FQ_VARIANT(T, V)                                                                          \
  extern "C" __global__ void __launch_bounds__(T)                                                 \
      fp8_quant_rows_bf16_t##T##_v##V(const uint16_t* __restrict__ in, int M, int K,             \
                                       float static_scale, uint8_t* __restrict__ out,             \
                                       float* __restrict__ scales) {                              \
    fq_rows<T, V>(in, M, K, static_scale, out, scales);                                           \
  }                                                                                               \
  extern "C" __global__ void __launch_bounds__(T) rmsnorm_fp8_quant_rows_bf16_t##T##_v##V(       \
      const uint16_t* __restrict__ in, const float* __restrict__ w, float eps, int M, int K,      \
      uint8_t* __restrict__ out, float* __restrict__ scales) {                                    \
    fq_rmsnorm_rows<T, V>(in, w, eps, M, K, out, scales);                                         \
  }

// Rows of up to 2,048 / 4,096 / 8,192 / 20,480 / 65,536 values (src/kernels/fp8_quant.rs picks).
FQ_VARIANT(128, 2)
FQ_VARIANT(256, 2)
FQ_VARIANT(256, 4)
FQ_VARIANT(512, 5)
FQ_VARIANT(1024, 8)

// Any K (not a multiple of 8, or longer than the variants): one CTA of 1024 threads per row,
// element-wise, the row read twice (amax, then quantize).
extern "C" __global__ void __launch_bounds__(1024)
    fp8_quant_rows_bf16_any(const uint16_t* __restrict__ in, int M, int K, float static_scale,
                            uint8_t* __restrict__ out, float* __restrict__ scales) {
  __shared__ float red[32];
  const int t = blockIdx.x;
  if (t >= M) return;
  const uint16_t* row = in + (size_t)t * K;
  float m = 0.f;
  for (int i = threadIdx.x; i < K; i += 1024) {
    const float a = fabsf(fq_bf2f(row[i]));
    if (a == a) m = fmaxf(m, a);
  }
  const float bm = fq_block_max<1024>(m, red);
  const float s = static_scale > 0.f ? static_scale : fq_scale(bm);
  const float inv = __fdiv_rn(1.0f, s);
  if (threadIdx.x == 0) scales[t] = s;
  for (int i = threadIdx.x; i < K; i += 1024)
    out[(size_t)t * K + i] = (uint8_t)fq_e4m3(__fmul_rn(fq_bf2f(row[i]), inv));
}

extern "C" __global__ void fp8_rowwise_scale_out(const float* __restrict__ acc, int M, int N,
                                                 const float* __restrict__ tok_scale,
                                                 const float* __restrict__ chan_scale,
                                                 uint16_t* __restrict__ out) {
  const uint64_t n = (uint64_t)M * N;
  for (uint64_t j = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (uint64_t)gridDim.x * blockDim.x)
    out[j] = (uint16_t)fq_f2bf_bits(__fmul_rn(acc[j], __fmul_rn(tok_scale[j / N], chan_scale[j % N])));
}
