// rigbench built-in runtime: the kernels of the Qwen3.5 / 3.6 hybrids (Gated-DeltaNet layers and
// the gated, partially rotated attention layers with head_dim up to 256). The reference is the
// CPU backend (src/runtime/gdn.rs, src/runtime/backend/cpu.rs); read docs/runtime.md.
//
// Conventions (those of kernels/runtime.cu):
// - every GEMM output is BF16; the Gated-DeltaNet convolution output and the mixer output are
//   stored in BF16 (the points where the CPU backend's GPU-rounding mode rounds);
// - the recurrent state is FP32 [slots][value_heads][dk][dv] per layer; the convolution state is
//   BF16 [slots][K - 1][conv_dim] per layer, oldest row first;
// - per-segment metadata `segs` is int4 {first token, tokens, state slot, reset}: `reset` (the
//   segment starts at position 0) reads zeros instead of the slot's state;
// - float operations whose order the CPU fixes use the explicit _rn intrinsics.

#include "common.cuh"
__device__ __forceinline__ float silu(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float sigmoid(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }
// torch.nn.functional.softplus (beta 1, threshold 20).
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// Block-wide sum for blockDim.x a multiple of 32 (<= 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (l == 0) red[w] = v;
  __syncthreads();
  float s = 0.f;
  for (int i = 0; i < nw; ++i) s += red[i];
  return s;
}

// ---------------------------------------------------------------------------------------------
// Causal depthwise convolution with SiLU and the rolling state. One thread per (channel,
// segment): it walks the segment's tokens in order with the last K - 1 inputs in registers.
// x: [T][ldx] BF16 (the in_proj_qkv outputs are its first C columns); w: [C][K] f32;
// state: [slots][K - 1][C] BF16; out: [T][C] BF16. grid (ceil(C / blockDim), segments).
#define GDN_MAX_K 8
extern "C" __global__ void gdn_conv_silu(const uint16_t* __restrict__ x, int ldx, int C, int K,
                                         const float* __restrict__ w, const int4* __restrict__ segs,
                                         uint16_t* __restrict__ state, uint16_t* __restrict__ out) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= C) return;
  const int4 sg = segs[blockIdx.y];
  const int hist = K - 1;
  // The window and the weights stay in registers: every index below is a compile-time constant.
  float win[GDN_MAX_K - 1];
  float wt[GDN_MAX_K - 1];
  uint16_t* st = state + (uint64_t)sg.z * hist * C;
#pragma unroll
  for (int j = 0; j < GDN_MAX_K - 1; ++j) {
    wt[j] = j < hist ? w[(uint64_t)ch * K + j] : 0.f;
    win[j] = (j < hist && !sg.w) ? bf2f(st[(uint64_t)j * C + ch]) : 0.f;
  }
  const float wlast = w[(uint64_t)ch * K + hist];
  for (int i = 0; i < sg.y; ++i) {
    const uint64_t t = (uint64_t)(sg.x + i);
    const float xt = bf2f(x[t * ldx + ch]);
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < GDN_MAX_K - 1; ++j)
      if (j < hist) s = __fadd_rn(s, __fmul_rn(wt[j], win[j]));
    s = __fadd_rn(s, __fmul_rn(wlast, xt));
    out[t * C + ch] = f2bf(silu(s));
#pragma unroll
    for (int j = 0; j < GDN_MAX_K - 1; ++j) {
      if (j + 1 < hist) win[j] = win[j + 1];
      else if (j + 1 == hist) win[j] = xt;
    }
  }
#pragma unroll
  for (int j = 0; j < GDN_MAX_K - 1; ++j)
    if (j < hist) st[(uint64_t)j * C + ch] = f2bf(win[j]);
}

