// rigbench built-in runtime: the decoder's kernels other than the linear layers (those are the
// GEMMs the kernel benches time: cuBLASLt BF16/FP8 and kernels/w4a16.cu).
//
// Conventions (mirrored by src/runtime/model.rs and the CPU backend, which is the reference):
// - residual stream x: f32 [T, H]; every GEMM input and output: BF16 (FP8 inputs are quantized
//   per token from the BF16 values);
// - RMSNorm y = x * (1 / sqrt(mean(x^2) + eps)) * w, in that order of f32 multiplies;
// - RoPE rotate-half: pairs (i, i + d/2) rotated by pos * inv_freq[i] (f32 product, accurate
//   sincosf);
// - KV cache, per layer and for K and V separately: [num_blocks][kv_heads][block_size][head_dim],
//   BF16, or FP8 E4M3 holding e4m3(x * (1/scale)) with a per-layer scale;
// - attention scale 1/sqrt(head_dim), causal, GQA (query head h reads KV head h / (nh / nkv)).
// Every float operation whose rounding the CPU reference fixes uses the explicit _rn intrinsics
// so that the compiler cannot contract it into an FMA.

#include "common.cuh"

// Block-wide sum (f32) for blockDim.x a multiple of 32, <= 1024. Every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  __syncthreads();
  if (l == 0) red[w] = v;
  __syncthreads();
  float s = 0.f;
  for (int i = 0; i < nw; ++i) s += red[i];  // fixed order: deterministic
  return s;
}

__device__ __forceinline__ float block_max(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  __syncthreads();
  if (l == 0) red[w] = v;
  __syncthreads();
  float s = -INFINITY;
  for (int i = 0; i < nw; ++i) s = fmaxf(s, red[i]);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Seeded synthetic weights: bit-identical to src/runtime/weights.rs `synth_bf16` (SplitMix64
// chunks of 65,536 elements, Box-Muller in f64, value = bf16(mean + std * normal) in f32).
// SplitMix64 (Steele, Lea, Flood, OOPSLA 2014): call c of a generator started at s returns
// mix64(s + (c + 1) * GAMMA), so any element is computed without the calls before it.
#define SM_GAMMA 0x9E3779B97F4A7C15ull
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ double unit53(uint64_t x) {
  return ((double)(x >> 11) + 1.0) / 9007199254740992.0;  // (0, 1]
}

extern "C" __global__ void rt_synth_bf16(uint16_t* __restrict__ out, uint64_t len, uint64_t base, float mean,
                                         float stdv) {
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += (uint64_t)gridDim.x * blockDim.x) {
    const uint64_t ci = i >> 16;
    const uint64_t e = i & 0xFFFFull;
    const uint64_t p = e >> 1;
    // mix(base, ci) = SplitMix64::new(base ^ ci * 0xD6E8FEB86659FD93).next_u64()
    const uint64_t s0 = mix64((base ^ (ci * 0xD6E8FEB86659FD93ull)) + SM_GAMMA);
    const double u1 = unit53(mix64(s0 + (2 * p + 1) * SM_GAMMA));
    const double u2 = unit53(mix64(s0 + (2 * p + 2) * SM_GAMMA));
    const double r = sqrt(-2.0 * log(u1));
    const double t = 2.0 * 3.141592653589793 * u2;
    const float v = (e & 1) ? (float)(r * sin(t)) : (float)(r * cos(t));
    out[i] = f2bf(__fadd_rn(mean, __fmul_rn(stdv, v)));
  }
}

// f32 values of RMSNorm weights etc. synthesized as above, stored as f32 (bf16-exact).
extern "C" __global__ void rt_bf16_to_f32(const uint16_t* __restrict__ in, uint64_t len, float* __restrict__ out) {
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += (uint64_t)gridDim.x * blockDim.x)
    out[i] = bf2f(in[i]);
}

// ---------------------------------------------------------------------------------------------
// Quantization at load (src/formats/fp8.rs, nvfp4.rs): amax of |x| (NaN ignored, as f32::max does).
extern "C" __global__ void rt_amax_bf16(const uint16_t* __restrict__ x, uint64_t len, unsigned* __restrict__ amax_bits) {
  float m = 0.f;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += (uint64_t)gridDim.x * blockDim.x) {
    float a = fabsf(bf2f(x[i]));
    if (a == a) m = fmaxf(m, a);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(FULL, m, o));
  if ((threadIdx.x & 31) == 0) atomicMax(amax_bits, __float_as_uint(m));
}

// FP8 per tensor: s = amax / 448 (1 for 0 / non-finite), q = e4m3(x * (1 / s)).
extern "C" __global__ void rt_quant_fp8_tensor(const uint16_t* __restrict__ x, uint64_t len,
                                               const unsigned* __restrict__ amax_bits, uint8_t* __restrict__ q,
                                               float* __restrict__ scale_out) {
  const float amax = __uint_as_float(*amax_bits);
  const float s = (amax > 0.f && amax <= 3.402823466e38f) ? __fdiv_rn(amax, 448.0f) : 1.0f;
  const float inv = __fdiv_rn(1.0f, s);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_out = s;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += (uint64_t)gridDim.x * blockDim.x)
    q[i] = f2e4m3(__fmul_rn(bf2f(x[i]), inv));
}

// E2M1 encode (src/formats/e2m1.rs): nearest, ties to even, saturating at 6; NaN -> +6.
__device__ __forceinline__ uint8_t e2m1_encode(float x) {
  if (x != x) return 0x7;
  const uint8_t sign = (__float_as_uint(x) >> 31) ? 0x8 : 0x0;
  const float a = fabsf(x);
  uint8_t c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return sign | c;
}

// NVFP4 (ModelOpt math), one thread per 16-element block of a BF16 [n, k] weight:
// gs = amax / (6 * 448) (1 for 0); scale = bamax / (6 * gs) (0 -> 1) cast to E4M3;
// denom = e4m3(scale) * gs (0 -> smallest subnormal * gs); codes e2m1(x / denom).
extern "C" __global__ void rt_quant_nvfp4(const uint16_t* __restrict__ x, int n, int k,
                                          const unsigned* __restrict__ amax_bits, uint8_t* __restrict__ packed,
                                          uint8_t* __restrict__ block_scales, float* __restrict__ gs_out) {
  const float amax = __uint_as_float(*amax_bits);
  const float gs = (amax > 0.f && amax <= 3.402823466e38f) ? __fdiv_rn(amax, __fmul_rn(6.0f, 448.0f)) : 1.0f;
  if (blockIdx.x == 0 && threadIdx.x == 0) *gs_out = gs;
  const int bpr = k / 16;
  const uint64_t nblocks = (uint64_t)n * bpr;
  for (uint64_t b = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nblocks; b += (uint64_t)gridDim.x * blockDim.x) {
    const uint16_t* src = x + b * 16;
    float v[16];
    float bm = 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      v[i] = bf2f(src[i]);
      const float a = fabsf(v[i]);
      if (a == a) bm = fmaxf(bm, a);
    }
    float scale = __fdiv_rn(bm, __fmul_rn(6.0f, gs));
    if (scale == 0.f) scale = 1.0f;
    const uint8_t sc = f2e4m3(scale);
    block_scales[b] = sc;
    float denom = __fmul_rn(e4m32f(sc), gs);
    if (denom == 0.f) denom = __fmul_rn(e4m32f(0x01), gs);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint8_t lo = e2m1_encode(__fdiv_rn(v[2 * j], denom));
      const uint8_t hi = e2m1_encode(__fdiv_rn(v[2 * j + 1], denom));
      packed[b * 8 + j] = lo | (hi << 4);
    }
  }
}

// Re-encode a non-zero, non-NaN E4M3 magnitude byte as the W4A16 kernel's E5M3 scale code
// (src/formats/w4a16_pack.rs `scale_code`): value = 2^e (1 + m/8), code = (e + 22) << 3 | m.
__device__ __forceinline__ uint8_t w4_scale_code(uint8_t mag) {
  const float s = e4m32f(mag);
  const uint32_t bits = __float_as_uint(s);
  const int e = (int)((bits >> 23) & 0xFF) - 127;
  const uint32_t m = (bits >> 20) & 7u;
  return (uint8_t)(((e + 22) << 3) | m);
}

