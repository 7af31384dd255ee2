// rigbench utility kernels: seeded data generation (mirrored bit-exactly on the CPU by
// src/kernels/data.rs), FP8 activation quantization (dynamic per-tensor, amax / 448), and
// output checks (non-finite count, bitwise difference count).

#include "common.cuh"

// "lowbias32" integer hash (Chris Wellons, 2018): a bijection on 32-bit words.
__device__ __forceinline__ uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// Uniform in [-1, 1): 24 random bits scaled exactly.
__device__ __forceinline__ float uniform_pm1(uint32_t i, uint32_t seed) {
  uint32_t h = hash32(i ^ hash32(seed));
  return (float)(h >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
}

extern "C" __global__ void fill_uniform_bf16(__nv_bfloat16* __restrict__ out, unsigned long long n, uint32_t seed,
                                             float scale) {
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    out[i] = __float2bfloat16_rn(uniform_pm1((uint32_t)i, seed) * scale);
  }
}

// Random E4M3 codes with exponents 4..9 (magnitudes 2^-3 .. 2^2), never NaN.
extern "C" __global__ void fill_fp8_codes(uint8_t* __restrict__ out, unsigned long long n, uint32_t seed) {
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    uint32_t h = hash32((uint32_t)i ^ hash32(seed));
    uint32_t sign = (h >> 31) << 7;
    uint32_t ex = 4u + ((h >> 8) % 6u);
    uint32_t man = h & 7u;
    out[i] = (uint8_t)(sign | (ex << 3) | man);
  }
}

// amax of |x| over n BF16 values into *amax_bits (float bits; caller zeroes it first).
extern "C" __global__ void fp8_amax_bf16(const __nv_bfloat16* __restrict__ x, unsigned long long n,
                                         unsigned* __restrict__ amax_bits) {
  float m = 0.f;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    m = fmaxf(m, fabsf(__bfloat162float(x[i])));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ float red[32];
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(m));
  }
}

// q = e4m3_satfinite(x * (1 / s)), s = amax / 448 (1 when amax is 0); writes s to *scale.
extern "C" __global__ void fp8_quant_bf16(const __nv_bfloat16* __restrict__ x, unsigned long long n,
                                          const unsigned* __restrict__ amax_bits, uint8_t* __restrict__ q,
                                          float* __restrict__ scale) {
  const float amax = __uint_as_float(*amax_bits);
  const float s = amax > 0.f ? amax / 448.0f : 1.0f;
  const float inv = 1.0f / s;
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale = s;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    q[i] = (uint8_t)__nv_cvt_float_to_fp8(__bfloat162float(x[i]) * inv, __NV_SATFINITE, __NV_E4M3);
  }
}

// Count BF16 values that are NaN or Inf (poisoned outputs left unwritten show up here).
extern "C" __global__ void count_nonfinite_bf16(const uint16_t* __restrict__ x, unsigned long long n,
                                                unsigned* __restrict__ count) {
  unsigned c = 0;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    c += ((x[i] & 0x7F80u) == 0x7F80u) ? 1u : 0u;
  }
  if (c) atomicAdd(count, c);
}

// Count positions where two buffers of 16-bit words differ.
extern "C" __global__ void count_diff_u16(const uint16_t* __restrict__ a, const uint16_t* __restrict__ b,
                                          unsigned long long n, unsigned* __restrict__ count) {
  unsigned c = 0;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    c += (a[i] != b[i]) ? 1u : 0u;
  }
  if (c) atomicAdd(count, c);
}

// dst[i] = src[idx[i]] for 16-bit words (gathers the sampled outputs the CPU reference checks).
extern "C" __global__ void gather_u16(const uint16_t* __restrict__ src, const unsigned long long* __restrict__ idx,
                                      int n, uint16_t* __restrict__ dst) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[idx[i]];
}

// L2 flush by reading a buffer of at least twice the L2 size: afterwards L2 holds only clean lines
// of this buffer, so the timed kernel starts cold and pays no write-back of dirty lines (a memset
// flush leaves up to a full L2 of dirty lines whose write-back lands in the timed kernel).
extern "C" __global__ void l2_flush_read(const uint4* __restrict__ buf, unsigned long long n16, unsigned* __restrict__ sink) {
  uint32_t x = 0u;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n16;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    uint4 v = __ldcg(&buf[i]);
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x9e3779b9u) *sink = x;  // keeps the loads; practically never taken
}