// q (normalised, scaled by 1/sqrt(dk)) and k (normalised) of key head kh of token t into shared
// qs, ks (dk each), by the whole block; l2norm: x * rsqrt(sum x^2 + 1e-6).
__device__ __forceinline__ void gdn_load_qk(const uint16_t* __restrict__ mixed, int C, uint64_t t, int kh, int key_dim,
                                            int dk, float* qs, float* ks, float* red) {
  const uint16_t* row = mixed + t * C;
  float sq = 0.f, sk = 0.f;
  for (int i = threadIdx.x; i < dk; i += blockDim.x) {
    const float q = bf2f(row[kh * dk + i]);
    const float k = bf2f(row[key_dim + kh * dk + i]);
    qs[i] = q;
    ks[i] = k;
    sq = __fmaf_rn(q, q, sq);
    sk = __fmaf_rn(k, k, sk);
  }
  const float tq = block_sum(sq, red);
  const float tk = block_sum(sk, red);
  const float iq = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(tq, 1e-6f)));
  const float ik = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(tk, 1e-6f)));
  const float scale = __fdiv_rn(1.0f, __fsqrt_rn((float)dk));
  for (int i = threadIdx.x; i < dk; i += blockDim.x) {
    qs[i] = __fmul_rn(__fmul_rn(qs[i], iq), scale);
    ks[i] = __fmul_rn(ks[i], ik);
  }
  __syncthreads();
}

// g (log decay) and beta of token t, value head h, from the fused [in_proj_a; in_proj_b] output.
__device__ __forceinline__ void gdn_gates(const uint16_t* __restrict__ ab, int nv, uint64_t t, int h,
                                          const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                          float* g, float* beta) {
  const float a = bf2f(ab[t * 2 * nv + h]);
  const float b = bf2f(ab[t * 2 * nv + nv + h]);
  *g = __fmul_rn(-expf(a_log[h]), softplus(__fadd_rn(a, dt_bias[h])));
  *beta = sigmoid(b);
}