// Repack ModelOpt NVFP4 into the W4A16 kernel layout: the GPU twin of
// src/formats/w4a16_pack.rs `repack` (read its docs). One thread per (strip, k tile, lane).
// `lut` is `slot_lut()`: [8 slots][16 codes] -> bits of the step word.
extern "C" __global__ void rt_w4a16_repack(const uint8_t* __restrict__ packed, const uint8_t* __restrict__ bsc, int n,
                                           int k, int strips, int kt_n, const uint32_t* __restrict__ lut,
                                           uint32_t* __restrict__ wq, uint8_t* __restrict__ sc) {
  const uint64_t total = (uint64_t)strips * kt_n * 32;
  const int bpr = k / 16;
  const uint8_t one_code = w4_scale_code(0x38);  // e4m3(1.0) = 0x38
  for (uint64_t u = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; u < total; u += (uint64_t)gridDim.x * blockDim.x) {
    const int lane = (int)(u & 31);
    const uint64_t st = u >> 5;
    const int kt = (int)(st % kt_n);
    const int strip = (int)(st / kt_n);
    const int g = lane >> 2, t = lane & 3;
    const int rows[2] = {strip * 16 + g, strip * 16 + g + 8};
    const int b = 4 * kt + t;
    bool zero[2], neg[2];
    uint8_t code[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = rows[h];
      if (r >= n || b >= bpr) {
        zero[h] = true; neg[h] = false; code[h] = one_code;
        continue;
      }
      const uint8_t byte = bsc[(uint64_t)r * bpr + b];
      const bool is_nan = (byte & 0x7F) == 0x7F;
      const bool is_zero = (byte & 0x7F) == 0;
      if (is_zero || is_nan) {  // NaN scales are refused on the host before this kernel runs
        zero[h] = true; neg[h] = false; code[h] = one_code;
      } else {
        zero[h] = false; neg[h] = (byte & 0x80) != 0; code[h] = w4_scale_code(byte & 0x7F);
      }
    }
    uint32_t* wout = wq + u * 4;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int k0 = 16 * b + 4 * j;
      uint32_t word = 0;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int h = r & 1;              // registers 0, 2: row g; 1, 3: row g + 8
        const int koff = (r >> 1) * 2;    // registers 0, 1: k0, k0 + 1; 2, 3: k0 + 2, k0 + 3
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = rows[h];
          const int col = k0 + koff + half;
          uint8_t c = 0;
          if (!zero[h] && row < n && col < k) {
            const uint8_t byte = packed[(uint64_t)row * (k / 2) + col / 2];
            c = (col & 1) ? (byte >> 4) : (byte & 0xF);
            if (neg[h]) c ^= 0x8;
          }
          word |= lut[(r * 2 + half) * 16 + c];
        }
      }
      wout[j] = word;
    }
    const uint64_t sbase = (((uint64_t)strip * (kt_n / 2) + (kt / 2)) * 32 + lane) * 4 + (kt % 2) * 2;
    sc[sbase] = code[0];
    sc[sbase + 1] = code[1];
  }
}

// ---------------------------------------------------------------------------------------------
// Forward pass.

// x[t, :] = embed[ids[t], :] (BF16 -> f32).
extern "C" __global__ void rt_embed(const int* __restrict__ ids, int T, const uint16_t* __restrict__ embed, int H,
                                    float* __restrict__ x) {
  const int t = blockIdx.x;
  if (t >= T) return;
  const uint16_t* src = embed + (uint64_t)ids[t] * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) x[(uint64_t)t * H + i] = bf2f(src[i]);
}

// One block per output row r: src = rows ? rows[r] : r. If delta: x[src] += delta[src] (f32 add
// of the BF16 GEMM output) first. out[r] = bf16(rmsnorm(x[src]) * w).
extern "C" __global__ void rt_add_rmsnorm(float* __restrict__ x, const uint16_t* __restrict__ delta,
                                          const int* __restrict__ rows, int R, const float* __restrict__ w, int H,
                                          float eps, uint16_t* __restrict__ out) {
  __shared__ float red[32];
  const int r = blockIdx.x;
  if (r >= R) return;
  const int src = rows ? rows[r] : r;
  float* xr = x + (uint64_t)src * H;
  float ss = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    float v = xr[i];
    if (delta) {
      v = __fadd_rn(v, bf2f(delta[(uint64_t)src * H + i]));
      xr[i] = v;
    }
    ss = __fmaf_rn(v, v, ss);
  }
  const float ms = __fdiv_rn(block_sum(ss, red), (float)H);
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
  uint16_t* o = out + (uint64_t)r * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] = f2bf(__fmul_rn(__fmul_rn(xr[i], inv), w[i]));
}

// x[t] += delta[t] for all T rows (the last residual add, when no norm follows in the layer).
extern "C" __global__ void rt_add_rows(float* __restrict__ x, const uint16_t* __restrict__ delta, uint64_t n) {
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
    x[i] = __fadd_rn(x[i], bf2f(delta[i]));
}

#include "qk_norm_rope_kv.cuh"

// Per token t and head: Qwen3 q/k RMSNorm over head_dim (when the weight is given), RoPE, then
// q -> q_out (BF16) and k, v -> the KV cache slot. grid = (T, nh + 2 nkv), block = 32..256.
// qkv: [T, (nh + 2 nkv) hd] BF16 (q heads, then k heads, then v heads).
extern "C" __global__ void rt_qk_norm_rope_kv(const uint16_t* __restrict__ qkv, int T, int nh, int nkv, int hd,
                                              const float* __restrict__ qn, const float* __restrict__ kn,
                                              const float* __restrict__ inv_freq, float eps,
                                              const int* __restrict__ pos, const int* __restrict__ slot,
                                              uint16_t* __restrict__ q_out, void* __restrict__ k_cache,
                                              void* __restrict__ v_cache, int block_size, int kv_fp8, float k_inv,
                                              float v_inv) {
  const int t = blockIdx.x;
  const int h = blockIdx.y;
  if (t >= T) return;
  const int width = (nh + 2 * nkv) * hd;
  const uint16_t* src = qkv + (uint64_t)t * width + (uint64_t)h * hd;
  qk_norm_rope_kv_head(src, t, h, nh, nkv, hd, hd, qn, kn, inv_freq, eps, pos, slot, q_out, k_cache, v_cache,
                       block_size, kv_fp8, k_inv, v_inv);
}

// out[t, i] = bf16(silu(g) * u), g = gu[t, i], u = gu[t, I + i]; silu(x) = x / (1 + exp(-x)).
extern "C" __global__ void rt_silu_mul(const uint16_t* __restrict__ gu, int T, int I, uint16_t* __restrict__ out) {
  const uint64_t n = (uint64_t)T * I;
  for (uint64_t j = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (uint64_t)gridDim.x * blockDim.x) {
    const uint64_t t = j / I, i = j % I;
    const float g = bf2f(gu[t * 2 * I + i]);
    const float u = bf2f(gu[t * 2 * I + I + i]);
    const float s = __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
    out[j] = f2bf(__fmul_rn(s, u));
  }
}

// Per-token FP8 quantization of one row that this block has just written as BF16 (`row`, K
// elements; each thread re-reads only the elements it wrote, so no barrier is needed before the
// amax): the arithmetic of the GEMM layer's per-token quantization (kernels/fp8_quant.cu,
// fp8_quant_rows_*; the CPU's quantize_activations_fp8) on that row: per row, s = amax / 448 (1
// when the amax is 0 or not finite; NaN left out of the amax), q = e4m3(x * (1 / s)); with
// static_scale > 0 (ModelOpt `input_scale`) s = static_scale. Used by the fused kernels below.
__device__ __forceinline__ void quant_own_row(const uint16_t* __restrict__ row, int K, float m, float static_scale,
                                              uint8_t* __restrict__ o, float* __restrict__ scale_out, float* red) {
  float s;
  if (static_scale > 0.f) {
    s = static_scale;
  } else {
    const float amax = block_max(m, red);
    s = (amax > 0.f && amax <= 3.402823466e38f) ? __fdiv_rn(amax, 448.0f) : 1.0f;
  }
  const float inv = __fdiv_rn(1.0f, s);
  if (threadIdx.x == 0) *scale_out = s;
  for (int i = threadIdx.x; i < K; i += blockDim.x) o[i] = f2e4m3(__fmul_rn(bf2f(row[i]), inv));
}

