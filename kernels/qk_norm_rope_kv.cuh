// The attention prologue shared by the dense decoder (kernels/runtime.cu, rt_qk_norm_rope_kv)
// and the hybrids' gated attention layers (kernels/gdn.cu, hy_qk_norm_rope_kv): for one token
// and one head, the optional q/k RMSNorm over head_dim, RoPE rotate-half over the first `rot`
// dimensions, then q to q_out (BF16) and k, v to their slot of the paged KV cache
// ([num_blocks][kv_heads][block_size][head_dim], BF16, or E4M3 holding e4m3(x * inv) with the
// per-layer inverse scale). The caller picks `src`, the head's hd input values, from its own
// qkv row layout. Conventions are kernels/runtime.cu's (the CPU backend is the reference):
// every rounding the CPU fixes uses an explicit _rn intrinsic.
//
// Needs common.cuh and a `block_sum(float v, float* red)` (the including source's). One CTA of
// blockDim.x (a multiple of 32, <= 256) threads per (token, head); hd <= 512.

#pragma once

__device__ __forceinline__ void qk_norm_rope_kv_head(
    const uint16_t* __restrict__ src, int t, int h, int nh, int nkv, int hd, int rot,
    const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ inv_freq,
    float eps, const int* __restrict__ pos, const int* __restrict__ slot, uint16_t* __restrict__ q_out,
    void* __restrict__ k_cache, void* __restrict__ v_cache, int block_size, int kv_fp8, float k_inv,
    float v_inv) {
  __shared__ float red[32];
  __shared__ float buf[512];
  const bool is_q = h < nh;
  const bool is_k = !is_q && h < nh + nkv;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) buf[i] = bf2f(src[i]);
  __syncthreads();
  if (is_q || is_k) {
    const float* nw = is_q ? qn : kn;
    if (nw) {
      float ss = 0.f;
      for (int i = threadIdx.x; i < hd; i += blockDim.x) ss = __fmaf_rn(buf[i], buf[i], ss);
      const float ms = __fdiv_rn(block_sum(ss, red), (float)hd);
      const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
      __syncthreads();
      for (int i = threadIdx.x; i < hd; i += blockDim.x) buf[i] = __fmul_rn(__fmul_rn(buf[i], inv), nw[i]);
      __syncthreads();
    }
    const int half = rot / 2;
    const float p = (float)pos[t];
    // Each thread rotates its own pairs (i, i + half): no other thread touches them.
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      const float ang = __fmul_rn(p, inv_freq[i]);
      float s, c;
      sincosf(ang, &s, &c);
      const float a = buf[i], b = buf[i + half];
      buf[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
      buf[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
    __syncthreads();
  }
  if (is_q) {
    uint16_t* o = q_out + ((uint64_t)t * nh + h) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) o[i] = f2bf(buf[i]);
    return;
  }
  const int kvh = is_k ? h - nh : h - nh - nkv;
  const int s = slot[t];
  const int blk = s / block_size, boff = s % block_size;
  const uint64_t base = (((uint64_t)blk * nkv + kvh) * block_size + boff) * hd;
  if (kv_fp8) {
    uint8_t* c = reinterpret_cast<uint8_t*>(is_k ? k_cache : v_cache) + base;
    const float inv = is_k ? k_inv : v_inv;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) c[i] = f2e4m3(__fmul_rn(buf[i], inv));
  } else {
    uint16_t* c = reinterpret_cast<uint16_t*>(is_k ? k_cache : v_cache) + base;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) c[i] = f2bf(buf[i]);
  }
}