// ---------------------------------------------------------------------------------------------
// The recurrent form (decode and draft verification): one block per (value head, segment),
// 4 * dv threads; thread (kq, v) keeps rows kq*R .. kq*R + R - 1 of column v of the state in
// registers (R = dk / 4 <= 32). Per token: S *= e^g; S^T k; delta = beta (v - S^T k);
// S += k delta^T; o = S^T q (partial sums over the four row groups added in order).
// mixed: [T][C] BF16 (q | k | v); ab: [T][2 nv] BF16; ssm: [slots][nv][dk][dv] f32;
// out: [T][nv * dv] BF16.
#define GDN_KS 4
#define GDN_MAX_R 32
#define GDN_MAX_DK 128
#define GDN_MAX_DV 128
extern "C" __global__ void __launch_bounds__(GDN_KS * GDN_MAX_DV) gdn_recurrent(
    const uint16_t* __restrict__ mixed, const uint16_t* __restrict__ ab, const float* __restrict__ a_log,
    const float* __restrict__ dt_bias, const int4* __restrict__ segs, int nk, int nv, int dk, int dv,
    float* __restrict__ ssm, uint16_t* __restrict__ out) {
  __shared__ float qs[GDN_MAX_DK], ks[GDN_MAX_DK];
  __shared__ float part[GDN_KS * GDN_MAX_DV];
  __shared__ float dl[GDN_MAX_DV];
  __shared__ float red[32];
  const int h = blockIdx.x;
  const int4 sg = segs[blockIdx.y];
  const int v = threadIdx.x % dv, kq = threadIdx.x / dv;
  const int R = dk / GDN_KS;
  const int key_dim = nk * dk, C = 2 * key_dim + nv * dv;
  const int kh = h / (nv / nk);
  const int r0 = kq * R;
  float* S = ssm + ((uint64_t)sg.z * nv + h) * dk * dv;
  float s[GDN_MAX_R];
#pragma unroll
  for (int r = 0; r < GDN_MAX_R; ++r) s[r] = (!sg.w && r < R) ? S[(uint64_t)(r0 + r) * dv + v] : 0.f;
  for (int i = 0; i < sg.y; ++i) {
    const uint64_t t = (uint64_t)(sg.x + i);
    gdn_load_qk(mixed, C, t, kh, key_dim, dk, qs, ks, red);
    float g, beta;
    gdn_gates(ab, nv, t, h, a_log, dt_bias, &g, &beta);
    const float decay = expf(g);
    float acc = 0.f;
#pragma unroll
    for (int r = 0; r < GDN_MAX_R; ++r) {
      if (r < R) {
        s[r] = __fmul_rn(s[r], decay);
        acc = __fmaf_rn(s[r], ks[r0 + r], acc);
      }
    }
    part[kq * dv + v] = acc;
    __syncthreads();
    if (kq == 0) {
      float kv = 0.f;
      for (int j = 0; j < GDN_KS; ++j) kv = __fadd_rn(kv, part[j * dv + v]);
      const float vv = bf2f(mixed[t * C + 2 * key_dim + h * dv + v]);
      dl[v] = __fmul_rn(__fsub_rn(vv, kv), beta);
    }
    __syncthreads();
    const float d = dl[v];
    float o = 0.f;
#pragma unroll
    for (int r = 0; r < GDN_MAX_R; ++r) {
      if (r < R) {
        s[r] = __fmaf_rn(ks[r0 + r], d, s[r]);
        o = __fmaf_rn(s[r], qs[r0 + r], o);
      }
    }
    part[kq * dv + v] = o;
    __syncthreads();
    if (kq == 0) {
      float ov = 0.f;
      for (int j = 0; j < GDN_KS; ++j) ov = __fadd_rn(ov, part[j * dv + v]);
      out[t * (uint64_t)(nv * dv) + h * dv + v] = f2bf(ov);
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < GDN_MAX_R; ++r)
    if (r < R) S[(uint64_t)(r0 + r) * dv + v] = s[r];
}

// ---------------------------------------------------------------------------------------------
// The chunked form (prefill): one block per (value head, segment); the segment's tokens in
// chunks of `chunk` rows from its start, the state S [dk][dv] in shared memory. Per chunk, with
// cumulative log decays c_i: A_ij = beta_i (k_i . k_j) e^(c_i - c_j) (j < i); U = (I + A)^-1 beta V
// and W = (I + A)^-1 (beta K e^c) by forward substitution; V' = U - W S;
// o_i = e^(c_i) q_i S + sum_{j <= i} (q_i . k_j) e^(c_i - c_j) v'_j;
// S <- e^(c_L) S + sum_j e^(c_L - c_j) k_j v'_j^T. Dynamic shared memory (floats):
// Q, K, W [chunk][dk]; U [chunk][dv]; M [chunk][chunk]; c, beta [chunk]; S [dk][dv].
extern "C" __global__ void gdn_chunked(const uint16_t* __restrict__ mixed, const uint16_t* __restrict__ ab,
                                       const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                       const int4* __restrict__ segs, int nk, int nv, int dk, int dv, int chunk,
                                       float* __restrict__ ssm, uint16_t* __restrict__ out) {
  extern __shared__ float sm[];
  float* Q = sm;
  float* K = Q + chunk * dk;
  float* W = K + chunk * dk;
  float* U = W + chunk * dk;
  float* M = U + chunk * dv;
  float* cum = M + chunk * chunk;
  float* bt = cum + chunk;
  float* S = bt + chunk;
  const int h = blockIdx.x;
  const int4 sg = segs[blockIdx.y];
  const int key_dim = nk * dk, C = 2 * key_dim + nv * dv;
  const int kh = h / (nv / nk);
  const int nthr = blockDim.x, tid = threadIdx.x;
  float* Sg = ssm + ((uint64_t)sg.z * nv + h) * dk * dv;
  for (int i = tid; i < dk * dv; i += nthr) S[i] = sg.w ? 0.f : Sg[i];
  __syncthreads();
  const float scale = __fdiv_rn(1.0f, __fsqrt_rn((float)dk));
  for (int c0 = 0; c0 < sg.y; c0 += chunk) {
    const int L = min(chunk, sg.y - c0);
    // Rows: raw q, k, v; one warp per row for the norms.
    for (int idx = tid; idx < L * dk; idx += nthr) {
      const int i = idx / dk, x = idx % dk;
      const uint64_t t = (uint64_t)(sg.x + c0 + i);
      Q[i * dk + x] = bf2f(mixed[t * C + kh * dk + x]);
      K[i * dk + x] = bf2f(mixed[t * C + key_dim + kh * dk + x]);
    }
    for (int idx = tid; idx < L * dv; idx += nthr) {
      const int i = idx / dv, x = idx % dv;
      const uint64_t t = (uint64_t)(sg.x + c0 + i);
      U[i * dv + x] = bf2f(mixed[t * C + 2 * key_dim + h * dv + x]);
    }
    if (tid < L) {
      float g, beta;
      gdn_gates(ab, nv, (uint64_t)(sg.x + c0 + tid), h, a_log, dt_bias, &g, &beta);
      cum[tid] = g;
      bt[tid] = beta;
    }
    __syncthreads();
    {
      const int warp = tid >> 5, lane = tid & 31, nw = nthr >> 5;
      for (int i = warp; i < L; i += nw) {
        float sq = 0.f, sk = 0.f;
        for (int x = lane; x < dk; x += 32) {
          sq = __fmaf_rn(Q[i * dk + x], Q[i * dk + x], sq);
          sk = __fmaf_rn(K[i * dk + x], K[i * dk + x], sk);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
          sq += __shfl_xor_sync(FULL, sq, o);
          sk += __shfl_xor_sync(FULL, sk, o);
        }
        const float iq = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(sq, 1e-6f)));
        const float ik = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(sk, 1e-6f)));
        for (int x = lane; x < dk; x += 32) {
          Q[i * dk + x] = __fmul_rn(__fmul_rn(Q[i * dk + x], iq), scale);
          K[i * dk + x] = __fmul_rn(K[i * dk + x], ik);
        }
      }
      if (tid == 0) {  // cumulative decay, in order
        float a = 0.f;
        for (int i = 0; i < L; ++i) {
          a = __fadd_rn(a, cum[i]);
          cum[i] = a;
        }
      }
    }
    __syncthreads();
    // M = A (strictly lower); U = beta V; W = beta K e^c.
    for (int idx = tid; idx < L * L; idx += nthr) {
      const int i = idx / L, j = idx % L;
      float a = 0.f;
      if (j < i) {
        float d = 0.f;
        for (int x = 0; x < dk; ++x) d = __fmaf_rn(K[i * dk + x], K[j * dk + x], d);
        a = __fmul_rn(__fmul_rn(bt[i], d), expf(__fsub_rn(cum[i], cum[j])));
      }
      M[i * chunk + j] = a;
    }
    for (int idx = tid; idx < L * dv; idx += nthr) U[idx] = __fmul_rn(bt[idx / dv], U[idx]);
    for (int idx = tid; idx < L * dk; idx += nthr) {
      const int i = idx / dk;
      W[idx] = __fmul_rn(__fmul_rn(bt[i], K[idx]), expf(cum[i]));
    }
    __syncthreads();
    // Forward substitution, row by row (columns in parallel).
    for (int i = 1; i < L; ++i) {
      for (int x = tid; x < dv + dk; x += nthr) {
        if (x < dv) {
          float u = U[i * dv + x];
          for (int j = 0; j < i; ++j) u = __fsub_rn(u, __fmul_rn(M[i * chunk + j], U[j * dv + x]));
          U[i * dv + x] = u;
        } else {
          const int y = x - dv;
          float wv = W[i * dk + y];
          for (int j = 0; j < i; ++j) wv = __fsub_rn(wv, __fmul_rn(M[i * chunk + j], W[j * dk + y]));
          W[i * dk + y] = wv;
        }
      }
      __syncthreads();
    }
    // V' = U - W S (in U).
    for (int idx = tid; idx < L * dv; idx += nthr) {
      const int i = idx / dv, v = idx % dv;
      float u = U[idx];
      for (int x = 0; x < dk; ++x) u = __fsub_rn(u, __fmul_rn(W[i * dk + x], S[x * dv + v]));
      U[idx] = u;
    }
    // M = (q_i . k_j) e^(c_i - c_j) for j <= i.
    __syncthreads();
    for (int idx = tid; idx < L * L; idx += nthr) {
      const int i = idx / L, j = idx % L;
      float a = 0.f;
      if (j <= i) {
        float d = 0.f;
        for (int x = 0; x < dk; ++x) d = __fmaf_rn(Q[i * dk + x], K[j * dk + x], d);
        a = __fmul_rn(d, expf(__fsub_rn(cum[i], cum[j])));
      }
      M[i * chunk + j] = a;
    }
    __syncthreads();
    // Outputs.
    for (int idx = tid; idx < L * dv; idx += nthr) {
      const int i = idx / dv, v = idx % dv;
      const float e = expf(cum[i]);
      float o = 0.f;
      for (int x = 0; x < dk; ++x) o = __fmaf_rn(__fmul_rn(Q[i * dk + x], e), S[x * dv + v], o);
      for (int j = 0; j <= i; ++j) o = __fmaf_rn(M[i * chunk + j], U[j * dv + v], o);
      out[(uint64_t)(sg.x + c0 + i) * (nv * dv) + h * dv + v] = f2bf(o);
    }
    __syncthreads();
    // State update.
    const float last = cum[L - 1];
    const float el = expf(last);
    for (int idx = tid; idx < dk * dv; idx += nthr) {
      const int x = idx / dv, v = idx % dv;
      float s = __fmul_rn(S[idx], el);
      for (int j = 0; j < L; ++j) s = __fmaf_rn(__fmul_rn(K[j * dk + x], expf(__fsub_rn(last, cum[j]))), U[j * dv + v], s);
      S[idx] = s;
    }
    __syncthreads();
  }
  for (int i = tid; i < dk * dv; i += nthr) Sg[i] = S[i];
}