// rt_add_rmsnorm, then the FP8 quantization of its BF16 output row for the next FP8 GEMM
// (fp8_quant_rows_*' arithmetic on the same BF16 values, so by construction the same bits as
// the two launches; checked through whole-model parity, not kernel against kernel):
// q[r] = e4m3(out[r] / s_r), scales[r] = s_r (static_scale > 0: that scale).
extern "C" __global__ void __launch_bounds__(1024) rt_add_rmsnorm_quant(
    float* __restrict__ x, const uint16_t* __restrict__ delta, const int* __restrict__ rows, int R,
    const float* __restrict__ w, int H, float eps, uint16_t* __restrict__ out, float static_scale,
    uint8_t* __restrict__ q, float* __restrict__ scales) {
  __shared__ float red[32];
  const int r = blockIdx.x;
  if (r >= R) return;
  const int src = rows ? rows[r] : r;
  float* xr = x + (uint64_t)src * H;
  float ss = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    float v = xr[i];
    if (delta) {
      v = __fadd_rn(v, bf2f(delta[(uint64_t)src * H + i]));
      xr[i] = v;
    }
    ss = __fmaf_rn(v, v, ss);
  }
  const float ms = __fdiv_rn(block_sum(ss, red), (float)H);
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
  uint16_t* o = out + (uint64_t)r * H;
  float m = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    const uint16_t b = f2bf(__fmul_rn(__fmul_rn(xr[i], inv), w[i]));
    o[i] = b;
    const float a = fabsf(bf2f(b));
    if (a == a) m = fmaxf(m, a);
  }
  quant_own_row(o, H, m, static_scale, q + (uint64_t)r * H, scales + r, red);
}

// rt_silu_mul, then the per-token FP8 quantization of each BF16 output row (bit-identical to
// rt_silu_mul followed by kernels/fp8_quant.cu's fp8_quant_rows_*). grid (T, S): block (t, s) computes slice s of row t
// (ceil(I / S) elements) and its amax. With a static scale it quantizes its slice at once.
// Otherwise it folds its amax into amax_bits[t] (atomicMax on the float's bits: amax >= 0, so
// the bits order as the values do; a max is exact in any order) and counts itself in
// arrivals[t]; the last block of the row to arrive reads the row's amax, writes scales[t],
// quantizes the whole row and sets both counters back to 0 for the next launch (so a CUDA graph
// can replay it). At M = 1 one block per row left the row's I SiLUs on one SM (docs/runtime.md,
// "Fused FP8 quantization"). amax_bits and arrivals: T u32 each, zero before the first launch.
extern "C" __global__ void __launch_bounds__(1024) rt_silu_mul_quant(const uint16_t* __restrict__ gu, int T, int I,
                                                                     uint16_t* __restrict__ out, float static_scale,
                                                                     uint8_t* __restrict__ q,
                                                                     float* __restrict__ scales,
                                                                     unsigned int* __restrict__ amax_bits,
                                                                     unsigned int* __restrict__ arrivals) {
  __shared__ float red[32];
  __shared__ bool last;
  const int t = blockIdx.x, S = gridDim.y;
  if (t >= T) return;
  const int per = (I + S - 1) / S;
  const int i0 = blockIdx.y * per, i1 = min(I, i0 + per);
  const uint16_t* g = gu + (uint64_t)t * 2 * I;
  uint16_t* o = out + (uint64_t)t * I;
  uint8_t* qr = q + (uint64_t)t * I;
  float m = 0.f;
  for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    const float gv = bf2f(g[i]);
    const float u = bf2f(g[I + i]);
    const float sv = __fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv)));
    const uint16_t b = f2bf(__fmul_rn(sv, u));
    o[i] = b;
    const float a = fabsf(bf2f(b));
    if (a == a) m = fmaxf(m, a);
  }
  if (static_scale > 0.f) {
    // Each thread re-reads only the elements it wrote.
    const float inv = __fdiv_rn(1.0f, static_scale);
    if (threadIdx.x == 0 && blockIdx.y == 0) scales[t] = static_scale;
    for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) qr[i] = f2e4m3(__fmul_rn(bf2f(o[i]), inv));
    return;
  }
  const float bm = block_max(m, red);  // its barriers also order this block's writes of o
  __threadfence();                     // ... before the arrival below, for the other blocks
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicMax(amax_bits + t, __float_as_uint(bm));
    __threadfence();
    last = atomicAdd(arrivals + t, 1u) == (unsigned int)(S - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const float amax = __uint_as_float(atomicAdd(amax_bits + t, 0u));
  const float s = (amax > 0.f && amax <= 3.402823466e38f) ? __fdiv_rn(amax, 448.0f) : 1.0f;
  const float inv = __fdiv_rn(1.0f, s);
  // Other blocks' elements: read through L2 (__ldcg), never a stale L1 line.
  for (int i = threadIdx.x; i < I; i += blockDim.x) qr[i] = f2e4m3(__fmul_rn(bf2f(__ldcg(o + i)), inv));
  if (threadIdx.x == 0) {
    scales[t] = s;
    amax_bits[t] = 0u;
    arrivals[t] = 0u;
  }
}

// out[j] = bf16(in[j] * col_scale[j % N]) for a BF16 [T, N] (per-row epilogue scales of fused
// W4A16 projections whose parts have different per-tensor scales).
extern "C" __global__ void rt_scale_cols_bf16(uint16_t* __restrict__ x, int T, int N, const float* __restrict__ col_scale) {
  const uint64_t n = (uint64_t)T * N;
  for (uint64_t j = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (uint64_t)gridDim.x * blockDim.x)
    x[j] = f2bf(__fmul_rn(bf2f(x[j]), col_scale[j % N]));
}

// ---------------------------------------------------------------------------------------------
// Attention on CUDA cores (decode, and any query token): one block per (query token t, KV head,
// partition z of Z = gridDim.z). Token t attends to positions 0..=pos[t] of sequence tok_seq[t]
// (block table row block_tables[seq * max_blocks ..]); its ATT_CHUNK-position chunks are split
// evenly over the Z partitions. A block serves the G = nh / nkv query heads of its KV head, so
// each K/V row is read once per block; it walks its chunks with an online softmax (running max
// and sum per head). With one partition it writes the normalized output; otherwise the partial
// (max, sum, unnormalized output) that rt_attn_combine merges in partition order.
#define ATT_CHUNK 64
#define ATT_THREADS 128
#define ATT_MAX_G 16
#define ATT_MAX_HD 128
#define ATT_MAX_QD 2048  // G * head_dim
#define ATT_ACC (ATT_MAX_QD / ATT_THREADS)
// Shared staging of one chunk of K (then V) rows: row stride = head_dim * elem + 4 bytes, so
// that threads reading different rows at the same column hit different banks.
#define ATT_STAGE (ATT_CHUNK * (ATT_MAX_HD * 2 + 4))

__device__ __forceinline__ void att_split(int ctx, int Z, int* nchunks, int* per) {
  const int nc = (ctx + ATT_CHUNK - 1) / ATT_CHUNK;
  *nchunks = nc;
  *per = (nc + Z - 1) / Z;
}

// 2 (BF16) or 4 (FP8) consecutive cache elements of one 32-bit word as f32.
__device__ __forceinline__ void kv_word(uint32_t w, const uint16_t*, float scale, float v[4]) {
  (void)scale;
  v[0] = __uint_as_float(w << 16);
  v[1] = __uint_as_float(w & 0xFFFF0000u);
}
__device__ __forceinline__ void kv_word(uint32_t w, const uint8_t*, float scale, float v[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = __fmul_rn(e4m32f((uint8_t)(w >> (8 * i))), scale);
}
__device__ __forceinline__ float kv_elem(const unsigned char* row, int d, const uint16_t*, float) {
  return bf2f(reinterpret_cast<const uint16_t*>(row)[d]);
}
__device__ __forceinline__ float kv_elem(const unsigned char* row, int d, const uint8_t*, float scale) {
  return __fmul_rn(e4m32f(row[d]), scale);
}

// Queue asynchronous copies of rows p0 .. p0 + np of one KV head into the staging buffer
// (16-byte cp.async, L2-only; the caller waits). Issuing every copy before waiting keeps all of
// a chunk's loads in flight at once. Rows are padded by 4 bytes, so 16-byte destinations are
// only 4-byte aligned: each row is copied as 4-byte pieces.
template <typename KV>
__device__ __forceinline__ void att_stage(unsigned char* stage, const KV* __restrict__ cache, const int* bt, int p0,
                                          int np, int nkv, int kvh, int block_size, int hd) {
  const int row_bytes = hd * (int)sizeof(KV);
  const int stride = row_bytes + 4;
  const int per_row = row_bytes / 4;
  for (int idx = threadIdx.x; idx < np * per_row; idx += blockDim.x) {
    const int pi = idx / per_row, part = idx % per_row;
    const int p = p0 + pi;
    const unsigned char* src = reinterpret_cast<const unsigned char*>(
        cache + (((uint64_t)bt[p / block_size] * nkv + kvh) * block_size + (p % block_size)) * hd);
    const uint32_t dst = (uint32_t)__cvta_generic_to_shared(stage + pi * stride + part * 4);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src + part * 4));
  }
}