// ---------------------------------------------------------------------------------------------
// Gated RMSNorm per value head: y = w * o * rsqrt(mean(o^2) + eps) * silu(z). o: [T][nv dv] BF16;
// z: row t at z + t * ldz (the in_proj_z part of the fused GEMM output); out: [T][nv dv] BF16.
// grid (T, nv), block 32..256.
extern "C" __global__ void gdn_gated_norm(const uint16_t* __restrict__ o, const uint16_t* __restrict__ z, int ldz,
                                          const float* __restrict__ w, int nv, int dv, float eps,
                                          uint16_t* __restrict__ out) {
  __shared__ float red[32];
  const uint64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const uint16_t* oh = o + t * (uint64_t)(nv * dv) + h * dv;
  const uint16_t* zh = z + t * (uint64_t)ldz + h * dv;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dv; i += blockDim.x) {
    const float x = bf2f(oh[i]);
    ss = __fmaf_rn(x, x, ss);
  }
  const float ms = __fdiv_rn(block_sum(ss, red), (float)dv);
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
  for (int i = threadIdx.x; i < dv; i += blockDim.x) {
    const float y = __fmul_rn(__fmul_rn(w[i], __fmul_rn(bf2f(oh[i]), inv)), silu(bf2f(zh[i])));
    out[t * (uint64_t)(nv * dv) + h * dv + i] = f2bf(y);
  }
}

// ---------------------------------------------------------------------------------------------
#include "qk_norm_rope_kv.cuh"

// Gated attention layers. q/k RMSNorm (weights already 1 + w), RoPE over the first `rot`
// dimensions (rotate-half pairs (i, i + rot/2)), q -> q_out, k, v -> the paged KV cache.
// qkv row (width 2 nh hd + 2 nkv hd): per query head hd query values then hd gate values, then
// the k heads, then the v heads. grid (T, nh + 2 nkv), block 32..256; hd <= 512.
extern "C" __global__ void hy_qk_norm_rope_kv(const uint16_t* __restrict__ qkv, int T, int nh, int nkv, int hd,
                                              int rot, const float* __restrict__ qn, const float* __restrict__ kn,
                                              const float* __restrict__ inv_freq, float eps,
                                              const int* __restrict__ pos, const int* __restrict__ slot,
                                              uint16_t* __restrict__ q_out, void* __restrict__ k_cache,
                                              void* __restrict__ v_cache, int block_size, int kv_fp8, float k_inv,
                                              float v_inv) {
  const int t = blockIdx.x;
  const int h = blockIdx.y;
  if (t >= T) return;
  const int width = 2 * nh * hd + 2 * nkv * hd;
  const bool is_q = h < nh;
  const uint64_t off = is_q ? (uint64_t)h * 2 * hd : (uint64_t)2 * nh * hd + (uint64_t)(h - nh) * hd;
  const uint16_t* src = qkv + (uint64_t)t * width + off;
  qk_norm_rope_kv_head(src, t, h, nh, nkv, hd, rot, qn, kn, inv_freq, eps, pos, slot, q_out, k_cache, v_cache,
                       block_size, kv_fp8, k_inv, v_inv);
}