__device__ __forceinline__ void att_stage_wait() {
  asm volatile("cp.async.commit_group;\n" ::);
  asm volatile("cp.async.wait_group 0;\n" ::);
}

template <typename KV>
__device__ void attn_decode_body(const int* __restrict__ tok_list, const uint16_t* __restrict__ q,
                                 const int* __restrict__ tok_seq, const int* __restrict__ pos,
                                 const int* __restrict__ block_tables, const int* __restrict__ bt_stride,
                                 const KV* __restrict__ k_cache, const KV* __restrict__ v_cache, float k_scale,
                                 float v_scale, int nh, int nkv, int hd, int block_size, float sm_scale,
                                 uint16_t* __restrict__ out, float* __restrict__ part_ml, float* __restrict__ part_o) {
  __shared__ float qs[ATT_MAX_QD];
  __shared__ float sc[ATT_MAX_G * ATT_CHUNK];
  __shared__ __align__(16) unsigned char stage[ATT_STAGE];
  __shared__ __align__(16) unsigned char vstage[ATT_STAGE];
  __shared__ float m_s[ATT_MAX_G], l_s[ATT_MAX_G], c_s[ATT_MAX_G];
  const int t = tok_list[blockIdx.x], kvh = blockIdx.y, z = blockIdx.z, Z = gridDim.z;
  const int G = nh / nkv;
  const int ctx = pos[t] + 1;
  int nchunks, per;
  att_split(ctx, Z, &nchunks, &per);
  const int c0 = z * per;
  if (c0 >= nchunks) return;  // nothing for this partition
  const int c1 = min(nchunks, c0 + per);
  const int nparts = (nchunks + per - 1) / per;
  const int* bt = block_tables + (uint64_t)tok_seq[t] * (*bt_stride);
  const int qd = G * hd;
  const int stride = hd * (int)sizeof(KV) + 4;
  const int words = hd * (int)sizeof(KV) / 4;  // 32-bit words per row
  const int epw = 4 / (int)sizeof(KV);         // elements per word
  for (int i = threadIdx.x; i < qd; i += blockDim.x) qs[i] = bf2f(q[((uint64_t)t * nh + kvh * G) * hd + i]);
  if (threadIdx.x < G) {
    m_s[threadIdx.x] = -INFINITY;
    l_s[threadIdx.x] = 0.f;
  }
  float acc[ATT_ACC];
#pragma unroll
  for (int j = 0; j < ATT_ACC; ++j) acc[j] = 0.f;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  for (int c = c0; c < c1; ++c) {
    const int p0 = c * ATT_CHUNK;
    const int np = min(ATT_CHUNK, ctx - p0);
    __syncthreads();  // the previous chunk's K and V rows are no longer read
    att_stage<KV>(stage, k_cache, bt, p0, np, nkv, kvh, block_size, hd);
    att_stage<KV>(vstage, v_cache, bt, p0, np, nkv, kvh, block_size, hd);
    att_stage_wait();
    __syncthreads();
    // Scores: two threads per position, each over half of the row's words.
    {
      const int pi = threadIdx.x >> 1, half = threadIdx.x & 1;
      float dotv[ATT_MAX_G];
#pragma unroll
      for (int g = 0; g < ATT_MAX_G; ++g) dotv[g] = 0.f;
      if (pi < np) {
        const uint32_t* row = reinterpret_cast<const uint32_t*>(stage + pi * stride);
        const int w0 = half * (words / 2), w1 = w0 + words / 2;
        for (int wi = w0; wi < w1; ++wi) {
          float kv[4];
          kv_word(row[wi], (const KV*)nullptr, k_scale, kv);
          for (int e = 0; e < epw; ++e) {
            const int d = wi * epw + e;
#pragma unroll
            for (int g = 0; g < ATT_MAX_G; ++g)
              if (g < G) dotv[g] = __fmaf_rn(qs[g * hd + d], kv[e], dotv[g]);
          }
        }
      }
#pragma unroll
      for (int g = 0; g < ATT_MAX_G; ++g) {
        if (g < G) {
          const float other = __shfl_xor_sync(FULL, dotv[g], 1);
          if (pi < np && half == 0) sc[g * ATT_CHUNK + pi] = __fmul_rn(__fadd_rn(dotv[g], other), sm_scale);
        }
      }
    }
    __syncthreads();
    // Online softmax per head: one warp per head.
    for (int g = warp; g < G; g += nwarps) {
      float cm = -INFINITY;
      for (int pi = lane; pi < np; pi += 32) cm = fmaxf(cm, sc[g * ATT_CHUNK + pi]);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(FULL, cm, o));
      const float mold = m_s[g];
      const float mnew = fmaxf(mold, cm);
      float sum = 0.f;
      for (int pi = lane; pi < np; pi += 32) {
        const float e = expf(__fsub_rn(sc[g * ATT_CHUNK + pi], mnew));
        sc[g * ATT_CHUNK + pi] = e;
        sum = __fadd_rn(sum, e);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(FULL, sum, o));
      __syncwarp();
      if (lane == 0) {
        const float corr = (mold == -INFINITY) ? 0.f : expf(__fsub_rn(mold, mnew));
        c_s[g] = corr;
        l_s[g] = __fadd_rn(__fmul_rn(l_s[g], corr), sum);
        m_s[g] = mnew;
      }
    }
    __syncthreads();
    // Output accumulators: thread owns (g, d) pairs i = threadIdx.x + j * blockDim.x.
#pragma unroll
    for (int j = 0; j < ATT_ACC; ++j) {
      const int i = threadIdx.x + j * ATT_THREADS;
      if (i < qd) {
        const int g = i / hd, d = i % hd;
        float o = __fmul_rn(acc[j], c_s[g]);
        for (int pi = 0; pi < np; ++pi)
          o = __fmaf_rn(sc[g * ATT_CHUNK + pi], kv_elem(vstage + pi * stride, d, (const KV*)nullptr, v_scale), o);
        acc[j] = o;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < ATT_ACC; ++j) {
    const int i = threadIdx.x + j * ATT_THREADS;
    if (i < qd) {
      const int g = i / hd, d = i % hd;
      const int head = kvh * G + g;
      if (nparts == 1) {
        out[((uint64_t)t * nh + head) * hd + d] = f2bf(__fdiv_rn(acc[j], l_s[g]));
      } else {
        const uint64_t slot = ((uint64_t)t * nh + head) * Z + z;
        part_o[slot * hd + d] = acc[j];
        if (d == 0) {
          part_ml[slot * 2] = m_s[g];
          part_ml[slot * 2 + 1] = l_s[g];
        }
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS) rt_attn_decode_bf16(
    const int* __restrict__ tok_list, const uint16_t* __restrict__ q, const int* __restrict__ tok_seq,
    const int* __restrict__ pos, const int* __restrict__ block_tables, const int* __restrict__ bt_stride,
    const uint16_t* __restrict__ k_cache,
    const uint16_t* __restrict__ v_cache, float k_scale, float v_scale, int nh, int nkv, int hd, int block_size,
    float sm_scale, uint16_t* __restrict__ out, float* __restrict__ part_ml, float* __restrict__ part_o) {
  attn_decode_body<uint16_t>(tok_list, q, tok_seq, pos, block_tables, bt_stride, k_cache, v_cache, k_scale, v_scale, nh, nkv,
                             hd, block_size, sm_scale, out, part_ml, part_o);
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS) rt_attn_decode_fp8(
    const int* __restrict__ tok_list, const uint16_t* __restrict__ q, const int* __restrict__ tok_seq,
    const int* __restrict__ pos, const int* __restrict__ block_tables, const int* __restrict__ bt_stride,
    const uint8_t* __restrict__ k_cache,
    const uint8_t* __restrict__ v_cache, float k_scale, float v_scale, int nh, int nkv, int hd, int block_size,
    float sm_scale, uint16_t* __restrict__ out, float* __restrict__ part_ml, float* __restrict__ part_o) {
  attn_decode_body<uint8_t>(tok_list, q, tok_seq, pos, block_tables, bt_stride, k_cache, v_cache, k_scale, v_scale, nh, nkv, hd,
                            block_size, sm_scale, out, part_ml, part_o);
}

// Merge the partitions of rt_attn_decode_* (in partition order): m = max m_i,
// l = sum l_i e^(m_i - m), o = sum o_i e^(m_i - m) / l. grid (T, nh), threads over head_dim;
// Z must be the gridDim.z the partition kernel ran with.
extern "C" __global__ void rt_attn_combine(const int* __restrict__ tok_list, const int* __restrict__ pos, int nh,
                                           int hd, int Z, const float* __restrict__ part_ml,
                                           const float* __restrict__ part_o, uint16_t* __restrict__ out) {
  const int t = tok_list[blockIdx.x], head = blockIdx.y;
  int nchunks, per;
  att_split(pos[t] + 1, Z, &nchunks, &per);
  const int nparts = (nchunks + per - 1) / per;
  if (nparts <= 1) return;  // written directly by the partition kernel
  const uint64_t base = ((uint64_t)t * nh + head) * Z;
  float m = -INFINITY;
  for (int i = 0; i < nparts; ++i) m = fmaxf(m, part_ml[(base + i) * 2]);
  float l = 0.f;
  for (int i = 0; i < nparts; ++i)
    l = __fadd_rn(l, __fmul_rn(part_ml[(base + i) * 2 + 1], expf(__fsub_rn(part_ml[(base + i) * 2], m))));
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.f;
    for (int i = 0; i < nparts; ++i)
      o = __fmaf_rn(part_o[(base + i) * hd + d], expf(__fsub_rn(part_ml[(base + i) * 2], m)), o);
    out[((uint64_t)t * nh + head) * hd + d] = f2bf(__fdiv_rn(o, l));
  }
}

// ---------------------------------------------------------------------------------------------
// Prefill attention on tensor cores (FlashAttention-2 style: Dao, 2023): one block of 4 warps per
// (64 query rows of one segment, query head); each warp owns 16 query rows; K/V tiles of 64
// positions are gathered from the paged cache into shared memory; S = Q K^T and O += P V with
// mma.sync m16n8k16 BF16 (FP32 accumulate), online softmax in FP32, P rounded to BF16 for the
// second product. Causal: row r (position qpos) sees key positions <= qpos.
// tiles: per block, int4 {segment start token, rows in this tile, first position of row 0, seq}.
#define FA_BM 64
#define FA_BN 64
#define FA_WARPS 4

__device__ __forceinline__ void mma16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return (uint32_t)f2bf(lo) | ((uint32_t)f2bf(hi) << 16);
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

template <int HD, typename KV>
__device__ void attn_prefill_body(const uint16_t* __restrict__ q, const int4* __restrict__ tiles,
                                  const int* __restrict__ block_tables, const int* __restrict__ bt_stride,
                                  const KV* __restrict__ k_cache,
                                  const KV* __restrict__ v_cache, float k_scale, float v_scale, int nh, int nkv,
                                  int block_size, float sm_scale, uint16_t* __restrict__ out) {
  constexpr int LD = HD + 8;  // smem row stride (elements): 16-byte aligned rows, skewed banks
  extern __shared__ __align__(16) uint16_t fa_smem[];
  uint16_t* ks = fa_smem;             // [FA_BN][LD]
  uint16_t* vs = fa_smem + FA_BN * LD;  // [FA_BN][LD]
  const int4 tile = tiles[blockIdx.x];
  const int tok0 = tile.x, rows = tile.y, qpos0 = tile.z, seq = tile.w;
  const int head = blockIdx.y;
  const int kvh = head / (nh / nkv);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int* bt = block_tables + (uint64_t)seq * (*bt_stride);

  // Q fragments (A operand) for this warp's 16 rows: rows beyond `rows` are zero.
  constexpr int KS = HD / 16;
  uint32_t qf[KS][4];
  const int r0 = warp * 16 + g, r1 = r0 + 8;
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    const int c0 = kk * 16 + 2 * tq;
    auto ld2 = [&](int r, int c) -> uint32_t {
      if (r >= rows) return 0u;
      const uint16_t* p = q + ((uint64_t)(tok0 + r) * nh + head) * HD + c;
      return (uint32_t)p[0] | ((uint32_t)p[1] << 16);
    };
    qf[kk][0] = ld2(r0, c0);
    qf[kk][1] = ld2(r1, c0);
    qf[kk][2] = ld2(r0, c0 + 8);
    qf[kk][3] = ld2(r1, c0 + 8);
  }
  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
  const int qp0 = qpos0 + r0, qp1 = qpos0 + r1;
  const int last_pos = qpos0 + rows - 1;  // the block's last query position
  for (int kv0 = 0; kv0 <= last_pos; kv0 += FA_BN) {
    __syncthreads();
    // Gather the K and V tiles (positions kv0 .. kv0 + 63) into shared memory as BF16.
    for (int idx = threadIdx.x; idx < FA_BN * (HD / 8); idx += blockDim.x) {
      const int pr = idx / (HD / 8), c8 = (idx % (HD / 8)) * 8;
      const int p = kv0 + pr;
      uint4 kw = make_uint4(0, 0, 0, 0), vw = make_uint4(0, 0, 0, 0);
      if (p <= last_pos) {
        const int blk = bt[p / block_size];
        const uint64_t base = (((uint64_t)blk * nkv + kvh) * block_size + (p % block_size)) * HD + c8;
        if (sizeof(KV) == 2) {
          kw = *reinterpret_cast<const uint4*>(reinterpret_cast<const uint16_t*>(k_cache) + base);
          vw = *reinterpret_cast<const uint4*>(reinterpret_cast<const uint16_t*>(v_cache) + base);
        } else {
          const uint8_t* kb = reinterpret_cast<const uint8_t*>(k_cache) + base;
          const uint8_t* vb = reinterpret_cast<const uint8_t*>(v_cache) + base;
          uint32_t kk[4], vv[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            kk[e] = pack_bf16x2(__fmul_rn(e4m32f(kb[2 * e]), k_scale), __fmul_rn(e4m32f(kb[2 * e + 1]), k_scale));
            vv[e] = pack_bf16x2(__fmul_rn(e4m32f(vb[2 * e]), v_scale), __fmul_rn(e4m32f(vb[2 * e + 1]), v_scale));
          }
          kw = make_uint4(kk[0], kk[1], kk[2], kk[3]);
          vw = make_uint4(vv[0], vv[1], vv[2], vv[3]);
        }
      }
      *reinterpret_cast<uint4*>(ks + pr * LD + c8) = kw;
      *reinterpret_cast<uint4*>(vs + pr * LD + c8) = vw;
    }
    __syncthreads();
    // S = Q K^T for 16 rows x 64 keys: 8 n-tiles of 8 keys.
    float s[FA_BN / 8][4];
#pragma unroll
    for (int nt = 0; nt < FA_BN / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
      for (int np = 0; np < FA_BN / 16; ++np) {
        // ldmatrix x4: matrices (keys np*16+0..7, d kk*16+0..7), (same keys, d +8..15),
        // (keys +8..15, d +0..7), (keys +8..15, d +8..15) -> b0,b1 of n-tile 2np and 2np+1.
        const int mi = lane >> 3, ri = lane & 7;
        const int key = np * 16 + (mi >> 1) * 8 + ri;
        const int col = kk * 16 + (mi & 1) * 8;
        uint32_t b0, b1, b2, b3;
        ldsm_x4(b0, b1, b2, b3, smem_u32(ks + key * LD + col));
        mma16816(s[2 * np], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b0, b1);
        mma16816(s[2 * np + 1], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b2, b3);
      }
    }
    // Scale, causal mask, online softmax (rows g and g+8 of this warp; 4 lanes share a row).
    float mnew[2] = {mrow[0], mrow[1]};
#pragma unroll
    for (int nt = 0; nt < FA_BN / 8; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = kv0 + nt * 8 + 2 * tq + (i & 1);
        const int qp = (i < 2) ? qp0 : qp1;
        const int rr = (i < 2) ? r0 : r1;
        float v = __fmul_rn(s[nt][i], sm_scale);
        if (key > qp || rr >= rows) v = -INFINITY;
        s[nt][i] = v;
        mnew[i >> 1] = fmaxf(mnew[i >> 1], v);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mnew[h] = fmaxf(mnew[h], __shfl_xor_sync(FULL, mnew[h], 1));
      mnew[h] = fmaxf(mnew[h], __shfl_xor_sync(FULL, mnew[h], 2));
    }
    float corr[2], lsum[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; ++h) corr[h] = (mnew[h] == -INFINITY) ? 1.f : expf(__fsub_rn(mrow[h], mnew[h]));
    uint32_t pf[FA_BN / 16][4];
#pragma unroll
    for (int nt = 0; nt < FA_BN / 8; ++nt) {
      float e[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float m = mnew[i >> 1];
        e[i] = (s[nt][i] == -INFINITY) ? 0.f : expf(__fsub_rn(s[nt][i], m));
        lsum[i >> 1] = __fadd_rn(lsum[i >> 1], e[i]);
      }
      // C fragment of n-tile nt -> A fragment of k-step nt/2 (P as the A operand of P V).
      const int ks2 = nt >> 1, hi = nt & 1;
      pf[ks2][hi * 2 + 0] = pack_bf16x2(e[0], e[1]);
      pf[ks2][hi * 2 + 1] = pack_bf16x2(e[2], e[3]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lsum[h] = __fadd_rn(lsum[h], __shfl_xor_sync(FULL, lsum[h], 1));
      lsum[h] = __fadd_rn(lsum[h], __shfl_xor_sync(FULL, lsum[h], 2));
      lrow[h] = __fadd_rn(__fmul_rn(lrow[h], corr[h]), lsum[h]);
      mrow[h] = mnew[h];
    }
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt) {
      o[dt][0] = __fmul_rn(o[dt][0], corr[0]);
      o[dt][1] = __fmul_rn(o[dt][1], corr[0]);
      o[dt][2] = __fmul_rn(o[dt][2], corr[1]);
      o[dt][3] = __fmul_rn(o[dt][3], corr[1]);
    }
    // O += P V: k = keys (16 per step), n = head dims (8 per tile). B[k][n] = V[key][d]: V rows are
    // k-major, so ldmatrix .trans gives the col-major B fragments.
#pragma unroll
    for (int kk = 0; kk < FA_BN / 16; ++kk) {
      // A fragment of P for keys kk*16..+15: regs {row g keys 2t.., row g+8 keys 2t.., row g keys 2t+8.., row g+8 keys 2t+8..}
      const uint32_t a0 = pf[kk][0], a1 = pf[kk][1], a2 = pf[kk][2], a3 = pf[kk][3];
#pragma unroll
      for (int dp = 0; dp < HD / 16; ++dp) {
        const int mi = lane >> 3, ri = lane & 7;
        const int key = kk * 16 + (mi & 1) * 8 + ri;
        const int col = dp * 16 + (mi >> 1) * 8;
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(b0, b1, b2, b3, smem_u32(vs + key * LD + col));
        mma16816(o[2 * dp], a0, a1, a2, a3, b0, b1);
        mma16816(o[2 * dp + 1], a0, a1, a2, a3, b2, b3);
      }
    }
  }
  // Normalize and store rows r0, r1.
#pragma unroll
  for (int dt = 0; dt < HD / 8; ++dt) {
    const int d = dt * 8 + 2 * tq;
    if (r0 < rows) {
      uint32_t* p = reinterpret_cast<uint32_t*>(out + ((uint64_t)(tok0 + r0) * nh + head) * HD + d);
      *p = pack_bf16x2(__fdiv_rn(o[dt][0], lrow[0]), __fdiv_rn(o[dt][1], lrow[0]));
    }
    if (r1 < rows) {
      uint32_t* p = reinterpret_cast<uint32_t*>(out + ((uint64_t)(tok0 + r1) * nh + head) * HD + d);
      *p = pack_bf16x2(__fdiv_rn(o[dt][2], lrow[1]), __fdiv_rn(o[dt][3], lrow[1]));
    }
  }
}

#define FA_KERNEL(HD, NAME, KV)                                                                                       \
  extern "C" __global__ void __launch_bounds__(FA_WARPS * 32) NAME(                                                   \
      const uint16_t* __restrict__ q, const int4* __restrict__ tiles, const int* __restrict__ block_tables,          \
      const int* __restrict__ bt_stride, const KV* __restrict__ k_cache, const KV* __restrict__ v_cache, float k_scale, float v_scale,   \
      int nh, int nkv, int block_size, float sm_scale, uint16_t* __restrict__ out) {                                  \
    attn_prefill_body<HD, KV>(q, tiles, block_tables, bt_stride, k_cache, v_cache, k_scale, v_scale, nh, nkv,        \
                              block_size, sm_scale, out);                                                             \
  }
FA_KERNEL(16, rt_attn_prefill_bf16_hd16, uint16_t)
FA_KERNEL(32, rt_attn_prefill_bf16_hd32, uint16_t)
FA_KERNEL(64, rt_attn_prefill_bf16_hd64, uint16_t)
FA_KERNEL(128, rt_attn_prefill_bf16_hd128, uint16_t)
FA_KERNEL(16, rt_attn_prefill_fp8_hd16, uint8_t)
FA_KERNEL(32, rt_attn_prefill_fp8_hd32, uint8_t)
FA_KERNEL(64, rt_attn_prefill_fp8_hd64, uint8_t)
FA_KERNEL(128, rt_attn_prefill_fp8_hd128, uint8_t)

// ---------------------------------------------------------------------------------------------
// Flash-decoding on tensor cores (Dao, Haziza, Massa, Sizov: "Flash-Decoding for long-context
// inference", 2023; docs/runtime.md "Decode attention"): same grid, arguments, partition split and
// partial-result layout as rt_attn_decode_* (so rt_attn_combine merges its partitions), but the
// G = nh / nkv query heads of the KV head are the rows of one m16n8k16 A operand (rows >= G are
// zero) and S = Q K^T and O += P V run on mma.sync (BF16 in, FP32 accumulate). One block of 4 warps
// per (query token, KV head, partition); per 64-position chunk, K and V rows are staged in shared
// memory with 16-byte cp.async (rows past the context zero-filled) as two commit groups, so the
// QK product starts while V is still landing. Warp w owns keys 16w..16w+15 of every chunk and keeps
// its own online softmax (max, sum, output); the four warps' states are merged at the end in warp
// order (log-sum-exp merge, deterministic). P enters P V as two BF16 operands, hi = bf16(P) and
// lo = bf16(P - hi), each multiplied by V (the prefill kernel rounds P to BF16 once).
// FP8 KV: the E4M3 bytes are widened to BF16 exactly while building the B fragments; k_scale is
// folded into the score scale and v_scale into the output.
// Dynamic shared memory (bytes): 2 * 64 * (HD * sizeof(KV) + 16) + 16 * (HD + 8) * 2 + 2 * 4 * 16 * 4
// (src/runtime/backend/cuda/decode_attn.rs `flash_smem_bytes` mirrors it).
#define FD_WARPS 4

// Two E4M3 bytes (lo, hi) widened to a BF16 pair (exact: every E4M3 value is a BF16 value).
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t lo, uint32_t hi) {
  return (uint32_t)f2bf(e4m32f((uint8_t)lo)) | ((uint32_t)f2bf(e4m32f((uint8_t)hi)) << 16);
}

// Queue 16-byte cp.async copies of positions p0 .. p0 + 63 of one KV head (row stride RB bytes in
// shared memory); positions at or past p0 + np are zero-filled (src-size 0) and read nothing.
template <int HD, typename KV>
__device__ __forceinline__ void fd_stage(unsigned char* dst, const KV* __restrict__ cache, const int* bt, int p0, int np,
                                         int nkv, int kvh, int block_size) {
  constexpr int ROW = HD * (int)sizeof(KV);
  constexpr int RB = ROW + 16;
  constexpr int PIECES = ROW / 16;
  for (int idx = threadIdx.x; idx < ATT_CHUNK * PIECES; idx += blockDim.x) {
    const int pi = idx / PIECES, part = idx % PIECES;
    const bool live = pi < np;
    const int p = p0 + (live ? pi : 0);
    const unsigned char* src = reinterpret_cast<const unsigned char*>(
                                   cache + (((uint64_t)bt[p / block_size] * nkv + kvh) * block_size + (p % block_size)) * HD) +
                               part * 16;
    const uint32_t d = smem_u32(dst + pi * RB + part * 16);
    const int n = live ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
  }
  asm volatile("cp.async.commit_group;\n" ::);
}

template <int HD, typename KV>
__device__ void attn_flash_body(const int* __restrict__ tok_list, const uint16_t* __restrict__ q,
                                const int* __restrict__ tok_seq, const int* __restrict__ pos,
                                const int* __restrict__ block_tables, const int* __restrict__ bt_stride,
                                const KV* __restrict__ k_cache, const KV* __restrict__ v_cache, float k_scale,
                                float v_scale, int nh, int nkv, int block_size, float sm_scale,
                                uint16_t* __restrict__ out, float* __restrict__ part_ml, float* __restrict__ part_o) {
  constexpr bool F8 = sizeof(KV) == 1;
  constexpr int RB = HD * (int)sizeof(KV) + 16;  // staged row stride, bytes
  constexpr int QLD = HD + 8;                    // Q row stride, elements
  extern __shared__ __align__(16) unsigned char fd_smem[];
  unsigned char* ks = fd_smem;
  unsigned char* vs = ks + ATT_CHUNK * RB;
  uint16_t* qs = reinterpret_cast<uint16_t*>(vs + ATT_CHUNK * RB);
  float* red_m = reinterpret_cast<float*>(qs + 16 * QLD);  // [FD_WARPS][16]
  float* red_l = red_m + FD_WARPS * 16;                     // [FD_WARPS][16]
  float* obuf = reinterpret_cast<float*>(fd_smem);          // [16][HD] after the last chunk
  const int t = tok_list[blockIdx.x], kvh = blockIdx.y, z = blockIdx.z, Z = gridDim.z;
  const int G = nh / nkv;
  const int ctx = pos[t] + 1;
  int nchunks, per;
  att_split(ctx, Z, &nchunks, &per);
  const int c0 = z * per;
  if (c0 >= nchunks) return;  // nothing for this partition
  const int c1 = min(nchunks, c0 + per);
  const int nparts = (nchunks + per - 1) / per;
  const int* bt = block_tables + (uint64_t)tok_seq[t] * (*bt_stride);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  // Q rows (the G heads of this KV head), zero rows up to 16.
  for (int i = threadIdx.x; i < 16 * (HD / 8); i += blockDim.x) {
    const int r = i / (HD / 8), c8 = (i % (HD / 8)) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < G) v = *reinterpret_cast<const uint4*>(q + ((uint64_t)t * nh + kvh * G + r) * HD + c8);
    *reinterpret_cast<uint4*>(qs + r * QLD + c8) = v;
  }
  const float qk_scale = __fmul_rn(sm_scale, F8 ? k_scale : 1.0f);
  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
  const int kw = warp * 16;  // this warp's first key in a chunk
  for (int c = c0; c < c1; ++c) {
    const int p0 = c * ATT_CHUNK;
    const int np = min(ATT_CHUNK, ctx - p0);
    __syncthreads();  // the previous chunk's rows (and the Q stores) are done with
    fd_stage<HD, KV>(ks, k_cache, bt, p0, np, nkv, kvh, block_size);
    fd_stage<HD, KV>(vs, v_cache, bt, p0, np, nkv, kvh, block_size);
    asm volatile("cp.async.wait_group 1;\n" ::);
    __syncthreads();  // K landed
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t a0, a1, a2, a3;
      ldsm_x4(a0, a1, a2, a3, smem_u32(qs + (lane & 15) * QLD + kk * 16 + (lane >> 4) * 8));
      if (F8) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const unsigned char* row = ks + (kw + nt * 8 + g) * RB + kk * 16 + 2 * tq;
          const uint32_t b0 = e4m3x2_to_bf16x2(row[0], row[1]);
          const uint32_t b1 = e4m3x2_to_bf16x2(row[8], row[9]);
          mma16816(s[nt], a0, a1, a2, a3, b0, b1);
        }
      } else {
        const int mi = lane >> 3, ri = lane & 7;
        const int key = kw + (mi >> 1) * 8 + ri;
        const int col = kk * 16 + (mi & 1) * 8;
        uint32_t b0, b1, b2, b3;
        ldsm_x4(b0, b1, b2, b3, smem_u32(ks + key * RB + col * 2));
        mma16816(s[0], a0, a1, a2, a3, b0, b1);
        mma16816(s[1], a0, a1, a2, a3, b2, b3);
      }
    }
    // Scale, mask positions past the context, online softmax (rows g and g + 8).
    float mnew[2] = {mrow[0], mrow[1]};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = kw + nt * 8 + 2 * tq + (i & 1);
        float v = __fmul_rn(s[nt][i], qk_scale);
        if (key >= np) v = -INFINITY;
        s[nt][i] = v;
        mnew[i >> 1] = fmaxf(mnew[i >> 1], v);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mnew[h] = fmaxf(mnew[h], __shfl_xor_sync(FULL, mnew[h], 1));
      mnew[h] = fmaxf(mnew[h], __shfl_xor_sync(FULL, mnew[h], 2));
    }
    float corr[2], lsum[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; ++h) corr[h] = (mnew[h] == -INFINITY) ? 1.f : expf(__fsub_rn(mrow[h], mnew[h]));
    // P as two BF16 operands, hi = bf16(p) and lo = bf16(p - hi), both multiplied by V: P keeps
    // about 16 significant bits in P V instead of BF16's 8 (hi alone failed the whole-model BF16
    // parity tolerance, docs/runtime.md "Decode attention").
    uint32_t pf[4], pl[4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      float e[4], r[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float m = mnew[i >> 1];
        e[i] = (s[nt][i] == -INFINITY) ? 0.f : expf(__fsub_rn(s[nt][i], m));
        lsum[i >> 1] = __fadd_rn(lsum[i >> 1], e[i]);
        r[i] = __fsub_rn(e[i], bf2f(f2bf(e[i])));
      }
      pf[nt * 2 + 0] = pack_bf16x2(e[0], e[1]);
      pf[nt * 2 + 1] = pack_bf16x2(e[2], e[3]);
      pl[nt * 2 + 0] = pack_bf16x2(r[0], r[1]);
      pl[nt * 2 + 1] = pack_bf16x2(r[2], r[3]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lsum[h] = __fadd_rn(lsum[h], __shfl_xor_sync(FULL, lsum[h], 1));
      lsum[h] = __fadd_rn(lsum[h], __shfl_xor_sync(FULL, lsum[h], 2));
      lrow[h] = __fadd_rn(__fmul_rn(lrow[h], corr[h]), lsum[h]);
      mrow[h] = mnew[h];
    }
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt) {
      o[dt][0] = __fmul_rn(o[dt][0], corr[0]);
      o[dt][1] = __fmul_rn(o[dt][1], corr[0]);
      o[dt][2] = __fmul_rn(o[dt][2], corr[1]);
      o[dt][3] = __fmul_rn(o[dt][3], corr[1]);
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();  // V landed
    if (F8) {
      const unsigned char* v0 = vs + (kw + 2 * tq) * RB;
#pragma unroll
      for (int dt = 0; dt < HD / 8; ++dt) {
        const int d = dt * 8 + g;
        const uint32_t b0 = e4m3x2_to_bf16x2(v0[d], v0[RB + d]);
        const uint32_t b1 = e4m3x2_to_bf16x2(v0[8 * RB + d], v0[9 * RB + d]);
        mma16816(o[dt], pf[0], pf[1], pf[2], pf[3], b0, b1);
        mma16816(o[dt], pl[0], pl[1], pl[2], pl[3], b0, b1);
      }
    } else {
#pragma unroll
      for (int dp = 0; dp < HD / 16; ++dp) {
        const int mi = lane >> 3, ri = lane & 7;
        const int key = kw + (mi & 1) * 8 + ri;
        const int col = dp * 16 + (mi >> 1) * 8;
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(b0, b1, b2, b3, smem_u32(vs + key * RB + col * 2));
        mma16816(o[2 * dp], pf[0], pf[1], pf[2], pf[3], b0, b1);
        mma16816(o[2 * dp + 1], pf[0], pf[1], pf[2], pf[3], b2, b3);
        mma16816(o[2 * dp], pl[0], pl[1], pl[2], pl[3], b0, b1);
        mma16816(o[2 * dp + 1], pl[0], pl[1], pl[2], pl[3], b2, b3);
      }
    }
  }
  // Merge the warps' states in warp order: M = max m_w, L = sum l_w e^(m_w - M),
  // O = sum o_w e^(m_w - M).
  __syncthreads();  // staging no longer read: obuf reuses it
  if (tq == 0) {
    red_m[warp * 16 + g] = mrow[0];
    red_m[warp * 16 + g + 8] = mrow[1];
    red_l[warp * 16 + g] = lrow[0];
    red_l[warp * 16 + g + 8] = lrow[1];
  }
  __syncthreads();
  float f[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    float M = -INFINITY;
    for (int w = 0; w < FD_WARPS; ++w) M = fmaxf(M, red_m[w * 16 + r]);
    f[h] = (mrow[h] == -INFINITY) ? 0.f : expf(__fsub_rn(mrow[h], M));
  }
  for (int w = 0; w < FD_WARPS; ++w) {
    if (warp == w) {
#pragma unroll
      for (int dt = 0; dt < HD / 8; ++dt) {
        const int d = dt * 8 + 2 * tq;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = g + 8 * (i >> 1);
          const float v = __fmul_rn(o[dt][i], f[i >> 1]);
          float* dst = obuf + r * HD + d + (i & 1);
          *dst = (w == 0) ? v : __fadd_rn(*dst, v);
        }
      }
    }
    __syncthreads();
  }
  const float vsc = F8 ? v_scale : 1.0f;
  for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
    const int r = i / HD, d = i % HD;
    float M = -INFINITY;
    for (int w = 0; w < FD_WARPS; ++w) M = fmaxf(M, red_m[w * 16 + r]);
    float L = 0.f;
    for (int w = 0; w < FD_WARPS; ++w) {
      const float mw = red_m[w * 16 + r];
      if (mw != -INFINITY) L = __fadd_rn(L, __fmul_rn(red_l[w * 16 + r], expf(__fsub_rn(mw, M))));
    }
    const float ov = __fmul_rn(obuf[r * HD + d], vsc);
    const int head = kvh * G + r;
    if (nparts == 1) {
      out[((uint64_t)t * nh + head) * HD + d] = f2bf(__fdiv_rn(ov, L));
    } else {
      const uint64_t slot = ((uint64_t)t * nh + head) * Z + z;
      part_o[slot * HD + d] = ov;
      if (d == 0) {
        part_ml[slot * 2] = M;
        part_ml[slot * 2 + 1] = L;
      }
    }
  }
}