// attn[t][h hd + i] = bf16(attn * sigmoid(gate)), gate = qkv[t * width + h * 2 hd + hd + i].
extern "C" __global__ void hy_attn_gate(uint16_t* __restrict__ attn, const uint16_t* __restrict__ qkv, int T, int nh,
                                        int hd, int width) {
  const uint64_t n = (uint64_t)T * nh * hd;
  for (uint64_t j = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (uint64_t)gridDim.x * blockDim.x) {
    const uint64_t t = j / ((uint64_t)nh * hd);
    const int r = (int)(j % ((uint64_t)nh * hd));
    const int h = r / hd, i = r % hd;
    const float g = bf2f(qkv[t * width + (uint64_t)h * 2 * hd + hd + i]);
    attn[j] = f2bf(__fmul_rn(bf2f(attn[j]), sigmoid(g)));
  }
}

// ---------------------------------------------------------------------------------------------
// Attention on CUDA cores for head_dim up to 256 (the gated layers of the 27B-class models):
// the partition scheme of kernels/runtime.cu's rt_attn_decode_* (one block per query token, KV
// head and partition; ATT_CHUNK-position chunks split over the partitions; the G query heads of
// a KV head share each K/V row; online softmax; rt_attn_combine merges the partitions), with
// each chunk staged in two halves of HY_SUB rows so that K and V rows of 256 dimensions fit the
// 48 KiB of static shared memory.
#define ATT_CHUNK 64
#define HY_THREADS 128
#define HY_SUB 32
#define HY_MAX_G 16
#define HY_MAX_HD 256
#define HY_MAX_QD 2048
#define HY_ACC (HY_MAX_QD / HY_THREADS)
#define HY_STAGE (HY_SUB * (HY_MAX_HD * 2 + 4))

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