#define FD_KERNEL(HD, NAME, KV)                                                                                      \
  extern "C" __global__ void __launch_bounds__(FD_WARPS * 32) NAME(                                                  \
      const int* __restrict__ tok_list, const uint16_t* __restrict__ q, const int* __restrict__ tok_seq,           \
      const int* __restrict__ pos, const int* __restrict__ block_tables, const int* __restrict__ bt_stride,         \
      const KV* __restrict__ k_cache, const KV* __restrict__ v_cache, float k_scale, float v_scale, int nh,         \
      int nkv, int hd, int block_size, float sm_scale, uint16_t* __restrict__ out, float* __restrict__ part_ml,     \
      float* __restrict__ part_o) {                                                                                  \
    (void)hd;                                                                                                        \
    attn_flash_body<HD, KV>(tok_list, q, tok_seq, pos, block_tables, bt_stride, k_cache, v_cache, k_scale, v_scale, \
                            nh, nkv, block_size, sm_scale, out, part_ml, part_o);                                   \
  }
FD_KERNEL(64, rt_attn_flash_bf16_hd64, uint16_t)
FD_KERNEL(128, rt_attn_flash_bf16_hd128, uint16_t)
FD_KERNEL(256, rt_attn_flash_bf16_hd256, uint16_t)
FD_KERNEL(64, rt_attn_flash_fp8_hd64, uint8_t)
FD_KERNEL(128, rt_attn_flash_fp8_hd128, uint8_t)
FD_KERNEL(256, rt_attn_flash_fp8_hd256, uint8_t)

// ---------------------------------------------------------------------------------------------
// Sampling on the GPU, one block (1024 threads) per logits row, with vLLM's semantics
// (src/runtime/sampler.rs): temperature < 1e-5 is greedy (argmax, lowest id on ties); otherwise
// softmax(l / T), top-k (keep values >= the k-th largest), top-p (keep the most likely tokens
// whose mass reaches p: found by bisection on a probability threshold), then an inverse-CDF draw
// in id order with a uniform from (seed, draw counter) through SplitMix64.
#define SMP_THREADS 1024
extern "C" __global__ void __launch_bounds__(SMP_THREADS) rt_sample(
    const float* __restrict__ logits, int V, const float* __restrict__ temperature, const float* __restrict__ top_p,
    const int* __restrict__ top_k, const uint64_t* __restrict__ seed, const uint64_t* __restrict__ draw,
    int* __restrict__ out) {
  __shared__ float red[32];
  __shared__ float redv[32];
  __shared__ int redi[32];
  const int r = blockIdx.x;
  const float* l = logits + (uint64_t)r * V;
  const float T = temperature[r];
  // Argmax (lowest id on ties; NaN never wins).
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = l[i];
    if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(FULL, bv, o);
    const int oi = __shfl_xor_sync(FULL, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
  }
  const int w = threadIdx.x >> 5, ln = threadIdx.x & 31;
  if (ln == 0) { redv[w] = bv; redi[w] = bi; }
  __syncthreads();
  if (threadIdx.x == 0) {
    float b = -INFINITY;
    int id = 0x7fffffff;
    for (int i = 0; i < (int)(blockDim.x >> 5); ++i)
      if (redv[i] > b || (redv[i] == b && redi[i] < id)) { b = redv[i]; id = redi[i]; }
    redv[0] = b;
    redi[0] = id == 0x7fffffff ? 0 : id;
  }
  __syncthreads();
  const float lmax = redv[0];
  const int amax = redi[0];
  if (T < 1e-5f || !(lmax > -INFINITY)) {
    if (threadIdx.x == 0) out[r] = amax;
    return;
  }
  // Unnormalized probabilities e_i = exp((l_i - max) / T); thresholds in that scale.
  const float invT = 1.0f / T;
  // top-k: bisection on the value threshold so that count(e >= th) >= k, largest such th.
  float lo_th = 0.f;
  const int k = top_k[r];
  if (k > 0 && k < V) {
    float lo = 0.f, hi = 1.0f;
    for (int it = 0; it < 40; ++it) {
      const float mid = 0.5f * (lo + hi);
      float c = 0.f;
      for (int i = threadIdx.x; i < V; i += blockDim.x) c += (expf((l[i] - lmax) * invT) >= mid) ? 1.f : 0.f;
      c = block_sum(c, red);
      if (c >= (float)k) lo = mid; else hi = mid;
    }
    lo_th = lo;
  }
  float z = 0.f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float e = expf((l[i] - lmax) * invT);
    if (e >= lo_th) z += e;
  }
  z = block_sum(z, red);
  float th = lo_th;
  const float p = top_p[r];
  if (p < 1.0f) {
    // Largest threshold tau >= lo_th with mass(e >= tau) >= p * z.
    float lo = lo_th, hi = 1.0f;
    for (int it = 0; it < 40; ++it) {
      const float mid = 0.5f * (lo + hi);
      float c = 0.f;
      for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float e = expf((l[i] - lmax) * invT);
        if (e >= mid) c += e;
      }
      c = block_sum(c, red);
      if (c >= p * z) lo = mid; else hi = mid;
    }
    th = lo;
  }
  float kept = 0.f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float e = expf((l[i] - lmax) * invT);
    if (e >= th) kept += e;
  }
  kept = block_sum(kept, red);
  // Uniform in [0, 1) from (seed, draw).
  const uint64_t h = mix64(mix64(seed[r] + SM_GAMMA) ^ (draw[r] * 0xD6E8FEB86659FD93ull) + SM_GAMMA);
  const float u = (float)((double)(h >> 11) / 9007199254740992.0) * kept;
  // Inverse CDF in id order: chunks of blockDim ids, prefix sums within the chunk.
  __shared__ float run;
  __shared__ int chosen;
  if (threadIdx.x == 0) { run = 0.f; chosen = 0x7fffffff; }
  __syncthreads();
  for (int base = 0; base < V; base += blockDim.x) {
    const int i = base + threadIdx.x;
    float e = 0.f;
    if (i < V) {
      e = expf((l[i] - lmax) * invT);
      if (e < th) e = 0.f;
    }
    // Inclusive scan over the block (warp scans, then warp totals).
    float x = e;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(FULL, x, o);
      if (ln >= o) x += y;
    }
    __syncthreads();
    if (ln == 31) red[w] = x;
    __syncthreads();
    float before = run;
    for (int j = 0; j < w; ++j) before += red[j];
    const float cum = before + x;
    const bool hit = e > 0.f && u < cum && u >= cum - e;
    if (hit) atomicMin(&chosen, i);
    __syncthreads();
    if (threadIdx.x == 0) {
      float tot = 0.f;
      for (int j = 0; j < (int)(blockDim.x >> 5); ++j) tot += red[j];
      run += tot;
    }
    __syncthreads();
    if (chosen != 0x7fffffff) break;
  }
  if (threadIdx.x == 0) out[r] = chosen != 0x7fffffff ? chosen : amax;
}