template <typename KV>
__device__ __forceinline__ void hy_stage(unsigned char* stage, const KV* __restrict__ cache, const int* bt, int p0,
                                         int np, int nkv, int kvh, int block_size, int hd) {
  const int row_bytes = hd * (int)sizeof(KV);
  const int stride = row_bytes + 4;
  const int per_row = row_bytes / 4;
  for (int idx = threadIdx.x; idx < np * per_row; idx += blockDim.x) {
    const int pi = idx / per_row, part = idx % per_row;
    const int p = p0 + pi;
    const uint32_t* src = reinterpret_cast<const uint32_t*>(
        cache + (((uint64_t)bt[p / block_size] * nkv + kvh) * block_size + (p % block_size)) * hd);
    *reinterpret_cast<uint32_t*>(stage + pi * stride + part * 4) = src[part];
  }
}

template <typename KV>
__device__ void hy_attn_body(const int* __restrict__ tok_list, const uint16_t* __restrict__ q,
                             const int* __restrict__ tok_seq, const int* __restrict__ pos,
                             const int* __restrict__ block_tables, const int* __restrict__ bt_stride,
                             const KV* __restrict__ k_cache, const KV* __restrict__ v_cache, float k_scale,
                             float v_scale, int nh, int nkv, int hd, int block_size, float sm_scale,
                             uint16_t* __restrict__ out, float* __restrict__ part_ml, float* __restrict__ part_o) {
  __shared__ float qs[HY_MAX_QD];
  __shared__ float sc[HY_MAX_G * HY_SUB];
  __shared__ __align__(16) unsigned char stage[HY_STAGE];
  __shared__ float m_s[HY_MAX_G], l_s[HY_MAX_G], c_s[HY_MAX_G];
  const int t = tok_list[blockIdx.x], kvh = blockIdx.y, z = blockIdx.z, Z = gridDim.z;
  const int G = nh / nkv;
  const int ctx = pos[t] + 1;
  const int nchunks = (ctx + ATT_CHUNK - 1) / ATT_CHUNK;
  const int per = (nchunks + Z - 1) / Z;
  const int c0 = z * per;
  if (c0 >= nchunks) return;
  const int c1 = min(nchunks, c0 + per);
  const int nparts = (nchunks + per - 1) / per;
  const int* bt = block_tables + (uint64_t)tok_seq[t] * (*bt_stride);
  const int qd = G * hd;
  const int stride = hd * (int)sizeof(KV) + 4;
  const int words = hd * (int)sizeof(KV) / 4;
  const int epw = 4 / (int)sizeof(KV);
  for (int i = threadIdx.x; i < qd; i += blockDim.x) qs[i] = bf2f(q[((uint64_t)t * nh + kvh * G) * hd + i]);
  if (threadIdx.x < G) {
    m_s[threadIdx.x] = -INFINITY;
    l_s[threadIdx.x] = 0.f;
  }
  float acc[HY_ACC];
#pragma unroll
  for (int j = 0; j < HY_ACC; ++j) acc[j] = 0.f;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  for (int c = c0; c < c1; ++c) {
    for (int half = 0; half < ATT_CHUNK / HY_SUB; ++half) {
      const int p0 = c * ATT_CHUNK + half * HY_SUB;
      if (p0 >= ctx) break;
      const int np = min(HY_SUB, ctx - p0);
      __syncthreads();  // the previous rows are no longer read
      hy_stage<KV>(stage, k_cache, bt, p0, np, nkv, kvh, block_size, hd);
      __syncthreads();
      // Scores: four threads per position, each over a quarter of the row's words.
      {
        const int pi = threadIdx.x >> 2, quarter = threadIdx.x & 3;
        float dotv[HY_MAX_G];
#pragma unroll
        for (int g = 0; g < HY_MAX_G; ++g) dotv[g] = 0.f;
        if (pi < np) {
          const uint32_t* row = reinterpret_cast<const uint32_t*>(stage + pi * stride);
          const int w0 = quarter * (words / 4), w1 = w0 + words / 4;
          for (int wi = w0; wi < w1; ++wi) {
            float kv[4];
            kv_word(row[wi], (const KV*)nullptr, k_scale, kv);
            for (int e = 0; e < epw; ++e) {
              const int d = wi * epw + e;
#pragma unroll
              for (int g = 0; g < HY_MAX_G; ++g)
                if (g < G) dotv[g] = __fmaf_rn(qs[g * hd + d], kv[e], dotv[g]);
            }
          }
        }
#pragma unroll
        for (int g = 0; g < HY_MAX_G; ++g) {
          if (g < G) {
            float s = __fadd_rn(dotv[g], __shfl_xor_sync(FULL, dotv[g], 1));
            s = __fadd_rn(s, __shfl_xor_sync(FULL, s, 2));
            if (pi < np && quarter == 0) sc[g * HY_SUB + pi] = __fmul_rn(s, sm_scale);
          }
        }
      }
      __syncthreads();
      // Online softmax per head: one warp per head.
      for (int g = warp; g < G; g += nwarps) {
        float cm = -INFINITY;
        for (int pi = lane; pi < np; pi += 32) cm = fmaxf(cm, sc[g * HY_SUB + pi]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(FULL, cm, o));
        const float mold = m_s[g];
        const float mnew = fmaxf(mold, cm);
        float sum = 0.f;
        for (int pi = lane; pi < np; pi += 32) {
          const float e = expf(__fsub_rn(sc[g * HY_SUB + pi], mnew));
          sc[g * HY_SUB + pi] = e;
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
      // V rows into the same staging buffer (the K rows are no longer read).
      hy_stage<KV>(stage, v_cache, bt, p0, np, nkv, kvh, block_size, hd);
      __syncthreads();
#pragma unroll
      for (int j = 0; j < HY_ACC; ++j) {
        const int i = threadIdx.x + j * HY_THREADS;
        if (i < qd) {
          const int g = i / hd, d = i % hd;
          float o = __fmul_rn(acc[j], c_s[g]);
          for (int pi = 0; pi < np; ++pi)
            o = __fmaf_rn(sc[g * HY_SUB + pi], kv_elem(stage + pi * stride, d, (const KV*)nullptr, v_scale), o);
          acc[j] = o;
        }
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < HY_ACC; ++j) {
    const int i = threadIdx.x + j * HY_THREADS;
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

extern "C" __global__ void __launch_bounds__(HY_THREADS) hy_attn_decode_bf16(
    const int* __restrict__ tok_list, const uint16_t* __restrict__ q, const int* __restrict__ tok_seq,
    const int* __restrict__ pos, const int* __restrict__ block_tables, const int* __restrict__ bt_stride,
    const uint16_t* __restrict__ k_cache, const uint16_t* __restrict__ v_cache, float k_scale, float v_scale, int nh,
    int nkv, int hd, int block_size, float sm_scale, uint16_t* __restrict__ out, float* __restrict__ part_ml,
    float* __restrict__ part_o) {
  hy_attn_body<uint16_t>(tok_list, q, tok_seq, pos, block_tables, bt_stride, k_cache, v_cache, k_scale, v_scale, nh,
                         nkv, hd, block_size, sm_scale, out, part_ml, part_o);
}

extern "C" __global__ void __launch_bounds__(HY_THREADS) hy_attn_decode_fp8(
    const int* __restrict__ tok_list, const uint16_t* __restrict__ q, const int* __restrict__ tok_seq,
    const int* __restrict__ pos, const int* __restrict__ block_tables, const int* __restrict__ bt_stride,
    const uint8_t* __restrict__ k_cache, const uint8_t* __restrict__ v_cache, float k_scale, float v_scale, int nh,
    int nkv, int hd, int block_size, float sm_scale, uint16_t* __restrict__ out, float* __restrict__ part_ml,
    float* __restrict__ part_o) {
  hy_attn_body<uint8_t>(tok_list, q, tok_seq, pos, block_tables, bt_stride, k_cache, v_cache, k_scale, v_scale, nh, nkv,
                        hd, block_size, sm_scale, out, part_ml, part_o);
}
